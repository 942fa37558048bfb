/* fam_rope.c: the `rope` family: GLM-5's interleaved rotary embedding, in
 * place on bf16 rows x [M][H][HD], rotating dims ROFF .. ROFF+R-1 of each
 * head in adjacent pairs (2i, 2i+1) by angle pos[m] * theta^(-2i/R), read
 * from a cos/sin table [P][R] (attn_rope_table: cos of the R/2 angles,
 * then their sin). The kernels only read the table: the model runtime
 * passes its own (model_config_rope_table), which under YaRN holds the
 * scaled frequencies with the attention factor folded into cos and sin;
 * theta only shapes the test table here. Optionally (ln=1) a LayerNorm over the whole head
 * (weight, bias, eps 1e-6) first: the indexer key's k_norm + rope in one
 * pass.
 *
 * Uses at GLM-5.2 widths: q_rope (H=64, HD=256, ROFF=192), the shared rope
 * key of the latent row (H=1, HD=576, ROFF=512), indexer q (H=32, HD=128,
 * ROFF=0) and indexer k with k_norm (H=1, HD=128, ROFF=0, ln=1).
 * transformers' rope_interleave path leaves the rotated pairs permuted into
 * half-split order; q . k is the same, so attention and indexer results
 * agree, and this layout needs no permute. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/attn/attn_common.h"
#include "kernels/core/family.h"
#include "kernels/core/rows.h"

enum { D_H, D_HD, D_ROFF, D_R, D_LN, D_THETA, D_P, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_H] = {"H", KERN_DIM_INT, false, 1, 1024, "heads per token"},
    [D_HD] = {"HD", KERN_DIM_INT, false, 2, 4096, "values per head"},
    [D_ROFF] = {"ROFF", KERN_DIM_INT, false, 0, 4096, "first rotated dim of a head"},
    [D_R] = {"R", KERN_DIM_INT, false, 2, 1024, "rotated dims (even)"},
    [D_LN] = {"ln", KERN_DIM_INT, false, 0, 1, "1: LayerNorm over the head first (k_norm)"},
    [D_THETA] = {"theta", KERN_DIM_INT, false, 1, 1000000000, "rope base (table only)"},
    [D_P] = {"P", KERN_DIM_INT, true, 1, 1 << 24, "rows of the cos/sin table (positions < P)"},
};

static const kern_preset presets[] = {
    {"glm5.2", "H=64,HD=256,ROFF=192,R=64,ln=0,theta=8000000,P=32768"},
    {"tiny", "H=4,HD=48,ROFF=32,R=16,ln=0,theta=10000,P=64"},
    {"glm5.2-kv", "H=1,HD=576,ROFF=512,R=64,ln=0,theta=8000000,P=32768"},
    {"glm5.2-idxq", "H=32,HD=128,ROFF=0,R=64,ln=0,theta=8000000,P=32768"},
    {"glm5.2-idxk", "H=1,HD=128,ROFF=0,R=64,ln=1,theta=8000000,P=32768"},
    {"tiny-idxk", "H=1,HD=32,ROFF=0,R=16,ln=1,theta=10000,P=64"},
};

enum { B_X, B_POS, B_CS, B_GAMMA, B_BETA, B_COUNT };

#define LN_EPS 1e-6

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    (void)m;
    if (s->v[D_R] % 2 || s->v[D_ROFF] + s->v[D_R] > s->v[D_HD]) {
        snprintf(why, cap, "R=%lld must be even and ROFF+R <= HD=%lld", (long long)s->v[D_R],
                 (long long)s->v[D_HD]);
        return false;
    }
    return true;
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return -1;
    size_t hd = (size_t)s->v[D_HD];
    out[B_X] = (kern_buf_desc){"x", KERN_BUF_INOUT, KERN_DT_BF16,
                               (size_t)m * (size_t)s->v[D_H] * hd * 2, (int64_t)hd, 1e-3, 1.6e-2};
    out[B_POS] = (kern_buf_desc){"pos", KERN_BUF_IN, KERN_DT_I32, (size_t)m * 4, 0, 0, 0};
    out[B_CS] = (kern_buf_desc){"cos_sin", KERN_BUF_IN, KERN_DT_F32,
                                (size_t)s->v[D_P] * (size_t)s->v[D_R] * 4, 0, 0, 0};
    out[B_GAMMA] = (kern_buf_desc){"gamma", KERN_BUF_IN, KERN_DT_F32, hd * 4, 0, 0, 0};
    out[B_BETA] = (kern_buf_desc){"beta", KERN_BUF_IN, KERN_DT_F32, hd * 4, 0, 0, 0};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    size_t hd = (size_t)s->v[D_HD];
    /* An offset keeps the LayerNorm's mean removal honest. */
    uint16_t *x = host[B_X];
    for (size_t i = 0; i < (size_t)m * (size_t)s->v[D_H] * hd; i++)
        x[i] = mt_f32_to_bf16(mt_rng_normal(&r) * 2.0f + 0.5f);
    int32_t *pos = host[B_POS];
    for (int64_t i = 0; i < m; i++)
        pos[i] = (int32_t)mt_rng_below(&r, (uint64_t)s->v[D_P]);
    if (m > 1)
        pos[m - 1] = (int32_t)(s->v[D_P] - 1); /* the table's last row */
    attn_rope_table((double)s->v[D_THETA], (int)s->v[D_R], s->v[D_P], host[B_CS]);
    float *g = host[B_GAMMA], *b = host[B_BETA];
    for (size_t i = 0; i < hd; i++) {
        g[i] = mt_rng_uniform(&r, 0.5f, 1.5f);
        b[i] = mt_rng_uniform(&r, -0.2f, 0.2f);
    }
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    int64_t h = s->v[D_H], hd = s->v[D_HD], roff = s->v[D_ROFF], rr = s->v[D_R];
    uint16_t *x = host[B_X];
    const int32_t *pos = host[B_POS];
    const float *cs = host[B_CS], *g = host[B_GAMMA], *b = host[B_BETA];
    double *row = malloc(sizeof(double) * (size_t)hd);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < h; j++) {
            uint16_t *xr = x + (i * h + j) * hd;
            for (int64_t d = 0; d < hd; d++)
                row[d] = mt_bf16_to_f32(xr[d]);
            if (s->v[D_LN]) {
                double mean = 0, var = 0;
                for (int64_t d = 0; d < hd; d++)
                    mean += row[d];
                mean /= (double)hd;
                for (int64_t d = 0; d < hd; d++)
                    var += (row[d] - mean) * (row[d] - mean);
                double rstd = 1.0 / sqrt(var / (double)hd + LN_EPS);
                for (int64_t d = 0; d < hd; d++)
                    row[d] = (row[d] - mean) * rstd * g[d] + b[d];
            }
            attn_rope_rotate(row + roff, (int)rr, cs + (size_t)pos[i] * (size_t)rr);
            for (int64_t d = 0; d < hd; d++)
                if (s->v[D_LN] || (d >= roff && d < roff + rr))
                    xr[d] = mt_f32_to_bf16((float)row[d]);
        }
    free(row);
}

