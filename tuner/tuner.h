/* tuner.h: the autotuner behind `moetune tune`.
 *
 * For each job (a kernel family, a shape and a list of token counts M) the
 * tuner enumerates the valid configurations, lets a strategy pick and order
 * them, compiles them on a pool of threads and hands each compiled candidate
 * to ONE measurement worker: a child process that owns the device, runs the
 * candidate on fresh random inputs with poisoned outputs, verifies it against
 * the family's C reference and times it (kern_problem_time: warm-up, cache
 * flush larger than the LLC, events, adaptive repetitions). A worker that
 * crashes or runs past the per-candidate timeout is killed and replaced; the
 * candidate is recorded as crash or timeout. Every outcome is stored in the
 * database as a trial right away, so an interrupted run loses at most the
 * candidate in flight and the next run resumes (trials already recorded for
 * this device, kernel source hash, shape, M and config are not measured
 * again). At the end of each M the winner is recomputed in the database and
 * checked for determinism (two runs, identical output bytes, or flagged).
 *
 * Workers are forked (no exec) from a helper process that the tuner forks
 * before it opens any device or starts any thread, so test-only families
 * compiled into a test binary run in workers too, and a GPU runtime
 * initialised in the tuner never leaks into a worker.
 *
 * Thread safety: tune_run uses threads internally; one tune_run per process
 * at a time (it forks). Everything else here is plain and reentrant.
 * Signals: the library installs no handlers. The caller passes a flag
 * (opts.stop) that its own SIGINT handler sets; the tuner then stops at the
 * next candidate boundary, kills the worker, marks the session interrupted
 * and returns MT_E_INTERRUPTED with the database consistent. Workers ignore
 * SIGINT (a terminal's Ctrl-C reaches the whole process group). */
#ifndef MT_TUNER_H
#define MT_TUNER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "db/db.h"
#include "kernels/core/runner.h"

#define TUNE_MAX_M 64
#define TUNE_MAX_JOBS 128

/* The default M list of `moetune tune`. */
extern const int64_t tune_default_ms[];
extern const int tune_default_n_ms;

typedef enum tune_strategy {
    TUNE_EXHAUSTIVE = 0, /* every valid config (or the budget's first ones) */
    TUNE_RANDOM = 1,     /* uniformly random order within the budget */
    TUNE_EVOLVE = 2,     /* mutate the best configs to neighbouring values */
    TUNE_MODEL = 3,      /* a random-forest surrogate fitted to the trials so
                            far proposes by expected improvement */
    TUNE_STRATEGY_COUNT
} tune_strategy;

const char *tune_strategy_name(tune_strategy s); /* "exhaustive", ... */
bool tune_strategy_parse(const char *s, tune_strategy *out);

/* A budget: trials per M (count) and/or wall time for the whole run,
 * shared out over the remaining (job, M) pairs. 0 = unlimited. A count
 * budget counts trials already in the database for that M, so rerunning a
 * finished command measures nothing. */
typedef struct tune_budget {
    int64_t trials;
    double seconds;
    double space_fraction; /* "15%": that share of each M's valid space (trials, rounded up) */
} tune_budget;

/* "2000" (trials per M), "30m", "90s", "1.5h" (whole-run wall time). */
mt_status tune_budget_parse(const char *text, tune_budget *out, mt_err *err);
void tune_budget_text(const tune_budget *b, char *out, size_t cap);

/* "I/N" with 1 <= I <= N. */
mt_status tune_shard_parse(const char *text, int *index, int *count, mt_err *err);

/* Shard of a config key: a stable hash (FNV-1a 64) mod count, 0-based.
 * Shard I/N (1-based I) owns the configs with tune_shard_of == I-1. */
int tune_shard_of(const char *config_key, int count);

/* One thing to tune: a family, a shape and the Ms. */
typedef struct tune_job {
    const kern_family *fam;
    kern_shape shape;
    int n_m;
    int64_t m[TUNE_MAX_M];
} tune_job;

/* Builds a job from a family and a shape key or preset name; ms NULL or
 * n_m 0 takes the default list (or the M given in the key, "M=16"). */
mt_status tune_job_make(const kern_family *f, const char *shape_text, const int64_t *ms,
                        int n_m, tune_job *out, mt_err *err);

