/* rmsnorm.hip: y = x * rsqrt(mean(x^2) + eps) * w over rows of N bf16
 * values, one block per ROWS rows. The sum of squares is reduced per warp
 * with shuffles, then across warps through shared memory: the barrier
 * between the two phases is what makes it correct.
 * Params: THREADS (block size), ROWS (rows per block). Shape: S_N. */

MT_KERNEL __launch_bounds__(THREADS) void rmsnorm_bf16(mt_bf16 *y, const mt_bf16 *x,
                                                        const mt_bf16 *w, int m,
                                                        float eps)
{
    __shared__ float partial[32];
    __shared__ float total;
    const int n = S_N;
    const int lane = threadIdx.x % MT_WARP_SIZE;
    const int warp = threadIdx.x / MT_WARP_SIZE;
    const int n_warps = (THREADS + MT_WARP_SIZE - 1) / MT_WARP_SIZE;

    for (int r = 0; r < ROWS; r++) {
        int row = blockIdx.x * ROWS + r;
        if (row >= m)
            return; /* uniform across the block */
        const mt_bf16 *xr = x + (long)row * n;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n; i += THREADS) {
            float v = mt_bf16_to_f32(xr[i]);
            ss += v * v;
        }
        for (int off = MT_WARP_SIZE / 2; off > 0; off /= 2)
            ss += mt_shfl_xor_f32(ss, off);
        if (lane == 0)
            partial[warp] = ss;
        __syncthreads();
        if (threadIdx.x == 0) {
            float t = 0.0f;
            for (int i = 0; i < n_warps; i++)
                t += partial[i];
            total = t;
        }
        __syncthreads();
        float scale = mt_rsqrtf(total / (float)n + eps);
        mt_bf16 *yr = y + (long)row * n;
        for (int i = threadIdx.x; i < n; i += THREADS)
            yr[i] = mt_f32_to_bf16(mt_bf16_to_f32(xr[i]) * scale * mt_bf16_to_f32(w[i]));
        __syncthreads(); /* partial[] and total are reused by the next row */
    }
}
