/* moe.c: stage objects and the MoE layer pipeline (see moe.h). */
#include "moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_common.h"
#include "runner.h"

struct moe_stage {
    dev_device *dev;
    const kern_family *fam;
    const kern_impl *impl;
    kern_shape shape;
    kern_config cfg;
    dev_code *code;
    dev_module *mod;
    void *scratch;
    size_t scratch_bytes;
};

mt_status moe_stage_create(dev_device *d, const char *family, const char *shape_key,
                           const kern_config *cfg, int64_t m_hint, moe_stage **out,
                           mt_err *err)
{
    *out = NULL;
    const kern_family *f = kern_family_find(family);
    if (!f)
        return mt_fail(err, MT_E_NOT_FOUND, "moe stage: no kernel family '%s'", family);
    const dev_props *p = dev_get_props(d);
    const kern_impl *im = kern_family_impl(f, p->backend);
    if (!im)
        return mt_fail(err, MT_E_UNSUPPORTED, "moe stage %s: no implementation for %s",
                       family, dev_backend_name(p->backend));
    moe_stage *st = calloc(1, sizeof *st);
    if (!st)
        return mt_fail(err, MT_E_NOMEM, "moe stage %s: out of memory", family);
    st->dev = d;
    st->fam = f;
    st->impl = im;
    mt_status s = kern_shape_parse(f, shape_key, &st->shape, NULL, err);
    if (s != MT_OK)
        goto fail;
    if (cfg)
        st->cfg = *cfg;
    else
        im->default_config(&st->shape, m_hint, p, &st->cfg);
    char why[256];
    if (!kern_config_valid(f, im, &st->shape, m_hint, &st->cfg, p, why, sizeof why)) {
        char key[256];
        kern_config_key(im, &st->cfg, key, sizeof key);
        s = mt_fail(err, MT_E_INVALID, "moe stage %s (%s): config %s is not valid: %s",
                    family, shape_key, key, why);
        goto fail;
    }
    s = kern_compile(d, f, im, &st->shape, &st->cfg, &st->code, err);
    if (s == MT_OK)
        s = dev_module_load(d, st->code, &st->mod, err);
    if (s != MT_OK) {
        mt_err_prefix(err, "moe stage %s", family);
        goto fail;
    }
    *out = st;
    return MT_OK;
fail:
    moe_stage_destroy(st);
    return s;
}

mt_status moe_stage_run(moe_stage *st, int64_t m, void *const *bufs, mt_err *err)
{
    size_t need = st->impl->scratch_bytes ? st->impl->scratch_bytes(&st->shape, m, &st->cfg) : 0;
    if (need > st->scratch_bytes) {
        dev_free(st->dev, st->scratch);
        st->scratch = NULL;
        st->scratch_bytes = 0;
        mt_status s = dev_alloc(st->dev, need, &st->scratch, err);
        if (s != MT_OK)
            return mt_err_prefix(err, "moe stage %s scratch", st->fam->name);
        st->scratch_bytes = need;
    }
    kern_ctx c = {.dev = st->dev, .mod = st->mod, .props = dev_get_props(st->dev),
                  .fam = st->fam, .impl = st->impl, .shape = &st->shape, .m = m,
                  .cfg = &st->cfg, .bufs = bufs, .scratch = st->scratch};
    mt_status s = st->impl->run(&c, err);
    if (s != MT_OK)
        mt_err_prefix(err, "moe stage %s", st->fam->name);
    return s;
}

const kern_config *moe_stage_config(const moe_stage *st) { return &st->cfg; }
const kern_family *moe_stage_family(const moe_stage *st) { return st->fam; }
const kern_shape *moe_stage_shape(const moe_stage *st) { return &st->shape; }

void moe_stage_destroy(moe_stage *st)
{
    if (!st)
        return;
    dev_free(st->dev, st->scratch);
    dev_module_unload(st->mod);
    dev_code_free(st->code);
    free(st);
}

/* ---- the layer --------------------------------------------------------- */

enum { S_ROUTE, S_ALIGN, S_UP, S_DOWN, S_COMBINE, S_SH_ALIGN, S_SH_UP, S_SH_DOWN, S_COUNT };
static const char *const stage_names[S_COUNT] = {"route", "align", "up", "down", "combine",
                                                 "sh_align", "sh_up", "sh_down"};

