/* numeric.c: fp16 and fp8 e4m3 conversions (see numeric.h). */
#include "numeric.h"

#include <math.h>

float mt_f16_to_f32(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(m | 1024), e - 25);
    return s ? -v : v;
}

uint16_t mt_f32_to_f16(float f)
{
    uint16_t s = signbit(f) ? 0x8000 : 0;
    float a = fabsf(f);
    if (isnan(f))
        return s | 0x7e00;
    if (a >= 65520.0f)
        return s | 0x7c00;
    if (a < ldexpf(1.0f, -14)) { /* subnormal: units of 2^-24 */
        float q = nearbyintf(ldexpf(a, 24));
        return s | (uint16_t)q;
    }
    int e;
    float fr = frexpf(a, &e); /* a = fr * 2^e, fr in [0.5,1) */
    float q = nearbyintf(ldexpf(fr, 11)); /* 11 bits incl. implicit */
    if (q >= 2048.0f) {
        q = 1024.0f;
        e++;
    }
    int be = e - 1 + 15;
    if (be >= 31)
        return s | 0x7c00;
    return s | (uint16_t)(be << 10) | (uint16_t)((int)q - 1024);
}

float mt_fp8e4m3_to_f32(uint8_t v)
{
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float r;
    if (e == 15 && m == 7)
        return NAN;
    if (e == 0)
        r = ldexpf((float)m, -9);
    else
        r = ldexpf((float)(m | 8), e - 10);
    return s ? -r : r;
}

uint8_t mt_f32_to_fp8e4m3(float f)
{
    uint8_t s = signbit(f) ? 0x80 : 0;
    if (isnan(f))
        return 0x7f;
    float a = fabsf(f);
    if (a >= 448.0f)
        return s | 0x7e;
    if (a < ldexpf(1.0f, -6)) { /* subnormal: units of 2^-9 */
        float q = nearbyintf(ldexpf(a, 9));
        return s | (uint8_t)q; /* q==8 becomes the smallest normal: ok */
    }
    int e;
    float fr = frexpf(a, &e);
    float q = nearbyintf(ldexpf(fr, 4)); /* 4 bits incl. implicit */
    if (q >= 16.0f) {
        q = 8.0f;
        e++;
    }
    int be = e - 1 + 7;
    if (be > 15 || (be == 15 && (int)q - 8 == 7))
        return s | 0x7e;
    return s | (uint8_t)(be << 3) | (uint8_t)((int)q - 8);
}
