/* serve_server.c: civetweb setup, the route table and the small endpoints
 * (/health, /v1/models, /metrics) (see serve_server.h). The OpenAI
 * endpoints are in serve_api.c, the HTTP helpers in serve_http.c. */
#include "serve_server.h"

#include <civetweb.h>
#include <stdatomic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_api.h"
#include "serve_buf.h"
#include "serve_http.h"

struct serve_server {
    struct mg_context *ctx;
    serve_api_ctx api; /* engine, metrics, model name, limits */
    int port;
    time_t created;
    atomic_int busy;   /* handlers running (a stop lets them write their last events) */
};

/* ---- replies ------------------------------------------------------------------ */

static int reply_error(struct mg_connection *c, int http, const char *fmt, const char *arg)
{
    serve_error e = SERVE_ERROR_INIT;
    serve_reject(&e, http, NULL, NULL, fmt, arg);
    return serve_http_error(c, &e);
}

/* ---- small endpoints ------------------------------------------------------------ */

static int not_ready(serve_server *s, struct mg_connection *c)
{
    mt_err le = MT_ERR_INIT;
    serve_engine_state st = serve_engine_state_get(s->api.engine, &le);
    serve_error e = SERVE_ERROR_INIT;
    if (st == SERVE_ENGINE_LOADING)
        serve_reject(&e, 503, NULL, "loading", "the model is loading");
    else if (st == SERVE_ENGINE_FAILED)
        serve_reject(&e, 503, NULL, "load_failed", "the model failed to load: %s", le.msg);
    else
        serve_reject(&e, 503, NULL, NULL, "the server is stopping");
    return serve_http_error(c, &e);
}

static int h_health(serve_server *s, struct mg_connection *c)
{
    if (serve_engine_state_get(s->api.engine, NULL) != SERVE_ENGINE_READY)
        return not_ready(s, c);
    static const char ok[] = "{\"status\":\"ok\"}";
    return serve_http_json(c, 200, ok, sizeof ok - 1);
}

/* The one model, as /v1/models lists it and /v1/models/{id} returns it. */
static cJSON *model_object(serve_server *s)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->api.model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "moetune");
    if (serve_engine_state_get(s->api.engine, NULL) == SERVE_ENGINE_READY)
        cJSON_AddNumberToObject(m, "max_model_len",
                                (double)serve_engine_info(s->api.engine)->max_context);
    return m;
}

static int reply_object(struct mg_connection *c, cJSON *root)
{
    char *j = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!j)
        return reply_error(c, 500, "out of memory%s", "");
    int st = serve_http_json(c, 200, j, strlen(j));
    free(j);
    return st;
}

static int h_models(serve_server *s, struct mg_connection *c)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), model_object(s));
    return reply_object(c, root);
}

/* GET /v1/models/{id}: the id is the rest of the path (it may hold '/'). */
static int h_model(serve_server *s, struct mg_connection *c, const char *id)
{
    if (!strcmp(id, s->api.model_name))
        return reply_object(c, model_object(s));
    serve_error e = SERVE_ERROR_INIT;
    serve_reject(&e, 404, "model", "model_not_found",
                 "The model '%.200s' does not exist (this server serves '%.200s')", id,
                 s->api.model_name);
    e.type = "invalid_request_error"; /* OpenAI's type for an unknown model */
    return serve_http_error(c, &e);
}

static int h_metrics(serve_server *s, struct mg_connection *c)
{
    serve_buf b = SERVE_BUF_INIT;
    if (serve_metrics_render(s->api.metrics, &b)) {
        serve_buf_release(&b);
        return reply_error(c, 500, "out of memory%s", "");
    }
    int st = serve_http_send(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.data,
                             b.len);
    serve_buf_release(&b);
    return st;
}

