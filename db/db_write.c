/* db_write.c: the writers the tuner and runtime call: devices, kernels,
 * sessions, trials, misses and code objects. Each public call is one
 * transaction (or a savepoint inside the caller's db_begin). */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db_impl.h"

/* ---- argument checks ------------------------------------------------------ */

static bool empty(const char *s) { return !s || !*s; }

mt_status db_check_device(const db_device *dev, mt_err *err)
{
    if (!dev)
        return mt_fail(err, MT_E_INVALID, "db: device is NULL");
    if (dev->backend < 0 || dev->backend >= DB_BACKEND_COUNT)
        return mt_fail(err, MT_E_INVALID, "db: device backend %d out of range", dev->backend);
    if (empty(dev->arch))
        return mt_fail(err, MT_E_INVALID, "db: device has no arch");
    if (dev->compute_units < 0)
        return mt_fail(err, MT_E_INVALID, "db: device %s has %d compute units",
                       dev->name ? dev->name : dev->arch, dev->compute_units);
    return MT_OK;
}

mt_status db_check_kernel(const db_kernel *k, mt_err *err)
{
    if (!k || empty(k->family) || empty(k->source_hash))
        return mt_fail(err, MT_E_INVALID, "db: kernel needs a family and a source hash");
    return MT_OK;
}

void db_device_fingerprint(const db_device *dev, char *out, size_t cap)
{
    if (!empty(dev->fingerprint))
        snprintf(out, cap, "%s", dev->fingerprint);
    else
        snprintf(out, cap, "%s/%s/%s/%d", db_backend_name(dev->backend), dev->arch,
                 dev->name ? dev->name : "", dev->compute_units);
}

static const char *or_empty(const char *s) { return s ? s : ""; }

/* ---- devices and kernels ------------------------------------------------- */

/* Id of a device by fingerprint; *id 0 when absent. *same tells whether the
 * stored fields equal dev's. */
mt_status db_device_find(db_t *db, const char *fp, const db_device *dev, int64_t *id,
                             bool *same, mt_err *err)
{
    sqlite3_stmt *s;
    mt_status st = db_stmt(db, ST_DEVICE_BY_FP, &s, err);
    if (st)
        return st;
    *id = 0;
    *same = false;
    sqlite3_bind_text(s, 1, fp, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *id = sqlite3_column_int64(s, 0);
        *same = dev && sqlite3_column_int(s, 1) == dev->backend &&
                !strcmp(db_col_text(s, 2), dev->arch) &&
                !strcmp(db_col_text(s, 3), or_empty(dev->name)) &&
                sqlite3_column_int(s, 4) == dev->compute_units &&
                !strcmp(db_col_text(s, 5), or_empty(dev->runtime_version)) &&
                !strcmp(db_col_text(s, 6), or_empty(dev->driver_version));
        rc = SQLITE_DONE;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "finding a device");
    return MT_OK;
}

mt_status db_device_put(db_t *db, const db_device *dev, const char *fp, mt_err *err)
{
    sqlite3_stmt *s;
    mt_status st = db_stmt(db, ST_DEVICE_UPSERT, &s, err);
    if (st)
        return st;
    sqlite3_bind_text(s, 1, fp, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, dev->backend);
    sqlite3_bind_text(s, 3, dev->arch, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, or_empty(dev->name), -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 5, dev->compute_units);
    sqlite3_bind_text(s, 6, or_empty(dev->runtime_version), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 7, or_empty(dev->driver_version), -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "writing a device");
    return MT_OK;
}

mt_status db_device_upsert(db_t *db, const db_device *dev, int64_t *id, mt_err *err)
{
    *id = 0;
    mt_status st = db_check_device(dev, err);
    if (st)
        return st;
    char fp[DB_NAME_MAX];
    db_device_fingerprint(dev, fp, sizeof fp);
    bool same;
    if ((st = db_device_find(db, fp, dev, id, &same, err)) || (*id && same))
        return st;
    if ((st = db_tx_begin(db, err)))
        return st;
    st = db_device_put(db, dev, fp, err);
    if (st == MT_OK)
        st = db_device_find(db, fp, NULL, id, &same, err);
    return db_tx_end(db, st, err);
}

mt_status db_kernel_find(db_t *db, const db_kernel *k, int64_t *id, mt_err *err)
{
    sqlite3_stmt *s;
    mt_status st = db_stmt(db, ST_KERNEL_ID, &s, err);
    if (st)
        return st;
    *id = 0;
    sqlite3_bind_text(s, 1, k->family, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, k->version);
    sqlite3_bind_text(s, 3, k->source_hash, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *id = sqlite3_column_int64(s, 0);
        rc = SQLITE_DONE;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "finding a kernel");
    return MT_OK;
}

