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
 * by moe_act_quant, before the GEMM).
 * What this stage shares with stage 1 is in moe_gemm_family.c. */
#include <stdio.h>

#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/moe/moe_common.h"
#include "moe_gemm_family.h"

static const kern_dim_desc dims[MG_D_COUNT] = {
    MG_DIMS("hidden size (N), a multiple of 128", "expert intermediate size (K), a multiple of 128"),
    [MG_D_COMB] = {"comb", KERN_DIM_INT, false, 0, 1,
                   "0: atomically accumulate into y; 1: write weighted per-pair rows"},
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

/* Buffers: h, ids, sorted, tile_expert, total (moe_gemm_family.h), then
 * topk_w, the weights and their scales, then rows (comb=1) or y. */
enum { B_TOPKW = MG_B_STAGE, B_W, B_S, B_OUT, B_COUNT };

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    int64_t H = s->v[MG_D_H], I = s->v[MG_D_I], E = s->v[MG_D_E], P = m * s->v[MG_D_TOPK];
    if (cap < B_COUNT)
        return 0;
    int n = mg_buffers(s, m, false, out);
    out[n++] = (kern_buf_desc){"topk_w", KERN_BUF_IN, KERN_DT_F32, (size_t)P * 4, 0, 0, 0};
    /* wl=1: the scales sit in w_down (moe_w4_group16); s_down is empty. */
    int wl = (int)s->v[MG_D_WL];
    out[n++] = (kern_buf_desc){"w_down", KERN_BUF_IN, KERN_DT_U8, (size_t)moe_w4_bytes(wl, E * H, I),
                               0, 0, 0};
    out[n++] = (kern_buf_desc){"s_down", KERN_BUF_IN, KERN_DT_U8,
                               (size_t)moe_w4_scale_bytes(wl, E * H, I), 0, 0, 0};
    if (s->v[MG_D_COMB])
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
    int64_t H = s->v[MG_D_H], I = s->v[MG_D_I], E = s->v[MG_D_E], P = m * s->v[MG_D_TOPK];
    mg_fill(s, m, false, &r, host);
    float *w = host[B_TOPKW];
    for (int64_t p = 0; p < P; p++)
        w[p] = mt_rng_uniform(&r, 0.05f, 1.0f);
    moe_gen_w4(&r, (int)s->v[MG_D_WL], E * H, I, host[B_W], host[B_S]);
    if (!s->v[MG_D_COMB]) {
        float *y = host[B_OUT];
        for (int64_t i = 0; i < m * H; i++)
            y[i] = mt_rng_normal(&r);
    }
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    moe_gemm_dims d = mg_gemm_dims(s);
    moe_w4_view q = moe_w4_quark_view((int)s->v[MG_D_WL], d.e * d.h, d.i, host[B_W], host[B_S]);
    moe_down_ref(&d, host[MG_B_ACT], host[MG_B_IDS], host[B_TOPKW], q.w, q.s, 0, m * d.topk, 1,
                 s->v[MG_D_COMB] ? host[B_OUT] : NULL, s->v[MG_D_COMB] ? NULL : host[B_OUT]);
    moe_w4_view_free(&q);
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    int64_t H = s->v[MG_D_H], I = s->v[MG_D_I], P = m * s->v[MG_D_TOPK];
    double used = mg_used_experts(s, m);
    *flops = 2.0 * (double)P * (double)I * (double)H;
    *bytes = used * (double)I * (double)H * (0.5 + 1.0 / 32) + (double)(P * I * 2) +
             (double)(s->v[MG_D_COMB] ? P * H * 4 : 2 * m * H * 4);
}

/* ---- cpu --------------------------------------------------------------- */

static mt_status cpu_run(const kern_ctx *c, mt_err *err)
{
    const kern_shape *s = c->shape;
    int64_t ws = s->v[MG_D_H] * s->v[MG_D_I] / 2, ss = s->v[MG_D_H] * s->v[MG_D_I] / 32;
    int32_t bm = (int32_t)s->v[MG_D_BM], np = (int32_t)(c->m * s->v[MG_D_TOPK]);
    void *act = c->scratch, *sorted = c->bufs[MG_B_SORTED], *tile = c->bufs[MG_B_TILE],
         *total = c->bufs[MG_B_TOTAL], *w = c->bufs[B_W], *sc = c->bufs[B_S],
         *tw = c->bufs[B_TOPKW], *out = c->bufs[B_OUT];
    void *args[] = {&act, &sorted, &tile, &total, &w, &sc, &ws, &ss, &tw, &out, &np, &bm};
    return mg_cpu_run(c, false, "moe_down", "ppppppllppii", args, err);
}

/* comb=0 adds every pair's row into y with float atomics, in the order the
 * work items happen to run. With one expert per token (the shared expert
 * as a one-expert MoE) and no split K, each element of y gets one add: no
 * order to vary. */
static bool comb_varies(const kern_shape *s, int splitk, char *why, size_t cap)
{
    if (s->v[MG_D_COMB] || (s->v[MG_D_TOPK] == 1 && splitk <= 1))
        return false;
    snprintf(why, cap, "comb=0 adds %s into y with float atomics",
             s->v[MG_D_TOPK] > 1 ? "the pairs' rows" : "split-K partial rows");
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

/* ---- gpu --------------------------------------------------------------- */

static mt_status gpu_run(const kern_ctx *c, mt_err *err)
{
    const kern_shape *s = c->shape;
    int64_t H = s->v[MG_D_H], I = s->v[MG_D_I], P = c->m * s->v[MG_D_TOPK];
    int32_t bm = (int32_t)s->v[MG_D_BM], np = (int32_t)P, ntm = mg_gpu_tiles(c);
    int64_t ws = H * I / 2, ss = H * I / 32;
    void *h = c->bufs[MG_B_ACT], *hq, *hqs, *sorted = c->bufs[MG_B_SORTED],
         *tile = c->bufs[MG_B_TILE], *total = c->bufs[MG_B_TOTAL], *w = c->bufs[B_W],
         *sc = c->bufs[B_S], *tw = c->bufs[B_TOPKW], *out = c->bufs[B_OUT], *part = c->scratch;
    void *args[] = {&h,  &hq, &hqs, &sorted, &tile, &total, &w,  &sc,
                    &ws, &ss, &tw,  &out,    &part, &np,    &bm, &ntm};
    mt_status st = mg_gpu_act_quant(c, false, &hq, &hqs, err);
    if (st == MT_OK)
        st = mg_gpu_launch(c, false, "moe_gemm_down", "ppppppppllpppiii", args, err);
    if (st != MT_OK || !mg_gpu_partials(s, false, c->cfg))
        return st;
    void *fargs[] = {&part, &tw, &out, &np};
    return mg_gpu_finish(c, "moe_down_finish", "pppi", fargs,
                         (s->v[MG_D_COMB] ? P : c->m) * H, err);
}

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

/* 2: the MMA parameter; 3: GEMV (the decode path); 4: MMA=3 (fp8) */
const kern_family fam_moe_gemm_down =
    MG_FAMILY(down, "moe_gemm_down", 4,
              "MoE stage 2: y += w * (h Wd^T) per routed pair (atomics) or per-pair rows",
              dims, presets, cases, buffers, fill, reference, cost, cpu_run, cpu_order_varies,
              gpu_run, gpu_order_varies);
