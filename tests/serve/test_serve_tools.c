/* test_serve_tools.c: tool calls as the model writes them, scripted token by
 * token through the engine's test hook (a marker word in the user message
 * picks the script): a call cut off before its end is content with
 * finish_reason "stop" in a stream exactly as in a plain response (nothing
 * announced first); with parallel_tool_calls false a second call is never
 * made (its tool-call token refused) nor parsed; with tool_choice "none" the
 * tool-call token is refused, so no raw "<tool_call>" reaches the content;
 * with tool_choice "required" a model that would answer in prose is forced
 * into a call. */
#include "test_serve_util.h"

typedef struct script {
    const char *marker;
    const char *text;
    int32_t *mark, *out;
    size_t n_mark, n_out;
} script;

static script S[] = {
    {"zqmalformed", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par", NULL, NULL, 0, 0},
    {"zqtwocalls",
     "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
     "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>",
     NULL, NULL, 0, 0},
    {"zqnone", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>",
     NULL, NULL, 0, 0},
    {"zqprose", "It is sunny.", NULL, NULL, 0, 0},
};
enum { N_SCRIPTS = sizeof S / sizeof S[0] };
static int32_t endoftext;

static bool has_seq(const int32_t *t, int64_t n, const int32_t *s, size_t k)
{
    for (int64_t i = 0; i + (int64_t)k <= n; i++)
        if (!memcmp(t + i, s, k * sizeof *s))
            return true;
    return false;
}

static int32_t hook(void *ctx, const int32_t *tokens, int64_t n_prompt, int64_t n_gen)
{
    (void)ctx;
    for (int i = 0; i < N_SCRIPTS; i++)
        if (has_seq(tokens, n_prompt, S[i].mark, S[i].n_mark))
            return (size_t)n_gen < S[i].n_out ? S[i].out[n_gen] : endoftext;
    return -1;
}

static tsrv T;

static void start(void)
{
    serve_server_opts o;
    memset(&o, 0, sizeof o);
    o.engine.sample_hook = hook;
    tsrv_start(&T, &o);
    const model_tokenizer *tok = serve_engine_info(serve_server_engine(T.s))->tok;
    mt_err err = MT_ERR_INIT;
    for (int i = 0; i < N_SCRIPTS; i++) {
        cr_assert_eq(model_tokenizer_encode_plain(tok, S[i].marker, strlen(S[i].marker),
                                                  &S[i].mark, &S[i].n_mark, &err),
                     MT_OK);
        cr_assert_eq(model_tokenizer_encode(tok, S[i].text, strlen(S[i].text), &S[i].out,
                                            &S[i].n_out, &err),
                     MT_OK);
    }
    endoftext = model_tokenizer_token_id(tok, "<|endoftext|>");
    cr_assert_geq(endoftext, 0);
}

static void stop(void)
{
    tsrv_stop(&T);
    for (int i = 0; i < N_SCRIPTS; i++) {
        free(S[i].mark);
        free(S[i].out);
    }
}

TestSuite(serve_tools, .init = start, .fini = stop, .timeout = 900);

static const char TOOLS[] =
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12}},"
    "\"required\":[\"city\"]}}}]";

/* What a chat answer holds, plain or streamed alike. */
typedef struct answer {
    serve_buf content;
    int n_calls;
    char names[8][32];
    serve_buf args[8];
    char finish[16];
} answer;

static void answer_free(answer *a)
{
    serve_buf_release(&a->content);
    for (int i = 0; i < 8; i++)
        serve_buf_release(&a->args[i]);
}

static void take_calls(answer *a, const cJSON *tcs, bool stream)
{
    const cJSON *tc;
    int k = 0;
    cJSON_ArrayForEach(tc, tcs)
    {
        int i = stream ? cJSON_GetObjectItem(tc, "index")->valueint : k++;
        cr_assert(i >= 0 && i < 8);
        const cJSON *f = cJSON_GetObjectItem(tc, "function");
        const cJSON *nm = cJSON_GetObjectItem(f, "name");
        if (cJSON_IsString(nm))
            snprintf(a->names[i], sizeof a->names[i], "%s", nm->valuestring);
        serve_buf_puts(&a->args[i], cJSON_GetObjectItem(f, "arguments")->valuestring);
        if (i + 1 > a->n_calls)
            a->n_calls = i + 1;
    }
}

