/* device.h (moetune public API): a device to run layers on, the tuned
 * databases it reads, and the error message of its last failure. Part of
 * moetune.h; include that instead.
 *
 * Thread safety: a device and the layers created on it are used by one
 * thread at a time (they share the device's queue, its workspaces and its
 * error message); give each thread its own device. Different devices may
 * be used from different threads at once. Kernel compiles share the
 * on-disk compile cache ($MOETUNE_CACHE, else ~/.cache/moetune) with every
 * other moetune process, safely. */
#ifndef MOETUNE_DEVICE_H
#define MOETUNE_DEVICE_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moetune_device moetune_device;

/* Fixed values, only appended. */
typedef enum moetune_backend {
    MOETUNE_BACKEND_CPU = 0,  /* C kernels compiled by the host compiler, a thread pool */
    MOETUNE_BACKEND_EMU = 1,  /* the GPU kernels run on the CPU (exact, slow: for tests) */
    MOETUNE_BACKEND_HIP = 2,  /* AMD GPUs */
    MOETUNE_BACKEND_CUDA = 3, /* NVIDIA GPUs */
    MOETUNE_BACKEND_COUNT
} moetune_backend;

/* Opens the device spec names: "auto" (a GPU when there is one, else the
 * cpu), "cpu", "cpu:T" (T threads), "emu", "emu:wave32", "hip", "hip:N",
 * "cuda", "cuda:N".
 *
 * *out receives a handle even when the open fails, so that
 * moetune_errmsg(*out) can say why (an unknown spec: MOETUNE_E_INVALID; a
 * backend this build or machine lacks: MOETUNE_E_UNSUPPORTED); close it
 * with moetune_device_close either way. Only when memory for the handle
 * itself runs out is *out NULL (MOETUNE_E_NOMEM). */
moetune_status moetune_device_open(const char *spec, moetune_device **out);

/* Gives up the caller's hold on the device. Layers created on it hold it
 * too: the device is freed when it is closed and its last layer is
 * destroyed, in either order, so a garbage-collected binding may release
 * them as it likes. After the close the handle must not be used again,
 * except through those layers. NULL is a no-op. */
void moetune_device_close(moetune_device *dev);

/* Adds the tuned database at path, opened read-only (the file is never
 * written, not even to record a miss), below the databases added before:
 * a layer's kernel takes its configs from the first database that has an
 * entry for it by the runtime's lookup rule (docs/DB.md, "Lookup rule":
 * this device's own winner at that M or the nearest tuned M, then another
 * device of the same backend and arch), and runs its default config when
 * none has. Add the user's own database first and a shipped one after it.
 * Layers created before the call keep their selection. At most 8.
 * Failure (no such file: MOETUNE_E_NOT_FOUND; unreadable: MOETUNE_E_IO; not a
 * database or a newer schema: MOETUNE_E_FORMAT or MOETUNE_E_UNSUPPORTED)
 * adds nothing. */
moetune_status moetune_device_add_db(moetune_device *dev, const char *path);

/* Number of databases added. */
int moetune_device_db_count(const moetune_device *dev);

typedef struct moetune_device_info {
    moetune_backend backend;
    char spec[32];            /* as opened, normalized: "cpu", "emu:wave32", "hip:0" */
    char arch[32];            /* "x86-64-v4", "emu64", "gfx90a", "sm_90" */
    char name[128];           /* CPU or GPU model */
    int compute_units;        /* CPU threads, CUs or SMs */
    int host_memory;          /* 1: layers take host pointers (cpu, emu); 0: device
                               * pointers (hip, cuda) */
} moetune_device_info;

/* Fills *out (owned by the caller). MOETUNE_E_MISUSE for a device whose
 * open failed. */
moetune_status moetune_device_get_info(moetune_device *dev, moetune_device_info *out);

/* Waits until every run issued on the device has finished (hip, cuda;
 * runs on cpu and emu have finished when they return). */
moetune_status moetune_device_synchronize(moetune_device *dev);

/* The message of the last failed call on dev or on a layer created on it:
 * what failed and where (the kernel, the buffer, the database path). ""
 * after a success; "out of memory" for a NULL dev. The text is owned by
 * dev and valid until its next call. */
const char *moetune_errmsg(const moetune_device *dev);

/* The status of that last call (MOETUNE_OK after a success). */
moetune_status moetune_errcode(const moetune_device *dev);

#ifdef __cplusplus
}
#endif

#endif
