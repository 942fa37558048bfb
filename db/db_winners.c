/* db_winners.c: winners per (device, kernel, shape, M): setting one,
 * recomputing them from ok trials, recording a confirmed decision, marking
 * one re-verified, listing them. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "db_impl.h"

mt_status db_check_winner(const db_winner *w, mt_err *err)
{
    if (!w)
        return mt_fail(err, MT_E_INVALID, "db: winner is NULL");
    const char *what = NULL;
    if (w->device_id <= 0 || w->kernel_id <= 0)
        what = "device and kernel ids are required";
    else if (!w->shape_key || !*w->shape_key)
        what = "shape key is empty";
    else if (w->m < 1)
        what = "M must be >= 1";
    else if (!w->config_key || !*w->config_key || strlen(w->config_key) > DB_CONFIG_KEY_MAX)
        what = "config key is empty or longer than DB_CONFIG_KEY_MAX";
    else if (!w->config_json || !*w->config_json || strlen(w->config_json) > DB_CONFIG_JSON_MAX)
        what = "config JSON is empty or longer than DB_CONFIG_JSON_MAX";
    else if (!(isfinite(w->time_ms) && w->time_ms > 0))
        what = "time must be > 0";
    const db_confirm *c = &w->confirm;
    if (!what && (unsigned)c->decision >= DB_DECISION_COUNT)
        what = "decision out of range";
    else if (!what && c->rounds < 0)
        what = "negative confirmation rounds";
    else if (!what && c->rounds > 0 &&
             !(isfinite(c->ratio) && c->ratio > 0 && isfinite(c->ratio_lo) && c->ratio_lo > 0 &&
               isfinite(c->ratio_hi) && c->ratio_hi >= c->ratio_lo && c->confidence > 0 &&
               c->confidence < 1))
        what = "confirmation ratios must be finite and > 0, lo <= hi, confidence in (0, 1)";
    else if (!what && c->challenger_key && strlen(c->challenger_key) > DB_CONFIG_KEY_MAX)
        what = "challenger key longer than DB_CONFIG_KEY_MAX";
    if (!what && w->runner_ups_json) {
        cJSON *j = cJSON_Parse(w->runner_ups_json);
        if (!cJSON_IsArray(j))
            what = "runner-ups are not a JSON array";
        cJSON_Delete(j);
    }
    if (what)
        return mt_fail(err, MT_E_INVALID, "db: winner %s M=%lld: %s",
                       w->shape_key ? w->shape_key : "(null)", (long long)w->m, what);
    return MT_OK;
}

void db_winner_key_bind(sqlite3_stmt *s, const db_winner *w)
{
    sqlite3_bind_int64(s, 1, w->device_id);
    sqlite3_bind_int64(s, 2, w->kernel_id);
    sqlite3_bind_text(s, 3, w->shape_key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, w->m);
}

mt_status db_winner_put(db_t *db, const db_winner *w, int64_t trial_id, int64_t updated_ms,
                        int64_t verified_ms, double verified_time_ms, const char *origin,
                        mt_err *err)
{
    sqlite3_stmt *s;
    mt_status st = db_stmt(db, ST_WINNER_UPSERT, &s, err);
    if (st)
        return st;
    db_winner_key_bind(s, w);
    if (trial_id > 0)
        sqlite3_bind_int64(s, 5, trial_id);
    sqlite3_bind_text(s, 6, w->config_key, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 7, w->config_json, -1, SQLITE_STATIC);
    sqlite3_bind_double(s, 8, w->time_ms);
    sqlite3_bind_text(s, 9, w->runner_ups_json ? w->runner_ups_json : "[]", -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 10, updated_ms);
    if (verified_ms > 0)
        sqlite3_bind_int64(s, 11, verified_ms);
    db_bind_real(s, 12, verified_time_ms);
    db_bind_text(s, 13, origin);
    const db_confirm *c = &w->confirm;
    sqlite3_bind_int(s, 14, (int)c->decision);
    db_bind_text(s, 15, c->challenger_key && *c->challenger_key ? c->challenger_key : NULL);
    if (c->rounds > 0) {
        sqlite3_bind_double(s, 16, c->ratio);
        sqlite3_bind_double(s, 17, c->ratio_lo);
        sqlite3_bind_double(s, 18, c->ratio_hi);
        sqlite3_bind_double(s, 19, c->confidence);
        sqlite3_bind_int(s, 20, c->rounds);
    }
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "writing a winner");
    return MT_OK;
}

/* The stored winner of w's key: whether there is one, whether it has the
 * same config, time and runner-ups, and its verification. */
