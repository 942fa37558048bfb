/* tune_opts.c: the tuner's small parsers and defaults: strategies, budgets,
 * shards, jobs, the default M list and the shard hash. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tune_impl.h"

const int64_t tune_default_ms[] = {1,   2,   4,   8,   16,   24,   32,   48,
                                   64,  96,  128, 256, 512, 1024, 2048, 4096};
const int tune_default_n_ms = (int)(sizeof tune_default_ms / sizeof tune_default_ms[0]);

static const char *const strategy_names[TUNE_STRATEGY_COUNT] = {
    [TUNE_EXHAUSTIVE] = "exhaustive",
    [TUNE_RANDOM] = "random",
    [TUNE_EVOLVE] = "evolve",
    [TUNE_MODEL] = "model",
};
_Static_assert(sizeof strategy_names / sizeof strategy_names[0] == TUNE_STRATEGY_COUNT,
               "one name per strategy");

const char *tune_strategy_name(tune_strategy s)
{
    return (unsigned)s < TUNE_STRATEGY_COUNT ? strategy_names[s] : "unknown";
}

bool tune_strategy_parse(const char *s, tune_strategy *out)
{
    for (int i = 0; i < TUNE_STRATEGY_COUNT; i++)
        if (!strcmp(s, strategy_names[i])) {
            *out = (tune_strategy)i;
            return true;
        }
    return false;
}

mt_status tune_budget_parse(const char *text, tune_budget *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno || !(v > 0) || !isfinite(v))
        return mt_fail(err, MT_E_INVALID, "budget '%s': expected a trial count (2000) or "
                       "a time (90s, 30m, 2h) or a share of the space (15%%)", text);
    if (!*end) {
        if (v != floor(v))
            return mt_fail(err, MT_E_INVALID, "budget '%s': a trial count is a whole "
                           "number (or add a unit: s, m, h)", text);
        out->trials = (int64_t)v;
        return MT_OK;
    }
    if (!strcmp(end, "%")) {
        if (v > 100)
            return mt_fail(err, MT_E_INVALID, "budget '%s': a share of the space is at most "
                           "100%%", text);
        out->space_fraction = v / 100;
        return MT_OK;
    }
    double unit = 0;
    if (!strcmp(end, "s"))
        unit = 1;
    else if (!strcmp(end, "m") || !strcmp(end, "min"))
        unit = 60;
    else if (!strcmp(end, "h"))
        unit = 3600;
    else
        return mt_fail(err, MT_E_INVALID, "budget '%s': unknown unit '%s' (s, m, h, %%)",
                       text, end);
    out->seconds = v * unit;
    return MT_OK;
}

void tune_budget_text(const tune_budget *b, char *out, size_t cap)
{
    char parts[3][48];
    int n = 0;
    if (b->trials > 0)
        snprintf(parts[n++], sizeof parts[0], "%lld trials per M", (long long)b->trials);
    if (b->space_fraction > 0)
        snprintf(parts[n++], sizeof parts[0], "%g%% of the space per M",
                 b->space_fraction * 100);
    if (b->seconds > 0)
        snprintf(parts[n++], sizeof parts[0], "%.0fs", b->seconds);
    if (!n)
        snprintf(out, cap, "unlimited");
    else
        snprintf(out, cap, "%s%s%s%s%s", parts[0], n > 1 ? ", " : "", n > 1 ? parts[1] : "",
                 n > 2 ? ", " : "", n > 2 ? parts[2] : "");
}

mt_status tune_shard_parse(const char *text, int *index, int *count, mt_err *err)
{
    char *end = NULL;
    long i = strtol(text, &end, 10);
    if (end == text || *end != '/')
        return mt_fail(err, MT_E_INVALID, "shard '%s': expected I/N, e.g. 2/8", text);
    const char *p = end + 1;
    long n = strtol(p, &end, 10);
    if (end == p || *end || n < 1 || n > 100000 || i < 1 || i > n)
        return mt_fail(err, MT_E_INVALID, "shard '%s': expected I/N with 1 <= I <= N", text);
    *index = (int)i;
    *count = (int)n;
    return MT_OK;
}

uint64_t tune_hash64(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

int tune_shard_of(const char *config_key, int count)
{
    if (count <= 1)
        return 0;
    return (int)(tune_hash64(config_key) % (uint64_t)count);
}

const char *tune_trial_status_name(db_trial_status s) { return db_trial_status_str(s); }

mt_status tune_job_make(const kern_family *f, const char *shape_text, const int64_t *ms,
                        int n_m, tune_job *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    out->fam = f;
    int64_t key_m = 0;
    mt_status st = kern_shape_parse(f, shape_text, &out->shape, &key_m, err);
    if (st != MT_OK)
        return st;
    if (n_m > TUNE_MAX_M)
        return mt_fail(err, MT_E_INVALID, "%d values of M (at most %d)", n_m, TUNE_MAX_M);
    if (ms && n_m > 0) {
        for (int i = 0; i < n_m; i++) {
            if (ms[i] < 1)
                return mt_fail(err, MT_E_INVALID, "M=%lld: M must be at least 1",
                               (long long)ms[i]);
            for (int j = 0; j < i; j++)
                if (ms[j] == ms[i])
                    return mt_fail(err, MT_E_INVALID, "M=%lld listed twice",
                                   (long long)ms[i]);
            out->m[i] = ms[i];
        }
        out->n_m = n_m;
    } else if (key_m > 0) {
        out->m[0] = key_m;
        out->n_m = 1;
    } else {
        for (int i = 0; i < tune_default_n_ms; i++)
            out->m[i] = tune_default_ms[i];
        out->n_m = tune_default_n_ms;
    }
    if (f->shape_ok)
        for (int i = 0; i < out->n_m; i++) {
            char why[256] = "";
            if (!f->shape_ok(&out->shape, out->m[i], why, sizeof why))
                return mt_fail(err, MT_E_INVALID, "%s shape '%s' at M=%lld: %s", f->name,
                               shape_text, (long long)out->m[i], why);
        }
    return MT_OK;
}

void tune_opts_default(tune_opts *o)
{
    memset(o, 0, sizeof *o);
    o->device = "auto";
    o->strategy = TUNE_MODEL;
    o->jobs = 2;
    o->timeout_s = 60;
    o->transfer = true;
    o->confirm_top = TUNE_CONFIRM_TOP;
    kern_time_opts_default(&o->timing);
}
