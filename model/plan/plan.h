/* plan.h: the kernel plan of a GLM-5 family checkpoint: every kernel (a
 * family at a tuning key) the model runtime runs, what it is for, the
 * representative runtime dims and the largest M the forward pass hands it,
 * computed from config.json and the runtime's options alone (no weights
 * needed, no device).
 *
 * This is the one list: model_runtime_open registers exactly the plan's
 * kernels (rt_load.c / rt_select.c), and `moetune tune --model` tunes
 * exactly them, so a tuned database covers what the runtime looks up.
 *
 * Options that change kernels are inputs: activation quantization (a4w4,
 * a16w4 or a8w4: the Quark config's input spec of the routed experts unless
 * overridden), the KV cache dtype and page size (keys of the attention
 * kernels), and max_batch_tokens (the largest M). KV pages only change
 * representative runtime dims (pool rows, context length). Defaults are
 * model_runtime_open's.
 *
 * Entries are deduplicated by (family, tuning key) in the order the
 * forward pass first uses them: each keeps the first use's purpose, the
 * largest M and the largest runtime dims over all its uses.
 *
 * Ownership: model_kernel_plan hands the caller an array it frees with
 * free(); model_plan_build a plan freed with model_plan_free (NULL is a
 * no-op). Failures return an mt_status with err filled and nothing
 * allocated. Plans are immutable once built; reading one from several
 * threads is safe. */
#ifndef MT_MODEL_PLAN_H
#define MT_MODEL_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/core/family.h"
#include "model/format/config.h"
#include "model/format/weights.h"

typedef enum model_act_quant {
    MODEL_ACT_NONE = 0,   /* a16w4: bf16 activations into the MXFP4 GEMMs */
    MODEL_ACT_MXFP4 = 1,  /* a4w4: activations quantized per 32 on the fly */
    MODEL_ACT_INT8 = 2,   /* a8w4: int8 per 32 with an fp32 scale (cpu kernels only) */
    MODEL_ACT_COUNT
} model_act_quant;

/* "none", "mxfp4", "int8" (the --act-quant spellings); "?" out of range. */
const char *model_act_quant_name(model_act_quant q);
/* Parses one of those names; false (out untouched) for anything else. */
bool model_act_quant_parse(const char *s, model_act_quant *out);
/* The activation dtype q hands the expert GEMMs: KERN_DT_BF16, _MXFP4 or _I8. */
kern_dtype model_act_quant_dtype(model_act_quant q);

typedef struct model_plan_opts {
    model_act_quant act_quant;   /* used when act_quant_set */
    bool act_quant_set;          /* false: what the checkpoint asks (Quark config) */
    int kv_dtype;                /* kern_dtype: 0 or KERN_DT_BF16 (default), KERN_DT_FP8E4M3 */
    int kv_page_size;            /* tokens per KV page; 0 = 16 */
    int kv_pages;                /* pages in the pool; 0 = enough for 8 full contexts */
    int max_batch_tokens;        /* largest step; 0 = 512 */
    bool mtp;                    /* also the MTP layer's kernels (speculative decoding) */
    /* Optional: an opened checkpoint. Formats the files decide (shared
     * expert MXFP4 or bf16, activation quantization) then come from the
     * tensors as the runtime loads them, not from the Quark config; the
     * two agree for a consistent checkpoint. */
    const model_weights *weights;
    /* The backend the plan is for (default cpu): it decides the MoE expert
     * weights' layout (moe_weight_layout: grouped by 16 rows on the cpu), which is part of the expert GEMMs' keys. */
    dev_backend backend;
    /* Expert parallelism over this many ranks (0: none): the plan
     * also lists each rank's expert sort and expert GEMMs at its local
     * shape (model_ep_local_dims: its experts, one pair per row, M up to
     * every pair of a step), the keys an expert-parallel runtime looks up.
     * The runtime itself does not set it (ep_moe.c registers those kernels
     * beside the plan's); `tune --model --ep N` does. With it the plan
     * leaves out the whole-layer expert sort and GEMMs (every expert on one
     * device), which no expert-parallel rank runs. */
    int ep_ranks;
    /* Set by model_runtime_plan_opts for a runtime with a communicator:
     * its MoE layers are expert-parallel (ep_moe.c registers the local
     * kernels), so the whole-layer expert sort and GEMMs are left out. */
    bool ep_runtime;
    /* Tensor parallelism over this many ranks (0 or 1: none): attention
     * heads, o_proj output rows and the vocabulary split over the ranks
     * (model_tp_local). The layer slots are rank tp_rank's kernels; with
     * tp_rank -1 (`tune --model --tp N`) the plan also lists every other
     * rank's, at its local shapes, and the slots are rank 0's. The runtime
     * sets both from its communicator (model_runtime_opts.tp). */
    int tp_ranks, tp_rank;
    /* A vocabulary-parallel embedding and head over this many ranks (0
     * or 1: none): expert-parallel ranks, with data-parallel attention or
     * alone, plain or in tensor-parallel groups of tp_ranks with their own
     * sequences (then a multiple of it, more than one group), split over
     * every rank of the job: this rank (vocab_rank) holds its share
     * of the vocabulary (model_ep_range over vocab_ranks, not its group's
     * tp share), and the plan adds the gather of the ranks' logits columns
     * (in place of a group's). vocab_rank -1 (`tune --model --ep N`): the
     * slots keep the whole vocabulary (or the tp share) and the plan also
     * lists every rank's lm_head; with tp_ranks equal to vocab_ranks (one
     * group: tensor parallelism splits the vocabulary) it is ignored. */
    int vocab_ranks, vocab_rank;
} model_plan_opts;

