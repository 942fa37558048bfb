/* tune_forest.c: a small random forest regressor and the expected
 * improvement, the surrogate of the model-guided search (tune_forest.h). */
#define _GNU_SOURCE /* qsort_r */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "tune_forest.h"

#define MAX_DEPTH 16

typedef struct node {
    int feature;      /* -1: leaf */
    double threshold; /* go left when x[feature] <= threshold */
    double value;     /* leaf: mean target */
    int left, right;
} node;

typedef struct tree {
    node *nodes;
    int n, cap;
} tree;

struct tune_forest {
    int d, n_trees;
    tree *trees;
};

typedef struct fit_ctx {
    const double *x, *y;
    int d;
    mt_rng rng;
    int *order;       /* scratch: sample indices sorted by a feature */
} fit_ctx;

static int new_node(tree *t)
{
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 64;
        node *g = realloc(t->nodes, sizeof *g * (size_t)cap);
        if (!g)
            return -1;
        t->nodes = g;
        t->cap = cap;
    }
    t->nodes[t->n] = (node){.feature = -1};
    return t->n++;
}

typedef struct sort_key {
    const double *x;
    int f, d;
} sort_key;

static int cmp_by_feature(const void *a, const void *b, void *arg)
{
    const sort_key *k = arg;
    double u = k->x[*(const int *)a * k->d + k->f];
    double v = k->x[*(const int *)b * k->d + k->f];
    return u < v ? -1 : u > v;
}

/* Grows the subtree over idx[0..n) (sample indices, repeats allowed) into
 * node id; returns false on allocation failure. */
static bool grow(fit_ctx *c, tree *t, int id, int *idx, int n, int depth)
{
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += c->y[idx[i]];
    double mean = sum / n;
    t->nodes[id].value = mean;
    if (n < 2 || depth >= MAX_DEPTH)
        return true;
    /* A random half of the features (at least one), in random order. */
    int feats[TUNE_FOREST_MAX_FEATURES];
    for (int f = 0; f < c->d; f++)
        feats[f] = f;
    for (int f = c->d - 1; f > 0; f--) {
        int j = (int)mt_rng_below(&c->rng, (uint64_t)f + 1);
        int tmp = feats[f];
        feats[f] = feats[j];
        feats[j] = tmp;
    }
    int tries = c->d;
    double best_gain = 1e-12, best_thr = 0;
    int best_f = -1;
    double total_sq = 0;
    for (int i = 0; i < n; i++)
        total_sq += (c->y[idx[i]] - mean) * (c->y[idx[i]] - mean);
    for (int k = 0; k < c->d; k++) {
        int f = feats[k];
        /* After the half is spent, keep looking only until a split exists. */
        if (k >= tries && best_f >= 0)
            break;
        memcpy(c->order, idx, sizeof *idx * (size_t)n);
        sort_key sk = {c->x, f, c->d};
        qsort_r(c->order, (size_t)n, sizeof *c->order, cmp_by_feature, &sk);
        double ls = 0, lsq = 0, rs = sum, rsq = 0;
        for (int i = 0; i < n; i++)
            rsq += c->y[c->order[i]] * c->y[c->order[i]];
        for (int i = 0; i < n - 1; i++) {
            double v = c->y[c->order[i]];
            ls += v;
            lsq += v * v;
            rs -= v;
            rsq -= v * v;
            double a = c->x[c->order[i] * c->d + f], b = c->x[c->order[i + 1] * c->d + f];
            if (a == b)
                continue;
            int nl = i + 1, nr = n - nl;
            double sse = (lsq - ls * ls / nl) + (rsq - rs * rs / nr);
            double gain = total_sq - sse;
            if (gain > best_gain) {
                best_gain = gain;
                best_f = f;
                best_thr = (a + b) / 2;
            }
        }
    }
    if (best_f < 0)
        return true;
    /* Partition idx in place. */
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        if (c->x[idx[lo] * c->d + best_f] <= best_thr)
            lo++;
        else {
            int tmp = idx[lo];
            idx[lo] = idx[hi];
            idx[hi--] = tmp;
        }
    }
    int l = new_node(t), r = new_node(t);
    if (l < 0 || r < 0)
        return false;
    t->nodes[id].feature = best_f;
    t->nodes[id].threshold = best_thr;
    t->nodes[id].left = l;
    t->nodes[id].right = r;
    return grow(c, t, l, idx, lo, depth + 1) && grow(c, t, r, idx + lo, n - lo, depth + 1);
}

