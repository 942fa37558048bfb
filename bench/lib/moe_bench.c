/* moe_bench.c: the MoE benchmark: the served layer and the expert GEMM
 * stages (see moe_bench.h). */
#define _GNU_SOURCE
#include "moe_bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/rng.h"
#include "kernels/core/exec.h"
#include "kernels/moe/moe_common.h"
#include "model/moe_layer.h"
#include "limits.h"
#include "moe_dump.h"

/* ---- the problem ---------------------------------------------------------- */

enum { BM = 128, MAX_CFG = 16, MAX_REPS = 100 };

/* Everything one run allocates: device weights and activations of the
 * largest M, host staging, events. */
typedef struct bench {
    dev_device *d;
    const dev_props *p;
    const moe_bench_opts *o;
    FILE *out;
    mt_rng r;
    moe_dims dims;
    int64_t H, I, E, topk, S, maxm;
    double max_ms;
    int max_reps; /* timed calls per (config, M), 3..MAX_REPS */
    bench_limits *lim;
    bool int_dot; /* a4w4 / a8w4: the integer dot tiles (else a16w4) */
    int wl;       /* the expert weights' layout (bench_wl) */
    bool layer;   /* the layer's own buffers (router gate, shared expert) hold data */
    char pattern[96]; /* the probe's fastest read pattern, in words (cpu; else empty) */
    void *w13, *s13, *w2, *s2, *gate, *bias, *sh_w13, *sh_s13, *sh_w2, *sh_s2;
    void *x, *h, *y, *ids, *sorted, *tile, *total, *tw;
    int32_t *hids, *hsorted, *htile;
    float *htw;
    uint16_t *hx;
    dev_event *e0, *e1;
} bench;

/* rows x k random MXFP4 weights in layout wl into w and s (empty at wl=1,
 * where the scales sit in w: moe_w4_group16), generated in chunks of rows
 * (a multiple of 16, so each chunk groups on its own). */
static mt_status fill_w4(bench *b, void *w, void *s, int64_t rows, int64_t k, mt_err *err)
{
    const int64_t chunk_rows = 4096;
    const int wl = b->wl;
    uint8_t *tmp = malloc((size_t)(chunk_rows * (k / 2 + k / 32)));
    uint8_t *grouped = wl == 1 ? malloc((size_t)moe_w4_bytes(1, chunk_rows, k)) : NULL;
    mt_status st = MT_OK;
    if (!tmp || (wl == 1 && !grouped))
        st = mt_fail(err, MT_E_NOMEM, "bench: out of memory");
    for (int64_t r0 = 0; r0 < rows && st == MT_OK; r0 += chunk_rows) {
        int64_t n = rows - r0 < chunk_rows ? rows - r0 : chunk_rows;
        uint8_t *pk = tmp, *sc = tmp + n * k / 2;
        moe_gen_mxfp4(&b->r, pk, sc, n, k);
        if (wl == 1) {
            moe_w4_group16(pk, sc, n, k, grouped);
            st = dev_copy_to(b->d, (uint8_t *)w + moe_w4_bytes(1, r0, k), grouped,
                             (size_t)moe_w4_bytes(1, n, k), err);
        } else {
            st = dev_copy_to(b->d, (uint8_t *)w + r0 * k / 2, pk, (size_t)(n * k / 2), err);
            if (st == MT_OK)
                st = dev_copy_to(b->d, (uint8_t *)s + r0 * k / 32, sc, (size_t)(n * k / 32), err);
        }
    }
    free(tmp);
    free(grouped);
    return st;
}

/* Fresh activations x [M, H]: new routing for the layer. */
static mt_status fresh_x(bench *b, int64_t M, mt_err *err)
{
    moe_gen_bf16(&b->r, b->hx, M * b->H, 1.0f);
    return dev_copy_to(b->d, b->x, b->hx, (size_t)(M * b->H) * 2, err);
}

static mt_status setup(bench *b, bool layer, mt_err *err)
{
    b->layer = layer;
    int64_t H = b->H, I = b->I, E = b->E, S = b->S, maxp = b->maxm * b->topk;
    int64_t cap = moe_cap_rows(maxp, E, BM);
    b->hids = malloc((size_t)maxp * 4);
    b->hsorted = malloc((size_t)cap * 4);
    b->htile = malloc((size_t)(cap / BM) * 4);
    b->htw = malloc((size_t)maxp * 4);
    b->hx = malloc((size_t)(b->maxm * (H > I ? H : I)) * 2);
    if (!b->hids || !b->hsorted || !b->htile || !b->htw || !b->hx)
        return mt_fail(err, MT_E_NOMEM, "bench: out of memory");
    struct {
        void **p;
        size_t n;
    } al[] = {
        {&b->w13, (size_t)moe_w4_bytes(b->wl, E * 2 * I, H)},
        {&b->s13, (size_t)moe_w4_scale_bytes(b->wl, E * 2 * I, H)},
        {&b->w2, (size_t)moe_w4_bytes(b->wl, E * H, I)},
        {&b->s2, (size_t)moe_w4_scale_bytes(b->wl, E * H, I)},
        {&b->x, (size_t)(b->maxm * H) * 2},     {&b->h, (size_t)(maxp * I) * 2},
        /* y: the layer's [M, H] output, or stage 2's per-pair rows */
        {&b->y, (size_t)(maxp * H) * 4},        {&b->ids, (size_t)maxp * 4},
        {&b->sorted, (size_t)cap * 4},          {&b->tile, (size_t)(cap / BM) * 4},
        {&b->total, 4},                         {&b->tw, (size_t)maxp * 4},
        {&b->gate, layer ? (size_t)(E * H) * 2 : 0},
        {&b->bias, layer ? (size_t)E * 4 : 0},
        {&b->sh_w13, layer ? (size_t)moe_w4_bytes(b->wl, 2 * S, H) : 0},
        {&b->sh_s13, layer ? (size_t)moe_w4_scale_bytes(b->wl, 2 * S, H) : 0},
        {&b->sh_w2, layer ? (size_t)moe_w4_bytes(b->wl, H, S) : 0},
        {&b->sh_s2, layer ? (size_t)moe_w4_scale_bytes(b->wl, H, S) : 0},
    };
    mt_status st = MT_OK;
    /* Every buffer, the empty ones too (the layer's when it is not timed,
     * wl=1's scales): dev_alloc gives them a byte, and the kernels get a
     * pointer for every argument. */
    for (size_t i = 0; i < sizeof al / sizeof al[0] && st == MT_OK; i++)
        st = dev_alloc(b->d, al[i].n, al[i].p, err);
    if (st == MT_OK)
        st = fill_w4(b, b->w13, b->s13, E * 2 * I, H, err);
    if (st == MT_OK)
        st = fill_w4(b, b->w2, b->s2, E * H, I, err);
    if (st == MT_OK && layer) {
        uint16_t *g = malloc((size_t)(E * H) * 2);
        float *bias = malloc((size_t)E * 4);
        if (!g || !bias)
            st = mt_fail(err, MT_E_NOMEM, "bench: out of memory");
        if (st == MT_OK) {
            moe_gen_bf16(&b->r, g, E * H, 0.02f);
            for (int64_t e = 0; e < E; e++)
                bias[e] = mt_rng_uniform(&b->r, -0.01f, 0.01f);
            st = dev_copy_to(b->d, b->gate, g, (size_t)(E * H) * 2, err);
        }
        if (st == MT_OK)
            st = dev_copy_to(b->d, b->bias, bias, (size_t)E * 4, err);
        free(g);
        free(bias);
        if (st == MT_OK)
            st = fill_w4(b, b->sh_w13, b->sh_s13, 2 * S, H, err);
        if (st == MT_OK)
            st = fill_w4(b, b->sh_w2, b->sh_s2, H, S, err);
    }
    if (st == MT_OK)
        st = fresh_x(b, b->maxm, err);
    if (st == MT_OK) {
        /* The GEMM stages' h input: random bf16, filled a block at a time. */
        moe_gen_bf16(&b->r, b->hx, b->maxm * (H > I ? H : I), 1.0f);
        for (int64_t i = 0; i < maxp && st == MT_OK; i += b->maxm)
            st = dev_copy_to(b->d, (uint16_t *)b->h + i * I, b->hx,
                             (size_t)((maxp - i < b->maxm ? maxp - i : b->maxm) * I) * 2, err);
    }
    if (st == MT_OK)
        st = dev_event_create(b->d, &b->e0, err);
    if (st == MT_OK)
        st = dev_event_create(b->d, &b->e1, err);
    return st;
}

