/* cmd_bench.c: `moetune bench`: kernel benchmarks against limits measured
 * in the same run (bench/lib/moe_bench.h). --family moe times the served
 * MoE layer with the database's configs and the expert GEMM stages alone;
 * moe_layer the layer alone; moe_gemm_up or moe_gemm_down one stage. Fresh
 * routing every call. --dump writes the layer's inputs, weights and output
 * for a peer implementation (bench/lib/moe_dump.h). */
#include <stdio.h>
#include <string.h>

#include "device/device.h"
#include "bench/lib/moe_bench.h"
#include "db/db.h"
#include "cli.h"

static const cli_choice families[] = {
    {"moe", 0}, {"moe_gemm_up", 1}, {"moe_gemm_down", 2}, {"moe_layer", 3}, {NULL, 0}};

typedef struct bench_cli {
    int family;
    const char *shape, *spec, *db_path, *arch, *dump;
    double max_ms;
    int max_reps;
    int64_t ms[32];
    cli_int_list mlist;
    bool json, sweep, flush, all, breakdown, wl_set;
    int wl;
} bench_cli;

static int parse(int argc, char **argv, bench_cli *c)
{
    static const cli_choice wl[] = {{"0", 0}, {"1", 1}, {NULL, 0}};
    c->mlist = (cli_int_list){c->ms, 32, 0};
    const cli_opt opts[] = {
        {.name = "--family", .type = CLI_OPT_CHOICE, .dst = &c->family, .choices = families,
         .flags = CLI_OPT_REQUIRED,
         .help = "moe: the served MoE layer, then each expert GEMM stage alone; "
                 "moe_layer: the layer alone; moe_gemm_up or moe_gemm_down: that stage"},
        {.name = "--shape", .type = CLI_OPT_STRING, .dst = &c->shape, .arg = "KEY",
         .def = "glm5.2", .help = "a preset or shape key of the family"},
        {.name = "--m", .type = CLI_OPT_INT_LIST, .dst = &c->mlist, .arg = "LIST",
         .def = "1,4,16,64,256", .min = 1, .max = HUGE_VAL, .help = "token counts"},
        {.name = "--device", .type = CLI_OPT_STRING, .dst = &c->spec, .arg = "D", .def = "cpu",
         .help = "the device to time on"},
        {.name = "--arch", .type = CLI_OPT_STRING, .dst = &c->arch, .arg = "A",
         .help = "on cpu: cap the compiled code at an x86-64 level (x86-64-v3: the AVX2 "
                 "paths)"},
        {.name = "--db", .type = CLI_OPT_STRING, .dst = &c->db_path, .arg = "FILE",
         .def_text = "none: default configs", .help = "the tuning database the layer's "
                 "configs come from"},
        {.name = "--json", .type = CLI_OPT_FLAG, .dst = &c->json,
         .help = "machine-readable output"},
        {.name = "--no-sweep", .type = CLI_OPT_FLAG_OFF, .dst = &c->sweep,
         .help = "no sweep of the stages' configs: the default config alone"},
        {.name = "--all", .type = CLI_OPT_FLAG, .dst = &c->all,
         .help = "print every config's p10/median/p90 to stderr"},
        {.name = "--flush", .type = CLI_OPT_FLAG, .dst = &c->flush,
         .help = "stream 1 GiB before every timed call, so nothing a call read stays cached"},
        {.name = "--breakdown", .type = CLI_OPT_FLAG, .dst = &c->breakdown,
         .help = "(--family moe) then time the layer once more per M with every kernel "
                 "synchronized and print each kernel's share"},
        {.name = "--max-ms", .type = CLI_OPT_DOUBLE, .dst = &c->max_ms, .arg = "MS",
         .def = "1500", .min = 0, .max = HUGE_VAL, .flags = CLI_OPT_MIN_OPEN,
         .help = "timed calls per config and M until their kernel time reaches this"},
        {.name = "--max-reps", .type = CLI_OPT_INT, .dst = &c->max_reps, .arg = "N",
         .def = "100", .min = 3, .max = 100,
         .help = "timed calls per config and M at most (each layer call draws new "
                 "tokens on the host first)"},
        {.name = "--dump", .type = CLI_OPT_STRING, .dst = &c->dump, .arg = "DIR",
         .help = "(--family moe or moe_layer) before timing, run the layer once per M and "
                 "write its inputs (bf16 x, the routing's ids and weights), the weights of "
                 "the experts they hit and the shared expert's (MXFP4 in Quark's layout), "
                 "its output and meta.json to DIR, for bench/gpu/moe_peer.py"},
        {.name = "--wl", .type = CLI_OPT_CHOICE, .dst = &c->wl, .choices = wl,
         .given = &c->wl_set, .def_text = "the layout the runtime uses on the device",
         .help = "time the expert weights in Quark rows (0) or grouped by 16 rows (1, the "
                 "cpu tiles' layout)"},
        {0},
    };
    const cli_cmd cmd = {
        .name = "bench", .opts = opts,
        .usage = "bench --family moe|moe_layer|moe_gemm_up|moe_gemm_down [--shape glm5.2]\n"
                 "      [--m 1,4,16,64,256] [--device cpu] [--arch A] [--db tuned.db]\n"
                 "      [--json] [--no-sweep] [--all] [--flush] [--breakdown] [--wl 0|1]\n"
                 "      [--max-ms MS] [--max-reps N] [--dump DIR]",
        .about = "Per M, with fresh routing every call: --family moe times the MoE layer the "
                 "server runs (router, expert sort, expert GEMMs, shared expert), each kernel "
                 "with the config --db gives for that M (defaults without it); then each "
                 "expert GEMM stage alone: the default config and the best of a small sweep "
                 "(cpu). Reported: achieved weight bandwidth, GFLOP/s and the fraction of "
                 "this machine's memory bandwidth: the fastest of ten read patterns "
                 "(streams, line prefetch, a touch of each page ahead; printed after the "
                 "probe, probe_pattern in JSON), sampled between the timed calls on a slice "
                 "read once untimed first (the limit is the best sample: noise only lowers a "
                 "probe), the median call against it (\"of bw\"), and the median of each call "
                 "against the best of the samples before and after its round and the rounds "
                 "next to it (\"paired\": on a machine whose bandwidth drifts, the figure for "
                 "the moment; above 1, the samples of that stretch read below its calls: the "
                 "run was disturbed). On cpu each round also reads the weights of a fresh "
                 "routing's experts plainly, in the probe's fastest pattern, in 512 KiB "
                 "pieces: its fraction of the probe is the access pattern's, the best "
                 "config's fraction of it the kernel's own. A stage's limit is the fastest "
                 "read of memory seen: in a round where the plain read, or a call, reads "
                 "faster than the samples it is that round's limit, and the run's where it "
                 "beats the best sample (pattern_above_probe_rounds, call_above_probe_rounds "
                 "in JSON)."};
    return cli_opts_parse(&cmd, argc, argv, 1);
}

