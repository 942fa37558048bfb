/* test_forward_prefill.c: the runtime's two attention paths (rt_forward.c).
 * Rows of prefill chunks whose context is at most index_topk (the DSA
 * indexer keeps every key) run mla_prefill, dense on kv_b-expanded keys and
 * values; every other row runs the absorbed, sparse mla_decode. Checked on
 * the tiny checkpoint (index_topk 16) on cpu: the runtime's row counts per
 * path for chunks inside, across and past index_topk and on a
 * batch-invariant runtime (never the prefill path); chunked prefill, and
 * chunks batched with a decode row between them, equal one prefill on the
 * new path (relative L2 1e-5, as test_forward.c holds one kernel path).
 * Decode equals prefill across the two paths: test_forward.c (cpu) and
 * test_forward_emu.c. */
#include "test_forward_util.h"

static const double TIGHT = 1e-5;

static void assert_rows(const float *got, const float *want, int rows, int32_t V, const char *what,
                        uint64_t seed)
{
    for (int t = 0; t < rows; t++) {
        double e = fw_rel_l2(got + (size_t)t * V, want + (size_t)t * V, V);
        cr_assert_leq(e, TIGHT, "%s, seed %" PRIu64 ", row %d: relative L2 error %.3g", what, seed,
                      t, e);
    }
}

static void assert_counts(model_runtime *rt, int64_t pre, int64_t abs, const char *after)
{
    int64_t p = -1, a = -1;
    model_runtime_attention_rows(rt, &p, &a);
    cr_assert(p == pre && a == abs, "after %s: %" PRId64 " rows on mla_prefill and %" PRId64
              " absorbed, want %" PRId64 " and %" PRId64, after, p, a, pre, abs);
}

/* Steps n tokens of tok onto seq (no logits). */
static void step(model_runtime *rt, int seq, const int32_t *tok, int n)
{
    mt_err err = MT_ERR_INIT;
    model_step_item it = {.seq = seq, .tokens = tok, .n_tokens = n};
    cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
}

Test(forward_prefill, rows_take_mla_prefill_exactly_where_every_key_is_kept)
{
    char *dir = fw_tiny_dir();
    model_runtime *rt = fw_open(dir, (fw_open_args){.act = MODEL_ACT_NONE});
    int32_t V = model_runtime_vocab(rt);
    int topk = (int)model_runtime_config(rt)->index_topk;
    cr_assert_geq(topk, 4, "the tiny checkpoint's index_topk %d", topk);
    uint64_t seed = mt_seed_fresh();
    int32_t *tok = fw_tokens(seed, 2 * topk + 8, V);
    assert_counts(rt, 0, 0, "open");
    int seq;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_seq_create(rt, &seq, &err), MT_OK, "%s", err.msg);
    /* A chunk inside index_topk, a decode token, then a chunk of 4 across
     * it (its first row sees topk tokens, the other three more). */
    step(rt, seq, tok, topk - 2);
    assert_counts(rt, topk - 2, 0, "a chunk inside index_topk");
    step(rt, seq, tok + topk - 2, 1);
    assert_counts(rt, topk - 2, 1, "a decode token");
    step(rt, seq, tok + topk - 1, 4);
    assert_counts(rt, topk - 1, 4, "a chunk across index_topk");
    /* A chunk past it: absorbed only. */
    step(rt, seq, tok + topk + 3, 5);
    assert_counts(rt, topk - 1, 9, "a chunk past index_topk");
    model_seq_free(rt, seq);
    /* A fresh prompt longer than index_topk: its first topk rows. */
    free(fw_prefill(rt, tok, topk + 3, NULL));
    assert_counts(rt, 2 * topk - 1, 12, "a prompt of index_topk + 3");
    model_runtime_close(rt);

    /* Batch-invariant: decode must equal prefill bitwise, so one path. */
    rt = fw_open(dir, (fw_open_args){.act = MODEL_ACT_NONE, .batch_invariant = true});
    free(fw_prefill(rt, tok, topk - 2, NULL));
    assert_counts(rt, 0, topk - 2, "a chunk on a batch-invariant runtime");
    model_runtime_close(rt);
    free(tok);
    fw_rm_dir(dir);
}

