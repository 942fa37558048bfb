/* test_serve_http.c: the server over real HTTP on 127.0.0.1 with the real
 * runtime on the tiny model (cpu): completions and chat, plain and
 * streaming, agree with each other and with the tokenizer; stop strings and
 * seeds; 20 concurrent requests give the tokens of sequential greedy
 * generation on a runtime of our own; a repeated prefix reports cached
 * tokens and comes back faster; a chat's next turn reuses no KV of a reply
 * below index_topk and gets a fresh prefill's tokens; a client that leaves
 * mid-stream frees its KV pages (seen in /metrics) and the server keeps
 * serving. */
#include <pthread.h>

#include "test_serve_util.h"

static model_tokenizer *tok_of(const tsrv *t)
{
    return (model_tokenizer *)serve_engine_info(serve_server_engine(t->s))->tok;
}

static char *decode_skip_special(const tsrv *t, const int32_t *ids, int n)
{
    char *s;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tokenizer_decode(tok_of(t), ids, (size_t)n, true, &s, NULL, &err), MT_OK,
                 "%s", err.msg);
    return s;
}

Test(serve_http, completions_and_chat_plain_and_streaming)
{
    tsrv t;
    tsrv_start(&t, NULL);
    cJSON *j;
    cr_assert_eq(http(&t, "GET", "/health", NULL, &j, NULL), 200);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "status")->valuestring, "ok");
    cJSON_Delete(j);
    cr_assert_eq(http(&t, "GET", "/v1/models", NULL, &j, NULL), 200);
    cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0);
    cr_assert_str_eq(cJSON_GetObjectItem(m, "id")->valuestring, strrchr(t.dir, '/') + 1);
    cr_assert_eq(cJSON_GetObjectItem(m, "max_model_len")->valuedouble, 4096);
    cJSON_Delete(j);

    /* Plain completion. */
    const char *prompt = "The lighthouse keeper woke before the sun";
    char body[512];
    snprintf(body, sizeof body,
             "{\"prompt\":\"%s\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,"
             "\"return_token_ids\":true}",
             prompt);
    cr_assert_eq(http(&t, "POST", "/v1/completions", body, &j, NULL), 200);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "text_completion");
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    const char *text = cJSON_GetObjectItem(c0, "text")->valuestring;
    cr_assert_str_eq(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
    cJSON *ids = cJSON_GetObjectItem(c0, "token_ids");
    cr_assert_eq(cJSON_GetArraySize(ids), 12);
    int32_t plain_ids[12];
    for (int i = 0; i < 12; i++)
        plain_ids[i] = (int32_t)cJSON_GetArrayItem(ids, i)->valuedouble;
    char *want = decode_skip_special(&t, plain_ids, 12);
    cr_assert_str_eq(text, want, "the text is the decode of the tokens");
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    int32_t *pids;
    size_t np;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tokenizer_encode(tok_of(&t), prompt, strlen(prompt), &pids, &np, &err),
                 MT_OK);
    cr_assert_eq(cJSON_GetObjectItem(u, "prompt_tokens")->valuedouble, (double)np);
    cr_assert_eq(cJSON_GetObjectItem(u, "completion_tokens")->valuedouble, 12);
    cr_assert_eq(cJSON_GetObjectItem(u, "total_tokens")->valuedouble, (double)np + 12);
    cr_assert(cJSON_IsNumber(
        cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens")));
    char *text_copy = strdup(text);
    cJSON_Delete(j);

    /* The same, streamed: same tokens, same text, then usage and [DONE]. */
    snprintf(body, sizeof body,
             "{\"prompt\":\"%s\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,"
             "\"return_token_ids\":true,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}",
             prompt);
    tstream s;
    memset(&s, 0, sizeof s);
    cr_assert_eq(tstream_run(&t, "/v1/completions", body, &s), 200);
    cr_assert(s.done && !s.after_done && !s.error_event);
    cr_assert_eq(s.n_ids, 12);
    cr_assert_arr_eq(s.ids, plain_ids, sizeof plain_ids);
    cr_assert_str_eq(s.text, text_copy);
    cr_assert_str_eq(s.finish, "length");
    cr_assert_eq(s.usage_events, 1);
    cr_assert_eq(cJSON_GetObjectItem(s.usage, "completion_tokens")->valuedouble, 12);
    cJSON_Delete(s.usage);

    /* Token ids as the prompt give the same answer as the text. */
    char *pj = ids_json(pids, (int)np);
    char big[4096];
    snprintf(big, sizeof big,
             "{\"prompt\":%s,\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,"
             "\"return_token_ids\":true}",
             pj);
    cr_assert_eq(http(&t, "POST", "/v1/completions", big, &j, NULL), 200);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cr_assert_str_eq(cJSON_GetObjectItem(c0, "text")->valuestring, text_copy);
    cJSON_Delete(j);

    /* A stop string from the middle of that text cuts it there: the first
     * three bytes from the middle on (wrapping) that are plain printable
     * ASCII, since the text may hold control characters or U+FFFD (bytes
     * of a split multi-byte token), and a window cutting one of those
     * would not be a string a client can send. */
    size_t tl = strlen(text_copy);
    int ok_requests = 5; /* the completions so far and below, without the stop one */
    if (tl >= 6) {
        char stop[4] = "";
        bool plain = false;
        for (size_t d = 0; d + 3 <= tl && !plain; d++) {
            size_t at = (tl / 2 + d) % (tl - 2);
            plain = true;
            for (int i = 0; i < 3; i++) {
                unsigned char ch = (unsigned char)text_copy[at + (size_t)i];
                plain = plain && ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\';
            }
            if (plain)
                memcpy(stop, text_copy + at, 3);
        }
        stop[3] = 0;
        ok_requests += plain;
        if (plain) {
            snprintf(big, sizeof big,
                     "{\"prompt\":%s,\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,"
                     "\"stop\":[\"%s\"]}",
                     pj, stop);
            cr_assert_eq(http(&t, "POST", "/v1/completions", big, &j, NULL), 200);
            c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
            const char *cut = cJSON_GetObjectItem(c0, "text")->valuestring;
            size_t at = (size_t)(strstr(text_copy, stop) - text_copy);
            cr_assert_eq(strlen(cut), at, "'%s' cut at '%s' gave '%s'", text_copy, stop, cut);
            cr_assert(!strncmp(cut, text_copy, at));
            cr_assert_str_eq(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop");
            cJSON_Delete(j);
        }
    }

    /* Sampling with a seed repeats; temperature 1. */
    snprintf(big, sizeof big,
             "{\"prompt\":%s,\"max_tokens\":10,\"temperature\":1,\"top_k\":50,\"top_p\":0.9,"
             "\"seed\":1234,\"ignore_eos\":true,\"return_token_ids\":true}",
             pj);
    char *r1 = NULL, *r2 = NULL;
    cr_assert_eq(http(&t, "POST", "/v1/completions", big, &j, NULL), 200);
    r1 = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "token_ids"));
    cJSON_Delete(j);
    cr_assert_eq(http(&t, "POST", "/v1/completions", big, &j, NULL), 200);
    r2 = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "token_ids"));
    cJSON_Delete(j);
    cr_assert_str_eq(r1, r2);
    free(r1);
    free(r2);

    /* Chat, plain and streamed. */
    const char *chat = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":\"Tell me about the harbour.\"}],"
                       "\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true%s}";
    snprintf(big, sizeof big, chat, "");
    cr_assert_eq(http(&t, "POST", "/v1/chat/completions", big, &j, NULL), 200);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion");
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *msg = cJSON_GetObjectItem(c0, "message");
    cr_assert_str_eq(cJSON_GetObjectItem(msg, "role")->valuestring, "assistant");
    char *content = strdup(cJSON_GetObjectItem(msg, "content")->valuestring);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")
                     ->valuedouble,
                 10);
    cJSON_Delete(j);
    snprintf(big, sizeof big, chat,
             ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    memset(&s, 0, sizeof s);
    s.chat = true;
    cr_assert_eq(tstream_run(&t, "/v1/chat/completions", big, &s), 200);
    cr_assert(s.done && s.saw_role && !s.error_event);
    cr_assert_str_eq(s.text, content);
    cr_assert_str_eq(s.finish, "length");
    cJSON_Delete(s.usage);
    free(content);

    /* tokenize / detokenize. */
    snprintf(body, sizeof body, "{\"prompt\":\"%s\"}", prompt);
    cr_assert_eq(http(&t, "POST", "/tokenize", body, &j, NULL), 200);
    cr_assert_eq(cJSON_GetObjectItem(j, "count")->valuedouble, (double)np);
    char *tj = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "tokens"));
    cr_assert_str_eq(tj, pj);
    cJSON_Delete(j);
    snprintf(big, sizeof big, "{\"tokens\":%s}", tj);
    cr_assert_eq(http(&t, "POST", "/detokenize", big, &j, NULL), 200);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "prompt")->valuestring, prompt);
    cJSON_Delete(j);
    free(tj);

    cr_assert_geq(metric(&t, "moetune_requests_total{endpoint=\"completions\",outcome=\"ok\"}"),
                  ok_requests);
    cr_assert_eq(metric(&t, "moetune_requests_running"), 0);
    free(pj);
    free(pids);
    free(want);
    free(text_copy);
    tsrv_stop(&t);
}

