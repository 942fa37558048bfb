/* spec.c: speculative decoding's acceptance rules and draft rounds
 * (spec.h) over the runtime's model_step / model_mtp_step. */
#include "spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

mt_status model_spec_seq_init(model_spec_seq *s, int seq, int k, int32_t vocab,
                              const model_sampler *sampler, mt_rng *rng, mt_err *err)
{
    memset(s, 0, sizeof *s);
    if (k < 0 || k > MODEL_SPEC_MAX_STEPS)
        return mt_fail(err, MT_E_INVALID, "speculative steps %d: 0 to %d", k,
                       MODEL_SPEC_MAX_STEPS);
    s->seq = seq;
    s->k = k;
    s->vocab = vocab;
    s->sampler = sampler ? *sampler : (model_sampler){.top_p = 1.0f};
    s->rng = rng;
    s->logits = malloc(sizeof(float) * (size_t)vocab * (MODEL_SPEC_MAX_STEPS + 1));
    s->q = malloc(sizeof(double) * (size_t)vocab * MODEL_SPEC_MAX_STEPS);
    if (!s->logits || !s->q) {
        model_spec_seq_release(s);
        return mt_fail(err, MT_E_NOMEM, "speculative decoding buffers (vocab %d)", (int)vocab);
    }
    return MT_OK;
}

void model_spec_seq_release(model_spec_seq *s)
{
    free(s->logits);
    free(s->q);
    s->logits = NULL;
    s->q = NULL;
}

int model_spec_verify_tokens(const model_spec_seq *s, int32_t last, int32_t *buf)
{
    buf[0] = last;
    for (int i = 0; i < s->n_draft; i++)
        buf[1 + i] = s->draft[i];
    return 1 + s->n_draft;
}

static bool greedy(const model_sampler *s) { return !(s->temperature > 0.0f) || s->top_k == 1; }

int32_t model_sample_probs(const double *probs, int32_t vocab, mt_rng *rng)
{
    double sum = 0.0;
    int32_t last = 0;
    for (int32_t i = 0; i < vocab; i++)
        if (probs[i] > 0.0) {
            sum += probs[i];
            last = i;
        }
    if (!(sum > 0.0))
        return 0;
    double u = (double)(mt_rng_u64(rng) >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0.0;
    for (int32_t i = 0; i < vocab; i++)
        if (probs[i] > 0.0) {
            acc += probs[i];
            if (u < acc)
                return i;
        }
    return last;
}

int32_t model_spec_resolve(const double *p, const double *q, int32_t vocab, int32_t d,
                           mt_rng *rng, bool *accepted)
{
    double u = (double)(mt_rng_u64(rng) >> 11) * (1.0 / 9007199254740992.0);
    /* Accept with probability min(1, p/q): u < p/q without dividing. */
    if (q[d] > 0.0 && u * q[d] < p[d]) {
        *accepted = true;
        return d;
    }
    *accepted = false;
    double *r = malloc(sizeof(double) * (size_t)vocab), sum = 0.0;
    if (!r)
        return model_sample_probs(p, vocab, rng);
    for (int32_t i = 0; i < vocab; i++) {
        r[i] = p[i] > q[i] ? p[i] - q[i] : 0.0;
        sum += r[i];
    }
    /* p == q up to rounding: nothing left over, p itself is the answer. */
    int32_t t = sum > 0.0 ? model_sample_probs(r, vocab, rng) : model_sample_probs(p, vocab, rng);
    free(r);
    return t;
}

static int32_t argmax_row(const float *x, int32_t vocab)
{
    int32_t best = -1;
    for (int32_t i = 0; i < vocab; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best]))
            best = i;
    return best < 0 ? 0 : best;
}

/* The caller's processing of a row, after the drafts before it. */
static mt_status proc_row(const model_spec_seq *s, int drafts_before, float *row, mt_err *err)
{
    if (!s->proc.fn)
        return MT_OK;
    return s->proc.fn(s->proc.ctx, s->gen, s->n_gen, s->draft, drafts_before, row, err);
}

