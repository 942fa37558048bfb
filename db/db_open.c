/* db_open.c: opening and closing a database (file checks before SQLite sees
 * the file, WAL, busy timeout, schema creation and migration), the
 * transaction helpers every write goes through, and SQLite error text. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "db_impl.h"

#define BUSY_TIMEOUT_MS 10000
/* BEGIN IMMEDIATE attempts after the busy timeout ran out: each attempt
 * already waited BUSY_TIMEOUT_MS inside SQLite. */
#define WRITE_ATTEMPTS 4

static const char sqlite_magic[16] = "SQLite format 3";

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

mt_status db_sql_fail(db_t *db, mt_err *err, int rc, const char *file, int line,
                      const char *what)
{
    int prim = rc & 0xff;
    mt_status st = MT_E_DB;
    if (prim == SQLITE_BUSY || prim == SQLITE_LOCKED)
        st = MT_E_BUSY;
    else if (prim == SQLITE_NOTADB || prim == SQLITE_CORRUPT)
        st = MT_E_FORMAT;
    else if (prim == SQLITE_CONSTRAINT)
        st = MT_E_INVALID;
    const char *msg = db && db->sql ? sqlite3_errmsg(db->sql) : sqlite3_errstr(rc);
    return mt_fail_at(err, st, file, line, "sqlite", "%s: %s: %s (%s)",
                      db && db->path ? db->path : "(db)", what, msg, sqlite3_errstr(rc));
}

mt_status db_check_writable(db_t *db, const char *what, mt_err *err)
{
    if (db->readonly)
        return mt_fail(err, MT_E_INVALID, "%s: %s: database opened read-only", db->path, what);
    return MT_OK;
}

/* ---- transactions -------------------------------------------------------- */

mt_status db_tx_begin(db_t *db, mt_err *err)
{
    mt_status st = db_check_writable(db, "write", err);
    if (st)
        return st;
    if (db->tx_depth > 0) {
        char sql[48];
        snprintf(sql, sizeof sql, "SAVEPOINT sp%d", db->tx_depth);
        st = db_exec(db, sql, err);
        if (st == MT_OK)
            db->tx_depth++;
        return st;
    }
    int rc = SQLITE_BUSY;
    for (int attempt = 0; attempt < WRITE_ATTEMPTS; attempt++) {
        rc = sqlite3_exec(db->sql, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        if ((rc & 0xff) != SQLITE_BUSY)
            break;
        sleep_ms(20 * (attempt + 1));
    }
    if ((rc & 0xff) == SQLITE_BUSY)
        return mt_fail(err, MT_E_BUSY,
                       "%s: another writer held the database lock for over %d s; gave up",
                       db->path, WRITE_ATTEMPTS * BUSY_TIMEOUT_MS / 1000);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, "BEGIN IMMEDIATE");
    db->tx_depth = 1;
    return MT_OK;
}

mt_status db_tx_commit(db_t *db, mt_err *err)
{
    if (db->tx_depth <= 0)
        return mt_fail(err, MT_E_INVALID, "%s: commit without a transaction", db->path);
    if (db->tx_depth > 1) {
        char sql[48];
        snprintf(sql, sizeof sql, "RELEASE sp%d", db->tx_depth - 1);
        mt_status st = db_exec(db, sql, err);
        if (st == MT_OK)
            db->tx_depth--;
        return st;
    }
    int rc = SQLITE_BUSY;
    for (int attempt = 0; attempt < WRITE_ATTEMPTS; attempt++) {
        rc = sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL);
        if ((rc & 0xff) != SQLITE_BUSY)
            break;
        sleep_ms(20 * (attempt + 1));
    }
    if (rc != SQLITE_OK) {
        mt_status st = DB_FAIL(db, err, rc, "COMMIT");
        sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
        db->tx_depth = 0;
        return st;
    }
    db->tx_depth = 0;
    return MT_OK;
}

void db_tx_rollback(db_t *db)
{
    if (db->tx_depth <= 0)
        return;
    if (db->tx_depth > 1) {
        char sql[80];
        snprintf(sql, sizeof sql, "ROLLBACK TO sp%d; RELEASE sp%d", db->tx_depth - 1,
                 db->tx_depth - 1);
        sqlite3_exec(db->sql, sql, NULL, NULL, NULL);
        db->tx_depth--;
        return;
    }
    sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
    db->tx_depth = 0;
}

