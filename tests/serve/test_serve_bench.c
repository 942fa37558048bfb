/* test_serve_bench.c: the load generator against the real server on the
 * tiny model: a short sweep prints the WORKLOAD.md table, finds a knee,
 * has no failed request at or below it, sees the shared prefix cached and
 * leaves the server up; the closed loop (--concurrency) keeps each client
 * busy and counts every request; the open loop joins its request threads
 * as they finish (a thread not joined keeps its stack: 32,645 of them
 * exhausted the process's memory maps in a 600 s run at 64 req/s); and the
 * two commands end to end: `moetune serve` (ephemeral port, SIGTERM stops
 * it with status 0) measured by `moetune bench-serve`. */
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sys/wait.h>

#include "serve/serve_bench.h"
#include "test_serve_util.h"

/* Tokens that arrive in one event still give an ITL sample each after the
 * first token: the CI once saw a whole 12-token answer in the first event
 * (the stream thread ran late on a loaded machine) and a row with no ITL. */
Test(serve_bench, tokens_arriving_together_each_count_for_itl)
{
    serve_bench_arrivals a = {.t_send = 1000};
    cr_assert(serve_bench_arrive(&a, 12, 1000 + 7000000));
    cr_assert_eq(a.tokens, 12);
    cr_assert_float_eq(a.ttft, 7e-3, 1e-12);
    cr_assert_eq(a.n_itl, 11);
    for (size_t i = 0; i < a.n_itl; i++)
        cr_assert_eq(a.itl[i], 0.0, "itl[%zu] %g", i, a.itl[i]);
    cr_assert(serve_bench_arrive(&a, 1, 1000 + 9000000));
    cr_assert(serve_bench_arrive(&a, 3, 1000 + 9500000));
    cr_assert_eq(a.tokens, 16);
    cr_assert_eq(a.n_itl, 15, "one sample per token after the first");
    cr_assert_float_eq(a.itl[11], 2e-3, 1e-12);
    cr_assert_float_eq(a.itl[12], 0.5e-3, 1e-12);
    cr_assert_eq(a.itl[13], 0.0);
    cr_assert_eq(a.itl[14], 0.0);
    cr_assert_float_eq(a.ttft, 7e-3, 1e-12, "later events leave TTFT alone");
    free(a.itl);

    serve_bench_arrivals one = {.t_send = 5};
    cr_assert(serve_bench_arrive(&one, 1, 10));
    cr_assert_eq(one.n_itl, 0, "a single token has no ITL");
    free(one.itl);
}

/* Options for a load of input_len prompt and output_len answer tokens
 * per request against t, duration_s per rate or concurrency, a fresh seed. */
static void bench_opts(serve_bench_opts *o, const tsrv *t, int input_len, int output_len,
                       double duration_s)
{
    memset(o, 0, sizeof *o);
    o->url = t->url_text;
    o->input_len = input_len;
    o->output_len = output_len;
    o->duration_s = duration_s;
    o->ttft_limit_s = 5;
    o->timeout_s = 120;
    o->seed = mt_seed_fresh();
}

/* The table's times: a hundredth of a ms below 10 ms (ITL of a few ms),
 * a tenth up to a second, then seconds; none without a success. */
Test(serve_bench, the_table_prints_times_to_their_resolution)
{
    serve_bench_opts o;
    memset(&o, 0, sizeof o);
    serve_bench_row rows[2];
    memset(rows, 0, sizeof rows);
    rows[0] = (serve_bench_row){.rate = 64, .sent = 10, .ok = 10, .ttft_p50 = 0.0123,
                                .ttft_p95 = 1.5, .itl_p50 = 0.00034, .itl_p95 = 0.002571,
                                .success_pct = 100, .server_up = true};
    rows[1] = (serve_bench_row){.rate = 128, .sent = 3, .ttft_p50 = NAN, .ttft_p95 = NAN,
                                .itl_p50 = 0.0099949, .itl_p95 = 0.9996, .server_up = true};
    char *table = NULL;
    size_t tl = 0;
    FILE *f = open_memstream(&table, &tl);
    serve_bench_print(f, &o, rows, 2);
    fclose(f);
    cr_assert(strstr(table, "| 12.3 ms / 1.50 s | 0.34 ms / 2.57 ms |"), "%s", table);
    cr_assert(strstr(table, "| - / - | 9.99 ms / 1.00 s |"), "%s", table);
    free(table);
}

