/* bench_tune.c: how fast and how well `moetune tune` tunes, on the cpu.
 *
 *  1. Throughput: candidates per minute at GLM-5.2's MoE up-projection
 *     (moe_gemm_up glm5.2; gemm glm5.2-q_a when this build has no MoE GEMM)
 *     at M = 16 with 2 compile jobs, compile cache off, next to the limits
 *     measured in the same run: the compile-bound ceiling (jobs / mean
 *     compile time) and the measure-bound ceiling (1 / mean time the worker
 *     spent per candidate: verification plus timing).
 *  2. Tuned over default: the speedup of the winner over the family's
 *     default config per M (same shape, budget per M).
 *  3. Strategies: on a small space (gemm N=256,K=512 at M=32, 48 configs)
 *     the exhaustive run's measured times are the oracle; random and evolve
 *     are replayed against it with a fixed budget over many seeds (how close
 *     their best gets to the exhaustive optimum, and how often they find
 *     it), and each also runs once for real.
 *
 * Usage: bench_tune [--budget N] [--ms 1,4,16,64] [--jobs J] [--quick]
 *                   [--only glm|strategies] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rng.h"
#include "db/db.h"
#include "tuner/tune_impl.h"

static void die(const char *what, const mt_err *err)
{
    fprintf(stderr, "bench_tune: %s: %s\n", what, err->msg);
    exit(1);
}

static void tmp_db(char *out, size_t cap, const char *name)
{
    char dir[] = "/tmp/mt_bench_tune_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(out, cap, "%s/%s", dir, name);
}

/* ---- reading trials back ------------------------------------------------------------ */

typedef struct trial_rec {
    char key[256];
    int64_t m;
    db_trial_status st;
    double median_ms, compile_ms;
} trial_rec;

typedef struct trial_set {
    int n;
    trial_rec r[4096];
} trial_set;

static int trial_cb(void *arg, const db_trial_row *row)
{
    trial_set *s = arg;
    if (s->n >= 4096)
        return 1;
    trial_rec *r = &s->r[s->n++];
    snprintf(r->key, sizeof r->key, "%s", row->t.config_key);
    r->m = row->t.m;
    r->st = row->t.status;
    r->median_ms = row->t.time_median_ms;
    r->compile_ms = row->t.compile_ms;
    return 0;
}

static void read_trials(const char *path, trial_set *s)
{
    db_t *db = NULL;
    mt_err err = MT_ERR_INIT;
    if (db_open(path, DB_OPEN_READONLY, &db, &err) != MT_OK)
        die("open database", &err);
    s->n = 0;
    if (db_trials_each(db, NULL, trial_cb, s, &err) != MT_OK)
        die("read trials", &err);
    db_close(db);
}

static void base_opts(tune_opts *o, const char *db, int jobs)
{
    tune_opts_default(o);
    o->device = "cpu";
    o->db_path = db;
    o->jobs = jobs;
    o->log = getenv("BENCH_TUNE_LOG") ? stderr : NULL;
}

/* ---- 1 and 2: throughput and speedup at the GLM-5.2 shape -------------------------- */

