/* hip.c: the hip backend (ROCm). hipRTC compiles kernel sources (the GPU
 * prelude, then the source) for the device's gfx arch; amd_comgr reads
 * registers, LDS and spills from the code object; the HIP module API loads
 * and launches on the null stream; hipEvents time.
 *
 * Without a GPU, "hip" opens only when an arch is given (dev_open_opts.arch):
 * then the device is compile-only. hipRTC of ROCm 5.2 crashes on arch names
 * it does not know (gfx940..gfx942, gfx950), so only archs on an allow-list
 * ever reach it. Built only with MOETUNE_HAVE_HIP. */
#ifdef MOETUNE_HAVE_HIP
#define _GNU_SOURCE
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include "device_impl.h"

#include <hip/hip_runtime_api.h>
#include <hip/hiprtc.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip_comgr.h"

/* Checks a HIP runtime call; on failure records the expression, file and
 * line, and returns status st with the runtime's error and the printf-style
 * context that follows st. */
#define HIP_TRY(expr, err, st, ...)                                            \
    do {                                                                       \
        hipError_t he_ = (expr);                                               \
        if (he_ != hipSuccess) {                                               \
            char what_[256];                                                   \
            snprintf(what_, sizeof what_, __VA_ARGS__);                        \
            return mt_fail_at((err), (st), __FILE__, __LINE__, #expr,          \
                              "%s: %s (%s)", what_, hipGetErrorName(he_),      \
                              hipGetErrorString(he_));                         \
        }                                                                      \
    } while (0)

/* Checks a hipRTC call and jumps to label with st set on failure. */
#define RTC_CHECK(expr, err, st, label, ...)                                   \
    do {                                                                       \
        hiprtcResult re_ = (expr);                                             \
        if (re_ != HIPRTC_SUCCESS) {                                           \
            char what_[256];                                                   \
            snprintf(what_, sizeof what_, __VA_ARGS__);                        \
            (st) = mt_fail_at((err), MT_E_COMPILE, __FILE__, __LINE__, #expr,  \
                              "%s: %s", what_, hiprtcGetErrorString(re_));     \
            goto label;                                                        \
        }                                                                      \
    } while (0)

/* Archs this hipRTC (ROCm 5.2) is known to compile for. Anything else,
 * notably gfx940/941/942 and gfx950, crashes inside hipRTC. */
static const char *const known_archs[] = {
    "gfx900", "gfx906", "gfx908", "gfx90a", "gfx1010", "gfx1011", "gfx1012", "gfx1030",
};
#define N_KNOWN_ARCHS (sizeof known_archs / sizeof known_archs[0])

typedef struct hip_ctx {
    int device;
    bool compile_only;
    char arch[32];
    char arch_option[48];   /* --offload-arch=gfx90a */
    char compiler_id[128];
    const char *prelude;
} hip_ctx;

typedef struct hip_mod {
    hipModule_t module;
    void *bytes; /* a copy, to count kernel arguments from the metadata */
    size_t len;
} hip_mod;

static bool arch_known(const char *arch)
{
    for (size_t i = 0; i < N_KNOWN_ARCHS; i++)
        if (!strcmp(arch, known_archs[i]))
            return true;
    return false;
}

static mt_status refuse_arch(const char *arch, mt_status st, mt_err *err)
{
    char list[256] = "";
    for (size_t i = 0; i < N_KNOWN_ARCHS; i++) {
        strcat(list, i ? ", " : "");
        strcat(list, known_archs[i]);
    }
    return mt_fail(err, st,
                   "hip: arch '%s' is refused: this hipRTC (ROCm 5.2) crashes instead "
                   "of failing on archs it does not know (such as gfx940, gfx941, "
                   "gfx942, gfx950); it is known to compile for: %s", arch, list);
}

static void version_text(int v, char *out, size_t cap)
{
    /* HIP_VERSION = major * 10^7 + minor * 10^5 + patch */
    snprintf(out, cap, "hip %d.%d.%d", v / 10000000, (v / 100000) % 100, v % 100000);
}

static int default_warp(const char *arch) { return !strncmp(arch, "gfx10", 5) ? 32 : 64; }

static void fill_compile_only(hip_ctx *c, dev_props *p)
{
    snprintf(p->name, sizeof p->name, "AMD %s (compile-only, no GPU)", c->arch);
    p->compute_units = 0;
    p->warp_size = default_warp(c->arch);
    p->max_threads_per_block = 1024;
    p->shared_mem_per_block = 65536;
    p->llc_bytes = 0;
    p->mem_bytes = 0;
    p->compile_only = true;
}

