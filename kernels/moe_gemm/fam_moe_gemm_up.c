/* fam_moe_gemm_up.c: the `moe_gemm_up` family, stage 1 of the MoE layer.
 * For every (token, expert) pair p of the aligned layout (moe_common.h):
 *   h[p] = bf16( silu(x[t] . W_gate[e]^T) * (x[t] . W_up[e]^T) )
 * with MXFP4 weights in Quark layout (packed [N, K/2], low nibble first,
 * E8M0 scales [N, K/32]), gate and up either separate tensors (cat=0) or
 * concatenated per expert as [2I, H] (cat=1, gate first). Activations are
 * bf16 (a=bf16, a16w4) or quantized to MXFP4 per 32-block by the "even"
 * rule (a=mxfp4, a4w4: on GPUs once per launch by moe_act_quant, before
 * the GEMM). The problem's inputs already hold the
 * aligned layout for the runtime dim bm (the tile height moe_align padded
 * to); GPU tiles of BM rows must divide bm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/moe/moe_common.h"

enum { D_H, D_I, D_E, D_TOPK, D_A, D_CAT, D_WL, D_BM, D_SKEW, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_H] = {"H", KERN_DIM_INT, false, 128, 65536, "hidden size (K), a multiple of 128"},
    [D_I] = {"I", KERN_DIM_INT, false, 128, 65536,
             "expert intermediate size (N of gate and of up), a multiple of 128"},
    [D_E] = {"E", KERN_DIM_INT, false, 1, 1024, "routed experts"},
    [D_TOPK] = {"topk", KERN_DIM_INT, false, 1, 32, "experts per token"},
    [D_A] = {"a", KERN_DIM_DTYPE, false, 0, 0,
             "activations: bf16 (a16w4), mxfp4 (a4w4) or i8 (a8w4, cpu only), the last two "
             "quantized per 32-block"},
    [D_CAT] = {"cat", KERN_DIM_INT, false, 0, 1,
               "1: gate and up concatenated per expert [2I, H]; 0: separate tensors"},
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
    {"glm5.2", "H=6144,I=2048,E=256,topk=8,a=mxfp4,cat=1,bm=128,skew=0"},
    {"tiny", "H=256,I=128,E=16,topk=4,a=mxfp4,cat=1,bm=128,skew=0"},
    {"glm5.2-a16", "H=6144,I=2048,E=256,topk=8,a=bf16,cat=1,bm=128,skew=0"},
    {"tiny-a16", "H=256,I=128,E=16,topk=4,a=bf16,cat=1,bm=128,skew=0"},
    {"glm5.2-a8", "H=6144,I=2048,E=256,topk=8,a=i8,cat=1,bm=128,skew=0"},
    {"tiny-a8", "H=256,I=128,E=16,topk=4,a=i8,cat=1,bm=128,skew=0"},
};

static moe_gemm_dims gdims(const kern_shape *s)
{
    return (moe_gemm_dims){.h = s->v[D_H], .i = s->v[D_I], .e = s->v[D_E],
                           .topk = (int)s->v[D_TOPK], .a4 = s->v[D_A] == KERN_DT_MXFP4,
                           .a8 = s->v[D_A] == KERN_DT_I8};
}

/* Buffers: x, ids, sorted, tile_expert, total, then cat=1: w13, s13;
 * cat=0: wg, sg, wu, su; then h. */
enum { B_X, B_IDS, B_SORTED, B_TILE, B_TOTAL, B_W0 };

static int n_weight_bufs(const kern_shape *s) { return s->v[D_CAT] ? 2 : 4; }
static int out_buf(const kern_shape *s) { return B_W0 + n_weight_bufs(s); }