/* ---- concurrency ----------------------------------------------------------------- */

#define NCONC 20
#define CONC_TOKENS 12

typedef struct conc {
    const tsrv *t;
    int32_t prompt[80];
    int n;
    bool stream;
    int status;
    int32_t got[CONC_TOKENS];
    int n_got;
} conc;

static void *conc_main(void *arg)
{
    conc *c = arg;
    char *pj = ids_json(c->prompt, c->n);
    char body[2048];
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,"
             "\"return_token_ids\":true,\"stream\":%s}",
             pj, CONC_TOKENS, c->stream ? "true" : "false");
    free(pj);
    if (c->stream) {
        tstream *s = calloc(1, sizeof *s);
        c->status = tstream_run(c->t, "/v1/completions", body, s);
        c->n_got = s->done ? s->n_ids : -1;
        memcpy(c->got, s->ids, sizeof c->got);
        cJSON_Delete(s->usage);
        free(s);
    } else {
        cJSON *j = NULL;
        c->status = http(c->t, "POST", "/v1/completions", body, &j, NULL);
        cJSON *ids = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0),
                                         "token_ids");
        c->n_got = cJSON_GetArraySize(ids);
        for (int i = 0; i < c->n_got && i < CONC_TOKENS; i++)
            c->got[i] = (int32_t)cJSON_GetArrayItem(ids, i)->valuedouble;
        cJSON_Delete(j);
    }
    return NULL;
}

