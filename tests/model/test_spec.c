/* test_spec.c: MTP speculative decoding in the runtime (spec.h): greedy
 * output with speculation is token-for-token the plain output under
 * batch-invariant kernels (12 prompts of mixed lengths; test_serve_spec
 * runs 20 through the server), oracle drafts with planted errors keep
 * exactly the right prefix, the next-token-map checkpoint's drafts are
 * accepted, rollback never changes a page shared
 * with a fork, and speculative sampling draws from the target distribution
 * (chi-square on a small vocabulary). */
#include "model/spec.h"
#include "test_forward_util.h"

static model_runtime *spec_open(const char *dir, int steps)
{
    static FILE *quiet;
    if (!quiet)
        quiet = fopen("/dev/null", "w");
    model_runtime_opts o = {.model_dir = dir, .device = "cpu", .kv_pages = 96,
                            .max_batch_tokens = 64, .batch_invariant = true,
                            .speculative_steps = steps, .log = quiet};
    model_runtime *rt = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_runtime_open(&o, &rt, &err), MT_OK, "open %s: %s", dir, err.msg);
    return rt;
}

/* Generates from prompt on a fresh sequence with k drafts per round. */
static int spec_run(model_runtime *rt, const int32_t *prompt, int n, int k, int max_tokens,
                    bool stop_at_eos, int32_t *out, model_spec_seq *stats)
{
    int32_t eos[8];
    int n_eos = stop_at_eos ? model_runtime_eos(rt, eos, 8) : 0;
    mt_rng rng;
    mt_rng_seed(&rng, 1);
    model_spec_gen_opts o = {.k = k, .max_tokens = max_tokens, .eos = eos, .n_eos = n_eos,
                             .sampler = {.temperature = 0, .top_p = 1}, .rng = &rng,
                             .prefill_chunk = 16};
    int seq, produced = 0;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_seq_create(rt, &seq, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_spec_generate(rt, seq, prompt, n, &o, out, &produced, stats, &err), MT_OK,
                 "%s", err.msg);
    model_seq_free(rt, seq);
    return produced;
}

Test(spec, greedy_with_three_drafts_matches_plain_decoding_on_12_prompts)
{
    char *dir = fw_tiny_dir();
    model_runtime *rt = spec_open(dir, 3);
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    int32_t V = model_runtime_vocab(rt);
    int64_t drafted = 0, accepted = 0;
    for (int p = 0; p < 12; p++) {
        /* mixed lengths: 1..40 tokens (some cross the 16-token prefill chunks and pages) */
        int n = 1 + (int)mt_rng_below(&r, 40);
        int32_t prompt[40], plain[10], spec[10];
        for (int i = 0; i < n; i++)
            prompt[i] = (int32_t)mt_rng_below(&r, (uint64_t)V);
        int np = spec_run(rt, prompt, n, 0, 10, true, plain, NULL);
        model_spec_seq st;
        int ns = spec_run(rt, prompt, n, 3, 10, true, spec, &st);
        drafted += st.drafted;
        accepted += st.accepted;
        cr_assert_eq(ns, np, "seed %" PRIu64 " prompt %d (%d tokens): %d tokens with speculation, "
                     "%d without", seed, p, n, ns, np);
        for (int i = 0; i < np; i++)
            cr_assert_eq(spec[i], plain[i], "seed %" PRIu64 " prompt %d (%d tokens): token %d is "
                         "%d with speculation, %d without", seed, p, n, i, spec[i], plain[i]);
    }
    cr_assert_eq(model_kv_free_pages(rt), 96, "every page back after the sequences are freed");
    printf("spec: random tiny model, 12 prompts: %" PRId64 " of %" PRId64 " drafts accepted "
           "(seed %" PRIu64 ")\n", accepted, drafted, seed);
    model_runtime_close(rt);
    fw_rm_dir(dir);
}

/* Drafts from an oracle (the plain greedy continuation) with a wrong token
 * planted at a random place: every round must keep exactly the right
 * prefix, emit the reference token after it, and leave the cache so that
 * later rounds still match (partial acceptance, rollback in mid-page). */
