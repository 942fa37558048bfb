/* test_moe_check_emu32.c: the MoE families against their references on
 * emu:wave32 (see moe_check.h). */
#define MOE_CHECK_SPEC "emu:wave32"
#define MOE_CHECK_SUITE moe_check_emu32
#define MOE_CHECK_CONFIGS 1
#include "moe_check.h"
