/* tune_misses.c: tuning a database's recorded misses, costliest first
 * (tune_misses.h). Two passes of tune_run over one job per miss: the
 * defaults alone, then the search in order of cost. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/kern_db.h"
#include "tune_misses.h"

void tune_misses_result_free(tune_misses_result *r)
{
    if (!r)
        return;
    free(r->order);
    r->order = NULL;
    r->n = 0;
}

static int cmp_cost(const void *pa, const void *pb)
{
    const tune_miss *a = pa, *b = pb;
    bool ta = isfinite(a->cost_ms), tb = isfinite(b->cost_ms);
    if (ta != tb)
        return ta ? -1 : 1;
    if (ta && a->cost_ms != b->cost_ms)
        return a->cost_ms > b->cost_ms ? -1 : 1;
    if (a->lookups != b->lookups)
        return a->lookups > b->lookups ? -1 : 1;
    int c = strcmp(a->fam->name, b->fam->name);
    if (!c)
        c = strcmp(a->shape_key, b->shape_key);
    return c ? c : (a->m > b->m) - (a->m < b->m);
}

void tune_misses_sort(tune_miss *v, int n)
{
    if (n > 1)
        qsort(v, (size_t)n, sizeof *v, cmp_cost);
}

/* ---- collecting ------------------------------------------------------------ */

typedef struct collect {
    const tune_opts *o;
    dev_backend backend;
    tune_miss *v;
    int n, cap;
    int recorded, skipped;
    bool nomem;
} collect;

static void skip(collect *c, const db_miss_row *row, const char *why)
{
    c->skipped++;
    if (c->o->log)
        fprintf(c->o->log, "tune: miss %s %s M=%lld (%lld lookups): not tuned: %s\n",
                row->family, row->shape_key, (long long)row->m, (long long)row->count, why);
}

static int collect_cb(void *arg, const db_miss_row *row)
{
    collect *c = arg;
    if (row->device.backend != (int)c->backend)
        return 0; /* another backend's misses: not this device's to tune */
    for (int i = 0; i < c->n; i++) /* the same miss on another device */
        if (c->v[i].m == row->m && !strcmp(c->v[i].fam->name, row->family) &&
            !strcmp(c->v[i].shape_key, row->shape_key)) {
            c->v[i].lookups += row->count;
            if (!c->v[i].shape_run[0] && row->shape_run && strlen(row->shape_run) < KERN_KEY_MAX)
                snprintf(c->v[i].shape_run, sizeof c->v[i].shape_run, "%s", row->shape_run);
            return 0;
        }
    c->recorded++;
    const kern_family *f = kern_family_find(row->family);
    const kern_impl *im = f ? kern_family_impl(f, c->backend) : NULL;
    if (!f) {
        skip(c, row, "the family is not in this build");
        return 0;
    }
    if (!im || im->n_params == 0) {
        skip(c, row, im ? "no parameters: nothing to tune" : "no implementation here");
        return 0;
    }
    if (strlen(row->shape_key) >= KERN_KEY_MAX) {
        skip(c, row, "shape key too long");
        return 0;
    }
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 32;
        tune_miss *g = realloc(c->v, sizeof *g * (size_t)cap);
        if (!g) {
            c->nomem = true;
            return 1;
        }
        c->v = g;
        c->cap = cap;
    }
    tune_miss *t = &c->v[c->n++];
    memset(t, 0, sizeof *t);
    t->fam = f;
    snprintf(t->shape_key, sizeof t->shape_key, "%s", row->shape_key);
    if (row->shape_run && strlen(row->shape_run) < KERN_KEY_MAX)
        snprintf(t->shape_run, sizeof t->shape_run, "%s", row->shape_run);
    t->m = row->m;
    t->lookups = row->count;
    t->default_ms = t->cost_ms = NAN;
    return 0;
}

/* Drops the misses this device has an exact winner for now (tuned since
 * they were recorded), and those whose shape does not parse. A shape_run
 * that does not parse, or whose tuning key is not the miss's, is set aside
 * (logged): the miss is tuned at the first preset's runtime dims. */
static void drop_tuned(collect *c, db_t *db, const db_device *dd)
{
    int kept = 0;
    for (int i = 0; i < c->n; i++) {
        tune_miss *t = &c->v[i];
        char hash[65];
        kern_source_hash(t->fam, c->backend, hash);
        db_lookup_result lr;
        kern_shape sh;
        mt_err e = MT_ERR_INIT;
        const char *why = NULL;
        char key[KERN_KEY_MAX];
        if (t->shape_run[0] &&
            (kern_shape_parse(t->fam, t->shape_run, &sh, NULL, &e) != MT_OK ||
             (kern_shape_key(t->fam, &sh, false, key, sizeof key), strcmp(key, t->shape_key)))) {
            if (c->o->log)
                fprintf(c->o->log, "tune: miss %s %s M=%lld: its runtime shape %s is not this "
                        "shape (%s); tuned at the family's first preset's runtime dims\n",
                        t->fam->name, t->shape_key, (long long)t->m, t->shape_run,
                        e.msg[0] ? e.msg : key);
            t->shape_run[0] = 0;
            e = (mt_err)MT_ERR_INIT;
        }
        if (kern_shape_parse(t->fam, t->shape_key, &sh, NULL, &e) != MT_OK)
            why = e.msg;
        else if (db_lookup(db, dd, t->fam->name, t->fam->version, hash, t->shape_key, t->m, &lr,
                           &e) == MT_OK &&
                 lr.provenance == DB_HIT_EXACT)
            why = "tuned for this device since";
        if (why) {
            db_miss_row row = {.family = t->fam->name, .shape_key = t->shape_key, .m = t->m,
                               .count = t->lookups};
            skip(c, &row, why);
            continue;
        }
        c->v[kept++] = *t;
    }
    c->n = kept;
}

