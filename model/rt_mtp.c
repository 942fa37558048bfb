/* rt_mtp.c: the MTP layer as a draft model (runtime.h, speculative
 * decoding): rt_mtp_step (model_mtp_step on one rank; rt_driver.c keeps
 * the ranks in step) runs the MTP head and its decoder layer over a batch
 * of positions, model_mtp_truncate rolls a sequence's MTP cache back.
 *
 * Across ranks the MTP layer is split like the others: its routed experts
 * over the ranks (expert-parallel), and under tensor parallelism its
 * heads, o_proj rows and bf16 shared expert, the embedding it reads and the
 * lm_head it shares with the main model by vocabulary.
 *
 * MTP position p of a sequence reads the embedding of token p + 1 and the
 * hidden state of position p: [enorm(embed(t[p+1])) | hnorm(h[p])] ->
 * eh_proj -> the MTP decoder layer (attention over the MTP layer's own
 * paged cache, MoE with its experts quantized to MXFP4 at load) ->
 * shared_head.norm -> the main lm_head. The hidden states stay on the
 * device: they are rows of xb (the last layer's output, before the final
 * norm) of the forward that ran just before, normed here with that
 * forward's final norm (model.norm after a model_step, shared_head.norm
 * after an MTP step), as sglang and vLLM hand the MTP layer the normed
 * hidden state. Every computation is a kernel of the runtime's set (the
 * head's kernels are plan entries MODEL_GS_MTP_*). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "rt_impl.h"

#define RUN(k, m, shape, ...)                                                                    \
    do {                                                                                         \
        void *bufs_[] = {__VA_ARGS__};                                                           \
        mt_status s_ = model_kern_run((k), (m), (shape), bufs_, err);                            \
        if (s_ != MT_OK)                                                                         \
            return s_;                                                                           \
    } while (0)

bool model_runtime_has_mtp(const model_runtime *rt) { return rt->mtp.on; }

static bool seq_used(const model_runtime *rt, int seq)
{
    return seq >= 0 && seq < RT_MAX_SEQS && rt->seqs[seq].used;
}

int64_t model_mtp_len(const model_runtime *rt, int seq)
{
    if (rt_dp_remote(rt, seq))
        return rt_dp_mtp_len(rt, seq);
    if (!rt->mtp.on || !seq_used(rt, seq) || !rt->seqs[seq].mtp_kv)
        return -1;
    return kvc_seq_len(rt->seqs[seq].mtp_kv);
}

mt_status model_mtp_truncate(model_runtime *rt, int seq, int64_t len, mt_err *err)
{
    if (rt_dp_remote(rt, seq))
        return rt_dp_mtp_truncate(rt, seq, len, err);
    if (model_mtp_len(rt, seq) < 0)
        return mt_fail(err, MT_E_INVALID, "MTP truncate: no MTP cache for sequence %d", seq);
    rt_tp_note(rt, RT_TP_OP_MTP_TRUNCATE, seq, len, 0);
    return kvc_seq_truncate(rt->layers[rt->n_layers].kv, rt->seqs[seq].mtp_kv, len, err);
}

/* The head, the layer and the draft logits over M staged rows. */
static mt_status mtp_forward(model_runtime *rt, int64_t M, int64_t cmax, int64_t nl, mt_err *err)
{
    rt_bufs *b = &rt->b;
    rt_mtp *m = &rt->mtp;
    MT_CHECK(rt_vp_share(rt, M, nl, err));
    MT_CHECK(rt_vp_check(rt, M, nl, err));
    /* Hidden states of the previous forward, normed as it normed them. */
    kern_shape s = rt->k_gather->shape;
    model_kern_shape_set(rt->k_gather, &s, "V", m->last_rows);
    RUN(rt->k_gather, M, &s, b->xb, m->hrows, b->xgf, b->xg);
    RUN(rt->k_norm_final, M, NULL, b->xg, m->last_was_mtp ? m->head_norm : rt->final_norm, m->hin);
    RUN(rt->k_norm_final, M, NULL, m->hin, m->hnorm, b->xg);
    if (rt->vp.on) /* the rows come from the ranks holding their tokens */
        MT_CHECK(rt_vp_embed(rt, err));
    else
        RUN(rt->k_embed, M, NULL, rt->embed, b->tok, b->resid, b->xb);
    if (rt->tp.on && !rt->vp.on) /* each rank embedded its vocabulary's tokens, zeros for
                                  * the others */
        MT_CHECK(rt_tp_embed_sum(rt, M, err));
    RUN(rt->k_norm_final, M, NULL, b->xb, m->enorm, b->xn);
    RUN(m->cat_e, M, NULL, b->xn, m->cat);
    RUN(m->cat_h, M, NULL, b->xg, m->cat);
    RUN(m->eh, M, NULL, m->cat, m->w_eh, b->delta);
    RUN(m->to_f32, M, NULL, b->delta, b->resid);
    RUN(m->to_bf16, M, NULL, b->delta, b->xb);
    mt_status st = rt_layer_forward(rt, &rt->layers[rt->n_layers], M, cmax, err);
    if (st != MT_OK)
        return mt_err_prefix(err, "MTP layer");
    if (nl) {
        RUN(rt->k_norm_final, M, NULL, b->xb, m->head_norm, b->xn);
        s = rt->k_gather->shape;
        model_kern_shape_set(rt->k_gather, &s, "V", M);
        RUN(rt->k_gather, nl, &s, b->xn, b->lrows, b->xgf, b->xg);
    }
    return rt_head(rt, nl, err);
}

