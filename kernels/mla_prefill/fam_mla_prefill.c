/* fam_mla_prefill.c: the `mla_prefill` family: dense causal attention of a
 * chunk of M new tokens of one sequence (positions P .. P+M-1, P = tokens
 * already cached, the prefix offset) against the whole context 0 .. P+M-1,
 * all of it read from the paged latent cache (the chunk's own rows must be
 * appended before the call).
 *
 * Launch 1 (expand) multiplies every context row's latent by kv_b
 * (wkv: per head D rows W_UK then V rows W_UV) into bf16 k_nope [T][H][D]
 * and v [T][H][V] in scratch; launch 2 is flash attention (online softmax,
 * key tiles pipelined STAGES deep) with q = [q_nope | q_rope] (D + R per
 * head, rope already applied), k = [k_nope | cache rope part] (the rope key
 * is shared by all heads), scale (D + R)^-0.5 unless the runtime dim sm
 * carries another as float32 bits (a YaRN checkpoint's mscale^2
 * correction, as in mla_decode; the kernels take it as an argument, so it
 * costs no compile); out bf16 [M][H][V].
 *
 * GLM-5.2 is DSA everywhere: queries that see more than index_topk tokens
 * attend only their selected tokens, which this dense family does not do.
 * That case runs mla_decode (sparse, M = the chunk) on absorbed queries;
 * this family serves chunks whose context is at most index_topk (and
 * models without DSA). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/attn/attn_common.h"
#include "kernels/attn/attn_mma.h"
#include "kernels/core/family.h"

enum { D_H, D_L, D_R, D_D, D_V, D_PS, D_KV, D_P, D_SM, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_H] = {"H", KERN_DIM_INT, false, 1, 256, "attention heads"},
    [D_L] = {"L", KERN_DIM_INT, false, 1, 2048, "latent dims (kv_lora_rank)"},
    [D_R] = {"R", KERN_DIM_INT, false, 0, 256, "rope dims"},
    [D_D] = {"D", KERN_DIM_INT, false, 1, 1024, "nope dims per head"},
    [D_V] = {"V", KERN_DIM_INT, false, 1, 1024, "value dims per head"},
    [D_PS] = {"ps", KERN_DIM_INT, false, 1, 4096, "tokens per cache page"},
    [D_KV] = {"kv", KERN_DIM_DTYPE, false, 0, 0, "cache element type: bf16 or fp8"},
    [D_P] = {"P", KERN_DIM_INT, true, 0, 1 << 22, "prefix offset: tokens cached before the chunk"},
    [D_SM] = {"sm", KERN_DIM_INT, true, 0, 0x7F7FFFFF,
              "softmax scale as float32 bits; 0: (D+R)^-0.5 (YaRN's mscale^2 needs another)"},
};

static const kern_preset presets[] = {
    {"glm5.2", "H=64,L=512,R=64,D=192,V=256,ps=64,kv=bf16,P=1024,sm=0"},
    {"tiny", "H=4,L=32,R=16,D=32,V=32,ps=16,kv=bf16,P=20,sm=0"},
    {"glm5.2-fp8", "H=64,L=512,R=64,D=192,V=256,ps=64,kv=fp8,P=1024,sm=0"},
};

enum { B_Q, B_CACHE, B_KSCALE, B_TABLE, B_WKV, B_OUT, B_COUNT };

static int64_t width(const kern_shape *s) { return s->v[D_L] + s->v[D_R]; }
static int64_t n_tok(const kern_shape *s, int64_t m) { return s->v[D_P] + m; }
static int64_t max_pages(const kern_shape *s, int64_t m)
{
    return (n_tok(s, m) + s->v[D_PS] - 1) / s->v[D_PS];
}
static int64_t n_pages(const kern_shape *s, int64_t m) { return max_pages(s, m) + 3; }
static float kscale_of(const kern_shape *s)
{
    return s->v[D_KV] == KERN_DT_FP8E4M3 ? 0.375f : 1.0f;
}
/* The scale the kernels multiply q . k by (attn_softmax_scale). */
static float softmax_scale(const kern_shape *s)
{
    return attn_softmax_scale(s->v[D_SM], s->v[D_D], s->v[D_R]);
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
    size_t h = (size_t)s->v[D_H], dq = (size_t)(s->v[D_D] + s->v[D_R]);
    size_t v = (size_t)s->v[D_V], l = (size_t)s->v[D_L], um = (size_t)m;
    out[B_Q] = (kern_buf_desc){"q", KERN_BUF_IN, KERN_DT_BF16, um * h * dq * 2, 0, 0, 0};
    attn_cache_bufs(out + B_CACHE, "cache", (kern_dtype)s->v[D_KV],
                    (size_t)n_pages(s, m) * (size_t)s->v[D_PS] * (size_t)width(s),
                    (size_t)max_pages(s, m));
    out[B_WKV] = (kern_buf_desc){"wkv", KERN_BUF_IN, KERN_DT_BF16,
                                 h * (size_t)(s->v[D_D] + s->v[D_V]) * l * 2, 0, 0, 0};
    /* bf16 out: two roundings of difference, plus a bf16 step in an
     * expanded key or value now and then. */
    out[B_OUT] = (kern_buf_desc){"o", KERN_BUF_OUT, KERN_DT_BF16, um * h * v * 2,
                                 (int64_t)v, 4e-3, 2e-2};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    size_t h = (size_t)s->v[D_H], dq = (size_t)(s->v[D_D] + s->v[D_R]);
    float ks = kscale_of(s);
    /* kv_b rows of norm ~1 keep expanded keys O(1); q of sd 1.5 makes the
     * scores spread over a few units. */
    attn_fill_bf16(&r, host[B_Q], (size_t)m * h * dq, 1.5f);
    attn_fill_pool(&r, host[B_CACHE], (kern_dtype)s->v[D_KV],
                   (size_t)n_pages(s, m) * (size_t)s->v[D_PS] * (size_t)width(s), 1.0f, ks);
    *(float *)host[B_KSCALE] = ks;
    attn_fill_table(&r, host[B_TABLE], 1, max_pages(s, m), n_pages(s, m));
    attn_fill_bf16(&r, host[B_WKV], h * (size_t)(s->v[D_D] + s->v[D_V]) * (size_t)s->v[D_L],
                   (float)(1.0 / sqrt((double)s->v[D_L])));
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    attn_prefill_args a = {
        .m = m, .p = s->v[D_P], .h = s->v[D_H], .l = s->v[D_L], .r = s->v[D_R],
        .d = s->v[D_D], .v = s->v[D_V], .q = host[B_Q], .pool = host[B_CACHE],
        .kv = (kern_dtype)s->v[D_KV], .kscale = *(const float *)host[B_KSCALE],
        .ps = s->v[D_PS], .table = host[B_TABLE], .wkv = host[B_WKV], .out = host[B_OUT],
        .scale = s->v[D_SM] ? (double)softmax_scale(s)
                            : 1.0 / sqrt((double)(s->v[D_D] + s->v[D_R])),
    };
    attn_ref_prefill(&a);
}

