/* serve_duty.c: the live tuner's measurement duty cycle (serve_duty.h). */
#include "serve_duty.h"

void serve_duty_init(serve_duty *d, double share)
{
    if (!(share > 0)) /* also NaN */
        share = 0.01;
    if (share > 1)
        share = 1;
    *d = (serve_duty){.share = share, .rest_until = 0, .idle_since = -1, .started = -1};
}

bool serve_duty_may_start(serve_duty *d, bool busy, double now_ms)
{
    if (busy)
        d->idle_since = -1;
    else if (d->idle_since < 0)
        d->idle_since = now_ms;
    if (now_ms >= d->rest_until)
        return true;
    if (!busy && now_ms - d->idle_since >= SERVE_DUTY_IDLE_MS) {
        d->rest_until = now_ms; /* forgiven: nobody is waiting for the cores */
        return true;
    }
    return false;
}

void serve_duty_start(serve_duty *d, double now_ms)
{
    if (d->started < 0)
        d->started = now_ms;
}

void serve_duty_end(serve_duty *d, bool busy, double now_ms, double cost_ms)
{
    if (d->started < 0)
        return;
    double t = now_ms - d->started;
    d->started = -1;
    if (t < 0)
        t = 0;
    d->measured_ms += t;
    if (!(cost_ms >= 0)) /* also NaN */
        cost_ms = t;
    d->cost_ms += cost_ms;
    if (!busy) {
        d->rest_until = now_ms; /* nobody waited for the cores */
        return;
    }
    d->idle_since = -1; /* an idle stretch starts after the measurement */
    /* the cycle, measurement and rest, lasts cost / share from its start */
    double until = now_ms - t + cost_ms / d->share;
    d->rest_until = until > now_ms ? until : now_ms;
}
