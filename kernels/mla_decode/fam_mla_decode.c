/* fam_mla_decode.c: the `mla_decode` family: absorbed multi-head latent
 * attention (GLM-5.2 / DeepSeek MLA) of M query tokens over the paged latent
 * cache (L latent + R rope values per token, shared by every head), dense
 * or restricted to a per-query list of selected tokens (DSA).
 *
 * Query m, head h: q_abs = [W_UK^T q_nope | q_rope] (L + R values, the
 * absorption is the caller's batched GEMM), score(t) = scale * q_abs .
 * cache[t], o = softmax-weighted sum of cache[t][0:L] (f32 [M][H][L]; the
 * caller applies W_UV). The context is cut into NSPLIT pieces, each block
 * keeps an online softmax over its piece and writes (partial o, max, sum);
 * a reduce launch combines the pieces.
 *
 * Queries are independent: each has its own context length (tokens 0 ..
 * ctx_len-1 are visible) and page-table row (qseq), so one call serves a
 * batch of sequences, the draft tokens of speculative decoding, or a
 * prefill chunk over a context longer than index_topk (sparse). In sparse
 * mode a query attends the entries of sel[m][0:topk] that lie inside
 * [0, ctx_len[m]); -1 (or any other out-of-range entry) is ignored. A
 * query with no visible token outputs zeros.
 *
 * Page table: rows of ceil(C / ps) page ids, C the runtime dim (at least
 * every query's ctx_len); qseq[m] names query m's row.
 *
 * scale is (D + R)^-0.5 unless the runtime dim sm carries another as float32
 * bits (a YaRN checkpoint's mscale^2 correction, model/config.h); the
 * kernels take it as an argument, so it costs no compile. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/attn/attn_common.h"
#include "kernels/attn/attn_mma.h"
#include "kernels/core/family.h"

/* C stays last (tests set it by index). */
enum { D_H, D_L, D_R, D_D, D_TOPK, D_PS, D_KV, D_SPARSE, D_SM, D_C, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_H] = {"H", KERN_DIM_INT, false, 1, 256, "attention heads"},
    [D_L] = {"L", KERN_DIM_INT, false, 1, 2048, "latent dims (kv_lora_rank)"},
    [D_R] = {"R", KERN_DIM_INT, false, 0, 256, "rope dims per token"},
    [D_D] = {"D", KERN_DIM_INT, false, 1, 1024, "nope dims per head (sets the softmax scale)"},
    [D_TOPK] = {"topk", KERN_DIM_INT, false, 1, 65536, "selected tokens per query (sparse)"},
    [D_PS] = {"ps", KERN_DIM_INT, false, 1, 4096, "tokens per cache page"},
    [D_KV] = {"kv", KERN_DIM_DTYPE, false, 0, 0, "cache element type: bf16 or fp8"},
    [D_SPARSE] = {"sparse", KERN_DIM_INT, false, 0, 1, "1: attend only the selected tokens"},
    [D_SM] = {"sm", KERN_DIM_INT, true, 0, 0x7F7FFFFF,
              "softmax scale as float32 bits; 0: (D+R)^-0.5 (YaRN's mscale^2 needs another)"},
    [D_C] = {"C", KERN_DIM_INT, true, 1, 1 << 22, "context length of the last query"},
};

static const kern_preset presets[] = {
    {"glm5.2", "H=64,L=512,R=64,D=192,topk=2048,ps=64,kv=bf16,sparse=1,sm=0,C=4096"},
    {"tiny", "H=4,L=32,R=16,D=32,topk=16,ps=16,kv=bf16,sparse=1,sm=0,C=40"},
    {"glm5.2-dense", "H=64,L=512,R=64,D=192,topk=2048,ps=64,kv=bf16,sparse=0,sm=0,C=4096"},
    {"glm5.2-fp8", "H=64,L=512,R=64,D=192,topk=2048,ps=64,kv=fp8,sparse=1,sm=0,C=4096"},
    {"tiny-dense", "H=4,L=32,R=16,D=32,topk=16,ps=16,kv=bf16,sparse=0,sm=0,C=40"},
};

/* ---- problem layout (shared by fill, reference, cost and run) ----------- */

