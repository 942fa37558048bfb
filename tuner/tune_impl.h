/* tune_impl.h: pieces of the tuner shared between its files and nothing
 * else: the compile pool, the measurement worker and its spawner, the search
 * strategies and the progress display. Not a public interface. */
#ifndef MT_TUNE_IMPL_H
#define MT_TUNE_IMPL_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "tuner.h"

static inline bool tune_stopped(volatile sig_atomic_t *stop) { return stop && *stop; }

/* ---- compile pool (tune_pool.c) ------------------------------------------
 * N threads running tasks in submission order. A task's `done` flag is set
 * under the pool's lock after it ran, and waiters are woken. Waits return
 * early (false) once *stop is set. One thread (the tuner's) submits, waits
 * and destroys. */
typedef struct tune_pool tune_pool;
typedef void (*tune_task_fn)(void *arg);

mt_status tune_pool_create(int threads, tune_pool **out, mt_err *err);
/* Waits for running tasks, drops queued ones, joins. NULL is a no-op. */
void tune_pool_destroy(tune_pool *p);
/* *done must stay valid until it is set or the task is dropped. */
mt_status tune_pool_submit(tune_pool *p, tune_task_fn fn, void *arg, bool *done, mt_err *err);
/* Waits until *done (true) or stop (false). */
bool tune_pool_wait(tune_pool *p, const bool *done, volatile sig_atomic_t *stop);
/* Waits until nothing is queued or running (true) or stop (false). */
bool tune_pool_wait_idle(tune_pool *p, volatile sig_atomic_t *stop);
/* Drops queued tasks (their done flags stay false) and waits for the
 * running ones to finish. */
void tune_pool_cancel(tune_pool *p);

/* ---- measurement worker (tune_worker.c) ----------------------------------
 * A spawner process is forked first (single-threaded, before any device is
 * opened); it forks one worker per request. The worker opens the device
 * itself and serves requests over a socket. */
typedef struct tune_worker tune_worker;

mt_status tune_spawner_start(tune_spawner **out, mt_err *err); /* tune_spawner_open(0, ...) */
/* Kills remaining workers and the spawner. NULL is a no-op. */
void tune_spawner_stop(tune_spawner *s);

/* Starts a worker that opens spec/arch; waits (up to timeout_s, or until
 * stop) for it to report the device. *props receives the worker's view. */
mt_status tune_worker_start(tune_spawner *s, const char *spec, const char *arch,
                            double timeout_s, volatile sig_atomic_t *stop, tune_worker **out,
                            dev_props *props, mt_err *err);
/* Kills (if alive) and reaps the worker. NULL is a no-op. */
void tune_worker_stop(tune_worker *w);
/* The worker's process id (> 0), and the CPU time its threads have run so
 * far in ms (Linux's per-thread schedstat; < 0: not known here). */
int tune_worker_pid(const tune_worker *w);
double tune_worker_cpu_ms(const tune_worker *w);

enum {
    TUNE_W_VERIFY = 1u,      /* run once, compare with the reference */
    TUNE_W_TIME = 2u,        /* kern_problem_time */
    TUNE_W_DETERMINISM = 4u, /* run twice, compare output bytes */
};

/* Builds the worker's problem for (fam, shape, m) from data_seed; a later
 * prepare replaces it. No timeout (references of big shapes are slow);
 * stops on *stop. */
mt_status tune_worker_prepare(tune_worker *w, const kern_family *fam, const kern_shape *s,
                              int64_t m, uint64_t data_seed, volatile sig_atomic_t *stop,
                              mt_err *err);

typedef struct tune_measure {
    mt_status status;   /* MT_OK, or the failure of the step that failed */
    char step[16];      /* "load", "run", "verify", "time", "determinism" */
    kern_timing timing;
    int deterministic;  /* -1 not checked, 0 differs, 1 identical */
    char msg[1536];
} tune_measure;

/* Measures one compiled candidate on the prepared problem. Returns MT_OK
 * with the outcome in *out; MT_E_CRASH (the worker died: err names the
 * signal), MT_E_TIMEOUT (killed after timeout_s) or MT_E_INTERRUPTED (stop
 * set; killed): after those the worker is dead and must be stopped. */
mt_status tune_worker_measure(tune_worker *w, const kern_config *cfg, const void *code,
                              size_t code_len, unsigned flags, const kern_time_opts *topts,
                              double timeout_s, volatile sig_atomic_t *stop,
                              tune_measure *out, mt_err *err);

/* Paired timing of n compiled configs (2 <= n <= TUNE_PAIRED_MAX_CONFIGS)
 * on the prepared problem: `rounds` rounds (at most TUNE_CONFIRM_MAX_ROUNDS),
 * each timing every config back to back with kern_problem_time(topts). The
 * order changes from round to round so that drift and the position within
 * a round hit every config alike: round 2j runs the configs in a rotated
 * order starting at config j mod n, round 2j+1 in the reverse of that
 * order (for two configs: ab, ba, ba, ab, ...). All are loaded once. */
#define TUNE_PAIRED_MAX_CONFIGS (TUNE_CONFIRM_MAX_TOP + 1)

typedef struct tune_paired {
    mt_status status;   /* MT_OK, or the failure of the step that failed */
    char step[16];      /* "load", "time" */
    int failed;         /* index of the config that failed; -1: none */
    int n;              /* configs */
    int rounds;         /* rounds completed */
    double ms[TUNE_PAIRED_MAX_CONFIGS][TUNE_CONFIRM_MAX_ROUNDS]; /* medians per round */
    int reps;           /* timed runs per config and round (of the last round) */
    char msg[1024];
} tune_paired;

