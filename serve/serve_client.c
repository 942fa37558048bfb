/* serve_client.c: blocking loopback HTTP/1.1 client (see serve_client.h). */
#define _GNU_SOURCE /* strcasestr, MSG_NOSIGNAL */
#include "serve_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"

#define MAX_HEADER (64u << 10)

mt_status serve_url_parse(const char *url, serve_url *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    const char *p = url;
    if (strncmp(p, "http://", 7))
        return mt_fail(err, MT_E_INVALID, "url '%s': only http:// URLs are supported", url);
    p += 7;
    size_t hl = strcspn(p, ":/");
    if (hl == 0 || hl >= sizeof out->host)
        return mt_fail(err, MT_E_INVALID, "url '%s': bad host", url);
    memcpy(out->host, p, hl);
    p += hl;
    out->port = 80;
    if (*p == ':') {
        char *end;
        long port = strtol(p + 1, &end, 10);
        if (end == p + 1 || port < 1 || port > 65535 || (*end && *end != '/'))
            return mt_fail(err, MT_E_INVALID, "url '%s': bad port", url);
        out->port = (int)port;
        p = end;
    }
    size_t bl = strlen(p);
    while (bl && p[bl - 1] == '/')
        bl--;
    if (bl >= sizeof out->base)
        return mt_fail(err, MT_E_INVALID, "url '%s': path prefix too long", url);
    memcpy(out->base, p, bl);
    struct in_addr a;
    if (!strcmp(out->host, "localhost"))
        out->addr = 0x7f000001u;
    else if (inet_pton(AF_INET, out->host, &a) == 1)
        out->addr = ntohl(a.s_addr);
    else
        return mt_fail(err, MT_E_INVALID, "url '%s': host must be an IPv4 address or localhost",
                       url);
    if ((out->addr >> 24) != 127)
        return mt_fail(err, MT_E_INVALID,
                       "url '%s': this client talks to loopback (127.0.0.0/8) only", url);
    return MT_OK;
}

/* ---- one connection --------------------------------------------------------- */

typedef enum body_mode { BODY_NONE, BODY_LENGTH, BODY_CHUNKED, BODY_EOF } body_mode;
typedef enum chunk_state { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER, CH_DONE } chunk_state;

typedef struct conn {
    int fd;
    uint64_t deadline_ns;
    serve_client_fn fn;
    void *ctx;
    serve_client_resp *resp;
    mt_err *err;
    /* response parsing */
    serve_buf head;
    bool have_head;
    body_mode mode;
    uint64_t left; /* BODY_LENGTH: bytes left; CH_DATA: bytes left in the chunk */
    chunk_state cs;
    char line[256];
    size_t line_len;
    bool done;
} conn;

static int remaining_ms(const conn *c)
{
    uint64_t now = mt_now_ns();
    if (now >= c->deadline_ns)
        return 0;
    uint64_t ms = (c->deadline_ns - now) / 1000000 + 1;
    return ms > 1000000000u ? 1000000000 : (int)ms;
}

static mt_status wait_fd(conn *c, short ev)
{
    for (;;) {
        int ms = remaining_ms(c);
        if (ms == 0)
            return mt_fail(c->err, MT_E_TIMEOUT, "http: no answer within the timeout");
        struct pollfd p = {c->fd, ev, 0};
        int r = poll(&p, 1, ms);
        if (r > 0)
            return MT_OK;
        if (r < 0 && errno != EINTR)
            return mt_fail(c->err, MT_E_IO, "http: poll: %s", strerror(errno));
    }
}

/* Sends everything; a peer that closed early is not an error here (its
 * answer, if any, is read next). Returns MT_OK, MT_E_TIMEOUT or MT_E_IO. */
