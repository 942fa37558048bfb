/* test_forward_prefill.c: the runtime's two attention paths (rt_forward.c).
 * Prompt rows (model_step_item.n_prompt) whose context is at most
 * index_topk (the DSA indexer keeps every key) run mla_prefill, dense on
 * kv_b-expanded keys and values; every other row (generated tokens, rows
 * past index_topk) runs the absorbed, sparse mla_decode. Checked on the
 * tiny checkpoint (index_topk 16) on cpu: the runtime's row counts per path
 * for prompt chunks inside, across and past index_topk, single prompt
 * tokens, generated tokens alone and after prompt tokens in one item, and
 * on a batch-invariant runtime (never the prefill path); chunked prefill,
 * and chunks batched with a decode row between them, equal one prefill on
 * the new path (relative L2 1e-5, as test_forward.c holds one kernel path);
 * a prompt cut into random chunks with single tokens, alone or batched
 * with another sequence, gives bitwise the logits and greedy continuation
 * of one prefill. Decode equals prefill across the two paths:
 * test_forward.c (cpu) and test_forward_emu.c. */
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

/* Steps n tokens of tok onto seq (no logits), the first n_prompt of them
 * prompt tokens. */
static void step(model_runtime *rt, int seq, const int32_t *tok, int n, int n_prompt)
{
    mt_err err = MT_ERR_INIT;
    model_step_item it = {.seq = seq, .tokens = tok, .n_tokens = n, .n_prompt = n_prompt};
    cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
}

