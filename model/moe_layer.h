/* moe_layer.h: the MoE layer that runs on a device: the one the server's
 * forward pass runs (rt_forward.c), `moetune bench --family moe` times and
 * the MoE layer tests check against moe_reference (kernels/moe.h).
 *
 *   y[M, H] (f32) = shared(x) + sum_k w_k expert_k(x)      for x bf16 [M, H]
 *
 * as route -> align -> gate/up GEMM -> down GEMM (-> combine), with the
 * MXFP4 shared expert as a one-expert MoE (align, up, down) on the same
 * GEMMs. Every stage is a kernel of a kernel set (kset.h), so each call runs
 * the config the tuning database gave for its M bucket.
 *
 * The workspace (routing ids and weights, the expert-sorted layout, the
 * intermediate activations) holds up to max_m tokens; layers that run one
 * after another share one. The weights are the caller's device buffers
 * (moe_weights), never copied.
 *
 * Ownership: create/destroy pairs, destroy(NULL) a no-op; the kernels
 * belong to their set, which must outlive every run. Failures return an
 * mt_status with err naming the stage. Not thread-safe (one stream, one
 * workspace). */
#ifndef MT_MODEL_MOE_LAYER_H
#define MT_MODEL_MOE_LAYER_H

#include "kernels/moe/moe.h"
#include "model/format/config.h"
#include "kset.h"

/* The layer's kernels; combine is NULL when dims.comb is 0, the sh_* NULL
 * without a shared expert. */
typedef struct model_moe_kernels {
    model_kern *route, *align, *up, *down, *combine, *sh_align, *sh_up, *sh_down;
} model_moe_kernels;

/* The routed-expert dims of a GLM-5 config: act is the activation dtype the
 * expert GEMMs take (KERN_DT_BF16 a16w4, KERN_DT_MXFP4 a4w4, KERN_DT_I8
 * a8w4), shared_inter the MXFP4 shared expert's width (0: none on the MoE GEMMs),
 * deterministic combine (comb 1: the down GEMM writes one row per
 * (token, expert) pair and moe_combine sums them in a fixed order, so a
 * token's output does not depend on thread timing), bm 128. */
void model_moe_dims(const model_config *c, kern_dtype act, int wl, int64_t shared_inter,
                    moe_dims *out);

/* Adds the layer's kernels (keys from moe_layer_keys) to ks, each called
 * with at most m_max rows. */
mt_status model_moe_add_kernels(model_kset *ks, const moe_dims *d, int64_t m_max,
                                model_moe_kernels *out, mt_err *err);

typedef struct model_moe_ws model_moe_ws;

/* A workspace for up to max_m tokens of layers with dims d (the largest
 * shared expert of the layers that use it). */
mt_status model_moe_ws_create(dev_device *dev, const moe_dims *d, int64_t max_m,
                              model_moe_ws **out, mt_err *err);
void model_moe_ws_destroy(model_moe_ws *ws);
/* Device int32 [M, topk]: the experts the last run routed each token to. */
const void *model_moe_ws_ids(const model_moe_ws *ws);
/* The workspace's routing buffers (device int32 [max_m, topk] expert ids,
 * f32 [max_m, topk] weights), for a caller that routes into them itself
 * and then calls model_moe_run_routed on them. */
void model_moe_ws_routing(model_moe_ws *ws, void **ids, void **tw);

/* The layer's kernels in launch order, for per-kernel timing. */
enum {
    MODEL_MOE_SH_ALIGN, MODEL_MOE_SH_UP, MODEL_MOE_SH_DOWN, MODEL_MOE_ROUTE, MODEL_MOE_ALIGN,
    MODEL_MOE_UP, MODEL_MOE_DOWN, MODEL_MOE_COMBINE, MODEL_MOE_NK
};
/* "shared sort", "shared gate/up", ..., indexed by the enum above. */
extern const char *const model_moe_kernel_names[MODEL_MOE_NK];

/* With ms (MODEL_MOE_NK doubles, owned by the caller) every later
 * model_moe_run on ws synchronizes around each kernel and adds its wall
 * time in ms to ms[kernel]; NULL turns that off. For breakdowns only: the
 * synchronizations add to the layer's time. */
void model_moe_ws_time_kernels(model_moe_ws *ws, double *ms);

/* y (device, f32 [M, H]; overwritten) = the layer of dims d on x (device,
 * bf16 [M, H]). d must fit the workspace's dims (same E, topk, bm; inter and
 * shared_inter at most its), M at most its max_m. Asynchronous. */
mt_status model_moe_run(const model_moe_kernels *k, model_moe_ws *ws, const moe_dims *d,
                        const moe_weights *w, const void *x, int64_t M, float *y, mt_err *err);

/* The same with the routing given: ids (device int32 [M, topk]) and tw
 * (device f32 [M, topk]) in place of route's output (k->route unused; the
 * expert sort, gate/up, down, combine and the shared expert as
 * model_moe_run runs them). */
mt_status model_moe_run_routed(const model_moe_kernels *k, model_moe_ws *ws, const moe_dims *d,
                               const moe_weights *w, const void *x, const void *ids,
                               const void *tw, int64_t M, float *y, mt_err *err);

#endif
