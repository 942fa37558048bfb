/* test_indexer_mma.c: dsa_indexer's matrix-instruction score path (MMA=1|2):
 * explicit configs against the family's C reference on emu wave64 (AMD
 * layouts, both shapes) and wave32 (NVIDIA's 16x8x16), bf16 and fp8 caches,
 * contexts that are not a multiple of BT, fewer keys than topk, heads and
 * dims that are not whole fragments (padded), several queries per call
 * sharing page-table rows, on fresh seeds; the validity rules (no such
 * instruction, fragment columns per wave, query registers, static shared
 * memory, each naming the parameter); and, without a GPU, that hipRTC
 * (gfx90a) and clang-19 (gfx942) build the GLM-5.2 tiles with v_mfma and no
 * scratch and NVRTC (sm_90) builds them (each skipped when its compiler is
 * absent). The compile tests log the instruction mix that docs/BENCHMARKS.md
 * quotes. */
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

static const kern_family *fam(void) { return mma_family("dsa_indexer"); }

/* Small (emu is slow). GLM-5.2 widths: 203 keys over pages of 7 (not a
 * multiple of any BT), three queries of which two share a page row and see
 * different lengths; fewer keys than topk (fp8); then heads and dims that
 * are not whole fragments: 3 x 24, 20 x 36, and 2 x 30 (not whole 4-value
 * loads). The family's fill repeats a third of the keys, so the top-k's tie
 * rule decides. */
