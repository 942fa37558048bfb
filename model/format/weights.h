/* weights.h: an opened GLM-5 family checkpoint folder: config.json, every
 * safetensors shard (memory-mapped), and the storage format of every linear.
 *
 * model_weights_open validates the whole checkpoint against config.json
 * before returning: every tensor the architecture needs, for every main
 * layer and every MTP layer (`model.layers.<num_hidden_layers + k>.*`), must
 * exist with the right dtype and shape; each linear's format is decided
 * from the file itself and compared with the quantization config (see
 * quark.h). A bad checkpoint is an error naming the file, the tensor and the
 * byte offset; nothing is half-loaded. Disagreements that load correctly
 * (a bf16 tensor where the config said MXFP4, a tensor no layer uses) are
 * kept as warnings.
 *
 * The MTP layers' DSA indexer: loaded when its tensors are present;
 * when absent and config.json sets index_share_for_mtp_iteration the MTP
 * layer shares the top-k of the last full main layer; otherwise missing
 * tensors are an error.
 *
 * Ownership: the handle owns the config, the mappings and every pointer it
 * returns; all stay valid until model_weights_close. Thread safety: open and
 * close are not thread-safe; every query after open is a pure read. */
#ifndef MT_MODEL_WEIGHTS_H
#define MT_MODEL_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "config.h"
#include "quark.h"
#include "safetensors.h"

#define MODEL_DTYPE_BIT(dt) (1u << (dt))
#define MODEL_DTYPES_FLOAT                                                                         \
    (MODEL_DTYPE_BIT(MODEL_DTYPE_BF16) | MODEL_DTYPE_BIT(MODEL_DTYPE_F16) |                        \
     MODEL_DTYPE_BIT(MODEL_DTYPE_F32))

typedef struct model_weights model_weights;

/* Opens dir (config.json, model.safetensors[.index.json] and its shards). */
mt_status model_weights_open(const char *dir, model_weights **out, mt_err *err);
/* Unmaps and frees everything; NULL is a no-op. */
void model_weights_close(model_weights *w);

const model_config *model_weights_config(const model_weights *w);
const model_st_set *model_weights_files(const model_weights *w);

/* Raw look-up by full tensor name; NULL when absent. */
const model_tensor_info *model_weights_find(const model_weights *w, const char *name);

/* Look-up with checks: the tensor must exist, its dtype must be in
 * dtype_mask (MODEL_DTYPE_BIT()s; 0 accepts any), and it must have ndim
 * dims equal to shape (an entry of -1 accepts any size). Errors name the
 * tensor, its file and byte offset, and what was expected. */
mt_status model_weights_tensor(const model_weights *w, const char *name, uint32_t dtype_mask,
                               int ndim, const int64_t *shape, const model_tensor_info **out,
                               mt_err *err);

/* A linear by module name ("model.layers.3.mlp.experts.7.down_proj"), as
 * validated at open. MT_E_NOT_FOUND names the module when there is none. */
mt_status model_weights_linear(const model_weights *w, const char *module,
                               const model_linear **out, mt_err *err);
/* All linears, sorted by name. */
size_t model_weights_linear_count(const model_weights *w);
const model_linear *model_weights_linear_at(const model_weights *w, size_t i);

/* Whether layer i (main or MTP) runs its own indexer. i < layer_count. */
bool model_weights_layer_indexer_full(const model_weights *w, int64_t layer);

/* Warnings collected at open (format disagreements, unused tensors). */
size_t model_weights_warning_count(const model_weights *w);
const char *model_weights_warning(const model_weights *w, size_t i);

/* One line per format with the count of linears and their bytes, then
 * every warning. */
void model_weights_print_summary(const model_weights *w, FILE *f);

#endif
