/* quark.c: Quark quantization_config parsing, per-module config lookup, and
 * the file-decides format resolution of each linear (see quark.h). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "quark.h"

#include <cjson/cJSON.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const wfmt_names[MODEL_WFMT_COUNT] = {
    [MODEL_WFMT_BF16] = "bf16",   [MODEL_WFMT_F16] = "f16",
    [MODEL_WFMT_F32] = "f32",     [MODEL_WFMT_MXFP4] = "mxfp4",
    [MODEL_WFMT_FP8_E4M3] = "fp8_e4m3",
};
_Static_assert(sizeof wfmt_names / sizeof wfmt_names[0] == MODEL_WFMT_COUNT, "wfmt table");

static const char *const qkind_names[MODEL_QKIND_COUNT] = {
    [MODEL_QKIND_NONE] = "unquantized",
    [MODEL_QKIND_MXFP4] = "mxfp4",
    [MODEL_QKIND_FP8_E4M3] = "fp8_e4m3",
    [MODEL_QKIND_OTHER] = "another scheme",
};
_Static_assert(sizeof qkind_names / sizeof qkind_names[0] == MODEL_QKIND_COUNT, "qkind table");

const char *model_wfmt_name(model_wfmt f)
{
    return (unsigned)f < MODEL_WFMT_COUNT ? wfmt_names[f] : "?";
}

const char *model_qkind_name(model_qkind k)
{
    return (unsigned)k < MODEL_QKIND_COUNT ? qkind_names[k] : "?";
}

typedef struct qpattern {
    char *text;      /* as written, including any "re:" */
    pcre2_code *re;  /* NULL for a glob */
} qpattern;

typedef struct qcfg {
    char *pattern; /* layer_quant_config key; NULL otherwise */
    model_qspec weight, input;
} qcfg;

struct model_quark {
    qpattern *exclude;
    size_t exclude_count;
    qcfg *layer;
    size_t layer_count;
    bool has_linear_type;
    qcfg linear_type, global;
};

void model_quark_destroy(model_quark *q)
{
    if (!q)
        return;
    for (size_t i = 0; i < q->exclude_count; i++) {
        free(q->exclude[i].text);
        pcre2_code_free(q->exclude[i].re);
    }
    free(q->exclude);
    for (size_t i = 0; i < q->layer_count; i++)
        free(q->layer[i].pattern);
    free(q->layer);
    free(q);
}

