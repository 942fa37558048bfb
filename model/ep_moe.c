/* ep_moe.c: the expert-parallel MoE layer (see ep_moe.h): dispatch of
 * (token, expert) pairs to the ranks owning the experts, the local expert
 * GEMMs, and the return of the weighted rows into the single-device
 * combine's layout. Every buffer an exchange reads or writes is device
 * memory; the host sees only the per-rank pair counts. */
#include "ep_moe.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/moe/moe_common.h"

struct model_ep {
    mt_comm *comm;
    int rank, size;
    moe_dims d;                 /* global dims (shared_inter: the largest) */
    moe_dims local;             /* the local expert kernels' dims */
    int64_t first, count;       /* owned experts */
    model_kern *align, *up, *down;  /* this rank's experts */
    model_kern *sort, *pack, *unpack; /* dispatch and return on the device */
    dev_device *dev;
    int64_t max_m, cap;         /* local tokens per call; pairs per expert-side chunk */
    /* device: routing and per-pair rows of the local tokens, shared expert */
    void *ids, *tw, *rows;
    void *sh_ids, *sh_w, *sh_sorted, *sh_tile, *sh_total, *sh_h, *sh_rows;
    /* device: the local pairs by expert (so by destination rank), in that
     * order their rows, local experts and weights, the counts (to each
     * rank, then from each), and the rows that come back */
    void *sorted, *stile, *stotal, *sx, *se, *sw, *cnt, *ret;
    /* device: the received pairs and their results, grown to the most a
     * step has received (rcap pairs) */
    void *rx, *re, *rw, *back;
    int64_t rcap;
    /* device: one chunk's expert sort and hidden rows */
    void *lsorted, *ltile, *ltotal, *hr;
    int32_t *h_cnt;             /* host: the 2 * size counts */
    size_t *c4;                 /* 4 * size: send counts/displs, receive counts/displs */
    size_t *v;                  /* 4 * size: the same scaled for one collective */
    uint64_t count_reads, count_bytes;
};

void model_ep_range(int64_t n_experts, int n_ranks, int rank, int64_t *first, int64_t *count)
{
    int64_t base = n_experts / n_ranks, rem = n_experts % n_ranks;
    *first = rank * base + (rank < rem ? rank : rem);
    *count = base + (rank < rem);
}

void model_ep_local_dims(const moe_dims *d, int64_t count, moe_dims *out)
{
    *out = *d;
    out->n_experts = count;
    out->topk = 1;
    out->ngroup = out->topkg = 1;
    out->shared_inter = 0;
    out->comb = 1;
}

mt_status model_ep_create(mt_comm *comm, const moe_dims *d, model_ep **out, mt_err *err)
{
    *out = NULL;
    int n = mt_comm_size(comm);
    if (d->n_experts < n)
        return mt_fail(err, MT_E_INVALID, "expert parallelism: %lld routed experts cannot be "
                       "split over %d ranks", (long long)d->n_experts, n);
    model_ep *ep = calloc(1, sizeof *ep);
    size_t *c4 = calloc(8 * (size_t)n, sizeof *c4);
    int32_t *h_cnt = calloc(2 * (size_t)n, sizeof *h_cnt);
    if (!ep || !c4 || !h_cnt) {
        free(ep);
        free(c4);
        free(h_cnt);
        return mt_fail(err, MT_E_NOMEM, "expert parallelism");
    }
    ep->comm = comm;
    ep->rank = mt_comm_rank(comm);
    ep->size = n;
    ep->d = *d;
    ep->d.comb = 1;
    model_ep_range(d->n_experts, n, ep->rank, &ep->first, &ep->count);
    model_ep_local_dims(d, ep->count, &ep->local);
    ep->c4 = c4;
    ep->v = c4 + 4 * n;
    ep->h_cnt = h_cnt;
    *out = ep;
    return MT_OK;
}

void model_ep_own(const model_ep *ep, int64_t *first, int64_t *count)
{
    *first = ep->first;
    *count = ep->count;
}

