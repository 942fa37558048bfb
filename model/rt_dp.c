/* rt_dp.c: data-parallel attention under one leader (model_runtime_opts.dp).
 * Every rank holds the KV cache of its own sequences and runs their
 * attention; the MoE layers stay expert-parallel over all ranks. Rank 0
 * places each sequence on a rank and drives every step:
 *   - its operations on another rank's sequences (create, fork, free,
 *     truncate) are applied to its bookkeeping of that rank's pages (a
 *     kvc_cache without pools) and journaled;
 *   - before each step it checks every item against the rank that holds
 *     it (sequence, tokens, context, KV pages: a step refused there is
 *     refused before anything is announced), reserves the other ranks'
 *     pages in its bookkeeping, and broadcasts the journal and the other
 *     ranks' items;
 *   - every rank then runs its own items (or only the MoE layers'
 *     exchanges when it has none), and the rows whose logits were asked
 *     for go from each rank's device buffer to rank 0's in one
 *     all-to-all-v, where rank 0 copies them out to the items.
 * The followers replay the journal entries for their own sequences: their
 * slots and pages come out as the leader's bookkeeping says, since the
 * same calls on the same state pick the same ones. With batch-invariant
 * kernels a row's logits do not depend on the batch it ran in, and each
 * MoE pair's down row is computed as on one device, so the logits are
 * bitwise those of one device whichever rank ran the sequence. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "rt_impl.h"

enum { OP_CREATE = 1, OP_FORK, OP_FREE, OP_TRUNCATE, OP_MTP_TRUNCATE };
/* A step message: n_ops, n_items, logits rows from the other ranks, kind;
 * then the journal (4 entries an operation), then the other ranks' items
 * (sequence, tokens, n_prompt or the MTP hidden row there, flags, tokens). */
enum { HEAD = 4, KIND_STEP = 0, KIND_MTP = 1 };

mt_status rt_dp_open(model_runtime *rt, mt_err *err)
{
    rt_dp *dp = &rt->dp;
    const model_runtime_opts *o = &rt->o;
    if (!o->dp)
        return MT_OK;
    if (!o->comm || !o->comm_lead)
        return mt_fail(err, MT_E_INVALID, "dp: data-parallel attention under one leader needs "
                       "a communicator and comm_lead (without a leader every rank already runs "
                       "its own sequences)");
    dp->world = mt_comm_size(o->comm);
    dp->group = rt->tp.on ? rt->tp.size : 1;
    if (o->tp && rt->tp.on && dp->group == dp->world)
        return mt_fail(err, MT_E_INVALID, "dp with tp over every rank: one tensor-parallel "
                       "group has nothing to place sequences on (tp_size below the job's size "
                       "makes groups)");
    dp->size = dp->world / dp->group;
    dp->rank = mt_comm_rank(o->comm) / dp->group;
    if (dp->size < 2)
        return MT_OK; /* one rank: every sequence is its own */
    dp->on = true;
    dp->lead = mt_comm_rank(o->comm) == 0;
    if (!(dp->cnt = calloc(4 * (size_t)dp->world, sizeof *dp->cnt)))
        return mt_fail(err, MT_E_NOMEM, "dp: counts");
    dp->recv_cap = 64;
    MT_CHECK(dev_alloc(rt->dev, dp->recv_cap, &dp->recv, err));
    if (!dp->lead)
        return MT_OK;
    if (!(dp->ranks = calloc((size_t)dp->size, sizeof *dp->ranks)))
        return mt_fail(err, MT_E_NOMEM, "dp: ranks");
    for (int r = 1; r < dp->size; r++) {
        MT_CHECK(kvc_create(NULL, kvc_get_opts(rt->layers[0].kv), &dp->ranks[r].kv, err));
        if (rt->mtp.on)
            MT_CHECK(kvc_create(NULL, kvc_get_opts(rt->layers[rt->n_layers].kv),
                                &dp->ranks[r].mtp_kv, err));
    }
    fprintf(rt->log, "data-parallel attention: %d %s, each holds its own sequences' KV "
            "(%" PRId64 " pages of %d tokens); rank 0 places and drives them\n", dp->size,
            dp->group > 1 ? "tensor-parallel groups" : "ranks", rt->n_pages, rt->ps);
    return MT_OK;
}

void rt_dp_close(model_runtime *rt)
{
    rt_dp *dp = &rt->dp;
    for (int r = 1; dp->ranks && r < dp->size; r++) {
        kvc_destroy(dp->ranks[r].kv); /* its sequences with it */
        kvc_destroy(dp->ranks[r].mtp_kv);
    }
    free(dp->row_rank);
    free(dp->row_local);
    free(dp->ranks);
    free(dp->ops);
    free(dp->msg);
    free(dp->cnt);
    if (rt->dev)
        dev_free(rt->dev, dp->recv);
    memset(dp, 0, sizeof *dp);
}

bool rt_dp_remote(const model_runtime *rt, int seq)
{
    return rt->dp.lead && seq >= RT_MAX_SEQS && seq < RT_DP_SEQ(rt->dp.size, 0);
}

