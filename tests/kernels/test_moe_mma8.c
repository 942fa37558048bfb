/* test_moe_mma8.c: the MoE expert GEMMs on fp8 matrix instructions (MMA=3
 * of moe_gemm_up and moe_gemm_down, a4w4): the tile path and the decode
 * path (GEMV=1) against the plain C reference on emu wave64 (AMD's
 * 16x16x32 fp8 layout) and wave32 (NVIDIA's m16n8k32), with experts that
 * get no pairs, rows that fill no tile, split K and both combine paths, on
 * fresh seeds; the folded fp8 tables bit for bit against the format's
 * definition; weights whose block scales spread over many binades; the
 * validity rules; and that a one-cell swap in the emulator's fp8 layout
 * makes both paths fail their check. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "device/cuda/ptx_mix.h"
#include "device/device.h"
#include "device/emu/emu_impl.h"
#include "device/hip/isa_mix.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"
#include "test_mma_util.h"

static const kern_family *fam(const char *name)
{
    const kern_family *f = kern_family_find(name);
    cr_assert_not_null(f, "family %s", name);
    return f;
}

static const mma_case up_cases[] = {
    {"H=256,I=128,E=16,topk=4,a=mxfp4,cat=1,bm=64,skew=2", 13},
    {"H=256,I=128,E=8,topk=2,a=mxfp4,cat=0,bm=64,skew=1", 21},
    {"H=256,I=128,E=16,topk=4,a=mxfp4,cat=1,bm=64,skew=0", 1},
};
static const mma_case down_cases[] = {
    {"H=256,I=128,E=16,topk=4,a=mxfp4,comb=0,bm=64,skew=2", 13},
    {"H=256,I=128,E=8,topk=2,a=mxfp4,comb=1,bm=64,skew=1", 21},
    {"H=256,I=128,E=16,topk=4,a=mxfp4,comb=1,bm=64,skew=0", 1},
};

/* Stage 2 split in two: K (= I) of 256. */
static const mma_case down_split_case[] = {
    {"H=128,I=256,E=16,topk=4,a=mxfp4,comb=0,bm=64,skew=2", 13},
};

/* Tiles (BK 128: down's K of 128 is one step) and the decode path. */
static const char *const w64_tiles[] = {
    "BM=16,BN=64,BK=128,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=1,VEC=1,UNROLL=1,MMA=3,GEMV=0",
    "BM=64,BN=32,BK=128,WAVES=2,STAGES=2,SPLITK=1,GROUP_M=4,VEC=8,UNROLL=1,MMA=3,GEMV=0",
    "BM=32,BN=64,BK=128,WAVES=8,STAGES=2,SPLITK=1,GROUP_M=8,VEC=8,UNROLL=1,MMA=3,GEMV=0",
};
static const char *const w64_gemv[] = {
    "BM=16,BN=64,BK=32,WAVES=4,STAGES=1,SPLITK=1,GROUP_M=1,VEC=1,UNROLL=1,MMA=3,GEMV=1",
    "BM=16,BN=16,BK=32,WAVES=1,STAGES=1,SPLITK=1,GROUP_M=1,VEC=1,UNROLL=1,MMA=3,GEMV=1",
};
/* K split (comb=0 cases only: comb=1 tiles are not split) */
static const char *const w64_split[] = {
    "BM=16,BN=64,BK=128,WAVES=4,STAGES=2,SPLITK=2,GROUP_M=1,VEC=1,UNROLL=1,MMA=3,GEMV=0",
    "BM=16,BN=32,BK=32,WAVES=2,STAGES=1,SPLITK=2,GROUP_M=1,VEC=1,UNROLL=1,MMA=3,GEMV=1",
};
static const char *const w32_tiles[] = {
    "BM=16,BN=32,BK=128,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=1,VEC=1,UNROLL=1,MMA=3,GEMV=0",
    "BM=64,BN=64,BK=128,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=8,VEC=8,UNROLL=1,MMA=3,GEMV=0",
};
static const char *const w32_gemv[] = {
    "BM=16,BN=32,BK=32,WAVES=4,STAGES=1,SPLITK=1,GROUP_M=1,VEC=1,UNROLL=1,MMA=3,GEMV=1",
};
static const char *const w32_split[] = {
    "BM=16,BN=32,BK=128,WAVES=4,STAGES=2,SPLITK=2,GROUP_M=1,VEC=1,UNROLL=1,MMA=3,GEMV=0",
    "BM=16,BN=16,BK=32,WAVES=2,STAGES=1,SPLITK=2,GROUP_M=1,VEC=1,UNROLL=1,MMA=3,GEMV=1",
};
#define N(a) ((int)(sizeof a / sizeof a[0]))

