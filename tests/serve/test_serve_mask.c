/* test_serve_mask.c: the token mask (serve/serve_mask.h) against brute force:
 * at states reached by random walks of several grammars (inside strings
 * with and without a length limit, keys, numbers, enums, tool-call tags and
 * raw arguments), the mask is exactly the set of tokens whose bytes the
 * grammar accepts one after another, over the tiny model's tokenizer and
 * over a synthetic vocabulary of JSON-ish and multi-byte pieces; the cache
 * gives the same masks; special tokens are never allowed; the mask applied
 * leaves only allowed logits finite. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <unistd.h>

#include "common/rng.h"
#include "model/format/tiny.h"
#include "serve/serve_mask.h"
#include "test_tmp.h"

/* ---- vocabularies ------------------------------------------------------------------ */

typedef struct tv {
    int32_t n;
    char **bytes;
    uint32_t *lens;
    bool *text;
} tv;

static void tv_free(tv *v)
{
    for (int32_t i = 0; i < v->n; i++)
        free(v->bytes[i]);
    free(v->bytes);
    free(v->lens);
    free(v->text);
}

static void tv_alloc(tv *v, int32_t n)
{
    v->n = n;
    v->bytes = calloc((size_t)n, sizeof *v->bytes);
    v->lens = calloc((size_t)n, sizeof *v->lens);
    v->text = calloc((size_t)n, sizeof *v->text);
}

static void tv_set(tv *v, int32_t i, const char *p, uint32_t n, bool text)
{
    v->bytes[i] = malloc(n + 1);
    memcpy(v->bytes[i], p, n);
    v->lens[i] = n;
    v->text[i] = text;
}

