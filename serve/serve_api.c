/* serve_api.c: the OpenAI endpoints /v1/completions and
 * /v1/chat/completions (plain and streaming), and /tokenize and
 * /detokenize: parse, tokenize, submit to the engine, turn tokens into text
 * (serve_textout) and write the response objects. */
#include "serve_api.h"

#include <civetweb.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/clock.h"
#include "serve_glmout.h"
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
    const model_tokenizer *tok;
    bool logprobs;   /* the client asked for them */
    bool reasoning;  /* reasoning_content is returned (include_reasoning) */
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

/* A JSON string of n bytes. cJSON's writer stops at a NUL, so text that
 * holds one (a prompt's U+0000 echoed by the model) is written as a raw
 * node with \u0000 escapes. */
static cJSON *str_n(const char *s, size_t n)
{
    if (!memchr(s, 0, n)) {
        char *t = malloc(n + 1);
        if (!t)
            return cJSON_CreateString("");
        memcpy(t, s, n);
        t[n] = 0;
        cJSON *j = cJSON_CreateString(t);
        free(t);
        return j;
    }
    /* Text with NUL bytes: a raw JSON string with \u0000 escapes. */
    serve_buf b = SERVE_BUF_INIT;
    serve_buf_puts(&b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            serve_buf_printf(&b, "\\%c", c);
        else if (c < 0x20)
            serve_buf_printf(&b, "\\u%04x", c);
        else
            serve_buf_append(&b, &s[i], 1);
    }
    serve_buf_puts(&b, "\"");
    cJSON *j = cJSON_CreateRaw(b.data ? b.data : "\"\"");
    serve_buf_release(&b);
    return j;
}

/* The token's text (lossy UTF-8) and its bytes. */
static void token_text(const reply *r, int32_t id, serve_buf *text, cJSON **bytes)
{
    char raw[256];
    int64_t n = r->tok ? model_tokenizer_token_bytes(r->tok, id, raw, sizeof raw) : -1;
    if (n < 0 || n > (int64_t)sizeof raw)
        n = 0;
    serve_buf_reset(text);
    if (r->tok && model_tokenizer_is_special(r->tok, id))
        serve_buf_puts(text, model_tokenizer_token_text(r->tok, id));
    else
        serve_utf8_lossy(text, raw, (size_t)n);
    if (bytes) {
        *bytes = cJSON_CreateArray();
        for (int64_t i = 0; i < n; i++)
            cJSON_AddItemToArray(*bytes, cJSON_CreateNumber((unsigned char)raw[i]));
    }
}

/* Code points in s[0..n) (valid UTF-8: the bytes that are not continuations). */
static size_t utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Completions' logprobs text: the returned text split at the tokens (tok_len[i]
 * bytes of it came with token i: the incremental detokenizer's output for
 * that token, so a character split over tokens comes with the token that
 * completes it), so that the tokens joined are the text. */
typedef struct lp_text {
    const char *text;      /* the text of tokens [from, to) */
    const size_t *tok_len; /* indexed by token */
    size_t *offset;        /* running offset, in characters (code points) */
} lp_text;

/* logprobs of tokens [from, to) of a choice, in the endpoint's shape:
 * chat {"content": [{token, logprob, bytes, top_logprobs}]}, completions
 * {tokens, token_logprobs, top_logprobs, text_offset}. NULL when the client
 * did not ask. */
