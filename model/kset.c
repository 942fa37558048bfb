/* kset.c: kernel sets: selection from the tuning database, one executor per
 * distinct (family, tuning key, config), runs and the selection report (see
 * kset.h). */
#include "kset.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "kernels/core/kern_db.h"
#include "kset_swap.h"

const int64_t model_buckets[MODEL_N_BUCKETS] = {1,  2,   4,   8,   16,  24,   32,   48,
                                                64, 96, 128, 256, 512, 1024, 2048, 4096};

static const char *const prov_names[MODEL_PROV_COUNT] = {
    [MODEL_PROV_TUNED] = "tuned",
    [MODEL_PROV_NEAREST] = "nearest",
    [MODEL_PROV_OTHER_DEVICE] = "other-device",
    [MODEL_PROV_STALE] = "stale",
    [MODEL_PROV_MISS] = "default (miss)",
    [MODEL_PROV_NO_DB] = "default",
    [MODEL_PROV_REJECTED] = "default (db config rejected)",
};
_Static_assert(sizeof prov_names / sizeof prov_names[0] == MODEL_PROV_COUNT, "prov names");

const char *model_prov_name(model_prov p) { return p < MODEL_PROV_COUNT ? prov_names[p] : "?"; }

/* One executor to build: the first kernel that asked for it gives the
 * shape it is compiled for. */
typedef struct kset_module {
    const model_kern *kern;
    kern_config cfg;
    char cfg_key[256];
    dev_code *code;   /* compiled, until the exec takes it */
    kern_exec *exec;
} kset_module;

struct model_kset {
    dev_device *dev;
    const dev_props *props;
    db_t *db;
    FILE *log;
    model_kern **kerns;
    int n_kerns, cap_kerns;
    kset_module *mods;
    int n_mods, cap_mods;
    kern_scratch *scratch;
    bool invariant;
    model_kset_live *live; /* live swaps and per-call timing (kset_swap.c); NULL: off */
};

mt_status model_kset_create(dev_device *d, db_t *db, FILE *log, model_kset **out, mt_err *err)
{
    *out = NULL;
    model_kset *ks = calloc(1, sizeof *ks);
    if (!ks)
        return mt_fail(err, MT_E_NOMEM, "kernel set");
    ks->dev = d;
    ks->props = dev_get_props(d);
    ks->db = db;
    ks->log = log ? log : stderr;
    mt_status st = kern_scratch_create(d, &ks->scratch, err);
    if (st != MT_OK) {
        free(ks);
        return st;
    }
    *out = ks;
    return MT_OK;
}

void model_kset_set_batch_invariant(model_kset *ks, bool on) { ks->invariant = on; }
bool model_kset_batch_invariant(const model_kset *ks) { return ks->invariant; }

void model_kset_destroy(model_kset *ks)
{
    if (!ks)
        return;
    for (int i = 0; i < ks->n_mods; i++) {
        kern_exec_close(ks->mods[i].exec);
        dev_code_free(ks->mods[i].code);
    }
    free(ks->mods);
    model_kset_live_free(ks->live);
    for (int i = 0; i < ks->n_kerns; i++)
        free(ks->kerns[i]);
    free(ks->kerns);
    kern_scratch_destroy(ks->scratch);
    free(ks);
}

mt_status model_kset_add(model_kset *ks, const kern_family *f, const kern_shape *s,
                         const char *use, int64_t m_max, model_kern **out, mt_err *err)
{
    const kern_impl *im = kern_family_impl(f, ks->props->backend);
    if (!im)
        return mt_fail(err, MT_E_UNSUPPORTED, "family %s (%s) has no %s implementation",
                       f->name, use, dev_backend_name(ks->props->backend));
    if (ks->n_kerns == ks->cap_kerns) {
        int cap = ks->cap_kerns ? 2 * ks->cap_kerns : 64;
        model_kern **p = realloc(ks->kerns, sizeof *p * (size_t)cap);
        if (!p)
            return mt_fail(err, MT_E_NOMEM, "kernel table");
        ks->kerns = p;
        ks->cap_kerns = cap;
    }
    model_kern *k = calloc(1, sizeof *k);
    if (!k)
        return mt_fail(err, MT_E_NOMEM, "kernel table");
    k->fam = f;
    k->impl = im;
    k->shape = *s;
    kern_shape_key(f, s, false, k->key, sizeof k->key);
    snprintf(k->use, sizeof k->use, "%s", use);
    k->m_max = m_max;
    k->set = ks;
    k->index = ks->n_kerns;
    ks->kerns[ks->n_kerns++] = k;
    if (out)
        *out = k;
    return MT_OK;
}

