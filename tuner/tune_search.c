/* tune_search.c: which configs to try, in which order: the valid space of
 * one (job, M) cut to this run's shard, the configs already known, and the
 * strategies (see tune_impl.h):
 *   exhaustive  every valid config in space order;
 *   random      the same set in a seeded random order (the caller stops at
 *               the budget);
 *   evolve      a random first generation, then every config one allowed
 *               value away (one parameter, then two) from the best few so
 *               far; random fill when the neighbourhood is exhausted;
 *   model       one random config after the default, then the candidates
 *               a random-forest surrogate of the times so far ranks best by
 *               expected improvement (tune_model.c), in small batches, from
 *               a trust region around the fastest so far (trust_region).
 * The default config comes first in every strategy and every shard (its
 * time is the baseline of the speedup), then the transfer seeds. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "tune_impl.h"

/* Spaces larger than this are sampled, never enumerated. */
#define ENUM_LIMIT ((uint64_t)1 << 22)
#define EVOLVE_PARENTS 4
/* The model strategy: observations before the first fit, the candidate
 * pool it ranks per batch, and the observations it fits at most. */
#define MODEL_INIT 2
#define MODEL_POOL 4096
#define MODEL_MAX_OBS 512
/* ... and the fewest candidates of its trust region (trust_region). */
#define MODEL_REGION 2

typedef struct keyset {
    char **slot;
    size_t cap, n;
} keyset;

static bool keyset_has(const keyset *k, const char *key)
{
    if (!k->cap)
        return false;
    size_t i = (size_t)tune_hash64(key) & (k->cap - 1);
    for (; k->slot[i]; i = (i + 1) & (k->cap - 1))
        if (!strcmp(k->slot[i], key))
            return true;
    return false;
}

static bool keyset_add(keyset *k, const char *key)
{
    if (keyset_has(k, key))
        return true;
    if ((k->n + 1) * 2 > k->cap) {
        size_t cap = k->cap ? k->cap * 2 : 256;
        char **slot = calloc(cap, sizeof *slot);
        if (!slot)
            return false;
        for (size_t i = 0; i < k->cap; i++)
            if (k->slot[i]) {
                size_t j = (size_t)tune_hash64(k->slot[i]) & (cap - 1);
                while (slot[j])
                    j = (j + 1) & (cap - 1);
                slot[j] = k->slot[i];
            }
        free(k->slot);
        k->slot = slot;
        k->cap = cap;
    }
    char *dup = strdup(key);
    if (!dup)
        return false;
    size_t i = (size_t)tune_hash64(key) & (k->cap - 1);
    while (k->slot[i])
        i = (i + 1) & (k->cap - 1);
    k->slot[i] = dup;
    k->n++;
    return true;
}

static void keyset_free(keyset *k)
{
    for (size_t i = 0; i < k->cap; i++)
        free(k->slot[i]);
    free(k->slot);
}

typedef struct scored {
    kern_config cfg;
    double ms;
} scored;

struct tune_search {
    tune_search_args a;
    kern_shape shape;
    dev_props props;
    kern_config dflt;
    bool dflt_done;
    kern_config *space;  /* valid configs of the shard, in strategy order */
    int n_space;
    bool sampled;        /* space too large to enumerate */
    int cursor;
    keyset known;
    kern_config *seeds;
    int n_seeds, cap_seeds;
    scored *ok;          /* measured ok, for evolve */
    int n_ok, cap_ok;
    tune_model_obs *obs; /* every measured config (failed: INFINITY), for model */
    int n_obs, cap_obs;
    int generation;
    mt_rng rng;
};

static bool same(const kern_config *a, const kern_config *b)
{
    return a->n == b->n && !memcmp(a->v, b->v, sizeof a->v[0] * (size_t)a->n);
}

static void key_of(const tune_search *s, const kern_config *c, char *out, size_t cap)
{
    kern_config_key(s->a.im, c, out, cap);
}

