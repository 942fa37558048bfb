/* test_device_cuda.c: the cuda backend without a GPU: NVRTC (loaded at run
 * time) compiles GPU kernel sources with the GPU prelude for sm_90 in
 * compile-only mode, and ptxas's report gives registers, shared memory and
 * spills. Skipped where NVRTC is not installed. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/rng.h"
#include "device/device.h"
#include "test_dev_util.h"

/* Opens compile-only cuda for arch, or skips the test when NVRTC is absent. */
static dev_device *open_or_skip(const char *arch)
{
    dev_open_opts o = {.arch = arch};
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_open("cuda", &o, &d, &err);
    if (st == MT_E_UNSUPPORTED && strstr(err.msg, "NVRTC"))
        cr_skip_test("%s", err.msg);
    cr_assert_eq(st, MT_OK, "dev_open(cuda, arch %s): %s", arch, err.msg);
    return d;
}

static const char src[] =
    "MT_KERNEL void __launch_bounds__(256) tile_sum(float *y, const float *x, int n)\n"
    "{\n"
    "    __shared__ float tile[TILE];\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    for (int t = threadIdx.x; t < TILE; t += blockDim.x)\n"
    "        tile[t] = i < n ? mt_sqrtf(x[i] * x[i] + (float)t) : 0.0f;\n"
    "    __syncthreads();\n"
    "    float v = tile[(threadIdx.x * 7) % TILE];\n"
    "    v += mt_shfl_xor_f32(v, 1);\n"
    "    if (i < n) y[i] = mt_fmaxf(v, mt_bf16_to_f32(mt_f32_to_bf16(mt_expf(v))));\n"
    "}\n"
    "#define NV 150\n"
    "MT_KERNEL void __launch_bounds__(1024) spiller(float *y, const float *x, int n)\n"
    "{\n"
    "    float v[NV];\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < NV; j++) v[j] = x[i + j * n];\n"
    "    __syncthreads();\n"
    "    float acc = 0.0f;\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < NV; j++) acc = acc * v[NV - 1 - j] + v[j];\n"
    "    y[i] = acc;\n"
    "}\n";

Test(device_cuda, compile_only_sm90_reports_registers_shared_memory_and_spills)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    dev_device *d = open_or_skip("sm_90");
    const dev_props *p = dev_get_props(d);
    cr_assert(p->compile_only);
    cr_assert_str_eq(p->arch, "sm_90");
    cr_assert_eq(p->warp_size, 32);

    int tile = 64 + (int)mt_rng_below(&r, 4000);
    char tile_text[16];
    snprintf(tile_text, sizeof tile_text, "%d", tile);
    dev_define defs[] = {{"TILE", tile_text}};
    dev_compile_req req = {.name = "tile.cu", .source = src, .defines = defs,
                           .n_defines = 1, .no_cache = true};
    dev_code *c = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_compile(d, &req, &c, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *k = td_find_res(c, "tile_sum");
    cr_assert_gt(k->vgprs, 0, "registers");
    cr_assert_leq(k->vgprs, 255);
    cr_assert_eq(k->lds_bytes, (int64_t)tile * 4, "seed %" PRIu64 ": TILE %d", seed, tile);
    cr_assert_eq(k->spill_vgprs, 0);
    const dev_kernel_res *s = td_find_res(c, "spiller");
    cr_assert_leq(s->vgprs, 64, "__launch_bounds__(1024) caps registers at 64");
    cr_assert_gt(s->spill_vgprs, 0, "spiller did not spill: %s", dev_code_get_log(c));
    cr_assert_gt(s->private_bytes, 0);
    size_t len = 0;
    const unsigned char *bytes = dev_code_get_bytes(c, &len);
    cr_assert_gt(len, 64);
    cr_assert_eq(memcmp(bytes, "\177ELF", 4), 0, "the code object is a cubin (ELF)");
    dev_code_free(c);
    dev_close(d);
}

Test(device_cuda, compile_error_returns_the_nvrtc_log)
{
    dev_device *d = open_or_skip("sm_90");
    dev_compile_req req = {.name = "bad_kernel.cu",
                           .source = "MT_KERNEL void f(float *y)\n{\n    y[0] = no_such_value;\n}\n",
                           .no_cache = true};
    dev_code *c = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_compile(d, &req, &c, &err);
    cr_assert_eq(st, MT_E_COMPILE, "status %s: %s", mt_status_str(st), err.msg);
    cr_assert(strstr(err.msg, "bad_kernel.cu(3)"), "log does not name the line: %s", err.msg);
    cr_assert(strstr(err.msg, "no_such_value"), "%s", err.msg);
    dev_close(d);
}

Test(device_cuda, malformed_or_unknown_archs_are_refused)
{
    dev_device *d = open_or_skip("sm_90");
    dev_close(d);
    const char *bad[] = {"gfx90a", "sm_", "sm_9x", "sm_7"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dev_open_opts o = {.arch = bad[i]};
        mt_err err = MT_ERR_INIT;
        d = NULL;
        cr_assert_eq(dev_open("cuda", &o, &d, &err), MT_E_INVALID, "%s: %s", bad[i],
                     err.msg);
        cr_assert_null(d);
        cr_assert(strstr(err.msg, bad[i]), "%s", err.msg);
    }
}

Test(device_cuda, open_without_gpu_or_arch_fails_cleanly)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_open("cuda", NULL, &d, &err);
    if (st == MT_OK) {
        dev_close(d);
        cr_skip_test("an NVIDIA GPU is present");
    }
    cr_assert(st == MT_E_UNSUPPORTED || st == MT_E_DEVICE, "status %s: %s",
              mt_status_str(st), err.msg);
    cr_assert_null(d);
    cr_assert_gt(strlen(err.msg), 10);
}
