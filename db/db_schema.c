/* db_schema.c: the current schema (version 6) and the migration from each
 * older version. docs/DB.md describes every table and column; keep the two in
 * step. Versions are only appended; each migration runs inside the opening
 * transaction, so a failed upgrade leaves the file as it was.
 *
 * History:
 *   1  devices keyed by (backend, arch, name, CUs, runtime); trials with a
 *      text status and ISO-8601 created_at; winners without runner-ups;
 *      misses with a count only; no sessions, no code objects.
 *   2  devices keyed by fingerprint (+ driver version); integer trial status,
 *      p10/p90, resources, compile time, session, origin; winners with config
 *      key, runner-ups, verification and origin; misses with first/last seen
 *      and reason; sessions; code objects.
 *   3  trial status 7 (compiled: compile-only, never run); version 2 stored
 *      those as 6 (skipped) with the note "compile-only: compiled, not
 *      timed", and the upgrade turns exactly those into 7.
 *   4  winners carry their decision (db_decision) and, when the tuner
 *      confirmed a challenger against the default by paired rounds, the
 *      challenger, the ratio to the default with its interval, the
 *      confidence and the number of rounds. Older winners become
 *      decision 0 (median: never confirmed).
 *   5  winners carry a stale mark: `moetune db verify` re-timed the winner
 *      against its runner-up and the default and it no longer won. Older
 *      winners are not stale.
 *   6  misses carry the shape the runtime ran (shape_run: the tuning key
 *      with the runtime dims, which `tune --misses` times). Older misses
 *      have none (NULL). */
#include <inttypes.h>
#include <stdio.h>

#include "db_impl.h"

