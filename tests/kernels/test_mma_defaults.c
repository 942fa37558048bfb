/* test_mma_defaults.c: the GPU default configs of gemm, moe_gemm_up and
 * moe_gemm_down use the matrix instructions wherever the device has them,
 * and stay valid everywhere else:
 * - validity accepts every default, on every kind of device, at odd sizes;
 * - the defaults at GLM-5.2 shapes compile to v_mfma without scratch or
 *   spills for gfx90a (hipRTC) and gfx942 (clang-19), and to mma.sync
 *   without local memory in NVRTC's PTX for sm_90, which the compile cache
 *   keeps beside the cubin as a .ptx file.
 * Each compile part skips, naming what is missing, without its compiler.
 * The Ms are a sample (docs/BENCHMARKS.md lists every preset and M). */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "device/cuda/ptx_mix.h"
#include "test_mma_util.h"
#include "test_tmp.h"

static const kern_family *fam(const char *name)
{
    const kern_family *f = kern_family_find(name);
    cr_assert_not_null(f, "%s", name);
    return f;
}

/* The main kernel of each family (the moe families name theirs alike). */
static const char *kernel_of(const char *fname)
{
    return strcmp(fname, "gemm") ? fname : "gemm_bf16";
}

static void default_at(const kern_family *f, const char *shape, int64_t m, const dev_props *p,
                       kern_shape *s, kern_config *c)
{
    cr_assert_eq(kern_shape_parse(f, shape, s, NULL, NULL), MT_OK, "%s", shape);
    memset(c, 0, sizeof *c);
    f->gpu->default_config(s, m, p, c);
}

/* ---- validity everywhere ------------------------------------------------ */

static dev_props props(dev_backend b, const char *arch, int ws, size_t static_shared)
{
    dev_props p = {.backend = b, .warp_size = ws, .max_threads_per_block = 1024,
                   .shared_mem_per_block = 65536, .static_shared_per_block = static_shared};
    snprintf(p.arch, sizeof p.arch, "%s", arch);
    return p;
}

typedef struct shape_case {
    const char *family, *shape;
} shape_case;

/* Presets and odd keys: small bm (the tile must divide it), separate gate
 * and up, top-1, K and N not multiples of the tiles (gemm). */
static const shape_case shapes[] = {
    {"gemm", "glm5.2-q_a"},
    {"gemm", "glm5.2-kv_a"},
    {"gemm", "tiny"},
    {"gemm", "N=100,K=72"},
    {"gemm", "N=7,K=40"},
    {"moe_gemm_up", "glm5.2"},
    {"moe_gemm_up", "glm5.2-a16"},
    {"moe_gemm_up", "tiny"},
    {"moe_gemm_up", "H=256,I=128,E=16,topk=4,a=mxfp4,cat=0,bm=16,skew=0"},
    {"moe_gemm_up", "H=256,I=128,E=16,topk=1,a=mxfp4,cat=1,bm=32,skew=1"},
    {"moe_gemm_up", "H=384,I=256,E=8,topk=2,a=bf16,cat=0,bm=64,skew=2"},
    {"moe_gemm_down", "glm5.2"},
    {"moe_gemm_down", "glm5.2-rows"},
    {"moe_gemm_down", "glm5.2-a16"},
    {"moe_gemm_down", "tiny-rows"},
    {"moe_gemm_down", "H=256,I=128,E=16,topk=4,a=mxfp4,comb=1,bm=16,skew=0"},
    {"moe_gemm_down", "H=384,I=256,E=8,topk=2,a=bf16,comb=0,bm=64,skew=2"},
};

