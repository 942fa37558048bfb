/* bench_attn.c: GLM-5.2's attention kernels (mla_decode, mla_prefill,
 * dsa_indexer, rope) at GLM-5.2 dims on the cpu backend, against limits
 * measured in the same run through the same backend and compiler: memory
 * read bandwidth (a streaming-sum kernel over a buffer far larger than the
 * last-level cache, bench/lib/limits.h) and the compute peaks: fp32 FMA
 * (12 independent vector FMA chains per work item) and, where the CPU has
 * AVX512_BF16, bf16 dot products (the same with vdpbf16ps: two multiply-adds
 * per lane and instruction).
 * Prints time, achieved bandwidth and FLOP/s (the family's cost model:
 * minimum bytes and flops) and their fractions of the limits; the one that
 * bounds each kernel is marked (*): bandwidth for decode-like calls,
 * FLOP/s for prefill. Caches are flushed between timed runs.
 *
 * The compute limit of a kernel is the time its flops take at the peaks of
 * the instructions it runs them with: on an AVX512_BF16 CPU the cpu kernels
 * of mla_decode (the score GEMM, (L+R)/(2L+R) of the flops) and dsa_indexer
 * (the q.k products) use vdpbf16ps, the rest fp32 FMA; "of pk" is that
 * time over the kernel's. A fraction above 1 is a bug.
 *
 * On a shared machine other processes take cycles from probes and kernels
 * alike, so both are timed the same way: launches of 64 short work items
 * (a few ms), repeated (the peak probes before the first and after every
 * kernel), and each kernel's fastest run is compared with the fastest
 * probe. The median time and the load average before and after are printed
 * too. The table is printed at the end.
 *
 * On a GPU (--device cuda|hip) the same calls run with the device's
 * defaults, timed with device events, each after a 1 GiB read that leaves
 * nothing in L2; the bandwidth limit is the probe kernels' (limits.h: the
 * faster of a read and a copy of 1 GiB), and the compute limit the bf16
 * matrix peak given with --peak-gflops (measured outside, e.g. a large
 * torch.matmul; without it "of pk" is not printed).
 *
 * Usage: bench_attn [--device cpu|cpu:T|cuda|hip] [--reps N] [--only FAMILY [--config KEY]]
 *                   [--peak-gflops G] [--json]
 * (--config: that config instead of the default, for the --only family;
 * --json: one object for the limits, then one per call). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "kernels/attn/attn_common.h"
#include "bench/lib/limits.h"
#include "kernels/core/exec.h"

extern const kern_family fam_mla_decode, fam_mla_prefill, fam_dsa_indexer, fam_rope;

static void die(const char *what, const mt_err *err)
{
    fprintf(stderr, "bench_attn: %s: %s\n", what, err->msg);
    exit(1);
}

/* The limits of this run: read bandwidth (p90 of its probe) and the best
 * fp32 FMA and bf16 dot rates of n_probe short probes (bf16 0: none); on
 * a GPU the matrix peak the caller gave for both (0: none). */
typedef struct limits {
    bench_limits *probe;
    double gbps, gflops, bf16_gflops;
    int n_probe;
    bool gpu;
    dev_event *e0, *e1; /* GPU: the timed call's events */
} limits;

/* Twenty launches of each probe (about 2 ms each); keeps the best of all
 * so far. Nothing on a GPU. */
static void probe_peaks(limits *l)
{
    if (l->gpu)
        return;
    mt_err err = MT_ERR_INIT;
    bench_peaks pk;
    if (bench_limits_peaks(l->probe, 20, &pk, &err) != MT_OK)
        die("peak probes", &err);
    l->gflops = pk.fma;
    l->bf16_gflops = pk.bf16;
    l->n_probe += 20;
}

/* One result line, printed once every limit is known. */
typedef struct row {
    const char *fam, *key;
    int64_t m;
    bool bw_bound;
    double bf16_share;
    char config[128];
    double ms_median, ms_best, flops, bytes;
} row;

/* ---- one family call -------------------------------------------------------------------- */

typedef struct item {
    const kern_family *fam;
    const char *key;
    int64_t m;
    bool bw_bound;
    double bf16_share; /* of the flops, run as bf16 dot products where the CPU can */
} item;

/* One call through the executor, waited for. */
static mt_status run_sync(kern_exec *e, const kern_shape *s, int64_t m, void *const *bufs,
                          mt_err *err)
{
    mt_status st = kern_exec_run(e, s, m, bufs, err);
    return st == MT_OK ? dev_synchronize(kern_exec_device(e), err) : st;
}

