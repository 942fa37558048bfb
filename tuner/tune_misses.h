/* tune_misses.h: `moetune tune --misses`: tune what a database's misses say
 * the runtime looked up and did not find, costliest first.
 *
 * The misses table (docs/DB.md) holds, per device, family, shape and M, how
 * many lookups missed: a runtime's kernel set looks each kernel up once per
 * M bucket when it loads, and records a miss when the lookup found no
 * winner for this device (reasons miss, stale, other_device). Nearest-bucket
 * selections are hits and are not recorded, so they are not here.
 *
 * The work: the misses of devices of the tuning device's backend, summed
 * over those devices per (family, shape, M); left out are families this
 * build lacks, shapes it cannot parse, families with nothing to tune on
 * this backend and misses this device has a winner for by now (an exact
 * hit under the current kernel source). Each one's default config is timed
 * first (a trial, no winner: tune_opts.default_only), each at the shape the
 * runtime ran (the miss's shape_run: runtime dims included; a miss recorded
 * without one, by an older runtime, takes the family's first preset's
 * runtime dims), then the misses are
 * tuned in order of cost = lookups x the default's median time, the
 * costliest first, with the caller's strategy, budget and confirmation,
 * as `tune` runs them, the winners written to the same database.
 *
 * Like tune_run it forks: one call per process at a time. */
#ifndef MT_TUNE_MISSES_H
#define MT_TUNE_MISSES_H

#include "tuner.h"

typedef struct tune_miss {
    const kern_family *fam;
    char shape_key[KERN_KEY_MAX];
    char shape_run[KERN_KEY_MAX]; /* runtime dims included; "": not recorded */
    int64_t m;
    int64_t lookups;        /* missed lookups, summed over the devices */
    double default_ms;      /* the default config's median here; NAN: not timed */
    double cost_ms;         /* lookups x default_ms; NAN: not timed */
} tune_miss;

typedef struct tune_misses_result {
    int recorded;           /* distinct (family, shape, M) misses of this backend */
    int skipped;            /* left out (see above); each logged with why */
    int n;                  /* tuned, in this order: */
    tune_miss *order;       /* n entries, costliest first; free with
                               tune_misses_result_free */
} tune_misses_result;

void tune_misses_result_free(tune_misses_result *r); /* NULL is a no-op; the
                                                        struct itself is the caller's */

/* The tuning job of miss t: its shape_run where recorded (the runtime's
 * own runtime dims), its shape_key otherwise. */
mt_status tune_miss_job(const tune_miss *t, tune_job *out, mt_err *err);

/* Orders misses by cost, costliest first; those not timed last, by
 * lookups. Stable for equal keys (then by family, shape, M). */
void tune_misses_sort(tune_miss *v, int n);

/* Tunes the misses of o->db_path on o->device (see above). o is used as
 * `tune` uses it (o->default_only must be false). The table of each tuning
 * run is printed to table (NULL: not printed). *res is filled as far as the
 * run got. Returns MT_OK (also when there was nothing to tune),
 * MT_E_INTERRUPTED, or the error that stopped the run. */
mt_status tune_misses_run(const tune_opts *o, FILE *table, tune_misses_result *res,
                          mt_err *err);

#endif
