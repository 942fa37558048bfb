/* rt_impl.h: internals of the model runtime (runtime.h), shared by its
 * files, from the bottom up: rt_xchg.c (the exchanges' memory and the
 * leader's messages), rt_ep.c and rt_tp.c (the per-layer hooks of
 * expert and tensor parallelism), rt_seq.c (sequences and their KV pages),
 * rt_load.c (checkpoint weights to device buffers in the layouts the
 * kernels read, the kernel plan registered into the kernel set),
 * rt_forward.c (the forward pass of one step), rt_mtp.c (the MTP draft
 * layer), rt_driver.c (model_step and the ranks' lockstep) and runtime.c
 * (open, close, selection report, accessors). Each file calls only into
 * files listed before it.
 *
 * Every device computation of the forward pass is a launch of a kernel of
 * the runtime's kernel set (kset.h: one config per M bucket from the
 * database, one shared executor per distinct config). The kernels are the
 * entries of the checkpoint's kernel plan (plan.h), added in its order:
 * kernel i of the set is entry i. The MoE MLP is the served MoE layer
 * (moe_layer.h). Not part of the public interface. */
#ifndef MT_MODEL_RT_IMPL_H
#define MT_MODEL_RT_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "db/db.h"
#include "device/device.h"
#include "kernels/core/family.h"
#include "ep_moe.h"
#include "kset.h"
#include "kvcache.h"
#include "moe_layer.h"
#include "model/plan/plan.h"
#include "runtime.h"
#include "model/format/weights.h"

#define RT_MAX_SEQS 256

/* Kernels of one layer (several layers point at the same kernel); one
 * field per model_plan_slot (rt_load.c maps them). */
typedef struct rt_layer_kernels {
    model_kern *norm_in, *gemm_a, *copy_qa, *norm_q, *copy_lat, *norm_kv, *copy_kr, *rope_kr,
        *store_kv;
    model_kern *copy_ik, *rope_ik, *store_ik, *copy_iw; /* full indexer layers */
    model_kern *gemm_b, *copy_q, *rope_q, *copy_iq, *rope_iq, *indexer;
    model_kern *absorb, *copy_qrope, *decode, *copy_o, *vout, *gemm_o, *resid, *norm_post;
    /* dense MLP, or the shared expert when it is bf16 */
    model_kern *gemm_gu, *silu, *gemm_down, *sh_gemm_gu, *sh_silu, *sh_gemm_down;
    model_moe_kernels moe; /* the MoE layer's (combine unused: atomic combine) */
    model_kern *prefill;   /* mla_prefill: dense prompt rows (plan_prefill) */
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
    void *w_kvb;                 /* kv_b as stored, [NH][D + V][L]: mla_prefill expands with it */
    void *w_o;                   /* [H][NH * V] */
    int64_t inter;               /* dense MLP intermediate */
    void *w_gu, *w_down;         /* [2I][H], [H][I] */
    void *gate;                  /* [E][H] router */
    void *bias;                  /* f32 [E] */
    void *w13, *s13, *w2, *s2;   /* MXFP4 experts, gate rows then up rows, in the plan's moe_wl
                                  * (1: grouped with their scales, s13 and s2 empty) */
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
    kvc_seq *mtp_kv;             /* the MTP layer's cache (own pages; may run ahead or behind) */
} rt_seq;

/* The MTP layer (layers[n_layers]) and its head (rt_mtp.c). */
typedef struct rt_mtp {
    bool on;
    void *enorm, *hnorm, *head_norm; /* [H] bf16 */
    void *w_eh;                  /* [H][2H] bf16 */
    void *hin, *cat, *hrows;     /* [T][H], [T][2H] bf16; int32 [T] */
    model_kern *cat_e, *cat_h, *eh, *to_bf16, *to_f32;
    /* The last forward on the runtime: its row count and whether it was the
     * MTP layer's (its xb rows are the hidden states model_mtp_step reads). */
    int64_t last_rows;
    bool last_was_mtp;
} rt_mtp;

/* A run of one item's rows that attends through mla_prefill (dense: each
 * row's context is at most index_topk, so the indexer keeps every key):
 * rows row0 .. row0+n-1 of the batch at positions p .. p+n-1, page-table
 * row `item`. */
typedef struct rt_prefill_run {
    int64_t row0, n, p;
    int item;
} rt_prefill_run;