Test(serve_http, concurrent_requests_match_sequential_greedy)
{
    tsrv t;
    tsrv_start(&t, NULL);
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    static conc cs[NCONC];
    for (int i = 0; i < NCONC; i++) {
        cs[i].t = &t;
        cs[i].n = 3 + (int)mt_rng_below(&rng, 70);
        cs[i].stream = i % 2;
        /* A few share their first tokens, so the prefix cache plays too. */
        for (int k = 0; k < cs[i].n; k++)
            cs[i].prompt[k] = (i % 4 == 0 && k < 40) ? 100 + k : 16 + (int32_t)mt_rng_below(&rng, 480);
    }
    pthread_t th[NCONC];
    for (int i = 0; i < NCONC; i++)
        pthread_create(&th[i], NULL, conc_main, &cs[i]);
    for (int i = 0; i < NCONC; i++)
        pthread_join(th[i], NULL);
    /* The server batched them: some step held more than one sequence. */
    double steps = metric(&t, "moetune_batch_size_count");
    double single = metric(&t, "moetune_batch_size_bucket{le=\"1\"}");
    cr_assert_lt(single, steps, "every step ran one sequence: no batching");
    model_runtime *ref = reference_open(&t);
    const int32_t *prompts[NCONC];
    int lens[NCONC];
    for (int i = 0; i < NCONC; i++) {
        prompts[i] = cs[i].prompt;
        lens[i] = cs[i].n;
    }
    static int32_t want[NCONC * CONC_TOKENS];
    bool stable[NCONC];
    int n_stable = greedy_stable(ref, prompts, lens, NCONC, CONC_TOKENS, want, stable);
    cr_log_info("%d of %d prompts have batch-independent greedy tokens in the runtime\n",
                n_stable, NCONC);
    cr_assert_geq(n_stable, NCONC / 2, "the runtime's greedy tokens depend on batching for "
                  "%d of %d prompts", NCONC - n_stable, NCONC);
    for (int i = 0; i < NCONC; i++) {
        cr_assert_eq(cs[i].status, 200, "request %d", i);
        cr_assert_eq(cs[i].n_got, CONC_TOKENS, "request %d", i);
        for (int k = 0; stable[i] && k < CONC_TOKENS; k++)
            cr_assert_eq(cs[i].got[k], want[i * CONC_TOKENS + k],
                         "seed %llu: request %d token %d: %d, greedy %d",
                         (unsigned long long)seed, i, k, cs[i].got[k], want[i * CONC_TOKENS + k]);
    }
    model_runtime_close(ref);
    tsrv_stop(&t);
}

