/* fam_rmsnorm.c: the `rmsnorm` family: bf16 RMSNorm over rows of N values,
 * y = x / sqrt(mean(x^2) + eps) * w. Small, and a real test of the GPU
 * block reduction (warp shuffles, shared memory, barriers). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/core/rows.h"

enum { D_N, D_EPS, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_N] = {"N", KERN_DIM_INT, false, 1, 1 << 20, "row length"},
    [D_EPS] = {"eps_e", KERN_DIM_INT, true, 1, 12, "eps = 10^-eps_e"},
};

static const kern_preset presets[] = {
    {"glm5.2", "N=6144,eps_e=5"},
    {"tiny", "N=256,eps_e=5"},
    {"qlora", "N=2048,eps_e=6"},
    {"kvlora", "N=512,eps_e=6"},
};

static const int threads_v[] = {32, 64, 128, 256, 512, 1024};
static const int rows_v[] = {1, 2, 4};
static const kern_param_desc gpu_params[] = {
    {"THREADS", threads_v, 6, "threads per block"},
    {"ROWS", rows_v, 3, "rows per block"},
};

static const int cpu_rows_v[] = {1, 4, 16, 64};
static const kern_param_desc cpu_params[] = {
    {"ROWS", cpu_rows_v, 4, "rows per work item"},
};

static float eps_of(const kern_shape *s) { return powf(10.0f, -(float)s->v[D_EPS]); }

static bool gpu_valid(const kern_shape *s, int64_t m, const kern_config *c,
                      const dev_props *p, char *why, size_t cap)
{
    (void)s;
    (void)m;
    int threads = c->v[0];
    if (threads > p->max_threads_per_block) {
        snprintf(why, cap, "THREADS=%d exceeds the device's %d", threads,
                 p->max_threads_per_block);
        return false;
    }
    if (threads % p->warp_size) {
        snprintf(why, cap, "THREADS=%d is not a multiple of the warp size %d", threads,
                 p->warp_size);
        return false;
    }
    return true;
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p,
                        kern_config *c)
{
    (void)m;
    c->n = 2;
    c->v[0] = s->v[D_N] >= 2048 ? 256 : 128;
    if (c->v[0] > p->max_threads_per_block)
        c->v[0] = p->max_threads_per_block;
    c->v[1] = 1;
}

/* Both backends: kern_rows_launch (THREADS and ROWS on GPUs, ROWS on the
 * cpu). */
static mt_status run(const kern_ctx *c, mt_err *err)
{
    int m = (int)c->m;
    float eps = eps_of(c->shape);
    void *args[] = {(void *)&c->bufs[2], (void *)&c->bufs[0], (void *)&c->bufs[1], &m, &eps};
    return kern_rows_launch(c, "rmsnorm_bf16", "pppif", args, err);
}

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p,
                        kern_config *c)
{
    (void)s;
    c->n = 1;
    c->v[0] = m >= 64 * p->compute_units ? 16 : 1;
}

static const kern_impl gpu_impl = {
    .source = "rmsnorm.hip",
    .params = gpu_params,
    .n_params = 2,
    .valid = gpu_valid,
    .default_config = gpu_default,
    .run = run,
};

static const kern_impl cpu_impl = {
    .source = "rmsnorm.cpu",
    .params = cpu_params,
    .n_params = 1,
    .default_config = cpu_default,
    .run = run,
};

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < 3)
        return -1;
    size_t n = (size_t)s->v[D_N];
    out[0] = (kern_buf_desc){"x", KERN_BUF_IN, KERN_DT_BF16, (size_t)m * n * 2, 0, 0, 0};
    out[1] = (kern_buf_desc){"w", KERN_BUF_IN, KERN_DT_BF16, n * 2, 0, 0, 0};
    /* One bf16 rounding step of difference is allowed. */
    out[2] = (kern_buf_desc){"y", KERN_BUF_OUT, KERN_DT_BF16, (size_t)m * n * 2,
                             (int64_t)n, 1e-3, 1.6e-2};
    return 3;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    size_t n = (size_t)s->v[D_N];
    uint16_t *x = host[0], *w = host[1];
    for (size_t i = 0; i < (size_t)m * n; i++)
        x[i] = mt_f32_to_bf16(mt_rng_normal(&r) * 2.0f);
    for (size_t i = 0; i < n; i++)
        w[i] = mt_f32_to_bf16(mt_rng_uniform(&r, 0.5f, 1.5f));
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    size_t n = (size_t)s->v[D_N];
    const uint16_t *x = host[0], *w = host[1];
    uint16_t *y = host[2];
    double eps = pow(10.0, -(double)s->v[D_EPS]);
    for (int64_t row = 0; row < m; row++) {
        double ss = 0;
        for (size_t i = 0; i < n; i++) {
            double v = mt_bf16_to_f32(x[row * n + i]);
            ss += v * v;
        }
        double scale = 1.0 / sqrt(ss / (double)n + eps);
        for (size_t i = 0; i < n; i++)
            y[row * n + i] = mt_f32_to_bf16(
                (float)(mt_bf16_to_f32(x[row * n + i]) * scale * mt_bf16_to_f32(w[i])));
    }
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    double n = (double)s->v[D_N];
    *flops = 4.0 * n * (double)m;
    *bytes = 2.0 * n * (2.0 * (double)m + 1.0);
}

static const kern_case cases[] = {
    {"tiny", 1}, {"tiny", 3}, {"tiny", 17}, {"N=1000,eps_e=6", 5}, {"N=33,eps_e=5", 2},
};

const kern_family fam_rmsnorm =
    KERN_ROWS_FAMILY("rmsnorm", 1, "bf16 RMSNorm over rows (block reduction)", &gpu_impl, &cpu_impl);
