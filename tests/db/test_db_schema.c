/* test_db_schema.c: schema creation, migration from the committed version-1,
 * version-2 and version-3 fixtures, and refusal of bad files (not a database, truncated, newer
 * schema, someone else's SQLite file) without changing a byte. */
#include "test_db_util.h"

#include <time.h>

static char dir[64], path[128];

static void setup(void)
{
    tmp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/t.db", dir);
}
static void teardown(void) { rm_tree(dir); }

TestSuite(db_schema, .init = setup, .fini = teardown);
TestSuite(db_bad_input, .init = setup, .fini = teardown);

Test(db_schema, fresh_file_gets_current_version_wal_and_all_tables)
{
    db_t *db = open_ok(path, DB_OPEN_DEFAULT);
    db_close(db);
    cr_assert_eq(sql_int(path, "PRAGMA user_version"), DB_SCHEMA_VERSION);
    cr_assert_eq(sql_int(path, "SELECT CAST(value AS INTEGER) FROM meta WHERE key='schema_version'"),
                 DB_SCHEMA_VERSION);
    cr_assert_eq(sql_int(path, "SELECT count(*) FROM meta WHERE key='uid' AND length(value)=16"), 1);
    static const char *const tables[] = {"meta",    "devices", "kernels", "sessions",
                                         "trials",  "winners", "misses",  "code_objects"};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        char sql[128];
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='%s'", tables[i]);
        cr_expect_eq(sql_int(path, sql), 1, "table %s missing", tables[i]);
    }
    /* WAL is persistent in the file header (bytes 18 and 19 are 2). */
    size_t n;
    unsigned char *h = (unsigned char *)slurp(path, &n);
    cr_assert(h && n >= 100);
    cr_expect_eq(h[18], 2);
    cr_expect_eq(h[19], 2);
    free(h);
}

Test(db_schema, reopening_keeps_data_and_changes_no_schema)
{
    db_t *db = open_ok(path, DB_OPEN_DEFAULT);
    db_device d = dev_mi210();
    int64_t id1 = device_id(db, &d);
    db_close(db);
    long long objects = sql_int(path, "SELECT count(*) FROM sqlite_master");
    db = open_ok(path, DB_OPEN_NOCREATE);
    cr_expect_eq(device_id(db, &d), id1);
    db_close(db);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM sqlite_master"), objects);
}

Test(db_schema, foreign_keys_are_enforced)
{
    db_t *db = open_ok(path, DB_OPEN_DEFAULT);
    db_trial t = ok_trial(999, 999, SHAPE_A, 16, "BM=16", "{\"BM\":16}", 0.5);
    mt_err e = MT_ERR_INIT;
    cr_expect_neq(db_trial_insert(db, &t, &e), MT_OK, "a trial of an unknown device was stored");
    cr_expect(strstr(e.msg, path), "message names the database: %s", e.msg);
    db_close(db);
}

/* Unix ms of "YYYY-MM-DDTHH:MM:SSZ", computed with libc as the reference. */
static long long iso_ms(const char *iso)
{
    struct tm tm = {0};
    cr_assert_not_null(strptime(iso, "%Y-%m-%dT%H:%M:%SZ", &tm), "%s", iso);
    return (long long)timegm(&tm) * 1000;
}

