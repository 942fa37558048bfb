/* serve_glmout_check.h: the invariants of the GLM output parser
 * (serve/serve_glmout.h) checked on one input, shared by the libFuzzer
 * target (serve_fuzz_glmout.c) and the Criterion test that replays seeds and
 * mutations in CI (tests/test_serve_glmout.c). Header-only.
 *
 * Input: byte 0 flags (bit 0 start in reasoning, bit 1 keep reasoning,
 * bit 2 at most one call), byte 1 seeds the split of the rest into pieces;
 * the rest is the model's output text. Checked, with three fixed tools:
 *   - the same reasoning, content and calls however the text is split (a
 *     stream and a plain response agree);
 *   - every call comes whole in one delta entry: id, name and arguments;
 *     its arguments parse as a JSON object, and its name is one of the
 *     tools; with bit 2, at most one call;
 *   - with no '<' in the text, everything is content (or reasoning) verbatim.
 * A broken invariant aborts with a message. */
#ifndef MT_SERVE_GLMOUT_CHECK_H
#define MT_SERVE_GLMOUT_CHECK_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_glmout.h"

#define GC_FAIL(...)                                                                             \
    do {                                                                                         \
        fprintf(stderr, "serve_glmout invariant: " __VA_ARGS__);                                 \
        fprintf(stderr, "\n");                                                                   \
        abort();                                                                                 \
    } while (0)

typedef struct gc_result {
    serve_buf reasoning, content;
    int n_calls;
    char names[64][64];
    serve_buf args[64];
    int announced[64];
} gc_result;

static void gc_free(gc_result *r)
{
    serve_buf_release(&r->reasoning);
    serve_buf_release(&r->content);
    for (int i = 0; i < 64; i++)
        serve_buf_release(&r->args[i]);
}

static void gc_take(gc_result *r, const serve_glmout_delta *d)
{
    serve_buf_append(&r->reasoning, d->reasoning.data ? d->reasoning.data : "", d->reasoning.len);
    serve_buf_append(&r->content, d->content.data ? d->content.data : "", d->content.len);
    for (int i = 0; i < d->n_calls; i++) {
        const serve_glmout_call_delta *c = &d->calls[i];
        if (c->index < 0 || c->index >= 64)
            continue;
        if (!c->name || !c->id[0])
            GC_FAIL("call %d came without its name or id", c->index);
        if (r->announced[c->index])
            GC_FAIL("call %d came twice", c->index);
        if (c->index != r->n_calls)
            GC_FAIL("call %d came after %d calls", c->index, r->n_calls);
        r->announced[c->index] = 1;
        snprintf(r->names[c->index], sizeof r->names[c->index], "%s", c->name);
        serve_buf_append(&r->args[c->index], c->args.data ? c->args.data : "", c->args.len);
        r->n_calls = c->index + 1;
    }
}

static cJSON *gc_props(void)
{
    static cJSON *p;
    if (!p)
        p = cJSON_Parse("{\"weather\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
                        "\"metric\":{\"type\":\"boolean\"},\"temp\":{\"type\":[\"number\",\"null\"]}},"
                        "\"search\":{\"query\":{\"type\":\"string\"},\"filters\":{\"type\":\"object\"},"
                        "\"tags\":{\"type\":\"array\"}}}");
    return p;
}

