/* moe_bench.c: the MoE GEMM benchmark (see moe_bench.h). */
#define _GNU_SOURCE
#include "moe_bench.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../common/clock.h"
#include "../common/rng.h"
#include "moe.h"
#include "moe_common.h"
#include "runner.h"

/* ---- memory bandwidth --------------------------------------------------- */

typedef struct bw_job {
    const uint64_t *p;
    size_t n;
    uint64_t sink;
} bw_job;

static void *bw_read(void *arg)
{
    bw_job *j = arg;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) {
        a ^= j->p[i];
        b ^= j->p[i + 1];
        c ^= j->p[i + 2];
        d ^= j->p[i + 3];
    }
    j->sink = a ^ b ^ c ^ d;
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

double moe_bench_mem_bw(int threads)
{
    const size_t bytes = (size_t)1 << 30;
    uint64_t *buf = malloc(bytes);
    if (!buf)
        return 0;
    memset(buf, 1, bytes);
    if (threads < 1)
        threads = 1;
    if (threads > 64)
        threads = 64;
    double r[5];
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64];
        bw_job jobs[64];
        size_t per = bytes / 8 / (size_t)threads;
        double t0 = mt_now_ms();
        for (int i = 0; i < threads; i++) {
            jobs[i] = (bw_job){buf + per * (size_t)i, per, 0};
            pthread_create(&th[i], NULL, bw_read, &jobs[i]);
        }
        for (int i = 0; i < threads; i++)
            pthread_join(th[i], NULL);
        r[rep] = (double)bytes / ((mt_now_ms() - t0) * 1e6);
    }
    free(buf);
    return median(r, 5);
}

/* ---- the benchmark ------------------------------------------------------ */

enum { BM = 128, MAX_CFG = 12 };

typedef struct gemm_bench {
    const char *fam;
    bool up;
    moe_stage *st[MAX_CFG];
    int n_cfg;
} gemm_bench;

/* The cpu sweep: register tile, K blocking, thread partition, prefetch. */
static const int cpu_sweep[][MOE_CPU_NPARAMS] = {
    {1, 1, 65536, 64, 0}, {1, 1, 65536, 128, 0}, {2, 1, 65536, 64, 0}, {2, 1, 65536, 128, 0},
    {4, 1, 65536, 64, 0}, {1, 1, 65536, 64, 512}, {1, 2, 65536, 64, 0}, {2, 2, 65536, 64, 0},
    {1, 4, 1024, 64, 0},  {2, 4, 1024, 64, 0},    {1, 8, 2048, 64, 0},
};

static mt_status fill_dev(dev_device *d, void *dst, int64_t rows, int64_t k, mt_rng *r,
                          bool scales, mt_err *err)
{
    /* Packed bytes or scale codes, generated in chunks of rows. */
    const int64_t chunk_rows = 4096;
    int64_t rb = scales ? k / 32 : k / 2;
    uint8_t *tmp = malloc((size_t)(chunk_rows * (k / 2 + k / 32)));
    if (!tmp)
        return mt_fail(err, MT_E_NOMEM, "bench: out of memory");
    mt_status s = MT_OK;
    for (int64_t r0 = 0; r0 < rows && s == MT_OK; r0 += chunk_rows) {
        int64_t n = rows - r0 < chunk_rows ? rows - r0 : chunk_rows;
        uint8_t *pk = tmp, *sc = tmp + n * k / 2;
        moe_gen_mxfp4(r, pk, sc, n, k);
        s = dev_copy_to(d, (uint8_t *)dst + r0 * rb, scales ? sc : pk, (size_t)(n * rb), err);
    }
    free(tmp);
    return s;
}

