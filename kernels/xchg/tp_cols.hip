/* tp_cols.hip: the tp_cols family on GPUs (kernels/xchg/fam_tp_cols.c):
 * the blocks a tensor-parallel all-gather received, rank q's m rows of
 * w(q) columns one after another, into rows of all the ranks' columns
 * side by side. Block: ROWS rows, THREADS threads striding a row's
 * columns. Shape: S_ranks, S_U units split over the ranks, S_per elements
 * a unit, S_t (0 f32, 1 bf16). */

#define TC_ELEM unsigned int
#if S_t == 1
#undef TC_ELEM
#define TC_ELEM unsigned short
#endif

MT_KERNEL __launch_bounds__(THREADS) void tp_cols(const void *src, void *dst, int m)
{
    const TC_ELEM *s = (const TC_ELEM *)src;
    TC_ELEM *d = (TC_ELEM *)dst;
    const long W = (long)S_U * S_per;
    for (int r = 0; r < ROWS; r++) {
        const int row = blockIdx.x * ROWS + r;
        if (row >= m)
            return;
        const int base = S_U / S_ranks, rem = S_U % S_ranks;
        for (int q = 0; q < S_ranks; q++) {
            const long c0 = ((long)q * base + (q < rem ? q : rem)) * S_per;
            const long w = (long)(base + (q < rem)) * S_per;
            const TC_ELEM *from = s + (long)m * c0 + (long)row * w;
            TC_ELEM *to = d + (long)row * W + c0;
            for (long j = threadIdx.x; j < w; j += THREADS)
                to[j] = from[j];
        }
    }
}
