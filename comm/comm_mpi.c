/* comm_mpi.c: the "mpi" communicator backend (comm.h) over Open MPI: byte
 * all-to-all-v, broadcast and barrier on MPI_COMM_WORLD. Errors come back
 * as statuses (MPI_ERRORS_RETURN) naming the call and MPI's message. */
#ifdef MOETUNE_HAVE_MPI
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#ifdef __linux__
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>
#endif

#include "comm_impl.h"

/* A rank whose launcher (mpirun, or Open MPI's daemon on another host) dies
 * goes too: nothing can coordinate the job any more. Open MPI itself ends
 * the ranks of a SIGKILLed mpirun when they sleep or wait in a barrier
 * (tried here), but two `serve --ranks 2` ranks were once found polling at
 * 30% of a core 47 minutes after their mpirun had gone (cause not found);
 * the kernel's parent-death signal does not depend on how a rank waits. */
static void die_with_launcher(void)
{
#ifdef __linux__
    pid_t launcher = getppid();
    if (getenv("OMPI_COMM_WORLD_RANK") && launcher > 1) {
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != launcher) /* it died before prctl took effect */
            raise(SIGKILL);
    }
#endif
}

static void finalize_at_exit(void)
{
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
        MPI_Finalize();
}

static mt_status mpi_fail(mt_err *err, int rc, const char *call)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        len = 0;
    msg[len] = 0;
    return mt_fail(err, MT_E_IO, "mpi: %s: %s (error %d)", call, len ? msg : "unknown", rc);
}

static mt_status to_ints(const size_t *v, int n, int *out, const char *what, mt_err *err)
{
    for (int i = 0; i < n; i++) {
        if (v[i] > INT_MAX)
            return mt_fail(err, MT_E_UNSUPPORTED,
                           "mpi: all_to_all_v %s[%d] = %zu bytes exceeds MPI's int counts", what,
                           i, v[i]);
        out[i] = (int)v[i];
    }
    return MT_OK;
}

static mt_status a2av(void *ctx, const void *send, const size_t *scount, const size_t *sdispl,
                      void *recv, const size_t *rcount, const size_t *rdispl, mt_err *err)
{
    int n = *(int *)ctx;
    int *v = malloc(sizeof *v * 4 * (size_t)n);
    if (!v)
        return mt_fail(err, MT_E_NOMEM, "mpi: all_to_all_v");
    mt_status st = to_ints(scount, n, v, "send count", err);
    if (st == MT_OK)
        st = to_ints(sdispl, n, v + n, "send displacement", err);
    if (st == MT_OK)
        st = to_ints(rcount, n, v + 2 * n, "receive count", err);
    if (st == MT_OK)
        st = to_ints(rdispl, n, v + 3 * n, "receive displacement", err);
    if (st == MT_OK) {
        int rc = MPI_Alltoallv(send, v, v + n, MPI_BYTE, recv, v + 2 * n, v + 3 * n, MPI_BYTE,
                               MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            st = mpi_fail(err, rc, "MPI_Alltoallv");
    }
    free(v);
    return st;
}

static mt_status bcast(void *ctx, void *buf, size_t bytes, int root, mt_err *err)
{
    (void)ctx;
    char *p = buf;
    while (bytes) { /* MPI counts are ints */
        int chunk = bytes > (size_t)INT_MAX ? INT_MAX : (int)bytes;
        int rc = MPI_Bcast(p, chunk, MPI_BYTE, root, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, rc, "MPI_Bcast");
        p += chunk, bytes -= (size_t)chunk;
    }
    return MT_OK;
}

static mt_status barrier(void *ctx, mt_err *err)
{
    (void)ctx;
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? MT_OK : mpi_fail(err, rc, "MPI_Barrier");
}

static void close_ctx(void *ctx) { free(ctx); }

static const mt_comm_ops mpi_ops = {.all_to_all_v = a2av, .broadcast = bcast,
                                    .barrier = barrier, .close = close_ctx};

mt_status mt_comm_mpi_open(mt_comm *c, mt_err *err)
{
    int init = 0, fin = 0;
    MPI_Finalized(&fin);
    if (fin)
        return mt_fail(err, MT_E_INVALID, "mpi: MPI was already finalized in this process");
    MPI_Initialized(&init);
    if (!init) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, rc, "MPI_Init_thread");
        atexit(finalize_at_exit);
        die_with_launcher();
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int *size = malloc(sizeof *size);
    if (!size)
        return mt_fail(err, MT_E_NOMEM, "mpi");
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    c->size = *size;
    c->ctx = size;
    c->ops = &mpi_ops;
    return MT_OK;
}
#else
/* Built without MPI: comm.c refuses "mpi". */
typedef int mt_comm_mpi_unused;
#endif
