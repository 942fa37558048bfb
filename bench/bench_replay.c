/* bench_replay.c: replay tables and how well each search strategy does on
 * them (search quality: how close to the optimum in how few trials).
 *
 *   bench_replay sweep --family F --shape S --m 1,16 [--device cpu] [--shard I/N]
 *                      [--passes P] [--note TEXT] --out FILE
 *       times EVERY valid config of the space at each M, P times (default
 *       3): each pass is a tune of the whole space in its own random order
 *       into its own scratch database, no confirmation rounds, so the P
 *       timings of one config lie far apart and interleaved with the
 *       others. The table keeps per config the lowest of the passes'
 *       minimum times (the runs no other process preempted: preemption can
 *       slow a run, never speed it up) and the highest (the spread), and the machine it ran on: cpu model, ISA
 *       extensions, cores, date and the load average before and after.
 *       --shard I/N sweeps that shard of the space only (a deterministic
 *       part, docs/TUNING.md), for spaces too large to sweep whole; the
 *       replay then searches the same shard. --db DIR keeps the pass
 *       databases there (default: a fresh directory in /tmp), so an
 *       interrupted sweep resumes. --note adds a line to the header.
 *   bench_replay replay [--seeds N] [--strategies random,evolve,model]
 *                       [--budgets 5,10,15] FILE...
 *       replays each strategy over N seeds (default 200) on each table and
 *       M at budgets of 5 %, 10 % and 15 % of the space (at least 1; or the
 *       percentages given), and
 *       prints the fraction of the optimum reached (optimum / best found:
 *       median, mean and the worst tenth over seeds) and the hit rate (the
 *       share of seeds that found the optimum itself). Every strategy
 *       proposes the default config first, as the tuner does. --transfer
 *       adds rows "+T": the tuner's transfer between M, emulated: per seed
 *       the same strategy and budget search the table's nearest other M
 *       first, and its fastest 5 configs seed the search at this M (the
 *       tuner seeds each M with the winner and runner-ups of the nearest M
 *       tuned before it).
 *
 * Compile-only spaces (hip --arch without a GPU) have no time, and emu
 * times measure the emulator, not a GPU: neither makes a table here. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/lib/replay.h"
#include "common/rng.h"
#include "db/db.h"
#include "tuner/tune_impl.h"

static void die(const char *what, const mt_err *err)
{
    fprintf(stderr, "bench_replay: %s: %s\n", what, err->msg);
    exit(1);
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_replay sweep --family F --shape S --m LIST [--device D] "
                    "[--shard I/N] [--passes P] [--db DIR] [--timeout S] [--note TEXT] --out FILE\n"
                    "       bench_replay replay [--seeds N] [--strategies LIST] [--budgets PCTS] "
                    "[--transfer] FILE...\n");
    exit(2);
}

/* ---- sweep ---------------------------------------------------------------------------- */

static void cpu_model(char *out, size_t cap, char *isa, size_t isa_cap)
{
    snprintf(out, cap, "unknown");
    isa[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[8192];
    bool have_model = false, have_flags = false;
    while (fgets(line, sizeof line, f) && !(have_model && have_flags)) {
        line[strcspn(line, "\n")] = 0;
        const char *v = strchr(line, ':');
        v = v ? v + 2 : "";
        if (!have_model && !strncmp(line, "model name", 10)) {
            snprintf(out, cap, "%s", v);
            have_model = true;
        } else if (!have_flags && !strncmp(line, "flags", 5)) {
            static const char *const want[] = {"avx2", "fma", "avx512f", "avx512bw",
                                               "avx512_vnni", "avx512_bf16", "amx_tile"};
            for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
                char pat[40];
                snprintf(pat, sizeof pat, " %s ", want[i]);
                char padded[8200];
                snprintf(padded, sizeof padded, " %s ", v);
                if (strstr(padded, pat)) {
                    size_t u = strlen(isa);
                    snprintf(isa + u, isa_cap - u, "%s%s", u ? " " : "", want[i]);
                }
            }
            have_flags = true;
        }
    }
    fclose(f);
}

