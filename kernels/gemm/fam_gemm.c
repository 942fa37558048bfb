/* fam_gemm.c: the `gemm` family: c = a x b^T with bf16 inputs and f32
 * output. The reference tiled GEMM of the library: shared-memory tiles,
 * barriers, register tiles and split-K with atomics on GPUs, or with MMA=1|2
 * the matrix fragments of the prelude (MFMA / mma.sync); register and K
 * blocking on the CPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"

enum { D_N, D_K, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_N] = {"N", KERN_DIM_INT, false, 1, 1 << 20, "output columns"},
    [D_K] = {"K", KERN_DIM_INT, false, 1, 1 << 20, "reduction length"},
};

static const kern_preset presets[] = {
    {"tiny", "N=64,K=96"},
    {"glm5.2-q_a", "N=2048,K=6144"},
    {"glm5.2-kv_a", "N=576,K=6144"},
};

enum { P_BM, P_BN, P_BK, P_TM, P_TN, P_SPLITK, P_MMA, P_COUNT };
static const int bm_v[] = {16, 32, 64, 128};
static const int bn_v[] = {16, 32, 64, 128};
static const int bk_v[] = {8, 16, 32};
static const int tm_v[] = {1, 2, 4, 8};
static const int tn_v[] = {1, 2, 4, 8};
static const int splitk_v[] = {1, 2, 4, 8};
static const int mma_v[] = {0, 1, 2};
static const kern_param_desc gpu_params[P_COUNT] = {
    [P_BM] = {"BM", bm_v, 4, "rows of c per block"},
    [P_BN] = {"BN", bn_v, 4, "columns of c per block"},
    [P_BK] = {"BK", bk_v, 3, "K per shared-memory stage"},
    [P_TM] = {"TM", tm_v, 4, "rows per thread (MMA: fragments per wave down M)"},
    [P_TN] = {"TN", tn_v, 4, "columns per thread (MMA: fragments per wave along N)"},
    [P_SPLITK] = {"SPLITK", splitk_v, 4, "blocks sharing one tile's K (atomics)"},
    [P_MMA] = {"MMA", mma_v, 3, "0 scalar FMAs; 1, 2 matrix instructions, the "
               "platform's small (16-row) or large (32x32x8, AMD) tile"},
};

/* The MMA path's block: waves (each TM x TN fragments) times the wave. */
static int mma_threads(const int *v, const dev_props *p, int tm, int tn)
{
    return (v[P_BM] / (v[P_TM] * tm)) * (v[P_BN] / (v[P_TN] * tn)) *
           (p->warp_size == 32 ? 32 : 64);
}

static bool mma_valid(const kern_shape *s, const int *v, const dev_props *p, char *why,
                      size_t cap)
{
    int tm, tn, tk;
    if (!kern_mma_tile(p, v[P_MMA], &tm, &tn, &tk)) {
        snprintf(why, cap, "MMA=%d: %s has no such matrix instruction", v[P_MMA], p->arch);
        return false;
    }
    if (v[P_BM] % (v[P_TM] * tm) || v[P_BN] % (v[P_TN] * tn) || v[P_BK] % tk) {
        snprintf(why, cap, "MMA=%d: a %dx%d wave tile of %dx%dx%d fragments does not "
                 "divide the %dx%d block or BK=%d", v[P_MMA], v[P_TM] * tm, v[P_TN] * tn,
                 tm, tn, tk, v[P_BM], v[P_BN], v[P_BK]);
        return false;
    }
    int regs = v[P_TM] * v[P_TN] * (tm * tn / (p->warp_size == 32 ? 32 : 64));
    if (regs > 64) {
        snprintf(why, cap, "MMA=%d: %d accumulator registers per lane (at most 64)",
                 v[P_MMA], regs);
        return false;
    }
    int threads = mma_threads(v, p, tm, tn);
    if (threads > p->max_threads_per_block) {
        snprintf(why, cap, "%d threads per block (limit %d)", threads,
                 p->max_threads_per_block);
        return false;
    }
    size_t shared = (size_t)(v[P_BM] + v[P_BN]) * (size_t)(v[P_BK] + 4) * 2;
    if (shared > p->shared_mem_per_block) {
        snprintf(why, cap, "%zu bytes of shared memory (limit %zu)", shared,
                 p->shared_mem_per_block);
        return false;
    }
    if ((int64_t)v[P_SPLITK] * v[P_BK] > s->v[D_K]) {
        snprintf(why, cap, "SPLITK=%d leaves less than one K stage per split", v[P_SPLITK]);
        return false;
    }
    return true;
}

