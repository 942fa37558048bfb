/* api_test_util.h: what the tests of the public API (include/moetune/)
 * share: a small layer's random weights in host memory (the checkpoint's
 * layout), its description, its routing and output by the plain C
 * references of the MoE kernels (moe_reference, moe_route_ref_token), and
 * the layer tests' comparison rule. Not a test by itself. */
#ifndef MT_TEST_API_UTIL_H
#define MT_TEST_API_UTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/moe/moe.h"
#include "kernels/moe/moe_common.h"
#include "kernels/moe_glm_util.h"
#include "moetune/moetune.h"

/* A layer's shape, with the dims the library gives the runtime for it. */
typedef struct api_layer {
    moe_dims d;     /* act and routing as the runtime reads them */
    layer_host w;   /* Quark layout, host memory */
    moetune_moe_weights mw;
} api_layer;

/* Tiny dims (H 256, I 128, 16 experts, top-4, shared 128); groups > 1 uses
 * 32 experts in 4 groups with 2 kept. */
static inline void api_layer_make(api_layer *l, moetune_act act, int groups, uint64_t seed)
{
    memset(l, 0, sizeof *l);
    l->d = (moe_dims){.hidden = 256, .inter = 128, .n_experts = groups > 1 ? 32 : 16,
                      .topk = 4, .ngroup = groups > 1 ? 4 : 1, .topkg = groups > 1 ? 2 : 1,
                      .scale = 2.5f, .norm = true, .a4 = act == MOETUNE_ACT_A4W4,
                      .a8 = act == MOETUNE_ACT_A8W4, .shared_inter = 128, .comb = 1};
    layer_host_make(&l->d, seed, &l->w);
    l->mw = (moetune_moe_weights){.gate = l->w.gate, .bias = l->w.bias, .w13 = l->w.w13,
                                  .s13 = l->w.s13, .w2 = l->w.w2, .s2 = l->w.s2,
                                  .shared_w13 = l->w.sh_w13, .shared_s13 = l->w.sh_s13,
                                  .shared_w2 = l->w.sh_w2, .shared_s2 = l->w.sh_s2};
}

static inline void api_layer_free(api_layer *l) { layer_host_free(&l->w); }

static inline void api_layer_desc(const api_layer *l, moetune_act act, moetune_routing r,
                                  int64_t max_m, moetune_moe_desc *out)
{
    moetune_moe_desc_init(out);
    out->hidden = l->d.hidden, out->inter = l->d.inter, out->experts = l->d.n_experts;
    out->topk = l->d.topk, out->n_group = l->d.ngroup, out->topk_group = l->d.topkg;
    out->routed_scale = l->d.scale, out->norm_topk = 1, out->act = act, out->routing = r;
    out->shared_inter = l->d.shared_inter, out->max_tokens = max_m;
}

/* Whether token t of x routes near a tie (two biased scores within 1e-5
 * across the top-k boundary), where float and double may choose apart. */
static inline bool api_near_tie(const api_layer *l, const uint16_t *xt)
{
    moe_route_dims rd = {.h = l->d.hidden, .e = l->d.n_experts, .topk = l->d.topk,
                         .ngroup = l->d.ngroup, .topkg = l->d.topkg, .scale = l->d.scale,
                         .norm = l->d.norm};
    double choice[64];
    int32_t ids[8];
    float w[8];
    moe_route_ref_token(&rd, xt, l->w.gate, l->w.bias, ids, w, choice, NULL);
    bool tie = false;
    for (int e = 0; e < l->d.n_experts; e++)
        for (int j = 0; j < l->d.topk; j++)
            tie |= e != ids[j] && isfinite(choice[e]) && fabs(choice[e] - choice[ids[j]]) < 1e-5;
    return tie;
}

/* The layer tests' rule (test_moe_pipeline): every output within 1e-2 of
 * its token's largest reference value plus 1e-2 relative. Returns the
 * first token off (skipping the tokens skip marks, may be NULL), or -1. */
static inline int64_t api_first_off(const float *got, const float *want, int64_t M, int64_t H,
                                    const bool *skip)
{
    for (int64_t t = 0; t < M; t++) {
        if (skip && skip[t])
            continue;
        double rowmax = 0;
        for (int64_t n = 0; n < H; n++)
            rowmax = fmax(rowmax, fabs(want[t * H + n]));
        for (int64_t n = 0; n < H; n++) {
            double g = got[t * H + n], v = want[t * H + n];
            if (!(fabs(g - v) <= 1e-2 * rowmax + 1e-2 * fabs(v)))
                return t;
        }
    }
    return -1;
}

/* n bytes of 64-byte-aligned host memory (C11's aligned_alloc wants a
 * multiple of the alignment); free() releases it. */
static inline void *api_alloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    cr_assert(p);
    return p;
}

/* Random bf16 activations [M, H] in 64-byte-aligned host memory. */
static inline uint16_t *api_input(int64_t M, int64_t H, uint64_t seed)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    uint16_t *x = api_alloc((size_t)(M * H) * 2);
    moe_gen_bf16(&r, x, M * H, 1.0f);
    return x;
}

#endif
