/* api_moe.c: moetune_moe: a MoE layer on a device (see
 * include/moetune/moe.h). A layer is the runtime's served layer
 * (model/moe_layer.h): its dims as model_moe_dims makes them (the
 * deterministic combine, tiles of 128, the device's weight layout), its
 * kernels from a shared bundle (api_kernels.c), a shared workspace
 * (api_ws.c) and its weights (api_weights.c). ROUTE_GATE runs
 * model_moe_run itself, ROUTE_TOPK model_moe_run_routed on the caller's
 * routing, ROUTE_LOGITS routes the logits first (api_routed.h). */
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "api_impl.h"
#include "api_routed.h"
#include "api_weights.h"

struct moetune_moe {
    moetune_device *dev;
    moetune_moe_desc desc;
    moe_dims dims;
    api_kernels *kernels;
    api_ws *ws;
    api_weights w;
};

void moetune_moe_desc_init(moetune_moe_desc *d)
{
    if (!d)
        return;
    memset(d, 0, sizeof *d);
    d->struct_size = sizeof *d;
    d->n_group = 1;
    d->topk_group = 1;
    d->norm_topk = 1;
    d->routed_scale = 1.0f;
    d->act = MOETUNE_ACT_A16W4;
    d->weight_type = MOETUNE_WEIGHT_MXFP4;
    d->routing = MOETUNE_ROUTE_GATE;
    d->max_tokens = 256;
}

/* The description's faults, named; MOETUNE_OK when it can be built. */
static moetune_status check_desc(moetune_device *dev, const moetune_moe_desc *d)
{
    /* API version 1 has one struct size; a later version that appends
     * fields accepts this size too and defaults the fields it lacks. */
    if (d->struct_size != sizeof *d)
        return api_fail(dev, MOETUNE_E_MISUSE, "desc.struct_size is %u, not %zu: call "
                        "moetune_moe_desc_init first", d->struct_size, sizeof *d);
#define BAD(...) api_fail(dev, MOETUNE_E_INVALID, __VA_ARGS__)
    if (d->hidden <= 0 || d->hidden % 128 || d->hidden > 65536)
        return BAD("desc.hidden = %" PRId64 ": a multiple of 128 up to 65536", d->hidden);
    if (d->inter <= 0 || d->inter % 128 || d->inter > 65536)
        return BAD("desc.inter = %" PRId64 ": a multiple of 128 up to 65536", d->inter);
    if (d->shared_inter < 0 || d->shared_inter % 128 || d->shared_inter > 65536)
        return BAD("desc.shared_inter = %" PRId64 ": 0 or a multiple of 128 up to 65536",
                   d->shared_inter);
    if (d->experts < 2 || d->experts > 1024)
        return BAD("desc.experts = %" PRId64 ": 2 to 1024", d->experts);
    if (d->topk < 1 || d->topk > 32 || d->topk > d->experts)
        return BAD("desc.topk = %d: 1 to min(experts, 32)", d->topk);
    if (d->max_tokens < 1 || d->max_tokens > 65536)
        return BAD("desc.max_tokens = %" PRId64 ": 1 to 65536", d->max_tokens);
    if ((unsigned)d->act >= MOETUNE_ACT_COUNT)
        return BAD("desc.act = %d: not a moetune_act", (int)d->act);
    if ((unsigned)d->weight_type >= MOETUNE_WEIGHT_COUNT)
        return BAD("desc.weight_type = %d: not a moetune_weight_type", (int)d->weight_type);
    if ((unsigned)d->routing >= MOETUNE_ROUTE_COUNT)
        return BAD("desc.routing = %d: not a moetune_routing", (int)d->routing);
    if (d->routing != MOETUNE_ROUTE_TOPK) {
        int64_t E = d->experts, g = d->n_group;
        if (g < 1 || E % g || (g > 1 && E / g < 2))
            return BAD("desc.n_group = %d: must split %" PRId64 " experts into groups of at "
                       "least two", d->n_group, E);
        if (d->topk_group < 1 || d->topk_group > g || d->topk > d->topk_group * (E / g))
            return BAD("desc.topk_group = %d: 1 to n_group, keeping at least topk = %d "
                       "experts", d->topk_group, d->topk);
        if (!(d->routed_scale >= 0.0f && d->routed_scale <= 1000.0f))
            return BAD("desc.routed_scale = %g: 0 to 1000 (in thousandths)",
                       (double)d->routed_scale);
        if (d->norm_topk != 0 && d->norm_topk != 1)
            return BAD("desc.norm_topk = %d: 0 or 1", d->norm_topk);
    }
#undef BAD
    if (d->act == MOETUNE_ACT_A8W4 && dev->props->backend != DEV_BACKEND_CPU)
        return api_fail(dev, MOETUNE_E_UNSUPPORTED, "desc.act = A8W4: the int8-activation "
                        "kernels run on the cpu backend only, not on %s", dev->props->spec);
    return MOETUNE_OK;
}

