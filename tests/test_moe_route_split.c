/* test_moe_route_split.c: the cpu router's split path (ES > 0: the gate's
 * experts scored over many work items into scratch, then a selection
 * launch) against the family's reference, at every SIMD width the kernel
 * has (AVX-512, AVX2, scalar: the compile target capped per x86-64 level; a
 * level this CPU lacks is skipped). The defaults pick it only for few
 * tokens on many experts relative to the threads, so these configs are set
 * explicitly: expert counts that ES does not divide, token counts that TB
 * does not divide, grouped top-k. Fresh seeds, poisoned outputs. */
#include <criterion/criterion.h>

#include "common/rng.h"
#include "device/device.h"
#include "kernels/family.h"
#include "kernels/runner.h"

static void check_level(const char *arch)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    dev_open_opts oo = {.arch = arch};
    mt_status st = dev_open("cpu", arch ? &oo : NULL, &d, &err);
    if (st == MT_E_UNSUPPORTED)
        cr_skip_test("cpu --arch %s: %s", arch, err.msg);
    cr_assert_eq(st, MT_OK, "open cpu: %s", err.msg);
    const kern_family *f = kern_family_find("moe_route");
    const kern_impl *im = kern_family_impl(f, DEV_BACKEND_CPU);
    uint64_t seed = mt_seed_fresh();
    static const struct {
        const char *shape;
        int64_t m;
        const char *cfg;
    } cases[] = {
        {"H=256,E=64,topk=8,ngroup=8,topkg=4,rsf=2500,norm=1", 1, "TB=1,EB=8,ES=16"},
        {"H=256,E=64,topk=8,ngroup=8,topkg=4,rsf=2500,norm=1", 3, "TB=2,EB=16,ES=64"},
        {"H=200,E=12,topk=2,ngroup=1,topkg=1,rsf=1000,norm=1", 9, "TB=4,EB=4,ES=16"},
        {"H=200,E=40,topk=3,ngroup=1,topkg=1,rsf=1000,norm=0", 5, "TB=1,EB=16,ES=16"},
        {"tiny-groups", 17, "TB=8,EB=8,ES=16"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kern_config cfg;
        cr_assert_eq(kern_config_parse(im, cases[i].cfg, &cfg, &err), MT_OK, "%s", err.msg);
        st = kern_check_one(d, f, cases[i].shape, cases[i].m, &cfg, seed + i, &err);
        cr_expect_eq(st, MT_OK, "moe_route at %s, %s M=%lld, %s, seed %llu: %s",
                     arch ? arch : "native", cases[i].shape, (long long)cases[i].m, cases[i].cfg,
                     (unsigned long long)(seed + i), err.msg);
    }
    dev_close(d);
}

Test(moe_route_split, native) { check_level(NULL); }
Test(moe_route_split, x86_64_v3) { check_level("x86-64-v3"); }
Test(moe_route_split, x86_64) { check_level("x86-64"); }
