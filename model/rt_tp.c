/* rt_tp.c: tensor parallelism of the runtime (model_runtime_opts.tp):
 * every rank runs every token of a step, with a share of the weights.
 *
 *   attention  each rank runs its own heads (q_b and kv_b rows of those
 *              heads; the latent cache, the DSA indexer and the A
 *              projection are whole on every rank, since all heads share
 *              them); the heads' outputs are all-gathered, and each rank
 *              runs its rows of o_proj on the whole gathered row, so every
 *              element of o_proj's output is the one-device dot product;
 *              the rows are all-gathered back;
 *   MoE        the step's rows are split over the ranks (model_ep_range)
 *              and each rank's share runs expert-parallel (ep_moe.h); the
 *              rows' outputs are all-gathered;
 *   embedding  each rank holds its vocabulary rows and a zero row that the
 *              other ranks' tokens read; the ranks' rows are summed (one
 *              of the summands is the row, the others are zeros: exact);
 *   lm_head    each rank computes its vocabulary's logits; all-gathered.
 *   MLP        a dense layer's (and a bf16 shared expert's) SwiGLU: each
 *              rank runs its share of the intermediate (gate and up rows),
 *              the activations are all-gathered, and each rank runs its
 *              rows of down over all of them, as o_proj.
 * Every collective is a copy or a sum with one non-zero term, so no result
 * depends on a library's reduction order.
 *
 * Exchanges go through host staging (the cpu and emu devices' memory is
 * host memory; elsewhere a device copy each way), as in ep_moe.c.
 *
 * Lockstep: with comm_lead rank 0 journals its sequence operations
 * (create, fork, free, truncate) and, before each step, broadcasts the
 * journal and the step's items; the other ranks, in rt_driver.c's tp_follow, replay
 * both. A step that fails before its forward (bad items, KV cache full)
 * fails the same way on every rank, since their sequences are the same. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "rt_impl.h"

mt_status rt_tp_open(model_runtime *rt, mt_err *err)
{
    rt_tp *t = &rt->tp;
    t->me = rt->plan->p.tp;
    if (!rt->o.tp)
        return MT_OK;
    if (!rt->o.comm)
        return mt_fail(err, MT_E_INVALID, "tensor parallelism (tp) needs a communicator");
    t->size = mt_comm_size(rt->o.comm);
    t->rank = mt_comm_rank(rt->o.comm);
    if (t->size < 2)
        return MT_OK;
    t->on = true;
    t->lead = rt->o.comm_lead && t->rank == 0;
    t->cnt = calloc((size_t)t->size * 4, sizeof *t->cnt);
    t->w = calloc((size_t)t->size, sizeof *t->w);
    if (!t->cnt || !t->w)
        return mt_fail(err, MT_E_NOMEM, "tensor parallelism");
    fprintf(rt->log, "tensor parallelism: rank %d of %d (%s) holds attention heads %" PRId64
            "-%" PRId64 ", o_proj rows %" PRId64 "-%" PRId64 ", vocabulary %" PRId64 "-%" PRId64
            "\n", t->rank, t->size, mt_comm_backend(rt->o.comm), t->me.head0,
            t->me.head0 + t->me.heads - 1, t->me.o_row0, t->me.o_row0 + t->me.o_rows - 1,
            t->me.vocab0, t->me.vocab0 + t->me.vocab - 1);
    return MT_OK;
}

mt_status rt_tp_bufs_alloc(model_runtime *rt, mt_err *err)
{
    rt_tp *t = &rt->tp;
    rt_bufs *b = &rt->b;
    if (!t->on) {
        t->v_l = b->v;
        t->d_l = b->delta;
        t->lg_l = b->logits;
        t->h_l = b->h;
        return MT_OK;
    }
    /* The largest bf16 MLP (dense or shared expert) and this rank's share. */
    int64_t T = rt->T, inter = 0;
    for (int64_t i = 0; i < rt->n_layers; i++) {
        const rt_layer *ly = &rt->layers[i];
        int64_t in = ly->moe ? (ly->sh_mxfp4 ? 0 : ly->sh_inter) : ly->inter;
        inter = in > inter ? in : inter;
    }
    int64_t inter_l = inter / t->size + 1;
    MT_CHECK(dev_alloc(rt->dev, (size_t)(T * t->me.heads * rt->VD) * 2, &t->v_l, err));
    MT_CHECK(dev_alloc(rt->dev, (size_t)(T * t->me.o_rows) * 4, &t->d_l, err));
    MT_CHECK(dev_alloc(rt->dev, (size_t)(T * t->me.vocab) * 4, &t->lg_l, err));
    MT_CHECK(dev_alloc(rt->dev, (size_t)(T * inter_l) * 2, &t->h_l, err));
    /* The largest exchange: a step's logits, its rows of o_proj's, the
     * MLPs' or the MoE's f32 output, its gathered attention heads or MLP
     * activations. */
    size_t cap = (size_t)(T * rt->V) * 4;
    size_t alt = (size_t)(T * rt->H) * 4;
    cap = alt > cap ? alt : cap;
    alt = (size_t)(T * rt->NH * rt->VD) * 2;
    cap = alt > cap ? alt : cap;
    alt = (size_t)(T * inter) * 2;
    t->h_cap = alt > cap ? alt : cap;
    /* What this rank sends: its share of those, or the embedding's f32
     * rows it sums (rt_tp_embed_sum), the largest. */
    size_t send = (size_t)(T * rt->H) * 4;
    size_t mine[] = {(size_t)(T * t->me.vocab) * 4, (size_t)(T * t->me.heads * rt->VD) * 2,
                     (size_t)(T * inter_l) * 2};
    for (size_t i = 0; i < sizeof mine / sizeof mine[0]; i++)
        send = mine[i] > send ? mine[i] : send;
    t->h_send_cap = send;
    t->h_send = malloc(send);
    t->h_recv = malloc(t->h_cap);
    t->h_full = malloc(t->h_cap);
    if (!t->h_send || !t->h_recv || !t->h_full)
        return mt_fail(err, MT_E_NOMEM, "tensor parallelism: host staging of 2 x %zu + %zu bytes",
                       t->h_cap, send);
    return MT_OK;
}

