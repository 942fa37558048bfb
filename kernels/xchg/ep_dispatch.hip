/* ep_dispatch.hip: the ep_dispatch family on GPUs (kernels/xchg/
 * fam_ep_dispatch.c): row i of the send buffer is the activation row of
 * pair sorted[i], with the pair's expert local to its rank and its weight;
 * block 0 also writes the pairs per destination rank. Block: ROWS pairs,
 * THREADS threads striding a row. Shape: S_E, S_topk, S_ranks, S_H. */

/* The first expert of rank q (model_ep_range); x_first(S_ranks) is S_E. */
MT_DEVICE int x_first(int q)
{
    const int base = S_E / S_ranks, rem = S_E % S_ranks;
    return q * base + (q < rem ? q : rem);
}

/* The rank holding expert e. */
MT_DEVICE int x_owner(int e)
{
    const int base = S_E / S_ranks, rem = S_E % S_ranks, big = rem * (base + 1);
    return e < big ? e / (base + 1) : rem + (e - big) / base;
}

/* The first position of the sorted pairs whose expert is at least v. */
MT_DEVICE int x_lower(const int *sorted, const int *ids, int m, int v)
{
    int lo = 0, hi = m;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (ids[sorted[mid]] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

MT_KERNEL __launch_bounds__(THREADS) void ep_dispatch(const int *sorted, const int *ids,
                                                       const float *tw, const mt_bf16 *x,
                                                       mt_bf16 *sx, int *se, float *sw,
                                                       int *counts, int m)
{
    if (blockIdx.x == 0)
        for (int q = threadIdx.x; q < S_ranks; q += THREADS)
            counts[q] = x_lower(sorted, ids, m, x_first(q + 1)) -
                        x_lower(sorted, ids, m, x_first(q));
    for (int r = 0; r < ROWS; r++) {
        const int i = blockIdx.x * ROWS + r;
        if (i >= m)
            return;
        const int p = sorted[i], e = ids[p];
        const long src = (long)(p / S_topk) * S_H, dst = (long)i * S_H;
        for (int j = threadIdx.x; j < S_H; j += THREADS)
            sx[dst + j] = x[src + j];
        if (threadIdx.x == 0) {
            se[i] = e - x_first(x_owner(e));
            sw[i] = tw[p];
        }
    }
}
