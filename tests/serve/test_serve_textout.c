/* test_serve_textout.c: token-by-token text equals the tokenizer's own
 * decode of the whole sequence (special tokens skipped, invalid UTF-8 as
 * U+FFFD) for random token sequences; with stop strings it equals that
 * text cut at a stop string, and nothing after a stop string is
 * ever emitted (the first stop string to be completed, token by token,
 * wins); partial characters are held back. */
#define _GNU_SOURCE /* memmem */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rng.h"
#include "model/format/tiny.h"
#include "model/format/tokenizer.h"
#include "serve/serve_textout.h"
#include "test_tmp.h"

static model_tokenizer *tok;

static void load_tok(void)
{
    char path[512];
    close(tmp_file_make(path, sizeof path, "mt_serve_tok"));
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tiny_write_tokenizer(path, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_tokenizer_load(path, &tok, &err), MT_OK, "%s", err.msg);
    unlink(path);
}

static void free_tok(void) { model_tokenizer_destroy(tok); }

/* Raw bytes of the non-special tokens (the reference's input). */
static void raw_bytes(const int32_t *ids, int n, serve_buf *out)
{
    for (int i = 0; i < n; i++) {
        if (model_tokenizer_is_special(tok, ids[i]))
            continue;
        char b[256];
        int64_t k = model_tokenizer_token_bytes(tok, ids[i], b, sizeof b);
        cr_assert(k >= 0 && k <= (int64_t)sizeof b);
        serve_buf_append(out, b, (size_t)k);
    }
}

static void stream_text(const int32_t *ids, int n, char *const *stop, int n_stop, serve_buf *out,
                        bool *stopped)
{
    serve_textout t;
    serve_textout_init(&t, tok, stop, n_stop);
    for (int i = 0; i < n; i++)
        cr_assert_eq(serve_textout_push(&t, ids[i], out), MT_OK);
    *stopped = t.stopped;
    cr_assert_eq(serve_textout_finish(&t, out), MT_OK);
    serve_textout_release(&t);
}

Test(serve_textout, streamed_text_equals_whole_decode, .init = load_tok, .fini = free_tok)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    int32_t vocab = model_tokenizer_vocab_size(tok);
    for (int it = 0; it < 400; it++) {
        int32_t ids[64];
        int n = 1 + (int)mt_rng_below(&rng, 64);
        for (int i = 0; i < n; i++) /* bytes 0x80+ alone make invalid UTF-8 often */
            ids[i] = (int32_t)mt_rng_below(&rng, (uint64_t)vocab);
        char *want;
        size_t wlen;
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(model_tokenizer_decode(tok, ids, (size_t)n, true, &want, &wlen, &err), MT_OK,
                     "%s", err.msg);
        serve_buf got = SERVE_BUF_INIT;
        bool stopped;
        stream_text(ids, n, NULL, 0, &got, &stopped);
        cr_assert(!stopped);
        cr_assert_eq(got.len, wlen, "seed %llu it %d: %zu bytes, want %zu",
                     (unsigned long long)seed, it, got.len, wlen);
        cr_assert(!memcmp(got.data ? got.data : "", want, wlen), "seed %llu it %d",
                  (unsigned long long)seed, it);
        free(want);
        serve_buf_release(&got);
    }
}

