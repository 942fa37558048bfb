/* test_serve_hold.c: the live tuner's compiler hold cycle on a simulated
 * millisecond clock: busy for a long stretch the compilers run share of
 * the time (every share sampled), each busy stretch starts held for
 * (1 - share) of the cycle, no free stretch is longer than share of the
 * cycle while busy, and an idle server never holds them. */
#include <criterion/criterion.h>
#include <math.h>

#include "common/rng.h"
#include "serve/serve_hold.h"

static const double shares[] = {0.01, 0.05, 0.10, 0.25, 0.5, 0.9, 1.0};

Test(serve_hold, busy_runs_the_compilers_share_of_the_time)
{
    for (size_t i = 0; i < sizeof shares / sizeof shares[0]; i++) {
        double share = shares[i], t0 = 1000.0;
        serve_hold h;
        serve_hold_init(&h, share, t0);
        int64_t n = 60000, free_n = 0, run = 0, longest_free = 0;
        for (int64_t ms = 0; ms < n; ms++) {
            bool held = serve_hold_held(&h, true, t0 + (double)ms);
            if (ms < (int64_t)(SERVE_HOLD_CYCLE_MS * (1 - share)))
                cr_assert(held, "share %g: free at %lld ms into a busy stretch", share,
                          (long long)ms);
            free_n += !held;
            run = held ? 0 : run + 1;
            longest_free = run > longest_free ? run : longest_free;
        }
        double got = (double)free_n / (double)n;
        cr_assert(fabs(got - share) < 0.002, "share %g: the compilers ran %.4f of the time",
                  share, got);
        if (share < 1)
            cr_assert(longest_free <= (int64_t)ceil(SERVE_HOLD_CYCLE_MS * share),
                      "share %g: free for %lld ms at a stretch", share,
                      (long long)longest_free);
    }
}

Test(serve_hold, idle_never_holds_and_busy_restarts_the_cycle)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    for (size_t i = 0; i < sizeof shares / sizeof shares[0]; i++) {
        serve_hold h;
        serve_hold_init(&h, shares[i], 0);
        double now = 0;
        for (int k = 0; k < 200; k++) {
            /* Idle for a random while, then busy: held at once (unless the
             * share is everything), idle again: free at once. */
            now += 1 + (double)mt_rng_below(&r, 5000);
            cr_assert(!serve_hold_held(&h, false, now), "seed %llu: idle but held",
                      (unsigned long long)seed);
            now += 1;
            bool held = serve_hold_held(&h, true, now);
            cr_assert_eq(held, shares[i] < 1, "seed %llu share %g: busy after idle, held %d",
                         (unsigned long long)seed, shares[i], held);
        }
    }
}

Test(serve_hold, out_of_range_shares_are_clamped)
{
    serve_hold h;
    serve_hold_init(&h, 7, 0);
    cr_assert_eq(h.hold_ms, 0);
    cr_assert(!serve_hold_held(&h, true, 1));
    serve_hold_init(&h, NAN, 0);
    cr_assert(h.free_ms > 0 && h.hold_ms < SERVE_HOLD_CYCLE_MS);
    serve_hold_init(&h, -1, 0);
    cr_assert(h.free_ms > 0 && h.hold_ms < SERVE_HOLD_CYCLE_MS);
}
