/* weights.c: opening a checkpoint folder and validating every tensor the
 * GLM-5 architecture needs against config.json (see weights.h). */
#include "weights.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

struct model_weights {
    model_config *cfg;
    model_st_set *files;
    model_linear *linears; /* sorted by name once open succeeds */
    size_t linear_count, linear_cap;
    char **warnings;
    size_t warning_count, warning_cap;
    bool *used;            /* per model_st_set_at index */
    bool *indexer_full;    /* [layer_count] */
};

void model_weights_close(model_weights *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->linear_count; i++)
        free((char *)w->linears[i].name);
    free(w->linears);
    for (size_t i = 0; i < w->warning_count; i++)
        free(w->warnings[i]);
    free(w->warnings);
    free(w->used);
    free(w->indexer_full);
    model_st_set_close(w->files);
    model_config_destroy(w->cfg);
    free(w);
}

static mt_status add_warning(model_weights *w, const char *text, mt_err *err)
{
    if (w->warning_count == w->warning_cap) {
        size_t cap = w->warning_cap ? 2 * w->warning_cap : 16;
        char **p = realloc(w->warnings, cap * sizeof *p);
        if (!p)
            return mt_fail(err, MT_E_NOMEM, "out of memory");
        w->warnings = p;
        w->warning_cap = cap;
    }
    if (!(w->warnings[w->warning_count] = strdup(text)))
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    w->warning_count++;
    return MT_OK;
}

