/* db_query.c: read-only listings for the CLI and other modules: counts,
 * devices, trials and misses (winners are listed in db_winners.c). */
#include <math.h>
#include <string.h>

#include "db_impl.h"

void db_device_row_read(sqlite3_stmt *s, int first, db_device_row *row)
{
    row->id = sqlite3_column_int64(s, first);
    row->backend = sqlite3_column_int(s, first + 1);
    row->arch = db_col_text(s, first + 2);
    row->name = db_col_text(s, first + 3);
    row->runtime_version = db_col_text(s, first + 4);
    row->driver_version = db_col_text(s, first + 5);
    row->fingerprint = db_col_text(s, first + 6);
    row->compute_units = sqlite3_column_int(s, first + 7);
}

static mt_status count(db_t *db, const char *sql, int64_t *out, mt_err *err)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            *out = sqlite3_column_int64(s, 0);
            rc = SQLITE_OK;
        }
        sqlite3_finalize(s);
    }
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, sql);
    return MT_OK;
}

mt_status db_stats_get(db_t *db, db_stats *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    int64_t v = 0;
    mt_status st = count(db, "PRAGMA user_version", &v, err);
    out->schema_version = (int)v;
    struct {
        const char *sql;
        int64_t *dst;
    } q[] = {
        {"SELECT count(*) FROM devices", &out->devices},
        {"SELECT count(*) FROM kernels", &out->kernels},
        {"SELECT count(*) FROM sessions", &out->sessions},
        {"SELECT count(*) FROM trials", &out->trials},
        {"SELECT count(*) FROM winners", &out->winners},
        {"SELECT count(*) FROM winners WHERE verified_ms IS NOT NULL", &out->winners_verified},
        {"SELECT count(*) FROM misses", &out->misses},
        {"SELECT count(*) FROM code_objects", &out->code_objects},
    };
    for (size_t i = 0; st == MT_OK && i < sizeof q / sizeof q[0]; i++)
        st = count(db, q[i].sql, q[i].dst, err);
    if (st)
        return st;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql, "SELECT status, count(*) FROM trials GROUP BY status", -1,
                                &s, NULL);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, "counting trials");
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int k = sqlite3_column_int(s, 0);
        if (k >= 0 && k < DB_TRIAL_STATUS_COUNT)
            out->trials_by_status[k] = sqlite3_column_int64(s, 1);
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "counting trials");
    return MT_OK;
}

mt_status db_devices_each(db_t *db, db_device_fn fn, void *ctx, mt_err *err)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql,
                                "SELECT " DB_DEVICE_COLUMNS " FROM devices d ORDER BY d.fingerprint",
                                -1, &s, NULL);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, "listing devices");
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        db_device_row r;
        db_device_row_read(s, 0, &r);
        if (fn(ctx, &r))
            break;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "listing devices");
    return MT_OK;
}

mt_status db_trials_each(db_t *db, const db_filter *f, db_trial_fn fn, void *ctx, mt_err *err)
{
    db_filter none = {0};
    if (!f)
        f = &none;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(
        db->sql,
        "SELECT t.id, t.device_id, t.kernel_id, coalesce(t.session_id, 0), k.family, k.version, "
        "k.source_hash, se.uid, t.origin, t.shape, t.m, t.config_key, t.config_json, t.status, "
        "t.time_min_ms, t.time_median_ms, t.time_p10_ms, t.time_p90_ms, "
        "coalesce(t.repetitions, 0), t.gflops, t.gbps, t.resources_json, t.error, t.compile_ms, "
        "t.created_ms, " DB_DEVICE_COLUMNS " "
        "FROM trials t JOIN devices d ON d.id = t.device_id JOIN kernels k ON k.id = t.kernel_id "
        "LEFT JOIN sessions se ON se.id = t.session_id "
        "WHERE (?1 IS NULL OR k.family = ?1) AND (?2 IS NULL OR t.shape = ?2) "
        "AND (?3 <= 0 OR t.m = ?3) AND (?4 IS NULL OR d.fingerprint = ?4 OR d.name = ?4) "
        "ORDER BY d.fingerprint, k.family, k.version, k.source_hash, t.shape, t.m, "
        "t.status != 0, t.time_median_ms, t.config_key",
        -1, &s, NULL);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, "listing trials");
    db_bind_text(s, 1, f->family);
    db_bind_text(s, 2, f->shape_key);
    sqlite3_bind_int64(s, 3, f->m);
    db_bind_text(s, 4, f->device);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        db_trial_row r = {
            .id = sqlite3_column_int64(s, 0),
            .family = db_col_text(s, 4),
            .version = sqlite3_column_int(s, 5),
            .source_hash = db_col_text(s, 6),
            .session_uid = db_col_text(s, 7),
            .origin = db_col_text(s, 8),
        };
        db_trial *t = &r.t;
        t->device_id = sqlite3_column_int64(s, 1);
        t->kernel_id = sqlite3_column_int64(s, 2);
        t->session_id = sqlite3_column_int64(s, 3);
        t->shape_key = db_col_text(s, 9);
        t->m = sqlite3_column_int64(s, 10);
        t->config_key = db_col_text(s, 11);
        t->config_json = db_col_text(s, 12);
        t->status = (db_trial_status)sqlite3_column_int(s, 13);
        t->time_min_ms = db_col_real(s, 14);
        t->time_median_ms = db_col_real(s, 15);
        t->time_p10_ms = db_col_real(s, 16);
        t->time_p90_ms = db_col_real(s, 17);
        t->repetitions = sqlite3_column_int(s, 18);
        t->gflops = db_col_real(s, 19);
        t->gbps = db_col_real(s, 20);
        t->resources_json = db_col_text(s, 21);
        t->error = db_col_text(s, 22);
        t->compile_ms = db_col_real(s, 23);
        t->created_ms = sqlite3_column_int64(s, 24);
        db_device_row_read(s, 25, &r.device);
        if (fn(ctx, &r))
            break;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "listing trials");
    return MT_OK;
}

mt_status db_misses_each(db_t *db, const db_filter *f, db_miss_fn fn, void *ctx, mt_err *err)
{
    db_filter none = {0};
    if (!f)
        f = &none;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(
        db->sql,
        "SELECT x.family, x.shape, x.m, x.count, x.first_seen_ms, x.last_seen_ms, x.last_reason, "
        DB_DEVICE_COLUMNS " FROM misses x JOIN devices d ON d.id = x.device_id "
        "WHERE (?1 IS NULL OR x.family = ?1) AND (?2 IS NULL OR x.shape = ?2) "
        "AND (?3 <= 0 OR x.m = ?3) AND (?4 IS NULL OR d.fingerprint = ?4 OR d.name = ?4) "
        "ORDER BY x.count DESC, x.last_seen_ms DESC, d.fingerprint, x.family, x.shape, x.m",
        -1, &s, NULL);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, "listing misses");
    db_bind_text(s, 1, f->family);
    db_bind_text(s, 2, f->shape_key);
    sqlite3_bind_int64(s, 3, f->m);
    db_bind_text(s, 4, f->device);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        db_miss_row r = {
            .family = db_col_text(s, 0),
            .shape_key = db_col_text(s, 1),
            .m = sqlite3_column_int64(s, 2),
            .count = sqlite3_column_int64(s, 3),
            .first_seen_ms = sqlite3_column_int64(s, 4),
            .last_seen_ms = sqlite3_column_int64(s, 5),
            .last_reason = (db_provenance)sqlite3_column_int(s, 6),
        };
        db_device_row_read(s, 7, &r.device);
        if (fn(ctx, &r))
            break;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "listing misses");
    return MT_OK;
}