Test(db_schema, migrates_the_v1_fixture)
{
    char ref[160];
    snprintf(ref, sizeof ref, "%s/ref.db", dir);
    load_sql(DB_V1_FIXTURE, path);
    load_sql(DB_V1_FIXTURE, ref); /* untouched copy: the reference */
    cr_assert_eq(sql_int(path, "PRAGMA user_version"), 1);

    db_t *db = open_ok(path, DB_OPEN_DEFAULT);
    db_close(db);
    cr_assert_eq(sql_int(path, "PRAGMA user_version"), 6, "1 -> 2 -> 3 -> 4 -> 5 -> 6");
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM meta WHERE key='migrated_1_to_2_ms'"), 1);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM meta WHERE key='migrated_2_to_3_ms'"), 1);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM trials"), sql_int(ref, "SELECT count(*) FROM trials"));
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM devices"), sql_int(ref, "SELECT count(*) FROM devices"));

    /* Every status text maps to its persisted value; every time converts. */
    sqlite3 *r;
    cr_assert_eq(sqlite3_open_v2(ref, &r, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *s;
    cr_assert_eq(sqlite3_prepare_v2(r, "SELECT id, status, created_at FROM trials", -1, &s, NULL),
                 SQLITE_OK);
    int rows = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        long long id = sqlite3_column_int64(s, 0);
        db_trial_status want;
        cr_assert(db_trial_status_parse((const char *)sqlite3_column_text(s, 1), &want));
        char sql[160];
        snprintf(sql, sizeof sql, "SELECT status FROM trials WHERE id=%lld", id);
        cr_expect_eq(sql_int(path, sql), (long long)want, "trial %lld status", id);
        snprintf(sql, sizeof sql, "SELECT created_ms FROM trials WHERE id=%lld", id);
        cr_expect_eq(sql_int(path, sql), iso_ms((const char *)sqlite3_column_text(s, 2)),
                     "trial %lld time", id);
        rows++;
    }
    sqlite3_finalize(s);
    sqlite3_close(r);
    cr_expect_gt(rows, 0);

    /* Winners keep their config and gain the key of their trial. */
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM winners w JOIN trials t ON t.id = w.trial_id "
                               "WHERE w.config_key = t.config_key AND w.config_json = t.config_json"),
                 sql_int(ref, "SELECT count(*) FROM winners"));
    cr_expect_eq(sql_int(path, "SELECT count FROM misses"), 7);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM misses WHERE first_seen_ms > 0"), 1);

    /* The migrated database answers lookups by device model. */
    db = open_ok(path, DB_OPEN_READONLY);
    db_device d = dev_mi210();
    d.fingerprint = "a-fingerprint-v1-never-had";
    db_lookup_result res;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_lookup(db, &d, "moe_gemm", 1, HASH_A, SHAPE_A, 16, &res, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(res.provenance, DB_HIT_EXACT, "%s", res.message);
    cr_expect_str_eq(res.config_json, "{\"BM\":32,\"BN\":64}");
    cr_expect_eq(res.tuned_m, 16);
    db_close(db);

    char msg[256];
    bool ok;
    db = open_ok(path, DB_OPEN_DEFAULT);
    cr_assert_eq(db_integrity_check(db, &ok, msg, sizeof msg, &e), MT_OK, "%s", e.msg);
    cr_expect(ok, "%s", msg);
    db_close(db);
}

/* Rows of table in the migrated file (path) equal in the columns cols to
 * a row of the reference (ref) joined on the columns key. */
