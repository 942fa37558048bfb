/* serve_textout.c: incremental detokenization with UTF-8 hold-back and stop
 * strings (see serve_textout.h). */
#define _GNU_SOURCE /* memmem */
#include "serve_textout.h"

#include <stdlib.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s[0..n): > 0 when complete and
 * valid; -k when the first k bytes are a valid but incomplete start (only
 * possible when n is short); 0 when s[0] starts an invalid sequence whose
 * maximal valid subpart is *bad bytes long. */
static int utf8_seq(const unsigned char *s, size_t n, int *bad)
{
    unsigned char b = s[0];
    int len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        len = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        if (b == 0xE0)
            lo = 0xA0;
        if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        if (b == 0xF0)
            lo = 0x90;
        if (b == 0xF4)
            hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    for (int k = 1; k < len; k++) {
        if ((size_t)k >= n)
            return -k;
        unsigned char c = s[k];
        unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (c < l || c > h) {
            *bad = k;
            return 0;
        }
    }
    return len;
}

mt_status serve_utf8_lossy(serve_buf *out, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* valid bytes from run to i not yet copied */
    while (i < n) {
        int bad = 0, len = utf8_seq(u + i, n - i, &bad);
        if (len > 0) {
            i += (size_t)len;
            continue;
        }
        if (serve_buf_append(out, s + run, i - run) || serve_buf_append(out, "\xEF\xBF\xBD", 3))
            return MT_E_NOMEM;
        i += len < 0 ? (size_t)-len : (size_t)bad;
        run = i;
    }
    return serve_buf_append(out, s + run, n - run);
}

/* Bytes at the end of s[0..n) that are an incomplete (so far valid) UTF-8
 * character. */
static size_t utf8_tail(const char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char b = (unsigned char)s[n - k];
        if ((b & 0xC0) != 0x80) { /* a lead (or ASCII) byte */
            int bad = 0;
            return utf8_seq((const unsigned char *)s + n - k, k, &bad) < 0 ? k : 0;
        }
    }
    return 0;
}

void serve_textout_init(serve_textout *t, const model_tokenizer *tok, char *const *stop,
                        int n_stop)
{
    memset(t, 0, sizeof *t);
    t->tok = tok;
    t->stop = stop;
    t->n_stop = n_stop;
}

/* Longest suffix of s[0..n) that is a proper prefix of a stop string. */
static size_t stop_tail(const serve_textout *t, const char *s, size_t n)
{
    size_t best = 0;
    for (int i = 0; i < t->n_stop; i++) {
        size_t sl = strlen(t->stop[i]);
        for (size_t k = sl - 1 < n ? sl - 1 : n; k > best; k--)
            if (!memcmp(s + n - k, t->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

mt_status serve_textout_push(serve_textout *t, int32_t id, serve_buf *out)
{
    if (t->stopped || !t->tok || model_tokenizer_is_special(t->tok, id))
        return MT_OK;
    char small[64];
    int64_t n = model_tokenizer_token_bytes(t->tok, id, small, sizeof small);
    if (n < 0)
        return MT_OK; /* an id with no bytes contributes no text */
    if ((size_t)n <= sizeof small) {
        if (serve_buf_append(&t->pending, small, (size_t)n))
            return MT_E_NOMEM;
    } else {
        char *big = malloc((size_t)n);
        if (!big)
            return MT_E_NOMEM;
        model_tokenizer_token_bytes(t->tok, id, big, (size_t)n);
        mt_status st = serve_buf_append(&t->pending, big, (size_t)n);
        free(big);
        if (st)
            return st;
    }
    const char *p = t->pending.data;
    size_t len = t->pending.len;
    /* The earliest stop string in what is pending. */
    size_t cut = len;
    for (int i = 0; i < t->n_stop; i++) {
        const char *hit = memmem(p, len, t->stop[i], strlen(t->stop[i]));
        if (hit && (size_t)(hit - p) < cut)
            cut = (size_t)(hit - p);
    }
    if (cut < len) {
        t->stopped = true;
        mt_status st = serve_utf8_lossy(out, p, cut);
        serve_buf_reset(&t->pending);
        return st;
    }
    size_t hold = stop_tail(t, p, len), tail = utf8_tail(p, len);
    if (tail > hold)
        hold = tail;
    if (serve_utf8_lossy(out, p, len - hold))
        return MT_E_NOMEM;
    serve_buf_consume(&t->pending, len - hold);
    return MT_OK;
}

mt_status serve_textout_finish(serve_textout *t, serve_buf *out)
{
    mt_status st = serve_utf8_lossy(out, t->pending.data ? t->pending.data : "", t->pending.len);
    serve_buf_reset(&t->pending);
    return st;
}

void serve_textout_release(serve_textout *t) { serve_buf_release(&t->pending); }