mt_status model_kset_add_text(model_kset *ks, const char *family, const char *shape_text,
                              const char *use, int64_t m_max, model_kern **out, mt_err *err)
{
    const kern_family *f = kern_family_find(family);
    if (!f)
        return mt_fail(err, MT_E_NOT_FOUND, "no kernel family '%s' (%s)", family, use);
    kern_shape s;
    mt_status st = kern_shape_parse(f, shape_text, &s, NULL, err);
    if (st != MT_OK)
        return mt_err_prefix(err, "%s (%s)", family, use);
    return model_kset_add(ks, f, &s, use, m_max, out, err);
}

void model_kern_shape_set(const model_kern *k, kern_shape *s, const char *name, int64_t v)
{
    for (int d = 0; d < k->fam->n_dims; d++)
        if (!strcmp(k->fam->dims[d].name, name))
            s->v[d] = v;
}

static int bucket_of(const model_kern *k, int64_t m)
{
    for (int i = 0; i < k->n; i++)
        if (k->ch[i].m >= m)
            return i;
    return k->n - 1;
}

const model_choice *model_kern_choice(const model_kern *k, int64_t m)
{
    return &k->ch[bucket_of(k, m)];
}

/* Finds or adds the module of (family, key, config); compiled later. */
static mt_status module_for(model_kset *ks, const model_kern *k, model_choice *c, mt_err *err)
{
    char ck[256];
    kern_config_key(k->impl, &c->cfg, ck, sizeof ck);
    for (int i = 0; i < ks->n_mods; i++) {
        const kset_module *md = &ks->mods[i];
        if (md->kern->fam == k->fam && !strcmp(md->kern->key, k->key) &&
            !strcmp(md->cfg_key, ck)) {
            c->module = i;
            return MT_OK;
        }
    }
    if (ks->n_mods == ks->cap_mods) {
        int cap = ks->cap_mods ? 2 * ks->cap_mods : 64;
        kset_module *p = realloc(ks->mods, sizeof *p * (size_t)cap);
        if (!p)
            return mt_fail(err, MT_E_NOMEM, "module table");
        ks->mods = p;
        ks->cap_mods = cap;
    }
    kset_module *md = &ks->mods[ks->n_mods];
    memset(md, 0, sizeof *md);
    md->kern = k;
    md->cfg = c->cfg;
    snprintf(md->cfg_key, sizeof md->cfg_key, "%s", ck);
    c->module = ks->n_mods++;
    return MT_OK;
}

/* Compiles the modules on a few threads (kern_compile is thread-safe; the
 * host compiler dominates a cold start), then opens the executors in
 * order. */
typedef struct compile_job {
    model_kset *ks;
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
        int i = j->st == MT_OK && j->next < j->ks->n_mods ? j->next++ : -1;
        pthread_mutex_unlock(&j->mu);
        if (i < 0)
            return NULL;
        kset_module *md = &j->ks->mods[i];
        mt_err e = MT_ERR_INIT;
        mt_status st = kern_compile(j->ks->dev, md->kern->fam, md->kern->impl, &md->kern->shape,
                                    &md->cfg, &md->code, &e);
        if (st != MT_OK) {
            pthread_mutex_lock(&j->mu);
            if (j->st == MT_OK) {
                j->st = st;
                j->err = e;
                mt_err_prefix(&j->err, "%s %s config %s", md->kern->fam->name, md->kern->key,
                              md->cfg_key);
            }
            pthread_mutex_unlock(&j->mu);
        }
    }
}

