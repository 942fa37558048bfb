/* rt_vp.c: a vocabulary-parallel embedding and lm_head across every rank
 * of the job (the plan's vocab_ranks): under data-parallel attention
 * (rt_dp.c), whose units (the places sequences live) are ranks or
 * tensor-parallel groups, and under expert parallelism alone (no dp, no
 * tp: each rank is a unit of its own). Each rank holds its contiguous
 * share of the vocabulary's rows (model_ep_range over the job), but each
 * unit runs its own tokens, so the rows a unit needs live on every rank.
 * Every rank knows the whole step (rt_vp_begin/add/seal) and computes the
 * same counts: under dp from rank 0's step message, which carries every
 * item's tokens and logits rows; without it (self) each forward first
 * shares its row counts (an all-gather) and token ids (an all-to-all-v of
 * its ids to every rank) with the others (rt_vp_share).
 *
 *   embedding  over windows of at most T of the step's tokens (unit by
 *              unit): each rank embeds the window's tokens it holds, in
 *              order, and sends each rank its unit's rows (all-to-all-v of
 *              bf16 rows; every rank of a group gets its group's); each
 *              rank gathers what it received into its rows' places
 *              (ops_embed over the received rows: f32 and bf16, as the
 *              embedding writes them). A row is copied, never summed.
 *   lm_head    over chunks of at most T of the step's logits rows (unit 0's
 *              first, alone): every unit's normed rows are all-gathered
 *              (from its first rank: a group's ranks hold the same rows),
 *              each rank computes its vocabulary's columns of all of them,
 *              and rank 0 receives the ranks' column blocks and lays them
 *              side by side (tp_cols): unit 0's rows into b.logits, the
 *              other units' into vp.remote, which rt_dp.c hands out.
 *              Without dp each rank receives its own rows' blocks (chunks
 *              never span two ranks' rows) into its b.logits.
 * A rank without rows this step (or one that refused its items) still
 * takes part: it holds vocabulary the others read.
 *
 * Host copies: the window's id lists go in (counted apart, index_calls);
 * without dp the shared counts go in and every rank's counts and ids come
 * out (share_to/share_from); no logits come out but the ones a unit's
 * items asked for, as on one device. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "rt_impl.h"

mt_status rt_vp_open(model_runtime *rt, mt_err *err)
{
    rt_vp *vp = &rt->vp;
    int W = rt->plan->p.vocab_ranks;
    if (W <= 1)
        return MT_OK;
    bool self = !rt->dp.on && !rt->tp.on;
    if (!rt->o.comm || mt_comm_size(rt->o.comm) != W ||
        (!self && (!rt->dp.on || rt->dp.size * rt->dp.group != W)))
        return mt_fail(err, MT_E_INVALID, "vocabulary parallelism over %d ranks needs "
                       "data-parallel attention or expert parallelism alone over as many "
                       "ranks", W);
    vp->on = true;
    vp->self = self;
    vp->world = W;
    vp->rank = mt_comm_rank(rt->o.comm);
    vp->units = self ? W : rt->dp.size;
    vp->group = self ? 1 : rt->dp.group;
    vp->unit = vp->rank / vp->group;
    size_t w = (size_t)W, u = (size_t)vp->units, T = (size_t)rt->T, H = (size_t)rt->H;
    vp->v0 = calloc(w, sizeof *vp->v0);
    vp->nv = calloc(w, sizeof *vp->nv);
    vp->m = calloc(u, sizeof *vp->m);
    vp->nl = calloc(u, sizeof *vp->nl);
    vp->cnt = calloc(4 * w, sizeof *vp->cnt);
    vp->own = malloc(sizeof(int32_t) * T);
    vp->perm = malloc(sizeof(int32_t) * T);
    if (!vp->v0 || !vp->nv || !vp->m || !vp->nl || !vp->cnt || !vp->own || !vp->perm)
        return mt_fail(err, MT_E_NOMEM, "vocabulary parallelism");
    for (int q = 0; q < W; q++)
        model_ep_range(rt->V, W, q, &vp->v0[q], &vp->nv[q]);
    int64_t nv = vp->nv[vp->rank];
    MT_CHECK(dev_alloc(rt->dev, sizeof(int32_t) * T, &vp->d_own, err));
    MT_CHECK(dev_alloc(rt->dev, sizeof(int32_t) * T, &vp->d_perm, err));
    MT_CHECK(dev_alloc(rt->dev, 2 * T * H, &vp->send, err));
    MT_CHECK(dev_alloc(rt->dev, 2 * T * H, &vp->recv, err));
    MT_CHECK(dev_alloc(rt->dev, 4 * T * H, &vp->scratch, err));
    MT_CHECK(dev_alloc(rt->dev, 2 * T * H, &vp->hid, err));
    MT_CHECK(dev_alloc(rt->dev, 4 * T * (size_t)nv, &vp->lg, err));
    if (vp->rank == 0 || self)
        MT_CHECK(dev_alloc(rt->dev, 4 * T * (size_t)rt->V, &vp->cols_in, err));
    if (self) {
        vp->cnt_h = malloc(sizeof(int32_t) * 2 * w);
        vp->ids_h = malloc(sizeof(int32_t) * w * T);
        if (!vp->cnt_h || !vp->ids_h)
            return mt_fail(err, MT_E_NOMEM, "vocabulary parallelism");
        MT_CHECK(dev_alloc(rt->dev, sizeof(int32_t) * (2 * w + 2), &vp->d_cnt, err));
        MT_CHECK(dev_alloc(rt->dev, sizeof(int32_t) * w * T, &vp->d_ids, err));
    }
    /* The plan's gather of the ranks' logits columns (entry i is kernel i). */
    const model_plan *pl = rt->plan;
    for (int i = 0; i < pl->n_entries && !vp->cols; i++) {
        const model_plan_entry *e = &pl->entries[i];
        if (!strcmp(e->fam->name, "tp_cols") &&
            kern_shape_get(e->fam, &e->shape, "ranks") == W &&
            kern_shape_get(e->fam, &e->shape, "U") == rt->V &&
            kern_shape_get(e->fam, &e->shape, "per") == 1 &&
            kern_shape_get(e->fam, &e->shape, "t") == KERN_DT_F32)
            vp->cols = model_kset_kernel(rt->ks, i);
    }
    if (!vp->cols)
        return mt_fail(err, MT_E_INVALID, "vocabulary parallelism: the plan has no gather of "
                       "%d ranks' logits columns", W);
    fprintf(rt->log, "vocabulary parallelism: rank %d of %d holds embedding and lm_head rows "
            "%" PRId64 "-%" PRId64 " of %" PRId64 "\n", vp->rank, W, vp->v0[vp->rank],
            vp->v0[vp->rank] + nv - 1, rt->V);
    return MT_OK;
}

