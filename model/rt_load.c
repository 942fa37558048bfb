/* rt_load.c: the checkpoint's weights as device buffers in the layouts the
 * kernels read, each layer's kernels (registered from the kernel plan,
 * plan.h, which also says which layers are MoE, run their own indexer or
 * have an MXFP4 shared expert), and the activation buffers.
 *
 * Layouts (see rt_impl.h): linears that read the same input are fused by
 * concatenating their rows (attention A: q_a | kv_a | indexer wk |
 * weights_proj; B: q_b | indexer wq_b; MLP: gate | up); kv_b is split per
 * head into W_UK^T [L][nope] and W_UV [V][L] for the absorbed attention.
 * Linears outside the experts run as bf16 GEMMs: bf16 is uploaded as is,
 * f16/f32/fp8/MXFP4 are converted to bf16 here (MXFP4 exactly; the others
 * round to nearest even).
 * Routed experts must be MXFP4 (the MoE GEMMs read Quark's layout: per
 * expert the gate rows, then the up rows); the shared expert runs on the
 * MoE GEMMs when it is MXFP4, else as a bf16 MLP. */
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "kernels/moe/moe_common.h"
#include "common/mxfp4.h"
#include "rt_impl.h"

/* ---- host conversions ----------------------------------------------------- */

static float elem_f32(const model_tensor_info *t, size_t i)
{
    const uint8_t *p = (const uint8_t *)t->data;
    uint16_t h;
    float f;
    switch (t->dtype) {
    case MODEL_DTYPE_BF16: memcpy(&h, p + 2 * i, 2); return mt_bf16_to_f32(h);
    case MODEL_DTYPE_F16: memcpy(&h, p + 2 * i, 2); return mt_f16_to_f32(h);
    case MODEL_DTYPE_F32: memcpy(&f, p + 4 * i, 4); return f;
    case MODEL_DTYPE_F8_E4M3: return mt_fp8e4m3_to_f32(p[i]);
    default: return NAN;
    }
}

static mt_status find_vec(model_runtime *rt, int64_t n, const char *name, const model_tensor_info **out,
                          mt_err *err)
{
    return model_weights_tensor(rt->w, name, MODEL_DTYPES_FLOAT, 1, &n, out, err);
}

/* Rows [r0, r0 + n) of a linear [out][in] as bf16 into dst (caller-sized,
 * n * in); only those rows of the mapping are read. */
static mt_status linear_rows_bf16(model_runtime *rt, const char *module, int64_t out, int64_t in,
                                  int64_t r0, int64_t n, uint16_t *dst, mt_err *err);

/* Rows [out][in] of a linear as bf16 into dst (caller-sized). */
static mt_status linear_bf16(model_runtime *rt, const char *module, int64_t out, int64_t in,
                             uint16_t *dst, mt_err *err)
{
    return linear_rows_bf16(rt, module, out, in, 0, out, dst, err);
}

static mt_status linear_rows_bf16(model_runtime *rt, const char *module, int64_t out, int64_t in,
                                  int64_t r0, int64_t n, uint16_t *dst, mt_err *err)
{
    const model_linear *l;
    mt_status st = model_weights_linear(rt->w, module, &l, err);
    if (st != MT_OK)
        return st;
    if (l->out != out || l->in != in)
        return mt_fail(err, MT_E_FORMAT, "%s: [%" PRId64 ", %" PRId64 "], expected [%" PRId64
                       ", %" PRId64 "]", module, l->out, l->in, out, in);
    if (r0 < 0 || n < 0 || r0 + n > out)
        return mt_fail(err, MT_E_INVALID, "%s: rows %" PRId64 "..%" PRId64 " of %" PRId64, module,
                       r0, r0 + n, out);
    if (l->fmt == MODEL_WFMT_BF16) {
        memcpy(dst, (const uint16_t *)l->weight->data + r0 * in, (size_t)(n * in) * 2);
        return MT_OK;
    }
    if (l->fmt == MODEL_WFMT_MXFP4) {
        float *row = malloc(sizeof(float) * (size_t)in);
        if (!row)
            return mt_fail(err, MT_E_NOMEM, "%s: conversion buffer", module);
        const uint8_t *q = l->weight->data, *s = l->scale->data;
        for (int64_t r = r0; r < r0 + n; r++) {
            mxfp4_dequantize_row(q + r * (in / 2), s + r * (in / 32), in, row);
            for (int64_t i = 0; i < in; i++)
                dst[(r - r0) * in + i] = mt_f32_to_bf16(row[i]);
        }
        free(row);
        return MT_OK;
    }
    for (int64_t r = r0; r < r0 + n; r++) {
        float sc = 1.0f;
        if (l->fmt == MODEL_WFMT_FP8_E4M3)
            sc = elem_f32(l->scale, model_tensor_numel(l->scale) == 1 ? 0 : (size_t)r);
        for (int64_t i = 0; i < in; i++)
            dst[(r - r0) * in + i] = mt_f32_to_bf16(elem_f32(l->weight, (size_t)(r * in + i)) * sc);
    }
    return MT_OK;
}