static void glm_bench(int budget, const int64_t *ms, int n_m, int jobs)
{
    const kern_family *f = kern_family_find("moe_gemm_up");
    const char *shape = "glm5.2";
    if (!f || !f->cpu) {
        f = kern_family_find("gemm");
        shape = "glm5.2-q_a";
    }
    mt_err err = MT_ERR_INIT;
    tune_job job;
    static const int64_t m16[] = {16};
    if (tune_job_make(f, shape, m16, 1, &job, &err) != MT_OK)
        die("job", &err);
    char key[KERN_KEY_MAX];
    kern_shape_key(f, &job.shape, false, key, sizeof key);

    /* The problem (inputs and the C reference) is built once per M in the
     * worker; time it here so it can be taken out of the rate. */
    dev_device *d = NULL;
    if (dev_open("cpu", &(dev_open_opts){0}, &d, &err) != MT_OK)
        die("open cpu", &err);
    kern_problem *p = NULL;
    double t0 = mt_now_ms();
    if (kern_problem_create(d, f, &job.shape, 16, 1, &p, &err) != MT_OK)
        die("problem", &err);
    double prep_s = (mt_now_ms() - t0) / 1000;
    kern_problem_destroy(p);
    dev_close(d);

    char db[256];
    tmp_db(db, sizeof db, "glm.db");
    tune_opts o;
    base_opts(&o, db, jobs);
    o.strategy = TUNE_RANDOM;
    o.budget.trials = budget;
    setenv("MOETUNE_NO_CACHE", "1", 1); /* real compiles */
    tune_report *rep = NULL;
    t0 = mt_now_ms();
    if (tune_run(&job, 1, &o, &rep, &err) != MT_OK)
        die("tune", &err);
    double wall_s = (mt_now_ms() - t0) / 1000;
    unsetenv("MOETUNE_NO_CACHE");
    int n = rep->jobs[0].m[0].measured;
    static trial_set ts;
    read_trials(db, &ts);
    double compile = 0;
    int nc = 0;
    for (int i = 0; i < ts.n; i++)
        if (ts.r[i].compile_ms > 0) {
            compile += ts.r[i].compile_ms;
            nc++;
        }
    double mean_compile = nc ? compile / nc : NAN;
    double work_s = wall_s - prep_s;
    /* Compiles overlap nothing on a host device (they alternate with
     * measuring), so the worker's share is what the compiles leave. */
    double compile_wall = nc ? compile / 1000 / jobs : 0;
    double measure_s = work_s - compile_wall;
    printf("== throughput: %s %s, M=16, cpu, --jobs %d, random, %d candidates, compile cache off\n",
           f->name, key, jobs, n);
    printf("  wall %.1f s (problem + C reference %.1f s once per M)\n", wall_s, prep_s);
    printf("  candidates per minute          %8.1f   (excluding the reference: %.1f)\n",
           n / wall_s * 60, n / work_s * 60);
    printf("  compile-bound ceiling          %8.1f   (mean compile %.0f ms, %d jobs)\n",
           60000.0 * jobs / mean_compile, mean_compile, jobs);
    printf("  measure-bound ceiling          %8.1f   (worker ~%.2f s per candidate, estimated)\n",
           60 / (measure_s / n), measure_s / n);
    tune_report_free(rep);

    /* Speedup of the winner over the default per M (M=16 resumes). */
    if (tune_job_make(f, shape, ms, n_m, &job, &err) != MT_OK)
        die("job", &err);
    if (tune_run(&job, 1, &o, &rep, &err) != MT_OK)
        die("tune", &err);
    printf("\n== tuned over default: %s %s, random, %d trials per M\n", f->name, key, budget);
    printf("  %6s  %12s  %12s  %8s  %s\n", "M", "default ms", "tuned ms", "speedup", "winner");
    for (int i = 0; i < rep->jobs[0].n_m; i++) {
        const tune_m_report *mr = &rep->jobs[0].m[i];
        printf("  %6lld  %12.4f  %12.4f  %7.2fx  %s\n", (long long)mr->m, mr->default_ms,
               mr->best_ms, mr->has_default ? mr->default_ms / mr->best_ms : NAN, mr->best_key);
    }
    tune_report_free(rep);
}

/* ---- 3: strategies against the exhaustive optimum ---------------------------------- */

/* The default config's key, when the replay must not count it. */
static char excluded[256];

static double oracle(const trial_set *ts, const char *key)
{
    if (excluded[0] && !strcmp(key, excluded))
        return INFINITY;
    for (int i = 0; i < ts->n; i++)
        if (!strcmp(ts->r[i].key, key))
            return ts->r[i].st == DB_TRIAL_OK || ts->r[i].st == DB_TRIAL_SKIPPED
                       ? ts->r[i].median_ms /* skipped: partial, over 2x the best */
                       : INFINITY;
    return INFINITY;
}

/* Replays a strategy against the exhaustive times: the best time found
 * within budget proposals. */
static double replay(const kern_family *f, const kern_shape *s, int64_t m, const dev_props *p,
                     tune_strategy st, uint64_t seed, int budget, const trial_set *ts)
{
    tune_search_args a = {f, f->cpu, s, m, p, st, seed, 0, 0, 8, budget};
    tune_search *srch = NULL;
    mt_err err = MT_ERR_INIT;
    if (tune_search_create(&a, &srch, &err) != MT_OK)
        die("search", &err);
    double best = INFINITY;
    int used = 0;
    kern_config c[64];
    while (used < budget) {
        int want = budget - used < 64 ? budget - used : 64;
        int n = tune_search_next(srch, c, want);
        if (!n)
            break;
        for (int i = 0; i < n; i++) {
            char key[256];
            kern_config_key(f->cpu, &c[i], key, sizeof key);
            double t = oracle(ts, key);
            tune_search_result(srch, &c[i], isfinite(t), t);
            if (t < best)
                best = t;
        }
        used += n;
    }
    tune_search_destroy(srch);
    return best;
}

