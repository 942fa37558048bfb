/* serve_tune.c: the server's background tuner (see serve_tune.h): plan from
 * the kernel set's counters, one tune_run per item through the caller's
 * spawner and a queue gate, all of them recorded under one tuning session
 * of the database, winners posted as live swaps, undone swaps marked
 * stale. */
#define _GNU_SOURCE
#include "serve_tune.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "kernels/core/kern_db.h"
#include "model/kset_swap.h"
#include "serve_duty.h"
#include "serve_hold.h"

#define TUNE_NICE 19
/* A first pass measures lightly, for coverage: a trial's timing stops
 * after this much wall time or these repetitions (the whole budget's are
 * the tuner's defaults, 2 s and 200), and its paired confirmation takes
 * these rounds (10 in the second pass) unless confirm_rounds says. The
 * paired interval, not one trial's median, decides what is swapped in, so
 * fewer rounds confirm fewer winners, not wrong ones; the second pass
 * confirms again with the full rounds. */
#define FIRST_MAX_MS 100.0
#define FIRST_MAX_REPS 50
#define FIRST_CONFIRM_ROUNDS 5

/* The command line a tuning session of the server records. */
static char *const session_argv[] = {"moetune", "serve", "--tune-misses", NULL};

/* How far a (family, key, bucket) has been tuned: not yet, by the first
 * pass (a few trials), or to the whole budget (never planned again). */
enum { PASS_NONE = 0, PASS_FIRST = 1, PASS_FULL = 2 };

/* A (family, key, bucket) the tuner took up and the pass it has had. */
typedef struct done_item {
    const kern_family *fam;
    char key[KERN_KEY_MAX];
    int b;
    int pass;
} done_item;

struct serve_tune {
    serve_tune_opts o;
    char *db_path;
    tune_spawner *sp;
    int jobs;
    model_kset *ks;
    serve_metrics *metrics;
    char spec[32];
    pthread_t thread;
    bool started;
    volatile sig_atomic_t stop;
    done_item *done;
    int n_done, cap_done;
    pthread_mutex_t mu; /* stats */
    serve_tune_stats st;
    double t0_ms;       /* when the tuner started */
    int64_t session_id; /* the server's tuning session; 0: none (each tune_run its own) */
    bool hold_set;      /* this tuner set the compilers' hold (dev_set_tool_hold) */
    double held0_s;     /* the hold's total when it started */
    serve_hold hold;    /* the compilers' hold cycle while serving (under mu) */
    bool covered;       /* no (kernel, M) the load called waits for its first pass */
    bool hold_busy;     /* the hold also stops the compilers while requests run */
    serve_duty duty;    /* the measurements' duty cycle while serving (tuner thread) */
    bool duty_busy;     /* the duty cycle bounds measuring while requests run */
    int64_t activity0;  /* the server's activity when the measurement started */
    int cpu_cores;      /* cpu or emu: the host's cores (a measurement's cost is CPU
                           time over them); 0: a GPU (the wall time) */
    volatile sig_atomic_t paused; /* serve_tune_pause */
    double paused_at_ms; /* when the pause began (under mu) */
};

mt_status serve_tune_create(const serve_tune_opts *o, serve_tune **out, mt_err *err)
{
    *out = NULL;
    if (!o->db_path || !*o->db_path)
        return mt_fail(err, MT_E_INVALID, "live tuning writes its winners to the server's "
                       "database: give one (--db FILE)");
    if (o->share < 0 || o->share > 1 || isnan(o->share))
        return mt_fail(err, MT_E_INVALID, "live tuning: share %g of the device (0 to 1]",
                       o->share);
    serve_tune *t = calloc(1, sizeof *t);
    if (!t || !(t->db_path = strdup(o->db_path))) {
        free(t);
        return mt_fail(err, MT_E_NOMEM, "live tuning");
    }
    t->o = *o;
    t->o.db_path = t->db_path;
    if (t->o.share == 0)
        t->o.share = 0.10;
    if (t->o.budget.trials == 0 && t->o.budget.seconds == 0 && t->o.budget.space_fraction == 0)
        t->o.budget.space_fraction = 0.15;
    if (t->o.queue_max <= 0)
        t->o.queue_max = 1;
    if (t->o.timeout_s <= 0)
        t->o.timeout_s = 30;
    if (t->o.warmup_s == 0)
        t->o.warmup_s = 2;
    if (t->o.first_trials == 0)
        t->o.first_trials = 8;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    t->jobs = (int)floor(t->o.share * (double)(cores > 0 ? cores : 1));
    if (t->jobs < 1)
        t->jobs = 1;
    pthread_mutex_init(&t->mu, NULL);
    db_t *db = NULL; /* a missing database is created: the server starts on it empty */
    mt_status st = db_open(t->db_path, DB_OPEN_DEFAULT, &db, err);
    db_close(db);
    if (st == MT_OK)
        st = tune_spawner_open(TUNE_NICE, &t->sp, err);
    if (st != MT_OK) {
        serve_tune_destroy(t);
        return st;
    }
    *out = t;
    return MT_OK;
}