static void mark_used(model_weights *w, const model_tensor_info *t)
{
    /* Tensors are sorted by name in the set; find t's index. */
    size_t lo = 0, hi = model_st_set_count(w->files);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(model_st_set_at(w->files, mid)->name, t->name);
        if (c == 0) {
            w->used[mid] = true;
            return;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
}

const model_tensor_info *model_weights_find(const model_weights *w, const char *name)
{
    return model_st_set_find(w->files, name);
}

static void shape_text(int ndim, const int64_t *shape, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++) {
        if (shape[i] < 0)
            n += (size_t)snprintf(buf + n, cap - n, "%s*", i ? ", " : "");
        else
            n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

static void mask_text(uint32_t mask, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    for (int d = 0; d < MODEL_DTYPE_COUNT && n < cap; d++)
        if (mask & MODEL_DTYPE_BIT(d))
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? " or " : "",
                                  model_dtype_name((model_dtype)d));
}

mt_status model_weights_tensor(const model_weights *w, const char *name, uint32_t dtype_mask,
                               int ndim, const int64_t *shape, const model_tensor_info **out,
                               mt_err *err)
{
    *out = NULL;
    const model_tensor_info *t = model_st_set_find(w->files, name);
    if (!t)
        return mt_fail(err, MT_E_NOT_FOUND, "tensor '%s' is missing from the checkpoint", name);
    bool ok = (!dtype_mask || (dtype_mask & MODEL_DTYPE_BIT(t->dtype))) && t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = shape[i] < 0 || shape[i] == t->shape[i];
    if (!ok) {
        char have[128], want_s[128], want_t[64] = "any dtype";
        shape_text(ndim, shape, want_s, sizeof want_s);
        if (dtype_mask)
            mask_text(dtype_mask, want_t, sizeof want_t);
        return mt_fail(err, MT_E_FORMAT, "tensor '%s' (%s at byte %" PRIu64 ") is %s, expected "
                       "%s %s", name, t->file, t->offset, model_tensor_describe(t, have, sizeof have),
                       want_t, want_s);
    }
    *out = t;
    return MT_OK;
}

/* ---- validation at open ---------------------------------------------------- */

typedef struct vctx {
    model_weights *w;
    mt_err *err;
    char warn[1024];
} vctx;

static mt_status need(vctx *v, uint32_t mask, int ndim, const int64_t *shape,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static mt_status need(vctx *v, uint32_t mask, int ndim, const int64_t *shape, const char *fmt, ...)
{
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const model_tensor_info *t;
    mt_status st = model_weights_tensor(v->w, name, mask, ndim, shape, &t, v->err);
    if (st == MT_OK)
        mark_used(v->w, t);
    return st;
}

static mt_status vec(vctx *v, int64_t n, const char *fmt, const char *prefix)
{
    return need(v, MODEL_DTYPES_FLOAT, 1, &n, fmt, prefix);
}

static mt_status add_linear(vctx *v, const char *module, int64_t out, int64_t in)
{
    model_weights *w = v->w;
    char name[512];
    snprintf(name, sizeof name, "%s.weight", module);
    const model_tensor_info *weight = model_st_set_find(w->files, name);
    if (!weight)
        return mt_fail(v->err, MT_E_NOT_FOUND, "tensor '%s' is missing from the checkpoint "
                       "(linear %s, [out %" PRId64 ", in %" PRId64 "])", name, module, out, in);
    snprintf(name, sizeof name, "%s.weight_scale_inv", module);
    const model_tensor_info *inv = model_st_set_find(w->files, name);
    if (inv)
        return mt_fail(v->err, MT_E_UNSUPPORTED, "%s: '%s' (%s at byte %" PRIu64 ") is a "
                       "block-scaled fp8 checkpoint; this loader reads bf16 and Quark MXFP4/fp8 "
                       "weights", module, name, inv->file, inv->offset);
    snprintf(name, sizeof name, "%s.weight_scale", module);
    const model_tensor_info *scale = model_st_set_find(w->files, name);
    if (w->linear_count == w->linear_cap) {
        size_t cap = w->linear_cap ? 2 * w->linear_cap : 256;
        model_linear *p = realloc(w->linears, cap * sizeof *p);
        if (!p)
            return mt_fail(v->err, MT_E_NOMEM, "out of memory");
        w->linears = p;
        w->linear_cap = cap;
    }
    model_linear *lin = &w->linears[w->linear_count];
    char *own = strdup(module);
    if (!own)
        return mt_fail(v->err, MT_E_NOMEM, "out of memory");
    mt_status st = model_quark_resolve(w->cfg->quark, own, weight, scale, out, in, lin, v->warn,
                                       sizeof v->warn, v->err);
    if (st != MT_OK) {
        free(own);
        return st;
    }
    w->linear_count++;
    mark_used(w, weight);
    if (scale)
        mark_used(w, scale);
    return v->warn[0] ? add_warning(w, v->warn, v->err) : MT_OK;
}

static mt_status linear(vctx *v, int64_t out, int64_t in, const char *prefix, const char *suffix)
{
    char module[512];
    snprintf(module, sizeof module, "%s%s", prefix, suffix);
    return add_linear(v, module, out, in);
}

static mt_status mlp(vctx *v, const char *prefix, int64_t inter)
{
    const model_config *c = v->w->cfg;
    mt_status st;
    if ((st = linear(v, inter, c->hidden_size, prefix, "gate_proj")) != MT_OK ||
        (st = linear(v, inter, c->hidden_size, prefix, "up_proj")) != MT_OK)
        return st;
    return linear(v, c->hidden_size, inter, prefix, "down_proj");
}

static bool has_prefix_tensor(const model_weights *w, const char *prefix)
{
    size_t lo = 0, hi = model_st_set_count(w->files), n = strlen(prefix);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (strcmp(model_st_set_at(w->files, mid)->name, prefix) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < model_st_set_count(w->files) &&
           !strncmp(model_st_set_at(w->files, lo)->name, prefix, n);
}

static mt_status layer(vctx *v, int64_t i)
{
    model_weights *w = v->w;
    const model_config *c = w->cfg;
    int64_t H = c->hidden_size, heads = c->num_attention_heads;
    int64_t qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    char p[64], a[96], q[160];
    snprintf(p, sizeof p, "model.layers.%" PRId64 ".", i);
    snprintf(a, sizeof a, "%sself_attn.", p);
    MT_CHECK(vec(v, H, "%sinput_layernorm.weight", p));
    MT_CHECK(vec(v, H, "%spost_attention_layernorm.weight", p));
    if (c->q_lora_rank) {
        MT_CHECK(linear(v, c->q_lora_rank, H, a, "q_a_proj"));
        MT_CHECK(vec(v, c->q_lora_rank, "%sq_a_layernorm.weight", a));
        MT_CHECK(linear(v, heads * qk, c->q_lora_rank, a, "q_b_proj"));
    } else {
        MT_CHECK(linear(v, heads * qk, H, a, "q_proj"));
    }
    MT_CHECK(linear(v, c->kv_lora_rank + c->qk_rope_head_dim, H, a, "kv_a_proj_with_mqa"));
    MT_CHECK(vec(v, c->kv_lora_rank, "%skv_a_layernorm.weight", a));
    MT_CHECK(linear(v, heads * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank, a,
                    "kv_b_proj"));
    MT_CHECK(linear(v, H, heads * c->v_head_dim, a, "o_proj"));

    /* DSA indexer: main layers follow config.json; MTP layers follow the file. */
    snprintf(q, sizeof q, "%sindexer.", a);
    bool full = c->layer_indexer_full[i];
    if (model_config_layer_is_mtp(c, i) && !has_prefix_tensor(w, q) &&
        c->index_share_for_mtp_iteration)
        full = false;
    w->indexer_full[i] = full;
    if (full) {
        int64_t ih = c->index_n_heads, id = c->index_head_dim;
        MT_CHECK(linear(v, ih * id, c->q_lora_rank ? c->q_lora_rank : H, q, "wq_b"));
        MT_CHECK(linear(v, id, H, q, "wk"));
        MT_CHECK(vec(v, id, "%sk_norm.weight", q));
        MT_CHECK(vec(v, id, "%sk_norm.bias", q));
        MT_CHECK(linear(v, ih, H, q, "weights_proj"));
    }

    snprintf(q, sizeof q, "%smlp.", p);
    if (!c->layer_moe[i])
        return mlp(v, q, c->intermediate_size);
    int64_t E = c->n_routed_experts;
    int64_t gshape[2] = {E, H};
    MT_CHECK(need(v, MODEL_DTYPES_FLOAT, 2, gshape, "%sgate.weight", q));
    MT_CHECK(need(v, MODEL_DTYPE_BIT(MODEL_DTYPE_F32) | MODEL_DTYPE_BIT(MODEL_DTYPE_BF16), 1, &E,
                  "%sgate.e_score_correction_bias", q));
    for (int64_t e = 0; e < E; e++) {
        char ep[256];
        snprintf(ep, sizeof ep, "%sexperts.%" PRId64 ".", q, e);
        MT_CHECK(mlp(v, ep, c->moe_intermediate_size));
    }
    if (c->n_shared_experts) {
        char sp[256];
        snprintf(sp, sizeof sp, "%sshared_experts.", q);
        MT_CHECK(mlp(v, sp, c->moe_intermediate_size * c->n_shared_experts));
    }
    if (!model_config_layer_is_mtp(c, i))
        return MT_OK;

    /* MTP head: the embedding and previous hidden state are normed, joined
     * and projected back to H; shared_head.head and embed_tokens are
     * optional (GLM-5 shares the main model's). */
    MT_CHECK(vec(v, H, "%senorm.weight", p));
    MT_CHECK(vec(v, H, "%shnorm.weight", p));
    MT_CHECK(linear(v, H, 2 * H, p, "eh_proj"));
    MT_CHECK(vec(v, H, "%sshared_head.norm.weight", p));
    snprintf(q, sizeof q, "%sshared_head.head.weight", p);
    if (model_st_set_find(w->files, q))
        MT_CHECK(linear(v, c->vocab_size, H, p, "shared_head.head"));
    snprintf(q, sizeof q, "%sembed_tokens.weight", p);
    int64_t eshape[2] = {c->vocab_size, H};
    if (model_st_set_find(w->files, q))
        MT_CHECK(need(v, MODEL_DTYPES_FLOAT, 2, eshape, "%s", q));
    return MT_OK;
}

static int linear_by_name(const void *a, const void *b)
{
    return strcmp(((const model_linear *)a)->name, ((const model_linear *)b)->name);
}

static mt_status validate(vctx *v)
{
    model_weights *w = v->w;
    const model_config *c = w->cfg;
    int64_t emb[2] = {c->vocab_size, c->hidden_size};
    mt_status st = need(v, MODEL_DTYPES_FLOAT, 2, emb, "model.embed_tokens.weight");
    if (st == MT_OK)
        st = vec(v, c->hidden_size, "%s", "model.norm.weight");
    if (st == MT_OK && (!c->tie_word_embeddings || model_st_set_find(w->files, "lm_head.weight")))
        st = add_linear(v, "lm_head", c->vocab_size, c->hidden_size);
    for (int64_t i = 0; i < c->layer_count && st == MT_OK; i++)
        if ((st = layer(v, i)) != MT_OK)
            mt_err_prefix(v->err, "layer %" PRId64 "%s", i,
                          model_config_layer_is_mtp(c, i) ? " (MTP)" : "");
    if (st != MT_OK)
        return st;
    qsort(w->linears, w->linear_count, sizeof *w->linears, linear_by_name);
    for (size_t i = 0; i < model_st_set_count(w->files) && st == MT_OK; i++)
        if (!w->used[i]) {
            const model_tensor_info *t = model_st_set_at(w->files, i);
            char d[128];
            snprintf(v->warn, sizeof v->warn, "tensor '%s' (%s in %s at byte %" PRIu64 ") is not "
                     "used by the architecture config.json describes", t->name,
                     model_tensor_describe(t, d, sizeof d), t->file, t->offset);
            st = add_warning(w, v->warn, v->err);
        }
    return st;
}

mt_status model_weights_open(const char *dir, model_weights **out, mt_err *err)
{
    *out = NULL;
    model_weights *w = calloc(1, sizeof *w);
    if (!w)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    size_t n = strlen(dir) + 16;
    char *cfg_path = malloc(n);
    mt_status st = cfg_path ? MT_OK : mt_fail(err, MT_E_NOMEM, "out of memory");
    if (st == MT_OK) {
        snprintf(cfg_path, n, "%s/config.json", dir);
        st = model_config_load(cfg_path, &w->cfg, err);
    }
    free(cfg_path);
    if (st == MT_OK)
        st = model_st_set_open(dir, &w->files, err);
    if (st == MT_OK) {
        w->used = calloc(model_st_set_count(w->files) + 1, sizeof *w->used);
        w->indexer_full = calloc((size_t)w->cfg->layer_count, sizeof *w->indexer_full);
        if (!w->used || !w->indexer_full)
            st = mt_fail(err, MT_E_NOMEM, "out of memory");
    }
    if (st == MT_OK) {
        vctx v = {.w = w, .err = err};
        st = validate(&v);
    }
    if (st != MT_OK) {
        model_weights_close(w);
        return st;
    }
    *out = w;
    return MT_OK;
}

const model_config *model_weights_config(const model_weights *w) { return w->cfg; }
const model_st_set *model_weights_files(const model_weights *w) { return w->files; }

mt_status model_weights_linear(const model_weights *w, const char *module,
                               const model_linear **out, mt_err *err)
{
    model_linear key = {.name = module};
    *out = bsearch(&key, w->linears, w->linear_count, sizeof key, linear_by_name);
    return *out ? MT_OK
                : mt_fail(err, MT_E_NOT_FOUND, "no linear '%s' in this checkpoint", module);
}

size_t model_weights_linear_count(const model_weights *w) { return w->linear_count; }

const model_linear *model_weights_linear_at(const model_weights *w, size_t i)
{
    return i < w->linear_count ? &w->linears[i] : NULL;
}

bool model_weights_layer_indexer_full(const model_weights *w, int64_t layer)
{
    return layer >= 0 && layer < w->cfg->layer_count && w->indexer_full[layer];
}

size_t model_weights_warning_count(const model_weights *w) { return w->warning_count; }

const char *model_weights_warning(const model_weights *w, size_t i)
{
    return i < w->warning_count ? w->warnings[i] : NULL;
}

void model_weights_print_summary(const model_weights *w, FILE *f)
{
    size_t count[MODEL_WFMT_COUNT] = {0};
    uint64_t bytes[MODEL_WFMT_COUNT] = {0};
    for (size_t i = 0; i < w->linear_count; i++) {
        const model_linear *l = &w->linears[i];
        count[l->fmt]++;
        bytes[l->fmt] += l->weight->nbytes + (l->scale ? l->scale->nbytes : 0);
    }
    fprintf(f, "%zu tensors in %zu files, %" PRIu64 " bytes; %zu linears\n",
            model_st_set_count(w->files), model_st_set_shard_count(w->files),
            model_st_set_total_bytes(w->files), w->linear_count);
    for (int k = 0; k < MODEL_WFMT_COUNT; k++)
        if (count[k])
            fprintf(f, "  %-9s %6zu linears, %" PRIu64 " bytes\n", model_wfmt_name((model_wfmt)k),
                    count[k], bytes[k]);
    for (size_t i = 0; i < w->warning_count; i++)
        fprintf(f, "warning: %s\n", w->warnings[i]);
}