static void strategy_bench(int jobs, bool quick)
{
    const kern_family *f = kern_family_find("gemm");
    mt_err err = MT_ERR_INIT;
    tune_job job;
    static const int64_t m32[] = {32};
    if (tune_job_make(f, "N=256,K=512", m32, 1, &job, &err) != MT_OK)
        die("job", &err);
    char db[256];
    tmp_db(db, sizeof db, "exh.db");
    tune_opts o;
    base_opts(&o, db, jobs);
    /* No early abandoning distorts the oracle: every config's full time. */
    tune_report *rep = NULL;
    if (tune_run(&job, 1, &o, &rep, &err) != MT_OK)
        die("exhaustive", &err);
    int space = rep->jobs[0].m[0].space;
    tune_report_free(rep);
    static trial_set ts;
    read_trials(db, &ts);
    double opt = INFINITY;
    for (int i = 0; i < ts.n; i++)
        if (ts.r[i].st == DB_TRIAL_OK && ts.r[i].median_ms < opt)
            opt = ts.r[i].median_ms;
    int budget = space / 6 > 4 ? space / 6 : 4;
    printf("\n== strategies: gemm N=256,K=512 at M=32 on cpu, space %d, budget %d trials\n", space,
           budget);
    printf("  exhaustive optimum %.4f ms (%d trials; abandoned ones count with their partial "
           "median)\n", opt, ts.n);
    dev_device *d = NULL;
    if (dev_open("cpu", &(dev_open_opts){0}, &d, &err) != MT_OK)
        die("open cpu", &err);
    dev_props props = *dev_get_props(d);
    dev_close(d);
    const int seeds = quick ? 20 : 200;
    const tune_strategy sts[] = {TUNE_RANDOM, TUNE_EVOLVE};
    const int budgets[] = {budget, space / 3};
    /* The default is proposed first by every strategy; when it happens to
     * be the optimum every strategy "finds" it. The second pass takes it
     * out of the oracle, measuring the search itself. */
    kern_config dc;
    f->cpu->default_config(&job.shape, 32, &props, &dc);
    char dkey[256];
    kern_config_key(f->cpu, &dc, dkey, sizeof dkey);
    double dflt_ms = oracle(&ts, dkey);
    int rank = 1;
    for (int i = 0; i < ts.n; i++)
        rank += ts.r[i].st == DB_TRIAL_OK && ts.r[i].median_ms < dflt_ms;
    printf("  default %s: %.4f ms, rank %d of %d\n", dkey, dflt_ms, rank, ts.n);
    printf("  replayed over %d seeds against the exhaustive times:\n", seeds);
    printf("  %-10s  %6s  %14s  %14s  %14s\n", "strategy", "budget", "mean opt/best",
           "worst opt/best", "found optimum");
    for (int pass = 0; pass < 2; pass++) {
        double best = opt;
        if (pass == 1) {
            snprintf(excluded, sizeof excluded, "%s", dkey);
            best = INFINITY;
            for (int i = 0; i < ts.n; i++)
                if (ts.r[i].st == DB_TRIAL_OK && strcmp(ts.r[i].key, dkey) &&
                    ts.r[i].median_ms < best)
                    best = ts.r[i].median_ms;
            printf("  without the default (search alone), optimum %.4f ms:\n", best);
        }
        for (int bi = 0; bi < 2; bi++)
            for (int k = 0; k < 2; k++) {
                double sum = 0, worst = 1;
                int hit = 0;
                for (int sd = 1; sd <= seeds; sd++) {
                    double b = replay(f, &job.shape, 32, &props, sts[k], (uint64_t)sd * 7919,
                                      budgets[bi], &ts);
                    double q = best / b;
                    sum += q;
                    worst = q < worst ? q : worst;
                    hit += b <= best;
                }
                printf("  %-10s  %6d  %14.3f  %14.3f  %13.0f%%\n", tune_strategy_name(sts[k]),
                       budgets[bi], sum / seeds, worst, 100.0 * hit / seeds);
            }
    }
    excluded[0] = 0;
    /* One real run each (fresh database, its own measurements). */
    for (int k = 0; k < 2; k++) {
        char db2[256];
        tmp_db(db2, sizeof db2, "strategy.db");
        base_opts(&o, db2, jobs);
        o.strategy = sts[k];
        o.budget.trials = budget;
        o.seed = mt_seed_fresh();
        if (tune_run(&job, 1, &o, &rep, &err) != MT_OK)
            die("strategy run", &err);
        const tune_m_report *mr = &rep->jobs[0].m[0];
        printf("  real %-7s run: winner %s, its exhaustive time %.4f ms = %.3f of optimum\n",
               tune_strategy_name(sts[k]), mr->best_key, oracle(&ts, mr->best_key),
               opt / oracle(&ts, mr->best_key));
        tune_report_free(rep);
    }
}

int main(int argc, char **argv)
{
    int budget = 12, jobs = 2;
    bool quick = false, glm = true, strategies = true;
    int64_t ms[16] = {1, 4, 16, 64};
    int n_m = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--budget") && i + 1 < argc)
            budget = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--jobs") && i + 1 < argc)
            jobs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            const char *w = argv[++i];
            glm = !strcmp(w, "glm");
            strategies = !strcmp(w, "strategies");
        }
        else if (!strcmp(argv[i], "--ms") && i + 1 < argc) {
            n_m = 0;
            for (char *t = strtok(argv[++i], ","); t && n_m < 16; t = strtok(NULL, ","))
                ms[n_m++] = atoll(t);
        } else {
            fprintf(stderr, "usage: bench_tune [--budget N] [--ms 1,4,16,64] [--jobs J] "
                            "[--quick] [--only glm|strategies]\n");
            return 2;
        }
    }
    if (budget < 1 || jobs < 1 || n_m < 1) {
        fprintf(stderr, "bench_tune: budget, jobs and --ms must be positive\n");
        return 2;
    }
    if (quick) {
        budget = budget > 6 ? 6 : budget;
        n_m = n_m > 2 ? 2 : n_m;
    }
    if (glm)
        glm_bench(budget, ms, n_m, jobs);
    if (strategies)
        strategy_bench(jobs, quick);
    return 0;
}
