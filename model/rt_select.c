/* rt_select.c: load-time kernel selection of the model runtime, module
 * sharing, launches and the selection report.
 *
 * Selection: every (family, shape) of the kernel plan (plan.h) is an
 * rt_kernel, registered here in plan order; for
 * each M bucket up to the first bucket >= the largest M that kernel sees,
 * the database is asked (db_lookup: exact, nearest tuned M, other device of
 * the same arch, stale, miss). A config from the database that is not valid
 * for this shape and device is rejected (default runs, the report says
 * why). Without a database every bucket runs the family's default config
 * for that bucket's M. Each distinct (family, tuning key, config) is
 * compiled and loaded once. At run time a call with M rows runs the config
 * of the smallest bucket >= M (the last bucket past the end). */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/runner.h"
#include "rt_impl.h"

const int64_t rt_buckets[RT_N_BUCKETS] = {1,  2,   4,   8,   16,  24,   32,   48,
                                          64, 96, 128, 256, 512, 1024, 2048, 4096};

static const char *const prov_names[RT_PROV_COUNT] = {
    [RT_PROV_TUNED] = "tuned",
    [RT_PROV_NEAREST] = "nearest",
    [RT_PROV_OTHER_DEVICE] = "other-device",
    [RT_PROV_STALE] = "stale",
    [RT_PROV_MISS] = "default (miss)",
    [RT_PROV_NO_DB] = "default",
    [RT_PROV_REJECTED] = "default (db config rejected)",
};
_Static_assert(sizeof prov_names / sizeof prov_names[0] == RT_PROV_COUNT, "prov names");

const char *rt_prov_name(rt_prov p) { return p < RT_PROV_COUNT ? prov_names[p] : "?"; }

mt_status rt_kernels_register(model_runtime *rt, mt_err *err)
{
    const model_plan *pl = rt->plan;
    rt->kerns = calloc((size_t)(pl->n_entries ? pl->n_entries : 1), sizeof *rt->kerns);
    if (!rt->kerns)
        return mt_fail(err, MT_E_NOMEM, "runtime: kernel table");
    rt->cap_kerns = pl->n_entries;
    for (int i = 0; i < pl->n_entries; i++) {
        const model_plan_entry *e = &pl->entries[i];
        const kern_impl *im = kern_family_impl(e->fam, rt->props->backend);
        if (!im)
            return mt_fail(err, MT_E_UNSUPPORTED, "runtime: family %s (%s) has no %s "
                           "implementation", e->fam->name, e->purpose,
                           dev_backend_name(rt->props->backend));
        rt_kernel *k = calloc(1, sizeof *k);
        if (!k)
            return mt_fail(err, MT_E_NOMEM, "runtime: kernel table");
        k->fam = e->fam;
        k->impl = im;
        k->shape = e->shape;
        snprintf(k->key, sizeof k->key, "%s", e->key);
        snprintf(k->use, sizeof k->use, "%s", e->purpose);
        k->m_max = e->m_max;
        rt->kerns[rt->n_kerns++] = k;
    }
    return MT_OK;
}

void rt_shape_set(const rt_kernel *k, kern_shape *s, const char *name, int64_t v)
{
    for (int d = 0; d < k->fam->n_dims; d++)
        if (!strcmp(k->fam->dims[d].name, name))
            s->v[d] = v;
}

static int bucket_of(const rt_kernel *k, int64_t m)
{
    for (int i = 0; i < k->n; i++)
        if (k->ch[i].m >= m)
            return i;
    return k->n - 1;
}

/* Finds or adds the module of (family, key, config); compiled later. */
static mt_status module_for(model_runtime *rt, rt_kernel *k, rt_choice *c, mt_err *err)
{
    char ck[256];
    kern_config_key(k->impl, &c->cfg, ck, sizeof ck);
    for (int i = 0; i < rt->n_mods; i++) {
        rt_module *md = &rt->mods[i];
        if (md->fam == k->fam && !strcmp(md->key, k->key) && !strcmp(md->cfg_key, ck)) {
            c->module = i;
            return MT_OK;
        }
    }
    if (rt->n_mods == rt->cap_mods) {
        int cap = rt->cap_mods ? 2 * rt->cap_mods : 64;
        rt_module *p = realloc(rt->mods, sizeof *p * (size_t)cap);
        if (!p)
            return mt_fail(err, MT_E_NOMEM, "runtime: module table");
        rt->mods = p;
        rt->cap_mods = cap;
    }
    rt_module *md = &rt->mods[rt->n_mods];
    memset(md, 0, sizeof *md);
    md->fam = k->fam;
    md->kern = k;
    md->cfg = c->cfg;
    snprintf(md->key, sizeof md->key, "%s", k->key);
    snprintf(md->cfg_key, sizeof md->cfg_key, "%s", ck);
    c->module = rt->n_mods++;
    return MT_OK;
}

