/* tiny.c: make-tiny-model: a small random GLM-5 checkpoint in the real
 * format (config.json with Quark MXFP4, two safetensors shards and their
 * index, a trained byte-level BPE tokenizer.json). See tiny.h. */
#include "tiny.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/files.h"
#include "common/numeric.h"
#include "common/rng.h"
#include "common/mxfp4.h"
#include "safetensors.h"
#include "tokenizer.h"

enum {
    HIDDEN = 256,
    LAYERS = 4,
    DENSE = 1,
    INTER = 512,
    MOE_INTER = 128,
    EXPERTS = 16,
    TOPK = 4,
    SHARED = 1,
    HEADS = 4, /* the attention widths of model_tiny_write (tiny_attn) */
    Q_LORA = 64,
    KV_LORA = 32,
    QK_NOPE = 32,
    QK_ROPE = 16,
    V_DIM = 32,
    IDX_HEADS = 2,
    IDX_DIM = 32,
    IDX_TOPK = 16,
    IDX_FREQ = 4,
    IDX_OFFSET = 3,
    VOCAB = 512,
    MAX_POS = 4096,
    MTP = LAYERS, /* model.layers.4.* */
};

/* The attention widths a checkpoint is written with. */
typedef struct tiny_attn {
    int heads, kv_lora, qk_rope;
} tiny_attn;

static const tiny_attn attn_tiny = {HEADS, KV_LORA, QK_ROPE};
static const tiny_attn attn_wide = {16, 64, 32};

static const char *const shard_names[2] = {"model-00001-of-00002.safetensors",
                                           "model-00002-of-00002.safetensors"};

/* GLM's added tokens, in GLM's order; the control tokens are special. */
static const char *const added_tokens[] = {
    "<|endoftext|>", "[MASK]",    "[gMASK]",   "[sMASK]",     "<sop>",      "<eop>",
    "<|system|>",    "<|user|>",  "<|assistant|>", "<|observation|>", "<think>", "</think>",
    "<tool_call>",   "</tool_call>",
};
static const bool added_special[] = {
    true, true, true, true, true, true, true, true, true, true, false, false, false, false,
};
#define ADDED_COUNT ((int)(sizeof added_tokens / sizeof added_tokens[0]))
_Static_assert(sizeof added_special / sizeof added_special[0] ==
                   sizeof added_tokens / sizeof added_tokens[0], "one flag per added token");

static const char corpus[] =
    "The lighthouse keeper woke before the sun, as he had every morning for thirty years. "
    "He climbed the narrow stairs, counted the steps out of habit, and checked the lamp. "
    "The glass was clean, the oil was full, and the sea below was calm and grey.\n\n"
    "In the village, the baker was already at work. She mixed flour, water and salt, "
    "and shaped the dough into long loaves. The smell of fresh bread drifted along the "
    "harbour, where the fishermen were getting their boats ready for the day.\n\n"
    "\"Will the weather hold?\" asked the youngest fisherman. The old captain looked at "
    "the sky, at the gulls, and at the water. \"It will hold until the afternoon,\" he "
    "said. \"After that, we should be home.\"\n\n"
    "A computer is a machine that follows instructions. It reads numbers from memory, "
    "computes with them, and writes the results back. A program is a list of such "
    "instructions, and a good program is one that is correct, clear and fast. To make a "
    "program fast, engineers measure it first: they time each part, find the slowest "
    "one, and improve it. Then they measure again, because a change that should help "
    "does not always help.\n\n"
    "Matrix multiplication is at the heart of modern language models. A model with many "
    "experts sends each token to only a few of them, which saves work, but it makes the "
    "shapes of the matrices small and uneven. Kernels that are tuned for large, regular "
    "shapes can be slow on these. The answer is to tune the kernels for the shapes the "
    "model really uses, to check that every candidate computes the right result, and to "
    "store the winners so that nobody has to tune them again.\n\n"
    "The children ran down to the beach after school. They built a castle of sand with "
    "four towers and a wall, and they dug a moat around it. When the tide came in, the "
    "water filled the moat, then the towers began to fall, one after another. The "
    "children laughed and started to build a new one, higher up the beach.\n\n"
    "In the evening the keeper lit the lamp again. Its light turned slowly over the "
    "water, once every ten seconds, and the ships far out at sea could see it and know "
    "where the rocks were. He wrote in his book: wind from the west, light rain after "
    "six, three ships passed, all well. Then he made tea and read until it was time to "
    "sleep.\n\n"
    "Numbers tell their own stories: 1, 2, 3, 10, 42, 100, 2048, 6144 and 65536 appear "
    "again and again in the work of engineers. Some are powers of two; others are just "
    "the sizes that someone chose a long time ago, and that everyone else has followed "
    "since then. The question is not which number is right, but which number is fast on "
    "the machine in front of you, today.\n\n"
    "There is a kind of patience that comes from watching the sea. The water is never "
    "the same twice, and yet it is always the sea. The keeper understood this, and so "
    "did the baker, the fishermen and the children, each in their own way. They were "
    "the people of the harbour, and the harbour was their home.\n";

