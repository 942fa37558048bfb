/* serve_mask.h: structured outputs' token mask: which tokens of the
 * model's vocabulary the grammar (serve_grammar.h) accepts from a state, as
 * a bitset the sampler applies (a refused token's logit becomes -inf).
 *
 * A token is allowed when the grammar accepts all its bytes, one after
 * another, from the state; a token that is not text (a special token) never
 * is, except the stop tokens, which are allowed exactly where the output
 * may end. The vocabulary index (serve_vocab) holds a trie of the tokens'
 * byte strings, so a mask walks only the prefixes the grammar accepts, and
 * for states inside a string (where nearly every token is allowed)
 * precomputed masks of the tokens that stay inside a string, by their
 * length in characters, plus a short list of the tokens that can leave it,
 * checked one by one. serve_mask_cache keeps masks by state for states that
 * repeat (per grammar, least recently used out first).
 *
 * Ownership: create/destroy pairs (destroy NULL is a no-op). Thread
 * safety: a serve_vocab is immutable after create except for its scratch,
 * which a mutex guards, so any thread may compute masks; a cache has its
 * own mutex. */
#ifndef MT_SERVE_MASK_H
#define MT_SERVE_MASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "model/format/tokenizer.h"
#include "serve_grammar.h"

typedef struct serve_vocab serve_vocab;
typedef struct serve_mask_cache serve_mask_cache;

/* An index over n tokens: bytes[i] (lens[i] bytes; copied) for id i;
 * is_text[i] false for a token that stands for no text (special). */
mt_status serve_vocab_create(int32_t n, const char *const *bytes, const uint32_t *lens,
                             const bool *is_text, serve_vocab **out, mt_err *err);
/* The same from a tokenizer (its special tokens are not text), for ids
 * below vocab (ids the tokenizer lacks are not text). */
mt_status serve_vocab_from_tokenizer(const model_tokenizer *tok, int32_t vocab,
                                     serve_vocab **out, mt_err *err);
void serve_vocab_destroy(serve_vocab *v);

int32_t serve_vocab_size(const serve_vocab *v);
/* Token id's bytes (*len of them), or NULL for a token that is no text. */
const char *serve_vocab_token(const serve_vocab *v, int32_t id, size_t *len);
/* 64-bit words in a mask (bit i of word i / 64: token i). */
size_t serve_mask_words(const serve_vocab *v);

/* The text tokens the grammar accepts from s into mask (serve_mask_words
 * words, overwritten); returns whether the output may end at s (the stop
 * tokens' bits are the caller's). */
bool serve_mask_compute(serve_vocab *v, const serve_grammar *g, const serve_gstate *s,
                        uint64_t *mask);

/* A cache of masks by state of one grammar over one vocabulary, holding at
 * most max_bytes of masks (0: 32 MiB). */
mt_status serve_mask_cache_create(size_t max_bytes, serve_mask_cache **out, mt_err *err);
void serve_mask_cache_destroy(serve_mask_cache *c);
/* serve_mask_compute through the cache (c may be NULL: no cache); *hit
 * (may be NULL) says whether the cache had it. */
bool serve_mask_get(serve_vocab *v, const serve_grammar *g, serve_mask_cache *c,
                    const serve_gstate *s, uint64_t *mask, bool *hit);
/* Lookups answered from the cache and computed, so far. */
void serve_mask_cache_stats(serve_mask_cache *c, uint64_t *hits, uint64_t *misses);

/* Sets logits of the tokens whose bit is clear to -inf (vocab floats). */
void serve_mask_apply(const uint64_t *mask, float *logits, int32_t vocab);

#endif