/* Packed and scale bytes between experts, and the offset of up after gate. */
static void strides(const kern_shape *s, int wl, int64_t *ws, int64_t *ss, int64_t *up_w,
                    int64_t *up_s)
{
    int64_t H = s->v[D_H], I = s->v[D_I];
    int rows = s->v[D_CAT] ? 2 : 1;
    *ws = rows * I * H / 2;
    *ss = rows * I * H / 32;
    /* wl=1: a row's weights and scales are together (moe_w4_group16) */
    *up_w = s->v[D_CAT] ? moe_w4_bytes(wl, I, H) : 0;
    *up_s = s->v[D_CAT] ? moe_w4_scale_bytes(wl, I, H) : 0;
}

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
    if (cap < 11)
        return 0;
    out[n++] = (kern_buf_desc){"x", KERN_BUF_IN, KERN_DT_BF16, (size_t)(m * H) * 2, H, 0, 0};
    out[n++] = (kern_buf_desc){"topk_ids", KERN_BUF_IN, KERN_DT_I32, (size_t)P * 4, 0, 0, 0};
    moe_layout_bufs(P, cap_rows, s->v[D_BM], out, &n);
    /* wl=1: the scales sit in the weights' buffers (moe_w4_group16) and
     * the scale buffers are empty. */
    int wl = (int)s->v[D_WL];
    if (s->v[D_CAT]) {
        out[n++] = (kern_buf_desc){"w13", KERN_BUF_IN, KERN_DT_U8,
                                   (size_t)moe_w4_bytes(wl, E * 2 * I, H), 0, 0, 0};
        out[n++] = (kern_buf_desc){"s13", KERN_BUF_IN, KERN_DT_U8,
                                   (size_t)moe_w4_scale_bytes(wl, E * 2 * I, H), 0, 0, 0};
    } else {
        size_t wb = (size_t)moe_w4_bytes(wl, E * I, H), sb = (size_t)moe_w4_scale_bytes(wl, E * I, H);
        out[n++] = (kern_buf_desc){"w_gate", KERN_BUF_IN, KERN_DT_U8, wb, 0, 0, 0};
        out[n++] = (kern_buf_desc){"s_gate", KERN_BUF_IN, KERN_DT_U8, sb, 0, 0, 0};
        out[n++] = (kern_buf_desc){"w_up", KERN_BUF_IN, KERN_DT_U8, wb, 0, 0, 0};
        out[n++] = (kern_buf_desc){"s_up", KERN_BUF_IN, KERN_DT_U8, sb, 0, 0, 0};
    }
    out[n++] = (kern_buf_desc){"h", KERN_BUF_OUT, KERN_DT_BF16, (size_t)(P * I) * 2, I, 2e-2, 2e-2};
    return n;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    int64_t H = s->v[D_H], I = s->v[D_I], E = s->v[D_E];
    int topk = (int)s->v[D_TOPK];
    moe_gen_bf16(&r, host[B_X], m * H, 1.0f);
    moe_gen_ids(&r, m, topk, (int)E, (int)s->v[D_SKEW], host[B_IDS]);
    moe_align_ref(host[B_IDS], m * topk, (int)E, (int)s->v[D_BM], host[B_SORTED],
                  host[B_TILE], host[B_TOTAL]);
    int wl = (int)s->v[D_WL];
    if (s->v[D_CAT]) {
        moe_gen_w4(&r, wl, E * 2 * I, H, host[B_W0], host[B_W0 + 1]);
    } else {
        moe_gen_w4(&r, wl, E * I, H, host[B_W0], host[B_W0 + 1]);
        moe_gen_w4(&r, wl, E * I, H, host[B_W0 + 2], host[B_W0 + 3]);
    }
}

/* Weight pointers of gate and up within the host or device buffers b,
 * which hold layout wl. */
static void weight_ptrs(const kern_shape *s, int wl, void *const *b, const uint8_t **wg,
                        const uint8_t **sg, const uint8_t **wu, const uint8_t **su)
{
    int64_t ws, ss, uw, us;
    strides(s, wl, &ws, &ss, &uw, &us);
    *wg = b[B_W0];
    *sg = b[B_W0 + 1];
    *wu = s->v[D_CAT] ? (const uint8_t *)b[B_W0] + uw : b[B_W0 + 2];
    *su = s->v[D_CAT] ? (const uint8_t *)b[B_W0 + 1] + us : b[B_W0 + 3];
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    moe_gemm_dims d = gdims(s);
    /* The reference reads the Quark layout. */
    int wl = (int)s->v[D_WL], cat = (int)s->v[D_CAT];
    int64_t rows = (cat ? 2 : 1) * d.e * d.i;
    moe_w4_view a = moe_w4_quark_view(wl, rows, d.h, host[B_W0], host[B_W0 + 1]);
    moe_w4_view b = cat ? (moe_w4_view){0}
                        : moe_w4_quark_view(wl, rows, d.h, host[B_W0 + 2], host[B_W0 + 3]);
    void *q[B_W0 + 4] = {0};
    q[B_W0] = a.w, q[B_W0 + 1] = a.s, q[B_W0 + 2] = b.w, q[B_W0 + 3] = b.s;
    const uint8_t *wg, *sg, *wu, *su;
    weight_ptrs(s, 0, q, &wg, &sg, &wu, &su);
    int64_t ws, ss, uw, us;
    strides(s, 0, &ws, &ss, &uw, &us);
    moe_up_ref(&d, host[B_X], host[B_IDS], wg, sg, wu, su, ws, ss, 0, m * d.topk, 1,
               host[out_buf(s)]);
    moe_w4_view_free(&a);
    moe_w4_view_free(&b);
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    int64_t H = s->v[D_H], I = s->v[D_I], E = s->v[D_E], P = m * s->v[D_TOPK];
    double used = moe_expected_experts(E, s->v[D_TOPK], m);
    *flops = 2.0 * (double)P * 2.0 * (double)I * (double)H;
    *bytes = used * 2.0 * (double)I * (double)H * (0.5 + 1.0 / 32) +
             (double)(m * H * 2) + (double)(P * I * 2);
}