Test(moe_mma8, up_matches_the_reference_on_wave64, .timeout = 900)
{
    mma_check_on(fam("moe_gemm_up"), "emu:wave64", w64_tiles, N(w64_tiles), up_cases, 3);
    mma_check_on(fam("moe_gemm_up"), "emu:wave64", w64_gemv, N(w64_gemv), up_cases, 3);
    mma_check_on(fam("moe_gemm_up"), "emu:wave64", w64_split, N(w64_split), up_cases, 3);
}

Test(moe_mma8, down_matches_the_reference_on_wave64, .timeout = 900)
{
    mma_check_on(fam("moe_gemm_down"), "emu:wave64", w64_tiles, N(w64_tiles), down_cases, 3);
    mma_check_on(fam("moe_gemm_down"), "emu:wave64", w64_gemv, N(w64_gemv), down_cases, 3);
    mma_check_on(fam("moe_gemm_down"), "emu:wave64", w64_split, N(w64_split), down_split_case,
                 1);
}

Test(moe_mma8, up_matches_the_reference_on_wave32, .timeout = 900)
{
    mma_check_on(fam("moe_gemm_up"), "emu:wave32", w32_tiles, N(w32_tiles), up_cases, 3);
    mma_check_on(fam("moe_gemm_up"), "emu:wave32", w32_gemv, N(w32_gemv), up_cases, 3);
    mma_check_on(fam("moe_gemm_up"), "emu:wave32", w32_split, N(w32_split), up_cases, 3);
}

Test(moe_mma8, down_matches_the_reference_on_wave32, .timeout = 900)
{
    mma_check_on(fam("moe_gemm_down"), "emu:wave32", w32_tiles, N(w32_tiles), down_cases, 3);
    mma_check_on(fam("moe_gemm_down"), "emu:wave32", w32_gemv, N(w32_gemv), down_cases, 3);
    mma_check_on(fam("moe_gemm_down"), "emu:wave32", w32_split, N(w32_split), down_split_case,
                 1);
}

/* ---- the folded tables ---------------------------------------------------- */

/* A kernel appended to moe_gemm.hip: the 32 words of the 16 tables. */
static const char tab_kernel[] =
    "\nMT_KERNEL void q8_tab_test(unsigned *out)\n"
    "{\n"
    "    __shared__ unsigned tab[32];\n"
    "    q8_tables_fill(tab);\n"
    "    __syncthreads();\n"
    "    for (int i = threadIdx.x; i < 32; i += blockDim.x)\n"
    "        out[i] = tab[i];\n"
    "}\n";

/* The e4m3 value of a code, from the format's definition. */
static double e4m3(unsigned v)
{
    unsigned e = (v >> 3) & 15u, m = v & 7u;
    double f = e ? ldexp(1.0 + m / 8.0, (int)e - 7) : ldexp((double)m, -9);
    return (v & 0x80u) ? -f : f;
}

