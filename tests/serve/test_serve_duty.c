/* test_serve_duty.c: the live tuner's measurement duty cycle on a
 * simulated millisecond clock: on a busy server measurements of random
 * lengths take share of the time (every share sampled) and never more,
 * short gaps between requests do not forgive the rest, an idle stretch of
 * SERVE_DUTY_IDLE_MS does, and an idle server measures back to back. */
#include <criterion/criterion.h>
#include <math.h>

#include "common/rng.h"
#include "serve/serve_duty.h"

static const double shares[] = {0.01, 0.05, 0.10, 0.25, 0.5, 0.9, 1.0};

/* Runs measurements of random lengths (1 to 400 ms) for n ms with the
 * server busy but for gap ms out of every period ms (gap 0: always busy),
 * each taking frac of its wall time of the device (frac < 0: all of it, the
 * cost not given); returns the device taken over the busy time. */
static double simulate_cost(double share, int64_t n, int period, int gap, double frac,
                            mt_rng *r)
{
    serve_duty d;
    serve_duty_init(&d, share);
    int64_t measuring_busy = 0, busy_ms = 0, end_at = -1, began = 0;
    bool worked = false; /* the server was busy during the measurement */
    for (int64_t ms = 0; ms < n; ms++) {
        bool busy = gap == 0 || ms % period >= gap;
        busy_ms += busy;
        if (end_at >= 0 && ms >= end_at) {
            serve_duty_end(&d, worked || busy, (double)ms,
                           frac < 0 ? -1 : frac * (double)(ms - began));
            end_at = -1;
        }
        worked = end_at >= 0 && (worked || busy);
        if (end_at < 0 && serve_duty_may_start(&d, busy, (double)ms)) {
            serve_duty_start(&d, (double)ms);
            began = ms;
            end_at = ms + 1 + (int64_t)mt_rng_below(r, 400);
        }
        measuring_busy += end_at >= 0 && busy;
    }
    return (double)measuring_busy * (frac < 0 ? 1 : frac) / (double)busy_ms;
}

static double simulate(double share, int64_t n, int period, int gap, mt_rng *r)
{
    return simulate_cost(share, n, period, gap, -1, r);
}

Test(serve_duty, a_busy_server_is_measured_on_for_share_of_the_time)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    for (size_t i = 0; i < sizeof shares / sizeof shares[0]; i++) {
        double share = shares[i];
        double got = simulate(share, 2000000, 1, 0, &r);
        /* a few hundred cycles of random lengths: within 5 % of the share,
         * and above it by at most the last measurement's 400 ms */
        cr_assert(got <= share + 400.0 / 2000000 && got >= share * 0.95,
                  "seed %llu share %g: measured %.4f of a busy server's time",
                  (unsigned long long)seed, share, got);
    }
}

/* A worker that takes frac of its wall time of the device (waiting for
 * the serving threads the rest) takes share of it all the same, its rests
 * shorter; one taking less than share measures back to back (it cannot
 * take more than frac). */
Test(serve_duty, a_worker_that_waits_for_the_cores_takes_share_of_the_device)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    static const double fracs[] = {1.0, 0.5, 0.2, 0.08, 0.03};
    for (size_t i = 0; i < sizeof shares / sizeof shares[0]; i++)
        for (size_t j = 0; j < sizeof fracs / sizeof fracs[0]; j++) {
            double share = shares[i], frac = fracs[j];
            double want = frac < share ? frac : share;
            double got = simulate_cost(share, 2000000, 1, 0, frac, &r);
            cr_assert(got <= share + 400.0 / 2000000 && got >= want * 0.95,
                      "seed %llu share %g, worker on %g of its wall time: took %.4f of a busy "
                      "server's device (want %.4f)", (unsigned long long)seed, share, frac, got,
                      want);
        }
}

Test(serve_duty, gaps_between_requests_do_not_forgive_the_rest)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    /* idle 20 ms of every 60: shorter than SERVE_DUTY_IDLE_MS */
    for (size_t i = 0; i < sizeof shares / sizeof shares[0]; i++) {
        double got = simulate(shares[i], 2000000, 60, 20, &r);
        cr_assert(got <= shares[i] * 1.10 + 400.0 / 1300000, "seed %llu share %g: measured %.4f of the "
                  "busy time with short gaps", (unsigned long long)seed, shares[i], got);
    }
}

