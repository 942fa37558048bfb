/* test_tune_confirm.c: how the tuner decides a winner. The bootstrap
 * interval of paired ratios on synthetic rounds (clearly faster accepted,
 * equal or slower rejected, coverage near the nominal level), then
 * end-to-end on the cpu: a config whose median was a lucky draw is
 * rejected against the default (the default stays, the log says so, the
 * database records the decision and a recompute does not overturn it), and
 * a truly faster config is confirmed. */
#define _GNU_SOURCE /* open_memstream */
#include "test_tune_util.h"
#include "test_tune_families.h"
#include "common/rng.h"

/* n paired rounds: default around 1 ms, candidate `ratio` times that, each
 * time with lognormal noise of sigma `noise` (independent per config). */
static void rounds(mt_rng *rng, int n, double ratio, double noise, double *cand, double *dflt)
{
    for (int i = 0; i < n; i++) {
        double drift = 1 + 0.2 * i / n; /* load drift: hits both alike */
        dflt[i] = drift * exp(noise * mt_rng_normal(rng));
        cand[i] = drift * ratio * exp(noise * mt_rng_normal(rng));
    }
}

static tune_interval interval(const double *c, const double *d, int n, uint64_t seed)
{
    tune_interval iv;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(tune_ratio_interval(c, d, n, 0.95, seed, &iv, &e), MT_OK, "%s", e.msg);
    cr_assert(iv.lo <= iv.ratio && iv.ratio <= iv.hi, "%g not in [%g, %g]", iv.ratio, iv.lo,
              iv.hi);
    cr_assert_eq(iv.rounds, n);
    return iv;
}

Test(tune_confirm, clearly_faster_is_accepted)
{
    mt_rng rng;
    mt_rng_seed(&rng, 1);
    double c[10], d[10];
    for (int k = 0; k < 50; k++) {
        rounds(&rng, 10, 0.8, 0.03, c, d);
        tune_interval iv = interval(c, d, 10, 7 + k);
        cr_expect(tune_interval_accepts(&iv), "0.8x rejected: %g [%g, %g]", iv.ratio, iv.lo,
                  iv.hi);
        cr_expect(fabs(iv.ratio - 0.8) < 0.05, "ratio %g", iv.ratio);
    }
}

Test(tune_confirm, equal_with_noise_is_rejected)
{
    mt_rng rng;
    mt_rng_seed(&rng, 2);
    double c[10], d[10];
    int accepted = 0;
    for (int k = 0; k < 400; k++) {
        rounds(&rng, 10, 1.0, 0.05, c, d);
        tune_interval iv = interval(c, d, 10, 100 + k);
        accepted += tune_interval_accepts(&iv);
    }
    /* A one-sided false accept has a nominal rate of 2.5 %; the percentile
     * bootstrap with 10 rounds runs a little above it. */
    cr_expect(accepted <= 28, "%d of 400 equal configs accepted", accepted);
    /* Identical times: the ratio is exactly 1, never below it. */
    for (int i = 0; i < 10; i++)
        c[i] = d[i] = 0.5;
    tune_interval iv = interval(c, d, 10, 3);
    cr_expect(iv.ratio == 1 && iv.lo == 1 && iv.hi == 1);
    cr_expect(!tune_interval_accepts(&iv));
}

Test(tune_confirm, clearly_slower_is_rejected)
{
    mt_rng rng;
    mt_rng_seed(&rng, 3);
    double c[10], d[10];
    for (int k = 0; k < 50; k++) {
        rounds(&rng, 10, 1.3, 0.05, c, d);
        tune_interval iv = interval(c, d, 10, 9 + k);
        cr_expect(!tune_interval_accepts(&iv), "1.3x accepted: [%g, %g]", iv.lo, iv.hi);
        cr_expect_gt(iv.lo, 1.0);
    }
}

/* On simulated rounds the 95 % interval holds the true ratio in roughly
 * 95 % of experiments (the percentile bootstrap undercovers a little with
 * 10 rounds: about 91-93 % here). */
