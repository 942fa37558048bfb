/* serve_http.h: the HTTP reply and request-body helpers of the server
 * (civetweb), shared by the router and small endpoints (serve_server.c) and
 * the OpenAI endpoints (serve_api.c). Each reply call writes a whole
 * response with Content-Length and returns its status (civetweb's access
 * log wants it). Called on civetweb's worker threads; no state of its own. */
#ifndef MT_SERVE_HTTP_H
#define MT_SERVE_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "serve_error.h"

struct mg_connection;

/* Replies with body (n bytes) as content_type; returns status. A HEAD
 * request gets the headers only (Content-Length still the body's). */
int serve_http_send(struct mg_connection *c, int status, const char *content_type,
                    const char *body, size_t n);
/* Replies with a JSON body; returns status. */
int serve_http_json(struct mg_connection *c, int status, const char *body, size_t n);
/* Replies with e's JSON error body (500 when e has no HTTP status). A 413
 * closes the connection after the reply and first reads and discards the
 * rest of the request body (at most 256 MiB or 30 s; not when the client
 * waits for "100 Continue"), so that a client still sending its body reads
 * the 413 instead of a connection reset. */
int serve_http_error(struct mg_connection *c, const serve_error *e);
/* Reads the request body (at most max bytes, else 413 in e, and the
 * connection is not kept alive). The body is malloc'd and NUL-terminated;
 * the caller frees it. *body NULL on failure. */
mt_status serve_http_body(struct mg_connection *c, size_t max, char **body, size_t *n,
                          serve_error *e);

/* The connection's socket descriptor, found among the process's
 * descriptors by the request's remote address and port and the server's
 * local_port; -1 when not found. Valid until the handler returns (civetweb
 * closes it then); the caller must not close it. O(descriptors). */
int serve_http_client_fd(struct mg_connection *c, int local_port);

/* Whether the client has closed its side of the connection (or it broke),
 * without blocking and without consuming anything. A client that only
 * shut down its sending side reads as gone too. false for fd < 0. */
bool serve_http_client_gone(int fd);

#endif
