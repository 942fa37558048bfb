/* test_device_cpu.c: the cpu backend through the public device API: C
 * kernels compiled at run time, launched over 1D and 3D grids on the thread
 * pool, checked against plain C references on fresh random inputs. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/rng.h"
#include "device/cpu/cpu_host.h"
#include "device/device.h"
#include "test_dev_util.h"
#include "test_tmp.h"

/* The cpu backend ignores the block size. */
static void launch(dev_device *d, dev_kernel *k, dev_dim3 grid, void **args)
{
    td_launch(d, k, grid, (dev_dim3){1, 1, 1}, 0, args);
}

static const char vadd_src[] =
    "MT_CPU_KERNEL void vadd(float *c, const float *a, const float *b, int n)\n"
    "{\n"
    "    unsigned base = itemIdx.x * CHUNK;\n"
    "    for (unsigned j = 0; j < CHUNK && base + j < (unsigned)n; j++)\n"
    "        c[base + j] = a[base + j] + b[base + j];\n"
    "}\n";

Test(device_cpu, vector_add_matches_reference_on_odd_sizes)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    dev_device *d = td_open("cpu", NULL);
    dev_define defs[] = {{"CHUNK", "13"}};
    dev_module *m = td_build(d, "vadd.c", vadd_src, defs, 1, true);
    dev_kernel *k = td_kernel(m, "vadd", "pppi");
    for (int round = 0; round < 3; round++) {
        int n = 1 + 2 * (int)mt_rng_below(&r, 20000); /* odd */
        size_t bytes = (size_t)n * sizeof(float);
        float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
        for (int i = 0; i < n; i++) {
            a[i] = mt_rng_normal(&r);
            b[i] = mt_rng_normal(&r);
        }
        void *da = td_alloc(d, bytes);
        void *db = td_alloc(d, bytes);
        void *dc = td_alloc(d, bytes);
        cr_assert_eq((uintptr_t)da % 64, 0, "allocations are 64-byte aligned");
        td_copy_to(d, da, a, bytes);
        td_copy_to(d, db, b, bytes);
        td_fill(d, dc, 0xff, bytes); /* poison: NaNs */
        void *args[] = {&dc, &da, &db, &n};
        launch(d, k, (dev_dim3){(unsigned)((n + 12) / 13), 1, 1}, args);
        td_download(d, c, dc, bytes);
        for (int i = 0; i < n; i++)
            cr_assert_eq(c[i], a[i] + b[i], "seed %" PRIu64 " n %d: c[%d] = %g, want %g",
                         seed, n, i, c[i], a[i] + b[i]);
        dev_free(d, da);
        dev_free(d, db);
        dev_free(d, dc);
        free(a);
        free(b);
        free(c);
    }
    dev_module_unload(m);
    dev_close(d);
}

/* Two stages: each item sums one slice in double, then one item sums the
 * partials. */
static const char reduce_src[] =
    "MT_CPU_KERNEL void partial(double *out, const float *x, long n, unsigned slice)\n"
    "{\n"
    "    long s = (long)itemIdx.x * slice, e = s + slice < n ? s + slice : n;\n"
    "    double acc = 0;\n"
    "    for (long i = s; i < e; i++) acc += x[i];\n"
    "    out[itemIdx.x] = acc;\n"
    "}\n"
    "MT_CPU_KERNEL void total(double *out, const double *p, int n, double scale)\n"
    "{\n"
    "    double acc = 0;\n"
    "    for (int i = 0; i < n; i++) acc += p[i];\n"
    "    out[0] = acc * scale;\n"
    "}\n";

static double reduce_on(const char *spec, const float *x, long n, unsigned slice)
{
    dev_device *d = td_open(spec, NULL);
    dev_module *m = td_build(d, "reduce.c", reduce_src, NULL, 0, true);
    dev_kernel *kp = td_kernel(m, "partial", "pplu");
    dev_kernel *kt = td_kernel(m, "total", "ppid");
    int items = (int)((n + slice - 1) / slice);
    void *dx = td_alloc(d, (size_t)n * 4);
    void *dp = td_alloc(d, (size_t)items * 8);
    void *dout = td_alloc(d, 8);
    td_copy_to(d, dx, x, (size_t)n * 4);
    void *a1[] = {&dp, &dx, &n, &slice};
    launch(d, kp, (dev_dim3){(unsigned)items, 1, 1}, a1);
    double scale = 1.0;
    void *a2[] = {&dout, &dp, &items, &scale};
    launch(d, kt, (dev_dim3){1, 1, 1}, a2);
    double out = NAN;
    td_download(d, &out, dout, 8);
    dev_free(d, dx);
    dev_free(d, dp);
    dev_free(d, dout);
    dev_module_unload(m);
    dev_close(d);
    return out;
}

