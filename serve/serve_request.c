/* serve_request.c: OpenAI request bodies to serve_request, with the checks
 * listed in serve_request.h. */
#include "serve_request.h"

#include "serve_buf.h"
#include "common/json_depth.h"
#include "model/runtime.h"

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

/* ---- strings with their decoded length ---------------------------------------- */

/* cJSON ends its strings at the first NUL; the lengths come from a lexer
 * pass over the body that decodes each string value's length (keys are
 * skipped), stored in the node's unused valueint in document order. */
typedef struct lens {
    int *v;
    size_t n, cap;
} lens;

static int hex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v = v * 16 + (c >= '0' && c <= '9' ? c - '0' : (c | 32) - 'a' + 10);
    }
    return v;
}

/* Lengths of the string values of a body cJSON accepted. MT_E_FORMAT with
 * *bad_at when a \u escape is a lone surrogate. */
static mt_status lex_lengths(const char *b, size_t len, lens *out, size_t *bad_at)
{
    for (size_t i = 0; i < len; i++) {
        if (b[i] != '"')
            continue;
        size_t start = i, dec = 0;
        for (i++; i < len && b[i] != '"'; i++) {
            if (b[i] != '\\') {
                dec++;
                continue;
            }
            if (i + 1 < len && b[i + 1] == 'u' && i + 5 < len) {
                int cp = hex4(b + i + 2);
                size_t at = i;
                i += 5;
                if (cp >= 0xD800 && cp <= 0xDBFF && i + 6 < len && b[i + 1] == '\\' &&
                    b[i + 2] == 'u' && hex4(b + i + 3) >= 0xDC00 && hex4(b + i + 3) <= 0xDFFF) {
                    i += 6;
                    dec += 4;
                } else if (cp >= 0xD800 && cp <= 0xDFFF) {
                    *bad_at = at;
                    return MT_E_FORMAT;
                } else {
                    dec += cp < 0x80 ? 1 : cp < 0x800 ? 2 : 3;
                }
            } else {
                i++;
                dec++;
            }
        }
        (void)start;
        size_t k = i + 1;
        while (k < len && (unsigned char)b[k] <= 32) /* cJSON's whitespace: every byte <= 32 */
            k++;
        if (k < len && b[k] == ':')
            continue; /* a key */
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 64;
            int *v = realloc(out->v, cap * sizeof *v);
            if (!v)
                return MT_E_NOMEM;
            out->v = v;
            out->cap = cap;
        }
        out->v[out->n++] = dec > INT32_MAX ? INT32_MAX : (int)dec;
    }
    return MT_OK;
}

static void assign_lengths(cJSON *node, const lens *l, size_t *at)
{
    for (; node; node = node->next) {
        if (cJSON_IsString(node)) {
            size_t sl = strlen(node->valuestring);
            int v = *at < l->n ? l->v[(*at)++] : (int)sl;
            node->valueint = (size_t)v >= sl ? v : (int)sl;
        }
        if (node->child)
            assign_lengths(node->child, l, at);
    }
}

/* ---- duplicate keys -------------------------------------------------------- */

typedef struct keyed {
    const char *key;
    size_t at; /* position among the object's members */
    cJSON *node;
} keyed;

static int keyed_cmp(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : x->at < y->at ? -1 : x->at > y->at;
}

mt_status serve_json_dedupe(cJSON *v)
{
    for (; v; v = v->next) {
        if (cJSON_IsObject(v) && v->child && v->child->next) {
            size_t n = 0;
            for (cJSON *c = v->child; c; c = c->next)
                n++;
            keyed *k = malloc(n * sizeof *k);
            if (!k)
                return MT_E_NOMEM;
            size_t i = 0;
            for (cJSON *c = v->child; c; c = c->next, i++)
                k[i] = (keyed){c->string ? c->string : "", i, c};
            qsort(k, n, sizeof *k, keyed_cmp);
            for (i = 0; i + 1 < n; i++)
                if (!strcmp(k[i].key, k[i + 1].key)) /* a later one follows: drop this */
                    cJSON_Delete(cJSON_DetachItemViaPointer(v, k[i].node));
            free(k);
        }
        if (v->child)
            MT_CHECK(serve_json_dedupe(v->child));
    }
    return MT_OK;
}