static mt_status upload(model_runtime *rt, const void *host, size_t bytes, void **dev,
                        mt_err *err)
{
    mt_status st = dev_alloc(rt->dev, bytes ? bytes : 4, dev, err);
    if (st == MT_OK && bytes)
        st = dev_copy_to(rt->dev, *dev, host, bytes, err);
    return st;
}

/* A float vector (norm weights) as bf16 or f32 on the device. */
static mt_status upload_vec(model_runtime *rt, const char *name, int64_t n, bool f32, void **dev,
                            mt_err *err)
{
    const model_tensor_info *t;
    mt_status st = find_vec(rt, n, name, &t, err);
    if (st != MT_OK)
        return st;
    void *h = malloc((size_t)n * (f32 ? 4 : 2));
    if (!h)
        return mt_fail(err, MT_E_NOMEM, "%s", name);
    for (int64_t i = 0; i < n; i++) {
        float v = elem_f32(t, (size_t)i);
        if (f32)
            ((float *)h)[i] = v;
        else
            ((uint16_t *)h)[i] = mt_f32_to_bf16(v);
    }
    st = upload(rt, h, (size_t)n * (f32 ? 4 : 2), dev, err);
    free(h);
    return st;
}

/* Several linears with the same input, rows concatenated, as bf16: of
 * linear i (outs[i] rows) the rows firsts[i] .. + counts[i] (firsts and
 * counts NULL: every row). */
static mt_status upload_fused_rows(model_runtime *rt, const char *const *modules,
                                   const int64_t *outs, const int64_t *firsts,
                                   const int64_t *counts, int n, int64_t in, void **dev,
                                   mt_err *err)
{
    int64_t rows = 0;
    for (int i = 0; i < n; i++)
        rows += counts ? counts[i] : outs[i];
    uint16_t *h = malloc((size_t)(rows * in) * 2);
    if (!h)
        return mt_fail(err, MT_E_NOMEM, "%s: fused weights", modules[0]);
    mt_status st = MT_OK;
    int64_t r = 0;
    for (int i = 0; i < n && st == MT_OK; i++) {
        int64_t r0 = firsts ? firsts[i] : 0, cnt = counts ? counts[i] : outs[i];
        st = linear_rows_bf16(rt, modules[i], outs[i], in, r0, cnt, h + r * in, err);
        r += cnt;
    }
    if (st == MT_OK)
        st = upload(rt, h, (size_t)(rows * in) * 2, dev, err);
    free(h);
    return st;
}

static mt_status upload_fused(model_runtime *rt, const char *const *modules, const int64_t *outs,
                              int n, int64_t in, void **dev, mt_err *err)
{
    return upload_fused_rows(rt, modules, outs, NULL, NULL, n, in, dev, err);
}

/* A bf16 SwiGLU MLP of intermediate I: gate | up rows fused into gu,
 * down [H][I]. Under tensor parallelism this rank's share of the
 * intermediate (gate and up rows) and of down's output rows (rt_tp.c). */
static mt_status upload_swiglu(model_runtime *rt, const char *gate, const char *up,
                               const char *down, int64_t I, void **gu, void **dn, mt_err *err)
{
    int64_t H = rt->H, i0 = 0, ni = I;
    if (rt->tp.on)
        model_ep_range(I, rt->tp.size, rt->tp.rank, &i0, &ni);
    const char *gm[2] = {gate, up}, *dm[1] = {down};
    int64_t go[2] = {I, I}, gf[2] = {i0, i0}, gc[2] = {ni, ni};
    int64_t dout[1] = {H}, df[1] = {rt->tp.me.o_row0}, dc[1] = {rt->tp.me.o_rows};
    MT_CHECK(upload_fused_rows(rt, gm, go, gf, gc, 2, H, gu, err));
    return upload_fused_rows(rt, dm, dout, df, dc, 1, I, dn, err);
}

/* A float linear [out][in] quantized to MXFP4 (Quark layout, the scale rule
 * of mxfp4.h) into packed[out * in / 2] and scales[out * in / 32]. */
static mt_status quantize_linear(model_runtime *rt, const char *module, int64_t out, int64_t in,
                                 uint8_t *packed, uint8_t *scales, mt_err *err)
{
    uint16_t *h = malloc((size_t)(out * in) * 2);
    if (!h)
        return mt_fail(err, MT_E_NOMEM, "%s: quantization buffer", module);
    mt_status st = linear_bf16(rt, module, out, in, h, err);
    for (int64_t r = 0; st == MT_OK && r < out; r++)
        mxfp4_quantize_row_bf16(h + r * in, in, packed + r * (in / 2), scales + r * (in / 32));
    free(h);
    return st;
}

/* Routed or shared experts: n experts named prefix%d from expert first on
 * (this rank's range under expert parallelism) / prefix (shared); only
 * their tensors are read from the checkpoint (the mapping's other pages
 * are never touched). quantize: float experts (the MTP layer's bf16 ones)
 * are quantized to MXFP4 here; otherwise they must be MXFP4 in the file. */
