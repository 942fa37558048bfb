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

static const kern_family *fam(void) { return mma_family("mla_prefill"); }

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

/* BM = 64: the tile whose scalar accumulators spilled; 32x32 fragments
 * need BN = 32, which at BM = 64 exceeds 64 KB of LDS, so BM = 32 there. */
#define AMD16 "BM=64,BN=16,WAVES=4,STAGES=1,MMA=1"
#define AMD32 "BM=32,BN=32,WAVES=4,STAGES=1,MMA=2"

Test(prefill_mma, validity_names_the_parameter_at_fault)
{
    static const mma_expect e[] = {
        {"glm5.2", AMD16, MMA_MI300, NULL},
        /* q and a 32-key tile at BM=64: about 80 KB */
        {"glm5.2-fp8", "BM=64,BN=32,WAVES=4,STAGES=1,MMA=2", MMA_MI300, "shared memory"},
        {"glm5.2", AMD32, MMA_MI300, NULL},
        {"glm5.2", "BM=32,BN=16,WAVES=8,STAGES=1,MMA=1", MMA_EMU32, NULL},
        /* no such instruction: 32x32x8 on wave32, no MFMA on RDNA */
        {"glm5.2", "BM=64,BN=16,WAVES=4,STAGES=1,MMA=2", MMA_EMU32, "MMA=2"},
        {"glm5.2", AMD16, MMA_GFX1030, "MMA=1"},
        /* one tile at a time */
        {"glm5.2", "BM=64,BN=16,WAVES=4,STAGES=2,MMA=1", MMA_MI300, "STAGES"},
        /* BM=8 under a 16-row fragment; BN=8 under K=16; R=8 under K=16 */
        {"glm5.2", "BM=8,BN=16,WAVES=1,STAGES=1,MMA=1", MMA_MI300, "BM=8"},
        {"glm5.2", "BM=64,BN=8,WAVES=4,STAGES=1,MMA=1", MMA_MI300, "BN=8"},
        {"H=2,L=24,R=8,D=16,V=32,ps=3,kv=bf16,P=37", "BM=16,BN=16,WAVES=1,STAGES=1,MMA=1",
         MMA_MI300, "R=8"},
        /* V = 48 has no 16-wide column for each of 2 waves of 32x32 */
        {"H=2,L=24,R=16,D=16,V=48,ps=3,kv=bf16,P=37", "BM=32,BN=32,WAVES=2,STAGES=1,MMA=2",
         MMA_MI300, "WAVES=2"},
        /* 64 x 256 outputs over 1 wave: 256 accumulators per lane */
        {"glm5.2", "BM=64,BN=16,WAVES=1,STAGES=1,MMA=1", MMA_MI300, "accumulator"},
        /* the tiles are dynamic shared memory: an H200 takes what 64 KB
         * refuses */
        {"glm5.2", "BM=64,BN=32,WAVES=8,STAGES=1,MMA=1", MMA_H200, NULL},
        {"glm5.2", "BM=64,BN=32,WAVES=8,STAGES=1,MMA=1", MMA_EMU32, "shared memory"},
        /* the scalar path's space is what it was */
        {"glm5.2", "BM=16,BN=16,WAVES=4,STAGES=2,MMA=0", MMA_GFX1030, NULL},
    };
    mma_expect_each(fam(), 64, e, (int)(sizeof e / sizeof e[0]));
}

/* ---- compile-only: instruction mix -------------------------------------- */

/* test_mma_util.h's checks on the attention and on the expansion, build by
 * build. CDNA3 (gfx942) spells the instructions of CDNA2 (gfx90a) without
 * the _1k. */
static void compile_amd(const mma_build *b, int n)
{
    for (int i = 0; i < n; i++) {
        mma_compile_amd(fam(), "mla_prefill_attn", b[i].arch, b[i].shape, 256, b[i].cfg,
                        b[i].mfma);
        mma_compile_amd(fam(), "mla_prefill_expand", b[i].arch, b[i].shape, 256, b[i].cfg,
                        b[i].mfma);
    }
}

Test(prefill_mma, hiprtc_gfx90a_builds_mfma_without_scratch)
{
    static const mma_build b[] = {
        {"gfx90a", "glm5.2", AMD16, "v_mfma_f32_16x16x16bf16_1k"},
        {"gfx90a", "glm5.2-fp8", AMD16, "v_mfma_f32_16x16x16bf16_1k"},
        {"gfx90a", "glm5.2", AMD32, "v_mfma_f32_32x32x8bf16_1k"},
    };
    compile_amd(b, (int)(sizeof b / sizeof b[0]));
}

Test(prefill_mma, clang_gfx942_builds_mfma_without_scratch)
{
    static const mma_build b[] = {
        {"gfx942", "glm5.2", AMD16, "v_mfma_f32_16x16x16_bf16"},
        {"gfx942", "glm5.2-fp8", AMD32, "v_mfma_f32_32x32x8_bf16"},
    };
    compile_amd(b, (int)(sizeof b / sizeof b[0]));
}

/* Registers and local memory are logged. */
Test(prefill_mma, nvrtc_sm90_builds)
{
    mma_compile_nv(fam(), "mla_prefill_attn", "glm5.2", 256, "BM=32,BN=16,WAVES=4,STAGES=1,MMA=1",
                   false);
}
