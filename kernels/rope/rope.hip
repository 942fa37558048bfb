/* rope.hip: GLM-5 interleaved RoPE in place on bf16 heads, optionally after
 * a LayerNorm over each head (family rope, see kernels/fam_rope.c).
 * Block: TB tokens; each wave takes one head at a time; the LayerNorm's
 * mean and variance are wave reductions (shuffles), so every lane has read
 * the head before any lane writes it. Lanes then rotate pairs (2i, 2i+1).
 * Params: TB, WAVES; NT from the family. Shape: S_H, S_HD, S_ROFF, S_R,
 * S_ln. */

#define LN_EPS 1e-6f

MT_DEVICE float wave_sum(float v)
{
    for (int off = MT_WARP_SIZE / 2; off > 0; off /= 2)
        v += mt_shfl_xor_f32(v, off);
    return v;
}

MT_KERNEL __launch_bounds__(NT) void rope_apply(mt_bf16 *x, const int *pos, const float *cs,
                                                const float *gamma, const float *beta, int m)
{
    const int lane = threadIdx.x % MT_WARP_SIZE, wave = threadIdx.x / MT_WARP_SIZE;
    const int n_waves = NT / MT_WARP_SIZE;
    for (int tt = 0; tt < TB; tt++) {
        const int mi = blockIdx.x * TB + tt;
        if (mi >= m)
            return;
        const float *row = cs + (long)pos[mi] * S_R;
        for (int h = wave; h < S_H; h += n_waves) {
            mt_bf16 *xr = x + ((long)mi * S_H + h) * S_HD;
            float mean = 0.0f, rstd = 1.0f;
            if (S_ln) {
                float s = 0.0f;
                for (int d = lane; d < S_HD; d += MT_WARP_SIZE)
                    s += mt_bf16_to_f32(xr[d]);
                mean = wave_sum(s) / (float)S_HD;
                float v = 0.0f;
                for (int d = lane; d < S_HD; d += MT_WARP_SIZE) {
                    float t = mt_bf16_to_f32(xr[d]) - mean;
                    v += t * t;
                }
                rstd = mt_rsqrtf(wave_sum(v) / (float)S_HD + LN_EPS);
                for (int d = lane; d < S_HD; d += MT_WARP_SIZE)
                    if (d < S_ROFF || d >= S_ROFF + S_R)
                        xr[d] = mt_f32_to_bf16((mt_bf16_to_f32(xr[d]) - mean) * rstd * gamma[d] +
                                               beta[d]);
            }
            for (int i = lane; i < S_R / 2; i += MT_WARP_SIZE) {
                const int d0 = S_ROFF + 2 * i;
                float a = mt_bf16_to_f32(xr[d0]), b = mt_bf16_to_f32(xr[d0 + 1]);
                if (S_ln) {
                    a = (a - mean) * rstd * gamma[d0] + beta[d0];
                    b = (b - mean) * rstd * gamma[d0 + 1] + beta[d0 + 1];
                }
                const float c = row[i], s = row[S_R / 2 + i];
                xr[d0] = mt_f32_to_bf16(a * c - b * s);
                xr[d0 + 1] = mt_f32_to_bf16(b * c + a * s);
            }
        }
    }
}