mt_status db_kernel_upsert(db_t *db, const db_kernel *k, int64_t *id, mt_err *err)
{
    *id = 0;
    mt_status st = db_check_kernel(k, err);
    if (st || (st = db_kernel_find(db, k, id, err)) || *id)
        return st;
    if ((st = db_tx_begin(db, err)))
        return st;
    sqlite3_stmt *s;
    st = db_stmt(db, ST_KERNEL_UPSERT, &s, err);
    if (st == MT_OK) {
        sqlite3_bind_text(s, 1, k->family, -1, SQLITE_STATIC);
        sqlite3_bind_int(s, 2, k->version);
        sqlite3_bind_text(s, 3, k->source_hash, -1, SQLITE_STATIC);
        int rc = sqlite3_step(s);
        sqlite3_reset(s);
        if (rc != SQLITE_DONE)
            st = DB_FAIL(db, err, rc, "writing a kernel");
    }
    if (st == MT_OK)
        st = db_kernel_find(db, k, id, err);
    return db_tx_end(db, st, err);
}

/* ---- sessions ------------------------------------------------------------ */

static char *argv_json(const db_session_info *info)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < info->argc; i++)
        cJSON_AddItemToArray(a, cJSON_CreateString(info->argv[i] ? info->argv[i] : ""));
    char *s = a ? cJSON_PrintUnformatted(a) : NULL;
    cJSON_Delete(a);
    return s;
}

mt_status db_session_begin(db_t *db, const db_session_info *info, int64_t *id, mt_err *err)
{
    *id = 0;
    if (!info || info->argc < 0 || (info->argc > 0 && !info->argv))
        return mt_fail(err, MT_E_INVALID, "db_session_begin: bad session info");
    char host[256] = "";
    if (info->host)
        snprintf(host, sizeof host, "%s", info->host);
    else if (gethostname(host, sizeof host - 1) != 0)
        host[0] = 0;
    char uid[32];
    snprintf(uid, sizeof uid, "%016" PRIx64, mt_rng_u64(&db->rng));
    char *args = argv_json(info);
    if (!args)
        return mt_fail(err, MT_E_NOMEM, "db_session_begin: argv");
    mt_status st = db_tx_begin(db, err);
    if (st) {
        free(args);
        return st;
    }
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql,
                                "INSERT INTO sessions(uid, argv, tool_version, host, strategy, "
                                "budget, started_ms, status) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                                -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(s, 1, uid, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, args, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, or_empty(info->tool_version), -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 4, host, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 5, or_empty(info->strategy), -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 6, or_empty(info->budget), -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 7, db_now_ms());
        sqlite3_bind_int(s, 8, DB_SESSION_RUNNING);
        rc = sqlite3_step(s);
        sqlite3_finalize(s);
    }
    if (rc != SQLITE_DONE)
        st = DB_FAIL(db, err, rc, "starting a session");
    else
        *id = sqlite3_last_insert_rowid(db->sql);
    free(args);
    return db_tx_end(db, st, err);
}

mt_status db_session_end(db_t *db, int64_t id, db_session_status status, mt_err *err)
{
    if ((unsigned)status >= DB_SESSION_STATUS_COUNT)
        return mt_fail(err, MT_E_INVALID, "db_session_end: status %d out of range", (int)status);
    mt_status st = db_tx_begin(db, err);
    if (st)
        return st;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql, "UPDATE sessions SET ended_ms = ?1, status = ?2 WHERE id = ?3",
                                -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(s, 1, db_now_ms());
        sqlite3_bind_int(s, 2, status);
        sqlite3_bind_int64(s, 3, id);
        rc = sqlite3_step(s);
        sqlite3_finalize(s);
    }
    if (rc != SQLITE_DONE)
        st = DB_FAIL(db, err, rc, "ending a session");
    else if (sqlite3_changes(db->sql) == 0)
        st = mt_fail(err, MT_E_NOT_FOUND, "%s: no session %lld", db->path, (long long)id);
    return db_tx_end(db, st, err);
}

/* ---- trials -------------------------------------------------------------- */

