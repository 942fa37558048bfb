/* runner.c: a family's problem on a device: run through an executor,
 * verify, time (see runner.h). */
#include "runner.h"

#include "common/cache_evict.h"
#include "common/clock.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kern_problem {
    dev_device *dev;
    const kern_family *fam;
    const kern_impl *impl;
    kern_shape shape;
    int64_t m;
    int n;
    kern_buf_desc bufs[KERN_MAX_BUFS];
    void *host[KERN_MAX_BUFS];   /* inputs, and reference outputs */
    void *got[KERN_MAX_BUFS];    /* downloaded outputs */
    void *init[KERN_MAX_BUFS];   /* initial contents of INOUT buffers */
    void *dev_ptr[KERN_MAX_BUFS];
    void *flush;                 /* > LLC buffer touched between timed runs */
    size_t flush_bytes;
    bool has_reference;
};

const kern_family *kern_problem_family(const kern_problem *p) { return p->fam; }
const kern_shape *kern_problem_shape(const kern_problem *p) { return &p->shape; }
int64_t kern_problem_m(const kern_problem *p) { return p->m; }
int kern_problem_n_bufs(const kern_problem *p) { return p->n; }
const kern_buf_desc *kern_problem_buf(const kern_problem *p, int i) { return &p->bufs[i]; }
void *const *kern_problem_host(const kern_problem *p) { return p->host; }
void *const *kern_problem_dev(const kern_problem *p) { return p->dev_ptr; }

void kern_problem_destroy(kern_problem *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n; i++) {
        free(p->host[i]);
        free(p->got[i]);
        free(p->init[i]);
        dev_free(p->dev, p->dev_ptr[i]);
    }
    dev_free(p->dev, p->flush);
    free(p);
}

mt_status kern_problem_create(dev_device *d, const kern_family *f, const kern_shape *s,
                              int64_t m, uint64_t seed, kern_problem **out, mt_err *err)
{
    return kern_problem_create_ex(d, f, s, m, seed, 0, out, err);
}

int64_t kern_verify_m(const kern_family *f, const kern_shape *s, int64_t m,
                      double max_flops)
{
    double flops = 0, bytes = 0;
    f->cost(s, m, &flops, &bytes);
    if (flops <= max_flops || m <= 1)
        return m;
    /* Cost grows with M (at most linearly for every family here): scale
     * down, then step until it fits. */
    int64_t v = (int64_t)((double)m * max_flops / flops);
    if (v < 1)
        v = 1;
    while (v > 1) {
        f->cost(s, v, &flops, &bytes);
        if (flops <= max_flops)
            break;
        v--;
    }
    return v;
}

