/* test_moe_gemv.c: the decode path of the MoE expert GEMMs (GEMV = R > 0
 * of moe_gemm_up and moe_gemm_down): explicit configs against the plain C
 * reference on emu wave64 and wave32, a16w4 and a4w4, cat=0/1 and
 * comb=0/1, at sizes that fill no tile (H 384, I 256, M 1, 5, 13),
 * experts with no pairs (skew=2), one expert with every token (skew=1:
 * several passes of R pairs), split K over blocks and lanes, fresh seeds;
 * validity naming the parameter at fault; the default choosing the path
 * only for few pairs per expert; determinism (no atomics); and, without a
 * GPU, GLM-5.2 M=1 defaults built for gfx90a (hipRTC, stage 2) and gfx942
 * (clang-19, stage 1) without scratch or spills and with 16-byte global
 * loads, and for sm_90 (NVRTC, stage 1) without local memory and with
 * ld.global.nc.v4 (each skipped when its compiler is absent). */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rng.h"
#include "device/device.h"
#include "kernels/core/exec.h"
#include "kernels/core/family.h"
#include "kernels/moe/moe_common.h"
#include "kernels/core/runner.h"
#include "test_mma_util.h"
#include "test_tmp.h"

static const kern_family *fam(const char *name)
{
    const kern_family *f = kern_family_find(name);
    cr_assert_not_null(f, "family %s", name);
    return f;
}

static void parse(const kern_family *f, const char *text, kern_config *c)
{
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_config_parse(f->gpu, text, c, &err), MT_OK, "%s", err.msg);
}

typedef struct gcase {
    const char *cfg, *shape;
    int64_t m;
} gcase;

/* Runs every case on spec (each config must be valid there). */
static void check_on(const char *spec, const char *fname, const gcase *cases, int n)
{
    const kern_family *f = fam(fname);
    dev_device *d = td_open(spec, NULL);
    uint64_t seed = mt_seed_fresh();
    for (int i = 0; i < n; i++) {
        kern_config c;
        parse(f, cases[i].cfg, &c);
        kern_shape s;
        cr_assert_eq(kern_shape_parse(f, cases[i].shape, &s, NULL, NULL), MT_OK);
        char why[256] = "";
        cr_assert(kern_config_valid(f, f->gpu, &s, cases[i].m, &c, dev_get_props(d), why,
                                    sizeof why),
                  "%s %s %s: %s", spec, fname, cases[i].cfg, why);
        uint64_t sd = seed + (uint64_t)i;
        mt_err err = MT_ERR_INIT;
        mt_status st = kern_check_one(d, f, cases[i].shape, cases[i].m, &c, sd, &err);
        cr_expect_eq(st, MT_OK, "%s %s %s, %s M=%" PRId64 " (seed %" PRIu64 "): %s", spec, fname,
                     cases[i].cfg, cases[i].shape, cases[i].m, sd, err.msg);
    }
    dev_close(d);
}

#define G_FIX "BM=16,BK=32,STAGES=1,GROUP_M=1,VEC=1,MMA=0,"

/* Few cases (each config is one emu compile): R 1, 2, 4; split K over 1,
 * 2, 4 blocks; more row slots than BN rows (H 256 on wave64: 8 lanes per
 * row, 8 rows per wave); skew=1 gives expert E-1 every token (13 pairs:
 * passes of R with a partial last one); skew=2 leaves experts empty. */
