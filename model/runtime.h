/* runtime.h: the GLM-5.2 model runtime as the server and `moetune
 * generate` use it: open a checkpoint on a device with kernels picked from a
 * tuning database, keep sequences (each with its paged KV cache across all
 * layers), and run batched forward steps that append tokens to sequences
 * and return logits.
 *
 * Load-time kernel selection: for every (family, shape, M bucket) the
 * forward pass will run, the runtime asks the database (exact, then the
 * nearest tuned M, else the default config with a recorded miss) and keeps
 * the answer; model_runtime_report prints it. Without a database every
 * kernel is the default and the report says so.
 *
 * Ownership: model_runtime_open returns a runtime the caller closes with
 * model_runtime_close, which also frees every sequence. Sequence ids are
 * small non-negative integers owned by the runtime. Failures return an
 * mt_status with err filled and leave the runtime and every sequence as it
 * was (a failed step appends nothing). Not thread-safe: one thread drives a
 * runtime (the server's scheduler thread). */
#ifndef MT_MODEL_RUNTIME_H
#define MT_MODEL_RUNTIME_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/rng.h"
#include "common/status.h"
#include "model/format/config.h"
#include "kset.h"
#include "model/plan/plan.h"
#include "model/format/tokenizer.h"

typedef struct model_runtime_opts {
    const char *model_dir;   /* checkpoint folder (config.json, shards, ...) */
    const char *db_path;     /* tuning database; NULL = default configs */
    const char *device;      /* device spec ("cpu", "emu", "hip:0", "auto") */
    int threads;             /* cpu/emu threads; 0 = all cores */
    model_act_quant act_quant; /* default: what the checkpoint's Quark config asks */
    bool act_quant_set;      /* true when act_quant overrides the checkpoint */
    int kv_dtype;            /* kern_dtype: KERN_DT_BF16 (default) or KERN_DT_FP8E4M3 */
    int kv_page_size;        /* tokens per KV page; 0 = 16 */
    int kv_pages;            /* pages in the pool; 0 = enough for 8 full contexts */
    int max_batch_tokens;    /* largest step (tokens over all items); 0 = 512 */
    bool batch_invariant;    /* one config per kernel at every M, no split-K (kset.h): a
                              * token's logits do not depend on the batch */
    bool absorbed_prefill;   /* every row on the absorbed mla_decode path, prefill chunks
                              * too (as batch_invariant does); for A/B measurements */
    int speculative_steps;   /* > 0: load the MTP layer to draft with (model_mtp_step); the
                              * most draft tokens a round may use (<= MODEL_SPEC_MAX_STEPS) */
    FILE *log;               /* selection report and warnings; NULL = stderr */
    struct mt_comm *comm;    /* ranks to split the routed experts over (expert parallelism,
                              * comm/comm.h; everything else replicated); NULL: one device.
                              * The caller's: it must outlive the runtime */
    bool comm_lead;          /* with comm: rank 0 drives every step, the other ranks run
                              * model_runtime_follow; false: each rank runs its own steps */
    bool tp;                 /* with comm of 2+ ranks: tensor parallelism (rt_tp.c). Attention
                              * heads, o_proj's output rows, the embedding's and lm_head's
                              * vocabulary rows are split over the ranks (model_tp_local);
                              * every rank runs every token of every step and holds the whole
                              * latent cache; each MoE layer splits the step's tokens over the
                              * ranks, expert-parallel. With comm_lead the followers mirror
                              * rank 0's sequences and steps; without it every rank must make
                              * the same calls with the same arguments */
    int tp_size;             /* with tp: ranks per tensor-parallel group (it must divide the
                              * communicator's size); 0 = every rank, one group. Group g is
                              * ranks g * tp_size .. + tp_size - 1; routed experts stay split
                              * over every rank; a group's gathers run on its own communicator
                              * (mt_comm_split). With dp each group holds and runs its own
                              * sequences; without it every group mirrors the first (the
                              * experts then run each group's rows) */
    bool dp;                 /* with comm_lead: data-parallel attention under one leader
                              * (rt_dp.c), over the ranks, or with tp over its groups (tp_size
                              * below the job's size; a "rank" below is then a group). Every
                              * rank holds the KV cache of its own
                              * sequences and runs their attention; rank 0 places each new
                              * sequence on a rank (model_seq_create: the most free KV pages,
                              * then the fewest sequences and token rows run so far;
                              * model_seq_create_on; a fork stays on its source's rank), and
                              * its model_step runs each item on its sequence's rank, the
                              * logits coming back to rank 0. Sequence ids then name their
                              * rank (model_seq_rank). MTP draft steps run on the rank
                              * holding their sequence, from the hidden rows it ran */
    unsigned xchg_timeout_ms; /* with comm: the longest an exchange inside a forward may wait
                              * for the other ranks (mt_comm_set_timeout; set on comm) before
                              * the step fails; 0 = 30000. A follower waiting for the next
                              * step waits without limit */
} model_runtime_opts;

