/* test_bench_paired.c: bench_paired_fraction (bench/lib/limits.h), the
 * benchmarks' "paired" figure: each call's bandwidth against the limit
 * measured around it, on random calls with a plain reference, calls
 * without a limit skipped, and a drifting machine whose kernel runs at a
 * fixed share of the moment's limit read as that share. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdlib.h>

#include "bench/lib/limits.h"
#include "common/rng.h"

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

Test(bench_paired, ratios_match_a_reference_and_skip_calls_without_a_limit)
{
    uint64_t seed = mt_seed_fresh();
    cr_log_info("seed %llu", (unsigned long long)seed);
    mt_rng r;
    mt_rng_seed(&r, seed);
    enum { N = 36 };
    double bytes[N], ms[N], lim[N], want[N];
    int k = 0;
    for (int i = 0; i < N; i++) {
        bytes[i] = mt_rng_uniform(&r, 1e6f, 2e8f);
        ms[i] = mt_rng_uniform(&r, 0.05f, 9.0f);
        lim[i] = i % 5 == 3 ? 0 : mt_rng_uniform(&r, 10.0f, 90.0f);
        if (lim[i] > 0)
            want[k++] = bytes[i] / ms[i] / 1e6 / lim[i];
    }
    qsort(want, (size_t)k, sizeof *want, cmp);
    bench_spread s;
    bench_paired_fraction(bytes, ms, lim, N, &s);
    cr_assert_eq(s.reps, k, "calls without a limit are skipped");
    /* k = 29: the median is order statistic 14, p10 between 2 and 3. */
    cr_assert_float_eq(s.median, want[14], 1e-9 * want[14]);
    cr_assert_float_eq(s.p10, want[2] + (want[3] - want[2]) * 0.8, 1e-9 * want[3]);
    cr_assert_float_eq(s.max, want[k - 1], 1e-9 * want[k - 1]);
    cr_assert(s.p10 <= s.median && s.median <= s.p90);

    bench_spread none;
    bench_paired_fraction(bytes, ms, (double[N]){0}, N, &none);
    cr_assert_eq(none.reps, 0);
    cr_assert_eq(none.median, 0);
}

/* The limit drifts from 20 to 80 GB/s and the kernel always reads at 0.9
 * of it: the paired median is 0.9, where its median against the best
 * sample reads far lower. */
Test(bench_paired, a_kernel_at_a_share_of_a_drifting_limit_reads_as_that_share)
{
    enum { N = 40 };
    double bytes[N], ms[N], lim[N], gbs[N];
    for (int i = 0; i < N; i++) {
        lim[i] = 20.0 + 60.0 * i / (N - 1);
        bytes[i] = 5e7;
        ms[i] = bytes[i] / (0.9 * lim[i] * 1e6);
        gbs[i] = bytes[i] / (ms[i] * 1e6);
    }
    bench_spread s, g;
    bench_paired_fraction(bytes, ms, lim, N, &s);
    cr_assert_float_eq(s.median, 0.9, 1e-9);
    cr_assert_float_eq(s.p10, 0.9, 1e-9);
    cr_assert_float_eq(s.p90, 0.9, 1e-9);
    bench_spread_of(gbs, N, &g);
    cr_assert_lt(g.median / 80.0, 0.6);
}
