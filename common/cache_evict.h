/* cache_evict.h: evict a host memory range from every level of the CPU's
 * caches, so the next read of it comes from DRAM.
 *
 * Used by the timing loop to start each timed run of a cpu or emu problem
 * cold at a cost proportional to the problem's own bytes. The alternative,
 * writing a buffer twice the last-level cache, costs 2 x LLC per run: on a
 * VM that reports the socket's whole L3 (512 MiB on a Zen 5 EPYC) that was
 * 88% of a tuning run's time for microsecond kernels. */
#ifndef MT_CACHE_EVICT_H
#define MT_CACHE_EVICT_H

#include <stdbool.h>
#include <stddef.h>

/* True where mt_cache_evict works (x86-64: clflush/clflushopt). */
bool mt_cache_evict_supported(void);

/* Writes back and invalidates every cache line overlapping [p, p + bytes),
 * then fences, so the eviction is complete when it returns. The contents
 * are unchanged. A no-op (returning false) where unsupported, for NULL or
 * zero bytes. */
bool mt_cache_evict(const void *p, size_t bytes);

#endif
