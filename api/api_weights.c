/* api_weights.c: a layer's weights (see api_weights.h). */
#include "api_weights.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api_routed.h"
#include "kernels/moe/moe_common.h"

void api_weights_free(dev_device *dev, api_weights *w)
{
    for (int i = 0; i < w->n_own; i++)
        dev_free(dev, w->own[i]);
    memset(w, 0, sizeof *w);
}

static mt_status alloc_own(dev_device *dev, api_weights *w, size_t n, void **p, mt_err *err)
{
    MT_CHECK(dev_alloc(dev, n, p, err));
    w->own[w->n_own++] = *p;
    return MT_OK;
}

/* ---- regrouping for the cpu kernels, on a few threads ------------------ */

typedef struct group_job {
    const uint8_t *packed, *scales;
    int64_t rows, k;
    uint8_t *out;
} group_job;

static void *group_part(void *arg)
{
    const group_job *j = arg;
    moe_w4_group16(j->packed, j->scales, j->rows, j->k, j->out);
    return NULL;
}

/* moe_w4_group16 of rows x k (rows a multiple of 16) into out, split into
 * row ranges of whole 16-row groups: each range's input and output are
 * contiguous. */
static void group16(const uint8_t *packed, const uint8_t *scales, int64_t rows, int64_t k,
                    uint8_t *out, int threads)
{
    enum { MAX_THREADS = 16 };
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    int64_t groups = rows / 16;
    if (threads > groups)
        threads = (int)groups;
    if (threads < 2) {
        moe_w4_group16(packed, scales, rows, k, out);
        return;
    }
    group_job jobs[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    bool started[MAX_THREADS] = {0};
    int64_t g0 = 0;
    for (int t = 0; t < threads; t++) {
        int64_t g1 = groups * (t + 1) / threads, r0 = g0 * 16, n = (g1 - g0) * 16;
        jobs[t] = (group_job){packed + r0 * k / 2, scales + r0 * k / 32, n, k,
                              out + r0 * (k / 2 + k / 32)};
        started[t] = pthread_create(&th[t], NULL, group_part, &jobs[t]) == 0;
        if (!started[t])
            group_part(&jobs[t]);
        g0 = g1;
    }
    for (int t = 0; t < threads; t++)
        if (started[t])
            pthread_join(th[t], NULL);
}

/* The weights of one rows x k MXFP4 matrix in the device's layout d->wl. */
static mt_status matrix(dev_device *dev, const moe_dims *d, api_weights *w, const void *packed,
                        const void *scales, int64_t rows, int64_t k, const void **wout,
                        const void **sout, mt_err *err)
{
    if (d->wl == 0) {
        *wout = packed;
        *sout = scales;
        return MT_OK;
    }
    void *g = NULL, *empty = NULL;
    MT_CHECK(alloc_own(dev, w, (size_t)moe_w4_bytes(1, rows, k), &g, err));
    /* The scales ride in the weights' buffer; the kernels get an empty
     * scale buffer, as the runtime gives them. */
    MT_CHECK(alloc_own(dev, w, 16, &empty, err));
    group16(packed, scales, rows, k, g, dev_get_props(dev)->compute_units);
    *wout = g;
    *sout = empty;
    return MT_OK;
}

/* want: 1 required, 0 must be NULL (a shared expert's weights without one:
 * the description and the weights disagree), -1 optional. */
static mt_status need(const void *p, const char *name, int want, mt_err *err)
{
    if (want == 1 && !p)
        return mt_fail(err, MT_E_INVALID, "weights: %s is NULL", name);
    if (want == 0 && p)
        return mt_fail(err, MT_E_INVALID, "weights: %s is set, but desc.shared_inter is 0",
                       name);
    if ((uintptr_t)p % 16)
        return mt_fail(err, MT_E_INVALID, "weights: %s (%p) is not aligned to 16 bytes", name,
                       p);
    return MT_OK;
}

static mt_status setup(dev_device *dev, const moe_dims *d, moetune_routing r,
                       const moetune_moe_weights *in, api_weights *w, mt_err *err)
{
    /* The router's weight and bias are read only by the routings that use
     * them (moetune/moe.h) and ignored by the others. */
    int sh = d->shared_inter > 0, gate = r == MOETUNE_ROUTE_GATE ? 1 : -1;
    struct {
        const void *p;
        const char *name;
        int want;
    } chk[] = {
        {in->gate, "gate", gate}, {in->bias, "bias", -1},
        {in->w13, "w13", 1}, {in->s13, "s13", 1}, {in->w2, "w2", 1}, {in->s2, "s2", 1},
        {in->shared_w13, "shared_w13", sh}, {in->shared_s13, "shared_s13", sh},
        {in->shared_w2, "shared_w2", sh}, {in->shared_s2, "shared_s2", sh},
    };
    for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++)
        MT_CHECK(need(chk[i].p, chk[i].name, chk[i].want, err));
    int64_t H = d->hidden, I = d->inter, E = d->n_experts, S = d->shared_inter;
    w->w.gate = r == MOETUNE_ROUTE_GATE ? in->gate : NULL;
    w->w.bias = r == MOETUNE_ROUTE_TOPK ? NULL : in->bias;
    if (r != MOETUNE_ROUTE_TOPK && !in->bias) {
        void *z = NULL;
        MT_CHECK(alloc_own(dev, w, (size_t)E * 4, &z, err));
        MT_CHECK(dev_memset(dev, z, 0, (size_t)E * 4, err));
        w->w.bias = z;
    }
    if (r == MOETUNE_ROUTE_LOGITS) {
        uint16_t *eye = api_routed_identity(E);
        void *p = NULL;
        if (!eye)
            return mt_fail(err, MT_E_NOMEM, "identity router weight");
        mt_status st = alloc_own(dev, w, (size_t)(E * E) * 2, &p, err);
        if (st == MT_OK)
            st = dev_copy_to(dev, p, eye, (size_t)(E * E) * 2, err);
        free(eye);
        MT_CHECK(st);
        w->eye = p;
    }
    MT_CHECK(matrix(dev, d, w, in->w13, in->s13, E * 2 * I, H, &w->w.w13, &w->w.s13, err));
    MT_CHECK(matrix(dev, d, w, in->w2, in->s2, E * H, I, &w->w.w2, &w->w.s2, err));
    if (S) {
        MT_CHECK(matrix(dev, d, w, in->shared_w13, in->shared_s13, 2 * S, H, &w->w.sh_w13,
                        &w->w.sh_s13, err));
        MT_CHECK(matrix(dev, d, w, in->shared_w2, in->shared_s2, H, S, &w->w.sh_w2,
                        &w->w.sh_s2, err));
    }
    return MT_OK;
}

mt_status api_weights_setup(dev_device *dev, const moe_dims *d, moetune_routing r,
                            const moetune_moe_weights *in, api_weights *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    if (!in)
        return mt_fail(err, MT_E_INVALID, "weights are NULL");
    mt_status st = setup(dev, d, r, in, out, err);
    if (st != MT_OK)
        api_weights_free(dev, out);
    return st;
}
