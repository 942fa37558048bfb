/* serve_buf.h: a growable byte buffer for building HTTP bodies, SSE frames
 * and metrics text.
 *
 * Invariant: data is NULL or holds len bytes followed by a NUL (so text can
 * be used as a C string). SERVE_BUF_INIT is an empty buffer; serve_buf_release
 * frees it and leaves it empty; serve_buf_detach hands the bytes to the caller.
 * On allocation failure an append returns MT_E_NOMEM and leaves the buffer
 * as it was. Not thread-safe per buffer. */
#ifndef MT_SERVE_BUF_H
#define MT_SERVE_BUF_H

#include <stdarg.h>
#include <stddef.h>

#include "common/status.h"

typedef struct serve_buf {
    char *data;
    size_t len, cap;
} serve_buf;

#define SERVE_BUF_INIT {NULL, 0, 0}

mt_status serve_buf_append(serve_buf *b, const void *p, size_t n);
mt_status serve_buf_puts(serve_buf *b, const char *s);
mt_status serve_buf_printf(serve_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
mt_status serve_buf_vprintf(serve_buf *b, const char *fmt, va_list ap);
/* Drops the first n bytes (n <= len); O(len). */
void serve_buf_consume(serve_buf *b, size_t n);
void serve_buf_reset(serve_buf *b); /* len = 0, keeps the memory */
void serve_buf_release(serve_buf *b);
/* Returns the bytes (NUL-terminated, caller frees; never NULL unless out of
 * memory) and leaves the buffer empty. */
char *serve_buf_detach(serve_buf *b, size_t *len);

#endif
