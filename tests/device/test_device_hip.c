/* test_device_hip.c: the hip backend without a GPU: hipRTC compiles GPU
 * kernel sources (with the GPU prelude) for gfx90a in compile-only mode,
 * amd_comgr reads their resources, unknown archs are refused before hipRTC
 * can crash on them. Skipped when the build has no HIP. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/rng.h"
#include "device/device.h"
#include "test_dev_util.h"
#include "test_tmp.h"

#ifdef MOETUNE_HAVE_HIP
#define NEED_HIP() ((void)0)
#else
#define NEED_HIP() cr_skip_test("this build has no HIP backend")
#endif

/* Compile-only hip for arch (no GPU needed). */
static dev_device *open_arch(const char *arch)
{
    return td_open("hip", &(dev_open_opts){.arch = arch});
}

/* A block reduction through a static shared tile of TILE floats. */
static const char tile_src[] =
    "MT_KERNEL void __launch_bounds__(256) tile_sum(float *y, const float *x, int n)\n"
    "{\n"
    "    __shared__ float tile[TILE];\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    for (int t = threadIdx.x; t < TILE; t += blockDim.x)\n"
    "        tile[t] = i < n ? mt_sqrtf(x[i] * x[i] + (float)t) : 0.0f;\n"
    "    __syncthreads();\n"
    "    float v = tile[(threadIdx.x * 7) % TILE];\n"
    "    v += mt_shfl_xor_f32(v, 1);\n"
    "    if (i < n) y[i] = mt_fmaxf(v, mt_bf16_to_f32(mt_f32_to_bf16(v)));\n"
    "}\n";

Test(device_hip, compile_only_gfx90a_reports_plausible_resources)
{
    NEED_HIP();
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    dev_device *d = open_arch("gfx90a");
    const dev_props *p = dev_get_props(d);
    cr_assert(p->compile_only);
    cr_assert_str_eq(p->arch, "gfx90a");
    cr_assert_eq(p->backend, DEV_BACKEND_HIP);

    int tile = 64 + (int)mt_rng_below(&r, 4000);
    char tile_text[16];
    snprintf(tile_text, sizeof tile_text, "%d", tile);
    dev_define defs[] = {{"TILE", tile_text}};
    dev_code *c = td_compile(d, "tile_sum.hip", tile_src, defs, 1, true);
    const dev_code_info *info = dev_code_get_info(c);
    cr_assert_not(info->cache_hit);
    cr_assert_gt(info->compile_ms, 0.0);
    const dev_kernel_res *k = td_find_res(c, "tile_sum");
    cr_assert_gt(k->vgprs, 0);
    cr_assert_leq(k->vgprs, 512);
    cr_assert_gt(k->sgprs, 0);
    cr_assert_eq(k->lds_bytes, (int64_t)tile * 4, "seed %" PRIu64 ": TILE %d -> lds %" PRId64,
                 seed, tile, k->lds_bytes);
    cr_assert_eq(k->spill_vgprs, 0);
    cr_assert_eq(k->spill_sgprs, 0);
    cr_assert_eq(k->private_bytes, 0);
    cr_assert_eq(k->max_threads, 256, "__launch_bounds__(256) -> %d", k->max_threads);
    cr_assert_geq(k->waves_per_simd, 1);
    cr_assert_leq(k->waves_per_simd, 8);
    size_t len = 0;
    cr_assert_not_null(dev_code_get_bytes(c, &len));
    cr_assert_gt(len, 64);

    /* Stored bytes give the same resources back (the database path). */
    dev_code *again = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_code_from_bytes(d, dev_code_get_bytes(c, &len), len, &again, &err),
                 MT_OK, "%s", err.msg);
    const dev_kernel_res *k2 = td_find_res(again, "tile_sum");
    cr_assert_eq(k2->vgprs, k->vgprs);
    cr_assert_eq(k2->lds_bytes, k->lds_bytes);
    dev_code_free(again);
    dev_code_free(c);
    dev_close(d);
}

