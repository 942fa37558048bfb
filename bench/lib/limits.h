/* limits.h: machine limits the benchmarks divide by, measured in the same
 * run on the same device.
 *
 * On the cpu backend the probes are kernels compiled for this machine by the
 * backend's own compiler (-O3 -march=native, so they use the widest vector
 * loads the CPU has) and run on the backend's thread pool, like the kernels
 * they are compared with:
 *  - read bandwidth: a streaming sum over a buffer of at least 1 GiB and 16x
 *    the last-level cache, in 64 work items;
 *  - fp32 FMA peak: 12 independent vector FMA chains per thread.
 * On GPU backends bandwidth comes from timed device-to-device copies
 * (kern_device_bandwidth) and there is no FMA probe (0).
 *
 * Figures carry their spread (p10, median, p90 over the repetitions), so a
 * ratio against a noisy limit can be read as such.
 *
 * Ownership: open/close; close(NULL) is a no-op. The probe buffer (1 GiB or
 * more) is allocated on the device at open. Not thread-safe. */
#ifndef MT_BENCH_LIMITS_H
#define MT_BENCH_LIMITS_H

#include "../../common/status.h"
#include "../../device/device.h"

typedef struct bench_spread {
    double p10, median, p90;
    int reps;
} bench_spread;

typedef struct bench_limits bench_limits;

mt_status bench_limits_open(dev_device *d, bench_limits **out, mt_err *err);
void bench_limits_close(bench_limits *l);

/* Read bandwidth in GB/s over reps (>= 3) timed passes after one warm-up. */
mt_status bench_limits_bandwidth(bench_limits *l, int reps, bench_spread *out, mt_err *err);
/* fp32 FMA peak in GFLOP/s over 3 runs (cpu backend; 0 elsewhere). */
mt_status bench_limits_fma(bench_limits *l, bench_spread *out, mt_err *err);
/* Streams the probe buffer once, so nothing a kernel read stays in cache. */
mt_status bench_limits_flush(bench_limits *l, mt_err *err);

/* p10, median and p90 of v[0:n] (sorted in place). */
void bench_spread_of(double *v, int n, bench_spread *out);

#endif
