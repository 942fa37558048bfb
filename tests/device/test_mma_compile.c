/* test_mma_compile.c: the matrix fragments (mt_mma_* of prelude_gpu.h)
 * compile to the vendors' matrix instructions without a GPU: hipRTC for
 * gfx90a, clang-19 for gfx942 (v_mfma in llvm-objdump-19's disassembly, no
 * scratch), NVRTC for sm_90; targets without them see MT_MMA_HAVE 0. Each
 * part is skipped when its compiler is not installed. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/files.h"
#include "device/device.h"
#include "test_dev_util.h"

/* One wave multiplies a K-deep A tile by B^T, both staged in LDS. */
static const char src[] =
    "#if SHAPE == 32\n"
    "#undef MT_MMA_SHAPE\n"
    "#define MT_MMA_SHAPE 32\n"
    "#endif\n"
    "#if !MT_MMA_HAVE\n"
    "#error no matrix instructions on this target\n"
    "#endif\n"
    "#define TM MT_MMA_M\n"
    "#define TN MT_MMA_N\n"
    "#define TK MT_MMA_K\n"
    "#define KK (4 * TK)\n"
    "MT_KERNEL __launch_bounds__(64) void mma_tile(float *d, const mt_bf16 *a,\n"
    "                                              const mt_bf16 *b)\n"
    "{\n"
    "    __shared__ mt_bf16 as[TM * KK];\n"
    "    __shared__ mt_bf16 bs[TN * KK];\n"
    "    for (int i = threadIdx.x; i < TM * KK; i += blockDim.x)\n"
    "        as[i] = a[i];\n"
    "    for (int i = threadIdx.x; i < TN * KK; i += blockDim.x)\n"
    "        bs[i] = b[i];\n"
    "    __syncthreads();\n"
    "    mt_mma_acc acc = mt_mma_acc_zero();\n"
    "    for (int s = 0; s < KK / TK; s++)\n"
    "        acc = mt_mma_bf16(mt_mma_load_a(as + s * TK, KK), mt_mma_load_bt(bs + s * TK, KK),\n"
    "                          acc);\n"
    "    mt_mma_store_acc(d, TN, acc);\n"
    "}\n";

/* Opens spec compile-only for arch; skips when the backend or its compiler
 * is missing here. */
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

static bool have_tool(const char *name)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
    return system(cmd) == 0;
}

/* llvm-objdump-19's disassembly of an AMD code object (malloc'd). */
static char *disassemble(const dev_code *c, const char *arch)
{
    size_t len = 0;
    const void *bytes = dev_code_get_bytes(c, &len);
    char path[512];
    cr_assert(mt_tmp_path(path, sizeof path, "moetune-mma-XXXXXX"));
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, bytes, len), (ssize_t)len);
    close(fd);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "llvm-objdump-19 -d --mcpu=%s %s 2>&1", arch, path);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    size_t got;
    while ((got = fread(out + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 4096)
            out = realloc(out, cap *= 2);
    }
    out[n] = 0;
    pclose(p);
    unlink(path);
    return out;
}

static void check_amd(const char *arch, int shape, const char *mfma)
{
    dev_device *d = open_or_skip("hip", arch);
    char s[8];
    snprintf(s, sizeof s, "%d", shape);
    dev_define defs[] = {{"SHAPE", s}};
    dev_code *c = td_compile(d, "mma_tile.hip", src, defs, 1, true);
    const dev_kernel_res *r = td_find_res(c, "mma_tile");
    cr_assert_eq(r->private_bytes, 0, "%s shape %d: %lld bytes of scratch", arch, shape,
                 (long long)r->private_bytes);
    cr_assert_eq(r->spill_vgprs, 0);
    cr_assert_gt(r->vgprs + r->agprs, 0);
    if (have_tool("llvm-objdump-19")) {
        char *dis = disassemble(c, arch);
        cr_assert(strstr(dis, mfma), "%s shape %d: no %s in\n%.4000s", arch, shape, mfma, dis);
        cr_assert_null(strstr(dis, "scratch_"), "%s: scratch access", arch);
        free(dis);
    }
    dev_code_free(c);
    dev_close(d);
}