typedef struct winner_prev {
    bool exists, same_config, same_all;
    int64_t verified_ms;
    double verified_time_ms;
    db_decision decision;
} winner_prev;

static mt_status winner_prev_get(db_t *db, const db_winner *w, winner_prev *p, mt_err *err)
{
    memset(p, 0, sizeof *p);
    p->verified_time_ms = NAN;
    sqlite3_stmt *s;
    mt_status st = db_stmt(db, ST_WINNER_GET, &s, err);
    if (st)
        return st;
    db_winner_key_bind(s, w);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        p->exists = true;
        p->same_config = !strcmp(db_col_text(s, 0), w->config_key);
        p->decision = (db_decision)sqlite3_column_int(s, 5);
        const char *ch = db_col_text(s, 8);
        const char *wch = w->confirm.challenger_key;
        p->same_all = p->same_config && sqlite3_column_double(s, 1) == w->time_ms &&
                      !strcmp(db_col_text(s, 4), w->runner_ups_json ? w->runner_ups_json : "[]") &&
                      p->decision == w->confirm.decision && w->confirm.rounds == 0 &&
                      sqlite3_column_int(s, 7) == 0 && !ch == !(wch && *wch) &&
                      (!ch || !strcmp(ch, wch));
        p->verified_ms = sqlite3_column_int64(s, 2);
        p->verified_time_ms = db_col_real(s, 3);
        rc = SQLITE_DONE;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return DB_FAIL(db, err, rc, "reading a winner");
    return MT_OK;
}

/* Writes w unless identical, or (keep_decided) unless the stored winner
 * carries a decision; keeps the verified mark when the config is the same.
 * *changed counts new winners and changed configs. */
static mt_status winner_write(db_t *db, const db_winner *w, int64_t trial_id, bool keep_decided,
                              int64_t *changed, mt_err *err)
{
    winner_prev p;
    mt_status st = winner_prev_get(db, w, &p, err);
    if (st || (p.exists && p.same_all) ||
        (keep_decided && p.exists && p.decision != DB_DECIDED_MEDIAN))
        return st;
    if (changed && !(p.exists && p.same_config))
        (*changed)++;
    return db_winner_put(db, w, trial_id, db_now_ms(), p.same_config ? p.verified_ms : 0,
                         p.same_config ? p.verified_time_ms : NAN, NULL, err);
}

mt_status db_winner_set(db_t *db, const db_winner *w, mt_err *err)
{
    mt_status st = db_check_winner(w, err);
    if (st || (st = db_tx_begin(db, err)))
        return st;
    int64_t trial_id = 0;
    st = db_trial_find(db, w->device_id, w->kernel_id, w->shape_key, w->m, w->config_key,
                       &trial_id, NULL, NULL, err);
    if (st == MT_OK)
        st = winner_write(db, w, trial_id, false, NULL, err);
    return db_tx_end(db, st, err);
}

/* One (device, kernel, shape, m) group while recomputing. */
typedef struct group {
    db_winner w;
    int64_t trial_id;
    char *shape, *key, *json;
    cJSON *runner_ups;
    bool decide;          /* db_winner_decide: overrides a stored decision */
} group;

static void group_clear(group *g)
{
    bool decide = g->decide;
    free(g->shape);
    free(g->key);
    free(g->json);
    cJSON_Delete(g->runner_ups);
    memset(g, 0, sizeof *g);
    g->decide = decide;
}

