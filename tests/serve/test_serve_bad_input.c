/* test_serve_bad_input.c: bad requests over real HTTP get 4xx errors in
 * OpenAI's shape and the server keeps serving: malformed JSON, wrong types,
 * negative and huge max_tokens, a prompt longer than the context, prompt
 * plus max_tokens past it, an oversized body (declared, and chunked without
 * a length), unknown routes, wrong methods, a garbage request line. With a
 * KV pool too small for all requests at once, requests wait (or are
 * preempted) and still all finish with the right tokens, and one that could
 * never fit is refused up front. */
#include <pthread.h>
#include <sys/stat.h>

#include "test_serve_util.h"

static void expect_error(const tsrv *t, const char *method, const char *path, const char *body,
                         int want_status, const char *want_param)
{
    cJSON *j = NULL;
    char *raw = NULL;
    int st = http(t, method, path, body, &j, &raw);
    cr_assert_eq(st, want_status, "%s %s %.80s: status %d, want %d: %s", method, path,
                 body ? body : "", st, want_status, raw);
    assert_error_shape(j, raw);
    if (want_param) {
        cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "param");
        cr_assert(cJSON_IsString(p) && !strcmp(p->valuestring, want_param),
                  "%s: param should be %s", raw, want_param);
    }
    cJSON_Delete(j);
    free(raw);
}

static void still_serving(const tsrv *t)
{
    cJSON *j;
    cr_assert_eq(http(t, "GET", "/health", NULL, &j, NULL), 200);
    cJSON_Delete(j);
    cr_assert_eq(http(t, "POST", "/v1/completions",
                      "{\"prompt\":[5,6,7],\"max_tokens\":3,\"temperature\":0}", &j, NULL),
                 200);
    cJSON_Delete(j);
}

static int raw_status(const tsrv *t, const char *bytes, size_t n, char **body)
{
    serve_client_resp r = SERVE_CLIENT_RESP_INIT;
    mt_err err = MT_ERR_INIT;
    mt_status st = serve_client_raw(&t->url, bytes, n, 30, &r, &err);
    int status = st == MT_OK ? r.status : -1;
    if (body)
        *body = serve_buf_detach(&r.body, NULL);
    serve_client_resp_release(&r);
    return status;
}

