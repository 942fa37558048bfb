/* fam_moe_route.c: the `moe_route` family, GLM-5 / DeepSeek-V3 routing
 * (transformers' Glm4MoeMoE.route_tokens_to_experts):
 *   logits = x . gate^T in f32 (bf16 x [M, H], bf16 gate [E, H]);
 *   score = sigmoid(logits); choice = score + e_score_correction_bias
 *   (the bias is used for selection only);
 *   group-limited selection: with ngroup > 1 each group scores the sum of
 *   its two best choices and only the topkg best groups stay eligible;
 *   ids = the topk best choices in descending order, ties broken toward
 *   the LOWER expert id (also for groups);
 *   w = score[ids] (unbiased), divided by (sum + 1e-20) when norm=1, times
 *   routed_scaling_factor (dim rsf in thousandths: 2500 = 2.5).
 * Outputs ids [M, topk] int32 and w [M, topk] f32. The comparison accepts
 * a different order or choice only where the reference's biased scores
 * are within 1e-5 of each other (float vs double logits). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/moe/moe_common.h"

enum { D_H, D_E, D_TOPK, D_NGROUP, D_TOPKG, D_RSF, D_NORM, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_H] = {"H", KERN_DIM_INT, false, 1, 65536, "hidden size"},
    [D_E] = {"E", KERN_DIM_INT, false, 2, 1024, "routed experts"},
    [D_TOPK] = {"topk", KERN_DIM_INT, false, 1, 32, "experts per token"},
    [D_NGROUP] = {"ngroup", KERN_DIM_INT, false, 1, 64, "expert groups (n_group)"},
    [D_TOPKG] = {"topkg", KERN_DIM_INT, false, 1, 64, "groups kept (topk_group)"},
    [D_RSF] = {"rsf", KERN_DIM_INT, false, 0, 1000000, "routed_scaling_factor x 1000"},
    [D_NORM] = {"norm", KERN_DIM_INT, false, 0, 1, "norm_topk_prob"},
};

static const kern_preset presets[] = {
    {"glm5.2", "H=6144,E=256,topk=8,ngroup=1,topkg=1,rsf=2500,norm=1"},
    {"tiny", "H=256,E=16,topk=4,ngroup=1,topkg=1,rsf=2500,norm=1"},
    {"tiny-groups", "H=256,E=32,topk=4,ngroup=4,topkg=2,rsf=2500,norm=1"},
};

enum { B_X, B_GATE, B_BIAS, B_IDS, B_W, B_COUNT };

static moe_route_dims rdims(const kern_shape *s)
{
    return (moe_route_dims){.h = s->v[D_H], .e = s->v[D_E], .topk = (int)s->v[D_TOPK],
                            .ngroup = (int)s->v[D_NGROUP], .topkg = (int)s->v[D_TOPKG],
                            .scale = (float)s->v[D_RSF] / 1000.0f, .norm = s->v[D_NORM] != 0};
}

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    (void)m;
    int64_t E = s->v[D_E], g = s->v[D_NGROUP], tg = s->v[D_TOPKG];
    if (E % g || (g > 1 && E / g < 2)) {
        snprintf(why, cap, "E=%lld must split into ngroup=%lld groups of at least two",
                 (long long)E, (long long)g);
        return false;
    }
    if (tg > g || s->v[D_TOPK] > tg * (E / g)) {
        snprintf(why, cap, "topk=%lld exceeds the experts of topkg=%lld groups",
                 (long long)s->v[D_TOPK], (long long)tg);
        return false;
    }
    return true;
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return 0;
    int64_t H = s->v[D_H], E = s->v[D_E], K = s->v[D_TOPK];
    out[B_X] = (kern_buf_desc){"x", KERN_BUF_IN, KERN_DT_BF16, (size_t)(m * H) * 2, H, 0, 0};
    out[B_GATE] = (kern_buf_desc){"gate", KERN_BUF_IN, KERN_DT_BF16, (size_t)(E * H) * 2, H, 0, 0};
    out[B_BIAS] = (kern_buf_desc){"bias", KERN_BUF_IN, KERN_DT_F32, (size_t)E * 4, 0, 0, 0};
    out[B_IDS] = (kern_buf_desc){"topk_ids", KERN_BUF_OUT, KERN_DT_I32, (size_t)(m * K) * 4, K, 0, 0};
    out[B_W] = (kern_buf_desc){"topk_w", KERN_BUF_OUT, KERN_DT_F32, (size_t)(m * K) * 4, K, 1e-6, 1e-4};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    int64_t H = s->v[D_H], E = s->v[D_E];
    /* logits of a few units: sigmoid neither saturated nor flat */
    moe_gen_bf16(&r, host[B_X], m * H, 1.0f);
    moe_gen_bf16(&r, host[B_GATE], E * H, 2.0f / sqrtf((float)H));
    float *b = host[B_BIAS];
    for (int64_t e = 0; e < E; e++)
        b[e] = mt_rng_uniform(&r, -0.1f, 0.1f);
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    moe_route_dims d = rdims(s);
    for (int64_t t = 0; t < m; t++)
        moe_route_ref_token(&d, (const uint16_t *)host[B_X] + t * d.h, host[B_GATE],
                            host[B_BIAS], (int32_t *)host[B_IDS] + t * d.topk,
                            (float *)host[B_W] + t * d.topk, NULL, NULL);
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* True when token t's reference choices hold a near tie that could change
 * the selection or its order: among the topk+1 best, consecutive values
 * within tol. */