static mt_status group_flush(db_t *db, group *g, int64_t *changed, mt_err *err)
{
    if (!g->shape)
        return MT_OK;
    char *ru = cJSON_PrintUnformatted(g->runner_ups);
    if (!ru)
        return mt_fail(err, MT_E_NOMEM, "%s: runner-ups", db->path);
    g->w.runner_ups_json = ru;
    mt_status st = winner_write(db, &g->w, g->trial_id, g->decide ? false : true, changed, err);
    free(ru);
    group_clear(g);
    return st;
}

static bool same_group(const group *g, sqlite3_stmt *s)
{
    return g->shape && g->w.device_id == sqlite3_column_int64(s, 0) &&
           g->w.kernel_id == sqlite3_column_int64(s, 1) &&
           !strcmp(g->shape, db_col_text(s, 2)) && g->w.m == sqlite3_column_int64(s, 3);
}

static mt_status group_add(db_t *db, group *g, sqlite3_stmt *s, mt_err *err)
{
    if (g->shape) { /* a runner-up */
        if (cJSON_GetArraySize(g->runner_ups) >= DB_RUNNER_UPS)
            return MT_OK;
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddStringToObject(o, "config_key", db_col_text(s, 5)) ||
            !cJSON_AddNumberToObject(o, "time_ms", sqlite3_column_double(s, 7))) {
            cJSON_Delete(o);
            return mt_fail(err, MT_E_NOMEM, "%s: runner-ups", db->path);
        }
        cJSON_AddItemToArray(g->runner_ups, o);
        return MT_OK;
    }
    g->w.device_id = sqlite3_column_int64(s, 0);
    g->w.kernel_id = sqlite3_column_int64(s, 1);
    g->w.m = sqlite3_column_int64(s, 3);
    g->trial_id = sqlite3_column_int64(s, 4);
    g->w.time_ms = sqlite3_column_double(s, 7);
    g->shape = strdup(db_col_text(s, 2));
    g->key = strdup(db_col_text(s, 5));
    g->json = strdup(db_col_text(s, 6));
    g->runner_ups = cJSON_CreateArray();
    if (!g->shape || !g->key || !g->json || !g->runner_ups) {
        group_clear(g);
        return mt_fail(err, MT_E_NOMEM, "%s: recomputing winners", db->path);
    }
    g->w.shape_key = g->shape;
    g->w.config_key = g->key;
    g->w.config_json = g->json;
    return MT_OK;
}

/* Ok trials of a scope, grouped by key, fastest first. */
static const char ok_trials_sql[] =
    "SELECT device_id, kernel_id, shape, m, id, config_key, config_json, time_median_ms "
    "FROM trials WHERE status = 0 AND time_median_ms > 0 "
    "AND (?1 = 0 OR device_id = ?1) AND (?2 = 0 OR kernel_id = ?2) "
    "AND (?3 IS NULL OR shape = ?3) AND (?4 <= 0 OR m = ?4) "
    "ORDER BY device_id, kernel_id, shape, m, time_median_ms, time_min_ms, config_key";