Test(serve_bench, sweep_has_a_knee_and_no_failures_below_it)
{
    tsrv t;
    tsrv_start(&t, NULL);
    double rates[] = {1, 3, 6};
    serve_bench_opts o;
    bench_opts(&o, &t, 96, 12, 4);
    o.cache_hit = 0.5;
    o.rates = rates;
    o.n_rates = 3;
    serve_bench_row rows[3];
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_bench_run(&o, rows, &err), MT_OK, "%s", err.msg);
    char *table = NULL;
    size_t tl = 0;
    FILE *f = open_memstream(&table, &tl);
    serve_bench_print(f, &o, rows, 3);
    fclose(f);
    cr_log_info("seed %llu\n%s", (unsigned long long)o.seed, table);
    cr_assert_not_null(strstr(table, "| rate | req/s | tok/s | TTFT p50 / p95 | ITL p50 / p95 |"));
    cr_assert_not_null(strstr(table, "knee: "));
    int knee = serve_bench_knee(rows, 3, o.ttft_limit_s);
    cr_assert_geq(knee, 0, "no knee:\n%s", table);
    for (int i = 0; i < 3; i++) {
        cr_assert(rows[i].server_up, "the server stopped answering after rate %g", rows[i].rate);
        cr_assert_gt(rows[i].sent, 0);
        if (rows[i].rate <= rows[knee].rate)
            cr_assert_eq(rows[i].ok, rows[i].sent, "failures below the knee: %s\n%s",
                         rows[i].first_error, table);
        if (rows[i].ok) {
            cr_assert_leq(rows[i].ttft_p50, rows[i].ttft_p95);
            cr_assert(!isnan(rows[i].itl_p50) && rows[i].itl_p50 <= rows[i].itl_p95);
            cr_assert_gt(rows[i].tok_s, 0);
            /* 48 of 96 tokens shared: 48 is three whole pages. */
            cr_assert_float_eq(rows[i].cache_hit, 0.5, 1e-9, "cache hit %g", rows[i].cache_hit);
        }
    }
    free(table);
    tsrv_stop(&t);
}

/* Lines of /proc/self/maps: a thread's stack and its guard are two. */
static int count_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert_not_null(f);
    int n = 0, c;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

typedef struct maps_watch {
    volatile int stop;
    int peak;
} maps_watch;

static void *watch_maps(void *arg)
{
    maps_watch *w = arg;
    while (!w->stop) {
        int n = count_maps();
        if (n > w->peak)
            w->peak = n;
        usleep(5000);
    }
    return NULL;
}

Test(serve_bench, the_open_loop_joins_its_request_threads_as_they_finish, .timeout = 120)
{
    tsrv t;
    tsrv_start(&t, NULL);
    double rates[] = {100};
    serve_bench_opts o;
    bench_opts(&o, &t, 8, 2, 3);
    o.rates = rates;
    o.n_rates = 1;
    maps_watch w = {.peak = count_maps()};
    int base = w.peak;
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, watch_maps, &w), 0);
    serve_bench_row row;
    mt_err err = MT_ERR_INIT;
    mt_status st = serve_bench_run(&o, &row, &err);
    w.stop = 1;
    pthread_join(th, NULL);
    cr_assert_eq(st, MT_OK, "%s", err.msg);
    cr_assert_gt(row.sent, 200, "%d requests sent", row.sent);
    cr_expect_eq(row.ok, row.sent, "%s", row.first_error);
    /* Joined as they finish, the stacks are reused: the maps grow with the
     * requests in flight (many on a loaded machine), not with every request
     * sent (two maps each: the stack and its guard). */
    cr_expect_lt(w.peak - base, row.sent, "%d maps more at the peak over %d requests",
                 w.peak - base, row.sent);
    cr_log_info("open loop: %d requests, at most %d maps more", row.sent, w.peak - base);
    tsrv_stop(&t);
}

