/* fam_ops_embed.c: the `ops_embed` family: a row gather, out[m] =
 * table[ids[m]] for a bf16 table [V][N], written both as f32 (the model's
 * residual stream) and as bf16 (the next norm's input). The runtime uses it
 * for the token embedding and to pick the rows whose logits are wanted.
 * An id outside [0, V) gives a zero row (the runtime rejects such ids
 * before a step; the kernel never reads outside the table). */

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/core/rows.h"

enum { D_N, D_V, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_N] = {"N", KERN_DIM_INT, false, 1, 1 << 20, "row length (hidden size)"},
    [D_V] = {"V", KERN_DIM_INT, true, 1, 1 << 24, "rows of the table (vocabulary)"},
};

static const kern_preset presets[] = {
    {"glm5.2", "N=6144,V=154880"},
    {"tiny", "N=256,V=512"},
};

enum { B_TABLE, B_IDS, B_XF, B_XB, B_COUNT };

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return -1;
    size_t n = (size_t)s->v[D_N], um = (size_t)m;
    out[B_TABLE] = (kern_buf_desc){"table", KERN_BUF_IN, KERN_DT_BF16,
                                   (size_t)s->v[D_V] * n * 2, 0, 0, 0};
    out[B_IDS] = (kern_buf_desc){"ids", KERN_BUF_IN, KERN_DT_I32, um * 4, 0, 0, 0};
    out[B_XF] = (kern_buf_desc){"xf", KERN_BUF_OUT, KERN_DT_F32, um * n * 4, (int64_t)n, 0, 0};
    out[B_XB] = (kern_buf_desc){"xb", KERN_BUF_OUT, KERN_DT_BF16, um * n * 2, (int64_t)n, 0, 0};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    uint16_t *t = host[B_TABLE];
    for (int64_t i = 0; i < s->v[D_V] * s->v[D_N]; i++)
        t[i] = mt_f32_to_bf16(mt_rng_normal(&r));
    int32_t *ids = host[B_IDS];
    for (int64_t i = 0; i < m; i++)
        ids[i] = (int32_t)mt_rng_below(&r, (uint64_t)s->v[D_V]);
    if (m > 1)
        ids[m - 1] = -1; /* out of range: a zero row */
    if (m > 2)
        ids[m - 2] = (int32_t)(s->v[D_V] - 1);
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    int64_t n = s->v[D_N], v = s->v[D_V];
    const uint16_t *t = host[B_TABLE];
    const int32_t *ids = host[B_IDS];
    float *xf = host[B_XF];
    uint16_t *xb = host[B_XB];
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            uint16_t b = ids[i] >= 0 && ids[i] < v ? t[ids[i] * n + j] : 0;
            xb[i * n + j] = b;
            xf[i * n + j] = mt_bf16_to_f32(b);
        }
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    *flops = 0;
    *bytes = (double)m * ((double)s->v[D_N] * 8.0 + 4.0);
}

/* The kernel takes V after the buffers and M. */
static mt_status run(const kern_ctx *c, mt_err *err)
{
    int v = (int)c->shape->v[D_V];
    return kern_rows_run_ints(c, &v, 1, err);
}

static const kern_case cases[] = {
    {"tiny", 1}, {"tiny", 7}, {"N=33,V=5", 3},
};

const kern_family fam_ops_embed = KERN_ROWS_FAMILY(
    "ops_embed", 1, "row gather of a bf16 table by id into f32 and bf16 rows (embedding)",
    KERN_ROWS_GPU_IMPL("ops_embed.hip", kern_rows_gpu_default, run),
    KERN_ROWS_CPU_IMPL("ops_embed.cpu", run));
