/* db_stmt.c: running SQL. The statements cached on every handle (see
 * db_stmt_id) and db_stmt, which prepares them once; db_exec, db_scalar and
 * db_rows_each for one-off SQL; the binding and column helpers; db_now_ms,
 * the clock every stored time comes from.
 *
 * The cached statements' parameters are numbered; the lookup statements
 * share one numbering: ?1 family, ?2 version, ?3 source hash, ?4 shape, ?5 m,
 * ?6 backend, ?7 arch, ?8 device name, ?9 compute units, ?10 fingerprint
 * (a statement that does not filter on one still names it, so that every
 * index is bound). The lookups have no ORDER BY: db_lookup.c picks the
 * preferred row itself, which saves SQLite a sort per lookup. */
#include <math.h>
#include <time.h>

#include "db_impl.h"

#define LOOKUP_COLUMNS                                                                   \
    "SELECT w.config_json, w.config_key, w.m, w.time_ms, d.name, d.compute_units, "     \
    "d.fingerprint, d.runtime_version, w.stale "                                         \
    "FROM kernels k JOIN winners w ON w.kernel_id = k.id JOIN devices d ON d.id = w.device_id "

static const char *const stmt_sql[ST_STMT_COUNT] = {
    [ST_DEVICE_UPSERT] =
        "INSERT INTO devices(fingerprint, backend, arch, name, compute_units, runtime_version, "
        "driver_version) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7) "
        "ON CONFLICT(fingerprint) DO UPDATE SET backend = excluded.backend, "
        "arch = excluded.arch, name = excluded.name, compute_units = excluded.compute_units, "
        "runtime_version = excluded.runtime_version, driver_version = excluded.driver_version",
    [ST_DEVICE_BY_FP] =
        "SELECT id, backend, arch, name, compute_units, runtime_version, driver_version "
        "FROM devices WHERE fingerprint = ?1",
    [ST_KERNEL_UPSERT] =
        "INSERT INTO kernels(family, version, source_hash) VALUES(?1, ?2, ?3) "
        "ON CONFLICT DO NOTHING",
    [ST_KERNEL_ID] = "SELECT id FROM kernels WHERE family = ?1 AND version = ?2 AND source_hash = ?3",
    [ST_TRIAL_UPSERT] =
        "INSERT INTO trials(device_id, kernel_id, session_id, shape, m, config_key, config_json, "
        "status, time_min_ms, time_median_ms, time_p10_ms, time_p90_ms, repetitions, gflops, "
        "gbps, resources_json, error, compile_ms, created_ms, origin) "
        "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, "
        "?19, ?20) "
        "ON CONFLICT(device_id, kernel_id, shape, m, config_key) DO UPDATE SET "
        "session_id = excluded.session_id, config_json = excluded.config_json, "
        "status = excluded.status, time_min_ms = excluded.time_min_ms, "
        "time_median_ms = excluded.time_median_ms, time_p10_ms = excluded.time_p10_ms, "
        "time_p90_ms = excluded.time_p90_ms, repetitions = excluded.repetitions, "
        "gflops = excluded.gflops, gbps = excluded.gbps, "
        "resources_json = excluded.resources_json, error = excluded.error, "
        "compile_ms = excluded.compile_ms, created_ms = excluded.created_ms, "
        "origin = excluded.origin",
    [ST_TRIAL_GET] =
        "SELECT id, status, time_median_ms FROM trials WHERE device_id = ?1 AND kernel_id = ?2 "
        "AND shape = ?3 AND m = ?4 AND config_key = ?5",
    [ST_WINNER_UPSERT] =
        "INSERT INTO winners(device_id, kernel_id, shape, m, trial_id, config_key, config_json, "
        "time_ms, runner_ups, updated_ms, verified_ms, verified_time_ms, origin, decision, "
        "challenger, ratio, ratio_lo, ratio_hi, confidence, rounds) "
        "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, "
        "?18, ?19, ?20) "
        "ON CONFLICT(device_id, kernel_id, shape, m) DO UPDATE SET "
        "trial_id = excluded.trial_id, config_key = excluded.config_key, "
        "config_json = excluded.config_json, time_ms = excluded.time_ms, "
        "runner_ups = excluded.runner_ups, updated_ms = excluded.updated_ms, "
        "verified_ms = excluded.verified_ms, verified_time_ms = excluded.verified_time_ms, "
        "origin = excluded.origin, decision = excluded.decision, "
        "challenger = excluded.challenger, ratio = excluded.ratio, "
        "ratio_lo = excluded.ratio_lo, ratio_hi = excluded.ratio_hi, "
        "confidence = excluded.confidence, rounds = excluded.rounds, stale = 0",
    [ST_WINNER_GET] =
        "SELECT config_key, time_ms, verified_ms, verified_time_ms, runner_ups, decision, "
        "ratio_hi, coalesce(rounds, 0), challenger FROM winners "
        "WHERE device_id = ?1 AND kernel_id = ?2 AND shape = ?3 AND m = ?4",
    [ST_LOOKUP_EXACT] =
        LOOKUP_COLUMNS
        "WHERE k.family = ?1 AND k.version = ?2 AND k.source_hash = ?3 AND w.shape = ?4 "
        "AND w.m = ?5 AND d.backend = ?6 AND d.arch = ?7 AND d.name = ?8 "
        "AND d.compute_units = ?9 AND ?10 IS NOT NULL",
    /* Only the tuned Ms, read from the covering index winners_by_kernel;
     * the row itself is then fetched with ST_LOOKUP_EXACT. */
    [ST_LOOKUP_SHAPE] =
        "SELECT w.m FROM kernels k JOIN winners w ON w.kernel_id = k.id "
        "JOIN devices d ON d.id = w.device_id "
        "WHERE k.family = ?1 AND k.version = ?2 AND k.source_hash = ?3 AND w.shape = ?4 "
        "AND d.backend = ?6 AND d.arch = ?7 AND d.name = ?8 AND d.compute_units = ?9 "
        "AND ?5 > 0 AND ?10 IS NOT NULL",
    [ST_LOOKUP_OTHER] =
        LOOKUP_COLUMNS
        "WHERE k.family = ?1 AND k.version = ?2 AND k.source_hash = ?3 AND w.shape = ?4 "
        "AND d.backend = ?6 AND d.arch = ?7 AND NOT (d.name = ?8 AND d.compute_units = ?9) "
        "AND ?5 > 0 AND ?10 IS NOT NULL",
    [ST_LOOKUP_STALE] =
        "SELECT k.version, k.source_hash, count(*) FROM kernels k "
        "JOIN winners w ON w.kernel_id = k.id JOIN devices d ON d.id = w.device_id "
        "WHERE k.family = ?1 AND NOT (k.version = ?2 AND k.source_hash = ?3) AND w.shape = ?4 "
        "AND d.backend = ?6 AND d.arch = ?7 AND ?5 > 0 AND ?8 IS NOT NULL "
        "AND ?9 IS NOT NULL AND ?10 IS NOT NULL "
        "GROUP BY k.version, k.source_hash ORDER BY max(w.updated_ms) DESC LIMIT 1",
    [ST_MISS_UPSERT] =
        "INSERT INTO misses(device_id, family, shape, m, count, first_seen_ms, last_seen_ms, "
        "last_reason, shape_run) VALUES(?1, ?2, ?3, ?4, 1, ?5, ?5, ?6, ?7) "
        "ON CONFLICT(device_id, family, shape, m) DO UPDATE SET count = count + 1, "
        "last_seen_ms = max(last_seen_ms, excluded.last_seen_ms), "
        "last_reason = excluded.last_reason, "
        "shape_run = coalesce(excluded.shape_run, shape_run)",
    [ST_SESSION_BY_UID] = "SELECT id FROM sessions WHERE uid = ?1",
};
_Static_assert(sizeof stmt_sql / sizeof stmt_sql[0] == ST_STMT_COUNT, "one SQL per statement id");

