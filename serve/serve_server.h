/* serve_server.h: the OpenAI-compatible HTTP server (civetweb) in front of
 * the engine.
 *
 * Routes: POST /v1/completions, POST /v1/chat/completions (streaming by
 * server-sent events or not), GET /v1/models, GET /v1/models/{id} (404 for
 * another id), GET /health (503 until the model is loaded), GET /metrics
 * (Prometheus text), POST /tokenize, POST /detokenize. Anything else is a
 * 404, a known path with another method a 405 (with Allow); HEAD is
 * answered as GET without the body; bodies past max_body bytes are 413;
 * every error body has OpenAI's shape (serve_error.h). A client that goes
 * away is noticed within one engine step (streaming: at the next write, a
 * token or a keep-alive comment every second while none come; plain: its
 * socket is polled whenever tokens arrive and every 50 ms) and its request
 * is cancelled, freeing its KV pages.
 *
 * serve_server_start binds and starts answering at once; the model loads on
 * the engine thread meanwhile. Ownership: start/stop; stop(NULL) is a
 * no-op. serve_server_* calls are not meant to race each other. */
#ifndef MT_SERVE_SERVER_H
#define MT_SERVE_SERVER_H

#include <stddef.h>

#include "serve_engine.h"
#include "serve_metrics.h"

typedef struct serve_server serve_server;

typedef struct serve_server_opts {
    serve_engine_opts engine; /* engine.metrics is ignored: the server owns its metrics */
    const char *host;         /* default "127.0.0.1" */
    int port;                 /* 0 = an ephemeral port (see serve_server_port) */
    int threads;              /* HTTP worker threads; 0 = 4 * max_batch + 16 */
    size_t max_body;          /* request body limit in bytes; 0 = 8 MiB */
    const char *model_name;   /* id in /v1/models; default: the model folder's name */
    double keepalive_s;       /* SSE keep-alive comment period; 0 = 1 s */
} serve_server_opts;

mt_status serve_server_start(const serve_server_opts *o, serve_server **out, mt_err *err);
/* Stops answering, ends running requests (503), closes the runtime. */
void serve_server_stop(serve_server *s);

int serve_server_port(const serve_server *s);
serve_engine *serve_server_engine(serve_server *s);
serve_metrics *serve_server_metrics(serve_server *s);

#endif