/* ---- prefix cache ------------------------------------------------------------------ */

static double cached_of(const tstream *s)
{
    cJSON *d = cJSON_GetObjectItem(s->usage, "prompt_tokens_details");
    return cJSON_GetObjectItem(d, "cached_tokens")->valuedouble;
}

Test(serve_http, repeated_prefix_is_cached_and_faster)
{
    tsrv t;
    tsrv_start(&t, NULL);
    int32_t prompt[1024];
    for (int i = 0; i < 1024; i++)
        prompt[i] = 16 + (i * 7919) % 480;
    char *pj = ids_json(prompt, 1024);
    size_t bl = strlen(pj) + 256;
    char *body = malloc(bl);
    snprintf(body, bl,
             "{\"prompt\":%s,\"max_tokens\":4,\"temperature\":0,\"ignore_eos\":true,"
             "\"return_token_ids\":true,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}",
             pj);
    tstream a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    cr_assert_eq(tstream_run(&t, "/v1/completions", body, &a), 200);
    cr_assert_eq(tstream_run(&t, "/v1/completions", body, &b), 200);
    cr_assert_eq(cached_of(&a), 0);
    /* Whole pages of 16, and at least one token is computed: 1008 of 1024. */
    cr_assert_eq(cached_of(&b), 1008);
    cr_assert_eq(cJSON_GetObjectItem(b.usage, "prompt_tokens")->valuedouble, 1024);
    cr_assert_arr_eq(a.ids, b.ids, 4 * sizeof a.ids[0], "the cache changes no token");
    cr_assert_lt(b.ttft, a.ttft, "TTFT %.3f s with the prefix cached, %.3f s without", b.ttft,
                 a.ttft);
    cr_log_info("TTFT: %.3f s cold, %.3f s with 1008 of 1024 tokens cached\n", a.ttft, b.ttft);
    cr_assert_eq(metric(&t, "moetune_prefix_cache_hits_total"), 1008);
    /* A prompt sharing the first 520 tokens reuses 512 (whole pages). */
    for (int i = 520; i < 1024; i++)
        prompt[i] = 17 + (i * 31) % 470;
    free(pj);
    pj = ids_json(prompt, 600);
    snprintf(body, bl,
             "{\"prompt\":%s,\"max_tokens\":2,\"temperature\":0,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}",
             pj);
    tstream c;
    memset(&c, 0, sizeof c);
    cr_assert_eq(tstream_run(&t, "/v1/completions", body, &c), 200);
    cr_assert_eq(cached_of(&c), 512);
    cJSON_Delete(a.usage);
    cJSON_Delete(b.usage);
    cJSON_Delete(c.usage);
    free(pj);
    free(body);
    tsrv_stop(&t);
}

/* A greedy reply of 40 tokens to prompt[0..n), then the next turn: the
 * prompt, that reply and 3 more tokens. Returns the next turn's cached
 * tokens; its 4 greedy tokens go to out. */
static double next_turn(const tsrv *t, int32_t *prompt, int n, int32_t *out)
{
    char body[4096];
    tstream s;
    for (int turn = 0; turn < 2; turn++) {
        char *pj = ids_json(prompt, n);
        snprintf(body, sizeof body,
                 "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,"
                 "\"return_token_ids\":true,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}",
                 pj, turn ? 4 : 40);
        free(pj);
        memset(&s, 0, sizeof s);
        cr_assert_eq(tstream_run(t, "/v1/completions", body, &s), 200);
        cr_assert_eq(s.n_ids, turn ? 4 : 40);
        if (turn)
            break;
        cJSON_Delete(s.usage);
        memcpy(prompt + n, s.ids, sizeof(int32_t) * 40);
        for (int i = 0; i < 3; i++)
            prompt[n + 40 + i] = 16 + i;
        n += 43;
    }
    memcpy(out, s.ids, sizeof(int32_t) * 4);
    double cached = cached_of(&s);
    cJSON_Delete(s.usage);
    return cached;
}

