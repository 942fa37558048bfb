/* serve_sched.h: the scheduler's policy, apart from the runtime so it can be
 * tested on its own: which running requests go into the next forward step
 * with how many tokens, whether a waiting request may be admitted, and whom
 * to preempt when the KV pool runs dry.
 *
 * Policy (continuous batching with chunked prefill, as vLLM and sglang do):
 *   - every running request that is decoding (one token to feed) is in the
 *     step, oldest first, up to the token budget;
 *   - the budget left goes to prefill chunks of the running requests still
 *     reading their prompt, oldest first, each chunk cut to the budget and to
 *     the KV pages free after the decodes;
 *   - when the decodes alone need more pages than are free, the plan reports
 *     the shortfall: the engine then evicts prefix-cache sequences, and when
 *     none are left preempts the youngest running request
 *     (serve_sched_victim) and plans again;
 *   - a waiting request is admitted (first come, first served: the head of
 *     the queue only) while fewer than max_batch run and its prompt's pages
 *     fit in the free pages after what the running requests still need for
 *     their prompts, one page of decode headroom each, and a watermark.
 * Page counts follow runtime.h: growing a sequence of len tokens by n takes
 * ceil((len + n) / page) - ceil(len / page) pages.
 *
 * Pure functions over caller arrays; thread-safe. */
#ifndef MT_SERVE_SCHED_H
#define MT_SERVE_SCHED_H

#include <stdbool.h>
#include <stdint.h>

typedef struct serve_sched_cfg {
    int token_budget;  /* tokens per step over all items (the runtime's max) */
    int max_batch;     /* running requests at most */
    int page_size;     /* tokens per KV page */
    int64_t watermark; /* pages kept free at admission */
} serve_sched_cfg;

/* A running request as the policy sees it. */
typedef struct serve_sched_req {
    int64_t len;  /* tokens with KV computed (the sequence's length) */
    int64_t todo; /* tokens to feed before the next sample (>= 1; 1 = decoding) */
} serve_sched_req;

typedef struct serve_sched_plan {
    int items;          /* requests with a chunk */
    int tokens;         /* tokens over all chunks */
    int64_t pages;      /* KV pages the step allocates */
    int64_t short_pages; /* pages the decodes lack (0 when all fit) */
} serve_sched_plan;

/* Pages to grow a sequence of len tokens by n. */
int64_t serve_sched_pages(int page_size, int64_t len, int64_t n);

/* Plans one step for reqs[0..n) (admission order) with free_pages in the
 * pool: chunk[i] tokens for request i (0 = not in this step). */
serve_sched_plan serve_sched_step(const serve_sched_cfg *c, const serve_sched_req *reqs, int n,
                                  int64_t free_pages, int *chunk);

/* Pages the running requests still need for their prompts, plus one page of
 * decode headroom each. */
int64_t serve_sched_reserved(const serve_sched_cfg *c, const serve_sched_req *reqs, int n);

/* Whether a request needing need_pages for its prompt may start now. */
bool serve_sched_can_admit(const serve_sched_cfg *c, int n_running, int64_t free_pages,
                           int64_t reserved, int64_t need_pages);

/* The request to preempt: the youngest (last admitted); -1 when n <= 1
 * (the oldest request is never preempted, so it always finishes). */
int serve_sched_victim(int n);

#endif
