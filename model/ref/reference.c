/* reference.c: the plain C reference forward pass (see reference.h). One
 * token at a time through every layer, each layer keeping its own float
 * caches of the latent rows and indexer keys; dot products in double. */
#define _GNU_SOURCE /* qsort_r */
#include "reference.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/mxfp4.h"
#include "model/format/weights.h"

typedef struct ref_layer {
    bool moe, full;
    float *in_norm, *post_norm, *q_a, *q_a_norm, *q_b, *kv_a, *kv_a_norm, *kv_b, *o;
    float *wq_b, *wk, *k_norm_w, *k_norm_b, *wproj;
    float *gate_proj, *up_proj, *down_proj; /* dense MLP */
    int64_t inter;
    float *router, *bias;
    float **eg, **eu, **ed;                 /* per routed expert */
    float *sg, *su, *sd;                    /* shared expert */
    int64_t sh_inter;
    bool sh_mxfp4;
    float *cache, *icache;                  /* [ctx][L + R], [ctx][ID] */
} ref_layer;

struct model_ref {
    model_ref_opts o;
    model_weights *w;
    const model_config *c;
    int64_t H, V, NH, QL, L, R, D, VD, IH, ID, TOPK, E, TOPKE, IE, n_layers, cap;
    double eps;
    double *inv_freq;         /* [R/2] RoPE inverse frequencies (config.h) */
    double rope_af, sm_scale; /* cos/sin factor and softmax scale (YaRN or not) */
    float *embed, *norm, *lm_head;
    ref_layer *layers;
    double *margin;  /* [n_margin] the last forward's router margins */
    double *imargin; /* [n_margin] and its indexer selection margins */
    int64_t n_margin;
};

static float bf(const model_ref *r, float x) { return r->o.mimic ? mt_bf16_round(x) : x; }

/* ---- loading ---------------------------------------------------------------- */

static float tensor_elem(const model_tensor_info *t, size_t i)
{
    const uint8_t *p = t->data;
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

/* A tensor by name as floats; round_bf16 as the kernel path stores it. */
static mt_status load_tensor(model_ref *r, const char *name, int64_t n, bool round_bf16,
                             float **out, mt_err *err)
{
    const model_tensor_info *t = model_weights_find(r->w, name);
    if (!t)
        return mt_fail(err, MT_E_NOT_FOUND, "reference: tensor '%s' is missing", name);
    if (model_tensor_numel(t) != n)
        return mt_fail(err, MT_E_FORMAT, "reference: tensor '%s' has %" PRId64 " values, "
                       "expected %" PRId64, name, model_tensor_numel(t), n);
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v)
        return mt_fail(err, MT_E_NOMEM, "reference: %s", name);
    for (int64_t i = 0; i < n; i++) {
        v[i] = tensor_elem(t, (size_t)i);
        if (round_bf16 && r->o.mimic)
            v[i] = mt_bf16_round(v[i]);
    }
    *out = v;
    return MT_OK;
}

/* A linear [out][in] dequantized to floats. The kernel path runs every
 * non-expert linear in bf16: with mimic, those round to bf16. */
static mt_status load_linear(model_ref *r, const char *module, int64_t out, int64_t in,
                             bool expert, float **dst, mt_err *err)
{
    const model_linear *l;
    mt_status st = model_weights_linear(r->w, module, &l, err);
    if (st != MT_OK)
        return st;
    if (l->out != out || l->in != in)
        return mt_fail(err, MT_E_FORMAT, "reference: %s is [%" PRId64 ", %" PRId64 "]", module,
                       l->out, l->in);
    float *v = malloc(sizeof(float) * (size_t)(out * in));
    if (!v)
        return mt_fail(err, MT_E_NOMEM, "reference: %s", module);
    for (int64_t o = 0; o < out; o++) {
        float *row = v + o * in;
        if (l->fmt == MODEL_WFMT_MXFP4) {
            mxfp4_dequantize_row((const uint8_t *)l->weight->data + o * (in / 2),
                                 (const uint8_t *)l->scale->data + o * (in / 32), in, row);
        } else {
            float sc = l->fmt == MODEL_WFMT_FP8_E4M3
                           ? tensor_elem(l->scale, model_tensor_numel(l->scale) == 1 ? 0 : (size_t)o)
                           : 1.0f;
            for (int64_t i = 0; i < in; i++)
                row[i] = tensor_elem(l->weight, (size_t)(o * in + i)) * sc;
        }
        if (!expert && r->o.mimic)
            for (int64_t i = 0; i < in; i++)
                row[i] = mt_bf16_round(row[i]);
    }
    *dst = v;
    return MT_OK;
}

