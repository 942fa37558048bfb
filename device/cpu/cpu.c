/* cpu.c: the cpu backend. C kernel sources are compiled by the host
 * compiler (dev_host_cc) into shared objects; a launch runs every work item
 * of the grid on a persistent thread pool, calling the kernel through a
 * libffi call interface built from its signature letters. On x86-64 a
 * kernel with at most 16 pointer/integer and 8 float/double arguments is
 * called directly through a fixed prototype instead (16 int64, then 8
 * double): the SysV ABI passes the first 6 integer-class arguments and the
 * first 8 SSE ones in their own registers in order, and the integer-class
 * ones after the sixth on the stack, one eightbyte each, in order (an int
 * in the low half), so the callee sees the same values libffi would give
 * it, at ~0.5 ns a call instead of ~70 ns for ffi_call (measured here).
 * The MoE GEMMs' 13 arguments take this path: a decode launch runs
 * thousands of mostly empty items. Other kernels and other targets go
 * through ffi_call.
 * Launch timeouts are not offered (set_timeout is NULL): a running C
 * function cannot be stopped safely; the tuner's worker process is the
 * guard against hangs. */
#define _GNU_SOURCE
#include "device/device_impl.h"

#include <dlfcn.h>
#include <ffi.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_host.h"
#include "cpu_pool.h"

#define CPU_MAX_THREADS 4096
#define CPU_MAX_ARGS 32
#define CPU_ALIGN 4096 /* page-aligned like GPU allocations; SIMD-friendly */
/* Allocations of at least this size are aligned to it and asked to be
 * backed by transparent huge pages (where THP is "madvise", the default
 * on Debian, nothing else would give them): weights and activations are
 * streamed, and with 4 KiB pages every 4 KiB of a stream is a TLB miss
 * (a costly page walk under virtualization). */
#define CPU_HUGE 2097152

typedef void (*set_item_fn)(unsigned, unsigned, unsigned, unsigned, unsigned, unsigned);

typedef struct cpu_ctx {
    cpu_pool *pool;
    const char *prelude;
    char march[48];        /* "-march=native", or a capped level "-march=x86-64-v3" */
    bool amx_off;          /* native on a cpu with AMX this process may not use: -mno-amx-* */
    char page_touch[32];   /* "-DMT_CPU_PAGE_TOUCH=0|1" (dev_props.cpu_page_touch) */
    char compiler_id[512];
} cpu_ctx;

#if defined(__x86_64__) && !defined(_WIN32)
#define CPU_REG_CALL 1
#define REG_INTS 16 /* 6 in registers, 10 on the stack */
#define REG_FLOATS 8
/* The integer-class arguments, then every SSE register. */
typedef void (*reg_fn)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       double, double, double, double, double, double, double, double);
#endif

typedef struct cpu_kernel {
    struct cpu_kernel *next;
    void (*fn)(void);
    bool reg_call; /* fits the fixed prototype (reg_fn) */
    char sig[CPU_MAX_ARGS + 1];
    set_item_fn set_item; /* the module's, for the item index */
    ffi_cif cif;
    ffi_type *types[CPU_MAX_ARGS];
    int n_args;
} cpu_kernel;

typedef struct cpu_module {
    void *dl;
    set_item_fn set_item;
    cpu_kernel *kernels;
} cpu_module;

/* One launch, shared read-only by the pool threads. */
typedef struct cpu_job {
    const cpu_kernel *k;
    set_item_fn set_item;
    void **args;
    unsigned gx, gy, gz;
#ifdef CPU_REG_CALL
    int64_t ints[REG_INTS];   /* argument values in register order */
    double floats[REG_FLOATS];
#endif
} cpu_job;

/* The x86-64 levels --arch may cap the cpu backend's code at, so that the
 * AVX2 and plain paths of the kernels run (and are tested) on a machine with
 * AVX-512: each must be a subset of what -march=native enables here. */
static const char *const isa_levels[] = {"x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"};

