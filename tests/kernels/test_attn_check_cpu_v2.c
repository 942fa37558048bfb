/* test_attn_check_cpu_v2.c: the attention families' cpu kernels against
 * their references with the code capped at x86-64-v2 (see test_attn_check.c),
 * so the portable 4-lane paths (SSE, no FMA) run even where the CPU has more;
 * skipped on a CPU without x86-64-v2. */
#define ATTN_CHECK_ARCH "x86-64-v2"
#define ATTN_CHECK_SUITE attn_check_cpu_v2
#include "test_attn_check.c"
