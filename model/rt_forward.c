/* rt_forward.c: rt_step, one rank's batched forward pass (model_step, in
 * rt_driver.c, runs it on each rank). Every computation is a launch of a kernel of the
 * runtime's kernel set (model_kern_run); the host validates the
 * items, reserves KV pages, uploads token ids, positions, pool rows and the
 * page table, and copies the requested logits back.
 *
 * The tokens of all items form one batch of M rows. Per layer:
 *   norm -> A projection (q_a | kv_a | indexer wk | weights_proj, one GEMM)
 *   q latent: rmsnorm; kv latent: rmsnorm, rope key: RoPE; both stored to
 *   the paged latent cache (the new tokens are in the cache before any
 *   query reads it); indexer key: LayerNorm + RoPE, stored to its cache
 *   B projection (q_b | indexer wq_b) -> q: RoPE on the rope dims
 *   DSA indexer (full layers; shared layers reuse the last full layer's
 *   top-k, still in the idx buffer) -> per-query top index_topk tokens
 *   absorbed MLA: q_abs = [W_UK^T q_nope | q_rope] -> mla_decode (sparse over
 *   the top-k; every query has its own context length and page-table row)
 *   -> W_UV; except prompt rows (an item's first n_prompt tokens) whose
 *   context is at most index_topk, where the indexer keeps every key: those
 *   run mla_prefill (dense, kv_b-expanded keys and values, one launch per
 *   item's run of such rows) straight into the W_UV output rows. The path is
 *   the row's (prompt or generated, and its position), never the chunk's
 *   length: the two paths round differently, and a prompt must give the
 *   same logits however the engine cut it into steps. Batch-invariant
 *   runtimes keep every row on the absorbed path (decode must equal prefill
 *   bitwise).
 *   -> o_proj -> residual add
 *   norm -> dense SwiGLU MLP, or the MoE (router, expert sort, MXFP4 expert
 *   GEMMs, shared expert) -> residual add
 * then the final norm on the rows whose logits are wanted and lm_head. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "rt_impl.h"

#define RUN(k, m, shape, ...)                                                                    \
    do {                                                                                         \
        void *bufs_[] = {__VA_ARGS__};                                                           \
        mt_status s_ = model_kern_run((k), (m), (shape), bufs_, err);                                \
        if (s_ != MT_OK)                                                                         \
            return s_;                                                                           \
    } while (0)

/* Row r of a device buffer of rows w elements of es bytes. */
static void *row_at(void *base, int64_t r, int64_t w, size_t es)
{
    return (char *)base + (size_t)r * (size_t)w * es;
}

/* Absorbed MLA of rows r0 .. r0+n-1 of the batch: q absorb, mla_decode
 * (sparse over the indexer's top-k), W_UV into those rows of v. */
static mt_status absorbed(model_runtime *rt, rt_layer *ly, int64_t r0, int64_t n, int64_t cmax,
                          mt_err *err)
{
    rt_bufs *b = &rt->b;
    rt_layer_kernels *k = &ly->k;
    /* This rank's heads (all of them without tensor parallelism). */
    int64_t NH = rt->tp.me.heads, topk = rt->TOPK > 0 ? rt->TOPK : 1;
    void *q = row_at(b->q, r0, NH * (rt->D + rt->R), 2);
    void *qabs = row_at(b->qabs, r0, NH * (rt->L + rt->R), 2);
    void *o = row_at(b->o, r0, NH * rt->L, 4), *ob = row_at(b->ob, r0, NH * rt->L, 2);
    void *v = row_at(rt->tp.v_l, r0, NH * rt->VD, 2);
    RUN(k->absorb, n, NULL, q, ly->w_ukt, qabs);
    RUN(k->copy_qrope, n * NH, NULL, q, qabs);
    kern_shape s = k->decode->shape;
    model_kern_shape_set(k->decode, &s, "C", cmax);
    model_kern_shape_set(k->decode, &s, "sm", rt->sm_bits);
    RUN(k->decode, n, &s, qabs, kvc_latent_pool(ly->kv), kvc_latent_scale(ly->kv), b->table,
        row_at(b->qseq, r0, 1, 4), row_at(b->ctx, r0, 1, 4), row_at(b->idx, r0, topk, 4), o);
    RUN(k->copy_o, n, NULL, o, ob);
    RUN(k->vout, n, NULL, ob, ly->w_uv, v);
    return MT_OK;
}