static mt_status parse_threads(const char *arg, const dev_open_opts *opts, int *threads,
                               mt_err *err)
{
    *threads = opts->threads;
    if (arg && *arg) {
        char *end = NULL;
        long t = strtol(arg, &end, 10);
        if (!end || *end || t < 1 || t > CPU_MAX_THREADS)
            return mt_fail(err, MT_E_INVALID,
                           "device 'cpu:%s': the thread count must be 1..%d", arg,
                           CPU_MAX_THREADS);
        *threads = (int)t;
    }
    if (*threads < 0 || *threads > CPU_MAX_THREADS)
        return mt_fail(err, MT_E_INVALID, "cpu device: %d threads (expected 1..%d)",
                       *threads, CPU_MAX_THREADS);
    return MT_OK;
}

static mt_status cpu_open(const char *arg, const dev_open_opts *opts, dev_props *props,
                          void **ctx_out, mt_err *err)
{
    *ctx_out = NULL;
    const char *level = NULL;
    if (opts->arch && *opts->arch && strcmp(opts->arch, "native") != 0) {
        for (size_t i = 0; i < sizeof isa_levels / sizeof *isa_levels; i++)
            if (!strcmp(opts->arch, isa_levels[i]))
                level = isa_levels[i];
        if (!level)
            return mt_fail(err, MT_E_INVALID,
                           "cpu device: --arch %s: the cpu backend compiles for this machine "
                           "(native) or a lower x86-64 level (x86-64, x86-64-v2, x86-64-v3, "
                           "x86-64-v4)", opts->arch);
        char why[256] = "";
        if (!cpu_host_march_ok(level, why, sizeof why))
            return mt_fail(err, MT_E_UNSUPPORTED, "cpu device: --arch %s: %s", level, why);
    }
    int threads = 0;
    mt_status st = parse_threads(arg, opts, &threads, err);
    if (st != MT_OK)
        return st;
    bool explicit_threads = threads > 0;
    if (!threads)
        threads = cpu_host_count();

    const char *prelude = dev_prelude_get("prelude_cpu.h");
    if (!prelude)
        return mt_fail(err, MT_E_INVALID, "cpu device: prelude_cpu.h is not embedded");
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return mt_fail(err, MT_E_NOMEM, "cpu device");
    c->prelude = prelude;
    snprintf(c->march, sizeof c->march, "-march=%s", level ? level : "native");
    /* AMX is the process's to ask for before any kernel can use it; where
     * the cpu has it and the OS refuses, native code is built without it. */
    cpu_amx amx = level ? CPU_AMX_NONE : cpu_host_amx();
    c->amx_off = amx == CPU_AMX_REFUSED;
    st = cpu_pool_create(threads, &c->pool, err);
    if (st != MT_OK) {
        free(c);
        return st;
    }

    memset(props, 0, sizeof *props);
    props->backend = DEV_BACKEND_CPU;
    if (explicit_threads)
        snprintf(props->spec, sizeof props->spec, "cpu:%d", threads);
    else
        snprintf(props->spec, sizeof props->spec, "cpu");
    if (level)
        snprintf(props->arch, sizeof props->arch, "%s", level);
    else
        cpu_host_arch(props->arch, sizeof props->arch);
    cpu_host_name(props->name, sizeof props->name);
    /* The page touch ahead of the kernels' weight streams: on for AMD (on
     * the Zen 5 VM it took decode from 0.97-1.03 to 1.12-1.28 of a plain
     * read), off elsewhere (on an Intel Xeon decode ran 8-11 % faster
     * without it); MOETUNE_CPU_PAGE_TOUCH=0|1 decides instead. */
    const char *pt = getenv("MOETUNE_CPU_PAGE_TOUCH");
    props->cpu_page_touch = pt && (!strcmp(pt, "0") || !strcmp(pt, "1"))
                                ? pt[0] == '1'
                                : strstr(props->name, "AMD") != NULL;
    snprintf(c->page_touch, sizeof c->page_touch, "-DMT_CPU_PAGE_TOUCH=%d",
             props->cpu_page_touch ? 1 : 0);
    snprintf(props->runtime_version, sizeof props->runtime_version, "%.63s",
             dev_host_cc_id());
    snprintf(props->driver_version, sizeof props->driver_version, "libffi");
    props->compute_units = threads;
    props->warp_size = 1;
    props->max_threads_per_block = 1;
    props->shared_mem_per_block = 0;
    props->llc_bytes = cpu_host_llc_bytes(NULL, NULL);
    props->mem_bytes = cpu_host_mem_bytes();
    props->max_vgprs = 0;
    props->compile_only = false;
    props->cpu_amx = amx == CPU_AMX_USABLE;
    /* The cache key holds the arch, but -march is spelled out here too: two
     * machines share a cache only when the compiler targets both the same
     * way. */
    char native[32];
    cpu_host_arch(native, sizeof native);
    snprintf(c->compiler_id, sizeof c->compiler_id, "%s -O3 %s%s %s -std=gnu11 [native=%s] %s",
             dev_host_cc_id(), c->march, c->amx_off ? " -mno-amx-tile -mno-amx-bf16 -mno-amx-int8" : "",
             c->page_touch, native, DEV_HOST_CC_OUTPUT);
    *ctx_out = c;
    return MT_OK;
}

