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
#include "tuner/tune_misses.h"
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

typedef struct tune_cli {
    const char *family, *shape, *model;
    int64_t ms[TUNE_MAX_M];
    cli_int_list mlist;
    bool quiet;
    model_plan_opts plan;  /* --model: the runtime options that change kernels */
    bool plan_opts_given;
    int check_rounds;      /* --model-check */
    bool check_given;
    int confirm_rounds;    /* --confirm-rounds as given */
    bool confirm_given;
    bool misses;           /* --misses: the database's recorded misses */
} tune_cli;

/* A rank count of --ep / --tp (1 to 4096) into *out. */
static bool ranks_opt(const char *v, int *out, char *err, size_t cap)
{
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (!*v || *end || n < 1 || n > 4096) {
        snprintf(err, cap, "a number of ranks, 1 to 4096");
        return false;
    }
    *out = (int)n;
    return true;
}

/* --ep: dst is the model_plan_opts. `serve --ranks N` splits the
 * vocabulary over the same ranks (data-parallel attention): every rank's
 * embedding and lm_head are listed too (vocab_rank -1). */
static bool set_ep(void *dst, const char *v, char *err, size_t cap)
{
    model_plan_opts *p = dst;
    if (!ranks_opt(v, &p->ep_ranks, err, cap))
        return false;
    p->vocab_ranks = p->ep_ranks;
    p->vocab_rank = -1;
    return true;
}

/* --tp: dst is the model_plan_opts; every rank's kernels (tp_rank -1). */
static bool set_tp(void *dst, const char *v, char *err, size_t cap)
{
    model_plan_opts *p = dst;
    p->tp_rank = -1;
    return ranks_opt(v, &p->tp_ranks, err, cap);
}

static bool set_strategy(void *dst, const char *v, char *err, size_t cap)
{
    if (tune_strategy_parse(v, dst))
        return true;
    snprintf(err, cap, "unknown strategy (exhaustive, random, evolve, model)");
    return false;
}

/* --shard I/N: dst is the tune_opts. */
static bool set_shard(void *dst, const char *v, char *err, size_t cap)
{
    tune_opts *o = dst;
    mt_err e = MT_ERR_INIT;
    if (tune_shard_parse(v, &o->shard_index, &o->shard_count, &e) == MT_OK)
        return true;
    snprintf(err, cap, "%s", e.msg);
    return false;
}

static const char tune_usage[] = "tune --family F --shape KEY|PRESET [options]\n"
                                 "tune --model DIR [options]\n"
                                 "tune --misses --db FILE [options]";

static const char tune_about[] =
    "Searches a kernel family's configurations for the shape at each M, verifies every "
    "candidate against the C reference, times it, and stores every trial and the winner "
    "per M in the database. With --model, every kernel the runtime runs for the "
    "checkpoint. Ctrl-C stops cleanly; running the same command again resumes (measured "
    "configs are not measured again).";