mt_comm *model_ep_comm(const model_ep *ep) { return ep->comm; }

void model_ep_count_reads(const model_ep *ep, uint64_t *calls, uint64_t *bytes)
{
    *calls = ep->count_reads;
    *bytes = ep->count_bytes;
}

mt_status model_ep_add_kernels(model_ep *ep, model_kset *ks, int64_t max_m, mt_err *err)
{
    moe_keys k;
    moe_layer_keys(&ep->local, &k);
    int64_t pairs = max_m * ep->d.topk;
    char sort[96], pack[128], unpack[64];
    snprintf(sort, sizeof sort, "E=%lld,topk=%d,bm=1,skew=0", (long long)ep->d.n_experts,
             ep->d.topk);
    snprintf(pack, sizeof pack, "E=%lld,topk=%d,ranks=%d,H=%lld", (long long)ep->d.n_experts,
             ep->d.topk, ep->size, (long long)ep->d.hidden);
    snprintf(unpack, sizeof unpack, "H=%lld", (long long)ep->d.hidden);
    struct {
        model_kern **slot;
        const char *fam, *key, *use;
        int64_t m;
    } st[] = {
        {&ep->sort, "moe_align", sort, "pairs by destination rank (expert parallelism)", max_m},
        {&ep->pack, "ep_dispatch", pack, "dispatch (expert parallelism)", pairs},
        {&ep->unpack, "ep_return", unpack, "return (expert parallelism)", pairs},
        {&ep->align, "moe_align", k.align, "expert sort (this rank's experts)", pairs},
        {&ep->up, "moe_gemm_up", k.up, "experts up (this rank's experts)", pairs},
        {&ep->down, "moe_gemm_down", k.down, "experts down (this rank's experts)", pairs},
    };
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        mt_status s = model_kset_add_text(ks, st[i].fam, st[i].key, st[i].use, st[i].m,
                                          st[i].slot, err);
        if (s != MT_OK)
            return mt_err_prefix(err, "expert parallelism, rank %d (experts %" PRId64 "-%" PRId64
                                 ")", ep->rank, ep->first, ep->first + ep->count - 1);
    }
    return MT_OK;
}

/* The received-pair buffers for at least r pairs (grown by half again). */
static mt_status recv_room(model_ep *ep, int64_t r, mt_err *err)
{
    if (r <= ep->rcap)
        return MT_OK;
    int64_t cap = ep->rcap + ep->rcap / 2 > r ? ep->rcap + ep->rcap / 2 : r;
    int64_t H = ep->d.hidden;
    MT_CHECK(dev_synchronize(ep->dev, err));
    void **p[] = {&ep->rx, &ep->re, &ep->rw, &ep->back};
    size_t sz[] = {(size_t)(cap * H) * 2, (size_t)cap * 4, (size_t)cap * 4, (size_t)(cap * H) * 4};
    for (size_t i = 0; i < 4; i++) {
        dev_free(ep->dev, *p[i]);
        *p[i] = NULL;
    }
    ep->rcap = 0;
    for (size_t i = 0; i < 4; i++)
        MT_CHECK(dev_alloc(ep->dev, sz[i], p[i], err));
    ep->rcap = cap;
    return MT_OK;
}

