/* rng.c: xoshiro256** seeded through splitmix64 (see rng.h). */
#include "rng.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void mt_rng_seed(mt_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t mt_rng_u64(mt_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

uint64_t mt_rng_below(mt_rng *r, uint64_t n)
{
    /* Rejection keeps it unbiased; the loop runs once almost always. */
    uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = mt_rng_u64(r);
    while (x >= lim);
    return x % n;
}

float mt_rng_uniform(mt_rng *r, float lo, float hi)
{
    double u = (double)(mt_rng_u64(r) >> 11) * 0x1.0p-53;
    return (float)(lo + (hi - lo) * u);
}

float mt_rng_normal(mt_rng *r)
{
    double u1 = ((double)(mt_rng_u64(r) >> 11) + 1.0) * 0x1.0p-53;
    double u2 = (double)(mt_rng_u64(r) >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t mt_seed_fresh(void)
{
    const char *fixed = getenv("MOETUNE_SEED");
    if (fixed && *fixed) {
        char *end;
        unsigned long long v = strtoull(fixed, &end, 0);
        if (!*end)
            return (uint64_t)v;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    x ^= (uint64_t)getpid() << 32;
    return splitmix64(&x);
}
