/* emu.c: the emu backend's table (dev_emu_ops). HIP kernel sources are
 * compiled by the host C compiler together with prelude_emu.h into a shared
 * object; launches run on the emulator in emu_exec.c. Specs: "emu" and
 * "emu:wave64" (64-lane warps), "emu:wave32". Environment:
 * MOETUNE_EMU_STACK_KIB (fiber stack, default 128), MOETUNE_EMU_SEED (thread
 * orders between barriers). See docs/EMU.md. */
#define _GNU_SOURCE
#include "emu_impl.h"

#include <dlfcn.h>
#include <elf.h>
#include <ffi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/cpu_host.h"

#define EMU_MAX_ARGS 32
#define EMU_DEFAULT_STACK_KIB 128

typedef struct emu_dev {
    emu_mem mem;
    emu_exec *x;
    int warp_size;
    char *prelude;
    bool debug_info; /* kernels compiled with -g (emu_debug_info) */
    char compiler_id[512];
} emu_dev;

typedef struct emu_kern {
    struct emu_kern *next;
    char *name;
    char sig[EMU_MAX_ARGS + 1];
    ffi_cif cif;
    ffi_type *types[EMU_MAX_ARGS];
    emu_kernel_call call;
} emu_kern;

typedef struct emu_mod {
    void *dl;
    void *(*anchor)(void);
    size_t tls_bytes;
    emu_kern *kernels;
} emu_mod;

/* Kernel text is C for gcc, not ours: no -Werror, but the warnings that
 * point at real kernel bugs stay in the log. No -g (emu_debug_info). */
static const char *const cc_flags[] = {
    "-O1", "-std=gnu11", "-fno-strict-aliasing", "-fvisibility=hidden",
    "-fstack-clash-protection", "-fno-omit-frame-pointer", "-Wall",
    "-Wno-unused-function", "-Wno-unused-variable", "-Wno-unused-but-set-variable",
#ifdef MOETUNE_ASAN
    /* kernels' private arrays get redzones too; the fibers tell ASan about
     * every stack switch, so this works in the sanitizer build */
    "-fsanitize=address",
#endif
};
#define N_CC_FLAGS ((int)(sizeof cc_flags / sizeof cc_flags[0]))

/* Kernels carry debug info (-g: kernel lines in gdb and in the sanitizers'
 * reports) in the sanitizer build and with MOETUNE_EMU_DEBUG=1; otherwise
 * not: -g cost about 16% of the compile time of a kernel (60 MMA kernels,
 * 18.3 s against 15.3), and tests and tuning compile thousands. */
static bool emu_debug_info(void)
{
#ifdef MOETUNE_ASAN
    return true;
#else
    const char *v = getenv("MOETUNE_EMU_DEBUG");
    return v && *v && strcmp(v, "0") != 0;
#endif
}

/* ---- open ------------------------------------------------------------- */

static mt_status parse_arg(const char *arg, int *warp, mt_err *err)
{
    *warp = 64;
    if (!arg || !*arg || !strcmp(arg, "wave64"))
        return MT_OK;
    if (!strcmp(arg, "wave32")) {
        *warp = 32;
        return MT_OK;
    }
    return mt_fail(err, MT_E_INVALID, "device 'emu:%s': unknown option (expected "
                   "emu, emu:wave64 or emu:wave32)", arg);
}

static size_t env_size(const char *name, size_t dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end = NULL;
    unsigned long long n = strtoull(v, &end, 0);
    return end && *end == 0 && n > 0 ? (size_t)n : dflt;
}

static void emu_close(void *ctx);