static mt_status fill_device(hip_ctx *c, dev_props *p, mt_err *err)
{
    hipDeviceProp_t dp;
    HIP_TRY(hipSetDevice(c->device), err, MT_E_DEVICE, "hip:%d", c->device);
    HIP_TRY(hipGetDeviceProperties(&dp, c->device), err, MT_E_DEVICE, "hip:%d",
            c->device);
    snprintf(c->arch, sizeof c->arch, "%.*s", (int)strcspn(dp.gcnArchName, ":"),
             dp.gcnArchName);
    snprintf(p->name, sizeof p->name, "%.127s", dp.name);
    p->compute_units = dp.multiProcessorCount;
    p->warp_size = dp.warpSize;
    p->max_threads_per_block = dp.maxThreadsPerBlock;
    p->shared_mem_per_block = dp.sharedMemPerBlock;
    p->llc_bytes = dp.l2CacheSize > 0 ? (size_t)dp.l2CacheSize : 0;
    p->mem_bytes = dp.totalGlobalMem;
    p->compile_only = false;
    int dv = 0;
    if (hipDriverGetVersion(&dv) == hipSuccess)
        snprintf(p->driver_version, sizeof p->driver_version, "%d", dv);
    return MT_OK;
}

static mt_status hip_open(const char *arg, const dev_open_opts *opts, dev_props *props,
                          void **ctx_out, mt_err *err)
{
    *ctx_out = NULL;
    int index = 0;
    if (arg && *arg) {
        char *end = NULL;
        long v = strtol(arg, &end, 10);
        if (!end || *end || v < 0 || v > 1024)
            return mt_fail(err, MT_E_INVALID, "device 'hip:%s': expected hip:N with N a "
                           "GPU index", arg);
        index = (int)v;
    }
    const char *want = opts->arch && *opts->arch ? opts->arch : NULL;
    if (want && !arch_known(want))
        return refuse_arch(want, MT_E_INVALID, err);

    const char *prelude = dev_prelude_get("prelude_gpu.h");
    if (!prelude)
        return mt_fail(err, MT_E_INVALID, "hip: prelude_gpu.h is not embedded");

    int count = 0;
    hipError_t he = hipGetDeviceCount(&count);
    if (he != hipSuccess)
        count = 0;
    if (index >= count && !want) {
        if (count == 0)
            return mt_fail(err, MT_E_DEVICE,
                           "hip: no AMD GPU found (hipGetDeviceCount: %s); pass an arch "
                           "(--arch gfx90a) to compile without one",
                           he != hipSuccess ? hipGetErrorString(he) : "0 devices");
        return mt_fail(err, MT_E_DEVICE, "hip:%d: only %d AMD GPU(s) present", index,
                       count);
    }

    hip_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return mt_fail(err, MT_E_NOMEM, "hip device");
    c->device = index;
    c->prelude = prelude;
    memset(props, 0, sizeof *props);
    props->backend = DEV_BACKEND_HIP;
    if (index < count) {
        mt_status st = fill_device(c, props, err);
        if (st != MT_OK) {
            free(c);
            return st;
        }
        if (!want && !arch_known(c->arch)) {
            char arch[32];
            snprintf(arch, sizeof arch, "%s", c->arch);
            free(c);
            return refuse_arch(arch, MT_E_UNSUPPORTED, err);
        }
    }
    /* An arch that differs from the GPU's (or no GPU) means compile-only:
     * code for another arch cannot be loaded here. */
    if (want && (index >= count || strcmp(want, c->arch) != 0)) {
        c->compile_only = true;
        snprintf(c->arch, sizeof c->arch, "%s", want);
        fill_compile_only(c, props);
        snprintf(props->spec, sizeof props->spec, "hip");
    } else {
        snprintf(props->spec, sizeof props->spec, "hip:%d", index);
    }
    snprintf(props->arch, sizeof props->arch, "%s", c->arch);
    props->max_vgprs = !strcmp(c->arch, "gfx90a") ? 512 : 256;
    int rv = 0;
    if (hipRuntimeGetVersion(&rv) == hipSuccess)
        version_text(rv, props->runtime_version, sizeof props->runtime_version);
    else
        snprintf(props->runtime_version, sizeof props->runtime_version, "hip");
    snprintf(c->arch_option, sizeof c->arch_option, "--offload-arch=%s", c->arch);
    snprintf(c->compiler_id, sizeof c->compiler_id, "hiprtc %s -O3 %s",
             props->runtime_version, c->arch_option);
    *ctx_out = c;
    return MT_OK;
}