mt_status db_tx_end(db_t *db, mt_status st, mt_err *err)
{
    if (st != MT_OK) {
        db_tx_rollback(db);
        return st;
    }
    return db_tx_commit(db, err);
}

mt_status db_begin(db_t *db, mt_err *err) { return db_tx_begin(db, err); }
mt_status db_commit(db_t *db, mt_err *err) { return db_tx_commit(db, err); }
void db_rollback(db_t *db) { db_tx_rollback(db); }

/* ---- opening ------------------------------------------------------------- */

/* Looks at the file before SQLite does, so that nothing is written to a
 * file that is not a database or is cut short. *exists is false for a
 * missing path; an empty file counts as a new database. */
static mt_status check_file(const char *path, bool *exists, mt_err *err)
{
    *exists = false;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT)
            return MT_OK;
        return mt_fail(err, MT_E_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (!S_ISREG(sb.st_mode))
        return mt_fail(err, MT_E_INVALID, "%s: not a regular file", path);
    *exists = true;
    if (sb.st_size == 0)
        return MT_OK;
    unsigned char h[100];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mt_fail(err, MT_E_IO, "%s: cannot open: %s", path, strerror(errno));
    ssize_t got = pread(fd, h, sizeof h, 0);
    close(fd);
    if (got < 0)
        return mt_fail(err, MT_E_IO, "%s: cannot read: %s", path, strerror(errno));
    if (got < (ssize_t)sizeof h || memcmp(h, sqlite_magic, sizeof sqlite_magic) != 0)
        return mt_fail(err, MT_E_FORMAT,
                       "%s: not a moetune database: no SQLite header (file of %lld bytes "
                       "starts with something else or is cut short); left unchanged",
                       path, (long long)sb.st_size);
    uint32_t page = (uint32_t)h[16] << 8 | h[17];
    if (page == 1)
        page = 65536;
    if (page < 512 || (page & (page - 1)))
        return mt_fail(err, MT_E_FORMAT, "%s: corrupt SQLite header (page size %u); left unchanged",
                       path, page);
    /* A WAL file next to it may legitimately hold pages the main file lacks
     * after a crash mid-checkpoint; SQLite recovers those itself. */
    char wal[4096];
    snprintf(wal, sizeof wal, "%s-wal", path);
    struct stat wb;
    bool has_wal = stat(wal, &wb) == 0 && wb.st_size > 0;
    uint32_t pages = be32(h + 28);
    bool size_valid = pages > 0 && be32(h + 24) == be32(h + 92);
    long long want = (long long)pages * page;
    if (!has_wal && size_valid && (long long)sb.st_size < want)
        return mt_fail(err, MT_E_FORMAT,
                       "%s: truncated database: header says %u pages of %u bytes (%lld bytes), "
                       "file has %lld bytes; left unchanged",
                       path, pages, page, want, (long long)sb.st_size);
    if (!has_wal && sb.st_size % page != 0)
        return mt_fail(err, MT_E_FORMAT,
                       "%s: truncated database: %lld bytes is not a whole number of %u-byte "
                       "pages; left unchanged",
                       path, (long long)sb.st_size, page);
    return MT_OK;
}

static mt_status read_int_pragma(db_t *db, const char *sql, int *out, mt_err *err)
{
    int64_t v = *out;
    mt_status st = db_scalar(db, sql, 0, &v, err);
    *out = (int)v;
    return st;
}

/* A version-0 file with tables in it is someone else's SQLite database. */
static mt_status check_foreign(db_t *db, mt_err *err)
{
    int tables = 0;
    mt_status st = read_int_pragma(db, "SELECT count(*) FROM sqlite_master", &tables, err);
    if (st)
        return st;
    if (tables > 0)
        return mt_fail(err, MT_E_FORMAT,
                       "%s: an SQLite database, but not a moetune one (user_version 0 and %d "
                       "schema objects); left unchanged",
                       db->path, tables);
    return MT_OK;
}

