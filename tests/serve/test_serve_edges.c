/* test_serve_edges.c: the API's edges as clients meet them, over HTTP on
 * the tiny model: /detokenize keeps U+0000; a tool whose parameters are not
 * an object is a 400 naming it; GET /v1/models/{id}; HEAD has no body; a
 * key written twice counts with its last value; the usage chunk only when
 * asked; ids that do not repeat; completions' text_offset in characters of
 * the returned text (tokens joined are the text); a body past --max-body
 * sent without waiting gets the 413, not a reset; a non-streaming client
 * that leaves frees its sequence at once. */
#include <arpa/inet.h>
#include <sys/socket.h>

#include "test_serve_util.h"

static tsrv T;

static void start(void) { tsrv_start(&T, NULL); }
static void stop(void) { tsrv_stop(&T); }

TestSuite(serve_edges, .init = start, .fini = stop, .timeout = 900);

/* ---- raw sockets --------------------------------------------------------------- */

static int connect_server(const tsrv *t)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)t->url.port)};
    a.sin_addr.s_addr = htonl(0x7f000001);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        cr_assert_gt(w, 0);
        p += w;
        n -= (size_t)w;
    }
}

/* Everything the server sends until it closes (NUL-terminated). */
static char *read_all(int fd, size_t *len)
{
    serve_buf b = SERVE_BUF_INIT;
    char buf[4096];
    ssize_t r;
    while ((r = recv(fd, buf, sizeof buf, 0)) > 0)
        serve_buf_append(&b, buf, (size_t)r);
    serve_buf_puts(&b, "");
    return serve_buf_detach(&b, len);
}

/* ---- the small things ---------------------------------------------------------- */

Test(serve_edges, detokenize_keeps_u0000)
{
    /* Ids 0, 97, 98 are the byte tokens of NUL, 'a' and 'b' (as /tokenize says). */
    cJSON *j;
    cr_assert_eq(http(&T, "POST", "/tokenize", "{\"prompt\":\"a\\u0000b\"}", &j, NULL), 200);
    cJSON *toks = cJSON_GetObjectItem(j, "tokens");
    char body[256] = "{\"tokens\":[";
    for (int i = 0; i < cJSON_GetArraySize(toks); i++)
        snprintf(body + strlen(body), sizeof body - strlen(body), "%s%d", i ? "," : "",
                 cJSON_GetArrayItem(toks, i)->valueint);
    strcat(body, "]}");
    cJSON_Delete(j);
    char *raw = NULL;
    cr_assert_eq(http(&T, "POST", "/detokenize", body, NULL, &raw), 200);
    cr_assert_not_null(strstr(raw, "\"prompt\":\"a\\u0000b\""), "%s", raw);
    free(raw);
    cr_assert_eq(http(&T, "POST", "/detokenize", "{\"tokens\":[97,0,98]}", NULL, &raw), 200);
    cr_assert_not_null(strstr(raw, "\\u0000"), "%s", raw);
    free(raw);
}

Test(serve_edges, tool_parameters_that_are_not_an_object_are_a_400)
{
    const char *bad[] = {"\"obj\"", "[]", "7", "true"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1,"
                 "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                 "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":%s}}]}",
                 bad[i]);
        cJSON *j;
        cr_assert_eq(http(&T, "POST", "/v1/chat/completions", body, &j, NULL), 400, "%s", bad[i]);
        assert_error_shape(j, body);
        cr_assert_str_eq(
            cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "param")->valuestring,
            "tools[1].function.parameters");
        cJSON_Delete(j);
    }
}

Test(serve_edges, models_by_id)
{
    const char *id = strrchr(T.dir, '/') + 1;
    char path[600];
    snprintf(path, sizeof path, "/v1/models/%s", id);
    cJSON *j;
    cr_assert_eq(http(&T, "GET", path, NULL, &j, NULL), 200);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "id")->valuestring, id);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "model");
    cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(j, "created")));
    cr_assert_str_eq(cJSON_GetObjectItem(j, "owned_by")->valuestring, "moetune");
    cJSON_Delete(j);
    cr_assert_eq(http(&T, "GET", "/v1/models/no-such-model", NULL, &j, NULL), 404);
    assert_error_shape(j, "unknown model");
    cJSON *e = cJSON_GetObjectItem(j, "error");
    cr_assert_str_eq(cJSON_GetObjectItem(e, "code")->valuestring, "model_not_found");
    cr_assert_str_eq(cJSON_GetObjectItem(e, "type")->valuestring, "invalid_request_error");
    cr_assert_str_eq(cJSON_GetObjectItem(e, "param")->valuestring, "model");
    cJSON_Delete(j);
    cr_assert_eq(http(&T, "POST", path, "{}", &j, NULL), 405);
    cJSON_Delete(j);
}

