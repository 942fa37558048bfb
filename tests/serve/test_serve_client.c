/* test_serve_client.c: the loopback HTTP client against a scripted socket
 * server: bodies by Content-Length, by chunked coding (written a few bytes
 * at a time, with extensions and trailers) and until close; the request it
 * sends; a callback that aborts; an answer sent before the request body was
 * read; timeouts; URLs (loopback only). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/rng.h"
#include "serve/serve_client.h"

typedef struct script {
    int lfd, port;
    const char *reply;  /* written in pieces of `piece` bytes */
    size_t piece;
    bool read_body;     /* read the request body (by Content-Length) before answering */
    double delay_s;     /* before answering */
    char request[1 << 16];
    size_t request_len;
} script;

static void *server_main(void *arg)
{
    script *s = arg;
    int fd = accept(s->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    /* The head. */
    while (s->request_len < sizeof s->request - 1 && !strstr(s->request, "\r\n\r\n")) {
        ssize_t r = recv(fd, s->request + s->request_len, sizeof s->request - 1 - s->request_len, 0);
        if (r <= 0)
            break;
        s->request_len += (size_t)r;
        s->request[s->request_len] = 0;
    }
    if (s->read_body) {
        const char *cl = strcasestr(s->request, "Content-Length:");
        size_t want = cl ? strtoul(cl + 15, NULL, 10) : 0;
        size_t have = s->request_len - (size_t)(strstr(s->request, "\r\n\r\n") + 4 - s->request);
        /* Kept in request[] too: the client may send the body in its own
         * segment, after the head. */
        while (have < want && s->request_len < sizeof s->request - 1) {
            ssize_t r = recv(fd, s->request + s->request_len,
                             sizeof s->request - 1 - s->request_len, 0);
            if (r <= 0)
                break;
            have += (size_t)r;
            s->request_len += (size_t)r;
            s->request[s->request_len] = 0;
        }
    }
    if (s->delay_s > 0)
        usleep((useconds_t)(s->delay_s * 1e6));
    size_t n = strlen(s->reply);
    for (size_t at = 0; at < n; at += s->piece) {
        size_t k = n - at < s->piece ? n - at : s->piece;
        if (send(fd, s->reply + at, k, MSG_NOSIGNAL) < 0)
            break;
        usleep(200);
    }
    close(fd);
    return NULL;
}

static pthread_t start(script *s)
{
    signal(SIGPIPE, SIG_IGN);
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(s->lfd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(s->lfd, 4), 0);
    socklen_t len = sizeof a;
    getsockname(s->lfd, (struct sockaddr *)&a, &len);
    s->port = ntohs(a.sin_port);
    pthread_t t;
    pthread_create(&t, NULL, server_main, s);
    return t;
}

static void finish(script *s, pthread_t t)
{
    pthread_join(t, NULL);
    close(s->lfd);
}

static serve_url url_of(const script *s)
{
    char u[64];
    snprintf(u, sizeof u, "http://127.0.0.1:%d", s->port);
    serve_url url;
    cr_assert_eq(serve_url_parse(u, &url, NULL), MT_OK);
    return url;
}

Test(serve_client, content_length_body_and_the_request_sent)
{
    static script s = {.reply = "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                                "Content-Length: 11\r\nX-A:  b \r\n\r\n{\"ok\":true}ignored",
                       .piece = 3,
                       .read_body = true};
    pthread_t t = start(&s);
    serve_url u = url_of(&s);
    serve_client_resp r = SERVE_CLIENT_RESP_INIT;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_client_request(&u, "POST", "/v1/x", "{\"a\":1}", 7, 5, NULL, NULL, &r, &err),
                 MT_OK, "%s", err.msg);
    finish(&s, t);
    cr_assert_eq(r.status, 201);
    cr_assert_str_eq(r.body.data, "{\"ok\":true}");
    char v[32];
    cr_assert(serve_client_header(&r, "x-a", v, sizeof v));
    cr_assert_str_eq(v, "b");
    cr_assert(strstr(s.request, "POST /v1/x HTTP/1.1\r\n") == s.request);
    cr_assert_not_null(strstr(s.request, "Content-Length: 7\r\n"));
    cr_assert_not_null(strstr(s.request, "\r\n\r\n{\"a\":1}"));
    serve_client_resp_release(&r);
}

Test(serve_client, chunked_body_in_small_pieces)
{
    static script s = {.reply = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                "5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n"
                                "0\r\nTrailer: x\r\n\r\n",
                       .piece = 2};
    pthread_t t = start(&s);
    serve_url u = url_of(&s);
    serve_client_resp r = SERVE_CLIENT_RESP_INIT;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_client_request(&u, "GET", "/", NULL, 0, 5, NULL, NULL, &r, &err), MT_OK,
                 "%s", err.msg);
    finish(&s, t);
    cr_assert_str_eq(r.body.data, "hello 0123456789");
    serve_client_resp_release(&r);
}

