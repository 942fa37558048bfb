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
 * Prints a table (or one JSON object per line) to the given stream. Not
 * thread-safe; it allocates the full expert weights (GLM-5.2: about
 * 5 GiB). */
#ifndef MT_BENCH_MOE_BENCH_H
#define MT_BENCH_MOE_BENCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../../common/status.h"
#include "../../db/db.h"
#include "../../device/device.h"

typedef struct moe_bench_opts {
    const char *shape;     /* moe_gemm_up shape: preset ("glm5.2") or key */
    const char *family;    /* "moe" (layer and both GEMMs), "moe_gemm_up" or "moe_gemm_down" */
    const int64_t *ms;     /* token counts */
    int n_ms;
    bool sweep;            /* also time a small sweep of GEMM configs (cpu) */
    bool json;             /* one JSON object per line instead of a table */
    bool flush;            /* evict caches (stream 1 GiB) before every timed call */
    bool all;              /* print every config's spread to log (not only the best) */
    double max_ms;         /* timing budget per (config, M); default 1500 */
    uint64_t seed;         /* 0: a fresh seed */
    db_t *db;              /* the layer's configs; NULL: family defaults */
    FILE *log;             /* the layer's kernel selection report; NULL: stderr */
} moe_bench_opts;

mt_status moe_bench_run(dev_device *d, const moe_bench_opts *o, FILE *out, mt_err *err);

#endif