mt_status db_winner_decide(db_t *db, int64_t device_id, int64_t kernel_id, const char *shape_key,
                           int64_t m, const char *config_key, const db_confirm *conf,
                           mt_err *err)
{
    if (device_id <= 0 || kernel_id <= 0 || !shape_key || !*shape_key || m < 1 || !config_key)
        return mt_fail(err, MT_E_INVALID, "db_winner_decide: a full key and a config are needed");
    mt_status st = db_tx_begin(db, err);
    if (st)
        return st;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql, ok_trials_sql, -1, &s, NULL);
    if (rc != SQLITE_OK)
        return db_tx_end(db, DB_FAIL(db, err, rc, "deciding a winner"), err);
    sqlite3_bind_int64(s, 1, device_id);
    sqlite3_bind_int64(s, 2, kernel_id);
    sqlite3_bind_text(s, 3, shape_key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, m);
    /* Two passes over one result: the winner first, then the others in
     * median order as runner-ups. */
    group g = {.decide = true};
    bool found = false;
    for (int pass = 0; pass < 2 && st == MT_OK; pass++) {
        while (st == MT_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
            bool is_winner = !strcmp(db_col_text(s, 5), config_key);
            if (pass == 0 && is_winner && !found) {
                found = true;
                st = group_add(db, &g, s, err);
            } else if (pass == 1 && !is_winner) {
                st = group_add(db, &g, s, err);
            }
        }
        if (st == MT_OK && rc != SQLITE_DONE)
            st = DB_FAIL(db, err, rc, "deciding a winner");
        sqlite3_reset(s);
        if (st == MT_OK && !found)
            st = mt_fail(err, MT_E_NOT_FOUND, "%s: no ok trial of %s for %s M=%lld", db->path,
                         config_key, shape_key, (long long)m);
    }
    sqlite3_finalize(s);
    if (st == MT_OK) {
        if (conf)
            g.w.confirm = *conf;
        st = db_check_winner(&g.w, err);
    }
    if (st == MT_OK)
        st = group_flush(db, &g, NULL, err);
    group_clear(&g);
    return db_tx_end(db, st, err);
}

mt_status db_winners_recompute(db_t *db, int64_t device_id, int64_t kernel_id,
                               const char *shape_key, int64_t m, int64_t *changed, mt_err *err)
{
    if (changed)
        *changed = 0;
    mt_status st = db_tx_begin(db, err);
    if (st)
        return st;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql, ok_trials_sql, -1, &s, NULL);
    if (rc != SQLITE_OK)
        return db_tx_end(db, DB_FAIL(db, err, rc, "recomputing winners"), err);
    sqlite3_bind_int64(s, 1, device_id);
    sqlite3_bind_int64(s, 2, kernel_id);
    db_bind_text(s, 3, shape_key);
    sqlite3_bind_int64(s, 4, m);
    group g = {0};
    while (st == MT_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (g.shape && !same_group(&g, s))
            st = group_flush(db, &g, changed, err);
        if (st == MT_OK)
            st = group_add(db, &g, s, err);
    }
    if (st == MT_OK && rc != SQLITE_DONE)
        st = DB_FAIL(db, err, rc, "recomputing winners");
    if (st == MT_OK)
        st = group_flush(db, &g, changed, err);
    group_clear(&g);
    sqlite3_finalize(s);
    return db_tx_end(db, st, err);
}

/* One UPDATE of the winner of a key, in its own transaction; time_ms NAN
 * leaves the verification alone and sets only the stale mark. */
static mt_status winner_update(db_t *db, int64_t device_id, int64_t kernel_id,
                               const char *shape_key, int64_t m, double time_ms, bool stale,
                               mt_err *err)
{
    mt_status st = db_tx_begin(db, err);
    if (st)
        return st;
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db->sql,
                                "UPDATE winners SET verified_ms = coalesce(?1, verified_ms), "
                                "verified_time_ms = coalesce(?2, verified_time_ms), stale = ?7 "
                                "WHERE device_id = ?3 AND kernel_id = ?4 AND shape = ?5 AND m = ?6",
                                -1, &s, NULL);
    if (rc == SQLITE_OK) {
        if (isfinite(time_ms)) {
            sqlite3_bind_int64(s, 1, db_now_ms());
            sqlite3_bind_double(s, 2, time_ms);
        }
        sqlite3_bind_int(s, 7, stale);
        sqlite3_bind_int64(s, 3, device_id);
        sqlite3_bind_int64(s, 4, kernel_id);
        sqlite3_bind_text(s, 5, shape_key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 6, m);
        rc = sqlite3_step(s);
        sqlite3_finalize(s);
    }
    if (rc != SQLITE_DONE)
        st = DB_FAIL(db, err, rc, "marking a winner verified");
    else if (sqlite3_changes(db->sql) == 0)
        st = mt_fail(err, MT_E_NOT_FOUND, "%s: no winner for %s M=%lld", db->path, shape_key,
                     (long long)m);
    return db_tx_end(db, st, err);
}

