/* moe.h (moetune public API): a mixture-of-experts layer with MXFP4
 * experts, described by its shapes, run on buffers the caller owns. Part
 * of moetune.h; include that instead.
 *
 * The layer is the one the moetune runtime serves (GLM-5 / DeepSeek-V3
 * style):
 *
 *   y[M, H] = shared(x) + sum over the top-k experts e of token t of
 *             w[t, e] * down_e( silu(gate_e(x[t])) * up_e(x[t]) )
 *
 * with x bf16 [M, H] and y f32 [M, H]. The intermediate activations are
 * rounded to bf16 between the two expert GEMMs, as the kernels store them;
 * with act A4W4 (A8W4) the GEMM inputs are also quantized to MXFP4 (int8
 * per 32-block) first, as Quark's input_tensors ask.
 *
 * Routing (the runtime's, transformers' Glm4MoeMoE): score = sigmoid(
 * logits); the top-k experts by score + bias (the e_score_correction_bias
 * is used for the choice only), within the topk_group best of n_group
 * groups when n_group > 1 (a group scores the sum of its two best); ties
 * go to the lower expert id; the weights are the unbiased scores,
 * divided by their sum when norm_topk is set, times routed_scale. Another
 * router (softmax, ...) runs as MOETUNE_ROUTE_TOPK with the caller's own
 * top-k.
 *
 * Kernels: at create, the layer's kernels (route, expert sort, expert
 * gate/up, expert down, combine, and the same for the shared expert) get a
 * config per token-count bucket (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128,
 * 256, 512, 1024, 2048, 4096, up to the first >= max_tokens) from the
 * device's databases by the runtime's rules, else their default; each
 * distinct config is compiled once (on-disk cache) and loaded. A run with
 * M tokens uses the configs of the smallest bucket >= M.
 * moetune_moe_selection says what was picked and why. Layers of the same
 * description on one device share their kernels and their workspace.
 *
 * Thread safety: a layer is used by one thread at a time, together with
 * its device and the device's other layers (device.h). Failure: every call
 * returns its status and leaves the message on the layer's device
 * (moetune_errmsg); a failed create keeps nothing, a failed run leaves y
 * undefined and the layer usable. */
#ifndef MOETUNE_MOE_H
#define MOETUNE_MOE_H

#include <stdint.h>

#include "device.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moetune_moe moetune_moe;

/* What the expert GEMMs compute with (weights are MXFP4 in all three).
 * Fixed values, only appended. */
typedef enum moetune_act {
    MOETUNE_ACT_A16W4 = 0, /* bf16 activations */
    MOETUNE_ACT_A4W4 = 1,  /* activations quantized to MXFP4 (GLM-5.2-MXFP4's recipe) */
    MOETUNE_ACT_A8W4 = 2,  /* activations quantized to int8 per 32-block (cpu only) */
    MOETUNE_ACT_COUNT
} moetune_act;

typedef enum moetune_weight_type {
    MOETUNE_WEIGHT_MXFP4 = 0, /* OCP MXFP4 in AMD Quark's layout (below) */
    MOETUNE_WEIGHT_COUNT
} moetune_weight_type;

/* What a run routes with; chosen at create. */
typedef enum moetune_routing {
    MOETUNE_ROUTE_GATE = 0,   /* the layer computes the router logits from x and its
                               * router weight (the runtime's path): moetune_moe_run */
    MOETUNE_ROUTE_LOGITS = 1, /* the caller gives bf16 router logits [M, E]:
                               * moetune_moe_run_logits (or _run_topk) */
    MOETUNE_ROUTE_TOPK = 2,   /* the caller gives the top-k expert ids and weights:
                               * moetune_moe_run_topk */
    MOETUNE_ROUTE_COUNT
} moetune_routing;

