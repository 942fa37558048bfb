/* fam_dsa_indexer.c: the `dsa_indexer` family: GLM-5.2's lightning indexer
 * (DeepSeek sparse attention). For query m and visible token t < ctx_len[m]
 *
 *   score[t] = IH^-0.5 * sum_h w[m][h] * relu(ID^-0.5 * q[m][h] . k[t])
 *
 * with q [M][IH][ID] bf16 (wq_b of the q latent, rope on its first R dims,
 * applied by the caller), w [M][IH] f32 (weights_proj of the hidden state),
 * and k from the paged indexer-key cache (wk, k_norm LayerNorm and rope,
 * applied before the append; see fam_rope.c). Then each query keeps the
 * top min(topk, ctx_len) tokens.
 *
 * Selection rule (also the reference's): the kept set is the topk largest
 * scores; among equal scores the LOWER token index is kept. Output: kept
 * indices in ascending token order in idx[m][0:n], -1 in idx[m][n:topk];
 * val[m][j] the kernel's score of idx[m][j] (-inf for empty slots). With
 * ctx_len <= topk every visible token is kept (dense attention).
 *
 * Launches: scores into scratch [M][C] (token tiles of BT x query tiles of
 * QB; a tile of keys is reused by every query of the tile that shares its
 * page-table row), then one block (work item) per query: 4-pass radix
 * select of the threshold on order-preserving 32-bit keys, and an
 * index-ordered compaction that takes ties lowest-index first (on GPUs
 * with TK_SPLIT > 1, TK_SPLIT blocks a query each keep the top-k of their
 * part, and one more merges them). On GPUs,
 * MMA=1|2 computes the scores on matrix instructions (dsa_indexer.hip);
 * MMA=3 (fp8 cache) on fp8 ones, after dsa_q8 has split the query into
 * two e4m3 parts in fragment order (scratch, after the scores); the top-k
 * is the same. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/attn/attn_common.h"
#include "kernels/attn/attn_mma.h"
#include "kernels/core/family.h"

enum { D_IH, D_ID, D_TOPK, D_PS, D_KV, D_C, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_IH] = {"IH", KERN_DIM_INT, false, 1, 256, "indexer heads"},
    [D_ID] = {"ID", KERN_DIM_INT, false, 1, 1024, "indexer head dims"},
    [D_TOPK] = {"topk", KERN_DIM_INT, false, 1, 65536, "tokens kept per query (index_topk)"},
    [D_PS] = {"ps", KERN_DIM_INT, false, 1, 4096, "tokens per cache page"},
    [D_KV] = {"kv", KERN_DIM_DTYPE, false, 0, 0, "key cache element type: bf16 or fp8"},
    [D_C] = {"C", KERN_DIM_INT, true, 1, 1 << 22, "context length of the last query"},
};

static const kern_preset presets[] = {
    {"glm5.2", "IH=32,ID=128,topk=2048,ps=64,kv=bf16,C=8192"},
    {"tiny", "IH=2,ID=32,topk=16,ps=16,kv=bf16,C=40"},
    {"glm5.2-fp8", "IH=32,ID=128,topk=2048,ps=64,kv=fp8,C=8192"},
};

enum { B_Q, B_W, B_CACHE, B_KSCALE, B_TABLE, B_QSEQ, B_CTX, B_IDX, B_VAL, B_COUNT };

static attn_paged paged(const kern_shape *s, int64_t m)
{
    return attn_paged_of(m, s->v[D_C], s->v[D_PS]);
}
static float kscale_of(const kern_shape *s)
{
    return s->v[D_KV] == KERN_DT_FP8E4M3 ? 0.25f : 1.0f;
}

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    (void)m;
    return attn_kv_shape_ok(s->v[D_KV], why, cap);
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return -1;
    size_t ih = (size_t)s->v[D_IH], id = (size_t)s->v[D_ID], um = (size_t)m;
    size_t k = (size_t)s->v[D_TOPK];
    attn_paged g = paged(s, m);
    out[B_Q] = (kern_buf_desc){"q", KERN_BUF_IN, KERN_DT_BF16, um * ih * id * 2, 0, 0, 0};
    out[B_W] = (kern_buf_desc){"w", KERN_BUF_IN, KERN_DT_F32, um * ih * 4, 0, 0, 0};
    attn_cache_bufs(out + B_CACHE, "kcache", (kern_dtype)s->v[D_KV],
                    (size_t)g.n_pages * (size_t)s->v[D_PS] * id, (size_t)(g.n_seq * g.max_pages));
    attn_query_bufs(out + B_QSEQ, m);
    out[B_IDX] = (kern_buf_desc){"idx", KERN_BUF_OUT, KERN_DT_I32, um * k * 4, (int64_t)k, 0, 0};
    out[B_VAL] = (kern_buf_desc){"val", KERN_BUF_OUT, KERN_DT_F32, um * k * 4, (int64_t)k, 0, 0};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    size_t ih = (size_t)s->v[D_IH], id = (size_t)s->v[D_ID];
    kern_dtype kv = (kern_dtype)s->v[D_KV];
    float ks = kscale_of(s);
    attn_fill_bf16(&r, host[B_Q], (size_t)m * ih * id, 1.0f);
    float *w = host[B_W];
    for (size_t i = 0; i < (size_t)m * ih; i++)
        w[i] = mt_rng_normal(&r);
    attn_paged g = paged(s, m);
    size_t rows = (size_t)g.n_pages * (size_t)s->v[D_PS];
    uint8_t *pool = host[B_CACHE];
    size_t rb = id * attn_kv_esize(kv);
    attn_fill_pool(&r, pool, kv, rows * id, 1.0f, ks);
    /* A third of the rows repeat an earlier row: exactly equal scores, so
     * the tie rule is exercised whenever a threshold falls on them. */
    for (size_t i = 1; i < rows; i++)
        if (mt_rng_below(&r, 3) == 0)
            memcpy(pool + i * rb, pool + mt_rng_below(&r, i) * rb, rb);
    *(float *)host[B_KSCALE] = ks;
    attn_fill_table(&r, host[B_TABLE], g.n_seq, g.max_pages, g.n_pages);
    attn_fill_queries(host[B_QSEQ], host[B_CTX], m, s->v[D_C]);
}