mt_status moe_bench_run(dev_device *d, const moe_bench_opts *o, FILE *out, mt_err *err)
{
    const kern_family *fu = kern_family_find("moe_gemm_up");
    kern_shape s;
    mt_status st = kern_shape_parse(fu, o->shape, &s, NULL, err);
    if (st != MT_OK)
        return st;
    int64_t H = kern_shape_get(fu, &s, "H"), I = kern_shape_get(fu, &s, "I");
    int64_t E = kern_shape_get(fu, &s, "E"), topk = kern_shape_get(fu, &s, "topk");
    bool a4 = kern_shape_get(fu, &s, "a") == KERN_DT_MXFP4;
    const dev_props *p = dev_get_props(d);
    bool cpu = p->backend == DEV_BACKEND_CPU;
    double max_ms = o->max_ms > 0 ? o->max_ms : 1500;
    int64_t maxm = 1;
    for (int i = 0; i < o->n_ms; i++)
        maxm = o->ms[i] > maxm ? o->ms[i] : maxm;
    int64_t maxp = maxm * topk, cap = moe_cap_rows(maxp, E, BM);

    gemm_bench gb[2] = {{"moe_gemm_up", true, {0}, 0}, {"moe_gemm_down", false, {0}, 0}};
    bool want[2] = {strcmp(o->family, "moe_gemm_down") != 0, strcmp(o->family, "moe_gemm_up") != 0};

    void *w13 = NULL, *s13 = NULL, *w2 = NULL, *s2 = NULL, *x = NULL, *h = NULL, *y = NULL;
    void *ids = NULL, *sorted = NULL, *tile = NULL, *total = NULL, *tw = NULL;
    int32_t *hids = malloc((size_t)maxp * 4), *hsorted = malloc((size_t)cap * 4);
    int32_t *htile = malloc((size_t)(cap / BM) * 4), htotal = 0;
    float *htw = malloc((size_t)maxp * 4);
    uint16_t *hx = malloc((size_t)(maxm * (H > I ? H : I)) * 2);
    dev_event *e0 = NULL, *e1 = NULL;
    mt_rng r;
    mt_rng_seed(&r, o->seed ? o->seed : mt_seed_fresh());
    if (!hids || !hsorted || !htile || !htw || !hx) {
        st = mt_fail(err, MT_E_NOMEM, "bench: out of memory");
        goto out;
    }
    struct { void **p; size_t n; } al[] = {
        {&w13, (size_t)(E * 2 * I * H / 2)}, {&s13, (size_t)(E * 2 * I * H / 32)},
        {&w2, (size_t)(E * H * I / 2)},      {&s2, (size_t)(E * H * I / 32)},
        {&x, (size_t)(maxm * H) * 2},        {&h, (size_t)(maxp * I) * 2},
        {&y, (size_t)(maxm * H) * 4},        {&ids, (size_t)maxp * 4},
        {&sorted, (size_t)cap * 4},          {&tile, (size_t)(cap / BM) * 4},
        {&total, 4},                         {&tw, (size_t)maxp * 4},
    };
    for (size_t i = 0; i < sizeof al / sizeof al[0]; i++)
        if ((st = dev_alloc(d, al[i].n, al[i].p, err)) != MT_OK)
            goto out;
    if ((st = fill_dev(d, w13, E * 2 * I, H, &r, false, err)) != MT_OK ||
        (st = fill_dev(d, s13, E * 2 * I, H, &r, true, err)) != MT_OK ||
        (st = fill_dev(d, w2, E * H, I, &r, false, err)) != MT_OK ||
        (st = fill_dev(d, s2, E * H, I, &r, true, err)) != MT_OK)
        goto out;
    moe_gen_bf16(&r, hx, maxm * H, 1.0f);
    if ((st = dev_copy_to(d, x, hx, (size_t)(maxm * H) * 2, err)) != MT_OK)
        goto out;
    moe_gen_bf16(&r, hx, maxm * (H > I ? H : I), 1.0f);
    for (int64_t i = 0; i < maxp && st == MT_OK; i += maxm)
        st = dev_copy_to(d, (uint16_t *)h + i * I, hx,
                         (size_t)((maxp - i < maxm ? maxp - i : maxm) * I) * 2, err);
    if (st != MT_OK || (st = dev_event_create(d, &e0, err)) != MT_OK ||
        (st = dev_event_create(d, &e1, err)) != MT_OK)
        goto out;

    /* Stages: the default config first, then the sweep (cpu). */
    for (int g = 0; g < 2; g++) {
        if (!want[g])
            continue;
        char key[256];
        if (gb[g].up)
            snprintf(key, sizeof key, "H=%lld,I=%lld,E=%lld,topk=%lld,a=%s,cat=1,bm=%d,skew=0",
                     (long long)H, (long long)I, (long long)E, (long long)topk,
                     a4 ? "mxfp4" : "bf16", BM);
        else
            snprintf(key, sizeof key, "H=%lld,I=%lld,E=%lld,topk=%lld,a=%s,comb=0,bm=%d,skew=0",
                     (long long)H, (long long)I, (long long)E, (long long)topk,
                     a4 ? "mxfp4" : "bf16", BM);
        if ((st = moe_stage_create(d, gb[g].fam, key, NULL, 1, &gb[g].st[0], err)) != MT_OK)
            goto out;
        gb[g].n_cfg = 1;
        int n_sweep = o->sweep && cpu ? (int)(sizeof cpu_sweep / sizeof cpu_sweep[0]) : 0;
        for (int c = 0; c < n_sweep && gb[g].n_cfg < MAX_CFG; c++) {
            kern_config cfg = {.n = MOE_CPU_NPARAMS};
            memcpy(cfg.v, cpu_sweep[c], sizeof cpu_sweep[c]);
            if (!memcmp(cfg.v, moe_stage_config(gb[g].st[0])->v, sizeof cpu_sweep[c]))
                continue; /* the default itself */
            mt_err e2 = MT_ERR_INIT;
            if (moe_stage_create(d, gb[g].fam, key, &cfg, 1, &gb[g].st[gb[g].n_cfg], &e2) == MT_OK)
                gb[g].n_cfg++;
        }
    }

    int threads = p->compute_units > 0 ? p->compute_units : 1;
    if (!o->json)
        fprintf(out, "%-14s %5s %10s %10s %9s %9s %8s %10s %8s  %s\n", "family", "M",
                "default ms", "best ms", "GB/s", "GFLOP/s", "of bw", "mem GB/s", "speedup",
                "best config");
    for (int mi = 0; mi < o->n_ms; mi++) {
        int64_t M = o->ms[mi], P = M * topk;
        double bw = 0;
        if (cpu)
            bw = moe_bench_mem_bw(threads);
        else if (kern_device_bandwidth(d, (size_t)1 << 30, &bw, NULL) != MT_OK)
            bw = 0;
        for (int g = 0; g < 2; g++) {
            if (!want[g])
                continue;
            int64_t K = gb[g].up ? H : I, N = gb[g].up ? 2 * I : H;
            double best = 0, dflt = 0, experts_sum = 0;
            int best_c = 0, nc = gb[g].n_cfg;
            int64_t experts_n = 0;
            /* Round robin over the configs, one fresh routing per round, so
             * every config sees the same routings and the same machine
             * load (other processes come and go). */
            enum { MAX_REPS = 100 };
            double *t = malloc(sizeof(double) * (size_t)(nc * MAX_REPS));
            if (!t) {
                st = mt_fail(err, MT_E_NOMEM, "bench: out of memory");
                goto out;
            }
            int n = 0;
            double spent = 0;
            while (n < MAX_REPS && (n < 3 || spent < max_ms * nc)) {
                moe_gen_ids(&r, M, (int)topk, (int)E, MOE_SKEW_UNIFORM, hids);
                moe_align_ref(hids, P, (int)E, BM, hsorted, htile, &htotal);
                for (int64_t q = 0; q < P; q++)
                    htw[q] = 1.0f / (float)topk;
                bool used[1024] = {0};
                int nu = 0;
                for (int64_t q = 0; q < P; q++)
                    if (!used[hids[q]]) {
                        used[hids[q]] = true;
                        nu++;
                    }
                experts_sum += nu;
                experts_n++;
                int64_t capm = moe_cap_rows(P, E, BM);
                if ((st = dev_copy_to(d, ids, hids, (size_t)P * 4, err)) != MT_OK ||
                    (st = dev_copy_to(d, sorted, hsorted, (size_t)capm * 4, err)) != MT_OK ||
                    (st = dev_copy_to(d, tile, htile, (size_t)(capm / BM) * 4, err)) != MT_OK ||
                    (st = dev_copy_to(d, total, &htotal, 4, err)) != MT_OK ||
                    (st = dev_copy_to(d, tw, htw, (size_t)P * 4, err)) != MT_OK) {
                    free(t);
                    goto out;
                }
                void *bu[] = {x, ids, sorted, tile, total, w13, s13, h};
                void *bd[] = {h, ids, sorted, tile, total, tw, w2, s2, y};
                for (int c = 0; c < nc; c++) {
                    double ms = 0;
                    if ((st = dev_event_record(d, e0, err)) != MT_OK ||
                        (st = moe_stage_run(gb[g].st[c], M, gb[g].up ? bu : bd, err)) != MT_OK ||
                        (st = dev_event_record(d, e1, err)) != MT_OK ||
                        (st = dev_event_elapsed_ms(d, e0, e1, &ms, err)) != MT_OK) {
                        free(t);
                        goto out;
                    }
                    t[c * MAX_REPS + n] = ms;
                    spent += ms;
                }
                n++;
            }
            for (int c = 0; c < nc; c++) {
                double med = median(t + c * MAX_REPS, n);
                if (c == 0)
                    dflt = best = med;
                if (med < best) {
                    best = med;
                    best_c = c;
                }
            }
            free(t);
            double experts = experts_sum / (double)experts_n;
            double wbytes = experts * (double)N * (double)K * (0.5 + 1.0 / 32);
            double flops = 2.0 * (double)P * (double)N * (double)K;
            double gbs = wbytes / (best * 1e6), gfl = flops / (best * 1e6);
            char ck[256];
            kern_config_key(kern_family_impl(moe_stage_family(gb[g].st[best_c]), p->backend),
                            moe_stage_config(gb[g].st[best_c]), ck, sizeof ck);
            if (o->json)
                fprintf(out,
                        "{\"family\":\"%s\",\"shape\":\"%s\",\"device\":\"%s\",\"M\":%lld,"
                        "\"default_ms\":%.4f,\"best_ms\":%.4f,\"weight_GBps\":%.3f,"
                        "\"GFLOPs\":%.3f,\"mem_bw_GBps\":%.3f,\"fraction_of_bw\":%.4f,"
                        "\"speedup\":%.4f,\"experts\":%.2f,\"best_config\":\"%s\"}\n",
                        gb[g].fam, o->shape, p->spec, (long long)M, dflt, best, gbs, gfl, bw,
                        bw > 0 ? gbs / bw : 0, dflt / best, experts, ck);
            else
                fprintf(out, "%-14s %5lld %10.3f %10.3f %9.2f %9.1f %8.2f %10.2f %8.2f  %s\n",
                        gb[g].fam, (long long)M, dflt, best, gbs, gfl, bw > 0 ? gbs / bw : 0, bw,
                        dflt / best, ck);
            fflush(out);
        }
    }
out:
    for (int g = 0; g < 2; g++)
        for (int c = 0; c < gb[g].n_cfg; c++)
            moe_stage_destroy(gb[g].st[c]);
    dev_event_destroy(d, e0);
    dev_event_destroy(d, e1);
    void *bufs[] = {w13, s13, w2, s2, x, h, y, ids, sorted, tile, total, tw};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        dev_free(d, bufs[i]);
    free(hids);
    free(hsorted);
    free(htile);
    free(htw);
    free(hx);
    return st;
}
