/* test_tune_run.c: end-to-end tuning of small real shapes on the cpu
 * into a fresh database: every trial stored with its status, a winner per
 * M, the default timed, and a second run measuring nothing new. */
#include <math.h>
#include <unistd.h>

#include "test_tune_e2e.h"
#include "test_tune_families.h"

static const int64_t two_ms[] = {1, 5};

Test(tune_run, gemm_tiny_on_cpu_exhaustive_with_budget, .timeout = 120)
{
    tune_and_rerun("cpu", "gemm", "tiny", two_ms, 2, TUNE_EXHAUSTIVE, 10);
}

Test(tune_run, rmsnorm_tiny_on_cpu_random, .timeout = 120)
{
    tune_and_rerun("cpu", "rmsnorm", "tiny", two_ms, 2, TUNE_RANDOM, 4);
}

Test(tune_run, moe_gemm_up_tiny_on_cpu, .timeout = 120)
{
    static const int64_t ms[] = {1, 8};
    tune_and_rerun("cpu", "moe_gemm_up", "tiny", ms, 2, TUNE_EXHAUSTIVE, 5);
}

Test(tune_run, time_budget_stops_early_but_always_times_the_default, .timeout = 120)
{
    char db[256];
    tt_db_path(db, sizeof db, "budget.db");
    tune_job job;
    static const int64_t ms[] = {1, 2};
    cr_assert_eq(tune_job_make(&tspin, "N=256", ms, 2, &job, NULL), MT_OK);
    tune_opts o;
    tt_opts(&o, "cpu", db);
    o.timing.flush_cache = false;
    o.timing.min_reps = 10;
    o.timing.max_reps = 10;
    o.timing.target_spread = 0;
    o.budget.seconds = 0.02; /* 10 ms per M: less than starting a worker */
    tune_report *rep = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    for (int i = 0; i < 2; i++) {
        const tune_m_report *mr = &rep->jobs[0].m[i];
        cr_assert(mr->has_default && mr->has_winner, "M=%lld", (long long)mr->m);
        cr_assert(mr->measured >= 1 && mr->measured < mr->space,
                  "M=%lld: %d of %d measured within 10 ms", (long long)mr->m, mr->measured,
                  mr->space);
    }
    tune_report_free(rep);
}

/* --compile-only on the cpu stores every config as compiled (no time); a
 * second compile-only run finds them all known, but a timing run does not
 * count a compiled trial as measured: it times every config. */
Test(tune_run, compile_only_trials_are_compiled_and_a_timing_run_measures_them, .timeout = 120)
{
    char db[256];
    tt_db_path(db, sizeof db, "compiled.db");
    const kern_family *f = kern_family_find("rmsnorm");
    static const int64_t ms[] = {4};
    tune_job job;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_job_make(f, "tiny", ms, 1, &job, &err), MT_OK, "%s", err.msg);
    tune_opts o;
    tt_opts(&o, "cpu", db);
    o.compile_only = true;
    tune_report *rep = NULL;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    const int space = rep->jobs[0].m[0].space;
    cr_assert_gt(space, 1);
    cr_assert_eq(rep->jobs[0].m[0].measured, space);
    cr_expect_eq(rep->jobs[0].m[0].counts[DB_TRIAL_COMPILED], space);
    tune_report_free(rep);
    tt_trials *ts = calloc(1, sizeof *ts);
    tt_read_trials(db, "rmsnorm", ts);
    cr_assert_eq(ts->n, space);
    for (int i = 0; i < ts->n; i++) {
        cr_expect_eq(ts->t[i].status, DB_TRIAL_COMPILED, "%s: %s (%s)", ts->t[i].config_key,
                     db_trial_status_str(ts->t[i].status), ts->t[i].error);
        cr_expect(isnan(ts->t[i].median_ms), "%s has a time", ts->t[i].config_key);
    }
    tt_winners *ws = calloc(1, sizeof *ws);
    tt_read_winners(db, "rmsnorm", ws);
    cr_expect_eq(ws->n, 0, "a compile-only run made a winner");

    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    cr_expect_eq(tt_report_measured(rep), 0, "compile-only rerun compiled again");
    tune_report_free(rep);

    o.compile_only = false;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    cr_expect_eq(tt_report_measured(rep), space, "the timing run skipped compiled trials");
    cr_expect(rep->jobs[0].m[0].has_winner);
    tune_report_free(rep);
    tt_read_trials(db, "rmsnorm", ts);
    cr_assert_eq(ts->n, space);
    for (int i = 0; i < ts->n; i++)
        cr_expect(ts->t[i].status == DB_TRIAL_OK || ts->t[i].status == DB_TRIAL_SKIPPED,
                  "%s still %s", ts->t[i].config_key, db_trial_status_str(ts->t[i].status));
    tt_read_winners(db, "rmsnorm", ws);
    cr_expect_eq(ws->n, 1);
    free(ts);
    free(ws);
}

