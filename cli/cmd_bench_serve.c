/* cmd_bench_serve.c: `moetune bench-serve`: WORKLOAD.md's measurement
 * (Poisson arrivals, shared prefixes, streaming TTFT and inter-token
 * latency) against a running server; prints the table and the knee. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_bench.h"
#include "cli.h"

#define MAX_RATES 64

typedef struct bench_serve_cli {
    serve_bench_opts o;
    double rates[MAX_RATES];
    int64_t conc_v[MAX_RATES];
    int conc[MAX_RATES];
    cli_int_list conc_list;
} bench_serve_cli;

static int parse_rates(const char *s, double *out)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        double r = strtod(p, &end);
        if (end == p || !(r > 0) || n >= MAX_RATES)
            return -1;
        out[n++] = r;
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        p = end;
    }
    return n;
}

/* --rates: dst is the bench_serve_cli. */
static bool set_rates(void *dst, const char *v, char *err, size_t cap)
{
    bench_serve_cli *c = dst;
    c->o.n_rates = parse_rates(v, c->rates);
    c->o.rates = c->rates;
    if (c->o.n_rates >= 1)
        return true;
    snprintf(err, cap, "must be a list of up to %d positive numbers", MAX_RATES);
    return false;
}

/* --token-range LO:HI: dst is the serve_bench_opts. */
static bool set_token_range(void *dst, const char *v, char *err, size_t cap)
{
    serve_bench_opts *o = dst;
    int lo, hi;
    char extra;
    if (sscanf(v, "%d:%d%c", &lo, &hi, &extra) != 2 || lo < 0 || hi <= lo) {
        snprintf(err, cap, "must be LO:HI with 0 <= LO < HI");
        return false;
    }
    o->token_lo = lo;
    o->token_hi = hi;
    return true;
}

static const char usage_text[] =
    "bench-serve --url URL --input-len N --output-len N --cache-hit F\n"
    "            --rates LIST | --concurrency LIST\n"
    "            [--duration S] [--ttft-limit S] [--timeout S] [--seed N]\n"
    "            [--token-range LO:HI]";

static int parse(int argc, char **argv, bench_serve_cli *c)
{
    serve_bench_opts *o = &c->o;
    c->conc_list = (cli_int_list){c->conc_v, MAX_RATES, 0};
    const cli_opt opts[] = {
        {.name = "--url", .type = CLI_OPT_STRING, .dst = &o->url, .arg = "URL",
         .help = "the server (loopback only), e.g. http://127.0.0.1:8080"},
        {.name = "--input-len", .type = CLI_OPT_INT, .dst = &o->input_len, .arg = "N",
         .min = 1, .max = 1 << 24, .help = "prompt tokens per request"},
        {.name = "--output-len", .type = CLI_OPT_INT, .dst = &o->output_len, .arg = "N",
         .min = 1, .max = 1 << 24, .help = "output tokens per request (ignore_eos)"},
        {.name = "--cache-hit", .type = CLI_OPT_DOUBLE, .dst = &o->cache_hit, .arg = "F",
         .min = 0, .max = 0.999999, .help = "the share of each prompt that is a shared prefix"},
        {.name = "--rates", .type = CLI_OPT_CUSTOM, .dst = c, .set = set_rates, .arg = "LIST",
         .help = "requests per second with Poisson arrivals, e.g. 0.5,1,2"},
        {.name = "--concurrency", .type = CLI_OPT_INT_LIST, .dst = &c->conc_list,
         .arg = "LIST", .min = 1, .max = 4096,
         .help = "a closed loop instead of rates: C clients each send their next request when "
                 "the previous one ended; --concurrency 1 is the single-stream speed (compare "
                 "servers started with and without --speculative-steps)"},
        {.name = "--duration", .type = CLI_OPT_DOUBLE, .dst = &o->duration_s, .arg = "S",
         .min = 0.001, .max = 1e6, .def_text = "30", .help = "seconds per rate or concurrency"},
        {.name = "--ttft-limit", .type = CLI_OPT_DOUBLE, .dst = &o->ttft_limit_s, .arg = "S",
         .min = 1e-6, .max = 1e6, .def_text = "5", .help = "the knee's limit on TTFT p95"},
        {.name = "--timeout", .type = CLI_OPT_DOUBLE, .dst = &o->timeout_s, .arg = "S",
         .min = 0.001, .max = 1e6, .def_text = "300", .help = "per request"},
        {.name = "--seed", .type = CLI_OPT_UINT64, .dst = &o->seed, .arg = "N",
         .def_text = "fresh", .help = "of the arrivals and prompts"},
        {.name = "--token-range", .type = CLI_OPT_CUSTOM, .dst = o, .set = set_token_range,
         .arg = "LO:HI", .def_text = "16:256", .help = "prompt ids are drawn from [LO, HI)"},
        {0},
    };
    const cli_cmd cmd = {
        .name = "bench-serve", .opts = opts, .usage = usage_text,
        .about = "For each rate in LIST, sends streaming completions with Poisson arrivals "
                 "for S seconds to the server at URL: token-id prompts of N tokens whose "
                 "first F*N tokens are a shared prefix, N output tokens each (ignore_eos). "
                 "Prints req/s, output tok/s, TTFT and inter-token latency p50/p95, success "
                 "and the prefix-cache hit per rate, and the knee: the highest rate with TTFT "
                 "p95 within --ttft-limit and every request succeeding. Exit status 1 when "
                 "the server stopped answering /health."};
    return cli_opts_parse(&cmd, argc, argv, 1);
}

int cmd_bench_serve(int argc, char **argv)
{
    bench_serve_cli c;
    memset(&c, 0, sizeof c);
    serve_bench_opts *o = &c.o;
    int rc = parse(argc, argv, &c);
    if (rc)
        return rc == CLI_HELP ? CLI_OK : rc;
    for (int k = 0; k < c.conc_list.n; k++)
        c.conc[k] = (int)c.conc_v[k];
    o->n_conc = c.conc_list.n;
    o->concurrency = c.conc;
    if (!o->url || !o->input_len || !o->output_len || (!o->n_rates == !o->n_conc)) {
        cli_error("bench-serve", "--url, --input-len, --output-len and one of --rates and "
                  "--concurrency are required");
        cli_opts_usage(&(cli_cmd){.name = "bench-serve", .usage = usage_text}, stderr);
        return CLI_USAGE;
    }
    serve_bench_row rows[MAX_RATES];
    o->progress = stderr;
    mt_err err = MT_ERR_INIT;
    if (serve_bench_run(o, rows, &err)) {
        cli_error("bench-serve", "%s", err.msg);
        return CLI_FAIL;
    }
    int n_rows = o->n_conc > 0 ? o->n_conc : o->n_rates;
    serve_bench_print(stdout, o, rows, n_rows);
    for (int i = 0; i < n_rows; i++)
        if (!rows[i].server_up)
            return CLI_FAIL;
    return CLI_OK;
}
