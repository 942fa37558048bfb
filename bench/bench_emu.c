/* bench_emu.c: what the emu backend costs. Prints barriers per second (a
 * block of 256 threads running __syncthreads() in a loop), warp shuffles
 * per second, matrix instructions per second (one wave64 running
 * mt_mma_bf16, 16x16x16, in a loop), and launches per second (an empty 64-thread kernel, and a
 * grid of many small blocks), each on one worker thread and on all of them;
 * ratios are against the one-worker figure and against the cost of simply
 * starting the same threads measured in the same run. A benchmark, not a
 * test: nothing here is asserted.
 *
 * Usage: bench_emu [seconds per figure, default 0.5] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "device/device.h"

static const char src[] =
    "MT_KERNEL void barriers(int *out, int iters)\n"
    "{\n"
    "    __shared__ int s[256];\n"
    "    int acc = 0;\n"
    "    for (int i = 0; i < iters; i++) {\n"
    "        s[threadIdx.x] = i + (int)threadIdx.x;\n"
    "        __syncthreads();\n"
    "        acc += s[(threadIdx.x + 1) % blockDim.x];\n"
    "        __syncthreads();\n"
    "    }\n"
    "    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;\n"
    "}\n"
    "MT_KERNEL void shuffles(int *out, int iters)\n"
    "{\n"
    "    int v = (int)threadIdx.x;\n"
    "    for (int i = 0; i < iters; i++)\n"
    "        v += mt_shfl_xor_i32(v, 1 + i % 32);\n"
    "    out[blockIdx.x * blockDim.x + threadIdx.x] = v;\n"
    "}\n"
    "MT_KERNEL void mmas(int *out, int iters)\n"
    "{\n"
    "    __shared__ mt_bf16 t[16 * 16] __attribute__((aligned(16)));\n"
    "    for (int i = (int)threadIdx.x; i < 256; i += (int)blockDim.x)\n"
    "        t[i] = (mt_bf16)(i % 7);\n"
    "    __syncthreads();\n"
    "    mt_mma_a a = mt_mma_load_a(t, 16);\n"
    "    mt_mma_b b = mt_mma_load_bt(t, 16);\n"
    "    mt_mma_acc acc = mt_mma_acc_zero();\n"
    "    for (int i = 0; i < iters; i++)\n"
    "        acc = mt_mma_bf16(a, b, acc);\n"
    "    out[blockIdx.x * blockDim.x + threadIdx.x] = (int)acc.x[0];\n"
    "}\n"
    "MT_KERNEL void empty(int *out, int iters)\n"
    "{\n"
    "    if (iters < 0)\n"
    "        out[0] = 1;\n"
    "}\n";

typedef struct bench {
    dev_device *d;
    dev_kernel *barriers, *shuffles, *mmas, *empty;
    dev_module *m;
    int *out;
} bench;

static int open_bench(bench *b, int threads, mt_err *err)
{
    memset(b, 0, sizeof *b);
    dev_open_opts o = {.threads = threads};
    if (dev_open("emu", &o, &b->d, err) != MT_OK)
        return -1;
    dev_compile_req req = {.name = "bench_emu.hip", .source = src};
    dev_code *c = NULL;
    if (dev_compile(b->d, &req, &c, err) != MT_OK)
        return -1;
    mt_status st = dev_module_load(b->d, c, &b->m, err);
    dev_code_free(c);
    if (st != MT_OK ||
        dev_module_get_kernel(b->m, "barriers", "pi", &b->barriers, err) != MT_OK ||
        dev_module_get_kernel(b->m, "shuffles", "pi", &b->shuffles, err) != MT_OK ||
        dev_module_get_kernel(b->m, "mmas", "pi", &b->mmas, err) != MT_OK ||
        dev_module_get_kernel(b->m, "empty", "pi", &b->empty, err) != MT_OK)
        return -1;
    void *p = NULL;
    if (dev_alloc(b->d, 1024 * 256 * sizeof(int), &p, err) != MT_OK)
        return -1;
    b->out = p;
    return 0;
}

static void close_bench(bench *b)
{
    if (b->out)
        dev_free(b->d, b->out);
    dev_module_unload(b->m);
    dev_close(b->d);
}

/* Runs k until `seconds` have passed; returns launches per second. */
static double rate(bench *b, dev_kernel *k, unsigned blocks, unsigned threads, int iters,
                   double seconds, mt_err *err)
{
    void *args[] = {&b->out, &iters};
    long n = 0;
    uint64_t t0 = mt_now_ns(), t;
    do {
        if (dev_launch(b->d, k, (dev_dim3){blocks, 1, 1}, (dev_dim3){threads, 1, 1}, 0,
                       args, err) != MT_OK)
            return -1;
        n++;
        t = mt_now_ns();
    } while ((double)(t - t0) < seconds * 1e9);
    return (double)n / ((double)(t - t0) * 1e-9);
}