/* The rank and slot of a sequence id on the leader; NULL when it names no
 * live sequence of another rank. */
static rt_dp_rank *holder(const model_runtime *rt, int seq, int *slot)
{
    if (!rt_dp_remote(rt, seq))
        return NULL;
    rt_dp_rank *k = &rt->dp.ranks[seq / RT_MAX_SEQS];
    *slot = seq % RT_MAX_SEQS;
    return k->seq[*slot] ? k : NULL;
}

/* Room for one more journal entry (before the operation changes anything). */
static mt_status journal_room(rt_dp *dp, mt_err *err)
{
    if (dp->n_ops < dp->cap_ops)
        return MT_OK;
    int cap = dp->cap_ops ? 2 * dp->cap_ops : 64;
    int32_t *p = realloc(dp->ops, sizeof(int32_t) * 4 * (size_t)cap);
    if (!p)
        return mt_fail(err, MT_E_NOMEM, "dp: journal of %d operations", cap);
    dp->ops = p;
    dp->cap_ops = cap;
    return MT_OK;
}

void rt_dp_note_local(model_runtime *rt, int op, int seq, int64_t a, int64_t b)
{
    rt_dp *dp = &rt->dp;
    if (!dp->lead || dp->group < 2)
        return; /* nobody else holds rank 0's sequences */
    mt_err err = MT_ERR_INIT;
    if (journal_room(dp, &err) != MT_OK)
        abort(); /* a few bytes: the group could not be kept in step */
    int32_t *e = dp->ops + 4 * dp->n_ops++;
    e[0] = op, e[1] = seq, e[2] = (int32_t)a, e[3] = (int32_t)b;
}

static void journal(rt_dp *dp, int op, int seq, int64_t a, int64_t b)
{
    int32_t *e = dp->ops + 4 * dp->n_ops++;
    e[0] = op;
    e[1] = seq;
    e[2] = (int32_t)a;
    e[3] = (int32_t)b;
}

static int free_slot(const rt_dp_rank *k)
{
    for (int i = 0; i < RT_MAX_SEQS; i++)
        if (!k->seq[i])
            return i;
    return -1;
}

mt_status rt_dp_create(model_runtime *rt, int rank, int *seq, mt_err *err)
{
    rt_dp *dp = &rt->dp;
    rt_dp_rank *k = &dp->ranks[rank];
    int slot = free_slot(k);
    if (slot < 0)
        return mt_fail(err, MT_E_BUSY, "all %d sequence slots of rank %d are in use",
                       RT_MAX_SEQS, rank);
    MT_CHECK(journal_room(dp, err));
    MT_CHECK(kvc_seq_create(k->kv, &k->seq[slot], err));
    if (k->mtp_kv) {
        mt_status st = kvc_seq_create(k->mtp_kv, &k->mtp[slot], err);
        if (st != MT_OK) {
            kvc_seq_destroy(k->kv, k->seq[slot]);
            k->seq[slot] = NULL;
            return st;
        }
    }
    k->shared[slot] = false;
    k->n_seqs++;
    *seq = RT_DP_SEQ(rank, slot);
    journal(dp, OP_CREATE, *seq, 0, 0);
    return MT_OK;
}

mt_status rt_dp_fork(model_runtime *rt, int src, int64_t n, int *seq, mt_err *err)
{
    rt_dp *dp = &rt->dp;
    int from;
    rt_dp_rank *k = holder(rt, src, &from);
    if (!k)
        return mt_fail(err, MT_E_INVALID, "fork: no sequence %d", src);
    int64_t len = kvc_seq_len(k->seq[from]);
    if (n < 0 || n > len)
        return mt_fail(err, MT_E_INVALID, "fork: %" PRId64 " tokens of sequence %d, which has %"
                       PRId64, n, src, len);
    int slot = free_slot(k);
    if (slot < 0)
        return mt_fail(err, MT_E_BUSY, "all %d sequence slots of rank %d are in use",
                       RT_MAX_SEQS, src / RT_MAX_SEQS);
    MT_CHECK(journal_room(dp, err));
    MT_CHECK(kvc_seq_fork(k->kv, k->seq[from], n, &k->seq[slot], err));
    if (k->mtp_kv) { /* as far as the source's MTP cache goes (model_seq_fork) */
        int64_t mlen = kvc_seq_len(k->mtp[from]);
        mt_status st = kvc_seq_fork(k->mtp_kv, k->mtp[from], n < mlen ? n : mlen, &k->mtp[slot],
                                    err);
        if (st != MT_OK) {
            kvc_seq_destroy(k->kv, k->seq[slot]);
            k->seq[slot] = NULL;
            return st;
        }
    }
    k->shared[slot] = k->shared[from] = true;
    k->n_seqs++;
    *seq = RT_DP_SEQ(src / RT_MAX_SEQS, slot);
    journal(dp, OP_FORK, *seq, src, n);
    return MT_OK;
}