mt_status db_winner_verify(db_t *db, int64_t device_id, int64_t kernel_id, const char *shape_key,
                           int64_t m, double time_ms, bool stale, mt_err *err)
{
    if (!shape_key || !(isfinite(time_ms) && time_ms > 0))
        return mt_fail(err, MT_E_INVALID, "db_winner_verify: shape and a time > 0 needed");
    return winner_update(db, device_id, kernel_id, shape_key, m, time_ms, stale, err);
}

mt_status db_winner_mark_verified(db_t *db, int64_t device_id, int64_t kernel_id,
                                  const char *shape_key, int64_t m, double time_ms, mt_err *err)
{
    return db_winner_verify(db, device_id, kernel_id, shape_key, m, time_ms, false, err);
}

mt_status db_winner_stale_set(db_t *db, int64_t device_id, int64_t kernel_id,
                              const char *shape_key, int64_t m, mt_err *err)
{
    return winner_update(db, device_id, kernel_id, shape_key, m, NAN, true, err);
}

typedef struct winner_cb {
    db_winner_fn fn;
    void *ctx;
} winner_cb;

static mt_status winner_row(sqlite3_stmt *s, void *arg, bool *stop, mt_err *err)
{
    (void)err;
    const winner_cb *cb = arg;
    db_winner_row r = {
        .device_id = sqlite3_column_int64(s, 0),
        .kernel_id = sqlite3_column_int64(s, 1),
        .trial_id = sqlite3_column_int64(s, 2),
        .family = db_col_text(s, 3),
        .version = sqlite3_column_int(s, 4),
        .source_hash = db_col_text(s, 5),
        .shape_key = db_col_text(s, 6),
        .m = sqlite3_column_int64(s, 7),
        .config_key = db_col_text(s, 8),
        .config_json = db_col_text(s, 9),
        .runner_ups_json = db_col_text(s, 10),
        .time_ms = sqlite3_column_double(s, 11),
        .updated_ms = sqlite3_column_int64(s, 12),
        .verified_ms = sqlite3_column_int64(s, 13),
        .verified_time_ms = db_col_real(s, 14),
        .origin = db_col_text(s, 15),
        .confirm = {
            .decision = (db_decision)sqlite3_column_int(s, 16),
            .challenger_key = db_col_text(s, 17),
            .ratio = db_col_real(s, 18),
            .ratio_lo = db_col_real(s, 19),
            .ratio_hi = db_col_real(s, 20),
            .confidence = db_col_real(s, 21),
            .rounds = sqlite3_column_int(s, 22),
        },
        .stale = sqlite3_column_int(s, 23) != 0,
    };
    db_device_row_read(s, 24, &r.device);
    *stop = cb->fn(cb->ctx, &r) != 0;
    return MT_OK;
}

mt_status db_winners_each(db_t *db, const db_filter *f, db_winner_fn fn, void *ctx, mt_err *err)
{
    winner_cb cb = {fn, ctx};
    return db_rows_each(
        db,
        "SELECT w.device_id, w.kernel_id, coalesce(w.trial_id, 0), k.family, k.version, "
        "k.source_hash, w.shape, w.m, w.config_key, w.config_json, w.runner_ups, w.time_ms, "
        "w.updated_ms, coalesce(w.verified_ms, 0), w.verified_time_ms, w.origin, "
        DB_WINNER_DECISION_COLUMNS ", w.stale, " DB_DEVICE_COLUMNS " "
        "FROM winners w JOIN devices d ON d.id = w.device_id JOIN kernels k ON k.id = w.kernel_id "
        "WHERE " DB_FILTER_KERNEL " AND (?2 IS NULL OR w.shape = ?2) "
        "AND (?3 <= 0 OR w.m = ?3) AND (?4 IS NULL OR d.fingerprint = ?4 OR d.name = ?4) "
        "ORDER BY d.fingerprint, k.family, k.version, k.source_hash, w.shape, w.m",
        f, winner_row, &cb, "listing winners", err);
}
