/* rt_impl.h: internals of the model runtime (runtime.h), shared by its
 * files: runtime.c (open, close, sequences), rt_select.c (kernel selection
 * from the tuning database, module sharing, launches, report), rt_load.c
 * (checkpoint weights to device buffers in the layouts the kernels read)
 * and rt_forward.c (model_step).
 *
 * Every device computation of the forward pass is a launch of a kernel
 * family through rt_run: an rt_kernel is one (family, shape) the forward
 * uses; at open it gets one config per M bucket (rt_choice), each compiled
 * once into a module shared by every kernel with the same family, tuning
 * key and config. The kernels are the entries of the checkpoint's kernel
 * plan (plan.h), registered in its order: rt->kerns[i] is entry i. Not part
 * of the public interface. */
#ifndef MT_MODEL_RT_IMPL_H
#define MT_MODEL_RT_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../db/db.h"
#include "../device/device.h"
#include "../kernels/family.h"
#include "../kernels/kvcache.h"
#include "plan.h"
#include "runtime.h"
#include "weights.h"

/* The M buckets (the tuner's default list): a call with M tokens runs the
 * config of the smallest bucket >= M; M past the last bucket runs the last. */
#define RT_N_BUCKETS 16
extern const int64_t rt_buckets[RT_N_BUCKETS];

#define RT_MAX_SEQS 256

/* Where a bucket's config came from. */
typedef enum rt_prov {
    RT_PROV_TUNED = 0,       /* exact hit */
    RT_PROV_NEAREST = 1,     /* tuned at another M of this shape */
    RT_PROV_OTHER_DEVICE = 2,/* tuned on another device of the same arch (used) */
    RT_PROV_STALE = 3,       /* entries only for another source hash: default runs */
    RT_PROV_MISS = 4,        /* nothing in the database: default runs, miss recorded */
    RT_PROV_NO_DB = 5,       /* no database given: default */
    RT_PROV_REJECTED = 6,    /* the database's config is not valid here: default runs */
    RT_PROV_COUNT
} rt_prov;

typedef struct rt_choice {
    int64_t m;           /* bucket */
    kern_config cfg;
    rt_prov prov;
    int64_t tuned_m;     /* M the config was tuned at (tuned/nearest/other device) */
    bool miss_recorded;
    char note[192];      /* other device's name, stale hash, rejection reason */
    int module;          /* index into rt->mods */
} rt_choice;

typedef struct rt_kernel {
    const kern_family *fam;
    const kern_impl *impl;
    kern_shape shape;           /* tuning dims + representative runtime dims */
    char key[KERN_KEY_MAX];     /* tuning key */
    char use[64];               /* what the forward uses it for */
    int64_t m_max;              /* largest M the forward passes */
    int n;                      /* buckets in use */
    rt_choice ch[RT_N_BUCKETS];
} rt_kernel;

typedef struct rt_module {
    const kern_family *fam;
    const struct rt_kernel *kern; /* the first kernel that asked for it (shape to compile) */
    kern_config cfg;
    char key[KERN_KEY_MAX];
    char cfg_key[256];
    dev_code *code;
    dev_module *mod;
} rt_module;

/* Kernels of one layer (several layers point at the same rt_kernel); one
 * field per model_plan_slot (rt_load.c maps them). */
typedef struct rt_layer_kernels {
    rt_kernel *norm_in, *gemm_a, *copy_qa, *norm_q, *copy_lat, *norm_kv, *copy_kr, *rope_kr,
        *store_kv;
    rt_kernel *copy_ik, *rope_ik, *store_ik, *copy_iw; /* full indexer layers */
    rt_kernel *gemm_b, *copy_q, *rope_q, *copy_iq, *rope_iq, *indexer;
    rt_kernel *absorb, *copy_qrope, *decode, *copy_o, *vout, *gemm_o, *resid, *norm_post;
    /* dense MLP, or the shared expert when it is bf16 */
    rt_kernel *gemm_gu, *silu, *gemm_down, *sh_gemm_gu, *sh_silu, *sh_gemm_down;
    /* MoE */
    rt_kernel *route, *align, *up, *down, *sh_align, *sh_up, *sh_down;
} rt_layer_kernels;

