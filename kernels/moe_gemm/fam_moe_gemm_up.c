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
 * to); GPU tiles of BM rows must divide bm. What this stage shares with
 * stage 2 is in moe_gemm_family.c. */

#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/moe/moe_common.h"
#include "moe_gemm_family.h"

static const kern_dim_desc dims[MG_D_COUNT] = {
    MG_DIMS("hidden size (K), a multiple of 128",
            "expert intermediate size (N of gate and of up), a multiple of 128"),
    [MG_D_CAT] = {"cat", KERN_DIM_INT, false, 0, 1,
                  "1: gate and up concatenated per expert [2I, H]; 0: separate tensors"},
};

static const kern_preset presets[] = {
    {"glm5.2", "H=6144,I=2048,E=256,topk=8,a=mxfp4,cat=1,bm=128,skew=0"},
    {"tiny", "H=256,I=128,E=16,topk=4,a=mxfp4,cat=1,bm=128,skew=0"},
    {"glm5.2-a16", "H=6144,I=2048,E=256,topk=8,a=bf16,cat=1,bm=128,skew=0"},
    {"tiny-a16", "H=256,I=128,E=16,topk=4,a=bf16,cat=1,bm=128,skew=0"},
    {"glm5.2-a8", "H=6144,I=2048,E=256,topk=8,a=i8,cat=1,bm=128,skew=0"},
    {"tiny-a8", "H=256,I=128,E=16,topk=4,a=i8,cat=1,bm=128,skew=0"},
};

/* Buffers: x, ids, sorted, tile_expert, total (moe_gemm_family.h), then
 * cat=1: w13, s13; cat=0: wg, sg, wu, su; then h. */
enum { B_W0 = MG_B_STAGE };

static int n_weight_bufs(const kern_shape *s) { return s->v[MG_D_CAT] ? 2 : 4; }
static int out_buf(const kern_shape *s) { return B_W0 + n_weight_bufs(s); }

