/* tune_run.c: the tuning pipeline (see tuner.h). Per job and M: ask the
 * search for candidates, skip those already in the database, compile the
 * rest on the pool while the worker verifies and times them one at a time,
 * record every outcome as a trial at once, then recompute the winner and
 * check it for determinism.
 *
 * On a host device (cpu, emu) the compilers would steal the cores being
 * timed, so compiling and measuring alternate by windows there; on a GPU
 * the pool compiles ahead while the worker measures. */
#define _GNU_SOURCE /* asprintf */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/rng.h"
#include "kernels/core/kern_db.h"
#include "tune_db.h"
#include "tune_impl.h"

typedef struct run_ctx run_ctx;

/* One candidate of the current M. */
typedef struct cand {
    const run_ctx *r;
    kern_config cfg;
    char key[256];
    bool is_default;
    bool resumed;
    bool submitted;
    bool compiled;       /* set by the pool after compile_task ran */
    mt_status cst;
    char *cerr;
    dev_code *code;
    double compile_ms;
    char *resources;     /* JSON, or NULL */
} cand;

struct run_ctx {
    const tune_opts *o;
    double timeout_s;
    int jobs;
    dev_device *dev;
    dev_props props;
    bool compile_only;
    db_t *db;
    int64_t device_id, session_id;
    bool own_session; /* begun here: ended here */
    tune_spawner *sp;
    tune_worker *worker;
    tune_pool *pool;
    tune_report *rep;
    tune_progress prog;
    uint64_t data_seed;
    double deadline_run_ms;   /* 0: no time budget */
    int pairs_left;
    /* the current job and M */
    const tune_job *job;
    const kern_impl *im;
    int64_t kernel_id;
    char source_hash[65];
    char shape_key[KERN_KEY_MAX];
    int64_t m;
    bool prepared;            /* the worker holds the problem of (job, m) */
    bool gated;               /* a measurement the gate let through is in flight */
    int gate_pid;             /* the worker then (0: none) and its CPU time (ms) */
    double gate_cpu_ms;
    double deadline_m_ms;     /* 0: none */
    int64_t budget_left;      /* trials for this M; -1: unlimited */
    double best_ms;
    char best_key[256];
    double default_ms;
    int confirm_top;          /* challengers at most (tune_opts.confirm_top) */
    int n_top;                /* the best ok configs other than the default, */
    struct top_entry {        /* lowest median first */
        char key[256];
        double ms;
    } top[TUNE_CONFIRM_MAX_TOP];
    tune_m_report *mr;
    int new_ok;
};

/* ---- compile ------------------------------------------------------------- */