static cJSON *logprobs_object(const reply *r, const serve_gen_view *v, int64_t from, int64_t to,
                              const lp_text *lt)
{
    if (!r->logprobs || !v->logprobs)
        return NULL;
    serve_buf t = SERVE_BUF_INIT;
    cJSON *o = cJSON_CreateObject();
    if (r->api == SERVE_API_CHAT) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (int64_t i = from; i < to; i++) {
            cJSON *e = cJSON_CreateObject(), *bytes;
            token_text(r, v->tokens[i], &t, &bytes);
            cJSON_AddItemToObject(e, "token", str_n(t.data ? t.data : "", t.len));
            cJSON_AddNumberToObject(e, "logprob", v->logprobs[i]);
            cJSON_AddItemToObject(e, "bytes", bytes);
            cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int k = 0; k < v->n_top; k++) {
                if (isinf(v->top_logprobs[i * v->n_top + k]))
                    continue; /* a refused token (logit bias, a grammar's mask) */
                cJSON *x = cJSON_CreateObject();
                int32_t id = v->top_ids[i * v->n_top + k];
                token_text(r, id, &t, &bytes);
                cJSON_AddItemToObject(x, "token", str_n(t.data ? t.data : "", t.len));
                cJSON_AddNumberToObject(x, "logprob", v->top_logprobs[i * v->n_top + k]);
                cJSON_AddItemToObject(x, "bytes", bytes);
                cJSON_AddItemToArray(top, x);
            }
            cJSON_AddItemToArray(content, e);
        }
    } else {
        cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
        cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
        cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
        cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
        size_t at = 0; /* bytes of lt->text */
        for (int64_t i = from; i < to; i++) {
            size_t n = lt->tok_len[i];
            cJSON_AddItemToArray(toks, str_n(lt->text + at, n));
            cJSON_AddItemToArray(lps, cJSON_CreateNumber(v->logprobs[i]));
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*lt->offset));
            *lt->offset += utf8_chars(lt->text + at, n);
            at += n;
            cJSON *d = cJSON_CreateObject();
            for (int k = 0; k < v->n_top; k++) {
                if (isinf(v->top_logprobs[i * v->n_top + k]))
                    continue; /* a refused token */
                token_text(r, v->top_ids[i * v->n_top + k], &t, NULL);
                if (!cJSON_GetObjectItemCaseSensitive(d, t.data ? t.data : ""))
                    cJSON_AddNumberToObject(d, t.data ? t.data : "",
                                            v->top_logprobs[i * v->n_top + k]);
            }
            cJSON_AddItemToArray(tops, d);
        }
    }
    serve_buf_release(&t);
    return o;
}

/* ---- one choice ------------------------------------------------------------------ */

typedef struct call_acc { /* a tool call of a plain response */
    char id[48];
    char *name;
    serve_buf args;
} call_acc;

typedef struct choice_run {
    int index;
    serve_gen *g;
    serve_textout to;
    bool chat;
    serve_glmout out; /* chat: reasoning and tool calls */
    serve_glmout_delta d, d2;
    int64_t seen;     /* tokens read from the engine */
    int64_t used;     /* tokens that count (up to a stop string) */
    serve_gen_view v;
    const char *finish;
    bool failed;      /* engine error: v.error */
    bool sent_first;  /* streaming: the role was sent */
    size_t lp_offset; /* completions logprobs: text offset in characters */
    size_t *tok_len;  /* completions: bytes of text each token brought (cap_tok) */
    int64_t cap_tok;
    /* Plain responses: everything. */
    serve_buf text, reasoning;
    call_acc *calls;
    int n_calls;
} choice_run;

static const char *finish_name(serve_finish f)
{
    return f == SERVE_FINISH_LENGTH ? "length" : "stop";
}

/* Appends d2 to d. */
static mt_status delta_merge(serve_glmout_delta *d, serve_glmout_delta *d2)
{
    MT_CHECK(serve_buf_append(&d->reasoning, d2->reasoning.data ? d2->reasoning.data : "",
                              d2->reasoning.len));
    MT_CHECK(serve_buf_append(&d->content, d2->content.data ? d2->content.data : "",
                              d2->content.len));
    for (int i = 0; i < d2->n_calls; i++) {
        serve_glmout_call_delta *c = &d2->calls[i];
        if (d->n_calls && d->calls[d->n_calls - 1].index == c->index) {
            MT_CHECK(serve_buf_append(&d->calls[d->n_calls - 1].args,
                                      c->args.data ? c->args.data : "", c->args.len));
            continue;
        }
        if (d->n_calls == d->cap_calls) {
            int cap = d->cap_calls ? d->cap_calls * 2 : 4;
            serve_glmout_call_delta *p = realloc(d->calls, (size_t)cap * sizeof *p);
            if (!p)
                return MT_E_NOMEM;
            d->calls = p;
            d->cap_calls = cap;
        }
        d->calls[d->n_calls++] = *c; /* moves name and args */
        memset(c, 0, sizeof *c);
    }
    d2->n_calls = 0;
    return MT_OK;
}

