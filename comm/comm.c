/* comm.c: the collectives of comm.h on top of a backend's all-to-all-v,
 * broadcast and barrier (comm_impl.h), with rank-ordered reductions, or
 * on the backend's own collectives where it has them (the GPU backends,
 * comm_gpu.c); and the one-rank "self" backend. */
#include "comm_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/numeric.h"
#include "common/clock.h"

static const size_t dtype_sizes[MT_COMM_DTYPE_COUNT] = {4, 2, 4, 1};

size_t mt_comm_dtype_size(mt_comm_dtype t)
{
    return t >= 0 && t < MT_COMM_DTYPE_COUNT ? dtype_sizes[t] : 0;
}

/* ---- self ------------------------------------------------------------- */

static mt_status self_a2av(void *ctx, const void *send, const size_t *scount,
                           const size_t *sdispl, void *recv, const size_t *rcount,
                           const size_t *rdispl, mt_err *err)
{
    (void)ctx;
    if (scount[0] != rcount[0])
        return mt_fail(err, MT_E_INVALID, "all_to_all_v: rank 0 sends %zu bytes to itself "
                       "and expects %zu", scount[0], rcount[0]);
    if (scount[0])
        memmove((char *)recv + rdispl[0], (const char *)send + sdispl[0], scount[0]);
    return MT_OK;
}

static mt_status self_bcast(void *ctx, void *buf, size_t bytes, int root, mt_err *err)
{
    (void)ctx, (void)buf, (void)bytes, (void)root, (void)err;
    return MT_OK;
}

static mt_status self_barrier(void *ctx, mt_err *err)
{
    (void)ctx, (void)err;
    return MT_OK;
}

static void self_close(void *ctx) { (void)ctx; }

static mt_status self_split(void *ctx, int color, int key, mt_comm *child, mt_err *err)
{
    (void)ctx, (void)color, (void)key, (void)err;
    child->rank = 0;
    child->size = 1;
    return MT_OK;
}

static const mt_comm_ops self_ops = {.all_to_all_v = self_a2av, .broadcast = self_bcast,
                                     .barrier = self_barrier, .close = self_close,
                                     .split = self_split};

/* ---- open / close ------------------------------------------------------- */

bool mt_comm_backend_available(const char *backend)
{
    if (!strcmp(backend, "self"))
        return true;
#ifdef MOETUNE_HAVE_MPI
    if (!strcmp(backend, "mpi"))
        return true;
#endif
    if (mt_comm_gpu_backend(backend)) {
        mt_err e = MT_ERR_INIT;
        return mt_comm_gpu_check_library(backend, &e) == MT_OK;
    }
    return false;
}

mt_status mt_comm_open(const char *backend, mt_comm **out, mt_err *err)
{
    *out = NULL;
    mt_comm *c = calloc(1, sizeof *c);
    if (!c)
        return mt_fail(err, MT_E_NOMEM, "communicator");
    mt_status st = MT_OK;
    if (!strcmp(backend, "self")) {
        *c = (mt_comm){.backend = "self", .ops = &self_ops, .rank = 0, .size = 1};
    } else if (!strcmp(backend, "mpi")) {
#ifdef MOETUNE_HAVE_MPI
        c->backend = "mpi";
        st = mt_comm_mpi_open(c, err);
#else
        st = mt_fail(err, MT_E_UNSUPPORTED,
                     "communicator 'mpi': this build has no MPI (install libopenmpi-dev and "
                     "reconfigure)");
#endif
    } else if (mt_comm_gpu_backend(backend)) {
        st = mt_comm_gpu_check_library(backend, err);
        if (st == MT_OK)
            st = mt_fail(err, MT_E_UNSUPPORTED,
                         "communicator '%s' works on device buffers: open it with "
                         "mt_comm_open_gpu (a GPU, the ranks and rank 0's unique id); cpu and "
                         "emu devices use 'mpi'", backend);
    } else {
        st = mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s': unknown (self, mpi, nccl, rccl)",
                     backend);
    }
    if (st != MT_OK) {
        free(c);
        return st;
    }
    *out = c;
    return MT_OK;
}

mt_status mt_comm_open_gpu(const char *backend, const mt_comm_gpu_opts *o, mt_comm **out,
                           mt_err *err)
{
    *out = NULL;
    if (!backend || !mt_comm_gpu_backend(backend))
        return mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s': GPU backends are nccl and rccl",
                       backend ? backend : "(null)");
    mt_comm *c = calloc(1, sizeof *c);
    if (!c)
        return mt_fail(err, MT_E_NOMEM, "communicator");
    mt_status st = mt_comm_gpu_open(c, backend, o, err);
    if (st != MT_OK) {
        free(c);
        return st;
    }
    *out = c;
    return MT_OK;
}

