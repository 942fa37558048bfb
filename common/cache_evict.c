/* cache_evict.c: cache line eviction of a host range (see cache_evict.h). */
#include "cache_evict.h"

#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

enum { LINE = 64 }; /* the x86-64 flush granule (CPUID leaf 1 EBX[15:8] x 8) */

static bool have_clflushopt(void)
{
    static int have = -1; /* racy first call is benign: same answer */
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("clflushopt") ? 1 : 0;
    }
    return have == 1;
}

__attribute__((target("clflushopt"))) static void evict_opt(uintptr_t a, uintptr_t end)
{
    for (; a < end; a += LINE)
        _mm_clflushopt((void *)a);
}

static void evict_plain(uintptr_t a, uintptr_t end)
{
    for (; a < end; a += LINE)
        _mm_clflush((const void *)a);
}

bool mt_cache_evict_supported(void) { return true; }

bool mt_cache_evict(const void *p, size_t bytes)
{
    if (!p || !bytes)
        return false;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(LINE - 1);
    uintptr_t end = (uintptr_t)p + bytes;
    /* clflushopt is weakly ordered (only against fences and other flushes
     * of the same line); the mfence orders every flush before the caller's
     * next load, which clflush's own ordering already gives. */
    if (have_clflushopt())
        evict_opt(a, end);
    else
        evict_plain(a, end);
    _mm_mfence();
    return true;
}

#else

bool mt_cache_evict_supported(void) { return false; }

bool mt_cache_evict(const void *p, size_t bytes)
{
    (void)p;
    (void)bytes;
    return false;
}

#endif
