/* moe.h: the MoE layer as the MoE kernel families compute it: route ->
 * align -> gate/up GEMM -> down GEMM (-> combine), plus the shared expert
 * as a one-expert MoE on the same GEMMs. Here: the layer's dimensions, its
 * weights' layouts, the shape keys of its kernels and moe_reference(), the
 * plain C layer on host arrays (the test oracle). The layer that runs on a
 * device, the one the server runs and `moetune bench` times, is
 * model/moe_layer.h.
 *
 * Pure functions on caller-owned memory; thread-safe. */
#ifndef MT_KERN_MOE_H
#define MT_KERN_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "device/device.h"
#include "kernels/core/family.h"

typedef struct moe_dims {
    int64_t hidden;       /* H */
    int64_t inter;        /* I: routed expert intermediate size */
    int64_t n_experts;    /* E */
    int topk, ngroup, topkg;
    float scale;          /* routed_scaling_factor */
    bool norm;            /* norm_topk_prob */
    bool a4;              /* MXFP4 activations (a4w4) as Quark's input_tensors ask */
    bool a8;              /* int8 activations per 32-block (a8w4, cpu kernels; a4 false) */
    int64_t shared_inter; /* shared expert intermediate size; 0 = none */
    int comb;             /* 0: down accumulates with atomics; 1: rows + moe_combine */
    int bm;               /* rows per tile of the aligned (expert-sorted) layout; 0 = 128 */
    int wl;               /* expert weights' layout: 0 Quark rows, 1 grouped by 16 rows
                             (moe_w4_group16; the cpu tiles); the GEMM keys' wl */
} moe_dims;

/* The expert weight layout a layer on a device of this backend uses: 1
 * (rows grouped by 16) on cpu, whatever the activations, else 0 (the GPU
 * kernels read Quark rows). */
int moe_weight_layout(dev_backend backend);

/* The tile height dims uses (bm, or 128 when 0). */
static inline int moe_dims_bm(const moe_dims *d) { return d->bm > 0 ? d->bm : 128; }

/* The shape keys of the layer's kernels (one list, shared by the model's
 * kernel plan, the served layer and `moetune bench`). sh_* are empty when
 * the layer has no shared expert, combine when comb is 0. */
typedef struct moe_keys {
    char route[KERN_KEY_MAX], align[KERN_KEY_MAX], up[KERN_KEY_MAX], down[KERN_KEY_MAX],
        combine[KERN_KEY_MAX], sh_align[KERN_KEY_MAX], sh_up[KERN_KEY_MAX],
        sh_down[KERN_KEY_MAX];
} moe_keys;
void moe_layer_keys(const moe_dims *d, moe_keys *out);

/* Device pointers owned by the caller. Routed experts: w13 [E, 2I, H/2]
 * with s13 [E, 2I, H/32] (gate rows, then up rows), w2 [E, H, I/2] with s2
 * [E, H, I/32]; the shared expert the same with E = 1 and its own width.
 * In the layout dims.wl says (each matrix regrouped as a whole when 1). */
typedef struct moe_weights {
    const void *gate;  /* bf16 [E, H] router weight */
    const void *bias;  /* f32 [E] e_score_correction_bias */
    const void *w13, *s13, *w2, *s2;
    const void *sh_w13, *sh_s13, *sh_w2, *sh_s2;
} moe_weights;

/* Host weights for moe_reference, in Quark layout (whatever dims.wl says). */
typedef struct moe_host_weights {
    const uint16_t *gate;
    const float *bias;
    const uint8_t *w13, *s13, *w2, *s2;
    const uint8_t *sh_w13, *sh_s13, *sh_w2, *sh_s2;
} moe_host_weights;

/* Plain C reference of the layer (routing as moe_route, experts as the
 * GEMM references, h rounded to bf16 between the GEMMs). ids/topk_w, when
 * not NULL, receive the routing ([M, topk]). */
void moe_reference(const moe_dims *d, const moe_host_weights *w, const uint16_t *x, int64_t M,
                   float *y, int32_t *ids, float *topk_w);

#endif
