/* test_serve_glmout.c: GLM output to reasoning, content and tool calls
 * (serve/serve_glmout.h): GLM-4.7's compact and GLM-4.5's newline forms,
 * several calls, schema types, a call coming whole once complete (byte by
 * byte and all at once), at most one call when asked, malformed and
 * unterminated calls falling back to content in plain and stream alike,
 * and the fuzzer's invariants (tests/fuzz/serve_glmout_check.h) on its seeds
 * and on deterministic mutations of them, so the fuzz target's checks run in
 * CI too. */
#include <criterion/criterion.h>

#include "common/rng.h"
#include "fuzz/serve_glmout_check.h"

static const char *W = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
                       "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>";

/* Runs text through the parser in pieces of `piece` bytes (0: whole). */
static void run_text(const char *text, size_t piece, unsigned flags, gc_result *r)
{
    gc_run(text, strlen(text), flags, piece ? (unsigned)piece : 0, r);
}

static const char *str(const serve_buf *b) { return b->data ? b->data : ""; }

Test(serve_glmout, glm47_compact_call_with_typed_arguments)
{
    gc_result r = {0};
    char text[512];
    snprintf(text, sizeof text, "Let me check.%s", W);
    run_text(text, 0, 0, &r);
    cr_assert_str_eq(str(&r.content), "Let me check.");
    cr_assert_eq(r.n_calls, 1);
    cr_assert_str_eq(r.names[0], "get_weather");
    cr_assert_str_eq(str(&r.args[0]), "{\"city\":\"Paris\",\"days\":3}");
    gc_free(&r);
}

Test(serve_glmout, glm45_newlines_and_several_calls)
{
    gc_result r = {0};
    run_text("<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>a \"b\"\n</arg_value>\n"
             "<arg_key>filters</arg_key>\n<arg_value>{\"x\": [1, 2]}</arg_value>\n</tool_call>\n"
             "<tool_call>noargs\n</tool_call>",
             0, 0, &r);
    cr_assert_eq(r.n_calls, 2);
    cr_assert_str_eq(str(&r.args[0]), "{\"query\":\"a \\\"b\\\"\\n\",\"filters\":{\"x\":[1,2]}}");
    cr_assert_str_eq(r.names[1], "noargs");
    cr_assert_str_eq(str(&r.args[1]), "{}");
    cr_assert_str_eq(str(&r.content), "\n");
    gc_free(&r);
}

Test(serve_glmout, values_follow_the_schema_type_else_stay_strings)
{
    const cJSON *w = cJSON_GetObjectItem(gc_props(), "weather");
    struct {
        const char *key, *value, *json;
    } cases[] = {
        {"city", "42", "\"42\""},          /* string stays a string */
        {"days", "42", "42"},              /* integer */
        {"days", "4.5", "\"4.5\""},        /* not an integer: a string */
        {"metric", "True", "true"},        /* boolean, any case */
        {"metric", "yes", "\"yes\""},
        {"temp", "-2.5", "-2.5"},          /* number from a type list */
        {"temp", "null", "null"},
        {"unknown", "7", "\"7\""},         /* no schema: a string */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        serve_buf b = SERVE_BUF_INIT;
        cr_assert_eq(serve_glmout_arg_json(cJSON_GetObjectItem(w, cases[i].key), cases[i].value,
                                           strlen(cases[i].value), &b),
                     MT_OK);
        cr_assert_str_eq(str(&b), cases[i].json, "case %zu", i);
        serve_buf_release(&b);
    }
}

Test(serve_glmout, reasoning_is_split_out_or_kept)
{
    gc_result r = {0};
    run_text("think hard</think>The answer.", 1, 1, &r);
    cr_assert_str_eq(str(&r.reasoning), "think hard");
    cr_assert_str_eq(str(&r.content), "The answer.");
    gc_free(&r);
    memset(&r, 0, sizeof r);
    run_text("<think>why</think>Because.", 3, 0, &r);
    cr_assert_str_eq(str(&r.reasoning), "why");
    cr_assert_str_eq(str(&r.content), "Because.");
    gc_free(&r);
    memset(&r, 0, sizeof r);
    run_text("<think>why</think>Because.", 2, 2, &r); /* keep_reasoning */
    cr_assert_str_eq(str(&r.reasoning), "");
    cr_assert_str_eq(str(&r.content), "<think>why</think>Because.");
    gc_free(&r);
}

