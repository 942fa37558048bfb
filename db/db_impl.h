/* db_impl.h: the db handle's body, the prepared-statement cache, SQLite
 * error plumbing and the record types that export, import and merge pass
 * between them. Private to db/. */
#ifndef MT_DB_IMPL_H
#define MT_DB_IMPL_H

#include <sqlite3.h>

#include "common/rng.h"
#include "db.h"
#include "db_testing.h" /* its calls are defined in db/ as well */

/* Cached statements: one slot per query the hot paths run. Their SQL lives
 * in db_stmt.c, in a table indexed by these ids. */
typedef enum db_stmt_id {
    ST_DEVICE_UPSERT,
    ST_DEVICE_BY_FP,
    ST_KERNEL_UPSERT,
    ST_KERNEL_ID,
    ST_TRIAL_UPSERT,
    ST_TRIAL_GET,
    ST_WINNER_UPSERT,
    ST_WINNER_GET,
    ST_LOOKUP_EXACT,
    ST_LOOKUP_SHAPE,
    ST_LOOKUP_OTHER,
    ST_LOOKUP_STALE,
    ST_MISS_UPSERT,
    ST_SESSION_BY_UID,
    ST_STMT_COUNT
} db_stmt_id;

struct db {
    sqlite3 *sql;
    char *path;
    bool readonly;     /* opened DB_OPEN_READONLY: writes refused */
    bool memory_copy;  /* read-only older schema upgraded in memory */
    int tx_depth;      /* 0: no transaction; >1: savepoints */
    mt_rng rng;        /* session uids */
    sqlite3_stmt *stmts[ST_STMT_COUNT];
};

/* Schema (db_schema.c). */
/* Creates the current schema in an empty database; inside a transaction. */
mt_status db_schema_create(db_t *db, mt_err *err);
/* Migrates from version `from` to DB_SCHEMA_VERSION; inside a transaction. */
mt_status db_schema_migrate(db_t *db, int from, mt_err *err);

/* Errors (db_open.c). Formats "<path>: <what>: <sqlite message>" into err;
 * SQLITE_BUSY/LOCKED become MT_E_BUSY, everything else MT_E_DB. */
mt_status db_sql_fail(db_t *db, mt_err *err, int rc, const char *file, int line,
                      const char *what);
#define DB_FAIL(db, err, rc, what) db_sql_fail((db), (err), (rc), __FILE__, __LINE__, (what))

/* Running SQL (db_stmt.c). */
/* The cached statement for id in *out, reset and with bindings cleared.
 * Not re-entrant per id: finish one use before the next, and sqlite3_reset
 * it when done so that no read snapshot stays open between calls. */
mt_status db_stmt(db_t *db, db_stmt_id id, sqlite3_stmt **out, mt_err *err);
/* SQL text of a cached statement. */
const char *db_stmt_sql(db_stmt_id id);
/* Runs SQL that returns no rows we need. */
mt_status db_exec(db_t *db, const char *sql, mt_err *err);
/* The first column of the first row of sql as an integer in *out (left
 * unchanged when there is no row); ?1, when sql has it, is bound to param. */
mt_status db_scalar(db_t *db, const char *sql, int64_t param, int64_t *out, mt_err *err);
/* Called by db_rows_each for one result row: a non-OK return stops with
 * that status; setting *stop stops early with MT_OK. */
typedef mt_status (*db_row_fn)(sqlite3_stmt *s, void *ctx, bool *stop, mt_err *err);
/* Prepares sql (uncached) and calls row for each result row. When sql has
 * parameters, ?1..?4 are a db_filter's family, shape key, m and device,
 * and ?5, ?6 (when sql has six) its version and source hash (f NULL:
 * match everything; see DB_FILTER_KERNEL). SQLite failures name `what`. */
mt_status db_rows_each(db_t *db, const char *sql, const db_filter *f, db_row_fn row,
                       void *ctx, const char *what, mt_err *err);

/* Transactions used by every write (db_open.c): begin takes the write lock
 * (BEGIN IMMEDIATE with retries) or opens a savepoint when nested. */
