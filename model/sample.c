/* sample.c: model_sample, picking the next token from logits on the host.
 *
 * Greedy (temperature <= 0): the largest logit, ties to the lower id.
 * Otherwise: logits / temperature; top-k keeps the k largest (ties to the
 * lower id); top-p keeps the smallest prefix of the descending order whose
 * probability reaches p (at least one token); then one draw from the rng
 * over the kept tokens' renormalized probabilities. NaN logits are never
 * picked (a row of only NaN gives 0). Deterministic for a given rng state. */
#include <math.h>
#include <stdlib.h>

#include "runtime.h"
#include "spec.h"

typedef struct cand {
    float v;
    int32_t id;
} cand;

/* Descending by value, ascending id among equals. */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int32_t argmax(const float *logits, int32_t vocab)
{
    int32_t best = -1;
    for (int32_t i = 0; i < vocab; i++)
        if (!isnan(logits[i]) && (best < 0 || logits[i] > logits[best]))
            best = i;
    return best < 0 ? 0 : best;
}

/* Unnormalized softmax weights p[0..n) of the sorted candidates c (largest
 * first; +inf logits share all the weight), in double, then the top-p cut:
 * returns how many are kept and their weight sum in *sum. */
static int32_t softmax_top_p(const model_sampler *s, const cand *c, int32_t n, double *p,
                             double *sum)
{
    *sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        p[i] = isinf(c[0].v) && c[0].v > 0 ? (c[i].v == c[0].v ? 1.0 : 0.0)
                                            : exp((double)c[i].v - (double)c[0].v);
        *sum += p[i];
    }
    if (s->top_p > 0.0f && s->top_p < 1.0f) {
        double acc = 0.0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            acc += p[i] / *sum;
            if (acc >= (double)s->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        *sum = 0.0;
        for (int32_t i = 0; i < n; i++)
            *sum += p[i];
    }
    return n;
}

int32_t model_sample(const float *logits, int32_t vocab, const model_sampler *s, mt_rng *rng)
{
    if (vocab <= 0)
        return 0;
    if (!s || !(s->temperature > 0.0f) || s->top_k == 1)
        return argmax(logits, vocab);
    cand *c = malloc(sizeof(cand) * (size_t)vocab);
    if (!c)
        return argmax(logits, vocab);
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; i++)
        if (!isnan(logits[i]))
            c[n++] = (cand){logits[i] / s->temperature, i};
    if (n == 0) {
        free(c);
        return 0;
    }
    qsort(c, (size_t)n, sizeof(cand), cand_cmp);
    if (s->top_k > 0 && s->top_k < n)
        n = s->top_k;
    /* Softmax over the kept tokens, in double, from the largest. */
    double *p = malloc(sizeof(double) * (size_t)n), sum = 0.0;
    if (!p) {
        int32_t id = c[0].id;
        free(c);
        return id;
    }
    n = softmax_top_p(s, c, n, p, &sum);
    /* 53 random bits: a uniform double in [0, sum). */
    double u = (double)(mt_rng_u64(rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
    int32_t pick = c[n - 1].id;
    double acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += p[i];
        if (u < acc) {
            pick = c[i].id;
            break;
        }
    }
    free(p);
    free(c);
    return pick;
}

void model_logprobs(const float *logits, int32_t vocab, float temperature, int32_t chosen, int k,
                    float *chosen_lp, int32_t *top_ids, float *top_lps)
{
    double inv = temperature > 0.0f ? 1.0 / (double)temperature : 1.0;
    double m = -INFINITY;
    for (int32_t i = 0; i < vocab; i++)
        if (!isnan(logits[i]) && (double)logits[i] * inv > m)
            m = (double)logits[i] * inv;
    double sum = 0.0;
    if (isfinite(m))
        for (int32_t i = 0; i < vocab; i++)
            if (!isnan(logits[i]))
                sum += exp((double)logits[i] * inv - m);
    double lse = isfinite(m) ? m + log(sum) : m;
#define LP(i) (isnan(logits[i]) || !isfinite(lse) ? -INFINITY : (double)logits[i] * inv - lse)
    *chosen_lp = chosen >= 0 && chosen < vocab ? (float)LP(chosen) : -INFINITY;
    if (k > vocab)
        k = vocab;
    int have = 0;
    for (int32_t i = 0; i < vocab && k > 0; i++) {
        float v = (float)LP(i);
        if (have == k && !(v > top_lps[k - 1]))
            continue; /* not above the k-th (ties keep the lower id) */
        int at = have < k ? have++ : k - 1;
        while (at > 0 && v > top_lps[at - 1]) {
            top_lps[at] = top_lps[at - 1];
            top_ids[at] = top_ids[at - 1];
            at--;
        }
        top_lps[at] = v;
        top_ids[at] = i;
    }
#undef LP
}

/* The same steps as model_sample, stopping before the draw. */
bool model_sampler_probs(const float *logits, int32_t vocab, const model_sampler *s,
                         double *probs)
{
    for (int32_t i = 0; i < vocab; i++)
        probs[i] = 0.0;
    if (vocab <= 0)
        return true;
    if (!s || !(s->temperature > 0.0f) || s->top_k == 1) {
        probs[argmax(logits, vocab)] = 1.0;
        return true;
    }
    cand *c = malloc(sizeof(cand) * (size_t)vocab);
    double *p = malloc(sizeof(double) * (size_t)vocab), sum = 0.0;
    if (!c || !p) {
        free(c);
        free(p);
        return false;
    }
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; i++)
        if (!isnan(logits[i]))
            c[n++] = (cand){logits[i] / s->temperature, i};
    if (n == 0) {
        probs[0] = 1.0;
        free(c);
        free(p);
        return true;
    }
    qsort(c, (size_t)n, sizeof(cand), cand_cmp);
    if (s->top_k > 0 && s->top_k < n)
        n = s->top_k;
    n = softmax_top_p(s, c, n, p, &sum);
    for (int32_t i = 0; i < n; i++)
        probs[c[i].id] = p[i] / sum;
    free(c);
    free(p);
    return true;
}
