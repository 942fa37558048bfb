/* fam_mxfp4_quant.c: the `mxfp4_quant` family: dynamic MXFP4 quantization of
 * activation rows [M, K] (bf16 or f32) into Quark layout (packed [M, K/2],
 * element 2i in the low nibble; E8M0 scales [M, K/32]) by the "even" rule
 * of kernels/mxfp4.h. Compared bit for bit with mxfp4_quantize_row. */
#include <math.h>
#include <stdio.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"
#include "common/mxfp4.h"

enum { D_K, D_A, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_K] = {"K", KERN_DIM_INT, false, 32, 1 << 20, "row length, a multiple of 32"},
    [D_A] = {"a", KERN_DIM_DTYPE, false, 0, 0, "input type: bf16 or f32"},
};

static const kern_preset presets[] = {
    {"glm5.2", "K=6144,a=bf16"},
    {"tiny", "K=256,a=bf16"},
    {"glm5.2-inter", "K=2048,a=bf16"},
    {"tiny-f32", "K=256,a=f32"},
};

enum { B_X, B_Q, B_S, B_COUNT };

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    (void)m;
    if (s->v[D_K] % 32) {
        snprintf(why, cap, "K=%lld is not a multiple of 32", (long long)s->v[D_K]);
        return false;
    }
    if (s->v[D_A] != KERN_DT_BF16 && s->v[D_A] != KERN_DT_F32) {
        snprintf(why, cap, "a=%s: the input is bf16 or f32",
                 kern_dtype_name((kern_dtype)s->v[D_A]));
        return false;
    }
    return true;
}

static size_t esize(const kern_shape *s) { return s->v[D_A] == KERN_DT_BF16 ? 2 : 4; }

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return 0;
    int64_t K = s->v[D_K];
    out[B_X] = (kern_buf_desc){"x", KERN_BUF_IN, (kern_dtype)s->v[D_A], (size_t)(m * K) * esize(s), K, 0, 0};
    out[B_Q] = (kern_buf_desc){"packed", KERN_BUF_OUT, KERN_DT_U8, (size_t)(m * K / 2), 0, 0, 0};
    out[B_S] = (kern_buf_desc){"scales", KERN_BUF_OUT, KERN_DT_U8, (size_t)(m * K / 32), 0, 0, 0};
    return B_COUNT;
}

/* Normal values with per-block magnitudes spread over many binades, some
 * exact ties of the E2M1 grid, zero blocks and amax mantissas >= 1.75. */
static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    int64_t n = m * s->v[D_K];
    for (int64_t b = 0; b < n / 32; b++) {
        int kind = (int)mt_rng_below(&r, 8);
        float mag = ldexpf(1.0f, (int)mt_rng_below(&r, 40) - 20);
        for (int i = 0; i < 32; i++) {
            float v;
            if (kind == 0)
                v = 0.0f;
            else if (kind == 1) /* grid points and midpoints: ties */
                v = (float)((int)mt_rng_below(&r, 25) - 12) * 0.25f * mag;
            else if (kind == 2 && i == 0)
                v = 1.875f * mag; /* mantissa >= 1.75: the rule rounds up */
            else
                v = mt_rng_normal(&r) * mag;
            if (s->v[D_A] == KERN_DT_BF16)
                ((uint16_t *)host[B_X])[b * 32 + i] = mt_f32_to_bf16(v);
            else
                ((float *)host[B_X])[b * 32 + i] = v;
        }
    }
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    int64_t K = s->v[D_K];
    for (int64_t t = 0; t < m; t++) {
        uint8_t *q = (uint8_t *)host[B_Q] + t * (K / 2), *sc = (uint8_t *)host[B_S] + t * (K / 32);
        if (s->v[D_A] == KERN_DT_BF16)
            mxfp4_quantize_row_bf16((const uint16_t *)host[B_X] + t * K, K, q, sc);
        else
            mxfp4_quantize_row((const float *)host[B_X] + t * K, K, q, sc);
    }
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    int64_t n = m * s->v[D_K];
    *flops = (double)n * 2;
    *bytes = (double)n * ((double)esize(s) + 0.5 + 1.0 / 32);
}

static mt_status launch(const kern_ctx *c, dev_dim3 grid, dev_dim3 block, mt_err *err)
{
    dev_kernel *k;
    mt_status st = kern_get(c, "mxfp4_quant", "pppi", &k, err);
    if (st != MT_OK)
        return st;
    int32_t m = (int32_t)c->m;
    void *x = c->bufs[B_X], *q = c->bufs[B_Q], *sc = c->bufs[B_S];
    void *args[] = {&x, &q, &sc, &m};
    return dev_launch(c->dev, k, grid, block, 0, args, err);
}

/* ---- gpu --------------------------------------------------------------- */

static const int threads_vals[] = {64, 128, 256, 512};
static const int lpb_vals[] = {1, 2, 4, 8, 16};
static const kern_param_desc gpu_params[] = {
    {"THREADS", threads_vals, 4, "threads per block"},
    {"LPB", lpb_vals, 5, "lanes sharing one 32-element block"},
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
    (void)p;
    cfg->n = 2;
    cfg->v[0] = 256;
    cfg->v[1] = 4;
}

static mt_status gpu_run(const kern_ctx *c, mt_err *err)
{
    int64_t lanes = c->m * (c->shape->v[D_K] / 32) * c->cfg->v[1];
    return launch(c, (dev_dim3){kern_cdiv(lanes, c->cfg->v[0]), 1, 1},
                  (dev_dim3){(unsigned)c->cfg->v[0], 1, 1}, err);
}

static const kern_impl gpu_impl = {
    .source = "mxfp4_quant.hip",
    .params = gpu_params,
    .n_params = 2,
    .valid = gpu_valid,
    .default_config = gpu_default,
    .run = gpu_run,
};

/* ---- cpu --------------------------------------------------------------- */

static const int rb_vals[] = {1, 4, 16};
static const kern_param_desc cpu_params[] = {
    {"RB", rb_vals, 3, "rows per work item"},
};

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    (void)s;
    (void)p;
    cfg->n = 1;
    cfg->v[0] = m >= 64 ? 4 : 1;
}

static mt_status cpu_run(const kern_ctx *c, mt_err *err)
{
    return launch(c, (dev_dim3){kern_cdiv(c->m, c->cfg->v[0]), 1, 1}, (dev_dim3){1, 1, 1}, err);
}

static const kern_impl cpu_impl = {
    .source = "mxfp4_quant.cpu",
    .params = cpu_params,
    .n_params = 1,
    .default_config = cpu_default,
    .run = cpu_run,
};

static const kern_case cases[] = {
    {"tiny", 1}, {"tiny", 3}, {"tiny", 17}, {"tiny-f32", 64}, {"K=96,a=f32", 5},
};

const kern_family fam_mxfp4_quant = {
    .name = "mxfp4_quant",
    .version = 1,
    .summary = "dynamic MXFP4 quantization of activations (Quark layout, even scale rule)",
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
