/* rt_seq.c: the runtime's sequences (runtime.h): slots, and their pages in
 * every layer's KV cache (and the MTP layer's): create, fork (sharing a
 * prefix's pages), truncate, free, lengths and page counts. Under tensor
 * parallelism the leader journals each operation (rt_tp_note) for its
 * followers to replay. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "rt_impl.h"

static bool seq_ok(const model_runtime *rt, int seq)
{
    return seq >= 0 && seq < RT_MAX_SEQS && rt->seqs[seq].used;
}

static mt_status new_slot(model_runtime *rt, int *seq, mt_err *err)
{
    for (int i = 0; i < RT_MAX_SEQS; i++)
        if (!rt->seqs[i].used) {
            rt->seqs[i].kv = calloc((size_t)rt->n_layers, sizeof(kvc_seq *));
            if (!rt->seqs[i].kv)
                return mt_fail(err, MT_E_NOMEM, "sequence");
            rt->seqs[i].used = true;
            rt->seqs[i].shared = false;
            rt->seqs[i].mtp_kv = NULL;
            *seq = i;
            return MT_OK;
        }
    return mt_fail(err, MT_E_BUSY, "all %d sequence slots are in use", RT_MAX_SEQS);
}

mt_status model_seq_create(model_runtime *rt, int *seq, mt_err *err)
{
    return model_seq_create_on(rt, rt->dp.lead ? rt_dp_pick(rt) : 0, seq, err);
}

mt_status model_seq_create_on(model_runtime *rt, int rank, int *seq, mt_err *err)
{
    if (rank < 0 || rank >= model_runtime_dp_ranks(rt))
        return mt_fail(err, MT_E_INVALID, "create: rank %d; sequences go on ranks 0..%d", rank,
                       model_runtime_dp_ranks(rt) - 1);
    if (rank > 0)
        return rt_dp_create(rt, rank, seq, err);
    int s = -1;
    mt_status st = new_slot(rt, &s, err);
    for (int64_t l = 0; st == MT_OK && l < rt->n_layers; l++)
        st = kvc_seq_create(rt->layers[l].kv, &rt->seqs[s].kv[l], err);
    if (st == MT_OK && rt->mtp.on)
        st = kvc_seq_create(rt->layers[rt->n_layers].kv, &rt->seqs[s].mtp_kv, err);
    if (st != MT_OK) {
        if (s >= 0)
            model_seq_free(rt, s);
        return st;
    }
    *seq = s;
    rt_tp_note(rt, RT_TP_OP_CREATE, s, 0, 0);
    return MT_OK;
}

mt_status model_seq_fork(model_runtime *rt, int src, int64_t n, int *seq, mt_err *err)
{
    if (rt_dp_remote(rt, src))
        return rt_dp_fork(rt, src, n, seq, err);
    if (!seq_ok(rt, src))
        return mt_fail(err, MT_E_INVALID, "fork: no sequence %d", src);
    int64_t len = model_seq_len(rt, src);
    if (n < 0 || n > len)
        return mt_fail(err, MT_E_INVALID, "fork: %" PRId64 " tokens of sequence %d, which has %"
                       PRId64, n, src, len);
    int s = -1;
    mt_status st = new_slot(rt, &s, err);
    for (int64_t l = 0; st == MT_OK && l < rt->n_layers; l++)
        st = kvc_seq_fork(rt->layers[l].kv, rt->seqs[src].kv[l], n, &rt->seqs[s].kv[l], err);
    if (st == MT_OK && rt->mtp.on) {
        /* The MTP cache as far as the source has it (a shorter one only
         * drafts worse until it catches up: verification keeps output exact). */
        int64_t mlen = kvc_seq_len(rt->seqs[src].mtp_kv);
        st = kvc_seq_fork(rt->layers[rt->n_layers].kv, rt->seqs[src].mtp_kv, n < mlen ? n : mlen,
                          &rt->seqs[s].mtp_kv, err);
    }
    if (st != MT_OK) {
        if (s >= 0)
            model_seq_free(rt, s);
        return st;
    }
    rt->seqs[s].shared = rt->seqs[src].shared = true;
    *seq = s;
    rt_tp_note(rt, RT_TP_OP_FORK, s, src, n);
    return MT_OK;
}