/* The runtime's dims for d (model_moe_dims, from the description instead of
 * a config.json). */
static void dims_of(const moetune_device *dev, const moetune_moe_desc *d, moe_dims *out)
{
    *out = (moe_dims){.hidden = d->hidden, .inter = d->inter, .n_experts = d->experts,
                      .topk = d->topk, .ngroup = d->n_group, .topkg = d->topk_group,
                      .scale = d->routed_scale, .norm = d->norm_topk != 0,
                      .a4 = d->act == MOETUNE_ACT_A4W4, .a8 = d->act == MOETUNE_ACT_A8W4,
                      .shared_inter = d->shared_inter, .comb = 1, .bm = 128,
                      .wl = moe_weight_layout(dev->props->backend)};
    if (d->routing == MOETUNE_ROUTE_TOPK) {
        out->ngroup = out->topkg = 1; /* no router kernel; keys stay valid */
        out->scale = 1.0f;
        out->norm = false;
    }
}

static void layer_free(moetune_moe *l)
{
    moetune_device *dev = l->dev;
    if (dev->dev) {
        mt_err err = MT_ERR_INIT;
        (void)dev_synchronize(dev->dev, &err); /* queued runs read the weights */
        api_weights_free(dev->dev, &l->w);
    }
    api_ws_release(dev, l->ws);
    api_kernels_release(dev, l->kernels);
    free(l);
    api_device_release(dev);
}

moetune_status moetune_moe_create(moetune_device *dev, const moetune_moe_desc *d,
                                  const moetune_moe_weights *w, moetune_moe **out)
{
    if (out)
        *out = NULL;
    if (!dev)
        return MOETUNE_E_MISUSE;
    if (!dev->dev)
        return api_fail(dev, MOETUNE_E_MISUSE, "moe layer: the device did not open");
    if (!d || !w || !out)
        return api_fail(dev, MOETUNE_E_MISUSE, "moe layer: %s is NULL",
                        !d ? "desc" : !w ? "weights" : "out");
    moetune_status ps = check_desc(dev, d);
    if (ps != MOETUNE_OK)
        return ps;
    moetune_moe *l = calloc(1, sizeof *l);
    if (!l)
        return api_fail(dev, MOETUNE_E_NOMEM, "moe layer: out of memory");
    l->dev = dev;
    dev->refs++;
    l->desc = *d;
    dims_of(dev, d, &l->dims);
    mt_err err = MT_ERR_INIT;
    api_ws_kind kind = d->routing == MOETUNE_ROUTE_GATE ? API_WS_LAYER : API_WS_ROUTED;
    mt_status st = api_weights_setup(dev->dev, &l->dims, d->routing, w, &l->w, &err);
    if (st == MT_OK)
        st = api_kernels_get(dev, &l->dims, d->routing, d->max_tokens, &l->kernels, &err);
    if (st == MT_OK)
        st = api_ws_get(dev, kind, &l->dims, d->max_tokens, &l->ws, &err);
    if (st != MT_OK) {
        mt_err_prefix(&err, "moe layer H=%" PRId64 " I=%" PRId64 " E=%" PRId64 " top-%d on %s",
                      d->hidden, d->inter, d->experts, d->topk, dev->props->spec);
        layer_free(l);
        return api_done(dev, st, &err);
    }
    *out = l;
    return api_done(dev, MT_OK, NULL);
}

void moetune_moe_destroy(moetune_moe *layer)
{
    if (layer)
        layer_free(layer);
}

/* What every run checks; MOETUNE_OK to go on. */
static moetune_status check_run(moetune_moe *l, moetune_routing want, const void *x,
                                int64_t m, const float *y, void *stream)
{
    moetune_device *dev = l->dev;
    const moetune_routing r = l->desc.routing;
    static const char *const names[MOETUNE_ROUTE_COUNT] = {"ROUTE_GATE", "ROUTE_LOGITS",
                                                           "ROUTE_TOPK"};
    if (want != r && !(want == MOETUNE_ROUTE_TOPK && r == MOETUNE_ROUTE_LOGITS))
        return api_fail(dev, MOETUNE_E_MISUSE, "moe run: the layer was created with %s; this "
                        "call is for %s layers", names[r], names[want]);
    if (m < 0 || m > l->desc.max_tokens)
        return api_fail(dev, MOETUNE_E_INVALID, "moe run: m = %" PRId64 ", the layer takes 0 "
                        "to %" PRId64 " tokens (desc.max_tokens)", m, l->desc.max_tokens);
    if (stream)
        return api_fail(dev, MOETUNE_E_UNSUPPORTED, "moe run: stream %p: this version runs on "
                        "the device's own queue only (pass NULL)", stream);
    if (m && (!x || !y))
        return api_fail(dev, MOETUNE_E_INVALID, "moe run: %s is NULL", !x ? "x" : "y");
    if ((uintptr_t)x % 16 || (uintptr_t)y % 16)
        return api_fail(dev, MOETUNE_E_INVALID, "moe run: %s (%p) is not aligned to 16 bytes",
                        (uintptr_t)x % 16 ? "x" : "y", (uintptr_t)x % 16 ? x : (const void *)y);
    return MOETUNE_OK;
}

