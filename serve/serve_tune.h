/* serve_tune.h: the server's background tuner (`moetune serve
 * --tune-misses`): it tunes, while the server serves, the kernels the
 * runtime runs without a tuned config, costliest first, and hands each
 * confirmed winner to the serving kernel set as a live swap (kset_swap.h).
 *
 * What it tunes: every (family, tuning key, M bucket) of the kernel set
 * that the load has called (the set's own per-call counters) and that has
 * no exact tuned config: the misses the set recorded in the database when
 * it loaded (default configs), and the nearest-bucket, other-device, stale
 * and rejected selections. Order: the serving time each has cost so far
 * (calls x the time each call took, summed over the kernels that share the
 * key), costliest first, planned again after each one (the load goes on).
 * Families without parameters are left out (nothing to choose).
 *
 * Coverage first: a first pass tunes every (family, key, M) the load has
 * called with a few trials (at most first_trials: the default and the
 * winners of the kernel's other tuned M alone, nearest first, so nothing
 * new is compiled, the default alone when they are its own; with no M of
 * it taken up yet (or none of their winners valid here), the default and the
 * search's first picks, half of first_trials when that is more than 3;
 * tune_opts.seeds_only), each timed lightly (100 ms or 50 repetitions a
 * trial, 5 paired rounds), costliest first;
 * once none waits for its first pass (covered), a second pass resumes the
 * costliest ones' searches up to the whole budget (the trials already in
 * the database count toward it). A new bucket the load calls goes ahead of
 * the second pass.
 *
 * How: one tune_run per (family, key, M) and pass with the default
 * strategy, the pass's budget and the paired confirmation, on the server's own device
 * spec (so the winner is this device's), written to the server's database:
 * every candidate runs in a worker process, verified against the family's
 * reference, so a candidate that crashes, hangs or computes a wrong answer
 * is a recorded trial, never a config of the serving process. A winner
 * confirmed faster than the default is compiled on this thread and posted
 * to the kernel set (model_kset_swap_post); the serving thread swaps it in
 * between steps. A swap the set undoes (slower in its own timings) is
 * marked stale in the database (db_winner_verify) and not tuned again.
 *
 * Its share of the device (serve_tune_opts.share): its threads (compiles)
 * are at most share x the cores (at least one), and it runs at the lowest
 * priority: the tuner thread, its compiler processes and its measurement
 * workers at nice 19, below the serving threads. A measurement starts only
 * while fewer than queue_max requests wait for a slot (the engine's
 * requests_waiting gauge), else it waits (tune_opts.gate). The workers are
 * in Linux's SCHED_IDLE class (tune_spawner_open), so a serving thread that
 * wakes up takes its core at once. Its compilers run only while no request
 * waits or runs (unless compile_busy): they are held stopped while one does
 * (dev_set_tool_hold), since a compiler evicts what the serving threads
 * keep in the caches even at the lowest priority, but for share of the
 * time (serve_hold.h), so a server that is never idle is tuned too. Its
 * measurements take share of a busy server's device too (unless
 * measure_busy): each starts a cycle of its cost over the share, the rest
 * of which it rests while requests run (serve_duty.h), since even
 * a SCHED_IDLE worker raises the serving threads' latency. The workers time
 * kernels with the server's thread count: that is the device the winners
 * are for.
 *
 * Ownership and threads: serve_tune_create forks the tuner's worker spawner
 * (tune_spawner_open) and must be called before the process starts any
 * thread; serve_tune_start starts the tuner thread on a kernel set another
 * thread serves (live swaps enabled, model_kset_swap_apply between steps)
 * and must outlive the tuner; destroy stops the thread (a tune in flight
 * stops at its next candidate, the database stays consistent), then closes
 * the spawner. destroy(NULL) is a no-op. serve_tune_stats may be called
 * from any thread. With metrics, the tuner pushes its stats to them after
 * each plan, tune and pause (serve_metrics_tune: /metrics' moetune_tune_*). */
#ifndef MT_SERVE_TUNE_H
#define MT_SERVE_TUNE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/kset.h"
#include "serve_metrics.h"
#include "tuner/tuner.h"

