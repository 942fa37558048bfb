/* api_routed.h: the served MoE layer run from router logits the caller
 * gives, for moetune_moe_run_logits (a run from given top-k ids and
 * weights is model_moe_run_routed itself).
 *
 * The logits go through the runtime's moe_route kernel as its input rows
 * against an identity router weight (bf16 logits times a one are the
 * logits, exactly, and the sigmoid, bias, groups, top-k and scaling follow
 * as for the runtime) into the workspace's routing buffers, then
 * model_moe_run_routed runs the layer on them.
 *
 * Threading as model_moe_ws: one device thread. */
#ifndef MT_API_ROUTED_H
#define MT_API_ROUTED_H

#include "kernels/moe/moe.h"
#include "model/moe_layer.h"

/* Routes M rows of bf16 logits [M, E] with route (a moe_route kernel at
 * H = E) and the identity weight eye (bf16 [E, E]) into ws's routing, then
 * runs the layer on x with it (k as model_moe_add_kernels fills it, route
 * unused). Asynchronous on hip and cuda. */
mt_status api_routed_run_logits(const model_moe_kernels *k, model_kern *route, model_moe_ws *ws,
                                const moe_dims *d, const moe_weights *w, const void *eye,
                                const void *x, const void *logits, int64_t M, float *y,
                                mt_err *err);

/* The identity router weight for n experts: bf16 [n, n] in host memory
 * (malloc'd; the caller frees), NULL when out of memory. */
uint16_t *api_routed_identity(int64_t n);

#endif
