/* test_serve_sse.c: server-sent events: framing then parsing gives back the
 * payloads whatever the split of the byte stream, with LF, CRLF and CR line
 * ends, multi-line data, comments and other fields; an early stop. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "serve/serve_sse.h"

typedef struct got {
    char *ev[64];
    int n;
    int stop_after; /* 0: never */
} got;

static bool collect(void *ctx, const char *data, size_t n)
{
    got *g = ctx;
    cr_assert_lt(g->n, 64);
    cr_assert_eq(strlen(data), n, "data must be NUL-terminated at n");
    g->ev[g->n++] = strndup(data, n);
    return !(g->stop_after && g->n >= g->stop_after);
}

static void got_free(got *g)
{
    for (int i = 0; i < g->n; i++)
        free(g->ev[i]);
}

/* Feeds bytes in random pieces. */
static void feed_split(const char *bytes, size_t n, got *g, mt_rng *rng)
{
    serve_sse_parser p = SERVE_SSE_PARSER_INIT;
    size_t at = 0;
    while (at < n) {
        size_t k = 1 + mt_rng_below(rng, 7);
        if (k > n - at)
            k = n - at;
        bool stopped = false;
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(serve_sse_feed(&p, bytes + at, k, collect, g, &stopped, &err), MT_OK, "%s",
                     err.msg);
        at += k;
        if (stopped)
            break;
    }
    serve_sse_release(&p);
}

Test(serve_sse, frames_round_trip_under_any_split)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    for (int it = 0; it < 300; it++) {
        char payload[8][40];
        int np = 1 + (int)mt_rng_below(&rng, 8);
        serve_buf b = SERVE_BUF_INIT;
        for (int i = 0; i < np; i++) {
            int len = 1 + (int)mt_rng_below(&rng, 30);
            for (int k = 0; k < len; k++) {
                static const char al[] = "abc {}\":,\n[]xyz";
                payload[i][k] = al[mt_rng_below(&rng, sizeof al - 1)];
            }
            /* A payload is framed line by line; a trailing newline would be
             * an empty last line, which the framing keeps. */
            payload[i][len] = 0;
            cr_assert_eq(serve_sse_frame(&b, payload[i], (size_t)len), MT_OK);
        }
        got g = {0};
        feed_split(b.data, b.len, &g, &rng);
        cr_assert_eq(g.n, np, "seed %llu: %d events, want %d", (unsigned long long)seed, g.n, np);
        for (int i = 0; i < np; i++)
            cr_assert_str_eq(g.ev[i], payload[i], "seed %llu", (unsigned long long)seed);
        got_free(&g);
        serve_buf_release(&b);
    }
}

Test(serve_sse, frame_is_data_lines_and_a_blank_line)
{
    serve_buf b = SERVE_BUF_INIT;
    cr_assert_eq(serve_sse_frame(&b, "{\"a\":1}", 7), MT_OK);
    cr_assert_str_eq(b.data, "data: {\"a\":1}\n\n");
    serve_buf_reset(&b);
    cr_assert_eq(serve_sse_frame(&b, "x\ny", 3), MT_OK);
    cr_assert_str_eq(b.data, "data: x\ndata: y\n\n");
    serve_buf_release(&b);
}

Test(serve_sse, line_ends_comments_and_fields)
{
    const char *s = ": comment\r\n"
                    "event: message\r\n"
                    "data:one\r\n\r\n"
                    "id: 7\rdata: two\rdata:  three\r\r"
                    "retry: 10\n\n"       /* an event without data: nothing */
                    "data\n\n"            /* a field with no colon: empty data */
                    "data: [DONE]\n\n";
    mt_rng rng;
    mt_rng_seed(&rng, 5);
    got g = {0};
    feed_split(s, strlen(s), &g, &rng);
    cr_assert_eq(g.n, 4);
    cr_assert_str_eq(g.ev[0], "one");
    cr_assert_str_eq(g.ev[1], "two\n three");
    cr_assert_str_eq(g.ev[2], "");
    cr_assert_str_eq(g.ev[3], "[DONE]");
    got_free(&g);
}

Test(serve_sse, callback_can_stop)
{
    const char *s = "data: a\n\ndata: b\n\ndata: c\n\n";
    serve_sse_parser p = SERVE_SSE_PARSER_INIT;
    got g = {.stop_after = 2};
    bool stopped = false;
    cr_assert_eq(serve_sse_feed(&p, s, strlen(s), collect, &g, &stopped, NULL), MT_OK);
    cr_assert(stopped);
    cr_assert_eq(g.n, 2);
    got_free(&g);
    serve_sse_release(&p);
}
