/* test_moe_route_split.c: the cpu router's split path (ES > 0: the gate's
 * experts scored over many work items into scratch, then a selection
 * launch) against the family's reference, at every SIMD width the kernel
 * has (AVX-512, AVX2, scalar: the compile target capped per x86-64 level; a
 * level this CPU lacks is skipped). The defaults pick it only for few
 * tokens on many experts relative to the threads, so these configs are set
 * explicitly: expert counts that ES does not divide, token counts that TB
 * does not divide, grouped top-k. Fresh seeds, poisoned outputs. */
#include "common/rng.h"
#include "cpu_arch_util.h"

static void check_level(const char *arch)
{
    dev_device *d = open_cpu_arch(arch);
    if (!d)
        return;
    static const cpu_arch_case cases[] = {
        {"H=256,E=64,topk=8,ngroup=8,topkg=4,rsf=2500,norm=1", 1, "TB=1,EB=8,ES=16"},
        {"H=256,E=64,topk=8,ngroup=8,topkg=4,rsf=2500,norm=1", 3, "TB=2,EB=16,ES=64"},
        {"H=200,E=12,topk=2,ngroup=1,topkg=1,rsf=1000,norm=1", 9, "TB=4,EB=4,ES=16"},
        {"H=200,E=40,topk=3,ngroup=1,topkg=1,rsf=1000,norm=0", 5, "TB=1,EB=16,ES=16"},
        {"tiny-groups", 17, "TB=8,EB=8,ES=16"},
    };
    check_cases_at(d, arch, kern_family_find("moe_route"), cases,
                   (int)(sizeof cases / sizeof cases[0]), mt_seed_fresh());
    dev_close(d);
}

Test(moe_route_split, native) { check_level(NULL); }
Test(moe_route_split, x86_64_v3) { check_level("x86-64-v3"); }
Test(moe_route_split, x86_64) { check_level("x86-64"); }