void rt_dp_free(model_runtime *rt, int seq)
{
    int slot;
    rt_dp_rank *k = holder(rt, seq, &slot);
    mt_err err = MT_ERR_INIT;
    if (!k)
        return;
    if (journal_room(&rt->dp, &err) != MT_OK) {
        /* The rank would keep the sequence: keep it here too (its pages
         * stay counted), and say so. */
        fprintf(rt->log, "dp: cannot free sequence %d: %s\n", seq, err.msg);
        return;
    }
    kvc_seq_destroy(k->kv, k->seq[slot]);
    k->seq[slot] = NULL;
    if (k->mtp[slot])
        kvc_seq_destroy(k->mtp_kv, k->mtp[slot]);
    k->mtp[slot] = NULL;
    k->n_seqs--;
    journal(&rt->dp, OP_FREE, seq, 0, 0);
}

mt_status rt_dp_truncate(model_runtime *rt, int seq, int64_t len, mt_err *err)
{
    int slot;
    rt_dp_rank *k = holder(rt, seq, &slot);
    if (!k)
        return mt_fail(err, MT_E_INVALID, "truncate: no sequence %d", seq);
    int64_t have = kvc_seq_len(k->seq[slot]);
    if (len < 0 || len > have)
        return mt_fail(err, MT_E_INVALID, "truncate: sequence %d to %" PRId64 " of its %" PRId64
                       " tokens", seq, len, have);
    MT_CHECK(journal_room(&rt->dp, err));
    MT_CHECK(kvc_seq_truncate(k->kv, k->seq[slot], len, err));
    if (k->mtp[slot] && kvc_seq_len(k->mtp[slot]) > len) /* as model_seq_truncate */
        MT_CHECK(kvc_seq_truncate(k->mtp_kv, k->mtp[slot], len, err));
    journal(&rt->dp, OP_TRUNCATE, seq, len, 0);
    return MT_OK;
}

int64_t rt_dp_mtp_len(const model_runtime *rt, int seq)
{
    int slot;
    const rt_dp_rank *k = holder(rt, seq, &slot);
    return k && k->mtp[slot] ? kvc_seq_len(k->mtp[slot]) : -1;
}

mt_status rt_dp_mtp_truncate(model_runtime *rt, int seq, int64_t len, mt_err *err)
{
    int slot;
    rt_dp_rank *k = holder(rt, seq, &slot);
    if (!k || !k->mtp[slot])
        return mt_fail(err, MT_E_INVALID, "MTP truncate: no MTP cache for sequence %d", seq);
    MT_CHECK(journal_room(&rt->dp, err));
    MT_CHECK(kvc_seq_truncate(k->mtp_kv, k->mtp[slot], len, err));
    journal(&rt->dp, OP_MTP_TRUNCATE, seq, len, 0);
    return MT_OK;
}

int64_t rt_dp_len(const model_runtime *rt, int seq)
{
    int slot;
    const rt_dp_rank *k = holder(rt, seq, &slot);
    return k ? kvc_seq_len(k->seq[slot]) : -1;
}

int64_t rt_dp_pages_needed(const model_runtime *rt, int seq, int64_t n)
{
    int slot;
    const rt_dp_rank *k = holder(rt, seq, &slot);
    return k ? rt_seq_grow_pages(rt, k->seq[slot], k->shared[slot], n) : 0;
}

int rt_dp_pick(const model_runtime *rt)
{
    int best = 0;
    for (int r = 1; r < rt->dp.size; r++) {
        int64_t fr = model_kv_free_pages_on(rt, r), fb = model_kv_free_pages_on(rt, best);
        int sr = model_seqs_on(rt, r), sb = model_seqs_on(rt, best);
        if (fr > fb || (fr == fb && (sr < sb || (sr == sb && rt->dp.ranks[r].tokens <
                                                              rt->dp.ranks[best].tokens))))
            best = r;
    }
    return best;
}

/* ---- the step ---------------------------------------------------------------------- */

/* Logits rows an item asks for: every token's, or the last one's, or none. */
static int64_t item_rows(bool all, bool last, int n_tokens) { return all ? n_tokens : last; }

/* The rows each rank's items asked for go to rank 0's dp->recv, rank by
 * rank (rows[r] on the leader; this rank's own count on a follower). */
static mt_status gather_rows(model_runtime *rt, const int64_t *rows, int64_t mine, mt_err *err)
{
    rt_dp *dp = &rt->dp;
    size_t W = (size_t)dp->world, G = (size_t)dp->group, row = sizeof(float) * (size_t)rt->V;
    size_t *sc = dp->cnt, *sd = sc + W, *rc = sd + W, *rd = rc + W;
    memset(dp->cnt, 0, 4 * W * sizeof *dp->cnt);
    if (dp->lead) {
        size_t total = 0;
        for (size_t u = 1; u < (size_t)dp->size; u++) { /* from each unit's first rank */
            rc[u * G] = (size_t)rows[u] * row;
            rd[u * G] = total;
            total += rc[u * G];
        }
        if (total > dp->recv_cap) {
            dev_free(rt->dev, dp->recv);
            dp->recv = NULL;
            dp->recv_cap = 0;
            MT_CHECK(dev_alloc(rt->dev, total, &dp->recv, err));
            dp->recv_cap = total;
        }
    } else if (!rt->tp.on || rt->tp.rank == 0) { /* a group's rows come from its first */
        sc[0] = (size_t)mine * row;
    }
    mt_status st = mt_comm_all_to_all_v(rt->o.comm, rt->b.logits, sc, sd, dp->recv, rc, rd,
                                        MT_COMM_U8, err);
    return st == MT_OK ? MT_OK : mt_err_prefix(err, "dp: logits rows to rank 0");
}

