/* test_attn_mma.c: mla_decode's matrix-instruction path (MMA=1|2): explicit
 * configs against the family's C reference on emu wave64 (AMD layouts,
 * both shapes) and wave32 (NVIDIA's 16x8x16), dense and DSA-sparse, bf16
 * and fp8 caches, contexts that are not a multiple of BN, selection lists
 * longer than the context (entries ignored), split contexts, on fresh
 * seeds; the validity rules (no such instruction, tiles, accumulators,
 * static shared memory, each naming the parameter); and, without a GPU,
 * that hipRTC (gfx90a), clang-19 (gfx942) and NVRTC (sm_90) build the
 * GLM-5.2 tiles with matrix instructions and no scratch (each skipped when
 * its compiler is absent). The compile tests log the instruction mix that
 * docs/BENCHMARKS.md quotes. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/files.h"
#include "common/rng.h"
#include "device/device.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"
#include "test_mma_util.h"

static const kern_family *fam(void)
{
    const kern_family *f = kern_family_find("mla_decode");
    cr_assert_not_null(f);
    return f;
}

/* Small (emu is slow). Sparse with empty and out-of-context slots (topk <
 * C); sparse with a list longer than the context (C < topk, fp8); dense
 * fp8 with 37 keys; dense bf16 with a wider latent; queries of one page
 * row see different lengths (M > 1). */
static const mma_case cases[] = {
    {"H=32,L=64,R=16,D=32,topk=24,ps=5,kv=bf16,sparse=1,C=50", 2},
    {"H=32,L=64,R=32,D=48,topk=40,ps=4,kv=fp8,sparse=1,C=19", 2},
    {"H=32,L=64,R=16,D=32,topk=16,ps=7,kv=fp8,sparse=0,C=37", 1},
    {"H=32,L=128,R=32,D=48,topk=16,ps=16,kv=bf16,sparse=0,C=45", 3},
};
/* GLM-5.2 widths (576 = 512 + 64), fewer heads. */
static const mma_case glm_cases[] = {
    {"H=16,L=512,R=64,D=192,topk=32,ps=64,kv=fp8,sparse=1,C=45", 1},
    {"H=16,L=512,R=64,D=192,topk=32,ps=64,kv=bf16,sparse=0,C=21", 1},
};

/* HB=32 over 4 waves of 16-row fragments: two waves idle in QK^T. */
static const char *const wave64_cfgs[] = {
    "HB=16,BN=16,WAVES=1,MMA=1,NSPLIT=1",
    "HB=16,BN=32,WAVES=2,MMA=1,NSPLIT=2",
    "HB=32,BN=16,WAVES=4,MMA=1,NSPLIT=4",
    "HB=32,BN=32,WAVES=2,MMA=2,NSPLIT=2",
    "HB=32,BN=64,WAVES=1,MMA=2,NSPLIT=1",
};
static const char *const wave64_glm[] = {
    "HB=16,BN=32,WAVES=4,MMA=1,NSPLIT=2",
};
static const char *const wave32_cfgs[] = {
    "HB=16,BN=16,WAVES=2,MMA=1,NSPLIT=1",
    "HB=32,BN=32,WAVES=4,MMA=1,NSPLIT=2",
    "HB=16,BN=64,WAVES=2,MMA=1,NSPLIT=4",
    "HB=32,BN=16,WAVES=1,MMA=1,NSPLIT=8",
};
static const char *const wave32_glm[] = {
    "HB=16,BN=16,WAVES=8,MMA=1,NSPLIT=2",
};

Test(attn_mma, mla_decode_matches_the_reference_on_wave64, .timeout = 900)
{
    mma_check_on(fam(), "emu:wave64", wave64_cfgs, 5, cases, 4);
    mma_check_on(fam(), "emu:wave64", wave64_glm, 1, glm_cases, 2);
}

Test(attn_mma, mla_decode_matches_the_reference_on_wave32, .timeout = 900)
{
    mma_check_on(fam(), "emu:wave32", wave32_cfgs, 4, cases, 4);
    mma_check_on(fam(), "emu:wave32", wave32_glm, 1, glm_cases, 2);
}

/* ---- validity ------------------------------------------------------------ */