void rt_vp_close(model_runtime *rt)
{
    rt_vp *vp = &rt->vp;
    if (rt->dev) {
        void *bufs[] = {vp->d_own, vp->d_perm, vp->send, vp->recv, vp->scratch, vp->hid,
                        vp->lg, vp->cols_in, vp->remote, vp->d_cnt, vp->d_ids};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            dev_free(rt->dev, bufs[i]);
    }
    free(vp->v0);
    free(vp->nv);
    free(vp->m);
    free(vp->nl);
    free(vp->cnt);
    free(vp->own);
    free(vp->perm);
    free(vp->tok);
    free(vp->items);
    free(vp->cnt_h);
    free(vp->ids_h);
    memset(vp, 0, sizeof *vp);
}

/* ---- the step as announced -------------------------------------------------- */

void rt_vp_begin(model_runtime *rt) { rt->vp.n_items = 0; }

mt_status rt_vp_add(model_runtime *rt, int unit, const int32_t *tokens, int n_tokens, int rows,
                    mt_err *err)
{
    rt_vp *vp = &rt->vp;
    if (unit < 0 || unit >= vp->units || n_tokens < 0 || rows < 0 || rows > n_tokens)
        return mt_fail(err, MT_E_FORMAT, "vocabulary parallelism: an item of unit %d, %d "
                       "tokens, %d logits rows", unit, n_tokens, rows);
    if (vp->n_items == vp->cap_items) {
        int cap = vp->cap_items ? 2 * vp->cap_items : 64;
        rt_vp_item *it = realloc(vp->items, sizeof *it * (size_t)cap);
        if (!it)
            return mt_fail(err, MT_E_NOMEM, "vocabulary parallelism: %d items", cap);
        vp->items = it;
        vp->cap_items = cap;
    }
    vp->items[vp->n_items++] = (rt_vp_item){tokens, n_tokens, unit, rows};
    return MT_OK;
}

