/* test_tune_sigint.c: Ctrl-C during tuning. A forked tuner gets SIGINT
 * once a few trials are stored; it stops cleanly (interrupted status), the
 * database passes PRAGMA integrity_check with the session marked
 * interrupted, and running the same job again measures only what was
 * missing and completes. */
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <time.h>

#include "test_tune_families.h"
#include "test_tune_util.h"

static volatile sig_atomic_t stop_flag;
static void on_sigint(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static const int64_t ms[] = {1, 2, 3, 4};

static void job_and_opts(tune_job *job, tune_opts *o, const char *db)
{
    cr_assert_eq(tune_job_make(&tspin, "N=256", ms, 4, job, NULL), MT_OK);
    tt_opts(o, "cpu", db);
    o->timing.flush_cache = false;
    o->timing.min_reps = 10; /* slow enough to be caught mid-run */
    o->timing.max_reps = 10;
    o->timing.target_spread = 0;
}

static int64_t count_trials(const char *db)
{
    sqlite3 *h = NULL;
    int64_t n = -1;
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(h, 2000);
        sqlite3_stmt *s = NULL;
        if (sqlite3_prepare_v2(h, "SELECT count(*) FROM trials", -1, &s, NULL) == SQLITE_OK &&
            sqlite3_step(s) == SQLITE_ROW)
            n = sqlite3_column_int64(s, 0);
        sqlite3_finalize(s);
    }
    sqlite3_close(h);
    return n;
}

static void session_statuses(const char *db, char *out, size_t cap)
{
    sqlite3 *h = NULL;
    out[0] = 0;
    cr_assert_eq(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *s = NULL;
    cr_assert_eq(sqlite3_prepare_v2(h, "SELECT status FROM sessions ORDER BY id", -1, &s, NULL),
                 SQLITE_OK, "%s", sqlite3_errmsg(h));
    while (sqlite3_step(s) == SQLITE_ROW) {
        size_t l = strlen(out);
        db_session_status st = (db_session_status)sqlite3_column_int(s, 0);
        snprintf(out + l, cap - l, "%s%s", l ? "," : "", db_session_status_str(st));
    }
    sqlite3_finalize(s);
    sqlite3_close(h);
}

Test(tune_sigint, interrupted_run_leaves_a_consistent_database_and_resumes, .timeout = 180)
{
    char db[256];
    tt_db_path(db, sizeof db, "sigint.db");
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigint;
        sigaction(SIGINT, &sa, NULL);
        tune_job job;
        tune_opts o;
        job_and_opts(&job, &o, db);
        o.stop = &stop_flag;
        mt_status st = tune_run(&job, 1, &o, NULL, NULL);
        _exit(st == MT_E_INTERRUPTED ? 42 : st == MT_OK ? 0 : 1);
    }
    /* Wait for a few stored trials, then Ctrl-C. */
    int64_t n = 0;
    for (int i = 0; i < 600 && n < 4; i++) {
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
        n = count_trials(db);
    }
    cr_assert_geq(n, 4, "the tuner stored %lld trials in 30 s", (long long)n);
    kill(pid, SIGINT);
    int ws = 0;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFEXITED(ws), "the tuner did not exit cleanly (status 0x%x)", ws);
    cr_assert_eq(WEXITSTATUS(ws), 42, "tune_run did not report the interruption (exit %d)",
                 WEXITSTATUS(ws));

    db_t *h = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(db_open(db, DB_OPEN_READONLY, &h, &err), MT_OK, "%s", err.msg);
    bool ok = false;
    char msg[256] = "";
    cr_assert_eq(db_integrity_check(h, &ok, msg, sizeof msg, &err), MT_OK, "%s", err.msg);
    cr_assert(ok, "integrity_check: %s", msg);
    db_close(h);
    char ss[256];
    session_statuses(db, ss, sizeof ss);
    cr_assert_str_eq(ss, "interrupted");
    int64_t before = count_trials(db);
    const int64_t space = (int64_t)kern_space_size(tspin.cpu);
    cr_assert(before < 4 * space, "the interrupted run finished everything (%lld)",
              (long long)before);

    /* The same job again completes, measuring only what is missing. */
    tune_job job;
    tune_opts o;
    job_and_opts(&job, &o, db);
    tune_report *rep = NULL;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    int64_t after = count_trials(db);
    cr_assert_eq(after, 4 * space, "%lld trials after resuming (space %lld, 4 M)",
                 (long long)after, (long long)space);
    cr_assert_eq(tt_report_measured(rep), after - before, "resumed run measured %d, missing %lld",
                 tt_report_measured(rep), (long long)(after - before));
    for (int i = 0; i < 4; i++)
        cr_assert(rep->jobs[0].m[i].has_winner);
    tune_report_free(rep);
    session_statuses(db, ss, sizeof ss);
    cr_assert_str_eq(ss, "interrupted,done");
}
