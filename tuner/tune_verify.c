/* tune_verify.c: re-timing stored winners against their runner-up and the
 * default, and marking the ones that no longer win (tune_verify.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/core/kern_db.h"
#include "tune_impl.h"
#include "tune_verify.h"

void tune_verify_opts_default(tune_verify_opts *o)
{
    memset(o, 0, sizeof *o);
    o->device = "auto";
    o->rounds = 10;
    o->confidence = 0.95;
    o->margin = TUNE_VERIFY_MARGIN;
    o->timeout_s = 60;
    kern_time_opts_default(&o->timing);
}

void tune_verify_report_free(tune_verify_report *r)
{
    if (!r)
        return;
    free(r->rows);
    free(r);
}

/* A winner as read from the database (the row's strings copied). */
typedef struct stored {
    int64_t device_id, kernel_id, m;
    int backend;
    char device_name[128], family[64], source_hash[65], shape_key[KERN_KEY_MAX];
    char winner[256], runner_up[256];
    double time_ms;
} stored;

typedef struct collect {
    stored *v;
    int n, cap;
    bool nomem;
} collect;

static int collect_cb(void *arg, const db_winner_row *w)
{
    collect *c = arg;
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 32;
        stored *g = realloc(c->v, sizeof *g * (size_t)cap);
        if (!g) {
            c->nomem = true;
            return 1;
        }
        c->v = g;
        c->cap = cap;
    }
    stored *s = &c->v[c->n++];
    memset(s, 0, sizeof *s);
    s->device_id = w->device_id;
    s->kernel_id = w->kernel_id;
    s->m = w->m;
    s->backend = w->device.backend;
    s->time_ms = w->time_ms;
    snprintf(s->device_name, sizeof s->device_name, "%s", w->device.name);
    snprintf(s->family, sizeof s->family, "%s", w->family);
    snprintf(s->source_hash, sizeof s->source_hash, "%s", w->source_hash);
    snprintf(s->shape_key, sizeof s->shape_key, "%s", w->shape_key);
    snprintf(s->winner, sizeof s->winner, "%s", w->config_key);
    cJSON *a = w->runner_ups_json ? cJSON_Parse(w->runner_ups_json) : NULL;
    const cJSON *first = cJSON_GetArrayItem(a, 0);
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(first, "config_key");
    if (cJSON_IsString(key))
        snprintf(s->runner_up, sizeof s->runner_up, "%s", key->valuestring);
    cJSON_Delete(a);
    return 0;
}

typedef struct vctx {
    const tune_verify_opts *o;
    tune_spawner *sp;
    tune_worker *worker;
    dev_device *dev;
    dev_props props;
    uint64_t data_seed;
} vctx;

static const kern_family *find_family(const tune_verify_opts *o, const char *name)
{
    for (int i = 0; i < o->n_families; i++)
        if (o->families[i] && !strcmp(o->families[i]->name, name))
            return o->families[i];
    return kern_family_find(name);
}

static void stop_worker(vctx *v)
{
    tune_worker_stop(v->worker);
    v->worker = NULL;
}

/* Paired rounds of the winner (a) against `other` (b) on the prepared
 * worker. A failure of the timing goes to row->note with MT_OK; only an
 * interruption or a dead spawner is an error. */
static mt_status compare(vctx *v, const kern_family *f, const kern_impl *im, const kern_shape *sh,
                         const stored *s, const char *other, tune_interval *iv, double *a_ms,
                         tune_verify_row *row, mt_err *err)
{
    kern_config ca, cb;
    dev_code *code_a = NULL, *code_b = NULL;
    mt_err e = MT_ERR_INIT;
    if (kern_config_parse(im, s->winner, &ca, &e) != MT_OK ||
        kern_config_parse(im, other, &cb, &e) != MT_OK ||
        kern_compile(v->dev, f, im, sh, &ca, &code_a, &e) != MT_OK ||
        kern_compile(v->dev, f, im, sh, &cb, &code_b, &e) != MT_OK) {
        snprintf(row->note, sizeof row->note, "vs %.60s: %.160s", other, e.msg);
        dev_code_free(code_a);
        dev_code_free(code_b);
        return MT_OK;
    }
    const tune_verify_opts *o = v->o;
    tune_paired *pr = calloc(1, sizeof *pr);
    mt_status st = pr ? MT_OK : mt_fail(err, MT_E_NOMEM, "paired timing");
    if (st == MT_OK) {
        kern_config cfgs[2] = {ca, cb};
        size_t lens[2] = {0, 0};
        const void *codes[2] = {dev_code_get_bytes(code_a, &lens[0]),
                                dev_code_get_bytes(code_b, &lens[1])};
        int rounds = o->rounds > 1 ? o->rounds : 10;
        rounds = rounds > TUNE_CONFIRM_MAX_ROUNDS ? TUNE_CONFIRM_MAX_ROUNDS : rounds;
        kern_time_opts t = tune_paired_opts(&o->timing, s->time_ms);
        mt_status ws = tune_worker_paired(v->worker, 2, cfgs, codes, lens, rounds, &t,
                                          o->timeout_s * (2 + rounds), o->stop, pr, &e);
        char buf[KERN_KEY_MAX + 640];
        snprintf(buf, sizeof buf, "%s|%s|%lld|%s", s->family, s->shape_key, (long long)s->m,
                 other);
        if (ws == MT_E_INTERRUPTED) {
            stop_worker(v);
            st = mt_fail(err, ws, "interrupted while re-timing %s", s->winner);
        } else if (ws != MT_OK) {
            stop_worker(v);
            snprintf(row->note, sizeof row->note, "vs %.60s: %.160s", other, e.msg);
        } else if (pr->status != MT_OK) {
            snprintf(row->note, sizeof row->note, "vs %.60s: %s: %.160s", other, pr->step,
                     pr->msg);
        } else if (tune_ratio_interval(pr->ms[0], pr->ms[1], pr->rounds, iv->level,
                                       tune_hash64(buf), iv, &e) != MT_OK) {
            snprintf(row->note, sizeof row->note, "vs %.60s: %.160s", other, e.msg);
        } else {
            *a_ms = tune_median(pr->ms[0], pr->rounds);
        }
    }
    free(pr);
    dev_code_free(code_a);
    dev_code_free(code_b);
    return st;
}