/* Many values live across a barrier under __launch_bounds__(256, 8): at
 * least 8 waves per SIMD leave 64 VGPRs per thread on gfx90a, so the
 * compiler must spill. */
static const char spill_src[] =
    "#define NV 80\n"
    "MT_KERNEL void __launch_bounds__(256, 8) spiller(float *y, const float *x, int n)\n"
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

Test(device_hip, a_kernel_forced_to_spill_reports_spills)
{
    NEED_HIP();
    dev_device *d = open_arch("gfx90a");
    dev_code *c = td_compile(d, "spiller.hip", spill_src, NULL, 0, true);
    const dev_kernel_res *k = td_find_res(c, "spiller");
    cr_assert_eq(k->max_threads, 256);
    cr_assert_leq(k->vgprs, 64);
    cr_assert_gt(k->spill_vgprs, 0, "vgprs %d agprs %d spills %d private %" PRId64,
                 k->vgprs, k->agprs, k->spill_vgprs, k->private_bytes);
    cr_assert_gt(k->private_bytes, 0, "spills go to scratch");
    dev_code_free(c);
    dev_close(d);
}

/* gfx940-942 go to the offline clang instead, gfx950 is refused for want of
 * LLVM 20: tests/test_mma_compile.c. */
Test(device_hip, unknown_archs_are_refused_before_hiprtc_sees_them)
{
    NEED_HIP();
    const char *bad[] = {"gfx1100x", "gfx1100", "gfx943", "sm_90"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dev_open_opts o = {.arch = bad[i]};
        dev_device *d = NULL;
        mt_err err = MT_ERR_INIT;
        mt_status st = dev_open("hip", &o, &d, &err);
        cr_assert_eq(st, MT_E_INVALID, "%s: %s", bad[i], err.msg);
        cr_assert_null(d);
        cr_assert(strstr(err.msg, bad[i]), "message does not name %s: %s", bad[i], err.msg);
        cr_assert(strstr(err.msg, "crashes"), "message does not say why: %s", err.msg);
        cr_assert(strstr(err.msg, "gfx90a"), "message does not list what works: %s",
                  err.msg);
    }
}

Test(device_hip, compile_error_returns_the_hiprtc_log)
{
    NEED_HIP();
    dev_device *d = open_arch("gfx90a");
    dev_compile_req req = {
        .name = "bad_kernel.hip",
        .source = "MT_KERNEL void f(float *y)\n{\n    y[0] = no_such_value;\n}\n",
        .no_cache = true};
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_compile(d, &req, &code, &err);
    cr_assert_eq(st, MT_E_COMPILE, "status %s: %s", mt_status_str(st), err.msg);
    cr_assert_null(code);
    cr_assert(strstr(err.msg, "bad_kernel.hip:3"), "log does not name the line: %s",
              err.msg);
    cr_assert(strstr(err.msg, "no_such_value"), "log lacks the compiler's text: %s",
              err.msg);
    dev_close(d);
}

Test(device_hip, open_without_gpu_or_arch_fails_cleanly)
{
    NEED_HIP();
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_open("hip", NULL, &d, &err);
    if (st == MT_OK) {
        dev_close(d);
        cr_skip_test("an AMD GPU is present");
    }
    cr_assert_eq(st, MT_E_DEVICE, "status %s: %s", mt_status_str(st), err.msg);
    cr_assert(strstr(err.msg, "no AMD GPU"), "%s", err.msg);
    cr_assert(strstr(err.msg, "--arch"), "message does not say how to compile: %s", err.msg);
    cr_assert_eq(dev_open("hip:x", NULL, &d, &err), MT_E_INVALID);
}

Test(device_hip, compile_only_device_refuses_memory_and_modules)
{
    NEED_HIP();
    dev_device *d = open_arch("gfx908");
    cr_assert_str_eq(dev_get_props(d)->arch, "gfx908");
    void *p = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_alloc(d, 1024, &p, &err), MT_E_UNSUPPORTED);
    cr_assert(strstr(err.msg, "compile-only"), "%s", err.msg);
    char defs_text[] = "128";
    dev_define defs[] = {{"TILE", defs_text}};
    dev_code *c = td_compile(d, "tile_sum.hip", tile_src, defs, 1, true);
    cr_assert_eq(td_find_res(c, "tile_sum")->lds_bytes, 512);
    dev_module *m = NULL;
    cr_assert_eq(dev_module_load(d, c, &m, &err), MT_E_UNSUPPORTED);
    dev_code_free(c);
    dev_close(d);
}