static bool near_tie(const double *choice, int64_t E, int topk, double tol)
{
    double *c = malloc(sizeof(double) * (size_t)E);
    memcpy(c, choice, sizeof(double) * (size_t)E);
    qsort(c, (size_t)E, sizeof *c, cmp_desc);
    bool tie = false;
    for (int j = 0; j + 1 < E && j < topk; j++)
        tie |= fabs(c[j] - c[j + 1]) < tol;
    free(c);
    return tie;
}

static bool compare(const kern_shape *s, int64_t m, int b, const void *got,
                    void *const *host_ref, char *why, size_t cap)
{
    moe_route_dims d = rdims(s);
    const double tol = 1e-5;
    double *choice = malloc(sizeof(double) * (size_t)d.e * 2), *score = choice + d.e;
    int32_t ids[32];
    float w[32];
    bool ok = true;
    for (int64_t t = 0; t < m && ok; t++) {
        moe_route_ref_token(&d, (const uint16_t *)host_ref[B_X] + t * d.h, host_ref[B_GATE],
                            host_ref[B_BIAS], ids, w, choice, score);
        bool tie = near_tie(choice, d.e, d.topk, tol);
        for (int j = 0; j < d.topk && ok; j++) {
            if (b == B_IDS) {
                int32_t g = ((const int32_t *)got)[t * d.topk + j];
                if (g == ids[j])
                    continue;
                if (tie && g >= 0 && g < d.e && fabs(choice[g] - choice[ids[j]]) < tol)
                    continue;
                snprintf(why, cap, "topk_ids token %lld slot %d: got expert %d, expected %d "
                         "(biased scores %.8f vs %.8f)", (long long)t, j, g, ids[j],
                         g >= 0 && g < d.e ? choice[g] : NAN, choice[ids[j]]);
                ok = false;
            } else {
                float g = ((const float *)got)[t * d.topk + j];
                /* On a near tie the weights belong to another selection:
                 * check they are a valid distribution only. */
                double want = tie ? g : w[j];
                if (tie && (!(g >= 0.0f) || g > d.scale * 1.0001f)) {
                    snprintf(why, cap, "topk_w token %lld slot %d: %g outside [0, %g]",
                             (long long)t, j, g, d.scale);
                    ok = false;
                } else if (!(fabs(g - want) <= 1e-6 + 1e-4 * fabs(want))) {
                    snprintf(why, cap, "topk_w token %lld slot %d: got %.8g, expected %.8g",
                             (long long)t, j, g, want);
                    ok = false;
                }
            }
        }
    }
    free(choice);
    return ok;
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    int64_t H = s->v[D_H], E = s->v[D_E];
    *flops = 2.0 * (double)(m * E * H);
    *bytes = (double)(E * H * 2 + m * H * 2 + E * 4 + m * s->v[D_TOPK] * 8);
}

