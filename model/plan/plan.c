/* plan.c: the kernel plan of a checkpoint (plan.h): the runtime's settings
 * from its options, the facts of each layer, and every (family, shape) the
 * forward pass (rt_forward.c) launches, in the order it first launches
 * them. The shapes written here are the runtime's layouts (see rt_load.c):
 * the A projection fuses q_a | kv_a (| indexer wk | weights_proj), B fuses
 * q_b (| indexer wq_b), copies carve the fused f32 outputs into the bf16
 * inputs of the next kernels, and the absorbed MLA runs on the latent
 * cache. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "plan.h"

#include "comm/comm.h"
#include "model/ep_moe.h"
#include "model/moe_layer.h"

#define PAGE_TOKENS_DEFAULT 16
#define BATCH_TOKENS_DEFAULT 512

int model_plan_eps_exponent(double eps, bool *exact)
{
    int e = eps > 0 ? (int)lround(-log10(eps)) : 1;
    if (e < 1)
        e = 1;
    if (e > 12)
        e = 12;
    if (exact)
        *exact = eps > 0 && fabs(pow(10.0, -e) - eps) <= 1e-3 * eps;
    return e;
}


static const char *const act_quant_names[MODEL_ACT_COUNT] = {
    [MODEL_ACT_NONE] = "none", [MODEL_ACT_MXFP4] = "mxfp4", [MODEL_ACT_INT8] = "int8"};
static const kern_dtype act_quant_dtypes[MODEL_ACT_COUNT] = {
    [MODEL_ACT_NONE] = KERN_DT_BF16, [MODEL_ACT_MXFP4] = KERN_DT_MXFP4,
    [MODEL_ACT_INT8] = KERN_DT_I8};

const char *model_act_quant_name(model_act_quant q)
{
    return (unsigned)q < MODEL_ACT_COUNT ? act_quant_names[q] : "?";
}

bool model_act_quant_parse(const char *s, model_act_quant *out)
{
    for (int q = 0; q < MODEL_ACT_COUNT; q++)
        if (s && !strcmp(s, act_quant_names[q])) {
            *out = (model_act_quant)q;
            return true;
        }
    return false;
}

kern_dtype model_act_quant_dtype(model_act_quant q)
{
    return (unsigned)q < MODEL_ACT_COUNT ? act_quant_dtypes[q] : KERN_DT_BF16;
}

/* ---- building ------------------------------------------------------------ */

typedef struct builder {
    model_plan *p;
    const model_config *c;
    int cap;
    bool all_ranks;   /* tune plan: every tensor-parallel rank's kernels */
    bool vocab_all;   /* tune plan: every vocabulary-parallel rank's embedding and head */
    int tp_rank;      /* the rank whose kernels fill the slots */
    bool ep_runtime;  /* an expert-parallel runtime: no whole-layer expert kernels */
    mt_err *err;
} builder;

/* Registers one use: family fam at the shape printed from fmt, for M up to
 * m; *slot receives the entry index. Uses with the same tuning key share
 * one entry (largest M, largest runtime dims, first purpose). */
