/* serve_api.c: the OpenAI endpoints /v1/completions and
 * /v1/chat/completions (plain and streaming), and /tokenize and
 * /detokenize: parse, tokenize, submit to the engine, turn tokens into text
 * (serve_textout) and write the response objects. */
#include "serve_api.h"

#include <civetweb.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_http.h"
#include "serve_sse.h"
#include "serve_textout.h"

/* ---- response objects ---------------------------------------------------------- */

typedef struct reply {
    const serve_api_ctx *a;
    serve_api api;
    char id[48];
    time_t created;
    bool token_ids;
} reply;

static cJSON *base_object(const reply *r, bool chunk)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object",
                            r->api == SERVE_API_CHAT ? (chunk ? "chat.completion.chunk"
                                                              : "chat.completion")
                                                     : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->a->model_name);
    return o;
}

static cJSON *usage_object(int64_t prompt, int64_t completion, int64_t cached)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
    return u;
}

static cJSON *ids_array(const int32_t *ids, int64_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (int64_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* One choice: text (or a chat message / delta), finish reason (NULL: null). */
static cJSON *choice(const reply *r, bool chunk, const char *text, size_t text_len,
                     const char *finish, bool first_delta, const int32_t *ids, int64_t n_ids)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    char *t = malloc(text_len + 1);
    if (t) {
        memcpy(t, text, text_len);
        t[text_len] = 0;
    }
    if (r->api == SERVE_API_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(c, chunk ? "delta" : "message");
        if (!chunk || first_delta)
            cJSON_AddStringToObject(m, "role", "assistant");
        if (!chunk || text_len || first_delta)
            cJSON_AddStringToObject(m, "content", t ? t : "");
    } else {
        cJSON_AddStringToObject(c, "text", t ? t : "");
    }
    free(t);
    cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    if (r->token_ids)
        cJSON_AddItemToObject(c, "token_ids", ids_array(ids, n_ids));
    return c;
}

static const char *finish_name(serve_finish f)
{
    return f == SERVE_FINISH_LENGTH ? "length" : "stop";
}

/* ---- streaming ----------------------------------------------------------------- */

typedef struct stream {
    struct mg_connection *c;
    serve_buf frame;
    bool broken;
} stream;

static bool send_raw(stream *st, const char *p, size_t n)
{
    if (!st->broken && mg_send_chunk(st->c, p, (unsigned)n) <= 0)
        st->broken = true;
    return !st->broken;
}

/* Sends obj as one event and frees it. */
static bool send_event(stream *st, cJSON *obj)
{
    char *j = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    if (!j)
        return false;
    serve_buf_reset(&st->frame);
    bool ok = serve_sse_frame(&st->frame, j, strlen(j)) == MT_OK &&
              send_raw(st, st->frame.data, st->frame.len);
    free(j);
    return ok;
}

static void stream_start(stream *st)
{
    mg_response_header_start(st->c, 200);
    mg_response_header_add(st->c, "Content-Type", "text/event-stream", -1);
    mg_response_header_add(st->c, "Cache-Control", "no-cache", -1);
    mg_response_header_add(st->c, "Transfer-Encoding", "chunked", -1);
    mg_response_header_send(st->c);
}

/* ---- generation ------------------------------------------------------------------ */

typedef struct gen_run {
    reply r;
    serve_gen *g;
    serve_textout to;
    int64_t seen;     /* tokens read from the engine */
    int64_t used;     /* tokens that count (up to a stop string) */
    serve_buf text;   /* all text (plain responses) */
    serve_gen_view v;
    const char *finish;
    bool failed;      /* engine error: v.error */
} gen_run;

/* Reads newly published tokens into delta; sets run->finish when done. */
static mt_status advance(gen_run *run, double wait_s, serve_buf *delta, int64_t *first_new)
{
    serve_gen_wait(run->g, run->seen, wait_s, &run->v);
    *first_new = run->used;
    for (int64_t i = run->seen; i < run->v.n_generated && !run->to.stopped; i++) {
        if (serve_textout_push(&run->to, run->v.tokens[i], delta))
            return MT_E_NOMEM;
        run->used = i + 1;
    }
    run->seen = run->v.n_generated;
    if (run->to.stopped) {
        serve_gen_cancel(run->g, false); /* a stop string: finish, keep the KV */
        run->finish = "stop";
    } else if (run->v.finish == SERVE_FINISH_ERROR) {
        run->failed = true;
        run->finish = "error";
    } else if (run->v.finish != SERVE_FINISH_NONE) {
        if (serve_textout_finish(&run->to, delta))
            return MT_E_NOMEM;
        run->finish = finish_name(run->v.finish);
    }
    return MT_OK;
}

static serve_outcome run_plain(gen_run *run, struct mg_connection *c, int *status)
{
    while (!run->finish)
        if (advance(run, 3600, &run->text, &(int64_t){0})) {
            serve_error e = SERVE_ERROR_INIT;
            serve_reject(&e, 500, NULL, NULL, "out of memory building the response");
            serve_gen_cancel(run->g, true);
            *status = serve_http_error(c, &e);
            return SERVE_OUTCOME_ERROR;
        }
    if (run->failed) {
        *status = serve_http_error(c, &run->v.error);
        return SERVE_OUTCOME_ERROR;
    }
    cJSON *o = base_object(&run->r, false);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToArray(choices, choice(&run->r, false, run->text.data ? run->text.data : "",
                                         run->text.len, run->finish, false, run->v.tokens,
                                         run->used));
    cJSON_AddItemToObject(o, "usage", usage_object(run->v.n_prompt, run->used, run->v.n_cached));
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!j) {
        serve_error e = SERVE_ERROR_INIT;
        serve_reject(&e, 500, NULL, NULL, "out of memory building the response");
        *status = serve_http_error(c, &e);
        return SERVE_OUTCOME_ERROR;
    }
    *status = serve_http_json(c, 200, j, strlen(j));
    free(j);
    return SERVE_OUTCOME_OK;
}

