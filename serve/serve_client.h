/* serve_client.h: a small blocking HTTP/1.1 client over TCP sockets for the
 * load generator and the tests, loopback only (the URL's host must be
 * "localhost" or an IPv4 address in 127.0.0.0/8).
 *
 * One request per connection ("Connection: close"); the response body is
 * read by Content-Length, chunked transfer coding or until the server
 * closes, and either collected or handed to a callback as it arrives
 * (already de-chunked), which may abort (the socket is then closed at once,
 * as a client that disconnects mid-stream would). Every wait is bounded by a
 * timeout. A send that fails after the server has answered early (say 413
 * before the body was read) still reads the answer.
 *
 * Ownership: serve_client_resp is caller storage; release frees its buffers.
 * Thread-safe: requests share nothing. */
#ifndef MT_SERVE_CLIENT_H
#define MT_SERVE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve_buf.h"

typedef struct serve_url {
    char host[64];
    uint32_t addr; /* IPv4, host byte order */
    int port;
    char base[256]; /* path prefix without the trailing '/', often "" */
} serve_url;

/* Parses "http://HOST[:PORT][/PREFIX]" (PORT defaults to 80). */
mt_status serve_url_parse(const char *url, serve_url *out, mt_err *err);

/* Body bytes as they arrive; return false to abort the request. */
typedef bool (*serve_client_fn)(void *ctx, const char *p, size_t n);

typedef struct serve_client_resp {
    int status;       /* HTTP status */
    serve_buf headers; /* raw header block (lines after the status line) */
    serve_buf body;    /* the body, when no callback was given */
    bool aborted;      /* the callback stopped the transfer */
} serve_client_resp;

#define SERVE_CLIENT_RESP_INIT {0, SERVE_BUF_INIT, SERVE_BUF_INIT, false}

/* Sends method path (appended to the URL's prefix) with an optional body
 * (content type application/json) and reads the answer. fn may be NULL.
 * MT_E_IO on connect/send/receive failure, MT_E_TIMEOUT past timeout_s
 * (counted for the whole request), MT_E_FORMAT on a malformed response. */
mt_status serve_client_request(const serve_url *u, const char *method, const char *path,
                               const char *body, size_t body_len, double timeout_s,
                               serve_client_fn fn, void *ctx, serve_client_resp *resp,
                               mt_err *err);

/* Sends raw bytes (a whole request as written) and reads the answer. */
mt_status serve_client_raw(const serve_url *u, const char *bytes, size_t n, double timeout_s,
                           serve_client_resp *resp, mt_err *err);

/* A header's value from resp->headers (case-insensitive name), copied into
 * out (cap bytes, NUL-terminated); false when absent. */
bool serve_client_header(const serve_client_resp *resp, const char *name, char *out, size_t cap);

void serve_client_resp_release(serve_client_resp *r);

#endif
