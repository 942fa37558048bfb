/* serve_hold.h: when a live tuner's compilers may run on a busy server.
 * A compiler evicts what the serving threads keep in the caches even at
 * the lowest priority, so while requests run the compilers are held
 * stopped (dev_set_tool_hold), but a server that is never idle must still
 * get its load tuned: busy, the compilers are held for (1 - share) of each
 * SERVE_HOLD_CYCLE_MS and let go for the rest, so they compile share of
 * the time (--tune-share); idle, they always run. A busy stretch starts
 * with the hold.
 *
 * Ownership: caller storage, no resources; not thread-safe (serve_tune
 * calls it under its mutex). */
#ifndef MT_SERVE_HOLD_H
#define MT_SERVE_HOLD_H

#include <stdbool.h>

#define SERVE_HOLD_CYCLE_MS 2000.0

typedef struct serve_hold {
    double hold_ms;    /* held at a stretch while busy: (1 - share) x the cycle */
    double free_ms;    /* then let go: share x the cycle */
    double free_at_ms; /* when the compilers last ran (idle, or the cycle began) */
} serve_hold;

/* share in (0, 1]: the fraction of a busy server's time the compilers run
 * (clamped to that range); now_ms starts the first cycle. */
void serve_hold_init(serve_hold *h, double share, double now_ms);
/* Whether the compilers are held at now_ms (non-decreasing between calls),
 * the server busy (a request waits or runs) or not. */
bool serve_hold_held(serve_hold *h, bool busy, double now_ms);

#endif