/* Valid for the shape and device, and in this run's shard. */
static bool usable(const tune_search *s, const kern_config *c)
{
    char why[256];
    if (!kern_config_valid(s->a.fam, s->a.im, &s->shape, s->a.m, c, &s->props, why,
                           sizeof why))
        return false;
    if (s->a.shard_count > 1) {
        char key[256];
        key_of(s, c, key, sizeof key);
        if (tune_shard_of(key, s->a.shard_count) != s->a.shard_index - 1)
            return false;
    }
    return true;
}

static bool is_known(const tune_search *s, const kern_config *c)
{
    char key[256];
    key_of(s, c, key, sizeof key);
    return keyset_has(&s->known, key);
}

static void mark_known(tune_search *s, const kern_config *c)
{
    char key[256];
    key_of(s, c, key, sizeof key);
    keyset_add(&s->known, key);
}

mt_status tune_search_create(const tune_search_args *a, tune_search **out, mt_err *err)
{
    *out = NULL;
    tune_search *s = calloc(1, sizeof *s);
    if (!s)
        return mt_fail(err, MT_E_NOMEM, "search");
    s->a = *a;
    s->shape = *a->shape;
    s->props = *a->props;
    s->a.shape = &s->shape;
    s->a.props = &s->props;
    if (s->a.batch < 1)
        s->a.batch = 8;
    mt_rng_seed(&s->rng, a->seed);
    a->im->default_config(&s->shape, a->m, &s->props, &s->dflt);
    uint64_t size = kern_space_size(a->im);
    if (size > ENUM_LIMIT) {
        if (a->strategy == TUNE_EXHAUSTIVE) {
            free(s);
            return mt_fail(err, MT_E_UNSUPPORTED, "%s: space of %llu points is too large "
                           "to enumerate; use --strategy random or evolve", a->fam->name,
                           (unsigned long long)size);
        }
        s->sampled = true;
        *out = s;
        return MT_OK;
    }
    for (uint64_t i = 0; i < size; i++) {
        kern_config c;
        kern_space_point(a->im, i, &c);
        if (!usable(s, &c))
            continue;
        if (s->n_space % 256 == 0) {
            kern_config *grown = realloc(s->space, sizeof *grown * (size_t)(s->n_space + 256));
            if (!grown) {
                tune_search_destroy(s);
                return mt_fail(err, MT_E_NOMEM, "search space");
            }
            s->space = grown;
        }
        s->space[s->n_space++] = c;
    }
    if (a->strategy != TUNE_EXHAUSTIVE)
        for (int i = s->n_space - 1; i > 0; i--) {
            int j = (int)mt_rng_below(&s->rng, (uint64_t)i + 1);
            kern_config t = s->space[i];
            s->space[i] = s->space[j];
            s->space[j] = t;
        }
    *out = s;
    return MT_OK;
}

void tune_search_destroy(tune_search *s)
{
    if (!s)
        return;
    keyset_free(&s->known);
    free(s->space);
    free(s->seeds);
    free(s->ok);
    free(s->obs);
    free(s);
}

int tune_search_space(const tune_search *s)
{
    bool dflt_in = false;
    if (s->sampled)
        return -1;
    for (int i = 0; i < s->n_space && !dflt_in; i++)
        dflt_in = same(&s->space[i], &s->dflt);
    return s->n_space + !dflt_in;
}

const kern_config *tune_search_default(const tune_search *s) { return &s->dflt; }

void tune_search_set_budget(tune_search *s, int64_t trials) { s->a.budget = trials; }

static void add_ok(tune_search *s, const kern_config *c, double ms)
{
    if (s->n_ok == s->cap_ok) {
        int cap = s->cap_ok ? s->cap_ok * 2 : 64;
        scored *g = realloc(s->ok, sizeof *g * (size_t)cap);
        if (!g)
            return; /* evolve loses a parent; nothing breaks */
        s->ok = g;
        s->cap_ok = cap;
    }
    s->ok[s->n_ok++] = (scored){*c, ms};
}

