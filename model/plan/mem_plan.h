/* mem_plan.h: the memory a GLM-5 family checkpoint needs on each rank of a
 * multi-device deployment, from config.json alone (no tensor is read).
 *
 * The layout (the parallel plans of docs/SERVING.md):
 *   - routed experts: expert parallel over `ep` ranks (E / ep experts each);
 *   - the shared experts, the router and the DSA indexer: replicated;
 *   - attention: data parallel ("dp": weights replicated, each rank keeps
 *     the latent cache of its own requests) or tensor parallel ("tp":
 *     q_b_proj, kv_b_proj and o_proj split by heads over `tp` ranks, q_a /
 *     kv_a replicated; the latent cache is shared by all heads, so every TP
 *     rank holds all of it);
 *   - the dense MLP layers: split by intermediate rows under tp, else
 *     replicated;
 *   - embedding and lm_head: vocabulary parallel over all ranks.
 * Each linear's bytes follow the Quark config as the loader reads it
 * (quark.h): MXFP4 = out*in/2 + out*in/32 (E8M0 scales), fp8 = out*in + a
 * float per row, anything else bf16. Norm vectors are bf16. kv_b_proj
 * counts twice in bf16: the runtime keeps it split per head for the
 * absorbed decode path and whole for mla_prefill.
 *
 * KV cache per token and layer: (kv_lora_rank + qk_rope_head_dim) values,
 * plus index_head_dim for layers that run their own indexer, in the cache
 * dtype (2 bytes bf16, 1 byte fp8), as model/kvcache.h stores them.
 *
 * Activation workspace for a step of T tokens (an estimate, in fp32):
 *   T * 4 * (8 H + 2 topk (2 I) + heads (qk_nope + qk_rope + v) + vocab/ranks).
 *
 * Pure computation; every function is thread-safe. */
#ifndef MT_MODEL_MEM_PLAN_H
#define MT_MODEL_MEM_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "model/format/config.h"

typedef enum mem_part {
    MEM_EMBED_HEAD = 0, /* embed_tokens, lm_head, final norm (vocab parallel) */
    MEM_ATTENTION,      /* MLA projections and norms of every layer */
    MEM_INDEXER,        /* DSA indexer of the layers that run one */
    MEM_DENSE_MLP,      /* the first_k_dense_replace dense MLPs */
    MEM_ROUTER,         /* gate weight and correction bias */
    MEM_ROUTED_EXPERTS, /* this rank's share of the routed experts */
    MEM_SHARED_EXPERTS,
    MEM_MTP_EXTRA,      /* the MTP layers' eh_proj, norms and head */
    MEM_PART_COUNT
} mem_part;

const char *mem_part_name(mem_part p); /* "routed_experts", ... */

typedef struct mem_plan_opts {
    int ranks;               /* >= 1 */
    int ep;                  /* expert-parallel ranks; 0: ranks */
    int tp;                  /* attention tensor-parallel ranks; 0 or 1: data parallel */
    bool fp8_kv;             /* KV cache in fp8 (else bf16) */
    int64_t max_batch_tokens; /* largest step; 0: 512 (the runtime's default) */
    double mem_util;         /* fraction of device memory usable; 0: 0.90 */
} mem_plan_opts;

typedef struct mem_plan {
    mem_plan_opts o;             /* as applied (defaults filled in) */
    double part[MEM_PART_COUNT]; /* bytes per rank */
    double weights;              /* sum of part[] */
    double kv_per_token;         /* bytes per token of context, all layers */
    double workspace;            /* activation estimate for a max_batch_tokens step */
    int64_t experts_per_rank;
} mem_plan;

/* What one device kind leaves for the KV cache under a plan. */
typedef struct mem_fit {
    const char *device;  /* "MI355X" */
    double hbm;          /* nominal bytes (vendor figure, 1e9 per GB) */
    double usable;       /* hbm * mem_util */
    double kv_bytes;     /* usable - weights - workspace (negative: does not fit) */
    int64_t kv_tokens;   /* tokens of context per rank (0 when it does not fit) */
    int64_t kv_tokens_total; /* across the deployment: ranks x under dp, per rank under tp */
} mem_fit;

/* The devices the plan is printed for, with their nominal memory. */
int mem_plan_device_count(void);
const char *mem_plan_device_name(int i);
double mem_plan_device_hbm(int i);

/* Fills plan for config c. Invalid options (ranks < 1, E not divisible by
 * ep, heads not divisible by tp, tp not dividing ranks, ...) are
 * MT_E_INVALID naming the option. */
mt_status mem_plan_compute(const model_config *c, const mem_plan_opts *o, mem_plan *plan,
                           mt_err *err);

/* The fit of a plan on a device with hbm bytes. */
mem_fit mem_plan_fit(const mem_plan *plan, const char *device, double hbm);

/* Human-readable report: the per-rank parts and one line per device. */
void mem_plan_print(const mem_plan *plan, const model_config *c, FILE *f);

#endif
