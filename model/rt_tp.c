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
 * Groups (o.tp_size smaller than the job): the shares above are a group's
 * (group g is ranks g * tp_size ..); the routed experts stay split over
 * every rank. A group's gathers and embedding sum run on its own
 * communicator (mt_comm_split), the MoE layers' exchanges on the job's.
 * Where the communicator cannot split (an NCCL older than 2.18) mirroring
 * groups use the job's: a gather with nothing to or from the other
 * groups, and an embedding sum over every rank to which only the first
 * group contributes rows.
 * With data-parallel attention (o.dp, rt_dp.c) each group runs its own
 * sequences; without it every group mirrors the first (the leader's
 * messages reach every rank; each group runs every step on the same
 * sequences), so the experts run each group's rows.
 *
 * Exchanges are on device buffers (the communicator reaches the device's
 * memory, rt_xchg.c): a gather receives the ranks' blocks one after
 * another and a tp_cols kernel lays their columns side by side; the
 * embedding's sum is an all-reduce in place. The host copies nothing.
 *
 * Lockstep: with comm_lead rank 0 journals its sequence operations
 * (create, fork, free, truncate, an MTP cache's truncation) and, before
 * each step (a model_step or a model_mtp_step: the MTP layer runs
 * tensor-parallel like the others), broadcasts the journal and the step's
 * items; the other ranks, in rt_driver.c's tp_follow, replay
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
    t->world = mt_comm_size(rt->o.comm);
    int me = mt_comm_rank(rt->o.comm);
    t->size = rt->o.tp_size > 0 ? rt->o.tp_size : t->world;
    if (t->world % t->size)
        return mt_fail(err, MT_E_INVALID, "tensor-parallel groups of %d ranks do not divide the "
                       "job's %d ranks", t->size, t->world);
    t->rank = me % t->size;
    t->group = me / t->size;
    if (t->size < 2)
        return MT_OK;
    t->on = true;
    t->lead = rt->o.comm_lead && me == 0 && !rt->o.dp;
    if (t->size < t->world) {
        mt_status st = mt_comm_split(rt->o.comm, t->group, t->rank, &t->gcomm, err);
        if (st == MT_E_UNSUPPORTED && !rt->o.dp)
            st = MT_OK; /* mirroring groups get by on the job's communicator */
        if (st != MT_OK)
            return mt_err_prefix(err, "tensor-parallel groups of %d ranks", t->size);
    }
    t->cnt = calloc((size_t)t->world * 4, sizeof *t->cnt);
    t->w = calloc((size_t)t->world, sizeof *t->w);
    if (!t->cnt || !t->w)
        return mt_fail(err, MT_E_NOMEM, "tensor parallelism");
    fprintf(rt->log, "tensor parallelism: rank %d of %d (%s) holds attention heads %" PRId64
            "-%" PRId64 ", o_proj rows %" PRId64 "-%" PRId64 ", vocabulary %" PRId64 "-%" PRId64
            "\n", t->rank, t->size, mt_comm_backend(rt->o.comm), t->me.head0,
            t->me.head0 + t->me.heads - 1, t->me.o_row0, t->me.o_row0 + t->me.o_rows - 1,
            t->me.vocab0, t->me.vocab0 + t->me.vocab - 1);
    if (t->size < t->world)
        fprintf(rt->log, "tensor parallelism: group %d of %d (ranks %d-%d); %s\n", t->group,
                t->world / t->size, t->group * t->size, t->group * t->size + t->size - 1,
                rt->o.dp ? "each group runs its own sequences (data-parallel attention)"
                         : "the groups mirror group 0's sequences and steps");
    return MT_OK;
}

/* The widest bf16 MLP (dense or shared expert), 0 without one. */
static int64_t mlp_inter(const model_runtime *rt, int64_t i)
{
    const rt_layer *ly = &rt->layers[i];
    return ly->moe ? (ly->sh_mxfp4 ? 0 : ly->sh_inter) : ly->inter;
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
    for (int64_t i = 0; i < rt->n_layers; i++)
        inter = mlp_inter(rt, i) > inter ? mlp_inter(rt, i) : inter;
    int64_t inter_l = inter / t->size + 1;
    MT_CHECK(dev_alloc(rt->dev, (size_t)(T * t->me.heads * rt->VD) * 2, &t->v_l, err));
    MT_CHECK(dev_alloc(rt->dev, (size_t)(T * t->me.o_rows) * 4, &t->d_l, err));
    MT_CHECK(dev_alloc(rt->dev, (size_t)(T * t->me.vocab) * 4, &t->lg_l, err));
    MT_CHECK(dev_alloc(rt->dev, (size_t)(T * inter_l) * 2, &t->h_l, err));
    MT_CHECK(dev_alloc(rt->dev, (size_t)((T / t->size + 1) * rt->H) * 4, &t->moe_y, err));
    /* The largest gather that needs its layout step: a step's logits, o_proj's
     * or down's rows, its attention heads or MLP activations. */
    size_t cap = (size_t)(T * rt->V) * 4;
    size_t alt = (size_t)(T * rt->H) * 4;
    cap = alt > cap ? alt : cap;
    alt = (size_t)(T * rt->NH * rt->VD) * 2;
    cap = alt > cap ? alt : cap;
    alt = (size_t)(T * inter) * 2;
    t->x_cap = alt > cap ? alt : cap;
    return dev_alloc(rt->dev, t->x_cap, &t->x_recv, err);
}

