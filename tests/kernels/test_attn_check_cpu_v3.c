/* test_attn_check_cpu_v3.c: the attention families' cpu kernels against
 * their references with the code capped at x86-64-v3 (see test_attn_check.c),
 * so the AVX2+FMA paths run even where the CPU has more;
 * skipped on a CPU without x86-64-v3. */
#define ATTN_CHECK_ARCH "x86-64-v3"
#define ATTN_CHECK_SUITE attn_check_cpu_v3
#include "test_attn_check.c"