static const int cbm_v[] = {1, 2, 4, 8};
static const int cbn_v[] = {8, 16, 32, 64};
static const int ckb_v[] = {64, 128, 256};
static const kern_param_desc cpu_params[] = {
    {"BM", cbm_v, 4, "rows of c per work item"},
    {"BN", cbn_v, 4, "columns of c per work item"},
    {"KB", ckb_v, 3, "K block"},
};

static bool gpu_valid(const kern_shape *s, int64_t m, const kern_config *c,
                      const dev_props *p, char *why, size_t cap)
{
    (void)m;
    const int *v = c->v;
    if (v[P_MMA])
        return mma_valid(s, v, p, why, cap);
    if (v[P_TM] > v[P_BM] || v[P_TN] > v[P_BN]) {
        snprintf(why, cap, "register tile larger than the block tile");
        return false;
    }
    int threads = (v[P_BM] / v[P_TM]) * (v[P_BN] / v[P_TN]);
    if (threads > p->max_threads_per_block || threads < p->warp_size) {
        snprintf(why, cap, "%d threads per block (limit %d, at least a warp of %d)",
                 threads, p->max_threads_per_block, p->warp_size);
        return false;
    }
    size_t shared = (size_t)(v[P_BM] + v[P_BN]) * (size_t)v[P_BK] * 4;
    if (shared > p->shared_mem_per_block) {
        snprintf(why, cap, "%zu bytes of shared memory (limit %zu)", shared,
                 p->shared_mem_per_block);
        return false;
    }
    if (v[P_TM] * v[P_TN] > 64) {
        snprintf(why, cap, "register tile %dx%d too large", v[P_TM], v[P_TN]);
        return false;
    }
    if ((int64_t)v[P_SPLITK] * v[P_BK] > s->v[D_K]) {
        snprintf(why, cap, "SPLITK=%d leaves less than one K stage per split", v[P_SPLITK]);
        return false;
    }
    return true;
}

/* Sets the seven values in order (BM, BN, BK, TM, TN, SPLITK, MMA). */
static void gemm_set(int *v, int bm, int bn, int bk, int tm, int tn, int splitk, int mma)
{
    v[P_BM] = bm;
    v[P_BN] = bn;
    v[P_BK] = bk;
    v[P_TM] = tm;
    v[P_TN] = tn;
    v[P_SPLITK] = splitk;
    v[P_MMA] = mma;
}

/* The first valid point of the space with MMA=mma, smallest tiles first
 * (BM varies fastest); false when there is none. */
static bool gemm_first_valid(const kern_shape *s, int64_t m, const dev_props *p, int mma,
                             kern_config *c)
{
    char why[256];
    uint64_t total = 1;
    for (int i = 0; i < P_MMA; i++)
        total *= (uint64_t)gpu_params[i].n_values;
    for (uint64_t idx = 0; idx < total; idx++) {
        uint64_t r = idx;
        for (int i = 0; i < P_MMA; i++) {
            c->v[i] = gpu_params[i].values[r % (uint64_t)gpu_params[i].n_values];
            r /= (uint64_t)gpu_params[i].n_values;
        }
        c->v[P_MMA] = mma;
        if (gpu_valid(s, m, c, p, why, sizeof why))
            return true;
    }
    return false;
}

/* Matrix instructions wherever the device has them (kern_mma_tile): the
 * 32x32 fragment where it exists (AMD wave64), else the 16-row one.
 * Decode (M <= 16): one 16-row fragment per wave and BN 32, twice the
 * blocks of BN 64 for the GEMV-shaped K=6144 projections (SPLITK stays 1:
 * the result must not depend on the order blocks finish). Larger M: wave
 * tiles of 32x32 (M < 256) or 64x64 (M >= 256) outputs with the 32x32
 * fragment, so each fragment read from shared memory feeds 2 MMAs; with
 * the 16x8 one (NVIDIA, emu wave32) 32x16 and 64x16 (8 and 16 warps):
 * NVRTC puts wider wave tiles (TN=4 with TM >= 2) partly on the stack. A
 * candidate that validity refuses falls through to the first valid MMA
 * config, and only then to the scalar tiles. */
