/* comm.h: collectives between the ranks of a multi-device deployment
 * (expert and tensor parallelism): all-reduce, all-gather, reduce-scatter,
 * all-to-all-v, broadcast and barrier, over one of these backends:
 *   "self": one rank, no library (collectives are copies): the runtime's
 *           single-device case, and the reference the others are tested
 *           against;
 *   "mpi":  Open MPI (Debian's libopenmpi), for cpu and emu devices, on one
 *           host or several; launched with `mpirun -np N`. Built when CMake
 *           finds MPI (MOETUNE_HAVE_MPI).
 *   "nccl": NVIDIA's NCCL (libnccl.so.2) and
 *   "rccl": AMD's RCCL (librccl.so.1, the same API), both loaded with dlopen
 *           at run time like libcuda, so no header or library is needed to
 *           build; opened with mt_comm_open_gpu (a device and the ranks'
 *           unique id). Where the library is absent every open fails with
 *           MT_E_UNSUPPORTED naming it; MOETUNE_NCCL_LIBRARY /
 *           MOETUNE_RCCL_LIBRARY name a library path to use instead.
 *
 * Buffers are host memory for "self" and "mpi" (the memory of cpu and emu
 * devices) and device memory of the communicator's GPU for "nccl" and
 * "rccl" (mt_comm_device_buffers). Counts are elements of the given dtype.
 * Every collective is blocking (the GPU backends enqueue on their stream
 * and wait for it) and must be called by every rank in the same order with
 * matching arguments.
 *
 * Sums on "self" and "mpi" are deterministic: each element is added in
 * rank order 0, 1, ..., N-1 (in float for bf16, rounded once to
 * nearest-even at the end), so every rank gets bitwise the same result,
 * the same on every run, whatever the transport's own reduction algorithm
 * would do. The batch-invariant mode relies on this. The GPU backends sum
 * with the library's own reduction (ring or tree, chosen by NCCL/RCCL from
 * the topology, message size and NCCL_ALGO/NCCL_PROTO), which is not rank
 * order: results can differ in the last bits from the rank-ordered sum and
 * between deployments (mt_comm_sums_rank_ordered says which). A
 * batch-invariant runtime on them must not use SUM for anything a token's
 * result depends on: it all-gathers the operands (exact: a copy) and adds
 * them in rank order on the device itself. MAX is exact either way (NaN
 * propagation through the GPU libraries' max is not specified).
 *
 * Ownership: mt_comm_open and mt_comm_open_gpu return a communicator the
 * caller closes with mt_comm_close. MPI is initialized by the first "mpi" open in a process
 * (unless the program already did) and finalized at process exit. One
 * thread at a time per communicator. */
#ifndef MT_COMM_H
#define MT_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

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
 * with MPI, "nccl" and "rccl" always: their libraries load at open). */
bool mt_comm_backend_available(const char *backend);

/* Opens the world communicator of backend ("self", "mpi"). Unknown or
 * unavailable backends are MT_E_UNSUPPORTED naming them; "nccl" and "rccl"
 * are MT_E_UNSUPPORTED too: naming their library when it cannot be
 * loaded, else saying to use mt_comm_open_gpu. */
mt_status mt_comm_open(const char *backend, mt_comm **out, mt_err *err);
void mt_comm_close(mt_comm *c); /* NULL is a no-op */

/* ---- the GPU backends: "nccl" and "rccl" ----------------------------- */

#define MT_COMM_UNIQUE_ID_BYTES 128 /* NCCL's ncclUniqueId */

/* Identifies one GPU communicator: rank 0 makes it and hands it to the
 * other ranks over any channel (an "mpi" communicator's broadcast, a file
 * on a shared disk). Opaque bytes. */
typedef struct mt_comm_unique_id {
    unsigned char bytes[MT_COMM_UNIQUE_ID_BYTES];
} mt_comm_unique_id;