/* Every item against the rank holding its sequence, before anything is
 * announced: per rank its tokens and the KV pages it needs. */
static mt_status check_step(model_runtime *rt, const model_step_item *items, int n,
                            int64_t *toks, int64_t *pages, mt_err *err)
{
    for (int i = 0; i < n; i++) {
        const model_step_item *it = &items[i];
        MT_CHECK(rt_check_item(rt, items, i, model_seq_len(rt, it->seq), err));
        int r = model_seq_rank(rt, it->seq);
        toks[r] += it->n_tokens;
        pages[r] += model_seq_pages_needed(rt, it->seq, it->n_tokens);
    }
    for (int r = 0; r < rt->dp.size; r++) {
        if (toks[r] > rt->T)
            return mt_fail(err, MT_E_INVALID, "step of %" PRId64 " tokens on rank %d exceeds "
                           "max_batch_tokens %" PRId64, toks[r], r, rt->T);
        if (pages[r] > model_kv_free_pages_on(rt, r))
            return mt_fail(err, MT_E_NOMEM, "model_step: KV cache of rank %d full: its items "
                           "need %" PRId64 " new pages, %" PRId64 " free", r, pages[r],
                           model_kv_free_pages_on(rt, r));
    }
    return MT_OK;
}

/* The other ranks' pages in the leader's bookkeeping, as their rt_step
 * reserves them (in item order); undone on failure. */
static mt_status reserve_remote(model_runtime *rt, const model_step_item *items, int n,
                                mt_err *err)
{
    for (int i = 0; i < n; i++) {
        int slot;
        rt_dp_rank *k = holder(rt, items[i].seq, &slot);
        if (!k)
            continue;
        mt_status st = kvc_seq_reserve(k->kv, k->seq[slot], items[i].n_tokens, NULL, err);
        if (st != MT_OK) {
            for (int j = 0; j < i; j++) {
                int s2;
                rt_dp_rank *k2 = holder(rt, items[j].seq, &s2);
                if (k2)
                    kvc_seq_truncate(k2->kv, k2->seq[s2],
                                     kvc_seq_len(k2->seq[s2]) - items[j].n_tokens, NULL);
            }
            return mt_err_prefix(err, "dp: rank %d's KV pages", items[i].seq / RT_MAX_SEQS);
        }
    }
    return MT_OK;
}

static mt_status msg_room(rt_dp *dp, int64_t len, mt_err *err)
{
    if (len <= dp->msg_cap)
        return MT_OK;
    int32_t *m = realloc(dp->msg, sizeof(int32_t) * (size_t)len);
    if (!m)
        return mt_fail(err, MT_E_NOMEM, "dp: a step message of %" PRId64 " entries", len);
    dp->msg = m;
    dp->msg_cap = len;
    return MT_OK;
}

/* An item of either kind as the leader announces and answers it. */
typedef struct dp_item {
    int seq, rank, n_tokens;
    int arg;                     /* n_prompt (a step); the hidden row on its rank (MTP) */
    const int32_t *tokens;
    float *logits, *all_logits;
} dp_item;

/* Whether the message carries rank 0's items too: its group runs them, or
 * the other ranks hold vocabulary they embed. */
static bool msg_all(const model_runtime *rt) { return rt->dp.group > 1 || rt->vp.on; }

/* The journal and the items the other ranks run (all: rank 0's too). */
static void build_msg(rt_dp *dp, bool all, int kind, const dp_item *its, int n, int64_t rows)
{
    int32_t *m = dp->msg;
    int64_t off = HEAD + 4 * (int64_t)dp->n_ops;
    if (dp->n_ops) /* the journal may never have been allocated */
        memcpy(m + HEAD, dp->ops, sizeof(int32_t) * 4 * (size_t)dp->n_ops);
    int remote = 0;
    for (int i = 0; i < n; i++) {
        const dp_item *it = &its[i];
        if (it->rank == 0 && !all)
            continue;
        m[off] = it->seq;
        m[off + 1] = it->n_tokens;
        m[off + 2] = it->arg;
        m[off + 3] = (it->logits ? 1 : 0) | (it->all_logits ? 2 : 0);
        memcpy(m + off + 4, it->tokens, sizeof(int32_t) * (size_t)it->n_tokens);
        off += 4 + it->n_tokens;
        remote++;
    }
    m[0] = dp->n_ops;
    m[1] = remote;
    m[2] = (int32_t)rows;
    m[3] = kind;
}

