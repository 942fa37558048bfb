/* mxfp4_quant.hip: the mxfp4_quant family on GPUs: dynamic MXFP4
 * quantization of activation rows [M, K] (bf16 or f32) into Quark layout
 * (packed [M, K/2], element 2i in the low nibble; E8M0 scales [M, K/32])
 * by the "even" rule of kernels/mxfp4.h, bit for bit.
 * LPB lanes share one 32-element block (amax by xor shuffles inside the
 * group); each lane quantizes 32/LPB elements. Params: THREADS, LPB.
 * Dims: S_K, S_a (dtype of x: 0 f32, 1 bf16). */

MT_DEVICE float q_load(const void *x, long long i)
{
    if (S_a == 1)
        return mt_bf16_to_f32(((const mt_bf16 *)x)[i]);
    return ((const float *)x)[i];
}

MT_KERNEL void mxfp4_quant(const void *x, unsigned char *q, unsigned char *s, int m)
{
    const int EPL = 32 / LPB; /* elements per lane */
    long long gid = (long long)blockIdx.x * THREADS + threadIdx.x;
    long long blk = gid / LPB;
    int lane = (int)(gid % LPB);
    long long nblk = (long long)m * (S_K / 32);
    int ok = blk < nblk;
    long long base = blk * 32 + lane * EPL;
    float v[32 / LPB];
    float amax = 0.0f;
    int nan = 0;
    for (int i = 0; i < EPL; i++) {
        v[i] = ok ? q_load(x, base + i) : 0.0f;
        nan |= v[i] != v[i];
        float a = v[i] < 0.0f ? -v[i] : v[i];
        amax = a > amax ? a : amax;
    }
    for (int o = LPB / 2; o > 0; o /= 2) {
        float other = mt_shfl_xor_f32(amax, o);
        amax = other > amax ? other : amax;
        nan |= mt_shfl_xor_i32(nan, o);
    }
    unsigned r = (mt_float_as_uint(amax) + 0x200000u) & 0xff800000u;
    int e = (int)(r >> 23) - 129;
    int code = nan ? 255 : e < -127 ? 0 : e > 127 ? 254 : e + 127;
    int ex = 127 - code; /* multiply by 2^ex */
    float inv = nan ? 0.0f
                    : (ex == -127 ? mt_uint_as_float(0x00400000u)
                                  : mt_uint_as_float((unsigned)(ex + 127) << 23));
    if (!ok)
        return;
    for (int i = 0; i < EPL; i += 2) {
        unsigned lo = mt_f32_to_e2m1(v[i] * inv), hi = mt_f32_to_e2m1(v[i + 1] * inv);
        q[(base + i) / 2] = (unsigned char)(lo | (hi << 4));
    }
    if (lane == 0)
        s[blk] = (unsigned char)code;
}
