/* serve_http.c: HTTP replies and request bodies over civetweb (see
 * serve_http.h). */
#include "serve_http.h"

#include <civetweb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int serve_http_send(struct mg_connection *c, int status, const char *content_type,
                    const char *body, size_t n)
{
    char len[32];
    snprintf(len, sizeof len, "%zu", n);
    mg_response_header_start(c, status);
    mg_response_header_add(c, "Content-Type", content_type, -1);
    mg_response_header_add(c, "Content-Length", len, -1);
    mg_response_header_send(c);
    mg_write(c, body, n);
    return status;
}

int serve_http_json(struct mg_connection *c, int status, const char *body, size_t n)
{
    return serve_http_send(c, status, "application/json", body, n);
}

int serve_http_error(struct mg_connection *c, const serve_error *e)
{
    char *j = serve_error_json(e);
    static const char fallback[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                   "\"server_error\",\"param\":null,\"code\":null}}";
    int st = serve_http_json(c, e->http ? e->http : 500, j ? j : fallback,
                             j ? strlen(j) : sizeof fallback - 1);
    free(j);
    return st;
}

mt_status serve_http_body(struct mg_connection *c, size_t max, char **body, size_t *n,
                          serve_error *e)
{
    *body = NULL;
    *n = 0;
    const struct mg_request_info *ri = mg_get_request_info(c);
    if (ri->content_length > (long long)max) {
        mg_disable_connection_keep_alive(c); /* the unread body must not be parsed as a request */
        return serve_reject(e, 413, NULL, "request_too_large",
                            "the request body is %lld bytes; this server takes at most %zu",
                            ri->content_length, max);
    }
    size_t cap = ri->content_length >= 0 ? (size_t)ri->content_length + 1 : 4096;
    char *b = malloc(cap);
    if (!b)
        return serve_reject(e, 500, NULL, NULL, "out of memory for a %zu-byte body", cap);
    size_t len = 0;
    for (;;) {
        if (len + 1 >= cap) {
            if (cap > max + 1) {
                free(b);
                mg_disable_connection_keep_alive(c);
                return serve_reject(e, 413, NULL, "request_too_large",
                                    "the request body is longer than %zu bytes", max);
            }
            size_t nc = cap * 2 > max + 2 ? max + 2 : cap * 2;
            char *nb = realloc(b, nc);
            if (!nb) {
                free(b);
                return serve_reject(e, 500, NULL, NULL, "out of memory reading the body");
            }
            b = nb;
            cap = nc;
        }
        int r = mg_read(c, b + len, cap - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    if (len > max) {
        free(b);
        mg_disable_connection_keep_alive(c);
        return serve_reject(e, 413, NULL, "request_too_large",
                            "the request body is longer than %zu bytes", max);
    }
    b[len] = 0;
    *body = b;
    *n = len;
    return MT_OK;
}
