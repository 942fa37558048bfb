/* test_attn_check.c: every attention family (mla_decode, mla_prefill,
 * dsa_indexer, rope) against its C reference on a device: the family's own
 * cases with the default config, then a random sample of valid configs on
 * one small case. Fresh seeds, printed on failure; outputs are poisoned by
 * the runner before every launch. This file runs the cpu backend; the same
 * file, built with ATTN_CHECK_EMU by test_attn_emu.c, runs the HIP sources
 * on emu (wave64 and wave32). hipRTC compiles are in test_attn_hiprtc.c.
 *
 * On cpu, ATTN_CHECK_ARCH (set by test_attn_check_cpu_v*.c) caps the code the
 * backend compiles at an x86-64 level, so the AVX2 and portable paths of the
 * cpu kernels run here too (skipped where the CPU lacks the level); and the
 * cpu kernels' own edge cases run with chosen configs: heads and latent
 * widths that are not whole vectors, keys that are not whole register
 * tiles or blocks, sparse lists with fewer visible keys than topk, several
 * pieces of the context, bf16 and fp8 caches. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>

#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"

#ifndef ATTN_CHECK_SUITE
#define ATTN_CHECK_SUITE attn_check
#endif

extern const kern_family fam_mla_decode, fam_mla_prefill, fam_dsa_indexer, fam_rope;

static dev_device *open_dev(const char *spec)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    dev_open_opts o = {.threads = 2};
#ifdef ATTN_CHECK_ARCH
    o.arch = ATTN_CHECK_ARCH;
#endif
    mt_status st = dev_open(spec, &o, &d, &err);
    if (st == MT_E_UNSUPPORTED && o.arch)
        cr_skip_test("%s --arch %s: %s", spec, o.arch, err.msg);
    cr_assert_eq(st, MT_OK, "dev_open %s: %s", spec, err.msg);
    dev_set_launch_timeout(d, 120000);
    return d;
}

/* The family's cases with the default config; then n_sampled configs of
 * case `sample_case` (drawn with the seed). */
static void check_family(const kern_family *f, const char *spec, int n_sampled,
                         int sample_case)
{
    dev_device *d = open_dev(spec);
    uint64_t seed = mt_seed_fresh();
    for (int i = 0; i < f->n_cases; i++) {
        mt_err err = MT_ERR_INIT;
        mt_status st = kern_check_one(d, f, f->cases[i].key, f->cases[i].m, NULL, seed + i, &err);
        cr_expect_eq(st, MT_OK, "%s on %s, case %s M=%" PRId64 ", seed %" PRIu64 ": %s",
                     f->name, spec, f->cases[i].key, f->cases[i].m, seed + i, err.msg);
    }
    const kern_case *c = &f->cases[sample_case];
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, c->key, &s, NULL, NULL), MT_OK);
    const kern_impl *im = kern_family_impl(f, dev_get_props(d)->backend);
    kern_config cfgs[16];
    int n = kern_space_sample(f, im, &s, c->m, dev_get_props(d), seed, false, cfgs,
                              n_sampled < 16 ? n_sampled : 16);
    cr_expect_gt(n, 0, "%s: no valid config sampled on %s", f->name, spec);
    for (int i = 0; i < n; i++) {
        mt_err err = MT_ERR_INIT;
        char key[256];
        kern_config_key(im, &cfgs[i], key, sizeof key);
        mt_status st = kern_check_one(d, f, c->key, c->m, &cfgs[i], seed + 100 + i, &err);
        cr_expect_eq(st, MT_OK, "%s on %s, case %s M=%" PRId64 ", config %s, seed %" PRIu64
                     ": %s", f->name, spec, c->key, c->m, key, seed + 100 + i, err.msg);
    }
    dev_close(d);
}

#ifndef ATTN_CHECK_EMU
/* A shape, M and a config (NULL: the default) for the cpu kernels. */
typedef struct cpu_case {
    const char *shape;
    int64_t m;
    const char *config;
} cpu_case;

