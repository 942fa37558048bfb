/* test_quark.c: Quark quantization_config rules (exclude globs and
 * regular expressions, layer_quant_config, layer_type_quant_config, global)
 * and the file-decides format resolution, including the published MTP
 * shared-expert failure. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/format/quark.h"
#include "model/format/safetensors.h"

#define MX "{\"dtype\":\"fp4\",\"qscheme\":\"per_group\",\"group_size\":32,\"scale_format\":\"e8m0\"," \
           "\"is_dynamic\":false}"
#define MXD "{\"dtype\":\"fp4\",\"qscheme\":\"per_group\",\"group_size\":32,\"scale_format\":\"e8m0\"," \
            "\"is_dynamic\":true}"
#define FP8 "{\"dtype\":\"fp8_e4m3\",\"qscheme\":\"per_tensor\",\"is_dynamic\":false}"

static model_quark *quark(const char *json)
{
    cJSON *j = cJSON_Parse(json);
    cr_assert_not_null(j, "bad test JSON: %s", json);
    model_quark *q = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_quark_parse(j, &q, &err), MT_OK, "%s", err.msg);
    cJSON_Delete(j);
    return q;
}

static const char *quark_fails(const char *json, mt_status want)
{
    static mt_err err;
    mt_err_clear(&err);
    cJSON *j = cJSON_Parse(json);
    cr_assert_not_null(j);
    model_quark *q = NULL;
    cr_assert_eq(model_quark_parse(j, &q, &err), want, "%s", err.msg);
    cr_assert_null(q);
    cJSON_Delete(j);
    return err.msg;
}

/* The GLM-5.2-MXFP4 shape of config: routed and shared experts MXFP4 w4a4. */
static model_quark *glm52(const char *extra_exclude)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"quant_method\":\"quark\",\"global_quant_config\":{\"weight\":" MX
             ",\"input_tensors\":" MXD "},\"exclude\":[\"*self_attn*\",\"*mlp.gate\",\"*lm_head\","
             "\"re:model\\\\.layers\\\\.[0-2]\\\\.mlp\\\\..*\"%s],\"layer_quant_config\":{},"
             "\"layer_type_quant_config\":{}}",
             extra_exclude);
    return quark(json);
}

static model_qkind kind_of(const model_quark *q, const char *module)
{
    model_quark_match m;
    model_quark_lookup(q, module, &m);
    return m.weight.kind;
}

Test(quark_lookup, glm52_excludes_attention_router_lm_head_and_dense_mlp)
{
    model_quark *q = glm52(",\"*layers.78.*\"");
    cr_assert_eq(kind_of(q, "model.layers.3.mlp.experts.17.gate_proj"), MODEL_QKIND_MXFP4);
    cr_assert_eq(kind_of(q, "model.layers.3.mlp.shared_experts.down_proj"), MODEL_QKIND_MXFP4);
    cr_assert_eq(kind_of(q, "model.layers.3.self_attn.q_a_proj"), MODEL_QKIND_NONE);
    cr_assert_eq(kind_of(q, "model.layers.3.self_attn.indexer.wk"), MODEL_QKIND_NONE);
    cr_assert_eq(kind_of(q, "model.layers.3.mlp.gate"), MODEL_QKIND_NONE);
    cr_assert_eq(kind_of(q, "lm_head"), MODEL_QKIND_NONE);
    cr_assert_eq(kind_of(q, "model.layers.1.mlp.up_proj"), MODEL_QKIND_NONE);
    cr_assert_eq(kind_of(q, "model.layers.78.mlp.shared_experts.up_proj"), MODEL_QKIND_NONE);
    /* "*mlp.gate" is a whole-name glob: it does not catch gate_proj. */
    cr_assert_eq(kind_of(q, "model.layers.5.mlp.experts.0.gate_proj"), MODEL_QKIND_MXFP4);
    /* The regex is anchored at the start only (re.match): layer 20 is not 2. */
    cr_assert_eq(kind_of(q, "model.layers.20.mlp.experts.0.up_proj"), MODEL_QKIND_MXFP4);
    model_quark_match m;
    model_quark_lookup(q, "model.layers.3.mlp.experts.1.up_proj", &m);
    cr_assert_eq(m.input.kind, MODEL_QKIND_MXFP4);
    cr_assert(m.input.is_dynamic);
    cr_assert_not_null(strstr(m.rule, "global_quant_config"), "%s", m.rule);
    model_quark_lookup(q, "model.layers.2.mlp.gate_proj", &m);
    cr_assert_str_eq(m.exclude_pattern, "re:model\\.layers\\.[0-2]\\.mlp\\..*");
    model_quark_destroy(q);
}