mt_status db_tx_begin(db_t *db, mt_err *err);
mt_status db_tx_commit(db_t *db, mt_err *err);
void db_tx_rollback(db_t *db);
/* Commits when st is MT_OK, else rolls back; returns the final status. */
mt_status db_tx_end(db_t *db, mt_status st, mt_err *err);
/* MT_E_INVALID when the handle is read-only (names the operation). */
mt_status db_check_writable(db_t *db, const char *what, mt_err *err);

/* Binding helpers (db_stmt.c): NULL text and NAN doubles bind SQL NULL. */
int db_bind_text(sqlite3_stmt *s, int i, const char *v);
int db_bind_real(sqlite3_stmt *s, int i, double v);
/* Column helpers: SQL NULL reads as NULL text / NAN / 0. */
const char *db_col_text(sqlite3_stmt *s, int i);
double db_col_real(sqlite3_stmt *s, int i);

/* Unix time in milliseconds (db_stmt.c). */
int64_t db_now_ms(void);
/* Fills dev_fp (cap bytes) with dev->fingerprint or the derived one. */
void db_device_fingerprint(const db_device *dev, char *out, size_t cap);
/* Argument checks shared by writers and lookup. */
mt_status db_check_device(const db_device *dev, mt_err *err);
mt_status db_check_kernel(const db_kernel *k, mt_err *err);

/* Row-level helpers without their own transaction (db_write.c). */
/* Id of the device with fingerprint fp (0 when absent); when dev is given,
 * *same tells whether its stored fields equal dev's. */
mt_status db_device_find(db_t *db, const char *fp, const db_device *dev, int64_t *id, bool *same,
                         mt_err *err);
mt_status db_device_put(db_t *db, const db_device *dev, const char *fp, mt_err *err);
mt_status db_kernel_find(db_t *db, const db_kernel *k, int64_t *id, mt_err *err);
mt_status db_check_trial(const db_trial *t, mt_err *err);
mt_status db_trial_put(db_t *db, const db_trial *t, const char *origin, mt_err *err);
/* *id 0 when absent; status and median (may be NULL) of the stored row. */
mt_status db_trial_find(db_t *db, int64_t device_id, int64_t kernel_id, const char *shape_key,
                        int64_t m, const char *config_key, int64_t *id, int *status,
                        double *median, mt_err *err);
mt_status db_miss_put(db_t *db, int64_t device_id, const char *family, const char *shape_key,
                      const char *shape_run, int64_t m, int64_t seen_ms, int reason,
                      mt_err *err);
mt_status db_code_put_at(db_t *db, const char *target, const char *cache_key, const void *blob,
                         size_t size, int64_t created_ms, bool replace, mt_err *err);
/* Writes a winner row as given (db_winners.c). verified_ms 0 and NAN
 * verified_time_ms store NULL. */
mt_status db_winner_put(db_t *db, const db_winner *w, int64_t trial_id, int64_t updated_ms,
                        int64_t verified_ms, double verified_time_ms, const char *origin,
                        mt_err *err);
/* Sets the stale mark of an existing winner (merge and import carry it). */
mt_status db_winner_stale_set(db_t *db, int64_t device_id, int64_t kernel_id,
                              const char *shape_key, int64_t m, mt_err *err);
mt_status db_check_winner(const db_winner *w, mt_err *err);
/* Binds w's key to ?1 device id, ?2 kernel id, ?3 shape, ?4 m (the
 * numbering of ST_WINNER_GET and ST_WINNER_UPSERT); the shape is not copied. */
void db_winner_key_bind(sqlite3_stmt *s, const db_winner *w);
/* Fills a db_device_row from columns first.. first+7 of a statement in the
 * order id, backend, arch, name, runtime_version, driver_version,
 * fingerprint, compute_units (db_query.c). */
#define DB_DEVICE_COLUMNS                                                         \
    "d.id, d.backend, d.arch, d.name, d.runtime_version, d.driver_version, " \
    "d.fingerprint, d.compute_units"
void db_device_row_read(sqlite3_stmt *s, int first, db_device_row *row);
/* A winner's decision as 7 columns of winners w, in db_confirm's order:
 * decision, challenger, ratio, ratio_lo, ratio_hi, confidence, rounds. */