struct moe {
    dev_device *dev;
    moe_dims d;
    moe_weights w;
    int bm;
    moe_stage *st[S_COUNT];
    int64_t cap_m; /* workspace holds this many tokens */
    void *ids, *tw, *sorted, *tile, *total, *h, *rows;
    void *sh_ids, *sh_w, *sh_sorted, *sh_tile, *sh_total, *sh_h;
};

static const char *dt(bool a4) { return a4 ? "mxfp4" : "bf16"; }

static void ws_free(moe *m)
{
    void **p[] = {&m->ids, &m->tw, &m->sorted, &m->tile, &m->total, &m->h, &m->rows,
                  &m->sh_ids, &m->sh_w, &m->sh_sorted, &m->sh_tile, &m->sh_total, &m->sh_h};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        dev_free(m->dev, *p[i]);
        *p[i] = NULL;
    }
    m->cap_m = 0;
}

static mt_status ws_grow(moe *m, int64_t M, mt_err *err)
{
    if (M <= m->cap_m)
        return MT_OK;
    ws_free(m);
    const moe_dims *d = &m->d;
    int64_t P = M * d->topk, cap = moe_cap_rows(P, d->n_experts, m->bm);
    int64_t cap1 = moe_cap_rows(M, 1, m->bm);
    struct { void **p; size_t n; } a[] = {
        {&m->ids, (size_t)P * 4}, {&m->tw, (size_t)P * 4}, {&m->sorted, (size_t)cap * 4},
        {&m->tile, (size_t)(cap / m->bm) * 4}, {&m->total, 4},
        {&m->h, (size_t)(P * d->inter) * 2},
        {&m->rows, d->comb ? (size_t)(P * d->hidden) * 4 : 0},
        {&m->sh_ids, d->shared_inter ? (size_t)M * 4 : 0},
        {&m->sh_w, d->shared_inter ? (size_t)M * 4 : 0},
        {&m->sh_sorted, d->shared_inter ? (size_t)cap1 * 4 : 0},
        {&m->sh_tile, d->shared_inter ? (size_t)(cap1 / m->bm) * 4 : 0},
        {&m->sh_total, d->shared_inter ? 4 : 0},
        {&m->sh_h, d->shared_inter ? (size_t)(M * d->shared_inter) * 2 : 0},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        if (!a[i].n)
            continue;
        mt_status s = dev_alloc(m->dev, a[i].n, a[i].p, err);
        if (s != MT_OK) {
            ws_free(m);
            return mt_err_prefix(err, "moe workspace for M=%lld", (long long)M);
        }
    }
    if (d->shared_inter) {
        float *ones = malloc((size_t)M * 4);
        if (!ones) {
            ws_free(m);
            return mt_fail(err, MT_E_NOMEM, "moe workspace: out of memory");
        }
        for (int64_t i = 0; i < M; i++)
            ones[i] = 1.0f;
        mt_status s = dev_memset(m->dev, m->sh_ids, 0, (size_t)M * 4, err);
        if (s == MT_OK)
            s = dev_copy_to(m->dev, m->sh_w, ones, (size_t)M * 4, err);
        free(ones);
        if (s != MT_OK) {
            ws_free(m);
            return s;
        }
    }
    m->cap_m = M;
    return MT_OK;
}