/* Compiles the modules on a few threads (dev_compile is thread-safe; the
 * host compiler dominates a cold start), then loads them in order. */
typedef struct compile_job {
    model_runtime *rt;
    int next;
    pthread_mutex_t mu;
    mt_status st;
    mt_err err;
} compile_job;

static void *compile_worker(void *arg)
{
    compile_job *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        int i = j->st == MT_OK && j->next < j->rt->n_mods ? j->next++ : -1;
        pthread_mutex_unlock(&j->mu);
        if (i < 0)
            return NULL;
        rt_module *md = &j->rt->mods[i];
        mt_err e = MT_ERR_INIT;
        mt_status st = kern_compile(j->rt->dev, md->fam, md->kern->impl, &md->kern->shape,
                                    &md->cfg, &md->code, &e);
        if (st != MT_OK) {
            pthread_mutex_lock(&j->mu);
            if (j->st == MT_OK) {
                j->st = st;
                j->err = e;
                mt_err_prefix(&j->err, "runtime: %s %s config %s", md->fam->name, md->key,
                              md->cfg_key);
            }
            pthread_mutex_unlock(&j->mu);
        }
    }
}

static mt_status build_modules(model_runtime *rt, mt_err *err)
{
    compile_job j = {.rt = rt, .st = MT_OK, .err = MT_ERR_INIT};
    pthread_mutex_init(&j.mu, NULL);
    enum { N_THREADS = 4 };
    pthread_t th[N_THREADS];
    int started = 0;
    for (int i = 0; i < N_THREADS && i < rt->n_mods; i++)
        if (pthread_create(&th[i], NULL, compile_worker, &j) == 0)
            started++;
    if (!started)
        compile_worker(&j);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&j.mu);
    if (j.st != MT_OK) {
        if (err)
            *err = j.err;
        return j.st;
    }
    for (int i = 0; i < rt->n_mods; i++) {
        rt_module *md = &rt->mods[i];
        mt_status st = dev_module_load(rt->dev, md->code, &md->mod, err);
        if (st != MT_OK)
            return mt_err_prefix(err, "runtime: loading %s %s config %s", md->fam->name, md->key,
                                 md->cfg_key);
    }
    return MT_OK;
}

static void db_dev_of(const dev_props *p, db_device *d)
{
    *d = (db_device){.backend = (int)p->backend, .arch = p->arch, .name = p->name,
                     .runtime_version = p->runtime_version,
                     .driver_version = p->driver_version, .fingerprint = p->fingerprint,
                     .compute_units = p->compute_units};
}

/* One bucket: database first, then the default. */
static mt_status choose(model_runtime *rt, rt_kernel *k, const db_device *dd,
                        const char *hash, rt_choice *c, mt_err *err)
{
    kern_shape s = k->shape;
    k->impl->default_config(&s, c->m, rt->props, &c->cfg);
    c->prov = RT_PROV_NO_DB;
    if (!rt->db)
        return MT_OK;
    db_lookup_result r;
    mt_status st = db_lookup(rt->db, dd, k->fam->name, k->fam->version, hash, k->key, c->m, &r,
                             err);
    if (st != MT_OK)
        return mt_err_prefix(err, "runtime: database lookup of %s %s M=%" PRId64,
                             k->fam->name, k->key, c->m);
    c->miss_recorded = r.miss_recorded;
    c->tuned_m = r.tuned_m;
    switch (r.provenance) {
    case DB_HIT_EXACT: c->prov = RT_PROV_TUNED; break;
    case DB_HIT_NEAREST: c->prov = RT_PROV_NEAREST; break;
    case DB_OTHER_DEVICE:
        c->prov = RT_PROV_OTHER_DEVICE;
        snprintf(c->note, sizeof c->note, "tuned on %.120s (%d CUs)", r.device_name,
                 r.device_compute_units);
        break;
    case DB_STALE:
        c->prov = RT_PROV_STALE;
        snprintf(c->note, sizeof c->note, "entries for source %.12s, this build %.12s",
                 r.stale_hash, hash);
        return MT_OK;
    default:
        c->prov = RT_PROV_MISS;
        return MT_OK;
    }
    kern_config cfg;
    mt_err e2 = MT_ERR_INIT;
    char why[160] = "";
    if (kern_config_parse(k->impl, r.config_json, &cfg, &e2) != MT_OK)
        snprintf(why, sizeof why, "%.150s", e2.msg);
    else if (!kern_config_valid(k->fam, k->impl, &s, c->m, &cfg, rt->props, why, sizeof why))
        ;
    else {
        c->cfg = cfg;
        return MT_OK;
    }
    c->prov = RT_PROV_REJECTED;
    snprintf(c->note, sizeof c->note, "%.100s: %.80s", r.config_key, why);
    return MT_OK;
}