static mt_status launch(const kern_ctx *c, const char *sig, dev_dim3 grid, dev_dim3 block,
                        size_t shared, mt_err *err)
{
    dev_kernel *k;
    mt_status st = kern_get(c, "moe_route", sig, &k, err);
    if (st != MT_OK)
        return st;
    float rsf = (float)c->shape->v[D_RSF] / 1000.0f;
    int32_t m = (int32_t)c->m;
    void *x = c->bufs[B_X], *g = c->bufs[B_GATE], *bi = c->bufs[B_BIAS], *ids = c->bufs[B_IDS],
         *w = c->bufs[B_W];
    void *args[] = {&x, &g, &bi, &ids, &w, &rsf, &m};
    return dev_launch(c->dev, k, grid, block, shared, args, err);
}

/* ---- gpu --------------------------------------------------------------- */

enum { P_WAVES, P_VEC, P_TPB, P_EPB, P_KS, P_COUNT };
static const int waves_vals[] = {1, 2, 4, 8};
static const int vec_vals[] = {1, 2, 4, 8};
static const int tpb_vals[] = {0, 1, 4, 8};
static const int epb_vals[] = {4, 8, 16, 32};
static const int ks_vals[] = {1, 2, 4, 8};
static const kern_param_desc gpu_params[P_COUNT] = {
    [P_WAVES] = {"WAVES", waves_vals, 4, "waves per block"},
    [P_VEC] = {"VEC", vec_vals, 4, "consecutive H elements per lane per step"},
    [P_TPB] = {"TPB", tpb_vals, 4,
               "tokens per block of the multi-block logits GEMV; 0: one block per token "
               "computes its logits and selects"},
    [P_EPB] = {"EPB", epb_vals, 4, "experts per block of the logits GEMV (TPB > 0)"},
    [P_KS] = {"KS", ks_vals, 4,
              "K slices of the logits GEMV, one block each (TPB > 0); the select kernel "
              "adds the partial logits in slice order"},
};

/* Dynamic shared memory of the largest kernel of the config's path. */
static size_t gpu_shared(const kern_shape *s, const kern_config *cfg)
{
    size_t sel = (size_t)(2 * s->v[D_E] + 2 * s->v[D_NGROUP] + 64) * 4;
    return cfg->v[P_TPB] ? sel : sel + (size_t)s->v[D_H] * 4;
}

static size_t gpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    return cfg->v[P_TPB] ? (size_t)(cfg->v[P_KS] * m * s->v[D_E]) * 4 : 0;
}

/* H elements per K slice, as moe_route.hip's R_KC: whole 64 * VEC runs. */
static int64_t slice_len(const kern_shape *s, const kern_config *cfg)
{
    int64_t run = 64 * (int64_t)cfg->v[P_VEC];
    return kern_cdiv(kern_cdiv(s->v[D_H], cfg->v[P_KS]), run) * run;
}

static bool gpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg,
                      const dev_props *p, char *why, size_t cap)
{
    (void)m;
    int threads = cfg->v[P_WAVES] * p->warp_size;
    if (threads > p->max_threads_per_block) {
        snprintf(why, cap, "WAVES=%d: %d threads, the device allows %d", cfg->v[P_WAVES],
                 threads, p->max_threads_per_block);
        return false;
    }
    if (gpu_shared(s, cfg) > p->shared_mem_per_block) {
        snprintf(why, cap, "needs %zu bytes of shared memory, the device has %zu",
                 gpu_shared(s, cfg), p->shared_mem_per_block);
        return false;
    }
    if (!cfg->v[P_TPB] && cfg->v[P_EPB] != epb_vals[0]) {
        snprintf(why, cap, "EPB=%d: only the multi-block path (TPB > 0) uses it",
                 cfg->v[P_EPB]);
        return false;
    }
    if (!cfg->v[P_TPB] && cfg->v[P_KS] != 1) {
        snprintf(why, cap, "KS=%d: only the multi-block path (TPB > 0) uses it", cfg->v[P_KS]);
        return false;
    }
    if ((cfg->v[P_KS] - 1) * slice_len(s, cfg) >= s->v[D_H]) {
        snprintf(why, cap, "KS=%d: slices of %lld elements (whole runs of 64 x VEC=%d) leave "
                 "the last of H=%lld empty", cfg->v[P_KS], (long long)slice_len(s, cfg),
                 cfg->v[P_VEC], (long long)s->v[D_H]);
        return false;
    }
    return true;
}