static mt_status build_modules(model_kset *ks, mt_err *err)
{
    compile_job j = {.ks = ks, .st = MT_OK, .err = MT_ERR_INIT};
    pthread_mutex_init(&j.mu, NULL);
    enum { N_THREADS = 4 };
    pthread_t th[N_THREADS];
    int started = 0;
    for (int i = 0; i < N_THREADS && i < ks->n_mods; i++)
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
    for (int i = 0; i < ks->n_mods; i++) {
        kset_module *md = &ks->mods[i];
        dev_code *code = md->code;
        md->code = NULL; /* the exec takes it, also on failure */
        mt_status st = kern_exec_open_code(ks->dev, md->kern->fam, &md->kern->shape, &md->cfg,
                                           code, &md->exec, err);
        if (st != MT_OK)
            return mt_err_prefix(err, "%s %s", md->kern->fam->name, md->kern->key);
        kern_exec_share_scratch(md->exec, ks->scratch);
    }
    return MT_OK;
}

/* One bucket: database first, then the default. */
static mt_status choose(model_kset *ks, model_kern *k, const db_device *dd, const char *hash,
                        model_choice *c, mt_err *err)
{
    const kern_shape *s = &k->shape;
    k->impl->default_config(s, c->m, ks->props, &c->cfg);
    c->prov = MODEL_PROV_NO_DB;
    if (!ks->db)
        return MT_OK;
    db_lookup_result r;
    mt_status st = db_lookup(ks->db, dd, k->fam->name, k->fam->version, hash, k->key, c->m, &r,
                             err);
    char run[KERN_KEY_MAX]; /* with the runtime dims: what tune --misses times */
    kern_shape_key(k->fam, s, true, run, sizeof run);
    if (st == MT_OK)
        st = db_lookup_record_miss(ks->db, dd, k->fam->name, k->key, run, c->m, &r, err);
    if (st != MT_OK)
        return mt_err_prefix(err, "database lookup of %s %s M=%" PRId64, k->fam->name, k->key,
                             c->m);
    c->miss_recorded = r.miss_recorded;
    c->tuned_m = r.tuned_m;
    switch (r.provenance) {
    case DB_HIT_EXACT: c->prov = MODEL_PROV_TUNED; break;
    case DB_HIT_NEAREST: c->prov = MODEL_PROV_NEAREST; break;
    case DB_OTHER_DEVICE:
        c->prov = MODEL_PROV_OTHER_DEVICE;
        snprintf(c->note, sizeof c->note, "tuned on %.120s (%d CUs)", r.device_name,
                 r.device_compute_units);
        break;
    case DB_STALE:
        c->prov = MODEL_PROV_STALE;
        snprintf(c->note, sizeof c->note, "entries for source %.12s, this build %.12s",
                 r.stale_hash, hash);
        return MT_OK;
    default:
        c->prov = MODEL_PROV_MISS;
        return MT_OK;
    }
    kern_config cfg;
    mt_err e2 = MT_ERR_INIT;
    char why[160] = "";
    if (kern_config_parse(k->impl, r.config_json, &cfg, &e2) != MT_OK)
        snprintf(why, sizeof why, "%.150s", e2.msg);
    else if (!kern_config_valid(k->fam, k->impl, s, c->m, &cfg, ks->props, why, sizeof why))
        ;
    else if (ks->invariant && k->impl->order_varies &&
             k->impl->order_varies(s, &cfg, why, sizeof why))
        ;
    else {
        c->cfg = cfg;
        return MT_OK;
    }
    c->prov = MODEL_PROV_REJECTED;
    snprintf(c->note, sizeof c->note, "%.100s: %.80s", r.config_key, why);
    return MT_OK;
}

/* Whether cfg runs every bucket of k, in an order independent of timing. */
static bool runs_everywhere(const model_kset *ks, const model_kern *k, const kern_config *cfg,
                            char *why, size_t cap)
{
    if (k->impl->order_varies && k->impl->order_varies(&k->shape, cfg, why, cap))
        return false;
    for (int b = 0; b < k->n; b++)
        if (!kern_config_valid(k->fam, k->impl, &k->shape, k->ch[b].m, cfg, ks->props, why, cap))
            return false;
    return true;
}

