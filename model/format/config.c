/* config.c: parsing and checking config.json for GlmMoeDsaForCausalLM, and
 * the per-layer MLP and DSA indexer schedules (see config.h). */
#include "config.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/files.h"

#define JSON_INT_MAX 9007199254740992.0
#define DIM_MAX ((int64_t)1 << 31)

typedef struct ctx {
    const cJSON *root;
    const char *label;
    mt_err *err;
} ctx;

static const cJSON *item(const ctx *c, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(c->root, key);
}

static bool absent(const cJSON *j) { return !j || cJSON_IsNull(j); }

static mt_status get_int(const ctx *c, const char *key, bool required, int64_t def, int64_t lo,
                         int64_t hi, int64_t *out)
{
    const cJSON *j = item(c, key);
    if (absent(j)) {
        if (required)
            return mt_fail(c->err, MT_E_FORMAT, "%s: missing required key \"%s\"", c->label, key);
        *out = def;
        return MT_OK;
    }
    double d = j->valuedouble;
    if (!cJSON_IsNumber(j) || !(fabs(d) <= JSON_INT_MAX) || d != floor(d))
        return mt_fail(c->err, MT_E_FORMAT, "%s: \"%s\" must be an integer", c->label, key);
    if (d < (double)lo || d > (double)hi)
        return mt_fail(c->err, MT_E_FORMAT, "%s: \"%s\" is %.0f, must be in [%" PRId64 ", %" PRId64
                       "]", c->label, key, d, lo, hi);
    *out = (int64_t)d;
    return MT_OK;
}

static mt_status get_num(const ctx *c, const char *key, bool required, double def, double lo,
                         double hi, double *out)
{
    const cJSON *j = item(c, key);
    if (absent(j)) {
        if (required)
            return mt_fail(c->err, MT_E_FORMAT, "%s: missing required key \"%s\"", c->label, key);
        *out = def;
        return MT_OK;
    }
    if (!cJSON_IsNumber(j))
        return mt_fail(c->err, MT_E_FORMAT, "%s: \"%s\" must be a number", c->label, key);
    if (!(j->valuedouble >= lo && j->valuedouble <= hi))
        return mt_fail(c->err, MT_E_FORMAT, "%s: \"%s\" is %g, must be in [%g, %g]", c->label,
                       key, j->valuedouble, lo, hi);
    *out = j->valuedouble;
    return MT_OK;
}

static mt_status get_bool(const ctx *c, const char *key, bool required, bool def, bool *out)
{
    const cJSON *j = item(c, key);
    if (absent(j)) {
        if (required)
            return mt_fail(c->err, MT_E_FORMAT, "%s: missing required key \"%s\"", c->label, key);
        *out = def;
        return MT_OK;
    }
    if (!cJSON_IsBool(j))
        return mt_fail(c->err, MT_E_FORMAT, "%s: \"%s\" must be true or false", c->label, key);
    *out = cJSON_IsTrue(j);
    return MT_OK;
}

static mt_status get_str(const ctx *c, const char *key, const char *def, char *out, size_t cap)
{
    const cJSON *j = item(c, key);
    if (absent(j)) {
        snprintf(out, cap, "%s", def);
        return MT_OK;
    }
    if (!cJSON_IsString(j))
        return mt_fail(c->err, MT_E_FORMAT, "%s: \"%s\" must be a string", c->label, key);
    if (strlen(j->valuestring) >= cap)
        return mt_fail(c->err, MT_E_FORMAT, "%s: \"%s\" is too long (%zu characters)", c->label,
                       key, strlen(j->valuestring));
    snprintf(out, cap, "%s", j->valuestring);
    return MT_OK;
}

bool model_config_indexer_rule(int64_t layer, int64_t freq, int64_t offset)
{
    int64_t k = layer - offset + 1;
    return (k > 0 ? k : 0) % freq == 0;
}

void model_config_destroy(model_config *c)
{
    if (!c)
        return;
    free(c->layer_moe);
    free(c->layer_indexer_full);
    model_quark_destroy(c->quark);
    free(c);
}

