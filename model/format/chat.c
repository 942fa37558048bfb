/* chat.c: GLM chat template rendering and encoding (see chat.h). */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

static const char *const role_names[MODEL_CHAT_ROLE_COUNT] = {
    [MODEL_CHAT_SYSTEM] = "system",
    [MODEL_CHAT_USER] = "user",
    [MODEL_CHAT_ASSISTANT] = "assistant",
    [MODEL_CHAT_OBSERVATION] = "observation",
};
static const char *const role_tags[MODEL_CHAT_ROLE_COUNT] = {
    [MODEL_CHAT_SYSTEM] = "<|system|>",
    [MODEL_CHAT_USER] = "<|user|>",
    [MODEL_CHAT_ASSISTANT] = "<|assistant|>",
    [MODEL_CHAT_OBSERVATION] = "<|observation|>",
};
_Static_assert(sizeof role_names / sizeof role_names[0] == MODEL_CHAT_ROLE_COUNT, "roles");

const char *model_chat_role_name(model_chat_role r)
{
    return (unsigned)r < MODEL_CHAT_ROLE_COUNT ? role_names[r] : "?";
}

bool model_chat_role_parse(const char *s, model_chat_role *out)
{
    for (int i = 0; i < MODEL_CHAT_ROLE_COUNT; i++)
        if (!strcmp(s, role_names[i])) {
            *out = (model_chat_role)i;
            return true;
        }
    if (!strcmp(s, "tool")) {
        *out = MODEL_CHAT_OBSERVATION;
        return true;
    }
    return false;
}

/* The template as a list of parts: a role or thinking tag (one special
 * token), content (encoded plainly) or tool-format markup (its own token
 * when the tokenizer has one, else encoded with added tokens read). */
typedef enum part_kind { P_TAG = 0, P_TEXT = 1, P_MARK = 2 } part_kind;

typedef struct part {
    const char *s;
    size_t len;
    part_kind kind;
} part;

typedef bool (*part_fn)(void *ctx, part p);

static part tag(const char *s) { return (part){s, strlen(s), P_TAG}; }
static part mark(const char *s) { return (part){s, strlen(s), P_MARK}; }
static part text(const char *s) { return (part){s ? s : "", s ? strlen(s) : 0, P_TEXT}; }

static const char tools_head[] =
    "\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
static const char tools_tail[] =
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key>"
    "<arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key>"
    "<arg_value>{arg-value-2}</arg_value>...</tool_call>";

/* "<tool_call>" name ("<arg_key>" k "</arg_key><arg_value>" v "</arg_value>")...
 * "</tool_call>", GLM-4.7's compact form. */
static bool walk_call(const model_chat_call *c, part_fn fn, void *ctx)
{
    if (!fn(ctx, mark("<tool_call>")) || !fn(ctx, text(c->name)))
        return false;
    for (size_t k = 0; k < c->n_args; k++)
        if (!fn(ctx, mark("<arg_key>")) || !fn(ctx, text(c->args[k].key)) ||
            !fn(ctx, mark("</arg_key>")) || !fn(ctx, mark("<arg_value>")) ||
            !fn(ctx, text(c->args[k].value)) || !fn(ctx, mark("</arg_value>")))
            return false;
    return fn(ctx, mark("</tool_call>"));
}

static bool walk(const model_chat_msg *msgs, size_t n, const model_chat_opts *o, part_fn fn,
                 void *ctx)
{
    if (!fn(ctx, tag("[gMASK]")) || !fn(ctx, tag("<sop>")))
        return false;
    if (o && o->n_tools) {
        if (!fn(ctx, tag("<|system|>")) || !fn(ctx, mark(tools_head)))
            return false;
        /* Each tool's JSON with its newline: "}\n" is one pre-token of the
         * rendered text, so encoding them together keeps the ids equal. */
        for (size_t i = 0; i < o->n_tools; i++)
            if (!fn(ctx, (part){o->tools[i], strlen(o->tools[i]), P_TEXT}) ||
                !fn(ctx, (part){"\n", 1, P_TEXT}))
                return false;
        if (!fn(ctx, mark(tools_tail)))
            return false;
    }
    for (size_t i = 0; i < n; i++) {
        const model_chat_msg *m = &msgs[i];
        const model_chat_extra *x = o && o->extra ? &o->extra[i] : NULL;
        if ((unsigned)m->role >= MODEL_CHAT_ROLE_COUNT)
            return false;
        bool run_of_results = m->role == MODEL_CHAT_OBSERVATION && i > 0 &&
                              msgs[i - 1].role == MODEL_CHAT_OBSERVATION;
        if (!run_of_results && !fn(ctx, tag(role_tags[m->role])))
            return false;
        if (m->role == MODEL_CHAT_ASSISTANT) {
            if (m->reasoning && (!fn(ctx, tag("<think>")) || !fn(ctx, text(m->reasoning))))
                return false;
            if (!fn(ctx, tag("</think>")))
                return false;
        }
        part c = {m->content ? m->content : "",
                  m->content ? (x && x->content_len ? x->content_len : strlen(m->content)) : 0,
                  P_TEXT};
        if (m->role == MODEL_CHAT_OBSERVATION) {
            /* A run of results shares one <|observation|>, each wrapped. */
            if (!fn(ctx, mark("<tool_response>")) || !fn(ctx, c) ||
                !fn(ctx, mark("</tool_response>")))
                return false;
        } else if (!fn(ctx, c)) {
            return false;
        }
        if (m->role == MODEL_CHAT_ASSISTANT && x)
            for (size_t k = 0; k < x->n_calls; k++)
                if (!walk_call(&x->calls[k], fn, ctx))
                    return false;
    }
    if (o && o->add_generation_prompt)
        return fn(ctx, tag("<|assistant|>")) &&
               fn(ctx, tag(o->enable_thinking ? "<think>" : "</think>"));
    return true;
}

