/* db_records.c: a database as a stream of records keyed by natural keys
 * (fingerprints, kernel triples, session uids; never row ids). db_visit
 * reads one in export order; the sink writes records into another by the
 * merge rule. Export, import and merge are built from these two. */
#include <math.h>
#include <string.h>

#include "db_impl.h"

static const char merge_rule[] =
    "merge rule: a trial is keyed by (device fingerprint, kernel family/version/source hash, "
    "shape, M, config key); the incoming trial replaces the existing one only if it is "
    "verified (status ok) and the existing one is not ok or is strictly slower (median time); "
    "otherwise the existing one is kept. A winner, keyed by (device, kernel, shape, M): one "
    "with a decision (confirmed against the default, or the default kept or best) beats one "
    "without (decision median); between two with a decision, the incoming one replaces only "
    "if its guaranteed ratio to the default is strictly lower (the upper bound of its "
    "interval when confirmed, 1 when the default won); between two without, only a strictly "
    "faster one replaces. The winner's decision and interval travel with it. Devices, kernels and sessions are added when "
    "missing and never changed. Miss counts add up (first seen: earliest, last seen: latest). "
    "Code objects are added when missing. Rows taken from a merged database keep their origin, "
    "or get that database's name as origin.";

const char *db_merge_rule(void) { return merge_rule; }

/* ---- reading ------------------------------------------------------------- */

typedef mt_status (*row_fn)(sqlite3_stmt *s, const db_visitor *v, void *ctx, mt_err *err);

/* One section of db_visit: its row function and the caller's visitor. */
typedef struct section {
    row_fn fn;
    const db_visitor *v;
    void *ctx;
} section;

static mt_status section_row(sqlite3_stmt *s, void *arg, bool *stop, mt_err *err)
{
    (void)stop;
    const section *x = arg;
    return x->fn(s, x->v, x->ctx, err);
}

static mt_status row_device(sqlite3_stmt *s, const db_visitor *v, void *ctx, mt_err *err)
{
    db_device d = {
        .backend = sqlite3_column_int(s, 0),
        .arch = db_col_text(s, 1),
        .name = db_col_text(s, 2),
        .runtime_version = db_col_text(s, 3),
        .driver_version = db_col_text(s, 4),
        .fingerprint = db_col_text(s, 5),
        .compute_units = sqlite3_column_int(s, 6),
    };
    return v->device(ctx, &d, err);
}

static mt_status row_kernel(sqlite3_stmt *s, const db_visitor *v, void *ctx, mt_err *err)
{
    db_kernel k = {db_col_text(s, 0), sqlite3_column_int(s, 1), db_col_text(s, 2)};
    return v->kernel(ctx, &k, err);
}

static mt_status row_session(sqlite3_stmt *s, const db_visitor *v, void *ctx, mt_err *err)
{
    db_session_rec r = {
        .uid = db_col_text(s, 0),
        .argv_json = db_col_text(s, 1),
        .tool_version = db_col_text(s, 2),
        .host = db_col_text(s, 3),
        .strategy = db_col_text(s, 4),
        .budget = db_col_text(s, 5),
        .started_ms = sqlite3_column_int64(s, 6),
        .ended_ms = sqlite3_column_int64(s, 7),
        .status = sqlite3_column_int(s, 8),
        .origin = db_col_text(s, 9),
    };
    return v->session(ctx, &r, err);
}

static mt_status row_trial(sqlite3_stmt *s, const db_visitor *v, void *ctx, mt_err *err)
{
    db_trial_rec r = {
        .device_fp = db_col_text(s, 0),
        .kernel = {db_col_text(s, 1), sqlite3_column_int(s, 2), db_col_text(s, 3)},
        .session_uid = db_col_text(s, 4),
        .origin = db_col_text(s, 5),
    };
    db_trial_read(s, 6, &r.t);
    return v->trial(ctx, &r, err);
}

