/* MOE_CHECK_SPEC is the device this file checks (set by its includer), with
 * MOE_CHECK_ARCH (optional) as its --arch: on cpu an x86-64 level that caps
 * the code the backend compiles, so lower SIMD paths run here too; a level
 * this CPU lacks skips the tests. */
/* moe_check.h: the body of test_moe_check_*.c: every MoE family (moe_route,
 * moe_align, moe_gemm_up, moe_gemm_down, moe_combine, mxfp4_quant) against
 * its C reference on one device: the family's own small cases (M in {1, 3,
 * 17, 64} and more; M not a multiple of any tile, experts with no tokens,
 * every token on one expert, topk 1) with the default config, plus sampled
 * valid configs of each space on two cases. Fresh seeds, printed on
 * failure. Not a test by itself (no test_ prefix). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/rng.h"
#include "device/device.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"

static void check_cases(const char *spec, const char *fname, int extra_configs)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
#ifdef MOE_CHECK_ARCH
    dev_open_opts oo = {.arch = MOE_CHECK_ARCH};
    mt_status ost = dev_open(spec, &oo, &d, &err);
    if (ost == MT_E_UNSUPPORTED)
        cr_skip_test("%s --arch %s: %s", spec, MOE_CHECK_ARCH, err.msg);
#else
    mt_status ost = dev_open(spec, NULL, &d, &err);
#endif
    if (ost != MT_OK)
        cr_assert_fail("open %s: %s", spec, err.msg);
    const kern_family *f = kern_family_find(fname);
    cr_assert_not_null(f, "family %s is registered", fname);
    const kern_impl *im = kern_family_impl(f, dev_get_props(d)->backend);
    cr_assert_not_null(im, "%s has an implementation for %s", fname, spec);
#ifdef MOE_CHECK_ARCH
    /* A capped level compiles the same C where the source has no ISA path
     * (no __AVX test): the uncapped suite checks it. */
    const char *src = kern_source_get(im->source);
    cr_assert_not_null(src, "%s", im->source);
    if (!strstr(src, "__AVX")) {
        dev_close(d);
        cr_skip_test("%s has no ISA-specific path: test_moe_check_cpu runs it", im->source);
    }
#endif
    uint64_t seed = mt_seed_fresh();
    for (int c = 0; c < f->n_cases; c++) {
        kern_shape s;
        if (kern_shape_parse(f, f->cases[c].key, &s, NULL, &err) != MT_OK)
            cr_assert_fail("%s", err.msg);
        /* wl=1 (weights grouped by 16 rows) is the cpu kernels' layout only:
         * the GPU kernels refuse it (test_family checks they do). */
        bool grouped = kern_shape_get(f, &s, "wl") == 1;
        if (grouped && dev_get_props(d)->backend != DEV_BACKEND_CPU)
            continue;
        mt_status st = kern_check_one(d, f, f->cases[c].key, f->cases[c].m, NULL, seed + c, &err);
        cr_expect_eq(st, MT_OK, "%s on %s, case %s M=%lld, default config, seed %llu: %s",
                     fname, spec, f->cases[c].key, (long long)f->cases[c].m,
                     (unsigned long long)(seed + c), err.msg);
        /* Other valid configs of the space on the first and the last case
         * (each config is one more compile). */
        if (c != 0 && c != f->n_cases - 1 && !grouped)
            continue;
        int64_t m = f->cases[c].m;
        mt_rng r;
        mt_rng_seed(&r, seed ^ (uint64_t)c);
        uint64_t n = kern_space_size(im);
        int done = 0;
        for (int tries = 0; tries < 200 && done < extra_configs; tries++) {
            kern_config cfg;
            kern_space_point(im, mt_rng_below(&r, n), &cfg);
            char why[256];
            if (!kern_config_valid(f, im, &s, m, &cfg, dev_get_props(d), why, sizeof why))
                continue;
            char key[256];
            kern_config_key(im, &cfg, key, sizeof key);
            st = kern_check_one(d, f, f->cases[c].key, m, &cfg, seed + c, &err);
            cr_expect_eq(st, MT_OK, "%s on %s, case %s M=%lld, config %s, seed %llu: %s",
                         fname, spec, f->cases[c].key, (long long)m, key,
                         (unsigned long long)(seed + c), err.msg);
            done++;
        }
    }
    dev_close(d);
}

#define MOE_FAMILY_TEST(fam)                                                        \
    Test(MOE_CHECK_SUITE, fam##_matches_reference, .timeout = 600)                  \
    {                                                                               \
        check_cases(MOE_CHECK_SPEC, #fam, MOE_CHECK_CONFIGS);                       \
    }

MOE_FAMILY_TEST(moe_route)
MOE_FAMILY_TEST(moe_align)
MOE_FAMILY_TEST(moe_gemm_up)
MOE_FAMILY_TEST(moe_gemm_down)
MOE_FAMILY_TEST(moe_combine)
MOE_FAMILY_TEST(mxfp4_quant)