Test(spec, oracle_drafts_with_planted_errors_keep_the_greedy_output)
{
    char *dir = fw_tiny_dir();
    model_runtime *rt = spec_open(dir, 0);
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    int32_t V = model_runtime_vocab(rt);
    enum { N = 24 };
    int32_t prompt[13], ref[N];
    for (int i = 0; i < 13; i++)
        prompt[i] = (int32_t)mt_rng_below(&r, (uint64_t)V);
    cr_assert_eq(spec_run(rt, prompt, 13, 0, N, false, ref, NULL), N);
    model_spec_seq sp;
    mt_err err = MT_ERR_INIT;
    int seq;
    cr_assert_eq(model_seq_create(rt, &seq, &err), MT_OK);
    cr_assert_eq(model_spec_seq_init(&sp, seq, 4, V, NULL, &r, &err), MT_OK, "%s", err.msg);
    model_step_item it = {.seq = seq, .tokens = prompt, .n_tokens = 13, .logits = sp.logits,
                          .n_prompt = 13};
    cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
    int have = 1; /* ref[0] is the prompt's argmax: the greedy run above */
    int32_t buf[MODEL_SPEC_MAX_STEPS + 1];
    while (have < N - 5) {
        int good = (int)mt_rng_below(&r, 5); /* right drafts before the planted error */
        sp.n_draft = 0;
        for (int i = 0; i < good && i < 4; i++)
            sp.draft[sp.n_draft++] = ref[have + i];
        if (sp.n_draft < 4)
            sp.draft[sp.n_draft++] = (ref[have + good] + 1 + (int32_t)mt_rng_below(&r, 100)) % V;
        int64_t len = model_seq_len(rt, seq);
        int nt = model_spec_verify_tokens(&sp, ref[have - 1], buf);
        it = (model_step_item){.seq = seq, .tokens = buf, .n_tokens = nt, .all_logits = sp.logits};
        cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
        cr_assert_eq(model_spec_accept(rt, &sp, len, &err), MT_OK, "%s", err.msg);
        int want = good < 4 ? good + 1 : 5;
        cr_assert_eq(sp.n_out, want, "seed %" PRIu64 " at %d: %d right drafts, %d emitted", seed,
                     have, good, sp.n_out);
        cr_assert_eq(model_seq_len(rt, seq), len + sp.n_out, "rejected positions are cut");
        for (int i = 0; i < sp.n_out; i++)
            cr_assert_eq(sp.out[i], ref[have + i], "seed %" PRIu64 ": token %d is %d, greedy %d",
                         seed, have + i, sp.out[i], ref[have + i]);
        have += sp.n_out;
    }
    cr_assert_eq(sp.accepted, have - 1 - sp.rounds, "accepted counts the kept drafts");
    model_spec_seq_release(&sp);
    model_runtime_close(rt);
    fw_rm_dir(dir);
}

Test(spec, next_token_map_checkpoint_accepts_most_drafts)
{
    char *dir = tmp_dir_dup("mt_spec_map");
    mt_err err = MT_ERR_INIT;
    uint64_t seed = mt_seed_fresh();
    cr_assert_eq(model_tiny_write_mtp_map(dir, seed, &err), MT_OK, "%s", err.msg);
    model_runtime *rt = spec_open(dir, 3);
    int32_t prompt[5] = {11, 200, 37, 400, 9}, plain[24], spec[24];
    int np = spec_run(rt, prompt, 5, 0, 24, false, plain, NULL);
    model_spec_seq st;
    int ns = spec_run(rt, prompt, 5, 3, 24, false, spec, &st);
    cr_assert_eq(np, 24);
    cr_assert_eq(ns, 24);
    cr_assert_arr_eq(spec, plain, sizeof plain, "seed %" PRIu64, seed);
    double rate = st.drafted ? (double)st.accepted / (double)st.drafted : 0.0;
    printf("spec: next-token map (seed %" PRIu64 "): acceptance %.3f (%" PRId64 "/%" PRId64
           "), %.2f tokens per round\n", seed, rate, st.accepted, st.drafted,
           1.0 + (double)st.accepted / (double)st.rounds);
    cr_assert_gt(rate, 0.5, "seed %" PRIu64 ": acceptance %.3f", seed, rate);
    cr_assert_lt(st.rounds, 12, "%" PRId64 " rounds for 23 tokens", st.rounds);
    model_runtime_close(rt);
    fw_rm_dir(dir);
}

