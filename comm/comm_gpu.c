/* comm_gpu.c: the GPU communicator backends (comm.h): "nccl" (NVIDIA,
 * libnccl.so.2) and "rccl" (AMD, librccl.so.1, the same API), both loaded
 * with dlopen at run time so the project builds and runs where neither is
 * installed; opening one then fails naming the library. Types, enum values
 * and signatures are declared here from NCCL's public API documentation,
 * so no NCCL or RCCL header is needed.
 *
 * Buffers are device memory on the communicator's GPU. Each collective is
 * enqueued on the communicator's stream and then waited for (comm.h's
 * collectives are blocking), so the device runtime is loaded too: the CUDA
 * driver (libcuda.so.1: primary context, stream sync, a small allocation)
 * or HIP (libamdhip64.so). Sums are the library's own reduction: not in
 * rank order (comm.h says what that means for the batch-invariant mode). */
#define _GNU_SOURCE
#include "comm_impl.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- NCCL's API, from its documentation ---------------------------------- */

typedef int nccl_result;                  /* ncclResult_t: ncclSuccess = 0 */
typedef struct nccl_comm_st *nccl_comm;   /* ncclComm_t: opaque */
typedef struct nccl_unique_id {           /* ncclUniqueId: NCCL_UNIQUE_ID_BYTES = 128 */
    char internal[MT_COMM_UNIQUE_ID_BYTES];
} nccl_unique_id;

/* ncclDataType_t and ncclRedOp_t values (the same in RCCL). */
enum { NCCL_UINT8 = 1, NCCL_INT32 = 2, NCCL_FLOAT32 = 7, NCCL_BFLOAT16 = 9 };
enum { NCCL_SUM = 0, NCCL_MAX = 2 };

static const int nccl_dtypes[MT_COMM_DTYPE_COUNT] = {
    [MT_COMM_F32] = NCCL_FLOAT32, [MT_COMM_BF16] = NCCL_BFLOAT16, [MT_COMM_I32] = NCCL_INT32,
    [MT_COMM_U8] = NCCL_UINT8};
static const int nccl_ops[MT_COMM_OP_COUNT] = {[MT_COMM_SUM] = NCCL_SUM,
                                               [MT_COMM_MAX] = NCCL_MAX};

typedef struct nccl_api {
    nccl_result (*GetUniqueId)(nccl_unique_id *);
    nccl_result (*CommInitRank)(nccl_comm *, int nranks, nccl_unique_id, int rank);
    nccl_result (*CommDestroy)(nccl_comm);
    nccl_result (*AllReduce)(const void *, void *, size_t, int, int, nccl_comm, void *);
    nccl_result (*AllGather)(const void *, void *, size_t, int, nccl_comm, void *);
    nccl_result (*ReduceScatter)(const void *, void *, size_t, int, int, nccl_comm, void *);
    nccl_result (*Broadcast)(const void *, void *, size_t, int, int root, nccl_comm, void *);
    nccl_result (*Send)(const void *, size_t, int, int peer, nccl_comm, void *);
    nccl_result (*Recv)(void *, size_t, int, int peer, nccl_comm, void *);
    nccl_result (*GroupStart)(void);
    nccl_result (*GroupEnd)(void);
    const char *(*GetErrorString)(nccl_result);
    /* Optional (NCCL 2.18, RCCL of ROCm 6): mt_comm_split. */
    nccl_result (*CommSplit)(nccl_comm, int color, int key, nccl_comm *, void *config);
    nccl_result (*CommCount)(nccl_comm, int *);
    nccl_result (*CommUserRank)(nccl_comm, int *);
} nccl_api;

/* ---- the device runtime around it ----------------------------------------- */

/* What a collective needs from the GPU's runtime: select the device on
 * this thread, wait for a stream, a few bytes of device memory. */
typedef struct gpu_api {
    int (*sync)(void *state, void *stream);
    int (*alloc)(void *state, void **ptr, size_t bytes);
    void (*release)(void *state, void *ptr);
    int (*select)(void *state);
} gpu_api;

/* CUDA driver (the cuda device backend's primary context, so buffers from
 * dev_alloc on "cuda:N" are valid here). */
