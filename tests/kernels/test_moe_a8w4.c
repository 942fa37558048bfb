/* test_moe_a8w4.c: the a8w4 path of the MoE expert GEMMs (activations as
 * int8 per 32-block with an fp32 scale, a=i8): its quantization rule
 * (moe_act_row_i8) against an independent check of the rule, its accuracy
 * against a4w4 on the same problem, and the cpu kernels against the
 * reference on odd shapes at every SIMD level this CPU has (native: AVX-512
 * VNNI where present; x86-64-v4: AVX-512BW maddubs; x86-64-v3: AVX2
 * maddubs; x86-64-v2: portable C). Fresh seeds, printed on failure. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "cpu_arch_util.h"
#include "device/device.h"
#include "kernels/core/family.h"
#include "kernels/moe/moe_common.h"
#include "kernels/core/runner.h"

Test(moe_a8w4, quantized_row_follows_the_rule)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    enum { K = 32 * 37 };
    uint16_t x[K];
    float out[K];
    moe_gen_bf16(&r, x, K, 3.0f);
    for (int i = 0; i < 32; i++) /* block 1: all zeros; block 2: tiny values */
        x[32 + i] = 0;
    for (int i = 0; i < 32; i++)
        x[64 + i] = mt_f32_to_bf16(1e-30f * (float)(i - 16));
    x[5 * 32 + 7] = mt_f32_to_bf16(NAN);
    moe_act_row_i8(x, K, out);
    for (int b = 0; b < K / 32; b++) {
        double amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmax(amax, fabs((double)mt_bf16_to_f32(x[b * 32 + i])));
        for (int i = 0; i < 32; i++) {
            int k = b * 32 + i;
            double v = mt_bf16_to_f32(x[k]);
            if (b == 5) {
                cr_expect(isnan(out[k]), "seed %llu: block with a NaN reads NaN at %d",
                          (unsigned long long)seed, k);
                continue;
            }
            double step = amax / 127.0;
            if (amax == 0) {
                cr_expect_eq(out[k], 0.0f, "seed %llu: zero block at %d", (unsigned long long)seed, k);
                continue;
            }
            double q = out[k] / step;
            cr_expect(fabs(q - nearbyint(q)) < 1e-3 && fabs(q) <= 127.0 + 1e-3,
                      "seed %llu: element %d = %g is %g steps of %g, not an int8 multiple",
                      (unsigned long long)seed, k, (double)out[k], q, step);
            cr_expect(fabs(out[k] - v) <= 0.5 * step * (1 + 1e-5),
                      "seed %llu: element %d: %g -> %g, more than half a step %g",
                      (unsigned long long)seed, k, v, (double)out[k], step);
        }
    }
}

/* Max |dot - exact| over a stage-2 problem for one activation type, with
 * the exact dot from bf16 activations (a16w4). */
static double down_err(const moe_gemm_dims *d, const uint16_t *h, const int32_t *ids,
                       const float *tw, const uint8_t *w, const uint8_t *s, int64_t P,
                       const float *exact, float *rows)
{
    moe_down_ref(d, h, ids, tw, w, s, 0, P, 1, rows, NULL);
    double e = 0;
    for (int64_t i = 0; i < P * d->h; i++)
        e += fabs((double)rows[i] - exact[i]);
    return e / (double)(P * d->h);
}