static const mma_case cases[] = {
    {"IH=32,ID=128,topk=40,ps=7,kv=bf16,C=203", 3},
    {"IH=32,ID=128,topk=256,ps=64,kv=fp8,C=100", 2},
    {"IH=32,ID=128,topk=64,ps=16,kv=fp8,C=150", 1},
    {"IH=3,ID=24,topk=20,ps=7,kv=bf16,C=131", 5},
    {"IH=20,ID=36,topk=30,ps=5,kv=fp8,C=77", 2},
    {"IH=2,ID=30,topk=10,ps=3,kv=fp8,C=50", 2},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static const char *const wave64_cfgs[] = {
    "BT=16,QB=1,WAVES=1,TK_WAVES=1,MMA=1,TK_SPLIT=1",
    "BT=64,QB=2,WAVES=2,TK_WAVES=2,MMA=1,TK_SPLIT=2",
    "BT=32,QB=4,WAVES=1,TK_WAVES=4,MMA=2,TK_SPLIT=4",
    "BT=128,QB=2,WAVES=4,TK_WAVES=1,MMA=2,TK_SPLIT=16",
};
static const char *const wave32_cfgs[] = {
    "BT=16,QB=1,WAVES=2,TK_WAVES=1,MMA=1,TK_SPLIT=1",
    "BT=64,QB=4,WAVES=4,TK_WAVES=2,MMA=1,TK_SPLIT=8",
    "BT=32,QB=2,WAVES=1,TK_WAVES=8,MMA=1,TK_SPLIT=2",
};

Test(indexer_mma, dsa_indexer_matches_the_reference_on_wave64, .timeout = 900)
{
    mma_check_on(fam(), "emu:wave64", wave64_cfgs, 4, cases, NCASES);
}

Test(indexer_mma, dsa_indexer_matches_the_reference_on_wave32, .timeout = 900)
{
    mma_check_on(fam(), "emu:wave32", wave32_cfgs, 3, cases, NCASES);
}

/* ---- validity ------------------------------------------------------------ */

/* The GLM-5.2 tiles docs/BENCHMARKS.md discusses: 4 waves, one fragment
 * column of keys each per pass. */
#define AMD16 "BT=64,QB=4,WAVES=4,TK_WAVES=4,MMA=1,TK_SPLIT=1"
#define AMD32 "BT=128,QB=4,WAVES=4,TK_WAVES=4,MMA=2,TK_SPLIT=1"

/* 16 heads of 256 dims: (128 + 16) x 264 x 2 = 76,032 bytes of static
 * shared memory at BT=128; 64 keys fit the 48 KB static limit of an H200. */
#define WIDE "IH=16,ID=256,topk=2048,ps=64,kv=bf16,C=8192"

Test(indexer_mma, validity_names_the_parameter_at_fault)
{
    static const mma_expect e[] = {
        {"glm5.2", AMD16, MMA_MI300, NULL},
        {"glm5.2-fp8", AMD32, MMA_MI300, NULL},
        {"glm5.2", AMD32, MMA_EMU64, NULL},
        {"glm5.2", AMD16, MMA_H200, NULL},
        {"glm5.2-fp8", AMD16, MMA_EMU32, NULL},
        /* no such instruction: 32x32x8 on wave32, no MFMA on RDNA, no bf16
         * mma on Turing */
        {"glm5.2", AMD32, MMA_EMU32, "MMA=2"},
        {"glm5.2", AMD32, MMA_H200, "MMA=2"},
        {"glm5.2", AMD16, MMA_GFX1030, "MMA=1"},
        {"glm5.2", AMD16, MMA_SM75, "MMA=1"},
        /* fragment columns: 16 keys under a 32-wide fragment; one 16-key
         * column for two waves */
        {"glm5.2", "BT=16,QB=1,WAVES=1,TK_WAVES=4,MMA=2,TK_SPLIT=1", MMA_MI300, "BT=16"},
        {"glm5.2", "BT=16,QB=1,WAVES=2,TK_WAVES=4,MMA=1,TK_SPLIT=1", MMA_MI300, "WAVES=2"},
        /* the query in registers: 256 heads x 128 dims is 256 per lane */
        {"IH=256,ID=128,topk=2048,ps=64,kv=bf16,C=8192", AMD16, MMA_MI300, "registers"},
        {WIDE, "BT=128,QB=1,WAVES=4,TK_WAVES=4,MMA=1,TK_SPLIT=1", MMA_H200, "static shared"},
        {WIDE, "BT=64,QB=1,WAVES=4,TK_WAVES=4,MMA=1,TK_SPLIT=1", MMA_H200, NULL},
        /* the scalar path's space is what it was */
        {"glm5.2", "BT=64,QB=4,WAVES=2,TK_WAVES=4,MMA=0,TK_SPLIT=1", MMA_GFX1030, NULL},
        {"glm5.2", "BT=128,QB=4,WAVES=1,TK_WAVES=4,MMA=0,TK_SPLIT=1", MMA_GFX1030, "BT=128"},
    };
    mma_expect_each(fam(), 1, e, (int)(sizeof e / sizeof e[0]));
}

/* ---- compile-only: instruction mix -------------------------------------- */

/* test_mma_util.h's checks on dsa_scores. CDNA3 (gfx942) spells the
 * instructions of CDNA2 (gfx90a) without the _1k. */
Test(indexer_mma, hiprtc_gfx90a_builds_mfma_without_scratch)
{
    static const mma_build b[] = {
        {"gfx90a", "glm5.2", AMD16, "v_mfma_f32_16x16x16bf16_1k"},
        {"gfx90a", "glm5.2-fp8", AMD16, "v_mfma_f32_16x16x16bf16_1k"},
        {"gfx90a", "glm5.2", AMD32, "v_mfma_f32_32x32x8bf16_1k"},
        {"gfx90a", "glm5.2-fp8", AMD32, "v_mfma_f32_32x32x8bf16_1k"},
    };
    mma_compile_amd_each(fam(), "dsa_scores", 1, b, (int)(sizeof b / sizeof b[0]));
}

Test(indexer_mma, clang_gfx942_builds_mfma_without_scratch)
{
    static const mma_build b[] = {
        {"gfx942", "glm5.2", AMD16, "v_mfma_f32_16x16x16_bf16"},
        {"gfx942", "glm5.2-fp8", AMD16, "v_mfma_f32_16x16x16_bf16"},
        {"gfx942", "glm5.2", AMD32, "v_mfma_f32_32x32x8_bf16"},
    };
    mma_compile_amd_each(fam(), "dsa_scores", 1, b, (int)(sizeof b / sizeof b[0]));
}

Test(indexer_mma, nvrtc_sm90_builds)
{
    mma_compile_nv(fam(), "dsa_scores", "glm5.2", 4, AMD16, false);
    mma_compile_nv(fam(), "dsa_scores", "glm5.2-fp8", 4,
                   "BT=128,QB=4,WAVES=4,TK_WAVES=4,MMA=1,TK_SPLIT=1", false);
}
