/* test_mma_util.h: checks shared by the matrix-core tests (test_moe_mma,
 * test_attn_mma, test_indexer_mma, test_prefill_mma): run configs on emu
 * against the family's reference (mma_check_on); expect configs valid or
 * refused for a reason that names the parameter at fault, on a fixed set
 * of devices (mma_expect_each); open a compile-only device or skip, and
 * build one config for an AMD arch, asserting no scratch and no spills in
 * the kernel and, where llvm-objdump exists, that its disassembly uses the
 * expected matrix instruction and no other (device/isa_mix.h), logging the
 * mix (mma_compile_amd, mma_compile_amd_each); build one for sm_90 with
 * NVRTC (mma_compile_nv); compile a family's fp8 default (MMA=3) for
 * gfx942 and report its hot loop (mma_fp8_gfx942) or for sm_90 and check
 * its PTX (mma_fp8_sm90). */
#ifndef MT_TEST_MMA_UTIL_H
#define MT_TEST_MMA_UTIL_H

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <inttypes.h>

#include "common/rng.h"
#include "device/cuda/ptx_mix.h"
#include "device/device.h"
#include "device/hip/isa_mix.h"
#include "kernels/core/exec.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"
#include "test_dev_util.h"

/* The built-in family `name`, or the test fails. */
static inline const kern_family *mma_family(const char *name)
{
    const kern_family *f = kern_family_find(name);
    cr_assert_not_null(f, "family %s", name);
    return f;
}

/* A config string of f's GPU implementation, parsed or the test fails. */
static inline void mma_parse(const kern_family *f, const char *text, kern_config *c)
{
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_config_parse(f->gpu, text, c, &err), MT_OK, "%s", err.msg);
}

/* A shape and M the emu checks run. */
typedef struct mma_case {
    const char *shape;
    int64_t m;
} mma_case;

/* Every (config, case) pair of f on device spec against the reference, with
 * a fresh seed per pair (printed on failure); each config must be valid. */
static inline void mma_check_on(const kern_family *f, const char *spec, const char *const *cfgs,
                                int ncfg, const mma_case *cases, int ncase)
{
    dev_device *d = td_open(spec, NULL);
    uint64_t seed = mt_seed_fresh();
    for (int i = 0; i < ncfg; i++) {
        kern_config c;
        mma_parse(f, cfgs[i], &c);
        for (int k = 0; k < ncase; k++) {
            kern_shape s;
            cr_assert_eq(kern_shape_parse(f, cases[k].shape, &s, NULL, NULL), MT_OK);
            char why[256] = "";
            cr_assert(kern_config_valid(f, f->gpu, &s, cases[k].m, &c, dev_get_props(d), why,
                                        sizeof why),
                      "%s %s %s: %s", spec, cfgs[i], cases[k].shape, why);
            uint64_t sd = seed + (uint64_t)(i * 16 + k);
            mt_err err = MT_ERR_INIT;
            mt_status st = kern_check_one(d, f, cases[k].shape, cases[k].m, &c, sd, &err);
            cr_expect_eq(st, MT_OK, "%s %s, %s M=%" PRId64 " (seed %" PRIu64 "): %s", spec,
                         cfgs[i], cases[k].shape, cases[k].m, sd, err.msg);
        }
    }
    dev_close(d);
}

static inline dev_device *mma_open_or_skip(const char *spec, const char *arch)
{
    dev_open_opts o = {.arch = arch};
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_open(spec, &o, &d, &err);
    const char *a = arch ? arch : "(the device's)";
    if (st == MT_E_UNSUPPORTED || st == MT_E_NOT_FOUND)
        cr_skip_test("%s %s: %s", spec, a, err.msg);
    cr_assert_eq(st, MT_OK, "dev_open(%s, arch %s): %s", spec, a, err.msg);
    return d;
}

/* Builds f's GPU implementation at shape and M with cfg_text for arch
 * (hip, compile-only here) and checks kernel `kernel`: no scratch, no
 * spills, and in its disassembly matrix instructions that all start with
 * `mfma` (the expected one, no other), no scratch instruction. $MOETUNE_DUMP_DIR keeps the code
 * object for a closer look. */