/* Which rows of the current step attend through mla_prefill (model_step
 * fills it; rt_layer_forward, which the MTP layer uses, runs none), and
 * rows counted per path since open (model_runtime_attention_rows). */
typedef struct rt_prefill {
    rt_prefill_run runs[RT_MAX_SEQS];
    int n_runs;
    int64_t table_stride;        /* page-table entries per item this step */
    int64_t rows_prefill, rows_absorbed;
} rt_prefill;

/* Device activation buffers, sized for max_batch_tokens (T). */
typedef struct rt_bufs {
    void *tok, *pos, *rows, *qseq, *ctx, *table, *lrows, *idx, *val;
    void *resid, *xb, *xn, *delta;
    void *fa, *qa, *qn, *lat, *latn, *kr, *ik, *iw;
    void *fb, *q, *iq, *qabs, *o, *ob, *v;
    void *gu, *h;
    void *xg, *xgf, *logits;
    int64_t table_entries;       /* int32 entries the table buffer holds */
} rt_bufs;

/* A tensor-parallel gather's layout kernel: U units of per elements of
 * es bytes split over the ranks (rt_tp.c). */
#define RT_TP_MAX_COLS 8
typedef struct rt_tp_cols {
    int64_t U, per;
    size_t es;
    model_kern *k;
} rt_tp_cols;

/* The runtime's exchanges between ranks (rt_xchg.c): the leader's step
 * messages go through a device buffer (the communicator may reach only
 * device memory); counted, with the MoE layers' count reads, for
 * model_runtime_copy_counts. */
typedef struct rt_xchg {
    void *msg_dev;               /* device: a step message */
    size_t msg_cap;              /* its bytes */
    uint64_t announce_calls, announce_bytes;
    unsigned timeout_ms;         /* exchanges inside a forward (o.xchg_timeout_ms) */
    bool out_of_step;            /* a step failed inside its forward (runtime.h) */
} rt_xchg;

/* Data-parallel attention under one leader (rt_dp.c; o.dp). The leader
 * keeps, for every other rank, the page bookkeeping of that rank's cache
 * (a kvc_cache without pools, driven by the same calls the rank replays,
 * so it hands out the same pages) and its sequence slots. A sequence id
 * names its rank: rank * RT_MAX_SEQS + the rank's own slot. */
typedef struct rt_dp_rank {
    kvc_cache *kv;               /* the rank's layer-0 pages, bookkeeping only */
    kvc_cache *mtp_kv;           /* its MTP layer's pages (with MTP), bookkeeping only */
    kvc_seq *seq[RT_MAX_SEQS];   /* NULL: slot free */
    kvc_seq *mtp[RT_MAX_SEQS];   /* the slot's MTP cache (with MTP) */
    bool shared[RT_MAX_SEQS];
    int n_seqs;
    int64_t tokens;              /* token rows its attention ran (the leader's count) */
} rt_dp_rank;

typedef struct rt_dp {
    bool on, lead;
    int rank, size;              /* this rank's unit, the units: ranks, or tensor-parallel
                                  * groups (every rank of a group runs its sequences) */
    int group;                   /* ranks per unit (1, or the group's size) */
    int world;                   /* the communicator's ranks */
    rt_dp_rank *ranks;           /* the leader's: [size]; [0] counts only (its own are seqs) */
    int32_t *ops;                /* the leader's journal since the last step, 4 per op */
    int n_ops, cap_ops;
    int32_t *msg;                /* a step message */
    int64_t msg_cap;
    void *recv;                  /* the leader's device buffer: the other ranks' logits rows */
    size_t recv_cap;
    size_t *cnt;                 /* [4 * size]: all-to-all-v counts and displacements */
    int32_t *row_rank, *row_local; /* the leader's: each row of the last forward (a step or
                                  * an MTP step, over every rank's items in item order):
                                  * the rank that ran it and its row there */
    int64_t n_rows, cap_rows;
    bool keep_logits;            /* a follower's rt_step leaves its logits rows on the device */
} rt_dp;

#define RT_DP_SEQ(rank, slot) ((rank) * RT_MAX_SEQS + (slot))

/* Tensor parallelism over the ranks of o.comm (rt_tp.c; o.tp with 2+
 * ranks). Off: `me` is the whole model and the local buffers are the
 * whole ones (v_l is b.v, d_l b.delta, lg_l b.logits). */