typedef struct tune_opts {
    const char *device;      /* device spec ("cpu", "emu", "hip"); NULL: "auto" */
    const char *arch;        /* GPU arch for compile-only; NULL: the device's */
    const char *db_path;     /* required */
    tune_strategy strategy;
    tune_budget budget;
    int jobs;                /* compile threads; 0: 2 */
    bool compile_only;       /* also forced by a compile-only device */
    int shard_index, shard_count; /* 1-based; count <= 1: no sharding */
    uint64_t seed;           /* search order; 0: derived from the job (stable) */
    uint64_t data_seed;      /* verification inputs; 0: fresh each run */
    double timeout_s;        /* per candidate in the worker; 0: 60 */
    kern_time_opts timing;   /* the runner's options; abandon_ms is set by
                                the tuner (2x the best so far) */
    bool transfer;           /* seed each M from winners of neighbouring M */
    bool seeds_only;         /* with transfer: an M to which the winners of
                                other tuned M apply (valid here) measures the
                                default and those winners alone (every tuned
                                M's, nearest first, up to the budget), no
                                fresh picks: nothing new to compile when they
                                are in the compile cache, and the default
                                alone when they are this M's default. An M no
                                winner applies to searches as usual. The live
                                tuner's first pass after a kernel's first M. */
    int confirm_rounds;      /* paired rounds confirming a non-default best
                                against the default (see tune_m); 0: 10,
                                < 0: no confirmation (the lowest median wins,
                                recorded as unconfirmed) */
    double confidence;       /* of the confirmation interval; 0: 0.95 */
    int confirm_top;         /* challengers timed in the same paired rounds:
                                the search's best configs by median that beat
                                the default's median, up to this many; 0: 3,
                                at most TUNE_CONFIRM_MAX_TOP (see tune_m) */
    bool default_only;       /* time each M's default config alone (when no
                                trial of it is known) and decide nothing: no
                                winner is written (tune --misses orders its
                                work by these times) */
    int64_t session_id;      /* > 0: record the trials under this session of
                                db_path, which the caller began
                                (db_session_begin) and ends; 0: the run
                                begins a session of its own and ends it */
    struct tune_spawner *spawner; /* the worker spawner to use, started by the caller
                                with tune_spawner_open while it had no thread (a
                                server tuning in the background); NULL: tune_run
                                forks its own */
    /* Called before each measurement in the worker (candidate, paired
     * rounds, determinism): returns when the worker may run, or false to
     * stop the run as interrupted. Lets a caller run measurements only
     * while its own work allows (a server's step queue). NULL: always. */
    bool (*gate)(void *ctx);
    /* Called when the worker has returned from the measurement the gate let
     * through (or failed to start for it), with the CPU time the worker's
     * threads ran since the gate in ms (< 0: not known), so a caller can
     * bound what measuring costs it (a server's duty cycle). NULL: none. */
    void (*gate_done)(void *ctx, double cpu_ms);
    void *gate_ctx;
    volatile sig_atomic_t *stop; /* set (by a signal handler) to stop; may be NULL */
    FILE *log;               /* progress and log lines; NULL: silent */
    bool tty;                /* log is a terminal: one line rewritten in place */
    int argc;                /* command line, recorded with the session */
    char *const *argv;
} tune_opts;

/* Fills defaults: device "auto", exhaustive, jobs 2, timeout 60 s,
 * transfer on, default timing. */
void tune_opts_default(tune_opts *o);

/* Outcome of one M of one job. Counts are trials recorded by this run. */
typedef struct tune_m_report {
    int64_t m;
    int space;                 /* valid configs in this run's part of the space */
    int planned;               /* candidates the strategy proposed */
    int resumed;               /* already in the database: not measured */
    int measured;              /* new trials recorded (any status) */
    int counts[DB_TRIAL_STATUS_COUNT]; /* new trials by status */
    bool has_winner;
    char best_key[256];
    double best_ms;
    double gflops, gbps;       /* of the winner, from the family's cost */
    bool has_default;
    char default_key[256];
    double default_ms;
    int deterministic;         /* winner re-run bit-identical: 1, differs: 0,
                                  not checked (nothing new measured): -1 */
    db_decision decision;      /* how the winner was decided */
    char challenger_key[256];  /* the search's best when it was confirmed or
                                  rejected; "" otherwise */
    double challenger_ms;      /* its median in the search */
    double ratio, ratio_lo, ratio_hi; /* challenger/default and its interval;
                                  NAN when not confirmed in this run */
    int rounds;                /* confirmation rounds run now (0: none) */
    int challengers;           /* configs confirmed against the default in
                                  those rounds (the winner among them) */
    char rival_key[256];       /* the challenger next to the winner in the
                                  rounds ("" with one challenger) */
    double rival_ratio, rival_lo, rival_hi; /* winner/rival and its interval;
                                  NAN without a rival */
} tune_m_report;

