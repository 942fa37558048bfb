/* test_moe_a16.c: a16w4 (bf16 activations) on expert weights grouped by 16
 * rows (wl=1, the cpu tiles' layout at every activation type): a token's
 * result must not depend on how many tokens share its expert's tile, on
 * the token group size (MR), on pairing groups (NR) or on K blocking (KB),
 * bit for bit, at every SIMD level this CPU has (native: vdpbf16ps where
 * AVX512_BF16 exists; x86-64-v4: AVX-512 floats; x86-64-v3: AVX2 floats;
 * x86-64-v2: portable C; and where the cpu has AMX, among the MR 16 tiles,
 * whose sums differ from the vector tiles'). Every token of a problem routes to one expert
 * with the same input row, so every output row must equal the first, under
 * every config. Agreement with the reference: moetune check's cases
 * (test_moe_check_cpu*). Fresh seeds, printed on failure. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "cpu_arch_util.h"
#include "device/device.h"
#include "kernels/core/exec.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"

enum { M = 13 };

/* Makes every row of buffer name (M rows) the first one; with r, first
 * fills that row with bf16 values of exponents 2^-24..2^24, so that a
 * block's sum rounds and its order shows (products of bf16 and E2M1 values
 * of nearby magnitudes sum exactly in floats, in any order). */
static void same_rows(kern_problem *p, const char *name, mt_rng *r)
{
    int b = problem_buf(p, name);
    size_t row = kern_problem_buf(p, b)->bytes / M;
    uint8_t *x = kern_problem_dev(p)[b];
    if (r) {
        uint16_t *v = (uint16_t *)x;
        for (size_t i = 0; i < row / 2; i++)
            v[i] = (uint16_t)((mt_rng_below(r, 2) << 15) | ((103 + mt_rng_below(r, 49)) << 7) |
                              mt_rng_below(r, 128));
    }
    for (int t = 1; t < M; t++)
        memcpy(x + (size_t)t * row, x, row);
}

/* in, in2 (may be NULL): the inputs made equal per token; out: the rows
 * compared. */
static const char *const vector_cfgs[] = {
    "NR=1,MR=1,KB=65536,NT=64,PF=0",  /* one token per tile */
    "NR=1,MR=4,KB=256,NT=64,PF=0",    /* groups of 4, 3, 3, 3; K in blocks */
    "NR=2,MR=8,KB=65536,NT=64,PF=256", /* groups of 7, 6 in passes; paired groups */
};
/* Where the cpu device has AMX, MR 16 is one tile of up to 16 tokens: its
 * sums differ from the vector tiles' but not between tiles. */
static const char *const amx_cfgs[] = {
    "NR=1,MR=16,KB=65536,NT=64,PF=0", /* all 13 tokens in one tile */
    "NR=1,MR=16,KB=256,NT=32,PF=2048", /* K in blocks, shorter items */
};

static void check_family(dev_device *dv, const char *arch, const char *fam, const char *key,
                         const char *in, const char *in2, const char *out,
                         const char *const *cfgs, size_t n_cfgs)
{
    const kern_family *f = kern_family_find(fam);
    cr_assert_not_null(f);
    const kern_impl *im = kern_family_impl(f, DEV_BACKEND_CPU);
    kern_shape s;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_shape_parse(f, key, &s, NULL, &err), MT_OK, "%s", err.msg);
    uint64_t seed = mt_seed_fresh();
    kern_problem *p = NULL;
    cr_assert_eq(kern_problem_create(dv, f, &s, M, seed, &p, &err), MT_OK, "%s", err.msg);
    mt_rng r;
    mt_rng_seed(&r, seed);
    same_rows(p, in, &r);
    if (in2)
        same_rows(p, in2, NULL);
    int bo = problem_buf(p, out);
    const kern_buf_desc *dout = kern_problem_buf(p, bo);
    size_t orow = dout->bytes / M;
    uint8_t *first = malloc(orow), *got = malloc(dout->bytes);
    for (size_t c = 0; c < n_cfgs; c++) {
        kern_config cfg;
        cr_assert_eq(kern_config_parse(im, cfgs[c], &cfg, &err), MT_OK, "%s", err.msg);
        kern_exec *e = NULL;
        cr_assert_eq(kern_exec_open(dv, f, &s, M, &cfg, &e, &err), MT_OK, "%s %s: %s", fam,
                     cfgs[c], err.msg);
        cr_assert_eq(kern_problem_run(p, e, &err), MT_OK, "%s", err.msg);
        cr_assert_eq(kern_problem_download(p, bo, got, &err), MT_OK, "%s", err.msg);
        kern_exec_close(e);
        if (c == 0)
            memcpy(first, got, orow);
        for (int t = 0; t < M; t++)
            cr_assert(!memcmp(got + (size_t)t * orow, first, orow),
                      "%s %s on cpu --arch %s, seed %llu: token %d's row under %s differs from "
                      "token 0's under %s", fam, key, arch ? arch : "native",
                      (unsigned long long)seed, t, cfgs[c], cfgs[0]);
    }
    free(first);
    free(got);
    kern_problem_destroy(p);
}

static void check_arch_cfgs(dev_device *dv, const char *arch, const char *const *cfgs,
                            size_t n_cfgs)
{
    check_family(dv, arch, "moe_gemm_up", "H=256,I=128,E=4,topk=1,a=bf16,cat=1,wl=1,bm=64,skew=1",
                 "x", NULL, "h", cfgs, n_cfgs);
    check_family(dv, arch, "moe_gemm_down",
                 "H=256,I=128,E=4,topk=1,a=bf16,comb=1,wl=1,bm=64,skew=1", "h", "topk_w", "rows",
                 cfgs, n_cfgs);
}

static void check_arch(const char *arch)
{
    dev_device *dv = open_cpu_arch(arch);
    if (!dv)
        return;
    check_arch_cfgs(dv, arch, vector_cfgs, sizeof vector_cfgs / sizeof vector_cfgs[0]);
    dev_close(dv);
}

Test(moe_a16, native_rows_do_not_depend_on_the_tile, .timeout = 300) { check_arch(NULL); }
Test(moe_a16, amx_rows_do_not_depend_on_the_tile, .timeout = 300)
{
    dev_device *dv = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu", NULL, &dv, &err), MT_OK, "%s", err.msg);
    bool amx = dev_get_props(dv)->cpu_amx;
    if (amx)
        check_arch_cfgs(dv, "native (AMX)", amx_cfgs, sizeof amx_cfgs / sizeof amx_cfgs[0]);
    dev_close(dv);
    if (!amx)
        cr_skip_test("no AMX for this process");
}
Test(moe_a16, avx512_rows_do_not_depend_on_the_tile, .timeout = 300) { check_arch("x86-64-v4"); }
Test(moe_a16, avx2_rows_do_not_depend_on_the_tile, .timeout = 300) { check_arch("x86-64-v3"); }
Test(moe_a16, portable_rows_do_not_depend_on_the_tile, .timeout = 300) { check_arch("x86-64-v2"); }