static int parse(int argc, char **argv, tune_opts *o, tune_cli *c)
{
    bool *pg = &c->plan_opts_given;
    c->mlist = (cli_int_list){c->ms, TUNE_MAX_M, 0};
    const cli_opt opts[] = {
        {.name = "--family", .type = CLI_OPT_STRING, .dst = &c->family, .arg = "F",
         .help = "kernel family (moetune kernels lists them)"},
        {.name = "--shape", .type = CLI_OPT_STRING, .dst = &c->shape, .arg = "KEY|PRESET",
         .help = "shape key (\"N=2048,K=6144\") or preset name (\"tiny\")"},
        {.name = "--model", .type = CLI_OPT_STRING, .dst = &c->model, .arg = "DIR",
         .help = "tune every kernel the runtime runs for the checkpoint DIR (its kernel "
                 "plan, from DIR/config.json alone); an M above a kernel's largest M is "
                 "skipped for that kernel"},
        {.name = "--act-quant", .type = CLI_OPT_CUSTOM, .dst = &c->plan.act_quant,
         .set = cli_set_act_quant, .given = &c->plan.act_quant_set, .arg = CLI_ACT_QUANT_ARG,
         .def_text = "the checkpoint's Quark config, as the runtime",
         .help = "with --model: none (a16w4), mxfp4 (a4w4) or int8 (a8w4, cpu only)"},
        {.name = "--kv-dtype", .type = CLI_OPT_CHOICE, .dst = &c->plan.kv_dtype,
         .choices = cli_kv_dtypes, .given = pg, .def_text = "bf16",
         .help = "with --model: the KV cache dtype"},
        {.name = "--max-batch-tokens", .type = CLI_OPT_INT, .dst = &c->plan.max_batch_tokens,
         .arg = "N", .min = 1, .max = HUGE_VAL, .given = pg, .def_text = "512",
         .help = "with --model: the runtime's largest step"},
        {.name = "--mtp", .type = CLI_OPT_FLAG, .dst = &c->plan.mtp, .given = pg,
         .help = "with --model: also the MTP layer's kernels (serve --speculative-steps K "
                 "runs them)"},
        {.name = "--ep", .type = CLI_OPT_CUSTOM, .dst = &c->plan, .set = set_ep,
         .given = pg, .arg = "N",
         .help = "with --model: also each rank's expert sort and expert GEMMs under expert "
                 "parallelism over N ranks (serve --ranks N): their local expert counts, M "
                 "up to every pair of a step"},
        {.name = "--tp", .type = CLI_OPT_CUSTOM, .dst = &c->plan, .set = set_tp, .given = pg,
         .arg = "N",
         .help = "with --model: also each rank's attention, embedding and lm_head kernels "
                 "under tensor parallelism over N ranks (serve --ranks N --tp): their local "
                 "head, o_proj row and vocabulary counts"},
        {.name = "--misses", .type = CLI_OPT_FLAG, .dst = &c->misses,
         .help = "tune every miss the database recorded for a device of this backend (what "
                 "a runtime looked up and did not find) that this device has no winner for, "
                 "costliest first: missed lookups x the default config's time here"},
        {.name = "--m", .type = CLI_OPT_INT_LIST, .dst = &c->mlist, .arg = "LIST", .min = 1,
         .max = HUGE_VAL, .def_text = "1,2,4,...,4096", .help = "token counts, e.g. 1,16,128"},
        {.name = "--device", .type = CLI_OPT_STRING, .dst = &o->device, .arg = "D",
         .def = "auto", .help = "cpu, emu, emu:wave32, hip, hip:N, cuda or auto"},
        {.name = "--arch", .type = CLI_OPT_STRING, .dst = &o->arch, .arg = "A",
         .help = "GPU arch; with no such GPU: compile-only"},
        {.name = "--db", .type = CLI_OPT_STRING, .dst = &o->db_path, .arg = "FILE",
         .def_text = CLI_DB_DEFAULT_TEXT, .help = "the database"},
        {.name = "--strategy", .type = CLI_OPT_CUSTOM, .dst = &o->strategy,
         .set = set_strategy, .arg = "S", .def_text = "model",
         .help = "model, exhaustive, random or evolve"},
        {.name = "--budget", .type = CLI_OPT_CUSTOM, .dst = &o->budget, .set = cli_set_budget,
         .arg = "B", .help = "trials per M (2000), a share of each M's valid space (15%) or "
                             "wall time for the run (30m, 90s)"},
        {.name = "--jobs", .type = CLI_OPT_INT, .dst = &o->jobs, .arg = "N", .def = "2",
         .min = 1, .max = 256, .help = "compile threads"},
        {.name = "--compile-only", .type = CLI_OPT_FLAG, .dst = &o->compile_only,
         .help = "compile the space and store resources, no timing"},
        {.name = "--shard", .type = CLI_OPT_CUSTOM, .dst = o, .set = set_shard, .arg = "I/N",
         .help = "tune the I-th of N disjoint parts of the space"},
        {.name = "--seed", .type = CLI_OPT_UINT64, .dst = &o->seed, .arg = "S",
         .def_text = "stable per shape and M", .help = "search-order seed"},
        {.name = "--timeout", .type = CLI_OPT_DOUBLE, .dst = &o->timeout_s, .arg = "SEC",
         .def = "60", .min = 0, .max = HUGE_VAL, .flags = CLI_OPT_MIN_OPEN,
         .help = "per-candidate limit in the worker"},
        {.name = "--max-reps", .type = CLI_OPT_INT, .dst = &o->timing.max_reps, .arg = "N",
         .def = "200", .min = 1, .max = HUGE_VAL,
         .help = "timed repetitions cap per candidate"},
        {.name = "--no-transfer", .type = CLI_OPT_FLAG_OFF, .dst = &o->transfer,
         .help = "do not seed each M from neighbouring M's winners"},
        {.name = "--confirm-rounds", .type = CLI_OPT_INT, .dst = &c->confirm_rounds,
         .arg = "N", .min = 0, .max = TUNE_CONFIRM_MAX_ROUNDS, .given = &c->confirm_given,
         .def_text = "10", .help = "paired rounds confirming a best config against the "
                                   "default (0: off, the lowest median wins; else 2 or more)"},
        {.name = "--confirm-top", .type = CLI_OPT_INT, .dst = &o->confirm_top, .arg = "N",
         .def = "3", .min = 1, .max = TUNE_CONFIRM_MAX_TOP,
         .help = "the search's best configs (by median, those beating the default's) "
                 "confirmed in the same paired rounds; the fastest one confirmed against the "
                 "default wins (1: the best median alone)"},
        {.name = "--confidence", .type = CLI_OPT_DOUBLE, .dst = &o->confidence, .arg = "P",
         .min = 0.5, .max = 1, .flags = CLI_OPT_MAX_OPEN, .def_text = "0.95",
         .help = "confidence of that decision"},
        {.name = "--model-check", .type = CLI_OPT_INT, .dst = &c->check_rounds, .arg = "R",
         .def = "10", .min = 0, .max = TUNE_CONFIRM_MAX_ROUNDS, .given = &c->check_given,
         .help = "with --model: end by timing the whole model with the tuned database "
                 "against the default configs in R paired rounds, with a 95% interval (0: "
                 "skip; else 2 or more)"},
        {.name = "--quiet", .type = CLI_OPT_FLAG, .dst = &c->quiet,
         .help = "no progress output"},
        {0},
    };
    const cli_cmd cmd = {.name = "tune", .usage = tune_usage, .about = tune_about,
                         .opts = opts};
    return cli_opts_parse(&cmd, argc, argv, 1);
}