#define DOWN_SPLIT G_FIX "BN=16,WAVES=2,SPLITK=4,UNROLL=1,GEMV=4"
#define DOWN_SPLIT_SHAPE "H=256,I=512,E=16,topk=4,a=mxfp4,comb=0,bm=32,skew=1"
static const gcase up64[] = {
    {G_FIX "BN=16,WAVES=4,SPLITK=1,UNROLL=1,GEMV=1", "H=384,I=256,E=16,topk=4,a=mxfp4,cat=1,bm=16,skew=2", 5},
    {G_FIX "BN=32,WAVES=2,SPLITK=4,UNROLL=2,GEMV=2", "H=512,I=128,E=8,topk=2,a=bf16,cat=0,bm=64,skew=1", 13},
};
static const gcase up32[] = {
    {G_FIX "BN=32,WAVES=4,SPLITK=2,UNROLL=1,GEMV=4", "H=256,I=128,E=8,topk=2,a=mxfp4,cat=1,bm=64,skew=1", 13},
};
/* Stage 2: comb=0 (partials, then y in pair order) and comb=1 (rows, here
 * split; the families' own cases run it unsplit by default). */
static const gcase down64[] = {
    {G_FIX "BN=16,WAVES=4,SPLITK=1,UNROLL=4,GEMV=1", "H=384,I=256,E=16,topk=4,a=mxfp4,comb=0,bm=16,skew=2", 5},
    {DOWN_SPLIT, DOWN_SPLIT_SHAPE, 13},
};
static const gcase down32[] = {
    {G_FIX "BN=32,WAVES=4,SPLITK=2,UNROLL=2,GEMV=2", "H=256,I=128,E=8,topk=2,a=bf16,comb=1,bm=64,skew=1", 13},
};

Test(moe_gemv, up_matches_the_reference_on_wave64, .timeout = 600)
{
    check_on("emu:wave64", "moe_gemm_up", up64, 2);
}

Test(moe_gemv, up_matches_the_reference_on_wave32, .timeout = 600)
{
    check_on("emu:wave32", "moe_gemm_up", up32, 1);
}

Test(moe_gemv, down_matches_the_reference_on_wave64, .timeout = 600)
{
    check_on("emu:wave64", "moe_gemm_down", down64, 2);
}

Test(moe_gemv, down_matches_the_reference_on_wave32, .timeout = 600)
{
    check_on("emu:wave32", "moe_gemm_down", down32, 1);
}

/* ---- validity, defaults, order ------------------------------------------- */

static dev_props props(dev_backend b, const char *arch, int ws)
{
    dev_props p = {.backend = b, .warp_size = ws, .max_threads_per_block = 1024,
                   .shared_mem_per_block = 65536, .static_shared_per_block = 49152};
    snprintf(p.arch, sizeof p.arch, "%s", arch);
    return p;
}

static bool valid_on(const char *fname, const char *shape, const char *cfg, const dev_props *p,
                     char *why, size_t cap)
{
    const kern_family *f = fam(fname);
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, shape, &s, NULL, NULL), MT_OK);
    kern_config c;
    parse(f, cfg, &c);
    why[0] = 0;
    return kern_config_valid(f, f->gpu, &s, 1, &c, p, why, cap);
}

static void expect_refused(const char *fname, const char *shape, const char *cfg,
                           const dev_props *p, const char *names)
{
    char why[256];
    cr_expect_not(valid_on(fname, shape, cfg, p, why, sizeof why), "%s %s is valid", fname, cfg);
    cr_expect(strstr(why, names) != NULL, "%s %s: reason '%s' does not name %s", fname, cfg,
              why, names);
}

