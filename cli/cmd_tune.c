/* cmd_tune.c: `moetune tune`: parses options, builds the jobs (one family
 * and shape, or with --model every kernel of the runtime's kernel plan for
 * that checkpoint, model/plan.h, so the database covers exactly what
 * model_runtime_open looks up), runs the tuner with Ctrl-C wired to a
 * clean stop, and prints the table. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/lib/model_ab.h"
#include "common/rng.h"
#include "model/plan/plan.h"
#include "tuner/tuner.h"
#include "cli.h"

/* A signal handler can only reach a flag; this one is the command's own. */
static volatile sig_atomic_t stop_flag;

static void on_sigint(int sig)
{
    (void)sig;
    stop_flag = 1;
    signal(SIGINT, SIG_DFL); /* a second Ctrl-C ends the process at once */
}

static void usage(void)
{
    printf(
        "usage: moetune tune --family F --shape KEY|PRESET [options]\n"
        "       moetune tune --model DIR [options]\n"
        "Searches a kernel family's configurations for the shape at each M, verifies\n"
        "every candidate against the C reference, times it, and stores every trial and\n"
        "the winner per M in the database. Ctrl-C stops cleanly; running the same\n"
        "command again resumes (measured configs are not measured again).\n\n"
        "  --family F          kernel family (moetune kernels lists them)\n"
        "  --shape KEY|PRESET  shape key (\"N=2048,K=6144\") or preset name (\"tiny\")\n"
        "  --model DIR         tune every kernel the runtime runs for the checkpoint DIR\n"
        "                      (its kernel plan, from DIR/config.json alone); an M above\n"
        "                      a kernel's largest M is skipped for that kernel\n"
        "  --act-quant Q       with --model: none (a16w4), mxfp4 (a4w4) or int8 (a8w4,\n"
        "                      cpu only); default: the checkpoint's Quark config, as\n"
        "                      the runtime\n"
        "  --kv-dtype T        with --model: bf16 (default) or fp8 KV cache\n"
        "  --max-batch-tokens N  with --model: the runtime's largest step (default 512)\n"
        "  --mtp               with --model: also the MTP layer's kernels (serve\n"
        "                      --speculative-steps K runs them)\n"
        "  --ep N              with --model: also each rank's expert sort and expert\n"
        "                      GEMMs under expert parallelism over N ranks (serve\n"
        "                      --ranks N): their local expert counts, M up to every\n"
        "                      pair of a step\n"
        "  --tp N              with --model: also each rank's attention, embedding and\n"
        "                      lm_head kernels under tensor parallelism over N ranks\n"
        "                      (serve --ranks N --tp): their local head, o_proj row\n"
        "                      and vocabulary counts\n"
        "  --m LIST            token counts, e.g. 1,16,128 (default 1,2,4,...,4096)\n"
        "  --device D          cpu, emu, emu:wave32, hip, hip:N, cuda (default auto)\n"
        "  --arch A            GPU arch; with no such GPU: compile-only\n"
        "  --db FILE           database (default $MOETUNE_DB or ./moetune.db)\n"
        "  --strategy S        model (default), exhaustive, random, evolve\n"
        "  --budget B          trials per M (2000), a share of each M's valid space\n"
        "                      (15%%) or wall time for the run (30m, 90s)\n"
        "  --jobs N            compile threads (default 2)\n"
        "  --compile-only      compile the space and store resources, no timing\n"
        "  --shard I/N         tune the I-th of N disjoint parts of the space\n"
        "  --seed S            search-order seed (default: stable per shape and M)\n"
        "  --timeout SEC       per-candidate limit in the worker (default 60)\n"
        "  --max-reps N        timed repetitions cap per candidate (default 200)\n"
        "  --no-transfer       do not seed each M from neighbouring M's winners\n"
        "  --confirm-rounds N  paired rounds confirming a best config against the\n"
        "                      default (default 10; 0: off, the lowest median wins)\n"
        "  --confidence P      confidence of that decision (default 0.95)\n"
        "  --model-check R     with --model: end by timing the whole model with the\n"
        "                      tuned database against the default configs in R paired\n"
        "                      rounds, with a 95%% interval (default 10; 0: skip)\n"
        "  --quiet             no progress output\n");
}

typedef struct tune_cli {
    const char *family, *shape, *model, *mlist;
    bool quiet;
    model_plan_opts plan;  /* --model: the runtime options that change kernels */
    bool plan_opts_given;
    int check_rounds;      /* --model-check */
} tune_cli;