static int64_t width(const kern_shape *s) { return s->v[D_L] + s->v[D_R]; }
/* Two queries share a page-table row: the fill's model of draft tokens. */
static attn_paged paged(const kern_shape *s, int64_t m)
{
    return attn_paged_of(m, s->v[D_C], s->v[D_PS]);
}
static float kscale_of(const kern_shape *s)
{
    return s->v[D_KV] == KERN_DT_FP8E4M3 ? 0.375f : 1.0f;
}
/* The scale the kernels multiply q . k by (attn_softmax_scale). */
static float softmax_scale(const kern_shape *s)
{
    return attn_softmax_scale(s->v[D_SM], s->v[D_D], s->v[D_R]);
}

enum { B_Q, B_CACHE, B_KSCALE, B_TABLE, B_QSEQ, B_CTX, B_SEL, B_OUT, B_COUNT };

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    (void)m;
    return attn_kv_shape_ok(s->v[D_KV], why, cap);
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return -1;
    size_t w = (size_t)width(s), h = (size_t)s->v[D_H], l = (size_t)s->v[D_L];
    size_t um = (size_t)m;
    attn_paged g = paged(s, m);
    out[B_Q] = (kern_buf_desc){"q", KERN_BUF_IN, KERN_DT_BF16, um * h * w * 2, 0, 0, 0};
    attn_cache_bufs(out + B_CACHE, "cache", (kern_dtype)s->v[D_KV],
                    (size_t)g.n_pages * (size_t)s->v[D_PS] * w, (size_t)(g.n_seq * g.max_pages));
    attn_query_bufs(out + B_QSEQ, m);
    out[B_SEL] = (kern_buf_desc){"sel", KERN_BUF_IN, KERN_DT_I32,
                                 s->v[D_SPARSE] ? um * (size_t)s->v[D_TOPK] * 4 : 4, 0, 0, 0};
    /* f32 out of f32 accumulation: the tolerance covers exp and summation
     * order, far below what a wrong or missing token changes. */
    out[B_OUT] = (kern_buf_desc){"o", KERN_BUF_OUT, KERN_DT_F32, um * h * l * 4,
                                 (int64_t)l, 2e-4, 2e-3};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    size_t w = (size_t)width(s), h = (size_t)s->v[D_H];
    kern_dtype kv = (kern_dtype)s->v[D_KV];
    float ks = kscale_of(s);
    attn_paged g = paged(s, m);
    /* Scores with a spread of a few units: softmax is peaked enough that a
     * wrong token shows. */
    attn_fill_bf16(&r, host[B_Q], (size_t)m * h * w, 1.5f);
    attn_fill_pool(&r, host[B_CACHE], kv, (size_t)g.n_pages * (size_t)s->v[D_PS] * w, 1.0f, ks);
    *(float *)host[B_KSCALE] = ks;
    attn_fill_table(&r, host[B_TABLE], g.n_seq, g.max_pages, g.n_pages);
    int32_t *ctx = host[B_CTX], *sel = host[B_SEL];
    attn_fill_queries(host[B_QSEQ], ctx, m, s->v[D_C]);
    if (!s->v[D_SPARSE]) {
        sel[0] = 0;
        return;
    }
    int64_t k = s->v[D_TOPK];
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)s->v[D_C]);
    for (int64_t i = 0; i < m; i++) {
        int64_t len = ctx[i], n = len < k ? len : k;
        for (int64_t t = 0; t < len; t++)
            perm[t] = (int32_t)t;
        int32_t *row = sel + i * k;
        /* Empty slots: mostly -1, some past the context (also ignored). */
        for (int64_t j = 0; j < k; j++)
            row[j] = mt_rng_below(&r, 4) ? -1 : (int32_t)(len + (int64_t)mt_rng_below(&r, 8));
        /* n distinct positions into random slots. */
        int32_t *slots = malloc(sizeof(int32_t) * (size_t)k);
        for (int64_t j = 0; j < k; j++)
            slots[j] = (int32_t)j;
        for (int64_t j = 0; j < n; j++) {
            int64_t a = j + (int64_t)mt_rng_below(&r, (uint64_t)(len - j));
            int32_t t = perm[j];
            perm[j] = perm[a];
            perm[a] = t;
            int64_t b = j + (int64_t)mt_rng_below(&r, (uint64_t)(k - j));
            int32_t u = slots[j];
            slots[j] = slots[b];
            slots[b] = u;
            row[slots[j]] = perm[j];
        }
        free(slots);
    }
    free(perm);
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    attn_decode_args a = {
        .m = m, .h = s->v[D_H], .l = s->v[D_L], .r = s->v[D_R],
        .scale = s->v[D_SM] ? (double)softmax_scale(s)
                            : 1.0 / sqrt((double)(s->v[D_D] + s->v[D_R])),
        .q = host[B_Q], .pool = host[B_CACHE], .kv = (kern_dtype)s->v[D_KV],
        .kscale = *(const float *)host[B_KSCALE], .ps = s->v[D_PS], .table = host[B_TABLE],
        .max_pages = paged(s, m).max_pages, .qseq = host[B_QSEQ], .ctx_len = host[B_CTX],
        .sel = s->v[D_SPARSE] ? host[B_SEL] : NULL, .topk = s->v[D_TOPK], .out = host[B_OUT],
    };
    attn_ref_decode(&a);
}

