/* cmd_bench_serve.c: `moetune bench-serve`: WORKLOAD.md's measurement
 * (Poisson arrivals, shared prefixes, streaming TTFT and inter-token
 * latency) against a running server; prints the table and the knee. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_bench.h"
#include "cli.h"

#define MAX_RATES 64

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moetune bench-serve --url URL --input-len N --output-len N --cache-hit F\n"
            "                           --rates LIST | --concurrency LIST\n"
            "                           [--duration S] [--ttft-limit S]\n"
            "                           [--timeout S] [--seed N] [--token-range LO:HI]\n"
            "For each rate in LIST (requests per second, e.g. 0.5,1,2), sends streaming\n"
            "completions with Poisson arrivals for S seconds (default 30) to the server at URL\n"
            "(loopback only): token-id prompts of N tokens whose first F*N tokens are a shared\n"
            "prefix, N output tokens each (ignore_eos). Prints req/s, output tok/s, TTFT and\n"
            "inter-token latency p50/p95, success and the prefix-cache hit per rate, and the\n"
            "knee: the highest rate with TTFT p95 within --ttft-limit (default 5 s) and every\n"
            "request succeeding. Prompt ids are drawn from [LO, HI) (default 16:256).\n"
            "--concurrency C1,C2,...: a closed loop instead of rates: C clients each send their\n"
            "next request when the previous one ended, for S seconds; --concurrency 1 is the\n"
            "single-stream speed (compare servers started with and without\n"
            "--speculative-steps).\n"
            "Exit status 1 when the server stopped answering /health.\n");
}

static bool num(const char *v, const char *name, double lo, double hi, double *out)
{
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !(x >= lo && x <= hi)) {
        cli_error("bench-serve", "%s '%s' must be a number in [%g, %g]", name, v, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

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

int cmd_bench_serve(int argc, char **argv)
{
    serve_bench_opts o;
    memset(&o, 0, sizeof o);
    double rates[MAX_RATES], conc_v[MAX_RATES], x;
    int conc[MAX_RATES];
    bool bad = false;
    const char *v;
    for (int i = 1; i < argc && !bad; i++) {
        if (cli_flag(argv[i], "--help") || cli_flag(argv[i], "-h")) {
            usage(stdout);
            return CLI_OK;
        } else if ((v = cli_opt(argc, argv, &i, "--url", &bad))) {
            o.url = v;
        } else if ((v = cli_opt(argc, argv, &i, "--input-len", &bad))) {
            bad = !num(v, "--input-len", 1, 1 << 24, &x);
            o.input_len = (int)x;
        } else if ((v = cli_opt(argc, argv, &i, "--output-len", &bad))) {
            bad = !num(v, "--output-len", 1, 1 << 24, &x);
            o.output_len = (int)x;
        } else if ((v = cli_opt(argc, argv, &i, "--cache-hit", &bad))) {
            bad = !num(v, "--cache-hit", 0, 0.999999, &o.cache_hit);
        } else if ((v = cli_opt(argc, argv, &i, "--rates", &bad))) {
            o.n_rates = parse_rates(v, rates);
            if (o.n_rates < 1) {
                cli_error("bench-serve", "--rates '%s' must be a list of positive numbers", v);
                bad = true;
            }
            o.rates = rates;
        } else if ((v = cli_opt(argc, argv, &i, "--concurrency", &bad))) {
            o.n_conc = parse_rates(v, conc_v);
            for (int k = 0; k < o.n_conc; k++) {
                conc[k] = (int)conc_v[k];
                if (conc[k] != conc_v[k] || conc[k] > 4096)
                    o.n_conc = -1;
            }
            if (o.n_conc < 1) {
                cli_error("bench-serve", "--concurrency '%s' must be a list of integers in "
                          "[1, 4096]", v);
                bad = true;
            }
            o.concurrency = conc;
        } else if ((v = cli_opt(argc, argv, &i, "--duration", &bad))) {
            bad = !num(v, "--duration", 0.001, 1e6, &o.duration_s);
        } else if ((v = cli_opt(argc, argv, &i, "--ttft-limit", &bad))) {
            bad = !num(v, "--ttft-limit", 1e-6, 1e6, &o.ttft_limit_s);
        } else if ((v = cli_opt(argc, argv, &i, "--timeout", &bad))) {
            bad = !num(v, "--timeout", 0.001, 1e6, &o.timeout_s);
        } else if ((v = cli_opt(argc, argv, &i, "--seed", &bad))) {
            bad = !num(v, "--seed", 0, 9007199254740992.0, &x);
            o.seed = (uint64_t)x;
        } else if ((v = cli_opt(argc, argv, &i, "--token-range", &bad))) {
            int lo, hi;
            if (sscanf(v, "%d:%d", &lo, &hi) != 2 || lo < 0 || hi <= lo) {
                cli_error("bench-serve", "--token-range '%s' must be LO:HI with 0 <= LO < HI", v);
                bad = true;
            }
            o.token_lo = lo;
            o.token_hi = hi;
        } else if (!bad) {
            cli_error("bench-serve", "unknown option '%s'", argv[i]);
            bad = true;
        }
    }
    if (!bad && (!o.url || !o.input_len || !o.output_len || (!o.n_rates == !o.n_conc))) {
        cli_error("bench-serve", "--url, --input-len, --output-len and one of --rates and "
                  "--concurrency are required");
        bad = true;
    }
    if (bad) {
        usage(stderr);
        return CLI_USAGE;
    }
    serve_bench_row rows[MAX_RATES];
    o.progress = stderr;
    mt_err err = MT_ERR_INIT;
    if (serve_bench_run(&o, rows, &err)) {
        cli_error("bench-serve", "%s", err.msg);
        return CLI_FAIL;
    }
    int n_rows = o.n_conc > 0 ? o.n_conc : o.n_rates;
    serve_bench_print(stdout, &o, rows, n_rows);
    for (int i = 0; i < n_rows; i++)
        if (!rows[i].server_up)
            return CLI_FAIL;
    return CLI_OK;
}
