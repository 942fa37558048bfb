/* test_serve_agent.c: the API surface agents use, over HTTP against the
 * tiny model on cpu: tool calls in GLM's format with reasoning split out
 * (the model's output scripted token by token through the engine's test
 * sampler hook, so the parser sees a real GLM-format call as the runtime
 * emits it), the official `openai` npm client running the round trip
 * (tests/node/tool_roundtrip.mjs), logprobs against a log-softmax of the
 * logits `moetune generate --logits` writes, n = 4 sharing the prompt's KV
 * (visible in /metrics), and prompts with U+0000, lone surrogates and
 * overlong UTF-8 (tokenized whole, or refused with a 400). */
#include <math.h>
#include <sys/wait.h>

#include "test_serve_util.h"

#include "model/format/chat.h"

/* ---- scripted output ------------------------------------------------------------- */

typedef struct script {
    int32_t *call, *answer;
    size_t n_call, n_answer;
    int32_t tool_call_tok, observation, endoftext;
} script;

static script S;

static bool has_tok(const int32_t *t, int64_t n, int32_t id)
{
    for (int64_t i = 0; i < n; i++)
        if (t[i] == id)
            return true;
    return false;
}

/* Requests with tools (their prompt holds "<tool_call>" from the tools
 * preamble) get the call, or the answer once a tool result is in the
 * prompt; everything else samples as usual. */
static int32_t hook(void *ctx, const int32_t *tokens, int64_t n_prompt, int64_t n_gen)
{
    script *s = ctx;
    if (!has_tok(tokens, n_prompt, s->tool_call_tok))
        return -1;
    bool answer = has_tok(tokens, n_prompt, s->observation);
    const int32_t *t = answer ? s->answer : s->call;
    size_t n = answer ? s->n_answer : s->n_call;
    if ((size_t)n_gen < n)
        return t[n_gen];
    return answer ? s->endoftext : s->observation;
}

static const char CALL_TEXT[] =
    "<think>The user wants the weather.</think>I will check.<tool_call>get_weather"
    "<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
    "<arg_value>3</arg_value></tool_call>";
static const char ANSWER_TEXT[] = "It is sunny in Paris.";

static tsrv T;

static void start(void)
{
    serve_server_opts o;
    memset(&o, 0, sizeof o);
    o.engine.sample_hook = hook;
    o.engine.sample_hook_ctx = &S;
    tsrv_start(&T, &o);
    const model_tokenizer *tok = serve_engine_info(serve_server_engine(T.s))->tok;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tokenizer_encode(tok, CALL_TEXT, strlen(CALL_TEXT), &S.call, &S.n_call, &err),
                 MT_OK, "%s", err.msg);
    cr_assert_eq(model_tokenizer_encode(tok, ANSWER_TEXT, strlen(ANSWER_TEXT), &S.answer,
                                        &S.n_answer, &err),
                 MT_OK);
    S.tool_call_tok = model_tokenizer_token_id(tok, "<tool_call>");
    S.observation = model_tokenizer_token_id(tok, "<|observation|>");
    S.endoftext = model_tokenizer_token_id(tok, "<|endoftext|>");
    cr_assert(S.tool_call_tok >= 0 && S.observation >= 0 && S.endoftext >= 0);
}

static void stop(void)
{
    tsrv_stop(&T);
    free(S.call);
    free(S.answer);
}

TestSuite(serve_agent, .init = start, .fini = stop, .timeout = 900);

static const char TOOLS[] =
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"description\":\"Weather forecast for a city\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},"
    "\"required\":[\"city\"]}}}]";

/* ---- tool calls -------------------------------------------------------------------- */

