/* test_tune_util.h: helpers shared by the tuner tests: fresh database
 * paths, quick tuner options, and reading trials and winners back. */
#ifndef TEST_TUNE_UTIL_H
#define TEST_TUNE_UTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db/db.h"
#include "test_tmp.h"
#include "tuner/tuner.h"

/* A fresh directory per call (removed when the test ends); the database
 * file inside it. */
static inline void tt_db_path(char *out, size_t cap, const char *name)
{
    char dir[512];
    tmp_dir_make(dir, sizeof dir, "mt_tune");
    int n = snprintf(out, cap, "%s/%s", dir, name);
    cr_assert(n > 0 && (size_t)n < cap, "%s/%s does not fit", dir, name);
}

/* Options for quick tests: few repetitions, short timeouts, silent unless
 * MT_TUNE_TEST_LOG is set. */
static inline void tt_opts(tune_opts *o, const char *device, const char *db)
{
    tune_opts_default(o);
    o->device = device;
    o->db_path = db;
    o->jobs = 2;
    o->timeout_s = 20;
    o->timing.warmup = 1;
    o->timing.min_reps = 3;
    o->timing.max_reps = 5;
    o->timing.max_ms = 200;
    o->log = getenv("MT_TUNE_TEST_LOG") ? stderr : NULL;
}

typedef struct tt_trial {
    char family[64];
    char config_key[256];
    int64_t m;
    db_trial_status status;
    double median_ms;
    char resources[512];
    char error[256];
} tt_trial;

typedef struct tt_trials {
    int n;
    tt_trial t[512];
} tt_trials;

static inline int tt_trial_cb(void *arg, const db_trial_row *row)
{
    tt_trials *ts = arg;
    if (ts->n >= 512)
        return 1;
    tt_trial *t = &ts->t[ts->n++];
    snprintf(t->family, sizeof t->family, "%s", row->family);
    snprintf(t->config_key, sizeof t->config_key, "%s", row->t.config_key);
    t->m = row->t.m;
    t->status = row->t.status;
    t->median_ms = row->t.time_median_ms;
    snprintf(t->resources, sizeof t->resources, "%s",
             row->t.resources_json ? row->t.resources_json : "");
    snprintf(t->error, sizeof t->error, "%s", row->t.error ? row->t.error : "");
    return 0;
}

/* Every trial of family (NULL: all) in the database at path. */
static inline void tt_read_trials(const char *path, const char *family, tt_trials *out)
{
    db_t *db = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(db_open(path, DB_OPEN_READONLY, &db, &err), MT_OK, "%s", err.msg);
    memset(out, 0, sizeof *out);
    db_filter f = {.family = family};
    cr_assert_eq(db_trials_each(db, &f, tt_trial_cb, out, &err), MT_OK, "%s", err.msg);
    db_close(db);
}

typedef struct tt_winner {
    char family[64];
    int64_t m;
    char config_key[256];
    double time_ms;
} tt_winner;

typedef struct tt_winners {
    int n;
    tt_winner w[128];
} tt_winners;

static inline int tt_winner_cb(void *arg, const db_winner_row *row)
{
    tt_winners *ws = arg;
    if (ws->n >= 128)
        return 1;
    tt_winner *w = &ws->w[ws->n++];
    snprintf(w->family, sizeof w->family, "%s", row->family);
    snprintf(w->config_key, sizeof w->config_key, "%s", row->config_key);
    w->m = row->m;
    w->time_ms = row->time_ms;
    return 0;
}

static inline void tt_read_winners(const char *path, const char *family, tt_winners *out)
{
    db_t *db = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(db_open(path, DB_OPEN_READONLY, &db, &err), MT_OK, "%s", err.msg);
    memset(out, 0, sizeof *out);
    db_filter f = {.family = family};
    cr_assert_eq(db_winners_each(db, &f, tt_winner_cb, out, &err), MT_OK, "%s", err.msg);
    db_close(db);
}

static inline const tt_trial *tt_find(const tt_trials *ts, const char *family, int64_t m,
                                      const char *key)
{
    for (int i = 0; i < ts->n; i++)
        if (ts->t[i].m == m && !strcmp(ts->t[i].config_key, key) &&
            (!family || !strcmp(ts->t[i].family, family)))
            return &ts->t[i];
    return NULL;
}

static inline int tt_report_measured(const tune_report *r)
{
    int n = 0;
    for (int j = 0; j < r->n_jobs; j++)
        for (int i = 0; i < r->jobs[j].n_m; i++)
            n += r->jobs[j].m[i].measured;
    return n;
}

/* The one winner a database holds, with its confirmation (tt_read_decision). */
typedef struct tt_decision {
    char key[256], challenger[256];
    db_decision decision;
    double ratio, hi;
    int rounds;
    int64_t dev, ker;
} tt_decision;

static inline int tt_decision_cb(void *arg, const db_winner_row *w)
{
    tt_decision *d = arg;
    snprintf(d->key, sizeof d->key, "%s", w->config_key);
    snprintf(d->challenger, sizeof d->challenger, "%s",
             w->confirm.challenger_key ? w->confirm.challenger_key : "");
    d->decision = w->confirm.decision;
    d->ratio = w->confirm.ratio;
    d->hi = w->confirm.ratio_hi;
    d->rounds = w->confirm.rounds;
    d->dev = w->device_id;
    d->ker = w->kernel_id;
    return 0;
}

/* The winner stored in the database at path (the last one read where there
 * are several). */
static inline tt_decision tt_read_decision(const char *path)
{
    tt_decision d = {0};
    db_t *db = NULL;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_open(path, DB_OPEN_READONLY, &db, &e), MT_OK, "%s", e.msg);
    cr_assert_eq(db_winners_each(db, NULL, tt_decision_cb, &d, &e), MT_OK, "%s", e.msg);
    db_close(db);
    return d;
}

#endif