static const char schema_v6[] =
    "CREATE TABLE meta(\n"
    "  key TEXT PRIMARY KEY,\n"
    "  value TEXT NOT NULL\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE devices(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  fingerprint TEXT NOT NULL UNIQUE,\n"
    "  backend INTEGER NOT NULL CHECK(backend BETWEEN 0 AND 3),\n"
    "  arch TEXT NOT NULL,\n"
    "  name TEXT NOT NULL,\n"
    "  compute_units INTEGER NOT NULL,\n"
    "  runtime_version TEXT NOT NULL DEFAULT '',\n"
    "  driver_version TEXT NOT NULL DEFAULT '');\n"
    "CREATE INDEX devices_by_model ON devices(backend, arch, name, compute_units);\n"
    "CREATE TABLE kernels(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  family TEXT NOT NULL,\n"
    "  version INTEGER NOT NULL,\n"
    "  source_hash TEXT NOT NULL,\n"
    "  UNIQUE(family, version, source_hash));\n"
    "CREATE TABLE sessions(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  uid TEXT NOT NULL UNIQUE,\n"
    "  argv TEXT NOT NULL DEFAULT '[]',\n"
    "  tool_version TEXT NOT NULL DEFAULT '',\n"
    "  host TEXT NOT NULL DEFAULT '',\n"
    "  strategy TEXT NOT NULL DEFAULT '',\n"
    "  budget TEXT NOT NULL DEFAULT '',\n"
    "  started_ms INTEGER NOT NULL,\n"
    "  ended_ms INTEGER,\n"
    "  status INTEGER NOT NULL CHECK(status BETWEEN 0 AND 3),\n"
    "  origin TEXT);\n"
    "CREATE TABLE trials(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  device_id INTEGER NOT NULL REFERENCES devices(id),\n"
    "  kernel_id INTEGER NOT NULL REFERENCES kernels(id),\n"
    "  session_id INTEGER REFERENCES sessions(id) ON DELETE SET NULL,\n"
    "  shape TEXT NOT NULL,\n"
    "  m INTEGER NOT NULL CHECK(m >= 1),\n"
    "  config_key TEXT NOT NULL,\n"
    "  config_json TEXT NOT NULL,\n"
    "  status INTEGER NOT NULL CHECK(status BETWEEN 0 AND 7),\n"
    "  time_min_ms REAL,\n"
    "  time_median_ms REAL,\n"
    "  time_p10_ms REAL,\n"
    "  time_p90_ms REAL,\n"
    "  repetitions INTEGER,\n"
    "  gflops REAL,\n"
    "  gbps REAL,\n"
    "  resources_json TEXT,\n"
    "  error TEXT,\n"
    "  compile_ms REAL,\n"
    "  created_ms INTEGER NOT NULL,\n"
    "  origin TEXT,\n"
    "  UNIQUE(device_id, kernel_id, shape, m, config_key));\n"
    "CREATE INDEX trials_by_kernel ON trials(kernel_id);\n"
    "CREATE INDEX trials_by_session ON trials(session_id);\n"
    "CREATE TABLE winners(\n"
    "  device_id INTEGER NOT NULL REFERENCES devices(id),\n"
    "  kernel_id INTEGER NOT NULL REFERENCES kernels(id),\n"
    "  shape TEXT NOT NULL,\n"
    "  m INTEGER NOT NULL CHECK(m >= 1),\n"
    "  trial_id INTEGER REFERENCES trials(id) ON DELETE SET NULL,\n"
    "  config_key TEXT NOT NULL,\n"
    "  config_json TEXT NOT NULL,\n"
    "  time_ms REAL NOT NULL,\n"
    "  runner_ups TEXT NOT NULL DEFAULT '[]',\n"
    "  updated_ms INTEGER NOT NULL,\n"
    "  verified_ms INTEGER,\n"
    "  verified_time_ms REAL,\n"
    "  origin TEXT,\n"
    "  decision INTEGER NOT NULL DEFAULT 0 CHECK(decision BETWEEN 0 AND 3),\n"
    "  challenger TEXT,\n"
    "  ratio REAL,\n"
    "  ratio_lo REAL,\n"
    "  ratio_hi REAL,\n"
    "  confidence REAL,\n"
    "  rounds INTEGER,\n"
    "  stale INTEGER NOT NULL DEFAULT 0 CHECK(stale IN (0, 1)),\n"
    "  PRIMARY KEY(device_id, kernel_id, shape, m));\n"
    "CREATE INDEX winners_by_kernel ON winners(kernel_id, shape, m, device_id);\n"
    "CREATE INDEX winners_by_trial ON winners(trial_id);\n"
    "CREATE TABLE misses(\n"
    "  device_id INTEGER NOT NULL REFERENCES devices(id),\n"
    "  family TEXT NOT NULL,\n"
    "  shape TEXT NOT NULL,\n"
    "  m INTEGER NOT NULL,\n"
    "  count INTEGER NOT NULL,\n"
    "  first_seen_ms INTEGER NOT NULL,\n"
    "  last_seen_ms INTEGER NOT NULL,\n"
    "  last_reason INTEGER NOT NULL,\n"
    "  shape_run TEXT,\n"
    "  PRIMARY KEY(device_id, family, shape, m));\n"
    "CREATE TABLE code_objects(\n"
    "  target TEXT NOT NULL,\n"
    "  cache_key TEXT NOT NULL,\n"
    "  blob BLOB NOT NULL,\n"
    "  created_ms INTEGER NOT NULL,\n"
    "  PRIMARY KEY(target, cache_key));\n";

/* Version 1 -> 2. Tables whose keys or column types change are rebuilt
 * (create new, copy, drop, rename; foreign keys are off during the open);
 * the rest gain columns. */
