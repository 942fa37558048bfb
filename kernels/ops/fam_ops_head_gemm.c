/* fam_ops_head_gemm.c: the `ops_head_gemm` family: one small GEMM per
 * attention head, the two absorbed-MLA projections,
 *
 *   out[m][h][n] = bf16( sum_k a[m][h][k] * w[h][n][k] ),  n < N, k < K
 *
 * with a bf16 [M][H][KA] (the first K of each head's KA values are read),
 * w bf16 [H][N][K] and out bf16 [M][H][NO] (the first N of each head's NO
 * values are written, the rest left as it was). Query absorption:
 * a = q (KA = nope + rope, K = nope), w = W_UK^T per head ([L][nope]),
 * out = q_abs (NO = L + rope); value projection: a = the attention output
 * in latent space (K = KA = L), w = W_UV per head ([V][L]), NO = N = V. */
#include <math.h>
#include <stdio.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/core/rows.h"

enum { D_H, D_K, D_KA, D_N, D_NO, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_H] = {"H", KERN_DIM_INT, false, 1, 1024, "heads"},
    [D_K] = {"K", KERN_DIM_INT, false, 1, 4096, "reduction length"},
    [D_KA] = {"KA", KERN_DIM_INT, false, 1, 8192, "values per head in a (>= K)"},
    [D_N] = {"N", KERN_DIM_INT, false, 1, 8192, "outputs per head"},
    [D_NO] = {"NO", KERN_DIM_INT, false, 1, 8192, "values per head in out (>= N)"},
};

static const kern_preset presets[] = {
    {"glm5.2-qabs", "H=64,K=192,KA=256,N=512,NO=576"},
    {"tiny", "H=4,K=32,KA=48,N=32,NO=48"},
    {"glm5.2-vout", "H=64,K=512,KA=512,N=256,NO=256"},
};

enum { B_A, B_W, B_OUT, B_COUNT };

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    (void)m;
    if (s->v[D_K] > s->v[D_KA] || s->v[D_N] > s->v[D_NO]) {
        snprintf(why, cap, "K=%lld must not exceed KA=%lld nor N=%lld exceed NO=%lld",
                 (long long)s->v[D_K], (long long)s->v[D_KA], (long long)s->v[D_N],
                 (long long)s->v[D_NO]);
        return false;
    }
    return true;
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return -1;
    size_t h = (size_t)s->v[D_H], um = (size_t)m;
    out[B_A] = (kern_buf_desc){"a", KERN_BUF_IN, KERN_DT_BF16, um * h * (size_t)s->v[D_KA] * 2,
                               0, 0, 0};
    out[B_W] = (kern_buf_desc){"w", KERN_BUF_IN, KERN_DT_BF16,
                               h * (size_t)(s->v[D_N] * s->v[D_K]) * 2, 0, 0, 0};
    /* f32 sums in another order, then one bf16 rounding. */
    out[B_OUT] = (kern_buf_desc){"out", KERN_BUF_INOUT, KERN_DT_BF16,
                                 um * h * (size_t)s->v[D_NO] * 2, s->v[D_NO], 1e-3, 8e-3};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    size_t h = (size_t)s->v[D_H];
    uint16_t *a = host[B_A], *w = host[B_W], *o = host[B_OUT];
    float ws = (float)(1.0 / sqrt((double)s->v[D_K]));
    for (size_t i = 0; i < (size_t)m * h * (size_t)s->v[D_KA]; i++)
        a[i] = mt_f32_to_bf16(mt_rng_normal(&r));
    for (size_t i = 0; i < h * (size_t)(s->v[D_N] * s->v[D_K]); i++)
        w[i] = mt_f32_to_bf16(mt_rng_normal(&r) * ws);
    for (size_t i = 0; i < (size_t)m * h * (size_t)s->v[D_NO]; i++)
        o[i] = mt_f32_to_bf16(mt_rng_normal(&r));
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    int64_t H = s->v[D_H], K = s->v[D_K], KA = s->v[D_KA], N = s->v[D_N], NO = s->v[D_NO];
    const uint16_t *a = host[B_A], *w = host[B_W];
    uint16_t *o = host[B_OUT];
    for (int64_t i = 0; i < m; i++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t n = 0; n < N; n++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++)
                    acc += (double)mt_bf16_to_f32(a[(i * H + h) * KA + k]) *
                           mt_bf16_to_f32(w[(h * N + n) * K + k]);
                o[(i * H + h) * NO + n] = mt_f32_to_bf16((float)acc);
            }
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    double h = (double)s->v[D_H], k = (double)s->v[D_K], n = (double)s->v[D_N], dm = (double)m;
    *flops = 2.0 * dm * h * n * k;
    *bytes = 2.0 * (dm * h * k + h * n * k + dm * h * n);
}

