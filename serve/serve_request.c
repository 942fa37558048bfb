/* serve_request.c: OpenAI request bodies to serve_request, with the checks
 * listed in serve_request.h. */
#include "serve_request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SAFE_INT 9007199254740992.0 /* 2^53: doubles hold integers exactly up to here */

const char *serve_api_name(serve_api api)
{
    static const char *const names[SERVE_API_COUNT] = {
        [SERVE_API_COMPLETIONS] = "completions",
        [SERVE_API_CHAT] = "chat.completions",
        [SERVE_API_TOKENIZE] = "tokenize",
        [SERVE_API_DETOKENIZE] = "detokenize",
    };
    return (unsigned)api < SERVE_API_COUNT ? names[api] : "?";
}

/* A parameter name like "messages[3].content" (vsnprintf: truncation of a
 * long name is fine, it is only a label). */
__attribute__((format(printf, 3, 4))) static void pname(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, cap, fmt, ap);
    va_end(ap);
}

static mt_status bad(serve_error *e, const char *param, const char *fmt, const char *a)
{
    return serve_reject(e, 400, param, NULL, fmt, param, a);
}

/* A JSON integer in [lo, hi] (a number with no fraction). */
static mt_status get_int(const cJSON *v, const char *param, double lo, double hi, int64_t *out,
                         serve_error *e)
{
    if (!cJSON_IsNumber(v))
        return bad(e, param, "'%s' must be an integer%s", "");
    double d = v->valuedouble;
    if (d != floor(d) || !isfinite(d))
        return bad(e, param, "'%s' must be an integer%s", ", not a fraction");
    if (d < lo || d > hi)
        return serve_reject(e, 400, param, NULL, "'%s' is %.17g; it must be in [%.17g, %.17g]",
                            param, d, lo, hi);
    *out = (int64_t)d;
    return MT_OK;
}

static mt_status get_float(const cJSON *v, const char *param, double lo, double hi,
                           bool lo_open, float *out, serve_error *e)
{
    if (!cJSON_IsNumber(v))
        return bad(e, param, "'%s' must be a number%s", "");
    double d = v->valuedouble;
    if (!isfinite(d) || d > hi || d < lo || (lo_open && d == lo))
        return serve_reject(e, 400, param, NULL, "'%s' is %.17g; it must be in %c%g, %g]", param,
                            d, lo_open ? '(' : '[', lo, hi);
    *out = (float)d;
    return MT_OK;
}

static mt_status get_bool(const cJSON *v, const char *param, bool *out, serve_error *e)
{
    if (!cJSON_IsBool(v))
        return bad(e, param, "'%s' must be true or false%s", "");
    *out = cJSON_IsTrue(v);
    return MT_OK;
}

static char *dup_str(const char *s, size_t *len)
{
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p)
        memcpy(p, s, n + 1);
    if (len)
        *len = n;
    return p;
}

static mt_status oom(serve_error *e, const char *what)
{
    return serve_reject(e, 500, NULL, NULL, "out of memory parsing %s", what);
}

/* A list of token ids. */
static mt_status get_ids(const cJSON *arr, const char *param, const serve_limits *lim,
                         serve_request *r, serve_error *e)
{
    int n = cJSON_GetArraySize(arr);
    if (n == 0)
        return serve_reject(e, 400, param, NULL, "'%s' is an empty list of token ids", param);
    r->ids = malloc((size_t)n * sizeof *r->ids);
    if (!r->ids)
        return oom(e, param);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr)
    {
        char p[128];
        pname(p, sizeof p, "%s[%d]", param, i);
        int64_t id = 0; /* gcc -O3 cannot see that serve_reject never returns MT_OK */
        mt_status st = get_int(v, p, 0, (double)lim->vocab - 1, &id, e);
        if (st != MT_OK)
            return st;
        r->ids[i++] = (int32_t)id;
    }
    r->n_ids = (size_t)n;
    r->has_ids = true;
    return MT_OK;
}

static bool is_id_list(const cJSON *v)
{
    return cJSON_IsArray(v) && (!v->child || cJSON_IsNumber(v->child));
}

