/* serve_sse.h: server-sent events, both ways: framing a payload as an event
 * ("data: <line>\n" per line of the payload, then a blank line) for the
 * streaming endpoints, and an incremental parser that turns a byte stream
 * back into event payloads for the load generator and the tests.
 *
 * The parser follows the WHATWG event-stream rules that matter here: lines
 * end in CRLF, LF or CR (also split across feeds); "data:" fields (one
 * leading space dropped) of one event join with "\n"; a blank line
 * dispatches the event when it has data; comment lines (":") and the other
 * fields (event, id, retry) are ignored. A line longer than
 * SERVE_SSE_MAX_LINE is MT_E_FORMAT.
 *
 * Ownership: the parser is caller storage (SERVE_SSE_PARSER_INIT); release
 * frees its buffers. Not thread-safe per parser. */
#ifndef MT_SERVE_SSE_H
#define MT_SERVE_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include "serve_buf.h"

#define SERVE_SSE_MAX_LINE (16u << 20)

/* Appends the event framing of n bytes of data to out. */
mt_status serve_sse_frame(serve_buf *out, const char *data, size_t n);

/* Called once per event with its data (NUL-terminated, n bytes, valid for the
 * call only). Returning false stops the feed. */
typedef bool (*serve_sse_fn)(void *ctx, const char *data, size_t n);

typedef struct serve_sse_parser {
    serve_buf line;  /* the line being read */
    serve_buf data;  /* data of the event being read */
    bool has_data;
    bool skip_lf;    /* the last byte was CR: a following LF ends nothing */
} serve_sse_parser;

#define SERVE_SSE_PARSER_INIT {SERVE_BUF_INIT, SERVE_BUF_INIT, false, false}

/* Feeds n bytes, calling fn for each complete event. *stopped (may be NULL)
 * is set when fn returned false (the rest of the bytes are dropped). */
mt_status serve_sse_feed(serve_sse_parser *p, const char *bytes, size_t n, serve_sse_fn fn,
                         void *ctx, bool *stopped, mt_err *err);
void serve_sse_release(serve_sse_parser *p);

#endif
