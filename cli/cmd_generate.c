/* cmd_generate.c: `moetune generate`: opens a checkpoint with the model
 * runtime (kernels picked from the tuning database, the selection report
 * on stderr), prefills a prompt, samples up to --max-tokens new tokens and
 * prints the text and ids. --logits writes the prompt positions' logits. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/rng.h"
#include "comm/comm.h"
#include "kernels/core/family.h"
#include "model/runtime.h"
#include "model/spec.h"
#include "cli.h"
#include "cli_ranks.h"

typedef struct gen_cli {
    model_runtime_opts o;
    const char *prompt, *tokens, *logits_path, *step_path, *comm_name;
    int max_tokens, top_k;
    double temp, top_p;
    uint64_t seed;
    bool seed_given, report;
} gen_cli;

static const char gen_usage[] =
    "generate --model DIR [--db FILE] [--device D]\n"
    "         (--prompt TEXT | --tokens 1,2,3) [--max-tokens N]\n"
    "         [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "         [--act-quant none|mxfp4|int8] [--kv-dtype bf16|fp8]\n"
    "         [--logits FILE] [--step-logits FILE] [--report]\n"
    "         [--batch-invariant]\n"
    "         [--speculative-steps K] [--comm self|mpi [--tp [--tp-size N]]]";

static const char gen_about[] =
    "Runs the GLM-5 checkpoint in DIR on the device with kernels from the tuning database "
    "FILE (every kernel runs its default config without one), prints the generated text "
    "(with a tokenizer) and the token ids. Sampling: temperature 0 is greedy; --top-k, "
    "--top-p and --seed shape and fix the draws.";

static int parse(int argc, char **argv, gen_cli *c)
{
    model_runtime_opts *o = &c->o;
    const cli_opt opts[] = {
        {.name = "--model", .type = CLI_OPT_STRING, .dst = &o->model_dir, .arg = "DIR",
         .help = "the checkpoint folder (required)"},
        {.name = "--db", .type = CLI_OPT_STRING, .dst = &o->db_path, .arg = "FILE",
         .def_text = "none: default configs", .help = "the tuning database kernels come from"},
        {.name = "--device", .type = CLI_OPT_STRING, .dst = &o->device, .arg = "D",
         .def = "auto", .help = "cpu, emu, hip, hip:N, cuda or auto"},
        {.name = "--prompt", .type = CLI_OPT_STRING, .dst = &c->prompt, .arg = "TEXT",
         .help = "the prompt as text (needs DIR/tokenizer.json)"},
        {.name = "--tokens", .type = CLI_OPT_STRING, .dst = &c->tokens, .arg = "1,2,3",
         .help = "the prompt as token ids"},
        {.name = "--max-tokens", .type = CLI_OPT_INT, .dst = &c->max_tokens, .arg = "N",
         .def = "32", .min = 0, .max = 1 << 30, .help = "new tokens at most"},
        {.name = "--temperature", .type = CLI_OPT_DOUBLE, .dst = &c->temp, .arg = "T",
         .def = "0", .min = 0, .max = HUGE_VAL, .help = "sampling temperature; 0: greedy"},
        {.name = "--top-k", .type = CLI_OPT_INT, .dst = &c->top_k, .arg = "K", .def = "0",
         .min = 0, .max = HUGE_VAL, .help = "sample from the K likeliest tokens; 0: off"},
        {.name = "--top-p", .type = CLI_OPT_DOUBLE, .dst = &c->top_p, .arg = "P", .def = "1",
         .min = 0, .max = 1, .help = "sample from the likeliest tokens of mass P; 1: off"},
        {.name = "--seed", .type = CLI_OPT_UINT64, .dst = &c->seed, .arg = "S",
         .given = &c->seed_given, .def_text = "fresh, printed", .help = "sampling seed"},
        {.name = "--act-quant", .type = CLI_OPT_CUSTOM, .dst = &o->act_quant,
         .set = cli_set_act_quant, .given = &o->act_quant_set, .arg = CLI_ACT_QUANT_ARG,
         .def_text = "the checkpoint's Quark config",
         .help = "activation quantization of the expert GEMMs: mxfp4 (a4w4), none (a16w4) or "
                 "int8 (a8w4, cpu devices only)"},
        {.name = "--kv-dtype", .type = CLI_OPT_CHOICE, .dst = &o->kv_dtype,
         .choices = cli_kv_dtypes, .def_text = "bf16", .help = "the KV cache dtype"},
        {.name = "--logits", .type = CLI_OPT_STRING, .dst = &c->logits_path, .arg = "FILE",
         .help = "write the logits of every prompt position as raw little-endian float32 "
                 "[prompt tokens, vocab]"},
        {.name = "--step-logits", .type = CLI_OPT_STRING, .dst = &c->step_path, .arg = "FILE",
         .help = "write the logits each generated token was sampled from, [generated "
                 "tokens, vocab] (the last prompt position's, then the decode steps': what a "
                 "server's logprobs are computed from)"},
        {.name = "--report", .type = CLI_OPT_FLAG, .dst = &c->report,
         .help = "print the full kernel selection table to stderr"},
        {.name = "--batch-invariant", .type = CLI_OPT_FLAG, .dst = &o->batch_invariant,
         .help = "one config per kernel at every token count and no split-K, so a token's "
                 "logits are bitwise the same alone, batched, in prefill or in decode"},
        {.name = "--speculative-steps", .type = CLI_OPT_INT, .dst = &o->speculative_steps,
         .arg = "K",
         .def = "0", .min = 0, .max = MODEL_SPEC_MAX_STEPS,
         .help = "draft K tokens a round with the checkpoint's MTP layer and verify them in "
                 "one step (greedy acceptance, speculative sampling above temperature 0); the "
                 "acceptance rate goes to stderr"},
        {.name = "--comm", .type = CLI_OPT_STRING, .dst = &c->comm_name, .arg = "self|mpi",
         .help = "mpi: run across the ranks of `mpirun -np N moetune generate ...` (every "
                 "rank with the same options): each rank holds 1/N of the routed experts "
                 "(expert parallelism) and of the vocabulary (embedding, lm_head); the prompt "
                 "runs on one rank, as `serve --ranks N` places a request (data-parallel "
                 "attention), and rank 0 prints and writes --logits"},
        {.name = "--tp", .type = CLI_OPT_FLAG, .dst = &o->tp,
         .help = "with --comm mpi: tensor parallelism too: each rank also holds 1/N of the "
                 "attention heads, of o_proj's rows and of the vocabulary (embedding, "
                 "lm_head), and every rank runs every token; the MoE layers split the tokens "
                 "over the ranks"},
        {.name = "--tp-size", .type = CLI_OPT_INT, .dst = &o->tp_size, .arg = "N", .min = 1,
         .max = 4096, .def_text = "every rank",
         .help = "with --tp: ranks per tensor-parallel group (it must divide the job); the "
                 "routed experts and the vocabulary stay split over every rank, and the prompt "
                 "runs in one group (data-parallel attention over the groups)"},
        {0},
    };
    const cli_cmd cmd = {.name = "generate", .usage = gen_usage, .about = gen_about,
                         .opts = opts};
    return cli_opts_parse(&cmd, argc, argv, 1);
}

/* What the table cannot say: which options go together. */
static int check_args(const gen_cli *c)
{
    if (!c->o.model_dir || !!c->prompt == !!c->tokens) {
        cli_error("generate", "--model and exactly one of --prompt, --tokens are required");
        cli_opts_usage(&(cli_cmd){.name = "generate", .usage = gen_usage}, stderr);
        return CLI_USAGE;
    }
    if (c->o.speculative_steps > 0 && (c->logits_path || c->step_path)) {
        cli_error("generate", "--logits / --step-logits and --speculative-steps: pick one");
        return CLI_USAGE;
    }
    if (c->o.tp && !c->comm_name) {
        cli_error("generate", "--tp splits the model over the ranks of --comm mpi");
        return CLI_USAGE;
    }
    if (c->o.tp_size && !c->o.tp) {
        cli_error("generate", "--tp-size N sets the size of --tp's groups");
        return CLI_USAGE;
    }
    return CLI_OK;
}