mt_status rt_vp_seal(model_runtime *rt, mt_err *err)
{
    rt_vp *vp = &rt->vp;
    memset(vp->m, 0, sizeof *vp->m * (size_t)vp->units);
    memset(vp->nl, 0, sizeof *vp->nl * (size_t)vp->units);
    int64_t total = 0;
    for (int i = 0; i < vp->n_items; i++) {
        vp->m[vp->items[i].rank] += vp->items[i].n;
        vp->nl[vp->items[i].rank] += vp->items[i].rows;
        total += vp->items[i].n;
    }
    if (total > vp->cap_tok) {
        int32_t *t = realloc(vp->tok, sizeof(int32_t) * (size_t)total);
        if (!t)
            return mt_fail(err, MT_E_NOMEM, "vocabulary parallelism: %" PRId64 " tokens", total);
        vp->tok = t;
        vp->cap_tok = total;
    }
    vp->n_tok = 0;
    for (int r = 0; r < vp->units; r++) /* unit by unit, each in item order */
        for (int i = 0; i < vp->n_items; i++) {
            const rt_vp_item *it = &vp->items[i];
            if (it->rank != r)
                continue;
            for (int t = 0; t < it->n; t++)
                if (it->tok[t] < 0 || it->tok[t] >= rt->V)
                    return mt_fail(err, MT_E_FORMAT, "vocabulary parallelism: token %d of unit "
                                   "%d outside the vocabulary of %" PRId64, it->tok[t], r, rt->V);
            memcpy(vp->tok + vp->n_tok, it->tok, sizeof(int32_t) * (size_t)it->n);
            vp->n_tok += it->n;
        }
    return MT_OK;
}

mt_status rt_vp_share(model_runtime *rt, int64_t M, int64_t nl, mt_err *err)
{
    rt_vp *vp = &rt->vp;
    if (!vp->self)
        return MT_OK;
    int W = vp->world;
    size_t w = (size_t)W, T = (size_t)rt->T;
    rt->ep_joined = true; /* the step's first exchange */
    int32_t mine[2] = {(int32_t)M, (int32_t)nl};
    int32_t *d_mine = (int32_t *)vp->d_cnt + 2 * w;
    vp->share_to_calls++;
    vp->share_to_bytes += sizeof mine;
    MT_CHECK(dev_copy_to(rt->dev, d_mine, mine, sizeof mine, err));
    MT_CHECK(mt_comm_all_gather(rt->o.comm, d_mine, vp->d_cnt, 2, MT_COMM_I32, err));
    vp->share_from_calls++;
    vp->share_from_bytes += sizeof(int32_t) * 2 * w;
    MT_CHECK(dev_copy_from(rt->dev, vp->cnt_h, vp->d_cnt, sizeof(int32_t) * 2 * w, err));
    for (int q = 0; q < W; q++)
        if (vp->cnt_h[2 * q] < 0 || (size_t)vp->cnt_h[2 * q] > T || vp->cnt_h[2 * q + 1] < 0 ||
            vp->cnt_h[2 * q + 1] > vp->cnt_h[2 * q])
            return mt_fail(err, MT_E_FORMAT, "vocabulary parallelism: rank %d shared a step of "
                           "%d rows (%d logits rows)", q, vp->cnt_h[2 * q],
                           vp->cnt_h[2 * q + 1]);
    /* This rank's ids (b.tok, as the forward uploaded them) to every rank:
     * the same block to each; rank q's into its row of d_ids. */
    size_t *sc = vp->cnt, *sd = sc + W, *rc = sd + W, *rd = rc + W;
    size_t total = 0;
    for (int q = 0; q < W; q++) {
        sc[q] = (size_t)M;
        sd[q] = 0;
        rc[q] = (size_t)vp->cnt_h[2 * q];
        rd[q] = total;
        total += rc[q];
    }
    MT_CHECK(mt_comm_all_to_all_v(rt->o.comm, rt->b.tok, sc, sd, vp->d_ids, rc, rd,
                                  MT_COMM_I32, err));
    if (total) {
        vp->share_from_calls++;
        vp->share_from_bytes += sizeof(int32_t) * total;
        MT_CHECK(dev_copy_from(rt->dev, vp->ids_h, vp->d_ids, sizeof(int32_t) * total, err));
    }
    rt_vp_begin(rt);
    for (int q = 0; q < W; q++)
        MT_CHECK(rt_vp_add(rt, q, vp->ids_h + rd[q], vp->cnt_h[2 * q], vp->cnt_h[2 * q + 1],
                           err));
    return rt_vp_seal(rt, err);
}

