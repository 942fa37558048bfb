/* status.h (moetune public API): the status every call returns. Part of
 * moetune.h; include that instead. Values are fixed and only appended. */
#ifndef MOETUNE_STATUS_H
#define MOETUNE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moetune_status {
    MOETUNE_OK = 0,
    MOETUNE_E_INVALID = 1,     /* a bad argument: the message names it */
    MOETUNE_E_NOMEM = 2,       /* out of host or device memory */
    MOETUNE_E_IO = 3,          /* a file could not be read (a database, the cache) */
    MOETUNE_E_FORMAT = 4,      /* a file is not what it should be (not a database) */
    MOETUNE_E_UNSUPPORTED = 5, /* valid, but not on this device or in this build */
    MOETUNE_E_COMPILE = 6,     /* a kernel failed to compile; the log is in the message */
    MOETUNE_E_LAUNCH = 7,      /* the device refused a launch */
    MOETUNE_E_DEVICE = 8,      /* the device runtime failed */
    MOETUNE_E_FAULT = 9,       /* a kernel touched memory it does not own (emu names it) */
    MOETUNE_E_DEADLOCK = 10,   /* emu: a kernel's threads never met at a barrier */
    MOETUNE_E_TIMEOUT = 11,
    MOETUNE_E_DB = 12,         /* the database failed */
    MOETUNE_E_NOT_FOUND = 13,  /* a file or a name that does not exist */
    MOETUNE_E_WRONG_RESULT = 14,
    MOETUNE_E_BUSY = 15,
    MOETUNE_E_INTERRUPTED = 16,
    MOETUNE_E_CRASH = 17,
    MOETUNE_E_MISUSE = 18,     /* the API used against its contract (a NULL handle, a
                                * struct not set up by its _init call, a run that does
                                * not match how the layer was created) */
    MOETUNE_STATUS_COUNT
} moetune_status;

/* A short stable name: "ok", "invalid", "compile_error", ...; "unknown"
 * for a value out of range. Static storage; thread-safe. */
const char *moetune_status_str(moetune_status s);

#ifdef __cplusplus
}
#endif

#endif
