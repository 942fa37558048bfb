/* test_config.c: config.json for GlmMoeDsaForCausalLM: every field, the
 * per-layer MLP and DSA indexer schedules, defaults, and errors that name
 * the key. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "model/format/config.h"

/* GLM-5.2 as GLM5.md describes it (values of the published release). */
static const char glm52[] =
    "{\"architectures\":[\"GlmMoeDsaForCausalLM\"],\"model_type\":\"glm_moe_dsa\","
    "\"attention_bias\":false,\"attention_dropout\":0.0,\"dtype\":\"bfloat16\","
    "\"eos_token_id\":[154820,154827,154829],\"pad_token_id\":154820,\"ep_size\":1,"
    "\"first_k_dense_replace\":3,\"head_dim\":64,\"hidden_act\":\"silu\",\"hidden_size\":6144,"
    "\"index_head_dim\":128,\"index_n_heads\":32,\"index_topk\":2048,\"index_topk_freq\":4,"
    "\"index_skip_topk_offset\":3,\"index_share_for_mtp_iteration\":true,"
    "\"indexer_rope_interleave\":true,\"intermediate_size\":12288,\"kv_lora_rank\":512,"
    "\"max_position_embeddings\":202752,\"moe_intermediate_size\":2048,\"moe_layer_freq\":1,"
    "\"n_group\":1,\"n_routed_experts\":256,\"n_shared_experts\":1,\"norm_topk_prob\":true,"
    "\"num_attention_heads\":64,\"num_experts_per_tok\":8,\"num_hidden_layers\":78,"
    "\"num_key_value_heads\":64,\"num_nextn_predict_layers\":1,\"q_lora_rank\":2048,"
    "\"qk_head_dim\":256,\"qk_nope_head_dim\":192,\"qk_rope_head_dim\":64,\"rms_norm_eps\":1e-05,"
    "\"rope_interleave\":true,\"rope_parameters\":{\"rope_theta\":8000000,\"rope_type\":\"default\"},"
    "\"routed_scaling_factor\":2.5,\"scoring_func\":\"sigmoid\",\"tie_word_embeddings\":false,"
    "\"topk_group\":1,\"topk_method\":\"noaux_tc\",\"transformers_version\":\"5.0.2\","
    "\"use_cache\":true,\"v_head_dim\":256,\"vocab_size\":154880,"
    "\"quantization_config\":{\"quant_method\":\"quark\",\"global_quant_config\":{\"weight\":"
    "{\"dtype\":\"fp4\",\"qscheme\":\"per_group\",\"group_size\":32,\"scale_format\":\"e8m0\","
    "\"is_dynamic\":false},\"input_tensors\":{\"dtype\":\"fp4\",\"qscheme\":\"per_group\","
    "\"group_size\":32,\"scale_format\":\"e8m0\",\"is_dynamic\":true}},\"exclude\":["
    "\"*self_attn*\",\"*mlp.gate\",\"*lm_head\",\"re:model\\\\.layers\\\\.[0-2]\\\\.mlp\\\\..*\","
    "\"*layers.78.*\"],\"layer_quant_config\":{},\"layer_type_quant_config\":{},"
    "\"export\":{\"pack_method\":\"reorder\",\"weight_format\":\"real_quantized\"}}}";

/* Parses glm52 after applying edit (may be NULL) to its JSON tree. */
static mt_status parse_edited(void (*edit)(cJSON *, const void *), const void *arg,
                              model_config **out, mt_err *err)
{
    cJSON *j = cJSON_Parse(glm52);
    cr_assert_not_null(j);
    if (edit)
        edit(j, arg);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    mt_status st = model_config_parse(text, strlen(text), "config.json", out, err);
    free(text);
    return st;
}

static model_config *ok_edited(void (*edit)(cJSON *, const void *), const void *arg)
{
    model_config *c = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(parse_edited(edit, arg, &c, &err), MT_OK, "%s", err.msg);
    return c;
}

