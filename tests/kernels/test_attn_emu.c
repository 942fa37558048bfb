/* test_attn_emu.c: the attention families' HIP sources on the emulator,
 * wave64 and wave32, against their C references: test_attn_check.c's
 * checks, built for emu (its own executable, so each stays short). */
#define ATTN_CHECK_EMU 1
#include "test_attn_check.c"