Test(device_cpu, reduction_matches_reference_and_thread_counts_agree)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    long n = 100001 + 2 * (long)mt_rng_below(&r, 50000);
    float *x = malloc((size_t)n * sizeof *x);
    for (long i = 0; i < n; i++)
        x[i] = mt_rng_uniform(&r, -1.0f, 1.0f);
    unsigned slice = 97;
    double ref = 0;
    for (long s = 0; s < n; s += slice) { /* same association as the kernel */
        double acc = 0;
        for (long i = s; i < n && i < s + (long)slice; i++)
            acc += x[i];
        ref += acc;
    }
    double one = reduce_on("cpu:1", x, n, slice);
    double two = reduce_on("cpu:2", x, n, slice);
    double dflt = reduce_on("cpu", x, n, slice);
    cr_assert_eq(one, ref, "seed %" PRIu64 ": cpu:1 sum %.17g, reference %.17g", seed, one,
                 ref);
    cr_assert_eq(two, one, "seed %" PRIu64 ": cpu:2 %.17g vs cpu:1 %.17g", seed, two, one);
    cr_assert_eq(dflt, one, "seed %" PRIu64 ": cpu %.17g vs cpu:1 %.17g", seed, dflt, one);
    free(x);
}

static const char grid_src[] =
    "MT_CPU_KERNEL void mark(unsigned *hits, unsigned *bad)\n"
    "{\n"
    "    unsigned i = itemIdx.x + itemCount.x * (itemIdx.y + itemCount.y * itemIdx.z);\n"
    "    if (itemIdx.x >= itemCount.x || itemIdx.y >= itemCount.y ||\n"
    "        itemIdx.z >= itemCount.z)\n"
    "        __atomic_fetch_add(bad, 1u, __ATOMIC_RELAXED);\n"
    "    else\n"
    "        __atomic_fetch_add(&hits[i], 1u, __ATOMIC_RELAXED);\n"
    "}\n";

Test(device_cpu, every_item_of_a_3d_grid_runs_exactly_once)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    dev_device *d = td_open("cpu:3", NULL);
    dev_module *m = td_build(d, "grid.c", grid_src, NULL, 0, true);
    dev_kernel *k = td_kernel(m, "mark", "pp");
    for (int round = 0; round < 4; round++) {
        dev_dim3 g = {1 + (unsigned)mt_rng_below(&r, 37), 1 + (unsigned)mt_rng_below(&r, 11),
                      1 + (unsigned)mt_rng_below(&r, 7)};
        size_t n = (size_t)g.x * g.y * g.z;
        void *hits = td_alloc(d, n * 4);
        void *bad = td_alloc(d, 4);
        td_fill(d, hits, 0, n * 4);
        td_fill(d, bad, 0, 4);
        void *args[] = {&hits, &bad};
        launch(d, k, g, args);
        unsigned *h = hits;
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(h[i], 1, "seed %" PRIu64 " grid %ux%ux%u: item %zu ran %u times",
                         seed, g.x, g.y, g.z, i, h[i]);
        cr_assert_eq(*(unsigned *)bad, 0, "items outside the grid");
        dev_free(d, hits);
        dev_free(d, bad);
    }
    dev_module_unload(m);
    dev_close(d);
}

static const char args_src[] =
    "MT_CPU_KERNEL void pack(double *o, int i, unsigned u, long l, float f, double d)\n"
    "{\n"
    "    o[0] = i; o[1] = u; o[2] = (double)l; o[3] = f; o[4] = d;\n"
    "}\n";

