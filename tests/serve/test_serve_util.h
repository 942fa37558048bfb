/* test_serve_util.h: helpers for the server's integration tests: a tiny
 * model in a temporary folder, a server on 127.0.0.1 with an ephemeral
 * port running it on cpu, HTTP calls over the loopback client, streaming
 * with timing, /metrics samples, and greedy generation straight on a second
 * runtime as the reference. Header-only (static functions), one include per
 * test executable. */
#ifndef MT_TEST_SERVE_UTIL_H
#define MT_TEST_SERVE_UTIL_H

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rng.h"
#include "model/runtime.h"
#include "model/format/tiny.h"
#include "serve/serve_client.h"
#include "serve/serve_server.h"
#include "serve/serve_sse.h"
#include "test_tmp.h"

typedef struct tsrv {
    char dir[512];
    serve_server *s;
    serve_url url;
    char url_text[64];
    FILE *log;
} tsrv;

/* Writes a tiny model and starts a server on it (opts may be NULL). */
__attribute__((unused)) static void tsrv_start(tsrv *t, const serve_server_opts *opts)
{
    signal(SIGPIPE, SIG_IGN);
    memset(t, 0, sizeof *t);
    tmp_dir_make(t->dir, sizeof t->dir, "mt_serve");
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tiny_write(t->dir, 1, &err), MT_OK, "%s", err.msg);
    serve_server_opts o;
    if (opts)
        o = *opts;
    else
        memset(&o, 0, sizeof o);
    o.engine.rt.model_dir = t->dir;
    o.engine.rt.device = "cpu";
    t->log = fopen("/dev/null", "w");
    o.engine.rt.log = t->log;
    o.host = "127.0.0.1";
    o.port = 0;
    cr_assert_eq(serve_server_start(&o, &t->s, &err), MT_OK, "%s", err.msg);
    /* A cold kernel cache compiles every module first (about a minute here). */
    cr_assert_eq(serve_engine_wait_ready(serve_server_engine(t->s), 900, &err), MT_OK, "%s",
                 err.msg);
    snprintf(t->url_text, sizeof t->url_text, "http://127.0.0.1:%d", serve_server_port(t->s));
    cr_assert_eq(serve_url_parse(t->url_text, &t->url, &err), MT_OK, "%s", err.msg);
}

__attribute__((unused)) static void tsrv_stop(tsrv *t)
{
    serve_server_stop(t->s);
    t->s = NULL;
    tmp_rm_tree(t->dir);
    if (t->log)
        fclose(t->log);
}

/* A request; returns the status and the body parsed as JSON (NULL when it
 * is not JSON) in *json, the raw body in *raw (may be NULL). */
__attribute__((unused)) static int http(const tsrv *t, const char *method, const char *path, const char *body,
                cJSON **json, char **raw)
{
    serve_client_resp r = SERVE_CLIENT_RESP_INIT;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_client_request(&t->url, method, path, body, body ? strlen(body) : 0, 120,
                                      NULL, NULL, &r, &err),
                 MT_OK, "%s %s: %s", method, path, err.msg);
    if (json)
        *json = r.body.data ? cJSON_Parse(r.body.data) : NULL;
    if (raw)
        *raw = serve_buf_detach(&r.body, NULL);
    int st = r.status;
    serve_client_resp_release(&r);
    return st;
}

/* Checks an error body: OpenAI's shape; returns error.message. */
__attribute__((unused)) static const char *assert_error_shape(const cJSON *j, const char *what)
{
    cr_assert_not_null(j, "%s: the body is not JSON", what);
    const cJSON *e = cJSON_GetObjectItem(j, "error");
    cr_assert(cJSON_IsObject(e), "%s: no error object", what);
    cr_assert(cJSON_IsString(cJSON_GetObjectItem(e, "message")), "%s: no message", what);
    cr_assert(cJSON_IsString(cJSON_GetObjectItem(e, "type")), "%s: no type", what);
    cr_assert_not_null(cJSON_GetObjectItem(e, "param"), "%s: no param", what);
    cr_assert_not_null(cJSON_GetObjectItem(e, "code"), "%s: no code", what);
    return cJSON_GetObjectItem(e, "message")->valuestring;
}

