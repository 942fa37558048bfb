/* db_json.c: export to and import from the stable JSON format of
 * docs/DB.md. Sections come in a fixed order, one record per line, keys
 * sorted, no row ids; doubles are printed with the fewest digits that read
 * back exactly, so export -> import -> export is byte-identical. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/files.h"
#include "db_impl.h"

#define FORMAT_NAME "moetune-db"

enum section { SEC_DEVICES, SEC_KERNELS, SEC_SESSIONS, SEC_TRIALS, SEC_WINNERS, SEC_MISSES,
               SEC_COUNT };
static const char *const section_names[SEC_COUNT] = {
    [SEC_DEVICES] = "devices", [SEC_KERNELS] = "kernels", [SEC_SESSIONS] = "sessions",
    [SEC_TRIALS] = "trials",   [SEC_WINNERS] = "winners", [SEC_MISSES] = "misses",
};

/* ---- writing ------------------------------------------------------------- */

typedef struct writer {
    FILE *f;
    int section;     /* open section, -1 before the first */
    bool first_item; /* no record written in the open section yet */
} writer;

static int key_cmp(const void *a, const void *b)
{
    const cJSON *x = *(const cJSON *const *)a, *y = *(const cJSON *const *)b;
    return strcmp(x->string, y->string);
}

/* Sorts an object's members by key, relinking cJSON's list (the head's prev
 * points at the tail). */
static bool sort_keys(cJSON *o)
{
    int n = cJSON_GetArraySize(o);
    if (n < 2)
        return true;
    cJSON **v = malloc((size_t)n * sizeof *v);
    if (!v)
        return false;
    int i = 0;
    for (cJSON *c = o->child; c; c = c->next)
        v[i++] = c;
    qsort(v, (size_t)n, sizeof *v, key_cmp);
    for (i = 0; i < n; i++) {
        v[i]->next = i + 1 < n ? v[i + 1] : NULL;
        v[i]->prev = i > 0 ? v[i - 1] : v[n - 1];
    }
    o->child = v[0];
    free(v);
    return true;
}

/* Shortest %.Ng that reads back to exactly d. */
static void format_double(char *buf, size_t cap, double d)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            return;
    }
}

static void add_real(cJSON *o, const char *key, double d)
{
    if (!isfinite(d)) {
        cJSON_AddNullToObject(o, key);
        return;
    }
    char buf[40];
    format_double(buf, sizeof buf, d);
    cJSON_AddRawToObject(o, key, buf);
}

static void add_int(cJSON *o, const char *key, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    cJSON_AddRawToObject(o, key, buf);
}

/* 0 means "none" for optional integers. */
static void add_int_or_null(cJSON *o, const char *key, int64_t v)
{
    if (v)
        add_int(o, key, v);
    else
        cJSON_AddNullToObject(o, key);
}

static void add_str(cJSON *o, const char *key, const char *s)
{
    if (s)
        cJSON_AddStringToObject(o, key, s);
    else
        cJSON_AddNullToObject(o, key);
}

static mt_status open_section(writer *w, int sec, mt_err *err)
{
    while (w->section < sec) {
        if (w->section >= 0)
            fputs("\n]", w->f);
        w->section++;
        if (w->section < SEC_COUNT)
            fprintf(w->f, ",\n\"%s\": [", section_names[w->section]);
        w->first_item = true;
    }
    if (ferror(w->f))
        return mt_fail(err, MT_E_IO, "export: write failed");
    return MT_OK;
}

static mt_status emit(writer *w, int sec, cJSON *o, mt_err *err)
{
    mt_status st = MT_OK;
    char *text = NULL;
    if (!o || !sort_keys(o) || !(text = cJSON_PrintUnformatted(o)))
        st = mt_fail(err, MT_E_NOMEM, "export: out of memory");
    if (st == MT_OK)
        st = open_section(w, sec, err);
    if (st == MT_OK) {
        fputs(w->first_item ? "\n" : ",\n", w->f);
        fputs(text, w->f);
        w->first_item = false;
        if (ferror(w->f))
            st = mt_fail(err, MT_E_IO, "export: write failed");
    }
    free(text);
    cJSON_Delete(o);
    return st;
}