Test(forward_prefill, rows_take_mla_prefill_exactly_where_every_key_is_kept)
{
    char *dir = fw_tiny_dir();
    model_runtime *rt = fw_open(dir, (fw_open_args){.act = MODEL_ACT_NONE});
    int32_t V = model_runtime_vocab(rt);
    int topk = (int)model_runtime_config(rt)->index_topk;
    cr_assert_geq(topk, 10, "the tiny checkpoint's index_topk %d", topk);
    uint64_t seed = mt_seed_fresh();
    int32_t *tok = fw_tokens(seed, 2 * topk + 8, V);
    assert_counts(rt, 0, 0, "open");
    int seq;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_seq_create(rt, &seq, &err), MT_OK, "%s", err.msg);
    /* A prompt chunk inside index_topk, a one-token prompt chunk (the path
     * is the row's, not the chunk's), a decode token, two generated tokens
     * (a verify step), then a chunk of 4 across index_topk (its first two
     * rows see at most topk tokens, the other two more). */
    step(rt, seq, tok, topk - 8, topk - 8);
    assert_counts(rt, topk - 8, 0, "a chunk inside index_topk");
    step(rt, seq, tok + topk - 8, 1, 1);
    assert_counts(rt, topk - 7, 0, "a one-token prompt chunk");
    step(rt, seq, tok + topk - 7, 1, 0);
    assert_counts(rt, topk - 7, 1, "a decode token");
    step(rt, seq, tok + topk - 6, 2, 0);
    assert_counts(rt, topk - 7, 3, "two generated tokens");
    /* One prompt token, then a generated one, in one item (a request
     * recomputed after preemption). */
    step(rt, seq, tok + topk - 4, 2, 1);
    assert_counts(rt, topk - 6, 4, "a prompt token and a generated one");
    step(rt, seq, tok + topk - 2, 4, 4);
    assert_counts(rt, topk - 4, 6, "a chunk across index_topk");
    /* A chunk past it: absorbed only. */
    step(rt, seq, tok + topk + 2, 5, 5);
    assert_counts(rt, topk - 4, 11, "a chunk past index_topk");
    model_seq_free(rt, seq);
    /* A fresh prompt longer than index_topk: its first topk rows. */
    free(fw_prefill(rt, tok, topk + 3, NULL));
    assert_counts(rt, 2 * topk - 4, 14, "a prompt of index_topk + 3");
    model_runtime_close(rt);

    /* Batch-invariant: decode must equal prefill bitwise, so one path. */
    rt = fw_open(dir, (fw_open_args){.act = MODEL_ACT_NONE, .batch_invariant = true});
    free(fw_prefill(rt, tok, topk - 2, NULL));
    assert_counts(rt, 0, topk - 2, "a chunk on a batch-invariant runtime");
    int inv_seq;
    cr_assert_eq(model_seq_create(rt, &inv_seq, &err), MT_OK, "%s", err.msg);
    step(rt, inv_seq, tok, 1, 1);
    assert_counts(rt, 0, topk - 1, "a one-token prompt chunk on a batch-invariant runtime");
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
                              .all_logits = chunked + (size_t)cuts[c] * V,
                              .n_prompt = cuts[c + 1] - cuts[c]};
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
    step(rt, sb, tb, 8, 8);
    step(rt, sc, tc, 2, 2);
    int64_t p0, a0, p1, a1;
    model_runtime_attention_rows(rt, &p0, &a0);
    float *ga = malloc(sizeof(float) * (size_t)V * 5), *gb = malloc(sizeof(float) * (size_t)V);
    float *gc = malloc(sizeof(float) * (size_t)V * 6);
    model_step_item items[3] = {
        {.seq = sa, .tokens = ta, .n_tokens = 5, .all_logits = ga, .n_prompt = 5},
        {.seq = sb, .tokens = tb + 8, .n_tokens = 1, .all_logits = gb},
        {.seq = sc, .tokens = tc + 2, .n_tokens = 6, .all_logits = gc, .n_prompt = 6},
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

/* ---- a prompt row's result does not depend on the chunking ------------------ */

/* Cuts [a, b) into random chunks of 1 to 6 tokens, a third of them single
 * tokens; appends the chunk starts to cuts. */
static void random_cuts(mt_rng *r, int a, int b, int *cuts, int *n_cuts)
{
    while (a < b) {
        int c = mt_rng_below(r, 3) == 0 ? 1 : 1 + (int)mt_rng_below(r, 6);
        cuts[(*n_cuts)++] = a;
        a += c < b - a ? c : b - a;
    }
}

/* The greedy next token (ties to the lower id). */
static int32_t greedy(const float *lg, int32_t V)
{
    int32_t b = 0;
    for (int32_t v = 1; v < V; v++)
        b = lg[v] > lg[b] ? v : b;
    return b;
}

/* Prefills tok[0..n) onto a new sequence in the chunks cuts[0..n_cuts)
 * (starts; the last chunk ends at n), each chunk in a step of its own or,
 * with other >= 0, batched with one decode row of sequence other; writes
 * every position's logits to lg, then `gen` greedy tokens to out and their
 * decode logits to dec ([gen][V]). */
static void prefill_in_chunks(model_runtime *rt, const int32_t *tok, int n, const int *cuts,
                              int n_cuts, int other, float *lg, int gen, int32_t *out, float *dec)
{
    int32_t V = model_runtime_vocab(rt);
    mt_err err = MT_ERR_INIT;
    int seq;
    cr_assert_eq(model_seq_create(rt, &seq, &err), MT_OK, "%s", err.msg);
    int32_t filler = 7;
    for (int c = 0; c < n_cuts; c++) {
        int len = (c + 1 < n_cuts ? cuts[c + 1] : n) - cuts[c];
        model_step_item it[2] = {
            {.seq = seq, .tokens = tok + cuts[c], .n_tokens = len,
             .all_logits = lg + (size_t)cuts[c] * V, .n_prompt = len},
            {.seq = other, .tokens = &filler, .n_tokens = 1},
        };
        cr_assert_eq(model_step(rt, it, other >= 0 ? 2 : 1, &err), MT_OK, "%s", err.msg);
    }
    int32_t next = greedy(lg + (size_t)(n - 1) * V, V);
    for (int g = 0; g < gen; g++) {
        out[g] = next;
        model_step_item it = {.seq = seq, .tokens = &out[g], .n_tokens = 1,
                              .logits = dec + (size_t)g * V};
        cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
        next = greedy(dec + (size_t)g * V, V);
    }
    model_seq_free(rt, seq);
}

Test(forward_prefill, prompt_rows_do_not_depend_on_the_chunking)
{
    char *dir = fw_tiny_dir();
    model_runtime *rt = fw_open(dir, (fw_open_args){.act = MODEL_ACT_MXFP4});
    int32_t V = model_runtime_vocab(rt);
    int topk = (int)model_runtime_config(rt)->index_topk;
    uint64_t seed = mt_seed_fresh();
    cr_log_info("prompt_rows_do_not_depend_on_the_chunking: seed %" PRIu64, seed);
    mt_rng r;
    mt_rng_seed(&r, seed);
    /* A prompt across index_topk: rows below it on mla_prefill, the rest
     * absorbed, in every chunking. */
    int n = topk + 1 + (int)mt_rng_below(&r, (uint64_t)topk + 8);
    enum { GEN = 5 };
    int32_t *tok = fw_tokens(seed ^ 0x9e3779b97f4a7c15u, n, V);
    size_t rows_b = sizeof(float) * (size_t)V * (size_t)n, gen_b = sizeof(float) * (size_t)V * GEN;
    float *want = malloc(rows_b), *got = malloc(rows_b), *want_dec = malloc(gen_b),
          *got_dec = malloc(gen_b);
    int32_t want_out[GEN], got_out[GEN];
    int one[1] = {0};
    prefill_in_chunks(rt, tok, n, one, 1, -1, want, GEN, want_out, want_dec);

    int other;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_seq_create(rt, &other, &err), MT_OK, "%s", err.msg);
    int32_t first = 3;
    step(rt, other, &first, 1, 1);
    for (int k = 0; k < 3; k++) {
        /* A single-token chunk at a random position below index_topk (the
         * first chunking: position 0), random chunks around it. */
        int q = k == 0 ? 0 : (int)mt_rng_below(&r, (uint64_t)topk);
        int *cuts = malloc(sizeof(int) * (size_t)n), n_cuts = 0;
        random_cuts(&r, 0, q, cuts, &n_cuts);
        cuts[n_cuts++] = q;
        random_cuts(&r, q + 1, n, cuts, &n_cuts);
        memset(got, 0xff, rows_b);
        memset(got_dec, 0xff, gen_b);
        /* The last chunking shares its steps with another sequence's decode. */
        prefill_in_chunks(rt, tok, n, cuts, n_cuts, k == 2 ? other : -1, got, GEN, got_out,
                          got_dec);
        for (int t = 0; t < n; t++) {
            const float *g = got + (size_t)t * V, *w = want + (size_t)t * V;
            double e = fw_rel_l2(g, w, V);
            int chunk = 0;
            while (chunk + 1 < n_cuts && cuts[chunk + 1] <= t)
                chunk++;
            int len = (chunk + 1 < n_cuts ? cuts[chunk + 1] : n) - cuts[chunk];
            cr_assert(!memcmp(g, w, sizeof(float) * (size_t)V),
                      "seed %" PRIu64 ", chunking %d: position %d (a chunk of %d at %d, %d "
                      "chunks) differs from one prefill: relative L2 %.3g", seed, k, t, len,
                      cuts[chunk], n_cuts, e);
        }
        for (int g = 0; g < GEN; g++) {
            cr_assert_eq(got_out[g], want_out[g], "seed %" PRIu64 ", chunking %d: greedy token "
                         "%d is %d, %d after one prefill", seed, k, g, got_out[g], want_out[g]);
            cr_assert(!memcmp(got_dec + (size_t)g * V, want_dec + (size_t)g * V,
                              sizeof(float) * (size_t)V),
                      "seed %" PRIu64 ", chunking %d: decode step %d's logits differ (relative "
                      "L2 %.3g)", seed, k, g,
                      fw_rel_l2(got_dec + (size_t)g * V, want_dec + (size_t)g * V, V));
        }
        free(cuts);
    }
    model_seq_free(rt, other);
    free(want);
    free(got);
    free(want_dec);
    free(got_dec);
    free(tok);
    model_runtime_close(rt);
    fw_rm_dir(dir);
}