static attn_index_args args_of(const kern_shape *s, int64_t m, void *const *host)
{
    return (attn_index_args){
        .m = m, .ih = s->v[D_IH], .id = s->v[D_ID], .q = host[B_Q], .w = host[B_W],
        .pool = host[B_CACHE], .kv = (kern_dtype)s->v[D_KV],
        .kscale = *(const float *)host[B_KSCALE], .ps = s->v[D_PS], .table = host[B_TABLE],
        .max_pages = paged(s, m).max_pages, .qseq = host[B_QSEQ], .ctx_len = host[B_CTX],
    };
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    attn_index_args a = args_of(s, m, host);
    int64_t k = s->v[D_TOPK];
    double *sc = malloc(sizeof(double) * (size_t)s->v[D_C]);
    int32_t *idx = host[B_IDX];
    float *val = host[B_VAL];
    for (int64_t i = 0; i < m; i++) {
        attn_ref_index_scores(&a, i, sc);
        attn_ref_topk(sc, a.ctx_len[i], k, idx + i * k);
        for (int64_t j = 0; j < k; j++)
            val[i * k + j] = idx[i * k + j] >= 0 ? (float)sc[idx[i * k + j]] : -INFINITY;
    }
    free(sc);
}

static int cmp_desc(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a > b ? -1 : a < b ? 1 : 0;
}

/* Float summation order differs from the double reference, so tokens whose
 * scores lie within tol of the threshold may go either way; everything
 * else, and the tie rule among exactly equal scores, must match. */
