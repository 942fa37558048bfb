/* status.h: the one status enum of moetune and the caller-supplied error record.
 *
 * Every public function that can fail returns an mt_status and, when given a
 * non-NULL mt_err, fills it with a message naming what was wrong and where
 * (file, tensor, key, offset, kernel). mt_err is plain storage owned by the
 * caller; nothing in it needs freeing. Values are persisted in the database:
 * append only, never renumber. */
#ifndef MT_STATUS_H
#define MT_STATUS_H

#include <stddef.h>

typedef enum mt_status {
    MT_OK = 0,
    MT_E_INVALID = 1,      /* bad argument or bad user input */
    MT_E_NOMEM = 2,
    MT_E_IO = 3,           /* file or socket I/O */
    MT_E_FORMAT = 4,       /* malformed file contents */
    MT_E_UNSUPPORTED = 5,  /* valid request this build or device cannot do */
    MT_E_COMPILE = 6,      /* kernel source failed to compile; log in message */
    MT_E_LAUNCH = 7,       /* launch rejected (geometry, resources) */
    MT_E_DEVICE = 8,       /* device runtime error */
    MT_E_FAULT = 9,        /* kernel touched memory it does not own */
    MT_E_DEADLOCK = 10,    /* threads never reached a barrier */
    MT_E_TIMEOUT = 11,
    MT_E_DB = 12,          /* database error */
    MT_E_NOT_FOUND = 13,
    MT_E_WRONG_RESULT = 14,/* output differs from the reference */
    MT_E_BUSY = 15,
    MT_E_INTERRUPTED = 16,
    MT_E_CRASH = 17,       /* a worker process died */
    MT_STATUS_COUNT
} mt_status;

#define MT_ERR_MSG_MAX 2048

typedef struct mt_err {
    mt_status status;
    char msg[MT_ERR_MSG_MAX];
} mt_err;

#define MT_ERR_INIT {MT_OK, {0}}

/* Short stable name of a status ("ok", "compile_error", ...). Never NULL. */
const char *mt_status_str(mt_status s);

/* Records status s and a printf-style message in err (ignored when err is
 * NULL) and returns s, so failures read `return mt_fail(err, MT_E_IO, ...)`.
 * The message replaces any earlier one. */
mt_status mt_fail(mt_err *err, mt_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to err's message, keeping its status; returns it.
 * Used to add context ("loading shard x: ") as an error travels up. */
mt_status mt_err_prefix(mt_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Resets err to MT_OK with an empty message (NULL is a no-op). */
void mt_err_clear(mt_err *err);

/* Propagates a failure: evaluates expr (an mt_status expression, whose
 * callee has already filled err) once and returns its value from the
 * enclosing function when it is not MT_OK. */
#define MT_CHECK(expr)                                                         \
    do {                                                                       \
        mt_status mt_check_st_ = (expr);                                       \
        if (mt_check_st_ != MT_OK)                                             \
            return mt_check_st_;                                               \
    } while (0)

/* Check a call whose failure is a non-zero/false value; on failure record
 * the expression, file and line and return the status from the function. */
#define MT_TRY(ok_expr, err, st, ...)                                          \
    do {                                                                       \
        if (!(ok_expr))                                                        \
            return mt_fail_at((err), (st), __FILE__, __LINE__, #ok_expr,       \
                              __VA_ARGS__);                                    \
    } while (0)

/* Like mt_fail, and appends " [expr at file:line]". */
mt_status mt_fail_at(mt_err *err, mt_status s, const char *file, int line,
                     const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

#endif