static long long same_rows(const char *ref, const char *table, const char *key,
                           const char *const *cols)
{
    sqlite3 *s;
    cr_assert_eq(sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    char sql[2048];
    snprintf(sql, sizeof sql, "ATTACH '%s' AS ref", ref);
    cr_assert_eq(sqlite3_exec(s, sql, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(s));
    int n = snprintf(sql, sizeof sql, "SELECT count(*) FROM %s t JOIN ref.%s r USING(%s) WHERE 1",
                     table, table, key);
    for (int i = 0; cols[i]; i++)
        n += snprintf(sql + n, sizeof sql - (size_t)n, " AND t.%s IS r.%s", cols[i], cols[i]);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, sql, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(s));
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    long long c = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(s);
    return c;
}

/* Rows of trials in the migrated file (path) equal to the same id in the
 * reference (ref) in every column but status and error. */
static long long same_trials(const char *ref)
{
    static const char *const cols[] = {
        "device_id", "kernel_id", "session_id", "shape", "m", "config_key", "config_json",
        "time_min_ms", "time_median_ms", "time_p10_ms", "time_p90_ms", "repetitions", "gflops",
        "gbps", "resources_json", "compile_ms", "created_ms", "origin", NULL};
    return same_rows(ref, "trials", "id", cols);
}

Test(db_schema, migrates_the_v2_fixture)
{
    char ref[160];
    snprintf(ref, sizeof ref, "%s/ref.db", dir);
    load_sql(DB_V2_FIXTURE, path);
    load_sql(DB_V2_FIXTURE, ref);
    cr_assert_eq(sql_int(path, "PRAGMA user_version"), 2);
    const long long n = sql_int(ref, "SELECT count(*) FROM trials");
    cr_assert_gt(n, 0);

    db_t *db = open_ok(path, DB_OPEN_DEFAULT);
    db_close(db);
    cr_assert_eq(sql_int(path, "PRAGMA user_version"), DB_SCHEMA_VERSION);
    cr_expect_eq(sql_int(path, "SELECT CAST(value AS INTEGER) FROM meta WHERE key='schema_version'"), DB_SCHEMA_VERSION);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM meta WHERE key='migrated_2_to_3_ms'"), 1);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM trials"), n);
    cr_expect_eq(same_trials(ref), n, "a column other than status/error changed");

    /* The compile-only trials v2 stored as skipped with the note are
     * compiled now; the abandoned skip and every other status stay. */
    cr_expect_eq(sql_int(ref, "SELECT count(*) FROM trials WHERE status = 6 AND "
                              "error = 'compile-only: compiled, not timed'"), 3);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM trials WHERE status = 7"), 3);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM trials WHERE status = 7 AND error IS NULL "
                               "AND time_median_ms IS NULL AND resources_json LIKE '%vgprs%'"), 3);
    cr_expect_eq(sql_int(path, "SELECT status FROM trials WHERE error LIKE 'abandoned%'"), 6);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM trials WHERE status NOT IN (6, 7)"),
                 sql_int(ref, "SELECT count(*) FROM trials WHERE status NOT IN (6, 7)"));

    /* Winners still point at their trials; the indexes are back. */
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM winners w JOIN trials t ON t.id = w.trial_id "
                               "AND t.config_key = w.config_key"),
                 sql_int(ref, "SELECT count(*) FROM winners"));
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM sqlite_master WHERE type='index' AND "
                               "name IN ('trials_by_kernel','trials_by_session')"), 2);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM sqlite_master WHERE name='trials_v3'"), 0);

    /* The new CHECK: 7 is stored through the API, 8 is refused by SQLite. */
    db = open_ok(path, DB_OPEN_DEFAULT);
    db_trial c = {.device_id = 2, .kernel_id = 2, .shape_key = "N=256", .m = 8,
                  .config_key = "THREADS=64,ROWS=1", .config_json = "{\"THREADS\":64,\"ROWS\":1}",
                  .status = DB_TRIAL_COMPILED, .time_min_ms = NAN, .time_median_ms = NAN,
                  .time_p10_ms = NAN, .time_p90_ms = NAN, .gflops = NAN, .gbps = NAN,
                  .compile_ms = NAN};
    insert_ok(db, &c);
    char msg[256];
    bool ok;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_integrity_check(db, &ok, msg, sizeof msg, &e), MT_OK, "%s", e.msg);
    cr_expect(ok, "%s", msg);
    db_close(db);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_expect_neq(sqlite3_exec(s, "UPDATE trials SET status = 8 WHERE id = 1", NULL, NULL, NULL),
                  SQLITE_OK, "status 8 passed the CHECK");
    sqlite3_close(s);
}

typedef struct v3_winners {
    int n, decided;
    char keys[4][64];
    int stale;
} v3_winners;

static int v3_winner_cb(void *arg, const db_winner_row *w)
{
    v3_winners *c = arg;
    if (c->n < 4)
        snprintf(c->keys[c->n], sizeof c->keys[0], "%s", w->config_key);
    c->n++;
    if (w->confirm.decision != DB_DECIDED_MEDIAN || w->confirm.rounds != 0 ||
        w->confirm.challenger_key || !isnan(w->confirm.ratio_hi))
        c->decided++;
    c->stale += w->stale;
    return 0;
}

/* 3 -> 4 -> 5: winners gain their decision, and every old winner is
 * "median" (never confirmed); then the stale mark, and no old winner is
 * stale; nothing else changes; a decision is then stored and survives a
 * plain recompute; db verify's stale mark is stored, read back, and
 * cleared when a tuning run decides the winner again. */