typedef struct cu_state {
    int (*cuInit)(unsigned);
    int (*cuDeviceGet)(int *, int);
    int (*cuDevicePrimaryCtxRetain)(void **, int);
    int (*cuDevicePrimaryCtxRelease)(int);
    int (*cuCtxSetCurrent)(void *);
    int (*cuStreamSynchronize)(void *);
    int (*cuMemAlloc)(unsigned long long *, size_t);
    int (*cuMemFree)(unsigned long long);
    int dev;
    void *ctx;
} cu_state;

/* HIP runtime. */
typedef struct hip_state {
    int (*hipSetDevice)(int);
    int (*hipStreamSynchronize)(void *);
    int (*hipMalloc)(void **, size_t);
    int (*hipFree)(void *);
    int device;
} hip_state;

static int cu_select(void *s)
{
    cu_state *c = s;
    return c->cuCtxSetCurrent(c->ctx);
}
static int cu_sync(void *s, void *stream) { return ((cu_state *)s)->cuStreamSynchronize(stream); }
static int cu_alloc(void *s, void **p, size_t n)
{
    unsigned long long d = 0;
    int rc = ((cu_state *)s)->cuMemAlloc(&d, n);
    *p = (void *)(uintptr_t)d;
    return rc;
}
static void cu_release(void *s, void *p)
{
    cu_state *c = s;
    if (p)
        c->cuMemFree((unsigned long long)(uintptr_t)p);
    if (c->ctx)
        c->cuDevicePrimaryCtxRelease(c->dev);
}
static int hip_select(void *s) { return ((hip_state *)s)->hipSetDevice(((hip_state *)s)->device); }
static int hip_sync(void *s, void *stream) { return ((hip_state *)s)->hipStreamSynchronize(stream); }
static int hip_alloc(void *s, void **p, size_t n) { return ((hip_state *)s)->hipMalloc(p, n); }
static void hip_release(void *s, void *p)
{
    if (p)
        ((hip_state *)s)->hipFree(p);
}

/* ---- loading ------------------------------------------------------------- */

typedef struct backend_desc {
    const char *name;       /* "nccl" */
    const char *lib_env;    /* environment variable naming the library's path */
    const char *libs[2];    /* tried in order */
    const char *hint;       /* what to install */
    const char *rt_libs[3]; /* the device runtime */
    const char *rt_env;     /* environment variable naming its path */
    const char *rt_name;
    bool hip;
} backend_desc;

static const backend_desc backends[] = {
    {"nccl", "MOETUNE_NCCL_LIBRARY", {"libnccl.so.2", "libnccl.so"},
     "NVIDIA's NCCL (Debian/Ubuntu: libnccl2)", {"libcuda.so.1", "libcuda.so", NULL},
     "MOETUNE_CUDA_DRIVER_LIBRARY", "the CUDA driver (libcuda.so.1)", false},
    {"rccl", "MOETUNE_RCCL_LIBRARY", {"librccl.so.1", "librccl.so"},
     "AMD's RCCL (ROCm: rccl)", {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"},
     "MOETUNE_HIP_LIBRARY", "the HIP runtime (libamdhip64.so)", true},
};

static const backend_desc *find_backend(const char *name)
{
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (!strcmp(backends[i].name, name))
            return &backends[i];
    return NULL;
}

static void bind(void *lib, const char *name, void *slot, const char **missing)
{
    void *sym = dlsym(lib, name);
    memcpy(slot, &sym, sizeof sym);
    if (!sym && !*missing)
        *missing = name;
}

/* dlopens the backend's library (the environment's path first); NULL with
 * err naming what was tried. Never unloaded (NODELETE): ncclGetUniqueId
 * leaves a bootstrap thread running in the library's code. */
static void *open_library(const backend_desc *b, mt_err *err)
{
    const char *env = getenv(b->lib_env);
    if (env && *env) {
        void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (!h)
            mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s': %s=%s could not be loaded: %s",
                    b->name, b->lib_env, env, dlerror());
        return h;
    }
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(b->libs[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (h)
            return h;
    }
    mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s': %s could not be loaded (%s is not "
            "installed, or set %s to its path)", b->name, b->libs[0], b->hint, b->lib_env);
    return NULL;
}