/* prompt: "text" | [ids] | ["text"] | [[ids]]. */
static mt_status get_prompt(const cJSON *v, const serve_limits *lim, serve_request *r,
                            serve_error *e)
{
    if (cJSON_IsArray(v) && v->child && !cJSON_IsNumber(v->child)) {
        if (cJSON_GetArraySize(v) != 1)
            return serve_reject(e, 400, "prompt", NULL,
                                "'prompt' holds %d prompts; this server takes one per request",
                                cJSON_GetArraySize(v));
        v = v->child;
    }
    if (cJSON_IsString(v)) {
        r->text = dup_str(v->valuestring, &r->text_len);
        return r->text ? MT_OK : oom(e, "prompt");
    }
    if (is_id_list(v))
        return get_ids(v, "prompt", lim, r, e);
    return bad(e, "prompt", "'%s' must be a string or a list of token ids%s", "");
}

/* content: "text" | null | [{"type": "text", "text": "..."}...]. */
static mt_status get_content(const cJSON *v, const char *param, char **out, serve_error *e)
{
    if (!v || cJSON_IsNull(v)) {
        *out = dup_str("", NULL);
        return *out ? MT_OK : oom(e, param);
    }
    if (cJSON_IsString(v)) {
        *out = dup_str(v->valuestring, NULL);
        return *out ? MT_OK : oom(e, param);
    }
    if (!cJSON_IsArray(v))
        return bad(e, param, "'%s' must be a string, null or a list of text parts%s", "");
    size_t total = 0;
    const cJSON *part;
    int i = 0;
    cJSON_ArrayForEach(part, v)
    {
        char p[128];
        pname(p, sizeof p, "%s[%d]", param, i++);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text"))
            return bad(e, p, "'%s' must be an object with \"type\": \"text\"%s", "");
        if (!cJSON_IsString(text))
            return bad(e, p, "'%s.text' must be a string%s", "");
        total += strlen(text->valuestring);
    }
    char *s = malloc(total + 1);
    if (!s)
        return oom(e, param);
    size_t at = 0;
    cJSON_ArrayForEach(part, v)
    {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(s + at, t, n);
        at += n;
    }
    s[at] = 0;
    *out = s;
    return MT_OK;
}

static mt_status get_messages(const cJSON *v, serve_request *r, serve_error *e)
{
    if (!cJSON_IsArray(v))
        return bad(e, "messages", "'%s' must be a list of messages%s", "");
    int n = cJSON_GetArraySize(v);
    if (n == 0)
        return serve_reject(e, 400, "messages", NULL, "'messages' is empty");
    r->msgs = calloc((size_t)n, sizeof *r->msgs);
    if (!r->msgs)
        return oom(e, "messages");
    const cJSON *m;
    cJSON_ArrayForEach(m, v)
    {
        size_t i = r->n_msgs;
        char p[128];
        pname(p, sizeof p, "messages[%zu]", i);
        if (!cJSON_IsObject(m))
            return bad(e, p, "'%s' must be an object with role and content%s", "");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        char pr[128];
        pname(pr, sizeof pr, "%s.role", p);
        if (!cJSON_IsString(role))
            return bad(e, pr, "'%s' must be a string%s", "");
        model_chat_role rl;
        if (!strcmp(role->valuestring, "developer"))
            rl = MODEL_CHAT_SYSTEM;
        else if (!model_chat_role_parse(role->valuestring, &rl))
            return serve_reject(e, 400, pr, NULL,
                                "'%s' is '%.64s'; it must be system, user, assistant or tool", pr,
                                role->valuestring);
        r->msgs[i].role = rl;
        r->n_msgs++; /* owns what is set below, for release on failure */
        char pc[128];
        pname(pc, sizeof pc, "%s.content", p);
        char *content = NULL;
        if (get_content(cJSON_GetObjectItemCaseSensitive(m, "content"), pc, &content, e) != MT_OK)
            return e ? e->err.status : MT_E_INVALID;
        r->msgs[i].content = content;
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
        if (rs && !cJSON_IsNull(rs)) {
            pname(pc, sizeof pc, "%s.reasoning_content", p);
            if (!cJSON_IsString(rs))
                return bad(e, pc, "'%s' must be a string%s", "");
            if (rl == MODEL_CHAT_ASSISTANT) {
                char *reasoning = dup_str(rs->valuestring, NULL);
                if (!reasoning)
                    return oom(e, pc);
                r->msgs[i].reasoning = reasoning;
            }
        }
    }
    return MT_OK;
}

