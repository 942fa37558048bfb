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

static const kern_family *fam(void) { return mma_family("mla_decode"); }

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

/* The GLM-5.2 tiles docs/BENCHMARKS.md discusses: 64 heads of one query
 * share each 32-token tile; NVIDIA's 16x8x16 takes 16-token tiles. */
#define AMD16 "HB=64,BN=32,WAVES=4,MMA=1,NSPLIT=8"
#define AMD32 "HB=64,BN=32,WAVES=4,MMA=2,NSPLIT=8"
#define NV16 "HB=64,BN=16,WAVES=8,MMA=1,NSPLIT=8"

Test(attn_mma, validity_names_the_parameter_at_fault)
{
    static const mma_expect e[] = {
        {"glm5.2", AMD16, MMA_MI300, NULL},
        {"glm5.2-fp8", AMD32, MMA_MI300, NULL},
        {"glm5.2", AMD32, MMA_EMU64, NULL},
        {"glm5.2", NV16, MMA_H200, NULL},
        {"glm5.2", NV16, MMA_EMU32, NULL},
        /* no such instruction: 32x32x8 on wave32, no MFMA on RDNA, no bf16
         * mma on Turing */
        {"glm5.2", AMD32, MMA_EMU32, "MMA=2"},
        {"glm5.2", AMD32, MMA_H200, "MMA=2"},
        {"glm5.2", AMD16, MMA_GFX1030, "MMA=1"},
        {"glm5.2", NV16, MMA_SM75, "MMA=1"},
        /* tiles: 8 heads in a 16-row fragment; BN=16 under a 32-wide
         * fragment; BN=8 under K=16 */
        {"glm5.2", "HB=8,BN=32,WAVES=4,MMA=1,NSPLIT=8", MMA_MI300, "HB=8"},
        {"glm5.2", "HB=64,BN=16,WAVES=4,MMA=2,NSPLIT=8", MMA_MI300, "BN=16"},
        {"glm5.2", "HB=64,BN=8,WAVES=4,MMA=1,NSPLIT=8", MMA_EMU32, "BN=8"},
        /* L = 40 has no 16-wide fragment column for 2 waves */
        {"H=16,L=48,R=16,D=32,topk=16,ps=16,kv=bf16,sparse=1,C=40",
         "HB=16,BN=16,WAVES=2,MMA=1,NSPLIT=1", MMA_EMU64, "WAVES=2"},
        /* 64 x 512 outputs over 2 waves: 256 accumulators per lane */
        {"glm5.2", "HB=64,BN=32,WAVES=2,MMA=1,NSPLIT=8", MMA_MI300, "accumulator"},
        /* shared memory: a 64-token tile alone is 64 x 580 x 2 = 74,240
         * bytes; the 48 KB static limit of an H200 refuses what 64 KB takes */
        {"glm5.2", "HB=64,BN=64,WAVES=4,MMA=1,NSPLIT=8", MMA_MI300, "BN=64"},
        {"glm5.2", "HB=64,BN=32,WAVES=8,MMA=1,NSPLIT=8", MMA_EMU32, NULL},
        {"glm5.2", "HB=64,BN=32,WAVES=8,MMA=1,NSPLIT=8", MMA_H200, "static shared"},
        /* the scalar path's space is what it was */
        {"glm5.2", "HB=16,BN=16,WAVES=4,MMA=0,NSPLIT=8", MMA_GFX1030, NULL},
    };
    mma_expect_each(fam(), 1, e, (int)(sizeof e / sizeof e[0]));
}

/* ---- compile-only: instruction mix -------------------------------------- */

/* test_mma_util.h's checks on mla_decode_split. CDNA3 (gfx942) spells the
 * instructions of CDNA2 (gfx90a) without the _1k. */
Test(attn_mma, hiprtc_gfx90a_builds_mfma_without_scratch)
{
    static const mma_build b[] = {
        {"gfx90a", "glm5.2", AMD16, "v_mfma_f32_16x16x16bf16_1k"},
        {"gfx90a", "glm5.2-dense", AMD16, "v_mfma_f32_16x16x16bf16_1k"},
        {"gfx90a", "glm5.2-fp8", AMD16, "v_mfma_f32_16x16x16bf16_1k"},
        {"gfx90a", "glm5.2", AMD32, "v_mfma_f32_32x32x8bf16_1k"},
        {"gfx90a", "glm5.2-fp8", AMD32, "v_mfma_f32_32x32x8bf16_1k"},
    };
    mma_compile_amd_each(fam(), "mla_decode_split", 1, b, (int)(sizeof b / sizeof b[0]));
}

Test(attn_mma, clang_gfx942_builds_mfma_without_scratch)
{
    static const mma_build b[] = {
        {"gfx942", "glm5.2", AMD16, "v_mfma_f32_16x16x16_bf16"},
        {"gfx942", "glm5.2-fp8", AMD16, "v_mfma_f32_16x16x16_bf16"},
        {"gfx942", "glm5.2", AMD32, "v_mfma_f32_32x32x8_bf16"},
    };
    mma_compile_amd_each(fam(), "mla_decode_split", 1, b, (int)(sizeof b / sizeof b[0]));
}

/* NVRTC kept the output fragments (acc, HB*L/threads floats per lane) in
 * local memory until every loop over them was unrolled (MT_UNROLL). */
Test(attn_mma, nvrtc_sm90_builds_without_local_memory)
{
    mma_compile_nv(fam(), "mla_decode_split", "glm5.2", 1, NV16, true);
    mma_compile_nv(fam(), "mla_decode_split", "glm5.2-fp8", 1, NV16, true);
    mma_compile_nv(fam(), "mla_decode_split", "glm5.2-dense", 1,
                   "HB=32,BN=32,WAVES=4,MMA=1,NSPLIT=8", true);
    mma_compile_nv(fam(), "mla_decode_split", "glm5.2", 1, "HB=32,BN=32,WAVES=8,MMA=1,NSPLIT=8",
                   true);
}