/* Reads newly published tokens: the new text (chat: split by glmout into
 * run->d) and the tokens that count [*first_new, run->used); sets
 * run->finish when done. */
static mt_status advance(choice_run *run, double wait_s, serve_buf *text, int64_t *first_new)
{
    serve_gen_wait(run->g, run->seen, wait_s, &run->v);
    *first_new = run->used;
    serve_buf_reset(text);
    if (!run->chat && run->v.n_generated > run->cap_tok) {
        int64_t cap = run->v.n_generated + 64;
        size_t *p = realloc(run->tok_len, (size_t)cap * sizeof *p);
        if (!p)
            return MT_E_NOMEM;
        run->tok_len = p;
        run->cap_tok = cap;
    }
    for (int64_t i = run->seen; i < run->v.n_generated && !run->to.stopped; i++) {
        size_t before = text->len;
        MT_CHECK(serve_textout_push(&run->to, run->v.tokens[i], text));
        if (run->tok_len)
            run->tok_len[i] = text->len - before;
        run->used = i + 1;
    }
    run->seen = run->v.n_generated;
    bool done = false;
    if (run->to.stopped) {
        serve_gen_cancel(run->g, false); /* a stop string: finish, keep the KV */
        run->finish = "stop";
        done = true;
    } else if (run->v.finish == SERVE_FINISH_ERROR) {
        run->failed = true;
        run->finish = "error";
    } else if (run->v.finish != SERVE_FINISH_NONE) {
        size_t before = text->len;
        MT_CHECK(serve_textout_finish(&run->to, text));
        /* What was held back belongs to the last token (none: no token to
         * carry it; a streamed chunk then has text and no logprobs). */
        if (run->tok_len && run->used > 0)
            run->tok_len[run->used - 1] += text->len - before;
        run->finish = finish_name(run->v.finish);
        done = true;
    }
    if (!run->chat)
        return MT_OK;
    MT_CHECK(serve_glmout_push(&run->out, text->data ? text->data : "", text->len, &run->d));
    if (done) {
        MT_CHECK(serve_glmout_finish(&run->out, &run->d2));
        MT_CHECK(delta_merge(&run->d, &run->d2));
        if (serve_glmout_calls(&run->out) > 0 && !strcmp(run->finish, "stop"))
            run->finish = "tool_calls";
    }
    return MT_OK;
}

/* Plain responses keep everything a delta brings. */
static mt_status accumulate(choice_run *run, const serve_buf *text)
{
    if (!run->chat)
        return serve_buf_append(&run->text, text->data ? text->data : "", text->len);
    serve_glmout_delta *d = &run->d;
    MT_CHECK(serve_buf_append(&run->text, d->content.data ? d->content.data : "", d->content.len));
    MT_CHECK(serve_buf_append(&run->reasoning, d->reasoning.data ? d->reasoning.data : "",
                              d->reasoning.len));
    for (int i = 0; i < d->n_calls; i++) {
        serve_glmout_call_delta *c = &d->calls[i];
        if (c->name) {
            call_acc *p = realloc(run->calls, (size_t)(run->n_calls + 1) * sizeof *p);
            if (!p)
                return MT_E_NOMEM;
            run->calls = p;
            call_acc *a = &run->calls[run->n_calls++];
            memset(a, 0, sizeof *a);
            memcpy(a->id, c->id, sizeof a->id);
            a->name = c->name;
            c->name = NULL;
        }
        if (run->n_calls)
            MT_CHECK(serve_buf_append(&run->calls[run->n_calls - 1].args,
                                      c->args.data ? c->args.data : "", c->args.len));
    }
    return MT_OK;
}

