/* test_moe_hiprtc.c: hipRTC compiles the default config and a sample of
 * the space of every MoE family at the GLM-5.2 shape for gfx90a (no GPU
 * needed) and reports each kernel's resources (VGPRs, SGPRs, LDS, spills).
 * Skipped when this build has no hip backend. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "common/rng.h"
#include "device/device.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"

static const char *const fams[] = {"moe_route", "moe_align", "moe_gemm_up",
                                   "moe_gemm_down", "moe_combine", "mxfp4_quant"};

Test(moe_hiprtc, every_family_compiles_for_gfx90a, .timeout = 600)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    dev_open_opts o = {.arch = "gfx90a"};
    mt_status st = dev_open("hip", &o, &d, &err);
    if (st == MT_E_UNSUPPORTED)
        cr_skip_test("no hip backend in this build: %s", err.msg);
    cr_assert_eq(st, MT_OK, "%s", err.msg);
    const dev_props *p = dev_get_props(d);
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        const kern_family *f = kern_family_find(fams[i]);
        kern_shape s;
        cr_assert_eq(kern_shape_parse(f, "glm5.2", &s, NULL, &err), MT_OK, "%s", err.msg);
        int done = 0;
        for (int t = 0; t < 500 && done < 2; t++) {
            kern_config c;
            if (t == 0)
                f->gpu->default_config(&s, 16, p, &c);
            else
                kern_space_point(f->gpu, mt_rng_below(&r, kern_space_size(f->gpu)), &c);
            char why[256], key[256];
            bool ok = kern_config_valid(f, f->gpu, &s, 16, &c, p, why, sizeof why);
            kern_config_key(f->gpu, &c, key, sizeof key);
            if (t == 0)
                cr_assert(ok, "%s default %s is invalid for gfx90a: %s", f->name, key, why);
            if (!ok)
                continue;
            dev_code *code = NULL;
            st = kern_compile(d, f, f->gpu, &s, &c, &code, &err);
            cr_expect_eq(st, MT_OK, "%s %s (seed %llu): %s", f->name, key,
                         (unsigned long long)seed, err.msg);
            if (st == MT_OK) {
                const dev_code_info *ci = dev_code_get_info(code);
                cr_expect_gt(ci->n_kernels, 0, "%s %s: no kernel in the code object", f->name, key);
                for (int k = 0; k < ci->n_kernels; k++)
                    cr_log_info("%s %s: %s vgprs %d sgprs %d lds %lld spills %d", f->name, key,
                                ci->kernels[k].name, ci->kernels[k].vgprs, ci->kernels[k].sgprs,
                                (long long)ci->kernels[k].lds_bytes, ci->kernels[k].spill_vgprs);
                dev_code_free(code);
            }
            done++;
        }
    }
    dev_close(d);
}