/* What one rank of a tensor-parallel deployment holds: heads
 * [head0, head0 + heads) of the attention (q_b and kv_b rows of those
 * heads), rows [o_row0, o_row0 + o_rows) of o_proj (output features of
 * the hidden state) and vocabulary rows [vocab0, vocab0 + vocab) of the
 * embedding and lm_head. Contiguous ranges, sizes differing by at most
 * one between ranks (model_ep_range's split). One rank holds everything. */
typedef struct model_tp_dims {
    int64_t head0, heads, o_row0, o_rows, vocab0, vocab;
} model_tp_dims;

/* Rank `rank` of `ranks` (ranks <= 1: the whole model). MT_E_INVALID
 * naming the dimension when there are fewer heads, hidden features or
 * vocabulary rows than ranks. */
mt_status model_tp_local(const model_config *c, int ranks, int rank, model_tp_dims *out,
                         mt_err *err);


/* One kernel of the plan. */
typedef struct model_plan_entry {
    const kern_family *fam;
    kern_shape shape;               /* tuning dims + largest runtime dims of its uses */
    char key[KERN_KEY_MAX];         /* tuning key: what the database is asked for */
    char shape_text[KERN_KEY_MAX];  /* key with the runtime dims (parses back to shape) */
    char purpose[64];               /* first use in the forward ("attn A", "experts up") */
    int64_t m_max;                  /* largest M the forward passes */
} model_plan_entry;

/* Lists the plan of a checkpoint: model_dir_or_config is a folder holding
 * config.json or the path of a config file. o may be NULL (defaults; o->
 * weights is ignored here: only config.json is read). On success *out
 * (caller frees with free()) holds *n entries. Errors: MT_E_IO / MT_E_FORMAT
 * naming the file and key, MT_E_UNSUPPORTED for an architecture the
 * runtime does not run (naming the key), MT_E_INVALID for bad options. */
mt_status model_kernel_plan(const char *model_dir_or_config, const model_plan_opts *o,
                            model_plan_entry **out, int *n, mt_err *err);

/* ---- the plan with its layer map (what the runtime registers from) ---- */

/* The kernels a layer runs, in forward order. */
typedef enum model_plan_slot {
    MODEL_KS_NORM_IN = 0, MODEL_KS_GEMM_A, MODEL_KS_COPY_QA, MODEL_KS_NORM_Q,
    MODEL_KS_COPY_LAT, MODEL_KS_NORM_KV, MODEL_KS_COPY_KR, MODEL_KS_ROPE_KR,
    MODEL_KS_STORE_KV, MODEL_KS_COPY_IK, MODEL_KS_ROPE_IK, MODEL_KS_STORE_IK,
    MODEL_KS_COPY_IW, MODEL_KS_GEMM_B, MODEL_KS_COPY_Q, MODEL_KS_ROPE_Q, MODEL_KS_COPY_IQ,
    MODEL_KS_ROPE_IQ, MODEL_KS_INDEXER, MODEL_KS_ABSORB, MODEL_KS_COPY_QROPE,
    MODEL_KS_DECODE, MODEL_KS_COPY_O, MODEL_KS_VOUT, MODEL_KS_GEMM_O, MODEL_KS_RESID,
    MODEL_KS_NORM_POST, MODEL_KS_GEMM_GU, MODEL_KS_SILU, MODEL_KS_GEMM_DOWN,
    MODEL_KS_SH_GEMM_GU, MODEL_KS_SH_SILU, MODEL_KS_SH_GEMM_DOWN, MODEL_KS_ROUTE,
    MODEL_KS_ALIGN, MODEL_KS_UP, MODEL_KS_DOWN, MODEL_KS_SH_ALIGN, MODEL_KS_SH_UP,
    MODEL_KS_SH_DOWN, MODEL_KS_COMBINE,
    /* dense prefill of a chunk's rows whose context is at most index_topk
     * (rt_forward.c; the rows' other attention slots do not run for them) */
    MODEL_KS_PREFILL,
    MODEL_KS_COUNT
} model_plan_slot;