mt_status model_spec_accept(model_runtime *rt, model_spec_seq *s, int64_t len_before,
                            mt_err *err)
{
    int32_t V = s->vocab;
    int n = 0;
    s->n_out = 0;
    mt_status st;
    if (greedy(&s->sampler)) {
        for (; n < s->n_draft; n++) {
            if ((st = proc_row(s, n, s->logits + (size_t)n * (size_t)V, err)) != MT_OK)
                return st;
            int32_t t = argmax_row(s->logits + (size_t)n * (size_t)V, V);
            s->out[n] = t;
            if (t != s->draft[n])
                break;
        }
        if (n == s->n_draft) {
            if ((st = proc_row(s, n, s->logits + (size_t)n * (size_t)V, err)) != MT_OK)
                return st;
            s->out[n] = argmax_row(s->logits + (size_t)n * (size_t)V, V);
        }
    } else {
        double *p = malloc(sizeof(double) * (size_t)V);
        if (!p)
            return mt_fail(err, MT_E_NOMEM, "speculative sampling");
        bool acc = true;
        for (; n < s->n_draft && acc; ) {
            if ((st = proc_row(s, n, s->logits + (size_t)n * (size_t)V, err)) != MT_OK) {
                free(p);
                return st;
            }
            if (!model_sampler_probs(s->logits + (size_t)n * (size_t)V, V, &s->sampler, p)) {
                free(p);
                return mt_fail(err, MT_E_NOMEM, "speculative sampling");
            }
            s->out[n] = model_spec_resolve(p, s->q + (size_t)n * (size_t)V, V, s->draft[n], s->rng,
                                           &acc);
            if (acc)
                n++;
        }
        if (acc) { /* every draft kept: one more token from the last row */
            if ((st = proc_row(s, n, s->logits + (size_t)n * (size_t)V, err)) != MT_OK) {
                free(p);
                return st;
            }
            if (!model_sampler_probs(s->logits + (size_t)n * (size_t)V, V, &s->sampler, p)) {
                free(p);
                return mt_fail(err, MT_E_NOMEM, "speculative sampling");
            }
            s->out[n] = model_sample_probs(p, V, s->rng);
        }
        free(p);
    }
    s->n_out = n + 1;
    s->rounds++;
    s->drafted += s->n_draft;
    s->accepted += n;
    s->n_draft = 0;
    return model_seq_truncate(rt, s->seq, len_before + s->n_out, err);
}

/* The next draft from an MTP step's logits (processed here, in place) into
 * s->draft / s->q. */
static mt_status take_draft(model_spec_seq *s, float *logits, mt_err *err)
{
    int j = s->n_draft;
    double *q = s->q + (size_t)j * (size_t)s->vocab;
    mt_status st = proc_row(s, j, logits, err);
    if (st != MT_OK)
        return st;
    if (greedy(&s->sampler)) {
        s->draft[j] = argmax_row(logits, s->vocab);
    } else {
        if (!model_sampler_probs(logits, s->vocab, &s->sampler, q))
            return mt_fail(err, MT_E_NOMEM, "draft distribution");
        s->draft[j] = model_sample_probs(q, s->vocab, s->rng);
    }
    s->n_draft = j + 1;
    return MT_OK;
}

mt_status model_spec_draft(model_runtime *rt, model_spec_catchup *items, int n, mt_err *err)
{
    if (n <= 0)
        return MT_OK;
    model_mtp_item *mi = malloc(sizeof *mi * (size_t)n);
    model_spec_seq **who = malloc(sizeof *who * (size_t)n);
    int *row = malloc(sizeof(int) * (size_t)n);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    float *lg = NULL;
    mt_status st = MT_OK;
    if (!mi || !who || !row || !tok) {
        st = mt_fail(err, MT_E_NOMEM, "draft step");
        goto done;
    }
    int32_t V = items[0].s->vocab;
    lg = malloc(sizeof(float) * (size_t)V * (size_t)n);
    if (!lg) {
        st = mt_fail(err, MT_E_NOMEM, "draft logits");
        goto done;
    }
    /* Catch-up: every item whose MTP cache reaches its start. */
    int m = 0, rows = 0;
    for (int i = 0; i < n; i++) {
        model_spec_seq *s = items[i].s;
        s->n_draft = 0;
        if (s->mtp_behind)
            continue;
        int64_t have = model_mtp_len(rt, s->seq);
        if (have < items[i].start) {
            s->mtp_behind = true;
            continue;
        }
        if (have > items[i].start &&
            (st = model_mtp_truncate(rt, s->seq, items[i].start, err)) != MT_OK)
            goto done;
        bool d = items[i].draft && s->k > 0;
        mi[m] = (model_mtp_item){s->seq, items[i].next, items[i].n, items[i].hidden_row,
                                 d ? lg + (size_t)m * (size_t)V : NULL};
        who[m] = d ? s : NULL;
        row[m] = rows + items[i].n - 1;
        rows += items[i].n;
        m++;
    }
    if (m && (st = model_mtp_step(rt, mi, m, err)) != MT_OK)
        goto done;
    /* Draft steps: the items still drafting, each from its own last row. */
    while (m) {
        int m2 = 0;
        for (int i = 0; i < m; i++) {
            model_spec_seq *s = who[i];
            if (!s)
                continue;
            if ((st = take_draft(s, lg + (size_t)i * (size_t)V, err)) != MT_OK)
                goto done;
            if (s->n_draft >= s->k)
                continue;
            tok[m2] = s->draft[s->n_draft - 1];
            who[m2] = s;
            row[m2] = row[i];
            m2++;
        }
        /* who/row are compacted in place: i >= m2 always. */
        for (int i = 0; i < m2; i++)
            mi[i] = (model_mtp_item){who[i]->seq, &tok[i], 1, row[i], lg + (size_t)i * (size_t)V};
        m = m2;
        if (m && (st = model_mtp_step(rt, mi, m, err)) != MT_OK)
            goto done;
        for (int i = 0; i < m; i++)
            row[i] = i;
    }
done:
    if (st != MT_OK)
        for (int i = 0; i < n; i++)
            items[i].s->n_draft = 0;
    free(mi);
    free(who);
    free(row);
    free(tok);
    free(lg);
    return st;
}

