/* test_moe_mma.c: the MoE expert GEMMs' matrix-instruction path (MMA=1|2
 * of moe_gemm_up and moe_gemm_down): explicit configs against the plain C
 * reference on emu wave64 (AMD layouts, both shapes) and wave32 (NVIDIA's
 * 16x8x16), a16w4 and a4w4, with experts that get no pairs, rows that are
 * not a multiple of the tile, split K and both combine paths, on fresh
 * seeds; the validity rules (no such instruction, tiles, UNROLL,
 * accumulators, static shared memory); and, without a GPU, that hipRTC
 * (gfx90a), clang-19 (gfx942) and NVRTC (sm_90) build the GLM-5.2 tiles
 * with matrix instructions and no scratch (each skipped when its compiler
 * is absent). The compile tests log the instruction mix that
 * docs/BENCHMARKS.md quotes. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <inttypes.h>
#include <math.h>
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

static const kern_family *fam(const char *name) { return mma_family(name); }

/* Small shapes (emu is slow): skew=2 leaves E - 2*topk experts empty,
 * skew=1 piles every token's first slot on one expert; M=1, 13 and 21 fill
 * no tile exactly. */
static const mma_case up_cases[] = {
    {"H=256,I=128,E=16,topk=4,a=mxfp4,cat=1,bm=64,skew=2", 13},
    {"H=256,I=128,E=8,topk=2,a=bf16,cat=0,bm=64,skew=1", 21},
    {"H=128,I=128,E=16,topk=4,a=bf16,cat=1,bm=64,skew=0", 1},
};
static const mma_case down_cases[] = {
    {"H=256,I=128,E=16,topk=4,a=mxfp4,comb=0,bm=64,skew=2", 13},
    {"H=256,I=128,E=8,topk=2,a=bf16,comb=1,bm=64,skew=1", 21},
    {"H=128,I=128,E=16,topk=4,a=mxfp4,comb=1,bm=64,skew=0", 1},
};

/* Splits K: the comb=1 cases refuse SPLITK > 1, so those configs run
 * only the comb=0 case. */
static const char *const wave64_cfgs[] = {
    "BM=16,BN=16,BK=32,WAVES=1,STAGES=1,SPLITK=1,GROUP_M=1,VEC=1,UNROLL=1,MMA=1,GEMV=0",
    "BM=32,BN=64,BK=64,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=4,VEC=8,UNROLL=1,MMA=1,GEMV=0",
    "BM=32,BN=32,BK=32,WAVES=1,STAGES=2,SPLITK=1,GROUP_M=8,VEC=4,UNROLL=1,MMA=2,GEMV=0",
    "BM=64,BN=64,BK=32,WAVES=4,STAGES=1,SPLITK=1,GROUP_M=1,VEC=8,UNROLL=1,MMA=2,GEMV=0",
};
static const char *const wave64_split[] = {
    "BM=16,BN=32,BK=32,WAVES=2,STAGES=2,SPLITK=2,GROUP_M=1,VEC=4,UNROLL=1,MMA=1,GEMV=0",
    "BM=32,BN=32,BK=32,WAVES=1,STAGES=1,SPLITK=4,GROUP_M=4,VEC=8,UNROLL=1,MMA=2,GEMV=0",
};
static const char *const wave32_cfgs[] = {
    "BM=16,BN=16,BK=32,WAVES=2,STAGES=2,SPLITK=1,GROUP_M=1,VEC=4,UNROLL=1,MMA=1,GEMV=0",
    "BM=32,BN=32,BK=64,WAVES=4,STAGES=1,SPLITK=1,GROUP_M=8,VEC=8,UNROLL=1,MMA=1,GEMV=0",
};
static const char *const wave32_split[] = {
    "BM=16,BN=32,BK=32,WAVES=1,STAGES=2,SPLITK=2,GROUP_M=4,VEC=1,UNROLL=1,MMA=1,GEMV=0",
};

Test(moe_mma, up_matches_the_reference_on_wave64, .timeout = 900)
{
    mma_check_on(fam("moe_gemm_up"), "emu:wave64", wave64_cfgs, 4, up_cases, 3);
    mma_check_on(fam("moe_gemm_up"), "emu:wave64", wave64_split, 2, up_cases, 2);
}

