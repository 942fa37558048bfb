/* db.h: the tuned-config database: one SQLite file holding devices, kernel
 * versions, tuning sessions, every measured trial, the winner per
 * (device, kernel, shape, M), misses seen at run time and optional compiled
 * code objects; plus the runtime lookup, export/import, merge and gc.
 * docs/DB.md describes the schema, the lookup rule and the file formats.
 *
 * The module depends on nothing of moetune but common/: devices, kernels,
 * shapes and configs arrive as plain values and canonical text keys.
 *
 * Ownership: db_open returns a handle the caller closes with db_close
 * (closing NULL is a no-op). Strings passed in are copied by SQLite before
 * the call returns; strings handed to the *_each callbacks are valid only
 * during that callback.
 *
 * Failure: every call that can fail returns an mt_status and fills err (may
 * be NULL) with a message naming the database path and what failed. A failed
 * write changes nothing: every write runs in one transaction.
 *
 * Concurrency: several processes may use one file at once (WAL mode, a 10 s
 * busy timeout, writes take the write lock up front and retry while another
 * writer holds it). A handle is used by one thread at a time; open one
 * handle per thread.
 *
 * Calls that only the tests make (explicit transactions, code objects,
 * coverage, recording a miss or a re-timing by hand) are in db_testing.h. */
#ifndef MT_DB_H
#define MT_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

/* Schema version written to PRAGMA user_version and meta.schema_version. */
#define DB_SCHEMA_VERSION 6
/* Version of the JSON export format (docs/DB.md). */
#define DB_EXPORT_FORMAT_VERSION 2

typedef struct db db_t;

typedef enum db_open_flags {
    DB_OPEN_DEFAULT = 0,  /* read-write; create if missing; upgrade an older schema */
    DB_OPEN_READONLY = 1, /* never writes the file; it must exist. An older schema
                             is upgraded in an in-memory copy; writes fail. */
    DB_OPEN_NOCREATE = 2, /* read-write, but the file must already exist */
} db_open_flags;

/* Opens (or creates) the database at path. Checks before touching the file:
 * a file that is not an SQLite database, or is shorter than its header says
 * (truncated), is refused with MT_E_FORMAT naming the path; a schema newer
 * than DB_SCHEMA_VERSION is refused with MT_E_UNSUPPORTED. In all three
 * cases the file is left byte-for-byte unchanged. An older schema is
 * migrated in one transaction. *out is NULL on failure. */
mt_status db_open(const char *path, db_open_flags flags, db_t **out, mt_err *err);
void db_close(db_t *db);

/* The path the handle was opened with (owned by the handle). */
const char *db_path(const db_t *db);


/* ---- devices and kernels ------------------------------------------------ */

/* Backend numbers, persisted: equal to device/'s dev_backend. */
enum { DB_BACKEND_CPU = 0, DB_BACKEND_EMU = 1, DB_BACKEND_HIP = 2, DB_BACKEND_CUDA = 3,
       DB_BACKEND_COUNT };
/* "cpu", "emu", "hip", "cuda"; "unknown" out of range. */
const char *db_backend_name(int backend);
/* Parses a backend name; -1 when unknown. */
int db_backend_parse(const char *name);

/* A device as the caller sees it. A row's identity is its fingerprint; when
 * fingerprint is NULL or "", one is derived from backend/arch/name/compute
 * units. Runtime and driver versions may be NULL (stored as ""). */
typedef struct db_device {
    int backend; /* DB_BACKEND_* */
    const char *arch, *name, *runtime_version, *driver_version, *fingerprint;
    int compute_units;
} db_device;

/* Returns the id of the device with that fingerprint, inserting it when new
 * and refreshing its descriptive fields when they changed. */
mt_status db_device_upsert(db_t *db, const db_device *dev, int64_t *id, mt_err *err);

/* A kernel version: family name, family version and the hash of its source.
 * Results are only ever used for the exact (family, version, source_hash). */
typedef struct db_kernel {
    const char *family;
    int version;
    const char *source_hash;
} db_kernel;

mt_status db_kernel_upsert(db_t *db, const db_kernel *k, int64_t *id, mt_err *err);

/* ---- sessions ----------------------------------------------------------- */

/* Persisted values: append only. */
typedef enum db_session_status {
    DB_SESSION_RUNNING = 0,
    DB_SESSION_DONE = 1,
    DB_SESSION_INTERRUPTED = 2,
    DB_SESSION_FAILED = 3,
    DB_SESSION_STATUS_COUNT
} db_session_status;
const char *db_session_status_str(db_session_status s); /* "running", ... */
bool db_session_status_parse(const char *s, db_session_status *out);