Test(device_cpu, every_argument_type_reaches_the_kernel)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    dev_device *d = td_open("cpu:2", NULL);
    dev_module *m = td_build(d, "args.c", args_src, NULL, 0, true);
    dev_kernel *k = td_kernel(m, "pack", "piulfd");
    void *o = td_alloc(d, 5 * 8);
    int i = -(int)mt_rng_below(&r, 1000000);
    unsigned u = 3000000000u + (unsigned)mt_rng_below(&r, 1000);
    long l = -(long)(mt_rng_u64(&r) >> 12);
    float f = mt_rng_normal(&r);
    double dv = (double)mt_rng_normal(&r) * 1e10;
    void *args[] = {&o, &i, &u, &l, &f, &dv};
    launch(d, k, (dev_dim3){1, 1, 1}, args);
    double *v = o;
    cr_assert_eq(v[0], (double)i);
    cr_assert_eq(v[1], (double)u);
    cr_assert_eq(v[2], (double)l);
    cr_assert_eq(v[3], (double)f);
    cr_assert_eq(v[4], dv, "seed %" PRIu64, seed);
    dev_free(d, o);
    dev_module_unload(m);
    dev_close(d);
}

/* More float arguments than the x86-64 SSE registers hold: the libffi path. */
static const char many_src[] =
    "MT_CPU_KERNEL void many(double *o, int a, int b, int c, int d, int e, int f,\n"
    "                        long g, float h, float i, float j, float k, float l,\n"
    "                        float m, float n, float p, double q, unsigned r)\n"
    "{\n"
    "    o[itemIdx.x] = (double)a - b + 2.0 * c - d + 3.0 * e - f + (double)g\n"
    "        + h - i + 2.0f * j - k + l - m + n - 4.0f * p + q * r;\n"
    "}\n";

Test(device_cpu, kernels_with_more_arguments_than_registers_get_every_value)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    dev_device *d = td_open("cpu:2", NULL);
    dev_module *m = td_build(d, "many.c", many_src, NULL, 0, true);
    dev_kernel *k = td_kernel(m, "many", "piiiiiilffffffffdu");
    int iv[6];
    float fv[8];
    for (int i = 0; i < 6; i++)
        iv[i] = (int)mt_rng_below(&r, 2000) - 1000;
    for (int i = 0; i < 8; i++)
        fv[i] = (float)((int)mt_rng_below(&r, 200) - 100) / 4.0f;
    long g = (long)mt_rng_below(&r, 1u << 30) << 10;
    double q = (double)mt_rng_below(&r, 1000) / 8.0;
    unsigned ru = 1 + (unsigned)mt_rng_below(&r, 1000);
    double out[7];
    void *o = out;
    void *args[18] = {&o};
    for (int i = 0; i < 6; i++)
        args[1 + i] = &iv[i];
    args[7] = &g;
    for (int i = 0; i < 8; i++)
        args[8 + i] = &fv[i];
    args[16] = &q;
    args[17] = &ru;
    launch(d, k, (dev_dim3){7, 1, 1}, args);
    double want = (double)iv[0] - iv[1] + 2.0 * iv[2] - iv[3] + 3.0 * iv[4] - iv[5] +
                  (double)g + (fv[0] - fv[1] + 2.0f * fv[2] - fv[3] + fv[4] - fv[5] +
                               fv[6] - 4.0f * fv[7]) + q * ru;
    for (int i = 0; i < 7; i++)
        cr_assert_float_eq(out[i], want, 1e-6 * (fabs(want) + 1), "seed %" PRIu64
                           ": item %d got %.17g want %.17g", seed, i, out[i], want);
    dev_module_unload(m);
    dev_close(d);
}

/* Integer-class arguments past the six registers (on the stack, as the
 * MoE GEMMs' 13) with floats between them: the direct-call path. Each
 * value has its own weight, so a swapped or shifted argument shows. */
static const char stack_src[] =
    "MT_CPU_KERNEL void stack(double *o, int a, unsigned b, long c, int d, float e, int f,\n"
    "                         long g, int h, double i, unsigned j, int k, long l, int m,\n"
    "                         float n, int p, long q)\n"
    "{\n"
    "    o[itemIdx.x] = a + 3.0 * b + 5.0 * c + 7.0 * d + 11.0 * e + 13.0 * f + 17.0 * g\n"
    "        + 19.0 * h + 23.0 * i + 29.0 * j + 31.0 * k + 37.0 * l + 41.0 * m + 43.0 * n\n"
    "        + 47.0 * p + 53.0 * q;\n"
    "}\n";