Test(serve_agent, tool_call_round_trip_plain)
{
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],%s,"
             "\"max_tokens\":200,\"temperature\":0}",
             TOOLS);
    cJSON *j;
    cr_assert_eq(http(&T, "POST", "/v1/chat/completions", body, &j, NULL), 200);
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cr_assert_str_eq(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "tool_calls");
    cJSON *m = cJSON_GetObjectItem(c, "message");
    cr_assert_str_eq(cJSON_GetObjectItem(m, "content")->valuestring, "I will check.");
    cr_assert_str_eq(cJSON_GetObjectItem(m, "reasoning_content")->valuestring,
                     "The user wants the weather.");
    cJSON *tc = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "tool_calls"), 0);
    cr_assert_str_eq(cJSON_GetObjectItem(tc, "type")->valuestring, "function");
    cJSON *f = cJSON_GetObjectItem(tc, "function");
    cr_assert_str_eq(cJSON_GetObjectItem(f, "name")->valuestring, "get_weather");
    cr_assert_str_eq(cJSON_GetObjectItem(f, "arguments")->valuestring,
                     "{\"city\":\"Paris\",\"days\":3}");
    /* The tool's result goes back; the answer follows. */
    char body2[4096];
    snprintf(body2, sizeof body2,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
             "{\"role\":\"assistant\",\"content\":\"I will check.\",\"tool_calls\":[{\"id\":\"%s\","
             "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
             "\"{\\\"city\\\":\\\"Paris\\\",\\\"days\\\":3}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"%s\",\"content\":\"sunny\"}],%s,"
             "\"max_tokens\":200,\"temperature\":0}",
             cJSON_GetObjectItem(tc, "id")->valuestring, cJSON_GetObjectItem(tc, "id")->valuestring,
             TOOLS);
    cJSON_Delete(j);
    cr_assert_eq(http(&T, "POST", "/v1/chat/completions", body2, &j, NULL), 200);
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cr_assert_str_eq(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "stop");
    m = cJSON_GetObjectItem(c, "message");
    cr_assert_str_eq(cJSON_GetObjectItem(m, "content")->valuestring, ANSWER_TEXT);
    cr_assert_null(cJSON_GetObjectItem(m, "tool_calls"));
    cJSON_Delete(j);
    /* The second prompt renders the call and the result the way GLM does. */
    cr_assert_eq(http(&T, "POST", "/tokenize", body2, &j, NULL), 200);
    serve_buf ids = SERVE_BUF_INIT;
    cJSON *id;
    int32_t tokv[4096];
    int nt = 0;
    cJSON_ArrayForEach(id, cJSON_GetObjectItem(j, "tokens")) tokv[nt++] = (int32_t)id->valuedouble;
    char *text = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tokenizer_decode(serve_engine_info(serve_server_engine(T.s))->tok, tokv,
                                        (size_t)nt, false, &text, NULL, &err),
                 MT_OK);
    cr_assert_not_null(strstr(text, "<|assistant|></think>I will check.<tool_call>get_weather"
                                    "<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>"
                                    "days</arg_key><arg_value>3</arg_value></tool_call>"
                                    "<|observation|><tool_response>sunny</tool_response>"
                                    "<|assistant|></think>"),
                       "%s", text);
    cr_assert_not_null(strstr(text, "[gMASK]<sop><|system|>\n# Tools\n\n"), "%s", text);
    cr_assert_not_null(strstr(text, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
                                    "\"get_weather\""),
                       "%s", text);
    free(text);
    serve_buf_release(&ids);
    cJSON_Delete(j);
}

Test(serve_agent, tool_call_streams_once_complete_with_its_arguments)
{
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],%s,\"stream\":true,"
             "\"max_tokens\":200,\"temperature\":0}",
             TOOLS);
    char *raw = NULL;
    cr_assert_eq(http(&T, "POST", "/v1/chat/completions", body, NULL, &raw), 200);
    /* Walk the events: one call, held back until complete, then its id, name
     * and whole arguments in one delta. */
    int names = 0, arg_deltas = 0;
    serve_buf args = SERVE_BUF_INIT, reasoning = SERVE_BUF_INIT, content = SERVE_BUF_INIT;
    const char *finish = NULL;
    char fbuf[32];
    for (char *l = strstr(raw, "data: "); l; l = strstr(l + 1, "\ndata: ")) {
        char *p = l[0] == '\n' ? l + 7 : l + 6;
        char *eol = strchr(p, '\n');
        if (!eol || !strncmp(p, "[DONE]", 6))
            continue;
        cJSON *o = cJSON_ParseWithLength(p, (size_t)(eol - p));
        cr_assert_not_null(o);
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        cJSON *d = cJSON_GetObjectItem(ch, "delta");
        cJSON *x;
        if ((x = cJSON_GetObjectItem(d, "reasoning_content")))
            serve_buf_puts(&reasoning, x->valuestring);
        if ((x = cJSON_GetObjectItem(d, "content")) && cJSON_IsString(x))
            serve_buf_puts(&content, x->valuestring);
        cJSON *tc;
        cJSON_ArrayForEach(tc, cJSON_GetObjectItem(d, "tool_calls"))
        {
            cr_assert_eq(cJSON_GetObjectItem(tc, "index")->valueint, 0);
            cJSON *f = cJSON_GetObjectItem(tc, "function");
            if (cJSON_GetObjectItem(f, "name")) {
                names++;
                cr_assert_not_null(cJSON_GetObjectItem(tc, "id"));
                cr_assert_eq(args.len, 0);
            }
            const char *a = cJSON_GetObjectItem(f, "arguments")->valuestring;
            if (*a) {
                arg_deltas++;
                serve_buf_puts(&args, a);
            }
        }
        x = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(x)) {
            snprintf(fbuf, sizeof fbuf, "%s", x->valuestring);
            finish = fbuf;
        }
        cJSON_Delete(o);
    }
    cr_assert_eq(names, 1);
    cr_assert_eq(arg_deltas, 1, "the arguments come with the name, whole");
    cr_assert_str_eq(args.data, "{\"city\":\"Paris\",\"days\":3}");
    cr_assert_str_eq(reasoning.data, "The user wants the weather.");
    cr_assert_str_eq(content.data, "I will check.");
    cr_assert_str_eq(finish, "tool_calls");
    serve_buf_release(&args);
    serve_buf_release(&reasoning);
    serve_buf_release(&content);
    free(raw);
}

