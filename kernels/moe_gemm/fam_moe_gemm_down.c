/* fam_moe_gemm_down.c: the `moe_gemm_down` family, stage 2 of the MoE
 * layer. For every pair p = (token t, slot j) of the aligned layout:
 *   v = topk_w[p] * (act(h[p]) . W_down[e]^T)          (MXFP4 weights)
 * and, by the shape's combine path:
 *   comb=0  y[t] += v in the GEMM's epilogue with atomics (y is in-out:
 *           the caller's accumulator, e.g. the shared expert's output);
 *   comb=1  rows[p] = v, reduced afterwards by the deterministic
 *           moe_combine family.
 * Both paths are real; the runtime compares the tuned times of
 * (moe_gemm_down comb=0) and (moe_gemm_down comb=1 + moe_combine) for its
 * shapes. Activations are the bf16 stage-1 output h [pairs, I], used as
 * bf16 (a16w4) or quantized per 32-block (a4w4: on GPUs once per launch
 * by moe_act_quant, before the GEMM). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/moe/moe_common.h"

enum { D_H, D_I, D_E, D_TOPK, D_A, D_COMB, D_WL, D_BM, D_SKEW, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_H] = {"H", KERN_DIM_INT, false, 128, 65536, "hidden size (N), a multiple of 128"},
    [D_I] = {"I", KERN_DIM_INT, false, 128, 65536,
             "expert intermediate size (K), a multiple of 128"},
    [D_E] = {"E", KERN_DIM_INT, false, 1, 1024, "routed experts"},
    [D_TOPK] = {"topk", KERN_DIM_INT, false, 1, 32, "experts per token"},
    [D_A] = {"a", KERN_DIM_DTYPE, false, 0, 0,
             "activations: bf16 (a16w4), mxfp4 (a4w4) or i8 (a8w4, cpu only), the last two "
             "quantized per 32-block"},
    [D_COMB] = {"comb", KERN_DIM_INT, false, 0, 1,
                "0: atomically accumulate into y; 1: write weighted per-pair rows"},
    [D_WL] = {"wl", KERN_DIM_INT_OPT, false, 0, 1,
              "weight layout: 0 Quark rows; 1 rows grouped by 16 (the cpu tiles' layout, "
              "made at load time; cpu only; moe_w4_group16)"},
    [D_BM] = {"bm", KERN_DIM_INT, true, 16, 256,
              "tile height moe_align padded each expert's segment to"},
    [D_SKEW] = {"skew", KERN_DIM_INT, true, 0, 2,
                "routing of generated problems: 0 uniform, 1 every token on expert E-1, "
                "2 only 2*topk experts used"},
};

static const kern_preset presets[] = {
    {"glm5.2", "H=6144,I=2048,E=256,topk=8,a=mxfp4,comb=0,bm=128,skew=0"},
    {"tiny", "H=256,I=128,E=16,topk=4,a=mxfp4,comb=0,bm=128,skew=0"},
    {"glm5.2-rows", "H=6144,I=2048,E=256,topk=8,a=mxfp4,comb=1,bm=128,skew=0"},
    {"tiny-rows", "H=256,I=128,E=16,topk=4,a=mxfp4,comb=1,bm=128,skew=0"},
    {"glm5.2-a16", "H=6144,I=2048,E=256,topk=8,a=bf16,comb=0,bm=128,skew=0"},
    {"tiny-a16", "H=256,I=128,E=16,topk=4,a=bf16,comb=0,bm=128,skew=0"},
    {"glm5.2-a8", "H=6144,I=2048,E=256,topk=8,a=i8,comb=0,bm=128,skew=0"},
    {"tiny-a8", "H=256,I=128,E=16,topk=4,a=i8,comb=0,bm=128,skew=0"},
    {"glm5.2-a8-rows", "H=6144,I=2048,E=256,topk=8,a=i8,comb=1,bm=128,skew=0"},
};

static moe_gemm_dims gdims(const kern_shape *s)
{
    return (moe_gemm_dims){.h = s->v[D_H], .i = s->v[D_I], .e = s->v[D_E],
                           .topk = (int)s->v[D_TOPK], .a4 = s->v[D_A] == KERN_DT_MXFP4,
                           .a8 = s->v[D_A] == KERN_DT_I8};
}

enum { B_H, B_IDS, B_SORTED, B_TILE, B_TOTAL, B_TOPKW, B_W, B_S, B_OUT, B_COUNT };

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    (void)m;
    if (s->v[D_A] != KERN_DT_BF16 && s->v[D_A] != KERN_DT_MXFP4 && s->v[D_A] != KERN_DT_I8) {
        snprintf(why, cap, "a=%s: activations are bf16, mxfp4 or i8",
                 kern_dtype_name((kern_dtype)s->v[D_A]));
        return false;
    }
    if (s->v[D_H] % 128 || s->v[D_I] % 128) {
        snprintf(why, cap, "H=%lld and I=%lld must be multiples of 128",
                 (long long)s->v[D_H], (long long)s->v[D_I]);
        return false;
    }
    if (s->v[D_TOPK] > s->v[D_E]) {
        snprintf(why, cap, "topk=%lld exceeds E=%lld", (long long)s->v[D_TOPK],
                 (long long)s->v[D_E]);
        return false;
    }
    if (s->v[D_BM] & (s->v[D_BM] - 1)) {
        snprintf(why, cap, "bm=%lld is not a power of two", (long long)s->v[D_BM]);
        return false;
    }
    return true;
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    int64_t H = s->v[D_H], I = s->v[D_I], E = s->v[D_E], P = m * s->v[D_TOPK];
    int64_t cap_rows = moe_cap_rows(P, E, s->v[D_BM]);
    int n = 0;
    if (cap < B_COUNT)
        return 0;
    out[n++] = (kern_buf_desc){"h", KERN_BUF_IN, KERN_DT_BF16, (size_t)(P * I) * 2, I, 0, 0};
    out[n++] = (kern_buf_desc){"topk_ids", KERN_BUF_IN, KERN_DT_I32, (size_t)P * 4, 0, 0, 0};
    moe_layout_bufs(P, cap_rows, s->v[D_BM], out, &n);
    out[n++] = (kern_buf_desc){"topk_w", KERN_BUF_IN, KERN_DT_F32, (size_t)P * 4, 0, 0, 0};
    /* wl=1: the scales sit in w_down (moe_w4_group16); s_down is empty. */
    int wl = (int)s->v[D_WL];
    out[n++] = (kern_buf_desc){"w_down", KERN_BUF_IN, KERN_DT_U8, (size_t)moe_w4_bytes(wl, E * H, I),
                               0, 0, 0};
    out[n++] = (kern_buf_desc){"s_down", KERN_BUF_IN, KERN_DT_U8,
                               (size_t)moe_w4_scale_bytes(wl, E * H, I), 0, 0, 0};
    if (s->v[D_COMB])
        out[n++] = (kern_buf_desc){"rows", KERN_BUF_OUT, KERN_DT_F32, (size_t)(P * H) * 4, H,
                                   1e-4, 1e-3};
    else
        out[n++] = (kern_buf_desc){"y", KERN_BUF_INOUT, KERN_DT_F32, (size_t)(m * H) * 4, H,
                                   1e-4, 1e-3};
    return n;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    int64_t H = s->v[D_H], I = s->v[D_I], E = s->v[D_E];
    int topk = (int)s->v[D_TOPK];
    int64_t P = m * topk;
    moe_gen_bf16(&r, host[B_H], P * I, 1.0f);
    moe_gen_ids(&r, m, topk, (int)E, (int)s->v[D_SKEW], host[B_IDS]);
    moe_align_ref(host[B_IDS], P, (int)E, (int)s->v[D_BM], host[B_SORTED], host[B_TILE],
                  host[B_TOTAL]);
    float *w = host[B_TOPKW];
    for (int64_t p = 0; p < P; p++)
        w[p] = mt_rng_uniform(&r, 0.05f, 1.0f);
    moe_gen_w4(&r, (int)s->v[D_WL], E * H, I, host[B_W], host[B_S]);
    if (!s->v[D_COMB]) {
        float *y = host[B_OUT];
        for (int64_t i = 0; i < m * H; i++)
            y[i] = mt_rng_normal(&r);
    }
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    moe_gemm_dims d = gdims(s);
    moe_w4_view q = moe_w4_quark_view((int)s->v[D_WL], d.e * d.h, d.i, host[B_W], host[B_S]);
    moe_down_ref(&d, host[B_H], host[B_IDS], host[B_TOPKW], q.w, q.s, 0, m * d.topk, 1,
                 s->v[D_COMB] ? host[B_OUT] : NULL, s->v[D_COMB] ? NULL : host[B_OUT]);
    moe_w4_view_free(&q);
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    int64_t H = s->v[D_H], I = s->v[D_I], E = s->v[D_E], P = m * s->v[D_TOPK];
    double used = moe_expected_experts(E, s->v[D_TOPK], m);
    *flops = 2.0 * (double)P * (double)I * (double)H;
    *bytes = used * (double)I * (double)H * (0.5 + 1.0 / 32) + (double)(P * I * 2) +
             (double)(s->v[D_COMB] ? P * H * 4 : 2 * m * H * 4);
}