static void teardown(bench *b)
{
    dev_event_destroy(b->d, b->e0);
    dev_event_destroy(b->d, b->e1);
    void *bufs[] = {b->w13, b->s13, b->w2, b->s2, b->gate, b->bias, b->sh_w13, b->sh_s13,
                    b->sh_w2, b->sh_s2, b->x, b->h, b->y, b->ids, b->sorted, b->tile,
                    b->total, b->tw};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        dev_free(b->d, bufs[i]);
    free(b->hids);
    free(b->hsorted);
    free(b->htile);
    free(b->htw);
    free(b->hx);
}

static int count_experts(const int32_t *ids, int64_t n, int64_t E)
{
    bool used[4096] = {0};
    int nu = 0;
    for (int64_t q = 0; q < n; q++)
        if (ids[q] >= 0 && ids[q] < E && ids[q] < 4096 && !used[ids[q]]) {
            used[ids[q]] = true;
            nu++;
        }
    return nu;
}

/* One bandwidth sample between timed calls; 0 without limit probes. */
static mt_status sample_limit(bench *b, double *gbps, mt_err *err)
{
    *gbps = 0;
    return b->lim ? bench_limits_sample(b->lim, gbps, err) : MT_OK;
}

/* Appends size bytes at base to the piece list at[0:n], len[0:n] in pieces
 * of equal length near piece bytes (the last takes the rest), at most
 * BENCH_MAX_PIECES in all; the new count. */
static int add_pieces(const void **at, int64_t *len, int n, const void *base, int64_t size,
                      int64_t piece)
{
    int64_t np = (size + piece - 1) / piece, each = np ? size / np : 0;
    for (int64_t i = 0; i < np && n < BENCH_MAX_PIECES; i++, n++) {
        at[n] = (const uint8_t *)base + i * each;
        len[n] = i + 1 < np ? each : size - i * each;
    }
    return n;
}

/* Reads every weight byte once (cpu, with limit probes; else nothing), just
 * before a timed loop. On the Zen 5 VM memory left unread for some tens of
 * seconds reads about 10x slower the first time (the host's doing: a cold
 * kernel cache compiles for ~20 s between the fill and the first call, and
 * the first 100 layer calls ran 5-8x slow, improving as each expert got
 * read once; this pass read the 5.1 GB of expert weights at 6.5 GB/s, then
 * the calls ran at their usual speed from the first). A served model reads
 * each expert every few steps, so the timed calls should not pay it. */
static mt_status touch_weights(bench *b, mt_err *err)
{
    if (!b->lim || b->p->backend != DEV_BACKEND_CPU)
        return MT_OK;
    const int64_t piece = 1 << 20;
    struct {
        const void *p;
        int64_t n;
    } bufs[] = {
        {b->w13, moe_w4_bytes(b->wl, b->E * 2 * b->I, b->H)},
        {b->s13, moe_w4_scale_bytes(b->wl, b->E * 2 * b->I, b->H)},
        {b->w2, moe_w4_bytes(b->wl, b->E * b->H, b->I)},
        {b->s2, moe_w4_scale_bytes(b->wl, b->E * b->H, b->I)},
        {b->sh_w13, b->layer ? moe_w4_bytes(b->wl, 2 * b->S, b->H) : 0},
        {b->sh_s13, b->layer ? moe_w4_scale_bytes(b->wl, 2 * b->S, b->H) : 0},
        {b->sh_w2, b->layer ? moe_w4_bytes(b->wl, b->H, b->S) : 0},
        {b->sh_s2, b->layer ? moe_w4_scale_bytes(b->wl, b->H, b->S) : 0},
        {b->gate, b->layer ? b->E * b->H * 2 : 0},
    };
    const void **at = malloc(sizeof *at * BENCH_MAX_PIECES);
    int64_t *len = malloc(sizeof *len * BENCH_MAX_PIECES);
    mt_status st = at && len ? MT_OK : mt_fail(err, MT_E_NOMEM, "bench: out of memory");
    double ms = 0;
    /* One read per buffer: its pieces of 1 MiB (or more, for a buffer of
     * over BENCH_MAX_PIECES MiB) fit one list. */
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0] && st == MT_OK; i++) {
        int64_t each = (bufs[i].n + BENCH_MAX_PIECES - 1) / BENCH_MAX_PIECES;
        int n = add_pieces(at, len, 0, bufs[i].p, bufs[i].n, each > piece ? each : piece);
        st = bench_limits_read_pieces(b->lim, at, len, n, &ms, NULL, err);
    }
    free(at);
    free(len);
    return st;
}

/* The limit of each of n rounds from the n + 1 samples around them: the
 * better of the samples before (s[i]) and after (s[i + 1]) round i (noise
 * only lowers a probe; a round whose samples both read below its calls was
 * disturbed, and a paired figure above 1 says to run again). 0 without
 * probes. */
static void round_limits(const double *s, int n, double *lim)
{
    for (int i = 0; i < n; i++)
        lim[i] = s[i] > 0 && s[i + 1] > 0 ? (s[i] > s[i + 1] ? s[i] : s[i + 1]) : 0;
}

/* Each round's limit becomes the best of its own and its neighbours' (the
 * reads of three consecutive rounds): one probe sample that read low no
 * longer sets a round's limit below its calls (on the Xeon, with the
 * kernels at 0.95 of the limit, single low samples put a paired p90 at
 * 1.02), while a drift over several rounds still shows. */
static void widen_limits(double *lim, int n)
{
    double prev = 0;
    for (int i = 0; i < n; i++) {
        double cur = lim[i], best = cur;
        if (cur <= 0) {
            prev = cur;
            continue;
        }
        if (i > 0 && prev > best)
            best = prev;
        if (i + 1 < n && lim[i + 1] > best)
            best = lim[i + 1];
        prev = cur;
        lim[i] = best;
    }
}

/* Raises each round's limit (where it has one) to the rate of another read
 * of memory in that round where that read was faster; returns how many
 * rounds it raised, and the fastest rate in *best. */