static void hip_close(void *ctx) { free(ctx); }

static const char *hip_compiler_id(void *ctx) { return ((hip_ctx *)ctx)->compiler_id; }
static const char *hip_prelude(void *ctx) { return ((hip_ctx *)ctx)->prelude; }

static char *program_log(hiprtcProgram prog)
{
    size_t n = 0;
    if (hiprtcGetProgramLogSize(prog, &n) != HIPRTC_SUCCESS || n == 0)
        return NULL;
    char *log = malloc(n + 1);
    if (!log)
        return NULL;
    if (hiprtcGetProgramLog(prog, log) != HIPRTC_SUCCESS) {
        free(log);
        return NULL;
    }
    log[n] = 0;
    if (!log[strspn(log, " \t\r\n")]) {
        free(log);
        return NULL;
    }
    return log;
}

/* hipRTC and comgr set up LLVM lazily on their first use in a process;
 * two threads doing that at once can abort the process ("CommandLine
 * Error: Option 'h' registered more than once", seen under parallel
 * tuning). The first compile of the process runs alone; the rest run in
 * parallel. */
static pthread_mutex_t first_lock = PTHREAD_MUTEX_INITIALIZER;
static bool first_done;

static mt_status hip_compile_unlocked(void *ctx, const dev_props *props,
                                      const dev_compile_req *req, void **bytes,
                                      size_t *len, char **log, dev_code_info *info,
                                      mt_err *err);

static mt_status hip_compile(void *ctx, const dev_props *props, const dev_compile_req *req,
                             void **bytes, size_t *len, char **log, dev_code_info *info,
                             mt_err *err)
{
    pthread_mutex_lock(&first_lock);
    if (first_done) {
        pthread_mutex_unlock(&first_lock);
        return hip_compile_unlocked(ctx, props, req, bytes, len, log, info, err);
    }
    mt_status st = hip_compile_unlocked(ctx, props, req, bytes, len, log, info, err);
    first_done = true;
    pthread_mutex_unlock(&first_lock);
    return st;
}

static mt_status hip_compile_unlocked(void *ctx, const dev_props *props,
                                      const dev_compile_req *req, void **bytes,
                                      size_t *len, char **log, dev_code_info *info,
                                      mt_err *err)
{
    (void)props;
    hip_ctx *c = ctx;
    *bytes = NULL;
    *len = 0;
    *log = NULL;
    info->n_kernels = 0;
    const char *name = req->name ? req->name : "kernel.hip";
    const char *fixed[] = {c->arch_option, "-O3"};
    dev_compile_args a;
    mt_status st = dev_compile_args_build(req, name, "prelude_gpu.h", c->prelude, fixed,
                                          (int)(sizeof fixed / sizeof *fixed), 256, &a,
                                          err);
    if (st != MT_OK)
        return st;
    hiprtcProgram prog = NULL;
    char *code = NULL;
    RTC_CHECK(hiprtcCreateProgram(&prog, a.text, name, 0, NULL, NULL), err, st, out,
              "hipRTC program for %s", name);
    /* hipRTC's LLVM swaps in its own malloc'd signal stack on the first
     * thread that compiles; AddressSanitizer then fails to unmap it when
     * that thread exits. Put the thread's own stack back. */
    stack_t alt;
    bool have_alt = sigaltstack(NULL, &alt) == 0;
    hiprtcResult rr = hiprtcCompileProgram(prog, a.n_opts, a.opts);
    if (have_alt)
        sigaltstack(&alt, NULL);
    *log = program_log(prog);
    if (rr != HIPRTC_SUCCESS) {
        st = mt_fail(err, MT_E_COMPILE, "hipRTC failed to compile %s for %s (%s):\n%s",
                     name, c->arch, hiprtcGetErrorString(rr),
                     *log ? *log : "(empty log)");
        goto out;
    }
    size_t size = 0;
    RTC_CHECK(hiprtcGetCodeSize(prog, &size), err, st, out, "code of %s", name);
    if (size == 0) {
        st = mt_fail(err, MT_E_COMPILE, "hipRTC returned no code for %s", name);
        goto out;
    }
    code = malloc(size);
    if (!code) {
        st = mt_fail(err, MT_E_NOMEM, "code object of %zu bytes", size);
        goto out;
    }
    RTC_CHECK(hiprtcGetCode(prog, code), err, st, out, "code of %s", name);
    st = hip_comgr_inspect(code, size, info, NULL, 0, err);
    if (st != MT_OK) {
        mt_err_prefix(err, "resources of %s", name);
        goto out;
    }
    *bytes = code;
    *len = size;
    code = NULL;
out:
    if (prog)
        hiprtcDestroyProgram(&prog);
    if (st != MT_OK) {
        free(*log);
        *log = NULL;
    }
    free(code);
    dev_compile_args_release(&a);
    return st;
}