Test(device_cpu, integer_arguments_past_the_registers_reach_the_kernel)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    dev_device *d = td_open("cpu:2", NULL);
    dev_module *m = td_build(d, "stack.c", stack_src, NULL, 0, true);
    dev_kernel *k = td_kernel(m, "stack", "piulifiliduilifil");
    int iv[8];
    unsigned uv[2];
    long lv[4];
    float fv[2];
    for (int i = 0; i < 8; i++)
        iv[i] = (int)mt_rng_below(&r, 2000000) - 1000000;
    for (int i = 0; i < 2; i++)
        uv[i] = 4000000000u - (unsigned)mt_rng_below(&r, 1000);
    for (int i = 0; i < 4; i++)
        lv[i] = ((long)mt_rng_below(&r, 1u << 20) - (1l << 19)) * (1l << 20);
    for (int i = 0; i < 2; i++)
        fv[i] = (float)((int)mt_rng_below(&r, 200) - 100) / 4.0f;
    double dv = (double)mt_rng_below(&r, 1000) / 8.0;
    double out[5];
    void *o = out;
    void *args[] = {&o,     &iv[0], &uv[0], &lv[0], &iv[1], &fv[0], &iv[2], &lv[1], &iv[3],
                    &dv,    &uv[1], &iv[4], &lv[2], &iv[5], &fv[1], &iv[6], &lv[3]};
    launch(d, k, (dev_dim3){5, 1, 1}, args);
    double want = iv[0] + 3.0 * uv[0] + 5.0 * lv[0] + 7.0 * iv[1] + 11.0 * fv[0] +
                  13.0 * iv[2] + 17.0 * lv[1] + 19.0 * iv[3] + 23.0 * dv + 29.0 * uv[1] +
                  31.0 * iv[4] + 37.0 * lv[2] + 41.0 * iv[5] + 43.0 * fv[1] + 47.0 * iv[6] +
                  53.0 * lv[3];
    for (int i = 0; i < 5; i++)
        cr_assert_float_eq(out[i], want, 1e-12 * fabs(want) + 1e-9, "seed %" PRIu64
                           ": item %d got %.17g want %.17g", seed, i, out[i], want);
    dev_module_unload(m);
    dev_close(d);
}

static const char count_src[] =
    "MT_CPU_KERNEL void bump(long *c) { __atomic_fetch_add(c, 1 + itemIdx.x, "
    "__ATOMIC_RELAXED); }\n";

Test(device_cpu, many_launches_in_a_row_all_complete)
{
    dev_device *d = td_open("cpu:4", NULL);
    dev_module *m = td_build(d, "count.c", count_src, NULL, 0, true);
    dev_kernel *k = td_kernel(m, "bump", "p");
    void *c = td_alloc(d, 8);
    td_fill(d, c, 0, 8);
    void *args[] = {&c};
    long want = 0;
    for (int i = 0; i < 3000; i++) {
        unsigned items = 1 + (unsigned)(i * 7919 % 257);
        launch(d, k, (dev_dim3){items, 1, 1}, args);
        want += (long)items * (items + 1) / 2;
        if (i % 500 == 0) /* each launch is complete when it returns */
            cr_assert_eq(*(long *)c, want, "after launch %d", i);
    }
    cr_assert_eq(*(long *)c, want);
    dev_free(d, c);
    dev_module_unload(m);
    dev_close(d);
}

Test(device_cpu, compile_error_returns_the_compiler_log_naming_the_source)
{
    dev_device *d = td_open("cpu", NULL);
    dev_compile_req req = {.name = "broken_kernel.c",
                           .source = "MT_CPU_KERNEL void f(int *x) {\n  x[0] = undefined_thing;\n}\n",
                           .no_cache = true};
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_compile(d, &req, &code, &err);
    cr_assert_eq(st, MT_E_COMPILE, "status %s: %s", mt_status_str(st), err.msg);
    cr_assert_null(code);
    cr_assert(strstr(err.msg, "broken_kernel.c:2"), "log does not name the line: %s",
              err.msg);
    cr_assert(strstr(err.msg, "undefined_thing"), "log lacks the compiler's text: %s",
              err.msg);
    dev_close(d);
}

/* Two compiles of one new text at the same moment, each on its own device
 * handle (as two processes would): one compiles, the other waits for it and
 * reads the cache. */
