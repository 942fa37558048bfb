/* tiny.h: writes a small random checkpoint of the GLM-5 architecture in the
 * exact on-disk format of a Quark MXFP4 release, for tests and demos.
 *
 * Folder contents:
 *   config.json            GlmMoeDsaForCausalLM, GLM-5.2-style fields and a
 *                          Quark quantization_config (MXFP4 w4a4 for routed
 *                          and shared experts; attention, router gate,
 *                          lm_head, the dense MLP and the MTP layer excluded)
 *   model-00001-of-00002.safetensors, model-00002-of-00002.safetensors
 *   model.safetensors.index.json
 *   tokenizer.json         byte-level BPE trained on a built-in English text
 *                          (256 byte tokens + merges + GLM's special tokens)
 * Dimensions: hidden 256, 4 layers (layer 0 dense), intermediate 512,
 * expert intermediate 128, 16 routed experts top-4, 1 shared expert, 4 heads,
 * q_lora 64, kv_lora 32, qk_nope 32, qk_rope 16, v 32, indexer 2 heads x 32
 * with top-k 16 (freq 4, offset 3: layers 0-2 full, layer 3 shared), vocab
 * 512, 4096 positions, one MTP layer `model.layers.4.*`.
 *
 * Weights: seeded random values (a unit-variance bell curve), each linear
 * scaled by 1/sqrt(in) (0.5/sqrt(in) for the ones that write the residual
 * stream), embeddings unit variance, norms near 1, so activations stay O(1)
 * through the layers. The same seed writes byte-identical files. */
#ifndef MT_MODEL_TINY_H
#define MT_MODEL_TINY_H

#include <stdint.h>

#include "common/status.h"

/* Writes the checkpoint into dir (created if needed; files replaced). */
mt_status model_tiny_write(const char *dir, uint64_t seed, mt_err *err);

/* The same with the attention in whole matrix-instruction tiles, as the GPU
 * fp8 attention paths need them: 16 heads, kv_lora 64, qk_rope 32 (so the
 * cache rows are 96 wide); everything else as model_tiny_write. */
mt_status model_tiny_write_wide_attention(const char *dir, uint64_t seed, mt_err *err);

/* The same architecture and format, built so the MTP layer predicts well
 * (speculative decoding's acceptance): a next-token map instead of random
 * behaviour. Every linear that writes the residual stream (o_proj, the MLP
 * and expert down projections, main and MTP layers) is zero, so the hidden
 * state is the token's embedding; lm_head row perm[t] is embedding row t
 * (perm a seeded random permutation), so the model continues t with
 * perm[t]; eh_proj is [I | 0], so the MTP layer sees enorm(embedding of the
 * next token) and, through the shared lm_head, predicts the token the main
 * model will emit after it. Everything else is random as in
 * model_tiny_write. */
mt_status model_tiny_write_mtp_map(const char *dir, uint64_t seed, mt_err *err);

/* The built-in English text the tokenizer is trained on (NUL-terminated). */
const char *model_tiny_corpus(void);

/* Writes only tokenizer.json (the same one model_tiny_write writes) to path. */
mt_status model_tiny_write_tokenizer(const char *path, mt_err *err);

#endif
