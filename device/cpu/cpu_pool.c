/* cpu_pool.c: persistent worker threads for cpu-backend launches (see
 * cpu_pool.h).
 *
 * A job is one 64-bit word: a 24-bit job tag and the number of items left.
 * Threads claim items from the top with compare-and-swap, taking
 * remaining / (2 * threads) at a time (guided scheduling: big chunks first,
 * small ones at the end for balance). Because the remaining count lives in
 * the word, a thread only reads the job's other fields after a successful
 * claim, when the job cannot finish (and be replaced) under it. A job is
 * complete when its `done` count reaches its item count, so workers that
 * never woke up for it cost nothing: the caller, who runs items too, does
 * not wait for them. Waiting threads spin briefly, then yield (the machine
 * may have fewer cores than threads), then sleep on a futex. */
#define _GNU_SOURCE
#include "cpu_pool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TAG_SHIFT 40
#define LEFT_MASK ((UINT64_C(1) << TAG_SHIFT) - 1)
#define TAG_MASK 0xffffffu
#define MAX_PIECE (UINT64_C(1) << 39) /* items per job word; bigger runs split */

/* Waiting: pause iterations, then sched_yield calls, then futex sleep. */
#define SPIN_PAUSES 2000
#define SPIN_YIELDS 50

struct cpu_pool {
    int n;
    pthread_t *threads;
    int started;

    /* The current job; written by the caller before the job word. */
    cpu_pool_fn fn;
    void *job;
    uint64_t count, offset;
    uint32_t job_gen;

    alignas(64) _Atomic uint64_t work;     /* tag << 40 | items left */
    alignas(64) _Atomic uint64_t done;     /* items finished */
    alignas(64) _Atomic uint32_t gen;      /* job counter; workers sleep on it */
    _Atomic int sleepers;
    _Atomic int stop;
    alignas(64) _Atomic uint32_t finished; /* gen of the last completed job */
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

/* Claims and runs items of job g until none are left. */
static void run_job(cpu_pool *p, uint32_t g)
{
    const uint64_t tag = g & TAG_MASK;
    const uint64_t div = 2 * (uint64_t)p->n;
    uint64_t w = atomic_load_explicit(&p->work, memory_order_acquire);
    for (;;) {
        if ((w >> TAG_SHIFT) != tag)
            return; /* a later job: ours is complete */
        uint64_t left = w & LEFT_MASK;
        if (left == 0)
            return;
        uint64_t take = left / div ? left / div : 1;
        if (!atomic_compare_exchange_weak_explicit(&p->work, &w, w - take,
                                                   memory_order_acquire,
                                                   memory_order_acquire))
            continue;
        /* Claimed [left - take, left): the job cannot complete before
         * these run, so its fields are stable. */
        const uint64_t count = p->count, base = p->offset;
        const uint32_t jg = p->job_gen; /* g, unless the 24-bit tag wrapped */
        const cpu_pool_fn fn = p->fn;
        void *const job = p->job;
        for (uint64_t i = left - take; i < left; i++)
            fn(job, base + i);
        uint64_t d = atomic_fetch_add(&p->done, take) + take;
        if (d == count) {
            atomic_store(&p->finished, jg);
            if (atomic_load(&p->caller_waiting))
                futex_wake(&p->finished, 1);
            return;
        }
        w = atomic_load_explicit(&p->work, memory_order_acquire);
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
            if (spins < SPIN_PAUSES) {
                cpu_relax();
            } else if (spins < SPIN_PAUSES + SPIN_YIELDS) {
                sched_yield();
            } else {
                atomic_fetch_add(&p->sleepers, 1);
                futex_wait(&p->gen, seen);
                atomic_fetch_sub(&p->sleepers, 1);
            }
            spins++;
        }
        seen = g;
        if (atomic_load(&p->stop))
            return NULL;
        run_job(p, g);
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

static void run_piece(cpu_pool *p, cpu_pool_fn fn, void *job, uint64_t offset,
                      uint64_t count)
{
    p->fn = fn;
    p->job = job;
    p->count = count;
    p->offset = offset;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    p->job_gen = g;
    atomic_store_explicit(&p->work, ((uint64_t)(g & TAG_MASK) << TAG_SHIFT) | count,
                          memory_order_release);
    atomic_store(&p->gen, g); /* seq_cst: ordered before the sleepers check */
    if (atomic_load(&p->sleepers) > 0)
        futex_wake(&p->gen, INT_MAX);

    run_job(p, g);

    int spins = 0;
    while (atomic_load(&p->finished) != g) {
        if (spins < SPIN_PAUSES) {
            cpu_relax();
        } else if (spins < SPIN_PAUSES + SPIN_YIELDS) {
            sched_yield();
        } else {
            atomic_store(&p->caller_waiting, 1);
            uint32_t f = atomic_load(&p->finished);
            if (f != g)
                futex_wait(&p->finished, f);
            atomic_store(&p->caller_waiting, 0);
        }
        spins++;
    }
}

void cpu_pool_run(cpu_pool *p, cpu_pool_fn fn, void *job, uint64_t count)
{
    if (p->started == 0 || count == 1) {
        for (uint64_t i = 0; i < count; i++)
            fn(job, i);
        return;
    }
    for (uint64_t off = 0; off < count; off += MAX_PIECE)
        run_piece(p, fn, job, off, count - off < MAX_PIECE ? count - off : MAX_PIECE);
}
