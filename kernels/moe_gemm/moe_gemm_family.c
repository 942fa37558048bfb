/* moe_gemm_family.c: the shape rule, the routed inputs and the configs and
 * launches both MoE GEMM families share (see moe_gemm_family.h). */
#include "moe_gemm_family.h"

#include <stdio.h>

moe_gemm_dims mg_gemm_dims(const kern_shape *s)
{
    return (moe_gemm_dims){.h = s->v[MG_D_H], .i = s->v[MG_D_I], .e = s->v[MG_D_E],
                           .topk = (int)s->v[MG_D_TOPK], .a4 = s->v[MG_D_A] == KERN_DT_MXFP4,
                           .a8 = s->v[MG_D_A] == KERN_DT_I8};
}

bool mg_shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    (void)m;
    kern_dtype a = (kern_dtype)s->v[MG_D_A];
    if (a != KERN_DT_BF16 && a != KERN_DT_MXFP4 && a != KERN_DT_I8) {
        snprintf(why, cap, "a=%s: activations are bf16, mxfp4 or i8", kern_dtype_name(a));
        return false;
    }
    if (s->v[MG_D_H] % 128 || s->v[MG_D_I] % 128) {
        snprintf(why, cap, "H=%lld and I=%lld must be multiples of 128",
                 (long long)s->v[MG_D_H], (long long)s->v[MG_D_I]);
        return false;
    }
    if (s->v[MG_D_TOPK] > s->v[MG_D_E]) {
        snprintf(why, cap, "topk=%lld exceeds E=%lld", (long long)s->v[MG_D_TOPK],
                 (long long)s->v[MG_D_E]);
        return false;
    }
    if (s->v[MG_D_BM] & (s->v[MG_D_BM] - 1)) {
        snprintf(why, cap, "bm=%lld is not a power of two", (long long)s->v[MG_D_BM]);
        return false;
    }
    return true;
}

int mg_buffers(const kern_shape *s, int64_t m, bool up, kern_buf_desc *out)
{
    int64_t P = m * s->v[MG_D_TOPK], rows = mg_act_rows(s, m, up), k = mg_k(s, up);
    int n = 0;
    out[n++] = (kern_buf_desc){up ? "x" : "h", KERN_BUF_IN, KERN_DT_BF16, (size_t)(rows * k) * 2,
                               k, 0, 0};
    out[n++] = (kern_buf_desc){"topk_ids", KERN_BUF_IN, KERN_DT_I32, (size_t)P * 4, 0, 0, 0};
    moe_layout_bufs(P, moe_cap_rows(P, s->v[MG_D_E], s->v[MG_D_BM]), s->v[MG_D_BM], out, &n);
    return n;
}

void mg_fill(const kern_shape *s, int64_t m, bool up, mt_rng *r, void *const *host)
{
    int topk = (int)s->v[MG_D_TOPK], E = (int)s->v[MG_D_E];
    moe_gen_bf16(r, host[MG_B_ACT], mg_act_rows(s, m, up) * mg_k(s, up), 1.0f);
    moe_gen_ids(r, m, topk, E, (int)s->v[MG_D_SKEW], host[MG_B_IDS]);
    moe_align_ref(host[MG_B_IDS], m * topk, E, (int)s->v[MG_D_BM], host[MG_B_SORTED],
                  host[MG_B_TILE], host[MG_B_TOTAL]);
}

double mg_used_experts(const kern_shape *s, int64_t m)
{
    return moe_expected_experts(s->v[MG_D_E], s->v[MG_D_TOPK], m);
}

/* ---- the stages' kern_impl callbacks --------------------------------------- */

static bool cpu_valid(const kern_shape *s, bool up, const kern_config *cfg, char *why, size_t cap)
{
    return moe_cpu_valid(mg_k(s, up), mg_n(s, up), (int)s->v[MG_D_WL], cfg, why, cap);
}

static void cpu_default(const kern_shape *s, int64_t m, bool up, const dev_props *p,
                        kern_config *cfg)
{
    moe_cpu_default(mg_k(s, up), mg_n(s, up), m * s->v[MG_D_TOPK], s->v[MG_D_E], up,
                    s->v[MG_D_A] != KERN_DT_BF16, (int)s->v[MG_D_WL], p, cfg);
}

