/* cpu_pool.c: persistent worker threads for cpu-backend launches (see
 * cpu_pool.h). A job is published by bumping a generation word; workers
 * spin on it for a short while, then sleep in futex_wait. The caller runs
 * items too and waits for the workers' `pending` count to reach zero. */
#define _GNU_SOURCE
#include "cpu_pool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Spin iterations before sleeping: long enough to bridge the gap between
 * two launches of a timing loop, short enough not to burn a core when the
 * device sits idle. */
#define SPIN_ITERS 20000

struct cpu_pool {
    int n;
    pthread_t *threads;
    int started;

    /* The current job; written by the caller before gen is bumped. */
    cpu_pool_fn fn;
    void *job;
    uint64_t count, chunk;

    alignas(64) _Atomic uint64_t next;     /* next unclaimed item */
    alignas(64) _Atomic uint32_t gen;      /* bumped once per job */
    _Atomic int sleepers;                  /* workers asleep on gen */
    _Atomic int stop;
    alignas(64) _Atomic uint32_t pending;  /* workers not done with the job */
    _Atomic int caller_waiting;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int n)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void run_chunks(cpu_pool *p)
{
    const uint64_t count = p->count, chunk = p->chunk;
    for (;;) {
        uint64_t s = atomic_fetch_add_explicit(&p->next, chunk, memory_order_relaxed);
        if (s >= count)
            return;
        uint64_t e = s + chunk < count ? s + chunk : count;
        for (uint64_t i = s; i < e; i++)
            p->fn(p->job, i);
    }
}

static void *worker_main(void *arg)
{
    cpu_pool *p = arg;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (spins++ < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            atomic_fetch_add(&p->sleepers, 1);
            futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
        }
        seen = g;
        if (atomic_load(&p->stop))
            return NULL;
        run_chunks(p);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_waiting))
            futex_wake(&p->pending, 1);
    }
}

mt_status cpu_pool_create(int n, cpu_pool **out, mt_err *err)
{
    *out = NULL;
    if (n < 1)
        return mt_fail(err, MT_E_INVALID, "thread pool of %d threads", n);
    cpu_pool *p = aligned_alloc(64, (sizeof *p + 63) / 64 * 64);
    if (!p)
        return mt_fail(err, MT_E_NOMEM, "thread pool");
    memset(p, 0, sizeof *p);
    p->n = n;
    if (n > 1) {
        p->threads = calloc((size_t)n - 1, sizeof *p->threads);
        if (!p->threads) {
            free(p);
            return mt_fail(err, MT_E_NOMEM, "thread pool of %d threads", n);
        }
    }
    for (int i = 0; i < n - 1; i++) {
        int rc = pthread_create(&p->threads[i], NULL, worker_main, p);
        if (rc != 0) {
            cpu_pool_destroy(p);
            return mt_fail(err, MT_E_DEVICE, "starting pool thread %d of %d: %s",
                           i + 1, n - 1, strerror(rc));
        }
        p->started++;
    }
    *out = p;
    return MT_OK;
}

void cpu_pool_destroy(cpu_pool *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    futex_wake(&p->gen, INT_MAX);
    for (int i = 0; i < p->started; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p);
}

int cpu_pool_size(const cpu_pool *p) { return p->n; }

void cpu_pool_run(cpu_pool *p, cpu_pool_fn fn, void *job, uint64_t count)
{
    if (count == 0)
        return;
    if (p->started == 0 || count == 1) {
        for (uint64_t i = 0; i < count; i++)
            fn(job, i);
        return;
    }
    uint64_t per = count / ((uint64_t)(p->started + 1) * 8);
    p->fn = fn;
    p->job = job;
    p->count = count;
    p->chunk = per ? per : 1;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store(&p->pending, (uint32_t)p->started);
    atomic_fetch_add(&p->gen, 1); /* publishes the job (seq_cst) */
    if (atomic_load(&p->sleepers) > 0)
        futex_wake(&p->gen, INT_MAX);

    run_chunks(p);

    int spins = 0;
    uint32_t left;
    while ((left = atomic_load(&p->pending)) != 0) {
        if (spins++ < SPIN_ITERS) {
            cpu_relax();
            continue;
        }
        atomic_store(&p->caller_waiting, 1);
        left = atomic_load(&p->pending);
        if (left)
            futex_wait(&p->pending, left);
        atomic_store(&p->caller_waiting, 0);
    }
}
