/* rng.h: small seeded random generators for test problems and search
 * strategies (splitmix64 seeding, xoshiro256** stream). Deterministic for a
 * seed on every platform; not for cryptography. The state is plain data owned
 * by the caller; not thread-safe per state. */
#ifndef MT_RNG_H
#define MT_RNG_H

#include <stdint.h>

typedef struct mt_rng { uint64_t s[4]; } mt_rng;

void mt_rng_seed(mt_rng *r, uint64_t seed);
uint64_t mt_rng_u64(mt_rng *r);
/* Uniform in [0, n); n > 0. */
uint64_t mt_rng_below(mt_rng *r, uint64_t n);
/* Uniform float in [lo, hi). */
float mt_rng_uniform(mt_rng *r, float lo, float hi);
/* Standard normal (Box-Muller). */
float mt_rng_normal(mt_rng *r);
/* A fresh seed from the clock and the process id, for tests that must not
 * reuse one input forever; print it so a failure can be replayed: with
 * MOETUNE_SEED set (decimal or 0x hex), every call returns that seed. */
uint64_t mt_seed_fresh(void);

#endif
