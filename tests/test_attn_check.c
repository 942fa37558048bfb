/* test_attn_check.c: every attention family (mla_decode, mla_prefill,
 * dsa_indexer, rope) against its C reference on cpu, emu (wave64) and
 * emu:wave32: the family's own cases with the default config, then a
 * random sample of valid configs on one small case. Fresh seeds, printed on
 * failure; outputs are poisoned by the runner before every launch. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>

#include "common/rng.h"
#include "kernels/family.h"
#include "kernels/runner.h"

extern const kern_family fam_mla_decode, fam_mla_prefill, fam_dsa_indexer, fam_rope;

static dev_device *open_dev(const char *spec)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    dev_open_opts o = {.threads = 2};
    mt_status st = dev_open(spec, &o, &d, &err);
    cr_assert_eq(st, MT_OK, "dev_open %s: %s", spec, err.msg);
    dev_set_launch_timeout(d, 120000);
    return d;
}

/* The family's cases with the default config; then n_sampled configs of
 * case `sample_case` (drawn with the seed). */
static void check_family(const kern_family *f, const char *spec, int n_sampled,
                         int sample_case)
{
    dev_device *d = open_dev(spec);
    uint64_t seed = mt_seed_fresh();
    for (int i = 0; i < f->n_cases; i++) {
        mt_err err = MT_ERR_INIT;
        mt_status st = kern_check_one(d, f, f->cases[i].key, f->cases[i].m, NULL, seed + i, &err);
        cr_expect_eq(st, MT_OK, "%s on %s, case %s M=%" PRId64 ", seed %" PRIu64 ": %s",
                     f->name, spec, f->cases[i].key, f->cases[i].m, seed + i, err.msg);
    }
    const kern_case *c = &f->cases[sample_case];
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, c->key, &s, NULL, NULL), MT_OK);
    const kern_impl *im = kern_family_impl(f, dev_get_props(d)->backend);
    kern_config cfgs[16];
    int n = kern_space_sample(f, im, &s, c->m, dev_get_props(d), seed, false, cfgs,
                              n_sampled < 16 ? n_sampled : 16);
    cr_expect_gt(n, 0, "%s: no valid config sampled on %s", f->name, spec);
    for (int i = 0; i < n; i++) {
        mt_err err = MT_ERR_INIT;
        char key[256];
        kern_config_key(im, &cfgs[i], key, sizeof key);
        mt_status st = kern_check_one(d, f, c->key, c->m, &cfgs[i], seed + 100 + i, &err);
        cr_expect_eq(st, MT_OK, "%s on %s, case %s M=%" PRId64 ", config %s, seed %" PRIu64
                     ": %s", f->name, spec, c->key, c->m, key, seed + 100 + i, err.msg);
    }
    dev_close(d);
}

Test(attn_check, mla_decode_cpu) { check_family(&fam_mla_decode, "cpu", 8, 5); }
Test(attn_check, mla_decode_emu_wave64) { check_family(&fam_mla_decode, "emu", 4, 5); }
Test(attn_check, mla_decode_emu_wave32) { check_family(&fam_mla_decode, "emu:wave32", 4, 3); }

Test(attn_check, mla_prefill_cpu) { check_family(&fam_mla_prefill, "cpu", 8, 3); }
Test(attn_check, mla_prefill_emu_wave64) { check_family(&fam_mla_prefill, "emu", 4, 3); }
Test(attn_check, mla_prefill_emu_wave32) { check_family(&fam_mla_prefill, "emu:wave32", 4, 3); }

Test(attn_check, dsa_indexer_cpu) { check_family(&fam_dsa_indexer, "cpu", 8, 4); }
Test(attn_check, dsa_indexer_emu_wave64) { check_family(&fam_dsa_indexer, "emu", 4, 4); }
Test(attn_check, dsa_indexer_emu_wave32) { check_family(&fam_dsa_indexer, "emu:wave32", 4, 4); }

Test(attn_check, rope_cpu) { check_family(&fam_rope, "cpu", 4, 4); }
Test(attn_check, rope_emu_wave64) { check_family(&fam_rope, "emu", 4, 4); }
Test(attn_check, rope_emu_wave32) { check_family(&fam_rope, "emu:wave32", 4, 4); }

/* hipRTC (compile-only, gfx90a): the default and a sample of each family's
 * space at GLM-5.2 widths compile, and report registers and no spills
 * beyond what the compiler reports (printed for the record). */
static void compile_hip(const kern_family *f, const char *key, int64_t m, int n_sampled)
{
#ifndef MOETUNE_HAVE_HIP
    (void)f, (void)key, (void)m, (void)n_sampled;
    cr_skip_test("this build has no HIP backend");
#else
    dev_open_opts o = {.arch = "gfx90a"};
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("hip", &o, &d, &err), MT_OK, "%s", err.msg);
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, key, &s, NULL, &err), MT_OK, "%s", err.msg);
    kern_config cfgs[8];
    uint64_t seed = mt_seed_fresh();
    int n = kern_space_sample(f, f->gpu, &s, m, dev_get_props(d), seed, true, cfgs,
                              n_sampled < 8 ? n_sampled : 8);
    cr_assert_gt(n, 0);
    for (int i = 0; i < n; i++) {
        char ck[256];
        kern_config_key(f->gpu, &cfgs[i], ck, sizeof ck);
        dev_code *code = NULL;
        mt_status st = kern_compile(d, f, f->gpu, &s, &cfgs[i], &code, &err);
        cr_expect_eq(st, MT_OK, "%s %s config %s (seed %" PRIu64 "): %s", f->name, key, ck,
                     seed, err.msg);
        if (st != MT_OK)
            continue;
        const dev_code_info *info = dev_code_get_info(code);
        for (int k = 0; k < info->n_kernels; k++)
            cr_log_info("%s %s: %s vgprs %d lds %lld spills %d", f->name, ck,
                        info->kernels[k].name, info->kernels[k].vgprs,
                        (long long)info->kernels[k].lds_bytes, info->kernels[k].spill_vgprs);
        dev_code_free(code);
    }
    dev_close(d);
#endif
}

Test(attn_hiprtc, mla_decode_gfx90a) { compile_hip(&fam_mla_decode, "glm5.2", 1, 3); }
Test(attn_hiprtc, mla_prefill_gfx90a) { compile_hip(&fam_mla_prefill, "glm5.2", 256, 3); }
Test(attn_hiprtc, dsa_indexer_gfx90a) { compile_hip(&fam_dsa_indexer, "glm5.2", 4, 3); }
Test(attn_hiprtc, rope_gfx90a) { compile_hip(&fam_rope, "glm5.2-idxk", 16, 3); }