static double load1(void)
{
    double l = NAN;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = NAN;
        fclose(f);
    }
    return l;
}

#define SWEEP_MAX_PASSES 32

/* One (M, config) of the table, combined over the passes. */
typedef struct sweep_cell {
    int64_t m;
    char config[DB_CONFIG_KEY_MAX + 1];
    db_trial_status status; /* ok when any pass was ok, else the last pass's */
    double lo, hi;          /* lowest and highest minimum over the passes that
                               gave a time (ok or skipped) */
    int passes;             /* passes that gave a median */
    double mins[SWEEP_MAX_PASSES]; /* each such pass's minimum */
} sweep_cell;

typedef struct sweep_acc {
    sweep_cell *cells;
    int n, cap;
    const int64_t *ms; /* only these M */
    int n_m;
    bool nomem;
} sweep_acc;

static int acc_cb(void *arg, const db_trial_row *row)
{
    sweep_acc *a = arg;
    const db_trial *t = &row->t;
    bool wanted = false;
    for (int i = 0; i < a->n_m; i++)
        wanted = wanted || a->ms[i] == t->m;
    if (!wanted)
        return 0;
    sweep_cell *c = NULL;
    for (int i = 0; i < a->n && !c; i++)
        if (a->cells[i].m == t->m && !strcmp(a->cells[i].config, t->config_key))
            c = &a->cells[i];
    if (!c) {
        if (a->n == a->cap) {
            int cap = a->cap ? a->cap * 2 : 256;
            sweep_cell *g = realloc(a->cells, sizeof *g * (size_t)cap);
            if (!g) {
                a->nomem = true;
                return 1;
            }
            a->cells = g;
            a->cap = cap;
        }
        c = &a->cells[a->n++];
        *c = (sweep_cell){.m = t->m, .status = t->status, .lo = INFINITY, .hi = -INFINITY};
        snprintf(c->config, sizeof c->config, "%s", t->config_key);
    }
    /* A pass's fastest run: preemption by other processes slows a run,
     * never speeds it up (every run starts with the problem evicted from
     * the caches). At load 8-15 the passes' medians of one config differed
     * by 2.7x on average, and even their p10 by 2.8x. */
    double v = t->time_min_ms > 0 ? t->time_min_ms : t->time_median_ms;
    bool timed = (t->status == DB_TRIAL_OK || t->status == DB_TRIAL_SKIPPED) && v > 0;
    if (c->status != DB_TRIAL_OK)
        c->status = t->status;
    if (timed && c->passes < SWEEP_MAX_PASSES) {
        c->lo = v < c->lo ? v : c->lo;
        c->hi = v > c->hi ? v : c->hi;
        c->mins[c->passes++] = v;
    }
    return 0;
}

