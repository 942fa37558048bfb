/* cli_ranks.h: the communicators of generate --comm and serve --ranks
 * (cli_ranks.c). */
#ifndef MT_CLI_RANKS_H
#define MT_CLI_RANKS_H

#include <stdbool.h>

#include "comm/comm.h"
#include "common/status.h"

typedef struct cli_ranks {
    mt_comm *world; /* backend's world: who the ranks are */
    mt_comm *xchg;  /* what the runtime exchanges on: world, or NCCL / RCCL over it */
    char device[32]; /* the device this rank opens, when it names the GPU itself */
} cli_ranks;

/* Opens backend's world ("mpi", "self") and, where *device is a GPU
 * ("cuda", "hip", with or without ":N"), NCCL or RCCL over it on that GPU
 * (without ":N", the GPU of this rank's local rank; *device then points at
 * out->device, which names it). Every rank must call it. On failure
 * nothing stays open. */
mt_status cli_ranks_open(const char *backend, const char **device, cli_ranks *out, mt_err *err);
void cli_ranks_close(cli_ranks *r); /* a zeroed cli_ranks is a no-op */

/* Aborts c (mt_comm_abort) ms from now unless cli_ranks_watch_end comes
 * first: a stop that waits on an exchange with a dead rank then ends
 * instead of hanging, and the requests in flight fail with an error their
 * clients see. NULL when no thread could be started (nothing will abort). */
typedef struct cli_ranks_watch cli_ranks_watch;
cli_ranks_watch *cli_ranks_watch_start(mt_comm *c, unsigned ms);
/* Ends the watch (NULL: a no-op); true when it had aborted c. */
bool cli_ranks_watch_end(cli_ranks_watch *w);

#endif
