/* moe.c: the MoE layer's kernel keys and its plain C reference (see moe.h). */
#include "moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_common.h"

/* The kernels' activation dtype ("a=" of the GEMM keys). */
static const char *dt(const moe_dims *d) { return d->a8 ? "i8" : d->a4 ? "mxfp4" : "bf16"; }

int moe_weight_layout(dev_backend backend)
{
    return backend == DEV_BACKEND_CPU ? 1 : 0;
}

void moe_layer_keys(const moe_dims *d, moe_keys *k)
{
    memset(k, 0, sizeof *k);
    int bm = moe_dims_bm(d);
    long long H = d->hidden, I = d->inter, E = d->n_experts, S = d->shared_inter;
    const char *wl = d->wl == 1 ? ",wl=1" : ""; /* the dim is left out at 0 */
    snprintf(k->route, sizeof k->route,
             "H=%lld,E=%lld,topk=%d,ngroup=%d,topkg=%d,rsf=%d,norm=%d", H, E, d->topk, d->ngroup,
             d->topkg, (int)lround(d->scale * 1000.0), d->norm ? 1 : 0);
    snprintf(k->align, sizeof k->align, "E=%lld,topk=%d,bm=%d,skew=0", E, d->topk, bm);
    snprintf(k->up, sizeof k->up, "H=%lld,I=%lld,E=%lld,topk=%d,a=%s,cat=1%s,bm=%d,skew=0", H,
             I, E, d->topk, dt(d), wl, bm);
    snprintf(k->down, sizeof k->down,
             "H=%lld,I=%lld,E=%lld,topk=%d,a=%s,comb=%d%s,bm=%d,skew=0", H, I, E, d->topk, dt(d),
             d->comb ? 1 : 0, wl, bm);
    if (d->comb)
        snprintf(k->combine, sizeof k->combine, "H=%lld,topk=%d,shared=1,o=f32", H, d->topk);
    if (!S)
        return;
    snprintf(k->sh_align, sizeof k->sh_align, "E=1,topk=1,bm=%d,skew=0", bm);
    snprintf(k->sh_up, sizeof k->sh_up, "H=%lld,I=%lld,E=1,topk=1,a=%s,cat=1%s,bm=%d,skew=0", H,
             S, dt(d), wl, bm);
    /* With the deterministic combine the shared expert writes rows too
     * (its split-K, where a config has one, then sums in a fixed order). */
    snprintf(k->sh_down, sizeof k->sh_down,
             "H=%lld,I=%lld,E=1,topk=1,a=%s,comb=%d%s,bm=%d,skew=0", H, S, dt(d),
             d->comb ? 1 : 0, wl, bm);
}

/* ---- reference --------------------------------------------------------- */

static void expert_ref(const moe_gemm_dims *g, const uint16_t *x, int64_t M, const int32_t *ids,
                       const float *tw, const uint8_t *w13, const uint8_t *s13,
                       const uint8_t *w2, const uint8_t *s2, float *y)
{
    int64_t P = M * g->topk, H = g->h, I = g->i;
    uint16_t *h = malloc((size_t)(P * I) * 2);
    moe_up_ref(g, x, ids, w13, s13, w13 + I * H / 2, s13 + I * H / 32, 2 * I * H / 2,
               2 * I * H / 32, 0, P, 1, h);
    moe_down_ref(g, h, ids, tw, w2, s2, 0, P, 1, NULL, y);
    free(h);
}

void moe_reference(const moe_dims *d, const moe_host_weights *w, const uint16_t *x, int64_t M,
                   float *y, int32_t *ids_out, float *tw_out)
{
    int64_t H = d->hidden, P = M * d->topk;
    memset(y, 0, sizeof(float) * (size_t)(M * H));
    if (d->shared_inter) {
        moe_gemm_dims g = {.h = H, .i = d->shared_inter, .e = 1, .topk = 1, .a4 = d->a4,
                           .a8 = d->a8};
        int32_t *zero = calloc((size_t)M, 4);
        float *one = malloc((size_t)M * 4);
        for (int64_t i = 0; i < M; i++)
            one[i] = 1.0f;
        expert_ref(&g, x, M, zero, one, w->sh_w13, w->sh_s13, w->sh_w2, w->sh_s2, y);
        free(zero);
        free(one);
    }
    moe_route_dims rd = {.h = H, .e = d->n_experts, .topk = d->topk, .ngroup = d->ngroup,
                         .topkg = d->topkg, .scale = d->scale, .norm = d->norm};
    int32_t *ids = malloc((size_t)P * 4);
    float *tw = malloc((size_t)P * 4);
    for (int64_t t = 0; t < M; t++)
        moe_route_ref_token(&rd, x + t * H, w->gate, w->bias, ids + t * d->topk,
                            tw + t * d->topk, NULL, NULL);
    moe_gemm_dims g = {.h = H, .i = d->inter, .e = d->n_experts, .topk = d->topk, .a4 = d->a4,
                       .a8 = d->a8};
    expert_ref(&g, x, M, ids, tw, w->w13, w->s13, w->w2, w->s2, y);
    if (ids_out)
        memcpy(ids_out, ids, (size_t)P * 4);
    if (tw_out)
        memcpy(tw_out, tw, (size_t)P * 4);
    free(ids);
    free(tw);
}
