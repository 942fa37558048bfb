/* db_merge.c: merging another database file into this one (by the rule of
 * db_merge_rule()) and garbage-collecting results of kernel sources that
 * are no longer current. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "db_impl.h"

static void read_uid(db_t *db, char *out, size_t cap)
{
    snprintf(out, cap, "?");
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db->sql, "SELECT value FROM meta WHERE key = 'uid'", -1, &s, NULL) !=
        SQLITE_OK)
        return;
    if (sqlite3_step(s) == SQLITE_ROW)
        snprintf(out, cap, "%s", db_col_text(s, 0));
    sqlite3_finalize(s);
}

static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

mt_status db_merge(db_t *db, const char *src_path, db_merge_stats *stats, mt_err *err)
{
    db_merge_stats local;
    if (!stats)
        stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!src_path || !*src_path)
        return mt_fail(err, MT_E_INVALID, "db_merge: empty source path");
    if (same_file(src_path, db->path))
        return mt_fail(err, MT_E_INVALID, "%s: cannot merge a database into itself", src_path);
    mt_status st = db_check_writable(db, "merge", err);
    if (st)
        return st;
    db_t *src;
    if ((st = db_open(src_path, DB_OPEN_READONLY, &src, err)))
        return mt_err_prefix(err, "merge source");
    char uid[64], label[4200];
    read_uid(src, uid, sizeof uid);
    snprintf(label, sizeof label, "%s (db %s)", src_path, uid);
    db_sink k = {db, label, stats};
    st = db_tx_begin(db, err);
    if (st == MT_OK) {
        /* The source is read in one snapshot. */
        mt_status rs = db_exec(src, "BEGIN", err);
        st = rs ? rs : db_visit(src, &db_sink_visitor, &k, err);
        if (rs == MT_OK)
            db_exec(src, "COMMIT", NULL);
        st = db_tx_end(db, st, err);
    }
    if (st)
        memset(stats, 0, sizeof *stats);
    db_close(src);
    return st;
}

/* ---- gc ------------------------------------------------------------------ */

static bool keeps(const db_keep_hash *keep, int n, const char *family, const char *hash,
                  bool *named)
{
    *named = false;
    for (int i = 0; i < n; i++) {
        if (strcmp(keep[i].family, family) != 0)
            continue;
        *named = true;
        if (!strcmp(keep[i].source_hash, hash))
            return true;
    }
    return false;
}

static mt_status count_by_kernel(db_t *db, const char *table, int64_t kernel_id, int64_t *n,
                                 mt_err *err)
{
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE kernel_id = ?1", table);
    int64_t c = 0;
    mt_status st = db_scalar(db, sql, kernel_id, &c, err);
    *n += c;
    return st;
}

static mt_status delete_kernel(db_t *db, int64_t kernel_id, mt_err *err)
{
    static const char *const sql[] = {
        "DELETE FROM winners WHERE kernel_id = ?1",
        "DELETE FROM trials WHERE kernel_id = ?1",
        "DELETE FROM kernels WHERE id = ?1",
    };
    for (size_t i = 0; i < sizeof sql / sizeof sql[0]; i++) {
        sqlite3_stmt *s;
        int rc = sqlite3_prepare_v2(db->sql, sql[i], -1, &s, NULL);
        if (rc == SQLITE_OK) {
            sqlite3_bind_int64(s, 1, kernel_id);
            rc = sqlite3_step(s);
            sqlite3_finalize(s);
        }
        if (rc != SQLITE_DONE)
            return DB_FAIL(db, err, rc, sql[i]);
    }
    return MT_OK;
}

mt_status db_gc(db_t *db, const db_keep_hash *keep, int n, bool dry_run, db_gc_stats *stats,
                mt_err *err)
{
    db_gc_stats local;
    if (!stats)
        stats = &local;
    memset(stats, 0, sizeof *stats);
    if (n < 0 || (n > 0 && !keep))
        return mt_fail(err, MT_E_INVALID, "db_gc: bad keep list");
    for (int i = 0; i < n; i++)
        if (!keep[i].family || !*keep[i].family || !keep[i].source_hash || !*keep[i].source_hash)
            return mt_fail(err, MT_E_INVALID, "db_gc: keep entry %d needs a family and a hash", i);
    mt_status st = dry_run ? MT_OK : db_tx_begin(db, err);
    if (st)
        return st;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql, "SELECT id, family, source_hash FROM kernels ORDER BY id",
                                -1, &s, NULL);
    if (rc != SQLITE_OK)
        st = DB_FAIL(db, err, rc, "listing kernels");
    int64_t *drop = NULL;
    size_t ndrop = 0, cap = 0;
    while (st == MT_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        bool named;
        if (keeps(keep, n, db_col_text(s, 1), db_col_text(s, 2), &named) || !named)
            continue;
        if (ndrop == cap) {
            size_t nc = cap ? 2 * cap : 16;
            int64_t *p = realloc(drop, nc * sizeof *p);
            if (!p) {
                st = mt_fail(err, MT_E_NOMEM, "db_gc: kernel list");
                break;
            }
            drop = p;
            cap = nc;
        }
        drop[ndrop++] = sqlite3_column_int64(s, 0);
    }
    if (st == MT_OK && rc != SQLITE_DONE)
        st = DB_FAIL(db, err, rc, "listing kernels");
    sqlite3_finalize(s);
    for (size_t i = 0; st == MT_OK && i < ndrop; i++) {
        st = count_by_kernel(db, "trials", drop[i], &stats->trials_removed, err);
        if (st == MT_OK)
            st = count_by_kernel(db, "winners", drop[i], &stats->winners_removed, err);
        if (st == MT_OK && !dry_run)
            st = delete_kernel(db, drop[i], err);
        stats->kernels_removed++;
    }
    free(drop);
    if (st)
        memset(stats, 0, sizeof *stats);
    return dry_run ? st : db_tx_end(db, st, err);
}