/* The kernels outside the layers. */
typedef enum model_plan_gslot {
    MODEL_GS_EMBED = 0, MODEL_GS_NORM_FINAL, MODEL_GS_GATHER, MODEL_GS_LM_HEAD,
    /* MTP head (plans built with mtp; -1 otherwise): normed embedding and
     * hidden state copied into the two halves of eh_proj's input, eh_proj,
     * and its f32 output as the bf16 and f32 residual stream */
    MODEL_GS_MTP_CAT_E, MODEL_GS_MTP_CAT_H, MODEL_GS_MTP_EH, MODEL_GS_MTP_TO_BF16,
    MODEL_GS_MTP_TO_F32,
    MODEL_GS_COUNT
} model_plan_gslot;

/* Facts of one main layer the kernels depend on. */
typedef struct model_plan_layer {
    bool moe;          /* MoE MLP (else dense) */
    bool full;         /* runs its own DSA indexer (else reuses the last full layer's top-k) */
    bool sh_mxfp4;     /* shared expert on the MoE GEMMs (else a bf16 MLP) */
    int64_t n_a, n_b;  /* rows of the fused A (q_a | kv_a | wk | weights_proj) and B projections */
    int64_t inter;     /* dense MLP intermediate (dense layers) */
    int64_t sh_inter;  /* shared expert intermediate; 0 = none */
    int k[MODEL_KS_COUNT]; /* entry index per slot; -1 where the layer runs no such kernel */
} model_plan_layer;

/* The runtime's resolved settings (options with defaults applied). */
typedef struct model_plan_params {
    kern_dtype act;    /* activations into the expert GEMMs: bf16, mxfp4 or i8 */
    int kv_dtype;      /* kern_dtype of the KV cache */
    int ps;            /* tokens per page */
    int64_t n_pages, max_ctx, T; /* pool pages, context limit, max_batch_tokens */
    int eps_e, eps6_e; /* rms_norm_eps as 1e-eps_e; the latent norms' 1e-6 */
    int moe_wl;        /* expert weights' layout (moe_dims.wl) */
    int ep_ranks;      /* model_plan_opts.ep_ranks (0: none) */
    int tp_ranks;      /* model_plan_opts.tp_ranks (0 or 1: none) */
    int vocab_ranks;   /* model_plan_opts.vocab_ranks (0 or 1: none) */
    model_tp_dims tp;  /* the slots' rank's share (everything without tensor parallelism) */
} model_plan_params;

typedef struct model_plan {
    model_plan_params p;
    model_plan_entry *entries;
    int n_entries;
    int64_t n_layers;          /* main layers */
    bool mtp;                  /* built with mtp: layers[n_layers] is the first MTP layer
                                * (its routed experts quantized to MXFP4 at load) */
    model_plan_layer *layers;  /* [n_layers + mtp] */
    int g[MODEL_GS_COUNT];     /* entry index of each global kernel */
} model_plan;

/* Builds the plan of config c with options o (NULL: defaults). c must
 * outlive nothing: the plan copies what it keeps. */
mt_status model_plan_build(const model_config *c, const model_plan_opts *o, model_plan **out,
                           mt_err *err);
void model_plan_free(model_plan *p);

/* rms_norm_eps as the exponent the rmsnorm kernels take (1e-e, e in
 * [1, 12], rounded); *exact (may be NULL) says whether eps is that power. */
int model_plan_eps_exponent(double eps, bool *exact);

#endif
