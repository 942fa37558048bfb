/* test_tune_search.c: the tuner's search order and parsers, without a
 * device run: shards split the valid space disjointly and completely,
 * exhaustive covers it, random is a reproducible permutation, evolve
 * proposes neighbours of the best, known configs are never proposed,
 * budgets and shards parse. (A model's jobs come from the runtime's kernel
 * plan: test_plan.c.) */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "test_tune_families.h"
#include "tuner/tune_impl.h"

static dev_props cpu_props(void)
{
    dev_props p;
    memset(&p, 0, sizeof p);
    p.backend = DEV_BACKEND_CPU;
    p.warp_size = 1;
    p.max_threads_per_block = 1;
    return p;
}

static dev_props gpu_props(void)
{
    dev_props p;
    memset(&p, 0, sizeof p);
    p.backend = DEV_BACKEND_EMU;
    p.warp_size = 64;
    p.max_threads_per_block = 1024;
    p.shared_mem_per_block = 65536;
    return p;
}

/* Drains a search; returns how many configs it proposed, keys in out. */
static int drain(tune_search *s, const kern_impl *im, char (*keys)[256], int cap)
{
    kern_config c[64];
    int total = 0, n;
    while ((n = tune_search_next(s, c, 64)) > 0)
        for (int i = 0; i < n; i++) {
            cr_assert(total < cap);
            kern_config_key(im, &c[i], keys[total++], 256);
        }
    return total;
}

static int count_valid(const kern_family *f, const kern_impl *im, const kern_shape *s,
                       int64_t m, const dev_props *p)
{
    int n = 0;
    char why[256];
    for (uint64_t i = 0; i < kern_space_size(im); i++) {
        kern_config c;
        kern_space_point(im, i, &c);
        n += kern_config_valid(f, im, s, m, &c, p, why, sizeof why);
    }
    return n;
}

static tune_search *make(const kern_family *f, const kern_impl *im, const kern_shape *s,
                         int64_t m, const dev_props *p, tune_strategy st, uint64_t seed,
                         int shard, int shards)
{
    tune_search_args a = {f, im, s, m, p, st, seed, shard, shards, 8, 0};
    tune_search *out = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_search_create(&a, &out, &err), MT_OK, "%s", err.msg);
    return out;
}

Test(tune_search, shards_partition_the_valid_space_and_all_hold_the_default)
{
    const kern_family *f = kern_family_find("gemm");
    const kern_impl *im = f->gpu;
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, "tiny", &s, NULL, NULL), MT_OK);
    dev_props p = gpu_props();
    int valid = count_valid(f, im, &s, 7, &p);
    cr_assert(valid > 20);
    static char all[4096][256], part[4096][256];
    tune_search *u = make(f, im, &s, 7, &p, TUNE_EXHAUSTIVE, 1, 0, 0);
    int n_all = drain(u, im, all, 4096);
    char dflt[256];
    kern_config_key(im, tune_search_default(u), dflt, sizeof dflt);
    tune_search_destroy(u);
    cr_assert_eq(n_all, valid, "exhaustive proposed %d of %d valid configs", n_all, valid);
    cr_assert_str_eq(all[0], dflt, "the default comes first");

    int covered = 0;
    for (int sh = 1; sh <= 3; sh++) {
        tune_search *t = make(f, im, &s, 7, &p, TUNE_EXHAUSTIVE, 1, sh, 3);
        int n = drain(t, im, part, 4096);
        tune_search_destroy(t);
        cr_assert_str_eq(part[0], dflt, "shard %d/3 starts with the default", sh);
        for (int i = 0; i < n; i++) {
            bool is_default = !strcmp(part[i], dflt);
            if (!is_default) {
                cr_assert_eq(tune_shard_of(part[i], 3), sh - 1, "%s in shard %d", part[i], sh);
                covered++;
            }
            bool found = false;
            for (int j = 0; j < n_all && !found; j++)
                found = !strcmp(all[j], part[i]);
            cr_assert(found, "shard config %s not in the unsharded space", part[i]);
        }
    }
    cr_assert_eq(covered + 1, n_all, "the shards cover %d + default of %d", covered, n_all);
}

Test(tune_search, random_is_a_seeded_permutation_and_skips_known)
{
    const kern_family *f = kern_family_find("gemm");
    const kern_impl *im = f->cpu;
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, "tiny", &s, NULL, NULL), MT_OK);
    dev_props p = cpu_props();
    uint64_t seed = mt_seed_fresh();
    static char a[256][256], b[256][256], c[256][256];
    tune_search *x = make(f, im, &s, 4, &p, TUNE_RANDOM, seed, 0, 0);
    tune_search *y = make(f, im, &s, 4, &p, TUNE_RANDOM, seed, 0, 0);
    int na = drain(x, im, a, 256), nb = drain(y, im, b, 256);
    tune_search_destroy(x);
    tune_search_destroy(y);
    cr_assert_eq(na, (int)kern_space_size(im), "seed %llu", (unsigned long long)seed);
    cr_assert_eq(na, nb);
    for (int i = 0; i < na; i++)
        cr_assert_str_eq(a[i], b[i], "seed %llu: order differs at %d", (unsigned long long)seed, i);
    /* Known configs (already in the database) are never proposed. */
    tune_search *z = make(f, im, &s, 4, &p, TUNE_RANDOM, seed, 0, 0);
    for (int i = 1; i < 10; i++)
        tune_search_known(z, a[i], true, 1.0 + i);
    int nc = drain(z, im, c, 256);
    tune_search_destroy(z);
    cr_assert_eq(nc, na - 9);
    for (int i = 0; i < nc; i++)
        for (int k = 1; k < 10; k++)
            cr_assert_str_neq(c[i], a[k], "known config %s proposed again", a[k]);
}