Test(quark_lookup, regex_uses_re_match_semantics)
{
    model_quark *q = quark("{\"quant_method\":\"quark\",\"global_quant_config\":{\"weight\":" MX
                           "},\"exclude\":[\"re:layers\\\\.3\",\"re:.*experts\\\\.(1|2)\\\\.\"]}");
    cr_assert_eq(kind_of(q, "model.layers.3.mlp.experts.0.up_proj"), MODEL_QKIND_MXFP4);
    cr_assert_eq(kind_of(q, "layers.3.anything"), MODEL_QKIND_NONE);
    cr_assert_eq(kind_of(q, "model.layers.3.mlp.experts.2.up_proj"), MODEL_QKIND_NONE);
    cr_assert_eq(kind_of(q, "model.layers.3.mlp.experts.12.up_proj"), MODEL_QKIND_MXFP4);
    cr_assert_eq(model_quark_exclude_count(q), 2);
    model_quark_destroy(q);
}

Test(quark_lookup, exclude_then_layer_then_type_then_global)
{
    model_quark *q = quark(
        "{\"quant_method\":\"quark\",\"global_quant_config\":{\"weight\":" FP8 "},"
        "\"layer_quant_config\":{\"*experts*\":{\"weight\":" MX ",\"input_tensors\":null},"
        "\"*experts.0.*\":{\"weight\":null}},"
        "\"layer_type_quant_config\":{\"Linear\":{\"weight\":{\"dtype\":\"int4\","
        "\"qscheme\":\"per_group\",\"group_size\":128}}},"
        "\"exclude\":[\"*experts.9.*\"]}");
    model_quark_match m;
    model_quark_lookup(q, "m.experts.0.up_proj", &m);
    cr_assert_eq(m.weight.kind, MODEL_QKIND_MXFP4, "first matching key wins: %s", m.rule);
    cr_assert_eq(m.input.kind, MODEL_QKIND_NONE);
    model_quark_lookup(q, "m.experts.9.up_proj", &m);
    cr_assert_eq(m.weight.kind, MODEL_QKIND_NONE);
    cr_assert_not_null(strstr(m.rule, "exclude"));
    model_quark_lookup(q, "m.self_attn.o_proj", &m);
    cr_assert_eq(m.weight.kind, MODEL_QKIND_OTHER);
    cr_assert_not_null(strstr(m.rule, "Linear"), "%s", m.rule);
    cr_assert_not_null(strstr(m.weight.desc, "int4"), "%s", m.weight.desc);
    model_quark_lookup(NULL, "anything", &m);
    cr_assert_eq(m.weight.kind, MODEL_QKIND_NONE);
    model_quark_destroy(q);
}