Test(db_schema, migrates_the_v3_fixture)
{
    char ref[160];
    snprintf(ref, sizeof ref, "%s/ref.db", dir);
    load_sql(DB_V3_FIXTURE, path);
    load_sql(DB_V3_FIXTURE, ref);
    cr_assert_eq(sql_int(path, "PRAGMA user_version"), 3);
    const long long nw = sql_int(ref, "SELECT count(*) FROM winners");
    cr_assert_eq(nw, 2);

    db_t *db = open_ok(path, DB_OPEN_DEFAULT);
    db_close(db);
    cr_assert_eq(sql_int(path, "PRAGMA user_version"), 6);
    cr_expect_eq(sql_int(path, "SELECT CAST(value AS INTEGER) FROM meta WHERE key='schema_version'"), 6);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM meta WHERE key='migrated_3_to_4_ms'"), 1);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM meta WHERE key='migrated_4_to_5_ms'"), 1);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM meta WHERE key='migrated_5_to_6_ms'"), 1);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM winners WHERE stale = 0"), nw);
    cr_expect_eq(same_trials(ref), sql_int(ref, "SELECT count(*) FROM trials"));
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM winners w JOIN trials t ON t.id = w.trial_id "
                               "AND t.config_key = w.config_key AND t.time_median_ms = w.time_ms"),
                 nw, "winners lost their trial or time");
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM winners WHERE decision = 0 AND challenger "
                               "IS NULL AND ratio IS NULL AND ratio_lo IS NULL AND ratio_hi IS "
                               "NULL AND confidence IS NULL AND rounds IS NULL"), nw);

    db = open_ok(path, DB_OPEN_DEFAULT);
    v3_winners c = {0};
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_winners_each(db, NULL, v3_winner_cb, &c, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(c.n, 2);
    cr_expect_eq(c.decided, 0, "an upgraded winner claims a decision");
    cr_expect_eq(c.stale, 0, "an upgraded winner is stale");
    cr_expect_str_eq(c.keys[0], "ROWS=16");

    /* db verify's mark: stored, read back, and a re-decision clears it. */
    cr_assert_eq(db_winner_verify(db, 1, 1, "N=256", 1, 0.5, true, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(db_winner_verify(db, 1, 1, "N=256", 99, 0.5, true, &e), MT_E_NOT_FOUND);
    cr_expect_eq(db_winner_verify(db, 1, 1, "N=256", 1, NAN, true, &e), MT_E_INVALID);
    v3_winners c2 = {0};
    cr_assert_eq(db_winners_each(db, NULL, v3_winner_cb, &c2, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(c2.stale, 1);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM winners WHERE m = 1 AND stale = 1 AND "
                               "verified_time_ms = 0.5 AND verified_ms > 0"), 1);

    /* The fixture's M=1 winner ROWS=16 was a lucky median: record that the
     * default (ROWS=1) won its confirmation; recompute must not undo it. */
    db_confirm kept = {.decision = DB_DECIDED_DEFAULT_KEPT, .challenger_key = "ROWS=16",
                       .ratio = 1.01, .ratio_lo = 0.97, .ratio_hi = 1.05, .confidence = 0.95,
                       .rounds = 10};
    cr_assert_eq(db_winner_decide(db, 1, 1, "N=256", 1, "ROWS=1", &kept, &e), MT_OK, "%s", e.msg);
    cr_assert_eq(db_winners_recompute(db, 0, 0, NULL, 0, NULL, &e), MT_OK, "%s", e.msg);
    db_close(db);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM winners WHERE m = 1 AND config_key = "
                               "'ROWS=1' AND decision = 2 AND challenger = 'ROWS=16' AND "
                               "rounds = 10 AND ratio_hi = 1.05 AND stale = 0"), 1);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_expect_neq(sqlite3_exec(s, "UPDATE winners SET decision = 4", NULL, NULL, NULL), SQLITE_OK,
                  "decision 4 passed the CHECK");
    cr_expect_neq(sqlite3_exec(s, "UPDATE winners SET stale = 2", NULL, NULL, NULL), SQLITE_OK,
                  "stale 2 passed the CHECK");
    sqlite3_close(s);
}

typedef struct v5_miss {
    int n, with_run;
    char family[64], shape[256], run[256];
    char arch[64], name[128], rt[64], drv[64], fp[128];
    db_device dev;
    long long m, count, first_count;
} v5_miss;