/* Flops: the expansion GEMM (T x L x H(D+V)) and causal attention (query i
 * sees P+i+1 keys: D+R for the score, V for the sum, per head). Minimum
 * bytes: the context's cache rows, kv_b, q and out once. */
static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    double h = (double)s->v[D_H], l = (double)s->v[D_L], t = (double)n_tok(s, m);
    double dq = (double)(s->v[D_D] + s->v[D_R]), v = (double)s->v[D_V];
    double hr = (double)(s->v[D_D] + s->v[D_V]), dm = (double)m, p = (double)s->v[D_P];
    double pairs = dm * p + dm * (dm + 1) / 2;
    *flops = 2.0 * t * h * hr * l + 2.0 * h * pairs * (dq + v);
    *bytes = t * (double)width(s) * (double)attn_kv_esize((kern_dtype)s->v[D_KV]) +
             h * hr * l * 2 + dm * h * (dq + v) * 2;
}

/* ---- run ----------------------------------------------------------------------- */

static int param(const kern_ctx *c, const char *name)
{
    return kern_config_get(c->impl, c->cfg, name, 1);
}

/* Expanded k_nope and v of the whole context, bf16. */
static size_t scratch_bytes(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    (void)cfg;
    return (size_t)n_tok(s, m) * (size_t)s->v[D_H] * (size_t)(s->v[D_D] + s->v[D_V]) * 2;
}

/* Expansion tile of the GPU kernel: ET tokens x EN rows, EK-deep steps.
 * On matrix fragments (MMA) it grows with the block: 32 x 64 under 4
 * waves, 64 x 128 from 4 (whole fragments of every shape, 16x16, 16x8 and
 * 32x32, split over the waves with at most 64 accumulator registers per
 * lane); K steps of 64. */
typedef struct etile {
    int et, en, ek;
} etile;

static etile expand_tile(bool mma, int waves)
{
    if (!mma)
        return (etile){16, 64, 32};
    return waves >= 4 ? (etile){64, 128, 64} : (etile){32, 64, 64};
}

