/* api_ws.c: the workspaces a device's layers share (see api_impl.h). A
 * GLM-5.2 layer's workspace for 4096 tokens holds about 1 GB of
 * intermediate rows, so the 75 layers of a model share one, which grows to
 * the largest layer that uses it. */
#include <stdlib.h>

#include "api_impl.h"

/* Layers can share a workspace when these agree; the rest only sizes it. */
static bool same_kind(const api_ws *w, api_ws_kind kind, const moe_dims *d)
{
    const moe_dims *c = &w->cap;
    return w->kind == kind && c->hidden == d->hidden && c->n_experts == d->n_experts &&
           c->topk == d->topk && moe_dims_bm(c) == moe_dims_bm(d) && c->comb == d->comb;
}

static void free_buffers(api_ws *w)
{
    model_moe_ws_destroy(w->layer);
    model_moe_ws_destroy(w->routed);
    w->layer = NULL;
    w->routed = NULL;
}

static mt_status make_buffers(moetune_device *dev, api_ws *w, mt_err *err)
{
    if (w->kind == API_WS_LAYER)
        return model_moe_ws_create(dev->dev, &w->cap, w->max_m, &w->layer, err);
    return model_moe_ws_create(dev->dev, &w->cap, w->max_m, &w->routed, err);
}

mt_status api_ws_get(moetune_device *dev, api_ws_kind kind, const moe_dims *d, int64_t max_m,
                     api_ws **out, mt_err *err)
{
    *out = NULL;
    for (api_ws *w = dev->ws; w; w = w->next) {
        if (!same_kind(w, kind, d))
            continue;
        if (d->inter > w->cap.inter || d->shared_inter > w->cap.shared_inter ||
            max_m > w->max_m) {
            /* Grow: the old buffers may still be read by a queued run. */
            api_ws bigger = *w;
            if (d->inter > bigger.cap.inter)
                bigger.cap.inter = d->inter;
            if (d->shared_inter > bigger.cap.shared_inter)
                bigger.cap.shared_inter = d->shared_inter;
            if (max_m > bigger.max_m)
                bigger.max_m = max_m;
            bigger.layer = NULL;
            bigger.routed = NULL;
            MT_CHECK(dev_synchronize(dev->dev, err));
            MT_CHECK(make_buffers(dev, &bigger, err));
            free_buffers(w);
            *w = bigger;
        }
        w->refs++;
        *out = w;
        return MT_OK;
    }
    api_ws *w = calloc(1, sizeof *w);
    if (!w)
        return mt_fail(err, MT_E_NOMEM, "moe workspace");
    w->kind = kind;
    w->cap = *d;
    w->max_m = max_m;
    mt_status st = make_buffers(dev, w, err);
    if (st != MT_OK) {
        free(w);
        return st;
    }
    w->refs = 1;
    w->next = dev->ws;
    dev->ws = w;
    *out = w;
    return MT_OK;
}

void api_ws_release(moetune_device *dev, api_ws *ws)
{
    if (!ws || --ws->refs > 0)
        return;
    for (api_ws **p = &dev->ws; *p; p = &(*p)->next)
        if (*p == ws) {
            *p = ws->next;
            break;
        }
    mt_err err = MT_ERR_INIT;
    (void)dev_synchronize(dev->dev, &err); /* a queued run may still use it */
    free_buffers(ws);
    free(ws);
}