void mt_comm_close(mt_comm *c)
{
    if (!c)
        return;
    c->ops->close(c->ctx);
    free(c);
}

mt_status mt_comm_split(mt_comm *c, int color, int key, mt_comm **out, mt_err *err)
{
    *out = NULL;
    if (color < 0)
        return mt_fail(err, MT_E_INVALID, "split: color %d (colors are >= 0)", color);
    if (!c->ops->split)
        return mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s' cannot split into groups",
                       c->backend);
    mt_comm *n = calloc(1, sizeof *n);
    if (!n)
        return mt_fail(err, MT_E_NOMEM, "split");
    n->backend = c->backend;
    n->ops = c->ops;
    n->device_buffers = c->device_buffers;
    n->unordered_sums = c->unordered_sums;
    n->parent = c;
    mt_status st = c->ops->split(c->ctx, color, key, n, err);
    if (st != MT_OK) {
        free(n);
        return mt_err_prefix(err, "split (color %d)", color);
    }
    *out = n;
    return MT_OK;
}

int mt_comm_rank(const mt_comm *c) { return c->rank; }
int mt_comm_size(const mt_comm *c) { return c->size; }
const char *mt_comm_backend(const mt_comm *c) { return c->backend; }
bool mt_comm_device_buffers(const mt_comm *c) { return c->device_buffers; }
bool mt_comm_sums_rank_ordered(const mt_comm *c) { return !c->unordered_sums; }

/* ---- reductions ------------------------------------------------------- */

/* acc[i] = op(acc[i], x[i]) in the element type; bf16 accumulates in the
 * float array facc and is rounded by finish_bf16. */
static void reduce_into(mt_comm_dtype t, mt_comm_op op, void *acc, float *facc, const void *x,
                        size_t n, bool first)
{
    switch (t) {
    case MT_COMM_F32: {
        float *a = acc;
        const float *b = x;
        for (size_t i = 0; i < n; i++)
            a[i] = first ? b[i]
                   : op == MT_COMM_SUM ? a[i] + b[i]
                   : (isnan(a[i]) || isnan(b[i])) ? NAN
                                                   : (b[i] > a[i] ? b[i] : a[i]);
        break;
    }
    case MT_COMM_BF16: {
        const uint16_t *b = x;
        for (size_t i = 0; i < n; i++) {
            float v = mt_bf16_to_f32(b[i]);
            facc[i] = first ? v
                      : op == MT_COMM_SUM ? facc[i] + v
                      : (isnan(facc[i]) || isnan(v)) ? NAN
                                                     : (v > facc[i] ? v : facc[i]);
        }
        break;
    }
    case MT_COMM_I32: {
        int32_t *a = acc;
        const int32_t *b = x;
        for (size_t i = 0; i < n; i++)
            a[i] = first ? b[i]
                   : op == MT_COMM_SUM ? (int32_t)((uint32_t)a[i] + (uint32_t)b[i])
                                       : (b[i] > a[i] ? b[i] : a[i]);
        break;
    }
    default: {
        uint8_t *a = acc;
        const uint8_t *b = x;
        for (size_t i = 0; i < n; i++)
            a[i] = first ? b[i]
                   : op == MT_COMM_SUM ? (uint8_t)(a[i] + b[i])
                                       : (b[i] > a[i] ? b[i] : a[i]);
        break;
    }
    }
}

static mt_status check(const mt_comm *c, const char *what, mt_comm_dtype t, int op,
                       mt_err *err)
{
    if (!c)
        return mt_fail(err, MT_E_INVALID, "%s: no communicator", what);
    if (mt_comm_aborted(c))
        return mt_fail(err, MT_E_INTERRUPTED, "%s: communicator '%s' was aborted (a rank failed "
                       "or the job is ending)", what, c->backend);
    if (!mt_comm_dtype_size(t))
        return mt_fail(err, MT_E_INVALID, "%s: dtype %d is not a comm dtype", what, (int)t);
    if (op >= 0 && op >= MT_COMM_OP_COUNT)
        return mt_fail(err, MT_E_INVALID, "%s: op %d is not a comm op", what, op);
    return MT_OK;
}

/* Block q of count elements split as evenly as the ranks allow. */
static void split(size_t count, int n, int q, size_t *off, size_t *len)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    *off = (size_t)q * base + ((size_t)q < rem ? (size_t)q : rem);
    *len = base + ((size_t)q < rem);
}

/* Reduce-scatter of uneven blocks: rank r receives every rank's block r
 * and reduces it in rank order into out (blk elements). */