Test(mma_defaults, valid_everywhere_and_on_matrix_instructions_where_the_device_has_them)
{
    const dev_props devs[] = {
        props(DEV_BACKEND_HIP, "gfx90a", 64, 65536),
        props(DEV_BACKEND_HIP, "gfx942", 64, 65536),
        props(DEV_BACKEND_HIP, "gfx950", 64, 163840),
        props(DEV_BACKEND_HIP, "gfx1030", 32, 65536),
        props(DEV_BACKEND_CUDA, "sm_80", 32, 49152),
        props(DEV_BACKEND_CUDA, "sm_90", 32, 49152),
        props(DEV_BACKEND_CUDA, "sm_75", 32, 49152),
        props(DEV_BACKEND_EMU, "emu", 64, 65536),
        props(DEV_BACKEND_EMU, "emu", 32, 65536),
    };
    const int64_t ms[] = {1, 3, 16, 17, 100, 256, 4096};
    int n_mma = 0, n_decode = 0;
    for (size_t d = 0; d < sizeof devs / sizeof devs[0]; d++) {
        const dev_props *p = &devs[d];
        int tm, tn, tk;
        bool has = kern_mma_tile(p, 1, &tm, &tn, &tk);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const kern_family *f = fam(shapes[i].family);
            for (size_t j = 0; j < sizeof ms / sizeof ms[0]; j++) {
                kern_shape s;
                kern_config c;
                default_at(f, shapes[i].shape, ms[j], p, &s, &c);
                char why[256] = "", key[256];
                kern_config_key(f->gpu, &c, key, sizeof key);
                cr_assert(kern_config_valid(f, f->gpu, &s, ms[j], &c, p, why, sizeof why),
                          "%s %s M=%lld on %s/%d: default %s refused: %s", f->name,
                          shapes[i].shape, (long long)ms[j], p->arch, p->warp_size, key, why);
                int mma = kern_config_get(f->gpu, &c, "MMA", -1);
                /* the decode path (GEMV > 0, where the family has it) has no tiles */
                bool decode = kern_config_get(f->gpu, &c, "GEMV", 0) > 0;
                if (has && !decode)
                    cr_assert_gt(mma, 0, "%s %s M=%lld on %s/%d: default %s has no MMA",
                                 f->name, shapes[i].shape, (long long)ms[j], p->arch,
                                 p->warp_size, key);
                if (!has)
                    cr_assert_eq(mma, 0, "%s on %s: MMA=%d without matrix instructions",
                                 f->name, p->arch, mma);
                n_mma += mma > 0;
                n_decode += decode;
            }
        }
    }
    cr_log_info("%d defaults on matrix instructions, %d on the decode path", n_mma, n_decode);
}

/* ---- compile-only: AMD -------------------------------------------------- */

/* The default of fname at shape and M for arch: its MMA value is expected
 * to be mma, and test_mma_util.h checks the code object (only matrix
 * instructions starting with mfma[mma - 1], no scratch, no spills). */
static void amd_default(const char *arch, const char *fname, const char *shape, int64_t m,
                        int mma, const char *const mfma[3])
{
    dev_device *d = mma_open_or_skip("hip", arch);
    const kern_family *f = fam(fname);
    kern_shape s;
    kern_config c;
    default_at(f, shape, m, dev_get_props(d), &s, &c);
    dev_close(d);
    char key[256];
    kern_config_key(f->gpu, &c, key, sizeof key);
    cr_assert_eq(kern_config_get(f->gpu, &c, "MMA", -1), mma, "%s %s %s M=%lld: default %s",
                 arch, fname, shape, (long long)m, key);
    mma_compile_amd(f, kernel_of(fname), arch, shape, m, key, mfma[mma - 1]);
}

static const char *const mfma_cdna2[3] = {"v_mfma_f32_16x16x16bf16_1k",
                                          "v_mfma_f32_32x32x8bf16_1k", NULL};
/* CDNA3 spells the same instructions without the _1k, and has fp8 ones. */
static const char *const mfma_cdna3[3] = {"v_mfma_f32_16x16x16_bf16", "v_mfma_f32_32x32x8_bf16",
                                          "v_mfma_f32_16x16x32_fp8_fp8"};

Test(mma_defaults, hiprtc_gfx90a_defaults_build_mfma_without_scratch, .timeout = 300)
{
    amd_default("gfx90a", "gemm", "glm5.2-q_a", 1, 1, mfma_cdna2);
    amd_default("gfx90a", "moe_gemm_up", "glm5.2", 4096, 2, mfma_cdna2);
    amd_default("gfx90a", "moe_gemm_down", "glm5.2", 256, 1, mfma_cdna2);
}

Test(mma_defaults, clang_gfx942_defaults_build_mfma_without_scratch, .timeout = 300)
{
    amd_default("gfx942", "gemm", "glm5.2-kv_a", 4096, 2, mfma_cdna3);
    amd_default("gfx942", "moe_gemm_up", "glm5.2-a16", 256, 1, mfma_cdna3);
    amd_default("gfx942", "moe_gemm_down", "H=6144,I=2048,E=256,topk=8,a=bf16,comb=1,bm=128,skew=0",
                4096, 2, mfma_cdna3);
    amd_default("gfx942", "moe_gemm_down", "glm5.2-rows", 4096, 3, mfma_cdna3);
    amd_default("gfx942", "moe_gemm_up", "glm5.2", 4096, 3, mfma_cdna3);
}

