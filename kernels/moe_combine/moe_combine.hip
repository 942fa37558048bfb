/* moe_combine.hip: the moe_combine family on GPUs: the deterministic
 * reduction of per-pair rows written by moe_gemm_down (comb=1):
 *   y[t][n] = sum_{j < topk} rows[t*topk + j][n]  (+ shared[t][n])
 * summed in ascending j, so every run gives the same bits. shared may
 * alias y (each element is read before it is written, by one thread).
 * Grid: (H / (THREADS*VEC) rounded up, M). Params: THREADS, VEC.
 * Dims: S_H, S_topk, S_shared, S_o (0 = f32 output, 1 = bf16). */

MT_KERNEL void moe_combine(const float *rows, const float *shared, void *y)
{
    int t = blockIdx.y;
    int n0 = (blockIdx.x * THREADS + threadIdx.x) * VEC;
    for (int v = 0; v < VEC; v++) {
        int n = n0 + v;
        if (n >= S_H)
            break;
        float acc = 0.0f;
        for (int j = 0; j < S_topk; j++)
            acc += rows[((long long)t * S_topk + j) * S_H + n];
        if (S_shared)
            acc += shared[(long long)t * S_H + n];
        if (S_o == 1)
            ((mt_bf16 *)y)[(long long)t * S_H + n] = mt_f32_to_bf16(acc);
        else
            ((float *)y)[(long long)t * S_H + n] = acc;
    }
}