static mt_status row_winner(sqlite3_stmt *s, const db_visitor *v, void *ctx, mt_err *err)
{
    db_winner_rec r = {
        .device_fp = db_col_text(s, 0),
        .kernel = {db_col_text(s, 1), sqlite3_column_int(s, 2), db_col_text(s, 3)},
        .origin = db_col_text(s, 4),
        .updated_ms = sqlite3_column_int64(s, 11),
        .verified_ms = sqlite3_column_int64(s, 12),
        .verified_time_ms = db_col_real(s, 13),
    };
    r.w.confirm = (db_confirm){
        .decision = (db_decision)sqlite3_column_int(s, 14),
        .challenger_key = db_col_text(s, 15),
        .ratio = db_col_real(s, 16),
        .ratio_lo = db_col_real(s, 17),
        .ratio_hi = db_col_real(s, 18),
        .confidence = db_col_real(s, 19),
        .rounds = sqlite3_column_int(s, 20),
    };
    r.stale = sqlite3_column_int(s, 21) != 0;
    r.w.shape_key = db_col_text(s, 5);
    r.w.m = sqlite3_column_int64(s, 6);
    r.w.config_key = db_col_text(s, 7);
    r.w.config_json = db_col_text(s, 8);
    r.w.time_ms = sqlite3_column_double(s, 9);
    r.w.runner_ups_json = db_col_text(s, 10);
    return v->winner(ctx, &r, err);
}

static mt_status row_miss(sqlite3_stmt *s, const db_visitor *v, void *ctx, mt_err *err)
{
    db_miss_rec r = {
        .device_fp = db_col_text(s, 0),
        .family = db_col_text(s, 1),
        .shape_key = db_col_text(s, 2),
        .m = sqlite3_column_int64(s, 3),
        .count = sqlite3_column_int64(s, 4),
        .first_seen_ms = sqlite3_column_int64(s, 5),
        .last_seen_ms = sqlite3_column_int64(s, 6),
        .last_reason = sqlite3_column_int(s, 7),
        .shape_run = db_col_text(s, 8),
    };
    return v->miss(ctx, &r, err);
}

static mt_status row_code(sqlite3_stmt *s, const db_visitor *v, void *ctx, mt_err *err)
{
    db_code_rec r = {
        .target = db_col_text(s, 0),
        .cache_key = db_col_text(s, 1),
        .blob = sqlite3_column_blob(s, 2),
        .size = (size_t)sqlite3_column_bytes(s, 2),
        .created_ms = sqlite3_column_int64(s, 3),
    };
    return v->code(ctx, &r, err);
}

mt_status db_visit(db_t *db, const db_visitor *v, void *ctx, mt_err *err)
{
    const struct {
        bool on;
        row_fn fn;
        const char *sql;
    } parts[] = {
        {v->device != NULL, row_device,
         "SELECT backend, arch, name, runtime_version, driver_version, fingerprint, "
         "compute_units FROM devices ORDER BY fingerprint"},
        {v->kernel != NULL, row_kernel,
         "SELECT family, version, source_hash FROM kernels ORDER BY family, version, source_hash"},
        {v->session != NULL, row_session,
         "SELECT uid, argv, tool_version, host, strategy, budget, started_ms, "
         "coalesce(ended_ms, 0), status, origin FROM sessions ORDER BY started_ms, uid"},
        {v->trial != NULL, row_trial,
         "SELECT d.fingerprint, k.family, k.version, k.source_hash, se.uid, t.origin, "
         DB_TRIAL_COLUMNS " "
         "FROM trials t JOIN devices d ON d.id = t.device_id JOIN kernels k ON k.id = t.kernel_id "
         "LEFT JOIN sessions se ON se.id = t.session_id "
         "ORDER BY d.fingerprint, k.family, k.version, k.source_hash, t.shape, t.m, t.config_key"},
        {v->winner != NULL, row_winner,
         "SELECT d.fingerprint, k.family, k.version, k.source_hash, w.origin, w.shape, w.m, "
         "w.config_key, w.config_json, w.time_ms, w.runner_ups, w.updated_ms, "
         "coalesce(w.verified_ms, 0), w.verified_time_ms, " DB_WINNER_DECISION_COLUMNS ", "
         "w.stale "
         "FROM winners w JOIN devices d ON d.id = w.device_id JOIN kernels k ON k.id = w.kernel_id "
         "ORDER BY d.fingerprint, k.family, k.version, k.source_hash, w.shape, w.m"},
        {v->miss != NULL, row_miss,
         "SELECT d.fingerprint, x.family, x.shape, x.m, x.count, x.first_seen_ms, "
         "x.last_seen_ms, x.last_reason, x.shape_run "
         "FROM misses x JOIN devices d ON d.id = x.device_id "
         "ORDER BY d.fingerprint, x.family, x.shape, x.m"},
        {v->code != NULL, row_code,
         "SELECT target, cache_key, blob, created_ms FROM code_objects ORDER BY target, cache_key"},
    };
    mt_status st = MT_OK;
    for (size_t i = 0; st == MT_OK && i < sizeof parts / sizeof parts[0]; i++) {
        section x = {parts[i].fn, v, ctx};
        if (parts[i].on)
            st = db_rows_each(db, parts[i].sql, NULL, section_row, &x, "reading records", err);
    }
    return st;
}

