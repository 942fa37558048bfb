/* comm_impl.h: what a communicator backend implements (comm.c builds every
 * collective of comm.h on these byte-level primitives, so the reductions,
 * their order and their argument checks live in one place). */
#ifndef MT_COMM_IMPL_H
#define MT_COMM_IMPL_H

#include "comm.h"

typedef struct mt_comm_ops {
    /* Rank r sends send[sdispl[q] .. + scount[q]) bytes to q and receives
     * q's block into recv[rdispl[q] .. + rcount[q]). */
    mt_status (*all_to_all_v)(void *ctx, const void *send, const size_t *scount,
                              const size_t *sdispl, void *recv, const size_t *rcount,
                              const size_t *rdispl, mt_err *err);
    mt_status (*broadcast)(void *ctx, void *buf, size_t bytes, int root, mt_err *err);
    mt_status (*barrier)(void *ctx, mt_err *err);
    void (*close)(void *ctx);
} mt_comm_ops;

struct mt_comm {
    const char *backend;
    const mt_comm_ops *ops;
    void *ctx;
    int rank, size;
};

/* The MPI backend (comm_mpi.c), when built with MPI. */
#ifdef MOETUNE_HAVE_MPI
mt_status mt_comm_mpi_open(mt_comm *c, mt_err *err);
#endif

#endif