/* ---- RoPE -------------------------------------------------------------------- */

/* A number member `key` of the rope object (its name in messages is
 * obj.key). Absent or null leaves *out alone and sets *given false. */
static mt_status rope_num(const ctx *x, const cJSON *obj, const char *obj_name, const char *key,
                          double *out, bool *given)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    *given = !absent(j);
    if (!*given)
        return MT_OK;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"%s.%s\" must be a number", x->label, obj_name,
                       key);
    *out = j->valuedouble;
    return MT_OK;
}

/* transformers' get_mscale (yarn_get_mscale in DeepSeek-V3). */
static double yarn_mscale(double scale, double m)
{
    return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

static mt_status parse_yarn(const ctx *x, const cJSON *rope, const char *rn, model_config *c)
{
    model_rope_yarn *y = &c->yarn;
    bool given;
    /* original_max_position_embeddings: transformers 5's standardization
     * lets a top-level key win, then the rope object's, else
     * max_position_embeddings. */
    const cJSON *top = item(x, "original_max_position_embeddings");
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(rope, "original_max_position_embeddings");
    const cJSON *o = !absent(top) ? top : in;
    char oname[64];
    snprintf(oname, sizeof oname, "%s%s", !absent(top) ? "" : rn, !absent(top) ? "" : ".");
    y->original_max_position_embeddings = c->max_position_embeddings;
    if (!absent(o)) {
        double d = o->valuedouble;
        if (!cJSON_IsNumber(o) || d != floor(d) || !(d >= 1 && d <= (double)DIM_MAX))
            return mt_fail(x->err, MT_E_FORMAT, "%s: \"%soriginal_max_position_embeddings\" "
                           "must be a positive integer", x->label, oname);
        y->original_max_position_embeddings = (int64_t)d;
    }
    /* factor: a required key (transformers' yarn validation); null means
     * the ratio of the two context lengths. */
    if (!cJSON_GetObjectItemCaseSensitive(rope, "factor"))
        return mt_fail(x->err, MT_E_FORMAT, "%s: missing required key \"%s.factor\" (rope type "
                       "\"yarn\")", x->label, rn);
    MT_CHECK(rope_num(x, rope, rn, "factor", &y->factor, &given));
    if (!given)
        y->factor = (double)c->max_position_embeddings /
                    (double)y->original_max_position_embeddings;
    else if (!(y->factor > 0))
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"%s.factor\" is %g, must be positive", x->label,
                       rn, y->factor);
    /* beta_fast / beta_slow: `value or default`, so 0 and null mean the
     * default too. Negative values would take the log of a negative. */
    y->beta_fast = 0;
    y->beta_slow = 0;
    MT_CHECK(rope_num(x, rope, rn, "beta_fast", &y->beta_fast, &given));
    if (y->beta_fast < 0)
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"%s.beta_fast\" is %g, must not be negative",
                       x->label, rn, y->beta_fast);
    MT_CHECK(rope_num(x, rope, rn, "beta_slow", &y->beta_slow, &given));
    if (y->beta_slow < 0)
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"%s.beta_slow\" is %g, must not be negative",
                       x->label, rn, y->beta_slow);
    if (y->beta_fast == 0)
        y->beta_fast = 32;
    if (y->beta_slow == 0)
        y->beta_slow = 1;
    y->mscale = 0;
    y->mscale_all_dim = 0;
    MT_CHECK(rope_num(x, rope, rn, "mscale", &y->mscale, &given));
    MT_CHECK(rope_num(x, rope, rn, "mscale_all_dim", &y->mscale_all_dim, &given));
    MT_CHECK(rope_num(x, rope, rn, "attention_factor", &y->attention_factor, &given));
    if (given && !(y->attention_factor > 0))
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"%s.attention_factor\" is %g, must be "
                       "positive", x->label, rn, y->attention_factor);
    if (!given)
        y->attention_factor = y->mscale != 0 && y->mscale_all_dim != 0
                                  ? yarn_mscale(y->factor, y->mscale) /
                                        yarn_mscale(y->factor, y->mscale_all_dim)
                                  : yarn_mscale(y->factor, 1.0);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rope, "truncate");
    if (!absent(t) && !cJSON_IsBool(t))
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"%s.truncate\" must be true or false", x->label,
                       rn);
    y->truncate = absent(t) || cJSON_IsTrue(t);
    /* DeepSeek-V3's attention: scaling *= mscale^2 when mscale_all_dim is
     * non-zero, with mscale = get_mscale(factor, mscale_all_dim). */
    double m = y->mscale_all_dim != 0 ? yarn_mscale(y->factor, y->mscale_all_dim) : 1.0;
    y->softmax_mult = m * m;
    return MT_OK;
}