mt_status db_check_trial(const db_trial *t, mt_err *err)
{
    if (!t)
        return mt_fail(err, MT_E_INVALID, "db: trial is NULL");
    const char *what = NULL;
    if (t->device_id <= 0 || t->kernel_id <= 0)
        what = "device and kernel ids are required";
    else if (empty(t->shape_key))
        what = "shape key is empty";
    else if (t->m < 1)
        what = "M must be >= 1";
    else if (empty(t->config_key) || strlen(t->config_key) > DB_CONFIG_KEY_MAX)
        what = "config key is empty or longer than DB_CONFIG_KEY_MAX";
    else if (empty(t->config_json) || strlen(t->config_json) > DB_CONFIG_JSON_MAX)
        what = "config JSON is empty or longer than DB_CONFIG_JSON_MAX";
    else if ((unsigned)t->status >= DB_TRIAL_STATUS_COUNT)
        what = "status out of range";
    else if (t->status == DB_TRIAL_OK && !(isfinite(t->time_median_ms) && t->time_median_ms > 0))
        what = "an ok trial needs a median time > 0";
    else if (t->status == DB_TRIAL_COMPILED && (t->time_median_ms > 0 || t->time_min_ms > 0))
        what = "a compiled trial was never run and has no time";
    if (what)
        return mt_fail(err, MT_E_INVALID, "db: trial %s M=%lld %s: %s",
                       t->shape_key ? t->shape_key : "(null)", (long long)t->m,
                       t->config_key ? t->config_key : "(null)", what);
    return MT_OK;
}

mt_status db_trial_put(db_t *db, const db_trial *t, const char *origin, mt_err *err)
{
    sqlite3_stmt *s;
    mt_status st = db_stmt(db, ST_TRIAL_UPSERT, &s, err);
    if (st)
        return st;
    sqlite3_bind_int64(s, 1, t->device_id);
    sqlite3_bind_int64(s, 2, t->kernel_id);
    if (t->session_id > 0)
        sqlite3_bind_int64(s, 3, t->session_id);
    sqlite3_bind_text(s, 4, t->shape_key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 5, t->m);
    sqlite3_bind_text(s, 6, t->config_key, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 7, t->config_json, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 8, t->status);
    db_bind_real(s, 9, t->time_min_ms);
    db_bind_real(s, 10, t->time_median_ms);
    db_bind_real(s, 11, t->time_p10_ms);
    db_bind_real(s, 12, t->time_p90_ms);
    if (t->repetitions > 0)
        sqlite3_bind_int(s, 13, t->repetitions);
    db_bind_real(s, 14, t->gflops);
    db_bind_real(s, 15, t->gbps);
    db_bind_text(s, 16, t->resources_json);
    db_bind_text(s, 17, t->error);
    db_bind_real(s, 18, t->compile_ms);
    sqlite3_bind_int64(s, 19, t->created_ms > 0 ? t->created_ms : db_now_ms());
    db_bind_text(s, 20, origin);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "writing a trial");
    return MT_OK;
}

mt_status db_trials_insert(db_t *db, const db_trial *arr, int n, mt_err *err)
{
    if (n < 0 || (n > 0 && !arr))
        return mt_fail(err, MT_E_INVALID, "db_trials_insert: bad array");
    for (int i = 0; i < n; i++) {
        mt_status st = db_check_trial(&arr[i], err);
        if (st)
            return mt_err_prefix(err, "%s: trial %d of %d", db->path, i, n);
    }
    mt_status st = db_tx_begin(db, err);
    for (int i = 0; st == MT_OK && i < n; i++)
        st = db_trial_put(db, &arr[i], NULL, err);
    return db_tx_end(db, st, err);
}

mt_status db_trial_insert(db_t *db, const db_trial *t, mt_err *err)
{
    return db_trials_insert(db, t, 1, err);
}

mt_status db_trial_find(db_t *db, int64_t device_id, int64_t kernel_id, const char *shape_key,
                        int64_t m, const char *config_key, int64_t *id, int *status,
                        double *median, mt_err *err)
{
    sqlite3_stmt *s;
    mt_status st = db_stmt(db, ST_TRIAL_GET, &s, err);
    if (st)
        return st;
    *id = 0;
    sqlite3_bind_int64(s, 1, device_id);
    sqlite3_bind_int64(s, 2, kernel_id);
    sqlite3_bind_text(s, 3, shape_key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, m);
    sqlite3_bind_text(s, 5, config_key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *id = sqlite3_column_int64(s, 0);
        if (status)
            *status = sqlite3_column_int(s, 1);
        if (median)
            *median = db_col_real(s, 2);
        rc = SQLITE_DONE;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "finding a trial");
    return MT_OK;
}

mt_status db_trial_exists(db_t *db, int64_t device_id, int64_t kernel_id, const char *shape_key,
                          int64_t m, const char *config_key, bool *exists,
                          db_trial_status *status, mt_err *err)
{
    *exists = false;
    if (empty(shape_key) || empty(config_key))
        return mt_fail(err, MT_E_INVALID, "db_trial_exists: empty shape or config key");
    int64_t id;
    int stv = 0;
    mt_status st = db_trial_find(db, device_id, kernel_id, shape_key, m, config_key, &id, &stv,
                                 NULL, err);
    if (st)
        return st;
    *exists = id != 0;
    if (*exists && status)
        *status = (db_trial_status)stv;
    return MT_OK;
}