Test(moe_gemv, validity_names_the_parameter_at_fault)
{
    dev_props mi300 = props(DEV_BACKEND_HIP, "gfx942", 64), h200 = props(DEV_BACKEND_CUDA, "sm_90", 32);
    char why[256];
    const char *ok = G_FIX "BN=16,WAVES=4,SPLITK=1,UNROLL=1,GEMV=1";
    cr_expect(valid_on("moe_gemm_up", "glm5.2", ok, &mi300, why, sizeof why), "%s", why);
    /* comb=1 may split K here: partials, not atomics */
    cr_expect(valid_on("moe_gemm_down", "glm5.2-rows",
                       G_FIX "BN=16,WAVES=4,SPLITK=2,UNROLL=4,GEMV=1", &mi300, why, sizeof why),
              "%s", why);
    /* the tile-only parameters sit at their first values */
    expect_refused("moe_gemm_up", "glm5.2",
                   "BM=32,BK=32,STAGES=1,GROUP_M=1,VEC=1,MMA=0,BN=16,WAVES=4,SPLITK=1,UNROLL=1,GEMV=1",
                   &mi300, "BM=32");
    expect_refused("moe_gemm_down", "glm5.2",
                   "BM=16,BK=32,STAGES=1,GROUP_M=1,VEC=1,MMA=1,BN=16,WAVES=4,SPLITK=1,UNROLL=4,GEMV=1",
                   &mi300, "MMA=1");
    /* registers: 6144 / 32 lanes = 6 blocks per lane on NVIDIA, 3 on AMD */
    expect_refused("moe_gemm_up", "glm5.2", ok, &h200, "GEMV=1");
    expect_refused("moe_gemm_up", "glm5.2", G_FIX "BN=16,WAVES=4,SPLITK=1,UNROLL=1,GEMV=2",
                   &mi300, "registers");
    expect_refused("moe_gemm_up", "glm5.2", G_FIX "BN=16,WAVES=4,SPLITK=1,UNROLL=1,GEMV=1",
                   &(dev_props){.backend = DEV_BACKEND_HIP, .warp_size = 64,
                                .max_threads_per_block = 128, .arch = "gfx942",
                                .static_shared_per_block = 65536},
                   "WAVES=4");
}

/* GEMV at decode (pairs per expert about 2 or fewer), tiles above; every
 * default valid. */
Test(moe_gemv, default_takes_the_decode_path_for_few_pairs_per_expert)
{
    const dev_props ps[] = {props(DEV_BACKEND_HIP, "gfx942", 64), props(DEV_BACKEND_HIP, "gfx90a", 64),
                            props(DEV_BACKEND_CUDA, "sm_90", 32), props(DEV_BACKEND_EMU, "emu", 32)};
    const struct {
        const char *fname, *shape;
        int64_t m;
        bool gemv;
    } want[] = {
        {"moe_gemm_up", "glm5.2", 1, true},       {"moe_gemm_up", "glm5.2-a16", 16, true},
        {"moe_gemm_down", "glm5.2", 1, true},     {"moe_gemm_down", "glm5.2-rows", 8, true},
        {"moe_gemm_up", "glm5.2", 256, false},    {"moe_gemm_down", "glm5.2", 4096, false},
        {"moe_gemm_up", "tiny", 64, false},
    };
    for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++)
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            const kern_family *f = fam(want[i].fname);
            kern_shape s;
            cr_assert_eq(kern_shape_parse(f, want[i].shape, &s, NULL, NULL), MT_OK);
            kern_config c;
            memset(&c, 0, sizeof c);
            f->gpu->default_config(&s, want[i].m, &ps[pi], &c);
            char key[256], why[256] = "";
            kern_config_key(f->gpu, &c, key, sizeof key);
            cr_expect(kern_config_valid(f, f->gpu, &s, want[i].m, &c, &ps[pi], why, sizeof why),
                      "%s %s M=%lld on %s: default %s invalid: %s", want[i].fname, want[i].shape,
                      (long long)want[i].m, ps[pi].arch, key, why);
            cr_expect_eq(kern_config_get(f->gpu, &c, "GEMV", 0) > 0, want[i].gemv,
                         "%s %s M=%lld on %s: default %s", want[i].fname, want[i].shape,
                         (long long)want[i].m, ps[pi].arch, key);
            if (want[i].gemv && !strcmp(want[i].fname, "moe_gemm_down"))
                cr_expect_not(f->gpu->order_varies(&s, &c, why, sizeof why), "%s", key);
        }
}

/* comb=0 with topk 4 and split K: the decode path's y is the same bits
 * from run to run (its sums have a fixed order), where the tile path's
 * atomics may differ. Two runs of one problem on emu wave64 (the config
 * and shape of a case above: its compile is cached). */
