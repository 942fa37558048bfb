/* moe.h: the MoE layer for the model runtime, built from the MoE kernel
 * families: route -> align -> gate/up GEMM -> down GEMM (-> combine), plus
 * the shared expert, each stage with its own config.
 *
 *   moe_stage  one family compiled for one shape and config on a device;
 *              runs on caller-owned device buffers in the family's buffer
 *              order (what the tuner measured). Owns its module and a
 *              scratch buffer that grows with M.
 *   moe        the layer: owns its stages and a workspace that grows with
 *              M; the weights are the caller's device buffers (Quark MXFP4
 *              layout, see moe_weights), never copied.
 *
 * moe_reference() is the plain C layer on host arrays (the test oracle).
 *
 * Ownership: create/destroy pairs; destroy(NULL) is a no-op; everything
 * created must be destroyed before the device is closed. Failures return
 * an mt_status with err naming the stage. Thread safety: one object per
 * thread (they launch on the device's stream and reuse their workspace). */
#ifndef MT_KERN_MOE_H
#define MT_KERN_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "../common/status.h"
#include "../device/device.h"
#include "family.h"

typedef struct moe_stage moe_stage;

/* Compiles family `family` for shape_key (a preset or a key; runtime dims
 * included) with cfg, or the family's default for m_hint when cfg is NULL.
 * An invalid cfg is MT_E_INVALID with the reason. */
mt_status moe_stage_create(dev_device *d, const char *family, const char *shape_key,
                           const kern_config *cfg, int64_t m_hint, moe_stage **out,
                           mt_err *err);
/* Runs the stage for m tokens on bufs (device pointers in the family's
 * buffer order). Grows the stage's scratch when needed. */
mt_status moe_stage_run(moe_stage *st, int64_t m, void *const *bufs, mt_err *err);
const kern_config *moe_stage_config(const moe_stage *st);
const kern_family *moe_stage_family(const moe_stage *st);
const kern_shape *moe_stage_shape(const moe_stage *st);
void moe_stage_destroy(moe_stage *st);

typedef struct moe_dims {
    int64_t hidden;       /* H */
    int64_t inter;        /* I: routed expert intermediate size */
    int64_t n_experts;    /* E */
    int topk, ngroup, topkg;
    float scale;          /* routed_scaling_factor */
    bool norm;            /* norm_topk_prob */
    bool a4;              /* MXFP4 activations (a4w4) as Quark's input_tensors ask */
    int64_t shared_inter; /* shared expert intermediate size; 0 = none */
    int comb;             /* 0: down accumulates with atomics; 1: rows + moe_combine */
} moe_dims;

/* Device pointers owned by the caller. Routed experts: w13 [E, 2I, H/2]
 * with s13 [E, 2I, H/32] (gate rows, then up rows), w2 [E, H, I/2] with s2
 * [E, H, I/32]; the shared expert the same with E = 1 and its own width. */
typedef struct moe_weights {
    const void *gate;  /* bf16 [E, H] router weight */
    const void *bias;  /* f32 [E] e_score_correction_bias */
    const void *w13, *s13, *w2, *s2;
    const void *sh_w13, *sh_s13, *sh_w2, *sh_s2;
} moe_weights;

/* Per-stage configs; NULL entries take the family default for m_hint. */
typedef struct moe_configs {
    const kern_config *route, *align, *up, *down, *combine, *sh_up, *sh_down;
} moe_configs;

typedef struct moe moe;

mt_status moe_create(dev_device *d, const moe_dims *dims, const moe_weights *w,
                     const moe_configs *cfgs, int64_t m_hint, moe **out, mt_err *err);
/* y[M, H] (f32, device) = sum_k w_k expert_k(x) + shared(x) for x bf16
 * [M, H] (device). */
mt_status moe_forward(moe *m, const void *x, int64_t M, float *y, mt_err *err);
/* The layer's stage objects (for reports and benchmarks): "route",
 * "align", "up", "down", "combine", "sh_align", "sh_up", "sh_down"; NULL
 * when the layer has no such stage. */
moe_stage *moe_get_stage(moe *m, const char *name);
void moe_destroy(moe *m);

/* Host weights for moe_reference, same layouts as moe_weights. */
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
