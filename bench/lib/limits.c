/* limits.c: bandwidth and FMA probes compiled for the machine (see
 * limits.h). */
#include "limits.h"

#include <stdlib.h>
#include <string.h>

#include "../../common/clock.h"
#include "../../kernels/runner.h"

/* Compiled by the cpu backend (-march=native): 64-byte vectors where the
 * CPU has AVX-512, 32-byte otherwise. */
static const char probe_src[] =
    "#if defined(__AVX512F__)\n"
    "#define VW 16\n"
    "#else\n"
    "#define VW 8\n"
    "#endif\n"
    "typedef float mt_vf __attribute__((vector_size(VW * 4)));\n"
    "MT_CPU_KERNEL void peak_fma(float *out, int iters)\n"
    "{\n"
    "    mt_vf a[12], m, c;\n"
    "    for (int k = 0; k < VW; k++) { m[k] = 0.999f; c[k] = 0.001f * (k + 1); }\n"
    "    for (int j = 0; j < 12; j++) a[j] = c + (float)j;\n"
    "    for (int i = 0; i < iters; i++)\n"
    "#pragma GCC unroll 12\n"
    "        for (int j = 0; j < 12; j++) a[j] = a[j] * m + c;\n"
    "    float s = 0.0f;\n"
    "    for (int j = 0; j < 12; j++) for (int k = 0; k < VW; k++) s += a[j][k];\n"
    "    out[itemIdx.x] = s;\n"
    "    if (itemIdx.x == 0) out[1000] = VW;\n"
    "}\n"
    "/* Eight independent vector accumulators: loads, not add latency, bound it. */\n"
    "MT_CPU_KERNEL void stream_sum(float *out, const float *x, long chunk)\n"
    "{\n"
    "    const mt_vf *p = (const mt_vf *)(x + (long)itemIdx.x * chunk);\n"
    "    long n = chunk / VW;\n"
    "    mt_vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};\n"
    "    for (long i = 0; i + 8 <= n; i += 8) {\n"
    "        a0 += p[i]; a1 += p[i + 1]; a2 += p[i + 2]; a3 += p[i + 3];\n"
    "        a4 += p[i + 4]; a5 += p[i + 5]; a6 += p[i + 6]; a7 += p[i + 7];\n"
    "    }\n"
    "    mt_vf a = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;\n"
    "    float s = 0.0f;\n"
    "    for (int k = 0; k < VW; k++) s += a[k];\n"
    "    out[itemIdx.x] = s;\n"
    "}\n";

enum { ITEMS = 64 };

struct bench_limits {
    dev_device *dev;
    const dev_props *props;
    dev_code *code;
    dev_module *mod;
    dev_kernel *fma, *sum;
    float *out;       /* 4096 bytes: per-item sums, [1000] the vector width */
    float *big;       /* streamed for bandwidth, and to flush caches */
    size_t big_bytes;
};

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void bench_spread_of(double *v, int n, bench_spread *out)
{
    memset(out, 0, sizeof *out);
    if (n <= 0)
        return;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    /* Nearest-rank percentiles, interpolated. */
    double q[3] = {0.1, 0.5, 0.9}, r[3];
    for (int i = 0; i < 3; i++) {
        double pos = q[i] * (n - 1);
        int lo = (int)pos, hi = lo + 1 < n ? lo + 1 : lo;
        r[i] = v[lo] + (v[hi] - v[lo]) * (pos - lo);
    }
    *out = (bench_spread){r[0], r[1], r[2], n};
}