static void ask(const char *marker, const char *extra, bool stream, answer *a)
{
    memset(a, 0, sizeof *a);
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],%s,\"max_tokens\":200,"
             "\"temperature\":0,\"stream\":%s%s}",
             marker, TOOLS, stream ? "true" : "false", extra ? extra : "");
    char *raw = NULL;
    cr_assert_eq(http(&T, "POST", "/v1/chat/completions", body, NULL, &raw), 200);
    if (!stream) {
        cJSON *j = cJSON_Parse(raw);
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        cJSON *m = cJSON_GetObjectItem(ch, "message");
        cJSON *c = cJSON_GetObjectItem(m, "content");
        if (cJSON_IsString(c))
            serve_buf_puts(&a->content, c->valuestring);
        take_calls(a, cJSON_GetObjectItem(m, "tool_calls"), false);
        snprintf(a->finish, sizeof a->finish, "%s",
                 cJSON_GetObjectItem(ch, "finish_reason")->valuestring);
        cJSON_Delete(j);
        free(raw);
        return;
    }
    for (char *l = strstr(raw, "data: "); l; l = strstr(l + 1, "\ndata: ")) {
        char *p = l[0] == '\n' ? l + 7 : l + 6;
        char *eol = strchr(p, '\n');
        if (!eol || !strncmp(p, "[DONE]", 6))
            continue;
        cJSON *o = cJSON_ParseWithLength(p, (size_t)(eol - p));
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        cJSON *d = cJSON_GetObjectItem(ch, "delta");
        cJSON *c = cJSON_GetObjectItem(d, "content");
        if (cJSON_IsString(c))
            serve_buf_puts(&a->content, c->valuestring);
        take_calls(a, cJSON_GetObjectItem(d, "tool_calls"), true);
        cJSON *f = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(f))
            snprintf(a->finish, sizeof a->finish, "%s", f->valuestring);
        cJSON_Delete(o);
    }
    free(raw);
}

static void same_answer(const answer *x, const answer *y)
{
    cr_assert_str_eq(x->content.data ? x->content.data : "", y->content.data ? y->content.data : "");
    cr_assert_eq(x->n_calls, y->n_calls);
    for (int i = 0; i < x->n_calls; i++) {
        cr_assert_str_eq(x->names[i], y->names[i]);
        cr_assert_str_eq(x->args[i].data ? x->args[i].data : "",
                         y->args[i].data ? y->args[i].data : "");
    }
    cr_assert_str_eq(x->finish, y->finish);
}

Test(serve_tools, a_cut_off_call_streams_as_it_answers_plain)
{
    answer plain, stream;
    ask("zqmalformed", NULL, false, &plain);
    ask("zqmalformed", NULL, true, &stream);
    cr_assert_eq(plain.n_calls, 0);
    cr_assert_str_eq(plain.finish, "stop");
    cr_assert_str_eq(plain.content.data, S[0].text, "the cut call is content");
    same_answer(&plain, &stream);
    answer_free(&plain);
    answer_free(&stream);
}

Test(serve_tools, two_calls_or_one_without_parallel_tool_calls)
{
    answer a, b;
    ask("zqtwocalls", NULL, false, &a);
    cr_assert_eq(a.n_calls, 2);
    cr_assert_str_eq(a.finish, "tool_calls");
    cr_assert_str_eq(a.args[1].data, "{\"city\":\"Rome\"}");
    answer_free(&a);
    for (int stream = 0; stream < 2; stream++) {
        ask("zqtwocalls", ",\"parallel_tool_calls\":false", stream, &b);
        cr_assert_eq(b.n_calls, 1, "stream %d", stream);
        cr_assert_str_eq(b.args[0].data, "{\"city\":\"Paris\"}");
        cr_assert_str_eq(b.finish, "tool_calls");
        cr_assert_null(strstr(b.content.data ? b.content.data : "", "<tool_call>"), "%s",
                       b.content.data);
        answer_free(&b);
    }
}

Test(serve_tools, tool_choice_none_refuses_the_call_token)
{
    answer a;
    /* The script starts with the call: as it is, auto makes it a call. */
    ask("zqnone", NULL, false, &a);
    cr_assert_eq(a.n_calls, 1);
    answer_free(&a);
    for (int stream = 0; stream < 2; stream++) {
        ask("zqnone", ",\"tool_choice\":\"none\"", stream, &a);
        cr_assert_eq(a.n_calls, 0);
        cr_assert_null(strstr(a.content.data ? a.content.data : "", "<tool_call>"),
                       "raw call text in the content: %s", a.content.data);
        answer_free(&a);
    }
}

Test(serve_tools, tool_choice_required_forces_a_call_over_prose)
{
    answer a;
    ask("zqprose", NULL, false, &a);
    cr_assert_eq(a.n_calls, 0);
    cr_assert_str_eq(a.content.data, "It is sunny.");
    answer_free(&a);
    for (int stream = 0; stream < 2; stream++) {
        ask("zqprose", ",\"tool_choice\":\"required\"", stream, &a);
        cr_assert_geq(a.n_calls, 1, "stream %d", stream);
        cr_assert_str_eq(a.names[0], "get_weather");
        cr_assert_str_eq(a.finish, "tool_calls");
        cJSON *args = cJSON_Parse(a.args[0].data);
        cr_assert(cJSON_IsString(cJSON_GetObjectItem(args, "city")), "%s", a.args[0].data);
        cJSON_Delete(args);
        answer_free(&a);
    }
}
