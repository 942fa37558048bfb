/* serve_buf.c: growable byte buffer (see serve_buf.h). */
#include "serve_buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mt_status reserve(serve_buf *b, size_t extra)
{
    if (extra > ((size_t)-1) / 2 - b->len)
        return MT_E_NOMEM;
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return MT_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return MT_E_NOMEM;
    b->data = p;
    b->cap = cap;
    return MT_OK;
}

mt_status serve_buf_append(serve_buf *b, const void *p, size_t n)
{
    if (reserve(b, n) != MT_OK)
        return MT_E_NOMEM;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return MT_OK;
}

mt_status serve_buf_puts(serve_buf *b, const char *s) { return serve_buf_append(b, s, strlen(s)); }

mt_status serve_buf_vprintf(serve_buf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0 || reserve(b, (size_t)n) != MT_OK)
        return MT_E_NOMEM;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return MT_OK;
}

mt_status serve_buf_printf(serve_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mt_status st = serve_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return st;
}

void serve_buf_consume(serve_buf *b, size_t n)
{
    if (n >= b->len) {
        serve_buf_reset(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

void serve_buf_reset(serve_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = 0;
}

void serve_buf_release(serve_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

char *serve_buf_detach(serve_buf *b, size_t *len)
{
    if (!b->data && reserve(b, 0) != MT_OK)
        return NULL;
    b->data[b->len] = 0;
    char *p = b->data;
    if (len)
        *len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}