static void add_obs(tune_search *s, const kern_config *c, bool ok, double ms)
{
    if (s->n_obs == s->cap_obs) {
        int cap = s->cap_obs ? s->cap_obs * 2 : 64;
        tune_model_obs *g = realloc(s->obs, sizeof *g * (size_t)cap);
        if (!g)
            return; /* the model loses one observation; nothing breaks */
        s->obs = g;
        s->cap_obs = cap;
    }
    s->obs[s->n_obs++] = (tune_model_obs){*c, ok && isfinite(ms) && ms > 0 ? ms : INFINITY};
}

void tune_search_known(tune_search *s, const char *config_key, bool ok, double median_ms)
{
    keyset_add(&s->known, config_key);
    kern_config c;
    if (kern_config_parse(s->a.im, config_key, &c, NULL) != MT_OK)
        return;
    if (ok && isfinite(median_ms))
        add_ok(s, &c, median_ms);
    add_obs(s, &c, ok, median_ms);
}

void tune_search_seed(tune_search *s, const kern_config *c)
{
    for (int i = 0; i < s->n_seeds; i++)
        if (same(&s->seeds[i], c))
            return;
    if (s->n_seeds == s->cap_seeds) {
        int cap = s->cap_seeds ? s->cap_seeds * 2 : 8;
        kern_config *g = realloc(s->seeds, sizeof *g * (size_t)cap);
        if (!g)
            return;
        s->seeds = g;
        s->cap_seeds = cap;
    }
    s->seeds[s->n_seeds++] = *c;
}

int tune_search_seeds(const tune_search *s)
{
    int n = 0;
    for (int i = 0; i < s->n_seeds; i++)
        n += usable(s, &s->seeds[i]) && !is_known(s, &s->seeds[i]) &&
             !same(&s->seeds[i], &s->dflt);
    return n;
}

int tune_search_seeds_valid(const tune_search *s)
{
    int n = 0;
    for (int i = 0; i < s->n_seeds; i++)
        n += usable(s, &s->seeds[i]);
    return n;
}

void tune_search_result(tune_search *s, const kern_config *c, bool ok, double median_ms)
{
    if (ok && isfinite(median_ms))
        add_ok(s, c, median_ms);
    add_obs(s, c, ok, median_ms);
}

static bool propose(tune_search *s, const kern_config *c, kern_config *out, int *n)
{
    if (is_known(s, c))
        return false;
    mark_known(s, c);
    out[(*n)++] = *c;
    return true;
}

/* Next unknown configs in space order (or random draws when sampled). */
static void take_fresh(tune_search *s, kern_config *out, int *n, int cap)
{
    if (s->sampled) {
        uint64_t size = kern_space_size(s->a.im);
        for (int tries = 0; tries < 64 * cap && *n < cap; tries++) {
            kern_config c;
            kern_space_point(s->a.im, mt_rng_below(&s->rng, size), &c);
            if (usable(s, &c))
                propose(s, &c, out, n);
        }
        return;
    }
    while (*n < cap && s->cursor < s->n_space)
        propose(s, &s->space[s->cursor++], out, n);
}

static int cmp_scored(const void *a, const void *b)
{
    double x = ((const scored *)a)->ms, y = ((const scored *)b)->ms;
    return x < y ? -1 : x > y;
}

/* Index of value v among the allowed values of parameter i; -1 if none. */
static int value_index(const kern_param_desc *p, int v)
{
    for (int k = 0; k < p->n_values; k++)
        if (p->values[k] == v)
            return k;
    return -1;
}

static bool step(const tune_search *s, kern_config *c, int param, int delta)
{
    const kern_param_desc *p = &s->a.im->params[param];
    int k = value_index(p, c->v[param]) + delta;
    if (k < 0 || k >= p->n_values)
        return false;
    c->v[param] = p->values[k];
    return true;
}