/* Re-times one winner; fills row; records the outcome. */
static mt_status verify_one(vctx *v, db_t *db, const stored *s, tune_verify_row *row,
                            mt_err *err)
{
    const tune_verify_opts *o = v->o;
    snprintf(row->device_name, sizeof row->device_name, "%s", s->device_name);
    snprintf(row->family, sizeof row->family, "%s", s->family);
    snprintf(row->shape_key, sizeof row->shape_key, "%s", s->shape_key);
    snprintf(row->winner, sizeof row->winner, "%s", s->winner);
    row->m = s->m;
    row->winner_ms = NAN;
    row->skipped = true;
    const kern_family *f = find_family(o, s->family);
    const kern_impl *im = f ? kern_family_impl(f, v->props.backend) : NULL;
    char hash[65] = "";
    if (f)
        kern_source_hash(f, v->props.backend, hash);
    kern_shape sh;
    if (!f) {
        snprintf(row->note, sizeof row->note, "family %s is not in this build", s->family);
        return MT_OK;
    }
    if (s->backend != (int)v->props.backend || !im) {
        snprintf(row->note, sizeof row->note, "tuned for %s, this device is %s",
                 db_backend_name(s->backend), dev_backend_name(v->props.backend));
        return MT_OK;
    }
    if (strcmp(hash, s->source_hash)) {
        snprintf(row->note, sizeof row->note,
                 "tuned for source %.12s, this build has %.12s: never used (re-tune)",
                 s->source_hash, hash);
        return MT_OK;
    }
    mt_err e = MT_ERR_INIT;
    if (kern_shape_parse(f, s->shape_key, &sh, NULL, &e) != MT_OK) {
        snprintf(row->note, sizeof row->note, "%.200s", e.msg);
        return MT_OK;
    }
    kern_config dc;
    im->default_config(&sh, s->m, &v->props, &dc);
    kern_config_key(im, &dc, row->vs[TUNE_VS_DEFAULT], sizeof row->vs[0]);
    snprintf(row->vs[TUNE_VS_RUNNER_UP], sizeof row->vs[0], "%s", s->runner_up);
    for (int k = 0; k < TUNE_VS_COUNT; k++)
        if (!strcmp(row->vs[k], s->winner) || (k == TUNE_VS_DEFAULT &&
                                                !strcmp(row->vs[k], row->vs[TUNE_VS_RUNNER_UP])))
            row->vs[k][0] = 0; /* nothing to compare, or compared already */
    if (!row->vs[0][0] && !row->vs[1][0]) {
        snprintf(row->note, sizeof row->note, "the default and no runner-up: nothing to compare");
        return MT_OK;
    }
    if (!v->worker) {
        mt_status st = tune_worker_start(v->sp, o->device, NULL, 120, o->stop, &v->worker, NULL,
                                         err);
        if (st != MT_OK)
            return st;
    }
    uint64_t seed = v->data_seed ^ (uint64_t)s->m * 0x9e3779b97f4a7c15ull;
    mt_status st = tune_worker_prepare(v->worker, f, &sh, s->m, seed, o->stop, &e);
    if (st == MT_E_INTERRUPTED) {
        stop_worker(v);
        return mt_fail(err, st, "interrupted");
    }
    if (st != MT_OK) {
        stop_worker(v);
        snprintf(row->note, sizeof row->note, "problem: %.200s", e.msg);
        return MT_OK;
    }
    double level = o->confidence > 0 && o->confidence < 1 ? o->confidence : 0.95;
    bool compared = false;
    for (int k = 0; k < TUNE_VS_COUNT; k++) {
        if (!row->vs[k][0])
            continue;
        row->iv[k].level = level;
        double a_ms = NAN;
        st = compare(v, f, im, &sh, s, row->vs[k], &row->iv[k], &a_ms, row, err);
        if (st != MT_OK)
            return st;
        if (!isfinite(a_ms)) {
            row->iv[k].rounds = 0;
            if (!v->worker) /* it died: the next comparison needs a new one */
                return MT_OK;
            continue;
        }
        compared = true;
        row->winner_ms = isfinite(row->winner_ms) ? fmin(row->winner_ms, a_ms) : a_ms;
        /* The other config is faster with confidence, by more than the
         * margin: the winner is stale. */
        if (row->iv[k].lo > 1 + (o->margin > 0 && o->margin < 1 ? o->margin : 0))
            row->stale = true;
    }
    if (!compared)
        return MT_OK;
    row->skipped = false;
    return db_winner_verify(db, s->device_id, s->kernel_id, s->shape_key, s->m, row->winner_ms,
                            row->stale, err);
}

