/* attn_common.h: pieces shared by GLM-5.2's attention families (mla_prefill,
 * mla_decode, dsa_indexer, rope) and the paged KV cache (model/kvcache.h):
 *
 *  - cache element encoding (bf16, or fp8 e4m3 with a per-cache float scale:
 *    stored = value / scale) and paged addressing;
 *  - the RoPE cos/sin table and the interleaved rotation GLM-5 uses;
 *  - plain C references, computed in double: the test oracles;
 *  - the families' shared problem layout, buffers, defines and kernel
 *    lookups (their matrix-instruction rules are in attn_mma.h).
 *
 * Paged layout (all families): a pool of pages, each `ps` tokens of `width`
 * elements; token `pos` of a sequence whose page-table row is `tbl` lives at
 * element ((tbl[pos / ps] * ps) + pos % ps) * width. Page tables are int32.
 *
 * Everything here is pure or works on caller-owned memory; thread-safe.
 * Running a family on one's own buffers goes through kern_exec (exec.h). */
#ifndef MT_ATTN_COMMON_H
#define MT_ATTN_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"
#include "kernels/core/family.h"

/* ---- cache elements --------------------------------------------------- */

/* Bytes per cache element: 2 (bf16) or 1 (fp8 e4m3). */
/* The scale the MLA kernels multiply q . k by: sm_bits, when nonzero, is
 * the float's bit pattern (the runtime passes the model's, e.g. with YaRN's
 * correction); else (d + r)^-0.5 for nope width d and rope width r. */
float attn_softmax_scale(int64_t sm_bits, int64_t d, int64_t r);

size_t attn_kv_esize(kern_dtype t);
/* True for the cache types the kernels read: bf16 and fp8 e4m3. */
bool attn_kv_dtype_ok(kern_dtype t);
/* Decodes element i of base and multiplies by scale. */
float attn_kv_load(kern_dtype t, const void *base, size_t i, float scale);
/* Encodes v / scale into element i (fp8 saturates at +-448). */
void attn_kv_store(kern_dtype t, void *base, size_t i, float v, float scale);

/* Element offset of token pos's first value in a paged pool. */
static inline size_t attn_page_elem(const int32_t *tbl, int64_t ps, int64_t width,
                                    int64_t pos)
{
    return ((size_t)tbl[pos / ps] * (size_t)ps + (size_t)(pos % ps)) * (size_t)width;
}

/* ---- RoPE -------------------------------------------------------------- */

/* Fills rows [0, npos) of the table: row p holds cos(p * f_i) for i < r/2,
 * then sin(p * f_i), with f_i = theta^(-2i/r) (computed in double). */
void attn_rope_table(double theta, int r, int64_t npos, float *cos_sin);

/* Interleaved rotation of r values in place, pairs (2i, 2i+1) by angle i of
 * the table row: x'[2i] = x[2i] c - x[2i+1] s, x'[2i+1] = x[2i+1] c + x[2i] s.
 * transformers' rope_interleave path permutes the pairs into half-split
 * order instead of writing them back in place; q.k dot products are the
 * same, which is all attention and the indexer read. */
void attn_rope_rotate(double *x, int r, const float *cs_row);

/* ---- references (double precision, the test oracles) -------------------- */

/* Absorbed MLA over the latent cache (mla_decode). Query m, head h:
 * q = q_abs[m][h] (L + R values: W_UK^T q_nope, then q_rope), score of a
 * token t = scale * q . cache[t] (L + R values), o[m][h] = softmax-weighted
 * sum of cache[t][0:L]. Tokens: dense, t < ctx_len[m]; sparse, the entries
 * of sel[m][0:topk] inside [0, ctx_len[m]) (others ignored; duplicates
 * count twice). A query with no token gets zeros. */
typedef struct attn_decode_args {
    int64_t m, h, l, r;
    double scale;
    const uint16_t *q;          /* bf16 [m][h][l + r] */
    const void *pool;           /* [pages][ps][l + r] */
    kern_dtype kv;
    float kscale;
    int64_t ps;
    const int32_t *table;       /* [n_seq][max_pages] */
    int64_t max_pages;
    const int32_t *qseq;        /* [m]: page-table row of each query */
    const int32_t *ctx_len;     /* [m] */
    const int32_t *sel;         /* [m][topk], or NULL for dense */
    int64_t topk;
    float *out;                 /* f32 [m][h][l] */
} attn_decode_args;
void attn_ref_decode(const attn_decode_args *a);

/* Dense causal MLA prefill of m new tokens at positions p..p+m-1 of one
 * sequence, keys and values expanded from the latent through kv_b:
 * k_nope[t][h] = W_UK[h] c_t and v[t][h] = W_UV[h] c_t, each rounded to
 * bf16 (as the kernels store them); k_rope[t] = cache[t][l:l+r] (shared by
 * all heads). Query i attends tokens 0..p+i; scale = (d + r)^-0.5 unless
 * given. */
