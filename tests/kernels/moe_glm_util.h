/* moe_glm_util.h: helpers shared by the MoE layer tests: random layer
 * weights in host memory and their upload. Not a test by itself. */
#ifndef MT_TEST_MOE_UTIL_H
#define MT_TEST_MOE_UTIL_H

#include <stdlib.h>

#include "common/rng.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_common.h"

typedef struct layer_host {
    uint16_t *gate;
    float *bias;
    uint8_t *w13, *s13, *w2, *s2, *sh_w13, *sh_s13, *sh_w2, *sh_s2;
} layer_host;

static inline void layer_host_make(const moe_dims *d, uint64_t seed, layer_host *l)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    int64_t H = d->hidden, I = d->inter, E = d->n_experts, S = d->shared_inter;
    l->gate = malloc((size_t)(E * H) * 2);
    l->bias = malloc((size_t)E * 4);
    moe_gen_bf16(&r, l->gate, E * H, 2.0f / sqrtf((float)H));
    for (int64_t e = 0; e < E; e++)
        l->bias[e] = mt_rng_uniform(&r, -0.1f, 0.1f);
    l->w13 = malloc((size_t)(E * 2 * I * H / 2));
    l->s13 = malloc((size_t)(E * 2 * I * H / 32));
    l->w2 = malloc((size_t)(E * H * I / 2));
    l->s2 = malloc((size_t)(E * H * I / 32));
    moe_gen_mxfp4(&r, l->w13, l->s13, E * 2 * I, H);
    moe_gen_mxfp4(&r, l->w2, l->s2, E * H, I);
    l->sh_w13 = l->sh_s13 = l->sh_w2 = l->sh_s2 = NULL;
    if (S) {
        l->sh_w13 = malloc((size_t)(2 * S * H / 2));
        l->sh_s13 = malloc((size_t)(2 * S * H / 32));
        l->sh_w2 = malloc((size_t)(H * S / 2));
        l->sh_s2 = malloc((size_t)(H * S / 32));
        moe_gen_mxfp4(&r, l->sh_w13, l->sh_s13, 2 * S, H);
        moe_gen_mxfp4(&r, l->sh_w2, l->sh_s2, H, S);
    }
}

static inline void layer_host_free(layer_host *l)
{
    void *p[] = {l->gate, l->bias, l->w13, l->s13, l->w2, l->s2,
                 l->sh_w13, l->sh_s13, l->sh_w2, l->sh_s2};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
}

static inline moe_host_weights layer_host_weights(const layer_host *l)
{
    return (moe_host_weights){l->gate, l->bias, l->w13, l->s13, l->w2, l->s2,
                              l->sh_w13, l->sh_s13, l->sh_w2, l->sh_s2};
}

#endif