static const char migrate_1_2[] =
    /* devices: the identity becomes a fingerprint; v1 rows get one derived
     * from their old key. */
    "CREATE TABLE devices_v2(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  fingerprint TEXT NOT NULL UNIQUE,\n"
    "  backend INTEGER NOT NULL CHECK(backend BETWEEN 0 AND 3),\n"
    "  arch TEXT NOT NULL,\n"
    "  name TEXT NOT NULL,\n"
    "  compute_units INTEGER NOT NULL,\n"
    "  runtime_version TEXT NOT NULL DEFAULT '',\n"
    "  driver_version TEXT NOT NULL DEFAULT '');\n"
    "INSERT INTO devices_v2(id, fingerprint, backend, arch, name, compute_units,\n"
    "                       runtime_version, driver_version)\n"
    "  SELECT id, 'v1:' || backend || '/' || arch || '/' || name || '/' || compute_units\n"
    "         || '/' || runtime_version, backend, arch, name, compute_units,\n"
    "         runtime_version, '' FROM devices;\n"
    "DROP TABLE devices;\n"
    "ALTER TABLE devices_v2 RENAME TO devices;\n"
    "CREATE INDEX devices_by_model ON devices(backend, arch, name, compute_units);\n"
    /* sessions and code objects are new. */
    "CREATE TABLE sessions(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  uid TEXT NOT NULL UNIQUE,\n"
    "  argv TEXT NOT NULL DEFAULT '[]',\n"
    "  tool_version TEXT NOT NULL DEFAULT '',\n"
    "  host TEXT NOT NULL DEFAULT '',\n"
    "  strategy TEXT NOT NULL DEFAULT '',\n"
    "  budget TEXT NOT NULL DEFAULT '',\n"
    "  started_ms INTEGER NOT NULL,\n"
    "  ended_ms INTEGER,\n"
    "  status INTEGER NOT NULL CHECK(status BETWEEN 0 AND 3),\n"
    "  origin TEXT);\n"
    "CREATE TABLE code_objects(\n"
    "  target TEXT NOT NULL,\n"
    "  cache_key TEXT NOT NULL,\n"
    "  blob BLOB NOT NULL,\n"
    "  created_ms INTEGER NOT NULL,\n"
    "  PRIMARY KEY(target, cache_key));\n"
    /* trials: text status -> persisted integer, ISO time -> Unix ms. */
    "CREATE TABLE trials_v2(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  device_id INTEGER NOT NULL REFERENCES devices(id),\n"
    "  kernel_id INTEGER NOT NULL REFERENCES kernels(id),\n"
    "  session_id INTEGER REFERENCES sessions(id) ON DELETE SET NULL,\n"
    "  shape TEXT NOT NULL,\n"
    "  m INTEGER NOT NULL CHECK(m >= 1),\n"
    "  config_key TEXT NOT NULL,\n"
    "  config_json TEXT NOT NULL,\n"
    "  status INTEGER NOT NULL CHECK(status BETWEEN 0 AND 6),\n"
    "  time_min_ms REAL,\n"
    "  time_median_ms REAL,\n"
    "  time_p10_ms REAL,\n"
    "  time_p90_ms REAL,\n"
    "  repetitions INTEGER,\n"
    "  gflops REAL,\n"
    "  gbps REAL,\n"
    "  resources_json TEXT,\n"
    "  error TEXT,\n"
    "  compile_ms REAL,\n"
    "  created_ms INTEGER NOT NULL,\n"
    "  origin TEXT,\n"
    "  UNIQUE(device_id, kernel_id, shape, m, config_key));\n"
    "INSERT INTO trials_v2(id, device_id, kernel_id, session_id, shape, m, config_key,\n"
    "    config_json, status, time_min_ms, time_median_ms, repetitions, gflops, gbps,\n"
    "    error, created_ms)\n"
    "  SELECT id, device_id, kernel_id, NULL, shape, m, config_key, config_json,\n"
    "    CASE status WHEN 'ok' THEN 0 WHEN 'compile_error' THEN 1 WHEN 'invalid' THEN 2\n"
    "      WHEN 'wrong_result' THEN 3 WHEN 'crash' THEN 4 WHEN 'timeout' THEN 5 END,\n"
    "    time_min_ms, time_median_ms, repetitions, gflops, gbps, error,\n"
    "    CAST(round((julianday(created_at) - 2440587.5) * 86400000.0) AS INTEGER)\n"
    "  FROM trials;\n"
    "DROP TABLE trials;\n"
    "ALTER TABLE trials_v2 RENAME TO trials;\n"
    "CREATE INDEX trials_by_kernel ON trials(kernel_id);\n"
    "CREATE INDEX trials_by_session ON trials(session_id);\n"
    /* winners: config key from the linked trial, runner-ups, verification. */
    "CREATE TABLE winners_v2(\n"
    "  device_id INTEGER NOT NULL REFERENCES devices(id),\n"
    "  kernel_id INTEGER NOT NULL REFERENCES kernels(id),\n"
    "  shape TEXT NOT NULL,\n"
    "  m INTEGER NOT NULL CHECK(m >= 1),\n"
    "  trial_id INTEGER REFERENCES trials(id) ON DELETE SET NULL,\n"
    "  config_key TEXT NOT NULL,\n"
    "  config_json TEXT NOT NULL,\n"
    "  time_ms REAL NOT NULL,\n"
    "  runner_ups TEXT NOT NULL DEFAULT '[]',\n"
    "  updated_ms INTEGER NOT NULL,\n"
    "  verified_ms INTEGER,\n"
    "  verified_time_ms REAL,\n"
    "  origin TEXT,\n"
    "  PRIMARY KEY(device_id, kernel_id, shape, m));\n"
    "INSERT INTO winners_v2(device_id, kernel_id, shape, m, trial_id, config_key,\n"
    "    config_json, time_ms, runner_ups, updated_ms)\n"
    "  SELECT w.device_id, w.kernel_id, w.shape, w.m, t.id,\n"
    "    coalesce(t.config_key, w.config_json), w.config_json, w.time_ms, '[]',\n"
    "    coalesce(t.created_ms, :now)\n"
    "  FROM winners w LEFT JOIN trials t ON t.id = w.trial_id;\n"
    "DROP TABLE winners;\n"
    "ALTER TABLE winners_v2 RENAME TO winners;\n"
    "CREATE INDEX winners_by_kernel ON winners(kernel_id, shape, m, device_id);\n"
    "CREATE INDEX winners_by_trial ON winners(trial_id);\n"
    /* misses: first/last seen unknown before v2: the upgrade time. */
    "ALTER TABLE misses ADD COLUMN first_seen_ms INTEGER NOT NULL DEFAULT 0;\n"
    "ALTER TABLE misses ADD COLUMN last_seen_ms INTEGER NOT NULL DEFAULT 0;\n"
    "ALTER TABLE misses ADD COLUMN last_reason INTEGER NOT NULL DEFAULT 4;\n"
    "UPDATE misses SET first_seen_ms = :now, last_seen_ms = :now;\n"
    "INSERT OR IGNORE INTO meta(key, value) VALUES('uid', lower(hex(randomblob(8))));\n";