moetune_status moetune_moe_run(moetune_moe *layer, const void *x, int64_t m, float *y,
                               void *stream)
{
    if (!layer)
        return MOETUNE_E_MISUSE;
    moetune_status ps = check_run(layer, MOETUNE_ROUTE_GATE, x, m, y, stream);
    if (ps != MOETUNE_OK)
        return ps;
    mt_err err = MT_ERR_INIT;
    mt_status st = model_moe_run(&layer->kernels->layer, layer->ws->layer, &layer->dims,
                                 &layer->w.w, x, m, y, &err);
    return api_done(layer->dev, st, &err);
}

moetune_status moetune_moe_run_logits(moetune_moe *layer, const void *x, const void *logits,
                                      int64_t m, float *y, void *stream)
{
    if (!layer)
        return MOETUNE_E_MISUSE;
    moetune_status ps = check_run(layer, MOETUNE_ROUTE_LOGITS, x, m, y, stream);
    if (ps != MOETUNE_OK)
        return ps;
    if (m && (!logits || (uintptr_t)logits % 16))
        return api_fail(layer->dev, MOETUNE_E_INVALID, "moe run: logits (%p) %s", logits,
                        logits ? "is not aligned to 16 bytes" : "is NULL");
    mt_err err = MT_ERR_INIT;
    mt_status st = api_routed_run_logits(&layer->kernels->layer, layer->kernels->route_logits,
                                         layer->ws->routed, &layer->dims, &layer->w.w,
                                         layer->w.eye, x, logits, m, y, &err);
    return api_done(layer->dev, st, &err);
}

moetune_status moetune_moe_run_topk(moetune_moe *layer, const void *x, const int32_t *topk_ids,
                                    const float *topk_weights, int64_t m, float *y,
                                    void *stream)
{
    if (!layer)
        return MOETUNE_E_MISUSE;
    moetune_status ps = check_run(layer, MOETUNE_ROUTE_TOPK, x, m, y, stream);
    if (ps != MOETUNE_OK)
        return ps;
    moetune_device *dev = layer->dev;
    if (m && (!topk_ids || !topk_weights || (uintptr_t)topk_ids % 16 ||
              (uintptr_t)topk_weights % 16))
        return api_fail(dev, MOETUNE_E_INVALID, "moe run: topk_ids (%p) and topk_weights (%p) "
                        "must be set and aligned to 16 bytes", (const void *)topk_ids,
                        (const void *)topk_weights);
    /* Host memory: an id out of range would have the kernels index past
     * the weights; say which instead. */
    if (dev->props->backend == DEV_BACKEND_CPU || dev->props->backend == DEV_BACKEND_EMU)
        for (int64_t i = 0; i < m * layer->dims.topk; i++)
            if (topk_ids[i] < 0 || topk_ids[i] >= layer->dims.n_experts)
                return api_fail(dev, MOETUNE_E_INVALID, "moe run: topk_ids[%" PRId64 "][%d] "
                                "= %d is not an expert (0 to %" PRId64 ")",
                                i / layer->dims.topk, (int)(i % layer->dims.topk), topk_ids[i],
                                layer->dims.n_experts - 1);
    mt_err err = MT_ERR_INIT;
    mt_status st = model_moe_run_routed(&layer->kernels->layer, layer->ws->routed,
                                        &layer->dims, &layer->w.w, x, topk_ids, topk_weights,
                                        m, y, &err);
    return api_done(dev, st, &err);
}

int moetune_moe_selection_count(const moetune_moe *layer)
{
    return layer ? layer->kernels->n_sel : 0;
}

moetune_status moetune_moe_selection(const moetune_moe *layer, int i, moetune_selection *out)
{
    if (!layer || !out)
        return MOETUNE_E_MISUSE;
    if (i < 0 || i >= layer->kernels->n_sel)
        return api_fail(layer->dev, MOETUNE_E_INVALID, "selection %d: the layer has %d", i,
                        layer->kernels->n_sel);
    *out = layer->kernels->sel[i];
    return api_done(layer->dev, MT_OK, NULL);
}

const char *moetune_moe_report(const moetune_moe *layer)
{
    return layer ? layer->kernels->report : "";
}
