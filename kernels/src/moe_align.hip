/* moe_align.hip: the moe_align family on GPUs. One block sorts the
 * (token, expert) pairs by expert, stably, and pads each expert's segment
 * to a multiple of bm (see kernels/moe_common.h for the layout):
 *   1. per-expert counts with shared-memory atomics;
 *   2. padded offsets (a serial scan by thread 0: E <= 1024 values);
 *   3. sentinel fill of sorted, tile -> expert map;
 *   4. stable placement, BLOCK pairs at a time: a pair's rank is the number
 *      of earlier pairs of the same expert in its chunk.
 * Params: BLOCK threads. Dims: S_E experts, S_topk. */

MT_KERNEL void moe_align(const int *ids, int *sorted, int *tile_expert, int *total,
                         int npairs, int bm, int cap)
{
    MT_DYN_SHARED(int, sh);
    int *cnt = sh, *off = sh + S_E, *chunk = sh + 2 * S_E, *tot = sh + 2 * S_E + BLOCK;
    int tid = threadIdx.x;
    for (int e = tid; e < S_E; e += BLOCK)
        cnt[e] = 0;
    __syncthreads();
    for (int p = tid; p < npairs; p += BLOCK)
        atomicAdd(&cnt[ids[p]], 1);
    __syncthreads();
    if (tid == 0) {
        int o = 0;
        for (int e = 0; e < S_E; e++) {
            off[e] = o;
            o += (cnt[e] + bm - 1) / bm * bm;
        }
        tot[0] = o;
        total[0] = o;
    }
    for (int i = tid; i < cap; i += BLOCK)
        sorted[i] = npairs;
    for (int t = tid; t < cap / bm; t += BLOCK)
        tile_expert[t] = -1;
    __syncthreads();
    for (int e = tid; e < S_E; e += BLOCK) {
        int t0 = off[e] / bm, t1 = (off[e] + (cnt[e] + bm - 1) / bm * bm) / bm;
        for (int t = t0; t < t1; t++)
            tile_expert[t] = e;
    }
    for (int base = 0; base < npairs; base += BLOCK) {
        int p = base + tid;
        int e = p < npairs ? ids[p] : -1;
        chunk[tid] = e;
        __syncthreads();
        if (e >= 0) {
            int rank = 0;
            for (int j = 0; j < tid; j++)
                rank += chunk[j] == e;
            sorted[off[e] + rank] = p;
        }
        __syncthreads();
        if (e >= 0)
            atomicAdd(&off[e], 1);
        __syncthreads();
    }
}