static mt_status load_nccl(const backend_desc *b, void **lib, nccl_api *a, mt_err *err)
{
    if (!(*lib = open_library(b, err)))
        return MT_E_UNSUPPORTED;
    const char *missing = NULL;
    bind(*lib, "ncclGetUniqueId", &a->GetUniqueId, &missing);
    bind(*lib, "ncclCommInitRank", &a->CommInitRank, &missing);
    bind(*lib, "ncclCommDestroy", &a->CommDestroy, &missing);
    bind(*lib, "ncclAllReduce", &a->AllReduce, &missing);
    bind(*lib, "ncclAllGather", &a->AllGather, &missing);
    bind(*lib, "ncclReduceScatter", &a->ReduceScatter, &missing);
    bind(*lib, "ncclBroadcast", &a->Broadcast, &missing);
    bind(*lib, "ncclSend", &a->Send, &missing);
    bind(*lib, "ncclRecv", &a->Recv, &missing);
    bind(*lib, "ncclGroupStart", &a->GroupStart, &missing);
    bind(*lib, "ncclGroupEnd", &a->GroupEnd, &missing);
    bind(*lib, "ncclGetErrorString", &a->GetErrorString, &missing);
    const char *optional = NULL; /* without them, no split */
    bind(*lib, "ncclCommSplit", &a->CommSplit, &optional);
    bind(*lib, "ncclCommCount", &a->CommCount, &optional);
    bind(*lib, "ncclCommUserRank", &a->CommUserRank, &optional);
    if (optional)
        a->CommSplit = NULL;
    if (missing) {
        dlclose(*lib);
        *lib = NULL;
        return mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s': the loaded library lacks %s "
                       "(send/recv need NCCL 2.7 or later)", b->name, missing);
    }
    return MT_OK;
}

/* ---- the communicator ------------------------------------------------------ */

typedef struct gpu_ctx {
    const backend_desc *b;
    void *lib, *rt_lib;
    nccl_api nc;
    nccl_comm comm;
    const gpu_api *rt;
    union {
        cu_state cu;
        hip_state hip;
    } st;
    void *stream;
    void *scratch;   /* 4 bytes of device memory: the barrier's all-reduce */
    int rank, size;
    int device;      /* the ordinal it was opened on */
} gpu_ctx;

static const gpu_api cu_api = {cu_sync, cu_alloc, cu_release, cu_select};
static const gpu_api hip_api = {hip_sync, hip_alloc, hip_release, hip_select};

static mt_status nccl_check(gpu_ctx *g, nccl_result rc, const char *call, mt_err *err)
{
    if (rc == 0)
        return MT_OK;
    return mt_fail(err, MT_E_DEVICE, "%s: %s: %s (error %d)", g->b->name, call,
                   g->nc.GetErrorString ? g->nc.GetErrorString(rc) : "?", rc);
}

static mt_status rt_check(gpu_ctx *g, int rc, const char *call, mt_err *err)
{
    if (rc == 0)
        return MT_OK;
    return mt_fail(err, MT_E_DEVICE, "%s: %s failed on device %d (error %d)", g->b->name, call,
                   g->b->hip ? g->st.hip.device : g->st.cu.dev, rc);
}