static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p,
                        kern_config *c)
{
    char why[256];
    int tm, tn, tk;
    c->n = P_COUNT;
    int mma = kern_mma_tile(p, 2, &tm, &tn, &tk) ? 2 : kern_mma_tile(p, 1, &tm, &tn, &tk) ? 1 : 0;
    if (mma) {
        if (m <= 16)
            gemm_set(c->v, 16, 32, 32, 1, 1, 1, 1);
        else if (m < 256)
            gemm_set(c->v, 64, 64, 32, 32 / tm, (mma == 2 ? 32 : 16) / tn, 1, mma);
        else
            gemm_set(c->v, 128, 128, 32, 64 / tm, (mma == 2 ? 64 : 16) / tn, 1, mma);
        if (gpu_valid(s, m, c, p, why, sizeof why) || gemm_first_valid(s, m, p, mma, c) ||
            (mma == 2 && gemm_first_valid(s, m, p, 1, c)))
            return;
    }
    gemm_set(c->v, m <= 16 ? 16 : 64, 64, 16, m <= 16 ? 1 : 4, 4, 1, 0);
}

static mt_status gpu_run(const kern_ctx *c, mt_err *err)
{
    const int *v = c->cfg->v;
    int m = (int)c->m;
    if (v[P_SPLITK] > 1) {
        mt_status st = dev_memset(c->dev, c->bufs[2], 0,
                                  (size_t)m * (size_t)c->shape->v[D_N] * 4, err);
        if (st != MT_OK)
            return st;
    }
    dev_kernel *k;
    mt_status st = kern_get(c, "gemm_bf16", "pppi", &k, err);
    if (st != MT_OK)
        return st;
    void *args[] = {(void *)&c->bufs[2], (void *)&c->bufs[0], (void *)&c->bufs[1], &m};
    dev_dim3 grid = {kern_cdiv(c->shape->v[D_N], v[P_BN]), kern_cdiv(m, v[P_BM]),
                     (unsigned)v[P_SPLITK]};
    int threads = (v[P_BM] / v[P_TM]) * (v[P_BN] / v[P_TN]), tm, tn, tk;
    if (v[P_MMA]) {
        if (!kern_mma_tile(c->props, v[P_MMA], &tm, &tn, &tk))
            return mt_fail(err, MT_E_INVALID, "gemm: MMA=%d on %s", v[P_MMA], c->props->arch);
        threads = mma_threads(v, c->props, tm, tn);
    }
    dev_dim3 block = {(unsigned)threads, 1, 1};
    return dev_launch(c->dev, k, grid, block, 0, args, err);
}

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p,
                        kern_config *c)
{
    (void)s;
    (void)p;
    /* BM: as many rows as there are tokens, up to 8 (each b block read
     * serves BM rows). BN 8: one register tile of columns per item at
     * decode, and the most items to spread over the threads. KB 256: a
     * block of b (8 rows x 512 B) stays in L1 while the item's row tiles
     * take it. On the glm5.2 q_a replay table (bench/data, a quiet 2-core
     * Zen 5) BN 8 was the fastest at M = 16 with every BM and KB, and
     * within the machine's noise of the fastest at M = 1. */
    c->n = 3;
    c->v[0] = m >= 8 ? 8 : m >= 4 ? 4 : m >= 2 ? 2 : 1;
    c->v[1] = 8;
    c->v[2] = 256;
}

