/* test_moe_check_emu64.c: the MoE families against their references on
 * emu:wave64 (see moe_check.h). */
#define MOE_CHECK_SPEC "emu:wave64"
#define MOE_CHECK_SUITE moe_check_emu64
#define MOE_CHECK_CONFIGS 2
#include "moe_check.h"