static mt_status set_wal(db_t *db, mt_err *err)
{
    for (int attempt = 0; attempt < 200; attempt++) {
        sqlite3_stmt *s;
        int rc = sqlite3_prepare_v2(db->sql, "PRAGMA journal_mode=WAL", -1, &s, NULL);
        if (rc != SQLITE_OK)
            return DB_FAIL(db, err, rc, "PRAGMA journal_mode=WAL");
        rc = sqlite3_step(s);
        bool wal = rc == SQLITE_ROW && !strcmp((const char *)sqlite3_column_text(s, 0), "wal");
        sqlite3_finalize(s);
        if (wal)
            return MT_OK;
        if (rc != SQLITE_ROW && (rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED)
            return DB_FAIL(db, err, rc, "PRAGMA journal_mode=WAL");
        if (rc == SQLITE_ROW)
            return mt_fail(err, MT_E_DB, "%s: cannot switch to WAL journal mode", db->path);
        sleep_ms(50);
    }
    return mt_fail(err, MT_E_BUSY, "%s: could not switch to WAL: database stayed locked",
                   db->path);
}

/* Creates or upgrades the schema under the write lock; another process may
 * have done it meanwhile, so the version is read again inside. */
static mt_status ensure_schema(db_t *db, mt_err *err)
{
    mt_status st = db_exec(db, "PRAGMA foreign_keys=OFF", err);
    if (st)
        return st;
    st = db_tx_begin(db, err);
    if (st)
        return st;
    int v = 0;
    st = read_int_pragma(db, "PRAGMA user_version", &v, err);
    if (st == MT_OK && v > DB_SCHEMA_VERSION)
        st = mt_fail(err, MT_E_UNSUPPORTED,
                     "%s: schema version %d is newer than this moetune supports (%d); "
                     "upgrade moetune; left unchanged",
                     db->path, v, DB_SCHEMA_VERSION);
    if (st == MT_OK && v == 0)
        st = check_foreign(db, err);
    if (st == MT_OK && v == 0)
        st = db_schema_create(db, err);
    else if (st == MT_OK && v < DB_SCHEMA_VERSION)
        st = db_schema_migrate(db, v, err);
    st = db_tx_end(db, st, err);
    if (st == MT_OK)
        st = db_exec(db, "PRAGMA foreign_keys=ON", err);
    return st;
}

/* Read-only open of an older schema: upgrade a copy in memory. */
static mt_status upgrade_in_memory(db_t *db, int version, mt_err *err)
{
    sqlite3 *mem = NULL;
    int rc = sqlite3_open_v2(":memory:", &mem, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        sqlite3_close(mem);
        return mt_fail(err, MT_E_NOMEM, "%s: cannot open an in-memory copy", db->path);
    }
    sqlite3_backup *b = sqlite3_backup_init(mem, "main", db->sql, "main");
    rc = b ? sqlite3_backup_step(b, -1) : sqlite3_errcode(mem);
    if (b)
        sqlite3_backup_finish(b);
    if (rc != SQLITE_DONE) {
        mt_status st = DB_FAIL(db, err, rc, "copying into memory for a read-only upgrade");
        sqlite3_close(mem);
        return st;
    }
    sqlite3_close(db->sql);
    db->sql = mem;
    db->memory_copy = true;
    db->readonly = false;
    mt_status st = db_exec(db, "PRAGMA foreign_keys=OFF", err);
    if (st == MT_OK)
        st = db_tx_begin(db, err);
    if (st == MT_OK)
        st = db_tx_end(db, db_schema_migrate(db, version, err), err);
    db->readonly = true;
    return st;
}

mt_status db_open(const char *path, db_open_flags flags, db_t **out, mt_err *err)
{
    *out = NULL;
    if (!path || !*path)
        return mt_fail(err, MT_E_INVALID, "db_open: empty path");
    bool readonly = flags & DB_OPEN_READONLY;
    bool exists;
    mt_status st = check_file(path, &exists, err);
    if (st)
        return st;
    if (!exists && (readonly || (flags & DB_OPEN_NOCREATE)))
        return mt_fail(err, MT_E_NOT_FOUND, "%s: no such database", path);

    db_t *db = calloc(1, sizeof *db);
    if (!db || !(db->path = strdup(path))) {
        free(db);
        return mt_fail(err, MT_E_NOMEM, "%s: out of memory opening", path);
    }
    db->readonly = readonly;
    mt_rng_seed(&db->rng, mt_seed_fresh() ^ (uint64_t)(uintptr_t)db);
    int oflags = SQLITE_OPEN_NOMUTEX |
                 (readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    int rc = sqlite3_open_v2(path, &db->sql, oflags, NULL);
    if (rc != SQLITE_OK) {
        st = DB_FAIL(db, err, rc, "opening");
        goto fail;
    }
    sqlite3_extended_result_codes(db->sql, 1);
    sqlite3_busy_timeout(db->sql, BUSY_TIMEOUT_MS);

    /* Reading the version touches nothing: a newer or foreign file is
     * refused before any pragma that writes. */
    int version = 0;
    /* One read snapshot for the version and the foreign check: another
     * process may be creating the schema between two separate reads. */
    st = db_exec(db, "BEGIN", err);
    if (st == MT_OK)
        st = read_int_pragma(db, "PRAGMA user_version", &version, err);
    if (st) {
        if (st == MT_E_FORMAT)
            mt_err_prefix(err, "%s: not a moetune database or damaged; left unchanged", path);
        goto fail;
    }
    if (version > DB_SCHEMA_VERSION) {
        st = mt_fail(err, MT_E_UNSUPPORTED,
                     "%s: schema version %d is newer than this moetune supports (%d); "
                     "upgrade moetune; left unchanged",
                     path, version, DB_SCHEMA_VERSION);
        goto fail;
    }
    if (version == 0 && (st = check_foreign(db, err)))
        goto fail;
    if ((st = db_exec(db, "COMMIT", err)))
        goto fail;
    if (readonly) {
        if (version == 0) {
            st = mt_fail(err, MT_E_FORMAT, "%s: empty database (no moetune schema)", path);
            goto fail;
        }
        if (version < DB_SCHEMA_VERSION && (st = upgrade_in_memory(db, version, err)))
            goto fail;
        if ((st = db_exec(db, "PRAGMA query_only=ON", err)))
            goto fail;
    } else {
        /* Schema first, in the file's own journal mode: a failed upgrade
         * rolls back to the very same bytes. Then WAL, once for good. */
        if (version < DB_SCHEMA_VERSION && (st = ensure_schema(db, err)))
            goto fail;
        if ((st = set_wal(db, err)) || (st = db_exec(db, "PRAGMA synchronous=NORMAL", err)))
            goto fail;
        if ((st = db_exec(db, "PRAGMA foreign_keys=ON", err)))
            goto fail;
    }
    *out = db;
    return MT_OK;
fail:
    db_close(db);
    return st;
}

void db_close(db_t *db)
{
    if (!db)
        return;
    for (int i = 0; i < ST_STMT_COUNT; i++)
        sqlite3_finalize(db->stmts[i]);
    if (db->tx_depth > 0)
        sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(db->sql);
    free(db->path);
    free(db);
}

const char *db_path(const db_t *db) { return db ? db->path : NULL; }

mt_status db_integrity_check(db_t *db, bool *ok, char *msg, size_t cap, mt_err *err)
{
    *ok = false;
    if (cap)
        msg[0] = 0;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql, "PRAGMA integrity_check", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, "PRAGMA integrity_check");
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        const char *r = (const char *)sqlite3_column_text(s, 0);
        *ok = r && !strcmp(r, "ok");
        if (cap)
            snprintf(msg, cap, "%s", r ? r : "");
        rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, err, rc, "PRAGMA integrity_check");
    if (*ok) {
        rc = sqlite3_prepare_v2(db->sql, "PRAGMA foreign_key_check", -1, &s, NULL);
        if (rc != SQLITE_OK)
            return DB_FAIL(db, err, rc, "PRAGMA foreign_key_check");
        if (sqlite3_step(s) == SQLITE_ROW) {
            *ok = false;
            if (cap)
                snprintf(msg, cap, "foreign key violation in table %s row %lld",
                         (const char *)sqlite3_column_text(s, 0),
                         (long long)sqlite3_column_int64(s, 1));
        }
        sqlite3_finalize(s);
    }
    return MT_OK;
}