static void bench_one(dev_device *d, limits *l, const item *it, int reps, const char *config,
                      row *out)
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
    kern_config cfg;
    if (config && kern_config_parse(kern_family_impl(it->fam, dev_get_props(d)->backend), config,
                                    &cfg, &err) != MT_OK)
        die(config, &err);
    kern_exec *e = NULL;
    if (kern_exec_open(d, it->fam, &s, it->m, config ? &cfg : NULL, &e, &err) != MT_OK)
        die(it->key, &err);
    if (run_sync(e, &s, it->m, dbuf, &err) != MT_OK) /* warm-up */
        die(it->key, &err);
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        if (bench_limits_flush(l->probe, &err) != MT_OK) /* nothing stays cached */
            die("flush", &err);
        if (l->gpu) { /* the call alone, between events on the device's stream */
            if (dev_event_record(d, l->e0, &err) != MT_OK ||
                kern_exec_run(e, &s, it->m, dbuf, &err) != MT_OK ||
                dev_event_record(d, l->e1, &err) != MT_OK || dev_synchronize(d, &err) != MT_OK ||
                dev_event_elapsed_ms(d, l->e0, l->e1, &t[r], &err) != MT_OK)
                die(it->key, &err);
            continue;
        }
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
    *out = (row){.fam = it->fam->name, .key = it->key, .m = it->m, .bw_bound = it->bw_bound,
                  .bf16_share = it->bf16_share, .ms_median = t[reps / 2], .ms_best = t[0]};
    it->fam->cost(&s, it->m, &out->flops, &out->bytes);
    kern_config_key(kern_family_impl(it->fam, dev_get_props(d)->backend), kern_exec_config(e),
                    out->config, sizeof out->config);
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
    const char *only = NULL, *config = NULL;
    double peak_gflops = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            spec = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--config") && i + 1 < argc)
            config = argv[++i];
        else if (!strcmp(argv[i], "--peak-gflops") && i + 1 < argc)
            peak_gflops = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else {
            fprintf(stderr, "usage: bench_attn [--device cpu|cpu:T|cuda|hip] [--reps N] "
                    "[--only FAMILY [--config KEY]] [--peak-gflops G] [--json]\n");
            return 2;
        }
    }
    if (reps < 1)
        reps = 1;
    if (config && !only) {
        fprintf(stderr, "bench_attn: --config needs --only FAMILY\n");
        return 2;
    }
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    if (dev_open(spec, NULL, &d, &err) != MT_OK)
        die(spec, &err);
    const dev_props *p = dev_get_props(d);
    const bool gpu = p->backend == DEV_BACKEND_HIP || p->backend == DEV_BACKEND_CUDA;
    if ((p->backend != DEV_BACKEND_CPU && !gpu) || p->compile_only) {
        fprintf(stderr, "bench_attn: %s: the limits are measured with cpu kernels or on a GPU; "
                "use cpu, cuda or hip (with a GPU present)\n", p->spec);
        return 2;
    }
    double load0[3] = {0}, load1[3] = {0};
    getloadavg(load0, 3);
    limits l = {.gpu = gpu};
    bench_spread bw;
    if (bench_limits_open(d, &l.probe, &err) != MT_OK ||
        bench_limits_bandwidth(l.probe, 5, &bw, &err) != MT_OK)
        die("limits", &err);
    if (gpu && (dev_event_create(d, &l.e0, &err) != MT_OK ||
                dev_event_create(d, &l.e1, &err) != MT_OK))
        die("events", &err);
    l.gbps = bw.p90;
    if (gpu)
        l.gflops = l.bf16_gflops = peak_gflops;
    probe_peaks(&l);
    /* bf16 shares: mla_decode's score GEMM, 2 (L+R) of 2 (2L+R) flops per
     * token and head; dsa_indexer's q.k, 2 ID of 2 ID + 2. */
    const double dec = 576.0 / 1088.0, idx = 256.0 / 258.0;
    const item items[] = {
        {&fam_mla_decode, "glm5.2", 1, true, dec},      /* DSA: 2048 of 4096 tokens */
        {&fam_mla_decode, "glm5.2-dense", 1, true, dec},
        {&fam_mla_decode, "glm5.2-fp8", 1, true, dec},
        {&fam_mla_decode, "glm5.2", 6, true, dec},      /* MTP: 6 draft tokens */
        {&fam_dsa_indexer, "glm5.2", 1, true, idx},     /* 8192 tokens */
        {&fam_dsa_indexer, "glm5.2-fp8", 1, true, idx},
        {&fam_rope, "glm5.2", 256, true, 0},
        {&fam_mla_prefill, "glm5.2", 256, false, 0},    /* 256 new after 1024 cached */
        {&fam_mla_prefill, "glm5.2-fp8", 256, false, 0},
    };
    enum { N_ITEMS = sizeof items / sizeof items[0] };
    row rows[N_ITEMS];
    int n_rows = 0;
    for (size_t i = 0; i < N_ITEMS; i++)
        if (!only || !strcmp(only, items[i].fam->name)) {
            bench_one(d, &l, &items[i], reps, config, &rows[n_rows++]);
            probe_peaks(&l);
        }
    getloadavg(load1, 3);
    if (json) {
        char pat[160];
        double rd = 0, cp = 0;
        bench_limits_pattern_name(l.probe, pat, sizeof pat);
        bench_limits_gpu_rates(l.probe, &rd, &cp);
        printf("{\"limits\":{\"device\":\"%s\",\"name\":\"%s\",\"bw_GBps\":%.3f,"
               "\"bw_p10\":%.3f,\"bw_median\":%.3f,\"read_kernel_GBps\":%.3f,"
               "\"copy_kernel_GBps\":%.3f,\"probe\":\"%s\",\"peak_GFLOPs\":%.1f,"
               "\"bf16_peak_GFLOPs\":%.1f}}\n", p->spec, p->name, bw.p90, bw.p10, bw.median,
               rd, cp, pat, l.gflops, l.bf16_gflops);
        for (int i = 0; i < n_rows; i++) {
            const row *r = &rows[i];
            double gbps = r->bytes / (r->ms_best * 1e6), gfl = r->flops / (r->ms_best * 1e6);
            double share = l.bf16_gflops > 0 ? r->bf16_share : 0;
            double limit_ms = l.gflops > 0 ? r->flops * (1 - share) / (l.gflops * 1e6) +
                              (share > 0 ? r->flops * share / (l.bf16_gflops * 1e6) : 0) : 0;
            printf("{\"family\":\"%s\",\"shape\":\"%s\",\"M\":%lld,\"config\":\"%s\","
                   "\"ms_median\":%.5f,\"ms_best\":%.5f,\"GBps\":%.3f,\"of_bw\":%.4f,"
                   "\"GFLOPs\":%.3f,\"of_peak\":%.4f,\"bound\":\"%s\",\"reps\":%d}\n",
                   r->fam, r->key, (long long)r->m, r->config, r->ms_median, r->ms_best, gbps,
                   l.gbps > 0 ? gbps / l.gbps : 0, gfl, limit_ms > 0 ? limit_ms / r->ms_best : 0,
                   r->bw_bound ? "bandwidth" : "compute", reps);
        }
        dev_event_destroy(d, l.e0);
        dev_event_destroy(d, l.e1);
        bench_limits_close(l.probe);
        dev_close(d);
        return 0;
    }
    printf("device %s (%s, %d threads), load average %.2f before, %.2f after\n", p->spec,
           p->name, p->compute_units, load0[0], load1[0]);
    printf("read bandwidth %.1f GB/s (p90; p10 %.1f, median %.1f); peaks (best of %d probes): "
           "fp32 FMA %.1f GFLOP/s, bf16 dot %.1f GFLOP/s%s\n", bw.p90, bw.p10, bw.median,
           l.n_probe, l.gflops, l.bf16_gflops, l.bf16_gflops > 0 ? "" : " (no AVX512_BF16)");
    printf("%-12s %-14s %5s %-28s %9s %9s %8s %7s %8s %7s\n", "family", "shape", "M", "config",
           "ms med", "ms best", "GB/s", "of bw", "GFLOP/s", "of pk");
    for (int i = 0; i < n_rows; i++) {
        const row *r = &rows[i];
        double gbps = r->bytes / (r->ms_best * 1e6), gfl = r->flops / (r->ms_best * 1e6);
        /* The flops' time at the peaks of the instructions that run them. */
        double share = l.bf16_gflops > 0 ? r->bf16_share : 0;
        double limit_ms = l.gflops > 0 ? r->flops * (1 - share) / (l.gflops * 1e6) +
                          (share > 0 ? r->flops * share / (l.bf16_gflops * 1e6) : 0) : 0;
        printf("%-12s %-14s %5lld %-28s %9.3f %9.3f %8.2f %6.3f%s %8.2f %6.3f%s%s\n", r->fam,
               r->key, (long long)r->m, r->config, r->ms_median, r->ms_best, gbps,
               gbps / l.gbps, r->bw_bound ? "*" : " ", gfl, limit_ms / r->ms_best,
               r->bw_bound ? " " : "*",
               gbps > l.gbps || limit_ms > r->ms_best
                   ? "  (above a limit: a probe never had every thread to itself; rerun)" : "");
    }
    printf("(*) the limit that bounds the kernel: bandwidth for decode-like calls, FLOP/s for "
           "prefill; GB/s and GFLOP/s from the best time; of pk: the flops' time at the fp32 "
           "FMA peak (bf16 dot peak for the bf16 share) over the best time\n");
    dev_event_destroy(d, l.e0);
    dev_event_destroy(d, l.e1);
    bench_limits_close(l.probe);
    dev_close(d);
    return 0;
}