static void cpu_close(void *ctx)
{
    cpu_ctx *c = ctx;
    if (!c)
        return;
    cpu_pool_destroy(c->pool);
    free(c);
}

static const char *cpu_compiler_id(void *ctx) { return ((cpu_ctx *)ctx)->compiler_id; }
static const char *cpu_prelude(void *ctx) { return ((cpu_ctx *)ctx)->prelude; }

static mt_status cpu_compile(void *ctx, const dev_props *props, const dev_compile_req *req,
                             void **bytes, size_t *len, char **log, dev_code_info *info,
                             mt_err *err)
{
    (void)props;
    cpu_ctx *c = ctx;
    *bytes = NULL;
    *len = 0;
    *log = NULL;
    info->n_kernels = 0;
    const char *name = req->name ? req->name : "kernel.c";
    const char *const fixed[] = {"-O3", c->march, "-std=gnu11", c->page_touch,
                                 "-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8"};
    const int n_fixed = c->amx_off ? 7 : 4;
    dev_compile_args a;
    mt_status st = dev_compile_args_build(req, name, "prelude_cpu.h", c->prelude, fixed,
                                          n_fixed, 64, &a, err);
    if (st != MT_OK)
        return st;
    st = dev_host_cc(a.text, a.opts, a.n_opts, bytes, len, log, err);
    if (st != MT_OK)
        mt_err_prefix(err, "compiling %s", name);
    dev_compile_args_release(&a);
    return st;
}

static mt_status cpu_module_load(void *ctx, const void *bytes, size_t len, void **out,
                                 mt_err *err)
{
    (void)ctx;
    *out = NULL;
    cpu_module *m = calloc(1, sizeof *m);
    if (!m)
        return mt_fail(err, MT_E_NOMEM, "cpu module");
    mt_status st = dev_host_dlopen(bytes, len, &m->dl, err);
    if (st != MT_OK) {
        free(m);
        return st;
    }
    dlerror();
    m->set_item = (set_item_fn)(uintptr_t)dlsym(m->dl, "mt__set_item");
    if (!m->set_item) {
        dev_host_dlclose(m->dl);
        free(m);
        return mt_fail(err, MT_E_FORMAT,
                       "cpu module has no mt__set_item: it was not compiled with "
                       "prelude_cpu.h");
    }
    *out = m;
    return MT_OK;
}

static void cpu_module_unload(void *ctx, void *mod)
{
    (void)ctx;
    cpu_module *m = mod;
    if (!m)
        return;
    for (cpu_kernel *k = m->kernels, *next; k; k = next) {
        next = k->next;
        free(k);
    }
    dev_host_dlclose(m->dl);
    free(m);
}

static ffi_type *arg_type(char letter)
{
    switch (letter) {
    case 'p': return &ffi_type_pointer;
    case 'i': return &ffi_type_sint32;
    case 'u': return &ffi_type_uint32;
    case 'l': return &ffi_type_sint64;
    case 'f': return &ffi_type_float;
    case 'd': return &ffi_type_double;
    default: return NULL;
    }
}

