/* fam_ops_silu_mul.c: the `ops_silu_mul` family: the gated activation of
 * a SwiGLU MLP, h[m][j] = bf16(silu(g) * u) with g = x[m][j] and
 * u = x[m][I + j] from the fused gate/up GEMM output x f32 [M][2I]. */
#include <math.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/core/rows.h"

enum { D_I, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_I] = {"I", KERN_DIM_INT, false, 1, 1 << 22, "intermediate size"},
};

static const kern_preset presets[] = {
    {"glm5.2", "I=12288"},
    {"tiny", "I=512"},
};

enum { B_X, B_H, B_COUNT };

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return -1;
    size_t n = (size_t)s->v[D_I], um = (size_t)m;
    out[B_X] = (kern_buf_desc){"x", KERN_BUF_IN, KERN_DT_F32, um * n * 8, 0, 0, 0};
    /* expf differs from the double reference in the last bits: at most a
     * bf16 rounding step apart. */
    out[B_H] = (kern_buf_desc){"h", KERN_BUF_OUT, KERN_DT_BF16, um * n * 2, (int64_t)n, 1e-6,
                               8e-3};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    float *x = host[B_X];
    for (int64_t i = 0; i < m * 2 * s->v[D_I]; i++)
        x[i] = mt_rng_normal(&r) * 3.0f;
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    int64_t n = s->v[D_I];
    const float *x = host[B_X];
    uint16_t *h = host[B_H];
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double g = x[i * 2 * n + j], u = x[i * 2 * n + n + j];
            h[i * n + j] = mt_f32_to_bf16((float)(g / (1.0 + exp(-g)) * u));
        }
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    *flops = (double)m * (double)s->v[D_I] * 5.0;
    *bytes = (double)m * (double)s->v[D_I] * 10.0;
}

static const kern_case cases[] = {{"tiny", 1}, {"tiny", 5}, {"I=45", 3}};

const kern_family fam_ops_silu_mul = KERN_ROWS_FAMILY(
    "ops_silu_mul", 1, "SwiGLU activation: bf16(silu(gate) * up) from a fused f32 gate/up row",
    KERN_ROWS_GPU_IMPL("ops_silu_mul.hip", kern_rows_gpu_default, kern_rows_run),
    KERN_ROWS_CPU_IMPL("ops_silu_mul.cpu", kern_rows_run));
