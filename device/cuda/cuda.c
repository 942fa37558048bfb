/* cuda.c: the cuda backend. The same GPU kernel sources as hip, through
 * NVRTC and the CUDA driver API, both loaded with dlopen at run time so the
 * project builds and runs where CUDA is absent (open then fails with
 * MT_E_UNSUPPORTED naming the missing library).
 *
 * "cuda[:N]" with a GPU compiles for its sm_XY; with dev_open_opts.arch
 * ("sm_90") and no GPU (or no driver) the device is compile-only. Resource
 * usage comes from ptxas's verbose log (-Xptxas=-v): registers (in vgprs),
 * static shared memory, stack frame and spill stores (in spill_vgprs, as
 * 4-byte words). Cache hits carry no resource list (inspect is NULL): the
 * cubin is kept, the log is not; the PTX NVRTC went through is kept beside
 * the cubin in the compile cache (<key>.ptx, dev_code_get_text). Argument
 * counts are not checked against the kernel: the driver API of older CUDA
 * cannot tell them. */
#define _GNU_SOURCE
#include "device/device_impl.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Driver and NVRTC types, declared here so no CUDA header is needed. */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;

enum {
    CU_ATTR_MAX_THREADS_PER_BLOCK = 1,
    CU_ATTR_WARP_SIZE = 10,
    CU_ATTR_MULTIPROCESSOR_COUNT = 16,
    CU_ATTR_L2_CACHE_SIZE = 38,
    CU_ATTR_CC_MAJOR = 75,
    CU_ATTR_CC_MINOR = 76,
    CU_ATTR_SHARED_PER_BLOCK_OPTIN = 97,
    CU_FUNC_ATTR_MAX_DYNAMIC_SHARED = 8,
};

#define CUDA_DEFAULT_SHARED 49152 /* per block without opting in; all static __shared__ may use */

typedef struct cuda_api {
    void *libcuda, *libnvrtc;
    /* NVRTC */
    nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram *, const char *, const char *, int,
                                      const char *const *, const char *const *);
    nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram *);
    nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetPTX)(nvrtcProgram, char *);
    const char *(*nvrtcGetErrorString)(nvrtcResult);
    nvrtcResult (*nvrtcVersion)(int *, int *);
    nvrtcResult (*nvrtcGetNumSupportedArchs)(int *);  /* optional */
    nvrtcResult (*nvrtcGetSupportedArchs)(int *);     /* optional */
    /* driver */
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDriverGetVersion)(int *);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetName)(char *, int, CUdevice);
    CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, unsigned, CUstream, void **, void **);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*cuEventCreate)(CUevent *, unsigned);
    CUresult (*cuEventDestroy)(CUevent);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*cuGetErrorString)(CUresult, const char **);
} cuda_api;

typedef struct cuda_ctx {
    cuda_api api;
    bool compile_only;
    CUdevice dev;
    CUcontext cu;
    int device_index;
    char arch[32];          /* sm_90 */
    char arch_option[64];   /* --gpu-architecture=sm_90 */
    char compiler_id[192];
    const char *prelude;
} cuda_ctx;

static const char *cu_error(const cuda_api *a, CUresult r)
{
    const char *s = NULL;
    if (a->cuGetErrorString && a->cuGetErrorString(r, &s) == 0 && s)
        return s;
    return "unknown CUDA error";
}

/* Checks a driver call; on failure records the expression, file and line,
 * with the printf-style context after st. */
#define CU_TRY(c, expr, err, st, ...)                                          \
    do {                                                                       \
        CUresult cr_ = (expr);                                                 \
        if (cr_ != 0) {                                                        \
            char what_[256];                                                   \
            snprintf(what_, sizeof what_, __VA_ARGS__);                        \
            return mt_fail_at((err), (st), __FILE__, __LINE__, #expr,          \
                              "%s: CUDA error %d (%s)", what_, cr_,            \
                              cu_error(&(c)->api, cr_));                       \
        }                                                                      \
    } while (0)

/* Checks an NVRTC call and jumps to label with st set on failure. */
#define NVRTC_CHECK(c, expr, err, st, label, ...)                              \
    do {                                                                       \
        nvrtcResult nr_ = (expr);                                              \
        if (nr_ != 0) {                                                        \
            char what_[256];                                                   \
            snprintf(what_, sizeof what_, __VA_ARGS__);                        \
            (st) = mt_fail_at((err), MT_E_COMPILE, __FILE__, __LINE__, #expr,  \
                              "%s: %s", what_,                                 \
                              (c)->api.nvrtcGetErrorString(nr_));              \
            goto label;                                                        \
        }                                                                      \
    } while (0)