mt_status model_ep_ws_alloc(model_ep *ep, dev_device *dev, int64_t max_m, mt_err *err)
{
    ep->dev = dev;
    ep->max_m = max_m;
    int bm = moe_dims_bm(&ep->d);
    int64_t M = max_m, H = ep->d.hidden, P = M * ep->d.topk, S = ep->d.shared_inter;
    int64_t cap = P, capr = moe_cap_rows(cap, ep->count, bm), cap1 = moe_cap_rows(M, 1, bm);
    size_t n = (size_t)ep->size;
    ep->cap = cap;
    struct {
        void **p;
        size_t n;
    } a[] = {
        {&ep->ids, (size_t)P * 4}, {&ep->tw, (size_t)P * 4}, {&ep->rows, (size_t)(P * H) * 4},
        {&ep->sh_ids, S ? (size_t)M * 4 : 0}, {&ep->sh_w, S ? (size_t)M * 4 : 0},
        {&ep->sh_sorted, S ? (size_t)cap1 * 4 : 0},
        {&ep->sh_tile, S ? (size_t)(cap1 / bm + 1) * 4 : 0}, {&ep->sh_total, S ? 4 : 0},
        {&ep->sh_h, S ? (size_t)(M * S) * 2 : 0}, {&ep->sh_rows, S ? (size_t)(M * H) * 4 : 0},
        {&ep->sorted, (size_t)P * 4}, {&ep->stile, (size_t)(P + 1) * 4}, {&ep->stotal, 4},
        {&ep->sx, (size_t)(P * H) * 2}, {&ep->se, (size_t)P * 4}, {&ep->sw, (size_t)P * 4},
        {&ep->cnt, 2 * n * 4}, {&ep->ret, (size_t)(P * H) * 4},
        {&ep->lsorted, (size_t)capr * 4}, {&ep->ltile, (size_t)(capr / bm + 1) * 4},
        {&ep->ltotal, 4}, {&ep->hr, (size_t)(cap * ep->d.inter) * 2},
    };
    mt_status st = MT_OK;
    for (size_t i = 0; i < sizeof a / sizeof a[0] && st == MT_OK; i++)
        if (a[i].n)
            st = dev_alloc(dev, a[i].n, a[i].p, err);
    /* Room for what one step of this rank's own size would bring in; a
     * step that receives more grows it. */
    if (st == MT_OK)
        st = recv_room(ep, P, err);
    if (st == MT_OK && S) {
        /* The shared expert as a one-expert MoE, as moe_layer.c runs it. */
        float *ones = malloc((size_t)M * 4);
        if (!ones)
            st = mt_fail(err, MT_E_NOMEM, "expert parallelism");
        for (int64_t i = 0; st == MT_OK && i < M; i++)
            ones[i] = 1.0f;
        if (st == MT_OK)
            st = dev_memset(dev, ep->sh_ids, 0, (size_t)M * 4, err);
        if (st == MT_OK)
            st = dev_copy_to(dev, ep->sh_w, ones, (size_t)M * 4, err);
        free(ones);
    }
    return st == MT_OK ? MT_OK
                       : mt_err_prefix(err, "expert parallelism workspace for %" PRId64 " tokens",
                                       max_m);
}

void model_ep_destroy(model_ep *ep)
{
    if (!ep)
        return;
    if (ep->dev) {
        void *p[] = {ep->ids, ep->tw, ep->rows, ep->sh_ids, ep->sh_w, ep->sh_sorted, ep->sh_tile,
                     ep->sh_total, ep->sh_h, ep->sh_rows, ep->sorted, ep->stile, ep->stotal,
                     ep->sx, ep->se, ep->sw, ep->cnt, ep->ret, ep->rx, ep->re, ep->rw, ep->back,
                     ep->lsorted, ep->ltile, ep->ltotal, ep->hr};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
            dev_free(ep->dev, p[i]);
    }
    free(ep->h_cnt);
    free(ep->c4);
    free(ep);
}

#define RUN(k, m, ...)                                                                           \
    do {                                                                                         \
        void *bufs_[] = {__VA_ARGS__};                                                           \
        mt_status s_ = model_kern_run((k), (m), NULL, bufs_, err);                               \
        if (s_ != MT_OK)                                                                         \
            return mt_err_prefix(err, "expert-parallel moe layer");                             \
    } while (0)

/* Byte offset i * row elements of es bytes into a device buffer. */
static void *at(void *base, int64_t i, int64_t row, size_t es)
{
    return (char *)base + (size_t)i * (size_t)row * es;
}

/* all_to_all_v of per-rank pair counts scaled by `per` (elements per
 * pair): send counts/displs c4[0..n), c4[n..2n), receive c4[2n..3n),
 * c4[3n..4n). Device buffers. */
