/* serve_hold.c: the live tuner's compiler hold cycle (serve_hold.h). */
#include "serve_hold.h"

void serve_hold_init(serve_hold *h, double share, double now_ms)
{
    if (!(share > 0)) /* also NaN */
        share = 0.01;
    if (share > 1)
        share = 1;
    h->free_ms = SERVE_HOLD_CYCLE_MS * share;
    h->hold_ms = SERVE_HOLD_CYCLE_MS - h->free_ms;
    h->free_at_ms = now_ms;
}

bool serve_hold_held(serve_hold *h, bool busy, double now_ms)
{
    if (!busy || now_ms - h->free_at_ms >= h->hold_ms + h->free_ms)
        h->free_at_ms = now_ms;
    return busy && now_ms - h->free_at_ms < h->hold_ms;
}
