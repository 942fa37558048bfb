/* test_moe_check_cpu.c: the MoE families against their references on
 * cpu (see moe_check.h). */
#define MOE_CHECK_SPEC "cpu"
#define MOE_CHECK_SUITE moe_check_cpu
#define MOE_CHECK_CONFIGS 2
#include "moe_check.h"
