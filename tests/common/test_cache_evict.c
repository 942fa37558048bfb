/* test_cache_evict.c: mt_cache_evict leaves contents intact over unaligned
 * starts and odd lengths, refuses NULL and empty ranges, and is there on
 * every x86-64 machine (the timing loop relies on it for cpu and emu). Its
 * effect, cold lines, has no architectural observable but time, and tests
 * assert no timings. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cache_evict.h"
#include "common/rng.h"

Test(cache_evict, is_supported_on_x86_64)
{
#if defined(__x86_64__)
    cr_assert(mt_cache_evict_supported());
#else
    cr_assert(!mt_cache_evict_supported());
    cr_assert(!mt_cache_evict("x", 1));
#endif
}

Test(cache_evict, refuses_null_and_empty_ranges)
{
    char b[8] = {0};
    cr_assert(!mt_cache_evict(NULL, 64));
    cr_assert(!mt_cache_evict(b, 0));
}

Test(cache_evict, keeps_every_byte_at_odd_offsets_and_lengths)
{
    if (!mt_cache_evict_supported())
        cr_skip_test("no cache eviction on this architecture");
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    enum { CAP = 1 << 16 };
    uint8_t *buf = malloc(CAP), *copy = malloc(CAP);
    cr_assert(buf && copy);
    for (int trial = 0; trial < 64; trial++) {
        for (size_t i = 0; i < CAP; i++)
            buf[i] = (uint8_t)mt_rng_u64(&r);
        memcpy(copy, buf, CAP);
        size_t off = (size_t)mt_rng_below(&r, 200);
        size_t len = 1 + (size_t)mt_rng_below(&r, CAP - 200 - 1);
        cr_assert(mt_cache_evict(buf + off, len));
        cr_assert(!memcmp(buf, copy, CAP), "contents changed: off %zu len %zu (seed %llu)", off,
                  len, (unsigned long long)seed);
        /* Written right after, read back: the lines come back coherent. */
        buf[off] ^= 0xa5;
        cr_assert(mt_cache_evict(buf + off, 1));
        cr_assert_eq(buf[off], (uint8_t)(copy[off] ^ 0xa5), "seed %llu",
                     (unsigned long long)seed);
    }
    free(buf);
    free(copy);
}
