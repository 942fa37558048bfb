/* device.c: the public device API (device.h): spec parsing, dispatch through
 * the backend tables, the on-disk compile cache, module kernel lookup and
 * host-clock events for backends whose launches are synchronous. */
#define _GNU_SOURCE
#include "device_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/files.h"
#include "common/sha256.h"

struct dev_device {
    const dev_backend_ops *ops;
    void *ctx;
    dev_props props;
    dev_copy_counts copies; /* host <-> device copies since open */
};

struct dev_code {
    void *bytes;
    size_t len;
    char *log;
    char *text; /* assembly text (ops->text_ext), or NULL */
    dev_code_info info;
};

#define MODULE_MAX_KERNELS 32

struct dev_kernel {
    char name[96];
    char sig[32];
    void *handle;
};

struct dev_module {
    dev_device *dev;
    void *handle;
    int n_kernels;
    struct dev_kernel kernels[MODULE_MAX_KERNELS];
};

struct dev_event {
    void *handle;   /* backend event, or NULL for host clock */
    uint64_t ns;    /* host clock reading */
};

static const char *const backend_names[DEV_BACKEND_COUNT] = {
    [DEV_BACKEND_CPU] = "cpu",
    [DEV_BACKEND_EMU] = "emu",
    [DEV_BACKEND_HIP] = "hip",
    [DEV_BACKEND_CUDA] = "cuda",
};

const char *dev_backend_name(dev_backend b)
{
    return (unsigned)b < DEV_BACKEND_COUNT ? backend_names[b] : "unknown";
}

static const dev_backend_ops *backend_ops(dev_backend b)
{
    switch (b) {
    case DEV_BACKEND_CPU:
        return &dev_cpu_ops;
    case DEV_BACKEND_EMU:
        return &dev_emu_ops;
    case DEV_BACKEND_HIP:
#ifdef MOETUNE_HAVE_HIP
        return &dev_hip_ops;
#else
        return NULL;
#endif
    case DEV_BACKEND_CUDA:
        return &dev_cuda_ops;
    default:
        return NULL;
    }
}

static void fingerprint(dev_props *p)
{
    mt_sha256 c;
    mt_sha256_init(&c);
    mt_sha256_update_str(&c, dev_backend_name(p->backend));
    mt_sha256_update_str(&c, p->arch);
    mt_sha256_update_str(&c, p->name);
    char cu[32];
    snprintf(cu, sizeof cu, "%d/%d", p->compute_units, p->warp_size);
    mt_sha256_update_str(&c, cu);
    mt_sha256_update_str(&c, p->runtime_version);
    mt_sha256_hex(&c, p->fingerprint);
}

static mt_status open_backend(dev_backend b, const char *arg, const char *spec,
                              const dev_open_opts *opts, dev_device **out,
                              mt_err *err)
{
    const dev_backend_ops *ops = backend_ops(b);
    if (!ops)
        return mt_fail(err, MT_E_UNSUPPORTED,
                       "device '%s': this build has no %s backend (ROCm not found "
                       "at build time)", spec, dev_backend_name(b));
    dev_device *d = calloc(1, sizeof *d);
    if (!d)
        return mt_fail(err, MT_E_NOMEM, "device '%s'", spec);
    d->ops = ops;
    dev_open_opts none = {0};
    mt_status st = ops->open(arg, opts ? opts : &none, &d->props, &d->ctx, err);
    if (st != MT_OK) {
        free(d);
        return st;
    }
    d->props.backend = b;
    if (!d->props.static_shared_per_block) /* the backend sets it where it differs */
        d->props.static_shared_per_block = d->props.shared_mem_per_block;
    if (!d->props.spec[0])
        snprintf(d->props.spec, sizeof d->props.spec, "%s", spec);
    fingerprint(&d->props);
    *out = d;
    return MT_OK;
}