static void *open_first(const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        /* NODELETE: NVRTC's C++ runtime keeps static allocations that
         * would dangle (and read as leaks) after an unload. */
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (h)
            return h;
    }
    return NULL;
}

/* Resolves one symbol into *slot; records the first missing name. */
static void bind(void *lib, const char *name, void *slot, const char **missing)
{
    void *sym = lib ? dlsym(lib, name) : NULL;
    memcpy(slot, &sym, sizeof sym);
    if (!sym && !*missing)
        *missing = name;
}

static mt_status load_nvrtc(cuda_api *a, mt_err *err)
{
    static const char *const names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12",
                                        "/usr/local/cuda/lib64/libnvrtc.so"};
    a->libnvrtc = open_first(names, sizeof names / sizeof names[0]);
    if (!a->libnvrtc)
        return mt_fail(err, MT_E_UNSUPPORTED,
                       "cuda: NVRTC not found (tried libnvrtc.so, libnvrtc.so.13, "
                       "libnvrtc.so.12, /usr/local/cuda/lib64/libnvrtc.so)");
    const char *missing = NULL;
    bind(a->libnvrtc, "nvrtcCreateProgram", &a->nvrtcCreateProgram, &missing);
    bind(a->libnvrtc, "nvrtcCompileProgram", &a->nvrtcCompileProgram, &missing);
    bind(a->libnvrtc, "nvrtcDestroyProgram", &a->nvrtcDestroyProgram, &missing);
    bind(a->libnvrtc, "nvrtcGetProgramLogSize", &a->nvrtcGetProgramLogSize, &missing);
    bind(a->libnvrtc, "nvrtcGetProgramLog", &a->nvrtcGetProgramLog, &missing);
    bind(a->libnvrtc, "nvrtcGetCUBINSize", &a->nvrtcGetCUBINSize, &missing);
    bind(a->libnvrtc, "nvrtcGetCUBIN", &a->nvrtcGetCUBIN, &missing);
    bind(a->libnvrtc, "nvrtcGetPTXSize", &a->nvrtcGetPTXSize, &missing);
    bind(a->libnvrtc, "nvrtcGetPTX", &a->nvrtcGetPTX, &missing);
    bind(a->libnvrtc, "nvrtcGetErrorString", &a->nvrtcGetErrorString, &missing);
    bind(a->libnvrtc, "nvrtcVersion", &a->nvrtcVersion, &missing);
    if (missing)
        return mt_fail(err, MT_E_UNSUPPORTED, "cuda: NVRTC lacks %s", missing);
    const char *optional = NULL;
    bind(a->libnvrtc, "nvrtcGetNumSupportedArchs", &a->nvrtcGetNumSupportedArchs,
         &optional);
    bind(a->libnvrtc, "nvrtcGetSupportedArchs", &a->nvrtcGetSupportedArchs, &optional);
    return MT_OK;
}