/* ---- misses -------------------------------------------------------------- */

mt_status db_miss_put(db_t *db, int64_t device_id, const char *family, const char *shape_key,
                      const char *shape_run, int64_t m, int64_t seen_ms, int reason,
                      mt_err *err)
{
    sqlite3_stmt *s;
    mt_status st = db_stmt(db, ST_MISS_UPSERT, &s, err);
    if (st)
        return st;
    sqlite3_bind_int64(s, 1, device_id);
    sqlite3_bind_text(s, 2, family, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, shape_key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, m);
    sqlite3_bind_int64(s, 5, seen_ms);
    sqlite3_bind_int(s, 6, reason);
    if (shape_run && *shape_run)
        sqlite3_bind_text(s, 7, shape_run, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 7);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "recording a miss");
    return MT_OK;
}

mt_status db_miss_record_reason(db_t *db, const db_device *dev, const char *family,
                                const char *shape_key, const char *shape_run, int64_t m,
                                db_provenance reason, mt_err *err)
{
    mt_status st = db_check_device(dev, err);
    if (st)
        return st;
    if (empty(family) || empty(shape_key) || m < 1)
        return mt_fail(err, MT_E_INVALID, "db_miss_record: family, shape and M >= 1 required");
    if ((st = db_tx_begin(db, err)))
        return st;
    int64_t dev_id;
    st = db_device_upsert(db, dev, &dev_id, err);
    if (st == MT_OK)
        st = db_miss_put(db, dev_id, family, shape_key, shape_run, m, db_now_ms(), reason, err);
    return db_tx_end(db, st, err);
}

mt_status db_miss_record(db_t *db, const db_device *dev, const char *family,
                         const char *shape_key, int64_t m, mt_err *err)
{
    return db_miss_record_reason(db, dev, family, shape_key, NULL, m, DB_MISS, err);
}

/* ---- code objects -------------------------------------------------------- */

mt_status db_code_put_at(db_t *db, const char *target, const char *cache_key, const void *blob,
                         size_t size, int64_t created_ms, bool replace, mt_err *err)
{
    static const char none = 0;
    if (!blob) /* an empty blob is stored as one, not as NULL */
        blob = &none;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql,
                                replace ? "INSERT OR REPLACE INTO code_objects(target, cache_key, "
                                          "blob, created_ms) VALUES(?1, ?2, ?3, ?4)"
                                        : "INSERT OR IGNORE INTO code_objects(target, cache_key, "
                                          "blob, created_ms) VALUES(?1, ?2, ?3, ?4)",
                                -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(s, 1, target, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, cache_key, -1, SQLITE_STATIC);
        sqlite3_bind_blob64(s, 3, blob, size, SQLITE_STATIC);
        sqlite3_bind_int64(s, 4, created_ms);
        rc = sqlite3_step(s);
        sqlite3_finalize(s);
    }
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "storing a code object");
    return MT_OK;
}

mt_status db_code_put(db_t *db, const char *target, const char *cache_key, const void *blob,
                      size_t size, mt_err *err)
{
    if (empty(target) || empty(cache_key) || (!blob && size))
        return mt_fail(err, MT_E_INVALID, "db_code_put: target, key and blob required");
    mt_status st = db_tx_begin(db, err);
    if (st)
        return st;
    st = db_code_put_at(db, target, cache_key, blob, size, db_now_ms(), true, err);
    return db_tx_end(db, st, err);
}

mt_status db_code_get(db_t *db, const char *target, const char *cache_key, void **blob,
                      size_t *size, mt_err *err)
{
    *blob = NULL;
    *size = 0;
    if (empty(target) || empty(cache_key))
        return mt_fail(err, MT_E_INVALID, "db_code_get: target and key required");
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(
        db->sql, "SELECT blob FROM code_objects WHERE target = ?1 AND cache_key = ?2", -1, &s,
        NULL);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, "reading a code object");
    sqlite3_bind_text(s, 1, target, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, cache_key, -1, SQLITE_STATIC);
    mt_status st = MT_OK;
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        size_t n = (size_t)sqlite3_column_bytes(s, 0);
        void *p = malloc(n ? n : 1);
        if (!p) {
            st = mt_fail(err, MT_E_NOMEM, "%s: code object of %zu bytes", db->path, n);
        } else {
            if (n)
                memcpy(p, sqlite3_column_blob(s, 0), n);
            *blob = p;
            *size = n;
        }
    } else if (rc == SQLITE_DONE) {
        st = mt_fail(err, MT_E_NOT_FOUND, "%s: no code object for %s / %s", db->path, target,
                     cache_key);
    } else {
        st = DB_FAIL(db, err, rc, "reading a code object");
    }
    sqlite3_finalize(s);
    return st;
}