/* A sample from /metrics (the line that starts with name and a space). */
__attribute__((unused)) static double metric(const tsrv *t, const char *name)
{
    char *raw = NULL;
    cr_assert_eq(http(t, "GET", "/metrics", NULL, NULL, &raw), 200);
    size_t n = strlen(name);
    double v = -1;
    for (char *l = raw; l && *l;) {
        char *eol = strchr(l, '\n');
        if (!strncmp(l, name, n) && l[n] == ' ') {
            v = strtod(l + n + 1, NULL);
            break;
        }
        l = eol ? eol + 1 : NULL;
    }
    free(raw);
    cr_assert_geq(v, 0, "no metric %s", name);
    return v;
}

/* ---- streaming ---------------------------------------------------------------- */

typedef struct tstream {
    serve_sse_parser p;
    uint64_t t0;
    double ttft;           /* seconds to the first event with a token */
    int32_t ids[4096];
    int n_ids;
    char text[65536];
    size_t text_len;
    const char *finish;    /* static copy of the last finish_reason */
    char finish_buf[16];
    int events, usage_events;
    cJSON *usage;          /* the usage object, when sent */
    bool done, after_done, error_event;
    bool chat, saw_role;
    int abort_after;       /* abort once this many tokens arrived (0: never) */
    void (*on_tokens)(struct tstream *s); /* called after each token event */
    void *user;
} tstream;

__attribute__((unused)) static bool tstream_event(void *ctx, const char *data, size_t n)
{
    tstream *s = ctx;
    if (s->done)
        s->after_done = true;
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        s->done = true;
        return true;
    }
    s->events++;
    cJSON *o = cJSON_Parse(data);
    cr_assert_not_null(o, "event is not JSON: %s", data);
    if (cJSON_GetObjectItem(o, "error")) {
        s->error_event = true;
        cJSON_Delete(o);
        return true;
    }
    const char *obj = cJSON_GetObjectItem(o, "object")->valuestring;
    cr_assert_str_eq(obj, s->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *u = cJSON_GetObjectItem(o, "usage");
    if (cJSON_IsObject(u)) {
        s->usage_events++;
        cJSON_Delete(s->usage);
        s->usage = cJSON_Duplicate(u, true);
    }
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    bool had_tokens = false;
    if (ch) {
        const char *t = NULL;
        if (s->chat) {
            cJSON *d = cJSON_GetObjectItem(ch, "delta");
            cJSON *role = cJSON_GetObjectItem(d, "role");
            if (role) {
                cr_assert_str_eq(role->valuestring, "assistant");
                cr_assert(!s->saw_role, "role sent twice");
                s->saw_role = true;
            }
            cJSON *c = cJSON_GetObjectItem(d, "content");
            t = cJSON_IsString(c) ? c->valuestring : NULL;
        } else {
            t = cJSON_GetObjectItem(ch, "text")->valuestring;
        }
        if (t) {
            size_t tl = strlen(t);
            cr_assert_lt(s->text_len + tl, sizeof s->text);
            memcpy(s->text + s->text_len, t, tl);
            s->text_len += tl;
            s->text[s->text_len] = 0;
        }
        cJSON *ids = cJSON_GetObjectItem(ch, "token_ids"), *id;
        cJSON_ArrayForEach(id, ids)
        {
            cr_assert_lt(s->n_ids, 4096);
            s->ids[s->n_ids++] = (int32_t)id->valuedouble;
            had_tokens = true;
        }
        cJSON *fr = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(fr)) {
            snprintf(s->finish_buf, sizeof s->finish_buf, "%s", fr->valuestring);
            s->finish = s->finish_buf;
        }
    }
    cJSON_Delete(o);
    if (had_tokens && s->ttft < 0)
        s->ttft = (double)(mt_now_ns() - s->t0) * 1e-9;
    if (had_tokens && s->on_tokens)
        s->on_tokens(s);
    return !(s->abort_after && s->n_ids >= s->abort_after);
}

