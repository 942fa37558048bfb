/* fam_moe_align.c: the `moe_align` family: sorts the (token, expert) pairs
 * of topk_ids by expert (stably) and pads each expert's segment to a
 * multiple of bm, the tile height of the GEMM that follows (a runtime dim
 * passed to the kernel, so one compiled config serves every bm). Outputs
 * the layout of kernels/moe_common.h: sorted pair ids with the sentinel
 * npairs in padding, the expert of every tile (-1 past the end) and the
 * padded total. Deterministic, compared exactly. */
#include <stdio.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/moe/moe_common.h"

enum { D_E, D_TOPK, D_BM, D_SKEW, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_E] = {"E", KERN_DIM_INT, false, 1, 1024, "routed experts"},
    [D_TOPK] = {"topk", KERN_DIM_INT, false, 1, 32, "experts per token"},
    [D_BM] = {"bm", KERN_DIM_INT, true, 1, 256, "tile height to pad segments to"},
    [D_SKEW] = {"skew", KERN_DIM_INT, true, 0, 2,
                "routing of generated problems: 0 uniform, 1 every token on expert E-1, "
                "2 only 2*topk experts used"},
};

static const kern_preset presets[] = {
    {"glm5.2", "E=256,topk=8,bm=128,skew=0"},
    {"tiny", "E=16,topk=4,bm=128,skew=0"},
};

enum { B_IDS, B_SORTED, B_TILE, B_TOTAL, B_COUNT };

static int64_t cap_of(const kern_shape *s, int64_t m)
{
    return moe_cap_rows(m * s->v[D_TOPK], s->v[D_E], s->v[D_BM]);
}

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    if (s->v[D_TOPK] > s->v[D_E]) {
        snprintf(why, cap, "topk=%lld exceeds E=%lld", (long long)s->v[D_TOPK],
                 (long long)s->v[D_E]);
        return false;
    }
    if (cap_of(s, m) > INT32_MAX / 2) {
        snprintf(why, cap, "M=%lld: too many pairs for int32 indices", (long long)m);
        return false;
    }
    return true;
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return 0;
    int64_t P = m * s->v[D_TOPK], c = cap_of(s, m);
    out[B_IDS] = (kern_buf_desc){"topk_ids", KERN_BUF_IN, KERN_DT_I32, (size_t)P * 4, 0, 0, 0};
    out[B_SORTED] = (kern_buf_desc){"sorted_pairs", KERN_BUF_OUT, KERN_DT_I32, (size_t)c * 4, 0, 0, 0};
    out[B_TILE] = (kern_buf_desc){"tile_expert", KERN_BUF_OUT, KERN_DT_I32,
                                  (size_t)(c / s->v[D_BM]) * 4, 0, 0, 0};
    out[B_TOTAL] = (kern_buf_desc){"total", KERN_BUF_OUT, KERN_DT_I32, 4, 0, 0, 0};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    moe_gen_ids(&r, m, (int)s->v[D_TOPK], (int)s->v[D_E], (int)s->v[D_SKEW], host[B_IDS]);
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    moe_align_ref(host[B_IDS], m * s->v[D_TOPK], (int)s->v[D_E], (int)s->v[D_BM],
                  host[B_SORTED], host[B_TILE], host[B_TOTAL]);
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    *flops = 0;
    *bytes = (double)(m * s->v[D_TOPK] * 4 + cap_of(s, m) * 4);
}

static mt_status launch(const kern_ctx *c, dev_dim3 block, size_t shared, mt_err *err)
{
    dev_kernel *k;
    mt_status st = kern_get(c, "moe_align", "ppppiii", &k, err);
    if (st != MT_OK)
        return st;
    int32_t np = (int32_t)(c->m * c->shape->v[D_TOPK]), bm = (int32_t)c->shape->v[D_BM];
    int32_t cp = (int32_t)cap_of(c->shape, c->m);
    void *ids = c->bufs[B_IDS], *so = c->bufs[B_SORTED], *ti = c->bufs[B_TILE],
         *to = c->bufs[B_TOTAL];
    void *args[] = {&ids, &so, &ti, &to, &np, &bm, &cp};
    return dev_launch(c->dev, k, (dev_dim3){1, 1, 1}, block, shared, args, err);
}

/* ---- gpu --------------------------------------------------------------- */

enum { P_BLOCK, P_CHUNK, P_COUNT };
static const int block_vals[] = {64, 128, 256, 512, 1024};
static const int chunk_vals[] = {0, 256, 1024, 4096};
static const kern_param_desc gpu_params[P_COUNT] = {
    [P_BLOCK] = {"BLOCK", block_vals, 5, "threads per block"},
    [P_CHUNK] = {"CHUNK", chunk_vals, 4,
                 "pairs per block of the histogram/scan/scatter path; 0: one block does all"},
};

/* Dynamic shared memory of the path a config takes (the largest kernel). */
static size_t gpu_shared(const kern_shape *s, const kern_config *cfg)
{
    int64_t E = s->v[D_E], b = cfg->v[P_BLOCK];
    return cfg->v[P_CHUNK] ? (size_t)(E + b) * 4 : (size_t)(2 * E + 1) * 4;
}