static bool valid_on(const char *shape, const char *cfg, const dev_props *p, char *why,
                     size_t cap)
{
    const kern_family *f = fam();
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, shape, &s, NULL, NULL), MT_OK);
    kern_config c;
    mma_parse(fam(), cfg, &c);
    why[0] = 0;
    return kern_config_valid(f, f->gpu, &s, 1, &c, p, why, cap);
}

static void expect_refused(const char *shape, const char *cfg, const dev_props *p,
                           const char *names)
{
    char why[256];
    cr_expect_not(valid_on(shape, cfg, p, why, sizeof why), "%s on %s is valid", cfg,
                  p->arch);
    cr_expect(strstr(why, names) != NULL, "%s: reason '%s' does not name %s", cfg, why, names);
}

Test(attn_mma, validity_names_the_parameter_at_fault)
{
    dev_props emu32 = {.backend = DEV_BACKEND_EMU, .warp_size = 32, .arch = "emu",
                       .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                       .static_shared_per_block = 65536};
    dev_props emu64 = emu32;
    emu64.warp_size = 64;
    dev_props gfx1030 = {.backend = DEV_BACKEND_HIP, .warp_size = 32, .arch = "gfx1030",
                         .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                         .static_shared_per_block = 65536};
    dev_props sm75 = {.backend = DEV_BACKEND_CUDA, .warp_size = 32, .arch = "sm_75",
                      .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                      .static_shared_per_block = 49152};
    dev_props h200 = sm75;
    snprintf(h200.arch, sizeof h200.arch, "sm_90");
    h200.shared_mem_per_block = 232448;
    dev_props mi300 = {.backend = DEV_BACKEND_HIP, .warp_size = 64, .arch = "gfx942",
                       .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                       .static_shared_per_block = 65536};
    const char *glm = "glm5.2", *fp8 = "glm5.2-fp8";
    const char *ok16 = "HB=64,BN=32,WAVES=4,MMA=1,NSPLIT=8";
    const char *ok32 = "HB=64,BN=32,WAVES=4,MMA=2,NSPLIT=8";
    const char *nv16 = "HB=64,BN=16,WAVES=8,MMA=1,NSPLIT=8";
    char why[256];
    cr_expect(valid_on(glm, ok16, &mi300, why, sizeof why), "%s", why);
    cr_expect(valid_on(fp8, ok32, &mi300, why, sizeof why), "%s", why);
    cr_expect(valid_on(glm, ok32, &emu64, why, sizeof why), "%s", why);
    cr_expect(valid_on(glm, nv16, &h200, why, sizeof why), "%s", why);
    cr_expect(valid_on(glm, nv16, &emu32, why, sizeof why), "%s", why);
    /* no such instruction: 32x32x8 on wave32, no MFMA on RDNA, no bf16 mma on Turing */
    expect_refused(glm, ok32, &emu32, "MMA=2");
    expect_refused(glm, ok32, &h200, "MMA=2");
    expect_refused(glm, ok16, &gfx1030, "MMA=1");
    expect_refused(glm, nv16, &sm75, "MMA=1");
    /* tiles: 8 heads in a 16-row fragment; BN=16 under a 32-wide fragment;
     * BN=8 under K=16 */
    expect_refused(glm, "HB=8,BN=32,WAVES=4,MMA=1,NSPLIT=8", &mi300, "HB=8");
    expect_refused(glm, "HB=64,BN=16,WAVES=4,MMA=2,NSPLIT=8", &mi300, "BN=16");
    expect_refused(glm, "HB=64,BN=8,WAVES=4,MMA=1,NSPLIT=8", &emu32, "BN=8");
    /* L = 40 has no 16-wide fragment column for 2 waves */
    expect_refused("H=16,L=48,R=16,D=32,topk=16,ps=16,kv=bf16,sparse=1,C=40",
                   "HB=16,BN=16,WAVES=2,MMA=1,NSPLIT=1", &emu64, "WAVES=2");
    /* 64 x 512 outputs over 2 waves: 256 accumulators per lane */
    expect_refused(glm, "HB=64,BN=32,WAVES=2,MMA=1,NSPLIT=8", &mi300, "accumulator");
    /* shared memory: a 64-token tile alone is 64 x 580 x 2 = 74,240 bytes;
     * the 48 KB static limit of an H200 refuses what 64 KB takes */
    expect_refused(glm, "HB=64,BN=64,WAVES=4,MMA=1,NSPLIT=8", &mi300, "BN=64");
    cr_expect(valid_on(glm, "HB=64,BN=32,WAVES=8,MMA=1,NSPLIT=8", &emu32, why, sizeof why),
              "%s", why);
    expect_refused(glm, "HB=64,BN=32,WAVES=8,MMA=1,NSPLIT=8", &h200, "static shared");
    /* the scalar path's space is what it was */
    cr_expect(valid_on(glm, "HB=16,BN=16,WAVES=4,MMA=0,NSPLIT=8", &gfx1030, why, sizeof why),
              "%s", why);
}

