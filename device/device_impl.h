/* device_impl.h: what a backend provides. Private to device/: a backend is a
 * table of functions plus its own context, and device.c dispatches through
 * it. Adding a backend is one more table. Optional slots may be NULL where
 * noted. */
#ifndef MT_DEVICE_IMPL_H
#define MT_DEVICE_IMPL_H

#include "device.h"

typedef struct dev_backend_ops {
    const char *name;
    /* Parses the part of the spec after "name[:]" (may be ""), fills props
     * (except fingerprint, which device.c computes) and *ctx. */
    mt_status (*open)(const char *arg, const dev_open_opts *opts, dev_props *props,
                      void **ctx, mt_err *err);
    void (*close)(void *ctx);

    /* Compiles source into a code object's bytes (malloc'd, caller frees)
     * and fills info->kernels where it can. log is malloc'd or NULL. The
     * compile cache sits in front of this in device.c. Thread-safe. */
    mt_status (*compile)(void *ctx, const dev_props *props,
                         const dev_compile_req *req, void **bytes, size_t *len,
                         char **log, dev_code_info *info, mt_err *err);
    /* Optional, instead of compile: the same, and also the compiler's
     * assembly text in *text (malloc'd, NUL-terminated, or NULL), which the
     * compile cache keeps beside the code object as <key>.<text_ext>
     * (cuda: the PTX NVRTC went through; see dev_code_get_text). */
    mt_status (*compile_text)(void *ctx, const dev_props *props,
                              const dev_compile_req *req, void **bytes, size_t *len,
                              char **log, char **text, dev_code_info *info, mt_err *err);
    const char *text_ext; /* "ptx"; NULL without compile_text */
    /* Fills info->kernels from stored bytes (cache hit, db). Optional. */
    mt_status (*inspect)(void *ctx, const void *bytes, size_t len,
                         dev_code_info *info, mt_err *err);
    /* Identity of the compiler for cache keys ("gcc 12.2.0 -O3 ...").
     * Must change when the generated code could change. */
    const char *(*compiler_id)(void *ctx);
    /* The text prepended to every source (prelude), also part of the key. */
    const char *(*prelude)(void *ctx);

    mt_status (*module_load)(void *ctx, const void *bytes, size_t len,
                             void **mod, mt_err *err);
    void (*module_unload)(void *ctx, void *mod);
    /* Returns a backend kernel handle owned by the module. */
    mt_status (*get_kernel)(void *ctx, void *mod, const char *name,
                            const char *sig, void **kern, mt_err *err);
    mt_status (*launch)(void *ctx, void *kern, const char *kname, const char *sig,
                        dev_dim3 grid, dev_dim3 block, size_t dyn_shared,
                        void **args, mt_err *err);
    void (*set_timeout)(void *ctx, unsigned ms); /* optional */
    mt_status (*synchronize)(void *ctx, mt_err *err);

    mt_status (*alloc)(void *ctx, size_t bytes, void **ptr, mt_err *err);
    void (*free)(void *ctx, void *ptr);
    /* kind: 0 host->dev, 1 dev->host, 2 dev->dev */
    mt_status (*copy)(void *ctx, void *dst, const void *src, size_t bytes,
                      int kind, mt_err *err);
    mt_status (*memset)(void *ctx, void *dst, int byte, size_t bytes, mt_err *err);

    /* Events: NULL slots mean host-clock events (cpu, emu: launches are
     * synchronous, so a monotonic clock read is exact). */
    mt_status (*event_create)(void *ctx, void **ev, mt_err *err);
    void (*event_destroy)(void *ctx, void *ev);
    mt_status (*event_record)(void *ctx, void *ev, mt_err *err);
    mt_status (*event_elapsed)(void *ctx, void *a, void *b, double *ms, mt_err *err);
} dev_backend_ops;

extern const dev_backend_ops dev_cpu_ops;
extern const dev_backend_ops dev_emu_ops;
#ifdef MOETUNE_HAVE_HIP
extern const dev_backend_ops dev_hip_ops;
#endif
extern const dev_backend_ops dev_cuda_ops; /* loads libcuda/NVRTC at run time */

/* The translation unit and option list of one compile (cpu, hip, cuda).
 * Everything is owned by the struct except the fixed options and
 * req->options, which opts points at and which must outlive it. */
typedef struct dev_compile_args {
    char *text;        /* "#line 1 <prelude_file>", prelude, "#line 1 <name>", source */
    const char **opts; /* fixed options, -DNAME[=VALUE] per define, req->options */
    int n_opts;
    char **defs;       /* the -D strings opts points into */
    int n_defs;
} dev_compile_args;
/* Fills args from req for a compile of the file called name. Fails with
 * MT_E_INVALID when a count is negative or n_defines + n_options exceeds
 * max_extra, MT_E_NOMEM when out of memory; on failure args holds nothing
 * (releasing it again is harmless). */
mt_status dev_compile_args_build(const dev_compile_req *req, const char *name,
                                 const char *prelude_file, const char *prelude,
                                 const char *const *fixed, int n_fixed, int max_extra,
                                 dev_compile_args *args, mt_err *err);
/* Frees what args owns and zeroes it. */
void dev_compile_args_release(dev_compile_args *args);

/* Host C compiler driver shared by cpu and emu: compiles `text` (a complete
 * C translation unit) with flags into a shared object and returns its bytes.
 * log is malloc'd (may be NULL). With GCC the object also exports, for
 * every extern function the text defines, `const char mt__sig_<name>[]`:
 * its parameters as signature letters ('?' for a type without a letter). */
mt_status dev_host_cc(const char *text, const char *const *flags, int n_flags,
                      void **bytes, size_t *len, char **log, mt_err *err);
/* The GPU index N of a "backend:N" spec's argument (NULL or "": 0);
 * MT_E_INVALID naming the spec otherwise. */
mt_status dev_parse_index(const char *backend, const char *arg, int *index, mt_err *err);

/* Runs argv[0] (searched in PATH) with stdout and stderr into log_path and
 * waits for it: its exit status; 127 when it could not be started (why, in
 * log_path); -1 when it died of a signal. */
int dev_run_tool(const char *const *argv, const char *log_path);

/* Part of the cpu and emu compiler ids: what dev_host_cc's objects hold,
 * so the compile cache never returns one built without the table. */
#define DEV_HOST_CC_OUTPUT "sig-table-1"
/* MT_E_INVALID naming the kernel when the module dl (dev_host_dlopen) has
 * a signature table entry for name that differs from sig in length or in
 * a known letter; MT_OK when they agree or the module has no entry. */
mt_status dev_host_check_sig(void *dl, const char *name, const char *sig, mt_err *err);
/* Identity of the host compiler ("cc (Debian 12.2.0-14) 12.2.0"), cached. */
const char *dev_host_cc_id(void);
/* dlopen()s the shared object in bytes: from an anonymous memory file, or
 * where that is not available a private temporary file (removed at once). */
mt_status dev_host_dlopen(const void *bytes, size_t len, void **handle, mt_err *err);
/* dlclose for a dev_host_dlopen handle (and its memory file); NULL: no-op. */
void dev_host_dlclose(void *handle);

/* Embedded text of a prelude in device/preludes ("prelude_gpu.h"), or NULL. */
const char *dev_prelude_get(const char *name);

#endif