static int param(const kern_ctx *c, const char *name)
{
    return kern_config_get(c->impl, c->cfg, name, 1);
}

static mt_status run(const kern_ctx *c, mt_err *err)
{
    bool gpu = dev_backend_runs_hip_source(c->props->backend);
    dev_kernel *k;
    mt_status st = kern_get(c, "ops_head_gemm", "pppi", &k, err);
    if (st != MT_OK)
        return st;
    int m = (int)c->m, mb = param(c, "MB");
    void *args[] = {(void *)&c->bufs[B_A], (void *)&c->bufs[B_W], (void *)&c->bufs[B_OUT], &m};
    dev_dim3 grid, block = {1, 1, 1};
    if (gpu) {
        int nt = param(c, "THREADS");
        grid = (dev_dim3){kern_cdiv(c->shape->v[D_N], nt), (unsigned)c->shape->v[D_H],
                          kern_cdiv(m, mb)};
        block.x = (unsigned)nt;
    } else {
        grid = (dev_dim3){kern_cdiv(m, mb), (unsigned)c->shape->v[D_H], 1};
    }
    return dev_launch(c->dev, k, grid, block, 0, args, err);
}

static const int threads_v[] = {64, 128, 256};
static const int mb_v[] = {1, 2, 4, 8};
static const kern_param_desc gpu_params[] = {
    {"THREADS", threads_v, 3, "threads per block (one output column each)"},
    {"MB", mb_v, 4, "rows of a per block (staged in shared memory)"},
};

static bool gpu_valid(const kern_shape *s, int64_t m, const kern_config *c,
                      const dev_props *p, char *why, size_t cap)
{
    (void)m;
    if (!kern_rows_threads_ok(c->v[0], p, why, cap))
        return false;
    size_t shm = (size_t)c->v[1] * (size_t)s->v[D_K] * 4;
    if (shm > p->static_shared_per_block) { /* a static __shared__ array */
        snprintf(why, cap, "needs %zu bytes of static shared memory, the device allows %zu",
                 shm, p->static_shared_per_block);
        return false;
    }
    return true;
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    c->n = 2;
    c->v[0] = kern_rows_default_threads(s->v[D_N] >= 256, p);
    c->v[1] = m >= 8 ? 8 : m >= 4 ? 4 : 1;
    while (c->v[1] > 1 && (size_t)c->v[1] * (size_t)s->v[D_K] * 4 > p->static_shared_per_block)
        c->v[1] /= 2;
}

static const kern_impl gpu_impl = {
    .source = "ops_head_gemm.hip",
    .params = gpu_params,
    .n_params = 2,
    .valid = gpu_valid,
    .default_config = gpu_default,
    .run = run,
};

static const int cpu_mb_v[] = {1, 4, 16};
static const kern_param_desc cpu_params[] = {
    {"MB", cpu_mb_v, 3, "rows of a per work item (share each weight row)"},
};

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    c->n = 1;
    c->v[0] = m * s->v[D_H] >= 16 * (int64_t)p->compute_units ? 16 : m >= 4 ? 4 : 1;
}

static const kern_impl cpu_impl = {
    .source = "ops_head_gemm.cpu",
    .params = cpu_params,
    .n_params = 1,
    .default_config = cpu_default,
    .run = run,
    .order_fixed = true, /* lanes over K, then the lanes in order, whatever MB */
};

static const kern_case cases[] = {
    {"tiny", 1}, {"tiny", 7}, {"H=3,K=20,KA=20,N=17,NO=17", 5}, {"H=2,K=192,KA=256,N=70,NO=90", 2},
};

const kern_family fam_ops_head_gemm = {
    .name = "ops_head_gemm",
    .version = 1,
    .summary = "per-head bf16 GEMM (absorbed MLA query and value projections)",
    .dims = dims,
    .n_dims = D_COUNT,
    .presets = presets,
    .n_presets = sizeof presets / sizeof presets[0],
    .gpu = &gpu_impl,
    .cpu = &cpu_impl,
    .shape_ok = shape_ok,
    .buffers = buffers,
    .fill = fill,
    .reference = reference,
    .cost = cost,
    .cases = cases,
    .n_cases = sizeof cases / sizeof cases[0],
};