static mt_status w_device(void *ctx, const db_device *d, mt_err *err)
{
    cJSON *o = cJSON_CreateObject();
    add_str(o, "arch", d->arch);
    add_str(o, "backend", db_backend_name(d->backend));
    add_int(o, "compute_units", d->compute_units);
    add_str(o, "driver_version", d->driver_version);
    add_str(o, "fingerprint", d->fingerprint);
    add_str(o, "name", d->name);
    add_str(o, "runtime_version", d->runtime_version);
    return emit(ctx, SEC_DEVICES, o, err);
}

static mt_status w_kernel(void *ctx, const db_kernel *k, mt_err *err)
{
    cJSON *o = cJSON_CreateObject();
    add_str(o, "family", k->family);
    add_str(o, "source_hash", k->source_hash);
    add_int(o, "version", k->version);
    return emit(ctx, SEC_KERNELS, o, err);
}

static mt_status w_session(void *ctx, const db_session_rec *r, mt_err *err)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *argv = cJSON_Parse(r->argv_json ? r->argv_json : "[]");
    if (cJSON_IsArray(argv))
        cJSON_AddItemToObject(o, "argv", argv);
    else {
        cJSON_Delete(argv);
        add_str(o, "argv", r->argv_json);
    }
    add_str(o, "budget", r->budget);
    add_int_or_null(o, "ended_ms", r->ended_ms);
    add_str(o, "host", r->host);
    add_str(o, "origin", r->origin);
    add_int(o, "started_ms", r->started_ms);
    add_str(o, "status", db_session_status_str((db_session_status)r->status));
    add_str(o, "strategy", r->strategy);
    add_str(o, "tool_version", r->tool_version);
    add_str(o, "uid", r->uid);
    return emit(ctx, SEC_SESSIONS, o, err);
}

static mt_status w_trial(void *ctx, const db_trial_rec *r, mt_err *err)
{
    const db_trial *t = &r->t;
    cJSON *o = cJSON_CreateObject();
    add_real(o, "compile_ms", t->compile_ms);
    add_str(o, "config", t->config_json);
    add_str(o, "config_key", t->config_key);
    add_int(o, "created_ms", t->created_ms);
    add_str(o, "device", r->device_fp);
    add_str(o, "error", t->error);
    add_str(o, "family", r->kernel.family);
    add_real(o, "gbps", t->gbps);
    add_real(o, "gflops", t->gflops);
    add_int(o, "m", t->m);
    add_str(o, "origin", r->origin);
    add_int_or_null(o, "repetitions", t->repetitions);
    add_str(o, "resources", t->resources_json);
    add_str(o, "session", r->session_uid);
    add_str(o, "shape", t->shape_key);
    add_str(o, "source_hash", r->kernel.source_hash);
    add_str(o, "status", db_trial_status_str(t->status));
    add_real(o, "time_median_ms", t->time_median_ms);
    add_real(o, "time_min_ms", t->time_min_ms);
    add_real(o, "time_p10_ms", t->time_p10_ms);
    add_real(o, "time_p90_ms", t->time_p90_ms);
    add_int(o, "version", r->kernel.version);
    return emit(ctx, SEC_TRIALS, o, err);
}

static mt_status w_winner(void *ctx, const db_winner_rec *r, mt_err *err)
{
    cJSON *o = cJSON_CreateObject();
    add_str(o, "config", r->w.config_json);
    add_str(o, "config_key", r->w.config_key);
    const db_confirm *c = &r->w.confirm;
    add_str(o, "challenger", c->challenger_key);
    add_real(o, "confidence", c->rounds > 0 ? c->confidence : NAN);
    add_str(o, "decision", db_decision_str(c->decision));
    add_str(o, "device", r->device_fp);
    add_str(o, "family", r->kernel.family);
    add_int(o, "m", r->w.m);
    add_str(o, "origin", r->origin);
    add_real(o, "ratio", c->rounds > 0 ? c->ratio : NAN);
    add_real(o, "ratio_hi", c->rounds > 0 ? c->ratio_hi : NAN);
    add_real(o, "ratio_lo", c->rounds > 0 ? c->ratio_lo : NAN);
    add_int_or_null(o, "rounds", c->rounds);
    add_str(o, "runner_ups", r->w.runner_ups_json);
    add_str(o, "shape", r->w.shape_key);
    add_str(o, "source_hash", r->kernel.source_hash);
    if (r->stale) /* only when set: unverified exports stay as they were */
        cJSON_AddBoolToObject(o, "stale", true);
    add_real(o, "time_ms", r->w.time_ms);
    add_int(o, "updated_ms", r->updated_ms);
    add_int_or_null(o, "verified_ms", r->verified_ms);
    add_real(o, "verified_time_ms", r->verified_time_ms);
    add_int(o, "version", r->kernel.version);
    return emit(ctx, SEC_WINNERS, o, err);
}