Test(device_hip, cache_hit_reports_the_same_resources)
{
    NEED_HIP();
    tmp_cache_make_writable();
    dev_device *d = open_arch("gfx90a");
    char tile_text[32];
    /* A fresh define value keeps the first compile a miss. */
    snprintf(tile_text, sizeof tile_text, "(64 + %u)", (unsigned)(mt_seed_fresh() % 1000));
    dev_define defs[] = {{"TILE", tile_text}};
    dev_code *c1 = td_compile(d, "tile_sum.hip", tile_src, defs, 1, false);
    dev_code *c2 = td_compile(d, "tile_sum.hip", tile_src, defs, 1, false);
    cr_assert_not(dev_code_get_info(c1)->cache_hit);
    cr_assert(dev_code_get_info(c2)->cache_hit);
    const dev_kernel_res *a = td_find_res(c1, "tile_sum"), *b = td_find_res(c2, "tile_sum");
    cr_assert_eq(a->vgprs, b->vgprs);
    cr_assert_eq(a->sgprs, b->sgprs);
    cr_assert_eq(a->lds_bytes, b->lds_bytes);
    cr_assert_eq(a->spill_vgprs, b->spill_vgprs);
    dev_code_free(c1);
    dev_code_free(c2);
    dev_close(d);
}

typedef struct compile_job {
    dev_device *d;
    int tile;
    mt_status st;
    int64_t lds;
    char msg[288];
} compile_job;

enum { ROUNDS = 4 };

/* Compiles tile_sum ROUNDS times with TILE = j->tile + round, uncached, and
 * checks each result's LDS. */
static void *compile_thread(void *arg)
{
    compile_job *j = arg;
    j->lds = -1;
    for (int r = 0; r < ROUNDS; r++) {
        char tile_text[16];
        snprintf(tile_text, sizeof tile_text, "%d", j->tile + r);
        dev_define defs[] = {{"TILE", tile_text}};
        dev_compile_req req = {.name = "tile_sum.hip", .source = tile_src, .defines = defs,
                               .n_defines = 1, .no_cache = true};
        dev_code *c = NULL;
        mt_err err = MT_ERR_INIT;
        j->st = dev_compile(j->d, &req, &c, &err);
        snprintf(j->msg, sizeof j->msg, "round %d: %.240s", r, err.msg);
        if (j->st != MT_OK)
            return NULL;
        const dev_code_info *info = dev_code_get_info(c);
        int64_t lds = info->n_kernels == 1 ? info->kernels[0].lds_bytes : -1;
        dev_code_free(c);
        if (lds != (int64_t)(j->tile + r) * 4) {
            j->lds = lds;
            snprintf(j->msg, sizeof j->msg, "round %d: %" PRId64 " B of LDS for TILE %d", r,
                     lds, j->tile + r);
            return NULL;
        }
    }
    j->lds = (int64_t)j->tile * 4;
    return NULL;
}

/* hipRTC and comgr are not safe to enter from two threads at once (CI
 * aborted once with "Option 'h' registered more than once" on a compile
 * after the first); the backend serializes them, so every thread's every
 * round must come back whole. */
Test(device_hip, four_threads_compiling_rounds_at_once_each_get_their_own_result)
{
    NEED_HIP();
    dev_device *d = open_arch("gfx90a");
    compile_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (compile_job){.d = d, .tile = 100 + 37 * i};
        cr_assert_eq(pthread_create(&th[i], NULL, compile_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(jobs[i].st, MT_OK, "thread %d: %s", i, jobs[i].msg);
        cr_assert_eq(jobs[i].lds, (int64_t)jobs[i].tile * 4, "thread %d: %s", i, jobs[i].msg);
    }
    dev_close(d);
}
