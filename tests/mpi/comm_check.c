/* comm_check.c: run under `mpirun -np N` by test_comm. Every rank
 * regenerates every rank's inputs from the seed, runs each collective of
 * comm.h ("mpi" backend) at odd sizes, every dtype and op, and compares the
 * result bitwise with a plain reference reduced in rank order; then splits
 * the job by parity (mt_comm_split) and checks the groups. Prints
 * "comm_check rank R/N ok" and exits 0, or names the first mismatch and
 * exits 1.
 * Usage: mt_comm_check SEED [die]  ("die": rank 1 exits with status 3
 * right after opening, the others wait in a barrier: mpirun must end the
 * job, not hang). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/numeric.h"
#include "common/rng.h"

static int rank, size;
static uint64_t seed;

static void fail(const char *what, size_t i)
{
    fprintf(stderr, "comm_check rank %d/%d: %s differs at element %zu (seed %" PRIu64 ")\n",
            rank, size, what, i, seed);
    exit(1);
}

static void must(mt_status st, const mt_err *err)
{
    if (st != MT_OK) {
        fprintf(stderr, "comm_check rank %d/%d: %s\n", rank, size, err->msg);
        exit(1);
    }
}

/* Rank q's input for a test: random elements of type t. */
static void input(int q, int test, mt_comm_dtype t, size_t n, void *out)
{
    mt_rng r;
    mt_rng_seed(&r, seed * 1000003u + (uint64_t)test * 131u + (uint64_t)q);
    for (size_t i = 0; i < n; i++) {
        uint64_t u = mt_rng_u64(&r);
        float f = (float)((double)(u >> 11) / 9007199254740992.0 * 8.0 - 4.0);
        switch (t) {
        case MT_COMM_F32: ((float *)out)[i] = f; break;
        case MT_COMM_BF16: ((uint16_t *)out)[i] = mt_f32_to_bf16(f); break;
        case MT_COMM_I32: ((int32_t *)out)[i] = (int32_t)(u >> 33) - (1 << 29); break;
        default: ((uint8_t *)out)[i] = (uint8_t)u; break;
        }
    }
}