void rt_tp_close(model_runtime *rt)
{
    rt_tp *t = &rt->tp;
    if (t->on && rt->dev) {
        dev_free(rt->dev, t->v_l);
        dev_free(rt->dev, t->d_l);
        dev_free(rt->dev, t->lg_l);
        dev_free(rt->dev, t->h_l);
    }
    free(t->h_send);
    free(t->h_recv);
    free(t->h_full);
    free(t->cnt);
    free(t->w);
    free(t->msg);
    memset(t, 0, sizeof *t);
}

/* ---- exchanges ------------------------------------------------------------ */

/* full [rows][sum w] on every rank from each rank's [rows][w[q]] local
 * columns, rank q's at column sum of w[< q]; es bytes per element. */
static mt_status gather_cols(model_runtime *rt, const int64_t *w, const void *local, void *full,
                             int64_t rows, size_t es, mt_err *err)
{
    rt_tp *t = &rt->tp;
    int n = t->size;
    int64_t W = 0;
    for (int q = 0; q < n; q++)
        W += w[q];
    size_t row_b = (size_t)W * es, mine = (size_t)(rows * w[t->rank]) * es;
    if ((size_t)rows * row_b > t->h_cap || mine > t->h_send_cap)
        return mt_fail(err, MT_E_INVALID, "tensor parallelism: an exchange of %" PRId64 " x %zu "
                       "bytes exceeds the staging's %zu", rows, row_b, t->h_cap);
    if (mine)
        MT_CHECK(dev_copy_from(rt->dev, t->h_send, local, mine, err));
    size_t *sc = t->cnt, *sd = sc + n, *rc = sd + n, *rd = rc + n, off = 0;
    for (int q = 0; q < n; q++) {
        sc[q] = mine;
        sd[q] = 0; /* the same block to every rank */
        rc[q] = (size_t)(rows * w[q]) * es;
        rd[q] = off;
        off += rc[q];
    }
    MT_CHECK(mt_comm_all_to_all_v(rt->o.comm, t->h_send, sc, sd, t->h_recv, rc, rd, MT_COMM_U8,
                                  err));
    char *dst = t->h_full;
    const char *src = t->h_recv;
    size_t col = 0;
    for (int q = 0; q < n; q++) {
        size_t wb = (size_t)w[q] * es;
        for (int64_t r = 0; r < rows; r++)
            memcpy(dst + (size_t)r * row_b + col, src + rd[q] + (size_t)r * wb, wb);
        col += wb;
    }
    return rows ? dev_copy_to(rt->dev, full, t->h_full, (size_t)rows * row_b, err) : MT_OK;
}

mt_status rt_tp_gather(model_runtime *rt, int64_t total, int64_t per, const void *local,
                       void *full, int64_t rows, size_t es, mt_err *err)
{
    rt_tp *t = &rt->tp;
    for (int q = 0; q < t->size; q++) {
        int64_t q0, qn;
        model_ep_range(total, t->size, q, &q0, &qn);
        t->w[q] = per * qn;
    }
    return gather_cols(rt, t->w, local, full, rows, es, err);
}

void rt_tp_local_tokens(const model_runtime *rt, int32_t *tok, int64_t M)
{
    const model_tp_dims *d = &rt->tp.me;
    for (int64_t i = 0; i < M; i++)
        tok[i] = tok[i] >= d->vocab0 && tok[i] < d->vocab0 + d->vocab ? (int32_t)(tok[i] - d->vocab0)
                                                                      : (int32_t)d->vocab;
}

