/* clock.h: monotonic time for host-side timing. */
#ifndef MT_CLOCK_H
#define MT_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t mt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double mt_now_ms(void) { return (double)mt_now_ns() * 1e-6; }

#endif
