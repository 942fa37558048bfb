/* test_mxfp4.c: MXFP4 host utilities against the OCP spec: the E2M1 value
 * table, E8M0 edge codes, Quark's nibble order, pack/unpack round trips,
 * round-half-to-even on the E2M1 grid, saturation, and the "even" scale
 * rule (amax rounded up at the mantissa's top bits) including blocks whose
 * amax mantissa is >= 1.75; and the kernel preludes' mt_f32_to_e2m1 (cpu
 * prelude on the cpu backend, GPU prelude on emu) against the host encoder
 * on every float of magnitude 2^-2 .. 8, the float edge cases and a stride
 * through all 2^32 bit patterns. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "device/device.h"
#include "common/mxfp4.h"
#include "test_dev_util.h"

Test(mxfp4, e2m1_codes_decode_to_the_spec_table)
{
    const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (unsigned c = 0; c < 16; c++) {
        cr_expect_eq(mxfp4_e2m1_decode(c), want[c], "code %u", c);
        cr_expect_eq(!!signbit(mxfp4_e2m1_decode(c)), c >= 8, "sign of code %u", c);
    }
}

Test(mxfp4, e2m1_encode_is_exact_on_grid_and_saturates)
{
    for (unsigned c = 1; c < 16; c++) {
        if (c == 8)
            continue;
        cr_expect_eq(mxfp4_e2m1_encode(mxfp4_e2m1_decode(c)), c, "code %u", c);
    }
    cr_expect_eq(mxfp4_e2m1_encode(7.0f), 7u);
    cr_expect_eq(mxfp4_e2m1_encode(1e30f), 7u);
    cr_expect_eq(mxfp4_e2m1_encode(-INFINITY), 15u);
    cr_expect_eq(mxfp4_e2m1_encode(-0.0f), 0u, "zero magnitude is always code 0");
    cr_expect_eq(mxfp4_e2m1_encode(-0.2f), 0u);
    cr_expect_eq(mxfp4_e2m1_encode(NAN), 0u);
}

Test(mxfp4, e2m1_midpoints_round_to_the_even_code)
{
    /* midpoint -> code with mantissa bit 0 */
    const struct { float v; unsigned c; } t[] = {
        {0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6},
        {-0.75f, 10}, {-5.0f, 14},
        {0.2500001f, 1}, {0.7499999f, 1}, {1.2500001f, 3}, {4.9999995f, 6}, {5.0000005f, 7},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        cr_expect_eq(mxfp4_e2m1_encode(t[i].v), t[i].c, "encode(%.9g) = %u, want %u", t[i].v,
                     mxfp4_e2m1_encode(t[i].v), t[i].c);
}

Test(mxfp4, e2m1_encode_matches_brute_force_nearest_even)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    for (int i = 0; i < 100000; i++) {
        float v = mt_rng_uniform(&r, -7.5f, 7.5f);
        if (i % 3 == 0) /* exact quarter steps: many ties */
            v = (float)((int)mt_rng_below(&r, 61) - 30) * 0.25f;
        unsigned best = 0;
        float bd = INFINITY;
        for (unsigned c = 0; c < 8; c++) {
            float d = fabsf(fabsf(v) - mxfp4_e2m1_decode(c));
            if (d < bd || (d == bd && (c & 1) == 0 && (best & 1))) {
                bd = d;
                best = c;
            }
        }
        if (best && v < 0)
            best |= 8;
        cr_assert_eq(mxfp4_e2m1_encode(v), best, "v=%.9g (seed %llu)", v,
                     (unsigned long long)seed);
    }
}

Test(mxfp4, e8m0_edge_codes)
{
    cr_expect_eq(mxfp4_e8m0_decode(127), 1.0f);
    cr_expect_eq(mxfp4_e8m0_decode(128), 2.0f);
    cr_expect_eq(mxfp4_e8m0_decode(254), ldexpf(1.0f, 127));
    cr_expect_eq(mxfp4_e8m0_decode(0), ldexpf(1.0f, -127), "code 0 is 2^-127 (subnormal)");
    cr_expect(fpclassify(mxfp4_e8m0_decode(0)) == FP_SUBNORMAL);
    cr_expect(isnan(mxfp4_e8m0_decode(0xff)), "0xFF is NaN");
    for (unsigned c = 1; c < 255; c++)
        cr_expect_eq(mxfp4_e8m0_decode(c), ldexpf(1.0f, (int)c - 127), "code %u", c);
}

