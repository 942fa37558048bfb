/* test_attn_defaults.c: the default GPU configs of the attention families
 * (mla_decode, dsa_indexer, mla_prefill) take the matrix-instruction path
 * where kern_mma_tile says the device has one and the scalar path where it
 * does not; and at GLM-5.2 dims the defaults compile, without a GPU, for
 * gfx90a (hipRTC) and gfx942 (clang-19) with v_mfma, no scratch and no
 * spills (test_mma_util.h), every other kernel of their code objects (the
 * split-K combine, the top-k, the prefill expansion) without scratch too,
 * and for sm_90 (NVRTC) with mma.sync in the PTX and no local memory in
 * any kernel; each skipped, naming the missing compiler, when absent. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "device/cuda/ptx_mix.h"
#include "kernels/core/family.h"
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

/* Compiles case dc's default on d and checks that no kernel of the code
 * object has scratch (local memory) or spills; returns the code. */
static dev_code *no_scratch_anywhere(dev_device *d, const dcase *dc, const char *key)
{
    const kern_family *f = kern_family_find(dc->family);
    const dev_props *p = dev_get_props(d);
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, dc->shape, &s, NULL, NULL), MT_OK);
    kern_config c;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_config_parse(f->gpu, key, &c, &err), MT_OK, "%s", err.msg);
    dev_code *code = NULL;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s on %s: %s",
                 dc->family, p->arch, err.msg);
    const dev_code_info *info = dev_code_get_info(code);
    cr_assert_gt(info->n_kernels, 0, "%s on %s: no kernels listed", dc->family, p->arch);
    for (int k = 0; k < info->n_kernels; k++) {
        const dev_kernel_res *r = &info->kernels[k];
        cr_assert_eq(r->private_bytes, 0, "%s on %s, %s (%s): %lld bytes of scratch per lane",
                     dc->family, p->arch, r->name, key, (long long)r->private_bytes);
        cr_assert(r->spill_vgprs <= 0 && r->spill_sgprs <= 0, "%s on %s, %s (%s): spills",
                  dc->family, p->arch, r->name, key);
    }
    return code;
}

/* Every case's default on arch through test_mma_util.h's checks, and no
 * scratch in any of its kernels. */
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
        dev_code_free(no_scratch_anywhere(d, &cases[i], key));
    }
    dev_close(d);
}

/* sm_90: the defaults' PTX (NVRTC's, kept with the cubin) has mma.sync in
 * the case's kernel and no local memory in any kernel; ptxas reports no
 * stack and no spills. */
Test(attn_defaults, nvrtc_sm90_defaults_build_mma_without_local_memory, .timeout = 300)
{
    dev_device *d = mma_open_or_skip("cuda", "sm_90");
    const dev_props *p = dev_get_props(d);
    for (int i = 0; i < N_CASES; i++) {
        char key[256];
        cr_assert_eq(default_mma(&cases[i], p, key, sizeof key), 1, "%s on sm_90: %s",
                     cases[i].family, key);
        dev_code *code = no_scratch_anywhere(d, &cases[i], key);
        const char *ptx = dev_code_get_text(code);
        cr_assert_not_null(ptx, "sm_90 %s: no PTX with the cubin", cases[i].family);
        dev_ptx_report *rep = malloc(sizeof *rep);
        cr_assert_not_null(rep);
        dev_ptx_parse(ptx, rep);
        const dev_ptx_func *fn = dev_ptx_find(rep, cases[i].kernel);
        cr_assert_not_null(fn, "sm_90 %s: no .entry %s in the PTX", key, cases[i].kernel);
        cr_assert_gt(fn->mma, 0, "sm_90 %s %s: no mma.sync in the PTX", cases[i].family, key);
        const dev_code_info *info = dev_code_get_info(code);
        for (int k = 0; k < info->n_kernels; k++) {
            const dev_ptx_func *g = dev_ptx_find(rep, info->kernels[k].name);
            cr_assert(!g || g->local == 0, "sm_90 %s %s: %d local loads/stores in %s",
                      cases[i].family, key, g ? g->local : 0, info->kernels[k].name);
        }
        cr_log_info("sm_90 %s %s M=%lld %s: %d mma, %d registers", cases[i].family,
                    cases[i].shape, (long long)cases[i].m, key, fn->mma,
                    td_find_res(code, cases[i].kernel)->vgprs);
        free(rep);
        dev_code_free(code);
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
