/* quark.h: AMD Quark's quantization_config (config.json) and the decision of
 * each linear layer's storage format.
 *
 * What the config says for a module (say "model.layers.3.mlp.experts.7.up_proj"):
 *   1. `exclude`: an entry "re:<regex>" is a PCRE2 regular expression matched
 *      at the start of the name (Python's re.match); any other entry is a
 *      glob matched against the whole name with fnmatch(3) (no flags: `*`
 *      crosses dots). A match means "not quantized".
 *   2. else the first `layer_quant_config` key (a glob) matching the name;
 *   3. else `layer_type_quant_config["Linear"]`;
 *   4. else `global_quant_config`.
 * Each config holds a `weight` and an `input_tensors` spec; a spec with
 * dtype "fp4" (or dtype "mx" with mx_element_dtype "fp4"), qscheme
 * "per_group", group_size 32 and scale_format "e8m0" is MXFP4.
 *
 * What the loader does (model_quark_resolve): the checkpoint decides. The
 * format comes from the tensors themselves (the weight's dtype and shape in
 * the safetensors header, and whether a `weight_scale` exists):
 *   BF16/F16/F32 [out, in], no scale          -> that float format
 *   U8 [out, in/2] + U8 weight_scale [out, in/32] -> MXFP4 (Quark packing)
 *   F8_E4M3 [out, in] + F32/BF16 weight_scale of 1 or `out` values -> FP8
 * A file that matches none of these, or whose dims differ from the
 * expected ones, is an error naming the tensors. When the file and the
 * config disagree (the published MTP failure: a bf16 shared expert whose
 * exclude entry named another prefix, so the config says MXFP4), the tensor
 * loads as stored and a warning says what the config said, which rule said
 * it, and which exclude patterns look like they meant this module.
 *
 * Thread safety: a parsed model_quark is immutable; lookups may run from
 * any number of threads (each match uses its own PCRE2 match data). */
#ifndef MT_MODEL_QUARK_H
#define MT_MODEL_QUARK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "safetensors.h"

struct cJSON;

/* Storage format of a linear's weight, as decided from the file. Stable values. */
typedef enum model_wfmt {
    MODEL_WFMT_BF16 = 0,
    MODEL_WFMT_F16 = 1,
    MODEL_WFMT_F32 = 2,
    MODEL_WFMT_MXFP4 = 3,    /* U8 [out, in/2] + U8 E8M0 scale [out, in/32] */
    MODEL_WFMT_FP8_E4M3 = 4, /* F8_E4M3 [out, in] + per-tensor or per-row scale */
    MODEL_WFMT_COUNT
} model_wfmt;

const char *model_wfmt_name(model_wfmt f); /* "bf16", "mxfp4", ... */

/* What a quantization spec asks for. */
typedef enum model_qkind {
    MODEL_QKIND_NONE = 0,  /* not quantized (null spec, excluded, or no config) */
    MODEL_QKIND_MXFP4 = 1,
    MODEL_QKIND_FP8_E4M3 = 2,
    MODEL_QKIND_OTHER = 3, /* a scheme this runtime does not execute */
    MODEL_QKIND_COUNT
} model_qkind;

const char *model_qkind_name(model_qkind k);

typedef struct model_qspec {
    model_qkind kind;
    bool is_dynamic;
    int group_size;    /* 0 when absent */
    char desc[96];     /* "fp4 per_group 32 e8m0" as written in the config */
} model_qspec;

/* The effective config of one module. */
typedef struct model_quark_match {
    model_qspec weight, input;
    const char *exclude_pattern; /* the exclude entry that matched, or NULL */
    char rule[192];              /* which rule decided: "exclude 'x'", "global_quant_config", ... */
} model_quark_match;

typedef struct model_quark model_quark;

/* Parses a quantization_config object with quant_method "quark". Errors
 * name the key ("quantization_config.exclude[3]") and, for a regular
 * expression, PCRE2's message and offset. */
mt_status model_quark_parse(const struct cJSON *qc, model_quark **out, mt_err *err);
void model_quark_destroy(model_quark *q);

/* What the config says for a module name (no ".weight" suffix). q may be
 * NULL (no quantization_config): everything is unquantized. */
void model_quark_lookup(const model_quark *q, const char *module, model_quark_match *m);

size_t model_quark_exclude_count(const model_quark *q);
const char *model_quark_exclude(const model_quark *q, size_t i);

/* One linear layer as the loader decided it. Pointers are borrowed from
 * the checkpoint (tensors) and the caller (name). */
typedef struct model_linear {
    const char *name;                /* module name, e.g. "model.layers.3.self_attn.o_proj" */
    model_wfmt fmt;
    int64_t out, in;                 /* logical [out, in] */
    const model_tensor_info *weight; /* never NULL */
    const model_tensor_info *scale;  /* weight_scale; NULL for float formats */
    bool act_mxfp4;                  /* w4a4: inputs are quantized to MXFP4 per 32 */
} model_linear;

/* Decides lin from the tensors (weight non-NULL; scale is the module's
 * "weight_scale" tensor or NULL) and checks the logical dims against
 * out/in (pass -1 to accept any). On a disagreement with the config it
 * still succeeds and writes a warning into warn (empty when none; warn may
 * be NULL). Errors: MT_E_FORMAT naming the tensors, file and offset when the
 * tensors are inconsistent or have the wrong dims; MT_E_UNSUPPORTED for a
 * dtype no format uses. */
mt_status model_quark_resolve(const model_quark *q, const char *module,
                              const model_tensor_info *weight,
                              const model_tensor_info *scale, int64_t out, int64_t in,
                              model_linear *lin, char *warn, size_t warn_cap, mt_err *err);

#endif