mt_status dev_open(const char *spec, const dev_open_opts *opts, dev_device **out,
                   mt_err *err)
{
    *out = NULL;
    if (!spec || !*spec)
        spec = "auto";
    if (!strcmp(spec, "auto")) {
        /* A GPU if one is present, else the CPU. Compile-only devices are
         * never chosen automatically. */
        dev_open_opts o = opts ? *opts : (dev_open_opts){0};
        o.arch = NULL;
        static const dev_backend order[] = {DEV_BACKEND_HIP, DEV_BACKEND_CUDA};
        for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
            if (!backend_ops(order[i]))
                continue;
            if (open_backend(order[i], "", dev_backend_name(order[i]), &o, out,
                             NULL) == MT_OK)
                return MT_OK;
        }
        return open_backend(DEV_BACKEND_CPU, "", "cpu", opts, out, err);
    }
    char name[32];
    const char *colon = strchr(spec, ':');
    size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
    if (n >= sizeof name)
        return mt_fail(err, MT_E_INVALID, "unknown device '%s'", spec);
    memcpy(name, spec, n);
    name[n] = 0;
    const char *arg = colon ? colon + 1 : "";
    for (int b = 0; b < DEV_BACKEND_COUNT; b++)
        if (!strcmp(name, backend_names[b]))
            return open_backend((dev_backend)b, arg, spec, opts, out, err);
    return mt_fail(err, MT_E_INVALID,
                   "unknown device '%s' (expected auto, cpu[:threads], "
                   "emu[:wave32|wave64], hip[:N], cuda[:N])", spec);
}

void dev_close(dev_device *d)
{
    if (!d)
        return;
    d->ops->close(d->ctx);
    free(d);
}

const dev_props *dev_get_props(const dev_device *d) { return &d->props; }

int dev_list(char specs[][32], int cap)
{
    int n = 0;
    const char *always[] = {"cpu", "emu", "emu:wave32"};
    for (size_t i = 0; i < sizeof always / sizeof always[0]; i++) {
        if (n < cap)
            snprintf(specs[n], 32, "%s", always[i]);
        n++;
    }
    static const dev_backend gpus[] = {DEV_BACKEND_HIP, DEV_BACKEND_CUDA};
    for (size_t i = 0; i < sizeof gpus / sizeof gpus[0]; i++) {
        dev_device *d = NULL;
        if (!backend_ops(gpus[i]))
            continue;
        if (open_backend(gpus[i], "", dev_backend_name(gpus[i]), NULL, &d, NULL) ==
            MT_OK) {
            if (n < cap)
                snprintf(specs[n], 32, "%s", d->props.spec);
            n++;
            dev_close(d);
        }
    }
    return n;
}

/* ---- compilation and the compile cache --------------------------------- */

static void cache_key(dev_device *d, const dev_compile_req *req, char key[65])
{
    mt_sha256 c;
    mt_sha256_init(&c);
    mt_sha256_update_str(&c, "moetune-compile-cache-v1");
    mt_sha256_update_str(&c, d->ops->name);
    mt_sha256_update_str(&c, d->props.arch);
    mt_sha256_update_str(&c, d->ops->compiler_id(d->ctx));
    mt_sha256_update_str(&c, d->ops->prelude(d->ctx));
    mt_sha256_update_str(&c, req->name);
    mt_sha256_update_str(&c, req->source);
    for (int i = 0; i < req->n_defines; i++) {
        mt_sha256_update_str(&c, req->defines[i].name);
        mt_sha256_update_str(&c, req->defines[i].value ? req->defines[i].value : "\1");
    }
    for (int i = 0; i < req->n_options; i++)
        mt_sha256_update_str(&c, req->options[i]);
    mt_sha256_hex(&c, key);
}

static void cache_path(dev_device *d, const char *key, char *out, size_t cap)
{
    char dir[2048];
    mt_cache_dir(dir, sizeof dir);
    snprintf(out, cap, "%s/%s/%.2s/%s.bin", dir, d->ops->name, key, key);
}