/* The runtime's options as plan options (same defaults): the plan the
 * runtime registers its kernels from. */
void model_runtime_plan_opts(const model_runtime_opts *ro, model_plan_opts *out);

typedef struct model_runtime model_runtime;

mt_status model_runtime_open(const model_runtime_opts *o, model_runtime **out,
                             mt_err *err);
void model_runtime_close(model_runtime *rt); /* NULL is a no-op */

const model_config *model_runtime_config(const model_runtime *rt);
/* NULL when the checkpoint has no tokenizer.json (token ids still work). */
const model_tokenizer *model_runtime_tokenizer(const model_runtime *rt);
int32_t model_runtime_vocab(const model_runtime *rt);
int64_t model_runtime_max_context(const model_runtime *rt);

/* Kernel selection: counts of kernels by provenance, and a printed table
 * (family, shape, M bucket, config, provenance). */
void model_runtime_selection(const model_runtime *rt, model_selection_counts *out);
void model_runtime_report(const model_runtime *rt, FILE *f);
/* The runtime's kernel set (owned by the runtime, valid until close): for
 * live swaps (kset_swap.h), whose calls say which thread may make them. */
model_kset *model_runtime_kernels(model_runtime *rt);
/* Token rows model_step has attended since open, per attention path: dense
 * mla_prefill (prompt rows whose context is at most index_topk;
 * model_step_item.n_prompt; never on a batch-invariant runtime) and
 * absorbed mla_decode (the rest). Counted once per row, not per layer; MTP
 * steps not counted. */
void model_runtime_attention_rows(const model_runtime *rt, int64_t *prefill_rows,
                                  int64_t *absorbed_rows);
/* Positions below which prompt rows attend through mla_prefill and
 * generated rows do not (index_topk; 0 on a batch-invariant or
 * absorbed_prefill runtime, where every row is absorbed; see the attention
 * paths at model_step_item). A sequence's KV at a position below it depends
 * on which of its tokens were prompt tokens: the server's prefix cache
 * never hands KV computed for a generated token there to a prompt. */
int64_t model_runtime_prefill_positions(const model_runtime *rt);

/* ---- sequences ------------------------------------------------------------ */

/* A new empty sequence. MT_E_BUSY when no sequence slot is free. */
mt_status model_seq_create(model_runtime *rt, int *seq, mt_err *err);
/* A new sequence sharing the first n tokens of src (whole KV pages shared,
 * copy-on-write; used by the prefix cache). */
mt_status model_seq_fork(model_runtime *rt, int src, int64_t n, int *seq, mt_err *err);
/* Frees the sequence's KV pages (shared pages stay with their other users). */
void model_seq_free(model_runtime *rt, int seq);
int64_t model_seq_len(const model_runtime *rt, int seq);

/* KV pages free in the pool and tokens per page: the scheduler's admission
 * control. A step needs ceil((len + n) / page) - pages already held. On a
 * data-parallel leader (opts.dp) the pool is rank 0's own; every rank's
 * pool has the same size, and model_kv_free_pages_on reads each. */
int64_t model_kv_free_pages(const model_runtime *rt);
int model_kv_page_size(const model_runtime *rt);
/* Pages a sequence would need to grow by n tokens. */
int64_t model_seq_pages_needed(const model_runtime *rt, int seq, int64_t n);

/* Data-parallel attention (opts.dp; on rank 0). Without it there is one
 * rank to place on (0) and these read this runtime's own cache. With
 * tensor-parallel groups a "rank" here is a group (group g: ranks
 * g * tp_size ..). */
