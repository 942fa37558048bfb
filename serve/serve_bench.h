/* serve_bench.h: the load generator behind `moetune bench-serve`: the
 * WORKLOAD.md measurement against a running OpenAI-compatible server.
 *
 * For each rate, requests arrive as a Poisson process (exponential gaps,
 * seeded) for duration_s seconds; each is a streaming /v1/completions with a
 * token-id prompt of input_len tokens, max_tokens output_len and ignore_eos,
 * so every request generates exactly output_len tokens. The first
 * round(cache_hit * input_len) prompt tokens are one prefix shared by every
 * request (sent once before each rate to warm the cache), the rest random
 * per request. Each request is timed from its send: TTFT to the first event
 * carrying a token, inter-token latency between token-carrying events.
 * After the last arrival the rate waits for its requests (each bounded by
 * timeout_s) and checks /health.
 *
 * A row reports requests sent and succeeded (HTTP 200, a complete stream
 * ending in [DONE], output_len tokens), req/s and output tok/s over the span
 * from the rate's start to the end of its arrival window or the last
 * completion, whichever is later, TTFT and ITL p50/p95 over the
 * successful requests, and the prefix-cache hit the server reported. The
 * knee is the highest rate whose TTFT p95 is within the limit with every
 * request succeeding.
 *
 * Thread safety: serve_bench_run uses its own threads; one call at a time
 * per opts. */
#ifndef MT_SERVE_BENCH_H
#define MT_SERVE_BENCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

typedef struct serve_bench_opts {
    const char *url;       /* http://127.0.0.1:PORT */
    int input_len, output_len;
    double cache_hit;      /* [0, 1) */
    const double *rates;   /* requests per second, > 0 */
    int n_rates;
    /* Closed loop instead of rates (n_conc > 0, n_rates 0): for each value
     * C, C clients each send a request when their previous one ended, for
     * duration_s (at least one request each), after one unmeasured warm-up
     * request; tok/s is over the span to the last answer. concurrency 1 is
     * the single-stream speed. */
    const int *concurrency;
    int n_conc;
    double duration_s;     /* arrivals per rate; default 30 */
    double ttft_limit_s;   /* default 5 */
    double timeout_s;      /* per request; default 300 */
    int32_t token_lo, token_hi; /* random prompt ids in [lo, hi); default [16, 256) */
    uint64_t seed;         /* 0 = fresh */
    FILE *progress;        /* a line per rate; may be NULL */
} serve_bench_opts;

typedef struct serve_bench_row {
    double rate;           /* rate mode: the arrival rate; closed loop: requests sent / s */
    int concurrency;       /* closed loop: clients; 0 in rate mode */
    int sent, ok;
    double elapsed_s;
    double req_s, tok_s;
    double ttft_p50, ttft_p95; /* seconds; NAN without a success */
    double itl_p50, itl_p95;
    double success_pct;
    double cache_hit;      /* cached / prompt tokens, as the server reported */
    bool server_up;        /* /health answered 200 after the rate */
    char first_error[160]; /* the first failure's reason, "" when none */
} serve_bench_row;

/* Runs every rate (or concurrency) in order into rows[0..n_rates or
 * n_conc). Fails (MT_E_INVALID) on bad options or an unparsable URL, MT_E_IO
 * when the server does not answer /health before the first rate;
 * per-request failures are counted, not returned. */
mt_status serve_bench_run(const serve_bench_opts *o, serve_bench_row *rows, mt_err *err);

/* Index of the knee row, or -1 when no rate qualifies. */
int serve_bench_knee(const serve_bench_row *rows, int n, double ttft_limit_s);

/* Prints the table (WORKLOAD.md's columns plus ITL) and the knee. */
void serve_bench_print(FILE *f, const serve_bench_opts *o, const serve_bench_row *rows, int n);

/* Token arrivals of one streamed request as its client saw them. Several
 * tokens can arrive in one event (the server's stream thread ran late, or
 * the reads joined): the first of them is timed from the previous arrival,
 * the others arrived with it (0 s), so every token after the request's first
 * has an ITL sample. The caller sets t_send and frees itl. */
typedef struct serve_bench_arrivals {
    uint64_t t_send;   /* ns, when the request went out */
    uint64_t t_last;   /* ns, the latest arrival */
    int tokens;        /* tokens so far */
    double ttft;       /* s, from t_send to the first token */
    double *itl;       /* s, n_itl == tokens - 1 once tokens > 0; owned */
    size_t n_itl, cap_itl;
} serve_bench_arrivals;

/* Counts k > 0 tokens arriving together at now (ns). false when out of
 * memory (the counts are then unchanged). */
bool serve_bench_arrive(serve_bench_arrivals *a, int k, uint64_t now);

/* The p-th percentile (0..100) of v[0..n) by linear interpolation between
 * order statistics; sorts v; NAN when n == 0. */
double serve_percentile(double *v, size_t n, double p);

#endif