static mt_status load_layer(model_ref *r, int64_t i, ref_layer *ly, mt_err *err)
{
    const model_config *c = r->c;
    char p[96], n[320];
    snprintf(p, sizeof p, "model.layers.%" PRId64 ".", i);
    ly->moe = c->layer_moe[i];
    ly->full = model_weights_layer_indexer_full(r->w, i);
#define T(name_fmt, ...) (snprintf(n, sizeof n, name_fmt, __VA_ARGS__), n)
    int64_t H = r->H;
    MT_CHECK(load_tensor(r, T("%sinput_layernorm.weight", p), H, true, &ly->in_norm, err));
    MT_CHECK(load_tensor(r, T("%spost_attention_layernorm.weight", p), H, true, &ly->post_norm,
                         err));
    MT_CHECK(load_linear(r, T("%sself_attn.q_a_proj", p), r->QL, H, false, &ly->q_a, err));
    MT_CHECK(load_tensor(r, T("%sself_attn.q_a_layernorm.weight", p), r->QL, true, &ly->q_a_norm,
                         err));
    MT_CHECK(load_linear(r, T("%sself_attn.q_b_proj", p), r->NH * (r->D + r->R), r->QL, false,
                         &ly->q_b, err));
    MT_CHECK(load_linear(r, T("%sself_attn.kv_a_proj_with_mqa", p), r->L + r->R, H, false,
                         &ly->kv_a, err));
    MT_CHECK(load_tensor(r, T("%sself_attn.kv_a_layernorm.weight", p), r->L, true, &ly->kv_a_norm,
                         err));
    MT_CHECK(load_linear(r, T("%sself_attn.kv_b_proj", p), r->NH * (r->D + r->VD), r->L, false,
                         &ly->kv_b, err));
    MT_CHECK(load_linear(r, T("%sself_attn.o_proj", p), H, r->NH * r->VD, false, &ly->o, err));
    if (ly->full) {
        MT_CHECK(load_linear(r, T("%sself_attn.indexer.wq_b", p), r->IH * r->ID, r->QL, false,
                             &ly->wq_b, err));
        MT_CHECK(load_linear(r, T("%sself_attn.indexer.wk", p), r->ID, H, false, &ly->wk, err));
        MT_CHECK(load_tensor(r, T("%sself_attn.indexer.k_norm.weight", p), r->ID, false,
                             &ly->k_norm_w, err));
        MT_CHECK(load_tensor(r, T("%sself_attn.indexer.k_norm.bias", p), r->ID, false,
                             &ly->k_norm_b, err));
        MT_CHECK(load_linear(r, T("%sself_attn.indexer.weights_proj", p), r->IH, H, false,
                             &ly->wproj, err));
    }
    if (!ly->moe) {
        ly->inter = c->intermediate_size;
        MT_CHECK(load_linear(r, T("%smlp.gate_proj", p), ly->inter, H, false, &ly->gate_proj, err));
        MT_CHECK(load_linear(r, T("%smlp.up_proj", p), ly->inter, H, false, &ly->up_proj, err));
        MT_CHECK(load_linear(r, T("%smlp.down_proj", p), H, ly->inter, false, &ly->down_proj, err));
    } else {
        MT_CHECK(load_tensor(r, T("%smlp.gate.weight", p), r->E * H, true, &ly->router, err));
        MT_CHECK(load_tensor(r, T("%smlp.gate.e_score_correction_bias", p), r->E, false, &ly->bias,
                             err));
        ly->eg = calloc((size_t)r->E, sizeof(float *));
        ly->eu = calloc((size_t)r->E, sizeof(float *));
        ly->ed = calloc((size_t)r->E, sizeof(float *));
        if (!ly->eg || !ly->eu || !ly->ed)
            return mt_fail(err, MT_E_NOMEM, "reference: experts");
        for (int64_t e = 0; e < r->E; e++) {
            MT_CHECK(load_linear(r, T("%smlp.experts.%" PRId64 ".gate_proj", p, e), r->IE, H, true,
                                 &ly->eg[e], err));
            MT_CHECK(load_linear(r, T("%smlp.experts.%" PRId64 ".up_proj", p, e), r->IE, H, true,
                                 &ly->eu[e], err));
            MT_CHECK(load_linear(r, T("%smlp.experts.%" PRId64 ".down_proj", p, e), H, r->IE, true,
                                 &ly->ed[e], err));
        }
        ly->sh_inter = c->n_shared_experts * c->moe_intermediate_size;
        if (ly->sh_inter) {
            const model_linear *l;
            MT_CHECK(model_weights_linear(r->w, T("%smlp.shared_experts.gate_proj", p), &l, err));
            ly->sh_mxfp4 = l->fmt == MODEL_WFMT_MXFP4;
            MT_CHECK(load_linear(r, T("%smlp.shared_experts.gate_proj", p), ly->sh_inter, H,
                                 ly->sh_mxfp4, &ly->sg, err));
            MT_CHECK(load_linear(r, T("%smlp.shared_experts.up_proj", p), ly->sh_inter, H,
                                 ly->sh_mxfp4, &ly->su, err));
            MT_CHECK(load_linear(r, T("%smlp.shared_experts.down_proj", p), H, ly->sh_inter,
                                 ly->sh_mxfp4, &ly->sd, err));
        }
    }
#undef T
    ly->cache = malloc(sizeof(float) * (size_t)(r->cap * (r->L + r->R)));
    ly->icache = malloc(sizeof(float) * (size_t)(r->cap * r->ID));
    if (!ly->cache || !ly->icache)
        return mt_fail(err, MT_E_NOMEM, "reference: caches");
    return MT_OK;
}

