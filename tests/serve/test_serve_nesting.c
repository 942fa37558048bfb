/* test_serve_nesting.c: no request body stops the server. cJSON recurses
 * once per nesting level, and a civetweb worker has a 100 KiB stack (as
 * Debian builds it), so the depth is refused before parsing: the scanner's
 * contract cell by cell, the parser on a thread with a worker's stack (at
 * the limit, past it, and a fuzz run of mutated bodies with a fresh seed),
 * and deep '[' and '{' bodies against a real server on loopback. */
#include <pthread.h>

#include "common/json_depth.h"
#include "serve/serve_grammar.h"
#include "serve/serve_logits.h"
#include "serve/serve_request.h"
#include "test_serve_util.h"

/* civetweb 1.15 as Debian builds it (USE_STACK_SIZE=102400). */
#define WORKER_STACK (100u << 10)

/* ---- the scanner -------------------------------------------------------------- */

static void expect_depth(const char *s, int max, bool deep, size_t at)
{
    size_t got = 12345;
    bool d = mt_json_too_deep(s, strlen(s), max, &got);
    cr_assert_eq(d, deep, "%s at max %d: %d", s, max, d);
    if (deep)
        cr_assert_eq(got, at, "%s: at %zu, want %zu", s, got, at);
    else
        cr_assert_eq(got, 12345, "%s: *at written on success", s);
}

Test(serve_nesting, the_scanner_counts_brackets_outside_strings_only)
{
    expect_depth("", 0, false, 0);
    expect_depth("1", 0, false, 0);
    expect_depth("[]", 0, true, 0);
    expect_depth("[]", 1, false, 0);
    expect_depth("[[]]", 1, true, 1);
    expect_depth("{\"a\":[{}]}", 3, false, 0);
    expect_depth("{\"a\":[{}]}", 2, true, 6);
    /* Siblings do not add up. */
    expect_depth("[[],[],{},[[]]]", 3, false, 0);
    expect_depth("[[],[],{},[[]]]", 2, true, 11);
    /* Brackets in strings, escaped quotes, an escaped backslash before the
     * closing quote. */
    expect_depth("[\"[[[{{{\"]", 1, false, 0);
    expect_depth("[\"\\\"[[[\"]", 1, false, 0);
    expect_depth("[\"\\\\\",[[]]]", 2, true, 7);
    /* Stray closers never make the depth negative (the parser reports them). */
    expect_depth("]]]]}}[[", 1, true, 7);
    /* A string left open: nothing after it counts. */
    expect_depth("[\"[[[[", 1, false, 0);
    /* Bytes past n are not read. */
    cr_assert(!mt_json_too_deep("[[[[", 2, 2, NULL));
    cr_assert(mt_json_too_deep("[[[[", 3, 2, NULL));
}

/* ---- the parser on a worker's stack -------------------------------------------- */

typedef struct parse_job {
    serve_api api;
    const char *body;
    size_t len;
    mt_status st;
    serve_error e;
    int grammar; /* 1 compiled, -1 refused, 0 none asked */
} parse_job;

static void *parse_main(void *arg)
{
    parse_job *j = arg;
    serve_limits lim = {4096, 512};
    serve_request r;
    j->e = (serve_error)SERVE_ERROR_INIT;
    j->st = serve_request_parse(j->api, j->body, j->len, &lim, &r, &j->e);
    if (j->st != MT_OK)
        return NULL;
    /* The request's grammar, compiled where the server compiles it. */
    int32_t stop = 0;
    serve_logits_spec spec;
    if (serve_logits_spec_make(&r, j->api == SERVE_API_CHAT, NULL, &stop, 1, &spec, &j->e)) {
        j->st = MT_E_NOMEM;
    } else if (spec.lo.grammar) {
        serve_grammar *g = NULL;
        j->grammar = serve_grammar_compile(&spec.go, &g, &j->e) == MT_OK ? 1 : -1;
        if (j->grammar < 0)
            j->st = j->e.err.status;
        serve_grammar_release(g);
    }
    serve_logits_spec_release(&spec);
    serve_request_release(&r);
    return NULL;
}

/* Parses on a thread with a civetweb worker's stack: a stack overflow
 * kills the test process, which Criterion reports as a crash. */
static void parse_on_worker_stack(parse_job *j)
{
    pthread_attr_t a;
    pthread_attr_init(&a);
    cr_assert_eq(pthread_attr_setstacksize(&a, WORKER_STACK), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, &a, parse_main, j), 0);
    pthread_join(th, NULL);
    pthread_attr_destroy(&a);
}

