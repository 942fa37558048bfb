/* moe_gemm_family.h: what the two MoE GEMM families share, internal to
 * kernels/moe_gemm: fam_moe_gemm_up.c (stage 1, K = H, N = I, one
 * activation row per token) and fam_moe_gemm_down.c (stage 2, K = I,
 * N = H, one activation row per routed pair). Both have the same dims in
 * the same order (the sixth is each stage's own: cat, comb), the same
 * first five buffers (activations, topk_ids and the aligned layout), the
 * same shape rule, and cpu and GPU configs that differ between the stages
 * only in K, N and the stage flag moe_common.h's functions take. The
 * functions that serve both stages take it as `up` (true: stage 1); the
 * kern_impl callbacks come as a pair, mg_up_* and mg_down_*, and
 * MG_FAMILY builds a stage's kern_family around them. All are pure apart
 * from their outputs and the launches they issue: thread-safe as the
 * kern_impl callbacks they serve. */
#ifndef MT_KERN_MOE_GEMM_FAMILY_H
#define MT_KERN_MOE_GEMM_FAMILY_H

#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/moe/moe_common.h"

/* Dims in key order (persisted in shape keys). */
enum {
    MG_D_H,
    MG_D_I,
    MG_D_E,
    MG_D_TOPK,
    MG_D_A,
    MG_D_CAT, /* stage 1: gate and up concatenated; stage 2 names it comb */
    MG_D_WL,
    MG_D_BM,
    MG_D_SKEW,
    MG_D_COUNT,
    MG_D_COMB = MG_D_CAT,
};

/* A family's dims[MG_D_COUNT] less its sixth dim, as designated
 * initializers: H and I with the stage's help texts (which of them is K),
 * then the dims both stages describe alike. */
#define MG_DIMS(h_help, i_help)                                                              \
    [MG_D_H] = {"H", KERN_DIM_INT, false, 128, 65536, h_help},                               \
    [MG_D_I] = {"I", KERN_DIM_INT, false, 128, 65536, i_help},                               \
    [MG_D_E] = {"E", KERN_DIM_INT, false, 1, 1024, "routed experts"},                       \
    [MG_D_TOPK] = {"topk", KERN_DIM_INT, false, 1, 32, "experts per token"},                 \
    [MG_D_A] = {"a", KERN_DIM_DTYPE, false, 0, 0,                                            \
                "activations: bf16 (a16w4), mxfp4 (a4w4) or i8 (a8w4, cpu only), the last "  \
                "two quantized per 32-block"},                                               \
    [MG_D_WL] = {"wl", KERN_DIM_INT_OPT, false, 0, 1,                                        \
                 "weight layout: 0 Quark rows; 1 rows grouped by 16 (the cpu tiles' "        \
                 "layout, made at load time; cpu only; moe_w4_group16)"},                    \
    [MG_D_BM] = {"bm", KERN_DIM_INT, true, 16, 256,                                          \
                 "tile height moe_align padded each expert's segment to"},                   \
    [MG_D_SKEW] = {"skew", KERN_DIM_INT, true, 0, 2,                                         \
                   "routing of generated problems: 0 uniform, 1 every token on expert E-1, " \
                   "2 only 2*topk experts used"}

/* The first buffers of both stages: the bf16 activations (stage 1: x
 * [M, H]; stage 2: h [pairs, I]), topk_ids, then the aligned layout.
 * MG_B_STAGE is the first of the stage's own. */
enum { MG_B_ACT, MG_B_IDS, MG_B_SORTED, MG_B_TILE, MG_B_TOTAL, MG_B_STAGE };

/* The reduction length K and the output rows per expert N of a stage. */
static inline int64_t mg_k(const kern_shape *s, bool up) { return s->v[up ? MG_D_H : MG_D_I]; }
static inline int64_t mg_n(const kern_shape *s, bool up) { return s->v[up ? MG_D_I : MG_D_H]; }
/* Activation rows: tokens at stage 1, routed pairs at stage 2. */
static inline int64_t mg_act_rows(const kern_shape *s, int64_t m, bool up)
{
    return up ? m : m * s->v[MG_D_TOPK];
}

/* The shape as moe_common.h's references take it. */
moe_gemm_dims mg_gemm_dims(const kern_shape *s);

/* kern_family.shape_ok of both stages: a dtype they have, H and I
 * multiples of 128, topk <= E, bm a power of two. */
bool mg_shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap);

/* Writes the MG_B_STAGE first buffers to out (which holds that many) and
 * returns MG_B_STAGE. */
int mg_buffers(const kern_shape *s, int64_t m, bool up, kern_buf_desc *out);
/* Fills the first buffers from r: activations, routing by the shape's
 * skew, and the aligned layout of that routing (in that order: r's draws
 * are part of the problem). */
void mg_fill(const kern_shape *s, int64_t m, bool up, mt_rng *r, void *const *host);
/* Cost-model share of the experts m tokens touch. */
double mg_used_experts(const kern_shape *s, int64_t m);

/* ---- the stages' kern_impl callbacks ---------------------------------------
 * valid, default_config, defines and scratch_bytes of both impls, for
 * stage 1 (mg_up_*) and stage 2 (mg_down_*): moe_common.h's rules for the
 * stage's K, N and flag. On GPUs a=i8 and wl=1 are invalid (the cpu
 * kernels' alone); the scratch is the config's partials (mg_gpu_partials),
 * then for a4w4 the activations moe_act_quant writes. */