static mt_status collect_misses(const tune_opts *o, collect *c, mt_err *err)
{
    dev_device *dev = NULL;
    dev_open_opts oo = {.arch = o->arch, .threads = 0};
    mt_status st = dev_open(o->device ? o->device : "auto", &oo, &dev, err);
    if (st != MT_OK)
        return st;
    db_device dd;
    kern_db_device(dev_get_props(dev), &dd);
    c->backend = dev_get_props(dev)->backend;
    db_t *db = NULL;
    st = db_open(o->db_path, DB_OPEN_READONLY, &db, err);
    if (st == MT_OK)
        st = db_misses_each(db, NULL, collect_cb, c, err);
    if (st == MT_OK && c->nomem)
        st = mt_fail(err, MT_E_NOMEM, "tune --misses: misses");
    if (st == MT_OK)
        drop_tuned(c, db, &dd);
    db_close(db);
    /* closed before tune_run forks its spawner: no device crosses a fork */
    dev_close(dev);
    return st;
}

/* ---- tuning -------------------------------------------------------------- */

mt_status tune_miss_job(const tune_miss *t, tune_job *out, mt_err *err)
{
    return tune_job_make(t->fam, t->shape_run[0] ? t->shape_run : t->shape_key, &t->m, 1, out,
                         err);
}

/* tune_run over the misses in order, TUNE_MAX_JOBS at a time, one job
 * each. With default_only, the default's times go back into v. */
static mt_status run_passes(tune_miss *v, int n, const tune_opts *o, FILE *table, mt_err *err)
{
    tune_job *jobs = calloc(TUNE_MAX_JOBS, sizeof *jobs);
    if (!jobs)
        return mt_fail(err, MT_E_NOMEM, "tune --misses: jobs");
    mt_status st = MT_OK;
    for (int at = 0; at < n && st == MT_OK; at += TUNE_MAX_JOBS) {
        int k = n - at < TUNE_MAX_JOBS ? n - at : TUNE_MAX_JOBS;
        for (int j = 0; j < k && st == MT_OK; j++)
            st = tune_miss_job(&v[at + j], &jobs[j], err);
        tune_report *rep = NULL;
        if (st == MT_OK)
            st = tune_run(jobs, k, o, &rep, err);
        for (int j = 0; rep && o->default_only && j < rep->n_jobs; j++) {
            const tune_m_report *mr = &rep->jobs[j].m[0];
            if (rep->jobs[j].n_m > 0 && mr->has_default) {
                v[at + j].default_ms = mr->default_ms;
                v[at + j].cost_ms = (double)v[at + j].lookups * mr->default_ms;
            }
        }
        if (rep && table && !o->default_only)
            tune_report_print(rep, table);
        tune_report_free(rep);
    }
    free(jobs);
    return st;
}

mt_status tune_misses_run(const tune_opts *o, FILE *table, tune_misses_result *res,
                          mt_err *err)
{
    memset(res, 0, sizeof *res);
    if (!o->db_path || !*o->db_path)
        return mt_fail(err, MT_E_INVALID, "tune --misses: a database path is required");
    if (o->default_only)
        return mt_fail(err, MT_E_INVALID, "tune --misses: default_only is its own to set");
    collect c = {.o = o};
    mt_status st = collect_misses(o, &c, err);
    res->recorded = c.recorded;
    res->skipped = c.skipped;
    res->order = c.v;
    res->n = c.n;
    if (st != MT_OK || c.n == 0) {
        if (st == MT_OK && o->log)
            fprintf(o->log, "tune: %s: no miss of a %s device to tune (%d recorded, %d left "
                    "out)\n", o->db_path, dev_backend_name(c.backend), c.recorded, c.skipped);
        return st;
    }
    /* Pass 1: each miss's default config, for the order. */
    if (o->log)
        fprintf(o->log, "tune: %s: %d misses of a %s device to tune (%d left out): timing "
                "their default configs first\n", o->db_path, res->n,
                dev_backend_name(c.backend), c.skipped);
    tune_opts d = *o;
    d.default_only = true;
    d.budget = (tune_budget){0};
    d.log = NULL; /* one line per default would drown the plan below */
    st = run_passes(res->order, res->n, &d, NULL, err);
    if (st != MT_OK)
        return st;
    tune_misses_sort(res->order, res->n);
    if (o->log) {
        fprintf(o->log, "tune: %d misses to tune, costliest first (cost = missed lookups x the "
                "default config's median here):\n", res->n);
        for (int i = 0; i < res->n; i++) {
            const tune_miss *t = &res->order[i];
            fprintf(o->log, "  %3d  %s %s M=%lld: %lld x %.4g ms = %.4g ms%s%s\n", i + 1,
                    t->fam->name, t->shape_key, (long long)t->m, (long long)t->lookups,
                    t->default_ms, t->cost_ms, t->shape_run[0] ? ", run at " : "",
                    t->shape_run);
        }
    }
    /* Pass 2: the search, as tune runs it. */
    return run_passes(res->order, res->n, o, table, err);
}