/* Neighbours of the best few: one parameter one allowed value away, then
 * two parameters at once. */
static void mutate(tune_search *s, kern_config *out, int *n, int cap)
{
    qsort(s->ok, (size_t)s->n_ok, sizeof *s->ok, cmp_scored);
    int parents = s->n_ok < EVOLVE_PARENTS ? s->n_ok : EVOLVE_PARENTS;
    int np = s->a.im->n_params;
    for (int pass = 1; pass <= 2 && *n == 0; pass++)
        for (int p = 0; p < parents && *n < cap; p++)
            for (int i = 0; i < np && *n < cap; i++)
                for (int di = -1; di <= 1 && *n < cap; di += 2) {
                    kern_config c = s->ok[p].cfg;
                    if (!step(s, &c, i, di))
                        continue;
                    if (pass == 1) {
                        if (usable(s, &c))
                            propose(s, &c, out, n);
                        continue;
                    }
                    for (int j = i + 1; j < np && *n < cap; j++)
                        for (int dj = -1; dj <= 1 && *n < cap; dj += 2) {
                            kern_config c2 = c;
                            if (step(s, &c2, j, dj) && usable(s, &c2))
                                propose(s, &c2, out, n);
                        }
                }
}

/* Steps between two configs: the sum over parameters of how many allowed
 * values apart they are. */
