/* serve_glmout.c: GLM output to reasoning, content and tool calls (see
 * serve_glmout.h). A small state machine over the text; every tag is ASCII,
 * so holding back a tag's prefix never splits a UTF-8 character. */
#define _GNU_SOURCE /* memmem */
#include "serve_glmout.h"

#include "common/json_depth.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define T_THINK "<think>"
#define T_THINK_END "</think>"
#define T_CALL "<tool_call>"
#define T_CALL_END "</tool_call>"
#define T_KEY "<arg_key>"
#define T_KEY_END "</arg_key>"
#define T_VAL "<arg_value>"
#define T_VAL_END "</arg_value>"
#define MAX_NAME 256 /* a longer "name" is not a call */

#define TRY(x)                                                                                   \
    do {                                                                                         \
        mt_status st_ = (x);                                                                     \
        if (st_ != MT_OK)                                                                        \
            return st_;                                                                          \
    } while (0)

/* ---- deltas ------------------------------------------------------------------- */

void serve_glmout_delta_reset(serve_glmout_delta *d)
{
    serve_buf_reset(&d->reasoning);
    serve_buf_reset(&d->content);
    for (int i = 0; i < d->n_calls; i++) {
        free(d->calls[i].name);
        serve_buf_release(&d->calls[i].args);
    }
    d->n_calls = 0;
}

void serve_glmout_delta_release(serve_glmout_delta *d)
{
    serve_glmout_delta_reset(d);
    serve_buf_release(&d->reasoning);
    serve_buf_release(&d->content);
    free(d->calls);
    memset(d, 0, sizeof *d);
}

/* The delta entry of call index (merged with the last entry when it is the
 * same call). */
static serve_glmout_call_delta *delta_call(serve_glmout_delta *d, int index)
{
    if (d->n_calls && d->calls[d->n_calls - 1].index == index)
        return &d->calls[d->n_calls - 1];
    if (d->n_calls == d->cap_calls) {
        int cap = d->cap_calls ? d->cap_calls * 2 : 4;
        serve_glmout_call_delta *c = realloc(d->calls, (size_t)cap * sizeof *c);
        if (!c)
            return NULL;
        d->calls = c;
        d->cap_calls = cap;
    }
    serve_glmout_call_delta *c = &d->calls[d->n_calls++];
    memset(c, 0, sizeof *c);
    c->index = index;
    return c;
}

/* ---- JSON values ----------------------------------------------------------------- */

static mt_status json_string(serve_buf *out, const char *s, size_t n)
{
    TRY(serve_buf_puts(out, "\""));
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        TRY(serve_buf_append(out, s + run, i - run));
        run = i + 1;
        switch (c) {
        case '"': TRY(serve_buf_puts(out, "\\\"")); break;
        case '\\': TRY(serve_buf_puts(out, "\\\\")); break;
        case '\n': TRY(serve_buf_puts(out, "\\n")); break;
        case '\r': TRY(serve_buf_puts(out, "\\r")); break;
        case '\t': TRY(serve_buf_puts(out, "\\t")); break;
        default: TRY(serve_buf_printf(out, "\\u%04x", c)); break;
        }
    }
    TRY(serve_buf_append(out, s + run, n - run));
    return serve_buf_puts(out, "\"");
}

/* v as the JSON type named t, when it reads as one: appends and returns
 * true. */
static bool as_type(const char *t, const char *v, size_t n, serve_buf *out, mt_status *st)
{
    while (n && strchr(" \t\r\n", v[0]))
        v++, n--;
    while (n && strchr(" \t\r\n", v[n - 1]))
        n--;
    if (!n || !strcmp(t, "string"))
        return false;
    if (!strcmp(t, "boolean")) {
        if ((n == 4 && !strncasecmp(v, "true", 4)) || (n == 5 && !strncasecmp(v, "false", 5))) {
            *st = serve_buf_puts(out, n == 4 ? "true" : "false");
            return true;
        }
        return false;
    }
    if (!strcmp(t, "null")) {
        if ((n == 4 && !strncmp(v, "null", 4)) || (n == 4 && !strncmp(v, "None", 4))) {
            *st = serve_buf_puts(out, "null");
            return true;
        }
        return false;
    }
    if (mt_json_too_deep(v, n, MT_JSON_MAX_DEPTH, NULL))
        return false; /* kept as a string: deeper than the server parses */
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(v, n, &end, false);
    bool ok = j && end == v + n &&
              ((!strcmp(t, "integer") && cJSON_IsNumber(j) && j->valuedouble == (double)(long long)j->valuedouble &&
                !memchr(v, '.', n) && !memchr(v, 'e', n) && !memchr(v, 'E', n)) ||
               (!strcmp(t, "number") && cJSON_IsNumber(j)) ||
               (!strcmp(t, "object") && cJSON_IsObject(j)) ||
               (!strcmp(t, "array") && cJSON_IsArray(j)));
    if (ok) {
        char *p = cJSON_PrintUnformatted(j);
        *st = p ? serve_buf_puts(out, p) : MT_E_NOMEM;
        free(p);
    }
    cJSON_Delete(j);
    return ok;
}