static mt_status load_driver(cuda_api *a, mt_err *err)
{
    static const char *const names[] = {"libcuda.so.1", "libcuda.so"};
    a->libcuda = open_first(names, sizeof names / sizeof names[0]);
    if (!a->libcuda)
        return mt_fail(err, MT_E_UNSUPPORTED,
                       "cuda: the driver library libcuda.so.1 was not found (no NVIDIA "
                       "driver installed)");
    const char *missing = NULL;
    bind(a->libcuda, "cuInit", &a->cuInit, &missing);
    bind(a->libcuda, "cuDriverGetVersion", &a->cuDriverGetVersion, &missing);
    bind(a->libcuda, "cuDeviceGetCount", &a->cuDeviceGetCount, &missing);
    bind(a->libcuda, "cuDeviceGet", &a->cuDeviceGet, &missing);
    bind(a->libcuda, "cuDeviceGetName", &a->cuDeviceGetName, &missing);
    bind(a->libcuda, "cuDeviceGetAttribute", &a->cuDeviceGetAttribute, &missing);
    bind(a->libcuda, "cuDeviceTotalMem_v2", &a->cuDeviceTotalMem, &missing);
    bind(a->libcuda, "cuDevicePrimaryCtxRetain", &a->cuDevicePrimaryCtxRetain, &missing);
    bind(a->libcuda, "cuDevicePrimaryCtxRelease_v2", &a->cuDevicePrimaryCtxRelease,
         &missing);
    bind(a->libcuda, "cuCtxSetCurrent", &a->cuCtxSetCurrent, &missing);
    bind(a->libcuda, "cuCtxSynchronize", &a->cuCtxSynchronize, &missing);
    bind(a->libcuda, "cuModuleLoadData", &a->cuModuleLoadData, &missing);
    bind(a->libcuda, "cuModuleUnload", &a->cuModuleUnload, &missing);
    bind(a->libcuda, "cuModuleGetFunction", &a->cuModuleGetFunction, &missing);
    bind(a->libcuda, "cuFuncSetAttribute", &a->cuFuncSetAttribute, &missing);
    bind(a->libcuda, "cuLaunchKernel", &a->cuLaunchKernel, &missing);
    bind(a->libcuda, "cuMemAlloc_v2", &a->cuMemAlloc, &missing);
    bind(a->libcuda, "cuMemFree_v2", &a->cuMemFree, &missing);
    bind(a->libcuda, "cuMemcpyHtoD_v2", &a->cuMemcpyHtoD, &missing);
    bind(a->libcuda, "cuMemcpyDtoH_v2", &a->cuMemcpyDtoH, &missing);
    bind(a->libcuda, "cuMemcpyDtoD_v2", &a->cuMemcpyDtoD, &missing);
    bind(a->libcuda, "cuMemsetD8_v2", &a->cuMemsetD8, &missing);
    bind(a->libcuda, "cuEventCreate", &a->cuEventCreate, &missing);
    bind(a->libcuda, "cuEventDestroy_v2", &a->cuEventDestroy, &missing);
    bind(a->libcuda, "cuEventRecord", &a->cuEventRecord, &missing);
    bind(a->libcuda, "cuEventSynchronize", &a->cuEventSynchronize, &missing);
    bind(a->libcuda, "cuGetErrorString", &a->cuGetErrorString, &missing);
    /* CUDA 12.8+ has a _v2 with the same signature; 13 drops the old one. */
    const char *optional = NULL;
    bind(a->libcuda, "cuEventElapsedTime_v2", &a->cuEventElapsedTime, &optional);
    if (!a->cuEventElapsedTime)
        bind(a->libcuda, "cuEventElapsedTime", &a->cuEventElapsedTime, &missing);
    if (missing)
        return mt_fail(err, MT_E_UNSUPPORTED, "cuda: the driver library lacks %s",
                       missing);
    return MT_OK;
}

static void close_libs(cuda_api *a)
{
    if (a->libcuda)
        dlclose(a->libcuda);
    if (a->libnvrtc)
        dlclose(a->libnvrtc);
}

/* "sm_90", "sm_90a", "sm_100" -> 90, 90, 100; -1 when malformed. */
static int arch_number(const char *arch)
{
    if (strncmp(arch, "sm_", 3) != 0 || !isdigit((unsigned char)arch[3]))
        return -1;
    char *end = NULL;
    long v = strtol(arch + 3, &end, 10);
    if (v < 10 || v > 1000 || (*end && strcmp(end, "a") && strcmp(end, "f")))
        return -1;
    return (int)v;
}

static mt_status check_arch(const cuda_api *a, const char *arch, mt_err *err)
{
    int num = arch_number(arch);
    if (num < 0)
        return mt_fail(err, MT_E_INVALID, "cuda: arch '%s' is not of the form sm_XY", arch);
    int n = 0;
    if (!a->nvrtcGetNumSupportedArchs || !a->nvrtcGetSupportedArchs ||
        a->nvrtcGetNumSupportedArchs(&n) != 0 || n <= 0 || n > 256)
        return MT_OK; /* cannot tell: let NVRTC judge */
    int list[256];
    if (a->nvrtcGetSupportedArchs(list) != 0)
        return MT_OK;
    char text[1024] = "";
    for (int i = 0; i < n; i++) {
        if (list[i] == num)
            return MT_OK;
        size_t len = strlen(text);
        snprintf(text + len, sizeof text - len, "%ssm_%d", i ? ", " : "", list[i]);
    }
    return mt_fail(err, MT_E_INVALID, "cuda: this NVRTC cannot compile for %s; it "
                   "supports %s", arch, text);
}