static int raise_limits(double *lim, const double *rate, int n, double *best)
{
    int raised = 0;
    for (int i = 0; i < n; i++) {
        if (lim[i] > 0 && rate[i] > lim[i]) {
            lim[i] = rate[i];
            raised++;
        }
        *best = rate[i] > *best ? rate[i] : *best;
    }
    return raised;
}

/* ---- the served layer -------------------------------------------------------- */

typedef struct layer_result {
    bench_spread t;
    bench_spread bw; /* bandwidth samples interleaved with the calls */
    bench_spread paired; /* each call against the samples around it (widen_limits) */
    double experts;
} layer_result;

/* Weight bytes one call of the layer reads with nu routed experts. */
static double layer_bytes(const bench *b, double nu)
{
    double H = (double)b->H, I = (double)b->I, S = (double)b->S, E = (double)b->E;
    double per = 0.5 + 1.0 / 32;
    return nu * 3.0 * I * H * per + 3.0 * S * H * per + E * H * 2;
}

/* Times the layer at M: a fresh x (new routing) before every call; the
 * experts a call read come back from the router's own output. */
static mt_status time_layer(bench *b, const model_moe_kernels *k, model_moe_ws *ws, int64_t M,
                            layer_result *res, mt_err *err)
{
    moe_weights w = {.gate = b->gate, .bias = b->bias, .w13 = b->w13, .s13 = b->s13,
                     .w2 = b->w2, .s2 = b->s2, .sh_w13 = b->sh_w13, .sh_s13 = b->sh_s13,
                     .sh_w2 = b->sh_w2, .sh_s2 = b->sh_s2};
    /* bwv[0] before the first call, bwv[i + 1] after call i. */
    double t[MAX_REPS], bwv[MAX_REPS + 1], wb[MAX_REPS], lim[MAX_REPS], spent = 0, experts = 0;
    int n = 0;
    mt_status st = MT_OK;
    /* The weights read once; one untimed call: every executor's scratch
     * reaches its size for M. */
    if ((st = touch_weights(b, err)) != MT_OK ||
        (st = model_moe_run(k, ws, &b->dims, &w, b->x, M, b->y, err)) != MT_OK ||
        (st = dev_synchronize(b->d, err)) != MT_OK ||
        (st = sample_limit(b, &bwv[0], err)) != MT_OK)
        return st;
    while (n < b->max_reps && (n < 3 || spent < b->max_ms)) {
        /* Fresh inputs are host work that a model step does not do between
         * layers; the pool's threads may fall asleep meanwhile, so a short
         * launch wakes them (bench_limits_wake), as the kernels before a
         * layer do in a model step. */
        if ((st = fresh_x(b, M, err)) != MT_OK ||
            (b->o->flush && (st = bench_limits_flush(b->lim, err)) != MT_OK) ||
            (b->lim && (st = bench_limits_wake(b->lim, err)) != MT_OK) ||
            (st = dev_synchronize(b->d, err)) != MT_OK ||
            (st = dev_event_record(b->d, b->e0, err)) != MT_OK ||
            (st = model_moe_run(k, ws, &b->dims, &w, b->x, M, b->y, err)) != MT_OK ||
            (st = dev_event_record(b->d, b->e1, err)) != MT_OK ||
            (st = dev_synchronize(b->d, err)) != MT_OK ||
            (st = dev_event_elapsed_ms(b->d, b->e0, b->e1, &t[n], err)) != MT_OK ||
            (st = dev_copy_from(b->d, b->hids, model_moe_ws_ids(ws),
                                (size_t)(M * b->topk) * 4, err)) != MT_OK ||
            (st = sample_limit(b, &bwv[n + 1], err)) != MT_OK)
            return st;
        int nu = count_experts(b->hids, M * b->topk, b->E);
        experts += nu;
        wb[n] = layer_bytes(b, nu);
        spent += t[n];
        n++;
    }
    round_limits(bwv, n, lim);
    widen_limits(lim, n);
    bench_paired_fraction(wb, t, lim, n, &res->paired);
    bench_spread_of(t, n, &res->t);
    bench_spread_of(bwv, n + 1, &res->bw);
    res->experts = experts / n;
    return MT_OK;
}

static void print_layer(bench *b, int64_t M, const layer_result *lr, const model_kset *ks)
{
    const bench_spread *bws = &lr->bw;
    double H = (double)b->H, I = (double)b->I, S = (double)b->S, E = (double)b->E;
    double wbytes = layer_bytes(b, lr->experts);
    double flops = 2.0 * (double)(M * b->topk) * 3.0 * I * H + 2.0 * (double)M * 3.0 * S * H +
                   2.0 * (double)M * E * H;
    /* Noise only lowers a probe: the limit is its best sample. */
    double ms = lr->t.median, bw = bws->max;
    double gbs = wbytes / (ms * 1e6), gfl = flops / (ms * 1e6);
    model_selection_counts c;
    model_kset_counts(ks, &c);
    if (b->o->json)
        fprintf(b->out,
                "{\"family\":\"moe\",\"stage\":\"layer\",\"shape\":\"%s\",\"device\":\"%s\","
                "\"M\":%lld,\"layer_ms\":%.4f,\"layer_ms_p10\":%.4f,\"layer_ms_p90\":%.4f,"
                "\"reps\":%d,\"flush\":%s,\"weight_GBps\":%.3f,\"GFLOPs\":%.3f,"
                "\"mem_bw_GBps\":%.3f,\"mem_bw_p10\":%.3f,\"mem_bw_p90\":%.3f,"
                "\"fraction_of_bw\":%.4f,\"fraction_of_bw_paired\":%.4f,"
                "\"fraction_of_bw_paired_p10\":%.4f,\"fraction_of_bw_paired_p90\":%.4f,"
                "\"experts\":%.2f,"
                "\"configs\":{\"tuned\":%d,\"nearest\":%d,\"other_device\":%d,\"stale\":%d,"
                "\"default\":%d}}\n",
                b->o->shape, b->p->spec, (long long)M, ms, lr->t.p10, lr->t.p90, lr->t.reps,
                b->o->flush ? "true" : "false", gbs, gfl, bw, bws->p10, bws->p90,
                bw > 0 ? gbs / bw : 0, lr->paired.median, lr->paired.p10, lr->paired.p90,
                lr->experts, c.tuned, c.nearest, c.other_device, c.stale,
                c.defaults);
    else
        fprintf(b->out, "%-14s %5lld %10s %10.3f %9.2f %9.1f %8.2f %7.2f %10.2f %8s %8s  served layer "
                "(%.1f experts; configs: %d tuned, %d nearest, %d default)\n", "moe layer",
                (long long)M, "-", ms, gbs, gfl, bw > 0 ? gbs / bw : 0, lr->paired.median, bw,
                "-", "-",
                lr->experts, c.tuned, c.nearest, c.defaults);
    fflush(b->out);
}

/* The layer's time per kernel at M: reps calls with a fresh x each (as
 * time_layer), every kernel synchronized and timed; the mean per call.
 * The synchronizations make the sum a little more than the layer's time. */
