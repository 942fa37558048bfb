/* tune_stats.c: the statistics behind a winner (see tuner.h): the
 * percentile-bootstrap interval of the geometric mean of paired ratios
 * candidate/default, and the rule that accepts a candidate. */
#include <math.h>
#include <stdlib.h>

#include "common/rng.h"
#include "tune_impl.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Linear interpolation between order statistics (type 7). */
static double quantile(const double *sorted, int n, double q)
{
    double pos = q * (n - 1);
    int lo = (int)floor(pos);
    if (lo < 0)
        lo = 0;
    int hi = lo + 1 < n ? lo + 1 : lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

mt_status tune_ratio_interval(const double *cand_ms, const double *dflt_ms, int n, double level,
                              uint64_t seed, tune_interval *out, mt_err *err)
{
    if (n < 2 || n > TUNE_CONFIRM_MAX_ROUNDS)
        return mt_fail(err, MT_E_INVALID, "ratio interval: %d rounds (2 to %d)", n,
                       TUNE_CONFIRM_MAX_ROUNDS);
    if (!(level > 0 && level < 1))
        return mt_fail(err, MT_E_INVALID, "ratio interval: confidence %g (between 0 and 1)",
                       level);
    double logs[TUNE_CONFIRM_MAX_ROUNDS], sum = 0;
    for (int i = 0; i < n; i++) {
        if (!(isfinite(cand_ms[i]) && cand_ms[i] > 0 && isfinite(dflt_ms[i]) && dflt_ms[i] > 0))
            return mt_fail(err, MT_E_INVALID, "ratio interval: round %d has times %g / %g ms",
                           i, cand_ms[i], dflt_ms[i]);
        logs[i] = log(cand_ms[i] / dflt_ms[i]);
        sum += logs[i];
    }
    double *boot = malloc(sizeof(double) * TUNE_BOOTSTRAP_RESAMPLES);
    if (!boot)
        return mt_fail(err, MT_E_NOMEM, "ratio interval");
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    for (int b = 0; b < TUNE_BOOTSTRAP_RESAMPLES; b++) {
        double s = 0;
        for (int i = 0; i < n; i++)
            s += logs[mt_rng_below(&rng, (uint64_t)n)];
        boot[b] = s / n;
    }
    qsort(boot, TUNE_BOOTSTRAP_RESAMPLES, sizeof *boot, cmp_double);
    double alpha = 1 - level, mean = sum / n;
    /* The plain percentile interval is too narrow with few rounds (the
     * resampled spread is the n-divisor one); widen it around the mean by
     * sqrt(n / (n - 1)), the usual small-sample correction. */
    double widen = sqrt((double)n / (n - 1));
    double qlo = quantile(boot, TUNE_BOOTSTRAP_RESAMPLES, alpha / 2);
    double qhi = quantile(boot, TUNE_BOOTSTRAP_RESAMPLES, 1 - alpha / 2);
    out->ratio = exp(mean);
    out->lo = exp(mean + widen * (qlo - mean));
    out->hi = exp(mean + widen * (qhi - mean));
    out->level = level;
    out->rounds = n;
    free(boot);
    return MT_OK;
}

bool tune_interval_accepts(const tune_interval *iv) { return iv->rounds >= 2 && iv->hi < 1; }
