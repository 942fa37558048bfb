/* ops_residual.hip: resid += delta (f32 rows of N), xb = bf16(resid)
 * (family ops_residual, see kernels/fam_ops_residual.c). Block: ROWS rows,
 * THREADS threads striding a row. Shape: S_N. */

MT_KERNEL __launch_bounds__(THREADS) void ops_residual(float *resid, const float *delta,
                                                        mt_bf16 *xb, int m)
{
    for (int r = 0; r < ROWS; r++) {
        const int row = blockIdx.x * ROWS + r;
        if (row >= m)
            return;
        for (int j = threadIdx.x; j < S_N; j += THREADS) {
            const long i = (long)row * S_N + j;
            float v = resid[i] + delta[i];
            resid[i] = v;
            xb[i] = mt_f32_to_bf16(v);
        }
    }
}
