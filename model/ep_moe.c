/* ep_moe.c: the expert-parallel MoE layer (see ep_moe.h): dispatch of
 * (token, expert) pairs to the ranks owning the experts, the local expert
 * GEMMs, and the return of the weighted rows into the single-device
 * combine's layout. */
#include "ep_moe.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/moe/moe_common.h"

/* A host array that grows to the largest size asked for. */
typedef struct grow_buf {
    void *p;
    size_t cap;
} grow_buf;

static void *grow(grow_buf *b, size_t bytes)
{
    if (bytes <= b->cap)
        return b->p;
    void *q = realloc(b->p, bytes);
    if (!q)
        return NULL;
    b->p = q;
    b->cap = bytes;
    return q;
}

struct model_ep {
    mt_comm *comm;
    int rank, size;
    moe_dims d;                 /* global dims (shared_inter: the largest) */
    moe_dims local;             /* the local expert kernels' dims */
    int64_t first, count;       /* owned experts */
    model_kern *align, *up, *down;
    dev_device *dev;
    int64_t max_m, cap;         /* local tokens per call; pairs per expert-side chunk */
    /* device: routing and per-pair rows of the local tokens, shared expert */
    void *ids, *tw, *rows;
    void *sh_ids, *sh_w, *sh_sorted, *sh_tile, *sh_total, *sh_h, *sh_rows;
    /* device: one chunk of received pairs */
    void *xr, *idr, *twr, *sorted, *tile, *total, *hr, *rowsr;
    /* host staging */
    int32_t *h_ids;
    float *h_tw;
    uint16_t *h_x;
    size_t *cnt;                /* 4 * size: send counts/displs, receive counts/displs */
    size_t *v;                  /* 4 * size: the same scaled for one collective */
    grow_buf send_x, send_meta, recv_x, recv_meta, back, ret, rows_h, perm, idr_h, twr_h;
};

void model_ep_range(int64_t n_experts, int n_ranks, int rank, int64_t *first, int64_t *count)
{
    int64_t base = n_experts / n_ranks, rem = n_experts % n_ranks;
    *first = rank * base + (rank < rem ? rank : rem);
    *count = base + (rank < rem);
}

/* The rank owning expert e (inverse of model_ep_range). */
static int owner(int64_t e, int64_t n_experts, int n_ranks)
{
    int64_t base = n_experts / n_ranks, rem = n_experts % n_ranks;
    int64_t big = rem * (base + 1);
    return (int)(e < big ? e / (base + 1) : rem + (e - big) / base);
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
    size_t *cnt = calloc(8 * (size_t)n, sizeof *cnt);
    if (!ep || !cnt) {
        free(ep);
        free(cnt);
        return mt_fail(err, MT_E_NOMEM, "expert parallelism");
    }
    ep->comm = comm;
    ep->rank = mt_comm_rank(comm);
    ep->size = n;
    ep->d = *d;
    ep->d.comb = 1;
    model_ep_range(d->n_experts, n, ep->rank, &ep->first, &ep->count);
    model_ep_local_dims(d, ep->count, &ep->local);
    ep->cnt = cnt;
    ep->v = cnt + 4 * n;
    *out = ep;
    return MT_OK;
}

void model_ep_own(const model_ep *ep, int64_t *first, int64_t *count)
{
    *first = ep->first;
    *count = ep->count;
}

mt_comm *model_ep_comm(const model_ep *ep) { return ep->comm; }

mt_status model_ep_add_kernels(model_ep *ep, model_kset *ks, int64_t max_m, mt_err *err)
{
    moe_keys k;
    moe_layer_keys(&ep->local, &k);
    int64_t pairs = max_m * ep->d.topk;
    struct {
        model_kern **slot;
        const char *fam, *key, *use;
    } st[] = {
        {&ep->align, "moe_align", k.align, "expert sort (this rank's experts)"},
        {&ep->up, "moe_gemm_up", k.up, "experts up (this rank's experts)"},
        {&ep->down, "moe_gemm_down", k.down, "experts down (this rank's experts)"},
    };
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        mt_status s = model_kset_add_text(ks, st[i].fam, st[i].key, st[i].use, pairs,
                                          st[i].slot, err);
        if (s != MT_OK)
            return mt_err_prefix(err, "expert parallelism, rank %d (experts %" PRId64 "-%" PRId64
                                 ")", ep->rank, ep->first, ep->first + ep->count - 1);
    }
    return MT_OK;
}