/* Runs tests/node/SCRIPT with the official `openai` npm client (installed
 * into the build folder on first use) against the server; out gets its
 * output. Skips the test when node is absent. */
static void run_node(const char *script, const char *args, char *out, size_t cap)
{
    if (system("command -v node >/dev/null 2>&1") != 0) {
        cr_log_info("node is not installed: the openai npm client test is skipped");
        cr_skip_test("no node");
    }
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", MOETUNE_BIN);
    char *slash = strrchr(dir, '/');
    cr_assert_not_null(slash);
    snprintf(slash, sizeof dir - (size_t)(slash - dir), "/node-openai");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "test -d '%s/node_modules/openai' || "
                              "(mkdir -p '%s' && cd '%s' && npm install --no-audit --no-fund "
                              "--silent openai@6.30.1 >npm.log 2>&1)",
             dir, dir, dir);
    int rc = system(cmd);
    cr_assert_eq(rc, 0, "npm install openai failed (see %s/npm.log)", dir);
    snprintf(cmd, sizeof cmd, "cp '%s/tests/node/%s' '%s/' && node '%s/%s' %s 2>&1",
             MOETUNE_SOURCE_DIR, script, dir, dir, script, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    rc = pclose(p);
    cr_log_info("%s", out);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "node %s: %s", script, out);
}

/* The official client, non-streaming and streaming (tests/node). */
Test(serve_agent, openai_npm_client_runs_the_tool_round_trip)
{
    char out[8192];
    run_node("tool_roundtrip.mjs", T.url_text, out, sizeof out);
    cr_assert_not_null(strstr(out, "n = 2 ok"), "%s", out);
}

/* chat.completions.stream, runTools (plain and streamed), models.retrieve
 * and a 50 MB body that must be one 413, not a reset the SDK retries. */
Test(serve_agent, openai_npm_client_streams_runs_tools_retrieves_and_gets_a_413)
{
    char out[8192], args[600];
    snprintf(args, sizeof args, "%s '%s'", T.url_text, strrchr(T.dir, '/') + 1);
    run_node("agent_checks.mjs", args, out, sizeof out);
    cr_assert_not_null(strstr(out, "agent checks ok"), "%s", out);
}

/* ---- logprobs ------------------------------------------------------------------------ */

/* The log-softmax of a logits row, in double. */
static void log_softmax(const float *l, int32_t v, double *out)
{
    double m = -INFINITY, s = 0;
    for (int32_t i = 0; i < v; i++)
        m = l[i] > m ? l[i] : m;
    for (int32_t i = 0; i < v; i++)
        s += exp(l[i] - m);
    for (int32_t i = 0; i < v; i++)
        out[i] = l[i] - m - log(s);
}

