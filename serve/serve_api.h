/* serve_api.h: the OpenAI endpoints (serve_api.c): /v1/completions,
 * /v1/chat/completions, /tokenize and /detokenize. The router
 * (serve_server.c) calls them with what they need of the server; they
 * answer on the connection themselves. Internal to serve/. */
#ifndef MT_SERVE_API_H
#define MT_SERVE_API_H

#include <stdatomic.h>
#include <stddef.h>

#include "serve_engine.h"
#include "serve_logits.h"
#include "serve_metrics.h"
#include "serve_request.h"

struct mg_connection;

/* What the endpoints see of the server. Owned by the server; handlers on
 * many threads share one (next_id is the only field they change; port is
 * set once the listening port is known). */
typedef struct serve_api_ctx {
    serve_engine *engine;
    serve_metrics *metrics;
    char model_name[256];  /* "model" in responses */
    size_t max_body;       /* request body limit in bytes */
    double keepalive_s;    /* SSE keep-alive comment period */
    atomic_ullong next_id; /* mixed into response ids (with random bits) */
    atomic_int port;       /* the listening port (finding a client's socket) */
    serve_constraints *constraints; /* structured outputs: vocabulary index, grammars */
} serve_api_ctx;

/* Endpoint handlers; each returns the HTTP status it answered with and
 * counts the request in a->metrics. */
int serve_api_generate(serve_api_ctx *a, struct mg_connection *c, serve_api api);
int serve_api_tokenize(serve_api_ctx *a, struct mg_connection *c, serve_api api);

#endif