typedef struct racer {
    pthread_barrier_t *start;
    const char *src;
    bool hit;
    mt_status st;
    mt_err err;
} racer;

static void *race_compile(void *arg)
{
    racer *r = arg;
    dev_device *d = NULL;
    mt_err *err = &r->err;
    r->st = dev_open("cpu", NULL, &d, err);
    pthread_barrier_wait(r->start);
    dev_code *c = NULL;
    if (r->st == MT_OK) {
        dev_compile_req req = {.name = "race.c", .source = r->src};
        r->st = dev_compile(d, &req, &c, err);
    }
    r->hit = c && dev_code_get_info(c)->cache_hit;
    dev_code_free(c);
    dev_close(d);
    return NULL;
}

Test(device_cpu, simultaneous_compiles_of_one_text_compile_once)
{
    tmp_cache_make_writable();
    for (int round = 0; round < 3; round++) {
        char src[256];
        snprintf(src, sizeof src, "/* %016" PRIx64 " */\nMT_CPU_KERNEL void z(float *x) "
                 "{ x[itemIdx.x] = 1.5f; }\n", mt_seed_fresh());
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, 2);
        racer r[2] = {{.start = &start, .src = src, .err = MT_ERR_INIT},
                      {.start = &start, .src = src, .err = MT_ERR_INIT}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            cr_assert_eq(pthread_create(&th[i], NULL, race_compile, &r[i]), 0);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&start);
        for (int i = 0; i < 2; i++)
            cr_assert_eq(r[i].st, MT_OK, "compile %d: %s", i, r[i].err.msg);
        cr_assert_eq(r[0].hit + r[1].hit, 1, "round %d: %d of 2 compiles were cache hits "
                     "(one should wait for the other)", round, r[0].hit + r[1].hit);
    }
}

Test(device_cpu, second_compile_of_the_same_text_is_a_cache_hit)
{
    tmp_cache_make_writable();
    dev_device *d = td_open("cpu", NULL);
    char src[256];
    /* A fresh text, so the first compile cannot hit an older entry. */
    snprintf(src, sizeof src,
             "/* %016" PRIx64 " */\nMT_CPU_KERNEL void z(float *x) { x[itemIdx.x] = V; }\n",
             mt_seed_fresh());
    dev_define defs[] = {{"V", "2.5f"}};
    dev_compile_req req = {.name = "cached.c", .source = src, .defines = defs,
                           .n_defines = 1};
    dev_code *c1 = NULL, *c2 = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_compile(d, &req, &c1, &err), MT_OK, "%s", err.msg);
    cr_assert_not(dev_code_get_info(c1)->cache_hit);
    cr_assert_gt(dev_code_get_info(c1)->compile_ms, 0.0);
    cr_assert_eq(dev_compile(d, &req, &c2, &err), MT_OK, "%s", err.msg);
    cr_assert(dev_code_get_info(c2)->cache_hit, "second compile was not a cache hit");
    size_t n1, n2;
    const void *b1 = dev_code_get_bytes(c1, &n1), *b2 = dev_code_get_bytes(c2, &n2);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(b1, b2, n1), 0);
    /* The cached code runs. */
    dev_module *m = NULL;
    cr_assert_eq(dev_module_load(d, c2, &m, &err), MT_OK, "%s", err.msg);
    dev_kernel *k = td_kernel(m, "z", "p");
    float out[5] = {0};
    void *p = out;
    void *args[] = {&p};
    launch(d, k, (dev_dim3){5, 1, 1}, args);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(out[i], 2.5f);
    /* A different define is a different key. */
    dev_define other[] = {{"V", "3.5f"}};
    req.defines = other;
    dev_code *c3 = NULL;
    cr_assert_eq(dev_compile(d, &req, &c3, &err), MT_OK, "%s", err.msg);
    cr_assert_not(dev_code_get_info(c3)->cache_hit);
    dev_module_unload(m);
    dev_code_free(c1);
    dev_code_free(c2);
    dev_code_free(c3);
    dev_close(d);
}