/* Flops: per visible token and head, L + R multiply-adds for the score and
 * L for the weighted sum. Minimum bytes: every distinct cache row once per
 * page-table row (dense) or once per query (sparse: overlaps are unknown),
 * plus q, out, tables and lists. */
static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    double w = (double)width(s), h = (double)s->v[D_H], l = (double)s->v[D_L];
    double es = (double)attn_kv_esize((kern_dtype)s->v[D_KV]);
    double toks = 0, rows = 0;
    for (int64_t i = 0; i < m; i++) {
        int64_t len = attn_ctx_of(s->v[D_C], m, i);
        double n = s->v[D_SPARSE] && len > s->v[D_TOPK] ? (double)s->v[D_TOPK] : (double)len;
        toks += n;
        /* The last query of a shared row sees the most. */
        rows += s->v[D_SPARSE] ? n : (attn_last_of_row(m, i) ? n : 0);
    }
    attn_paged g = paged(s, m);
    *flops = 2.0 * h * toks * (w + l);
    *bytes = rows * w * es + (double)m * h * (2.0 * w + 4.0 * l) +
             (s->v[D_SPARSE] ? (double)m * (double)s->v[D_TOPK] * 4.0 : 0.0) +
             (double)(g.n_seq * g.max_pages) * 4.0;
}

/* ---- run (same launches on GPU and CPU) ---------------------------------------- */

static int param(const kern_ctx *c, const char *name)
{
    return kern_config_get(c->impl, c->cfg, name, 1);
}

/* The fp8 path's query in fragment order (hi and lo, [M][H][W] bytes each)
 * and its exponents (int32 [M][H]), after the partials. */
static size_t q8_offset(const kern_shape *s, int64_t m, int nsplit)
{
    size_t part = (size_t)m * (size_t)s->v[D_H] * (size_t)nsplit * (size_t)(s->v[D_L] + 2) * 4;
    return (part + 255) / 256 * 256;
}

static bool is_fp8_path(const kern_config *cfg)
{
    return cfg->n == 5 && cfg->v[3] == 3; /* the GPU side's MMA=3 */
}

static size_t scratch_bytes(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    /* NSPLIT is the last parameter of both implementations. */
    int nsplit = cfg->v[cfg->n - 1];
    if (is_fp8_path(cfg))
        return q8_offset(s, m, nsplit) +
               (size_t)m * (size_t)s->v[D_H] * ((size_t)width(s) * 2 + 4);
    return (size_t)m * (size_t)s->v[D_H] * (size_t)nsplit * (size_t)(s->v[D_L] + 2) * 4;
}

static size_t gpu_shared(const kern_shape *s, int hb, int bn)
{
    size_t w = (size_t)width(s), es = attn_kv_esize((kern_dtype)s->v[D_KV]);
    return ((size_t)hb * (size_t)bn + 3 * (size_t)hb + (size_t)bn) * 4 + (size_t)hb * w * 2 +
           (size_t)bn * w * es;
}