Test(serve_bad_input, bad_requests_get_openai_errors_and_the_server_keeps_serving)
{
    tsrv t;
    tsrv_start(&t, NULL);
    const char *C = "/v1/completions", *H = "/v1/chat/completions";
    expect_error(&t, "POST", C, "{\"prompt\": \"unterminated", 400, NULL);
    expect_error(&t, "POST", C, "not json at all", 400, NULL);
    expect_error(&t, "POST", C, "", 400, NULL);
    expect_error(&t, "POST", C, "[\"an array\"]", 400, NULL);
    expect_error(&t, "POST", C, "{\"prompt\":42}", 400, "prompt");
    expect_error(&t, "POST", C, "{\"prompt\":\"x\",\"max_tokens\":\"8\"}", 400, "max_tokens");
    expect_error(&t, "POST", C, "{\"prompt\":\"x\",\"max_tokens\":-5}", 400, "max_tokens");
    expect_error(&t, "POST", C, "{\"prompt\":\"x\",\"max_tokens\":99999999999}", 400, "max_tokens");
    expect_error(&t, "POST", C, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "temperature");
    expect_error(&t, "POST", C, "{\"prompt\":\"x\",\"stream\":1}", 400, "stream");
    expect_error(&t, "POST", C, "{\"prompt\":\"x\",\"stop\":[1]}", 400, "stop[0]");
    expect_error(&t, "POST", C, "{\"prompt\":[1,2,100000]}", 400, "prompt[2]");
    expect_error(&t, "POST", H, "{\"messages\":\"hello\"}", 400, "messages");
    expect_error(&t, "POST", H, "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400,
                 "messages[0].role");
    /* Longer than the context (4096 tokens), and prompt + max_tokens past it. */
    int32_t *ids = malloc(5000 * sizeof *ids);
    for (int i = 0; i < 5000; i++)
        ids[i] = 16 + i % 400;
    char *pj = ids_json(ids, 5000);
    char *body = malloc(strlen(pj) + 128);
    sprintf(body, "{\"prompt\":%s}", pj);
    expect_error(&t, "POST", C, body, 400, "prompt");
    free(pj);
    pj = ids_json(ids, 4000);
    sprintf(body, "{\"prompt\":%s,\"max_tokens\":200}", pj);
    expect_error(&t, "POST", C, body, 400, "prompt");
    free(pj);
    free(body);
    free(ids);
    /* An oversized body: 9 MiB against the 8 MiB limit. */
    size_t big = 9u << 20;
    char *huge = malloc(big + 1);
    memset(huge, ' ', big);
    memcpy(huge, "{\"prompt\":\"", 11);
    huge[big - 2] = '"';
    huge[big - 1] = '}';
    huge[big] = 0;
    cJSON *j = NULL;
    char *raw = NULL;
    int st = http(&t, "POST", C, huge, &j, &raw);
    cr_assert_eq(st, 413, "%d %s", st, raw);
    assert_error_shape(j, raw);
    cJSON_Delete(j);
    free(raw);
    free(huge);
    /* The same without a length: chunked, cut off at the limit. */
    serve_buf chunked = SERVE_BUF_INIT;
    serve_buf_puts(&chunked, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                             "application/json\r\nTransfer-Encoding: chunked\r\n"
                             "Connection: close\r\n\r\n");
    char block[65536];
    memset(block, ' ', sizeof block);
    for (int i = 0; i < 140; i++) { /* 140 x 64 KiB = 8.75 MiB */
        serve_buf_printf(&chunked, "%zx\r\n", sizeof block);
        serve_buf_append(&chunked, block, sizeof block);
        serve_buf_puts(&chunked, "\r\n");
    }
    serve_buf_puts(&chunked, "0\r\n\r\n");
    char *rb = NULL;
    cr_assert_eq(raw_status(&t, chunked.data, chunked.len, &rb), 413, "%s", rb);
    j = cJSON_Parse(rb);
    assert_error_shape(j, rb);
    cJSON_Delete(j);
    free(rb);
    serve_buf_release(&chunked);
    /* Routes and methods. */
    expect_error(&t, "GET", "/v1/nowhere", NULL, 404, NULL);
    expect_error(&t, "POST", "/v2/completions", "{}", 404, NULL);
    expect_error(&t, "GET", C, NULL, 405, NULL);
    expect_error(&t, "DELETE", H, NULL, 405, NULL);
    expect_error(&t, "POST", "/health", "{}", 405, NULL);
    expect_error(&t, "PUT", "/metrics", "{}", 405, NULL);
    serve_client_resp r = SERVE_CLIENT_RESP_INIT;
    cr_assert_eq(serve_client_request(&t.url, "GET", "/v1/completions", NULL, 0, 10, NULL, NULL,
                                      &r, NULL),
                 MT_OK);
    char allow[32];
    cr_assert(serve_client_header(&r, "Allow", allow, sizeof allow));
    cr_assert_str_eq(allow, "POST");
    serve_client_resp_release(&r);
    /* Not HTTP at all. */
    const char *garbage = "\x01\x02 nonsense \r\n\r\n";
    int gs = raw_status(&t, garbage, strlen(garbage), NULL);
    cr_assert(gs == -1 || (gs >= 400 && gs < 500), "garbage got %d", gs);
    still_serving(&t);
    cr_assert_geq(metric(&t, "moetune_requests_total{endpoint=\"completions\",outcome=\"error\"}"),
                  14);
    tsrv_stop(&t);
}

/* ---- a KV pool smaller than the load -------------------------------------------------- */

#define NPRESS 6
#define PRESS_TOKENS 40

typedef struct press {
    const tsrv *t;
    int32_t prompt[200];
    int status;
    int32_t got[PRESS_TOKENS];
    int n_got;
} press;

static void *press_main(void *arg)
{
    press *p = arg;
    char *pj = ids_json(p->prompt, 200);
    char *body = malloc(strlen(pj) + 200);
    sprintf(body,
            "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,"
            "\"return_token_ids\":true}",
            pj, PRESS_TOKENS);
    cJSON *j = NULL;
    p->status = http(p->t, "POST", "/v1/completions", body, &j, NULL);
    cJSON *ids = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0),
                                     "token_ids");
    p->n_got = cJSON_GetArraySize(ids);
    for (int i = 0; i < p->n_got && i < PRESS_TOKENS; i++)
        p->got[i] = (int32_t)cJSON_GetArrayItem(ids, i)->valuedouble;
    cJSON_Delete(j);
    free(body);
    free(pj);
    return NULL;
}