/* --budget 15%: each M measures that share of its own valid space, rounded
 * up, with the default strategy (model). */
Test(tune_run, space_share_budget_measures_that_share_of_each_m, .timeout = 120)
{
    char db[256];
    tt_db_path(db, sizeof db, "share.db");
    tune_job job;
    static const int64_t ms[] = {1, 5};
    cr_assert_eq(tune_job_make(kern_family_find("gemm"), "tiny", ms, 2, &job, NULL), MT_OK);
    tune_opts o;
    tt_opts(&o, "cpu", db);
    cr_assert_eq(o.strategy, TUNE_MODEL, "the default strategy");
    cr_assert_eq(tune_budget_parse("15%", &o.budget, NULL), MT_OK);
    tune_report *rep = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    for (int i = 0; i < 2; i++) {
        const tune_m_report *mr = &rep->jobs[0].m[i];
        int want = (int)ceil(0.15 * mr->space);
        cr_assert(mr->space > 20, "M=%lld: space %d", (long long)mr->m, mr->space);
        cr_assert_eq(mr->measured, want, "M=%lld: %d measured of a space of %d, want %d",
                     (long long)mr->m, mr->measured, mr->space, want);
        cr_assert(mr->has_default && mr->has_winner, "M=%lld", (long long)mr->m);
    }
    tune_report_free(rep);
}

/* seeds_only (the live tuner's first pass): an M next to a tuned one
 * measures its default and that M's winner and runner-ups alone, every
 * other one a config measured there already (compiled: nothing new), and
 * at least one seed; the same run without it searches fresh configs too. */
