/* test_serve_metrics.c: the Prometheus text: every sample line parses,
 * histogram buckets are cumulative and agree with a count of the observed
 * values, counters, gauges and the hit rate carry what was recorded, the
 * live tuner's progress shows only with a tuner, and concurrent writers
 * lose nothing. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "serve/serve_metrics.h"

/* The value of the sample line that starts with `name` followed by a space. */
static double sample(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *l = text; *l;) {
        const char *eol = strchr(l, '\n');
        cr_assert_not_null(eol, "every line ends in \\n");
        if (!strncmp(l, name, n) && l[n] == ' ')
            return strtod(l + n + 1, NULL);
        l = eol + 1;
    }
    cr_assert_fail("no sample %s", name);
    return NAN;
}

static char *render(serve_metrics *m)
{
    serve_buf b = SERVE_BUF_INIT;
    cr_assert_eq(serve_metrics_render(m, &b), MT_OK);
    return serve_buf_detach(&b, NULL);
}

Test(serve_metrics, lines_parse_as_exposition_format)
{
    serve_metrics *m;
    cr_assert_eq(serve_metrics_create(&m, NULL), MT_OK);
    serve_metrics_ttft(m, 0.3);
    char *t = render(m);
    for (char *l = t; *l;) {
        char *eol = strchr(l, '\n');
        cr_assert_not_null(eol);
        if (*l == '#') {
            cr_assert(!strncmp(l, "# HELP moetune_", 15) || !strncmp(l, "# TYPE moetune_", 15),
                      "%.*s", (int)(eol - l), l);
        } else {
            /* name{labels} value */
            char name[128];
            double v;
            cr_assert_eq(sscanf(l, "%127[a-z_]", name), 1);
            cr_assert(!strncmp(name, "moetune_", 8));
            const char *sp = memchr(l, ' ', (size_t)(eol - l));
            cr_assert_not_null(sp, "%.*s", (int)(eol - l), l);
            cr_assert_eq(sscanf(sp + 1, "%lf", &v), 1);
        }
        l = eol + 1;
    }
    free(t);
    serve_metrics_destroy(m);
}

Test(serve_metrics, histograms_are_cumulative_counts)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    serve_metrics *m;
    cr_assert_eq(serve_metrics_create(&m, NULL), MT_OK);
    static const double bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                    0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,   2.5};
    int n = 500;
    double sum = 0;
    double *vals = malloc((size_t)n * sizeof *vals);
    for (int i = 0; i < n; i++) {
        vals[i] = mt_rng_uniform(&rng, 0, 3);
        if (i % 50 == 0)
            vals[i] = bounds[i % 16]; /* exactly on a bound: counts in that bucket */
        sum += vals[i];
        serve_metrics_itl(m, vals[i]);
    }
    char *t = render(m);
    for (size_t b = 0; b < sizeof bounds / sizeof bounds[0]; b++) {
        int want = 0;
        for (int i = 0; i < n; i++)
            want += vals[i] <= bounds[b];
        char name[96];
        snprintf(name, sizeof name, "moetune_inter_token_latency_seconds_bucket{le=\"%g\"}",
                 bounds[b]);
        cr_assert_eq(sample(t, name), want, "seed %llu: %s", (unsigned long long)seed, name);
    }
    cr_assert_eq(sample(t, "moetune_inter_token_latency_seconds_bucket{le=\"+Inf\"}"), n);
    cr_assert_eq(sample(t, "moetune_inter_token_latency_seconds_count"), n);
    cr_assert_float_eq(sample(t, "moetune_inter_token_latency_seconds_sum"), sum, 1e-9 * n);
    free(t);
    free(vals);
    serve_metrics_destroy(m);
}

Test(serve_metrics, counters_gauges_and_hit_rate)
{
    serve_metrics *m;
    cr_assert_eq(serve_metrics_create(&m, NULL), MT_OK);
    serve_metrics_request(m, SERVE_API_CHAT, SERVE_OUTCOME_CANCELLED);
    serve_metrics_request(m, SERVE_API_CHAT, SERVE_OUTCOME_CANCELLED);
    serve_metrics_request(m, SERVE_API_COMPLETIONS, SERVE_OUTCOME_ERROR);
    serve_metrics_prompt(m, 100, 0);
    serve_metrics_prompt(m, 100, 64);
    serve_metrics_generated(m, 9);
    serve_metrics_state s = {.running = 3, .waiting = 4, .kv_pages_used = 50,
                             .kv_pages_total = 200, .cached_sequences = 2, .n_ranks = 1};
    serve_metrics_state_set(m, &s);
    model_selection_counts c = {.tuned = 5, .nearest = 1, .stale = 2, .defaults = 7,
                                .swapped = 2, .swaps = 3, .swapped_back = 1};
    serve_metrics_selection(m, &c);
    serve_metrics_ready(m, true);
    char *t = render(m);
    cr_assert_eq(sample(t, "moetune_requests_total{endpoint=\"chat.completions\",outcome="
                           "\"cancelled\"}"),
                 2);
    cr_assert_eq(
        sample(t, "moetune_requests_total{endpoint=\"completions\",outcome=\"error\"}"), 1);
    cr_assert_eq(sample(t, "moetune_requests_total{endpoint=\"completions\",outcome=\"ok\"}"),
                 0);
    cr_assert_eq(sample(t, "moetune_prompt_tokens_total"), 200);
    cr_assert_eq(sample(t, "moetune_prefix_cache_hits_total"), 64);
    cr_assert_float_eq(sample(t, "moetune_prefix_cache_hit_rate"), 0.32, 1e-12);
    cr_assert_eq(sample(t, "moetune_generation_tokens_total"), 9);
    cr_assert_eq(sample(t, "moetune_requests_running"), 3);
    cr_assert_eq(sample(t, "moetune_requests_waiting"), 4);
    cr_assert_eq(sample(t, "moetune_kv_pages_used"), 50);
    cr_assert_eq(sample(t, "moetune_kv_pages_total"), 200);
    cr_assert_eq(sample(t, "moetune_kernel_selections{provenance=\"stale\"}"), 2);
    cr_assert_eq(sample(t, "moetune_kernel_misses"), 7);
    cr_assert_eq(sample(t, "moetune_kernel_swaps_total"), 3);
    cr_assert_eq(sample(t, "moetune_kernel_swaps_undone_total"), 1);
    cr_assert_eq(sample(t, "moetune_kernel_selections_swapped"), 2);
    cr_assert_eq(sample(t, "moetune_ready"), 1);
    free(t);
    serve_metrics_destroy(m);
}