/* A fork shares the source's whole pages; rolling the fork back into a
 * shared page and writing there must copy the page, so the source's next
 * logits stay bitwise those of a fresh sequence with its tokens. */
Test(spec, rollback_into_a_shared_page_leaves_the_source_intact)
{
    char *dir = fw_tiny_dir();
    model_runtime *rt = spec_open(dir, 2);
    int32_t V = model_runtime_vocab(rt);
    uint64_t seed = mt_seed_fresh();
    int32_t *tok = fw_tokens(seed, 41, V), *other = fw_tokens(seed + 1, 30, V);
    int a, b, c;
    float *la = malloc(sizeof(float) * (size_t)V), *lc = malloc(sizeof(float) * (size_t)V);
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_seq_create(rt, &a, &err), MT_OK);
    model_step_item it = {.seq = a, .tokens = tok, .n_tokens = 40, .n_prompt = 40};
    cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_seq_fork(rt, a, 40, &b, &err), MT_OK, "%s", err.msg);
    int64_t free0 = model_kv_free_pages(rt);
    cr_assert_eq(model_seq_truncate(rt, b, 20, &err), MT_OK, "%s", err.msg); /* inside page 1 */
    cr_assert_eq(model_seq_len(rt, b), 20);
    cr_assert_geq(model_kv_free_pages(rt), free0, "truncation frees the fork's own pages");
    cr_assert_eq(model_seq_truncate(rt, b, 21, &err), MT_E_INVALID, "cannot grow by truncating");
    it = (model_step_item){.seq = b, .tokens = other, .n_tokens = 30, .n_prompt = 30};
    cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
    it = (model_step_item){.seq = a, .tokens = tok + 40, .n_tokens = 1, .logits = la,
                           .n_prompt = 1};
    cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_seq_create(rt, &c, &err), MT_OK);
    it = (model_step_item){.seq = c, .tokens = tok, .n_tokens = 41, .logits = lc,
                           .n_prompt = 41};
    cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
    for (int32_t i = 0; i < V; i++)
        cr_assert_eq(memcmp(&la[i], &lc[i], sizeof(float)), 0, "seed %" PRIu64 ": logit %d "
                     "%g after the fork's rollback, %g fresh", seed, i, la[i], lc[i]);
    free(la);
    free(lc);
    free(tok);
    free(other);
    model_runtime_close(rt);
    fw_rm_dir(dir);
}

/* ---- the rules --------------------------------------------------------------------- */

/* Pearson chi-square of counts against probabilities p (cells with p = 0
 * must stay empty). */
/* Pearson's statistic of N draws against p. Tokens expected fewer than 5
 * times are pooled into one cell (the chi-square approximation needs about
 * 5 per cell: one draw of a token expected 0.1 times alone adds 8.1). */
static double chi_square(const int *count, const double *p, int V, int N, int *df)
{
    double x = 0, pool_e = 0;
    int pool_n = 0;
    *df = -1;
    for (int i = 0; i < V; i++) {
        if (p[i] == 0) {
            cr_assert_eq(count[i], 0, "token %d has probability 0 but was drawn %d times", i,
                         count[i]);
            continue;
        }
        double e = p[i] * N;
        if (e < 5) {
            pool_e += e;
            pool_n += count[i];
            continue;
        }
        x += (count[i] - e) * (count[i] - e) / e;
        (*df)++;
    }
    if (pool_e > 0) {
        x += (pool_n - pool_e) * (pool_n - pool_e) / pool_e;
        (*df)++;
    }
    return x;
}

Test(spec, speculative_sampling_draws_from_the_target_distribution)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    enum { V = 6, N = 200000 };
    /* exact target and a draft that over- and under-weights tokens (and
     * proposes token 5, which the target never emits) */
    const double p[V] = {0.30, 0.25, 0.20, 0.15, 0.10, 0.0};
    const double q[V] = {0.10, 0.40, 0.05, 0.25, 0.10, 0.10};
    int count[V] = {0}, acc = 0;
    for (int i = 0; i < N; i++) {
        int32_t d = model_sample_probs(q, V, &r);
        bool a;
        int32_t t = model_spec_resolve(p, q, V, d, &r, &a);
        cr_assert(t >= 0 && t < V);
        count[t]++;
        acc += a;
    }
    int df;
    double x = chi_square(count, p, V, N, &df);
    /* chi-square 0.999 quantile with 4 degrees of freedom: 18.47 */
    cr_assert_eq(df, 4);
    cr_assert_lt(x, 18.47, "seed %" PRIu64 ": chi-square %.2f, counts %d %d %d %d %d %d", seed, x,
                 count[0], count[1], count[2], count[3], count[4], count[5]);
    /* acceptance probability is sum min(p, q) = 0.10+0.25+0.05+0.15+0.10 = 0.65 */
    double ar = (double)acc / N;
    cr_assert_lt(fabs(ar - 0.65), 5 * sqrt(0.65 * 0.35 / N), "seed %" PRIu64 ": acceptance %.4f",
                 seed, ar);
}