Test(tune_run, seeds_only_measures_the_default_and_the_neighbours_winners, .timeout = 180)
{
    char db[256];
    tt_db_path(db, sizeof db, "seeds.db");
    const kern_family *f = kern_family_find("gemm");
    tune_opts o;
    tt_opts(&o, "cpu", db);
    cr_assert_eq(tune_budget_parse("15%", &o.budget, NULL), MT_OK);
    cr_assert(o.transfer, "transfer is on by default");
    mt_err err = MT_ERR_INIT;
    tune_report *rep = NULL;
    tune_job job;
    static const int64_t m1[] = {1}, m5[] = {5}, m9[] = {9};
    cr_assert_eq(tune_job_make(f, "tiny", m1, 1, &job, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    cr_assert(rep->jobs[0].m[0].has_winner);
    tune_report_free(rep);

    o.seeds_only = true;
    cr_assert_eq(tune_job_make(f, "tiny", m5, 1, &job, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    const tune_m_report *mr = &rep->jobs[0].m[0];
    char dflt[256]; /* M=5's default: the default may depend on M */
    snprintf(dflt, sizeof dflt, "%s", mr->default_key);
    int want_budget = (int)ceil(0.15 * mr->space);
    cr_assert(mr->measured >= 2 && mr->measured < want_budget,
              "seeds only: %d measured (budget %d)", mr->measured, want_budget);
    tune_report_free(rep);

    o.seeds_only = false;
    cr_assert_eq(tune_job_make(f, "tiny", m9, 1, &job, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    tune_report_free(rep);

    tt_trials *ts = calloc(1, sizeof *ts);
    tt_read_trials(db, "gemm", ts);
    int at5 = 0, fresh9 = 0;
    for (int i = 0; i < ts->n; i++) {
        if (ts->t[i].m == 1)
            continue;
        bool at1 = ts->t[i].m == 5 && !strcmp(ts->t[i].config_key, dflt);
        for (int j = 0; j < ts->n && !at1; j++)
            at1 = ts->t[j].m == 1 && !strcmp(ts->t[j].config_key, ts->t[i].config_key);
        if (ts->t[i].m == 5) {
            at5++;
            cr_assert(at1, "M=5 (seeds only) measured %s, which M=1 never ran",
                      ts->t[i].config_key);
        } else {
            fresh9 += !at1;
        }
    }
    cr_assert_gt(at5, 1, "M=5 measured no seed");
    cr_assert_gt(fresh9, 0, "without seeds_only M=9 searched nothing fresh");
    free(ts);
}

/* seeds_only takes every tuned M's winner, nearest first, and where the
 * neighbours' winners are this M's own default it measures the default
 * alone instead of searching fresh configs (each a compile while
 * serving). gemm's cpu default is BM = min(M, 8) over powers of two, so
 * one-trial tunes at M = 1, 2, 4 and 8 store four different winners
 * (their defaults); M = 16's default is M = 8's. */
Test(tune_run, seeds_only_takes_every_tuned_m_and_no_search_when_they_are_the_default,
     .timeout = 180)
{
    char db[256];
    tt_db_path(db, sizeof db, "seeds_all.db");
    const kern_family *f = kern_family_find("gemm");
    tune_opts o;
    tt_opts(&o, "cpu", db);
    o.budget.trials = 1; /* the default alone: it is the winner */
    mt_err err = MT_ERR_INIT;
    tune_report *rep = NULL;
    tune_job job;
    static const int64_t m8[] = {8}, m4[] = {4}, m2[] = {2}, m1[] = {1}, m16[] = {16},
                         m32[] = {32};
    cr_assert_eq(tune_job_make(f, "tiny", m8, 1, &job, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    cr_assert(rep->jobs[0].m[0].has_winner);
    char dflt8[256];
    snprintf(dflt8, sizeof dflt8, "%s", rep->jobs[0].m[0].best_key);
    cr_assert_str_eq(dflt8, rep->jobs[0].m[0].default_key);
    tune_report_free(rep);

    /* M = 16 next to M = 8 alone: its default is M = 8's winner, so one
     * trial (the default) and no fresh picks. */
    o.budget.trials = 8;
    o.seeds_only = true;
    cr_assert_eq(tune_job_make(f, "tiny", m16, 1, &job, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    cr_assert_str_eq(rep->jobs[0].m[0].default_key, dflt8, "M = 16's default is M = 8's");
    cr_assert_eq(rep->jobs[0].m[0].measured, 1, "M = 16 measured %d configs, not the default "
                 "alone", rep->jobs[0].m[0].measured);
    cr_assert(rep->jobs[0].m[0].has_winner);
    tune_report_free(rep);

    o.seeds_only = false;
    o.budget.trials = 1;
    const int64_t *ms[] = {m4, m2, m1};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(tune_job_make(f, "tiny", ms[i], 1, &job, &err), MT_OK, "%s", err.msg);
        cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
        tune_report_free(rep);
    }
    tt_winners *ws = calloc(1, sizeof *ws);
    tt_read_winners(db, "gemm", ws);
    int distinct = 0;
    for (int i = 0; i < ws->n; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++)
            seen |= !strcmp(ws->w[j].config_key, ws->w[i].config_key);
        distinct += !seen;
    }
    cr_assert_eq(distinct, 4, "winners at M = 1, 2, 4, 8 (and 16): %d distinct", distinct);

    /* M = 32: its default (M = 8's and 16's winner) and the winners at 4, 2
     * and 1 (the two nearest alone would give M = 16's and 8's: one). */
    o.seeds_only = true;
    o.budget.trials = 8;
    cr_assert_eq(tune_job_make(f, "tiny", m32, 1, &job, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(rep->jobs[0].m[0].measured, 4, "M = 32 measured %d", rep->jobs[0].m[0].measured);
    tune_report_free(rep);
    tt_trials *ts = calloc(1, sizeof *ts);
    tt_read_trials(db, "gemm", ts);
    int at32 = 0;
    for (int i = 0; i < ts->n; i++) {
        if (ts->t[i].m != 32)
            continue;
        at32++;
        bool won = false;
        for (int j = 0; j < ws->n && !won; j++)
            won = !strcmp(ws->w[j].config_key, ts->t[i].config_key);
        cr_assert(won, "M = 32 measured %s, no tuned M's winner", ts->t[i].config_key);
    }
    cr_assert_eq(at32, 4);
    free(ts);
    free(ws);
}

/* tune_opts.gate_done: each measurement the gate lets through is closed by
 * exactly one gate_done once the worker has replied (a server's duty cycle
 * times the measurements by them), so gates and dones alternate, every
 * measured trial had one, and none is left open; a gate that says stop
 * ends the run as interrupted, with nothing left open. */
typedef struct gate_log {
    int gates, dones, stop_at;
    bool open, misordered;
    double cpu_ms; /* the worker's CPU time the dones reported */
    int cpu_known;
} gate_log;

static bool log_gate(void *ctx)
{
    gate_log *g = ctx;
    g->misordered |= g->open;
    if (g->stop_at && g->gates + 1 >= g->stop_at)
        return false;
    g->gates++;
    g->open = true;
    return true;
}

static void log_gate_done(void *ctx, double cpu_ms)
{
    gate_log *g = ctx;
    if (cpu_ms >= 0) {
        g->cpu_ms += cpu_ms;
        g->cpu_known++;
    }
    g->misordered |= !g->open;
    g->dones++;
    g->open = false;
}

Test(tune_run, every_gated_measurement_is_closed_by_gate_done, .timeout = 180)
{
    char db[256];
    tt_db_path(db, sizeof db, "gated.db");
    const kern_family *f = kern_family_find("gemm");
    tune_opts o;
    tt_opts(&o, "cpu", db);
    o.budget.trials = 5;
    gate_log g = {0};
    o.gate = log_gate;
    o.gate_done = log_gate_done;
    o.gate_ctx = &g;
    mt_err err = MT_ERR_INIT;
    tune_report *rep = NULL;
    tune_job job;
    static const int64_t ms[] = {1, 7};
    cr_assert_eq(tune_job_make(f, "tiny", ms, 2, &job, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    int measured = rep->jobs[0].m[0].measured + rep->jobs[0].m[1].measured;
    double rep_s = rep->elapsed_s;
    tune_report_free(rep);
    cr_assert(!g.misordered, "a gate while a measurement was open, or a done with none");
    cr_assert(!g.open, "a measurement left open at the end of the run");
    cr_assert_eq(g.gates, g.dones);
    cr_assert_geq(g.gates, measured, "%d gates for %d measured trials", g.gates, measured);
    /* on Linux the worker's CPU time comes with each: more than nothing in all
     * (it verified and timed), less than the run's wall time x the cores */
    cr_assert_eq(g.cpu_known, g.dones, "%d of %d dones without the worker's CPU time",
                 g.dones - g.cpu_known, g.dones);
    cr_assert(g.cpu_ms > 0 && g.cpu_ms < rep_s * 1000 * (double)sysconf(_SC_NPROCESSORS_ONLN),
              "the worker ran %.3f ms of CPU in a %.3f s run", g.cpu_ms, rep_s);

    gate_log s = {.stop_at = 3};
    o.gate_ctx = &s;
    tt_db_path(db, sizeof db, "gated_stop.db");
    o.db_path = db;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_E_INTERRUPTED, "%s", err.msg);
    tune_report_free(rep);
    cr_assert(!s.misordered && !s.open && s.gates == 2 && s.dones == 2,
              "stopped at the third gate: %d gates, %d dones, open %d", s.gates, s.dones,
              s.open);
}