/* Dense mla_prefill of one run of rows (rt_prefill_run) into its rows of v. */
static mt_status prefill(model_runtime *rt, rt_layer *ly, const rt_prefill *pf,
                         const rt_prefill_run *r, mt_err *err)
{
    rt_bufs *b = &rt->b;
    model_kern *kp = ly->k.prefill;
    kern_shape s = kp->shape;
    model_kern_shape_set(kp, &s, "P", r->p);
    model_kern_shape_set(kp, &s, "sm", rt->sm_bits);
    int64_t NH = rt->tp.me.heads;
    RUN(kp, r->n, &s, row_at(b->q, r->row0, NH * (rt->D + rt->R), 2),
        kvc_latent_pool(ly->kv), kvc_latent_scale(ly->kv),
        row_at(b->table, r->item, pf->table_stride, 4), ly->w_kvb,
        row_at(rt->tp.v_l, r->row0, NH * rt->VD, 2));
    return MT_OK;
}

/* pf: the rows that run mla_prefill (NULL or none: every row absorbed). */
static mt_status attention(model_runtime *rt, rt_layer *ly, int64_t M, int64_t cmax,
                           const rt_prefill *pf, mt_err *err)
{
    rt_bufs *b = &rt->b;
    rt_layer_kernels *k = &ly->k;
    void *cs = rt->rope_cs;
    RUN(k->norm_in, M, NULL, b->xb, ly->in_norm, b->xn);
    RUN(k->gemm_a, M, NULL, b->xn, ly->w_a, b->fa);
    RUN(k->copy_qa, M, NULL, b->fa, b->qa);
    RUN(k->norm_q, M, NULL, b->qa, ly->q_norm, b->qn);
    RUN(k->copy_lat, M, NULL, b->fa, b->lat);
    RUN(k->norm_kv, M, NULL, b->lat, ly->kv_norm, b->latn);
    RUN(k->copy_kr, M, NULL, b->fa, b->kr);
    RUN(k->rope_kr, M, NULL, b->kr, b->pos, cs, cs, cs);
    RUN(k->store_kv, M, NULL, b->latn, b->kr, b->rows, kvc_latent_pool(ly->kv),
        kvc_latent_scale(ly->kv));
    if (ly->full) {
        RUN(k->copy_ik, M, NULL, b->fa, b->ik);
        RUN(k->rope_ik, M, NULL, b->ik, b->pos, cs, ly->k_norm_w, ly->k_norm_b);
        RUN(k->store_ik, M, NULL, b->ik, b->ik, b->rows, kvc_index_pool(ly->kv),
            kvc_index_scale(ly->kv));
        RUN(k->copy_iw, M, NULL, b->fa, b->iw);
    }
    RUN(k->gemm_b, M, NULL, b->qn, ly->w_b, b->fb);
    RUN(k->copy_q, M, NULL, b->fb, b->q);
    RUN(k->rope_q, M, NULL, b->q, b->pos, cs, cs, cs);
    if (ly->full) {
        RUN(k->copy_iq, M, NULL, b->fb, b->iq);
        RUN(k->rope_iq, M, NULL, b->iq, b->pos, cs, cs, cs);
        kern_shape s = k->indexer->shape;
        model_kern_shape_set(k->indexer, &s, "C", cmax);
        RUN(k->indexer, M, &s, b->iq, b->iw, kvc_index_pool(ly->kv), kvc_index_scale(ly->kv),
            b->table, b->qseq, b->ctx, b->idx, b->val);
    }
    /* Runs are in row order; the rows between them are absorbed. */
    int64_t r = 0;
    mt_status st = MT_OK;
    for (int i = 0; pf && st == MT_OK && i < pf->n_runs; i++) {
        const rt_prefill_run *pr = &pf->runs[i];
        if (pr->row0 > r)
            st = absorbed(rt, ly, r, pr->row0 - r, cmax, err);
        if (st == MT_OK)
            st = prefill(rt, ly, pf, pr, err);
        r = pr->row0 + pr->n;
    }
    if (st == MT_OK && r < M)
        st = absorbed(rt, ly, r, M - r, cmax, err);
    if (st != MT_OK)
        return st;
    /* Tensor parallelism: every rank's heads into v, this rank's rows of
     * o_proj over all of them, every rank's rows into delta. */
    if (rt->tp.on)
        MT_CHECK(rt_tp_gather(rt, rt->NH, rt->VD, rt->tp.v_l, b->v, M, 2, err));
    RUN(k->gemm_o, M, NULL, b->v, ly->w_o, rt->tp.d_l);
    if (rt->tp.on)
        MT_CHECK(rt_tp_gather(rt, rt->H, 1, rt->tp.d_l, b->delta, M, 4, err));
    RUN(k->resid, M, NULL, b->resid, b->delta, b->xb);
    return MT_OK;
}