/* The reference: element i of op over ranks 0..size-1 in rank order. */
static void reference(int test, mt_comm_dtype t, mt_comm_op op, size_t n, void *out)
{
    size_t es = mt_comm_dtype_size(t);
    char *x = malloc(n * es + 1);
    float *f = calloc(n + 1, sizeof *f);
    for (int q = 0; q < size; q++) {
        input(q, test, t, n, x);
        for (size_t i = 0; i < n; i++) {
            if (t == MT_COMM_F32 || t == MT_COMM_BF16) {
                float v = t == MT_COMM_F32 ? ((float *)x)[i]
                                           : mt_bf16_to_f32(((uint16_t *)x)[i]);
                f[i] = q == 0 ? v : op == MT_COMM_SUM ? f[i] + v : fmaxf(f[i], v);
            } else if (t == MT_COMM_I32) {
                int32_t v = ((int32_t *)x)[i], *a = (int32_t *)out + i;
                *a = q == 0 ? v : op == MT_COMM_SUM ? (int32_t)((uint32_t)*a + (uint32_t)v)
                                                    : (v > *a ? v : *a);
            } else {
                uint8_t v = ((uint8_t *)x)[i], *a = (uint8_t *)out + i;
                *a = q == 0 ? v : op == MT_COMM_SUM ? (uint8_t)(*a + v) : (v > *a ? v : *a);
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (t == MT_COMM_F32)
            ((float *)out)[i] = f[i];
        else if (t == MT_COMM_BF16)
            ((uint16_t *)out)[i] = mt_f32_to_bf16(f[i]);
    }
    free(x);
    free(f);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: mt_comm_check SEED [die]\n");
        return 2;
    }
    seed = strtoull(argv[1], NULL, 10);
    mt_comm *c = NULL;
    mt_err err = {0};
    must(mt_comm_open("mpi", &c, &err), &err);
    rank = mt_comm_rank(c), size = mt_comm_size(c);
    if (argc > 2 && !strcmp(argv[2], "die")) {
        if (rank == 1)
            _exit(3);
        must(mt_comm_barrier(c, &err), &err);
        sleep(60); /* never reached when the job is torn down */
        return 0;
    }
    const size_t sizes[] = {0, 1, 7, (size_t)size + 1, 1021};
    int test = 0;
    for (int t = 0; t < MT_COMM_DTYPE_COUNT; t++)
        for (int op = 0; op < MT_COMM_OP_COUNT; op++)
            for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++, test++) {
                size_t n = sizes[k], es = mt_comm_dtype_size((mt_comm_dtype)t);
                char *in = malloc(n * es * (size_t)size + 1), *got = malloc(n * es * (size_t)size + 1),
                     *want = malloc(n * es * (size_t)size + 1);
                /* all_reduce, in place on odd ranks */
                input(rank, test, (mt_comm_dtype)t, n, in);
                reference(test, (mt_comm_dtype)t, (mt_comm_op)op, n, want);
                memset(got, 0xa5, n * es);
                if (rank % 2) {
                    memcpy(got, in, n * es);
                    must(mt_comm_all_reduce(c, got, got, n, (mt_comm_dtype)t, (mt_comm_op)op, &err),
                         &err);
                } else {
                    must(mt_comm_all_reduce(c, in, got, n, (mt_comm_dtype)t, (mt_comm_op)op, &err),
                         &err);
                }
                for (size_t i = 0; i < n * es; i++)
                    if (got[i] != want[i])
                        fail("all_reduce", i / es);
                /* reduce_scatter: n elements per rank of a size*n input */
                int test2 = test + 100000;
                input(rank, test2, (mt_comm_dtype)t, n * (size_t)size, in);
                reference(test2, (mt_comm_dtype)t, (mt_comm_op)op, n * (size_t)size, want);
                memset(got, 0xa5, n * es + 1);
                must(mt_comm_reduce_scatter(c, in, got, n, (mt_comm_dtype)t, (mt_comm_op)op, &err),
                     &err);
                if (n && memcmp(got, want + (size_t)rank * n * es, n * es))
                    fail("reduce_scatter", 0);
                /* all_gather */
                input(rank, test, (mt_comm_dtype)t, n, in);
                must(mt_comm_all_gather(c, in, got, n, (mt_comm_dtype)t, &err), &err);
                for (int q = 0; q < size; q++) {
                    input(q, test, (mt_comm_dtype)t, n, want);
                    if (n && memcmp(got + (size_t)q * n * es, want, n * es))
                        fail("all_gather", (size_t)q * n);
                }
                free(in), free(got), free(want);
            }
    /* all_to_all_v: counts from the seed, zeros included; element values
     * name (sender, receiver, index). */
    {
        size_t *cnt = calloc((size_t)size * (size_t)size, sizeof *cnt);
        mt_rng r;
        mt_rng_seed(&r, seed ^ 0x5eed);
        for (int i = 0; i < size * size; i++)
            cnt[i] = (size_t)mt_rng_below(&r, 5) == 0 ? 0 : (size_t)mt_rng_below(&r, 300);
        size_t *sc = calloc(4 * (size_t)size, sizeof *sc), *sd = sc + size, *rc = sc + 2 * size,
               *rd = sc + 3 * size, st = 0, rt = 0;
        for (int q = 0; q < size; q++) {
            sc[q] = cnt[rank * size + q], sd[q] = st, st += sc[q];
            rc[q] = cnt[q * size + rank], rd[q] = rt, rt += rc[q];
        }
        int32_t *snd = malloc(sizeof *snd * (st + 1)), *rcv = malloc(sizeof *rcv * (rt + 1));
        for (int q = 0; q < size; q++)
            for (size_t i = 0; i < sc[q]; i++)
                snd[sd[q] + i] = (int32_t)((rank * 64 + q) * 1000 + (int)i);
        must(mt_comm_all_to_all_v(c, snd, sc, sd, rcv, rc, rd, MT_COMM_I32, &err), &err);
        for (int q = 0; q < size; q++)
            for (size_t i = 0; i < rc[q]; i++)
                if (rcv[rd[q] + i] != (int32_t)((q * 64 + rank) * 1000 + (int)i))
                    fail("all_to_all_v", rd[q] + i);
        free(snd), free(rcv), free(sc), free(cnt);
    }
    /* broadcast from the last rank */
    {
        float buf[33];
        input(size - 1, 777, MT_COMM_F32, 33, buf);
        float want[33];
        memcpy(want, buf, sizeof buf);
        if (rank != size - 1)
            memset(buf, 0, sizeof buf);
        must(mt_comm_broadcast(c, buf, 33, MT_COMM_F32, size - 1, &err), &err);
        if (memcmp(buf, want, sizeof buf))
            fail("broadcast", 0);
    }
    /* Split by parity, ranked in reverse: each group sums its own ranks
     * and exchanges within itself; an abort of the job reaches the group. */
    {
        mt_comm *g = NULL;
        must(mt_comm_split(c, rank % 2, -rank, &g, &err), &err);
        int gsize = (size - rank % 2 + 1) / 2, want_rank = 0;
        for (int q = rank + 2; q < size; q += 2)
            want_rank++; /* the group's ranks above this one come first */
        if (mt_comm_size(g) != gsize || mt_comm_rank(g) != want_rank)
            fail("split: rank or size", (size_t)mt_comm_rank(g));
        int32_t v = rank, sum = 0, want = 0;
        for (int q = rank % 2; q < size; q += 2)
            want += q;
        must(mt_comm_all_reduce(g, &v, &sum, 1, MT_COMM_I32, MT_COMM_SUM, &err), &err);
        if (sum != want)
            fail("split: all_reduce", 0);
        int32_t *all = malloc(sizeof *all * (size_t)gsize);
        must(mt_comm_all_gather(g, &v, all, 1, MT_COMM_I32, &err), &err);
        for (int q = 0; q < gsize; q++) /* group rank q is job rank (last of the parity) - 2q */
            if (all[q] != (size - 1 - (size - 1 - rank % 2) % 2) - 2 * q)
                fail("split: all_gather", (size_t)q);
        free(all);
        must(mt_comm_barrier(c, &err), &err);
        if (mt_comm_aborted(g))
            fail("split: aborted before the job", 0);
        mt_comm_abort(c);
        if (!mt_comm_aborted(g) || mt_comm_barrier(g, &err) != MT_E_INTERRUPTED)
            fail("split: the job's abort did not reach the group", 0);
        mt_comm_close(g);
    }
    printf("comm_check rank %d/%d ok\n", rank, size);
    mt_comm_close(c);
    return 0;
}