/* ---- cpu --------------------------------------------------------------- */

static mt_status cpu_run(const kern_ctx *c, mt_err *err)
{
    const kern_shape *s = c->shape;
    int64_t H = s->v[D_H], I = s->v[D_I], E = s->v[D_E], P = c->m * s->v[D_TOPK];
    int32_t bm = (int32_t)s->v[D_BM], np = (int32_t)P, K = (int32_t)I;
    int nt = kern_config_get(c->impl, c->cfg, "NT", 64);
    int64_t ws = H * I / 2, ss = H * I / 32;
    dev_kernel *kp, *kd;
    mt_status st = kern_get(c, "moe_prep", "ppi", &kp, err);
    if (st == MT_OK)
        st = kern_get(c, "moe_down", "ppppppllppii", &kd, err);
    if (st != MT_OK)
        return st;
    void *h = c->bufs[B_H], *act = c->scratch;
    void *pa[] = {&h, &act, &K};
    st = dev_launch(c->dev, kp, (dev_dim3){(unsigned)P, 1, 1}, (dev_dim3){1, 1, 1}, 0, pa, err);
    if (st != MT_OK)
        return st;
    void *sorted = c->bufs[B_SORTED], *tile = c->bufs[B_TILE], *total = c->bufs[B_TOTAL];
    void *w = c->bufs[B_W], *sc = c->bufs[B_S], *tw = c->bufs[B_TOPKW], *out = c->bufs[B_OUT];
    void *args[] = {&act, &sorted, &tile, &total, &w, &sc, &ws, &ss, &tw, &out, &np, &bm};
    int64_t tiles = moe_cap_rows(P, E, bm) / bm;
    return dev_launch(c->dev, kd, (dev_dim3){(unsigned)(H / nt), (unsigned)tiles, 1},
                      (dev_dim3){1, 1, 1}, 0, args, err);
}