static serve_outcome run_stream(gen_run *run, struct mg_connection *c, bool include_usage,
                                double keepalive_s)
{
    stream st = {c, SERVE_BUF_INIT, false};
    serve_buf delta = SERVE_BUF_INIT;
    stream_start(&st);
    bool first = true;
    serve_outcome oc = SERVE_OUTCOME_OK;
    while (!st.broken) {
        serve_buf_reset(&delta);
        int64_t from;
        if (advance(run, keepalive_s, &delta, &from)) {
            run->failed = true;
            serve_reject(&run->v.error, 500, NULL, NULL, "out of memory streaming");
            run->finish = "error";
        }
        if (run->failed) {
            char *j = serve_error_json(&run->v.error);
            if (j) {
                serve_buf_reset(&st.frame);
                if (!serve_sse_frame(&st.frame, j, strlen(j)))
                    send_raw(&st, st.frame.data, st.frame.len);
                free(j);
            }
            oc = SERVE_OUTCOME_ERROR;
            break;
        }
        bool news = run->used > from || delta.len > 0;
        if (news || (run->r.api == SERVE_API_CHAT && first && run->finish)) {
            cJSON *o = base_object(&run->r, true);
            cJSON *ch = cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToArray(ch, choice(&run->r, true, delta.data ? delta.data : "",
                                            delta.len, run->finish, first, run->v.tokens + from,
                                            run->used - from));
            send_event(&st, o);
            first = false;
        } else if (run->finish) {
            cJSON *o = base_object(&run->r, true);
            cJSON *ch = cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToArray(ch, choice(&run->r, true, "", 0, run->finish, first, NULL, 0));
            send_event(&st, o);
        } else {
            send_raw(&st, ": keep-alive\n\n", 14); /* notices a client that left */
        }
        if (run->finish)
            break;
    }
    if (!st.broken && oc == SERVE_OUTCOME_OK && include_usage) {
        cJSON *o = base_object(&run->r, true);
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage",
                              usage_object(run->v.n_prompt, run->used, run->v.n_cached));
        send_event(&st, o);
    }
    if (!st.broken)
        send_raw(&st, "data: [DONE]\n\n", 14);
    if (!st.broken)
        send_raw(&st, "", 0); /* the last chunk */
    if (st.broken) {
        serve_gen_cancel(run->g, true); /* the client went away: free its KV now */
        oc = SERVE_OUTCOME_CANCELLED;
    }
    serve_buf_release(&st.frame);
    serve_buf_release(&delta);
    return oc;
}

static void count(const serve_api_ctx *a, serve_api api, serve_outcome oc)
{
    serve_metrics_request(a->metrics, api, oc);
}

