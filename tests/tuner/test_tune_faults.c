/* test_tune_faults.c: fault injection. Four test-only families whose
 * config V=2 fails to compile, computes a wrong element, writes to address
 * 16 (SIGSEGV kills the worker) or never returns (the worker is killed at
 * the timeout). Each failure is recorded with its status, a new worker
 * takes over, tuning completes, and every winner is a correct config. */
#include "test_tune_families.h"
#include "test_tune_util.h"

typedef struct fault_case {
    const kern_family *fam;
    db_trial_status want;
} fault_case;

Test(tune_faults, each_failure_is_recorded_and_a_correct_config_wins, .timeout = 180)
{
    const fault_case cases[] = {
        {&tfault_compile, DB_TRIAL_COMPILE_ERROR},
        {&tfault_wrong, DB_TRIAL_WRONG_RESULT},
        {&tfault_segv, DB_TRIAL_CRASH},
        {&tfault_hang, DB_TRIAL_TIMEOUT},
    };
    enum { N = sizeof cases / sizeof cases[0] };
    char db[256];
    tt_db_path(db, sizeof db, "faults.db");
    tune_job jobs[N];
    static const int64_t ms[] = {2};
    mt_err err = MT_ERR_INIT;
    for (int i = 0; i < N; i++)
        cr_assert_eq(tune_job_make(cases[i].fam, "small", ms, 1, &jobs[i], &err), MT_OK, "%s",
                     err.msg);
    tune_opts o;
    tt_opts(&o, "cpu", db);
    o.timeout_s = 3; /* the hanging config is killed after 3 s */
    o.timing.flush_cache = false;
    tune_report *rep = NULL;
    mt_status st = tune_run(jobs, N, &o, &rep, &err);
    cr_assert_eq(st, MT_OK, "%s", err.msg);
    cr_assert_eq(rep->n_jobs, N);
    /* Two V=2 configs (SPIN 1 and 4) crash and two hang: four new workers. */
    cr_assert_geq(rep->worker_restarts, 4, "%d worker restarts", rep->worker_restarts);

    tt_trials *ts = calloc(1, sizeof *ts);
    for (int i = 0; i < N; i++) {
        const char *name = cases[i].fam->name;
        tt_read_trials(db, name, ts);
        cr_assert_eq(ts->n, 6, "%s: %d trials (space of 6)", name, ts->n);
        for (int t = 0; t < ts->n; t++) {
            const tt_trial *tr = &ts->t[t];
            bool faulty = !strncmp(tr->config_key, "V=2,", 4);
            if (faulty) {
                cr_assert_eq(tr->status, cases[i].want, "%s %s: status %s, want %s (%s)", name,
                             tr->config_key, db_trial_status_str(tr->status),
                             db_trial_status_str(cases[i].want), tr->error);
                cr_assert(tr->error[0], "%s %s: no error text", name, tr->config_key);
            } else {
                cr_assert(tr->status == DB_TRIAL_OK || tr->status == DB_TRIAL_SKIPPED,
                          "%s %s: correct config has status %s (%s)", name, tr->config_key,
                          db_trial_status_str(tr->status), tr->error);
            }
        }
        const tune_m_report *mr = &rep->jobs[i].m[0];
        cr_assert(mr->has_winner, "%s has no winner", name);
        cr_assert(strncmp(mr->best_key, "V=2,", 4) != 0, "%s: faulty config %s won", name,
                  mr->best_key);
        cr_assert(strstr(mr->best_key, "SPIN=1"), "%s: %s won over less work", name,
                  mr->best_key);
        cr_assert_eq(mr->deterministic, 1, "%s: winner not deterministic", name);
    }
    /* The crash names its signal (SIGSEGV; SIGABRT under AddressSanitizer,
     * whose handler reports the fault and aborts). */
    tt_read_trials(db, "tfault_segv", ts);
    const tt_trial *crash = tt_find(ts, NULL, 2, "V=2,SPIN=1,PAD=1");
    cr_assert_not_null(crash);
    cr_assert(strstr(crash->error, "signal 11") || strstr(crash->error, "signal 6"),
              "crash text: %s", crash->error);
    free(ts);
    tune_report_free(rep);
}

Test(tune_faults, wrong_results_never_win_even_when_fastest, .timeout = 60)
{
    /* tfault_wrong's V=2 does the same work as the others, so it would be
     * among the fastest; it must still be recorded wrong and never win.
     * Rerunning measures nothing and keeps the statuses. */
    char db[256];
    tt_db_path(db, sizeof db, "wrong.db");
    tune_job job;
    static const int64_t ms[] = {1, 3};
    cr_assert_eq(tune_job_make(&tfault_wrong, "N=300", ms, 2, &job, NULL), MT_OK);
    tune_opts o;
    tt_opts(&o, "cpu", db);
    o.timing.flush_cache = false;
    tune_report *rep = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(rep->jobs[0].m[i].counts[DB_TRIAL_WRONG_RESULT], 2);
        cr_assert(strncmp(rep->jobs[0].m[i].best_key, "V=2,", 4) != 0);
    }
    tune_report_free(rep);
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(tt_report_measured(rep), 0);
    tune_report_free(rep);
}
