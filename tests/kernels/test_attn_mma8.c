/* test_attn_mma8.c: the attention families on fp8 matrix instructions
 * (MMA=3 with an fp8 cache): mla_decode (the query in two e4m3 parts, P in
 * three, the next tile's rows copied during this one's softmax and P V)
 * and dsa_indexer's scores (an fp8 GEMM over the cache as it is), against
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
};
static const char *const index_w64[] = {
    "BT=64,QB=1,WAVES=4,TK_WAVES=4,MMA=3",
    "BT=32,QB=4,WAVES=2,TK_WAVES=2,MMA=3",
    "BT=128,QB=2,WAVES=1,TK_WAVES=1,MMA=3",
};
static const char *const index_w32[] = {
    "BT=64,QB=1,WAVES=4,TK_WAVES=4,MMA=3",
    "BT=16,QB=2,WAVES=2,TK_WAVES=1,MMA=3",
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
    const kern_family *f = fam(fname);
    dev_device *d = mma_open_or_skip(spec, arch);
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, shape, &s, NULL, NULL), MT_OK);
    kern_config c;
    mma_parse(f, cfg, &c);
    bool ok = kern_config_valid(f, f->gpu, &s, 2, &c, dev_get_props(d), why, cap);
    dev_close(d);
    return ok;
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
                        "BT=64,QB=1,WAVES=4,TK_WAVES=4,MMA=3", "emu:wave64", NULL, why,
                        sizeof why));
    cr_assert(strstr(why, "ID=48"), "%s", why);
    /* gfx90a has no fp8 instructions */
    cr_assert_not(valid("mla_decode", decode_cases[0].shape, dec, "hip", "gfx90a", why,
                        sizeof why));
    cr_assert(strstr(why, "MMA=3"), "%s", why);
}

/* ---- the GLM-5.2 fp8 defaults' code, compile-only -------------------------- */

static void default_of(const kern_family *f, const char *shape, int64_t m, const dev_props *p,
                       kern_shape *s, kern_config *c, char *key, size_t cap)
{
    cr_assert_eq(kern_shape_parse(f, shape, s, NULL, NULL), MT_OK);
    memset(c, 0, sizeof *c);
    f->gpu->default_config(s, m, p, c);
    kern_config_key(f->gpu, c, key, cap);
    cr_assert_eq(kern_config_get(f->gpu, c, "MMA", -1), 3, "%s %s M=%lld: default %s", f->name,
                 shape, (long long)m, key);
}

