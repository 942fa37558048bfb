/* test_attn_mma8.c: the attention families on fp8 matrix instructions
 * (MMA=3 with an fp8 cache): mla_decode (the query in two e4m3 parts, P in
 * three, the next tile's rows copied during this one's softmax and P V)
 * and dsa_indexer's scores (an fp8 GEMM over the cache as it is, with the
 * top-k in one block a query or split over 2-16 and merged), against
 * their plain C references on emu wave64 (AMD's 16x16x32 fp8 layout) and
 * wave32 (NVIDIA's m16n8k32), dense and sparse, several tiles and splits;
 * the rules that refuse it where it cannot run; and the GLM-5.2 fp8
 * defaults' code, compile-only: gfx942 (fp8 MFMA in the hot loops, no full
 * memory wait ahead of them, mla_decode at 2 waves a SIMD) and sm_90 (e4m3
 * mma.sync, ldmatrix, cp.async, no local memory). */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/cuda/ptx_mix.h"
#include "device/device.h"
#include "device/hip/isa_mix.h"
#include "kernels/core/family.h"
#include "test_mma_util.h"

static const kern_family *fam(const char *name)
{
    const kern_family *f = kern_family_find(name);
    cr_assert_not_null(f, "family %s", name);
    return f;
}

/* glm5.2's widths with 16 or 32 heads: sparse past topk, dense over
 * several tiles (110 tokens: 4 tiles of 32, the last one short). */
static const mma_case decode_cases[] = {
    {"H=16,L=512,R=64,D=192,topk=48,ps=64,kv=fp8,sparse=1,C=75", 2},
    {"H=16,L=512,R=64,D=192,topk=32,ps=16,kv=fp8,sparse=0,C=110", 1},
    {"H=32,L=512,R=64,D=192,topk=64,ps=64,kv=fp8,sparse=1,C=200", 3},
};
static const char *const decode_w64[] = {
    "HB=16,BN=32,WAVES=4,MMA=3,NSPLIT=1",
    "HB=16,BN=32,WAVES=8,MMA=3,NSPLIT=2",
    "HB=16,BN=32,WAVES=1,MMA=3,NSPLIT=4",
};
static const char *const decode_w32[] = {
    "HB=16,BN=32,WAVES=4,MMA=3,NSPLIT=1",
    "HB=16,BN=32,WAVES=8,MMA=3,NSPLIT=2",
};
#define N(a) ((int)(sizeof a / sizeof a[0]))

Test(attn_mma8, mla_decode_matches_the_reference_on_wave64, .timeout = 900)
{
    mma_check_on(fam("mla_decode"), "emu:wave64", decode_w64, N(decode_w64), decode_cases,
                 N(decode_cases));
}

Test(attn_mma8, mla_decode_matches_the_reference_on_wave32, .timeout = 900)
{
    mma_check_on(fam("mla_decode"), "emu:wave32", decode_w32, N(decode_w32), decode_cases,
                 N(decode_cases));
}

static const mma_case index_cases[] = {
    {"IH=32,ID=128,topk=64,ps=64,kv=fp8,C=150", 1},
    {"IH=4,ID=64,topk=16,ps=7,kv=fp8,C=90", 3},
    {"IH=2,ID=32,topk=16,ps=5,kv=fp8,C=11", 3}, /* no longer than topk: the merge copies */
};
static const char *const index_w64[] = {
    "BT=64,QB=1,WAVES=4,TK_WAVES=4,MMA=3,TK_SPLIT=1",
    "BT=32,QB=4,WAVES=2,TK_WAVES=2,MMA=3,TK_SPLIT=4",
    "BT=128,QB=2,WAVES=1,TK_WAVES=1,MMA=3,TK_SPLIT=16",
};
static const char *const index_w32[] = {
    "BT=64,QB=1,WAVES=4,TK_WAVES=4,MMA=3,TK_SPLIT=2",
    "BT=16,QB=2,WAVES=2,TK_WAVES=1,MMA=3,TK_SPLIT=8",
};