Test(moe_mma, down_matches_the_reference_on_wave64, .timeout = 900)
{
    mma_check_on(fam("moe_gemm_down"), "emu:wave64", wave64_cfgs, 4, down_cases, 3);
    mma_check_on(fam("moe_gemm_down"), "emu:wave64", wave64_split, 2, down_cases, 1);
}

Test(moe_mma, up_matches_the_reference_on_wave32, .timeout = 900)
{
    mma_check_on(fam("moe_gemm_up"), "emu:wave32", wave32_cfgs, 2, up_cases, 3);
    mma_check_on(fam("moe_gemm_up"), "emu:wave32", wave32_split, 1, up_cases, 1);
}

Test(moe_mma, down_matches_the_reference_on_wave32, .timeout = 900)
{
    mma_check_on(fam("moe_gemm_down"), "emu:wave32", wave32_cfgs, 2, down_cases, 3);
    mma_check_on(fam("moe_gemm_down"), "emu:wave32", wave32_split, 1, down_cases, 1);
}

/* ---- the weight decode (q_decode of moe_gemm.hip) ------------------------ */

/* A kernel appended to moe_gemm.hip: for every E8M0 code c, out8 holds the
 * 256 byte values decoded 8 per call, out1 one per call, and ref the
 * per-element reference (e2m1 x e8m0 in f32, top halves). */
static const char dec_kernel[] =
    "\nMT_KERNEL void q_dec_test(unsigned *out8, unsigned *out1, unsigned *ref)\n"
    "{\n"
    "    __shared__ unsigned tab[256];\n"
    "    q_tab_fill(tab);\n"
    "    __syncthreads();\n"
    "    const unsigned t = threadIdx.x;\n"
    "    for (unsigned c = 0; c < 256; c++) {\n"
    "        if (t < 32) {\n"
    "            unsigned long long v = 0;\n"
    "            for (unsigned j = 0; j < 8; j++)\n"
    "                v |= (unsigned long long)(8 * t + j) << (8 * j);\n"
    "            q_decode(tab, v, c, out8 + c * 256 + 8 * t, 8);\n"
    "        }\n"
    "        for (unsigned b = t; b < 256; b += 64) {\n"
    "            q_decode(tab, b, c, out1 + c * 256 + b, 1);\n"
    "            float sc = mt_e8m0_to_f32(c);\n"
    "            ref[c * 256 + b] = q_pair(mt_e2m1_to_f32(b & 15u) * sc,\n"
    "                                      mt_e2m1_to_f32(b >> 4) * sc);\n"
    "        }\n"
    "    }\n"
    "}\n";

/* bf16 bits of e2m1 code n times 2^(c-127), from the format's definition. */
static unsigned host_half(unsigned n, unsigned c)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    if (c == 255)
        return 0x7fc0u;
    double v = (n & 8 ? -1.0 : 1.0) * mag[n & 7] * ldexp(1.0, (int)c - 127);
    float f = (float)v; /* exact, or inf past the range, as bf16 */
    unsigned u;
    memcpy(&u, &f, 4);
    cr_assert_eq(u & 0xffffu, 0u, "e2m1 %u x 2^(%u-127) is not a bf16", n, c);
    return u >> 16;
}

static bool same_half(unsigned a, unsigned b)
{
    bool na = (a & 0x7f80u) == 0x7f80u && (a & 0x7fu), nb = (b & 0x7f80u) == 0x7f80u && (b & 0x7fu);
    return na || nb ? na && nb : a == b;
}

