/* test_attn_check_cpu_v4.c: the attention families' cpu kernels against
 * their references with the code capped at x86-64-v4 (see test_attn_check.c),
 * so the AVX-512 paths run even where the CPU has more;
 * skipped on a CPU without x86-64-v4. */
#define ATTN_CHECK_ARCH "x86-64-v4"
#define ATTN_CHECK_SUITE attn_check_cpu_v4
#include "test_attn_check.c"