static void free_layer(const model_ref *r, ref_layer *ly)
{
    float *v[] = {ly->in_norm, ly->post_norm, ly->q_a, ly->q_a_norm, ly->q_b, ly->kv_a,
                  ly->kv_a_norm, ly->kv_b, ly->o, ly->wq_b, ly->wk, ly->k_norm_w, ly->k_norm_b,
                  ly->wproj, ly->gate_proj, ly->up_proj, ly->down_proj, ly->router, ly->bias,
                  ly->sg, ly->su, ly->sd, ly->cache, ly->icache};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        free(v[i]);
    for (int64_t e = 0; e < r->E && ly->eg; e++) {
        free(ly->eg[e]);
        free(ly->eu[e]);
        free(ly->ed[e]);
    }
    free(ly->eg);
    free(ly->eu);
    free(ly->ed);
}

void model_ref_close(model_ref *r)
{
    if (!r)
        return;
    for (int64_t i = 0; r->layers && i < r->n_layers; i++)
        free_layer(r, &r->layers[i]);
    free(r->layers);
    free(r->inv_freq);
    free(r->margin);
    free(r->imargin);
    free(r->embed);
    free(r->norm);
    free(r->lm_head);
    model_weights_close(r->w);
    free(r);
}

mt_status model_ref_open(const char *dir, const model_ref_opts *o, model_ref **out, mt_err *err)
{
    *out = NULL;
    model_ref *r = calloc(1, sizeof *r);
    if (!r)
        return mt_fail(err, MT_E_NOMEM, "reference");
    if (o)
        r->o = *o;
    mt_status st = model_weights_open(dir, &r->w, err);
    if (st != MT_OK) {
        model_ref_close(r);
        return st;
    }
    const model_config *c = r->c = model_weights_config(r->w);
    r->H = c->hidden_size;
    r->V = c->vocab_size;
    r->NH = c->num_attention_heads;
    r->QL = c->q_lora_rank;
    r->L = c->kv_lora_rank;
    r->R = c->qk_rope_head_dim;
    r->D = c->qk_nope_head_dim;
    r->VD = c->v_head_dim;
    r->IH = c->index_n_heads;
    r->ID = c->index_head_dim;
    r->TOPK = c->index_topk;
    r->E = c->n_routed_experts;
    r->TOPKE = c->num_experts_per_tok;
    r->IE = c->moe_intermediate_size;
    r->n_layers = c->num_hidden_layers;
    r->eps = c->rms_norm_eps;
    r->cap = c->max_position_embeddings;
    if (r->QL <= 0)
        st = mt_fail(err, MT_E_UNSUPPORTED, "reference: q_lora_rank 0");
    if (st == MT_OK && !(r->inv_freq = malloc(sizeof(double) * (size_t)(r->R / 2 + 1))))
        st = mt_fail(err, MT_E_NOMEM, "reference: rope");
    if (st == MT_OK) {
        model_config_rope_inv_freq(c, r->inv_freq);
        r->rope_af = model_config_rope_attention_factor(c);
        r->sm_scale = model_config_softmax_scale(c);
    }
    if (st == MT_OK)
        st = load_tensor(r, "model.embed_tokens.weight", r->V * r->H, false, &r->embed, err);
    if (st == MT_OK)
        st = load_tensor(r, "model.norm.weight", r->H, true, &r->norm, err);
    if (st == MT_OK) {
        if (model_weights_find(r->w, "lm_head.weight"))
            st = load_linear(r, "lm_head", r->V, r->H, false, &r->lm_head, err);
        else
            st = load_tensor(r, "model.embed_tokens.weight", r->V * r->H, true, &r->lm_head, err);
    }
    if (st == MT_OK && !(r->layers = calloc((size_t)r->n_layers, sizeof *r->layers)))
        st = mt_fail(err, MT_E_NOMEM, "reference: layers");
    for (int64_t i = 0; st == MT_OK && i < r->n_layers; i++)
        st = load_layer(r, i, &r->layers[i], err);
    if (st != MT_OK) {
        model_ref_close(r);
        return st;
    }
    *out = r;
    return MT_OK;
}