mt_status moe_create(dev_device *dev, const moe_dims *dims, const moe_weights *w,
                     const moe_configs *cfgs, int64_t m_hint, moe **out, mt_err *err)
{
    *out = NULL;
    moe_configs none = {0};
    if (!cfgs)
        cfgs = &none;
    moe *m = calloc(1, sizeof *m);
    if (!m)
        return mt_fail(err, MT_E_NOMEM, "moe: out of memory");
    m->dev = dev;
    m->d = *dims;
    m->w = *w;
    const dev_props *p = dev_get_props(dev);
    const moe_dims *d = dims;
    /* The aligned layout's tile height: the GPU GEMMs' BM must divide it
     * (the largest BM of the given configs, or 128 for defaults, which are
     * chosen to divide it); the cpu GEMMs walk whole tiles, 128 rows each. */
    m->bm = 128;
    if (dev_backend_runs_hip_source(p->backend)) {
        const kern_config *g[] = {cfgs->up, cfgs->down, cfgs->sh_up, cfgs->sh_down};
        int bm = 16;
        bool any = false;
        for (int i = 0; i < 4; i++)
            if (g[i]) {
                any = true;
                bm = g[i]->v[MOE_GPU_BM] > bm ? g[i]->v[MOE_GPU_BM] : bm;
            }
        m->bm = any ? 128 > bm ? 128 : bm : 128;
    }
    char key[512];
    mt_status s;
#define STAGE(idx, fam, cfg, ...)                                                        \
    do {                                                                               \
        snprintf(key, sizeof key, __VA_ARGS__);                                        \
        s = moe_stage_create(dev, fam, key, cfg, m_hint, &m->st[idx], err);            \
        if (s != MT_OK)                                                                \
            goto fail;                                                                 \
    } while (0)
    STAGE(S_ROUTE, "moe_route", cfgs->route, "H=%lld,E=%lld,topk=%d,ngroup=%d,topkg=%d,rsf=%d,norm=%d",
          (long long)d->hidden, (long long)d->n_experts, d->topk, d->ngroup, d->topkg,
          (int)(d->scale * 1000.0f + 0.5f), d->norm ? 1 : 0);
    STAGE(S_ALIGN, "moe_align", cfgs->align, "E=%lld,topk=%d,bm=%d,skew=0",
          (long long)d->n_experts, d->topk, m->bm);
    STAGE(S_UP, "moe_gemm_up", cfgs->up, "H=%lld,I=%lld,E=%lld,topk=%d,a=%s,cat=1,bm=%d,skew=0",
          (long long)d->hidden, (long long)d->inter, (long long)d->n_experts, d->topk,
          dt(d->a4), m->bm);
    STAGE(S_DOWN, "moe_gemm_down", cfgs->down,
          "H=%lld,I=%lld,E=%lld,topk=%d,a=%s,comb=%d,bm=%d,skew=0", (long long)d->hidden,
          (long long)d->inter, (long long)d->n_experts, d->topk, dt(d->a4), d->comb, m->bm);
    if (d->comb)
        STAGE(S_COMBINE, "moe_combine", cfgs->combine, "H=%lld,topk=%d,shared=1,o=f32",
              (long long)d->hidden, d->topk);
    if (d->shared_inter) {
        STAGE(S_SH_ALIGN, "moe_align", NULL, "E=1,topk=1,bm=%d,skew=0", m->bm);
        STAGE(S_SH_UP, "moe_gemm_up", cfgs->sh_up, "H=%lld,I=%lld,E=1,topk=1,a=%s,cat=1,bm=%d,skew=0",
              (long long)d->hidden, (long long)d->shared_inter, dt(d->a4), m->bm);
        STAGE(S_SH_DOWN, "moe_gemm_down", cfgs->sh_down,
              "H=%lld,I=%lld,E=1,topk=1,a=%s,comb=0,bm=%d,skew=0", (long long)d->hidden,
              (long long)d->shared_inter, dt(d->a4), m->bm);
    }
#undef STAGE
    *out = m;
    return MT_OK;
fail:
    moe_destroy(m);
    return s;
}