static mt_status upload_experts(model_runtime *rt, const char *prefix, bool shared,
                                int64_t first, int64_t n, int64_t inter, bool quantize,
                                void **w13, void **s13, void **w2, void **s2, mt_err *err)
{
    int64_t H = rt->H;
    size_t b13 = (size_t)(2 * inter * H / 2), c13 = (size_t)(2 * inter * H / 32);
    size_t b2 = (size_t)(H * inter / 2), c2 = (size_t)(H * inter / 32);
    uint8_t *hw13 = malloc(b13 * (size_t)n), *hs13 = malloc(c13 * (size_t)n);
    uint8_t *hw2 = malloc(b2 * (size_t)n), *hs2 = malloc(c2 * (size_t)n);
    mt_status st = MT_OK;
    if (!hw13 || !hs13 || !hw2 || !hs2)
        st = mt_fail(err, MT_E_NOMEM, "%s: expert weights", prefix);
    for (int64_t e = 0; e < n && st == MT_OK; e++) {
        static const char *const parts[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int p = 0; p < 3 && st == MT_OK; p++) {
            char name[320];
            if (shared)
                snprintf(name, sizeof name, "%s%s", prefix, parts[p]);
            else
                snprintf(name, sizeof name, "%s%" PRId64 ".%s", prefix, first + e, parts[p]);
            const model_linear *l;
            st = model_weights_linear(rt->w, name, &l, err);
            if (st != MT_OK)
                break;
            if (l->fmt != MODEL_WFMT_MXFP4 && quantize) {
                int64_t out = p < 2 ? inter : H, in = p < 2 ? H : inter;
                uint8_t *wq = p < 2 ? hw13 + e * b13 + (size_t)p * b13 / 2 : hw2 + e * b2;
                uint8_t *sq = p < 2 ? hs13 + e * c13 + (size_t)p * c13 / 2 : hs2 + e * c2;
                st = quantize_linear(rt, name, out, in, wq, sq, err);
                continue;
            }
            if (l->fmt != MODEL_WFMT_MXFP4) {
                st = mt_fail(err, MT_E_UNSUPPORTED, "%s is %s in %s: the MoE kernels read MXFP4 "
                             "experts", name, model_wfmt_name(l->fmt), l->weight->file);
                break;
            }
            if (p < 2) {
                memcpy(hw13 + e * b13 + (size_t)p * b13 / 2, l->weight->data, b13 / 2);
                memcpy(hs13 + e * c13 + (size_t)p * c13 / 2, l->scale->data, c13 / 2);
            } else {
                memcpy(hw2 + e * b2, l->weight->data, b2);
                memcpy(hs2 + e * c2, l->scale->data, c2);
            }
        }
    }
    /* The layout the expert GEMMs read (plan: moe_wl): at wl=1 gate, up
     * and down each grouped as a whole matrix of n * rows, their scales
     * inside (moe_w4_group16; the scale tensors are then empty). */
    const int wl = rt->plan->p.moe_wl;
    const int64_t r13 = n * 2 * inter, r2 = n * H;
    if (st == MT_OK && wl == 1) {
        uint8_t *g13 = malloc((size_t)moe_w4_bytes(1, r13, H));
        uint8_t *g2 = malloc((size_t)moe_w4_bytes(1, r2, inter));
        if (!g13 || !g2) {
            st = mt_fail(err, MT_E_NOMEM, "%s: grouping the expert weights", prefix);
            free(g13);
            free(g2);
        } else {
            moe_w4_group16(hw13, hs13, r13, H, g13);
            moe_w4_group16(hw2, hs2, r2, inter, g2);
            free(hw13);
            free(hw2);
            hw13 = g13;
            hw2 = g2;
        }
    }
    if (st == MT_OK)
        st = upload(rt, hw13, (size_t)moe_w4_bytes(wl, r13, H), w13, err);
    if (st == MT_OK)
        st = upload(rt, hs13, (size_t)moe_w4_scale_bytes(wl, r13, H), s13, err);
    if (st == MT_OK)
        st = upload(rt, hw2, (size_t)moe_w4_bytes(wl, r2, inter), w2, err);
    if (st == MT_OK)
        st = upload(rt, hs2, (size_t)moe_w4_scale_bytes(wl, r2, inter), s2, err);
    free(hw13);
    free(hs13);
    free(hw2);
    free(hs2);
    return st;
}

/* kv_b [NH * (D + V)][L] -> W_UK^T [NH][L][D] and W_UV [NH][V][L] for the
 * absorbed attention, and kv_b as it is for mla_prefill's expansion (the
 * absorbed layouts cannot serve it: W_UK^T is transposed and the family
 * reads one [D + V][L] panel per head; the copy costs NH (D + V) L bf16
 * per layer, 29 MB at GLM-5.2). */
