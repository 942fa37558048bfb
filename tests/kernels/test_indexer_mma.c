/* test_indexer_mma.c: dsa_indexer's matrix-instruction score path (MMA=1|2):
 * explicit configs against the family's C reference on emu wave64 (AMD
 * layouts, both shapes) and wave32 (NVIDIA's 16x8x16), bf16 and fp8 caches,
 * contexts that are not a multiple of BT, fewer keys than topk, heads and
 * dims that are not whole fragments (padded), several queries per call
 * sharing page-table rows, on fresh seeds; the validity rules (no such
 * instruction, fragment columns per wave, query registers, static shared
 * memory, each naming the parameter); and, without a GPU, that hipRTC
 * (gfx90a) and clang-19 (gfx942) build the GLM-5.2 tiles with v_mfma and no
 * scratch and NVRTC (sm_90) builds them (each skipped when its compiler is
 * absent). The compile tests log the instruction mix that docs/BENCHMARKS.md
 * quotes. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <inttypes.h>
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

static const kern_family *fam(void)
{
    const kern_family *f = kern_family_find("dsa_indexer");
    cr_assert_not_null(f);
    return f;
}

/* Small (emu is slow). GLM-5.2 widths: 203 keys over pages of 7 (not a
 * multiple of any BT), three queries of which two share a page row and see
 * different lengths; fewer keys than topk (fp8); then heads and dims that
 * are not whole fragments: 3 x 24, 20 x 36, and 2 x 30 (not whole 4-value
 * loads). The family's fill repeats a third of the keys, so the top-k's tie
 * rule decides. */
static const mma_case cases[] = {
    {"IH=32,ID=128,topk=40,ps=7,kv=bf16,C=203", 3},
    {"IH=32,ID=128,topk=256,ps=64,kv=fp8,C=100", 2},
    {"IH=32,ID=128,topk=64,ps=16,kv=fp8,C=150", 1},
    {"IH=3,ID=24,topk=20,ps=7,kv=bf16,C=131", 5},
    {"IH=20,ID=36,topk=30,ps=5,kv=fp8,C=77", 2},
    {"IH=2,ID=30,topk=10,ps=3,kv=fp8,C=50", 2},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static const char *const wave64_cfgs[] = {
    "BT=16,QB=1,WAVES=1,TK_WAVES=1,MMA=1",
    "BT=64,QB=2,WAVES=2,TK_WAVES=2,MMA=1",
    "BT=32,QB=4,WAVES=1,TK_WAVES=4,MMA=2",
    "BT=128,QB=2,WAVES=4,TK_WAVES=1,MMA=2",
};
static const char *const wave32_cfgs[] = {
    "BT=16,QB=1,WAVES=2,TK_WAVES=1,MMA=1",
    "BT=64,QB=4,WAVES=4,TK_WAVES=2,MMA=1",
    "BT=32,QB=2,WAVES=1,TK_WAVES=8,MMA=1",
};

Test(indexer_mma, dsa_indexer_matches_the_reference_on_wave64, .timeout = 900)
{
    mma_check_on(fam(), "emu:wave64", wave64_cfgs, 4, cases, NCASES);
}

Test(indexer_mma, dsa_indexer_matches_the_reference_on_wave32, .timeout = 900)
{
    mma_check_on(fam(), "emu:wave32", wave32_cfgs, 3, cases, NCASES);
}

/* ---- validity ------------------------------------------------------------ */

static bool valid_on(const char *shape, const char *cfg, const dev_props *p, char *why,
                     size_t cap)
{
    const kern_family *f = fam();
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, shape, &s, NULL, NULL), MT_OK);
    kern_config c;
    mma_parse(fam(), cfg, &c);
    why[0] = 0;
    return kern_config_valid(f, f->gpu, &s, 1, &c, p, why, cap);
}

static void expect_refused(const char *shape, const char *cfg, const dev_props *p,
                           const char *names)
{
    char why[256];
    cr_expect_not(valid_on(shape, cfg, p, why, sizeof why), "%s on %s is valid", cfg,
                  p->arch);
    cr_expect(strstr(why, names) != NULL, "%s: reason '%s' does not name %s", cfg, why, names);
}

