/* reference.h: the plain C reference forward pass of a GLM-5 checkpoint:
 * straightforward loops in float/double over the dequantized weights on
 * the host, written independently of the kernel path (it shares only the
 * checkpoint loader and the MXFP4 format helpers). The oracle of the
 * runtime tests and the error baseline of bench_model.
 *
 * Semantics (what the runtime computes): embeddings; per layer RMSNorm,
 * MLA with the low-rank query path, RMSNorm'd latent (eps 1e-6 for the q
 * and kv latents), interleaved RoPE (plain or YaRN: config.h's frequencies
 * and attention factor), the DSA indexer (LayerNorm'd keys, scores
 * IH^-0.5 sum_h w_h relu(ID^-0.5 q_h.k), top index_topk per query, ties to
 * the lower position; layers without their own indexer reuse the last full
 * layer's selection) and softmax attention in latent space over the
 * selected tokens (scale model_config_softmax_scale: YaRN-corrected); dense
 * SwiGLU MLP or the MoE (sigmoid router with the
 * correction bias for selection only, top-k ties to the lower expert,
 * normalized and scaled weights, MXFP4 experts, shared expert); final norm
 * and lm_head. MTP layers are not run.
 *
 * Options: `mimic` rounds to bf16 where the kernel path stores bf16
 * (GEMM inputs, norm outputs, cached keys, the expert intermediate, ...)
 * so that the two agree to float accumulation order, and runs the rows of
 * a prompt (n > 1) whose context is at most index_topk as the runtime's
 * prefill path does (mla_prefill: keys and values expanded through kv_b,
 * each rounded to bf16, and a bf16 output); without it every
 * activation stays float (the "dequantized weights in float32" baseline,
 * except the expert intermediate kept in bf16 by the checkpoint's own
 * kernels is also float). `act_mxfp4` quantizes the expert GEMM inputs to
 * MXFP4 per 32 (a4w4), `act_int8` to int8 per 32 with the scale amax/127
 * (a8w4; ignored with act_mxfp4); `kv_fp8` stores the caches as fp8 e4m3.
 *
 * Ownership: open/close pair; the handle owns its float weights. Not
 * thread-safe per handle. */
#ifndef MT_MODEL_REFERENCE_H
#define MT_MODEL_REFERENCE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

typedef struct model_ref_opts {
    bool mimic;
    bool act_mxfp4;
    bool kv_fp8;
    bool act_int8;
} model_ref_opts;

typedef struct model_ref model_ref;

/* Loads and dequantizes every weight of the checkpoint in dir. */
mt_status model_ref_open(const char *dir, const model_ref_opts *o, model_ref **out, mt_err *err);
void model_ref_close(model_ref *r); /* NULL is a no-op */

int64_t model_ref_vocab(const model_ref *r);

/* Runs n tokens of one sequence from an empty context and writes the logits
 * of every position, [n][vocab]. Token ids must be in range (MT_E_INVALID). */
mt_status model_ref_forward(model_ref *r, const int32_t *tokens, int64_t n, float *logits,
                            mt_err *err);

/* Position t's router margin in the last model_ref_forward: over its MoE
 * layers, the least gap between the k-th chosen expert's selection score
 * (score + correction bias) and the best expert not chosen. A kernel path
 * whose rounding moves the scores by more than that can choose another
 * expert there. INFINITY without MoE layers or outside the last run. */
double model_ref_router_margin(const model_ref *r, int64_t t);

/* Position t's DSA indexer margin in the last model_ref_forward: over its
 * full-attention layers, the gap between the index_topk-th selected key's
 * indexer score and the best key left out, divided by the sum of the
 * magnitudes of the row's best and worst scores (scale-free). A path whose
 * rounding moves the scores by more than that can select another key.
 * INFINITY where every key is selected (t < index_topk) or outside the
 * last run. */
double model_ref_index_margin(const model_ref *r, int64_t t);

#endif
