/* fam_moe_combine.c: the `moe_combine` family: the deterministic reduction
 * of the weighted per-pair rows moe_gemm_down writes with comb=1:
 *   y[t] = sum_{j < topk} rows[t*topk + j]  (+ shared[t] when shared=1)
 * in ascending j (bitwise reproducible), output f32 or bf16. The shared
 * input may be the output buffer itself (f32): the pipeline adds the
 * shared expert's output this way. */
#include <stdio.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/moe/moe_common.h"

enum { D_H, D_TOPK, D_SHARED, D_O, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_H] = {"H", KERN_DIM_INT, false, 1, 65536, "hidden size"},
    [D_TOPK] = {"topk", KERN_DIM_INT, false, 1, 32, "experts per token"},
    [D_SHARED] = {"shared", KERN_DIM_INT, false, 0, 1, "1: add a shared-expert row per token"},
    [D_O] = {"o", KERN_DIM_DTYPE, false, 0, 0, "output type: f32 or bf16"},
};

static const kern_preset presets[] = {
    {"glm5.2", "H=6144,topk=8,shared=1,o=f32"},
    {"tiny", "H=256,topk=4,shared=1,o=f32"},
    {"tiny-bf16", "H=256,topk=4,shared=0,o=bf16"},
};

enum { B_ROWS, B_SHARED };

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    (void)m;
    if (s->v[D_O] != KERN_DT_F32 && s->v[D_O] != KERN_DT_BF16) {
        snprintf(why, cap, "o=%s: the output is f32 or bf16",
                 kern_dtype_name((kern_dtype)s->v[D_O]));
        return false;
    }
    return true;
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    int64_t H = s->v[D_H], P = m * s->v[D_TOPK];
    int n = 0;
    if (cap < 3)
        return 0;
    out[n++] = (kern_buf_desc){"rows", KERN_BUF_IN, KERN_DT_F32, (size_t)(P * H) * 4, H, 0, 0};
    if (s->v[D_SHARED])
        out[n++] = (kern_buf_desc){"shared", KERN_BUF_IN, KERN_DT_F32, (size_t)(m * H) * 4, H, 0, 0};
    bool bf = s->v[D_O] == KERN_DT_BF16;
    out[n++] = (kern_buf_desc){"y", KERN_BUF_OUT, bf ? KERN_DT_BF16 : KERN_DT_F32,
                               (size_t)(m * H) * (bf ? 2 : 4), H, 1e-6, 1e-6};
    return n;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    int64_t H = s->v[D_H], P = m * s->v[D_TOPK];
    float *rows = host[B_ROWS];
    for (int64_t i = 0; i < P * H; i++)
        rows[i] = mt_rng_normal(&r);
    if (s->v[D_SHARED]) {
        float *sh = host[B_SHARED];
        for (int64_t i = 0; i < m * H; i++)
            sh[i] = mt_rng_normal(&r);
    }
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    int64_t H = s->v[D_H], K = s->v[D_TOPK];
    const float *rows = host[B_ROWS];
    const float *sh = s->v[D_SHARED] ? host[B_SHARED] : NULL;
    void *y = host[s->v[D_SHARED] ? 2 : 1];
    for (int64_t t = 0; t < m; t++)
        for (int64_t n = 0; n < H; n++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < K; j++)
                acc += rows[(t * K + j) * H + n];
            if (sh)
                acc += sh[t * H + n];
            if (s->v[D_O] == KERN_DT_BF16)
                ((uint16_t *)y)[t * H + n] = mt_f32_to_bf16(acc);
            else
                ((float *)y)[t * H + n] = acc;
        }
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    int64_t H = s->v[D_H], K = s->v[D_TOPK];
    *flops = (double)(m * H * (K + s->v[D_SHARED]));
    *bytes = (double)(m * H) * (4.0 * (double)(K + s->v[D_SHARED]) +
                                (s->v[D_O] == KERN_DT_BF16 ? 2.0 : 4.0));
}

static mt_status launch(const kern_ctx *c, dev_dim3 grid, dev_dim3 block, mt_err *err)
{
    dev_kernel *k;
    mt_status st = kern_get(c, "moe_combine", "ppp", &k, err);
    if (st != MT_OK)
        return st;
    int sh = (int)c->shape->v[D_SHARED];
    void *rows = c->bufs[B_ROWS], *shared = sh ? c->bufs[B_SHARED] : NULL,
         *y = c->bufs[sh ? 2 : 1];
    void *args[] = {&rows, &shared, &y};
    return dev_launch(c->dev, k, grid, block, 0, args, err);
}

/* ---- gpu --------------------------------------------------------------- */

static const int threads_vals[] = {64, 128, 256, 512};
static const int vec_vals[] = {1, 2, 4};
static const kern_param_desc gpu_params[] = {
    {"THREADS", threads_vals, 4, "threads per block"},
    {"VEC", vec_vals, 3, "consecutive columns per thread"},
};

static bool gpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg,
                      const dev_props *p, char *why, size_t cap)
{
    (void)s;
    (void)m;
    if (cfg->v[0] > p->max_threads_per_block || cfg->v[0] % p->warp_size) {
        snprintf(why, cap, "THREADS=%d: the device allows %d per block in warps of %d",
                 cfg->v[0], p->max_threads_per_block, p->warp_size);
        return false;
    }
    return true;
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    (void)s;
    (void)m;
    cfg->n = 2;
    cfg->v[0] = p->max_threads_per_block >= 256 ? 256 : 64;
    cfg->v[1] = 4;
}

static mt_status gpu_run(const kern_ctx *c, mt_err *err)
{
    unsigned per = (unsigned)(c->cfg->v[0] * c->cfg->v[1]);
    return launch(c, (dev_dim3){kern_cdiv(c->shape->v[D_H], per), (unsigned)c->m, 1},
                  (dev_dim3){(unsigned)c->cfg->v[0], 1, 1}, err);
}

static const kern_impl gpu_impl = {
    .source = "moe_combine.hip",
    .params = gpu_params,
    .n_params = 2,
    .valid = gpu_valid,
    .default_config = gpu_default,
    .run = gpu_run,
};

/* ---- cpu --------------------------------------------------------------- */

static const int ch_vals[] = {256, 1024, 4096};
static const kern_param_desc cpu_params[] = {
    {"CH", ch_vals, 3, "columns per work item"},
};

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    (void)s;
    (void)m;
    (void)p;
    cfg->n = 1;
    cfg->v[0] = 1024;
}

static mt_status cpu_run(const kern_ctx *c, mt_err *err)
{
    return launch(c, (dev_dim3){kern_cdiv(c->shape->v[D_H], c->cfg->v[0]), (unsigned)c->m, 1},
                  (dev_dim3){1, 1, 1}, err);
}

static const kern_impl cpu_impl = {
    .source = "moe_combine.cpu",
    .params = cpu_params,
    .n_params = 1,
    .default_config = cpu_default,
    .run = cpu_run,
};

static const kern_case cases[] = {
    {"tiny", 1}, {"tiny", 3}, {"tiny", 17}, {"tiny-bf16", 64}, {"H=300,topk=1,shared=0,o=f32", 5},
};

const kern_family fam_moe_combine = {
    .name = "moe_combine",
    .version = 1,
    .summary = "deterministic sum of per-pair MoE rows (+ shared expert) per token",
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
