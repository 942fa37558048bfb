/* api_routed.c: the served MoE layer run from given routing (see
 * api_routed.h). Buffer sizes and launch order follow model/moe_layer.c. */
#include "api_routed.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/moe/moe_common.h"

struct api_routed_ws {
    dev_device *dev;
    moe_dims d;     /* capacity: E, topk, bm; largest inter and shared_inter */
    int64_t max_m;
    void *ids, *tw, *sorted, *tile, *total, *h, *rows;
    void *sh_ids, *sh_w, *sh_sorted, *sh_tile, *sh_total, *sh_h, *sh_rows;
};

void api_routed_ws_destroy(api_routed_ws *ws)
{
    if (!ws)
        return;
    void *p[] = {ws->ids, ws->tw, ws->sorted, ws->tile, ws->total, ws->h, ws->rows,
                 ws->sh_ids, ws->sh_w, ws->sh_sorted, ws->sh_tile, ws->sh_total, ws->sh_h,
                 ws->sh_rows};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        dev_free(ws->dev, p[i]);
    free(ws);
}

mt_status api_routed_ws_create(dev_device *dev, const moe_dims *d, int64_t max_m,
                               api_routed_ws **out, mt_err *err)
{
    *out = NULL;
    api_routed_ws *ws = calloc(1, sizeof *ws);
    if (!ws)
        return mt_fail(err, MT_E_NOMEM, "moe workspace");
    ws->dev = dev;
    ws->d = *d;
    ws->max_m = max_m;
    int bm = moe_dims_bm(d);
    int64_t M = max_m, P = M * d->topk, cap = moe_cap_rows(P, d->n_experts, bm);
    int64_t cap1 = moe_cap_rows(M, 1, bm), S = d->shared_inter;
    struct {
        void **p;
        size_t n;
    } a[] = {
        {&ws->ids, (size_t)P * 4}, {&ws->tw, (size_t)P * 4}, {&ws->sorted, (size_t)cap * 4},
        {&ws->tile, (size_t)(cap / bm + 1) * 4}, {&ws->total, 4},
        {&ws->h, (size_t)(P * d->inter) * 2},
        {&ws->rows, d->comb ? (size_t)(P * d->hidden) * 4 : 0},
        {&ws->sh_ids, S ? (size_t)M * 4 : 0}, {&ws->sh_w, S ? (size_t)M * 4 : 0},
        {&ws->sh_sorted, S ? (size_t)cap1 * 4 : 0},
        {&ws->sh_tile, S ? (size_t)(cap1 / bm + 1) * 4 : 0}, {&ws->sh_total, S ? 4 : 0},
        {&ws->sh_h, S ? (size_t)(M * S) * 2 : 0},
        {&ws->sh_rows, S && d->comb ? (size_t)(M * d->hidden) * 4 : 0},
    };
    mt_status st = MT_OK;
    for (size_t i = 0; i < sizeof a / sizeof a[0] && st == MT_OK; i++)
        if (a[i].n)
            st = dev_alloc(dev, a[i].n, a[i].p, err);
    if (st == MT_OK && S) {
        /* The shared expert as a one-expert MoE: every token to expert 0
         * with weight 1. */
        float *ones = malloc((size_t)M * 4);
        if (!ones)
            st = mt_fail(err, MT_E_NOMEM, "moe workspace");
        for (int64_t i = 0; st == MT_OK && i < M; i++)
            ones[i] = 1.0f;
        if (st == MT_OK)
            st = dev_memset(dev, ws->sh_ids, 0, (size_t)M * 4, err);
        if (st == MT_OK)
            st = dev_copy_to(dev, ws->sh_w, ones, (size_t)M * 4, err);
        free(ones);
    }
    if (st != MT_OK) {
        api_routed_ws_destroy(ws);
        return mt_err_prefix(err, "moe workspace for %" PRId64 " tokens", max_m);
    }
    *out = ws;
    return MT_OK;
}

