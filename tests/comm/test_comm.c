/* test_comm.c: the communicator (comm/comm.h). In process: the one-rank
 * "self" backend's collectives are identities and copies, bad arguments and
 * unknown or unbuilt backends are refused by name. Under mpirun (when the
 * build has MPI): mt_comm_check at 2 and 4 ranks checks every collective
 * bitwise against a rank-ordered reference, and a rank that dies ends the
 * whole job with a failure instead of leaving the others waiting. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "comm/comm.h"
#include "common/numeric.h"
#include "common/rng.h"
#include "test_mpirun.h"

Test(comm, self_collectives_are_identities_and_copies)
{
    mt_comm *c = NULL;
    mt_err err = {0};
    cr_assert_eq(mt_comm_open("self", &c, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(mt_comm_rank(c), 0);
    cr_assert_eq(mt_comm_size(c), 1);
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    float x[37], y[37];
    for (int i = 0; i < 37; i++)
        x[i] = (float)mt_rng_below(&r, 1000) - 500.0f;
    memset(y, 0xff, sizeof y);
    cr_assert_eq(mt_comm_all_reduce(c, x, y, 37, MT_COMM_F32, MT_COMM_SUM, &err), MT_OK, "%s",
                 err.msg);
    cr_assert(!memcmp(x, y, sizeof x), "seed %llu", (unsigned long long)seed);
    memset(y, 0xff, sizeof y);
    cr_assert_eq(mt_comm_all_gather(c, x, y, 37, MT_COMM_F32, &err), MT_OK, "%s", err.msg);
    cr_assert(!memcmp(x, y, sizeof x));
    memset(y, 0xff, sizeof y);
    cr_assert_eq(mt_comm_reduce_scatter(c, x, y, 37, MT_COMM_F32, MT_COMM_MAX, &err), MT_OK);
    cr_assert(!memcmp(x, y, sizeof x));
    size_t cnt = 5, d0 = 3, d1 = 30;
    cr_assert_eq(mt_comm_all_to_all_v(c, x, &cnt, &d0, y, &cnt, &d1, MT_COMM_F32, &err), MT_OK);
    cr_assert(!memcmp(x + 3, y + 30, 5 * sizeof *x));
    uint16_t b[3] = {mt_f32_to_bf16(1.5f), mt_f32_to_bf16(-2), 0}, bo[3];
    cr_assert_eq(mt_comm_all_reduce(c, b, bo, 3, MT_COMM_BF16, MT_COMM_SUM, &err), MT_OK);
    cr_assert(!memcmp(b, bo, sizeof b));
    cr_assert_eq(mt_comm_broadcast(c, x, 37, MT_COMM_F32, 0, &err), MT_OK);
    cr_assert_eq(mt_comm_barrier(c, &err), MT_OK);
    mt_comm_close(c);
}

Test(comm, bad_arguments_and_backends_are_refused_by_name)
{
    mt_comm *c = NULL;
    mt_err err = {0};
    cr_assert_eq(mt_comm_open("carrier-pigeon", &c, &err), MT_E_UNSUPPORTED);
    cr_assert(strstr(err.msg, "carrier-pigeon"), "%s", err.msg);
    cr_assert_null(c);
    cr_assert_eq(mt_comm_open("nccl", &c, &err), MT_E_UNSUPPORTED);
    cr_assert(strstr(err.msg, "nccl"), "%s", err.msg);
    cr_assert(mt_comm_backend_available("self"));
    cr_assert_not(mt_comm_backend_available("rccl"));
#ifndef MOETUNE_HAVE_MPI
    cr_assert_eq(mt_comm_open("mpi", &c, &err), MT_E_UNSUPPORTED);
#endif
    cr_assert_eq(mt_comm_open("self", &c, &err), MT_OK);
    float x = 1;
    cr_assert_eq(mt_comm_broadcast(c, &x, 1, MT_COMM_F32, 1, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "root 1"), "%s", err.msg);
    cr_assert_eq(mt_comm_all_reduce(c, &x, &x, 1, (mt_comm_dtype)9, MT_COMM_SUM, &err),
                 MT_E_INVALID);
    cr_assert(strstr(err.msg, "dtype 9"), "%s", err.msg);
    cr_assert_eq(mt_comm_all_reduce(c, &x, &x, 1, MT_COMM_F32, (mt_comm_op)7, &err),
                 MT_E_INVALID);
    mt_comm_close(c);
    mt_comm_close(NULL);
}

#ifdef MOETUNE_HAVE_MPI
/* Runs mt_comm_check under mpirun; root needs Open MPI's consent, and the
 * children run without LeakSanitizer (Open MPI keeps its allocations to
 * exit; comm.c's own are leak-checked by the in-process tests above). */
static int mpirun(int np, const char *mode, char *out, size_t cap)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             MPIRUN_ENV
             "%s --oversubscribe -np %d %s %llu %s 2>&1",
             MPIEXEC, np, MT_COMM_CHECK, (unsigned long long)mt_seed_fresh(), mode);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void every_rank_ok(int np)
{
    static char out[1 << 16];
    int rc = mpirun(np, "", out, sizeof out);
    cr_assert_eq(rc, 0, "mpirun -np %d: exit %d\n%s", np, rc, out);
    for (int r = 0; r < np; r++) {
        char want[64];
        snprintf(want, sizeof want, "comm_check rank %d/%d ok", r, np);
        cr_assert(strstr(out, want), "no '%s' in:\n%s", want, out);
    }
}

Test(comm_mpi, two_ranks_match_the_reference_bitwise, .timeout = 300)
{
    every_rank_ok(2);
}

Test(comm_mpi, four_ranks_match_the_reference_bitwise, .timeout = 300)
{
    every_rank_ok(4);
}

Test(comm_mpi, a_rank_that_dies_ends_the_job, .timeout = 120)
{
    static char out[1 << 16];
    int rc = mpirun(2, "die", out, sizeof out);
    cr_assert_neq(rc, 0, "the job survived a dead rank:\n%s", out);
}
#endif