Test(serve_bad_input, a_full_kv_pool_makes_requests_wait_not_fail)
{
    /* 40 pages of 16 = 640 tokens: room for about two of the six requests
     * (200 prompt + 40 generated = 15 pages each) at a time. */
    serve_server_opts o;
    memset(&o, 0, sizeof o);
    o.engine.rt.kv_pages = 40;
    tsrv t;
    tsrv_start(&t, &o);
    /* A request that can never fit: the context is the pool (640 tokens). */
    int32_t *big = malloc(700 * sizeof *big);
    for (int i = 0; i < 700; i++)
        big[i] = 30 + i % 300;
    char *pj = ids_json(big, 700);
    char *body = malloc(strlen(pj) + 64);
    sprintf(body, "{\"prompt\":%s,\"max_tokens\":4}", pj);
    expect_error(&t, "POST", "/v1/completions", body, 400, "prompt");
    free(body);
    free(pj);
    free(big);
    static press ps[NPRESS];
    pthread_t th[NPRESS];
    for (int i = 0; i < NPRESS; i++) {
        ps[i].t = &t;
        for (int k = 0; k < 200; k++)
            ps[i].prompt[k] = 16 + (int32_t)((i * 131 + k * 17) % 480);
        pthread_create(&th[i], NULL, press_main, &ps[i]);
    }
    for (int i = 0; i < NPRESS; i++)
        pthread_join(th[i], NULL);
    model_runtime *ref = reference_open(&t);
    const int32_t *prompts[NPRESS];
    int lens[NPRESS];
    for (int i = 0; i < NPRESS; i++) {
        prompts[i] = ps[i].prompt;
        lens[i] = 200;
    }
    static int32_t want[NPRESS * PRESS_TOKENS];
    bool stable[NPRESS];
    int n_stable = greedy_stable(ref, prompts, lens, NPRESS, PRESS_TOKENS, want, stable);
    cr_log_info("%d of %d prompts have batch-independent greedy tokens\n", n_stable, NPRESS);
    cr_assert_geq(n_stable, NPRESS / 2);
    for (int i = 0; i < NPRESS; i++) {
        cr_assert_eq(ps[i].status, 200, "request %d", i);
        cr_assert_eq(ps[i].n_got, PRESS_TOKENS, "request %d", i);
        for (int k = 0; stable[i] && k < PRESS_TOKENS; k++)
            cr_assert_eq(ps[i].got[k], want[i * PRESS_TOKENS + k],
                         "request %d token %d: %d, greedy %d", i, k, ps[i].got[k],
                         want[i * PRESS_TOKENS + k]);
    }
    model_runtime_close(ref);
    /* Six were sent at once; the pool held at most two (13 pages of prompt
     * each, plus their growth), so no step ever ran more than two. */
    cr_assert_eq(metric(&t, "moetune_batch_size_bucket{le=\"2\"}"),
                 metric(&t, "moetune_batch_size_count"));
    cr_log_info("preemptions: %g\n", metric(&t, "moetune_preemptions_total"));
    still_serving(&t);
    tsrv_stop(&t);
}

/* Prompts fit, their growth does not: 3 x (40 + 150) tokens need 36 pages
 * of a 20-page pool, so running requests must be preempted (freed and
 * recomputed later); every one still finishes with its greedy tokens. */
/* Each request alone fits the 20-page pool (40 + 250 tokens: 19 pages);
 * any two together do not, and they start at once (a barrier), so they
 * overlap even on a loaded machine (with 150 tokens, started as the
 * threads came up, one ran alone once and nothing was preempted). */
#define NGROW 3
#define GROW_TOKENS 250

static pthread_barrier_t grow_start;

typedef struct grow {
    const tsrv *t;
    int32_t prompt[40];
    int status;
    int32_t got[GROW_TOKENS];
    int n_got;
} grow;

static void *grow_main(void *arg)
{
    grow *g = arg;
    char *pj = ids_json(g->prompt, 40);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,"
             "\"return_token_ids\":true,\"stream\":true}",
             pj, GROW_TOKENS);
    free(pj);
    tstream *s = calloc(1, sizeof *s);
    pthread_barrier_wait(&grow_start);
    g->status = tstream_run(g->t, "/v1/completions", body, s);
    g->n_got = s->done ? s->n_ids : -1;
    memcpy(g->got, s->ids, sizeof g->got);
    cJSON_Delete(s->usage);
    free(s);
    return NULL;
}