static bool compare(const kern_shape *s, int64_t m, int b, const void *got,
                    void *const *host, char *why, size_t cap)
{
    if (b != B_IDX && b != B_VAL)
        return true;
    attn_index_args a = args_of(s, m, host);
    int64_t k = s->v[D_TOPK], c = s->v[D_C];
    double *sc = malloc(sizeof(double) * (size_t)c * 2);
    double *sorted = sc + c;
    bool ok = true;
    for (int64_t i = 0; i < m && ok; i++) {
        int64_t len = a.ctx_len[i], keep = len < k ? len : k;
        attn_ref_index_scores(&a, i, sc);
        memcpy(sorted, sc, sizeof(double) * (size_t)len);
        qsort(sorted, (size_t)len, sizeof(double), cmp_desc);
        double thr = sorted[keep - 1], tol = 1e-4 * (fabs(sorted[0]) + fabs(sorted[len - 1])) + 1e-6;
        if (b == B_VAL) {
            /* The kernel's kept scores, sorted, against the reference's. */
            const float *v = (const float *)got + i * k;
            double *gv = malloc(sizeof(double) * (size_t)k);
            int64_t n = 0;
            for (int64_t j = 0; j < k; j++) {
                if (isinf(v[j]) && v[j] < 0)
                    continue;
                if (isnan(v[j])) {
                    snprintf(why, cap, "val row %lld [%lld] is NaN (never written)",
                             (long long)i, (long long)j);
                    ok = false;
                    break;
                }
                gv[n++] = v[j];
            }
            if (ok && n != keep) {
                snprintf(why, cap, "val row %lld: %lld finite scores, expected %lld",
                         (long long)i, (long long)n, (long long)keep);
                ok = false;
            }
            if (ok) {
                qsort(gv, (size_t)n, sizeof(double), cmp_desc);
                for (int64_t j = 0; j < n && ok; j++)
                    if (fabs(gv[j] - sorted[j]) > tol) {
                        snprintf(why, cap, "val row %lld: %lld-th largest kept score %.7g, "
                                 "expected %.7g", (long long)i, (long long)j, gv[j], sorted[j]);
                        ok = false;
                    }
            }
            free(gv);
            continue;
        }
        const int32_t *g = (const int32_t *)got + i * k;
        char *taken = calloc((size_t)len, 1);
        for (int64_t j = 0; j < k && ok; j++) {
            int32_t t = g[j];
            if (j >= keep) {
                if (t != -1) {
                    snprintf(why, cap, "idx row %lld [%lld] = %d, expected -1 past the %lld kept",
                             (long long)i, (long long)j, t, (long long)keep);
                    ok = false;
                }
                continue;
            }
            if (t < 0 || t >= len || taken[t] || (j > 0 && t <= g[j - 1])) {
                snprintf(why, cap, "idx row %lld [%lld] = %d: not a new visible token in "
                         "ascending order (ctx_len %lld)", (long long)i, (long long)j, t,
                         (long long)len);
                ok = false;
                continue;
            }
            taken[t] = 1;
            if (sc[t] < thr - tol) {
                snprintf(why, cap, "idx row %lld keeps token %d of score %.7g below the "
                         "threshold %.7g", (long long)i, t, sc[t], thr);
                ok = false;
            }
        }
        for (int64_t t = 0; t < len && ok; t++) {
            if (!taken[t] && sc[t] > thr + tol) {
                snprintf(why, cap, "idx row %lld drops token %lld of score %.7g above the "
                         "threshold %.7g", (long long)i, (long long)t, sc[t], thr);
                ok = false;
            }
            /* Equal scores: a dropped token must not be below a kept one. */
            for (int64_t u = t + 1; u < len && ok && !taken[t]; u++)
                if (taken[u] && sc[u] == sc[t]) {
                    snprintf(why, cap, "idx row %lld keeps token %lld over token %lld of the "
                             "same score (ties go to the lower index)", (long long)i,
                             (long long)u, (long long)t);
                    ok = false;
                }
        }
        free(taken);
    }
    free(sc);
    return ok;
}

/* Flops: IH dot products of ID per visible token and query (plus the
 * weighting). Minimum bytes: each page-table row's keys once, q, w, and
 * the outputs. */