typedef struct rt_tp {
    bool on;
    int rank, size;              /* in the group (o.tp_size ranks; all without it) */
    int group, world;            /* which group; the communicator's size */
    model_tp_dims me;            /* this rank's heads, o_proj rows, vocabulary rows */
    void *v_l, *d_l, *lg_l, *h_l; /* device: this rank's heads' attention output
                                  * [T][heads*VD] bf16, o_proj / MLP down rows [T][o_rows]
                                  * f32, logits [T][vocab] f32, bf16 MLP activations
                                  * [T][its share of the intermediate] */
    void *x_recv;                /* device: what a gather receives, x_cap bytes */
    void *moe_y;                 /* device: this rank's MoE rows [T / size + 1][H] f32 */
    size_t x_cap;
    rt_tp_cols cols[RT_TP_MAX_COLS]; /* the gathers' layout kernels (tp_cols) */
    int n_cols;
    size_t *cnt;                 /* [4 * world]: all-to-all-v counts and displacements */
    int64_t *w;                  /* [size]: an exchange's columns per rank */
    int32_t *msg;                /* the leader's step message (journal, then items) */
    int64_t n_msg, msg_cap;      /* int32 entries; the journal is msg[2 .. 2 + 4 * msg[0]) */
    bool lead;                   /* rank 0 of a comm_lead runtime: journals and announces
                                  * (not under data-parallel attention, which does) */
    struct mt_comm *gcomm;       /* the group's own communicator (mt_comm_split) when the
                                  * job has several groups; NULL: o.comm is the group */
} rt_tp;

/* Vocabulary-parallel embedding and head across data-parallel ranks
 * (rt_vp.c; on with o.dp over plain ranks): each rank holds a share of
 * the vocabulary's embedding and lm_head rows, and every rank knows every
 * rank's tokens and logits rows of the step (from rank 0's message). */
typedef struct rt_vp_item {
    const int32_t *tok;
    int n, rank, rows;           /* tokens, the unit running them (rt_dp), logits rows */
} rt_vp_item;

typedef struct rt_vp {
    bool on;
    int world, rank;             /* every rank of the job holds a share; this one */
    int units, group, unit;      /* rt_dp's units (ranks or groups), ranks per unit, this
                                  * rank's unit */
    int64_t *v0, *nv;            /* [world]: each rank's vocabulary rows */
    int32_t *tok;                /* the step's tokens, unit by unit (each unit's in its order) */
    int64_t n_tok, cap_tok;
    int64_t *m, *nl;             /* [units]: the step's token rows and logits rows per unit */
    rt_vp_item *items;           /* the step's items as announced */
    int n_items, cap_items;
    int32_t *own, *perm;         /* host [T]: a window's owned ids, this rank's rows' sources */
    void *d_own, *d_perm;        /* device [T] int32: the same */
    void *send, *recv, *scratch; /* device [T][H]: bf16 rows out and in, f32 scratch */
    void *hid;                   /* device [T][H] bf16: a chunk's hidden rows, every rank's */
    void *lg;                    /* device [T][nv] f32: this rank's columns of a chunk */
    void *cols_in;               /* rank 0's device [T][V] f32: the ranks' column blocks */
    void *remote;                /* rank 0's device: the other ranks' logits rows */
    size_t remote_cap;
    size_t *cnt;                 /* [4 * world]: all-to-all-v counts and displacements */
    model_kern *cols;            /* tp_cols: the ranks' columns side by side */
    uint64_t index_calls, index_bytes; /* host copies of the id lists */
    /* Without a data-parallel leader (self): every forward shares its row
     * counts and token ids with the other ranks (rt_vp_share), and each
     * rank receives its own rows' column blocks. */
    bool self;
    void *d_cnt;                 /* device [2 * world] int32: the ranks' (rows, logits rows) */
    void *d_ids;                 /* device [world][T] int32: the ranks' token ids */
    int32_t *cnt_h, *ids_h;      /* host copies of the same */
    uint64_t share_to_calls, share_to_bytes, share_from_calls, share_from_bytes;
} rt_vp;

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
    int64_t sm_bits;             /* mla_decode's sm dim: the softmax scale's float bits
                                  * under YaRN, 0 (the family's (D+R)^-0.5) otherwise */
    kern_dtype act;              /* activations into the expert GEMMs: bf16, mxfp4, i8 */
    kern_dtype kv_dtype;
    int ps;                      /* tokens per page */
    int64_t n_pages, max_ctx, T; /* T: max_batch_tokens */
    moe_dims moe;                /* the MoE layers' dims (largest MXFP4 shared expert) */

    /* weights */
    void *embed, *final_norm, *lm_head, *rope_cs;
    rt_layer *layers;

    /* kernels */
    model_kset *ks;
    model_kern *k_embed, *k_norm_final, *k_gather, *k_lm_head;
    model_moe_ws *moe_ws;        /* the MoE layers' workspace */
    model_ep *ep;                /* expert parallelism (o.comm with MoE layers); NULL */
    bool ep_joined;              /* this step reached its forward (rt_ep.c) */
    bool ep_ended;               /* the leader told the other ranks to stop */

    rt_tp tp;
    rt_dp dp;
    rt_vp vp;
    rt_xchg xc;
    rt_bufs b;
    rt_prefill pf;
    rt_mtp mtp;
    rt_seq seqs[RT_MAX_SEQS];
    int32_t *h_i32;              /* host staging, T * max(TOPK, 8) entries */
};