Test(moe_mma8, every_folded_table_entry_is_the_e2m1_value_times_its_power_of_two)
{
    static const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    for (int wave = 32; wave <= 64; wave *= 2) {
        dev_device *d = td_open(wave == 64 ? "emu:wave64" : "emu:wave32", NULL);
        const char *base = kern_source_get("moe_gemm.hip");
        cr_assert_not_null(base);
        size_t n = strlen(base);
        char *src = malloc(n + sizeof tab_kernel);
        cr_assert_not_null(src);
        memcpy(src, base, n);
        memcpy(src + n, tab_kernel, sizeof tab_kernel);
        char ws[16];
        snprintf(ws, sizeof ws, "%d", wave);
        const dev_define defs[] = {
            {"MT_WS", ws},    {"MOE_UP", "1"},  {"S_H", "256"},    {"S_I", "128"},
            {"S_topk", "4"},  {"S_a", "3"},     {"BM", "16"},      {"BN", "64"},
            {"BK", "128"},    {"WAVES", "1"},   {"STAGES", "2"},   {"SPLITK", "1"},
            {"GROUP_M", "1"}, {"VEC", "8"},     {"UNROLL", "1"},   {"MMA", "3"},
        };
        dev_module *m = td_build(d, "moe_gemm.hip", src, defs,
                                 (int)(sizeof defs / sizeof defs[0]), true);
        free(src);
        dev_kernel *k = td_kernel(m, "q8_tab_test", "p");
        unsigned *g = td_alloc(d, 32 * 4), h[32];
        void *args[] = {&g};
        td_launch(d, k, (dev_dim3){1, 1, 1}, (dev_dim3){(unsigned)wave, 1, 1}, 0, args);
        td_download(d, h, g, sizeof h);
        for (int i = 0; i < 16; i++)
            for (int mcode = 0; mcode < 8; mcode++) {
                unsigned code = h[2 * i + mcode / 4] >> (8 * (mcode % 4)) & 0xffu;
                double want = i ? ldexp(e2m1[mcode], i - 9) : 0.0;
                cr_assert_eq(e4m3(code), want, "table %d magnitude %d: code %#x is %g, want %g", i,
                             mcode, code, e4m3(code), want);
            }
        dev_free(d, g);
        dev_module_unload(m);
        dev_close(d);
    }
}

/* ---- the rules ------------------------------------------------------------ */

static bool valid(const char *fname, const char *shape, const char *cfg, const char *spec,
                  const char *arch, char *why, size_t cap)
{
    return mma_valid_spec(fname, shape, 64, cfg, spec, arch, why, cap);
}

Test(moe_mma8, the_fp8_path_is_refused_where_it_cannot_run)
{
    char why[256];
    const char *up = "H=256,I=128,E=16,topk=4,a=mxfp4,cat=1,bm=64,skew=0";
    const char *tile =
        "BM=16,BN=64,BK=128,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=1,VEC=1,UNROLL=1,MMA=3,GEMV=0";
    cr_assert(valid("moe_gemm_up", up, tile, "emu:wave64", NULL, why, sizeof why), "%s", why);
    /* bf16 activations are not folded */
    cr_assert_not(valid("moe_gemm_up", "H=256,I=128,E=16,topk=4,a=bf16,cat=1,bm=64,skew=0",
                        tile, "emu:wave64", NULL, why, sizeof why));
    cr_assert(strstr(why, "a4w4"), "%s", why);
    /* BK 64 is two blocks: the weight loads take four */
    cr_assert_not(valid("moe_gemm_up", up,
                        "BM=16,BN=64,BK=64,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=1,VEC=1,UNROLL=1,"
                        "MMA=3,GEMV=0", "emu:wave64", NULL, why, sizeof why));
    cr_assert(strstr(why, "BK"), "%s", why);
    /* the decode path: BN is WAVES x the instruction's columns */
    cr_assert_not(valid("moe_gemm_up", up,
                        "BM=16,BN=32,BK=32,WAVES=4,STAGES=1,SPLITK=1,GROUP_M=1,VEC=1,UNROLL=1,"
                        "MMA=3,GEMV=1", "emu:wave64", NULL, why, sizeof why));
    cr_assert(strstr(why, "BN = WAVES"), "%s", why);
    /* gfx90a has no fp8 instructions, gfx942 does */
    cr_assert_not(valid("moe_gemm_up", up, tile, "hip", "gfx90a", why, sizeof why));
    cr_assert(strstr(why, "MMA=3"), "%s", why);
}

/* ---- a one-cell layout mistake is caught -------------------------------- */