__attribute__((unused)) static bool tstream_body(void *ctx, const char *p, size_t n)
{
    tstream *s = ctx;
    bool stopped = false;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_sse_feed(&s->p, p, n, tstream_event, s, &stopped, &err), MT_OK, "%s",
                 err.msg);
    return !stopped;
}

/* Sends a streaming request; s must be zeroed except abort_after/on_tokens/chat. */
__attribute__((unused)) static int tstream_run(const tsrv *t, const char *path, const char *body, tstream *s)
{
    s->p = (serve_sse_parser)SERVE_SSE_PARSER_INIT;
    s->ttft = -1;
    s->t0 = mt_now_ns();
    serve_client_resp r = SERVE_CLIENT_RESP_INIT;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_client_request(&t->url, "POST", path, body, strlen(body), 300, tstream_body,
                                      s, &r, &err),
                 MT_OK, "%s", err.msg);
    char ct[64] = "";
    if (r.status == 200) {
        cr_assert(serve_client_header(&r, "Content-Type", ct, sizeof ct));
        cr_assert_str_eq(ct, "text/event-stream");
    }
    int st = r.status;
    serve_sse_release(&s->p);
    serve_client_resp_release(&r);
    return st;
}

/* ---- reference: greedy on a runtime of our own -------------------------------- */

__attribute__((unused)) static int argmax(const float *l, int32_t v)
{
    int b = 0;
    for (int32_t i = 1; i < v; i++)
        if (l[i] > l[b])
            b = i;
    return b;
}

/* Greedy tokens, one sequence at a time, token by token after the prompt. */
__attribute__((unused)) static void greedy_reference(model_runtime *rt, const int32_t *prompt, int n, int steps,
                             int32_t *out)
{
    mt_err err = MT_ERR_INIT;
    int32_t v = model_runtime_vocab(rt);
    float *lg = malloc(sizeof(float) * (size_t)v);
    int seq;
    cr_assert_eq(model_seq_create(rt, &seq, &err), MT_OK, "%s", err.msg);
    model_step_item it = {seq, prompt, n, lg, NULL, n};
    cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
    for (int k = 0; k < steps; k++) {
        out[k] = argmax(lg, v);
        it = (model_step_item){seq, &out[k], 1, lg, NULL, 0};
        cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
    }
    model_seq_free(rt, seq);
    free(lg);
}

/* Greedy tokens of n prompts run together under a schedule of our own:
 * mode 0 gives every prompt min(rest, 512 / n) tokens per step (prompts split,
 * every step batched); mode 1 random chunk sizes and a random subset of the
 * sequences in each step. out[i * steps + k]. */