/* transformers 5 writes rope_parameters, 4.x rope_theta + rope_scaling;
 * transformers 5 reads a non-empty rope_scaling in preference to
 * rope_parameters (convert_rope_params_to_dict), so this does too. */
static mt_status parse_rope(const ctx *x, model_config *c)
{
    const cJSON *rp = item(x, "rope_parameters"), *rs = item(x, "rope_scaling");
    if (!absent(rp) && !cJSON_IsObject(rp))
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"rope_parameters\" must be an object",
                       x->label);
    if (!absent(rs) && !cJSON_IsObject(rs))
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"rope_scaling\" must be an object or null",
                       x->label);
    const cJSON *rope = cJSON_IsObject(rs) && rs->child ? rs : cJSON_IsObject(rp) ? rp : NULL;
    const char *rn = rope == rs ? "rope_scaling" : "rope_parameters";
    const cJSON *theta = rope ? cJSON_GetObjectItemCaseSensitive(rope, "rope_theta") : NULL;
    if (absent(theta))
        theta = item(x, "rope_theta");
    if (absent(theta))
        return mt_fail(x->err, MT_E_FORMAT, "%s: missing required key \"%s.rope_theta\" (or "
                       "\"rope_theta\")", x->label, rope ? rn : "rope_parameters");
    if (!cJSON_IsNumber(theta) || !(theta->valuedouble > 0) || !isfinite(theta->valuedouble))
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"rope_theta\" must be a positive number",
                       x->label);
    c->rope_theta = theta->valuedouble;
    snprintf(c->rope_type, sizeof c->rope_type, "default");
    c->rope_kind = MODEL_ROPE_DEFAULT;
    if (!rope)
        return MT_OK;

    const char *tkey = "rope_type";
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rope, tkey);
    if (absent(t)) {
        tkey = "type";
        t = cJSON_GetObjectItemCaseSensitive(rope, tkey);
    }
    if (!absent(t)) {
        if (!cJSON_IsString(t))
            return mt_fail(x->err, MT_E_FORMAT, "%s: \"%s.%s\" must be a string", x->label, rn,
                           tkey);
        if (!strcmp(t->valuestring, "yarn"))
            c->rope_kind = MODEL_ROPE_YARN;
        else if (strcmp(t->valuestring, "default"))
            return mt_fail(x->err, MT_E_UNSUPPORTED, "%s: \"%s.%s\" is \"%.40s\"; this runtime "
                           "applies RoPE types \"default\" and \"yarn\" only", x->label, rn, tkey,
                           t->valuestring);
        snprintf(c->rope_type, sizeof c->rope_type, "%s", t->valuestring);
    }
    /* partial_rotary_factor would shrink the rotated dims below
     * qk_rope_head_dim: nothing in this family uses it. */
    double prf = 1;
    bool given;
    MT_CHECK(rope_num(x, rope, rn, "partial_rotary_factor", &prf, &given));
    if (prf != 1)
        return mt_fail(x->err, MT_E_UNSUPPORTED, "%s: \"%s.partial_rotary_factor\" is %g; this "
                       "runtime rotates all qk_rope_head_dim dims (1.0)", x->label, rn, prf);
    return c->rope_kind == MODEL_ROPE_YARN ? parse_yarn(x, rope, rn, c) : MT_OK;
}