/* ---- rt_load.c ---- */

/* Uploads every weight the forward reads (layer facts from rt->plan);
 * adds the plan's kernels to a new kernel set (rt->ks, selected by
 * runtime.c) and points each layer at its own. */
mt_status rt_load(model_runtime *rt, mt_err *err);
void rt_unload(model_runtime *rt);
/* Allocates the activation buffers and the MoE workspace for rt->T tokens. */
mt_status rt_bufs_alloc(model_runtime *rt, mt_err *err);
void rt_bufs_free(model_runtime *rt);
/* The MTP layer and head weights, kernels and buffers (after rt_bufs_alloc). */
mt_status rt_mtp_load(model_runtime *rt, mt_err *err);
void rt_mtp_unload(model_runtime *rt);

/* ---- rt_forward.c ---- */

/* One decoder layer (attention and MLP) over the M rows staged in rt->b
 * (tokens' positions, pool rows, page table, query rows, contexts), xb and
 * resid in, xb and resid out; cmax the longest context. */
mt_status rt_layer_forward(model_runtime *rt, rt_layer *ly, int64_t M, int64_t cmax, mt_err *err);
/* model_step on this runtime alone (rt_driver.c's model_step adds the
 * ranks' lockstep when the runtime has a communicator). */
mt_status rt_step(model_runtime *rt, model_step_item *items, int n, mt_err *err);
/* Item i of a step (its sequence len tokens long; -1: no sequence):
 * MT_E_INVALID naming what is wrong with it (and with items before it). */
mt_status rt_check_item(const model_runtime *rt, const model_step_item *items, int i,
                        int64_t len, mt_err *err);

/* ---- rt_ep.c: across the ranks of o.comm (expert parallelism) ---- */

/* Before rt_load's layers: this rank's expert range (every expert without
 * a communicator or MoE layers). */
mt_status rt_ep_open(model_runtime *rt, mt_err *err);
void rt_ep_experts(const model_runtime *rt, int64_t *first, int64_t *count);
/* The local expert kernels into rt->ks (before select); their workspace
 * (after rt_bufs_alloc). */
mt_status rt_ep_add_kernels(model_runtime *rt, mt_err *err);
mt_status rt_ep_ws_alloc(model_runtime *rt, mt_err *err);
/* The leader's end message, then the layer freed. */
void rt_ep_close(model_runtime *rt);
/* The MoE MLP of layer ly on the M rows x into y (f32), expert-parallel. */
mt_status rt_ep_moe(model_runtime *rt, rt_layer *ly, const void *x, int64_t M, float *y,
                    mt_err *err);
/* Right before a forward with a communicator (rt_step calls it): the
 * leader of a comm_lead runtime announces the step's token count. */
mt_status rt_ep_step_begin(model_runtime *rt, int64_t M, mt_err *err);
/* The same before an MTP layer's forward (rt_mtp_step): the leader
 * announces RT_EP_MTP, on which a follower joins that layer's exchanges. */
mt_status rt_ep_mtp_begin(model_runtime *rt, mt_err *err);
/* What the leader of an expert-parallel (not tensor-parallel) runtime
 * announces besides a step's token count (>= 0). */
enum { RT_EP_END = -1, RT_EP_MTP = -2 };

/* ---- rt_xchg.c: the exchanges' memory and the leader's messages ---- */

/* Checks that the communicator reaches the device's memory (nccl on cuda,
 * rccl on hip, self and mpi on cpu and emu); MT_E_UNSUPPORTED naming both
 * otherwise. Nothing to do without a communicator. */