static inline void mma_compile_amd(const kern_family *f, const char *kernel, const char *arch,
                                   const char *shape, int64_t m, const char *cfg_text,
                                   const char *mfma)
{
    dev_device *d = mma_open_or_skip("hip", arch);
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, shape, &s, NULL, NULL), MT_OK, "%s", shape);
    kern_config c;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_config_parse(f->gpu, cfg_text, &c, &err), MT_OK, "%s", err.msg);
    char why[256] = "";
    cr_assert(kern_config_valid(f, f->gpu, &s, m, &c, dev_get_props(d), why, sizeof why),
              "%s %s: %s", arch, cfg_text, why);
    dev_code *code = NULL;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *r = td_find_res(code, kernel);
    size_t len = 0;
    const void *bytes = dev_code_get_bytes(code, &len);
    const char *dump = getenv("MOETUNE_DUMP_DIR");
    if (dump && *dump) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s-%s-%s-M%lld-%.40s.co", dump, arch, kernel, shape,
                 (long long)m, cfg_text);
        FILE *fp = fopen(path, "wb");
        if (fp) {
            fwrite(bytes, 1, len, fp);
            fclose(fp);
        }
    }
    cr_assert_eq(r->private_bytes, 0, "%s %s: %lld bytes of scratch", arch, cfg_text,
                 (long long)r->private_bytes);
    cr_assert_eq(r->spill_vgprs, 0, "%s %s: %d VGPRs spilled", arch, cfg_text, r->spill_vgprs);
    cr_assert_eq(r->spill_sgprs, 0);
    dev_isa_report *rep = malloc(sizeof *rep);
    cr_assert_not_null(rep);
    mt_status st = dev_isa_mix(bytes, len, arch, rep, &err);
    if (st == MT_OK) {
        const dev_isa_func *fn = dev_isa_find(rep, kernel);
        cr_assert_not_null(fn, "%s %s: no %s in the disassembly", arch, cfg_text, kernel);
        cr_assert_gt(fn->n_mma_kinds, 0, "%s %s: no %s in %s", arch, cfg_text, mfma, kernel);
        for (int i = 0; i < fn->n_mma_kinds; i++)
            cr_assert(!strncmp(fn->mma_kind[i], mfma, strlen(mfma)),
                      "%s %s: matrix instruction %s, not %s", arch, cfg_text, fn->mma_kind[i],
                      mfma);
        cr_assert_eq(fn->all.n[DEV_ISA_SCRATCH], 0, "%s %s: %d scratch instructions", arch,
                     cfg_text, fn->all.n[DEV_ISA_SCRATCH]);
        const dev_isa_counts *h = fn->hot >= 0 ? &fn->loops[fn->hot].c : &fn->all;
        cr_log_info("%s %s %s M=%lld %s: %d instructions, %d %s; hot loop: %d mfma, %d VALU, "
                    "%d SALU, %d global loads, %d LDS reads, %d LDS writes; VGPR %d AGPR %d "
                    "SGPR %d LDS %lld waves/SIMD %d", arch, kernel, shape, (long long)m,
                    cfg_text, fn->all.total, fn->mma_kind_n[0], mfma, h->n[DEV_ISA_MFMA],
                    h->n[DEV_ISA_VALU], h->n[DEV_ISA_SALU], h->n[DEV_ISA_GLOBAL_LOAD],
                    h->n[DEV_ISA_LDS_READ], h->n[DEV_ISA_LDS_WRITE], r->vgprs, r->agprs,
                    r->sgprs, (long long)r->lds_bytes, r->waves_per_simd);
    } else {
        cr_assert_eq(st, MT_E_UNSUPPORTED, "%s", err.msg); /* no llvm-objdump here */
        cr_log_info("%s %s: instruction mix not checked: %s", arch, cfg_text, err.msg);
    }
    free(rep);
    dev_code_free(code);
    dev_close(d);
}

/* Each build of b[0..n): mma_compile_amd of f's kernel `kernel` at M = m,
 * in order. */
typedef struct mma_build {
    const char *arch, *shape, *cfg, *mfma;
} mma_build;