static char *resources_json(const dev_code_info *info)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddNumberToObject(o, "compile_ms", info->compile_ms);
    cJSON_AddBoolToObject(o, "cache_hit", info->cache_hit);
    cJSON *ks = cJSON_AddArrayToObject(o, "kernels");
    for (int i = 0; ks && i < info->n_kernels; i++) {
        const dev_kernel_res *k = &info->kernels[i];
        cJSON *e = cJSON_CreateObject();
        if (!e)
            break;
        cJSON_AddStringToObject(e, "name", k->name);
        const struct {
            const char *n;
            int64_t v;
        } f[] = {{"vgprs", k->vgprs},           {"sgprs", k->sgprs},
                 {"agprs", k->agprs},           {"spill_vgprs", k->spill_vgprs},
                 {"spill_sgprs", k->spill_sgprs}, {"lds_bytes", k->lds_bytes},
                 {"private_bytes", k->private_bytes}, {"max_threads", k->max_threads},
                 {"waves_per_simd", k->waves_per_simd}};
        for (size_t j = 0; j < sizeof f / sizeof f[0]; j++)
            if (f[j].v >= 0)
                cJSON_AddNumberToObject(e, f[j].n, (double)f[j].v);
        cJSON_AddItemToArray(ks, e);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void compile_task(void *arg)
{
    cand *c = arg;
    const run_ctx *r = c->r;
    mt_err err = MT_ERR_INIT;
    c->cst = kern_compile(r->dev, r->job->fam, r->im, &r->job->shape, &c->cfg, &c->code, &err);
    if (c->cst != MT_OK) {
        c->cerr = strdup(err.msg);
        return;
    }
    const dev_code_info *info = dev_code_get_info(c->code);
    c->compile_ms = info->compile_ms;
    c->resources = resources_json(info);
}

static void cand_release(cand *c)
{
    dev_code_free(c->code);
    c->code = NULL;
    free(c->cerr);
    c->cerr = NULL;
    free(c->resources);
    c->resources = NULL;
}

/* ---- recording ----------------------------------------------------------- */

/* An ok config other than the default: kept when it is among the
 * confirm_top lowest medians of this M so far. */
static void top_note(run_ctx *r, const char *key, double ms)
{
    int i = r->n_top;
    if (i == r->confirm_top && !(ms < r->top[i - 1].ms))
        return;
    if (i == r->confirm_top)
        i--; /* the slowest drops out */
    for (; i > 0 && ms < r->top[i - 1].ms; i--)
        r->top[i] = r->top[i - 1];
    snprintf(r->top[i].key, sizeof r->top[i].key, "%s", key);
    r->top[i].ms = ms;
    if (r->n_top < r->confirm_top)
        r->n_top++;
}

static mt_status record(run_ctx *r, cand *c, db_trial_status st, const kern_timing *t,
                        const char *error, mt_err *err)
{
    char json[DB_CONFIG_JSON_MAX + 1];
    kern_config_json(r->im, &c->cfg, json, sizeof json);
    db_trial tr = {
        .device_id = r->device_id, .kernel_id = r->kernel_id, .session_id = r->session_id,
        .shape_key = r->shape_key, .m = r->m, .config_key = c->key, .config_json = json,
        .status = st, .time_min_ms = NAN, .time_median_ms = NAN, .time_p10_ms = NAN,
        .time_p90_ms = NAN, .gflops = NAN, .gbps = NAN, .resources_json = c->resources,
        .error = error && *error ? error : NULL,
        .compile_ms = c->code || c->cerr ? c->compile_ms : NAN,
    };
    if (t && t->reps > 0) {
        double med = t->median_ms > 1e-9 ? t->median_ms : 1e-9;
        tr.time_min_ms = t->min_ms;
        tr.time_median_ms = med;
        tr.time_p10_ms = t->p10_ms;
        tr.time_p90_ms = t->p90_ms;
        tr.repetitions = t->reps;
        double flops = 0, bytes = 0;
        if (r->job->fam->cost) {
            r->job->fam->cost(&r->job->shape, r->m, &flops, &bytes);
            tr.gflops = flops / (med * 1e6);
            tr.gbps = bytes / (med * 1e6);
        }
    }
    mt_status dst = db_trial_insert(r->db, &tr, err);
    if (dst != MT_OK)
        return dst;
    r->mr->measured++;
    r->mr->counts[st]++;
    double med = t && t->reps > 0 ? tr.time_median_ms : NAN;
    tune_progress_trial(&r->prog, c->key, st, med, error);
    if (st == DB_TRIAL_OK) {
        r->new_ok++;
        if (c->is_default)
            r->default_ms = med;
        else
            top_note(r, c->key, med);
        if (!(r->best_ms > 0) || med < r->best_ms) {
            r->best_ms = med;
            snprintf(r->best_key, sizeof r->best_key, "%s", c->key);
            tune_progress_best(&r->prog, c->key, med);
        }
    }
    return MT_OK;
}

static db_trial_status outcome_status(const tune_measure *ms)
{
    switch (ms->status) {
    case MT_OK:
        return ms->timing.abandoned ? DB_TRIAL_SKIPPED : DB_TRIAL_OK;
    case MT_E_WRONG_RESULT:
        return DB_TRIAL_WRONG_RESULT;
    case MT_E_TIMEOUT:
        return DB_TRIAL_TIMEOUT;
    case MT_E_LAUNCH:
    case MT_E_INVALID:
    case MT_E_UNSUPPORTED:
        return DB_TRIAL_INVALID;
    case MT_E_COMPILE:
        return DB_TRIAL_COMPILE_ERROR;
    default: /* faults, deadlocks, device errors */
        return DB_TRIAL_CRASH;
    }
}

/* ---- the worker ---------------------------------------------------------- */

/* The worker has returned from what the gate let through (tune_opts.gate_done). */
static void gate_done(run_ctx *r)
{
    if (r->gated && r->o->gate_done) {
        /* the worker's CPU time since the gate; a worker started since:
         * all of its own (the dead one's last part is lost) */
        double cpu = tune_worker_cpu_ms(r->worker);
        if (cpu >= 0 && tune_worker_pid(r->worker) == r->gate_pid)
            cpu = r->gate_cpu_ms >= 0 ? cpu - r->gate_cpu_ms : -1;
        r->o->gate_done(r->o->gate_ctx, cpu);
    }
    r->gated = false;
}

/* Waits for the gate, then starts and prepares the worker as needed; on
 * MT_OK the caller measures and then calls gate_done. */
static mt_status ensure_worker(run_ctx *r, mt_err *err)
{
    if (r->o->gate && !r->o->gate(r->o->gate_ctx))
        return mt_fail(err, MT_E_INTERRUPTED, "interrupted while waiting to measure");
    r->gated = true; /* starting and preparing the worker is measuring's work too */
    r->gate_pid = tune_worker_pid(r->worker);
    r->gate_cpu_ms = tune_worker_cpu_ms(r->worker);
    if (!r->worker) {
        mt_status st = tune_worker_start(r->sp, r->o->device, r->o->arch, 120, r->o->stop,
                                         &r->worker, NULL, err);
        if (st != MT_OK) {
            gate_done(r);
            return st;
        }
        r->prepared = false;
    }
    if (!r->prepared) {
        uint64_t seed = r->data_seed ^ (uint64_t)r->m * 0x9e3779b97f4a7c15ull;
        mt_status st = tune_worker_prepare(r->worker, r->job->fam, &r->job->shape, r->m, seed,
                                           r->o->stop, err);
        if (st != MT_OK) {
            gate_done(r);
            tune_worker_stop(r->worker);
            r->worker = NULL;
            return st;
        }
        r->prepared = true;
    }
    return MT_OK;
}

/* The worker died or was killed; the next measurement starts a new one. */
static void worker_dead(run_ctx *r, bool counts_as_restart)
{
    tune_worker_stop(r->worker);
    r->worker = NULL;
    r->prepared = false;
    if (r->rep && counts_as_restart)
        r->rep->worker_restarts++;
}

/* Verifies and times one compiled candidate, records the outcome. */
static mt_status measure(run_ctx *r, tune_search *s, cand *c, mt_err *err)
{
    if (c->cst != MT_OK) {
        db_trial_status st = c->cst == MT_E_COMPILE || c->cst == MT_E_NOT_FOUND
                                 ? DB_TRIAL_COMPILE_ERROR
                                 : DB_TRIAL_INVALID;
        return record(r, c, st, NULL, c->cerr, err);
    }
    mt_status st = ensure_worker(r, err);
    if (st != MT_OK)
        return st;
    size_t len = 0;
    const void *bytes = dev_code_get_bytes(c->code, &len);
    kern_time_opts topts = r->o->timing;
    topts.abandon_ms = !c->is_default && r->best_ms > 0 ? 2 * r->best_ms : 0;
    tune_measure *ms = calloc(1, sizeof *ms);
    if (!ms) {
        gate_done(r);
        return mt_fail(err, MT_E_NOMEM, "measurement");
    }
    mt_err werr = MT_ERR_INIT;
    st = tune_worker_measure(r->worker, &c->cfg, bytes, len, TUNE_W_VERIFY | TUNE_W_TIME,
                             &topts, r->timeout_s, r->o->stop, ms, &werr);
    gate_done(r);
    db_trial_status ts;
    char *why = NULL;
    if (st == MT_E_INTERRUPTED) {
        worker_dead(r, false);
        free(ms);
        return mt_fail(err, st, "interrupted while measuring %s", c->key);
    } else if (st == MT_E_CRASH || st == MT_E_TIMEOUT) {
        ts = st == MT_E_CRASH ? DB_TRIAL_CRASH : DB_TRIAL_TIMEOUT;
        why = strdup(werr.msg);
        worker_dead(r, true);
        tune_progress_note(&r->prog, "tune: %s M=%lld %s: %s; new worker", c->key,
                           (long long)r->m, ts == DB_TRIAL_CRASH ? "crashed" : "timed out",
                           werr.msg);
    } else {
        ts = outcome_status(ms);
        int rc = 0;
        if (ms->status != MT_OK)
            rc = asprintf(&why, "%s: %s", ms->step, ms->msg);
        else if (ts == DB_TRIAL_SKIPPED)
            rc = asprintf(&why, "abandoned after %d runs: median %.4g ms > 2x best %.4g ms",
                          ms->timing.reps, ms->timing.median_ms, r->best_ms);
        if (rc < 0)
            why = NULL;
    }
    bool timed = ts == DB_TRIAL_OK || ts == DB_TRIAL_SKIPPED;
    st = record(r, c, ts, timed ? &ms->timing : NULL, why, err);
    if (st == MT_OK)
        tune_search_result(s, &c->cfg, ts == DB_TRIAL_OK, ms->timing.median_ms);
    free(why);
    free(ms);
    return st;
}

/* Compile-only: the compile's outcome and resources are the trial. */
static mt_status record_compiled(run_ctx *r, cand *c, mt_err *err)
{
    if (c->cst != MT_OK)
        return record(r, c, c->cst == MT_E_COMPILE ? DB_TRIAL_COMPILE_ERROR : DB_TRIAL_INVALID,
                      NULL, c->cerr, err);
    const dev_code_info *info = dev_code_get_info(c->code);
    for (int i = 0; i < info->n_kernels; i++)
        if (r->props.shared_mem_per_block &&
            info->kernels[i].lds_bytes > (int64_t)r->props.shared_mem_per_block) {
            char why[256];
            snprintf(why, sizeof why, "kernel %s uses %lld bytes of LDS (limit %zu)",
                     info->kernels[i].name, (long long)info->kernels[i].lds_bytes,
                     r->props.shared_mem_per_block);
            return record(r, c, DB_TRIAL_INVALID, NULL, why, err);
        }
    return record(r, c, DB_TRIAL_COMPILED, NULL, NULL, err);
}

/* ---- one batch ----------------------------------------------------------- */

static bool past(double deadline_ms) { return deadline_ms > 0 && mt_now_ms() >= deadline_ms; }

/* Resume: true when the database already has this config (another process
 * may have measured it since the search was built). A trial that was only
 * compiled counts for a compile-only run, not for one that times. */
static mt_status already(run_ctx *r, cand *c, mt_err *err)
{
    bool exists = false;
    db_trial_status st;
    mt_status s = db_trial_exists(r->db, r->device_id, r->kernel_id, r->shape_key, r->m, c->key,
                                  &exists, &st, err);
    if (s == MT_OK && exists && (st != DB_TRIAL_COMPILED || r->compile_only)) {
        c->resumed = true;
        r->mr->resumed++;
        r->prog.resumed++;
    }
    return s;
}

static mt_status submit(run_ctx *r, cand *c, mt_err *err)
{
    mt_status st = already(r, c, err);
    if (st != MT_OK || c->resumed)
        return st;
    c->submitted = true;
    return tune_pool_submit(r->pool, compile_task, c, &c->compiled, err);
}

static mt_status run_batch(run_ctx *r, tune_search *s, cand *cs, int n, bool *out_of_time,
                           mt_err *err)
{
    const bool host = !dev_backend_runs_hip_source(r->props.backend) && !r->compile_only;
    const int window = r->jobs * 4 > 8 ? r->jobs * 4 : 8;
    int sub = 0;
    mt_status st = MT_OK;
    for (int i = 0; i < n && st == MT_OK; i++) {
        if (tune_stopped(r->o->stop)) {
            st = mt_fail(err, MT_E_INTERRUPTED, "interrupted");
            break;
        }
        if (host && sub == i) {
            tune_progress_phase(&r->prog, "compiling");
            for (; sub < n && sub < i + window && st == MT_OK; sub++)
                st = submit(r, &cs[sub], err);
            if (st == MT_OK && !tune_pool_wait_idle(r->pool, r->o->stop))
                st = mt_fail(err, MT_E_INTERRUPTED, "interrupted");
            tune_progress_phase(&r->prog, "measuring");
        }
        for (; !host && sub < n && sub < i + window && st == MT_OK; sub++)
            st = submit(r, &cs[sub], err);
        if (st != MT_OK)
            break;
        cand *c = &cs[i];
        if (c->resumed)
            continue;
        if (!tune_pool_wait(r->pool, &c->compiled, r->o->stop)) {
            st = mt_fail(err, MT_E_INTERRUPTED, "interrupted");
            break;
        }
        /* A terminal's Ctrl-C also reaches the compilers: a compile that
         * failed because of it must not be recorded as a compile error. */
        if (tune_stopped(r->o->stop)) {
            st = mt_fail(err, MT_E_INTERRUPTED, "interrupted");
            break;
        }
        if (!c->is_default && (past(r->deadline_m_ms) || past(r->deadline_run_ms))) {
            *out_of_time = true;
            break;
        }
        st = r->compile_only ? record_compiled(r, c, err) : measure(r, s, c, err);
        if (st == MT_OK && r->budget_left > 0)
            r->budget_left--;
        cand_release(c);
    }
    tune_pool_cancel(r->pool);
    for (int i = 0; i < n; i++)
        cand_release(&cs[i]);
    return st;
}

/* ---- one M ----------------------------------------------------------------- */

typedef struct known_arg {
    run_ctx *r;
    tune_search *s;
    const char *default_key;
    int count;
    bool default_known;   /* the default has a trial (any status) */
} known_arg;

static void on_known(void *arg, const char *key, db_trial_status st, double median_ms)
{
    known_arg *k = arg;
    if (st == DB_TRIAL_COMPILED && !k->r->compile_only)
        return; /* compiled, never run: a timing run still measures it */
    bool ok = st == DB_TRIAL_OK && isfinite(median_ms);
    tune_search_known(k->s, key, ok, median_ms);
    k->count++;
    k->default_known |= !strcmp(key, k->default_key);
    if (!ok)
        return;
    if (!strcmp(key, k->default_key))
        k->r->default_ms = median_ms;
    else
        top_note(k->r, key, median_ms);
    if (!(k->r->best_ms > 0) || median_ms < k->r->best_ms) {
        k->r->best_ms = median_ms;
        snprintf(k->r->best_key, sizeof k->r->best_key, "%s", key);
    }
}

static tune_db_key db_key(const run_ctx *r)
{
    return (tune_db_key){r->device_id, r->props.fingerprint, r->job->fam->name,
                         r->job->fam->version, r->source_hash, r->shape_key, false};
}

/* Transfer: the winners of the two nearest tuned M of this shape, nearest
 * in log2(M) first, and the runner-ups of the nearest; with seeds_only the
 * winners of every tuned M (all of them compiled already). */
static void add_seeds(run_ctx *r, tune_search *s)
{
    enum { CAP = 128 };
    tune_winner *w = calloc(CAP, sizeof *w);
    if (!w)
        return;
    tune_db_key k = db_key(r);
    int n = tune_db_winners(r->db, &k, 0, w, CAP, NULL);
    int rounds = r->o->seeds_only ? n : 2;
    for (int round = 0; round < rounds && n > 0; round++) {
        int best = -1;
        double bd = INFINITY;
        for (int i = 0; i < n; i++) {
            double d = fabs(log2((double)w[i].m) - log2((double)r->m));
            if (w[i].m != r->m && d < bd) {
                bd = d;
                best = i;
            }
        }
        if (best < 0)
            break;
        kern_config c;
        if (kern_config_parse(r->im, w[best].config_key, &c, NULL) == MT_OK)
            tune_search_seed(s, &c);
        for (int j = 0; round == 0 && j < w[best].n_runner_ups; j++)
            if (kern_config_parse(r->im, w[best].runner_ups[j], &c, NULL) == MT_OK)
                tune_search_seed(s, &c);
        w[best].m = r->m; /* used */
    }
    if (r->o->strategy == TUNE_MODEL) {
        /* The model also starts from what won on other devices (another
         * machine of this backend, a shipped database): their winners at
         * the two nearest M, the exact M first. */
        k.other_devices = true;
        n = tune_db_winners(r->db, &k, 0, w, CAP, NULL);
        for (int round = 0; round < 2 && n > 0; round++) {
            int best = -1;
            double bd = INFINITY;
            for (int i = 0; i < n; i++) {
                double d = fabs(log2((double)w[i].m) - log2((double)r->m));
                if (w[i].m > 0 && d < bd) {
                    bd = d;
                    best = i;
                }
            }
            if (best < 0)
                break;
            kern_config c;
            if (kern_config_parse(r->im, w[best].config_key, &c, NULL) == MT_OK)
                tune_search_seed(s, &c);
            w[best].m = 0; /* used */
        }
    }
    free(w);
}

/* Runs the winner twice and compares the output bytes. */
static void check_determinism(run_ctx *r, const char *key, int *det)
{
    *det = -1;
    kern_config c;
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    if (kern_config_parse(r->im, key, &c, &err) != MT_OK ||
        kern_compile(r->dev, r->job->fam, r->im, &r->job->shape, &c, &code, &err) != MT_OK ||
        ensure_worker(r, &err) != MT_OK) {
        dev_code_free(code);
        tune_progress_note(&r->prog, "tune: determinism check of %s skipped: %s", key, err.msg);
        return;
    }
    size_t len = 0;
    const void *bytes = dev_code_get_bytes(code, &len);
    tune_measure *ms = calloc(1, sizeof *ms);
    mt_status st = ms ? tune_worker_measure(r->worker, &c, bytes, len, TUNE_W_DETERMINISM, NULL,
                                            r->timeout_s, r->o->stop, ms, &err)
                      : MT_E_NOMEM;
    gate_done(r);
    if (st == MT_OK && ms->status == MT_OK)
        *det = ms->deterministic;
    else if (st == MT_E_CRASH || st == MT_E_TIMEOUT || st == MT_E_INTERRUPTED)
        worker_dead(r, st != MT_E_INTERRUPTED);
    if (*det == 0)
        tune_progress_note(&r->prog, "tune: WARNING: winner %s of M=%lld is not deterministic "
                           "(two runs gave different output bytes)", key, (long long)r->m);
    free(ms);
    dev_code_free(code);
}

/* ---- deciding the winner ---------------------------------------------------- */

/* A sample of at least this long (a batch of launches) keeps launch
 * overhead and timer granularity from deciding a paired round; a round
 * times each config for at least TUNE_ROUND_MIN_MS of samples. */
#define TUNE_SAMPLE_MIN_MS 0.1
#define TUNE_ROUND_MIN_MS 2.0

double tune_median(const double *v, int n)
{
    double s[TUNE_CONFIRM_MAX_ROUNDS];
    memcpy(s, v, sizeof(double) * (size_t)n);
    for (int i = 1; i < n; i++) /* insertion sort: n is small */
        for (int j = i; j > 0 && s[j - 1] > s[j]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* The timing of one config in a paired round: a fixed number of samples
 * (the same work for both configs in every round), each a batch of
 * launches lasting at least TUNE_SAMPLE_MIN_MS. */
kern_time_opts tune_paired_opts(const kern_time_opts *base, double fast_ms)
{
    kern_time_opts t = *base;
    t.abandon_ms = 0;
    t.target_spread = 0;
    if (t.warmup < 1)
        t.warmup = 1;
    int batch = fast_ms > 0 ? (int)ceil(TUNE_SAMPLE_MIN_MS / fast_ms) : 1;
    t.batch = batch < 1 ? 1 : batch > 256 ? 256 : batch;
    int lo = t.min_reps > 3 ? t.min_reps : 3;
    int hi = t.max_reps > lo ? t.max_reps : lo;
    double sample_ms = fast_ms > 0 ? fast_ms * t.batch : TUNE_SAMPLE_MIN_MS;
    int reps = (int)ceil(TUNE_ROUND_MIN_MS / sample_ms);
    reps = reps < lo ? lo : reps > hi ? hi : reps;
    t.min_reps = t.max_reps = reps;
    return t;
}

/* Paired rounds of the configs keys[0..n-1] (the challengers, then the
 * default) into *pr. A failure of the timing (a config crashed, hung or
 * failed) is returned in *why with MT_OK; only an interruption or a dead
 * spawner is an error. */
static mt_status confirm(run_ctx *r, const char *const *keys, int n, int rounds,
                         tune_paired *pr, char *why, size_t why_cap, mt_err *err)
{
    why[0] = 0;
    kern_config cfgs[TUNE_PAIRED_MAX_CONFIGS];
    dev_code *code[TUNE_PAIRED_MAX_CONFIGS] = {0};
    const void *bytes[TUNE_PAIRED_MAX_CONFIGS];
    size_t lens[TUNE_PAIRED_MAX_CONFIGS];
    mt_err e = MT_ERR_INIT;
    mt_status st = MT_OK;
    for (int i = 0; i < n && !why[0]; i++) {
        if (kern_config_parse(r->im, keys[i], &cfgs[i], &e) != MT_OK ||
            kern_compile(r->dev, r->job->fam, r->im, &r->job->shape, &cfgs[i], &code[i], &e) !=
                MT_OK)
            snprintf(why, why_cap, "%.400s", e.msg);
        else
            bytes[i] = dev_code_get_bytes(code[i], &lens[i]);
    }
    if (!why[0])
        st = ensure_worker(r, err);
    if (!why[0] && st == MT_OK) {
        kern_time_opts t = tune_paired_opts(&r->o->timing, fmin(r->best_ms, r->default_ms));
        mt_status ws = tune_worker_paired(r->worker, n, cfgs, bytes, lens, rounds, &t,
                                          r->timeout_s * (2 + rounds) * n / 2, r->o->stop, pr,
                                          &e);
        gate_done(r);
        if (ws == MT_E_INTERRUPTED) {
            worker_dead(r, false);
            st = mt_fail(err, ws, "interrupted while confirming %s", keys[0]);
        } else if (ws != MT_OK) {
            worker_dead(r, true);
            snprintf(why, why_cap, "%.400s", e.msg);
        } else if (pr->status != MT_OK) {
            snprintf(why, why_cap, "%s%s: %s: %.400s", pr->failed >= 0 ? "of " : "",
                     pr->failed >= 0 ? keys[pr->failed] : "", pr->step, pr->msg);
        }
    }
    for (int i = 0; i < n; i++)
        dev_code_free(code[i]);
    return st;
}

/* The challengers of this M: the configs other than the default with the
 * lowest medians, the first always, the others when their median beat
 * the default's. Returns how many were written to keys. */
static int challengers(const run_ctx *r, const char **keys)
{
    int n = 0;
    for (int i = 0; i < r->n_top; i++)
        if (i == 0 || r->top[i].ms < r->default_ms)
            keys[n++] = r->top[i].key;
    return n;
}

static double top_ms(const run_ctx *r, const char *key)
{
    for (int i = 0; i < r->n_top; i++)
        if (!strcmp(r->top[i].key, key))
            return r->top[i].ms;
    return NAN;
}

int tune_confirm_pick(const tune_interval *iv, int n, bool *confirmed, bool *undecided)
{
    int win = -1, fav = 0;
    for (int i = 0; i < n; i++) {
        if (iv[i].ratio < iv[fav].ratio)
            fav = i;
        if (tune_interval_accepts(&iv[i]) && (win < 0 || iv[i].ratio < iv[win].ratio))
            win = i;
    }
    *confirmed = win >= 0;
    /* More rounds could change it: nothing confirmed though the favourite
     * measured faster than the default, or an unconfirmed challenger
     * faster than the confirmed winner. */
    *undecided = win >= 0 ? fav != win && iv[fav].ratio < iv[win].ratio : iv[fav].ratio < 1;
    return win >= 0 ? win : fav;
}

/* Paired rounds of the n challengers keys[0..n-1] and the default keys[n]
 * into *acc, `rounds` at a time: one set, then up to two more while the
 * decision is undecided (at most TUNE_CONFIRM_MAX_ROUNDS in all). iv[i]
 * gets challenger i against the default over all the rounds, *k the pick
 * and *confirmed whether it was confirmed. A failure of the timing is
 * returned in why (with MT_OK), as confirm does. */
static mt_status confirm_all(run_ctx *r, const char *const *keys, int n, int rounds,
                             double level, uint64_t seed, tune_paired *acc, tune_interval *iv,
                             int *k, bool *confirmed, char *why, size_t why_cap, mt_err *err)
{
    tune_paired *pr = calloc(1, sizeof *pr);
    if (!pr)
        return mt_fail(err, MT_E_NOMEM, "paired timing");
    mt_status st = MT_OK;
    mt_err e = MT_ERR_INIT;
    acc->rounds = 0;
    for (int pass = 0; pass < 3 && acc->rounds + rounds <= TUNE_CONFIRM_MAX_ROUNDS; pass++) {
        if (pass > 0)
            tune_progress_note(&r->prog, "tune: M=%lld: undecided after %d paired rounds "
                               "(%s at %.3f of the default%s): %d more", (long long)r->m,
                               acc->rounds, keys[*k], iv[*k].ratio,
                               *confirmed ? ", a faster challenger unconfirmed" : "", rounds);
        st = confirm(r, keys, n + 1, rounds, pr, why, why_cap, err);
        if (st != MT_OK || why[0])
            break;
        for (int i = 0; i <= n; i++)
            memcpy(&acc->ms[i][acc->rounds], pr->ms[i], sizeof(double) * (size_t)pr->rounds);
        acc->rounds += pr->rounds;
        for (int i = 0; i < n && !why[0]; i++)
            if (tune_ratio_interval(acc->ms[i], acc->ms[n], acc->rounds, level, seed, &iv[i],
                                    &e) != MT_OK)
                snprintf(why, why_cap, "%.400s", e.msg);
        if (why[0])
            break;
        bool more = false;
        *k = tune_confirm_pick(iv, n, confirmed, &more);
        if (!more)
            break;
    }
    free(pr);
    return st;
}

/* One line with every challenger's ratio to the default in the rounds. */
static void note_challengers(run_ctx *r, const char *const *keys, const tune_interval *iv, int n)
{
    char line[1536];
    int len = snprintf(line, sizeof line, "tune: M=%lld: %d challengers and the default in %d "
                       "paired rounds, ratio to the default:", (long long)r->m, n, iv[0].rounds);
    for (int i = 0; i < n && len > 0 && (size_t)len < sizeof line; i++)
        len += snprintf(line + len, sizeof line - (size_t)len, "%s %s %.3f [%.3f, %.3f]",
                        i ? "," : "", keys[i], iv[i].ratio, iv[i].lo, iv[i].hi);
    tune_progress_note(&r->prog, "%s", line);
}

/* Decides the winner of this M (see "How winners are decided" in
 * docs/TUNING.md) and records it with its decision. */
static mt_status decide(run_ctx *r, const tune_db_key *dk, uint64_t seed, mt_err *err)
{
    tune_m_report *mr = r->mr;
    mr->ratio = mr->ratio_lo = mr->ratio_hi = NAN;
    mr->rival_ratio = mr->rival_lo = mr->rival_hi = NAN;
    mt_status st = db_winners_recompute(r->db, r->device_id, r->kernel_id, r->shape_key, r->m,
                                        NULL, err);
    if (st != MT_OK || !r->best_key[0])
        return st; /* no ok trial: no winner */
    const char *best = r->best_key, *dflt = mr->default_key;
    int rounds = r->o->confirm_rounds == 0 ? 10 : r->o->confirm_rounds;
    if (rounds > TUNE_CONFIRM_MAX_ROUNDS)
        rounds = TUNE_CONFIRM_MAX_ROUNDS;
    db_confirm c = {.decision = DB_DECIDED_MEDIAN};
    const char *winner = best;
    if (rounds < 2 || !(r->default_ms > 0)) {
        /* No confirmation asked for, or no ok default to confirm against. */
    } else if (!strcmp(best, dflt) || r->n_top == 0) {
        c.decision = DB_DECIDED_DEFAULT_BEST;
    } else {
        const char *keys[TUNE_PAIRED_MAX_CONFIGS];
        int n = challengers(r, keys);
        tune_winner w;
        int nw = tune_db_winners(r->db, dk, r->m, &w, 1, err);
        if (nw < 0)
            return err ? err->status : MT_E_DB;
        bool stored_is_one = false;
        for (int i = 0; nw == 1 && i < n; i++)
            stored_is_one |= !strcmp(w.challenger, keys[i]);
        if (r->new_ok == 0 && stored_is_one &&
            (w.decision == DB_DECIDED_CONFIRMED || w.decision == DB_DECIDED_DEFAULT_KEPT)) {
            /* Nothing new since this very decision was made: keep it. */
            mr->decision = w.decision;
            snprintf(mr->challenger_key, sizeof mr->challenger_key, "%s", w.challenger);
            mr->challenger_ms = top_ms(r, w.challenger);
            tune_progress_note(&r->prog, "tune: M=%lld: nothing new measured: the decision "
                               "on %s against the default stands (%s)", (long long)r->m,
                               w.challenger, db_decision_str(w.decision));
            return MT_OK;
        }
        tune_progress_phase(&r->prog, "confirming");
        double level = r->o->confidence > 0 && r->o->confidence < 1 ? r->o->confidence : 0.95;
        keys[n] = dflt;
        tune_paired *pr = calloc(1, sizeof *pr);
        if (!pr)
            return mt_fail(err, MT_E_NOMEM, "paired timing");
        char why[512];
        tune_interval iv[TUNE_CONFIRM_MAX_TOP] = {{0}};
        int k = 0;
        bool ok = false;
        st = confirm_all(r, keys, n, rounds, level, seed, pr, iv, &k, &ok, why, sizeof why, err);
        if (st != MT_OK) {
            free(pr);
            return st;
        }
        mr->challengers = n;
        if (why[0]) {
            c.decision = DB_DECIDED_DEFAULT_KEPT;
            c.challenger_key = best;
            tune_progress_note(&r->prog, "tune: M=%lld: %s not confirmed against the default "
                               "%s (paired timing failed: %s); the default stays",
                               (long long)r->m, best, dflt, why);
        } else {
            c.challenger_key = keys[k];
            c.ratio = iv[k].ratio;
            c.ratio_lo = iv[k].lo;
            c.ratio_hi = iv[k].hi;
            c.confidence = iv[k].level;
            c.rounds = iv[k].rounds;
            mr->ratio = iv[k].ratio;
            mr->ratio_lo = iv[k].lo;
            mr->ratio_hi = iv[k].hi;
            mr->rounds = iv[k].rounds;
            c.decision = ok ? DB_DECIDED_CONFIRMED : DB_DECIDED_DEFAULT_KEPT;
            if (n > 1) {
                note_challengers(r, keys, iv, n);
                int rival = -1; /* the next fastest in the rounds */
                for (int i = 0; i < n; i++)
                    if (i != k && (rival < 0 || iv[i].ratio < iv[rival].ratio))
                        rival = i;
                tune_interval rv;
                if (tune_ratio_interval(pr->ms[k], pr->ms[rival], pr->rounds, level, seed, &rv,
                                        NULL) == MT_OK) {
                    snprintf(mr->rival_key, sizeof mr->rival_key, "%s", keys[rival]);
                    mr->rival_ratio = rv.ratio;
                    mr->rival_lo = rv.lo;
                    mr->rival_hi = rv.hi;
                    tune_progress_note(&r->prog, "tune: M=%lld: %s against %s in the same "
                                       "rounds: ratio %.3f, %.0f%% interval [%.3f, %.3f]",
                                       (long long)r->m, keys[k], keys[rival], rv.ratio,
                                       rv.level * 100, rv.lo, rv.hi);
                }
            }
            tune_progress_note(
                &r->prog,
                "tune: M=%lld: %s %.4g ms vs the default %s %.4g ms: ratio %.3f, %.0f%% "
                "interval [%.3f, %.3f] over %d paired rounds: %s",
                (long long)r->m, keys[k], tune_median(pr->ms[k], pr->rounds), dflt,
                tune_median(pr->ms[n], pr->rounds), iv[k].ratio, iv[k].level * 100, iv[k].lo,
                iv[k].hi, iv[k].rounds,
                ok ? "confirmed faster" : "rejected as noise, the default stays");
        }
        free(pr);
        snprintf(mr->challenger_key, sizeof mr->challenger_key, "%s", c.challenger_key);
        mr->challenger_ms = top_ms(r, c.challenger_key);
        winner = c.decision == DB_DECIDED_CONFIRMED ? c.challenger_key : dflt;
    }
    mr->decision = c.decision;
    if (c.decision == DB_DECIDED_DEFAULT_BEST)
        winner = dflt;
    return db_winner_decide(r->db, r->device_id, r->kernel_id, r->shape_key, r->m, winner, &c,
                            err);
}

static mt_status tune_m(run_ctx *r, int mi, mt_err *err)
{
    const tune_opts *o = r->o;
    r->m = r->job->m[mi];
    r->prepared = false; /* a new problem per M */
    r->best_ms = 0;
    r->best_key[0] = 0;
    r->default_ms = 0;
    r->new_ok = 0;
    r->n_top = 0;
    tune_m_report *mr = r->mr;
    memset(mr, 0, sizeof *mr);
    mr->m = r->m;
    mr->deterministic = -1;

    char label[KERN_KEY_MAX + 64];
    snprintf(label, sizeof label, "%s %s", r->job->fam->name, r->shape_key);
    tune_progress_begin(&r->prog, label, r->m, 0);

    uint64_t seed = o->seed;
    {
        char buf[KERN_KEY_MAX + 96];
        snprintf(buf, sizeof buf, "%s|%s|%lld|%s", r->job->fam->name, r->shape_key,
                 (long long)r->m, o->seed ? "" : r->props.fingerprint);
        seed = (o->seed ? o->seed : 0x6d6f6574756e65ull) ^ tune_hash64(buf);
    }
    int batch = r->jobs * 4 > 8 ? r->jobs * 4 : 8;
    tune_search_args sa = {r->job->fam, r->im, &r->job->shape, r->m, &r->props, o->strategy,
                           seed, o->shard_index, o->shard_count, batch, o->budget.trials};
    tune_search *s = NULL;
    mt_status st = tune_search_create(&sa, &s, err);
    if (st != MT_OK)
        return st;
    kern_config_key(r->im, tune_search_default(s), mr->default_key, sizeof mr->default_key);
    known_arg ka = {r, s, mr->default_key, 0, false};
    tune_db_key dk = db_key(r);
    st = tune_db_known(r->db, &dk, r->m, on_known, &ka, err);
    if (st != MT_OK) {
        tune_search_destroy(s);
        return st;
    }
    if (o->transfer)
        add_seeds(r, s);
    int space = tune_search_space(s);
    mr->space = space;
    int64_t trials = o->budget.trials;
    if (o->budget.space_fraction > 0 && space > 0) {
        int64_t share = (int64_t)ceil(o->budget.space_fraction * space);
        share = share < 1 ? 1 : share;
        trials = trials > 0 && trials < share ? trials : share;
        tune_search_set_budget(s, trials);
    }
    r->budget_left = trials > 0 ? (trials > ka.count ? trials - ka.count : 0) : -1;
    /* seeds_only where transfer found configs that apply here: the default
     * (unless it has a trial) and the seeds not measured yet alone, none
     * at all when the neighbours' winners are this M's default. */
    if (o->transfer && o->seeds_only && tune_search_seeds_valid(s) > 0) {
        int64_t n = tune_search_seeds(s) + (ka.default_known ? 0 : 1);
        r->budget_left = r->budget_left >= 0 && r->budget_left < n ? r->budget_left : n;
    }
    if (o->default_only) /* the default alone, unless it has a trial */
        r->budget_left = ka.default_known ? 0 : 1;
    r->deadline_m_ms = 0;
    if (r->deadline_run_ms > 0) {
        double left = r->deadline_run_ms - mt_now_ms();
        r->deadline_m_ms = mt_now_ms() + (left > 0 ? left : 0) / (r->pairs_left > 0 ? r->pairs_left : 1);
    }
    int planned = space > 0 ? space - ka.count : 0;
    if (r->budget_left >= 0 && (planned < 0 || planned > r->budget_left))
        planned = (int)r->budget_left;
    tune_progress_plan(&r->prog, planned > 0 ? planned : 0);
    mr->resumed = 0;
    r->prog.resumed = ka.count;

    int cap = o->strategy == TUNE_EXHAUSTIVE ? (space > 0 ? space : batch) : batch;
    cand *cs = calloc((size_t)cap, sizeof *cs);
    kern_config *cfgs = calloc((size_t)cap, sizeof *cfgs);
    if (!cs || !cfgs)
        st = mt_fail(err, MT_E_NOMEM, "candidates");
    bool out_of_time = false;
    while (st == MT_OK && !out_of_time && r->budget_left != 0) {
        int want = cap;
        if (r->budget_left > 0 && r->budget_left < want)
            want = (int)r->budget_left;
        int n = tune_search_next(s, cfgs, want);
        if (n == 0)
            break;
        memset(cs, 0, sizeof *cs * (size_t)n);
        for (int i = 0; i < n; i++) {
            cs[i].r = r;
            cs[i].cfg = cfgs[i];
            kern_config_key(r->im, &cfgs[i], cs[i].key, sizeof cs[i].key);
            cs[i].is_default = !strcmp(cs[i].key, mr->default_key);
        }
        st = run_batch(r, s, cs, n, &out_of_time, err);
    }
    free(cs);
    free(cfgs);
    tune_search_destroy(s);
    mr->resumed += ka.count;
    if (st != MT_OK) {
        tune_progress_end(&r->prog);
        return st;
    }
    if (!r->compile_only && !o->default_only) {
        st = decide(r, &dk, seed, err);
        tune_winner w;
        int nw = st == MT_OK ? tune_db_winners(r->db, &dk, r->m, &w, 1, err) : -1;
        if (nw < 0 && st == MT_OK)
            st = err ? err->status : MT_E_DB;
        if (nw == 1) {
            mr->has_winner = true;
            snprintf(mr->best_key, sizeof mr->best_key, "%s", w.config_key);
            mr->best_ms = w.time_ms;
            tune_progress_best(&r->prog, w.config_key, w.time_ms);
            double flops = 0, bytes = 0;
            if (r->job->fam->cost) {
                r->job->fam->cost(&r->job->shape, r->m, &flops, &bytes);
                mr->gflops = flops / (w.time_ms * 1e6);
                mr->gbps = bytes / (w.time_ms * 1e6);
            }
            if (r->new_ok > 0)
                check_determinism(r, w.config_key, &mr->deterministic);
        }
    }
    if (r->default_ms > 0) {
        mr->has_default = true;
        mr->default_ms = r->default_ms;
    }
    tune_progress_end(&r->prog);
    return st;
}

/* ---- the run ----------------------------------------------------------------- */

static mt_status open_all(run_ctx *r, tune_report *rep, mt_err *err)
{
    const tune_opts *o = r->o;
    dev_open_opts oo = {.arch = o->arch, .threads = 0};
    mt_status st = dev_open(o->device ? o->device : "auto", &oo, &r->dev, err);
    if (st != MT_OK)
        return st;
    r->props = *dev_get_props(r->dev);
    r->compile_only = o->compile_only || r->props.compile_only;
    snprintf(rep->device_spec, sizeof rep->device_spec, "%s", r->props.spec);
    snprintf(rep->device_name, sizeof rep->device_name, "%s", r->props.name);
    rep->compile_only = r->compile_only;
    st = db_open(o->db_path, DB_OPEN_DEFAULT, &r->db, err);
    if (st != MT_OK)
        return st;
    db_device dd;
    kern_db_device(&r->props, &dd);
    st = db_device_upsert(r->db, &dd, &r->device_id, err);
    if (st != MT_OK)
        return st;
    if (o->session_id > 0) {
        /* The caller's session: it ends it (own_session stays false). */
        r->session_id = rep->session_id = o->session_id;
    } else {
        char budget[96];
        tune_budget_text(&o->budget, budget, sizeof budget);
        db_session_info si = {o->argc, o->argv, "moetune " MOETUNE_VERSION, NULL,
                              tune_strategy_name(o->strategy), budget};
        st = db_session_begin(r->db, &si, &r->session_id, err);
        rep->session_id = r->session_id;
        if (st != MT_OK)
            return st;
        r->own_session = true;
    }
    return tune_pool_create(r->jobs, &r->pool, err);
}

static mt_status run_job(run_ctx *r, const tune_job *job, tune_job_report *jr, mt_err *err)
{
    r->job = job;
    r->im = kern_family_impl(job->fam, r->props.backend);
    jr->fam = job->fam;
    kern_shape_key(job->fam, &job->shape, false, r->shape_key, sizeof r->shape_key);
    snprintf(jr->shape_key, sizeof jr->shape_key, "%s", r->shape_key);
    if (!r->im)
        return mt_fail(err, MT_E_UNSUPPORTED, "family %s has no %s implementation",
                       job->fam->name, dev_backend_runs_hip_source(r->props.backend) ? "GPU" : "CPU");
    if (r->im->n_params == 0) {
        /* One fixed kernel: nothing to choose, nothing to store. */
        snprintf(jr->note, sizeof jr->note, "no parameters on %s: nothing to tune",
                 dev_backend_name(r->props.backend));
        if (r->o->log)
            fprintf(r->o->log, "tune: %s %s: %s\n", job->fam->name, r->shape_key, jr->note);
        r->pairs_left -= job->n_m;
        return MT_OK;
    }
    kern_source_hash(job->fam, r->props.backend, r->source_hash);
    db_kernel k = {job->fam->name, job->fam->version, r->source_hash};
    mt_status st = db_kernel_upsert(r->db, &k, &r->kernel_id, err);
    r->prepared = false;
    for (int i = 0; i < job->n_m && st == MT_OK; i++) {
        r->mr = &jr->m[i];
        st = tune_m(r, i, err);
        jr->n_m = i + 1;
        r->pairs_left--;
        r->prepared = false;
    }
    return st;
}

static mt_status check_opts(const tune_job *jobs, int n_jobs, const tune_opts *o, mt_err *err)
{
    if (!o->db_path || !*o->db_path)
        return mt_fail(err, MT_E_INVALID, "tune: a database path is required");
    if (n_jobs < 1 || n_jobs > TUNE_MAX_JOBS)
        return mt_fail(err, MT_E_INVALID, "tune: %d jobs (1 to %d)", n_jobs, TUNE_MAX_JOBS);
    if ((unsigned)o->strategy >= TUNE_STRATEGY_COUNT)
        return mt_fail(err, MT_E_INVALID, "tune: unknown strategy %d", (int)o->strategy);
    if (o->shard_count > 1 && (o->shard_index < 1 || o->shard_index > o->shard_count))
        return mt_fail(err, MT_E_INVALID, "tune: shard %d/%d", o->shard_index, o->shard_count);
    for (int i = 0; i < n_jobs; i++)
        if (!jobs[i].fam || jobs[i].n_m < 1 || jobs[i].n_m > TUNE_MAX_M)
            return mt_fail(err, MT_E_INVALID, "tune: job %d has no family or no M", i);
    return MT_OK;
}

mt_status tune_run(const tune_job *jobs, int n_jobs, const tune_opts *opts,
                   tune_report **report, mt_err *err)
{
    if (report)
        *report = NULL;
    mt_status st = check_opts(jobs, n_jobs, opts, err);
    if (st != MT_OK)
        return st;
    tune_report *rep = calloc(1, sizeof *rep);
    if (rep)
        rep->jobs = calloc((size_t)n_jobs, sizeof *rep->jobs);
    if (!rep || !rep->jobs) {
        tune_report_free(rep);
        return mt_fail(err, MT_E_NOMEM, "tune report");
    }
    run_ctx *r = calloc(1, sizeof *r);
    if (!r) {
        tune_report_free(rep);
        return mt_fail(err, MT_E_NOMEM, "tune");
    }
    double t0 = mt_now_ms();
    r->o = opts;
    r->rep = rep;
    r->timeout_s = opts->timeout_s > 0 ? opts->timeout_s : 60;
    r->jobs = opts->jobs > 0 ? opts->jobs : 2;
    r->confirm_top = opts->confirm_top <= 0                      ? TUNE_CONFIRM_TOP
                     : opts->confirm_top > TUNE_CONFIRM_MAX_TOP ? TUNE_CONFIRM_MAX_TOP
                                                                  : opts->confirm_top;
    r->prog.out = opts->log;
    r->prog.tty = opts->tty;
    r->data_seed = opts->data_seed ? opts->data_seed : mt_seed_fresh();
    r->deadline_run_ms = opts->budget.seconds > 0 ? t0 + opts->budget.seconds * 1000 : 0;
    for (int i = 0; i < n_jobs; i++)
        r->pairs_left += jobs[i].n_m;

    /* The spawner is forked first: no device, no thread exists yet (or
     * the caller forked it before its threads). */
    if (opts->spawner)
        r->sp = opts->spawner;
    else
        st = tune_spawner_start(&r->sp, err);
    if (st == MT_OK)
        st = open_all(r, rep, err);
    if (st == MT_OK && opts->log)
        fprintf(opts->log, "tune: device %s (%s)%s, strategy %s, %d compile jobs, "
                "verification seed 0x%llx, database %s\n", r->props.spec, r->props.name,
                r->compile_only ? ", compile-only" : "", tune_strategy_name(opts->strategy),
                r->jobs, (unsigned long long)r->data_seed, opts->db_path);
    for (int j = 0; j < n_jobs && st == MT_OK; j++) {
        rep->n_jobs = j + 1;
        st = run_job(r, &jobs[j], &rep->jobs[j], err);
    }
    gate_done(r); /* a path that returned between the gate and the worker's reply */
    tune_worker_stop(r->worker);
    tune_pool_destroy(r->pool);
    if (r->sp != opts->spawner)
        tune_spawner_stop(r->sp);
    if (st == MT_OK && tune_stopped(opts->stop))
        st = mt_fail(err, MT_E_INTERRUPTED, "interrupted");
    rep->interrupted = st == MT_E_INTERRUPTED;
    if (r->db && r->own_session) {
        db_session_status ss = st == MT_OK                ? DB_SESSION_DONE
                               : st == MT_E_INTERRUPTED ? DB_SESSION_INTERRUPTED
                                                        : DB_SESSION_FAILED;
        mt_err e2 = MT_ERR_INIT;
        mt_status s2 = db_session_end(r->db, r->session_id, ss, &e2);
        if (st == MT_OK && s2 != MT_OK)
            st = mt_fail(err, s2, "%s", e2.msg);
    }
    db_close(r->db);
    dev_close(r->dev);
    rep->elapsed_s = (mt_now_ms() - t0) / 1000;
    free(r);
    if (report)
        *report = rep;
    else
        tune_report_free(rep);
    return st;
}

void tune_report_free(tune_report *r)
{
    if (!r)
        return;
    free(r->jobs);
    free(r);
}