Test(serve_duty, an_idle_stretch_forgives_the_rest)
{
    serve_duty d;
    serve_duty_init(&d, 0.10);
    cr_assert(serve_duty_may_start(&d, true, 0));
    serve_duty_start(&d, 0);
    serve_duty_end(&d, true, 100, -1); /* rest 900 ms */
    cr_assert_float_eq(d.measured_ms, 100, 1e-9);
    cr_assert(!serve_duty_may_start(&d, true, 101));
    cr_assert(!serve_duty_may_start(&d, false, 150)); /* idle since 150 */
    cr_assert(!serve_duty_may_start(&d, false, 150 + SERVE_DUTY_IDLE_MS - 1));
    cr_assert(serve_duty_may_start(&d, false, 150 + SERVE_DUTY_IDLE_MS));
    /* and busy again, the rest stays forgiven */
    cr_assert(serve_duty_may_start(&d, true, 151 + SERVE_DUTY_IDLE_MS));
    /* busy in between restarts the idle stretch */
    serve_duty_start(&d, 300);
    serve_duty_end(&d, true, 400, -1);
    cr_assert(!serve_duty_may_start(&d, false, 410));
    cr_assert(!serve_duty_may_start(&d, true, 420));
    cr_assert(!serve_duty_may_start(&d, false, 430));
    cr_assert(!serve_duty_may_start(&d, false, 429 + SERVE_DUTY_IDLE_MS));
    cr_assert(serve_duty_may_start(&d, false, 430 + SERVE_DUTY_IDLE_MS));
    /* and at the end of the rest, busy or not */
    serve_duty_start(&d, 1000);
    serve_duty_end(&d, true, 1100, -1);
    cr_assert(!serve_duty_may_start(&d, true, 1999));
    cr_assert(serve_duty_may_start(&d, true, 2000));
}

Test(serve_duty, an_idle_server_measures_back_to_back)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    serve_duty d;
    serve_duty_init(&d, 0.10);
    double now = 1000;
    cr_assert(serve_duty_may_start(&d, false, now - SERVE_DUTY_IDLE_MS)); /* idle before */
    for (int k = 0; k < 100; k++) {
        serve_duty_start(&d, now);
        now += 1 + (double)mt_rng_below(&r, 1000);
        serve_duty_end(&d, false, now, -1);
        cr_assert(serve_duty_may_start(&d, false, now), "seed %llu: idle, yet a rest",
                  (unsigned long long)seed);
    }
}

Test(serve_duty, the_cycle_follows_the_cost_not_the_wall_time)
{
    serve_duty d;
    serve_duty_init(&d, 0.25);
    cr_assert(serve_duty_may_start(&d, true, 0));
    serve_duty_start(&d, 0);
    serve_duty_end(&d, true, 150, 100); /* waited for the cores a third of the time */
    cr_assert(!serve_duty_may_start(&d, true, 399));
    cr_assert(serve_duty_may_start(&d, true, 400)); /* a cycle of 100 / 0.25 */
    serve_duty_start(&d, 400);
    serve_duty_end(&d, true, 900, 100); /* longer than its cycle: no rest */
    cr_assert(serve_duty_may_start(&d, true, 900));
    serve_duty_start(&d, 1000);
    serve_duty_end(&d, true, 1100, NAN); /* not known: the wall time */
    cr_assert(!serve_duty_may_start(&d, true, 1399));
    cr_assert(serve_duty_may_start(&d, true, 1400));
    cr_assert_float_eq(d.measured_ms, 750, 1e-9);
    cr_assert_float_eq(d.cost_ms, 300, 1e-9);
}

Test(serve_duty, out_of_range_shares_are_clamped)
{
    serve_duty d;
    serve_duty_init(&d, 7);
    cr_assert_eq(d.share, 1);
    serve_duty_start(&d, 0);
    serve_duty_end(&d, true, 50, -1);
    cr_assert(serve_duty_may_start(&d, true, 50));
    serve_duty_init(&d, NAN);
    cr_assert(d.share > 0 && d.share < 1);
    serve_duty_init(&d, -1);
    cr_assert(d.share > 0 && d.share < 1);
    serve_duty_end(&d, true, 10, -1); /* nothing in flight: no rest */
    cr_assert(serve_duty_may_start(&d, true, 10));
}