/* A bf16 SwiGLU MLP of intermediate I on xn into delta, then the residual.
 * Tensor parallelism: this rank's share of the intermediate, every rank's
 * gathered, this rank's rows of down over all of it, every rank's rows
 * gathered (rt_tp.c). */
static mt_status swiglu(model_runtime *rt, rt_layer *ly, model_kern *gu, model_kern *act,
                        model_kern *down, void *w_gu, void *w_down, int64_t I, int64_t M,
                        mt_err *err)
{
    rt_bufs *b = &rt->b;
    RUN(gu, M, NULL, b->xn, w_gu, b->gu);
    RUN(act, M, NULL, b->gu, rt->tp.h_l);
    if (rt->tp.on)
        MT_CHECK(rt_tp_gather(rt, I, 1, rt->tp.h_l, b->h, M, 2, err));
    RUN(down, M, NULL, b->h, w_down, rt->tp.d_l);
    if (rt->tp.on)
        MT_CHECK(rt_tp_gather(rt, rt->H, 1, rt->tp.d_l, b->delta, M, 4, err));
    RUN(ly->k.resid, M, NULL, b->resid, b->delta, b->xb);
    return MT_OK;
}

static mt_status mlp(model_runtime *rt, rt_layer *ly, int64_t M, mt_err *err)
{
    rt_bufs *b = &rt->b;
    rt_layer_kernels *k = &ly->k;
    RUN(k->norm_post, M, NULL, b->xb, ly->post_norm, b->xn);
    if (!ly->moe)
        return swiglu(rt, ly, k->gemm_gu, k->silu, k->gemm_down, ly->w_gu, ly->w_down, ly->inter,
                      M, err);
    /* The served MoE layer: routed experts plus the MXFP4 shared expert,
     * into delta. */
    moe_dims d = rt->moe;
    d.shared_inter = ly->sh_inter && ly->sh_mxfp4 ? ly->sh_inter : 0;
    moe_weights w = {.gate = ly->gate, .bias = ly->bias, .w13 = ly->w13, .s13 = ly->s13,
                     .w2 = ly->w2, .s2 = ly->s2, .sh_w13 = ly->sh_w13, .sh_s13 = ly->sh_s13,
                     .sh_w2 = ly->sh_w2, .sh_s2 = ly->sh_s2};
    mt_status st = rt->tp.on ? rt_tp_moe(rt, ly, M, err)
                   : rt->ep  ? rt_ep_moe(rt, ly, b->xn, M, b->delta, err)
                             : model_moe_run(&k->moe, rt->moe_ws, &d, &w, b->xn, M, b->delta, err);
    if (st != MT_OK)
        return st;
    RUN(k->resid, M, NULL, b->resid, b->delta, b->xb);
    if (ly->sh_inter && !ly->sh_mxfp4)
        return swiglu(rt, ly, k->sh_gemm_gu, k->sh_silu, k->sh_gemm_down, ly->sh_gu, ly->sh_down,
                      ly->sh_inter, M, err);
    return MT_OK;
}

mt_status rt_layer_forward(model_runtime *rt, rt_layer *ly, int64_t M, int64_t cmax, mt_err *err)
{
    mt_status st = attention(rt, ly, M, cmax, NULL, err);
    return st == MT_OK ? mlp(rt, ly, M, err) : st;
}

/* The whole batch: M rows, the longest context cmax, nl rows of logits. */
static mt_status forward(model_runtime *rt, int64_t M, int64_t cmax, int64_t nl, mt_err *err)
{
    rt_bufs *b = &rt->b;
    MT_CHECK(rt_vp_share(rt, M, nl, err));
    MT_CHECK(rt_vp_check(rt, M, nl, err));
    if (rt->vp.on) /* the rows come from the ranks holding their tokens */
        MT_CHECK(rt_vp_embed(rt, err));
    else
        RUN(rt->k_embed, M, NULL, rt->embed, b->tok, b->resid, b->xb);
    if (rt->tp.on && !rt->vp.on) /* each rank embedded its vocabulary's tokens, zeros for
                                  * the others */
        MT_CHECK(rt_tp_embed_sum(rt, M, err));
    for (int64_t l = 0; l < rt->n_layers; l++) {
        mt_status st = attention(rt, &rt->layers[l], M, cmax, &rt->pf, err);
        if (st == MT_OK)
            st = mlp(rt, &rt->layers[l], M, err);
        if (st != MT_OK)
            return mt_err_prefix(err, "layer %" PRId64, l);
    }
    if (nl) {
        RUN(rt->k_norm_final, M, NULL, b->xb, rt->final_norm, b->xn);
        kern_shape s = rt->k_gather->shape;
        model_kern_shape_set(rt->k_gather, &s, "V", M);
        RUN(rt->k_gather, nl, &s, b->xn, b->lrows, b->xgf, b->xg);
    }
    return rt_head(rt, nl, err);
}