static int64_t n_chunks(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    int64_t np = m * s->v[D_TOPK], ch = cfg->v[P_CHUNK];
    return np > 0 ? (np + ch - 1) / ch : 1;
}

static size_t gpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    return cfg->v[P_CHUNK] ? (size_t)(n_chunks(s, m, cfg) * s->v[D_E]) * 4 : 0;
}

static bool gpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg,
                      const dev_props *p, char *why, size_t cap)
{
    (void)m;
    int b = cfg->v[P_BLOCK];
    if (b > p->max_threads_per_block || b % p->warp_size) {
        snprintf(why, cap, "BLOCK=%d: the device allows %d threads per block in warps of %d",
                 b, p->max_threads_per_block, p->warp_size);
        return false;
    }
    if (gpu_shared(s, cfg) > p->shared_mem_per_block) {
        snprintf(why, cap, "needs %zu bytes of shared memory, the device has %zu",
                 gpu_shared(s, cfg), p->shared_mem_per_block);
        return false;
    }
    return true;
}

/* One block (one launch) while a block's worth of chunks is cheap; the
 * three-kernel path over many blocks beyond. */
static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    cfg->n = P_COUNT;
    cfg->v[P_BLOCK] = p->max_threads_per_block >= 256 ? 256 : p->max_threads_per_block;
    cfg->v[P_CHUNK] = m * s->v[D_TOPK] <= 1024 ? 0 : 1024;
}

static mt_status gpu_run(const kern_ctx *c, mt_err *err)
{
    const kern_config *cfg = c->cfg;
    unsigned b = (unsigned)cfg->v[P_BLOCK];
    if (!cfg->v[P_CHUNK])
        return launch(c, (dev_dim3){b, 1, 1}, gpu_shared(c->shape, cfg), err);
    dev_kernel *kc, *ks, *kx;
    mt_status st = kern_get(c, "moe_align_count", "ppppiii", &kc, err);
    if (st == MT_OK)
        st = kern_get(c, "moe_align_scan", "pppii", &ks, err);
    if (st == MT_OK)
        st = kern_get(c, "moe_align_scatter", "pppi", &kx, err);
    if (st != MT_OK)
        return st;
    int64_t E = c->shape->v[D_E];
    int32_t np = (int32_t)(c->m * c->shape->v[D_TOPK]), bm = (int32_t)c->shape->v[D_BM];
    int32_t cp = (int32_t)cap_of(c->shape, c->m), g = (int32_t)n_chunks(c->shape, c->m, cfg);
    void *ids = c->bufs[B_IDS], *so = c->bufs[B_SORTED], *ti = c->bufs[B_TILE],
         *to = c->bufs[B_TOTAL], *cnt = c->scratch;
    void *a1[] = {&ids, &so, &ti, &cnt, &np, &bm, &cp};
    void *a2[] = {&cnt, &ti, &to, &g, &bm};
    void *a3[] = {&ids, &so, &cnt, &np};
    dev_dim3 grid = {(unsigned)g, 1, 1}, one = {1, 1, 1}, block = {b, 1, 1};
    st = dev_launch(c->dev, kc, grid, block, (size_t)E * 4, a1, err);
    if (st == MT_OK)
        st = dev_launch(c->dev, ks, one, block, (size_t)(E + b) * 4, a2, err);
    if (st == MT_OK)
        st = dev_launch(c->dev, kx, grid, block, (size_t)(E + b) * 4, a3, err);
    return st;
}

static const kern_impl gpu_impl = {
    .source = "moe_align.hip",
    .params = gpu_params,
    .n_params = P_COUNT,
    .valid = gpu_valid,
    .default_config = gpu_default,
    .scratch_bytes = gpu_scratch,
    .run = gpu_run,
};

/* ---- cpu --------------------------------------------------------------- */

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    (void)s;
    (void)m;
    (void)p;
    cfg->n = 0;
}

static mt_status cpu_run(const kern_ctx *c, mt_err *err)
{
    return launch(c, (dev_dim3){1, 1, 1}, 0, err);
}

static const kern_impl cpu_impl = {
    .source = "moe_align.cpu",
    .params = NULL,
    .n_params = 0,
    .default_config = cpu_default,
    .run = cpu_run,
};

static const kern_case cases[] = {
    {"tiny", 1},
    {"tiny", 3},
    {"tiny", 17},
    {"tiny", 64},
    {"E=16,topk=4,bm=16,skew=1", 64},
    {"E=16,topk=1,bm=32,skew=1", 17},
    {"E=256,topk=8,bm=64,skew=2", 37},
    {"glm5.2", 1},
    {"E=256,topk=8,bm=16,skew=0", 300},
    /* Past the one-block default: the histogram/scan/scatter path, with
     * chunks that end inside a sub-chunk and experts with no pairs. */
    {"E=256,topk=8,bm=64,skew=2", 211},
    {"E=32,topk=6,bm=16,skew=0", 1000},
};

const kern_family fam_moe_align = {
    .name = "moe_align",
    .version = 2,
    .summary = "sort (token, expert) pairs by expert, pad segments to the GEMM tile height",
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
