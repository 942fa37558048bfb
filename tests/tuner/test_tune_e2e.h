/* test_tune_e2e.h: the end-to-end check shared by test_tune_run.c (cpu)
 * and test_tune_run_emu.c (emu): tune a small shape into a fresh database
 * with a budget, check trials, winners, the default's time and
 * determinism, then rerun and check that nothing new is measured. */
#ifndef TEST_TUNE_E2E_H
#define TEST_TUNE_E2E_H

#include "test_tune_util.h"

static void tune_and_rerun(const char *device, const char *family, const char *shape,
                           const int64_t *ms, int n_m, tune_strategy strategy, int64_t budget)
{
    const kern_family *f = kern_family_find(family);
    if (!f)
        cr_skip_test("family %s is not in this build", family);
    dev_device *probe = NULL;
    if (dev_open(device, &(dev_open_opts){0}, &probe, NULL) != MT_OK)
        cr_skip_test("device %s does not open in this build", device);
    bool has_impl = kern_family_impl(f, dev_get_props(probe)->backend) != NULL;
    dev_close(probe);
    if (!has_impl)
        cr_skip_test("family %s has no implementation for %s", family, device);

    char db[256];
    tt_db_path(db, sizeof db, "tune.db");
    tune_job job;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_job_make(f, shape, ms, n_m, &job, &err), MT_OK, "%s", err.msg);
    tune_opts o;
    tt_opts(&o, device, db);
    o.strategy = strategy;
    o.budget.trials = budget;
    tune_report *rep = NULL;
    mt_status st = tune_run(&job, 1, &o, &rep, &err);
    cr_assert_eq(st, MT_OK, "%s on %s: %s", family, device, err.msg);
    cr_assert_eq(rep->n_jobs, 1);
    cr_assert_eq(rep->jobs[0].n_m, n_m);

    tt_trials *ts = calloc(1, sizeof *ts);
    tt_read_trials(db, family, ts);
    int measured = tt_report_measured(rep);
    cr_assert_eq(ts->n, measured, "database holds %d trials, run reported %d", ts->n, measured);
    for (int i = 0; i < n_m; i++) {
        const tune_m_report *mr = &rep->jobs[0].m[i];
        cr_assert(mr->measured >= 1 && mr->measured <= budget, "M=%lld: %d trials for budget %lld",
                  (long long)mr->m, mr->measured, (long long)budget);
        cr_assert(mr->has_winner, "M=%lld has no winner", (long long)mr->m);
        cr_assert(mr->has_default, "M=%lld: the default config was not timed", (long long)mr->m);
        const tt_trial *w = tt_find(ts, family, mr->m, mr->best_key);
        cr_assert_not_null(w, "winner %s has no trial", mr->best_key);
        cr_assert_eq(w->status, DB_TRIAL_OK, "winner %s has status %s", mr->best_key,
                     db_trial_status_str(w->status));
        cr_assert(mr->best_ms <= mr->default_ms * 1.0000001, "winner slower than the default");
        cr_assert(mr->deterministic >= 0, "winner of M=%lld was not checked for determinism",
                  (long long)mr->m);
        /* Every trial of this M has a known status; ok ones carry times. */
        for (int t = 0; t < ts->n; t++)
            if (ts->t[t].m == mr->m && ts->t[t].status == DB_TRIAL_OK)
                cr_assert(ts->t[t].median_ms > 0);
    }
    tt_winners ws;
    tt_read_winners(db, family, &ws);
    cr_assert_eq(ws.n, n_m, "%d winners for %d values of M", ws.n, n_m);
    tune_report_free(rep);

    /* The same command again: everything is known, nothing is measured. */
    rep = NULL;
    st = tune_run(&job, 1, &o, &rep, &err);
    cr_assert_eq(st, MT_OK, "rerun: %s", err.msg);
    cr_assert_eq(tt_report_measured(rep), 0, "the rerun measured %d new trials",
                 tt_report_measured(rep));
    for (int i = 0; i < n_m; i++) {
        cr_assert(rep->jobs[0].m[i].resumed >= 1);
        cr_assert(rep->jobs[0].m[i].has_winner);
    }
    tt_trials *ts2 = calloc(1, sizeof *ts2);
    tt_read_trials(db, family, ts2);
    cr_assert_eq(ts2->n, ts->n);
    tune_report_free(rep);
    free(ts);
    free(ts2);
}

#endif
