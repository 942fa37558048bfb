/* ops_head_gemm.hip: out[m][h][n] = bf16(sum_k a[m][h][k] w[h][n][k])
 * (family ops_head_gemm, see kernels/fam_ops_head_gemm.c). Block: THREADS
 * output columns of one head for MB rows; the MB rows of a are staged in
 * shared memory as f32. Grid: (N / THREADS, H, M / MB).
 * Shape: S_H, S_K, S_KA, S_N, S_NO. */

MT_KERNEL __launch_bounds__(THREADS) void ops_head_gemm(const mt_bf16 *a, const mt_bf16 *w,
                                                         mt_bf16 *out, int m)
{
    __shared__ float as[MB * S_K];
    const int h = blockIdx.y, m0 = blockIdx.z * MB;
    const int n = blockIdx.x * THREADS + threadIdx.x;
    for (int i = threadIdx.x; i < MB * S_K; i += THREADS) {
        const int r = i / S_K, k = i % S_K;
        as[i] = m0 + r < m ? mt_bf16_to_f32(a[((long)(m0 + r) * S_H + h) * S_KA + k]) : 0.0f;
    }
    __syncthreads();
    if (n >= S_N)
        return;
    float acc[MB];
    for (int r = 0; r < MB; r++)
        acc[r] = 0.0f;
    const mt_bf16 *wr = w + ((long)h * S_N + n) * S_K;
    for (int k = 0; k < S_K; k++) {
        const float wv = mt_bf16_to_f32(wr[k]);
        for (int r = 0; r < MB; r++)
            acc[r] += as[r * S_K + k] * wv;
    }
    for (int r = 0; r < MB && m0 + r < m; r++)
        out[((long)(m0 + r) * S_H + h) * S_NO + n] = mt_f32_to_bf16(acc[r]);
}