static cJSON *tool_call_json(int index, const char *id, const char *name, const char *args,
                             size_t args_len, bool chunk)
{
    cJSON *t = cJSON_CreateObject();
    if (chunk)
        cJSON_AddNumberToObject(t, "index", index);
    if (id && id[0]) {
        cJSON_AddStringToObject(t, "id", id);
        cJSON_AddStringToObject(t, "type", "function");
    }
    cJSON *f = cJSON_AddObjectToObject(t, "function");
    if (name)
        cJSON_AddStringToObject(f, "name", name);
    cJSON_AddItemToObject(f, "arguments", str_n(args ? args : "", args_len));
    return t;
}

/* A streaming chunk's choice for what this advance brought. NULL when it
 * brought nothing to send. */
static cJSON *chunk_choice(const reply *r, choice_run *run, const serve_buf *text, int64_t from)
{
    bool toks = run->used > from;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", run->index);
    bool any = toks || run->finish;
    if (r->api == SERVE_API_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(c, "delta");
        const serve_glmout_delta *d = &run->d;
        if (!run->sent_first) {
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", "");
            run->sent_first = true;
            any = true;
        }
        if (d->content.len) {
            cJSON_DeleteItemFromObject(m, "content");
            cJSON_AddItemToObject(m, "content", str_n(d->content.data, d->content.len));
            any = true;
        }
        if (d->reasoning.len && r->reasoning) {
            cJSON_AddItemToObject(m, "reasoning_content",
                                  str_n(d->reasoning.data, d->reasoning.len));
            any = true;
        }
        if (d->n_calls) {
            cJSON *tc = cJSON_AddArrayToObject(m, "tool_calls");
            for (int i = 0; i < d->n_calls; i++)
                cJSON_AddItemToArray(tc, tool_call_json(d->calls[i].index, d->calls[i].id,
                                                        d->calls[i].name, d->calls[i].args.data,
                                                        d->calls[i].args.len, true));
            any = true;
        }
    } else {
        cJSON_AddItemToObject(c, "text", str_n(text->data ? text->data : "", text->len));
        any = any || text->len;
    }
    /* The chunk's tokens brought exactly this text (see advance). */
    lp_text lt = {text->data ? text->data : "", run->tok_len, &run->lp_offset};
    cJSON *lp = logprobs_object(r, &run->v, from, run->used, &lt);
    if (lp)
        cJSON_AddItemToObject(c, "logprobs", lp);
    else
        cJSON_AddNullToObject(c, "logprobs");
    if (run->finish && !run->failed)
        cJSON_AddStringToObject(c, "finish_reason", run->finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    if (r->token_ids)
        cJSON_AddItemToObject(c, "token_ids", ids_array(run->v.tokens + from, run->used - from));
    if (!any) {
        cJSON_Delete(c);
        return NULL;
    }
    return c;
}

/* A plain response's choice. */
static cJSON *plain_choice(const reply *r, choice_run *run, int index)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", index);
    const char *text = run->text.data ? run->text.data : "";
    if (r->api == SERVE_API_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        if (run->n_calls && run->text.len == 0)
            cJSON_AddNullToObject(m, "content");
        else
            cJSON_AddItemToObject(m, "content", str_n(text, run->text.len));
        if (r->reasoning && run->reasoning.len)
            cJSON_AddItemToObject(m, "reasoning_content",
                                  str_n(run->reasoning.data, run->reasoning.len));
        if (run->n_calls) {
            cJSON *tc = cJSON_AddArrayToObject(m, "tool_calls");
            for (int i = 0; i < run->n_calls; i++)
                cJSON_AddItemToArray(tc, tool_call_json(i, run->calls[i].id, run->calls[i].name,
                                                        run->calls[i].args.data,
                                                        run->calls[i].args.len, false));
        }
    } else {
        cJSON_AddItemToObject(c, "text", str_n(text, run->text.len));
    }
    size_t off = 0;
    lp_text lt = {text, run->tok_len, &off};
    cJSON *lp = logprobs_object(r, &run->v, 0, run->used, &lt);
    if (lp)
        cJSON_AddItemToObject(c, "logprobs", lp);
    else
        cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", run->finish);
    if (r->token_ids)
        cJSON_AddItemToObject(c, "token_ids", ids_array(run->v.tokens, run->used));
    return c;
}