Test(serve_client, body_until_close)
{
    static script s = {.reply = "HTTP/1.0 200 OK\r\n\r\nuntil the end", .piece = 4};
    pthread_t t = start(&s);
    serve_url u = url_of(&s);
    serve_client_resp r = SERVE_CLIENT_RESP_INIT;
    cr_assert_eq(serve_client_request(&u, "GET", "/", NULL, 0, 5, NULL, NULL, &r, NULL), MT_OK);
    finish(&s, t);
    cr_assert_str_eq(r.body.data, "until the end");
    serve_client_resp_release(&r);
}

static bool stop_at_world(void *ctx, const char *p, size_t n)
{
    serve_buf *b = ctx;
    serve_buf_append(b, p, n);
    return !strstr(b->data, "world");
}

Test(serve_client, callback_aborts)
{
    static script s = {.reply = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                "6\r\nhello \r\n5\r\nworld\r\n5\r\nnever\r\n0\r\n\r\n",
                       .piece = 1};
    pthread_t t = start(&s);
    serve_url u = url_of(&s);
    serve_client_resp r = SERVE_CLIENT_RESP_INIT;
    serve_buf got = SERVE_BUF_INIT;
    cr_assert_eq(serve_client_request(&u, "GET", "/", NULL, 0, 5, stop_at_world, &got, &r, NULL),
                 MT_OK);
    finish(&s, t);
    cr_assert(r.aborted);
    cr_assert_null(strstr(got.data, "never"));
    serve_buf_release(&got);
    serve_client_resp_release(&r);
}

Test(serve_client, early_answer_before_the_body_is_read)
{
    static script s = {.reply = "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 2\r\n"
                                "Connection: close\r\n\r\n{}",
                       .piece = 64};
    pthread_t t = start(&s);
    serve_url u = url_of(&s);
    size_t big = 32u << 20;
    char *body = malloc(big);
    memset(body, 'x', big);
    serve_client_resp r = SERVE_CLIENT_RESP_INIT;
    mt_err err = MT_ERR_INIT;
    mt_status st = serve_client_request(&u, "POST", "/", body, big, 10, NULL, NULL, &r, &err);
    finish(&s, t);
    /* The server closed with most of the body unread: a reset may beat the
     * answer, which is then an I/O error; never a hang or a crash. */
    cr_assert(st == MT_OK || st == MT_E_IO, "%s", err.msg);
    if (st == MT_OK)
        cr_assert_eq(r.status, 413);
    free(body);
    serve_client_resp_release(&r);
}

Test(serve_client, silent_server_times_out)
{
    static script s = {.reply = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", .piece = 64,
                       .delay_s = 1.0};
    pthread_t t = start(&s);
    serve_url u = url_of(&s);
    serve_client_resp r = SERVE_CLIENT_RESP_INIT;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_client_request(&u, "GET", "/", NULL, 0, 0.2, NULL, NULL, &r, &err),
                 MT_E_TIMEOUT);
    finish(&s, t);
    serve_client_resp_release(&r);
}

Test(serve_client, urls_are_loopback_only)
{
    serve_url u;
    cr_assert_eq(serve_url_parse("http://127.0.0.1:8080/base/", &u, NULL), MT_OK);
    cr_assert_eq(u.port, 8080);
    cr_assert_str_eq(u.base, "/base");
    cr_assert_eq(serve_url_parse("http://localhost", &u, NULL), MT_OK);
    cr_assert_eq(u.port, 80);
    cr_assert_eq(u.addr, 0x7f000001u);
    cr_assert_eq(serve_url_parse("http://127.1.2.3:1", &u, NULL), MT_OK);
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_url_parse("http://10.0.0.1:80", &u, &err), MT_E_INVALID);
    cr_assert_not_null(strstr(err.msg, "loopback"));
    cr_assert_eq(serve_url_parse("http://example.com", &u, NULL), MT_E_INVALID);
    cr_assert_eq(serve_url_parse("https://127.0.0.1", &u, NULL), MT_E_INVALID);
    cr_assert_eq(serve_url_parse("http://127.0.0.1:99999", &u, NULL), MT_E_INVALID);
    cr_assert_eq(serve_url_parse("http://:80", &u, NULL), MT_E_INVALID);
}
