/* test_moe_group16.c: the expert weights grouped by 16 rows (wl=1, the cpu
 * integer tiles' layout): moe_w4_group16 places every nibble and scale
 * where the layout's definition (kernels/moe_common.h) says, ungrouping
 * restores the Quark bytes, the families take wl as an optional key dim
 * (left out at 0, so older keys and databases stay valid) that GPU kernels
 * and bf16 activations refuse, and the served layer on cpu with grouped
 * weights matches the plain C reference computed from the Quark rows. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "device/device.h"
#include "kernels/family.h"
#include "kernels/moe.h"
#include "kernels/moe_common.h"
#include "model/moe_layer.h"
#include "moe_glm_util.h"

/* Element c of row n in the grouped layout, as the header defines it:
 * group n / 16, block c / 32, byte 64 v + 4 r + i with r = n % 16, where
 * elements 4 v + i sit in low nibbles and 16 + 4 v + i in high ones. */
static int grouped_nibble(const uint8_t *p, int64_t k, int64_t n, int64_t c)
{
    int64_t e = c % 32, lo = e % 16;
    int64_t byte = (n / 16) * 16 * (k / 2) + (c / 32) * 256 + 64 * (lo / 4) + 4 * (n % 16) + lo % 4;
    return e >= 16 ? p[byte] >> 4 : p[byte] & 15;
}

static int quark_nibble(const uint8_t *p, int64_t k, int64_t n, int64_t c)
{
    uint8_t b = p[n * (k / 2) + c / 2];
    return c & 1 ? b >> 4 : b & 15;
}

Test(moe_group16, layout_and_round_trip)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    const int64_t shapes[][2] = {{16, 32}, {48, 96}, {32, 2048}, {160, 384}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si][0], k = shapes[si][1];
        size_t pb = (size_t)(rows * k / 2), sb = (size_t)(rows * k / 32);
        uint8_t *p = malloc(pb), *s = malloc(sb), *gp = malloc(pb), *gs = malloc(sb);
        uint8_t *bp = malloc(pb), *bs = malloc(sb);
        cr_assert(p && s && gp && gs && bp && bs);
        for (size_t i = 0; i < pb; i++)
            p[i] = (uint8_t)mt_rng_below(&r, 256);
        for (size_t i = 0; i < sb; i++)
            s[i] = (uint8_t)mt_rng_below(&r, 256);
        memset(gp, 0xA5, pb); /* poison: every byte must be written */
        memset(gs, 0xA5, sb);
        moe_w4_group16(p, s, rows, k, gp, gs);
        for (int64_t n = 0; n < rows; n++) {
            for (int64_t c = 0; c < k; c++)
                cr_assert_eq(grouped_nibble(gp, k, n, c), quark_nibble(p, k, n, c),
                             "rows %lld k %lld: element (%lld, %lld) (seed %llu)", (long long)rows,
                             (long long)k, (long long)n, (long long)c, (unsigned long long)seed);
            for (int64_t b = 0; b < k / 32; b++)
                cr_assert_eq(gs[(n / 16) * 16 * (k / 32) + b * 16 + n % 16], s[n * (k / 32) + b],
                             "scale (%lld, %lld) (seed %llu)", (long long)n, (long long)b,
                             (unsigned long long)seed);
        }
        memset(bp, 0x5A, pb);
        memset(bs, 0x5A, sb);
        moe_w4_ungroup16(gp, gs, rows, k, bp, bs);
        cr_assert(!memcmp(bp, p, pb) && !memcmp(bs, s, sb), "ungroup restores the bytes");
        cr_assert(moe_w4_regroup_inplace(bp, bs, rows, k, true));
        cr_assert(!memcmp(bp, gp, pb) && !memcmp(bs, gs, sb), "in place = out of place");
        cr_assert(moe_w4_regroup_inplace(bp, bs, rows, k, false));
        cr_assert(!memcmp(bp, p, pb) && !memcmp(bs, s, sb));
        free(p), free(s), free(gp), free(gs), free(bp), free(bs);
    }
}