/* Version 2 -> 3. SQLite cannot change a CHECK constraint in place, so
 * trials is rebuilt (create, copy every column, drop, rename; foreign keys
 * are off during the open, so winners keep their trial ids), then the
 * compile-only trials version 2 had to store as skipped become compiled. */
static const char migrate_2_3[] =
    "CREATE TABLE trials_v3(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  device_id INTEGER NOT NULL REFERENCES devices(id),\n"
    "  kernel_id INTEGER NOT NULL REFERENCES kernels(id),\n"
    "  session_id INTEGER REFERENCES sessions(id) ON DELETE SET NULL,\n"
    "  shape TEXT NOT NULL,\n"
    "  m INTEGER NOT NULL CHECK(m >= 1),\n"
    "  config_key TEXT NOT NULL,\n"
    "  config_json TEXT NOT NULL,\n"
    "  status INTEGER NOT NULL CHECK(status BETWEEN 0 AND 7),\n"
    "  time_min_ms REAL,\n"
    "  time_median_ms REAL,\n"
    "  time_p10_ms REAL,\n"
    "  time_p90_ms REAL,\n"
    "  repetitions INTEGER,\n"
    "  gflops REAL,\n"
    "  gbps REAL,\n"
    "  resources_json TEXT,\n"
    "  error TEXT,\n"
    "  compile_ms REAL,\n"
    "  created_ms INTEGER NOT NULL,\n"
    "  origin TEXT,\n"
    "  UNIQUE(device_id, kernel_id, shape, m, config_key));\n"
    "INSERT INTO trials_v3(id, device_id, kernel_id, session_id, shape, m, config_key,\n"
    "    config_json, status, time_min_ms, time_median_ms, time_p10_ms, time_p90_ms,\n"
    "    repetitions, gflops, gbps, resources_json, error, compile_ms, created_ms, origin)\n"
    "  SELECT id, device_id, kernel_id, session_id, shape, m, config_key,\n"
    "    config_json, status, time_min_ms, time_median_ms, time_p10_ms, time_p90_ms,\n"
    "    repetitions, gflops, gbps, resources_json, error, compile_ms, created_ms, origin\n"
    "  FROM trials;\n"
    "DROP TABLE trials;\n"
    "ALTER TABLE trials_v3 RENAME TO trials;\n"
    "CREATE INDEX trials_by_kernel ON trials(kernel_id);\n"
    "CREATE INDEX trials_by_session ON trials(session_id);\n"
    "UPDATE trials SET status = 7, error = NULL\n"
    "  WHERE status = 6 AND error = 'compile-only: compiled, not timed'\n"
    "    AND time_median_ms IS NULL;\n";

