/* runner.h: one problem of a family on a device, and what is done with it:
 * run a config through its executor (exec.h), verify it against the C
 * reference, time it. Shared by `moetune check`, the tuner's measurement
 * worker, the tests and the benchmarks.
 *
 * A problem owns host inputs (seeded), host reference outputs (computed once
 * by the family's reference) and device buffers. Before every run, OUT
 * buffers are poisoned with NaN bytes (0xFF) and INOUT buffers are restored
 * from the host copy, so a kernel that skips an element fails verification.
 * Not thread-safe: one problem per thread. */
#ifndef MT_KERN_RUNNER_H
#define MT_KERN_RUNNER_H

#include "exec.h"
#include "family.h"

typedef struct kern_problem kern_problem;

/* Builds the problem: buffers, fill(seed), reference, upload. The shape is
 * copied. Fails with MT_E_INVALID if the family rejects the shape. */
mt_status kern_problem_create(dev_device *d, const kern_family *f,
                              const kern_shape *s, int64_t m, uint64_t seed,
                              kern_problem **out, mt_err *err);
void kern_problem_destroy(kern_problem *p);

/* Flags for kern_problem_create_ex. */
enum {
    /* Skip the reference: the problem can run and be timed, not verified
     * (kern_problem_verify fails with MT_E_INVALID). For timing at an M
     * whose reference would take minutes. */
    KERN_PROBLEM_NO_REFERENCE = 1u,
};
mt_status kern_problem_create_ex(dev_device *d, const kern_family *f,
                                 const kern_shape *s, int64_t m, uint64_t seed,
                                 unsigned flags, kern_problem **out, mt_err *err);

/* The M at which to verify a candidate timed at m: m itself when the
 * reference's work (the family's flop count) at m is at most max_flops,
 * else the largest smaller M that fits (at least 1). Every tile path of a
 * kernel is exercised well below the large M buckets, while a plain C
 * reference at M = 4096 of the glm5.2 experts would take hours. */
int64_t kern_verify_m(const kern_family *f, const kern_shape *s, int64_t m,
                      double max_flops);
#define KERN_VERIFY_MAX_FLOPS 2e9

const kern_family *kern_problem_family(const kern_problem *p);
const kern_shape *kern_problem_shape(const kern_problem *p);
int64_t kern_problem_m(const kern_problem *p);
int kern_problem_n_bufs(const kern_problem *p);
const kern_buf_desc *kern_problem_buf(const kern_problem *p, int i);
/* Host buffers: inputs as filled, outputs as the reference computed them. */
void *const *kern_problem_host(const kern_problem *p);
/* Device buffers, in the family's order (owned by the problem). */
void *const *kern_problem_dev(const kern_problem *p);

/* Poisons outputs, restores in-outs and runs the executor (opened for the
 * problem's family and tuning dims) once; synchronizes. */
mt_status kern_problem_run(kern_problem *p, kern_exec *e, mt_err *err);

/* Downloads outputs and compares them with the reference. MT_OK or
 * MT_E_WRONG_RESULT with the first bad buffer, row and element in err. */
mt_status kern_problem_verify(kern_problem *p, mt_err *err);

/* Downloads output buffer b into host memory dst (bytes as described). */
mt_status kern_problem_download(kern_problem *p, int b, void *dst, mt_err *err);

typedef struct kern_time_opts {
    int warmup;              /* runs before timing (default 2) */
    int min_reps, max_reps;  /* default 5 / 200 */
    double max_ms;           /* stop after this much wall time, flushes and
                              * restores included (default 2000) */
    double target_spread;    /* stop when (p90-p10)/median < this (default 0.05) */
    double abandon_ms;       /* stop early once the median exceeds this; 0 = never */
    bool flush_cache;        /* rotate inputs / touch a buffer > LLC between runs */
    int batch;               /* launches per timed sample, back to back between
                              * one pair of events (<= 1: one); the sample is
                              * their mean, so launch overhead and timer
                              * granularity do not decide for microsecond
                              * kernels. The flush and the in-out restore come
                              * before the batch: only its first launch starts
                              * cold. */
} kern_time_opts;

typedef struct kern_timing {
    double min_ms, median_ms, p10_ms, p90_ms;
    int reps;
    bool abandoned;          /* stopped early as clearly slower than abandon_ms */
} kern_timing;

void kern_time_opts_default(kern_time_opts *o);

/* Times the executor on the problem with device events (host clock on
 * cpu/emu). */
mt_status kern_problem_time(kern_problem *p, kern_exec *e, const kern_time_opts *o,
                            kern_timing *t, mt_err *err);

/* Device-memory bandwidth in GB/s: the median of 5 timed device-to-device
 * copies of `bytes` (each copy reads and writes them, counted as 2x bytes),
 * with device events. For GPU backends, where host-side probes measure the
 * wrong memory. */
mt_status kern_device_bandwidth(dev_device *d, size_t bytes, double *gbps, mt_err *err);

/* One-call check for tests and `moetune check`: parse shape_text, build a
 * problem with seed, compile cfg (the default config when NULL), run,
 * verify. MT_OK when the output matches the reference. */
mt_status kern_check_one(dev_device *d, const kern_family *f, const char *shape_text,
                         int64_t m, const kern_config *cfg, uint64_t seed,
                         mt_err *err);

#endif
