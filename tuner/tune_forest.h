/* tune_forest.h: the surrogate of the model-guided search (`--strategy
 * model`): a random forest of regression trees fitted to the trials so far
 * (features: each parameter's index among its allowed values; target: the
 * log of the median time), and the expected-improvement acquisition that
 * ranks untried configs by it. Internal to the tuner; plain C, no library.
 *
 * Each tree is grown on a bootstrap resample of the samples, splitting at
 * every node on the feature and threshold (a midpoint between two observed
 * values) that most reduce the squared error, over a random half of the
 * features; a node with fewer than 2 samples or of one value is a leaf. The
 * prediction is the mean over trees and its spread the standard deviation
 * over trees (the usual random-forest uncertainty, as SMAC uses it).
 *
 * Cost: fit O(trees * n log n * d * depth), predict O(trees * depth).
 * Thread safety: a forest is read-only after the fit; predict is reentrant. */
#ifndef MT_TUNE_FOREST_H
#define MT_TUNE_FOREST_H

#include <stdint.h>

#include "common/status.h"

#define TUNE_FOREST_MAX_FEATURES 16

typedef struct tune_forest tune_forest;

/* Fits n_trees trees to n samples (x: n rows of d features, row-major; y:
 * targets), 1 <= n, 1 <= d <= TUNE_FOREST_MAX_FEATURES, 1 <= n_trees <= 256,
 * from seed (the same data and seed give the same forest). x and y are
 * copied as needed and not kept. MT_E_INVALID for bad sizes or a
 * non-finite value, MT_E_NOMEM; *out is NULL on failure. */
mt_status tune_forest_fit(const double *x, const double *y, int n, int d, int n_trees,
                          uint64_t seed, tune_forest **out, mt_err *err);
void tune_forest_destroy(tune_forest *f); /* NULL is a no-op */

/* Mean and standard deviation over the trees of the prediction at x (d
 * features). sd may be NULL. */
void tune_forest_predict(const tune_forest *f, const double *x, double *mean, double *sd);

/* Expected improvement below `best` (minimisation) of a normal prediction
 * (mean, sd): E[max(best - Y, 0)]; with sd <= 0, max(best - mean, 0). */
double tune_expected_improvement(double mean, double sd, double best);

#endif