mt_status serve_glmout_arg_json(const cJSON *schema, const char *v, size_t n, serve_buf *out)
{
    const cJSON *type = cJSON_IsObject(schema) ? cJSON_GetObjectItemCaseSensitive(schema, "type")
                                               : NULL;
    mt_status st = MT_OK;
    if (cJSON_IsString(type) && as_type(type->valuestring, v, n, out, &st))
        return st;
    if (cJSON_IsArray(type)) {
        const cJSON *t;
        cJSON_ArrayForEach(t, type)
        {
            if (cJSON_IsString(t) && as_type(t->valuestring, v, n, out, &st))
                return st;
        }
    }
    return json_string(out, v, n);
}

/* ---- the parser -------------------------------------------------------------------- */

void serve_glmout_init(serve_glmout *p, const serve_glmout_opts *o)
{
    memset(p, 0, sizeof *p);
    p->o = *o;
    /* The caller's prefix may not outlive this call (a loop's buffer). */
    snprintf(p->id_prefix, sizeof p->id_prefix, "%s", o->id_prefix ? o->id_prefix : "0");
    p->o.id_prefix = NULL;
    p->state = o->start_in_reasoning && !o->keep_reasoning ? SERVE_GLMOUT_REASONING
                                                           : SERVE_GLMOUT_CONTENT;
    p->call_tool = -1;
}

void serve_glmout_release(serve_glmout *p)
{
    serve_buf_release(&p->pending);
    serve_buf_release(&p->call);
    serve_buf_release(&p->call_json);
}

int serve_glmout_calls(const serve_glmout *p) { return p->n_calls; }

/* Whether "<tool_call>" opens a call here: tools given, and fewer calls
 * made than max_calls allows. */
static bool tools_on(const serve_glmout *p)
{
    return p->o.tools && p->o.n_tools > 0 && (p->o.max_calls <= 0 || p->n_calls < p->o.max_calls);
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t partial_tag(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t k = t - 1 < n ? t - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k))
            return k;
    return 0;
}

static mt_status emit_content(serve_glmout *p, serve_glmout_delta *d, const char *s, size_t n)
{
    for (size_t i = 0; i < n && !p->seen_content; i++)
        p->seen_content = !strchr(" \t\r\n", s[i]);
    return serve_buf_append(&d->content, s, n);
}

static void call_id(const serve_glmout *p, int index, char *out, size_t cap)
{
    snprintf(out, cap, "call_%s_%d", p->id_prefix, index);
}

static void call_reset(serve_glmout *p)
{
    serve_buf_reset(&p->call);
    serve_buf_reset(&p->call_json);
    p->call_pos = 0;
    p->call_named = false;
    p->call_tool = -1;
    p->call_args = 0;
}

/* The open call is not a call: its raw text becomes content and what
 * followed "<tool_call>" is read again as content. */
static mt_status call_malformed(serve_glmout *p, serve_glmout_delta *d)
{
    TRY(emit_content(p, d, T_CALL, strlen(T_CALL)));
    serve_buf rest = SERVE_BUF_INIT;
    size_t skip = strlen(T_CALL);
    mt_status st = serve_buf_append(&rest, p->call.data + skip, p->call.len - skip);
    if (st == MT_OK)
        st = serve_buf_append(&rest, p->pending.data ? p->pending.data : "", p->pending.len);
    if (st != MT_OK) {
        serve_buf_release(&rest);
        return st;
    }
    serve_buf_release(&p->pending);
    p->pending = rest;
    call_reset(p);
    p->state = SERVE_GLMOUT_CONTENT;
    return MT_OK;
}

enum { SCAN_MORE = 0, SCAN_BAD = 1, SCAN_DONE = 2, SCAN_STEP = 3 };