__attribute__((unused)) static void greedy_scheduled(model_runtime *rt, const int32_t *const *prompts,
                                                     const int *lens, int n, int steps, int mode,
                                                     mt_rng *rng, int32_t *out)
{
    mt_err err = MT_ERR_INIT;
    int32_t v = model_runtime_vocab(rt);
    float *lg = malloc(sizeof(float) * (size_t)v * (size_t)n);
    int *seq = calloc((size_t)n, sizeof *seq), *fed = calloc((size_t)n, sizeof *fed),
        *ng = calloc((size_t)n, sizeof *ng), *who = calloc((size_t)n, sizeof *who);
    model_step_item *it = calloc((size_t)n, sizeof *it);
    for (int i = 0; i < n; i++)
        cr_assert_eq(model_seq_create(rt, &seq[i], &err), MT_OK, "%s", err.msg);
    for (;;) {
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (ng[i] >= steps || (mode == 1 && mt_rng_below(rng, 3) == 0))
                continue;
            int rest = lens[i] - fed[i];
            if (rest > 0) {
                int c = mode == 0 ? 512 / n : 1 + (int)mt_rng_below(rng, (uint64_t)rest);
                c = c < 1 ? 1 : c > rest ? rest : c;
                it[m] = (model_step_item){seq[i], prompts[i] + fed[i], c,
                                          c == rest ? lg + (size_t)m * (size_t)v : NULL, NULL, c};
                fed[i] += c;
            } else {
                it[m] = (model_step_item){seq[i], &out[i * steps + ng[i] - 1], 1,
                                          lg + (size_t)m * (size_t)v, NULL, 0};
            }
            who[m++] = i;
        }
        if (m == 0) {
            bool all = true;
            for (int i = 0; i < n; i++)
                all = all && ng[i] >= steps;
            if (all)
                break;
            continue;
        }
        cr_assert_eq(model_step(rt, it, m, &err), MT_OK, "%s", err.msg);
        for (int k = 0; k < m; k++)
            if (it[k].logits) {
                int i = who[k];
                out[i * steps + ng[i]] = argmax(it[k].logits, v);
                ng[i]++;
            }
    }
    for (int i = 0; i < n; i++)
        model_seq_free(rt, seq[i]);
    free(lg);
    free(seq);
    free(fed);
    free(ng);
    free(who);
    free(it);
}

/* The greedy tokens of each prompt alone (ref[i * steps + k]), and whether
 * they are the same under two batched schedules as well. The runtime's
 * results can depend on how a step is composed (a near-tie in a discrete
 * choice, e.g. a top-k, flips with the accumulation order of a larger M);
 * a prompt whose greedy tokens move that way in the runtime itself cannot
 * test the server's batching, so callers compare stable prompts only and
 * report how many were left out. Returns the number of stable prompts. */
__attribute__((unused)) static int greedy_stable(model_runtime *rt, const int32_t *const *prompts,
                                                 const int *lens, int n, int steps, int32_t *ref,
                                                 bool *stable)
{
    mt_rng rng;
    mt_rng_seed(&rng, 12345);
    int32_t *a = malloc(sizeof(int32_t) * (size_t)(n * steps)),
            *b = malloc(sizeof(int32_t) * (size_t)(n * steps));
    for (int i = 0; i < n; i++)
        greedy_reference(rt, prompts[i], lens[i], steps, ref + i * steps);
    greedy_scheduled(rt, prompts, lens, n, steps, 0, &rng, a);
    greedy_scheduled(rt, prompts, lens, n, steps, 1, &rng, b);
    int count = 0;
    for (int i = 0; i < n; i++) {
        size_t sz = sizeof(int32_t) * (size_t)steps;
        stable[i] = !memcmp(ref + i * steps, a + i * steps, sz) &&
                    !memcmp(ref + i * steps, b + i * steps, sz);
        count += stable[i];
    }
    free(a);
    free(b);
    return count;
}

__attribute__((unused)) static model_runtime *reference_open(const tsrv *t)
{
    model_runtime_opts o;
    memset(&o, 0, sizeof o);
    o.model_dir = t->dir;
    o.device = "cpu";
    o.log = t->log;
    model_runtime *rt;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_runtime_open(&o, &rt, &err), MT_OK, "%s", err.msg);
    return rt;
}

/* "[a,b,c]" for a JSON body. */
__attribute__((unused)) static char *ids_json(const int32_t *ids, int n)
{
    serve_buf b = SERVE_BUF_INIT;
    serve_buf_puts(&b, "[");
    for (int i = 0; i < n; i++)
        serve_buf_printf(&b, i ? ",%d" : "%d", (int)ids[i]);
    serve_buf_puts(&b, "]");
    return serve_buf_detach(&b, NULL);
}

#endif