mt_status rt_xchg_open(model_runtime *rt, mt_err *err);
void rt_xchg_close(model_runtime *rt);
/* Broadcasts n int32 of host memory from rank 0 through a device buffer:
 * rank 0 copies them in, every other rank copies them out. */
mt_status rt_xchg_bcast(model_runtime *rt, int32_t *host, size_t n, mt_err *err);
/* After a step that failed with st: when it had reached its forward's
 * exchanges (rt->ep_joined), the runtime is out of step for good and a
 * leader ends the job (runtime.h). Returns st. */
mt_status rt_xchg_step_failed(model_runtime *rt, mt_status st);

/* ---- rt_tp.c: tensor parallelism (o.tp) ---- */

/* After the plan: the ranks' shares (off without o.tp or with one rank);
 * MT_E_INVALID for tp without a communicator. */
mt_status rt_tp_open(model_runtime *rt, mt_err *err);
/* After rt_bufs_alloc: the local buffers and the gathers' receive buffer. */
mt_status rt_tp_bufs_alloc(model_runtime *rt, mt_err *err);
/* The gathers' layout kernels: the plan's tp_cols entries, right after
 * rt_load registered the plan (before model_kset_select). */
mt_status rt_tp_add_kernels(model_runtime *rt, mt_err *err);
void rt_tp_close(model_runtime *rt);
/* full [rows][per * total] on every rank from each rank's local
 * [rows][per * n_q] columns, where n_q is rank q's share of `total`
 * (model_ep_range: heads, o_proj rows, vocabulary, MLP intermediate);
 * es bytes per element. */
mt_status rt_tp_gather(model_runtime *rt, int64_t total, int64_t per, const void *local,
                       void *full, int64_t rows, size_t es, mt_err *err);
/* Tokens as this rank's embedding rows (the zero row for other ranks'). */
void rt_tp_local_tokens(const model_runtime *rt, int32_t *tok, int64_t M);
/* After the embedding: every rank's rows summed into resid and xb. */
mt_status rt_tp_embed_sum(model_runtime *rt, int64_t M, mt_err *err);
/* The MoE MLP of layer ly on the batch's M rows (xn in, delta out): this
 * rank's share of the rows expert-parallel, then every rank's rows. */
mt_status rt_tp_moe(model_runtime *rt, rt_layer *ly, int64_t M, mt_err *err);
/* Sequence operations the leader's followers replay (RT_TP_OP_*). */
enum { RT_TP_OP_CREATE = 1, RT_TP_OP_FORK, RT_TP_OP_FREE, RT_TP_OP_TRUNCATE,
       RT_TP_OP_MTP_TRUNCATE };
void rt_tp_note(model_runtime *rt, int op, int seq, int64_t a, int64_t b);
/* The leader's step: the journal and the items to the followers. */
mt_status rt_tp_announce(model_runtime *rt, const model_step_item *items, int n, mt_err *err);
/* The leader's MTP step (model_mtp_step): the journal and its items. */
mt_status rt_tp_announce_mtp(model_runtime *rt, const model_mtp_item *items, int n,
                             mt_err *err);

/* ---- rt_seq.c ---- */

/* Pages sequence cache s needs to grow by n tokens (shared: its last page
 * may be shared and is copied before a write; an upper bound). s may be a
 * bookkeeping-only cache's (rt_dp.c). */
int64_t rt_seq_grow_pages(const model_runtime *rt, const kvc_seq *s, bool shared, int64_t n);

/* ---- rt_dp.c: data-parallel attention under one leader (o.dp) ---- */

/* After the MTP layer: the leader's bookkeeping of the other ranks (off
 * without o.dp); MT_E_INVALID / MT_E_UNSUPPORTED for options it cannot
 * run with. */
mt_status rt_dp_open(model_runtime *rt, mt_err *err);
void rt_dp_close(model_runtime *rt);
/* A sequence id of another rank on the leader. */
bool rt_dp_remote(const model_runtime *rt, int seq);
/* The leader's operation on one of its own sequences (RT_TP_OP_*), for the
 * other ranks of its tensor-parallel group to replay; nothing otherwise. */