static size_t cpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    (void)cfg;
    return moe_cpu_act_bytes(m * s->v[D_TOPK], s->v[D_I]);
}

static bool cpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg,
                      const dev_props *p, char *why, size_t cap)
{
    (void)m;
    (void)p;
    return moe_cpu_valid(s->v[D_I], s->v[D_H], (int)s->v[D_WL], cfg, why, cap);
}

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    moe_cpu_default(s->v[D_I], s->v[D_H], m * s->v[D_TOPK], s->v[D_E], false,
                    s->v[D_A] != KERN_DT_BF16, (int)s->v[D_WL], p, cfg);
}

/* comb=0 adds every pair's row into y with float atomics, in the order the
 * work items happen to run. With one expert per token (the shared expert
 * as a one-expert MoE) and no split K, each element of y gets one add: no
 * order to vary. */
static bool comb_varies(const kern_shape *s, int splitk, char *why, size_t cap)
{
    if (s->v[D_COMB] || (s->v[D_TOPK] == 1 && splitk <= 1))
        return false;
    snprintf(why, cap, "comb=0 adds %s into y with float atomics",
             s->v[D_TOPK] > 1 ? "the pairs' rows" : "split-K partial rows");
    return true;
}

static bool cpu_order_varies(const kern_shape *s, const kern_config *cfg, char *why, size_t cap)
{
    (void)cfg;
    return comb_varies(s, 1, why, cap);
}