const char *model_tiny_corpus(void) { return corpus; }

/* ---- config.json ---------------------------------------------------------- */

static cJSON *quant_spec(bool dynamic)
{
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "dtype", "fp4");
    cJSON_AddNumberToObject(s, "ch_axis", -1);
    cJSON_AddStringToObject(s, "qscheme", "per_group");
    cJSON_AddNumberToObject(s, "group_size", 32);
    cJSON_AddStringToObject(s, "scale_format", "e8m0");
    cJSON_AddStringToObject(s, "scale_type", "float");
    cJSON_AddStringToObject(s, "scale_calculation_mode", "even");
    cJSON_AddStringToObject(s, "round_method", "half_even");
    cJSON_AddStringToObject(s, "observer_cls", "PerBlockMXObserver");
    cJSON_AddBoolToObject(s, "is_dynamic", dynamic);
    cJSON_AddBoolToObject(s, "is_scale_quant", 0);
    cJSON_AddNullToObject(s, "symmetric");
    cJSON_AddNullToObject(s, "mx_element_dtype");
    return s;
}

static cJSON *quant_config(void)
{
    cJSON *q = cJSON_CreateObject();
    cJSON_AddStringToObject(q, "quant_method", "quark");
    cJSON_AddStringToObject(q, "quant_mode", "eager_mode");
    cJSON_AddStringToObject(q, "version", "0.10");
    cJSON *g = cJSON_AddObjectToObject(q, "global_quant_config");
    cJSON_AddItemToObject(g, "weight", quant_spec(false));
    cJSON_AddItemToObject(g, "input_tensors", quant_spec(true));
    cJSON_AddNullToObject(g, "output_tensors");
    cJSON_AddNullToObject(g, "bias");
    cJSON_AddNullToObject(g, "target_device");
    char mtp[32];
    snprintf(mtp, sizeof mtp, "*layers.%d.*", MTP);
    /* Attention (with the indexer), the router gate, lm_head, the dense MLP
     * of layer 0 (as a regular expression) and the MTP layer stay bf16. */
    const char *ex[] = {"*self_attn*", "*mlp.gate", "*lm_head", "re:model\\.layers\\.0\\.mlp\\..*",
                        mtp};
    cJSON_AddItemToObject(q, "exclude", cJSON_CreateStringArray(ex, 5));
    cJSON *e = cJSON_AddObjectToObject(q, "export");
    cJSON_AddArrayToObject(e, "kv_cache_group");
    cJSON_AddNumberToObject(e, "min_kv_scale", 0.0);
    cJSON_AddStringToObject(e, "pack_method", "reorder");
    cJSON_AddStringToObject(e, "weight_format", "real_quantized");
    cJSON_AddNullToObject(e, "weight_merge_groups");
    cJSON_AddObjectToObject(q, "layer_quant_config");
    cJSON_AddObjectToObject(q, "layer_type_quant_config");
    cJSON_AddObjectToObject(q, "kv_cache_quant_config");
    cJSON_AddNullToObject(q, "algo_config");
    cJSON_AddNullToObject(q, "softmax_quant_spec");
    return q;
}