static void log_row(FILE *log, const tune_verify_row *r, double margin)
{
    if (!log)
        return;
    fprintf(log, "verify: %s %s M=%lld %s", r->family, r->shape_key, (long long)r->m, r->winner);
    if (r->skipped) {
        fprintf(log, ": skipped (%s)\n", r->note);
        return;
    }
    static const char *const what[TUNE_VS_COUNT] = {"runner-up", "default"};
    for (int k = 0; k < TUNE_VS_COUNT; k++)
        if (r->iv[k].rounds > 0)
            fprintf(log, "; vs %s %s: ratio %.3f [%.3f, %.3f]", what[k], r->vs[k], r->iv[k].ratio,
                    r->iv[k].lo, r->iv[k].hi);
    bool within = false; /* faster with confidence, by less than the margin */
    for (int k = 0; k < TUNE_VS_COUNT; k++)
        within |= r->iv[k].rounds > 0 && r->iv[k].lo > 1;
    fprintf(log, ": %s", r->stale ? "STALE (no longer wins)" : "still wins");
    if (!r->stale && within)
        fprintf(log, " (the other is faster, by less than the %.3g%% margin)", margin * 100);
    fprintf(log, "%s%s\n", r->note[0] ? "; " : "", r->note);
}

mt_status tune_verify(const tune_verify_opts *o, tune_verify_report **report, mt_err *err)
{
    if (report)
        *report = NULL;
    if (!o->db_path || !*o->db_path)
        return mt_fail(err, MT_E_INVALID, "verify: a database path is required");
    tune_verify_report *rep = calloc(1, sizeof *rep);
    if (!rep)
        return mt_fail(err, MT_E_NOMEM, "verify report");
    vctx v = {.o = o, .data_seed = mt_seed_fresh()};
    db_t *db = NULL;
    collect c = {0};
    /* The spawner is forked first: no device, no thread exists yet. */
    mt_status st = tune_spawner_start(&v.sp, err);
    if (st == MT_OK)
        st = dev_open(o->device ? o->device : "auto", &(dev_open_opts){0}, &v.dev, err);
    if (st == MT_OK) {
        v.props = *dev_get_props(v.dev);
        snprintf(rep->device_spec, sizeof rep->device_spec, "%s", v.props.spec);
        snprintf(rep->device_name, sizeof rep->device_name, "%s", v.props.name);
        if (v.props.compile_only)
            st = mt_fail(err, MT_E_UNSUPPORTED, "verify: %s is compile-only here: nothing can "
                         "be timed", v.props.spec);
    }
    if (st == MT_OK)
        st = db_open(o->db_path, DB_OPEN_NOCREATE, &db, err);
    if (st == MT_OK)
        st = db_winners_each(db, &o->filter, collect_cb, &c, err);
    if (st == MT_OK && c.nomem)
        st = mt_fail(err, MT_E_NOMEM, "verify: winners");
    if (st == MT_OK && c.n > 0 && !(rep->rows = calloc((size_t)c.n, sizeof *rep->rows)))
        st = mt_fail(err, MT_E_NOMEM, "verify report");
    if (st == MT_OK && o->log)
        fprintf(o->log, "verify: %d winners in %s, re-timed on %s (%s), %d paired rounds per "
                "comparison, verification seed 0x%llx\n", c.n, o->db_path, v.props.spec,
                v.props.name, o->rounds > 1 ? o->rounds : 10,
                (unsigned long long)v.data_seed);
    for (int i = 0; st == MT_OK && i < c.n; i++) {
        if (tune_stopped(o->stop)) {
            st = mt_fail(err, MT_E_INTERRUPTED, "interrupted");
            break;
        }
        tune_verify_row *row = &rep->rows[rep->n++];
        st = verify_one(&v, db, &c.v[i], row, err);
        if (st != MT_OK)
            break;
        log_row(o->log, row, o->margin > 0 && o->margin < 1 ? o->margin : 0);
        rep->skipped += row->skipped;
        rep->stale += !row->skipped && row->stale;
        rep->verified += !row->skipped && !row->stale;
    }
    free(c.v);
    tune_worker_stop(v.worker);
    tune_spawner_stop(v.sp);
    db_close(db);
    dev_close(v.dev);
    if (report)
        *report = rep;
    else
        tune_verify_report_free(rep);
    return st;
}
