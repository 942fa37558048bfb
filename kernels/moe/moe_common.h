/* moe_common.h: host pieces shared by the MoE kernel families and the moe
 * pipeline: routing generators for test problems, the aligned (sorted and
 * padded) pair layout, random MXFP4 weights, and the plain C references of
 * every stage (the test oracles). All functions are pure apart from their
 * output arrays (caller-owned) and are thread-safe.
 *
 * Conventions shared by every MoE family and kernel:
 *   pair p = token * topk + slot; topk_ids [M, topk] int32, topk_w [M, topk]
 *   f32. The aligned layout for a tile height bm: sorted [cap] int32 holds
 *   pair ids grouped by expert in ascending expert order, stable (pairs of
 *   one expert in ascending pair order), each expert's segment padded to a
 *   multiple of bm with the sentinel value npairs; tile_expert [cap/bm]
 *   holds the expert of each tile, -1 past the end; total [1] is the padded
 *   length. Positions past total hold the sentinel. */
#ifndef MT_KERN_MOE_COMMON_H
#define MT_KERN_MOE_COMMON_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/rng.h"
#include "kernels/core/family.h"

/* Routing distributions of generated problems (runtime dim "skew"). */
enum {
    MOE_SKEW_UNIFORM = 0, /* distinct uniform experts per token */
    MOE_SKEW_HOT = 1,     /* slot 0 of every token is expert E-1 */
    MOE_SKEW_FEW = 2,     /* experts drawn from the first min(E, 2*topk) only */
};

/* Rows the aligned layout may need: a multiple of bm. */
int64_t moe_cap_rows(int64_t npairs, int64_t n_experts, int64_t bm);

/* Random distinct expert ids per token (topk <= E). */
void moe_gen_ids(mt_rng *r, int64_t m, int topk, int n_experts, int skew, int32_t *ids);

/* The aligned layout of ids (reference of moe_align); see above. sorted
 * must hold moe_cap_rows(m*topk, E, bm) entries, tile_expert that / bm. */
void moe_align_ref(const int32_t *ids, int64_t npairs, int n_experts, int bm,
                   int32_t *sorted, int32_t *tile_expert, int32_t *total);

/* Random bf16 values, normal with the given standard deviation. */
void moe_gen_bf16(mt_rng *r, uint16_t *x, int64_t n, float stddev);
/* Random MXFP4 weights: rows of k elements, random codes, scale codes
 * chosen so a dot product with unit normal activations is O(1). */
void moe_gen_mxfp4(mt_rng *r, uint8_t *packed, uint8_t *scales, int64_t rows, int64_t k);
/* Scale code moe_gen_mxfp4 centres on for dot products of length k. */
int moe_gen_scale_base(int64_t k);

/* Activation row as the kernels see it: bf16 -> f32, or for a4w4 the
 * MXFP4 round trip of that ("even" rule). */
void moe_act_row(const uint16_t *x, int64_t k, bool a4, float *out);
/* The a8w4 activation row: bf16 -> f32, then per 32-block quantized to
 * int8 with an fp32 scale s = amax / 127, q = rint(v * (127 / amax)),
 * returned as q * s (exactly the values moe_gemm.cpu's moe_prep makes). A
 * block with a non-finite value reads as NaN; an all-zero block as zeros. */
void moe_act_row_i8(const uint16_t *x, int64_t k, float *out);

/* ---- routing ----------------------------------------------------------- */

typedef struct moe_route_dims {
    int64_t h, e;
    int topk, ngroup, topkg;
    float scale;   /* routed_scaling_factor */
    bool norm;     /* norm_topk_prob */
} moe_route_dims;

/* Reference router for token t: logits in double from bf16 x and gate,
 * sigmoid, bias added for selection only, group-limited selection (top-2
 * sum per group, topkg groups), top-k by the biased score in descending
 * order with ties to the lower expert id, weights the unbiased scores
 * renormalized (norm) and scaled. choice (optional, [E]) receives the
 * biased scores with excluded groups at -INFINITY. */
void moe_route_ref_token(const moe_route_dims *d, const uint16_t *x, const uint16_t *gate,
                         const float *bias, int32_t *ids, float *w, double *choice,
                         double *score);

/* ---- expert GEMMs ------------------------------------------------------ */

typedef struct moe_gemm_dims {
    int64_t h, i, e;   /* hidden, expert intermediate, experts */
    int topk;
    bool a4;           /* MXFP4 activations (a4w4) */
    bool a8;           /* int8 activations per 32-block (a8w4; a4 false) */
} moe_gemm_dims;

/* h[p] = bf16(silu(x[t] . Wg[e,n]) * (x[t] . Wu[e,n])) for pairs p in
 * [p0, p1) and columns n = 0, nstep, 2*nstep, ... (others untouched).
 * wg/wu point at expert 0 of the gate/up weights, wstride/sstride are the
 * bytes between experts (packed and scales). */
