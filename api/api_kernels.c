/* api_kernels.c: a layer description's kernels, picked from the device's
 * layered databases by the runtime's rules and compiled once (see
 * api_impl.h), and the selection report.
 *
 * The runtime's kernel set (model/kset.h) asks one database. With several,
 * each kernel goes to the set of the first database whose db_lookup finds a
 * config for it (this device model at that M or the nearest M, or another
 * device of the same backend and arch; whether one does depends on the
 * kernel and shape, not on M), so within that set the runtime's own
 * selection runs unchanged: same buckets, same validity checks, same
 * report. A kernel no database has goes to the set of the first database
 * that knows it only for another source (reported stale), else of the
 * first database (a miss). Sets compile their modules once each through the
 * on-disk compile cache. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "api_impl.h"
#include "kernels/core/kern_db.h"

/* The layer's kernels in launch order (model_moe_run's). */
enum { K_SH_ALIGN, K_SH_UP, K_SH_DOWN, K_ROUTE, K_ROUTE_LOGITS, K_ALIGN, K_UP, K_DOWN,
       K_COMBINE, K_COUNT };

typedef struct kspec {
    const char *family, *use;
    char key[KERN_KEY_MAX]; /* "" when the layer has no such kernel */
    model_kern **slot;
    int set;                /* which database's set: index into the dbs, or n_dbs */
} kspec;

static void specs(const moe_dims *d, moetune_routing r, api_kernels *k, kspec *s)
{
    moe_keys keys;
    moe_layer_keys(d, &keys);
    /* The logits router: moe_route with the logits as its rows (H = E). */
    moe_dims dl = *d;
    dl.hidden = d->n_experts;
    moe_keys lkeys;
    moe_layer_keys(&dl, &lkeys);
    const struct {
        const char *family, *use, *key;
        model_kern **slot;
        bool on;
    } t[K_COUNT] = {
        [K_SH_ALIGN] = {"moe_align", "shared sort", keys.sh_align, &k->layer.sh_align, true},
        [K_SH_UP] = {"moe_gemm_up", "shared up", keys.sh_up, &k->layer.sh_up, true},
        [K_SH_DOWN] = {"moe_gemm_down", "shared down", keys.sh_down, &k->layer.sh_down, true},
        [K_ROUTE] = {"moe_route", "router", keys.route, &k->layer.route, r == MOETUNE_ROUTE_GATE},
        [K_ROUTE_LOGITS] = {"moe_route", "router logits", lkeys.route, &k->route_logits,
                            r == MOETUNE_ROUTE_LOGITS},
        [K_ALIGN] = {"moe_align", "expert sort", keys.align, &k->layer.align, true},
        [K_UP] = {"moe_gemm_up", "experts up", keys.up, &k->layer.up, true},
        [K_DOWN] = {"moe_gemm_down", "experts down", keys.down, &k->layer.down, true},
        [K_COMBINE] = {"moe_combine", "combine", keys.combine, &k->layer.combine, true},
    };
    for (int i = 0; i < K_COUNT; i++) {
        s[i] = (kspec){.family = t[i].family, .use = t[i].use, .slot = t[i].slot};
        if (t[i].on)
            snprintf(s[i].key, sizeof s[i].key, "%s", t[i].key);
    }
}

/* Which database's set kernel s joins (see the top of the file). */
static mt_status place(moetune_device *dev, kspec *s, mt_err *err)
{
    s->set = dev->n_dbs;
    if (!dev->n_dbs)
        return MT_OK;
    const kern_family *f = kern_family_find(s->family);
    if (!f)
        return mt_fail(err, MT_E_NOT_FOUND, "no kernel family '%s'", s->family);
    kern_shape shape;
    MT_CHECK(kern_shape_parse(f, s->key, &shape, NULL, err));
    char key[KERN_KEY_MAX], hash[65];
    kern_shape_key(f, &shape, false, key, sizeof key);
    kern_source_hash(f, dev->props->backend, hash);
    db_device dd;
    kern_db_device(dev->props, &dd);
    int stale = -1;
    for (int i = 0; i < dev->n_dbs; i++) {
        db_lookup_result r;
        mt_status st = db_lookup(dev->dbs[i], &dd, f->name, f->version, hash, key,
                                 model_buckets[0], &r, err);
        if (st != MT_OK)
            return mt_err_prefix(err, "database lookup of %s %s", f->name, key);
        if (r.has_config) {
            s->set = i;
            return MT_OK;
        }
        if (r.provenance == DB_STALE && stale < 0)
            stale = i;
    }
    s->set = stale >= 0 ? stale : 0;
    return MT_OK;
}

