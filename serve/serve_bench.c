/* serve_bench.c: Poisson load against an OpenAI-compatible server and the
 * WORKLOAD.md table (see serve_bench.h). */
#include "serve_bench.h"

#include "common/json_depth.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/rng.h"
#include "serve_buf.h"
#include "serve_client.h"
#include "serve_sse.h"

/* ---- statistics ------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double serve_percentile(double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    double pos = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(pos);
    if (lo >= n - 1)
        return v[n - 1];
    double f = pos - (double)lo;
    return v[lo] + (v[lo + 1] - v[lo]) * f;
}

int serve_bench_knee(const serve_bench_row *rows, int n, double limit)
{
    int knee = -1;
    for (int i = 0; i < n; i++)
        if (rows[i].sent > 0 && rows[i].ok == rows[i].sent && rows[i].ttft_p95 <= limit &&
            (knee < 0 || rows[i].rate > rows[knee].rate))
            knee = i;
    return knee;
}

/* ---- one request -------------------------------------------------------------------- */

typedef struct dvec {
    double *v;
    size_t n, cap;
} dvec;

/* Room for need doubles in *v (capacity *cap, doubled as it grows). */
static bool grow(double **v, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    double *nv = realloc(*v, c * sizeof *nv);
    if (!nv)
        return false;
    *v = nv;
    *cap = c;
    return true;
}

static bool dvec_push(dvec *d, double x)
{
    if (!grow(&d->v, &d->cap, d->n + 1))
        return false;
    d->v[d->n++] = x;
    return true;
}

typedef struct req {
    /* in */
    const serve_url *url;
    char *body;
    size_t body_len;
    double timeout_s;
    int want_tokens;
    uint64_t t_start; /* when it is due */
    /* out */
    bool ok;
    char error[160];
    serve_bench_arrivals a;
    int64_t prompt_tokens, cached_tokens;
    uint64_t t_end;
    /* parsing */
    serve_sse_parser sse;
    bool done, failed;
    int finished; /* set (atomically) when its thread is about to return */
} req;

bool serve_bench_arrive(serve_bench_arrivals *a, int k, uint64_t now)
{
    if (!grow(&a->itl, &a->cap_itl, a->n_itl + (size_t)(a->tokens ? k : k - 1)))
        return false;
    if (a->tokens == 0)
        a->ttft = (double)(now - a->t_send) * 1e-9;
    else
        a->itl[a->n_itl++] = (double)(now - a->t_last) * 1e-9;
    for (int i = 1; i < k; i++)
        a->itl[a->n_itl++] = 0;
    a->t_last = now;
    a->tokens += k;
    return true;
}

static bool on_event(void *ctx, const char *data, size_t n)
{
    req *r = ctx;
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        r->done = true;
        return true;
    }
    cJSON *o = mt_json_too_deep(data, n, MT_JSON_MAX_DEPTH, NULL) ? NULL
                                                                : cJSON_ParseWithLength(data, n);
    if (!o) {
        snprintf(r->error, sizeof r->error, "an event is not JSON (or nests past %d)",
                 MT_JSON_MAX_DEPTH);
        r->failed = true;
        return false;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (err) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
        snprintf(r->error, sizeof r->error, "error event: %.120s",
                 cJSON_IsString(m) ? m->valuestring : "?");
        r->failed = true;
        cJSON_Delete(o);
        return false;
    }
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    int k = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(ch, "token_ids"));
    if (k > 0 && !serve_bench_arrive(&r->a, k, mt_now_ns())) {
        snprintf(r->error, sizeof r->error, "out of memory counting tokens");
        r->failed = true;
        cJSON_Delete(o);
        return false;
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (cJSON_IsObject(u)) {
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(d, "cached_tokens");
        r->prompt_tokens = cJSON_IsNumber(pt) ? (int64_t)pt->valuedouble : 0;
        r->cached_tokens = cJSON_IsNumber(ct) ? (int64_t)ct->valuedouble : 0;
    }
    cJSON_Delete(o);
    return true;
}