/* ---- the sink: writing records by the merge rule ------------------------- */

static const char *origin_of(const db_sink *k, const char *own) { return own ? own : k->label; }

static mt_status device_id_of(db_t *db, const char *fp, int64_t *id, mt_err *err)
{
    bool same;
    mt_status st = db_device_find(db, fp ? fp : "", NULL, id, &same, err);
    if (st == MT_OK && !*id)
        st = mt_fail(err, MT_E_FORMAT, "record refers to device '%s', which is not listed",
                     fp ? fp : "(null)");
    return st;
}

static mt_status sink_device(void *ctx, const db_device *d, mt_err *err)
{
    db_sink *k = ctx;
    mt_status st = db_check_device(d, err);
    if (st)
        return st;
    char fp[DB_NAME_MAX];
    db_device_fingerprint(d, fp, sizeof fp);
    int64_t id;
    bool same;
    if ((st = db_device_find(k->db, fp, NULL, &id, &same, err)) || id)
        return st;
    k->stats->devices_added++;
    return db_device_put(k->db, d, fp, err);
}

static mt_status sink_kernel(void *ctx, const db_kernel *kr, mt_err *err)
{
    db_sink *k = ctx;
    int64_t id;
    mt_status st = db_check_kernel(kr, err);
    if (st || (st = db_kernel_find(k->db, kr, &id, err)) || id)
        return st;
    k->stats->kernels_added++;
    return db_kernel_upsert(k->db, kr, &id, err);
}

static mt_status session_id_of(db_t *db, const char *uid, int64_t *id, mt_err *err)
{
    *id = 0;
    if (!uid)
        return MT_OK;
    sqlite3_stmt *s;
    mt_status st = db_stmt(db, ST_SESSION_BY_UID, &s, err);
    if (st)
        return st;
    sqlite3_bind_text(s, 1, uid, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *id = sqlite3_column_int64(s, 0);
        rc = SQLITE_DONE;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "finding a session");
    return MT_OK;
}

static mt_status sink_session(void *ctx, const db_session_rec *r, mt_err *err)
{
    db_sink *k = ctx;
    if (!r->uid || !*r->uid || r->status < 0 || r->status >= DB_SESSION_STATUS_COUNT)
        return mt_fail(err, MT_E_FORMAT, "session without a uid or with a bad status");
    int64_t id;
    mt_status st = session_id_of(k->db, r->uid, &id, err);
    if (st || id)
        return st;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(k->db->sql,
                                "INSERT INTO sessions(uid, argv, tool_version, host, strategy, "
                                "budget, started_ms, ended_ms, status, origin) "
                                "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                                -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(s, 1, r->uid, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, r->argv_json ? r->argv_json : "[]", -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, r->tool_version ? r->tool_version : "", -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 4, r->host ? r->host : "", -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 5, r->strategy ? r->strategy : "", -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 6, r->budget ? r->budget : "", -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 7, r->started_ms);
        if (r->ended_ms > 0)
            sqlite3_bind_int64(s, 8, r->ended_ms);
        sqlite3_bind_int(s, 9, r->status);
        db_bind_text(s, 10, origin_of(k, r->origin));
        rc = sqlite3_step(s);
        sqlite3_finalize(s);
    }
    if (rc != SQLITE_DONE)
        return DB_FAIL(k->db, err, rc, "adding a session");
    k->stats->sessions_added++;
    return MT_OK;
}