Test(serve_agent, logprobs_match_a_log_softmax_of_generate_logits)
{
    const int32_t prompt[] = {72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 45, 46};
    const int np = (int)(sizeof prompt / sizeof prompt[0]);
    char *pj = ids_json(prompt, np);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":3,\"temperature\":0,\"logprobs\":5,"
             "\"ignore_eos\":true,\"return_token_ids\":true}",
             pj);
    cJSON *j;
    cr_assert_eq(http(&T, "POST", "/v1/completions", body, &j, NULL), 200);
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *lp = cJSON_GetObjectItem(c, "logprobs");
    cJSON *tl = cJSON_GetObjectItem(lp, "token_logprobs");
    cJSON *tops = cJSON_GetObjectItem(lp, "top_logprobs");
    cJSON *gen = cJSON_GetObjectItem(c, "token_ids");
    cr_assert_eq(cJSON_GetArraySize(tl), 3);
    int32_t all[64];
    memcpy(all, prompt, sizeof prompt);
    for (int k = 0; k < 3; k++)
        all[np + k] = (int32_t)cJSON_GetArrayItem(gen, k)->valuedouble;
    /* moetune generate on the prompt, greedy, 3 tokens, --step-logits: row
     * k holds the logits token k was chosen from, computed as the server
     * computes them (the prompt's prefill, then decode steps: the two paths
     * round differently, so a prefill of prompt + tokens is not the same). */
    char lpath[600], cmd[2048], *ids = ids_json(all, np);
    snprintf(lpath, sizeof lpath, "%s/logits.bin", T.dir);
    ids[strlen(ids) - 1] = 0;
    snprintf(cmd, sizeof cmd, "%s generate --model %s --device cpu --tokens %s --max-tokens 3 "
                              "--step-logits %s >/dev/null 2>&1",
             MOETUNE_BIN, T.dir, ids + 1, lpath);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    int32_t V = serve_engine_info(serve_server_engine(T.s))->vocab;
    FILE *f = fopen(lpath, "rb");
    float *rows = malloc(sizeof(float) * (size_t)V * 3);
    cr_assert_eq(fread(rows, sizeof(float) * (size_t)V, 3, f), 3);
    fclose(f);
    double *ls = malloc(sizeof(double) * (size_t)V);
    double worst = 0;
    for (int k = 0; k < 3; k++) {
        log_softmax(rows + (size_t)k * (size_t)V, V, ls);
        double got = cJSON_GetArrayItem(tl, k)->valuedouble;
        double want = ls[all[np + k]];
        worst = fmax(worst, fabs(got - want));
        cr_assert_leq(fabs(got - want), 1e-4, "token %d: %.6f vs %.6f", k, got, want);
        /* Greedy: the chosen token's logprob is the top one. */
        cJSON *d = cJSON_GetArrayItem(tops, k), *e;
        cr_assert(cJSON_GetArraySize(d) >= 1 && cJSON_GetArraySize(d) <= 5); /* same-text tokens share a key */
        double best = -INFINITY;
        cJSON_ArrayForEach(e, d)
        {
            best = fmax(best, e->valuedouble);
        }
        cr_assert_float_eq(best, got, 1e-6, "token %d", k);
    }
    cr_log_info("logprobs vs generate --logits: max |diff| %.2e", worst);
    free(rows);
    free(ls);
    free(ids);
    free(pj);
    cJSON_Delete(j);
    /* Chat shape: content[] with token, logprob, bytes, top_logprobs. */
    cr_assert_eq(http(&T, "POST", "/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":2,"
                      "\"temperature\":0,\"logprobs\":true,\"top_logprobs\":3,\"ignore_eos\":true}",
                      &j, NULL),
                 200);
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "content");
    cr_assert_eq(cJSON_GetArraySize(content), 2);
    cJSON *e0 = cJSON_GetArrayItem(content, 0);
    cr_assert(cJSON_IsString(cJSON_GetObjectItem(e0, "token")));
    cr_assert(cJSON_IsArray(cJSON_GetObjectItem(e0, "bytes")));
    cJSON *t0 = cJSON_GetObjectItem(e0, "top_logprobs");
    cr_assert_eq(cJSON_GetArraySize(t0), 3);
    cr_assert_float_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(t0, 0), "logprob")->valuedouble,
                       cJSON_GetObjectItem(e0, "logprob")->valuedouble, 1e-6);
    cJSON_Delete(j);
}

/* ---- n > 1 ------------------------------------------------------------------------------ */