Test(moe_group16, optional_key_dim)
{
    const char *fams[] = {"moe_gemm_up", "moe_gemm_down"};
    const char *keys[][2] = {
        {"H=256,I=128,E=16,topk=4,a=mxfp4,cat=1,bm=128,skew=0",
         "H=256,I=128,E=16,topk=4,a=mxfp4,cat=1,wl=1,bm=128,skew=0"},
        {"H=256,I=128,E=16,topk=4,a=mxfp4,comb=1,bm=128,skew=0",
         "H=256,I=128,E=16,topk=4,a=mxfp4,comb=1,wl=1,bm=128,skew=0"},
    };
    for (int f = 0; f < 2; f++) {
        const kern_family *fam = kern_family_find(fams[f]);
        cr_assert_not_null(fam);
        for (int g = 0; g < 2; g++) {
            kern_shape s;
            mt_err err = MT_ERR_INIT;
            cr_assert_eq(kern_shape_parse(fam, keys[f][g], &s, NULL, &err), MT_OK, "%s", err.msg);
            cr_assert_eq(kern_shape_get(fam, &s, "wl"), g);
            char back[KERN_KEY_MAX];
            kern_shape_key(fam, &s, true, back, sizeof back);
            cr_assert_str_eq(back, keys[f][g], "a key prints as written (wl left out at 0)");
            /* The GPU implementation refuses grouped weights. */
            const kern_impl *gpu = kern_family_impl(fam, DEV_BACKEND_EMU);
            dev_props p = {.backend = DEV_BACKEND_EMU, .warp_size = 64, .max_threads_per_block = 1024,
                           .shared_mem_per_block = 65536};
            kern_config c;
            gpu->default_config(&s, 1, &p, &c);
            char why[256] = "";
            bool ok = kern_config_valid(fam, gpu, &s, 1, &c, &p, why, sizeof why);
            if (g)
                cr_assert(!ok && strstr(why, "wl=1"), "%s: gpu with wl=1: %s", fams[f], why);
        }
        /* bf16 activations have no grouped tiles. */
        char bad[160];
        snprintf(bad, sizeof bad, "%s", keys[f][1]);
        memcpy(strstr(bad, "a=mxfp4"), "a=bf16,", 7);
        memmove(strstr(bad, "a=bf16,") + 7, strstr(bad, "a=bf16,") + 8, strlen(strstr(bad, "a=bf16,") + 8) + 1);
        kern_shape s;
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(kern_shape_parse(fam, bad, &s, NULL, &err), MT_E_INVALID, "%s", bad);
        cr_assert(strstr(err.msg, "wl=1"), "%s", err.msg);
    }
}

