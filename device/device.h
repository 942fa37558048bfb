/* device.h: the backend-neutral device API. Kernels are compiled, loaded,
 * launched and timed through these calls on any of the backends:
 *
 *   cpu   C kernel sources compiled at run time by the host compiler into a
 *         shared object; a launch runs the grid's work items on a thread pool.
 *   emu   the HIP kernel sources themselves run on the CPU: a block's threads
 *         are fibers, barriers and warp operations are rendezvous, buffers
 *         have guard pages. Exact and slow: how CI proves GPU kernels right.
 *   hip   ROCm: hipRTC compiles for the device's gfx arch (or for --arch
 *         with no GPU: compile-only), the module API launches, events time.
 *   cuda  NVIDIA through NVRTC and the driver API (same kernel sources).
 *
 * Ownership: dev_open returns a device the caller closes with dev_close.
 * Modules, codes, buffers and events belong to the caller and must be
 * released before the device is closed. Every call returns an mt_status and
 * fills err (may be NULL). Thread safety: dev_compile may be called from
 * several threads at once on one device; every other call on a device must
 * come from one thread at a time. */
#ifndef MT_DEVICE_H
#define MT_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Persisted in the database: append only. */
typedef enum dev_backend {
    DEV_BACKEND_CPU = 0,
    DEV_BACKEND_EMU = 1,
    DEV_BACKEND_HIP = 2,
    DEV_BACKEND_CUDA = 3,
    DEV_BACKEND_COUNT
} dev_backend;

/* "cpu", "emu", "hip", "cuda". */
const char *dev_backend_name(dev_backend b);

/* Which kind of kernel source a backend runs: HIP text (hip, cuda and the
 * emulator, which runs HIP text on the host) or C (cpu). */
static inline bool dev_backend_runs_hip_source(dev_backend b) { return b != DEV_BACKEND_CPU; }

typedef struct dev_props {
    dev_backend backend;
    char spec[32];             /* as opened, normalised: "cpu", "emu:wave32", "hip:0" */
    char arch[32];             /* "gfx90a", "sm_90", "x86-64-v4", "emu64" */
    char name[128];            /* marketing / cpu model name */
    char runtime_version[64];  /* "hip 5.2.21153", "gcc 12.2.0", ... */
    char driver_version[64];
    int compute_units;         /* CUs, SMs, or CPU threads used */
    int warp_size;             /* 64 or 32 on GPUs and emu; 1 on cpu */
    int max_threads_per_block;
    size_t shared_mem_per_block; /* bytes usable by one block (static + dynamic) */
    size_t static_shared_per_block; /* of which static __shared__ arrays may use (NVIDIA:
                                  * 48 KB, ptxas refuses more; elsewhere the same) */
    size_t llc_bytes;          /* last-level cache, for cache-flushing timing */
    size_t mem_bytes;          /* device memory (host RAM for cpu/emu) */
    int max_vgprs;             /* per thread, 0 when not applicable */
    bool compile_only;         /* no device present: compile and inspect only */
    bool cpu_amx;              /* cpu: the kernels are compiled with AMX tiles (the cpu has
                                * AMX-BF16 and the OS lets this process use it) */
    bool cpu_page_touch;       /* cpu: the kernels' weight streams also touch each 4 KiB
                                * page ahead (AMD; MOETUNE_CPU_PAGE_TOUCH=0|1 decides) */
    char fingerprint[65];      /* sha256 over backend, arch, name, CUs, runtime */
} dev_props;

typedef struct dev_open_opts {
    const char *arch;   /* hip/cuda: compile for this arch without a GPU */
    int threads;        /* cpu/emu worker threads; 0 = number of cores */
} dev_open_opts;

typedef struct dev_device dev_device;
typedef struct dev_code dev_code;     /* a compiled code object (bytes + facts) */
typedef struct dev_module dev_module; /* a code object loaded on the device */
typedef struct dev_kernel dev_kernel; /* a function in a module; owned by it */
typedef struct dev_event dev_event;

/* Opens "auto" (hip if a GPU is present, else cuda, else cpu), "cpu",
 * "cpu:T" (T threads), "emu", "emu:wave32", "emu:wave64", "hip", "hip:N",
 * "cuda", "cuda:N". An unknown spec or arch is MT_E_INVALID; a backend this
 * build lacks is MT_E_UNSUPPORTED. */
mt_status dev_open(const char *spec, const dev_open_opts *opts, dev_device **out,
                   mt_err *err);
void dev_close(dev_device *d); /* NULL is a no-op */
const dev_props *dev_get_props(const dev_device *d);

/* The specs this build can open on this machine, for `moetune devices`:
 * writes up to cap specs and returns how many exist. */
int dev_list(char specs[][32], int cap);

/* ---- compilation ---------------------------------------------------- */

typedef struct dev_define {
    const char *name;
    const char *value; /* NULL for a bare -DNAME */
} dev_define;

typedef struct dev_compile_req {
    const char *name;           /* for logs and errors: "moe_gemm_up.hip" */
    const char *source;         /* kernel text; the backend adds its prelude */
    const dev_define *defines;
    int n_defines;
    const char *const *options; /* extra compiler options; may be NULL */
    int n_options;
    bool no_cache;              /* skip the on-disk compile cache */
} dev_compile_req;

/* Resource usage of one kernel function, as the compiler reports it.
 * Fields a backend cannot know are -1. */
typedef struct dev_kernel_res {
    char name[96];
    int vgprs, sgprs, agprs;   /* hip; cuda puts registers in vgprs */
    int spill_vgprs, spill_sgprs;
    int64_t lds_bytes;         /* static shared memory */
    int64_t private_bytes;     /* scratch / local memory per thread */
    int max_threads;           /* from launch bounds, -1 if unknown */
    int waves_per_simd;        /* occupancy estimate, -1 if unknown */
} dev_kernel_res;

