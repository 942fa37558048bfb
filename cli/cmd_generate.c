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

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moetune generate --model DIR [--db FILE] [--device D]\n"
            "                        (--prompt TEXT | --tokens 1,2,3) [--max-tokens N]\n"
            "                        [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
            "                        [--act-quant none|mxfp4|int8] [--kv-dtype bf16|fp8]\n"
            "                        [--logits FILE] [--step-logits FILE] [--report]\n"
            "                        [--batch-invariant]\n"
            "                        [--speculative-steps K] [--comm self|mpi [--tp]]\n"
            "Runs the GLM-5 checkpoint in DIR on the device (default auto) with kernels from\n"
            "the tuning database FILE (every kernel runs its default config without one),\n"
            "prints the generated text (with a tokenizer) and the token ids. Sampling:\n"
            "temperature 0 (default) is greedy; --top-k, --top-p and --seed shape and fix\n"
            "the draws. --act-quant overrides the checkpoint's activation quantization of\n"
            "the expert GEMMs (mxfp4: a4w4, none: a16w4, int8: a8w4, cpu devices only).\n"
            "--logits writes the logits of every prompt position as raw little-endian\n"
            "float32 [prompt tokens, vocab]; --step-logits the logits each generated token\n"
            "was sampled from, [generated tokens, vocab] (the last prompt position's, then\n"
            "the decode steps': what a server's logprobs are computed from).\n"
            "--report prints the full kernel selection table to stderr. --batch-invariant\n"
            "runs one config per kernel at every token count and no split-K, so a token's\n"
            "logits are bitwise the same alone, batched, in prefill or in decode.\n"
            "--speculative-steps K (1-8) drafts K tokens a round with the checkpoint's MTP\n"
            "layer and verifies them in one step (greedy acceptance, speculative sampling\n"
            "above temperature 0); the acceptance rate goes to stderr.\n"
            "--comm mpi runs across the ranks of `mpirun -np N moetune generate ...`\n"
            "(every rank with the same options): each rank holds 1/N of the routed experts\n"
            "(expert parallelism); rank 0 runs the prompt, prints and writes --logits.\n"
            "--tp adds tensor parallelism: each rank also holds 1/N of the attention heads,\n"
            "of o_proj's rows and of the vocabulary (embedding, lm_head), and every rank\n"
            "runs every token; the MoE layers split the tokens over the ranks.\n");
}

