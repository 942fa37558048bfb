/* serve_server_impl.h: internals shared by serve_server.c (civetweb, routes,
 * the small endpoints) and serve_api.c (completions, chat, tokenize).
 * Not part of the public interface. */
#ifndef MT_SERVE_SERVER_IMPL_H
#define MT_SERVE_SERVER_IMPL_H

#include <civetweb.h>
#include <stdatomic.h>
#include <time.h>

#include "serve_error.h"
#include "serve_request.h"
#include "serve_server.h"

struct serve_server {
    struct mg_context *ctx;
    serve_engine *engine;
    serve_metrics *metrics;
    char model_name[256];
    size_t max_body;
    double keepalive_s;
    int port;
    time_t created;
    atomic_ullong next_id;
};

/* Replies with a JSON body; returns the status (civetweb's access log). */
int serve_http_json(struct mg_connection *c, int status, const char *body, size_t n);
/* Replies with e's JSON error body. */
int serve_http_error(struct mg_connection *c, const serve_error *e);
/* Reads the request body (at most max bytes, else 413 in e). The body is
 * malloc'd and NUL-terminated. */
mt_status serve_http_body(struct mg_connection *c, size_t max, char **body, size_t *n,
                          serve_error *e);

/* Endpoint handlers; each returns the HTTP status it answered with. */
int serve_api_generate(serve_server *s, struct mg_connection *c, serve_api api);
int serve_api_tokenize(serve_server *s, struct mg_connection *c, serve_api api);

#endif
