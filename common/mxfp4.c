/* mxfp4.c: E2M1 / E8M0 codecs, Quark-layout packing and the "even"
 * quantization rule (see mxfp4.h for the exact definition). */
#include "mxfp4.h"

#include <math.h>
#include <string.h>

#include "numeric.h"

static float bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static const float e2m1_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float mxfp4_e2m1_decode(unsigned code)
{
    float m = e2m1_mag[code & 7u];
    return (code & 8u) ? -m : m;
}

unsigned mxfp4_e2m1_encode(float v)
{
    float a = fabsf(v);
    unsigned c;
    if (!(a > 0.25f)) /* also NaN */
        return 0;
    else if (a < 0.75f)
        c = 1;
    else if (a <= 1.25f)
        c = 2;
    else if (a < 1.75f)
        c = 3;
    else if (a <= 2.5f)
        c = 4;
    else if (a < 3.5f)
        c = 5;
    else if (a <= 5.0f)
        c = 6;
    else
        c = 7;
    return c | (signbit(v) ? 8u : 0u);
}

float mxfp4_e8m0_decode(unsigned code)
{
    code &= 0xffu;
    if (code == 0xffu)
        return bits_to_f32(0x7fc00000u);
    return bits_to_f32(code ? code << 23 : 0x00400000u);
}

unsigned mxfp4_e8m0_from_amax(float amax)
{
    if (isnan(amax))
        return 0xffu;
    uint32_t r = (f32_to_bits(fabsf(amax)) + 0x200000u) & 0xff800000u;
    int e = (int)(r >> 23) - 127 - 2;
    if (e < -127)
        e = -127;
    if (e > 127)
        e = 127;
    return (unsigned)(e + 127);
}

/* 2^e for e in [-127, 127] as a float (2^-127 is subnormal, still exact). */
static float pow2f(int e)
{
    return e == -127 ? bits_to_f32(0x00400000u) : bits_to_f32((uint32_t)(e + 127) << 23);
}

void mxfp4_pack(const uint8_t *codes, int64_t n, uint8_t *packed)
{
    for (int64_t i = 0; i < n / 2; i++)
        packed[i] = (uint8_t)((codes[2 * i] & 15u) | ((codes[2 * i + 1] & 15u) << 4));
}

void mxfp4_unpack(const uint8_t *packed, int64_t n, uint8_t *codes)
{
    for (int64_t i = 0; i < n / 2; i++) {
        codes[2 * i] = packed[i] & 15u;
        codes[2 * i + 1] = packed[i] >> 4;
    }
}

static void quantize_block(const float *x, uint8_t *packed, uint8_t *scale)
{
    float amax = 0.0f;
    bool nan = false;
    for (int i = 0; i < MXFP4_BLOCK; i++) {
        nan |= isnan(x[i]);
        amax = fmaxf(amax, fabsf(x[i]));
    }
    if (nan) {
        *scale = 0xff;
        memset(packed, 0, MXFP4_BLOCK / 2);
        return;
    }
    unsigned code = mxfp4_e8m0_from_amax(amax);
    float inv = pow2f(-mxfp4_e8m0_exponent(code));
    uint8_t q[MXFP4_BLOCK];
    for (int i = 0; i < MXFP4_BLOCK; i++)
        q[i] = (uint8_t)mxfp4_e2m1_encode(x[i] * inv);
    mxfp4_pack(q, MXFP4_BLOCK, packed);
    *scale = (uint8_t)code;
}

void mxfp4_quantize_row(const float *x, int64_t k, uint8_t *packed, uint8_t *scales)
{
    for (int64_t b = 0; b < k / MXFP4_BLOCK; b++)
        quantize_block(x + b * MXFP4_BLOCK, packed + b * (MXFP4_BLOCK / 2), scales + b);
}

void mxfp4_quantize_row_bf16(const uint16_t *x, int64_t k, uint8_t *packed,
                             uint8_t *scales)
{
    float tmp[MXFP4_BLOCK];
    for (int64_t b = 0; b < k / MXFP4_BLOCK; b++) {
        for (int i = 0; i < MXFP4_BLOCK; i++)
            tmp[i] = mt_bf16_to_f32(x[b * MXFP4_BLOCK + i]);
        quantize_block(tmp, packed + b * (MXFP4_BLOCK / 2), scales + b);
    }
}

void mxfp4_quantize_matrix(const float *x, int64_t rows, int64_t k, uint8_t *packed,
                           uint8_t *scales)
{
    for (int64_t r = 0; r < rows; r++)
        mxfp4_quantize_row(x + r * k, k, packed + r * (k / 2), scales + r * (k / MXFP4_BLOCK));
}

void mxfp4_dequantize_row(const uint8_t *packed, const uint8_t *scales, int64_t k,
                          float *out)
{
    for (int64_t i = 0; i < k; i++) {
        unsigned byte = packed[i / 2];
        unsigned code = (i & 1) ? byte >> 4 : byte & 15u;
        out[i] = mxfp4_e2m1_decode(code) * mxfp4_e8m0_decode(scales[i / MXFP4_BLOCK]);
    }
}

void mxfp4_roundtrip_row(const float *x, int64_t k, float *out)
{
    uint8_t p[MXFP4_BLOCK / 2], s;
    for (int64_t b = 0; b < k / MXFP4_BLOCK; b++) {
        quantize_block(x + b * MXFP4_BLOCK, p, &s);
        mxfp4_dequantize_row(p, &s, MXFP4_BLOCK, out + b * MXFP4_BLOCK);
    }
}