Test(serve_agent, n4_returns_four_choices_and_computes_the_prompt_once)
{
    int32_t prompt[40];
    for (int i = 0; i < 40; i++)
        prompt[i] = 300 + (i * 7) % 150; /* a prompt no other test sends */
    char *pj = ids_json(prompt, 40);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":4,\"temperature\":1,\"seed\":5,\"n\":4,"
             "\"ignore_eos\":true}",
             pj);
    double q0 = metric(&T, "moetune_prefix_cache_queries_total");
    double h0 = metric(&T, "moetune_prefix_cache_hits_total");
    cJSON *j;
    cr_assert_eq(http(&T, "POST", "/v1/completions", body, &j, NULL), 200);
    cJSON *ch = cJSON_GetObjectItem(j, "choices");
    cr_assert_eq(cJSON_GetArraySize(ch), 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, i), "index")->valueint, i);
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    cr_assert_eq(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 40);
    cr_assert_eq(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 16);
    double q1 = metric(&T, "moetune_prefix_cache_queries_total");
    double h1 = metric(&T, "moetune_prefix_cache_hits_total");
    /* 4 x 40 prompt tokens asked for; the 3 followers fork the first one's
     * KV at 39 tokens: 40 + 3 computed, 117 from the cache. */
    cr_assert_eq((int)(q1 - q0), 160);
    cr_assert_eq((int)(h1 - h0), 117, "hits %g", h1 - h0);
    cJSON_Delete(j);
    /* best_of 3, n 2: two choices back, three generated. */
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":2,\"temperature\":1,\"seed\":9,\"n\":2,"
             "\"best_of\":3,\"ignore_eos\":true}",
             pj);
    cr_assert_eq(http(&T, "POST", "/v1/completions", body, &j, NULL), 200);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")), 2);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")->valueint,
                 6);
    cJSON_Delete(j);
    /* Streaming n = 3: every choice index finishes. */
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":3,\"n\":3,\"stream\":true,\"ignore_eos\":true}", pj);
    char *raw = NULL;
    cr_assert_eq(http(&T, "POST", "/v1/completions", body, NULL, &raw), 200);
    for (int i = 0; i < 3; i++) {
        char want[64];
        snprintf(want, sizeof want, "\"index\":%d,\"text\"", i);
        cr_assert_not_null(strstr(raw, want), "%s", raw);
    }
    cr_assert_not_null(strstr(raw, "data: [DONE]"));
    free(raw);
    free(pj);
}

/* The first choice is held until its followers are queued: one submitted
 * long after it (a loaded HTTP thread) still forks the whole prompt
 * rather than finding the finished first choice's KV in the prefix cache
 * at a page boundary. A held first choice that is cancelled ends. */
Test(serve_agent, a_first_choice_waits_for_its_followers)
{
    serve_engine *e = serve_server_engine(T.s);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++)
        prompt[i] = 310 + (i * 11) % 140; /* a prompt no other test sends */
    serve_gen_params p = {.prompt = prompt, .n_prompt = 40, .max_tokens = 2,
                          .sampler = {.temperature = 0, .top_p = 1}, .ignore_eos = true,
                          .n_followers = 1};
    serve_gen *lead = NULL, *fol = NULL;
    serve_error se = SERVE_ERROR_INIT;
    cr_assert_eq(serve_engine_submit(e, &p, &lead, &se), MT_OK, "%s", se.err.msg);
    serve_gen_view v;
    serve_gen_wait(lead, 0, 0.5, &v); /* long enough to finish two tokens were it admitted */
    cr_assert(!v.admitted && v.finish == SERVE_FINISH_NONE && v.n_generated == 0,
              "the first choice ran before its follower was queued");
    p.n_followers = 0;
    p.follow = lead;
    cr_assert_eq(serve_engine_submit(e, &p, &fol, &se), MT_OK, "%s", se.err.msg);
    serve_gen *both[2] = {lead, fol};
    for (int k = 0; k < 2; k++) {
        do
            serve_gen_wait(both[k], -1, 60, &v);
        while (v.finish == SERVE_FINISH_NONE);
        cr_assert_eq(v.finish, SERVE_FINISH_LENGTH, "choice %d: %s", k, v.error.err.msg);
        cr_assert_eq(v.n_cached, k ? 39 : 0, "choice %d took %lld prompt tokens from the cache",
                     k, (long long)v.n_cached);
    }
    serve_gen_release(fol);
    serve_gen_release(lead);
    /* A follower whose prompt differs is refused, not forked from the wrong KV. */
    p.n_followers = 1;
    p.follow = NULL;
    cr_assert_eq(serve_engine_submit(e, &p, &lead, &se), MT_OK, "%s", se.err.msg);
    int32_t other[40];
    memcpy(other, prompt, sizeof other);
    other[39]++;
    serve_gen_params q = p;
    q.prompt = other;
    q.n_followers = 0;
    q.follow = lead;
    serve_gen *bad = NULL;
    cr_assert_neq(serve_engine_submit(e, &q, &bad, &se), MT_OK);
    cr_assert_null(bad);
    /* The caller gives up on the held first choice: it ends, cancelled. */
    serve_gen_cancel(lead, true);
    do
        serve_gen_wait(lead, -1, 10, &v);
    while (v.finish == SERVE_FINISH_NONE);
    cr_assert_eq(v.finish, SERVE_FINISH_CANCELLED);
    serve_gen_release(lead);
}

