/* test_mma_util.h: checks shared by the matrix-core tests (test_moe_mma,
 * test_attn_mma, test_indexer_mma, test_prefill_mma): run configs on emu
 * against the family's reference (mma_check_on); open a compile-only
 * device or skip, and build one config for an AMD arch, asserting no
 * scratch and no spills in the kernel and, where llvm-objdump exists, that
 * its disassembly uses the expected matrix instruction and no other
 * (device/isa_mix.h), logging the mix. */
#ifndef MT_TEST_MMA_UTIL_H
#define MT_TEST_MMA_UTIL_H

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <inttypes.h>

#include "common/rng.h"
#include "device/device.h"
#include "device/hip/isa_mix.h"
#include "kernels/core/exec.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"
#include "test_dev_util.h"

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
    if (st == MT_E_UNSUPPORTED || st == MT_E_NOT_FOUND)
        cr_skip_test("%s %s: %s", spec, arch, err.msg);
    cr_assert_eq(st, MT_OK, "dev_open(%s, arch %s): %s", spec, arch, err.msg);
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

#endif