Test(moe_gemv, down_sums_in_a_fixed_order, .timeout = 300)
{
    const kern_family *f = fam("moe_gemm_down");
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, DOWN_SPLIT_SHAPE, &s, NULL, NULL), MT_OK);
    kern_config c;
    parse(f, DOWN_SPLIT, &c);
    char why[256];
    cr_assert_not(f->gpu->order_varies(&s, &c, why, sizeof why));
    dev_device *d = td_open("emu:wave64", NULL);
    uint64_t seed = mt_seed_fresh();
    kern_problem *pr = NULL;
    kern_exec *e = NULL;
    mt_err err = MT_ERR_INIT;
    const int64_t m = 13;
    cr_assert_eq(kern_problem_create(d, f, &s, m, seed, &pr, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(kern_exec_open(d, f, &s, m, &c, &e, &err), MT_OK, "%s", err.msg);
    const int out = kern_problem_n_bufs(pr) - 1; /* y, in-out */
    size_t bytes = kern_problem_buf(pr, out)->bytes;
    float *y[2] = {malloc(bytes), malloc(bytes)};
    cr_assert(y[0] && y[1]);
    for (int run = 0; run < 2; run++) {
        cr_assert_eq(kern_problem_run(pr, e, &err), MT_OK, "seed %" PRIu64 ": %s", seed, err.msg);
        cr_assert_eq(kern_problem_download(pr, out, y[run], &err), MT_OK, "%s", err.msg);
    }
    cr_expect_eq(kern_problem_verify(pr, &err), MT_OK, "seed %" PRIu64 ": %s", seed, err.msg);
    cr_expect_eq(memcmp(y[0], y[1], bytes), 0, "seed %" PRIu64 ": y differs between runs", seed);
    free(y[0]);
    free(y[1]);
    kern_exec_close(e);
    kern_problem_destroy(pr);
    dev_close(d);
}

/* ---- compile-only: the GLM-5.2 M=1 defaults ------------------------------ */

/* Disassembles code with llvm-objdump and counts lines containing what;
 * -1 when no llvm-objdump is installed. */
static int count_in_disassembly(const void *code, size_t len, const char *arch, const char *what)
{
    const char *tools[] = {"llvm-objdump-19", "llvm-objdump"};
    const char *tool = NULL;
    char cmd[1024];
    for (int i = 0; i < 2 && !tool; i++) {
        snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", tools[i]);
        if (system(cmd) == 0)
            tool = tools[i];
    }
    if (!tool)
        return -1;
    char path[512];
    int fd = tmp_file_make(path, sizeof path, "mt_gemv_co");
    cr_assert_eq(write(fd, code, len), (ssize_t)len);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s -d --mcpu=%s '%s'", tool, arch, path);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, p))
        n += strstr(line, what) != NULL;
    pclose(p);
    unlink(path);
    return n;
}

/* The default at GLM-5.2, M=1, for arch: the decode path, no scratch, no
 * spills, 16-byte global loads, and matrix instructions exactly where it
 * takes the fp8 path (MMA=3: a4w4 on CDNA3), none on the bf16 decode. */
static void amd_default(const char *arch, const char *fname, const char *shape, int mma)
{
    const kern_family *f = fam(fname);
    dev_device *d = mma_open_or_skip("hip", arch);
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, shape, &s, NULL, NULL), MT_OK);
    kern_config c;
    memset(&c, 0, sizeof c);
    f->gpu->default_config(&s, 1, dev_get_props(d), &c);
    char key[256];
    kern_config_key(f->gpu, &c, key, sizeof key);
    cr_assert_gt(kern_config_get(f->gpu, &c, "GEMV", 0), 0, "%s %s: default %s", arch, fname,
                 key);
    cr_assert_eq(kern_config_get(f->gpu, &c, "MMA", -1), mma, "%s %s: default %s", arch, fname,
                 key);
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *r = td_find_res(code, fname);
    cr_expect_eq(r->private_bytes, 0, "%s %s %s: %lld bytes of scratch", arch, fname, key,
                 (long long)r->private_bytes);
    cr_expect_eq(r->spill_vgprs, 0, "%s %s %s: %d VGPRs spilled", arch, fname, key,
                 r->spill_vgprs);
    size_t len = 0;
    const void *bytes = dev_code_get_bytes(code, &len);
    int x4 = count_in_disassembly(bytes, len, arch, "global_load_dwordx4");
    if (x4 >= 0) {
        cr_expect_gt(x4, 0, "%s %s %s: no global_load_dwordx4", arch, fname, key);
        if (mma == 3)
            cr_expect_gt(count_in_disassembly(bytes, len, arch, "v_mfma_f32_16x16x32_fp8"), 0);
        else
            cr_expect_eq(count_in_disassembly(bytes, len, arch, "v_mfma"), 0);
    }
    cr_log_info("%s %s %s M=1 %s: VGPR %d AGPR %d waves/SIMD %d, %d global_load_dwordx4",
                arch, fname, shape, key, r->vgprs, r->agprs, r->waves_per_simd, x4);
    dev_code_free(code);
    dev_close(d);
}