static void tiny_vocab(tv *v)
{
    char path[512];
    close(tmp_file_make(path, sizeof path, "mt_mask_tok"));
    mt_err err = MT_ERR_INIT;
    model_tokenizer *tok;
    cr_assert_eq(model_tiny_write_tokenizer(path, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_tokenizer_load(path, &tok, &err), MT_OK, "%s", err.msg);
    unlink(path);
    int32_t n = model_tokenizer_vocab_size(tok);
    tv_alloc(v, n);
    for (int32_t i = 0; i < n; i++) {
        char buf[256];
        int64_t k = model_tokenizer_token_bytes(tok, i, buf, sizeof buf);
        tv_set(v, i, buf, k > 0 ? (uint32_t)k : 0, k > 0 && !model_tokenizer_is_special(tok, i));
    }
    model_tokenizer_destroy(tok);
}

/* Pieces of JSON and GLM tags, ASCII letters, and multi-byte characters,
 * whole or split, joined at random. */
static void synthetic_vocab(tv *v, int32_t n, uint64_t seed)
{
    static const char *const pieces[] = {
        "\"", "\":", "\",", "\"}", "{\"", "[\"", "\"]", "},", "}]", ",\"", ":", ",", "{", "}",
        "[", "]", "\\", "\\n", "\\\"", "\\u00", "null", "true", "false", "-", ".", "e", "E",
        "+", "0", "1", "23", "456", " ", "  ", "\n", "<", "</", "<arg_key>", "</arg_key>",
        "<arg_value>", "</arg_value>", "<tool_call>", "</tool_call>", "get_weather", "city",
        "days", "name", "kind", "cat", "dog", "a", "b", "x", "y", "z", "\xc3\xa9", "\xe4\xb8\xad",
        "\xe4", "\xb8\xad", "\xf0\x9f\x98\x80", "\xf0\x9f", "\x98\x80", "\xc3", "\xa9", "\x01",
        "\t", "/", "u", "d", "8", "0000"};
    const int np = (int)(sizeof pieces / sizeof pieces[0]);
    mt_rng r;
    mt_rng_seed(&r, seed);
    tv_alloc(v, n);
    int32_t i = 0;
    for (int b = 0; b < 256 && i < n; b++, i++) {
        char c = (char)b;
        tv_set(v, i, &c, 1, true);
    }
    for (; i < n; i++) {
        char buf[64];
        uint32_t len = 0;
        int parts = 1 + (int)mt_rng_below(&r, 4);
        for (int p = 0; p < parts; p++) {
            const char *s = pieces[mt_rng_below(&r, (uint64_t)np)];
            size_t sl = strlen(s);
            if (len + sl < sizeof buf) {
                memcpy(buf + len, s, sl);
                len += (uint32_t)sl;
            }
        }
        tv_set(v, i, buf, len, mt_rng_below(&r, 50) != 0); /* a few "special" ones */
    }
}

/* ---- the check ------------------------------------------------------------------------ */

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
    "\"text\":{\"type\":\"string\"},\"kind\":{\"enum\":[\"cat\",\"dog\",12,null]},"
    "\"n\":{\"type\":\"number\"},\"list\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},"
    "\"maxItems\":3},\"sub\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}}}},"
    "\"required\":[\"name\",\"kind\"]}";
static const char *TOOL_PARAMS =
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":5},"
    "\"note\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}";

static void brute(const tv *v, const serve_grammar *g, const serve_gstate *s, uint64_t *m,
                  size_t words)
{
    memset(m, 0, words * sizeof *m);
    for (int32_t i = 0; i < v->n; i++) {
        if (!v->text[i] || !v->lens[i])
            continue;
        serve_gstate t = *s;
        if (serve_grammar_feed(g, &t, v->bytes[i], v->lens[i]))
            m[i >> 6] |= 1ull << (i & 63);
    }
}

/* Random walks of g in whole tokens of v (a random allowed token each
 * step, by brute force), comparing the mask with brute force at each. */
static int compare_along_walks(const tv *v, serve_vocab *sv, const serve_grammar *g,
                               serve_mask_cache *cache, uint64_t seed, int walks, int *in_string)
{
    size_t words = serve_mask_words(sv);
    uint64_t *want = malloc(words * 8), *got = malloc(words * 8), *cached = malloc(words * 8);
    mt_rng r;
    mt_rng_seed(&r, seed);
    int checked = 0;
    for (int w = 0; w < walks; w++) {
        serve_gstate s;
        serve_grammar_start(g, &s);
        for (int step = 0; step < 60; step++) {
            brute(v, g, &s, want, words);
            bool acc = serve_mask_compute(sv, g, &s, got);
            uint32_t room, need;
            uint8_t pending;
            *in_string += serve_grammar_in_string(g, &s, &room, &need, &pending) != 0;
            for (size_t k = 0; k < words; k++)
                cr_assert_eq(got[k], want[k], "seed %llu walk %d step %d: word %zu %llx, brute %llx",
                             (unsigned long long)seed, w, step, k, (unsigned long long)got[k],
                             (unsigned long long)want[k]);
            cr_assert_eq(acc, serve_grammar_accepting(g, &s));
            bool acc2 = serve_mask_get(sv, g, cache, &s, cached, NULL);
            cr_assert_eq(acc2, acc);
            cr_assert_arr_eq(cached, want, words * 8);
            checked++;
            int32_t pick[4096];
            int np = 0;
            for (int32_t i = 0; i < v->n && np < 4096; i++)
                if ((want[i >> 6] >> (i & 63)) & 1)
                    pick[np++] = i;
            if (!np)
                break;
            int32_t t = pick[mt_rng_below(&r, (uint64_t)np)];
            cr_assert(serve_grammar_feed(g, &s, v->bytes[t], v->lens[t]));
        }
    }
    free(want);
    free(got);
    free(cached);
    return checked;
}

static void check_vocab(const tv *v)
{
    serve_vocab *sv;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_vocab_create(v->n, (const char *const *)v->bytes, v->lens, v->text, &sv,
                                    &err),
                 MT_OK, "%s", err.msg);
    uint64_t seed = mt_seed_fresh();
    cJSON *sch = cJSON_Parse(SCHEMA), *params = cJSON_Parse(TOOL_PARAMS);
    serve_grammar_opts oj = {.schema = sch, .param = "s"};
    serve_grammar_opts oo = {.param = "s"}; /* json_object */
    serve_grammar_tool tools[2] = {{"get_weather", params}, {"get", NULL}};
    serve_grammar_opts ot = {.tools = tools, .n_tools = 2, .parallel = true};
    serve_grammar_opts *all[3] = {&oj, &oo, &ot};
    int checked = 0, in_string = 0;
    for (int k = 0; k < 3; k++) {
        serve_grammar *g;
        serve_error e = SERVE_ERROR_INIT;
        cr_assert_eq(serve_grammar_compile(all[k], &g, &e), MT_OK, "%s", e.err.msg);
        serve_mask_cache *cache;
        cr_assert_eq(serve_mask_cache_create(1 << 20, &cache, &err), MT_OK);
        checked += compare_along_walks(v, sv, g, cache, seed + (uint64_t)k, 12, &in_string);
        uint64_t hits, misses;
        serve_mask_cache_stats(cache, &hits, &misses);
        cr_assert_gt(hits + misses, 0);
        serve_mask_cache_destroy(cache);
        serve_grammar_release(g);
    }
    cr_log_info("%d states compared (%d inside strings), seed %llu", checked, in_string,
                (unsigned long long)seed);
    cr_assert_gt(in_string, 10, "the walks never went inside a string");
    cJSON_Delete(sch);
    cJSON_Delete(params);
    serve_vocab_destroy(sv);
}

Test(serve_mask, equals_brute_force_over_the_tiny_tokenizer)
{
    tv v;
    tiny_vocab(&v);
    check_vocab(&v);
    tv_free(&v);
}

Test(serve_mask, equals_brute_force_over_a_synthetic_vocabulary)
{
    tv v;
    synthetic_vocab(&v, 3000, mt_seed_fresh());
    check_vocab(&v);
    tv_free(&v);
}

Test(serve_mask, apply_leaves_only_allowed_logits)
{
    enum { V = 200 };
    uint64_t m[4] = {0};
    float lg[V];
    for (int i = 0; i < V; i++)
        lg[i] = (float)i;
    for (int i = 0; i < V; i += 3)
        m[i >> 6] |= 1ull << (i & 63);
    m[1] = ~0ull; /* a whole word allowed */
    serve_mask_apply(m, lg, V);
    for (int i = 0; i < V; i++) {
        bool allowed = (m[i >> 6] >> (i & 63)) & 1;
        cr_assert_eq(isinf(lg[i]) != 0, !allowed, "token %d", i);
        if (allowed)
            cr_assert_eq(lg[i], (float)i);
    }
}