/* Few tokens: the multi-block GEMV, so the gate streams through many CUs
 * (at M = 1 the one-block path runs on one CU), with K slices until the
 * grid has two blocks per CU (a compile-only device, which knows no CU
 * count, counts as 256 CUs), at most KS = 8: 256 x 6144 at M = 1 is 32
 * blocks x KS = 8. Many tokens: one block per token fills the device. */
static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    cfg->n = P_COUNT;
    cfg->v[P_WAVES] = p->warp_size * 4 <= p->max_threads_per_block ? 4 : 1;
    cfg->v[P_VEC] = 4;
    cfg->v[P_TPB] = m > 32 ? 0 : m > 4 ? 8 : m > 1 ? 4 : 1;
    cfg->v[P_EPB] = cfg->v[P_TPB] ? 8 : epb_vals[0];
    cfg->v[P_KS] = 1;
    if (!cfg->v[P_TPB])
        return;
    int64_t blocks = (int64_t)kern_cdiv(s->v[D_E], cfg->v[P_EPB]) * kern_cdiv(m, cfg->v[P_TPB]);
    int64_t cus = p->compute_units > 0 ? p->compute_units : 256;
    while (cfg->v[P_KS] < ks_vals[3] && blocks * cfg->v[P_KS] < 2 * cus) {
        cfg->v[P_KS] *= 2;
        if ((cfg->v[P_KS] - 1) * slice_len(s, cfg) >= s->v[D_H]) { /* a slice would be empty */
            cfg->v[P_KS] /= 2;
            break;
        }
    }
}

/* The two-launch path, GPU and cpu alike: `scores` writes the gate's
 * logits or scores into scratch over grid_l, then `pick` selects per token
 * over grid_s. */
static mt_status launch_split(const kern_ctx *c, const char *scores, const char *pick,
                              dev_dim3 grid_l, dev_dim3 grid_s, dev_dim3 block, size_t shared_s,
                              mt_err *err)
{
    dev_kernel *kl, *ks;
    mt_status st = kern_get(c, scores, "pppi", &kl, err);
    if (st == MT_OK)
        st = kern_get(c, pick, "ppppfi", &ks, err);
    if (st != MT_OK)
        return st;
    float rsf = (float)c->shape->v[D_RSF] / 1000.0f;
    int32_t m = (int32_t)c->m;
    void *x = c->bufs[B_X], *g = c->bufs[B_GATE], *bi = c->bufs[B_BIAS], *ids = c->bufs[B_IDS],
         *w = c->bufs[B_W], *sc = c->scratch;
    void *al[] = {&x, &g, &sc, &m};
    void *as[] = {&sc, &bi, &ids, &w, &rsf, &m};
    st = dev_launch(c->dev, kl, grid_l, block, 0, al, err);
    if (st == MT_OK)
        st = dev_launch(c->dev, ks, grid_s, block, shared_s, as, err);
    return st;
}

static mt_status gpu_run(const kern_ctx *c, mt_err *err)
{
    const kern_config *cfg = c->cfg;
    unsigned threads = (unsigned)(cfg->v[P_WAVES] * c->props->warp_size);
    if (!cfg->v[P_TPB]) /* one block per token: the GPU kernel takes no m */
        return launch(c, "pppppf", (dev_dim3){(unsigned)c->m, 1, 1}, (dev_dim3){threads, 1, 1},
                      gpu_shared(c->shape, cfg), err);
    dev_dim3 grid = {kern_cdiv(c->shape->v[D_E], cfg->v[P_EPB]), kern_cdiv(c->m, cfg->v[P_TPB]),
                     (unsigned)cfg->v[P_KS]};
    return launch_split(c, "moe_route_logits", "moe_route_select", grid,
                        (dev_dim3){(unsigned)c->m, 1, 1}, (dev_dim3){threads, 1, 1},
                        gpu_shared(c->shape, cfg), err);
}