Test(quark_parse, spec_kinds)
{
    struct {
        const char *spec;
        model_qkind kind;
    } cases[] = {
        {MX, MODEL_QKIND_MXFP4},
        {"{\"dtype\":\"mx\",\"mx_element_dtype\":\"fp4\",\"qscheme\":\"per_group\",\"group_size\":32}",
         MODEL_QKIND_MXFP4},
        {"{\"dtype\":\"fp4\",\"qscheme\":\"per_group\",\"group_size\":16,\"scale_format\":\"e8m0\"}",
         MODEL_QKIND_OTHER},
        {"{\"dtype\":\"fp4\",\"qscheme\":\"per_group\",\"group_size\":32,\"scale_format\":\"e4m3\"}",
         MODEL_QKIND_OTHER},
        {FP8, MODEL_QKIND_FP8_E4M3},
        {"{\"dtype\":\"fp8_e4m3\",\"qscheme\":\"per_group\",\"group_size\":128}", MODEL_QKIND_OTHER},
        {"null", MODEL_QKIND_NONE},
        {"[" MX "," MX "]", MODEL_QKIND_OTHER},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"quant_method\":\"quark\",\"global_quant_config\":{\"weight\":%s}}",
                 cases[i].spec);
        model_quark *q = quark(json);
        cr_assert_eq(kind_of(q, "x"), cases[i].kind, "case %zu", i);
        model_quark_destroy(q);
    }
}

Test(quark_parse, errors_name_the_key)
{
    const char *msg = quark_fails("{\"quant_method\":\"quark\",\"global_quant_config\":{\"weight\":"
                                  MX "},\"exclude\":[\"ok\",\"re:(unclosed\"]}", MT_E_FORMAT);
    cr_assert(strstr(msg, "exclude[1]") && strstr(msg, "offset"), "%s", msg);
    msg = quark_fails("{\"quant_method\":\"quark\"}", MT_E_FORMAT);
    cr_assert_not_null(strstr(msg, "global_quant_config"), "%s", msg);
    msg = quark_fails("{\"quant_method\":\"quark\",\"global_quant_config\":{\"weight\":{\"qscheme\":"
                      "\"per_group\"}}}", MT_E_FORMAT);
    cr_assert_not_null(strstr(msg, "global_quant_config.weight.dtype"), "%s", msg);
    msg = quark_fails("{\"quant_method\":\"quark\",\"global_quant_config\":{},\"exclude\":[3]}",
                      MT_E_FORMAT);
    cr_assert_not_null(strstr(msg, "exclude[0]"), "%s", msg);
    msg = quark_fails("{\"quant_method\":\"quark\",\"global_quant_config\":{},"
                      "\"layer_quant_config\":{\"*x*\":{\"weight\":{\"dtype\":\"fp4\","
                      "\"group_size\":\"32\"}}}}", MT_E_FORMAT);
    cr_assert_not_null(strstr(msg, "layer_quant_config[\"*x*\"].weight.group_size"), "%s", msg);
    msg = quark_fails("{\"quant_method\":\"gptq\",\"global_quant_config\":{}}", MT_E_UNSUPPORTED);
    cr_assert_not_null(strstr(msg, "gptq"), "%s", msg);
}

/* ---- resolve: the file decides ------------------------------------------- */

typedef struct fake {
    uint8_t *buf;
    model_st_file *f;
} fake;

/* One safetensors image holding the given tensors (dtype, 2-D shape). */
static fake make(int n, const char *const *names, const model_dtype *dts, const int64_t (*shapes)[2])
{
    model_st_writer *w;
    cr_assert_eq(model_st_writer_create(&w, NULL), MT_OK);
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)(shapes[i][0] * shapes[i][1]) * model_dtype_size(dts[i]);
        void *zero = calloc(1, bytes + 1);
        cr_assert_eq(model_st_writer_add(w, names[i], dts[i], 2, shapes[i], zero, bytes, NULL),
                     MT_OK);
        free(zero);
    }
    fake fk = {0};
    size_t len;
    cr_assert_eq(model_st_writer_serialize(w, &fk.buf, &len, NULL), MT_OK);
    model_st_writer_destroy(w);
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_st_open_memory("ckpt.safetensors", fk.buf, len, &fk.f, &err), MT_OK, "%s",
                 err.msg);
    return fk;
}

static void unmake(fake *fk)
{
    model_st_close(fk->f);
    free(fk->buf);
}