Test(mxfp4, nibble_order_is_low_first)
{
    uint8_t codes[4] = {0x1, 0xA, 0x7, 0x8}, packed[2], back[4];
    mxfp4_pack(codes, 4, packed);
    cr_expect_eq(packed[0], 0xA1, "element 0 low nibble, element 1 high");
    cr_expect_eq(packed[1], 0x87);
    mxfp4_unpack(packed, 4, back);
    cr_expect_arr_eq(back, codes, 4);
    /* A dequantized row reads the same order. */
    uint8_t scale = 127;
    uint8_t row[16] = {0x61};
    float out[32];
    mxfp4_dequantize_row(row, &scale, 32, out);
    cr_expect_eq(out[0], 0.5f);
    cr_expect_eq(out[1], 4.0f);
}

Test(mxfp4, pack_unpack_round_trip)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    uint8_t codes[256], packed[128], back[256], repacked[128];
    for (int i = 0; i < 256; i++)
        codes[i] = (uint8_t)mt_rng_below(&r, 16);
    mxfp4_pack(codes, 256, packed);
    mxfp4_unpack(packed, 256, back);
    cr_expect_arr_eq(back, codes, 256, "seed %llu", (unsigned long long)seed);
    mxfp4_pack(back, 256, repacked);
    cr_expect_arr_eq(repacked, packed, 128);
}

Test(mxfp4, even_scale_rule)
{
    /* amax 6 = 1.5 * 2^2: mantissa < 1.75, exponent 2 - 2 = 0 -> code 127 */
    cr_expect_eq(mxfp4_e8m0_from_amax(6.0f), 127u);
    /* amax 7 = 1.75 * 2^2 rounds up to 8: exponent 3 - 2 = 1 -> code 128
     * (floor(log2) - 2 would give 127 and saturate 7 to 6) */
    cr_expect_eq(mxfp4_e8m0_from_amax(7.0f), 128u);
    cr_expect_eq(mxfp4_e8m0_from_amax(6.99f), 127u);
    cr_expect_eq(mxfp4_e8m0_from_amax(1.0f), 125u);
    cr_expect_eq(mxfp4_e8m0_from_amax(0.0f), 0u, "zero block clamps to the smallest scale");
    cr_expect_eq(mxfp4_e8m0_from_amax(ldexpf(1.0f, 127)), 252u);
    cr_expect_eq(mxfp4_e8m0_from_amax(INFINITY), 253u);
    cr_expect_eq(mxfp4_e8m0_from_amax(NAN), 0xffu);
    cr_expect_eq(mxfp4_e8m0_from_amax(ldexpf(1.0f, -140)), 0u);
}

Test(mxfp4, quantize_block_with_high_mantissa_amax)
{
    float x[32] = {0};
    x[0] = 7.0f; /* mantissa 1.75: scale 2^1 */
    x[1] = 3.0f;
    x[2] = -1.0f;
    x[3] = 5.0f; /* 5 / 2 = 2.5: tie between 2 and 3 -> 2 (even) -> 4.0 */
    uint8_t q[16], s;
    mxfp4_quantize_row(x, 32, q, &s);
    cr_expect_eq(s, 128);
    cr_expect_eq(q[0] & 15, 6, "7 / 2 = 3.5 rounds to 4 (code 6)");
    cr_expect_eq(q[0] >> 4, 3, "3 / 2 = 1.5 (code 3)");
    cr_expect_eq(q[1] & 15, 9, "-1 / 2 = -0.5 (code 9)");
    cr_expect_eq(q[1] >> 4, 4, "5 / 2 = 2.5 ties to 2 (code 4)");
    float back[32];
    mxfp4_dequantize_row(q, &s, 32, back);
    cr_expect_eq(back[0], 8.0f);
    cr_expect_eq(back[3], 4.0f);
}

Test(mxfp4, quantize_saturates_and_keeps_nan_blocks_apart)
{
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = 0.1f * (float)i;
    x[40] = NAN;
    uint8_t q[32], s[2];
    mxfp4_quantize_row(x, 64, q, s);
    cr_expect_eq(s[1], 0xff, "a block holding NaN gets the NaN scale");
    for (int i = 16; i < 32; i++)
        cr_expect_eq(q[i], 0);
    /* amax 3.1 = 1.55 * 2: scale 2^-1, 3.1 * 2 = 6.2 saturates to 6 */
    cr_expect_eq(s[0], 126);
    cr_expect_eq(q[15] >> 4, 7);
}