static mt_status exchange(model_ep *ep, const void *send, void *recv, size_t per,
                          mt_comm_dtype t, mt_err *err)
{
    int n = ep->size;
    for (int i = 0; i < 4 * n; i++)
        ep->v[i] = ep->c4[i] * per;
    return mt_comm_all_to_all_v(ep->comm, send, ep->v, ep->v + n, recv, ep->v + 2 * n,
                                ep->v + 3 * n, t, err);
}

/* Step 1: the shared expert and the router on the M local tokens, then the
 * pairs in send order (by expert, so by destination rank) and the pairs
 * per destination, all on the device. *shared is the combine's shared
 * input. */
static mt_status local_front(model_ep *ep, const model_moe_kernels *k, const moe_dims *d,
                             const moe_weights *w, const void *x, int64_t M, float *y,
                             void **shared, mt_err *err)
{
    void *xv = (void *)(uintptr_t)x;
    *shared = d->shared_inter ? ep->sh_rows : (void *)y;
    if (!d->shared_inter)
        MT_CHECK(dev_memset(ep->dev, y, 0, (size_t)(M * d->hidden) * 4, err));
    if (d->shared_inter) {
        RUN(k->sh_align, M, ep->sh_ids, ep->sh_sorted, ep->sh_tile, ep->sh_total);
        RUN(k->sh_up, M, xv, ep->sh_ids, ep->sh_sorted, ep->sh_tile, ep->sh_total,
            (void *)w->sh_w13, (void *)w->sh_s13, ep->sh_h);
        RUN(k->sh_down, M, ep->sh_h, ep->sh_ids, ep->sh_sorted, ep->sh_tile, ep->sh_total,
            ep->sh_w, (void *)w->sh_w2, (void *)w->sh_s2, ep->sh_rows);
    }
    RUN(k->route, M, xv, (void *)w->gate, (void *)w->bias, ep->ids, ep->tw);
    RUN(ep->sort, M, ep->ids, ep->sorted, ep->stile, ep->stotal);
    RUN(ep->pack, M * d->topk, ep->sorted, ep->ids, ep->tw, xv, ep->sx, ep->se, ep->sw,
        ep->cnt);
    return MT_OK;
}

/* Step 3: the R received pairs through the local experts, in chunks of at
 * most cap pairs, each chunk read and written in place in the receive
 * buffers; results (f32 [R, H]) in back. */
static mt_status local_experts(model_ep *ep, const moe_weights *w, int64_t R, mt_err *err)
{
    int64_t H = ep->d.hidden;
    for (int64_t c0 = 0; c0 < R; c0 += ep->cap) {
        int64_t m = R - c0 < ep->cap ? R - c0 : ep->cap;
        void *xr = at(ep->rx, c0, H, 2), *idr = at(ep->re, c0, 1, 4), *twr = at(ep->rw, c0, 1, 4);
        RUN(ep->align, m, idr, ep->lsorted, ep->ltile, ep->ltotal);
        RUN(ep->up, m, xr, idr, ep->lsorted, ep->ltile, ep->ltotal, (void *)w->w13,
            (void *)w->s13, ep->hr);
        RUN(ep->down, m, ep->hr, idr, ep->lsorted, ep->ltile, ep->ltotal, twr, (void *)w->w2,
            (void *)w->s2, at(ep->back, c0, H, 4));
    }
    return MT_OK;
}