int model_runtime_dp_ranks(const model_runtime *rt);  /* ranks sequences are placed on */
/* A new empty sequence on rank `rank` (0 .. dp_ranks - 1). */
mt_status model_seq_create_on(model_runtime *rt, int rank, int *seq, mt_err *err);
/* The rank holding a sequence; -1 for no sequence. */
int model_seq_rank(const model_runtime *rt, int seq);
/* A rank's free KV pages, its live sequences, and the token rows its
 * attention has run since open (on rank 0: its count of every rank's). */
int64_t model_kv_free_pages_on(const model_runtime *rt, int rank);
int model_seqs_on(const model_runtime *rt, int rank);
int64_t model_rank_tokens(const model_runtime *rt, int rank);

/* ---- forward ---------------------------------------------------------------- */

typedef struct model_step_item {
    int seq;                 /* sequence the tokens are appended to */
    const int32_t *tokens;   /* n_tokens token ids (a prefill chunk, or 1 to decode) */
    int n_tokens;
    float *logits;           /* vocab floats: logits after the last token; may be NULL */
    float *all_logits;       /* [n_tokens][vocab] for every position; may be NULL */
    int n_prompt;            /* 0..n_tokens: how many of the tokens, from the first, are
                              * prompt tokens (given, not sampled from this sequence's
                              * logits); the rest are generated tokens. See below */
} model_step_item;

/* Attention paths. A row attends through dense mla_prefill when it is a
 * prompt token (within its item's first n_prompt tokens) at a position below
 * index_topk (where the DSA indexer keeps every key), and through the
 * absorbed mla_decode otherwise; never mla_prefill on a batch-invariant or
 * absorbed_prefill runtime. The two paths round differently, so the path is
 * a property of the row, not of how the prompt was cut into steps: a prompt
 * gives the same logits in one chunk or in chunks of any size, single
 * tokens included, and in any batch (up to the kernels' per-M configs; see
 * docs/SERVING.md). Decode steps and speculative verification feed
 * generated tokens (n_prompt 0): one row on mla_prefill would expand the
 * whole context through kv_b every step. A request recomputed after
 * preemption marks only its prompt as prompt: its generated tokens take the
 * path they took when they were decoded. */

/* Runs one batched forward step: every item's tokens are appended to its
 * sequence and logits written where asked. MT_E_NOMEM (nothing appended)
 * when the KV pool cannot hold the tokens; MT_E_INVALID for a token id out
 * of range, an n_prompt outside 0..n_tokens or a sequence past the maximum
 * context, naming the item. */
mt_status model_step(model_runtime *rt, model_step_item *items, int n, mt_err *err);

/* ---- several ranks (opts.comm) ---------------------------------------------- */

/* With a communicator every MoE layer of every step exchanges (token,
 * expert) pairs with every rank, so all ranks step in lockstep:
 * - without comm_lead each rank calls model_step the same number of times,
 *   with n = 0 when it has nothing to run (it then serves its experts to
 *   the others); a step that fails before its forward still joins;
 * - with comm_lead only rank 0 calls model_step (n = 0 there does
 *   nothing); it announces each forward to the others, which run
 *   model_runtime_follow until rank 0 closes its runtime.
 * A step that fails inside its forward leaves the ranks out of step
 * (model_runtime_out_of_step below). */

/* A rank whose step failed inside its forward (after the first exchange:
 * a kernel error, an exchange that was aborted or timed out) has left the
 * others in the middle of that step: its runtime is then out of step for
 * good, every later model_step fails at once (MT_E_DEVICE), and closing it
 * tells no rank anything. A leader (comm_lead, rank 0) ends the job 1 s
 * after such a failure (mt_comm_end_job: the engine's clients get their
 * errors first); a follower's model_runtime_follow returns the error, and
 * the program should exit with it (mpirun then ends the job). */
bool model_runtime_out_of_step(const model_runtime *rt);

/* Ranks other than 0 of a comm_lead runtime: runs an empty step for every
 * step rank 0 runs, until rank 0 closes its runtime (MT_OK) or a collective
 * fails. *steps (may be NULL) counts the steps followed. */
mt_status model_runtime_follow(model_runtime *rt, int64_t *steps, mt_err *err);
/* This rank (0 without a communicator). */
int model_runtime_rank(const model_runtime *rt);

