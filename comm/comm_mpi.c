/* comm_mpi.c: the "mpi" communicator backend (comm.h) over Open MPI: byte
 * all-to-all-v, broadcast and barrier on MPI_COMM_WORLD, or on a group of
 * it (mt_comm_split). Errors come back
 * as statuses (MPI_ERRORS_RETURN) naming the call and MPI's message. Each
 * collective is MPI's nonblocking one and a wait that tests it, so an
 * abort (another thread, a signal) or the communicator's timeout ends the
 * wait: a rank never stays in an exchange for a peer that died. The wait
 * spins (as MPI's own blocking calls do) for its first 10 ms, then sleeps
 * 50 us between tests, so an idle follower stops burning a core. */
#ifdef MOETUNE_HAVE_MPI
#include <limits.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#ifdef __linux__
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>
#endif

#include "comm_impl.h"
#include "common/clock.h"

/* The backend's context: its communicator (abort flag, timeout) and MPI's
 * (MPI_COMM_WORLD, or one of mt_comm_split's, which it frees). */
typedef struct mpi_ctx {
    mt_comm *c;
    int size;
    MPI_Comm comm;
    bool owned;
} mpi_ctx;

/* A wait was given up (abort, timeout): requests stay pending, so
 * MPI_Finalize could block on them; exit skips it (mpirun then ends the
 * job, which is what a rank that gave up wants). */
static atomic_int gave_up;

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
    if (!fin && !atomic_load(&gave_up))
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

/* Waits for r: MT_OK when it completes, else MPI's error, an abort or the
 * timeout (the request is then left pending). */
static mt_status wait_for(mpi_ctx *m, MPI_Request *r, const char *call, mt_err *err)
{
    uint64_t t0 = mt_now_ns();
    for (unsigned long spins = 0;; spins++) {
        int done = 0;
        int rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, rc, call);
        if (done)
            return MT_OK;
        if ((spins & 255) == 0) {
            mt_status st = mt_comm_wait_check(m->c, t0, call, err);
            if (st != MT_OK) {
                atomic_store(&gave_up, 1);
                return st;
            }
            if (mt_now_ns() - t0 > 10000000u) {
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
                spins = 255; /* check again after the next test */
            }
        }
    }
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
    mpi_ctx *m = ctx;
    int n = m->size;
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
        MPI_Request r;
        int rc = MPI_Ialltoallv(send, v, v + n, MPI_BYTE, recv, v + 2 * n, v + 3 * n, MPI_BYTE,
                                m->comm, &r);
        st = rc != MPI_SUCCESS ? mpi_fail(err, rc, "MPI_Ialltoallv")
                               : wait_for(m, &r, "MPI_Ialltoallv", err);
    }
    free(v);
    return st;
}

static mt_status bcast(void *ctx, void *buf, size_t bytes, int root, mt_err *err)
{
    mpi_ctx *m = ctx;
    char *p = buf;
    while (bytes) { /* MPI counts are ints */
        int chunk = bytes > (size_t)INT_MAX ? INT_MAX : (int)bytes;
        MPI_Request r;
        int rc = MPI_Ibcast(p, chunk, MPI_BYTE, root, m->comm, &r);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, rc, "MPI_Ibcast");
        MT_CHECK(wait_for(ctx, &r, "MPI_Ibcast", err));
        p += chunk, bytes -= (size_t)chunk;
    }
    return MT_OK;
}

static mt_status barrier(void *ctx, mt_err *err)
{
    mpi_ctx *m = ctx;
    MPI_Request r;
    int rc = MPI_Ibarrier(m->comm, &r);
    return rc == MPI_SUCCESS ? wait_for(ctx, &r, "MPI_Ibarrier", err)
                             : mpi_fail(err, rc, "MPI_Ibarrier");
}

static void end_job(int code)
{
    atomic_store(&gave_up, 1);
    MPI_Abort(MPI_COMM_WORLD, code);
}

static void close_ctx(void *ctx)
{
    mpi_ctx *m = ctx;
    int fin = 0;
    MPI_Finalized(&fin);
    if (m->owned && !fin)
        MPI_Comm_free(&m->comm);
    free(m);
}

static mt_status split(void *ctx, int color, int key, mt_comm *child, mt_err *err)
{
    mpi_ctx *m = ctx, *n = malloc(sizeof *n);
    if (!n)
        return mt_fail(err, MT_E_NOMEM, "mpi: split");
    int rc = MPI_Comm_split(m->comm, color, key, &n->comm);
    if (rc != MPI_SUCCESS) {
        free(n);
        return mpi_fail(err, rc, "MPI_Comm_split");
    }
    MPI_Comm_set_errhandler(n->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(n->comm, &child->rank);
    MPI_Comm_size(n->comm, &n->size);
    n->c = child;
    n->owned = true;
    child->size = n->size;
    child->ctx = n;
    return MT_OK;
}

static const mt_comm_ops mpi_ops = {.all_to_all_v = a2av, .broadcast = bcast,
                                    .barrier = barrier, .close = close_ctx, .split = split,
                                    .end_job = end_job};

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
    mpi_ctx *m = malloc(sizeof *m);
    if (!m)
        return mt_fail(err, MT_E_NOMEM, "mpi");
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &m->size);
    m->c = c;
    m->comm = MPI_COMM_WORLD;
    m->owned = false;
    c->size = m->size;
    c->ctx = m;
    c->ops = &mpi_ops;
    return MT_OK;
}
#else
/* Built without MPI: comm.c refuses "mpi". */
typedef int mt_comm_mpi_unused;
#endif