mt_status rt_head(model_runtime *rt, int64_t nl, mt_err *err)
{
    rt_bufs *b = &rt->b;
    if (rt->vp.on) /* every rank's rows, each rank's vocabulary (rank 0 has them all) */
        MT_CHECK(rt_vp_head(rt, err));
    if (nl && !rt->vp.on) {
        RUN(rt->k_lm_head, nl, NULL, b->xg, rt->lm_head, rt->tp.lg_l);
        if (rt->tp.on) /* every rank's vocabulary */
            MT_CHECK(rt_tp_gather(rt, rt->V, 1, rt->tp.lg_l, b->logits, nl, 4, err));
    }
    return dev_synchronize(rt->dev, err);
}

#undef RUN

/* ---- the step ------------------------------------------------------------- */

mt_status rt_check_item(const model_runtime *rt, const model_step_item *items, int i,
                        int64_t len, mt_err *err)
{
    const model_step_item *it = &items[i];
    if (len < 0)
        return mt_fail(err, MT_E_INVALID, "item %d: no sequence %d", i, it->seq);
    for (int j = 0; j < i; j++)
        if (items[j].seq == it->seq)
            return mt_fail(err, MT_E_INVALID, "items %d and %d both extend sequence %d", j,
                           i, it->seq);
    if (it->n_tokens < 1 || !it->tokens)
        return mt_fail(err, MT_E_INVALID, "item %d (sequence %d): %d tokens", i, it->seq,
                       it->n_tokens);
    if (it->n_prompt < 0 || it->n_prompt > it->n_tokens)
        return mt_fail(err, MT_E_INVALID, "item %d (sequence %d): n_prompt %d outside "
                       "0..%d (its token count)", i, it->seq, it->n_prompt, it->n_tokens);
    for (int t = 0; t < it->n_tokens; t++)
        if (it->tokens[t] < 0 || it->tokens[t] >= rt->V)
            return mt_fail(err, MT_E_INVALID, "item %d (sequence %d): token %d is id %" PRId32
                           ", outside the vocabulary [0, %" PRId64 ")", i, it->seq, t,
                           it->tokens[t], rt->V);
    if (len + it->n_tokens > rt->max_ctx)
        return mt_fail(err, MT_E_INVALID, "item %d (sequence %d): %" PRId64 " + %d tokens "
                       "exceed the maximum context %" PRId64, i, it->seq, len, it->n_tokens,
                       rt->max_ctx);
    return MT_OK;
}

static mt_status check_items(model_runtime *rt, const model_step_item *items, int n,
                             int64_t *total, mt_err *err)
{
    *total = 0;
    for (int i = 0; i < n; i++) {
        int s = items[i].seq;
        bool here = s >= 0 && s < RT_MAX_SEQS && rt->seqs[s].used; /* this rank's own */
        MT_CHECK(rt_check_item(rt, items, i, here ? model_seq_len(rt, s) : -1, err));
        *total += items[i].n_tokens;
    }
    if (*total > rt->T)
        return mt_fail(err, MT_E_INVALID, "step of %" PRId64 " tokens exceeds max_batch_tokens %"
                       PRId64, *total, rt->T);
    return MT_OK;
}

/* Truncates the first n items' sequences back to their old lengths. */
static void rollback(model_runtime *rt, const model_step_item *items, const int64_t *old, int n)
{
    for (int i = 0; i < n; i++)
        for (int64_t l = 0; l < rt->n_layers; l++) {
            kvc_seq *s = rt->seqs[items[i].seq].kv[l];
            if (kvc_seq_len(s) > old[i])
                kvc_seq_truncate(rt->layers[l].kv, s, old[i], NULL);
        }
}