int64_t model_ref_vocab(const model_ref *r) { return r->V; }

/* ---- math ------------------------------------------------------------------- */

/* y[o] = W[o] . x for o < out. */
static void matvec(const float *w, const float *x, int64_t out, int64_t in, float *y)
{
    for (int64_t o = 0; o < out; o++) {
        double acc = 0;
        const float *row = w + o * in;
        for (int64_t i = 0; i < in; i++)
            acc += (double)row[i] * x[i];
        y[o] = (float)acc;
    }
}

/* y = x / sqrt(mean(x^2) + eps) * w; x is first rounded as the kernel path
 * stores its input, y as it stores the output. */
static void rmsnorm(const model_ref *r, const float *x, const float *w, int64_t n, double eps,
                    float *y)
{
    double ss = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = bf(r, x[i]);
        ss += v * v;
    }
    double s = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = bf(r, (float)(bf(r, x[i]) * s * w[i]));
}

/* Interleaved RoPE on x[0:rd] at position pos, cos and sin times the
 * attention factor (YaRN; 1 otherwise). */
static void rope(const model_ref *r, float *x, int64_t rd, int64_t pos)
{
    for (int64_t i = 0; i < rd / 2; i++) {
        double f = r->inv_freq[i] * (double)pos;
        double c = cos(f) * r->rope_af, s = sin(f) * r->rope_af, a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = (float)(a * c - b * s);
        x[2 * i + 1] = (float)(b * c + a * s);
    }
}

static float store_kv(const model_ref *r, float v)
{
    return r->o.kv_fp8 ? mt_fp8e4m3_to_f32(mt_f32_to_fp8e4m3(bf(r, v))) : bf(r, v);
}

static float silu(double g) { return (float)(g / (1.0 + exp(-g))); }

/* Positions 0..n-1 sorted by score descending, lower position first among
 * equals: the first min(k, n) are the selection. */
static int by_score(const void *a, const void *b, void *ctx)
{
    const double *sc = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (sc[x] != sc[y])
        return sc[x] > sc[y] ? -1 : 1;
    return x < y ? -1 : 1;
}

/* The indexer selection's margin at one row of n > k keys (order: by
 * score, descending): how far a score must move to change which k are
 * selected, over the sum of the magnitudes of the best and worst scores.
 * Off a tie, the gap between the last key in and the first key out. In a
 * tie (keys that every head's ReLU zeroed score exactly 0 in any path, and
 * the lower position wins), the gaps to the nearest different scores above
 * and below the tie, and how close each tied key is to a head turning on
 * (off[]: a path that computes that head's dot just above 0 moves the key
 * off the tie). */
