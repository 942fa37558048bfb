/* mpi_check.h: what the programs test_ep and test_xchg run under mpirun
 * (the programs in tests/mpi/) share: the rank, the job size and the seed, the
 * way a rank fails (a message naming them, then an exit that skips MPI's
 * finalization, since the other ranks may be inside a collective), the
 * job's communicator and opening a runtime. Each program sets check_name
 * first. */
#ifndef MT_TESTS_MPI_CHECK_H
#define MT_TESTS_MPI_CHECK_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "comm/comm.h"
#include "model/runtime.h"

static const char *check_name = "check";
static int rank, size;
static uint64_t seed;

__attribute__((noreturn)) static void die(const char *what, const char *msg)
{
    fprintf(stderr, "%s rank %d/%d (seed %" PRIu64 "): %s: %s\n", check_name, rank, size, seed,
            what, msg);
    fflush(NULL);
    _exit(1);
}

/* The job's "mpi" communicator, the rank and size set. */
static inline mt_comm *check_comm(void)
{
    mt_comm *c = NULL;
    mt_err err = MT_ERR_INIT;
    if (mt_comm_open("mpi", &c, &err) != MT_OK)
        die("comm", err.msg);
    rank = mt_comm_rank(c), size = mt_comm_size(c);
    return c;
}

/* The runtime o describes; its communicator's, or the reference (one
 * device) without one. */
static inline model_runtime *check_open(const model_runtime_opts *o, const char *across,
                                        const char *alone)
{
    model_runtime *rt = NULL;
    mt_err err = MT_ERR_INIT;
    if (model_runtime_open(o, &rt, &err) != MT_OK)
        die(o->comm ? across : alone, err.msg);
    return rt;
}

#endif