mt_status rt_vp_check(const model_runtime *rt, int64_t M, int64_t nl, mt_err *err)
{
    const rt_vp *vp = &rt->vp;
    if (vp->on && (M != vp->m[vp->unit] || nl != vp->nl[vp->unit]))
        return mt_fail(err, MT_E_INVALID, "vocabulary parallelism: a forward of %" PRId64
                       " rows (%" PRId64 " logits rows) where rank 0 announced %" PRId64 " (%"
                       PRId64 ") for this rank's %s %d", M, nl, vp->m[vp->unit],
                       vp->nl[vp->unit], vp->group > 1 ? "group" : "rank", vp->unit);
    return MT_OK;
}

int64_t rt_vp_rows(const model_runtime *rt)
{
    int64_t n = 0;
    for (int u = 0; rt->vp.on && u < rt->vp.units; u++)
        n += rt->vp.nl[u];
    return n;
}

/* ---- the embedding ------------------------------------------------------------ */

/* The rank holding vocabulary entry id (model_ep_range's split). */
static int owner(const rt_vp *vp, int32_t id)
{
    int64_t V = vp->v0[vp->world - 1] + vp->nv[vp->world - 1];
    int64_t base = V / vp->world, rem = V % vp->world, big = rem * (base + 1);
    return (int)(id < big ? id / (base + 1) : rem + (id - big) / base);
}

/* An id list to the device, counted as the exchanges' own. */
static mt_status upload_ids(model_runtime *rt, void *dst, const int32_t *src, int64_t n,
                            mt_err *err)
{
    if (n <= 0)
        return MT_OK;
    rt->vp.index_calls++;
    rt->vp.index_bytes += sizeof(int32_t) * (size_t)n;
    return dev_copy_to(rt->dev, dst, src, sizeof(int32_t) * (size_t)n, err);
}