static mt_status fill_device(cuda_ctx *c, dev_props *p, mt_err *err)
{
    cuda_api *a = &c->api;
    CU_TRY(c, a->cuDeviceGet(&c->dev, c->device_index), err, MT_E_DEVICE, "cuda:%d",
           c->device_index);
    CU_TRY(c, a->cuDevicePrimaryCtxRetain(&c->cu, c->dev), err, MT_E_DEVICE, "cuda:%d",
           c->device_index);
    CU_TRY(c, a->cuCtxSetCurrent(c->cu), err, MT_E_DEVICE, "cuda:%d", c->device_index);
    int major = 0, minor = 0, v = 0;
    CU_TRY(c, a->cuDeviceGetAttribute(&major, CU_ATTR_CC_MAJOR, c->dev), err,
           MT_E_DEVICE, "compute capability");
    CU_TRY(c, a->cuDeviceGetAttribute(&minor, CU_ATTR_CC_MINOR, c->dev), err,
           MT_E_DEVICE, "compute capability");
    snprintf(c->arch, sizeof c->arch, "sm_%d%d", major, minor);
    CU_TRY(c, a->cuDeviceGetName(p->name, (int)sizeof p->name, c->dev), err,
           MT_E_DEVICE, "device name");
    CU_TRY(c, a->cuDeviceGetAttribute(&p->compute_units, CU_ATTR_MULTIPROCESSOR_COUNT,
                                      c->dev), err, MT_E_DEVICE, "SM count");
    CU_TRY(c, a->cuDeviceGetAttribute(&p->warp_size, CU_ATTR_WARP_SIZE, c->dev), err,
           MT_E_DEVICE, "warp size");
    CU_TRY(c, a->cuDeviceGetAttribute(&p->max_threads_per_block,
                                      CU_ATTR_MAX_THREADS_PER_BLOCK, c->dev), err,
           MT_E_DEVICE, "max threads per block");
    CU_TRY(c, a->cuDeviceGetAttribute(&v, CU_ATTR_SHARED_PER_BLOCK_OPTIN, c->dev), err,
           MT_E_DEVICE, "shared memory per block");
    p->shared_mem_per_block = v > 0 ? (size_t)v : CUDA_DEFAULT_SHARED;
    p->static_shared_per_block = CUDA_DEFAULT_SHARED;
    CU_TRY(c, a->cuDeviceGetAttribute(&v, CU_ATTR_L2_CACHE_SIZE, c->dev), err,
           MT_E_DEVICE, "L2 size");
    p->llc_bytes = v > 0 ? (size_t)v : 0;
    CU_TRY(c, a->cuDeviceTotalMem(&p->mem_bytes, c->dev), err, MT_E_DEVICE,
           "memory size");
    if (a->cuDriverGetVersion(&v) == 0)
        snprintf(p->driver_version, sizeof p->driver_version, "cuda driver %d.%d",
                 v / 1000, (v % 1000) / 10);
    p->compile_only = false;
    return MT_OK;
}

static void fill_compile_only(cuda_ctx *c, dev_props *p)
{
    snprintf(p->name, sizeof p->name, "NVIDIA %s (compile-only, no GPU)", c->arch);
    p->warp_size = 32;
    p->max_threads_per_block = 1024;
    p->shared_mem_per_block = CUDA_DEFAULT_SHARED;
    p->static_shared_per_block = CUDA_DEFAULT_SHARED;
    p->compile_only = true;
}

static void cuda_close(void *ctx)
{
    cuda_ctx *c = ctx;
    if (!c)
        return;
    if (c->cu)
        c->api.cuDevicePrimaryCtxRelease(c->dev);
    close_libs(&c->api);
    free(c);
}

/* Opens the driver and counts GPUs; 0 GPUs when the driver is absent or
 * reports none. why says what happened. */
