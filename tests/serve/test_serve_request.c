/* test_serve_request.c: the OpenAI request parser: fields and defaults,
 * every kind of bad input rejected as 400 naming the field, prompts turned
 * into the same ids as the tokenizer and the chat format give, length
 * checks against the context, the error body's shape, and random mutations
 * of valid bodies never crashing. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rng.h"
#include "model/format/chat.h"
#include "model/format/tiny.h"
#include "model/format/tokenizer.h"
#include "serve/serve_request.h"
#include "test_tmp.h"

static const serve_limits lim = {4096, 512};

static model_tokenizer *tok;

static void load_tok(void)
{
    char path[512];
    close(tmp_file_make(path, sizeof path, "mt_serve_tok"));
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tiny_write_tokenizer(path, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_tokenizer_load(path, &tok, &err), MT_OK, "%s", err.msg);
    unlink(path);
}

static void free_tok(void) { model_tokenizer_destroy(tok); }

static serve_request parse_ok(serve_api api, const char *body)
{
    serve_request r;
    serve_error e = SERVE_ERROR_INIT;
    cr_assert_eq(serve_request_parse(api, body, strlen(body), &lim, &r, &e), MT_OK,
                 "%s: %s", body, e.err.msg);
    return r;
}

static serve_error parse_bad(serve_api api, const char *body)
{
    serve_request r;
    serve_error e = SERVE_ERROR_INIT;
    cr_assert_eq(serve_request_parse(api, body, strlen(body), &lim, &r, &e), MT_E_INVALID,
                 "accepted: %s", body);
    cr_assert_eq(e.http, 400, "%s: http %d", body, e.http);
    cr_assert(e.err.msg[0], "no message for %s", body);
    /* Nothing left to free on failure. */
    cr_assert_null(r.text);
    cr_assert_null(r.ids);
    cr_assert_null(r.msgs);
    cr_assert_eq(r.n_stop, 0);
    return e;
}

Test(serve_request, completion_fields_are_read)
{
    serve_request r = parse_ok(SERVE_API_COMPLETIONS,
                               "{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":7,"
                               "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"seed\":-3,"
                               "\"stop\":[\"a\",\"bc\"],\"ignore_eos\":true,\"stream\":true,"
                               "\"stream_options\":{\"include_usage\":false},"
                               "\"return_token_ids\":true,\"unknown_key\":{\"x\":1}}");
    cr_assert_str_eq(r.model, "m");
    cr_assert_str_eq(r.text, "hello");
    cr_assert_eq(r.text_len, 5);
    cr_assert_eq(r.max_tokens, 7);
    cr_assert_float_eq(r.temperature, 0.5f, 1e-7);
    cr_assert_float_eq(r.top_p, 0.9f, 1e-7);
    cr_assert_eq(r.top_k, 40);
    cr_assert(r.has_seed);
    cr_assert_eq(r.seed, (uint64_t)-3);
    cr_assert_eq(r.n_stop, 2);
    cr_assert_str_eq(r.stop[1], "bc");
    cr_assert(r.ignore_eos && r.stream && r.return_token_ids);
    cr_assert(!r.include_usage);
    serve_request_release(&r);
}

Test(serve_request, defaults_follow_openai)
{
    serve_request r = parse_ok(SERVE_API_COMPLETIONS, "{\"prompt\":[1,2,3]}");
    cr_assert_eq(r.max_tokens, -1);
    cr_assert_float_eq(r.temperature, 1.0f, 0);
    cr_assert_float_eq(r.top_p, 1.0f, 0);
    cr_assert_eq(r.top_k, 0);
    cr_assert(!r.has_seed && !r.stream && !r.ignore_eos);
    cr_assert(!r.include_usage); /* OpenAI sends usage in a stream only when asked */
    cr_assert(r.has_ids);
    cr_assert_eq(r.n_ids, 3);
    cr_assert_eq(r.ids[2], 3);
    int64_t mt;
    serve_error e = SERVE_ERROR_INIT;
    cr_assert_eq(serve_request_max_tokens(&r, 3, &lim, &mt, &e), MT_OK);
    cr_assert_eq(mt, SERVE_DEFAULT_MAX_TOKENS);
    serve_request_release(&r);
    /* top_k -1 means off, as vLLM spells it. */
    r = parse_ok(SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"top_k\":-1,\"stop\":null}");
    cr_assert_eq(r.top_k, 0);
    serve_request_release(&r);
}