/* ---- hostile text: NUL, surrogates, overlong UTF-8 -------------------------------------- */

Test(serve_agent, nul_in_a_prompt_is_tokenized_whole)
{
    const model_tokenizer *tok = serve_engine_info(serve_server_engine(T.s))->tok;
    int32_t *want;
    size_t nw;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tokenizer_encode(tok, "a\0b\x01\x7f", 5, &want, &nw, &err), MT_OK, "%s",
                 err.msg);
    cJSON *j;
    cr_assert_eq(http(&T, "POST", "/tokenize", "{\"prompt\":\"a\\u0000b\\u0001\\u007f\"}", &j, NULL),
                 200);
    cr_assert_eq(cJSON_GetObjectItem(j, "count")->valueint, (int)nw);
    int k = 0;
    cJSON *id;
    cJSON_ArrayForEach(id, cJSON_GetObjectItem(j, "tokens"))
    {
        cr_assert_eq((int32_t)id->valuedouble, want[k]);
        k++;
    }
    cJSON_Delete(j);
    free(want);
    /* A completion counts every prompt token. */
    cr_assert_eq(model_tokenizer_encode(tok, "a\0b c d e f", 11, &want, &nw, &err), MT_OK);
    cr_assert_eq(http(&T, "POST", "/v1/completions",
                      "{\"prompt\":\"a\\u0000b c d e f\",\"max_tokens\":1}", &j, NULL),
                 200);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens")->valueint,
                 (int)nw);
    cr_assert_gt(nw, 1);
    cJSON_Delete(j);
    free(want);
    /* A chat message too: the same ids as the chat format of the whole text. */
    model_chat_msg m = {MODEL_CHAT_USER, "x\0y", NULL};
    model_chat_extra x = {.content_len = 3};
    model_chat_opts o = {.add_generation_prompt = true, .extra = &x};
    cr_assert_eq(model_chat_encode(tok, &m, 1, &o, &want, &nw, &err), MT_OK);
    cr_assert_eq(http(&T, "POST", "/tokenize",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\\u0000y\"}]}", &j, NULL),
                 200);
    cr_assert_eq(cJSON_GetObjectItem(j, "count")->valueint, (int)nw);
    cJSON_Delete(j);
    free(want);
}

Test(serve_agent, surrogates_overlong_utf8_and_nul_where_unsupported_are_400)
{
    struct {
        const char *path, *body, *param, *needle;
    } cases[] = {
        {"/v1/completions", "{\"prompt\":\"a\\ud800b\"}", NULL, "surrogate"},
        {"/v1/completions", "{\"prompt\":\"a\\udc00\"}", NULL, "surrogate"},
        {"/v1/completions", "{\"prompt\":\"a\xc0\xaf\"}", "prompt", "UTF-8"},
        {"/v1/completions", "{\"prompt\":\"a\xe0\x80\xaf\"}", "prompt", "UTF-8"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"\xf0\x80\x80\xaf\"}]}",
         "messages[0].content", "UTF-8"},
        {"/v1/completions", "{\"prompt\":\"a\",\"stop\":[\"x\\u0000\"]}", "stop[0]", "U+0000"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":"
         "\"r\\u0000\"}]}",
         "messages[0].reasoning_content", "U+0000"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *j;
        cr_assert_eq(http(&T, "POST", cases[i].path, cases[i].body, &j, NULL), 400, "case %zu", i);
        const char *msg = assert_error_shape(j, cases[i].body);
        cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "param");
        if (cases[i].param)
            cr_assert_str_eq(p->valuestring, cases[i].param, "case %zu: %s", i, msg);
        cr_assert_not_null(strstr(msg, cases[i].needle), "case %zu: %s", i, msg);
        cJSON_Delete(j);
    }
    /* The server keeps serving. */
    cr_assert_eq(http(&T, "GET", "/health", NULL, NULL, NULL), 200);
}