static mt_status cache_get(dev_device *d, const char *key, void **bytes, size_t *len)
{
    char path[4096];
    cache_path(d, key, path, sizeof path);
    char *data = NULL;
    if (access(path, R_OK) != 0)
        return MT_E_NOT_FOUND;
    if (mt_file_read(path, &data, len, NULL) != MT_OK)
        return MT_E_NOT_FOUND;
    *bytes = data;
    return MT_OK;
}

/* Path of the assembly text kept beside the code object: <key>.<ext>. */
static void cache_text_path(dev_device *d, const char *key, char *out, size_t cap)
{
    char dir[2048];
    mt_cache_dir(dir, sizeof dir);
    snprintf(out, cap, "%s/%s/%.2s/%s.%s", dir, d->ops->name, key, key, d->ops->text_ext);
}

static void cache_put(dev_device *d, const char *key, const void *bytes, size_t len,
                      const dev_code_info *info, const char *text)
{
    char path[4096];
    cache_path(d, key, path, sizeof path);
    char *slash = strrchr(path, '/');
    *slash = 0;
    if (mt_mkdirs(path, NULL) != MT_OK)
        return; /* an unwritable cache only costs recompiles */
    *slash = '/';
    /* The compiler's resource report sits beside the code object, for
     * backends that cannot read it back from the bytes (cuda's ptxas log).
     * Written first: a reader that finds the .bin finds its .info. */
    char ipath[4200];
    snprintf(ipath, sizeof ipath, "%s.info", path);
    mt_file_write_atomic(ipath, info, sizeof *info, NULL);
    if (text && d->ops->text_ext) {
        char tpath[4200];
        cache_text_path(d, key, tpath, sizeof tpath);
        mt_file_write_atomic(tpath, text, strlen(text), NULL);
    }
    mt_file_write_atomic(path, bytes, len, NULL);
}

/* Resource report stored beside a cached code object, if any. */
static void cache_get_info(dev_device *d, const char *key, dev_code_info *info)
{
    char path[4096], ipath[4200];
    cache_path(d, key, path, sizeof path);
    snprintf(ipath, sizeof ipath, "%s.info", path);
    char *data = NULL;
    size_t len = 0;
    if (mt_file_read(ipath, &data, &len, NULL) != MT_OK)
        return;
    if (len == sizeof *info) {
        dev_code_info stored;
        memcpy(&stored, data, sizeof stored);
        if (stored.n_kernels >= 0 && stored.n_kernels <= DEV_MAX_KERNELS_PER_CODE) {
            info->n_kernels = stored.n_kernels;
            memcpy(info->kernels, stored.kernels, sizeof info->kernels);
        }
    }
    free(data);
}

static bool cache_disabled(void)
{
    const char *v = getenv("MOETUNE_NO_CACHE");
    return v && *v && strcmp(v, "0") != 0;
}

/* The cached code object for c->info.key into c (bytes, resources, text):
 * false when there is none. */
static bool cache_load(dev_device *d, dev_code *c)
{
    if (cache_get(d, c->info.key, &c->bytes, &c->len) != MT_OK)
        return false;
    c->info.cache_hit = true;
    if (!d->ops->inspect || d->ops->inspect(d->ctx, c->bytes, c->len, &c->info, NULL) != MT_OK ||
        c->info.n_kernels == 0)
        cache_get_info(d, c->info.key, &c->info);
    if (d->ops->text_ext) {
        char tpath[4200];
        size_t tlen = 0;
        cache_text_path(d, c->info.key, tpath, sizeof tpath);
        if (mt_file_read(tpath, &c->text, &tlen, NULL) != MT_OK)
            c->text = NULL; /* a cache entry from before texts were kept */
    }
    return true;
}

/* Compiles of one key wait for each other, across threads and processes
 * sharing the cache (ctest -j, expert-parallel ranks, tuner shards): the
 * second finds the first's result in the cache instead of compiling it
 * again. An exclusive flock on one of 4096 lock files (<cache>/<backend>/
 * locks/, by the key's first three hex digits): two different keys share
 * one about once in 4096. -1 when no lock could be taken (an unwritable
 * cache): compile without. */