/* Version 3 -> 4: winners gain their decision; every existing winner was
 * the lowest median, never confirmed (decision 0). */
static const char migrate_3_4[] =
    "ALTER TABLE winners ADD COLUMN decision INTEGER NOT NULL DEFAULT 0\n"
    "  CHECK(decision BETWEEN 0 AND 3);\n"
    "ALTER TABLE winners ADD COLUMN challenger TEXT;\n"
    "ALTER TABLE winners ADD COLUMN ratio REAL;\n"
    "ALTER TABLE winners ADD COLUMN ratio_lo REAL;\n"
    "ALTER TABLE winners ADD COLUMN ratio_hi REAL;\n"
    "ALTER TABLE winners ADD COLUMN confidence REAL;\n"
    "ALTER TABLE winners ADD COLUMN rounds INTEGER;\n";

/* Version 4 -> 5: winners gain the stale mark of `db verify`; none is
 * stale yet. */
static const char migrate_4_5[] =
    "ALTER TABLE winners ADD COLUMN stale INTEGER NOT NULL DEFAULT 0\n"
    "  CHECK(stale IN (0, 1));\n";

/* Version 5 -> 6: misses gain the shape the runtime ran; older ones have
 * none (tune --misses then takes the family's first preset's runtime
 * dims, as before). */
static const char migrate_5_6[] = "ALTER TABLE misses ADD COLUMN shape_run TEXT;\n";

/* Runs a multi-statement script, binding :now in each statement. */
static mt_status run_script(db_t *db, const char *sql, const char *what, mt_err *err)
{
    int64_t now = db_now_ms();
    const char *p = sql;
    while (*p) {
        sqlite3_stmt *s = NULL;
        const char *tail;
        int rc = sqlite3_prepare_v2(db->sql, p, -1, &s, &tail);
        if (rc != SQLITE_OK)
            return DB_FAIL(db, err, rc, what);
        if (!s) /* trailing whitespace */
            break;
        int idx = sqlite3_bind_parameter_index(s, ":now");
        if (idx > 0)
            sqlite3_bind_int64(s, idx, now);
        while ((rc = sqlite3_step(s)) == SQLITE_ROW)
            ;
        sqlite3_finalize(s);
        if (rc != SQLITE_DONE)
            return DB_FAIL(db, err, rc, what);
        p = tail;
    }
    return MT_OK;
}

static mt_status set_meta(db_t *db, const char *key, const char *value, mt_err *err)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql, "INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)",
                                -1, &s, NULL);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, "writing meta");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, value, -1, SQLITE_STATIC);
    rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "writing meta");
    return MT_OK;
}

