/* serve_logits.h: what a request allows its tokens to be, applied to each
 * step's logits on the engine thread (a refused token's logit becomes
 * -inf): a grammar (structured outputs: response_format, tool_choice
 * required or a named function; serve_grammar.h) through its token mask
 * (serve_mask.h), and tokens forbidden outright (tool_choice none: the
 * tool-call token) or once another token was generated
 * (parallel_tool_calls false: no "<tool_call>" after a "</tool_call>").
 *
 * serve_constraints is the server's part: the vocabulary index, built once
 * when the first constrained request comes, and a registry of compiled
 * grammars by their text, each with its cache of masks, so a schema is
 * compiled once and its masks are shared by every request that uses it.
 * serve_logits is one choice's: its grammar state follows the tokens the
 * choice generated.
 *
 * Ownership: create/destroy pairs (destroy NULL is a no-op); a serve_logits
 * holds a reference on its grammar, which outlives the registry's.
 * Thread safety: serve_constraints may be used from any thread (a mutex
 * inside); a serve_logits by one thread at a time (the engine's). */
#ifndef MT_SERVE_LOGITS_H
#define MT_SERVE_LOGITS_H

#include <stdbool.h>
#include <stdint.h>

#include "model/format/tokenizer.h"
#include "serve_buf.h"
#include "serve_error.h"
#include "serve_grammar.h"
#include "serve_mask.h"
#include "serve_request.h"

typedef struct serve_constraints serve_constraints;
typedef struct serve_logits serve_logits;

mt_status serve_constraints_create(serve_constraints **out, mt_err *err);
void serve_constraints_destroy(serve_constraints *c);
/* The vocabulary index for tok (ids below vocab), built at the first call
 * and kept (later calls return it); NULL with e set (500) on failure. */
serve_vocab *serve_constraints_vocab(serve_constraints *c, const model_tokenizer *tok,
                                     int32_t vocab, serve_error *e);

typedef struct serve_logits_opts {
    /* A grammar, or NULL; key is its text (the same key, the same grammar:
     * the registry compiles it once). */
    const serve_grammar_opts *grammar;
    const char *key;
    serve_vocab *vocab;      /* with a grammar: serve_constraints_vocab's */
    const int32_t *stops;    /* end-of-output tokens: allowed where the grammar may end */
    int n_stops;
    const int32_t *forbid;   /* never allowed */
    int n_forbid;
    int32_t after, then_forbid; /* once token `after` was generated, `then_forbid` is not
                                 * allowed; after -1: no such rule */
} serve_logits_opts;

/* A choice's constraints (copies what it needs of o). A grammar that does
 * not compile is a 400 naming the field (serve_grammar_compile's error). */
mt_status serve_logits_create(serve_constraints *c, const serve_logits_opts *o,
                              serve_logits **out, serve_error *e);
void serve_logits_destroy(serve_logits *l);

/* Applies the constraints to logits (vocab floats) for the position after
 * gen[0..n_gen) (the choice's generated tokens: the grammar follows them
 * from where it last was) and extra[0..n_extra) (speculative drafts before
 * this position). Where the generated tokens left the grammar (a token it
 * refuses, or a stop token) only the stop tokens stay allowed. O(vocab)
 * for the mask's application, plus the mask (cached by state). */
mt_status serve_logits_apply(serve_logits *l, const int32_t *gen, int64_t n_gen,
                             const int32_t *extra, int n_extra, float *logits, int32_t vocab,
                             mt_err *err);

/* What a request asks of its tokens, as serve_logits options: the grammar
 * of tool_choice required or a named function (GLM's calls over the
 * request's tools, one or more as parallel_tool_calls says), else of
 * response_format json_object / json_schema (a json_schema without a schema
 * is any value); with thinking opened by a chat prompt (and reasoning
 * separated) the answer follows "</think>"; tool_choice none refuses the
 * tool-call token, parallel_tool_calls false (without a grammar) refuses it
 * after a "</tool_call>". chat: the chat endpoint (tools and thinking apply
 * only there); tok: the model's tokenizer (the tags' ids; may be NULL);
 * stops (copied): the end-of-output tokens. The grammar is not compiled
 * here (serve_logits_create does); lo.vocab is left NULL for the caller.
 * want false: the request asks nothing. Out of memory is a 500 in e.
 * Release frees what make allocated (safe on a zeroed or failed spec). */
typedef struct serve_logits_spec {
    serve_logits_opts lo;
    serve_grammar_opts go;
    bool want;
    /* storage behind lo and go */
    serve_grammar_tool *tools;
    char **tool_params;
    int n_tool_params;
    struct cJSON *any_value;
    serve_buf key;
    int32_t stops[16];
    int32_t forbid[1];
} serve_logits_spec;

mt_status serve_logits_spec_make(const serve_request *req, bool chat, const model_tokenizer *tok,
                                 const int32_t *stops, int n_stops, serve_logits_spec *out,
                                 serve_error *e);
void serve_logits_spec_release(serve_logits_spec *s);

/* Masks computed and served from the cache for this choice (tests, logs). */
void serve_logits_stats(const serve_logits *l, uint64_t *computed, uint64_t *cached);

#endif