Test(serve_textout, stop_strings_cut_at_the_earliest, .init = load_tok, .fini = free_tok)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    const char *corpus = model_tiny_corpus();
    size_t clen = strlen(corpus);
    int hits = 0;
    for (int it = 0; it < 300; it++) {
        /* Text from the corpus, so stop strings drawn from it occur. */
        size_t at = mt_rng_below(&rng, clen - 200), len = 20 + mt_rng_below(&rng, 150);
        int32_t *ids;
        size_t n;
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(model_tokenizer_encode(tok, corpus + at, len, &ids, &n, &err), MT_OK);
        char s0[8], s1[8];
        size_t a0 = at + mt_rng_below(&rng, len + 40), l0 = 1 + mt_rng_below(&rng, 5);
        size_t a1 = at + mt_rng_below(&rng, len + 40), l1 = 1 + mt_rng_below(&rng, 5);
        snprintf(s0, sizeof s0, "%.*s", (int)l0, corpus + a0);
        snprintf(s1, sizeof s1, "%.*s", (int)l1, corpus + a1);
        char *stop[2] = {s0, s1};
        /* The reference: after each token, the text so far is searched; the
         * first token whose text completes a stop string ends the output at
         * the earliest stop string then present (as a server streaming
         * tokens must: it cannot wait for a longer stop string that might
         * start earlier and complete later). */
        serve_buf raw = SERVE_BUF_INIT, want = SERVE_BUF_INIT, got = SERVE_BUF_INIT;
        size_t cut = (size_t)-1;
        for (size_t i = 0; i < n && cut == (size_t)-1; i++) {
            raw_bytes(ids + i, 1, &raw);
            for (int k = 0; k < 2; k++) {
                char *h = raw.len ? memmem(raw.data, raw.len, stop[k], strlen(stop[k])) : NULL;
                if (h && (size_t)(h - raw.data) < cut)
                    cut = (size_t)(h - raw.data);
            }
        }
        bool want_stop = cut != (size_t)-1;
        if (!want_stop)
            cut = raw.len;
        serve_utf8_lossy(&want, raw.data, cut);
        bool stopped;
        stream_text(ids, (int)n, stop, 2, &got, &stopped);
        cr_assert_eq(stopped, want_stop, "seed %llu it %d", (unsigned long long)seed, it);
        hits += stopped;
        cr_assert_eq(got.len, want.len, "seed %llu it %d: '%s' vs '%s' (stops '%s' '%s')",
                     (unsigned long long)seed, it, got.data, want.data, s0, s1);
        cr_assert(!memcmp(got.data ? got.data : "", want.data ? want.data : "", want.len));
        free(ids);
        serve_buf_release(&raw);
        serve_buf_release(&want);
        serve_buf_release(&got);
    }
    cr_assert_gt(hits, 50, "the stop strings should often occur (%d)", hits);
}

Test(serve_textout, holds_back_partial_characters_and_stop_prefixes, .init = load_tok,
     .fini = free_tok)
{
    /* Byte tokens: the tiny tokenizer's first 256 ids are the bytes in
     * GPT-2's order; find the ids of 0xC3 and 0xA9 by their bytes. */
    int32_t c3 = -1, a9 = -1, bang = -1, h = -1;
    for (int32_t id = 0; id < 256; id++) {
        char b[8];
        if (model_tokenizer_token_bytes(tok, id, b, sizeof b) != 1)
            continue;
        unsigned char u = (unsigned char)b[0];
        c3 = u == 0xC3 ? id : c3;
        a9 = u == 0xA9 ? id : a9;
        bang = u == '!' ? id : bang;
        h = u == 'h' ? id : h;
    }
    cr_assert(c3 >= 0 && a9 >= 0 && bang >= 0 && h >= 0);
    char stop0[] = "h!x";
    char *stop[1] = {stop0};
    serve_textout t;
    serve_textout_init(&t, tok, stop, 1);
    serve_buf out = SERVE_BUF_INIT;
    cr_assert_eq(serve_textout_push(&t, c3, &out), MT_OK);
    cr_assert_eq(out.len, 0, "half of é must wait");
    cr_assert_eq(serve_textout_push(&t, a9, &out), MT_OK);
    cr_assert_str_eq(out.data, "\xC3\xA9");
    cr_assert_eq(serve_textout_push(&t, h, &out), MT_OK);
    cr_assert_eq(serve_textout_push(&t, bang, &out), MT_OK);
    cr_assert_str_eq(out.data, "\xC3\xA9", "'h!' may start the stop string");
    cr_assert_eq(serve_textout_push(&t, h, &out), MT_OK);
    cr_assert_str_eq(out.data, "\xC3\xA9h!", "'h!h' cannot: 'h!' goes out, 'h' waits");
    cr_assert_eq(serve_textout_push(&t, c3, &out), MT_OK);
    cr_assert_eq(serve_textout_finish(&t, &out), MT_OK);
    cr_assert_str_eq(out.data, "\xC3\xA9h!h\xEF\xBF\xBD", "a dangling lead byte is U+FFFD");
    serve_textout_release(&t);
    serve_buf_release(&out);
}

Test(serve_textout, lossy_matches_maximal_subparts)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"a\x80z", "a\xEF\xBF\xBDz"},
        {"\xE2\x82", "\xEF\xBF\xBD"},                /* truncated: one replacement */
        {"\xE2\x82\x41", "\xEF\xBF\xBD" "A"},
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* surrogate */
        {"\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80"},
        {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"}, /* overlong */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        serve_buf b = SERVE_BUF_INIT;
        cr_assert_eq(serve_utf8_lossy(&b, cases[i].in, strlen(cases[i].in)), MT_OK);
        cr_assert_str_eq(b.data, cases[i].want, "case %zu", i);
        serve_buf_release(&b);
    }
}