static const char *fail_edited(void (*edit)(cJSON *, const void *), const void *arg,
                               mt_status want)
{
    static mt_err err;
    mt_err_clear(&err);
    model_config *c = NULL;
    mt_status st = parse_edited(edit, arg, &c, &err);
    cr_assert_eq(st, want, "%s: %s", mt_status_str(st), err.msg);
    cr_assert_null(c);
    cr_assert_not_null(strstr(err.msg, "config.json"), "%s", err.msg);
    return err.msg;
}

static void drop(cJSON *j, const void *key) { cJSON_DeleteItemFromObject(j, key); }

typedef struct kv {
    const char *key, *json;
} kv;

static void set(cJSON *j, const void *arg)
{
    const kv *p = arg;
    cJSON_DeleteItemFromObject(j, p->key);
    cJSON_AddItemToObject(j, p->key, cJSON_Parse(p->json));
}

Test(config, glm52_fields)
{
    model_config *c = ok_edited(NULL, NULL);
    cr_assert_str_eq(c->architecture, "GlmMoeDsaForCausalLM");
    cr_assert_eq(c->hidden_size, 6144);
    cr_assert_eq(c->num_hidden_layers, 78);
    cr_assert_eq(c->first_k_dense_replace, 3);
    cr_assert_eq(c->intermediate_size, 12288);
    cr_assert_eq(c->moe_intermediate_size, 2048);
    cr_assert_eq(c->n_routed_experts, 256);
    cr_assert_eq(c->n_shared_experts, 1);
    cr_assert_eq(c->num_experts_per_tok, 8);
    cr_assert_eq(c->routed_scaling_factor, 2.5);
    cr_assert(c->norm_topk_prob);
    cr_assert_str_eq(c->scoring_func, "sigmoid");
    cr_assert_str_eq(c->topk_method, "noaux_tc");
    cr_assert_eq(c->num_attention_heads, 64);
    cr_assert_eq(c->q_lora_rank, 2048);
    cr_assert_eq(c->kv_lora_rank, 512);
    cr_assert_eq(c->qk_nope_head_dim, 192);
    cr_assert_eq(c->qk_rope_head_dim, 64);
    cr_assert_eq(c->v_head_dim, 256);
    cr_assert_eq(c->rope_theta, 8e6);
    cr_assert_str_eq(c->rope_type, "default");
    cr_assert(c->rope_interleave && c->indexer_rope_interleave);
    cr_assert_eq(c->index_topk, 2048);
    cr_assert_eq(c->index_n_heads, 32);
    cr_assert_eq(c->index_head_dim, 128);
    cr_assert_eq(c->index_topk_freq, 4);
    cr_assert_eq(c->index_skip_topk_offset, 3);
    cr_assert(c->index_share_for_mtp_iteration);
    cr_assert_eq(c->rms_norm_eps, 1e-5);
    cr_assert_eq(c->vocab_size, 154880);
    cr_assert_eq(c->num_nextn_predict_layers, 1);
    cr_assert_eq(c->layer_count, 79);
    cr_assert_eq(c->eos_count, 3);
    cr_assert_eq(c->eos_token_id[2], 154829);
    cr_assert_eq(c->pad_token_id, 154820);
    cr_assert_eq(c->bos_token_id, -1);
    cr_assert_str_eq(c->quant_method, "quark");
    cr_assert_not_null(c->quark);
    model_config_destroy(c);
}

Test(config, glm52_indexer_runs_on_21_layers_and_the_mtp_layer)
{
    model_config *c = ok_edited(NULL, NULL);
    /* GLM5.md: full layers 0, 1, 2, 6, 10, ..., 74. */
    int full = 0;
    for (int i = 0; i < 78; i++) {
        bool want = i < 3 || (i - 2) % 4 == 0;
        cr_assert_eq(c->layer_indexer_full[i], want, "layer %d", i);
        full += want;
    }
    cr_assert_eq(full, 21);
    cr_assert(c->layer_indexer_full[78], "MTP layer");
    for (int i = 0; i < 79; i++)
        cr_assert_eq(c->layer_moe[i], i >= 3, "layer %d", i);
    model_config_destroy(c);
}