Test(moe_mma8, a_one_cell_swap_in_the_fp8_layout_fails_both_paths, .timeout = 600)
{
    static const char *const cfgs[] = {
        "BM=16,BN=64,BK=128,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=1,VEC=1,UNROLL=1,MMA=3,GEMV=0",
        "BM=16,BN=64,BK=32,WAVES=4,STAGES=1,SPLITK=1,GROUP_M=1,VEC=1,UNROLL=1,MMA=3,GEMV=1",
    };
    const kern_family *f = fam("moe_gemm_up");
    dev_device *d = td_open("emu:wave64", NULL);
    uint64_t seed = mt_seed_fresh();
    /* two K positions of B in lane 33 (column 1, K 8..15), then accumulator
     * columns 1 and 2 of row 0 */
    static const int swaps[2][5] = {{EMU_MMA_B, 33, 1, 33, 2}, {EMU_MMA_C, 1, 0, 2, 0}};
    for (int sw = 0; sw < 2; sw++)
        for (int i = 0; i < 2; i++) {
            kern_config c;
            mma_parse(f, cfgs[i], &c);
            mt_err err = MT_ERR_INIT;
            emu_mma_debug_swap(MT_EMU_MMA_FP8_16X16X32, (emu_mma_operand)swaps[sw][0],
                               swaps[sw][1], swaps[sw][2], swaps[sw][3], swaps[sw][4]);
            /* M=64: every expert's tile has rows in the swapped lanes */
            mt_status st = kern_check_one(d, f, up_cases[2].shape, 64, &c, seed, &err);
            emu_mma_debug_swap(0, EMU_MMA_A, 0, 0, 0, 0);
            cr_expect_neq(st, MT_OK, "swap %d, %s: the check passed with a wrong layout", sw,
                          cfgs[i]);
            st = kern_check_one(d, f, up_cases[2].shape, 64, &c, seed, &err);
            cr_expect_eq(st, MT_OK, "%s without the swap: %s", cfgs[i], err.msg);
        }
    dev_close(d);
}

/* ---- the GLM-5.2 defaults' code, compile-only -------------------------------
 * gfx942 (clang-19, disassembled with llvm-objdump-19): at M = 4096 the hot
 * loop's matrix instructions are fp8, at most 4 VALU per matrix instruction,
 * no full vector-memory wait ahead of them, and 2 waves per SIMD or more by
 * registers and by LDS; at M = 1 (the decode path) at most 1.5 VALU per fp4
 * weight value in the weight stream (each matrix instruction there takes
 * one word of packed weights per lane: 8 values). sm_90 (NVRTC): e4m3
 * mma.sync, ldmatrix and cp.async in the PTX, no local memory. Each skips
 * where its compiler is absent. */

/* At M >= 256 (tiles): <= 4 VALU per MFMA, no vmcnt(0) ahead of them, 2
 * waves per SIMD by registers and LDS; below (the decode path): <= 1.5
 * VALU per fp4 weight value (8 a lane per MFMA). */
static void gfx942_default(const char *fname, int64_t m)
{
    mma_gfx942 o;
    mma_fp8_gfx942(fname, fname, "glm5.2", m, &o);
    if (m >= 256) {
        cr_assert_leq(o.valu, 4 * o.mfma, "%s %s: %d VALU for %d MFMA", fname, o.key, o.valu,
                      o.mfma);
        cr_assert_eq(o.vm0, 0, "%s %s: a vmcnt(0) ahead of the MFMAs", fname, o.key);
        cr_assert_geq(o.waves_regs, 2, "%s %s: %d waves/SIMD by registers", fname, o.key,
                      o.waves_regs);
        cr_assert_geq(o.waves_lds, 2, "%s %s: %lld B of LDS, %d waves/SIMD", fname, o.key,
                      (long long)o.lds_bytes, o.waves_lds);
    } else {
        cr_assert_leq(2 * o.valu, 3 * 8 * o.mfma, "%s %s: %d VALU for %d fp4 values", fname,
                      o.key, o.valu, 8 * o.mfma);
        cr_log_info("%s M=%lld: %.2f VALU per fp4 value", fname, (long long)m,
                    (double)o.valu / (8.0 * o.mfma));
    }
}

Test(moe_mma8, gfx942_defaults_at_4096_and_1_meet_the_instruction_budget, .timeout = 300)
{
    gfx942_default("moe_gemm_up", 4096);
    gfx942_default("moe_gemm_down", 4096);
    gfx942_default("moe_gemm_up", 1);
    gfx942_default("moe_gemm_down", 1);
}

Test(moe_mma8, sm90_defaults_have_e4m3_mma_ldmatrix_and_cp_async, .timeout = 300)
{
    mma_fp8_sm90("moe_gemm_up", "moe_gemm_up", "glm5.2", 4096, true);
    mma_fp8_sm90("moe_gemm_down", "moe_gemm_down", "glm5.2", 4096, true);
    mma_fp8_sm90("moe_gemm_up", "moe_gemm_up", "glm5.2", 1, false);
}
