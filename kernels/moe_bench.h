/* moe_bench.h: the MoE GEMM benchmark behind `moetune bench --family moe`
 * and bench/bench_moe: times moe_gemm_up and moe_gemm_down at a shape for
 * a list of token counts M, with fresh random routing every call (as the
 * llama.cpp numbers in shared/HARDWARE.md were taken), against this
 * machine's memory read bandwidth measured in the same run (a
 * multi-threaded read of a 1 GiB buffer, re-measured before every M), and
 * the best of a small config sweep against the default config.
 *
 * Prints a table (or JSON lines) to the given stream. Not thread-safe; it
 * allocates the full expert weights (GLM-5.2: about 5 GiB). */
#ifndef MT_KERN_MOE_BENCH_H
#define MT_KERN_MOE_BENCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../common/status.h"
#include "../device/device.h"

typedef struct moe_bench_opts {
    const char *shape;     /* moe_gemm_up shape: preset ("glm5.2") or key */
    const char *family;    /* "moe" (both GEMMs), "moe_gemm_up" or "moe_gemm_down" */
    const int64_t *ms;     /* token counts */
    int n_ms;
    bool sweep;            /* also time a small sweep of configs (cpu) */
    bool json;             /* one JSON object per line instead of a table */
    double max_ms;         /* timing budget per (config, M); default 1500 */
    uint64_t seed;
} moe_bench_opts;

mt_status moe_bench_run(dev_device *d, const moe_bench_opts *o, FILE *out, mt_err *err);

/* Median read bandwidth (GB/s) of `threads` threads over a 1 GiB buffer. */
double moe_bench_mem_bw(int threads);

#endif