static bool on_body(void *ctx, const char *p, size_t n)
{
    req *r = ctx;
    bool stopped = false;
    mt_err err = MT_ERR_INIT;
    if (serve_sse_feed(&r->sse, p, n, on_event, r, &stopped, &err)) {
        snprintf(r->error, sizeof r->error, "%.150s", err.msg);
        r->failed = true;
        return false;
    }
    return !stopped;
}

static void *req_main(void *arg)
{
    req *r = arg;
    uint64_t now = mt_now_ns();
    if (r->t_start > now) {
        uint64_t d = r->t_start - now;
        struct timespec ts = {(time_t)(d / 1000000000u), (long)(d % 1000000000u)};
        while (nanosleep(&ts, &ts) != 0)
            ;
    }
    r->a.t_send = mt_now_ns();
    serve_client_resp resp = SERVE_CLIENT_RESP_INIT;
    mt_err err = MT_ERR_INIT;
    mt_status st = serve_client_request(r->url, "POST", "/v1/completions", r->body, r->body_len,
                                        r->timeout_s, on_body, r, &resp, &err);
    r->t_end = mt_now_ns();
    if (st)
        snprintf(r->error, sizeof r->error, "%.150s", err.msg);
    else if (resp.status != 200)
        snprintf(r->error, sizeof r->error, "HTTP %d", resp.status);
    else if (!r->failed && !r->done)
        snprintf(r->error, sizeof r->error, "the stream ended without [DONE]");
    else if (!r->failed && r->a.tokens != r->want_tokens)
        snprintf(r->error, sizeof r->error, "%d tokens instead of %d", r->a.tokens,
                 r->want_tokens);
    r->ok = !st && resp.status == 200 && r->done && !r->failed && r->a.tokens == r->want_tokens;
    serve_client_resp_release(&resp);
    serve_sse_release(&r->sse);
    __atomic_store_n(&r->finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* ---- prompts ------------------------------------------------------------------------- */

static char *prompt_body(const int32_t *prefix, int n_prefix, int input_len, int output_len,
                         bool stream, mt_rng *rng, int32_t lo, int32_t hi, size_t *len)
{
    serve_buf b = SERVE_BUF_INIT;
    bool bad = serve_buf_puts(&b, "{\"prompt\":[") != MT_OK;
    for (int i = 0; i < input_len && !bad; i++) {
        int32_t t = i < n_prefix ? prefix[i]
                                 : lo + (int32_t)mt_rng_below(rng, (uint64_t)(hi - lo));
        bad = serve_buf_printf(&b, i ? ",%d" : "%d", (int)t) != MT_OK;
    }
    if (!bad)
        bad = serve_buf_printf(&b,
                               "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,"
                               "\"stream\":%s,%s\"return_token_ids\":true}",
                               output_len, stream ? "true" : "false",
                               stream ? "\"stream_options\":{\"include_usage\":true}," : "") !=
              MT_OK;
    if (bad) {
        serve_buf_release(&b);
        return NULL;
    }
    return serve_buf_detach(&b, len);
}

static bool health_ok(const serve_url *u)
{
    serve_client_resp resp = SERVE_CLIENT_RESP_INIT;
    bool ok = serve_client_request(u, "GET", "/health", NULL, 0, 10.0, NULL, NULL, &resp, NULL) ==
                  MT_OK &&
              resp.status == 200;
    serve_client_resp_release(&resp);
    return ok;
}

/* A row from n finished requests timed from t0, over [t0, max(span_end,
 * the last answer)]: a load that the server sustains reads as that load. */
static void fill_row(serve_bench_row *row, const req *rs, int n, uint64_t t0, uint64_t span_end)
{
    dvec ttft = {0}, itl = {0};
    uint64_t last = 0;
    int64_t tokens = 0, prompt = 0, cached = 0;
    for (int i = 0; i < n; i++) {
        const req *r = &rs[i];
        row->sent++;
        if (r->t_end > last)
            last = r->t_end;
        if (!r->ok) {
            if (!row->first_error[0])
                snprintf(row->first_error, sizeof row->first_error, "%s", r->error);
            continue;
        }
        row->ok++;
        tokens += r->a.tokens;
        prompt += r->prompt_tokens;
        cached += r->cached_tokens;
        dvec_push(&ttft, r->a.ttft);
        for (size_t k = 0; k < r->a.n_itl; k++)
            dvec_push(&itl, r->a.itl[k]);
    }
    if (last > span_end)
        span_end = last;
    row->elapsed_s = (double)(span_end - t0) * 1e-9;
    row->req_s = row->elapsed_s > 0 ? row->ok / row->elapsed_s : 0;
    row->tok_s = row->elapsed_s > 0 ? (double)tokens / row->elapsed_s : 0;
    row->ttft_p50 = serve_percentile(ttft.v, ttft.n, 50);
    row->ttft_p95 = serve_percentile(ttft.v, ttft.n, 95);
    row->itl_p50 = serve_percentile(itl.v, itl.n, 50);
    row->itl_p95 = serve_percentile(itl.v, itl.n, 95);
    row->success_pct = row->sent ? 100.0 * row->ok / row->sent : 0;
    row->cache_hit = prompt ? (double)cached / (double)prompt : 0;
    free(ttft.v);
    free(itl.v);
}

/* ---- one rate ------------------------------------------------------------------------- */

static mt_status run_rate(const serve_bench_opts *o, const serve_url *u, double rate,
                          const int32_t *prefix, int n_prefix, mt_rng *rng,
                          serve_bench_row *row, mt_err *err)
{
    memset(row, 0, sizeof *row);
    row->rate = rate;
    /* Warm the prefix cache with the shared prefix (not measured). */
    if (n_prefix > 0) {
        size_t bl;
        char *body = prompt_body(prefix, n_prefix, o->input_len, 1, false, rng, o->token_lo,
                                 o->token_hi, &bl);
        if (!body)
            return mt_fail(err, MT_E_NOMEM, "bench-serve: out of memory");
        serve_client_resp resp = SERVE_CLIENT_RESP_INIT;
        serve_client_request(u, "POST", "/v1/completions", body, strlen(body), o->timeout_s,
                             NULL, NULL, &resp, NULL);
        serve_client_resp_release(&resp);
        free(body);
    }
    /* Arrival times. */
    int cap = (int)(rate * o->duration_s * 2 + 16), n = 0;
    double *at = malloc((size_t)cap * sizeof *at);
    if (!at)
        return mt_fail(err, MT_E_NOMEM, "bench-serve: out of memory");
    for (double t = 0;;) {
        double u01 = ((double)(mt_rng_u64(rng) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        t += -log(u01) / rate;
        if (t >= o->duration_s)
            break;
        if (n == cap) {
            cap *= 2;
            double *na = realloc(at, (size_t)cap * sizeof *na);
            if (!na) {
                free(at);
                return mt_fail(err, MT_E_NOMEM, "bench-serve: out of memory");
            }
            at = na;
        }
        at[n++] = t;
    }
    if (n == 0) { /* at least one request per rate */
        at[0] = 0;
        n = 1;
    }
    req *rs = calloc((size_t)n, sizeof *rs);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    bool *started = calloc((size_t)n, sizeof *started);
    int *pending = malloc((size_t)n * sizeof *pending); /* started, not joined */
    int n_pending = 0;
    mt_status st = MT_OK;
    if (!rs || !th || !started || !pending) {
        st = mt_fail(err, MT_E_NOMEM, "bench-serve: out of memory");
        goto out;
    }
    uint64_t t0 = mt_now_ns() + 20000000u; /* 20 ms to start the threads */
    for (int i = 0; i < n; i++) {
        req *r = &rs[i];
        r->url = u;
        r->timeout_s = o->timeout_s;
        r->want_tokens = o->output_len;
        r->t_start = t0 + (uint64_t)(at[i] * 1e9);
        r->sse = (serve_sse_parser)SERVE_SSE_PARSER_INIT;
        r->body = prompt_body(prefix, n_prefix, o->input_len, o->output_len, true, rng,
                              o->token_lo, o->token_hi, &r->body_len);
        if (!r->body) {
            snprintf(r->error, sizeof r->error, "out of memory");
            continue;
        }
        /* Start each thread shortly before it is due, so that threads do not
         * pile up sleeping. */
        uint64_t now = mt_now_ns();
        if (r->t_start > now + 50000000u) {
            uint64_t d = r->t_start - now - 50000000u;
            struct timespec ts = {(time_t)(d / 1000000000u), (long)(d % 1000000000u)};
            while (nanosleep(&ts, &ts) != 0)
                ;
        }
        started[i] = pthread_create(&th[i], NULL, req_main, r) == 0;
        if (!started[i])
            snprintf(r->error, sizeof r->error, "cannot start a client thread");
        /* Join the requests that are done as it goes: a thread keeps its
         * stack until it is joined, and a long run at a high rate starts
         * tens of thousands. */
        if (started[i])
            pending[n_pending++] = i;
        int keep = 0;
        for (int k = 0; k < n_pending; k++) {
            int j = pending[k];
            if (__atomic_load_n(&rs[j].finished, __ATOMIC_ACQUIRE))
                pthread_join(th[j], NULL);
            else
                pending[keep++] = j;
        }
        n_pending = keep;
    }
    for (int k = 0; k < n_pending; k++)
        pthread_join(th[pending[k]], NULL);
    fill_row(row, rs, n, t0, t0 + (uint64_t)(o->duration_s * 1e9));
    row->server_up = health_ok(u);
out:
    if (rs)
        for (int i = 0; i < n; i++) {
            free(rs[i].body);
            free(rs[i].a.itl);
        }
    free(rs);
    free(th);
    free(started);
    free(pending);
    free(at);
    return st;
}

/* ---- closed loop ---------------------------------------------------------------------- */

/* One client of the closed loop: requests back to back until t_stop (at
 * least one), each sent when the previous one finished. */
typedef struct client {
    const serve_bench_opts *o;
    const serve_url *u;
    const int32_t *prefix;
    int n_prefix;
    mt_rng rng;
    uint64_t t_stop;
    req *rs;
    int n, cap;
    bool nomem;
} client;

static void *client_main(void *arg)
{
    client *c = arg;
    do {
        if (c->n == c->cap) {
            int cap = c->cap ? 2 * c->cap : 16;
            req *nr = realloc(c->rs, (size_t)cap * sizeof *nr);
            if (!nr) {
                c->nomem = true;
                break;
            }
            c->rs = nr, c->cap = cap;
        }
        req *r = &c->rs[c->n];
        memset(r, 0, sizeof *r);
        r->url = c->u;
        r->timeout_s = c->o->timeout_s;
        r->want_tokens = c->o->output_len;
        r->sse = (serve_sse_parser)SERVE_SSE_PARSER_INIT;
        r->body = prompt_body(c->prefix, c->n_prefix, c->o->input_len, c->o->output_len, true,
                              &c->rng, c->o->token_lo, c->o->token_hi, &r->body_len);
        c->n++;
        if (!r->body) {
            snprintf(r->error, sizeof r->error, "out of memory");
            break;
        }
        req_main(r); /* t_start 0: now */
    } while (mt_now_ns() < c->t_stop);
    return NULL;
}

static mt_status run_closed(const serve_bench_opts *o, const serve_url *u, int conc,
                            const int32_t *prefix, int n_prefix, mt_rng *rng,
                            serve_bench_row *row, mt_err *err)
{
    memset(row, 0, sizeof *row);
    row->concurrency = conc;
    client *cs = calloc((size_t)conc, sizeof *cs);
    pthread_t *th = calloc((size_t)conc, sizeof *th);
    bool *started = calloc((size_t)conc, sizeof *started);
    mt_status st = MT_OK;
    if (!cs || !th || !started) {
        st = mt_fail(err, MT_E_NOMEM, "bench-serve: out of memory");
        goto out;
    }
    uint64_t t0 = mt_now_ns();
    for (int i = 0; i < conc; i++) {
        cs[i] = (client){.o = o, .u = u, .prefix = prefix, .n_prefix = n_prefix,
                         .t_stop = t0 + (uint64_t)(o->duration_s * 1e9)};
        mt_rng_seed(&cs[i].rng, mt_rng_u64(rng));
        started[i] = pthread_create(&th[i], NULL, client_main, &cs[i]) == 0;
        if (!started[i] && !row->first_error[0])
            snprintf(row->first_error, sizeof row->first_error, "cannot start a client thread");
    }
    int total = 0;
    for (int i = 0; i < conc; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        total += cs[i].n;
        if (cs[i].nomem)
            st = mt_fail(err, MT_E_NOMEM, "bench-serve: out of memory");
    }
    req *all = malloc((size_t)(total + 1) * sizeof *all);
    if (!all) {
        st = mt_fail(err, MT_E_NOMEM, "bench-serve: out of memory");
    } else if (st == MT_OK) {
        int k = 0;
        for (int i = 0; i < conc; i++)
            for (int j = 0; j < cs[i].n; j++)
                all[k++] = cs[i].rs[j];
        /* Over [t0, last answer]: the clients keep the server busy until then. */
        fill_row(row, all, total, t0, t0);
        row->rate = row->elapsed_s > 0 ? row->sent / row->elapsed_s : 0;
        row->server_up = health_ok(u);
    }
    free(all);
out:
    if (cs)
        for (int i = 0; i < conc; i++) {
            for (int j = 0; j < cs[i].n; j++) {
                free(cs[i].rs[j].body);
                free(cs[i].rs[j].a.itl);
            }
            free(cs[i].rs);
        }
    free(cs);
    free(th);
    free(started);
    return st;
}

mt_status serve_bench_run(const serve_bench_opts *oin, serve_bench_row *rows, mt_err *err)
{
    serve_bench_opts o = *oin;
    if (o.duration_s <= 0)
        o.duration_s = 30;
    if (o.ttft_limit_s <= 0)
        o.ttft_limit_s = 5;
    if (o.timeout_s <= 0)
        o.timeout_s = 300;
    if (o.token_hi <= o.token_lo) {
        o.token_lo = 16;
        o.token_hi = 256;
    }
    if (o.input_len < 1 || o.output_len < 1 || (o.n_rates < 1) == (o.n_conc < 1) ||
        !(o.cache_hit >= 0) || o.cache_hit >= 1)
        return mt_fail(err, MT_E_INVALID,
                       "bench-serve: need input_len >= 1, output_len >= 1, rates or "
                       "concurrencies (not both), and 0 <= cache_hit < 1");
    for (int i = 0; i < o.n_conc; i++)
        if (o.concurrency[i] < 1 || o.concurrency[i] > 4096)
            return mt_fail(err, MT_E_INVALID, "bench-serve: concurrency %d is not in 1..4096",
                           o.concurrency[i]);
    for (int i = 0; i < o.n_rates; i++)
        if (!(o.rates[i] > 0))
            return mt_fail(err, MT_E_INVALID, "bench-serve: rate %g is not positive",
                           o.rates[i]);
    serve_url u;
    MT_TRY(serve_url_parse(o.url, &u, err) == MT_OK, err, MT_E_INVALID, "bench-serve: url %s",
           o.url);
    if (!health_ok(&u))
        return mt_fail(err, MT_E_IO, "bench-serve: %s/health does not answer 200", o.url);
    mt_rng rng;
    mt_rng_seed(&rng, o.seed ? o.seed : mt_seed_fresh());
    int n_prefix = (int)lround(o.cache_hit * o.input_len);
    if (n_prefix >= o.input_len)
        n_prefix = o.input_len - 1;
    int32_t *prefix = malloc((size_t)(n_prefix + 1) * sizeof *prefix);
    if (!prefix)
        return mt_fail(err, MT_E_NOMEM, "bench-serve: out of memory");
    for (int i = 0; i < n_prefix; i++)
        prefix[i] = o.token_lo + (int32_t)mt_rng_below(&rng, (uint64_t)(o.token_hi - o.token_lo));
    mt_status st = MT_OK;
    int n_rows = o.n_conc > 0 ? o.n_conc : o.n_rates;
    for (int i = 0; i < n_rows && !st; i++) {
        if (o.n_conc > 0) {
            /* Warm-up: one request, so the first row does not pay the
             * server's first-use costs (compiles, page faults). */
            serve_bench_row warm;
            serve_bench_opts one = o;
            one.duration_s = 0;
            if (i == 0)
                (void)run_closed(&one, &u, 1, prefix, n_prefix, &rng, &warm, err);
            st = run_closed(&o, &u, o.concurrency[i], prefix, n_prefix, &rng, &rows[i], err);
        } else {
            st = run_rate(&o, &u, o.rates[i], prefix, n_prefix, &rng, &rows[i], err);
        }
        if (!st && o.progress) {
            fprintf(o.progress,
                    "%s %g: %d/%d ok, TTFT p95 %.3f s, %.1f tok/s, server %s%s%s\n",
                    o.n_conc > 0 ? "concurrency" : "rate req/s",
                    o.n_conc > 0 ? (double)rows[i].concurrency : rows[i].rate, rows[i].ok,
                    rows[i].sent, rows[i].ttft_p95, rows[i].tok_s,
                    rows[i].server_up ? "up" : "DOWN", rows[i].first_error[0] ? "; first error: " : "",
                    rows[i].first_error);
            fflush(o.progress);
        }
    }
    free(prefix);
    return st;
}

/* A time to three significant digits from 1 ms up (a hundredth of a ms
 * below 10 ms: inter-token latencies of a few ms differ by tenths). */
static void fmt_s(char *out, size_t cap, double s)
{
    if (isnan(s))
        snprintf(out, cap, "-");
    else if (s < 0.009995)
        snprintf(out, cap, "%.2f ms", s * 1e3);
    else if (s < 0.9995)
        snprintf(out, cap, "%.1f ms", s * 1e3);
    else
        snprintf(out, cap, "%.2f s", s);
}

void serve_bench_print(FILE *f, const serve_bench_opts *o, const serve_bench_row *rows, int n)
{
    double limit = o->ttft_limit_s > 0 ? o->ttft_limit_s : 5;
    bool closed = o->n_conc > 0;
    fprintf(f,
            "workload: %d input tokens (%.0f%% shared prefix), %d output tokens, %s, %g s "
            "per %s\n\n",
            o->input_len, o->cache_hit * 100, o->output_len,
            closed ? "closed loop (each client sends its next request when one ends)"
                   : "Poisson arrivals",
            o->duration_s > 0 ? o->duration_s : 30, closed ? "concurrency" : "rate");
    fprintf(f, "| %s | req/s | tok/s | TTFT p50 / p95 | ITL p50 / p95 | success | cache hit |\n",
            closed ? "concurrency" : "rate");
    fprintf(f, "| --- | --- | --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < n; i++) {
        const serve_bench_row *r = &rows[i];
        char t50[32], t95[32], i50[32], i95[32];
        fmt_s(t50, sizeof t50, r->ttft_p50);
        fmt_s(t95, sizeof t95, r->ttft_p95);
        fmt_s(i50, sizeof i50, r->itl_p50);
        fmt_s(i95, sizeof i95, r->itl_p95);
        fprintf(f, "| %g | %.2f | %.1f | %s / %s | %s / %s | %.0f%% (%d/%d) | %.0f%% |\n",
                closed ? (double)r->concurrency : r->rate, r->req_s, r->tok_s, t50, t95, i50, i95, r->success_pct, r->ok, r->sent,
                r->cache_hit * 100);
    }
    if (!closed) {
        int k = serve_bench_knee(rows, n, limit);
        if (k >= 0)
            fprintf(f, "\nknee: %g req/s (highest rate with TTFT p95 <= %g s and every request "
                       "succeeding)\n",
                    rows[k].rate, limit);
        else
            fprintf(f,
                    "\nknee: none (no rate had TTFT p95 <= %g s with every request "
                    "succeeding)\n",
                    limit);
    }
    bool up = true;
    for (int i = 0; i < n; i++)
        up = up && rows[i].server_up;
    fprintf(f, "server: %s\n", up ? "up after every row" : "NOT answering /health after a row");
}