/* One line per kernel: runs of buckets with the same provenance. */
static void kernel_line(const rt_kernel *k, FILE *f)
{
    fprintf(f, "  %-13s %-40s %-13s", k->fam->name, k->key, k->use);
    for (int b = 0; b < k->n;) {
        int e = b;
        while (e + 1 < k->n && k->ch[e + 1].prov == k->ch[b].prov &&
               k->ch[e + 1].tuned_m == k->ch[b].tuned_m)
            e++;
        const rt_choice *c = &k->ch[b];
        char range[48];
        if (e == b)
            snprintf(range, sizeof range, "M=%" PRId64, c->m);
        else
            snprintf(range, sizeof range, "M=%" PRId64 "..%" PRId64, c->m, k->ch[e].m);
        switch (c->prov) {
        case RT_PROV_NEAREST:
            fprintf(f, " %s nearest (tuned M=%" PRId64 ");", range, c->tuned_m);
            break;
        case RT_PROV_OTHER_DEVICE:
            fprintf(f, " %s other device (%s, M=%" PRId64 ");", range, c->note, c->tuned_m);
            break;
        case RT_PROV_MISS:
            fprintf(f, " %s default (miss %s);", range,
                    c->miss_recorded ? "recorded" : "not recorded");
            break;
        case RT_PROV_STALE:
        case RT_PROV_REJECTED:
            fprintf(f, " %s %s [%s];", range, rt_prov_name(c->prov), c->note);
            break;
        default:
            fprintf(f, " %s %s;", range, rt_prov_name(c->prov));
        }
        b = e + 1;
    }
    fputc('\n', f);
}

mt_status rt_select(model_runtime *rt, mt_err *err)
{
    db_device dd;
    db_dev_of(rt->props, &dd);
    for (int i = 0; i < rt->n_kerns; i++) {
        rt_kernel *k = rt->kerns[i];
        char hash[65];
        kern_source_hash(k->fam, rt->props->backend, hash);
        k->n = 0;
        for (int b = 0; b < RT_N_BUCKETS; b++) {
            rt_choice *c = &k->ch[k->n++];
            memset(c, 0, sizeof *c);
            c->m = rt_buckets[b];
            mt_status st = choose(rt, k, &dd, hash, c, err);
            if (st == MT_OK)
                st = module_for(rt, k, c, err);
            if (st != MT_OK)
                return st;
            if (rt_buckets[b] >= k->m_max)
                break;
        }
    }
    mt_status st = build_modules(rt, err);
    if (st != MT_OK)
        return st;
    if (rt->db)
        for (int i = 0; i < rt->n_kerns; i++)
            kernel_line(rt->kerns[i], rt->log);
    model_selection_counts n;
    model_runtime_selection(rt, &n);
    int total = n.tuned + n.nearest + n.other_device + n.stale + n.defaults;
    if (!rt->db)
        fprintf(rt->log, "kernel selection: no tuning database: all %d kernel selections "
                "(%d kernels x M buckets) run the default config; %d modules\n",
                total, rt->n_kerns, rt->n_mods);
    else
        fprintf(rt->log, "kernel selection (%s, %s): %d selections over %d kernels: %d tuned, "
                "%d nearest bucket, %d other device, %d stale, %d default; %d modules\n",
                db_path(rt->db), rt->props->name, total, rt->n_kerns, n.tuned, n.nearest,
                n.other_device, n.stale, n.defaults, rt->n_mods);
    return MT_OK;
}

