/* numeric.h: host-side conversions for the narrow float types the kernels
 * use (bf16, fp16, fp8 e4m3). Pure functions, thread-safe. MXFP4 (E2M1 with
 * E8M0 block scales) lives in kernels/mxfp4.h. */
#ifndef MT_NUMERIC_H
#define MT_NUMERIC_H

#include <stdint.h>
#include <string.h>

static inline float mt_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t mt_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float mt_bf16_round(float f) { return mt_bf16_to_f32(mt_f32_to_bf16(f)); }

float mt_f16_to_f32(uint16_t h);
uint16_t mt_f32_to_f16(float f);

/* OCP fp8 e4m3fn: bias 7, no infinities, 0x7f/0xff are NaN, max 448.
 * Encoding saturates to +-448 and rounds to nearest even. */
float mt_fp8e4m3_to_f32(uint8_t v);
uint8_t mt_f32_to_fp8e4m3(float f);

#endif
