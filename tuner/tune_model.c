/* tune_model.c: the proposal step of `--strategy model` (tune_impl.h): fit
 * the random-forest surrogate (tune_forest.h) to the configs measured so far
 * and pick the next candidates by expected improvement of the log time.
 *
 * Features are each parameter's index among its allowed values (the order
 * the family lists them in), so a tree splits "tile <= 32" the same way at
 * any scale. Targets are log(median ms): ratios, not milliseconds, decide.
 * A config that failed (wrong result, crash, invalid) is taught as four
 * times slower than the slowest ok one, so the model steers away from its
 * region without one failure dominating the fit. A batch is picked with a
 * "constant liar": after each pick the model is refitted with the pick's
 * own predicted time added, which lowers its uncertainty there, so the
 * next pick goes elsewhere instead of next door. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tune_forest.h"
#include "tune_impl.h"

#define MODEL_TREES 32
#define FAIL_PENALTY_LOG 1.3862943611198906 /* log(4) */

static void features(const kern_impl *im, const kern_config *c, double *x)
{
    for (int p = 0; p < im->n_params; p++) {
        const kern_param_desc *d = &im->params[p];
        int k = 0;
        while (k < d->n_values && d->values[k] != c->v[p])
            k++;
        x[p] = k;
    }
}

int tune_model_pick(const kern_impl *im, const tune_model_obs *obs, int n_obs,
                    const kern_config *cands, int n_cands, int want, uint64_t seed, int *chosen)
{
    int d = im->n_params;
    if (want <= 0 || n_cands <= 0 || n_obs <= 0 || d < 1 || d > TUNE_FOREST_MAX_FEATURES)
        return 0;
    if (want > n_cands)
        want = n_cands;
    int cap = n_obs + want;
    double *x = malloc(sizeof *x * (size_t)cap * (size_t)d);
    double *y = malloc(sizeof *y * (size_t)cap);
    double *cx = malloc(sizeof *cx * (size_t)n_cands * (size_t)d);
    bool *taken = calloc((size_t)n_cands, sizeof *taken);
    int n = 0, picked = 0;
    if (!x || !y || !cx || !taken)
        goto out;
    double worst = -INFINITY;
    for (int i = 0; i < n_obs; i++)
        if (isfinite(obs[i].ms) && obs[i].ms > 0 && log(obs[i].ms) > worst)
            worst = log(obs[i].ms);
    for (int i = 0; i < n_obs; i++) {
        bool ok = isfinite(obs[i].ms) && obs[i].ms > 0;
        if (!ok && !isfinite(worst))
            continue; /* nothing ok yet: a failure has no scale */
        features(im, &obs[i].cfg, &x[n * d]);
        y[n++] = ok ? log(obs[i].ms) : worst + FAIL_PENALTY_LOG;
    }
    if (n == 0)
        goto out;
    double best = INFINITY;
    for (int i = 0; i < n; i++)
        best = y[i] < best ? y[i] : best;
    for (int j = 0; j < n_cands; j++)
        features(im, &cands[j], &cx[j * d]);
    for (; picked < want; picked++) {
        tune_forest *f = NULL;
        if (tune_forest_fit(x, y, n, d, MODEL_TREES, seed + (uint64_t)picked, &f, NULL) != MT_OK)
            break;
        int arg = -1;
        double top = -1, top_mean = 0;
        for (int j = 0; j < n_cands; j++) {
            if (taken[j])
                continue;
            double mean, sd;
            tune_forest_predict(f, &cx[j * d], &mean, &sd);
            double ei = tune_expected_improvement(mean, sd, best);
            /* Ties (often all zero once the model is sure) go to the
             * lower prediction. */
            if (ei > top || (ei == top && mean < top_mean)) {
                top = ei;
                top_mean = mean;
                arg = j;
            }
        }
        tune_forest_destroy(f);
        if (arg < 0)
            break;
        taken[arg] = true;
        chosen[picked] = arg;
        memcpy(&x[n * d], &cx[arg * d], sizeof *x * (size_t)d);
        y[n++] = top_mean; /* the constant liar */
    }
out:
    free(x);
    free(y);
    free(cx);
    free(taken);
    return picked;
}