static int compile_lock(dev_device *d, const char *key)
{
    char path[4096];
    mt_cache_dir(path, sizeof path);
    size_t n = strlen(path);
    if (snprintf(path + n, sizeof path - n, "/%s/locks", d->ops->name) >= (int)(sizeof path - n) ||
        mt_mkdirs(path, NULL) != MT_OK)
        return -1;
    n = strlen(path);
    if (snprintf(path + n, sizeof path - n, "/%.3s", key) >= (int)(sizeof path - n))
        return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    while (flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) {
            close(fd);
            return -1;
        }
    return fd;
}

/* LOCK_UN first: a child forked meanwhile shares the open file, and close
 * alone would leave the lock held until it exits. */
static void compile_unlock(int fd)
{
    if (fd < 0)
        return;
    flock(fd, LOCK_UN);
    close(fd);
}

mt_status dev_compile(dev_device *d, const dev_compile_req *req, dev_code **out,
                      mt_err *err)
{
    *out = NULL;
    if (!req->source)
        return mt_fail(err, MT_E_INVALID, "compile of '%s': no source text",
                       req->name ? req->name : "?");
    dev_code *c = calloc(1, sizeof *c);
    if (!c)
        return mt_fail(err, MT_E_NOMEM, "compile of '%s'", req->name);
    cache_key(d, req, c->info.key);
    bool use_cache = !req->no_cache && !cache_disabled();
    if (use_cache && cache_load(d, c)) {
        *out = c;
        return MT_OK;
    }
    int lock = use_cache ? compile_lock(d, c->info.key) : -1;
    if (lock >= 0 && cache_load(d, c)) { /* compiled while this one waited */
        compile_unlock(lock);
        *out = c;
        return MT_OK;
    }
    uint64_t t0 = mt_now_ns();
    mt_status st = d->ops->compile_text
                       ? d->ops->compile_text(d->ctx, &d->props, req, &c->bytes, &c->len,
                                              &c->log, &c->text, &c->info, err)
                       : d->ops->compile(d->ctx, &d->props, req, &c->bytes, &c->len,
                                         &c->log, &c->info, err);
    c->info.compile_ms = (double)(mt_now_ns() - t0) * 1e-6;
    if (st != MT_OK) {
        compile_unlock(lock);
        dev_code_free(c);
        return st;
    }
    if (use_cache)
        cache_put(d, c->info.key, c->bytes, c->len, &c->info, c->text);
    compile_unlock(lock);
    *out = c;
    return MT_OK;
}

const dev_code_info *dev_code_get_info(const dev_code *c) { return &c->info; }
const char *dev_code_get_log(const dev_code *c) { return c->log ? c->log : ""; }
const char *dev_code_get_text(const dev_code *c) { return c->text; }

const void *dev_code_get_bytes(const dev_code *c, size_t *len)
{
    *len = c->len;
    return c->bytes;
}

mt_status dev_code_from_bytes(dev_device *d, const void *bytes, size_t len,
                              dev_code **out, mt_err *err)
{
    *out = NULL;
    dev_code *c = calloc(1, sizeof *c);
    if (!c || !(c->bytes = malloc(len ? len : 1))) {
        free(c);
        return mt_fail(err, MT_E_NOMEM, "code object of %zu bytes", len);
    }
    memcpy(c->bytes, bytes, len);
    c->len = len;
    c->info.cache_hit = true;
    mt_sha256_hex_of(bytes, len, c->info.key);
    if (d->ops->inspect) {
        mt_status st = d->ops->inspect(d->ctx, bytes, len, &c->info, err);
        if (st != MT_OK) {
            dev_code_free(c);
            return st;
        }
    }
    *out = c;
    return MT_OK;
}

