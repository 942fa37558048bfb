/* api_routed.h: the served MoE layer run from routing the caller gives
 * (top-k ids and weights, or router logits), for moetune_moe_run_topk and
 * moetune_moe_run_logits.
 *
 * model_moe_run always routes from x and the router weight itself, and
 * its workspace is private to model/moe_layer.c; these run the same
 * kernels of the same kernel set (expert sort, gate/up, down, combine, and
 * the shared expert's), in the same order on the same buffers, with the
 * routing read from the caller's ids and weights instead. The logits go
 * through the runtime's moe_route kernel as its input rows against an
 * identity router weight (bf16 logits times a one are the logits, exactly,
 * and the sigmoid, bias, groups, top-k and scaling follow as for the
 * runtime). A hook in model/moe_layer.c (a run from given routing, sharing
 * model_moe_ws) would let this file go; docs/LIBRARY.md says so.
 *
 * Ownership and threading as model_moe_ws: one device thread; the
 * workspace is the caller's (create/destroy; destroy(NULL) a no-op). */
#ifndef MT_API_ROUTED_H
#define MT_API_ROUTED_H

#include "kernels/moe/moe.h"
#include "model/moe_layer.h"

typedef struct api_routed_ws api_routed_ws;

/* Buffers for up to max_m tokens of layers with dims d (model_moe_ws's
 * sizes, less the routing, which a logits run keeps here too). */
mt_status api_routed_ws_create(dev_device *dev, const moe_dims *d, int64_t max_m,
                               api_routed_ws **out, mt_err *err);
void api_routed_ws_destroy(api_routed_ws *ws);

/* y (f32 [M, H]) = the layer on x (bf16 [M, H]) routed by ids (int32
 * [M, topk]) and tw (f32 [M, topk]); k as model_moe_add_kernels fills it
 * (route unused). Asynchronous on hip and cuda. */
mt_status api_routed_run(const model_moe_kernels *k, api_routed_ws *ws, const moe_dims *d,
                         const moe_weights *w, const void *x, const void *ids, const void *tw,
                         int64_t M, float *y, mt_err *err);

/* Routes M rows of bf16 logits [M, E] with route (a moe_route kernel at
 * H = E) and the identity weight eye (bf16 [E, E]) into the workspace,
 * then runs api_routed_run on that routing. */
mt_status api_routed_run_logits(const model_moe_kernels *k, model_kern *route,
                                api_routed_ws *ws, const moe_dims *d, const moe_weights *w,
                                const void *eye, const void *x, const void *logits, int64_t M,
                                float *y, mt_err *err);

/* The identity router weight for n experts: bf16 [n, n] in host memory
 * (malloc'd; the caller frees), NULL when out of memory. */
uint16_t *api_routed_identity(int64_t n);

#endif