Test(moe_mma, weight_decode_is_exact_for_every_byte_and_scale, .timeout = 300)
{
    dev_device *d = td_open("emu:wave64", NULL);
    const char *base = kern_source_get("moe_gemm.hip");
    cr_assert_not_null(base);
    size_t n = strlen(base);
    char *src = malloc(n + sizeof dec_kernel);
    cr_assert_not_null(src);
    memcpy(src, base, n);
    memcpy(src + n, dec_kernel, sizeof dec_kernel);
    static const dev_define defs[] = {
        {"MT_WS", "64"}, {"MOE_UP", "1"}, {"S_H", "256"},   {"S_I", "128"},
        {"S_topk", "4"}, {"S_a", "0"},    {"BM", "16"},     {"BN", "16"},
        {"BK", "32"},    {"WAVES", "1"},  {"STAGES", "1"},  {"SPLITK", "1"},
        {"GROUP_M", "1"}, {"VEC", "8"},   {"UNROLL", "1"},  {"MMA", "1"},
    };
    dev_module *m = td_build(d, "moe_gemm.hip", src, defs, (int)(sizeof defs / sizeof defs[0]),
                             true);
    free(src);
    dev_kernel *k = td_kernel(m, "q_dec_test", "ppp");
    const size_t bytes = 256 * 256 * 4;
    unsigned *g8 = td_alloc(d, bytes), *g1 = td_alloc(d, bytes), *gr = td_alloc(d, bytes);
    void *args[] = {&g8, &g1, &gr};
    td_launch(d, k, (dev_dim3){1, 1, 1}, (dev_dim3){64, 1, 1}, 0, args);
    unsigned *h8 = malloc(bytes), *h1 = malloc(bytes), *hr = malloc(bytes);
    cr_assert(h8 && h1 && hr);
    td_download(d, h8, g8, bytes);
    td_download(d, h1, g1, bytes);
    td_download(d, hr, gr, bytes);
    int bad = 0;
    for (unsigned c = 0; c < 256; c++)
        for (unsigned b = 0; b < 256; b++) {
            unsigned i = c * 256 + b;
            unsigned want = host_half(b & 15, c) | host_half(b >> 4, c) << 16;
            for (int h = 0; h < 2; h++) {
                unsigned w = want >> (16 * h) & 0xffffu;
                bool ok = same_half(h8[i] >> (16 * h) & 0xffffu, w) &&
                          same_half(h1[i] >> (16 * h) & 0xffffu, w) &&
                          same_half(hr[i] >> (16 * h) & 0xffffu, w);
                if (!ok && bad++ < 8)
                    cr_log_error("byte 0x%02x scale %u half %d: decode8 %04x decode1 %04x "
                                 "reference %04x want %04x",
                                 b, c, h, h8[i] >> (16 * h) & 0xffffu, h1[i] >> (16 * h) & 0xffffu,
                                 hr[i] >> (16 * h) & 0xffffu, w);
            }
            /* bit for bit the prelude's per-element decode, NaN included */
            if ((h8[i] != hr[i] || h1[i] != hr[i]) && bad++ < 8)
                cr_log_error("byte 0x%02x scale %u: decode8 %08x decode1 %08x reference %08x",
                             b, c, h8[i], h1[i], hr[i]);
        }
    cr_expect_eq(bad, 0, "%d halves differ", bad);
    free(h8);
    free(h1);
    free(hr);
    dev_free(d, g8);
    dev_free(d, g1);
    dev_free(d, gr);
    dev_module_unload(m);
    dev_close(d);
}

/* ---- validity ------------------------------------------------------------ */

#define OK16 "BM=32,BN=64,BK=64,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=8,VEC=8,UNROLL=1,MMA=1,GEMV=0"
#define OK32 "BM=32,BN=64,BK=64,WAVES=2,STAGES=2,SPLITK=1,GROUP_M=8,VEC=8,UNROLL=1,MMA=2,GEMV=0"