Test(mxfp4, quantize_random_rows_stay_within_half_a_step)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    float x[1024], y[1024];
    for (int i = 0; i < 1024; i++)
        x[i] = mt_rng_normal(&r) * ldexpf(1.0f, (int)mt_rng_below(&r, 20) - 10);
    mxfp4_roundtrip_row(x, 1024, y);
    for (int b = 0; b < 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b * 32 + i]));
        float scale = mxfp4_e8m0_decode(mxfp4_e8m0_from_amax(amax));
        for (int i = 0; i < 32; i++) {
            float v = x[b * 32 + i], q = y[b * 32 + i], a = fabsf(v) / scale;
            /* grid spacing at this magnitude: 0.5 below 2, 1 below 4, 2 above */
            float step = a < 2 ? 0.5f : a < 4 ? 1.0f : 2.0f;
            float err = fabsf(v - q) / scale;
            cr_assert(err <= step / 2 + 1e-6f || (a > 6 && fabsf(q) == 6 * scale),
                      "block %d elem %d: %g -> %g (scale %g, seed %llu)", b, i, v, q, scale,
                      (unsigned long long)seed);
        }
    }
}

/* ---- the preludes' mt_f32_to_e2m1 against mxfp4_e2m1_encode ------------ */

/* enc_list encodes n given floats; enc_range the n floats whose bit
 * patterns follow base (so no input buffer is needed for long sweeps). */
static const char enc_cpu_src[] =
    "MT_CPU_KERNEL void enc_list(const float *x, uint8_t *out, int32_t n)\n"
    "{\n"
    "    for (int32_t i = (int32_t)itemIdx.x * 4096; i < n && i < ((int32_t)itemIdx.x + 1) * 4096; i++)\n"
    "        out[i] = (uint8_t)mt_f32_to_e2m1(x[i]);\n"
    "}\n"
    "MT_CPU_KERNEL void enc_range(uint8_t *out, uint32_t base, int32_t n)\n"
    "{\n"
    "    for (int32_t i = (int32_t)itemIdx.x * 65536; i < n && i < ((int32_t)itemIdx.x + 1) * 65536; i++)\n"
    "        out[i] = (uint8_t)mt_f32_to_e2m1(mt_uint_as_float(base + (uint32_t)i));\n"
    "}\n";

static const char enc_gpu_src[] =
    "MT_KERNEL void enc_list(const float *x, unsigned char *out, int n)\n"
    "{\n"
    "    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)\n"
    "        out[i] = (unsigned char)mt_f32_to_e2m1(x[i]);\n"
    "}\n"
    "MT_KERNEL void enc_range(unsigned char *out, unsigned base, int n)\n"
    "{\n"
    "    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)\n"
    "        out[i] = (unsigned char)mt_f32_to_e2m1(mt_uint_as_float(base + (unsigned)i));\n"
    "}\n";

#define ENC_CHUNK (1 << 22)

typedef struct enc_dev {
    dev_device *d;
    dev_module *m;
    dev_kernel *list, *range;
    bool gpu; /* the emu backend: grid of blocks of 64 threads */
} enc_dev;

static enc_dev enc_open(const char *spec)
{
    enc_dev e = {.gpu = strncmp(spec, "cpu", 3) != 0};
    e.d = td_open(spec, &(dev_open_opts){.threads = 2});
    e.m = td_build(e.d, e.gpu ? "enc.hip" : "enc.c", e.gpu ? enc_gpu_src : enc_cpu_src, NULL, 0,
                   false);
    e.list = td_kernel(e.m, "enc_list", "ppi");
    e.range = td_kernel(e.m, "enc_range", "pui");
    return e;
}

static void enc_close(enc_dev *e)
{
    dev_module_unload(e->m);
    dev_close(e->d);
}

static void enc_launch(enc_dev *e, dev_kernel *k, int n, int per_item, void **args)
{
    dev_dim3 grid = {(unsigned)((n + per_item - 1) / per_item), 1, 1}, block = {1, 1, 1};
    if (e->gpu) {
        grid.x = 8;
        block.x = 64;
    }
    td_launch(e->d, k, grid, block, 0, args);
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_synchronize(e->d, &err), MT_OK, "%s", err.msg);
}

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Codes of n floats on the device, through enc_list. */
static void enc_run_list(enc_dev *e, const float *x, int n, uint8_t *out)
{
    void *dx = td_upload(e->d, x, (size_t)n * 4), *dout = td_alloc(e->d, (size_t)n);
    td_fill(e->d, dout, 0xee, (size_t)n);
    void *args[] = {&dx, &dout, &n};
    enc_launch(e, e->list, n, 4096, args);
    td_download(e->d, out, dout, (size_t)n);
    dev_free(e->d, dx);
    dev_free(e->d, dout);
}

