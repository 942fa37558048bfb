/* bench_cpu_launch.c: launch overhead of the cpu backend. An empty kernel
 * is launched over 1 and 1024 work items on the default pool and on one
 * thread; each is printed in microseconds per launch, next to two limits
 * measured in the same run: a plain indirect call of the same empty
 * function (the floor), and creating and joining one thread (what a pool
 * saves per launch). Usage: bench_cpu_launch [launches]. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "device/device.h"

static const char empty_src[] = "MT_CPU_KERNEL void empty(float *x, int n) { (void)x; (void)n; }\n";

static void *nothing(void *arg) { return arg; }

static double thread_spawn_us(int reps)
{
    uint64_t t0 = mt_now_ns();
    for (int i = 0; i < reps; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, nothing, NULL) != 0)
            return -1;
        pthread_join(t, NULL);
    }
    return (double)(mt_now_ns() - t0) * 1e-3 / reps;
}

typedef void (*empty_fn)(float *, int);
static void plain_empty(float *x, int n) { (void)x; (void)n; }

static double direct_call_us(int reps, int items)
{
    volatile empty_fn f = plain_empty;
    uint64_t t0 = mt_now_ns();
    for (int i = 0; i < reps; i++)
        for (int j = 0; j < items; j++)
            f(NULL, j);
    return (double)(mt_now_ns() - t0) * 1e-3 / reps;
}

/* Median-free but warm: the first tenth of the launches is discarded. */
static int launch_us(const char *spec, unsigned items, int reps, double *us, int *threads)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    if (dev_open(spec, NULL, &d, &err) != MT_OK) {
        fprintf(stderr, "open %s: %s\n", spec, err.msg);
        return 1;
    }
    *threads = dev_get_props(d)->compute_units;
    dev_compile_req req = {.name = "empty.c", .source = empty_src};
    dev_code *code = NULL;
    dev_module *m = NULL;
    dev_kernel *k = NULL;
    int rc = 1;
    if (dev_compile(d, &req, &code, &err) != MT_OK ||
        dev_module_load(d, code, &m, &err) != MT_OK ||
        dev_module_get_kernel(m, "empty", "pi", &k, &err) != MT_OK) {
        fprintf(stderr, "%s: %s\n", spec, err.msg);
        goto out;
    }
    float *x = NULL;
    int n = 0;
    void *args[] = {&x, &n};
    dev_dim3 grid = {items, 1, 1}, block = {1, 1, 1};
    for (int i = 0; i < reps / 10 + 1; i++)
        if (dev_launch(d, k, grid, block, 0, args, &err) != MT_OK) {
            fprintf(stderr, "%s: %s\n", spec, err.msg);
            goto out;
        }
    uint64_t t0 = mt_now_ns();
    for (int i = 0; i < reps; i++)
        dev_launch(d, k, grid, block, 0, args, NULL);
    *us = (double)(mt_now_ns() - t0) * 1e-3 / reps;
    rc = 0;
out:
    dev_module_unload(m);
    dev_code_free(code);
    dev_close(d);
    return rc;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 20000;
    if (reps < 10)
        reps = 10;
    double spawn = thread_spawn_us(reps / 20 + 10);
    printf("cpu launch overhead (%d launches each, empty kernel)\n", reps);
    printf("limits: thread create+join %.2f us; direct calls: 1 item %.4f us, "
           "1024 items %.3f us\n\n", spawn, direct_call_us(reps, 1),
           direct_call_us(reps / 10 + 1, 1024));
    printf("%-8s %7s %6s %12s %16s %18s\n", "device", "threads", "items", "us/launch",
           "x direct call", "x thread spawn");
    const char *specs[] = {"cpu:1", "cpu"};
    const unsigned items[] = {1, 1024};
    int failed = 0;
    for (size_t s = 0; s < 2; s++)
        for (size_t i = 0; i < 2; i++) {
            double us = 0;
            int threads = 0;
            if (launch_us(specs[s], items[i], reps, &us, &threads)) {
                failed = 1;
                continue;
            }
            double direct = direct_call_us(items[i] == 1 ? reps : reps / 10 + 1,
                                           (int)items[i]);
            printf("%-8s %7d %6u %12.3f %16.1f %18.3f\n", specs[s], threads, items[i], us,
                   direct > 0 ? us / direct : 0.0, spawn > 0 ? us / spawn : 0.0);
        }
    return failed;
}