Test(config, glm5_without_schedule_fields_indexes_every_layer)
{
    cJSON *j = cJSON_Parse(glm52);
    cJSON_DeleteItemFromObject(j, "index_topk_freq");
    cJSON_DeleteItemFromObject(j, "index_skip_topk_offset");
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    model_config *c = NULL;
    cr_assert_eq(model_config_parse(text, strlen(text), "config.json", &c, NULL), MT_OK);
    free(text);
    cr_assert_eq(c->index_topk_freq, 1);
    cr_assert_eq(c->index_skip_topk_offset, 2);
    for (int i = 0; i < 78; i++)
        cr_assert(c->layer_indexer_full[i], "layer %d", i);
    model_config_destroy(c);
}

static void types_list(cJSON *j, const void *arg)
{
    /* arg: a string of 'F'/'S' for the 78 layers. */
    const char *p = arg;
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; p[i]; i++)
        cJSON_AddItemToArray(a, cJSON_CreateString(p[i] == 'F' ? "full" : "shared"));
    cJSON_AddItemToObject(j, "indexer_types", a);
}

static char *rule_pattern(int freq, int offset)
{
    static char p[80];
    for (int i = 0; i < 78; i++)
        p[i] = model_config_indexer_rule(i, freq, offset) ? 'F' : 'S';
    p[78] = 0;
    return p;
}

Test(config, explicit_indexer_types_must_agree_with_freq_and_offset)
{
    model_config *c = ok_edited(types_list, rule_pattern(4, 3));
    model_config_destroy(c);
    char *p = rule_pattern(4, 3);
    p[40] = p[40] == 'F' ? 'S' : 'F';
    const char *msg = fail_edited(types_list, p, MT_E_FORMAT);
    cr_assert(strstr(msg, "layer 40") && strstr(msg, "disagree"), "%s", msg);
}

static void only_types(cJSON *j, const void *arg)
{
    cJSON_DeleteItemFromObject(j, "index_topk_freq");
    cJSON_DeleteItemFromObject(j, "index_skip_topk_offset");
    types_list(j, arg);
}

Test(config, explicit_indexer_types_alone_are_followed)
{
    char p[80];
    for (int i = 0; i < 78; i++)
        p[i] = (i % 3 == 0) ? 'F' : 'S';
    p[78] = 0;
    model_config *c = ok_edited(only_types, p);
    for (int i = 0; i < 78; i++)
        cr_assert_eq(c->layer_indexer_full[i], i % 3 == 0, "layer %d", i);
    model_config_destroy(c);
    p[0] = 'S';
    const char *msg = fail_edited(only_types, p, MT_E_FORMAT);
    cr_assert_not_null(strstr(msg, "layer 0"), "%s", msg);
    p[0] = 'F';
    p[77] = 0; /* 77 entries for 78 layers */
    msg = fail_edited(only_types, p, MT_E_FORMAT);
    cr_assert_not_null(strstr(msg, "indexer_types"), "%s", msg);
}

static void pattern_str(cJSON *j, const void *arg)
{
    cJSON_DeleteItemFromObject(j, "index_topk_freq");
    cJSON_DeleteItemFromObject(j, "index_skip_topk_offset");
    cJSON_AddStringToObject(j, "index_topk_pattern", arg);
}

Test(config, index_topk_pattern_letters)
{
    model_config *c = ok_edited(pattern_str, rule_pattern(2, 2));
    for (int i = 0; i < 78; i++)
        cr_assert_eq(c->layer_indexer_full[i], model_config_indexer_rule(i, 2, 2), "layer %d", i);
    model_config_destroy(c);
    char *p = rule_pattern(2, 2);
    p[5] = 'x';
    const char *msg = fail_edited(pattern_str, p, MT_E_FORMAT);
    cr_assert_not_null(strstr(msg, "index_topk_pattern\"[5]"), "%s", msg);
}

