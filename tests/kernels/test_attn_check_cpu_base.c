/* test_attn_check_cpu_base.c: the attention families' cpu kernels against
 * their references with the code capped at plain x86-64 (SSE2, see
 * test_attn_check.c): the portable 4-lane paths as a baseline x86-64 build
 * compiles them. */
#define ATTN_CHECK_ARCH "x86-64"
#define ATTN_CHECK_SUITE attn_check_cpu_base
#include "test_attn_check.c"
