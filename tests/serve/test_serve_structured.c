/* test_serve_structured.c: structured outputs over HTTP with random weights
 * (the tiny model, sampled at temperature 1): 200 chat completions under a
 * json_schema with nested objects, arrays, enums and required keys all parse
 * and validate (schema_check.h, a validator of the test's own), plain and
 * streamed; 200 tool_choice "required" completions are calls whose arguments
 * validate against their tool's schema (a named tool, one call without
 * parallel_tool_calls); json_object answers are objects; under MTP
 * speculation the drafts are held to the grammar too; a stream and a plain
 * response of the same seed agree; unsupported schemas are 400s naming the
 * field; the sampler's parameters (logit_bias, penalties, min_p) apply the
 * same streamed and not, and bad values are 400s. */
#include "schema_check.h"
#include "test_serve_util.h"

static tsrv T;

static void start(void) { tsrv_start(&T, NULL); }
static void stop(void) { tsrv_stop(&T); }

TestSuite(serve_structured, .init = start, .fini = stop, .timeout = 900);

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\"},"
    "\"species\":{\"enum\":[\"cat\",\"dog\",\"owl\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":6},\"maxItems\":3},"
    "\"home\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\",\"maxLength\":10},"
    "\"zip\":{\"type\":[\"string\",\"null\"],\"maxLength\":5},"
    "\"floors\":{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":1,\"maxItems\":2}},"
    "\"required\":[\"city\",\"floors\"],\"additionalProperties\":false},"
    "\"vaccinated\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"species\",\"home\"],\"additionalProperties\":false}";

/* The body of a chat request under SCHEMA. */
static void schema_body(char *out, size_t cap, int n, int seed, bool stream, const char *extra)
{
    snprintf(out, cap,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Describe pet number %d.\"}],"
             "\"max_tokens\":700,\"temperature\":1.0,\"seed\":%d,\"n\":%d,\"stream\":%s%s,"
             "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"pet\","
             "\"strict\":true,\"schema\":%s}}}",
             seed, seed, n, stream ? "true" : "false", extra ? extra : "", SCHEMA);
}

static void check_json(const char *text, const cJSON *schema, const char *what)
{
    cJSON *v = cJSON_Parse(text);
    cr_assert_not_null(v, "%s: not JSON: %s", what, text);
    char why[256] = "";
    cr_assert(sc_valid(v, schema, why, sizeof why), "%s: %s: %s", what, why, text);
    cJSON_Delete(v);
}

/* Streamed chat: the content of each choice (up to 4) and the finish reasons. */
typedef struct chat_stream {
    serve_buf content[4];
    char finish[4][16];
    serve_sse_parser p;
} chat_stream;

static bool cs_event(void *ctx, const char *data, size_t n)
{
    chat_stream *s = ctx;
    if (n == 6 && !memcmp(data, "[DONE]", 6))
        return true;
    cJSON *o = cJSON_ParseWithLength(data, n);
    cr_assert_not_null(o);
    cr_assert_null(cJSON_GetObjectItem(o, "error"), "%.*s", (int)n, data);
    cJSON *ch;
    cJSON_ArrayForEach(ch, cJSON_GetObjectItem(o, "choices"))
    {
        int i = cJSON_GetObjectItem(ch, "index")->valueint;
        cr_assert(i >= 0 && i < 4);
        cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "delta"), "content");
        if (cJSON_IsString(c))
            serve_buf_puts(&s->content[i], c->valuestring);
        cJSON *f = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(f))
            snprintf(s->finish[i], sizeof s->finish[i], "%s", f->valuestring);
    }
    cJSON_Delete(o);
    return true;
}

static bool cs_body(void *ctx, const char *p, size_t n)
{
    chat_stream *s = ctx;
    bool stopped = false;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_sse_feed(&s->p, p, n, cs_event, s, &stopped, &err), MT_OK, "%s", err.msg);
    return true;
}

static void chat_stream_run(const tsrv *t, const char *body, chat_stream *s)
{
    memset(s, 0, sizeof *s);
    s->p = (serve_sse_parser)SERVE_SSE_PARSER_INIT;
    serve_client_resp r = SERVE_CLIENT_RESP_INIT;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_client_request(&t->url, "POST", "/v1/chat/completions", body, strlen(body),
                                      300, cs_body, s, &r, &err),
                 MT_OK, "%s", err.msg);
    cr_assert_eq(r.status, 200);
    serve_sse_release(&s->p);
    serve_client_resp_release(&r);
}