static mt_status emu_open(const char *arg, const dev_open_opts *opts, dev_props *props,
                          void **ctx, mt_err *err)
{
    *ctx = NULL;
    int warp = 64;
    mt_status st = parse_arg(arg, &warp, err);
    if (st != MT_OK)
        return st;
    const char *pe = dev_prelude_get("prelude_emu.h");
    const char *pg = dev_prelude_get("prelude_gpu.h");
    if (!pe || !pg)
        return mt_fail(err, MT_E_DEVICE, "emu: the build embedded no prelude_%s.h",
                       pe ? "gpu" : "emu");
    emu_dev *d = calloc(1, sizeof *d);
    if (!d)
        return mt_fail(err, MT_E_NOMEM, "emu: out of memory");
    emu_mem_init(&d->mem);
    d->warp_size = warp;
    size_t lp = strlen(pe), lg = strlen(pg);
    d->prelude = malloc(lp + lg + 1);
    if (!d->prelude) {
        emu_close(d);
        return mt_fail(err, MT_E_NOMEM, "emu: out of memory");
    }
    memcpy(d->prelude, pe, lp);
    memcpy(d->prelude + lp, pg, lg + 1);

    int n = snprintf(d->compiler_id, sizeof d->compiler_id, "emu abi %d; %s; %s;",
                     MT_EMU_ABI, dev_host_cc_id(), DEV_HOST_CC_OUTPUT);
    for (int i = 0; i < N_CC_FLAGS && n > 0 && (size_t)n < sizeof d->compiler_id; i++)
        n += snprintf(d->compiler_id + n, sizeof d->compiler_id - (size_t)n, " %s",
                      cc_flags[i]);
    d->debug_info = emu_debug_info();
    if (d->debug_info && n > 0 && (size_t)n < sizeof d->compiler_id)
        snprintf(d->compiler_id + n, sizeof d->compiler_id - (size_t)n, " -g");

    int threads = opts && opts->threads > 0 ? opts->threads : cpu_host_count();
    emu_exec_opts xo = {
        .threads = threads,
        .warp_size = warp,
        .stack_bytes = env_size("MOETUNE_EMU_STACK_KIB", EMU_DEFAULT_STACK_KIB) * 1024,
        .seed = env_size("MOETUNE_EMU_SEED", 0x6d6f6574756e65ull),
        .mem = &d->mem,
    };
    st = emu_exec_create(&xo, &d->x, err);
    if (st != MT_OK) {
        emu_close(d);
        return st;
    }

    memset(props, 0, sizeof *props);
    props->backend = DEV_BACKEND_EMU;
    snprintf(props->spec, sizeof props->spec, "emu:wave%d", warp);
    snprintf(props->arch, sizeof props->arch, "emu%d", warp);
    snprintf(props->name, sizeof props->name, "moetune emulator (wave%d)", warp);
    snprintf(props->runtime_version, sizeof props->runtime_version, "emu abi %d, %s",
             MT_EMU_ABI, emu_ctx_kind());
    snprintf(props->driver_version, sizeof props->driver_version, "%.63s",
             dev_host_cc_id());
    props->compute_units = threads;
    props->warp_size = warp;
    props->max_threads_per_block = EMU_MAX_BLOCK_THREADS;
    props->shared_mem_per_block = EMU_SHARED_BYTES;
    props->llc_bytes = cpu_host_llc_bytes(NULL, NULL);
    props->mem_bytes = cpu_host_mem_bytes();
    props->max_vgprs = 0;
    props->compile_only = false;
    *ctx = d;
    return MT_OK;
}

static void emu_close(void *ctx)
{
    emu_dev *d = ctx;
    if (!d)
        return;
    emu_exec_destroy(d->x);
    emu_mem_destroy(&d->mem);
    free(d->prelude);
    free(d);
}

/* ---- code objects ------------------------------------------------------ */

/* Kernel names and the thread-local (static shared) size of an emu code
 * object, from its ELF dynamic symbols and program headers. */