static void free_bundle(api_kernels *k)
{
    for (int i = 0; i < k->n_sets; i++)
        model_kset_destroy(k->sets[i]);
    if (k->log)
        fclose(k->log);
    free(k->log_buf);
    free(k->sel);
    free(k->sel_config);
    free(k->report);
    free(k);
}

/* The selection table (kernels in launch order) and its text. */
static mt_status build_report(moetune_device *dev, api_kernels *k, const kspec *s,
                              mt_err *err)
{
    int n = 0;
    for (int i = 0; i < K_COUNT; i++)
        if (s[i].key[0])
            n += (*s[i].slot)->n;
    k->sel = calloc((size_t)n, sizeof *k->sel);
    k->sel_config = calloc((size_t)n, sizeof *k->sel_config);
    if (!k->sel || !k->sel_config)
        return mt_fail(err, MT_E_NOMEM, "selection report");
    for (int i = 0; i < K_COUNT; i++) {
        if (!s[i].key[0])
            continue;
        const model_kern *kern = *s[i].slot;
        const char *db = s[i].set < dev->n_dbs ? db_path(dev->dbs[s[i].set]) : NULL;
        for (int b = 0; b < kern->n; b++) {
            const model_choice *c = &kern->ch[b];
            kern_config_key(kern->impl, &c->cfg, k->sel_config[k->n_sel],
                            sizeof k->sel_config[0]);
            bool dflt = c->prov >= MODEL_PROV_STALE;
            int j = k->n_sel++;
            k->sel[j] = (moetune_selection){
                .kernel = kern->fam->name, .use = kern->use, .shape = kern->key,
                .config = k->sel_config[j], .db = dflt ? NULL : db, .note = c->note, .m = c->m,
                .tuned_m = dflt ? 0 : c->tuned_m, .source = (moetune_source)c->prov,
                .is_default = dflt};
        }
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return mt_fail(err, MT_E_NOMEM, "selection report");
    fprintf(f, "kernel selection on %s (%s), ", dev->props->spec, dev->props->name);
    if (!dev->n_dbs)
        fprintf(f, "no database");
    for (int i = 0; i < dev->n_dbs; i++)
        fprintf(f, "%sdatabase %d %s", i ? ", " : "", i + 1, db_path(dev->dbs[i]));
    fprintf(f, "; a run of M tokens uses the smallest bucket >= M\n");
    fprintf(f, "%-14s %-44s %-13s %6s  %-32s %s\n", "kernel", "shape", "use", "M", "config",
            "source");
    int count[MOETUNE_SOURCE_COUNT] = {0};
    for (int i = 0; i < k->n_sel; i++) {
        const moetune_selection *e = &k->sel[i];
        count[e->source]++;
        fprintf(f, "%-14s %-44s %-13s %6" PRId64 "  %-32s %s", e->kernel, e->shape, e->use,
                e->m, e->config, moetune_source_str(e->source));
        if (e->source == MOETUNE_SOURCE_NEAREST || e->source == MOETUNE_SOURCE_OTHER_DEVICE)
            fprintf(f, " (tuned at M=%" PRId64 ")", e->tuned_m);
        if (e->note[0])
            fprintf(f, " [%s]", e->note);
        if (e->db && dev->n_dbs > 1)
            fprintf(f, " from %s", e->db);
        fputc('\n', f);
    }
    int dflt = count[MOETUNE_SOURCE_STALE] + count[MOETUNE_SOURCE_MISS] +
               count[MOETUNE_SOURCE_NO_DB] + count[MOETUNE_SOURCE_REJECTED];
    fprintf(f, "summary: %d selections: %d tuned, %d nearest, %d other device, %d stale, "
            "%d default (%d missed, %d rejected)\n", k->n_sel, count[MOETUNE_SOURCE_TUNED],
            count[MOETUNE_SOURCE_NEAREST], count[MOETUNE_SOURCE_OTHER_DEVICE],
            count[MOETUNE_SOURCE_STALE], dflt, count[MOETUNE_SOURCE_MISS],
            count[MOETUNE_SOURCE_REJECTED]);
    if (fclose(f) != 0 || !text) {
        free(text);
        return mt_fail(err, MT_E_NOMEM, "selection report");
    }
    k->report = text;
    return MT_OK;
}

static mt_status build(moetune_device *dev, api_kernels *k, const moe_dims *d,
                       moetune_routing r, int64_t max_m, mt_err *err)
{
    kspec s[K_COUNT];
    specs(d, r, k, s);
    k->log = open_memstream(&k->log_buf, &k->log_len);
    if (!k->log)
        return mt_fail(err, MT_E_NOMEM, "kernel selection");
    for (int i = 0; i < K_COUNT; i++)
        if (s[i].key[0])
            MT_CHECK(place(dev, &s[i], err));
    /* One set per database that gives kernels (in database order), then
     * the set without a database. */
    for (int set = 0; set <= dev->n_dbs; set++) {
        model_kset *ks = NULL;
        for (int i = 0; i < K_COUNT; i++) {
            if (!s[i].key[0] || s[i].set != set)
                continue;
            if (!ks) {
                MT_CHECK(model_kset_create(dev->dev, set < dev->n_dbs ? dev->dbs[set] : NULL,
                                           k->log, &ks, err));
                k->sets[k->n_sets++] = ks;
            }
            MT_CHECK(model_kset_add_text(ks, s[i].family, s[i].key, s[i].use, max_m, s[i].slot,
                                         err));
        }
        if (ks)
            MT_CHECK(model_kset_select(ks, err));
    }
    return build_report(dev, k, s, err);
}

mt_status api_kernels_get(moetune_device *dev, const moe_dims *d, moetune_routing r,
                          int64_t max_m, api_kernels **out, mt_err *err)
{
    *out = NULL;
    char key[512];
    snprintf(key, sizeof key, "H=%lld I=%lld E=%lld topk=%d groups=%d/%d scale=%.9g norm=%d "
             "a4=%d a8=%d shared=%lld comb=%d bm=%d wl=%d routing=%d max_m=%lld",
             (long long)d->hidden, (long long)d->inter, (long long)d->n_experts, d->topk,
             d->ngroup, d->topkg, (double)d->scale, d->norm, d->a4, d->a8,
             (long long)d->shared_inter, d->comb, moe_dims_bm(d), d->wl, (int)r,
             (long long)max_m);
    for (api_kernels *k = dev->kernels; k; k = k->next)
        if (!strcmp(k->key, key)) {
            k->refs++;
            *out = k;
            return MT_OK;
        }
    api_kernels *k = calloc(1, sizeof *k);
    if (!k)
        return mt_fail(err, MT_E_NOMEM, "kernel set");
    snprintf(k->key, sizeof k->key, "%s", key);
    mt_status st = build(dev, k, d, r, max_m, err);
    if (st != MT_OK) {
        free_bundle(k);
        return st;
    }
    k->refs = 1;
    k->next = dev->kernels;
    dev->kernels = k;
    *out = k;
    return MT_OK;
}

void api_kernels_release(moetune_device *dev, api_kernels *k)
{
    if (!k || --k->refs > 0)
        return;
    for (api_kernels **p = &dev->kernels; *p; p = &(*p)->next)
        if (*p == k) {
            *p = k->next;
            break;
        }
    free_bundle(k);
}