static int count_gpus(cuda_ctx *c, char *why, size_t cap)
{
    mt_err e = MT_ERR_INIT;
    if (load_driver(&c->api, &e) != MT_OK) {
        snprintf(why, cap, "%.400s", e.msg);
        return 0;
    }
    CUresult r = c->api.cuInit(0);
    int n = 0;
    if (r == 0)
        r = c->api.cuDeviceGetCount(&n);
    if (r != 0) {
        snprintf(why, cap, "cuda: cuInit/cuDeviceGetCount failed: CUDA error %d (%s)", r,
                 cu_error(&c->api, r));
        return 0;
    }
    if (n == 0)
        snprintf(why, cap, "cuda: the driver reports no NVIDIA GPU");
    return n;
}

static mt_status cuda_open(const char *arg, const dev_open_opts *opts, dev_props *props,
                           void **ctx_out, mt_err *err)
{
    *ctx_out = NULL;
    int index = 0;
    mt_status ist = dev_parse_index("cuda", arg, &index, err);
    if (ist != MT_OK)
        return ist;
    const char *want = opts->arch && *opts->arch ? opts->arch : NULL;
    if (want && arch_number(want) < 0)
        return mt_fail(err, MT_E_INVALID, "cuda: arch '%s' is not of the form sm_XY",
                       want);
    const char *prelude = dev_prelude_get("prelude_gpu.h");
    if (!prelude)
        return mt_fail(err, MT_E_INVALID, "cuda: prelude_gpu.h is not embedded");

    cuda_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return mt_fail(err, MT_E_NOMEM, "cuda device");
    c->prelude = prelude;
    c->device_index = index;
    mt_status st = load_nvrtc(&c->api, err);
    if (st != MT_OK)
        goto fail;
    char why[512] = "";
    int count = count_gpus(c, why, sizeof why);
    memset(props, 0, sizeof *props);
    props->backend = DEV_BACKEND_CUDA;
    if (index < count) {
        st = fill_device(c, props, err);
        if (st != MT_OK)
            goto fail;
    } else if (!want) {
        if (count > 0)
            st = mt_fail(err, MT_E_DEVICE, "cuda:%d: only %d NVIDIA GPU(s) present",
                         index, count);
        else
            st = mt_fail(err, c->api.libcuda ? MT_E_DEVICE : MT_E_UNSUPPORTED,
                         "%s; pass an arch (--arch sm_90) to compile without a GPU", why);
        goto fail;
    }
    if (want && (index >= count || strcmp(want, c->arch) != 0)) {
        c->compile_only = true;
        snprintf(c->arch, sizeof c->arch, "%s", want);
        fill_compile_only(c, props);
        snprintf(props->spec, sizeof props->spec, "cuda");
    } else {
        snprintf(props->spec, sizeof props->spec, "cuda:%d", index);
    }
    st = check_arch(&c->api, c->arch, err);
    if (st != MT_OK)
        goto fail;
    snprintf(props->arch, sizeof props->arch, "%s", c->arch);
    props->max_vgprs = 255;
    int maj = 0, min = 0;
    c->api.nvrtcVersion(&maj, &min);
    snprintf(props->runtime_version, sizeof props->runtime_version, "nvrtc %d.%d", maj,
             min);
    snprintf(c->arch_option, sizeof c->arch_option, "--gpu-architecture=%s", c->arch);
    snprintf(c->compiler_id, sizeof c->compiler_id, "%s %s -Xptxas=-v",
             props->runtime_version, c->arch_option);
    *ctx_out = c;
    return MT_OK;
fail:
    cuda_close(c);
    return st;
}

static const char *cuda_compiler_id(void *ctx) { return ((cuda_ctx *)ctx)->compiler_id; }
static const char *cuda_prelude(void *ctx) { return ((cuda_ctx *)ctx)->prelude; }

/* The number right before `what` in line ("1024 bytes smem"), or -1. */
static int64_t number_before(const char *line, const char *what)
{
    const char *p = strstr(line, what);
    if (!p)
        return -1;
    while (p > line && p[-1] == ' ')
        p--;
    const char *end = p;
    while (p > line && isdigit((unsigned char)p[-1]))
        p--;
    return p == end ? -1 : strtoll(p, NULL, 10);
}

static void res_init(dev_kernel_res *r, const char *name, size_t n)
{
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%.*s", (int)n, name);
    r->vgprs = r->spill_vgprs = r->max_threads = r->waves_per_simd = -1;
    r->sgprs = r->agprs = r->spill_sgprs = -1;
    r->lds_bytes = r->private_bytes = -1;
}

