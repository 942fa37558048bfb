/* cmd_serve.c: `moetune serve`: the OpenAI-compatible server on a model
 * folder, until SIGINT or SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "serve/serve_server.h"
#include "serve/serve_tune.h"
#include "cli.h"
#include "cli_ranks.h"

typedef struct serve_cli {
    serve_server_opts o;
    int ranks, max_body;
    bool max_cached_given;
    bool tune_misses, tune_cold;
    int tune_first;
    serve_tune_opts tune;
} serve_cli;

/* --tune-share: "10%" or a fraction, (0, 1]. */
static bool set_share(void *dst, const char *v, char *err, size_t cap)
{
    char *end = NULL;
    double x = strtod(v, &end);
    if (end && *end == '%' && !end[1])
        x /= 100;
    else if (!end || *end)
        x = -1;
    if (!(x > 0 && x <= 1)) {
        snprintf(err, cap, "a share of the device: 10%% or 0.1, above 0 and at most 1");
        return false;
    }
    *(double *)dst = x;
    return true;
}

static int parse(int argc, char **argv, serve_cli *c)
{
    model_runtime_opts *rt = &c->o.engine.rt;
    const cli_opt opts[] = {
        {.name = "--model", .type = CLI_OPT_STRING, .dst = &rt->model_dir, .arg = "DIR",
         .flags = CLI_OPT_REQUIRED, .help = "the checkpoint folder"},
        {.name = "--db", .type = CLI_OPT_STRING, .dst = &rt->db_path, .arg = "FILE",
         .def_text = "none: default configs", .help = "the tuning database kernels come from"},
        {.name = "--device", .type = CLI_OPT_STRING, .dst = &rt->device, .arg = "D",
         .def = "auto", .help = "cpu, emu, hip, hip:N, cuda or auto"},
        {.name = "--host", .type = CLI_OPT_STRING, .dst = &c->o.host, .arg = "ADDR",
         .def = "127.0.0.1", .help = "the address to listen on"},
        {.name = "--port", .type = CLI_OPT_INT, .dst = &c->o.port, .arg = "N", .def = "8080",
         .min = 0, .max = 65535, .help = "the port; 0 picks a free one"},
        {.name = "--max-batch", .type = CLI_OPT_INT, .dst = &c->o.engine.max_batch, .arg = "N",
         .min = 1, .max = 4096, .def_text = "64", .help = "running requests at most"},
        {.name = "--kv-pages", .type = CLI_OPT_INT, .dst = &rt->kv_pages, .arg = "N", .min = 1,
         .max = 1 << 30, .def_text = "the runtime's: 8 full contexts",
         .help = "KV pages of 16 tokens"},
        {.name = "--max-batch-tokens", .type = CLI_OPT_INT, .dst = &rt->max_batch_tokens,
         .arg = "N", .min = 1, .max = 1 << 20, .def_text = "512",
         .help = "tokens of a step at most"},
        {.name = "--threads", .type = CLI_OPT_INT, .dst = &rt->threads, .arg = "N", .min = 0,
         .max = 4096, .def_text = "0: all cores", .help = "cpu and emu threads"},
        {.name = "--max-cached", .type = CLI_OPT_INT, .dst = &c->o.engine.max_cached,
         .arg = "N", .min = 0, .max = 1 << 20, .def_text = "64", .given = &c->max_cached_given,
         .help = "finished sequences kept for prefix reuse; 0 turns the prefix cache off"},
        {.name = "--served-model-name", .type = CLI_OPT_STRING, .dst = &c->o.model_name,
         .arg = "NAME", .def_text = "the model folder's name", .help = "the id in /v1/models"},
        {.name = "--max-body", .type = CLI_OPT_INT, .dst = &c->max_body, .arg = "BYTES",
         .min = 1024, .max = 1 << 30, .def_text = "8 MiB", .help = "request body limit"},
        {.name = "--batch-invariant", .type = CLI_OPT_FLAG, .dst = &rt->batch_invariant,
         .help = "one config per kernel at every token count and no split-K: a request's "
                 "greedy output then does not change with the load"},
        {.name = "--speculative-steps", .type = CLI_OPT_INT, .dst = &rt->speculative_steps,
         .arg = "K", .min = 0, .max = MODEL_SPEC_MAX_STEPS, .def = "0",
         .help = "draft K tokens per request and step with the checkpoint's MTP layer and "
                 "verify them in the next step; the acceptance rate is in /metrics and in "
                 "each response's usage.speculative"},
        {.name = "--act-quant", .type = CLI_OPT_CUSTOM, .dst = &rt->act_quant,
         .set = cli_set_act_quant, .given = &rt->act_quant_set, .arg = CLI_ACT_QUANT_ARG,
         .def_text = "the checkpoint's Quark config",
         .help = "activation quantization of the expert GEMMs: none (a16w4), mxfp4 (a4w4) "
                 "or int8 (a8w4, cpu devices only)"},
        {.name = "--ranks", .type = CLI_OPT_INT, .dst = &c->ranks, .arg = "N", .min = 1,
         .max = 1 << 16,
         .help = "run under `mpirun -np N moetune serve --ranks N ...` (every rank with the "
                 "same options): each rank holds 1/N of the routed experts (expert "
                 "parallelism over MPI) and the KV cache of its own sequences (data-parallel "
                 "attention): rank 0 serves HTTP and schedules, places each sequence on the "
                 "rank with the most free KV pages, then the least work so far (a "
                 "prefix-cache hit on the rank holding "
                 "the prefix), and announces each step; every rank runs its sequences' "
                 "attention, MTP drafts and experts, and the logits come back to rank 0. A "
                 "rank that dies ends the whole job (mpirun's abort), server included"},
        {.name = "--tune-misses", .type = CLI_OPT_FLAG, .dst = &c->tune_misses,
         .help = "tune in the background what the runtime runs without a tuned config "
                 "(its misses, nearest-bucket selections), costliest first in the time the "
                 "load spends in them; every candidate runs in a worker process, verified "
                 "against the reference; a winner confirmed faster than the default goes "
                 "into --db and is swapped into the running server between steps (not on "
                 "a --batch-invariant server); a swap that runs slower here is undone and "
                 "marked stale; SIGUSR1 pauses the tuner, SIGUSR2 resumes it"},
        {.name = "--tune-share", .type = CLI_OPT_CUSTOM, .dst = &c->tune.share,
         .set = set_share, .arg = "P", .def = "10%",
         .help = "with --tune-misses: the tuner's share of the device: compile threads at "
                 "most P of the cores (at least 1) and compiling P of a busy server's time, "
                 "everything it runs at the lowest priority"},
        {.name = "--tune-budget", .type = CLI_OPT_CUSTOM, .dst = &c->tune.budget,
         .set = cli_set_budget, .arg = "B", .def_text = "15%",
         .help = "with --tune-misses: the search's budget per kernel and M, as tune's "
                 "--budget (trials, a share of the space, or wall time: 30s)"},
        {.name = "--tune-first", .type = CLI_OPT_INT, .dst = &c->tune_first, .arg = "N",
         .min = 0, .max = 1 << 20, .def = "8",
         .help = "with --tune-misses: coverage first: every kernel and M the load calls is "
                 "tuned with at most N trials (a kernel's first M: N/2 when N > 3; an M "
                 "next to a tuned one: the default and that one's winners alone) before "
                 "the costliest are searched to the whole budget (0: one pass, the whole "
                 "budget each)"},
        {.name = "--tune-cold", .type = CLI_OPT_FLAG, .dst = &c->tune_cold,
         .help = "with --tune-misses: flush the caches between a candidate's timed runs, "
                 "as tune does (default: time warm, as the server runs its kernels; a "
                 "flush also evicts what the serving threads work on)"},
        {.name = "--tune-compile-busy", .type = CLI_OPT_FLAG, .dst = &c->tune.compile_busy,
         .help = "with --tune-misses: compile candidates while requests run too (default: "
                 "the tuner's compilers are held stopped while any request waits or runs)"},
        {.name = "--tune-measure-busy", .type = CLI_OPT_FLAG, .dst = &c->tune.measure_busy,
         .help = "with --tune-misses: measure candidates back to back while requests run "
                 "(default: for the share of a busy server's device, each measurement "
                 "followed by a rest)"},
        {.name = "--tune-queue", .type = CLI_OPT_INT, .dst = &c->tune.queue_max, .arg = "N",
         .min = 1, .max = 1 << 20, .def = "1",
         .help = "with --tune-misses: measure only while fewer than N requests wait for a "
                 "slot"},
        {.name = "--tp", .type = CLI_OPT_FLAG, .dst = &rt->tp,
         .help = "with --ranks: tensor parallelism too: each rank also holds 1/N of the "
                 "attention heads, of o_proj's rows and of the vocabulary, runs every step "
                 "with rank 0 and mirrors its sequences"},
        {.name = "--tp-size", .type = CLI_OPT_INT, .dst = &rt->tp_size, .arg = "N", .min = 1,
         .max = 4096, .def_text = "every rank",
         .help = "with --tp: ranks per tensor-parallel group (it must divide --ranks); the "
                 "routed experts stay split over every rank, and each group holds and runs "
                 "its own sequences (data-parallel attention over the groups)"},
        {0},
    };
    const cli_cmd cmd = {
        .name = "serve", .opts = opts,
        .usage = "serve --model DIR [--db FILE] [--device D] [--host 127.0.0.1]\n"
                 "      [--port 8080] [--max-batch N] [--kv-pages N]\n"
                 "      [--max-batch-tokens N] [--threads N] [--max-cached N]\n"
                 "      [--served-model-name NAME] [--max-body BYTES]\n"
                 "      [--batch-invariant] [--speculative-steps K]\n"
                 "      [--act-quant none|mxfp4|int8] [--ranks N [--tp [--tp-size N]]]\n"
                 "      [--tune-misses [--tune-share P] [--tune-budget B] [--tune-first N]\n"
                 "      [--tune-cold] [--tune-compile-busy] [--tune-measure-busy] [--tune-queue N]]",
        .about = "Serves the checkpoint in DIR over HTTP with OpenAI's API: POST "
                 "/v1/completions, POST /v1/chat/completions (streaming or not), GET "
                 "/v1/models, GET /health, GET /metrics (Prometheus), POST /tokenize, POST "
                 "/detokenize. Kernels come from the tuning database FILE (default configs "
                 "without one). Requests are batched continuously. Runs until SIGINT or "
                 "SIGTERM."};
    return cli_opts_parse(&cmd, argc, argv, 1);
}

