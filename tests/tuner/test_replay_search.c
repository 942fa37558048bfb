/* test_replay_search.c: the tuner's default search strategy against every
 * replay table committed in bench/data/ (exhaustive timings of real spaces,
 * bench/lib/replay.h). With 15 % of a space's evaluations, the median over
 * fresh seeds must reach 97 % of the table's optimum, and somewhere
 * random search, with the same budget and seeds, must stay clearly under
 * it: the bound is one a blind search does not meet. Tables in
 * subdirectories (bench/data/flat/) are not held to it (docs/BENCHMARKS.md).
 * Replays read no clock and run no kernel; they cost milliseconds. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/lib/replay.h"
#include "tuner/tuner.h"

#define DATA_DIR MOETUNE_SOURCE_DIR "/bench/data"
#define SEEDS 200
#define BUDGET_FRACTION 0.15
#define BOUND 0.97

typedef struct loaded {
    replay_table t;
    const kern_family *f;
    const kern_impl *im;
    kern_shape s;
    dev_props p;
} loaded;

static void load(const char *path, loaded *l)
{
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(replay_table_read(path, &l->t, &err), MT_OK, "%s", err.msg);
    l->f = kern_family_find(l->t.family);
    cr_assert_not_null(l->f, "%s: family %s", path, l->t.family);
    int backend = db_backend_parse(l->t.device);
    cr_assert_geq(backend, 0, "%s: device %s", path, l->t.device);
    l->im = kern_family_impl(l->f, backend);
    cr_assert_eq(kern_shape_parse(l->f, l->t.shape, &l->s, NULL, &err), MT_OK, "%s: %s", path,
                 err.msg);
    cr_assert_eq(replay_table_props(&l->t, &l->p, &err), MT_OK, "%s: %s", path, err.msg);
}

static uint64_t fresh_seed(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec ^
           ((uint64_t)getpid() << 32);
}

/* The median fraction of the optimum strategy st reaches at m. */
static double score(const loaded *l, int64_t m, tune_strategy st, uint64_t seed0, int *budget)
{
    int space = 0;
    replay_search(l->f, l->im, &l->s, m, &l->p, TUNE_RANDOM, 1, 1, &l->t, &space);
    cr_assert_gt(space, 0);
    *budget = (int)ceil(BUDGET_FRACTION * space);
    replay_score sc;
    replay_score_strategy(l->f, l->im, &l->s, m, &l->p, st, seed0, SEEDS, *budget, &l->t, &sc);
    cr_assert(isfinite(sc.median));
    return sc.median;
}

static bool is_table(const char *name)
{
    size_t n = strlen(name);
    return n > 4 && !strcmp(name + n - 4, ".csv");
}

Test(replay_search, default_strategy_reaches_97_percent_of_every_table_at_15_percent)
{
    tune_opts o;
    tune_opts_default(&o);
    DIR *dir = opendir(DATA_DIR);
    cr_assert_not_null(dir, "%s", DATA_DIR);
    uint64_t seed0 = fresh_seed();
    int tables = 0, random_misses = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (!is_table(e->d_name))
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", DATA_DIR, e->d_name);
        loaded l;
        load(path, &l);
        int64_t ms[16];
        int n_m = replay_table_ms(&l.t, ms, 16);
        cr_assert_gt(n_m, 0, "%s has no rows", path);
        for (int i = 0; i < n_m; i++) {
            int budget;
            double med = score(&l, ms[i], o.strategy, seed0, &budget);
            double rnd = score(&l, ms[i], TUNE_RANDOM, seed0, &budget);
            cr_log_info("%s M=%lld: %s reaches %.3f of the optimum with %d evaluations, "
                        "random %.3f (seeds from %llu)", e->d_name, (long long)ms[i],
                        tune_strategy_name(o.strategy), med, budget, rnd,
                        (unsigned long long)seed0);
            cr_expect_geq(med, BOUND,
                          "%s M=%lld: the default strategy (%s) reaches %.3f of the optimum "
                          "with %d evaluations, under %.2f (seeds from %llu)",
                          e->d_name, (long long)ms[i], tune_strategy_name(o.strategy), med,
                          budget, BOUND, (unsigned long long)seed0);
            random_misses += rnd < BOUND - 0.02;
        }
        replay_table_free(&l.t);
        tables++;
    }
    closedir(dir);
    cr_assert_geq(tables, 3, "bench/data holds %d replay tables", tables);
    /* The bound means something: with the same budget and seeds, random
     * search stays clearly under it somewhere. */
    cr_expect_gt(random_misses, 0, "random search reached %.2f on every table and M (seeds "
                 "from %llu)", BOUND - 0.02, (unsigned long long)seed0);
}