/* Flops: 6 per rotated pair (4 mul, 2 add) and ~8 per value with the
 * LayerNorm. Minimum bytes: the rotated values (whole heads with ln) read
 * and written, positions and the table rows used. */
static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    double h = (double)s->v[D_H], hd = (double)s->v[D_HD], r = (double)s->v[D_R];
    double touched = s->v[D_LN] ? hd : r;
    *flops = (double)m * h * (3.0 * r + (s->v[D_LN] ? 8.0 * hd : 0.0));
    *bytes = (double)m * (h * touched * 4.0 + 4.0 + r * 4.0);
}

/* ---- run ------------------------------------------------------------------------ */

static mt_status run(const kern_ctx *c, mt_err *err)
{
    bool gpu = dev_backend_runs_hip_source(c->props->backend);
    dev_kernel *k;
    mt_status st = kern_get(c, "rope_apply", "pppppi", &k, err);
    if (st != MT_OK)
        return st;
    int m = (int)c->m, tb = kern_config_get(c->impl, c->cfg, "TB", 1);
    void *args[] = {(void *)&c->bufs[B_X], (void *)&c->bufs[B_POS], (void *)&c->bufs[B_CS],
                    (void *)&c->bufs[B_GAMMA], (void *)&c->bufs[B_BETA], &m};
    unsigned nt = gpu ? (unsigned)(kern_config_get(c->impl, c->cfg, "WAVES", 1) *
                                   c->props->warp_size) : 1;
    dev_dim3 grid = {kern_cdiv(m, tb), 1, 1}, block = {nt, 1, 1};
    return dev_launch(c->dev, k, grid, block, 0, args, err);
}

