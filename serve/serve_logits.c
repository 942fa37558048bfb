/* serve_logits.c: a request's token constraints and the server's grammar
 * registry (see serve_logits.h). */
#include "serve_logits.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define REGISTRY_MAX 32             /* grammars kept compiled */
#define CACHE_BYTES (32u << 20)    /* masks kept per grammar */

/* A compiled grammar and its masks, shared by the requests that use it. */
typedef struct gentry {
    char *key;
    serve_grammar *g;
    serve_mask_cache *cache;
    int refs;            /* the registry's (while listed) and each serve_logits' */
    struct gentry *next; /* registry list, most recently used first */
} gentry;

struct serve_constraints {
    pthread_mutex_t mu;
    serve_vocab *vocab;
    gentry *head;
    int n;
};

struct serve_logits {
    serve_constraints *c;
    gentry *ge;            /* NULL: no grammar */
    serve_vocab *vocab;
    serve_gstate state;    /* after the first `consumed` generated tokens */
    int64_t consumed;
    bool ended;            /* the generated tokens left the grammar, or a stop came */
    int32_t *stops, *forbid;
    int n_stops, n_forbid;
    int32_t after, then_forbid;
    bool after_seen;       /* among the first `seen` generated tokens */
    int64_t seen;
    uint64_t *mask;
    uint64_t computed, from_cache;
};

mt_status serve_constraints_create(serve_constraints **out, mt_err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return mt_fail(err, MT_E_NOMEM, "constraints");
    pthread_mutex_init(&(*out)->mu, NULL);
    return MT_OK;
}

static void entry_release(gentry *e)
{
    if (--e->refs > 0)
        return;
    serve_grammar_release(e->g);
    serve_mask_cache_destroy(e->cache);
    free(e->key);
    free(e);
}

