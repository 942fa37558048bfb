/* test_tune_run_emu.c: the same end-to-end tuning as test_tune_run.c on
 * the emu device (the HIP kernel sources run on the CPU). */
#include "test_tune_e2e.h"

Test(tune_run_emu, gemm_tiny_on_emu_evolve, .timeout = 120)
{
    static const int64_t ms[] = {3};
    tune_and_rerun("emu", "gemm", "tiny", ms, 1, TUNE_EVOLVE, 6);
}

Test(tune_run_emu, rmsnorm_tiny_on_emu_exhaustive, .timeout = 120)
{
    static const int64_t ms[] = {2};
    tune_and_rerun("emu", "rmsnorm", "tiny", ms, 1, TUNE_EXHAUSTIVE, 6);
}

Test(tune_run_emu, moe_gemm_up_tiny_on_emu, .timeout = 120)
{
    static const int64_t ms[] = {4};
    tune_and_rerun("emu", "moe_gemm_up", "tiny", ms, 1, TUNE_RANDOM, 4);
}