static mt_status cpu_get_kernel(void *ctx, void *mod, const char *name, const char *sig,
                                void **out, mt_err *err)
{
    (void)ctx;
    cpu_module *m = mod;
    *out = NULL;
    size_t n_args = strlen(sig);
    if (n_args > CPU_MAX_ARGS)
        return mt_fail(err, MT_E_INVALID, "kernel %s: %zu arguments (at most %d)", name,
                       n_args, CPU_MAX_ARGS);
    dlerror();
    void *sym = dlsym(m->dl, name);
    if (!sym)
        return mt_fail(err, MT_E_NOT_FOUND, "kernel %s not found in the module (is it "
                       "declared MT_CPU_KERNEL?)", name);
    mt_status st = dev_host_check_sig(m->dl, name, sig, err);
    if (st != MT_OK)
        return st;
    cpu_kernel *k = calloc(1, sizeof *k);
    if (!k)
        return mt_fail(err, MT_E_NOMEM, "kernel %s", name);
    for (size_t i = 0; i < n_args; i++) {
        k->types[i] = arg_type(sig[i]);
        if (!k->types[i]) {
            free(k);
            return mt_fail(err, MT_E_INVALID, "kernel %s: bad signature letter '%c' in "
                           "'%s' (p i u l f d)", name, sig[i], sig);
        }
    }
    k->n_args = (int)n_args;
    memcpy(k->sig, sig, n_args + 1);
#ifdef CPU_REG_CALL
    size_t n_float = 0;
    for (size_t i = 0; i < n_args; i++)
        n_float += sig[i] == 'f' || sig[i] == 'd';
    k->reg_call = n_args - n_float <= REG_INTS && n_float <= REG_FLOATS;
#endif
    k->fn = (void (*)(void))(uintptr_t)sym;
    k->set_item = m->set_item;
    ffi_status fs = ffi_prep_cif(&k->cif, FFI_DEFAULT_ABI, (unsigned)n_args,
                                 &ffi_type_void, k->types);
    if (fs != FFI_OK) {
        free(k);
        return mt_fail(err, MT_E_INVALID, "kernel %s: libffi rejected signature '%s' "
                       "(ffi_prep_cif returned %d)", name, sig, (int)fs);
    }
    k->next = m->kernels;
    m->kernels = k;
    *out = k;
    return MT_OK;
}

static void run_item(void *arg, uint64_t i)
{
    const cpu_job *j = arg;
    unsigned x = (unsigned)(i % j->gx);
    uint64_t rest = i / j->gx;
    unsigned y = (unsigned)(rest % j->gy);
    unsigned z = (unsigned)(rest / j->gy);
    j->set_item(x, y, z, j->gx, j->gy, j->gz);
    ffi_call((ffi_cif *)&j->k->cif, j->k->fn, NULL, j->args);
}

#ifdef CPU_REG_CALL
static void run_item_reg(void *arg, uint64_t i)
{
    const cpu_job *j = arg;
    unsigned x = (unsigned)(i % j->gx);
    uint64_t rest = i / j->gx;
    unsigned y = (unsigned)(rest % j->gy);
    unsigned z = (unsigned)(rest / j->gy);
    j->set_item(x, y, z, j->gx, j->gy, j->gz);
    const int64_t *a = j->ints;
    const double *f = j->floats;
    ((reg_fn)(uintptr_t)j->k->fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
                                  a[10], a[11], a[12], a[13], a[14], a[15], f[0], f[1], f[2],
                                  f[3], f[4], f[5], f[6], f[7]);
}

/* Loads the argument values into register order once per launch. A float
 * travels in the low 32 bits of its SSE register. */
static void marshal_regs(cpu_job *j, const char *sig)
{
    int ni = 0, nf = 0;
    memset(j->ints, 0, sizeof j->ints);
    memset(j->floats, 0, sizeof j->floats);
    for (int i = 0; sig[i]; i++) {
        const void *v = j->args[i];
        switch (sig[i]) {
        case 'p': j->ints[ni++] = (int64_t)(uintptr_t) * (void *const *)v; break;
        case 'i': j->ints[ni++] = *(const int32_t *)v; break;
        case 'u': j->ints[ni++] = *(const uint32_t *)v; break;
        case 'l': j->ints[ni++] = *(const int64_t *)v; break;
        case 'd': memcpy(&j->floats[nf++], v, sizeof(double)); break;
        case 'f': memcpy(&j->floats[nf++], v, sizeof(float)); break;
        }
    }
}
#endif