static void *upload(dev_device *d, const void *src, size_t n)
{
    void *p = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_alloc(d, n, &p, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(dev_copy_to(d, p, src, n, &err), MT_OK, "%s", err.msg);
    return p;
}

/* Grouped copy of rows x k MXFP4 weights, uploaded. */
static void upload_grouped(dev_device *d, const uint8_t *w, const uint8_t *s, int64_t rows,
                           int64_t k, void **dw, void **ds)
{
    size_t pb = (size_t)(rows * k / 2), sb = (size_t)(rows * k / 32);
    uint8_t *gw = malloc(pb), *gs = malloc(sb);
    cr_assert(gw && gs);
    moe_w4_group16(w, s, rows, k, gw, gs);
    *dw = upload(d, gw, pb);
    *ds = upload(d, gs, sb);
    free(gw);
    free(gs);
}

/* The served layer on cpu (a4w4 and a8w4, grouped weights, rows +
 * combine) against moe_reference on the Quark rows, M = 1 and 37. Routing
 * near-ties may pick another expert: such tokens are skipped, as in
 * test_moe_pipeline. */
static void served_layer(bool a8)
{
    moe_dims dm = {.hidden = 256, .inter = 128, .n_experts = 16, .topk = 4, .ngroup = 1,
                   .topkg = 1, .scale = 2.5f, .norm = true, .a4 = !a8, .a8 = a8,
                   .shared_inter = 128, .comb = 1, .wl = 1};
    cr_assert_eq(moe_weight_layout(DEV_BACKEND_CPU, dm.a4, dm.a8), 1);
    cr_assert_eq(moe_weight_layout(DEV_BACKEND_CPU, false, false), 0);
    cr_assert_eq(moe_weight_layout(DEV_BACKEND_HIP, true, false), 0);
    uint64_t seed = mt_seed_fresh();
    layer_host l;
    layer_host_make(&dm, seed, &l);
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu", NULL, &d, &err), MT_OK, "%s", err.msg);
    int64_t H = dm.hidden, I = dm.inter, E = dm.n_experts, S = dm.shared_inter;
    void *w13, *s13, *w2, *s2, *sw13, *ss13, *sw2, *ss2;
    upload_grouped(d, l.w13, l.s13, E * 2 * I, H, &w13, &s13);
    upload_grouped(d, l.w2, l.s2, E * H, I, &w2, &s2);
    upload_grouped(d, l.sh_w13, l.sh_s13, 2 * S, H, &sw13, &ss13);
    upload_grouped(d, l.sh_w2, l.sh_s2, H, S, &sw2, &ss2);
    moe_weights w = {upload(d, l.gate, (size_t)(E * H) * 2), upload(d, l.bias, (size_t)E * 4),
                     w13, s13, w2, s2, sw13, ss13, sw2, ss2};
    model_kset *ks = NULL;
    model_moe_kernels mk;
    model_moe_ws *ws = NULL;
    cr_assert_eq(model_kset_create(d, NULL, NULL, &ks, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_moe_add_kernels(ks, &dm, 37, &mk, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_kset_select(ks, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_moe_ws_create(d, &dm, 37, &ws, &err), MT_OK, "%s", err.msg);
    mt_rng r;
    mt_rng_seed(&r, seed + 1);
    const int64_t ms[] = {1, 37};
    moe_route_dims rd = {.h = H, .e = E, .topk = dm.topk, .ngroup = 1, .topkg = 1, .scale = 2.5f,
                         .norm = true};
    for (int mi = 0; mi < 2; mi++) {
        int64_t M = ms[mi];
        uint16_t *x = malloc((size_t)(M * H) * 2);
        float *want = malloc((size_t)(M * H) * 4), *got = malloc((size_t)(M * H) * 4);
        moe_gen_bf16(&r, x, M * H, 1.0f);
        moe_host_weights hw = layer_host_weights(&l);
        moe_reference(&dm, &hw, x, M, want, NULL, NULL);
        void *dx = upload(d, x, (size_t)(M * H) * 2), *dy = NULL;
        cr_assert_eq(dev_alloc(d, (size_t)(M * H) * 4, &dy, &err), MT_OK);
        dev_memset(d, dy, 0xff, (size_t)(M * H) * 4, &err); /* NaN poison */
        cr_assert_eq(model_moe_run(&mk, ws, &dm, &w, dx, M, dy, &err), MT_OK, "%s", err.msg);
        cr_assert_eq(dev_synchronize(d, &err), MT_OK);
        cr_assert_eq(dev_copy_from(d, got, dy, (size_t)(M * H) * 4, &err), MT_OK);
        int checked = 0;
        for (int64_t t = 0; t < M; t++) {
            double choice[16];
            int32_t tid[4];
            float tw[4];
            moe_route_ref_token(&rd, x + t * H, l.gate, l.bias, tid, tw, choice, NULL);
            bool tie = false;
            for (int e = 0; e < E; e++)
                for (int j = 0; j < dm.topk; j++)
                    tie |= e != tid[j] && fabs(choice[e] - choice[tid[j]]) < 1e-5;
            if (tie)
                continue;
            checked++;
            double scale = 0;
            for (int64_t n = 0; n < H; n++)
                scale = fmax(scale, fabs(want[t * H + n]));
            for (int64_t n = 0; n < H; n++) {
                float g = got[t * H + n], v = want[t * H + n];
                cr_assert(fabsf(g - v) <= 1e-2 * scale + 1e-2 * fabsf(v),
                          "a8=%d M=%lld token %lld col %lld: got %g want %g (seed %llu)", a8,
                          (long long)M, (long long)t, (long long)n, g, v, (unsigned long long)seed);
            }
        }
        cr_assert_gt(checked, 0);
        dev_free(d, dx);
        dev_free(d, dy);
        free(x);
        free(want);
        free(got);
    }
    model_moe_ws_destroy(ws);
    model_kset_destroy(ks);
    const void *ptrs[] = {w.gate, w.bias, w.w13, w.s13, w.w2, w.s2, w.sh_w13, w.sh_s13, w.sh_w2, w.sh_s2};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        dev_free(d, (void *)(uintptr_t)ptrs[i]);
    dev_close(d);
    layer_host_free(&l);
}

Test(moe_group16, served_layer_cpu_a4w4) { served_layer(false); }
Test(moe_group16, served_layer_cpu_a8w4) { served_layer(true); }
