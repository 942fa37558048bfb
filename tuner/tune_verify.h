/* tune_verify.h: `moetune db verify`: re-time stored winners on this
 * device and mark those that no longer win as stale (db_winner_verify).
 *
 * For each winner of the database whose device has this device's backend
 * (tuned here or on another machine) and whose kernel source hash is the one
 * built into this moetune, the winner is timed against its first runner-up
 * and against the family's default config in paired, interleaved rounds
 * (the tuner's confirmation: tune_worker_paired, ABBA order, batched
 * samples, geometric mean of the per-round ratios winner/other with a
 * seeded percentile-bootstrap interval). The winner is stale when the
 * interval of either comparison lies entirely above 1 + margin: the other
 * config is faster with confidence, by more than the margin. Otherwise it
 * is marked verified. (Two near-equal configs differ by a few tenths of a
 * percent one way in one process and the other way in the next, each time
 * with a tight interval: the margin keeps such flips from marking winners.) Winners of
 * another backend, of a family this build does not have, or of another
 * source hash are listed as skipped and left alone.
 *
 * Like tune_run it forks (a spawner first, then measurement workers), so
 * one call per process at a time. */
#ifndef MT_TUNE_VERIFY_H
#define MT_TUNE_VERIFY_H

#include "tuner.h"

/* The default margin: measured on the cpu, re-timing one database ten
 * times swung the ratio of two near-equal configs between 0.993 and 1.004,
 * each time with an interval under 1% wide. */
#define TUNE_VERIFY_MARGIN 0.01

typedef struct tune_verify_opts {
    const char *device;     /* spec to time on; NULL: "auto" */
    const char *db_path;    /* required; opened read-write */
    db_filter filter;       /* which winners (family, shape, m, their device) */
    int rounds;             /* paired rounds per comparison; 0: 10 */
    double confidence;      /* 0: 0.95 */
    double margin;          /* stale only when the other config is faster by
                               more than this share (0.01: 1%); 0 <= margin < 1 */
    double timeout_s;       /* per exchange with the worker; 0: 60 */
    kern_time_opts timing;  /* base timing (kern_time_opts_default) */
    /* Families looked up before the built-in registry (test-only ones);
     * may be NULL. */
    const kern_family *const *families;
    int n_families;
    volatile sig_atomic_t *stop;
    FILE *log;              /* one line per winner; NULL: silent */
} tune_verify_opts;

void tune_verify_opts_default(tune_verify_opts *o);

enum { TUNE_VS_RUNNER_UP = 0, TUNE_VS_DEFAULT = 1, TUNE_VS_COUNT };

typedef struct tune_verify_row {
    char device_name[128];  /* the device the winner was tuned on */
    char family[64];
    char shape_key[KERN_KEY_MAX];
    int64_t m;
    char winner[256];
    double winner_ms;       /* its median over the rounds; NAN when not timed */
    char vs[TUNE_VS_COUNT][256]; /* "" when there is none (or it is the winner) */
    tune_interval iv[TUNE_VS_COUNT]; /* winner / other; rounds 0: not compared */
    bool skipped;           /* not re-timed: note says why */
    bool stale;             /* marked stale now */
    char note[256];
} tune_verify_row;

typedef struct tune_verify_report {
    char device_spec[32], device_name[128];
    int n, verified, stale, skipped;
    tune_verify_row *rows;
} tune_verify_report;

/* Re-times the winners the filter selects (see above) and records each
 * outcome in the database. *report (may be NULL) gets the rows, also on
 * failure as far as it got; free with tune_verify_report_free. Returns
 * MT_OK, MT_E_INTERRUPTED, or the device or database error that stopped
 * it. A winner that fails to compile or to run is a skipped row, not an
 * error. */
mt_status tune_verify(const tune_verify_opts *o, tune_verify_report **report, mt_err *err);
void tune_verify_report_free(tune_verify_report *r); /* NULL is a no-op */

#endif
