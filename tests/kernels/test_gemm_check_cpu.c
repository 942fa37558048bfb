/* test_gemm_check_cpu.c: the gemm family's cpu kernel against its C
 * reference at every SIMD width it has (AVX-512: 16 lanes, AVX2: 8,
 * SSE: 4), by capping the compile target at each x86-64 level (a level this
 * CPU lacks is skipped). The family's own cases (M in {1, 3, 17, 64}, N not
 * a multiple of any tile, K with a tail past the last whole vector) with
 * the default config, plus configs whose items hold 5 or 7 rows (a 4-row
 * register tile and single rows after it), K shorter than one vector, and
 * every K block. Fresh seeds, poisoned outputs (the runner's). */
#include "common/rng.h"
#include "cpu_arch_util.h"

static void check_level(const char *arch)
{
    dev_device *d = open_cpu_arch(arch);
    if (!d)
        return;
    const kern_family *f = kern_family_find("gemm");
    uint64_t seed = mt_seed_fresh();
    mt_err err = MT_ERR_INIT;
    for (int c = 0; c < f->n_cases; c++) {
        mt_status st = kern_check_one(d, f, f->cases[c].key, f->cases[c].m, NULL, seed + c, &err);
        cr_expect_eq(st, MT_OK, "gemm at %s, case %s M=%lld, default config, seed %llu: %s",
                     arch ? arch : "native", f->cases[c].key, (long long)f->cases[c].m,
                     (unsigned long long)(seed + c), err.msg);
    }
    static const cpu_arch_case extra[] = {
        {"N=100,K=72", 5, "BM=8,BN=8,KB=64"},     /* rows 4 + 1; K tail 8 (AVX-512) */
        {"N=100,K=72", 7, "BM=8,BN=64,KB=128"},   /* rows 4 + 3; one partial column item */
        {"N=40,K=200", 13, "BM=4,BN=16,KB=256"},  /* 3 row items of 4, one of 1 */
        {"N=24,K=8", 3, "BM=2,BN=8,KB=64"},       /* K under one vector: all tail */
        {"N=136,K=520", 9, "BM=8,BN=32,KB=64"},   /* 8 K blocks and a tail */
        {"N=24,K=37", 6, "BM=8,BN=16,KB=64"},     /* a tail at every width; rows 4 + 2 */
    };
    check_cases_at(d, arch, f, extra, (int)(sizeof extra / sizeof extra[0]), seed + 100);
    dev_close(d);
}

Test(gemm_check_cpu, native) { check_level(NULL); }
Test(gemm_check_cpu, x86_64_v4) { check_level("x86-64-v4"); }
Test(gemm_check_cpu, x86_64_v3) { check_level("x86-64-v3"); }
Test(gemm_check_cpu, x86_64_v2) { check_level("x86-64-v2"); }
Test(gemm_check_cpu, x86_64) { check_level("x86-64"); }