static inline void mma_compile_amd_each(const kern_family *f, const char *kernel, int64_t m,
                                        const mma_build *b, int n)
{
    for (int i = 0; i < n; i++)
        mma_compile_amd(f, kernel, b[i].arch, b[i].shape, m, b[i].cfg, b[i].mfma);
}

/* Builds f's GPU implementation at shape and M with cfg_text for sm_90
 * (NVRTC, compile-only here; skipped without it) and logs kernel
 * `kernel`'s registers, shared and local memory; with no_local, asserts it
 * uses no local memory. NVRTC's cubin has no disassembler here: the MMA
 * kernels cannot compile without mma.sync (their sources #error without
 * MT_MMA_HAVE). */
static inline void mma_compile_nv(const kern_family *f, const char *kernel, const char *shape,
                                  int64_t m, const char *cfg_text, bool no_local)
{
    dev_device *d = mma_open_or_skip("cuda", "sm_90");
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, shape, &s, NULL, NULL), MT_OK, "%s", shape);
    kern_config c;
    mma_parse(f, cfg_text, &c);
    char why[256] = "";
    cr_assert(kern_config_valid(f, f->gpu, &s, m, &c, dev_get_props(d), why, sizeof why),
              "sm_90 %s: %s", cfg_text, why);
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *r = td_find_res(code, kernel);
    if (no_local)
        cr_assert_eq(r->private_bytes, 0, "sm_90 %s %s %s: %lld bytes of local memory per lane",
                     kernel, shape, cfg_text, (long long)r->private_bytes);
    cr_log_info("sm_90 %s %s %s: %d registers, %lld bytes shared, %lld bytes local", kernel,
                shape, cfg_text, r->vgprs, (long long)r->lds_bytes, (long long)r->private_bytes);
    dev_code_free(code);
    dev_close(d);
}

/* ---- validity ------------------------------------------------------------ */

/* The devices the validity tests ask about (mma_test_devs): emu at both
 * wave sizes; RDNA (no MFMA) and Turing (no bf16 mma.sync); an H200
 * (sm_90: 227 KB of shared memory, 48 KB of it static) and an MI300
 * (gfx942: 64 KB). */
enum { MMA_EMU32, MMA_EMU64, MMA_GFX1030, MMA_SM75, MMA_H200, MMA_MI300, MMA_NDEVS };

static inline void mma_test_devs(dev_props d[MMA_NDEVS])
{
    d[MMA_EMU32] = (dev_props){.backend = DEV_BACKEND_EMU, .warp_size = 32, .arch = "emu",
                               .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                               .static_shared_per_block = 65536};
    d[MMA_EMU64] = d[MMA_EMU32];
    d[MMA_EMU64].warp_size = 64;
    d[MMA_GFX1030] = (dev_props){.backend = DEV_BACKEND_HIP, .warp_size = 32, .arch = "gfx1030",
                                 .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                                 .static_shared_per_block = 65536};
    d[MMA_SM75] = (dev_props){.backend = DEV_BACKEND_CUDA, .warp_size = 32, .arch = "sm_75",
                              .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                              .static_shared_per_block = 49152};
    d[MMA_H200] = d[MMA_SM75];
    snprintf(d[MMA_H200].arch, sizeof d[MMA_H200].arch, "sm_90");
    d[MMA_H200].shared_mem_per_block = 232448;
    d[MMA_MI300] = (dev_props){.backend = DEV_BACKEND_HIP, .warp_size = 64, .arch = "gfx942",
                               .max_threads_per_block = 1024, .shared_mem_per_block = 65536,
                               .static_shared_per_block = 65536};
}

/* Whether config cfg of f's GPU implementation is valid at shape and M = m
 * on p, the reason in why; a shape or config that does not parse fails
 * the test. */
static inline bool mma_valid_on(const kern_family *f, const char *shape, int64_t m,
                                const char *cfg, const dev_props *p, char *why, size_t cap)
{
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, shape, &s, NULL, NULL), MT_OK);
    kern_config c;
    mma_parse(f, cfg, &c);
    why[0] = 0;
    return kern_config_valid(f, f->gpu, &s, m, &c, p, why, cap);
}

/* One expectation: cfg at shape on the device dev (MMA_*) is valid
 * (names NULL), or refused with a reason that contains names. */
