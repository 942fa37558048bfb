/* test_bench_read_pieces.c: bench_limits_read_pieces (bench/lib/limits.h),
 * the benchmarks' plain read of a kernel's bytes: on the cpu backend it
 * reads exactly the bytes asked for (every float of each piece, lengths
 * rounded down to its step, pieces at any alignment), checked by
 * its checksum against a plain sum on random pieces of random data, in
 * every read pattern (streams, line prefetch, page touch ahead) and in the
 * one the probe found fastest; it refuses more pieces than it holds,
 * naming the count, and a pattern that does not exist. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/lib/limits.h"
#include "common/rng.h"
#include "device/device.h"

static dev_device *d;
static bench_limits *lim;

static void setup(void)
{
    mt_err err = {0};
    cr_assert_eq(dev_open("cpu", NULL, &d, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(bench_limits_open(d, &lim, &err), MT_OK, "%s", err.msg);
}

static void teardown(void)
{
    bench_limits_close(lim);
    dev_close(d);
}

TestSuite(bench_read_pieces, .init = setup, .fini = teardown);

/* In read pattern pattern, or (-1) the one the probe finds fastest. */
static void check_pieces(int pattern)
{
    uint64_t seed = mt_seed_fresh();
    cr_log_info("seed %llu", (unsigned long long)seed);
    mt_rng r;
    mt_rng_seed(&r, seed);
    mt_err err = {0};
    if (pattern < 0) {
        bench_spread bw;
        cr_assert_eq(bench_limits_bandwidth(lim, 3, &bw, &err), MT_OK, "%s", err.msg);
    } else {
        cr_assert(bench_limits_use_pattern(lim, pattern));
    }
    cr_log_info("pattern %d, step %lld bytes", pattern, (long long)bench_limits_piece_step(lim));
    enum { FLOATS = 1 << 20, N = 37 };
    /* Small integers: every partial sum is exact in float. */
    float *host = malloc(sizeof *host * FLOATS);
    cr_assert(host);
    for (int i = 0; i < FLOATS; i++)
        host[i] = (float)(int)mt_rng_uniform(&r, -8.0f, 8.0f);
    void *buf = NULL;
    cr_assert_eq(dev_alloc(d, sizeof *host * FLOATS, &buf, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(dev_copy_to(d, buf, host, sizeof *host * FLOATS, &err), MT_OK, "%s", err.msg);
    const void *at[N];
    int64_t len[N];
    double want = 0;
    for (int i = 0; i < N; i++) {
        /* Float-aligned starts anywhere, lengths of 0 to 40 KiB, most not
         * a multiple of the step (the read stops at the last whole step). */
        int64_t bytes = i == 0 ? 0 : (int64_t)mt_rng_uniform(&r, 1.0f, 40960.0f);
        int64_t start = 4 * (int64_t)mt_rng_uniform(&r, 0.0f, (float)(FLOATS - 10240 - 1));
        at[i] = (const char *)buf + start;
        len[i] = bytes;
        int64_t step = bench_limits_piece_step(lim);
        for (int64_t k = 0; k < (bytes - bytes % step) / 4; k++)
            want += host[start / 4 + k];
    }
    double ms = -1, sum = NAN;
    cr_assert_eq(bench_limits_read_pieces(lim, at, len, N, &ms, &sum, &err), MT_OK, "%s",
                 err.msg);
    cr_assert(ms > 0, "a read takes time: %g ms", ms);
    cr_assert_float_eq(sum, want, 1e-6, "checksum %.1f, plain sum %.1f", sum, want);
    dev_free(d, buf);
    free(host);
}

Test(bench_read_pieces, reads_every_float_of_each_piece_and_nothing_else_in_every_pattern)
{
    cr_assert_geq(bench_limits_pattern_count(), 2);
    for (int i = 0; i < bench_limits_pattern_count(); i++)
        check_pieces(i);
}

Test(bench_read_pieces, reads_the_same_in_the_probes_fastest_pattern) { check_pieces(-1); }

Test(bench_read_pieces, refuses_a_pattern_that_does_not_exist)
{
    cr_assert_not(bench_limits_use_pattern(lim, -1));
    cr_assert_not(bench_limits_use_pattern(lim, bench_limits_pattern_count()));
}

Test(bench_read_pieces, refuses_more_pieces_than_it_holds)
{
    enum { N = BENCH_MAX_PIECES + 1 };
    const void **at = calloc(N, sizeof *at);
    int64_t *len = calloc(N, sizeof *len);
    cr_assert(at && len);
    mt_err err = {0};
    double ms = -1, sum = -1;
    cr_assert_eq(bench_limits_read_pieces(lim, at, len, N, &ms, &sum, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "8193") && strstr(err.msg, "8192"), "%s", err.msg);
    cr_assert(ms == 0 && sum == 0, "nothing read: ms %g, checksum %g", ms, sum);
    /* No pieces: nothing to read, no error. */
    cr_assert_eq(bench_limits_read_pieces(lim, at, len, 0, &ms, &sum, &err), MT_OK, "%s",
                 err.msg);
    cr_assert(ms == 0 && sum == 0);
    free(at);
    free(len);
}