/* Host <-> device copies of the runtime's device since it was opened
 * (calls and bytes each way), and of those the ones the exchanges between
 * ranks made: the leader's step messages (one copy each on every rank:
 * in on rank 0, out on the others; they carry the step's tokens) and the
 * MoE layers' pair counts read back (2 x ranks ints a layer). Everything
 * else is the forward's own: token ids, positions and page tables in,
 * logits out. Exchanged activations never pass through the host. With a
 * vocabulary-parallel embedding the id lists of its exchange go in too
 * (index_calls, index_bytes: two per window of tokens at most, on every
 * rank), and without a data-parallel leader's step message (runtimes
 * without dp) each forward first shares its step with the other ranks:
 * its row counts in (share_to), every rank's counts and token ids out
 * (share_from). */
typedef struct model_copy_counts {
    uint64_t to_calls, to_bytes, from_calls, from_bytes;
    uint64_t announce_calls, announce_bytes;
    uint64_t count_calls, count_bytes;
    uint64_t index_calls, index_bytes;
    uint64_t share_to_calls, share_to_bytes, share_from_calls, share_from_bytes;
} model_copy_counts;
void model_runtime_copy_counts(const model_runtime *rt, model_copy_counts *out);

/* ---- speculative decoding (the MTP layer; see spec.h) ------------------------ */

#define MODEL_SPEC_MAX_STEPS 8

/* Whether the runtime loaded the MTP layer (opts.speculative_steps > 0). */
bool model_runtime_has_mtp(const model_runtime *rt);

/* Keeps the first len tokens of the sequence's KV cache (all layers' latent
 * and indexer-key caches; the MTP layer's cache is cut to len too when it
 * is longer). Pages still shared with other sequences are never written:
 * only the sequence's own references are dropped, and a later write into
 * a shared page copies it. MT_E_INVALID when len exceeds the length. */
mt_status model_seq_truncate(model_runtime *rt, int seq, int64_t len, mt_err *err);

/* Tokens in the sequence's MTP cache (-1 without MTP or sequence). MTP
 * position i holds (token i + 1, hidden state of position i). */
int64_t model_mtp_len(const model_runtime *rt, int seq);

/* Keeps the first len positions of the sequence's MTP cache (drafts'
 * positions are dropped before the next catch-up). */
mt_status model_mtp_truncate(model_runtime *rt, int seq, int64_t len, mt_err *err);

typedef struct model_mtp_item {
    int seq;                 /* sequence whose MTP cache the positions extend */
    const int32_t *tokens;   /* n_tokens ids: for MTP position p the token at p + 1 */
    int n_tokens;
    int hidden_row;          /* row of the previous forward's batch holding position
                              * model_mtp_len's hidden state; n_tokens rows from it */
    float *logits;           /* vocab floats: the draft logits after the last token; may
                              * be NULL */
} model_mtp_item;

/* One batched forward of the MTP layer: per item, positions mtp_len ..
 * mtp_len + n_tokens - 1 of its MTP cache, each from the embedding of the
 * next token and the hidden state of the position (the last layer's
 * output after its final norm) found in row hidden_row + t of the batch of
 * the forward that ran last on this runtime: a model_step (rows are its
 * items' tokens in order) or a model_mtp_step (then the MTP layer's output
 * after shared_head.norm, which is what autoregressive drafting feeds
 * back). No other forward may run in between. Errors as model_step
 * (nothing appended); MT_E_UNSUPPORTED without MTP. With a communicator
 * the ranks keep in step as model_step's do: with comm_lead rank 0 calls
 * it and the followers join (expert-parallel: the MTP layer's exchanges;
 * tensor-parallel: the same step on their mirrored sequences); without a
 * leader every rank calls it as often as the others (zero items: only its
 * share of the MTP layer's experts), and under tp with the same items. */
mt_status model_mtp_step(model_runtime *rt, model_mtp_item *items, int n, mt_err *err);

/* ---- sampling --------------------------------------------------------------- */

/* One entry of OpenAI's logit_bias: added to the token's logit. */
typedef struct model_logit_bias {
    int32_t id;
    float bias;
} model_logit_bias;

/* How the next token is picked. A zeroed sampler is greedy with nothing
 * else on. The logit processing (bias, penalties) is model_sampler_process;
 * temperature, top-k, min-p and top-p are model_sample's. */
