/* comm_impl.h: what a communicator backend implements (comm.c builds every
 * collective of comm.h on these byte-level primitives, so the reductions,
 * their order and their argument checks live in one place). */
#ifndef MT_COMM_IMPL_H
#define MT_COMM_IMPL_H

#include <stdatomic.h>
#include <stdint.h>

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
    /* Optional (NULL: cannot split): the ranks of the same color, ordered
     * by key; fills child's ctx, rank and size. A collective over ctx. */
    mt_status (*split)(void *ctx, int color, int key, mt_comm *child, mt_err *err);
    /* Optional: NULL builds them on all_to_all_v with host-side rank-ordered
     * reductions (comm.c), which needs host buffers. A backend on device
     * memory provides all three (count elements of t; reduce_scatter's
     * count is per rank). */
    mt_status (*all_reduce)(void *ctx, const void *send, void *recv, size_t count,
                            mt_comm_dtype t, mt_comm_op op, mt_err *err);
    mt_status (*all_gather)(void *ctx, const void *send, void *recv, size_t count,
                            mt_comm_dtype t, mt_err *err);
    mt_status (*reduce_scatter)(void *ctx, const void *send, void *recv, size_t count,
                                mt_comm_dtype t, mt_comm_op op, mt_err *err);
    /* Optional: ends every rank of the job with code (mt_comm_end_job);
     * NULL: this process exits with code. Called from a helper thread. */
    void (*end_job)(int code);
} mt_comm_ops;

struct mt_comm {
    const char *backend;
    const mt_comm_ops *ops;
    void *ctx;
    int rank, size;
    bool device_buffers; /* buffers are device memory (nccl, rccl) */
    bool unordered_sums; /* sums are the library's, not in rank order */
    atomic_int aborted;  /* mt_comm_abort: every collective returns at once */
    atomic_uint timeout_ms; /* mt_comm_set_timeout; 0: none */
    mt_comm *parent;     /* mt_comm_split's source: its abort and timeout apply */
};

/* The MPI backend (comm_mpi.c), when built with MPI. */
#ifdef MOETUNE_HAVE_MPI
mt_status mt_comm_mpi_open(mt_comm *c, mt_err *err);
#endif

/* MT_E_INTERRUPTED when c was aborted, or MT_E_TIMEOUT (c is then
 * aborted) when started_ns was longer ago than c's timeout; else MT_OK.
 * what names the collective. For backends that wait in a loop. */
mt_status mt_comm_wait_check(mt_comm *c, uint64_t started_ns, const char *what, mt_err *err);

/* The GPU backends (comm_gpu.c): whether backend is one of them; loading
 * its library alone (MT_E_UNSUPPORTED naming it when absent); opening one
 * into c. */
bool mt_comm_gpu_backend(const char *backend);
mt_status mt_comm_gpu_check_library(const char *backend, mt_err *err);
mt_status mt_comm_gpu_open(mt_comm *c, const char *backend, const mt_comm_gpu_opts *o,
                           mt_err *err);

#endif