static int distance(const tune_search *s, const kern_config *a, const kern_config *b)
{
    int d = 0;
    for (int i = 0; i < s->a.im->n_params; i++) {
        const kern_param_desc *p = &s->a.im->params[i];
        int k = value_index(p, a->v[i]) - value_index(p, b->v[i]);
        d += k < 0 ? -k : k;
    }
    return d;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The candidates of an enumerated space: its untried configs (up to
 * MODEL_POOL, in the space's random order) nearest the fastest config so
 * far, within the smallest number of steps that holds at least
 * MODEL_REGION of them (a trust region). The defaults are the families'
 * cost-model rules and land near the optimum; a forest fitted to a handful
 * of trials is a poor guide far from them. Every untried config when
 * nothing ran ok yet. */
static int trust_region(tune_search *s, kern_config *pool)
{
    int np = 0;
    for (int i = 0; i < s->n_space && np < MODEL_POOL; i++)
        if (!is_known(s, &s->space[i]))
            pool[np++] = s->space[i];
    if (s->n_ok == 0 || np <= MODEL_REGION)
        return np;
    qsort(s->ok, (size_t)s->n_ok, sizeof *s->ok, cmp_scored);
    const kern_config *best = &s->ok[0].cfg;
    int *d = malloc(sizeof *d * (size_t)np), *sorted = malloc(sizeof *d * (size_t)np);
    if (!d || !sorted) {
        free(d);
        free(sorted);
        return np;
    }
    for (int i = 0; i < np; i++)
        sorted[i] = d[i] = distance(s, best, &pool[i]);
    qsort(sorted, (size_t)np, sizeof *sorted, cmp_int);
    int radius = sorted[MODEL_REGION - 1], kept = 0;
    for (int i = 0; i < np; i++)
        if (d[i] <= radius)
            pool[kept++] = pool[i];
    free(d);
    free(sorted);
    return kept;
}

static int cmp_obs(const void *a, const void *b)
{
    double x = ((const tune_model_obs *)a)->ms, y = ((const tune_model_obs *)b)->ms;
    return x < y ? -1 : x > y;
}

/* The model strategy's batch: random until MODEL_INIT configs are measured,
 * then the surrogate's picks among (a sample of) the untried space. */
static void model_propose(tune_search *s, kern_config *out, int *n, int cap)
{
    if (s->n_obs + *n < MODEL_INIT) {
        int want = MODEL_INIT - s->n_obs;
        take_fresh(s, out, n, want < cap ? want : cap);
        return;
    }
    kern_config *pool = malloc(sizeof *pool * MODEL_POOL);
    tune_model_obs *obs = malloc(sizeof *obs * (size_t)(s->n_obs > 0 ? s->n_obs : 1));
    int *chosen = malloc(sizeof *chosen * (size_t)cap);
    int np = 0, picked = 0;
    if (!pool || !obs || !chosen)
        goto fallback;
    if (s->sampled) {
        uint64_t size = kern_space_size(s->a.im);
        for (int tries = 0; tries < 16 * MODEL_POOL && np < MODEL_POOL / 2; tries++) {
            kern_config c;
            kern_space_point(s->a.im, mt_rng_below(&s->rng, size), &c);
            if (!is_known(s, &c) && usable(s, &c))
                pool[np++] = c;
        }
        /* Plus every config one allowed value away from the best few. */
        qsort(s->ok, (size_t)s->n_ok, sizeof *s->ok, cmp_scored);
        for (int p = 0; p < s->n_ok && p < EVOLVE_PARENTS; p++)
            for (int i = 0; i < s->a.im->n_params; i++)
                for (int di = -1; di <= 1 && np < MODEL_POOL; di += 2) {
                    kern_config c = s->ok[p].cfg;
                    if (step(s, &c, i, di) && !is_known(s, &c) && usable(s, &c))
                        pool[np++] = c;
                }
    } else {
        np = trust_region(s, pool);
    }
    if (s->n_obs > 0) /* the default and seeds may fill the first batch: nothing measured yet */
        memcpy(obs, s->obs, sizeof *obs * (size_t)s->n_obs);
    int n_obs = s->n_obs;
    if (n_obs > MODEL_MAX_OBS) { /* the fit's cost: keep the fastest */
        qsort(obs, (size_t)n_obs, sizeof *obs, cmp_obs);
        n_obs = MODEL_MAX_OBS;
    }
    picked = tune_model_pick(s->a.im, obs, n_obs, pool, np, cap - *n, mt_rng_u64(&s->rng),
                             chosen);
    for (int i = 0; i < picked; i++)
        propose(s, &pool[chosen[i]], out, n);
fallback:
    free(pool);
    free(obs);
    free(chosen);
    if (*n < cap && picked == 0)
        take_fresh(s, out, n, cap);
}

/* Small batches let the model learn from each; large budgets still get
 * the full batch (the compile pool's width). */
static int model_batch(const tune_search *s, int want)
{
    int b = s->a.budget > 0 ? (int)(s->a.budget / 8) : s->a.batch / 2;
    b = b < 1 ? 1 : b > s->a.batch ? s->a.batch : b;
    return b < want ? b : want;
}

int tune_search_next(tune_search *s, kern_config *out, int cap)
{
    int n = 0;
    if (cap <= 0)
        return 0;
    if (!s->dflt_done) {
        s->dflt_done = true;
        propose(s, &s->dflt, out, &n);
    }
    for (int i = 0; i < s->n_seeds && n < cap; i++)
        if (usable(s, &s->seeds[i]))
            propose(s, &s->seeds[i], out, &n);
    s->n_seeds = 0;
    int want = s->a.strategy == TUNE_EXHAUSTIVE ? cap : (s->a.batch < cap ? s->a.batch : cap);
    if (s->a.strategy == TUNE_MODEL) {
        int b = model_batch(s, want);
        if (n < b)
            model_propose(s, out, &n, b);
        return n;
    }
    if (s->a.strategy == TUNE_EVOLVE && s->generation++ > 0 && s->n_ok > 0)
        mutate(s, out, &n, want);
    if (s->a.strategy == TUNE_EVOLVE && s->generation == 1 && s->a.budget > 0) {
        /* A small random start leaves most of the budget for mutation. */
        int first = (int)(s->a.budget / 4);
        first = first < 4 ? 4 : first;
        want = first < want ? first : want;
    }
    if (n < want && (s->a.strategy != TUNE_EVOLVE || n == 0 || s->generation == 1))
        take_fresh(s, out, &n, want);
    return n;
}
