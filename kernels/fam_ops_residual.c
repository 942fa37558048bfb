/* fam_ops_residual.c: the `ops_residual` family: the residual add of the
 * model, resid[m] += delta[m] (f32 rows of N), then xb[m] = bf16(resid[m])
 * (the next norm's input). */
#include <math.h>
#include <stdio.h>

#include "../common/numeric.h"
#include "../common/rng.h"
#include "family.h"

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

static mt_status run(const kern_ctx *c, mt_err *err)
{
    bool gpu = dev_backend_is_gpu(c->props->backend);
    dev_kernel *k;
    mt_status st = kern_get(c, "ops_residual", "pppi", &k, err);
    if (st != MT_OK)
        return st;
    int m = (int)c->m, rows = kern_config_get(c->impl, c->cfg, "ROWS", 1);
    void *args[] = {(void *)&c->bufs[B_RESID], (void *)&c->bufs[B_DELTA], (void *)&c->bufs[B_XB],
                    &m};
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
    c->v[0] = s->v[D_N] >= 1024 && p->max_threads_per_block >= 256 ? 256 : 64;
    if (c->v[0] % p->warp_size || c->v[0] > p->max_threads_per_block)
        c->v[0] = p->warp_size;
    c->v[1] = 1;
}

static const kern_impl gpu_impl = {
    .source = "ops_residual.hip",
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
    .source = "ops_residual.cpu",
    .params = cpu_params,
    .n_params = 1,
    .default_config = cpu_default,
    .run = run,
};

static const kern_case cases[] = {{"tiny", 1}, {"tiny", 6}, {"N=77", 3}};

const kern_family fam_ops_residual = {
    .name = "ops_residual",
    .version = 1,
    .summary = "residual add of f32 rows, plus the bf16 copy of the sum",
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