/* ---- compile-only: instruction mix -------------------------------------- */

/* mla_decode at shape with cfg for arch: test_mma_util.h's checks on
 * mla_decode_split. */
static void compile_amd(const char *arch, const char *shape, const char *cfg_text,
                        const char *mfma)
{
    mma_compile_amd(fam(), "mla_decode_split", arch, shape, 1, cfg_text, mfma);
}

/* The GLM-5.2 tiles docs/BENCHMARKS.md discusses: 64 heads of one query
 * share each 32-token tile. */
#define AMD16 "HB=64,BN=32,WAVES=4,MMA=1,NSPLIT=8"
#define AMD32 "HB=64,BN=32,WAVES=4,MMA=2,NSPLIT=8"

Test(attn_mma, hiprtc_gfx90a_builds_mfma_without_scratch)
{
    compile_amd("gfx90a", "glm5.2", AMD16, "v_mfma_f32_16x16x16bf16_1k");
    compile_amd("gfx90a", "glm5.2-dense", AMD16, "v_mfma_f32_16x16x16bf16_1k");
    compile_amd("gfx90a", "glm5.2-fp8", AMD16, "v_mfma_f32_16x16x16bf16_1k");
    compile_amd("gfx90a", "glm5.2", AMD32, "v_mfma_f32_32x32x8bf16_1k");
    compile_amd("gfx90a", "glm5.2-fp8", AMD32, "v_mfma_f32_32x32x8bf16_1k");
}

/* CDNA3 spells the same instructions without the _1k. */
Test(attn_mma, clang_gfx942_builds_mfma_without_scratch)
{
    compile_amd("gfx942", "glm5.2", AMD16, "v_mfma_f32_16x16x16_bf16");
    compile_amd("gfx942", "glm5.2-fp8", AMD16, "v_mfma_f32_16x16x16_bf16");
    compile_amd("gfx942", "glm5.2", AMD32, "v_mfma_f32_32x32x8_bf16");
}

static void compile_nv(const char *shape, const char *cfg_text)
{
    const kern_family *f = fam();
    dev_device *d = mma_open_or_skip("cuda", "sm_90");
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, shape, &s, NULL, NULL), MT_OK);
    kern_config c;
    mma_parse(fam(), cfg_text, &c);
    char why[256] = "";
    cr_assert(kern_config_valid(f, f->gpu, &s, 1, &c, dev_get_props(d), why, sizeof why),
              "sm_90 %s: %s", cfg_text, why);
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *r = td_find_res(code, "mla_decode_split");
    /* NVRTC kept the output fragments (acc, HB*L/threads floats per lane)
     * in local memory until every loop over them was unrolled (MT_UNROLL). */
    cr_assert_eq(r->private_bytes, 0, "sm_90 %s %s: %lld bytes of local memory per lane",
                 shape, cfg_text, (long long)r->private_bytes);
    cr_log_info("sm_90 mla_decode_split %s %s: %d registers, %lld bytes shared, %lld bytes "
                "local", shape, cfg_text, r->vgprs, (long long)r->lds_bytes,
                (long long)r->private_bytes);
    dev_code_free(code);
    dev_close(d);
}

/* NVRTC's cubin has no disassembler here: the kernel cannot compile
 * without mma.sync (the source #errors without MT_MMA_HAVE). */
Test(attn_mma, nvrtc_sm90_builds_without_local_memory)
{
    compile_nv("glm5.2", "HB=64,BN=16,WAVES=8,MMA=1,NSPLIT=8");
    compile_nv("glm5.2-fp8", "HB=64,BN=16,WAVES=8,MMA=1,NSPLIT=8");
    compile_nv("glm5.2-dense", "HB=32,BN=32,WAVES=4,MMA=1,NSPLIT=8");
    compile_nv("glm5.2", "HB=32,BN=32,WAVES=8,MMA=1,NSPLIT=8");
}