static mt_status run(const kern_ctx *c, mt_err *err)
{
    const kern_shape *s = c->shape;
    bool gpu = dev_backend_runs_hip_source(c->props->backend);
    dev_kernel *ks, *kr;
    mt_status st = attn_get_kernels(c, "mla_decode_split", "ppppippppf", &ks, "mla_decode_reduce",
                                    "pp", &kr, err);
    if (st != MT_OK)
        return st;
    int hb = param(c, "HB"), nsplit = param(c, "NSPLIT");
    unsigned nt = gpu ? (unsigned)(param(c, "WAVES") * c->props->warp_size) : 1;
    int mp = (int)paged(s, c->m).max_pages;
    float scale = softmax_scale(s);
    void *part = c->scratch, *qin = c->bufs[B_Q];
    if (gpu && is_fp8_path(c->cfg)) { /* the query in two e4m3 parts first */
        dev_kernel *kq;
        if ((st = kern_get(c, "mla_q8", "pp", &kq, err)) != MT_OK)
            return st;
        qin = (char *)c->scratch + q8_offset(s, c->m, nsplit);
        void *qargs[] = {(void *)&c->bufs[B_Q], &qin};
        st = dev_launch(c->dev, kq, (dev_dim3){(unsigned)(s->v[D_H] / 16), (unsigned)c->m, 1},
                        (dev_dim3){nt, 1, 1}, 0, qargs, err);
        if (st != MT_OK)
            return st;
    }
    void *args[] = {&qin, (void *)&c->bufs[B_CACHE],
                    (void *)&c->bufs[B_KSCALE], (void *)&c->bufs[B_TABLE], &mp,
                    (void *)&c->bufs[B_QSEQ], (void *)&c->bufs[B_CTX],
                    (void *)&c->bufs[B_SEL], &part, &scale};
    dev_dim3 grid = {(unsigned)nsplit, (unsigned)(s->v[D_H] / hb), (unsigned)c->m};
    dev_dim3 block = {nt, 1, 1};
    size_t shm = 0;
    if (gpu && !param(c, "MMA")) { /* the MMA path's tiles are static */
        shm = gpu_shared(s, hb, param(c, "BN"));
    }
    st = dev_launch(c->dev, ks, grid, block, shm, args, err);
    if (st != MT_OK)
        return st;
    void *rargs[] = {&part, (void *)&c->bufs[B_OUT]};
    dev_dim3 rgrid = {(unsigned)s->v[D_H], (unsigned)c->m, 1};
    return dev_launch(c->dev, kr, rgrid, block, 0, rargs, err);
}

/* Both implementations (the device's backend picks the side, as in run):
 * attn_mla_defines over HB heads x L values a block; WAVES waves a block
 * on GPUs, one thread a work item on the cpu. */
static int defines(const kern_shape *s, const kern_config *cfg, const dev_props *p,
                   dev_define *out, char (*buf)[64], int cap)
{
    if (cap < 3)
        return 0;
    int nt = dev_backend_runs_hip_source(p->backend) ? cfg->v[2] * p->warp_size : 1;
    return attn_mla_defines(out, buf, (kern_dtype)s->v[D_KV], nt, cfg->v[0] * s->v[D_L]);
}

/* ---- GPU implementation ---------------------------------------------------------- */

static const int hb_v[] = {1, 2, 4, 8, 16, 32, 64};
static const int bn_v[] = {8, 16, 32, 64};
static const int waves_v[] = {1, 2, 4, 8};
static const int split_v[] = {1, 2, 4, 8, 16, 32, 64};
static const int mma_v[] = {0, 1, 2, 3};

/* Order matters: HB first, WAVES third and NSPLIT last (defines and
 * scratch_bytes). */
enum { GP_HB, GP_BN, GP_WAVES, GP_MMA, GP_NSPLIT, GP_COUNT };
static const kern_param_desc gpu_params[GP_COUNT] = {
    [GP_HB] = {"HB", hb_v, 7, "heads per block (they share each loaded cache row)"},
    [GP_BN] = {"BN", bn_v, 4, "tokens per tile"},
    [GP_WAVES] = {"WAVES", waves_v, 4, "waves per block"},
    [GP_MMA] = {"MMA", mma_v, 4, "0 scalar FP32; 1, 2 bf16 matrix instructions for QK^T and "
                "PV, the platform's small (16-row) or large (32x32x8, AMD) tile; 3 fp8 ones "
                "on the fp8 cache as it is (BN 32, the query in two e4m3 parts, P in three)"},
    [GP_NSPLIT] = {"NSPLIT", split_v, 7, "pieces of the context per query (reduced after)"},
};