/* What the table cannot say: rounds of 1, and which options go together. */
static int check_opts(tune_opts *o, tune_cli *c)
{
    if (c->check_rounds == 1) {
        cli_error("tune", "--model-check '1': 0 (skip) or 2..%d rounds",
                  TUNE_CONFIRM_MAX_ROUNDS);
        return CLI_USAGE;
    }
    if (c->confirm_given && c->confirm_rounds == 1) {
        cli_error("tune", "--confirm-rounds: 0 (off) or 2 to %d", TUNE_CONFIRM_MAX_ROUNDS);
        return CLI_USAGE;
    }
    if (c->confirm_given)
        o->confirm_rounds = c->confirm_rounds == 0 ? -1 : c->confirm_rounds;
    if (o->timing.min_reps > o->timing.max_reps)
        o->timing.min_reps = o->timing.max_reps;
    if (c->misses && (c->model || c->family || c->shape || c->mlist.n || c->check_given ||
                      c->plan_opts_given || c->plan.act_quant_set)) {
        cli_error("tune", "--misses takes its kernels, shapes and M from the database's "
                  "misses: no --family, --shape, --model, --m or model options with it");
        return CLI_USAGE;
    }
    if (c->misses)
        return 0;
    if (!c->model && (!c->family || !c->shape)) {
        cli_error("tune", "give --family and --shape, --model DIR, or --misses");
        return CLI_USAGE;
    }
    if (c->model && (c->family || c->shape)) {
        cli_error("tune", "--model derives families and shapes; do not combine it with "
                          "--family/--shape");
        return CLI_USAGE;
    }
    if (!c->model && c->check_given) {
        cli_error("tune", "--model-check goes with --model");
        return CLI_USAGE;
    }
    if (!c->model && (c->plan_opts_given || c->plan.act_quant_set)) {
        cli_error("tune", "--act-quant, --kv-dtype, --max-batch-tokens, --mtp, --ep and "
                  "--tp go with --model");
        return CLI_USAGE;
    }
    return 0;
}