/* One window [w0, w1) of the step's tokens; base[u]: unit u's first. */
static mt_status embed_window(model_runtime *rt, const int64_t *base, int64_t w0, int64_t w1,
                              mt_err *err)
{
    rt_vp *vp = &rt->vp;
    int W = vp->world, me = vp->rank;
    size_t row = 2 * (size_t)rt->H;
    size_t *sc = vp->cnt, *sd = sc + W, *rc = sd + W, *rd = rc + W;
    memset(vp->cnt, 0, 4 * (size_t)W * sizeof *vp->cnt);
    /* What this rank holds, unit by unit in order; every rank of a unit is
     * sent the unit's rows (the same bytes: send blocks may overlap). */
    int64_t n_own = 0;
    for (int u = 0; u < vp->units; u++) {
        int64_t a = base[u] > w0 ? base[u] : w0, b = base[u + 1] < w1 ? base[u + 1] : w1;
        size_t at = (size_t)n_own * row;
        for (int64_t p = a; p < b; p++)
            if (owner(vp, vp->tok[p]) == me)
                vp->own[n_own++] = (int32_t)(vp->tok[p] - vp->v0[me]);
        for (int d = u * vp->group; d < (u + 1) * vp->group; d++) {
            sd[d] = at;
            sc[d] = (size_t)n_own * row - at;
        }
    }
    /* What this rank receives: its unit's rows of the window, from their
     * owners. */
    int64_t a = base[vp->unit] > w0 ? base[vp->unit] : w0;
    int64_t b = base[vp->unit + 1] < w1 ? base[vp->unit + 1] : w1;
    int64_t n_in = b > a ? b - a : 0, at = 0;
    for (int q = 0; q < W; q++) {
        rd[q] = (size_t)at * row;
        for (int64_t p = a; p < b; p++)
            if (owner(vp, vp->tok[p]) == q)
                vp->perm[p - a] = (int32_t)at++;
        rc[q] = (size_t)at * row - rd[q];
    }
    MT_CHECK(upload_ids(rt, vp->d_own, vp->own, n_own, err));
    MT_CHECK(upload_ids(rt, vp->d_perm, vp->perm, n_in, err));
    if (n_own) {
        void *bufs[] = {rt->embed, vp->d_own, vp->scratch, vp->send};
        MT_CHECK(model_kern_run(rt->k_embed, n_own, NULL, bufs, err));
    }
    MT_CHECK(mt_comm_all_to_all_v(rt->o.comm, vp->send, sc, sd, vp->recv, rc, rd, MT_COMM_U8,
                                  err));
    if (!n_in)
        return MT_OK;
    int64_t lo = a - base[vp->unit]; /* the window's first row of this rank */
    kern_shape s = rt->k_gather->shape;
    model_kern_shape_set(rt->k_gather, &s, "V", n_in);
    void *bufs[] = {vp->recv, vp->d_perm, (char *)rt->b.resid + (size_t)lo * 2 * row,
                    (char *)rt->b.xb + (size_t)lo * row};
    return model_kern_run(rt->k_gather, n_in, &s, bufs, err);
}

/* First rows of each unit in a unit-by-unit list of n[u] rows each;
 * base[units] is the total. */
static int64_t *bases(const rt_vp *vp, const int64_t *n, mt_err *err)
{
    int64_t *base = malloc(sizeof *base * ((size_t)vp->units + 1));
    if (!base) {
        mt_fail(err, MT_E_NOMEM, "vocabulary parallelism");
        return NULL;
    }
    base[0] = 0;
    for (int u = 0; u < vp->units; u++)
        base[u + 1] = base[u] + n[u];
    return base;
}

mt_status rt_vp_embed(model_runtime *rt, mt_err *err)
{
    rt_vp *vp = &rt->vp;
    int64_t *base = bases(vp, vp->m, err);
    if (!base)
        return MT_E_NOMEM;
    mt_status st = MT_OK;
    for (int64_t w0 = 0; w0 < vp->n_tok && st == MT_OK; w0 += rt->T)
        st = embed_window(rt, base, w0, w0 + rt->T < vp->n_tok ? w0 + rt->T : vp->n_tok, err);
    free(base);
    return st == MT_OK ? MT_OK : mt_err_prefix(err, "vocabulary-parallel embedding");
}

/* ---- the head ------------------------------------------------------------------- */

/* One chunk [c0, c1) of the step's logits rows; base[u]: unit u's first.
 * Its logits go to rank dst: rank 0 under dp, else the rank whose rows
 * they are (the chunk is one rank's). */