static void choice_release(choice_run *run)
{
    serve_textout_release(&run->to);
    serve_glmout_release(&run->out);
    serve_glmout_delta_release(&run->d);
    serve_glmout_delta_release(&run->d2);
    serve_buf_release(&run->text);
    serve_buf_release(&run->reasoning);
    for (int i = 0; i < run->n_calls; i++) {
        free(run->calls[i].name);
        serve_buf_release(&run->calls[i].args);
    }
    free(run->calls);
    free(run->tok_len);
    serve_gen_release(run->g);
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

/* Speculative decoding's share of the usage, over the choices (when on). */
static void usage_spec(cJSON *u, const choice_run *runs, int n)
{
    int64_t rounds = 0, drafted = 0, accepted = 0;
    for (int i = 0; i < n; i++) {
        rounds += runs[i].v.spec_rounds;
        drafted += runs[i].v.spec_drafted;
        accepted += runs[i].v.spec_accepted;
    }
    if (!rounds)
        return;
    cJSON *d = cJSON_AddObjectToObject(u, "speculative");
    cJSON_AddNumberToObject(d, "verify_rounds", (double)rounds);
    cJSON_AddNumberToObject(d, "draft_tokens", (double)drafted);
    cJSON_AddNumberToObject(d, "accepted_tokens", (double)accepted);
    cJSON_AddNumberToObject(d, "acceptance_rate", drafted ? (double)accepted / (double)drafted : 0.0);
    cJSON_AddNumberToObject(d, "mean_accepted_length", 1.0 + (double)accepted / (double)rounds);
}

static int64_t usage_completion(choice_run *runs, int n)
{
    int64_t c = 0;
    for (int i = 0; i < n; i++)
        c += runs[i].used;
    return c;
}

static double cum_logprob(const choice_run *run)
{
    double s = 0;
    for (int64_t i = 0; i < run->used && run->v.logprobs; i++)
        s += run->v.logprobs[i];
    return s;
}

/* How often a plain request looks at its client while no token comes. */
#define PLAIN_POLL_S 0.05

/* client_fd: the connection's socket (-1: unknown), looked at whenever
 * tokens arrive and every PLAIN_POLL_S: a client that left cancels the
 * request, which the engine frees before its next step. */
static serve_outcome run_plain(const reply *r, choice_run *runs, int n_runs, int n_return,
                               struct mg_connection *c, int client_fd, int *status)
{
    serve_buf text = SERVE_BUF_INIT;
    serve_error e = SERVE_ERROR_INIT;
    bool oom = false, gone = false;
    for (int i = 0; i < n_runs && !gone; i++)
        while (!runs[i].finish && !oom && !gone) {
            int64_t from;
            oom = advance(&runs[i], client_fd >= 0 ? PLAIN_POLL_S : 3600, &text, &from) != MT_OK ||
                  accumulate(&runs[i], &text) != MT_OK;
            gone = !runs[i].finish && serve_http_client_gone(client_fd);
        }
    serve_buf_release(&text);
    if (gone) {
        for (int i = 0; i < n_runs; i++)
            serve_gen_cancel(runs[i].g, true); /* free its KV now */
        *status = 499; /* nginx's "client closed request", for the log: nothing is sent */
        return SERVE_OUTCOME_CANCELLED;
    }
    if (oom) {
        serve_reject(&e, 500, NULL, NULL, "out of memory building the response");
        for (int i = 0; i < n_runs; i++)
            serve_gen_cancel(runs[i].g, true);
        *status = serve_http_error(c, &e);
        return SERVE_OUTCOME_ERROR;
    }
    for (int i = 0; i < n_runs; i++)
        if (runs[i].failed) {
            *status = serve_http_error(c, &runs[i].v.error);
            return SERVE_OUTCOME_ERROR;
        }
    /* best_of: the n_return choices of the highest cumulative logprob. */
    int order[SERVE_MAX_N];
    for (int i = 0; i < n_runs; i++)
        order[i] = i;
    if (n_return < n_runs)
        for (int i = 1; i < n_runs; i++)
            for (int k = i; k > 0 && cum_logprob(&runs[order[k]]) > cum_logprob(&runs[order[k - 1]]);
                 k--) {
                int t = order[k];
                order[k] = order[k - 1];
                order[k - 1] = t;
            }
    cJSON *o = base_object(r, false);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < n_return; i++)
        cJSON_AddItemToArray(choices, plain_choice(r, &runs[order[i]], i));
    cJSON_AddItemToObject(o, "usage", usage_object(runs[0].v.n_prompt,
                                                   usage_completion(runs, n_runs),
                                                   runs[0].v.n_cached));
    usage_spec(cJSON_GetObjectItem(o, "usage"), runs, n_runs);
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!j) {
        serve_reject(&e, 500, NULL, NULL, "out of memory building the response");
        *status = serve_http_error(c, &e);
        return SERVE_OUTCOME_ERROR;
    }
    *status = serve_http_json(c, 200, j, strlen(j));
    free(j);
    return SERVE_OUTCOME_OK;
}

