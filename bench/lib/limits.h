/* limits.h: machine limits the benchmarks divide by, measured in the same
 * run on the same device.
 *
 * On the cpu backend the probes are kernels compiled for this machine by the
 * backend's own compiler (-O3 -march=native, so they use the widest vector
 * loads the CPU has) and run on the backend's thread pool, like the kernels
 * they are compared with:
 *  - read bandwidth: a streaming sum over a buffer of at least 1 GiB and 16x
 *    the last-level cache, in 512 work items, in ten read patterns (one,
 *    two or four streams per item, with and without software prefetch of
 *    every line, with and without a touch of each 4 KiB page 32 KiB
 *    ahead): the limit is the fastest, since a probe that under-reads
 *    flatters kernels;
 *  - compute peaks: fp32 FMA, bf16 dot (vdpbf16ps) and u8 x s8 dot (VNNI
 *    vpdpbusd, else vpmaddubsw + vpmaddwd), each as 64 short work items of
 *    12 independent vector chains; and where the cpu device's kernels use
 *    AMX, tdpbf16ps on four independent tiles. A probe that loses a core to another
 *    process reads low, and a kernel set against it looks better than it
 *    is, so callers repeat the probes between their kernels and keep the
 *    best of all of them.
 * On GPU backends (hip, cuda) bandwidth comes from kernels of the project's
 * own, compiled by the backend like the families' (bench_limits_gpu_source):
 * a read of a 1 GiB buffer with four 16-byte loads in flight per thread,
 * and a copy of its first half to its second (read + written bytes),
 * timed with device events; the limit is the faster of the two. Where they
 * cannot be built, timed device-to-device copies (kern_device_bandwidth)
 * instead, and bench_limits_pattern_name says why. No compute probes there
 * (0): a caller measures the matrix peak its own way.
 *
 * Figures carry their spread (p10, median, p90 over the repetitions), so a
 * ratio against a noisy limit can be read as such.
 *
 * Ownership: open/close; close(NULL) is a no-op. The probe buffer (1 GiB or
 * more) is allocated on the device at open. Not thread-safe. */
#ifndef MT_BENCH_LIMITS_H
#define MT_BENCH_LIMITS_H

#include "common/status.h"
#include "device/device.h"

typedef struct bench_spread {
    double p10, median, p90;
    int reps;
    double max; /* the largest sample */
} bench_spread;

typedef struct bench_limits bench_limits;

mt_status bench_limits_open(dev_device *d, bench_limits **out, mt_err *err);
void bench_limits_close(bench_limits *l);

/* Read bandwidth in GB/s over reps (>= 3) timed passes after one warm-up. */
mt_status bench_limits_bandwidth(bench_limits *l, int reps, bench_spread *out, mt_err *err);
/* One bandwidth sample, cheap enough to interleave with the kernels being
 * timed (a limit measured minutes apart from a kernel is not its limit on
 * a shared machine): 1 GiB from a slice of the probe buffer that rotates
 * (on buffers above 1 GiB), in each of the two read patterns that were
 * fastest at the last bench_limits_bandwidth, the faster of the two
 * (GPU backends: one pass of the probe kernel that was faster, or a 1 GiB
 * device copy without them). Shorter
 * reads pay the launch and the prefetchers' ramp-up and under-read the
 * limit (64 MiB read about 10% below 1 GiB here). */
mt_status bench_limits_sample(bench_limits *l, double *gbps, mt_err *err);
/* Compute peaks in GFLOP/s (bf16 and fp32: 2 per multiply-add) and GOP/s
 * (i8: 2 per u8 x s8 multiply-add); 0 where the CPU lacks the instruction
 * or the backend is not cpu. */
typedef struct bench_peaks {
    double fma, bf16, i8;
    double amx_bf16; /* AMX tdpbf16ps, where the cpu device's kernels use AMX */
} bench_peaks;

/* Runs each peak probe launches times (a launch takes a few ms) and gives
 * the best of every probe since open. */
mt_status bench_limits_peaks(bench_limits *l, int launches, bench_peaks *out, mt_err *err);
/* Streams the probe buffer once, so nothing a kernel read stays in cache,
 * and leaves the pool's threads awake (cpu); on GPU backends one read
 * kernel pass over 1 GiB (asynchronous, on the device's stream). */
mt_status bench_limits_flush(bench_limits *l, mt_err *err);
/* One short launch (512 items of 4 KiB, cpu; elsewhere nothing), so the
 * pool's threads are awake when the next timed call starts, as they are
 * between the kernels of a model step. */
mt_status bench_limits_wake(bench_limits *l, mt_err *err);

/* A kernel's bytes as a plain read (cpu; elsewhere *ms = 0): piece i is
 * len[i] bytes of device memory at at[i] (any alignment), rounded down to
 * a multiple of bench_limits_piece_step, read as floats by one work item
 * in the read pattern the last bench_limits_bandwidth found fastest (one
 * stream without prefetch before any); *ms gets the launch's wall time
 * and *checksum (if not NULL) the sum of every float read. Pieces of about
 * the kernel's work items (a few hundred KiB) pay the same ramp-ups at
 * their starts; the caller picks addresses that are not in cache. At most
 * BENCH_MAX_PIECES. */
enum { BENCH_MAX_PIECES = 8192 };
mt_status bench_limits_read_pieces(bench_limits *l, const void *const *at, const int64_t *len,
                                   int n, double *ms, double *checksum, mt_err *err);
/* The unit bench_limits_read_pieces reads in: 512 bytes per stream. */
int64_t bench_limits_piece_step(const bench_limits *l);
/* The read patterns, and a way to make pattern i (0 <= i < count) the one
 * bench_limits_read_pieces uses until the next bench_limits_bandwidth
 * (tests read in every pattern); false for i out of range. */
int bench_limits_pattern_count(void);
bool bench_limits_use_pattern(bench_limits *l, int i);
/* The pattern bench_limits_read_pieces uses, in words ("1 stream, line
 * prefetch 4096 B ahead, page touch 32768 B ahead") into out[0:cap]. */
void bench_limits_pattern_name(const bench_limits *l, char *out, size_t cap);

/* GPU backends with the probe kernels: the last bench_limits_bandwidth's
 * medians of the read kernel and of the copy kernel in GB/s; both 0
 * elsewhere. */
void bench_limits_gpu_rates(const bench_limits *l, double *read_gbps, double *copy_gbps);
/* The GPU probe's kernel text (HIP in the device prelude's dialect), for
 * tests: bench_read(const void *src, long n16, unsigned *out), signature
 * "plp", reads n16 16-byte words and writes out[0] only if they fold to
 * 0x9e3779b9; bench_copy(const void *src, void *dst, long n16), "ppl",
 * copies n16 16-byte words. Launched with 256 threads per block, any grid. */
const char *bench_limits_gpu_source(void);

/* p10, median, p90 and max of v[0:n] (sorted in place). */
void bench_spread_of(double *v, int n, bench_spread *out);

/* Each timed call against the limit measured around it: ratio i is
 * (bytes[i] / ms[i]) / limit[i], limit[i] in GB/s (samples at or below 0 are
 * skipped). On a machine whose bandwidth drifts, a kernel's median against
 * the best sample of the whole run reads low even for a kernel at the
 * limit (a plain read of the same bytes too); the paired ratio compares
 * each call with the machine of its moment. out gets the spread (reps 0
 * when no call has a limit). */
void bench_paired_fraction(const double *bytes, const double *ms, const double *limit, int n,
                           bench_spread *out);

#endif
