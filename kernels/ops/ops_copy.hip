/* ops_copy.hip: dst[m][DO + j] = src[m][SO + j] for j < N, converting f32 /
 * bf16 (family ops_copy, see kernels/fam_ops_copy.c). Block: ROWS rows,
 * THREADS threads striding the columns. Shape: S_SW, S_SO, S_N, S_DW, S_DO,
 * S_s, S_d (kern_dtype: 0 f32, 1 bf16). */

MT_KERNEL __launch_bounds__(THREADS) void ops_copy(const void *src, void *dst, int m)
{
    for (int r = 0; r < ROWS; r++) {
        const int row = blockIdx.x * ROWS + r;
        if (row >= m)
            return;
        const long si = (long)row * S_SW + S_SO, di = (long)row * S_DW + S_DO;
        for (int j = threadIdx.x; j < S_N; j += THREADS) {
            float v = S_s == 0 ? ((const float *)src)[si + j]
                               : mt_bf16_to_f32(((const mt_bf16 *)src)[si + j]);
            if (S_d == 0)
                ((float *)dst)[di + j] = v;
            else
                ((mt_bf16 *)dst)[di + j] = mt_f32_to_bf16(v);
        }
    }
}