typedef struct attn_prefill_args {
    int64_t m, p, h, l, r, d, v;
    const uint16_t *q;          /* bf16 [m][h][d + r] */
    const void *pool;           /* [pages][ps][l + r] */
    kern_dtype kv;
    float kscale;
    int64_t ps;
    const int32_t *table;       /* [max_pages] */
    const uint16_t *wkv;        /* bf16 [h * (d + v)][l]: per head d rows W_UK, v rows W_UV */
    uint16_t *out;              /* bf16 [m][h][v] */
    double scale;               /* softmax scale; 0: (d + r)^-0.5 */
} attn_prefill_args;
void attn_ref_prefill(const attn_prefill_args *a);

/* DSA indexer scores of query m over tokens t < ctx_len[m]:
 * score[t] = ih^-0.5 * sum_h w[m][h] * relu(id^-0.5 * q[m][h] . k[t]). */
typedef struct attn_index_args {
    int64_t m, ih, id;
    const uint16_t *q;          /* bf16 [m][ih][id] */
    const float *w;             /* f32 [m][ih] */
    const void *pool;           /* [pages][ps][id] */
    kern_dtype kv;
    float kscale;
    int64_t ps;
    const int32_t *table;
    int64_t max_pages;
    const int32_t *qseq;
    const int32_t *ctx_len;
} attn_index_args;
/* Scores of one query into out[0:ctx_len[qi]]. */
void attn_ref_index_scores(const attn_index_args *a, int64_t qi, double *out);

/* Top-k rule of the dsa_indexer family: keeps the min(k, n) largest of
 * score[0:n]; among equal scores the lower index wins. Writes the kept
 * indices in ascending order to idx[0:k] and -1 to the rest; returns how
 * many were kept. */
int64_t attn_ref_topk(const double *score, int64_t n, int64_t k, int32_t *idx);

/* ---- helpers for problem generators ---------------------------------- */

/* n_rows page-table rows of max_pages distinct random pages out of
 * n_pages (n_pages >= max_pages). */
void attn_fill_table(mt_rng *r, int32_t *table, int64_t n_rows,
                     int64_t max_pages, int64_t n_pages);
/* Fills a pool with values ~ N(0, sd) encoded with scale. */
void attn_fill_pool(mt_rng *r, void *pool, kern_dtype t, size_t n, float sd,
                    float scale);
/* n bf16 values ~ N(0, sd). */
void attn_fill_bf16(mt_rng *r, uint16_t *x, size_t n, float sd);

/* The paged layout of a decode-style problem (mla_decode, dsa_indexer): m
 * queries, two to a page-table row (the problems' model of draft tokens);
 * query i sees attn_ctx_of(c, m, i) tokens, the last query c; a row names
 * ceil(c / ps) pages of a pool 3 pages larger than all rows need. */
typedef struct attn_paged {
    int64_t n_seq;     /* page-table rows: ceil(m / 2) */
    int64_t max_pages; /* pages a row names */
    int64_t n_pages;   /* pages in the pool */
} attn_paged;
attn_paged attn_paged_of(int64_t m, int64_t c, int64_t ps);
/* Tokens query i of m sees: c - (m - 1 - i), at least 1. */
int64_t attn_ctx_of(int64_t c, int64_t m, int64_t i);
/* Whether query i is the last of its page-table row (it sees the most). */
bool attn_last_of_row(int64_t m, int64_t i);
/* The page-table row and the context length of each of the m queries
 * (draws nothing from a generator). */
void attn_fill_queries(int32_t *qseq, int32_t *ctx_len, int64_t m, int64_t c);

/* ---- pieces of the families' code --------------------------------------- */

/* shape_ok's rule for the cache element type kv (a dtype dim's value):
 * false, naming it, unless the kernels read it (attn_kv_dtype_ok). */
bool attn_kv_shape_ok(int64_t kv, char *why, size_t cap);
/* The paged cache's buffers at out[0..3): the pool `name` of elems values
 * of type kv, its scale (one f32) and the page table (table_entries
 * int32), all inputs. */
void attn_cache_bufs(kern_buf_desc *out, const char *name, kern_dtype kv, size_t elems,
                     size_t table_entries);
/* The decode-style queries' buffers at out[0..2): qseq and ctx_len, m
 * int32 each, inputs. */
void attn_query_bufs(kern_buf_desc *out, int64_t m);
/* Appends -Dname=v at out[n], its text in buf[n]; returns n + 1. */
int attn_define(dev_define *out, char (*buf)[64], int n, const char *name, long long v);
/* The defines both MLA families' kernels take, at out[0..3): KV_FP8 (1: an
 * fp8 cache), NT (threads a block, nt) and NACC (accumulators a thread:
 * ceil(acc / nt)). Returns 3. */
int attn_mla_defines(dev_define *out, char (*buf)[64], kern_dtype kv, int nt, int64_t acc);
/* Looks up a family's two kernels through kern_get; the first failure's
 * status. */
mt_status attn_get_kernels(const kern_ctx *c, const char *name0, const char *sig0,
                           dev_kernel **k0, const char *name1, const char *sig1,
                           dev_kernel **k1, mt_err *err);

#endif
