/* mpi_check.h: what the programs test_ep runs under mpirun (ep_check.c,
 * tp_check.c) share: the rank, the job size and the seed, and the way a
 * rank fails (a message naming them, then an exit that skips MPI's
 * finalization, since the other ranks may be inside a collective). Each
 * program sets check_name first. */
#ifndef MT_TESTS_MPI_CHECK_H
#define MT_TESTS_MPI_CHECK_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

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

#endif
