/* serve_http.c: HTTP replies and request bodies over civetweb (see
 * serve_http.h). */
#define _GNU_SOURCE /* POLLRDHUP */
#include "serve_http.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"

/* What is drained of a body refused with 413 (see serve_http_error). */
#define DRAIN_MAX_BYTES (256ull << 20)
#define DRAIN_MAX_NS (30ull * 1000000000ull)

static bool is_head(struct mg_connection *c)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    return ri && ri->request_method && !strcmp(ri->request_method, "HEAD");
}

int serve_http_send(struct mg_connection *c, int status, const char *content_type,
                    const char *body, size_t n)
{
    char len[32];
    snprintf(len, sizeof len, "%zu", n);
    mg_response_header_start(c, status);
    mg_response_header_add(c, "Content-Type", content_type, -1);
    mg_response_header_add(c, "Content-Length", len, -1);
    mg_response_header_send(c);
    if (!is_head(c))
        mg_write(c, body, n);
    return status;
}

int serve_http_json(struct mg_connection *c, int status, const char *body, size_t n)
{
    return serve_http_send(c, status, "application/json", body, n);
}

/* Whether the client said it waits for "100 Continue" before its body. */
static bool expects_continue(struct mg_connection *c)
{
    const char *x = mg_get_header(c, "Expect");
    return x && !strcasecmp(x, "100-continue");
}

/* Reads and discards what is left of the request body, up to a bound in
 * bytes and time. A client that sends its whole body without waiting
 * (node, the openai SDK) is still writing when the 413 goes out; closing
 * with its bytes unread would make the kernel answer with a reset, and the
 * client would see a broken connection (and retry) instead of the 413. */
static void drain_body(struct mg_connection *c)
{
    if (expects_continue(c))
        return; /* it waits for a "100 Continue" that never comes: nothing to drain */
    char buf[16384];
    uint64_t t0 = mt_now_ns(), total = 0;
    while (total < DRAIN_MAX_BYTES && mt_now_ns() - t0 < DRAIN_MAX_NS) {
        int r = mg_read(c, buf, sizeof buf);
        if (r <= 0)
            break;
        total += (uint64_t)r;
    }
}

int serve_http_error(struct mg_connection *c, const serve_error *e)
{
    char *j = serve_error_json(e);
    static const char fallback[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                   "\"server_error\",\"param\":null,\"code\":null}}";
    int status = e->http ? e->http : 500;
    if (status == 413)
        mg_disable_connection_keep_alive(c);
    int st = serve_http_json(c, status, j ? j : fallback, j ? strlen(j) : sizeof fallback - 1);
    free(j);
    if (status == 413)
        drain_body(c);
    return st;
}

mt_status serve_http_body(struct mg_connection *c, size_t max, char **body, size_t *n,
                          serve_error *e)
{
    *body = NULL;
    *n = 0;
    const struct mg_request_info *ri = mg_get_request_info(c);
    if (ri->content_length > (long long)max) {
        mg_disable_connection_keep_alive(c); /* the unread body must not be parsed as a request */
        return serve_reject(e, 413, NULL, "request_too_large",
                            "the request body is %lld bytes; this server takes at most %zu",
                            ri->content_length, max);
    }
    size_t cap = ri->content_length >= 0 ? (size_t)ri->content_length + 1 : 4096;
    char *b = malloc(cap);
    if (!b)
        return serve_reject(e, 500, NULL, NULL, "out of memory for a %zu-byte body", cap);
    size_t len = 0;
    for (;;) {
        if (len + 1 >= cap) {
            if (cap > max + 1) {
                free(b);
                mg_disable_connection_keep_alive(c);
                return serve_reject(e, 413, NULL, "request_too_large",
                                    "the request body is longer than %zu bytes", max);
            }
            size_t nc = cap * 2 > max + 2 ? max + 2 : cap * 2;
            char *nb = realloc(b, nc);
            if (!nb) {
                free(b);
                return serve_reject(e, 500, NULL, NULL, "out of memory reading the body");
            }
            b = nb;
            cap = nc;
        }
        int r = mg_read(c, b + len, cap - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    if (len > max) {
        free(b);
        mg_disable_connection_keep_alive(c);
        return serve_reject(e, 413, NULL, "request_too_large",
                            "the request body is longer than %zu bytes", max);
    }
    b[len] = 0;
    *body = b;
    *n = len;
    return MT_OK;
}

/* ---- the client's socket ------------------------------------------------------ */

/* civetweb does not hand out a connection's socket. It is found once per
 * request among the process's descriptors: the TCP socket whose peer is the
 * request's remote address and port and whose local port is the server's. */
int serve_http_client_fd(struct mg_connection *c, int local_port)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    if (!ri || ri->remote_port <= 0)
        return -1;
    struct in6_addr want6;
    struct in_addr want4;
    bool v4 = inet_pton(AF_INET, ri->remote_addr, &want4) == 1;
    bool v6 = !v4 && inet_pton(AF_INET6, ri->remote_addr, &want6) == 1;
    if (!v4 && !v6)
        return -1;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int found = -1;
    struct dirent *de;
    while (found < 0 && (de = readdir(d))) {
        char *end;
        long fd = strtol(de->d_name, &end, 10);
        if (*end || fd < 0 || fd == dirfd(d))
            continue;
        struct stat sb;
        if (fstat((int)fd, &sb) || !S_ISSOCK(sb.st_mode))
            continue;
        struct sockaddr_storage peer, self;
        socklen_t pl = sizeof peer, sl = sizeof self;
        if (getpeername((int)fd, (struct sockaddr *)&peer, &pl) ||
            getsockname((int)fd, (struct sockaddr *)&self, &sl))
            continue;
        if (v4 && peer.ss_family == AF_INET && self.ss_family == AF_INET) {
            const struct sockaddr_in *p = (const struct sockaddr_in *)&peer;
            const struct sockaddr_in *s = (const struct sockaddr_in *)&self;
            if (p->sin_addr.s_addr == want4.s_addr && ntohs(p->sin_port) == ri->remote_port &&
                ntohs(s->sin_port) == local_port)
                found = (int)fd;
        } else if (peer.ss_family == AF_INET6 && self.ss_family == AF_INET6) {
            const struct sockaddr_in6 *p = (const struct sockaddr_in6 *)&peer;
            const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)&self;
            bool addr = v6 ? !memcmp(&p->sin6_addr, &want6, sizeof want6)
                           : IN6_IS_ADDR_V4MAPPED(&p->sin6_addr) &&
                                 !memcmp(&p->sin6_addr.s6_addr[12], &want4, 4);
            if (addr && ntohs(p->sin6_port) == ri->remote_port && ntohs(s->sin6_port) == local_port)
                found = (int)fd;
        }
    }
    closedir(d);
    return found;
}

bool serve_http_client_gone(int fd)
{
    if (fd < 0)
        return false;
    struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL))
        return true;
    char ch;
    /* Readable: bytes of a pipelined request, or the end of the stream. */
    return recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}
