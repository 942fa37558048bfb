/* db_lookup.c: the runtime lookup (device, kernel, shape, M) -> config with
 * provenance, and coverage (many lookups, no misses recorded). The rule is
 * in db.h at db_lookup and in docs/DB.md; the hot path is one cached,
 * indexed query. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "db_impl.h"

typedef struct query {
    const db_device *dev;
    char fp[DB_NAME_MAX];
    const char *family, *hash, *shape;
    int version;
    int64_t m;
} query;

static void bind_query(sqlite3_stmt *s, const query *q)
{
    sqlite3_bind_text(s, 1, q->family, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, q->version);
    sqlite3_bind_text(s, 3, q->hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, q->shape, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 5, q->m);
    sqlite3_bind_int(s, 6, q->dev->backend);
    sqlite3_bind_text(s, 7, q->dev->arch, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 8, q->dev->name ? q->dev->name : "", -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 9, q->dev->compute_units);
    sqlite3_bind_text(s, 10, q->fp, -1, SQLITE_STATIC);
}

static void copy_text(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src ? src : "", n);
    dst[n] = 0;
}

/* Columns of LOOKUP_COLUMNS (db_stmt.c). */
static void take_hit(db_lookup_result *out, sqlite3_stmt *s)
{
    out->has_config = true;
    copy_text(out->config_json, sizeof out->config_json, db_col_text(s, 0));
    copy_text(out->config_key, sizeof out->config_key, db_col_text(s, 1));
    out->tuned_m = sqlite3_column_int64(s, 2);
    out->time_ms = sqlite3_column_double(s, 3);
    copy_text(out->device_name, sizeof out->device_name, db_col_text(s, 4));
    out->device_compute_units = sqlite3_column_int(s, 5);
    copy_text(out->device_fingerprint, sizeof out->device_fingerprint, db_col_text(s, 6));
    out->stale = sqlite3_column_int(s, 8) != 0;
}

/* True when tuned size a is a better stand-in for m than b: smaller
 * |log2(m) - log2(x)|, i.e. smaller max(m,x)/min(m,x); on a tie the larger.
 * Compared exactly as cross products. */
static bool closer(int64_t m, int64_t a, int64_t b)
{
    unsigned __int128 ra_hi = (unsigned __int128)(uint64_t)(a > m ? a : m);
    unsigned __int128 ra_lo = (unsigned __int128)(uint64_t)(a > m ? m : a);
    unsigned __int128 rb_hi = (unsigned __int128)(uint64_t)(b > m ? b : m);
    unsigned __int128 rb_lo = (unsigned __int128)(uint64_t)(b > m ? m : b);
    unsigned __int128 lhs = ra_hi * rb_lo, rhs = rb_hi * ra_lo; /* ra < rb <=> lhs < rhs */
    return lhs < rhs || (lhs == rhs && a > b);
}

/* How a row ranks against the best so far: M closeness first (for the
 * exact query every row has the same M), then the caller's own fingerprint
 * (same device model), then the nearest compute-unit count (other device),
 * then the faster time. */
typedef struct rank {
    int64_t m;
    int other_fp;  /* 0: the caller's own fingerprint */
    int64_t cu_diff;
    double time;
} rank;

static bool better(const query *q, const rank *a, const rank *b)
{
    if (a->m != b->m)
        return closer(q->m, a->m, b->m);
    if (a->other_fp != b->other_fp)
        return a->other_fp < b->other_fp;
    if (a->cu_diff != b->cu_diff)
        return a->cu_diff < b->cu_diff;
    return a->time < b->time;
}

/* Steps a lookup statement (columns of LOOKUP_COLUMNS) and takes the best
 * row by `better`. */
static mt_status take_best(db_t *db, sqlite3_stmt *s, const query *q, db_lookup_result *out,
                           bool *found, mt_err *err)
{
    *found = false;
    rank best = {0};
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t cu = sqlite3_column_int(s, 5) - q->dev->compute_units;
        rank r = {
            .m = sqlite3_column_int64(s, 2),
            .other_fp = strcmp(db_col_text(s, 6), q->fp) != 0,
            .cu_diff = cu < 0 ? -cu : cu,
            .time = sqlite3_column_double(s, 3),
        };
        if (!*found || better(q, &r, &best)) {
            take_hit(out, s);
            best = r;
            *found = true;
        }
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "looking up a config");
    return MT_OK;
}

