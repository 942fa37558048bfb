/* test_moe_check_cpu_v3.c: the MoE families against their references on
 * cpu with the code capped at x86-64-v3, so the AVX2 paths of the cpu kernels
 * run even where the CPU has more (see moe_check.h); skipped on a CPU
 * without x86-64-v3. */
#define MOE_CHECK_SPEC "cpu"
#define MOE_CHECK_ARCH "x86-64-v3"
#define MOE_CHECK_SUITE moe_check_cpu_v3
#define MOE_CHECK_CONFIGS 1
#include "moe_check.h"