/* Config i of round `round`'s order (the rule above), for n configs. */
int tune_paired_order(int n, int round, int pos);

/* Returns like tune_worker_measure; timeout_s bounds the whole exchange.
 * cfgs, codes and lens hold n entries each. */
mt_status tune_worker_paired(tune_worker *w, int n, const kern_config *cfgs,
                             const void *const *codes, const size_t *lens, int rounds,
                             const kern_time_opts *topts, double timeout_s,
                             volatile sig_atomic_t *stop, tune_paired *out, mt_err *err);

/* The timing of one config in a paired round (tune_run.c): base with a
 * fixed number of samples (the same work for both configs in every round),
 * each a batch of launches lasting at least 0.1 ms for a kernel of about
 * fast_ms, no early abandon. */
kern_time_opts tune_paired_opts(const kern_time_opts *base, double fast_ms);
/* The decision among n challengers (tune_run.c), iv[i] challenger i
 * against the default over the same rounds: the confirmed one (hi < 1)
 * with the lowest ratio, or with none confirmed the lowest ratio (the
 * rejected challenger). Returns its index; *confirmed says which case;
 * *undecided whether more rounds could change the decision (nothing
 * confirmed though the pick measured faster than the default, or an
 * unconfirmed challenger faster than the confirmed pick). */
int tune_confirm_pick(const tune_interval *iv, int n, bool *confirmed, bool *undecided);
/* Median of n <= TUNE_CONFIRM_MAX_ROUNDS values (not modified). */
double tune_median(const double *v, int n);

/* ---- search strategies (tune_search.c) ------------------------------------
 * Holds the valid (sharded) space of one (job, M), the configs already
 * known (in the database or proposed) and the results so far; proposes the
 * next batch of configs to try. */
typedef struct tune_search tune_search;

typedef struct tune_search_args {
    const kern_family *fam;
    const kern_impl *im;
    const kern_shape *shape;
    int64_t m;
    const dev_props *props;
    tune_strategy strategy;
    uint64_t seed;
    int shard_index, shard_count;
    int batch;            /* batch size for random and evolve */
    int64_t budget;       /* trials the caller will ask for (0: unknown);
                             evolve's first generation is a quarter of it */
} tune_search_args;

mt_status tune_search_create(const tune_search_args *a, tune_search **out, mt_err *err);
void tune_search_destroy(tune_search *s);
/* Valid configs in this shard's part of the space (plus the default). */
int tune_search_space(const tune_search *s);
const kern_config *tune_search_default(const tune_search *s);
/* The trials this (job, M) may use, once known (a share of the space is
 * known only after tune_search_space): the strategies size their batches
 * and first generation by it. 0: unlimited. */
void tune_search_set_budget(tune_search *s, int64_t trials);
/* A config already measured (median NAN unless ok): never proposed again,
 * and a parent for evolve when ok. */
void tune_search_known(tune_search *s, const char *config_key, bool ok, double median_ms);
/* A transfer seed: proposed right after the default when valid, in shard
 * and not known. */
void tune_search_seed(tune_search *s, const kern_config *c);
/* Seeds that tune_search_next would propose now: valid, in shard, not
 * known and not the default. */
int tune_search_seeds(const tune_search *s);
/* Seeds valid at this M and in shard, the default and known ones
 * included: what transfer found that applies here. */
int tune_search_seeds_valid(const tune_search *s);
/* Writes up to cap new configs (the default first, then seeds); 0 when the
 * strategy has nothing left. Proposed configs count as known. */
int tune_search_next(tune_search *s, kern_config *out, int cap);
/* Reports a measured outcome (feeds evolve). */
void tune_search_result(tune_search *s, const kern_config *c, bool ok, double median_ms);

/* ---- the model strategy's proposal (tune_model.c) ------------------------
 * A measured config: its median time, INFINITY when it failed. */
typedef struct tune_model_obs {
    kern_config cfg;
    double ms;
} tune_model_obs;

/* Fits the surrogate (tune_forest.h) to obs (at least one) and picks up to
 * `want` of the n_cands candidates by expected improvement of the log time,
 * refitting after each pick with its predicted time (constant liar) so a
 * batch spreads out. Writes candidate indices to chosen (room for want);
 * returns how many (0 when nothing can be fitted). Deterministic for a seed. */
int tune_model_pick(const kern_impl *im, const tune_model_obs *obs, int n_obs,
                    const kern_config *cands, int n_cands, int want, uint64_t seed, int *chosen);

/* ---- progress (tune_progress.c) ------------------------------------------- */
typedef struct tune_progress {
    FILE *out;              /* NULL: silent */
    bool tty;
    char label[KERN_KEY_MAX + 64];
    int64_t m;
    int planned, done;
    int counts[DB_TRIAL_STATUS_COUNT];
    int resumed;
    double best_ms;
    char best_key[256];
    double t0_ms, last_draw_ms;
    const char *phase;      /* "compile", "measure" */
} tune_progress;

void tune_progress_begin(tune_progress *p, const char *label, int64_t m, int planned);
void tune_progress_plan(tune_progress *p, int planned);
void tune_progress_phase(tune_progress *p, const char *phase);
/* One finished candidate (not for resumed ones). */
void tune_progress_trial(tune_progress *p, const char *config_key, db_trial_status st,
                         double median_ms, const char *error);
void tune_progress_best(tune_progress *p, const char *config_key, double ms);
/* A line that survives the bar (warnings, restarts). */
void tune_progress_note(tune_progress *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void tune_progress_end(tune_progress *p);

/* ---- helpers (tune_opts.c) ------------------------------------------------- */
uint64_t tune_hash64(const char *s);
const char *tune_trial_status_name(db_trial_status s);

#endif