static void gfx942_default(const char *fname, const char *kernel, int64_t m, bool two_waves)
{
    const kern_family *f = fam(fname);
    dev_device *d = mma_open_or_skip("hip", "gfx942");
    kern_shape s;
    kern_config c;
    char key[256];
    default_of(f, "glm5.2-fp8", m, dev_get_props(d), &s, &c, key, sizeof key);
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *r = td_find_res(code, kernel);
    cr_assert_eq(r->private_bytes, 0, "%s %s: scratch", fname, key);
    cr_assert_eq(r->spill_vgprs, 0, "%s %s: spills", fname, key);
    int waves = kern_config_get(f->gpu, &c, "WAVES", 1);
    int waves_lds = (int)((r->lds_bytes ? 65536 / r->lds_bytes : 64) * waves / 4);
    size_t len = 0;
    const void *bytes = dev_code_get_bytes(code, &len);
    dev_isa_report *rep = malloc(sizeof *rep);
    cr_assert_not_null(rep);
    mt_status st = dev_isa_mix(bytes, len, "gfx942", rep, &err);
    if (st != MT_OK) {
        free(rep);
        dev_code_free(code);
        dev_close(d);
        cr_assert_eq(st, MT_E_UNSUPPORTED, "%s", err.msg);
        cr_skip_test("no llvm-objdump: %s", err.msg);
    }
    const dev_isa_func *fn = dev_isa_find(rep, kernel);
    cr_assert_not_null(fn);
    cr_assert_geq(fn->hot, 0);
    const dev_isa_loop *h = &fn->loops[fn->hot];
    cr_assert_gt(h->c.n[DEV_ISA_MFMA], 0, "%s %s: no matrix instruction in the hot loop", fname,
                 key);
    for (int i = 0; i < fn->n_mma_kinds; i++)
        cr_assert(strstr(fn->mma_kind[i], "fp8"), "%s %s: %s", fname, key, fn->mma_kind[i]);
    cr_assert_eq(h->vm0_before_mma, 0, "%s %s: a vmcnt(0) ahead of the MFMAs", fname, key);
    if (two_waves) {
        cr_assert_geq(r->waves_per_simd, 2, "%s %s: %d waves/SIMD by registers", fname, key,
                      r->waves_per_simd);
        cr_assert_geq(waves_lds, 2, "%s %s: %d waves/SIMD by LDS", fname, key, waves_lds);
    }
    cr_log_info("gfx942 %s glm5.2-fp8 M=%lld %s: hot loop %d MFMA, %d VALU, vmcnt(0) ahead %d; "
                "VGPR %d, waves/SIMD %d by registers, %d by LDS (%lld B)", fname, (long long)m,
                key, h->c.n[DEV_ISA_MFMA], h->c.n[DEV_ISA_VALU], h->vm0_before_mma, r->vgprs,
                r->waves_per_simd, waves_lds, (long long)r->lds_bytes);
    free(rep);
    dev_code_free(code);
    dev_close(d);
}

Test(attn_mma8, gfx942_fp8_defaults_run_fp8_mfma_without_waiting_on_memory, .timeout = 300)
{
    gfx942_default("mla_decode", "mla_decode_split", 1, true);
    gfx942_default("dsa_indexer", "dsa_scores", 1, false);
}

static void sm90_default(const char *fname, const char *kernel, int64_t m)
{
    const kern_family *f = fam(fname);
    dev_device *d = mma_open_or_skip("cuda", "sm_90");
    kern_shape s;
    kern_config c;
    char key[256];
    default_of(f, "glm5.2-fp8", m, dev_get_props(d), &s, &c, key, sizeof key);
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *r = td_find_res(code, kernel);
    cr_assert_eq(r->private_bytes, 0, "sm_90 %s %s: %lld bytes of stack", fname, key,
                 (long long)r->private_bytes);
    const char *ptx = dev_code_get_text(code);
    cr_assert_not_null(ptx);
    dev_ptx_report *rep = malloc(sizeof *rep);
    cr_assert_not_null(rep);
    dev_ptx_parse(ptx, rep);
    const dev_ptx_func *fn = dev_ptx_find(rep, kernel);
    cr_assert_not_null(fn);
    cr_assert_gt(fn->mma, 0);
    for (int i = 0; i < fn->n_mma_kinds; i++)
        cr_assert(strstr(fn->mma_kind[i], "e4m3"), "sm_90 %s: %s", fname, fn->mma_kind[i]);
    cr_assert_gt(fn->ldmatrix, 0, "sm_90 %s %s: no ldmatrix", fname, key);
    cr_assert_gt(fn->cp_async, 0, "sm_90 %s %s: no cp.async", fname, key);
    cr_assert_eq(fn->local, 0, "sm_90 %s %s: local memory", fname, key);
    cr_log_info("sm_90 %s glm5.2-fp8 M=%lld %s: %d %s, %d ldmatrix, %d cp.async, %d registers",
                fname, (long long)m, key, fn->mma, fn->mma_kind[0], fn->ldmatrix, fn->cp_async,
                r->vgprs);
    free(rep);
    dev_code_free(code);
    dev_close(d);
}

Test(attn_mma8, sm90_fp8_defaults_have_e4m3_mma_ldmatrix_and_cp_async, .timeout = 300)
{
    sm90_default("mla_decode", "mla_decode_split", 1);
    sm90_default("dsa_indexer", "dsa_scores", 1);
}
