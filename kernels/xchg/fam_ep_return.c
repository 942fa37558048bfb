/* fam_ep_return.c: the `ep_return` family: the receive side of an
 * expert-parallel MoE layer's combine, on the device: row i of what came
 * back from the experts' ranks (in ep_dispatch's send order) goes to row
 * sorted[i], the per-pair layout moe_combine reads. f32 rows of H; M is
 * the pair count. Exact: compared bit for bit. */
#include <stdlib.h>

#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/core/rows.h"

enum { D_H, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_H] = {"H", KERN_DIM_INT, false, 1, 1 << 20, "hidden size (f32 row length)"},
};

static const kern_preset presets[] = {
    {"glm5.2", "H=6144"},
    {"tiny", "H=256"},
};

enum { B_SORTED, B_SRC, B_DST, B_COUNT };

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return -1;
    size_t P = (size_t)m, H = (size_t)s->v[D_H];
    out[B_SORTED] = (kern_buf_desc){"sorted", KERN_BUF_IN, KERN_DT_I32, P * 4, 0, 0, 0};
    out[B_SRC] = (kern_buf_desc){"back", KERN_BUF_IN, KERN_DT_F32, P * H * 4, 0, 0, 0};
    out[B_DST] = (kern_buf_desc){"rows", KERN_BUF_OUT, KERN_DT_F32, P * H * 4, (int64_t)H, 0,
                                 0};
    return B_COUNT;
}

/* sorted: a random permutation of the pairs (every row is written). */
static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    int32_t *sorted = host[B_SORTED];
    for (int64_t i = 0; i < m; i++)
        sorted[i] = (int32_t)i;
    for (int64_t i = m - 1; i > 0; i--) {
        int64_t j = (int64_t)mt_rng_below(&r, (uint64_t)(i + 1));
        int32_t t = sorted[i];
        sorted[i] = sorted[j];
        sorted[j] = t;
    }
    float *src = host[B_SRC];
    for (int64_t i = 0; i < m * s->v[D_H]; i++)
        src[i] = mt_rng_normal(&r);
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    const int32_t *sorted = host[B_SORTED];
    const float *src = host[B_SRC];
    float *dst = host[B_DST];
    int64_t H = s->v[D_H];
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < H; j++)
            dst[sorted[i] * H + j] = src[i * H + j];
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    *flops = 0;
    *bytes = (double)m * ((double)s->v[D_H] * 8.0 + 4.0);
}

static const kern_case cases[] = {{"tiny", 1}, {"tiny", 29}, {"H=33", 64}};

const kern_family fam_ep_return = KERN_ROWS_FAMILY(
    "ep_return", 1, "expert-parallel combine: returned rows into the per-pair layout",
    KERN_ROWS_GPU_IMPL("ep_return.hip", kern_rows_gpu_default, kern_rows_run),
    KERN_ROWS_CPU_IMPL("ep_return.cpu", kern_rows_run));
