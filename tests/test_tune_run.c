/* test_tune_run.c: end-to-end tuning of small real shapes on the cpu
 * into a fresh database: every trial stored with its status, a winner per
 * M, the default timed, and a second run measuring nothing new. */
#include "test_tune_e2e.h"

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