typedef struct moetune_moe_desc {
    unsigned struct_size; /* sizeof(moetune_moe_desc), set by moetune_moe_desc_init */
    int64_t hidden;       /* H; a multiple of 128 */
    int64_t inter;        /* I: one routed expert's intermediate width; a multiple of 128 */
    int64_t experts;      /* E: routed experts, 2 .. 1024 */
    int topk;             /* experts per token, 1 .. min(E, 32) */
    int n_group;          /* expert groups of group-limited routing (n_group); 1: none */
    int topk_group;       /* groups kept (topk_group); 1 with n_group 1 */
    int norm_topk;        /* norm_topk_prob: 1 divides the top-k scores by their sum */
    float routed_scale;   /* routed_scaling_factor (GLM-5.2: 2.5) */
    moetune_act act;
    moetune_weight_type weight_type;
    moetune_routing routing;
    int64_t shared_inter; /* the shared expert's width (n_shared_experts x I); 0: none */
    int64_t max_tokens;   /* the most tokens one run takes, 1 .. 4096 */
} moetune_moe_desc;

/* Sets struct_size and the defaults: routing GATE, act A16W4, weights
 * MXFP4, n_group 1, topk_group 1, norm_topk 1, routed_scale 1,
 * shared_inter 0, max_tokens 256; the shapes (hidden, inter, experts,
 * topk) 0, which create refuses until they are set. NULL is a no-op. */
void moetune_moe_desc_init(moetune_moe_desc *d);

/* The layer's weights, in the checkpoint's layout: MXFP4 as AMD Quark
 * stores it, a matrix [rows, K] as packed E2M1 codes uint8 [rows, K/2]
 * (element 2i in the low nibble of byte i) and E8M0 scales uint8 [rows,
 * K/32] (one per 32 elements). Pointers are host memory on cpu and emu and
 * device memory on hip and cuda, aligned to 16 bytes.
 *
 * Ownership: the caller's. The library reads them at create and may keep
 * using them until the layer is destroyed (on hip, cuda and emu it runs on
 * them in place; on cpu it keeps its own copy, regrouped once for the cpu
 * kernels, but a program should not rely on that): keep them alive and
 * unchanged until moetune_moe_destroy. */
typedef struct moetune_moe_weights {
    const void *gate;       /* bf16 [E, H] router weight; read by ROUTE_GATE only */
    const void *bias;       /* f32 [E] e_score_correction_bias, NULL: zeros; read by
                             * ROUTE_GATE and ROUTE_LOGITS (the others ignore both) */
    const void *w13, *s13;  /* [E, 2I, H/2], [E, 2I, H/32]: per expert its gate_proj
                             * rows, then its up_proj rows */
    const void *w2, *s2;    /* [E, H, I/2], [E, H, I/32]: down_proj */
    const void *shared_w13, *shared_s13; /* [2S, H/2], [2S, H/32] (S = shared_inter) */
    const void *shared_w2, *shared_s2;   /* [H, S/2], [H, S/32]; all four NULL when S = 0 */
} moetune_moe_weights;

/* Creates a layer on dev: checks d and w, picks and compiles its kernels
 * (seconds on a cold compile cache; layers of the same description reuse
 * them), sets up the weights and a workspace for max_tokens tokens.
 * On failure *out is NULL, nothing is kept, and moetune_errmsg(dev) names
 * the field, weight or kernel at fault: a bad shape or weight is
 * MOETUNE_E_INVALID, a struct not set up by moetune_moe_desc_init
 * MOETUNE_E_MISUSE, a combination the device cannot run (A8W4 off the cpu)
 * MOETUNE_E_UNSUPPORTED. */
moetune_status moetune_moe_create(moetune_device *dev, const moetune_moe_desc *d,
                                  const moetune_moe_weights *w, moetune_moe **out);

/* Destroys the layer (waits for its runs to finish first). NULL is a no-op. */
void moetune_moe_destroy(moetune_moe *layer);

