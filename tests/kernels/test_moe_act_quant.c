/* test_moe_act_quant.c: a4w4 activations quantized once, before the MoE
 * GEMMs (moe_act_quant in kernels/src/moe_gemm.hip), and read packed by
 * every GPU path (scalar tile, MMA fragments, GEMV decode) on emu wave64
 * and wave32. The quantization is deterministic, so the a4w4 result
 * must be bit for bit the a16w4 kernel's (same config) on activations
 * replaced by their MXFP4 round trip (kernels/mxfp4.h, the host rule):
 * that is the math the kernels did before, when every N tile re-quantized.
 * Rows are planted with rounding ties, blocks whose scales take the
 * decoder's slow path (codes below 5 and code 0), all-zero blocks, -0 and
 * large blocks; the rest are random on a fresh seed. Each a4w4 config is
 * also checked against the plain C reference on the unplanted inputs. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "device/device.h"
#include "kernels/core/exec.h"
#include "kernels/core/family.h"
#include "common/mxfp4.h"
#include "kernels/core/runner.h"
#include "test_dev_util.h"

/* Index of the buffer called name in problem p (the test fails without it). */
static int buf_index(kern_problem *p, const char *name)
{
    for (int i = 0; i < kern_problem_n_bufs(p); i++)
        if (!strcmp(kern_problem_buf(p, i)->name, name))
            return i;
    cr_assert_fail("no buffer %s", name);
    return -1;
}

/* Overwrites the first blocks of the activation rows with hard cases for
 * the "even" rule and the decoder: rounding ties at scale 1, negative
 * values that round to zero, -0, scales 2^-124 .. 2^-130 (codes 4 and 0,
 * the decoder's per-element path), an all-zero block and a block scaled by
 * 2^24. rows x k bf16. */
static void plant(uint16_t *x, int64_t rows, int64_t k)
{
    static const float ties[32] = {6.0f,  0.25f,  -0.25f, 0.75f,  -0.75f, 1.25f, -1.25f, 1.75f,
                                   -1.75f, 2.5f,  -2.5f,  3.5f,   -3.5f,  5.0f,  -5.0f,  -0.1f,
                                   -0.0f, 0.125f, 2.25f,  -2.75f, 4.5f,   -5.5f, 0.5f,   -1.0f,
                                   1.5f,  -2.0f,  3.0f,   -4.0f,  -6.0f,  0.3f,  -0.7f,  1.1f};
    const float scales[] = {1.0f, ldexpf(1.0f, -124), ldexpf(1.0f, -130), 0.0f,
                            ldexpf(1.0f, 24)};
    const int nscales = (int)(sizeof scales / sizeof scales[0]);
    for (int64_t r = 0; r < rows && r < 2 * nscales; r++)
        for (int b = 0; b < 2 && 32 * b < k; b++) {
            float sc = scales[(r + b) % nscales];
            for (int i = 0; i < 32; i++)
                x[r * k + 32 * b + i] = mt_f32_to_bf16(ties[(i + 5 * b) % 32] * sc);
        }
}

/* dst = the MXFP4 round trip of src (rows x k bf16), exact in bf16. */
static void roundtrip(const uint16_t *src, int64_t rows, int64_t k, uint16_t *dst)
{
    float *f = malloc(sizeof(float) * (size_t)k);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < k; i++)
            f[i] = mt_bf16_to_f32(src[r * k + i]);
        mxfp4_roundtrip_row(f, k, f);
        for (int64_t i = 0; i < k; i++) {
            dst[r * k + i] = mt_f32_to_bf16(f[i]);
            cr_assert(mt_bf16_to_f32(dst[r * k + i]) == f[i] || isnan(f[i]),
                      "round trip not exact in bf16 at row %" PRId64, r);
        }
    }
    free(f);
}

static kern_problem *problem(dev_device *d, const kern_family *f, const char *shape, int64_t m,
                             uint64_t seed)
{
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, shape, &s, NULL, NULL), MT_OK, "%s", shape);
    kern_problem *p = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_problem_create(d, f, &s, m, seed, &p, &err), MT_OK, "%s", err.msg);
    return p;
}

static kern_exec *open_exec(dev_device *d, const kern_family *f, kern_problem *p,
                            const char *cfg_text)
{
    kern_config c;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_config_parse(f->gpu, cfg_text, &c, &err), MT_OK, "%s", err.msg);
    char why[256] = "";
    cr_assert(kern_config_valid(f, f->gpu, kern_problem_shape(p), kern_problem_m(p), &c,
                                dev_get_props(d), why, sizeof why),
              "%s: %s", cfg_text, why);
    kern_exec *e = NULL;
    cr_assert_eq(kern_exec_open(d, f, kern_problem_shape(p), kern_problem_m(p), &c, &e, &err),
                 MT_OK, "%s: %s", cfg_text, err.msg);
    return e;
}

/* Runs e on p and downloads output buffer ob into a fresh allocation. */
static void *run_out(kern_problem *p, kern_exec *e, int ob)
{
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_problem_run(p, e, &err), MT_OK, "%s", err.msg);
    void *out = malloc(kern_problem_buf(p, ob)->bytes);
    cr_assert_eq(kern_problem_download(p, ob, out, &err), MT_OK, "%s", err.msg);
    return out;
}

/* One family on one device: for each config, the a4w4 problem (shape a4)
 * against the reference, then planted and compared bit for bit with the
 * a16w4 problem (shape a16, same seed, so the same routing and weights) on
 * the round-trip activations. in/out: the activation and output buffers'
 * names; out_is_f32 picks the poison pattern to look for. */