static void chat_stream_free(chat_stream *s)
{
    for (int i = 0; i < 4; i++)
        serve_buf_release(&s->content[i]);
}

Test(serve_structured, json_schema_200_sampled_completions_parse_and_validate)
{
    cJSON *schema = cJSON_Parse(SCHEMA);
    char body[4096];
    int checked = 0;
    for (int r = 0; r < 50; r++) {
        bool stream = r % 5 == 0;
        schema_body(body, sizeof body, 4, 1000 + r, stream, NULL);
        if (stream) {
            chat_stream s;
            chat_stream_run(&T, body, &s);
            for (int i = 0; i < 4; i++, checked++) {
                cr_assert_str_eq(s.finish[i], "stop", "request %d choice %d", r, i);
                check_json(s.content[i].data ? s.content[i].data : "", schema, "stream");
            }
            chat_stream_free(&s);
            continue;
        }
        cJSON *j;
        cr_assert_eq(http(&T, "POST", "/v1/chat/completions", body, &j, NULL), 200);
        cJSON *ch;
        cJSON_ArrayForEach(ch, cJSON_GetObjectItem(j, "choices"))
        {
            cr_assert_str_eq(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "stop");
            cJSON *m = cJSON_GetObjectItem(ch, "message");
            check_json(cJSON_GetObjectItem(m, "content")->valuestring, schema, "plain");
            checked++;
        }
        cJSON_Delete(j);
    }
    cr_assert_eq(checked, 200);
    cJSON_Delete(schema);
}

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":10},"
    "\"days\":{\"type\":\"integer\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\",\"days\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\",\"minLength\":1,"
    "\"maxLength\":20},\"filters\":{\"type\":\"object\",\"properties\":{\"limit\":{\"type\":"
    "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":4},"
    "\"maxItems\":2}},\"required\":[\"limit\"],\"additionalProperties\":false}},"
    "\"required\":[\"query\",\"filters\"]}}}]";

/* Checks every choice of a chat response: calls only, each a tool of TOOLS
 * (name_only: that one), arguments valid; returns the calls counted. With
 * length_ok, a choice may end at max_tokens inside a call (as many calls as
 * a random model makes when it may make several): its complete calls are
 * checked, and the open one is content. */
static int check_calls(const cJSON *j, const cJSON *tools, const char *name_only, int max_calls,
                       bool length_ok)
{
    int calls = 0;
    cJSON *ch;
    cJSON_ArrayForEach(ch, cJSON_GetObjectItem(j, "choices"))
    {
        const char *fin = cJSON_GetObjectItem(ch, "finish_reason")->valuestring;
        bool cut = length_ok && !strcmp(fin, "length");
        if (!cut)
            cr_assert_str_eq(fin, "tool_calls");
        cJSON *m = cJSON_GetObjectItem(ch, "message");
        cJSON *content = cJSON_GetObjectItem(m, "content");
        if (cut && cJSON_IsString(content) && *content->valuestring)
            cr_assert(!strncmp(content->valuestring, "<tool_call>", 11), "%s",
                      content->valuestring);
        else
            cr_assert(cJSON_IsNull(content) || !*content->valuestring, "content beside the calls");
        cJSON *tc = cJSON_GetObjectItem(m, "tool_calls"), *c;
        int n = cJSON_GetArraySize(tc);
        cr_assert((n >= 1 || cut) && n <= max_calls, "%d calls", n);
        cJSON_ArrayForEach(c, tc)
        {
            cJSON *f = cJSON_GetObjectItem(c, "function");
            const char *name = cJSON_GetObjectItem(f, "name")->valuestring;
            if (name_only)
                cr_assert_str_eq(name, name_only);
            const cJSON *params = NULL, *t;
            cJSON_ArrayForEach(t, tools)
            {
                cJSON *fn = cJSON_GetObjectItem(t, "function");
                if (!strcmp(cJSON_GetObjectItem(fn, "name")->valuestring, name))
                    params = cJSON_GetObjectItem(fn, "parameters");
            }
            cr_assert_not_null(params, "unknown tool %s", name);
            check_json(cJSON_GetObjectItem(f, "arguments")->valuestring, params, name);
            calls++;
        }
    }
    return calls;
}

