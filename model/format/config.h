/* config.h: config.json of a GLM-5 family checkpoint (GlmMoeDsaForCausalLM,
 * model_type "glm_moe_dsa"), parsed with cJSON into plain fields.
 *
 * Every field the runtime uses is read and range-checked; keys it does not
 * use are ignored. A missing required key, a value of the wrong type or out
 * of range is an error naming the key. Optional keys and their defaults are
 * listed in docs/FORMATS.md (they follow transformers' GlmMoeDsaConfig).
 *
 * Per-layer facts are derived once here, for the num_hidden_layers main
 * layers and the num_nextn_predict_layers MTP layers after them (layer
 * index num_hidden_layers is the first MTP layer, `model.layers.<L>.*`):
 *   layer_moe[i]: MoE MLP, from `mlp_layer_types` when given, else
 *     i >= first_k_dense_replace && i % moe_layer_freq == 0;
 *   layer_indexer_full[i]: the layer runs its own DSA indexer ("full") or
 *     reuses the top-k of the previous full layer ("shared"), from
 *     `indexer_types` when given, else `index_topk_pattern` ('F'/'S'), else
 *     full iff max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0
 *     (defaults 1 and 2: every layer). When an explicit list and an explicit
 *     freq/offset or pattern disagree, parsing fails naming the layer. MTP
 *     layers are marked full here (see weights.h for when they share).
 *
 * Ownership: model_config is created by parse/load and freed by
 * model_config_destroy, which frees its arrays and its quark config.
 * Immutable after parsing; safe to read from any thread. */
#ifndef MT_MODEL_CONFIG_H
#define MT_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "quark.h"

#define MODEL_MAX_EOS 8

/* RoPE variants the runtime applies. */
typedef enum model_rope_kind {
    MODEL_ROPE_DEFAULT = 0,
    MODEL_ROPE_YARN = 1,
    MODEL_ROPE_COUNT
} model_rope_kind;

/* YaRN parameters after transformers' defaults (_compute_yarn_parameters in
 * modeling_rope_utils.py, transformers 5, and DeepseekV3Attention):
 *   factor: required key; null means max_position_embeddings /
 *     original_max_position_embeddings;
 *   original_max_position_embeddings: a top-level key of that name wins,
 *     then the rope object's, else max_position_embeddings;
 *   beta_fast / beta_slow: 32 / 1 when absent, null or 0;
 *   mscale / mscale_all_dim: 0 when absent or null ("not given");
 *   attention_factor: given, else get_mscale(factor, mscale) /
 *     get_mscale(factor, mscale_all_dim) when both mscales are non-zero, else
 *     get_mscale(factor, 1), with get_mscale(s, m) = s <= 1 ? 1 : 0.1 m ln s + 1;
 *     it multiplies every cos and sin of the table;
 *   truncate: true when absent (floor/ceil of the correction range);
 *   softmax_mult: get_mscale(factor, mscale_all_dim)^2 when mscale_all_dim
 *     is non-zero, else 1: the DeepSeek-V3 attention-scale correction. */
typedef struct model_rope_yarn {
    double factor;
    int64_t original_max_position_embeddings;
    double beta_fast, beta_slow;
    double mscale, mscale_all_dim;
    double attention_factor;
    bool truncate;
    double softmax_mult;
} model_rope_yarn;

typedef struct model_config {
    char model_type[32];
    char architecture[64]; /* architectures[0], "" when absent */

    int64_t hidden_size;
    int64_t num_hidden_layers;
    int64_t vocab_size;
    int64_t max_position_embeddings;
    double rms_norm_eps;
    bool tie_word_embeddings;
    char hidden_act[16];

    /* MLP and MoE */
    int64_t first_k_dense_replace;
    int64_t moe_layer_freq;
    int64_t intermediate_size;     /* dense MLP */
    int64_t moe_intermediate_size; /* per expert */
    int64_t n_routed_experts;
    int64_t n_shared_experts;
    int64_t num_experts_per_tok;
    int64_t n_group, topk_group;
    double routed_scaling_factor;
    bool norm_topk_prob;
    char scoring_func[16]; /* "sigmoid" or "softmax" */
    char topk_method[24];

    /* MLA attention */
    int64_t num_attention_heads;
    int64_t num_key_value_heads;
    int64_t q_lora_rank; /* 0: no q low-rank path (q_proj instead of q_a/q_b) */
    int64_t kv_lora_rank;
    int64_t qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    bool attention_bias;
    double rope_theta;
    char rope_type[24]; /* "default" or "yarn" (any other type is refused) */
    model_rope_kind rope_kind;
    model_rope_yarn yarn; /* resolved; meaningful when rope_kind is MODEL_ROPE_YARN */
    bool rope_interleave;

    /* DSA indexer */
    int64_t index_topk, index_n_heads, index_head_dim;
    int64_t index_topk_freq, index_skip_topk_offset;
    bool indexer_rope_interleave;
    bool index_share_for_mtp_iteration;

    /* MTP */
    int64_t num_nextn_predict_layers;

    /* tokens */
    int64_t eos_token_id[MODEL_MAX_EOS];
    int eos_count;
    int64_t pad_token_id; /* -1 when absent */
    int64_t bos_token_id; /* -1 when absent */

    /* per layer, [layer_count] = num_hidden_layers + num_nextn_predict_layers */
    int64_t layer_count;
    bool *layer_moe;
    bool *layer_indexer_full;

    /* quantization */
    char quant_method[32]; /* "" when config.json has no quantization_config */
    model_quark *quark;    /* parsed when quant_method is "quark", else NULL */
} model_config;

/* Parses config.json text (len bytes; NUL not required). label names the
 * source in messages ("DIR/config.json"). */
mt_status model_config_parse(const char *json, size_t len, const char *label,
                             model_config **out, mt_err *err);
/* Reads and parses a file. */
mt_status model_config_load(const char *path, model_config **out, mt_err *err);
void model_config_destroy(model_config *c);

/* True for the MTP layers (index >= num_hidden_layers). */
static inline bool model_config_layer_is_mtp(const model_config *c, int64_t layer)
{
    return layer >= c->num_hidden_layers;
}

/* RoPE: the single source of the rotary frequencies for the runtime and the
 * reference. dim = qk_rope_head_dim (transformers' rotary dim for this
 * family); every function is pure and thread-safe.
 *
 * model_config_rope_inv_freq writes the dim/2 inverse frequencies, in
 * double: theta^(-2i/dim) for "default" (the expression the runtime has
 * always used), the YaRN blend of theta^(-2i/dim) and theta^(-2i/dim) /
 * factor over the beta_fast..beta_slow correction range for "yarn". */
void model_config_rope_inv_freq(const model_config *c, double *inv_freq);
/* The factor applied to cos and sin: 1 for "default". */
double model_config_rope_attention_factor(const model_config *c);
/* Fills the [npos][dim] table the rope kernels read: row p holds
 * attention_factor * cos(p * inv_freq[i]) for i < dim/2, then the sines
 * (angles in double, stored as float). Identical to attn_rope_table for
 * "default". */
void model_config_rope_table(const model_config *c, int64_t npos, float *cos_sin);
/* The attention softmax scale: (qk_nope_head_dim + qk_rope_head_dim)^-0.5,
 * times yarn.softmax_mult under YaRN. */
double model_config_softmax_scale(const model_config *c);

/* The DSA rule alone: does layer i run its own indexer under freq/offset? */
bool model_config_indexer_rule(int64_t layer, int64_t freq, int64_t offset);

#endif