/* Bytes of a string node (it may hold NUL). */
static size_t str_len(const cJSON *v) { return (size_t)v->valueint; }

/* Offset of the first invalid UTF-8 byte, or n when valid. Overlong forms,
 * surrogates and code points past U+10FFFF are invalid. */
static size_t utf8_invalid_at(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        int len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                                                         : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len || i + (size_t)len > n)
            return i;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
        else if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
        for (int k = 1; k < len; k++)
            if (s[i + (size_t)k] < (k == 1 ? lo : 0x80) || s[i + (size_t)k] > (k == 1 ? hi : 0xBF))
                return i;
        i += (size_t)len;
    }
    return n;
}

/* A string field: checked for UTF-8 and, unless nul_ok, for U+0000. The
 * text is borrowed from the node. */
static mt_status get_str(const cJSON *v, const char *param, bool nul_ok, const char **s,
                         size_t *n, serve_error *e)
{
    if (!cJSON_IsString(v))
        return bad(e, param, "'%s' must be a string%s", "");
    *s = v->valuestring;
    *n = str_len(v);
    size_t at = utf8_invalid_at(*s, *n);
    if (at < *n)
        return serve_reject(e, 400, param, NULL,
                            "'%s' is not valid UTF-8 (byte %zu of the string: an invalid, "
                            "overlong or truncated sequence)",
                            param, at);
    if (!nul_ok && memchr(*s, 0, *n))
        return serve_reject(e, 400, param, NULL,
                            "'%s' holds U+0000 (a NUL character), which this field cannot hold",
                            param);
    return MT_OK;
}

static char *dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* A string field copied (NUL-terminated; *n its length, may be NULL). */
static mt_status take_str(const cJSON *v, const char *param, bool nul_ok, char **out, size_t *n,
                          serve_error *e)
{
    const char *s;
    size_t len;
    MT_CHECK(get_str(v, param, nul_ok, &s, &len, e));
    if (!(*out = dup_n(s, len)))
        return oom(e, param);
    if (n)
        *n = len;
    return MT_OK;
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
    if (cJSON_IsString(v))
        return take_str(v, "prompt", true, &r->text, &r->text_len, e);
    if (is_id_list(v))
        return get_ids(v, "prompt", lim, r, e);
    return bad(e, "prompt", "'%s' must be a string or a list of token ids%s", "");
}

/* content: "text" | null | [{"type": "text", "text": "..."}...]; *len its
 * bytes (it may hold NUL). */
static mt_status get_content(const cJSON *v, const char *param, char **out, size_t *len,
                             serve_error *e)
{
    *len = 0;
    if (!v || cJSON_IsNull(v)) {
        *out = dup_str("", NULL);
        return *out ? MT_OK : oom(e, param);
    }
    if (cJSON_IsString(v))
        return take_str(v, param, true, out, len, e);
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
        char pt[160];
        pname(pt, sizeof pt, "%s.text", p);
        const char *t;
        size_t tn;
        MT_CHECK(get_str(text, pt, true, &t, &tn, e));
        total += tn;
    }
    char *s = malloc(total + 1);
    if (!s)
        return oom(e, param);
    size_t at = 0;
    cJSON_ArrayForEach(part, v)
    {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
        memcpy(s + at, t->valuestring, str_len(t));
        at += str_len(t);
    }
    s[at] = 0;
    *out = s;
    *len = at;
    return MT_OK;
}

/* ---- tools ------------------------------------------------------------------------ */

