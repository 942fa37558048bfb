/* space.c: sampling valid configurations from a family's parameter space:
 * at random, and for `check`, stratified by the code paths the configs
 * run (the defaults of every M bucket, every value of the mode
 * parameters). */
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

/* The M buckets the runtime selects a config for (model_buckets of
 * model/kset.c, the tuner's default M list). */
static const int64_t buckets[] = {1,  2,   4,   8,   16,  24,   32,   48,
                                  64, 96, 128, 256, 512, 1024, 2048, 4096};

/* Parameters that pick a code path rather than a size: every value of
 * each that has a valid config is checked. */
static const char *const mode_params[] = {"MMA", "GEMV"};

/* Adds c's n values to out when valid at m and new; returns the new count. */
static int add_valid(const kern_family *f, const kern_impl *im, const kern_shape *s, int64_t m,
                     const dev_props *p, const kern_config *c, kern_config *out, int n, int cap)
{
    char why[256];
    if (n < cap && kern_config_valid(f, im, s, m, c, p, why, sizeof why) && !seen_in(out, n, c)) {
        out[n].n = c->n;
        memcpy(out[n].v, c->v, sizeof(int) * (size_t)c->n);
        n++;
    }
    return n;
}

int kern_space_sample_paths(const kern_family *f, const kern_impl *im, const kern_shape *s,
                            int64_t m, const dev_props *p, uint64_t seed, int n_random,
                            kern_config *out, int cap, char *refused, size_t rcap)
{
    int n = 0;
    if (cap <= 0)
        return 0;
    memset(out, 0, sizeof *out * (size_t)cap);
    kern_config c;
    im->default_config(s, m, p, &c);
    if (refused && rcap)
        refused[0] = 0;
    if (!kern_config_valid(f, im, s, m, &c, p, refused ? refused : (char[256]){0},
                           refused ? rcap : 256))
        return 0; /* the backend cannot run this shape: the reason says why */
    n = add_valid(f, im, s, m, p, &c, out, n, cap);
    for (size_t b = 0; b < sizeof buckets / sizeof buckets[0]; b++) {
        im->default_config(s, buckets[b], p, &c);
        n = add_valid(f, im, s, m, p, &c, out, n, cap);
    }
    /* The code paths are the same on every run (a fixed stream per family,
     * shape and M: a second run compiles nothing new); the random ones
     * follow the seed. */
    mt_rng r;
    char key[KERN_KEY_MAX];
    kern_shape_key(f, s, false, key, sizeof key);
    uint64_t h = 1469598103934665603ull ^ (uint64_t)m;
    for (const char *q = f->name; *q; q++)
        h = (h ^ (unsigned char)*q) * 1099511628211ull;
    for (const char *q = key; *q; q++)
        h = (h ^ (unsigned char)*q) * 1099511628211ull;
    mt_rng_seed(&r, h);
    uint64_t size = kern_space_size(im);
    for (size_t mp = 0; mp < sizeof mode_params / sizeof mode_params[0]; mp++)
        for (int pi = 0; pi < im->n_params; pi++) {
            const kern_param_desc *d = &im->params[pi];
            if (strcmp(d->name, mode_params[mp]))
                continue;
            for (int vi = 0; vi < d->n_values; vi++) {
                bool have = false;
                for (int i = 0; i < n && !have; i++)
                    have = out[i].v[pi] == d->values[vi];
                /* random points with the mode fixed; a rare mode may have
                 * no valid point at all on this device and shape */
                for (int tries = 0; !have && tries < 4000 && n < cap; tries++) {
                    kern_space_point(im, mt_rng_below(&r, size), &c);
                    c.v[pi] = d->values[vi];
                    int before = n;
                    n = add_valid(f, im, s, m, p, &c, out, n, cap);
                    have = n > before;
                }
            }
        }
    mt_rng_seed(&r, seed);
    for (int tries = 0, want = n + n_random; tries < 50 * (n_random + 1) && n < want; tries++) {
        kern_space_point(im, mt_rng_below(&r, size), &c);
        n = add_valid(f, im, s, m, p, &c, out, n, cap);
    }
    return n;
}
