/* test_attn_defaults.c: the default GPU configs of the attention families
 * (mla_decode, dsa_indexer, mla_prefill) take the matrix-instruction path
 * where kern_mma_tile says the device has one and the scalar path where it
 * does not; and at GLM-5.2 dims the defaults compile, without a GPU, for
 * gfx90a (hipRTC) and gfx942 (clang-19) with v_mfma, no scratch and no
 * spills (test_mma_util.h; each skipped, naming the missing compiler, when
 * absent). */
#include <criterion/criterion.h>
#include <stdio.h>

#include "kernels/family.h"
#include "test_mma_util.h"

typedef struct dcase {
    const char *family, *shape, *kernel;
    int64_t m;
} dcase;

/* Decode of one token (sparse, 2048 of 4096), the indexer over 8192 keys,
 * a 256-token prefill chunk after 1024 cached. */
static const dcase cases[] = {
    {"mla_decode", "glm5.2", "mla_decode_split", 1},
    {"dsa_indexer", "glm5.2", "dsa_scores", 1},
    {"mla_prefill", "glm5.2", "mla_prefill_attn", 256},
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

/* The default config of case i on p, as its key text. */
static int default_mma(const dcase *dc, const dev_props *p, char *key, size_t cap)
{
    const kern_family *f = kern_family_find(dc->family);
    cr_assert_not_null(f, "%s", dc->family);
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, dc->shape, &s, NULL, NULL), MT_OK);
    kern_config c;
    f->gpu->default_config(&s, dc->m, p, &c);
    char why[256] = "";
    cr_assert(kern_config_valid(f, f->gpu, &s, dc->m, &c, p, why, sizeof why), "%s on %s: %s",
              dc->family, p->arch, why);
    kern_config_key(f->gpu, &c, key, cap);
    return kern_config_get(f->gpu, &c, "MMA", -1);
}

Test(attn_defaults, mma_exactly_where_the_device_has_matrix_instructions)
{
    dev_props gfx1030 = {.backend = DEV_BACKEND_HIP, .warp_size = 32, .arch = "gfx1030",
                         .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                         .static_shared_per_block = 65536, .compute_units = 40};
    dev_props mi300 = gfx1030;
    mi300.warp_size = 64;
    mi300.compute_units = 304;
    snprintf(mi300.arch, sizeof mi300.arch, "gfx942");
    dev_props h200 = {.backend = DEV_BACKEND_CUDA, .warp_size = 32, .arch = "sm_90",
                      .max_threads_per_block = 1024, .shared_mem_per_block = 232448,
                      .static_shared_per_block = 49152, .compute_units = 132};
    for (int i = 0; i < N_CASES; i++) {
        char key[256];
        cr_expect_eq(default_mma(&cases[i], &mi300, key, sizeof key), 1, "%s on gfx942: %s",
                     cases[i].family, key);
        cr_expect_eq(default_mma(&cases[i], &h200, key, sizeof key), 1, "%s on sm_90: %s",
                     cases[i].family, key);
        cr_expect_eq(default_mma(&cases[i], &gfx1030, key, sizeof key), 0,
                     "%s on gfx1030: %s", cases[i].family, key);
    }
}

/* Every case's default on arch through test_mma_util.h's checks. */
static void compile_defaults(const char *arch, const char *mfma)
{
    dev_device *d = mma_open_or_skip("hip", arch);
    const dev_props *p = dev_get_props(d);
    for (int i = 0; i < N_CASES; i++) {
        char key[256];
        cr_assert_eq(default_mma(&cases[i], p, key, sizeof key), 1, "%s on %s: %s",
                     cases[i].family, arch, key);
        mma_compile_amd(kern_family_find(cases[i].family), cases[i].kernel, arch,
                        cases[i].shape, cases[i].m, key, mfma);
    }
    dev_close(d);
}

Test(attn_defaults, hiprtc_gfx90a_defaults_build_mfma_without_scratch)
{
    compile_defaults("gfx90a", "v_mfma_f32_16x16x16bf16_1k");
}

/* CDNA3 spells the instruction without the _1k. */
Test(attn_defaults, clang_gfx942_defaults_build_mfma_without_scratch)
{
    compile_defaults("gfx942", "v_mfma_f32_16x16x16_bf16");
}
