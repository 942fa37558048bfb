/* serve_metrics.h: the server's Prometheus metrics (text exposition format
 * 0.0.4, served at GET /metrics).
 *
 * Exported (all names start with moetune_):
 *   requests_total{endpoint,outcome}       counter; outcome ok|error|cancelled
 *   prompt_tokens_total, generation_tokens_total              counters
 *   prefix_cache_queries_total, prefix_cache_hits_total       counters (tokens)
 *   prefix_cache_hit_rate                  gauge, hits / queries so far
 *   preemptions_total                      counter (requests sent back to wait)
 *   requests_cancelled_total               counter (client gone; sequence freed)
 *   spec_verify_rounds_total, spec_draft_tokens_total, spec_accepted_tokens_total
 *                                          counters (speculative decoding)
 *   spec_acceptance_rate                   gauge, accepted / drafted so far
 *   spec_mean_accepted_length              gauge, tokens per verify round so far
 *   time_to_first_token_seconds            histogram
 *   inter_token_latency_seconds            histogram
 *   e2e_request_latency_seconds            histogram
 *   batch_size                             histogram, sequences per step
 *   step_tokens                            histogram, tokens per step
 *   requests_running, requests_waiting     gauges
 *   kv_pages_used, kv_pages_total          gauges
 *   prefix_cache_sequences                 gauge, finished sequences retained
 *   kernel_selections{provenance}          gauge, the runtime's selection counts
 *   kernel_misses                          gauge, kernels on the default config
 *   kernel_swaps_total, kernel_swaps_undone_total   counters, live swaps (kset_swap.h)
 *   kernel_selections_swapped              gauge, selections running a swapped-in config
 *   tune_* (only with a live tuner, serve_metrics_tune):
 *   tune_tuned_total, tune_deepened_total, tune_confirmed_total, tune_failed_total
 *                                          counters, (kernel, M) tunes (serve_tune.h)
 *   tune_pending, tune_pending_first       gauges, to tune at the last plan; of them
 *                                          without a first pass
 *   tune_covered, tune_paused              gauges, 0 or 1
 *   tune_busy_seconds_total, tune_compilers_held_seconds_total   counters
 *   tune_measuring_seconds_total, tune_measure_cost_seconds_total,
 *   tune_measure_wait_seconds_total        counters, its measurements: their wall
 *                                          time, what they took of the device
 *                                          (serve_duty.h), waits at the gate
 *   ready                                  gauge, 1 once the model is loaded
 *
 * Thread safety: every call may come from any thread (one mutex inside).
 * Ownership: create/destroy; destroy(NULL) is a no-op. */
#ifndef MT_SERVE_METRICS_H
#define MT_SERVE_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "model/runtime.h"
#include "serve_buf.h"
#include "serve_request.h"

typedef enum serve_outcome {
    SERVE_OUTCOME_OK = 0,
    SERVE_OUTCOME_ERROR = 1,
    SERVE_OUTCOME_CANCELLED = 2,
    SERVE_OUTCOME_COUNT
} serve_outcome;

typedef struct serve_metrics serve_metrics;

enum { SERVE_METRICS_MAX_RANKS = 64 }; /* ranks reported one by one */

/* Scheduler state, written after every engine step. */
typedef struct serve_metrics_state {
    int64_t running, waiting;
    int64_t kv_pages_used, kv_pages_total;
    int64_t cached_sequences;
    /* Data-parallel attention (n_ranks > 1): per rank its sequences, KV
     * pages in use and the token rows its attention ran. */
    int n_ranks;
    int64_t rank_seqs[SERVE_METRICS_MAX_RANKS], rank_pages_used[SERVE_METRICS_MAX_RANKS],
        rank_tokens[SERVE_METRICS_MAX_RANKS];
    /* Filled by serve_metrics_state_get (not set): the prompt tokens admitted
     * and tokens generated so far, which grows whenever the server works. */
    int64_t activity;
} serve_metrics_state;

mt_status serve_metrics_create(serve_metrics **out, mt_err *err);
void serve_metrics_destroy(serve_metrics *m);

void serve_metrics_request(serve_metrics *m, serve_api api, serve_outcome oc);
/* Tokens of one admitted request: its prompt, and how many of them the
 * prefix cache supplied. */
void serve_metrics_prompt(serve_metrics *m, int64_t prompt, int64_t cached);
void serve_metrics_generated(serve_metrics *m, int64_t tokens);
void serve_metrics_preempted(serve_metrics *m);
/* A request whose client went away, freed by the engine (waiting or running). */
void serve_metrics_cancelled(serve_metrics *m);
/* One speculative verify round of a request: drafts verified, accepted. */
void serve_metrics_spec(serve_metrics *m, int64_t drafted, int64_t accepted);
void serve_metrics_ttft(serve_metrics *m, double seconds);
void serve_metrics_itl(serve_metrics *m, double seconds);
void serve_metrics_e2e(serve_metrics *m, double seconds);
void serve_metrics_step(serve_metrics *m, int sequences, int tokens);
void serve_metrics_state_set(serve_metrics *m, const serve_metrics_state *s);
void serve_metrics_selection(serve_metrics *m, const model_selection_counts *c);
void serve_metrics_ready(serve_metrics *m, bool ready);

/* A live tuner's progress (serve_tune.h pushes it after each plan, tune
 * and pause); rendered once set. */
typedef struct serve_metrics_tune_state {
    int64_t tuned, deepened, confirmed, failed;
    int64_t pending, pending_first;
    bool covered, paused;
    double busy_s, held_s;
    double measured_s, measure_cost_s, gated_s;
} serve_metrics_tune_state;
void serve_metrics_tune(serve_metrics *m, const serve_metrics_tune_state *t);

/* A copy of the current gauges (for tests and the scheduler's own logs). */
void serve_metrics_state_get(serve_metrics *m, serve_metrics_state *out);

/* Appends the exposition text to out. */
mt_status serve_metrics_render(serve_metrics *m, serve_buf *out);

#endif