static mt_status load_runtime(gpu_ctx *g, int device, mt_err *err)
{
    const backend_desc *b = g->b;
    const char *env = getenv(b->rt_env);
    if (env && *env)
        g->rt_lib = dlopen(env, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    for (int i = 0; i < 3 && b->rt_libs[i] && !g->rt_lib && !(env && *env); i++)
        g->rt_lib = dlopen(b->rt_libs[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!g->rt_lib && env && *env)
        return mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s': %s=%s could not be loaded",
                       b->name, b->rt_env, env);
    if (!g->rt_lib)
        return mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s': %s could not be loaded",
                       b->name, b->rt_name);
    const char *missing = NULL;
    if (b->hip) {
        hip_state *h = &g->st.hip;
        bind(g->rt_lib, "hipSetDevice", &h->hipSetDevice, &missing);
        bind(g->rt_lib, "hipStreamSynchronize", &h->hipStreamSynchronize, &missing);
        bind(g->rt_lib, "hipMalloc", &h->hipMalloc, &missing);
        bind(g->rt_lib, "hipFree", &h->hipFree, &missing);
        if (missing)
            return mt_fail(err, MT_E_UNSUPPORTED, "%s: %s lacks %s", b->name, b->rt_name,
                           missing);
        h->device = device;
        g->rt = &hip_api;
        return rt_check(g, h->hipSetDevice(device), "hipSetDevice", err);
    }
    cu_state *c = &g->st.cu;
    bind(g->rt_lib, "cuInit", &c->cuInit, &missing);
    bind(g->rt_lib, "cuDeviceGet", &c->cuDeviceGet, &missing);
    bind(g->rt_lib, "cuDevicePrimaryCtxRetain", &c->cuDevicePrimaryCtxRetain, &missing);
    bind(g->rt_lib, "cuDevicePrimaryCtxRelease_v2", &c->cuDevicePrimaryCtxRelease, &missing);
    bind(g->rt_lib, "cuCtxSetCurrent", &c->cuCtxSetCurrent, &missing);
    bind(g->rt_lib, "cuStreamSynchronize", &c->cuStreamSynchronize, &missing);
    bind(g->rt_lib, "cuMemAlloc_v2", &c->cuMemAlloc, &missing);
    bind(g->rt_lib, "cuMemFree_v2", &c->cuMemFree, &missing);
    if (missing)
        return mt_fail(err, MT_E_UNSUPPORTED, "%s: %s lacks %s", b->name, b->rt_name, missing);
    g->rt = &cu_api;
    c->dev = device;
    MT_CHECK(rt_check(g, c->cuInit(0), "cuInit", err));
    MT_CHECK(rt_check(g, c->cuDeviceGet(&c->dev, device), "cuDeviceGet", err));
    MT_CHECK(rt_check(g, c->cuDevicePrimaryCtxRetain(&c->ctx, c->dev),
                      "cuDevicePrimaryCtxRetain", err));
    return rt_check(g, c->cuCtxSetCurrent(c->ctx), "cuCtxSetCurrent", err);
}

/* Selects the device on this thread, runs the enqueued call's result
 * check, then waits for the stream. */
static mt_status finish(gpu_ctx *g, nccl_result rc, const char *call, mt_err *err)
{
    MT_CHECK(nccl_check(g, rc, call, err));
    return rt_check(g, g->rt->sync(&g->st, g->stream), "stream synchronize", err);
}

static mt_status g_select(gpu_ctx *g, mt_err *err)
{
    return rt_check(g, g->rt->select(&g->st), g->b->hip ? "hipSetDevice" : "cuCtxSetCurrent",
                    err);
}

static mt_status g_a2av(void *ctx, const void *send, const size_t *scount, const size_t *sdispl,
                        void *recv, const size_t *rcount, const size_t *rdispl, mt_err *err)
{
    gpu_ctx *g = ctx;
    MT_CHECK(g_select(g, err));
    /* Point-to-point pairs inside one group: NCCL schedules them together,
     * so the order of the calls cannot deadlock. Empty blocks are skipped
     * on both sides (rcount[q] equals what q sends here). */
    nccl_result rc = g->nc.GroupStart();
    if (rc)
        return nccl_check(g, rc, "ncclGroupStart", err);
    nccl_result first = 0;
    for (int q = 0; q < g->size; q++) {
        if (scount[q] && !first)
            first = g->nc.Send((const char *)send + sdispl[q], scount[q], NCCL_UINT8, q, g->comm,
                               g->stream);
        if (rcount[q] && !first)
            first = g->nc.Recv((char *)recv + rdispl[q], rcount[q], NCCL_UINT8, q, g->comm,
                               g->stream);
    }
    rc = g->nc.GroupEnd();
    if (first)
        return nccl_check(g, first, "ncclSend/ncclRecv", err);
    return finish(g, rc, "ncclGroupEnd (all_to_all_v)", err);
}