Test(serve_structured, tool_choice_required_200_calls_validate)
{
    cJSON *tools = cJSON_Parse(TOOLS);
    char body[4096];
    int choices = 0, calls = 0;
    /* One call each (parallel_tool_calls false): the output is bounded. */
    for (int r = 0; r < 50; r++) {
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Task %d\"}],\"tools\":%s,"
                 "\"tool_choice\":\"required\",\"parallel_tool_calls\":false,"
                 "\"temperature\":1.0,\"seed\":%d,\"n\":4,\"max_tokens\":900}",
                 r, TOOLS, 500 + r);
        cJSON *j;
        cr_assert_eq(http(&T, "POST", "/v1/chat/completions", body, &j, NULL), 200);
        calls += check_calls(j, tools, NULL, 1, false);
        choices += cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices"));
        cJSON_Delete(j);
    }
    cr_assert_eq(choices, 200);
    cr_assert_eq(calls, 200);
    /* Several calls allowed: a random model may go on calling until
     * max_tokens; every call it completed is valid. */
    int multi = 0;
    for (int r = 0; r < 10; r++) {
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Task %d\"}],\"tools\":%s,"
                 "\"tool_choice\":\"required\",\"temperature\":1.0,\"seed\":%d,\"n\":2,"
                 "\"max_tokens\":600}",
                 r, TOOLS, 900 + r);
        cJSON *j;
        cr_assert_eq(http(&T, "POST", "/v1/chat/completions", body, &j, NULL), 200);
        multi += check_calls(j, tools, NULL, 1000, true);
        cJSON_Delete(j);
    }
    cr_log_info("tool_choice required: 200 single calls; %d calls in 20 parallel choices", multi);
    cr_assert_gt(multi, 20, "several calls in some choice");
    /* A named function: only it; parallel_tool_calls false: exactly one. */
    for (int r = 0; r < 10; r++) {
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Find %d\"}],\"tools\":%s,"
                 "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"search\"}},"
                 "\"parallel_tool_calls\":false,\"temperature\":1.0,\"seed\":%d,\"n\":2,"
                 "\"max_tokens\":900}",
                 r, TOOLS, 70 + r);
        cJSON *j;
        cr_assert_eq(http(&T, "POST", "/v1/chat/completions", body, &j, NULL), 200);
        cr_assert_eq(check_calls(j, tools, "search", 1, false), 2);
        cJSON_Delete(j);
    }
    cJSON_Delete(tools);
}

Test(serve_structured, json_object_answers_are_objects)
{
    int stopped = 0;
    for (int r = 0; r < 20; r++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"JSON %d\"}],\"max_tokens\":300,"
                 "\"temperature\":1.0,\"seed\":%d,\"response_format\":{\"type\":\"json_object\"}}",
                 r, r);
        cJSON *j;
        cr_assert_eq(http(&T, "POST", "/v1/chat/completions", body, &j, NULL), 200);
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        const char *content =
            cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "message"), "content")->valuestring;
        cr_assert_eq(content[0], '{', "%s", content);
        if (!strcmp(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "stop")) {
            cJSON *v = cJSON_Parse(content);
            cr_assert(cJSON_IsObject(v), "%s", content);
            cJSON_Delete(v);
            stopped++;
        }
        cJSON_Delete(j);
    }
    cr_log_info("json_object: %d of 20 ended within 300 tokens", stopped);
    cr_assert_gt(stopped, 0);
}

Test(serve_structured, a_stream_and_a_plain_response_of_one_seed_agree)
{
    char body[4096];
    for (int r = 0; r < 4; r++) {
        schema_body(body, sizeof body, 1, 42 + r, false, NULL);
        cJSON *j;
        cr_assert_eq(http(&T, "POST", "/v1/chat/completions", body, &j, NULL), 200);
        const char *plain = cJSON_GetObjectItem(
            cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "message"),
            "content")->valuestring;
        schema_body(body, sizeof body, 1, 42 + r, true, NULL);
        chat_stream s;
        chat_stream_run(&T, body, &s);
        cr_assert_str_eq(s.content[0].data ? s.content[0].data : "", plain);
        chat_stream_free(&s);
        cJSON_Delete(j);
    }
}

Test(serve_structured, unsupported_schemas_and_bad_formats_are_400s)
{
    struct {
        const char *body, *param, *needle;
    } cases[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":"
         "\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"object\",\"properties\":{\"a\":"
         "{\"type\":\"string\",\"pattern\":\"^a\"}}}}}}",
         "response_format.json_schema.schema.properties.a", "'pattern'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":"
         "\"json_schema\",\"json_schema\":{\"schema\":{\"$ref\":\"#/$defs/a\"}}}}",
         "response_format.json_schema.schema", "'$ref'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":"
         "\"xml\"}}",
         "response_format.type", "xml"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\","
         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
         "\"object\",\"properties\":{\"a\":{\"oneOf\":[{\"type\":\"string\"}]}}}}}]}",
         "tools[0].function.parameters.properties.a", "'oneOf'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}",
         "tool_choice", "no tools"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *j;
        cr_assert_eq(http(&T, "POST", "/v1/chat/completions", cases[i].body, &j, NULL), 400,
                     "case %zu", i);
        const char *msg = assert_error_shape(j, cases[i].body);
        cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "param");
        cr_assert_str_eq(p->valuestring, cases[i].param, "case %zu: %s", i, msg);
        cr_assert_not_null(strstr(msg, cases[i].needle), "case %zu: %s", i, msg);
        cJSON_Delete(j);
    }
}

