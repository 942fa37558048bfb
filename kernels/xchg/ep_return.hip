/* ep_return.hip: the ep_return family on GPUs (kernels/xchg/
 * fam_ep_return.c): dst[sorted[i]] = src[i], f32 rows of S_H: the rows an
 * expert-parallel layer got back, into the combine's per-pair layout.
 * Block: ROWS rows, THREADS threads striding a row. */

MT_KERNEL __launch_bounds__(THREADS) void ep_return(const int *sorted, const float *src,
                                                     float *dst, int m)
{
    for (int r = 0; r < ROWS; r++) {
        const int i = blockIdx.x * ROWS + r;
        if (i >= m)
            return;
        const long s = (long)i * S_H, d = (long)sorted[i] * S_H;
        for (int j = threadIdx.x; j < S_H; j += THREADS)
            dst[d + j] = src[s + j];
    }
}