static const char *jstr(const cJSON *o, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

/* Parses one QuantizationSpec (or null) found at `where`. */
static mt_status parse_spec(const cJSON *j, const char *where, model_qspec *s, mt_err *err)
{
    memset(s, 0, sizeof *s);
    if (!j || cJSON_IsNull(j)) {
        snprintf(s->desc, sizeof s->desc, "none");
        return MT_OK;
    }
    if (cJSON_IsArray(j)) {
        s->kind = MODEL_QKIND_OTHER;
        snprintf(s->desc, sizeof s->desc, "a list of %d specs", cJSON_GetArraySize(j));
        return MT_OK;
    }
    if (!cJSON_IsObject(j))
        return mt_fail(err, MT_E_FORMAT, "%s: expected an object or null", where);
    const char *dtype = jstr(j, "dtype");
    if (!dtype)
        return mt_fail(err, MT_E_FORMAT, "%s.dtype: missing or not a string", where);
    const char *qscheme = jstr(j, "qscheme");
    const char *scale_format = jstr(j, "scale_format");
    const char *mx_elem = jstr(j, "mx_element_dtype");
    const cJSON *gs = cJSON_GetObjectItemCaseSensitive(j, "group_size");
    if (gs && !cJSON_IsNull(gs)) {
        if (!cJSON_IsNumber(gs) || gs->valuedouble != (double)(int)gs->valuedouble ||
            gs->valuedouble < 0)
            return mt_fail(err, MT_E_FORMAT, "%s.group_size: not a non-negative integer", where);
        s->group_size = (int)gs->valuedouble;
    }
    const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(j, "is_dynamic");
    if (dyn && !cJSON_IsNull(dyn)) {
        if (!cJSON_IsBool(dyn))
            return mt_fail(err, MT_E_FORMAT, "%s.is_dynamic: not a boolean", where);
        s->is_dynamic = cJSON_IsTrue(dyn);
    }
    bool fp4 = !strcmp(dtype, "fp4") || (!strcmp(dtype, "mx") && mx_elem && !strcmp(mx_elem, "fp4"));
    if (fp4 && (!qscheme || !strcmp(qscheme, "per_group")) && s->group_size == 32 &&
        (!scale_format || !strcmp(scale_format, "e8m0")))
        s->kind = MODEL_QKIND_MXFP4;
    else if (!strcmp(dtype, "fp8_e4m3") && qscheme &&
             (!strcmp(qscheme, "per_tensor") || !strcmp(qscheme, "per_channel")))
        s->kind = MODEL_QKIND_FP8_E4M3;
    else
        s->kind = MODEL_QKIND_OTHER;
    char group[24] = "";
    if (s->group_size)
        snprintf(group, sizeof group, " group %d", s->group_size);
    snprintf(s->desc, sizeof s->desc, "%s%s%s%s%s%s%s", dtype, mx_elem ? "/" : "",
             mx_elem ? mx_elem : "", qscheme ? " " : "", qscheme ? qscheme : "", group,
             scale_format ? (strcmp(scale_format, "e8m0") ? " scale other" : " e8m0") : "");
    return MT_OK;
}

static mt_status parse_cfg(const cJSON *j, const char *where, qcfg *c, mt_err *err)
{
    if (!cJSON_IsObject(j))
        return mt_fail(err, MT_E_FORMAT, "%s: expected an object", where);
    char sub[320];
    snprintf(sub, sizeof sub, "%s.weight", where);
    mt_status st = parse_spec(cJSON_GetObjectItemCaseSensitive(j, "weight"), sub, &c->weight, err);
    if (st != MT_OK)
        return st;
    snprintf(sub, sizeof sub, "%s.input_tensors", where);
    return parse_spec(cJSON_GetObjectItemCaseSensitive(j, "input_tensors"), sub, &c->input, err);
}

static mt_status parse_exclude(model_quark *q, const cJSON *ex, mt_err *err)
{
    if (!ex || cJSON_IsNull(ex))
        return MT_OK;
    if (!cJSON_IsArray(ex))
        return mt_fail(err, MT_E_FORMAT, "quantization_config.exclude: expected an array");
    size_t n = (size_t)cJSON_GetArraySize(ex);
    q->exclude = calloc(n + 1, sizeof *q->exclude);
    if (!q->exclude)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    size_t i = 0;
    for (const cJSON *e = ex->child; e; e = e->next, i++) {
        if (!cJSON_IsString(e))
            return mt_fail(err, MT_E_FORMAT, "quantization_config.exclude[%zu]: not a string", i);
        qpattern *p = &q->exclude[q->exclude_count++];
        if (!(p->text = strdup(e->valuestring)))
            return mt_fail(err, MT_E_NOMEM, "out of memory");
        if (strncmp(p->text, "re:", 3))
            continue;
        int code;
        PCRE2_SIZE at;
        p->re = pcre2_compile((PCRE2_SPTR)p->text + 3, PCRE2_ZERO_TERMINATED, 0, &code, &at, NULL);
        if (!p->re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(code, msg, sizeof msg);
            return mt_fail(err, MT_E_FORMAT, "quantization_config.exclude[%zu]: bad regular "
                           "expression '%s' at offset %zu: %s", i, p->text, (size_t)at,
                           (const char *)msg);
        }
    }
    return MT_OK;
}

static mt_status parse_all(model_quark *q, const cJSON *qc, mt_err *err)
{
    if (!cJSON_IsObject(qc))
        return mt_fail(err, MT_E_FORMAT, "quantization_config: expected an object");
    const char *method = jstr(qc, "quant_method");
    if (!method || strcmp(method, "quark"))
        return mt_fail(err, MT_E_UNSUPPORTED, "quantization_config.quant_method: \"%s\", "
                       "expected \"quark\"", method ? method : "(missing)");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(qc, "global_quant_config");
    if (!g)
        return mt_fail(err, MT_E_FORMAT, "quantization_config.global_quant_config: missing");
    mt_status st = parse_cfg(g, "quantization_config.global_quant_config", &q->global, err);
    if (st != MT_OK)
        return st;
    const cJSON *lq = cJSON_GetObjectItemCaseSensitive(qc, "layer_quant_config");
    if (lq && !cJSON_IsNull(lq)) {
        if (!cJSON_IsObject(lq))
            return mt_fail(err, MT_E_FORMAT, "quantization_config.layer_quant_config: expected "
                           "an object");
        q->layer = calloc((size_t)cJSON_GetArraySize(lq) + 1, sizeof *q->layer);
        if (!q->layer)
            return mt_fail(err, MT_E_NOMEM, "out of memory");
        for (const cJSON *e = lq->child; e; e = e->next) {
            char where[256];
            snprintf(where, sizeof where, "quantization_config.layer_quant_config[\"%s\"]",
                     e->string);
            qcfg *c = &q->layer[q->layer_count++];
            if (!(c->pattern = strdup(e->string)))
                return mt_fail(err, MT_E_NOMEM, "out of memory");
            if ((st = parse_cfg(e, where, c, err)) != MT_OK)
                return st;
        }
    }
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(qc, "layer_type_quant_config");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsObject(lt))
            return mt_fail(err, MT_E_FORMAT, "quantization_config.layer_type_quant_config: "
                           "expected an object");
        const cJSON *lin = cJSON_GetObjectItemCaseSensitive(lt, "Linear");
        if (lin) {
            q->has_linear_type = true;
            st = parse_cfg(lin, "quantization_config.layer_type_quant_config[\"Linear\"]",
                           &q->linear_type, err);
            if (st != MT_OK)
                return st;
        }
    }
    return parse_exclude(q, cJSON_GetObjectItemCaseSensitive(qc, "exclude"), err);
}