static mt_status w_miss(void *ctx, const db_miss_rec *r, mt_err *err)
{
    cJSON *o = cJSON_CreateObject();
    add_int(o, "count", r->count);
    add_str(o, "device", r->device_fp);
    add_str(o, "family", r->family);
    add_int(o, "first_seen_ms", r->first_seen_ms);
    add_str(o, "last_reason", db_provenance_str((db_provenance)r->last_reason));
    add_int(o, "last_seen_ms", r->last_seen_ms);
    add_int(o, "m", r->m);
    add_str(o, "shape", r->shape_key);
    add_str(o, "shape_run", r->shape_run);
    return emit(ctx, SEC_MISSES, o, err);
}

mt_status db_export(db_t *db, FILE *out, mt_err *err)
{
    static const db_visitor v = {
        .device = w_device,
        .kernel = w_kernel,
        .session = w_session,
        .trial = w_trial,
        .winner = w_winner,
        .miss = w_miss,
    };
    writer w = {.f = out, .section = -1};
    fprintf(out, "{\n\"format\": \"%s\",\n\"format_version\": %d,\n\"schema_version\": %d",
            FORMAT_NAME, DB_EXPORT_FORMAT_VERSION, DB_SCHEMA_VERSION);
    /* One read transaction, so the export is a consistent snapshot (inside
     * the caller's transaction, that one already is). */
    bool own = sqlite3_get_autocommit(db->sql);
    mt_status st = own ? db_exec(db, "BEGIN", err) : MT_OK;
    if (st)
        return st;
    st = db_visit(db, &v, &w, err);
    if (own)
        db_exec(db, "COMMIT", NULL);
    if (st == MT_OK)
        st = open_section(&w, SEC_COUNT, err);
    if (st == MT_OK) {
        fputs("\n}\n", out);
        if (fflush(out) != 0 || ferror(out))
            st = mt_fail(err, MT_E_IO, "export: write failed");
    }
    if (st)
        mt_err_prefix(err, "%s", db->path);
    return st;
}

/* ---- reading ------------------------------------------------------------- */

/* Where a field came from, for messages: "<path>: trials[12].config_key". */
typedef struct rd {
    const char *path;
    const char *section;
    int index;
} rd;

static mt_status bad(const rd *r, const char *key, const char *why, mt_err *err)
{
    return mt_fail(err, MT_E_FORMAT, "%s: %s[%d].%s: %s", r->path, r->section, r->index, key,
                   why);
}

/* A string field: NULL for null; missing or non-string is an error unless
 * optional (missing reads as NULL). */
static mt_status get_str(const rd *r, const cJSON *o, const char *key, bool optional,
                         const char **out, mt_err *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    if (!j)
        return optional ? MT_OK : bad(r, key, "missing", err);
    if (cJSON_IsNull(j))
        return MT_OK;
    if (!cJSON_IsString(j))
        return bad(r, key, "not a string", err);
    *out = j->valuestring;
    return MT_OK;
}

static mt_status get_req_str(const rd *r, const cJSON *o, const char *key, const char **out,
                             mt_err *err)
{
    mt_status st = get_str(r, o, key, false, out, err);
    if (st == MT_OK && !*out)
        st = bad(r, key, "must not be null", err);
    return st;
}

/* A number: NAN for null or (when optional) missing. */
static mt_status get_real(const rd *r, const cJSON *o, const char *key, bool optional,
                          double *out, mt_err *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NAN;
    if (!j)
        return optional ? MT_OK : bad(r, key, "missing", err);
    if (cJSON_IsNull(j))
        return MT_OK;
    if (!cJSON_IsNumber(j))
        return bad(r, key, "not a number", err);
    *out = j->valuedouble;
    return MT_OK;
}

/* An integer; null (or missing, when optional) reads as 0. */
static mt_status get_int(const rd *r, const cJSON *o, const char *key, bool optional,
                         int64_t *out, mt_err *err)
{
    double d;
    mt_status st = get_real(r, o, key, optional, &d, err);
    *out = 0;
    if (st)
        return st;
    if (isnan(d))
        return optional ? MT_OK : bad(r, key, "must not be null", err);
    if (d != floor(d) || fabs(d) > 9007199254740992.0)
        return bad(r, key, "not an integer", err);
    *out = (int64_t)d;
    return MT_OK;
}

