/* test_serve_spec.c: speculative decoding inside the server's continuous
 * batching: with batch-invariant kernels, greedy output with 3 MTP drafts
 * per step is token-for-token the plain output (a runtime without
 * speculation is the reference) for 20 prompts of mixed lengths, submitted
 * one at a time and 8 at once (requests at different draft lengths and
 * prefill chunks share steps); on the next-token-map checkpoint the
 * acceptance rate reported in /metrics and in the response's usage is
 * above 0.5. */
#include <inttypes.h>

#include "model/spec.h"
#include "test_serve_util.h"

static void start_spec_server(tsrv *t, bool map, int steps)
{
    signal(SIGPIPE, SIG_IGN);
    memset(t, 0, sizeof *t);
    tmp_dir_make(t->dir, sizeof t->dir, "mt_serve_spec");
    mt_err err = MT_ERR_INIT;
    cr_assert_eq((map ? model_tiny_write_mtp_map : model_tiny_write)(t->dir, 1, &err), MT_OK,
                 "%s", err.msg);
    serve_server_opts o;
    memset(&o, 0, sizeof o);
    o.engine.rt.model_dir = t->dir;
    o.engine.rt.device = "cpu";
    o.engine.rt.batch_invariant = true;
    o.engine.rt.speculative_steps = steps;
    o.engine.rt.kv_pages = 128;
    o.engine.rt.max_batch_tokens = 64;
    o.engine.max_batch = 8;
    t->log = fopen("/dev/null", "w");
    o.engine.rt.log = t->log;
    o.host = "127.0.0.1";
    o.port = 0;
    cr_assert_eq(serve_server_start(&o, &t->s, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(serve_engine_wait_ready(serve_server_engine(t->s), 900, &err), MT_OK, "%s",
                 err.msg);
    snprintf(t->url_text, sizeof t->url_text, "http://127.0.0.1:%d", serve_server_port(t->s));
    cr_assert_eq(serve_url_parse(t->url_text, &t->url, &err), MT_OK, "%s", err.msg);
}

enum { N_PROMPTS = 20, MAX_NEW = 8, MAX_PROMPT = 40 };

typedef struct prompt_set {
    int32_t tok[N_PROMPTS][MAX_PROMPT];
    int len[N_PROMPTS];
    int32_t want[N_PROMPTS][MAX_NEW];
    int n_want[N_PROMPTS];
} prompt_set;

/* Plain greedy outputs on a runtime of the same checkpoint, no speculation. */
static void reference(const char *dir, prompt_set *ps)
{
    static FILE *quiet;
    if (!quiet)
        quiet = fopen("/dev/null", "w");
    model_runtime_opts o = {.model_dir = dir, .device = "cpu", .kv_pages = 128,
                            .max_batch_tokens = 64, .batch_invariant = true, .log = quiet};
    model_runtime *rt = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_runtime_open(&o, &rt, &err), MT_OK, "%s", err.msg);
    int32_t eos[MODEL_MAX_EOS];
    int n_eos = model_runtime_eos(rt, eos, MODEL_MAX_EOS);
    for (int p = 0; p < N_PROMPTS; p++) {
        model_spec_gen_opts go = {.k = 0, .max_tokens = MAX_NEW, .eos = eos, .n_eos = n_eos,
                                  .sampler = {.temperature = 0, .top_p = 1}, .prefill_chunk = 64};
        int seq;
        cr_assert_eq(model_seq_create(rt, &seq, &err), MT_OK, "%s", err.msg);
        cr_assert_eq(model_spec_generate(rt, seq, ps->tok[p], ps->len[p], &go, ps->want[p],
                                         &ps->n_want[p], NULL, &err), MT_OK, "%s", err.msg);
        model_seq_free(rt, seq);
    }
    model_runtime_close(rt);
}

static serve_gen *submit(tsrv *t, const prompt_set *ps, int p)
{
    serve_gen_params gp = {.prompt = ps->tok[p], .n_prompt = ps->len[p], .max_tokens = MAX_NEW,
                           .sampler = {.temperature = 0, .top_p = 1}};
    serve_gen *g = NULL;
    serve_error se = SERVE_ERROR_INIT;
    cr_assert_eq(serve_engine_submit(serve_server_engine(t->s), &gp, &g, &se), MT_OK, "%s",
                 se.err.msg);
    return g;
}

static void check(serve_gen *g, const prompt_set *ps, int p, uint64_t seed, const char *how)
{
    serve_gen_view v;
    do
        serve_gen_wait(g, -1, 60, &v);
    while (v.finish == SERVE_FINISH_NONE);
    cr_assert(v.finish == SERVE_FINISH_STOP || v.finish == SERVE_FINISH_LENGTH,
              "%s prompt %d: finish %d (%s)", how, p, (int)v.finish, v.error.err.msg);
    cr_assert_eq(v.n_generated, ps->n_want[p], "seed %" PRIu64 " %s prompt %d (%d tokens): %"
                 PRId64 " tokens, plain decoding %d", seed, how, p, ps->len[p], v.n_generated,
                 ps->n_want[p]);
    for (int i = 0; i < ps->n_want[p]; i++)
        cr_assert_eq(v.tokens[i], ps->want[p][i], "seed %" PRIu64 " %s prompt %d (%d tokens): "
                     "token %d is %d with speculation, %d plain", seed, how, p, ps->len[p], i,
                     v.tokens[i], ps->want[p][i]);
    /* A first token that ends the request (an end-of-sequence id) leaves
     * nothing to draft: a verify round needs a second token. */
    if (ps->n_want[p] > 1)
        cr_assert_gt(v.spec_rounds, 0, "seed %" PRIu64 " %s prompt %d: %d tokens, no verify "
                     "rounds", seed, how, p, ps->n_want[p]);
    serve_gen_release(g);
}

Test(serve_spec, greedy_three_drafts_match_plain_alone_and_8_concurrent, .timeout = 600)
{
    tsrv t;
    start_spec_server(&t, false, 3);
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    prompt_set *ps = calloc(1, sizeof *ps);
    for (int p = 0; p < N_PROMPTS; p++) {
        ps->len[p] = 1 + (int)mt_rng_below(&r, MAX_PROMPT);
        for (int i = 0; i < ps->len[p]; i++)
            ps->tok[p][i] = (int32_t)mt_rng_below(&r, 512);
    }
    reference(t.dir, ps);
    for (int p = 0; p < N_PROMPTS; p++)
        check(submit(&t, ps, p), ps, p, seed, "alone");
    for (int p0 = 0; p0 < N_PROMPTS; p0 += 8) {
        serve_gen *g[8];
        int n = N_PROMPTS - p0 < 8 ? N_PROMPTS - p0 : 8;
        for (int i = 0; i < n; i++)
            g[i] = submit(&t, ps, p0 + i);
        for (int i = 0; i < n; i++)
            check(g[i], ps, p0 + i, seed, "concurrent");
    }
    cr_assert_gt(metric(&t, "moetune_spec_verify_rounds_total"), 0);
    free(ps);
    tsrv_stop(&t);
}

Test(serve_spec, next_token_map_acceptance_in_metrics_and_usage, .timeout = 600)
{
    tsrv t;
    start_spec_server(&t, true, 3);
    cJSON *j = NULL;
    const char *body = "{\"prompt\": [11, 200, 37, 400, 9], \"max_tokens\": 24, "
                       "\"temperature\": 0, \"ignore_eos\": true}";
    cr_assert_eq(http(&t, "POST", "/v1/completions", body, &j, NULL), 200);
    const cJSON *u = cJSON_GetObjectItem(j, "usage");
    cr_assert_eq(cJSON_GetObjectItem(u, "completion_tokens")->valuedouble, 24);
    const cJSON *s = cJSON_GetObjectItem(u, "speculative");
    cr_assert(cJSON_IsObject(s), "usage has no speculative object");
    double rate = cJSON_GetObjectItem(s, "acceptance_rate")->valuedouble;
    double len = cJSON_GetObjectItem(s, "mean_accepted_length")->valuedouble;
    printf("serve_spec: next-token map: usage acceptance %.3f, %.2f tokens per round\n", rate, len);
    cr_assert_gt(rate, 0.5);
    cr_assert_gt(len, 2.0);
    cr_assert_gt(metric(&t, "moetune_spec_acceptance_rate"), 0.5);
    cr_assert_eq(metric(&t, "moetune_spec_accepted_tokens_total"),
                 cJSON_GetObjectItem(s, "accepted_tokens")->valuedouble);
    cJSON_Delete(j);
    /* Per request: off, and fewer drafts than the server's. */
    const char *off = "{\"prompt\": [5, 6], \"max_tokens\": 6, \"temperature\": 0, "
                      "\"ignore_eos\": true, \"speculative_steps\": 0}";
    cr_assert_eq(http(&t, "POST", "/v1/completions", off, &j, NULL), 200);
    cr_assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "speculative"));
    cJSON_Delete(j);
    const char *two = "{\"prompt\": [5, 6], \"max_tokens\": 12, \"temperature\": 0, "
                      "\"ignore_eos\": true, \"speculative_steps\": 2}";
    cr_assert_eq(http(&t, "POST", "/v1/completions", two, &j, NULL), 200);
    s = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "speculative");
    cr_assert(cJSON_IsObject(s));
    len = cJSON_GetObjectItem(s, "mean_accepted_length")->valuedouble;
    cr_assert_leq(len, 3.0, "2 drafts: at most 3 tokens per round, %.2f", len);
    cr_assert_gt(len, 1.5);
    cJSON_Delete(j);
    const char *bad = "{\"prompt\": [5], \"speculative_steps\": 9}";
    cr_assert_eq(http(&t, "POST", "/v1/completions", bad, &j, NULL), 400);
    cJSON_Delete(j);
    tsrv_stop(&t);
}