bool mg_up_cpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg, const dev_props *p,
                     char *why, size_t cap);
bool mg_down_cpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg,
                       const dev_props *p, char *why, size_t cap);
void mg_up_cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg);
void mg_down_cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg);
size_t mg_up_cpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg);
size_t mg_down_cpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg);

bool mg_up_gpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg, const dev_props *p,
                     char *why, size_t cap);
bool mg_down_gpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg,
                       const dev_props *p, char *why, size_t cap);
int mg_up_gpu_defines(const kern_shape *s, const kern_config *cfg, const dev_props *p,
                      dev_define *out, char (*buf)[64], int cap);
int mg_down_gpu_defines(const kern_shape *s, const kern_config *cfg, const dev_props *p,
                        dev_define *out, char (*buf)[64], int cap);
size_t mg_up_gpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg);
size_t mg_down_gpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg);
void mg_up_gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg);
void mg_down_gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg);

/* ---- the families ----------------------------------------------------------
 * The kern_family initializer of a stage, so that what both stages fill
 * alike (the impls' sources, parameters and config callbacks, the shape
 * rule, the dim count) is written once. stage is up or down and picks the
 * callbacks mg_<stage>_* above; the family file passes its own pieces:
 * name, version and summary, its dims, presets and cases (arrays), its
 * buffers, fill, reference and cost, and each impl's run and order_varies
 * (NULL: every config sums in a fixed order). The impls are compound
 * literals at file scope: static, like the family. */
#define MG_FAMILY(stage, name_, version_, summary_, dims_, presets_, cases_, buffers_, fill_,    \
                  reference_, cost_, cpu_run, cpu_order_varies, gpu_run, gpu_order_varies)       \
    {                                                                                           \
        .name = name_, .version = version_, .summary = summary_, .dims = dims_,                 \
        .n_dims = MG_D_COUNT, .presets = presets_,                                              \
        .n_presets = sizeof presets_ / sizeof presets_[0],                                      \
        .gpu = &(const kern_impl){.source = "moe_gemm.hip", .params = moe_gpu_params,           \
                                  .n_params = MOE_GPU_NPARAMS, .valid = mg_##stage##_gpu_valid, \
                                  .default_config = mg_##stage##_gpu_default,                   \
                                  .defines = mg_##stage##_gpu_defines,                          \
                                  .scratch_bytes = mg_##stage##_gpu_scratch, .run = gpu_run,    \
                                  .order_varies = gpu_order_varies},                            \
        .cpu = &(const kern_impl){.source = "moe_gemm.cpu", .params = moe_cpu_params,           \
                                  .n_params = MOE_CPU_NPARAMS, .valid = mg_##stage##_cpu_valid, \
                                  .default_config = mg_##stage##_cpu_default,                   \
                                  .scratch_bytes = mg_##stage##_cpu_scratch, .run = cpu_run,    \
                                  .order_varies = cpu_order_varies},                            \
        .shape_ok = mg_shape_ok, .buffers = buffers_, .fill = fill_, .reference = reference_,   \
        .cost = cost_, .cases = cases_, .n_cases = sizeof cases_ / sizeof cases_[0],            \
    }

/* ---- launches -------------------------------------------------------------- */

/* cpu (moe_gemm.cpu): looks up the stage's kernel `name` (signature sig),
 * runs moe_prep on the activations into c->scratch, then the stage's
 * kernel with args over N / NT x tiles of bm pairs. args[0] must point at
 * the scratch pointer. Stops at the first failure, whose status it
 * returns. */
mt_status mg_cpu_run(const kern_ctx *c, bool up, const char *name, const char *sig, void **args,
                     mt_err *err);

/* GPU (moe_gemm.hip): whether cfg's launch writes partials [SPLITK][pairs]
 * [row] to the scratch for a finish pass to sum: at stage 1 when K is
 * split (rows of 2I, gate and up); at stage 2 on the decode path (GEMV)
 * for comb=0 always (y gets no atomics), for comb=1 when K is split (rows
 * of H). */
bool mg_gpu_partials(const kern_shape *s, bool up, const kern_config *cfg);
/* Row tiles of the launch: of BM rows, or of the layout's bm on the
 * decode path (GEMV). */
int32_t mg_gpu_tiles(const kern_ctx *c);
/* For a4w4, quantizes the activations into the scratch after the
 * partials (*q, *qs: the codes and scales); otherwise sets them to NULL
 * and launches nothing. */
mt_status mg_gpu_act_quant(const kern_ctx *c, bool up, void **q, void **qs, mt_err *err);
/* Looks up the stage's kernel `name` (signature sig) and launches it with
 * args: over the decode path's blocks or tiles x N / BN, SPLITK deep. */
mt_status mg_gpu_launch(const kern_ctx *c, bool up, const char *name, const char *sig,
                        void **args, mt_err *err);
/* Looks up kernel `name` (signature sig) and launches it with args over
 * n elements, 256 a block: the pass that sums the partials. */
mt_status mg_gpu_finish(const kern_ctx *c, const char *name, const char *sig, void **args,
                        int64_t n, mt_err *err);

#endif