static mt_status elf_scan(const void *bytes, size_t len, dev_code_info *info,
                          size_t *tls_bytes, mt_err *err)
{
    const unsigned char *b = bytes;
    const Elf64_Ehdr *eh = bytes;
    if (len < sizeof *eh || memcmp(b, ELFMAG, SELFMAG) != 0 ||
        b[EI_CLASS] != ELFCLASS64)
        return mt_fail(err, MT_E_FORMAT, "emu: code object is not a 64-bit ELF file");
    if (eh->e_phoff > len || eh->e_shoff > len ||
        (size_t)eh->e_phnum * sizeof(Elf64_Phdr) > len - eh->e_phoff ||
        (size_t)eh->e_shnum * sizeof(Elf64_Shdr) > len - eh->e_shoff)
        return mt_fail(err, MT_E_FORMAT, "emu: code object's ELF headers are truncated");
    size_t tls = 0;
    const Elf64_Phdr *ph = (const Elf64_Phdr *)(b + eh->e_phoff);
    for (int i = 0; i < eh->e_phnum; i++)
        if (ph[i].p_type == PT_TLS)
            tls = ph[i].p_memsz;
    if (tls_bytes)
        *tls_bytes = tls;
    if (!info)
        return MT_OK;
    int64_t lds = tls > 16 ? (int64_t)tls - 16 : 0; /* less the runtime's anchor */
    info->n_kernels = 0;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(b + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_DYNSYM || sh[i].sh_link >= eh->e_shnum)
            continue;
        const Elf64_Shdr *strs = &sh[sh[i].sh_link];
        if (sh[i].sh_offset > len || sh[i].sh_size > len - sh[i].sh_offset ||
            strs->sh_offset > len || strs->sh_size > len - strs->sh_offset)
            return mt_fail(err, MT_E_FORMAT, "emu: code object's symbol table is truncated");
        const Elf64_Sym *sym = (const Elf64_Sym *)(b + sh[i].sh_offset);
        size_t n = sh[i].sh_size / sizeof *sym;
        const char *str = (const char *)b + strs->sh_offset;
        for (size_t s = 0; s < n; s++) {
            if (ELF64_ST_TYPE(sym[s].st_info) != STT_FUNC || sym[s].st_shndx == SHN_UNDEF ||
                ELF64_ST_BIND(sym[s].st_info) != STB_GLOBAL ||
                sym[s].st_name >= strs->sh_size)
                continue;
            const char *name = str + sym[s].st_name;
            if (!strncmp(name, "mt__", 4) || strnlen(name, strs->sh_size - sym[s].st_name) ==
                                                 strs->sh_size - sym[s].st_name)
                continue;
            if (info->n_kernels == DEV_MAX_KERNELS_PER_CODE)
                break;
            dev_kernel_res *r = &info->kernels[info->n_kernels++];
            memset(r, 0, sizeof *r);
            snprintf(r->name, sizeof r->name, "%s", name);
            r->vgprs = r->sgprs = r->agprs = -1;
            r->spill_vgprs = r->spill_sgprs = -1;
            r->lds_bytes = lds; /* the module's total: gcc does not split it */
            r->private_bytes = -1;
            r->max_threads = -1;
            r->waves_per_simd = -1;
        }
    }
    return MT_OK;
}

static mt_status emu_inspect(void *ctx, const void *bytes, size_t len,
                             dev_code_info *info, mt_err *err)
{
    (void)ctx;
    return elf_scan(bytes, len, info, NULL, err);
}

static const char *emu_compiler_id(void *ctx) { return ((emu_dev *)ctx)->compiler_id; }
static const char *emu_prelude(void *ctx) { return ((emu_dev *)ctx)->prelude; }