/* ---- one sequence ------------------------------------------------------------ */

static bool is_eos(const model_spec_gen_opts *o, int32_t t)
{
    for (int i = 0; i < o->n_eos; i++)
        if (o->eos[i] == t)
            return true;
    return false;
}

mt_status model_spec_generate(model_runtime *rt, int seq, const int32_t *prompt, int64_t n,
                              const model_spec_gen_opts *o, int32_t *out, int *produced,
                              model_spec_seq *stats, mt_err *err)
{
    *produced = 0;
    if (n < 1 || o->max_tokens < 1)
        return mt_fail(err, MT_E_INVALID, "generate: %lld prompt tokens, %d to generate",
                       (long long)n, o->max_tokens);
    if (o->k > 0 && !model_runtime_has_mtp(rt))
        return mt_fail(err, MT_E_UNSUPPORTED, "generate: %d speculative steps, but the runtime "
                       "has no MTP layer loaded (speculative_steps 0)", o->k);
    int32_t V = model_runtime_vocab(rt);
    model_spec_seq s;
    mt_status st = model_spec_seq_init(&s, seq, o->k, V, &o->sampler, o->rng, err);
    if (st != MT_OK)
        return st;
    s.proc = o->proc;
    s.gen = out;
    int chunk_max = o->prefill_chunk > 0 ? o->prefill_chunk : 256;
    int32_t *next = malloc(sizeof(int32_t) * (size_t)(chunk_max + 1));
    int32_t buf[MODEL_SPEC_MAX_STEPS + 1];
    if (!next) {
        st = mt_fail(err, MT_E_NOMEM, "generate");
        goto done;
    }
    /* The prompt; the MTP layer follows each chunk with the token after
     * each position (the last chunk's last one is the first output). */
    for (int64_t p = 0; p < n && st == MT_OK;) {
        int c = n - p > chunk_max ? chunk_max : (int)(n - p);
        model_step_item it = {.seq = seq, .tokens = prompt + p, .n_tokens = c,
                              .logits = s.logits, .n_prompt = c};
        if ((st = model_step(rt, &it, 1, err)) != MT_OK)
            break;
        bool last = p + c == n;
        if (last) {
            if (o->proc.fn && (st = o->proc.fn(o->proc.ctx, out, 0, NULL, 0, s.logits, err)))
                break;
            out[(*produced)++] = model_sample(s.logits, V, &o->sampler, o->rng);
        }
        if (o->k > 0) {
            s.n_gen = *produced;
            memcpy(next, prompt + p + 1, sizeof(int32_t) * (size_t)(c - 1));
            next[c - 1] = last ? out[0] : prompt[p + c];
            model_spec_catchup cu = {&s, next, c, 0, p, last};
            st = model_spec_draft(rt, &cu, 1, err);
        }
        p += c;
    }
    int64_t max_ctx = model_runtime_max_context(rt);
    while (st == MT_OK && *produced < o->max_tokens && !is_eos(o, out[*produced - 1])) {
        int64_t len = model_seq_len(rt, seq);
        int room = o->max_tokens - *produced - 1;
        if (len + 1 > max_ctx)
            break;
        if (max_ctx - len - 1 < room)
            room = (int)(max_ctx - len - 1);
        if (s.n_draft > room)
            s.n_draft = room;
        int nt = model_spec_verify_tokens(&s, out[*produced - 1], buf);
        /* Generated tokens (n_prompt 0): the absorbed path of a plain decode
         * step, whatever the number of drafts (runtime.h). */
        model_step_item it = {.seq = seq, .tokens = buf, .n_tokens = nt, .all_logits = s.logits};
        if ((st = model_step(rt, &it, 1, err)) != MT_OK)
            break;
        if (o->k == 0) { /* plain decoding */
            if (o->proc.fn &&
                (st = o->proc.fn(o->proc.ctx, out, *produced, NULL, 0, s.logits, err)))
                break;
            out[(*produced)++] = model_sample(s.logits, V, &o->sampler, o->rng);
            continue;
        }
        s.n_gen = *produced;
        if ((st = model_spec_accept(rt, &s, len, err)) != MT_OK)
            break;
        bool stop = false;
        for (int i = 0; i < s.n_out && !stop; i++) {
            out[(*produced)++] = s.out[i];
            stop = is_eos(o, s.out[i]);
        }
        if (stop || *produced >= o->max_tokens)
            break;
        model_spec_catchup cu = {&s, s.out, s.n_out, 0, len, true};
        s.n_gen = *produced;
        st = model_spec_draft(rt, &cu, 1, err);
    }
done:
    if (stats) {
        stats->rounds = s.rounds;
        stats->drafted = s.drafted;
        stats->accepted = s.accepted;
    }
    free(next);
    model_spec_seq_release(&s);
    return st;
}