static mt_status get_stop(const cJSON *v, serve_request *r, serve_error *e)
{
    if (cJSON_IsNull(v))
        return MT_OK;
    if (!cJSON_IsString(v) && !cJSON_IsArray(v))
        return bad(e, "stop", "'%s' must be a string or a list of strings%s", "");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > SERVE_MAX_STOP)
        return serve_reject(e, 400, "stop", NULL, "'stop' has %d strings; at most %d are allowed",
                            cJSON_GetArraySize(v), SERVE_MAX_STOP);
    const cJSON *s = cJSON_IsString(v) ? v : v->child;
    for (; s; s = cJSON_IsString(v) ? NULL : s->next) {
        char p[128] = "stop";
        if (cJSON_IsArray(v))
            pname(p, sizeof p, "stop[%d]", r->n_stop);
        if (!cJSON_IsString(s))
            return bad(e, p, "'%s' must be a string%s", "");
        size_t n = strlen(s->valuestring);
        if (n == 0 || n > SERVE_MAX_STOP_LEN)
            return serve_reject(e, 400, p, NULL, "'%s' is %zu bytes long; it must be 1 to %d", p,
                                n, SERVE_MAX_STOP_LEN);
        if (!(r->stop[r->n_stop] = dup_str(s->valuestring, NULL)))
            return oom(e, "stop");
        r->n_stop++;
    }
    return MT_OK;
}

static bool truthy(const cJSON *v)
{
    return v && !cJSON_IsNull(v) && !cJSON_IsFalse(v) &&
           !(cJSON_IsNumber(v) && v->valuedouble == 0);
}