/* The job of one kernel of the plan at the Ms of the list up to its
 * largest M: 1 when made, 0 when it sees no M of the list, -1 after saying
 * why it failed (job NULL: no room left for it). */
static int plan_job(const tune_cli *c, const model_plan_entry *e, const int64_t *ms, int n_m,
                    tune_job *job)
{
    int64_t mine[TUNE_MAX_M];
    int n_mine = 0;
    mt_err err = MT_ERR_INIT;
    for (int j = 0; j < n_m; j++)
        if (ms[j] <= e->m_max)
            mine[n_mine++] = ms[j];
    if (!n_mine) {
        if (!c->quiet)
            fprintf(stderr, "moetune tune: %s %s (%s): every M listed is above its largest "
                    "M %lld: not tuned\n", e->fam->name, e->key, e->purpose,
                    (long long)e->m_max);
        return 0;
    }
    if (!job) {
        cli_error("tune", "%s: the kernel plan has more than %d kernels", c->model,
                  TUNE_MAX_JOBS);
        return -1;
    }
    if (tune_job_make(e->fam, e->shape_text, mine, n_mine, job, &err) != MT_OK) {
        cli_error("tune", "%s %s (%s): %s", e->fam->name, e->shape_text, e->purpose, err.msg);
        return -1;
    }
    return 1;
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
    int rc = 0, made = 0;
    for (int i = 0; i < n_plan && !rc; i++) {
        tune_job *room = *n_jobs < TUNE_MAX_JOBS ? &jobs[*n_jobs] : NULL;
        if ((made = plan_job(c, &plan[i], ms, n_m, room)) < 0)
            rc = CLI_FAIL;
        else
            *n_jobs += made;
    }
    if (!rc && *n_jobs > 0 && !c->quiet)
        fprintf(stderr, "moetune tune: %s: the runtime's kernel plan has %d kernels; tuning %d"
                "%s\n", c->model, n_plan, *n_jobs,
                *n_jobs < n_plan ? " (the others see no M of the list)" : "");
    if (!rc && *n_jobs == 0) {
        cli_error("tune", "%s: no kernel of the plan sees an M of the list", c->model);
        rc = CLI_USAGE;
    }
    free(plan);
    return rc;
}

static int build_jobs(const tune_cli *c, tune_job *jobs, int *n_jobs)
{
    int n_m = c->mlist.n;
    mt_err err = MT_ERR_INIT;
    if (c->model)
        return model_jobs(c, n_m ? c->ms : tune_default_ms, n_m ? n_m : tune_default_n_ms,
                          jobs, n_jobs);
    const kern_family *f = kern_family_find(c->family);
    if (!f) {
        cli_error("tune", "unknown family '%s' (moetune kernels lists them)", c->family);
        return CLI_USAGE;
    }
    if (tune_job_make(f, c->shape, n_m ? c->ms : NULL, n_m, &jobs[0], &err) != MT_OK) {
        cli_error("tune", "%s", err.msg);
        return CLI_USAGE;
    }
    *n_jobs = 1;
    return 0;
}

/* n random token ids of rt's vocabulary, from a fixed seed; NULL when out
 * of memory. */
static int32_t *random_tokens(const model_runtime *rt, int n)
{
    int32_t *tok = malloc(sizeof *tok * (size_t)n);
    mt_rng rng;
    mt_rng_seed(&rng, 12345);
    int32_t V = model_runtime_vocab(rt);
    for (int i = 0; tok && i < n; i++)
        tok[i] = (int32_t)mt_rng_below(&rng, (uint64_t)V);
    return tok;
}