static void check_cpu_cases(const kern_family *f, const cpu_case *cases, int n)
{
    dev_device *d = open_dev("cpu");
    const kern_impl *im = kern_family_impl(f, dev_get_props(d)->backend);
    uint64_t seed = mt_seed_fresh();
    for (int i = 0; i < n; i++) {
        mt_err err = MT_ERR_INIT;
        kern_config cfg;
        if (cases[i].config)
            cr_assert_eq(kern_config_parse(im, cases[i].config, &cfg, &err), MT_OK, "%s: %s",
                         cases[i].config, err.msg);
        mt_status st = kern_check_one(d, f, cases[i].shape, cases[i].m,
                                      cases[i].config ? &cfg : NULL, seed + i, &err);
        cr_expect_eq(st, MT_OK, "%s on cpu (%s), case %s M=%" PRId64 ", config %s, seed %"
                     PRIu64 ": %s", f->name, dev_get_props(d)->arch, cases[i].shape,
                     cases[i].m, cases[i].config ? cases[i].config : "default", seed + i,
                     err.msg);
    }
    dev_close(d);
}

/* Register tiles: AVX-512 6 keys x 4 head vectors (scores), 8 heads x 3
 * latent vectors (P*V); AVX2 5 x 2 and 4 x 2; else 4 x 2 and 4 x 2. */
static const cpu_case decode_cases[] = {
    /* 64 heads, sparse: 61 visible of topk 100 over 4 pieces, blocks of 16 */
    {"H=64,L=512,R=64,D=192,topk=100,ps=64,kv=bf16,sparse=1,C=61", 2,
     "HB=64,BN=16,WAVES=1,NSPLIT=4"},
    {"H=64,L=512,R=64,D=192,topk=96,ps=16,kv=fp8,sparse=1,C=333", 1,
     "HB=32,BN=64,WAVES=1,NSPLIT=2"},
    /* dense, keys not a multiple of the block or of the tile */
    {"H=64,L=512,R=64,D=192,topk=8,ps=64,kv=bf16,sparse=0,C=203", 1,
     "HB=64,BN=32,WAVES=1,NSPLIT=1"},
    {"H=16,L=512,R=64,D=192,topk=8,ps=7,kv=fp8,sparse=0,C=97", 3,
     "HB=8,BN=8,WAVES=1,NSPLIT=8"},
    /* heads and latent widths that are not whole vectors */
    {"H=6,L=40,R=8,D=24,topk=24,ps=3,kv=bf16,sparse=1,C=77", 2, "HB=2,BN=16,WAVES=1,NSPLIT=2"},
    {"H=12,L=20,R=12,D=24,topk=24,ps=5,kv=fp8,sparse=0,C=41", 1, "HB=4,BN=64,WAVES=1,NSPLIT=1"},
    {"H=48,L=72,R=0,D=24,topk=24,ps=5,kv=bf16,sparse=0,C=50", 1, "HB=16,BN=8,WAVES=1,NSPLIT=4"},
    /* pieces with no visible key (more pieces than keys) */
    {"H=8,L=64,R=16,D=48,topk=40,ps=16,kv=bf16,sparse=1,C=5", 2, "HB=8,BN=8,WAVES=1,NSPLIT=16"},
    {"H=64,L=512,R=64,D=192,topk=2048,ps=64,kv=bf16,sparse=1,C=3000", 1, NULL},
};

/* Register tiles: AVX-512 12 keys x 2 head vectors, AVX2 5 x 2, else 4 x 2. */
static const cpu_case index_cases[] = {
    /* glm5.2 widths, keys not a multiple of the block or of the tile */
    {"IH=32,ID=128,topk=100,ps=64,kv=bf16,C=1001", 2, "BT=256,QB=2,WAVES=1,TK_WAVES=1"},
    {"IH=32,ID=128,topk=64,ps=16,kv=fp8,C=517", 3, "BT=64,QB=4,WAVES=1,TK_WAVES=1"},
    {"IH=32,ID=128,topk=2048,ps=64,kv=bf16,C=2100", 1, NULL},
    /* fewer keys than topk */
    {"IH=32,ID=128,topk=256,ps=64,kv=fp8,C=200", 2, "BT=16,QB=1,WAVES=1,TK_WAVES=1"},
    /* heads that are not whole vectors, more head vectors than the tile */
    {"IH=3,ID=24,topk=20,ps=7,kv=bf16,C=131", 5, "BT=16,QB=2,WAVES=1,TK_WAVES=1"},
    {"IH=40,ID=36,topk=30,ps=5,kv=fp8,C=301", 2, "BT=64,QB=8,WAVES=1,TK_WAVES=1"},
    {"IH=72,ID=8,topk=9,ps=3,kv=bf16,C=97", 3, "BT=1024,QB=1,WAVES=1,TK_WAVES=1"},
};