mt_status kern_problem_create_ex(dev_device *d, const kern_family *f,
                                 const kern_shape *s, int64_t m, uint64_t seed,
                                 unsigned flags, kern_problem **out, mt_err *err)
{
    *out = NULL;
    const dev_props *props = dev_get_props(d);
    const kern_impl *im = kern_family_impl(f, props->backend);
    if (!im)
        return mt_fail(err, MT_E_UNSUPPORTED, "family %s has no %s implementation",
                       f->name, dev_backend_runs_hip_source(props->backend) ? "GPU" : "CPU");
    if (f->shape_ok) {
        char why[256] = "";
        if (!f->shape_ok(s, m, why, sizeof why))
            return mt_fail(err, MT_E_INVALID, "family %s: shape rejected: %s", f->name, why);
    }
    kern_problem *p = calloc(1, sizeof *p);
    if (!p)
        return mt_fail(err, MT_E_NOMEM, "problem");
    p->dev = d;
    p->fam = f;
    p->impl = im;
    p->shape = *s;
    p->m = m;
    p->n = f->buffers(s, m, p->bufs, KERN_MAX_BUFS);
    mt_status st = MT_OK;
    if (p->n <= 0 || p->n > KERN_MAX_BUFS) {
        st = mt_fail(err, MT_E_INVALID, "family %s: bad buffer count %d", f->name, p->n);
        goto fail;
    }
    for (int i = 0; i < p->n; i++) {
        size_t b = p->bufs[i].bytes ? p->bufs[i].bytes : 1;
        p->host[i] = calloc(1, b);
        p->got[i] = calloc(1, b);
        if (!p->host[i] || !p->got[i]) {
            st = mt_fail(err, MT_E_NOMEM, "family %s: buffer %s of %zu bytes", f->name,
                         p->bufs[i].name, b);
            goto fail;
        }
    }
    f->fill(s, m, seed, p->host);
    /* Inputs go up before the reference runs: the reference writes the
     * expected outputs over OUT and INOUT buffers in host memory. */
    for (int i = 0; i < p->n; i++) {
        st = dev_alloc(d, p->bufs[i].bytes, &p->dev_ptr[i], err);
        if (st != MT_OK)
            goto fail;
        if (p->bufs[i].role != KERN_BUF_OUT) {
            st = dev_copy_to(d, p->dev_ptr[i], p->host[i], p->bufs[i].bytes, err);
            if (st != MT_OK)
                goto fail;
        }
        if (p->bufs[i].role == KERN_BUF_INOUT) {
            p->init[i] = malloc(p->bufs[i].bytes ? p->bufs[i].bytes : 1);
            if (!p->init[i]) {
                st = mt_fail(err, MT_E_NOMEM, "buffer %s", p->bufs[i].name);
                goto fail;
            }
            memcpy(p->init[i], p->host[i], p->bufs[i].bytes);
        }
    }
    if (!(flags & KERN_PROBLEM_NO_REFERENCE)) {
        f->reference(s, m, p->host);
        p->has_reference = true;
    }
    *out = p;
    return MT_OK;
fail:
    kern_problem_destroy(p);
    return st;
}

/* Poisons OUT buffers with 0xFF bytes: NaN for every float type, -1 for
 * integers, so an element the kernel never writes cannot pass. */
static mt_status prepare_outputs(kern_problem *p, mt_err *err)
{
    for (int i = 0; i < p->n; i++) {
        mt_status st = MT_OK;
        if (p->bufs[i].role == KERN_BUF_OUT)
            st = dev_memset(p->dev, p->dev_ptr[i], 0xff, p->bufs[i].bytes, err);
        if (st != MT_OK)
            return st;
    }
    return MT_OK;
}

static mt_status restore_inouts(kern_problem *p, const void *const *initial, mt_err *err)
{
    for (int i = 0; i < p->n; i++)
        if (p->bufs[i].role == KERN_BUF_INOUT) {
            mt_status st = dev_copy_to(p->dev, p->dev_ptr[i], initial[i],
                                       p->bufs[i].bytes, err);
            if (st != MT_OK)
                return st;
        }
    return MT_OK;
}

static mt_status run_once(kern_problem *p, kern_exec *e, mt_err *err)
{
    return kern_exec_run(e, &p->shape, p->m, p->dev_ptr, err);
}

mt_status kern_problem_run(kern_problem *p, kern_exec *e, mt_err *err)
{
    mt_status st = prepare_outputs(p, err);
    if (st == MT_OK)
        st = restore_inouts(p, (const void *const *)p->init, err);
    if (st == MT_OK)
        st = run_once(p, e, err);
    if (st == MT_OK)
        st = dev_synchronize(p->dev, err);
    return st;
}

mt_status kern_problem_download(kern_problem *p, int b, void *dst, mt_err *err)
{
    if (b < 0 || b >= p->n)
        return mt_fail(err, MT_E_INVALID, "buffer index %d of %d", b, p->n);
    return dev_copy_from(p->dev, dst, p->dev_ptr[b], p->bufs[b].bytes, err);
}

mt_status kern_problem_verify(kern_problem *p, mt_err *err)
{
    if (!p->has_reference)
        return mt_fail(err, MT_E_INVALID, "%s: problem at M=%lld was made without a "
                       "reference and cannot verify", p->fam->name, (long long)p->m);
    for (int i = 0; i < p->n; i++) {
        if (p->bufs[i].role == KERN_BUF_IN)
            continue;
        mt_status st = kern_problem_download(p, i, p->got[i], err);
        if (st != MT_OK)
            return st;
        char why[512] = "";
        bool ok = p->fam->compare
                      ? p->fam->compare(&p->shape, p->m, i, p->got[i], p->host, why,
                                        sizeof why)
                      : kern_compare_default(&p->bufs[i], p->got[i], p->host[i], why,
                                             sizeof why);
        if (!ok)
            return mt_fail(err, MT_E_WRONG_RESULT, "%s: %s", p->fam->name, why);
    }
    return MT_OK;
}