/* Batch-invariant mode: one choice for every bucket (kset.h). */
static mt_status pin(const model_kset *ks, model_kern *k, mt_err *err)
{
    model_choice cand[4];
    cand[0] = k->ch[0];
    cand[1] = k->ch[k->n - 1];
    for (int i = 2; i < 4; i++) {
        cand[i] = cand[i - 2];
        k->impl->default_config(&k->shape, cand[i].m, ks->props, &cand[i].cfg);
        if (cand[i].prov <= MODEL_PROV_OTHER_DEVICE) {
            /* The tuned config does not run every M: say so. */
            cand[i].prov = MODEL_PROV_REJECTED;
            snprintf(cand[i].note, sizeof cand[i].note,
                     "batch-invariant: the config tuned for M=%" PRId64 " does not run every M",
                     cand[i].m);
        }
    }
    char why[160] = "";
    for (int i = 0; i < 4; i++) {
        if (!runs_everywhere(ks, k, &cand[i].cfg, why, sizeof why))
            continue;
        for (int b = 0; b < k->n; b++) {
            int64_t m = k->ch[b].m;
            k->ch[b] = cand[i];
            k->ch[b].m = m;
            k->ch[b].pinned_m = cand[i].m;
        }
        return MT_OK;
    }
    return mt_fail(err, MT_E_UNSUPPORTED, "batch-invariant mode: no config of %s (%s, %s) runs "
                   "every M up to %" PRId64 " in an order independent of thread timing (%s)",
                   k->fam->name, k->use, k->key, k->m_max, why);
}

/* One line per kernel: runs of buckets with the same provenance. */
static void kernel_line(const model_kern *k, FILE *f)
{
    fprintf(f, "  %-13s %-40s %-13s", k->fam->name, k->key, k->use);
    for (int b = 0; b < k->n;) {
        int e = b;
        while (e + 1 < k->n && k->ch[e + 1].prov == k->ch[b].prov &&
               k->ch[e + 1].tuned_m == k->ch[b].tuned_m)
            e++;
        const model_choice *c = &k->ch[b];
        char range[48];
        if (e == b)
            snprintf(range, sizeof range, "M=%" PRId64, c->m);
        else
            snprintf(range, sizeof range, "M=%" PRId64 "..%" PRId64, c->m, k->ch[e].m);
        switch (c->prov) {
        case MODEL_PROV_NEAREST:
            fprintf(f, " %s nearest (tuned M=%" PRId64 ");", range, c->tuned_m);
            break;
        case MODEL_PROV_OTHER_DEVICE:
            fprintf(f, " %s other device (%s, M=%" PRId64 ");", range, c->note, c->tuned_m);
            break;
        case MODEL_PROV_MISS:
            fprintf(f, " %s default (miss %s);", range,
                    c->miss_recorded ? "recorded" : "not recorded");
            break;
        case MODEL_PROV_STALE:
        case MODEL_PROV_REJECTED:
            fprintf(f, " %s %s [%s];", range, model_prov_name(c->prov), c->note);
            break;
        default:
            fprintf(f, " %s %s;", range, model_prov_name(c->prov));
        }
        b = e + 1;
    }
    if (k->n && k->ch[0].pinned_m)
        fprintf(f, " batch-invariant: M=%" PRId64 "'s config at every M;", k->ch[0].pinned_m);
    fputc('\n', f);
}