/* Static shared memory of the MMA path, as mla_decode.hip declares it: the
 * bf16 tile [BN][W + pad], P [2][HB][BN + pad] bf16, S [HB][BN + 1] f32, three
 * per-head floats and BN slots; pad 4 (wave64) or 8 (wave32) bf16. */
static size_t gpu_mma_shared(const kern_shape *s, int hb, int bn, int ws)
{
    size_t w = (size_t)width(s), pad = ws == 64 ? 4 : 8;
    return (size_t)bn * (w + pad) * 2 + (size_t)hb * ((size_t)bn + pad) * 4 +
           (size_t)hb * ((size_t)bn + 1) * 4 + 3 * (size_t)hb * 4 + (size_t)bn * 4;
}

/* The MMA path's rules (attn_mma_valid): fragments tile the HB x BN
 * scores (K = L + R) and the HB x L output, whose fragments the waves
 * split (L first, then heads) and keep in registers across the context;
 * the tiles are static shared memory. */
static bool gpu_mma_valid(const kern_shape *s, const kern_config *c, const dev_props *p,
                          char *why, size_t cap)
{
    int hb = c->v[GP_HB], bn = c->v[GP_BN];
    attn_mma_tiling t = {
        .mma = c->v[GP_MMA], .waves = c->v[GP_WAVES], .rows_name = "HB", .rows_noun = "heads",
        .rows = hb, .bn_noun = "tokens", .bn = bn, .n_k = 1, .k_name = {"L+R"},
        .k = {width(s)}, .out_name = "L", .out = s->v[D_L],
        .shared = gpu_mma_shared(s, hb, bn, p->warp_size), .static_shared = true,
    };
    return attn_mma_valid(&t, p, why, cap);
}

/* Static shared memory of the fp8 path, as mla_decode.hip declares it:
 * the tile [BN][W + 16] and its latent part transposed [L][BN + pad] (pad
 * 16 on wave64, 0 on wave32) in bytes, P's three parts [3][HB][BN + 16],
 * S [HB][BN + 1] f32, three per-head floats and two rows of BN slots. */
static size_t gpu_fp8_shared(const kern_shape *s, int hb, int bn, int ws)
{
    size_t w = (size_t)width(s), l = (size_t)s->v[D_L], vpad = ws == 64 ? 16 : 0;
    return (size_t)bn * (w + 16) + l * ((size_t)bn + vpad) + 3 * (size_t)hb * ((size_t)bn + 16) +
           (size_t)hb * ((size_t)bn + 1) * 4 + 3 * (size_t)hb * 4 + 2 * (size_t)bn * 4;
}

/* The fp8 path's rules: the fp8 cache; BN one K step of 32 tokens; L + R
 * and L whole K steps, HB whole 16-row fragments; the waves split the HB x
 * L output (L first) into at most 128 accumulator registers a lane; the
 * tiles in static shared memory. */
static bool gpu_fp8_valid(const kern_shape *s, const kern_config *c, const dev_props *p,
                          char *why, size_t cap)
{
    int hb = c->v[GP_HB], bn = c->v[GP_BN], waves = c->v[GP_WAVES];
    int tm, tn, tk;
    if (!attn_mma_tile(p, 3, &tm, &tn, &tk, why, cap))
        return false;
    if (s->v[D_KV] != KERN_DT_FP8E4M3) {
        snprintf(why, cap, "MMA=3 multiplies the fp8 cache as it is (kv=%s)",
                 kern_dtype_name((kern_dtype)s->v[D_KV]));
        return false;
    }
    int64_t l = s->v[D_L];
    if (bn != 32 || width(s) % 32 || l % 32 || hb % 16) {
        snprintf(why, cap, "MMA=3: BN=%d must be 32 (one K step of tokens), L+R=%lld and "
                 "L=%lld whole K steps of 32, HB=%d whole 16-head fragments", bn,
                 (long long)width(s), (long long)l, hb);
        return false;
    }
    int64_t cols = l / tn;
    int wn = cols < waves ? (int)cols : waves, wm = waves / wn;
    if (waves % wn || cols % wn || hb % (wm * 16)) {
        snprintf(why, cap, "MMA=3: WAVES=%d waves do not tile the HB=%d x L=%lld output", waves,
                 hb, (long long)l);
        return false;
    }
    int64_t regs = (int64_t)(hb / (wm * 16)) * (cols / wn) * 4;
    if (regs > 128) {
        snprintf(why, cap, "MMA=3: %lld accumulator registers a lane (at most 128): more WAVES "
                 "or a smaller HB", (long long)regs);
        return false;
    }
    size_t sh = gpu_fp8_shared(s, hb, bn, p->warp_size);
    if (sh > p->static_shared_per_block) {
        snprintf(why, cap, "MMA=3: HB=%d needs %zu bytes of static shared memory, the device "
                 "allows %zu", hb, sh, p->static_shared_per_block);
        return false;
    }
    return true;
}