Test(device_cpu, properties_describe_this_machine)
{
    dev_device *d = td_open("cpu:3", NULL);
    const dev_props *p = dev_get_props(d);
    cr_assert_eq(p->backend, DEV_BACKEND_CPU);
    cr_assert_str_eq(p->spec, "cpu:3");
    cr_assert_eq(p->compute_units, 3);
    cr_assert_eq(p->warp_size, 1);
    cr_assert_eq(p->shared_mem_per_block, 0);
    cr_assert_gt(strlen(p->arch), 0);
    cr_assert_gt(strlen(p->name), 0);
    cr_assert_gt(strlen(p->runtime_version), 0);
    cr_assert_gt(p->mem_bytes, (size_t)1 << 26);
#if defined(__x86_64__) || defined(__i386__)
    /* sysfs, else sysconf, else cpuid: x86 always has one of them. */
    cr_assert_gt(p->llc_bytes, 0, "no cache size from sysfs, sysconf or cpuid");
#endif
    cr_assert_not(p->compile_only);
    dev_close(d);
}

/* Writes text to root/rel, making the folders on the way. */
static void put_file(const char *root, const char *rel, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *s = path + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = 0;
        cr_assert(mkdir(path, 0700) == 0 || errno == EEXIST, "mkdir %s", path);
        *s = '/';
    }
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

Test(device_cpu, cache_size_comes_from_a_sysfs_tree_with_cache_folders)
{
    char root[512];
    tmp_dir_make(root, sizeof root, "mt_sysfs");
    static const struct { const char *level, *type, *size; } idx[] = {
        {"1", "Data", "48K"}, {"1", "Instruction", "32K"}, {"2", "Unified", "1024K"},
        {"3", "Unified", "32768K"},
    };
    for (int i = 0; i < 4; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "devices/system/cpu/cpu0/cache/index%d/level", i);
        put_file(root, rel, idx[i].level);
        snprintf(rel, sizeof rel, "devices/system/cpu/cpu0/cache/index%d/type", i);
        put_file(root, rel, idx[i].type);
        snprintf(rel, sizeof rel, "devices/system/cpu/cpu0/cache/index%d/size", i);
        put_file(root, rel, idx[i].size);
    }
    cpu_cache_src src = CPU_CACHE_NONE;
    cr_assert_eq(cpu_host_llc_bytes(root, &src), (size_t)32 << 20);
    cr_assert_eq(src, CPU_CACHE_SYSFS, "%s", cpu_cache_src_str(src));
    cr_assert_eq(cpu_host_llc_bytes_sysfs(root), (size_t)32 << 20);
}

Test(device_cpu, cache_size_falls_back_to_sysconf_then_cpuid_without_sysfs_cache_folders)
{
    char root[512];
    tmp_dir_make(root, sizeof root, "mt_sysfs");
    put_file(root, "devices/system/cpu/cpu0/online", "1\n");
    cr_assert_eq(cpu_host_llc_bytes_sysfs(root), 0);
    size_t by_sysconf = cpu_host_llc_bytes_sysconf(), by_cpuid = cpu_host_llc_bytes_cpuid();
    cpu_cache_src src = CPU_CACHE_NONE;
    size_t got = cpu_host_llc_bytes(root, &src);
    if (by_sysconf) {
        cr_assert_eq(src, CPU_CACHE_SYSCONF, "%s", cpu_cache_src_str(src));
        cr_assert_eq(got, by_sysconf);
    } else {
        cr_assert_eq(src, by_cpuid ? CPU_CACHE_CPUID : CPU_CACHE_NONE, "%s",
                     cpu_cache_src_str(src));
        cr_assert_eq(got, by_cpuid);
    }
#if defined(__x86_64__) || defined(__i386__)
    /* cpuid alone answers on any x86 (VMs included): whole KiB, at least a
     * small L1. */
    cr_assert_geq(by_cpuid, (size_t)16 << 10, "cpuid cache size %zu", by_cpuid);
    cr_assert_eq(by_cpuid % 1024, 0, "cpuid cache size %zu", by_cpuid);
    cr_assert_gt(got, 0);
#endif
}

Test(device_cpu, bad_thread_counts_and_missing_kernels_are_errors)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu:0", NULL, &d, &err), MT_E_INVALID);
    cr_assert_eq(dev_open("cpu:two", NULL, &d, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "cpu:two"), "%s", err.msg);
    d = td_open("cpu:2", NULL);
    dev_module *m = td_build(d, "count.c", count_src, NULL, 0, true);
    dev_kernel *k = NULL;
    cr_assert_eq(dev_module_get_kernel(m, "no_such_kernel", "p", &k, &err), MT_E_NOT_FOUND);
    cr_assert(strstr(err.msg, "no_such_kernel"), "%s", err.msg);
    dev_module_unload(m);
    dev_close(d);
}