static void gc_run(const char *text, size_t n, unsigned flags, unsigned split, gc_result *r)
{
    serve_glmout_tool tools[3] = {
        {"get_weather", cJSON_GetObjectItem(gc_props(), "weather")},
        {"search", cJSON_GetObjectItem(gc_props(), "search")},
        {"noargs", NULL},
    };
    serve_glmout_opts o = {tools, 3, flags & 1, (flags & 2) != 0, (flags & 4) ? 1 : 0, "t"};
    serve_glmout p;
    serve_glmout_init(&p, &o);
    serve_glmout_delta d = {0};
    uint32_t x = split * 2654435761u + 1;
    size_t at = 0;
    while (at < n) {
        size_t piece = split == 1u << 31 ? 1 : split ? 1 + (x >> 16) % 7 : n - at;
        x = x * 1103515245u + 12345u;
        if (piece > n - at)
            piece = n - at;
        if (serve_glmout_push(&p, text + at, piece, &d) != MT_OK)
            GC_FAIL("push failed");
        gc_take(r, &d);
        at += piece;
    }
    if (serve_glmout_finish(&p, &d) != MT_OK)
        GC_FAIL("finish failed");
    gc_take(r, &d);
    if (serve_glmout_calls(&p) != r->n_calls)
        GC_FAIL("%d calls counted, %d emitted", serve_glmout_calls(&p), r->n_calls);
    if ((flags & 4) && r->n_calls > 1)
        GC_FAIL("%d calls with at most one allowed", r->n_calls);
    serve_glmout_delta_release(&d);
    serve_glmout_release(&p);
}

static void gc_calls_valid(const gc_result *r, const char *mode)
{
    for (int i = 0; i < r->n_calls && i < 64; i++) {
        if (!r->announced[i])
            GC_FAIL("%s: call %d never announced", mode, i);
        if (strcmp(r->names[i], "get_weather") && strcmp(r->names[i], "search") &&
            strcmp(r->names[i], "noargs"))
            GC_FAIL("%s: call %d has unknown name '%s'", mode, i, r->names[i]);
        cJSON *j = cJSON_ParseWithLength(r->args[i].data ? r->args[i].data : "", r->args[i].len);
        if (!cJSON_IsObject(j))
            GC_FAIL("%s: call %d arguments are not a JSON object: %.*s", mode, i,
                    (int)r->args[i].len, r->args[i].data ? r->args[i].data : "");
        cJSON_Delete(j);
    }
}

static int gc_same(const serve_buf *a, const serve_buf *b)
{
    return a->len == b->len && (!a->len || !memcmp(a->data, b->data, a->len));
}

/* Checks one fuzz input (see the top of the file). */
static void serve_glmout_check(const uint8_t *data, size_t size)
{
    if (size < 2)
        return;
    unsigned flags = data[0], split = data[1];
    const char *text = (const char *)data + 2;
    size_t n = size - 2;
    gc_result whole = {0}, pieces = {0}, bytes = {0};
    gc_run(text, n, flags, 0, &whole);
    gc_run(text, n, flags, split | 1, &pieces);
    gc_run(text, n, flags, 1u << 31, &bytes);
    const gc_result *other[2] = {&pieces, &bytes};
    for (int k = 0; k < 2; k++) {
        const gc_result *o = other[k];
        if (!gc_same(&whole.content, &o->content) || !gc_same(&whole.reasoning, &o->reasoning))
            GC_FAIL("the result differs by split (content %zu vs %zu bytes)", whole.content.len,
                    o->content.len);
        if (whole.n_calls != o->n_calls)
            GC_FAIL("%d calls whole, %d in pieces", whole.n_calls, o->n_calls);
        for (int i = 0; i < whole.n_calls && i < 64; i++)
            if (strcmp(whole.names[i], o->names[i]) || !gc_same(&whole.args[i], &o->args[i]))
                GC_FAIL("call %d differs by split", i);
    }
    gc_calls_valid(&whole, "whole");
    if (!memchr(text, '<', n)) {
        serve_buf all = SERVE_BUF_INIT;
        serve_buf_append(&all, whole.reasoning.data ? whole.reasoning.data : "",
                         whole.reasoning.len);
        serve_buf_append(&all, whole.content.data ? whole.content.data : "", whole.content.len);
        if (all.len != n || (n && memcmp(all.data, text, n)))
            GC_FAIL("text without tags was changed");
        serve_buf_release(&all);
    }
    gc_free(&whole);
    gc_free(&pieces);
    gc_free(&bytes);
}

#endif
