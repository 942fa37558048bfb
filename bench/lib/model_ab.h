/* model_ab.h: is one kernel selection of the model faster than another?
 * Two runtimes of the same checkpoint (e.g. the tuned database against the
 * default configs) run the same prompt, then the same decode steps, in
 * paired rounds: each round times both back to back, alternating which
 * goes first, so drift and load from elsewhere hit both alike. The ratios
 * of the paired times give an interval (tuner.h: tune_ratio_interval, the
 * geometric mean with a percentile bootstrap), reported as speed ratios
 * b / a with their interval.
 *
 * Ownership: the runtimes are the caller's; each round uses a fresh
 * sequence on each and frees it. Not thread-safe (runtime.h). */
#ifndef MT_BENCH_MODEL_AB_H
#define MT_BENCH_MODEL_AB_H

#include "model/runtime.h"
#include "tuner/tuner.h"

typedef struct model_ab_opts {
    int rounds;       /* paired rounds, 2..TUNE_CONFIRM_MAX_ROUNDS (default 10) */
    double level;     /* interval confidence (default 0.95) */
    uint64_t seed;    /* bootstrap seed */
} model_ab_opts;

typedef struct model_ab_phase {
    double a_tps, b_tps;     /* median tokens/s over the rounds */
    double speedup;          /* b over a: geometric mean of a_time / b_time */
    double lo, hi;           /* its interval */
    bool b_faster, b_slower; /* the interval excludes 1 on one side */
} model_ab_phase;

typedef struct model_ab_result {
    int rounds;
    double level;
    model_ab_phase prefill, decode;
} model_ab_result;

/* Times n_prompt tokens of tok in one step, then n_dec single-token steps
 * (tokens from tok, cycled), on a and on b, in o->rounds paired rounds
 * after one warm-up round each. o may be NULL (defaults). Errors: a
 * runtime's step error, MT_E_INVALID for bad sizes. */
mt_status model_ab_compare(model_runtime *a, model_runtime *b, const int32_t *tok, int n_prompt,
                           int n_dec, const model_ab_opts *o, model_ab_result *out, mt_err *err);

/* "1.04x [0.98, 1.10] (not different at 95%)" */
void model_ab_phase_text(const model_ab_phase *p, double level, char *buf, size_t cap);

#endif