static mt_status breakdown_layer(bench *b, const model_moe_kernels *k, model_moe_ws *ws,
                                 int64_t M, int reps, mt_err *err)
{
    moe_weights w = {.gate = b->gate, .bias = b->bias, .w13 = b->w13, .s13 = b->s13,
                     .w2 = b->w2, .s2 = b->s2, .sh_w13 = b->sh_w13, .sh_s13 = b->sh_s13,
                     .sh_w2 = b->sh_w2, .sh_s2 = b->sh_s2};
    double ms[MODEL_MOE_NK] = {0};
    mt_status st = MT_OK;
    model_moe_ws_time_kernels(ws, ms);
    for (int r = 0; r < reps && st == MT_OK; r++)
        if ((st = fresh_x(b, M, err)) == MT_OK &&
            (!b->o->flush || (st = bench_limits_flush(b->lim, err)) == MT_OK) &&
            (st = model_moe_run(k, ws, &b->dims, &w, b->x, M, b->y, err)) == MT_OK)
            st = dev_synchronize(b->d, err);
    model_moe_ws_time_kernels(ws, NULL);
    if (st != MT_OK)
        return st;
    double sum = 0;
    for (int i = 0; i < MODEL_MOE_NK; i++)
        sum += ms[i] / reps;
    if (b->o->json) {
        fprintf(b->out, "{\"family\":\"moe\",\"stage\":\"layer_kernels\",\"shape\":\"%s\","
                "\"device\":\"%s\",\"M\":%lld,\"reps\":%d,\"ms\":{", b->o->shape, b->p->spec,
                (long long)M, reps);
        for (int i = 0, first = 1; i < MODEL_MOE_NK; i++)
            if (ms[i] > 0) {
                fprintf(b->out, "%s\"%s\":%.4f", first ? "" : ",", model_moe_kernel_names[i],
                        ms[i] / reps);
                first = 0;
            }
        fprintf(b->out, "}}\n");
    } else {
        fprintf(b->out, "  layer kernels at M=%lld, mean of %d calls, each synchronized:",
                (long long)M, reps);
        for (int i = 0; i < MODEL_MOE_NK; i++)
            if (ms[i] > 0)
                fprintf(b->out, " %s %.3f ms (%.0f%%),", model_moe_kernel_names[i], ms[i] / reps,
                        100.0 * ms[i] / reps / sum);
        fprintf(b->out, " sum %.3f ms\n", sum);
    }
    fflush(b->out);
    return MT_OK;
}

/* ---- the GEMM stages alone ---------------------------------------------------- */

typedef struct gemm_bench {
    const char *fam;
    bool up;
    kern_shape shape;
    kern_exec *ex[MAX_CFG]; /* [0]: the default for the M being timed; then the sweep */
    int n_cfg;
} gemm_bench;

/* The cpu sweeps (NR, MR, KB, NT, PF): register tile, K blocking, thread
 * partition, prefetch; one per weight layout (at most MAX_CFG - 1 each). */
static const int cpu_sweep_rows[][MOE_CPU_NPARAMS] = {
    /* decode: long prefetched streams */
    {2, 1, 65536, 512, 2048}, {4, 1, 65536, 512, 2048}, {2, 1, 65536, 1024, 2048},
    {4, 1, 65536, 1024, 4096}, {2, 1, 65536, 256, 2048}, {1, 1, 65536, 512, 2048},
    /* a few tokens per expert */
    {2, 2, 65536, 256, 2048}, {4, 2, 65536, 256, 2048},
    /* prefill: register tiles, K blocked for L1 */
    {2, 4, 1024, 64, 0}, {4, 4, 1024, 64, 0}, {4, 4, 2048, 128, 0}, {2, 8, 1024, 64, 0},
    {4, 4, 1024, 64, 1024}, {1, 8, 2048, 64, 0}, {4, 4, 512, 64, 0},
};
/* wl=1: groups of 16 rows, NR x MR at most 16 */
static const int cpu_sweep_grouped[][MOE_CPU_NPARAMS] = {
    /* decode (the defaults prefetch 4 KiB ahead; 2 KiB was the old default) */
    {2, 1, 65536, 512, 2048}, {1, 1, 65536, 512, 4096}, {2, 1, 65536, 1024, 4096},
    {4, 1, 65536, 1024, 2048}, {2, 1, 65536, 256, 4096},
    /* a few tokens per expert */
    {1, 2, 65536, 256, 2048}, {2, 2, 65536, 256, 2048},
    /* prefill: integer tiles up to 16 tokens; a16w4 paired groups of 4 */
    {1, 8, 65536, 256, 2048}, {1, 16, 65536, 256, 2048}, {1, 4, 65536, 256, 2048},
    {1, 4, 1024, 64, 0}, {2, 4, 65536, 64, 0}, {2, 4, 1024, 128, 1024},
    {2, 4, 65536, 256, 2048}, {1, 4, 1024, 256, 2048},
};

static mt_status open_stage(bench *b, gemm_bench *g, const char *key, mt_err *err)
{
    const kern_family *f = kern_family_find(g->fam);
    mt_status st = kern_shape_parse(f, key, &g->shape, NULL, err);
    if (st != MT_OK)
        return st;
    g->n_cfg = 1; /* ex[0] is opened per M */
    bool grouped = kern_shape_get(f, &g->shape, "wl") == 1;
    const int(*sweep)[MOE_CPU_NPARAMS] = grouped ? cpu_sweep_grouped : cpu_sweep_rows;
    int n_sweep = !b->o->sweep || b->p->backend != DEV_BACKEND_CPU ? 0
                  : grouped ? (int)(sizeof cpu_sweep_grouped / sizeof cpu_sweep_grouped[0])
                            : (int)(sizeof cpu_sweep_rows / sizeof cpu_sweep_rows[0]);
    for (int c = 0; c < n_sweep && g->n_cfg < MAX_CFG; c++) {
        kern_config cfg = {.n = MOE_CPU_NPARAMS};
        memcpy(cfg.v, sweep[c], sizeof sweep[c]);
        if (kern_exec_open(b->d, f, &g->shape, 1, &cfg, &g->ex[g->n_cfg], NULL) == MT_OK)
            g->n_cfg++;
    }
    return MT_OK;
}

/* A new routing for the stage kernels: ids, the aligned layout and the
 * top-k weights on the device; *used (if not NULL) gets the experts it
 * touches. */
static mt_status fresh_routing(bench *b, int64_t M, double *used, mt_err *err)
{
    int64_t P = M * b->topk;
    moe_gen_ids(&b->r, M, (int)b->topk, (int)b->E, MOE_SKEW_UNIFORM, b->hids);
    int32_t htotal = 0;
    moe_align_ref(b->hids, P, (int)b->E, BM, b->hsorted, b->htile, &htotal);
    for (int64_t q = 0; q < P; q++)
        b->htw[q] = 1.0f / (float)b->topk;
    if (used)
        *used = count_experts(b->hids, P, b->E);
    int64_t capm = moe_cap_rows(P, b->E, BM);
    mt_status st;
    if ((st = dev_copy_to(b->d, b->ids, b->hids, (size_t)P * 4, err)) != MT_OK ||
        (st = dev_copy_to(b->d, b->sorted, b->hsorted, (size_t)capm * 4, err)) != MT_OK ||
        (st = dev_copy_to(b->d, b->tile, b->htile, (size_t)(capm / BM) * 4, err)) != MT_OK ||
        (st = dev_copy_to(b->d, b->total, &htotal, 4, err)) != MT_OK)
        return st;
    return dev_copy_to(b->d, b->tw, b->htw, (size_t)P * 4, err);
}