Test(spec, sampler_probs_is_the_distribution_model_sample_draws_from)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    enum { V = 7, N = 100000 };
    float lg[V] = {1.0f, 2.5f, 0.2f, 2.0f, NAN, -1.0f, 1.5f};
    model_sampler s = {.temperature = 0.8f, .top_p = 0.9f, .top_k = 4};
    double p[V];
    cr_assert(model_sampler_probs(lg, V, &s, p));
    /* by hand: top-4 of lg/0.8 are ids 1, 3, 6, 0; top-p 0.9 keeps the
     * prefix that reaches 0.9 */
    double e[4] = {exp(2.5 / 0.8), exp(2.0 / 0.8), exp(1.5 / 0.8), exp(1.0 / 0.8)}, z = 0;
    for (int i = 0; i < 4; i++)
        z += e[i];
    int keep = 0;
    for (double a = 0; keep < 4 && a < 0.9;)
        a += e[keep++] / z;
    const int ids[4] = {1, 3, 6, 0};
    double zk = 0;
    for (int i = 0; i < keep; i++)
        zk += e[i];
    double want[V] = {0};
    for (int i = 0; i < keep; i++)
        want[ids[i]] = e[i] / zk;
    for (int i = 0; i < V; i++)
        cr_assert_float_eq(p[i], want[i], 1e-12, "id %d: %g, by hand %g", i, p[i], want[i]);
    int count[V] = {0};
    for (int i = 0; i < N; i++)
        count[model_sample(lg, V, &s, &r)]++;
    int df;
    double x = chi_square(count, p, V, N, &df);
    cr_assert_lt(x, 16.27, "seed %" PRIu64 ": chi-square %.2f (df %d)", seed, x, df); /* df 3 */
    /* greedy: one-hot on the argmax */
    model_sampler g = {.temperature = 0, .top_p = 1};
    cr_assert(model_sampler_probs(lg, V, &g, p));
    cr_assert_eq(p[1], 1.0);
}

/* ---- the sampler's parameters against plain references written here ---------- */

/* Bias, then repetition, frequency and presence penalties, the long way:
 * counting every occurrence in the history for every token. */
static void ref_process(const float *in, int V, const model_sampler *s, const int32_t *prompt,
                        int np, const int32_t *gen, int ng, double *out)
{
    for (int t = 0; t < V; t++) {
        double x = in[t];
        for (int i = 0; i < s->n_bias; i++)
            if (s->bias[i].id == t)
                x += s->bias[i].bias;
        int in_prompt = 0, n = 0;
        for (int i = 0; i < np; i++)
            in_prompt |= prompt[i] == t;
        for (int i = 0; i < ng; i++)
            n += gen[i] == t;
        double rp = s->repetition_penalty;
        if (rp > 0 && rp != 1 && (in_prompt || n))
            x = x > 0 ? x / rp : x * rp;
        if (n)
            x -= s->frequency_penalty * n + s->presence_penalty;
        out[t] = x;
    }
}

/* model_sampler_probs' steps the long way: softmax of logits / T; sort;
 * top-k; min-p against the top probability; top-p over what is left. */