/* The other ranks' rows from the device (dp->recv, or vp.remote with a
 * vocabulary-parallel head) to their items, rank by rank. */
static mt_status scatter_rows(model_runtime *rt, const dp_item *its, int n, int64_t rows,
                              mt_err *err)
{
    size_t V = (size_t)rt->V;
    float *host = malloc(sizeof(float) * (size_t)rows * V);
    if (!host)
        return mt_fail(err, MT_E_NOMEM, "dp: logits of %" PRId64 " rows", rows);
    const void *src = rt->vp.on ? rt->vp.remote : rt->dp.recv;
    mt_status st = dev_copy_from(rt->dev, host, src, sizeof(float) * (size_t)rows * V, err);
    const float *at = host;
    for (int r = 1; st == MT_OK && r < rt->dp.size; r++)
        for (int i = 0; i < n; i++) {
            const dp_item *it = &its[i];
            if (it->rank != r)
                continue;
            if (it->all_logits) {
                memcpy(it->all_logits, at, sizeof(float) * V * (size_t)it->n_tokens);
                if (it->logits)
                    memcpy(it->logits, at + V * (size_t)(it->n_tokens - 1), sizeof(float) * V);
                at += V * (size_t)it->n_tokens;
            } else if (it->logits) {
                memcpy(it->logits, at, sizeof(float) * V);
                at += V;
            }
        }
    free(host);
    return st;
}

/* The step's rows: which rank ran each and where there (the next MTP
 * step's hidden rows). */
static mt_status map_rows(model_runtime *rt, const dp_item *its, int n, mt_err *err)
{
    rt_dp *dp = &rt->dp;
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += its[i].n_tokens;
    dp->n_rows = 0;
    if (total > dp->cap_rows) {
        int32_t *a = realloc(dp->row_rank, sizeof(int32_t) * (size_t)total);
        if (a)
            dp->row_rank = a;
        int32_t *b = a ? realloc(dp->row_local, sizeof(int32_t) * (size_t)total) : NULL;
        if (!b)
            return mt_fail(err, MT_E_NOMEM, "dp: row map of %" PRId64 " rows", total);
        dp->row_local = b;
        dp->cap_rows = total;
    }
    int32_t *next = calloc((size_t)dp->size, sizeof *next);
    if (!next)
        return mt_fail(err, MT_E_NOMEM, "dp: row map");
    for (int i = 0; i < n; i++)
        for (int t = 0; t < its[i].n_tokens; t++) {
            dp->row_rank[dp->n_rows] = its[i].rank;
            dp->row_local[dp->n_rows++] = next[its[i].rank]++;
        }
    free(next);
    return MT_OK;
}

/* Announces the journal and the items the other ranks run (remote_rows
 * logits rows asked of them in all). */
static mt_status announce(model_runtime *rt, int kind, const dp_item *its, int n,
                          int64_t remote_rows, mt_err *err)
{
    rt_dp *dp = &rt->dp;
    bool all = msg_all(rt);
    int64_t len = HEAD + 4 * (int64_t)dp->n_ops;
    for (int i = 0; i < n; i++)
        if (its[i].rank != 0 || all) /* what build_msg carries */
            len += 4 + its[i].n_tokens;
    MT_CHECK(msg_room(dp, len, err));
    if (rt->vp.on) { /* the whole step, as every rank will know it */
        rt_vp_begin(rt);
        for (int i = 0; i < n; i++)
            MT_CHECK(rt_vp_add(rt, its[i].rank, its[i].tokens, its[i].n_tokens,
                               (int)item_rows(its[i].all_logits, its[i].logits,
                                              its[i].n_tokens), err));
        MT_CHECK(rt_vp_seal(rt, err));
    }
    build_msg(dp, all, kind, its, n, remote_rows);
    int32_t l32 = (int32_t)len;
    MT_CHECK(rt_xchg_bcast(rt, &l32, 1, err));
    MT_CHECK(rt_xchg_bcast(rt, dp->msg, (size_t)len, err));
    dp->n_ops = 0;
    return MT_OK;
}

/* After rank 0's own part of a step (st): joins the step if that part was
 * refused before its forward, gathers and hands out the other ranks'
 * logits rows, maps the rows. */
static mt_status finish(model_runtime *rt, int kind, mt_status st, const dp_item *its, int n,
                        const int64_t *rows, int64_t remote_rows, mt_err *err)
{
    if (st != MT_OK && !rt->ep_joined) {
        /* Refused before its forward although it was checked: still join
         * the step so the other ranks are not left waiting. */
        mt_err e2 = MT_ERR_INIT;
        if ((kind == KIND_MTP ? rt_empty_mtp(rt, &e2) : rt_empty_forward(rt, &e2)) != MT_OK)
            fprintf(rt->log, "dp: %s\n", e2.msg);
    }
    if (remote_rows && st == MT_OK && rt->vp.on) { /* the head left them in vp.remote */
        st = scatter_rows(rt, its, n, remote_rows, err);
    } else if (remote_rows && !rt->vp.on && (st == MT_OK || !rt->ep_joined)) {
        mt_err e2 = MT_ERR_INIT;
        mt_status gs = gather_rows(rt, rows, 0, st == MT_OK ? err : &e2);
        if (st == MT_OK && (st = gs) == MT_OK)
            st = scatter_rows(rt, its, n, remote_rows, err);
    }
    rt->dp.n_rows = 0;
    if (st == MT_OK)
        st = map_rows(rt, its, n, err);
    return rt_xchg_step_failed(rt, st);
}