mt_status rt_tp_embed_sum(model_runtime *rt, int64_t M, mt_err *err)
{
    rt_tp *t = &rt->tp;
    size_t n = (size_t)(M * rt->H);
    void *h = t->h_send;
    MT_CHECK(dev_copy_from(rt->dev, h, rt->b.resid, n * 4, err));
    MT_CHECK(mt_comm_all_reduce(rt->o.comm, h, h, n, MT_COMM_F32, MT_COMM_SUM, err));
    MT_CHECK(dev_copy_to(rt->dev, rt->b.resid, h, n * 4, err));
    MT_CHECK(dev_copy_from(rt->dev, h, rt->b.xb, n * 2, err));
    MT_CHECK(mt_comm_all_reduce(rt->o.comm, h, h, n, MT_COMM_BF16, MT_COMM_SUM, err));
    return dev_copy_to(rt->dev, rt->b.xb, h, n * 2, err);
}

mt_status rt_tp_moe(model_runtime *rt, rt_layer *ly, int64_t M, mt_err *err)
{
    rt_tp *t = &rt->tp;
    int64_t H = rt->H, r0, cnt;
    model_ep_range(M, t->size, t->rank, &r0, &cnt);
    float *y = (float *)rt->b.delta + r0 * H;
    MT_CHECK(rt_ep_moe(rt, ly, (const uint16_t *)rt->b.xn + r0 * H, cnt, y, err));
    /* Each rank's rows, as one row of cnt * H columns. */
    return rt_tp_gather(rt, M, H, y, rt->b.delta, 1, 4, err);
}

/* ---- the leader's journal and steps ----------------------------------------- */

/* The message: [n_ops, n_items, ops (4 each)..., items...]; an item is
 * [seq, n_tokens, n_prompt, flags, tokens...], flags 1: logits, 2: all. */
static bool msg_room(rt_tp *t, int64_t more)
{
    if (t->n_msg + more <= t->msg_cap)
        return true;
    int64_t cap = t->msg_cap ? t->msg_cap : 256;
    while (cap < t->n_msg + more)
        cap *= 2;
    int32_t *m = realloc(t->msg, sizeof(int32_t) * (size_t)cap);
    if (!m)
        return false;
    t->msg = m;
    t->msg_cap = cap;
    return true;
}

/* Room for more entries after the message's header ([n_ops, n_items],
 * written when the message is empty). */
static bool msg_reserve(rt_tp *t, int64_t more)
{
    if (!msg_room(t, (t->n_msg < 2 ? 2 : 0) + more))
        return false;
    if (t->n_msg < 2) {
        t->msg[0] = t->msg[1] = 0;
        t->n_msg = 2;
    }
    return true;
}

void rt_tp_note(model_runtime *rt, int op, int seq, int64_t a, int64_t b)
{
    rt_tp *t = &rt->tp;
    if (!t->on || !t->lead)
        return;
    if (!msg_reserve(t, 4))
        abort(); /* a few bytes: the followers could not be kept in step */
    int32_t *e = t->msg + t->n_msg;
    e[0] = op, e[1] = seq, e[2] = (int32_t)a, e[3] = (int32_t)b;
    t->n_msg += 4;
    t->msg[0]++;
}

mt_status rt_tp_announce(model_runtime *rt, const model_step_item *items, int n, mt_err *err)
{
    rt_tp *t = &rt->tp;
    if (!msg_reserve(t, 0))
        return mt_fail(err, MT_E_NOMEM, "tensor parallelism: step message");
    for (int i = 0; i < n; i++) {
        const model_step_item *it = &items[i];
        int nt = it->n_tokens > 0 && it->tokens ? it->n_tokens : 0;
        if (!msg_reserve(t, 4 + nt))
            return mt_fail(err, MT_E_NOMEM, "tensor parallelism: step message");
        int32_t *e = t->msg + t->n_msg;
        e[0] = it->seq, e[1] = nt, e[2] = it->n_prompt;
        e[3] = (it->logits ? 1 : 0) | (it->all_logits ? 2 : 0);
        if (nt)
            memcpy(e + 4, it->tokens, sizeof(int32_t) * (size_t)nt);
        t->n_msg += 4 + nt;
    }
    t->msg[1] = n;
    int32_t len = (int32_t)t->n_msg;
    mt_status st = mt_comm_broadcast(rt->o.comm, &len, 1, MT_COMM_I32, 0, err);
    if (st == MT_OK)
        st = mt_comm_broadcast(rt->o.comm, t->msg, (size_t)len, MT_COMM_I32, 0, err);
    t->n_msg = 0;
    return st;
}

