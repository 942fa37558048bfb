/* gemm.hip: c[M,N] = a[M,K] (bf16) x b[N,K]^T (bf16), f32 out. Shared-memory
 * tiles of BM x BK and BN x BK, a TM x TN register tile per thread, and an
 * optional split of K over SPLITK blocks that add into c with atomics (c is
 * zeroed by the host first). Shape: S_N, S_K. */

#define GEMM_THREADS ((BM / TM) * (BN / TN))

MT_KERNEL __launch_bounds__(GEMM_THREADS) void gemm_bf16(float *c, const mt_bf16 *a,
                                                          const mt_bf16 *b, int m)
{
    __shared__ float as[BK * BM];
    __shared__ float bs[BK * BN];
    const int n = S_N, k = S_K;
    const int tid = threadIdx.x;
    const int tx = tid % (BN / TN), ty = tid / (BN / TN);
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int k_per = (k + SPLITK - 1) / SPLITK;
    const int k_begin = blockIdx.z * k_per;
    const int k_end = k_begin + k_per < k ? k_begin + k_per : k;

    float acc[TM][TN];
    for (int i = 0; i < TM; i++)
        for (int j = 0; j < TN; j++)
            acc[i][j] = 0.0f;

    for (int k0 = k_begin; k0 < k_end; k0 += BK) {
        for (int i = tid; i < BM * BK; i += GEMM_THREADS) {
            int r = i / BK, kk = i % BK;
            int gr = row0 + r, gk = k0 + kk;
            as[kk * BM + r] = (gr < m && gk < k_end) ? mt_bf16_to_f32(a[(long)gr * k + gk]) : 0.0f;
        }
        for (int i = tid; i < BN * BK; i += GEMM_THREADS) {
            int r = i / BK, kk = i % BK;
            int gc = col0 + r, gk = k0 + kk;
            bs[kk * BN + r] = (gc < n && gk < k_end) ? mt_bf16_to_f32(b[(long)gc * k + gk]) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < BK; kk++) {
            float ra[TM], rb[TN];
            for (int i = 0; i < TM; i++)
                ra[i] = as[kk * BM + ty * TM + i];
            for (int j = 0; j < TN; j++)
                rb[j] = bs[kk * BN + tx * TN + j];
            for (int i = 0; i < TM; i++)
                for (int j = 0; j < TN; j++)
                    acc[i][j] += ra[i] * rb[j];
        }
        __syncthreads();
    }

    for (int i = 0; i < TM; i++) {
        int r = row0 + ty * TM + i;
        if (r >= m)
            continue;
        for (int j = 0; j < TN; j++) {
            int col = col0 + tx * TN + j;
            if (col >= n)
                continue;
            if (SPLITK == 1)
                c[(long)r * n + col] = acc[i][j];
            else
                atomicAdd(&c[(long)r * n + col], acc[i][j]);
        }
    }
}