static mt_status g_bcast(void *ctx, void *buf, size_t bytes, int root, mt_err *err)
{
    gpu_ctx *g = ctx;
    MT_CHECK(g_select(g, err));
    return finish(g, g->nc.Broadcast(buf, buf, bytes, NCCL_UINT8, root, g->comm, g->stream),
                  "ncclBroadcast", err);
}

static mt_status g_barrier(void *ctx, mt_err *err)
{
    gpu_ctx *g = ctx;
    MT_CHECK(g_select(g, err));
    return finish(g, g->nc.AllReduce(g->scratch, g->scratch, 1, NCCL_INT32, NCCL_SUM, g->comm,
                                     g->stream),
                  "ncclAllReduce (barrier)", err);
}

/* The library's type and op (comm.c checked t; op is checked here). */
static mt_status map_op(gpu_ctx *g, mt_comm_op op, int *out, mt_err *err)
{
    if ((unsigned)op >= MT_COMM_OP_COUNT)
        return mt_fail(err, MT_E_INVALID, "%s: op %d is not a comm op", g->b->name, (int)op);
    *out = nccl_ops[op];
    return MT_OK;
}

static mt_status g_all_reduce(void *ctx, const void *send, void *recv, size_t count,
                              mt_comm_dtype t, mt_comm_op op, mt_err *err)
{
    gpu_ctx *g = ctx;
    int nop = 0;
    MT_CHECK(map_op(g, op, &nop, err));
    MT_CHECK(g_select(g, err));
    return finish(g, g->nc.AllReduce(send, recv, count, nccl_dtypes[t], nop, g->comm,
                                     g->stream),
                  "ncclAllReduce", err);
}

static mt_status g_all_gather(void *ctx, const void *send, void *recv, size_t count,
                              mt_comm_dtype t, mt_err *err)
{
    gpu_ctx *g = ctx;
    MT_CHECK(g_select(g, err));
    return finish(g, g->nc.AllGather(send, recv, count, nccl_dtypes[t], g->comm, g->stream),
                  "ncclAllGather", err);
}

static mt_status g_reduce_scatter(void *ctx, const void *send, void *recv, size_t count,
                                  mt_comm_dtype t, mt_comm_op op, mt_err *err)
{
    gpu_ctx *g = ctx;
    int nop = 0;
    MT_CHECK(map_op(g, op, &nop, err));
    MT_CHECK(g_select(g, err));
    return finish(g, g->nc.ReduceScatter(send, recv, count, nccl_dtypes[t], nop, g->comm,
                                         g->stream),
                  "ncclReduceScatter", err);
}

static void g_close(void *ctx)
{
    gpu_ctx *g = ctx;
    if (!g)
        return;
    if (g->rt && g->rt->select(&g->st) == 0 && g->comm)
        g->nc.CommDestroy(g->comm);
    if (g->rt)
        g->rt->release(&g->st, g->scratch);
    if (g->lib)
        dlclose(g->lib);
    if (g->rt_lib)
        dlclose(g->rt_lib);
    free(g);
}

/* The library's and the runtime's state for a communicator on device (the
 * libraries are loaded again: each communicator holds its own references). */
static mt_status g_setup(gpu_ctx *g, int device, mt_err *err)
{
    g->device = device;
    MT_CHECK(load_nccl(g->b, &g->lib, &g->nc, err));
    MT_CHECK(load_runtime(g, device, err));
    return rt_check(g, g->rt->alloc(&g->st, &g->scratch, 4), "allocating 4 bytes", err);
}

static mt_status g_split(void *ctx, int color, int key, mt_comm *child, mt_err *err)
{
    gpu_ctx *g = ctx;
    if (!g->nc.CommSplit)
        return mt_fail(err, MT_E_UNSUPPORTED, "%s: the loaded library has no ncclCommSplit "
                       "(NCCL 2.18 or later, RCCL of ROCm 6)", g->b->name);
    gpu_ctx *n = calloc(1, sizeof *n);
    if (!n)
        return mt_fail(err, MT_E_NOMEM, "%s: split", g->b->name);
    *n = (gpu_ctx){.b = g->b, .stream = g->stream};
    mt_status st = g_setup(n, g->device, err);
    if (st == MT_OK)
        st = g_select(g, err);
    if (st == MT_OK)
        st = nccl_check(g, g->nc.CommSplit(g->comm, color, key, &n->comm, NULL),
                        "ncclCommSplit", err);
    if (st == MT_OK)
        st = nccl_check(n, n->nc.CommCount(n->comm, &n->size), "ncclCommCount", err);
    if (st == MT_OK)
        st = nccl_check(n, n->nc.CommUserRank(n->comm, &n->rank), "ncclCommUserRank", err);
    if (st != MT_OK) {
        g_close(n);
        return st;
    }
    child->ctx = n;
    child->rank = n->rank;
    child->size = n->size;
    return MT_OK;
}