Test(serve_glmout, a_call_comes_whole_once_complete)
{
    serve_glmout_tool tools[1] = {{"get_weather", cJSON_GetObjectItem(gc_props(), "weather")}};
    serve_glmout_opts o = {tools, 1, false, false, 0, "x"};
    serve_glmout p;
    serve_glmout_init(&p, &o);
    serve_glmout_delta d = {0};
    /* One byte at a time: nothing until "</tool_call>", then all of it. */
    int calls = 0;
    for (const char *c = W; *c; c++) {
        cr_assert_eq(serve_glmout_push(&p, c, 1, &d), MT_OK);
        cr_assert_eq(d.content.len, 0, "no content leaks at byte %td", c - W);
        if (c[1])
            cr_assert_eq(d.n_calls, 0, "a call before it is complete, at byte %td", c - W);
        for (int i = 0; i < d.n_calls; i++, calls++) {
            cr_assert_str_eq(d.calls[i].name, "get_weather");
            cr_assert_str_eq(d.calls[i].id, "call_x_0");
            cr_assert_str_eq(str(&d.calls[i].args), "{\"city\":\"Paris\",\"days\":3}");
        }
    }
    cr_assert_eq(serve_glmout_finish(&p, &d), MT_OK);
    cr_assert_eq(d.n_calls, 0);
    cr_assert_eq(calls, 1);
    cr_assert_eq(serve_glmout_calls(&p), 1);
    /* Everything at once (a speculative step): the same call in one delta. */
    serve_glmout q;
    serve_glmout_init(&q, &o);
    cr_assert_eq(serve_glmout_push(&q, W, strlen(W), &d), MT_OK);
    cr_assert_eq(d.n_calls, 1);
    cr_assert_str_eq(d.calls[0].name, "get_weather");
    cr_assert_str_eq(str(&d.calls[0].args), "{\"city\":\"Paris\",\"days\":3}");
    serve_glmout_delta_release(&d);
    serve_glmout_release(&p);
    serve_glmout_release(&q);
}

Test(serve_glmout, max_calls_leaves_later_calls_as_content)
{
    char text[1024];
    snprintf(text, sizeof text, "%s %s", W, W);
    gc_result r = {0};
    run_text(text, 3, 4, &r); /* flag 4: at most one call */
    cr_assert_eq(r.n_calls, 1);
    cr_assert_str_eq(str(&r.content), strchr(text, ' '));
    gc_free(&r);
}

Test(serve_glmout, malformed_and_unterminated_calls_fall_back_to_content)
{
    const char *texts[] = {
        "a<tool_call>unknown_tool<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>b",
        "a<tool_call>get_weather junk <arg_key>x</arg_key></tool_call>b",
        "a<tool_call>get_weather<arg_key>city</arg_key>oops<arg_value>P</arg_value></tool_call>b",
        "a<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        gc_result r = {0};
        run_text(texts[i], 0, 0, &r);
        cr_assert_eq(r.n_calls, 0, "case %zu", i);
        cr_assert_str_eq(str(&r.content), texts[i], "case %zu: the answer is not lost", i);
        gc_free(&r);
    }
    /* Byte by byte (a stream): the same, nothing announced before. */
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        gc_result r = {0};
        run_text(texts[i], 1, 0, &r);
        cr_assert_eq(r.n_calls, 0, "case %zu", i);
        cr_assert_str_eq(str(&r.content), texts[i], "case %zu", i);
        gc_free(&r);
    }
}

/* The fuzzer's seeds (serve_fuzz.sh) and mutations of them: byte flips,
 * insertions of tags, cuts, so CI keeps the fuzz target's invariants. */
Test(serve_glmout, fuzz_invariants_on_seeds_and_mutations)
{
    static const char *const seeds[] = {
        "\x00\x03Hi<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
        "\x01\x05plan</think>ok<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>x y"
        "</arg_value>\n<arg_key>filters</arg_key>\n<arg_value>{\"a\":[1]}</arg_value>\n"
        "</tool_call><tool_call>noargs</tool_call>",
        "\x00\x07<think>r</think><tool_call>nope<arg_key>a</arg_key></tool_call>tail"
        "<tool_call>get_weather<arg_key>metric",
        "\x02\x01<think>keep</think><tool_call>get_weather<arg_key>temp</arg_key><arg_value>1e3"
        "</arg_value></tool_call>",
    };
    static const char *const tags[] = {"<think>", "</think>", "<tool_call>", "</tool_call>",
                                       "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                                       "get_weather", "\n", "<", "{"};
    mt_rng rng;
    mt_rng_seed(&rng, 21);
    uint8_t buf[1024];
    int runs = 0;
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        size_t n = 2 + strlen(seeds[s] + 2);
        memcpy(buf, seeds[s], n);
        serve_glmout_check(buf, n);
        for (int m = 0; m < 400; m++) {
            uint8_t mut[1024];
            size_t k = n;
            memcpy(mut, buf, n);
            int edits = 1 + (int)mt_rng_below(&rng, 4);
            for (int e = 0; e < edits; e++) {
                int kind = (int)mt_rng_below(&rng, 4);
                size_t at = 2 + (k > 2 ? mt_rng_below(&rng, k - 2) : 0);
                if (kind == 0 && k > 2) {
                    mut[at < k ? at : k - 1] = (uint8_t)mt_rng_below(&rng, 256);
                } else if (kind == 1) {
                    const char *t = tags[mt_rng_below(&rng, sizeof tags / sizeof tags[0])];
                    size_t tl = strlen(t);
                    if (k + tl < sizeof mut && at <= k) {
                        memmove(mut + at + tl, mut + at, k - at);
                        memcpy(mut + at, t, tl);
                        k += tl;
                    }
                } else if (kind == 2 && at < k) {
                    k = at; /* cut */
                } else if (at < k) {
                    size_t len = 1 + mt_rng_below(&rng, 8);
                    if (at + len > k)
                        len = k - at;
                    memmove(mut + at, mut + at + len, k - at - len);
                    k -= len;
                }
            }
            mut[1] = (uint8_t)mt_rng_below(&rng, 256);
            serve_glmout_check(mut, k);
            runs++;
        }
    }
    cr_log_info("%d mutated inputs checked", runs);
}