void rt_dp_note_local(model_runtime *rt, int op, int seq, int64_t a, int64_t b);
/* The leader's operations on another rank's sequences (journaled for it). */
mt_status rt_dp_create(model_runtime *rt, int rank, int *seq, mt_err *err);
mt_status rt_dp_fork(model_runtime *rt, int src, int64_t n, int *seq, mt_err *err);
void rt_dp_free(model_runtime *rt, int seq);
mt_status rt_dp_truncate(model_runtime *rt, int seq, int64_t len, mt_err *err);
int64_t rt_dp_len(const model_runtime *rt, int seq);
int64_t rt_dp_pages_needed(const model_runtime *rt, int seq, int64_t n);
/* The rank model_seq_create places a new sequence on: the most free KV
 * pages, then the fewest sequences, then the fewest token rows run so far,
 * then the lowest rank. */
int rt_dp_pick(const model_runtime *rt);
/* The leader's model_step: every item on its sequence's rank. */
mt_status rt_dp_step(model_runtime *rt, model_step_item *items, int n, mt_err *err);
/* MTP on the leader: another rank's MTP cache, and model_mtp_step with
 * every item on its sequence's rank (its hidden rows must be there). */
int64_t rt_dp_mtp_len(const model_runtime *rt, int seq);
mt_status rt_dp_mtp_truncate(model_runtime *rt, int seq, int64_t len, mt_err *err);
mt_status rt_dp_mtp_step(model_runtime *rt, model_mtp_item *items, int n, mt_err *err);
/* A follower's loop (model_runtime_follow). */
mt_status rt_dp_follow(model_runtime *rt, int64_t *steps, mt_err *err);

/* ---- rt_driver.c ---- */

/* A forward with no local tokens: only the MoE layers' exchanges; the
 * same for the MTP layer. */
/* lm_head over the nl rows of b.xg into b.logits (tensor-parallel or
 * vocabulary-parallel where the runtime is), then a device sync. */
mt_status rt_head(model_runtime *rt, int64_t nl, mt_err *err);
mt_status rt_empty_forward(model_runtime *rt, mt_err *err);
mt_status rt_empty_mtp(model_runtime *rt, mt_err *err);

/* rt_vp.c. Open: after rt_dp_open (on when dp is, over ranks or
 * tensor-parallel groups); buffers and the gather kernel. */
mt_status rt_vp_open(model_runtime *rt, mt_err *err);
void rt_vp_close(model_runtime *rt);
/* The step every rank runs, as rank 0 announced it: items in item order
 * (their tokens stay valid through the step), each with its unit (rt_dp's
 * rank or group) and logits rows. Begin, add each, then seal (lays the
 * tokens out unit by unit). */
void rt_vp_begin(model_runtime *rt);
mt_status rt_vp_add(model_runtime *rt, int unit, const int32_t *tokens, int n_tokens, int rows,
                    mt_err *err);
mt_status rt_vp_seal(model_runtime *rt, mt_err *err);
/* Without dp (vp.self): this rank's forward of M rows (their ids in b.tok)
 * and nl logits rows, shared with every rank's, then sealed as the step
 * (the step's first exchange: every rank calls it, with rows or without).
 * A no-op under dp. */
mt_status rt_vp_share(model_runtime *rt, int64_t M, int64_t nl, mt_err *err);
/* A forward of M rows and nl logits rows on this rank against what rank 0
 * announced for its unit: MT_E_INVALID naming both when they differ (the
 * exchanges would run at the wrong sizes). */
mt_status rt_vp_check(const model_runtime *rt, int64_t M, int64_t nl, mt_err *err);
/* The embedding of this rank's rows of the sealed step into b.resid (f32)
 * and b.xb (bf16); every rank calls it, with rows or without. */
mt_status rt_vp_embed(model_runtime *rt, mt_err *err);
/* The logits of every unit's b.xg rows (nl[unit] of them): unit 0's into
 * rank 0's b.logits, the other units' (unit by unit) into its vp.remote. */
mt_status rt_vp_head(model_runtime *rt, mt_err *err);
/* Logits rows of the sealed step over every unit. */
int64_t rt_vp_rows(const model_runtime *rt);

/* ---- rt_mtp.c: the MTP draft layer ---- */

/* model_mtp_step on this runtime alone (rt_driver.c's adds the ranks'
 * lockstep); n >= 1 items, the MTP layer loaded. */
mt_status rt_mtp_step(model_runtime *rt, model_mtp_item *items, int n, mt_err *err);
/* MTP item i (its sequence's MTP cache mlen positions long; -1: none), all
 * but its hidden rows: MT_E_INVALID naming what is wrong. */
mt_status rt_check_mtp_item(const model_runtime *rt, const model_mtp_item *items, int i,
                            int64_t mlen, mt_err *err);

#endif