/* ---- compile-only: NVIDIA ----------------------------------------------- */

/* A fresh compile cache under $TMPDIR for this test process, so the PTX
 * comes from NVRTC and not from an entry cached before PTX was kept. */
static void fresh_cache(char *dir, size_t cap)
{
    tmp_dir_make(dir, cap, "mt_ptx_cache");
    cr_assert_eq(setenv("MOETUNE_CACHE", dir, 1), 0);
}

/* Builds the default of fname at shape and M for sm_90 and checks its PTX:
 * mma.sync (or wgmma), no local memory; ptxas: no stack, no spills.
 * Fills the compile-cache key and whether the compile was a cache hit. */
static void nv_default(dev_device *d, const char *fname, const char *shape, int64_t m,
                       char key_out[65], bool *hit)
{
    const kern_family *f = fam(fname);
    kern_shape s;
    kern_config c;
    default_at(f, shape, m, dev_get_props(d), &s, &c);
    char key[256];
    kern_config_key(f->gpu, &c, key, sizeof key);
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const char *kname = kernel_of(fname);
    const dev_kernel_res *r = td_find_res(code, kname);
    cr_assert_eq(r->private_bytes, 0, "sm_90 %s %s: %lld bytes of stack", fname, key,
                 (long long)r->private_bytes);
    cr_assert_eq(r->spill_vgprs, 0, "sm_90 %s %s: spills", fname, key);
    const char *ptx = dev_code_get_text(code);
    cr_assert_not_null(ptx, "sm_90 %s: no PTX with the cubin", fname);
    dev_ptx_report *rep = malloc(sizeof *rep);
    cr_assert_not_null(rep);
    dev_ptx_parse(ptx, rep);
    const dev_ptx_func *fn = dev_ptx_find(rep, kname);
    cr_assert_not_null(fn, "sm_90 %s: no .entry %s in the PTX", key, kname);
    cr_assert_gt(fn->mma, 0, "sm_90 %s %s: no mma.sync or wgmma in the PTX", fname, key);
    for (int i = 0; i < fn->n_mma_kinds; i++)
        cr_assert(!strncmp(fn->mma_kind[i], "mma.sync", 8) ||
                      !strncmp(fn->mma_kind[i], "wgmma", 5),
                  "%s: %s", fname, fn->mma_kind[i]);
    cr_assert_eq(fn->local, 0, "sm_90 %s %s: %d local loads/stores", fname, key, fn->local);
    cr_log_info("sm_90 %s %s M=%lld %s: PTX %d instructions, %d %s, %d fma, %d other ALU, "
                "%d shared loads; %d registers, %lld bytes shared", fname, shape, (long long)m,
                key, fn->total, fn->mma, fn->mma_kind[0], fn->fma, fn->alu, fn->ld_shared,
                r->vgprs, (long long)r->lds_bytes);
    free(rep);
    snprintf(key_out, 65, "%s", dev_code_get_info(code)->key);
    *hit = dev_code_get_info(code)->cache_hit;
    dev_code_free(code);
}

Test(mma_defaults, nvrtc_sm90_defaults_have_mma_sync_in_the_cached_ptx, .timeout = 300)
{
    char dir[512];
    dev_device *d = mma_open_or_skip("cuda", "sm_90");
    fresh_cache(dir, sizeof dir);
    char key[65];
    bool hit;
    nv_default(d, "gemm", "glm5.2-q_a", 256, key, &hit);
    nv_default(d, "moe_gemm_up", "glm5.2", 4096, key, &hit);
    nv_default(d, "moe_gemm_down", "glm5.2", 256, key, &hit);
    cr_assert_not(hit, "a fresh cache hit");
    /* The last one's PTX sits beside its cubin, and a cache hit reads it. */
    char ptx_path[1024], bin_path[1024];
    snprintf(ptx_path, sizeof ptx_path, "%s/cuda/%.2s/%s.ptx", dir, key, key);
    snprintf(bin_path, sizeof bin_path, "%s/cuda/%.2s/%s.bin", dir, key, key);
    struct stat st;
    cr_assert_eq(stat(bin_path, &st), 0, "no cubin at %s", bin_path);
    cr_assert_eq(stat(ptx_path, &st), 0, "no PTX at %s", ptx_path);
    cr_assert_gt(st.st_size, 0);
    char again[65];
    nv_default(d, "moe_gemm_down", "glm5.2", 256, again, &hit); /* PTX from the file */
    cr_assert(hit, "the second compile was not a cache hit");
    cr_assert_str_eq(again, key);
    dev_close(d);
}