static void short_hash(char *dst, size_t cap, const char *h)
{
    snprintf(dst, cap, "%.12s", h ? h : "");
}

static mt_status lookup(db_t *db, const query *q, db_lookup_result *out, mt_err *err)
{
    const db_device *dev = q->dev;
    const char *name = dev->name ? dev->name : "";
    sqlite3_stmt *s;
    bool found = false;

    /* 1. exact M on this device model. */
    mt_status st = db_stmt(db, ST_LOOKUP_EXACT, &s, err);
    if (st)
        return st;
    bind_query(s, q);
    if ((st = take_best(db, s, q, out, &found, err)))
        return st;
    if (found) {
        out->provenance = DB_HIT_EXACT;
        if (strcmp(out->device_fingerprint, q->fp) != 0)
            snprintf(out->message, sizeof out->message,
                     "%s %s M=%lld: tuned on the same device model under another runtime or "
                     "driver (fingerprint %.16s)",
                     q->family, q->shape, (long long)q->m, out->device_fingerprint);
        return MT_OK;
    }

    /* 2. nearest tuned M for this shape on this device model: pick the M
     * from the index alone, then fetch its row as in 1. */
    if ((st = db_stmt(db, ST_LOOKUP_SHAPE, &s, err)))
        return st;
    bind_query(s, q);
    int64_t best_m = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t tm = sqlite3_column_int64(s, 0);
        if (!best_m || closer(q->m, tm, best_m))
            best_m = tm;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "looking up tuned Ms");
    if (best_m) {
        query at = *q;
        at.m = best_m;
        if ((st = db_stmt(db, ST_LOOKUP_EXACT, &s, err)))
            return st;
        bind_query(s, &at);
        if ((st = take_best(db, s, &at, out, &found, err)))
            return st;
    }
    if (found) {
        out->provenance = DB_HIT_NEAREST;
        snprintf(out->message, sizeof out->message,
                 "%s %s M=%lld: not tuned at this M; using the config tuned at M=%lld "
                 "(nearest in log2)",
                 q->family, q->shape, (long long)q->m, (long long)out->tuned_m);
        return MT_OK;
    }

    /* 3. another device of the same backend and arch. */
    if ((st = db_stmt(db, ST_LOOKUP_OTHER, &s, err)))
        return st;
    bind_query(s, q);
    if ((st = take_best(db, s, q, out, &found, err)))
        return st;
    if (found) {
        out->provenance = DB_OTHER_DEVICE;
        snprintf(out->message, sizeof out->message,
                 "%s %s M=%lld: not tuned for %s (%d CUs); using the config tuned on %s "
                 "(%d CUs, same arch %s) at M=%lld; tune this device for its own",
                 q->family, q->shape, (long long)q->m, name, dev->compute_units,
                 out->device_name, out->device_compute_units, dev->arch,
                 (long long)out->tuned_m);
        return MT_OK;
    }

    /* 4. entries only for another kernel version or source hash. */
    if ((st = db_stmt(db, ST_LOOKUP_STALE, &s, err)))
        return st;
    bind_query(s, q);
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        char old[16], cur[16];
        short_hash(old, sizeof old, db_col_text(s, 1));
        short_hash(cur, sizeof cur, q->hash);
        copy_text(out->stale_hash, sizeof out->stale_hash, db_col_text(s, 1));
        out->provenance = DB_STALE;
        snprintf(out->message, sizeof out->message,
                 "%s %s M=%lld: %lld tuned entries are stale (kernel v%d source %s; current v%d "
                 "source %s) and not used; running the default config (re-tune, or drop them "
                 "with moetune db gc)",
                 q->family, q->shape, (long long)q->m, (long long)sqlite3_column_int64(s, 2),
                 sqlite3_column_int(s, 0), old, q->version, cur);
        rc = SQLITE_DONE;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "looking for stale entries");

    /* 5. nothing usable. */
    if (out->provenance != DB_STALE) {
        out->provenance = DB_MISS;
        snprintf(out->message, sizeof out->message,
                 "%s %s M=%lld: no tuned config for %s (%s, %d CUs); running the default config",
                 q->family, q->shape, (long long)q->m, name, dev->arch, dev->compute_units);
    }
    return MT_OK;
}

