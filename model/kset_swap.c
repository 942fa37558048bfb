/* kset_swap.c: live swaps in a serving kernel set: per-call timing, the
 * queue of compiled configs other threads post, their application between
 * steps, and the judgement that undoes a swap that runs slower (see
 * kset_swap.h). */
#include "kset_swap.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct sample {
    int32_t m;
    uint32_t ns; /* capped at ~4.3 s */
} sample;

/* One (kernel, bucket): counters any thread reads, samples only the
 * serving thread touches. */
typedef struct kstat {
    _Atomic int64_t calls;
    _Atomic uint64_t ns;
    sample ring[MODEL_SWAP_SAMPLES];
    int head, n;
} kstat;

typedef struct pending {
    const kern_family *fam;
    char key[KERN_KEY_MAX];
    int b;
    kern_config cfg;
    dev_code *code;
} pending;

/* A swap applied and not judged yet: the group's kernels and what they ran
 * before, and the old config's samples. */
typedef struct watch {
    const kern_family *fam;
    char key[KERN_KEY_MAX];
    int b;
    char cfg_key[256];
    int n;                  /* kernels of the group */
    int *kern;
    model_choice *old;
    sample *before;
    int n_before;
    int64_t calls0;         /* the group's calls at the swap */
} watch;

struct model_kset_live {
    model_kset *ks;
    FILE *log;
    bool judge;             /* launches are synchronous: times are the kernels' */
    int n_kerns;
    kstat *st;              /* [n_kerns][MODEL_N_BUCKETS] */
    pthread_mutex_t mu;     /* the rest, and writes of choices after select */
    pending *q;
    int nq, capq;
    watch *w;
    int nw, capw;
    model_swap_revert *rv;
    int nrv, caprv;
    int64_t swaps, reverted;
};

static kstat *stat_of(model_kset_live *lv, int i, int b)
{
    return &lv->st[(size_t)i * MODEL_N_BUCKETS + (size_t)b];
}

static bool grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return true;
    int c = *cap ? *cap * 2 : 8;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

mt_status model_kset_live_enable(model_kset *ks, FILE *log, mt_err *err)
{
    if (model_kset_live_get(ks))
        return MT_OK;
    model_kset_live *lv = calloc(1, sizeof *lv);
    int n = model_kset_n_kernels(ks);
    if (lv)
        lv->st = calloc((size_t)(n > 0 ? n : 1) * MODEL_N_BUCKETS, sizeof *lv->st);
    if (!lv || !lv->st) {
        free(lv);
        return mt_fail(err, MT_E_NOMEM, "live swaps: kernel statistics");
    }
    lv->ks = ks;
    lv->log = log;
    lv->n_kerns = n;
    dev_backend be = dev_get_props(model_kset_device(ks))->backend;
    lv->judge = be == DEV_BACKEND_CPU || be == DEV_BACKEND_EMU;
    pthread_mutex_init(&lv->mu, NULL);
    model_kset_live_set(ks, lv);
    return MT_OK;
}

bool model_kset_live_on(const model_kset *ks) { return model_kset_live_get(ks) != NULL; }

static void watch_release(watch *w)
{
    free(w->kern);
    free(w->old);
    free(w->before);
}

void model_kset_live_free(model_kset_live *lv)
{
    if (!lv)
        return;
    for (int i = 0; i < lv->nq; i++)
        dev_code_free(lv->q[i].code);
    for (int i = 0; i < lv->nw; i++)
        watch_release(&lv->w[i]);
    free(lv->q);
    free(lv->w);
    free(lv->rv);
    free(lv->st);
    pthread_mutex_destroy(&lv->mu);
    free(lv);
}

/* The serving thread is the only writer: a relaxed load and store is an
 * increment others read whole. */