typedef struct text_ctx {
    char *p;
    size_t len, cap;
} text_ctx;

static bool text_part(void *ctx, part p)
{
    text_ctx *t = ctx;
    size_t n = p.len;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *q = realloc(t->p, cap);
        if (!q)
            return false;
        t->p = q;
        t->cap = cap;
    }
    memcpy(t->p + t->len, p.s, n);
    t->len += n;
    t->p[t->len] = 0;
    return true;
}

static mt_status check_roles(const model_chat_msg *msgs, size_t n, mt_err *err)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned)msgs[i].role >= MODEL_CHAT_ROLE_COUNT)
            return mt_fail(err, MT_E_INVALID, "message %zu: unknown role %d", i, (int)msgs[i].role);
    return MT_OK;
}

mt_status model_chat_render(const model_chat_msg *msgs, size_t n, const model_chat_opts *o,
                            char **text, size_t *len, mt_err *err)
{
    *text = NULL;
    mt_status st = check_roles(msgs, n, err);
    if (st != MT_OK)
        return st;
    text_ctx t = {0};
    if (!walk(msgs, n, o, text_part, &t)) {
        free(t.p);
        return mt_fail(err, MT_E_NOMEM, "out of memory rendering the chat");
    }
    *text = t.p;
    if (len)
        *len = t.len;
    return MT_OK;
}

typedef struct ids_ctx {
    const model_tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    mt_err *err;
    mt_status st;
} ids_ctx;

static bool ids_append(ids_ctx *c, const int32_t *ids, size_t n)
{
    if (c->n + n > c->cap) {
        size_t cap = c->cap ? c->cap : 64;
        while (cap < c->n + n)
            cap *= 2;
        int32_t *p = realloc(c->ids, cap * sizeof *p);
        if (!p) {
            c->st = mt_fail(c->err, MT_E_NOMEM, "out of memory");
            return false;
        }
        c->ids = p;
        c->cap = cap;
    }
    memcpy(c->ids + c->n, ids, n * sizeof *ids);
    c->n += n;
    return true;
}

static bool ids_part(void *ctx, part p)
{
    ids_ctx *c = ctx;
    int32_t id = p.kind != P_TEXT ? model_tokenizer_token_id(c->t, p.s) : -1;
    if (p.kind == P_TAG) {
        if (id < 0) {
            c->st = mt_fail(c->err, MT_E_FORMAT, "the tokenizer has no token for GLM's chat tag "
                            "'%s'", p.s);
            return false;
        }
        return ids_append(c, &id, 1);
    }
    if (id >= 0)
        return ids_append(c, &id, 1);
    int32_t *ids = NULL;
    size_t n = 0;
    c->st = p.kind == P_MARK ? model_tokenizer_encode(c->t, p.s, p.len, &ids, &n, c->err)
                             : model_tokenizer_encode_plain(c->t, p.s, p.len, &ids, &n, c->err);
    bool ok = c->st == MT_OK && ids_append(c, ids, n);
    free(ids);
    return ok;
}

mt_status model_chat_encode(const model_tokenizer *t, const model_chat_msg *msgs, size_t n,
                            const model_chat_opts *o, int32_t **ids, size_t *count, mt_err *err)
{
    *ids = NULL;
    *count = 0;
    mt_status st = check_roles(msgs, n, err);
    if (st != MT_OK)
        return st;
    ids_ctx c = {.t = t, .err = err};
    if (!walk(msgs, n, o, ids_part, &c)) {
        free(c.ids);
        return c.st != MT_OK ? c.st : mt_fail(err, MT_E_NOMEM, "out of memory");
    }
    *ids = c.ids ? c.ids : malloc(sizeof(int32_t));
    if (!*ids)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    *count = c.n;
    return MT_OK;
}

size_t model_chat_stop_ids(const model_tokenizer *t, int32_t out[3])
{
    static const char *const stops[3] = {"<|user|>", "<|observation|>", "<|endoftext|>"};
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        int32_t id = model_tokenizer_token_id(t, stops[i]);
        if (id >= 0)
            out[n++] = id;
    }
    return n;
}
