/* attn_mma.h: the matrix-instruction (MMA=1|2) paths of the attention
 * families (mla_decode, mla_prefill, dsa_indexer): whether a config's
 * tiles fit the platform's fragments, the waves, the registers and the
 * shared memory, and the search for a default MMA config. The reasons a
 * config is refused name the parameters at fault (the tests read them).
 * Pure functions of their arguments; thread-safe. */
#ifndef MT_ATTN_MMA_H
#define MT_ATTN_MMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/core/family.h"

/* The fragment tile of MMA=mma on p (kern_mma_tile); false with the
 * reason in why where p has no such matrix instruction. */
bool attn_mma_tile(const dev_props *p, int mma, int *tm, int *tn, int *tk, char *why,
                   size_t cap);

/* An attention block on matrix fragments: the scores, a tile of `rows`
 * (heads or queries) by `bn` (tokens or keys) over the reduction dims k[],
 * each a whole number of K steps; then the output, rows by `out` values,
 * whose fragments the waves split (out first, then rows) and keep in
 * registers (at most 128 a lane). The names and nouns print in reasons,
 * e.g. "HB=16 heads x BN=32 tokens over L+R=576". */
typedef struct attn_mma_tiling {
    int mma;                /* the MMA parameter: 1 or 2 */
    int waves;              /* the WAVES parameter */
    int stages;             /* the STAGES parameter, which must be 1; 0: none */
    const char *rows_name;  /* "HB", "BM" */
    const char *rows_noun;  /* "heads", "queries" */
    int rows;
    const char *bn_noun;    /* what the BN parameter counts: "tokens", "keys" */
    int bn;
    int n_k;                /* reduction dims: 1 or 2 */
    const char *k_name[2];  /* "L+R"; "D", "R" */
    int64_t k[2];
    const char *out_name;   /* "L", "V" */
    int64_t out;
    size_t shared;          /* bytes of shared memory the tiles take */
    bool static_shared;     /* static __shared__ arrays (their own device limit) */
} attn_mma_tiling;

/* True when t's tiles run on p; else false with the first reason in why:
 * no such instruction, STAGES other than 1, fragments that do not tile the
 * scores, waves that do not tile the output, more than 128 accumulator
 * registers a lane, or more shared memory than p allows. */
bool attn_mma_valid(const attn_mma_tiling *t, const dev_props *p, char *why, size_t cap);

/* The scalar (MMA=0) paths' limits: at most 128 accumulators a thread,
 * ceil(acc / nt) (what names the product in the reason, e.g. "HB*L"),
 * then shm bytes of dynamic shared memory within p's. False with the
 * reason in why. */
bool attn_scalar_valid(int64_t acc, int nt, const char *what, size_t shm, const dev_props *p,
                       char *why, size_t cap);
/* The shared memory half of attn_scalar_valid. */
bool attn_shared_ok(size_t shm, const dev_props *p, char *why, size_t cap);

/* The default search of an MMA path: candidates are *from with MMA=1 at
 * parameter mma_param and, at the n_set parameters set[], the values of
 * one row of tiles (n_tiles rows of n_set values, best first). The first
 * candidate valid() accepts (scratch reasons go nowhere) is written to
 * *out and true returned; where none is, or p has no MMA=1 instruction,
 * *out is left as it was and false returned. from and out may alias. */
bool attn_mma_pick(const kern_shape *s, int64_t m, const dev_props *p,
                   bool (*valid)(const kern_shape *s, int64_t m, const kern_config *c,
                                 const dev_props *p, char *why, size_t cap),
                   const kern_config *from, int mma_param, const int *set, int n_set,
                   const int *tiles, int n_tiles, kern_config *out);

#endif
