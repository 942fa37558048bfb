/* test_serve_prefix.c: the prefix cache index against a brute-force
 * reference (longest whole-block common prefix over the live holders'
 * computed tokens) under random add, grow, unpin, remove, evict and match
 * operations; LRU eviction order; pinned holders are never evicted. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "serve/serve_prefix.h"

#define MAXH 24
#define MAXT 96

typedef struct ref_holder {
    bool used, pinned;
    int32_t t[MAXT];
    int64_t n, valid;
    uint64_t last;
} ref_holder;

static int64_t common(const int32_t *a, const int32_t *b, int64_t n)
{
    int64_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Tokens from a tiny alphabet with a few shared stems, so prefixes collide. */
static void make_tokens(mt_rng *rng, int32_t *t, int64_t n, const int32_t stems[3][MAXT])
{
    const int32_t *stem = stems[mt_rng_below(rng, 3)];
    int64_t keep = (int64_t)mt_rng_below(rng, (uint64_t)n + 1);
    for (int64_t i = 0; i < n; i++)
        t[i] = i < keep ? stem[i] : (int32_t)mt_rng_below(rng, 4);
}

Test(serve_prefix, matches_the_brute_force_reference)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    for (int round = 0; round < 20; round++) {
        int block = 1 + (int)mt_rng_below(&rng, 8);
        serve_prefix *p;
        cr_assert_eq(serve_prefix_create(block, &p, NULL), MT_OK);
        ref_holder ref[MAXH] = {0};
        int32_t stems[3][MAXT];
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < MAXT; i++)
                stems[s][i] = (int32_t)mt_rng_below(&rng, 4);
        uint64_t now = 1;
        for (int op = 0; op < 3000; op++, now++) {
            int h = (int)mt_rng_below(&rng, MAXH);
            int kind = (int)mt_rng_below(&rng, 10);
            if (kind < 3 && !ref[h].used) {
                ref_holder *r = &ref[h];
                r->n = (int64_t)mt_rng_below(&rng, MAXT + 1);
                make_tokens(&rng, r->t, r->n, stems);
                r->valid = (int64_t)mt_rng_below(&rng, (uint64_t)r->n + 1);
                r->pinned = mt_rng_below(&rng, 2);
                r->used = true;
                r->last = now;
                cr_assert_eq(serve_prefix_add(p, h, r->t, r->n, r->valid, r->pinned, now, NULL),
                             MT_OK);
            } else if (kind == 3 && ref[h].used) {
                int64_t v = ref[h].valid + (int64_t)mt_rng_below(&rng, 20);
                if (v > ref[h].n)
                    v = ref[h].n;
                ref[h].valid = v;
                serve_prefix_grow(p, h, v);
            } else if (kind == 4 && ref[h].used) {
                ref[h].pinned = false;
                ref[h].last = now;
                serve_prefix_unpin(p, h, now);
            } else if (kind == 5 && ref[h].used) {
                ref[h].used = false;
                serve_prefix_remove(p, h);
            } else if (kind == 6) {
                int want = -1;
                for (int i = 0; i < MAXH; i++)
                    if (ref[i].used && !ref[i].pinned &&
                        (want < 0 || ref[i].last < ref[want].last))
                        want = i;
                int got = -1;
                bool ok = serve_prefix_evict(p, &got);
                cr_assert_eq(ok, want >= 0, "seed %llu", (unsigned long long)seed);
                if (ok) {
                    cr_assert_eq(got, want, "seed %llu: evicted %d, LRU is %d",
                                 (unsigned long long)seed, got, want);
                    ref[got].used = false;
                }
            } else {
                int32_t q[MAXT];
                int64_t n = (int64_t)mt_rng_below(&rng, MAXT + 1);
                make_tokens(&rng, q, n, stems);
                int64_t max = (int64_t)mt_rng_below(&rng, MAXT + 1);
                int64_t lim = n < max ? n : max, best = 0;
                for (int i = 0; i < MAXH; i++) {
                    if (!ref[i].used)
                        continue;
                    int64_t c = common(q, ref[i].t, lim < ref[i].valid ? lim : ref[i].valid);
                    c -= c % block;
                    if (c > best)
                        best = c;
                }
                int seq = -2;
                int64_t got = serve_prefix_match(p, q, n, max, now, &seq);
                cr_assert_eq(got, best, "seed %llu op %d: matched %lld, reference %lld",
                             (unsigned long long)seed, op, (long long)got, (long long)best);
                if (got) {
                    cr_assert(seq >= 0 && ref[seq].used);
                    cr_assert_geq(ref[seq].valid, got);
                    cr_assert(!memcmp(ref[seq].t, q, (size_t)got * sizeof *q));
                    ref[seq].last = now;
                } else {
                    cr_assert_eq(seq, -1);
                }
            }
            int live = 0, retained = 0;
            for (int i = 0; i < MAXH; i++) {
                live += ref[i].used;
                retained += ref[i].used && !ref[i].pinned;
                cr_assert_eq(serve_prefix_has(p, i), ref[i].used);
            }
            cr_assert_eq(serve_prefix_holders(p), live);
            cr_assert_eq(serve_prefix_retained(p), retained);
        }
        serve_prefix_destroy(p);
    }
}

Test(serve_prefix, removing_a_holder_keeps_the_others_reachable)
{
    serve_prefix *p;
    cr_assert_eq(serve_prefix_create(4, &p, NULL), MT_OK);
    int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    cr_assert_eq(serve_prefix_add(p, 3, a, 12, 12, false, 1, NULL), MT_OK);
    cr_assert_eq(serve_prefix_add(p, 5, a, 8, 8, true, 2, NULL), MT_OK);
    serve_prefix_remove(p, 5);
    int seq;
    cr_assert_eq(serve_prefix_match(p, a, 12, 11, 3, &seq), 8);
    cr_assert_eq(seq, 3);
    cr_assert_eq(serve_prefix_add(p, 3, a, 4, 4, false, 1, NULL), MT_E_INVALID, "twice");
    /* A pinned holder is never evicted. */
    cr_assert_eq(serve_prefix_add(p, 9, a, 12, 12, true, 0, NULL), MT_OK);
    cr_assert(serve_prefix_evict(p, &seq));
    cr_assert_eq(seq, 3);
    cr_assert(!serve_prefix_evict(p, &seq));
    cr_assert_eq(serve_prefix_match(p, a, 12, 12, 4, &seq), 12);
    cr_assert_eq(seq, 9);
    serve_prefix_destroy(p);
}