static mt_status sink_trial(void *ctx, const db_trial_rec *r, mt_err *err)
{
    db_sink *k = ctx;
    db_trial t = r->t;
    mt_status st = device_id_of(k->db, r->device_fp, &t.device_id, err);
    if (st == MT_OK)
        st = db_kernel_upsert(k->db, &r->kernel, &t.kernel_id, err);
    if (st == MT_OK)
        st = session_id_of(k->db, r->session_uid, &t.session_id, err);
    if (st == MT_OK && r->session_uid && !t.session_id)
        st = mt_fail(err, MT_E_FORMAT, "trial refers to session '%s', which is not listed",
                     r->session_uid);
    if (st == MT_OK)
        st = db_check_trial(&t, err);
    if (st)
        return st;
    int64_t id;
    int have_status = 0;
    double have_median = NAN;
    st = db_trial_find(k->db, t.device_id, t.kernel_id, t.shape_key, t.m, t.config_key, &id,
                       &have_status, &have_median, err);
    if (st)
        return st;
    if (id) {
        bool take = t.status == DB_TRIAL_OK &&
                    (have_status != DB_TRIAL_OK || !(have_median <= t.time_median_ms));
        if (!take) {
            k->stats->trials_kept++;
            return MT_OK;
        }
        k->stats->trials_replaced++;
    } else {
        k->stats->trials_added++;
    }
    return db_trial_put(k->db, &t, origin_of(k, r->origin), err);
}

/* What a decided winner guarantees against the default: the upper bound
 * of its ratio when a challenger was confirmed, 1 when the default won. */
static double guaranteed_ratio(db_decision d, double hi)
{
    if (d == DB_DECIDED_CONFIRMED)
        return isfinite(hi) && hi > 0 ? hi : 1;
    return 1;
}

/* The merge rule for winners (db_merge_rule). */
static bool winner_beats(const db_winner *in, db_decision have_dec, double have_hi,
                         double have_ms)
{
    bool in_decided = in->confirm.decision != DB_DECIDED_MEDIAN;
    bool have_decided = have_dec != DB_DECIDED_MEDIAN;
    if (in_decided != have_decided)
        return in_decided;
    if (!in_decided)
        return in->time_ms < have_ms;
    return guaranteed_ratio(in->confirm.decision, in->confirm.ratio_hi) <
           guaranteed_ratio(have_dec, have_hi);
}