/* The reply of a finished request is retained with its sequence, but its
 * tokens were generated: below index_topk they took the absorbed attention
 * path, where the same tokens in a prompt take mla_prefill. The next
 * turn's prompt reuses only the first turn's prompt there (whole pages:
 * none of a short one), and gets the tokens of a fresh prefill; past
 * index_topk the paths agree, so a long first turn's reply is reused. */
Test(serve_http, next_turn_reuses_no_reply_kv_below_index_topk)
{
    tsrv t;
    tsrv_start(&t, NULL);
    model_runtime *ref = reference_open(&t);
    int topk = (int)model_runtime_config(ref)->index_topk;
    int page = model_kv_page_size(ref);
    cr_assert(topk > 5 && topk + 4 + 40 >= 3 * page, "index_topk %d, page %d", topk, page);
    int32_t prompt[128], got[4], want[4];
    for (int i = 0; i < 128; i++)
        prompt[i] = 40 + i;
    double cached = next_turn(&t, prompt, 5, got);
    greedy_reference(ref, prompt, 5 + 43, 4, want);
    cr_assert_eq(cached, 0, "a reply below index_topk was reused: %g tokens", cached);
    cr_assert_arr_eq(got, want, sizeof got, "the next turn's tokens differ from a fresh prefill");
    /* A first turn past index_topk: its computed pages, reply included. */
    for (int i = 0; i < 128; i++)
        prompt[i] = 300 + i;
    int n = topk + 4;
    cached = next_turn(&t, prompt, n, got);
    cr_assert_eq(cached, (double)((n + 39) / page * page), "a long first turn's reply");
    model_runtime_close(ref);
    tsrv_stop(&t);
}

/* ---- disconnect ---------------------------------------------------------------------- */

typedef struct during {
    const tsrv *t;
    double pages, running;
} during;

static void sample_during(tstream *s)
{
    during *d = s->user;
    if (s->n_ids >= 3 && d->pages < 0) {
        d->pages = metric(d->t, "moetune_kv_pages_used");
        d->running = metric(d->t, "moetune_requests_running");
    }
}

Test(serve_http, disconnect_mid_stream_frees_resources)
{
    tsrv t;
    tsrv_start(&t, NULL);
    double base = metric(&t, "moetune_kv_pages_used");
    int32_t prompt[300];
    for (int i = 0; i < 300; i++)
        prompt[i] = 20 + i % 400;
    char *pj = ids_json(prompt, 300);
    char *body = malloc(strlen(pj) + 256);
    sprintf(body,
            "{\"prompt\":%s,\"max_tokens\":3000,\"temperature\":0,\"ignore_eos\":true,"
            "\"return_token_ids\":true,\"stream\":true}",
            pj);
    tstream s;
    memset(&s, 0, sizeof s);
    during d = {&t, -1, -1};
    s.user = &d;
    s.on_tokens = sample_during;
    s.abort_after = 6;
    cr_assert_eq(tstream_run(&t, "/v1/completions", body, &s), 200);
    cr_assert(!s.done, "the stream was cut before it ended");
    cr_assert_eq(d.running, 1);
    cr_assert_geq(d.pages, base + 300 / 16, "the request held its pages while streaming");
    /* The server notices at its next write and frees the request. */
    double pages = -1, running = -1, cancelled = 0;
    for (int i = 0; i < 200; i++) {
        pages = metric(&t, "moetune_kv_pages_used");
        running = metric(&t, "moetune_requests_running");
        cancelled = metric(&t, "moetune_requests_total{endpoint=\"completions\",outcome="
                               "\"cancelled\"}");
        if (pages == base && running == 0 && cancelled == 1)
            break;
        usleep(50000);
    }
    cr_assert_eq(running, 0);
    cr_assert_eq(pages, base, "KV pages used %g after the disconnect, %g before", pages, base);
    cr_assert_eq(cancelled, 1);
    double generated = metric(&t, "moetune_generation_tokens_total");
    cr_assert_lt(generated, 3000, "generation stopped early (%g tokens)", generated);
    /* And the server keeps serving. */
    cJSON *j;
    cr_assert_eq(http(&t, "POST", "/v1/completions",
                      "{\"prompt\":[1,2,3],\"max_tokens\":2,\"temperature\":0}", &j, NULL),
                 200);
    cJSON_Delete(j);
    free(pj);
    free(body);
    tsrv_stop(&t);
}