static size_t skip_ws(const char *s, size_t at, size_t n)
{
    while (at < n && strchr(" \t\r\n", s[at]))
        at++;
    return at;
}

/* s[at..n) starts with tag (1), is a proper prefix of it (0: need more) or
 * neither (-1). */
static int starts(const char *s, size_t at, size_t n, const char *tag)
{
    size_t t = strlen(tag), have = n - at;
    if (have >= t)
        return memcmp(s + at, tag, t) ? -1 : 1;
    return memcmp(s + at, tag, have) ? -1 : 0;
}

/* One step of parsing the open call from call_pos. */
static int call_step(serve_glmout *p, mt_status *st)
{
    const char *s = p->call.data;
    size_t n = p->call.len;
    if (!p->call_named) {
        size_t a = strlen(T_CALL), j = a;
        while (j < n && s[j] != '<' && s[j] != '\n')
            j++;
        if (j == n)
            return n - a > MAX_NAME ? SCAN_BAD : SCAN_MORE;
        size_t b = a, e = j;
        while (b < e && strchr(" \t\r", s[b]))
            b++;
        while (e > b && strchr(" \t\r", s[e - 1]))
            e--;
        for (int t = 0; t < p->o.n_tools; t++) {
            const char *name = p->o.tools[t].name;
            if (name && strlen(name) == e - b && !memcmp(name, s + b, e - b)) {
                p->call_tool = t;
                break;
            }
        }
        if (p->call_tool < 0)
            return SCAN_BAD;
        p->call_named = true;
        p->call_pos = j;
        return SCAN_STEP;
    }
    size_t at = skip_ws(s, p->call_pos, n);
    if (at == n)
        return SCAN_MORE;
    int r = starts(s, at, n, T_CALL_END);
    if (r == 1) {
        p->call_pos = at + strlen(T_CALL_END);
        return SCAN_DONE;
    }
    int k = starts(s, at, n, T_KEY);
    if (r == 0 || k == 0)
        return SCAN_MORE;
    if (k < 0)
        return SCAN_BAD;
    size_t key = at + strlen(T_KEY);
    const char *ke = memmem(s + key, n - key, T_KEY_END, strlen(T_KEY_END));
    if (!ke)
        return SCAN_MORE;
    size_t vat = skip_ws(s, (size_t)(ke - s) + strlen(T_KEY_END), n);
    if (vat == n)
        return SCAN_MORE;
    int v = starts(s, vat, n, T_VAL);
    if (v <= 0)
        return v == 0 ? SCAN_MORE : SCAN_BAD;
    size_t val = vat + strlen(T_VAL);
    const char *ve = memmem(s + val, n - val, T_VAL_END, strlen(T_VAL_END));
    if (!ve)
        return SCAN_MORE;
    /* A whole argument: key text [key, ke), value text [val, ve). */
    serve_buf frag = SERVE_BUF_INIT;
    size_t kl = (size_t)(ke - s) - key;
    const cJSON *props = p->o.tools[p->call_tool].properties;
    const cJSON *schema = NULL;
    if (cJSON_IsObject(props)) {
        char *kz = strndup(s + key, kl);
        schema = kz ? cJSON_GetObjectItemCaseSensitive(props, kz) : NULL;
        free(kz);
    }
    *st = serve_buf_puts(&frag, p->call_args ? "," : "{");
    if (*st == MT_OK)
        *st = json_string(&frag, s + key, kl);
    if (*st == MT_OK)
        *st = serve_buf_puts(&frag, ":");
    if (*st == MT_OK)
        *st = serve_glmout_arg_json(schema, s + val, (size_t)(ve - s) - val, &frag);
    if (*st == MT_OK)
        *st = serve_buf_append(&p->call_json, frag.data, frag.len);
    serve_buf_release(&frag);
    if (*st != MT_OK)
        return SCAN_BAD;
    p->call_args++;
    p->call_pos = (size_t)(ve - s) + strlen(T_VAL_END);
    return SCAN_STEP;
}

/* The open call ended at call_pos: emit all of it (id, name, arguments) in
 * one delta entry and give what followed back to pending. */