mt_status bench_limits_open(dev_device *d, bench_limits **out, mt_err *err)
{
    *out = NULL;
    bench_limits *l = calloc(1, sizeof *l);
    if (!l)
        return mt_fail(err, MT_E_NOMEM, "limits");
    l->dev = d;
    l->props = dev_get_props(d);
    mt_status st = MT_OK;
    if (l->props->backend == DEV_BACKEND_CPU) {
        dev_compile_req req = {.name = "bench_limits.cpu", .source = probe_src};
        /* 16x the last-level cache, at least 1 GiB, at most 4 GiB (some VMs
         * report a host-sized L3 of hundreds of MiB). */
        l->big_bytes = (size_t)1 << 30;
        if (l->props->llc_bytes * 16 > l->big_bytes)
            l->big_bytes = l->props->llc_bytes * 16;
        if (l->big_bytes > ((size_t)4 << 30))
            l->big_bytes = (size_t)4 << 30;
        l->big_bytes -= l->big_bytes % ((size_t)ITEMS * 64 * 8);
        if ((st = dev_compile(d, &req, &l->code, err)) != MT_OK ||
            (st = dev_module_load(d, l->code, &l->mod, err)) != MT_OK ||
            (st = dev_module_get_kernel(l->mod, "peak_fma", "pi", &l->fma, err)) != MT_OK ||
            (st = dev_module_get_kernel(l->mod, "stream_sum", "ppl", &l->sum, err)) != MT_OK ||
            (st = dev_alloc(d, 4096, (void **)&l->out, err)) != MT_OK ||
            (st = dev_alloc(d, l->big_bytes, (void **)&l->big, err)) != MT_OK ||
            (st = dev_memset(d, l->big, 0, l->big_bytes, err)) != MT_OK) {
            bench_limits_close(l);
            return mt_err_prefix(err, "limit probes");
        }
    }
    *out = l;
    return MT_OK;
}

void bench_limits_close(bench_limits *l)
{
    if (!l)
        return;
    dev_free(l->dev, l->out);
    dev_free(l->dev, l->big);
    dev_module_unload(l->mod);
    dev_code_free(l->code);
    free(l);
}

static mt_status stream(bench_limits *l, double *ms, mt_err *err)
{
    long chunk = (long)(l->big_bytes / 4 / ITEMS);
    void *args[] = {&l->out, &l->big, &chunk};
    double t0 = mt_now_ms();
    mt_status st = dev_launch(l->dev, l->sum, (dev_dim3){ITEMS, 1, 1}, (dev_dim3){1, 1, 1}, 0,
                              args, err);
    if (st == MT_OK)
        st = dev_synchronize(l->dev, err);
    if (ms)
        *ms = mt_now_ms() - t0;
    return st;
}

mt_status bench_limits_flush(bench_limits *l, mt_err *err)
{
    return l->sum ? stream(l, NULL, err) : MT_OK;
}

mt_status bench_limits_bandwidth(bench_limits *l, int reps, bench_spread *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    if (reps < 3)
        reps = 3;
    if (reps > 64)
        reps = 64;
    double v[64];
    mt_status st = MT_OK;
    if (!l->sum) { /* GPU backends: device-to-device copies */
        for (int i = 0; i < reps && st == MT_OK; i++)
            st = kern_device_bandwidth(l->dev, (size_t)1 << 30, &v[i], err);
    } else {
        st = stream(l, NULL, err); /* warm-up: pages, frequency */
        for (int i = 0; i < reps && st == MT_OK; i++) {
            double ms = 0;
            st = stream(l, &ms, err);
            v[i] = (double)l->big_bytes / (ms * 1e6);
        }
    }
    if (st == MT_OK)
        bench_spread_of(v, reps, out);
    return st;
}

mt_status bench_limits_fma(bench_limits *l, bench_spread *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    if (!l->fma)
        return MT_OK;
    int iters = 20000000, items = l->props->compute_units > 0 ? l->props->compute_units : 1;
    void *args[] = {&l->out, &iters};
    double t[3];
    mt_status st = MT_OK;
    for (int i = 0; i < 3 && st == MT_OK; i++) {
        double t0 = mt_now_ms();
        st = dev_launch(l->dev, l->fma, (dev_dim3){(unsigned)items, 1, 1}, (dev_dim3){1, 1, 1},
                        0, args, err);
        if (st == MT_OK)
            st = dev_synchronize(l->dev, err);
        t[i] = mt_now_ms() - t0;
    }
    float vw = 0;
    if (st == MT_OK)
        st = dev_copy_from(l->dev, &vw, l->out + 1000, sizeof vw, err);
    if (st != MT_OK)
        return st;
    double flops = (double)items * iters * 12 * vw * 2;
    for (int i = 0; i < 3; i++)
        t[i] = flops / (t[i] * 1e6);
    bench_spread_of(t, 3, out);
    return MT_OK;
}
