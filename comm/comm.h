/* comm.h: collectives between the ranks of a multi-device deployment
 * (issue #19): all-reduce, all-gather, reduce-scatter, all-to-all-v,
 * broadcast and barrier, over one of these backends:
 *   "self": one rank, no library (collectives are copies): the runtime's
 *           single-device case, and the reference the others are tested
 *           against;
 *   "mpi":  Open MPI (Debian's libopenmpi), for cpu and emu devices, on one
 *           host or several; launched with `mpirun -np N`. Built when CMake
 *           finds MPI (MOETUNE_HAVE_MPI).
 * NCCL (NVIDIA) and RCCL (AMD), loaded at run time like libcuda, are the
 * GPU backends of the same interface; they are not written yet (no GPU to
 * test them on here) and "nccl"/"rccl" are refused naming that.
 *
 * Buffers are host memory (the memory of cpu and emu devices). Counts are
 * elements of the given dtype. Every collective is blocking and must be
 * called by every rank in the same order with matching arguments.
 *
 * Sums are deterministic: each element is added in rank order 0, 1, ...,
 * N-1 (in float for bf16, rounded once to nearest-even at the end), so
 * every rank gets bitwise the same result, the same on every run, whatever
 * the transport's own reduction algorithm would do. The batch-invariant
 * mode relies on this.
 *
 * Ownership: mt_comm_open returns a communicator the caller closes with
 * mt_comm_close. MPI is initialized by the first "mpi" open in a process
 * (unless the program already did) and finalized at process exit. One
 * thread at a time per communicator. */
#ifndef MT_COMM_H
#define MT_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "../common/status.h"

typedef struct mt_comm mt_comm;

typedef enum mt_comm_dtype {
    MT_COMM_F32 = 0,
    MT_COMM_BF16 = 1,
    MT_COMM_I32 = 2,
    MT_COMM_U8 = 3,
    MT_COMM_DTYPE_COUNT
} mt_comm_dtype;

typedef enum mt_comm_op { MT_COMM_SUM = 0, MT_COMM_MAX = 1, MT_COMM_OP_COUNT } mt_comm_op;

size_t mt_comm_dtype_size(mt_comm_dtype t);

/* True when this build has the backend ("self" always, "mpi" when built
 * with MPI). */
bool mt_comm_backend_available(const char *backend);

/* Opens the world communicator of backend. Unknown or unavailable backends
 * are MT_E_UNSUPPORTED naming them. */
mt_status mt_comm_open(const char *backend, mt_comm **out, mt_err *err);
void mt_comm_close(mt_comm *c);

int mt_comm_rank(const mt_comm *c);
int mt_comm_size(const mt_comm *c);
const char *mt_comm_backend(const mt_comm *c);

/* recv[i] = op over ranks of send[i], i < count. send may equal recv. */
mt_status mt_comm_all_reduce(mt_comm *c, const void *send, void *recv, size_t count,
                             mt_comm_dtype t, mt_comm_op op, mt_err *err);
/* recv[r * count + i] = rank r's send[i]. */
mt_status mt_comm_all_gather(mt_comm *c, const void *send, void *recv, size_t count,
                             mt_comm_dtype t, mt_err *err);
/* recv[i] = op over ranks of their send[rank * count + i]: rank r gets the
 * r-th count-element block of the reduction. */
mt_status mt_comm_reduce_scatter(mt_comm *c, const void *send, void *recv, size_t count,
                                 mt_comm_dtype t, mt_comm_op op, mt_err *err);
/* Rank r sends send[sdispl[q] .. + scount[q]) to rank q, and receives rank
 * q's block for it into recv[rdispl[q] .. + rcount[q]). Counts and
 * displacements are in elements; rcount[q] must equal what q sends to r. */
mt_status mt_comm_all_to_all_v(mt_comm *c, const void *send, const size_t *scount,
                               const size_t *sdispl, void *recv, const size_t *rcount,
                               const size_t *rdispl, mt_comm_dtype t, mt_err *err);
/* buf on every rank becomes root's buf. */
mt_status mt_comm_broadcast(mt_comm *c, void *buf, size_t count, mt_comm_dtype t, int root,
                            mt_err *err);
mt_status mt_comm_barrier(mt_comm *c, mt_err *err);

#endif
