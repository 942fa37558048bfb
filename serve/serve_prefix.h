/* serve_prefix.h: the prefix cache's index: which sequences hold the KV of
 * which token prefixes, at the granularity of KV pages ("blocks" of
 * block_size tokens).
 *
 * A holder is a sequence (by the runtime's id) plus a copy of its tokens:
 * either a running request (pinned: never evicted) whose computed blocks
 * become visible as its prefill advances, or a finished request the cache
 * retains (unpinned: evictable, least recently used first). Block k of a
 * holder is keyed by a chained 64-bit hash of blocks 0..k, so one lookup
 * per block walks a prompt; every hash maps to all holders that have that
 * block (a removed holder never hides another's), and a match is checked
 * token by token against the chosen holder before it is returned.
 *
 * The index knows nothing of the runtime: the caller forks the returned
 * sequence and frees the sequences that serve_prefix_evict hands back.
 *
 * Costs: add/grow O(new blocks), match O(prompt), remove O(holder's blocks),
 * evict O(holders). Ownership: create/destroy; destroy(NULL) is a no-op.
 * Not thread-safe (the engine thread owns it). */
#ifndef MT_SERVE_PREFIX_H
#define MT_SERVE_PREFIX_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

typedef struct serve_prefix serve_prefix;

mt_status serve_prefix_create(int block_size, serve_prefix **out, mt_err *err);
void serve_prefix_destroy(serve_prefix *p);

/* Registers seq (seq >= 0, not yet a holder) with tokens[0..n) of which the
 * first n_valid have KV computed; only whole blocks of those are indexed.
 * The tokens are copied. */
mt_status serve_prefix_add(serve_prefix *p, int seq, const int32_t *tokens, int64_t n,
                           int64_t n_valid, bool pinned, uint64_t now, mt_err *err);
/* The holder's KV now covers n_valid of its tokens (n_valid only grows). */
void serve_prefix_grow(serve_prefix *p, int seq, int64_t n_valid);
/* Marks the holder retained (evictable) and touches its LRU time. */
void serve_prefix_unpin(serve_prefix *p, int seq, uint64_t now);
/* Forgets seq (no-op when it is not a holder). */
void serve_prefix_remove(serve_prefix *p, int seq);
bool serve_prefix_has(const serve_prefix *p, int seq);

/* The longest prefix of tokens[0..n), a whole number of blocks and at most
 * max tokens, that a holder has computed. Returns its length (0 when none)
 * and the holder in *seq, and touches that holder's LRU time. */
int64_t serve_prefix_match(serve_prefix *p, const int32_t *tokens, int64_t n, int64_t max,
                           uint64_t now, int *seq);

/* Removes the least recently used unpinned holder and returns true with its
 * seq (the caller frees the sequence); false when every holder is pinned. */
bool serve_prefix_evict(serve_prefix *p, int *seq);
/* The same among the holders whose seq ok(ctx, seq) accepts (ok NULL: all). */
bool serve_prefix_evict_if(serve_prefix *p, bool (*ok)(void *ctx, int seq), void *ctx, int *seq);

/* Holders that are retained (unpinned), and all holders. */
int serve_prefix_retained(const serve_prefix *p);
int serve_prefix_holders(const serve_prefix *p);

#endif