static mt_status rs_blocks(mt_comm *c, const void *send, size_t count, mt_comm_dtype t,
                           mt_comm_op op, void *out, size_t *out_len, mt_err *err)
{
    int n = c->size, r = c->rank;
    size_t es = mt_comm_dtype_size(t), roff, rlen;
    split(count, n, r, &roff, &rlen);
    size_t *v = calloc(4 * (size_t)n, sizeof *v);
    char *tmp = malloc(rlen * es * (size_t)n + 1);
    float *facc = t == MT_COMM_BF16 ? malloc(rlen * sizeof *facc + 1) : NULL;
    if (!v || !tmp || (t == MT_COMM_BF16 && !facc)) {
        free(v), free(tmp), free(facc);
        return mt_fail(err, MT_E_NOMEM, "reduce: %zu elements x %d ranks", rlen, n);
    }
    size_t *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n;
    for (int q = 0; q < n; q++) {
        size_t off, len;
        split(count, n, q, &off, &len);
        sc[q] = len * es, sd[q] = off * es;
        rc[q] = rlen * es, rd[q] = (size_t)q * rlen * es;
    }
    mt_status st = c->ops->all_to_all_v(c->ctx, send, sc, sd, tmp, rc, rd, err);
    if (st == MT_OK) {
        for (int q = 0; q < n; q++)
            reduce_into(t, op, out, facc, tmp + (size_t)q * rlen * es, rlen, q == 0);
        if (t == MT_COMM_BF16)
            for (size_t i = 0; i < rlen; i++)
                ((uint16_t *)out)[i] = mt_f32_to_bf16(facc[i]);
    }
    *out_len = rlen;
    free(v), free(tmp), free(facc);
    return st;
}

mt_status mt_comm_all_reduce(mt_comm *c, const void *send, void *recv, size_t count,
                             mt_comm_dtype t, mt_comm_op op, mt_err *err)
{
    MT_CHECK(check(c, "all_reduce", t, (int)op, err));
    if (c->ops->all_reduce) {
        mt_status st = c->ops->all_reduce(c->ctx, send, recv, count, t, op, err);
        return st == MT_OK ? st : mt_err_prefix(err, "all_reduce of %zu elements", count);
    }
    int n = c->size, r = c->rank;
    size_t es = mt_comm_dtype_size(t), roff, rlen;
    split(count, n, r, &roff, &rlen);
    char *mine = malloc(rlen * es + 1);
    size_t *v = calloc(4 * (size_t)n, sizeof *v);
    if (!mine || !v) {
        free(mine), free(v);
        return mt_fail(err, MT_E_NOMEM, "all_reduce: %zu elements", count);
    }
    /* Phase 1: rank r reduces block r in rank order; phase 2: every rank
     * sends its reduced block to all. Each element is reduced by one rank,
     * in one order, so all ranks hold bitwise the same result. */
    mt_status st = rs_blocks(c, send, count, t, op, mine, &rlen, err);
    if (st == MT_OK) {
        size_t *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n;
        for (int q = 0; q < n; q++) {
            size_t off, len;
            split(count, n, q, &off, &len);
            sc[q] = rlen * es, sd[q] = 0;
            rc[q] = len * es, rd[q] = off * es;
        }
        st = c->ops->all_to_all_v(c->ctx, mine, sc, sd, recv, rc, rd, err);
    }
    free(mine), free(v);
    return st == MT_OK ? st : mt_err_prefix(err, "all_reduce of %zu elements", count);
}

mt_status mt_comm_reduce_scatter(mt_comm *c, const void *send, void *recv, size_t count,
                                 mt_comm_dtype t, mt_comm_op op, mt_err *err)
{
    MT_CHECK(check(c, "reduce_scatter", t, (int)op, err));
    if (c->ops->reduce_scatter) {
        mt_status st = c->ops->reduce_scatter(c->ctx, send, recv, count, t, op, err);
        return st == MT_OK ? st : mt_err_prefix(err, "reduce_scatter of %zu elements", count);
    }
    /* count elements per rank: blocks are equal, so split() of the whole
     * gives exactly rank r's block. */
    size_t len;
    mt_status st = rs_blocks(c, send, count * (size_t)c->size, t, op, recv, &len, err);
    return st == MT_OK ? st : mt_err_prefix(err, "reduce_scatter of %zu elements", count);
}

mt_status mt_comm_all_gather(mt_comm *c, const void *send, void *recv, size_t count,
                             mt_comm_dtype t, mt_err *err)
{
    MT_CHECK(check(c, "all_gather", t, -1, err));
    if (c->ops->all_gather) {
        mt_status st = c->ops->all_gather(c->ctx, send, recv, count, t, err);
        return st == MT_OK ? st : mt_err_prefix(err, "all_gather of %zu elements", count);
    }
    int n = c->size;
    size_t es = mt_comm_dtype_size(t);
    size_t *v = calloc(4 * (size_t)n, sizeof *v);
    if (!v)
        return mt_fail(err, MT_E_NOMEM, "all_gather");
    size_t *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n;
    for (int q = 0; q < n; q++) {
        sc[q] = count * es, sd[q] = 0;
        rc[q] = count * es, rd[q] = (size_t)q * count * es;
    }
    mt_status st = c->ops->all_to_all_v(c->ctx, send, sc, sd, recv, rc, rd, err);
    free(v);
    return st == MT_OK ? st : mt_err_prefix(err, "all_gather of %zu elements", count);
}