Test(attn_mma8, dsa_indexer_matches_the_reference_on_both_wave_sizes, .timeout = 900)
{
    mma_check_on(fam("dsa_indexer"), "emu:wave64", index_w64, N(index_w64), index_cases,
                 N(index_cases));
    mma_check_on(fam("dsa_indexer"), "emu:wave32", index_w32, N(index_w32), index_cases,
                 N(index_cases));
}

static bool valid(const char *fname, const char *shape, const char *cfg, const char *spec,
                  const char *arch, char *why, size_t cap)
{
    return mma_valid_spec(fname, shape, 2, cfg, spec, arch, why, cap);
}

Test(attn_mma8, the_fp8_paths_are_refused_where_they_cannot_run)
{
    char why[256];
    const char *dec = "HB=16,BN=32,WAVES=4,MMA=3,NSPLIT=1";
    cr_assert(valid("mla_decode", decode_cases[0].shape, dec, "emu:wave64", NULL, why,
                    sizeof why), "%s", why);
    /* a bf16 cache is decoded, not multiplied as it is */
    cr_assert_not(valid("mla_decode", "H=16,L=512,R=64,D=192,topk=48,ps=64,kv=bf16,sparse=1,C=75",
                        dec, "emu:wave64", NULL, why, sizeof why));
    cr_assert(strstr(why, "fp8 cache"), "%s", why);
    /* BN is one K step of tokens */
    cr_assert_not(valid("mla_decode", decode_cases[0].shape, "HB=16,BN=16,WAVES=4,MMA=3,NSPLIT=1",
                        "emu:wave64", NULL, why, sizeof why));
    cr_assert(strstr(why, "BN=16"), "%s", why);
    /* 8 heads are not a fragment row */
    cr_assert_not(valid("mla_decode", "H=8,L=512,R=64,D=192,topk=32,ps=64,kv=fp8,sparse=1,C=45",
                        "HB=8,BN=32,WAVES=4,MMA=3,NSPLIT=1", "emu:wave64", NULL, why,
                        sizeof why));
    cr_assert(strstr(why, "HB=8"), "%s", why);
    /* the indexer: ID whole K steps of 32 */
    cr_assert_not(valid("dsa_indexer", "IH=2,ID=48,topk=16,ps=16,kv=fp8,C=40",
                        "BT=64,QB=1,WAVES=4,TK_WAVES=4,MMA=3,TK_SPLIT=1", "emu:wave64", NULL, why,
                        sizeof why));
    cr_assert(strstr(why, "ID=48"), "%s", why);
    /* gfx90a has no fp8 instructions */
    cr_assert_not(valid("mla_decode", decode_cases[0].shape, dec, "hip", "gfx90a", why,
                        sizeof why));
    cr_assert(strstr(why, "MMA=3"), "%s", why);
}

/* ---- the GLM-5.2 fp8 defaults' code, compile-only -------------------------- */

/* The default's code: fp8 MFMA in the hot loop without a vmcnt(0) ahead,
 * and where two_waves is set 2 waves per SIMD by registers and LDS. */
static void gfx942_default(const char *fname, const char *kernel, int64_t m, bool two_waves)
{
    mma_gfx942 o;
    mma_fp8_gfx942(fname, kernel, "glm5.2-fp8", m, &o);
    cr_assert_eq(o.vm0, 0, "%s %s: a vmcnt(0) ahead of the MFMAs", fname, o.key);
    if (two_waves) {
        cr_assert_geq(o.waves_regs, 2, "%s %s: %d waves/SIMD by registers", fname, o.key,
                      o.waves_regs);
        cr_assert_geq(o.waves_lds, 2, "%s %s: %d waves/SIMD by LDS", fname, o.key, o.waves_lds);
    }
}

Test(attn_mma8, gfx942_fp8_defaults_run_fp8_mfma_without_waiting_on_memory, .timeout = 300)
{
    gfx942_default("mla_decode", "mla_decode_split", 1, true);
    gfx942_default("dsa_indexer", "dsa_scores", 1, false);
}

Test(attn_mma8, sm90_fp8_defaults_have_e4m3_mma_ldmatrix_and_cp_async, .timeout = 300)
{
    mma_fp8_sm90("mla_decode", "mla_decode_split", "glm5.2-fp8", 1, true);
    mma_fp8_sm90("dsa_indexer", "dsa_scores", "glm5.2-fp8", 1, true);
}