/* ---- cpu --------------------------------------------------------------- */

static mt_status cpu_run(const kern_ctx *c, mt_err *err)
{
    const kern_shape *s = c->shape;
    int64_t H = s->v[D_H], I = s->v[D_I], P = c->m * s->v[D_TOPK];
    int32_t bm = (int32_t)s->v[D_BM], np = (int32_t)P, K = (int32_t)H;
    int nt = kern_config_get(c->impl, c->cfg, "NT", 64);
    int64_t ws, ss, uw, us;
    strides(s, (int)s->v[D_WL], &ws, &ss, &uw, &us);
    const uint8_t *wg, *sg, *wu, *su;
    weight_ptrs(s, (int)s->v[D_WL], c->bufs, &wg, &sg, &wu, &su);
    dev_kernel *kp, *ku;
    mt_status st = kern_get(c, "moe_prep", "ppi", &kp, err);
    if (st == MT_OK)
        st = kern_get(c, "moe_up", "ppppppppllpii", &ku, err);
    if (st != MT_OK)
        return st;
    void *x = c->bufs[B_X], *act = c->scratch;
    void *pa[] = {&x, &act, &K};
    st = dev_launch(c->dev, kp, (dev_dim3){(unsigned)c->m, 1, 1}, (dev_dim3){1, 1, 1}, 0, pa, err);
    if (st != MT_OK)
        return st;
    void *sorted = c->bufs[B_SORTED], *tile = c->bufs[B_TILE], *total = c->bufs[B_TOTAL];
    void *h = c->bufs[out_buf(s)];
    void *args[] = {&act, &sorted, &tile, &total, &wg, &sg, &wu, &su, &ws, &ss, &h, &np, &bm};
    int64_t tiles = moe_cap_rows(P, s->v[D_E], bm) / bm;
    return dev_launch(c->dev, ku, (dev_dim3){(unsigned)(I / nt), (unsigned)tiles, 1},
                      (dev_dim3){1, 1, 1}, 0, args, err);
}

static size_t cpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    (void)cfg;
    return moe_cpu_act_bytes(m, s->v[D_H]);
}

static bool cpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg,
                      const dev_props *p, char *why, size_t cap)
{
    (void)m;
    (void)p;
    return moe_cpu_valid(s->v[D_H], s->v[D_I], (int)s->v[D_WL], cfg, why, cap);
}

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    moe_cpu_default(s->v[D_H], s->v[D_I], m * s->v[D_TOPK], s->v[D_E], true,
                    s->v[D_A] != KERN_DT_BF16, (int)s->v[D_WL], p, cfg);
}

static const kern_impl cpu_impl = {
    .source = "moe_gemm.cpu",
    .params = moe_cpu_params,
    .n_params = MOE_CPU_NPARAMS,
    .valid = cpu_valid,
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
    return moe_gpu_valid(s->v[D_H], s->v[D_I], s->v[D_BM], true, 0, cfg, p, why, cap);
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    moe_gpu_default(s->v[D_H], s->v[D_I], s->v[D_BM], true, 0, m * s->v[D_TOPK], s->v[D_E], p,
                    cfg);
}

static int gpu_defines(const kern_shape *s, const kern_config *cfg, const dev_props *p,
                       dev_define *out, char (*buf)[64], int cap)
{
    (void)s;
    (void)cfg;
    return moe_gpu_defines(true, p, out, buf, cap);
}

/* Split-K partials [SPLITK][npairs][2I], then for a4w4 x quantized by
 * moe_act_quant (once per launch, read by every N tile). */
static size_t partial_bytes(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    int sk = cfg->v[MOE_GPU_SPLITK];
    return sk > 1 ? (size_t)sk * (size_t)(m * s->v[D_TOPK]) * (size_t)(2 * s->v[D_I]) * 4 : 0;
}

