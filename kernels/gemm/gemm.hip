/* gemm.hip: c[M,N] = a[M,K] (bf16) x b[N,K]^T (bf16), f32 out. Shared-memory
 * tiles of BM x BK and BN x BK, and an optional split of K over SPLITK
 * blocks that add into c with atomics (c is zeroed by the host first).
 * Shape: S_N, S_K.
 *
 * MMA=0: scalar f32 FMAs, a TM x TN register tile per thread.
 * MMA=1 or 2: the matrix fragments of the prelude (MT_MMA_SHAPE 16 or 32);
 * the tiles stay bf16 in shared memory, each wave owns TM x TN fragments
 * (a TM*MT_MMA_M x TN*MT_MMA_N tile of c) and the block has as many waves
 * as its tile needs. */

#if MMA
#if !MT_MMA_HAVE
#error "MMA needs matrix instructions, which this target does not have"
#endif
#if MMA == 2
#undef MT_MMA_SHAPE
#define MT_MMA_SHAPE 32
#endif
#define WM (TM * MT_MMA_M)
#define WN (TN * MT_MMA_N)
#define GEMM_THREADS ((BM / WM) * (BN / WN) * MT_MMA_WAVE)
#define LDK (BK + 4) /* row pitch in shared memory: 8-byte runs, fewer bank conflicts */

MT_KERNEL __launch_bounds__(GEMM_THREADS) void gemm_bf16(float *c, const mt_bf16 *a,
                                                          const mt_bf16 *b, int m)
{
    __shared__ __attribute__((aligned(16))) mt_bf16 as[BM * LDK];
    __shared__ __attribute__((aligned(16))) mt_bf16 bs[BN * LDK];
    const int n = S_N, k = S_K;
    const int tid = threadIdx.x, wave = tid / MT_MMA_WAVE;
    const int wm = wave / (BN / WN), wn = wave % (BN / WN);
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int k_per = (k + SPLITK - 1) / SPLITK;
    const int k_begin = blockIdx.z * k_per;
    const int k_end = k_begin + k_per < k ? k_begin + k_per : k;

    mt_mma_acc acc[TM][TN];
    for (int i = 0; i < TM; i++)
        for (int j = 0; j < TN; j++)
            acc[i][j] = mt_mma_acc_zero();

    for (int k0 = k_begin; k0 < k_end; k0 += BK) {
        for (int i = tid; i < BM * BK; i += GEMM_THREADS) {
            int r = i / BK, kk = i % BK;
            int gr = row0 + r, gk = k0 + kk;
            as[r * LDK + kk] = (gr < m && gk < k_end) ? a[(long)gr * k + gk] : (mt_bf16)0;
        }
        for (int i = tid; i < BN * BK; i += GEMM_THREADS) {
            int r = i / BK, kk = i % BK;
            int gc = col0 + r, gk = k0 + kk;
            bs[r * LDK + kk] = (gc < n && gk < k_end) ? b[(long)gc * k + gk] : (mt_bf16)0;
        }
        __syncthreads();
        for (int kk = 0; kk < BK; kk += MT_MMA_K) {
            mt_mma_a fa[TM];
            for (int i = 0; i < TM; i++)
                fa[i] = mt_mma_load_a(as + (wm * WM + i * MT_MMA_M) * LDK + kk, LDK);
            for (int j = 0; j < TN; j++) {
                mt_mma_b fb = mt_mma_load_bt(bs + (wn * WN + j * MT_MMA_N) * LDK + kk, LDK);
                for (int i = 0; i < TM; i++)
                    acc[i][j] = mt_mma_bf16(fa[i], fb, acc[i][j]);
            }
        }
        __syncthreads();
    }

    for (int i = 0; i < TM; i++)
        for (int j = 0; j < TN; j++)
            for (int x = 0; x < MT_MMA_ACC_REGS; x++) {
                int r = row0 + wm * WM + i * MT_MMA_M + mt_mma_acc_row(x);
                int col = col0 + wn * WN + j * MT_MMA_N + mt_mma_acc_col(x);
                if (r >= m || col >= n)
                    continue;
                if (SPLITK == 1)
                    c[(long)r * n + col] = acc[i][j].x[x];
                else
                    atomicAdd(&c[(long)r * n + col], acc[i][j].x[x]);
            }
}

#else
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
#endif