void dev_code_free(dev_code *c)
{
    if (!c)
        return;
    free(c->bytes);
    free(c->log);
    free(c->text);
    free(c);
}

/* ---- modules and launches ----------------------------------------------- */

mt_status dev_module_load(dev_device *d, const dev_code *c, dev_module **out,
                          mt_err *err)
{
    *out = NULL;
    if (d->props.compile_only)
        return mt_fail(err, MT_E_UNSUPPORTED,
                       "device %s is compile-only (no GPU): cannot load modules",
                       d->props.spec);
    dev_module *m = calloc(1, sizeof *m);
    if (!m)
        return mt_fail(err, MT_E_NOMEM, "module");
    m->dev = d;
    mt_status st = d->ops->module_load(d->ctx, c->bytes, c->len, &m->handle, err);
    if (st != MT_OK) {
        free(m);
        return st;
    }
    *out = m;
    return MT_OK;
}

void dev_module_unload(dev_module *m)
{
    if (!m)
        return;
    m->dev->ops->module_unload(m->dev->ctx, m->handle);
    free(m);
}

mt_status dev_module_get_kernel(dev_module *m, const char *name, const char *sig,
                                dev_kernel **out, mt_err *err)
{
    *out = NULL;
    for (int i = 0; i < m->n_kernels; i++)
        if (!strcmp(m->kernels[i].name, name)) {
            if (strcmp(m->kernels[i].sig, sig))
                return mt_fail(err, MT_E_INVALID,
                               "kernel %s asked for with signature '%s' and '%s'",
                               name, m->kernels[i].sig, sig);
            *out = &m->kernels[i];
            return MT_OK;
        }
    if (strlen(name) >= sizeof m->kernels[0].name ||
        strlen(sig) >= sizeof m->kernels[0].sig)
        return mt_fail(err, MT_E_INVALID, "kernel name or signature too long: %s", name);
    if (strspn(sig, "piulfd") != strlen(sig))
        return mt_fail(err, MT_E_INVALID,
                       "kernel %s: bad signature '%s' (letters p i u l f d)", name, sig);
    if (m->n_kernels == MODULE_MAX_KERNELS)
        return mt_fail(err, MT_E_INVALID, "module has more than %d kernels",
                       MODULE_MAX_KERNELS);
    struct dev_kernel *k = &m->kernels[m->n_kernels];
    mt_status st = m->dev->ops->get_kernel(m->dev->ctx, m->handle, name, sig,
                                           &k->handle, err);
    if (st != MT_OK)
        return st;
    snprintf(k->name, sizeof k->name, "%s", name);
    snprintf(k->sig, sizeof k->sig, "%s", sig);
    m->n_kernels++;
    *out = k;
    return MT_OK;
}

mt_status dev_launch(dev_device *d, dev_kernel *k, dev_dim3 grid, dev_dim3 block,
                     size_t dyn_shared, void **args, mt_err *err)
{
    if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z)
        return mt_fail(err, MT_E_LAUNCH, "kernel %s: empty grid or block (%ux%ux%u, %ux%ux%u)",
                       k->name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
    if (dev_backend_runs_hip_source(d->props.backend)) {
        uint64_t threads = (uint64_t)block.x * block.y * block.z;
        if (threads > (uint64_t)d->props.max_threads_per_block)
            return mt_fail(err, MT_E_LAUNCH,
                           "kernel %s: block of %llu threads exceeds the device's %d",
                           k->name, (unsigned long long)threads,
                           d->props.max_threads_per_block);
        if (dyn_shared > d->props.shared_mem_per_block)
            return mt_fail(err, MT_E_LAUNCH,
                           "kernel %s: %zu bytes of dynamic shared memory exceed "
                           "the device's %zu", k->name, dyn_shared,
                           d->props.shared_mem_per_block);
    }
    return d->ops->launch(d->ctx, k->handle, k->name, k->sig, grid, block, dyn_shared,
                          args, err);
}

