/* serve_engine.h: the scheduler thread that owns the model runtime.
 *
 * serve_engine_start returns at once; the engine thread then opens the
 * runtime (the server answers 503 until it is ready) and runs the loop:
 * take submitted requests, drop cancelled ones, admit waiting requests
 * (prefix-cache match and fork, KV-page admission control, LRU eviction of
 * retained sequences when pages or sequence slots run short), plan a step
 * with serve_sched (decodes plus chunked prefill under the token budget),
 * run it, sample, publish tokens and wake the requests' threads. When the
 * decodes lack KV pages it evicts cached sequences, then preempts the
 * youngest running request (its KV is freed; it waits again and recomputes
 * its prompt and the tokens it already generated, which stay published).
 *
 * A request (serve_gen) is shared by the HTTP thread that submitted it and
 * the engine; each holds a reference and the last release frees it.
 * Tokens are published in order and never change once published.
 *
 * Finished requests keep their sequence in the prefix cache (pages shared
 * with later requests that start with the same blocks); a cancelled request
 * (the client went away) frees its sequence at once.
 *
 * Thread safety: serve_engine_* and serve_gen_* may be called from any
 * thread; the runtime is touched only by the engine thread. */
#ifndef MT_SERVE_ENGINE_H
#define MT_SERVE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "model/runtime.h"
#include "serve_error.h"
#include "serve_metrics.h"

typedef struct serve_engine serve_engine;
typedef struct serve_gen serve_gen;

/* Test-only: called on the engine thread before each token is sampled, with
 * the request's prompt and generated tokens (tokens[0..n_prompt+n_generated));
 * a return value in [0, vocab) is taken as the token instead of a sample
 * (its logprobs are still those of the logits) unless the request's logit
 * processing refused it (its logit -inf: then it samples), anything else
 * samples as usual. Lets a test script the model's output token by token. */
typedef int32_t (*serve_sample_hook)(void *ctx, const int32_t *tokens, int64_t n_prompt,
                                     int64_t n_generated);

typedef struct serve_engine_opts {
    model_runtime_opts rt; /* strings are copied */
    serve_sample_hook sample_hook; /* test-only; NULL in production */
    void *sample_hook_ctx;
    int max_batch;         /* running requests at most; 0 = 64 */
    int max_cached;        /* finished sequences retained for prefix reuse; 0 = 64, -1 = none */
    /* Speculative decoding: rt.speculative_steps > 0 drafts that many tokens
     * per request and step with the MTP layer (off while sample_hook is set). */
    serve_metrics *metrics; /* borrowed; may be NULL */
    /* Live swaps (model/kset_swap.h): per-call kernel timing on, and
     * configs other threads post to the kernel set (serve_tune.h) swapped in
     * between steps, counted in /metrics and in the report printed when the
     * engine stops. A batch-invariant runtime refuses them (said at load). */
    bool live_swaps;
} serve_engine_opts;

/* Facts about the loaded model, valid once the engine is ready. */
typedef struct serve_model_info {
    int32_t vocab;
    int64_t max_context;
    const model_tokenizer *tok; /* NULL when the checkpoint has none */
    int32_t eos[MODEL_MAX_EOS];
    int n_eos;
    int32_t chat_stop[3];
    int n_chat_stop;
    int page_size;
    int64_t kv_pages_total;
    int max_batch;
    int token_budget;
} serve_model_info;

typedef enum serve_engine_state {
    SERVE_ENGINE_LOADING = 0,
    SERVE_ENGINE_READY = 1,
    SERVE_ENGINE_FAILED = 2,
    SERVE_ENGINE_STOPPED = 3,
} serve_engine_state;

mt_status serve_engine_start(const serve_engine_opts *o, serve_engine **out, mt_err *err);
/* Stops the thread: requests still waiting or running end with a 503
 * error, cached sequences are freed and the runtime is closed. The engine
 * stays valid (submit answers 503) until destroyed. Idempotent. */
void serve_engine_stop(serve_engine *e);
/* Stops (if needed) and frees the engine. No thread may call serve_engine_*
 * on it afterwards; serve_gen references still held stay valid (they are
 * finished and no longer touch the engine). NULL is a no-op. */
void serve_engine_destroy(serve_engine *e);

/* The state; when FAILED, err (may be NULL) gets the load error. */
serve_engine_state serve_engine_state_get(serve_engine *e, mt_err *err);
/* Blocks until the engine is READY (MT_OK), FAILED (the load error) or
 * timeout_s passes (MT_E_TIMEOUT). */