static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    double ih = (double)s->v[D_IH], id = (double)s->v[D_ID], k = (double)s->v[D_TOPK];
    double es = (double)attn_kv_esize((kern_dtype)s->v[D_KV]);
    double toks = 0, rows = 0;
    for (int64_t i = 0; i < m; i++) {
        double len = (double)attn_ctx_of(s->v[D_C], m, i);
        toks += len;
        rows += attn_last_of_row(m, i) ? len : 0;
    }
    *flops = toks * ih * (2.0 * id + 2.0);
    *bytes = rows * id * es + (double)m * (ih * id * 2 + ih * 4 + k * 8);
}

/* ---- run ------------------------------------------------------------------------- */

static int param(const kern_ctx *c, const char *name)
{
    return kern_config_get(c->impl, c->cfg, name, 1);
}

static int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

/* The GPU side's config has GP_COUNT values (the cpu's fewer): its MMA
 * (fifth) and TK_SPLIT (sixth). */
static bool is_fp8_path(const kern_config *cfg)
{
    return cfg->n == 6 && cfg->v[4] == 3;
}

static int tk_split(const kern_config *cfg)
{
    return cfg->n == 6 ? cfg->v[5] : 1;
}

/* Scratch: the scores [M][C] f32; with TK_SPLIT > 1 the parts' candidates,
 * token indices [M][TK_SPLIT][topk] int32 then their scores f32; on the fp8
 * path the query in fragment order, hi and lo ([M][IHP][ID] bytes each),
 * then its exponents (int32 [M][IHP]). */
static size_t cand_offset(const kern_shape *s, int64_t m)
{
    return (size_t)round_up(m * s->v[D_C] * 4, 256);
}

static size_t cand_bytes(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    int split = tk_split(cfg);
    return split > 1 ? (size_t)round_up(m * split * s->v[D_TOPK] * 8, 256) : 0;
}

static size_t q8_offset(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    return cand_offset(s, m) + cand_bytes(s, m, cfg);
}

static size_t scratch_bytes(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    size_t n = q8_offset(s, m, cfg);
    if (is_fp8_path(cfg))
        n += (size_t)m * (size_t)round_up(s->v[D_IH], 16) * ((size_t)s->v[D_ID] * 2 + 4);
    return n;
}

static size_t score_shared(const kern_shape *s, int bt)
{
    return (size_t)bt * (size_t)s->v[D_ID] * 4 + (size_t)s->v[D_IH] * (size_t)s->v[D_ID] * 2 +
           (size_t)s->v[D_IH] * 4;
}