static cJSON *config_json(const int32_t eos[3], const tiny_attn *at)
{
    cJSON *c = cJSON_CreateObject();
    const char *arch[] = {"GlmMoeDsaForCausalLM"};
    cJSON_AddItemToObject(c, "architectures", cJSON_CreateStringArray(arch, 1));
    cJSON_AddStringToObject(c, "model_type", "glm_moe_dsa");
    cJSON_AddStringToObject(c, "dtype", "bfloat16");
    cJSON_AddNumberToObject(c, "vocab_size", VOCAB);
    cJSON_AddNumberToObject(c, "hidden_size", HIDDEN);
    cJSON_AddNumberToObject(c, "num_hidden_layers", LAYERS);
    cJSON_AddNumberToObject(c, "max_position_embeddings", MAX_POS);
    cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-5);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddBoolToObject(c, "tie_word_embeddings", 0);
    cJSON_AddNumberToObject(c, "first_k_dense_replace", DENSE);
    cJSON_AddNumberToObject(c, "moe_layer_freq", 1);
    cJSON *mlp = cJSON_AddArrayToObject(c, "mlp_layer_types");
    for (int i = 0; i < LAYERS; i++)
        cJSON_AddItemToArray(mlp, cJSON_CreateString(i < DENSE ? "dense" : "sparse"));
    cJSON_AddNumberToObject(c, "intermediate_size", INTER);
    cJSON_AddNumberToObject(c, "moe_intermediate_size", MOE_INTER);
    cJSON_AddNumberToObject(c, "n_routed_experts", EXPERTS);
    cJSON_AddNumberToObject(c, "n_shared_experts", SHARED);
    cJSON_AddNumberToObject(c, "num_experts_per_tok", TOPK);
    cJSON_AddNumberToObject(c, "n_group", 1);
    cJSON_AddNumberToObject(c, "topk_group", 1);
    cJSON_AddNumberToObject(c, "routed_scaling_factor", 2.5);
    cJSON_AddBoolToObject(c, "norm_topk_prob", 1);
    cJSON_AddStringToObject(c, "scoring_func", "sigmoid");
    cJSON_AddStringToObject(c, "topk_method", "noaux_tc");
    cJSON_AddStringToObject(c, "moe_router_dtype", "float32");
    cJSON_AddNumberToObject(c, "num_attention_heads", at->heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", at->heads);
    cJSON_AddNumberToObject(c, "q_lora_rank", Q_LORA);
    cJSON_AddNumberToObject(c, "kv_lora_rank", at->kv_lora);
    cJSON_AddNumberToObject(c, "qk_nope_head_dim", QK_NOPE);
    cJSON_AddNumberToObject(c, "qk_rope_head_dim", at->qk_rope);
    cJSON_AddNumberToObject(c, "qk_head_dim", QK_NOPE + at->qk_rope);
    cJSON_AddNumberToObject(c, "head_dim", at->qk_rope);
    cJSON_AddNumberToObject(c, "v_head_dim", V_DIM);
    cJSON_AddBoolToObject(c, "attention_bias", 0);
    cJSON_AddNumberToObject(c, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(c, "rope_interleave", 1);
    cJSON *rope = cJSON_AddObjectToObject(c, "rope_parameters");
    cJSON_AddNumberToObject(rope, "rope_theta", 8000000);
    cJSON_AddStringToObject(rope, "rope_type", "default");
    cJSON_AddNumberToObject(c, "index_topk", IDX_TOPK);
    cJSON_AddNumberToObject(c, "index_n_heads", IDX_HEADS);
    cJSON_AddNumberToObject(c, "index_head_dim", IDX_DIM);
    cJSON_AddNumberToObject(c, "index_topk_freq", IDX_FREQ);
    cJSON_AddNumberToObject(c, "index_skip_topk_offset", IDX_OFFSET);
    cJSON_AddNullToObject(c, "index_topk_pattern");
    cJSON *it = cJSON_AddArrayToObject(c, "indexer_types");
    for (int i = 0; i < LAYERS; i++) {
        int k = i - IDX_OFFSET + 1 > 0 ? i - IDX_OFFSET + 1 : 0;
        cJSON_AddItemToArray(it, cJSON_CreateString(k % IDX_FREQ ? "shared" : "full"));
    }
    cJSON_AddBoolToObject(c, "indexer_rope_interleave", 1);
    cJSON_AddBoolToObject(c, "index_share_for_mtp_iteration", 0);
    cJSON_AddNumberToObject(c, "num_nextn_predict_layers", 1);
    cJSON *e = cJSON_AddArrayToObject(c, "eos_token_id");
    for (int i = 0; i < 3; i++)
        cJSON_AddItemToArray(e, cJSON_CreateNumber(eos[i]));
    cJSON_AddNumberToObject(c, "pad_token_id", eos[0]);
    cJSON_AddBoolToObject(c, "use_cache", 1);
    cJSON_AddStringToObject(c, "transformers_version", "5.0.0");
    cJSON_AddItemToObject(c, "quantization_config", quant_config());
    return c;
}

/* ---- weights ------------------------------------------------------------- */

typedef struct gen {
    mt_rng rng;
    model_st_writer *shard[2];
    int cur; /* shard receiving tensors */
    cJSON *weight_map;
    float *f;     /* scratch floats */
    uint16_t *h;  /* scratch bf16 */
    uint8_t *q, *s;
    mt_err *err;
    /* The next-token-map checkpoint (model_tiny_write_mtp_map): every
     * linear that writes the residual stream is zero, lm_head row perm[t]
     * is embedding row t, eh_proj passes enorm(embedding) through. */
    bool mapped;
    uint16_t *emb;   /* [VOCAB][HIDDEN] the embedding as written */
    const tiny_attn *attn;
} gen;

static mt_status put(gen *g, const char *name, model_dtype dt, int ndim, const int64_t *shape,
                     const void *data, size_t nbytes)
{
    mt_status st = model_st_writer_add(g->shard[g->cur], name, dt, ndim, shape, data, nbytes,
                                       g->err);
    if (st == MT_OK)
        cJSON_AddStringToObject(g->weight_map, name, shard_names[g->cur]);
    return st;
}

/* A cheap unit-variance bell curve (sum of four uniforms, Irwin-Hall):
 * random weights need the right scale, not exact normality, and Box-Muller
 * dominated the time of writing the model. */
static float bell(mt_rng *r)
{
    float s = 0;
    for (int i = 0; i < 4; i++)
        s += (float)(mt_rng_u64(r) >> 40) * (1.0f / 16777216.0f);
    return (s - 2.0f) * 1.7320508f;
}

/* A bf16 tensor of random values with the given mean and std. */
static mt_status put_bf16(gen *g, const char *name, int ndim, const int64_t *shape, float mean,
                          float std)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    for (int64_t i = 0; i < n; i++)
        g->h[i] = mt_f32_to_bf16(mean + std * bell(&g->rng));
    return put(g, name, MODEL_DTYPE_BF16, ndim, shape, g->h, (size_t)n * 2);
}