static mt_status cpu_run(const kern_ctx *c, mt_err *err)
{
    dev_kernel *k;
    mt_status st = kern_get(c, "gemm_bf16", "pppi", &k, err);
    if (st != MT_OK)
        return st;
    int m = (int)c->m;
    void *args[] = {(void *)&c->bufs[2], (void *)&c->bufs[0], (void *)&c->bufs[1], &m};
    dev_dim3 grid = {kern_cdiv(c->shape->v[D_N], c->cfg->v[1]), kern_cdiv(m, c->cfg->v[0]), 1};
    dev_dim3 block = {1, 1, 1};
    return dev_launch(c->dev, k, grid, block, 0, args, err);
}

/* Split-K blocks add their partial tiles into c with float atomics, in
 * the order the blocks happen to finish. */
static bool gpu_order_varies(const kern_shape *s, const kern_config *cfg, char *why, size_t cap)
{
    (void)s;
    if (cfg->v[P_SPLITK] <= 1)
        return false;
    snprintf(why, cap, "SPLITK=%d adds partial tiles with float atomics", cfg->v[P_SPLITK]);
    return true;
}

static const kern_impl gpu_impl = {
    .source = "gemm.hip",
    .params = gpu_params,
    .n_params = P_COUNT,
    .valid = gpu_valid,
    .default_config = gpu_default,
    .run = gpu_run,
    .order_varies = gpu_order_varies,
};

static const kern_impl cpu_impl = {
    .source = "gemm.cpu",
    .params = cpu_params,
    .n_params = 3,
    .default_config = cpu_default,
    .run = cpu_run,
    .order_fixed = true, /* gemm.cpu: lanes over K, then a fixed tree */
};

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < 3)
        return -1;
    size_t n = (size_t)s->v[D_N], k = (size_t)s->v[D_K];
    out[0] = (kern_buf_desc){"a", KERN_BUF_IN, KERN_DT_BF16, (size_t)m * k * 2, 0, 0, 0};
    out[1] = (kern_buf_desc){"b", KERN_BUF_IN, KERN_DT_BF16, n * k * 2, 0, 0, 0};
    /* f32 accumulation in another order: error grows like sqrt(K) ulps of
     * the row's magnitude. */
    out[2] = (kern_buf_desc){"c", KERN_BUF_OUT, KERN_DT_F32, (size_t)m * n * 4,
                             (int64_t)n, 1e-4 * sqrt((double)k), 1e-4};
    return 3;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    size_t n = (size_t)s->v[D_N], k = (size_t)s->v[D_K];
    uint16_t *a = host[0], *b = host[1];
    for (size_t i = 0; i < (size_t)m * k; i++)
        a[i] = mt_f32_to_bf16(mt_rng_uniform(&r, -1.0f, 1.0f));
    for (size_t i = 0; i < n * k; i++)
        b[i] = mt_f32_to_bf16(mt_rng_uniform(&r, -1.0f, 1.0f));
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    size_t n = (size_t)s->v[D_N], k = (size_t)s->v[D_K];
    const uint16_t *a = host[0], *b = host[1];
    float *c = host[2];
    for (size_t i = 0; i < (size_t)m; i++)
        for (size_t j = 0; j < n; j++) {
            double acc = 0;
            for (size_t kk = 0; kk < k; kk++)
                acc += (double)mt_bf16_to_f32(a[i * k + kk]) * mt_bf16_to_f32(b[j * k + kk]);
            c[i * n + j] = (float)acc;
        }
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    double n = (double)s->v[D_N], k = (double)s->v[D_K], mm = (double)m;
    *flops = 2.0 * mm * n * k;
    *bytes = 2.0 * (mm * k + n * k) + 4.0 * mm * n;
}

static const kern_case cases[] = {
    {"tiny", 1}, {"tiny", 3}, {"tiny", 17}, {"tiny", 64}, {"N=100,K=72", 5},
};

const kern_family fam_gemm = {
    .name = "gemm",
    .version = 2,
    .summary = "bf16 x bf16^T -> f32 tiled GEMM (shared-memory tiles, split-K)",
    .dims = dims,
    .n_dims = D_COUNT,
    .presets = presets,
    .n_presets = sizeof presets / sizeof presets[0],
    .gpu = &gpu_impl,
    .cpu = &cpu_impl,
    .buffers = buffers,
    .fill = fill,
    .reference = reference,
    .cost = cost,
    .cases = cases,
    .n_cases = sizeof cases / sizeof cases[0],
};
