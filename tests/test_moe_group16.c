/* test_moe_group16.c: the expert weights grouped by 16 rows (wl=1, the cpu
 * tiles' layout): moe_w4_group16 places every nibble and scale
 * where the layout's definition (kernels/moe_common.h) says, ungrouping
 * restores the Quark bytes, the families take wl as an optional key dim
 * (left out at 0, so older keys and databases stay valid) that GPU kernels
 * refuse, and the layout follows the device (the
 * served layer on grouped weights: test_moe_pipeline). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "device/device.h"
#include "kernels/family.h"
#include "kernels/moe.h"
#include "kernels/moe_common.h"

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
    }
}

Test(moe_group16, the_layout_follows_the_device)
{
    cr_assert_eq(moe_weight_layout(DEV_BACKEND_CPU), 1);
    cr_assert_eq(moe_weight_layout(DEV_BACKEND_HIP), 0);
    cr_assert_eq(moe_weight_layout(DEV_BACKEND_CUDA), 0);
    cr_assert_eq(moe_weight_layout(DEV_BACKEND_EMU), 0);
}
