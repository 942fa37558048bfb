/* api_routed.c: the served MoE layer run from router logits (see
 * api_routed.h). */
#include "api_routed.h"

#include <stdlib.h>

mt_status api_routed_run_logits(const model_moe_kernels *k, model_kern *route, model_moe_ws *ws,
                                const moe_dims *d, const moe_weights *w, const void *eye,
                                const void *x, const void *logits, int64_t M, float *y,
                                mt_err *err)
{
    if (M <= 0)
        return MT_OK;
    void *ids, *tw;
    model_moe_ws_routing(ws, &ids, &tw);
    void *bufs[] = {(void *)(uintptr_t)logits, (void *)(uintptr_t)eye, (void *)w->bias, ids, tw};
    if (model_kern_run(route, M, NULL, bufs, err) != MT_OK)
        return mt_err_prefix(err, "moe layer: routing the logits");
    return model_moe_run_routed(k, ws, d, w, x, ids, tw, M, y, err);
}

uint16_t *api_routed_identity(int64_t n)
{
    uint16_t *eye = calloc((size_t)(n * n), 2);
    if (!eye)
        return NULL;
    for (int64_t i = 0; i < n; i++)
        eye[i * n + i] = 0x3f80; /* bf16 1.0 */
    return eye;
}