/* The bytes after the header block of a raw HEAD exchange. */
static void head_has_no_body(const char *path, int want_status)
{
    int fd = connect_server(&T);
    char req[512];
    snprintf(req, sizeof req, "HEAD %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
             path);
    send_all(fd, req, strlen(req));
    size_t n;
    char *all = read_all(fd, &n);
    close(fd);
    int st = 0;
    cr_assert_eq(sscanf(all, "HTTP/1.1 %d", &st), 1, "%s", all);
    cr_assert_eq(st, want_status, "HEAD %s: %s", path, all);
    char *end = strstr(all, "\r\n\r\n");
    cr_assert_not_null(end, "%s", all);
    cr_assert_eq(n, (size_t)(end + 4 - all), "HEAD %s sent a body: %s", path, end + 4);
    free(all);
}

Test(serve_edges, head_responses_have_no_body)
{
    head_has_no_body("/health", 200);
    head_has_no_body("/v1/models", 200);
    head_has_no_body("/metrics", 200);
    head_has_no_body("/v1/completions", 405);
    head_has_no_body("/nowhere", 404);
}

Test(serve_edges, a_repeated_key_counts_with_its_last_value)
{
    cJSON *j;
    cr_assert_eq(http(&T, "POST", "/v1/completions",
                      "{\"prompt\":[1,2,3],\"max_tokens\":1,\"temperature\":0,\"ignore_eos\":true,"
                      "\"max_tokens\":3}",
                      &j, NULL),
                 200);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")->valueint,
                 3);
    cJSON_Delete(j);
    /* Nested objects too: the last include_usage wins. */
    tstream s;
    memset(&s, 0, sizeof s);
    cr_assert_eq(tstream_run(&T, "/v1/completions",
                             "{\"prompt\":[1,2,3],\"max_tokens\":2,\"stream\":true,"
                             "\"stream_options\":{\"include_usage\":false,\"include_usage\":true}}",
                             &s),
                 200);
    cr_assert_eq(s.usage_events, 1);
    cJSON_Delete(s.usage);
    /* A bad value that a later one replaces is not an error. */
    cr_assert_eq(http(&T, "POST", "/v1/completions",
                      "{\"prompt\":[1,2,3],\"max_tokens\":-5,\"max_tokens\":2}", &j, NULL),
                 200);
    cJSON_Delete(j);
}

Test(serve_edges, the_usage_chunk_only_when_asked)
{
    const char *bodies[] = {
        "{\"prompt\":[1,2,3],\"max_tokens\":2,\"stream\":true}",
        "{\"prompt\":[1,2,3],\"max_tokens\":2,\"stream\":true,\"stream_options\":{}}",
        "{\"prompt\":[1,2,3],\"max_tokens\":2,\"stream\":true,\"stream_options\":"
        "{\"include_usage\":false}}",
        "{\"prompt\":[1,2,3],\"max_tokens\":2,\"stream\":true,\"stream_options\":"
        "{\"include_usage\":true}}",
    };
    for (int i = 0; i < 4; i++) {
        tstream s;
        memset(&s, 0, sizeof s);
        cr_assert_eq(tstream_run(&T, "/v1/completions", bodies[i], &s), 200);
        cr_assert(s.done);
        cr_assert_eq(s.usage_events, i == 3 ? 1 : 0, "%s", bodies[i]);
        cJSON_Delete(s.usage);
    }
}

static bool hex_id(const char *id, const char *prefix)
{
    size_t p = strlen(prefix);
    if (strncmp(id, prefix, p) || strlen(id) < p + 24)
        return false;
    for (const char *c = id + p; *c; c++)
        if (!strchr("0123456789abcdef", *c))
            return false;
    return true;
}

Test(serve_edges, ids_are_random_not_counters)
{
    char seen[8][64];
    for (int i = 0; i < 8; i++) {
        cJSON *j;
        cr_assert_eq(http(&T, "POST", i % 2 ? "/v1/chat/completions" : "/v1/completions",
                          i % 2 ? "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                  "\"max_tokens\":1}"
                                : "{\"prompt\":[1,2],\"max_tokens\":1}",
                          &j, NULL),
                     200);
        const char *id = cJSON_GetObjectItem(j, "id")->valuestring;
        cr_assert(hex_id(id, i % 2 ? "chatcmpl-" : "cmpl-"), "%s", id);
        snprintf(seen[i], sizeof seen[i], "%s", id);
        for (int k = 0; k < i; k++)
            cr_assert_str_neq(seen[k], seen[i]);
        cJSON_Delete(j);
    }
}

