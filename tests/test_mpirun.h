/* test_mpirun.h: the environment every test's mpirun command line starts
 * with. Open MPI's consent to run as root; ranks that yield the core while
 * they wait for a message (Open MPI spins by default unless the job has
 * more ranks than cores, and a 2-rank job beside another test on 2 cores
 * spun a core away: test_xchg 265 s -> 206 s with it); no LeakSanitizer in
 * the ranks (Open MPI keeps its allocations to exit; the project's own are
 * leak-checked in-process). */
#ifndef MT_TEST_MPIRUN_H
#define MT_TEST_MPIRUN_H

#define MPIRUN_ENV                                                  \
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "    \
    "OMPI_MCA_mpi_yield_when_idle=1 "                               \
    "ASAN_OPTIONS=detect_leaks=0:intercept_tls_get_addr=0 "

/* The multi-rank checks that the sanitizer pass skips (about 5x slower
 * there, with every rank instrumented): each skipped one has a sibling run
 * under the sanitizers on the same host path (the same mode at another rank
 * count, or the same exchange through the server), named where it skips;
 * the Release pass runs them all. */
#ifdef MOETUNE_ASAN
#define MPI_RELEASE_ONLY() cr_skip_test("sanitizer build: the Release pass runs this one")
#else
#define MPI_RELEASE_ONLY() (void)0
#endif

#endif
