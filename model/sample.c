/* sample.c: the sampler, picking the next token from logits on the host:
 * the logit processing (logit bias, repetition, frequency and presence
 * penalties: model_sampler_process, over model_token_counts) and the pick
 * (model_sample: greedy, or temperature, top-k, min-p, top-p and a draw).
 *
 * Greedy (temperature <= 0): the largest logit, ties to the lower id.
 * Otherwise: logits / temperature; top-k keeps the k largest (ties to the
 * lower id); min-p drops tokens below min_p times the top probability;
 * top-p keeps the smallest prefix of the descending order whose probability
 * reaches p (at least one token); then one draw from the rng over the kept
 * tokens' renormalized probabilities. NaN and -inf logits are never picked
 * while another is left. Deterministic for a given rng state. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
 * first; +inf logits share all the weight), in double, then the min-p and
 * top-p cuts: returns how many are kept and their weight sum in *sum. */
static int32_t softmax_cut(const model_sampler *s, const cand *c, int32_t n, double *p,
                           double *sum)
{
    for (int32_t i = 0; i < n; i++)
        p[i] = isinf(c[0].v) && c[0].v > 0 ? (c[i].v == c[0].v ? 1.0 : 0.0)
                                            : exp((double)c[i].v - (double)c[0].v);
    /* min-p: p[0] is the top weight (1), so the cut is on the weights. */
    if (s->min_p > 0.0f)
        for (int32_t i = 1; i < n; i++)
            if (p[i] < (double)s->min_p) {
                n = i;
                break;
            }
    *sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        *sum += p[i];
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

/* The candidates of a sampled pick: logits / temperature without NaN and
 * -inf, sorted (largest first), cut to top-k. Returns the count (0: none
 * left, the caller falls back to the argmax). */
static int32_t candidates(const float *logits, int32_t vocab, const model_sampler *s, cand *c)
{
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; i++)
        if (!isnan(logits[i]) && !(isinf(logits[i]) && logits[i] < 0))
            c[n++] = (cand){logits[i] / s->temperature, i};
    qsort(c, (size_t)n, sizeof(cand), cand_cmp);
    if (s->top_k > 0 && s->top_k < n)
        n = s->top_k;
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
    int32_t n = candidates(logits, vocab, s, c);
    if (n == 0) {
        free(c);
        return argmax(logits, vocab);
    }
    /* Softmax over the kept tokens, in double, from the largest. */
    double *p = malloc(sizeof(double) * (size_t)n), sum = 0.0;
    if (!p) {
        int32_t id = c[0].id;
        free(c);
        return id;
    }
    n = softmax_cut(s, c, n, p, &sum);
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
    int32_t n = candidates(logits, vocab, s, c);
    if (n == 0) {
        probs[argmax(logits, vocab)] = 1.0;
        free(c);
        free(p);
        return true;
    }
    n = softmax_cut(s, c, n, p, &sum);
    for (int32_t i = 0; i < n; i++)
        probs[c[i].id] = p[i] / sum;
    free(c);
    free(p);
    return true;
}

/* ---- logit processing -------------------------------------------------------- */

mt_status model_token_counts_init(model_token_counts *c, int32_t vocab, const int32_t *prompt,
                                  int64_t n_prompt, mt_err *err)
{
    memset(c, 0, sizeof *c);
    c->vocab = vocab;
    c->count = calloc((size_t)vocab, sizeof *c->count);
    c->prompt = calloc((size_t)vocab, 1);
    if (!c->count || !c->prompt) {
        model_token_counts_release(c);
        return mt_fail(err, MT_E_NOMEM, "token counts for a vocabulary of %d", (int)vocab);
    }
    for (int64_t i = 0; i < n_prompt; i++) {
        int32_t id = prompt[i];
        if (id < 0 || id >= vocab) {
            model_token_counts_release(c);
            return mt_fail(err, MT_E_INVALID, "prompt token %lld is %d, outside [0, %d)",
                           (long long)i, (int)id, (int)vocab);
        }
        if (c->prompt[id])
            continue;
        if (c->n_ids == c->cap_ids) {
            int32_t cap = c->cap_ids ? c->cap_ids * 2 : 64;
            int32_t *p = realloc(c->ids, (size_t)cap * sizeof *p);
            if (!p) {
                model_token_counts_release(c);
                return mt_fail(err, MT_E_NOMEM, "token counts");
            }
            c->ids = p;
            c->cap_ids = cap;
        }
        c->prompt[id] = 1;
        c->ids[c->n_ids++] = id;
    }
    return MT_OK;
}

mt_status model_token_counts_add(model_token_counts *c, int32_t id, int delta)
{
    if (id < 0 || id >= c->vocab)
        return MT_OK;
    if (c->count[id] == 0 && !c->prompt[id] && delta > 0) {
        if (c->n_ids == c->cap_ids) {
            int32_t cap = c->cap_ids ? c->cap_ids * 2 : 64;
            int32_t *p = realloc(c->ids, (size_t)cap * sizeof *p);
            if (!p)
                return MT_E_NOMEM;
            c->ids = p;
            c->cap_ids = cap;
        }
        c->ids[c->n_ids++] = id; /* stays listed when its count drops back to 0 */
    }
    if (delta > 0)
        c->count[id] += (uint32_t)delta;
    else if (c->count[id] >= (uint32_t)-delta)
        c->count[id] -= (uint32_t)-delta;
    return MT_OK;
}

void model_token_counts_release(model_token_counts *c)
{
    free(c->count);
    free(c->prompt);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

static bool rep_on(const model_sampler *s)
{
    return s->repetition_penalty > 0.0f && s->repetition_penalty != 1.0f;
}

bool model_sampler_penalized(const model_sampler *s)
{
    return s && (rep_on(s) || s->presence_penalty != 0.0f || s->frequency_penalty != 0.0f);
}

void model_sampler_process(const model_sampler *s, const model_token_counts *counts,
                           float *logits, int32_t vocab)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_bias; i++)
        if (s->bias[i].id >= 0 && s->bias[i].id < vocab)
            logits[s->bias[i].id] += s->bias[i].bias;
    if (!counts || !model_sampler_penalized(s))
        return;
    bool rep = rep_on(s);
    for (int32_t k = 0; k < counts->n_ids; k++) {
        int32_t id = counts->ids[k];
        if (id >= vocab)
            continue;
        uint32_t n = counts->count[id];
        float x = logits[id];
        if (rep && (n > 0 || counts->prompt[id]))
            x = x > 0.0f ? x / s->repetition_penalty : x * s->repetition_penalty;
        if (n > 0)
            x -= s->frequency_penalty * (float)n + s->presence_penalty;
        logits[id] = x;
    }
}