Test(serve_bench, closed_loop_keeps_each_client_busy_and_counts_every_request)
{
    tsrv t;
    tsrv_start(&t, NULL);
    int conc[] = {1, 3};
    serve_bench_opts o;
    bench_opts(&o, &t, 40, 6, 1);
    o.concurrency = conc;
    o.n_conc = 2;
    serve_bench_row rows[2];
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_bench_run(&o, rows, &err), MT_OK, "%s", err.msg);
    char *table = NULL;
    size_t tl = 0;
    FILE *f = open_memstream(&table, &tl);
    serve_bench_print(f, &o, rows, 2);
    fclose(f);
    cr_log_info("seed %llu\n%s", (unsigned long long)o.seed, table);
    cr_assert_not_null(strstr(table, "| concurrency | req/s |"), "%s", table);
    cr_assert_null(strstr(table, "knee"), "a closed loop has no knee:\n%s", table);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(rows[i].concurrency, conc[i]);
        cr_assert_geq(rows[i].sent, conc[i], "every client sends at least one request");
        cr_assert_eq(rows[i].ok, rows[i].sent, "%s", rows[i].first_error);
        cr_assert(rows[i].server_up);
        /* Every request generated output_len tokens over the measured span. */
        cr_assert_float_eq(rows[i].tok_s * rows[i].elapsed_s, (double)rows[i].ok * 6, 1e-6,
                           "%s", table);
        cr_assert_geq(rows[i].elapsed_s, o.duration_s * 0.99, "the loop ran its duration");
    }
    /* Rates and concurrencies together are refused. */
    double rate = 1;
    o.rates = &rate;
    o.n_rates = 1;
    cr_assert_eq(serve_bench_run(&o, rows, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "not both"), "%s", err.msg);
    free(table);
    tsrv_stop(&t);
}

/* Starts `moetune serve` on a model folder; returns its pid and port. */
static pid_t spawn_server(const char *dir, int *port)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        execl(MOETUNE_BIN, MOETUNE_BIN, "serve", "--model", dir, "--device", "cpu", "--port", "0",
              "--max-batch", "16", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *err = fdopen(fds[0], "r");
    char line[1024];
    *port = 0;
    while (!*port && fgets(line, sizeof line, err)) {
        const char *p = strstr(line, "listening on http://127.0.0.1:");
        if (p)
            *port = atoi(p + strlen("listening on http://127.0.0.1:"));
    }
    cr_assert_gt(*port, 0, "moetune serve printed no port");
    /* Keep draining its log so that it never blocks on a full pipe. */
    if (fork() == 0) {
        while (fgets(line, sizeof line, err))
            ;
        _exit(0);
    }
    fclose(err);
    return pid;
}

Test(serve_bench, serve_and_bench_serve_commands_end_to_end)
{
    signal(SIGPIPE, SIG_IGN);
    char dir[512];
    tmp_dir_make(dir, sizeof dir, "mt_serve_cli");
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tiny_write(dir, 2, &err), MT_OK, "%s", err.msg);
    int port;
    pid_t pid = spawn_server(dir, &port);
    tsrv t;
    memset(&t, 0, sizeof t);
    snprintf(t.url_text, sizeof t.url_text, "http://127.0.0.1:%d", port);
    cr_assert_eq(serve_url_parse(t.url_text, &t.url, NULL), MT_OK);
    int st = 0;
    for (int i = 0; i < 9000 && st != 200; i++) { /* a cold kernel cache takes a minute */
        cJSON *j = NULL;
        st = http(&t, "GET", "/health", NULL, &j, NULL);
        cJSON_Delete(j);
        if (st != 200) {
            cr_assert_eq(st, 503, "/health while loading");
            usleep(100000);
        }
    }
    cr_assert_eq(st, 200);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "%s bench-serve --url %s --input-len 64 --output-len 8 --cache-hit 0.5 --rates 2,4 "
             "--duration 2 --seed 7 2>&1",
             MOETUNE_BIN, t.url_text);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    cr_log_info("%s", out);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "bench-serve failed:\n%s", out);
    cr_assert_not_null(strstr(out, "| rate | req/s | tok/s | TTFT p50 / p95 | ITL p50 / p95 |"));
    cr_assert_not_null(strstr(out, "| 2 | "));
    cr_assert_not_null(strstr(out, "| 4 | "));
    cr_assert_not_null(strstr(out, "knee: "));
    cr_assert_not_null(strstr(out, "server: up after every row"));
    /* Bad usage is a usage error, not a crash. */
    snprintf(cmd, sizeof cmd, "%s bench-serve --url %s --rates -1 >/dev/null 2>&1", MOETUNE_BIN,
             t.url_text);
    rc = system(cmd);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
    kill(pid, SIGTERM);
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "moetune serve ended with %d", ws);
    tmp_rm_tree(dir);
}
