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
#include "kernels/core/family.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_common.h"

/* Where the header puts things: group n / 16 at (n / 16) * 16 * (k/2 +
 * k/32); block b = c / 32 in its super-block b / 4 of 1088 bytes, at
 * 256 * (b % 4); there byte 64 v + 4 r + i with r = n % 16 holds elements
 * 4 v + i (low nibble) and 16 + 4 v + i (high); the block's scale of row
 * r at 1024 + 16 * (b % 4) + r of the super-block. */
static int64_t super_block(int64_t k, int64_t n, int64_t b)
{
    return (n / 16) * 16 * (k / 2 + k / 32) + (b / 4) * 1088;
}

static int64_t nibble_byte(int64_t k, int64_t n, int64_t c)
{
    int64_t lo = c % 16, b = c / 32;
    return super_block(k, n, b) + 256 * (b % 4) + 64 * (lo / 4) + 4 * (n % 16) + lo % 4;
}

static int grouped_nibble(const uint8_t *p, int64_t k, int64_t n, int64_t c)
{
    int64_t byte = nibble_byte(k, n, c);
    return c % 32 >= 16 ? p[byte] >> 4 : p[byte] & 15;
}

static uint8_t grouped_scale(const uint8_t *p, int64_t k, int64_t n, int64_t b)
{
    return p[super_block(k, n, b) + 1024 + 16 * (b % 4) + n % 16];
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
    const int64_t shapes[][2] = {{16, 128}, {48, 384}, {32, 2048}, {160, 640}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si][0], k = shapes[si][1];
        size_t pb = (size_t)(rows * k / 2), sb = (size_t)(rows * k / 32);
        size_t gb = (size_t)moe_w4_bytes(1, rows, k);
        cr_assert_eq(gb, pb + sb, "the grouped buffer holds the weights and the scales");
        cr_assert_eq(moe_w4_scale_bytes(1, rows, k), 0);
        cr_assert_eq(moe_w4_bytes(0, rows, k), (int64_t)pb);
        cr_assert_eq(moe_w4_scale_bytes(0, rows, k), (int64_t)sb);
        uint8_t *p = malloc(pb), *s = malloc(sb), *g = malloc(gb);
        uint8_t *bp = malloc(pb), *bs = malloc(sb);
        cr_assert(p && s && g && bp && bs);
        for (size_t i = 0; i < pb; i++)
            p[i] = (uint8_t)mt_rng_below(&r, 256);
        for (size_t i = 0; i < sb; i++)
            s[i] = (uint8_t)mt_rng_below(&r, 256);
        memset(g, 0xA5, gb); /* poison: every byte must be written */
        moe_w4_group16(p, s, rows, k, g);
        /* The definition's positions cover the buffer once: every nibble
         * and scale compared below has its own place. */
        uint8_t *seen = calloc(gb, 2);
        cr_assert(seen);
        for (int64_t n = 0; n < rows; n++) {
            for (int64_t c = 0; c < k; c++)
                seen[2 * nibble_byte(k, n, c) + (c % 32 >= 16)]++;
            for (int64_t b = 0; b < k / 32; b++)
                seen[2 * (super_block(k, n, b) + 1024 + 16 * (b % 4) + n % 16)] += 2;
        }
        for (size_t i = 0; i < gb; i++)
            cr_assert(seen[2 * i] + seen[2 * i + 1] == 2, "byte %zu of %zu placed %d+%d times", i,
                      gb, seen[2 * i], seen[2 * i + 1]);
        free(seen);
        for (int64_t n = 0; n < rows; n++) {
            for (int64_t c = 0; c < k; c++)
                cr_assert_eq(grouped_nibble(g, k, n, c), quark_nibble(p, k, n, c),
                             "rows %lld k %lld: element (%lld, %lld) (seed %llu)", (long long)rows,
                             (long long)k, (long long)n, (long long)c, (unsigned long long)seed);
            for (int64_t b = 0; b < k / 32; b++)
                cr_assert_eq(grouped_scale(g, k, n, b), s[n * (k / 32) + b],
                             "scale (%lld, %lld) (seed %llu)", (long long)n, (long long)b,
                             (unsigned long long)seed);
        }
        memset(bp, 0x5A, pb);
        memset(bs, 0x5A, sb);
        moe_w4_ungroup16(g, rows, k, bp, bs);
        cr_assert(!memcmp(bp, p, pb) && !memcmp(bs, s, sb), "ungroup restores the bytes");
        /* A view of grouped weights is the Quark layout; of Quark ones, the
         * buffers themselves. */
        moe_w4_view v = moe_w4_quark_view(1, rows, k, g, NULL);
        cr_assert(!memcmp(v.w, p, pb) && !memcmp(v.s, s, sb), "the Quark view of wl=1");
        moe_w4_view_free(&v);
        v = moe_w4_quark_view(0, rows, k, p, s);
        cr_assert(v.w == p && v.s == s && !v.own);
        free(p), free(s), free(g), free(bp), free(bs);
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