static int parse_tokens(const char *s, int32_t **out, size_t *n)
{
    size_t cap = 16, k = 0;
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    const char *p = s;
    while (ids && *p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < INT32_MIN || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            return -1;
        }
        if (k == cap) {
            int32_t *q = realloc(ids, sizeof(int32_t) * (cap *= 2));
            if (!q) {
                free(ids);
                return -1;
            }
            ids = q;
        }
        ids[k++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (!ids || !k) {
        free(ids);
        return -1;
    }
    *out = ids;
    *n = k;
    return 0;
}

/* One generation: the runtime, the prompt, the buffers and the timings. */
typedef struct gen_run {
    model_runtime *rt;
    mt_comm *comm;          /* the exchanges' communicator (ranks.xchg) */
    cli_ranks ranks;
    FILE *quiet;               /* the log of ranks other than 0 */
    const model_tokenizer *tok;
    int32_t *ids;              /* the prompt */
    size_t n;
    int32_t V;
    float *lg, *all;           /* the last logits; every prompt position's (--logits) */
    int32_t *out;              /* the generated tokens */
    int produced, seq;
    FILE *step_f;
    mt_rng rng;
    uint64_t seed;
    model_sampler smp;
    int32_t eos[MODEL_MAX_EOS + 1];
    int n_eos;
    double t0, t1, t2;
    mt_err err;
} gen_run;

/* Opens --comm and the runtime; ranks other than 0 log nowhere. */
static int open_runtime(gen_cli *c, gen_run *r)
{
    c->o.log = stderr;
    if (c->comm_name) {
        if (cli_ranks_open(c->comm_name, &c->o.device, &r->ranks, &r->err) != MT_OK) {
            cli_error("generate", "--comm: %s", r->err.msg);
            return CLI_FAIL;
        }
        r->comm = r->ranks.xchg;
        c->o.comm = r->comm;
        c->o.comm_lead = true;
        /* As `serve --ranks N`: data-parallel attention over the ranks, or
         * over groups of --tp-size (not with --tp over every rank). */
        c->o.dp = !c->o.tp || (c->o.tp_size > 0 && c->o.tp_size < mt_comm_size(r->comm));
        if (mt_comm_rank(r->comm) != 0 && (r->quiet = fopen("/dev/null", "w")))
            c->o.log = r->quiet; /* rank 0 reports; the others print only errors */
    }
    if (model_runtime_open(&c->o, &r->rt, &r->err) != MT_OK) {
        cli_error("generate", "%s", r->err.msg);
        return CLI_FAIL;
    }
    return CLI_OK;
}

/* Ranks other than 0 serve their experts to rank 0's steps. */
static int follow(gen_run *r)
{
    mt_status fs = model_runtime_follow(r->rt, NULL, &r->err);
    if (fs != MT_OK)
        cli_error("generate", "rank %d: %s", mt_comm_rank(r->comm), r->err.msg);
    return fs == MT_OK ? CLI_OK : CLI_FAIL;
}

/* The prompt's ids, encoded from --prompt (--tokens were read before). */
static int encode_prompt(const gen_cli *c, gen_run *r)
{
    if (!c->prompt)
        return CLI_OK;
    if (!r->tok) {
        cli_error("generate", "%s has no tokenizer.json: use --tokens", c->o.model_dir);
        return CLI_FAIL;
    }
    if (model_tokenizer_encode(r->tok, c->prompt, strlen(c->prompt), &r->ids, &r->n,
                               &r->err) != MT_OK) {
        cli_error("generate", "%s", r->err.msg);
        return CLI_FAIL;
    }
    if (!r->n) {
        cli_error("generate", "the prompt encodes to no tokens");
        return CLI_FAIL;
    }
    return CLI_OK;
}

/* The buffers, the sequence, the sampler and the end-of-sequence ids. */
static int start_run(const gen_cli *c, gen_run *r)
{
    r->V = model_runtime_vocab(r->rt);
    r->lg = malloc(sizeof(float) * (size_t)r->V);
    r->all = c->logits_path ? malloc(sizeof(float) * (size_t)r->V * r->n) : NULL;
    r->out = malloc(sizeof(int32_t) * (size_t)(c->max_tokens + 1));
    if (!r->lg || !r->out || (c->logits_path && !r->all) ||
        model_seq_create(r->rt, &r->seq, &r->err) != MT_OK) {
        cli_error("generate", "%s", r->err.msg[0] ? r->err.msg : "out of memory");
        return CLI_FAIL;
    }
    r->seed = c->seed_given ? c->seed : mt_seed_fresh();
    mt_rng_seed(&r->rng, r->seed);
    r->smp = (model_sampler){.temperature = (float)c->temp, .top_p = (float)c->top_p,
                             .top_k = c->top_k};
    r->n_eos = model_runtime_eos(r->rt, r->eos, MODEL_MAX_EOS + 1);
    r->t0 = r->t1 = mt_now_ms();
    return CLI_OK;
}

/* --speculative-steps: drafts and verifies in rounds (model/spec.h). */
static int run_spec(const gen_cli *c, gen_run *r)
{
    int k = c->o.speculative_steps;
    model_spec_gen_opts go = {.k = k, .max_tokens = c->max_tokens, .eos = r->eos,
                              .n_eos = r->n_eos, .sampler = r->smp, .rng = &r->rng};
    model_spec_seq st;
    if (model_spec_generate(r->rt, r->seq, r->ids, (int64_t)r->n, &go, r->out, &r->produced,
                            &st, &r->err) != MT_OK) {
        cli_error("generate", "%s", r->err.msg);
        return CLI_FAIL;
    }
    fprintf(stderr, "speculative: %d steps, %" PRId64 " rounds, acceptance rate %.3f (%" PRId64
            " of %" PRId64 " drafts), mean accepted length %.2f tokens per round\n",
            k, st.rounds, st.drafted ? (double)st.accepted / (double)st.drafted : 0.0,
            st.accepted, st.drafted,
            st.rounds ? 1.0 + (double)st.accepted / (double)st.rounds : 0.0);
    return CLI_OK;
}

/* The prompt in chunks of at most 256 tokens. */
static int prefill(gen_run *r)
{
    size_t done = 0;
    while (done < r->n) {
        int chunk = r->n - done > 256 ? 256 : (int)(r->n - done);
        model_step_item it = {.seq = r->seq, .tokens = r->ids + done, .n_tokens = chunk,
                              .logits = r->lg,
                              .all_logits = r->all ? r->all + done * (size_t)r->V : NULL,
                              .n_prompt = chunk};
        if (model_step(r->rt, &it, 1, &r->err) != MT_OK) {
            cli_error("generate", "%s", r->err.msg);
            return CLI_FAIL;
        }
        done += (size_t)chunk;
    }
    return CLI_OK;
}

static bool is_eos(const gen_run *r, int32_t id)
{
    for (int e = 0; e < r->n_eos; e++)
        if (r->eos[e] == id)
            return true;
    return false;
}

/* One token per step after the prompt, until --max-tokens, an end of
 * sequence or the context's end; --step-logits gets each step's logits. */
static int decode(const gen_cli *c, gen_run *r)
{
    int gen = c->max_tokens;
    if (c->step_path && !(r->step_f = fopen(c->step_path, "wb"))) {
        cli_error("generate", "cannot write %s", c->step_path);
        return CLI_FAIL;
    }
    for (; r->produced < gen; r->produced++) {
        if (r->step_f && fwrite(r->lg, sizeof(float), (size_t)r->V, r->step_f) != (size_t)r->V) {
            cli_error("generate", "cannot write %s", c->step_path);
            return CLI_FAIL;
        }
        int32_t next = model_sample(r->lg, r->V, &r->smp, &r->rng);
        r->out[r->produced] = next;
        if (is_eos(r, next)) {
            r->produced++;
            break;
        }
        if (r->produced + 1 == gen ||
            model_seq_len(r->rt, r->seq) + 1 > model_runtime_max_context(r->rt))
            continue;
        model_step_item it = {.seq = r->seq, .tokens = &r->out[r->produced], .n_tokens = 1,
                              .logits = r->lg};
        if (model_step(r->rt, &it, 1, &r->err) != MT_OK) {
            cli_error("generate", "%s", r->err.msg);
            return CLI_FAIL;
        }
    }
    return CLI_OK;
}

/* Closes --step-logits and writes --logits. */
static int write_logits(const gen_cli *c, gen_run *r)
{
    if (r->step_f) {
        int bad_close = fclose(r->step_f);
        r->step_f = NULL;
        if (bad_close != 0) {
            cli_error("generate", "cannot write %s", c->step_path);
            return CLI_FAIL;
        }
    }
    if (c->logits_path) {
        FILE *f = fopen(c->logits_path, "wb");
        if (!f || fwrite(r->all, sizeof(float) * (size_t)r->V, r->n, f) != r->n ||
            fclose(f) != 0) {
            cli_error("generate", "cannot write %s", c->logits_path);
            return CLI_FAIL;
        }
    }
    return CLI_OK;
}

/* The text (with a tokenizer), the ids, and the timings to stderr. */
static int print_output(const gen_cli *c, gen_run *r)
{
    if (r->tok) {
        char *text = NULL;
        if (model_tokenizer_decode(r->tok, r->out, (size_t)r->produced, false, &text, NULL,
                                   &r->err) != MT_OK) {
            cli_error("generate", "%s", r->err.msg);
            return CLI_FAIL;
        }
        printf("%s\n", text);
        free(text);
    }
    printf("ids:");
    for (int i = 0; i < r->produced; i++)
        printf("%s%" PRId32, i ? "," : " ", r->out[i]);
    printf("\n");
    double t0 = r->t0, t1 = r->t1, t2 = r->t2;
    int k = r->produced;
    bool spec = c->o.speculative_steps > 0;
    if (spec) /* the prefill is inside model_spec_generate: one time for both */
        fprintf(stderr, "prompt %zu tokens and %d tokens generated in %.1f ms (%.1f tok/s "
                "overall); seed %" PRIu64 "\n", r->n, k, t2 - t0,
                k > 0 ? k / ((t2 - t0) / 1000.0) : 0.0, r->seed);
    else
        fprintf(stderr, "prompt %zu tokens in %.1f ms; %d tokens generated in %.1f ms (%.1f "
                "tok/s); seed %" PRIu64 "\n", r->n, t1 - t0, k, t2 - t1,
                k > 1 ? (k - 1) / ((t2 - t1) / 1000.0) : 0.0, r->seed);
    return CLI_OK;
}

/* Rank 0's (or the only rank's) generation, from the prompt to the output. */
static int generate(const gen_cli *c, gen_run *r)
{
    if (c->report)
        model_runtime_report(r->rt, stderr);
    r->tok = model_runtime_tokenizer(r->rt);
    int rc = encode_prompt(c, r);
    if (rc == CLI_OK)
        rc = start_run(c, r);
    if (rc == CLI_OK && c->o.speculative_steps > 0) {
        rc = run_spec(c, r);
    } else if (rc == CLI_OK) {
        rc = prefill(r);
        r->t1 = mt_now_ms();
        if (rc == CLI_OK)
            rc = decode(c, r);
    }
    r->t2 = mt_now_ms();
    if (rc == CLI_OK)
        rc = write_logits(c, r);
    if (rc == CLI_OK)
        rc = print_output(c, r);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    gen_cli c;
    memset(&c, 0, sizeof c);
    int rc = parse(argc, argv, &c);
    if (rc)
        return rc == CLI_HELP ? CLI_OK : rc;
    if ((rc = check_args(&c)) != CLI_OK)
        return rc;
    gen_run r = {.err = MT_ERR_INIT};
    if (c.tokens && parse_tokens(c.tokens, &r.ids, &r.n) != 0) {
        cli_error("generate", "--tokens '%s': expected ids like 1,2,3", c.tokens);
        return CLI_USAGE;
    }
    rc = open_runtime(&c, &r);
    if (rc == CLI_OK && r.comm && mt_comm_rank(r.comm) != 0)
        rc = follow(&r);
    else if (rc == CLI_OK)
        rc = generate(&c, &r);
    if (r.step_f)
        fclose(r.step_f);
    free(r.ids);
    free(r.lg);
    free(r.all);
    free(r.out);
    model_runtime_close(r.rt); /* with --comm: tells the other ranks to stop */
    cli_ranks_close(&r.ranks);
    if (r.quiet)
        fclose(r.quiet);
    return rc;
}