static const mt_comm_ops gpu_ops = {
    .all_to_all_v = g_a2av, .broadcast = g_bcast, .barrier = g_barrier, .close = g_close,
    .split = g_split, .all_reduce = g_all_reduce, .all_gather = g_all_gather,
    .reduce_scatter = g_reduce_scatter};

/* ---- comm.c's entry points --------------------------------------------------- */

bool mt_comm_gpu_backend(const char *backend) { return find_backend(backend) != NULL; }

mt_status mt_comm_gpu_check_library(const char *backend, mt_err *err)
{
    const backend_desc *b = find_backend(backend);
    if (!b)
        return mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s': not a GPU backend", backend);
    void *lib = NULL;
    nccl_api a;
    MT_CHECK(load_nccl(b, &lib, &a, err));
    dlclose(lib);
    return MT_OK;
}

mt_status mt_comm_unique_id_make(const char *backend, mt_comm_unique_id *out, mt_err *err)
{
    const backend_desc *b = find_backend(backend);
    if (!b)
        return mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s': unique ids are for nccl and "
                       "rccl", backend);
    gpu_ctx g = {.b = b};
    MT_CHECK(load_nccl(b, &g.lib, &g.nc, err));
    nccl_unique_id id;
    mt_status st = nccl_check(&g, g.nc.GetUniqueId(&id), "ncclGetUniqueId", err);
    if (st == MT_OK)
        memcpy(out->bytes, id.internal, sizeof out->bytes);
    dlclose(g.lib);
    return st;
}

mt_status mt_comm_gpu_open(mt_comm *c, const char *backend, const mt_comm_gpu_opts *o,
                           mt_err *err)
{
    const backend_desc *b = find_backend(backend);
    if (!b)
        return mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s': not a GPU backend", backend);
    if (!o || o->size < 1 || o->rank < 0 || o->rank >= o->size || o->device < 0)
        return mt_fail(err, MT_E_INVALID, "communicator '%s': rank %d of %d ranks on device %d",
                       backend, o ? o->rank : -1, o ? o->size : 0, o ? o->device : -1);
    if (!o->id && o->size > 1)
        return mt_fail(err, MT_E_INVALID, "communicator '%s': %d ranks need rank 0's unique id "
                       "(mt_comm_unique_id_make, then broadcast it)", backend, o->size);
    gpu_ctx *g = calloc(1, sizeof *g);
    if (!g)
        return mt_fail(err, MT_E_NOMEM, "communicator '%s'", backend);
    *g = (gpu_ctx){.b = b, .stream = o->stream, .rank = o->rank, .size = o->size};
    mt_status st = g_setup(g, o->device, err);
    nccl_unique_id id;
    if (st == MT_OK && o->id)
        memcpy(id.internal, o->id->bytes, sizeof id.internal);
    else if (st == MT_OK) /* one rank: its own id */
        st = nccl_check(g, g->nc.GetUniqueId(&id), "ncclGetUniqueId", err);
    if (st == MT_OK)
        st = nccl_check(g, g->nc.CommInitRank(&g->comm, o->size, id, o->rank),
                        "ncclCommInitRank", err);
    if (st != MT_OK) {
        g_close(g);
        return mt_err_prefix(err, "rank %d of %d on device %d", o->rank, o->size, o->device);
    }
    c->backend = b->name;
    c->ops = &gpu_ops;
    c->ctx = g;
    c->rank = o->rank;
    c->size = o->size;
    c->device_buffers = true;
    c->unordered_sums = true;
    return MT_OK;
}
