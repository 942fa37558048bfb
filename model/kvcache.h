/* kvcache.h: the paged KV cache of GLM-5.2's attention: the latent cache
 * (per token `latent` + `rope` values: the compressed KV and the shared,
 * already rotated rope key; 512 + 64 at GLM-5.2) and the DSA indexer-key
 * cache (`index_dim` values per token, after k_norm and rope), both stored
 * in bf16 or fp8 e4m3 with a per-cache float scale (stored = value /
 * scale). The two caches share page ids and page size, so one page table
 * serves mla_prefill, mla_decode and dsa_indexer.
 *
 * Memory: two device pools of n_pages pages (dev_alloc), and host-side
 * bookkeeping: a free list, per-page reference counts and, per sequence,
 * its list of pages. Token pos of a sequence lives in pool row
 * pages[pos / page_size] * page_size + pos % page_size (attn_page_elem).
 * Sequences can share whole pages (kvc_seq_fork: prefix caching); a write
 * into a shared page copies it first, so sharing is never visible.
 *
 * Ownership: the cache owns its pools and sequences' bookkeeping; a kvc_seq
 * belongs to the cache that made it and is released with kvc_seq_destroy
 * (or by kvc_destroy). Failures return an mt_status with err filled and
 * leave the cache as it was. Not thread-safe: one thread per cache (the
 * device calls it makes follow dev_* rules). */
#ifndef MT_KVCACHE_H
#define MT_KVCACHE_H

#include <stdint.h>

#include "kernels/core/family.h"

typedef struct kvc_opts {
    int page_size;       /* tokens per page, >= 1 */
    int n_pages;         /* pages in each pool, >= 1 */
    int latent, rope;    /* values per token in the latent cache */
    int index_dim;       /* values per token in the indexer-key cache; 0: none */
    kern_dtype dtype;    /* KERN_DT_BF16 or KERN_DT_FP8E4M3, both caches */
    float scale;         /* latent cache scale; 0 means 1 */
    float index_scale;   /* indexer cache scale; 0 means 1 */
} kvc_opts;

typedef struct kvc_cache kvc_cache;
typedef struct kvc_seq kvc_seq;

/* Allocates the pools on d (which must outlive the cache). Bad options are
 * MT_E_INVALID naming the field. d NULL: page bookkeeping only, no pools
 * (what a leader keeps of another rank's cache: the same calls hand out
 * the same pages); append, read and table_upload then fail. */
mt_status kvc_create(dev_device *d, const kvc_opts *o, kvc_cache **out, mt_err *err);
/* Frees the pools and every sequence still open. NULL is a no-op. */
void kvc_destroy(kvc_cache *c);

/* The options as applied (scales filled in). */
const kvc_opts *kvc_get_opts(const kvc_cache *c);
int kvc_free_pages(const kvc_cache *c);
/* Device pools [n_pages][page_size][width] and one-float scale buffers,
 * as the attention families take them. Owned by the cache. */
void *kvc_latent_pool(const kvc_cache *c);
void *kvc_index_pool(const kvc_cache *c);      /* NULL without an indexer cache */
void *kvc_latent_scale(const kvc_cache *c);
void *kvc_index_scale(const kvc_cache *c);

/* An empty sequence. */
mt_status kvc_seq_create(kvc_cache *c, kvc_seq **out, mt_err *err);
/* Returns the sequence's pages (those still shared stay with their other
 * owners). NULL is a no-op. */
void kvc_seq_destroy(kvc_cache *c, kvc_seq *s);
int64_t kvc_seq_len(const kvc_seq *s);

/* Extends s by n tokens and writes each new token's pool row index
 * (page * page_size + offset) to rows[0:n] (may be NULL), for a device
 * kernel that writes the rows itself. A shared last page is copied first.
 * MT_E_NOMEM (nothing changed) when the pool cannot hold them. */
mt_status kvc_seq_reserve(kvc_cache *c, kvc_seq *s, int64_t n, int64_t *rows, mt_err *err);
/* Appends n tokens from host memory: rows [n][latent + rope] and, when the
 * cache has one, index_rows [n][index_dim] (NULL writes zeros), encoded to
 * the cache type and copied to the device. */
mt_status kvc_seq_append(kvc_cache *c, kvc_seq *s, int64_t n, const float *rows,
                         const float *index_rows, mt_err *err);
/* Keeps the first len tokens (len <= length; speculative-decoding rollback). */
mt_status kvc_seq_truncate(kvc_cache *c, kvc_seq *s, int64_t len, mt_err *err);
/* A new sequence holding the first len tokens of src (len <= its length):
 * whole pages are shared, a partial last page is copied. */
mt_status kvc_seq_fork(kvc_cache *c, const kvc_seq *src, int64_t len, kvc_seq **out,
                       mt_err *err);
/* Reads token pos back, decoded and scaled (index_row may be NULL). */
mt_status kvc_seq_read(kvc_cache *c, const kvc_seq *s, int64_t pos, float *row,
                       float *index_row, mt_err *err);

/* Writes up to cap page ids of s in order; returns how many s has. */
int64_t kvc_seq_pages(const kvc_seq *s, int32_t *out, int64_t cap);
/* Writes a page table [n][max_pages] int32 for seqs to the device buffer
 * dev_table (unused entries 0: a valid page the kernels never read past a
 * context length). MT_E_INVALID when a sequence has more than max_pages. */
mt_status kvc_table_upload(kvc_cache *c, kvc_seq *const *seqs, int n, int64_t max_pages,
                           void *dev_table, mt_err *err);

#endif