/* JSON text as Python's json.dumps(ensure_ascii=False) writes it (GLM's
 * template's tojson): ", " and ": " separators, keys in the given order,
 * non-ASCII as is. Numbers: integers without a fraction, others by the
 * shortest %.17g form that reads back. */
static mt_status tojson(serve_buf *b, const cJSON *v)
{
    if (cJSON_IsNull(v))
        return serve_buf_puts(b, "null");
    if (cJSON_IsTrue(v))
        return serve_buf_puts(b, "true");
    if (cJSON_IsFalse(v))
        return serve_buf_puts(b, "false");
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d == floor(d) && fabs(d) < 1e16)
            return serve_buf_printf(b, "%.0f", d);
        char t[32];
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(t, sizeof t, "%.*g", prec, d);
            if (strtod(t, NULL) == d)
                break;
        }
        return serve_buf_puts(b, t);
    }
    if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        size_t n = str_len(v);
        MT_CHECK(serve_buf_puts(b, "\""));
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)s[i];
            static const char esc[] = {'\b', 'b', '\f', 'f', '\n', 'n', '\r', 'r', '\t', 't'};
            const char *x = NULL;
            for (size_t k = 0; k < sizeof esc; k += 2)
                if (c == (unsigned char)esc[k])
                    x = &esc[k + 1];
            if (c == '"' || c == '\\')
                MT_CHECK(serve_buf_printf(b, "\\%c", c));
            else if (x)
                MT_CHECK(serve_buf_printf(b, "\\%c", *x));
            else if (c < 0x20)
                MT_CHECK(serve_buf_printf(b, "\\u%04x", c));
            else
                MT_CHECK(serve_buf_append(b, &s[i], 1));
        }
        return serve_buf_puts(b, "\"");
    }
    bool obj = cJSON_IsObject(v);
    MT_CHECK(serve_buf_puts(b, obj ? "{" : "["));
    const cJSON *c;
    bool first = true;
    cJSON_ArrayForEach(c, v)
    {
        if (!first)
            MT_CHECK(serve_buf_puts(b, ", "));
        first = false;
        if (obj) {
            cJSON key = {0};
            key.type = cJSON_String;
            key.valuestring = c->string;
            key.valueint = (int)strlen(c->string);
            MT_CHECK(tojson(b, &key));
            MT_CHECK(serve_buf_puts(b, ": "));
        }
        MT_CHECK(tojson(b, c));
    }
    return serve_buf_puts(b, obj ? "}" : "]");
}

static mt_status get_tools(cJSON *root, serve_request *r, serve_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (!v || cJSON_IsNull(v))
        return MT_OK;
    if (!cJSON_IsArray(v))
        return bad(e, "tools", "'%s' must be a list of tools%s", "");
    int n = cJSON_GetArraySize(v);
    if (n == 0)
        return MT_OK;
    /* Kept whole (with the string lengths set on its nodes) for the names,
     * schemas and the rendered text. */
    r->tools_json = cJSON_DetachItemFromObjectCaseSensitive(root, "tools");
    if (!(r->tools = calloc((size_t)n, sizeof *r->tools)))
        return oom(e, "tools");
    const cJSON *t;
    cJSON_ArrayForEach(t, r->tools_json)
    {
        int i = r->n_tools;
        char p[128];
        pname(p, sizeof p, "tools[%d]", i);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(t) ||
            (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "function"))) ||
            !cJSON_IsObject(fn))
            return bad(e, p, "'%s' must be {\"type\": \"function\", \"function\": {...}}%s",
                       "");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        char pn[160];
        pname(pn, sizeof pn, "%s.function.name", p);
        const char *ns;
        size_t nn;
        MT_CHECK(get_str(name, pn, false, &ns, &nn, e));
        if (nn == 0)
            return serve_reject(e, 400, pn, NULL, "'%s' is empty", pn);
        for (int k = 0; k < i; k++)
            if (!strcmp(r->tools[k].name, ns))
                return serve_reject(e, 400, pn, NULL, "'%s': two tools are named '%.64s'", pn, ns);
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params)) {
            pname(pn, sizeof pn, "%s.function.parameters", p);
            return serve_reject(e, 400, pn, NULL, "'%s' must be a JSON schema object", pn);
        }
        const cJSON *props =
            cJSON_IsObject(params) ? cJSON_GetObjectItemCaseSensitive(params, "properties") : NULL;
        r->tools[i].name = ns;
        r->tools[i].index = i;
        r->tools[i].parameters = cJSON_IsObject(params) ? params : NULL;
        r->tools[i].properties = cJSON_IsObject(props) ? props : NULL;
        serve_buf b = SERVE_BUF_INIT;
        if (tojson(&b, t) != MT_OK || !(r->tools[i].text = serve_buf_detach(&b, NULL))) {
            serve_buf_release(&b);
            return oom(e, "tools");
        }
        r->n_tools++;
    }
    return MT_OK;
}