Test(mma_compile, hiprtc_gfx90a_uses_mfma_16x16x16)
{
    check_amd("gfx90a", 16, "v_mfma_f32_16x16x16bf16_1k");
}

Test(mma_compile, hiprtc_gfx90a_uses_mfma_32x32x8)
{
    check_amd("gfx90a", 32, "v_mfma_f32_32x32x8bf16_1k");
}

/* CDNA3 spells the same instructions without the _1k. */
Test(mma_compile, clang_gfx942_uses_mfma_16x16x16)
{
    check_amd("gfx942", 16, "v_mfma_f32_16x16x16_bf16");
}

Test(mma_compile, clang_gfx942_uses_mfma_32x32x8)
{
    check_amd("gfx942", 32, "v_mfma_f32_32x32x8_bf16");
}

Test(mma_compile, clang_gfx942_device_reports_resources_and_occupancy)
{
    dev_device *d = open_or_skip("hip", "gfx942");
    const dev_props *p = dev_get_props(d);
    cr_assert(p->compile_only);
    cr_assert_str_eq(p->arch, "gfx942");
    cr_assert_eq(p->max_vgprs, 512);
    dev_define defs[] = {{"SHAPE", "32"}};
    dev_code *c = td_compile(d, "mma_tile.hip", src, defs, 1, true);
    const dev_kernel_res *r = td_find_res(c, "mma_tile");
    cr_assert_gt(r->sgprs, 0);
    cr_assert_gt(r->agprs + r->vgprs, 16, "32x32 accumulators are 16 registers");
    cr_assert_eq(r->lds_bytes, 2 * (32 + 32) * 32, "lds %lld", (long long)r->lds_bytes);
    cr_assert_eq(r->max_threads, 64);
    cr_assert(r->waves_per_simd >= 1 && r->waves_per_simd <= 8, "%d", r->waves_per_simd);
    dev_code_free(c);
    dev_close(d);
}

Test(mma_compile, gfx950_is_refused_naming_llvm_20)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_open("hip", &(dev_open_opts){.arch = "gfx950"}, &d, &err);
    if (st == MT_OK) {
        dev_close(d);
        cr_skip_test("this machine's offline clang compiles gfx950");
    }
    if (strstr(err.msg, "did not run") || strstr(err.msg, "has no hip backend"))
        cr_skip_test("%s", err.msg);
    cr_assert_eq(st, MT_E_UNSUPPORTED, "%s: %s", mt_status_str(st), err.msg);
    cr_assert(strstr(err.msg, "gfx950") && strstr(err.msg, "LLVM 20"), "%s", err.msg);
}

static void check_no_mma(const char *spec, const char *arch)
{
    dev_device *d = open_or_skip(spec, arch);
    dev_define defs[] = {{"SHAPE", "16"}};
    dev_compile_req req = {.name = "mma_tile.hip", .source = src, .defines = defs,
                           .n_defines = 1, .no_cache = true};
    dev_code *c = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_compile(d, &req, &c, &err);
    cr_assert_eq(st, MT_E_COMPILE, "%s %s: %s", spec, arch, err.msg);
    cr_assert(strstr(err.msg, "no matrix instructions on this target"), "%s", err.msg);
    dev_close(d);
}

Test(mma_compile, hiprtc_gfx1030_has_no_mma) { check_no_mma("hip", "gfx1030"); }

Test(mma_compile, nvrtc_sm90_compiles_mma_sync)
{
    dev_device *d = open_or_skip("cuda", "sm_90");
    dev_define defs[] = {{"SHAPE", "16"}};
    dev_code *c = td_compile(d, "mma_tile.hip", src, defs, 1, true);
    const dev_kernel_res *r = td_find_res(c, "mma_tile");
    cr_assert_eq(r->private_bytes, 0, "sm_90: %lld bytes of local memory",
                 (long long)r->private_bytes);
    dev_code_free(c);
    dev_close(d);
}

Test(mma_compile, nvrtc_sm75_has_no_mma) { check_no_mma("cuda", "sm_75"); }