static size_t gpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    size_t part = partial_bytes(s, m, cfg);
    if (s->v[D_A] != KERN_DT_MXFP4)
        return part;
    return moe_gpu_act_offset(part) + moe_gpu_act_bytes(m, s->v[D_H]);
}

static mt_status gpu_run(const kern_ctx *c, mt_err *err)
{
    const kern_shape *s = c->shape;
    const int *v = c->cfg->v;
    int64_t I = s->v[D_I], P = c->m * s->v[D_TOPK];
    int32_t bm = (int32_t)s->v[D_BM], np = (int32_t)P;
    /* tiles of BM rows; the decode path (GEMV) takes the layout's bm tiles */
    int32_t ntm = (int32_t)(moe_cap_rows(P, s->v[D_E], bm) / (v[MOE_GPU_GEMV] ? bm : v[MOE_GPU_BM]));
    int64_t ws, ss, uw, us;
    strides(s, (int)s->v[D_WL], &ws, &ss, &uw, &us);
    const uint8_t *wg, *sg, *wu, *su;
    weight_ptrs(s, (int)s->v[D_WL], c->bufs, &wg, &sg, &wu, &su);
    void *x = c->bufs[B_X], *xq = NULL, *xqs = NULL;
    mt_status st = MT_OK;
    if (s->v[D_A] == KERN_DT_MXFP4)
        st = moe_gpu_act_quant(c, x, c->m, s->v[D_H], partial_bytes(s, c->m, c->cfg), &xq,
                               &xqs, err);
    dev_kernel *k;
    if (st == MT_OK)
        st = kern_get(c, "moe_gemm_up", "ppppppppppllppiii", &k, err);
    if (st != MT_OK)
        return st;
    void *sorted = c->bufs[B_SORTED], *tile = c->bufs[B_TILE], *total = c->bufs[B_TOTAL],
         *h = c->bufs[out_buf(s)], *part = c->scratch;
    void *args[] = {&x, &xq, &xqs, &sorted, &tile, &total, &wg, &sg, &wu, &su, &ws, &ss, &h,
                    &part, &np, &bm, &ntm};
    int64_t gx = v[MOE_GPU_GEMV] ? moe_gemv_blocks(P, s->v[D_E], I, c->cfg)
                                 : ntm * (I / v[MOE_GPU_BN]);
    dev_dim3 grid = {(unsigned)gx, (unsigned)v[MOE_GPU_SPLITK], 1};
    dev_dim3 block = {(unsigned)(v[MOE_GPU_WAVES] * c->props->warp_size), 1, 1};
    st = dev_launch(c->dev, k, grid, block, 0, args, err);
    if (st != MT_OK || v[MOE_GPU_SPLITK] == 1)
        return st;
    dev_kernel *kf;
    st = kern_get(c, "moe_up_finish", "ppi", &kf, err);
    if (st != MT_OK)
        return st;
    void *fargs[] = {&part, &h, &np};
    return dev_launch(c->dev, kf, (dev_dim3){kern_cdiv(P * I, 256), 1, 1}, (dev_dim3){256, 1, 1},
                      0, fargs, err);
}

static const kern_impl gpu_impl = {
    .source = "moe_gemm.hip",
    .params = moe_gpu_params,
    .n_params = MOE_GPU_NPARAMS,
    .valid = gpu_valid,
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
    {"tiny-a16", 3},
    {"tiny-a16", 64},
    {"H=256,I=128,E=16,topk=4,a=mxfp4,cat=0,bm=16,skew=0", 17},
    {"H=256,I=128,E=16,topk=4,a=mxfp4,cat=1,bm=32,skew=1", 64},
    {"H=256,I=128,E=16,topk=1,a=mxfp4,cat=1,bm=16,skew=1", 33},
    {"H=384,I=256,E=8,topk=2,a=bf16,cat=0,bm=64,skew=2", 17},
    /* weights grouped by 16 rows (cpu only) */
    {"H=256,I=128,E=16,topk=4,a=mxfp4,cat=1,wl=1,bm=128,skew=0", 1},
    {"H=384,I=256,E=8,topk=2,a=i8,cat=0,wl=1,bm=64,skew=2", 17},
    {"H=256,I=128,E=4,topk=2,a=bf16,cat=1,wl=1,bm=128,skew=0", 67},
};

const kern_family fam_moe_gemm_up = {
    .name = "moe_gemm_up",
    .version = 3, /* 2: the MMA parameter; 3: GEMV (the decode path) */
    .summary = "MoE stage 1: h = silu(x Wg^T) * (x Wu^T) per routed pair, MXFP4 weights",
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