Test(serve_bad_input, growth_past_the_pool_preempts_and_still_finishes)
{
    serve_server_opts o;
    memset(&o, 0, sizeof o);
    o.engine.rt.kv_pages = 20;
    o.engine.max_cached = -1; /* no retained sequences to evict first */
    tsrv t;
    tsrv_start(&t, &o);
    static grow gs[NGROW];
    pthread_t th[NGROW];
    pthread_barrier_init(&grow_start, NULL, NGROW);
    for (int i = 0; i < NGROW; i++) {
        gs[i].t = &t;
        for (int k = 0; k < 40; k++)
            gs[i].prompt[k] = 16 + (int32_t)((i * 97 + k * 13) % 480);
        pthread_create(&th[i], NULL, grow_main, &gs[i]);
    }
    for (int i = 0; i < NGROW; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&grow_start);
    double preempted = metric(&t, "moetune_preemptions_total");
    cr_assert_gt(preempted, 0, "the pool never ran short");
    model_runtime *ref = reference_open(&t);
    const int32_t *prompts[NGROW];
    int lens[NGROW];
    for (int i = 0; i < NGROW; i++) {
        prompts[i] = gs[i].prompt;
        lens[i] = 40;
    }
    static int32_t want[NGROW * GROW_TOKENS];
    bool stable[NGROW];
    int n_stable = greedy_stable(ref, prompts, lens, NGROW, GROW_TOKENS, want, stable);
    cr_log_info("%d of %d prompts have batch-independent greedy tokens\n", n_stable, NGROW);
    cr_assert_geq(n_stable, 1);
    for (int i = 0; i < NGROW; i++) {
        cr_assert_eq(gs[i].status, 200, "request %d", i);
        cr_assert_eq(gs[i].n_got, GROW_TOKENS, "request %d", i);
        for (int k = 0; stable[i] && k < GROW_TOKENS; k++)
            cr_assert_eq(gs[i].got[k], want[i * GROW_TOKENS + k],
                         "request %d token %d: %d, greedy %d", i, k, gs[i].got[k],
                         want[i * GROW_TOKENS + k]);
    }
    model_runtime_close(ref);
    cr_log_info("preemptions: %g\n", preempted);
    cr_assert_eq(metric(&t, "moetune_kv_pages_used"), 0);
    still_serving(&t);
    tsrv_stop(&t);
}

/* ---- while loading ------------------------------------------------------------------- */

/* config.json is a FIFO: the loader blocks opening it, so the server is
 * "loading" for as long as we like; writing to it then makes the load fail
 * (a FIFO cannot be sized), and the server says so, still answering. */
Test(serve_bad_input, health_is_503_while_loading_and_after_a_failed_load)
{
    signal(SIGPIPE, SIG_IGN);
    char dir[512];
    tmp_dir_make(dir, sizeof dir, "mt_serve_fifo");
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    cr_assert_eq(mkfifo(cfg, 0600), 0);
    serve_server_opts o;
    memset(&o, 0, sizeof o);
    o.engine.rt.model_dir = dir;
    o.engine.rt.device = "cpu";
    FILE *log = fopen("/dev/null", "w");
    o.engine.rt.log = log;
    o.host = "127.0.0.1";
    serve_server *s;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_server_start(&o, &s, &err), MT_OK, "%s", err.msg);
    tsrv t;
    memset(&t, 0, sizeof t);
    t.s = s;
    snprintf(t.url_text, sizeof t.url_text, "http://127.0.0.1:%d", serve_server_port(s));
    cr_assert_eq(serve_url_parse(t.url_text, &t.url, NULL), MT_OK);
    usleep(200000);
    cJSON *j;
    cr_assert_eq(serve_engine_state_get(serve_server_engine(s), NULL), SERVE_ENGINE_LOADING);
    cr_assert_eq(http(&t, "GET", "/health", NULL, &j, NULL), 503);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code")->valuestring,
                     "loading");
    cJSON_Delete(j);
    expect_error(&t, "POST", "/v1/completions", "{\"prompt\":[1],\"max_tokens\":1}", 503, NULL);
    cr_assert_eq(metric(&t, "moetune_ready"), 0);
    cr_assert_eq(http(&t, "GET", "/v1/models", NULL, &j, NULL), 200);
    cJSON_Delete(j);
    /* Let the loader through: it fails, and the server reports why. */
    FILE *w = fopen(cfg, "w");
    cr_assert_not_null(w);
    fputs("{}", w);
    fclose(w);
    cr_assert_neq(serve_engine_wait_ready(serve_server_engine(s), 60, &err), MT_OK);
    char *raw = NULL;
    cr_assert_eq(http(&t, "GET", "/health", NULL, &j, &raw), 503);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code")->valuestring,
                     "load_failed", "%s", raw);
    cJSON_Delete(j);
    free(raw);
    expect_error(&t, "POST", "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 503, NULL);
    serve_server_stop(s);
    fclose(log);
    unlink(cfg);
    rmdir(dir);
}