Test(config, every_required_key_is_reported_by_name)
{
    const char *required[] = {"hidden_size", "num_hidden_layers", "vocab_size",
                              "max_position_embeddings", "rms_norm_eps", "first_k_dense_replace",
                              "intermediate_size", "moe_intermediate_size", "n_routed_experts",
                              "n_shared_experts", "num_experts_per_tok", "routed_scaling_factor",
                              "norm_topk_prob", "num_attention_heads", "q_lora_rank",
                              "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                              "v_head_dim", "index_topk", "index_n_heads", "index_head_dim",
                              "rope_parameters"};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
        const char *msg = fail_edited(drop, required[i], MT_E_FORMAT);
        char want[96];
        snprintf(want, sizeof want, "\"%s", required[i]);
        cr_assert(strstr(msg, "missing required key") && strstr(msg, want), "%s: %s",
                  required[i], msg);
    }
}

Test(config, wrong_types_and_ranges_name_the_key)
{
    kv cases[] = {
        {"hidden_size", "\"6144\""},      {"hidden_size", "0"},
        {"num_hidden_layers", "1.5"},     {"num_experts_per_tok", "257"},
        {"norm_topk_prob", "1"},          {"rms_norm_eps", "-1"},
        {"scoring_func", "\"relu\""},     {"hidden_act", "\"gelu\""},
        {"model_type", "\"llama\""},      {"num_key_value_heads", "8"},
        {"qk_rope_head_dim", "63"},       {"index_head_dim", "32"},
        {"n_group", "3"},                 {"eos_token_id", "[1, 999999]"},
        {"mlp_layer_types", "[\"dense\"]"},
        {"quantization_config", "{\"quant_method\":\"quark\",\"global_quant_config\":{},"
                                "\"exclude\":[\"re:[\"]}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        model_config *c = NULL;
        mt_err err = MT_ERR_INIT;
        mt_status st = parse_edited(set, &cases[i], &c, &err);
        cr_assert_neq(st, MT_OK, "%s = %s was accepted", cases[i].key, cases[i].json);
        cr_assert_null(c);
        const char *key = !strcmp(cases[i].key, "quantization_config") ? "exclude[0]"
                          : !strcmp(cases[i].key, "index_head_dim") ? "index_head_dim"
                                                                    : cases[i].key;
        cr_assert_not_null(strstr(err.msg, key), "%s: %s", cases[i].key, err.msg);
    }
}

Test(config, unknown_fields_are_ignored_and_optional_ones_default)
{
    kv extra = {"some_future_field", "{\"nested\":[1,2,3]}"};
    model_config *c = ok_edited(set, &extra);
    model_config_destroy(c);
    const char *optional[] = {"num_key_value_heads", "n_group", "topk_group", "scoring_func",
                              "topk_method", "rope_interleave", "indexer_rope_interleave",
                              "num_nextn_predict_layers", "tie_word_embeddings", "eos_token_id",
                              "pad_token_id", "moe_layer_freq", "hidden_act", "model_type",
                              "quantization_config", "architectures"};
    for (size_t i = 0; i < sizeof optional / sizeof *optional; i++) {
        c = ok_edited(drop, optional[i]);
        model_config_destroy(c);
    }
    c = ok_edited(drop, "num_nextn_predict_layers");
    cr_assert_eq(c->layer_count, 78);
    model_config_destroy(c);
    c = ok_edited(drop, "quantization_config");
    cr_assert_null(c->quark);
    cr_assert_str_eq(c->quant_method, "");
    model_config_destroy(c);
}

Test(config, rope_theta_spellings_and_other_quant_methods)
{
    kv legacy = {"rope_parameters", "null"};
    const char *msg = fail_edited(set, &legacy, MT_E_FORMAT);
    cr_assert_not_null(strstr(msg, "rope_theta"), "%s", msg);
    cJSON *j = cJSON_Parse(glm52);
    cJSON_DeleteItemFromObject(j, "rope_parameters");
    cJSON_AddNumberToObject(j, "rope_theta", 1000000);
    cJSON_AddItemToObject(j, "rope_scaling", cJSON_Parse("{\"type\":\"yarn\",\"factor\":4}"));
    cJSON_DeleteItemFromObject(j, "quantization_config");
    cJSON_AddItemToObject(j, "quantization_config",
                          cJSON_Parse("{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128]}"));
    cJSON_DeleteItemFromObject(j, "q_lora_rank");
    cJSON_AddNullToObject(j, "q_lora_rank");
    cJSON_DeleteItemFromObject(j, "eos_token_id");
    cJSON_AddNumberToObject(j, "eos_token_id", 7);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    model_config *c = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_config_parse(text, strlen(text), "config.json", &c, &err), MT_OK, "%s",
                 err.msg);
    free(text);
    cr_assert_eq(c->rope_theta, 1e6);
    cr_assert_str_eq(c->rope_type, "yarn");
    cr_assert_str_eq(c->quant_method, "fp8");
    cr_assert_null(c->quark);
    cr_assert_eq(c->q_lora_rank, 0);
    cr_assert_eq(c->eos_count, 1);
    cr_assert_eq(c->eos_token_id[0], 7);
    model_config_destroy(c);
}