/* One timed call of the peer on the routing in b->hids. */
static mt_status run_peer(bench *b, const gemm_bench *g, int64_t M, double *ms, mt_err *err)
{
    const moe_bench_peer *pr = b->o->peer;
    mt_status st;
    if (b->o->flush && (st = bench_limits_flush(b->lim, err)) != MT_OK)
        return st;
    return pr->run(pr->ctx, g->up, M, b->hids, ms, err);
}

/* The peer's spread, the default config's, and the per-round ratios
 * peer / default (both ran on one routing in each round). */
static void print_peer(bench *b, const gemm_bench *g, int64_t M, double *pt, double *ratio,
                       int n, const bench_spread *dflt, double bw)
{
    bench_spread ps, rs;
    bench_spread_of(pt, n, &ps);
    bench_spread_of(ratio, n, &rs);
    const char *name = b->o->peer->name;
    if (b->o->json)
        fprintf(b->out,
                "{\"family\":\"%s\",\"stage\":\"%s\",\"vs\":\"%s\",\"shape\":\"%s\","
                "\"device\":\"%s\",\"M\":%lld,\"reps\":%d,\"peer_ms\":%.6g,"
                "\"peer_ms_p10\":%.6g,\"peer_ms_p90\":%.6g,\"moetune_ms\":%.6g,"
                "\"moetune_ms_p10\":%.6g,\"moetune_ms_p90\":%.6g,\"ratio_of_medians\":%.6g,"
                "\"ratio_p10\":%.6g,\"ratio_median\":%.6g,\"ratio_p90\":%.6g,"
                "\"mem_bw_GBps\":%.3f}\n",
                g->fam, g->up ? "up" : "down", name, b->o->shape, b->p->spec, (long long)M, n,
                ps.median, ps.p10, ps.p90, dflt->median, dflt->p10, dflt->p90,
                ps.median / dflt->median, rs.p10, rs.median, rs.p90, bw);
    else
        fprintf(b->out,
                "%-14s %5lld  %s ms %.3f / %.3f / %.3f (p10 / median / p90), moetune default "
                "%.3f / %.3f / %.3f; %s / moetune per round %.2f / %.2f / %.2f, of medians "
                "%.2f (%d rounds)\n",
                g->fam, (long long)M, name, ps.p10, ps.median, ps.p90, dflt->p10, dflt->median,
                dflt->p90, name, rs.p10, rs.median, rs.p90, ps.median / dflt->median, n);
    fflush(b->out);
}

/* The stage's weights as a plain read in the probe's fastest pattern
 * (bench_limits_read_pieces): a fresh routing's experts, each expert's
 * weights (and, in Quark rows, its scales) in pieces of about PIECE bytes,
 * the size of a decode work item (NT 512 rows of stage 2). The gap between
 * it and the probe is the access pattern's (scattered experts, short
 * pieces), between it and the kernel the kernel's. *ms 0 where the
 * backend has no such read. */
enum { PIECE = 512 * 1024 };

static mt_status time_pattern(bench *b, const gemm_bench *g, int64_t M, double *ms,
                              double *bytes, mt_err *err)
{
    int64_t K = g->up ? b->H : b->I, rows = g->up ? 2 * b->I : b->H;
    const uint8_t *w = g->up ? b->w13 : b->w2, *s = g->up ? b->s13 : b->s2;
    int64_t wr = moe_w4_bytes(b->wl, rows, K), sr = moe_w4_scale_bytes(b->wl, rows, K);
    *ms = 0, *bytes = 0;
    const void **at = malloc(sizeof *at * BENCH_MAX_PIECES);
    int64_t *len = malloc(sizeof *len * BENCH_MAX_PIECES);
    mt_status st = at && len ? fresh_routing(b, M, NULL, err)
                             : mt_fail(err, MT_E_NOMEM, "bench: out of memory");
    bool seen[4096] = {0};
    int n = 0;
    for (int64_t q = 0; st == MT_OK && q < M * b->topk; q++) {
        int e = b->hids[q];
        if (e < 0 || e >= b->E || e >= 4096 || seen[e])
            continue;
        seen[e] = true;
        n = add_pieces(at, len, n, w + e * wr, wr, PIECE);
        n = add_pieces(at, len, n, s + e * sr, sr, PIECE);
    }
    for (int i = 0; i < n; i++)
        *bytes += (double)(len[i] - len[i] % bench_limits_piece_step(b->lim));
    if (st == MT_OK && (st = bench_limits_read_pieces(b->lim, at, len, n, ms, NULL, err)) != MT_OK)
        *bytes = 0;
    free(at);
    free(len);
    return st;
}

/* Round robin over the configs, so every config sees the same machine
 * load, with a fresh routing before every call and each round starting
 * one config later; the peer (if any) runs on the default config's
 * routing in each round. */