void moe_up_ref(const moe_gemm_dims *d, const uint16_t *x, const int32_t *ids,
                const uint8_t *wg, const uint8_t *sg, const uint8_t *wu, const uint8_t *su,
                int64_t wstride, int64_t sstride, int64_t p0, int64_t p1, int64_t nstep,
                uint16_t *h);

/* dot[p][n] = w[p] * (act(h[p]) . Wd[e,n]) for pairs in [p0, p1), n =
 * 0, nstep, ...: written to rows [npairs, H] when rows != NULL, and added
 * to y [M, H] in ascending pair order when y != NULL. */
void moe_down_ref(const moe_gemm_dims *d, const uint16_t *hact, const int32_t *ids,
                  const float *topk_w, const uint8_t *wd, const uint8_t *sd, int64_t p0,
                  int64_t p1, int64_t nstep, float *rows, float *y);

/* ---- pieces shared by the GEMM families --------------------------------- */

/* Appends the three aligned-layout buffers (sorted, tile_expert, total) as
 * family inputs. */
void moe_layout_bufs(int64_t npairs, int64_t cap_rows, int64_t bm, kern_buf_desc *out,
                     int *n);
/* Expected number of distinct experts m tokens with topk distinct uniform
 * experts each touch (for cost models). */
double moe_expected_experts(int64_t n_experts, int64_t topk, int64_t m);

/* MXFP4 weights [rows, k] (Quark: packed [rows, k/2], low nibble first;
 * scales [rows, k/32]) to the cpu integer tiles' grouped layout (a shape's
 * wl=1) and back; rows a multiple of 16, k of 128. The grouped layout is
 * one buffer of moe_w4_bytes(1, rows, k) (the weights and their scales, so
 * that a tile reads one stream): group g of 16 rows at byte g * 16 *
 * (k/2 + k/32); within it, per 4 blocks of 32 (K elements 128 q .. 128 q
 * + 127) MOE_G16_SUPER bytes: four 256-byte blocks, where byte 64 v + 4 r
 * + i of block j holds row r's elements 32 j + 4 v + i (low nibble) and
 * 32 j + 16 + 4 v + i (high), then 64 scale codes, 16 j + r for row r's
 * block j. The caller owns every buffer; in and out must not overlap. */
enum { MOE_G16_SUPER = 4 * 256 + 64 };
void moe_w4_group16(const uint8_t *packed, const uint8_t *scales, int64_t rows, int64_t k,
                    uint8_t *out);
void moe_w4_ungroup16(const uint8_t *grouped, int64_t rows, int64_t k, uint8_t *out_packed,
                      uint8_t *out_scales);

/* A family's expert-weight buffers for rows x k weights in layout wl: the
 * weights take moe_w4_bytes and their scales moe_w4_scale_bytes (0 at
 * wl=1, where they sit in the weights' buffer). */
int64_t moe_w4_bytes(int wl, int64_t rows, int64_t k);
int64_t moe_w4_scale_bytes(int wl, int64_t rows, int64_t k);
/* moe_gen_mxfp4's weights, stored in layout wl. A family's fill cannot
 * fail, so running out of memory for the grouping aborts (with a message)
 * rather than leaving buffers a check would compare. */
void moe_gen_w4(mt_rng *r, int wl, int64_t rows, int64_t k, uint8_t *w, uint8_t *s);
/* Weights in layout wl seen in the Quark layout (for references): at wl=0
 * the caller's buffers, at wl=1 an ungrouped copy the view owns (aborts
 * when out of memory, as moe_gen_w4). */
typedef struct moe_w4_view {
    uint8_t *w, *s;
    uint8_t *own; /* NULL at wl=0 */
} moe_w4_view;
moe_w4_view moe_w4_quark_view(int wl, int64_t rows, int64_t k, uint8_t *w, uint8_t *s);
void moe_w4_view_free(moe_w4_view *v);

/* The cpu GEMM parameters (moe_gemm.cpu): NR weight rows per register tile,
 * MR tokens per register tile, KB K block, NT output rows per work item,
 * PF prefetch distance in bytes. */
enum { MOE_CPU_NR, MOE_CPU_MR, MOE_CPU_KB, MOE_CPU_NT, MOE_CPU_PF, MOE_CPU_NPARAMS };
extern const kern_param_desc moe_cpu_params[MOE_CPU_NPARAMS];
/* Validity of a cpu config for a GEMM with reduction length k and n output
 * rows per expert, weights in layout wl (0 Quark rows; 1 grouped by 16:
 * a tile is NR groups of 16 rows (NR streams; x2 in stage 1) and MR tokens,
 * NR x MR <= 16, NT/NR a multiple of 16). */