static bool gpu_valid(const kern_shape *s, int64_t m, const kern_config *c,
                      const dev_props *p, char *why, size_t cap)
{
    (void)m;
    int hb = c->v[0], bn = c->v[1], nt = c->v[2] * p->warp_size;
    if (s->v[D_H] % hb) {
        snprintf(why, cap, "HB=%d does not divide H=%lld", hb, (long long)s->v[D_H]);
        return false;
    }
    if (nt > p->max_threads_per_block) {
        snprintf(why, cap, "%d threads exceed the device's %d", nt, p->max_threads_per_block);
        return false;
    }
    if (bn > nt || hb > nt) {
        snprintf(why, cap, "BN=%d and HB=%d must not exceed the %d threads", bn, hb, nt);
        return false;
    }
    if (c->v[GP_MMA] == 3)
        return gpu_fp8_valid(s, c, p, why, cap);
    if (c->v[GP_MMA])
        return gpu_mma_valid(s, c, p, why, cap);
    return attn_scalar_valid(hb * s->v[D_L], nt, "HB*L", gpu_shared(s, hb, bn), p, why, cap);
}

static int pick_split(const kern_shape *s, int64_t m, int blocks_per_split, int target)
{
    int64_t items = s->v[D_SPARSE] && s->v[D_TOPK] < s->v[D_C] ? s->v[D_TOPK] : s->v[D_C];
    int split = 1;
    while (split < 64 && (int64_t)blocks_per_split * m * split < target &&
           items / (split * 2) >= 64)
        split *= 2;
    return split;
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    c->n = GP_COUNT;
    c->v[GP_MMA] = 0;
    c->v[2] = p->max_threads_per_block >= 4 * p->warp_size ? 4 : 1;
    c->v[0] = 16;
    while (c->v[0] > 1 && s->v[D_H] % c->v[0])
        c->v[0] /= 2;
    c->v[1] = 16;
    char why[128];
    /* Shrink until it fits the device (smaller tiles, fewer heads). */
    while (!gpu_valid(s, m, c, p, why, sizeof why)) {
        if (c->v[1] > 8)
            c->v[1] /= 2;
        else if (c->v[0] > 1)
            c->v[0] /= 2;
        else if (c->v[2] > 1)
            c->v[2] /= 2;
        else
            break;
    }
    /* Matrix instructions where the device has them (kern_mma_tile): the
     * first of these tiles it takes, else the scalar config above. */
    static const int set[] = {GP_HB, GP_BN, GP_WAVES};
    static const int mma_tiles[][3] = {
        {64, 32, 4}, {64, 16, 8}, {32, 32, 4}, {32, 16, 4}, {16, 16, 4}, {16, 16, 2}, {16, 16, 1},
    };
    attn_mma_pick(s, m, p, gpu_valid, c, GP_MMA, set, 3, mma_tiles[0],
                  (int)(sizeof mma_tiles / sizeof mma_tiles[0]), c);
    /* An fp8 cache on fp8 instructions where the device has them: 8 waves
     * (2 a SIMD: the 64-head tile takes most of a CU's 64 KB), 32 heads
     * where static shared memory is 48 KB (NVIDIA). */
    if (s->v[D_KV] == KERN_DT_FP8E4M3) {
        static const int fp8_tiles[][3] = {{64, 32, 8}, {32, 32, 8}, {32, 32, 4}, {16, 32, 4},
                                           {16, 32, 2}};
        kern_config f = *c;
        f.v[GP_MMA] = 3;
        for (size_t i = 0; i < sizeof fp8_tiles / sizeof fp8_tiles[0]; i++) {
            f.v[GP_HB] = fp8_tiles[i][0];
            f.v[GP_BN] = fp8_tiles[i][1];
            f.v[GP_WAVES] = fp8_tiles[i][2];
            if (gpu_valid(s, m, &f, p, why, sizeof why)) {
                *c = f;
                break;
            }
        }
    }
    c->v[GP_NSPLIT] = pick_split(s, m, (int)(s->v[D_H] / c->v[0]), 2 * p->compute_units);
}

