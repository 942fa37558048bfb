/* cli_ranks.c: the communicators generate and serve run across ranks on.
 * The job's ranks come from mpirun ("mpi"). The runtime's exchanges take
 * device buffers: on cpu and emu devices (host memory) the MPI world
 * itself carries them; on a GPU device each rank takes the GPU of its
 * local rank (unless the device names one) and the exchanges run on NCCL
 * (cuda) or RCCL (hip), opened over the world: rank 0 makes the id, the
 * world broadcasts it. And a watch that aborts the exchanges when a stop
 * waits on them too long (a rank died). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_ranks.h"

/* "cuda", "cuda:N", "hip", "hip:N": the GPU backend's communicator, else NULL. */
static const char *gpu_comm(const char *device)
{
    if (!device)
        return NULL;
    if (!strncmp(device, "cuda", 4) && (!device[4] || device[4] == ':'))
        return "nccl";
    if (!strncmp(device, "hip", 3) && (!device[3] || device[3] == ':'))
        return "rccl";
    return NULL;
}

mt_status cli_ranks_open(const char *backend, const char **device, cli_ranks *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    MT_CHECK(mt_comm_open(backend, &out->world, err));
    out->xchg = out->world;
    const char *gpu = gpu_comm(*device);
    if (!gpu)
        return MT_OK;
    /* The GPU: the device's own ordinal, or this rank's on its host. */
    const char *colon = strchr(*device, ':');
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    int ordinal = colon ? atoi(colon + 1) : local ? atoi(local) : 0;
    if (!colon) {
        snprintf(out->device, sizeof out->device, "%.*s:%d", (int)strlen(*device), *device,
                 ordinal);
        *device = out->device;
    }
    mt_comm_unique_id id;
    memset(&id, 0, sizeof id);
    mt_status st = mt_comm_rank(out->world) == 0 ? mt_comm_unique_id_make(gpu, &id, err) : MT_OK;
    /* Every rank joins the broadcast, rank 0's failure included (a zero
     * id), so none waits for it. */
    int ok = st == MT_OK, all = 0;
    mt_err e2 = MT_ERR_INIT;
    if (mt_comm_all_reduce(out->world, &ok, &all, 1, MT_COMM_I32, MT_COMM_SUM, &e2) != MT_OK &&
        st == MT_OK)
        st = mt_fail(err, MT_E_IO, "%s", e2.msg);
    if (st == MT_OK && all != mt_comm_size(out->world))
        st = mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s': rank 0 could not make its id",
                     gpu);
    if (st == MT_OK)
        st = mt_comm_broadcast(out->world, id.bytes, sizeof id.bytes, MT_COMM_U8, 0, err);
    mt_comm_gpu_opts o = {.device = ordinal, .size = mt_comm_size(out->world),
                          .rank = mt_comm_rank(out->world), .id = &id};
    if (st == MT_OK)
        st = mt_comm_open_gpu(gpu, &o, &out->xchg, err);
    if (st != MT_OK) {
        out->xchg = NULL;
        cli_ranks_close(out);
        return st;
    }
    return MT_OK;
}

void cli_ranks_close(cli_ranks *r)
{
    if (r->xchg != r->world)
        mt_comm_close(r->xchg);
    mt_comm_close(r->world);
    memset(r, 0, sizeof *r);
}

struct cli_ranks_watch {
    mt_comm *c;
    struct timespec deadline; /* CLOCK_REALTIME, for pthread_cond_timedwait */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool ended, aborted;
    pthread_t thread;
};

static void *watch(void *p)
{
    cli_ranks_watch *w = p;
    pthread_mutex_lock(&w->mu);
    int rc = 0;
    while (!w->ended && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&w->cv, &w->mu, &w->deadline);
    if (!w->ended) {
        mt_comm_abort(w->c);
        w->aborted = true;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

cli_ranks_watch *cli_ranks_watch_start(mt_comm *c, unsigned ms)
{
    cli_ranks_watch *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->c = c;
    clock_gettime(CLOCK_REALTIME, &w->deadline);
    w->deadline.tv_sec += ms / 1000;
    w->deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (w->deadline.tv_nsec >= 1000000000L) {
        w->deadline.tv_sec++;
        w->deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, watch, w) != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
        return NULL;
    }
    return w;
}

bool cli_ranks_watch_end(cli_ranks_watch *w)
{
    if (!w)
        return false;
    pthread_mutex_lock(&w->mu);
    w->ended = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    bool aborted = w->aborted;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
    return aborted;
}