static mt_status hip_inspect(void *ctx, const void *bytes, size_t len, dev_code_info *info,
                             mt_err *err)
{
    hip_ctx *c = ctx;
    char target[64];
    pthread_mutex_lock(&first_lock); /* comgr's own first use: see hip_compile */
    bool alone = !first_done;
    if (!alone)
        pthread_mutex_unlock(&first_lock);
    mt_status st = hip_comgr_inspect(bytes, len, info, target, sizeof target, err);
    if (alone)
        pthread_mutex_unlock(&first_lock);
    if (st == MT_OK && target[0] && strcmp(target, c->arch) != 0)
        return mt_fail(err, MT_E_INVALID, "code object is for %s, the device is %s",
                       target, c->arch);
    return st;
}

static mt_status need_gpu(const hip_ctx *c, const char *what, mt_err *err)
{
    if (c->compile_only)
        return mt_fail(err, MT_E_UNSUPPORTED, "hip device for %s is compile-only (no "
                       "GPU): cannot %s", c->arch, what);
    return MT_OK;
}

static mt_status hip_module_load(void *ctx, const void *bytes, size_t len, void **out,
                                 mt_err *err)
{
    hip_ctx *c = ctx;
    *out = NULL;
    mt_status st = need_gpu(c, "load modules", err);
    if (st != MT_OK)
        return st;
    hip_mod *m = calloc(1, sizeof *m);
    if (!m || !(m->bytes = malloc(len))) {
        free(m);
        return mt_fail(err, MT_E_NOMEM, "hip module of %zu bytes", len);
    }
    memcpy(m->bytes, bytes, len);
    m->len = len;
    hipError_t he = hipSetDevice(c->device);
    if (he == hipSuccess)
        he = hipModuleLoadData(&m->module, m->bytes);
    if (he != hipSuccess) {
        free(m->bytes);
        free(m);
        return mt_fail(err, MT_E_DEVICE, "hipModuleLoadData (%zu bytes for %s): %s", len,
                       c->arch, hipGetErrorString(he));
    }
    *out = m;
    return MT_OK;
}

static void hip_module_unload(void *ctx, void *mod)
{
    (void)ctx;
    hip_mod *m = mod;
    if (!m)
        return;
    hipModuleUnload(m->module);
    free(m->bytes);
    free(m);
}

static mt_status hip_get_kernel(void *ctx, void *mod, const char *name, const char *sig,
                                void **out, mt_err *err)
{
    (void)ctx;
    hip_mod *m = mod;
    *out = NULL;
    int n_args = -1;
    mt_status st = hip_comgr_count_args(m->bytes, m->len, name, &n_args, err);
    if (st != MT_OK)
        return st;
    if ((size_t)n_args != strlen(sig))
        return mt_fail(err, MT_E_INVALID, "kernel %s takes %d arguments, signature '%s' "
                       "has %zu", name, n_args, sig, strlen(sig));
    hipFunction_t f = NULL;
    HIP_TRY(hipModuleGetFunction(&f, m->module, name), err, MT_E_NOT_FOUND, "kernel %s",
            name);
    *out = f;
    return MT_OK;
}

static mt_status hip_launch(void *ctx, void *kern, const char *kname, const char *sig,
                            dev_dim3 grid, dev_dim3 block, size_t dyn_shared, void **args,
                            mt_err *err)
{
    (void)sig;
    hip_ctx *c = ctx;
    mt_status st = need_gpu(c, "launch", err);
    if (st != MT_OK)
        return st;
    HIP_TRY(hipSetDevice(c->device), err, MT_E_DEVICE, "launch of %s", kname);
    HIP_TRY(hipModuleLaunchKernel((hipFunction_t)kern, grid.x, grid.y, grid.z, block.x,
                                  block.y, block.z, (unsigned)dyn_shared, NULL, args,
                                  NULL),
            err, MT_E_LAUNCH, "launch of %s (grid %ux%ux%u, block %ux%ux%u, %zu B dynamic "
            "LDS)", kname, grid.x, grid.y, grid.z, block.x, block.y, block.z, dyn_shared);
    return MT_OK;
}

static mt_status hip_synchronize(void *ctx, mt_err *err)
{
    hip_ctx *c = ctx;
    if (c->compile_only)
        return MT_OK;
    HIP_TRY(hipSetDevice(c->device), err, MT_E_DEVICE, "synchronize");
    HIP_TRY(hipDeviceSynchronize(), err, MT_E_DEVICE, "synchronize hip:%d", c->device);
    return MT_OK;
}

