/* model_ab.c: paired, interleaved timing of two kernel selections of one
 * model (see model_ab.h). */
#include "model_ab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

/* One pass: prefill then decode on a fresh sequence; times in ms. */
static mt_status pass(model_runtime *rt, const int32_t *tok, int n, int d, float *lg,
                      double *pre_ms, double *dec_ms, mt_err *err)
{
    int seq;
    mt_status st = model_seq_create(rt, &seq, err);
    if (st != MT_OK)
        return st;
    model_step_item it = {.seq = seq, .tokens = tok, .n_tokens = n, .logits = lg, .n_prompt = n};
    double t0 = mt_now_ms();
    st = model_step(rt, &it, 1, err);
    double t1 = mt_now_ms();
    for (int i = 0; i < d && st == MT_OK; i++) {
        model_step_item one = {.seq = seq, .tokens = tok + (i % n), .n_tokens = 1, .logits = lg};
        st = model_step(rt, &one, 1, err);
    }
    double t2 = mt_now_ms();
    model_seq_free(rt, seq);
    *pre_ms = t1 - t0 > 1e-6 ? t1 - t0 : 1e-6;
    *dec_ms = t2 - t1 > 1e-6 ? t2 - t1 : 1e-6;
    return st;
}

static int cmp_d(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(const double *v, int n)
{
    double *c = malloc(sizeof *c * (size_t)n);
    if (!c)
        return v[0];
    memcpy(c, v, sizeof *c * (size_t)n);
    qsort(c, (size_t)n, sizeof *c, cmp_d);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

/* b's speedup over a from paired times (time ratio b/a inverted). */
static mt_status phase(const double *a_ms, const double *b_ms, int n, double tokens,
                       const model_ab_opts *o, uint64_t seed, model_ab_phase *p, mt_err *err)
{
    tune_interval iv;
    mt_status st = tune_ratio_interval(b_ms, a_ms, n, o->level, seed, &iv, err);
    if (st != MT_OK)
        return st;
    p->a_tps = tokens / (median(a_ms, n) / 1000.0);
    p->b_tps = tokens / (median(b_ms, n) / 1000.0);
    p->speedup = 1.0 / iv.ratio;
    p->lo = 1.0 / iv.hi;
    p->hi = 1.0 / iv.lo;
    p->b_faster = p->lo > 1.0;
    p->b_slower = p->hi < 1.0;
    return MT_OK;
}

mt_status model_ab_compare(model_runtime *a, model_runtime *b, const int32_t *tok, int n_prompt,
                           int n_dec, const model_ab_opts *o, model_ab_result *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    model_ab_opts d = {.rounds = 10, .level = 0.95, .seed = 1};
    if (o) {
        d.rounds = o->rounds ? o->rounds : d.rounds;
        d.level = o->level > 0 ? o->level : d.level;
        d.seed = o->seed;
    }
    if (d.rounds < 2 || d.rounds > TUNE_CONFIRM_MAX_ROUNDS || n_prompt < 1 || n_dec < 1 ||
        model_runtime_vocab(a) != model_runtime_vocab(b))
        return mt_fail(err, MT_E_INVALID, "model A/B: %d rounds (2..%d), %d prompt and %d "
                       "decode tokens (>= 1), vocabularies %d and %d", d.rounds,
                       TUNE_CONFIRM_MAX_ROUNDS, n_prompt, n_dec, (int)model_runtime_vocab(a),
                       (int)model_runtime_vocab(b));
    float *lg = malloc(sizeof(float) * (size_t)model_runtime_vocab(a));
    double *t = malloc(sizeof(double) * 4 * (size_t)d.rounds);
    if (!lg || !t) {
        free(lg);
        free(t);
        return mt_fail(err, MT_E_NOMEM, "model A/B");
    }
    double *ap = t, *ad = t + d.rounds, *bp = t + 2 * d.rounds, *bd = t + 3 * d.rounds, x, y;
    /* warm-up: first-touch of weights, caches, scratch growth */
    mt_status st = pass(a, tok, n_prompt, n_dec, lg, &x, &y, err);
    if (st == MT_OK)
        st = pass(b, tok, n_prompt, n_dec, lg, &x, &y, err);
    for (int r = 0; r < d.rounds && st == MT_OK; r++) {
        bool a_first = r % 2 == 0;
        st = pass(a_first ? a : b, tok, n_prompt, n_dec, lg, a_first ? &ap[r] : &bp[r],
                  a_first ? &ad[r] : &bd[r], err);
        if (st == MT_OK)
            st = pass(a_first ? b : a, tok, n_prompt, n_dec, lg, a_first ? &bp[r] : &ap[r],
                      a_first ? &bd[r] : &ad[r], err);
    }
    if (st == MT_OK)
        st = phase(ap, bp, d.rounds, n_prompt, &d, d.seed, &out->prefill, err);
    if (st == MT_OK)
        st = phase(ad, bd, d.rounds, n_dec, &d, d.seed + 1, &out->decode, err);
    out->rounds = d.rounds;
    out->level = d.level;
    free(lg);
    free(t);
    return st == MT_OK ? MT_OK : mt_err_prefix(err, "model A/B");
}

void model_ab_phase_text(const model_ab_phase *p, double level, char *buf, size_t cap)
{
    snprintf(buf, cap, "%.2fx [%.2f, %.2f] (%s at %.0f%%)", p->speedup, p->lo, p->hi,
             p->b_faster ? "faster" : p->b_slower ? "slower" : "not different", level * 100);
}
