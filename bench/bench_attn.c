/* bench_attn.c: GLM-5.2's attention kernels (mla_decode, mla_prefill,
 * dsa_indexer, rope) at GLM-5.2 dims on the cpu backend, against limits
 * measured in the same run through the same backend and compiler: memory
 * read bandwidth (a streaming-sum kernel over a buffer far larger than the
 * last-level cache) and fp32 FMA peak (independent vector FMA chains).
 * Prints time, achieved bandwidth and FLOP/s (the family's cost model:
 * minimum bytes and flops) and their fractions of the limits; the one that
 * bounds each kernel is marked (*): bandwidth for decode-like calls,
 * FLOP/s for prefill. Caches are flushed between timed runs.
 *
 * Usage: bench_attn [--device cpu|cpu:T] [--reps N] [--only FAMILY] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "kernels/attn_common.h"
#include "bench/lib/limits.h"
#include "kernels/exec.h"

extern const kern_family fam_mla_decode, fam_mla_prefill, fam_dsa_indexer, fam_rope;

static void die(const char *what, const mt_err *err)
{
    fprintf(stderr, "bench_attn: %s: %s\n", what, err->msg);
    exit(1);
}

/* The limits of this run: read bandwidth and fp32 FMA peak (medians). */
typedef struct limits {
    bench_limits *probe;
    double gbps, gflops;
} limits;

/* ---- one family call -------------------------------------------------------------------- */

typedef struct item {
    const kern_family *fam;
    const char *key;
    int64_t m;
    bool bw_bound;
} item;

/* One call through the executor, waited for. */
static mt_status run_sync(kern_exec *e, const kern_shape *s, int64_t m, void *const *bufs,
                          mt_err *err)
{
    mt_status st = kern_exec_run(e, s, m, bufs, err);
    return st == MT_OK ? dev_synchronize(kern_exec_device(e), err) : st;
}

static void bench_one(dev_device *d, limits *l, const item *it, int reps)
{
    mt_err err = MT_ERR_INIT;
    kern_shape s;
    if (kern_shape_parse(it->fam, it->key, &s, NULL, &err) != MT_OK)
        die(it->key, &err);
    kern_buf_desc bufs[KERN_MAX_BUFS];
    int n = it->fam->buffers(&s, it->m, bufs, KERN_MAX_BUFS);
    void *host[KERN_MAX_BUFS], *dbuf[KERN_MAX_BUFS];
    for (int i = 0; i < n; i++) {
        host[i] = calloc(1, bufs[i].bytes ? bufs[i].bytes : 1);
        if (!host[i] || dev_alloc(d, bufs[i].bytes ? bufs[i].bytes : 1, &dbuf[i], &err) != MT_OK)
            die("buffers", &err);
    }
    it->fam->fill(&s, it->m, 42, host);
    for (int i = 0; i < n; i++)
        if (dev_copy_to(d, dbuf[i], host[i], bufs[i].bytes, &err) != MT_OK)
            die("upload", &err);
    kern_exec *e = NULL;
    if (kern_exec_open(d, it->fam, &s, it->m, NULL, &e, &err) != MT_OK)
        die(it->key, &err);
    if (run_sync(e, &s, it->m, dbuf, &err) != MT_OK) /* warm-up */
        die(it->key, &err);
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        if (bench_limits_flush(l->probe, &err) != MT_OK) /* nothing stays cached */
            die("flush", &err);
        double t0 = mt_now_ms();
        if (run_sync(e, &s, it->m, dbuf, &err) != MT_OK)
            die(it->key, &err);
        t[r] = mt_now_ms() - t0;
    }
    for (int i = 1; i < reps; i++) /* insertion sort for the median */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    double ms = t[reps / 2], flops, bytes;
    it->fam->cost(&s, it->m, &flops, &bytes);
    double gbps = bytes / (ms * 1e6), gfl = flops / (ms * 1e6);
    char ck[128];
    kern_config_key(kern_family_impl(it->fam, dev_get_props(d)->backend), kern_exec_config(e),
                    ck, sizeof ck);
    printf("%-12s %-14s %5lld %-28s %9.3f %8.2f %6.3f%s %8.2f %6.3f%s\n", it->fam->name,
           it->key, (long long)it->m, ck, ms, gbps, gbps / l->gbps, it->bw_bound ? "*" : " ",
           gfl, gfl / l->gflops, it->bw_bound ? " " : "*");
    free(t);
    kern_exec_close(e);
    for (int i = 0; i < n; i++) {
        free(host[i]);
        dev_free(d, dbuf[i]);
    }
}

int main(int argc, char **argv)
{
    const char *spec = "cpu";
    int reps = 5;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            spec = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: bench_attn [--device cpu|cpu:T] [--reps N] [--only FAMILY]\n");
            return 2;
        }
    }
    if (reps < 1)
        reps = 1;
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    if (dev_open(spec, NULL, &d, &err) != MT_OK)
        die(spec, &err);
    const dev_props *p = dev_get_props(d);
    if (p->backend != DEV_BACKEND_CPU) {
        fprintf(stderr, "bench_attn: the limits are measured with cpu kernels; use cpu\n");
        return 2;
    }
    limits l = {0};
    bench_spread bw, fma;
    if (bench_limits_open(d, &l.probe, &err) != MT_OK ||
        bench_limits_bandwidth(l.probe, 5, &bw, &err) != MT_OK ||
        bench_limits_fma(l.probe, &fma, &err) != MT_OK)
        die("limits", &err);
    l.gbps = bw.median;
    l.gflops = fma.median;
    printf("device %s (%s, %d threads): measured read bandwidth %.1f GB/s (p10 %.1f, p90 %.1f), "
           "fp32 FMA peak %.1f GFLOP/s (p10 %.1f, p90 %.1f)\n", p->spec, p->name,
           p->compute_units, bw.median, bw.p10, bw.p90, fma.median, fma.p10, fma.p90);
    printf("%-12s %-14s %5s %-28s %9s %8s %7s %8s %7s\n", "family", "shape", "M", "config",
           "ms", "GB/s", "of bw", "GFLOP/s", "of pk");
    static const item items[] = {
        {&fam_mla_decode, "glm5.2", 1, true},           /* DSA: 2048 of 4096 tokens */
        {&fam_mla_decode, "glm5.2-dense", 1, true},
        {&fam_mla_decode, "glm5.2-fp8", 1, true},
        {&fam_mla_decode, "glm5.2", 6, true},           /* MTP: 6 draft tokens */
        {&fam_dsa_indexer, "glm5.2", 1, true},          /* 8192 tokens */
        {&fam_dsa_indexer, "glm5.2-fp8", 1, true},
        {&fam_rope, "glm5.2", 256, true},
        {&fam_mla_prefill, "glm5.2", 256, false},       /* 256 new after 1024 cached */
        {&fam_mla_prefill, "glm5.2-fp8", 256, false},
    };
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
        if (!only || !strcmp(only, items[i].fam->name))
            bench_one(d, &l, &items[i], reps);
    printf("(*) the limit that bounds the kernel: bandwidth for decode-like calls, FLOP/s for "
           "prefill\n");
    bench_limits_close(l.probe);
    dev_close(d);
    return 0;
}