mt_status serve_engine_wait_ready(serve_engine *e, double timeout_s, mt_err *err);
/* Valid once READY; immutable afterwards. */
const serve_model_info *serve_engine_info(const serve_engine *e);
/* The runtime's kernel set, once READY until the engine stops; only its
 * thread-safe calls (kset_swap.h) may be made from other threads. */
model_kset *serve_engine_kernels(serve_engine *e);

struct serve_logits;

typedef struct serve_gen_params {
    const int32_t *prompt; /* copied */
    int64_t n_prompt;
    int64_t max_tokens;    /* >= 1 */
    model_sampler sampler; /* its logit bias is copied; its penalties count the prompt and the
                            * generated tokens */
    /* The request's token constraints (serve_logits.h), applied after the
     * sampler's logit processing before every pick (plain, scripted by the
     * hook, and speculative: drafts included); may be NULL. The engine takes
     * it over when submit succeeds (and destroys it with the request). */
    struct serve_logits *logits;
    bool has_seed;
    uint64_t seed;
    bool ignore_eos;
    /* Speculative decoding: drafts per step for this request, at most the
     * server's (rt.speculative_steps); spec_set false takes the server's. */
    bool spec_set;
    int spec_steps;
    bool chat;             /* also stop at the chat format's end-of-turn tokens */
    bool logprobs;         /* keep each generated token's log probability */
    int top_logprobs;      /* and the top this many (0..20) */
    /* n > 1: a request with the same prompt submitted just before (held by
     * reference). This one waits until that one has computed its prompt and
     * forks its KV there, so the prompt is computed once for all choices. */
    serve_gen *follow;
    /* n > 1, on the first choice: how many choices will follow it (each
     * submitted next with .follow = it and the same prompt). It is not
     * admitted until they all are queued (or it is cancelled), so no
     * follower comes too late to fork its prompt. */
    int n_followers;
} serve_gen_params;

/* Queues a generation. Rejects (4xx in e) a request that could never run:
 * prompt plus max_tokens past the context or past the whole KV pool; 503
 * while loading or stopping. On success *out holds the caller's reference. */
mt_status serve_engine_submit(serve_engine *e, const serve_gen_params *p, serve_gen **out,
                              serve_error *err);

typedef enum serve_finish {
    SERVE_FINISH_NONE = 0,      /* still running */
    SERVE_FINISH_STOP = 1,      /* end-of-sequence token (or the caller's stop) */
    SERVE_FINISH_LENGTH = 2,    /* max_tokens reached */
    SERVE_FINISH_ERROR = 3,     /* see the error */
    SERVE_FINISH_CANCELLED = 4, /* cancelled by the caller */
} serve_finish;

/* What a request's thread sees. tokens[0..n_generated) stay valid until
 * the release. */
typedef struct serve_gen_view {
    const int32_t *tokens; /* generated tokens */
    int64_t n_generated;
    int64_t n_prompt;
    int64_t n_cached;      /* prompt tokens the prefix cache supplied */
    bool admitted;         /* n_cached is known */
    serve_finish finish;   /* NONE while running */
    serve_error error;     /* when finish is ERROR */
    double ttft_s;         /* arrival to first token; < 0 before it */
    /* With logprobs: per generated token its log probability after
     * temperature, and n_top (token, log probability) pairs, most likely
     * first, at top_ids/top_logprobs[i * n_top ...]. NULL otherwise. */
    const float *logprobs;
    const int32_t *top_ids;
    const float *top_logprobs;
    int n_top;
    /* Speculative decoding (0 when off): verify rounds, drafts proposed,
     * drafts accepted. */
    int64_t spec_rounds, spec_drafted, spec_accepted;
} serve_gen_view;

/* Waits until more than `seen` tokens are published, the request finishes,
 * or timeout_s passes, then fills *v (in every case). */
void serve_gen_wait(serve_gen *g, int64_t seen, double timeout_s, serve_gen_view *v);
/* Ends the request. free_kv: the client went away, free its sequence now;
 * otherwise (a stop string matched) it finishes and its KV is retained
 * like any finished request's. Idempotent; no-op once finished. */
void serve_gen_cancel(serve_gen *g, bool free_kv);
/* Drops the caller's reference. */
void serve_gen_release(serve_gen *g);

#endif
