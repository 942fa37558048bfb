/* bench_comm_gpu.c: the one-rank smoke check of the GPU communicator
 * backends (comm/comm.h "nccl", "rccl") on a real GPU, run by
 * bench/gpu-check.sh: all-reduce (f32 sum, bf16 max), all-gather,
 * reduce-scatter, all-to-all-v (one block between odd displacements, the
 * rest of the output poisoned and checked untouched), broadcast and
 * barrier on device buffers, each result copied back and compared with
 * what one rank must get. Then the time of an all-reduce of the buffer
 * against a device-to-device copy of the same bytes measured in the same
 * run (one rank moves no data between GPUs, so this times the library's
 * launch and local copy, not a network).
 *
 * usage: bench_comm_gpu [--backend nccl|rccl] [--device N] [--count ELEMENTS]
 * Exit: 0 all checks passed, 1 a check failed, 2 backend or device absent. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/clock.h"
#include "common/numeric.h"
#include "common/rng.h"
#include "device/device.h"

static int failures;

static void expect(bool ok, const char *what)
{
    printf("  %-52s %s\n", what, ok ? "ok" : "FAILED");
    failures += !ok;
}

static double median_ms(double *t, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[n / 2];
}

int main(int argc, char **argv)
{
    const char *backend = "nccl";
    int device = 0;
    size_t count = (1u << 22) + 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--backend"))
            backend = argv[i + 1];
        else if (!strcmp(argv[i], "--device"))
            device = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--count"))
            count = (size_t)strtoull(argv[i + 1], NULL, 10);
    }
    char spec[32];
    snprintf(spec, sizeof spec, "%s:%d", strcmp(backend, "rccl") ? "cuda" : "hip", device);
    mt_err err = MT_ERR_INIT;
    dev_device *d = NULL;
    if (dev_open(spec, NULL, &d, &err) != MT_OK || dev_get_props(d)->compile_only) {
        printf("bench_comm_gpu: %s: %s\n", spec, d ? "compile-only (no GPU)" : err.msg);
        dev_close(d);
        return 2;
    }
    mt_comm *c = NULL;
    mt_comm_gpu_opts o = {.device = device, .size = 1, .rank = 0};
    if (mt_comm_open_gpu(backend, &o, &c, &err) != MT_OK) {
        printf("bench_comm_gpu: %s\n", err.msg);
        dev_close(d);
        return 2;
    }
    printf("bench_comm_gpu: %s, one rank on %s (%s), %zu elements\n", backend, spec,
           dev_get_props(d)->name, count);

    size_t bytes = count * 4;
    float *hx = malloc(bytes), *hy = malloc(bytes);
    void *x = NULL, *y = NULL;
    if (!hx || !hy || dev_alloc(d, bytes, &x, &err) != MT_OK ||
        dev_alloc(d, bytes, &y, &err) != MT_OK) {
        printf("bench_comm_gpu: buffers: %s\n", err.msg);
        return 1;
    }
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    for (size_t i = 0; i < count; i++)
        hx[i] = (float)mt_rng_below(&r, 1u << 20) - (float)(1u << 19);
    printf("  seed %" PRIu64 "\n", seed);
#define TRY(call)                                                                              \
    do {                                                                                       \
        if ((call) != MT_OK) {                                                                 \
            printf("  %s: %s\n", #call, err.msg);                                              \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)
    TRY(dev_copy_to(d, x, hx, bytes, &err));

    /* all-reduce: one rank's sum and max are its own values */
    TRY(dev_memset(d, y, 0xff, bytes, &err));
    TRY(mt_comm_all_reduce(c, x, y, count, MT_COMM_F32, MT_COMM_SUM, &err));
    TRY(dev_copy_from(d, hy, y, bytes, &err));
    expect(!memcmp(hx, hy, bytes), "all_reduce f32 sum");
    TRY(dev_memset(d, y, 0, bytes, &err));
    TRY(mt_comm_all_reduce(c, x, y, 2 * count - 1, MT_COMM_BF16, MT_COMM_MAX, &err));
    TRY(dev_copy_from(d, hy, y, bytes, &err));
    expect(!memcmp(hx, hy, (2 * count - 1) * 2), "all_reduce bf16 max");
    TRY(dev_memset(d, y, 0, bytes, &err));
    TRY(mt_comm_all_gather(c, x, y, count - 5, MT_COMM_I32, &err));
    TRY(dev_copy_from(d, hy, y, bytes, &err));
    expect(!memcmp(hx, hy, (count - 5) * 4), "all_gather i32");
    TRY(dev_memset(d, y, 0, bytes, &err));
    TRY(mt_comm_reduce_scatter(c, x, y, count, MT_COMM_F32, MT_COMM_SUM, &err));
    TRY(dev_copy_from(d, hy, y, bytes, &err));
    expect(!memcmp(hx, hy, bytes), "reduce_scatter f32 sum");

    /* all-to-all-v: count/3 floats from element 17 to element 101 */
    size_t n = count / 3, sd = 17, rd = 101;
    TRY(dev_memset(d, y, 0xa5, bytes, &err));
    TRY(mt_comm_all_to_all_v(c, x, &n, &sd, y, &n, &rd, MT_COMM_F32, &err));
    TRY(dev_copy_from(d, hy, y, bytes, &err));
    bool block = !memcmp(hy + rd, hx + sd, n * 4), rest = true;
    const unsigned char *u = (const unsigned char *)hy;
    for (size_t i = 0; i < bytes && rest; i++)
        rest = (i >= rd * 4 && i < (rd + n) * 4) || u[i] == 0xa5;
    expect(block, "all_to_all_v block at its displacement");
    expect(rest, "all_to_all_v leaves the rest of recv untouched");

    /* broadcast in place from root 0, barrier */
    TRY(dev_copy_to(d, y, hx, bytes, &err));
    TRY(mt_comm_broadcast(c, y, count, MT_COMM_F32, 0, &err));
    TRY(dev_copy_from(d, hy, y, bytes, &err));
    expect(!memcmp(hx, hy, bytes), "broadcast f32 from root 0");
    expect(mt_comm_barrier(c, &err) == MT_OK, "barrier");

    /* time: all-reduce against a device copy of the same bytes */
    enum { REPS = 21 };
    double ta[REPS], tc[REPS];
    for (int i = 0; i < REPS; i++) {
        double t0 = mt_now_ms();
        TRY(mt_comm_all_reduce(c, x, y, count, MT_COMM_F32, MT_COMM_SUM, &err));
        double t1 = mt_now_ms();
        TRY(dev_copy_dev(d, y, x, bytes, &err));
        TRY(dev_synchronize(d, &err));
        double t2 = mt_now_ms();
        ta[i] = t1 - t0, tc[i] = t2 - t1;
    }
    double a = median_ms(ta, REPS), cp = median_ms(tc, REPS);
    printf("  all_reduce %zu B: %.3f ms median of %d; device copy of the same bytes %.3f ms; "
           "ratio copy/all_reduce %.2f\n", bytes, a, REPS, cp, cp / a);
    printf("bench_comm_gpu: %s\n", failures ? "FAILED" : "all checks passed");
    mt_comm_close(c);
    dev_free(d, x);
    dev_free(d, y);
    dev_close(d);
    free(hx);
    free(hy);
    return failures ? 1 : 0;
}