static mt_status put_vec(gen *g, const char *prefix, const char *suffix, int64_t n, float mean,
                         float std)
{
    char name[256];
    snprintf(name, sizeof name, "%s%s", prefix, suffix);
    return put_bf16(g, name, 1, &n, mean, std);
}

/* A linear [out, in]: bf16, or Quark MXFP4 (weight + weight_scale). */
static mt_status put_linear(gen *g, const char *prefix, const char *suffix, int64_t out,
                            int64_t in, bool mxfp4, bool residual)
{
    char name[256];
    float std = (residual ? (g->mapped ? 0.0f : 0.5f) : 1.0f) / sqrtf((float)in);
    snprintf(name, sizeof name, "%s%s.weight", prefix, suffix);
    int64_t shape[2] = {out, in};
    if (!mxfp4)
        return put_bf16(g, name, 2, shape, 0, std);
    for (int64_t i = 0; i < out * in; i++)
        g->f[i] = std * bell(&g->rng);
    mxfp4_quantize_matrix(g->f, out, in, g->q, g->s);
    int64_t qshape[2] = {out, in / 2}, sshape[2] = {out, in / 32};
    mt_status st = put(g, name, MODEL_DTYPE_U8, 2, qshape, g->q, (size_t)(out * in / 2));
    snprintf(name, sizeof name, "%s%s.weight_scale", prefix, suffix);
    return st != MT_OK ? st : put(g, name, MODEL_DTYPE_U8, 2, sshape, g->s, (size_t)(out * in / 32));
}