/* The decode path (GEMV) never adds with atomics: moe_down_finish sums. */
static bool gpu_order_varies(const kern_shape *s, const kern_config *cfg, char *why, size_t cap)
{
    if (cfg->v[MOE_GPU_GEMV])
        return false;
    return comb_varies(s, cfg->v[MOE_GPU_SPLITK], why, cap);
}

static const kern_impl cpu_impl = {
    .source = "moe_gemm.cpu",
    .params = moe_cpu_params,
    .n_params = MOE_CPU_NPARAMS,
    .valid = cpu_valid,
    .order_varies = cpu_order_varies,
    .default_config = cpu_default,
    .scratch_bytes = cpu_scratch,
    .run = cpu_run,
};

/* ---- gpu --------------------------------------------------------------- */

static bool gpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg,
                      const dev_props *p, char *why, size_t cap)
{
    (void)m;
    if (s->v[D_A] == KERN_DT_I8) {
        snprintf(why, cap, "a=i8 (a8w4) has a cpu kernel only");
        return false;
    }
    if (s->v[D_WL]) {
        snprintf(why, cap, "wl=1 (rows grouped by 16) is the cpu kernels' layout");
        return false;
    }
    return moe_gpu_valid(s->v[D_I], s->v[D_H], s->v[D_BM], false, (int)s->v[D_COMB], cfg, p,
                         why, cap);
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    moe_gpu_default(s->v[D_I], s->v[D_H], s->v[D_BM], false, (int)s->v[D_COMB],
                    m * s->v[D_TOPK], s->v[D_E], p, cfg);
}

static int gpu_defines(const kern_shape *s, const kern_config *cfg, const dev_props *p,
                       dev_define *out, char (*buf)[64], int cap)
{
    (void)s;
    (void)cfg;
    return moe_gpu_defines(false, p, out, buf, cap);
}

/* The decode path's partials [SPLITK][npairs][H], summed by
 * moe_down_finish: for comb=0 always (y gets no atomics), for comb=1 when
 * K is split. */
static bool gemv_partials(const kern_shape *s, const kern_config *cfg)
{
    return cfg->v[MOE_GPU_GEMV] && (!s->v[D_COMB] || cfg->v[MOE_GPU_SPLITK] > 1);
}

static size_t partial_bytes(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    if (!gemv_partials(s, cfg))
        return 0;
    return (size_t)cfg->v[MOE_GPU_SPLITK] * (size_t)(m * s->v[D_TOPK]) * (size_t)s->v[D_H] * 4;
}

/* The partials, then for a4w4 h quantized by moe_act_quant (once per
 * launch, read by every N tile). */
static size_t gpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    size_t part = partial_bytes(s, m, cfg);
    if (s->v[D_A] != KERN_DT_MXFP4)
        return part;
    return moe_gpu_act_offset(part) + moe_gpu_act_bytes(m * s->v[D_TOPK], s->v[D_I]);
}