static double index_margin(const double *score, const double *off, const int32_t *order,
                           int64_t n, int64_t k)
{
    double top = fabs(score[order[0]]) + fabs(score[order[n - 1]]);
    if (!(top > 0))
        return INFINITY;
    double in = score[order[k - 1]], out = score[order[k]];
    if (in != out)
        return (in - out) / top;
    double m = INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double v = score[order[i]];
        if (v == in)
            m = fmin(m, off[order[i]]);
        else
            m = fmin(m, fabs(v - in));
    }
    return m / top;
}

/* ---- one token through one layer --------------------------------------------- */

typedef struct ref_scratch {
    float *xn, *a, *qn, *q, *iq, *kv, *ik, *iw, *qabs, *o, *v, *y, *g, *u, *h, *act;
    double *score, *p;
    double *off; /* [t + 1] per key: the least |w_h d_h| over its heads that ReLU zeroed */
    double margin;  /* this position's least router selection margin so far */
    double imargin; /* and its least indexer selection margin (relative) */
    int32_t *sel, *order;
    int64_t nsel;
    bool prompt;       /* a forward of more than one token (the runtime's prefill chunk) */
} ref_scratch;

/* With mimic, the attention of a prompt row whose context is at most
 * index_topk as the runtime's mla_prefill computes it: keys and values of
 * every token 0..t expanded through kv_b, each rounded to bf16, dense
 * softmax, the output rounded to bf16 into s->v. */
static void attention_expanded(const model_ref *r, const ref_layer *ly, int64_t t, ref_scratch *s)
{
    int64_t L = r->L, R = r->R, D = r->D, VD = r->VD, NH = r->NH;
    for (int64_t h = 0; h < NH; h++) {
        const float *qh = s->q + h * (D + R);
        const float *wkv = ly->kv_b + h * (D + VD) * L;
        double mx = -INFINITY, sum = 0;
        for (int64_t u = 0; u <= t; u++) {
            const float *c = ly->cache + u * (L + R);
            double d = 0;
            for (int64_t i = 0; i < D; i++) {
                double k = 0;
                for (int64_t l = 0; l < L; l++)
                    k += (double)wkv[i * L + l] * c[l];
                d += (double)qh[i] * bf(r, (float)k);
            }
            for (int64_t i = 0; i < R; i++)
                d += (double)qh[D + i] * c[L + i];
            s->p[u] = d * r->sm_scale;
            mx = s->p[u] > mx ? s->p[u] : mx;
        }
        for (int64_t u = 0; u <= t; u++) {
            s->p[u] = exp(s->p[u] - mx);
            sum += s->p[u];
        }
        for (int64_t j = 0; j < VD; j++) {
            double acc = 0;
            for (int64_t u = 0; u <= t; u++) {
                const float *c = ly->cache + u * (L + R);
                double v = 0;
                for (int64_t l = 0; l < L; l++)
                    v += (double)wkv[(D + j) * L + l] * c[l];
                acc += s->p[u] * bf(r, (float)v);
            }
            s->v[h * VD + j] = bf(r, (float)(acc / sum));
        }
    }
}