mt_status model_ep_ws_alloc(model_ep *ep, dev_device *dev, int64_t max_m, mt_err *err)
{
    ep->dev = dev;
    ep->max_m = max_m;
    int bm = moe_dims_bm(&ep->d);
    int64_t M = max_m, H = ep->d.hidden, P = M * ep->d.topk, S = ep->d.shared_inter;
    int64_t cap = P, capr = moe_cap_rows(cap, ep->count, bm), cap1 = moe_cap_rows(M, 1, bm);
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
        {&ep->xr, (size_t)(cap * H) * 2}, {&ep->idr, (size_t)cap * 4}, {&ep->twr, (size_t)cap * 4},
        {&ep->sorted, (size_t)capr * 4}, {&ep->tile, (size_t)(capr / bm + 1) * 4},
        {&ep->total, 4}, {&ep->hr, (size_t)(cap * ep->d.inter) * 2},
        {&ep->rowsr, (size_t)(cap * H) * 4},
    };
    mt_status st = MT_OK;
    for (size_t i = 0; i < sizeof a / sizeof a[0] && st == MT_OK; i++)
        if (a[i].n)
            st = dev_alloc(dev, a[i].n, a[i].p, err);
    ep->h_ids = malloc((size_t)P * 4 + 1);
    ep->h_tw = malloc((size_t)P * 4 + 1);
    ep->h_x = malloc((size_t)(M * H) * 2 + 1);
    if (st == MT_OK && (!ep->h_ids || !ep->h_tw || !ep->h_x))
        st = mt_fail(err, MT_E_NOMEM, "expert parallelism: host staging");
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
                     ep->sh_total, ep->sh_h, ep->sh_rows, ep->xr, ep->idr, ep->twr, ep->sorted,
                     ep->tile, ep->total, ep->hr, ep->rowsr};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
            dev_free(ep->dev, p[i]);
    }
    grow_buf *g[] = {&ep->send_x, &ep->send_meta, &ep->recv_x, &ep->recv_meta, &ep->back,
                     &ep->ret, &ep->rows_h, &ep->perm, &ep->idr_h, &ep->twr_h};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        free(g[i]->p);
    free(ep->h_ids);
    free(ep->h_tw);
    free(ep->h_x);
    free(ep->cnt);
    free(ep);
}

#define RUN(k, m, ...)                                                                           \
    do {                                                                                         \
        void *bufs_[] = {__VA_ARGS__};                                                           \
        mt_status s_ = model_kern_run((k), (m), NULL, bufs_, err);                               \
        if (s_ != MT_OK)                                                                         \
            return mt_err_prefix(err, "expert-parallel moe layer");                             \
    } while (0)

/* all_to_all_v of per-rank element counts scaled by `per` (elements per
 * pair): send counts/displs c[0..n), c[n..2n), receive c[2n..3n), c[3n..4n). */
static mt_status exchange(model_ep *ep, const void *send, void *recv, size_t per,
                          mt_comm_dtype t, mt_err *err)
{
    int n = ep->size;
    for (int i = 0; i < 4 * n; i++)
        ep->v[i] = ep->cnt[i] * per;
    return mt_comm_all_to_all_v(ep->comm, send, ep->v, ep->v + n, recv, ep->v + 2 * n,
                                ep->v + 3 * n, t, err);
}

