/* test_tune_run.c: end-to-end tuning of small real shapes on the cpu
 * into a fresh database: every trial stored with its status, a winner per
 * M, the default timed, and a second run measuring nothing new. */
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