static mt_status set_version(db_t *db, mt_err *err)
{
    char buf[64];
    snprintf(buf, sizeof buf, "PRAGMA user_version=%d", DB_SCHEMA_VERSION);
    mt_status st = db_exec(db, buf, err);
    if (st)
        return st;
    snprintf(buf, sizeof buf, "%d", DB_SCHEMA_VERSION);
    return set_meta(db, "schema_version", buf, err);
}

mt_status db_schema_create(db_t *db, mt_err *err)
{
    mt_status st = run_script(db, schema_v6, "creating the schema", err);
    if (st)
        return st;
    char buf[64];
    snprintf(buf, sizeof buf, "%016" PRIx64, mt_rng_u64(&db->rng));
    if ((st = set_meta(db, "uid", buf, err)))
        return st;
    snprintf(buf, sizeof buf, "%" PRId64, db_now_ms());
    if ((st = set_meta(db, "created_ms", buf, err)))
        return st;
    return set_version(db, err);
}

/* v1 trials with a status text that v2 has no value for would violate NOT
 * NULL in the copy; name the first such value instead. */
static mt_status check_v1_statuses(db_t *db, mt_err *err)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql,
                                "SELECT id, status FROM trials WHERE status NOT IN "
                                "('ok','compile_error','invalid','wrong_result','crash','timeout') "
                                "LIMIT 1",
                                -1, &s, NULL);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, "checking v1 trial statuses");
    mt_status st = MT_OK;
    if (sqlite3_step(s) == SQLITE_ROW)
        st = mt_fail(err, MT_E_FORMAT,
                     "%s: cannot upgrade schema 1 -> 2: trial %lld has unknown status '%s'; "
                     "left unchanged",
                     db->path, (long long)sqlite3_column_int64(s, 0),
                     (const char *)sqlite3_column_text(s, 1));
    sqlite3_finalize(s);
    return st;
}

static mt_status foreign_key_check(db_t *db, mt_err *err)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql, "PRAGMA foreign_key_check", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, "PRAGMA foreign_key_check");
    mt_status st = MT_OK;
    if (sqlite3_step(s) == SQLITE_ROW)
        st = mt_fail(err, MT_E_FORMAT,
                     "%s: after migration, table %s row %lld points at a missing row; "
                     "left unchanged",
                     db->path, (const char *)sqlite3_column_text(s, 0),
                     (long long)sqlite3_column_int64(s, 1));
    sqlite3_finalize(s);
    return st;
}

mt_status db_schema_migrate(db_t *db, int from, mt_err *err)
{
    mt_status st = MT_OK;
    char key[64], buf[32];
    for (int v = from; v < DB_SCHEMA_VERSION && st == MT_OK; v++) {
        switch (v) {
        case 1:
            st = check_v1_statuses(db, err);
            if (st == MT_OK)
                st = run_script(db, migrate_1_2, "upgrading schema 1 -> 2", err);
            break;
        case 2:
            st = run_script(db, migrate_2_3, "upgrading schema 2 -> 3", err);
            break;
        case 3:
            st = run_script(db, migrate_3_4, "upgrading schema 3 -> 4", err);
            break;
        case 4:
            st = run_script(db, migrate_4_5, "upgrading schema 4 -> 5", err);
            break;
        case 5:
            st = run_script(db, migrate_5_6, "upgrading schema 5 -> 6", err);
            break;
        default:
            st = mt_fail(err, MT_E_UNSUPPORTED, "%s: no migration from schema version %d",
                         db->path, v);
        }
        if (st == MT_OK) {
            snprintf(key, sizeof key, "migrated_%d_to_%d_ms", v, v + 1);
            snprintf(buf, sizeof buf, "%" PRId64, db_now_ms());
            st = set_meta(db, key, buf, err);
        }
    }
    if (st == MT_OK)
        st = foreign_key_check(db, err);
    if (st == MT_OK)
        st = set_version(db, err);
    if (st)
        mt_err_prefix(err, "upgrading from schema version %d", from);
    return st;
}