static int v5_miss_cb(void *ctx, const db_miss_row *r)
{
    v5_miss *x = ctx;
    if (x->n++ == 0) {
        snprintf(x->family, sizeof x->family, "%s", r->family);
        snprintf(x->shape, sizeof x->shape, "%s", r->shape_key);
        x->m = r->m;
        x->first_count = r->count;
        snprintf(x->arch, sizeof x->arch, "%s", r->device.arch);
        snprintf(x->name, sizeof x->name, "%s", r->device.name);
        snprintf(x->rt, sizeof x->rt, "%s", r->device.runtime_version);
        snprintf(x->drv, sizeof x->drv, "%s", r->device.driver_version);
        snprintf(x->fp, sizeof x->fp, "%s", r->device.fingerprint);
        x->dev = (db_device){r->device.backend, x->arch, x->name, x->rt, x->drv, x->fp,
                             r->device.compute_units};
    }
    if (r->shape_run) {
        x->with_run++;
        snprintf(x->run, sizeof x->run, "%s", r->shape_run);
        x->count = r->count;
    }
    return 0;
}

/* 5 -> 6: misses gain the shape the runtime ran, none for every miss a
 * version-5 runtime recorded (tune --misses then times the family's first
 * preset's runtime dims, as before); nothing else changes; a miss the
 * runtime records after the upgrade keeps its runtime shape. */