/* Device weights of one layer (bf16 unless noted). */
typedef struct rt_layer {
    bool moe, full;              /* MoE MLP; runs its own indexer */
    int64_t n_a, n_b;            /* rows of the fused A and B projections */
    void *in_norm, *post_norm;   /* [H] */
    void *w_a;                   /* [n_a][H]: q_a | kv_a (| indexer wk | weights_proj) */
    void *q_norm, *kv_norm;      /* [QL], [L] */
    void *w_b;                   /* [n_b][QL]: q_b (| indexer wq_b) */
    void *k_norm_w, *k_norm_b;   /* f32 [ID] */
    void *w_ukt;                 /* [NH][L][D] (W_UK transposed per head) */
    void *w_uv;                  /* [NH][V][L] */
    void *w_o;                   /* [H][NH * V] */
    int64_t inter;               /* dense MLP intermediate */
    void *w_gu, *w_down;         /* [2I][H], [H][I] */
    void *gate;                  /* [E][H] router */
    void *bias;                  /* f32 [E] */
    void *w13, *s13, *w2, *s2;   /* MXFP4 experts (Quark layout, gate rows then up rows) */
    int64_t sh_inter;            /* shared expert intermediate; 0 = none */
    bool sh_mxfp4;
    void *sh_w13, *sh_s13, *sh_w2, *sh_s2; /* MXFP4 shared expert */
    void *sh_gu, *sh_down;       /* bf16 shared expert */
    kvc_cache *kv;               /* latent (+ indexer key) cache of this layer */
    rt_layer_kernels k;
} rt_layer;

typedef struct rt_seq {
    bool used;
    bool shared;                 /* forked from or into: the last page may be shared */
    kvc_seq **kv;                /* one per layer; page ids identical in every layer */
} rt_seq;

/* Device activation buffers, sized for max_batch_tokens (T). */
typedef struct rt_bufs {
    void *tok, *pos, *rows, *qseq, *ctx, *table, *lrows, *idx, *val;
    void *resid, *xb, *xn, *delta;
    void *fa, *qa, *qn, *lat, *latn, *kr, *ik, *iw;
    void *fb, *q, *iq, *qabs, *o, *ob, *v;
    void *gu, *h;
    void *ids, *tw, *sorted, *tile, *total, *eh, *sh_ids, *sh_w, *sh_sorted, *sh_tile,
        *sh_total, *sh_h;
    void *xg, *xgf, *logits;
    int64_t table_entries;       /* int32 entries the table buffer holds */
} rt_bufs;

struct model_runtime {
    model_runtime_opts o;
    FILE *log;
    dev_device *dev;
    const dev_props *props;
    db_t *db;
    model_weights *w;
    const model_config *cfg;
    model_tokenizer *tok;

    model_plan *plan;            /* what the kernels are (settings below come from it) */

    /* dims */
    int64_t H, V, NH, QL, L, R, D, VD, IH, ID, TOPK, E, TOPKE, IE, n_layers;
    int eps_e, eps6_e;           /* rms_norm_eps and the q/kv latent norms' 1e-6 */
    bool a4;                     /* MXFP4 activations into the expert GEMMs */
    kern_dtype kv_dtype;
    int ps;                      /* tokens per page */
    int64_t n_pages, max_ctx, T; /* T: max_batch_tokens */
    int64_t moe_cap, sh_cap;     /* rows of the aligned layouts */

    /* weights */
    void *embed, *final_norm, *lm_head, *rope_cs;
    rt_layer *layers;

    /* kernels and modules */
    rt_kernel **kerns;
    int n_kerns, cap_kerns;
    rt_module *mods;
    int n_mods, cap_mods;
    rt_kernel *k_embed, *k_norm_final, *k_gather, *k_lm_head;
    void *scratch;
    size_t scratch_bytes;

    rt_bufs b;
    rt_seq seqs[RT_MAX_SEQS];
    int32_t *h_i32;              /* host staging, T * max(TOPK, 8) entries */
};

/* ---- rt_select.c ---- */

/* Registers one kernel per entry of rt->plan, in plan order (rt->kerns[i]
 * is entry i; its runtime dims are the representative values used for
 * defaults and validity). Fails naming the family when it has no
 * implementation for the device's backend. */
mt_status rt_kernels_register(model_runtime *rt, mt_err *err);
/* Chooses a config for every registered kernel and bucket (database or
 * default), compiles and loads every distinct one, and logs a summary. */
mt_status rt_select(model_runtime *rt, mt_err *err);
/* Runs k for m rows on bufs; shape (may be NULL) carries this call's
 * runtime dims. */
mt_status rt_run(model_runtime *rt, rt_kernel *k, int64_t m, const kern_shape *shape,
                 void *const *bufs, mt_err *err);
/* Sets runtime dim `name` of a copy of k's shape. */
void rt_shape_set(const rt_kernel *k, kern_shape *s, const char *name, int64_t v);
/* Frees kernels, modules, scratch and the plan. */
void rt_kernels_free(model_runtime *rt);
const char *rt_prov_name(rt_prov p);

/* ---- rt_load.c ---- */

/* Uploads every weight the forward reads (layer facts from rt->plan);
 * registers the plan's kernels and points each layer at its own. */
mt_status rt_load(model_runtime *rt, mt_err *err);
void rt_unload(model_runtime *rt);
/* Allocates the activation buffers for rt->T tokens. */
mt_status rt_bufs_alloc(model_runtime *rt, mt_err *err);
void rt_bufs_free(model_runtime *rt);

#endif