static void attention(model_ref *r, ref_layer *ly, int64_t t, float *resid, ref_scratch *s)
{
    int64_t H = r->H, L = r->L, R = r->R, D = r->D, NH = r->NH, QL = r->QL, IH = r->IH, ID = r->ID;
    rmsnorm(r, resid, ly->in_norm, H, r->eps, s->xn);
    /* q latent */
    matvec(ly->q_a, s->xn, QL, H, s->a);
    rmsnorm(r, s->a, ly->q_a_norm, QL, 1e-6, s->qn);
    /* kv latent and rope key -> cache row t */
    matvec(ly->kv_a, s->xn, L + R, H, s->kv);
    float *row = ly->cache + t * (L + R);
    rmsnorm(r, s->kv, ly->kv_a_norm, L, 1e-6, row);
    for (int64_t i = 0; i < R; i++)
        row[L + i] = bf(r, s->kv[L + i]);
    rope(r, row + L, R, t);
    for (int64_t i = 0; i < L + R; i++)
        row[i] = store_kv(r, row[i]);
    /* queries */
    matvec(ly->q_b, s->qn, NH * (D + R), QL, s->q);
    for (int64_t h = 0; h < NH; h++) {
        float *qh = s->q + h * (D + R);
        for (int64_t i = 0; i < D + R; i++)
            qh[i] = bf(r, qh[i]);
        rope(r, qh + D, R, t);
        for (int64_t i = D; i < D + R; i++)
            qh[i] = bf(r, qh[i]);
    }
    /* DSA indexer (full layers); shared layers keep the last selection. */
    if (ly->full) {
        matvec(ly->wk, s->xn, ID, H, s->ik);
        double mean = 0, var = 0;
        for (int64_t i = 0; i < ID; i++)
            mean += bf(r, s->ik[i]);
        mean /= (double)ID;
        for (int64_t i = 0; i < ID; i++)
            var += (bf(r, s->ik[i]) - mean) * (bf(r, s->ik[i]) - mean);
        double rstd = 1.0 / sqrt(var / (double)ID + 1e-6);
        float *krow = ly->icache + t * ID;
        for (int64_t i = 0; i < ID; i++)
            krow[i] = (float)((bf(r, s->ik[i]) - mean) * rstd * ly->k_norm_w[i] + ly->k_norm_b[i]);
        rope(r, krow, R, t);
        for (int64_t i = 0; i < ID; i++)
            krow[i] = store_kv(r, krow[i]);
        matvec(ly->wproj, s->xn, IH, H, s->iw);
        matvec(ly->wq_b, s->qn, IH * ID, QL, s->iq);
        for (int64_t h = 0; h < IH; h++) {
            float *qh = s->iq + h * ID;
            for (int64_t i = 0; i < ID; i++)
                qh[i] = bf(r, qh[i]);
            rope(r, qh, R, t);
            for (int64_t i = 0; i < R; i++)
                qh[i] = bf(r, qh[i]);
        }
        for (int64_t u = 0; u <= t; u++) {
            double sc = 0, off = INFINITY;
            for (int64_t h = 0; h < IH; h++) {
                double d = 0;
                for (int64_t i = 0; i < ID; i++)
                    d += (double)s->iq[h * ID + i] * ly->icache[u * ID + i];
                d /= sqrt((double)ID);
                sc += (double)s->iw[h] * (d > 0 ? d : 0);
                if (d <= 0 && fabs(s->iw[h] * d) < off)
                    off = fabs(s->iw[h] * d);
            }
            s->score[u] = sc / sqrt((double)IH);
            s->off[u] = off / sqrt((double)IH);
            s->order[u] = (int32_t)u;
        }
        qsort_r(s->order, (size_t)(t + 1), sizeof(int32_t), by_score, s->score);
        s->nsel = t + 1 < r->TOPK ? t + 1 : r->TOPK;
        if (t + 1 > r->TOPK)
            s->imargin = fmin(s->imargin, index_margin(s->score, s->off, s->order, t + 1, r->TOPK));
        memcpy(s->sel, s->order, sizeof(int32_t) * (size_t)s->nsel);
    }
    /* Absorbed attention in latent space over the selected tokens. */
    double scale = r->sm_scale; /* (D + R)^-0.5, YaRN-corrected */
    bool expanded = r->o.mimic && s->prompt && t < r->TOPK;
    if (expanded)
        attention_expanded(r, ly, t, s);
    for (int64_t h = 0; !expanded && h < NH; h++) {
        const float *qh = s->q + h * (D + R);
        for (int64_t l = 0; l < L; l++) {
            double acc = 0;
            for (int64_t d = 0; d < D; d++)
                acc += (double)qh[d] * ly->kv_b[(h * (D + r->VD) + d) * L + l];
            s->qabs[l] = bf(r, (float)acc);
        }
        for (int64_t i = 0; i < R; i++)
            s->qabs[L + i] = qh[D + i];
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < s->nsel; j++) {
            const float *c = ly->cache + s->sel[j] * (L + R);
            double d = 0;
            for (int64_t i = 0; i < L + R; i++)
                d += (double)s->qabs[i] * c[i];
            s->p[j] = d * scale;
            mx = s->p[j] > mx ? s->p[j] : mx;
        }
        for (int64_t j = 0; j < s->nsel; j++) {
            s->p[j] = exp(s->p[j] - mx);
            sum += s->p[j];
        }
        for (int64_t l = 0; l < L; l++) {
            double acc = 0;
            for (int64_t j = 0; j < s->nsel; j++)
                acc += s->p[j] * ly->cache[s->sel[j] * (L + R) + l];
            s->o[l] = bf(r, (float)(acc / sum));
        }
        for (int64_t j = 0; j < r->VD; j++) {
            double acc = 0;
            const float *wv = ly->kv_b + (h * (D + r->VD) + D + j) * L;
            for (int64_t l = 0; l < L; l++)
                acc += (double)s->o[l] * wv[l];
            s->v[h * r->VD + j] = bf(r, (float)acc);
        }
    }
    matvec(ly->o, s->v, H, NH * r->VD, s->y);
    for (int64_t i = 0; i < H; i++)
        resid[i] += s->y[i];
}