/* One stage per compiler (compiles are the slow part): stage 1 holds the
 * most registers (3 blocks of activations per lane), stage 2 the most
 * loads in flight per row. */
Test(moe_gemv, hiprtc_gfx90a_builds_16_byte_loads_without_scratch, .timeout = 300)
{
    amd_default("gfx90a", "moe_gemm_down", "glm5.2", 0);
}

Test(moe_gemv, clang_gfx942_builds_16_byte_loads_without_scratch, .timeout = 300)
{
    amd_default("gfx942", "moe_gemm_up", "glm5.2-a16", 0);
    amd_default("gfx942", "moe_gemm_up", "glm5.2", 3);
}

/* NVRTC: no local memory; the PTX (kept with the cubin; absent on a cache
 * entry older than that) loads weights by ld.global.nc.v4. */
Test(moe_gemv, nvrtc_sm90_builds_without_local_memory, .timeout = 300)
{
    char dir[512];
    tmp_dir_make(dir, sizeof dir, "mt_gemv_cache");
    cr_assert_eq(setenv("MOETUNE_CACHE", dir, 1), 0);
    dev_device *d = mma_open_or_skip("cuda", "sm_90");
    const char *names[] = {"moe_gemm_up"};
    for (int i = 0; i < 1; i++) {
        const kern_family *f = fam(names[i]);
        kern_shape s;
        cr_assert_eq(kern_shape_parse(f, "glm5.2", &s, NULL, NULL), MT_OK);
        kern_config c;
        memset(&c, 0, sizeof c);
        f->gpu->default_config(&s, 1, dev_get_props(d), &c);
        char key[256];
        kern_config_key(f->gpu, &c, key, sizeof key);
        cr_assert_gt(kern_config_get(f->gpu, &c, "GEMV", 0), 0, "sm_90 %s: %s", names[i], key);
        dev_code *code = NULL;
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
        const dev_kernel_res *r = td_find_res(code, names[i]);
        cr_expect_eq(r->private_bytes, 0, "sm_90 %s %s: local memory", names[i], key);
        cr_expect_eq(r->spill_vgprs, 0, "sm_90 %s %s: spills", names[i], key);
        const char *ptx = dev_code_get_text(code);
        cr_assert_not_null(ptx, "sm_90 %s: no PTX with the cubin", names[i]);
        cr_expect(strstr(ptx, "ld.global.nc.v4.u32") != NULL, "sm_90 %s %s: no ld.global.nc.v4",
                  names[i], key);
        cr_log_info("sm_90 %s glm5.2 M=1 %s: %d registers", names[i], key, r->vgprs);
        dev_code_free(code);
    }
    dev_close(d);
}