/* A rank count of --ep / --tp (1 to 4096) into *out; false after saying why. */
static bool ranks_opt(const char *opt, const char *v, int *out)
{
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (!*v || *end || n < 1 || n > 4096) {
        cli_error("tune", "%s '%s': a number of ranks, 1 to 4096", opt, v);
        return false;
    }
    *out = (int)n;
    return true;
}

static int parse(int argc, char **argv, tune_opts *o, tune_cli *c)
{
    bool bad = false;
    const char *v;
    mt_err err = MT_ERR_INIT;
    for (int i = 1; i < argc; i++) {
        if (cli_flag(argv[i], "--help") || cli_flag(argv[i], "-h")) {
            usage();
            return -1;
        } else if (cli_flag(argv[i], "--compile-only"))
            o->compile_only = true;
        else if (cli_flag(argv[i], "--no-transfer"))
            o->transfer = false;
        else if (cli_flag(argv[i], "--quiet"))
            c->quiet = true;
        else if ((v = cli_opt(argc, argv, &i, "--family", &bad)))
            c->family = v;
        else if ((v = cli_opt(argc, argv, &i, "--shape", &bad)))
            c->shape = v;
        else if ((v = cli_opt(argc, argv, &i, "--model", &bad)))
            c->model = v;
        else if ((v = cli_opt(argc, argv, &i, "--m", &bad)))
            c->mlist = v;
        else if ((v = cli_opt(argc, argv, &i, "--model-check", &bad))) {
            char *end;
            long r = strtol(v, &end, 10);
            if (!*v || *end || r < 0 || r > TUNE_CONFIRM_MAX_ROUNDS || r == 1) {
                cli_error("tune", "--model-check '%s': 0 (skip) or 2..%d rounds", v,
                          TUNE_CONFIRM_MAX_ROUNDS);
                return CLI_USAGE;
            }
            c->check_rounds = (int)r;
        }
        else if ((v = cli_opt(argc, argv, &i, "--act-quant", &bad))) {
            c->plan_opts_given = true;
            c->plan.act_quant_set = true;
            if (!model_act_quant_parse(v, &c->plan.act_quant)) {
                cli_error("tune", "--act-quant '%s': none, mxfp4 or int8", v);
                return CLI_USAGE;
            }
        } else if ((v = cli_opt(argc, argv, &i, "--kv-dtype", &bad))) {
            c->plan_opts_given = true;
            if (!strcmp(v, "bf16"))
                c->plan.kv_dtype = KERN_DT_BF16;
            else if (!strcmp(v, "fp8"))
                c->plan.kv_dtype = KERN_DT_FP8E4M3;
            else {
                cli_error("tune", "--kv-dtype '%s': bf16 or fp8", v);
                return CLI_USAGE;
            }
        } else if (cli_flag(argv[i], "--mtp")) {
            c->plan_opts_given = true;
            c->plan.mtp = true;
        } else if ((v = cli_opt(argc, argv, &i, "--ep", &bad))) {
            c->plan_opts_given = true;
            if (!ranks_opt("--ep", v, &c->plan.ep_ranks))
                return CLI_USAGE;
        } else if ((v = cli_opt(argc, argv, &i, "--tp", &bad))) {
            c->plan_opts_given = true;
            if (!ranks_opt("--tp", v, &c->plan.tp_ranks))
                return CLI_USAGE;
            c->plan.tp_rank = -1; /* every rank's kernels */
        } else if ((v = cli_opt(argc, argv, &i, "--max-batch-tokens", &bad))) {
            c->plan_opts_given = true;
            c->plan.max_batch_tokens = atoi(v);
            if (c->plan.max_batch_tokens < 1) {
                cli_error("tune", "--max-batch-tokens must be a positive number of tokens");
                return CLI_USAGE;
            }
        }
        else if ((v = cli_opt(argc, argv, &i, "--device", &bad)))
            o->device = v;
        else if ((v = cli_opt(argc, argv, &i, "--arch", &bad)))
            o->arch = v;
        else if ((v = cli_opt(argc, argv, &i, "--db", &bad)))
            o->db_path = v;
        else if ((v = cli_opt(argc, argv, &i, "--strategy", &bad))) {
            if (!tune_strategy_parse(v, &o->strategy)) {
                cli_error("tune", "unknown strategy '%s' (exhaustive, random, evolve, model)", v);
                return CLI_USAGE;
            }
        } else if ((v = cli_opt(argc, argv, &i, "--budget", &bad))) {
            if (tune_budget_parse(v, &o->budget, &err) != MT_OK) {
                cli_error("tune", "%s", err.msg);
                return CLI_USAGE;
            }
        } else if ((v = cli_opt(argc, argv, &i, "--jobs", &bad))) {
            o->jobs = atoi(v);
            if (o->jobs < 1 || o->jobs > 256) {
                cli_error("tune", "--jobs must be between 1 and 256");
                return CLI_USAGE;
            }
        } else if ((v = cli_opt(argc, argv, &i, "--shard", &bad))) {
            if (tune_shard_parse(v, &o->shard_index, &o->shard_count, &err) != MT_OK) {
                cli_error("tune", "%s", err.msg);
                return CLI_USAGE;
            }
        } else if ((v = cli_opt(argc, argv, &i, "--seed", &bad)))
            o->seed = strtoull(v, NULL, 0);
        else if ((v = cli_opt(argc, argv, &i, "--timeout", &bad))) {
            o->timeout_s = atof(v);
            if (!(o->timeout_s > 0)) {
                cli_error("tune", "--timeout must be a positive number of seconds");
                return CLI_USAGE;
            }
        } else if ((v = cli_opt(argc, argv, &i, "--max-reps", &bad))) {
            o->timing.max_reps = atoi(v);
            if (o->timing.max_reps < 1) {
                cli_error("tune", "--max-reps must be at least 1");
                return CLI_USAGE;
            }
            if (o->timing.min_reps > o->timing.max_reps)
                o->timing.min_reps = o->timing.max_reps;
        } else if ((v = cli_opt(argc, argv, &i, "--confirm-rounds", &bad))) {
            char *end = NULL;
            long n = strtol(v, &end, 10);
            if (end == v || *end || n < 0 || n == 1 || n > TUNE_CONFIRM_MAX_ROUNDS) {
                cli_error("tune", "--confirm-rounds: 0 (off) or 2 to %d",
                          TUNE_CONFIRM_MAX_ROUNDS);
                return CLI_USAGE;
            }
            o->confirm_rounds = n == 0 ? -1 : (int)n;
        } else if ((v = cli_opt(argc, argv, &i, "--confidence", &bad))) {
            char *end = NULL;
            o->confidence = strtod(v, &end);
            if (end == v || *end || !(o->confidence >= 0.5 && o->confidence < 1)) {
                cli_error("tune", "--confidence: a level from 0.5 to below 1, e.g. 0.95");
                return CLI_USAGE;
            }
        } else {
            if (!bad)
                cli_error("tune", "unknown option '%s' (see moetune tune --help)", argv[i]);
            return CLI_USAGE;
        }
        if (bad)
            return CLI_USAGE;
    }
    if (!c->model && (!c->family || !c->shape)) {
        cli_error("tune", "give --family and --shape, or --model DIR");
        return CLI_USAGE;
    }
    if (c->model && (c->family || c->shape)) {
        cli_error("tune", "--model derives families and shapes; do not combine it with "
                          "--family/--shape");
        return CLI_USAGE;
    }
    if (!c->model && c->check_rounds != 10) {
        cli_error("tune", "--model-check goes with --model");
        return CLI_USAGE;
    }
    if (!c->model && c->plan_opts_given) {
        cli_error("tune", "--act-quant, --kv-dtype, --max-batch-tokens, --mtp, --ep and "
                  "--tp go with --model");
        return CLI_USAGE;
    }
    return 0;
}