static mt_status put_mlp(gen *g, const char *prefix, int64_t inter, bool mxfp4)
{
    mt_status st = put_linear(g, prefix, "gate_proj", inter, HIDDEN, mxfp4, false);
    if (st == MT_OK)
        st = put_linear(g, prefix, "up_proj", inter, HIDDEN, mxfp4, false);
    if (st == MT_OK)
        st = put_linear(g, prefix, "down_proj", HIDDEN, inter, mxfp4, true);
    return st;
}

static bool indexer_full(int layer)
{
    int k = layer - IDX_OFFSET + 1 > 0 ? layer - IDX_OFFSET + 1 : 0;
    return layer >= LAYERS || k % IDX_FREQ == 0;
}

static mt_status put_layer(gen *g, int L)
{
    char p[64], a[96], q[160];
    bool mtp = L == MTP, quant = !mtp; /* the MTP layer is excluded: all bf16 */
    snprintf(p, sizeof p, "model.layers.%d.", L);
    snprintf(a, sizeof a, "%sself_attn.", p);
    MT_CHECK(put_vec(g, p, "input_layernorm.weight", HIDDEN, 1, 0.02f));
    MT_CHECK(put_vec(g, p, "post_attention_layernorm.weight", HIDDEN, 1, 0.02f));
    MT_CHECK(put_linear(g, a, "q_a_proj", Q_LORA, HIDDEN, false, false));
    MT_CHECK(put_vec(g, a, "q_a_layernorm.weight", Q_LORA, 1, 0.02f));
    const tiny_attn *at = g->attn;
    MT_CHECK(put_linear(g, a, "q_b_proj", at->heads * (QK_NOPE + at->qk_rope), Q_LORA, false,
                        false));
    MT_CHECK(put_linear(g, a, "kv_a_proj_with_mqa", at->kv_lora + at->qk_rope, HIDDEN, false,
                        false));
    MT_CHECK(put_vec(g, a, "kv_a_layernorm.weight", at->kv_lora, 1, 0.02f));
    MT_CHECK(put_linear(g, a, "kv_b_proj", at->heads * (QK_NOPE + V_DIM), at->kv_lora, false,
                        false));
    MT_CHECK(put_linear(g, a, "o_proj", HIDDEN, at->heads * V_DIM, false, true));
    if (indexer_full(L)) {
        snprintf(q, sizeof q, "%sindexer.", a);
        MT_CHECK(put_linear(g, q, "wq_b", IDX_HEADS * IDX_DIM, Q_LORA, false, false));
        MT_CHECK(put_linear(g, q, "wk", IDX_DIM, HIDDEN, false, false));
        MT_CHECK(put_vec(g, q, "k_norm.weight", IDX_DIM, 1, 0.02f));
        MT_CHECK(put_vec(g, q, "k_norm.bias", IDX_DIM, 0, 0.02f));
        MT_CHECK(put_linear(g, q, "weights_proj", IDX_HEADS, HIDDEN, false, false));
    }
    snprintf(q, sizeof q, "%smlp.", p);
    if (L < DENSE)
        return put_mlp(g, q, INTER, false);
    char name[256];
    snprintf(name, sizeof name, "%sgate.weight", q);
    int64_t gs[2] = {EXPERTS, HIDDEN}, bs = EXPERTS;
    MT_CHECK(put_bf16(g, name, 2, gs, 0, 1.0f / sqrtf(HIDDEN)));
    float bias[EXPERTS];
    for (int e = 0; e < EXPERTS; e++)
        bias[e] = mt_rng_uniform(&g->rng, -0.05f, 0.05f);
    snprintf(name, sizeof name, "%sgate.e_score_correction_bias", q);
    MT_CHECK(put(g, name, MODEL_DTYPE_F32, 1, &bs, bias, sizeof bias));
    for (int e = 0; e < EXPERTS; e++) {
        char ep[192];
        snprintf(ep, sizeof ep, "%sexperts.%d.", q, e);
        MT_CHECK(put_mlp(g, ep, MOE_INTER, quant));
    }
    snprintf(name, sizeof name, "%sshared_experts.", q);
    MT_CHECK(put_mlp(g, name, MOE_INTER * SHARED, quant));
    if (!mtp)
        return MT_OK;
    MT_CHECK(put_vec(g, p, "enorm.weight", HIDDEN, 1, 0.02f));
    MT_CHECK(put_vec(g, p, "hnorm.weight", HIDDEN, 1, 0.02f));
    if (g->mapped) {
        /* [I | 0]: the MTP layer's input is enorm(embedding of the next token). */
        int64_t es[2] = {HIDDEN, 2 * HIDDEN};
        for (int64_t i = 0; i < HIDDEN * 2 * HIDDEN; i++)
            g->h[i] = 0;
        for (int64_t r = 0; r < HIDDEN; r++)
            g->h[r * 2 * HIDDEN + r] = mt_f32_to_bf16(1.0f);
        snprintf(q, sizeof q, "%seh_proj.weight", p);
        MT_CHECK(put(g, q, MODEL_DTYPE_BF16, 2, es, g->h, (size_t)(HIDDEN * 2 * HIDDEN) * 2));
    } else {
        MT_CHECK(put_linear(g, p, "eh_proj", HIDDEN, 2 * HIDDEN, false, false));
    }
    MT_CHECK(put_vec(g, p, "shared_head.norm.weight", HIDDEN, 1, 0.02f));
    return MT_OK;
}