typedef struct db_session_info {
    int argc;
    char *const *argv;        /* stored as a JSON array of strings */
    const char *tool_version; /* "moetune " MOETUNE_VERSION */
    const char *host;         /* NULL: gethostname() */
    const char *strategy;     /* "exhaustive", "random", ... */
    const char *budget;       /* free text: "600s", "500 trials", "" */
} db_session_info;

/* Records the start of a tuning session (status running, start time now)
 * and returns its id. The session also gets a random uid that identifies it
 * across export, import and merge. */
mt_status db_session_begin(db_t *db, const db_session_info *info, int64_t *id, mt_err *err);
/* Records the end time and final status. MT_E_NOT_FOUND for an unknown id. */
mt_status db_session_end(db_t *db, int64_t id, db_session_status status, mt_err *err);

/* ---- trials ------------------------------------------------------------- */

/* Persisted values: append only. */
typedef enum db_trial_status {
    DB_TRIAL_OK = 0,            /* verified against the reference and timed */
    DB_TRIAL_COMPILE_ERROR = 1,
    DB_TRIAL_INVALID = 2,       /* rejected by the launch or resource limits */
    DB_TRIAL_WRONG_RESULT = 3,
    DB_TRIAL_CRASH = 4,
    DB_TRIAL_TIMEOUT = 5,
    DB_TRIAL_SKIPPED = 6,       /* slower than 2x the best so far; abandoned */
    DB_TRIAL_COMPILED = 7,      /* compile-only: compiled, resources stored, never
                                 * run; carries no time (schema 3) */
    DB_TRIAL_STATUS_COUNT
} db_trial_status;
/* "ok", "compile_error", "invalid", "wrong_result", "crash", "timeout",
 * "skipped", "compiled"; "unknown" out of range. */
const char *db_trial_status_str(db_trial_status s);
bool db_trial_status_parse(const char *s, db_trial_status *out);

/* Longest config JSON accepted (bytes, without the NUL); longer is
 * MT_E_INVALID, so a lookup never truncates a config. */
#define DB_CONFIG_JSON_MAX 1023
#define DB_CONFIG_KEY_MAX 255

/* One measured candidate. Unknown doubles are NAN (stored as NULL);
 * repetitions <= 0 is stored as NULL. Status ok requires time_median_ms > 0;
 * status compiled has no time (NAN or 0).
 * created_ms 0 means now. */
typedef struct db_trial {
    int64_t device_id, kernel_id; /* from db_device_upsert / db_kernel_upsert */
    int64_t session_id;           /* 0: none */
    const char *shape_key;        /* canonical: "H=256,I=128,E=16,topk=4,a=bf16" */
    int64_t m;                    /* token count, >= 1 */
    const char *config_key;       /* canonical: "BM=32,BN=64" */
    const char *config_json;      /* canonical JSON of the config */
    db_trial_status status;
    double time_min_ms, time_median_ms, time_p10_ms, time_p90_ms;
    int repetitions;
    double gflops, gbps;
    const char *resources_json;   /* registers, LDS, spills...; NULL: none */
    const char *error;            /* compiler log or failure text; NULL: none */
    double compile_ms;
    int64_t created_ms;           /* Unix time in ms; 0: now */
} db_trial;

/* Inserts a trial, or replaces the one with the same (device, kernel, shape,
 * m, config_key). */
mt_status db_trial_insert(db_t *db, const db_trial *t, mt_err *err);
/* Inserts n trials in one transaction: all or none. */
mt_status db_trials_insert(db_t *db, const db_trial *arr, int n, mt_err *err);
/* For resume: *exists tells whether this config was already measured for
 * this device, kernel (its id carries the source hash), shape and M; when it
 * was and status is non-NULL, *status receives the recorded outcome. */
mt_status db_trial_exists(db_t *db, int64_t device_id, int64_t kernel_id, const char *shape_key,
                          int64_t m, const char *config_key, bool *exists,
                          db_trial_status *status, mt_err *err);

/* ---- winners ------------------------------------------------------------ */

/* How a winner was decided (persisted: winners.decision; append only).
 * The tuner confirms a search's best that is not the default config
 * against the default by paired rounds (docs/TUNING.md, "How winners are
 * decided"); the decision and its interval are stored with the winner. */