/* {"prompt":"x","n":[[...[1]...]]} with the array nested so that the body's
 * depth is depth (the outer object is one level). */
static char *nested_body(int depth, char open, char close)
{
    size_t cap = 64 + 8 * (size_t)depth;
    char *b = malloc(cap);
    size_t n = (size_t)sprintf(b, "{\"prompt\":\"x\",\"extra\":");
    for (int i = 1; i < depth; i++) {
        if (open == '{')
            n += (size_t)sprintf(b + n, "{\"k\":");
        else
            b[n++] = open;
    }
    b[n++] = '1';
    for (int i = 1; i < depth; i++)
        b[n++] = close;
    b[n++] = '}';
    b[n] = 0;
    return b;
}

Test(serve_nesting, the_limit_parses_on_a_worker_stack_and_one_more_is_a_400_naming_it)
{
    for (int k = 0; k < 2; k++) {
        char open = k ? '{' : '[', close = k ? '}' : ']';
        char *b = nested_body(MT_JSON_MAX_DEPTH, open, close);
        cr_assert(!mt_json_too_deep(b, strlen(b), MT_JSON_MAX_DEPTH, NULL));
        parse_job j = {SERVE_API_COMPLETIONS, b, strlen(b), MT_OK, SERVE_ERROR_INIT, 0};
        parse_on_worker_stack(&j);
        /* Parsed whole: unknown keys are ignored, so the request is valid. */
        cr_assert_eq(j.st, MT_OK, "depth %d (%c): %s", MT_JSON_MAX_DEPTH, open, j.e.err.msg);
        free(b);
        b = nested_body(MT_JSON_MAX_DEPTH + 1, open, close);
        j = (parse_job){SERVE_API_CHAT, b, strlen(b), MT_OK, SERVE_ERROR_INIT, 0};
        parse_on_worker_stack(&j);
        cr_assert_neq(j.st, MT_OK);
        cr_assert_eq(j.e.http, 400);
        char want[64];
        snprintf(want, sizeof want, "more than %d deep", MT_JSON_MAX_DEPTH);
        cr_assert(strstr(j.e.err.msg, want), "%s", j.e.err.msg);
        free(b);
    }
    /* A megabyte of '[': refused without recursing. */
    size_t big = 1u << 20;
    char *b = malloc(big);
    memset(b, '[', big);
    parse_job j = {SERVE_API_COMPLETIONS, b, big, MT_OK, SERVE_ERROR_INIT, 0};
    parse_on_worker_stack(&j);
    cr_assert_eq(j.e.http, 400, "%s", j.e.err.msg);
    free(b);
}

Test(serve_nesting, tool_call_arguments_are_held_to_the_same_depth)
{
    /* The arguments string is JSON parsed on its own: its depth is not the
     * body's. */
    size_t depth = MT_JSON_MAX_DEPTH + 5;
    char *args = malloc(4 * depth + 16);
    size_t n = 0;
    for (size_t i = 0; i < depth; i++)
        n += (size_t)sprintf(args + n, "[");
    for (size_t i = 0; i < depth; i++)
        args[n++] = ']';
    args[n] = 0;
    char *b = malloc(n + 512);
    sprintf(b,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\","
            "\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\","
            "\"arguments\":\"%s\"}}]}]}",
            args);
    parse_job j = {SERVE_API_CHAT, b, strlen(b), MT_OK, SERVE_ERROR_INIT, 0};
    parse_on_worker_stack(&j);
    cr_assert_eq(j.e.http, 400, "%s", j.e.err.msg);
    cr_assert(strstr(j.e.err.msg, "arguments"), "%s", j.e.err.msg);
    cr_assert(strstr(j.e.err.msg, "deep"), "%s", j.e.err.msg);
    free(b);
    free(args);
}

/* Mutations of valid bodies (structured outputs' schemas and tools among
 * them): brackets and braces inserted in runs, bytes flipped, cut short.
 * Every body is parsed, and its grammar compiled, on a worker's stack:
 * accepted, or refused with a 4xx and a message. */
