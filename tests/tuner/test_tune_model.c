/* test_tune_model.c: the model-guided search (`--strategy model`): the
 * random-forest surrogate and its expected improvement, and the strategy on
 * a synthetic separable cost (it must find the minimum in far fewer trials
 * than random search). On the committed replay tables of real exhaustive
 * times: test_replay_search.c. No device runs. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "tuner/tune_forest.h"
#include "tuner/tune_impl.h"

/* ---- the surrogate ------------------------------------------------------------------ */

Test(tune_forest, fits_a_step_and_is_unsure_away_from_the_data)
{
    uint64_t seed = mt_seed_fresh();
    printf("tune_forest seed 0x%llx\n", (unsigned long long)seed);
    mt_rng r;
    mt_rng_seed(&r, seed);
    /* y = 1 where x0 > 5 else 0, x1 is noise; x0 observed in 0..9. */
    double x[80 * 2], y[80];
    for (int i = 0; i < 80; i++) {
        x[i * 2] = i % 10;
        x[i * 2 + 1] = (double)mt_rng_below(&r, 7);
        y[i] = x[i * 2] > 5 ? 1 : 0;
    }
    tune_forest *f = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_forest_fit(x, y, 80, 2, 24, seed, &f, &err), MT_OK, "%s", err.msg);
    for (int v = 0; v < 10; v++) {
        double q[2] = {v, 3}, mean, sd;
        tune_forest_predict(f, q, &mean, &sd);
        cr_assert(fabs(mean - (v > 5)) < 0.05, "x0=%d: predicted %g", v, mean);
        cr_assert(sd < 0.2, "x0=%d: sd %g on the data", v, sd);
    }
    tune_forest_destroy(f);

    /* Two far clusters with a gap: the trees split anywhere in the gap, so
     * they disagree inside it and agree on the data. */
    double x2[8] = {0, 1, 2, 3, 20, 21, 22, 23}, y2[8] = {0, 0, 0, 0, 4, 4, 4, 4};
    cr_assert_eq(tune_forest_fit(x2, y2, 8, 1, 64, seed, &f, &err), MT_OK, "%s", err.msg);
    double on, on_sd, gap, gap_sd;
    tune_forest_predict(f, (double[]){1}, &on, &on_sd);
    tune_forest_predict(f, (double[]){11.5}, &gap, &gap_sd);
    cr_assert(on_sd < gap_sd, "sd on the data %g, in the gap %g", on_sd, gap_sd);
    tune_forest_destroy(f);

    double bad[2] = {NAN, 0};
    cr_assert_eq(tune_forest_fit(bad, y, 1, 2, 4, seed, &f, &err), MT_E_INVALID);
    cr_assert_null(f);
    cr_assert_eq(tune_forest_fit(x, y, 0, 2, 4, seed, &f, &err), MT_E_INVALID);
}

Test(tune_forest, expected_improvement_rewards_low_mean_and_spread)
{
    cr_assert_float_eq(tune_expected_improvement(1, 0, 3), 2, 1e-12);
    cr_assert_float_eq(tune_expected_improvement(3, 0, 1), 0, 1e-12);
    /* At mean == best, EI = sd / sqrt(2 pi). */
    cr_assert_float_eq(tune_expected_improvement(2, 1, 2), 1 / sqrt(2 * M_PI), 1e-9);
    cr_assert(tune_expected_improvement(1, 1, 2) > tune_expected_improvement(1.5, 1, 2));
    cr_assert(tune_expected_improvement(3, 2, 2) > tune_expected_improvement(3, 1, 2));
    cr_assert(tune_expected_improvement(3, 1, 2) > 0);
}

/* ---- the strategy on a synthetic separable cost ---------------------------------------- */

/* A family with four parameters (8 x 6 x 5 x 4 = 960 configs), never run:
 * the test is the oracle. */
static const int p_a[] = {1, 2, 3, 4, 5, 6, 7, 8};
static const int p_b[] = {1, 2, 3, 4, 5, 6};
static const int p_c[] = {1, 2, 3, 4, 5};
static const int p_d[] = {1, 2, 3, 4};
static const kern_param_desc syn_params[] = {
    {"A", p_a, 8, ""}, {"B", p_b, 6, ""}, {"C", p_c, 5, ""}, {"D", p_d, 4, ""}};
static void syn_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    (void)s;
    (void)m;
    (void)p;
    *c = (kern_config){4, {1, 1, 1, 1}};
}
static const kern_impl syn_impl = {.source = "syn.cpu", .params = syn_params, .n_params = 4,
                                   .default_config = syn_default};
static const kern_family syn_family = {.name = "tsyn", .version = 1, .cpu = &syn_impl};

/* Log-separable cost with its minimum at `centre` (value indices) and
 * per-parameter curvatures, plus a little noise fixed per config. */
typedef struct syn_cost {
    int centre[4];
    double curve[4];
    uint64_t noise_seed;
} syn_cost;

static double syn_time(const syn_cost *c, const kern_config *k)
{
    double lg = 0;
    uint64_t h = c->noise_seed;
    for (int i = 0; i < 4; i++) {
        double d = (double)(k->v[i] - 1 - c->centre[i]);
        lg += c->curve[i] * d * d;
        h = (h ^ (uint64_t)k->v[i]) * 0x100000001b3ull;
    }
    return exp(lg) * (1 + 0.01 * (double)(h % 1000) / 1000);
}