mt_status rt_dp_step(model_runtime *rt, model_step_item *items, int n, mt_err *err)
{
    rt_dp *dp = &rt->dp;
    if (n == 0)
        return MT_OK; /* the followers wait for a step with work */
    if (n < 0 || n > RT_MAX_SEQS)
        return mt_fail(err, MT_E_INVALID, "model_step: %d items, at most %d", n, RT_MAX_SEQS);
    size_t S = (size_t)dp->size;
    int64_t *toks = calloc(3 * S, sizeof *toks), *pages = toks + S, *rows = pages + S;
    model_step_item *mine = malloc(sizeof *mine * (size_t)n);
    dp_item *its = malloc(sizeof *its * (size_t)n);
    mt_status st = MT_OK;
    if (!toks || !mine || !its) {
        st = mt_fail(err, MT_E_NOMEM, "dp: step");
        goto done;
    }
    if ((st = check_step(rt, items, n, toks, pages, err)) != MT_OK)
        goto done;
    int64_t remote_rows = 0;
    int n_mine = 0;
    for (int i = 0; i < n; i++) {
        const model_step_item *it = &items[i];
        int r = model_seq_rank(rt, it->seq);
        its[i] = (dp_item){it->seq, r, it->n_tokens, it->n_prompt, it->tokens, it->logits,
                           it->all_logits};
        if (r == 0) {
            mine[n_mine++] = *it;
            continue;
        }
        rows[r] += item_rows(it->all_logits, it->logits, it->n_tokens);
        remote_rows += item_rows(it->all_logits, it->logits, it->n_tokens);
    }
    if ((st = reserve_remote(rt, items, n, err)) != MT_OK)
        goto done;
    if ((st = announce(rt, KIND_STEP, its, n, remote_rows, err)) != MT_OK)
        goto done;
    rt->ep_joined = false;
    if (n_mine) {
        st = rt_step(rt, mine, n_mine, err);
    } else {
        rt->ep_joined = true;
        st = rt_empty_forward(rt, err);
    }
    st = finish(rt, KIND_STEP, st, its, n, rows, remote_rows, err);
    for (size_t r = 0; st == MT_OK && r < S; r++)
        dp->ranks[r].tokens += toks[r];
done:
    free(toks);
    free(mine);
    free(its);
    return st;
}

/* ---- MTP draft steps ------------------------------------------------------------ */

/* Every MTP item against the rank holding its sequence (its hidden rows
 * must have run there, consecutively), before anything is announced. */
static mt_status check_mtp(model_runtime *rt, const model_mtp_item *items, int n, dp_item *its,
                           int64_t *toks, int64_t *pages, mt_err *err)
{
    rt_dp *dp = &rt->dp;
    for (int i = 0; i < n; i++) {
        const model_mtp_item *it = &items[i];
        int64_t mlen = model_mtp_len(rt, it->seq);
        MT_CHECK(rt_check_mtp_item(rt, items, i, mlen, err));
        int r = model_seq_rank(rt, it->seq);
        if (it->hidden_row < 0 || it->hidden_row + it->n_tokens > dp->n_rows)
            return mt_fail(err, MT_E_INVALID, "MTP item %d (sequence %d): hidden rows %d..%d, "
                           "the previous forward left %" PRId64, i, it->seq, it->hidden_row,
                           it->hidden_row + it->n_tokens - 1, dp->n_rows);
        int32_t h0 = dp->row_local[it->hidden_row];
        for (int t = 0; t < it->n_tokens; t++)
            if (dp->row_rank[it->hidden_row + t] != r ||
                dp->row_local[it->hidden_row + t] != h0 + t)
                return mt_fail(err, MT_E_INVALID, "MTP item %d (sequence %d, on rank %d): hidden "
                               "row %d ran on rank %d: a draft step reads its own sequence's "
                               "rows", i, it->seq, r, it->hidden_row + t,
                               dp->row_rank[it->hidden_row + t]);
        int slot;
        const rt_dp_rank *k = holder(rt, it->seq, &slot);
        const rt_seq *own = k ? NULL : &rt->seqs[it->seq];
        pages[r] += rt_seq_grow_pages(rt, k ? k->mtp[slot] : own->mtp_kv,
                                      k ? k->shared[slot] : own->shared, it->n_tokens);
        toks[r] += it->n_tokens;
        its[i] = (dp_item){it->seq, r, it->n_tokens, h0, it->tokens, it->logits, NULL};
    }
    for (int r = 0; r < dp->size; r++) {
        if (toks[r] > rt->T)
            return mt_fail(err, MT_E_INVALID, "MTP step of %" PRId64 " tokens on rank %d "
                           "exceeds max_batch_tokens %" PRId64, toks[r], r, rt->T);
        int64_t fr = r ? kvc_free_pages(dp->ranks[r].mtp_kv)
                       : kvc_free_pages(rt->layers[rt->n_layers].kv);
        if (pages[r] > fr)
            return mt_fail(err, MT_E_NOMEM, "model_mtp_step: MTP KV cache of rank %d full: its "
                           "items need %" PRId64 " new pages, %" PRId64 " free", r, pages[r], fr);
    }
    return MT_OK;
}