#define DB_WINNER_DECISION_COLUMNS                                                \
    "w.decision, w.challenger, w.ratio, w.ratio_lo, w.ratio_hi, w.confidence, " \
    "coalesce(w.rounds, 0)"
/* Fills a db_trial's measured fields (not its ids) from columns first..
 * first+15 in the order of DB_TRIAL_COLUMNS (db_query.c). */
#define DB_TRIAL_COLUMNS                                                            \
    "t.shape, t.m, t.config_key, t.config_json, t.status, t.time_min_ms, "         \
    "t.time_median_ms, t.time_p10_ms, t.time_p90_ms, coalesce(t.repetitions, 0), " \
    "t.gflops, t.gbps, t.resources_json, t.error, t.compile_ms, t.created_ms"
void db_trial_read(sqlite3_stmt *s, int first, db_trial *t);
/* The WHERE terms of a filtered listing over kernels k (db_rows_each binds
 * their parameters): family ?1, kernel version ?5 and source hash ?6. */
#define DB_FILTER_KERNEL                                                          \
    "(?1 IS NULL OR k.family = ?1) "                                              \
    "AND (?6 IS NULL OR (k.version = ?5 AND k.source_hash = ?6))"

/* Internal miss counter with an explicit reason (db_write.c). */
mt_status db_miss_record_reason(db_t *db, const db_device *dev, const char *family,
                                const char *shape_key, const char *shape_run, int64_t m,
                                db_provenance reason, mt_err *err);

/* ---- records: one row of export/import/merge, by natural keys ----------- */

typedef struct db_session_rec {
    const char *uid, *argv_json, *tool_version, *host, *strategy, *budget, *origin;
    int64_t started_ms, ended_ms; /* ended_ms 0: still open */
    int status;
} db_session_rec;

typedef struct db_trial_rec {
    db_trial t; /* ids unused; everything else as stored */
    const char *device_fp, *session_uid, *origin;
    db_kernel kernel;
} db_trial_rec;

typedef struct db_winner_rec {
    db_winner w; /* ids unused */
    const char *device_fp, *origin;
    db_kernel kernel;
    int64_t updated_ms, verified_ms; /* verified_ms 0: never */
    double verified_time_ms;
    bool stale;                      /* schema 5; carried by merge and import */
} db_winner_rec;

typedef struct db_miss_rec {
    const char *device_fp, *family, *shape_key;
    const char *shape_run; /* NULL: not recorded */
    int64_t m, count, first_seen_ms, last_seen_ms;
    int last_reason;
} db_miss_rec;

typedef struct db_code_rec {
    const char *target, *cache_key;
    const void *blob;
    size_t size;
    int64_t created_ms;
} db_code_rec;

/* Receives every record of a database, section by section in the export
 * order: devices, kernels, sessions, trials, winners, misses, code. Any slot
 * may be NULL (records of that kind are skipped). A non-OK return stops. */
typedef struct db_visitor {
    mt_status (*device)(void *ctx, const db_device *d, mt_err *err);
    mt_status (*kernel)(void *ctx, const db_kernel *k, mt_err *err);
    mt_status (*session)(void *ctx, const db_session_rec *s, mt_err *err);
    mt_status (*trial)(void *ctx, const db_trial_rec *t, mt_err *err);
    mt_status (*winner)(void *ctx, const db_winner_rec *w, mt_err *err);
    mt_status (*miss)(void *ctx, const db_miss_rec *m, mt_err *err);
    mt_status (*code)(void *ctx, const db_code_rec *c, mt_err *err);
} db_visitor;

/* Reads every record of db in export order (db_records.c). */
mt_status db_visit(db_t *db, const db_visitor *v, void *ctx, mt_err *err);

/* A visitor context that writes records into db by db_merge_rule(); label
 * becomes the origin of taken rows that carry none (NULL: keep as is).
 * Callers run it inside one transaction (db_records.c). */
typedef struct db_sink {
    db_t *db;
    const char *label;
    db_merge_stats *stats;
} db_sink;
extern const db_visitor db_sink_visitor;

#endif
