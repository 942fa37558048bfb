/* test_db_concurrency.c: several processes on one file. Four writers that
 * start together (on a file none of them has created yet) each store 1000
 * trials one transaction at a time; a writer killed with SIGKILL inside a
 * transaction leaves a sound database with every committed trial. */
#include "test_db_util.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>

static char dir[64], path[128];

static void setup(void)
{
    tmp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/shared.db", dir);
}
static void teardown(void) { rm_tree(dir); }

TestSuite(db_concurrency, .init = setup, .fini = teardown, .timeout = 120);

enum { WRITERS = 4, PER_WRITER = 1000 };

/* Child body: waits on the start pipe, then writes; reports the first
 * failure on the error pipe. Never returns. */
static void writer(int id, int start_fd, int err_fd)
{
    char c;
    if (read(start_fd, &c, 1) < 0)
        _exit(3);
    db_t *db = NULL;
    mt_err e = MT_ERR_INIT;
    int64_t dv = 0, kr = 0;
    db_device d = dev_mi210();
    db_kernel k = {"moe_gemm", 1, HASH_A};
    mt_status st = db_open(path, DB_OPEN_DEFAULT, &db, &e);
    if (st == MT_OK)
        st = db_device_upsert(db, &d, &dv, &e);
    if (st == MT_OK)
        st = db_kernel_upsert(db, &k, &kr, &e);
    for (int i = 0; st == MT_OK && i < PER_WRITER; i++) {
        char key[32], json[48];
        snprintf(key, sizeof key, "W=%d,I=%d", id, i);
        snprintf(json, sizeof json, "{\"W\":%d,\"I\":%d}", id, i);
        db_trial t = ok_trial(dv, kr, SHAPE_A, 1 + i % 8, key, json, 0.5 + i);
        st = db_trial_insert(db, &t, &e);
        if (st == MT_OK && i % 100 == 99) /* readers in between writers */
            st = db_winners_recompute(db, dv, kr, SHAPE_A, 1 + i % 8, NULL, &e);
    }
    db_close(db);
    if (st != MT_OK) {
        char msg[MT_ERR_MSG_MAX + 32];
        int n = snprintf(msg, sizeof msg, "writer %d: %s\n", id, e.msg);
        if (write(err_fd, msg, (size_t)n) < 0)
            _exit(4);
        _exit(1);
    }
    _exit(0);
}

Test(db_concurrency, four_writers_store_everything_without_lock_errors)
{
    int start[2], errs[2];
    cr_assert_eq(pipe(start), 0);
    cr_assert_eq(pipe(errs), 0);
    pid_t pids[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        pids[w] = fork();
        cr_assert_geq(pids[w], 0);
        if (pids[w] == 0) {
            close(start[1]);
            close(errs[0]);
            writer(w, start[0], errs[1]);
        }
    }
    close(start[0]);
    close(errs[1]);
    close(start[1]); /* EOF releases every writer at once */
    int failed = 0;
    for (int w = 0; w < WRITERS; w++) {
        int status;
        cr_assert_eq(waitpid(pids[w], &status, 0), pids[w]);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    char report[8192] = "";
    ssize_t n = read(errs[0], report, sizeof report - 1);
    report[n > 0 ? n : 0] = 0;
    close(errs[0]);
    cr_assert_eq(failed, 0, "%d writers failed:\n%s", failed, report);
    cr_expect_null(strstr(report, "locked"), "%s", report);

    cr_expect_eq(sql_int(path, "SELECT count(*) FROM trials"), WRITERS * PER_WRITER);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM devices"), 1);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM kernels"), 1);
    for (int w = 0; w < WRITERS; w++) {
        char sql[128];
        snprintf(sql, sizeof sql,
                 "SELECT count(DISTINCT config_key) FROM trials WHERE config_key LIKE 'W=%d,%%'", w);
        cr_expect_eq(sql_int(path, sql), PER_WRITER, "writer %d lost trials", w);
    }
    db_t *db = open_ok(path, DB_OPEN_DEFAULT);
    bool ok;
    char msg[256];
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_integrity_check(db, &ok, msg, sizeof msg, &e), MT_OK);
    cr_expect(ok, "%s", msg);
    db_close(db);
}

/* Child: commits batches, reporting each commit's total on the pipe, then
 * either opens a big transaction and waits to be killed inside it (mode 0)
 * or keeps committing until killed (mode 1). */