Test(config, mlp_layer_types_must_agree_with_first_k_dense_replace)
{
    char buf[2048] = "[";
    for (int i = 0; i < 78; i++)
        strcat(buf, i == 0 ? "\"dense\"" : i < 4 ? ",\"dense\"" : ",\"sparse\"");
    strcat(buf, "]");
    kv bad = {"mlp_layer_types", buf};
    const char *msg = fail_edited(set, &bad, MT_E_FORMAT);
    cr_assert(strstr(msg, "mlp_layer_types\"[3]") && strstr(msg, "first_k_dense_replace"), "%s",
              msg);
}

Test(config, damaged_text_never_crashes)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    size_t len = strlen(glm52);
    char *buf = malloc(len + 1);
    int accepted = 0;
    for (int it = 0; it < 2000; it++) {
        memcpy(buf, glm52, len + 1);
        int flips = 1 + (int)mt_rng_below(&r, 3);
        for (int k = 0; k < flips; k++)
            buf[mt_rng_below(&r, len)] = (char)(' ' + mt_rng_below(&r, 95));
        size_t cut = mt_rng_below(&r, 8) ? len : mt_rng_below(&r, len);
        model_config *c = NULL;
        mt_err err = MT_ERR_INIT;
        if (model_config_parse(buf, cut, "config.json", &c, &err) == MT_OK) {
            accepted++;
            cr_assert_geq(c->layer_count, c->num_hidden_layers, "seed %llu",
                          (unsigned long long)seed);
            model_config_destroy(c);
        } else {
            cr_assert_not_null(strstr(err.msg, "config.json"), "seed %llu: %s",
                               (unsigned long long)seed, err.msg);
        }
    }
    cr_log_info("damaged configs accepted: %d of 2000 (seed %llu)", accepted,
                (unsigned long long)seed);
    free(buf);
}

/* ---- RoPE types and YaRN fields ------------------------------------------------- */

static void set_rope(cJSON *j, const void *arg)
{
    const kv *p = arg; /* key: "rope_parameters" or "rope_scaling"; json: the object */
    cJSON_DeleteItemFromObject(j, "rope_parameters");
    cJSON_AddNumberToObject(j, "rope_theta", 8000000);
    cJSON_AddItemToObject(j, p->key, cJSON_Parse(p->json));
}