void kern_time_opts_default(kern_time_opts *o)
{
    memset(o, 0, sizeof *o);
    o->warmup = 2;
    o->min_reps = 5;
    o->max_reps = 200;
    o->max_ms = 2000;
    o->target_spread = 0.05;
    o->flush_cache = true;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *sorted, int n, double q)
{
    double pos = q * (n - 1);
    int lo = (int)pos;
    int hi = lo + 1 < n ? lo + 1 : lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

/* Starts the next timed run cold, as in a real model step (where other
 * layers' weights passed through the cache in between). On cpu and emu,
 * whose buffers are host memory, the problem's own cache lines are evicted
 * (clflushopt): exact, and its cost follows the problem's bytes. Elsewhere a
 * buffer larger than the last-level cache is written, which costs 2 x LLC
 * (capped at 512 MiB) per run. */
static mt_status flush_cache(kern_problem *p, mt_err *err)
{
    const dev_props *pr = dev_get_props(p->dev);
    if ((pr->backend == DEV_BACKEND_CPU || pr->backend == DEV_BACKEND_EMU) &&
        mt_cache_evict_supported()) {
        for (int i = 0; i < p->n; i++)
            mt_cache_evict(p->dev_ptr[i], p->bufs[i].bytes);
        return MT_OK;
    }
    size_t want = pr->llc_bytes ? pr->llc_bytes * 2 : (size_t)64 << 20;
    if (want > ((size_t)512 << 20))
        want = (size_t)512 << 20;
    if (!p->flush) {
        mt_status st = dev_alloc(p->dev, want, &p->flush, err);
        if (st != MT_OK)
            return st;
        p->flush_bytes = want;
    }
    return dev_memset(p->dev, p->flush, 0x5a, p->flush_bytes, err);
}

mt_status kern_problem_time(kern_problem *p, kern_exec *e, const kern_time_opts *o,
                            kern_timing *t, mt_err *err)
{
    kern_time_opts dflt;
    if (!o) {
        kern_time_opts_default(&dflt);
        o = &dflt;
    }
    memset(t, 0, sizeof *t);
    /* The first warm-up run also grows the executor's scratch, so no timed
     * run allocates. */
    mt_status st = MT_OK;
    for (int i = 0; i < (o->warmup > 0 ? o->warmup : 1) && st == MT_OK; i++)
        st = run_once(p, e, err);
    if (st == MT_OK)
        st = dev_synchronize(p->dev, err);
    if (st != MT_OK)
        return st;
    int cap = o->max_reps > 0 ? o->max_reps : 200;
    const int batch = o->batch > 1 ? o->batch : 1;
    double *ms = malloc(sizeof(double) * (size_t)cap);
    double *sorted = malloc(sizeof(double) * (size_t)cap);
    dev_event *a = NULL, *b = NULL;
    if (!ms || !sorted) {
        free(ms);
        free(sorted);
        return mt_fail(err, MT_E_NOMEM, "timing");
    }
    st = dev_event_create(p->dev, &a, err);
    if (st == MT_OK)
        st = dev_event_create(p->dev, &b, err);
    uint64_t wall0 = mt_now_ns();
    int n = 0;
    while (st == MT_OK && n < cap) {
        /* In-out buffers accumulate (y += ...); restore them so a long
         * timing loop cannot overflow into inf/NaN slow paths. */
        st = restore_inouts(p, (const void *const *)p->init, err);
        if (st == MT_OK && o->flush_cache)
            st = flush_cache(p, err);
        if (st == MT_OK)
            st = dev_synchronize(p->dev, err);
        if (st == MT_OK)
            st = dev_event_record(p->dev, a, err);
        for (int k = 0; k < batch && st == MT_OK; k++)
            st = run_once(p, e, err);
        if (st == MT_OK)
            st = dev_event_record(p->dev, b, err);
        if (st == MT_OK)
            st = dev_synchronize(p->dev, err);
        if (st == MT_OK)
            st = dev_event_elapsed_ms(p->dev, a, b, &ms[n], err);
        if (st != MT_OK)
            break;
        ms[n] /= batch;
        n++;
        memcpy(sorted, ms, sizeof(double) * (size_t)n);
        qsort(sorted, (size_t)n, sizeof(double), cmp_double);
        double med = pct(sorted, n, 0.5);
        if (o->abandon_ms > 0 && n >= 3 && med > o->abandon_ms) {
            t->abandoned = true;
            break;
        }
        if (n >= o->min_reps) {
            double spread = (pct(sorted, n, 0.9) - pct(sorted, n, 0.1)) / med;
            double wall = (double)(mt_now_ns() - wall0) * 1e-6;
            if (spread < o->target_spread || wall > o->max_ms)
                break;
        }
    }
    if (st == MT_OK && n > 0) {
        qsort(ms, (size_t)n, sizeof(double), cmp_double);
        t->min_ms = ms[0];
        t->median_ms = pct(ms, n, 0.5);
        t->p10_ms = pct(ms, n, 0.1);
        t->p90_ms = pct(ms, n, 0.9);
        t->reps = n;
    }
    dev_event_destroy(p->dev, a);
    dev_event_destroy(p->dev, b);
    free(ms);
    free(sorted);
    return st;
}

mt_status kern_check_one(dev_device *d, const kern_family *f, const char *shape_text,
                         int64_t m, const kern_config *cfg, uint64_t seed, mt_err *err)
{
    kern_shape s;
    int64_t km = 0;
    mt_status st = kern_shape_parse(f, shape_text, &s, &km, err);
    if (st != MT_OK)
        return st;
    if (m <= 0)
        m = km > 0 ? km : 1;
    kern_exec *e = NULL;
    kern_problem *p = NULL;
    st = kern_exec_open(d, f, &s, m, cfg, &e, err);
    if (st == MT_OK)
        st = kern_problem_create(d, f, &s, m, seed, &p, err);
    if (st == MT_OK)
        st = kern_problem_run(p, e, err);
    if (st == MT_OK)
        st = kern_problem_verify(p, err);
    kern_problem_destroy(p);
    kern_exec_close(e);
    return st;
}

mt_status kern_device_bandwidth(dev_device *d, size_t bytes, double *gbps, mt_err *err)
{
    *gbps = 0;
    void *a = NULL, *b = NULL;
    dev_event *e0 = NULL, *e1 = NULL;
    double ms[5];
    mt_status st = dev_alloc(d, bytes, &a, err);
    if (st == MT_OK)
        st = dev_alloc(d, bytes, &b, err);
    if (st == MT_OK)
        st = dev_memset(d, a, 1, bytes, err);
    if (st == MT_OK)
        st = dev_event_create(d, &e0, err);
    if (st == MT_OK)
        st = dev_event_create(d, &e1, err);
    if (st == MT_OK) /* warm-up */
        st = dev_copy_dev(d, b, a, bytes, err);
    for (int i = 0; i < 5 && st == MT_OK; i++) {
        st = dev_event_record(d, e0, err);
        if (st == MT_OK)
            st = dev_copy_dev(d, b, a, bytes, err);
        if (st == MT_OK)
            st = dev_event_record(d, e1, err);
        if (st == MT_OK)
            st = dev_synchronize(d, err);
        if (st == MT_OK)
            st = dev_event_elapsed_ms(d, e0, e1, &ms[i], err);
    }
    if (st == MT_OK) {
        qsort(ms, 5, sizeof ms[0], cmp_double);
        *gbps = ms[2] > 0 ? 2.0 * (double)bytes / (ms[2] * 1e6) : 0;
    }
    dev_event_destroy(d, e0);
    dev_event_destroy(d, e1);
    dev_free(d, a);
    dev_free(d, b);
    return st;
}