mt_status rt_run(model_runtime *rt, rt_kernel *k, int64_t m, const kern_shape *shape,
                 void *const *bufs, mt_err *err)
{
    if (m <= 0)
        return MT_OK;
    const rt_choice *c = &k->ch[bucket_of(k, m)];
    const kern_shape *s = shape ? shape : &k->shape;
    size_t need = k->impl->scratch_bytes ? k->impl->scratch_bytes(s, m, &c->cfg) : 0;
    if (need > rt->scratch_bytes) {
        mt_status st = dev_synchronize(rt->dev, err);
        if (st != MT_OK)
            return st;
        dev_free(rt->dev, rt->scratch);
        rt->scratch = NULL;
        rt->scratch_bytes = 0;
        st = dev_alloc(rt->dev, need, &rt->scratch, err);
        if (st != MT_OK)
            return mt_err_prefix(err, "runtime: scratch of %zu bytes", need);
        rt->scratch_bytes = need;
    }
    kern_ctx ctx = {.dev = rt->dev, .mod = rt->mods[c->module].mod, .props = rt->props,
                    .fam = k->fam, .impl = k->impl, .shape = s, .m = m, .cfg = &c->cfg,
                    .bufs = bufs, .scratch = rt->scratch};
    mt_status st = k->impl->run(&ctx, err);
    if (st != MT_OK)
        mt_err_prefix(err, "%s (%s, %s, M=%" PRId64 ")", k->fam->name, k->use, k->key, m);
    return st;
}

void rt_kernels_free(model_runtime *rt)
{
    for (int i = 0; i < rt->n_mods; i++) {
        dev_module_unload(rt->mods[i].mod);
        dev_code_free(rt->mods[i].code);
    }
    free(rt->mods);
    rt->mods = NULL;
    rt->n_mods = rt->cap_mods = 0;
    for (int i = 0; i < rt->n_kerns; i++)
        free(rt->kerns[i]);
    free(rt->kerns);
    rt->kerns = NULL;
    rt->n_kerns = rt->cap_kerns = 0;
    model_plan_free(rt->plan);
    rt->plan = NULL;
    if (rt->dev)
        dev_free(rt->dev, rt->scratch);
    rt->scratch = NULL;
    rt->scratch_bytes = 0;
}

/* ---- report --------------------------------------------------------------- */

void model_runtime_selection(const model_runtime *rt, model_selection_counts *out)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < rt->n_kerns; i++)
        for (int b = 0; b < rt->kerns[i]->n; b++)
            switch (rt->kerns[i]->ch[b].prov) {
            case RT_PROV_TUNED: out->tuned++; break;
            case RT_PROV_NEAREST: out->nearest++; break;
            case RT_PROV_OTHER_DEVICE: out->other_device++; break;
            case RT_PROV_STALE: out->stale++; break;
            default: out->defaults++; break;
            }
}

void model_runtime_report(const model_runtime *rt, FILE *f)
{
    fprintf(f, "kernel selection on %s (%s)%s%s; a call with M rows runs the smallest bucket "
            ">= M\n", rt->props->spec, rt->props->name, rt->db ? ", database " : ", no database",
            rt->db ? db_path(rt->db) : "");
    fprintf(f, "%-14s %-44s %-12s %6s  %-28s %s\n", "family", "shape", "use", "M", "config",
            "provenance");
    for (int i = 0; i < rt->n_kerns; i++) {
        const rt_kernel *k = rt->kerns[i];
        for (int b = 0; b < k->n; b++) {
            const rt_choice *c = &k->ch[b];
            char ck[256], prov[320];
            kern_config_key(k->impl, &c->cfg, ck, sizeof ck);
            switch (c->prov) {
            case RT_PROV_NEAREST:
                snprintf(prov, sizeof prov, "nearest (tuned at M=%" PRId64 ")", c->tuned_m);
                break;
            case RT_PROV_OTHER_DEVICE:
                snprintf(prov, sizeof prov, "other device, M=%" PRId64 ": %s", c->tuned_m,
                         c->note);
                break;
            case RT_PROV_STALE:
            case RT_PROV_REJECTED:
                snprintf(prov, sizeof prov, "%s: %s", rt_prov_name(c->prov), c->note);
                break;
            case RT_PROV_MISS:
                snprintf(prov, sizeof prov, "default (miss%s)",
                         c->miss_recorded ? " recorded" : ", not recorded");
                break;
            default:
                snprintf(prov, sizeof prov, "%s", rt_prov_name(c->prov));
            }
            fprintf(f, "%-14s %-44s %-12s %6" PRId64 "  %-28s %s\n", k->fam->name, k->key,
                    k->use, c->m, ck, prov);
        }
    }
    model_selection_counts n;
    model_runtime_selection(rt, &n);
    fprintf(f, "summary: %d tuned, %d nearest bucket, %d other device, %d stale, %d default "
            "(%d kernels, %d modules)\n", n.tuned, n.nearest, n.other_device, n.stale,
            n.defaults, rt->n_kerns, rt->n_mods);
}
