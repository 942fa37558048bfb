/* space.c: sampling valid configurations from a family's parameter space. */
#include <string.h>

#include "common/rng.h"
#include "family.h"

static bool same(const kern_config *a, const kern_config *b)
{
    return a->n == b->n && !memcmp(a->v, b->v, sizeof(int) * (size_t)a->n);
}

static bool seen_in(const kern_config *list, int n, const kern_config *c)
{
    for (int i = 0; i < n; i++)
        if (same(&list[i], c))
            return true;
    return false;
}

int kern_space_sample(const kern_family *f, const kern_impl *im, const kern_shape *s,
                      int64_t m, const dev_props *p, uint64_t seed,
                      bool include_default, kern_config *out, int cap)
{
    int n = 0;
    char why[256];
    if (cap <= 0)
        return 0;
    memset(out, 0, sizeof *out * (size_t)cap);
    if (include_default) {
        im->default_config(s, m, p, &out[0]);
        n = 1;
    }
    uint64_t size = kern_space_size(im);
    mt_rng r;
    mt_rng_seed(&r, seed);
    /* Small spaces are walked whole (in random order of start); large ones
     * sampled with a bounded number of draws. */
    if (size <= 4096) {
        uint64_t start = mt_rng_below(&r, size);
        for (uint64_t i = 0; i < size && n < cap; i++) {
            kern_config c;
            kern_space_point(im, (start + i * 2654435761u) % size, &c);
            if (kern_config_valid(f, im, s, m, &c, p, why, sizeof why) &&
                !seen_in(out, n, &c))
                out[n++] = c;
        }
        return n;
    }
    for (int tries = 0; tries < 50 * cap && n < cap; tries++) {
        kern_config c;
        kern_space_point(im, mt_rng_below(&r, size), &c);
        if (kern_config_valid(f, im, s, m, &c, p, why, sizeof why) && !seen_in(out, n, &c))
            out[n++] = c;
    }
    return n;
}