mt_status rt_tp_add_kernels(model_runtime *rt, mt_err *err)
{
    rt_tp *t = &rt->tp;
    if (!t->on)
        return MT_OK;
    /* The plan lists them (one per distinct gather) and rt_load registered
     * the plan's entries in order: entry i is kernel i of the set. */
    const model_plan *pl = rt->plan;
    for (int i = 0; i < pl->n_entries; i++) {
        const model_plan_entry *e = &pl->entries[i];
        if (strcmp(e->fam->name, "tp_cols") ||
            kern_shape_get(e->fam, &e->shape, "ranks") != t->size)
            continue; /* another's: the vocabulary-parallel head's (rt_vp.c) */
        if (t->n_cols == RT_TP_MAX_COLS)
            return mt_fail(err, MT_E_INVALID, "tensor parallelism: more than %d kinds of gather",
                           RT_TP_MAX_COLS);
        rt_tp_cols *c = &t->cols[t->n_cols++];
        c->U = kern_shape_get(e->fam, &e->shape, "U");
        c->per = kern_shape_get(e->fam, &e->shape, "per");
        c->es = kern_shape_get(e->fam, &e->shape, "t") == KERN_DT_F32 ? 4 : 2;
        c->k = model_kset_kernel(rt->ks, i);
    }
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
        dev_free(rt->dev, t->moe_y);
        dev_free(rt->dev, t->x_recv);
    }
    free(t->cnt);
    free(t->w);
    free(t->msg);
    mt_comm_close(t->gcomm);
    memset(t, 0, sizeof *t);
}

/* ---- exchanges ------------------------------------------------------------ */

mt_status rt_tp_gather(model_runtime *rt, int64_t total, int64_t per, const void *local,
                       void *full, int64_t rows, size_t es, mt_err *err)
{
    rt_tp *t = &rt->tp;
    /* Over the group's own communicator; without one (a backend that
     * cannot split), over the job's with nothing to or from other groups. */
    mt_comm *gc = t->gcomm ? t->gcomm : rt->o.comm;
    int n = t->gcomm ? t->size : t->world, g0 = t->gcomm ? 0 : t->group * t->size;
    size_t *sc = t->cnt, *sd = sc + n, *rc = sd + n, *rd = rc + n, off = 0;
    size_t mine = 0;
    for (int q = 0; q < n; q++) {
        int64_t q0, qn = 0;
        bool in = q >= g0 && q < g0 + t->size;
        if (in)
            model_ep_range(total, t->size, q - g0, &q0, &qn);
        rc[q] = (size_t)(rows * per * qn) * es;
        rd[q] = off; /* group rank q's block: rows x its columns, after q-1's */
        off += rc[q];
        mine = in && q - g0 == t->rank ? rc[q] : mine;
    }
    for (int q = 0; q < n; q++) /* the same block to every rank of the group */
        sc[q] = q >= g0 && q < g0 + t->size ? mine : 0, sd[q] = 0;
    if (rows <= 1) /* the blocks are the row's columns in order already */
        return mt_comm_all_to_all_v(gc, local, sc, sd, full, rc, rd, MT_COMM_U8, err);
    rt_tp_cols *c = NULL;
    for (int i = 0; i < t->n_cols && !c; i++)
        if (t->cols[i].U == total && t->cols[i].per == per && t->cols[i].es == es)
            c = &t->cols[i];
    if (!c || off > t->x_cap)
        return mt_fail(err, MT_E_INVALID, "tensor parallelism: no gather of %" PRId64 " x %"
                       PRId64 " x %zu-byte columns for %" PRId64 " rows", total, per, es, rows);
    MT_CHECK(mt_comm_all_to_all_v(gc, local, sc, sd, t->x_recv, rc, rd, MT_COMM_U8, err));
    void *bufs[] = {t->x_recv, full};
    return model_kern_run(c->k, rows, NULL, bufs, err);
}