Test(db_schema, migrates_the_v5_fixture)
{
    char ref[160];
    snprintf(ref, sizeof ref, "%s/ref.db", dir);
    load_sql(DB_V5_FIXTURE, path);
    load_sql(DB_V5_FIXTURE, ref);
    cr_assert_eq(sql_int(path, "PRAGMA user_version"), 5);
    const long long nm = sql_int(ref, "SELECT count(*) FROM misses");
    const long long nw = sql_int(ref, "SELECT count(*) FROM winners");
    const long long nt = sql_int(ref, "SELECT count(*) FROM trials");
    cr_assert_gt(nm, 10, "the fixture's misses: %lld", nm);
    cr_assert_gt(nw, 0);

    db_t *db = open_ok(path, DB_OPEN_DEFAULT);
    db_close(db);
    cr_assert_eq(sql_int(path, "PRAGMA user_version"), 6);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM meta WHERE key='migrated_5_to_6_ms'"), 1);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM misses WHERE shape_run IS NULL"), nm);
    static const char *const miss_cols[] = {"count", "first_seen_ms", "last_seen_ms",
                                            "last_reason", NULL};
    cr_expect_eq(same_rows(ref, "misses", "device_id, family, shape, m", miss_cols), nm);
    static const char *const winner_cols[] = {
        "trial_id", "config_key", "config_json", "time_ms", "runner_ups", "updated_ms",
        "verified_ms", "verified_time_ms", "origin", "decision", "challenger", "ratio",
        "ratio_lo", "ratio_hi", "confidence", "rounds", "stale", NULL};
    cr_expect_eq(same_rows(ref, "winners", "device_id, kernel_id, shape, m", winner_cols), nw);
    cr_expect_eq(same_trials(ref), nt);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM trials"), nt);

    /* The runtime records the same miss again, with the shape it ran. */
    db = open_ok(path, DB_OPEN_DEFAULT);
    v5_miss x = {0};
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_misses_each(db, NULL, v5_miss_cb, &x, &e), MT_OK, "%s", e.msg);
    cr_assert_eq(x.n, nm);
    cr_expect_eq(x.with_run, 0);
    char run[300];
    snprintf(run, sizeof run, "%s,C=77", x.shape);
    db_lookup_result r;
    memset(&r, 0, sizeof r);
    r.provenance = DB_MISS;
    cr_assert_eq(db_lookup_record_miss(db, &x.dev, x.family, x.shape, run, x.m, &r, &e), MT_OK,
                 "%s", e.msg);
    v5_miss y = {0};
    cr_assert_eq(db_misses_each(db, NULL, v5_miss_cb, &y, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(y.n, nm, "the same miss again is no new row");
    cr_expect_eq(y.with_run, 1);
    cr_expect_str_eq(y.run, run);
    cr_expect_eq(y.count, x.first_count + 1);
    db_close(db);
}

Test(db_schema, readonly_open_of_v3_upgrades_a_memory_copy_only)
{
    load_sql(DB_V3_FIXTURE, path);
    size_t n0, n1;
    char *before = slurp(path, &n0);
    db_t *db = open_ok(path, DB_OPEN_READONLY);
    db_stats st;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_stats_get(db, &st, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(st.schema_version, DB_SCHEMA_VERSION);
    cr_expect_eq(st.winners, 2);
    v3_winners c = {0};
    cr_assert_eq(db_winners_each(db, NULL, v3_winner_cb, &c, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(c.n, 2);
    db_close(db);
    char *after = slurp(path, &n1);
    cr_assert(n0 == n1 && !memcmp(before, after, n0), "read-only open changed the file");
    cr_expect_eq(sql_int(path, "PRAGMA user_version"), 3);
    free(before);
    free(after);
}

Test(db_schema, readonly_open_of_v2_upgrades_a_memory_copy_only)
{
    load_sql(DB_V2_FIXTURE, path);
    size_t n0, n1;
    char *before = slurp(path, &n0);
    db_t *db = open_ok(path, DB_OPEN_READONLY);
    db_stats st;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_stats_get(db, &st, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(st.schema_version, DB_SCHEMA_VERSION);
    cr_expect_eq(st.trials_by_status[DB_TRIAL_COMPILED], 3);
    cr_expect_eq(st.trials_by_status[DB_TRIAL_SKIPPED], 1);
    db_close(db);
    char *after = slurp(path, &n1);
    cr_assert(n0 == n1 && !memcmp(before, after, n0), "read-only open changed the file");
    cr_expect_eq(sql_int(path, "PRAGMA user_version"), 2);
    free(before);
    free(after);
}

Test(db_schema, readonly_open_of_v1_upgrades_a_memory_copy_only)
{
    load_sql(DB_V1_FIXTURE, path);
    size_t n0, n1;
    char *before = slurp(path, &n0);
    db_t *db = open_ok(path, DB_OPEN_READONLY);
    db_stats st;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_stats_get(db, &st, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(st.schema_version, DB_SCHEMA_VERSION);
    cr_expect_eq(st.trials, 8);
    db_device d = dev_mi210();
    int64_t id;
    cr_expect_neq(db_device_upsert(db, &(db_device){.backend = 0, .arch = "x", .fingerprint = "new"},
                                   &id, &e),
                  MT_OK, "a read-only handle accepted a write");
    (void)d;
    db_close(db);
    char *after = slurp(path, &n1);
    cr_assert(n0 == n1 && !memcmp(before, after, n0), "read-only open changed the file");
    cr_expect_eq(sql_int(path, "PRAGMA user_version"), 1);
    free(before);
    free(after);
}

Test(db_schema, failed_migration_leaves_the_file_unchanged)
{
    load_sql(DB_V1_FIXTURE, path);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(s, "UPDATE trials SET status='exploded' WHERE id=3", NULL, NULL, NULL),
                 SQLITE_OK);
    sqlite3_close(s);
    size_t n0, n1;
    char *before = slurp(path, &n0);
    db_t *db = NULL;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_open(path, DB_OPEN_DEFAULT, &db, &e), MT_E_FORMAT, "%s", e.msg);
    cr_assert_null(db);
    cr_expect(strstr(e.msg, "exploded") && strstr(e.msg, path), "%s", e.msg);
    char *after = slurp(path, &n1);
    cr_expect(n0 == n1 && !memcmp(before, after, n0), "failed upgrade changed the file");
    cr_expect_eq(sql_int(path, "PRAGMA user_version"), 1);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM sqlite_master WHERE name='sessions'"), 0);
    free(before);
    free(after);
}

/* ---- bad input: clear error, file unchanged ------------------------------ */

static void expect_refused(const char *p, db_open_flags flags, mt_status want, const char *word)
{
    size_t n0, n1;
    char *before = slurp(p, &n0);
    cr_assert_not_null(before);
    db_t *db = NULL;
    mt_err e = MT_ERR_INIT;
    mt_status st = db_open(p, flags, &db, &e);
    cr_expect_eq(st, want, "status %s, message: %s", mt_status_str(st), e.msg);
    cr_expect_null(db);
    cr_expect(strstr(e.msg, p) != NULL, "message does not name the file: %s", e.msg);
    cr_expect(strstr(e.msg, word) != NULL, "message lacks '%s': %s", word, e.msg);
    char *after = slurp(p, &n1);
    cr_assert_not_null(after);
    cr_expect(n0 == n1 && !memcmp(before, after, n0), "file changed (%zu -> %zu bytes)", n0, n1);
    free(before);
    free(after);
}

Test(db_bad_input, a_file_that_is_not_a_database)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    size_t n = 600 + mt_rng_below(&r, 9000);
    char *junk = malloc(n);
    for (size_t i = 0; i < n; i++)
        junk[i] = (char)(' ' + mt_rng_below(&r, 90));
    write_bytes(path, junk, n);
    free(junk);
    cr_log_info("seed %llu", (unsigned long long)seed);
    expect_refused(path, DB_OPEN_DEFAULT, MT_E_FORMAT, "not a moetune database");
    expect_refused(path, DB_OPEN_READONLY, MT_E_FORMAT, "not a moetune database");
    write_bytes(path, "SQLite", 6); /* shorter than any header */
    expect_refused(path, DB_OPEN_DEFAULT, MT_E_FORMAT, "not a moetune database");
}

/* A database big enough to span many pages, checkpointed into the file. */
static void make_populated(const char *p)
{
    db_t *db = open_ok(p, DB_OPEN_DEFAULT);
    db_device d = dev_mi210();
    int64_t dv = device_id(db, &d), k = kernel_id(db, "moe_gemm", 1, HASH_A);
    db_trial ts[400];
    char keys[400][32];
    for (int i = 0; i < 400; i++) {
        snprintf(keys[i], sizeof keys[i], "BM=%d,BN=%d", 16 << (i % 4), i);
        ts[i] = ok_trial(dv, k, SHAPE_A, 16, keys[i], "{\"BM\":16,\"padding\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}",
                         0.1 + i);
    }
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_trials_insert(db, ts, 400, &e), MT_OK, "%s", e.msg);
    db_close(db); /* the last close checkpoints and removes the WAL */
    char wal[160];
    snprintf(wal, sizeof wal, "%s-wal", p);
    cr_assert_neq(access(wal, F_OK), 0, "WAL left behind");
}

Test(db_bad_input, a_truncated_file)
{
    make_populated(path);
    size_t n;
    char *full = slurp(path, &n);
    cr_assert_gt(n, 16384u);
    write_bytes(path, full, n / 2); /* whole pages missing */
    expect_refused(path, DB_OPEN_DEFAULT, MT_E_FORMAT, "truncated");
    expect_refused(path, DB_OPEN_READONLY, MT_E_FORMAT, "truncated");
    write_bytes(path, full, n - 1000); /* cut inside a page */
    expect_refused(path, DB_OPEN_DEFAULT, MT_E_FORMAT, "truncated");
    free(full);
}

Test(db_bad_input, a_newer_schema)
{
    make_populated(path);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    char sql[96];
    snprintf(sql, sizeof sql, "PRAGMA journal_mode=DELETE; PRAGMA user_version=%d",
             DB_SCHEMA_VERSION + 1);
    cr_assert_eq(sqlite3_exec(s, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(s);
    expect_refused(path, DB_OPEN_DEFAULT, MT_E_UNSUPPORTED, "newer");
    expect_refused(path, DB_OPEN_READONLY, MT_E_UNSUPPORTED, "newer");
}

Test(db_bad_input, someone_elses_sqlite_database)
{
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(path, &s), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(s, "CREATE TABLE notes(x); INSERT INTO notes VALUES(1)", NULL, NULL,
                              NULL),
                 SQLITE_OK);
    sqlite3_close(s);
    expect_refused(path, DB_OPEN_DEFAULT, MT_E_FORMAT, "not a moetune one");
}

Test(db_bad_input, missing_file_is_not_created_when_asked_not_to)
{
    db_t *db = NULL;
    mt_err e = MT_ERR_INIT;
    cr_expect_eq(db_open(path, DB_OPEN_READONLY, &db, &e), MT_E_NOT_FOUND, "%s", e.msg);
    cr_expect_eq(db_open(path, DB_OPEN_NOCREATE, &db, &e), MT_E_NOT_FOUND, "%s", e.msg);
    cr_expect_neq(access(path, F_OK), 0, "file was created");
}