static int h_completions(serve_server *s, struct mg_connection *c)
{
    return serve_api_generate(&s->api, c, SERVE_API_COMPLETIONS);
}
static int h_chat(serve_server *s, struct mg_connection *c)
{
    return serve_api_generate(&s->api, c, SERVE_API_CHAT);
}
static int h_tokenize(serve_server *s, struct mg_connection *c)
{
    return serve_api_tokenize(&s->api, c, SERVE_API_TOKENIZE);
}
static int h_detokenize(serve_server *s, struct mg_connection *c)
{
    return serve_api_tokenize(&s->api, c, SERVE_API_DETOKENIZE);
}

typedef int (*route_fn)(serve_server *s, struct mg_connection *c);

static const struct route {
    const char *path, *method;
    route_fn fn;
} routes[] = {
    {"/v1/completions", "POST", h_completions},
    {"/v1/chat/completions", "POST", h_chat},
    {"/v1/models", "GET", h_models},
    {"/health", "GET", h_health},
    {"/metrics", "GET", h_metrics},
    {"/tokenize", "POST", h_tokenize},
    {"/detokenize", "POST", h_detokenize},
    {NULL, NULL, NULL},
};

#define MODELS_PREFIX "/v1/models/"

static int route(struct mg_connection *c);

/* civetweb's handler: the route, counted in s->busy while it runs. */
static int begin_request(struct mg_connection *c)
{
    serve_server *s = mg_get_request_info(c)->user_data;
    atomic_fetch_add(&s->busy, 1);
    int r = route(c);
    atomic_fetch_sub(&s->busy, 1);
    return r;
}

static int route(struct mg_connection *c)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    serve_server *s = ri->user_data;
    const char *path = ri->local_uri ? ri->local_uri : "";
    /* HEAD is GET without the body (serve_http_send leaves it out). */
    const char *method = !strcmp(ri->request_method, "HEAD") ? "GET" : ri->request_method;
    const char *allow = NULL;
    for (int i = 0; routes[i].path; i++) {
        if (strcmp(path, routes[i].path))
            continue;
        if (!strcmp(method, routes[i].method))
            return routes[i].fn(s, c);
        allow = routes[i].method;
    }
    if (!strncmp(path, MODELS_PREFIX, strlen(MODELS_PREFIX)) && path[strlen(MODELS_PREFIX)]) {
        if (!strcmp(method, "GET"))
            return h_model(s, c, path + strlen(MODELS_PREFIX));
        allow = "GET";
    }
    if (!allow)
        return reply_error(c, 404, "no route for '%.200s'", path);
    serve_error e = SERVE_ERROR_INIT;
    serve_reject(&e, 405, NULL, "method_not_allowed", "%s is not allowed on %.200s; use %s",
                 ri->request_method, path, allow);
    char *j = serve_error_json(&e);
    char len[32];
    snprintf(len, sizeof len, "%zu", j ? strlen(j) : 0);
    mg_disable_connection_keep_alive(c); /* any body was not read */
    mg_response_header_start(c, 405);
    mg_response_header_add(c, "Content-Type", "application/json", -1);
    mg_response_header_add(c, "Allow", allow, -1);
    mg_response_header_add(c, "Content-Length", len, -1);
    mg_response_header_send(c);
    if (j && strcmp(ri->request_method, "HEAD"))
        mg_write(c, j, strlen(j));
    free(j);
    return 405;
}

/* Errors civetweb itself raises (a malformed request line, headers too
 * large, ...) in OpenAI's shape too. */
static int http_error(struct mg_connection *c, int status, const char *msg)
{
    serve_error e = SERVE_ERROR_INIT;
    serve_reject(&e, status, NULL, NULL, "%s", msg && *msg ? msg : "bad request");
    char *j = serve_error_json(&e);
    if (!j)
        return 1;
    mg_printf(c,
              "HTTP/1.1 %d Error\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
              "Connection: close\r\n\r\n%s",
              status, strlen(j), j);
    free(j);
    return 0;
}

