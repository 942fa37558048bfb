/* serve_sse.c: server-sent event framing and parsing (see serve_sse.h). */
#include "serve_sse.h"

#include <string.h>

mt_status serve_sse_frame(serve_buf *out, const char *data, size_t n)
{
    size_t start = 0;
    for (;;) {
        size_t end = start;
        while (end < n && data[end] != '\n' && data[end] != '\r')
            end++;
        if (serve_buf_append(out, "data: ", 6) || serve_buf_append(out, data + start, end - start) ||
            serve_buf_append(out, "\n", 1))
            return MT_E_NOMEM;
        if (end >= n)
            break;
        start = end + 1;
        if (data[end] == '\r' && start < n && data[start] == '\n')
            start++;
    }
    return serve_buf_append(out, "\n", 1);
}

/* One complete line (without its terminator). Returns false when fn stopped. */
static mt_status line_done(serve_sse_parser *p, serve_sse_fn fn, void *ctx, bool *stop)
{
    const char *l = p->line.data ? p->line.data : "";
    size_t n = p->line.len;
    mt_status st = MT_OK;
    if (n == 0) {
        if (p->has_data) {
            const char *d = p->data.data ? p->data.data : "";
            if (!fn(ctx, d, p->data.len))
                *stop = true;
        }
        serve_buf_reset(&p->data);
        p->has_data = false;
    } else if (l[0] != ':') {
        const char *colon = memchr(l, ':', n);
        size_t name_len = colon ? (size_t)(colon - l) : n;
        if (name_len == 4 && !memcmp(l, "data", 4)) {
            const char *v = colon ? colon + 1 : l + n;
            if (v < l + n && *v == ' ')
                v++;
            if (p->has_data)
                st = serve_buf_append(&p->data, "\n", 1);
            if (!st)
                st = serve_buf_append(&p->data, v, (size_t)(l + n - v));
            p->has_data = true;
        }
    }
    serve_buf_reset(&p->line);
    return st;
}

mt_status serve_sse_feed(serve_sse_parser *p, const char *bytes, size_t n, serve_sse_fn fn,
                         void *ctx, bool *stopped, mt_err *err)
{
    bool stop = false;
    size_t i = 0;
    while (i < n && !stop) {
        char c = bytes[i];
        if (p->skip_lf) {
            p->skip_lf = false;
            if (c == '\n') {
                i++;
                continue;
            }
        }
        if (c == '\n' || c == '\r') {
            p->skip_lf = c == '\r';
            if (line_done(p, fn, ctx, &stop) != MT_OK)
                return mt_fail(err, MT_E_NOMEM, "sse: out of memory");
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && bytes[j] != '\n' && bytes[j] != '\r')
            j++;
        if (p->line.len + (j - i) > SERVE_SSE_MAX_LINE)
            return mt_fail(err, MT_E_FORMAT, "sse: a line is longer than %u bytes",
                           SERVE_SSE_MAX_LINE);
        if (serve_buf_append(&p->line, bytes + i, j - i) != MT_OK)
            return mt_fail(err, MT_E_NOMEM, "sse: out of memory");
        i = j;
    }
    if (stopped)
        *stopped = stop;
    return MT_OK;
}

void serve_sse_release(serve_sse_parser *p)
{
    serve_buf_release(&p->line);
    serve_buf_release(&p->data);
    p->has_data = p->skip_lf = false;
}