static mt_status get_kernel(const rd *r, const cJSON *o, db_kernel *k, mt_err *err)
{
    int64_t v = 0;
    mt_status st = get_req_str(r, o, "family", &k->family, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "source_hash", &k->source_hash, err);
    if (st == MT_OK)
        st = get_int(r, o, "version", false, &v, err);
    k->version = (int)v;
    return st;
}

static mt_status r_device(const rd *r, const cJSON *o, db_sink *k, mt_err *err)
{
    db_device d = {0};
    const char *backend;
    int64_t cu = 0;
    mt_status st = get_req_str(r, o, "backend", &backend, err);
    if (st == MT_OK && (d.backend = db_backend_parse(backend)) < 0)
        st = bad(r, "backend", "unknown backend", err);
    if (st == MT_OK)
        st = get_req_str(r, o, "arch", &d.arch, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "name", &d.name, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "fingerprint", &d.fingerprint, err);
    if (st == MT_OK)
        st = get_str(r, o, "runtime_version", true, &d.runtime_version, err);
    if (st == MT_OK)
        st = get_str(r, o, "driver_version", true, &d.driver_version, err);
    if (st == MT_OK)
        st = get_int(r, o, "compute_units", false, &cu, err);
    d.compute_units = (int)cu;
    if (st == MT_OK)
        st = db_sink_visitor.device(k, &d, err);
    return st;
}

static mt_status r_kernel(const rd *r, const cJSON *o, db_sink *k, mt_err *err)
{
    db_kernel kr;
    mt_status st = get_kernel(r, o, &kr, err);
    return st ? st : db_sink_visitor.kernel(k, &kr, err);
}

static mt_status r_session(const rd *r, const cJSON *o, db_sink *k, mt_err *err)
{
    db_session_rec s = {0};
    const char *status;
    db_session_status ss = DB_SESSION_RUNNING;
    char *argv_text = NULL;
    mt_status st = get_req_str(r, o, "uid", &s.uid, err);
    if (st == MT_OK) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "argv");
        if (cJSON_IsArray(a)) {
            if (!(argv_text = cJSON_PrintUnformatted(a)))
                st = mt_fail(err, MT_E_NOMEM, "import: out of memory");
            s.argv_json = argv_text;
        } else {
            st = get_str(r, o, "argv", true, &s.argv_json, err);
        }
    }
    if (st == MT_OK)
        st = get_str(r, o, "tool_version", true, &s.tool_version, err);
    if (st == MT_OK)
        st = get_str(r, o, "host", true, &s.host, err);
    if (st == MT_OK)
        st = get_str(r, o, "strategy", true, &s.strategy, err);
    if (st == MT_OK)
        st = get_str(r, o, "budget", true, &s.budget, err);
    if (st == MT_OK)
        st = get_str(r, o, "origin", true, &s.origin, err);
    if (st == MT_OK)
        st = get_int(r, o, "started_ms", false, &s.started_ms, err);
    if (st == MT_OK)
        st = get_int(r, o, "ended_ms", true, &s.ended_ms, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "status", &status, err);
    if (st == MT_OK && !db_session_status_parse(status, &ss))
        st = bad(r, "status", "unknown session status", err);
    s.status = (int)ss;
    if (st == MT_OK)
        st = db_sink_visitor.session(k, &s, err);
    free(argv_text);
    return st;
}