Test(moe_mma, validity_names_the_parameter_at_fault)
{
    /* moe_gemm_up at its glm5.2 preset */
    static const mma_expect up[] = {
        {"glm5.2", OK16, MMA_EMU32, NULL},
        {"glm5.2", OK16, MMA_H200, NULL},
        {"glm5.2", OK32, MMA_EMU64, NULL},
        /* no such instruction: 32x32x8 on wave32, no MFMA on RDNA */
        {"glm5.2", OK32, MMA_EMU32, "MMA=2"},
        {"glm5.2", OK16, MMA_GFX1030, "MMA=1"},
        /* tiles: BN=16 has no 32-wide fragment column; 8 waves over a 16x16
         * tile */
        {"glm5.2",
         "BM=32,BN=16,BK=32,WAVES=1,STAGES=1,SPLITK=1,GROUP_M=1,VEC=4,UNROLL=1,MMA=2,GEMV=0",
         MMA_EMU64, "MMA=2"},
        {"glm5.2",
         "BM=16,BN=16,BK=32,WAVES=8,STAGES=1,SPLITK=1,GROUP_M=1,VEC=4,UNROLL=1,MMA=1,GEMV=0",
         MMA_EMU64, "WAVES=8"},
        /* 2 x 4 x 4 fragments of 16 registers: 128 accumulators per lane */
        {"glm5.2",
         "BM=128,BN=128,BK=32,WAVES=1,STAGES=1,SPLITK=1,GROUP_M=1,VEC=4,UNROLL=1,MMA=2,GEMV=0",
         MMA_MI300, "accumulator"},
        /* shared memory: 2 x (64 + 2x128) x (128 + 4) bf16 = 168,960 bytes;
         * on an H200 the static limit (48 KB) refuses what 64 KB would take */
        {"glm5.2",
         "BM=64,BN=128,BK=128,WAVES=8,STAGES=2,SPLITK=1,GROUP_M=1,VEC=4,UNROLL=1,MMA=1,GEMV=0",
         MMA_MI300, "MMA"},
        {"glm5.2",
         "BM=64,BN=64,BK=128,WAVES=4,STAGES=1,SPLITK=1,GROUP_M=1,VEC=4,UNROLL=1,MMA=1,GEMV=0",
         MMA_MI300, NULL},
        {"glm5.2",
         "BM=64,BN=64,BK=128,WAVES=4,STAGES=1,SPLITK=1,GROUP_M=1,VEC=4,UNROLL=1,MMA=1,GEMV=0",
         MMA_H200, "static shared"},
        /* the scalar space is what it was */
        {"glm5.2",
         "BM=64,BN=64,BK=64,WAVES=4,STAGES=1,SPLITK=1,GROUP_M=1,VEC=4,UNROLL=1,MMA=0,GEMV=0",
         MMA_MI300, NULL},
    };
    /* moe_gemm_down at its glm5.2-rows preset */
    static const mma_expect down[] = {
        {"glm5.2-rows", OK32, MMA_MI300, NULL},
        /* no such instruction: 32x32x8 on sm_90, no bf16 mma on Turing */
        {"glm5.2-rows", OK32, MMA_H200, "MMA=2"},
        {"glm5.2-rows", OK16, MMA_SM75, "MMA=1"},
        /* UNROLL=4 over a 16x16 tile */
        {"glm5.2-rows",
         "BM=16,BN=16,BK=32,WAVES=1,STAGES=1,SPLITK=1,GROUP_M=1,VEC=4,UNROLL=4,MMA=1,GEMV=0",
         MMA_EMU64, "UNROLL=4"},
    };
    mma_expect_each(fam("moe_gemm_up"), 64, up, (int)(sizeof up / sizeof up[0]));
    mma_expect_each(fam("moe_gemm_down"), 64, down, (int)(sizeof down / sizeof down[0]));
}

/* ---- compile-only: instruction mix -------------------------------------- */

/* Family fname at the GLM-5.2 shape with cfg for arch: test_mma_util.h's
 * checks on its kernel of the same name. */
static void compile_amd(const char *arch, const char *fname, const char *shape, int64_t m,
                        const char *cfg_text, const char *mfma)
{
    mma_compile_amd(fam(fname), fname, arch, shape, m, cfg_text, mfma);
}

/* The GLM-5.2 bucket configs docs/BENCHMARKS.md discusses: decode (M=1, one
 * real row per 16-row tile) and prefill (M=4096). */