/* Reads ptxas -v output: per entry function, registers, shared memory,
 * stack frame and spill stores. */
static void parse_ptxas(const char *log, dev_code_info *info)
{
    info->n_kernels = 0;
    dev_kernel_res *cur = NULL;
    bool props_for_cur = false;
    for (const char *line = log; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int)(n < sizeof buf ? n : sizeof buf - 1), line);
        const char *q;
        if ((q = strstr(buf, "Compiling entry function '")) != NULL) {
            q += strlen("Compiling entry function '");
            size_t len = strcspn(q, "'");
            cur = NULL;
            if (info->n_kernels < DEV_MAX_KERNELS_PER_CODE) {
                cur = &info->kernels[info->n_kernels++];
                res_init(cur, q, len);
            }
            props_for_cur = false;
        } else if ((q = strstr(buf, "Function properties for ")) != NULL) {
            q += strlen("Function properties for ");
            props_for_cur = cur && !strcmp(q, cur->name);
        } else if (cur && props_for_cur && strstr(buf, "bytes stack frame")) {
            cur->private_bytes = number_before(buf, " bytes stack frame");
            int64_t spill = number_before(buf, " bytes spill stores");
            cur->spill_vgprs = spill < 0 ? -1 : (int)((spill + 3) / 4);
        } else if (cur && (q = strstr(buf, "Used ")) != NULL && strstr(buf, "registers")) {
            cur->vgprs = (int)number_before(buf, " registers");
            int64_t smem = number_before(buf, " bytes smem");
            cur->lds_bytes = smem < 0 ? 0 : smem;
        }
        line = nl ? nl + 1 : NULL;
    }
}

static char *nvrtc_log(cuda_ctx *c, nvrtcProgram prog)
{
    size_t n = 0;
    if (c->api.nvrtcGetProgramLogSize(prog, &n) != 0 || n == 0)
        return NULL;
    char *log = malloc(n + 1);
    if (!log)
        return NULL;
    if (c->api.nvrtcGetProgramLog(prog, log) != 0) {
        free(log);
        return NULL;
    }
    log[n] = 0;
    return log;
}

/* The program's PTX (NUL-terminated, malloc'd) or NULL. NVRTC compiled
 * to a cubin still holds the PTX it went through; cuobjdump is not
 * installed here, so this text is the only view of the instructions. */
static char *nvrtc_ptx(cuda_ctx *c, nvrtcProgram prog)
{
    size_t n = 0;
    if (c->api.nvrtcGetPTXSize(prog, &n) != 0 || n == 0)
        return NULL;
    char *ptx = malloc(n + 1);
    if (!ptx)
        return NULL;
    if (c->api.nvrtcGetPTX(prog, ptx) != 0) {
        free(ptx);
        return NULL;
    }
    ptx[n] = 0;
    return ptx;
}

static mt_status cuda_compile(void *ctx, const dev_props *props, const dev_compile_req *req,
                              void **bytes, size_t *len, char **log, char **text,
                              dev_code_info *info, mt_err *err)
{
    (void)props;
    cuda_ctx *c = ctx;
    *bytes = NULL;
    *len = 0;
    *log = NULL;
    *text = NULL;
    info->n_kernels = 0;
    const char *name = req->name ? req->name : "kernel.cu";
    /* The prelude's helpers are static: unused ones are not worth a warning. */
    const char *fixed[] = {c->arch_option, "-Xptxas=-v", "--diag-suppress=177"};
    dev_compile_args a;
    mt_status st = dev_compile_args_build(req, name, "prelude_gpu.h", c->prelude, fixed,
                                          (int)(sizeof fixed / sizeof *fixed), 256, &a,
                                          err);
    if (st != MT_OK)
        return st;
    nvrtcProgram prog = NULL;
    char *code = NULL;
    NVRTC_CHECK(c, c->api.nvrtcCreateProgram(&prog, a.text, name, 0, NULL, NULL), err, st,
                out, "NVRTC program for %s", name);
    nvrtcResult rr = c->api.nvrtcCompileProgram(prog, a.n_opts, a.opts);
    *log = nvrtc_log(c, prog);
    if (rr != 0) {
        st = mt_fail(err, MT_E_COMPILE, "NVRTC failed to compile %s for %s (%s):\n%s",
                     name, c->arch, c->api.nvrtcGetErrorString(rr),
                     *log ? *log : "(empty log)");
        goto out;
    }
    size_t size = 0;
    NVRTC_CHECK(c, c->api.nvrtcGetCUBINSize(prog, &size), err, st, out, "cubin of %s",
                name);
    if (size == 0) {
        st = mt_fail(err, MT_E_COMPILE, "NVRTC returned no cubin for %s", name);
        goto out;
    }
    code = malloc(size);
    if (!code) {
        st = mt_fail(err, MT_E_NOMEM, "cubin of %zu bytes", size);
        goto out;
    }
    NVRTC_CHECK(c, c->api.nvrtcGetCUBIN(prog, code), err, st, out, "cubin of %s", name);
    if (*log)
        parse_ptxas(*log, info);
    *text = nvrtc_ptx(c, prog);
    *bytes = code;
    *len = size;
    code = NULL;
out:
    if (prog)
        c->api.nvrtcDestroyProgram(&prog);
    if (st != MT_OK) {
        free(*log);
        *log = NULL;
    }
    free(code);
    dev_compile_args_release(&a);
    return st;
}