static int log_message(const struct mg_connection *c, const char *msg)
{
    (void)c;
    (void)msg;
    return 1; /* quiet: errors reach clients as JSON */
}

/* ---- lifecycle -------------------------------------------------------------------- */

static void model_name_from_dir(const char *dir, char *out, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    snprintf(out, cap, "%.*s", (int)(n - b), dir + b);
}

mt_status serve_server_start(const serve_server_opts *o, serve_server **out, mt_err *err)
{
    *out = NULL;
    serve_server *s = calloc(1, sizeof *s);
    if (!s)
        return mt_fail(err, MT_E_NOMEM, "serve: out of memory");
    s->api.max_body = o->max_body ? o->max_body : (8u << 20);
    s->api.keepalive_s = o->keepalive_s > 0 ? o->keepalive_s : 1.0;
    s->created = time(NULL);
    atomic_init(&s->api.next_id, 1);
    atomic_init(&s->api.port, o->port);
    if (o->model_name)
        snprintf(s->api.model_name, sizeof s->api.model_name, "%s", o->model_name);
    else if (o->engine.rt.model_dir)
        model_name_from_dir(o->engine.rt.model_dir, s->api.model_name,
                            sizeof s->api.model_name);
    mt_status st = serve_metrics_create(&s->api.metrics, err);
    if (st) {
        free(s);
        return st;
    }
    if ((st = serve_constraints_create(&s->api.constraints, err))) {
        serve_server_stop(s);
        return st;
    }
    serve_engine_opts eo = o->engine;
    eo.metrics = s->api.metrics;
    if ((st = serve_engine_start(&eo, &s->api.engine, err))) {
        serve_server_stop(s);
        return st;
    }
    int mb = o->engine.max_batch > 0 ? o->engine.max_batch : 64;
    int threads = o->threads > 0 ? o->threads : 4 * mb + 16;
    char ports[96], nthreads[16];
    snprintf(ports, sizeof ports, "%s:%d", o->host ? o->host : "127.0.0.1", o->port);
    snprintf(nthreads, sizeof nthreads, "%d", threads);
    const char *options[] = {"listening_ports", ports, "num_threads", nthreads,
                             "request_timeout_ms", "120000", "enable_keep_alive", "no",
                             NULL};
    struct mg_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.begin_request = begin_request;
    cb.http_error = http_error;
    cb.log_message = log_message;
    mg_init_library(0);
    s->ctx = mg_start(&cb, s, options);
    if (!s->ctx) {
        serve_server_stop(s);
        return mt_fail(err, MT_E_IO, "serve: cannot listen on %s (in use, or a bad address)",
                       ports);
    }
    struct mg_server_port sp[4];
    int np = mg_get_server_ports(s->ctx, 4, sp);
    s->port = np > 0 ? sp[0].port : o->port;
    atomic_store(&s->api.port, s->port);
    *out = s;
    return MT_OK;
}

void serve_server_stop(serve_server *s)
{
    if (!s)
        return;
    /* Finish the requests first so that handlers waiting on them return,
     * give those handlers up to 500 ms to write their last events (a
     * stopping civetweb drops writes), then stop civetweb (which waits for
     * its handlers), then free. */
    serve_engine_stop(s->api.engine);
    for (int i = 0; i < 500 && s->ctx && atomic_load(&s->busy) > 0; i++) {
        struct timespec ms = {0, 1000000L};
        nanosleep(&ms, NULL);
    }
    if (s->ctx) {
        mg_stop(s->ctx);
        mg_exit_library();
    }
    serve_engine_destroy(s->api.engine);
    serve_metrics_destroy(s->api.metrics);
    serve_constraints_destroy(s->api.constraints);
    free(s);
}

int serve_server_port(const serve_server *s) { return s->port; }
serve_engine *serve_server_engine(serve_server *s) { return s->api.engine; }
serve_metrics *serve_server_metrics(serve_server *s) { return s->api.metrics; }