/* The prepared activations moe_prep writes to the scratch. */
static size_t cpu_scratch(const kern_shape *s, int64_t m, bool up)
{
    return moe_cpu_act_bytes(mg_act_rows(s, m, up), mg_k(s, up));
}

static bool gpu_valid(const kern_shape *s, bool up, const kern_config *cfg, const dev_props *p,
                      char *why, size_t cap)
{
    if (s->v[MG_D_A] == KERN_DT_I8) {
        snprintf(why, cap, "a=i8 (a8w4) has a cpu kernel only");
        return false;
    }
    if (s->v[MG_D_WL]) {
        snprintf(why, cap, "wl=1 (rows grouped by 16) is the cpu kernels' layout");
        return false;
    }
    return moe_gpu_valid(mg_k(s, up), mg_n(s, up), s->v[MG_D_BM], up,
                         up ? 0 : (int)s->v[MG_D_COMB], s->v[MG_D_A] == KERN_DT_MXFP4, cfg, p,
                         why, cap);
}

static void gpu_default(const kern_shape *s, int64_t m, bool up, const dev_props *p,
                        kern_config *cfg)
{
    moe_gpu_default(mg_k(s, up), mg_n(s, up), s->v[MG_D_BM], up, up ? 0 : (int)s->v[MG_D_COMB],
                    s->v[MG_D_A] == KERN_DT_MXFP4, m * s->v[MG_D_TOPK], s->v[MG_D_E], p, cfg);
}

bool mg_gpu_partials(const kern_shape *s, bool up, const kern_config *cfg)
{
    int sk = cfg->v[MOE_GPU_SPLITK];
    if (up)
        return sk > 1;
    return cfg->v[MOE_GPU_GEMV] && (!s->v[MG_D_COMB] || sk > 1);
}

static size_t partial_bytes(const kern_shape *s, int64_t m, bool up, const kern_config *cfg)
{
    if (!mg_gpu_partials(s, up, cfg))
        return 0;
    int64_t row = up ? 2 * s->v[MG_D_I] : s->v[MG_D_H];
    return (size_t)cfg->v[MOE_GPU_SPLITK] * (size_t)(m * s->v[MG_D_TOPK]) * (size_t)row * 4;
}

static size_t gpu_scratch(const kern_shape *s, int64_t m, bool up, const kern_config *cfg)
{
    size_t part = partial_bytes(s, m, up, cfg);
    if (s->v[MG_D_A] != KERN_DT_MXFP4)
        return part;
    return moe_gpu_act_offset(part) + moe_gpu_act_bytes(mg_act_rows(s, m, up), mg_k(s, up), cfg);
}

/* The callbacks of each stage, side by side: the first of each pair
 * stage 1's. */

bool mg_up_cpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg, const dev_props *p,
                     char *why, size_t cap)
{
    (void)m;
    (void)p;
    return cpu_valid(s, true, cfg, why, cap);
}

bool mg_down_cpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg,
                       const dev_props *p, char *why, size_t cap)
{
    (void)m;
    (void)p;
    return cpu_valid(s, false, cfg, why, cap);
}

void mg_up_cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    cpu_default(s, m, true, p, cfg);
}

void mg_down_cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    cpu_default(s, m, false, p, cfg);
}

size_t mg_up_cpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    (void)cfg;
    return cpu_scratch(s, m, true);
}

size_t mg_down_cpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    (void)cfg;
    return cpu_scratch(s, m, false);
}

bool mg_up_gpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg, const dev_props *p,
                     char *why, size_t cap)
{
    (void)m;
    return gpu_valid(s, true, cfg, p, why, cap);
}

bool mg_down_gpu_valid(const kern_shape *s, int64_t m, const kern_config *cfg,
                       const dev_props *p, char *why, size_t cap)
{
    (void)m;
    return gpu_valid(s, false, cfg, p, why, cap);
}

int mg_up_gpu_defines(const kern_shape *s, const kern_config *cfg, const dev_props *p,
                      dev_define *out, char (*buf)[64], int cap)
{
    (void)s;
    (void)cfg;
    return moe_gpu_defines(true, p, out, buf, cap);
}

int mg_down_gpu_defines(const kern_shape *s, const kern_config *cfg, const dev_props *p,
                        dev_define *out, char (*buf)[64], int cap)
{
    (void)s;
    (void)cfg;
    return moe_gpu_defines(false, p, out, buf, cap);
}