/* ---- the sampler's parameters -------------------------------------------------------- */

static void completion_ids(const char *body, int32_t *ids, int n)
{
    cJSON *j;
    cr_assert_eq(http(&T, "POST", "/v1/completions", body, &j, NULL), 200, "%s", body);
    cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0),
                                   "token_ids");
    cr_assert_eq(cJSON_GetArraySize(t), n);
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)cJSON_GetArrayItem(t, i)->valuedouble;
    cJSON_Delete(j);
}

Test(serve_structured, sampling_parameters_apply_alike_streamed_and_not)
{
    int32_t a[24], b[24];
    /* A bias of +100 makes one token the only likely one. */
    completion_ids("{\"prompt\":[5,6,7],\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true,"
                   "\"return_token_ids\":true,\"logit_bias\":{\"77\":100}}",
                   a, 24);
    for (int i = 0; i < 24; i++)
        cr_assert_eq(a[i], 77);
    /* -100 on greedy's first token moves it. */
    completion_ids("{\"prompt\":[5,6,7],\"max_tokens\":1,\"temperature\":0,\"ignore_eos\":true,"
                   "\"return_token_ids\":true}",
                   a, 1);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":[5,6,7],\"max_tokens\":1,\"temperature\":0,\"ignore_eos\":true,"
             "\"return_token_ids\":true,\"logit_bias\":{\"%d\":-100}}",
             a[0]);
    completion_ids(body, b, 1);
    cr_assert_neq(a[0], b[0]);
    /* Penalties and min_p, sampled: the stream's tokens are the plain ones. */
    const char *params[] = {
        "\"presence_penalty\":1.5", "\"frequency_penalty\":-1.0", "\"repetition_penalty\":1.8",
        "\"min_p\":0.2",
        ("\"top_k\":5,\"presence_penalty\":0.5,\"frequency_penalty\":0.7,"
         "\"logit_bias\":{\"12\":3,\"40\":-2}")};
    for (size_t k = 0; k < sizeof params / sizeof params[0]; k++) {
        snprintf(body, sizeof body,
                 "{\"prompt\":[9,10,11,12],\"max_tokens\":24,\"temperature\":1,\"seed\":7,"
                 "\"ignore_eos\":true,\"return_token_ids\":true,%s}",
                 params[k]);
        completion_ids(body, a, 24);
        snprintf(body, sizeof body,
                 "{\"prompt\":[9,10,11,12],\"max_tokens\":24,\"temperature\":1,\"seed\":7,"
                 "\"ignore_eos\":true,\"return_token_ids\":true,\"stream\":true,%s}",
                 params[k]);
        tstream s;
        memset(&s, 0, sizeof s);
        cr_assert_eq(tstream_run(&T, "/v1/completions", body, &s), 200);
        cr_assert_eq(s.n_ids, 24);
        cr_assert_arr_eq(s.ids, a, sizeof a, "%s", params[k]);
    }
    /* A large frequency penalty, greedy: no token three times in a row. */
    completion_ids("{\"prompt\":[9,10,11,12],\"max_tokens\":24,\"temperature\":0,"
                   "\"ignore_eos\":true,\"return_token_ids\":true,\"frequency_penalty\":2}",
                   a, 24);
    completion_ids("{\"prompt\":[9,10,11,12],\"max_tokens\":24,\"temperature\":0,"
                   "\"ignore_eos\":true,\"return_token_ids\":true,\"logit_bias\":{\"30\":8},"
                   "\"frequency_penalty\":2}",
                   b, 24);
    int thirty = 0;
    for (int i = 0; i < 24; i++)
        thirty += b[i] == 30;
    cr_assert_lt(thirty, 24, "the penalty holds a biased token back");
    cr_assert_gt(thirty, 0);
}