Test(tune_search, evolve_proposes_neighbours_of_the_best_so_far)
{
    const kern_family *f = &tspin;
    const kern_impl *im = f->cpu;
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, "small", &s, NULL, NULL), MT_OK);
    dev_props p = cpu_props();
    tune_search *e = make(f, im, &s, 1, &p, TUNE_EVOLVE, mt_seed_fresh(), 0, 0);
    kern_config c[64];
    int n = tune_search_next(e, c, 64);
    cr_assert(n >= 1 && n <= 8, "first generation of %d", n);
    /* Report the first generation, making SPIN=16,PAD=3 the best. */
    kern_config best;
    cr_assert_eq(kern_config_parse(im, "V=1,SPIN=16,PAD=3", &best, NULL), MT_OK);
    kern_config gen0[64];
    int n0 = n;
    memcpy(gen0, c, sizeof c[0] * (size_t)n);
    for (int i = 0; i < n; i++)
        tune_search_result(e, &c[i], true, 100.0);
    tune_search_known(e, "V=1,SPIN=16,PAD=3", true, 1.0);
    /* The best's neighbours (one allowed value away in one parameter). */
    static const char *const nb[] = {"V=1,SPIN=16,PAD=1", "V=1,SPIN=16,PAD=9",
                                     "V=1,SPIN=4,PAD=3", "V=1,SPIN=64,PAD=3"};
    bool untried = false;
    for (int k = 0; k < 4; k++) {
        bool seen = false;
        for (int i = 0; i < n0; i++) {
            char key[256];
            kern_config_key(im, &gen0[i], key, sizeof key);
            seen |= !strcmp(key, nb[k]);
        }
        untried |= !seen;
    }
    n = tune_search_next(e, c, 64);
    cr_assert(n > 0);
    for (int i = 0; i < n; i++) {
        char key[256];
        kern_config_key(im, &c[i], key, sizeof key);
        /* Never a config already tried. */
        for (int j = 0; j < n0; j++)
            cr_assert(memcmp(gen0[j].v, c[i].v, sizeof c[i].v[0] * 3) != 0, "%s again", key);
        cr_assert_str_neq(key, "V=1,SPIN=16,PAD=3");
        if (i == 0 && untried) {
            bool near = false;
            for (int k = 0; k < 4; k++)
                near |= !strcmp(key, nb[k]);
            cr_assert(near, "first proposal %s is not next to the best", key);
        }
    }
    tune_search_destroy(e);
}

Test(tune_parse, budgets_shards_and_strategies)
{
    tune_budget b;
    cr_assert_eq(tune_budget_parse("2000", &b, NULL), MT_OK);
    cr_assert_eq(b.trials, 2000);
    cr_assert_eq(tune_budget_parse("30m", &b, NULL), MT_OK);
    cr_assert_float_eq(b.seconds, 1800.0, 1e-9);
    cr_assert_eq(tune_budget_parse("1.5h", &b, NULL), MT_OK);
    cr_assert_float_eq(b.seconds, 5400.0, 1e-9);
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_budget_parse("12x", &b, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "12x"));
    cr_assert_eq(tune_budget_parse("2.5", &b, NULL), MT_E_INVALID);
    cr_assert_eq(tune_budget_parse("-3", &b, NULL), MT_E_INVALID);
    cr_assert_eq(tune_budget_parse("15%", &b, NULL), MT_OK);
    cr_assert_float_eq(b.space_fraction, 0.15, 1e-12);
    cr_assert(b.trials == 0 && b.seconds == 0);
    char text[96];
    tune_budget_text(&b, text, sizeof text);
    cr_assert_str_eq(text, "15% of the space per M");
    cr_assert_eq(tune_budget_parse("150%", &b, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "150%"), "%s", err.msg);
    cr_assert_eq(tune_budget_parse("0%", &b, NULL), MT_E_INVALID);
    int i, n;
    cr_assert_eq(tune_shard_parse("2/3", &i, &n, NULL), MT_OK);
    cr_assert(i == 2 && n == 3);
    cr_assert_eq(tune_shard_parse("4/3", &i, &n, NULL), MT_E_INVALID);
    cr_assert_eq(tune_shard_parse("0/3", &i, &n, NULL), MT_E_INVALID);
    cr_assert_eq(tune_shard_parse("2", &i, &n, NULL), MT_E_INVALID);
    tune_strategy st;
    cr_assert(tune_strategy_parse("evolve", &st) && st == TUNE_EVOLVE);
    cr_assert(!tune_strategy_parse("annealing", &st));
    /* The shard hash spreads keys over every shard. */
    int hits[4] = {0};
    for (int k = 0; k < 400; k++) {
        char key[32];
        snprintf(key, sizeof key, "BM=%d,BN=%d", k % 20, k / 20);
        hits[tune_shard_of(key, 4)]++;
    }
    for (int k = 0; k < 4; k++)
        cr_assert(hits[k] > 50, "shard %d got %d of 400 keys", k, hits[k]);
}
