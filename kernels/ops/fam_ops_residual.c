/* fam_ops_residual.c: the `ops_residual` family: the residual add of the
 * model, resid[m] += delta[m] (f32 rows of N), then xb[m] = bf16(resid[m])
 * (the next norm's input). */
#include <math.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/core/rows.h"

enum { D_N, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_N] = {"N", KERN_DIM_INT, false, 1, 1 << 22, "row length (hidden size)"},
};

static const kern_preset presets[] = {
    {"glm5.2", "N=6144"},
    {"tiny", "N=256"},
};

enum { B_RESID, B_DELTA, B_XB, B_COUNT };

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return -1;
    size_t n = (size_t)s->v[D_N], um = (size_t)m;
    /* One float addition: the same result in any order. */
    out[B_RESID] = (kern_buf_desc){"resid", KERN_BUF_INOUT, KERN_DT_F32, um * n * 4,
                                   (int64_t)n, 0, 0};
    out[B_DELTA] = (kern_buf_desc){"delta", KERN_BUF_IN, KERN_DT_F32, um * n * 4, 0, 0, 0};
    out[B_XB] = (kern_buf_desc){"xb", KERN_BUF_OUT, KERN_DT_BF16, um * n * 2, (int64_t)n, 0, 0};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    float *a = host[B_RESID], *d = host[B_DELTA];
    for (int64_t i = 0; i < m * s->v[D_N]; i++) {
        a[i] = mt_rng_normal(&r) * 4.0f;
        d[i] = mt_rng_normal(&r);
    }
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    float *a = host[B_RESID];
    const float *d = host[B_DELTA];
    uint16_t *xb = host[B_XB];
    for (int64_t i = 0; i < m * s->v[D_N]; i++) {
        a[i] = a[i] + d[i];
        xb[i] = mt_f32_to_bf16(a[i]);
    }
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    *flops = (double)m * (double)s->v[D_N];
    *bytes = (double)m * (double)s->v[D_N] * 14.0;
}

static const kern_case cases[] = {{"tiny", 1}, {"tiny", 6}, {"N=77", 3}};

const kern_family fam_ops_residual = KERN_ROWS_FAMILY(
    "ops_residual", 1, "residual add of f32 rows, plus the bf16 copy of the sum",
    KERN_ROWS_GPU_IMPL("ops_residual.hip", kern_rows_gpu_default, kern_rows_run),
    KERN_ROWS_CPU_IMPL("ops_residual.cpu", kern_rows_run));