static mt_status upload_kv_b(model_runtime *rt, const char *module, rt_layer *ly, mt_err *err)
{
    /* This rank's heads (all of them without tensor parallelism). */
    int64_t NH = rt->tp.me.heads, h0 = rt->tp.me.head0, D = rt->D, VD = rt->VD, L = rt->L;
    uint16_t *kvb = malloc((size_t)(NH * (D + VD) * L) * 2);
    uint16_t *ukt = malloc((size_t)(NH * L * D) * 2), *uv = malloc((size_t)(NH * VD * L) * 2);
    mt_status st = MT_OK;
    if (!kvb || !ukt || !uv)
        st = mt_fail(err, MT_E_NOMEM, "%s", module);
    if (st == MT_OK)
        st = linear_rows_bf16(rt, module, rt->NH * (D + VD), L, h0 * (D + VD), NH * (D + VD), kvb,
                              err);
    if (st == MT_OK) {
        for (int64_t h = 0; h < NH; h++) {
            const uint16_t *base = kvb + h * (D + VD) * L;
            for (int64_t d = 0; d < D; d++)
                for (int64_t l = 0; l < L; l++)
                    ukt[(h * L + l) * D + d] = base[d * L + l];
            memcpy(uv + h * VD * L, base + D * L, (size_t)(VD * L) * 2);
        }
        st = upload(rt, ukt, (size_t)(NH * L * D) * 2, &ly->w_ukt, err);
    }
    if (st == MT_OK)
        st = upload(rt, uv, (size_t)(NH * VD * L) * 2, &ly->w_uv, err);
    if (st == MT_OK)
        st = upload(rt, kvb, (size_t)(NH * (D + VD) * L) * 2, &ly->w_kvb, err);
    free(kvb);
    free(ukt);
    free(uv);
    return st;
}

/* ---- kernels -------------------------------------------------------------- */

/* One kernel per entry of the plan, in plan order (kernel i is entry i;
 * its runtime dims are the representative values used for defaults and
 * validity). */
static mt_status register_plan(model_runtime *rt, mt_err *err)
{
    mt_status st = model_kset_create(rt->dev, rt->db, rt->log, &rt->ks, err);
    if (st == MT_OK)
        model_kset_set_batch_invariant(rt->ks, rt->o.batch_invariant);
    const model_plan *pl = rt->plan;
    for (int i = 0; st == MT_OK && i < pl->n_entries; i++) {
        const model_plan_entry *e = &pl->entries[i];
        st = model_kset_add(rt->ks, e->fam, &e->shape, e->purpose, e->m_max, NULL, err);
    }
    return st == MT_OK ? MT_OK : mt_err_prefix(err, "runtime");
}

/* ---- kernels of a layer --------------------------------------------------- */

/* The rt_layer_kernels field of each plan slot, offset + 1 (0: missing). */
#define SLOT(s, f) [MODEL_KS_##s] = offsetof(rt_layer_kernels, f) + 1
static const size_t slot_field[MODEL_KS_COUNT] = {
    SLOT(NORM_IN, norm_in), SLOT(GEMM_A, gemm_a), SLOT(COPY_QA, copy_qa),
    SLOT(NORM_Q, norm_q), SLOT(COPY_LAT, copy_lat), SLOT(NORM_KV, norm_kv),
    SLOT(COPY_KR, copy_kr), SLOT(ROPE_KR, rope_kr), SLOT(STORE_KV, store_kv),
    SLOT(COPY_IK, copy_ik), SLOT(ROPE_IK, rope_ik), SLOT(STORE_IK, store_ik),
    SLOT(COPY_IW, copy_iw), SLOT(GEMM_B, gemm_b), SLOT(COPY_Q, copy_q), SLOT(ROPE_Q, rope_q),
    SLOT(COPY_IQ, copy_iq), SLOT(ROPE_IQ, rope_iq), SLOT(INDEXER, indexer),
    SLOT(ABSORB, absorb), SLOT(COPY_QROPE, copy_qrope), SLOT(DECODE, decode),
    SLOT(COPY_O, copy_o), SLOT(VOUT, vout), SLOT(GEMM_O, gemm_o), SLOT(RESID, resid),
    SLOT(NORM_POST, norm_post), SLOT(GEMM_GU, gemm_gu), SLOT(SILU, silu),
    SLOT(GEMM_DOWN, gemm_down), SLOT(SH_GEMM_GU, sh_gemm_gu), SLOT(SH_SILU, sh_silu),
    SLOT(SH_GEMM_DOWN, sh_gemm_down), SLOT(ROUTE, moe.route), SLOT(ALIGN, moe.align),
    SLOT(UP, moe.up), SLOT(DOWN, moe.down), SLOT(SH_ALIGN, moe.sh_align),
    SLOT(SH_UP, moe.sh_up), SLOT(SH_DOWN, moe.sh_down), SLOT(COMBINE, moe.combine),
    SLOT(PREFILL, prefill),
};
#undef SLOT

/* Points the layer's kernel fields at the registered kernels of its slots. */
static void layer_kernels(model_runtime *rt, const model_plan_layer *pl, rt_layer *ly)
{
    for (int s = 0; s < MODEL_KS_COUNT; s++) {
        if (!slot_field[s])
            abort(); /* a slot added to plan.h without its field here */
        model_kern **f = (model_kern **)((char *)&ly->k + slot_field[s] - 1);
        *f = pl->k[s] >= 0 ? model_kset_kernel(rt->ks, pl->k[s]) : NULL;
    }
}