Test(config, other_rope_types_are_refused_naming_the_field_and_value)
{
    const char *types[] = {"linear", "dynamic", "llama3", "longrope", "ntk", "deepseek_yarn"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char obj[128], want[128];
        snprintf(obj, sizeof obj, "{\"rope_type\":\"%s\",\"factor\":4}", types[i]);
        const char *msg = fail_edited(set_rope, &(kv){"rope_parameters", obj}, MT_E_UNSUPPORTED);
        snprintf(want, sizeof want, "\"rope_parameters.rope_type\" is \"%s\"", types[i]);
        cr_expect_not_null(strstr(msg, want), "%s", msg);
        snprintf(obj, sizeof obj, "{\"type\":\"%s\",\"factor\":4}", types[i]);
        msg = fail_edited(set_rope, &(kv){"rope_scaling", obj}, MT_E_UNSUPPORTED);
        snprintf(want, sizeof want, "\"rope_scaling.type\" is \"%s\"", types[i]);
        cr_expect_not_null(strstr(msg, want), "%s", msg);
    }
    const char *msg = fail_edited(set_rope, &(kv){"rope_scaling", "{\"type\":7}"}, MT_E_FORMAT);
    cr_expect_not_null(strstr(msg, "\"rope_scaling.type\" must be a string"), "%s", msg);
    msg = fail_edited(set_rope, &(kv){"rope_scaling", "[1]"}, MT_E_FORMAT);
    cr_expect_not_null(strstr(msg, "\"rope_scaling\""), "%s", msg);
}

Test(config, bad_yarn_fields_are_refused_naming_the_field)
{
    const struct {
        const char *obj, *field;
    } bad[] = {
        {"{\"rope_type\":\"yarn\"}", "missing required key \"rope_parameters.factor\""},
        {"{\"rope_type\":\"yarn\",\"factor\":0}", "\"rope_parameters.factor\" is 0"},
        {"{\"rope_type\":\"yarn\",\"factor\":-2}", "\"rope_parameters.factor\" is -2"},
        {"{\"rope_type\":\"yarn\",\"factor\":\"4\"}", "\"rope_parameters.factor\" must be a number"},
        {"{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":0}",
         "\"rope_parameters.original_max_position_embeddings\""},
        {"{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":40.5}",
         "\"rope_parameters.original_max_position_embeddings\""},
        {"{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":\"4096\"}",
         "\"rope_parameters.original_max_position_embeddings\""},
        {"{\"rope_type\":\"yarn\",\"factor\":4,\"beta_fast\":\"32\"}",
         "\"rope_parameters.beta_fast\" must be a number"},
        {"{\"rope_type\":\"yarn\",\"factor\":4,\"beta_slow\":-1}", "\"rope_parameters.beta_slow\""},
        {"{\"rope_type\":\"yarn\",\"factor\":4,\"mscale\":true}",
         "\"rope_parameters.mscale\" must be a number"},
        {"{\"rope_type\":\"yarn\",\"factor\":4,\"mscale_all_dim\":[1]}",
         "\"rope_parameters.mscale_all_dim\" must be a number"},
        {"{\"rope_type\":\"yarn\",\"factor\":4,\"attention_factor\":0}",
         "\"rope_parameters.attention_factor\" is 0"},
        {"{\"rope_type\":\"yarn\",\"factor\":4,\"truncate\":1}",
         "\"rope_parameters.truncate\" must be true or false"},
        {"{\"rope_type\":\"yarn\",\"factor\":4,\"partial_rotary_factor\":0.5}",
         "\"rope_parameters.partial_rotary_factor\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mt_err err = MT_ERR_INIT;
        model_config *c = NULL;
        mt_status st = parse_edited(set_rope, &(kv){"rope_parameters", bad[i].obj}, &c, &err);
        cr_expect_neq(st, MT_OK, "%s was accepted", bad[i].obj);
        cr_expect_null(c);
        cr_expect_not_null(strstr(err.msg, bad[i].field), "%s: %s", bad[i].obj, err.msg);
        model_config_destroy(c);
    }
    const char *msg = fail_edited(set_rope, &(kv){"rope_scaling", "{\"type\":\"yarn\",\"factor\":"
                                                  "0}"}, MT_E_FORMAT);
    cr_expect_not_null(strstr(msg, "\"rope_scaling.factor\" is 0"), "%s", msg);
}

