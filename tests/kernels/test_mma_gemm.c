/* test_mma_gemm.c: the `gemm` family's matrix-instruction path (MMA=1|2):
 * explicit configs against the plain C reference on emu wave64 (AMD
 * layouts) and wave32 (NVIDIA's), at every check case of the family (odd
 * sizes, M = 1); where it is valid; and, without a GPU, that hipRTC
 * (gfx90a), clang-19 (gfx942) and NVRTC (sm_90) build it with matrix
 * instructions and no scratch. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/files.h"
#include "common/rng.h"
#include "device/device.h"
#include "kernels/core/exec.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"
#include "test_dev_util.h"

static const kern_family *gemm(void)
{
    const kern_family *f = kern_family_find("gemm");
    cr_assert_not_null(f);
    return f;
}

static void parse(const char *text, kern_config *c)
{
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_config_parse(gemm()->gpu, text, c, &err), MT_OK, "%s", err.msg);
}

/* Every check case of the family with each config. */
static void check_on(const char *spec, const char *const *cfgs, int n)
{
    const kern_family *f = gemm();
    dev_device *d = td_open(spec, NULL);
    uint64_t seed = mt_seed_fresh();
    for (int i = 0; i < n; i++) {
        kern_config c;
        parse(cfgs[i], &c);
        for (int k = 0; k < f->n_cases; k++) {
            kern_shape s;
            cr_assert_eq(kern_shape_parse(f, f->cases[k].key, &s, NULL, NULL), MT_OK);
            char why[256] = "";
            cr_assert(kern_config_valid(f, f->gpu, &s, f->cases[k].m, &c, dev_get_props(d),
                                        why, sizeof why),
                      "%s %s: %s", spec, cfgs[i], why);
            mt_err err = MT_ERR_INIT;
            mt_status st = kern_check_one(d, f, f->cases[k].key, f->cases[k].m, &c,
                                          seed + (uint64_t)(i * 16 + k), &err);
            cr_assert_eq(st, MT_OK, "%s %s, %s M=%" PRId64 " (seed %" PRIu64 "): %s", spec,
                         cfgs[i], f->cases[k].key, f->cases[k].m, seed + (uint64_t)(i * 16 + k),
                         err.msg);
        }
    }
    dev_close(d);
}

Test(mma_gemm, matches_the_reference_on_wave64)
{
    static const char *const cfgs[] = {
        "BM=16,BN=16,BK=16,TM=1,TN=1,SPLITK=1,MMA=1",
        "BM=64,BN=32,BK=32,TM=2,TN=1,SPLITK=2,MMA=1",
        "BM=32,BN=64,BK=16,TM=1,TN=2,SPLITK=1,MMA=1",
        "BM=32,BN=32,BK=8,TM=1,TN=1,SPLITK=1,MMA=2",
        "BM=64,BN=64,BK=16,TM=2,TN=1,SPLITK=4,MMA=2",
    };
    check_on("emu:wave64", cfgs, 5);
}

Test(mma_gemm, matches_the_reference_on_wave32)
{
    static const char *const cfgs[] = {
        "BM=16,BN=16,BK=16,TM=1,TN=1,SPLITK=1,MMA=1",
        "BM=32,BN=32,BK=32,TM=2,TN=2,SPLITK=2,MMA=1",
        "BM=64,BN=16,BK=16,TM=1,TN=1,SPLITK=1,MMA=1",
    };
    check_on("emu:wave32", cfgs, 3);
}

Test(mma_gemm, validity_follows_the_platforms_tiles)
{
    const kern_family *f = gemm();
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, "tiny", &s, NULL, NULL), MT_OK);
    dev_props p = {.backend = DEV_BACKEND_EMU, .warp_size = 32,
                   .max_threads_per_block = 1024, .shared_mem_per_block = 65536};
    kern_config c;
    char why[256] = "";
    parse("BM=32,BN=32,BK=8,TM=1,TN=1,SPLITK=1,MMA=2", &c);
    cr_assert_not(kern_config_valid(f, f->gpu, &s, 4, &c, &p, why, sizeof why));
    cr_assert(strstr(why, "MMA=2"), "%s", why);
    /* 16x8x16 on wave32: BK=8 cannot hold a K step of 16 */
    parse("BM=16,BN=16,BK=8,TM=1,TN=1,SPLITK=1,MMA=1", &c);
    cr_assert_not(kern_config_valid(f, f->gpu, &s, 4, &c, &p, why, sizeof why));
    p.warp_size = 64;
    parse("BM=32,BN=32,BK=8,TM=1,TN=1,SPLITK=1,MMA=2", &c);
    cr_assert(kern_config_valid(f, f->gpu, &s, 4, &c, &p, why, sizeof why), "%s", why);
    /* a gfx1030 has no MFMA; an sm_75 no bf16 mma.sync */
    dev_props amd = {.backend = DEV_BACKEND_HIP, .warp_size = 32,
                     .max_threads_per_block = 1024, .shared_mem_per_block = 65536};
    snprintf(amd.arch, sizeof amd.arch, "gfx1030");
    parse("BM=16,BN=16,BK=16,TM=1,TN=1,SPLITK=1,MMA=1", &c);
    cr_assert_not(kern_config_valid(f, f->gpu, &s, 4, &c, &amd, why, sizeof why));
    dev_props nv = amd;
    nv.backend = DEV_BACKEND_CUDA;
    snprintf(nv.arch, sizeof nv.arch, "sm_75");
    cr_assert_not(kern_config_valid(f, f->gpu, &s, 4, &c, &nv, why, sizeof why));
    snprintf(nv.arch, sizeof nv.arch, "sm_90");
    cr_assert(kern_config_valid(f, f->gpu, &s, 4, &c, &nv, why, sizeof why), "%s", why);
}