mt_status mt_comm_all_to_all_v(mt_comm *c, const void *send, const size_t *scount,
                               const size_t *sdispl, void *recv, const size_t *rcount,
                               const size_t *rdispl, mt_comm_dtype t, mt_err *err)
{
    MT_CHECK(check(c, "all_to_all_v", t, -1, err));
    int n = c->size;
    size_t es = mt_comm_dtype_size(t);
    size_t *v = calloc(4 * (size_t)n, sizeof *v);
    if (!v)
        return mt_fail(err, MT_E_NOMEM, "all_to_all_v");
    for (int q = 0; q < n; q++) {
        v[q] = scount[q] * es, v[n + q] = sdispl[q] * es;
        v[2 * n + q] = rcount[q] * es, v[3 * n + q] = rdispl[q] * es;
    }
    mt_status st = c->ops->all_to_all_v(c->ctx, send, v, v + n, recv, v + 2 * n, v + 3 * n, err);
    free(v);
    return st;
}

mt_status mt_comm_broadcast(mt_comm *c, void *buf, size_t count, mt_comm_dtype t, int root,
                            mt_err *err)
{
    MT_CHECK(check(c, "broadcast", t, -1, err));
    if (root < 0 || root >= c->size)
        return mt_fail(err, MT_E_INVALID, "broadcast: root %d of %d ranks", root, c->size);
    return c->ops->broadcast(c->ctx, buf, count * mt_comm_dtype_size(t), root, err);
}

mt_status mt_comm_barrier(mt_comm *c, mt_err *err)
{
    MT_CHECK(check(c, "barrier", MT_COMM_U8, -1, err));
    return c->ops->barrier(c->ctx, err);
}

/* ---- a rank that fails ------------------------------------------------------ */

void mt_comm_abort(mt_comm *c)
{
    if (c)
        atomic_store(&c->aborted, 1);
}

bool mt_comm_aborted(const mt_comm *c)
{
    return c && (atomic_load(&c->aborted) || mt_comm_aborted(c->parent));
}

void mt_comm_set_timeout(mt_comm *c, unsigned ms) { atomic_store(&c->timeout_ms, ms); }

mt_status mt_comm_wait_check(mt_comm *c, uint64_t started_ns, const char *what, mt_err *err)
{
    if (mt_comm_aborted(c))
        return mt_fail(err, MT_E_INTERRUPTED, "%s: communicator '%s' was aborted (a rank failed "
                       "or the job is ending)", what, c->backend);
    unsigned ms = atomic_load(&c->timeout_ms);
    for (const mt_comm *p = c->parent; !ms && p; p = p->parent)
        ms = atomic_load(&p->timeout_ms);
    if (ms && mt_now_ns() - started_ns > (uint64_t)ms * 1000000u) {
        atomic_store(&c->aborted, 1);
        return mt_fail(err, MT_E_TIMEOUT, "%s: not every rank joined within %u ms (one died, "
                       "hangs, or left the step)", what, ms);
    }
    return MT_OK;
}

typedef struct end_job_arg {
    void (*end)(int code);
    int code;
    unsigned grace_ms;
} end_job_arg;

__attribute__((noreturn)) static void end_now(end_job_arg a)
{
    struct timespec ts = {.tv_sec = a.grace_ms / 1000,
                          .tv_nsec = (long)(a.grace_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
    if (a.end)
        a.end(a.code);
    _exit(a.code);
}

static void *end_job_thread(void *p)
{
    end_job_arg a = *(end_job_arg *)p;
    free(p);
    end_now(a);
}

void mt_comm_end_job(mt_comm *c, int code, unsigned grace_ms)
{
    static atomic_int started;
    if (!c || atomic_exchange(&started, 1))
        return;
    end_job_arg *a = malloc(sizeof *a);
    pthread_t t;
    pthread_attr_t at;
    if (a) {
        *a = (end_job_arg){.end = c->ops->end_job, .code = code, .grace_ms = grace_ms};
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &at, end_job_thread, a) == 0) {
            pthread_attr_destroy(&at);
            return;
        }
        pthread_attr_destroy(&at);
        free(a);
    }
    end_now((end_job_arg){.end = c->ops->end_job, .code = code}); /* no thread: now */
}