static mt_status get_tool_choice(const cJSON *v, serve_request *r, serve_error *e)
{
    if (!v || cJSON_IsNull(v))
        return MT_OK;
    if (cJSON_IsString(v)) {
        static const char *const names[] = {"auto", "none", "required"};
        for (int i = 0; i < 3; i++)
            if (!strcmp(v->valuestring, names[i])) {
                r->tool_choice = (serve_tool_choice)i;
                if (r->tool_choice == SERVE_TOOL_REQUIRED && r->n_tools == 0)
                    return serve_reject(e, 400, "tool_choice", NULL,
                                        "'tool_choice' is 'required' but no tools are given");
                return MT_OK;
            }
        return serve_reject(e, 400, "tool_choice", NULL,
                            "'tool_choice' is '%.64s'; it must be auto, none, required or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                            v->valuestring);
    }
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(v, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (!cJSON_IsObject(v) || !cJSON_IsString(name))
        return bad(e, "tool_choice", "'%s' must be a string or {\"type\": \"function\", "
                   "\"function\": {\"name\": ...}}%s", "");
    for (int i = 0; i < r->n_tools; i++)
        if (!strcmp(r->tools[i].name, name->valuestring)) {
            serve_request_tool keep = r->tools[i]; /* swapped: release frees every text */
            r->tools[i] = r->tools[0];
            r->tools[0] = keep;
            r->n_tools = 1;
            r->tool_choice = SERVE_TOOL_NAMED;
            return MT_OK;
        }
    return serve_reject(e, 400, "tool_choice.function.name", NULL,
                        "'tool_choice.function.name' is '%.64s', which is not in 'tools'",
                        name->valuestring);
}

/* An assistant message's tool_calls, as GLM's template renders them. */
static mt_status get_tool_calls(const cJSON *v, const char *param, model_chat_extra *x,
                                serve_error *e)
{
    if (!v || cJSON_IsNull(v))
        return MT_OK;
    if (!cJSON_IsArray(v))
        return bad(e, param, "'%s' must be a list of tool calls%s", "");
    int n = cJSON_GetArraySize(v);
    if (n == 0)
        return MT_OK;
    model_chat_call *calls = calloc((size_t)n, sizeof *calls);
    if (!calls)
        return oom(e, param);
    x->calls = calls;
    const cJSON *c;
    cJSON_ArrayForEach(c, v)
    {
        char p[160];
        pname(p, sizeof p, "%s[%zu].function", param, x->n_calls);
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        if (!cJSON_IsObject(fn))
            return bad(e, p, "'%s' must be an object with name and arguments%s", "");
        model_chat_call *cc = &calls[x->n_calls++];
        char pn[192];
        pname(pn, sizeof pn, "%s.name", p);
        char *name;
        MT_CHECK(take_str(cJSON_GetObjectItemCaseSensitive(fn, "name"), pn, false, &name, NULL,
                          e));
        cc->name = name;
        pname(pn, sizeof pn, "%s.arguments", p);
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        cJSON *args = NULL;
        if (cJSON_IsString(a)) {
            const char *s;
            size_t sn;
            MT_CHECK(get_str(a, pn, false, &s, &sn, e));
            if (strstr(s, "\\u0000"))
                return serve_reject(e, 400, pn, NULL,
                                    "'%s' holds U+0000 (a NUL character), which a tool call's "
                                    "arguments cannot hold", pn);
            size_t deep_at = 0;
            if (mt_json_too_deep(s, sn, MT_JSON_MAX_DEPTH, &deep_at))
                return serve_reject(e, 400, pn, NULL,
                                    "'%s' nests arrays and objects more than %d deep (at byte "
                                    "%zu)", pn, MT_JSON_MAX_DEPTH, deep_at);
            args = cJSON_ParseWithLength(s, sn);
            if (args && serve_json_dedupe(args) != MT_OK) {
                cJSON_Delete(args);
                return oom(e, pn);
            }
            if (!cJSON_IsObject(args)) {
                cJSON_Delete(args);
                return serve_reject(e, 400, pn, NULL, "'%s' must be a JSON object's text", pn);
            }
        } else if (cJSON_IsObject(a)) {
            args = cJSON_Duplicate(a, true);
        } else if (a && !cJSON_IsNull(a)) {
            return bad(e, pn, "'%s' must be a JSON object's text%s", "");
        }
        int na = args ? cJSON_GetArraySize(args) : 0;
        model_chat_arg *list = na ? calloc((size_t)na, sizeof *list) : NULL;
        if (na && !list) {
            cJSON_Delete(args);
            return oom(e, pn);
        }
        cc->args = list;
        mt_status st = MT_OK;
        const cJSON *kv;
        cJSON_ArrayForEach(kv, args)
        {
            if (st != MT_OK)
                break;
            model_chat_arg *ar = &list[cc->n_args];
            if (!(ar->key = strdup(kv->string))) {
                st = oom(e, pn);
                break;
            }
            cc->n_args++;
            if (cJSON_IsString(kv)) {
                ar->value = strdup(kv->valuestring);
            } else {
                /* Non-strings as tojson writes them; lengths of parsed text are plain. */
                serve_buf b = SERVE_BUF_INIT;
                size_t at = 0;
                lens none = {0};
                assign_lengths(kv->child, &none, &at);
                if (tojson(&b, kv) == MT_OK)
                    ar->value = serve_buf_detach(&b, NULL);
                serve_buf_release(&b);
            }
            if (!ar->value)
                st = oom(e, pn);
        }
        cJSON_Delete(args);
        if (st != MT_OK)
            return st;
    }
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
    r->extra = calloc((size_t)n, sizeof *r->extra);
    if (!r->msgs || !r->extra)
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
        size_t content_len = 0;
        MT_CHECK(get_content(cJSON_GetObjectItemCaseSensitive(m, "content"), pc, &content,
                             &content_len, e));
        r->msgs[i].content = content;
        r->extra[i].content_len = content_len;
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
        if (rs && !cJSON_IsNull(rs)) {
            pname(pc, sizeof pc, "%s.reasoning_content", p);
            char *reasoning = NULL;
            MT_CHECK(take_str(rs, pc, false, &reasoning, NULL, e));
            if (rl == MODEL_CHAT_ASSISTANT)
                r->msgs[i].reasoning = reasoning;
            else
                free(reasoning);
        }
        if (rl == MODEL_CHAT_ASSISTANT) {
            pname(pc, sizeof pc, "%s.tool_calls", p);
            MT_CHECK(get_tool_calls(cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), pc,
                                    &r->extra[i], e));
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
        const char *str;
        size_t n;
        MT_CHECK(get_str(s, p, false, &str, &n, e));
        if (n == 0 || n > SERVE_MAX_STOP_LEN)
            return serve_reject(e, 400, p, NULL, "'%s' is %zu bytes long; it must be 1 to %d", p,
                                n, SERVE_MAX_STOP_LEN);
        if (!(r->stop[r->n_stop] = dup_n(str, n)))
            return oom(e, "stop");
        r->n_stop++;
    }
    return MT_OK;
}

/* logit_bias: {"<token id>": bias, ...}. */
static mt_status get_logit_bias(const cJSON *v, const serve_limits *lim, serve_request *r,
                                serve_error *e)
{
    if (cJSON_IsNull(v))
        return MT_OK;
    if (!cJSON_IsObject(v))
        return bad(e, "logit_bias", "'%s' must be an object of token ids to biases%s", "");
    int n = cJSON_GetArraySize(v);
    if (n > SERVE_MAX_LOGIT_BIAS)
        return serve_reject(e, 400, "logit_bias", NULL,
                            "'logit_bias' has %d entries; at most %d are allowed", n,
                            SERVE_MAX_LOGIT_BIAS);
    if (n == 0)
        return MT_OK;
    if (!(r->logit_bias = calloc((size_t)n, sizeof *r->logit_bias)))
        return oom(e, "logit_bias");
    const cJSON *b;
    cJSON_ArrayForEach(b, v)
    {
        char p[128];
        pname(p, sizeof p, "logit_bias.%.64s", b->string);
        char *end;
        long id = strtol(b->string, &end, 10);
        if (!*b->string || *end || id < 0 || id >= lim->vocab)
            return serve_reject(e, 400, p, NULL,
                                "'%s': the key must be a token id in [0, %d)", p, (int)lim->vocab);
        float bias = 0; /* gcc -O3 cannot see that serve_reject never returns MT_OK */
        MT_CHECK(get_float(b, p, -100, 100, false, &bias, e));
        r->logit_bias[r->n_logit_bias++] = (model_logit_bias){(int32_t)id, bias};
    }
    return MT_OK;
}

/* response_format: {"type": "text"} | {"type": "json_object"} |
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}. */
static mt_status get_response_format(cJSON *v, serve_request *r, serve_error *e)
{
    if (cJSON_IsNull(v))
        return MT_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (!cJSON_IsObject(v) || !cJSON_IsString(t))
        return bad(e, "response_format", "'%s' must be an object with a type%s", "");
    if (!strcmp(t->valuestring, "text"))
        return MT_OK;
    if (!strcmp(t->valuestring, "json_object")) {
        r->format = SERVE_FORMAT_JSON_OBJECT;
        return MT_OK;
    }
    if (strcmp(t->valuestring, "json_schema"))
        return serve_reject(e, 400, "response_format.type", NULL,
                            "'response_format.type' is '%.64s'; it must be text, json_object or "
                            "json_schema",
                            t->valuestring);
    cJSON *js = cJSON_GetObjectItemCaseSensitive(v, "json_schema");
    if (!cJSON_IsObject(js))
        return bad(e, "response_format.json_schema", "'%s' must be an object with a schema%s",
                   "");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        return bad(e, "response_format.json_schema.strict", "'%s' must be true or false%s", "");
    const cJSON *sch = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (sch && !cJSON_IsNull(sch) && !cJSON_IsObject(sch) && !cJSON_IsBool(sch))
        return bad(e, "response_format.json_schema.schema", "'%s' must be a JSON schema%s", "");
    r->format = SERVE_FORMAT_JSON_SCHEMA;
    if (sch && !cJSON_IsNull(sch))
        r->schema = cJSON_DetachItemFromObjectCaseSensitive(js, "schema");
    return MT_OK;
}

static mt_status parse_fields(serve_api api, cJSON *root, const serve_limits *lim,
                              serve_request *r, serve_error *e)
{
#define FIELD(name) cJSON_GetObjectItemCaseSensitive(root, name)
    const cJSON *v;
    if ((v = FIELD("model")) && !cJSON_IsNull(v)) {
        MT_CHECK(take_str(v, "model", false, &r->model, NULL, e));
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
        MT_CHECK(get_tools(root, r, e));
        MT_CHECK(get_tool_choice(FIELD("tool_choice"), r, e));
        if (r->tool_choice == SERVE_TOOL_NONE)
            r->n_tools = 0; /* neither rendered nor parsed; the texts are freed at release */
        if ((v = FIELD("separate_reasoning")) && !cJSON_IsNull(v))
            MT_CHECK(get_bool(v, "separate_reasoning", &r->separate_reasoning, e));
        if ((v = FIELD("include_reasoning")) && !cJSON_IsNull(v))
            MT_CHECK(get_bool(v, "include_reasoning", &r->include_reasoning, e));
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
    if ((v = FIELD("min_p")) && !cJSON_IsNull(v))
        MT_CHECK(get_float(v, "min_p", 0, 1, false, &r->min_p, e));
    if ((v = FIELD("presence_penalty")) && !cJSON_IsNull(v))
        MT_CHECK(get_float(v, "presence_penalty", -2, 2, false, &r->presence_penalty, e));
    if ((v = FIELD("frequency_penalty")) && !cJSON_IsNull(v))
        MT_CHECK(get_float(v, "frequency_penalty", -2, 2, false, &r->frequency_penalty, e));
    if ((v = FIELD("repetition_penalty")) && !cJSON_IsNull(v))
        MT_CHECK(get_float(v, "repetition_penalty", 0, 10, true, &r->repetition_penalty, e));
    if ((v = FIELD("logit_bias")))
        MT_CHECK(get_logit_bias(v, lim, r, e));
    if ((v = FIELD("response_format")))
        MT_CHECK(get_response_format((cJSON *)v, r, e));
    if ((v = FIELD("parallel_tool_calls")) && !cJSON_IsNull(v))
        MT_CHECK(get_bool(v, "parallel_tool_calls", &r->parallel_tool_calls, e));
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
    if ((v = FIELD("speculative_steps")) && !cJSON_IsNull(v)) {
        int64_t k;
        MT_CHECK(get_int(v, "speculative_steps", 0, MODEL_SPEC_MAX_STEPS, &k, e));
        r->spec_steps = (int)k;
        r->has_spec_steps = true;
    }
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
    int64_t k;
    if ((v = FIELD("n")) && !cJSON_IsNull(v)) {
        MT_CHECK(get_int(v, "n", 1, SERVE_MAX_N, &k, e));
        r->n = (int)k;
    }
    r->best_of = r->n;
    if ((v = FIELD("best_of")) && !cJSON_IsNull(v)) {
        MT_CHECK(get_int(v, "best_of", r->n, SERVE_MAX_N, &k, e));
        r->best_of = (int)k;
        if (r->best_of > r->n && r->stream)
            return serve_reject(e, 400, "best_of", NULL,
                                "'best_of' larger than 'n' cannot be streamed: the best choices "
                                "are known only at the end");
    }
    v = FIELD("logprobs");
    if (api == SERVE_API_CHAT) {
        if (v && !cJSON_IsNull(v))
            MT_CHECK(get_bool(v, "logprobs", &r->logprobs, e));
        if ((v = FIELD("top_logprobs")) && !cJSON_IsNull(v)) {
            MT_CHECK(get_int(v, "top_logprobs", 0, SERVE_MAX_TOP_LOGPROBS, &k, e));
            r->top_logprobs = (int)k;
            if (k > 0 && !r->logprobs)
                return serve_reject(e, 400, "top_logprobs", NULL,
                                    "'top_logprobs' needs 'logprobs' set to true");
        }
    } else if (v && !cJSON_IsNull(v)) {
        if (cJSON_IsBool(v)) { /* a lenient reading of the chat form */
            r->logprobs = cJSON_IsTrue(v);
        } else {
            MT_CHECK(get_int(v, "logprobs", 0, SERVE_MAX_TOP_LOGPROBS, &k, e));
            r->logprobs = true;
            r->top_logprobs = (int)k;
        }
    }
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
    out->repetition_penalty = 1.0f;
    out->parallel_tool_calls = true;
    out->include_usage = false;
    out->add_generation_prompt = true;
    out->enable_thinking = false;
    out->separate_reasoning = true;
    out->include_reasoning = true;
    out->n = out->best_of = 1;
    if ((unsigned)api >= SERVE_API_COUNT)
        return serve_reject(e, 404, NULL, NULL, "unknown endpoint");
    size_t deep_at = 0;
    if (mt_json_too_deep(body, len, MT_JSON_MAX_DEPTH, &deep_at))
        return serve_reject(e, 400, NULL, "invalid_json",
                            "the body nests arrays and objects more than %d deep (at byte %zu)",
                            MT_JSON_MAX_DEPTH, deep_at);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    lens l = {0};
    size_t bad_at = 0;
    if (!root) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        mt_status ls = lex_lengths(body, len, &l, &bad_at);
        free(l.v);
        if (ls == MT_E_FORMAT)
            return serve_reject(e, 400, NULL, "invalid_json",
                                "the body is not valid JSON: the escape at byte %zu is a lone "
                                "UTF-16 surrogate (\\u%.4s), which is no character",
                                bad_at, body + bad_at + 2);
        return serve_reject(e, 400, NULL, "invalid_json",
                            "the body is not valid JSON (error at byte %zu of %zu)", at, len);
    }
    mt_status ls = lex_lengths(body, len, &l, &bad_at);
    if (ls == MT_E_FORMAT) {
        free(l.v);
        cJSON_Delete(root);
        return serve_reject(e, 400, NULL, "invalid_json",
                            "the body is not valid JSON: the escape at byte %zu is a lone "
                            "UTF-16 surrogate (\\u%.4s), which is no character",
                            bad_at, body + bad_at + 2);
    }
    if (ls != MT_OK) {
        free(l.v);
        cJSON_Delete(root);
        return oom(e, "the body");
    }
    size_t li = 0;
    assign_lengths(root, &l, &li);
    free(l.v);
    /* Duplicate keys: the last one counts, as in JavaScript and Python
     * (cJSON's lookups would find the first). */
    if (serve_json_dedupe(root) != MT_OK) {
        cJSON_Delete(root);
        return oom(e, "the body");
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
        const model_chat_extra *x = r->extra ? &r->extra[i] : NULL;
        for (size_t c = 0; x && x->calls && c < x->n_calls; c++) {
            free((char *)x->calls[c].name);
            for (size_t k = 0; k < x->calls[c].n_args; k++) {
                free((char *)x->calls[c].args[k].key);
                free((char *)x->calls[c].args[k].value);
            }
            free((model_chat_arg *)x->calls[c].args);
        }
        if (x)
            free((model_chat_call *)x->calls);
    }
    free(r->msgs);
    free(r->extra);
    if (r->tools) /* tool_choice none or named hid some: free every text */
        for (int i = 0, n = r->tools_json ? cJSON_GetArraySize(r->tools_json) : 0; i < n; i++)
            free(r->tools[i].text);
    free(r->tools);
    cJSON_Delete(r->tools_json);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->logit_bias);
    cJSON_Delete(r->schema);
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
        const char **tools = r->n_tools ? malloc((size_t)r->n_tools * sizeof *tools) : NULL;
        if (r->n_tools && !tools)
            return oom(e, "tools");
        for (int i = 0; i < r->n_tools; i++)
            tools[i] = r->tools[i].text;
        model_chat_opts o = {.add_generation_prompt = r->add_generation_prompt,
                             .enable_thinking = r->enable_thinking,
                             .tools = tools,
                             .n_tools = (size_t)r->n_tools,
                             .extra = r->extra};
        mt_status st = model_chat_encode(tok, r->msgs, r->n_msgs, &o, ids, n, &err);
        free(tools);
        if (st != MT_OK)
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