const char *db_stmt_sql(db_stmt_id id) { return stmt_sql[id]; }

/* ---- statements --------------------------------------------------------- */

mt_status db_stmt(db_t *db, db_stmt_id id, sqlite3_stmt **out, mt_err *err)
{
    *out = NULL;
    sqlite3_stmt *s = db->stmts[id];
    if (!s) {
        int rc = sqlite3_prepare_v3(db->sql, db_stmt_sql(id), -1, SQLITE_PREPARE_PERSISTENT,
                                    &s, NULL);
        if (rc != SQLITE_OK)
            return DB_FAIL(db, err, rc, "preparing a cached statement");
        db->stmts[id] = s;
    } else {
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
    }
    *out = s;
    return MT_OK;
}

int db_bind_text(sqlite3_stmt *s, int i, const char *v)
{
    return v ? sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC) : sqlite3_bind_null(s, i);
}

int db_bind_real(sqlite3_stmt *s, int i, double v)
{
    return isfinite(v) ? sqlite3_bind_double(s, i, v) : sqlite3_bind_null(s, i);
}

const char *db_col_text(sqlite3_stmt *s, int i)
{
    return (const char *)sqlite3_column_text(s, i);
}

double db_col_real(sqlite3_stmt *s, int i)
{
    return sqlite3_column_type(s, i) == SQLITE_NULL ? NAN : sqlite3_column_double(s, i);
}

/* ---- one-off SQL --------------------------------------------------------- */

int64_t db_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

mt_status db_exec(db_t *db, const char *sql, mt_err *err)
{
    int rc = sqlite3_exec(db->sql, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, sql);
    return MT_OK;
}

mt_status db_scalar(db_t *db, const char *sql, int64_t param, int64_t *out, mt_err *err)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        if (sqlite3_bind_parameter_count(s) > 0)
            sqlite3_bind_int64(s, 1, param);
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            *out = sqlite3_column_int64(s, 0);
            rc = SQLITE_DONE;
        }
        sqlite3_finalize(s);
    }
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, sql);
    return MT_OK;
}

mt_status db_rows_each(db_t *db, const char *sql, const db_filter *f, db_row_fn row,
                       void *ctx, const char *what, mt_err *err)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql, sql, -1, &s, NULL);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, what);
    if (sqlite3_bind_parameter_count(s) > 0) {
        static const db_filter all = {0};
        if (!f)
            f = &all;
        db_bind_text(s, 1, f->family);
        db_bind_text(s, 2, f->shape_key);
        sqlite3_bind_int64(s, 3, f->m);
        db_bind_text(s, 4, f->device);
        if (sqlite3_bind_parameter_count(s) >= 6) {
            sqlite3_bind_int(s, 5, f->version);
            db_bind_text(s, 6, f->source_hash);
        }
    }
    mt_status st = MT_OK;
    bool stop = false;
    while (st == MT_OK && !stop && (rc = sqlite3_step(s)) == SQLITE_ROW)
        st = row(s, ctx, &stop, err);
    sqlite3_finalize(s);
    if (st == MT_OK && !stop && rc != SQLITE_DONE)
        st = DB_FAIL(db, err, rc, what);
    return st;
}
