/* test_moe_amx.c: a16w4 on AMX tiles (MR 16 on rows grouped by 16, where
 * the cpu device reports AMX usable: dev_props.cpu_amx) against the
 * families' plain C references: token counts below, at and above one tile
 * of 16, K in blocks, paired groups (stage 1), both families; and blocks
 * whose E8M0 scale codes leave the range the tile scales in bf16 (codes 0
 * and 1: the fp32 route). Skipped, with the reason logged, where the cpu
 * or the OS has no AMX. Fresh seeds, printed on failure. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <string.h>

#include "common/rng.h"
#include "cpu_arch_util.h"
#include "device/device.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"

/* The native cpu device when its kernels use AMX, else NULL (skip). */
static dev_device *open_amx(void)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu", NULL, &d, &err), MT_OK, "open cpu: %s", err.msg);
    if (!dev_get_props(d)->cpu_amx) {
        cr_log_info("cpu %s: no AMX for this process (skipped)", dev_get_props(d)->name);
        dev_close(d);
        return NULL;
    }
    return d;
}

Test(moe_amx, tiles_match_the_reference, .timeout = 300)
{
    dev_device *d = open_amx();
    if (!d)
        cr_skip_test("no AMX");
    static const cpu_arch_case up[] = {
        {"H=256,I=128,E=4,topk=2,a=bf16,cat=1,wl=1,bm=64,skew=0", 40,
         "NR=1,MR=16,KB=65536,NT=128,PF=2048"},
        {"H=256,I=128,E=2,topk=1,a=bf16,cat=1,wl=1,bm=64,skew=1", 37, /* 13 + 12 + 12 */
         "NR=1,MR=16,KB=256,NT=32,PF=0"},
        {"H=256,I=128,E=4,topk=2,a=bf16,cat=1,wl=1,bm=64,skew=0", 3,
         "NR=1,MR=16,KB=65536,NT=16,PF=4096"},
        {"H=512,I=128,E=2,topk=1,a=bf16,cat=1,wl=1,bm=64,skew=1", 16, /* one full tile */
         "NR=1,MR=16,KB=256,NT=64,PF=0"}, /* 2 K blocks */
    };
    static const cpu_arch_case down[] = {
        {"H=256,I=128,E=4,topk=2,a=bf16,comb=1,wl=1,bm=64,skew=0", 40,
         "NR=1,MR=16,KB=65536,NT=128,PF=2048"},
        {"H=256,I=512,E=2,topk=1,a=bf16,comb=1,wl=1,bm=64,skew=1", 33, /* 11 x 3 */
         "NR=1,MR=16,KB=256,NT=64,PF=0"},
        {"H=256,I=256,E=4,topk=2,a=bf16,comb=0,wl=1,bm=64,skew=0", 17,
         "NR=1,MR=16,KB=65536,NT=256,PF=1024"},
    };
    uint64_t seed = mt_seed_fresh();
    check_cases_at(d, NULL, kern_family_find("moe_gemm_up"), up, sizeof up / sizeof up[0], seed);
    check_cases_at(d, NULL, kern_family_find("moe_gemm_down"), down,
                   sizeof down / sizeof down[0], seed + 100);
    dev_close(d);
}

/* Codes 0 (a zero row) and 1 (2^-126) in some blocks of every expert, next
 * to code 2, the smallest the bf16 exponent step keeps normal: those
 * blocks take the fp32 route; and code 140 (a scale above 1: the masked
 * add) in another. The sums must still match the reference recomputed on
 * the changed weights. */
Test(moe_amx, scale_codes_of_every_route_match_the_reference, .timeout = 300)
{
    dev_device *d = open_amx();
    if (!d)
        cr_skip_test("no AMX");
    const kern_family *f = kern_family_find("moe_gemm_down");
    const kern_impl *im = kern_family_impl(f, DEV_BACKEND_CPU);
    enum { H = 256, I = 128, E = 2, M = 24 };
    kern_shape s;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_shape_parse(f, "H=256,I=128,E=2,topk=1,a=bf16,comb=1,wl=1,bm=64,skew=0",
                                  &s, NULL, &err), MT_OK, "%s", err.msg);
    uint64_t seed = mt_seed_fresh();
    kern_problem *p = NULL;
    cr_assert_eq(kern_problem_create(d, f, &s, M, seed, &p, &err), MT_OK, "%s", err.msg);
    int wb = problem_buf(p, "w_down");
    uint8_t *w = kern_problem_host(p)[wb];
    /* moe_w4_group16's layout: per group of 16 rows, per 4 blocks (all of
     * K = 128 here) 1024 packed bytes, then 16 codes per block */
    const size_t group = 16 * (I / 2 + I / 32);
    for (int e = 0; e < E; e++) {
        uint8_t *g0 = w + (size_t)e * (H / 16) * group, *g1 = g0 + group;
        g0[1024 + 0 * 16 + 0] = 0; /* block 0, row 0 */
        g0[1024 + 1 * 16 + 5] = 1; /* block 1, row 5 */
        g0[1024 + 2 * 16 + 9] = 2; /* block 2, row 9: in range */
        g1[1024 + 3 * 16 + 15] = 0; /* block 3, row 15 of the second group */
        g1[1024 + 1 * 16 + 7] = 140; /* block 1 of the second group: a scale above 1 */
    }
    cr_assert_eq(dev_copy_to(d, kern_problem_dev(p)[wb], w, kern_problem_buf(p, wb)->bytes, &err),
                 MT_OK, "%s", err.msg);
    f->reference(&s, M, kern_problem_host(p));
    kern_config cfg;
    cr_assert_eq(kern_config_parse(im, "NR=1,MR=16,KB=65536,NT=64,PF=0", &cfg, &err), MT_OK,
                 "%s", err.msg);
    kern_exec *ex = NULL;
    cr_assert_eq(kern_exec_open(d, f, &s, M, &cfg, &ex, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(kern_problem_run(p, ex, &err), MT_OK, "%s", err.msg);
    mt_status st = kern_problem_verify(p, &err);
    cr_expect_eq(st, MT_OK, "seed %llu: %s", (unsigned long long)seed, err.msg);
    kern_exec_close(ex);
    kern_problem_destroy(p);
    dev_close(d);
}