mt_status model_quark_parse(const cJSON *qc, model_quark **out, mt_err *err)
{
    *out = NULL;
    model_quark *q = calloc(1, sizeof *q);
    if (!q)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    mt_status st = parse_all(q, qc, err);
    if (st != MT_OK) {
        model_quark_destroy(q);
        return st;
    }
    *out = q;
    return MT_OK;
}

size_t model_quark_exclude_count(const model_quark *q) { return q ? q->exclude_count : 0; }

const char *model_quark_exclude(const model_quark *q, size_t i)
{
    return q && i < q->exclude_count ? q->exclude[i].text : NULL;
}

static bool pattern_matches(const qpattern *p, const char *name)
{
    if (!p->re)
        return fnmatch(p->text, name, 0) == 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re, NULL);
    if (!md)
        return false;
    int rc = pcre2_match(p->re, (PCRE2_SPTR)name, strlen(name), 0, PCRE2_ANCHORED, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

void model_quark_lookup(const model_quark *q, const char *module, model_quark_match *m)
{
    memset(m, 0, sizeof *m);
    snprintf(m->weight.desc, sizeof m->weight.desc, "none");
    snprintf(m->input.desc, sizeof m->input.desc, "none");
    if (!q) {
        snprintf(m->rule, sizeof m->rule, "no quantization_config");
        return;
    }
    for (size_t i = 0; i < q->exclude_count; i++)
        if (pattern_matches(&q->exclude[i], module)) {
            m->exclude_pattern = q->exclude[i].text;
            snprintf(m->rule, sizeof m->rule, "exclude pattern '%s'", q->exclude[i].text);
            return;
        }
    const qcfg *c = NULL;
    for (size_t i = 0; i < q->layer_count && !c; i++)
        if (fnmatch(q->layer[i].pattern, module, 0) == 0) {
            c = &q->layer[i];
            snprintf(m->rule, sizeof m->rule, "layer_quant_config[\"%s\"]", c->pattern);
        }
    if (!c && q->has_linear_type) {
        c = &q->linear_type;
        snprintf(m->rule, sizeof m->rule, "layer_type_quant_config[\"Linear\"]");
    }
    if (!c) {
        c = &q->global;
        snprintf(m->rule, sizeof m->rule, "global_quant_config (no exclude pattern matched)");
    }
    m->weight = c->weight;
    m->input = c->input;
}

/* Exclude globs that match this module once their own prefix is replaced:
 * "model.mtp.mlp.shared_experts.*" names "model.layers.4.mlp.shared_experts.up_proj"
 * under another prefix. Writes them into out as "'a', 'b'". */
static void similar_excludes(const model_quark *q, const char *module, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (size_t i = 0; q && i < q->exclude_count; i++) {
        const char *p = q->exclude[i].text;
        if (q->exclude[i].re)
            continue;
        for (const char *dot = strchr(p, '.'); dot; dot = strchr(dot + 1, '.')) {
            const char *tail = dot + 1;
            /* At least two components, one of them literal, must remain. */
            const char *d2 = strchr(tail, '.');
            if (!d2 || strspn(tail, "*.?") == strlen(tail))
                break;
            char cand[512];
            snprintf(cand, sizeof cand, "*.%s", tail);
            if (fnmatch(cand, module, 0) == 0) {
                n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s'%s'", n ? ", " : "", p);
                break;
            }
        }
        if (n >= cap)
            break;
    }
}

static mt_status dims_fail(mt_err *err, const char *module, const model_tensor_info *t,
                           const char *what, int64_t out, int64_t in)
{
    char d[128];
    return mt_fail(err, MT_E_FORMAT, "%s: tensor '%s' (%s at byte %" PRIu64 ") is %s, %s "
                   "[out %" PRId64 ", in %" PRId64 "]", module, t->name, t->file, t->offset,
                   model_tensor_describe(t, d, sizeof d), what, out, in);
}

static bool want(int64_t expected, int64_t got) { return expected < 0 || expected == got; }

/* Decides the format from the tensors alone and checks their shapes. */
static mt_status from_file(const char *module, const model_tensor_info *w,
                           const model_tensor_info *s, int64_t out, int64_t in,
                           model_linear *lin, mt_err *err)
{
    char d1[128], d2[128];
    lin->weight = w;
    lin->scale = s;
    switch (w->dtype) {
    case MODEL_DTYPE_BF16:
    case MODEL_DTYPE_F16:
    case MODEL_DTYPE_F32:
        lin->fmt = w->dtype == MODEL_DTYPE_BF16  ? MODEL_WFMT_BF16
                   : w->dtype == MODEL_DTYPE_F16 ? MODEL_WFMT_F16
                                                 : MODEL_WFMT_F32;
        if (s)
            return mt_fail(err, MT_E_FORMAT, "%s: float weight '%s' (%s) comes with a scale "
                           "tensor '%s' (%s in %s at byte %" PRIu64 "): cannot tell its format",
                           module, w->name, model_tensor_describe(w, d1, sizeof d1), s->name,
                           model_tensor_describe(s, d2, sizeof d2), s->file, s->offset);
        if (w->ndim != 2 || !want(out, w->shape[0]) || !want(in, w->shape[1]))
            return dims_fail(err, module, w, "expected the float layout", out, in);
        lin->out = w->shape[0];
        lin->in = w->shape[1];
        return MT_OK;
    case MODEL_DTYPE_U8:
        lin->fmt = MODEL_WFMT_MXFP4;
        if (!s)
            return mt_fail(err, MT_E_FORMAT, "%s: weight '%s' (%s in %s at byte %" PRIu64 ") is "
                           "packed uint8 but there is no '%s.weight_scale': cannot load it as "
                           "MXFP4", module, w->name, model_tensor_describe(w, d1, sizeof d1),
                           w->file, w->offset, module);
        if (w->ndim != 2 || !want(out, w->shape[0]) || (in >= 0 && w->shape[1] * 2 != in))
            return dims_fail(err, module, w, "expected MXFP4 packing U8[out, in/2] of", out, in);
        lin->out = w->shape[0];
        lin->in = w->shape[1] * 2;
        if (s->dtype != MODEL_DTYPE_U8 || s->ndim != 2 || s->shape[0] != lin->out ||
            lin->in % 32 || s->shape[1] != lin->in / 32)
            return mt_fail(err, MT_E_FORMAT, "%s: scale '%s' (%s in %s at byte %" PRIu64 ") does "
                           "not fit MXFP4 weight '%s' (%s): expected U8[%" PRId64 ", %" PRId64 "] "
                           "(one E8M0 scale per 32 inputs)", module, s->name,
                           model_tensor_describe(s, d1, sizeof d1), s->file, s->offset, w->name,
                           model_tensor_describe(w, d2, sizeof d2), lin->out, lin->in / 32);
        return MT_OK;
    case MODEL_DTYPE_F8_E4M3:
        lin->fmt = MODEL_WFMT_FP8_E4M3;
        if (!s)
            return mt_fail(err, MT_E_FORMAT, "%s: weight '%s' (%s in %s at byte %" PRIu64 ") is "
                           "fp8 but there is no '%s.weight_scale'", module, w->name,
                           model_tensor_describe(w, d1, sizeof d1), w->file, w->offset, module);
        if (w->ndim != 2 || !want(out, w->shape[0]) || !want(in, w->shape[1]))
            return dims_fail(err, module, w, "expected the fp8 layout", out, in);
        lin->out = w->shape[0];
        lin->in = w->shape[1];
        if ((s->dtype != MODEL_DTYPE_F32 && s->dtype != MODEL_DTYPE_BF16) ||
            (model_tensor_numel(s) != 1 && model_tensor_numel(s) != lin->out))
            return mt_fail(err, MT_E_FORMAT, "%s: scale '%s' (%s in %s at byte %" PRIu64 ") must "
                           "be F32 or BF16 with 1 or %" PRId64 " values (per tensor or per row)",
                           module, s->name, model_tensor_describe(s, d1, sizeof d1), s->file,
                           s->offset, lin->out);
        return MT_OK;
    default:
        return mt_fail(err, MT_E_UNSUPPORTED, "%s: weight '%s' (%s in %s at byte %" PRIu64 ") has "
                       "a dtype no linear format uses", module, w->name,
                       model_tensor_describe(w, d1, sizeof d1), w->file, w->offset);
    }
}

static model_qkind file_kind(model_wfmt f)
{
    return f == MODEL_WFMT_MXFP4       ? MODEL_QKIND_MXFP4
           : f == MODEL_WFMT_FP8_E4M3 ? MODEL_QKIND_FP8_E4M3
                                       : MODEL_QKIND_NONE;
}

mt_status model_quark_resolve(const model_quark *q, const char *module,
                              const model_tensor_info *weight, const model_tensor_info *scale,
                              int64_t out, int64_t in, model_linear *lin, char *warn,
                              size_t warn_cap, mt_err *err)
{
    if (warn && warn_cap)
        warn[0] = 0;
    memset(lin, 0, sizeof *lin);
    lin->name = module;
    mt_status st = from_file(module, weight, scale, out, in, lin, err);
    if (st != MT_OK)
        return st;
    model_quark_match m;
    model_quark_lookup(q, module, &m);
    model_qkind have = file_kind(lin->fmt);
    if (have == m.weight.kind) {
        lin->act_mxfp4 = have == MODEL_QKIND_MXFP4 && m.input.kind == MODEL_QKIND_MXFP4 &&
                         m.input.is_dynamic;
        return MT_OK;
    }
    if (!warn || !warn_cap)
        return MT_OK;
    char d[128], hint[400] = "";
    if (have == MODEL_QKIND_NONE && !m.exclude_pattern) {
        char sim[300];
        similar_excludes(q, module, sim, sizeof sim);
        if (sim[0])
            snprintf(hint, sizeof hint, "; exclude %s names this module under another prefix, "
                     "so it did not match '%s'", sim, module);
        else
            snprintf(hint, sizeof hint, "; no exclude pattern matches '%s'", module);
    }
    snprintf(warn, warn_cap, "%s: the checkpoint stores %s '%s' (%s)%s but quantization_config "
             "says %s (%s, weight spec %s)%s; loading it as stored (%s)", module,
             model_wfmt_name(lin->fmt), weight->name, model_tensor_describe(weight, d, sizeof d),
             scale ? " with a weight_scale" : " with no weight_scale",
             model_qkind_name(m.weight.kind), m.rule, m.weight.desc, hint,
             model_wfmt_name(lin->fmt));
    return MT_OK;
}
