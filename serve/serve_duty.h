/* serve_duty.h: how much of a busy server's time a live tuner may spend
 * measuring. The measurement worker runs at the lowest priority, and still
 * the serving threads pay for it: on a machine with few cores even a
 * SCHED_IDLE task that only spins raises their inter-token latency, and
 * the more of the time it runs the more it costs. So while requests run,
 * a measurement that took t ms of the device (on cpu: the worker's CPU
 * time over the cores) starts a cycle of t / share ms, the measurement
 * and then a rest, before the next may start: the worker takes share of a
 * busy server's device (--tune-share), as the compilers compile share of it
 * (serve_hold.h). On a GPU t is the wall time and the rest t x (1 - share)
 * / share; on cpu a worker that waited for the serving threads took less
 * than its wall time and rests less (none when its wall time was t / share
 * or more). An idle server forgives the rest once it has been idle
 * for SERVE_DUTY_IDLE_MS (the gaps between requests on a loaded server are
 * shorter, and a measurement started in one runs into the next request).
 *
 * Ownership: caller storage, no resources; not thread-safe (serve_tune
 * calls it from its tuner thread alone). */
#ifndef MT_SERVE_DUTY_H
#define MT_SERVE_DUTY_H

#include <stdbool.h>

#define SERVE_DUTY_IDLE_MS 100.0

typedef struct serve_duty {
    double share;       /* of a busy server's device the measurements take, (0, 1] */
    double rest_until;  /* no measurement starts before this while busy (ms) */
    double idle_since;  /* since when the server has been seen idle; < 0: busy */
    double started;     /* when the measurement in flight started; < 0: none */
    double measured_ms; /* measuring, in all (wall time) */
    double cost_ms;     /* what the measurements took of the device, in all */
} serve_duty;

/* share in (0, 1], clamped to that range (NaN or <= 0: 0.01). */
void serve_duty_init(serve_duty *d, double share);
/* Whether a measurement may start at now_ms (non-decreasing between calls),
 * the server busy (a request waits or runs) or not. Callers poll it. */
bool serve_duty_may_start(serve_duty *d, bool busy, double now_ms);
/* A measurement starts at now_ms. */
void serve_duty_start(serve_duty *d, double now_ms);
/* The measurement has ended at now_ms; busy: the server worked at some
 * time during it (its rest begins), else it was idle throughout (no rest;
 * the idle stretch goes on). cost_ms: what it took of the device, the
 * cycle's measure (on cpu the worker's CPU time over the cores: a worker
 * that waited for the serving threads took nothing); < 0: its wall time. */
void serve_duty_end(serve_duty *d, bool busy, double now_ms, double cost_ms);

#endif
