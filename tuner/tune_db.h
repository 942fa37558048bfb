/* tune_db.h: the tuner's reads from the database (tune_db.c). Internal. */
#ifndef MT_TUNE_DB_H
#define MT_TUNE_DB_H

#include <stdbool.h>
#include <stdint.h>

#include "db/db.h"
#include "common/status.h"

/* Which rows belong to this run: device and kernel version. */
typedef struct tune_db_key {
    int64_t device_id;
    const char *fingerprint;
    const char *family;
    int version;
    const char *source_hash;
    const char *shape_key;
    bool other_devices;   /* winners: those of every OTHER device instead */
} tune_db_key;

/* Called per recorded trial of (key, m): config key, status, median (NAN
 * when none). Strings are valid during the call only. */
typedef void (*tune_known_fn)(void *arg, const char *config_key, db_trial_status st,
                              double median_ms);
mt_status tune_db_known(db_t *db, const tune_db_key *k, int64_t m, tune_known_fn fn,
                        void *arg, mt_err *err);

#define TUNE_RUNNER_UPS 4
typedef struct tune_winner {
    int64_t m;
    double time_ms;
    char config_key[256];
    int n_runner_ups;
    char runner_ups[TUNE_RUNNER_UPS][256];
    db_decision decision;
    char challenger[256];      /* "" when none */
} tune_winner;

/* Winners of (key) at m (m <= 0: every M), up to cap; returns the count
 * or -1 on a database error. */
int tune_db_winners(db_t *db, const tune_db_key *k, int64_t m, tune_winner *out, int cap,
                    mt_err *err);

#endif
