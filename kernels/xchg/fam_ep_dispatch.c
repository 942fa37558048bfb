/* fam_ep_dispatch.c: the `ep_dispatch` family: the send side of an
 * expert-parallel MoE layer's dispatch, on the device. From the layer's
 * (token, expert) pairs sorted by expert (moe_align with bm = 1, so they
 * come grouped by the rank owning the expert, model_ep_range) it writes,
 * per position i of that order, the activation row of pair sorted[i]'s
 * token, the pair's expert as its rank numbers it and its routing weight,
 * and the number of pairs per destination rank: what an all-to-all-v
 * needs, with no host pass over the pairs. M is the pair count. Exact: a
 * copy and integer arithmetic, compared bit for bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/core/rows.h"
#include "kernels/moe/moe_common.h"

enum { D_E, D_TOPK, D_RANKS, D_H, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_E] = {"E", KERN_DIM_INT, false, 1, 1 << 16, "routed experts"},
    [D_TOPK] = {"topk", KERN_DIM_INT, false, 1, 32, "experts per token"},
    [D_RANKS] = {"ranks", KERN_DIM_INT, false, 1, 4096, "ranks the experts are split over"},
    [D_H] = {"H", KERN_DIM_INT, false, 1, 1 << 20, "hidden size (bf16 row length)"},
};

static const kern_preset presets[] = {
    {"glm5.2", "E=256,topk=8,ranks=8,H=6144"},
    {"tiny", "E=16,topk=4,ranks=3,H=256"},
};

enum { B_SORTED, B_IDS, B_TW, B_X, B_SX, B_SE, B_SW, B_COUNTS, B_COUNT };

/* Rank q's experts, as the runtime splits them (model_ep_range). */
static void split(int64_t E, int n, int q, int64_t *first, int64_t *count)
{
    int64_t base = E / n, rem = E % n;
    *first = q * base + (q < rem ? q : rem);
    *count = base + (q < rem);
}

static int64_t tokens(const kern_shape *s, int64_t m)
{
    return (m + s->v[D_TOPK] - 1) / s->v[D_TOPK];
}

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    (void)m;
    if (s->v[D_TOPK] > s->v[D_E] || s->v[D_RANKS] > s->v[D_E]) {
        snprintf(why, cap, "topk=%lld and ranks=%lld must not exceed E=%lld",
                 (long long)s->v[D_TOPK], (long long)s->v[D_RANKS], (long long)s->v[D_E]);
        return false;
    }
    return true;
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return -1;
    size_t P = (size_t)m, H = (size_t)s->v[D_H], T = (size_t)tokens(s, m);
    out[B_SORTED] = (kern_buf_desc){"sorted", KERN_BUF_IN, KERN_DT_I32, P * 4, 0, 0, 0};
    out[B_IDS] = (kern_buf_desc){"topk_ids", KERN_BUF_IN, KERN_DT_I32, P * 4, 0, 0, 0};
    out[B_TW] = (kern_buf_desc){"topk_w", KERN_BUF_IN, KERN_DT_F32, P * 4, 0, 0, 0};
    out[B_X] = (kern_buf_desc){"x", KERN_BUF_IN, KERN_DT_BF16, T * H * 2, 0, 0, 0};
    out[B_SX] = (kern_buf_desc){"send_x", KERN_BUF_OUT, KERN_DT_BF16, P * H * 2, (int64_t)H,
                                0, 0};
    out[B_SE] = (kern_buf_desc){"send_expert", KERN_BUF_OUT, KERN_DT_I32, P * 4, 0, 0, 0};
    out[B_SW] = (kern_buf_desc){"send_w", KERN_BUF_OUT, KERN_DT_F32, P * 4, 0, 0, 0};
    out[B_COUNTS] = (kern_buf_desc){"counts", KERN_BUF_OUT, KERN_DT_I32,
                                    (size_t)s->v[D_RANKS] * 4, 0, 0, 0};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    int64_t T = tokens(s, m), E = s->v[D_E];
    int topk = (int)s->v[D_TOPK];
    int32_t *ids = malloc(sizeof *ids * (size_t)(T * topk + 1));
    int32_t *tile = malloc(sizeof *tile * (size_t)(m + 1));
    if (!ids || !tile)
        abort(); /* a test problem's few kilobytes */
    moe_gen_ids(&r, T, topk, (int)E, 0, ids);
    memcpy(host[B_IDS], ids, sizeof *ids * (size_t)m);
    int32_t total;
    moe_align_ref(host[B_IDS], m, (int)E, 1, host[B_SORTED], tile, &total);
    float *tw = host[B_TW];
    for (int64_t i = 0; i < m; i++)
        tw[i] = mt_rng_normal(&r);
    moe_gen_bf16(&r, host[B_X], T * s->v[D_H], 1.0f);
    free(ids);
    free(tile);
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    const int32_t *sorted = host[B_SORTED], *ids = host[B_IDS];
    const float *tw = host[B_TW];
    const uint16_t *x = host[B_X];
    uint16_t *sx = host[B_SX];
    int32_t *se = host[B_SE], *counts = host[B_COUNTS];
    float *sw = host[B_SW];
    int64_t H = s->v[D_H], E = s->v[D_E];
    int n = (int)s->v[D_RANKS];
    for (int q = 0; q < n; q++)
        counts[q] = 0;
    for (int64_t i = 0; i < m; i++) {
        int32_t p = sorted[i], e = ids[p];
        int q = 0;
        int64_t first = 0, count = 0;
        for (; q < n; q++) { /* the owner, by the runtime's own split */
            split(E, n, q, &first, &count);
            if (e < first + count)
                break;
        }
        memcpy(sx + i * H, x + (p / s->v[D_TOPK]) * H, (size_t)H * 2);
        se[i] = (int32_t)(e - first);
        sw[i] = tw[p];
        counts[q]++;
    }
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    *flops = 0;
    *bytes = (double)m * ((double)s->v[D_H] * 4.0 + 20.0);
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    (void)m;
    kern_rows_gpu_config(s->v[D_H], p, c);
}

static const kern_case cases[] = {
    {"tiny", 1}, {"tiny", 4}, {"tiny", 37}, {"E=16,topk=4,ranks=4,H=256", 64},
    {"E=7,topk=2,ranks=7,H=33", 11}, {"E=256,topk=8,ranks=8,H=96", 300},
};

const kern_family fam_ep_dispatch = {
    .name = "ep_dispatch",
    .version = 1,
    .summary = "expert-parallel dispatch: pairs' rows, local experts, weights and per-rank "
               "counts in send order",
    .dims = dims,
    .n_dims = D_COUNT,
    .presets = presets,
    .n_presets = sizeof presets / sizeof presets[0],
    .gpu = KERN_ROWS_GPU_IMPL("ep_dispatch.hip", gpu_default, kern_rows_run),
    .cpu = KERN_ROWS_CPU_IMPL("ep_dispatch.cpu", kern_rows_run),
    .shape_ok = shape_ok,
    .buffers = buffers,
    .fill = fill,
    .reference = reference,
    .cost = cost,
    .cases = cases,
    .n_cases = sizeof cases / sizeof cases[0],
};