mt_status moe_forward(moe *m, const void *x, int64_t M, float *y, mt_err *err)
{
    const moe_dims *d = &m->d;
    mt_status s = ws_grow(m, M, err);
    if (s == MT_OK)
        s = dev_memset(m->dev, y, 0, (size_t)(M * d->hidden) * 4, err);
    if (s != MT_OK)
        return s;
    void *xv = (void *)(uintptr_t)x, *yv = y;
    const moe_weights *w = &m->w;
    if (d->shared_inter) {
        void *ba[] = {m->sh_ids, m->sh_sorted, m->sh_tile, m->sh_total};
        void *bu[] = {xv, m->sh_ids, m->sh_sorted, m->sh_tile, m->sh_total,
                      (void *)w->sh_w13, (void *)w->sh_s13, m->sh_h};
        void *bd[] = {m->sh_h, m->sh_ids, m->sh_sorted, m->sh_tile, m->sh_total, m->sh_w,
                      (void *)w->sh_w2, (void *)w->sh_s2, yv};
        if ((s = moe_stage_run(m->st[S_SH_ALIGN], M, ba, err)) != MT_OK ||
            (s = moe_stage_run(m->st[S_SH_UP], M, bu, err)) != MT_OK ||
            (s = moe_stage_run(m->st[S_SH_DOWN], M, bd, err)) != MT_OK)
            return s;
    }
    void *br[] = {xv, (void *)w->gate, (void *)w->bias, m->ids, m->tw};
    void *ba[] = {m->ids, m->sorted, m->tile, m->total};
    void *bu[] = {xv, m->ids, m->sorted, m->tile, m->total, (void *)w->w13, (void *)w->s13, m->h};
    void *bd[] = {m->h, m->ids, m->sorted, m->tile, m->total, m->tw, (void *)w->w2,
                  (void *)w->s2, d->comb ? m->rows : yv};
    if ((s = moe_stage_run(m->st[S_ROUTE], M, br, err)) != MT_OK ||
        (s = moe_stage_run(m->st[S_ALIGN], M, ba, err)) != MT_OK ||
        (s = moe_stage_run(m->st[S_UP], M, bu, err)) != MT_OK ||
        (s = moe_stage_run(m->st[S_DOWN], M, bd, err)) != MT_OK)
        return s;
    if (d->comb) {
        void *bc[] = {m->rows, yv, yv};
        s = moe_stage_run(m->st[S_COMBINE], M, bc, err);
    }
    return s;
}

moe_stage *moe_get_stage(moe *m, const char *name)
{
    for (int i = 0; i < S_COUNT; i++)
        if (!strcmp(name, stage_names[i]))
            return m->st[i];
    return NULL;
}

void moe_destroy(moe *m)
{
    if (!m)
        return;
    for (int i = 0; i < S_COUNT; i++)
        moe_stage_destroy(m->st[i]);
    ws_free(m);
    free(m);
}

/* ---- reference --------------------------------------------------------- */

static void expert_ref(const moe_gemm_dims *g, const uint16_t *x, int64_t M, const int32_t *ids,
                       const float *tw, const uint8_t *w13, const uint8_t *s13,
                       const uint8_t *w2, const uint8_t *s2, float *y)
{
    int64_t P = M * g->topk, H = g->h, I = g->i;
    uint16_t *h = malloc((size_t)(P * I) * 2);
    moe_up_ref(g, x, ids, w13, s13, w13 + I * H / 2, s13 + I * H / 32, 2 * I * H / 2,
               2 * I * H / 32, 0, P, 1, h);
    moe_down_ref(g, h, ids, tw, w2, s2, 0, P, 1, NULL, y);
    free(h);
}

void moe_reference(const moe_dims *d, const moe_host_weights *w, const uint16_t *x, int64_t M,
                   float *y, int32_t *ids_out, float *tw_out)
{
    int64_t H = d->hidden, P = M * d->topk;
    memset(y, 0, sizeof(float) * (size_t)(M * H));
    if (d->shared_inter) {
        moe_gemm_dims g = {.h = H, .i = d->shared_inter, .e = 1, .topk = 1, .a4 = d->a4};
        int32_t *zero = calloc((size_t)M, 4);
        float *one = malloc((size_t)M * 4);
        for (int64_t i = 0; i < M; i++)
            one[i] = 1.0f;
        expert_ref(&g, x, M, zero, one, w->sh_w13, w->sh_s13, w->sh_w2, w->sh_s2, y);
        free(zero);
        free(one);
    }
    moe_route_dims rd = {.h = H, .e = d->n_experts, .topk = d->topk, .ngroup = d->ngroup,
                         .topkg = d->topkg, .scale = d->scale, .norm = d->norm};
    int32_t *ids = malloc((size_t)P * 4);
    float *tw = malloc((size_t)P * 4);
    for (int64_t t = 0; t < M; t++)
        moe_route_ref_token(&rd, x + t * H, w->gate, w->bias, ids + t * d->topk,
                            tw + t * d->topk, NULL, NULL);
    moe_gemm_dims g = {.h = H, .i = d->inter, .e = d->n_experts, .topk = d->topk, .a4 = d->a4};
    expert_ref(&g, x, M, ids, tw, w->w13, w->s13, w->w2, w->s2, y);
    if (ids_out)
        memcpy(ids_out, ids, (size_t)P * 4);
    if (tw_out)
        memcpy(tw_out, tw, (size_t)P * 4);
    free(ids);
    free(tw);
}