/* Makes a new id with backend's library (ncclGetUniqueId). Fails with
 * MT_E_UNSUPPORTED naming the library when it cannot be loaded. */
mt_status mt_comm_unique_id_make(const char *backend, mt_comm_unique_id *out, mt_err *err);

typedef struct mt_comm_gpu_opts {
    int device;  /* GPU ordinal (the N of cuda:N / hip:N) holding this rank's buffers */
    int size;    /* ranks in the communicator (>= 1) */
    int rank;    /* this rank, 0 .. size-1 */
    const mt_comm_unique_id *id; /* rank 0's id, the same on every rank; may be NULL
                                  * only when size is 1 (the rank makes its own) */
    void *stream; /* CUstream / hipStream_t the collectives run on; NULL: the null
                   * stream, the one the cuda and hip devices launch kernels on */
} mt_comm_gpu_opts;

/* Opens rank o->rank of an o->size-rank communicator of backend ("nccl",
 * "rccl") on GPU o->device: every rank calls it with the same id and size
 * (ncclCommInitRank blocks until all have). On NVIDIA the device's
 * primary context (the cuda device backend's) is made current on the
 * calling thread. Errors: MT_E_UNSUPPORTED naming a library that cannot be
 * loaded, MT_E_INVALID for bad options, MT_E_DEVICE with the library's
 * message. */
mt_status mt_comm_open_gpu(const char *backend, const mt_comm_gpu_opts *o, mt_comm **out,
                           mt_err *err);

/* True when buffers are device memory (nccl, rccl). */
bool mt_comm_device_buffers(const mt_comm *c);
/* True when SUM adds in rank order, bitwise the same on every rank and
 * run ("self", "mpi"); false for the GPU libraries' reductions. */
bool mt_comm_sums_rank_ordered(const mt_comm *c);

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
/* A communicator of the ranks of c that pass the same color (>= 0), in
 * the order of key, then of their rank in c (MPI_Comm_split). A
 * collective: every rank of c calls it. The new communicator stops when c
 * is aborted and waits at most c's timeout while its own is 0; close it
 * before c. nccl and rccl split with ncclCommSplit (NCCL 2.18 or later,
 * RCCL of ROCm 6); MT_E_UNSUPPORTED where the library lacks it. */
mt_status mt_comm_split(mt_comm *c, int color, int key, mt_comm **out, mt_err *err);
/* buf on every rank becomes root's buf. */
mt_status mt_comm_broadcast(mt_comm *c, void *buf, size_t count, mt_comm_dtype t, int root,
                            mt_err *err);
mt_status mt_comm_barrier(mt_comm *c, mt_err *err);

/* ---- a rank that fails ---------------------------------------------- */

/* Every collective of c in progress (on "mpi": its wait) or started later
 * returns MT_E_INTERRUPTED: no rank stays in one for a peer that died.
 * The ranks are then out of step; the communicator is good only for
 * closing. Any thread may call it, and a signal handler (one atomic
 * store). On "nccl" and "rccl" a collective already waiting for its stream
 * is not interrupted (the library's own calls block); later ones return. */
void mt_comm_abort(mt_comm *c);
bool mt_comm_aborted(const mt_comm *c);
/* A collective of c that waits longer than ms (0: no limit, the default)
 * returns MT_E_TIMEOUT ("mpi"; the others do not wait for peers, or not in
 * a way this can bound), leaving c as after mt_comm_abort. For exchanges
 * that must complete within a bound, e.g. those inside a forward, where
 * every rank is running the same step. */
void mt_comm_set_timeout(mt_comm *c, unsigned ms);
/* Ends the whole job after grace_ms (in the background; returns at once):
 * "mpi" aborts every rank (MPI_Abort with code), the others end this
 * process with code, which mpirun turns into the end of the job. For a
 * rank whose ranks are out of step (an error inside a forward): the grace
 * lets it tell its clients first. Once per process; later calls do
 * nothing. */
void mt_comm_end_job(mt_comm *c, int code, unsigned grace_ms);

#endif
