/* tune_db.c: what the tuner reads back from the database: the trials
 * already recorded for one (device, kernel, shape, M) (resume, best so far,
 * the default's time), the winners of the same shape at other M (transfer
 * seeds) and the winner of one M. Kept apart so the rest of the tuner only
 * writes. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tune_db.h"

/* The filter of key's rows at m: family, shape, M, kernel version and
 * source hash in SQL. The device is named by fingerprint, which the
 * filter also matches against device names: the id check in the callbacks
 * keeps exactly this device's rows. */
static db_filter key_filter(const tune_db_key *k, int64_t m)
{
    return (db_filter){.family = k->family, .shape_key = k->shape_key, .m = m,
                       .device = k->other_devices ? NULL : k->fingerprint, .version = k->version,
                       .source_hash = k->source_hash};
}

typedef struct known_ctx {
    const tune_db_key *k;
    tune_known_fn fn;
    void *arg;
} known_ctx;

static int known_cb(void *arg, const db_trial_row *row)
{
    known_ctx *c = arg;
    if (row->t.device_id == c->k->device_id)
        c->fn(c->arg, row->t.config_key, row->t.status, row->t.time_median_ms);
    return 0;
}

mt_status tune_db_known(db_t *db, const tune_db_key *k, int64_t m, tune_known_fn fn, void *arg,
                        mt_err *err)
{
    db_filter f = key_filter(k, m);
    known_ctx c = {k, fn, arg};
    return db_trials_each(db, &f, known_cb, &c, err);
}

typedef struct winners_ctx {
    const tune_db_key *k;
    tune_winner *out;
    int n, cap;
} winners_ctx;

static void runner_ups(const char *json, tune_winner *w)
{
    cJSON *a = json ? cJSON_Parse(json) : NULL;
    int i = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, a)
    {
        const cJSON *key = cJSON_GetObjectItemCaseSensitive(e, "config_key");
        if (i < TUNE_RUNNER_UPS && cJSON_IsString(key))
            snprintf(w->runner_ups[i++], sizeof w->runner_ups[0], "%s", key->valuestring);
    }
    w->n_runner_ups = i;
    cJSON_Delete(a);
}

static int winners_cb(void *arg, const db_winner_row *row)
{
    winners_ctx *c = arg;
    if ((row->device_id != c->k->device_id) != c->k->other_devices)
        return 0;
    if (c->n >= c->cap)
        return 1;
    tune_winner *w = &c->out[c->n++];
    memset(w, 0, sizeof *w);
    w->m = row->m;
    w->time_ms = row->time_ms;
    snprintf(w->config_key, sizeof w->config_key, "%s", row->config_key);
    runner_ups(row->runner_ups_json, w);
    w->decision = row->confirm.decision;
    snprintf(w->challenger, sizeof w->challenger, "%s",
             row->confirm.challenger_key ? row->confirm.challenger_key : "");
    return 0;
}

int tune_db_winners(db_t *db, const tune_db_key *k, int64_t m, tune_winner *out, int cap,
                    mt_err *err)
{
    db_filter f = key_filter(k, m);
    winners_ctx c = {k, out, 0, cap};
    if (db_winners_each(db, &f, winners_cb, &c, err) != MT_OK)
        return -1;
    return c.n;
}