static int cmp_ms(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of the passes' minimum times: the table's time. */
static double cell_time(sweep_cell *c)
{
    if (!c->passes)
        return NAN;
    qsort(c->mins, (size_t)c->passes, sizeof c->mins[0], cmp_ms);
    int h = c->passes / 2;
    return c->passes % 2 ? c->mins[h] : 0.5 * (c->mins[h - 1] + c->mins[h]);
}

static void put_ms(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    fputc(',', f);
}

static int sweep(int argc, char **argv)
{
    const char *family = NULL, *shape = NULL, *device = "cpu", *out = NULL, *shard = NULL;
    const char *db_arg = NULL, *note = NULL;
    double timeout_s = 0;
    int passes = 3;
    int64_t ms[TUNE_MAX_M];
    int n_m = 0;
    for (int i = 2; i < argc; i++) {
        if (i + 1 >= argc)
            usage();
        if (!strcmp(argv[i], "--family"))
            family = argv[++i];
        else if (!strcmp(argv[i], "--shape"))
            shape = argv[++i];
        else if (!strcmp(argv[i], "--device"))
            device = argv[++i];
        else if (!strcmp(argv[i], "--out"))
            out = argv[++i];
        else if (!strcmp(argv[i], "--shard"))
            shard = argv[++i];
        else if (!strcmp(argv[i], "--db"))
            db_arg = argv[++i];
        else if (!strcmp(argv[i], "--note"))
            note = argv[++i];
        else if (!strcmp(argv[i], "--timeout"))
            timeout_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--passes"))
            passes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--m")) {
            for (char *t = strtok(argv[++i], ","); t && n_m < TUNE_MAX_M; t = strtok(NULL, ","))
                ms[n_m++] = atoll(t);
        } else
            usage();
    }
    if (!family || !shape || !out || n_m < 1 || passes < 1 || passes > 64)
        usage();
    const kern_family *f = kern_family_find(family);
    if (!f) {
        fprintf(stderr, "bench_replay: no family '%s'\n", family);
        return 2;
    }
    mt_err err = MT_ERR_INIT;
    tune_job job;
    if (tune_job_make(f, shape, ms, n_m, &job, &err) != MT_OK)
        die("job", &err);
    char dir[] = "/tmp/mt_bench_replay_XXXXXX";
    if (db_arg && mkdir(db_arg, 0755) && errno != EEXIST) {
        perror(db_arg);
        return 1;
    }
    if (!db_arg && !mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    tune_opts o;
    tune_opts_default(&o);
    o.device = device;
    /* Every pass times the whole space in its own random order, into its
     * own database (a config known to the database is not timed again), so
     * each config's passes lie minutes apart, interleaved with the others:
     * a preemption that inflates one pass's time of a config rarely hits
     * all of them. Compiles are cached after the first pass. */
    o.strategy = TUNE_RANDOM;
    o.confirm_rounds = -1; /* the table is the search's times, not decisions */
    o.transfer = false;
    if (timeout_s > 0) /* a low-priority sweep on a loaded machine is slow */
        o.timeout_s = timeout_s;
    o.log = getenv("BENCH_REPLAY_LOG") ? stderr : NULL;
    if (shard && tune_shard_parse(shard, &o.shard_index, &o.shard_count, &err) != MT_OK)
        die("--shard", &err);
    double load_before = load1();
    time_t t0 = time(NULL);
    char device_name[256] = "";
    sweep_acc acc = {.ms = job.m, .n_m = job.n_m};
    for (int pass = 1; pass <= passes; pass++) {
        char db_path[512];
        /* --db PREFIX keeps the pass databases, so an interrupted sweep
         * resumes: measured configs are kept */
        snprintf(db_path, sizeof db_path, "%s/pass-%d.db", db_arg ? db_arg : dir, pass);
        o.db_path = db_path;
        o.seed = 0x5eedull * (uint64_t)pass + 1;
        tune_report *rep = NULL;
        if (tune_run(&job, 1, &o, &rep, &err) != MT_OK)
            die("sweep pass", &err);
        snprintf(device_name, sizeof device_name, "%s", rep->device_name);
        tune_report_free(rep);
        db_t *db = NULL;
        if (db_open(db_path, DB_OPEN_READONLY, &db, &err) != MT_OK)
            die("open sweep database", &err);
        db_filter flt = {.family = f->name};
        if (db_trials_each(db, &flt, acc_cb, &acc, &err) != MT_OK || acc.nomem)
            die("read trials", &err);
        db_close(db);
        fprintf(stderr, "bench_replay: pass %d/%d done, %ld s, load %.2f\n", pass, passes,
                (long)(time(NULL) - t0), load1());
    }
    double load_after = load1();
    long wall = (long)(time(NULL) - t0);
    char key[KERN_KEY_MAX];
    kern_shape_key(f, &job.shape, false, key, sizeof key);
    FILE *fo = fopen(out, "w");
    if (!fo) {
        perror(out);
        return 1;
    }
    char model[256], isa[256], date[32];
    cpu_model(model, sizeof model, isa, sizeof isa);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%MZ", gmtime(&t0));
    char hash[65];
    kern_source_hash(f, !strncmp(device, "emu", 3)   ? DEV_BACKEND_EMU
                        : !strncmp(device, "hip", 3) ? DEV_BACKEND_HIP
                                                     : DEV_BACKEND_CPU,
                     hash);
    fprintf(fo, "# moetune replay table 3\n# family: %s\n# version: %d\n# source_hash: %s\n"
                "# shape: %s\n# device: %s\n# device_name: %s\n# cpu: %s\n# isa: %s\n"
                "# cores: %ld\n# date: %s\n# sweep: %d passes over the space, each in its own "
                "random order; time_ms = the median of the passes' minimum times, min_ms and "
                "max_ms the lowest and highest; "
                "%ld s, load "
                "average %.2f before, %.2f after\n",
            f->name, f->version, hash, key, device, device_name, model, isa,
            sysconf(_SC_NPROCESSORS_ONLN), date, passes, wall, load_before, load_after);
    if (note)
        fprintf(fo, "# note: %s\n", note);
    if (o.shard_count > 1)
        fprintf(fo, "# shard: %d/%d\n", o.shard_index, o.shard_count);
    fprintf(fo, "m,status,time_ms,min_ms,max_ms,passes,config\n");
    for (int i = 0; i < acc.n; i++) {
        sweep_cell *c = &acc.cells[i];
        fprintf(fo, "%lld,%s,", (long long)c->m, db_trial_status_str(c->status));
        put_ms(fo, cell_time(c));
        put_ms(fo, c->passes ? c->lo : NAN);
        put_ms(fo, c->passes ? c->hi : NAN);
        fprintf(fo, "%d,%s\n", c->passes, c->config);
    }
    fclose(fo);
    fprintf(stderr, "bench_replay: %s: %d rows, %d passes, %ld s, load %.2f -> %.2f\n", out,
            acc.n, passes, wall, load_before, load_after);
    free(acc.cells);
    return 0;
}

/* ---- replay --------------------------------------------------------------------------- */

static void replay_file(const char *path, const tune_strategy *sts, int n_st, int seeds,
                        const double *pct, int n_pct, bool transfer)
{
    replay_table t;
    mt_err err = MT_ERR_INIT;
    if (replay_table_read(path, &t, &err) != MT_OK)
        die("table", &err);
    const kern_family *f = kern_family_find(t.family);
    int backend = db_backend_parse(t.device);
    kern_shape s;
    if (!f || backend < 0 || kern_shape_parse(f, t.shape, &s, NULL, &err) != MT_OK) {
        fprintf(stderr, "bench_replay: %s: family %s, device %s or shape %s unknown here\n",
                path, t.family, t.device, t.shape);
        exit(1);
    }
    const kern_impl *im = kern_family_impl(f, backend);
    dev_props props;
    if (replay_table_props(&t, &props, &err) != MT_OK)
        die("open device", &err);
    printf("== %s: %s %s on %s\n   %s\n", path, t.family, t.shape, t.device, t.machine);
    int64_t ms[64];
    int n_m = replay_table_ms(&t, ms, 64);
    for (int mi = 0; mi < n_m; mi++) {
        int rows = 0, space = 0;
        double opt = replay_table_optimum(&t, ms[mi], &rows);
        replay_search(f, im, &s, ms[mi], &props, TUNE_RANDOM, 1, 1, &t, &space);
        kern_config dc;
        im->default_config(&s, ms[mi], &props, &dc);
        char dkey[DB_CONFIG_KEY_MAX + 1];
        kern_config_key(im, &dc, dkey, sizeof dkey);
        double dms = replay_table_time(&t, ms[mi], dkey);
        /* Transfer from the nearest other M of the table (log2 distance). */
        int64_t from = 0;
        for (int j = 0; j < n_m; j++)
            if (j != mi && (!from || fabs(log2((double)ms[j] / (double)ms[mi])) <
                                         fabs(log2((double)from / (double)ms[mi]))))
                from = ms[j];
        printf("   M=%lld: space %d (table %d rows), optimum %.4g ms, default %.3f of it\n",
               (long long)ms[mi], space, rows, opt, opt / dms);
        if (transfer && from > 0)
            printf("   +T: seeded with the fastest %d of the same search at M=%lld first "
                   "(the tuner's transfer)\n", REPLAY_TRANSFER_SEEDS, (long long)from);
        printf("   %-8s %6s %6s  %8s %8s %8s  %6s\n", "strategy", "budget", "of sp", "median",
               "mean", "worst10", "hit");
        for (int b = 0; b < n_pct; b++) {
            int budget = (int)ceil(pct[b] * space);
            budget = budget < 1 ? 1 : budget;
            for (int k = 0; k < n_st; k++)
                for (int x = 0; x < 1 + (transfer && from > 0); x++) {
                    replay_score sc;
                    replay_score_transfer(f, im, &s, ms[mi], x ? from : 0, &props, sts[k],
                                          1000003, seeds, budget, &t, &sc);
                    char label[32];
                    snprintf(label, sizeof label, "%s%s", tune_strategy_name(sts[k]),
                             x ? "+T" : "");
                    printf("   %-8s %6d %5.0f%%  %8.3f %8.3f %8.3f  %5.0f%%\n", label, budget,
                           pct[b] * 100, sc.median, sc.mean, sc.p10, sc.hit * 100);
                }
        }
    }
    replay_table_free(&t);
}

static int replay(int argc, char **argv)
{
    int seeds = 200;
    tune_strategy sts[TUNE_STRATEGY_COUNT] = {TUNE_RANDOM, TUNE_EVOLVE, TUNE_MODEL};
    int n_st = 3, first = 0, n_pct = 3;
    double pct[8] = {0.05, 0.10, 0.15};
    bool transfer = false;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--transfer")) {
            transfer = true;
            continue;
        }
        if (!strcmp(argv[i], "--seeds") && i + 1 < argc)
            seeds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--budgets") && i + 1 < argc) {
            n_pct = 0;
            for (char *t = strtok(argv[++i], ","); t && n_pct < 8; t = strtok(NULL, ","))
                if ((pct[n_pct++] = atof(t) / 100) <= 0 || pct[n_pct - 1] > 1)
                    usage();
        } else if (!strcmp(argv[i], "--strategies") && i + 1 < argc) {
            n_st = 0;
            for (char *t = strtok(argv[++i], ","); t && n_st < TUNE_STRATEGY_COUNT;
                 t = strtok(NULL, ","))
                if (!tune_strategy_parse(t, &sts[n_st++]))
                    usage();
        } else if (argv[i][0] == '-')
            usage();
        else if (!first)
            first = i;
    }
    if (!first || seeds < 1 || n_st < 1)
        usage();
    printf("replayed over %d seeds; fraction of the optimum = optimum / best found "
           "(median, mean, worst tenth); hit = found the optimum\n", seeds);
    for (int i = first; i < argc; i++)
        if (argv[i][0] != '-' && !(i > 2 && (!strcmp(argv[i - 1], "--seeds") ||
                                             !strcmp(argv[i - 1], "--budgets") ||
                                             !strcmp(argv[i - 1], "--strategies"))))
            replay_file(argv[i], sts, n_st, seeds, pct, n_pct, transfer);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    if (!strcmp(argv[1], "sweep"))
        return sweep(argc, argv);
    if (!strcmp(argv[1], "replay"))
        return replay(argc, argv);
    usage();
}