/* transformers' find_correction_dim: the dim whose wavelength fits n
 * rotations into the original context (2 pi as Python's 2 * math.pi). */
static double correction_dim(double n, int dim, double base, double orig)
{
    return (double)dim * log(orig / (n * 6.283185307179586)) / (2.0 * log(base));
}

/* The YaRN ramp's ends [lo, hi] in units of frequency index. */
static void yarn_range(const model_config *c, double *lo, double *hi)
{
    const model_rope_yarn *y = &c->yarn;
    int dim = (int)c->qk_rope_head_dim;
    double orig = (double)y->original_max_position_embeddings;
    double l = correction_dim(y->beta_fast, dim, c->rope_theta, orig);
    double h = correction_dim(y->beta_slow, dim, c->rope_theta, orig);
    if (y->truncate) {
        l = floor(l);
        h = ceil(h);
    }
    l = l > 0 ? l : 0;
    h = h < dim - 1 ? h : dim - 1;
    if (l == h)
        h += 0.001; /* as transformers: no division by zero */
    *lo = l;
    *hi = h;
}

/* Inverse frequency i; lo and hi from yarn_range (unused for "default"). */
static double inv_freq_at(const model_config *c, int i, double lo, double hi)
{
    double dim = (double)c->qk_rope_head_dim;
    if (c->rope_kind != MODEL_ROPE_YARN)
        return pow(c->rope_theta, -2.0 * i / dim); /* the runtime's expression since v1 */
    double base_freq = pow(c->rope_theta, 2.0 * i / dim);
    double extrap = 1.0 / base_freq, interp = 1.0 / (c->yarn.factor * base_freq);
    double ramp = ((double)i - lo) / (hi - lo);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    /* ramp 0: high frequencies, kept as they are; 1: divided by factor */
    return interp * ramp + extrap * (1.0 - ramp);
}

void model_config_rope_inv_freq(const model_config *c, double *inv_freq)
{
    double lo = 0, hi = 1;
    if (c->rope_kind == MODEL_ROPE_YARN)
        yarn_range(c, &lo, &hi);
    for (int i = 0; i < (int)c->qk_rope_head_dim / 2; i++)
        inv_freq[i] = inv_freq_at(c, i, lo, hi);
}

double model_config_rope_attention_factor(const model_config *c)
{
    return c->rope_kind == MODEL_ROPE_YARN ? c->yarn.attention_factor : 1.0;
}

void model_config_rope_table(const model_config *c, int64_t npos, float *cos_sin)
{
    int r = (int)c->qk_rope_head_dim, half = r / 2;
    double lo = 0, hi = 1, af = model_config_rope_attention_factor(c);
    if (c->rope_kind == MODEL_ROPE_YARN)
        yarn_range(c, &lo, &hi);
    for (int i = 0; i < half; i++) {
        double f = inv_freq_at(c, i, lo, hi);
        for (int64_t p = 0; p < npos; p++) {
            double a = (double)p * f;
            cos_sin[p * r + i] = (float)(cos(a) * af); /* af 1: exactly cos(a) */
            cos_sin[p * r + half + i] = (float)(sin(a) * af);
        }
    }
}

double model_config_softmax_scale(const model_config *c)
{
    double s = 1.0 / sqrt((double)(c->qk_nope_head_dim + c->qk_rope_head_dim));
    return c->rope_kind == MODEL_ROPE_YARN ? s * c->yarn.softmax_mult : s;
}

