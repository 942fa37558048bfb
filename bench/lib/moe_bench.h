/* moe_bench.h: the MoE benchmark behind `moetune bench --family moe` and
 * bench/bench_moe, in the small library mt_bench.
 *
 * Per token count M it times
 *  - the served MoE layer (model/moe_layer.h: route, align, gate/up, down
 *    and the MXFP4 shared expert), each kernel with the config the tuning
 *    database gives for that M (the family default without a database), as
 *    the server runs it; family "moe" only;
 *  - the expert GEMM stages alone (moe_gemm_up, moe_gemm_down): the default
 *    config and, on cpu, the best of a small sweep;
 * with fresh random inputs before every timed call (new activations, so
 * the router picks new experts: no call finds the previous call's experts
 * in cache), against this machine's memory read bandwidth measured in the
 * same run (re-measured before every M by limits.h's probe, compiled for the
 * machine). Times and the bandwidth carry p10 and p90; with flush, the
 * probe buffer is streamed before every timed call as well.
 *
 * With json and the layer, the first line names the layer's kernels' shape
 * keys ("stage":"keys"), the keys a tuning run must use for the layer to
 * find its configs.
 *
 * Prints a table (or one JSON object per line) to the given stream. Not
 * thread-safe; it allocates the full expert weights (GLM-5.2: about
 * 5 GiB). */
#ifndef MT_BENCH_MOE_BENCH_H
#define MT_BENCH_MOE_BENCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "db/db.h"
#include "device/device.h"

/* Another implementation of the two expert GEMM stages, timed in the same
 * rounds as moetune's (bench/bench_ggml_moe.c: ggml's CPU mul_mat_id). In
 * every round it runs once on the routing of the default config's call of
 * that round (before that call in odd rounds, after it in even ones), so
 * both see the same experts and the same load; its weights are its own
 * copy, so neither finds the other's experts in cache. */
typedef struct moe_bench_peer_inputs {
    dev_device *d;
    int64_t H, I, E, topk, maxm;
    /* On d, in moe_gemm_up / moe_gemm_down's cat=1 layout (kernels/mxfp4.h):
     * w13 packed [E, 2I, H/2] (I gate rows, then I up rows), s13 E8M0
     * [E, 2I, H/32]; w2 packed [E, H, I/2], s2 [E, H, I/32]; with wl 1 each
     * expert's matrices grouped by 16 rows with their scales in w13 and w2
     * (moe_w4_group16, moe_w4_bytes per expert; s13 and s2 empty: undo it
     * with moe_w4_ungroup16 to read Quark rows). */
    const void *w13, *s13, *w2, *s2;
    int wl;
    const void *x; /* bf16 [maxm, H]: stage 1's tokens */
    const void *h; /* bf16 [maxm * topk, I]: stage 2's input, row p for pair p */
} moe_bench_peer_inputs;

typedef struct moe_bench_peer {
    const char *name; /* printed next to its figures */
    void *ctx;
    /* Called once, after moetune's buffers are filled and before any timing;
     * the inputs stay valid until moe_bench_run returns. */
    mt_status (*setup)(void *ctx, const moe_bench_peer_inputs *in, mt_err *err);
    /* One timed call of stage 1 (up) or 2 at M tokens routed by ids [M, topk]
     * (host memory, expert ids of token t at ids[t * topk ...]); *ms gets the
     * call's wall time. */
    mt_status (*run)(void *ctx, bool up, int64_t M, const int32_t *ids, double *ms,
                     mt_err *err);
} moe_bench_peer;

typedef struct moe_bench_opts {
    const char *shape;     /* moe_gemm_up shape: preset ("glm5.2") or key */
    const char *family;    /* "moe" (layer and both GEMMs), "moe_layer" (the layer alone),
                              "moe_gemm_up", "moe_gemm_down" or "moe_gemm" (both GEMMs,
                              no layer) */
    const int64_t *ms;     /* token counts */
    int n_ms;
    bool sweep;            /* also time a small sweep of GEMM configs (cpu) */
    bool json;             /* one JSON object per line instead of a table */
    bool flush;            /* evict caches (stream 1 GiB) before every timed call */
    bool all;              /* print every config's spread to log (not only the best) */
    bool breakdown;        /* family moe: then the layer's time per kernel (each timed
                              call synchronized around every kernel) */
    bool wl_set;           /* expert weights' layout: false, the one the runtime uses on
                              this device (moe_weight_layout) unless the shape says wl=1 */
    int wl;                /* with wl_set: 0 Quark rows, 1 grouped by 16 (the cpu tiles) */
    double max_ms;         /* timing budget per (config, M); default 1500 */
    int max_reps;          /* timed calls per (config, M) at most (at least 3, at most
                              100); 0: 100. Each layer call draws new activations on the
                              host, which at M = 4096 costs more than the call */
    uint64_t seed;         /* 0: a fresh seed */
    db_t *db;              /* the layer's configs; NULL: family defaults */
    FILE *log;             /* the layer's kernel selection report; NULL: stderr */
    const moe_bench_peer *peer; /* NULL: none; else printed per stage and M with the
                                   ratio of its median to the default config's */
    bool no_limits;        /* no bandwidth samples or compute peaks (fractions print 0;
                              refused with flush): for tests, and for runs whose figure
                              is the peer ratio */
    const char *dump_dir;  /* family moe or moe_layer: before timing, run the layer once
                              per M on fresh tokens and write its inputs, the weights of
                              the experts they hit and its output there (moe_dump.h);
                              NULL: no dump */
} moe_bench_opts;

mt_status moe_bench_run(dev_device *d, const moe_bench_opts *o, FILE *out, mt_err *err);

#endif