static size_t attn_shared(const kern_shape *s, int bm, int bn, int stages)
{
    size_t dq = (size_t)(s->v[D_D] + s->v[D_R]);
    return (size_t)bm * (size_t)bn * 4 + 3 * (size_t)bm * 4 +        /* S, alpha, m, l */
           (size_t)stages * (size_t)bn * (size_t)s->v[D_R] * 4 +     /* rope keys f32 */
           (size_t)bm * dq * 2 +                                      /* q */
           (size_t)stages * (size_t)bn * (size_t)(s->v[D_D] + s->v[D_V]) * 2; /* k, v */
}

/* The expansion's shared memory: f32 tiles, or padded bf16 tiles on the
 * MMA path (pad as the attention's: 4 bf16 on wave64, 8 on wave32). */
static size_t expand_shared(bool mma, int waves, int ws)
{
    etile e = expand_tile(mma, waves);
    if (mma)
        return (size_t)(e.et + e.en) * (size_t)(e.ek + (ws == 64 ? 4 : 8)) * 2;
    return (size_t)(e.et + e.en) * (size_t)e.ek * 4;
}

/* Dynamic shared memory of the MMA path, as mla_prefill.hip carves it:
 * bf16 q [BM][DQ + pad], k [BN][DQ + pad], v [BN][V + pad], P [BM][BN +
 * pad]; f32 S [BM][BN + 1] and three per-row floats; pad 4 (wave64) or 8
 * (wave32) bf16. */
static size_t gpu_mma_shared(const kern_shape *s, int bm, int bn, int ws)
{
    size_t dq = (size_t)(s->v[D_D] + s->v[D_R]), pad = ws == 64 ? 4 : 8;
    return ((size_t)bm + (size_t)bn) * (dq + pad) * 2 +
           (size_t)bn * ((size_t)s->v[D_V] + pad) * 2 + (size_t)bm * ((size_t)bn + pad) * 2 +
           (size_t)bm * ((size_t)bn + 1) * 4 + 3 * (size_t)bm * 4;
}

static mt_status run(const kern_ctx *c, mt_err *err)
{
    const kern_shape *s = c->shape;
    bool gpu = dev_backend_runs_hip_source(c->props->backend);
    dev_kernel *ke, *ka;
    mt_status st = attn_get_kernels(c, "mla_prefill_expand", "ppppppi", &ke, "mla_prefill_attn",
                                    "pppppppiif", &ka, err);
    if (st != MT_OK)
        return st;
    int t = (int)n_tok(s, c->m), p = (int)s->v[D_P], m = (int)c->m;
    int h = (int)s->v[D_H], hr = (int)(s->v[D_D] + s->v[D_V]);
    void *kn = c->scratch;
    void *vv = (char *)c->scratch + (size_t)t * (size_t)h * (size_t)s->v[D_D] * 2;
    float scale = softmax_scale(s);
    unsigned nt = gpu ? (unsigned)(param(c, "WAVES") * c->props->warp_size) : 1;
    dev_dim3 block = {nt, 1, 1};

    void *eargs[] = {(void *)&c->bufs[B_CACHE], (void *)&c->bufs[B_KSCALE],
                     (void *)&c->bufs[B_TABLE], (void *)&c->bufs[B_WKV], &kn, &vv, &t};
    dev_dim3 egrid;
    bool mma = gpu && param(c, "MMA");
    etile et = expand_tile(mma, gpu ? param(c, "WAVES") : 1);
    if (gpu)
        egrid = (dev_dim3){kern_cdiv(t, et.et), kern_cdiv((int64_t)h * hr, et.en), 1};
    else
        egrid = (dev_dim3){kern_cdiv(t, param(c, "ET")), (unsigned)h, 1};
    size_t eshm = gpu ? expand_shared(mma, param(c, "WAVES"), c->props->warp_size) : 0;
    st = dev_launch(c->dev, ke, egrid, block, eshm, eargs, err);
    if (st != MT_OK)
        return st;

    void *aargs[] = {(void *)&c->bufs[B_Q], &kn, &vv, (void *)&c->bufs[B_CACHE],
                     (void *)&c->bufs[B_KSCALE], (void *)&c->bufs[B_TABLE],
                     (void *)&c->bufs[B_OUT], &p, &m, &scale};
    int bm = param(c, "BM");
    dev_dim3 agrid = {kern_cdiv(m, bm), (unsigned)h, 1};
    size_t shm = 0; /* cpu takes none */
    if (gpu && param(c, "MMA"))
        shm = gpu_mma_shared(s, bm, param(c, "BN"), c->props->warp_size);
    else if (gpu)
        shm = attn_shared(s, bm, param(c, "BN"), param(c, "STAGES"));
    return dev_launch(c->dev, ka, agrid, block, shm, aargs, err);
}