/* ---- text_offset --------------------------------------------------------------- */

static size_t chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

Test(serve_edges, text_offset_counts_characters_of_the_returned_text)
{
    /* Sampled at temperature 2 over the byte tokens: characters split over
     * tokens and invalid bytes (U+FFFD) come up in a few seeds. */
    int non_ascii = 0, checked = 0;
    for (int seed = 1; seed <= 16; seed++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"prompt\":[%d,%d,%d],\"max_tokens\":48,\"temperature\":2,\"seed\":%d,"
                 "\"ignore_eos\":true,\"logprobs\":2}",
                 200 + seed, 150 + seed, 201, seed);
        cJSON *j;
        char *raw;
        cr_assert_eq(http(&T, "POST", "/v1/completions", body, &j, &raw), 200);
        bool nul = strstr(raw, "\\u0000") != NULL; /* cJSON's strings end at a NUL */
        free(raw);
        if (nul) {
            cJSON_Delete(j);
            continue;
        }
        checked++;
        cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        cJSON *lp = cJSON_GetObjectItem(c, "logprobs");
        cJSON *toks = cJSON_GetObjectItem(lp, "tokens"), *offs = cJSON_GetObjectItem(lp, "text_offset");
        cr_assert_eq(cJSON_GetArraySize(toks), 48);
        serve_buf joined = SERVE_BUF_INIT;
        for (int i = 0; i < 48; i++) {
            double off = cJSON_GetArrayItem(offs, i)->valuedouble;
            cr_assert_eq(off, (double)chars(joined.data ? joined.data : "", joined.len),
                         "seed %d token %d", seed, i);
            serve_buf_puts(&joined, cJSON_GetArrayItem(toks, i)->valuestring);
        }
        cr_assert_str_eq(joined.data ? joined.data : "", text, "seed %d: tokens joined", seed);
        for (const char *p = text; *p; p++)
            non_ascii += (unsigned char)*p >= 0x80;
        serve_buf_release(&joined);
        cJSON_Delete(j);
    }
    cr_assert_geq(checked, 6, "only %d samples without U+0000", checked);
    cr_assert_gt(non_ascii, 0, "the samples held no non-ASCII text: the test tested nothing");
}

/* ---- 413 without Expect --------------------------------------------------------- */

typedef struct body_writer {
    int fd;
    size_t n;
    size_t sent;
} body_writer;

static void *write_body(void *arg)
{
    body_writer *w = arg;
    static char chunk[1 << 16];
    memset(chunk, 'x', sizeof chunk);
    while (w->sent < w->n) {
        size_t k = w->n - w->sent < sizeof chunk ? w->n - w->sent : sizeof chunk;
        ssize_t r = send(w->fd, chunk, k, MSG_NOSIGNAL);
        if (r <= 0)
            break; /* the server closed: what it answered is read by the other side */
        w->sent += (size_t)r;
    }
    return NULL;
}

Test(serve_edges, a_body_past_max_body_sent_without_waiting_gets_the_413)
{
    const char *ctr = "moetune_requests_total{endpoint=\"chat.completions\",outcome=\"error\"}";
    double errors0 = metric(&T, ctr);
    int fd = connect_server(&T);
    size_t n = 50u << 20;
    char head[256];
    snprintf(head, sizeof head,
             "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
             "application/json\r\nContent-Length: %zu\r\n\r\n",
             n);
    send_all(fd, head, strlen(head));
    /* As a client that writes its whole request before it reads: the
     * server must take the body in (or the writes fail with a reset or a
     * broken pipe, and such a client never sees the answer). */
    body_writer w = {fd, n, 0};
    write_body(&w);
    cr_assert_eq(w.sent, n, "the server stopped reading after %zu of %zu bytes", w.sent, n);
    size_t len;
    char *all = read_all(fd, &len);
    close(fd);
    int st = 0;
    cr_assert_eq(sscanf(all, "HTTP/1.1 %d", &st), 1, "no response (%zu bytes read): %s", len, all);
    cr_assert_eq(st, 413);
    char *body = strstr(all, "\r\n\r\n");
    cr_assert_not_null(body);
    cJSON *j = cJSON_Parse(body + 4);
    assert_error_shape(j, body + 4);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code")->valuestring,
                     "request_too_large");
    cJSON_Delete(j);
    free(all);
    cr_assert_eq(metric(&T, ctr), errors0 + 1, "one request, counted once");
    cr_assert_eq(http(&T, "GET", "/health", NULL, NULL, NULL), 200);
}