static mt_status time_stage(bench *b, gemm_bench *g, int64_t M, mt_err *err)
{
    int64_t P = M * b->topk, K = g->up ? b->H : b->I, N = g->up ? 2 * b->I : b->H;
    int nc = g->n_cfg;
    /* The default is the family's default for this M (what an untuned
     * database runs). */
    kern_exec_close(g->ex[0]);
    g->ex[0] = NULL;
    mt_status st0 = kern_exec_open(b->d, kern_family_find(g->fam), &g->shape, M, NULL, &g->ex[0],
                                   err);
    if (st0 != MT_OK)
        return st0;
    double *t = malloc(sizeof(double) * (size_t)(nc * MAX_REPS)), bwv[MAX_REPS + 1];
    double *wb = malloc(sizeof(double) * (size_t)(nc * MAX_REPS)), lim[MAX_REPS];
    double pt[MAX_REPS], ratio[MAX_REPS];
    /* The plain read of the same kind of bytes (time_pattern), one per round. */
    double pat_ms[MAX_REPS] = {0}, pat_bytes[MAX_REPS] = {0};
    const bool pattern = b->lim && b->p->backend == DEV_BACKEND_CPU;
    const int slots = nc + (pattern ? 1 : 0);
    const bool peer = b->o->peer != NULL;
    if (!t || !wb) {
        free(t);
        free(wb);
        return mt_fail(err, MT_E_NOMEM, "bench: out of memory");
    }
    const double row_bytes = (double)N * (double)K * (0.5 + 1.0 / 32);
    double spent = 0, experts_sum = 0;
    int n = 0;
    mt_status st = MT_OK;
    int calls = 0;
    void *bu[] = {b->x, b->ids, b->sorted, b->tile, b->total, b->w13, b->s13, b->h};
    void *bd[] = {b->h, b->ids, b->sorted, b->tile, b->total, b->tw, b->w2, b->s2, b->y};
    /* First: the weights read once (touch_weights), and one untimed call
     * per config sizes its scratch. */
    st = touch_weights(b, err);
    for (int c = 0; c < nc && st == MT_OK; c++)
        if ((st = fresh_routing(b, M, NULL, err)) == MT_OK)
            st = kern_exec_run(g->ex[c], NULL, M, g->up ? bu : bd, err);
    /* Samples around every round: bwv[0] before the first, bwv[i + 1]
     * after round i. */
    if (st == MT_OK)
        st = sample_limit(b, &bwv[0], err);
    while (st == MT_OK && n < b->max_reps && (n < 3 || spent < b->max_ms * nc)) {
        for (int j = 0; j < slots && st == MT_OK; j++) {
            /* Each round starts at the next config: the first call after
             * the bandwidth sample is not always the same config's. A
             * routing of its own for every call: a call that reused the
             * previous call's experts would read them from cache. Slot nc
             * is the plain read. The pool is woken after the host's
             * routing, as in time_layer (the plain read does the same). */
            int c = (n + j) % slots;
            if (c == nc) {
                st = time_pattern(b, g, M, &pat_ms[n], &pat_bytes[n], err);
                continue;
            }
            double ms = 0, used = 0;
            bool with_peer = peer && c == 0, peer_first = with_peer && (n & 1);
            if ((st = fresh_routing(b, M, &used, err)) != MT_OK ||
                (peer_first && (st = run_peer(b, g, M, &pt[n], err)) != MT_OK) ||
                (b->o->flush && (st = bench_limits_flush(b->lim, err)) != MT_OK) ||
                (b->lim && (st = bench_limits_wake(b->lim, err)) != MT_OK) ||
                (st = dev_synchronize(b->d, err)) != MT_OK ||
                (st = dev_event_record(b->d, b->e0, err)) != MT_OK ||
                (st = kern_exec_run(g->ex[c], NULL, M, g->up ? bu : bd, err)) != MT_OK ||
                (st = dev_event_record(b->d, b->e1, err)) != MT_OK ||
                (st = dev_synchronize(b->d, err)) != MT_OK ||
                (st = dev_event_elapsed_ms(b->d, b->e0, b->e1, &ms, err)) != MT_OK ||
                (with_peer && !peer_first && (st = run_peer(b, g, M, &pt[n], err)) != MT_OK))
                break;
            t[c * MAX_REPS + n] = ms;
            wb[c * MAX_REPS + n] = used * row_bytes;
            if (with_peer)
                ratio[n] = pt[n] / ms;
            spent += ms;
            experts_sum += used;
            calls++;
        }
        /* The limit, sampled in the same round as the configs. */
        if (st == MT_OK)
            st = sample_limit(b, &bwv[n + 1], err);
        n++;
    }
    if (st != MT_OK) {
        free(t);
        free(wb);
        return st;
    }
    double best = 0, dflt = 0;
    int best_c = 0;
    bench_spread sp[MAX_CFG];
    for (int c = 0; c < nc; c++) {
        bench_spread_of(t + c * MAX_REPS, n, &sp[c]);
        double med = sp[c].median;
        if (b->o->all && b->o->log) {
            char key[256];
            kern_config_key(kern_exec_impl(g->ex[c]), kern_exec_config(g->ex[c]), key,
                            sizeof key);
            fprintf(b->o->log, "  %s M=%lld %-40s ms p10 %.3f median %.3f p90 %.3f\n", g->fam,
                    (long long)M, key, sp[c].p10, med, sp[c].p90);
        }
        if (c == 0)
            dflt = best = med;
        if (med < best) {
            best = med;
            best_c = c;
        }
    }
    bench_spread paired, of_pat = {0}, pat_gbs = {0}, pat_paired = {0};
    round_limits(bwv, n, lim);
    /* The plain read is a read of memory too: where it beats the samples
     * around its round (on the Xeon, 512 KiB pieces read up to 2 % faster
     * than the probe's 1 GiB slice in the same pattern), it is that round's
     * limit, and its best is the run's: the fastest read seen. */
    double fastest = 0, rate[MAX_REPS];
    int pat_over = 0;
    if (pattern) {
        for (int i = 0; i < n; i++)
            rate[i] = pat_ms[i] > 0 ? pat_bytes[i] / (pat_ms[i] * 1e6) : 0;
        pat_over = raise_limits(lim, rate, n, &fastest);
        /* The best config against the plain read of its round. */
        bench_paired_fraction(wb + best_c * MAX_REPS, t + best_c * MAX_REPS, rate, n, &of_pat);
        bench_spread_of(rate, n, &pat_gbs);
    }
    /* So is every call: its weights came from memory at its rate (no call
     * finds the previous calls' experts in cache: fresh routing). Where
     * the fastest call of a round beats the round's samples and plain read
     * (on the Xeon at M = 16, stage 1's four streams now and then read 4 %
     * faster than the probe's two), it is that round's limit, and the
     * fastest call of the run bounds the run's limit from below. */
    for (int i = 0; i < n; i++) {
        rate[i] = 0;
        for (int c = 0; c < nc; c++) {
            double ms = t[c * MAX_REPS + i];
            double r = ms > 0 ? wb[c * MAX_REPS + i] / (ms * 1e6) : 0;
            rate[i] = r > rate[i] ? r : rate[i];
        }
    }
    const int call_over = raise_limits(lim, rate, n, &fastest);
    widen_limits(lim, n);
    if (pattern)
        bench_paired_fraction(pat_bytes, pat_ms, lim, n, &pat_paired);
    bench_paired_fraction(wb + best_c * MAX_REPS, t + best_c * MAX_REPS, lim, n, &paired);
    free(t);
    free(wb);
    /* The compute limit: the peak of the instruction the stage's dots run
     * on (u8 x s8 dots for a4w4 / a8w4; bf16 dots for a16w4 where the CPU
     * has them, else fp32 FMA), the best of probes before and after. */
    bench_peaks pk = {0};
    if (b->lim && (st = bench_limits_peaks(b->lim, 3, &pk, err)) != MT_OK)
        return st;
    /* a16w4's MR 16 runs on AMX tiles where the device has them */
    const bool amx = !b->int_dot && b->p->cpu_amx && b->wl == 1 &&
                     kern_exec_config(g->ex[best_c])->v[MOE_CPU_MR] == 16;
    double peak = b->int_dot ? pk.i8 : amx ? pk.amx_bf16 : pk.bf16 > 0 ? pk.bf16 : pk.fma;
    bench_spread bws;
    bench_spread_of(bwv, n + 1, &bws);
    /* noise only lowers a probe: the limit is its best sample, or the plain
     * read's or a call's best where those read faster */
    double bw = bws.max > 0 && fastest > bws.max ? fastest : bws.max;
    double experts = experts_sum / (double)(calls ? calls : 1);
    double wbytes = experts * (double)N * (double)K * (0.5 + 1.0 / 32);
    double flops = 2.0 * (double)P * (double)N * (double)K;
    double gbs = wbytes / (best * 1e6), gfl = flops / (best * 1e6);
    char ck[256];
    kern_config_key(kern_exec_impl(g->ex[best_c]), kern_exec_config(g->ex[best_c]), ck,
                    sizeof ck);
    if (b->o->json)
        fprintf(b->out,
                "{\"family\":\"%s\",\"stage\":\"%s\",\"shape\":\"%s\",\"device\":\"%s\","
                "\"M\":%lld,\"default_ms\":%.4f,\"best_ms\":%.4f,\"best_ms_p10\":%.4f,"
                "\"best_ms_p90\":%.4f,\"reps\":%d,\"flush\":%s,\"weight_GBps\":%.3f,"
                "\"GFLOPs\":%.3f,\"mem_bw_GBps\":%.3f,\"mem_bw_p10\":%.3f,"
                "\"mem_bw_p90\":%.3f,\"fraction_of_bw\":%.4f,\"peak_GOPs\":%.3f,"
                "\"fraction_of_bw_paired\":%.4f,\"fraction_of_bw_paired_p10\":%.4f,"
                "\"fraction_of_bw_paired_p90\":%.4f,"
                "\"peak_kind\":\"%s\",\"fraction_of_peak\":%.4f,"
                "\"speedup\":%.4f,\"experts\":%.2f,\"best_config\":\"%s\","
                "\"pattern_GBps\":%.3f,\"fraction_of_pattern\":%.4f,"
                "\"fraction_of_pattern_p10\":%.4f,\"fraction_of_pattern_p90\":%.4f,"
                "\"pattern_fraction_of_bw_paired\":%.4f,\"pattern_above_probe_rounds\":%d,"
                "\"call_above_probe_rounds\":%d,\"probe_pattern\":\"%s\"}\n",
                g->fam, g->up ? "up" : "down", b->o->shape, b->p->spec, (long long)M, dflt, best,
                sp[best_c].p10, sp[best_c].p90, n, b->o->flush ? "true" : "false", gbs, gfl, bw,
                bws.p10, bws.p90, bw > 0 ? gbs / bw : 0, peak, paired.median, paired.p10,
                paired.p90,
                b->int_dot ? "i8_dot" : amx ? "amx_bf16" : pk.bf16 > 0 ? "bf16_dot" : "fp32_fma",
                peak > 0 ? gfl / peak : 0, dflt / best, experts, ck, pat_gbs.median,
                of_pat.median, of_pat.p10, of_pat.p90, pat_paired.median, pat_over, call_over,
                b->pattern);
    else
        fprintf(b->out, "%-14s %5lld %10.3f %10.3f %9.2f %9.1f %8.2f %7.2f %10.2f %8.2f %8.2f  %s\n",
                g->fam, (long long)M, dflt, best, gbs, gfl, bw > 0 ? gbs / bw : 0,
                paired.median, bw, peak > 0 ? gfl / peak : 0, dflt / best, ck);
    if (!b->o->json && of_pat.reps)
        fprintf(b->out, "%-14s %5lld  its weights as a plain read (fresh experts, %d KiB pieces, "
                "the probe's pattern): %.2f GB/s, %.2f of the limit (paired; faster than the "
                "probe's samples in %d of %d rounds, a call faster than both in %d: the limits "
                "of those); best config per round at %.2f / %.2f / %.2f of it (p10 / median / "
                "p90)\n",
                g->fam, (long long)M, PIECE / 1024, pat_gbs.median, pat_paired.median, pat_over,
                n, call_over, of_pat.p10, of_pat.median, of_pat.p90);
    fflush(b->out);
    if (peer)
        print_peer(b, g, M, pt, ratio, n, &sp[0], bw);
    return MT_OK;
}