typedef enum db_decision {
    DB_DECIDED_MEDIAN = 0,       /* lowest median, never confirmed (schema <= 3,
                                  * tuning without confirmation, no ok default,
                                  * or a plain db_winners_recompute) */
    DB_DECIDED_CONFIRMED = 1,    /* a non-default config, faster than the default
                                  * with confidence: ratio_hi < 1 */
    DB_DECIDED_DEFAULT_KEPT = 2, /* the search's best (challenger) was not
                                  * confirmed: rejected as noise, the default wins */
    DB_DECIDED_DEFAULT_BEST = 3, /* the default had the lowest median itself */
    DB_DECISION_COUNT
} db_decision;
/* "median", "confirmed", "default_kept", "default_best"; "unknown". */
const char *db_decision_str(db_decision d);
bool db_decision_parse(const char *s, db_decision *out);

/* The decision behind a winner. All zero: DB_DECIDED_MEDIAN, no rounds. */
typedef struct db_confirm {
    db_decision decision;
    const char *challenger_key; /* the config confirmed (the winner) or rejected;
                                 * NULL: none */
    double ratio;               /* challenger / default time: geometric mean over
                                 * the paired rounds */
    double ratio_lo, ratio_hi;  /* its interval at `confidence` */
    double confidence;          /* e.g. 0.95 */
    int rounds;                 /* paired rounds; 0: none (the four doubles
                                 * are then not stored) */
} db_confirm;

typedef struct db_winner {
    int64_t device_id, kernel_id;
    const char *shape_key;
    int64_t m;
    const char *config_key, *config_json;
    double time_ms;              /* median time of the winning config, > 0 */
    const char *runner_ups_json; /* JSON array; NULL: "[]" */
    db_confirm confirm;          /* how it was decided */
} db_winner;


/* Recomputes winners from ok trials: per (device, kernel, shape, m) the
 * trial with the lowest median wins (ties: lower minimum, then config key);
 * the next DB_RUNNER_UPS become runner_ups
 * ([{"config_key":...,"time_ms":...},...]), and the winner is stored as
 * DB_DECIDED_MEDIAN. Scope: device_id / kernel_id 0, shape_key NULL and
 * m <= 0 each mean "all". Keys with no ok trial keep their winner, and so
 * do keys whose winner carries a decision (decision != DB_DECIDED_MEDIAN):
 * only db_winner_decide, after a new confirmation, changes those. A winner
 * whose config is unchanged keeps its verified mark. *changed (may be
 * NULL) receives the number of winners written. */
#define DB_RUNNER_UPS 4
mt_status db_winners_recompute(db_t *db, int64_t device_id, int64_t kernel_id,
                               const char *shape_key, int64_t m, int64_t *changed, mt_err *err);

/* Makes the ok trial of config_key the winner of (device, kernel, shape,
 * m) with the decision *conf (NULL: DB_DECIDED_MEDIAN), whatever winner
 * and decision were stored before; runner-ups are the other ok trials,
 * lowest median first. The verified mark is kept when the config is
 * unchanged. MT_E_NOT_FOUND when config_key has no ok trial there;
 * MT_E_INVALID for a decision out of range or one with rounds whose
 * ratios are not finite and positive. One transaction. */
mt_status db_winner_decide(db_t *db, int64_t device_id, int64_t kernel_id, const char *shape_key,
                           int64_t m, const char *config_key, const db_confirm *conf,
                           mt_err *err);


/* Records a re-timing of the winner of (device, kernel, shape, m) by
 * `moetune db verify`: verified now at time_ms (its median in the paired
 * rounds, on the device that re-timed it), and stale when it no longer won
 * there (a runner-up or the default was faster with confidence), else not
 * stale. The winner itself is not changed: a stale one is re-tuned (the
 * next tuning run that writes it clears the mark). MT_E_NOT_FOUND when
 * there is no such winner; MT_E_INVALID for a time that is not > 0. */
mt_status db_winner_verify(db_t *db, int64_t device_id, int64_t kernel_id, const char *shape_key,
                           int64_t m, double time_ms, bool stale, mt_err *err);


/* ---- lookup ------------------------------------------------------------- */

/* Persisted (misses.last_reason): append only. */
typedef enum db_provenance {
    DB_HIT_EXACT = 0,    /* tuned for this device model, kernel, shape and M */
    DB_HIT_NEAREST = 1,  /* same, at the nearest tuned M (see db_lookup) */
    DB_OTHER_DEVICE = 2, /* tuned on another device of the same backend and arch */
    DB_STALE = 3,        /* entries exist only for another kernel version/source hash */
    DB_MISS = 4,         /* nothing: the caller runs its default config */
    DB_PROVENANCE_COUNT
} db_provenance;
/* "exact", "nearest", "other_device", "stale", "miss". */
const char *db_provenance_str(db_provenance p);
bool db_provenance_parse(const char *s, db_provenance *out);