/* Every float edge case of the rule: each grid midpoint (the ties) and
 * grid value with both neighbours, zeros, the smallest and largest
 * subnormals and normals, the saturation boundary, infinities, quiet and
 * signalling NaNs of both signs; then a stride through all bit patterns. */
static int edge_values(float *x, int cap)
{
    const float pts[] = {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f,
                         3.5f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, FLT_MIN, FLT_MAX};
    const uint32_t raw[] = {0x00000000u, 0x00000001u, 0x00000002u, 0x007fffffu,
                            0x00400000u, 0x7f800000u, 0x7f800001u, 0x7fbfffffu,
                            0x7fc00000u, 0x7fffffffu};
    int n = 0;
    for (size_t i = 0; i < sizeof pts / sizeof pts[0]; i++) {
        float v[3] = {nextafterf(pts[i], 0.0f), pts[i], nextafterf(pts[i], INFINITY)};
        for (int j = 0; j < 3; j++) {
            x[n++] = v[j];
            x[n++] = -v[j];
        }
    }
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        x[n++] = f32_of(raw[i]);
        x[n++] = f32_of(raw[i] | 0x80000000u);
    }
    for (uint64_t u = 12345; u < (1ull << 32) && n < cap; u += 65521)
        x[n++] = f32_of((uint32_t)u);
    return n;
}

static void expect_codes(const char *spec, const float *x, int n, const uint8_t *got)
{
    int bad = 0;
    for (int i = 0; i < n; i++) {
        unsigned want = mxfp4_e2m1_encode(x[i]);
        if (got[i] != want && bad++ < 8)
            cr_expect_eq(got[i], want, "%s: mt_f32_to_e2m1(%.9g, bits 0x%08x) = %u, the host "
                         "rule gives %u", spec, x[i], bits_of(x[i]), got[i], want);
    }
    cr_expect_eq(bad, 0, "%s: %d of %d codes differ", spec, bad, n);
}

static void check_prelude_encoder(const char *spec)
{
    enc_dev e = enc_open(spec);
    enum { CAP = 70000 };
    float *x = malloc(CAP * sizeof *x);
    uint8_t *got = malloc(ENC_CHUNK);
    cr_assert(x && got);
    int n = edge_values(x, CAP);
    enc_run_list(&e, x, n, got);
    expect_codes(spec, x, n, got);
    free(x);

    /* Every float of magnitude [2^-2, 8) (biased exponents 125..129), both
     * signs: all ties, all rounding boundaries, the saturation at 6. */
    void *dout = td_alloc(e.d, ENC_CHUNK);
    int64_t bad = 0;
    for (uint32_t sign = 0; sign < 2; sign++) {
        uint32_t lo = (sign << 31) | (125u << 23), hi = (sign << 31) | (130u << 23);
        for (uint32_t base = lo; base < hi; base += ENC_CHUNK) {
            int cn = ENC_CHUNK;
            void *args[] = {&dout, &base, &cn};
            td_fill(e.d, dout, 0xee, ENC_CHUNK);
            enc_launch(&e, e.range, cn, 65536, args);
            td_download(e.d, got, dout, ENC_CHUNK);
            for (uint32_t i = 0; i < ENC_CHUNK; i++) {
                float v = f32_of(base + i);
                unsigned want = mxfp4_e2m1_encode(v);
                if (got[i] != want && bad++ < 8)
                    cr_expect_eq(got[i], want, "%s: mt_f32_to_e2m1(%.9g, bits 0x%08x) = %u, "
                                 "the host rule gives %u", spec, v, base + i, got[i], want);
            }
        }
    }
    cr_expect_eq(bad, 0, "%s: %lld codes of the sweep differ", spec, (long long)bad);
    dev_free(e.d, dout);
    free(got);
    enc_close(&e);
}

Test(mxfp4, cpu_prelude_encoder_matches_host_rule_bit_for_bit, .timeout = 120)
{
    check_prelude_encoder("cpu");
}

Test(mxfp4, gpu_prelude_encoder_on_emu_matches_host_rule_bit_for_bit, .timeout = 120)
{
    check_prelude_encoder("emu");
}