#undef RUN

mt_status rt_check_mtp_item(const model_runtime *rt, const model_mtp_item *items, int i,
                            int64_t mlen, mt_err *err)
{
    const model_mtp_item *it = &items[i];
    if (mlen < 0)
        return mt_fail(err, MT_E_INVALID, "MTP item %d: no sequence %d", i, it->seq);
    for (int j = 0; j < i; j++)
        if (items[j].seq == it->seq)
            return mt_fail(err, MT_E_INVALID, "MTP items %d and %d both extend sequence %d", j, i,
                           it->seq);
    if (it->n_tokens < 1 || !it->tokens)
        return mt_fail(err, MT_E_INVALID, "MTP item %d (sequence %d): %d tokens", i, it->seq,
                       it->n_tokens);
    for (int t = 0; t < it->n_tokens; t++)
        if (it->tokens[t] < 0 || it->tokens[t] >= rt->V)
            return mt_fail(err, MT_E_INVALID, "MTP item %d (sequence %d): token %d is id %" PRId32
                           ", outside the vocabulary [0, %" PRId64 ")", i, it->seq, t,
                           it->tokens[t], rt->V);
    if (mlen + it->n_tokens > rt->max_ctx)
        return mt_fail(err, MT_E_INVALID, "MTP item %d (sequence %d): %" PRId64 " + %d "
                       "positions exceed the maximum context %" PRId64, i, it->seq, mlen,
                       it->n_tokens, rt->max_ctx);
    return MT_OK;
}

static mt_status check_items(model_runtime *rt, const model_mtp_item *items, int n,
                             int64_t *total, mt_err *err)
{
    *total = 0;
    for (int i = 0; i < n; i++) {
        const model_mtp_item *it = &items[i];
        bool here = seq_used(rt, it->seq) && rt->seqs[it->seq].mtp_kv; /* this rank's own */
        MT_CHECK(rt_check_mtp_item(rt, items, i, here ? model_mtp_len(rt, it->seq) : -1, err));
        if (it->hidden_row < 0 || it->hidden_row + it->n_tokens > rt->mtp.last_rows)
            return mt_fail(err, MT_E_INVALID, "MTP item %d (sequence %d): hidden rows %d..%d, "
                           "the previous forward left %" PRId64, i, it->seq, it->hidden_row,
                           it->hidden_row + it->n_tokens - 1, rt->mtp.last_rows);
        *total += it->n_tokens;
    }
    if (*total > rt->T)
        return mt_fail(err, MT_E_INVALID, "MTP step of %" PRId64 " tokens exceeds "
                       "max_batch_tokens %" PRId64, *total, rt->T);
    return MT_OK;
}