/* Runs the layer on m tokens (1 .. max_tokens; 0 does nothing):
 * x bf16 [m, H] in, y f32 [m, H] out (overwritten; it must not overlap x).
 * Buffers are the caller's: host pointers on cpu and emu, device pointers
 * on hip and cuda, aligned to 16 bytes. stream: NULL (the device's own
 * queue, the default stream on hip and cuda); a non-NULL stream is
 * MOETUNE_E_UNSUPPORTED in this version. On cpu and emu the run has
 * finished when the call returns; on hip and cuda it is queued
 * (moetune_device_synchronize waits). Failure leaves y undefined.
 *
 * moetune_moe_run: layers created with ROUTE_GATE. */
moetune_status moetune_moe_run(moetune_moe *layer, const void *x, int64_t m, float *y,
                               void *stream);

/* ROUTE_LOGITS layers: logits bf16 [m, E], routed by the rule above. */
moetune_status moetune_moe_run_logits(moetune_moe *layer, const void *x, const void *logits,
                                      int64_t m, float *y, void *stream);

/* ROUTE_TOPK and ROUTE_LOGITS layers: the caller's routing, topk_ids int32
 * [m, topk] (distinct experts per token, each in [0, E)) and topk_weights
 * f32 [m, topk], applied as given (no scaling). An id out of range is not
 * checked on hip and cuda (it is on cpu and emu: MOETUNE_E_INVALID). */
moetune_status moetune_moe_run_topk(moetune_moe *layer, const void *x, const int32_t *topk_ids,
                                    const float *topk_weights, int64_t m, float *y,
                                    void *stream);

/* ---- what the layer picked ---------------------------------------------- */

/* Where a kernel's config for one bucket came from (the runtime's words).
 * Fixed values, only appended. */
typedef enum moetune_source {
    MOETUNE_SOURCE_TUNED = 0,        /* tuned on this device model at this M */
    MOETUNE_SOURCE_NEAREST = 1,      /* tuned on this device model at another M (tuned_m) */
    MOETUNE_SOURCE_OTHER_DEVICE = 2, /* tuned on another device of the same arch (note) */
    MOETUNE_SOURCE_STALE = 3,        /* entries only for another kernel source: default */
    MOETUNE_SOURCE_MISS = 4,         /* no entry in any database: default */
    MOETUNE_SOURCE_NO_DB = 5,        /* the device has no database: default */
    MOETUNE_SOURCE_REJECTED = 6,     /* the database's config cannot run here (note): default */
    MOETUNE_SOURCE_COUNT
} moetune_source;

/* "tuned", "nearest", "other-device", "stale", "default (miss)",
 * "default", "default (db config rejected)"; "unknown" out of range. */
const char *moetune_source_str(moetune_source s);

/* One kernel at one bucket. The strings are owned by the layer and valid
 * until it is destroyed. */
typedef struct moetune_selection {
    const char *kernel;   /* kernel family: "moe_gemm_up" */
    const char *use;      /* what it does in the layer: "experts up" */
    const char *shape;    /* its tuning key: "H=6144,I=2048,E=256,topk=8,a=bf16,..." */
    const char *config;   /* the config it runs: "NR=2,MR=4,..." */
    const char *db;       /* the database the config came from; NULL: none */
    const char *note;     /* the other device, the stale hash, why rejected; or "" */
    int64_t m;            /* the bucket: runs of up to m tokens (and above the last) */
    int64_t tuned_m;      /* the M it was tuned at; 0 for defaults */
    moetune_source source;
    int is_default;       /* 1: the kernel's default config runs */
} moetune_selection;

/* Number of (kernel, bucket) selections of the layer. */
int moetune_moe_selection_count(const moetune_moe *layer);

/* Selection i (0 .. count-1), kernels in launch order, buckets ascending.
 * MOETUNE_E_INVALID for i out of range. */
moetune_status moetune_moe_selection(const moetune_moe *layer, int i, moetune_selection *out);

/* The selection as a table, one line per kernel and bucket and a summary
 * line ("... 12 tuned, 3 nearest, 0 other device, 0 stale, 33 default"),
 * like the runtime's report. Owned by the layer; valid until it is
 * destroyed. */
const char *moetune_moe_report(const moetune_moe *layer);

#ifdef __cplusplus
}
#endif

#endif