static mt_status run(const kern_ctx *c, mt_err *err)
{
    const kern_shape *s = c->shape;
    bool gpu = dev_backend_runs_hip_source(c->props->backend);
    dev_kernel *ks, *kt;
    mt_status st = attn_get_kernels(c, "dsa_scores", "pppppipppiif", &ks, "dsa_topk", "pippp",
                                    &kt, err);
    if (st != MT_OK)
        return st;
    int bt = param(c, "BT"), qb = param(c, "QB"), m = (int)c->m;
    int mp = (int)paged(s, c->m).max_pages, cs = (int)s->v[D_C];
    float wscale = (float)(1.0 / sqrt((double)s->v[D_IH] * (double)s->v[D_ID]));
    void *scores = c->scratch, *qin = c->bufs[B_Q];
    dev_dim3 sblock = {gpu ? (unsigned)(param(c, "WAVES") * c->props->warp_size) : 1, 1, 1};
    if (gpu && is_fp8_path(c->cfg)) { /* the query in two e4m3 parts first */
        dev_kernel *kq;
        if ((st = kern_get(c, "dsa_q8", "pp", &kq, err)) != MT_OK)
            return st;
        qin = (char *)c->scratch + q8_offset(s, c->m, c->cfg);
        void *qargs[] = {(void *)&c->bufs[B_Q], &qin};
        dev_dim3 qgrid = {(unsigned)round_up(s->v[D_IH], 16) / 16, (unsigned)m, 1};
        if ((st = dev_launch(c->dev, kq, qgrid, sblock, 0, qargs, err)) != MT_OK)
            return st;
    }
    void *sargs[] = {&qin, (void *)&c->bufs[B_W], (void *)&c->bufs[B_CACHE],
                     (void *)&c->bufs[B_KSCALE], (void *)&c->bufs[B_TABLE], &mp,
                     (void *)&c->bufs[B_QSEQ], (void *)&c->bufs[B_CTX], &scores, &cs, &m,
                     &wscale};
    dev_dim3 sgrid = {kern_cdiv(cs, bt), kern_cdiv(m, qb), 1};
    /* the MMA path's tiles are static shared memory; cpu launches take none */
    size_t shm = gpu && !param(c, "MMA") ? score_shared(s, bt) : 0;
    st = dev_launch(c->dev, ks, sgrid, sblock, shm, sargs, err);
    if (st != MT_OK)
        return st;
    dev_dim3 tblock = {gpu ? (unsigned)(param(c, "TK_WAVES") * c->props->warp_size) : 1, 1, 1};
    int split = gpu ? tk_split(c->cfg) : 1;
    if (split > 1) { /* the parts' candidates, then their merge */
        dev_kernel *kp, *km;
        st = attn_get_kernels(c, "dsa_topk_part", "pippp", &kp, "dsa_topk_merge", "ppppp", &km,
                              err);
        if (st != MT_OK)
            return st;
        void *cidx = (char *)c->scratch + cand_offset(s, c->m);
        void *cval = (char *)cidx + (size_t)c->m * (size_t)split * (size_t)s->v[D_TOPK] * 4;
        void *pargs[] = {&scores, &cs, (void *)&c->bufs[B_CTX], &cidx, &cval};
        st = dev_launch(c->dev, kp, (dev_dim3){(unsigned)split, (unsigned)m, 1}, tblock, 0,
                        pargs, err);
        if (st != MT_OK)
            return st;
        void *margs[] = {&cidx, &cval, (void *)&c->bufs[B_CTX], (void *)&c->bufs[B_IDX],
                         (void *)&c->bufs[B_VAL]};
        return dev_launch(c->dev, km, (dev_dim3){(unsigned)m, 1, 1}, tblock, 0, margs, err);
    }
    void *targs[] = {&scores, &cs, (void *)&c->bufs[B_CTX], (void *)&c->bufs[B_IDX],
                     (void *)&c->bufs[B_VAL]};
    dev_dim3 tgrid = {(unsigned)m, 1, 1};
    return dev_launch(c->dev, kt, tgrid, tblock, 0, targs, err);
}

/* Both implementations (the device's backend picks the side, as in run):
 * KV_FP8, then the threads of a score block (WAVES) and of a top-k block
 * (TK_WAVES): waves on GPUs, one on the cpu. */
static int defines(const kern_shape *s, const kern_config *cfg, const dev_props *p,
                   dev_define *out, char (*buf)[64], int cap)
{
    if (cap < 3)
        return 0;
    bool gpu = dev_backend_runs_hip_source(p->backend);
    int n = attn_define(out, buf, 0, "KV_FP8", s->v[D_KV] == KERN_DT_FP8E4M3);
    n = attn_define(out, buf, n, "NT", gpu ? cfg->v[2] * p->warp_size : 1);
    return attn_define(out, buf, n, "TK_NT", gpu ? cfg->v[3] * p->warp_size : 1);
}

/* ---- GPU ------------------------------------------------------------------------------- */

static const int bt_v[] = {16, 32, 64, 128};
static const int qb_v[] = {1, 2, 4, 8};
static const int waves_v[] = {1, 2, 4};
static const int tk_waves_v[] = {1, 2, 4, 8};
static const int mma_v[] = {0, 1, 2, 3};
static const int tk_split_v[] = {1, 2, 4, 8, 16};

/* Order matters: defines() reads WAVES third and TK_WAVES fourth,
 * is_fp8_path MMA fifth and tk_split TK_SPLIT sixth. */