void serve_constraints_destroy(serve_constraints *c)
{
    if (!c)
        return;
    for (gentry *e = c->head; e;) {
        gentry *n = e->next;
        entry_release(e);
        e = n;
    }
    serve_vocab_destroy(c->vocab);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

serve_vocab *serve_constraints_vocab(serve_constraints *c, const model_tokenizer *tok,
                                     int32_t vocab, serve_error *e)
{
    pthread_mutex_lock(&c->mu);
    if (!c->vocab) {
        mt_err err = MT_ERR_INIT;
        if (!tok)
            serve_reject(e, 400, "response_format", NULL,
                         "structured outputs need the model's tokenizer; this model has none");
        else if (serve_vocab_from_tokenizer(tok, vocab, &c->vocab, &err) != MT_OK)
            serve_reject(e, 500, NULL, NULL, "indexing the vocabulary: %s", err.msg);
    }
    serve_vocab *v = c->vocab;
    pthread_mutex_unlock(&c->mu);
    return v;
}

/* The registry's entry for key (compiled on a miss), with a reference for
 * the caller. Compiling happens outside the lock; two requests compiling
 * the same key at once both compile, and the first to list it wins. */
static mt_status entry_get(serve_constraints *c, const char *key, const serve_grammar_opts *go,
                           gentry **out, serve_error *e)
{
    pthread_mutex_lock(&c->mu);
    for (gentry **p = &c->head; *p; p = &(*p)->next)
        if (!strcmp((*p)->key, key)) {
            gentry *x = *p;
            *p = x->next; /* to the front */
            x->next = c->head;
            c->head = x;
            x->refs++;
            *out = x;
            pthread_mutex_unlock(&c->mu);
            return MT_OK;
        }
    pthread_mutex_unlock(&c->mu);
    gentry *x = calloc(1, sizeof *x);
    mt_err err = MT_ERR_INIT;
    if (!x || !(x->key = strdup(key)) ||
        serve_mask_cache_create(CACHE_BYTES, &x->cache, &err) != MT_OK) {
        if (x)
            free(x->key);
        free(x);
        return serve_reject(e, 500, NULL, NULL, "out of memory for a grammar");
    }
    mt_status st = serve_grammar_compile(go, &x->g, e);
    if (st != MT_OK) {
        serve_mask_cache_destroy(x->cache);
        free(x->key);
        free(x);
        return st;
    }
    x->refs = 2; /* the registry's and the caller's */
    pthread_mutex_lock(&c->mu);
    x->next = c->head;
    c->head = x;
    if (++c->n > REGISTRY_MAX) { /* drop the least recently used */
        gentry **p = &c->head;
        while ((*p)->next)
            p = &(*p)->next;
        gentry *last = *p;
        *p = NULL;
        c->n--;
        entry_release(last);
    }
    pthread_mutex_unlock(&c->mu);
    *out = x;
    return MT_OK;
}

static int32_t *dup_ids(const int32_t *ids, int n)
{
    int32_t *p = malloc(((size_t)n + 1) * sizeof *p);
    if (p && n)
        memcpy(p, ids, (size_t)n * sizeof *p);
    return p;
}

mt_status serve_logits_create(serve_constraints *c, const serve_logits_opts *o,
                              serve_logits **out, serve_error *e)
{
    *out = NULL;
    serve_logits *l = calloc(1, sizeof *l);
    if (!l || !(l->stops = dup_ids(o->stops, o->n_stops)) ||
        !(l->forbid = dup_ids(o->forbid, o->n_forbid))) {
        serve_logits_destroy(l);
        return serve_reject(e, 500, NULL, NULL, "out of memory for a request's constraints");
    }
    l->c = c;
    l->n_stops = o->n_stops;
    l->n_forbid = o->n_forbid;
    l->after = o->after;
    l->then_forbid = o->then_forbid;
    if (o->grammar) {
        mt_status st = entry_get(c, o->key, o->grammar, &l->ge, e);
        if (st != MT_OK) {
            serve_logits_destroy(l);
            return st;
        }
        l->vocab = o->vocab;
        l->mask = malloc(serve_mask_words(o->vocab) * sizeof *l->mask);
        if (!l->mask) {
            serve_logits_destroy(l);
            return serve_reject(e, 500, NULL, NULL, "out of memory for a request's mask");
        }
        serve_grammar_start(l->ge->g, &l->state);
    }
    *out = l;
    return MT_OK;
}

void serve_logits_destroy(serve_logits *l)
{
    if (!l)
        return;
    if (l->ge) {
        pthread_mutex_lock(&l->c->mu);
        entry_release(l->ge);
        pthread_mutex_unlock(&l->c->mu);
    }
    free(l->stops);
    free(l->forbid);
    free(l->mask);
    free(l);
}

static bool is_stop(const serve_logits *l, int32_t t)
{
    for (int i = 0; i < l->n_stops; i++)
        if (l->stops[i] == t)
            return true;
    return false;
}

/* Feeds token t to state s; false when the grammar refuses it (a stop
 * token, or bytes it does not accept). */
static bool feed_token(const serve_logits *l, serve_gstate *s, int32_t t)
{
    size_t n;
    const char *p = serve_vocab_token(l->vocab, t, &n);
    return p && serve_grammar_feed(l->ge->g, s, p, n);
}

mt_status serve_logits_apply(serve_logits *l, const int32_t *gen, int64_t n_gen,
                             const int32_t *extra, int n_extra, float *logits, int32_t vocab,
                             mt_err *err)
{
    (void)err;
    for (int i = 0; i < l->n_forbid; i++)
        if (l->forbid[i] >= 0 && l->forbid[i] < vocab)
            logits[l->forbid[i]] = -INFINITY;
    if (l->after >= 0) {
        for (; l->seen < n_gen; l->seen++)
            l->after_seen |= gen[l->seen] == l->after;
        bool seen = l->after_seen;
        for (int i = 0; i < n_extra; i++)
            seen |= extra[i] == l->after;
        if (seen && l->then_forbid >= 0 && l->then_forbid < vocab)
            logits[l->then_forbid] = -INFINITY;
    }
    if (!l->ge)
        return MT_OK;
    for (; l->consumed < n_gen; l->consumed++)
        if (!l->ended && !feed_token(l, &l->state, gen[l->consumed]))
            l->ended = true;
    serve_gstate t;
    t.depth = l->state.depth;
    memcpy(t.f, l->state.f, t.depth * sizeof *t.f);
    bool ended = l->ended;
    for (int i = 0; i < n_extra && !ended; i++)
        ended = !feed_token(l, &t, extra[i]);
    size_t words = serve_mask_words(l->vocab);
    bool accepting = true;
    if (ended) {
        memset(l->mask, 0, words * sizeof *l->mask);
    } else {
        bool hit;
        accepting = serve_mask_get(l->vocab, l->ge->g, l->ge->cache, &t, l->mask, &hit);
        l->from_cache += hit;
        l->computed += !hit;
    }
    bool any = false;
    for (size_t w = 0; w < words && !any; w++)
        any = l->mask[w] != 0;
    if (accepting || !any) /* a grammar with no way on ends (not expected: no dead ends) */
        for (int i = 0; i < l->n_stops; i++)
            if (l->stops[i] >= 0 && (size_t)l->stops[i] < words * 64)
                l->mask[l->stops[i] >> 6] |= 1ull << (l->stops[i] & 63);
    int32_t n = vocab < (int32_t)(words * 64) ? vocab : (int32_t)(words * 64);
    serve_mask_apply(l->mask, logits, n);
    for (int32_t i = n; i < vocab; i++)
        if (!is_stop(l, i))
            logits[i] = -INFINITY; /* past the index's vocabulary */
    return MT_OK;
}

void serve_logits_stats(const serve_logits *l, uint64_t *computed, uint64_t *cached)
{
    *computed = l->computed;
    *cached = l->from_cache;
}

/* ---- what a request asks ------------------------------------------------------- */

void serve_logits_spec_release(serve_logits_spec *s)
{
    for (int i = 0; s->tool_params && i < s->n_tool_params; i++)
        free(s->tool_params[i]);
    free(s->tool_params);
    free(s->tools);
    cJSON_Delete(s->any_value);
    serve_buf_release(&s->key);
    memset(s, 0, sizeof *s);
}

static mt_status key_json(serve_buf *b, const cJSON *v)
{
    char *j = v ? cJSON_PrintUnformatted(v) : NULL;
    mt_status st = serve_buf_puts(b, j ? j : "null");
    free(j);
    return st;
}

mt_status serve_logits_spec_make(const serve_request *req, bool chat, const model_tokenizer *tok,
                                 const int32_t *stops, int n_stops, serve_logits_spec *cs,
                                 serve_error *e)
{
    memset(cs, 0, sizeof *cs);
    bool calls = chat && req->n_tools > 0 &&
                 (req->tool_choice == SERVE_TOOL_REQUIRED || req->tool_choice == SERVE_TOOL_NAMED);
    bool json = !calls && req->format != SERVE_FORMAT_TEXT;
    cs->lo.after = cs->lo.then_forbid = -1;
    if (n_stops > (int)(sizeof cs->stops / sizeof cs->stops[0]))
        n_stops = (int)(sizeof cs->stops / sizeof cs->stops[0]);
    memcpy(cs->stops, stops, (size_t)n_stops * sizeof *stops);
    cs->lo.stops = cs->stops;
    cs->lo.n_stops = n_stops;
    int32_t call_tok = tok ? model_tokenizer_token_id(tok, "<tool_call>") : -1;
    int32_t call_end = tok ? model_tokenizer_token_id(tok, "</tool_call>") : -1;
    if (chat && req->tool_choice == SERVE_TOOL_NONE && call_tok >= 0) {
        cs->forbid[0] = call_tok; /* no raw call in the content */
        cs->lo.forbid = cs->forbid;
        cs->lo.n_forbid = 1;
        cs->want = true;
    }
    if (chat && !calls && req->n_tools > 0 && !req->parallel_tool_calls && call_tok >= 0 &&
        call_end >= 0) {
        cs->lo.after = call_end; /* one call at most */
        cs->lo.then_forbid = call_tok;
        cs->want = true;
    }
    if (!calls && !json)
        return MT_OK;
    cs->want = true;
    /* Thinking opened by the prompt: the answer comes after "</think>". */
    cs->go.prefix = chat && req->enable_thinking && req->add_generation_prompt &&
                            req->separate_reasoning
                        ? "</think>"
                        : NULL;
    mt_status st = serve_buf_printf(&cs->key, "%c|%s|", calls ? 'T' : 'J',
                                    cs->go.prefix ? cs->go.prefix : "");
    if (calls) {
        int n = req->n_tools;
        cs->tools = calloc((size_t)n, sizeof *cs->tools);
        cs->tool_params = calloc((size_t)n, sizeof *cs->tool_params);
        if (!cs->tools || !cs->tool_params)
            return serve_reject(e, 500, NULL, NULL, "out of memory");
        cs->n_tool_params = n;
        cs->go.n_tools = n;
        cs->go.parallel = req->parallel_tool_calls;
        st = st ? st : serve_buf_printf(&cs->key, "%d|", (int)req->parallel_tool_calls);
        for (int i = 0; i < n && st == MT_OK; i++) {
            cs->tools[i] = (serve_grammar_tool){req->tools[i].name, req->tools[i].parameters};
            char p[64];
            snprintf(p, sizeof p, "tools[%d].function.parameters", req->tools[i].index);
            if (!(cs->tool_params[i] = strdup(p)))
                st = MT_E_NOMEM;
            st = st ? st : serve_buf_printf(&cs->key, "%s\x1f", req->tools[i].name);
            st = st ? st : key_json(&cs->key, req->tools[i].parameters);
            st = st ? st : serve_buf_puts(&cs->key, "\x1e");
        }
        cs->go.tools = cs->tools;
        cs->go.tool_params = (const char *const *)cs->tool_params;
    } else {
        cs->go.param = "response_format.json_schema.schema";
        if (req->format == SERVE_FORMAT_JSON_SCHEMA) {
            if (!req->schema && !(cs->any_value = cJSON_CreateTrue()))
                return serve_reject(e, 500, NULL, NULL, "out of memory");
            cs->go.schema = req->schema ? req->schema : cs->any_value;
            st = st ? st : key_json(&cs->key, cs->go.schema);
        } else {
            st = st ? st : serve_buf_puts(&cs->key, "json_object");
        }
    }
    if (st != MT_OK)
        return serve_reject(e, 500, NULL, NULL, "out of memory");
    cs->lo.grammar = &cs->go;
    cs->lo.key = cs->key.data;
    return MT_OK;
}