mt_status tune_forest_fit(const double *x, const double *y, int n, int d, int n_trees,
                          uint64_t seed, tune_forest **out, mt_err *err)
{
    *out = NULL;
    if (n < 1 || d < 1 || d > TUNE_FOREST_MAX_FEATURES || n_trees < 1 || n_trees > 256)
        return mt_fail(err, MT_E_INVALID, "forest: %d samples, %d features, %d trees", n, d,
                       n_trees);
    for (int i = 0; i < n; i++) {
        bool finite = isfinite(y[i]);
        for (int f = 0; f < d; f++)
            finite = finite && isfinite(x[i * d + f]);
        if (!finite)
            return mt_fail(err, MT_E_INVALID, "forest: sample %d is not finite", i);
    }
    tune_forest *fo = calloc(1, sizeof *fo);
    fit_ctx c = {x, y, d, {{0}}, malloc(sizeof(int) * (size_t)n)};
    int *idx = malloc(sizeof(int) * (size_t)n);
    if (fo)
        fo->trees = calloc((size_t)n_trees, sizeof *fo->trees);
    if (!fo || !fo->trees || !c.order || !idx)
        goto nomem;
    fo->d = d;
    fo->n_trees = n_trees;
    mt_rng_seed(&c.rng, seed);
    for (int t = 0; t < n_trees; t++) {
        /* The first tree sees every sample once, so a lone tree (and the
         * mean) never misses an observation; the rest are bootstraps. */
        for (int i = 0; i < n; i++)
            idx[i] = t == 0 ? i : (int)mt_rng_below(&c.rng, (uint64_t)n);
        if (new_node(&fo->trees[t]) < 0 || !grow(&c, &fo->trees[t], 0, idx, n, 0))
            goto nomem;
    }
    free(idx);
    free(c.order);
    *out = fo;
    return MT_OK;
nomem:
    free(idx);
    free(c.order);
    tune_forest_destroy(fo);
    return mt_fail(err, MT_E_NOMEM, "forest of %d trees over %d samples", n_trees, n);
}

void tune_forest_destroy(tune_forest *f)
{
    if (!f)
        return;
    for (int t = 0; f->trees && t < f->n_trees; t++)
        free(f->trees[t].nodes);
    free(f->trees);
    free(f);
}

void tune_forest_predict(const tune_forest *f, const double *x, double *mean, double *sd)
{
    double s = 0, sq = 0;
    for (int t = 0; t < f->n_trees; t++) {
        const node *nd = f->trees[t].nodes;
        int i = 0;
        while (nd[i].feature >= 0)
            i = x[nd[i].feature] <= nd[i].threshold ? nd[i].left : nd[i].right;
        s += nd[i].value;
        sq += nd[i].value * nd[i].value;
    }
    double m = s / f->n_trees;
    *mean = m;
    if (sd) {
        double var = sq / f->n_trees - m * m;
        *sd = var > 0 ? sqrt(var) : 0;
    }
}

double tune_expected_improvement(double mean, double sd, double best)
{
    if (!(sd > 0))
        return best > mean ? best - mean : 0;
    double z = (best - mean) / sd;
    double pdf = exp(-0.5 * z * z) / sqrt(2 * M_PI);
    double cdf = 0.5 * erfc(-z / sqrt(2));
    return (best - mean) * cdf + sd * pdf;
}
