/* ops_silu_mul.hip: h[m][j] = bf16(silu(x[m][j]) * x[m][I + j]) (family
 * ops_silu_mul, see kernels/fam_ops_silu_mul.c). Block: ROWS rows, THREADS
 * threads striding a row. Shape: S_I. */

MT_KERNEL __launch_bounds__(THREADS) void ops_silu_mul(const float *x, mt_bf16 *h, int m)
{
    for (int r = 0; r < ROWS; r++) {
        const int row = blockIdx.x * ROWS + r;
        if (row >= m)
            return;
        const float *xr = x + (long)row * 2 * S_I;
        for (int j = threadIdx.x; j < S_I; j += THREADS) {
            const float g = xr[j];
            h[(long)row * S_I + j] = mt_f32_to_bf16(g / (1.0f + mt_expf(-g)) * xr[S_I + j]);
        }
    }
}