static mt_status gpu_run(const kern_ctx *c, mt_err *err)
{
    const kern_shape *s = c->shape;
    const int *v = c->cfg->v;
    int64_t H = s->v[D_H], I = s->v[D_I], P = c->m * s->v[D_TOPK];
    int32_t bm = (int32_t)s->v[D_BM], np = (int32_t)P;
    /* tiles of BM rows; the decode path (GEMV) takes the layout's bm tiles */
    int32_t ntm = (int32_t)(moe_cap_rows(P, s->v[D_E], bm) / (v[MOE_GPU_GEMV] ? bm : v[MOE_GPU_BM]));
    int64_t ws = H * I / 2, ss = H * I / 32;
    void *h = c->bufs[B_H], *hq = NULL, *hqs = NULL;
    mt_status st = MT_OK;
    if (s->v[D_A] == KERN_DT_MXFP4)
        st = moe_gpu_act_quant(c, h, P, I, partial_bytes(s, c->m, c->cfg), &hq, &hqs, err);
    dev_kernel *k;
    if (st == MT_OK)
        st = kern_get(c, "moe_gemm_down", "ppppppppllpppiii", &k, err);
    if (st != MT_OK)
        return st;
    void *sorted = c->bufs[B_SORTED], *tile = c->bufs[B_TILE], *total = c->bufs[B_TOTAL],
         *w = c->bufs[B_W], *sc = c->bufs[B_S], *tw = c->bufs[B_TOPKW], *out = c->bufs[B_OUT],
         *part = c->scratch;
    void *args[] = {&h,  &hq, &hqs, &sorted, &tile, &total, &w,  &sc,
                    &ws, &ss, &tw,  &out,    &part, &np,    &bm, &ntm};
    int64_t gx = v[MOE_GPU_GEMV] ? moe_gemv_blocks(P, s->v[D_E], H, c->cfg)
                                 : ntm * (H / v[MOE_GPU_BN]);
    dev_dim3 grid = {(unsigned)gx, (unsigned)v[MOE_GPU_SPLITK], 1};
    dev_dim3 block = {(unsigned)(v[MOE_GPU_WAVES] * c->props->warp_size), 1, 1};
    st = dev_launch(c->dev, k, grid, block, 0, args, err);
    if (st != MT_OK || !gemv_partials(s, c->cfg))
        return st;
    dev_kernel *kf;
    st = kern_get(c, "moe_down_finish", "pppi", &kf, err);
    if (st != MT_OK)
        return st;
    void *fargs[] = {&part, &tw, &out, &np};
    int64_t rows = s->v[D_COMB] ? P : c->m;
    return dev_launch(c->dev, kf, (dev_dim3){kern_cdiv(rows * H, 256), 1, 1},
                      (dev_dim3){256, 1, 1}, 0, fargs, err);
}

static const kern_impl gpu_impl = {
    .source = "moe_gemm.hip",
    .params = moe_gpu_params,
    .n_params = MOE_GPU_NPARAMS,
    .valid = gpu_valid,
    .order_varies = gpu_order_varies,
    .default_config = gpu_default,
    .defines = gpu_defines,
    .scratch_bytes = gpu_scratch,
    .run = gpu_run,
};

/* ---- family ------------------------------------------------------------ */

static const kern_case cases[] = {
    {"tiny", 1},
    {"tiny", 3},
    {"tiny", 17},
    {"tiny", 64},
    {"tiny-rows", 1},
    {"tiny-rows", 17},
    {"tiny-a16", 3},
    {"tiny-a16", 64},
    {"H=256,I=128,E=16,topk=4,a=mxfp4,comb=1,bm=16,skew=1", 64},
    {"H=256,I=128,E=16,topk=1,a=mxfp4,comb=0,bm=16,skew=1", 33},
    {"H=384,I=256,E=8,topk=2,a=bf16,comb=1,bm=64,skew=2", 17},
    /* weights grouped by 16 rows (cpu only) */
    {"H=256,I=128,E=16,topk=4,a=mxfp4,comb=1,wl=1,bm=128,skew=0", 17},
    {"H=384,I=256,E=8,topk=2,a=i8,comb=0,wl=1,bm=64,skew=2", 64},
    {"H=384,I=256,E=8,topk=2,a=bf16,comb=0,wl=1,bm=64,skew=2", 64},
};

const kern_family fam_moe_gemm_down = {
    .name = "moe_gemm_down",
    .version = 3, /* 2: the MMA parameter; 3: GEMV (the decode path) */
    .summary = "MoE stage 2: y += w * (h Wd^T) per routed pair (atomics) or per-pair rows",
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