/* ---- the layer's keys and its dump ---------------------------------------------- */

/* One JSON line naming the shape key of each of the layer's kernels. */
static void print_keys(const bench *b)
{
    moe_keys k;
    moe_layer_keys(&b->dims, &k);
    const char *names[] = {"route", "align", "up", "down", "combine", "sh_align", "sh_up",
                           "sh_down"};
    const char *keys[] = {k.route, k.align, k.up, k.down, k.combine, k.sh_align, k.sh_up,
                          k.sh_down};
    const char *fams[] = {"moe_route", "moe_align", "moe_gemm_up", "moe_gemm_down",
                          "moe_combine", "moe_align", "moe_gemm_up", "moe_gemm_down"};
    fprintf(b->out, "{\"family\":\"moe\",\"stage\":\"keys\",\"shape\":\"%s\","
            "\"device\":\"%s\",\"kernels\":[", b->o->shape, b->p->spec);
    for (int i = 0, first = 1; i < 8; i++)
        if (keys[i][0]) {
            fprintf(b->out, "%s{\"kernel\":\"%s\",\"family\":\"%s\",\"key\":\"%s\"}",
                    first ? "" : ",", names[i], fams[i], keys[i]);
            first = 0;
        }
    fprintf(b->out, "]}\n");
    fflush(b->out);
}

/* The layer once per M on fresh tokens, written with the weights of the
 * experts they hit for a peer to run (moe_dump.h). */
static mt_status dump_layer(bench *b, const model_moe_kernels *k, model_moe_ws *ws, mt_err *err)
{
    const int64_t H = b->H, E = b->E;
    moe_weights w = {.gate = b->gate, .bias = b->bias, .w13 = b->w13, .s13 = b->s13,
                     .w2 = b->w2, .s2 = b->s2, .sh_w13 = b->sh_w13, .sh_s13 = b->sh_s13,
                     .sh_w2 = b->sh_w2, .sh_s2 = b->sh_s2};
    uint16_t *gate = malloc((size_t)(E * H) * 2);
    float *bias = malloc((size_t)E * 4), *y = malloc((size_t)(b->maxm * H) * 4);
    moe_dump *dp = NULL;
    mt_status st = gate && bias && y ? MT_OK : mt_fail(err, MT_E_NOMEM, "bench: out of memory");
    if (st == MT_OK)
        st = dev_copy_from(b->d, gate, b->gate, (size_t)(E * H) * 2, err);
    if (st == MT_OK)
        st = dev_copy_from(b->d, bias, b->bias, (size_t)E * 4, err);
    if (st == MT_OK)
        st = moe_dump_open(b->o->dump_dir, &b->dims, b->o->shape, b->p->spec, &dp, err);
    for (int mi = 0; mi < b->o->n_ms && st == MT_OK; mi++) {
        int64_t M = b->o->ms[mi];
        if ((st = fresh_x(b, M, err)) == MT_OK &&
            (st = model_moe_run(k, ws, &b->dims, &w, b->x, M, b->y, err)) == MT_OK &&
            (st = dev_synchronize(b->d, err)) == MT_OK &&
            (st = dev_copy_from(b->d, b->hids, model_moe_ws_ids(ws), (size_t)(M * b->topk) * 4,
                                err)) == MT_OK &&
            (st = dev_copy_from(b->d, y, b->y, (size_t)(M * H) * 4, err)) == MT_OK)
            st = moe_dump_tokens(dp, M, b->hx, b->hids, y, gate, bias, err);
    }
    if (st == MT_OK)
        st = moe_dump_finish(dp, b->d, &w, b->wl, gate, bias, err);
    if (st == MT_OK && b->o->log)
        fprintf(b->o->log, "dump: the layer's inputs, weights and output at %d token counts "
                "in %s\n", b->o->n_ms, b->o->dump_dir);
    moe_dump_close(dp);
    free(gate);
    free(bias);
    free(y);
    return st;
}

/* ---- the benchmark -------------------------------------------------------------- */

/* The layer's dims: the GEMM shape's, the routing of moe_route's preset of
 * the same name (GLM-5.2's when the shape is a key), one MXFP4 shared
 * expert of the routed experts' width. */
/* The expert weights' layout timed: forced by the options, else the
 * shape's wl=1, else the one the runtime uses on this device. Weights are
 * random either way; only the kernels (keys) differ. */
static int bench_wl(const bench *b, const kern_family *fu, const kern_shape *s)
{
    if (b->o->wl_set)
        return b->o->wl;
    if (kern_shape_get(fu, s, "wl") == 1)
        return 1;
    return moe_weight_layout(b->p->backend);
}