Test(tune_confirm, interval_covers_the_true_ratio_near_the_nominal_rate, .timeout = 60)
{
    mt_rng rng;
    mt_rng_seed(&rng, 4);
    const int experiments = 1000;
    const double truth = 0.9;
    double c[10], d[10];
    int covered = 0;
    for (int k = 0; k < experiments; k++) {
        rounds(&rng, 10, truth, 0.04, c, d);
        tune_interval iv = interval(c, d, 10, 1000 + k);
        covered += iv.lo <= truth && truth <= iv.hi;
    }
    double rate = (double)covered / experiments;
    cr_expect(rate >= 0.88 && rate <= 0.98, "coverage %.3f", rate);
}

Test(tune_confirm, interval_is_deterministic_and_checks_its_input)
{
    double c[] = {0.9, 1.1, 0.95, 1.0}, d[] = {1.0, 1.0, 1.02, 0.98};
    tune_interval a = interval(c, d, 4, 42), b = interval(c, d, 4, 42);
    cr_expect(a.lo == b.lo && a.hi == b.hi && a.ratio == b.ratio);
    tune_interval iv;
    mt_err e = MT_ERR_INIT;
    cr_expect_eq(tune_ratio_interval(c, d, 1, 0.95, 1, &iv, &e), MT_E_INVALID);
    cr_expect_eq(tune_ratio_interval(c, d, 4, 1.0, 1, &iv, &e), MT_E_INVALID);
    double z[] = {0.9, 0, 1, 1};
    cr_expect_eq(tune_ratio_interval(z, d, 4, 0.95, 1, &iv, &e), MT_E_INVALID);
    cr_expect(strstr(e.msg, "round 1"), "%s", e.msg);
}

/* ---- end to end ---------------------------------------------------------- */

static void quick_opts(tune_opts *o, const char *db)
{
    tt_opts(o, "cpu", db);
    o->timing.flush_cache = false;
    o->timing.min_reps = 5;
    o->timing.max_reps = 7;
}

