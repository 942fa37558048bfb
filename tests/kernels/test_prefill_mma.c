/* test_prefill_mma.c: mla_prefill's matrix-instruction path (MMA=1|2):
 * explicit configs against the family's C reference on emu wave64 (AMD
 * layouts, both shapes) and wave32 (NVIDIA's 16x8x16), bf16 and fp8 caches,
 * chunks that are not a multiple of BM, contexts that are not a multiple of
 * BN, a prefix of zero and GLM-5.2 widths, on fresh seeds; the validity
 * rules, each naming the parameter at fault; and, without a GPU, that
 * hipRTC (gfx90a) and clang-19 (gfx942) build the attention at BM = 64 and
 * the expansion with matrix instructions and no scratch, and NVRTC (sm_90) builds it (each
 * skipped when its compiler is absent). */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "device/device.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"
#include "test_mma_util.h"

static const kern_family *fam(void)
{
    const kern_family *f = kern_family_find("mla_prefill");
    cr_assert_not_null(f);
    return f;
}

/* Small (emu is slow): a chunk past a prefix (21 queries: not a multiple
 * of BM; 34 keys: not of BN), a chunk with no prefix on an fp8 cache (160
 * kv_b rows: the expansion's second row tile is partial), a latent whose
 * width is no multiple of 4, and GLM-5.2 widths (D 192, R 64, V 256) with
 * one head. */
static const mma_case cases[] = {
    {"H=2,L=32,R=16,D=32,V=32,ps=5,kv=bf16,P=13", 21},
    {"H=2,L=48,R=32,D=16,V=64,ps=7,kv=fp8,P=0", 19},
    /* a latent of 30 (no multiple of 4: the expansion's element loads) */
    {"H=1,L=30,R=16,D=16,V=32,ps=4,kv=bf16,P=6", 9},
};
static const mma_case glm_cases[] = {
    {"H=1,L=512,R=64,D=192,V=256,ps=64,kv=fp8,P=9", 5},
};

/* BM=32 over 4 waves: 2 waves per score row, V split 4 ways; one wave of
 * 32x32 fragments; BM=64, the tile the compile tests build. */
static const char *const wave64_cfgs[] = {
    "BM=16,BN=16,WAVES=1,STAGES=1,MMA=1",
    "BM=32,BN=32,WAVES=4,STAGES=1,MMA=1",
    "BM=32,BN=32,WAVES=1,STAGES=1,MMA=2",
    "BM=64,BN=16,WAVES=4,STAGES=1,MMA=1",
};
static const char *const wave64_glm[] = {
    "BM=64,BN=16,WAVES=4,STAGES=1,MMA=1",
    "BM=32,BN=32,WAVES=4,STAGES=1,MMA=2",
};
static const char *const wave32_cfgs[] = {
    "BM=16,BN=16,WAVES=2,STAGES=1,MMA=1",
    "BM=32,BN=32,WAVES=4,STAGES=1,MMA=1",
    "BM=64,BN=16,WAVES=8,STAGES=1,MMA=1",
};

Test(prefill_mma, mla_prefill_matches_the_reference_on_wave64, .timeout = 900)
{
    mma_check_on(fam(), "emu:wave64", wave64_cfgs, 4, cases, 3);
    mma_check_on(fam(), "emu:wave64", wave64_glm, 2, glm_cases, 1);
}

Test(prefill_mma, mla_prefill_matches_the_reference_on_wave32, .timeout = 900)
{
    mma_check_on(fam(), "emu:wave32", wave32_cfgs, 3, cases, 3);
    mma_check_on(fam(), "emu:wave32", wave32_cfgs + 2, 1, glm_cases, 1);
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
    return kern_config_valid(f, f->gpu, &s, 64, &c, p, why, cap);
}

static void expect_refused(const char *shape, const char *cfg, const dev_props *p,
                           const char *names)
{
    char why[256];
    cr_expect_not(valid_on(shape, cfg, p, why, sizeof why), "%s on %s is valid", cfg,
                  p->arch);
    cr_expect(strstr(why, names) != NULL, "%s: reason '%s' does not name %s", cfg, why, names);
}