typedef struct mma_expect {
    const char *shape, *cfg;
    int dev;
    const char *names;
} mma_expect;

/* Checks each expectation of e[0..n) for f at M = m (cr_expect: all are
 * checked, each failure reported). */
static inline void mma_expect_each(const kern_family *f, int64_t m, const mma_expect *e, int n)
{
    dev_props d[MMA_NDEVS];
    mma_test_devs(d);
    for (int i = 0; i < n; i++) {
        const dev_props *p = &d[e[i].dev];
        char why[256];
        bool ok = mma_valid_on(f, e[i].shape, m, e[i].cfg, p, why, sizeof why);
        if (!e[i].names) {
            cr_expect(ok, "%s %s %s on %s: %s", f->name, e[i].shape, e[i].cfg, p->arch, why);
            continue;
        }
        cr_expect_not(ok, "%s %s %s on %s is valid", f->name, e[i].shape, e[i].cfg, p->arch);
        cr_expect(strstr(why, e[i].names) != NULL, "%s %s %s: reason '%s' does not name %s",
                  f->name, e[i].shape, e[i].cfg, why, e[i].names);
    }
}

/* mma_valid_on on the device spec (arch: compile-only, NULL: emu's). */
static inline bool mma_valid_spec(const char *fname, const char *shape, int64_t m,
                                  const char *cfg, const char *spec, const char *arch, char *why,
                                  size_t cap)
{
    dev_device *d = mma_open_or_skip(spec, arch);
    bool ok = mma_valid_on(mma_family(fname), shape, m, cfg, dev_get_props(d), why, cap);
    dev_close(d);
    return ok;
}

/* The default config of f's GPU side at shape and M = m on p, which must be
 * the fp8 path (MMA=3); its key in key. */
static inline void mma_fp8_default(const kern_family *f, const char *shape, int64_t m,
                                   const dev_props *p, kern_shape *s, kern_config *c, char *key,
                                   size_t cap)
{
    cr_assert_eq(kern_shape_parse(f, shape, s, NULL, NULL), MT_OK);
    memset(c, 0, sizeof *c);
    f->gpu->default_config(s, m, p, c);
    kern_config_key(f->gpu, c, key, cap);
    cr_assert_eq(kern_config_get(f->gpu, c, "MMA", -1), 3, "%s %s M=%lld: default %s", f->name,
                 shape, (long long)m, key);
}

/* What mma_fp8_gfx942 read from a kernel's code object. */
typedef struct mma_gfx942 {
    char key[256];    /* the default config */
    int mfma, valu;   /* the hot loop's matrix and VALU instructions */
    int vm0;          /* s_waitcnt vmcnt(0) ahead of its first MFMA */
    int waves_regs;   /* waves per SIMD the registers allow */
    int waves_lds;    /* ... and the LDS (blocks a CU x WAVES / 4) */
    int vgprs, agprs;
    int64_t lds_bytes;
} mma_gfx942;

/* Builds family fname's fp8 default at shape and M = m for gfx942 and fills
 * *o for kernel: the kernel has no scratch and no spills, and every matrix
 * instruction of it is an fp8 one, the hot loop has some. Skips where
 * clang-19 or llvm-objdump is absent. */