static const kern_impl gpu_impl = {
    .source = "moe_route.hip",
    .params = gpu_params,
    .n_params = P_COUNT,
    .valid = gpu_valid,
    .default_config = gpu_default,
    .scratch_bytes = gpu_scratch,
    .run = gpu_run,
};

/* ---- cpu --------------------------------------------------------------- */

static const int tb_vals[] = {1, 2, 4, 8};
static const int eb_vals[] = {4, 8, 16};
static const int es_vals[] = {0, 16, 64};
static const kern_param_desc cpu_params[] = {
    {"TB", tb_vals, 4, "tokens per work item (gate rows reused across them)"},
    {"EB", eb_vals, 3, "f32 accumulator lanes per dot product"},
    {"ES", es_vals, 3, "experts per scoring work item, then a selection launch "
                       "(0: one launch, each item scores every expert)"},
};

/* Up to 16 tokens: the experts split over work items (one item per token
 * would stream the whole gate once per token, on one thread at M = 1), 16
 * experts an item up to 8 tokens, 64 up to 16, every token of the launch
 * in one item (TB up to 8: each gate row loaded once); with 4 tokens an
 * item or fewer, two accumulator chains a token (EB 16) instead of one, or
 * the dots wait on the FMA latency. Many tokens: items of 4 tokens (EB 16
 * too), no split. Tuned on the 2-core Zen 5 VM at glm5.2 against the rule
 * before (TB 1 below 16 tokens, EB 8, a split only below 2 tokens a
 * thread): M = 1 3.4x, 2 3.6x, 4 5.6x, 8 6.5x, 16 1.16x faster; at M = 256
 * the rule's TB 4, EB 16, no split was the tuner's best. */
static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    cfg->n = 3;
    int threads = p->compute_units > 0 ? p->compute_units : 1;
    bool split = m <= 16 && s->v[D_E] >= 2 * 16 * threads;
    int tb = m >= 8 ? 8 : m >= 4 ? 4 : m >= 2 ? 2 : 1;
    cfg->v[0] = split ? tb : m >= 16 ? 4 : 1;
    cfg->v[1] = cfg->v[0] <= 4 ? 16 : 8;
    cfg->v[2] = !split ? 0 : m <= 8 ? 16 : 64;
}

static size_t cpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    return cfg->v[2] ? (size_t)(m * s->v[D_E]) * 4 : 0;
}

static mt_status cpu_run(const kern_ctx *c, mt_err *err)
{
    const kern_config *cfg = c->cfg;
    if (!cfg->v[2])
        return launch(c, "pppppfi", (dev_dim3){kern_cdiv(c->m, cfg->v[0]), 1, 1},
                      (dev_dim3){1, 1, 1}, 0, err);
    unsigned items = kern_cdiv(c->m, cfg->v[0]);
    return launch_split(c, "moe_route_scores", "moe_route_pick",
                        (dev_dim3){kern_cdiv(c->shape->v[D_E], cfg->v[2]), items, 1},
                        (dev_dim3){items, 1, 1}, (dev_dim3){1, 1, 1}, 0, err);
}

static const kern_impl cpu_impl = {
    .source = "moe_route.cpu",
    .params = cpu_params,
    .n_params = 3,
    .default_config = cpu_default,
    .scratch_bytes = cpu_scratch,
    .run = cpu_run,
};

static const kern_case cases[] = {
    {"tiny", 1}, {"tiny", 3}, {"tiny", 17}, {"tiny", 64}, {"tiny-groups", 17},
    {"H=200,E=8,topk=1,ngroup=1,topkg=1,rsf=1000,norm=0", 5},
    {"H=256,E=64,topk=8,ngroup=8,topkg=4,rsf=2500,norm=1", 3},
    /* E not a multiple of EPB, M not a multiple of TPB (multi-block path) */
    {"H=200,E=12,topk=2,ngroup=1,topkg=1,rsf=1000,norm=1", 9},
};

const kern_family fam_moe_route = {
    .name = "moe_route",
    .version = 3,
    .summary = "GLM-5 router: sigmoid scores, bias for selection, group-limited top-k",
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