static mt_status reserve(model_runtime *rt, const model_step_item *it, int64_t *rows, mt_err *err)
{
    for (int64_t l = 0; l < rt->n_layers; l++) {
        mt_status st = kvc_seq_reserve(rt->layers[l].kv, rt->seqs[it->seq].kv[l], it->n_tokens,
                                       l == 0 ? rows : NULL, err);
        if (st != MT_OK)
            return st;
    }
    /* Lockstep allocation: every layer must hold the same pages. */
    kvc_seq *s0 = rt->seqs[it->seq].kv[0];
    int64_t np = kvc_seq_pages(s0, NULL, 0);
    int32_t *a = malloc(sizeof(int32_t) * (size_t)(2 * np + 2)), *b2 = a ? a + np + 1 : NULL;
    if (!a)
        return mt_fail(err, MT_E_NOMEM, "page check");
    kvc_seq_pages(s0, a, np);
    mt_status st = MT_OK;
    for (int64_t l = 1; l < rt->n_layers && st == MT_OK; l++) {
        kvc_seq *sl = rt->seqs[it->seq].kv[l];
        if (kvc_seq_pages(sl, b2, np) != np || memcmp(a, b2, sizeof(int32_t) * (size_t)np))
            st = mt_fail(err, MT_E_DEVICE, "KV pages of sequence %d differ between layer 0 and "
                         "layer %" PRId64, it->seq, l);
    }
    free(a);
    return st;
}

/* The step's mla_prefill runs (rt->pf): per item, its prompt rows (the
 * first n_prompt) at positions below index_topk (their context is at most
 * index_topk, so every key is kept and dense attention is exact), however
 * few: a one-token prompt chunk takes the path the same row takes in a long
 * chunk. Generated rows (decode, speculative verification) stay absorbed.
 * None on a batch-invariant runtime or with absorbed_prefill. max_pages:
 * page-table entries per item. */
static void plan_prefill(model_runtime *rt, const model_step_item *items, int n,
                         const int64_t *old, int64_t max_pages)
{
    rt_prefill *pf = &rt->pf;
    pf->n_runs = 0;
    pf->table_stride = max_pages;
    int64_t below = model_runtime_prefill_positions(rt);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        int64_t dense = below - old[i];
        if (dense > items[i].n_prompt)
            dense = items[i].n_prompt;
        if (dense > 0)
            pf->runs[pf->n_runs++] = (rt_prefill_run){.row0 = off, .n = dense, .p = old[i],
                                                      .item = i};
        off += items[i].n_tokens;
    }
}

int64_t model_runtime_prefill_positions(const model_runtime *rt)
{
    return rt->o.batch_invariant || rt->o.absorbed_prefill || rt->TOPK <= 0 ? 0 : rt->TOPK;
}

void model_runtime_attention_rows(const model_runtime *rt, int64_t *prefill_rows,
                                  int64_t *absorbed_rows)
{
    *prefill_rows = rt->pf.rows_prefill;
    *absorbed_rows = rt->pf.rows_absorbed;
}