Test(tune_confirm, a_lucky_median_is_rejected_and_the_default_stays, .timeout = 300)
{
    char db[256];
    tt_db_path(db, sizeof db, "lucky.db");
    static const int64_t ms[] = {1};
    tune_job job;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_job_make(&tlucky, "N=256", ms, 1, &job, &err), MT_OK, "%s", err.msg);
    tune_opts o;
    quick_opts(&o, db);
    o.budget.trials = 1; /* the default only */
    tune_report *rep = NULL;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    char dflt[256];
    snprintf(dflt, sizeof dflt, "%s", rep->jobs[0].m[0].default_key);
    double dflt_ms = rep->jobs[0].m[0].default_ms;
    cr_assert(dflt_ms > 0);
    cr_expect_eq(rep->jobs[0].m[0].decision, DB_DECIDED_DEFAULT_BEST);
    tune_report_free(rep);

    /* An earlier run's lucky draw: V=3 (3x the work) recorded at a
     * quarter of the default's median. */
    char lucky[256];
    cr_assert(!strncmp(dflt, "V=1,", 4), "default %s", dflt);
    snprintf(lucky, sizeof lucky, "V=3,%s", dflt + 4);
    tt_decision d0 = tt_read_decision(db);
    db_t *h = NULL;
    cr_assert_eq(db_open(db, DB_OPEN_DEFAULT, &h, &err), MT_OK, "%s", err.msg);
    db_trial t = {.device_id = d0.dev, .kernel_id = d0.ker, .shape_key = "N=256", .m = 1,
                  .config_key = lucky, .config_json = "{\"V\":3,\"SPIN\":4,\"PAD\":1}",
                  .status = DB_TRIAL_OK, .time_min_ms = dflt_ms / 5,
                  .time_median_ms = dflt_ms / 4, .time_p10_ms = NAN, .time_p90_ms = NAN,
                  .repetitions = 5, .gflops = NAN, .gbps = NAN, .compile_ms = NAN};
    cr_assert_eq(db_trial_insert(h, &t, &err), MT_OK, "%s", err.msg);
    db_close(h);

    char *logbuf = NULL;
    size_t loglen = 0;
    o.log = open_memstream(&logbuf, &loglen);
    cr_assert_not_null(o.log);
    o.budget.trials = 0;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    fclose(o.log);
    if (getenv("MT_TUNE_TEST_LOG"))
        fputs(logbuf, stderr);
    const tune_m_report *mr = &rep->jobs[0].m[0];
    cr_expect_eq(mr->decision, DB_DECIDED_DEFAULT_KEPT, "decision %s",
                 db_decision_str(mr->decision));
    cr_expect_str_eq(mr->best_key, dflt, "the lucky config won");
    cr_expect_str_eq(mr->challenger_key, lucky);
    /* One set of 10 rounds, or up to two more where a loaded machine made
     * the first set's ratio fall below 1 (undecided). */
    const int rounds = mr->rounds;
    cr_expect(rounds == 10 || rounds == 20 || rounds == 30, "%d rounds", rounds);
    cr_expect(mr->ratio_hi >= 1 && mr->ratio > 1.2, "ratio %g [%g, %g]", mr->ratio,
              mr->ratio_lo, mr->ratio_hi);
    tune_report_free(rep);
    /* One line names both configs, both times and the interval. */
    const char *line = strstr(logbuf, "rejected as noise");
    cr_assert_not_null(line, "no rejection in the log:\n%s", logbuf);
    const char *start = line;
    while (start > logbuf && start[-1] != '\n')
        start--;
    char l[1024];
    snprintf(l, sizeof l, "%.*s", (int)(line - start) + 17, start);
    cr_expect(strstr(l, lucky) && strstr(l, dflt) && strstr(l, "interval [") &&
                  strstr(l, " ms vs the default "),
              "%s", l);
    free(logbuf);

    tt_decision d = tt_read_decision(db);
    cr_expect_str_eq(d.key, dflt);
    cr_expect_eq(d.decision, DB_DECIDED_DEFAULT_KEPT);
    cr_expect_str_eq(d.challenger, lucky);
    cr_expect_eq(d.rounds, rounds);
    cr_expect_geq(d.hi, 1.0);

    /* The lucky trial still has the lowest median: a recompute alone must
     * not promote it over the default that won its confirmation. */
    cr_assert_eq(db_open(db, DB_OPEN_DEFAULT, &h, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(db_winners_recompute(h, 0, 0, NULL, 0, NULL, &err), MT_OK, "%s", err.msg);
    db_close(h);
    cr_expect_str_eq(tt_read_decision(db).key, dflt);

    /* A rerun measures nothing new and keeps the decision. */
    o.log = getenv("MT_TUNE_TEST_LOG") ? stderr : NULL;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    cr_expect_eq(tt_report_measured(rep), 0);
    cr_expect_eq(rep->jobs[0].m[0].decision, DB_DECIDED_DEFAULT_KEPT);
    cr_expect_str_eq(rep->jobs[0].m[0].best_key, dflt);
    tune_report_free(rep);
    cr_expect_eq(tt_read_decision(db).rounds, rounds);
}

Test(tune_confirm, a_truly_faster_config_is_confirmed, .timeout = 300)
{
    char db[256];
    tt_db_path(db, sizeof db, "fast.db");
    static const int64_t ms[] = {1};
    tune_job job;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_job_make(&tspin, "N=256", ms, 1, &job, &err), MT_OK, "%s", err.msg);
    tune_opts o;
    quick_opts(&o, db);
    tune_report *rep = NULL;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    const tune_m_report *mr = &rep->jobs[0].m[0];
    cr_expect_eq(mr->decision, DB_DECIDED_CONFIRMED, "decision %s",
                 db_decision_str(mr->decision));
    cr_expect(strstr(mr->best_key, "SPIN=1,PAD=1"), "%s won", mr->best_key);
    cr_expect(mr->ratio_hi < 1 && mr->ratio < 0.5, "ratio %g [%g, %g]", mr->ratio, mr->ratio_lo,
              mr->ratio_hi);
    tt_decision d = tt_read_decision(db);
    cr_expect_str_eq(d.key, mr->best_key);
    cr_expect_eq(d.decision, DB_DECIDED_CONFIRMED);
    cr_expect_str_eq(d.challenger, mr->best_key);
    cr_expect_eq(d.rounds, 10);
    cr_expect(d.hi < 1);
    tune_report_free(rep);

    /* Without confirmation the lowest median wins, recorded as such. */
    char db2[256];
    tt_db_path(db2, sizeof db2, "off.db");
    o.db_path = db2;
    o.confirm_rounds = -1;
    o.budget.trials = 3;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    cr_expect_eq(rep->jobs[0].m[0].decision, DB_DECIDED_MEDIAN);
    cr_expect_eq(rep->jobs[0].m[0].rounds, 0);
    tune_report_free(rep);
    cr_expect_eq(tt_read_decision(db2).decision, DB_DECIDED_MEDIAN);
}