static int measure(int threads, double secs, double base[4])
{
    bench b;
    mt_err err = MT_ERR_INIT;
    if (open_bench(&b, threads, &err) != 0) {
        fprintf(stderr, "bench_emu: %s\n", err.msg);
        close_bench(&b);
        return -1;
    }
    const int iters = 200;
    unsigned blocks = (unsigned)threads; /* one block per worker */
    double r_start = rate(&b, b.empty, blocks, 256, 0, secs, &err);
    double r_bar = rate(&b, b.barriers, blocks, 256, iters, secs, &err);
    double r_shfl = rate(&b, b.shuffles, blocks, 256, iters, secs, &err);
    double r_start64 = rate(&b, b.empty, blocks, 64, 0, secs, &err);
    double r_mma = rate(&b, b.mmas, blocks, 64, iters, secs, &err);
    double r_launch = rate(&b, b.empty, 1, 64, 0, secs, &err);
    double r_grid = rate(&b, b.empty, 1024, 64, 0, secs, &err);
    if (r_start < 0 || r_bar < 0 || r_shfl < 0 || r_start64 < 0 || r_mma < 0 || r_launch < 0 ||
        r_grid < 0) {
        fprintf(stderr, "bench_emu: %s\n", err.msg);
        close_bench(&b);
        return -1;
    }
    /* Subtract the cost of starting the threads to get per-barrier time. */
    double t_start = 1.0 / r_start, t_bar = 1.0 / r_bar, t_shfl = 1.0 / r_shfl;
    double barriers = 2.0 * iters * blocks;
    double bar_per_s = barriers / (t_bar - t_start > 0 ? t_bar - t_start : t_bar);
    double shfl_per_s = (double)iters * blocks * 256 / (t_shfl - t_start > 0 ? t_shfl - t_start : t_shfl);
    double thread_starts = 256.0 * blocks * r_start;
    double t_mma = 1.0 / r_mma, t_start64 = 1.0 / r_start64;
    double mma_per_s = (double)iters * blocks /
                       (t_mma - t_start64 > 0 ? t_mma - t_start64 : t_mma);
    printf("workers %2d | block barriers/s (256 threads) %10.0f  (%.2f us each) | "
           "lane shuffles/s %11.0f | thread starts/s %11.0f\n",
           threads, bar_per_s, 1e6 / bar_per_s * blocks, shfl_per_s, thread_starts);
    printf("           | wave64 MMAs/s (bf16 16x16x16) %10.0f  (%.2f us each, %.1f ns per "
           "multiply-add)\n",
           mma_per_s, 1e6 / mma_per_s * blocks, 1e9 / mma_per_s * blocks / 4096);
    printf("           | launches/s: 1 block x 64 threads %8.0f | 1024 blocks x 64 threads "
           "%6.1f (%.0f blocks/s)\n",
           r_launch, r_grid, r_grid * 1024);
    if (base[0] > 0)
        printf("           | vs 1 worker: barriers x%.2f, shuffles x%.2f, 1024-block "
               "launches x%.2f\n",
               bar_per_s / base[0], shfl_per_s / base[1], r_grid / base[2]);
    else {
        base[0] = bar_per_s;
        base[1] = shfl_per_s;
        base[2] = r_grid;
    }
    /* One barrier of 256 threads against starting those 256 threads. */
    printf("           | one barrier costs %.2f thread starts\n",
           thread_starts / bar_per_s);
    close_bench(&b);
    return 0;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 0.5;
    if (secs <= 0)
        secs = 0.5;
    long cores = 0;
    {
        dev_device *d = NULL;
        mt_err err = MT_ERR_INIT;
        if (dev_open("emu", NULL, &d, &err) != MT_OK) {
            fprintf(stderr, "bench_emu: %s\n", err.msg);
            return 1;
        }
        const dev_props *p = dev_get_props(d);
        cores = p->compute_units;
        printf("bench_emu: %s, %s, %ld worker threads by default\n", p->name,
               p->runtime_version, cores);
        dev_close(d);
    }
    double base[4] = {0};
    if (measure(1, secs, base) != 0)
        return 1;
    if (cores > 1 && measure((int)cores, secs, base) != 0)
        return 1;
    return 0;
}