static bool parse_num(const char *v, double *out)
{
    char *end;
    *out = strtod(v, &end);
    return *v && !*end;
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

int cmd_generate(int argc, char **argv)
{
    const char *model = NULL, *db = NULL, *device = "auto", *prompt = NULL, *tokens = NULL;
    const char *logits_path = NULL, *step_path = NULL, *comm_name = NULL, *v;
    FILE *step_f = NULL;
    double max_tokens = 32, temp = 0, top_k = 0, top_p = 1, seed = -1, spec = 0, num;
    model_runtime_opts o = {0};
    bool bad = false, report = false;
    for (int i = 1; i < argc && !bad; i++) {
        if (cli_flag(argv[i], "--help") || cli_flag(argv[i], "-h")) {
            usage(stdout);
            return CLI_OK;
        } else if (cli_flag(argv[i], "--report")) {
            report = true;
        } else if (cli_flag(argv[i], "--batch-invariant")) {
            o.batch_invariant = true;
        } else if (cli_flag(argv[i], "--tp")) {
            o.tp = true;
        } else if ((v = cli_opt(argc, argv, &i, "--model", &bad))) {
            model = v;
        } else if ((v = cli_opt(argc, argv, &i, "--db", &bad))) {
            db = v;
        } else if ((v = cli_opt(argc, argv, &i, "--device", &bad))) {
            device = v;
        } else if ((v = cli_opt(argc, argv, &i, "--prompt", &bad))) {
            prompt = v;
        } else if ((v = cli_opt(argc, argv, &i, "--tokens", &bad))) {
            tokens = v;
        } else if ((v = cli_opt(argc, argv, &i, "--logits", &bad))) {
            logits_path = v;
        } else if ((v = cli_opt(argc, argv, &i, "--step-logits", &bad))) {
            step_path = v;
        } else if ((v = cli_opt(argc, argv, &i, "--comm", &bad))) {
            comm_name = v;
        } else if ((v = cli_opt(argc, argv, &i, "--act-quant", &bad))) {
            o.act_quant_set = true;
            if (!model_act_quant_parse(v, &o.act_quant)) {
                cli_error("generate", "--act-quant '%s': none, mxfp4 or int8", v);
                bad = true;
            }
        } else if ((v = cli_opt(argc, argv, &i, "--kv-dtype", &bad))) {
            if (!strcmp(v, "bf16"))
                o.kv_dtype = KERN_DT_BF16;
            else if (!strcmp(v, "fp8"))
                o.kv_dtype = KERN_DT_FP8E4M3;
            else {
                cli_error("generate", "--kv-dtype '%s': bf16 or fp8", v);
                bad = true;
            }
        } else {
            static const char *const nums[] = {"--max-tokens", "--temperature", "--top-k",
                                               "--top-p", "--seed", "--speculative-steps"};
            double *dst[] = {&max_tokens, &temp, &top_k, &top_p, &seed, &spec};
            int which = -1;
            for (int k = 0; k < 6 && which < 0 && !bad; k++)
                if ((v = cli_opt(argc, argv, &i, nums[k], &bad))) {
                    which = k;
                    if (!parse_num(v, &num) || num < 0 || (k == 3 && num > 1) ||
                        (k == 5 && (num != (int)num || num > MODEL_SPEC_MAX_STEPS))) {
                        cli_error("generate", "%s '%s' is not a valid value", nums[k], v);
                        bad = true;
                    } else {
                        *dst[k] = num;
                    }
                }
            if (which < 0 && !bad) {
                cli_error("generate", "unknown option '%s'", argv[i]);
                bad = true;
            }
        }
    }
    if (!bad && (!model || !!prompt == !!tokens)) {
        cli_error("generate", "--model and exactly one of --prompt, --tokens are required");
        bad = true;
    }
    if (!bad && spec > 0 && (logits_path || step_path)) {
        cli_error("generate", "--logits / --step-logits and --speculative-steps: pick one");
        bad = true;
    }
    if (bad) {
        usage(stderr);
        return CLI_USAGE;
    }
    o.speculative_steps = (int)spec;
    o.model_dir = model;
    o.db_path = db;
    o.device = device;
    o.log = stderr;
    mt_err err = MT_ERR_INIT;
    model_runtime *rt = NULL;
    mt_comm *comm = NULL;
    FILE *quiet = NULL;
    if (o.tp && !comm_name) {
        cli_error("generate", "--tp splits the model over the ranks of --comm mpi");
        return CLI_USAGE;
    }
    if (comm_name) {
        if (mt_comm_open(comm_name, &comm, &err) != MT_OK) {
            cli_error("generate", "--comm: %s", err.msg);
            return CLI_FAIL;
        }
        o.comm = comm;
        o.comm_lead = true;
        if (mt_comm_rank(comm) != 0 && (quiet = fopen("/dev/null", "w")))
            o.log = quiet; /* rank 0 reports; the others print only errors */
    }
    if (model_runtime_open(&o, &rt, &err) != MT_OK) {
        cli_error("generate", "%s", err.msg);
        mt_comm_close(comm);
        if (quiet)
            fclose(quiet);
        return CLI_FAIL;
    }
    if (comm && mt_comm_rank(comm) != 0) {
        /* The other ranks serve their experts to rank 0's steps. */
        mt_status fs = model_runtime_follow(rt, NULL, &err);
        if (fs != MT_OK)
            cli_error("generate", "rank %d: %s", mt_comm_rank(comm), err.msg);
        model_runtime_close(rt);
        mt_comm_close(comm);
        if (quiet)
            fclose(quiet);
        return fs == MT_OK ? CLI_OK : CLI_FAIL;
    }
    if (report)
        model_runtime_report(rt, stderr);
    const model_tokenizer *tok = model_runtime_tokenizer(rt);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = CLI_FAIL;
    float *lg = NULL, *all = NULL;
    int32_t *out = NULL;
    if (prompt) {
        if (!tok) {
            cli_error("generate", "%s has no tokenizer.json: use --tokens", model);
            goto done;
        }
        if (model_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n, &err) != MT_OK) {
            cli_error("generate", "%s", err.msg);
            goto done;
        }
        if (!n) {
            cli_error("generate", "the prompt encodes to no tokens");
            goto done;
        }
    } else if (parse_tokens(tokens, &ids, &n) != 0) {
        cli_error("generate", "--tokens '%s': expected ids like 1,2,3", tokens);
        rc = CLI_USAGE;
        goto done;
    }
    int32_t V = model_runtime_vocab(rt);
    int gen = (int)max_tokens;
    lg = malloc(sizeof(float) * (size_t)V);
    all = logits_path ? malloc(sizeof(float) * (size_t)V * n) : NULL;
    out = malloc(sizeof(int32_t) * (size_t)(gen + 1));
    int seq;
    if (!lg || !out || (logits_path && !all) || model_seq_create(rt, &seq, &err) != MT_OK) {
        cli_error("generate", "%s", err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    mt_rng rng;
    uint64_t s = seed >= 0 ? (uint64_t)seed : mt_seed_fresh();
    mt_rng_seed(&rng, s);
    model_sampler smp = {.temperature = (float)temp, .top_p = (float)top_p, .top_k = (int)top_k};
    int32_t eos[MODEL_MAX_EOS + 1];
    int n_eos = model_runtime_eos(rt, eos, MODEL_MAX_EOS + 1);
    double t0 = mt_now_ms(), t1 = t0;
    int produced = 0;
    if (spec > 0) {
        model_spec_gen_opts go = {.k = (int)spec, .max_tokens = gen, .eos = eos, .n_eos = n_eos,
                                  .sampler = smp, .rng = &rng};
        model_spec_seq st;
        if (model_spec_generate(rt, seq, ids, (int64_t)n, &go, out, &produced, &st, &err) !=
            MT_OK) {
            cli_error("generate", "%s", err.msg);
            goto done;
        }
        fprintf(stderr, "speculative: %d steps, %" PRId64 " rounds, acceptance rate %.3f (%"
                PRId64 " of %" PRId64 " drafts), mean accepted length %.2f tokens per round\n",
                (int)spec, st.rounds, st.drafted ? (double)st.accepted / (double)st.drafted : 0.0,
                st.accepted, st.drafted,
                st.rounds ? 1.0 + (double)st.accepted / (double)st.rounds : 0.0);
        goto print;
    }
    /* The prompt in chunks of at most 256 tokens, then one token per step. */
    size_t done_tok = 0;
    while (done_tok < n) {
        int chunk = n - done_tok > 256 ? 256 : (int)(n - done_tok);
        model_step_item it = {.seq = seq, .tokens = ids + done_tok, .n_tokens = chunk,
                              .logits = lg, .all_logits = all ? all + done_tok * (size_t)V : NULL,
                              .n_prompt = chunk};
        if (model_step(rt, &it, 1, &err) != MT_OK) {
            cli_error("generate", "%s", err.msg);
            goto done;
        }
        done_tok += (size_t)chunk;
    }
    t1 = mt_now_ms();
    if (step_path && !(step_f = fopen(step_path, "wb"))) {
        cli_error("generate", "cannot write %s", step_path);
        goto done;
    }
    for (; produced < gen; produced++) {
        if (step_f && fwrite(lg, sizeof(float), (size_t)V, step_f) != (size_t)V) {
            cli_error("generate", "cannot write %s", step_path);
            goto done;
        }
        int32_t next = model_sample(lg, V, &smp, &rng);
        out[produced] = next;
        bool stop = false;
        for (int e = 0; e < n_eos; e++)
            stop = stop || eos[e] == next;
        if (stop) {
            produced++;
            break;
        }
        if (produced + 1 == gen || model_seq_len(rt, seq) + 1 > model_runtime_max_context(rt))
            continue;
        model_step_item it = {.seq = seq, .tokens = &out[produced], .n_tokens = 1, .logits = lg};
        if (model_step(rt, &it, 1, &err) != MT_OK) {
            cli_error("generate", "%s", err.msg);
            goto done;
        }
    }
print:;
    double t2 = mt_now_ms();
    if (step_f) {
        int bad_close = fclose(step_f);
        step_f = NULL;
        if (bad_close != 0) {
            cli_error("generate", "cannot write %s", step_path);
            goto done;
        }
    }
    if (logits_path) {
        FILE *f = fopen(logits_path, "wb");
        if (!f || fwrite(all, sizeof(float) * (size_t)V, n, f) != n || fclose(f) != 0) {
            cli_error("generate", "cannot write %s", logits_path);
            goto done;
        }
    }
    if (tok) {
        char *text = NULL;
        if (model_tokenizer_decode(tok, out, (size_t)produced, false, &text, NULL, &err) != MT_OK) {
            cli_error("generate", "%s", err.msg);
            goto done;
        }
        printf("%s\n", text);
        free(text);
    }
    printf("ids:");
    for (int i = 0; i < produced; i++)
        printf("%s%" PRId32, i ? "," : " ", out[i]);
    printf("\n");
    if (spec > 0) /* the prefill is inside model_spec_generate: one time for both */
        fprintf(stderr, "prompt %zu tokens and %d tokens generated in %.1f ms (%.1f tok/s "
                "overall); seed %" PRIu64 "\n", n, produced, t2 - t0,
                produced > 0 ? produced / ((t2 - t0) / 1000.0) : 0.0, s);
    else
        fprintf(stderr, "prompt %zu tokens in %.1f ms; %d tokens generated in %.1f ms (%.1f "
                "tok/s); seed %" PRIu64 "\n", n, t1 - t0, produced, t2 - t1,
                produced > 1 ? (produced - 1) / ((t2 - t1) / 1000.0) : 0.0, s);
    rc = CLI_OK;
done:
    if (step_f)
        fclose(step_f);
    free(ids);
    free(lg);
    free(all);
    free(out);
    model_runtime_close(rt); /* with --comm: tells the other ranks to stop */
    mt_comm_close(comm);
    return rc;
}