int cmd_bench(int argc, char **argv)
{
    bench_cli c = {0};
    int rc = parse(argc, argv, &c);
    if (rc)
        return rc == CLI_HELP ? CLI_OK : rc;
    dev_device *d = NULL;
    db_t *db = NULL;
    mt_err err = MT_ERR_INIT;
    if (c.db_path && db_open(c.db_path, DB_OPEN_READONLY, &db, &err) != MT_OK) {
        cli_error("bench", "%s", err.msg);
        return CLI_FAIL;
    }
    dev_open_opts oo = {.arch = c.arch};
    if (dev_open(c.spec, &oo, &d, &err) != MT_OK) {
        cli_error("bench", "%s", err.msg);
        db_close(db);
        return CLI_FAIL;
    }
    moe_bench_opts o = {.shape = c.shape, .family = families[c.family].name, .ms = c.ms,
                        .n_ms = c.mlist.n, .sweep = c.sweep, .json = c.json, .flush = c.flush,
                        .all = c.all, .breakdown = c.breakdown, .wl_set = c.wl_set, .wl = c.wl,
                        .max_ms = c.max_ms, .max_reps = c.max_reps, .dump_dir = c.dump,
                        .db = db, .log = stderr};
    mt_status st = moe_bench_run(d, &o, stdout, &err);
    if (st != MT_OK)
        cli_error("bench", "%s", err.msg);
    dev_close(d);
    db_close(db);
    return st == MT_OK ? CLI_OK : CLI_FAIL;
}