static mt_status need_gpu(cuda_ctx *c, const char *what, mt_err *err)
{
    if (c->compile_only)
        return mt_fail(err, MT_E_UNSUPPORTED, "cuda device for %s is compile-only (no "
                       "GPU): cannot %s", c->arch, what);
    CU_TRY(c, c->api.cuCtxSetCurrent(c->cu), err, MT_E_DEVICE, "cuda:%d: %s",
           c->device_index, what);
    return MT_OK;
}

static mt_status cuda_module_load(void *ctx, const void *bytes, size_t len, void **out,
                                  mt_err *err)
{
    cuda_ctx *c = ctx;
    *out = NULL;
    mt_status st = need_gpu(c, "load modules", err);
    if (st != MT_OK)
        return st;
    CUmodule m = NULL;
    CU_TRY(c, c->api.cuModuleLoadData(&m, bytes), err, MT_E_DEVICE,
           "loading a %zu-byte cubin for %s", len, c->arch);
    *out = m;
    return MT_OK;
}

static void cuda_module_unload(void *ctx, void *mod)
{
    cuda_ctx *c = ctx;
    if (mod && !c->compile_only) {
        c->api.cuCtxSetCurrent(c->cu);
        c->api.cuModuleUnload((CUmodule)mod);
    }
}

static mt_status cuda_get_kernel(void *ctx, void *mod, const char *name, const char *sig,
                                 void **out, mt_err *err)
{
    (void)sig;
    cuda_ctx *c = ctx;
    CUfunction f = NULL;
    CU_TRY(c, c->api.cuModuleGetFunction(&f, (CUmodule)mod, name), err, MT_E_NOT_FOUND,
           "kernel %s", name);
    *out = f;
    return MT_OK;
}

static mt_status cuda_launch(void *ctx, void *kern, const char *kname, const char *sig,
                             dev_dim3 grid, dev_dim3 block, size_t dyn_shared, void **args,
                             mt_err *err)
{
    (void)sig;
    cuda_ctx *c = ctx;
    mt_status st = need_gpu(c, "launch", err);
    if (st != MT_OK)
        return st;
    if (dyn_shared > CUDA_DEFAULT_SHARED)
        CU_TRY(c, c->api.cuFuncSetAttribute((CUfunction)kern, CU_FUNC_ATTR_MAX_DYNAMIC_SHARED,
                                            (int)dyn_shared),
               err, MT_E_LAUNCH, "kernel %s: %zu bytes of dynamic shared memory", kname,
               dyn_shared);
    CU_TRY(c, c->api.cuLaunchKernel((CUfunction)kern, grid.x, grid.y, grid.z, block.x,
                                    block.y, block.z, (unsigned)dyn_shared, NULL, args,
                                    NULL),
           err, MT_E_LAUNCH, "launch of %s (grid %ux%ux%u, block %ux%ux%u, %zu B dynamic "
           "shared)", kname, grid.x, grid.y, grid.z, block.x, block.y, block.z, dyn_shared);
    return MT_OK;
}

static mt_status cuda_synchronize(void *ctx, mt_err *err)
{
    cuda_ctx *c = ctx;
    if (c->compile_only)
        return MT_OK;
    mt_status st = need_gpu(c, "synchronize", err);
    if (st != MT_OK)
        return st;
    CU_TRY(c, c->api.cuCtxSynchronize(), err, MT_E_DEVICE, "synchronize");
    return MT_OK;
}