static bool is_ident(const char *s)
{
    if (!s || !(*s == '_' || (*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z')))
        return false;
    for (; *s; s++)
        if (!(*s == '_' || (*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') ||
              (*s >= '0' && *s <= '9')))
            return false;
    return true;
}

/* A growing text buffer; on allocation failure it stays failed. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool bad;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->bad)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->bad = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Options gcc understands the way hipRTC does; the rest are GPU-only. */
static bool portable_option(const char *o)
{
    return !strncmp(o, "-D", 2) || !strncmp(o, "-U", 2) || !strncmp(o, "-I", 2) ||
           !strcmp(o, "-ffast-math") || !strncmp(o, "-W", 2) || !strcmp(o, "-w");
}

static mt_status emu_compile(void *ctx, const dev_props *props, const dev_compile_req *req,
                             void **bytes, size_t *len, char **log, dev_code_info *info,
                             mt_err *err)
{
    const char *name = req->name ? req->name : "kernel.hip";
    *bytes = NULL;
    *len = 0;
    if (log)
        *log = NULL;

    /* Defines go in as text ahead of everything, which is what -D does, and
     * has no limit on their number. */
    sbuf t = {0};
    sb_str(&t, "#define MT_EMU 1\n");
    /* The matrix fragments' layouts follow the wave size (prelude_emu.h). */
    sb_str(&t, props->warp_size == 32 ? "#define MT_EMU_WAVE 32\n"
                                      : "#define MT_EMU_WAVE 64\n");
    for (int i = 0; i < req->n_defines; i++) {
        const dev_define *df = &req->defines[i];
        if (!is_ident(df->name) || (df->value && strpbrk(df->value, "\r\n"))) {
            free(t.p);
            return mt_fail(err, MT_E_INVALID, "compile of '%s': define %d ('%s') is not "
                           "NAME or NAME=VALUE on one line", name, i,
                           df->name ? df->name : "(null)");
        }
        sb_str(&t, "#define ");
        sb_str(&t, df->name);
        sb_str(&t, " ");
        sb_str(&t, df->value ? df->value : "1");
        sb_str(&t, "\n");
    }
    sb_str(&t, "#line 1 \"prelude_emu.h\"\n");
    sb_str(&t, dev_prelude_get("prelude_emu.h"));
    sb_str(&t, "\n#line 1 \"prelude_gpu.h\"\n");
    sb_str(&t, dev_prelude_get("prelude_gpu.h"));
    sb_str(&t, "\n#line 1 \"");
    for (const char *c = name; *c; c++) {
        char ch = (*c == '"' || *c == '\\' || *c == '\n') ? '_' : *c;
        sb_put(&t, &ch, 1);
    }
    sb_str(&t, "\"\n");
    sb_str(&t, req->source);
    sb_str(&t, "\n");
    if (t.bad) {
        free(t.p);
        return mt_fail(err, MT_E_NOMEM, "compile of '%s': out of memory", name);
    }

    const char *flags[N_CC_FLAGS + 32];
    int nf = 0;
    for (int i = 0; i < N_CC_FLAGS; i++)
        flags[nf++] = cc_flags[i];
    if (((emu_dev *)ctx)->debug_info)
        flags[nf++] = "-g";
    for (int i = 0; i < req->n_options && nf < N_CC_FLAGS + 32; i++)
        if (req->options[i] && portable_option(req->options[i]))
            flags[nf++] = req->options[i];

    mt_status st = dev_host_cc(t.p, flags, nf, bytes, len, log, err);
    free(t.p);
    if (st != MT_OK) {
        mt_err_prefix(err, "emu: compiling '%s'", name);
        return st;
    }
    if (info) {
        mt_err ignore = MT_ERR_INIT;
        elf_scan(*bytes, *len, info, NULL, &ignore);
    }
    return MT_OK;
}

/* ---- modules and kernels ----------------------------------------------- */

static mt_status emu_module_load(void *ctx, const void *bytes, size_t len, void **out,
                                 mt_err *err)
{
    (void)ctx;
    *out = NULL;
    size_t tls = 0;
    mt_status st = elf_scan(bytes, len, NULL, &tls, err);
    if (st != MT_OK)
        return st;
    emu_mod *m = calloc(1, sizeof *m);
    if (!m)
        return mt_fail(err, MT_E_NOMEM, "emu: out of memory");
    st = dev_host_dlopen(bytes, len, &m->dl, err);
    if (st != MT_OK) {
        free(m);
        return st;
    }
    int (*bind)(const struct mt_emu_rt *) =
        (int (*)(const struct mt_emu_rt *))dlsym(m->dl, "mt__emu_bind");
    m->anchor = (void *(*)(void))dlsym(m->dl, "mt__emu_tls_anchor");
    if (!bind || !m->anchor) {
        dev_host_dlclose(m->dl);
        free(m);
        return mt_fail(err, MT_E_FORMAT, "emu: the code object was not built by the emu "
                       "backend (no mt__emu_bind)");
    }
    int abi = bind(emu_exec_rt());
    if (abi != MT_EMU_ABI) {
        dev_host_dlclose(m->dl);
        free(m);
        return mt_fail(err, MT_E_FORMAT, "emu: code object has runtime ABI %d, this "
                       "build has %d (recompile it)", abi, MT_EMU_ABI);
    }
    m->tls_bytes = tls;
    *out = m;
    return MT_OK;
}

static void emu_module_unload(void *ctx, void *mod)
{
    (void)ctx;
    emu_mod *m = mod;
    if (!m)
        return;
    for (emu_kern *k = m->kernels, *next; k; k = next) {
        next = k->next;
        free(k->name);
        free(k);
    }
    dev_host_dlclose(m->dl);
    free(m);
}

static mt_status emu_get_kernel(void *ctx, void *mod, const char *name, const char *sig,
                                void **out, mt_err *err)
{
    (void)ctx;
    emu_mod *m = mod;
    *out = NULL;
    if (!sig)
        sig = "";
    for (emu_kern *k = m->kernels; k; k = k->next) {
        if (!strcmp(k->name, name) && !strcmp(k->sig, sig)) {
            *out = k;
            return MT_OK;
        }
    }
    size_t na = strlen(sig);
    if (na > EMU_MAX_ARGS)
        return mt_fail(err, MT_E_INVALID, "emu: kernel '%s' has %zu arguments; at most %d",
                       name, na, EMU_MAX_ARGS);
    void (*fn)(void) = (void (*)(void))dlsym(m->dl, name);
    if (!fn || !strncmp(name, "mt__", 4))
        return mt_fail(err, MT_E_NOT_FOUND, "emu: no kernel '%s' in the module (is it "
                       "declared MT_KERNEL?)", name);
    mt_status st = dev_host_check_sig(m->dl, name, sig, err);
    if (st != MT_OK) {
        mt_err_prefix(err, "emu");
        return st;
    }
    emu_kern *k = calloc(1, sizeof *k);
    if (!k || !(k->name = strdup(name))) {
        free(k);
        return mt_fail(err, MT_E_NOMEM, "emu: out of memory");
    }
    memcpy(k->sig, sig, na + 1);
    for (size_t i = 0; i < na; i++) {
        switch (sig[i]) {
        case 'p': k->types[i] = &ffi_type_pointer; break;
        case 'i': k->types[i] = &ffi_type_sint32; break;
        case 'u': k->types[i] = &ffi_type_uint32; break;
        case 'l': k->types[i] = &ffi_type_sint64; break;
        case 'f': k->types[i] = &ffi_type_float; break;
        case 'd': k->types[i] = &ffi_type_double; break;
        default:
            free(k->name);
            free(k);
            return mt_fail(err, MT_E_INVALID, "emu: kernel '%s': signature '%s' has "
                           "unknown letter '%c' (expected p, i, u, l, f, d)", name, sig,
                           sig[i]);
        }
    }
    if (ffi_prep_cif(&k->cif, FFI_DEFAULT_ABI, (unsigned)na, &ffi_type_void, k->types) !=
        FFI_OK) {
        free(k->name);
        free(k);
        return mt_fail(err, MT_E_DEVICE, "emu: libffi rejected the signature '%s' of '%s'",
                       sig, name);
    }
    k->call.name = k->name;
    k->call.fn = fn;
    k->call.cif = &k->cif;
    k->call.tls_anchor = m->anchor;
    k->call.dl = m->dl;
    k->call.tls_bytes = m->tls_bytes;
    k->next = m->kernels;
    m->kernels = k;
    *out = k;
    return MT_OK;
}

static mt_status emu_launch(void *ctx, void *kern, const char *kname, const char *sig,
                            dev_dim3 grid, dev_dim3 block, size_t dyn_shared, void **args,
                            mt_err *err)
{
    (void)kname;
    (void)sig;
    emu_dev *d = ctx;
    emu_kern *k = kern;
    emu_kernel_call call = k->call;
    call.args = args;
    return emu_exec_launch(d->x, &call, grid, block, dyn_shared, err);
}

static void emu_set_timeout(void *ctx, unsigned ms)
{
    emu_exec_set_timeout(((emu_dev *)ctx)->x, ms);
}

static mt_status emu_synchronize(void *ctx, mt_err *err)
{
    (void)ctx;
    (void)err;
    return MT_OK; /* launches are synchronous */
}

/* ---- memory ------------------------------------------------------------- */

static mt_status emu_alloc(void *ctx, size_t bytes, void **ptr, mt_err *err)
{
    return emu_mem_alloc(&((emu_dev *)ctx)->mem, bytes, ptr, err);
}

static void emu_free(void *ctx, void *ptr) { emu_mem_free(&((emu_dev *)ctx)->mem, ptr); }

static mt_status emu_copy(void *ctx, void *dst, const void *src, size_t bytes, int kind,
                          mt_err *err)
{
    emu_dev *d = ctx;
    if (!bytes)
        return MT_OK;
    mt_status st = MT_OK;
    if (kind != 1 && (st = emu_mem_check(&d->mem, dst, bytes, "copy destination", err)))
        return st;
    if (kind != 0 && (st = emu_mem_check(&d->mem, src, bytes, "copy source", err)))
        return st;
    memmove(dst, src, bytes);
    return MT_OK;
}

static mt_status emu_memset(void *ctx, void *dst, int byte, size_t bytes, mt_err *err)
{
    emu_dev *d = ctx;
    if (!bytes)
        return MT_OK;
    mt_status st = emu_mem_check(&d->mem, dst, bytes, "memset", err);
    if (st != MT_OK)
        return st;
    memset(dst, byte, bytes);
    return MT_OK;
}

const dev_backend_ops dev_emu_ops = {
    .name = "emu",
    .open = emu_open,
    .close = emu_close,
    .compile = emu_compile,
    .inspect = emu_inspect,
    .compiler_id = emu_compiler_id,
    .prelude = emu_prelude,
    .module_load = emu_module_load,
    .module_unload = emu_module_unload,
    .get_kernel = emu_get_kernel,
    .launch = emu_launch,
    .set_timeout = emu_set_timeout,
    .synchronize = emu_synchronize,
    .alloc = emu_alloc,
    .free = emu_free,
    .copy = emu_copy,
    .memset = emu_memset,
    /* events: NULL, host-clock events in device.c (launches are synchronous) */
};