static mt_status sink_winner(void *ctx, const db_winner_rec *r, mt_err *err)
{
    db_sink *k = ctx;
    db_winner w = r->w;
    mt_status st = device_id_of(k->db, r->device_fp, &w.device_id, err);
    if (st == MT_OK)
        st = db_kernel_upsert(k->db, &r->kernel, &w.kernel_id, err);
    if (st == MT_OK)
        st = db_check_winner(&w, err);
    if (st)
        return st;
    sqlite3_stmt *s;
    if ((st = db_stmt(k->db, ST_WINNER_GET, &s, err)))
        return st;
    db_winner_key_bind(s, &w);
    int rc = sqlite3_step(s);
    bool exists = rc == SQLITE_ROW;
    double have = exists ? sqlite3_column_double(s, 1) : NAN;
    db_decision have_dec = exists ? (db_decision)sqlite3_column_int(s, 5) : DB_DECIDED_MEDIAN;
    double have_hi = exists ? db_col_real(s, 6) : NAN;
    sqlite3_reset(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return DB_FAIL(k->db, err, rc, "reading a winner");
    if (exists && !winner_beats(&w, have_dec, have_hi, have)) {
        k->stats->winners_kept++;
        return MT_OK;
    }
    if (exists)
        k->stats->winners_replaced++;
    else
        k->stats->winners_added++;
    int64_t trial_id = 0;
    st = db_trial_find(k->db, w.device_id, w.kernel_id, w.shape_key, w.m, w.config_key, &trial_id,
                       NULL, NULL, err);
    if (st)
        return st;
    st = db_winner_put(k->db, &w, trial_id, r->updated_ms > 0 ? r->updated_ms : db_now_ms(),
                       r->verified_ms, r->verified_time_ms, origin_of(k, r->origin), err);
    if (st == MT_OK && r->stale) /* the upsert cleared it */
        st = db_winner_stale_set(k->db, w.device_id, w.kernel_id, w.shape_key, w.m, err);
    return st;
}

static mt_status sink_miss(void *ctx, const db_miss_rec *r, mt_err *err)
{
    db_sink *k = ctx;
    int64_t dev;
    mt_status st = device_id_of(k->db, r->device_fp, &dev, err);
    if (st)
        return st;
    if (!r->family || !*r->family || !r->shape_key || !*r->shape_key || r->m < 1 ||
        r->count < 1 || r->last_reason < 0 || r->last_reason >= DB_PROVENANCE_COUNT)
        return mt_fail(err, MT_E_FORMAT, "miss record with an empty key or bad count/reason");
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(
        k->db->sql,
        "INSERT INTO misses(device_id, family, shape, m, count, first_seen_ms, last_seen_ms, "
        "last_reason, shape_run) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) "
        "ON CONFLICT(device_id, family, shape, m) DO UPDATE SET count = count + excluded.count, "
        "first_seen_ms = min(first_seen_ms, excluded.first_seen_ms), "
        "last_reason = CASE WHEN excluded.last_seen_ms > last_seen_ms THEN excluded.last_reason "
        "ELSE last_reason END, "
        "shape_run = CASE WHEN shape_run IS NULL OR (excluded.shape_run IS NOT NULL AND "
        "excluded.last_seen_ms > last_seen_ms) THEN excluded.shape_run ELSE shape_run END, "
        "last_seen_ms = max(last_seen_ms, excluded.last_seen_ms)",
        -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(s, 1, dev);
        sqlite3_bind_text(s, 2, r->family, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, r->shape_key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 4, r->m);
        sqlite3_bind_int64(s, 5, r->count);
        sqlite3_bind_int64(s, 6, r->first_seen_ms);
        sqlite3_bind_int64(s, 7, r->last_seen_ms);
        sqlite3_bind_int(s, 8, r->last_reason);
        if (r->shape_run && *r->shape_run)
            sqlite3_bind_text(s, 9, r->shape_run, -1, SQLITE_STATIC);
        else
            sqlite3_bind_null(s, 9);
        rc = sqlite3_step(s);
        sqlite3_finalize(s);
    }
    if (rc != SQLITE_DONE)
        return DB_FAIL(k->db, err, rc, "merging a miss");
    k->stats->misses_merged++;
    return MT_OK;
}

static mt_status sink_code(void *ctx, const db_code_rec *r, mt_err *err)
{
    db_sink *k = ctx;
    int before = sqlite3_total_changes(k->db->sql);
    mt_status st = db_code_put_at(k->db, r->target, r->cache_key, r->blob, r->size, r->created_ms,
                                  false, err);
    if (st == MT_OK && sqlite3_total_changes(k->db->sql) != before)
        k->stats->code_added++;
    return st;
}

const db_visitor db_sink_visitor = {
    .device = sink_device,
    .kernel = sink_kernel,
    .session = sink_session,
    .trial = sink_trial,
    .winner = sink_winner,
    .miss = sink_miss,
    .code = sink_code,
};