static mt_status parse_fields(serve_api api, const cJSON *root, const serve_limits *lim,
                              serve_request *r, serve_error *e)
{
#define FIELD(name) cJSON_GetObjectItemCaseSensitive(root, name)
    const cJSON *v;
    if ((v = FIELD("model")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v))
            return bad(e, "model", "'%s' must be a string%s", "");
        if (!(r->model = dup_str(v->valuestring, NULL)))
            return oom(e, "model");
    }

    if (api == SERVE_API_DETOKENIZE) {
        v = FIELD("tokens");
        if (!is_id_list(v))
            return bad(e, "tokens", "'%s' must be a list of token ids%s", "");
        if (!v->child) {
            r->has_ids = true;
            return MT_OK;
        }
        return get_ids(v, "tokens", lim, r, e);
    }

    bool want_msgs = api == SERVE_API_CHAT || (api == SERVE_API_TOKENIZE && FIELD("messages"));
    if (want_msgs) {
        MT_CHECK(get_messages(FIELD("messages"), r, e));
        if ((v = FIELD("add_generation_prompt")) && !cJSON_IsNull(v))
            MT_CHECK(get_bool(v, "add_generation_prompt", &r->add_generation_prompt, e));
        const cJSON *kw = FIELD("chat_template_kwargs");
        if (kw && !cJSON_IsNull(kw)) {
            if (!cJSON_IsObject(kw))
                return bad(e, "chat_template_kwargs", "'%s' must be an object%s", "");
            v = cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking");
            if (v && !cJSON_IsNull(v))
                MT_CHECK(get_bool(v, "chat_template_kwargs.enable_thinking", &r->enable_thinking,
                                  e));
        }
    } else {
        if (!(v = FIELD("prompt")) || cJSON_IsNull(v))
            return serve_reject(e, 400, "prompt", NULL, "'prompt' is required");
        MT_CHECK(get_prompt(v, lim, r, e));
    }
    if (api == SERVE_API_TOKENIZE)
        return MT_OK;

    const char *mt_name = "max_tokens";
    v = FIELD("max_tokens");
    if (api == SERVE_API_CHAT && FIELD("max_completion_tokens") &&
        !cJSON_IsNull(FIELD("max_completion_tokens"))) {
        mt_name = "max_completion_tokens";
        v = FIELD(mt_name);
    }
    if (v && !cJSON_IsNull(v))
        MT_CHECK(get_int(v, mt_name, 1, (double)lim->max_context, &r->max_tokens, e));
    if ((v = FIELD("temperature")) && !cJSON_IsNull(v))
        MT_CHECK(get_float(v, "temperature", 0, 2, false, &r->temperature, e));
    if ((v = FIELD("top_p")) && !cJSON_IsNull(v))
        MT_CHECK(get_float(v, "top_p", 0, 1, true, &r->top_p, e));
    if ((v = FIELD("top_k")) && !cJSON_IsNull(v)) {
        int64_t k;
        MT_CHECK(get_int(v, "top_k", -1, 2147483647.0, &k, e));
        r->top_k = k < 0 ? 0 : (int)k;
    }
    if ((v = FIELD("seed")) && !cJSON_IsNull(v)) {
        int64_t s;
        MT_CHECK(get_int(v, "seed", -MAX_SAFE_INT, MAX_SAFE_INT, &s, e));
        r->seed = (uint64_t)s;
        r->has_seed = true;
    }
    if ((v = FIELD("stop")))
        MT_CHECK(get_stop(v, r, e));
    if ((v = FIELD("ignore_eos")) && !cJSON_IsNull(v))
        MT_CHECK(get_bool(v, "ignore_eos", &r->ignore_eos, e));
    if ((v = FIELD("stream")) && !cJSON_IsNull(v))
        MT_CHECK(get_bool(v, "stream", &r->stream, e));
    if ((v = FIELD("return_token_ids")) && !cJSON_IsNull(v))
        MT_CHECK(get_bool(v, "return_token_ids", &r->return_token_ids, e));
    const cJSON *so = FIELD("stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return bad(e, "stream_options", "'%s' must be an object%s", "");
        v = cJSON_GetObjectItemCaseSensitive(so, "include_usage");
        if (v && !cJSON_IsNull(v))
            MT_CHECK(get_bool(v, "stream_options.include_usage", &r->include_usage, e));
    }
    static const char *const one_only[] = {"n", "best_of"};
    for (size_t i = 0; i < sizeof one_only / sizeof one_only[0]; i++)
        if ((v = FIELD(one_only[i])) && !cJSON_IsNull(v)) {
            int64_t k;
            MT_CHECK(get_int(v, one_only[i], 1, 1, &k, e));
        }
    if (truthy(FIELD("logprobs")) || truthy(FIELD("top_logprobs")))
        return serve_reject(e, 400, truthy(FIELD("logprobs")) ? "logprobs" : "top_logprobs",
                            NULL, "log probabilities are not returned by this server");
    return MT_OK;
#undef FIELD
}

mt_status serve_request_parse(serve_api api, const char *body, size_t len,
                              const serve_limits *lim, serve_request *out, serve_error *e)
{
    memset(out, 0, sizeof *out);
    out->api = api;
    out->max_tokens = -1;
    out->temperature = 1.0f;
    out->top_p = 1.0f;
    out->include_usage = true;
    out->add_generation_prompt = true;
    out->enable_thinking = false;
    if ((unsigned)api >= SERVE_API_COUNT)
        return serve_reject(e, 404, NULL, NULL, "unknown endpoint");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        return serve_reject(e, 400, NULL, "invalid_json",
                            "the body is not valid JSON (error at byte %zu of %zu)", at, len);
    }
    /* Trailing garbage after the value (whitespace is fine). */
    size_t at = (size_t)(end - body);
    while (at < len && (body[at] == ' ' || body[at] == '\t' || body[at] == '\n' ||
                        body[at] == '\r'))
        at++;
    mt_status st;
    if (at < len)
        st = serve_reject(e, 400, NULL, "invalid_json",
                          "the body is not valid JSON (extra bytes at byte %zu of %zu)", at, len);
    else if (!cJSON_IsObject(root))
        st = serve_reject(e, 400, NULL, "invalid_json", "the body must be a JSON object");
    else
        st = parse_fields(api, root, lim, out, e);
    cJSON_Delete(root);
    if (st != MT_OK)
        serve_request_release(out);
    return st;
}