/* One job per kernel of the runtime's plan, each at the Ms of the list up
 * to its largest M. */
static int model_jobs(const tune_cli *c, const int64_t *ms, int n_m, tune_job *jobs,
                      int *n_jobs)
{
    model_plan_entry *plan = NULL;
    int n_plan = 0;
    mt_err err = MT_ERR_INIT;
    if (model_kernel_plan(c->model, &c->plan, &plan, &n_plan, &err) != MT_OK) {
        cli_error("tune", "%s", err.msg);
        return CLI_FAIL;
    }
    int rc = 0, skipped = 0;
    for (int i = 0; i < n_plan && !rc; i++) {
        const model_plan_entry *e = &plan[i];
        int64_t mine[TUNE_MAX_M];
        int n_mine = 0;
        for (int j = 0; j < n_m; j++)
            if (ms[j] <= e->m_max)
                mine[n_mine++] = ms[j];
        if (!n_mine) {
            if (!c->quiet)
                fprintf(stderr, "moetune tune: %s %s (%s): every M listed is above its largest "
                        "M %lld: not tuned\n", e->fam->name, e->key, e->purpose,
                        (long long)e->m_max);
            skipped++;
            continue;
        }
        if (*n_jobs == TUNE_MAX_JOBS) {
            cli_error("tune", "%s: the kernel plan has more than %d kernels", c->model,
                      TUNE_MAX_JOBS);
            rc = CLI_FAIL;
        } else if (tune_job_make(e->fam, e->shape_text, mine, n_mine, &jobs[*n_jobs], &err) !=
                   MT_OK) {
            cli_error("tune", "%s %s (%s): %s", e->fam->name, e->shape_text, e->purpose,
                      err.msg);
            rc = CLI_FAIL;
        } else {
            (*n_jobs)++;
        }
    }
    if (!rc && *n_jobs > 0 && !c->quiet)
        fprintf(stderr, "moetune tune: %s: the runtime's kernel plan has %d kernels; tuning %d"
                "%s\n", c->model, n_plan, *n_jobs,
                skipped ? " (the others see no M of the list)" : "");
    if (!rc && *n_jobs == 0) {
        cli_error("tune", "%s: no kernel of the plan sees an M of the list", c->model);
        rc = CLI_USAGE;
    }
    free(plan);
    return rc;
}