Test(serve_structured, bad_sampling_values_are_400s)
{
    struct {
        const char *field, *param;
    } cases[] = {
        {"\"presence_penalty\":3", "presence_penalty"},
        {"\"frequency_penalty\":-2.5", "frequency_penalty"},
        {"\"repetition_penalty\":0", "repetition_penalty"},
        {"\"min_p\":1.5", "min_p"},
        {"\"logit_bias\":{\"abc\":1}", "logit_bias.abc"},
        {"\"logit_bias\":{\"99999\":1}", "logit_bias.99999"},
        {"\"logit_bias\":{\"5\":200}", "logit_bias.5"},
        {"\"logit_bias\":[1]", "logit_bias"},
        {"\"parallel_tool_calls\":1", "parallel_tool_calls"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":[1,2],\"max_tokens\":1,%s}", cases[i].field);
        cJSON *j;
        cr_assert_eq(http(&T, "POST", "/v1/completions", body, &j, NULL), 400, "%s", body);
        assert_error_shape(j, body);
        cr_assert_str_eq(
            cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "param")->valuestring,
            cases[i].param);
        cJSON_Delete(j);
    }
}

/* ---- under speculation ------------------------------------------------------------------ */

Test(serve_structured, mtp_drafts_are_held_to_the_grammar)
{
    tsrv t;
    signal(SIGPIPE, SIG_IGN);
    memset(&t, 0, sizeof t);
    tmp_dir_make(t.dir, sizeof t.dir, "mt_serve_struct_spec");
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tiny_write_mtp_map(t.dir, 1, &err), MT_OK, "%s", err.msg);
    serve_server_opts o;
    memset(&o, 0, sizeof o);
    o.engine.rt.model_dir = t.dir;
    o.engine.rt.device = "cpu";
    o.engine.rt.speculative_steps = 3;
    t.log = fopen("/dev/null", "w");
    o.engine.rt.log = t.log;
    o.host = "127.0.0.1";
    cr_assert_eq(serve_server_start(&o, &t.s, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(serve_engine_wait_ready(serve_server_engine(t.s), 900, &err), MT_OK);
    snprintf(t.url_text, sizeof t.url_text, "http://127.0.0.1:%d", serve_server_port(t.s));
    cr_assert_eq(serve_url_parse(t.url_text, &t.url, &err), MT_OK);
    cJSON *schema = cJSON_Parse(SCHEMA);
    char body[4096];
    for (int r = 0; r < 16; r++) {
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Pet %d\"}],\"max_tokens\":700,"
                 "\"temperature\":%s,\"seed\":%d,\"n\":2,\"response_format\":{\"type\":"
                 "\"json_schema\",\"json_schema\":{\"schema\":%s}}}",
                 r, r % 2 ? "1.0" : "0", r, SCHEMA);
        cJSON *j;
        cr_assert_eq(http(&t, "POST", "/v1/chat/completions", body, &j, NULL), 200);
        cJSON *ch;
        cJSON_ArrayForEach(ch, cJSON_GetObjectItem(j, "choices"))
        {
            cr_assert_str_eq(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "stop");
            check_json(cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "message"), "content")
                           ->valuestring,
                       schema, "speculative");
        }
        cJSON_Delete(j);
    }
    double drafted = metric(&t, "moetune_spec_draft_tokens_total");
    double accepted = metric(&t, "moetune_spec_accepted_tokens_total");
    cr_log_info("under a grammar with K = 3: %g of %g drafts accepted", accepted, drafted);
    cr_assert_gt(drafted, 0, "speculation ran");
    cr_assert_gt(accepted, 0, "some drafts passed the mask");
    cJSON_Delete(schema);
    tsrv_stop(&t);
}

/* Logprobs under a grammar: refused tokens (-inf) are left out of
 * top_logprobs, so every value a client reads is a number. */
Test(serve_structured, top_logprobs_leave_out_refused_tokens)
{
    char body[4096];
    schema_body(body, sizeof body, 1, 3, false, ",\"logprobs\":true,\"top_logprobs\":20");
    cJSON *j;
    cr_assert_eq(http(&T, "POST", "/v1/chat/completions", body, &j, NULL), 200);
    cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0),
                                    "logprobs");
    cJSON *e, *x;
    int fewer = 0, n = 0;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(lp, "content"))
    {
        cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(e, "logprob")));
        cJSON *top = cJSON_GetObjectItem(e, "top_logprobs");
        cJSON_ArrayForEach(x, top) cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(x, "logprob")));
        fewer += cJSON_GetArraySize(top) < 20;
        n++;
    }
    cr_assert_gt(n, 0);
    cr_assert_gt(fewer, 0, "some step allowed fewer than 20 tokens");
    cJSON_Delete(j);
}