bool moe_cpu_valid(int64_t k, int64_t n, int wl, const kern_config *cfg, char *why, size_t cap);
/* Default cpu config for npairs routed pairs over n_experts; stage 1 (up)
 * streams two weight rows per NR (gate and up), stage 2 one. int_dot: the
 * activations are quantized (a4w4, a8w4: integer dot tiles), else bf16.
 * p (may be NULL): the device; whether one weight stream per thread keeps
 * up with memory on it (moe_cpu_one_stream_fills) changes stage 2's decode
 * tile, and AMX (p->cpu_amx) a16w4's prefill tile. */
void moe_cpu_default(int64_t k, int64_t n, int64_t npairs, int64_t n_experts, bool up,
                     bool int_dot, int wl, const dev_props *p, kern_config *cfg);
/* Whether one weight stream per thread reads at the memory's pace on the
 * cpu p names: AMD's cores (measured on Zen 5), not Intel's (measured on a
 * Xeon with AMX, where two streams per thread read 16 % faster at decode).
 * A heuristic by vendor; the tuner measures the rest. */
bool moe_cpu_one_stream_fills(const dev_props *p);
/* Scratch bytes of the prepared activations (rows of k values). */
size_t moe_cpu_act_bytes(int64_t rows, int64_t k);

/* The GPU GEMM parameters (moe_gemm.hip). MMA: 0 scalar f32 FMAs, 1 and 2
 * the prelude's bf16 matrix fragments (MT_MMA_SHAPE 16 and 32), 3 its fp8
 * ones (mt_mma8_*, a4w4 only). GEMV = R > 0:
 * the decode path (no tiles, R pairs of an expert per pass); it uses BN,
 * WAVES, SPLITK and UNROLL (rows in flight per lane group) and needs the
 * tile-only parameters at their first values. */
enum { MOE_GPU_BM, MOE_GPU_BN, MOE_GPU_BK, MOE_GPU_WAVES, MOE_GPU_STAGES, MOE_GPU_SPLITK,
       MOE_GPU_GROUPM, MOE_GPU_VEC, MOE_GPU_UNROLL, MOE_GPU_MMA, MOE_GPU_GEMV,
       MOE_GPU_NPARAMS };
extern const kern_param_desc moe_gpu_params[MOE_GPU_NPARAMS];
/* Shared memory of a config (bytes) on a device of wave size ws; wr = 2 for
 * stage 1 (gate and up). */
size_t moe_gpu_shared(const kern_config *cfg, int wr, int ws);
/* Validity for reduction length k, n output rows per expert, layout tile
 * height bm, stage 1 (up) or 2, combine path comb (stage 2), a4: a4w4
 * activations (MMA=3 takes only those). */
bool moe_gpu_valid(int64_t k, int64_t n, int64_t bm, bool up, int comb, bool a4,
                   const kern_config *cfg, const dev_props *p, char *why, size_t cap);
/* Grid blocks along x of the decode path (GEMV > 0): one per possible
 * expert segment (min(npairs, E)) per BN-row slice of n. */
int64_t moe_gemv_blocks(int64_t npairs, int64_t n_experts, int64_t n, const kern_config *cfg);
/* A valid default (the decode path for few pairs per expert, small tiles
 * for decode, larger for prefill). */
void moe_gpu_default(int64_t k, int64_t n, int64_t bm, bool up, int comb, bool a4,
                     int64_t npairs, int64_t n_experts, const dev_props *p, kern_config *cfg);
/* Extra defines: MT_WS (the device's wave size) and MOE_UP. */
int moe_gpu_defines(bool up, const dev_props *p, dev_define *out, char (*buf)[64], int cap);
/* a4w4 on GPUs: the scratch bytes the activation pre-pass writes for rows
 * x k activations, placed after `before` bytes of other scratch (rounded up
 * to 256): moe_act_quant's E2M1 codes [rows, k/2] and E8M0 scales [rows,
 * k/32], or for MMA=3 moe_act_q8's folded e4m3 codes [rows, k] and row
 * references (int32 [rows]). */
size_t moe_gpu_act_offset(size_t before);
size_t moe_gpu_act_bytes(int64_t rows, int64_t k, const kern_config *cfg);
/* Launches the config's pre-pass on src [rows, k] (bf16, device) into
 * c->scratch at moe_gpu_act_offset(before); *q and *s receive the codes and
 * the scales (MMA=3: the row references). */
mt_status moe_gpu_act_quant(const kern_ctx *c, const void *src, int64_t rows, int64_t k,
                            size_t before, void **q, void **s, mt_err *err);

static inline float moe_silu(float g) { return g / (1.0f + expf(-g)); }

#endif
