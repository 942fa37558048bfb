/* cmd_serve.c: `moetune serve`: the OpenAI-compatible server on a model
 * folder, until SIGINT or SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "serve/serve_server.h"
#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moetune serve --model DIR [--db FILE] [--device D] [--host 127.0.0.1]\n"
            "                     [--port 8080] [--max-batch N] [--kv-pages N]\n"
            "                     [--max-batch-tokens N] [--threads N] [--max-cached N]\n"
            "                     [--served-model-name NAME] [--max-body BYTES]\n"
            "                     [--batch-invariant] [--speculative-steps K]\n"
            "                     [--act-quant none|mxfp4|int8] [--ranks N [--tp]]\n"
            "Serves the checkpoint in DIR over HTTP with OpenAI's API: POST /v1/completions,\n"
            "POST /v1/chat/completions (streaming or not), GET /v1/models, GET /health,\n"
            "GET /metrics (Prometheus), POST /tokenize, POST /detokenize. Kernels come from\n"
            "the tuning database FILE (default configs without one). Requests are batched\n"
            "continuously: --max-batch running requests at most (default 64), steps of at\n"
            "most --max-batch-tokens tokens (default 512), --kv-pages KV pages of 16 tokens\n"
            "(default: the runtime's), --max-cached finished sequences kept for prefix\n"
            "reuse (default 64, 0 to turn the prefix cache off). --port 0 picks a free port.\n"
            "--batch-invariant runs one config per kernel at every token count and no\n"
            "split-K: a request's greedy output then does not change with the load.\n"
            "--speculative-steps K (1-8) drafts K tokens per request and step with the\n"
            "checkpoint's MTP layer and verifies them in the next step; the acceptance\n"
            "rate is in /metrics and in each response's usage.speculative.\n"
            "--act-quant overrides the checkpoint's activation quantization of the expert\n"
            "GEMMs: none (a16w4), mxfp4 (a4w4) or int8 (a8w4, cpu devices only).\n"
            "--ranks N runs under `mpirun -np N moetune serve --ranks N ...` (every rank\n"
            "with the same options): each rank holds 1/N of the routed experts (expert\n"
            "parallelism over MPI); rank 0 serves HTTP and schedules, and announces each\n"
            "step to the other ranks, which serve their experts to it. A rank that dies\n"
            "ends the whole job (mpirun's abort), server included. --tp adds tensor\n"
            "parallelism: each rank also holds 1/N of the attention heads, of o_proj's\n"
            "rows and of the vocabulary, runs every step with rank 0 and mirrors its\n"
            "sequences.\n"
            "Runs until SIGINT or SIGTERM.\n");
}

static bool int_opt(const char *v, const char *name, long lo, long hi, long *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        cli_error("serve", "%s '%s' must be an integer in [%ld, %ld]", name, v, lo, hi);
        return false;
    }
    *out = x;
    return true;
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

int cmd_serve(int argc, char **argv)
{
    serve_server_opts o;
    memset(&o, 0, sizeof o);
    o.engine.rt.device = "auto";
    o.host = "127.0.0.1";
    o.port = 8080;
    bool bad = false, cache_off = false;
    const char *v;
    long x, ranks = 0;
    for (int i = 1; i < argc && !bad; i++) {
        if (cli_flag(argv[i], "--help") || cli_flag(argv[i], "-h")) {
            usage(stdout);
            return CLI_OK;
        } else if (cli_flag(argv[i], "--batch-invariant")) {
            o.engine.rt.batch_invariant = true;
        } else if (cli_flag(argv[i], "--tp")) {
            o.engine.rt.tp = true;
        } else if ((v = cli_opt(argc, argv, &i, "--model", &bad))) {
            o.engine.rt.model_dir = v;
        } else if ((v = cli_opt(argc, argv, &i, "--db", &bad))) {
            o.engine.rt.db_path = v;
        } else if ((v = cli_opt(argc, argv, &i, "--device", &bad))) {
            o.engine.rt.device = v;
        } else if ((v = cli_opt(argc, argv, &i, "--host", &bad))) {
            o.host = v;
        } else if ((v = cli_opt(argc, argv, &i, "--port", &bad))) {
            bad = !int_opt(v, "--port", 0, 65535, &x);
            o.port = (int)x;
        } else if ((v = cli_opt(argc, argv, &i, "--act-quant", &bad))) {
            o.engine.rt.act_quant_set = true;
            if (!model_act_quant_parse(v, &o.engine.rt.act_quant)) {
                cli_error("serve", "--act-quant '%s': none, mxfp4 or int8", v);
                bad = true;
            }
        } else if ((v = cli_opt(argc, argv, &i, "--speculative-steps", &bad))) {
            bad = !int_opt(v, "--speculative-steps", 0, MODEL_SPEC_MAX_STEPS, &x);
            o.engine.rt.speculative_steps = (int)x;
        } else if ((v = cli_opt(argc, argv, &i, "--max-batch", &bad))) {
            bad = !int_opt(v, "--max-batch", 1, 4096, &x);
            o.engine.max_batch = (int)x;
        } else if ((v = cli_opt(argc, argv, &i, "--kv-pages", &bad))) {
            bad = !int_opt(v, "--kv-pages", 1, 1L << 30, &x);
            o.engine.rt.kv_pages = (int)x;
        } else if ((v = cli_opt(argc, argv, &i, "--max-batch-tokens", &bad))) {
            bad = !int_opt(v, "--max-batch-tokens", 1, 1L << 20, &x);
            o.engine.rt.max_batch_tokens = (int)x;
        } else if ((v = cli_opt(argc, argv, &i, "--threads", &bad))) {
            bad = !int_opt(v, "--threads", 0, 4096, &x);
            o.engine.rt.threads = (int)x;
        } else if ((v = cli_opt(argc, argv, &i, "--max-cached", &bad))) {
            bad = !int_opt(v, "--max-cached", 0, 1 << 20, &x);
            o.engine.max_cached = (int)x;
            cache_off = x == 0;
        } else if ((v = cli_opt(argc, argv, &i, "--served-model-name", &bad))) {
            o.model_name = v;
        } else if ((v = cli_opt(argc, argv, &i, "--ranks", &bad))) {
            bad = !int_opt(v, "--ranks", 1, 1 << 16, &ranks);
        } else if ((v = cli_opt(argc, argv, &i, "--max-body", &bad))) {
            bad = !int_opt(v, "--max-body", 1024, 1L << 30, &x);
            o.max_body = (size_t)x;
        } else if (!bad) {
            cli_error("serve", "unknown option '%s'", argv[i]);
            bad = true;
        }
    }
    if (bad || !o.engine.rt.model_dir) {
        if (!bad)
            cli_error("serve", "--model DIR is required");
        usage(stderr);
        return CLI_USAGE;
    }
    if (cache_off)
        o.engine.max_cached = -1;
    mt_comm *comm = NULL;
    mt_err err = MT_ERR_INIT;
    if (o.engine.rt.tp && !ranks) {
        cli_error("serve", "--tp splits the model over the --ranks N of mpirun");
        return CLI_USAGE;
    }
    if (ranks) {
        if (mt_comm_open("mpi", &comm, &err) != MT_OK) {
            cli_error("serve", "--ranks: %s", err.msg);
            return CLI_FAIL;
        }
        if (mt_comm_size(comm) != ranks) {
            cli_error("serve", "--ranks %ld, but mpirun started %d ranks", ranks,
                      mt_comm_size(comm));
            mt_comm_close(comm);
            return CLI_FAIL;
        }
        o.engine.rt.comm = comm;
        o.engine.rt.comm_lead = true;
        if (mt_comm_rank(comm) != 0) {
            int rc = serve_follow(&o.engine.rt, comm);
            mt_comm_close(comm);
            return rc;
        }
    }

    /* Every thread started from here on inherits the mask, so only sigwait
     * below sees the signals. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    serve_server *s = NULL;
    if (serve_server_start(&o, &s, &err)) {
        cli_error("serve", "%s", err.msg);
        mt_comm_close(comm);
        return CLI_FAIL;
    }
    fprintf(stderr, "moetune serve: listening on http://%s:%d (loading %s on %s)\n", o.host,
            serve_server_port(s), o.engine.rt.model_dir, o.engine.rt.device);
    int rc = CLI_OK;
    if (serve_engine_wait_ready(serve_server_engine(s), 1e9, &err) == MT_OK) {
        const serve_model_info *in = serve_engine_info(serve_server_engine(s));
        fprintf(stderr,
                "moetune serve: ready: context %lld tokens, %lld KV pages of %d tokens, "
                "batch %d, step %d tokens\n",
                (long long)in->max_context, (long long)in->kv_pages_total, in->page_size,
                in->max_batch, in->token_budget);
        int sig = 0;
        sigwait(&sigs, &sig);
        fprintf(stderr, "moetune serve: signal %d, stopping\n", sig);
    } else {
        cli_error("serve", "%s", err.msg);
        rc = CLI_FAIL;
    }
    serve_server_stop(s); /* with --ranks: closing the runtime stops the other ranks */
    mt_comm_close(comm);
    return rc;
}