static int build_jobs(const tune_cli *c, tune_job *jobs, int *n_jobs)
{
    long long mv[TUNE_MAX_M];
    int64_t ms[TUNE_MAX_M];
    int n_m = 0;
    if (c->mlist) {
        n_m = cli_parse_int_list(c->mlist, mv, TUNE_MAX_M);
        if (n_m <= 0) {
            cli_error("tune", "--m '%s': expected a comma-separated list of up to %d "
                              "positive integers", c->mlist, TUNE_MAX_M);
            return CLI_USAGE;
        }
        for (int i = 0; i < n_m; i++)
            ms[i] = mv[i];
    }
    mt_err err = MT_ERR_INIT;
    if (c->model)
        return model_jobs(c, n_m ? ms : tune_default_ms, n_m ? n_m : tune_default_n_ms, jobs,
                          n_jobs);
    const kern_family *f = kern_family_find(c->family);
    if (!f) {
        cli_error("tune", "unknown family '%s' (moetune kernels lists them)", c->family);
        return CLI_USAGE;
    }
    if (tune_job_make(f, c->shape, n_m ? ms : NULL, n_m, &jobs[0], &err) != MT_OK) {
        cli_error("tune", "%s", err.msg);
        return CLI_USAGE;
    }
    *n_jobs = 1;
    return 0;
}

/* The end of `tune --model`: the whole forward with the tuned database
 * against the default configs, in paired rounds (bench/lib/model_ab.h).
 * Informational: it never fails the command, but a tuned model slower with
 * confidence is a warning. */
