/* fake_nccl.c: a stand-in for NCCL/RCCL and the GPU runtime around them
 * (the CUDA driver's and HIP's few calls comm_gpu.c makes), for one rank on
 * host memory, so test_comm_gpu can run the "nccl" and "rccl" backends
 * where no GPU or library exists. Collectives of one rank are copies;
 * send/recv pairs inside a group are matched in order at group end. It
 * records what it was asked (data type, op, counts) in fake_* globals the
 * test reads with dlsym, and refuses what one rank cannot do. Not
 * thread-safe. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int fake_last_dtype = -1, fake_last_op = -1, fake_syncs, fake_live_comms, fake_live_allocs;
int fake_last_device = -1;
size_t fake_p2p_bytes;

enum { OK = 0, INVALID_ARGUMENT = 4, INVALID_USAGE = 5 };

typedef struct { char internal[128]; } fake_id;

static size_t dsize(int t)
{
    switch (t) {
    case 0: case 1: return 1; /* int8, uint8 */
    case 2: case 3: return 4; /* int32, uint32 */
    case 6: case 9: return 2; /* float16, bfloat16 */
    case 7: return 4;         /* float32 */
    default: return 0;
    }
}

int ncclGetUniqueId(fake_id *id)
{
    memset(id->internal, 0x5a, sizeof id->internal);
    return OK;
}

int ncclCommInitRank(void **comm, int nranks, fake_id id, int rank)
{
    if (nranks != 1 || rank != 0 || id.internal[0] != 0x5a)
        return INVALID_ARGUMENT;
    *comm = malloc(1);
    fake_live_comms++;
    return OK;
}

/* One rank splits into one rank (a color of -1, NCCL_SPLIT_NOCOLOR, into
 * none); the config must be NULL (the parent's). */
int ncclCommSplit(void *comm, int color, int key, void **out, void *config)
{
    (void)key;
    if (!comm || !out || config)
        return INVALID_ARGUMENT;
    *out = NULL;
    if (color < 0)
        return OK;
    *out = malloc(1);
    fake_live_comms++;
    return OK;
}

int ncclCommCount(const void *comm, int *n)
{
    if (!comm)
        return INVALID_ARGUMENT;
    *n = 1;
    return OK;
}

int ncclCommUserRank(const void *comm, int *rank)
{
    if (!comm)
        return INVALID_ARGUMENT;
    *rank = 0;
    return OK;
}

int ncclCommDestroy(void *comm)
{
    free(comm);
    fake_live_comms--;
    return OK;
}

static int copy(const void *send, void *recv, size_t count, int t, int op)
{
    fake_last_dtype = t;
    fake_last_op = op;
    if (!dsize(t) || op < -1 || op > 4)
        return INVALID_ARGUMENT;
    if (count)
        memmove(recv, send, count * dsize(t));
    return OK;
}

int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, void *c, void *st)
{
    (void)c, (void)st;
    return copy(s, r, n, t, op);
}

int ncclAllGather(const void *s, void *r, size_t n, int t, void *c, void *st)
{
    (void)c, (void)st;
    return copy(s, r, n, t, -1);
}

int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, void *c, void *st)
{
    (void)c, (void)st;
    return copy(s, r, n, t, op);
}

int ncclBroadcast(const void *s, void *r, size_t n, int t, int root, void *c, void *st)
{
    (void)c, (void)st;
    return root != 0 ? INVALID_ARGUMENT : copy(s, r, n, t, -1);
}

/* Pending point-to-point calls of the open group. */
static struct { const void *buf; void *rbuf; size_t bytes; } sends[64], recvs[64];
static int n_sends, n_recvs, depth;

int ncclGroupStart(void)
{
    depth++;
    return OK;
}

int ncclSend(const void *b, size_t n, int t, int peer, void *c, void *st)
{
    (void)c, (void)st;
    fake_last_dtype = t;
    if (!depth || peer != 0 || !dsize(t) || n_sends == 64)
        return INVALID_USAGE;
    sends[n_sends].buf = b;
    sends[n_sends++].bytes = n * dsize(t);
    return OK;
}

int ncclRecv(void *b, size_t n, int t, int peer, void *c, void *st)
{
    (void)c, (void)st;
    fake_last_dtype = t;
    if (!depth || peer != 0 || !dsize(t) || n_recvs == 64)
        return INVALID_USAGE;
    recvs[n_recvs].rbuf = b;
    recvs[n_recvs++].bytes = n * dsize(t);
    return OK;
}

int ncclGroupEnd(void)
{
    if (!depth)
        return INVALID_USAGE;
    if (--depth)
        return OK;
    int rc = n_sends == n_recvs ? OK : INVALID_USAGE;
    for (int i = 0; rc == OK && i < n_sends; i++) {
        if (sends[i].bytes != recvs[i].bytes) {
            rc = INVALID_USAGE;
            break;
        }
        memmove(recvs[i].rbuf, sends[i].buf, sends[i].bytes);
        fake_p2p_bytes += sends[i].bytes;
    }
    n_sends = n_recvs = 0;
    return rc;
}

const char *ncclGetErrorString(int rc)
{
    return rc == INVALID_ARGUMENT ? "fake: invalid argument" : "fake: invalid usage";
}

/* ---- the CUDA driver's calls ---- */
int cuInit(unsigned flags) { return flags ? 1 : 0; }
int cuDeviceGet(int *dev, int ordinal)
{
    *dev = ordinal;
    fake_last_device = ordinal;
    return ordinal == 0 ? 0 : 101; /* CUDA_ERROR_INVALID_DEVICE */
}
int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    (void)dev;
    *ctx = &fake_live_comms;
    return 0;
}
int cuDevicePrimaryCtxRelease_v2(int dev) { return dev == 0 ? 0 : 101; }
int cuCtxSetCurrent(void *ctx) { return ctx ? 0 : 201; }
int cuStreamSynchronize(void *stream)
{
    (void)stream;
    fake_syncs++;
    return 0;
}
int cuMemAlloc_v2(unsigned long long *p, size_t n)
{
    *p = (unsigned long long)(uintptr_t)malloc(n);
    fake_live_allocs++;
    return 0;
}
int cuMemFree_v2(unsigned long long p)
{
    free((void *)(uintptr_t)p);
    fake_live_allocs--;
    return 0;
}

/* ---- HIP's ---- */
int hipSetDevice(int d)
{
    fake_last_device = d;
    return d == 0 ? 0 : 101; /* hipErrorInvalidDevice */
}
int hipStreamSynchronize(void *stream) { return cuStreamSynchronize(stream); }
int hipMalloc(void **p, size_t n)
{
    *p = malloc(n);
    fake_live_allocs++;
    return 0;
}
int hipFree(void *p)
{
    free(p);
    fake_live_allocs--;
    return 0;
}
