/* dsa_indexer.hip: DSA lightning-indexer scores and per-query top-k
 * (family dsa_indexer, see kernels/fam_dsa_indexer.c for the rule).
 *
 * dsa_scores: block (token tile of BT, query tile of QB). The tile's keys
 * are decoded once into shared memory and reused by consecutive queries of
 * the tile that share a page-table row; one thread per token sums
 * w_h * relu(q_h . k) over the heads. Scores go to scratch [M][cstride].
 * dsa_topk: block per query. Radix select, 8 bits per pass from the top,
 * on keys that order like the floats (histograms with shared atomics),
 * finds the threshold key and how many of its ties to keep; an
 * index-ordered compaction (block prefix sums) then writes the kept
 * indices ascending, ties lowest index first.
 *
 * Params: BT, QB, WAVES, TK_WAVES; NT, TK_NT, KV_FP8 from the family.
 * Shape: S_IH, S_ID, S_topk, S_ps. */

#if KV_FP8
typedef unsigned char kv_t;
#define KV_F(x) mt_fp8e4m3_to_f32(x)
#else
typedef mt_bf16 kv_t;
#define KV_F(x) mt_bf16_to_f32(x)
#endif

MT_KERNEL __launch_bounds__(NT) void dsa_scores(
    const mt_bf16 *__restrict__ q, const float *__restrict__ w, const kv_t *__restrict__ pool,
    const float *kscale, const int *table, int max_pages, const int *qseq, const int *ctx_len,
    float *scores, int cstride, int m, float wscale)
{
    MT_DYN_SHARED(float, smem);
    float *sK = smem;                        /* [BT][ID] */
    float *sW = sK + BT * S_ID;              /* [IH] */
    mt_bf16 *sQ = (mt_bf16 *)(sW + S_IH);    /* [IH][ID] */
    const int tid = threadIdx.x;
    const int t0 = blockIdx.x * BT, q0 = blockIdx.y * QB;
    const float ks = kscale[0];
    int loaded = -1;

    for (int qq = 0; qq < QB && q0 + qq < m; qq++) {
        const int mi = q0 + qq, len = ctx_len[mi], sq = qseq[mi];
        if (t0 >= len)
            continue;
        __syncthreads(); /* the previous query is done with sK, sQ, sW */
        if (sq != loaded) {
            /* Load as far as the longest following query of this row needs. */
            int limit = len;
            for (int k = qq + 1; k < QB && q0 + k < m && qseq[q0 + k] == sq; k++)
                limit = ctx_len[q0 + k] > limit ? ctx_len[q0 + k] : limit;
            const int *tbl = table + (long)sq * max_pages;
            for (int e = tid; e < BT * S_ID; e += NT) {
                int j = e / S_ID, t = t0 + j;
                float v = 0.0f;
                if (t < limit)
                    v = KV_F(pool[((long)tbl[t / S_ps] * S_ps + t % S_ps) * S_ID + e - j * S_ID]) * ks;
                sK[e] = v;
            }
            loaded = sq;
        }
        for (int e = tid; e < S_IH * S_ID; e += NT)
            sQ[e] = q[(long)mi * S_IH * S_ID + e];
        for (int e = tid; e < S_IH; e += NT)
            sW[e] = w[(long)mi * S_IH + e];
        __syncthreads();
        for (int j = tid; j < BT; j += NT) {
            int t = t0 + j;
            if (t < len) {
                const float *kr = sK + j * S_ID;
                float sc = 0.0f;
                for (int h = 0; h < S_IH; h++) {
                    const mt_bf16 *qr = sQ + h * S_ID;
                    float dot = 0.0f;
                    for (int d = 0; d < S_ID; d++)
                        dot += mt_bf16_to_f32(qr[d]) * kr[d];
                    if (dot > 0.0f)
                        sc += sW[h] * dot;
                }
                scores[(long)mi * cstride + t] = sc * wscale;
            }
        }
    }
}

/* Unsigned keys in the order of the floats. */
MT_DEVICE unsigned order_key(float f)
{
    unsigned u = mt_float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Exclusive prefix sum of v over the block; *total gets the block's sum. */
MT_DEVICE int block_scan(int v, int *buf, int *total)
{
    const int tid = threadIdx.x;
    buf[tid] = v;
    __syncthreads();
    for (int off = 1; off < TK_NT; off *= 2) {
        int t = tid >= off ? buf[tid - off] : 0;
        __syncthreads();
        buf[tid] += t;
        __syncthreads();
    }
    int incl = buf[tid];
    *total = buf[TK_NT - 1];
    __syncthreads();
    return incl - v;
}

MT_KERNEL __launch_bounds__(TK_NT) void dsa_topk(const float *scores, int cstride,
                                                 const int *ctx_len, int *idx, float *val)
{
    __shared__ int hist[256];
    __shared__ int scan[TK_NT];
    __shared__ int pick[2];
    const int mi = blockIdx.x, tid = threadIdx.x;
    const int len = ctx_len[mi];
    const float *sc = scores + (long)mi * cstride;
    int *oi = idx + (long)mi * S_topk;
    float *ov = val + (long)mi * S_topk;
    const float neg_inf = mt_uint_as_float(0xff800000u);

    if (len <= S_topk) {
        for (int i = tid; i < S_topk; i += TK_NT) {
            oi[i] = i < len ? i : -1;
            ov[i] = i < len ? sc[i] : neg_inf;
        }
        return;
    }

    unsigned prefix = 0u, mask = 0u;
    int need = S_topk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += TK_NT)
            hist[i] = 0;
        __syncthreads();
        for (int i = tid; i < len; i += TK_NT) {
            unsigned u = order_key(sc[i]);
            if ((u & mask) == prefix)
                atomicAdd(&hist[(u >> shift) & 255u], 1);
        }
        __syncthreads();
        if (tid == 0) {
            int above = 0, d = 255;
            for (; d > 0; d--) {
                if (above + hist[d] >= need)
                    break;
                above += hist[d];
            }
            pick[0] = d;
            pick[1] = need - above;
        }
        __syncthreads();
        prefix |= (unsigned)pick[0] << shift;
        mask |= 255u << shift;
        need = pick[1];
        __syncthreads();
    }

    /* Everything above the threshold key, and the first `need` equal to it. */
    int base = 0, eq_seen = 0;
    for (int c0 = 0; c0 < len; c0 += TK_NT) {
        int i = c0 + tid;
        unsigned u = i < len ? order_key(sc[i]) : 0u;
        int gt = i < len && u > prefix, eq = i < len && u == prefix;
        int eq_total, take_total;
        int eq_before = block_scan(eq, scan, &eq_total);
        int take = gt || (eq && eq_seen + eq_before < need);
        int pos = block_scan(take, scan, &take_total);
        if (take) {
            oi[base + pos] = i;
            ov[base + pos] = sc[i];
        }
        base += take_total;
        eq_seen += eq_total;
    }
}