int serve_api_generate(serve_api_ctx *a, struct mg_connection *c, serve_api api)
{
    serve_error e = SERVE_ERROR_INIT;
    char *body = NULL;
    size_t n = 0;
    serve_request req;
    memset(&req, 0, sizeof req);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int status;
    if (serve_http_body(c, a->max_body, &body, &n, &e))
        goto fail;
    if (serve_engine_state_get(a->engine, NULL) != SERVE_ENGINE_READY) {
        serve_reject(&e, 503, NULL, NULL, "the model is not loaded yet");
        goto fail;
    }
    const serve_model_info *in = serve_engine_info(a->engine);
    serve_limits lim = {in->max_context, in->vocab};
    int64_t max_tokens;
    if (serve_request_parse(api, body, n, &lim, &req, &e) ||
        serve_request_prompt(&req, in->tok, &lim, &ids, &n_ids, &e) ||
        serve_request_max_tokens(&req, n_ids, &lim, &max_tokens, &e))
        goto fail;
    if (req.n_stop && !in->tok) {
        serve_reject(&e, 400, "stop", NULL, "stop strings need a tokenizer; this model has none");
        goto fail;
    }
    serve_gen_params p = {
        .prompt = ids,
        .n_prompt = (int64_t)n_ids,
        .max_tokens = max_tokens,
        .sampler = {req.temperature, req.top_p, req.top_k},
        .has_seed = req.has_seed,
        .seed = req.seed,
        .ignore_eos = req.ignore_eos,
        .chat = api == SERVE_API_CHAT,
    };
    gen_run run;
    memset(&run, 0, sizeof run);
    if (serve_engine_submit(a->engine, &p, &run.g, &e))
        goto fail;
    run.r.a = a;
    run.r.api = api;
    run.r.created = time(NULL);
    run.r.token_ids = req.return_token_ids;
    snprintf(run.r.id, sizeof run.r.id, "%s-%llx", api == SERVE_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)atomic_fetch_add(&a->next_id, 1));
    serve_textout_init(&run.to, in->tok, req.stop, req.n_stop);
    serve_outcome oc;
    if (req.stream) {
        oc = run_stream(&run, c, req.include_usage, a->keepalive_s);
        status = 200;
    } else {
        oc = run_plain(&run, c, &status);
    }
    serve_textout_release(&run.to);
    serve_buf_release(&run.text);
    serve_gen_release(run.g);
    count(a, api, oc);
    serve_request_release(&req);
    free(ids);
    free(body);
    return status;
fail:
    count(a, api, SERVE_OUTCOME_ERROR);
    serve_request_release(&req);
    free(ids);
    free(body);
    return serve_http_error(c, &e);
}

/* ---- tokenize / detokenize ---------------------------------------------------------- */

int serve_api_tokenize(serve_api_ctx *a, struct mg_connection *c, serve_api api)
{
    serve_error e = SERVE_ERROR_INIT;
    char *body = NULL, *text = NULL;
    size_t n = 0;
    serve_request req;
    memset(&req, 0, sizeof req);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    cJSON *o = NULL;
    if (serve_http_body(c, a->max_body, &body, &n, &e))
        goto fail;
    if (serve_engine_state_get(a->engine, NULL) != SERVE_ENGINE_READY) {
        serve_reject(&e, 503, NULL, NULL, "the model is not loaded yet");
        goto fail;
    }
    const serve_model_info *in = serve_engine_info(a->engine);
    serve_limits lim = {in->max_context, in->vocab};
    if (serve_request_parse(api, body, n, &lim, &req, &e) ||
        serve_request_prompt(&req, in->tok, &lim, &ids, &n_ids, &e))
        goto fail;
    o = cJSON_CreateObject();
    if (api == SERVE_API_TOKENIZE) {
        cJSON_AddNumberToObject(o, "count", (double)n_ids);
        cJSON_AddNumberToObject(o, "max_model_len", (double)in->max_context);
        cJSON_AddItemToObject(o, "tokens", ids_array(ids, (int64_t)n_ids));
    } else {
        if (!in->tok) {
            serve_reject(&e, 400, "tokens", NULL, "this model has no tokenizer");
            goto fail;
        }
        mt_err err = MT_ERR_INIT;
        if (model_tokenizer_decode(in->tok, ids, n_ids, false, &text, NULL, &err)) {
            serve_reject(&e, 400, "tokens", NULL, "cannot decode: %s", err.msg);
            goto fail;
        }
        cJSON_AddStringToObject(o, "prompt", text);
    }
    char *j = cJSON_PrintUnformatted(o);
    if (!j) {
        serve_reject(&e, 500, NULL, NULL, "out of memory building the response");
        goto fail;
    }
    int status = serve_http_json(c, 200, j, strlen(j));
    free(j);
    cJSON_Delete(o);
    count(a, api, SERVE_OUTCOME_OK);
    serve_request_release(&req);
    free(ids);
    free(text);
    free(body);
    return status;
fail:
    cJSON_Delete(o);
    count(a, api, SERVE_OUTCOME_ERROR);
    serve_request_release(&req);
    free(ids);
    free(text);
    free(body);
    return serve_http_error(c, &e);
}