/* ---- layers ------------------------------------------------------------------ */

static mt_status load_layer(model_runtime *rt, int64_t i, rt_layer *ly, mt_err *err)
{
    int64_t H = rt->H, NH = rt->NH, QL = rt->QL, L = rt->L, R = rt->R, D = rt->D;
    int64_t IH = rt->IH, ID = rt->ID, VD = rt->VD;
    char p[96], a[128], n1[320], n2[320], n3[320], n4[320];
    snprintf(p, sizeof p, "model.layers.%" PRId64 ".", i);
    snprintf(a, sizeof a, "%sself_attn.", p);
    const model_plan_layer *pl = &rt->plan->layers[i];
    ly->moe = pl->moe;
    ly->full = pl->full;
    mt_status st;
    snprintf(n1, sizeof n1, "%sinput_layernorm.weight", p);
    MT_CHECK(upload_vec(rt, n1, H, false, &ly->in_norm, err));
    snprintf(n1, sizeof n1, "%spost_attention_layernorm.weight", p);
    MT_CHECK(upload_vec(rt, n1, H, false, &ly->post_norm, err));
    snprintf(n1, sizeof n1, "%sq_a_layernorm.weight", a);
    MT_CHECK(upload_vec(rt, n1, QL, false, &ly->q_norm, err));
    snprintf(n1, sizeof n1, "%skv_a_layernorm.weight", a);
    MT_CHECK(upload_vec(rt, n1, L, false, &ly->kv_norm, err));

    snprintf(n1, sizeof n1, "%sq_a_proj", a);
    snprintf(n2, sizeof n2, "%skv_a_proj_with_mqa", a);
    snprintf(n3, sizeof n3, "%sindexer.wk", a);
    snprintf(n4, sizeof n4, "%sindexer.weights_proj", a);
    const char *amods[4] = {n1, n2, n3, n4};
    int64_t aouts[4] = {QL, L + R, ID, IH};
    int na = ly->full ? 4 : 2;
    ly->n_a = pl->n_a;
    MT_CHECK(upload_fused(rt, amods, aouts, na, H, &ly->w_a, err));

    snprintf(n1, sizeof n1, "%sq_b_proj", a);
    snprintf(n2, sizeof n2, "%sindexer.wq_b", a);
    const char *bmods[2] = {n1, n2};
    /* q_b: this rank's heads' rows (tensor parallelism); the indexer's whole. */
    const model_tp_dims *tp = &rt->tp.me;
    int64_t bouts[2] = {NH * (D + R), IH * ID}, bfirst[2] = {tp->head0 * (D + R), 0};
    int64_t bcount[2] = {tp->heads * (D + R), IH * ID};
    ly->n_b = pl->n_b;
    MT_CHECK(upload_fused_rows(rt, bmods, bouts, bfirst, bcount, ly->full ? 2 : 1, QL, &ly->w_b,
                               err));
    if (ly->full) {
        snprintf(n1, sizeof n1, "%sindexer.k_norm.weight", a);
        MT_CHECK(upload_vec(rt, n1, ID, true, &ly->k_norm_w, err));
        snprintf(n1, sizeof n1, "%sindexer.k_norm.bias", a);
        MT_CHECK(upload_vec(rt, n1, ID, true, &ly->k_norm_b, err));
    }
    snprintf(n1, sizeof n1, "%skv_b_proj", a);
    MT_CHECK(upload_kv_b(rt, n1, ly, err));
    snprintf(n1, sizeof n1, "%so_proj", a);
    const char *omods[1] = {n1};
    int64_t oouts[1] = {H}, ofirst[1] = {tp->o_row0}, ocount[1] = {tp->o_rows};
    MT_CHECK(upload_fused_rows(rt, omods, oouts, ofirst, ocount, 1, NH * VD, &ly->w_o, err));

    if (!ly->moe) {
        ly->inter = pl->inter;
        snprintf(n1, sizeof n1, "%smlp.gate_proj", p);
        snprintf(n2, sizeof n2, "%smlp.up_proj", p);
        snprintf(n3, sizeof n3, "%smlp.down_proj", p);
        MT_CHECK(upload_swiglu(rt, n1, n2, n3, ly->inter, &ly->w_gu, &ly->w_down, err));
    } else {
        const model_tensor_info *t;
        int64_t gs[2] = {rt->E, H};
        snprintf(n1, sizeof n1, "%smlp.gate.weight", p);
        MT_CHECK(model_weights_tensor(rt->w, n1, MODEL_DTYPES_FLOAT, 2, gs, &t, err));
        uint16_t *g = malloc((size_t)(rt->E * H) * 2);
        if (!g)
            return mt_fail(err, MT_E_NOMEM, "%s", n1);
        for (int64_t j = 0; j < rt->E * H; j++)
            g[j] = mt_f32_to_bf16(elem_f32(t, (size_t)j));
        st = upload(rt, g, (size_t)(rt->E * H) * 2, &ly->gate, err);
        free(g);
        if (st != MT_OK)
            return st;
        snprintf(n1, sizeof n1, "%smlp.gate.e_score_correction_bias", p);
        MT_CHECK(upload_vec(rt, n1, rt->E, true, &ly->bias, err));
        snprintf(n1, sizeof n1, "%smlp.experts.", p);
        int64_t e0, ne;
        rt_ep_experts(rt, &e0, &ne);
        MT_CHECK(upload_experts(rt, n1, false, e0, ne, rt->IE, i >= rt->n_layers, &ly->w13,
                                &ly->s13, &ly->w2, &ly->s2, err));
        ly->sh_inter = pl->sh_inter;
        if (ly->sh_inter) {
            ly->sh_mxfp4 = pl->sh_mxfp4; /* from the file (the plan was built with the weights) */
            snprintf(n1, sizeof n1, "%smlp.shared_experts.", p);
            if (ly->sh_mxfp4) {
                MT_CHECK(upload_experts(rt, n1, true, 0, 1, ly->sh_inter, false, &ly->sh_w13, &ly->sh_s13,
                                    &ly->sh_w2, &ly->sh_s2, err));
            } else {
                snprintf(n1, sizeof n1, "%smlp.shared_experts.gate_proj", p);
                snprintf(n2, sizeof n2, "%smlp.shared_experts.up_proj", p);
                snprintf(n3, sizeof n3, "%smlp.shared_experts.down_proj", p);
                MT_CHECK(upload_swiglu(rt, n1, n2, n3, ly->sh_inter, &ly->sh_gu, &ly->sh_down,
                                       err));
            }
        }
    }
    kvc_opts ko = {.page_size = rt->ps, .n_pages = (int)rt->n_pages, .latent = (int)L,
                   .rope = (int)R, .index_dim = ly->full ? (int)ID : 0, .dtype = rt->kv_dtype};
    MT_CHECK(kvc_create(rt->dev, &ko, &ly->kv, err));
    layer_kernels(rt, pl, ly);
    return MT_OK;
}