/* ---- compile-only ------------------------------------------------------- */

static dev_device *open_or_skip(const char *spec, const char *arch)
{
    dev_open_opts o = {.arch = arch};
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_open(spec, &o, &d, &err);
    if (st == MT_E_UNSUPPORTED || st == MT_E_NOT_FOUND)
        cr_skip_test("%s %s: %s", spec, arch, err.msg);
    cr_assert_eq(st, MT_OK, "dev_open(%s, arch %s): %s", spec, arch, err.msg);
    return d;
}

/* How many lines of llvm-objdump-19's disassembly of c contain what; -1
 * when llvm-objdump-19 is not installed. */
static int count_in_disassembly(const dev_code *c, const char *arch, const char *what)
{
    if (system("command -v llvm-objdump-19 >/dev/null 2>&1") != 0)
        return -1;
    size_t len = 0;
    const void *bytes = dev_code_get_bytes(c, &len);
    char path[512];
    cr_assert(mt_tmp_path(path, sizeof path, "moetune-mma-gemm-XXXXXX"));
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, bytes, len), (ssize_t)len);
    close(fd);
    char cmd[1024], line[512];
    snprintf(cmd, sizeof cmd, "llvm-objdump-19 -d --mcpu=%s %s 2>&1", arch, path);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    int n = 0;
    while (fgets(line, sizeof line, p))
        n += strstr(line, what) != NULL;
    pclose(p);
    unlink(path);
    return n;
}

static void compile_amd(const char *arch, const char *cfg_text, const char *mfma)
{
    const kern_family *f = gemm();
    dev_device *d = open_or_skip("hip", arch);
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, "glm5.2-q_a", &s, NULL, NULL), MT_OK);
    kern_config c;
    parse(cfg_text, &c);
    char why[256] = "";
    cr_assert(kern_config_valid(f, f->gpu, &s, 64, &c, dev_get_props(d), why, sizeof why),
              "%s", why);
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *r = td_find_res(code, "gemm_bf16");
    cr_assert_eq(r->private_bytes, 0, "%s %s: %lld bytes of scratch", arch, cfg_text,
                 (long long)r->private_bytes);
    cr_assert_eq(r->spill_vgprs, 0);
    cr_assert_eq(r->spill_sgprs, 0);
    int n = count_in_disassembly(code, arch, mfma);
    cr_assert(n != 0, "%s %s: no %s in the code object", arch, cfg_text, mfma);
    int scratch = count_in_disassembly(code, arch, "scratch_");
    cr_assert(scratch <= 0, "%s %s: %d scratch instructions", arch, cfg_text, scratch);
    dev_code_free(code);
    dev_close(d);
}

Test(mma_gemm, hiprtc_gfx90a_builds_mfma_16x16x16_without_scratch)
{
    compile_amd("gfx90a", "BM=64,BN=64,BK=32,TM=2,TN=2,SPLITK=1,MMA=1",
                "v_mfma_f32_16x16x16bf16_1k");
}

Test(mma_gemm, hiprtc_gfx90a_builds_mfma_32x32x8_without_scratch)
{
    compile_amd("gfx90a", "BM=128,BN=64,BK=32,TM=2,TN=1,SPLITK=1,MMA=2",
                "v_mfma_f32_32x32x8bf16_1k");
}

Test(mma_gemm, clang_gfx942_builds_mfma_without_scratch)
{
    compile_amd("gfx942", "BM=64,BN=64,BK=32,TM=2,TN=2,SPLITK=1,MMA=1",
                "v_mfma_f32_16x16x16_bf16");
}

Test(mma_gemm, nvrtc_sm90_builds_without_local_memory)
{
    const kern_family *f = gemm();
    dev_device *d = open_or_skip("cuda", "sm_90");
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, "glm5.2-q_a", &s, NULL, NULL), MT_OK);
    kern_config c;
    parse("BM=64,BN=64,BK=32,TM=2,TN=2,SPLITK=1,MMA=1", &c);
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *r = td_find_res(code, "gemm_bf16");
    cr_assert_eq(r->private_bytes, 0, "%lld bytes of local memory",
                 (long long)r->private_bytes);
    dev_code_free(code);
    dev_close(d);
}