static int gpu_defines(const kern_shape *s, const kern_config *cfg, const dev_props *p,
                       dev_define *out, char (*buf)[64], int cap)
{
    (void)s;
    if (cap < 1)
        return 0;
    snprintf(buf[0], 64, "%d", cfg->v[1] * p->warp_size);
    out[0] = (dev_define){"NT", buf[0]};
    return 1;
}

static const int tb_v[] = {1, 2, 4, 8};
static const int waves_v[] = {1, 2, 4};
static const kern_param_desc gpu_params[] = {
    {"TB", tb_v, 4, "tokens per block"},
    {"WAVES", waves_v, 3, "waves per block (one head per wave at a time)"},
};

static bool gpu_valid(const kern_shape *s, int64_t m, const kern_config *c,
                      const dev_props *p, char *why, size_t cap)
{
    (void)s;
    (void)m;
    int nt = c->v[1] * p->warp_size;
    if (nt > p->max_threads_per_block) {
        snprintf(why, cap, "%d threads exceed the device's %d", nt, p->max_threads_per_block);
        return false;
    }
    return true;
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    c->n = 2;
    c->v[0] = m >= 64 * (int64_t)p->compute_units ? 4 : 1;
    c->v[1] = s->v[D_H] >= 4 ? 4 : 1;
    if (c->v[1] * p->warp_size > p->max_threads_per_block)
        c->v[1] = 1;
}

static const kern_impl gpu_impl = {
    .source = "rope.hip",
    .params = gpu_params,
    .n_params = 2,
    .valid = gpu_valid,
    .default_config = gpu_default,
    .defines = gpu_defines,
    .run = run,
};

static const int cpu_tb_v[] = {1, 4, 16, 64};
static const kern_param_desc cpu_params[] = {
    {"TB", cpu_tb_v, 4, "tokens per work item"},
};

static const kern_impl cpu_impl = {
    .source = "rope.cpu",
    .params = cpu_params,
    .n_params = 1,
    .default_config = kern_rows_cpu_default, /* TB: tokens are the rows */
    .run = run,
};

static const kern_case cases[] = {
    {"tiny", 1},
    {"tiny", 7},
    {"tiny-idxk", 5},
    {"H=3,HD=20,ROFF=6,R=10,ln=0,theta=10000,P=40", 3},
    {"H=2,HD=70,ROFF=0,R=64,ln=1,theta=8000000,P=300", 2},
    {"H=2,HD=256,ROFF=192,R=64,ln=0,theta=8000000,P=20000", 3}, /* glm5.2 widths */
    {"H=1,HD=576,ROFF=512,R=64,ln=0,theta=8000000,P=100", 2},
};

const kern_family fam_rope = {
    .name = "rope",
    .version = 1,
    .summary = "GLM-5 interleaved RoPE in place (optionally after a LayerNorm, for k_norm)",
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
