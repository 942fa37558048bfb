/* cpu_pool.h: the cpu backend's persistent thread pool (private to device/).
 *
 * A pool of n threads (the caller's thread counts as one of them, so n-1 are
 * created) runs one job at a time: `count` work items, handed out from an
 * atomic counter in chunks, each passed to run(job, item). Workers spin
 * briefly after a job and then sleep on a futex, so back-to-back launches
 * cost no thread creation and usually no system call.
 *
 * Ownership: cpu_pool_create returns a pool freed by cpu_pool_destroy (which
 * joins the threads). Thread safety: one cpu_pool_run at a time per pool;
 * run() is called concurrently from every pool thread. */
#ifndef MT_CPU_POOL_H
#define MT_CPU_POOL_H

#include <stdint.h>

#include "common/status.h"

typedef struct cpu_pool cpu_pool;

/* Called once per item, from any pool thread (including the caller's). */
typedef void (*cpu_pool_fn)(void *job, uint64_t item);

/* Starts n-1 worker threads (n >= 1). */
mt_status cpu_pool_create(int n, cpu_pool **out, mt_err *err);
void cpu_pool_destroy(cpu_pool *p); /* NULL is a no-op */
int cpu_pool_size(const cpu_pool *p);

/* Runs fn(job, i) for every i in [0, count) and returns when all have run. */
void cpu_pool_run(cpu_pool *p, cpu_pool_fn fn, void *job, uint64_t count);

#endif
