/* prelude_cpu.h: prepended to every C kernel source of the cpu backend.
 * A cpu kernel is a plain C function called once per work item of the
 * launch grid, from a pool of threads:
 *
 *   MT_CPU_KERNEL void f(float *y, const float *x, int n) { ... itemIdx.x ... }
 *
 *   itemIdx    (mt_uint3) this work item's index in the grid
 *   itemCount  (mt_uint3) the grid's size
 *   mt_bf16, mt_bf16_to_f32, mt_f32_to_bf16, mt_e2m1_to_f32, mt_f32_to_e2m1,
 *   mt_e8m0_to_f32, mt_fp8e4m3_to_f32: the same helpers as the GPU prelude.
 *
 * SIMD follows -march=native: use GCC vector extensions or intrinsics from
 * <immintrin.h> behind __AVX512F__ / __AVX2__ checks. */
#ifndef MT_PRELUDE_CPU_H
#define MT_PRELUDE_CPU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct mt_uint3 { unsigned x, y, z; } mt_uint3;

/* Set by the cpu backend on each pool thread before it calls the kernel. */
__attribute__((visibility("default"))) __thread mt_uint3 mt__item, mt__count;
__attribute__((visibility("default"))) void mt__set_item(unsigned x, unsigned y,
                                                         unsigned z, unsigned gx,
                                                         unsigned gy, unsigned gz)
{
    mt__item.x = x; mt__item.y = y; mt__item.z = z;
    mt__count.x = gx; mt__count.y = gy; mt__count.z = gz;
}

#define itemIdx mt__item
#define itemCount mt__count
#define MT_CPU_KERNEL __attribute__((visibility("default")))
#define MT_INLINE static inline __attribute__((always_inline))

typedef uint16_t mt_bf16;

MT_INLINE float mt_uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
MT_INLINE uint32_t mt_float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

MT_INLINE float mt_bf16_to_f32(mt_bf16 h) { return mt_uint_as_float((uint32_t)h << 16); }

MT_INLINE mt_bf16 mt_f32_to_bf16(float f)
{
    uint32_t u = mt_float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (mt_bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (mt_bf16)(u >> 16);
}

MT_INLINE float mt_e2m1_to_f32(unsigned c)
{
    unsigned e = (c >> 1) & 3u, mbit = c & 1u;
    uint32_t bits = e ? (((e + 126u) << 23) | (mbit << 22)) : (mbit ? 0x3f000000u : 0u);
    return mt_uint_as_float(bits | ((uint32_t)(c & 8u) << 28));
}

/* Nearest E2M1 code of v (already divided by its block scale): ties to the
 * even code, saturating at +-6, sign in bit 3, zero and NaN give code 0.
 * The same as prelude_gpu.h's and bit for bit kernels/mxfp4.h's rule. */
MT_INLINE unsigned mt_f32_to_e2m1(float v)
{
    float a = fabsf(v);
    unsigned c;
    if (!(a > 0.25f)) /* also NaN */
        return 0u;
    else if (a < 0.75f) c = 1u;
    else if (a <= 1.25f) c = 2u;
    else if (a < 1.75f) c = 3u;
    else if (a <= 2.5f) c = 4u;
    else if (a < 3.5f) c = 5u;
    else if (a <= 5.0f) c = 6u;
    else c = 7u;
    return c | ((mt_float_as_uint(v) >> 28) & 8u);
}

MT_INLINE float mt_e8m0_to_f32(unsigned c)
{
    c &= 0xffu;
    if (c == 0xffu)
        return mt_uint_as_float(0x7fc00000u);
    return mt_uint_as_float(c ? (c << 23) : 0x00400000u);
}

MT_INLINE float mt_fp8e4m3_to_f32(unsigned c)
{
    uint32_t s = (uint32_t)(c & 0x80u) << 24, e = (c >> 3) & 15u, mm = c & 7u;
    if (e == 15u && mm == 7u)
        return mt_uint_as_float(0x7fc00000u);
    if (e == 0u)
        return mt_uint_as_float(s | mt_float_as_uint((float)mm * 0.001953125f));
    return mt_uint_as_float(s | ((e + 120u) << 23) | (mm << 20));
}

#endif