typedef struct model_sampler {
    float temperature;  /* 0 = greedy */
    float top_p;        /* 1 (or 0) = off */
    int top_k;          /* 0 = off */
    float min_p;        /* 0 = off: tokens less likely than min_p times the most likely one
                         * (after temperature) are dropped, as vLLM's min_p */
    float presence_penalty;   /* OpenAI's: subtracted once from the logit of every token
                               * generated so far; 0 = off */
    float frequency_penalty;  /* OpenAI's: subtracted once per time the token was generated;
                               * 0 = off */
    float repetition_penalty; /* vLLM's (CTRL's): the logit of a token of the prompt or of
                               * the output is divided by it when positive, multiplied when
                               * not; 0 or 1 = off */
    const model_logit_bias *bias; /* n_bias entries, borrowed; ids outside the vocab are
                                   * ignored */
    int n_bias;
} model_sampler;

/* Picks a token from logits (vocab floats). Greedy (temperature 0 or
 * top_k 1): the largest logit, ties to the lower id. Otherwise logits /
 * temperature; top-k keeps the k largest (ties to the lower id); min-p
 * drops tokens below min_p times the largest probability; top-p keeps the
 * smallest prefix of the rest whose probability reaches p; then one draw
 * over the kept tokens' renormalized probabilities. NaN and -inf logits are
 * never picked unless nothing else is left (then the argmax rule, id 0 for
 * a row of only NaN). Deterministic for a given rng state. */
int32_t model_sample(const float *logits, int32_t vocab, const model_sampler *s,
                     mt_rng *rng);

/* Log probabilities of a step, as the OpenAI API returns them: the
 * log-softmax of logits / temperature (temperature <= 0, greedy, reads as 1;
 * top-k and top-p are not applied), in double precision. Writes the chosen
 * token's value to *chosen_lp and the k (<= vocab) most likely tokens,
 * most likely first, ties to the lower id, to top_ids/top_lps (may be NULL
 * when k is 0). NaN logits count as -inf. O(vocab * k). */
void model_logprobs(const float *logits, int32_t vocab, float temperature, int32_t chosen, int k,
                    float *chosen_lp, int32_t *top_ids, float *top_lps);

/* What the penalties look at: a sequence's prompt tokens and how often each
 * token was generated. Caller storage; init allocates (O(vocab) bytes),
 * release frees; a zeroed one is empty and safe to release. */
typedef struct model_token_counts {
    int32_t vocab;
    uint32_t *count;   /* [vocab]: times generated */
    uint8_t *prompt;   /* [vocab]: 1 when in the prompt */
    int32_t *ids;      /* n_ids distinct ids that were ever counted or in the prompt */
    int32_t n_ids, cap_ids;
} model_token_counts;

/* MT_E_NOMEM or MT_E_INVALID (a prompt id outside [0, vocab)) with nothing
 * allocated. */
mt_status model_token_counts_init(model_token_counts *c, int32_t vocab, const int32_t *prompt,
                                  int64_t n_prompt, mt_err *err);
/* Counts id once more (delta 1) or once less (delta -1: undoes an add, as
 * speculative decoding does for drafts it tried). Ids outside the vocab are
 * ignored. MT_E_NOMEM leaves c as it was. */
mt_status model_token_counts_add(model_token_counts *c, int32_t id, int delta);
void model_token_counts_release(model_token_counts *c);

/* Whether s has a penalty on (model_sampler_process then needs counts). */
bool model_sampler_penalized(const model_sampler *s);

/* The logit processing of s, in place on logits (vocab floats), in this
 * order: the logit bias is added; then for each token the counts know,
 * repetition_penalty (prompt or generated tokens), then frequency_penalty
 * times its count and presence_penalty once (generated tokens). counts may
 * be NULL when no penalty is on. O(n_bias + distinct tokens counted). */
void model_sampler_process(const model_sampler *s, const model_token_counts *counts,
                           float *logits, int32_t vocab);

/* A caller's logit processing before each pick of a sequence's token, as
 * the engine and speculative decoding run it: logits (vocab floats) are
 * changed in place for the position after the generated tokens
 * gen[0..n_gen) followed by extra[0..n_extra) (drafts being verified or
 * drafted before it in the same round; 0 outside speculation). An error
 * ends the pick with it. fn NULL: no processing. */
typedef struct model_logits_proc {
    mt_status (*fn)(void *ctx, const int32_t *gen, int64_t n_gen, const int32_t *extra,
                    int n_extra, float *logits, mt_err *err);
    void *ctx;
} model_logits_proc;

/* End-of-sequence ids of the checkpoint (from config / tokenizer); returns
 * the count written (at most cap). */
int model_runtime_eos(const model_runtime *rt, int32_t *out, int cap);

#endif
