/* test_attn_hiprtc.c: hipRTC (compile-only, gfx90a) compiles the default
 * and a random sample of each attention family's space at GLM-5.2 widths;
 * registers, LDS and spills are logged. Skipped when the build has no HIP. */
#include <criterion/criterion.h>
#include <inttypes.h>

#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"

extern const kern_family fam_mla_decode, fam_mla_prefill, fam_dsa_indexer, fam_rope;

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