/* Step 1: the shared expert and the router on the M local tokens, the
 * routing and activations copied to the host. *shared is the combine's
 * shared input. */
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
    int64_t P = M * d->topk;
    MT_CHECK(dev_synchronize(ep->dev, err));
    MT_CHECK(dev_copy_from(ep->dev, ep->h_ids, ep->ids, (size_t)P * 4, err));
    MT_CHECK(dev_copy_from(ep->dev, ep->h_tw, ep->tw, (size_t)P * 4, err));
    return dev_copy_from(ep->dev, ep->h_x, x, (size_t)(M * d->hidden) * 2, err);
}

/* Step 3: the R received pairs through the local experts, in chunks of at
 * most cap pairs; results (f32 [R, H]) into back. */
static mt_status local_experts(model_ep *ep, const moe_weights *w, const uint16_t *xin,
                               const int32_t *meta, int64_t R, float *back, mt_err *err)
{
    int64_t H = ep->d.hidden;
    int32_t *idr = grow(&ep->idr_h, (size_t)ep->cap * 4 + 1);
    float *twr = grow(&ep->twr_h, (size_t)ep->cap * 4 + 1);
    if (!idr || !twr)
        return mt_fail(err, MT_E_NOMEM, "expert parallelism: %" PRId64 " pairs", R);
    for (int64_t c0 = 0; c0 < R; c0 += ep->cap) {
        int64_t m = R - c0 < ep->cap ? R - c0 : ep->cap;
        for (int64_t i = 0; i < m; i++) {
            int32_t e = meta[2 * (c0 + i)];
            if (e < 0 || e >= ep->count)
                return mt_fail(err, MT_E_INVALID, "expert parallelism, rank %d: received a pair "
                               "for local expert %" PRId32 " of %" PRId64, ep->rank, e, ep->count);
            idr[i] = e;
            memcpy(&twr[i], &meta[2 * (c0 + i) + 1], 4);
        }
        MT_CHECK(dev_copy_to(ep->dev, ep->xr, xin + c0 * H, (size_t)(m * H) * 2, err));
        MT_CHECK(dev_copy_to(ep->dev, ep->idr, idr, (size_t)m * 4, err));
        MT_CHECK(dev_copy_to(ep->dev, ep->twr, twr, (size_t)m * 4, err));
        RUN(ep->align, m, ep->idr, ep->sorted, ep->tile, ep->total);
        RUN(ep->up, m, ep->xr, ep->idr, ep->sorted, ep->tile, ep->total, (void *)w->w13,
            (void *)w->s13, ep->hr);
        RUN(ep->down, m, ep->hr, ep->idr, ep->sorted, ep->tile, ep->total, ep->twr,
            (void *)w->w2, (void *)w->s2, ep->rowsr);
        MT_CHECK(dev_synchronize(ep->dev, err));
        MT_CHECK(dev_copy_from(ep->dev, back + c0 * H, ep->rowsr, (size_t)(m * H) * 4, err));
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
    int n = ep->size, topk = d->topk;
    int64_t H = d->hidden, E = d->n_experts;
    size_t *sc = ep->cnt, *sd = sc + n, *rc = sc + 2 * n, *rd = sc + 3 * n;
    void *shared = y;
    /* A rank that fails before the exchanges still joins them with no
     * pairs, so the others are not left waiting; it returns its error. */
    mt_status st = M > 0 ? local_front(ep, k, d, w, x, M, y, &shared, err) : MT_OK;
    int64_t P = st == MT_OK ? M * topk : 0;

    /* Step 2: pairs per destination rank, exchanged first as counts. */
    int32_t *pc = calloc((size_t)n * 2, sizeof *pc);
    if (!pc)
        return mt_fail(err, MT_E_NOMEM, "expert parallelism");
    for (int64_t p = 0; p < P && st == MT_OK; p++) {
        int32_t e = ep->h_ids[p];
        if (e < 0 || e >= E)
            st = mt_fail(err, MT_E_INVALID, "expert parallelism: the router chose expert %"
                         PRId32 " of %" PRId64 " for pair %" PRId64, e, E, p);
        else
            pc[owner(e, E, n)]++;
    }
    if (st != MT_OK)
        memset(pc, 0, sizeof *pc * (size_t)n);
    for (int q = 0; q < n; q++)
        sc[q] = 1, sd[q] = (size_t)q, rc[q] = 1, rd[q] = (size_t)q;
    mt_err e2 = MT_ERR_INIT;
    mt_status cs = mt_comm_all_to_all_v(ep->comm, pc, sc, sd, pc + n, rc, rd, MT_COMM_I32,
                                        st == MT_OK ? err : &e2);
    st = st == MT_OK ? cs : st;
    size_t stot = 0, rtot = 0;
    for (int q = 0; q < n; q++) {
        sc[q] = (size_t)pc[q], sd[q] = stot, stot += sc[q];
        rc[q] = (size_t)pc[n + q], rd[q] = rtot, rtot += rc[q];
    }
    free(pc);
    if (cs != MT_OK)
        return mt_err_prefix(err, "expert parallelism: dispatch counts");

    /* Pack the pairs by destination, in pair order within each. */
    uint16_t *sx = grow(&ep->send_x, stot * (size_t)H * 2 + 1);
    int32_t *sm = grow(&ep->send_meta, stot * 8 + 1);
    int64_t *perm = grow(&ep->perm, stot * 8 + 1);
    uint16_t *rx = grow(&ep->recv_x, rtot * (size_t)H * 2 + 1);
    int32_t *rm = grow(&ep->recv_meta, rtot * 8 + 1);
    float *back = grow(&ep->back, rtot * (size_t)H * 4 + 1);
    float *ret = grow(&ep->ret, stot * (size_t)H * 4 + 1);
    if (!sx || !sm || !perm || !rx || !rm || !back || !ret)
        return mt_fail(err, MT_E_NOMEM, "expert parallelism: %zu pairs out, %zu in", stot, rtot);
    size_t *fill = ep->v; /* next slot per destination */
    for (int q = 0; q < n; q++)
        fill[q] = sd[q];
    for (int64_t p = 0; p < (st == MT_OK ? P : 0); p++) {
        int32_t e = ep->h_ids[p];
        int q = owner(e, E, n);
        size_t at = fill[q]++;
        int64_t first, cnt;
        model_ep_range(E, n, q, &first, &cnt);
        perm[at] = p;
        memcpy(sx + at * (size_t)H, ep->h_x + (p / topk) * H, (size_t)H * 2);
        sm[2 * at] = (int32_t)(e - first);
        memcpy(&sm[2 * at + 1], &ep->h_tw[p], 4);
    }
    MT_CHECK(exchange(ep, sx, rx, (size_t)H, MT_COMM_BF16, err));
    MT_CHECK(exchange(ep, sm, rm, 2, MT_COMM_I32, err));

    /* Step 3: this rank's experts on what it received. A failure here
     * still sends (unfilled) rows back so no rank waits forever. */
    mt_err e3 = MT_ERR_INIT;
    mt_status ls = local_experts(ep, w, rx, rm, (int64_t)rtot, back, &e3);

    /* Step 4: rows back to their tokens' ranks (the send and receive sides
     * swap), then into the per-pair layout and the combine. */
    for (int q = 0; q < n; q++) {
        size_t t0 = sc[q], t1 = sd[q];
        sc[q] = rc[q], sd[q] = rd[q], rc[q] = t0, rd[q] = t1;
    }
    MT_CHECK(exchange(ep, back, ret, (size_t)H, MT_COMM_F32, err));
    if (ls != MT_OK)
        return mt_fail(err, ls, "%s", e3.msg);
    if (st != MT_OK || M == 0)
        return st;
    float *rows = grow(&ep->rows_h, (size_t)(P * H) * 4);
    if (!rows)
        return mt_fail(err, MT_E_NOMEM, "expert parallelism: rows");
    for (size_t i = 0; i < stot; i++)
        memcpy(rows + perm[i] * H, ret + i * (size_t)H, (size_t)H * 4);
    MT_CHECK(dev_copy_to(ep->dev, ep->rows, rows, (size_t)(P * H) * 4, err));
    RUN(k->combine, M, ep->rows, shared, y);
    return dev_synchronize(ep->dev, err);
}

#undef RUN