static mt_status send_all(conn *c, const char *p, size_t n, bool *peer_closed)
{
    while (n) {
        mt_status st = wait_fd(c, POLLOUT);
        if (st)
            return st;
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            if (errno == EPIPE || errno == ECONNRESET) {
                *peer_closed = true;
                return MT_OK;
            }
            return mt_fail(c->err, MT_E_IO, "http: send: %s", strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return MT_OK;
}

static bool deliver(conn *c, const char *p, size_t n)
{
    if (!n)
        return true;
    if (c->fn) {
        if (!c->fn(c->ctx, p, n)) {
            c->resp->aborted = true;
            return false;
        }
        return true;
    }
    return serve_buf_append(&c->resp->body, p, n) == MT_OK;
}

static bool header_value(const char *headers, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *l = headers; l && *l;) {
        const char *eol = strstr(l, "\r\n");
        size_t len = eol ? (size_t)(eol - l) : strlen(l);
        if (len > nl && !strncasecmp(l, name, nl) && l[nl] == ':') {
            const char *v = l + nl + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            size_t vl = (size_t)(l + len - v);
            while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
                vl--;
            if (vl >= cap)
                vl = cap - 1;
            memcpy(out, v, vl);
            out[vl] = 0;
            return true;
        }
        l = eol ? eol + 2 : NULL;
    }
    return false;
}

bool serve_client_header(const serve_client_resp *resp, const char *name, char *out, size_t cap)
{
    return resp->headers.data && header_value(resp->headers.data, name, out, cap);
}

static mt_status parse_head(conn *c)
{
    char *h = c->head.data, *eol = strstr(h, "\r\n");
    int status;
    if (!eol || sscanf(h, "HTTP/1.%*d %d", &status) != 1 || status < 100 || status > 999)
        return mt_fail(c->err, MT_E_FORMAT, "http: malformed status line");
    c->resp->status = status;
    size_t hl = strlen(eol + 2);
    if (serve_buf_append(&c->resp->headers, eol + 2, hl))
        return mt_fail(c->err, MT_E_NOMEM, "http: out of memory");
    char v[64];
    if (status == 204 || status == 304 || (status >= 100 && status < 200))
        c->mode = BODY_NONE;
    else if (header_value(eol + 2, "Transfer-Encoding", v, sizeof v) && strcasestr(v, "chunked"))
        c->mode = BODY_CHUNKED;
    else if (header_value(eol + 2, "Content-Length", v, sizeof v)) {
        char *end;
        unsigned long long n = strtoull(v, &end, 10);
        if (end == v || *end)
            return mt_fail(c->err, MT_E_FORMAT, "http: bad Content-Length '%s'", v);
        c->mode = BODY_LENGTH;
        c->left = n;
    } else
        c->mode = BODY_EOF;
    if ((c->mode == BODY_LENGTH && c->left == 0) || c->mode == BODY_NONE)
        c->done = true;
    return MT_OK;
}

/* Feeds received body bytes through the transfer coding. */
static mt_status body_bytes(conn *c, const char *p, size_t n)
{
    if (c->mode == BODY_EOF)
        return deliver(c, p, n) ? MT_OK : MT_E_INTERRUPTED;
    if (c->mode == BODY_LENGTH) {
        size_t k = n < c->left ? n : (size_t)c->left;
        c->left -= k;
        if (!c->left)
            c->done = true;
        return deliver(c, p, k) ? MT_OK : MT_E_INTERRUPTED;
    }
    size_t i = 0;
    while (i < n && c->cs != CH_DONE) {
        if (c->cs == CH_DATA) {
            size_t k = n - i < c->left ? n - i : (size_t)c->left;
            if (!deliver(c, p + i, k))
                return MT_E_INTERRUPTED;
            i += k;
            c->left -= k;
            if (!c->left)
                c->cs = CH_DATA_END;
            continue;
        }
        char ch = p[i++];
        if (ch != '\n') {
            if (c->line_len + 1 >= sizeof c->line)
                return mt_fail(c->err, MT_E_FORMAT, "http: chunk line too long");
            c->line[c->line_len++] = ch;
            continue;
        }
        if (c->line_len && c->line[c->line_len - 1] == '\r')
            c->line_len--;
        c->line[c->line_len] = 0;
        size_t ll = c->line_len;
        c->line_len = 0;
        if (c->cs == CH_DATA_END) {
            if (ll)
                return mt_fail(c->err, MT_E_FORMAT, "http: no CRLF after a chunk");
            c->cs = CH_SIZE;
        } else if (c->cs == CH_SIZE) {
            char *end;
            unsigned long long sz = strtoull(c->line, &end, 16);
            if (end == c->line || (*end && *end != ';' && *end != ' '))
                return mt_fail(c->err, MT_E_FORMAT, "http: bad chunk size '%s'", c->line);
            c->left = sz;
            c->cs = sz ? CH_DATA : CH_TRAILER;
        } else if (c->cs == CH_TRAILER && ll == 0) {
            c->cs = CH_DONE;
        }
    }
    if (c->cs == CH_DONE)
        c->done = true;
    return MT_OK;
}

static mt_status read_response(conn *c)
{
    char buf[16384];
    while (!c->done) {
        mt_status st = wait_fd(c, POLLIN);
        if (st)
            return st;
        ssize_t r = recv(c->fd, buf, sizeof buf, 0);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            if (errno == ECONNRESET && c->have_head && c->mode == BODY_EOF)
                return MT_OK;
            return mt_fail(c->err, MT_E_IO, "http: recv: %s", strerror(errno));
        }
        if (r == 0) {
            if (c->have_head && c->mode == BODY_EOF)
                return MT_OK;
            return mt_fail(c->err, MT_E_IO, "http: the server closed the connection %s",
                           c->have_head ? "before the body ended" : "without answering");
        }
        const char *p = buf;
        size_t n = (size_t)r;
        if (!c->have_head) {
            size_t old = c->head.len;
            if (serve_buf_append(&c->head, p, n))
                return mt_fail(c->err, MT_E_NOMEM, "http: out of memory");
            char *end = strstr(c->head.data, "\r\n\r\n");
            if (!end) {
                if (c->head.len > MAX_HEADER)
                    return mt_fail(c->err, MT_E_FORMAT, "http: response header too long");
                continue;
            }
            size_t head_len = (size_t)(end - c->head.data) + 4;
            end[2] = 0; /* keep the last header's CRLF for line parsing */
            c->have_head = true;
            if ((st = parse_head(c)))
                return st;
            size_t used = head_len - old;
            p += used;
            n -= used;
            if (c->resp->status == 100) { /* an interim answer: read the real one */
                size_t rest = n;
                serve_buf_reset(&c->head);
                serve_buf_reset(&c->resp->headers);
                c->have_head = false;
                c->done = false;
                if (rest && serve_buf_append(&c->head, p, rest))
                    return mt_fail(c->err, MT_E_NOMEM, "http: out of memory");
                continue;
            }
        }
        if (n && !c->done) {
            st = body_bytes(c, p, n);
            if (st == MT_E_INTERRUPTED)
                return MT_OK; /* aborted by the callback */
            if (st)
                return st;
        }
    }
    return MT_OK;
}