static mt_status r_trial(const rd *r, const cJSON *o, db_sink *k, mt_err *err)
{
    db_trial_rec t = {0};
    const char *status;
    int64_t reps = 0;
    mt_status st = get_kernel(r, o, &t.kernel, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "device", &t.device_fp, err);
    if (st == MT_OK)
        st = get_str(r, o, "session", true, &t.session_uid, err);
    if (st == MT_OK)
        st = get_str(r, o, "origin", true, &t.origin, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "shape", &t.t.shape_key, err);
    if (st == MT_OK)
        st = get_int(r, o, "m", false, &t.t.m, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "config_key", &t.t.config_key, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "config", &t.t.config_json, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "status", &status, err);
    if (st == MT_OK && !db_trial_status_parse(status, &t.t.status))
        st = bad(r, "status", "unknown trial status", err);
    if (st == MT_OK)
        st = get_real(r, o, "time_min_ms", true, &t.t.time_min_ms, err);
    if (st == MT_OK)
        st = get_real(r, o, "time_median_ms", true, &t.t.time_median_ms, err);
    if (st == MT_OK)
        st = get_real(r, o, "time_p10_ms", true, &t.t.time_p10_ms, err);
    if (st == MT_OK)
        st = get_real(r, o, "time_p90_ms", true, &t.t.time_p90_ms, err);
    if (st == MT_OK)
        st = get_int(r, o, "repetitions", true, &reps, err);
    t.t.repetitions = (int)reps;
    if (st == MT_OK)
        st = get_real(r, o, "gflops", true, &t.t.gflops, err);
    if (st == MT_OK)
        st = get_real(r, o, "gbps", true, &t.t.gbps, err);
    if (st == MT_OK)
        st = get_str(r, o, "resources", true, &t.t.resources_json, err);
    if (st == MT_OK)
        st = get_str(r, o, "error", true, &t.t.error, err);
    if (st == MT_OK)
        st = get_real(r, o, "compile_ms", true, &t.t.compile_ms, err);
    if (st == MT_OK)
        st = get_int(r, o, "created_ms", false, &t.t.created_ms, err);
    if (st == MT_OK)
        st = db_sink_visitor.trial(k, &t, err);
    return st;
}

static mt_status r_winner(const rd *r, const cJSON *o, db_sink *k, mt_err *err)
{
    db_winner_rec w = {0};
    mt_status st = get_kernel(r, o, &w.kernel, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "device", &w.device_fp, err);
    if (st == MT_OK)
        st = get_str(r, o, "origin", true, &w.origin, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "shape", &w.w.shape_key, err);
    if (st == MT_OK)
        st = get_int(r, o, "m", false, &w.w.m, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "config_key", &w.w.config_key, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "config", &w.w.config_json, err);
    if (st == MT_OK)
        st = get_real(r, o, "time_ms", false, &w.w.time_ms, err);
    if (st == MT_OK)
        st = get_str(r, o, "runner_ups", true, &w.w.runner_ups_json, err);
    if (st == MT_OK)
        st = get_int(r, o, "updated_ms", false, &w.updated_ms, err);
    if (st == MT_OK)
        st = get_int(r, o, "verified_ms", true, &w.verified_ms, err);
    if (st == MT_OK)
        st = get_real(r, o, "verified_time_ms", true, &w.verified_time_ms, err);
    /* The decision (format 2); absent in format 1: never confirmed. */
    const char *dec = NULL;
    int64_t rounds = 0;
    db_confirm *c = &w.w.confirm;
    c->ratio = c->ratio_lo = c->ratio_hi = c->confidence = NAN;
    if (st == MT_OK)
        st = get_str(r, o, "decision", true, &dec, err);
    if (st == MT_OK && dec && !db_decision_parse(dec, &c->decision))
        st = mt_fail(err, MT_E_FORMAT, "%s: %s[%d]: unknown decision \"%s\"", r->path,
                     r->section, r->index, dec);
    if (st == MT_OK)
        st = get_str(r, o, "challenger", true, &c->challenger_key, err);
    if (st == MT_OK)
        st = get_int(r, o, "rounds", true, &rounds, err);
    if (st == MT_OK && (rounds < 0 || rounds > 1000000))
        st = mt_fail(err, MT_E_FORMAT, "%s: %s[%d]: rounds %lld out of range", r->path,
                     r->section, r->index, (long long)rounds);
    c->rounds = (int)rounds;
    if (st == MT_OK)
        st = get_real(r, o, "ratio", true, &c->ratio, err);
    if (st == MT_OK)
        st = get_real(r, o, "ratio_lo", true, &c->ratio_lo, err);
    if (st == MT_OK)
        st = get_real(r, o, "ratio_hi", true, &c->ratio_hi, err);
    if (st == MT_OK)
        st = get_real(r, o, "confidence", true, &c->confidence, err);
    /* The stale mark of `db verify` (schema 5): optional, false when absent. */
    const cJSON *stale = cJSON_GetObjectItemCaseSensitive(o, "stale");
    if (st == MT_OK && stale && !cJSON_IsBool(stale))
        st = mt_fail(err, MT_E_FORMAT, "%s: %s[%d]: \"stale\" must be true or false", r->path,
                     r->section, r->index);
    w.stale = cJSON_IsTrue(stale);
    if (st == MT_OK)
        st = db_sink_visitor.winner(k, &w, err);
    return st;
}