/* --arch caps the code at an x86-64 level the CPU has, names it in the
 * properties and the compile cache key; an unknown name is refused. */
Test(device_cpu, arch_caps_the_code_at_a_level_the_cpu_has)
{
#if defined(__x86_64__)
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    dev_open_opts o = {.arch = "x86-64-v2"};
    cr_assert_eq(dev_open("cpu", &o, &d, &err), MT_OK, "%s", err.msg);
    cr_expect_str_eq(dev_get_props(d)->arch, "x86-64-v2");
    dev_close(d);
    d = NULL;
    o.arch = "znver9";
    cr_expect_eq(dev_open("cpu", &o, &d, &err), MT_E_INVALID);
    cr_expect(strstr(err.msg, "znver9") != NULL, "%s", err.msg);
    cr_expect_null(d);
    char why[256] = "";
    cr_expect(cpu_host_march_ok("x86-64", why, sizeof why), "%s", why);
#else
    cr_skip_test("x86-64 levels only");
#endif
}

/* What the kernels were compiled with: MT_CPU_PAGE_TOUCH and whether AMX
 * tiles are on (__AMX_TILE__). */
static const char flags_src[] =
    "MT_CPU_KERNEL void flags(int *out)\n"
    "{\n"
    "    out[0] = MT_CPU_PAGE_TOUCH;\n"
    "#ifdef __AMX_TILE__\n"
    "    out[1] = 1;\n"
    "#else\n"
    "    out[1] = 0;\n"
    "#endif\n"
    "}\n";

static void compiled_flags(dev_device *d, int out[2])
{
    dev_module *m = td_build(d, "flags.c", flags_src, NULL, 0, false);
    dev_kernel *k = td_kernel(m, "flags", "p");
    int *dout = td_alloc(d, 2 * sizeof(int));
    void *args[] = {&dout};
    launch(d, k, (dev_dim3){1, 1, 1}, args);
    td_download(d, out, dout, 2 * sizeof(int));
    dev_free(d, dout);
    dev_module_unload(m);
}

/* The page touch follows the vendor, MOETUNE_CPU_PAGE_TOUCH overrides it,
 * and the kernels see what the properties say (the flag is part of the
 * compile cache key: the same text compiled under the other setting must
 * not come back from the cache). AMX tiles are compiled in exactly where
 * the properties say the process may use them. */
Test(device_cpu, page_touch_and_amx_reach_the_kernels_as_the_properties_say)
{
    static const char *const settings[] = {"1", "0", NULL, "yes"};
    for (size_t i = 0; i < sizeof settings / sizeof *settings; i++) {
        if (settings[i])
            setenv("MOETUNE_CPU_PAGE_TOUCH", settings[i], 1);
        else
            unsetenv("MOETUNE_CPU_PAGE_TOUCH");
        dev_device *d = td_open("cpu", NULL);
        const dev_props *p = dev_get_props(d);
        bool amd = strstr(p->name, "AMD") != NULL;
        bool want = settings[i] && !strcmp(settings[i], "1")   ? true
                    : settings[i] && !strcmp(settings[i], "0") ? false
                                                               : amd; /* unset or not 0/1 */
        cr_expect_eq(p->cpu_page_touch, want, "MOETUNE_CPU_PAGE_TOUCH=%s on %s",
                     settings[i] ? settings[i] : "(unset)", p->name);
        int got[2] = {-1, -1};
        compiled_flags(d, got);
        cr_expect_eq(got[0], p->cpu_page_touch ? 1 : 0, "MOETUNE_CPU_PAGE_TOUCH=%s",
                     settings[i] ? settings[i] : "(unset)");
        cr_expect_eq(got[1], p->cpu_amx ? 1 : 0, "AMX compiled in: %d, props: %d", got[1],
                     (int)p->cpu_amx);
        cr_expect_eq(p->cpu_amx, cpu_host_amx() == CPU_AMX_USABLE);
        dev_close(d);
    }
}