static mt_status layer_dims(bench *b, const kern_family *fu, const kern_shape *s, mt_err *err)
{
    const kern_family *fr = kern_family_find("moe_route");
    kern_shape rs;
    mt_status st = kern_shape_parse(fr, b->o->shape, &rs, NULL, NULL);
    if (st != MT_OK && (st = kern_shape_parse(fr, "glm5.2", &rs, NULL, err)) != MT_OK)
        return st;
    b->dims = (moe_dims){
        .hidden = b->H, .inter = b->I, .n_experts = b->E, .topk = (int)b->topk,
        .ngroup = (int)kern_shape_get(fr, &rs, "ngroup"),
        .topkg = (int)kern_shape_get(fr, &rs, "topkg"),
        .scale = (float)kern_shape_get(fr, &rs, "rsf") / 1000.0f,
        .norm = kern_shape_get(fr, &rs, "norm") != 0,
        .a4 = kern_shape_get(fu, s, "a") == KERN_DT_MXFP4,
        .a8 = kern_shape_get(fu, s, "a") == KERN_DT_I8, .shared_inter = b->S, .comb = 1,
        .bm = BM, .wl = b->wl};
    return MT_OK;
}

mt_status moe_bench_run(dev_device *d, const moe_bench_opts *o, FILE *out, mt_err *err)
{
    const kern_family *fu = kern_family_find("moe_gemm_up");
    kern_shape s;
    mt_status st = kern_shape_parse(fu, o->shape, &s, NULL, err);
    if (st != MT_OK)
        return st;
    bench b = {.d = d, .p = dev_get_props(d), .o = o, .out = out,
               .max_ms = o->max_ms > 0 ? o->max_ms : 1500,
               .max_reps = o->max_reps <= 0 || o->max_reps > MAX_REPS ? MAX_REPS
                           : o->max_reps < 3 ? 3 : o->max_reps};
    b.H = kern_shape_get(fu, &s, "H");
    b.I = kern_shape_get(fu, &s, "I");
    b.E = kern_shape_get(fu, &s, "E");
    b.topk = kern_shape_get(fu, &s, "topk");
    b.S = b.I;
    b.maxm = 1;
    for (int i = 0; i < o->n_ms; i++)
        b.maxm = o->ms[i] > b.maxm ? o->ms[i] : b.maxm;
    mt_rng_seed(&b.r, o->seed ? o->seed : mt_seed_fresh());
    bool layer = !strcmp(o->family, "moe") || !strcmp(o->family, "moe_layer");
    gemm_bench gb[2] = {{.fam = "moe_gemm_up", .up = true}, {.fam = "moe_gemm_down"}};
    bool want[2] = {strcmp(o->family, "moe_gemm_down") != 0 && strcmp(o->family, "moe_layer"),
                    strcmp(o->family, "moe_gemm_up") != 0 && strcmp(o->family, "moe_layer")};
    if (o->dump_dir && !layer)
        return mt_fail(err, MT_E_INVALID, "bench: a dump needs the layer (family moe or "
                                          "moe_layer), not %s", o->family);
    model_kset *ks = NULL;
    model_moe_ws *ws = NULL;
    model_moe_kernels mk;
    b.wl = bench_wl(&b, fu, &s);
    if ((st = setup(&b, layer, err)) != MT_OK)
        goto out;
    if (o->peer) {
        moe_bench_peer_inputs pin = {.d = d, .H = b.H, .I = b.I, .E = b.E, .topk = b.topk,
                                     .maxm = b.maxm, .w13 = b.w13, .s13 = b.s13, .w2 = b.w2,
                                     .s2 = b.s2, .x = b.x, .h = b.h,
                                     .wl = b.wl};
        if ((st = o->peer->setup(o->peer->ctx, &pin, err)) != MT_OK)
            goto out;
    }
    if (layer) {
        /* The served layer: its kernels with the database's configs. */
        if ((st = layer_dims(&b, fu, &s, err)) != MT_OK ||
            (st = model_kset_create(d, o->db, o->log, &ks, err)) != MT_OK ||
            (st = model_moe_add_kernels(ks, &b.dims, b.maxm, &mk, err)) != MT_OK ||
            (st = model_kset_select(ks, err)) != MT_OK ||
            (st = model_moe_ws_create(d, &b.dims, b.maxm, &ws, err)) != MT_OK)
            goto out;
        if (o->json)
            print_keys(&b);
        if (o->dump_dir && (st = dump_layer(&b, &mk, ws, err)) != MT_OK)
            goto out;
    }
    /* The stages alone: the same keys as the layer's GEMMs (the served
     * layer writes per-pair rows: comb = 1). */
    moe_dims gd = {.hidden = b.H, .inter = b.I, .n_experts = b.E, .topk = (int)b.topk,
                   .a4 = kern_shape_get(fu, &s, "a") == KERN_DT_MXFP4,
                   .a8 = kern_shape_get(fu, &s, "a") == KERN_DT_I8, .comb = 1, .bm = BM,
                   .wl = b.wl};
    moe_keys keys;
    moe_layer_keys(&gd, &keys);
    b.int_dot = gd.a4 || gd.a8;
    for (int g = 0; g < 2; g++)
        if (want[g] && (st = open_stage(&b, &gb[g], gb[g].up ? keys.up : keys.down, err)) != MT_OK)
            goto out;

    if (o->no_limits && o->flush) {
        st = mt_fail(err, MT_E_INVALID, "bench: flush streams the limit probe's buffer, so it "
                                        "needs the limits (no_limits is set)");
        goto out;
    }
    if (!o->no_limits && (st = bench_limits_open(d, &b.lim, err)) != MT_OK)
        goto out;
    /* Picks the probe's fastest read pattern, once; the ratios use samples
     * of it interleaved with the timed calls. */
    bench_spread probe;
    if (b.lim && (st = bench_limits_bandwidth(b.lim, 3, &probe, err)) != MT_OK)
        goto out;
    if (b.lim && b.p->backend == DEV_BACKEND_CPU) {
        bench_limits_pattern_name(b.lim, b.pattern, sizeof b.pattern);
        if (!o->json)
            fprintf(out, "bandwidth probe: %.1f GB/s (median of 3), fastest read pattern: %s\n",
                    probe.median, b.pattern);
    }
    if (!o->json)
        fprintf(out, "%-14s %5s %10s %10s %9s %9s %8s %7s %10s %8s %8s  %s\n", "family", "M",
                "default ms", "best ms", "GB/s", "GFLOP/s", "of bw", "paired", "mem GB/s",
                "of peak", "speedup", "best config");
    for (int mi = 0; mi < o->n_ms; mi++) {
        int64_t M = o->ms[mi];
        if (layer) {
            layer_result lr;
            if ((st = time_layer(&b, &mk, ws, M, &lr, err)) != MT_OK)
                goto out;
            print_layer(&b, M, &lr, ks);
            if (o->breakdown && (st = breakdown_layer(&b, &mk, ws, M, lr.t.reps, err)) != MT_OK)
                goto out;
        }
        for (int g = 0; g < 2; g++)
            if (want[g] && (st = time_stage(&b, &gb[g], M, err)) != MT_OK)
                goto out;
    }
out:
    for (int g = 0; g < 2; g++)
        for (int c = 0; c < MAX_CFG; c++)
            kern_exec_close(gb[g].ex[c]);
    model_moe_ws_destroy(ws);
    model_kset_destroy(ks);
    bench_limits_close(b.lim);
    teardown(&b);
    return st;
}
