/* ops_kv_store.hip: pool row rows[m] = enc(a[m] / scale) ++ enc(b[m] /
 * scale) (family ops_kv_store, see kernels/fam_ops_kv_store.c). Block: one
 * token, THREADS threads striding its values. enc is bf16 (round to nearest
 * even) or fp8 e4m3 (round to nearest even, +-448 saturation, NaN 0x7f).
 * Shape: S_W1, S_W2, S_kv (kern_dtype: 1 bf16, 4 fp8 e4m3). */

MT_DEVICE unsigned enc_fp8(float f)
{
    const unsigned s = (mt_float_as_uint(f) >> 24) & 0x80u;
    if (f != f)
        return 0x7fu;
    const float a = f < 0.0f ? -f : f;
    if (a >= 448.0f)
        return s | 0x7eu;
    if (a < 0.015625f) { /* subnormal: units of 2^-9, nearest even */
        const float q = a * 512.0f;
        unsigned i = (unsigned)q;
        const float fr = q - (float)i;
        if (fr > 0.5f || (fr == 0.5f && (i & 1u)))
            i++;
        return s | i; /* 8 is the smallest normal's code */
    }
    const unsigned u = mt_float_as_uint(a);
    int e = (int)(u >> 23) - 127;
    unsigned mant = (u >> 20) & 7u;
    const unsigned rest = u & 0xfffffu;
    if (rest > 0x80000u || (rest == 0x80000u && (mant & 1u)))
        mant++;
    if (mant == 8u) {
        mant = 0u;
        e++;
    }
    const int be = e + 7;
    if (be > 15 || (be == 15 && mant == 7u))
        return s | 0x7eu;
    return s | ((unsigned)be << 3) | mant;
}

MT_DEVICE void put(void *pool, long i, float v)
{
    if (S_kv == 4)
        ((unsigned char *)pool)[i] = (unsigned char)enc_fp8(v);
    else
        ((mt_bf16 *)pool)[i] = mt_f32_to_bf16(v);
}

MT_KERNEL __launch_bounds__(THREADS) void ops_kv_store(const mt_bf16 *a, const mt_bf16 *b,
                                                        const int *rows, void *pool,
                                                        const float *scale, int m)
{
    const int t = blockIdx.x;
    if (t >= m)
        return;
    const float sc = scale[0];
    const long base = (long)rows[t] * (S_W1 + S_W2);
    for (int j = threadIdx.x; j < S_W1 + S_W2; j += THREADS) {
        const float v = j < S_W1 ? mt_bf16_to_f32(a[(long)t * S_W1 + j])
                                 : mt_bf16_to_f32(b[(long)t * (S_W2 > 0 ? S_W2 : 1) + j - S_W1]);
        put(pool, base + j, v / sc);
    }
}