/* Ranks other than 0 of `serve --ranks N`: the same runtime, following
 * rank 0's steps until rank 0 stops (SIGINT and SIGTERM wait for that: the
 * leader's signal stops the job cleanly). */
static int serve_follow(model_runtime_opts *o, mt_comm *comm)
{
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    FILE *quiet = fopen("/dev/null", "w");
    if (quiet)
        o->log = quiet; /* rank 0 reports */
    model_runtime *rt = NULL;
    mt_err err = MT_ERR_INIT;
    int64_t steps = 0;
    mt_status st = model_runtime_open(o, &rt, &err);
    if (st == MT_OK)
        st = model_runtime_follow(rt, &steps, &err);
    if (st != MT_OK)
        cli_error("serve", "rank %d: %s", mt_comm_rank(comm), err.msg);
    else
        fprintf(stderr, "moetune serve: rank %d: followed %lld steps; rank 0 stopped\n",
                mt_comm_rank(comm), (long long)steps);
    model_runtime_close(rt);
    if (quiet)
        fclose(quiet);
    return st == MT_OK ? CLI_OK : CLI_FAIL;
}

/* --ranks N: the communicators of the job (cli_ranks.h). Ranks other
 * than 0 follow rank 0 here and *done holds their exit code. */
static int open_ranks(serve_cli *c, cli_ranks *ranks, bool *done)
{
    mt_err err = MT_ERR_INIT;
    if (cli_ranks_open("mpi", &c->o.engine.rt.device, ranks, &err) != MT_OK) {
        cli_error("serve", "--ranks: %s", err.msg);
        return CLI_FAIL;
    }
    mt_comm *comm = ranks->xchg;
    if (mt_comm_size(comm) != c->ranks) {
        cli_error("serve", "--ranks %d, but mpirun started %d ranks", c->ranks,
                  mt_comm_size(comm));
        cli_ranks_close(ranks);
        return CLI_FAIL;
    }
    c->o.engine.rt.comm = comm;
    c->o.engine.rt.comm_lead = true;
    /* Data-parallel attention: each rank, or each tensor-parallel group of
     * --tp-size ranks, runs its own sequences (not with --tp over every
     * rank: one group). */
    model_runtime_opts *rt = &c->o.engine.rt;
    rt->dp = !rt->tp || (rt->tp_size > 0 && rt->tp_size < c->ranks);
    if (mt_comm_rank(comm) != 0) {
        *done = true;
        int rc = serve_follow(&c->o.engine.rt, comm);
        cli_ranks_close(ranks);
        return rc;
    }
    return CLI_OK;
}

