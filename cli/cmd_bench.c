/* cmd_bench.c: `moetune bench`: kernel benchmarks against limits measured
 * in the same run. --family moe times the MoE GEMMs (moe_gemm_up and
 * moe_gemm_down, or one of them) with fresh random routing per call. */
#include <stdio.h>
#include <string.h>

#include "../device/device.h"
#include "../kernels/moe_bench.h"
#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moetune bench --family moe|moe_gemm_up|moe_gemm_down [--shape glm5.2]\n"
            "                     [--m 1,4,16,64,256] [--device cpu] [--json] [--no-sweep]\n"
            "Per M: time of the default config and of the best of a small sweep, achieved\n"
            "weight bandwidth, GFLOP/s, the fraction of this machine's memory bandwidth\n"
            "(measured in the same run) and the sweep's speedup over the default.\n");
}

int cmd_bench(int argc, char **argv)
{
    const char *family = NULL, *shape = "glm5.2", *spec = "cpu", *mlist = "1,4,16,64,256";
    bool json = false, sweep = true, bad = false;
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
        } else if ((v = cli_opt(argc, argv, &i, "--m", &bad))) {
            mlist = v;
        } else if (cli_flag(argv[i], "--json")) {
            json = true;
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
    mt_err err = MT_ERR_INIT;
    if (dev_open(spec, NULL, &d, &err) != MT_OK) {
        cli_error("bench", "%s", err.msg);
        return CLI_FAIL;
    }
    moe_bench_opts o = {.shape = shape, .family = family, .ms = ms, .n_ms = n, .sweep = sweep,
                        .json = json};
    mt_status st = moe_bench_run(d, &o, stdout, &err);
    if (st != MT_OK)
        cli_error("bench", "%s", err.msg);
    dev_close(d);
    return st == MT_OK ? CLI_OK : CLI_FAIL;
}