static mt_status cpu_launch(void *ctx, void *kern, const char *kname, const char *sig,
                            dev_dim3 grid, dev_dim3 block, size_t dyn_shared, void **args,
                            mt_err *err)
{
    (void)block;
    (void)sig; /* the kernel keeps its own copy */
    cpu_ctx *c = ctx;
    cpu_kernel *k = kern;
    if (dyn_shared)
        return mt_fail(err, MT_E_LAUNCH, "kernel %s: the cpu backend has no shared "
                       "memory (asked for %zu bytes)", kname, dyn_shared);
    if (k->n_args && !args)
        return mt_fail(err, MT_E_INVALID, "kernel %s: %d arguments expected, args is "
                       "NULL", kname, k->n_args);
    for (int i = 0; i < k->n_args; i++)
        if (!args[i])
            return mt_fail(err, MT_E_INVALID, "kernel %s: argument %d is NULL", kname, i);
    cpu_job job = {.k = k, .set_item = k->set_item, .args = args,
                   .gx = grid.x, .gy = grid.y, .gz = grid.z};
    cpu_pool_fn run = run_item;
#ifdef CPU_REG_CALL
    if (k->reg_call) {
        marshal_regs(&job, k->sig);
        run = run_item_reg;
    }
#endif
    cpu_pool_run(c->pool, run, &job, (uint64_t)grid.x * grid.y * grid.z);
    return MT_OK;
}

static mt_status cpu_synchronize(void *ctx, mt_err *err)
{
    (void)ctx;
    (void)err;
    return MT_OK; /* launches are synchronous */
}

static mt_status cpu_alloc(void *ctx, size_t bytes, void **ptr, mt_err *err)
{
    (void)ctx;
    size_t align = bytes >= CPU_HUGE ? CPU_HUGE : CPU_ALIGN;
    size_t rounded = (bytes + align - 1) / align * align;
    if (rounded < bytes || !(*ptr = aligned_alloc(align, rounded)))
        return mt_fail(err, MT_E_NOMEM, "cpu device: allocating %zu bytes", bytes);
#ifdef MADV_HUGEPAGE
    if (align == CPU_HUGE)
        (void)madvise(*ptr, rounded, MADV_HUGEPAGE); /* a hint: refusal changes nothing */
#endif
    return MT_OK;
}

static void cpu_free(void *ctx, void *ptr)
{
    (void)ctx;
    free(ptr);
}

static mt_status cpu_copy(void *ctx, void *dst, const void *src, size_t bytes, int kind,
                          mt_err *err)
{
    (void)ctx;
    (void)kind;
    if (!dst || !src)
        return mt_fail(err, MT_E_INVALID, "cpu copy of %zu bytes with a NULL pointer",
                       bytes);
    memmove(dst, src, bytes);
    return MT_OK;
}

static mt_status cpu_memset(void *ctx, void *dst, int byte, size_t bytes, mt_err *err)
{
    (void)ctx;
    if (!dst)
        return mt_fail(err, MT_E_INVALID, "cpu memset of %zu bytes at NULL", bytes);
    memset(dst, byte, bytes);
    return MT_OK;
}

const dev_backend_ops dev_cpu_ops = {
    .name = "cpu",
    .open = cpu_open,
    .close = cpu_close,
    .compile = cpu_compile,
    .inspect = NULL,
    .compiler_id = cpu_compiler_id,
    .prelude = cpu_prelude,
    .module_load = cpu_module_load,
    .module_unload = cpu_module_unload,
    .get_kernel = cpu_get_kernel,
    .launch = cpu_launch,
    .set_timeout = NULL,
    .synchronize = cpu_synchronize,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memset = cpu_memset,
    .event_create = NULL,
    .event_destroy = NULL,
    .event_record = NULL,
    .event_elapsed = NULL,
};