Test(serve_request, prompt_forms)
{
    serve_request r = parse_ok(SERVE_API_COMPLETIONS, "{\"prompt\":[\"only one\"]}");
    cr_assert_str_eq(r.text, "only one");
    serve_request_release(&r);
    r = parse_ok(SERVE_API_COMPLETIONS, "{\"prompt\":[[5,6]]}");
    cr_assert_eq(r.n_ids, 2);
    cr_assert_eq(r.ids[1], 6);
    serve_request_release(&r);
}

Test(serve_request, chat_messages_are_read)
{
    serve_request r = parse_ok(
        SERVE_API_CHAT,
        "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
        "\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"r\"},"
        "{\"role\":\"tool\",\"content\":\"42\"}],\"max_completion_tokens\":5,"
        "\"chat_template_kwargs\":{\"enable_thinking\":true}}");
    cr_assert_eq(r.n_msgs, 4);
    cr_assert_eq(r.msgs[0].role, MODEL_CHAT_SYSTEM);
    cr_assert_str_eq(r.msgs[1].content, "ab");
    cr_assert_str_eq(r.msgs[2].content, "");
    cr_assert_str_eq(r.msgs[2].reasoning, "r");
    cr_assert_eq(r.msgs[3].role, MODEL_CHAT_OBSERVATION);
    cr_assert_eq(r.max_tokens, 5);
    cr_assert(r.enable_thinking);
    cr_assert(r.add_generation_prompt);
    serve_request_release(&r);
}

static const struct {
    serve_api api;
    const char *body, *param; /* param NULL: JSON null expected */
} bad_cases[] = {
    {SERVE_API_COMPLETIONS, "{\"prompt\": \"x\"", NULL},
    {SERVE_API_COMPLETIONS, "", NULL},
    {SERVE_API_COMPLETIONS, "[1,2]", NULL},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\"} trailing", NULL},
    {SERVE_API_COMPLETIONS, "{}", "prompt"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":5}", "prompt"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":[]}", "prompt"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"]}", "prompt"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":[1,\"2\"]}", "prompt[1]"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":[1,512]}", "prompt[1]"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":[-1]}", "prompt[0]"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":[1.5]}", "prompt[0]"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":-1}", "max_tokens"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":1e300}", "max_tokens"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":4097}", "max_tokens"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":\"10\"}", "max_tokens"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":2.5}", "max_tokens"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":-0.1}", "temperature"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":true}", "temperature"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"top_p\":0}", "top_p"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"top_p\":1.01}", "top_p"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"top_k\":-2}", "top_k"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"seed\":1e20}", "seed"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"seed\":\"1\"}", "seed"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":5}", "stop"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":\"\"}", "stop"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[\"a\",7]}", "stop[1]"},
    {SERVE_API_COMPLETIONS,
     "{\"prompt\":\"x\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\","
     "\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
     "stop"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":\"yes\"}", "stream"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"ignore_eos\":1}", "ignore_eos"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"stream_options\":[]}", "stream_options"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":0}", "n"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":17}", "n"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":3,\"best_of\":2}", "best_of"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":3,\"stream\":true}", "best_of"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":21}", "logprobs"},
    {SERVE_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":5}",
     "logprobs"},
    {SERVE_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}",
     "top_logprobs"},
    {SERVE_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}",
     "tools"},
    {SERVE_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
     "\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
     "tools[1].function.name"},
    {SERVE_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
     "\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":"
     "{\"name\":\"g\"}}}",
     "tool_choice.function.name"},
    {SERVE_API_CHAT,
     "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"1\","
     "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]}]}",
     "messages[0].tool_calls[0].function.arguments"},
    {SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"model\":7}", "model"},
    {SERVE_API_CHAT, "{\"messages\":[]}", "messages"},
    {SERVE_API_CHAT, "{\"messages\":{}}", "messages"},
    {SERVE_API_CHAT, "{\"prompt\":\"x\"}", "messages"},
    {SERVE_API_CHAT, "{\"messages\":[\"hi\"]}", "messages[0]"},
    {SERVE_API_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}",
     "messages[0].role"},
    {SERVE_API_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role"},
    {SERVE_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
     "messages[0].content"},
    {SERVE_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
     "messages[0].content[0]"},
    {SERVE_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-5}",
     "max_tokens"},
    {SERVE_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":3}",
     "chat_template_kwargs"},
    {SERVE_API_DETOKENIZE, "{\"tokens\":\"abc\"}", "tokens"},
    {SERVE_API_DETOKENIZE, "{\"tokens\":[1,99999]}", "tokens[1]"},
};