/* Per-rank load: one sample per rank and gauge under data-parallel
 * attention, none on one rank. */
Test(serve_metrics, per_rank_load_is_reported_only_across_ranks)
{
    serve_metrics *m;
    cr_assert_eq(serve_metrics_create(&m, NULL), MT_OK);
    serve_metrics_state s = {.n_ranks = 1, .rank_seqs = {4}, .rank_tokens = {9}};
    serve_metrics_state_set(m, &s);
    char *t = render(m);
    cr_assert_null(strstr(t, "moetune_rank_"), "%s", t);
    free(t);
    s = (serve_metrics_state){.n_ranks = 3};
    for (int r = 0; r < 3; r++) {
        s.rank_seqs[r] = 10 + r;
        s.rank_pages_used[r] = 20 + r;
        s.rank_tokens[r] = 1000 + r;
    }
    serve_metrics_state_set(m, &s);
    t = render(m);
    for (int r = 0; r < 3; r++) {
        char name[80];
        snprintf(name, sizeof name, "moetune_rank_sequences{rank=\"%d\"}", r);
        cr_assert_eq(sample(t, name), 10 + r, "%s", t);
        snprintf(name, sizeof name, "moetune_rank_kv_pages_used{rank=\"%d\"}", r);
        cr_assert_eq(sample(t, name), 20 + r, "%s", t);
        snprintf(name, sizeof name, "moetune_rank_tokens_total{rank=\"%d\"}", r);
        cr_assert_eq(sample(t, name), 1000 + r, "%s", t);
    }
    cr_assert_null(strstr(t, "rank=\"3\""), "%s", t);
    free(t);
    serve_metrics_destroy(m);
}

/* The live tuner's metrics: absent until a tuner pushes its state, then
 * every field under its own name, and the newest push wins. */
Test(serve_metrics, live_tuner_progress_only_with_a_tuner)
{
    serve_metrics *m;
    cr_assert_eq(serve_metrics_create(&m, NULL), MT_OK);
    char *t = render(m);
    cr_assert_null(strstr(t, "moetune_tune_"), "%s", t);
    free(t);
    serve_metrics_tune_state ts = {.tuned = 3, .deepened = 1, .confirmed = 2, .failed = 4,
                                   .pending = 50, .pending_first = 40, .paused = true,
                                   .busy_s = 1.5, .held_s = 0.25};
    serve_metrics_tune(m, &ts);
    ts = (serve_metrics_tune_state){.tuned = 7, .deepened = 2, .confirmed = 5, .failed = 1,
                                    .pending = 9, .pending_first = 0, .covered = true,
                                    .busy_s = 12.5, .held_s = 3.75, .measured_s = 6.5,
                                    .measure_cost_s = 1.25, .gated_s = 40.5};
    serve_metrics_tune(m, &ts);
    t = render(m);
    const struct {
        const char *name;
        double want;
    } want[] = {{"moetune_tune_tuned_total", 7},   {"moetune_tune_deepened_total", 2},
                {"moetune_tune_confirmed_total", 5}, {"moetune_tune_failed_total", 1},
                {"moetune_tune_pending", 9},       {"moetune_tune_pending_first", 0},
                {"moetune_tune_covered", 1},       {"moetune_tune_paused", 0},
                {"moetune_tune_busy_seconds_total", 12.5},
                {"moetune_tune_compilers_held_seconds_total", 3.75},
                {"moetune_tune_measuring_seconds_total", 6.5},
                {"moetune_tune_measure_cost_seconds_total", 1.25},
                {"moetune_tune_measure_wait_seconds_total", 40.5}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert_eq(sample(t, want[i].name), want[i].want, "%s in\n%s", want[i].name, t);
    free(t);
    serve_metrics_destroy(m);
}

static void *hammer(void *arg)
{
    serve_metrics *m = arg;
    for (int i = 0; i < 10000; i++) {
        serve_metrics_generated(m, 1);
        serve_metrics_step(m, 2, 3);
    }
    return NULL;
}

Test(serve_metrics, concurrent_writers_lose_nothing)
{
    serve_metrics *m;
    cr_assert_eq(serve_metrics_create(&m, NULL), MT_OK);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, hammer, m);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    char *t = render(m);
    cr_assert_eq(sample(t, "moetune_generation_tokens_total"), 40000);
    cr_assert_eq(sample(t, "moetune_batch_size_count"), 40000);
    cr_assert_eq(sample(t, "moetune_step_tokens_sum"), 120000);
    free(t);
    serve_metrics_destroy(m);
}