/* Starts the server, waits for the model, then for SIGINT or SIGTERM
 * (SIGUSR1 and SIGUSR2 meanwhile pause and resume live tuning).
 * tuner (may be NULL): the background tuner, created before any thread. */
static int run_server(const serve_server_opts *o, serve_tune *tuner)
{
    /* Every thread started from here on inherits the mask, so only sigwait
     * below sees the signals. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGUSR1); /* pause live tuning */
    sigaddset(&sigs, SIGUSR2); /* resume it */
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    serve_server *s = NULL;
    mt_err err = MT_ERR_INIT;
    if (serve_server_start(o, &s, &err)) {
        cli_error("serve", "%s", err.msg);
        return CLI_FAIL;
    }
    fprintf(stderr, "moetune serve: listening on http://%s:%d (loading %s on %s)\n", o->host,
            serve_server_port(s), o->engine.rt.model_dir, o->engine.rt.device);
    int rc = CLI_OK;
    if (serve_engine_wait_ready(serve_server_engine(s), 1e9, &err) == MT_OK) {
        const serve_model_info *in = serve_engine_info(serve_server_engine(s));
        fprintf(stderr,
                "moetune serve: ready: context %lld tokens, %lld KV pages of %d tokens, "
                "batch %d, step %d tokens\n",
                (long long)in->max_context, (long long)in->kv_pages_total, in->page_size,
                in->max_batch, in->token_budget);
        if (tuner && serve_tune_start(tuner, serve_engine_kernels(serve_server_engine(s)),
                                      serve_server_metrics(s), &err) != MT_OK)
            cli_error("serve", "--tune-misses: %s (serving without it)", err.msg);
        int sig = 0;
        while (sigwait(&sigs, &sig) == 0 && (sig == SIGUSR1 || sig == SIGUSR2)) {
            if (tuner)
                serve_tune_pause(tuner, sig == SIGUSR1);
            else
                fprintf(stderr, "moetune serve: SIGUSR%d pauses or resumes live tuning; "
                        "this server runs without --tune-misses\n", sig == SIGUSR1 ? 1 : 2);
        }
        fprintf(stderr, "moetune serve: signal %d, stopping\n", sig);
    } else {
        cli_error("serve", "%s", err.msg);
        rc = CLI_FAIL;
    }
    /* With --ranks a stop waits for the step in flight, whose exchanges
     * never end if a rank died (mpirun's SIGTERM to this rank follows such
     * a death, and its SIGKILL comes 1 s later): after 250 ms the exchanges
     * are aborted, the step fails and its clients get an error event. */
    serve_tune_destroy(tuner); /* before the kernel set it swaps into goes */
    cli_ranks_watch *w = o->engine.rt.comm ? cli_ranks_watch_start(o->engine.rt.comm, 250) : NULL;
    serve_server_stop(s); /* with --ranks: closing the runtime stops the other ranks */
    if (cli_ranks_watch_end(w))
        fprintf(stderr, "moetune serve: the step in flight did not finish: exchanges aborted\n");
    return rc;
}