/* GPU parameters. Order matters: BM, BN, WAVES first (defines). */
enum { GP_BM, GP_BN, GP_WAVES, GP_STAGES, GP_MMA, GP_COUNT };

/* Both implementations (the device's backend picks the side, as in run):
 * attn_mla_defines over BM rows x V values a block (both parameter lists
 * start BM, BN), then on GPUs the expansion tile. */
static int defines(const kern_shape *s, const kern_config *cfg, const dev_props *p,
                   dev_define *out, char (*buf)[64], int cap)
{
    if (cap < 6)
        return 0;
    bool gpu = dev_backend_runs_hip_source(p->backend);
    int nt = gpu ? cfg->v[2] * p->warp_size : 1;
    int n = attn_mla_defines(out, buf, (kern_dtype)s->v[D_KV], nt, cfg->v[0] * s->v[D_V]);
    if (gpu) {
        etile e = expand_tile(cfg->n > GP_MMA && cfg->v[GP_MMA], cfg->v[GP_WAVES]);
        n = attn_define(out, buf, n, "ET", e.et);
        n = attn_define(out, buf, n, "EN", e.en);
        n = attn_define(out, buf, n, "EK", e.ek);
    }
    return n;
}

/* ---- GPU implementation ----------------------------------------------------------- */

static const int bm_v[] = {8, 16, 32, 64};
static const int bn_v[] = {8, 16, 32, 64};
static const int waves_v[] = {1, 2, 4, 8};
static const int stages_v[] = {1, 2, 3};
static const int mma_v[] = {0, 1, 2};

static const kern_param_desc gpu_params[GP_COUNT] = {
    [GP_BM] = {"BM", bm_v, 4, "query tile (rows per block)"},
    [GP_BN] = {"BN", bn_v, 4, "key tile"},
    [GP_WAVES] = {"WAVES", waves_v, 4, "waves per block"},
    [GP_STAGES] = {"STAGES", stages_v, 3, "key/value tiles in flight (shared-memory buffers)"},
    [GP_MMA] = {"MMA", mma_v, 3, "0 scalar FP32; 1, 2 matrix instructions for the expansion, QK^T and PV, "
                "the platform's small (16-row) or large (32x32x8, AMD) tile"},
};

/* The MMA path's rules (attn_mma_valid): one key tile at a time;
 * fragments tile the BM x BN scores (the nope dims and the rope dims each
 * a whole number of K steps) and the BM x V output, whose fragments the
 * waves split (V first, then rows) and keep in registers; the tiles are
 * dynamic shared memory. */
static bool gpu_mma_valid(const kern_shape *s, const kern_config *c, const dev_props *p,
                          char *why, size_t cap)
{
    int bm = c->v[GP_BM], bn = c->v[GP_BN];
    attn_mma_tiling t = {
        .mma = c->v[GP_MMA], .waves = c->v[GP_WAVES], .stages = c->v[GP_STAGES],
        .rows_name = "BM", .rows_noun = "queries", .rows = bm, .bn_noun = "keys", .bn = bn,
        .n_k = 2, .k_name = {"D", "R"}, .k = {s->v[D_D], s->v[D_R]}, .out_name = "V",
        .out = s->v[D_V], .shared = gpu_mma_shared(s, bm, bn, p->warp_size),
    };
    return attn_mma_valid(&t, p, why, cap);
}