static const kern_impl gpu_impl = {
    .source = "mla_decode.hip",
    .params = gpu_params,
    .n_params = GP_COUNT,
    .valid = gpu_valid,
    .default_config = gpu_default,
    .defines = defines,
    .scratch_bytes = scratch_bytes,
    .run = run,
};

/* ---- CPU implementation -------------------------------------------------------------- */

static const int cpu_bn_v[] = {8, 16, 32, 64};
static const int cpu_one_v[] = {1};
static const kern_param_desc cpu_params[] = {
    {"HB", hb_v, 7, "heads per work item (they share each decoded cache row)"},
    {"BN", cpu_bn_v, 4, "tokens per tile"},
    {"WAVES", cpu_one_v, 1, "unused on cpu (keeps the parameter order of the GPU side)"},
    {"NSPLIT", split_v, 7, "pieces of the context per query (reduced after)"},
};

static bool cpu_valid(const kern_shape *s, int64_t m, const kern_config *c,
                      const dev_props *p, char *why, size_t cap)
{
    (void)m;
    (void)p;
    if (s->v[D_H] % c->v[0]) {
        snprintf(why, cap, "HB=%d does not divide H=%lld", c->v[0], (long long)s->v[D_H]);
        return false;
    }
    return true;
}

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    c->n = 4;
    c->v[0] = 64;
    while (c->v[0] > 1 && s->v[D_H] % c->v[0])
        c->v[0] /= 2;
    c->v[1] = 32;
    c->v[2] = 1;
    c->v[3] = pick_split(s, m, (int)(s->v[D_H] / c->v[0]), 2 * p->compute_units);
}

static const kern_impl cpu_impl = {
    .source = "mla_decode.cpu",
    .params = cpu_params,
    .n_params = 4,
    .valid = cpu_valid,
    .default_config = cpu_default,
    .defines = defines,
    .scratch_bytes = scratch_bytes,
    .run = run,
};

static const kern_case cases[] = {
    {"tiny", 1},
    {"tiny", 3},
    {"tiny-dense", 2},
    {"H=4,L=32,R=16,D=32,topk=16,ps=5,kv=fp8,sparse=1,C=11", 2},   /* shorter than topk */
    {"H=4,L=32,R=16,D=32,topk=16,ps=7,kv=fp8,sparse=0,C=37", 1},
    {"H=2,L=40,R=8,D=24,topk=8,ps=3,kv=bf16,sparse=1,C=29", 3},
    {"H=8,L=64,R=16,D=48,topk=24,ps=16,kv=bf16,sparse=1,C=70", 2},
    {"H=8,L=512,R=64,D=192,topk=32,ps=64,kv=fp8,sparse=1,C=45", 1}, /* glm5.2 widths */
    {"H=8,L=512,R=64,D=192,topk=32,ps=64,kv=bf16,sparse=0,C=21", 2},
    /* 16 heads of glm5.2's widths: the fp8 path's smallest head tile */
    {"H=16,L=512,R=64,D=192,topk=48,ps=64,kv=fp8,sparse=1,C=75", 2},
    {"H=16,L=512,R=64,D=192,topk=32,ps=16,kv=fp8,sparse=0,C=110", 1},
    /* an explicit scale: (32 + 16)^-0.5 times YaRN's mscale^2 at factor 40 */
    {"H=4,L=32,R=16,D=32,topk=16,ps=16,kv=bf16,sparse=1,sm=1049262777,C=40", 3},
};

const kern_family fam_mla_decode = {
    .name = "mla_decode",
    .version = 3, /* 2: the GPU side's MMA parameter; 3: MMA=3 (fp8) */
    .summary = "absorbed MLA over the paged latent cache, split-context, dense or DSA-sparse",
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
    .cost = cost,
    .cases = cases,
    .n_cases = sizeof cases / sizeof cases[0],
};