static void free_layer(model_runtime *rt, rt_layer *ly)
{
    void *ptrs[] = {ly->in_norm, ly->post_norm, ly->w_a, ly->q_norm, ly->kv_norm, ly->w_b,
                    ly->k_norm_w, ly->k_norm_b, ly->w_ukt, ly->w_uv, ly->w_kvb, ly->w_o,
                    ly->w_gu, ly->w_down, ly->gate, ly->bias, ly->w13, ly->s13, ly->w2, ly->s2,
                    ly->sh_w13, ly->sh_s13, ly->sh_w2, ly->sh_s2, ly->sh_gu, ly->sh_down};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        dev_free(rt->dev, ptrs[i]);
    kvc_destroy(ly->kv);
}

mt_status rt_load(model_runtime *rt, mt_err *err)
{
    int64_t H = rt->H, V = rt->V;
    MT_CHECK(rt_ep_open(rt, err));
    MT_CHECK(rt_tp_open(rt, err));
    mt_status st = upload_vec(rt, "model.norm.weight", H, false, &rt->final_norm, err);
    const model_tensor_info *emb;
    int64_t es[2] = {V, H};
    if (st == MT_OK)
        st = model_weights_tensor(rt->w, "model.embed_tokens.weight", MODEL_DTYPES_FLOAT, 2, es,
                                  &emb, err);
    if (st != MT_OK)
        return st;
    /* This rank's vocabulary rows (all without tensor or vocabulary
     * parallelism), and under tensor parallelism's own split a zero row
     * that other ranks' tokens read (rt_tp.c). */
    int64_t v0 = rt->tp.me.vocab0, nv = rt->tp.me.vocab;
    int64_t zero = rt->tp.on && rt->plan->p.vocab_ranks <= 1 ? 1 : 0;
    uint16_t *h = calloc((size_t)((nv + zero) * H), 2);
    if (!h)
        return mt_fail(err, MT_E_NOMEM, "embedding");
    if (emb->dtype == MODEL_DTYPE_BF16)
        memcpy(h, (const uint16_t *)emb->data + v0 * H, (size_t)(nv * H) * 2);
    else
        for (int64_t i = 0; i < nv * H; i++)
            h[i] = mt_f32_to_bf16(elem_f32(emb, (size_t)(v0 * H + i)));
    st = upload(rt, h, (size_t)((nv + zero) * H) * 2, &rt->embed, err);
    if (st == MT_OK) {
        const model_linear *l;
        if (model_weights_linear(rt->w, "lm_head", &l, NULL) == MT_OK) {
            const char *m[1] = {"lm_head"};
            int64_t o[1] = {V}, f[1] = {v0}, c[1] = {nv};
            st = upload_fused_rows(rt, m, o, f, c, 1, H, &rt->lm_head, err);
        } else {
            st = upload(rt, h, (size_t)(nv * H) * 2, &rt->lm_head, err); /* tied */
        }
    }
    free(h);
    if (st != MT_OK)
        return st;

    /* RoPE table for every position the runtime can hold, shared by the
     * attention and indexer rope kernels: config.h's frequencies (plain or
     * YaRN) with YaRN's attention factor folded into cos and sin. */
    float *cs = malloc(sizeof(float) * (size_t)(rt->max_ctx * rt->R));
    if (!cs)
        return mt_fail(err, MT_E_NOMEM, "rope table");
    model_config_rope_table(rt->cfg, rt->max_ctx, cs);
    rt->sm_bits = 0;
    if (rt->cfg->rope_kind == MODEL_ROPE_YARN) {
        float sm = (float)model_config_softmax_scale(rt->cfg);
        uint32_t bits;
        memcpy(&bits, &sm, sizeof bits);
        rt->sm_bits = bits;
    }
    st = upload(rt, cs, sizeof(float) * (size_t)(rt->max_ctx * rt->R), &rt->rope_cs, err);
    free(cs);
    if (st != MT_OK)
        return st;

    if ((st = register_plan(rt, err)) != MT_OK || (st = rt_ep_add_kernels(rt, err)) != MT_OK ||
        (st = rt_tp_add_kernels(rt, err)) != MT_OK)
        return st;
    /* With MTP its layer is layers[n_layers] (plan.h), loaded like the others. */
    int64_t n_load = rt->n_layers + (rt->plan->mtp ? 1 : 0);
    rt->layers = calloc((size_t)n_load, sizeof *rt->layers);
    if (!rt->layers)
        return mt_fail(err, MT_E_NOMEM, "layers");
    for (int64_t i = 0; i < n_load; i++) {
        st = load_layer(rt, i, &rt->layers[i], err);
        if (st != MT_OK)
            return mt_err_prefix(err, "layer %" PRId64, i);
    }
    const int *g = rt->plan->g;
    rt->k_embed = model_kset_kernel(rt->ks, g[MODEL_GS_EMBED]);
    rt->k_norm_final = model_kset_kernel(rt->ks, g[MODEL_GS_NORM_FINAL]);
    rt->k_gather = model_kset_kernel(rt->ks, g[MODEL_GS_GATHER]);
    rt->k_lm_head = model_kset_kernel(rt->ks, g[MODEL_GS_LM_HEAD]);
    return MT_OK;
}