/* The fields, in the order of config.h. */
static mt_status parse_fields(const ctx *x, model_config *c)
{
    MT_CHECK(get_str(x, "model_type", "glm_moe_dsa", c->model_type, sizeof c->model_type));
    if (strcmp(c->model_type, "glm_moe_dsa"))
        return mt_fail(x->err, MT_E_UNSUPPORTED, "%s: \"model_type\" is \"%s\"; this runtime "
                       "loads \"glm_moe_dsa\" (GlmMoeDsaForCausalLM)", x->label, c->model_type);
    const cJSON *arch = item(x, "architectures");
    if (cJSON_IsArray(arch) && cJSON_IsString(cJSON_GetArrayItem(arch, 0)))
        snprintf(c->architecture, sizeof c->architecture, "%s",
                 cJSON_GetArrayItem(arch, 0)->valuestring);

    MT_CHECK(get_int(x, "hidden_size", true, 0, 1, DIM_MAX, &c->hidden_size));
    MT_CHECK(get_int(x, "num_hidden_layers", true, 0, 1, 4096, &c->num_hidden_layers));
    MT_CHECK(get_int(x, "vocab_size", true, 0, 1, DIM_MAX, &c->vocab_size));
    MT_CHECK(get_int(x, "max_position_embeddings", true, 0, 1, DIM_MAX,
                     &c->max_position_embeddings));
    MT_CHECK(get_num(x, "rms_norm_eps", true, 0, 0, 1, &c->rms_norm_eps));
    MT_CHECK(get_bool(x, "tie_word_embeddings", false, false, &c->tie_word_embeddings));
    MT_CHECK(get_str(x, "hidden_act", "silu", c->hidden_act, sizeof c->hidden_act));
    if (strcmp(c->hidden_act, "silu"))
        return mt_fail(x->err, MT_E_UNSUPPORTED, "%s: \"hidden_act\" is \"%s\"; GLM-5 uses "
                       "\"silu\"", x->label, c->hidden_act);

    MT_CHECK(get_int(x, "first_k_dense_replace", true, 0, 0, c->num_hidden_layers,
                     &c->first_k_dense_replace));
    MT_CHECK(get_int(x, "moe_layer_freq", false, 1, 1, 4096, &c->moe_layer_freq));
    MT_CHECK(get_int(x, "intermediate_size", true, 0, 1, DIM_MAX, &c->intermediate_size));
    MT_CHECK(get_int(x, "moe_intermediate_size", true, 0, 1, DIM_MAX, &c->moe_intermediate_size));
    MT_CHECK(get_int(x, "n_routed_experts", true, 0, 1, 1 << 20, &c->n_routed_experts));
    MT_CHECK(get_int(x, "n_shared_experts", true, 0, 0, 1024, &c->n_shared_experts));
    MT_CHECK(get_int(x, "num_experts_per_tok", true, 0, 1, c->n_routed_experts,
                     &c->num_experts_per_tok));
    MT_CHECK(get_int(x, "n_group", false, 1, 1, c->n_routed_experts, &c->n_group));
    if (c->n_routed_experts % c->n_group)
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"n_group\" (%" PRId64 ") does not divide "
                       "\"n_routed_experts\" (%" PRId64 ")", x->label, c->n_group,
                       c->n_routed_experts);
    MT_CHECK(get_int(x, "topk_group", false, 1, 1, c->n_group, &c->topk_group));
    MT_CHECK(get_num(x, "routed_scaling_factor", true, 0, 0, 1e6, &c->routed_scaling_factor));
    MT_CHECK(get_bool(x, "norm_topk_prob", true, false, &c->norm_topk_prob));
    MT_CHECK(get_str(x, "scoring_func", "sigmoid", c->scoring_func, sizeof c->scoring_func));
    if (strcmp(c->scoring_func, "sigmoid") && strcmp(c->scoring_func, "softmax"))
        return mt_fail(x->err, MT_E_UNSUPPORTED, "%s: \"scoring_func\" is \"%s\" (expected "
                       "\"sigmoid\" or \"softmax\")", x->label, c->scoring_func);
    MT_CHECK(get_str(x, "topk_method", "noaux_tc", c->topk_method, sizeof c->topk_method));

    MT_CHECK(get_int(x, "num_attention_heads", true, 0, 1, 65536, &c->num_attention_heads));
    MT_CHECK(get_int(x, "num_key_value_heads", false, c->num_attention_heads, 1, 65536,
                     &c->num_key_value_heads));
    if (c->num_key_value_heads != c->num_attention_heads)
        return mt_fail(x->err, MT_E_UNSUPPORTED, "%s: \"num_key_value_heads\" (%" PRId64 ") "
                       "differs from \"num_attention_heads\" (%" PRId64 "); MLA has one per "
                       "head", x->label, c->num_key_value_heads, c->num_attention_heads);
    /* q_lora_rank is required but may be null (then q_proj replaces q_a/q_b). */
    if (!item(x, "q_lora_rank"))
        return mt_fail(x->err, MT_E_FORMAT, "%s: missing required key \"q_lora_rank\" (null "
                       "for no query low-rank path)", x->label);
    MT_CHECK(get_int(x, "q_lora_rank", false, 0, 1, DIM_MAX, &c->q_lora_rank));
    MT_CHECK(get_int(x, "kv_lora_rank", true, 0, 1, DIM_MAX, &c->kv_lora_rank));
    MT_CHECK(get_int(x, "qk_nope_head_dim", true, 0, 0, 65536, &c->qk_nope_head_dim));
    MT_CHECK(get_int(x, "qk_rope_head_dim", true, 0, 0, 65536, &c->qk_rope_head_dim));
    if (c->qk_rope_head_dim % 2)
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"qk_rope_head_dim\" (%" PRId64 ") must be even",
                       x->label, c->qk_rope_head_dim);
    if (c->qk_nope_head_dim + c->qk_rope_head_dim == 0)
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"qk_nope_head_dim\" + \"qk_rope_head_dim\" is 0",
                       x->label);
    MT_CHECK(get_int(x, "v_head_dim", true, 0, 1, 65536, &c->v_head_dim));
    MT_CHECK(get_bool(x, "attention_bias", false, false, &c->attention_bias));
    if (c->attention_bias)
        return mt_fail(x->err, MT_E_UNSUPPORTED, "%s: \"attention_bias\" is true; GLM-5 has no "
                       "attention biases", x->label);
    MT_CHECK(get_bool(x, "rope_interleave", false, true, &c->rope_interleave));

    MT_CHECK(parse_rope(x, c));

    MT_CHECK(get_int(x, "index_topk", true, 0, 1, DIM_MAX, &c->index_topk));
    MT_CHECK(get_int(x, "index_n_heads", true, 0, 1, 65536, &c->index_n_heads));
    MT_CHECK(get_int(x, "index_head_dim", true, 0, 1, 65536, &c->index_head_dim));
    if (c->index_head_dim < c->qk_rope_head_dim)
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"index_head_dim\" (%" PRId64 ") is smaller than "
                       "\"qk_rope_head_dim\" (%" PRId64 "), which the indexer rotates", x->label,
                       c->index_head_dim, c->qk_rope_head_dim);
    MT_CHECK(get_int(x, "index_topk_freq", false, 1, 1, 4096, &c->index_topk_freq));
    MT_CHECK(get_int(x, "index_skip_topk_offset", false, 2, 0, 4096, &c->index_skip_topk_offset));
    MT_CHECK(get_bool(x, "indexer_rope_interleave", false, true, &c->indexer_rope_interleave));
    MT_CHECK(get_bool(x, "index_share_for_mtp_iteration", false, false,
                      &c->index_share_for_mtp_iteration));

    MT_CHECK(get_int(x, "num_nextn_predict_layers", false, 0, 0, 64, &c->num_nextn_predict_layers));

    const cJSON *eos = item(x, "eos_token_id");
    if (cJSON_IsNumber(eos)) {
        MT_CHECK(get_int(x, "eos_token_id", false, 0, 0, c->vocab_size - 1, &c->eos_token_id[0]));
        c->eos_count = 1;
    } else if (cJSON_IsArray(eos)) {
        for (const cJSON *e = eos->child; e; e = e->next) {
            if (c->eos_count == MODEL_MAX_EOS || !cJSON_IsNumber(e) || e->valuedouble < 0 ||
                e->valuedouble >= (double)c->vocab_size || e->valuedouble != floor(e->valuedouble))
                return mt_fail(x->err, MT_E_FORMAT, "%s: \"eos_token_id\"[%d] must be a token id "
                               "below vocab_size (at most %d ids)", x->label, c->eos_count,
                               MODEL_MAX_EOS);
            c->eos_token_id[c->eos_count++] = (int64_t)e->valuedouble;
        }
    } else if (!absent(eos)) {
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"eos_token_id\" must be an id or a list of ids",
                       x->label);
    }
    MT_CHECK(get_int(x, "pad_token_id", false, -1, 0, c->vocab_size - 1, &c->pad_token_id));
    MT_CHECK(get_int(x, "bos_token_id", false, -1, 0, c->vocab_size - 1, &c->bos_token_id));
    return MT_OK;
}