mt_status rt_dp_mtp_step(model_runtime *rt, model_mtp_item *items, int n, mt_err *err)
{
    rt_dp *dp = &rt->dp;
    if (n == 0)
        return MT_OK;
    size_t S = (size_t)dp->size;
    int64_t *toks = calloc(3 * S, sizeof *toks), *pages = toks + S, *rows = pages + S;
    model_mtp_item *mine = malloc(sizeof *mine * (size_t)n);
    dp_item *its = malloc(sizeof *its * (size_t)n);
    mt_status st = MT_OK;
    if (!toks || !mine || !its) {
        st = mt_fail(err, MT_E_NOMEM, "dp: MTP step");
        goto done;
    }
    if ((st = check_mtp(rt, items, n, its, toks, pages, err)) != MT_OK)
        goto done;
    int64_t remote_rows = 0;
    int n_mine = 0, reserved = 0;
    for (int i = 0; i < n; i++) {
        int r = its[i].rank;
        if (r == 0) {
            mine[n_mine] = items[i];
            mine[n_mine++].hidden_row = its[i].arg; /* its rows on rank 0 */
            continue;
        }
        rows[r] += items[i].logits != NULL;
        remote_rows += items[i].logits != NULL;
    }
    /* The other ranks' MTP pages in the bookkeeping, as their step takes them. */
    for (int i = 0; i < n && st == MT_OK; i++) {
        int slot;
        rt_dp_rank *k = holder(rt, items[i].seq, &slot);
        if (k && (st = kvc_seq_reserve(k->mtp_kv, k->mtp[slot], items[i].n_tokens, NULL,
                                       err)) == MT_OK)
            reserved = i + 1;
    }
    if (st != MT_OK) {
        for (int i = 0; i < reserved; i++) {
            int slot;
            rt_dp_rank *k = holder(rt, items[i].seq, &slot);
            if (k)
                kvc_seq_truncate(k->mtp_kv, k->mtp[slot],
                                 kvc_seq_len(k->mtp[slot]) - items[i].n_tokens, NULL);
        }
        goto done;
    }
    if ((st = announce(rt, KIND_MTP, its, n, remote_rows, err)) != MT_OK)
        goto done;
    rt->ep_joined = false;
    if (n_mine) {
        st = rt_mtp_step(rt, mine, n_mine, err);
    } else {
        rt->ep_joined = true;
        st = rt_empty_mtp(rt, err);
    }
    st = finish(rt, KIND_MTP, st, its, n, rows, remote_rows, err);
done:
    free(toks);
    free(mine);
    free(its);
    return st;
}

/* ---- the followers ----------------------------------------------------------------- */

/* The journal entries for this rank's sequences. */
static mt_status replay(model_runtime *rt, const int32_t *ops, int n_ops, mt_err *err)
{
    for (int i = 0; i < n_ops; i++) {
        const int32_t *e = ops + 4 * i;
        if (e[1] / RT_MAX_SEQS != rt->dp.rank)
            continue;
        int slot = e[1] % RT_MAX_SEQS, got = slot;
        mt_status st = MT_OK;
        switch (e[0]) {
        case OP_CREATE: st = model_seq_create(rt, &got, err); break;
        case OP_FORK: st = model_seq_fork(rt, e[2] % RT_MAX_SEQS, e[3], &got, err); break;
        case OP_FREE: model_seq_free(rt, slot); break;
        case OP_TRUNCATE: st = model_seq_truncate(rt, slot, e[2], err); break;
        case OP_MTP_TRUNCATE: st = model_mtp_truncate(rt, slot, e[2], err); break;
        default: return mt_fail(err, MT_E_FORMAT, "dp: operation %d", e[0]);
        }
        if (st != MT_OK)
            return mt_err_prefix(err, "dp: replaying rank 0's operation %d", i);
        if (got != slot)
            return mt_fail(err, MT_E_DEVICE, "dp: rank 0 placed sequence %d in slot %d; this "
                           "rank picked %d", e[1], slot, got);
    }
    return MT_OK;
}