static bool gpu_valid(const kern_shape *s, int64_t m, const kern_config *c,
                      const dev_props *p, char *why, size_t cap)
{
    (void)m;
    int bm = c->v[0], bn = c->v[1], nt = c->v[2] * p->warp_size, stages = c->v[3];
    if (nt > p->max_threads_per_block) {
        snprintf(why, cap, "%d threads exceed the device's %d", nt, p->max_threads_per_block);
        return false;
    }
    if (bm > nt || nt < 64) {
        snprintf(why, cap, "BM=%d needs at least BM and 64 threads, has %d", bm, nt);
        return false;
    }
    size_t eshm = expand_shared(c->n > GP_MMA && c->v[GP_MMA], c->v[GP_WAVES], p->warp_size);
    if (eshm > p->shared_mem_per_block) {
        snprintf(why, cap, "the expansion needs %zu bytes of shared memory, the device has "
                 "%zu", eshm, p->shared_mem_per_block);
        return false;
    }
    if (c->n > GP_MMA && c->v[GP_MMA])
        return gpu_mma_valid(s, c, p, why, cap);
    return attn_scalar_valid(bm * s->v[D_V], nt, "BM*V", attn_shared(s, bm, bn, stages), p, why,
                             cap);
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    c->n = GP_COUNT;
    c->v[GP_MMA] = 0;
    c->v[0] = m >= 32 ? 32 : 16;
    c->v[1] = 32;
    c->v[2] = p->max_threads_per_block >= 4 * p->warp_size ? 4 : 2;
    c->v[3] = 2;
    char why[128];
    while (!gpu_valid(s, m, c, p, why, sizeof why)) {
        if (c->v[3] > 1)
            c->v[3]--;
        else if (c->v[1] > 8)
            c->v[1] /= 2;
        else if (c->v[0] > 8)
            c->v[0] /= 2;
        else if (c->v[2] < 8 && (c->v[2] * 2) * p->warp_size <= p->max_threads_per_block)
            c->v[2] *= 2;
        else
            break;
    }
    /* Matrix instructions where the device has them (kern_mma_tile): the
     * first of these tiles it takes (no query tile much wider than the
     * chunk), at STAGES=1, else the scalar config above. */
    static const int set[] = {GP_BM, GP_BN, GP_WAVES};
    static const int mma_tiles[][3] = {
        {64, 16, 4}, {32, 32, 4}, {32, 16, 4}, {16, 16, 4}, {16, 16, 2}, {16, 16, 1},
    };
    int tiles[sizeof mma_tiles / sizeof mma_tiles[0]][3], n = 0;
    for (size_t i = 0; i < sizeof mma_tiles / sizeof mma_tiles[0]; i++)
        if (mma_tiles[i][0] <= 16 || mma_tiles[i][0] <= m)
            memcpy(tiles[n++], mma_tiles[i], sizeof tiles[0]);
    kern_config from = *c;
    from.v[GP_STAGES] = 1;
    attn_mma_pick(s, m, p, gpu_valid, &from, GP_MMA, set, 3, tiles[0], n, c);
}

static const kern_impl gpu_impl = {
    .source = "mla_prefill.hip",
    .params = gpu_params,
    .n_params = GP_COUNT,
    .valid = gpu_valid,
    .default_config = gpu_default,
    .defines = defines,
    .scratch_bytes = scratch_bytes,
    .run = run,
};

/* ---- CPU implementation --------------------------------------------------------------- */

static const int cpu_bm_v[] = {4, 8, 16, 32, 64};
static const int cpu_bn_v[] = {16, 32, 64, 128};
static const int cpu_et_v[] = {4, 16, 64, 256};
static const kern_param_desc cpu_params[] = {
    {"BM", cpu_bm_v, 5, "query rows per work item"},
    {"BN", cpu_bn_v, 4, "key tile"},
    {"ET", cpu_et_v, 4, "context tokens per expansion work item (they share each kv_b panel)"},
};

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    c->n = 3;
    c->v[0] = m >= 128 ? 64 : m >= 64 ? 32 : m >= 16 ? 8 : 4;
    c->v[1] = 64;
    /* The expansion converts a head's kv_b rows once per item: the more
     * tokens share them the better, while items remain for every thread. */
    int64_t t = n_tok(s, m), et = 256;
    while (et > 16 && (t + et - 1) / et * s->v[D_H] < 4 * (int64_t)p->compute_units)
        et /= 4;
    c->v[2] = (int)et;
}

static const kern_impl cpu_impl = {
    .source = "mla_prefill.cpu",
    .params = cpu_params,
    .n_params = 3,
    .default_config = cpu_default,
    .defines = defines,
    .scratch_bytes = scratch_bytes,
    .run = run,
};

static const kern_case cases[] = {
    {"tiny", 5},
    {"H=4,L=32,R=16,D=32,V=32,ps=16,kv=bf16,P=0", 19},
    {"H=4,L=32,R=16,D=32,V=32,ps=7,kv=fp8,P=13", 11},
    {"H=2,L=24,R=8,D=16,V=24,ps=3,kv=bf16,P=37", 3},
    {"H=3,L=48,R=16,D=40,V=24,ps=5,kv=fp8,P=1", 1},
    {"H=2,L=512,R=64,D=192,V=256,ps=64,kv=fp8,P=9", 4},   /* glm5.2 widths */
    {"H=4,L=32,R=16,D=32,V=32,ps=16,kv=bf16,P=6,sm=1049262777", 3}, /* a YaRN scale, 0.27 */
};

const kern_family fam_mla_prefill = {
    .name = "mla_prefill",
    .version = 2, /* 2: the GPU side's MMA parameter */
    .summary = "causal MLA prefill of a chunk against the paged latent cache (expand + flash attention)",
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