/* client_fd: the connection's socket (-1: unknown). A client that left is
 * noticed at the next write (a token, or the keep-alive comment) and, while
 * nothing is written (waiting for a slot, text held back), by polling its
 * socket whenever tokens arrive and every PLAIN_POLL_S. */
static serve_outcome run_stream(const reply *r, choice_run *runs, int n_runs,
                                struct mg_connection *c, int client_fd, bool include_usage,
                                double keepalive_s)
{
    stream st = {c, SERVE_BUF_INIT, false};
    serve_buf text = SERVE_BUF_INIT;
    stream_start(&st);
    serve_outcome oc = SERVE_OUTCOME_OK;
    /* One choice waits the keep-alive period (the poll period when the
     * socket is known); several poll in turn. */
    double wait = n_runs > 1 ? (keepalive_s < 0.02 ? keepalive_s : 0.02) : keepalive_s;
    if (client_fd >= 0 && wait > PLAIN_POLL_S)
        wait = PLAIN_POLL_S;
    uint64_t last_send = mt_now_ns();
    int open = n_runs;
    while (!st.broken && open > 0 && oc == SERVE_OUTCOME_OK) {
        bool sent = false;
        for (int i = 0; i < n_runs && !st.broken; i++) {
            choice_run *run = &runs[i];
            if (run->finish)
                continue;
            int64_t from;
            if (advance(run, sent ? 0 : wait, &text, &from)) {
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
            if (run->finish)
                open--;
            cJSON *ch = chunk_choice(r, run, &text, from);
            if (ch) {
                cJSON *o = base_object(r, true);
                cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), ch);
                send_event(&st, o);
                sent = true;
            }
        }
        if (!sent && open > 0 && serve_http_client_gone(client_fd))
            st.broken = true; /* gone while nothing was written */
        if (sent) {
            last_send = mt_now_ns();
        } else if (open > 0 && oc == SERVE_OUTCOME_OK &&
                   (double)(mt_now_ns() - last_send) * 1e-9 >= keepalive_s * 0.999) {
            send_raw(&st, ": keep-alive\n\n", 14); /* notices a client that left */
            last_send = mt_now_ns();
        }
    }
    if (!st.broken && oc == SERVE_OUTCOME_OK && include_usage) {
        cJSON *o = base_object(r, true);
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage_object(runs[0].v.n_prompt,
                                                       usage_completion(runs, n_runs),
                                                       runs[0].v.n_cached));
        usage_spec(cJSON_GetObjectItem(o, "usage"), runs, n_runs);
        send_event(&st, o);
    }
    if (!st.broken)
        send_raw(&st, "data: [DONE]\n\n", 14);
    if (!st.broken)
        send_raw(&st, "", 0); /* the last chunk */
    if (st.broken || oc != SERVE_OUTCOME_OK) {
        for (int i = 0; i < n_runs; i++)
            serve_gen_cancel(runs[i].g, true); /* the client went away: free its KV now */
        if (st.broken)
            oc = SERVE_OUTCOME_CANCELLED;
    }
    serve_buf_release(&st.frame);
    serve_buf_release(&text);
    return oc;
}