enum { GP_BT, GP_QB, GP_WAVES, GP_TK_WAVES, GP_MMA, GP_TK_SPLIT, GP_COUNT };
static const kern_param_desc gpu_params[GP_COUNT] = {
    [GP_BT] = {"BT", bt_v, 4, "tokens per score block"},
    [GP_QB] = {"QB", qb_v, 4, "queries per score block (sharing a key tile)"},
    [GP_WAVES] = {"WAVES", waves_v, 3, "waves per score block"},
    [GP_TK_WAVES] = {"TK_WAVES", tk_waves_v, 4, "waves per top-k block"},
    [GP_MMA] = {"MMA", mma_v, 4, "scores: 0 scalar FP32; 1, 2 bf16 matrix instructions for Q "
                "K^T, the platform's small (16-row) or large (32x32x8, AMD) tile; 3 fp8 ones "
                "on the fp8 cache as it is (the query split exactly into two e4m3 parts)"},
    [GP_TK_SPLIT] = {"TK_SPLIT", tk_split_v, 5, "top-k blocks per query (each keeps the top-k "
                     "of its part of the scores, one more block merges them)"},
};

/* Static shared memory of the MMA path, as dsa_indexer.hip declares it: the
 * bf16 key tile [BT][IDP + pad] and the query [IHP][IDP + pad], heads and
 * dims rounded up to whole fragments, pad 4 (wave64) or 8 (wave32) bf16. */
static size_t gpu_mma_shared(const kern_shape *s, int bt, int tm, int tk, int ws)
{
    int64_t ld = round_up(s->v[D_ID], tk) + (ws == 64 ? 4 : 8);
    return (size_t)(bt + round_up(s->v[D_IH], tm)) * (size_t)ld * 2;
}

/* Static shared memory of the fp8 path: the e4m3 key tile [BT][ID + 16]
 * and one query's two parts in fragment order ([2][IHP][ID] bytes). */
static size_t gpu_fp8_shared(const kern_shape *s, int bt)
{
    size_t id = (size_t)s->v[D_ID];
    return (size_t)bt * (id + 16) + 2 * (size_t)round_up(s->v[D_IH], 16) * id;
}

/* The fp8 path's own rules (on top of the MMA path's): the fp8 cache, whole
 * K steps of 32, the key tile in static shared memory. */
static bool gpu_fp8_valid(const kern_shape *s, const kern_config *c, const dev_props *p,
                          char *why, size_t cap)
{
    if (s->v[D_KV] != KERN_DT_FP8E4M3) {
        snprintf(why, cap, "MMA=3 multiplies the fp8 key cache as it is (kv=%s)",
                 kern_dtype_name((kern_dtype)s->v[D_KV]));
        return false;
    }
    if (s->v[D_ID] % 32) {
        snprintf(why, cap, "MMA=3: ID=%lld is not whole K steps of 32", (long long)s->v[D_ID]);
        return false;
    }
    size_t sh = gpu_fp8_shared(s, c->v[GP_BT]);
    if (sh > p->static_shared_per_block) {
        snprintf(why, cap, "MMA=3: BT=%d needs %zu bytes of static shared memory, the device "
                 "allows %zu", c->v[GP_BT], sh, p->static_shared_per_block);
        return false;
    }
    return true;
}

/* The MMA path's rules: whole fragment columns of keys per wave, the
 * query's fragments held in registers, the tiles in static shared memory. */
static bool gpu_mma_valid(const kern_shape *s, const kern_config *c, const dev_props *p,
                          char *why, size_t cap)
{
    int mma = c->v[GP_MMA], bt = c->v[GP_BT], waves = c->v[GP_WAVES];
    int tm, tn, tk;
    if (!attn_mma_tile(p, mma, &tm, &tn, &tk, why, cap))
        return false;
    if (mma == 3) {
        if (bt % tn || bt / tn < waves) {
            snprintf(why, cap, "MMA=3: BT=%d keys are not whole %d-key fragment columns for "
                     "each of WAVES=%d waves", bt, tn, waves);
            return false;
        }
        return gpu_fp8_valid(s, c, p, why, cap);
    }
    if (bt % tn || bt / tn < waves) {
        snprintf(why, cap, "MMA=%d: BT=%d keys are not whole %d-key fragment columns for "
                 "each of WAVES=%d waves", mma, bt, tn, waves);
        return false;
    }
    /* A fragments: IHP x IDP bf16 over the wave, 2 per 32-bit register */
    int64_t aregs = round_up(s->v[D_IH], tm) * round_up(s->v[D_ID], tk) / (2 * p->warp_size);
    if (aregs > 64) {
        snprintf(why, cap, "MMA=%d: the query's fragments take %lld registers per lane "
                 "(IH x ID bf16 over a wave, at most 64)", mma, (long long)aregs);
        return false;
    }
    size_t sh = gpu_mma_shared(s, bt, tm, tk, p->warp_size);
    if (sh > p->static_shared_per_block) {
        snprintf(why, cap, "MMA=%d: BT=%d needs %zu bytes of static shared memory, the "
                 "device allows %zu", mma, bt, sh, p->static_shared_per_block);
        return false;
    }
    return true;
}