static void victim(int mode, int fd)
{
    db_t *db = NULL;
    mt_err e = MT_ERR_INIT;
    int64_t dv = 0, kr = 0;
    db_device d = dev_mi210();
    db_kernel k = {"moe_gemm", 1, HASH_A};
    if (db_open(path, DB_OPEN_DEFAULT, &db, &e) || db_device_upsert(db, &d, &dv, &e) ||
        db_kernel_upsert(db, &k, &kr, &e))
        _exit(2);
    enum { BATCH = 50 };
    static char keys[BATCH][32];
    db_trial ts[BATCH];
    int32_t total = 0;
    for (int b = 0; mode == 1 || b < 10; b++) {
        for (int i = 0; i < BATCH; i++) {
            snprintf(keys[i], sizeof keys[i], "B=%d,I=%d", b, i);
            ts[i] = ok_trial(dv, kr, SHAPE_A, 16, keys[i], "{\"x\":1}", 1.0 + i);
        }
        if (db_trials_insert(db, ts, BATCH, &e))
            _exit(3);
        total += BATCH;
        if (write(fd, &total, sizeof total) != sizeof total)
            _exit(4);
    }
    /* Mode 0: a large uncommitted transaction, spilling pages to the WAL. */
    if (db_begin(db, &e))
        _exit(5);
    for (int b = 0; b < 200; b++)
        for (int i = 0; i < BATCH; i++) {
            snprintf(keys[i], sizeof keys[i], "U=%d,I=%d", b, i);
            db_trial t = ok_trial(dv, kr, SHAPE_A, 32, keys[i],
                                  "{\"pad\":\"................................................\"}",
                                  1.0);
            if (db_trial_insert(db, &t, &e))
                _exit(6);
        }
    int32_t marker = -1;
    if (write(fd, &marker, sizeof marker) != sizeof marker)
        _exit(7);
    for (;;)
        pause();
}

/* Runs a victim, kills it, and returns the last committed total it reported. */
static int32_t run_and_kill(int mode, uint64_t delay_us)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(p[0]);
        victim(mode, p[1]);
    }
    close(p[1]);
    int32_t v, committed = 0;
    if (mode == 0) {
        while (read(p[0], &v, sizeof v) == sizeof v && v >= 0)
            committed = v;
        cr_assert_eq(v, -1, "victim never reached its open transaction");
    } else {
        while (committed < 100 && read(p[0], &v, sizeof v) == sizeof v)
            committed = v;
        usleep((useconds_t)delay_us);
    }
    kill(pid, SIGKILL);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "victim exited on its own: %d",
              status);
    while (read(p[0], &v, sizeof v) == sizeof v) /* reports written before the kill */
        if (v >= 0)
            committed = v;
    close(p[0]);
    return committed;
}

static void expect_sound(int32_t committed, int32_t slack)
{
    db_t *db = open_ok(path, DB_OPEN_DEFAULT);
    bool ok;
    char msg[256];
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_integrity_check(db, &ok, msg, sizeof msg, &e), MT_OK, "%s", e.msg);
    cr_expect(ok, "integrity_check: %s", msg);
    db_stats st;
    cr_assert_eq(db_stats_get(db, &st, &e), MT_OK);
    cr_expect_geq(st.trials, committed, "committed trials lost: %lld < %d",
                  (long long)st.trials, committed);
    cr_expect_leq(st.trials, committed + slack, "uncommitted trials present: %lld > %d",
                  (long long)st.trials, committed + slack);
    db_close(db);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM trials WHERE config_key LIKE 'U=%'"), 0);
}

Test(db_concurrency, sigkill_inside_a_transaction_keeps_committed_data)
{
    int32_t committed = run_and_kill(0, 0);
    cr_assert_eq(committed, 500);
    expect_sound(committed, 0);
    /* The file stays usable for writing. */
    db_t *db = open_ok(path, DB_OPEN_DEFAULT);
    db_device d = dev_mi210();
    db_trial t = ok_trial(device_id(db, &d), kernel_id(db, "moe_gemm", 1, HASH_A), SHAPE_A, 1,
                          "after", "{}", 0.1);
    insert_ok(db, &t);
    db_close(db);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM trials"), 501);
}

Test(db_concurrency, sigkill_at_a_random_moment_keeps_committed_data)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    cr_log_info("seed %llu", (unsigned long long)seed);
    for (int round = 0; round < 3; round++) {
        int32_t committed = run_and_kill(1, mt_rng_below(&rng, 20000));
        /* Killed between a commit and its report: one batch more is fine. */
        expect_sound(committed, 50);
        db_t *db = open_ok(path, DB_OPEN_DEFAULT);
        db_close(db);
        unlink(path);
    }
}
