/* fam_ops_silu_mul.c: the `ops_silu_mul` family: the gated activation of
 * a SwiGLU MLP, h[m][j] = bf16(silu(g) * u) with g = x[m][j] and
 * u = x[m][I + j] from the fused gate/up GEMM output x f32 [M][2I]. */
#include <math.h>
#include <stdio.h>

#include "../common/numeric.h"
#include "../common/rng.h"
#include "family.h"

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

static mt_status run(const kern_ctx *c, mt_err *err)
{
    bool gpu = dev_backend_is_gpu(c->props->backend);
    dev_kernel *k;
    mt_status st = kern_get(c, "ops_silu_mul", "ppi", &k, err);
    if (st != MT_OK)
        return st;
    int m = (int)c->m, rows = kern_config_get(c->impl, c->cfg, "ROWS", 1);
    void *args[] = {(void *)&c->bufs[B_X], (void *)&c->bufs[B_H], &m};
    dev_dim3 grid = {kern_cdiv(m, rows), 1, 1};
    dev_dim3 block = {gpu ? (unsigned)kern_config_get(c->impl, c->cfg, "THREADS", 64) : 1, 1, 1};
    return dev_launch(c->dev, k, grid, block, 0, args, err);
}

static const int threads_v[] = {64, 128, 256};
static const int rows_v[] = {1, 4};
static const kern_param_desc gpu_params[] = {
    {"THREADS", threads_v, 3, "threads per block"},
    {"ROWS", rows_v, 2, "rows per block"},
};

static bool gpu_valid(const kern_shape *s, int64_t m, const kern_config *c,
                      const dev_props *p, char *why, size_t cap)
{
    (void)s;
    (void)m;
    if (c->v[0] > p->max_threads_per_block || c->v[0] % p->warp_size) {
        snprintf(why, cap, "THREADS=%d: more than %d or not a multiple of the warp (%d)",
                 c->v[0], p->max_threads_per_block, p->warp_size);
        return false;
    }
    return true;
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    (void)m;
    c->n = 2;
    c->v[0] = s->v[D_I] >= 1024 && p->max_threads_per_block >= 256 ? 256 : 64;
    if (c->v[0] % p->warp_size || c->v[0] > p->max_threads_per_block)
        c->v[0] = p->warp_size;
    c->v[1] = 1;
}

static const kern_impl gpu_impl = {
    .source = "ops_silu_mul.hip",
    .params = gpu_params,
    .n_params = 2,
    .valid = gpu_valid,
    .default_config = gpu_default,
    .run = run,
};

static const int cpu_rows_v[] = {1, 4, 16};
static const kern_param_desc cpu_params[] = {
    {"ROWS", cpu_rows_v, 3, "rows per work item"},
};

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    (void)s;
    c->n = 1;
    c->v[0] = m >= 16 * (int64_t)p->compute_units ? 16 : 1;
}

static const kern_impl cpu_impl = {
    .source = "ops_silu_mul.cpu",
    .params = cpu_params,
    .n_params = 1,
    .default_config = cpu_default,
    .run = run,
};

static const kern_case cases[] = {{"tiny", 1}, {"tiny", 5}, {"I=45", 3}};

const kern_family fam_ops_silu_mul = {
    .name = "ops_silu_mul",
    .version = 1,
    .summary = "SwiGLU activation: bf16(silu(gate) * up) from a fused f32 gate/up row",
    .dims = dims,
    .n_dims = D_COUNT,
    .presets = presets,
    .n_presets = sizeof presets / sizeof presets[0],
    .gpu = &gpu_impl,
    .cpu = &cpu_impl,
    .buffers = buffers,
    .fill = fill,
    .reference = reference,
    .cost = cost,
    .cases = cases,
    .n_cases = sizeof cases / sizeof cases[0],
};