#define UP_DECODE "BM=16,BN=32,BK=64,WAVES=2,STAGES=2,SPLITK=1,GROUP_M=1,VEC=8,UNROLL=1,MMA=1,GEMV=0"
#define UP_PREFILL "BM=128,BN=64,BK=32,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=8,VEC=8,UNROLL=1,MMA=2,GEMV=0"
#define DOWN_DECODE "BM=16,BN=64,BK=64,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=1,VEC=8,UNROLL=1,MMA=1,GEMV=0"
#define DOWN_PREFILL "BM=128,BN=128,BK=32,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=8,VEC=8,UNROLL=1,MMA=2,GEMV=0"

Test(moe_mma, hiprtc_gfx90a_up_builds_mfma_without_scratch)
{
    compile_amd("gfx90a", "moe_gemm_up", "glm5.2", 1, UP_DECODE, "v_mfma_f32_16x16x16bf16_1k");
    compile_amd("gfx90a", "moe_gemm_up", "glm5.2-a16", 1, UP_DECODE,
                "v_mfma_f32_16x16x16bf16_1k");
    compile_amd("gfx90a", "moe_gemm_up", "glm5.2", 4096, UP_PREFILL,
                "v_mfma_f32_32x32x8bf16_1k");
    compile_amd("gfx90a", "moe_gemm_up", "glm5.2-a16", 4096, UP_PREFILL,
                "v_mfma_f32_32x32x8bf16_1k");
}

Test(moe_mma, hiprtc_gfx90a_down_builds_mfma_without_scratch)
{
    compile_amd("gfx90a", "moe_gemm_down", "glm5.2", 1, DOWN_DECODE,
                "v_mfma_f32_16x16x16bf16_1k");
    compile_amd("gfx90a", "moe_gemm_down", "glm5.2-a16", 1, DOWN_DECODE,
                "v_mfma_f32_16x16x16bf16_1k");
    compile_amd("gfx90a", "moe_gemm_down", "glm5.2", 4096, DOWN_PREFILL,
                "v_mfma_f32_32x32x8bf16_1k");
    compile_amd("gfx90a", "moe_gemm_down", "glm5.2-rows", 4096, DOWN_PREFILL,
                "v_mfma_f32_32x32x8bf16_1k");
}

/* CDNA3 spells the same instructions without the _1k. */
Test(moe_mma, clang_gfx942_builds_mfma_without_scratch)
{
    compile_amd("gfx942", "moe_gemm_up", "glm5.2", 1, UP_DECODE, "v_mfma_f32_16x16x16_bf16");
    compile_amd("gfx942", "moe_gemm_up", "glm5.2", 4096, UP_PREFILL, "v_mfma_f32_32x32x8_bf16");
    compile_amd("gfx942", "moe_gemm_up", "glm5.2-a16", 1, UP_DECODE, "v_mfma_f32_16x16x16_bf16");
    compile_amd("gfx942", "moe_gemm_up", "glm5.2-a16", 4096, UP_PREFILL,
                "v_mfma_f32_32x32x8_bf16");
    compile_amd("gfx942", "moe_gemm_down", "glm5.2", 1, DOWN_DECODE,
                "v_mfma_f32_16x16x16_bf16");
    compile_amd("gfx942", "moe_gemm_down", "glm5.2", 4096, DOWN_PREFILL,
                "v_mfma_f32_32x32x8_bf16");
}

/* NVRTC (mma_compile_nv): no local memory. */
Test(moe_mma, nvrtc_sm90_builds_without_local_memory)
{
    mma_compile_nv(fam("moe_gemm_up"), "moe_gemm_up", "glm5.2", 1,
                   "BM=16,BN=32,BK=64,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=1,VEC=8,UNROLL=1,MMA=1,GEMV=0",
                   true);
    mma_compile_nv(fam("moe_gemm_up"), "moe_gemm_up", "glm5.2", 4096,
                   "BM=64,BN=64,BK=32,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=8,VEC=8,UNROLL=1,MMA=1,GEMV=0",
                   true);
    mma_compile_nv(fam("moe_gemm_down"), "moe_gemm_down", "glm5.2-rows", 4096,
                   "BM=64,BN=64,BK=32,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=8,VEC=8,UNROLL=1,MMA=1,GEMV=0",
                   true);
}
