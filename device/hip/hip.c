/* hip.c: the hip backend (ROCm). hipRTC compiles kernel sources (the GPU
 * prelude, then the source) for the device's gfx arch; amd_comgr reads
 * registers, LDS and spills from the code object; the HIP module API loads
 * and launches on the null stream; hipEvents time.
 *
 * Without a GPU, "hip" opens only when an arch is given (dev_open_opts.arch):
 * then the device is compile-only. hipRTC of ROCm 5.2 crashes on arch names
 * it does not know (gfx940..gfx942, gfx950), so only archs on an allow-list
 * ever reach it. The CDNA3 ones (gfx940..gfx942) are compiled, compile-only,
 * by an offline clang instead (clang-19, or $MOETUNE_HIP_CLANG) with the
 * ROCm headers and device libraries of the system (see clang_compile);
 * gfx950 needs LLVM 20 or later. Built only with MOETUNE_HAVE_HIP. */
#ifdef MOETUNE_HAVE_HIP
#define _GNU_SOURCE
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include "device/device_impl.h"

#include <hip/hip_runtime_api.h>
#include <hip/hiprtc.h>
#include <errno.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/files.h"
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

/* Archs past hipRTC 5.2 that an offline clang compiles (compile-only), and
 * the LLVM major version each needs. */
static const struct {
    const char *arch;
    int llvm;
} clang_archs[] = {
    {"gfx940", 19}, {"gfx941", 19}, {"gfx942", 19}, {"gfx950", 20},
};
#define N_CLANG_ARCHS (sizeof clang_archs / sizeof clang_archs[0])

/* The offline clang and what it links: found once per device. */
typedef struct hip_clang {
    char path[256];         /* the compiler ($MOETUNE_HIP_CLANG or clang-19) */
    char version[48];       /* "19.1.7" */
    int major;
    char devlibs[256];      /* folder of ocml.bc, ockl.bc, oclc_*.bc */
    char isa[8];            /* the oclc_isa_version_<isa>.bc linked */
} hip_clang;

typedef struct hip_ctx {
    int device;
    bool compile_only;
    bool use_clang;         /* compile with cl instead of hipRTC */
    hip_clang cl;
    char arch[32];
    char arch_option[48];   /* --offload-arch=gfx90a */
    char compiler_id[1024];
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

static int clang_arch_llvm(const char *arch)
{
    for (size_t i = 0; i < N_CLANG_ARCHS; i++)
        if (!strcmp(arch, clang_archs[i].arch))
            return clang_archs[i].llvm;
    return 0;
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
                   "gfx942, gfx950); it is known to compile for: %s; gfx940, gfx941 and "
                   "gfx942 compile (without a GPU) with clang-19 instead", arch, list);
}

/* ---- the offline clang --------------------------------------------------- */

/* Runs argv (NULL-terminated) with stdout and stderr into the file lg and
 * returns its exit status (-1 when it could not run or was killed). */