static mt_status exchange(const serve_url *u, const char *head, size_t head_len,
                          const char *body, size_t body_len, double timeout_s,
                          serve_client_fn fn, void *ctx, serve_client_resp *resp, mt_err *err)
{
    memset(resp, 0, sizeof *resp);
    conn c = {.fd = -1, .fn = fn, .ctx = ctx, .resp = resp, .err = err};
    c.deadline_ns = mt_now_ns() + (uint64_t)(timeout_s * 1e9);
    c.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c.fd < 0)
        return mt_fail(err, MT_E_IO, "http: socket: %s", strerror(errno));
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)u->port);
    sa.sin_addr.s_addr = htonl(u->addr);
    mt_status st = MT_OK;
    int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c.fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        st = mt_fail(err, MT_E_IO, "http: connect to %s:%d: %s", u->host, u->port,
                     strerror(errno));
    } else {
        bool closed = false;
        st = send_all(&c, head, head_len, &closed);
        if (!st && !closed && body_len)
            st = send_all(&c, body, body_len, &closed);
        if (!st)
            st = read_response(&c);
    }
    close(c.fd);
    serve_buf_release(&c.head);
    return st;
}

mt_status serve_client_request(const serve_url *u, const char *method, const char *path,
                               const char *body, size_t body_len, double timeout_s,
                               serve_client_fn fn, void *ctx, serve_client_resp *resp,
                               mt_err *err)
{
    serve_buf head = SERVE_BUF_INIT;
    mt_status st = serve_buf_printf(&head,
                                    "%s %s%s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: moetune\r\n"
                                    "Accept: */*\r\nConnection: close\r\n",
                                    method, u->base, path, u->host, u->port);
    if (!st && body)
        st = serve_buf_printf(&head, "Content-Type: application/json\r\nContent-Length: %zu\r\n",
                              body_len);
    if (!st)
        st = serve_buf_puts(&head, "\r\n");
    if (st) {
        serve_buf_release(&head);
        memset(resp, 0, sizeof *resp);
        return mt_fail(err, MT_E_NOMEM, "http: out of memory");
    }
    st = exchange(u, head.data, head.len, body, body ? body_len : 0, timeout_s, fn, ctx, resp,
                  err);
    serve_buf_release(&head);
    return st;
}

mt_status serve_client_raw(const serve_url *u, const char *bytes, size_t n, double timeout_s,
                           serve_client_resp *resp, mt_err *err)
{
    return exchange(u, bytes, n, NULL, 0, timeout_s, NULL, NULL, resp, err);
}

void serve_client_resp_release(serve_client_resp *r)
{
    serve_buf_release(&r->headers);
    serve_buf_release(&r->body);
}