mt_status rt_mtp_step(model_runtime *rt, model_mtp_item *items, int n, mt_err *err)
{
    if (n <= 0 || n > RT_MAX_SEQS)
        return n == 0 ? MT_OK : mt_fail(err, MT_E_INVALID, "model_mtp_step: %d items", n);
    int64_t M;
    mt_status st = check_items(rt, items, n, &M, err);
    if (st != MT_OK)
        return st;
    kvc_cache *kv = rt->layers[rt->n_layers].kv;
    int64_t *old = malloc(sizeof(int64_t) * (size_t)n), *rows = malloc(sizeof(int64_t) * (size_t)M);
    int32_t *lofs = malloc(sizeof(int32_t) * (size_t)n), *hrow = malloc(sizeof(int32_t) * (size_t)M);
    kvc_seq **seqs = malloc(sizeof(kvc_seq *) * (size_t)n);
    float *host = NULL;
    int reserved = 0;
    if (!old || !rows || !lofs || !hrow || !seqs) {
        st = mt_fail(err, MT_E_NOMEM, "model_mtp_step");
        goto done;
    }
    int64_t off = 0;
    for (int i = 0; i < n && st == MT_OK; i++) {
        seqs[i] = rt->seqs[items[i].seq].mtp_kv;
        old[i] = kvc_seq_len(seqs[i]);
        st = kvc_seq_reserve(kv, seqs[i], items[i].n_tokens, rows + off, err);
        if (st == MT_OK)
            reserved = i + 1;
        off += items[i].n_tokens;
    }
    if (st != MT_OK) {
        mt_err_prefix(err, "model_mtp_step: MTP KV cache");
        goto fail;
    }
    int32_t *tok = rt->h_i32, *pos = tok + M, *prow = pos + M, *qseq = prow + M,
            *ctx = qseq + M, *lrow = ctx + M;
    int64_t cmax = 1, nl = 0;
    off = 0;
    for (int i = 0; i < n; i++) {
        const model_mtp_item *it = &items[i];
        for (int t = 0; t < it->n_tokens; t++) {
            int64_t r = off + t;
            tok[r] = it->tokens[t];
            pos[r] = (int32_t)(old[i] + t);
            prow[r] = (int32_t)rows[r];
            qseq[r] = i;
            ctx[r] = (int32_t)(old[i] + t + 1);
            hrow[r] = it->hidden_row + t;
        }
        cmax = old[i] + it->n_tokens > cmax ? old[i] + it->n_tokens : cmax;
        lofs[i] = (int32_t)nl;
        if (it->logits)
            lrow[nl++] = (int32_t)(off + it->n_tokens - 1);
        off += it->n_tokens;
    }
    int64_t max_pages = (cmax + rt->ps - 1) / rt->ps;
    rt_bufs *b = &rt->b;
    if (rt->tp.on && !rt->vp.on)
        rt_tp_local_tokens(rt, tok, M);
    void *dst[] = {b->tok, b->pos, b->rows, b->qseq, b->ctx};
    for (int j = 0; j < 5 && st == MT_OK; j++)
        st = dev_copy_to(rt->dev, dst[j], rt->h_i32 + j * M, sizeof(int32_t) * (size_t)M, err);
    if (st == MT_OK)
        st = dev_copy_to(rt->dev, rt->mtp.hrows, hrow, sizeof(int32_t) * (size_t)M, err);
    if (st == MT_OK && nl)
        st = dev_copy_to(rt->dev, b->lrows, lrow, sizeof(int32_t) * (size_t)nl, err);
    if (st == MT_OK && (int64_t)n * max_pages > b->table_entries)
        st = mt_fail(err, MT_E_INVALID, "page table of %d x %" PRId64 " entries exceeds %" PRId64,
                     n, max_pages, b->table_entries);
    if (st == MT_OK)
        st = kvc_table_upload(kv, seqs, n, max_pages, b->table, err);
    if (st == MT_OK && rt->o.comm)
        st = rt_ep_mtp_begin(rt, err);
    if (st == MT_OK)
        st = mtp_forward(rt, M, cmax, nl, err);
    /* From here on the activation buffers hold this step's rows. */
    rt->mtp.last_rows = st == MT_OK ? M : 0;
    rt->mtp.last_was_mtp = true;
    if (st != MT_OK)
        goto fail;
    if (nl && !rt->dp.keep_logits) { /* a dp follower's rows go to rank 0 from b->logits */
        host = malloc(sizeof(float) * (size_t)(nl * rt->V));
        if (!host) {
            st = mt_fail(err, MT_E_NOMEM, "MTP logits");
            goto fail;
        }
        st = dev_copy_from(rt->dev, host, b->logits, sizeof(float) * (size_t)(nl * rt->V), err);
        if (st != MT_OK)
            goto fail;
        for (int i = 0; i < n; i++)
            if (items[i].logits)
                memcpy(items[i].logits, host + (size_t)lofs[i] * (size_t)rt->V,
                       sizeof(float) * (size_t)rt->V);
    }
    goto done;
fail:
    for (int i = 0; i < reserved; i++)
        if (kvc_seq_len(seqs[i]) > old[i])
            kvc_seq_truncate(kv, seqs[i], old[i], NULL);
done:
    free(host);
    free(old);
    free(rows);
    free(lofs);
    free(hrow);
    free(seqs);
    return st;
}