static bool file_exists(const char *dir, const char *name)
{
    char p[512];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Finds the compiler, its version and the device libraries for arch, or
 * fails with MT_E_UNSUPPORTED saying what to install. */
static mt_status clang_find(const char *arch, hip_clang *cl, mt_err *err)
{
    memset(cl, 0, sizeof *cl);
    const char *env = getenv("MOETUNE_HIP_CLANG");
    snprintf(cl->path, sizeof cl->path, "%s", env && *env ? env : "clang-19");
    char dir[512];
    if (!mt_tmp_path(dir, sizeof dir, "moetune-clang-XXXXXX"))
        return mt_fail(err, MT_E_IO, "%s: $TMPDIR is too long", dir);
    if (!mkdtemp(dir))
        return mt_fail(err, MT_E_IO, "cannot create a temporary folder %s: %s", dir,
                       strerror(errno));
    char lg[600];
    snprintf(lg, sizeof lg, "%s/log", dir);
    const char *argv[] = {cl->path, "--version", NULL};
    int rc = dev_run_tool(argv, lg);
    char *text = NULL;
    if (rc == 0 && mt_file_read(lg, &text, NULL, NULL) == MT_OK && text) {
        const char *v = strstr(text, "clang version ");
        if (v) {
            v += strlen("clang version ");
            snprintf(cl->version, sizeof cl->version, "%.*s", (int)strcspn(v, " \n("), v);
            cl->major = atoi(cl->version);
        }
    }
    free(text);
    unlink(lg);
    rmdir(dir);
    if (cl->major == 0)
        return mt_fail(err, MT_E_UNSUPPORTED,
                       "hip: %s needs an offline clang (hipRTC 5.2 crashes on it), and "
                       "'%s --version' did not run: install clang-19, lld-19 and "
                       "rocm-device-libs (apt-get install clang-19 lld-19 rocm-device-libs) "
                       "or point MOETUNE_HIP_CLANG at a clang", arch, cl->path);
    int need = clang_arch_llvm(arch);
    if (cl->major < need)
        return mt_fail(err, MT_E_UNSUPPORTED,
                       "hip: %s needs LLVM %d or later to compile, and %s is clang %s; "
                       "without one its kernels are checked on emu only (and compiled on "
                       "the device where one is present)", arch, need, cl->path,
                       cl->version);

    env = getenv("MOETUNE_ROCM_DEVICE_LIBS");
    const char *cands[] = {env && *env ? env : NULL,
                           "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode",
                           "/opt/rocm/amdgcn/bitcode", "/opt/rocm/lib/amdgcn/bitcode"};
    for (size_t i = 0; i < sizeof cands / sizeof *cands && !cl->devlibs[0]; i++)
        if (cands[i] && file_exists(cands[i], "ocml.bc") && file_exists(cands[i], "ockl.bc") &&
            file_exists(cands[i], "hip.bc"))
            snprintf(cl->devlibs, sizeof cl->devlibs, "%s", cands[i]);
    if (!cl->devlibs[0])
        return mt_fail(err, MT_E_UNSUPPORTED,
                       "hip: %s compiles with %s but the ROCm device libraries (ocml.bc, "
                       "ockl.bc, hip.bc) are not found: install rocm-device-libs or set "
                       "MOETUNE_ROCM_DEVICE_LIBS to their folder", arch, cl->path);
    /* ROCm 5.2's libraries stop at gfx940; its ISA constant is the nearest
     * one for the rest of the family (only a few ocml paths read it). */
    char want[48];
    snprintf(cl->isa, sizeof cl->isa, "%s", arch + 3);
    snprintf(want, sizeof want, "oclc_isa_version_%s.bc", cl->isa);
    if (!file_exists(cl->devlibs, want))
        snprintf(cl->isa, sizeof cl->isa, "%.2s0", arch + 3);
    snprintf(want, sizeof want, "oclc_isa_version_%s.bc", cl->isa);
    if (!file_exists(cl->devlibs, want))
        return mt_fail(err, MT_E_UNSUPPORTED, "hip: no %s in %s for %s", want, cl->devlibs,
                       arch);
    return MT_OK;
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
    mt_status ist = dev_parse_index("hip", arg, &index, err);
    if (ist != MT_OK)
        return ist;
    const char *want = opts->arch && *opts->arch ? opts->arch : NULL;
    hip_clang cl;
    bool use_clang = want && !arch_known(want) && clang_arch_llvm(want);
    if (want && !arch_known(want) && !use_clang)
        return refuse_arch(want, MT_E_INVALID, err);
    if (use_clang) {
        mt_status st = clang_find(want, &cl, err);
        if (st != MT_OK)
            return st;
    }

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
    c->use_clang = use_clang;
    if (use_clang)
        c->cl = cl;
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
     * code for another arch cannot be loaded here; so does an arch only the
     * offline clang compiles (its code objects are for a newer runtime). */
    if (want && (use_clang || index >= count || strcmp(want, c->arch) != 0)) {
        c->compile_only = true;
        snprintf(c->arch, sizeof c->arch, "%s", want);
        fill_compile_only(c, props);
        if (use_clang)
            snprintf(props->name, sizeof props->name,
                     "AMD %.31s (compile-only, no GPU; clang %.40s)", c->arch,
                     c->cl.version);
        snprintf(props->spec, sizeof props->spec, "hip");
    } else {
        snprintf(props->spec, sizeof props->spec, "hip:%d", index);
    }
    snprintf(props->arch, sizeof props->arch, "%s", c->arch);
    /* gfx90a and CDNA3/4 have one 512-entry file for VGPRs and AGPRs. */
    props->max_vgprs = !strcmp(c->arch, "gfx90a") || !strncmp(c->arch, "gfx94", 5) ||
                               !strcmp(c->arch, "gfx950")
                           ? 512
                           : 256;
    int rv = 0;
    if (hipRuntimeGetVersion(&rv) == hipSuccess)
        version_text(rv, props->runtime_version, sizeof props->runtime_version);
    else
        snprintf(props->runtime_version, sizeof props->runtime_version, "hip");
    snprintf(c->arch_option, sizeof c->arch_option, "--offload-arch=%s", c->arch);
    if (use_clang)
        snprintf(c->compiler_id, sizeof c->compiler_id,
                 "%s %s -O3 %s -mcode-object-version=5 %s headers, %s isa %s", c->cl.path,
                 c->cl.version, c->arch_option, props->runtime_version, c->cl.devlibs,
                 c->cl.isa);
    else
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

/* Compiles with the offline clang: the same text hipRTC would get, in a
 * file, built for the device alone and linked with the ROCm device
 * libraries as hipRTC links its own copy:
 *   clang -x hip --offload-arch=ARCH --cuda-device-only --no-gpu-bundle-output
 *         -nogpulib -mcode-object-version=5 -O3 -include hip/hip_runtime.h
 *         -Xclang -mlink-builtin-bitcode -Xclang DEVLIBS/<lib>.bc ...
 *         -DNAME=VALUE ... OPTIONS -c k.hip -o k.co
 * The result is a code object like hipRTC's (an ELF shared object with
 * amdhsa metadata) that comgr reads. */
static mt_status clang_compile(hip_ctx *c, const char *name, const dev_compile_args *a,
                               void **bytes, size_t *len, char **log, mt_err *err)
{
    static const char *const libs[] = {
        "hip", "ocml", "ockl", "oclc_daz_opt_off", "oclc_unsafe_math_off",
        "oclc_finite_only_off", "oclc_correctly_rounded_sqrt_on",
        "oclc_wavefrontsize64_on", "oclc_abi_version_500",
    };
    enum { N_LIBS = sizeof libs / sizeof *libs };
    char dir[512];
    if (!mt_tmp_path(dir, sizeof dir, "moetune-hip-XXXXXX"))
        return mt_fail(err, MT_E_IO, "%s: $TMPDIR is too long", dir);
    if (!mkdtemp(dir))
        return mt_fail(err, MT_E_IO, "cannot create a temporary folder %s: %s", dir,
                       strerror(errno));
    char src[600], obj[600], lg[600], isa[96];
    snprintf(src, sizeof src, "%s/k.hip", dir);
    snprintf(obj, sizeof obj, "%s/k.co", dir);
    snprintf(lg, sizeof lg, "%s/log", dir);
    snprintf(isa, sizeof isa, "oclc_isa_version_%s", c->cl.isa);
    char bc[N_LIBS + 1][320];
    const char *argv[64 + 4 * (N_LIBS + 1) + 256];
    int n = 0;
    argv[n++] = c->cl.path;
    argv[n++] = "-x";
    argv[n++] = "hip";
    argv[n++] = c->arch_option;
    argv[n++] = "--cuda-device-only";
    argv[n++] = "--no-gpu-bundle-output";
    argv[n++] = "-nogpulib";
    argv[n++] = "-mcode-object-version=5";
    argv[n++] = "-O3";
    argv[n++] = "-include";
    argv[n++] = "hip/hip_runtime.h";
    for (int i = 0; i <= N_LIBS; i++) {
        snprintf(bc[i], sizeof bc[i], "%.255s/%.60s.bc", c->cl.devlibs,
                 i < N_LIBS ? libs[i] : isa);
        argv[n++] = "-Xclang";
        argv[n++] = "-mlink-builtin-bitcode";
        argv[n++] = "-Xclang";
        argv[n++] = bc[i];
    }
    /* a's options after its first two (hipRTC's --offload-arch and -O3) */
    for (int i = 2; i < a->n_opts && n < (int)(sizeof argv / sizeof *argv) - 6; i++)
        argv[n++] = a->opts[i];
    argv[n++] = "-c";
    argv[n++] = src;
    argv[n++] = "-o";
    argv[n++] = obj;
    argv[n] = NULL;

    mt_status st = mt_file_write_atomic(src, a->text, strlen(a->text), err);
    if (st == MT_OK) {
        int rc = dev_run_tool(argv, lg);
        char *text = NULL;
        if (mt_file_read(lg, &text, NULL, NULL) == MT_OK && text && !text[strspn(text, " \t\r\n")]) {
            free(text);
            text = NULL;
        }
        if (rc != 0) {
            st = mt_fail(err, MT_E_COMPILE, "%s (clang %s) failed to compile %s for %s "
                         "(exit %d):\n%s", c->cl.path, c->cl.version, name, c->arch, rc,
                         text ? text : "(empty log)");
            free(text);
        } else {
            *log = text;
            char *data = NULL;
            st = mt_file_read(obj, &data, len, err);
            if (st == MT_OK)
                *bytes = data;
        }
    }
    unlink(src);
    unlink(obj);
    unlink(lg);
    rmdir(dir);
    return st;
}

/* hipRTC's part of hip_compile, under the LLVM lock (hip_comgr.h): the
 * code object into *code / *size and the log into *log. */
static mt_status rtc_compile(const hip_ctx *c, const char *name, const dev_compile_args *a,
                             char **code, size_t *size, char **log, mt_err *err)
{
    mt_status st = MT_OK;
    hiprtcProgram prog = NULL;
    hip_llvm_lock();
    RTC_CHECK(hiprtcCreateProgram(&prog, a->text, name, 0, NULL, NULL), err, st, out,
              "hipRTC program for %s", name);
    /* hipRTC's LLVM swaps in its own malloc'd signal stack on the first
     * thread that compiles; AddressSanitizer then fails to unmap it when
     * that thread exits. Put the thread's own stack back. */
    stack_t alt;
    bool have_alt = sigaltstack(NULL, &alt) == 0;
    hiprtcResult rr = hiprtcCompileProgram(prog, a->n_opts, a->opts);
    if (have_alt)
        sigaltstack(&alt, NULL);
    *log = program_log(prog);
    if (rr != HIPRTC_SUCCESS) {
        st = mt_fail(err, MT_E_COMPILE, "hipRTC failed to compile %s for %s (%s):\n%s",
                     name, c->arch, hiprtcGetErrorString(rr),
                     *log ? *log : "(empty log)");
        goto out;
    }
    RTC_CHECK(hiprtcGetCodeSize(prog, size), err, st, out, "code of %s", name);
    if (*size == 0) {
        st = mt_fail(err, MT_E_COMPILE, "hipRTC returned no code for %s", name);
        goto out;
    }
    *code = malloc(*size);
    if (!*code) {
        st = mt_fail(err, MT_E_NOMEM, "code object of %zu bytes", *size);
        goto out;
    }
    RTC_CHECK(hiprtcGetCode(prog, *code), err, st, out, "code of %s", name);
out:
    if (prog)
        hiprtcDestroyProgram(&prog);
    hip_llvm_unlock();
    return st;
}

static mt_status hip_compile(void *ctx, const dev_props *props, const dev_compile_req *req,
                             void **bytes, size_t *len, char **log, dev_code_info *info,
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
    if (c->use_clang) {
        st = clang_compile(c, name, &a, bytes, len, log, err);
        dev_compile_args_release(&a);
        if (st == MT_OK) {
            st = hip_comgr_inspect(*bytes, *len, info, NULL, 0, err);
            if (st != MT_OK) {
                mt_err_prefix(err, "resources of %s", name);
                free(*bytes);
                *bytes = NULL;
                *len = 0;
                free(*log);
                *log = NULL;
            }
        }
        return st;
    }
    char *code = NULL;
    size_t size = 0;
    st = rtc_compile(c, name, &a, &code, &size, log, err);
    if (st != MT_OK)
        goto out;
    st = hip_comgr_inspect(code, size, info, NULL, 0, err);
    if (st != MT_OK) {
        mt_err_prefix(err, "resources of %s", name);
        goto out;
    }
    *bytes = code;
    *len = size;
    code = NULL;
out:
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
    mt_status st = hip_comgr_inspect(bytes, len, info, target, sizeof target, err);
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
    if (he == hipSuccess) {
        hip_llvm_lock(); /* the runtime reads the code object through comgr */
        he = hipModuleLoadData(&m->module, m->bytes);
        hip_llvm_unlock();
    }
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
