/* cmd_bench.c: `moetune bench`: kernel benchmarks against limits measured
 * in the same run (bench/lib/moe_bench.h). --family moe times the served
 * MoE layer with the database's configs and the expert GEMM stages alone;
 * moe_gemm_up or moe_gemm_down one stage. Fresh routing every call. */
#include <stdio.h>
#include <string.h>

#include "device/device.h"
#include "bench/lib/moe_bench.h"
#include "db/db.h"
#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moetune bench --family moe|moe_gemm_up|moe_gemm_down [--shape glm5.2]\n"
            "                     [--m 1,4,16,64,256] [--device cpu] [--arch A] [--db tuned.db]\n"
            "                     [--json]\n"
            "                     [--no-sweep] [--all] [--flush] [--breakdown] [--wl 0|1]\n"
            "Per M, with fresh routing every call: --family moe times the MoE layer the\n"
            "server runs (router, expert sort, expert GEMMs, shared expert), each kernel with\n"
            "the config --db gives for that M (defaults without it); then each expert GEMM\n"
            "stage alone: the default config and the best of a small sweep (cpu). Reported:\n"
            "achieved weight bandwidth, GFLOP/s and the fraction of this machine's memory\n"
            "bandwidth: the fastest of ten read patterns (streams, line prefetch, a touch of\n"
            "each page ahead; printed after the probe, probe_pattern in JSON), sampled\n"
            "between the timed calls on a slice read once untimed first (the\n"
            "limit is the best sample: noise only lowers a probe), the median call against\n"
            "it (\"of bw\"), and the median of each call against the best of the samples\n"
            "before and after its round and the rounds next to it (\"paired\": on a machine\n"
            "whose bandwidth drifts, the figure for the moment; above 1, the samples of that\n"
            "stretch read below its calls: the run was disturbed). On cpu each round also\n"
            "reads the weights of a\n"
            "fresh routing's experts plainly, in the probe's fastest pattern, in 512 KiB\n"
            "pieces: its fraction of the probe is the access pattern's, the best config's\n"
            "fraction of it the kernel's own. A stage's limit is the fastest read of memory\n"
            "seen: in a round where the plain read, or a call, reads faster than the samples\n"
            "it is that round's limit, and the run's where it beats the best sample\n"
            "(pattern_above_probe_rounds, call_above_probe_rounds in JSON). --all prints every\n"
            "config's p10/median/p90 to stderr. --flush streams 1 GiB\n"
            "before every timed call, so nothing a call read stays cached. --arch on cpu caps\n"
            "the compiled code at an x86-64 level (x86-64-v3: the AVX2 paths). --wl times\n"
            "the expert weights in Quark rows (0) or grouped by 16 rows (1, the cpu tiles'\n"
            "layout); default: the layout the runtime uses on the device. --breakdown\n"
            "(--family moe) then times the layer once more per M with every kernel\n"
            "synchronized and prints each kernel's share.\n");
}

int cmd_bench(int argc, char **argv)
{
    const char *family = NULL, *shape = "glm5.2", *spec = "cpu", *mlist = "1,4,16,64,256";
    const char *db_path = NULL, *arch = NULL;
    bool json = false, sweep = true, flush = false, all = false, bad = false, wl_set = false;
    bool breakdown = false;
    int wl = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv[i], "--help") || cli_flag(argv[i], "-h")) {
            usage(stdout);
            return CLI_OK;
        } else if ((v = cli_opt(argc, argv, &i, "--family", &bad))) {
            family = v;
        } else if ((v = cli_opt(argc, argv, &i, "--shape", &bad))) {
            shape = v;
        } else if ((v = cli_opt(argc, argv, &i, "--device", &bad))) {
            spec = v;
        } else if ((v = cli_opt(argc, argv, &i, "--arch", &bad))) {
            arch = v;
        } else if ((v = cli_opt(argc, argv, &i, "--db", &bad))) {
            db_path = v;
        } else if ((v = cli_opt(argc, argv, &i, "--m", &bad))) {
            mlist = v;
        } else if (cli_flag(argv[i], "--json")) {
            json = true;
        } else if (cli_flag(argv[i], "--flush")) {
            flush = true;
        } else if (cli_flag(argv[i], "--all")) {
            all = true;
        } else if (cli_flag(argv[i], "--breakdown")) {
            breakdown = true;
        } else if ((v = cli_opt(argc, argv, &i, "--wl", &bad))) {
            if (strcmp(v, "0") && strcmp(v, "1")) {
                cli_error("bench", "--wl '%s': 0 (Quark rows) or 1 (grouped by 16)", v);
                bad = true;
            }
            wl_set = true;
            wl = v[0] == '1';
        } else if (cli_flag(argv[i], "--no-sweep")) {
            sweep = false;
        } else if (!bad) {
            cli_error("bench", "unknown option '%s'", argv[i]);
            bad = true;
        }
        if (bad)
            break;
    }
    if (bad || !family) {
        if (!family && !bad)
            cli_error("bench", "--family is required");
        usage(stderr);
        return CLI_USAGE;
    }
    if (strcmp(family, "moe") && strcmp(family, "moe_gemm_up") && strcmp(family, "moe_gemm_down")) {
        cli_error("bench", "no benchmark for family '%s' (moe, moe_gemm_up, moe_gemm_down)",
                  family);
        return CLI_USAGE;
    }
    long long ml[32];
    int n = cli_parse_int_list(mlist, ml, 32);
    if (n <= 0) {
        cli_error("bench", "--m '%s' is not a list of token counts", mlist);
        return CLI_USAGE;
    }
    int64_t ms[32];
    for (int i = 0; i < n; i++) {
        if (ml[i] < 1) {
            cli_error("bench", "--m: %lld is not a positive token count", ml[i]);
            return CLI_USAGE;
        }
        ms[i] = ml[i];
    }
    dev_device *d = NULL;
    db_t *db = NULL;
    mt_err err = MT_ERR_INIT;
    if (db_path && db_open(db_path, DB_OPEN_READONLY, &db, &err) != MT_OK) {
        cli_error("bench", "%s", err.msg);
        return CLI_FAIL;
    }
    dev_open_opts oo = {.arch = arch};
    if (dev_open(spec, &oo, &d, &err) != MT_OK) {
        cli_error("bench", "%s", err.msg);
        db_close(db);
        return CLI_FAIL;
    }
    moe_bench_opts o = {.shape = shape, .family = family, .ms = ms, .n_ms = n, .sweep = sweep,
                        .json = json, .flush = flush, .all = all, .breakdown = breakdown,
                        .wl_set = wl_set, .wl = wl, .db = db, .log = stderr};
    mt_status st = moe_bench_run(d, &o, stdout, &err);
    if (st != MT_OK)
        cli_error("bench", "%s", err.msg);
    dev_close(d);
    db_close(db);
    return st == MT_OK ? CLI_OK : CLI_FAIL;
}