static mt_status hip_alloc(void *ctx, size_t bytes, void **ptr, mt_err *err)
{
    hip_ctx *c = ctx;
    *ptr = NULL;
    mt_status st = need_gpu(c, "allocate", err);
    if (st != MT_OK)
        return st;
    HIP_TRY(hipSetDevice(c->device), err, MT_E_DEVICE, "allocate");
    HIP_TRY(hipMalloc(ptr, bytes), err, MT_E_NOMEM, "hipMalloc of %zu bytes", bytes);
    return MT_OK;
}

static void hip_free(void *ctx, void *ptr)
{
    hip_ctx *c = ctx;
    if (!c->compile_only && ptr)
        hipFree(ptr);
}

static mt_status hip_copy(void *ctx, void *dst, const void *src, size_t bytes, int kind,
                          mt_err *err)
{
    hip_ctx *c = ctx;
    mt_status st = need_gpu(c, "copy", err);
    if (st != MT_OK)
        return st;
    static const hipMemcpyKind kinds[3] = {hipMemcpyHostToDevice, hipMemcpyDeviceToHost,
                                           hipMemcpyDeviceToDevice};
    if (kind < 0 || kind > 2)
        return mt_fail(err, MT_E_INVALID, "hip copy: kind %d", kind);
    HIP_TRY(hipSetDevice(c->device), err, MT_E_DEVICE, "copy");
    HIP_TRY(hipMemcpy(dst, src, bytes, kinds[kind]), err, MT_E_DEVICE,
            "hipMemcpy of %zu bytes (kind %d)", bytes, kind);
    return MT_OK;
}

static mt_status hip_memset(void *ctx, void *dst, int byte, size_t bytes, mt_err *err)
{
    hip_ctx *c = ctx;
    mt_status st = need_gpu(c, "memset", err);
    if (st != MT_OK)
        return st;
    HIP_TRY(hipSetDevice(c->device), err, MT_E_DEVICE, "memset");
    HIP_TRY(hipMemset(dst, byte, bytes), err, MT_E_DEVICE, "hipMemset of %zu bytes",
            bytes);
    return MT_OK;
}

static mt_status hip_event_create(void *ctx, void **ev, mt_err *err)
{
    hip_ctx *c = ctx;
    *ev = NULL;
    mt_status st = need_gpu(c, "create events", err);
    if (st != MT_OK)
        return st;
    hipEvent_t e = NULL;
    HIP_TRY(hipSetDevice(c->device), err, MT_E_DEVICE, "event");
    HIP_TRY(hipEventCreate(&e), err, MT_E_DEVICE, "event");
    *ev = e;
    return MT_OK;
}

static void hip_event_destroy(void *ctx, void *ev)
{
    (void)ctx;
    if (ev)
        hipEventDestroy((hipEvent_t)ev);
}

static mt_status hip_event_record(void *ctx, void *ev, mt_err *err)
{
    (void)ctx;
    HIP_TRY(hipEventRecord((hipEvent_t)ev, NULL), err, MT_E_DEVICE, "event record");
    return MT_OK;
}

static mt_status hip_event_elapsed(void *ctx, void *a, void *b, double *ms, mt_err *err)
{
    (void)ctx;
    float f = 0;
    HIP_TRY(hipEventSynchronize((hipEvent_t)b), err, MT_E_DEVICE, "event wait");
    HIP_TRY(hipEventElapsedTime(&f, (hipEvent_t)a, (hipEvent_t)b), err, MT_E_DEVICE,
            "event elapsed time");
    *ms = f;
    return MT_OK;
}

const dev_backend_ops dev_hip_ops = {
    .name = "hip",
    .open = hip_open,
    .close = hip_close,
    .compile = hip_compile,
    .inspect = hip_inspect,
    .compiler_id = hip_compiler_id,
    .prelude = hip_prelude,
    .module_load = hip_module_load,
    .module_unload = hip_module_unload,
    .get_kernel = hip_get_kernel,
    .launch = hip_launch,
    .set_timeout = NULL,
    .synchronize = hip_synchronize,
    .alloc = hip_alloc,
    .free = hip_free,
    .copy = hip_copy,
    .memset = hip_memset,
    .event_create = hip_event_create,
    .event_destroy = hip_event_destroy,
    .event_record = hip_event_record,
    .event_elapsed = hip_event_elapsed,
};

#endif /* MOETUNE_HAVE_HIP */