/* Activation quantization of the expert GEMM inputs. */
enum { ACT_FLOAT, ACT_MXFP4, ACT_INT8 };

/* v rounded through int8 per 32-block with the scale amax/127 (a8w4). */
static void int8_roundtrip_row(float *v, int64_t n)
{
    for (int64_t b = 0; b < n; b += 32) {
        int64_t e = b + 32 < n ? b + 32 : n;
        float amax = 0;
        for (int64_t i = b; i < e; i++)
            amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        float to_q = amax > 0 ? 127.0f / amax : 0, scale = amax / 127.0f;
        for (int64_t i = b; i < e; i++) {
            float q = rintf(v[i] * to_q);
            v[i] = (q > 127 ? 127 : q < -127 ? -127 : q) * scale;
        }
    }
}

static void quantize_act(int aq, float *v, int64_t n)
{
    if (aq == ACT_MXFP4)
        mxfp4_roundtrip_row(v, n, v);
    else if (aq == ACT_INT8)
        int8_roundtrip_row(v, n);
}

/* y += weight * down(silu(gate x) * up(x)); aq: the inputs' quantization. */
static void expert(model_ref *r, const float *wg, const float *wu, const float *wd, int64_t inter,
                   const float *x, int aq, bool h_bf16, double weight, ref_scratch *s, double *y)
{
    int64_t H = r->H;
    memcpy(s->act, x, sizeof(float) * (size_t)H);
    quantize_act(aq, s->act, H);
    matvec(wg, s->act, inter, H, s->g);
    matvec(wu, s->act, inter, H, s->u);
    for (int64_t i = 0; i < inter; i++) {
        s->h[i] = silu(s->g[i]) * s->u[i];
        if (h_bf16)
            s->h[i] = bf(r, s->h[i]);
    }
    quantize_act(aq, s->h, inter);
    matvec(wd, s->h, H, inter, s->y);
    for (int64_t i = 0; i < H; i++)
        y[i] += weight * s->y[i];
}

static void mlp(model_ref *r, ref_layer *ly, float *resid, ref_scratch *s, double *y)
{
    int64_t H = r->H;
    rmsnorm(r, resid, ly->post_norm, H, r->eps, s->xn);
    memset(y, 0, sizeof(double) * (size_t)H);
    if (!ly->moe) {
        expert(r, ly->gate_proj, ly->up_proj, ly->down_proj, ly->inter, s->xn, ACT_FLOAT, true,
               1.0, s, y);
    } else {
        int64_t E = r->E, K = r->TOPKE;
        int aq = r->o.act_mxfp4 ? ACT_MXFP4 : r->o.act_int8 ? ACT_INT8 : ACT_FLOAT;
        double *score = s->score, *choice = s->p;
        for (int64_t e = 0; e < E; e++) {
            double acc = 0;
            for (int64_t i = 0; i < H; i++)
                acc += (double)s->xn[i] * ly->router[e * H + i];
            score[e] = 1.0 / (1.0 + exp(-acc));
            choice[e] = score[e] + ly->bias[e];
        }
        /* Group-limited selection is a no-op for n_group 1 (GLM-5). */
        int32_t ids[64];
        bool taken[1024] = {0};
        double wsum = 0;
        for (int64_t k = 0; k < K; k++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || choice[e] > choice[best]))
                    best = e;
            taken[best] = true;
            ids[k] = (int32_t)best;
            wsum += score[best];
        }
        for (int64_t e = 0; e < E; e++)
            if (!taken[e] && choice[ids[K - 1]] - choice[e] < s->margin)
                s->margin = choice[ids[K - 1]] - choice[e];
        double rsf = r->c->routed_scaling_factor;
        for (int64_t k = 0; k < K; k++) {
            double wk = r->c->norm_topk_prob ? score[ids[k]] / (wsum + 1e-20) * rsf
                                             : score[ids[k]] * rsf;
            expert(r, ly->eg[ids[k]], ly->eu[ids[k]], ly->ed[ids[k]], r->IE, s->xn, aq, true,
                   wk, s, y);
        }
        if (ly->sh_inter)
            expert(r, ly->sg, ly->su, ly->sd, ly->sh_inter, s->xn,
                   ly->sh_mxfp4 ? aq : ACT_FLOAT, true, 1.0, s, y);
    }
    for (int64_t i = 0; i < H; i++)
        resid[i] += (float)y[i];
}