#define DB_NAME_MAX 256
#define DB_MESSAGE_MAX 768

typedef struct db_lookup_result {
    db_provenance provenance;
    bool has_config;                       /* exact, nearest or other_device */
    char config_json[DB_CONFIG_JSON_MAX + 1];
    char config_key[DB_CONFIG_KEY_MAX + 1];
    int64_t tuned_m;                       /* M the config was tuned at; 0: none */
    double time_ms;                        /* its median time there; NAN: none */
    char device_name[DB_NAME_MAX];         /* device the entries are for */
    int device_compute_units;
    char device_fingerprint[DB_NAME_MAX];
    char stale_hash[DB_NAME_MAX];          /* DB_STALE: the hash the entries have */
    bool miss_recorded;                    /* db_lookup_record_miss counted it */
    bool stale;                            /* the config found was marked stale by
                                              `db verify`: still returned, and the
                                              message says so */
    char message[DB_MESSAGE_MAX];          /* one line for the log; "" on exact */
} db_lookup_result;

/* Finds the config to run for (device, kernel, shape, m). The device matches
 * winners of the same backend, arch, name and compute units (any
 * fingerprint; its own fingerprint first). Order:
 *   1. exact M                                    -> DB_HIT_EXACT
 *   2. nearest tuned M of that shape: smallest |log2(M) - log2(m')|, a tie
 *      goes to the larger M                       -> DB_HIT_NEAREST
 *   3. same backend and arch, other name or compute-unit count: the same
 *      M rule on that device's winners; the config is returned and USED,
 *      with a warning naming that device (still a miss: this device wants
 *      its own tuning)                            -> DB_OTHER_DEVICE
 *   4. winners for this family and shape exist only for another version or
 *      source hash: never used; reported         -> DB_STALE
 *   5. nothing                                    -> DB_MISS
 * For stale and miss the caller runs its default config and logs message.
 * A lookup only reads: recording the miss is the caller's own call
 * (db_lookup_record_miss). Returns an error only for bad arguments or a
 * database failure. Cost: one or two indexed queries. */
mt_status db_lookup(db_t *db, const db_device *dev, const char *family, int version,
                    const char *source_hash, const char *shape_key, int64_t m,
                    db_lookup_result *out, mt_err *err);

/* True for the provenances a server should record as misses:
 * DB_OTHER_DEVICE, DB_STALE and DB_MISS. */
bool db_provenance_is_miss(db_provenance p);

/* Records the miss that lookup result r (of db_lookup for the same device,
 * family, shape and m) stands for, with its provenance as the reason: count
 * + 1, last_seen now, and shape_run (the shape with its runtime dims, which
 * `tune --misses` times; NULL: keeps what the row had). Nothing for a hit,
 * or when r->miss_recorded is set already. Sets r->miss_recorded; when
 * the miss cannot be recorded (a read-only handle, the lock held past the
 * retries) it appends why to r->message and still returns MT_OK: a server
 * keeps running without it. MT_E_INVALID for bad arguments. Writes one row in its own transaction. */
mt_status db_lookup_record_miss(db_t *db, const db_device *dev, const char *family,
                                const char *shape_key, const char *shape_run, int64_t m,
                                db_lookup_result *r, mt_err *err);

/* ---- reading ------------------------------------------------------------ */

typedef struct db_stats {
    int schema_version;
    int64_t devices, kernels, sessions, trials, winners, misses, code_objects;
    int64_t trials_by_status[DB_TRIAL_STATUS_COUNT];
    int64_t winners_verified;
} db_stats;
mt_status db_stats_get(db_t *db, db_stats *out, mt_err *err);

/* Row filter for the *_each calls: NULL / <= 0 fields match everything.
 * device matches a fingerprint or a device name. source_hash, when set,
 * keeps only rows of that kernel version and source hash (version is
 * ignored without it); misses have no kernel version and ignore both. */
typedef struct db_filter {
    const char *family;
    const char *shape_key;
    int64_t m;
    const char *device;
    const char *source_hash;
    int version;
} db_filter;

typedef struct db_device_row {
    int64_t id;
    int backend;
    const char *arch, *name, *runtime_version, *driver_version, *fingerprint;
    int compute_units;
} db_device_row;