static void ref_probs(const double *x, int V, const model_sampler *s, double *p)
{
    int order[64], n = 0;
    for (int t = 0; t < V; t++)
        if (!isinf(x[t]))
            order[n++] = t;
    for (int i = 1; i < n; i++) /* insertion sort: descending, lower id first on ties */
        for (int k = i; k > 0 && (x[order[k]] > x[order[k - 1]] ||
                                  (x[order[k]] == x[order[k - 1]] && order[k] < order[k - 1]));
             k--) {
            int tmp = order[k];
            order[k] = order[k - 1];
            order[k - 1] = tmp;
        }
    if (s->top_k > 0 && s->top_k < n)
        n = s->top_k;
    double w[64], z = 0;
    for (int i = 0; i < n; i++) /* logit / T in float, as a sampler of float logits */
        w[i] = exp((double)((float)x[order[i]] / s->temperature) -
                   (double)((float)x[order[0]] / s->temperature));
    int keep = n;
    for (int i = 0; i < n; i++)
        if (w[i] / w[0] < s->min_p) {
            keep = i;
            break;
        }
    n = keep;
    z = 0;
    for (int i = 0; i < n; i++)
        z += w[i];
    if (s->top_p > 0 && s->top_p < 1) {
        double a = 0;
        for (int i = 0; i < n; i++) {
            a += w[i] / z;
            if (a >= s->top_p) {
                n = i + 1;
                break;
            }
        }
        z = 0;
        for (int i = 0; i < n; i++)
            z += w[i];
    }
    for (int t = 0; t < V; t++)
        p[t] = 0;
    for (int i = 0; i < n; i++)
        p[order[i]] = w[i] / z;
}

Test(spec, logit_bias_and_penalties_match_a_plain_reference)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    enum { V = 40 };
    for (int round = 0; round < 300; round++) {
        float lg[V];
        for (int t = 0; t < V; t++)
            lg[t] = (float)((double)mt_rng_below(&r, 2001) / 200.0 - 5.0);
        int32_t prompt[30], gen[30];
        int np = (int)mt_rng_below(&r, 30), ng = (int)mt_rng_below(&r, 30);
        for (int i = 0; i < np; i++)
            prompt[i] = (int32_t)mt_rng_below(&r, V / 2); /* repeats are likely */
        for (int i = 0; i < ng; i++)
            gen[i] = (int32_t)mt_rng_below(&r, V / 2);
        model_logit_bias bias[4];
        int nb = (int)mt_rng_below(&r, 5);
        for (int i = 0; i < nb; i++)
            bias[i] = (model_logit_bias){(int32_t)mt_rng_below(&r, V + 3) - 1,
                                         (float)((double)mt_rng_below(&r, 201) - 100.0) / 10.0f};
        model_sampler s = {.temperature = 1, .top_p = 1, .bias = bias, .n_bias = nb,
                           .presence_penalty = (float)mt_rng_below(&r, 5) * 0.5f - 1.0f,
                           .frequency_penalty = (float)mt_rng_below(&r, 5) * 0.5f - 1.0f,
                           .repetition_penalty = round % 3 ? 1.0f + (float)mt_rng_below(&r, 10) * 0.1f
                                                           : 0.0f};
        model_token_counts c;
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(model_token_counts_init(&c, V, prompt, np, &err), MT_OK, "%s", err.msg);
        for (int i = 0; i < ng; i++)
            cr_assert_eq(model_token_counts_add(&c, gen[i], 1), MT_OK);
        /* an add undone (a draft tried) changes nothing */
        cr_assert_eq(model_token_counts_add(&c, 7, 1), MT_OK);
        cr_assert_eq(model_token_counts_add(&c, 7, -1), MT_OK);
        float got[V];
        memcpy(got, lg, sizeof lg);
        model_sampler_process(&s, &c, got, V);
        double want[V];
        ref_process(lg, V, &s, prompt, np, gen, ng, want);
        for (int t = 0; t < V; t++)
            cr_assert_float_eq(got[t], want[t], 1e-5 * (1 + fabs(want[t])),
                               "seed %" PRIu64 " round %d token %d: %.7g, reference %.7g", seed,
                               round, t, got[t], want[t]);
        model_token_counts_release(&c);
    }
}