Test(serve_request, bad_input_is_400_naming_the_field)
{
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        serve_error e = parse_bad(bad_cases[i].api, bad_cases[i].body);
        const char *want = bad_cases[i].param ? bad_cases[i].param : "";
        cr_assert_str_eq(e.param, want, "%s: param '%s', want '%s' (%s)", bad_cases[i].body,
                         e.param, want, e.err.msg);
    }
}

Test(serve_request, syntax_error_names_the_byte)
{
    const char *body = "{\"prompt\": [1, 2,, 3]}";
    serve_error e = parse_bad(SERVE_API_COMPLETIONS, body);
    cr_assert_str_eq(e.code, "invalid_json");
    cr_assert(strstr(e.err.msg, "byte 17"), "%s", e.err.msg);
}

Test(serve_request, error_body_has_openai_shape)
{
    serve_error e = parse_bad(SERVE_API_COMPLETIONS, "{\"prompt\":\"x\",\"top_p\":7}");
    char *j = serve_error_json(&e);
    cJSON *o = cJSON_Parse(j);
    cr_assert_not_null(o, "%s", j);
    cJSON *er = cJSON_GetObjectItem(o, "error");
    cr_assert(cJSON_IsObject(er));
    cr_assert(cJSON_IsString(cJSON_GetObjectItem(er, "message")));
    cr_assert_str_eq(cJSON_GetObjectItem(er, "type")->valuestring, "invalid_request_error");
    cr_assert_str_eq(cJSON_GetObjectItem(er, "param")->valuestring, "top_p");
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(er, "code")));
    cJSON_Delete(o);
    free(j);
}

Test(serve_request, text_prompt_ids_equal_the_tokenizer, .init = load_tok, .fini = free_tok)
{
    const char *text = "The lighthouse keeper <|user|> counted the steps.";
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\"}", text);
    serve_request r = parse_ok(SERVE_API_COMPLETIONS, body);
    int32_t *ids, *want;
    size_t n, nw;
    serve_error e = SERVE_ERROR_INIT;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_request_prompt(&r, tok, &lim, &ids, &n, &e), MT_OK, "%s", e.err.msg);
    cr_assert_eq(model_tokenizer_encode(tok, text, strlen(text), &want, &nw, &err), MT_OK);
    cr_assert_eq(n, nw);
    cr_assert_arr_eq(ids, want, n * sizeof *ids);
    free(ids);
    free(want);
    serve_request_release(&r);
}