/* Trials the strategy needs to propose the optimum (budget + 1: never). */
static int trials_to_optimum(tune_strategy st, const syn_cost *c, uint64_t seed, int budget)
{
    kern_shape shape = {0};
    dev_props props = {0};
    props.backend = DEV_BACKEND_CPU;
    tune_search_args a = {&syn_family, &syn_impl, &shape, 1, &props, st, seed, 0, 0, 8, budget};
    tune_search *s = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_search_create(&a, &s, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(tune_search_space(s), 960);
    kern_config opt = {4, {c->centre[0] + 1, c->centre[1] + 1, c->centre[2] + 1,
                           c->centre[3] + 1}};
    int used = 0;
    kern_config k[64];
    while (used < budget) {
        int n = tune_search_next(s, k, budget - used < 64 ? budget - used : 64);
        cr_assert(n > 0, "the strategy ran dry after %d of 960", used);
        for (int i = 0; i < n && used < budget; i++) {
            used++;
            if (!memcmp(k[i].v, opt.v, sizeof opt.v[0] * 4)) {
                tune_search_destroy(s);
                return used;
            }
            tune_search_result(s, &k[i], true, syn_time(c, &k[i]));
        }
    }
    tune_search_destroy(s);
    return budget + 1;
}

Test(tune_model, finds_a_separable_minimum_in_far_fewer_trials_than_random)
{
    uint64_t seed = mt_seed_fresh();
    printf("tune_model synthetic seed 0x%llx\n", (unsigned long long)seed);
    mt_rng r;
    mt_rng_seed(&r, seed);
    const int cases = 8, budget = 96; /* 10 % of the space */
    int model_found = 0, random_found = 0, model_trials = 0;
    for (int t = 0; t < cases; t++) {
        syn_cost c = {{(int)mt_rng_below(&r, 8), (int)mt_rng_below(&r, 6),
                       (int)mt_rng_below(&r, 5), (int)mt_rng_below(&r, 4)},
                      {0.05 + 0.3 * mt_rng_uniform(&r, 0, 1), 0.05 + 0.3 * mt_rng_uniform(&r, 0, 1),
                       0.05 + 0.3 * mt_rng_uniform(&r, 0, 1), 0.05 + 0.3 * mt_rng_uniform(&r, 0, 1)},
                      mt_rng_u64(&r)};
        uint64_t s = mt_rng_u64(&r);
        int nm = trials_to_optimum(TUNE_MODEL, &c, s, budget);
        int nr = trials_to_optimum(TUNE_RANDOM, &c, s, budget);
        printf("  case %d: centre %d,%d,%d,%d: model %d, random %d trials (%d = not found)\n", t,
               c.centre[0], c.centre[1], c.centre[2], c.centre[3], nm, nr, budget + 1);
        model_found += nm <= budget;
        random_found += nr <= budget;
        model_trials += nm;
    }
    /* Random finds one point of 960 within 96 trials 10 % of the time; the
     * model must find it nearly always, on average within 60 % of the
     * budget (25 fresh seeds: the model's 8-case totals 260-400 trials,
     * random's 612-776, against this bound of 460; "under half", 384,
     * failed 3 of those 25). */
    cr_assert(model_found >= cases - 1, "model found the minimum in %d of %d cases", model_found,
              cases);
    cr_assert(model_found > random_found + cases / 2, "model %d, random %d of %d", model_found,
              random_found, cases);
    cr_assert(model_trials < cases * budget * 6 / 10, "model needed %d trials in all",
              model_trials);
}

Test(tune_model, proposes_the_default_and_seeds_first_and_never_repeats)
{
    kern_shape shape = {0};
    dev_props props = {0};
    props.backend = DEV_BACKEND_CPU;
    tune_search_args a = {&syn_family, &syn_impl, &shape, 1, &props, TUNE_MODEL, 7, 0, 0, 8, 0};
    tune_search *s = NULL;
    cr_assert_eq(tune_search_create(&a, &s, NULL), MT_OK);
    kern_config seed = {4, {5, 5, 5, 4}};
    tune_search_seed(s, &seed);
    tune_search_known(s, "A=2,B=1,C=1,D=1", false, NAN);
    kern_config k[8];
    int n = tune_search_next(s, k, 8);
    cr_assert(n >= 2);
    cr_assert_arr_eq(k[0].v, ((int[]){1, 1, 1, 1}), sizeof(int) * 4, "the default first");
    cr_assert_arr_eq(k[1].v, seed.v, sizeof(int) * 4, "then the seed");
    static bool seen[8][6][5][4];
    int total = 0;
    syn_cost c = {{3, 2, 1, 0}, {0.2, 0.2, 0.2, 0.2}, 1};
    do {
        for (int i = 0; i < n; i++) {
            bool *b = &seen[k[i].v[0] - 1][k[i].v[1] - 1][k[i].v[2] - 1][k[i].v[3] - 1];
            cr_assert(!*b, "config proposed twice");
            cr_assert(!(k[i].v[0] == 2 && k[i].v[1] == 1 && k[i].v[2] == 1 && k[i].v[3] == 1),
                      "a known config was proposed");
            *b = true;
            total++;
            tune_search_result(s, &k[i], true, syn_time(&c, &k[i]));
        }
    } while ((n = tune_search_next(s, k, 8)) > 0 && total < 120);
    cr_assert_geq(total, 120, "the strategy stopped early at %d", total);
    tune_search_destroy(s);
}
