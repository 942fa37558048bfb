/* test_moe_glm.c: the cpu MoE GEMMs at the full GLM-5.2 expert shape
 * (H=6144, I=2048, E=256, top-8, gate and up concatenated) for M = 1 and
 * M = 16, a4w4 (GLM-5.2-MXFP4) and a16w4 at M = 1: every routed pair, at
 * sampled output columns, against the C references. Weights are written
 * straight into the cpu device's buffers (host memory on that backend) and
 * only for the experts the routing uses, to keep the test within seconds.
 * The GEMMs run as the served MoE layer runs them: the layer's kernels
 * (moe_layer_keys) in a kernel set, with the configs it selects. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "device/device.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_common.h"
#include "model/moe_layer.h"

enum { H = 6144, I = 2048, E = 256, TOPK = 8, BM = 128 };

static void *dalloc(dev_device *d, size_t n)
{
    void *p = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_alloc(d, n, &p, &err), MT_OK, "%s", err.msg);
    return p;
}

static void run_glm(int64_t M, bool a4)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu", NULL, &d, &err), MT_OK, "%s", err.msg);
    int64_t P = M * TOPK, cap = moe_cap_rows(P, E, BM);
    int32_t *ids = dalloc(d, (size_t)P * 4), *sorted = dalloc(d, (size_t)cap * 4);
    int32_t *tile = dalloc(d, (size_t)(cap / BM) * 4), *total = dalloc(d, 4);
    float *tw = dalloc(d, (size_t)P * 4), *y = dalloc(d, (size_t)(M * H) * 4);
    uint16_t *x = dalloc(d, (size_t)(M * H) * 2), *h = dalloc(d, (size_t)(P * I) * 2);
    uint8_t *w13 = dalloc(d, (size_t)E * 2 * I * H / 2), *s13 = dalloc(d, (size_t)E * 2 * I * H / 32);
    uint8_t *w2 = dalloc(d, (size_t)E * H * I / 2), *s2 = dalloc(d, (size_t)E * H * I / 32);
    moe_gen_bf16(&r, x, M * H, 1.0f);
    moe_gen_ids(&r, M, TOPK, E, MOE_SKEW_UNIFORM, ids);
    moe_align_ref(ids, P, E, BM, sorted, tile, total);
    for (int64_t p = 0; p < P; p++)
        tw[p] = mt_rng_uniform(&r, 0.05f, 1.0f);
    bool used[E] = {0};
    for (int64_t p = 0; p < P; p++)
        used[ids[p]] = true;
    for (int e = 0; e < E; e++)
        if (used[e]) {
            moe_gen_mxfp4(&r, w13 + (size_t)e * 2 * I * H / 2, s13 + (size_t)e * 2 * I * H / 32,
                          2 * I, H);
            moe_gen_mxfp4(&r, w2 + (size_t)e * H * I / 2, s2 + (size_t)e * H * I / 32, H, I);
        }
    memset(y, 0, (size_t)(M * H) * 4);
    memset(h, 0xff, (size_t)(P * I) * 2);
    const char *a = a4 ? "mxfp4" : "bf16";
    moe_dims dm = {.hidden = H, .inter = I, .n_experts = E, .topk = TOPK, .ngroup = 1,
                   .topkg = 1, .scale = 2.5f, .norm = true, .a4 = a4, .bm = BM};
    model_kset *ks = NULL;
    model_moe_kernels mk;
    cr_assert_eq(model_kset_create(d, NULL, NULL, &ks, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_moe_add_kernels(ks, &dm, M, &mk, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_kset_select(ks, &err), MT_OK, "%s", err.msg);
    void *bu[] = {x, ids, sorted, tile, total, w13, s13, h};
    void *bd[] = {h, ids, sorted, tile, total, tw, w2, s2, y};
    cr_assert_eq(model_kern_run(mk.up, M, NULL, bu, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_kern_run(mk.down, M, NULL, bd, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(dev_synchronize(d, &err), MT_OK, "%s", err.msg);

    moe_gemm_dims g = {.h = H, .i = I, .e = E, .topk = TOPK, .a4 = a4};
    const int64_t nstep_up = 61, nstep_down = 67; /* sampled columns */
    uint16_t *href = malloc((size_t)(P * I) * 2);
    moe_up_ref(&g, x, ids, w13, s13, w13 + (size_t)I * H / 2, s13 + (size_t)I * H / 32,
               (int64_t)2 * I * H / 2, (int64_t)2 * I * H / 32, 0, P, nstep_up, href);
    int bad = 0;
    for (int64_t p = 0; p < P && bad < 5; p++)
        for (int64_t n = 0; n < I && bad < 5; n += nstep_up) {
            float gv = mt_bf16_to_f32(h[p * I + n]), wv = mt_bf16_to_f32(href[p * I + n]);
            if (!(fabsf(gv - wv) <= 2e-2f + 2e-2f * fabsf(wv))) {
                cr_expect_fail("up M=%lld a=%s pair %lld col %lld: got %g want %g (seed %llu)",
                               (long long)M, a, (long long)p, (long long)n, gv, wv,
                               (unsigned long long)seed);
                bad++;
            }
        }
    float *yref = calloc((size_t)(M * H), 4);
    moe_down_ref(&g, h, ids, tw, w2, s2, 0, P, nstep_down, NULL, yref);
    for (int64_t t = 0; t < M && bad < 5; t++)
        for (int64_t n = 0; n < H && bad < 5; n += nstep_down) {
            float gv = y[t * H + n], wv = yref[t * H + n];
            if (!(fabsf(gv - wv) <= 1e-3f + 1e-3f * fabsf(wv))) {
                cr_expect_fail("down M=%lld a=%s token %lld col %lld: got %g want %g (seed %llu)",
                               (long long)M, a, (long long)t, (long long)n, gv, wv,
                               (unsigned long long)seed);
                bad++;
            }
        }
    free(href);
    free(yref);
    model_kset_destroy(ks);
    void *bufs[] = {ids, sorted, tile, total, tw, y, x, h, w13, s13, w2, s2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        dev_free(d, bufs[i]);
    dev_close(d);
}

Test(moe_glm, cpu_full_shape_m1_a4w4_matches_reference, .timeout = 300) { run_glm(1, true); }
Test(moe_glm, cpu_full_shape_m16_a4w4_matches_reference, .timeout = 300) { run_glm(16, true); }
Test(moe_glm, cpu_full_shape_m1_a16w4_matches_reference, .timeout = 300) { run_glm(1, false); }