Test(serve_request, chat_prompt_ids_equal_the_chat_format, .init = load_tok, .fini = free_tok)
{
    serve_request r = parse_ok(SERVE_API_CHAT,
                               "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
                               "{\"role\":\"user\",\"content\":\"the baker\"}]}");
    int32_t *ids, *want;
    size_t n, nw;
    serve_error e = SERVE_ERROR_INIT;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_request_prompt(&r, tok, &lim, &ids, &n, &e), MT_OK, "%s", e.err.msg);
    model_chat_msg msgs[2] = {{MODEL_CHAT_SYSTEM, "s", NULL}, {MODEL_CHAT_USER, "the baker", NULL}};
    model_chat_opts o = {.add_generation_prompt = true, .enable_thinking = false};
    cr_assert_eq(model_chat_encode(tok, msgs, 2, &o, &want, &nw, &err), MT_OK);
    cr_assert_eq(n, nw);
    cr_assert_arr_eq(ids, want, n * sizeof *ids);
    free(ids);
    free(want);
    serve_request_release(&r);
}

Test(serve_request, lengths_are_checked_against_the_context, .init = load_tok, .fini = free_tok)
{
    serve_limits small = {10, 512};
    /* An empty text prompt. */
    serve_request r = parse_ok(SERVE_API_COMPLETIONS, "{\"prompt\":\"\"}");
    int32_t *ids;
    size_t n;
    serve_error e = SERVE_ERROR_INIT;
    cr_assert_eq(serve_request_prompt(&r, tok, &small, &ids, &n, &e), MT_E_INVALID);
    cr_assert_eq(e.http, 400);
    cr_assert_null(ids);
    serve_request_release(&r);
    /* A prompt as long as the context. */
    r = parse_ok(SERVE_API_COMPLETIONS, "{\"prompt\":[1,2,3,4,5,6,7,8,9,10]}");
    cr_assert_eq(serve_request_prompt(&r, tok, &small, &ids, &n, &e), MT_E_INVALID);
    cr_assert_str_eq(e.code, "context_length_exceeded");
    serve_request_release(&r);
    /* Prompt plus max_tokens past the context; the default is clipped. */
    r = parse_ok(SERVE_API_COMPLETIONS, "{\"prompt\":[1,2,3,4],\"max_tokens\":7}");
    cr_assert_eq(serve_request_prompt(&r, tok, &small, &ids, &n, &e), MT_OK);
    int64_t mt;
    cr_assert_eq(serve_request_max_tokens(&r, n, &small, &mt, &e), MT_E_INVALID);
    cr_assert_str_eq(e.code, "context_length_exceeded");
    r.max_tokens = 6;
    cr_assert_eq(serve_request_max_tokens(&r, n, &small, &mt, &e), MT_OK);
    cr_assert_eq(mt, 6);
    r.max_tokens = -1;
    cr_assert_eq(serve_request_max_tokens(&r, n, &small, &mt, &e), MT_OK);
    cr_assert_eq(mt, 6); /* min(16, room) */
    r.api = SERVE_API_CHAT;
    cr_assert_eq(serve_request_max_tokens(&r, 2, &small, &mt, &e), MT_OK);
    cr_assert_eq(mt, 8); /* chat: the rest of the context */
    free(ids);
    serve_request_release(&r);
}

Test(serve_request, id_prompt_needs_no_tokenizer)
{
    serve_request r = parse_ok(SERVE_API_COMPLETIONS, "{\"prompt\":[7,8]}");
    int32_t *ids;
    size_t n;
    serve_error e = SERVE_ERROR_INIT;
    cr_assert_eq(serve_request_prompt(&r, NULL, &lim, &ids, &n, &e), MT_OK);
    cr_assert_eq(n, 2);
    free(ids);
    serve_request_release(&r);
    r = parse_ok(SERVE_API_COMPLETIONS, "{\"prompt\":\"text\"}");
    cr_assert_eq(serve_request_prompt(&r, NULL, &lim, &ids, &n, &e), MT_E_INVALID);
    serve_request_release(&r);
}

/* cJSON takes every byte up to 32 as whitespace: a key followed by control
 * bytes before its colon is still a key, and the strings after it keep
 * their own lengths (the fuzzer found a read past a string when they did
 * not). */