static mt_status use(builder *b, int *slot, const char *family, int64_t m, const char *purpose,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static mt_status use(builder *b, int *slot, const char *family, int64_t m, const char *purpose,
                     const char *fmt, ...)
{
    char text[KERN_KEY_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    const kern_family *f = kern_family_find(family);
    if (!f)
        return mt_fail(b->err, MT_E_NOT_FOUND, "kernel plan: no kernel family '%s' (%s) in "
                       "this build", family, purpose);
    kern_shape s;
    if (kern_shape_parse(f, text, &s, NULL, b->err) != MT_OK)
        return mt_err_prefix(b->err, "kernel plan: %s shape for %s", family, purpose);
    char why[256];
    if (f->shape_ok && !f->shape_ok(&s, 1, why, sizeof why))
        return mt_fail(b->err, MT_E_UNSUPPORTED, "kernel plan: %s (%s) shape %s: %s", family,
                       purpose, text, why);
    char key[KERN_KEY_MAX];
    kern_shape_key(f, &s, false, key, sizeof key);
    model_plan *p = b->p;
    for (int i = 0; i < p->n_entries; i++) {
        model_plan_entry *e = &p->entries[i];
        if (e->fam != f || strcmp(e->key, key))
            continue;
        if (m > e->m_max)
            e->m_max = m;
        for (int d = 0; d < f->n_dims; d++)
            if (f->dims[d].runtime && s.v[d] > e->shape.v[d])
                e->shape.v[d] = s.v[d];
        *slot = i;
        return MT_OK;
    }
    if (p->n_entries == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        model_plan_entry *ne = realloc(p->entries, sizeof *ne * (size_t)cap);
        if (!ne)
            return mt_fail(b->err, MT_E_NOMEM, "kernel plan: entries");
        p->entries = ne;
        b->cap = cap;
    }
    model_plan_entry *e = &p->entries[p->n_entries];
    memset(e, 0, sizeof *e);
    e->fam = f;
    e->shape = s;
    snprintf(e->key, sizeof e->key, "%s", key);
    snprintf(e->purpose, sizeof e->purpose, "%s", purpose);
    e->m_max = m;
    *slot = p->n_entries++;
    return MT_OK;
}

#define USE(slot, ...)                                                                           \
    do {                                                                                         \
        mt_status s_ = use(b, (slot), __VA_ARGS__);                                              \
        if (s_ != MT_OK)                                                                         \
            return s_;                                                                           \
    } while (0)

/* ops_copy: n values from column so of rows sw wide (dtype s) to column
 * doff of rows dw wide (dtype d). */
#define COPY(slot, m, purpose, sw, so, n, dw, doff, s, d)                                        \
    USE(slot, "ops_copy", m, purpose,                                                            \
        "SW=%" PRId64 ",SO=%" PRId64 ",N=%" PRId64 ",DW=%" PRId64 ",DO=%" PRId64 ",s=%s,d=%s",  \
        (int64_t)(sw), (int64_t)(so), (int64_t)(n), (int64_t)(dw), (int64_t)(doff), s, d)

/* The attention of layer ly on a rank holding tp's share, slots into k
 * (ly->k for the slots' rank, scratch for the other ranks of a tune plan). */
static mt_status attention_uses(builder *b, const model_plan_layer *ly, const model_tp_dims *tp,
                                int *k)
{
    const model_config *c = b->c;
    const model_plan_params *pp = &b->p->p;
    /* NH: this rank's heads; the o_proj input is every head's (gathered). */
    int64_t T = pp->T, H = c->hidden_size, NH = tp->heads, QL = c->q_lora_rank;
    int64_t NH_all = c->num_attention_heads;
    int64_t L = c->kv_lora_rank, R = c->qk_rope_head_dim, D = c->qk_nope_head_dim;
    int64_t IH = c->index_n_heads, ID = c->index_head_dim, VD = c->v_head_dim;
    int64_t theta = (int64_t)llround(c->rope_theta), P = pp->max_ctx;
    int64_t pool_rows = pp->n_pages * pp->ps, ctx = pp->max_ctx < 4096 ? pp->max_ctx : 4096;
    const char *kv = kern_dtype_name((kern_dtype)pp->kv_dtype);
    USE(&k[MODEL_KS_NORM_IN], "rmsnorm", T, "norm", "N=%" PRId64 ",eps_e=%d", H, pp->eps_e);
    USE(&k[MODEL_KS_GEMM_A], "gemm", T, "attn A", "N=%" PRId64 ",K=%" PRId64, ly->n_a, H);
    COPY(&k[MODEL_KS_COPY_QA], T, "q latent", ly->n_a, 0, QL, QL, 0, "f32", "bf16");
    USE(&k[MODEL_KS_NORM_Q], "rmsnorm", T, "q_a norm", "N=%" PRId64 ",eps_e=%d", QL, pp->eps6_e);
    COPY(&k[MODEL_KS_COPY_LAT], T, "kv latent", ly->n_a, QL, L, L, 0, "f32", "bf16");
    USE(&k[MODEL_KS_NORM_KV], "rmsnorm", T, "kv_a norm", "N=%" PRId64 ",eps_e=%d", L, pp->eps6_e);
    COPY(&k[MODEL_KS_COPY_KR], T, "k rope", ly->n_a, QL + L, R, R, 0, "f32", "bf16");
    USE(&k[MODEL_KS_ROPE_KR], "rope", T, "k rope",
        "H=1,HD=%" PRId64 ",ROFF=0,R=%" PRId64 ",ln=0,theta=%" PRId64 ",P=%" PRId64, R, R, theta,
        P);
    USE(&k[MODEL_KS_STORE_KV], "ops_kv_store", T, "kv store",
        "W1=%" PRId64 ",W2=%" PRId64 ",kv=%s,P=%" PRId64, L, R, kv, pool_rows);
    if (ly->full) {
        int64_t o = QL + L + R;
        COPY(&k[MODEL_KS_COPY_IK], T, "index key", ly->n_a, o, ID, ID, 0, "f32", "bf16");
        USE(&k[MODEL_KS_ROPE_IK], "rope", T, "index key",
            "H=1,HD=%" PRId64 ",ROFF=0,R=%" PRId64 ",ln=1,theta=%" PRId64 ",P=%" PRId64, ID, R,
            theta, P);
        USE(&k[MODEL_KS_STORE_IK], "ops_kv_store", T, "index store",
            "W1=%" PRId64 ",W2=0,kv=%s,P=%" PRId64, ID, kv, pool_rows);
        COPY(&k[MODEL_KS_COPY_IW], T, "index w", ly->n_a, o + ID, IH, IH, 0, "f32", "f32");
    }
    int64_t n_b = NH * (D + R) + (ly->full ? IH * ID : 0);
    USE(&k[MODEL_KS_GEMM_B], "gemm", T, "attn B", "N=%" PRId64 ",K=%" PRId64, n_b, QL);
    COPY(&k[MODEL_KS_COPY_Q], T, "q", n_b, 0, NH * (D + R), NH * (D + R), 0, "f32", "bf16");
    USE(&k[MODEL_KS_ROPE_Q], "rope", T, "q rope",
        "H=%" PRId64 ",HD=%" PRId64 ",ROFF=%" PRId64 ",R=%" PRId64 ",ln=0,theta=%" PRId64
        ",P=%" PRId64, NH, D + R, D, R, theta, P);
    if (ly->full) {
        COPY(&k[MODEL_KS_COPY_IQ], T, "index q", n_b, NH * (D + R), IH * ID, IH * ID, 0,
             "f32", "bf16");
        USE(&k[MODEL_KS_ROPE_IQ], "rope", T, "index q",
            "H=%" PRId64 ",HD=%" PRId64 ",ROFF=0,R=%" PRId64 ",ln=0,theta=%" PRId64
            ",P=%" PRId64, IH, ID, R, theta, P);
        USE(&k[MODEL_KS_INDEXER], "dsa_indexer", T, "indexer",
            "IH=%" PRId64 ",ID=%" PRId64 ",topk=%" PRId64 ",ps=%d,kv=%s,C=%" PRId64, IH, ID,
            c->index_topk, pp->ps, kv, ctx);
    }
    USE(&k[MODEL_KS_ABSORB], "ops_head_gemm", T, "q absorb",
        "H=%" PRId64 ",K=%" PRId64 ",KA=%" PRId64 ",N=%" PRId64 ",NO=%" PRId64, NH, D, D + R, L,
        L + R);
    /* One row per (token, head). */
    COPY(&k[MODEL_KS_COPY_QROPE], T * NH, "q rope copy", D + R, D, R, L + R, L, "bf16", "bf16");
    USE(&k[MODEL_KS_DECODE], "mla_decode", T, "attention",
        "H=%" PRId64 ",L=%" PRId64 ",R=%" PRId64 ",D=%" PRId64 ",topk=%" PRId64
        ",ps=%d,kv=%s,sparse=1,C=%" PRId64, NH, L, R, D, c->index_topk, pp->ps, kv, ctx);
    /* Prefill chunks' rows that see at most index_topk tokens (every key
     * kept): expanded, dense; P the longest prefix such a row can have. */
    int64_t pmax = c->index_topk < pp->max_ctx ? c->index_topk : pp->max_ctx;
    USE(&k[MODEL_KS_PREFILL], "mla_prefill", T, "prefill attention",
        "H=%" PRId64 ",L=%" PRId64 ",R=%" PRId64 ",D=%" PRId64 ",V=%" PRId64
        ",ps=%d,kv=%s,P=%" PRId64 ",sm=0", NH, L, R, D, VD, pp->ps, kv, pmax);
    COPY(&k[MODEL_KS_COPY_O], T, "attn out", NH * L, 0, NH * L, NH * L, 0, "f32", "bf16");
    USE(&k[MODEL_KS_VOUT], "ops_head_gemm", T, "v absorb",
        "H=%" PRId64 ",K=%" PRId64 ",KA=%" PRId64 ",N=%" PRId64 ",NO=%" PRId64, NH, L, L, VD,
        VD);
    USE(&k[MODEL_KS_GEMM_O], "gemm", T, "o_proj", "N=%" PRId64 ",K=%" PRId64, tp->o_rows,
        NH_all * VD);
    USE(&k[MODEL_KS_RESID], "ops_residual", T, "residual", "N=%" PRId64, H);
    return MT_OK;
}

/* The layer's attention at the slots' rank's share, then (tune plans)
 * every other tensor-parallel rank's. */
static mt_status attention_all(builder *b, model_plan_layer *ly)
{
    const model_plan_params *pp = &b->p->p;
    mt_status st = attention_uses(b, ly, &pp->tp, ly->k);
    for (int r = 1; st == MT_OK && b->all_ranks && r < pp->tp_ranks; r++) {
        model_tp_dims d;
        int scratch[MODEL_KS_COUNT];
        st = model_tp_local(b->c, pp->tp_ranks, r, &d, b->err);
        if (st == MT_OK)
            st = attention_uses(b, ly, &d, scratch);
    }
    return st;
}

/* A bf16 SwiGLU MLP of intermediate I (a dense layer's, or a bf16 shared
 * expert's: sh selects the slots). Under tensor parallelism a rank runs
 * its share of the intermediate (gate and up rows) and its o_proj-like
 * share of the down rows over the whole gathered intermediate (rt_tp.c);
 * a tune plan lists every rank's shapes. */
static mt_status swiglu_uses(builder *b, model_plan_layer *ly, int64_t I, bool sh)
{
    const model_plan_params *pp = &b->p->p;
    int64_t T = pp->T, H = b->c->hidden_size;
    int ranks = pp->tp_ranks > 1 ? pp->tp_ranks : 1;
    if (I < ranks)
        return mt_fail(b->err, MT_E_INVALID, "tensor parallelism over %d ranks: a %s of "
                       "intermediate %" PRId64 ", fewer than the ranks", ranks,
                       sh ? "shared expert" : "dense MLP", I);
    for (int r = 0; r < ranks; r++) {
        if (r != b->tp_rank && !b->all_ranks)
            continue;
        int64_t i0, ni, o0, no;
        model_ep_range(I, ranks, r, &i0, &ni);
        model_ep_range(H, ranks, r, &o0, &no);
        int scratch[3];
        int *gu = &scratch[0], *act = &scratch[1], *down = &scratch[2];
        if (r == b->tp_rank) {
            gu = &ly->k[sh ? MODEL_KS_SH_GEMM_GU : MODEL_KS_GEMM_GU];
            act = &ly->k[sh ? MODEL_KS_SH_SILU : MODEL_KS_SILU];
            down = &ly->k[sh ? MODEL_KS_SH_GEMM_DOWN : MODEL_KS_GEMM_DOWN];
        }
        USE(gu, "gemm", T, sh ? "shared gate/up" : "mlp gate/up", "N=%" PRId64 ",K=%" PRId64,
            2 * ni, H);
        USE(act, "ops_silu_mul", T, sh ? "shared act" : "mlp act", "I=%" PRId64, ni);
        USE(down, "gemm", T, sh ? "shared down" : "mlp down", "N=%" PRId64 ",K=%" PRId64, no, I);
    }
    if (ranks > 1) { /* the activations' gather lays the ranks' columns side by side */
        int unused;
        USE(&unused, "tp_cols", T, "gather MLP activations (TP)", "ranks=%d,U=%" PRId64
            ",per=1,t=bf16", ranks, I);
    }
    return MT_OK;
}

static mt_status mlp_uses(builder *b, model_plan_layer *ly)
{
    const model_config *c = b->c;
    const model_plan_params *pp = &b->p->p;
    int *k = ly->k;
    int64_t T = pp->T, H = c->hidden_size;
    USE(&k[MODEL_KS_NORM_POST], "rmsnorm", T, "norm", "N=%" PRId64 ",eps_e=%d", H, pp->eps_e);
    if (!ly->moe)
        return swiglu_uses(b, ly, ly->inter, false);
    /* The served MoE layer's kernels (moe_layer.h), keys from the one list. */
    moe_dims md;
    model_moe_dims(c, pp->act, pp->moe_wl, ly->sh_inter && ly->sh_mxfp4 ? ly->sh_inter : 0, &md);
    moe_keys mk;
    moe_layer_keys(&md, &mk);
    USE(&k[MODEL_KS_ROUTE], "moe_route", T, "router", "%s", mk.route);
    /* Every expert on one device; an expert-parallel deployment runs the
     * ranks' local expert kernels instead (below, or ep_moe.c's in the
     * runtime), never these. */
    if (!pp->ep_ranks && !b->ep_runtime) {
        USE(&k[MODEL_KS_ALIGN], "moe_align", T, "expert sort", "%s", mk.align);
        USE(&k[MODEL_KS_UP], "moe_gemm_up", T, "experts up", "%s", mk.up);
        USE(&k[MODEL_KS_DOWN], "moe_gemm_down", T, "experts down", "%s", mk.down);
    }
    if (md.comb)
        USE(&k[MODEL_KS_COMBINE], "moe_combine", T, "combine", "%s", mk.combine);
    /* Expert parallelism: each rank's kernels at its own expert count (the
     * counts differ by one at most: one set per distinct count). */
    int64_t prev_count = -1;
    for (int r = 0; r < pp->ep_ranks; r++) {
        int64_t first, count;
        model_ep_range(md.n_experts, pp->ep_ranks, r, &first, &count);
        if (count == prev_count)
            continue;
        prev_count = count;
        moe_dims local;
        model_ep_local_dims(&md, count, &local);
        moe_keys lk;
        moe_layer_keys(&local, &lk);
        char why[64];
        int unused;
        snprintf(why, sizeof why, "expert sort (EP rank, %" PRId64 " experts)", count);
        USE(&unused, "moe_align", T * md.topk, why, "%s", lk.align);
        snprintf(why, sizeof why, "experts up (EP rank, %" PRId64 " experts)", count);
        USE(&unused, "moe_gemm_up", T * md.topk, why, "%s", lk.up);
        snprintf(why, sizeof why, "experts down (EP rank, %" PRId64 " experts)", count);
        USE(&unused, "moe_gemm_down", T * md.topk, why, "%s", lk.down);
    }
    /* Expert parallelism's own steps on the device (ep_moe.c): the pairs
     * by destination, the dispatch's send order, the return's layout. */
    if (pp->ep_ranks > 0) {
        int unused;
        USE(&unused, "moe_align", T, "pairs by destination rank (EP)",
            "E=%lld,topk=%d,bm=1,skew=0", (long long)md.n_experts, md.topk);
        USE(&unused, "ep_dispatch", T * md.topk, "dispatch (EP)",
            "E=%lld,topk=%d,ranks=%d,H=%" PRId64, (long long)md.n_experts, md.topk,
            pp->ep_ranks, H);
        USE(&unused, "ep_return", T * md.topk, "return (EP)", "H=%" PRId64, H);
    }
    if (!ly->sh_inter)
        return MT_OK;
    if (ly->sh_mxfp4) {
        /* The shared expert as a one-expert MoE. */
        USE(&k[MODEL_KS_SH_ALIGN], "moe_align", T, "shared sort", "%s", mk.sh_align);
        USE(&k[MODEL_KS_SH_UP], "moe_gemm_up", T, "shared up", "%s", mk.sh_up);
        USE(&k[MODEL_KS_SH_DOWN], "moe_gemm_down", T, "shared down", "%s", mk.sh_down);
    } else {
        return swiglu_uses(b, ly, ly->sh_inter, true);
    }
    return MT_OK;
}

static mt_status global_uses(builder *b)
{
    const model_config *c = b->c;
    const model_plan_params *pp = &b->p->p;
    int64_t T = pp->T, H = c->hidden_size;
    int *g = b->p->g;
    /* Tensor parallelism: the rank's vocabulary rows, plus a zero row the
     * other ranks' tokens read (rt_tp.c), unless the vocabulary is split
     * over the whole job (rt_vp.c). */
    bool tp = pp->tp_ranks > 1;
    USE(&g[MODEL_GS_EMBED], "ops_embed", T, "embedding", "N=%" PRId64 ",V=%" PRId64, H,
        pp->tp.vocab + (tp && pp->vocab_ranks <= 1));
    USE(&g[MODEL_GS_NORM_FINAL], "rmsnorm", T, "norm", "N=%" PRId64 ",eps_e=%d", H, pp->eps_e);
    /* The rows whose logits are wanted, gathered from the M rows of the batch. */
    USE(&g[MODEL_GS_GATHER], "ops_embed", T, "logit rows", "N=%" PRId64 ",V=%" PRId64, H, T);
    USE(&g[MODEL_GS_LM_HEAD], "gemm", T, "lm_head", "N=%" PRId64 ",K=%" PRId64, pp->tp.vocab, H);
    for (int r = 1; b->all_ranks && r < pp->tp_ranks; r++) {
        model_tp_dims d;
        int unused;
        if (model_tp_local(c, pp->tp_ranks, r, &d, b->err) != MT_OK)
            return MT_E_INVALID;
        USE(&unused, "ops_embed", T, "embedding (TP rank)", "N=%" PRId64 ",V=%" PRId64, H,
            d.vocab + 1);
        USE(&unused, "gemm", T, "lm_head (TP rank)", "N=%" PRId64 ",K=%" PRId64, d.vocab, H);
    }
    /* The gathers' layout step (rt_tp.c): heads, o_proj and down rows, logits. */
    if (tp) {
        int unused;
        USE(&unused, "tp_cols", T, "gather heads (TP)", "ranks=%d,U=%lld,per=%lld,t=bf16",
            pp->tp_ranks, (long long)c->num_attention_heads, (long long)c->v_head_dim);
        USE(&unused, "tp_cols", T, "gather rows (TP)", "ranks=%d,U=%" PRId64 ",per=1,t=f32",
            pp->tp_ranks, H);
        if (pp->vocab_ranks <= 1 || b->vocab_all) /* else the job's gather, below */
            USE(&unused, "tp_cols", T, "gather logits (TP)", "ranks=%d,U=%lld,per=1,t=f32",
                pp->tp_ranks, (long long)c->vocab_size);
    }
    /* Data-parallel ranks' vocabulary-parallel head (rt_vp.c): rank 0 lays
     * the ranks' logits columns side by side. A tune plan lists every
     * rank's lm_head (an embedding's key does not name its rows). */
    if (pp->vocab_ranks > 1) {
        int unused;
        for (int r = 0; b->vocab_all && r < pp->vocab_ranks; r++) {
            int64_t v0, nv;
            model_ep_range(c->vocab_size, pp->vocab_ranks, r, &v0, &nv);
            USE(&unused, "gemm", T, "lm_head (vocabulary-parallel rank)",
                "N=%" PRId64 ",K=%" PRId64, nv, H);
        }
        USE(&unused, "tp_cols", T, "gather logits (vocabulary-parallel)",
            "ranks=%d,U=%lld,per=1,t=f32", pp->vocab_ranks, (long long)c->vocab_size);
    }
    return MT_OK;
}

/* The MTP head around its decoder layer (rt_mtp.c): [enorm(embed) |
 * hnorm(hidden)] -> eh_proj -> the residual stream. */
static mt_status mtp_uses(builder *b)
{
    int64_t T = b->p->p.T, H = b->c->hidden_size;
    int *g = b->p->g;
    COPY(&g[MODEL_GS_MTP_CAT_E], T, "mtp concat", H, 0, H, 2 * H, 0, "bf16", "bf16");
    COPY(&g[MODEL_GS_MTP_CAT_H], T, "mtp concat", H, 0, H, 2 * H, H, "bf16", "bf16");
    USE(&g[MODEL_GS_MTP_EH], "gemm", T, "mtp eh_proj", "N=%" PRId64 ",K=%" PRId64, H, 2 * H);
    COPY(&g[MODEL_GS_MTP_TO_BF16], T, "mtp resid", H, 0, H, H, 0, "f32", "bf16");
    COPY(&g[MODEL_GS_MTP_TO_F32], T, "mtp resid", H, 0, H, H, 0, "f32", "f32");
    return MT_OK;
}

#undef COPY
#undef USE

/* ---- what the checkpoint decides ------------------------------------------ */

/* A module's weight is MXFP4 (from the file when w is given, else from the
 * Quark config); *act: its inputs are quantized to MXFP4 on the fly. */
static mt_status module_mxfp4(const model_config *c, const model_weights *w, const char *module,
                              bool *mxfp4, bool *act, mt_err *err)
{
    if (w) {
        const model_linear *l;
        mt_status st = model_weights_linear(w, module, &l, err);
        if (st != MT_OK)
            return mt_err_prefix(err, "kernel plan");
        *mxfp4 = l->fmt == MODEL_WFMT_MXFP4;
        *act = l->act_mxfp4;
        return MT_OK;
    }
    model_quark_match m;
    model_quark_lookup(c->quark, module, &m);
    *mxfp4 = m.weight.kind == MODEL_QKIND_MXFP4;
    *act = *mxfp4 && m.input.kind == MODEL_QKIND_MXFP4 && m.input.is_dynamic;
    return MT_OK;
}

/* What the runtime cannot run. */
static mt_status check_config(const model_config *c, const model_weights *w, mt_err *err)
{
    if (c->q_lora_rank <= 0)
        return mt_fail(err, MT_E_UNSUPPORTED, "config.json: q_lora_rank 0 (a plain q_proj): this "
                       "runtime runs the low-rank query path of GLM-5 only");
    if (c->num_key_value_heads != c->num_attention_heads)
        return mt_fail(err, MT_E_UNSUPPORTED, "config.json: num_key_value_heads %" PRId64
                       " != num_attention_heads %" PRId64, c->num_key_value_heads,
                       c->num_attention_heads);
    if (c->attention_bias)
        return mt_fail(err, MT_E_UNSUPPORTED, "config.json: attention_bias true");
    if (strcmp(c->scoring_func, "sigmoid"))
        return mt_fail(err, MT_E_UNSUPPORTED, "config.json: scoring_func \"%s\" (the router "
                       "kernel is sigmoid, as GLM-5)", c->scoring_func);
    bool full0 = c->num_hidden_layers >= 1 &&
                 (w ? model_weights_layer_indexer_full(w, 0) : c->layer_indexer_full[0]);
    if (!full0)
        return mt_fail(err, MT_E_UNSUPPORTED, "config.json: layer 0 does not run its own DSA "
                       "indexer, so shared layers would have no top-k to reuse");
    if (c->index_head_dim < c->qk_rope_head_dim)
        return mt_fail(err, MT_E_FORMAT, "config.json: index_head_dim < qk_rope_head_dim");
    return MT_OK;
}

static mt_status resolve_params(const model_config *c, const model_plan_opts *o,
                                model_plan_params *pp, mt_err *err)
{
    pp->eps_e = model_plan_eps_exponent(c->rms_norm_eps, NULL);
    pp->eps6_e = 6; /* q_a_layernorm / kv_a_layernorm: 1e-6 as in transformers */
    pp->act = KERN_DT_BF16;
    if (o->act_quant_set) {
        if ((unsigned)o->act_quant >= MODEL_ACT_COUNT)
            return mt_fail(err, MT_E_INVALID, "act_quant %d: none, mxfp4 or int8",
                           (int)o->act_quant);
        pp->act = model_act_quant_dtype(o->act_quant);
    } else {
        /* The routed experts of the first MoE layer decide. */
        for (int64_t i = 0; i < c->num_hidden_layers; i++) {
            if (!c->layer_moe[i])
                continue;
            char name[128];
            snprintf(name, sizeof name, "model.layers.%" PRId64 ".mlp.experts.0.gate_proj", i);
            bool mx = false, a4 = false;
            mt_status st = module_mxfp4(c, o->weights, name, &mx, &a4, err);
            if (st != MT_OK)
                return st;
            pp->act = a4 ? KERN_DT_MXFP4 : KERN_DT_BF16;
            break;
        }
    }
    pp->moe_wl = moe_weight_layout(o->backend);
    pp->kv_dtype = o->kv_dtype ? o->kv_dtype : KERN_DT_BF16;
    if (pp->kv_dtype != KERN_DT_BF16 && pp->kv_dtype != KERN_DT_FP8E4M3)
        return mt_fail(err, MT_E_INVALID, "kv_dtype %s: the cache holds bf16 or fp8",
                       kern_dtype_name((kern_dtype)pp->kv_dtype));
    if (o->kv_page_size < 0 || o->kv_pages < 0)
        return mt_fail(err, MT_E_INVALID, "kv_page_size %d, kv_pages %d: negative",
                       o->kv_page_size, o->kv_pages);
    pp->ps = o->kv_page_size > 0 ? o->kv_page_size : PAGE_TOKENS_DEFAULT;
    int64_t ctx = c->max_position_embeddings;
    pp->n_pages = o->kv_pages > 0 ? o->kv_pages : 8 * ((ctx + pp->ps - 1) / pp->ps);
    if (pp->n_pages > INT32_MAX / pp->ps)
        return mt_fail(err, MT_E_INVALID, "kv_pages %" PRId64 " x page %d overflows",
                       pp->n_pages, pp->ps);
    pp->max_ctx = ctx < pp->n_pages * pp->ps ? ctx : pp->n_pages * pp->ps;
    if (o->max_batch_tokens < 0)
        return mt_fail(err, MT_E_INVALID, "max_batch_tokens %d", o->max_batch_tokens);
    pp->T = o->max_batch_tokens > 0 ? o->max_batch_tokens : BATCH_TOKENS_DEFAULT;
    if (o->ep_ranks < 0 || o->ep_ranks > 4096)
        return mt_fail(err, MT_E_INVALID, "ep_ranks %d: 0 (none) to 4096", o->ep_ranks);
    if (o->ep_ranks > 1 && c->n_routed_experts < o->ep_ranks)
        return mt_fail(err, MT_E_INVALID, "expert parallelism over %d ranks: config.json has "
                       "%" PRId64 " routed experts", o->ep_ranks, c->n_routed_experts);
    pp->ep_ranks = o->ep_ranks;
    if (o->tp_ranks < 0 || o->tp_ranks > 4096 || o->tp_rank >= (o->tp_ranks > 1 ? o->tp_ranks : 1)
        || o->tp_rank < -1)
        return mt_fail(err, MT_E_INVALID, "tensor parallelism: rank %d of %d ranks",
                       o->tp_rank, o->tp_ranks);
    pp->tp_ranks = o->tp_ranks > 1 ? o->tp_ranks : 0;
    MT_CHECK(model_tp_local(c, pp->tp_ranks, o->tp_rank > 0 ? o->tp_rank : 0, &pp->tp, err));
    if (o->vocab_ranks <= 1 || (o->vocab_ranks == pp->tp_ranks && o->vocab_rank < 0))
        return MT_OK; /* tensor parallelism over the whole job splits it itself */
    if (o->vocab_ranks > 4096 || o->vocab_rank < -1 || o->vocab_rank >= o->vocab_ranks)
        return mt_fail(err, MT_E_INVALID, "vocabulary parallelism: rank %d of %d ranks",
                       o->vocab_rank, o->vocab_ranks);
    if (pp->tp_ranks && (o->vocab_ranks <= pp->tp_ranks || o->vocab_ranks % pp->tp_ranks))
        return mt_fail(err, MT_E_INVALID, "vocabulary parallelism over %d ranks beside "
                       "tensor-parallel groups of %d: the job must be several whole groups "
                       "(one group splits the vocabulary itself)", o->vocab_ranks,
                       pp->tp_ranks);
    if (c->vocab_size < o->vocab_ranks)
        return mt_fail(err, MT_E_INVALID, "vocabulary parallelism over %d ranks: config.json "
                       "has vocab_size %" PRId64, o->vocab_ranks, c->vocab_size);
    pp->vocab_ranks = o->vocab_ranks;
    if (o->vocab_rank >= 0) /* a tune plan (-1) keeps the whole vocabulary in its slots */
        model_ep_range(c->vocab_size, o->vocab_ranks, o->vocab_rank, &pp->tp.vocab0,
                       &pp->tp.vocab);
    return MT_OK;
}

mt_status model_tp_local(const model_config *c, int ranks, int rank, model_tp_dims *out,
                         mt_err *err)
{
    int64_t NH = c->num_attention_heads, H = c->hidden_size, V = c->vocab_size;
    if (ranks <= 1) {
        *out = (model_tp_dims){.heads = NH, .o_rows = H, .vocab = V};
        return MT_OK;
    }
    const char *what = NH < ranks ? "num_attention_heads" : H < ranks ? "hidden_size"
                     : V < ranks ? "vocab_size" : NULL;
    if (what)
        return mt_fail(err, MT_E_INVALID, "tensor parallelism over %d ranks: config.json has %s "
                       "%" PRId64 ", fewer than the ranks", ranks, what,
                       NH < ranks ? NH : H < ranks ? H : V);
    model_ep_range(NH, ranks, rank, &out->head0, &out->heads);
    model_ep_range(H, ranks, rank, &out->o_row0, &out->o_rows);
    model_ep_range(V, ranks, rank, &out->vocab0, &out->vocab);
    return MT_OK;
}

static mt_status layer_facts(const model_config *c, const model_plan_opts *o,
                             const model_tp_dims *tp, int64_t i, model_plan_layer *ly,
                             mt_err *err)
{
    int64_t QL = c->q_lora_rank, L = c->kv_lora_rank, R = c->qk_rope_head_dim;
    int64_t IH = c->index_n_heads, ID = c->index_head_dim;
    int64_t D = c->qk_nope_head_dim;
    for (int s = 0; s < MODEL_KS_COUNT; s++)
        ly->k[s] = -1;
    ly->moe = c->layer_moe[i];
    ly->full = o->weights ? model_weights_layer_indexer_full(o->weights, i)
                          : c->layer_indexer_full[i];
    ly->n_a = QL + L + R + (ly->full ? ID + IH : 0);
    ly->n_b = tp->heads * (D + R) + (ly->full ? IH * ID : 0);
    ly->inter = ly->moe ? 0 : c->intermediate_size;
    ly->sh_inter = ly->moe ? c->n_shared_experts * c->moe_intermediate_size : 0;
    ly->sh_mxfp4 = false;
    if (ly->sh_inter) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.%" PRId64 ".mlp.shared_experts.gate_proj", i);
        bool act;
        mt_status st = module_mxfp4(c, o->weights, name, &ly->sh_mxfp4, &act, err);
        if (st != MT_OK)
            return st;
    }
    return MT_OK;
}

/* The first MTP layer (layers[n_layers]) and the head around it. */
static mt_status mtp_layer_uses(builder *b, const model_plan_opts *o)
{
    const model_config *c = b->c;
    model_plan *p = b->p;
    if (c->num_nextn_predict_layers < 1)
        return mt_fail(b->err, MT_E_UNSUPPORTED, "config.json: num_nextn_predict_layers 0: the "
                       "checkpoint has no MTP layer to draft with");
    model_plan_layer *ly = &p->layers[p->n_layers];
    mt_status st = layer_facts(c, o, &p->p.tp, p->n_layers, ly, b->err);
    if (st == MT_OK && !ly->full)
        st = mt_fail(b->err, MT_E_UNSUPPORTED, "MTP layer %" PRId64 " has no DSA indexer of its "
                     "own (index_share_for_mtp_iteration): drafting needs one", p->n_layers);
    if (st == MT_OK)
        st = attention_all(b, ly);
    if (st == MT_OK)
        st = mlp_uses(b, ly);
    if (st == MT_OK)
        st = mtp_uses(b);
    return st == MT_OK ? MT_OK : mt_err_prefix(b->err, "MTP layer %" PRId64, p->n_layers);
}

void model_plan_free(model_plan *p)
{
    if (!p)
        return;
    free(p->entries);
    free(p->layers);
    free(p);
}

mt_status model_plan_build(const model_config *c, const model_plan_opts *o, model_plan **out,
                           mt_err *err)
{
    *out = NULL;
    model_plan_opts dflt = {0};
    if (!o)
        o = &dflt;
    mt_status st = check_config(c, o->weights, err);
    if (st != MT_OK)
        return st;
    model_plan *p = calloc(1, sizeof *p);
    if (!p)
        return mt_fail(err, MT_E_NOMEM, "kernel plan");
    p->n_layers = c->num_hidden_layers;
    p->mtp = o->mtp;
    for (int g = 0; g < MODEL_GS_COUNT; g++)
        p->g[g] = -1;
    p->layers = calloc((size_t)(p->n_layers + 1), sizeof *p->layers);
    if (!p->layers) {
        model_plan_free(p);
        return mt_fail(err, MT_E_NOMEM, "kernel plan: layers");
    }
    builder b = {.p = p, .c = c, .all_ranks = o->tp_ranks > 1 && o->tp_rank < 0,
                 .vocab_all = o->vocab_ranks > 1 && o->vocab_rank < 0,
                 .tp_rank = o->tp_rank > 0 ? o->tp_rank : 0, .ep_runtime = o->ep_runtime,
                 .err = err};
    st = resolve_params(c, o, &p->p, err);
    for (int64_t i = 0; st == MT_OK && i < p->n_layers; i++) {
        model_plan_layer *ly = &p->layers[i];
        st = layer_facts(c, o, &p->p.tp, i, ly, err);
        if (st == MT_OK)
            st = attention_all(&b, ly);
        if (st == MT_OK)
            st = mlp_uses(&b, ly);
        if (st != MT_OK)
            mt_err_prefix(err, "layer %" PRId64, i);
    }
    if (st == MT_OK)
        st = global_uses(&b);
    if (st == MT_OK && p->mtp)
        st = mtp_layer_uses(&b, o);
    if (st != MT_OK) {
        model_plan_free(p);
        return st;
    }
    for (int i = 0; i < p->n_entries; i++) {
        model_plan_entry *e = &p->entries[i];
        kern_shape_key(e->fam, &e->shape, true, e->shape_text, sizeof e->shape_text);
    }
    *out = p;
    return MT_OK;
}

mt_status model_kernel_plan(const char *model_dir_or_config, const model_plan_opts *o,
                            model_plan_entry **out, int *n, mt_err *err)
{
    *out = NULL;
    *n = 0;
    struct stat sb;
    size_t len = strlen(model_dir_or_config) + 16;
    char *path = malloc(len);
    if (!path)
        return mt_fail(err, MT_E_NOMEM, "kernel plan: path");
    if (stat(model_dir_or_config, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(path, len, "%s/config.json", model_dir_or_config);
    else
        snprintf(path, len, "%s", model_dir_or_config);
    model_config *c = NULL;
    mt_status st = model_config_load(path, &c, err);
    if (st != MT_OK) {
        free(path);
        return st;
    }
    model_plan_opts po = o ? *o : (model_plan_opts){0};
    po.weights = NULL; /* config.json alone */
    model_plan *p = NULL;
    st = model_plan_build(c, &po, &p, err);
    if (st != MT_OK)
        mt_err_prefix(err, "%s", path);
    free(path);
    model_config_destroy(c);
    if (st != MT_OK)
        return st;
    *out = p->entries;
    *n = p->n_entries;
    p->entries = NULL;
    model_plan_free(p);
    return MT_OK;
}