static bool gpu_valid(const kern_shape *s, int64_t m, const kern_config *c,
                      const dev_props *p, char *why, size_t cap)
{
    (void)m;
    int bt = c->v[0], nt = c->v[2] * p->warp_size, tk = c->v[3] * p->warp_size;
    if (nt > p->max_threads_per_block || tk > p->max_threads_per_block) {
        snprintf(why, cap, "%d/%d threads exceed the device's %d", nt, tk,
                 p->max_threads_per_block);
        return false;
    }
    size_t tshm = ((size_t)tk + 260) * 4;
    if (tshm > p->shared_mem_per_block) {
        snprintf(why, cap, "TK_WAVES=%d needs %zu bytes of shared memory, the device has %zu",
                 c->v[GP_TK_WAVES], tshm, p->shared_mem_per_block);
        return false;
    }
    if (c->v[GP_MMA])
        return gpu_mma_valid(s, c, p, why, cap);
    if (bt > nt) {
        snprintf(why, cap, "BT=%d exceeds the %d threads (one token per thread)", bt, nt);
        return false;
    }
    return attn_shared_ok(score_shared(s, bt), p, why, cap);
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    c->n = GP_COUNT;
    c->v[GP_MMA] = 0;
    c->v[GP_TK_SPLIT] = 1;
    c->v[0] = 64;
    c->v[1] = m >= 4 ? 4 : 1;
    c->v[2] = 64 / p->warp_size > 1 ? 64 / p->warp_size : 1;
    c->v[3] = 4;
    char why[128];
    while (!gpu_valid(s, m, c, p, why, sizeof why)) {
        if (c->v[0] > c->v[2] * p->warp_size || c->v[0] > 16)
            c->v[0] /= 2;
        else if (c->v[3] > 1)
            c->v[3] /= 2;
        else
            break;
    }
    /* Matrix instructions where the device has them (kern_mma_tile): the
     * first of these score tiles it takes (the top-k waves and queries per
     * block as above), else the scalar config. */
    static const int set[] = {GP_BT, GP_WAVES};
    static const int mma_tiles[][2] = {{64, 4}, {64, 2}, {32, 2}, {16, 1}};
    attn_mma_pick(s, m, p, gpu_valid, c, GP_MMA, set, 2, mma_tiles[0],
                  (int)(sizeof mma_tiles / sizeof mma_tiles[0]), c);
    /* An fp8 cache on fp8 instructions where the device has them: the
     * tile of the bf16 path, with the key tile half the bytes. */
    if (s->v[D_KV] == KERN_DT_FP8E4M3 && c->v[GP_MMA]) {
        kern_config f = *c;
        f.v[GP_MMA] = 3;
        static const int fp8_tiles[][2] = {{64, 4}, {128, 4}, {64, 2}, {32, 2}, {16, 1}};
        for (size_t i = 0; i < sizeof fp8_tiles / sizeof fp8_tiles[0]; i++) {
            f.v[GP_BT] = fp8_tiles[i][0];
            f.v[GP_WAVES] = fp8_tiles[i][1];
            if (gpu_valid(s, m, &f, p, why, sizeof why)) {
                *c = f;
                break;
            }
        }
    }
    /* The top-k over parts of each query where the queries alone give fewer
     * blocks than twice the compute units, each part at least 4 top-k
     * long (below, the merge's own top-k costs as much as a part's). */
    int64_t topk = s->v[D_TOPK];
    while (c->v[GP_TK_SPLIT] < 16 && m * c->v[GP_TK_SPLIT] < 2 * (int64_t)p->compute_units &&
           s->v[D_C] / (2 * c->v[GP_TK_SPLIT]) >= 4 * topk)
        c->v[GP_TK_SPLIT] *= 2;
}