mt_status model_ref_forward(model_ref *r, const int32_t *tokens, int64_t n, float *logits,
                            mt_err *err)
{
    if (n < 0 || n > r->cap)
        return mt_fail(err, MT_E_INVALID, "reference: %" PRId64 " tokens (context %" PRId64 ")",
                       n, r->cap);
    for (int64_t t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= r->V)
            return mt_fail(err, MT_E_INVALID, "reference: token %" PRId64 " is id %" PRId32
                           ", outside [0, %" PRId64 ")", t, tokens[t], r->V);
    if (r->E > 1024 || r->TOPKE > 64)
        return mt_fail(err, MT_E_UNSUPPORTED, "reference: more than 1024 experts or top-64");
    int64_t H = r->H, big = H;
    int64_t dims[] = {r->QL, r->L + r->R, r->NH * (r->D + r->R), r->IH * r->ID, r->NH * r->VD,
                      r->L + r->R, r->c->intermediate_size, r->IE,
                      r->IE * (r->c->n_shared_experts ? r->c->n_shared_experts : 1), n, r->E};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        big = dims[i] > big ? dims[i] : big;
    ref_scratch s = {.prompt = n > 1};
    float **f[] = {&s.xn, &s.a, &s.qn, &s.q, &s.iq, &s.kv, &s.ik, &s.iw, &s.qabs, &s.o, &s.v,
                   &s.y, &s.g, &s.u, &s.h, &s.act};
    bool ok = true;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        ok = ok && (*f[i] = malloc(sizeof(float) * (size_t)big));
    s.score = malloc(sizeof(double) * (size_t)big);
    s.off = malloc(sizeof(double) * (size_t)big);
    s.p = malloc(sizeof(double) * (size_t)big);
    s.sel = malloc(sizeof(int32_t) * (size_t)big);
    s.order = malloc(sizeof(int32_t) * (size_t)big);
    float *resid = malloc(sizeof(float) * (size_t)H);
    double *y = malloc(sizeof(double) * (size_t)H);
    double *margin = realloc(r->margin, sizeof(double) * (size_t)(n ? n : 1));
    if (margin)
        r->margin = margin;
    double *imargin = realloc(r->imargin, sizeof(double) * (size_t)(n ? n : 1));
    if (imargin)
        r->imargin = imargin;
    r->n_margin = 0;
    mt_status st = MT_OK;
    if (!ok || !s.score || !s.off || !s.p || !s.sel || !s.order || !resid || !y || !margin || !imargin)
        st = mt_fail(err, MT_E_NOMEM, "reference: scratch");
    for (int64_t t = 0; st == MT_OK && t < n; t++) {
        memcpy(resid, r->embed + (int64_t)tokens[t] * H, sizeof(float) * (size_t)H);
        s.margin = INFINITY;
        s.imargin = INFINITY;
        for (int64_t l = 0; l < r->n_layers; l++) {
            attention(r, &r->layers[l], t, resid, &s);
            mlp(r, &r->layers[l], resid, &s, y);
        }
        r->margin[t] = s.margin;
        r->imargin[t] = s.imargin;
        r->n_margin = t + 1;
        rmsnorm(r, resid, r->norm, H, r->eps, s.xn);
        matvec(r->lm_head, s.xn, r->V, H, logits + t * r->V);
    }
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        free(*f[i]);
    free(s.score);
    free(s.off);
    free(s.p);
    free(s.sel);
    free(s.order);
    free(resid);
    free(y);
    return st;
}

double model_ref_router_margin(const model_ref *r, int64_t t)
{
    return t >= 0 && t < r->n_margin ? r->margin[t] : INFINITY;
}

double model_ref_index_margin(const model_ref *r, int64_t t)
{
    return t >= 0 && t < r->n_margin ? r->imargin[t] : INFINITY;
}