static mt_status prepare(const db_device *dev, const char *family, int version, const char *hash,
                         const char *shape, int64_t m, query *q, db_lookup_result *out,
                         mt_err *err)
{
    memset(out, 0, sizeof *out);
    out->time_ms = NAN;
    out->provenance = DB_MISS;
    mt_status st = db_check_device(dev, err);
    if (st)
        return st;
    if (!family || !*family || !hash || !*hash || !shape || !*shape || m < 1)
        return mt_fail(err, MT_E_INVALID,
                       "db_lookup: family, source hash, shape and M >= 1 are required");
    q->dev = dev;
    db_device_fingerprint(dev, q->fp, sizeof q->fp);
    q->family = family;
    q->version = version;
    q->hash = hash;
    q->shape = shape;
    q->m = m;
    return MT_OK;
}

mt_status db_lookup(db_t *db, const db_device *dev, const char *family, int version,
                    const char *source_hash, const char *shape_key, int64_t m,
                    db_lookup_result *out, mt_err *err)
{
    query q;
    mt_status st = prepare(dev, family, version, source_hash, shape_key, m, &q, out, err);
    if (st)
        return st;
    st = lookup(db, &q, out, err);
    if (st == MT_OK && out->has_config && out->stale) {
        size_t n = strlen(out->message);
        snprintf(out->message + n, sizeof out->message - n,
                 "%s%s %s M=%lld: the config %s was marked stale by `moetune db verify` (it no "
                 "longer beat its runner-up or the default there); it is still used: re-tune it",
                 n ? "; " : "", family, shape_key, (long long)m, out->config_key);
    }
    return st;
}

mt_status db_coverage(db_t *db, const db_device *dev, const db_coverage_query *queries, int n,
                      db_lookup_result *out, mt_err *err)
{
    if (n < 0 || (n > 0 && (!queries || !out)))
        return mt_fail(err, MT_E_INVALID, "db_coverage: bad query list");
    for (int i = 0; i < n; i++) {
        const db_coverage_query *c = &queries[i];
        query q;
        mt_status st = prepare(dev, c->family, c->version, c->source_hash, c->shape_key, c->m, &q,
                               &out[i], err);
        if (st == MT_OK)
            st = lookup(db, &q, &out[i], err);
        if (st)
            return mt_err_prefix(err, "coverage query %d", i);
    }
    return MT_OK;
}

bool db_provenance_is_miss(db_provenance p)
{
    return p == DB_OTHER_DEVICE || p == DB_STALE || p == DB_MISS;
}

mt_status db_lookup_record_miss(db_t *db, const db_device *dev, const char *family,
                                const char *shape_key, const char *shape_run, int64_t m,
                                db_lookup_result *r, mt_err *err)
{
    if (!r)
        return mt_fail(err, MT_E_INVALID, "db_lookup_record_miss: no lookup result");
    if (!db_provenance_is_miss(r->provenance) || r->miss_recorded)
        return MT_OK;
    size_t n = strlen(r->message);
    char *tail = r->message + n;
    size_t room = sizeof r->message - n;
    if (db->readonly) {
        snprintf(tail, room, " (miss not recorded: read-only database)");
        return MT_OK;
    }
    mt_err e = MT_ERR_INIT;
    mt_status st = db_miss_record_reason(db, dev, family, shape_key, shape_run, m, r->provenance,
                                         &e);
    if (st == MT_OK) {
        r->miss_recorded = true;
        return MT_OK;
    }
    if (st == MT_E_INVALID)
        return mt_fail(err, st, "%s", e.msg);
    snprintf(tail, room, " (miss not recorded: %s)", e.msg);
    return MT_OK;
}