static mt_status call_done(serve_glmout *p, serve_glmout_delta *d)
{
    const char *close = p->call_args ? "}" : "{}";
    serve_glmout_call_delta *c = delta_call(d, p->n_calls);
    if (!c)
        return MT_E_NOMEM;
    call_id(p, p->n_calls, c->id, sizeof c->id);
    if (!(c->name = strdup(p->o.tools[p->call_tool].name)))
        return MT_E_NOMEM;
    TRY(serve_buf_append(&c->args, p->call_json.data ? p->call_json.data : "", p->call_json.len));
    TRY(serve_buf_puts(&c->args, close));
    p->n_calls++;
    serve_buf rest = SERVE_BUF_INIT;
    mt_status st = serve_buf_append(&rest, p->call.data + p->call_pos, p->call.len - p->call_pos);
    if (st == MT_OK)
        st = serve_buf_append(&rest, p->pending.data ? p->pending.data : "", p->pending.len);
    if (st != MT_OK) {
        serve_buf_release(&rest);
        return st;
    }
    serve_buf_release(&p->pending);
    p->pending = rest;
    call_reset(p);
    p->state = SERVE_GLMOUT_CONTENT;
    return MT_OK;
}

/* Processes pending as far as it is decided; final: nothing more comes. */
static mt_status run(serve_glmout *p, serve_glmout_delta *d, bool final)
{
    for (;;) {
        const char *s = p->pending.data ? p->pending.data : "";
        size_t n = p->pending.len;
        if (p->state == SERVE_GLMOUT_CALL) {
            TRY(serve_buf_append(&p->call, s, n));
            serve_buf_reset(&p->pending);
            mt_status st = MT_OK;
            int r;
            while ((r = call_step(p, &st)) == SCAN_STEP)
                ;
            if (st != MT_OK)
                return st;
            if (r == SCAN_DONE) {
                TRY(call_done(p, d));
                continue;
            }
            if (r == SCAN_BAD || final) {
                TRY(call_malformed(p, d));
                continue;
            }
            return MT_OK; /* SCAN_MORE */
        }
        /* Content or reasoning: the earliest tag that changes state. */
        const char *tags[3];
        int nt = 0;
        if (p->state == SERVE_GLMOUT_REASONING) {
            tags[nt++] = T_THINK_END;
        } else {
            if (tools_on(p))
                tags[nt++] = T_CALL;
            if (!p->o.keep_reasoning && !p->seen_content)
                tags[nt++] = T_THINK;
        }
        /* "<think>" opens reasoning only before any content: its search
         * ends at the first non-whitespace byte. */
        size_t lead = 0;
        while (lead < n && strchr(" \t\r\n", s[lead]))
            lead++;
        size_t best = n;
        int which = -1;
        for (int i = 0; i < nt; i++) {
            size_t limit = !strcmp(tags[i], T_THINK) ? lead + strlen(T_THINK) : n;
            const char *f = memmem(s, limit < n ? limit : n, tags[i], strlen(tags[i]));
            if (f && (size_t)(f - s) < best) {
                best = (size_t)(f - s);
                which = i;
            }
        }
        size_t upto = best;
        if (which < 0 && !final) {
            size_t hold = 0;
            for (int i = 0; i < nt; i++) {
                size_t h = partial_tag(s, n, tags[i]);
                if (!strcmp(tags[i], T_THINK) && n - h != lead)
                    h = 0;
                hold = h > hold ? h : hold;
            }
            upto = n - hold;
        }
        if (p->state == SERVE_GLMOUT_REASONING)
            TRY(serve_buf_append(&d->reasoning, s, upto));
        else
            TRY(emit_content(p, d, s, upto));
        if (which < 0) {
            serve_buf_consume(&p->pending, upto);
            return MT_OK;
        }
        const char *t = tags[which];
        size_t tl = strlen(t);
        if (!strcmp(t, T_THINK_END) || !strcmp(t, T_THINK)) {
            p->state = !strcmp(t, T_THINK) ? SERVE_GLMOUT_REASONING : SERVE_GLMOUT_CONTENT;
            serve_buf_consume(&p->pending, upto + tl);
        } else {
            call_reset(p);
            TRY(serve_buf_append(&p->call, T_CALL, tl));
            serve_buf_consume(&p->pending, upto + tl);
            p->state = SERVE_GLMOUT_CALL;
        }
    }
}

mt_status serve_glmout_push(serve_glmout *p, const char *s, size_t n, serve_glmout_delta *d)
{
    serve_glmout_delta_reset(d);
    TRY(serve_buf_append(&p->pending, s, n));
    return run(p, d, false);
}

mt_status serve_glmout_finish(serve_glmout *p, serve_glmout_delta *d)
{
    serve_glmout_delta_reset(d);
    return run(p, d, true);
}