static mt_status cuda_alloc(void *ctx, size_t bytes, void **ptr, mt_err *err)
{
    cuda_ctx *c = ctx;
    *ptr = NULL;
    mt_status st = need_gpu(c, "allocate", err);
    if (st != MT_OK)
        return st;
    CUdeviceptr p = 0;
    CU_TRY(c, c->api.cuMemAlloc(&p, bytes), err, MT_E_NOMEM, "cuMemAlloc of %zu bytes",
           bytes);
    *ptr = (void *)(uintptr_t)p;
    return MT_OK;
}

static void cuda_free(void *ctx, void *ptr)
{
    cuda_ctx *c = ctx;
    if (ptr && !c->compile_only) {
        c->api.cuCtxSetCurrent(c->cu);
        c->api.cuMemFree((CUdeviceptr)(uintptr_t)ptr);
    }
}

static mt_status cuda_copy(void *ctx, void *dst, const void *src, size_t bytes, int kind,
                           mt_err *err)
{
    cuda_ctx *c = ctx;
    mt_status st = need_gpu(c, "copy", err);
    if (st != MT_OK)
        return st;
    CUresult r;
    switch (kind) {
    case 0:
        r = c->api.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, bytes);
        break;
    case 1:
        r = c->api.cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, bytes);
        break;
    case 2:
        r = c->api.cuMemcpyDtoD((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src,
                                bytes);
        break;
    default:
        return mt_fail(err, MT_E_INVALID, "cuda copy: kind %d", kind);
    }
    CU_TRY(c, r, err, MT_E_DEVICE, "copy of %zu bytes (kind %d)", bytes, kind);
    return MT_OK;
}

static mt_status cuda_memset(void *ctx, void *dst, int byte, size_t bytes, mt_err *err)
{
    cuda_ctx *c = ctx;
    mt_status st = need_gpu(c, "memset", err);
    if (st != MT_OK)
        return st;
    CU_TRY(c, c->api.cuMemsetD8((CUdeviceptr)(uintptr_t)dst, (unsigned char)byte, bytes),
           err, MT_E_DEVICE, "memset of %zu bytes", bytes);
    return MT_OK;
}

static mt_status cuda_event_create(void *ctx, void **ev, mt_err *err)
{
    cuda_ctx *c = ctx;
    *ev = NULL;
    mt_status st = need_gpu(c, "create events", err);
    if (st != MT_OK)
        return st;
    CUevent e = NULL;
    CU_TRY(c, c->api.cuEventCreate(&e, 0), err, MT_E_DEVICE, "event");
    *ev = e;
    return MT_OK;
}

static void cuda_event_destroy(void *ctx, void *ev)
{
    cuda_ctx *c = ctx;
    if (ev)
        c->api.cuEventDestroy((CUevent)ev);
}

static mt_status cuda_event_record(void *ctx, void *ev, mt_err *err)
{
    cuda_ctx *c = ctx;
    CU_TRY(c, c->api.cuEventRecord((CUevent)ev, NULL), err, MT_E_DEVICE, "event record");
    return MT_OK;
}

static mt_status cuda_event_elapsed(void *ctx, void *a, void *b, double *ms, mt_err *err)
{
    cuda_ctx *c = ctx;
    float f = 0;
    CU_TRY(c, c->api.cuEventSynchronize((CUevent)b), err, MT_E_DEVICE, "event wait");
    CU_TRY(c, c->api.cuEventElapsedTime(&f, (CUevent)a, (CUevent)b), err, MT_E_DEVICE,
           "event elapsed time");
    *ms = f;
    return MT_OK;
}

const dev_backend_ops dev_cuda_ops = {
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
    .compile_text = cuda_compile,
    .text_ext = "ptx",
    .inspect = NULL,
    .compiler_id = cuda_compiler_id,
    .prelude = cuda_prelude,
    .module_load = cuda_module_load,
    .module_unload = cuda_module_unload,
    .get_kernel = cuda_get_kernel,
    .launch = cuda_launch,
    .set_timeout = NULL,
    .synchronize = cuda_synchronize,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .memset = cuda_memset,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_elapsed = cuda_event_elapsed,
};
