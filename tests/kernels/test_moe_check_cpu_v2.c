/* test_moe_check_cpu_v2.c: the MoE families against their references on
 * cpu with the code capped at x86-64-v2, so the scalar paths of the cpu kernels
 * run even where the CPU has more (see moe_check.h); skipped on a CPU
 * without x86-64-v2. */
#define MOE_CHECK_SPEC "cpu"
#define MOE_CHECK_ARCH "x86-64-v2"
#define MOE_CHECK_SUITE moe_check_cpu_v2
#define MOE_CHECK_CONFIGS 1
#include "moe_check.h"
