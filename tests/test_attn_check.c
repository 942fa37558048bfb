/* test_attn_check.c: every attention family (mla_decode, mla_prefill,
 * dsa_indexer, rope) against its C reference on a device: the family's own
 * cases with the default config, then a random sample of valid configs on
 * one small case. Fresh seeds, printed on failure; outputs are poisoned by
 * the runner before every launch. This file runs the cpu backend; the same
 * file, built with ATTN_CHECK_EMU by test_attn_emu.c, runs the HIP sources
 * on emu (wave64 and wave32). hipRTC compiles are in test_attn_hiprtc.c. */
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

#ifndef ATTN_CHECK_EMU
Test(attn_check, mla_decode_cpu) { check_family(&fam_mla_decode, "cpu", 8, 5); }

Test(attn_check, mla_prefill_cpu) { check_family(&fam_mla_prefill, "cpu", 8, 3); }

Test(attn_check, dsa_indexer_cpu) { check_family(&fam_dsa_indexer, "cpu", 8, 4); }

Test(attn_check, rope_cpu) { check_family(&fam_rope, "cpu", 4, 4); }
#else
Test(attn_check, mla_decode_emu_wave64) { check_family(&fam_mla_decode, "emu", 3, 5); }
Test(attn_check, mla_decode_emu_wave32) { check_family(&fam_mla_decode, "emu:wave32", 3, 3); }
Test(attn_check, mla_prefill_emu_wave64) { check_family(&fam_mla_prefill, "emu", 3, 3); }
Test(attn_check, mla_prefill_emu_wave32) { check_family(&fam_mla_prefill, "emu:wave32", 3, 3); }
Test(attn_check, dsa_indexer_emu_wave64) { check_family(&fam_dsa_indexer, "emu", 3, 4); }
Test(attn_check, dsa_indexer_emu_wave32) { check_family(&fam_dsa_indexer, "emu:wave32", 3, 4); }
Test(attn_check, rope_emu_wave64) { check_family(&fam_rope, "emu", 3, 4); }
Test(attn_check, rope_emu_wave32) { check_family(&fam_rope, "emu:wave32", 3, 4); }
#endif