#define DEV_MAX_KERNELS_PER_CODE 16

typedef struct dev_code_info {
    double compile_ms;          /* 0 on a cache hit */
    bool cache_hit;
    char key[65];               /* compile-cache key */
    int n_kernels;
    dev_kernel_res kernels[DEV_MAX_KERNELS_PER_CODE];
} dev_code_info;

/* Compiles req for the device (thread-safe). On MT_E_COMPILE the compiler's
 * log is in err->msg. The code is owned by the caller (dev_code_free). */
mt_status dev_compile(dev_device *d, const dev_compile_req *req, dev_code **out,
                      mt_err *err);
/* Compiles in the background while serving: with a hold set, a compiler
 * process that dev_compile starts from a SCHED_IDLE thread (a server's
 * background tuner and the threads it starts) is stopped (SIGSTOP to its
 * process group) while hold(ctx) returns true and continued when it returns
 * false, checked every millisecond; such a compile then runs only while
 * hold says the device is free. Compilers started from other threads, and
 * in-process compilers (NVRTC, hipRTC), are never held. Process-wide;
 * NULL clears it. Clearing waits for a hold call in progress, so ctx may
 * be freed once this returns. */
void dev_set_tool_hold(bool (*hold)(void *ctx), void *ctx);
/* Since the process started: how long compilers were held stopped, and
 * how many times they were stopped. */
void dev_tool_hold_stats(double *held_s, int64_t *holds);
const dev_code_info *dev_code_get_info(const dev_code *c);
/* The compiler's log (possibly empty, never NULL). */
const char *dev_code_get_log(const dev_code *c);
/* The compiler's assembly text where the backend produces one (cuda: the
 * PTX of the cubin, also on a compile-cache hit when the cache holds it),
 * else NULL; owned by c. */
const char *dev_code_get_text(const dev_code *c);
/* The code object's bytes (for storing in the database); owned by c. */
const void *dev_code_get_bytes(const dev_code *c, size_t *len);
/* Rebuilds a code object from stored bytes (for serving without a compiler). */
mt_status dev_code_from_bytes(dev_device *d, const void *bytes, size_t len,
                              dev_code **out, mt_err *err);
void dev_code_free(dev_code *c);

/* ---- modules and launches ------------------------------------------ */

mt_status dev_module_load(dev_device *d, const dev_code *c, dev_module **out,
                          mt_err *err);
void dev_module_unload(dev_module *m);

/* Finds kernel `name` in m. sig lists its parameters, one letter each:
 * 'p' pointer, 'i' int32, 'u' uint32, 'l' int64, 'f' float, 'd' double.
 * The cpu and emu backends call the function through it; GPU backends check
 * the argument count. The kernel handle is owned by the module and cached. */
mt_status dev_module_get_kernel(dev_module *m, const char *name, const char *sig,
                                dev_kernel **out, mt_err *err);

typedef struct dev_dim3 { unsigned x, y, z; } dev_dim3;

/* Launches k with args[i] pointing at the i-th argument's value, as
 * hipModuleLaunchKernel takes them. cpu ignores block and runs grid
 * work items; emu runs grid blocks of block threads. cpu and emu launches
 * are synchronous; hip and cuda ones are asynchronous on the device's
 * stream. MT_E_FAULT, MT_E_DEADLOCK or MT_E_TIMEOUT name the kernel. */
mt_status dev_launch(dev_device *d, dev_kernel *k, dev_dim3 grid, dev_dim3 block,
                     size_t dyn_shared, void **args, mt_err *err);

/* Launch watchdog for emu/cpu (ms, 0 = none): a launch running longer fails
 * with MT_E_TIMEOUT where the backend can stop it. */
void dev_set_launch_timeout(dev_device *d, unsigned ms);

mt_status dev_synchronize(dev_device *d, mt_err *err);

/* ---- memory ---------------------------------------------------------- */

/* Device buffers are opaque addresses; on cpu and emu they are host
 * addresses (emu puts guard pages on both sides). */
mt_status dev_alloc(dev_device *d, size_t bytes, void **ptr, mt_err *err);
void dev_free(dev_device *d, void *ptr); /* NULL is a no-op */
mt_status dev_copy_to(dev_device *d, void *dst_dev, const void *src_host,
                      size_t bytes, mt_err *err);
mt_status dev_copy_from(dev_device *d, void *dst_host, const void *src_dev,
                        size_t bytes, mt_err *err);
mt_status dev_copy_dev(dev_device *d, void *dst_dev, const void *src_dev,
                       size_t bytes, mt_err *err);
mt_status dev_memset(dev_device *d, void *dst_dev, int byte, size_t bytes,
                     mt_err *err);

/* Host <-> device copies (dev_copy_to, dev_copy_from) of nonzero size
 * since dev_open, counted whether or not they succeeded: what the runtime
 * moves through the host (device-to-device copies and memsets are not
 * counted). Two adds per copy. */
typedef struct dev_copy_counts {
    uint64_t to_calls, to_bytes;     /* host -> device */
    uint64_t from_calls, from_bytes; /* device -> host */
} dev_copy_counts;
void dev_get_copy_counts(const dev_device *d, dev_copy_counts *out);

/* ---- timing ---------------------------------------------------------- */

mt_status dev_event_create(dev_device *d, dev_event **out, mt_err *err);
void dev_event_destroy(dev_device *d, dev_event *e);
mt_status dev_event_record(dev_device *d, dev_event *e, mt_err *err);
/* Milliseconds between two recorded events; waits for the later one. */
mt_status dev_event_elapsed_ms(dev_device *d, dev_event *start, dev_event *end,
                               double *ms, mt_err *err);

#endif
