/* spec.h: speculative decoding with the checkpoint's MTP layer on top of
 * the runtime (runtime.h): the acceptance rules and a driver for the
 * rounds of a batch of sequences, as `moetune generate` and the server's
 * engine run them.
 *
 * A round of a sequence whose last token t is not yet in its KV cache and
 * that holds drafts d1..dn (n <= k) from the previous round:
 *   verify: one model_step item [t, d1..dn] with all logits (n + 1 rows);
 *   accept (model_spec_accept): greedy keeps the drafts while each equals
 *   the argmax of the row before it, then the argmax of the next row;
 *   temperature > 0 runs speculative sampling (accept d with probability
 *   min(1, p(d) / q(d)), else draw from norm(max(0, p - q)); all accepted:
 *   one more draw from the last row), so every emitted token has the
 *   distribution model_sample would draw from. The rejected positions are
 *   cut from the KV cache (model_seq_truncate).
 *   draft (model_spec_draft): the MTP layer catches up over the kept
 *   positions with the verify step's hidden states, then runs k - 1 more
 *   single-token steps on its own output; each step's logits give the next
 *   draft (argmax, or a draw from the sampler's distribution q).
 * Prefill chunks join the same draft call (their kept positions are all of
 * them), so the MTP cache always covers what the main cache holds.
 *
 * Ownership: a model_spec_seq is the caller's; init allocates its buffers
 * and release frees them. Not thread-safe (the runtime's thread). */
#ifndef MT_MODEL_SPEC_H
#define MT_MODEL_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/rng.h"
#include "common/status.h"
#include "runtime.h"

/* One sequence's speculative state. */
typedef struct model_spec_seq {
    int seq;                 /* runtime sequence */
    int k;                   /* drafts per round, 0..MODEL_SPEC_MAX_STEPS (0: plain decode) */
    model_sampler sampler;   /* the request's; q and p both come from it */
    mt_rng *rng;             /* draws of drafts, acceptance and residuals */
    /* The caller's logit processing (bias, penalties, a grammar's mask),
     * applied to every row before it is used: a verify row after the drafts
     * accepted before it, a draft row after the drafts before it. gen/n_gen
     * are the tokens generated so far, set by the caller before each
     * model_spec_accept and model_spec_draft (the round's emitted tokens
     * included by the draft). A draft the processing refuses (logit -inf)
     * is never accepted: greedy, it is not the argmax; sampled, p(d) = 0. */
    model_logits_proc proc;
    const int32_t *gen;
    int64_t n_gen;
    int32_t vocab;
    /* Drafts for the next round. */
    int n_draft;
    int32_t draft[MODEL_SPEC_MAX_STEPS];
    double *q;               /* [MODEL_SPEC_MAX_STEPS][vocab] draft distributions (sampled) */
    bool mtp_behind;         /* its MTP cache lost positions: no more drafts */
    /* The verify step's rows and the last round's result. */
    float *logits;           /* [MODEL_SPEC_MAX_STEPS + 1][vocab]: verify logits; row i is what
                              * out[i] was chosen from */
    int32_t out[MODEL_SPEC_MAX_STEPS + 1];
    int n_out;
    /* Totals. */
    int64_t rounds, drafted, accepted;
} model_spec_seq;

mt_status model_spec_seq_init(model_spec_seq *s, int seq, int k, int32_t vocab,
                              const model_sampler *sampler, mt_rng *rng, mt_err *err);
void model_spec_seq_release(model_spec_seq *s);

/* Writes the verify step's tokens [last, drafts...] to buf (room for
 * MODEL_SPEC_MAX_STEPS + 1) and returns their count. */
int model_spec_verify_tokens(const model_spec_seq *s, int32_t last, int32_t *buf);

/* After the verify step (s->logits filled, its n_draft + 1 positions
 * appended at len_before): picks the emitted tokens into out/n_out (the
 * accepted drafts, then one token from the target), counts them and
 * truncates the sequence to len_before + n_out. */
mt_status model_spec_accept(model_runtime *rt, model_spec_seq *s, int64_t len_before,
                            mt_err *err);

/* The MTP catch-up of one sequence after a main step. */
typedef struct model_spec_catchup {
    model_spec_seq *s;
    const int32_t *next;     /* n tokens: the token after each kept position */
    int n;
    int hidden_row;          /* first kept position's row in the main step's batch */
    int64_t start;           /* its position (the MTP cache is cut back to it) */
    bool draft;              /* then propose s->k drafts */
} model_spec_catchup;

/* Runs right after the main model_step whose rows it names: the MTP
 * catch-up of every item, then the draft steps (items with fewer drafts
 * drop out as the others go on). An item whose MTP cache is behind start
 * (it cannot be rebuilt: the hidden states are gone) gets mtp_behind and
 * no drafts from then on. Errors leave every item without drafts. */
mt_status model_spec_draft(model_runtime *rt, model_spec_catchup *items, int n, mt_err *err);

/* ---- one sequence, start to end (`moetune generate`, tests) ---- */

typedef struct model_spec_gen_opts {
    int k;                   /* drafts per round; 0: plain decoding (no MTP calls) */
    int max_tokens;          /* tokens to generate, >= 1 */
    const int32_t *eos;      /* stop ids (the stop token is emitted) */
    int n_eos;
    model_sampler sampler;
    mt_rng *rng;
    int prefill_chunk;       /* prompt tokens per step; 0 = 256 */
    model_logits_proc proc;  /* applied before every pick (plain and speculative); may be
                              * zeroed */
} model_spec_gen_opts;

/* Prefills the prompt into the empty sequence seq and generates into
 * out[max_tokens]; *produced tokens were written. stats (may be NULL)
 * receives the rounds, drafted and accepted counts. With k = 0 the steps
 * are exactly plain decoding's: one token per model_step. */
mt_status model_spec_generate(model_runtime *rt, int seq, const int32_t *prompt, int64_t n,
                              const model_spec_gen_opts *o, int32_t *out, int *produced,
                              model_spec_seq *stats, mt_err *err);

/* ---- the rules (exposed for tests) ---- */

/* The distribution model_sample draws from for these logits: probs[vocab]
 * (zero outside top-k / top-p; greedy: one-hot on the argmax). false when
 * out of memory. */
bool model_sampler_probs(const float *logits, int32_t vocab, const model_sampler *s,
                         double *probs);
/* One draw from probs[vocab] (need not sum to 1; all zero: the argmax id 0). */
int32_t model_sample_probs(const double *probs, int32_t vocab, mt_rng *rng);
/* Speculative sampling at one position: the draft d was drawn from q;
 * accept it with probability min(1, p(d) / q(d)) (*accepted true, returns
 * d), else return a draw from norm(max(0, p - q)). The result is
 * distributed as p. */
int32_t model_spec_resolve(const double *p, const double *q, int32_t vocab, int32_t d,
                           mt_rng *rng, bool *accepted);

#endif