Test(indexer_mma, validity_names_the_parameter_at_fault)
{
    dev_props emu32 = {.backend = DEV_BACKEND_EMU, .warp_size = 32, .arch = "emu",
                       .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                       .static_shared_per_block = 65536};
    dev_props emu64 = emu32;
    emu64.warp_size = 64;
    dev_props gfx1030 = {.backend = DEV_BACKEND_HIP, .warp_size = 32, .arch = "gfx1030",
                         .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                         .static_shared_per_block = 65536};
    dev_props sm75 = {.backend = DEV_BACKEND_CUDA, .warp_size = 32, .arch = "sm_75",
                      .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                      .static_shared_per_block = 49152};
    dev_props h200 = sm75;
    snprintf(h200.arch, sizeof h200.arch, "sm_90");
    h200.shared_mem_per_block = 232448;
    dev_props mi300 = {.backend = DEV_BACKEND_HIP, .warp_size = 64, .arch = "gfx942",
                       .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                       .static_shared_per_block = 65536};
    const char *glm = "glm5.2", *fp8 = "glm5.2-fp8";
    const char *ok16 = "BT=64,QB=4,WAVES=4,TK_WAVES=4,MMA=1";
    const char *ok32 = "BT=128,QB=4,WAVES=4,TK_WAVES=4,MMA=2";
    char why[256];
    cr_expect(valid_on(glm, ok16, &mi300, why, sizeof why), "%s", why);
    cr_expect(valid_on(fp8, ok32, &mi300, why, sizeof why), "%s", why);
    cr_expect(valid_on(glm, ok32, &emu64, why, sizeof why), "%s", why);
    cr_expect(valid_on(glm, ok16, &h200, why, sizeof why), "%s", why);
    cr_expect(valid_on(fp8, ok16, &emu32, why, sizeof why), "%s", why);
    /* no such instruction: 32x32x8 on wave32, no MFMA on RDNA, no bf16 mma on Turing */
    expect_refused(glm, ok32, &emu32, "MMA=2");
    expect_refused(glm, ok32, &h200, "MMA=2");
    expect_refused(glm, ok16, &gfx1030, "MMA=1");
    expect_refused(glm, ok16, &sm75, "MMA=1");
    /* fragment columns: 16 keys under a 32-wide fragment; one 16-key column
     * for two waves */
    expect_refused(glm, "BT=16,QB=1,WAVES=1,TK_WAVES=4,MMA=2", &mi300, "BT=16");
    expect_refused(glm, "BT=16,QB=1,WAVES=2,TK_WAVES=4,MMA=1", &mi300, "WAVES=2");
    /* the query in registers: 256 heads x 128 dims is 256 per lane */
    expect_refused("IH=256,ID=128,topk=2048,ps=64,kv=bf16,C=8192", ok16, &mi300, "registers");
    /* static shared memory: (128 + 16) x 264 x 2 = 76,032 bytes; 64 keys fit
     * the 48 KB static limit of an H200 */
    const char *wide = "IH=16,ID=256,topk=2048,ps=64,kv=bf16,C=8192";
    expect_refused(wide, "BT=128,QB=1,WAVES=4,TK_WAVES=4,MMA=1", &h200, "static shared");
    cr_expect(valid_on(wide, "BT=64,QB=1,WAVES=4,TK_WAVES=4,MMA=1", &h200, why, sizeof why),
              "%s", why);
    /* the scalar path's space is what it was */
    cr_expect(valid_on(glm, "BT=64,QB=4,WAVES=2,TK_WAVES=4,MMA=0", &gfx1030, why, sizeof why),
              "%s", why);
    expect_refused(glm, "BT=128,QB=4,WAVES=1,TK_WAVES=4,MMA=0", &gfx1030, "BT=128");
}

/* ---- compile-only: instruction mix -------------------------------------- */

/* dsa_indexer at shape with cfg for arch: test_mma_util.h's checks on
 * dsa_scores. */
static void compile_amd(const char *arch, const char *shape, const char *cfg_text,
                        const char *mfma)
{
    mma_compile_amd(fam(), "dsa_scores", arch, shape, 1, cfg_text, mfma);
}

/* The GLM-5.2 tiles docs/BENCHMARKS.md discusses: 4 waves, one fragment
 * column of keys each per pass. */
#define AMD16 "BT=64,QB=4,WAVES=4,TK_WAVES=4,MMA=1"
#define AMD32 "BT=128,QB=4,WAVES=4,TK_WAVES=4,MMA=2"

Test(indexer_mma, hiprtc_gfx90a_builds_mfma_without_scratch)
{
    compile_amd("gfx90a", "glm5.2", AMD16, "v_mfma_f32_16x16x16bf16_1k");
    compile_amd("gfx90a", "glm5.2-fp8", AMD16, "v_mfma_f32_16x16x16bf16_1k");
    compile_amd("gfx90a", "glm5.2", AMD32, "v_mfma_f32_32x32x8bf16_1k");
    compile_amd("gfx90a", "glm5.2-fp8", AMD32, "v_mfma_f32_32x32x8bf16_1k");
}

/* CDNA3 spells the same instructions without the _1k. */
Test(indexer_mma, clang_gfx942_builds_mfma_without_scratch)
{
    compile_amd("gfx942", "glm5.2", AMD16, "v_mfma_f32_16x16x16_bf16");
    compile_amd("gfx942", "glm5.2-fp8", AMD16, "v_mfma_f32_16x16x16_bf16");
    compile_amd("gfx942", "glm5.2", AMD32, "v_mfma_f32_32x32x8_bf16");
}

/* NVRTC's cubin has no disassembler here: the kernel cannot compile
 * without mma.sync (the source #errors without MT_MMA_HAVE). */
static void compile_nv(const char *shape, const char *cfg_text)
{
    const kern_family *f = fam();
    dev_device *d = mma_open_or_skip("cuda", "sm_90");
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, shape, &s, NULL, NULL), MT_OK);
    kern_config c;
    mma_parse(fam(), cfg_text, &c);
    char why[256] = "";
    cr_assert(kern_config_valid(f, f->gpu, &s, 4, &c, dev_get_props(d), why, sizeof why),
              "sm_90 %s: %s", cfg_text, why);
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *r = td_find_res(code, "dsa_scores");
    cr_log_info("sm_90 dsa_scores %s %s: %d registers, %lld bytes shared, %lld bytes local",
                shape, cfg_text, r->vgprs, (long long)r->lds_bytes,
                (long long)r->private_bytes);
    dev_code_free(code);
    dev_close(d);
}

Test(indexer_mma, nvrtc_sm90_builds)
{
    compile_nv("glm5.2", "BT=64,QB=4,WAVES=4,TK_WAVES=4,MMA=1");
    compile_nv("glm5.2-fp8", "BT=128,QB=4,WAVES=4,TK_WAVES=4,MMA=1");
}
