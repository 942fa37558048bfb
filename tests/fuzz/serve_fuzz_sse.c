/* serve_fuzz_sse.c: libFuzzer target for the SSE parser (what bench-serve
 * reads from a server): arbitrary bytes fed in pieces whose sizes come from
 * the input must never crash, and payloads framed by serve_sse_frame must
 * parse back to themselves (CR-free payloads). Built and run by
 * serve_fuzz.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_sse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct sink {
    serve_buf all;
    int events;
} sink;

static bool on_event(void *ctx, const char *d, size_t n)
{
    sink *s = ctx;
    if (strlen(d) != n)
        return true; /* payload with a NUL byte: fine, just not comparable */
    s->events++;
    serve_buf_append(&s->all, d, n);
    serve_buf_append(&s->all, "\x01", 1);
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    /* Raw bytes, in pieces of 1 + data[0] % 16. */
    size_t piece = 1 + data[0] % 16;
    serve_sse_parser p = SERVE_SSE_PARSER_INIT;
    sink s = {SERVE_BUF_INIT, 0};
    for (size_t at = 1; at < size; at += piece) {
        size_t k = size - at < piece ? size - at : piece;
        if (serve_sse_feed(&p, (const char *)data + at, k, on_event, &s, NULL, NULL) != MT_OK)
            break;
    }
    serve_sse_release(&p);
    serve_buf_release(&s.all);

    /* The input as a payload (CR and NUL removed): framed, then parsed. */
    serve_buf payload = SERVE_BUF_INIT, framed = SERVE_BUF_INIT;
    for (size_t i = 1; i < size; i++)
        if (data[i] != '\r' && data[i] != 0)
            serve_buf_append(&payload, data + i, 1);
    serve_sse_frame(&framed, payload.data ? payload.data : "", payload.len);
    sink t = {SERVE_BUF_INIT, 0};
    serve_sse_parser q = SERVE_SSE_PARSER_INIT;
    if (serve_sse_feed(&q, framed.data, framed.len, on_event, &t, NULL, NULL) != MT_OK)
        abort();
    if (t.events != 1 || t.all.len != payload.len + 1 ||
        (payload.len && memcmp(t.all.data, payload.data, payload.len)))
        abort();
    serve_sse_release(&q);
    serve_buf_release(&t.all);
    serve_buf_release(&payload);
    serve_buf_release(&framed);
    return 0;
}
