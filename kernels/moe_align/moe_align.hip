/* moe_align.hip: the moe_align family on GPUs: sorts the (token, expert)
 * pairs by expert, stably, and pads each expert's segment to a multiple of
 * bm (see kernels/moe_common.h for the layout). Two paths:
 *
 * moe_align (CHUNK = 0): one block, for few pairs (decode):
 *   1. per-expert counts with shared-memory atomics;
 *   2. padded offsets (a serial scan by thread 0: E <= 1024 values);
 *   3. sentinel fill of sorted, tile -> expert map;
 *   4. stable placement, BLOCK pairs at a time (a_place): lanes of a wave
 *      with the same expert find each other with ceil(log2 E) + 1 ballots,
 *      a pair's rank is a popcount, and the waves take turns in order.
 *
 * histogram -> scan -> scatter (CHUNK > 0), over ceil(npairs / CHUNK) blocks:
 *   moe_align_count    block b counts the experts of pairs [b*CHUNK, ...) into
 *                      counts[b][e] (scratch), and all blocks fill the
 *                      sentinels of sorted and tile_expert;
 *   moe_align_scan     one block: per expert, an exclusive scan of its counts
 *                      over the blocks, then a block-wide scan of the padded
 *                      segment sizes; counts[b][e] becomes where block b's
 *                      first pair of expert e goes; tile map and total;
 *   moe_align_scatter  block b places its pairs as step 4 does, from its own
 *                      starting offsets: the order stays stable across blocks.
 * Params: BLOCK threads, CHUNK pairs per block. Dims: S_E experts, S_topk. */

/* ceil(log2(S_E)): the bits that tell expert ids apart (S_E <= 1024). */
#define A_BITS                                                                                \
    ((S_E > 1) + (S_E > 2) + (S_E > 4) + (S_E > 8) + (S_E > 16) + (S_E > 32) + (S_E > 64) +   \
     (S_E > 128) + (S_E > 256) + (S_E > 512))

/* Places the pairs p in [base, base + BLOCK), p < p1, of expert e = ids[p]
 * at sorted[off[e] + (pairs of e before p in this step)] and advances
 * off[e] past them: stable. Within a wave, lanes of the same expert match
 * by ballots over the bits of e, a lane's rank is the popcount of the
 * matching lanes below it, and the group's last lane claims the group's
 * slots from off[e] (distinct experts, distinct words: no race); the
 * waves take their turns in order. Every thread of the block calls it. */
MT_DEVICE void a_place(const int *ids, int *sorted, int *off, int base, int p1)
{
    int tid = threadIdx.x, lane = tid % MT_WARP_SIZE, wave = tid / MT_WARP_SIZE;
    int p = base + tid, e = p < p1 ? ids[p] : -1;
    unsigned long long same = mt_ballot(e >= 0);
    for (int b = 0; b < A_BITS; b++) {
        unsigned long long set = mt_ballot((e >> b) & 1);
        same &= ((e >> b) & 1) ? set : ~set;
    }
    int rank = (int)__popcll(same & ((1ull << lane) - 1ull)), n = (int)__popcll(same);
    int last = e >= 0 ? 63 - (int)__clzll(same) : lane;
    for (int w = 0; w < BLOCK / MT_WARP_SIZE; w++) {
        if (wave == w) {
            int o = 0;
            if (e >= 0 && lane == last) {
                o = off[e];
                off[e] = o + n;
            }
            o = mt_shfl_idx_i32(o, last);
            if (e >= 0)
                sorted[o + rank] = p;
        }
        __syncthreads();
    }
}

MT_KERNEL void moe_align(const int *ids, int *sorted, int *tile_expert, int *total,
                         int npairs, int bm, int cap)
{
    MT_DYN_SHARED(int, sh);
    int *cnt = sh, *off = sh + S_E, *tot = sh + 2 * S_E;
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
    __syncthreads();
    for (int base = 0; base < npairs; base += BLOCK)
        a_place(ids, sorted, off, base, npairs);
}

/* ---- histogram -> scan -> scatter ------------------------------------- */

MT_KERNEL void moe_align_count(const int *ids, int *sorted, int *tile_expert, int *counts,
                               int npairs, int bm, int cap)
{
    MT_DYN_SHARED(int, cnt);
    int tid = threadIdx.x, b = blockIdx.x;
    for (int e = tid; e < S_E; e += BLOCK)
        cnt[e] = 0;
    __syncthreads();
    int p1 = (b + 1) * CHUNK < npairs ? (b + 1) * CHUNK : npairs;
    for (int p = b * CHUNK + tid; p < p1; p += BLOCK)
        atomicAdd(&cnt[ids[p]], 1);
    __syncthreads();
    for (int e = tid; e < S_E; e += BLOCK)
        counts[b * S_E + e] = cnt[e];
    int stride = gridDim.x * BLOCK;
    for (int i = b * BLOCK + tid; i < cap; i += stride)
        sorted[i] = npairs;
    for (int t = b * BLOCK + tid; t < cap / bm; t += stride)
        tile_expert[t] = -1;
}

/* Experts per thread in the scan: ceil(S_E / BLOCK). */
#define A_PER ((S_E + BLOCK - 1) / BLOCK)

MT_KERNEL void moe_align_scan(int *counts, int *tile_expert, int *total, int nblocks, int bm)
{
    MT_DYN_SHARED(int, sh);
    int *pad = sh, *part = sh + S_E; /* padded sizes, then offsets; per-thread sums */
    int tid = threadIdx.x;
    for (int e = tid; e < S_E; e += BLOCK) {
        int run = 0;
        for (int b = 0; b < nblocks; b++) {
            int c = counts[b * S_E + e];
            counts[b * S_E + e] = run;
            run += c;
        }
        pad[e] = (run + bm - 1) / bm * bm;
    }
    __syncthreads();
    /* Exclusive scan of pad: each thread's A_PER consecutive experts, then
     * an inclusive Hillis-Steele scan of the per-thread sums. */
    int e0 = tid * A_PER, local = 0;
    for (int i = 0; i < A_PER && e0 + i < S_E; i++)
        local += pad[e0 + i];
    part[tid] = local;
    __syncthreads();
    for (int d = 1; d < BLOCK; d *= 2) {
        int v = tid >= d ? part[tid - d] : 0;
        __syncthreads();
        part[tid] += v;
        __syncthreads();
    }
    int o = part[tid] - local;
    for (int i = 0; i < A_PER && e0 + i < S_E; i++) {
        int sz = pad[e0 + i];
        pad[e0 + i] = o;
        o += sz;
    }
    if (tid == BLOCK - 1)
        total[0] = part[BLOCK - 1];
    __syncthreads();
    for (int e = tid; e < S_E; e += BLOCK) {
        int end = e + 1 < S_E ? pad[e + 1] : part[BLOCK - 1];
        for (int t = pad[e] / bm; t < end / bm; t++)
            tile_expert[t] = e;
    }
    for (int i = tid; i < nblocks * S_E; i += BLOCK)
        counts[i] += pad[i % S_E];
}

MT_KERNEL void moe_align_scatter(const int *ids, int *sorted, const int *counts, int npairs)
{
    MT_DYN_SHARED(int, sh);
    int *off = sh;
    int tid = threadIdx.x, b = blockIdx.x;
    for (int e = tid; e < S_E; e += BLOCK)
        off[e] = counts[b * S_E + e];
    __syncthreads();
    int p1 = (b + 1) * CHUNK < npairs ? (b + 1) * CHUNK : npairs;
    for (int base = b * CHUNK; base < p1; base += BLOCK)
        a_place(ids, sorted, off, base, p1);
}