static void stat_add(serve_tune *t, int64_t *field, int64_t n)
{
    pthread_mutex_lock(&t->mu);
    *field += n;
    pthread_mutex_unlock(&t->mu);
}

void serve_tune_stats_get(serve_tune *t, serve_tune_stats *out)
{
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    out->paused = t->paused;
    if (t->paused)
        out->paused_s += (mt_now_ms() - t->paused_at_ms) / 1000;
    pthread_mutex_unlock(&t->mu);
    if (t->hold_set) {
        int64_t n;
        dev_tool_hold_stats(&out->held_s, &n);
        out->held_s -= t->held0_s;
    }
}

/* Sleeps up to s seconds in slices, returning early (false) on stop. */
static bool nap(serve_tune *t, double s)
{
    double end = mt_now_ms() + s * 1000;
    while (!t->stop) {
        double left = end - mt_now_ms();
        if (left <= 0)
            return true;
        struct timespec ts = {0, (long)(left < 20 ? left : 20) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return false;
}

/* The tuner's progress to the server's /metrics (when it has them). */
static void publish(serve_tune *t)
{
    if (!t->metrics)
        return;
    serve_tune_stats s;
    serve_tune_stats_get(t, &s);
    serve_metrics_tune_state m = {s.tuned,     s.deepened,   s.confirmed,      s.failed,
                                  s.pending,   s.pending_first, s.covered,     s.paused,
                                  s.busy_s,    s.held_s,     s.measured_s,     s.measure_cost_s,
                                  s.gated_s};
    serve_metrics_tune(t->metrics, &m);
}

/* dev_set_tool_hold: a compiler is held while any request waits or runs,
 * for (1 - share) of each cycle (serve_hold.h): a server that is never
 * idle still gets its load tuned, compiling share of the time. */
static bool serving_busy(void *ctx)
{
    serve_tune *t = ctx;
    if (t->stop) /* a held compile would keep destroy waiting */
        return false;
    if (t->paused)
        return true;
    if (!t->hold_busy)
        return false;
    serve_metrics_state s;
    serve_metrics_state_get(t->metrics, &s);
    double now = mt_now_ms();
    pthread_mutex_lock(&t->mu);
    bool held = serve_hold_held(&t->hold, s.running > 0 || s.waiting > 0, now);
    pthread_mutex_unlock(&t->mu);
    return held;
}

/* tune_opts.gate: a measurement waits while requests queue, while the
 * tuner is paused, and on a busy server for the rest of the duty cycle
 * (serve_duty.h: it measures share of a busy server's time). */
static bool gate(void *ctx)
{
    serve_tune *t = ctx;
    double wait0 = mt_now_ms();
    while (!t->stop) {
        if (!t->paused) {
            bool go = true;
            double now = mt_now_ms();
            serve_metrics_state s = {0};
            if (t->metrics) {
                serve_metrics_state_get(t->metrics, &s);
                bool busy = s.running > 0 || s.waiting > 0;
                go = (!t->duty_busy || serve_duty_may_start(&t->duty, busy, now)) &&
                     s.waiting < t->o.queue_max;
            }
            if (go) {
                serve_duty_start(&t->duty, now);
                t->activity0 = s.activity;
                pthread_mutex_lock(&t->mu);
                t->st.gated_s += (now - wait0) / 1000;
                pthread_mutex_unlock(&t->mu);
                return true;
            }
        }
        nap(t, 0.01);
    }
    return false;
}

/* tune_opts.gate_done: the measurement is over; on a server that worked
 * meanwhile its rest begins. */
static void gate_done(void *ctx, double cpu_ms)
{
    serve_tune *t = ctx;
    serve_metrics_state s = {0};
    if (t->metrics)
        serve_metrics_state_get(t->metrics, &s);
    bool busy = s.running > 0 || s.waiting > 0 || s.activity != t->activity0;
    /* on cpu what it took of the device is the worker's CPU time over the
     * cores (it runs only where the serving threads leave a core idle); a
     * GPU's is the wall time (the worker waits for the device) */
    double cost = t->cpu_cores > 0 && cpu_ms >= 0 ? cpu_ms / t->cpu_cores : -1;
    serve_duty_end(&t->duty, busy, mt_now_ms(), cost);
    pthread_mutex_lock(&t->mu);
    t->st.measured_s = t->duty.measured_ms / 1000;
    t->st.measure_cost_s = t->duty.cost_ms / 1000;
    pthread_mutex_unlock(&t->mu);
}

void serve_tune_pause(serve_tune *t, bool pause)
{
    pthread_mutex_lock(&t->mu);
    if (pause && !t->paused) {
        t->paused_at_ms = mt_now_ms();
        t->st.pauses++;
    } else if (!pause && t->paused) {
        t->st.paused_s += (mt_now_ms() - t->paused_at_ms) / 1000;
    }
    t->paused = pause;
    pthread_mutex_unlock(&t->mu);
    publish(t);
    if (t->o.log)
        fprintf(t->o.log, "live tuning: %s\n", pause ? "paused (a candidate in flight finishes "
                "its run; nothing is measured or compiled until resumed)" : "resumed");
}

/* ---- the plan ------------------------------------------------------------------ */

static done_item *find_done(const serve_tune *t, const kern_family *f, const char *key, int b)
{
    for (int i = 0; i < t->n_done; i++)
        if (t->done[i].fam == f && t->done[i].b == b && !strcmp(t->done[i].key, key))
            return &t->done[i];
    return NULL;
}

static void set_pass(serve_tune *t, const kern_family *f, const char *key, int b, int pass)
{
    done_item *d = find_done(t, f, key, b);
    if (d) {
        d->pass = pass;
        return;
    }
    if (t->n_done == t->cap_done) {
        int cap = t->cap_done ? 2 * t->cap_done : 32;
        done_item *p = realloc(t->done, sizeof *p * (size_t)cap);
        if (!p)
            return; /* planned again: tuned again, which changes nothing */
        t->done = p;
        t->cap_done = cap;
    }
    d = &t->done[t->n_done++];
    d->fam = f;
    snprintf(d->key, sizeof d->key, "%s", key);
    d->b = b;
    d->pass = pass;
}

typedef struct item {
    const model_kern *k; /* the first kernel of the group */
    int b;
    int pass;            /* the pass it has had (PASS_NONE or PASS_FIRST) */
    double ms;           /* serving time so far, over the group */
    int64_t calls;
} item;

/* The next (family, key, bucket) to tune; false when none. Coverage first:
 * the costliest of those without a first pass, then the costliest of those
 * with only a first pass. *n_first and *n_full count the candidates of each. */
static bool plan_next(serve_tune *t, item *out, int64_t *n_first, int64_t *n_full)
{
    int nk = model_kset_n_kernels(t->ks);
    item best = {0};
    *n_first = *n_full = 0;
    for (int i = 0; i < nk; i++) {
        const model_kern *k = model_kset_kernel(t->ks, i);
        if (k->impl->n_params == 0)
            continue;
        for (int b = 0; b < k->n; b++) {
            model_choice c;
            model_kset_choice_get(t->ks, i, b, &c);
            /* tuned: by this tuner (its pass says how far) or in the database */
            const done_item *d = find_done(t, k->fam, k->key, b);
            int pass = d ? d->pass : c.prov == MODEL_PROV_TUNED ? PASS_FULL : PASS_NONE;
            if (pass == PASS_FULL)
                continue;
            /* the group: every kernel with this family and key (the first one leads) */
            bool first = true;
            for (int j = 0; j < i && first; j++) {
                const model_kern *o = model_kset_kernel(t->ks, j);
                first = !(o->fam == k->fam && !strcmp(o->key, k->key));
            }
            if (!first)
                continue;
            item it = {k, b, pass, 0, 0};
            for (int j = i; j < nk; j++) {
                const model_kern *o = model_kset_kernel(t->ks, j);
                if (o->fam != k->fam || strcmp(o->key, k->key) || b >= o->n)
                    continue;
                model_kern_usage u;
                model_kset_usage(t->ks, j, b, &u);
                it.ms += u.ms;
                it.calls += u.calls;
            }
            if (!it.calls)
                continue;
            (*(pass == PASS_NONE ? n_first : n_full))++;
            if (!best.k || it.pass < best.pass || (it.pass == best.pass && it.ms > best.ms))
                best = it;
        }
    }
    *out = best;
    return best.k != NULL;
}

/* ---- one item ---------------------------------------------------------------- */

/* The trials the whole budget b gives a space of that many configs (0: no
 * count, a wall-time budget alone). */
static int64_t budget_trials(const tune_budget *b, int space)
{
    int64_t n = b->trials;
    if (b->space_fraction > 0 && space > 0) {
        int64_t share = (int64_t)ceil(b->space_fraction * space);
        share = share < 1 ? 1 : share;
        n = n > 0 && n < share ? n : share;
    }
    return n;
}

/* Whether another M bucket of this kernel was taken up before (its
 * winners seed this bucket's first pass). */
static bool kernel_started(const serve_tune *t, const kern_family *f, const char *key, int b)
{
    for (int i = 0; i < t->n_done; i++)
        if (t->done[i].fam == f && t->done[i].b != b && !strcmp(t->done[i].key, key))
            return true;
    return false;
}

mt_status serve_tune_job(const model_kern *k, int64_t m, tune_job *out, mt_err *err)
{
    char text[KERN_KEY_MAX];
    kern_shape_key(k->fam, &k->shape, true, text, sizeof text);
    return tune_job_make(k->fam, text, &m, 1, out, err);
}

static void tune_item(serve_tune *t, const item *it)
{
    const model_kern *k = it->k;
    int64_t m = model_buckets[it->b];
    bool started = kernel_started(t, k->fam, k->key, it->b);
    /* Taken up: a tune that fails is not planned again. */
    set_pass(t, k->fam, k->key, it->b, PASS_FULL);
    /* The first pass: a few trials (the default and the winners of the
     * kernel's other tuned M alone, or with no M of the kernel taken up yet
     * the search's first picks, half of first_trials when that is more
     * than 3: each of them is compiled while serving, under the hold, and
     * its winners seed every other bucket); the second resumes the same
     * search up to the whole budget (trials in the database count). */
    bool first = it->pass == PASS_NONE && t->o.first_trials > 0;
    tune_budget budget = t->o.budget;
    int n_first = t->o.first_trials;
    if (first && !started && n_first > 3)
        n_first = (n_first + 1) / 2; /* every pick compiled while serving (above) */
    if (first)
        budget.trials = budget.trials > 0 && budget.trials < n_first ? budget.trials : n_first;
    tune_job job;
    mt_err err = MT_ERR_INIT;
    mt_status st = serve_tune_job(k, m, &job, &err);
    tune_opts o;
    tune_opts_default(&o);
    o.device = t->spec;
    o.db_path = t->db_path;
    o.budget = budget;
    o.jobs = t->jobs;
    o.timeout_s = t->o.timeout_s;
    if (t->o.confirm_rounds > 0)
        o.confirm_rounds = t->o.confirm_rounds;
    if (t->o.cold_timing <= 0)
        o.timing.flush_cache = false; /* see serve_tune.h: cold_timing */
    if (first && o.timing.max_ms > FIRST_MAX_MS)
        o.timing.max_ms = FIRST_MAX_MS;
    if (first && o.timing.max_reps > FIRST_MAX_REPS)
        o.timing.max_reps = FIRST_MAX_REPS;
    if (first && t->o.confirm_rounds <= 0)
        o.confirm_rounds = FIRST_CONFIRM_ROUNDS;
    /* A first pass next to a tuned M measures the neighbours' winners
     * (compiled already) and the default: coverage needs no compiles. */
    o.seeds_only = first;
    o.spawner = t->sp;
    o.gate = gate;
    o.gate_done = gate_done;
    o.gate_ctx = t;
    o.stop = &t->stop;
    o.session_id = t->session_id;
    o.argc = 3; /* for a session of its own (session_id 0) */
    o.argv = session_argv;
    double t0 = mt_now_ms(), meas0 = t->duty.measured_ms, cost0 = t->duty.cost_ms;
    tune_report *rep = NULL;
    if (st == MT_OK)
        st = tune_run(&job, 1, &o, &rep, &err);
    double secs = (mt_now_ms() - t0) / 1000;
    pthread_mutex_lock(&t->mu);
    t->st.busy_s += secs;
    pthread_mutex_unlock(&t->mu);
    const tune_m_report *mr = rep && rep->n_jobs == 1 && rep->jobs[0].n_m == 1 ? &rep->jobs[0].m[0]
                                                                               : NULL;
    if (st == MT_E_INTERRUPTED && t->stop) {
        tune_report_free(rep);
        return;
    }
    if (st != MT_OK || !mr || !mr->has_winner) {
        stat_add(t, &t->st.failed, 1);
        if (t->o.log)
            fprintf(t->o.log, "live tuning: %s %s M=%lld: %s\n", k->fam->name, k->key,
                    (long long)m, st != MT_OK ? err.msg : "no winner (no config ran)");
        tune_report_free(rep);
        return;
    }
    if (first) {
        int64_t all = budget_trials(&t->o.budget, mr->space);
        if (all <= 0 || all > budget_trials(&budget, mr->space))
            set_pass(t, k->fam, k->key, it->b, PASS_FIRST); /* more to search */
    }
    if (it->pass == PASS_FIRST)
        stat_add(t, &t->st.deepened, 1);
    else
        stat_add(t, &t->st.tuned, 1);
    int failed = 0;
    for (int s = 0; s < DB_TRIAL_STATUS_COUNT; s++)
        if (s != DB_TRIAL_OK && s != DB_TRIAL_SKIPPED)
            failed += mr->counts[s];
    if (t->o.log)
        fprintf(t->o.log, "live tuning: %s %s M=%lld (%.3g ms while serving, %lld calls): %s "
                "%s, %d trials (%d failed) in %.1f s (measuring %.2f s taking %.3f s of the "
                "device)%s\n", k->fam->name, k->key, (long long)m, it->ms, (long long)it->calls,
                db_decision_str(mr->decision), mr->best_key, mr->measured, failed, secs,
                (t->duty.measured_ms - meas0) / 1000, (t->duty.cost_ms - cost0) / 1000,
                first ? ", first pass" : it->pass == PASS_FIRST ? ", whole budget" : "");
    if (mr->decision == DB_DECIDED_CONFIRMED) {
        stat_add(t, &t->st.confirmed, 1);
        kern_config cfg;
        model_choice cur;
        model_kset_choice_get(t->ks, k->index, it->b, &cur);
        char cur_key[256];
        kern_config_key(k->impl, &cur.cfg, cur_key, sizeof cur_key);
        if (strcmp(cur_key, mr->best_key) &&
            ((st = kern_config_parse(k->impl, mr->best_key, &cfg, &err)) != MT_OK ||
             (st = model_kset_swap_post(t->ks, k->fam, k->key, m, &cfg, &err)) != MT_OK)) {
            if (t->o.log)
                fprintf(t->o.log, "live tuning: %s %s M=%lld: not swapped in: %s\n",
                        k->fam->name, k->key, (long long)m, err.msg);
        } else if (strcmp(cur_key, mr->best_key)) {
            stat_add(t, &t->st.posted, 1);
        }
    }
    tune_report_free(rep);
}

/* Marks the swaps the set undid stale in the database. */
static void mark_reverted(serve_tune *t)
{
    model_swap_revert rv[8];
    int n;
    while ((n = model_kset_swap_reverted(t->ks, rv, 8)) > 0) {
        db_t *db = NULL;
        mt_err err = MT_ERR_INIT;
        mt_status st = db_open(t->db_path, DB_OPEN_DEFAULT, &db, &err);
        db_device dd;
        kern_db_device(dev_get_props(model_kset_device(t->ks)), &dd);
        int64_t dev_id = 0;
        if (st == MT_OK)
            st = db_device_upsert(db, &dd, &dev_id, &err);
        for (int i = 0; i < n && st == MT_OK; i++) {
            char hash[65];
            kern_source_hash(rv[i].fam, dev_get_props(model_kset_device(t->ks))->backend, hash);
            db_kernel kr = {rv[i].fam->name, rv[i].fam->version, hash};
            int64_t kid = 0;
            double ms = rv[i].new_ms > 0 ? rv[i].new_ms : 1e-6;
            mt_status s2 = db_kernel_upsert(db, &kr, &kid, &err);
            if (s2 == MT_OK)
                s2 = db_winner_verify(db, dev_id, kid, rv[i].key, rv[i].m, ms, true, &err);
            if (s2 == MT_OK)
                stat_add(t, &t->st.marked_stale, 1);
            if (t->o.log)
                fprintf(t->o.log, "live tuning: %s %s M=%lld: swap undone (%.3fx slower while "
                        "serving); %s\n", rv[i].fam->name, rv[i].key, (long long)rv[i].m,
                        rv[i].ratio, s2 == MT_OK ? "winner marked stale in the database"
                                                 : err.msg);
        }
        if (st != MT_OK && t->o.log)
            fprintf(t->o.log, "live tuning: marking undone swaps stale: %s\n", err.msg);
        db_close(db);
    }
}

/* Begins the session every tune of this server is recorded under; on
 * failure each tune_run records a session of its own. */
static void session_begin(serve_tune *t)
{
    char budget[96];
    tune_budget_text(&t->o.budget, budget, sizeof budget);
    db_session_info si = {3, session_argv, "moetune " MOETUNE_VERSION, NULL,
                          tune_strategy_name(TUNE_MODEL), budget};
    db_t *db = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = db_open(t->db_path, DB_OPEN_DEFAULT, &db, &err);
    if (st == MT_OK)
        st = db_session_begin(db, &si, &t->session_id, &err);
    db_close(db);
    if (st != MT_OK) {
        t->session_id = 0;
        if (t->o.log)
            fprintf(t->o.log, "live tuning: no session of its own in %s (%s): each tune "
                    "records one\n", t->db_path, err.msg);
    }
}

static void session_end(serve_tune *t)
{
    if (!t->session_id)
        return;
    db_t *db = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = db_open(t->db_path, DB_OPEN_DEFAULT, &db, &err);
    if (st == MT_OK)
        st = db_session_end(db, t->session_id, DB_SESSION_DONE, &err);
    db_close(db);
    if (st != MT_OK && t->o.log)
        fprintf(t->o.log, "live tuning: ending session %lld: %s\n", (long long)t->session_id,
                err.msg);
}

static void *tune_main(void *arg)
{
    serve_tune *t = arg;
    /* This thread, the compile threads it starts and their compilers run
     * below the serving threads (nice is per thread on Linux, inherited). */
    pid_t tid = (pid_t)syscall(SYS_gettid);
    struct sched_param no_prio = {0};
    if ((setpriority(PRIO_PROCESS, (id_t)tid, TUNE_NICE) != 0 ||
         sched_setscheduler(tid, SCHED_IDLE, &no_prio) != 0) && t->o.log)
        fprintf(t->o.log, "live tuning: could not lower the tuner's priority\n");
    if (t->o.warmup_s > 0 && !nap(t, t->o.warmup_s))
        return NULL;
    int64_t items = 0;
    bool idle_logged = false;
    session_begin(t);
    t->t0_ms = mt_now_ms();
    while (!t->stop) {
        if (t->paused) {
            nap(t, 0.05);
            continue;
        }
        mark_reverted(t);
        item it;
        int64_t first = 0, full = 0;
        bool any = plan_next(t, &it, &first, &full) && (!t->o.max_items || items < t->o.max_items);
        bool covered = items > 0 && first == 0;
        pthread_mutex_lock(&t->mu);
        t->st.pending = first + full;
        t->st.pending_first = first;
        t->st.idle = !any;
        if (covered && !t->covered)
            t->st.covered_s = (mt_now_ms() - t->t0_ms) / 1000;
        t->st.covered = covered;
        pthread_mutex_unlock(&t->mu);
        publish(t);
        if (covered && !t->covered && t->o.log) {
            serve_tune_stats now;
            serve_tune_stats_get(t, &now);
            fprintf(t->o.log, "live tuning: covered: every kernel and M bucket the load has "
                    "called is tuned (%lld tunes in %.0f s, compilers held %.0f s, measuring "
                    "%.0f s taking %.1f s of the device, waiting to measure %.0f s)%s\n",
                    (long long)items, (mt_now_ms() - t->t0_ms) / 1000, now.held_s,
                    now.measured_s, now.measure_cost_s, now.gated_s,
                    full ? "; now the costliest to the whole budget" : "");
        }
        t->covered = covered;
        if (!any) {
            if (!idle_logged && t->o.log)
                fprintf(t->o.log, "live tuning: nothing left to tune for the load so far "
                        "(%lld tunes)\n", (long long)items);
            idle_logged = true;
            nap(t, 0.25);
            continue;
        }
        idle_logged = false;
        tune_item(t, &it);
        items++;
        publish(t);
    }
    return NULL;
}

mt_status serve_tune_start(serve_tune *t, model_kset *ks, serve_metrics *metrics, mt_err *err)
{
    if (t->started)
        return mt_fail(err, MT_E_INVALID, "live tuning: already started");
    if (!model_kset_live_on(ks))
        return mt_fail(err, MT_E_INVALID, "live tuning: the kernel set has live swaps off");
    t->ks = ks;
    t->metrics = metrics;
    publish(t);
    snprintf(t->spec, sizeof t->spec, "%s", dev_get_props(model_kset_device(ks))->spec);
    /* The hold stops the compilers while requests run (unless compile_busy)
     * and while the tuner is paused. */
    t->hold_busy = metrics && !t->o.compile_busy;
    serve_hold_init(&t->hold, t->o.share, mt_now_ms());
    /* and bounds measuring to share of a busy server's time (unless measure_busy) */
    t->duty_busy = metrics && !t->o.measure_busy;
    serve_duty_init(&t->duty, t->o.share);
    dev_backend be = dev_get_props(model_kset_device(ks))->backend;
    if (be == DEV_BACKEND_CPU || be == DEV_BACKEND_EMU) { /* kernels on the host's cores */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        t->cpu_cores = cores > 0 ? (int)cores : 1;
    }
    int64_t n;
    dev_tool_hold_stats(&t->held0_s, &n);
    dev_set_tool_hold(serving_busy, t);
    t->hold_set = true;
    int rc = pthread_create(&t->thread, NULL, tune_main, t);
    if (rc) {
        if (t->hold_set)
            dev_set_tool_hold(NULL, NULL);
        t->hold_set = false;
        return mt_fail(err, MT_E_IO, "live tuning: pthread_create: %s", strerror(rc));
    }
    t->started = true;
    if (t->o.log)
        fprintf(t->o.log, "live tuning: on %s, %d compile thread%s at nice %d%s, measuring "
                "while fewer than %d requests wait%s; winners into %s%s\n", t->spec, t->jobs,
                t->jobs == 1 ? "" : "s", TUNE_NICE,
                t->hold_busy ? " (compilers held while requests run, but for share of the time)"
                             : "", t->o.queue_max,
                t->duty_busy ? " (and for share of a busy server's time)" : "",
                t->db_path,
                model_kset_batch_invariant(ks) ? " (batch-invariant: none swapped in)" : "");
    return MT_OK;
}

void serve_tune_destroy(serve_tune *t)
{
    if (!t)
        return;
    t->stop = 1;
    if (t->started)
        pthread_join(t->thread, NULL);
    if (t->hold_set)
        dev_set_tool_hold(NULL, NULL);
    session_end(t);
    tune_spawner_close(t->sp);
    pthread_mutex_destroy(&t->mu);
    free(t->done);
    free(t->db_path);
    free(t);
}
