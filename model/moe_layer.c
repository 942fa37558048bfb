/* moe_layer.c: the served MoE layer on a device (see moe_layer.h). */
#include "moe_layer.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/moe/moe_common.h"
#include "common/clock.h"

struct model_moe_ws {
    dev_device *dev;
    moe_dims d;       /* capacity: E, topk, bm; largest inter and shared_inter */
    int64_t max_m;
    void *ids, *tw, *sorted, *tile, *total, *h, *rows;
    void *sh_ids, *sh_w, *sh_sorted, *sh_tile, *sh_total, *sh_h, *sh_rows;
    double *kernel_ms; /* model_moe_ws_time_kernels; NULL: not timed */
};

const char *const model_moe_kernel_names[MODEL_MOE_NK] = {
    [MODEL_MOE_SH_ALIGN] = "shared sort", [MODEL_MOE_SH_UP] = "shared gate/up",
    [MODEL_MOE_SH_DOWN] = "shared down",  [MODEL_MOE_ROUTE] = "router",
    [MODEL_MOE_ALIGN] = "expert sort",    [MODEL_MOE_UP] = "expert gate/up",
    [MODEL_MOE_DOWN] = "expert down",     [MODEL_MOE_COMBINE] = "combine",
};

void model_moe_ws_time_kernels(model_moe_ws *ws, double *ms) { ws->kernel_ms = ms; }

void model_moe_dims(const model_config *c, kern_dtype act, int wl, int64_t shared_inter,
                    moe_dims *out)
{
    *out = (moe_dims){.hidden = c->hidden_size, .inter = c->moe_intermediate_size,
                      .n_experts = c->n_routed_experts, .topk = (int)c->num_experts_per_tok,
                      .ngroup = (int)c->n_group, .topkg = (int)c->topk_group,
                      .scale = (float)c->routed_scaling_factor, .norm = c->norm_topk_prob,
                      .a4 = act == KERN_DT_MXFP4, .a8 = act == KERN_DT_I8,
                      .shared_inter = shared_inter, .comb = 1, .bm = 128, .wl = wl};
}

mt_status model_moe_add_kernels(model_kset *ks, const moe_dims *d, int64_t m_max,
                                model_moe_kernels *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    moe_keys k;
    moe_layer_keys(d, &k);
    struct {
        model_kern **slot;
        const char *fam, *key, *use;
    } st[] = {
        {&out->route, "moe_route", k.route, "router"},
        {&out->align, "moe_align", k.align, "expert sort"},
        {&out->up, "moe_gemm_up", k.up, "experts up"},
        {&out->down, "moe_gemm_down", k.down, "experts down"},
        {&out->combine, "moe_combine", k.combine, "combine"},
        {&out->sh_align, "moe_align", k.sh_align, "shared sort"},
        {&out->sh_up, "moe_gemm_up", k.sh_up, "shared up"},
        {&out->sh_down, "moe_gemm_down", k.sh_down, "shared down"},
    };
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        if (!st[i].key[0])
            continue;
        mt_status s = model_kset_add_text(ks, st[i].fam, st[i].key, st[i].use, m_max,
                                          st[i].slot, err);
        if (s != MT_OK)
            return mt_err_prefix(err, "moe layer");
    }
    return MT_OK;
}

void model_moe_ws_destroy(model_moe_ws *ws)
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

mt_status model_moe_ws_create(dev_device *dev, const moe_dims *d, int64_t max_m,
                              model_moe_ws **out, mt_err *err)
{
    *out = NULL;
    model_moe_ws *ws = calloc(1, sizeof *ws);
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
        {&ws->sh_sorted, S ? (size_t)cap1 * 4 : 0}, {&ws->sh_tile, S ? (size_t)(cap1 / bm + 1) * 4 : 0},
        {&ws->sh_total, S ? 4 : 0}, {&ws->sh_h, S ? (size_t)(M * S) * 2 : 0},
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
        model_moe_ws_destroy(ws);
        return mt_err_prefix(err, "moe workspace for %" PRId64 " tokens", max_m);
    }
    *out = ws;
    return MT_OK;
}

const void *model_moe_ws_ids(const model_moe_ws *ws) { return ws->ids; }

void model_moe_ws_routing(model_moe_ws *ws, void **ids, void **tw)
{
    *ids = ws->ids;
    *tw = ws->tw;
}

static mt_status fits(const model_moe_ws *ws, const moe_dims *d, int64_t M, mt_err *err)
{
    const moe_dims *c = &ws->d;
    if (M > ws->max_m || d->n_experts != c->n_experts || d->topk != c->topk ||
        moe_dims_bm(d) != moe_dims_bm(c) || d->inter > c->inter || d->hidden != c->hidden ||
        d->shared_inter > c->shared_inter || (d->comb && !c->comb))
        return mt_fail(err, MT_E_INVALID, "moe layer: M=%" PRId64 " with E=%lld topk=%d I=%lld "
                       "shared=%lld does not fit a workspace for M=%" PRId64 ", E=%lld topk=%d "
                       "I=%lld shared=%lld", M, (long long)d->n_experts, d->topk,
                       (long long)d->inter, (long long)d->shared_inter, ws->max_m,
                       (long long)c->n_experts, c->topk, (long long)c->inter,
                       (long long)c->shared_inter);
    return MT_OK;
}