void serve_request_release(serve_request *r)
{
    free(r->model);
    free(r->text);
    free(r->ids);
    for (size_t i = 0; i < r->n_msgs; i++) {
        free((char *)r->msgs[i].content);
        free((char *)r->msgs[i].reasoning);
    }
    free(r->msgs);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    serve_api api = r->api;
    memset(r, 0, sizeof *r);
    r->api = api;
}

mt_status serve_request_prompt(const serve_request *r, const model_tokenizer *tok,
                               const serve_limits *lim, int32_t **ids, size_t *n,
                               serve_error *e)
{
    *ids = NULL;
    *n = 0;
    mt_err err = MT_ERR_INIT;
    const char *param = r->msgs ? "messages" : "prompt";
    if (r->has_ids) {
        if (r->n_ids) {
            if (!(*ids = malloc(r->n_ids * sizeof **ids)))
                return oom(e, param);
            memcpy(*ids, r->ids, r->n_ids * sizeof **ids);
        }
        *n = r->n_ids;
    } else if (!tok) {
        return serve_reject(e, 400, param, NULL,
                            "this model has no tokenizer; send the prompt as token ids");
    } else if (r->msgs) {
        model_chat_opts o = {r->add_generation_prompt, r->enable_thinking};
        if (model_chat_encode(tok, r->msgs, r->n_msgs, &o, ids, n, &err) != MT_OK)
            return serve_reject(e, err.status == MT_E_NOMEM ? 500 : 400, param, NULL,
                                "cannot encode the messages: %s", err.msg);
    } else if (r->text) {
        if (model_tokenizer_encode(tok, r->text, r->text_len, ids, n, &err) != MT_OK)
            return serve_reject(e, err.status == MT_E_NOMEM ? 500 : 400, param, NULL,
                                "cannot encode the prompt: %s", err.msg);
    }
    const char *fail = NULL;
    if (*n == 0 && r->api != SERVE_API_TOKENIZE && r->api != SERVE_API_DETOKENIZE)
        fail = "empty";
    for (size_t i = 0; !fail && i < *n; i++)
        if ((*ids)[i] < 0 || (*ids)[i] >= lim->vocab)
            fail = "id";
    if (!fail && (int64_t)*n >= lim->max_context && r->api != SERVE_API_TOKENIZE &&
        r->api != SERVE_API_DETOKENIZE)
        fail = "long";
    if (!fail)
        return MT_OK;
    size_t count = *n;
    free(*ids);
    *ids = NULL;
    *n = 0;
    if (!strcmp(fail, "empty"))
        return serve_reject(e, 400, param, NULL, "the prompt is empty (0 tokens)");
    if (!strcmp(fail, "id"))
        return serve_reject(e, 400, param, NULL, "the prompt holds a token id outside [0, %d)",
                            (int)lim->vocab);
    return serve_reject(e, 400, param, "context_length_exceeded",
                        "This model's maximum context length is %lld tokens. However, your "
                        "prompt is %zu tokens, which leaves no room to generate.",
                        (long long)lim->max_context, count);
}

mt_status serve_request_max_tokens(const serve_request *r, size_t n_prompt,
                                   const serve_limits *lim, int64_t *out, serve_error *e)
{
    int64_t room = lim->max_context - (int64_t)n_prompt;
    if (r->max_tokens < 0) {
        int64_t d = r->api == SERVE_API_CHAT ? room : SERVE_DEFAULT_MAX_TOKENS;
        *out = d < room ? d : room;
        if (*out < 1)
            return serve_reject(e, 400, "prompt", "context_length_exceeded",
                                "This model's maximum context length is %lld tokens; the prompt "
                                "is %zu tokens, which leaves no room to generate.",
                                (long long)lim->max_context, n_prompt);
        return MT_OK;
    }
    if (r->max_tokens > room)
        return serve_reject(e, 400, r->api == SERVE_API_CHAT ? "messages" : "prompt",
                            "context_length_exceeded",
                            "This model's maximum context length is %lld tokens. However, you "
                            "requested %lld tokens (%zu in the prompt, %lld for the completion).",
                            (long long)lim->max_context, (long long)n_prompt + r->max_tokens,
                            n_prompt, (long long)r->max_tokens);
    *out = r->max_tokens;
    return MT_OK;
}