Test(moe_a8w4, more_accurate_than_a4w4)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    moe_gemm_dims d = {.h = 256, .i = 384, .e = 4, .topk = 2};
    int64_t M = 5, P = M * d.topk;
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(P * d.i));
    int32_t ids[10];
    float tw[10];
    uint8_t *w = malloc((size_t)(d.e * d.h * d.i / 2)), *s = malloc((size_t)(d.e * d.h * d.i / 32));
    float *exact = malloc(sizeof(float) * (size_t)(P * d.h));
    float *rows = malloc(sizeof(float) * (size_t)(P * d.h));
    moe_gen_bf16(&r, h, P * d.i, 1.0f);
    moe_gen_ids(&r, M, d.topk, (int)d.e, MOE_SKEW_UNIFORM, ids);
    for (int64_t p = 0; p < P; p++)
        tw[p] = 1.0f;
    moe_gen_mxfp4(&r, w, s, d.e * d.h, d.i);
    moe_down_ref(&d, h, ids, tw, w, s, 0, P, 1, exact, NULL);
    moe_gemm_dims d4 = d, d8 = d;
    d4.a4 = true;
    d8.a8 = true;
    double e4 = down_err(&d4, h, ids, tw, w, s, P, exact, rows);
    double e8 = down_err(&d8, h, ids, tw, w, s, P, exact, rows);
    /* int8 steps are about 1/16 of E2M1's at the top of a block: expect
     * the mean error well under a quarter of a4w4's. */
    cr_expect(e8 > 0 && e8 < 0.25 * e4, "seed %llu: mean |error| a8w4 %g, a4w4 %g",
              (unsigned long long)seed, e8, e4);
    free(h);
    free(w);
    free(s);
    free(exact);
    free(rows);
}

/* The cpu kernels against the reference at one --arch (NULL: native) on
 * cases [c0, c1) (each case is one compile: the lower levels take one,
 * in turn); a level this CPU lacks is skipped. */
static void check_arch(const char *arch, int c0, int c1)
{
    static const struct {
        const char *fam, *key;
        int64_t m;
    } cases[] = {
        {"moe_gemm_up", "H=384,I=256,E=8,topk=2,a=i8,cat=0,bm=16,skew=0", 7},
        {"moe_gemm_down", "H=256,I=384,E=16,topk=4,a=i8,comb=1,bm=16,skew=2", 5},
        {"moe_gemm_down", "H=256,I=128,E=16,topk=4,a=i8,comb=0,bm=16,skew=1", 33},
        {"moe_gemm_up", "tiny-a8", 1},
    };
    dev_device *dv = open_cpu_arch(arch);
    if (!dv)
        return;
    mt_err err = MT_ERR_INIT;
    mt_status st;
    uint64_t seed = mt_seed_fresh();
    for (int c = c0; c < c1; c++) {
        const kern_family *f = kern_family_find(cases[c].fam);
        st = kern_check_one(dv, f, cases[c].key, cases[c].m, NULL, seed + (uint64_t)c, &err);
        cr_expect_eq(st, MT_OK, "%s %s M=%lld on cpu --arch %s, seed %llu: %s", cases[c].fam,
                     cases[c].key, (long long)cases[c].m, arch ? arch : "native",
                     (unsigned long long)(seed + (uint64_t)c), err.msg);
    }
    dev_close(dv);
}

Test(moe_a8w4, cpu_native_matches_reference, .timeout = 300) { check_arch(NULL, 0, 3); }
Test(moe_a8w4, cpu_avx512bw_matches_reference, .timeout = 300) { check_arch("x86-64-v4", 1, 2); }
Test(moe_a8w4, cpu_avx2_matches_reference, .timeout = 300) { check_arch("x86-64-v3", 0, 1); }
Test(moe_a8w4, cpu_portable_matches_reference, .timeout = 300) { check_arch("x86-64-v2", 2, 3); }

Test(moe_a8w4, gpu_refuses_a8)
{
    const kern_family *f = kern_family_find("moe_gemm_down");
    kern_shape s;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_shape_parse(f, "tiny-a8", &s, NULL, &err), MT_OK, "%s", err.msg);
    dev_props p = {.backend = DEV_BACKEND_HIP, .arch = "gfx90a", .warp_size = 64, .max_threads_per_block = 1024,
                   .static_shared_per_block = 65536};
    kern_config cfg;
    f->gpu->default_config(&s, 1, &p, &cfg);
    char why[256] = "";
    cr_expect(!kern_config_valid(f, f->gpu, &s, 1, &cfg, &p, why, sizeof why));
    cr_expect(strstr(why, "a8w4") != NULL, "reason names a8w4: '%s'", why);
}