static void model_check(const tune_cli *c, const tune_opts *o)
{
    static FILE *quiet;
    if (!quiet)
        quiet = fopen("/dev/null", "w");
    model_runtime_opts ro = {.model_dir = c->model, .device = o->device ? o->device : "auto",
                             .act_quant = c->plan.act_quant,
                             .act_quant_set = c->plan.act_quant_set,
                             .kv_dtype = c->plan.kv_dtype, .kv_page_size = c->plan.kv_page_size,
                             .kv_pages = c->plan.kv_pages,
                             .max_batch_tokens = c->plan.max_batch_tokens,
                             .log = quiet ? quiet : stderr};
    model_runtime *def = NULL, *tuned = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = model_runtime_open(&ro, &def, &err);
    ro.db_path = o->db_path;
    if (st == MT_OK)
        st = model_runtime_open(&ro, &tuned, &err);
    int32_t *tok = NULL;
    int n = 0, d = 16;
    if (st == MT_OK) {
        int64_t T = c->plan.max_batch_tokens > 0 ? c->plan.max_batch_tokens : 512;
        n = T < 128 ? (int)T : 128;
        tok = malloc(sizeof *tok * (size_t)n);
        if (!tok)
            st = mt_fail(&err, MT_E_NOMEM, "model check");
        mt_rng rng;
        mt_rng_seed(&rng, 12345);
        int32_t V = model_runtime_vocab(def);
        for (int i = 0; tok && i < n; i++)
            tok[i] = (int32_t)mt_rng_below(&rng, (uint64_t)V);
    }
    model_ab_result r;
    model_ab_opts ab = {.rounds = c->check_rounds, .level = 0.95, .seed = 1};
    if (st == MT_OK)
        st = model_ab_compare(def, tuned, tok, n, d, &ab, &r, &err);
    if (st != MT_OK) {
        fprintf(stderr, "moetune tune: model check skipped: %s\n", err.msg);
    } else {
        char pre[96], dec[96];
        model_ab_phase_text(&r.prefill, r.level, pre, sizeof pre);
        model_ab_phase_text(&r.decode, r.level, dec, sizeof dec);
        printf("\nmodel check (%s, %d paired rounds, tuned database vs default configs):\n"
               "  prefill of %d tokens: %.0f -> %.0f tok/s, %s\n"
               "  decode:               %.1f -> %.1f tok/s, %s\n",
               ro.device, r.rounds, n, r.prefill.a_tps, r.prefill.b_tps, pre, r.decode.a_tps,
               r.decode.b_tps, dec);
        if (r.prefill.b_slower || r.decode.b_slower)
            fprintf(stderr, "moetune tune: WARNING: the model with the tuned database is slower "
                    "than with the default configs (%s%s%s); the kernels' winners were each "
                    "confirmed alone, so the loss is in how they run together (caches, "
                    "launch overheads) or in untuned kernels\n",
                    r.prefill.b_slower ? "prefill" : "",
                    r.prefill.b_slower && r.decode.b_slower ? ", " : "",
                    r.decode.b_slower ? "decode" : "");
    }
    free(tok);
    model_runtime_close(tuned);
    model_runtime_close(def);
}

/* The backend of the device the tune runs on: the model's plan depends on
 * it (the cpu's expert GEMMs read regrouped weights: other keys). */
static int plan_backend(const tune_opts *o, model_plan_opts *po)
{
    dev_open_opts oo = {.arch = o->arch, .threads = 0};
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    if (dev_open(o->device ? o->device : "auto", &oo, &d, &err) != MT_OK) {
        cli_error("tune", "%s", err.msg);
        return CLI_FAIL;
    }
    po->backend = dev_get_props(d)->backend;
    dev_close(d);
    return 0;
}

int cmd_tune(int argc, char **argv)
{
    tune_opts o;
    tune_opts_default(&o);
    tune_cli c = {.check_rounds = 10};
    const char *env_db = getenv("MOETUNE_DB");
    o.db_path = env_db && *env_db ? env_db : "moetune.db";
    int rc = parse(argc, argv, &o, &c);
    if (rc)
        return rc < 0 ? CLI_OK : rc;
    tune_job *jobs = calloc(TUNE_MAX_JOBS, sizeof *jobs);
    if (!jobs) {
        cli_error("tune", "out of memory");
        return CLI_FAIL;
    }
    int n_jobs = 0;
    if (c.model && (rc = plan_backend(&o, &c.plan)) != 0) {
        free(jobs);
        return rc;
    }
    rc = build_jobs(&c, jobs, &n_jobs);
    if (rc) {
        free(jobs);
        return rc;
    }
    o.log = c.quiet ? NULL : stderr;
    o.tty = isatty(2);
    o.stop = &stop_flag;
    o.argc = argc;
    o.argv = argv;
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);

    tune_report *rep = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = tune_run(jobs, n_jobs, &o, &rep, &err);
    sigaction(SIGINT, &old, NULL);
    if (rep)
        tune_report_print(rep, stdout);
    bool ran = rep && !rep->compile_only && st == MT_OK;
    tune_report_free(rep);
    if (ran && c.model && c.check_rounds > 0 && !stop_flag)
        model_check(&c, &o);
    free(jobs);
    if (st == MT_E_INTERRUPTED) {
        fprintf(stderr, "moetune tune: interrupted; the database is consistent. Run the same "
                        "command again to resume.\n");
        return 130;
    }
    if (st != MT_OK) {
        cli_error("tune", "%s", err.msg);
        return CLI_FAIL;
    }
    return CLI_OK;
}