Test(forward_prefill, chunks_and_batches_on_mla_prefill_equal_one_prefill)
{
    char *dir = fw_tiny_dir();
    model_runtime *rt = fw_open(dir, (fw_open_args){.act = MODEL_ACT_MXFP4});
    int32_t V = model_runtime_vocab(rt);
    int topk = (int)model_runtime_config(rt)->index_topk;
    uint64_t seed = mt_seed_fresh();
    mt_err err = MT_ERR_INIT;

    /* One prompt of topk tokens, then the same in chunks of 3, 5 and the
     * rest (a page is 16 tokens: the chunks start inside pages). */
    int32_t *tok = fw_tokens(seed, topk, V);
    float *one = fw_prefill(rt, tok, topk, NULL);
    float *chunked = malloc(sizeof(float) * (size_t)V * (size_t)topk);
    int seq;
    cr_assert_eq(model_seq_create(rt, &seq, &err), MT_OK, "%s", err.msg);
    const int cuts[4] = {0, 3, 8, topk};
    for (int c = 0; c < 3; c++) {
        model_step_item it = {.seq = seq, .tokens = tok + cuts[c],
                              .n_tokens = cuts[c + 1] - cuts[c],
                              .all_logits = chunked + (size_t)cuts[c] * V};
        cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
    }
    assert_rows(chunked, one, topk, V, "chunks vs one prefill", seed);
    model_seq_free(rt, seq);

    /* Three items in one step: a fresh chunk, a decode token and a chunk
     * after a cached prefix; the two chunks are runs at rows 0 and 6 with
     * their own page-table rows, the decode row absorbed between them. */
    int32_t *ta = fw_tokens(seed + 1, 5, V), *tb = fw_tokens(seed + 2, 9, V);
    int32_t *tc = fw_tokens(seed + 3, 8, V);
    float *alone_b = fw_prefill(rt, tb, 9, NULL), *alone_c = fw_prefill(rt, tc, 8, NULL);
    float *alone_a = fw_prefill(rt, ta, 5, NULL);
    int sa, sb, sc;
    cr_assert_eq(model_seq_create(rt, &sa, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_seq_create(rt, &sb, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_seq_create(rt, &sc, &err), MT_OK, "%s", err.msg);
    step(rt, sb, tb, 8);
    step(rt, sc, tc, 2);
    int64_t p0, a0, p1, a1;
    model_runtime_attention_rows(rt, &p0, &a0);
    float *ga = malloc(sizeof(float) * (size_t)V * 5), *gb = malloc(sizeof(float) * (size_t)V);
    float *gc = malloc(sizeof(float) * (size_t)V * 6);
    model_step_item items[3] = {
        {.seq = sa, .tokens = ta, .n_tokens = 5, .all_logits = ga},
        {.seq = sb, .tokens = tb + 8, .n_tokens = 1, .all_logits = gb},
        {.seq = sc, .tokens = tc + 2, .n_tokens = 6, .all_logits = gc},
    };
    cr_assert_eq(model_step(rt, items, 3, &err), MT_OK, "%s", err.msg);
    model_runtime_attention_rows(rt, &p1, &a1);
    cr_assert(p1 - p0 == 11 && a1 - a0 == 1, "the batched step: %" PRId64 " rows on mla_prefill, "
              "%" PRId64 " absorbed; want 11 and 1", p1 - p0, a1 - a0);
    assert_rows(ga, alone_a, 5, V, "batched fresh chunk vs alone", seed);
    assert_rows(gc, alone_c + (size_t)2 * V, 6, V, "batched chunk after a prefix vs alone", seed);
    /* The decode row: absorbed here, mla_prefill in its prompt: across
     * paths, so only a loose bound (test_forward.c says why). */
    double e = fw_rel_l2(gb, alone_b + (size_t)8 * V, V);
    cr_assert_leq(e, 0.4, "seed %" PRIu64 ": the decode row between the chunks: %.3g", seed, e);
    free(ga);
    free(gb);
    free(gc);
    free(alone_a);
    free(alone_b);
    free(alone_c);
    free(ta);
    free(tb);
    free(tc);
    free(chunked);
    free(one);
    free(tok);
    model_runtime_close(rt);
    fw_rm_dir(dir);
}
