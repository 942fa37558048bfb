/* test_forward_hiprtc.c: hipRTC (compile-only, gfx90a) compiles the default
 * and a random sample of each glue kernel family the model runtime adds
 * (ops_*), at GLM-5.2 widths. Skipped when the build has no HIP. */
#include <criterion/criterion.h>
#include <inttypes.h>

#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"

static void compile_hip(const char *family, const char *key, int64_t m)
{
#ifndef MOETUNE_HAVE_HIP
    (void)family, (void)key, (void)m;
    cr_skip_test("this build has no HIP backend");
#else
    const kern_family *f = kern_family_find(family);
    cr_assert_not_null(f, "%s", family);
    dev_open_opts o = {.arch = "gfx90a"};
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("hip", &o, &d, &err), MT_OK, "%s", err.msg);
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, key, &s, NULL, &err), MT_OK, "%s", err.msg);
    kern_config cfgs[3];
    uint64_t seed = mt_seed_fresh();
    int n = kern_space_sample(f, f->gpu, &s, m, dev_get_props(d), seed, true, cfgs, 3);
    cr_assert_gt(n, 0);
    for (int i = 0; i < n; i++) {
        char ck[256];
        kern_config_key(f->gpu, &cfgs[i], ck, sizeof ck);
        dev_code *code = NULL;
        mt_status st = kern_compile(d, f, f->gpu, &s, &cfgs[i], &code, &err);
        cr_expect_eq(st, MT_OK, "%s %s config %s (seed %" PRIu64 "): %s", family, key, ck, seed,
                     err.msg);
        dev_code_free(code);
    }
    dev_close(d);
#endif
}

Test(forward_hiprtc, ops_embed_gfx90a) { compile_hip("ops_embed", "glm5.2", 16); }
Test(forward_hiprtc, ops_copy_gfx90a) { compile_hip("ops_copy", "glm5.2-q", 16); }
Test(forward_hiprtc, ops_residual_gfx90a) { compile_hip("ops_residual", "glm5.2", 16); }
Test(forward_hiprtc, ops_silu_mul_gfx90a) { compile_hip("ops_silu_mul", "glm5.2", 16); }
Test(forward_hiprtc, ops_head_gemm_gfx90a) { compile_hip("ops_head_gemm", "glm5.2-qabs", 8); }
Test(forward_hiprtc, ops_kv_store_gfx90a) { compile_hip("ops_kv_store", "glm5.2-fp8", 4); }