/* One kernel of the layer; timed into ws->kernel_ms[slot] when asked. */
#define RUN(slot, k, ...)                                                                        \
    do {                                                                                         \
        void *bufs_[] = {__VA_ARGS__};                                                           \
        double t0_ = 0;                                                                          \
        mt_status s_ = ws->kernel_ms ? dev_synchronize(ws->dev, err) : MT_OK;                    \
        if (s_ == MT_OK) {                                                                       \
            t0_ = mt_now_ms();                                                                   \
            s_ = model_kern_run((k), M, NULL, bufs_, err);                                       \
        }                                                                                        \
        if (s_ == MT_OK && ws->kernel_ms && (s_ = dev_synchronize(ws->dev, err)) == MT_OK)       \
            ws->kernel_ms[slot] += mt_now_ms() - t0_;                                            \
        if (s_ != MT_OK)                                                                         \
            return mt_err_prefix(err, "moe layer");                                              \
    } while (0)

/* The layer; routed by k->route into the workspace first where ids is
 * NULL, else by ids and tw. */
static mt_status run_layer(const model_moe_kernels *k, model_moe_ws *ws, const moe_dims *d,
                           const moe_weights *w, const void *x, const void *ids,
                           const void *tw, int64_t M, float *y, mt_err *err)
{
    if (M <= 0)
        return MT_OK;
    mt_status st = fits(ws, d, M, err);
    /* y starts at zero where something adds into it: the atomic combine,
     * or the combine's "shared" input when no shared expert writes rows. */
    void *xv = (void *)(uintptr_t)x, *yv = y;
    void *shared = d->shared_inter && d->comb ? ws->sh_rows : yv;
    if (st == MT_OK && shared == yv)
        st = dev_memset(ws->dev, y, 0, (size_t)(M * d->hidden) * 4, err);
    if (st != MT_OK)
        return st;
    if (d->shared_inter) {
        RUN(MODEL_MOE_SH_ALIGN, k->sh_align, ws->sh_ids, ws->sh_sorted, ws->sh_tile,
            ws->sh_total);
        RUN(MODEL_MOE_SH_UP, k->sh_up, xv, ws->sh_ids, ws->sh_sorted, ws->sh_tile, ws->sh_total,
            (void *)w->sh_w13, (void *)w->sh_s13, ws->sh_h);
        RUN(MODEL_MOE_SH_DOWN, k->sh_down, ws->sh_h, ws->sh_ids, ws->sh_sorted, ws->sh_tile,
            ws->sh_total, ws->sh_w, (void *)w->sh_w2, (void *)w->sh_s2, shared);
    }
    void *idv = (void *)(uintptr_t)ids, *twv = (void *)(uintptr_t)tw;
    if (!ids) {
        RUN(MODEL_MOE_ROUTE, k->route, xv, (void *)w->gate, (void *)w->bias, ws->ids, ws->tw);
        idv = ws->ids;
        twv = ws->tw;
    }
    RUN(MODEL_MOE_ALIGN, k->align, idv, ws->sorted, ws->tile, ws->total);
    RUN(MODEL_MOE_UP, k->up, xv, idv, ws->sorted, ws->tile, ws->total, (void *)w->w13,
        (void *)w->s13, ws->h);
    RUN(MODEL_MOE_DOWN, k->down, ws->h, idv, ws->sorted, ws->tile, ws->total, twv,
        (void *)w->w2, (void *)w->s2, d->comb ? ws->rows : yv);
    if (d->comb)
        RUN(MODEL_MOE_COMBINE, k->combine, ws->rows, shared, yv);
    return MT_OK;
}

mt_status model_moe_run(const model_moe_kernels *k, model_moe_ws *ws, const moe_dims *d,
                        const moe_weights *w, const void *x, int64_t M, float *y, mt_err *err)
{
    return run_layer(k, ws, d, w, x, NULL, NULL, M, y, err);
}

mt_status model_moe_run_routed(const model_moe_kernels *k, model_moe_ws *ws, const moe_dims *d,
                               const moe_weights *w, const void *x, const void *ids,
                               const void *tw, int64_t M, float *y, mt_err *err)
{
    if (!ids || !tw)
        return mt_fail(err, MT_E_INVALID, "moe layer: a routed run without its %s",
                       ids ? "weights" : "expert ids");
    return run_layer(k, ws, d, w, x, ids, tw, M, y, err);
}

#undef RUN