static mt_status head_chunk(model_runtime *rt, const int64_t *base, int64_t c0, int64_t c1,
                            int dst, mt_err *err)
{
    rt_vp *vp = &rt->vp;
    int W = vp->world, me = vp->rank;
    int64_t C = c1 - c0;
    size_t row = 2 * (size_t)rt->H;
    size_t *sc = vp->cnt, *sd = sc + W, *rc = sd + W, *rd = rc + W;
    memset(vp->cnt, 0, 4 * (size_t)W * sizeof *vp->cnt);
    /* Every unit's rows of the chunk to every rank, in unit order, from
     * the unit's first rank. */
    for (int u = 0; u < vp->units; u++) {
        int q = u * vp->group;
        int64_t a = base[u] > c0 ? base[u] : c0, b = base[u + 1] < c1 ? base[u + 1] : c1;
        rc[q] = b > a ? (size_t)(b - a) * row : 0;
        rd[q] = b > a ? (size_t)(a - c0) * row : 0;
    }
    int64_t a = base[vp->unit] > c0 ? base[vp->unit] : c0;
    for (int q = 0; me % vp->group == 0 && q < W; q++) {
        sc[q] = rc[me];
        sd[q] = rc[me] ? (size_t)(a - base[vp->unit]) * row : 0;
    }
    MT_CHECK(mt_comm_all_to_all_v(rt->o.comm, rt->b.xg, sc, sd, vp->hid, rc, rd, MT_COMM_U8,
                                  err));
    void *hb[] = {vp->hid, rt->lm_head, vp->lg};
    MT_CHECK(model_kern_run(rt->k_lm_head, C, NULL, hb, err));
    /* This rank's columns of every row to dst, after rank q-1's. */
    memset(vp->cnt, 0, 4 * (size_t)W * sizeof *vp->cnt);
    sc[dst] = (size_t)C * (size_t)vp->nv[me] * 4;
    size_t off = 0;
    for (int q = 0; me == dst && q < W; q++) {
        rc[q] = (size_t)C * (size_t)vp->nv[q] * 4;
        rd[q] = off;
        off += rc[q];
    }
    MT_CHECK(mt_comm_all_to_all_v(rt->o.comm, vp->lg, sc, sd, vp->cols_in, rc, rd, MT_COMM_U8,
                                  err));
    if (me != dst)
        return MT_OK;
    size_t vb = 4 * (size_t)rt->V;
    char *out = vp->self          ? (char *)rt->b.logits + (size_t)(c0 - base[me]) * vb
                : c0 < vp->nl[0] ? (char *)rt->b.logits + (size_t)c0 * vb
                                  : (char *)vp->remote + (size_t)(c0 - vp->nl[0]) * vb;
    void *cb[] = {vp->cols_in, out};
    return model_kern_run(vp->cols, C, NULL, cb, err);
}

mt_status rt_vp_head(model_runtime *rt, mt_err *err)
{
    rt_vp *vp = &rt->vp;
    int64_t NL = rt_vp_rows(rt);
    if (!NL)
        return MT_OK;
    size_t need = (size_t)(NL - vp->nl[0]) * 4 * (size_t)rt->V;
    if (vp->rank == 0 && !vp->self && need > vp->remote_cap) {
        dev_free(rt->dev, vp->remote);
        vp->remote = NULL;
        vp->remote_cap = 0;
        MT_CHECK(dev_alloc(rt->dev, need, &vp->remote, err));
        vp->remote_cap = need;
    }
    int64_t *base = bases(vp, vp->nl, err);
    if (!base)
        return MT_E_NOMEM;
    mt_status st = MT_OK;
    int u = 0;
    for (int64_t c0 = 0; c0 < NL && st == MT_OK;) {
        /* Under dp unit 0's rows go to b.logits, the others' to vp.remote:
         * apart. Without it each rank's go to that rank: one at a time. */
        while (base[u + 1] <= c0)
            u++;
        int64_t end = vp->self ? base[u + 1] : c0 < vp->nl[0] ? vp->nl[0] : NL;
        int64_t c1 = c0 + rt->T < end ? c0 + rt->T : end;
        st = head_chunk(rt, base, c0, c1, vp->self ? u : 0, err);
        c0 = c1;
    }
    free(base);
    return st == MT_OK ? MT_OK : mt_err_prefix(err, "vocabulary-parallel lm_head");
}