void dev_set_launch_timeout(dev_device *d, unsigned ms)
{
    if (d->ops->set_timeout)
        d->ops->set_timeout(d->ctx, ms);
}

mt_status dev_synchronize(dev_device *d, mt_err *err)
{
    return d->ops->synchronize ? d->ops->synchronize(d->ctx, err) : MT_OK;
}

/* ---- memory -------------------------------------------------------------- */

mt_status dev_alloc(dev_device *d, size_t bytes, void **ptr, mt_err *err)
{
    *ptr = NULL;
    if (d->props.compile_only)
        return mt_fail(err, MT_E_UNSUPPORTED,
                       "device %s is compile-only (no GPU): cannot allocate", d->props.spec);
    return d->ops->alloc(d->ctx, bytes ? bytes : 1, ptr, err);
}

void dev_free(dev_device *d, void *ptr)
{
    if (ptr)
        d->ops->free(d->ctx, ptr);
}

mt_status dev_copy_to(dev_device *d, void *dst, const void *src, size_t bytes, mt_err *err)
{
    if (!bytes)
        return MT_OK;
    d->copies.to_calls++;
    d->copies.to_bytes += bytes;
    return d->ops->copy(d->ctx, dst, src, bytes, 0, err);
}

mt_status dev_copy_from(dev_device *d, void *dst, const void *src, size_t bytes, mt_err *err)
{
    if (!bytes)
        return MT_OK;
    d->copies.from_calls++;
    d->copies.from_bytes += bytes;
    return d->ops->copy(d->ctx, dst, src, bytes, 1, err);
}

void dev_get_copy_counts(const dev_device *d, dev_copy_counts *out)
{
    *out = d->copies;
}

mt_status dev_copy_dev(dev_device *d, void *dst, const void *src, size_t bytes, mt_err *err)
{
    return bytes ? d->ops->copy(d->ctx, dst, src, bytes, 2, err) : MT_OK;
}

mt_status dev_memset(dev_device *d, void *dst, int byte, size_t bytes, mt_err *err)
{
    return bytes ? d->ops->memset(d->ctx, dst, byte, bytes, err) : MT_OK;
}

/* ---- timing ---------------------------------------------------------------- */

mt_status dev_event_create(dev_device *d, dev_event **out, mt_err *err)
{
    dev_event *e = calloc(1, sizeof *e);
    if (!e)
        return mt_fail(err, MT_E_NOMEM, "event");
    if (d->ops->event_create) {
        mt_status st = d->ops->event_create(d->ctx, &e->handle, err);
        if (st != MT_OK) {
            free(e);
            return st;
        }
    }
    *out = e;
    return MT_OK;
}

void dev_event_destroy(dev_device *d, dev_event *e)
{
    if (!e)
        return;
    if (e->handle && d->ops->event_destroy)
        d->ops->event_destroy(d->ctx, e->handle);
    free(e);
}

mt_status dev_event_record(dev_device *d, dev_event *e, mt_err *err)
{
    if (e->handle)
        return d->ops->event_record(d->ctx, e->handle, err);
    e->ns = mt_now_ns();
    return MT_OK;
}

mt_status dev_event_elapsed_ms(dev_device *d, dev_event *a, dev_event *b, double *ms,
                               mt_err *err)
{
    if (a->handle && b->handle)
        return d->ops->event_elapsed(d->ctx, a->handle, b->handle, ms, err);
    *ms = (double)(b->ns - a->ns) * 1e-6;
    return MT_OK;
}

mt_status dev_parse_index(const char *backend, const char *arg, int *index, mt_err *err)
{
    *index = 0;
    if (!arg || !*arg)
        return MT_OK;
    char *end = NULL;
    long v = strtol(arg, &end, 10);
    if (!end || *end || v < 0 || v > 1024)
        return mt_fail(err, MT_E_INVALID, "device '%s:%s': expected %s:N with N a GPU index",
                       backend, arg, backend);
    *index = (int)v;
    return MT_OK;
}