/* ---- a plain client that leaves ------------------------------------------------- */

Test(serve_edges, a_plain_client_that_leaves_frees_its_sequence)
{
    double base = metric(&T, "moetune_kv_pages_used");
    double cancelled0 = metric(&T, "moetune_requests_cancelled_total");
    int fd = connect_server(&T);
    const char *body = "{\"prompt\":[7,8,9,10,11],\"max_tokens\":3000,\"temperature\":0,"
                       "\"ignore_eos\":true}";
    char req[512];
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
             "application/json\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    send_all(fd, req, strlen(req));
    double gen0 = metric(&T, "moetune_generation_tokens_total"), gen = gen0;
    for (int i = 0; i < 600 && gen - gen0 < 20; i++) {
        usleep(10000);
        gen = metric(&T, "moetune_generation_tokens_total");
    }
    cr_assert_geq(gen - gen0, 20, "the request is generating");
    cr_assert_eq(metric(&T, "moetune_requests_running"), 1);
    close(fd);
    uint64_t t0 = mt_now_ns();
    double at_close = metric(&T, "moetune_generation_tokens_total");
    double running = 1;
    for (int i = 0; i < 500 && running; i++) {
        running = metric(&T, "moetune_requests_running");
        if (running)
            usleep(2000);
    }
    double ms = (double)(mt_now_ns() - t0) * 1e-6;
    double after = metric(&T, "moetune_generation_tokens_total");
    cr_assert_eq(running, 0, "still running %.0f ms after the client left", ms);
    cr_log_info("plain disconnect: freed %.1f ms after close, %g tokens generated meanwhile", ms,
                after - at_close);
    cr_assert_lt(after - at_close, 50, "generation went on after the client left");
    cr_assert_eq(metric(&T, "moetune_kv_pages_used"), base);
    cr_assert_eq(metric(&T, "moetune_requests_cancelled_total"), cancelled0 + 1);
    cr_assert_eq(metric(&T, "moetune_requests_total{endpoint=\"completions\",outcome=\"cancelled\"}"),
                 1);
}

/* ---- a streaming client that leaves while it waits --------------------------------- */

static int send_request(const tsrv *t, const char *body)
{
    int fd = connect_server(t);
    char req[1024];
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
             "application/json\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    send_all(fd, req, strlen(req));
    return fd;
}

/* One running slot (a server of its own, beside the suite's): a streamed
 * request queued behind a long one writes nothing (no token, no keep-alive
 * yet); its client leaving is noticed by polling the socket, and it leaves
 * the queue at the engine's next step. */
Test(serve_edges, a_streaming_client_that_leaves_while_queued_is_dropped)
{
    tsrv t;
    serve_server_opts o;
    memset(&o, 0, sizeof o);
    o.engine.max_batch = 1;
    o.keepalive_s = 30; /* no keep-alive write to notice it by */
    tsrv_start(&t, &o);
    int a = send_request(&t, "{\"prompt\":[7,8,9],\"max_tokens\":3000,\"temperature\":0,"
                             "\"ignore_eos\":true}");
    for (int i = 0; i < 500 && metric(&t, "moetune_requests_running") < 1; i++)
        usleep(10000);
    int b = send_request(&t, "{\"prompt\":[1,2,3],\"max_tokens\":50,\"stream\":true}");
    double waiting = 0;
    for (int i = 0; i < 500 && waiting < 1; i++) {
        waiting = metric(&t, "moetune_requests_waiting");
        if (waiting < 1)
            usleep(10000);
    }
    cr_assert_eq(waiting, 1, "the streamed request waits for the slot");
    close(b);
    uint64_t t0 = mt_now_ns();
    for (int i = 0; i < 500 && waiting > 0; i++) {
        waiting = metric(&t, "moetune_requests_waiting");
        if (waiting > 0)
            usleep(5000);
    }
    double ms = (double)(mt_now_ns() - t0) * 1e-6;
    cr_assert_eq(waiting, 0, "still queued %.0f ms after its client left", ms);
    cr_assert_lt(ms, 2000, "dropped %.0f ms after its client left", ms);
    cr_assert_eq(metric(&t, "moetune_requests_cancelled_total"), 1);
    cr_assert_eq(metric(&t, "moetune_requests_running"), 1, "the long one goes on");
    close(a);
    tsrv_stop(&t);
}