typedef struct serve_tune_opts {
    const char *db_path;   /* the server's tuning database (required) */
    double share;          /* of the device, (0, 1]; 0: 0.10 */
    tune_budget budget;    /* per (kernel, M); all zero: 15% of its space */
    int queue_max;         /* measure only while fewer requests wait; 0: 1 */
    int confirm_rounds;    /* paired rounds of the confirmation; 0: tune's default (10),
                              5 in a first pass */
    double timeout_s;      /* per candidate in the worker; 0: 30 */
    double warmup_s;       /* serving time before the first plan; 0: 2; < 0: none */
    int max_items;         /* tunes to run at most; 0: no limit */
    int first_trials;      /* the first pass's trials per (kernel, M); 0: 8; < 0: one
                              pass, the whole budget */
    bool compile_busy;     /* compile candidates while requests run too (default: the
                              compilers are held stopped while any request waits or
                              runs, dev_set_tool_hold) */
    bool measure_busy;     /* measure back to back while requests run too (default:
                              share of a busy server's device, serve_duty.h) */
    int cold_timing;       /* > 0: flush the caches between timed runs, as `tune` does;
                              0 (default): time warm, as the server runs its kernels:
                              a flush evicts the serving threads' working set too */
    FILE *log;             /* the plan, one line per item and per swap; NULL: silent */
} serve_tune_opts;

typedef struct serve_tune serve_tune;

typedef struct serve_tune_stats {
    int64_t tuned;         /* (kernel, M) tuned: a winner decided in the database */
    int64_t deepened;      /* of them, searched again to the whole budget */
    int64_t confirmed;     /* tunes (either pass) that confirmed a config faster than the
                              default */
    int64_t posted;        /* winners posted to the kernel set as swaps */
    int64_t failed;        /* tunes that ended in an error (logged) */
    int64_t marked_stale;  /* swaps undone by the set, marked stale in the database */
    int64_t pending;       /* (kernel, M) called and still to tune at the last plan */
    int64_t pending_first; /* of them, still without a first pass */
    bool covered;          /* none without a first pass at the last plan (after one tune) */
    double covered_s;      /* seconds from the start to the last time it became covered */
    double busy_s;         /* time spent in tune runs */
    double held_s;         /* time its compilers were held stopped while serving */
    double measured_s;     /* time from each measurement's gate to the worker's reply */
    double measure_cost_s; /* what they took of the device (serve_duty.h) */
    double gated_s;        /* time measurements waited at the gate (queue, duty cycle) */
    bool idle;             /* no item in flight and none to tune at the last plan */
    bool paused;           /* serve_tune_pause */
    int64_t pauses;        /* times paused */
    double paused_s;       /* time paused, the pause in progress included */
} serve_tune_stats;

/* The tune job of kernel k at bucket M m: its family at its own shape,
 * runtime dims included (the representative ones the kernel set runs; a
 * tuning key alone would take them from the family's first preset, as
 * GLM-5.2's vocabulary for a tiny model's embedding). */
mt_status serve_tune_job(const model_kern *k, int64_t m, tune_job *out, mt_err *err);

/* Creates the database when it does not exist (so a server can start on
 * an empty one) and forks the worker spawner (see above: before any
 * thread). MT_E_INVALID without a database path or for a share outside
 * (0, 1]; the database's errors. */
mt_status serve_tune_create(const serve_tune_opts *o, serve_tune **out, mt_err *err);
/* Starts the tuner thread on ks; metrics (may be NULL: no queue gate)
 * gives the queue length. Once per tuner. */
mt_status serve_tune_start(serve_tune *t, model_kset *ks, serve_metrics *metrics, mt_err *err);
/* Pauses (or resumes) the tuner from any thread: while paused no item is
 * planned, no candidate is measured (a measurement in flight finishes)
 * and its compilers are held stopped (dev_set_tool_hold), so the server
 * runs as it would without --tune-misses; `serve` maps SIGUSR1 and
 * SIGUSR2 to it. Pausing twice is one pause. */
void serve_tune_pause(serve_tune *t, bool pause);
void serve_tune_stats_get(serve_tune *t, serve_tune_stats *out);
void serve_tune_destroy(serve_tune *t);

#endif