/* Packed and scale bytes between experts, and the offset of up after gate. */
static void strides(const kern_shape *s, int wl, int64_t *ws, int64_t *ss, int64_t *up_w,
                    int64_t *up_s)
{
    int64_t H = s->v[MG_D_H], I = s->v[MG_D_I];
    int rows = s->v[MG_D_CAT] ? 2 : 1;
    *ws = rows * I * H / 2;
    *ss = rows * I * H / 32;
    /* wl=1: a row's weights and scales are together (moe_w4_group16) */
    *up_w = s->v[MG_D_CAT] ? moe_w4_bytes(wl, I, H) : 0;
    *up_s = s->v[MG_D_CAT] ? moe_w4_scale_bytes(wl, I, H) : 0;
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    int64_t H = s->v[MG_D_H], I = s->v[MG_D_I], E = s->v[MG_D_E], P = m * s->v[MG_D_TOPK];
    if (cap < 11)
        return 0;
    int n = mg_buffers(s, m, true, out);
    /* wl=1: the scales sit in the weights' buffers (moe_w4_group16) and
     * the scale buffers are empty. */
    int wl = (int)s->v[MG_D_WL];
    if (s->v[MG_D_CAT]) {
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
    int64_t H = s->v[MG_D_H], I = s->v[MG_D_I], E = s->v[MG_D_E];
    mg_fill(s, m, true, &r, host);
    int wl = (int)s->v[MG_D_WL];
    if (s->v[MG_D_CAT]) {
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
    *wu = s->v[MG_D_CAT] ? (const uint8_t *)b[B_W0] + uw : b[B_W0 + 2];
    *su = s->v[MG_D_CAT] ? (const uint8_t *)b[B_W0 + 1] + us : b[B_W0 + 3];
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    moe_gemm_dims d = mg_gemm_dims(s);
    /* The reference reads the Quark layout. */
    int wl = (int)s->v[MG_D_WL], cat = (int)s->v[MG_D_CAT];
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
    moe_up_ref(&d, host[MG_B_ACT], host[MG_B_IDS], wg, sg, wu, su, ws, ss, 0, m * d.topk, 1,
               host[out_buf(s)]);
    moe_w4_view_free(&a);
    moe_w4_view_free(&b);
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    int64_t H = s->v[MG_D_H], I = s->v[MG_D_I], P = m * s->v[MG_D_TOPK];
    double used = mg_used_experts(s, m);
    *flops = 2.0 * (double)P * 2.0 * (double)I * (double)H;
    *bytes = used * 2.0 * (double)I * (double)H * (0.5 + 1.0 / 32) +
             (double)(m * H * 2) + (double)(P * I * 2);
}

/* ---- cpu --------------------------------------------------------------- */

static mt_status cpu_run(const kern_ctx *c, mt_err *err)
{
    const kern_shape *s = c->shape;
    int32_t bm = (int32_t)s->v[MG_D_BM], np = (int32_t)(c->m * s->v[MG_D_TOPK]);
    int64_t ws, ss, uw, us;
    strides(s, (int)s->v[MG_D_WL], &ws, &ss, &uw, &us);
    const uint8_t *wg, *sg, *wu, *su;
    weight_ptrs(s, (int)s->v[MG_D_WL], c->bufs, &wg, &sg, &wu, &su);
    void *act = c->scratch, *sorted = c->bufs[MG_B_SORTED], *tile = c->bufs[MG_B_TILE],
         *total = c->bufs[MG_B_TOTAL], *h = c->bufs[out_buf(s)];
    void *args[] = {&act, &sorted, &tile, &total, &wg, &sg, &wu, &su, &ws, &ss, &h, &np, &bm};
    return mg_cpu_run(c, true, "moe_up", "ppppppppllpii", args, err);
}

/* ---- gpu --------------------------------------------------------------- */

static mt_status gpu_run(const kern_ctx *c, mt_err *err)
{
    const kern_shape *s = c->shape;
    int64_t P = c->m * s->v[MG_D_TOPK];
    int32_t bm = (int32_t)s->v[MG_D_BM], np = (int32_t)P, ntm = mg_gpu_tiles(c);
    int64_t ws, ss, uw, us;
    strides(s, (int)s->v[MG_D_WL], &ws, &ss, &uw, &us);
    const uint8_t *wg, *sg, *wu, *su;
    weight_ptrs(s, (int)s->v[MG_D_WL], c->bufs, &wg, &sg, &wu, &su);
    void *x = c->bufs[MG_B_ACT], *xq, *xqs, *sorted = c->bufs[MG_B_SORTED],
         *tile = c->bufs[MG_B_TILE], *total = c->bufs[MG_B_TOTAL], *h = c->bufs[out_buf(s)],
         *part = c->scratch;
    void *args[] = {&x, &xq, &xqs, &sorted, &tile, &total, &wg, &sg, &wu, &su, &ws, &ss, &h,
                    &part, &np, &bm, &ntm};
    mt_status st = mg_gpu_act_quant(c, true, &xq, &xqs, err);
    if (st == MT_OK)
        st = mg_gpu_launch(c, true, "moe_gemm_up", "ppppppppppllppiii", args, err);
    if (st != MT_OK || !mg_gpu_partials(s, true, c->cfg))
        return st;
    void *fargs[] = {&part, &h, &np};
    return mg_gpu_finish(c, "moe_up_finish", "ppi", fargs, P * s->v[MG_D_I], err);
}

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

/* 2: the MMA parameter; 3: GEMV (the decode path); 4: MMA=3 (fp8) */
const kern_family fam_moe_gemm_up =
    MG_FAMILY(up, "moe_gemm_up", 4,
              "MoE stage 1: h = silu(x Wg^T) * (x Wu^T) per routed pair, MXFP4 weights",
              dims, presets, cases, buffers, fill, reference, cost, cpu_run, NULL, gpu_run, NULL);