mt_status rt_step(model_runtime *rt, model_step_item *items, int n, mt_err *err)
{
    if (n <= 0)
        return n == 0 ? MT_OK : mt_fail(err, MT_E_INVALID, "model_step: %d items", n);
    if (n > RT_MAX_SEQS)
        return mt_fail(err, MT_E_INVALID, "model_step: %d items, at most %d", n, RT_MAX_SEQS);
    int64_t M;
    mt_status st = check_items(rt, items, n, &M, err);
    if (st != MT_OK)
        return st;
    int64_t *old = malloc(sizeof(int64_t) * (size_t)n), *rows = malloc(sizeof(int64_t) * (size_t)M);
    int32_t *lofs = malloc(sizeof(int32_t) * (size_t)n);
    kvc_seq **seqs0 = malloc(sizeof(kvc_seq *) * (size_t)n);
    if (!old || !rows || !lofs || !seqs0) {
        st = mt_fail(err, MT_E_NOMEM, "model_step");
        goto done;
    }
    int reserved = 0;
    int64_t off = 0;
    for (int i = 0; i < n && st == MT_OK; i++) {
        old[i] = model_seq_len(rt, items[i].seq);
        st = reserve(rt, &items[i], rows + off, err);
        reserved = i + 1;
        off += items[i].n_tokens;
        seqs0[i] = rt->seqs[items[i].seq].kv[0];
    }
    if (st != MT_OK) {
        mt_err_prefix(err, "model_step: KV cache");
        goto fail;
    }

    /* Host arrays: token ids, positions, pool rows, query rows and context
     * lengths, then the rows whose logits are wanted. */
    int32_t *tok = rt->h_i32, *pos = tok + M, *prow = pos + M, *qseq = prow + M,
            *ctx = qseq + M, *lrow = ctx + M;
    int64_t cmax = 1, nl = 0;
    off = 0;
    for (int i = 0; i < n; i++) {
        const model_step_item *it = &items[i];
        for (int t = 0; t < it->n_tokens; t++) {
            int64_t r = off + t;
            tok[r] = it->tokens[t];
            pos[r] = (int32_t)(old[i] + t);
            prow[r] = (int32_t)rows[r];
            qseq[r] = i;
            ctx[r] = (int32_t)(old[i] + t + 1);
        }
        cmax = old[i] + it->n_tokens > cmax ? old[i] + it->n_tokens : cmax;
        lofs[i] = (int32_t)nl;
        if (it->all_logits)
            for (int t = 0; t < it->n_tokens; t++)
                lrow[nl++] = (int32_t)(off + t);
        else if (it->logits)
            lrow[nl++] = (int32_t)(off + it->n_tokens - 1);
        off += it->n_tokens;
    }
    int64_t max_pages = (cmax + rt->ps - 1) / rt->ps;
    plan_prefill(rt, items, n, old, max_pages);
    rt_bufs *b = &rt->b;
    if (rt->tp.on && !rt->vp.on)
        rt_tp_local_tokens(rt, tok, M);
    void *dst[] = {b->tok, b->pos, b->rows, b->qseq, b->ctx};
    for (int j = 0; j < 5 && st == MT_OK; j++)
        st = dev_copy_to(rt->dev, dst[j], rt->h_i32 + j * M, sizeof(int32_t) * (size_t)M, err);
    if (st == MT_OK && nl)
        st = dev_copy_to(rt->dev, b->lrows, lrow, sizeof(int32_t) * (size_t)nl, err);
    if (st == MT_OK && (int64_t)n * max_pages > b->table_entries)
        st = mt_fail(err, MT_E_INVALID, "page table of %d x %" PRId64 " entries exceeds %" PRId64,
                     n, max_pages, b->table_entries);
    if (st == MT_OK)
        st = kvc_table_upload(rt->layers[0].kv, seqs0, n, max_pages, b->table, err);
    if (st == MT_OK && rt->o.comm)
        st = rt_ep_step_begin(rt, M, err);
    if (st == MT_OK)
        st = forward(rt, M, cmax, nl, err);
    /* Its rows' hidden states are what model_mtp_step reads next (rt_mtp.c). */
    rt->mtp.last_rows = st == MT_OK ? M : 0;
    rt->mtp.last_was_mtp = false;
    if (st != MT_OK)
        goto fail;
    for (int i = 0; i < rt->pf.n_runs; i++)
        rt->pf.rows_prefill += rt->pf.runs[i].n;
    rt->pf.rows_absorbed += M;
    for (int i = 0; i < rt->pf.n_runs; i++)
        rt->pf.rows_absorbed -= rt->pf.runs[i].n;

    if (nl && !rt->dp.keep_logits) { /* a dp follower's rows go to rank 0 from b->logits */
        float *host = malloc(sizeof(float) * (size_t)(nl * rt->V));
        if (!host) {
            st = mt_fail(err, MT_E_NOMEM, "logits");
            goto fail;
        }
        st = dev_copy_from(rt->dev, host, b->logits, sizeof(float) * (size_t)(nl * rt->V), err);
        for (int i = 0; st == MT_OK && i < n; i++) {
            const model_step_item *it = &items[i];
            const float *src = host + (size_t)lofs[i] * (size_t)rt->V;
            size_t vb = sizeof(float) * (size_t)rt->V;
            if (it->all_logits) {
                memcpy(it->all_logits, src, vb * (size_t)it->n_tokens);
                if (it->logits)
                    memcpy(it->logits, src + (size_t)(it->n_tokens - 1) * (size_t)rt->V, vb);
            } else if (it->logits) {
                memcpy(it->logits, src, vb);
            }
        }
        free(host);
        if (st != MT_OK)
            goto fail;
    }
    goto done;
fail:
    rollback(rt, items, old, reserved);
done:
    free(old);
    free(rows);
    free(lofs);
    free(seqs0);
    return st;
}