void rt_tp_local_tokens(const model_runtime *rt, int32_t *tok, int64_t M)
{
    const model_tp_dims *d = &rt->tp.me;
    /* Groups without their own communicator sum over the whole job: only
     * the first group's rows count (the others mirror it and read the
     * zero row). */
    if (!rt->tp.gcomm && rt->tp.group) {
        for (int64_t i = 0; i < M; i++)
            tok[i] = (int32_t)d->vocab;
        return;
    }
    for (int64_t i = 0; i < M; i++)
        tok[i] = tok[i] >= d->vocab0 && tok[i] < d->vocab0 + d->vocab ? (int32_t)(tok[i] - d->vocab0)
                                                                      : (int32_t)d->vocab;
}

mt_status rt_tp_embed_sum(model_runtime *rt, int64_t M, mt_err *err)
{
    mt_comm *gc = rt->tp.gcomm ? rt->tp.gcomm : rt->o.comm;
    size_t n = (size_t)(M * rt->H);
    MT_CHECK(mt_comm_all_reduce(gc, rt->b.resid, rt->b.resid, n, MT_COMM_F32, MT_COMM_SUM, err));
    return mt_comm_all_reduce(gc, rt->b.xb, rt->b.xb, n, MT_COMM_BF16, MT_COMM_SUM, err);
}

mt_status rt_tp_moe(model_runtime *rt, rt_layer *ly, int64_t M, mt_err *err)
{
    rt_tp *t = &rt->tp;
    int64_t H = rt->H, r0, cnt;
    model_ep_range(M, t->size, t->rank, &r0, &cnt);
    /* Into a buffer of its own: an exchange's send and receive buffers
     * must not overlap. */
    MT_CHECK(rt_ep_moe(rt, ly, (const uint16_t *)rt->b.xn + r0 * H, cnt, t->moe_y, err));
    /* Each rank's rows, as one row of cnt * H columns. */
    return rt_tp_gather(rt, M, H, t->moe_y, rt->b.delta, 1, 4, err);
}

/* ---- the leader's journal and steps ----------------------------------------- */

/* The message: [n_ops, n_items, ops (4 each)..., items...]; an item is
 * [seq, n_tokens, n_prompt, flags, tokens...], flags 1: logits, 2: all.
 * An MTP step's message has -n_items (n_items >= 1) and items [seq,
 * n_tokens, hidden_row, flags, tokens...], flags 1: logits. */
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
    if (rt->dp.on) { /* data-parallel attention journals for the group */
        rt_dp_note_local(rt, op, seq, a, b);
        return;
    }
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

/* One item of a step message: [seq, nt, third, flags, tokens...]. */
static bool msg_item(rt_tp *t, int seq, const int32_t *tokens, int n_tokens, int third,
                     int flags)
{
    int nt = n_tokens > 0 && tokens ? n_tokens : 0;
    if (!msg_reserve(t, 4 + nt))
        return false;
    int32_t *e = t->msg + t->n_msg;
    e[0] = seq, e[1] = nt, e[2] = third, e[3] = flags;
    if (nt)
        memcpy(e + 4, tokens, sizeof(int32_t) * (size_t)nt);
    t->n_msg += 4 + nt;
    return true;
}

/* The message as it stands, n_items its header's second entry. */
static mt_status msg_send(model_runtime *rt, int32_t n_items, mt_err *err)
{
    rt_tp *t = &rt->tp;
    t->msg[1] = n_items;
    int32_t len = (int32_t)t->n_msg;
    mt_status st = rt_xchg_bcast(rt, &len, 1, err);
    if (st == MT_OK)
        st = rt_xchg_bcast(rt, t->msg, (size_t)len, err);
    t->n_msg = 0;
    return st;
}

mt_status rt_tp_announce(model_runtime *rt, const model_step_item *items, int n, mt_err *err)
{
    rt_tp *t = &rt->tp;
    if (!msg_reserve(t, 0))
        return mt_fail(err, MT_E_NOMEM, "tensor parallelism: step message");
    for (int i = 0; i < n; i++) {
        const model_step_item *it = &items[i];
        if (!msg_item(t, it->seq, it->tokens, it->n_tokens, it->n_prompt,
                      (it->logits ? 1 : 0) | (it->all_logits ? 2 : 0)))
            return mt_fail(err, MT_E_NOMEM, "tensor parallelism: step message");
    }
    return msg_send(rt, n, err);
}

mt_status rt_tp_announce_mtp(model_runtime *rt, const model_mtp_item *items, int n,
                             mt_err *err)
{
    rt_tp *t = &rt->tp;
    if (!msg_reserve(t, 0))
        return mt_fail(err, MT_E_NOMEM, "tensor parallelism: MTP step message");
    for (int i = 0; i < n; i++) {
        const model_mtp_item *it = &items[i];
        if (!msg_item(t, it->seq, it->tokens, it->n_tokens, it->hidden_row, it->logits ? 1 : 0))
            return mt_fail(err, MT_E_NOMEM, "tensor parallelism: MTP step message");
    }
    return msg_send(rt, -n, err);
}