void rt_unload(model_runtime *rt)
{
    rt_ep_close(rt);
    if (!rt->dev)
        return;
    for (int64_t i = 0; rt->layers && i < rt->n_layers + (rt->plan->mtp ? 1 : 0); i++)
        free_layer(rt, &rt->layers[i]);
    free(rt->layers);
    rt->layers = NULL;
    dev_free(rt->dev, rt->embed);
    dev_free(rt->dev, rt->final_norm);
    dev_free(rt->dev, rt->lm_head);
    dev_free(rt->dev, rt->rope_cs);
    rt->embed = rt->final_norm = rt->lm_head = rt->rope_cs = NULL;
}

/* ---- activations ------------------------------------------------------------- */

mt_status rt_bufs_alloc(model_runtime *rt, mt_err *err)
{
    rt_bufs *b = &rt->b;
    int64_t T = rt->T, H = rt->H, NH = rt->NH, L = rt->L, R = rt->R, D = rt->D;
    int64_t n_a = 0, n_b = 0, inter = 0;
    for (int64_t i = 0; i < rt->n_layers + (rt->plan->mtp ? 1 : 0); i++) {
        rt_layer *ly = &rt->layers[i];
        n_a = ly->n_a > n_a ? ly->n_a : n_a;
        n_b = ly->n_b > n_b ? ly->n_b : n_b;
        int64_t in = ly->moe ? (ly->sh_mxfp4 ? 0 : ly->sh_inter) : ly->inter;
        inter = in > inter ? in : inter;
    }
    int64_t max_pages = (rt->max_ctx + rt->ps - 1) / rt->ps;
    b->table_entries = T * max_pages;
    size_t topk = (size_t)(rt->TOPK > 0 ? rt->TOPK : 1);
    struct {
        void **p;
        size_t n;
    } a[] = {
        {&b->tok, (size_t)T * 4}, {&b->pos, (size_t)T * 4}, {&b->rows, (size_t)T * 4},
        {&b->qseq, (size_t)T * 4}, {&b->ctx, (size_t)T * 4},
        {&b->table, (size_t)b->table_entries * 4}, {&b->lrows, (size_t)T * 4},
        {&b->idx, (size_t)T * topk * 4}, {&b->val, (size_t)T * topk * 4},
        {&b->resid, (size_t)(T * H) * 4}, {&b->xb, (size_t)(T * H) * 2},
        {&b->xn, (size_t)(T * H) * 2}, {&b->delta, (size_t)(T * H) * 4},
        {&b->fa, (size_t)(T * n_a) * 4}, {&b->qa, (size_t)(T * rt->QL) * 2},
        {&b->qn, (size_t)(T * rt->QL) * 2}, {&b->lat, (size_t)(T * L) * 2},
        {&b->latn, (size_t)(T * L) * 2}, {&b->kr, (size_t)(T * R) * 2},
        {&b->ik, (size_t)(T * rt->ID) * 2}, {&b->iw, (size_t)(T * rt->IH) * 4},
        {&b->fb, (size_t)(T * n_b) * 4}, {&b->q, (size_t)(T * NH * (D + R)) * 2},
        {&b->iq, (size_t)(T * rt->IH * rt->ID) * 2}, {&b->qabs, (size_t)(T * NH * (L + R)) * 2},
        {&b->o, (size_t)(T * NH * L) * 4}, {&b->ob, (size_t)(T * NH * L) * 2},
        {&b->v, (size_t)(T * NH * rt->VD) * 2}, {&b->gu, (size_t)(T * 2 * inter) * 4},
        {&b->h, (size_t)(T * inter) * 2}, {&b->xg, (size_t)(T * H) * 2}, {&b->xgf, (size_t)(T * H) * 4},
        {&b->logits, (size_t)(T * rt->V) * 4},
    };
    int64_t sh_max = 0;
    for (int64_t i = 0; i < rt->n_layers; i++)
        if (rt->layers[i].sh_mxfp4 && rt->layers[i].sh_inter > sh_max)
            sh_max = rt->layers[i].sh_inter;
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        mt_status st = dev_alloc(rt->dev, a[i].n ? a[i].n : 4, a[i].p, err);
        if (st != MT_OK)
            return mt_err_prefix(err, "activation buffers for %" PRId64 " tokens", T);
    }
    model_moe_dims(rt->cfg, rt->act, rt->plan->p.moe_wl, sh_max, &rt->moe);
    if (rt->ep) /* its own workspace: routed experts are split over the ranks */
        return rt_ep_ws_alloc(rt, err);
    bool any_moe = false;
    for (int64_t i = 0; i < rt->n_layers; i++)
        any_moe |= rt->layers[i].moe;
    return any_moe ? model_moe_ws_create(rt->dev, &rt->moe, T, &rt->moe_ws, err) : MT_OK;
}