static mt_status resolve(const model_quark *q, const fake *fk, const char *module, int64_t out,
                         int64_t in, model_linear *lin, char *warn, mt_err *err)
{
    char name[256];
    snprintf(name, sizeof name, "%s.weight", module);
    const model_tensor_info *w = model_st_find(fk->f, name);
    cr_assert_not_null(w, "%s", name);
    snprintf(name, sizeof name, "%s.weight_scale", module);
    return model_quark_resolve(q, module, w, model_st_find(fk->f, name), out, in, lin, warn, 1024,
                               err);
}

#define SE "model.layers.78.mlp.shared_experts.gate_proj"

Test(quark_resolve, mtp_shared_expert_bf16_under_another_prefix_loads_as_bf16_with_a_warning)
{
    /* The exclude entry names the MTP module under the engine's prefix, so the
     * config says MXFP4 for the checkpoint's name; the file holds bf16. */
    model_quark *q = glm52(",\"model.decoder.mlp.shared_experts.*\"");
    const char *names[] = {SE ".weight"};
    model_dtype dts[] = {MODEL_DTYPE_BF16};
    int64_t shapes[][2] = {{2048, 6144}};
    fake fk = make(1, names, dts, shapes);
    model_linear lin;
    char warn[1024];
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(resolve(q, &fk, SE, 2048, 6144, &lin, warn, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(lin.fmt, MODEL_WFMT_BF16);
    cr_assert_eq(lin.out, 2048);
    cr_assert_eq(lin.in, 6144);
    cr_assert_null(lin.scale);
    cr_assert(!lin.act_mxfp4);
    cr_assert(strstr(warn, SE) && strstr(warn, "says mxfp4") &&
              strstr(warn, "'model.decoder.mlp.shared_experts.*'") &&
              strstr(warn, "another prefix") && strstr(warn, "loading it as stored (bf16)"),
              "%s", warn);
    model_quark_destroy(q);
    /* With the checkpoint's own name in the exclude list there is nothing to say. */
    q = glm52(",\"model.layers.78.mlp.shared_experts.*\"");
    cr_assert_eq(resolve(q, &fk, SE, 2048, 6144, &lin, warn, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(lin.fmt, MODEL_WFMT_BF16);
    cr_assert_str_eq(warn, "");
    model_quark_destroy(q);
    unmake(&fk);
}

Test(quark_resolve, mxfp4_experts_with_w4a4)
{
    model_quark *q = glm52("");
    const char *m = "model.layers.3.mlp.experts.0.down_proj";
    const char *names[] = {"model.layers.3.mlp.experts.0.down_proj.weight",
                           "model.layers.3.mlp.experts.0.down_proj.weight_scale"};
    model_dtype dts[] = {MODEL_DTYPE_U8, MODEL_DTYPE_U8};
    int64_t shapes[][2] = {{6144, 1024}, {6144, 64}};
    fake fk = make(2, names, dts, shapes);
    model_linear lin;
    char warn[1024];
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(resolve(q, &fk, m, 6144, 2048, &lin, warn, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(lin.fmt, MODEL_WFMT_MXFP4);
    cr_assert_eq(lin.in, 2048);
    cr_assert(lin.act_mxfp4);
    cr_assert_not_null(lin.scale);
    cr_assert_str_eq(warn, "");
    /* The expected input width is checked against the packed width. */
    cr_assert_eq(resolve(q, &fk, m, 6144, 1024, &lin, warn, &err), MT_E_FORMAT);
    cr_assert(strstr(err.msg, "down_proj.weight") && strstr(err.msg, "ckpt.safetensors") &&
              strstr(err.msg, "byte") && strstr(err.msg, "in 1024"), "%s", err.msg);
    model_quark_destroy(q);
    /* An MXFP4 tensor the config excluded still loads as MXFP4, with a warning. */
    q = glm52(",\"*experts.0.*\"");
    cr_assert_eq(resolve(q, &fk, m, 6144, 2048, &lin, warn, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(lin.fmt, MODEL_WFMT_MXFP4);
    cr_assert(!lin.act_mxfp4);
    cr_assert(strstr(warn, "'*experts.0.*'") && strstr(warn, "unquantized"), "%s", warn);
    model_quark_destroy(q);
    /* No quantization_config at all: the file still decides. */
    cr_assert_eq(resolve(NULL, &fk, m, 6144, 2048, &lin, warn, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(lin.fmt, MODEL_WFMT_MXFP4);
    cr_assert_not_null(strstr(warn, "no quantization_config"), "%s", warn);
    unmake(&fk);
}

Test(quark_resolve, inconsistent_tensors_are_errors_naming_them)
{
    model_quark *q = glm52("");
    const char *names[] = {"a.weight",       "b.weight", "b.weight_scale", "c.weight",
                           "c.weight_scale", "d.weight", "e.weight",       "e.weight_scale",
                           "f.weight",       "f.weight_scale"};
    model_dtype dts[] = {MODEL_DTYPE_U8,   MODEL_DTYPE_U8,      MODEL_DTYPE_U8,
                         MODEL_DTYPE_BF16, MODEL_DTYPE_U8,      MODEL_DTYPE_I32,
                         MODEL_DTYPE_F8_E4M3, MODEL_DTYPE_F32, MODEL_DTYPE_F8_E4M3,
                         MODEL_DTYPE_F32};
    int64_t shapes[][2] = {{64, 32}, {64, 32}, {64, 3}, {64, 64}, {64, 2},
                           {64, 64}, {64, 64}, {1, 1},  {64, 64}, {2, 2}};
    fake fk = make(10, names, dts, shapes);
    struct {
        const char *module;
        mt_status st;
        const char *needle;
    } cases[] = {
        {"a", MT_E_FORMAT, "no 'a.weight_scale'"},
        {"b", MT_E_FORMAT, "expected U8[64, 2]"},
        {"c", MT_E_FORMAT, "comes with a scale"},
        {"d", MT_E_UNSUPPORTED, "I32[64, 64]"},
        {"f", MT_E_FORMAT, "1 or 64 values"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        model_linear lin;
        char warn[1024];
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(resolve(q, &fk, cases[i].module, 64, 64, &lin, warn, &err), cases[i].st,
                     "%s: %s", cases[i].module, err.msg);
        cr_assert(strstr(err.msg, cases[i].needle) && strstr(err.msg, "ckpt.safetensors"),
                  "%s: %s", cases[i].module, err.msg);
    }
    /* fp8 with a per-tensor scale is a valid format of its own. */
    model_linear lin;
    char warn[1024];
    cr_assert_eq(resolve(q, &fk, "e", 64, 64, &lin, warn, NULL), MT_OK);
    cr_assert_eq(lin.fmt, MODEL_WFMT_FP8_E4M3);
    cr_assert_not_null(strstr(warn, "fp8_e4m3"), "%s", warn);
    unmake(&fk);
    model_quark_destroy(q);
}

Test(quark_resolve, bf16_with_wrong_dims_is_an_error_not_a_crash)
{
    /* The published shape mismatch the other way round: a full-width bf16
     * tensor where half-width packed data would go is only legal when the
     * logical dims match. */
    model_quark *q = glm52("");
    const char *names[] = {"x.weight"};
    model_dtype dts[] = {MODEL_DTYPE_BF16};
    int64_t shapes[][2] = {{128, 128}};
    fake fk = make(1, names, dts, shapes);
    model_linear lin;
    char warn[1024];
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(resolve(q, &fk, "x", 128, 256, &lin, warn, &err), MT_E_FORMAT);
    cr_assert(strstr(err.msg, "x.weight") && strstr(err.msg, "BF16[128, 128]") &&
              strstr(err.msg, "in 256"), "%s", err.msg);
    unmake(&fk);
    model_quark_destroy(q);
}