static mt_status put_all(gen *g)
{
    int64_t emb[2] = {VOCAB, HIDDEN};
    g->cur = 0;
    mt_status st = put_bf16(g, "model.embed_tokens.weight", 2, emb, 0, 1.0f);
    if (g->mapped)
        memcpy(g->emb, g->h, sizeof(uint16_t) * VOCAB * HIDDEN);
    for (int L = 0; L <= MTP && st == MT_OK; L++) {
        g->cur = L < 2 ? 0 : 1;
        st = put_layer(g, L);
    }
    if (st == MT_OK)
        st = put_vec(g, "model.", "norm.weight", HIDDEN, 1, 0.02f);
    if (st == MT_OK && g->mapped) {
        /* lm_head row perm[t] = embedding row t: the logits of norm(embed(t))
         * peak at perm[t] (a unit-variance row's dot with itself, about
         * HIDDEN, beats its dot with any other row, about sqrt(HIDDEN)). */
        int32_t perm[VOCAB];
        for (int i = 0; i < VOCAB; i++)
            perm[i] = i;
        for (int i = VOCAB - 1; i > 0; i--) {
            int j = (int)(mt_rng_u64(&g->rng) % (uint64_t)(i + 1));
            int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int t = 0; t < VOCAB; t++)
            memcpy(g->h + (size_t)perm[t] * HIDDEN, g->emb + (size_t)t * HIDDEN,
                   sizeof(uint16_t) * HIDDEN);
        int64_t ls[2] = {VOCAB, HIDDEN};
        st = put(g, "lm_head.weight", MODEL_DTYPE_BF16, 2, ls, g->h,
                 sizeof(uint16_t) * VOCAB * HIDDEN);
    } else if (st == MT_OK) {
        st = put_linear(g, "", "lm_head", VOCAB, HIDDEN, false, false);
    }
    return st;
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static mt_status write_text(const char *dir, const char *name, const char *text, mt_err *err)
{
    char *path = join(dir, name);
    if (!path)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    mt_status st = mt_file_write_atomic(path, text, strlen(text), err);
    free(path);
    return st;
}

static mt_status train_tokenizer(char **json, mt_err *err)
{
    return model_tokenizer_train(corpus, sizeof corpus - 1, model_glm_split_regex,
                                 VOCAB - ADDED_COUNT, added_tokens, added_special, ADDED_COUNT,
                                 json, err);
}

mt_status model_tiny_write_tokenizer(const char *path, mt_err *err)
{
    char *json = NULL;
    mt_status st = train_tokenizer(&json, err);
    if (st == MT_OK)
        st = mt_file_write_atomic(path, json, strlen(json), err);
    free(json);
    return st;
}

static mt_status write_all(const char *dir, uint64_t seed, bool mapped, const tiny_attn *at,
                           mt_err *err)
{
    mt_status st = mt_mkdirs(dir, err);
    if (st != MT_OK)
        return st;
    /* Tokenizer first: config.json names its end-of-text ids. */
    char *tok_json = NULL;
    model_tokenizer *tok = NULL;
    if ((st = train_tokenizer(&tok_json, err)) != MT_OK)
        return st;
    st = model_tokenizer_parse(tok_json, strlen(tok_json), "tokenizer.json", &tok, err);
    if (st == MT_OK && model_tokenizer_vocab_size(tok) > VOCAB)
        st = mt_fail(err, MT_E_INVALID, "trained tokenizer has %d tokens, over vocab_size %d",
                     model_tokenizer_vocab_size(tok), VOCAB);
    int32_t eos[3] = {0};
    if (st == MT_OK) {
        eos[0] = model_tokenizer_token_id(tok, "<|endoftext|>");
        eos[1] = model_tokenizer_token_id(tok, "<|user|>");
        eos[2] = model_tokenizer_token_id(tok, "<|observation|>");
        st = write_text(dir, "tokenizer.json", tok_json, err);
    }
    model_tokenizer_destroy(tok);
    free(tok_json);
    if (st != MT_OK)
        return st;

    cJSON *cfg = config_json(eos, at);
    char *cfg_text = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    st = cfg_text ? write_text(dir, "config.json", cfg_text, err)
                  : mt_fail(err, MT_E_NOMEM, "out of memory");
    free(cfg_text);
    if (st != MT_OK)
        return st;

    size_t big = (size_t)VOCAB * HIDDEN > (size_t)INTER * HIDDEN ? (size_t)VOCAB * HIDDEN
                                                                 : (size_t)INTER * HIDDEN;
    gen g = {.err = err, .mapped = mapped, .attn = at};
    mt_rng_seed(&g.rng, seed);
    g.weight_map = cJSON_CreateObject();
    g.f = malloc(big * sizeof *g.f);
    g.h = malloc(big * sizeof *g.h);
    g.q = malloc(big / 2);
    g.s = malloc(big / 32);
    g.emb = mapped ? malloc(sizeof(uint16_t) * VOCAB * HIDDEN) : NULL;
    if (!g.weight_map || !g.f || !g.h || !g.q || !g.s || (mapped && !g.emb))
        st = mt_fail(err, MT_E_NOMEM, "out of memory");
    for (int i = 0; i < 2 && st == MT_OK; i++)
        st = model_st_writer_create(&g.shard[i], err);
    if (st == MT_OK)
        st = put_all(&g);
    uint64_t total = 0;
    for (int i = 0; i < 2 && st == MT_OK; i++) {
        char *path = join(dir, shard_names[i]);
        st = path ? model_st_writer_set_metadata(g.shard[i], "format", "pt", err)
                  : mt_fail(err, MT_E_NOMEM, "out of memory");
        if (st == MT_OK)
            st = model_st_writer_write(g.shard[i], path, err);
        total += model_st_writer_data_bytes(g.shard[i]);
        free(path);
    }
    if (st == MT_OK) {
        cJSON *index = cJSON_CreateObject();
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(index, "metadata"), "total_size",
                                (double)total);
        cJSON_AddItemToObject(index, "weight_map", g.weight_map);
        g.weight_map = NULL;
        char *text = cJSON_Print(index);
        cJSON_Delete(index);
        st = text ? write_text(dir, "model.safetensors.index.json", text, err)
                  : mt_fail(err, MT_E_NOMEM, "out of memory");
        free(text);
    }
    cJSON_Delete(g.weight_map);
    for (int i = 0; i < 2; i++)
        model_st_writer_destroy(g.shard[i]);
    free(g.f);
    free(g.h);
    free(g.q);
    free(g.s);
    free(g.emb);
    return st;
}

mt_status model_tiny_write(const char *dir, uint64_t seed, mt_err *err)
{
    return write_all(dir, seed, false, &attn_tiny, err);
}

mt_status model_tiny_write_wide_attention(const char *dir, uint64_t seed, mt_err *err)
{
    return write_all(dir, seed, false, &attn_wide, err);
}

mt_status model_tiny_write_mtp_map(const char *dir, uint64_t seed, mt_err *err)
{
    return write_all(dir, seed, true, &attn_tiny, err);
}