int cmd_serve(int argc, char **argv)
{
    serve_cli c;
    memset(&c, 0, sizeof c);
    int rc = parse(argc, argv, &c);
    if (rc)
        return rc == CLI_HELP ? CLI_OK : rc;
    if (c.max_cached_given && c.o.engine.max_cached == 0)
        c.o.engine.max_cached = -1; /* 0 given: no prefix cache; 0 unset: the default */
    c.o.max_body = (size_t)c.max_body;
    if (c.o.engine.rt.tp && !c.ranks) {
        cli_error("serve", "--tp splits the model over the --ranks N of mpirun");
        return CLI_USAGE;
    }
    if (c.o.engine.rt.tp_size && !c.o.engine.rt.tp) {
        cli_error("serve", "--tp-size N sets the size of --tp's groups");
        return CLI_USAGE;
    }
    serve_tune *tuner = NULL;
    if (c.tune_misses) {
        if (c.ranks) {
            cli_error("serve", "--tune-misses runs on one device: not with --ranks");
            return CLI_USAGE;
        }
        if (!c.o.engine.rt.db_path) {
            cli_error("serve", "--tune-misses writes its winners to the tuning database: give "
                      "--db FILE (an empty or missing file is fine)");
            return CLI_USAGE;
        }
        c.tune.db_path = c.o.engine.rt.db_path;
        c.tune.first_trials = c.tune_first > 0 ? c.tune_first : -1;
        c.tune.cold_timing = c.tune_cold;
        c.tune.log = stderr;
        c.o.engine.live_swaps = true;
        mt_err err = MT_ERR_INIT;
        /* Before any thread: it forks the tuner's worker spawner. */
        if (serve_tune_create(&c.tune, &tuner, &err) != MT_OK) {
            cli_error("serve", "--tune-misses: %s", err.msg);
            return CLI_FAIL;
        }
    }
    cli_ranks ranks = {0};
    bool done = false;
    if (c.ranks && ((rc = open_ranks(&c, &ranks, &done)) != CLI_OK || done))
        return rc;
    rc = run_server(&c.o, tuner);
    cli_ranks_close(&ranks);
    return rc;
}