typedef struct db_winner_row {
    int64_t device_id, kernel_id, trial_id; /* trial_id 0: not linked */
    db_device_row device;
    const char *family;
    int version;
    const char *source_hash;
    const char *shape_key;
    int64_t m;
    const char *config_key, *config_json, *runner_ups_json;
    double time_ms;
    int64_t updated_ms, verified_ms; /* verified_ms 0: never re-timed */
    double verified_time_ms;         /* NAN when never */
    const char *origin;              /* NULL: measured here; else merged from */
    db_confirm confirm;              /* the decision; doubles NAN when rounds 0 */
    bool stale;                      /* `db verify` found it no longer wins
                                        (schema 5); cleared when the winner is
                                        written again (a tuning run) */
} db_winner_row;

typedef struct db_trial_row {
    int64_t id;
    db_device_row device;
    const char *family;
    int version;
    const char *source_hash;
    const char *session_uid; /* NULL: none */
    const char *origin;
    db_trial t; /* device_id, kernel_id, session_id filled too */
} db_trial_row;

typedef struct db_miss_row {
    db_device_row device;
    const char *family, *shape_key;
    const char *shape_run; /* the shape the runtime ran, runtime dims included
                              (kern_shape_key with_runtime); NULL: not recorded */
    int64_t m, count, first_seen_ms, last_seen_ms;
    db_provenance last_reason;
} db_miss_row;

/* Callbacks return 0 to continue, non-zero to stop early (not an error). */
typedef int (*db_device_fn)(void *ctx, const db_device_row *row);
typedef int (*db_winner_fn)(void *ctx, const db_winner_row *row);
typedef int (*db_trial_fn)(void *ctx, const db_trial_row *row);
typedef int (*db_miss_fn)(void *ctx, const db_miss_row *row);

/* Devices by fingerprint. */
mt_status db_devices_each(db_t *db, db_device_fn fn, void *ctx, mt_err *err);
/* Winners ordered by device, family, shape, M. */
mt_status db_winners_each(db_t *db, const db_filter *f, db_winner_fn fn, void *ctx, mt_err *err);
/* Trials ordered by device, family, shape, M, median time (failed last). */
mt_status db_trials_each(db_t *db, const db_filter *f, db_trial_fn fn, void *ctx, mt_err *err);
/* Misses, most frequent first. */
mt_status db_misses_each(db_t *db, const db_filter *f, db_miss_fn fn, void *ctx, mt_err *err);

/* PRAGMA integrity_check: *ok, and the first problem in msg (cap bytes). */
mt_status db_integrity_check(db_t *db, bool *ok, char *msg, size_t cap, mt_err *err);

/* ---- export, import, merge, gc ------------------------------------------ */

/* Writes the whole database (except code objects, which are binary: ship
 * the .db file for those) as the stable JSON of docs/DB.md: sections in a
 * fixed order, one record per line, keys sorted, no row ids. */
mt_status db_export(db_t *db, FILE *out, mt_err *err);

typedef struct db_merge_stats {
    int64_t devices_added, kernels_added, sessions_added;
    int64_t trials_added, trials_replaced, trials_kept;
    int64_t winners_added, winners_replaced, winners_kept;
    int64_t misses_merged, code_added;
} db_merge_stats;

/* The conflict rule applied by db_import and db_merge, as printable text. */
const char *db_merge_rule(void);

/* Reads an export file into db, applying db_merge_rule() to keys that
 * already exist; rows keep the origin they carry. All or nothing: a
 * malformed file (reported with its line and field) changes nothing. */
mt_status db_import(db_t *db, const char *json_path, db_merge_stats *stats, mt_err *err);

/* Merges the database at src_path (opened read-only, never modified) into
 * db by db_merge_rule(), in one transaction. Rows taken from src that carry
 * no origin get "<src_path> (db <src uid>)". Merging a file into itself is
 * MT_E_INVALID. */
mt_status db_merge(db_t *db, const char *src_path, db_merge_stats *stats, mt_err *err);

/* The current source hash of a family; a family may have several (GPU and
 * CPU sources). */
typedef struct db_keep_hash {
    const char *family;
    const char *source_hash;
} db_keep_hash;

typedef struct db_gc_stats {
    int64_t kernels_removed, trials_removed, winners_removed;
} db_gc_stats;

/* Drops the trials, winners and kernel rows of every family named in keep
 * whose source hash is none of that family's listed hashes. Families not
 * named in keep are untouched. With dry_run, counts without deleting. */
mt_status db_gc(db_t *db, const db_keep_hash *keep, int n, bool dry_run, db_gc_stats *stats,
                mt_err *err);

#endif