Test(prefill_mma, validity_names_the_parameter_at_fault)
{
    dev_props emu32 = {.backend = DEV_BACKEND_EMU, .warp_size = 32, .arch = "emu",
                       .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                       .static_shared_per_block = 65536};
    dev_props gfx1030 = {.backend = DEV_BACKEND_HIP, .warp_size = 32, .arch = "gfx1030",
                         .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                         .static_shared_per_block = 65536};
    dev_props mi300 = {.backend = DEV_BACKEND_HIP, .warp_size = 64, .arch = "gfx942",
                       .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                       .static_shared_per_block = 65536};
    dev_props h200 = {.backend = DEV_BACKEND_CUDA, .warp_size = 32, .arch = "sm_90",
                      .max_threads_per_block = 1024, .shared_mem_per_block = 232448,
                      .static_shared_per_block = 49152};
    const char *glm = "glm5.2";
    const char *ok16 = "BM=64,BN=16,WAVES=4,STAGES=1,MMA=1";
    const char *ok32 = "BM=64,BN=16,WAVES=4,STAGES=1,MMA=2";
    char why[256];
    cr_expect(valid_on(glm, ok16, &mi300, why, sizeof why), "%s", why);
    /* q and a 32-key tile at BM=64: about 80 KB */
    expect_refused("glm5.2-fp8", "BM=64,BN=32,WAVES=4,STAGES=1,MMA=2", &mi300,
                   "shared memory");
    cr_expect(valid_on(glm, "BM=32,BN=32,WAVES=4,STAGES=1,MMA=2", &mi300, why, sizeof why),
              "%s", why);
    cr_expect(valid_on(glm, "BM=32,BN=16,WAVES=8,STAGES=1,MMA=1", &emu32, why, sizeof why),
              "%s", why);
    /* no such instruction: 32x32x8 on wave32, no MFMA on RDNA */
    expect_refused(glm, ok32, &emu32, "MMA=2");
    expect_refused(glm, ok16, &gfx1030, "MMA=1");
    /* one tile at a time */
    expect_refused(glm, "BM=64,BN=16,WAVES=4,STAGES=2,MMA=1", &mi300, "STAGES");
    /* BM=8 under a 16-row fragment; BN=8 under K=16; R=8 under K=16 */
    expect_refused(glm, "BM=8,BN=16,WAVES=1,STAGES=1,MMA=1", &mi300, "BM=8");
    expect_refused(glm, "BM=64,BN=8,WAVES=4,STAGES=1,MMA=1", &mi300, "BN=8");
    expect_refused("H=2,L=24,R=8,D=16,V=32,ps=3,kv=bf16,P=37",
                   "BM=16,BN=16,WAVES=1,STAGES=1,MMA=1", &mi300, "R=8");
    /* V = 48 has no 16-wide column for each of 2 waves of 32x32 */
    expect_refused("H=2,L=24,R=16,D=16,V=48,ps=3,kv=bf16,P=37",
                   "BM=32,BN=32,WAVES=2,STAGES=1,MMA=2", &mi300, "WAVES=2");
    /* 64 x 256 outputs over 1 wave: 256 accumulators per lane */
    expect_refused(glm, "BM=64,BN=16,WAVES=1,STAGES=1,MMA=1", &mi300, "accumulator");
    /* the tiles are dynamic shared memory: an H200 takes what 64 KB refuses */
    cr_expect(valid_on(glm, "BM=64,BN=32,WAVES=8,STAGES=1,MMA=1", &h200, why, sizeof why),
              "%s", why);
    expect_refused(glm, "BM=64,BN=32,WAVES=8,STAGES=1,MMA=1", &emu32, "shared memory");
    /* the scalar path's space is what it was */
    cr_expect(valid_on(glm, "BM=16,BN=16,WAVES=4,STAGES=2,MMA=0", &gfx1030, why, sizeof why),
              "%s", why);
}

/* ---- compile-only: instruction mix -------------------------------------- */

static void compile_amd(const char *arch, const char *shape, const char *cfg_text,
                        const char *mfma)
{
    mma_compile_amd(fam(), "mla_prefill_attn", arch, shape, 256, cfg_text, mfma);
    mma_compile_amd(fam(), "mla_prefill_expand", arch, shape, 256, cfg_text, mfma);
}

/* BM = 64: the tile whose scalar accumulators spilled; 32x32 fragments
 * need BN = 32, which at BM = 64 exceeds 64 KB of LDS, so BM = 32 there. */
#define AMD16 "BM=64,BN=16,WAVES=4,STAGES=1,MMA=1"
#define AMD32 "BM=32,BN=32,WAVES=4,STAGES=1,MMA=2"

Test(prefill_mma, hiprtc_gfx90a_builds_mfma_without_scratch)
{
    compile_amd("gfx90a", "glm5.2", AMD16, "v_mfma_f32_16x16x16bf16_1k");
    compile_amd("gfx90a", "glm5.2-fp8", AMD16, "v_mfma_f32_16x16x16bf16_1k");
    compile_amd("gfx90a", "glm5.2", AMD32, "v_mfma_f32_32x32x8bf16_1k");
}

/* CDNA3 spells the same instructions without the _1k. */
Test(prefill_mma, clang_gfx942_builds_mfma_without_scratch)
{
    compile_amd("gfx942", "glm5.2", AMD16, "v_mfma_f32_16x16x16_bf16");
    compile_amd("gfx942", "glm5.2-fp8", AMD32, "v_mfma_f32_32x32x8_bf16");
}

/* NVRTC's cubin has no disassembler here: the kernel cannot compile
 * without mma.sync (the source #errors without MT_MMA_HAVE). Registers
 * and local memory are logged. */
Test(prefill_mma, nvrtc_sm90_builds)
{
    const kern_family *f = fam();
    dev_device *d = mma_open_or_skip("cuda", "sm_90");
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, "glm5.2", &s, NULL, NULL), MT_OK);
    kern_config c;
    mma_parse(fam(), "BM=32,BN=16,WAVES=4,STAGES=1,MMA=1", &c);
    char why[256] = "";
    cr_assert(kern_config_valid(f, f->gpu, &s, 256, &c, dev_get_props(d), why, sizeof why),
              "sm_90: %s", why);
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *r = td_find_res(code, "mla_prefill_attn");
    cr_log_info("sm_90 mla_prefill_attn: %d registers, %lld bytes shared, %lld bytes local",
                r->vgprs, (long long)r->lds_bytes, (long long)r->private_bytes);
    dev_code_free(code);
    dev_close(d);
}