/* One announced step: this rank's items, its rows to rank 0. */
static mt_status follow_one(model_runtime *rt, const int32_t *m, int64_t len,
                            model_step_item *mine, model_mtp_item *mine_mtp, mt_err *err)
{
    static float marker; /* with keep_logits an item's pointers only say which rows */
    if (len < HEAD || m[0] < 0 || m[1] < 0 || m[1] > RT_MAX_SEQS * rt->dp.size || m[2] < 0 ||
        (m[3] != KIND_STEP && m[3] != KIND_MTP) || HEAD + 4 * (int64_t)m[0] > len)
        return mt_fail(err, MT_E_FORMAT, "dp: a step message of %" PRId64 " entries", len);
    bool mtp = m[3] == KIND_MTP;
    if (mtp && !rt->mtp.on)
        return mt_fail(err, MT_E_INVALID, "rank 0 runs MTP draft steps, but this rank opened "
                       "its runtime without speculative_steps: every rank needs the same options");
    MT_CHECK(replay(rt, m + HEAD, m[0], err));
    int64_t off = HEAD + 4 * (int64_t)m[0], rows = 0;
    int n = 0;
    rt_vp_begin(rt);
    for (int i = 0; i < m[1]; i++) {
        if (off + 4 > len || m[off + 1] < 1 || off + 4 + m[off + 1] > len)
            return mt_fail(err, MT_E_FORMAT, "dp: item %d of a step message", i);
        if (rt->vp.on)
            MT_CHECK(rt_vp_add(rt, m[off] / RT_MAX_SEQS, m + off + 4, m[off + 1],
                               (int)item_rows(!mtp && (m[off + 3] & 2), m[off + 3] & 1,
                                              m[off + 1]), err));
        if (m[off] / RT_MAX_SEQS == rt->dp.rank) {
            if (n == RT_MAX_SEQS)
                return mt_fail(err, MT_E_FORMAT, "dp: more than %d items", RT_MAX_SEQS);
            int flags = m[off + 3];
            if (mtp)
                mine_mtp[n] = (model_mtp_item){.seq = m[off] % RT_MAX_SEQS,
                                               .n_tokens = m[off + 1], .hidden_row = m[off + 2],
                                               .tokens = m + off + 4,
                                               .logits = (flags & 1) ? &marker : NULL};
            else
                mine[n] = (model_step_item){.seq = m[off] % RT_MAX_SEQS, .n_tokens = m[off + 1],
                                            .n_prompt = m[off + 2], .tokens = m + off + 4,
                                            .logits = (flags & 1) ? &marker : NULL,
                                            .all_logits = (flags & 2) ? &marker : NULL};
            n++;
            rows += item_rows(!mtp && (flags & 2), flags & 1, m[off + 1]);
        }
        off += 4 + m[off + 1];
    }
    if (rt->vp.on)
        MT_CHECK(rt_vp_seal(rt, err));
    rt->ep_joined = false;
    rt->dp.keep_logits = true;
    mt_status st;
    if (n) {
        st = mtp ? rt_mtp_step(rt, mine_mtp, n, err) : rt_step(rt, mine, n, err);
    } else {
        rt->ep_joined = true;
        st = mtp ? rt_empty_mtp(rt, err) : rt_empty_forward(rt, err);
    }
    rt->dp.keep_logits = false;
    bool before = st != MT_OK && !rt->ep_joined;
    if (before) {
        /* Rank 0 checked these items against its bookkeeping of this
         * rank: a refusal here means the two disagree. Join the step,
         * then stop. */
        mt_err e2 = MT_ERR_INIT;
        if ((mtp ? rt_empty_mtp(rt, &e2) : rt_empty_forward(rt, &e2)) != MT_OK)
            fprintf(rt->log, "dp: %s\n", e2.msg);
    }
    if (m[2] > 0 && (st == MT_OK || before) && !rt->vp.on) {
        mt_err e2 = MT_ERR_INIT;
        mt_status gs = gather_rows(rt, NULL, rows, st == MT_OK ? err : &e2);
        if (st == MT_OK)
            st = gs;
    }
    if (before)
        return mt_err_prefix(err, "dp: rank %d refused rank 0's step", rt->dp.rank);
    return rt_xchg_step_failed(rt, st);
}

mt_status rt_dp_follow(model_runtime *rt, int64_t *steps, mt_err *err)
{
    rt_dp *dp = &rt->dp;
    model_step_item *mine = malloc(sizeof *mine * RT_MAX_SEQS);
    model_mtp_item *mine_mtp = malloc(sizeof *mine_mtp * RT_MAX_SEQS);
    if (!mine || !mine_mtp) {
        free(mine);
        free(mine_mtp);
        return mt_fail(err, MT_E_NOMEM, "dp: items");
    }
    mt_status st = MT_OK;
    for (;;) {
        int32_t len = 0;
        if ((st = rt_xchg_bcast(rt, &len, 1, err)) != MT_OK || len < 0)
            break; /* RT_EP_END: rank 0 closed its runtime */
        if ((st = msg_room(dp, len, err)) != MT_OK ||
            (st = rt_xchg_bcast(rt, dp->msg, (size_t)len, err)) != MT_OK ||
            (st = follow_one(rt, dp->msg, len, mine, mine_mtp, err)) != MT_OK)
            break;
        if (steps)
            ++*steps;
    }
    free(mine);
    free(mine_mtp);
    return st;
}
