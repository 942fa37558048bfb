/* db_query.c: read-only listings for the CLI and other modules: counts,
 * devices, trials and misses (winners are listed in db_winners.c), and the
 * device and trial column readers that db_records.c and db_winners.c share. */
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

void db_trial_read(sqlite3_stmt *s, int first, db_trial *t)
{
    t->shape_key = db_col_text(s, first);
    t->m = sqlite3_column_int64(s, first + 1);
    t->config_key = db_col_text(s, first + 2);
    t->config_json = db_col_text(s, first + 3);
    t->status = (db_trial_status)sqlite3_column_int(s, first + 4);
    t->time_min_ms = db_col_real(s, first + 5);
    t->time_median_ms = db_col_real(s, first + 6);
    t->time_p10_ms = db_col_real(s, first + 7);
    t->time_p90_ms = db_col_real(s, first + 8);
    t->repetitions = sqlite3_column_int(s, first + 9);
    t->gflops = db_col_real(s, first + 10);
    t->gbps = db_col_real(s, first + 11);
    t->resources_json = db_col_text(s, first + 12);
    t->error = db_col_text(s, first + 13);
    t->compile_ms = db_col_real(s, first + 14);
    t->created_ms = sqlite3_column_int64(s, first + 15);
}

static mt_status status_count_row(sqlite3_stmt *s, void *arg, bool *stop, mt_err *err)
{
    (void)stop;
    (void)err;
    db_stats *out = arg;
    int k = sqlite3_column_int(s, 0);
    if (k >= 0 && k < DB_TRIAL_STATUS_COUNT)
        out->trials_by_status[k] = sqlite3_column_int64(s, 1);
    return MT_OK;
}

mt_status db_stats_get(db_t *db, db_stats *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    int64_t v = 0;
    mt_status st = db_scalar(db, "PRAGMA user_version", 0, &v, err);
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
        st = db_scalar(db, q[i].sql, 0, q[i].dst, err);
    if (st)
        return st;
    return db_rows_each(db, "SELECT status, count(*) FROM trials GROUP BY status", NULL,
                        status_count_row, out, "counting trials", err);
}

/* The caller's callback and context, for the row functions below. */
typedef struct each_cb {
    union {
        db_device_fn device;
        db_trial_fn trial;
        db_miss_fn miss;
    } fn;
    void *ctx;
} each_cb;

static mt_status device_row(sqlite3_stmt *s, void *arg, bool *stop, mt_err *err)
{
    (void)err;
    const each_cb *cb = arg;
    db_device_row r;
    db_device_row_read(s, 0, &r);
    *stop = cb->fn.device(cb->ctx, &r) != 0;
    return MT_OK;
}

mt_status db_devices_each(db_t *db, db_device_fn fn, void *ctx, mt_err *err)
{
    each_cb cb = {.fn.device = fn, .ctx = ctx};
    return db_rows_each(db, "SELECT " DB_DEVICE_COLUMNS " FROM devices d ORDER BY d.fingerprint",
                        NULL, device_row, &cb, "listing devices", err);
}

static mt_status trial_row(sqlite3_stmt *s, void *arg, bool *stop, mt_err *err)
{
    (void)err;
    const each_cb *cb = arg;
    db_trial_row r = {
        .id = sqlite3_column_int64(s, 0),
        .family = db_col_text(s, 4),
        .version = sqlite3_column_int(s, 5),
        .source_hash = db_col_text(s, 6),
        .session_uid = db_col_text(s, 7),
        .origin = db_col_text(s, 8),
    };
    r.t.device_id = sqlite3_column_int64(s, 1);
    r.t.kernel_id = sqlite3_column_int64(s, 2);
    r.t.session_id = sqlite3_column_int64(s, 3);
    db_trial_read(s, 9, &r.t);
    db_device_row_read(s, 25, &r.device);
    *stop = cb->fn.trial(cb->ctx, &r) != 0;
    return MT_OK;
}

mt_status db_trials_each(db_t *db, const db_filter *f, db_trial_fn fn, void *ctx, mt_err *err)
{
    each_cb cb = {.fn.trial = fn, .ctx = ctx};
    return db_rows_each(
        db,
        "SELECT t.id, t.device_id, t.kernel_id, coalesce(t.session_id, 0), k.family, k.version, "
        "k.source_hash, se.uid, t.origin, " DB_TRIAL_COLUMNS ", " DB_DEVICE_COLUMNS " "
        "FROM trials t JOIN devices d ON d.id = t.device_id JOIN kernels k ON k.id = t.kernel_id "
        "LEFT JOIN sessions se ON se.id = t.session_id "
        "WHERE " DB_FILTER_KERNEL " AND (?2 IS NULL OR t.shape = ?2) "
        "AND (?3 <= 0 OR t.m = ?3) AND (?4 IS NULL OR d.fingerprint = ?4 OR d.name = ?4) "
        "ORDER BY d.fingerprint, k.family, k.version, k.source_hash, t.shape, t.m, "
        "t.status != 0, t.time_median_ms, t.config_key",
        f, trial_row, &cb, "listing trials", err);
}

static mt_status miss_row(sqlite3_stmt *s, void *arg, bool *stop, mt_err *err)
{
    (void)err;
    const each_cb *cb = arg;
    db_miss_row r = {
        .family = db_col_text(s, 0),
        .shape_key = db_col_text(s, 1),
        .m = sqlite3_column_int64(s, 2),
        .count = sqlite3_column_int64(s, 3),
        .first_seen_ms = sqlite3_column_int64(s, 4),
        .last_seen_ms = sqlite3_column_int64(s, 5),
        .last_reason = (db_provenance)sqlite3_column_int(s, 6),
        .shape_run = db_col_text(s, 7),
    };
    db_device_row_read(s, 8, &r.device);
    *stop = cb->fn.miss(cb->ctx, &r) != 0;
    return MT_OK;
}

mt_status db_misses_each(db_t *db, const db_filter *f, db_miss_fn fn, void *ctx, mt_err *err)
{
    each_cb cb = {.fn.miss = fn, .ctx = ctx};
    return db_rows_each(
        db,
        "SELECT x.family, x.shape, x.m, x.count, x.first_seen_ms, x.last_seen_ms, x.last_reason, "
        "x.shape_run, " DB_DEVICE_COLUMNS " FROM misses x JOIN devices d ON d.id = x.device_id "
        "WHERE (?1 IS NULL OR x.family = ?1) AND (?2 IS NULL OR x.shape = ?2) "
        "AND (?3 <= 0 OR x.m = ?3) AND (?4 IS NULL OR d.fingerprint = ?4 OR d.name = ?4) "
        "ORDER BY x.count DESC, x.last_seen_ms DESC, d.fingerprint, x.family, x.shape, x.m",
        f, miss_row, &cb, "listing misses", err);
}