static mt_status fits(const api_routed_ws *ws, const moe_dims *d, int64_t M, mt_err *err)
{
    const moe_dims *c = &ws->d;
    if (M > ws->max_m || d->n_experts != c->n_experts || d->topk != c->topk ||
        moe_dims_bm(d) != moe_dims_bm(c) || d->inter > c->inter || d->hidden != c->hidden ||
        d->shared_inter > c->shared_inter || (d->comb && !c->comb))
        return mt_fail(err, MT_E_INVALID, "moe layer: M=%" PRId64 " does not fit its workspace "
                       "(M up to %" PRId64 ")", M, ws->max_m);
    return MT_OK;
}

/* One kernel of the layer. */
#define RUN(k, ...)                                                                              \
    do {                                                                                         \
        void *bufs_[] = {__VA_ARGS__};                                                           \
        if (model_kern_run((k), M, NULL, bufs_, err) != MT_OK)                                   \
            return mt_err_prefix(err, "moe layer");                                              \
    } while (0)

mt_status api_routed_run(const model_moe_kernels *k, api_routed_ws *ws, const moe_dims *d,
                         const moe_weights *w, const void *x, const void *ids, const void *tw,
                         int64_t M, float *y, mt_err *err)
{
    if (M <= 0)
        return MT_OK;
    MT_CHECK(fits(ws, d, M, err));
    void *xv = (void *)(uintptr_t)x, *yv = y;
    void *idv = (void *)(uintptr_t)ids, *twv = (void *)(uintptr_t)tw;
    /* y starts at zero where something adds into it (as model_moe_run). */
    void *shared = d->shared_inter && d->comb ? ws->sh_rows : yv;
    if (shared == yv)
        MT_CHECK(dev_memset(ws->dev, y, 0, (size_t)(M * d->hidden) * 4, err));
    if (d->shared_inter) {
        RUN(k->sh_align, ws->sh_ids, ws->sh_sorted, ws->sh_tile, ws->sh_total);
        RUN(k->sh_up, xv, ws->sh_ids, ws->sh_sorted, ws->sh_tile, ws->sh_total,
            (void *)w->sh_w13, (void *)w->sh_s13, ws->sh_h);
        RUN(k->sh_down, ws->sh_h, ws->sh_ids, ws->sh_sorted, ws->sh_tile, ws->sh_total,
            ws->sh_w, (void *)w->sh_w2, (void *)w->sh_s2, shared);
    }
    RUN(k->align, idv, ws->sorted, ws->tile, ws->total);
    RUN(k->up, xv, idv, ws->sorted, ws->tile, ws->total, (void *)w->w13, (void *)w->s13, ws->h);
    RUN(k->down, ws->h, idv, ws->sorted, ws->tile, ws->total, twv, (void *)w->w2,
        (void *)w->s2, d->comb ? ws->rows : yv);
    if (d->comb)
        RUN(k->combine, ws->rows, shared, yv);
    return MT_OK;
}

mt_status api_routed_run_logits(const model_moe_kernels *k, model_kern *route,
                                api_routed_ws *ws, const moe_dims *d, const moe_weights *w,
                                const void *eye, const void *x, const void *logits, int64_t M,
                                float *y, mt_err *err)
{
    if (M <= 0)
        return MT_OK;
    MT_CHECK(fits(ws, d, M, err));
    RUN(route, (void *)(uintptr_t)logits, (void *)(uintptr_t)eye, (void *)w->bias, ws->ids,
        ws->tw);
    return api_routed_run(k, ws, d, w, x, ws->ids, ws->tw, M, y, err);
}

#undef RUN

uint16_t *api_routed_identity(int64_t n)
{
    uint16_t *eye = calloc((size_t)(n * n), 2);
    if (!eye)
        return NULL;
    for (int64_t i = 0; i < n; i++)
        eye[i * n + i] = 0x3f80; /* bf16 1.0 */
    return eye;
}