void rt_bufs_free(model_runtime *rt)
{
    if (!rt->dev)
        return;
    model_moe_ws_destroy(rt->moe_ws);
    rt->moe_ws = NULL;
    /* Every member before table_entries is a device pointer. */
    void **all = (void **)&rt->b;
    size_t n = offsetof(rt_bufs, table_entries) / sizeof(void *);
    for (size_t i = 0; i < n; i++) {
        dev_free(rt->dev, all[i]);
        all[i] = NULL;
    }
}

/* ---- the MTP head ------------------------------------------------------------ */

/* The MTP layer itself was loaded with the others (layers[n_layers]); this
 * adds the head around it: enorm, hnorm, eh_proj [H][2H], shared_head.norm
 * (the logits come from the main lm_head, which GLM-5 shares with the MTP
 * layer), the head's kernels and its buffers. */
mt_status rt_mtp_load(model_runtime *rt, mt_err *err)
{
    if (!rt->plan->mtp)
        return MT_OK;
    rt_mtp *m = &rt->mtp;
    int64_t H = rt->H, T = rt->T, i = rt->n_layers;
    char n1[160];
    snprintf(n1, sizeof n1, "model.layers.%" PRId64 ".enorm.weight", i);
    MT_CHECK(upload_vec(rt, n1, H, false, &m->enorm, err));
    snprintf(n1, sizeof n1, "model.layers.%" PRId64 ".hnorm.weight", i);
    MT_CHECK(upload_vec(rt, n1, H, false, &m->hnorm, err));
    snprintf(n1, sizeof n1, "model.layers.%" PRId64 ".shared_head.norm.weight", i);
    MT_CHECK(upload_vec(rt, n1, H, false, &m->head_norm, err));
    snprintf(n1, sizeof n1, "model.layers.%" PRId64 ".eh_proj", i);
    const char *mods[1] = {n1};
    int64_t outs[1] = {H};
    MT_CHECK(upload_fused(rt, mods, outs, 1, 2 * H, &m->w_eh, err));
    MT_CHECK(dev_alloc(rt->dev, (size_t)(T * H) * 2, &m->hin, err));
    MT_CHECK(dev_alloc(rt->dev, (size_t)(T * 2 * H) * 2, &m->cat, err));
    MT_CHECK(dev_alloc(rt->dev, (size_t)T * 4, &m->hrows, err));
    const int *g = rt->plan->g;
    m->cat_e = model_kset_kernel(rt->ks, g[MODEL_GS_MTP_CAT_E]);
    m->cat_h = model_kset_kernel(rt->ks, g[MODEL_GS_MTP_CAT_H]);
    m->eh = model_kset_kernel(rt->ks, g[MODEL_GS_MTP_EH]);
    m->to_bf16 = model_kset_kernel(rt->ks, g[MODEL_GS_MTP_TO_BF16]);
    m->to_f32 = model_kset_kernel(rt->ks, g[MODEL_GS_MTP_TO_F32]);
    m->on = true;
    return MT_OK;
}

void rt_mtp_unload(model_runtime *rt)
{
    rt_mtp *m = &rt->mtp;
    if (!rt->dev)
        return;
    void *ptrs[] = {m->enorm, m->hnorm, m->head_norm, m->w_eh, m->hin, m->cat, m->hrows};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        dev_free(rt->dev, ptrs[i]);
    memset(m, 0, sizeof *m);
}