static mt_status r_miss(const rd *r, const cJSON *o, db_sink *k, mt_err *err)
{
    db_miss_rec m = {0};
    const char *reason;
    db_provenance p = DB_MISS;
    mt_status st = get_req_str(r, o, "device", &m.device_fp, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "family", &m.family, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "shape", &m.shape_key, err);
    if (st == MT_OK) /* older exports have none */
        st = get_str(r, o, "shape_run", true, &m.shape_run, err);
    if (st == MT_OK)
        st = get_int(r, o, "m", false, &m.m, err);
    if (st == MT_OK)
        st = get_int(r, o, "count", false, &m.count, err);
    if (st == MT_OK)
        st = get_int(r, o, "first_seen_ms", false, &m.first_seen_ms, err);
    if (st == MT_OK)
        st = get_int(r, o, "last_seen_ms", false, &m.last_seen_ms, err);
    if (st == MT_OK)
        st = get_req_str(r, o, "last_reason", &reason, err);
    if (st == MT_OK && !db_provenance_parse(reason, &p))
        st = bad(r, "last_reason", "unknown reason", err);
    m.last_reason = (int)p;
    if (st == MT_OK)
        st = db_sink_visitor.miss(k, &m, err);
    return st;
}

typedef mt_status (*record_fn)(const rd *r, const cJSON *o, db_sink *k, mt_err *err);

/* Line of a byte offset, for syntax errors. */
static int line_of(const char *text, const char *at)
{
    int line = 1;
    for (const char *p = text; p < at && *p; p++)
        line += *p == '\n';
    return line;
}

static mt_status import_doc(const char *path, const cJSON *doc, db_sink *k, mt_err *err)
{
    static const record_fn fns[SEC_COUNT] = {
        [SEC_DEVICES] = r_device, [SEC_KERNELS] = r_kernel, [SEC_SESSIONS] = r_session,
        [SEC_TRIALS] = r_trial,   [SEC_WINNERS] = r_winner, [SEC_MISSES] = r_miss,
    };
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(doc, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(doc, "format_version");
    if (!cJSON_IsObject(doc) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, FORMAT_NAME))
        return mt_fail(err, MT_E_FORMAT, "%s: not a moetune database export (no \"format\": \"%s\")",
                       path, FORMAT_NAME);
    if (!cJSON_IsNumber(ver) || ver->valuedouble < 1)
        return mt_fail(err, MT_E_FORMAT, "%s: format_version missing or invalid", path);
    if (ver->valuedouble > DB_EXPORT_FORMAT_VERSION)
        return mt_fail(err, MT_E_UNSUPPORTED,
                       "%s: export format version %g is newer than this moetune reads (%d)", path,
                       ver->valuedouble, DB_EXPORT_FORMAT_VERSION);
    for (int sec = 0; sec < SEC_COUNT; sec++) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(doc, section_names[sec]);
        if (!arr)
            continue;
        if (!cJSON_IsArray(arr))
            return mt_fail(err, MT_E_FORMAT, "%s: \"%s\" is not an array", path,
                           section_names[sec]);
        rd r = {path, section_names[sec], 0};
        for (const cJSON *o = arr->child; o; o = o->next, r.index++) {
            mt_status st = cJSON_IsObject(o) ? fns[sec](&r, o, k, err)
                                             : mt_fail(err, MT_E_FORMAT, "not an object");
            if (st) {
                if (!strstr(err ? err->msg : "", path))
                    mt_err_prefix(err, "%s: %s[%d]", path, r.section, r.index);
                return st;
            }
        }
    }
    return MT_OK;
}

mt_status db_import(db_t *db, const char *json_path, db_merge_stats *stats, mt_err *err)
{
    db_merge_stats local;
    memset(&local, 0, sizeof local);
    if (!stats)
        stats = &local;
    memset(stats, 0, sizeof *stats);
    char *text;
    size_t len;
    mt_status st = mt_file_read(json_path, &text, &len, err);
    if (st)
        return st;
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!doc) {
        const char *at = end ? end : cJSON_GetErrorPtr();
        st = mt_fail(err, MT_E_FORMAT, "%s: line %d: invalid JSON near \"%.20s\"", json_path,
                     at ? line_of(text, at) : 0, at ? at : "");
        free(text);
        return st;
    }
    db_sink k = {db, NULL, stats};
    st = db_tx_begin(db, err);
    if (st == MT_OK)
        st = db_tx_end(db, import_doc(json_path, doc, &k, err), err);
    if (st)
        memset(stats, 0, sizeof *stats);
    cJSON_Delete(doc);
    free(text);
    return st;
}