void model_seq_free(model_runtime *rt, int seq)
{
    if (rt && rt_dp_remote(rt, seq))
        rt_dp_free(rt, seq);
    if (!rt || !seq_ok(rt, seq))
        return;
    rt_tp_note(rt, RT_TP_OP_FREE, seq, 0, 0);
    rt_seq *s = &rt->seqs[seq];
    for (int64_t l = 0; l < rt->n_layers; l++)
        if (s->kv[l])
            kvc_seq_destroy(rt->layers[l].kv, s->kv[l]);
    if (s->mtp_kv)
        kvc_seq_destroy(rt->layers[rt->n_layers].kv, s->mtp_kv);
    s->mtp_kv = NULL;
    free(s->kv);
    s->kv = NULL;
    s->used = false;
}

int64_t model_seq_len(const model_runtime *rt, int seq)
{
    if (rt_dp_remote(rt, seq))
        return rt_dp_len(rt, seq);
    return seq_ok(rt, seq) ? kvc_seq_len(rt->seqs[seq].kv[0]) : -1;
}

int64_t model_kv_free_pages(const model_runtime *rt) { return kvc_free_pages(rt->layers[0].kv); }

int model_runtime_dp_ranks(const model_runtime *rt) { return rt->dp.lead ? rt->dp.size : 1; }

int model_seq_rank(const model_runtime *rt, int seq)
{
    if (rt_dp_remote(rt, seq))
        return rt_dp_len(rt, seq) >= 0 ? seq / RT_MAX_SEQS : -1;
    return seq_ok(rt, seq) ? 0 : -1;
}

int64_t model_kv_free_pages_on(const model_runtime *rt, int rank)
{
    if (rank == 0)
        return model_kv_free_pages(rt);
    return rank > 0 && rank < model_runtime_dp_ranks(rt) ? kvc_free_pages(rt->dp.ranks[rank].kv)
                                                         : 0;
}

int model_seqs_on(const model_runtime *rt, int rank)
{
    int n = 0;
    if (rank == 0)
        for (int i = 0; i < RT_MAX_SEQS; i++)
            n += rt->seqs[i].used;
    else if (rank > 0 && rank < model_runtime_dp_ranks(rt))
        n = rt->dp.ranks[rank].n_seqs;
    return n;
}

int64_t model_rank_tokens(const model_runtime *rt, int rank)
{
    if (rt->dp.lead)
        return rank >= 0 && rank < rt->dp.size ? rt->dp.ranks[rank].tokens : 0;
    return rank == 0 ? rt->pf.rows_absorbed + rt->pf.rows_prefill : 0;
}

int model_kv_page_size(const model_runtime *rt) { return rt->ps; }

int64_t rt_seq_grow_pages(const model_runtime *rt, const kvc_seq *s, bool shared, int64_t n)
{
    if (!s || n <= 0)
        return 0;
    int64_t len = kvc_seq_len(s), held = kvc_seq_pages(s, NULL, 0);
    int64_t need = (len + n + rt->ps - 1) / rt->ps - held;
    /* A shared partial last page is copied before it is written (an upper
     * bound: the other owner may be gone). */
    return need + (shared && len % rt->ps);
}

int64_t model_seq_pages_needed(const model_runtime *rt, int seq, int64_t n)
{
    if (rt_dp_remote(rt, seq))
        return rt_dp_pages_needed(rt, seq, n);
    return seq_ok(rt, seq) ? rt_seq_grow_pages(rt, rt->seqs[seq].kv[0], rt->seqs[seq].shared, n)
                           : 0;
}

mt_status model_seq_truncate(model_runtime *rt, int seq, int64_t len, mt_err *err)
{
    if (rt_dp_remote(rt, seq))
        return rt_dp_truncate(rt, seq, len, err);
    if (!seq_ok(rt, seq))
        return mt_fail(err, MT_E_INVALID, "truncate: no sequence %d", seq);
    int64_t have = model_seq_len(rt, seq);
    if (len < 0 || len > have)
        return mt_fail(err, MT_E_INVALID, "truncate: sequence %d to %" PRId64 " of its %" PRId64
                       " tokens", seq, len, have);
    rt_tp_note(rt, RT_TP_OP_TRUNCATE, seq, len, 0);
    rt_seq *s = &rt->seqs[seq];
    /* Only the sequence's own page references go: a page shared with a
     * fork (the prefix cache) keeps its contents and its other owners. */
    for (int64_t l = 0; l < rt->n_layers; l++)
        MT_CHECK(kvc_seq_truncate(rt->layers[l].kv, s->kv[l], len, err));
    if (s->mtp_kv && kvc_seq_len(s->mtp_kv) > len)
        MT_CHECK(kvc_seq_truncate(rt->layers[rt->n_layers].kv, s->mtp_kv, len, err));
    return MT_OK;
}