void model_kset_live_note(model_kset_live *lv, const model_kern *k, int b, int64_t m,
                          uint64_t ns)
{
    kstat *s = stat_of(lv, k->index, b);
    atomic_store_explicit(&s->calls, atomic_load_explicit(&s->calls, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_store_explicit(&s->ns, atomic_load_explicit(&s->ns, memory_order_relaxed) + ns,
                          memory_order_relaxed);
    s->ring[s->head] = (sample){(int32_t)(m < INT32_MAX ? m : INT32_MAX),
                                (uint32_t)(ns < UINT32_MAX ? ns : UINT32_MAX)};
    s->head = (s->head + 1) % MODEL_SWAP_SAMPLES;
    if (s->n < MODEL_SWAP_SAMPLES)
        s->n++;
}

void model_kset_usage(const model_kset *ks, int i, int b, model_kern_usage *out)
{
    model_kset_live *lv = model_kset_live_get(ks);
    memset(out, 0, sizeof *out);
    if (!lv || i < 0 || i >= lv->n_kerns || b < 0 || b >= MODEL_N_BUCKETS)
        return;
    kstat *s = stat_of(lv, i, b);
    out->calls = atomic_load_explicit(&s->calls, memory_order_relaxed);
    out->ms = (double)atomic_load_explicit(&s->ns, memory_order_relaxed) * 1e-6;
}

void model_kset_choice_get(const model_kset *ks, int i, int b, model_choice *out)
{
    model_kset_live *lv = model_kset_live_get(ks);
    const model_kern *k = model_kset_kernel(ks, i);
    if (lv)
        pthread_mutex_lock(&lv->mu);
    *out = k->ch[b < k->n ? b : k->n - 1];
    if (lv)
        pthread_mutex_unlock(&lv->mu);
}

void model_kset_live_totals(model_kset_live *lv, int64_t *swaps, int64_t *reverted)
{
    pthread_mutex_lock(&lv->mu);
    *swaps = lv->swaps;
    *reverted = lv->reverted;
    pthread_mutex_unlock(&lv->mu);
}

static int bucket_index(int64_t m)
{
    for (int b = 0; b < MODEL_N_BUCKETS; b++)
        if (model_buckets[b] == m)
            return b;
    return -1;
}

static bool in_group(const model_kern *k, const kern_family *f, const char *key, int b)
{
    return k->fam == f && b < k->n && !strcmp(k->key, key);
}

mt_status model_kset_swap_post(model_kset *ks, const kern_family *f, const char *key, int64_t m,
                               const kern_config *cfg, mt_err *err)
{
    model_kset_live *lv = model_kset_live_get(ks);
    if (!lv)
        return mt_fail(err, MT_E_UNSUPPORTED, "live swap of %s %s: live swaps are off", f->name,
                       key);
    if (model_kset_batch_invariant(ks))
        return mt_fail(err, MT_E_UNSUPPORTED, "live swap of %s %s M=%" PRId64 ": refused on a "
                       "batch-invariant server (its output would change with the swap)",
                       f->name, key, m);
    int b = bucket_index(m);
    const model_kern *k0 = NULL;
    const dev_props *props = dev_get_props(model_kset_device(ks));
    for (int i = 0; b >= 0 && i < model_kset_n_kernels(ks); i++) {
        const model_kern *k = model_kset_kernel(ks, i);
        if (!in_group(k, f, key, b))
            continue;
        char why[160] = "";
        if (!kern_config_valid(k->fam, k->impl, &k->shape, m, cfg, props, why, sizeof why))
            return mt_fail(err, MT_E_INVALID, "live swap of %s %s M=%" PRId64 ": config not "
                           "valid for %s: %s", f->name, key, m, k->use, why);
        if (!k0)
            k0 = k;
    }
    if (!k0)
        return mt_fail(err, MT_E_NOT_FOUND, "live swap: no kernel %s %s with a bucket M=%" PRId64,
                       f->name, key, m);
    dev_code *code = NULL;
    mt_status st = kern_compile(model_kset_device(ks), f, k0->impl, &k0->shape, cfg, &code, err);
    if (st != MT_OK)
        return mt_err_prefix(err, "live swap of %s %s M=%" PRId64, f->name, key, m);
    pthread_mutex_lock(&lv->mu);
    int at = lv->nq;
    for (int i = 0; i < lv->nq; i++)
        if (lv->q[i].fam == f && lv->q[i].b == b && !strcmp(lv->q[i].key, key))
            at = i;
    if (at == lv->nq && !grow((void **)&lv->q, &lv->capq, lv->nq + 1, sizeof *lv->q)) {
        pthread_mutex_unlock(&lv->mu);
        dev_code_free(code);
        return mt_fail(err, MT_E_NOMEM, "live swap queue");
    }
    if (at < lv->nq)
        dev_code_free(lv->q[at].code);
    else
        lv->nq++;
    pending *p = &lv->q[at];
    p->fam = f;
    snprintf(p->key, sizeof p->key, "%s", key);
    p->b = b;
    p->cfg = *cfg;
    p->code = code;
    pthread_mutex_unlock(&lv->mu);
    return MT_OK;
}

/* ---- the judgement -------------------------------------------------------- */

static int cmp_sample(const void *pa, const void *pb)
{
    const sample *a = pa, *b = pb;
    if (a->m != b->m)
        return a->m < b->m ? -1 : 1;
    return (a->ns > b->ns) - (a->ns < b->ns);
}

static double median_ns(const sample *v, int n) /* v sorted by ns */
{
    return n % 2 ? v[n / 2].ns : 0.5 * ((double)v[n / 2 - 1].ns + v[n / 2].ns);
}

/* new / old as kset_swap.h describes; *weight the sum of the weights,
 * *new_ms the new config's median at the M with the most new samples. */
static double judge(sample *old, int n_old, sample *nw, int n_new, int *weight, double *new_ms)
{
    qsort(old, (size_t)n_old, sizeof *old, cmp_sample);
    qsort(nw, (size_t)n_new, sizeof *nw, cmp_sample);
    double log_sum = 0;
    int w_sum = 0, best_n = 0;
    *new_ms = NAN;
    for (int i = 0, j = 0; j < n_new;) {
        int j2 = j;
        while (j2 < n_new && nw[j2].m == nw[j].m)
            j2++;
        if (j2 - j > best_n) {
            best_n = j2 - j;
            *new_ms = median_ns(nw + j, j2 - j) * 1e-6;
        }
        while (i < n_old && old[i].m < nw[j].m)
            i++;
        int i2 = i;
        while (i2 < n_old && old[i2].m == nw[j].m)
            i2++;
        int na = i2 - i, nb = j2 - j;
        if (na >= 3 && nb >= 3) {
            double mo = median_ns(old + i, na), mn = median_ns(nw + j, nb);
            int w = na < nb ? na : nb;
            if (mo > 0 && mn > 0) {
                log_sum += w * log(mn / mo);
                w_sum += w;
            }
        }
        i = i2;
        j = j2;
    }
    *weight = w_sum;
    return w_sum ? exp(log_sum / w_sum) : NAN;
}

/* Copies the samples of the watched group's kernels (n_out written). */
static sample *group_samples(model_kset_live *lv, const watch *w, int *n_out)
{
    sample *v = malloc(sizeof *v * (size_t)(w->n * MODEL_SWAP_SAMPLES));
    int n = 0;
    for (int i = 0; v && i < w->n; i++) {
        kstat *s = stat_of(lv, w->kern[i], w->b);
        memcpy(v + n, s->ring, sizeof *v * (size_t)s->n);
        n += s->n;
    }
    *n_out = n;
    return v;
}

static int64_t group_calls(model_kset_live *lv, const watch *w)
{
    int64_t c = 0;
    for (int i = 0; i < w->n; i++)
        c += atomic_load_explicit(&stat_of(lv, w->kern[i], w->b)->calls, memory_order_relaxed);
    return c;
}

/* Under lv->mu. Returns 1 when it undid the swap, 0 when it keeps it, -1
 * while it waits for samples. */
static int judge_watch(model_kset_live *lv, watch *w)
{
    int64_t since = group_calls(lv, w) - w->calls0;
    if (since < MODEL_SWAP_SAMPLES)
        return -1;
    int n_new = 0;
    sample *nw = group_samples(lv, w, &n_new);
    if (!nw)
        return -1;
    int weight = 0;
    double new_ms = NAN;
    double ratio = judge(w->before, w->n_before, nw, n_new, &weight, &new_ms);
    free(nw);
    if (weight < 16)
        return since > 16 * MODEL_SWAP_SAMPLES ? 0 : -1; /* too few calls at common M */
    if (!(ratio > 1 + MODEL_SWAP_MARGIN)) {
        if (lv->log)
            fprintf(lv->log, "live swap kept: %s %s M=%" PRId64 ": %s runs %.3fx the old "
                    "config's time while serving\n", w->fam->name, w->key, model_buckets[w->b],
                    w->cfg_key, ratio);
        return 0;
    }
    for (int i = 0; i < w->n; i++) {
        model_kern *k = model_kset_kernel(lv->ks, w->kern[i]);
        k->ch[w->b] = w->old[i]; /* its executor is still loaded */
        stat_of(lv, w->kern[i], w->b)->n = 0;
    }
    lv->reverted++;
    if (grow((void **)&lv->rv, &lv->caprv, lv->nrv + 1, sizeof *lv->rv)) {
        model_swap_revert *r = &lv->rv[lv->nrv++];
        r->fam = w->fam;
        snprintf(r->key, sizeof r->key, "%s", w->key);
        r->m = model_buckets[w->b];
        snprintf(r->cfg_key, sizeof r->cfg_key, "%s", w->cfg_key);
        r->ratio = ratio;
        r->new_ms = new_ms;
    }
    if (lv->log)
        fprintf(lv->log, "live swap undone: %s %s M=%" PRId64 ": %s ran %.3fx the old config's "
                "time while serving (over %d calls at common M); the old config is back\n",
                w->fam->name, w->key, model_buckets[w->b], w->cfg_key, ratio, weight);
    return 1;
}

/* ---- applying --------------------------------------------------------------- */

static void drop_watch(model_kset_live *lv, int i)
{
    watch_release(&lv->w[i]);
    lv->w[i] = lv->w[--lv->nw];
}

/* Puts p into every kernel of its group; a watch when there is history to
 * judge against. Under lv->mu. Returns the selections changed. */
static int apply_one(model_kset_live *lv, pending *p)
{
    model_kset *ks = lv->ks;
    int nk = model_kset_n_kernels(ks);
    watch w = {.fam = p->fam, .b = p->b};
    snprintf(w.key, sizeof w.key, "%s", p->key);
    w.kern = malloc(sizeof *w.kern * (size_t)nk);
    w.old = malloc(sizeof *w.old * (size_t)nk);
    w.before = malloc(sizeof *w.before * (size_t)nk * MODEL_SWAP_SAMPLES);
    dev_code *code = p->code;
    p->code = NULL;
    int changed = 0;
    mt_err err = MT_ERR_INIT;
    for (int i = 0; i < nk; i++) {
        model_kern *k = model_kset_kernel(ks, i);
        if (!in_group(k, p->fam, p->key, p->b))
            continue;
        kern_config_key(k->impl, &p->cfg, w.cfg_key, sizeof w.cfg_key);
        model_choice old;
        kstat *s = stat_of(lv, i, p->b);
        if (model_kset_replace(ks, k, p->b, &p->cfg, code, &old, &err) != MT_OK) {
            if (lv->log)
                fprintf(lv->log, "live swap dropped: %s\n", err.msg);
            code = NULL;
            break;
        }
        code = NULL; /* the first kernel's executor serves the group */
        changed++;
        if (w.kern && w.old && w.before) {
            w.kern[w.n] = i;
            w.old[w.n] = old;
            /* the ring holds the last samples in order from head - n */
            for (int j = 0; j < s->n; j++)
                w.before[w.n_before++] =
                    s->ring[(s->head - s->n + j + MODEL_SWAP_SAMPLES) % MODEL_SWAP_SAMPLES];
            w.n++;
        }
        s->n = 0;
        s->head = 0;
    }
    dev_code_free(code);
    if (!changed) {
        watch_release(&w);
        return 0;
    }
    lv->swaps++;
    if (lv->log)
        fprintf(lv->log, "live swap: %s %s M=%" PRId64 ": %s in, for %d kernel%s\n",
                p->fam->name, p->key, model_buckets[p->b], w.cfg_key, changed,
                changed == 1 ? "" : "s");
    for (int i = 0; i < lv->nw; i++) /* a second swap of a bucket: judged against this */
        if (lv->w[i].fam == w.fam && lv->w[i].b == w.b && !strcmp(lv->w[i].key, w.key))
            drop_watch(lv, i--);
    if (lv->judge && w.kern && w.old && w.before && w.n_before >= 8 &&
        grow((void **)&lv->w, &lv->capw, lv->nw + 1, sizeof *lv->w)) {
        w.calls0 = group_calls(lv, &w);
        lv->w[lv->nw++] = w;
    } else {
        watch_release(&w);
    }
    return changed;
}

int model_kset_swap_apply(model_kset *ks)
{
    model_kset_live *lv = model_kset_live_get(ks);
    if (!lv)
        return 0;
    pthread_mutex_lock(&lv->mu);
    int changed = 0;
    for (int i = 0; i < lv->nq; i++) {
        changed += apply_one(lv, &lv->q[i]);
        dev_code_free(lv->q[i].code);
    }
    lv->nq = 0;
    for (int i = 0; i < lv->nw; i++) {
        int r = judge_watch(lv, &lv->w[i]);
        if (r >= 0) {
            changed += r ? lv->w[i].n : 0;
            drop_watch(lv, i--);
        }
    }
    pthread_mutex_unlock(&lv->mu);
    return changed;
}

int model_kset_swap_reverted(model_kset *ks, model_swap_revert *out, int cap)
{
    model_kset_live *lv = model_kset_live_get(ks);
    if (!lv)
        return 0;
    pthread_mutex_lock(&lv->mu);
    int n = lv->nrv < cap ? lv->nrv : cap;
    if (n <= 0) {
        pthread_mutex_unlock(&lv->mu);
        return 0;
    }
    memcpy(out, lv->rv, sizeof *out * (size_t)n);
    memmove(lv->rv, lv->rv + n, sizeof *out * (size_t)(lv->nrv - n));
    lv->nrv -= n;
    pthread_mutex_unlock(&lv->mu);
    return n;
}