static inline void mma_fp8_gfx942(const char *fname, const char *kernel, const char *shape,
                                  int64_t m, mma_gfx942 *o)
{
    const kern_family *f = mma_family(fname);
    dev_device *d = mma_open_or_skip("hip", "gfx942");
    kern_shape s;
    kern_config c;
    mma_fp8_default(f, shape, m, dev_get_props(d), &s, &c, o->key, sizeof o->key);
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *r = td_find_res(code, kernel);
    cr_assert_eq(r->private_bytes, 0, "%s %s: scratch", fname, o->key);
    cr_assert_eq(r->spill_vgprs, 0, "%s %s: spills", fname, o->key);
    int waves = kern_config_get(f->gpu, &c, "WAVES", 1);
    o->waves_lds = (int)((r->lds_bytes ? 65536 / r->lds_bytes : 64) * waves / 4);
    o->waves_regs = r->waves_per_simd;
    o->vgprs = r->vgprs;
    o->agprs = r->agprs;
    o->lds_bytes = r->lds_bytes;
    size_t len = 0;
    const void *bytes = dev_code_get_bytes(code, &len);
    dev_isa_report *rep = malloc(sizeof *rep);
    cr_assert_not_null(rep);
    mt_status st = dev_isa_mix(bytes, len, "gfx942", rep, &err);
    if (st != MT_OK) {
        free(rep);
        dev_code_free(code);
        dev_close(d);
        cr_assert_eq(st, MT_E_UNSUPPORTED, "%s", err.msg);
        cr_skip_test("no llvm-objdump: %s", err.msg);
    }
    const dev_isa_func *fn = dev_isa_find(rep, kernel);
    cr_assert_not_null(fn);
    cr_assert_geq(fn->hot, 0);
    const dev_isa_loop *h = &fn->loops[fn->hot];
    o->mfma = h->c.n[DEV_ISA_MFMA];
    o->valu = h->c.n[DEV_ISA_VALU];
    o->vm0 = h->vm0_before_mma;
    cr_assert_gt(o->mfma, 0, "%s %s: no matrix instruction in the hot loop", fname, o->key);
    for (int i = 0; i < fn->n_mma_kinds; i++)
        cr_assert(strstr(fn->mma_kind[i], "fp8"), "%s %s: %s", fname, o->key, fn->mma_kind[i]);
    cr_log_info("gfx942 %s %s M=%lld %s: hot loop %d MFMA, %d VALU (%.2f per MFMA), vmcnt(0) "
                "ahead %d; VGPR %d AGPR %d, waves/SIMD %d by registers, %d by LDS (%lld B)",
                kernel, shape, (long long)m, o->key, o->mfma, o->valu,
                (double)o->valu / o->mfma, o->vm0, o->vgprs, o->agprs, o->waves_regs,
                o->waves_lds, (long long)o->lds_bytes);
    free(rep);
    dev_code_free(code);
    dev_close(d);
}

/* Builds family fname's fp8 default at shape and M = m for sm_90 (NVRTC,
 * compile-only) and checks kernel's PTX: e4m3 mma.sync only, no local
 * memory, and where copies is set ldmatrix and cp.async. Skips without
 * NVRTC. */
static inline void mma_fp8_sm90(const char *fname, const char *kernel, const char *shape,
                                int64_t m, bool copies)
{
    const kern_family *f = mma_family(fname);
    dev_device *d = mma_open_or_skip("cuda", "sm_90");
    kern_shape s;
    kern_config c;
    char key[256];
    mma_fp8_default(f, shape, m, dev_get_props(d), &s, &c, key, sizeof key);
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
    const dev_kernel_res *r = td_find_res(code, kernel);
    cr_assert_eq(r->private_bytes, 0, "sm_90 %s %s: %lld bytes of stack", kernel, key,
                 (long long)r->private_bytes);
    const char *ptx = dev_code_get_text(code);
    cr_assert_not_null(ptx);
    dev_ptx_report *rep = malloc(sizeof *rep);
    cr_assert_not_null(rep);
    dev_ptx_parse(ptx, rep);
    const dev_ptx_func *fn = dev_ptx_find(rep, kernel);
    cr_assert_not_null(fn);
    cr_assert_gt(fn->mma, 0);
    for (int i = 0; i < fn->n_mma_kinds; i++)
        cr_assert(strstr(fn->mma_kind[i], "e4m3"), "sm_90 %s: %s", kernel, fn->mma_kind[i]);
    if (copies) {
        cr_assert_gt(fn->ldmatrix, 0, "sm_90 %s %s: no ldmatrix", kernel, key);
        cr_assert_gt(fn->cp_async, 0, "sm_90 %s %s: no cp.async", kernel, key);
    }
    cr_assert_eq(fn->local, 0, "sm_90 %s %s: local memory", kernel, key);
    cr_log_info("sm_90 %s %s M=%lld %s: %d %s, %d ldmatrix, %d cp.async, %d registers", kernel,
                shape, (long long)m, key, fn->mma, fn->mma_kind[0], fn->ldmatrix, fn->cp_async,
                r->vgprs);
    free(rep);
    dev_code_free(code);
    dev_close(d);
}

#endif