static void print_model_check(const model_ab_result *r, const char *device, int n)
{
    char pre[96], dec[96];
    model_ab_phase_text(&r->prefill, r->level, pre, sizeof pre);
    model_ab_phase_text(&r->decode, r->level, dec, sizeof dec);
    printf("\nmodel check (%s, %d paired rounds, tuned database vs default configs):\n"
           "  prefill of %d tokens: %.0f -> %.0f tok/s, %s\n"
           "  decode:               %.1f -> %.1f tok/s, %s\n",
           device, r->rounds, n, r->prefill.a_tps, r->prefill.b_tps, pre, r->decode.a_tps,
           r->decode.b_tps, dec);
    if (r->prefill.b_slower || r->decode.b_slower)
        fprintf(stderr, "moetune tune: WARNING: the model with the tuned database is slower "
                "than with the default configs (%s%s%s); the kernels' winners were each "
                "confirmed alone, so the loss is in how they run together (caches, "
                "launch overheads) or in untuned kernels\n",
                r->prefill.b_slower ? "prefill" : "",
                r->prefill.b_slower && r->decode.b_slower ? ", " : "",
                r->decode.b_slower ? "decode" : "");
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
    int64_t T = c->plan.max_batch_tokens > 0 ? c->plan.max_batch_tokens : 512;
    int n = T < 128 ? (int)T : 128;
    if (st == MT_OK && !(tok = random_tokens(def, n)))
        st = mt_fail(&err, MT_E_NOMEM, "model check");
    model_ab_result r;
    model_ab_opts ab = {.rounds = c->check_rounds, .level = 0.95, .seed = 1};
    if (st == MT_OK)
        st = model_ab_compare(def, tuned, tok, n, 16, &ab, &r, &err);
    if (st != MT_OK)
        fprintf(stderr, "moetune tune: model check skipped: %s\n", err.msg);
    else
        print_model_check(&r, ro.device, n);
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

/* Runs the jobs with Ctrl-C wired to a clean stop, prints the table and,
 * for --model, the model check; the exit code. */
static int run_jobs(const tune_job *jobs, int n_jobs, tune_opts *o, const tune_cli *c)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    tune_report *rep = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = tune_run(jobs, n_jobs, o, &rep, &err);
    sigaction(SIGINT, &old, NULL);
    if (rep)
        tune_report_print(rep, stdout);
    bool ran = rep && !rep->compile_only && st == MT_OK;
    tune_report_free(rep);
    if (ran && c->model && c->check_rounds > 0 && !stop_flag)
        model_check(c, o);
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

/* --misses: the database's misses, costliest first (tuner/tune_misses.h). */
static int run_misses(tune_opts *o)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    tune_misses_result res;
    mt_err err = MT_ERR_INIT;
    mt_status st = tune_misses_run(o, stdout, &res, &err);
    sigaction(SIGINT, &old, NULL);
    printf("\nmisses: %d recorded for this backend, %d left out, %d tuned\n", res.recorded,
           res.skipped, st == MT_OK ? res.n : 0);
    tune_misses_result_free(&res);
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

int cmd_tune(int argc, char **argv)
{
    tune_opts o;
    tune_opts_default(&o);
    tune_cli c = {0};
    o.db_path = cli_db_default();
    int rc = parse(argc, argv, &o, &c);
    if (rc)
        return rc == CLI_HELP ? CLI_OK : rc;
    if ((rc = check_opts(&o, &c)) != 0)
        return rc;
    if (c.misses) {
        o.log = c.quiet ? NULL : stderr;
        o.tty = isatty(2);
        o.stop = &stop_flag;
        o.argc = argc;
        o.argv = argv;
        return run_misses(&o);
    }
    tune_job *jobs = calloc(TUNE_MAX_JOBS, sizeof *jobs);
    if (!jobs) {
        cli_error("tune", "out of memory");
        return CLI_FAIL;
    }
    int n_jobs = 0;
    if (c.model)
        rc = plan_backend(&o, &c.plan);
    if (!rc)
        rc = build_jobs(&c, jobs, &n_jobs);
    if (!rc) {
        o.log = c.quiet ? NULL : stderr;
        o.tty = isatty(2);
        o.stop = &stop_flag;
        o.argc = argc;
        o.argv = argv;
        rc = run_jobs(jobs, n_jobs, &o, &c);
    }
    free(jobs);
    return rc;
}