Test(serve_request, control_bytes_before_a_colon_keep_string_lengths)
{
    const char body[] = "{\"prompt\":\"ab\",\"k\"\x03\x01\x1f:\"xyz\",\"stop\":[\"cd\"],"
                        "\"model\":\"efgh\"}";
    serve_request r = parse_ok(SERVE_API_COMPLETIONS, body);
    cr_assert_eq(r.text_len, 2);
    cr_assert_str_eq(r.stop[0], "cd");
    cr_assert_str_eq(r.model, "efgh");
    serve_request_release(&r);
}

/* The sampling fields and response_format are read; a repeated key counts
 * with its last value. */
Test(serve_request, sampling_fields_and_response_format_are_read)
{
    serve_request r = parse_ok(
        SERVE_API_CHAT,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"min_p\":0.25,"
        "\"presence_penalty\":1.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.2,"
        "\"logit_bias\":{\"7\":-100,\"9\":2.5},\"parallel_tool_calls\":false,"
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
        "\"schema\":{\"type\":\"integer\"},\"strict\":true}},\"min_p\":0.5}");
    cr_assert_float_eq(r.min_p, 0.5f, 0);
    cr_assert_float_eq(r.presence_penalty, 1.5f, 0);
    cr_assert_float_eq(r.frequency_penalty, -0.5f, 0);
    cr_assert_float_eq(r.repetition_penalty, 1.2f, 1e-7);
    cr_assert_eq(r.n_logit_bias, 2);
    cr_assert_eq(r.logit_bias[0].id, 7);
    cr_assert_float_eq(r.logit_bias[1].bias, 2.5f, 0);
    cr_assert(!r.parallel_tool_calls);
    cr_assert_eq(r.format, SERVE_FORMAT_JSON_SCHEMA);
    cr_assert_str_eq(cJSON_GetObjectItem(r.schema, "type")->valuestring, "integer");
    serve_request_release(&r);
    r = parse_ok(SERVE_API_COMPLETIONS, "{\"prompt\":\"x\"}");
    cr_assert_float_eq(r.repetition_penalty, 1.0f, 0);
    cr_assert(r.parallel_tool_calls);
    cr_assert_eq(r.format, SERVE_FORMAT_TEXT);
    serve_request_release(&r);
}

/* Random byte edits of valid bodies: every result is either accepted or a
 * 400 with a message; nothing crashes or leaks (the ASan build checks). */
Test(serve_request, mutated_bodies_never_crash)
{
    static const char *const seeds[] = {
        "{\"prompt\":\"hello\",\"max_tokens\":7,\"stop\":[\"a\"],\"temperature\":0.5}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"}]}]}",
        "{\"prompt\":[1,2,3],\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
    };
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    char buf[256];
    for (int it = 0; it < 20000; it++) {
        int s = (int)mt_rng_below(&rng, 3);
        size_t n = strlen(seeds[s]);
        memcpy(buf, seeds[s], n);
        int edits = 1 + (int)mt_rng_below(&rng, 4);
        for (int k = 0; k < edits; k++) {
            size_t at = mt_rng_below(&rng, n);
            int op = (int)mt_rng_below(&rng, 3);
            static const char alphabet[] = "{}[]\":,0123456789-.etrufalsn \\x\x80\xff";
            char c = alphabet[mt_rng_below(&rng, sizeof alphabet - 1)];
            if (op == 0)
                buf[at] = c;
            else if (op == 1 && n > 1) {
                memmove(buf + at, buf + at + 1, n - at - 1);
                n--;
            } else if (n + 1 < sizeof buf) {
                memmove(buf + at + 1, buf + at, n - at);
                buf[at] = c;
                n++;
            }
        }
        serve_request r;
        serve_error e = SERVE_ERROR_INIT;
        serve_api api = s == 1 ? SERVE_API_CHAT : SERVE_API_COMPLETIONS;
        mt_status st = serve_request_parse(api, buf, n, &lim, &r, &e);
        if (st == MT_OK)
            serve_request_release(&r);
        else
            cr_assert(e.http == 400 && e.err.msg[0], "seed %llu: status %d http %d",
                      (unsigned long long)seed, st, e.http);
    }
}