size_t mg_up_gpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    return gpu_scratch(s, m, true, cfg);
}

size_t mg_down_gpu_scratch(const kern_shape *s, int64_t m, const kern_config *cfg)
{
    return gpu_scratch(s, m, false, cfg);
}

void mg_up_gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    gpu_default(s, m, true, p, cfg);
}

void mg_down_gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *cfg)
{
    gpu_default(s, m, false, p, cfg);
}

/* ---- launches -------------------------------------------------------------- */

mt_status mg_cpu_run(const kern_ctx *c, bool up, const char *name, const char *sig, void **args,
                     mt_err *err)
{
    const kern_shape *s = c->shape;
    int64_t bm = s->v[MG_D_BM], P = c->m * s->v[MG_D_TOPK];
    int32_t K = (int32_t)mg_k(s, up);
    int nt = kern_config_get(c->impl, c->cfg, "NT", 64);
    dev_kernel *kp, *k;
    mt_status st = kern_get(c, "moe_prep", "ppi", &kp, err);
    if (st == MT_OK)
        st = kern_get(c, name, sig, &k, err);
    if (st != MT_OK)
        return st;
    void *act = c->bufs[MG_B_ACT], *prep = c->scratch;
    void *pa[] = {&act, &prep, &K};
    st = dev_launch(c->dev, kp, (dev_dim3){(unsigned)mg_act_rows(s, c->m, up), 1, 1},
                    (dev_dim3){1, 1, 1}, 0, pa, err);
    if (st != MT_OK)
        return st;
    int64_t tiles = moe_cap_rows(P, s->v[MG_D_E], bm) / bm;
    return dev_launch(c->dev, k, (dev_dim3){(unsigned)(mg_n(s, up) / nt), (unsigned)tiles, 1},
                      (dev_dim3){1, 1, 1}, 0, args, err);
}

int32_t mg_gpu_tiles(const kern_ctx *c)
{
    const int *v = c->cfg->v;
    int64_t bm = c->shape->v[MG_D_BM], P = c->m * c->shape->v[MG_D_TOPK];
    return (int32_t)(moe_cap_rows(P, c->shape->v[MG_D_E], bm) /
                     (v[MOE_GPU_GEMV] ? bm : v[MOE_GPU_BM]));
}

mt_status mg_gpu_act_quant(const kern_ctx *c, bool up, void **q, void **qs, mt_err *err)
{
    const kern_shape *s = c->shape;
    *q = *qs = NULL;
    if (s->v[MG_D_A] != KERN_DT_MXFP4)
        return MT_OK;
    return moe_gpu_act_quant(c, c->bufs[MG_B_ACT], mg_act_rows(s, c->m, up), mg_k(s, up),
                             partial_bytes(s, c->m, up, c->cfg), q, qs, err);
}

mt_status mg_gpu_launch(const kern_ctx *c, bool up, const char *name, const char *sig,
                        void **args, mt_err *err)
{
    const int *v = c->cfg->v;
    int64_t n = mg_n(c->shape, up), P = c->m * c->shape->v[MG_D_TOPK];
    dev_kernel *k;
    mt_status st = kern_get(c, name, sig, &k, err);
    if (st != MT_OK)
        return st;
    int64_t gx = v[MOE_GPU_GEMV] ? moe_gemv_blocks(P, c->shape->v[MG_D_E], n, c->cfg)
                                 : mg_gpu_tiles(c) * (n / v[MOE_GPU_BN]);
    dev_dim3 grid = {(unsigned)gx, (unsigned)v[MOE_GPU_SPLITK], 1};
    dev_dim3 block = {(unsigned)(v[MOE_GPU_WAVES] * c->props->warp_size), 1, 1};
    return dev_launch(c->dev, k, grid, block, 0, args, err);
}

mt_status mg_gpu_finish(const kern_ctx *c, const char *name, const char *sig, void **args,
                        int64_t n, mt_err *err)
{
    dev_kernel *k;
    mt_status st = kern_get(c, name, sig, &k, err);
    if (st != MT_OK)
        return st;
    return dev_launch(c->dev, k, (dev_dim3){kern_cdiv(n, 256), 1, 1}, (dev_dim3){256, 1, 1}, 0,
                      args, err);
}