/* Explicit per-layer string lists: indexer_types and mlp_layer_types. */
static mt_status layer_list(const ctx *x, const char *key, int64_t n, const char *yes,
                            const char *no, bool *out, bool *given)
{
    const cJSON *j = item(x, key);
    *given = !absent(j);
    if (!*given)
        return MT_OK;
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != n)
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"%s\" must be a list of %" PRId64 " strings "
                       "(one per layer)", x->label, key, n);
    int64_t i = 0;
    for (const cJSON *e = j->child; e; e = e->next, i++) {
        if (cJSON_IsString(e) && !strcmp(e->valuestring, yes))
            out[i] = true;
        else if (cJSON_IsString(e) && !strcmp(e->valuestring, no))
            out[i] = false;
        else
            return mt_fail(x->err, MT_E_FORMAT, "%s: \"%s\"[%" PRId64 "] must be \"%s\" or \"%s\"",
                           x->label, key, i, yes, no);
    }
    return MT_OK;
}

static mt_status derive_layers(const ctx *x, model_config *c)
{
    int64_t L = c->num_hidden_layers, n = L + c->num_nextn_predict_layers;
    c->layer_count = n;
    c->layer_moe = calloc((size_t)n, sizeof *c->layer_moe);
    c->layer_indexer_full = calloc((size_t)n, sizeof *c->layer_indexer_full);
    bool *tmp = calloc((size_t)n, sizeof *tmp);
    mt_status st = MT_OK;
    if (!c->layer_moe || !c->layer_indexer_full || !tmp) {
        free(tmp);
        return mt_fail(x->err, MT_E_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n; i++)
        c->layer_moe[i] = i >= c->first_k_dense_replace && i % c->moe_layer_freq == 0;
    bool given;
    st = layer_list(x, "mlp_layer_types", L, "sparse", "dense", tmp, &given);
    for (int64_t i = 0; given && st == MT_OK && i < L; i++)
        if (tmp[i] != c->layer_moe[i])
            st = mt_fail(x->err, MT_E_FORMAT, "%s: \"mlp_layer_types\"[%" PRId64 "] is \"%s\" but "
                         "first_k_dense_replace %" PRId64 " and moe_layer_freq %" PRId64 " make "
                         "layer %" PRId64 " %s", x->label, i, tmp[i] ? "sparse" : "dense",
                         c->first_k_dense_replace, c->moe_layer_freq, i,
                         c->layer_moe[i] ? "sparse (MoE)" : "dense");

    /* Indexer schedule: rule, then the pattern string, then the explicit list. */
    bool rule_given = !absent(item(x, "index_topk_freq")) ||
                      !absent(item(x, "index_skip_topk_offset"));
    for (int64_t i = 0; i < n; i++)
        c->layer_indexer_full[i] = i >= L || model_config_indexer_rule(i, c->index_topk_freq,
                                                                       c->index_skip_topk_offset);
    const cJSON *pat = item(x, "index_topk_pattern");
    if (st == MT_OK && !absent(pat)) {
        if (!cJSON_IsString(pat) || (int64_t)strlen(pat->valuestring) != L)
            st = mt_fail(x->err, MT_E_FORMAT, "%s: \"index_topk_pattern\" must be a string of %"
                         PRId64 " letters 'F' or 'S'", x->label, L);
        for (int64_t i = 0; st == MT_OK && i < L; i++) {
            char ch = pat->valuestring[i];
            if (ch != 'F' && ch != 'S')
                st = mt_fail(x->err, MT_E_FORMAT, "%s: \"index_topk_pattern\"[%" PRId64 "] is '%c', "
                             "expected 'F' or 'S'", x->label, i, ch);
            else if (rule_given && (ch == 'F') != c->layer_indexer_full[i])
                st = mt_fail(x->err, MT_E_FORMAT, "%s: indexer schedules disagree at layer %" PRId64
                             ": index_topk_pattern says '%c', index_topk_freq %" PRId64 " / "
                             "index_skip_topk_offset %" PRId64 " say %s", x->label, i, ch,
                             c->index_topk_freq, c->index_skip_topk_offset,
                             c->layer_indexer_full[i] ? "full" : "shared");
            else
                c->layer_indexer_full[i] = ch == 'F';
        }
        rule_given = true;
    }
    if (st == MT_OK)
        st = layer_list(x, "indexer_types", L, "full", "shared", tmp, &given);
    for (int64_t i = 0; given && st == MT_OK && i < L; i++) {
        if (rule_given && tmp[i] != c->layer_indexer_full[i])
            st = mt_fail(x->err, MT_E_FORMAT, "%s: indexer schedules disagree at layer %" PRId64
                         ": indexer_types says \"%s\", index_topk_freq %" PRId64 " / "
                         "index_skip_topk_offset %" PRId64 " (or index_topk_pattern) say \"%s\"",
                         x->label, i, tmp[i] ? "full" : "shared", c->index_topk_freq,
                         c->index_skip_topk_offset, c->layer_indexer_full[i] ? "full" : "shared");
        c->layer_indexer_full[i] = tmp[i];
    }
    if (st == MT_OK && !c->layer_indexer_full[0])
        st = mt_fail(x->err, MT_E_FORMAT, "%s: layer 0 is a \"shared\" indexer layer, but there "
                     "is no earlier full layer to share with", x->label);
    free(tmp);
    return st;
}

static mt_status parse_quant(const ctx *x, model_config *c)
{
    const cJSON *q = item(x, "quantization_config");
    if (absent(q))
        return MT_OK;
    if (!cJSON_IsObject(q))
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"quantization_config\" must be an object",
                       x->label);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    if (!cJSON_IsString(m))
        return mt_fail(x->err, MT_E_FORMAT, "%s: \"quantization_config.quant_method\" is missing",
                       x->label);
    snprintf(c->quant_method, sizeof c->quant_method, "%s", m->valuestring);
    if (strcmp(m->valuestring, "quark"))
        return MT_OK;
    mt_status st = model_quark_parse(q, &c->quark, x->err);
    return st == MT_OK ? st : mt_err_prefix(x->err, "%s", x->label);
}

mt_status model_config_parse(const char *json, size_t len, const char *label, model_config **out,
                             mt_err *err)
{
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root)
        return mt_fail(err, MT_E_FORMAT, "%s: malformed JSON near byte %zu", label,
                       end ? (size_t)(end - json) : 0);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return mt_fail(err, MT_E_FORMAT, "%s: not a JSON object", label);
    }
    model_config *c = calloc(1, sizeof *c);
    if (!c) {
        cJSON_Delete(root);
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    }
    ctx x = {root, label, err};
    mt_status st = parse_fields(&x, c);
    if (st == MT_OK)
        st = derive_layers(&x, c);
    if (st == MT_OK)
        st = parse_quant(&x, c);
    cJSON_Delete(root);
    if (st != MT_OK) {
        model_config_destroy(c);
        return st;
    }
    *out = c;
    return MT_OK;
}

mt_status model_config_load(const char *path, model_config **out, mt_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    mt_status st = mt_file_read(path, &text, &len, err);
    if (st != MT_OK)
        return st;
    st = model_config_parse(text, len, path, out, err);
    free(text);
    return st;
}