mt_status model_kset_select(model_kset *ks, mt_err *err)
{
    db_device dd;
    kern_db_device(ks->props, &dd);
    for (int i = 0; i < ks->n_kerns; i++) {
        model_kern *k = ks->kerns[i];
        char hash[65];
        kern_source_hash(k->fam, ks->props->backend, hash);
        k->n = 0;
        for (int b = 0; b < MODEL_N_BUCKETS; b++) {
            model_choice *c = &k->ch[k->n++];
            memset(c, 0, sizeof *c);
            c->m = model_buckets[b];
            mt_status st = choose(ks, k, &dd, hash, c, err);
            if (st != MT_OK)
                return st;
            if (model_buckets[b] >= k->m_max)
                break;
        }
        /* A kernel whose sums no config reorders keeps its choice per M. */
        mt_status st = ks->invariant && !k->impl->order_fixed ? pin(ks, k, err) : MT_OK;
        for (int b = 0; b < k->n && st == MT_OK; b++)
            st = module_for(ks, k, &k->ch[b], err);
        if (st != MT_OK)
            return st;
    }
    mt_status st = build_modules(ks, err);
    if (st != MT_OK)
        return st;
    if (ks->db)
        for (int i = 0; i < ks->n_kerns; i++)
            kernel_line(ks->kerns[i], ks->log);
    if (ks->invariant)
        fprintf(ks->log, "kernel selection: batch-invariant: every kernel runs one config at "
                "every M and no split-K, so a row's result does not depend on the batch\n");
    model_selection_counts n;
    model_kset_counts(ks, &n);
    int total = n.tuned + n.nearest + n.other_device + n.stale + n.defaults;
    if (!ks->db)
        fprintf(ks->log, "kernel selection: no tuning database: all %d kernel selections "
                "(%d kernels x M buckets) run the default config; %d modules\n",
                total, ks->n_kerns, ks->n_mods);
    else
        fprintf(ks->log, "kernel selection (%s, %s): %d selections over %d kernels: %d tuned, "
                "%d nearest bucket, %d other device, %d stale, %d default; %d modules\n",
                db_path(ks->db), ks->props->name, total, ks->n_kerns, n.tuned, n.nearest,
                n.other_device, n.stale, n.defaults, ks->n_mods);
    return MT_OK;
}

mt_status model_kern_run(model_kern *k, int64_t m, const kern_shape *shape, void *const *bufs,
                         mt_err *err)
{
    if (m <= 0)
        return MT_OK;
    int b = bucket_of(k, m);
    model_kset_live *lv = k->set->live;
    uint64_t t0 = lv ? mt_now_ns() : 0;
    mt_status st = kern_exec_run(k->set->mods[k->ch[b].module].exec, shape ? shape : &k->shape,
                                 m, bufs, err);
    if (st != MT_OK)
        mt_err_prefix(err, "%s (%s, %s)", k->fam->name, k->use, k->key);
    else if (lv)
        model_kset_live_note(lv, k, b, m, mt_now_ns() - t0);
    return st;
}

mt_status model_kset_replace(model_kset *ks, model_kern *k, int b, const kern_config *cfg,
                             dev_code *code, model_choice *old, mt_err *err)
{
    if (ks->invariant) {
        dev_code_free(code);
        return mt_fail(err, MT_E_UNSUPPORTED, "%s (%s): a batch-invariant kernel set runs one "
                       "config at every M: no live swap", k->fam->name, k->key);
    }
    if (b < 0 || b >= k->n) {
        dev_code_free(code);
        return mt_fail(err, MT_E_INVALID, "%s (%s): no bucket %d", k->fam->name, k->key, b);
    }
    model_choice c = k->ch[b];
    c.cfg = *cfg;
    int n_before = ks->n_mods;
    mt_status st = module_for(ks, k, &c, err);
    if (st == MT_OK && c.module == n_before) { /* a new executor */
        kset_module *md = &ks->mods[c.module];
        if (!code)
            st = mt_fail(err, MT_E_INVALID, "%s (%s): no code for a new config", k->fam->name,
                         k->key);
        else
            st = kern_exec_open_code(ks->dev, k->fam, &k->shape, cfg, code, &md->exec, err);
        code = NULL; /* taken */
        if (st == MT_OK)
            kern_exec_share_scratch(md->exec, ks->scratch);
        else
            ks->n_mods = n_before;
    }
    dev_code_free(code);
    if (st != MT_OK)
        return mt_err_prefix(err, "%s (%s) M=%" PRId64, k->fam->name, k->key, k->ch[b].m);
    if (old)
        *old = k->ch[b];
    c.swapped = true;
    c.prov = MODEL_PROV_TUNED;
    c.tuned_m = c.m;
    c.note[0] = 0;
    k->ch[b] = c;
    return MT_OK;
}