Test(serve_nesting, a_fuzz_run_on_a_worker_stack_never_crashes)
{
    static const char *seeds[] = {
        "{\"prompt\":\"The keeper\",\"max_tokens\":8,\"stop\":[\"x\"],\"stream\":true}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\"}}}}}]}",
        "{\"tokens\":[1,2,3]}",
        "{\"prompt\":[[4,5]],\"logprobs\":null}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":"
        "\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"object\",\"properties\":{"
        "\"a\":{\"type\":\"array\",\"items\":{\"enum\":[1,\"b\"]}},\"c\":{\"anyOf\":[{"
        "\"type\":\"string\"},{\"type\":\"null\"}]}},\"required\":[\"a\"]}}},"
        "\"logit_bias\":{\"3\":1},\"min_p\":0.1}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"q\":{\"type\":\"object\",\"properties\":{\"r\":{\"type\":"
        "\"integer\"}}}},\"required\":[\"q\"]}}}],\"tool_choice\":\"required\"}",
    };
    uint64_t seed = mt_seed_fresh();
    cr_log_info("seed %llu (MOETUNE_SEED replays it)", (unsigned long long)seed);
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    char *b = malloc(1 << 16);
    int refused = 0, accepted = 0, grammars = 0;
    for (int it = 0; it < 3000; it++) {
        const char *s = seeds[mt_rng_below(&rng, sizeof seeds / sizeof seeds[0])];
        size_t n = strlen(s);
        memcpy(b, s, n);
        int muts = 1 + (int)mt_rng_below(&rng, 4);
        for (int m = 0; m < muts; m++) {
            size_t at = (size_t)mt_rng_below(&rng, n + 1);
            switch (mt_rng_below(&rng, 4)) {
            case 0: { /* a run of openers, some closed */
                size_t run = 1 + (size_t)mt_rng_below(&rng, 3000);
                if (n + 2 * run >= (1 << 16))
                    break;
                char o = "[{"[mt_rng_below(&rng, 2)];
                memmove(b + at + run, b + at, n - at);
                memset(b + at, o, run);
                n += run;
                size_t shut = (size_t)mt_rng_below(&rng, run + 1);
                memmove(b + at + run + shut, b + at + run, n - at - run);
                memset(b + at + run, o == '[' ? ']' : '}', shut);
                n += shut;
                break;
            }
            case 1:
                if (at < n)
                    b[at] = (char)mt_rng_below(&rng, 256);
                break;
            case 2:
                n = at;
                break;
            default:
                if (n + 1 < (1 << 16)) {
                    memmove(b + at + 1, b + at, n - at);
                    b[at] = "[]{}\",:\\"[mt_rng_below(&rng, 8)];
                    n++;
                }
            }
        }
        parse_job j = {(serve_api)mt_rng_below(&rng, SERVE_API_COUNT), b, n, MT_OK,
                       SERVE_ERROR_INIT, 0};
        parse_on_worker_stack(&j);
        grammars += j.grammar > 0;
        if (j.st == MT_OK) {
            accepted++;
        } else {
            cr_assert(j.e.http >= 400 && j.e.http < 500 && j.e.err.msg[0], "seed %llu it %d",
                      (unsigned long long)seed, it);
            refused++;
        }
    }
    free(b);
    cr_log_info("%d accepted (%d grammars compiled), %d refused", accepted, grammars, refused);
    cr_assert_gt(refused, 0);
}

/* ---- a real server -------------------------------------------------------------- */

Test(serve_nesting, deep_brackets_and_braces_get_a_400_and_the_server_keeps_serving)
{
    tsrv t;
    tsrv_start(&t, NULL);
    static const int depths[] = {700, 850, 5000, 200000};
    static const char *paths[] = {"/v1/completions", "/v1/chat/completions", "/tokenize",
                                  "/detokenize"};
    for (int k = 0; k < 2; k++) {
        for (size_t d = 0; d < sizeof depths / sizeof *depths; d++) {
            size_t n = (size_t)depths[d];
            char *b = malloc(n + 1);
            memset(b, k ? '{' : '[', n);
            b[n] = 0;
            const char *path = paths[(d + (size_t)k) % 4];
            cJSON *j = NULL;
            char *raw = NULL;
            int st = http(&t, "POST", path, b, &j, &raw);
            cr_assert_eq(st, 400, "%zu x '%c' to %s: %d %s", n, b[0], path, st, raw);
            cr_assert(strstr(assert_error_shape(j, raw), "deep"), "%s", raw);
            cJSON_Delete(j);
            free(raw);
            free(b);
        }
    }
    cJSON *j;
    cr_assert_eq(http(&t, "GET", "/health", NULL, &j, NULL), 200);
    cJSON_Delete(j);
    cr_assert_eq(http(&t, "POST", "/v1/completions",
                      "{\"prompt\":[5,6,7],\"max_tokens\":2,\"temperature\":0}", &j, NULL),
                 200);
    cJSON_Delete(j);
    tsrv_stop(&t);
}