/* cap - 1 random hex digits (ids unique across restarts: 96 bits from the
 * kernel; should that fail, the clock and a counter, mixed). */
static void random_hex(serve_api_ctx *a, char *out, size_t cap)
{
    unsigned char b[32];
    size_t n = (cap - 1 + 1) / 2;
    if (n > sizeof b)
        n = sizeof b;
    if (getrandom(b, n, GRND_NONBLOCK) != (ssize_t)n) {
        uint64_t x = mt_now_ns() ^ ((uint64_t)atomic_fetch_add(&a->next_id, 1) << 40) ^
                     (uint64_t)time(NULL) << 20;
        for (size_t i = 0; i < n; i++) {
            x += 0x9E3779B97F4A7C15ull; /* splitmix64 */
            uint64_t z = x;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            b[i] = (unsigned char)(z ^ (z >> 31));
        }
    }
    static const char hex[] = "0123456789abcdef";
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < cap; i++) {
        out[k++] = hex[b[i] >> 4];
        if (k + 1 < cap)
            out[k++] = hex[b[i] & 15];
    }
    out[k] = 0;
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
    /* On the heap: a choice is 2.7 KB and civetweb's worker stacks are
     * small (Debian builds it with 100 KiB). */
    choice_run *runs = NULL;
    int n_runs = 0;
    serve_glmout_tool tools_buf[1];
    serve_glmout_tool *tools = tools_buf;
    serve_logits_spec cons;
    memset(&cons, 0, sizeof cons);
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
    if (req.n_tools > 1 && !(tools = calloc((size_t)req.n_tools, sizeof *tools))) {
        serve_reject(&e, 500, NULL, NULL, "out of memory");
        tools = tools_buf;
        goto fail;
    }
    for (int i = 0; i < req.n_tools; i++)
        tools[i] = (serve_glmout_tool){req.tools[i].name, req.tools[i].properties};
    reply r = {
        .a = a,
        .api = api,
        .created = time(NULL),
        .token_ids = req.return_token_ids,
        .tok = in->tok,
        .logprobs = req.logprobs,
        .reasoning = req.include_reasoning,
    };
    char rid[25];
    random_hex(a, rid, sizeof rid);
    snprintf(r.id, sizeof r.id, "%s-%s", api == SERVE_API_CHAT ? "chatcmpl" : "cmpl", rid);
    if (!(runs = calloc((size_t)req.best_of, sizeof *runs))) {
        serve_reject(&e, 500, NULL, NULL, "out of memory");
        goto fail;
    }
    int32_t stops[MODEL_MAX_EOS + 3];
    int n_stops = 0;
    for (int i = 0; i < in->n_eos; i++)
        stops[n_stops++] = in->eos[i];
    for (int i = 0; api == SERVE_API_CHAT && i < in->n_chat_stop; i++)
        stops[n_stops++] = in->chat_stop[i];
    if (serve_logits_spec_make(&req, api == SERVE_API_CHAT, in->tok, stops, n_stops, &cons, &e))
        goto fail;
    if (cons.lo.grammar &&
        !(cons.lo.vocab = serve_constraints_vocab(a->constraints, in->tok, in->vocab, &e)))
        goto fail;
    for (int i = 0; i < req.best_of; i++) {
        choice_run *run = &runs[i];
        serve_logits *lp = NULL;
        if (cons.want && serve_logits_create(a->constraints, &cons.lo, &lp, &e))
            goto fail;
        serve_gen_params p = {
            .prompt = ids,
            .n_prompt = (int64_t)n_ids,
            .max_tokens = max_tokens,
            .sampler = {.temperature = req.temperature,
                        .top_p = req.top_p,
                        .top_k = req.top_k,
                        .min_p = req.min_p,
                        .presence_penalty = req.presence_penalty,
                        .frequency_penalty = req.frequency_penalty,
                        .repetition_penalty = req.repetition_penalty,
                        .bias = req.logit_bias,
                        .n_bias = req.n_logit_bias},
            .logits = lp,
            .has_seed = req.has_seed,
            .seed = req.seed + (uint64_t)i, /* each choice its own draws */
            .ignore_eos = req.ignore_eos,
            .spec_set = req.has_spec_steps,
            .spec_steps = req.spec_steps,
            .chat = api == SERVE_API_CHAT,
            .logprobs = req.logprobs || req.best_of > req.n,
            .top_logprobs = req.logprobs ? req.top_logprobs : 0,
            .follow = i ? runs[0].g : NULL,
            .n_followers = i ? 0 : req.best_of - 1,
        };
        if (serve_engine_submit(a->engine, &p, &run->g, &e)) {
            serve_logits_destroy(lp);
            goto fail;
        }
        n_runs++;
        run->index = i;
        run->chat = api == SERVE_API_CHAT;
        serve_textout_init(&run->to, in->tok, req.stop, req.n_stop);
        char prefix[40];
        snprintf(prefix, sizeof prefix, "%s%x", rid, i); /* call ids: call_<rid><i>_<k> */
        serve_glmout_opts go = {
            /* A JSON answer (response_format without forced calls) is no
             * place for calls: "<tool_call>" in one of its strings is text. */
            .tools = req.n_tools && !(cons.lo.grammar && !cons.go.n_tools) ? tools : NULL,
            .n_tools = req.n_tools,
            .start_in_reasoning = req.enable_thinking && req.add_generation_prompt,
            .keep_reasoning = !req.separate_reasoning,
            .max_calls = req.parallel_tool_calls ? 0 : 1,
            .id_prefix = prefix,
        };
        serve_glmout_init(&run->out, &go);
    }
    serve_outcome oc;
    if (req.stream) {
        oc = run_stream(&r, runs, n_runs, c, serve_http_client_fd(c, atomic_load(&a->port)),
                        req.include_usage, a->keepalive_s);
        status = 200;
    } else {
        oc = run_plain(&r, runs, n_runs, req.n, c,
                       serve_http_client_fd(c, atomic_load(&a->port)), &status);
    }
    for (int i = 0; i < n_runs; i++)
        choice_release(&runs[i]);
    free(runs);
    if (tools != tools_buf)
        free(tools);
    serve_logits_spec_release(&cons);
    count(a, api, oc);
    serve_request_release(&req);
    free(ids);
    free(body);
    return status;
fail:
    for (int i = 0; i < n_runs; i++) {
        serve_gen_cancel(runs[i].g, true);
        choice_release(&runs[i]);
    }
    free(runs);
    if (tools != tools_buf)
        free(tools);
    serve_logits_spec_release(&cons);
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
        size_t text_len = 0;
        if (model_tokenizer_decode(in->tok, ids, n_ids, false, &text, &text_len, &err)) {
            serve_reject(&e, 400, "tokens", NULL, "cannot decode: %s", err.msg);
            goto fail;
        }
        cJSON_AddItemToObject(o, "prompt", str_n(text, text_len)); /* U+0000 kept, escaped */
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