static void same_bits(const char *spec, const char *fname, const char *a4, const char *a16,
                      int64_t m, const char *in, const char *out, bool out_is_f32,
                      const char *const *cfgs, int ncfg)
{
    const kern_family *f = kern_family_find(fname);
    cr_assert_not_null(f);
    dev_device *d = td_open(spec, NULL);
    uint64_t seed = mt_seed_fresh();
    for (int c = 0; c < ncfg; c++) {
        uint64_t sd = seed + (uint64_t)c;
        kern_problem *pa = problem(d, f, a4, m, sd), *pb = problem(d, f, a16, m, sd);
        int ia = buf_index(pa, in), oa = buf_index(pa, out);
        int ib = buf_index(pb, in), ob = buf_index(pb, out);
        kern_exec *ea = open_exec(d, f, pa, cfgs[c]), *eb = open_exec(d, f, pb, cfgs[c]);
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(kern_problem_run(pa, ea, &err), MT_OK, "%s", err.msg);
        cr_expect_eq(kern_problem_verify(pa, &err), MT_OK, "%s %s %s (seed %" PRIu64 "): %s",
                     spec, fname, cfgs[c], sd, err.msg);

        const kern_buf_desc *bx = kern_problem_buf(pa, ia);
        int64_t k = bx->row, rows = (int64_t)bx->bytes / 2 / k;
        cr_assert_eq(kern_problem_buf(pb, ib)->bytes, bx->bytes);
        uint16_t *x = malloc(bx->bytes), *xr = malloc(bx->bytes);
        memcpy(x, kern_problem_host(pa)[ia], bx->bytes);
        plant(x, rows, k);
        roundtrip(x, rows, k, xr);
        cr_assert_eq(dev_copy_to(d, kern_problem_dev(pa)[ia], x, bx->bytes, &err), MT_OK);
        cr_assert_eq(dev_copy_to(d, kern_problem_dev(pb)[ib], xr, bx->bytes, &err), MT_OK);

        void *ya = run_out(pa, ea, oa), *yb = run_out(pb, eb, ob);
        size_t n = kern_problem_buf(pa, oa)->bytes, esz = out_is_f32 ? 4 : 2;
        for (size_t i = 0; i < n / esz; i++) {
            const unsigned char *a = (const unsigned char *)ya + i * esz;
            const unsigned char *b = (const unsigned char *)yb + i * esz;
            static const unsigned char poison[4] = {0xff, 0xff, 0xff, 0xff};
            cr_assert(memcmp(a, poison, esz), "%s %s %s: element %zu not written", spec, fname,
                      cfgs[c], i);
            cr_assert(!memcmp(a, b, esz),
                      "%s %s %s (seed %" PRIu64 "): element %zu (row %zu) differs from a16w4 "
                      "on the round trip",
                      spec, fname, cfgs[c], sd, i, i / (size_t)kern_problem_buf(pa, oa)->row);
        }
        free(ya);
        free(yb);
        free(x);
        free(xr);
        kern_exec_close(ea);
        kern_exec_close(eb);
        kern_problem_destroy(pa);
        kern_problem_destroy(pb);
    }
    dev_close(d);
}

#define UP_A4 "H=256,I=128,E=16,topk=4,a=mxfp4,cat=1,bm=64,skew=2"
#define UP_A16 "H=256,I=128,E=16,topk=4,a=bf16,cat=1,bm=64,skew=2"
#define DOWN_A4 "H=256,I=128,E=16,topk=4,a=mxfp4,comb=1,bm=64,skew=2"
#define DOWN_A16 "H=256,I=128,E=16,topk=4,a=bf16,comb=1,bm=64,skew=2"
#define GEMV_FIX "BM=16,BK=32,STAGES=1,GROUP_M=1,VEC=1,MMA=0,"

/* One config per staging path (the a4w4 difference is all in staging):
 * the 16-row MMA tile and the GEMV pass (split K, R=2) on wave64, the
 * scalar tile and GEMV R=1 on wave32. Few configs: each is an emu compile
 * per shape when the cache is cold (the MMA one is test_moe_mma's). */
static const char *const wave64_cfgs[] = {
    "BM=32,BN=64,BK=64,WAVES=4,STAGES=2,SPLITK=1,GROUP_M=4,VEC=8,UNROLL=1,MMA=1,GEMV=0",
    GEMV_FIX "BN=32,WAVES=4,SPLITK=2,UNROLL=2,GEMV=2",
};
static const char *const wave32_cfgs[] = {
    "BM=32,BN=32,BK=64,WAVES=2,STAGES=1,SPLITK=1,GROUP_M=8,VEC=4,UNROLL=1,MMA=0,GEMV=0",
    GEMV_FIX "BN=16,WAVES=4,SPLITK=1,UNROLL=1,GEMV=1",
};

Test(moe_act_quant, up_a4w4_is_a16w4_on_the_round_trip_wave64, .timeout = 300)
{
    same_bits("emu:wave64", "moe_gemm_up", UP_A4, UP_A16, 13, "x", "h", false, wave64_cfgs, 2);
}

Test(moe_act_quant, down_a4w4_is_a16w4_on_the_round_trip_wave64, .timeout = 300)
{
    same_bits("emu:wave64", "moe_gemm_down", DOWN_A4, DOWN_A16, 13, "h", "rows", true,
              wave64_cfgs, 2);
}

Test(moe_act_quant, both_stages_on_wave32, .timeout = 300)
{
    same_bits("emu:wave32", "moe_gemm_up", UP_A4, UP_A16, 13, "x", "h", false, wave32_cfgs, 2);
    same_bits("emu:wave32", "moe_gemm_down", DOWN_A4, DOWN_A16, 13, "h", "rows", true,
              wave32_cfgs, 2);
}