/* Register tiles: AVX-512 expansion 6 tokens x 4 row vectors, scores 8
 * queries x 2 key vectors, P*V 8 x 3 value vectors; AVX2 4 x 3, 4 x 2,
 * 4 x 3; else 4 x 2 throughout. */
static const cpu_case prefill_cases[] = {
    /* glm5.2 widths: queries not a multiple of BM or of the tile, a
     * context not a multiple of BN */
    {"H=2,L=512,R=64,D=192,V=256,ps=64,kv=bf16,P=37", 29, "BM=16,BN=32,ET=16"},
    {"H=2,L=512,R=64,D=192,V=256,ps=64,kv=fp8,P=100", 70, NULL},
    /* no prefix; rows, values and dims that are not whole vectors */
    {"H=3,L=64,R=16,D=48,V=40,ps=7,kv=fp8,P=0", 13, "BM=8,BN=16,ET=4"},
    {"H=2,L=20,R=8,D=12,V=20,ps=3,kv=bf16,P=5", 3, "BM=4,BN=16,ET=64"},
    /* no rope dims; one block of queries over several key tiles */
    {"H=2,L=24,R=0,D=16,V=24,ps=5,kv=bf16,P=170", 7, "BM=64,BN=128,ET=16"},
};

/* Sampled configs per run (fresh each run, so CI covers the space over
 * runs; the tuner verifies every config it times anyway). The capped
 * variants (ATTN_CHECK_ARCH) sample fewer: the chosen cases above reach
 * every vector path's edges, and each sampled config is a host compile
 * per case (CI time). */
#ifdef ATTN_CHECK_ARCH
#define CPU_SAMPLES 2
#else
#define CPU_SAMPLES 5
#endif

Test(ATTN_CHECK_SUITE, mla_decode_cpu, .timeout = 600)
{
    check_family(&fam_mla_decode, "cpu", CPU_SAMPLES, 5);
    check_cpu_cases(&fam_mla_decode, decode_cases, sizeof decode_cases / sizeof *decode_cases);
}

Test(ATTN_CHECK_SUITE, dsa_indexer_cpu, .timeout = 600)
{
    check_family(&fam_dsa_indexer, "cpu", CPU_SAMPLES, 4);
    check_cpu_cases(&fam_dsa_indexer, index_cases, sizeof index_cases / sizeof *index_cases);
}

/* The capped variants run only the chosen cases (they reach every vector
 * path's edges; CI time). */
Test(ATTN_CHECK_SUITE, mla_prefill_cpu, .timeout = 600)
{
#ifndef ATTN_CHECK_ARCH
    check_family(&fam_mla_prefill, "cpu", CPU_SAMPLES, 3);
#endif
    check_cpu_cases(&fam_mla_prefill, prefill_cases,
                    sizeof prefill_cases / sizeof *prefill_cases);
}

#ifndef ATTN_CHECK_ARCH
Test(attn_check, rope_cpu) { check_family(&fam_rope, "cpu", 4, 4); }
#endif
#else
Test(attn_check, mla_decode_emu_wave64) { check_family(&fam_mla_decode, "emu", 3, 5); }
Test(attn_check, mla_decode_emu_wave32) { check_family(&fam_mla_decode, "emu:wave32", 3, 3); }
Test(attn_check, mla_prefill_emu_wave64) { check_family(&fam_mla_prefill, "emu", 3, 3); }
Test(attn_check, mla_prefill_emu_wave32) { check_family(&fam_mla_prefill, "emu:wave32", 3, 3); }
Test(attn_check, dsa_indexer_emu_wave64) { check_family(&fam_dsa_indexer, "emu", 3, 4); }
Test(attn_check, dsa_indexer_emu_wave32) { check_family(&fam_dsa_indexer, "emu:wave32", 3, 4); }
Test(attn_check, rope_emu_wave64) { check_family(&fam_rope, "emu", 3, 4); }
Test(attn_check, rope_emu_wave32) { check_family(&fam_rope, "emu:wave32", 3, 4); }
#endif