static const kern_impl gpu_impl = {
    .source = "dsa_indexer.hip",
    .params = gpu_params,
    .n_params = GP_COUNT,
    .valid = gpu_valid,
    .default_config = gpu_default,
    .defines = defines,
    .scratch_bytes = scratch_bytes,
    .run = run,
};

/* ---- CPU -------------------------------------------------------------------------------- */

static const int cpu_bt_v[] = {16, 64, 256, 1024};
static const int cpu_one_v[] = {1};
static const kern_param_desc cpu_params[] = {
    {"BT", cpu_bt_v, 4, "tokens per score work item"},
    {"QB", qb_v, 4, "queries per score work item (sharing decoded keys)"},
    {"WAVES", cpu_one_v, 1, "unused on cpu"},
    {"TK_WAVES", cpu_one_v, 1, "unused on cpu"},
};

/* The longest token tile that still gives every thread two work items:
 * each item transposes its query and starts its key stream cold, so fewer,
 * longer items are faster (8192 keys, one query, 2 threads: BT 1024 took
 * 0.12 ms, 256 0.13-0.15, 64 0.19). */
static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    c->n = 4;
    c->v[1] = m >= 8 ? 8 : m >= 4 ? 4 : 1;
    int64_t qtiles = (m + c->v[1] - 1) / c->v[1];
    int64_t want = 2 * (p->compute_units > 0 ? p->compute_units : 1);
    c->v[0] = 64;
    for (int i = 3; i >= 2; i--)
        if ((s->v[D_C] + cpu_bt_v[i] - 1) / cpu_bt_v[i] * qtiles >= want) {
            c->v[0] = cpu_bt_v[i];
            break;
        }
    c->v[2] = 1;
    c->v[3] = 1;
}

static const kern_impl cpu_impl = {
    .source = "dsa_indexer.cpu",
    .params = cpu_params,
    .n_params = 4,
    .default_config = cpu_default,
    .defines = defines,
    .scratch_bytes = scratch_bytes,
    .run = run,
};

static const kern_case cases[] = {
    {"tiny", 1},
    {"tiny", 4},
    {"IH=2,ID=32,topk=16,ps=5,kv=fp8,C=11", 3},     /* shorter than topk */
    {"IH=3,ID=24,topk=16,ps=7,kv=bf16,C=16", 2},    /* exactly topk, then shorter */
    {"IH=2,ID=32,topk=5,ps=3,kv=fp8,C=300", 2},
    {"IH=4,ID=16,topk=40,ps=16,kv=bf16,C=203", 5},
    {"IH=32,ID=128,topk=64,ps=64,kv=fp8,C=150", 1}, /* glm5.2 widths */
    {"IH=32,ID=128,topk=64,ps=64,kv=bf16,C=150", 2}, /* keys read in place (cpu) */
    {"IH=16,ID=32,topk=24,ps=8,kv=bf16,C=77", 3},    /* in place, one head vector */
};

const kern_family fam_dsa_indexer = {
    .name = "dsa_indexer",
    /* 2: the GPU side's MMA parameter; 3: MMA=3 (fp8); 4: its query
     * pre-pass; 5: the GPU top-k's chunked compaction; 6: TK_SPLIT */
    .version = 6,
    .summary = "DSA lightning-indexer scores over the paged key cache and per-query top-k",
    .dims = dims,
    .n_dims = D_COUNT,
    .presets = presets,
    .n_presets = sizeof presets / sizeof presets[0],
    .gpu = &gpu_impl,
    .cpu = &cpu_impl,
    .shape_ok = shape_ok,
    .buffers = buffers,
    .fill = fill,
    .reference = reference,
    .compare = compare,
    .cost = cost,
    .cases = cases,
    .n_cases = sizeof cases / sizeof cases[0],
};
