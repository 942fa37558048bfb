/* bench_moe.c: MoE GEMM benchmark at a shape (default glm5.2) on a device
 * (default cpu): per M, time of the default config and of the best of a
 * small sweep, achieved weight bandwidth, GFLOP/s and the fraction of this
 * machine's memory bandwidth measured in the same run; with --family moe
 * (the default) first the served MoE layer with default configs (moetune
 * bench --db takes a tuning database).
 *   bench_moe [--shape glm5.2] [--m 1,4,16,64,256] [--device cpu] [--json]
 *             [--family moe|moe_gemm_up|moe_gemm_down] [--no-sweep] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "bench/lib/moe_bench.h"

int main(int argc, char **argv)
{
    const char *shape = "glm5.2", *spec = "cpu", *family = "moe", *mlist = "1,4,16,64,256";
    bool json = false, sweep = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc)
            shape = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            spec = argv[++i];
        else if (!strcmp(argv[i], "--family") && i + 1 < argc)
            family = argv[++i];
        else if (!strcmp(argv[i], "--m") && i + 1 < argc)
            mlist = argv[++i];
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--no-sweep"))
            sweep = false;
        else {
            fprintf(stderr, "usage: %s [--shape S] [--m LIST] [--device D] [--family F] "
                    "[--json] [--no-sweep]\n", argv[0]);
            return 2;
        }
    }
    int64_t ms[32];
    int n = 0;
    for (const char *p = mlist; *p && n < 32;) {
        char *end;
        ms[n++] = strtoll(p, &end, 10);
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p)
            break;
    }
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    if (dev_open(spec, NULL, &d, &err) != MT_OK) {
        fprintf(stderr, "bench_moe: %s\n", err.msg);
        return 1;
    }
    moe_bench_opts o = {.shape = shape, .family = family, .ms = ms, .n_ms = n, .sweep = sweep,
                        .json = json};
    mt_status st = moe_bench_run(d, &o, stdout, &err);
    if (st != MT_OK)
        fprintf(stderr, "bench_moe: %s\n", err.msg);
    dev_close(d);
    return st == MT_OK ? 0 : 1;
}