mt_status model_ep_moe_run(model_ep *ep, const model_moe_kernels *k, const moe_dims *d,
                           const moe_weights *w, const void *x, int64_t M, float *y, mt_err *err)
{
    if (M < 0 || M > ep->max_m || d->n_experts != ep->d.n_experts || d->topk != ep->d.topk ||
        d->hidden != ep->d.hidden || d->inter != ep->d.inter ||
        d->shared_inter > ep->d.shared_inter || !d->comb)
        return mt_fail(err, MT_E_INVALID, "expert-parallel moe layer: M=%" PRId64 " E=%lld "
                       "topk=%d comb=%d does not fit a layer for M<=%" PRId64 " E=%lld topk=%d",
                       M, (long long)d->n_experts, d->topk, d->comb, ep->max_m,
                       (long long)ep->d.n_experts, ep->d.topk);
    int n = ep->size;
    int64_t H = d->hidden;
    size_t *sc = ep->c4, *sd = sc + n, *rc = sc + 2 * n, *rd = sc + 3 * n;
    void *shared = y;
    /* A rank that fails before the exchanges still joins them with no
     * pairs, so the others are not left waiting; it returns its error. */
    mt_status st = M > 0 ? local_front(ep, k, d, w, x, M, y, &shared, err) : MT_OK;
    int64_t P = st == MT_OK ? M * d->topk : 0;
    if (!P) {
        mt_err e0 = MT_ERR_INIT;
        mt_status ms = dev_memset(ep->dev, ep->cnt, 0, (size_t)n * 4, st == MT_OK ? err : &e0);
        st = st == MT_OK ? ms : st;
    }

    /* Step 2: the pair counts (device, one per destination) exchanged;
     * the host reads both sides' counts for the sizes of the exchanges
     * that follow: the one wait of the layer (the libraries take host
     * counts). */
    for (int q = 0; q < n; q++)
        sc[q] = 1, sd[q] = (size_t)q, rc[q] = 1, rd[q] = (size_t)q;
    mt_err e2 = MT_ERR_INIT;
    mt_status cs = mt_comm_all_to_all_v(ep->comm, ep->cnt, sc, sd, at(ep->cnt, n, 1, 4), rc, rd,
                                        MT_COMM_I32, st == MT_OK ? err : &e2);
    if (cs == MT_OK) {
        ep->count_reads++;
        ep->count_bytes += 2 * (size_t)n * 4;
        cs = dev_copy_from(ep->dev, ep->h_cnt, ep->cnt, 2 * (size_t)n * 4, st == MT_OK ? err : &e2);
    }
    if (cs != MT_OK)
        return st != MT_OK ? st : mt_err_prefix(err, "expert parallelism: dispatch counts");
    size_t stot = 0, rtot = 0;
    for (int q = 0; q < n; q++) {
        sc[q] = (size_t)ep->h_cnt[q], sd[q] = stot, stot += sc[q];
        rc[q] = (size_t)ep->h_cnt[n + q], rd[q] = rtot, rtot += rc[q];
    }
    if (stot != (size_t)P)
        return mt_fail(err, MT_E_DEVICE, "expert parallelism: the dispatch counted %zu pairs of "
                       "%" PRId64, stot, P);
    MT_CHECK(recv_room(ep, (int64_t)rtot, err));
    MT_CHECK(exchange(ep, ep->sx, ep->rx, (size_t)H, MT_COMM_BF16, err));
    MT_CHECK(exchange(ep, ep->se, ep->re, 1, MT_COMM_I32, err));
    MT_CHECK(exchange(ep, ep->sw, ep->rw, 1, MT_COMM_F32, err));

    /* Step 3: this rank's experts on what it received. A failure here
     * still sends (unfilled) rows back so no rank waits forever. */
    mt_err e3 = MT_ERR_INIT;
    mt_status ls = local_experts(ep, w, (int64_t)rtot, &e3);

    /* Step 4: rows back to their tokens' ranks (the send and receive sides
     * swap), then into the per-pair layout and the combine. */
    for (int q = 0; q < n; q++) {
        size_t t0 = sc[q], t1 = sd[q];
        sc[q] = rc[q], sd[q] = rd[q], rc[q] = t0, rd[q] = t1;
    }
    MT_CHECK(exchange(ep, ep->back, ep->ret, (size_t)H, MT_COMM_F32, err));
    if (ls != MT_OK)
        return mt_fail(err, ls, "%s", e3.msg);
    if (st != MT_OK || M == 0)
        return st;
    RUN(ep->unpack, P, ep->sorted, ep->ret, ep->rows);
    RUN(k->combine, M, ep->rows, shared, y);
    return MT_OK;
}

#undef RUN