Test(spec, min_p_top_k_top_p_match_a_plain_reference_and_the_draws)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    enum { V = 12 };
    for (int round = 0; round < 400; round++) {
        float lg[V];
        double x[V];
        for (int t = 0; t < V; t++) {
            lg[t] = (float)((double)mt_rng_below(&r, 801) / 100.0 - 4.0);
            if (mt_rng_below(&r, 8) == 0)
                lg[t] = -INFINITY; /* a grammar's mask */
            x[t] = lg[t];
        }
        model_sampler s = {.temperature = 0.3f + (float)mt_rng_below(&r, 18) * 0.1f,
                           .top_p = mt_rng_below(&r, 2) ? 1.0f : 0.3f + (float)mt_rng_below(&r, 7) * 0.1f,
                           .top_k = (int)mt_rng_below(&r, 2) * (int)mt_rng_below(&r, V),
                           .min_p = mt_rng_below(&r, 2) ? 0.0f : (float)mt_rng_below(&r, 9) * 0.1f};
        if (s.top_k == 1)
            s.top_k = 0;
        double got[V], want[V];
        cr_assert(model_sampler_probs(lg, V, &s, got));
        ref_probs(x, V, &s, want);
        for (int t = 0; t < V; t++)
            cr_assert_float_eq(got[t], want[t], 1e-9, "seed %" PRIu64 " round %d token %d", seed,
                               round, t);
        if (round % 40)
            continue;
        /* the draws follow it */
        enum { N = 40000 };
        int count[V] = {0};
        for (int i = 0; i < N; i++) {
            int32_t t = model_sample(lg, V, &s, &r);
            cr_assert(!isinf(lg[t]), "a masked token drawn");
            count[t]++;
        }
        int df;
        double chi = chi_square(count, want, V, N, &df);
        /* 0.999 quantile of chi-square, df <= 11: at most 31.3 */
        cr_assert_lt(chi, 31.3, "seed %" PRIu64 " round %d: chi-square %.2f (df %d)", seed, round,
                     chi, df);
    }
}

/* A processor that forbids every token whose id is 3 mod 5, and (to depend
 * on the history) the token generated last. */
static mt_status forbid_proc(void *ctx, const int32_t *gen, int64_t n_gen, const int32_t *extra,
                             int n_extra, float *logits, mt_err *err)
{
    (void)err;
    int32_t V = *(const int32_t *)ctx;
    for (int32_t t = 3; t < V; t += 5)
        logits[t] = -INFINITY;
    int32_t last = n_extra ? extra[n_extra - 1] : n_gen ? gen[n_gen - 1] : -1;
    if (last >= 0)
        logits[last] = -INFINITY;
    return MT_OK;
}

Test(spec, drafts_are_checked_against_the_callers_processing)
{
    char *dir = fw_tiny_dir();
    model_runtime *rt = spec_open(dir, 3);
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    int32_t V = model_runtime_vocab(rt);
    for (int p = 0; p < 6; p++) {
        int n = 1 + (int)mt_rng_below(&r, 30);
        int32_t prompt[30], out[2][24];
        for (int i = 0; i < n; i++)
            prompt[i] = (int32_t)mt_rng_below(&r, (uint64_t)V);
        for (int mode = 0; mode < 2; mode++) { /* greedy, then sampled */
            int got[2];
            for (int k = 0; k < 2; k++) {
                mt_rng d;
                mt_rng_seed(&d, seed + (uint64_t)p);
                model_spec_gen_opts o = {
                    .k = k ? 3 : 0, .max_tokens = 24,
                    .sampler = {.temperature = mode ? 1.0f : 0.0f, .top_p = 1},
                    .rng = &d, .prefill_chunk = 16, .proc = {forbid_proc, &V}};
                int seq;
                mt_err err = MT_ERR_INIT;
                cr_assert_eq(model_seq_create(rt, &seq, &err), MT_OK);
                model_spec_seq st;
                cr_assert_eq(model_spec_generate(rt, seq, prompt, n, &o, out[k], &got[k], &st,
                                                 &err),
                             MT_OK, "%s", err.msg);
                model_seq_free(rt, seq);
                for (int i = 0; i < got[k]; i++) {
                    cr_assert_neq(out[k][i] % 5, 3, "seed %" PRIu64 ": a forbidden token emitted",
                                  seed);
                    if (i)
                        cr_assert_neq(out[k][i], out[k][i - 1], "seed %" PRIu64 ": a repeat", seed);
                }
            }
            if (mode == 0) { /* greedy: speculation changes nothing */
                cr_assert_eq(got[0], got[1]);
                cr_assert_arr_eq(out[0], out[1], sizeof(int32_t) * (size_t)got[0],
                                 "seed %" PRIu64 " prompt %d", seed, p);
            }
        }
    }
    model_runtime_close(rt);
    fw_rm_dir(dir);
}