Test(config, yarn_defaults_follow_transformers)
{
    /* Only the factor: original context = max_position_embeddings, betas
     * 32 / 1, truncate, attention factor get_mscale(factor), no softmax
     * correction. */
    model_config *c = ok_edited(set_rope, &(kv){"rope_scaling", "{\"type\":\"yarn\",\"factor\":4}"});
    cr_assert_eq(c->rope_kind, MODEL_ROPE_YARN);
    cr_assert_str_eq(c->rope_type, "yarn");
    cr_assert_eq(c->yarn.factor, 4);
    cr_assert_eq(c->yarn.original_max_position_embeddings, 202752);
    cr_assert_eq(c->yarn.beta_fast, 32);
    cr_assert_eq(c->yarn.beta_slow, 1);
    cr_assert_eq(c->yarn.mscale, 0);
    cr_assert_eq(c->yarn.mscale_all_dim, 0);
    cr_assert(c->yarn.truncate);
    cr_assert_float_eq(c->yarn.attention_factor, 0.1 * log(4.0) + 1, 1e-15);
    cr_assert_eq(c->yarn.softmax_mult, 1);
    model_config_destroy(c);
    /* 0 and null betas mean the defaults (transformers: `value or 32`);
     * null factor is max_position_embeddings / original; rope_theta inside
     * the object wins over the top-level one. */
    c = ok_edited(set_rope, &(kv){"rope_parameters", "{\"rope_type\":\"yarn\",\"factor\":null,"
                                  "\"rope_theta\":1000,\"original_max_position_embeddings\":"
                                  "50688,\"beta_fast\":0,\"beta_slow\":null,\"mscale\":null}"});
    cr_assert_eq(c->rope_theta, 1000);
    cr_assert_eq(c->yarn.factor, 4);
    cr_assert_eq(c->yarn.beta_fast, 32);
    cr_assert_eq(c->yarn.beta_slow, 1);
    model_config_destroy(c);
    /* A top-level original_max_position_embeddings wins (transformers 5's
     * standardization); rope_scaling wins over rope_parameters. */
    cJSON *j = cJSON_Parse(glm52);
    cJSON_AddNumberToObject(j, "original_max_position_embeddings", 8192);
    cJSON_AddItemToObject(j, "rope_scaling", cJSON_Parse("{\"type\":\"yarn\",\"factor\":40,\"rope_theta\":8e6,"
                          "\"original_max_position_embeddings\":4096,\"mscale_all_dim\":1,"
                          "\"truncate\":false}"));
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_config_parse(text, strlen(text), "config.json", &c, &err), MT_OK, "%s",
                 err.msg);
    free(text);
    cr_assert_eq(c->rope_kind, MODEL_ROPE_YARN);
    cr_assert_eq(c->rope_theta, 8e6);
    cr_assert_eq(c->yarn.original_max_position_embeddings, 8192);
    cr_assert(!c->yarn.truncate);
    double m = 0.1 * log(40.0) + 1;
    cr_assert_float_eq(c->yarn.softmax_mult, m * m, 1e-15);
    cr_assert_float_eq(model_config_softmax_scale(c), m * m / 16, 1e-15);
    model_config_destroy(c);
    /* Plain RoPE: rope_kind default, no correction. */
    c = ok_edited(NULL, NULL);
    cr_assert_eq(c->rope_kind, MODEL_ROPE_DEFAULT);
    cr_assert_eq(model_config_softmax_scale(c), 1.0 / 16);
    model_config_destroy(c);
}