dev_device *model_kset_device(const model_kset *ks) { return ks->dev; }

model_kset_live *model_kset_live_get(const model_kset *ks) { return ks->live; }
void model_kset_live_set(model_kset *ks, model_kset_live *lv) { ks->live = lv; }

int model_kset_n_kernels(const model_kset *ks) { return ks->n_kerns; }
model_kern *model_kset_kernel(const model_kset *ks, int i) { return ks->kerns[i]; }
int model_kset_n_modules(const model_kset *ks) { return ks->n_mods; }

/* ---- report --------------------------------------------------------------- */

void model_kset_counts(const model_kset *ks, model_selection_counts *out)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < ks->n_kerns; i++)
        for (int b = 0; b < ks->kerns[i]->n; b++)
            switch (ks->kerns[i]->ch[b].prov) {
            case MODEL_PROV_TUNED:
                out->tuned++;
                out->swapped += ks->kerns[i]->ch[b].swapped;
                break;
            case MODEL_PROV_NEAREST: out->nearest++; break;
            case MODEL_PROV_OTHER_DEVICE: out->other_device++; break;
            case MODEL_PROV_STALE: out->stale++; break;
            default: out->defaults++; break;
            }
    if (ks->live)
        model_kset_live_totals(ks->live, &out->swaps, &out->swapped_back);
}

void model_kset_report(const model_kset *ks, FILE *f)
{
    fprintf(f, "kernel selection on %s (%s)%s%s; a call with M rows runs the smallest bucket "
            ">= M%s\n", ks->props->spec, ks->props->name, ks->db ? ", database " : ", no database",
            ks->db ? db_path(ks->db) : "",
            ks->invariant ? "; batch-invariant: one config per kernel at every M" : "");
    fprintf(f, "%-14s %-44s %-12s %6s  %-28s %s\n", "family", "shape", "use", "M", "config",
            "provenance");
    for (int i = 0; i < ks->n_kerns; i++) {
        const model_kern *k = ks->kerns[i];
        for (int b = 0; b < k->n; b++) {
            const model_choice *c = &k->ch[b];
            char ck[256], prov[320];
            kern_config_key(k->impl, &c->cfg, ck, sizeof ck);
            switch (c->prov) {
            case MODEL_PROV_NEAREST:
                snprintf(prov, sizeof prov, "nearest (tuned at M=%" PRId64 ")", c->tuned_m);
                break;
            case MODEL_PROV_OTHER_DEVICE:
                snprintf(prov, sizeof prov, "other device, M=%" PRId64 ": %s", c->tuned_m,
                         c->note);
                break;
            case MODEL_PROV_STALE:
            case MODEL_PROV_REJECTED:
                snprintf(prov, sizeof prov, "%s: %s", model_prov_name(c->prov), c->note);
                break;
            case MODEL_PROV_MISS:
                snprintf(prov, sizeof prov, "default (miss%s)",
                         c->miss_recorded ? " recorded" : ", not recorded");
                break;
            default:
                snprintf(prov, sizeof prov, "%s%s", model_prov_name(c->prov),
                         c->swapped ? " (swapped in while serving)" : "");
            }
            if (c->pinned_m && c->pinned_m != c->m) {
                size_t l = strlen(prov);
                snprintf(prov + l, sizeof prov - l, " [batch-invariant: M=%" PRId64 "'s]",
                         c->pinned_m);
            }
            fprintf(f, "%-14s %-44s %-12s %6" PRId64 "  %-28s %s\n", k->fam->name, k->key,
                    k->use, c->m, ck, prov);
        }
    }
    model_selection_counts n;
    model_kset_counts(ks, &n);
    fprintf(f, "summary: %d tuned, %d nearest bucket, %d other device, %d stale, %d default "
            "(%d kernels, %d modules)\n", n.tuned, n.nearest, n.other_device, n.stale,
            n.defaults, ks->n_kerns, ks->n_mods);
    if (ks->live)
        fprintf(f, "live swaps: %lld applied, %lld swapped back; %d selections run a config "
                "swapped in while serving\n", (long long)n.swaps, (long long)n.swapped_back,
                n.swapped);
}