typedef struct tune_job_report {
    const kern_family *fam;
    char shape_key[KERN_KEY_MAX];
    char note[160];            /* why the job was not tuned ("" when it was) */
    int n_m;
    tune_m_report m[TUNE_MAX_M];
} tune_job_report;

typedef struct tune_report {
    char device_spec[32];
    char device_name[128];
    bool compile_only;
    int64_t session_id;
    double elapsed_s;
    bool interrupted;
    int worker_restarts;
    int n_jobs;
    tune_job_report *jobs;     /* n_jobs entries */
} tune_report;

/* ---- deciding a winner ------------------------------------------------------
 * The candidates whose medians beat the default's in the search (the best
 * few, the challengers) are confirmed against the default and against each
 * other by R paired rounds: each round times all of them and the default
 * back to back in the same worker (changing the order from round to round),
 * and gives the ratio challenger/default of the times for each challenger. The statistic is the geometric
 * mean of the ratios (the mean of their logarithms): symmetric in the two
 * configs, smooth under resampling with few rounds (a median of 10 values
 * resamples to a handful of distinct values), and every round's time is
 * itself a median of many runs, so one disturbed launch does not move it.
 * Its interval is a percentile bootstrap (TUNE_BOOTSTRAP_RESAMPLES
 * resamples of the rounds, seeded: the same rounds give the same interval),
 * widened around the mean by sqrt(n / (n - 1)) for the few rounds.
 * A challenger is confirmed only when its interval's upper bound is below 1;
 * of the confirmed ones, the one with the lowest ratio (the fastest in the
 * same rounds) wins. */
#define TUNE_BOOTSTRAP_RESAMPLES 4000
#define TUNE_CONFIRM_MAX_ROUNDS 64
#define TUNE_CONFIRM_TOP 3     /* challengers by default */
#define TUNE_CONFIRM_MAX_TOP 4

typedef struct tune_interval {
    double ratio;   /* geometric mean of cand/default over the rounds */
    double lo, hi;  /* two-sided percentile-bootstrap interval of ratio */
    double level;   /* its confidence, e.g. 0.95 */
    int rounds;
} tune_interval;

/* Interval of the geometric mean of cand_ms[i] / dflt_ms[i] over n paired
 * rounds (2 <= n <= TUNE_CONFIRM_MAX_ROUNDS, every time finite and > 0) at
 * confidence level (0 < level < 1), from `seed`. MT_E_INVALID otherwise. */
mt_status tune_ratio_interval(const double *cand_ms, const double *dflt_ms, int n, double level,
                              uint64_t seed, tune_interval *out, mt_err *err);
/* The decision rule: faster with confidence (hi < 1). */
bool tune_interval_accepts(const tune_interval *iv);

/* ---- tuning inside a process that has threads -------------------------------
 * tune_run forks a spawner process that forks the measurement workers; it
 * must be forked while the process has no other thread (a fork copies only
 * the calling thread, and locks other threads held stay locked in the
 * copy). A process that tunes while it serves (`serve --tune-misses`) opens
 * one before it starts any thread and hands it to tune_run through
 * tune_opts.spawner, one tune_run at a time.
 * nice_incr (0..19) is added to the spawner's niceness, so every worker
 * runs at that lower priority; 19 also puts them in Linux's SCHED_IDLE
 * class (they run only on cores nothing else wants). The caller owns the spawner; close kills
 * its remaining workers. close(NULL) is a no-op. */
typedef struct tune_spawner tune_spawner;
mt_status tune_spawner_open(int nice_incr, tune_spawner **out, mt_err *err);
void tune_spawner_close(tune_spawner *s);

/* Runs the jobs (at most TUNE_MAX_JOBS). *report (out may be NULL) receives
 * a report the caller frees with tune_report_free, filled as far as the run
 * got, also on failure or interruption. Returns MT_OK, MT_E_INTERRUPTED
 * when opts.stop was set (session marked interrupted), or the error that
 * stopped the run (device, database, reference) with the session marked
 * failed. Candidate failures (compile errors, wrong results, crashes,
 * timeouts) are outcomes recorded as trials, not errors. */
mt_status tune_run(const tune_job *jobs, int n_jobs, const tune_opts *opts,
                   tune_report **report, mt_err *err);
void tune_report_free(tune_report *r); /* NULL is a no-op */

/* Prints the table per job and M: best config, time, GFLOP/s, GB/s,
 * speedup over the default config, determinism and counts. */
void tune_report_print(const tune_report *r, FILE *out);

#endif
