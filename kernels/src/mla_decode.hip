/* mla_decode.hip: absorbed MLA over the paged latent cache (family
 * mla_decode, see kernels/fam_mla_decode.c for the semantics).
 *
 * mla_decode_split: block (split s, head group, query m) walks its piece of
 * the context (or of the query's selection list) BN tokens at a time: the
 * tile's cache rows are copied once into shared memory and used by all HB
 * heads of the block; scores, an online softmax per head, and the weighted
 * sum of the latent rows in registers. Writes (o, max, sum) per head.
 * mla_decode_reduce: block (head, query) combines the NSPLIT pieces.
 *
 * Params: HB, BN, WAVES, NSPLIT; NT threads, NACC accumulators per thread
 * and KV_FP8 come from the family. Shape: S_H, S_L, S_R, S_topk, S_ps,
 * S_sparse. */

#if KV_FP8
typedef unsigned char kv_t;
#define KV_F(x) mt_fp8e4m3_to_f32(x)
#else
typedef mt_bf16 kv_t;
#define KV_F(x) mt_bf16_to_f32(x)
#endif

#define W (S_L + S_R)
#define NEG_BIG (-1.0e30f)

MT_KERNEL __launch_bounds__(NT) void mla_decode_split(
    const mt_bf16 *__restrict__ q, const kv_t *__restrict__ pool, const float *kscale,
    const int *table, int max_pages, const int *qseq, const int *ctx_len, const int *sel,
    float *part, float scale)
{
    MT_DYN_SHARED(float, smem);
    float *sS = smem;                      /* [HB][BN] scores, then weights */
    float *sAlpha = sS + HB * BN;          /* [HB] rescale of this tile */
    float *sMax = sAlpha + HB;             /* [HB] running max */
    float *sSum = sMax + HB;               /* [HB] running sum */
    int *sSlot = (int *)(sSum + HB);       /* [BN] pool row of each token, -1 none */
    mt_bf16 *sQ = (mt_bf16 *)(sSlot + BN); /* [HB][W] */
    kv_t *sKV = (kv_t *)(sQ + HB * W);     /* [BN][W] */

    const int tid = threadIdx.x;
    const int split = blockIdx.x, h0 = blockIdx.y * HB, m = blockIdx.z;
    const int len = ctx_len[m];
    const int n_items = S_sparse ? S_topk : len;
    const int chunk = (n_items + NSPLIT - 1) / NSPLIT;
    const int b0 = split * chunk;
    const int b1 = b0 + chunk < n_items ? b0 + chunk : n_items;
    const int *tbl = table + (long)qseq[m] * max_pages;
    const float ks = kscale[0];
    const float sscale = ks * scale;

    for (int e = tid; e < HB * W; e += NT)
        sQ[e] = q[((long)m * S_H + h0) * W + e];
    if (tid < HB) {
        sMax[tid] = NEG_BIG;
        sSum[tid] = 0.0f;
    }
    float acc[NACC];
    for (int i = 0; i < NACC; i++)
        acc[i] = 0.0f;

    for (int t0 = b0; t0 < b1; t0 += BN) {
        if (tid < BN) {
            int it = t0 + tid, pos = -1;
            if (it < b1)
                pos = S_sparse ? sel[(long)m * S_topk + it] : it;
            sSlot[tid] = (pos >= 0 && pos < len) ? tbl[pos / S_ps] * S_ps + pos % S_ps : -1;
        }
        __syncthreads();
        for (int e = tid; e < BN * W; e += NT) {
            int j = e / W, d = e - j * W;
            int slot = sSlot[j];
            sKV[e] = slot >= 0 ? pool[(long)slot * W + d] : (kv_t)0;
        }
        __syncthreads();
        for (int e = tid; e < HB * BN; e += NT) {
            int hh = e / BN, j = e - hh * BN;
            float dot = NEG_BIG;
            if (sSlot[j] >= 0) {
                const mt_bf16 *qr = sQ + hh * W;
                const kv_t *kr = sKV + j * W;
                dot = 0.0f;
                for (int d = 0; d < W; d++)
                    dot += mt_bf16_to_f32(qr[d]) * KV_F(kr[d]);
                dot *= sscale;
            }
            sS[e] = dot;
        }
        __syncthreads();
        if (tid < HB) {
            float *row = sS + tid * BN;
            float mx = sMax[tid];
            for (int j = 0; j < BN; j++)
                if (sSlot[j] >= 0)
                    mx = mt_fmaxf(mx, row[j]);
            float alpha = mt_expf(sMax[tid] - mx);
            float sum = sSum[tid] * alpha;
            for (int j = 0; j < BN; j++) {
                float pj = sSlot[j] >= 0 ? mt_expf(row[j] - mx) : 0.0f;
                row[j] = pj;
                sum += pj;
            }
            sMax[tid] = mx;
            sSum[tid] = sum;
            sAlpha[tid] = alpha;
        }
        __syncthreads();
        for (int i = 0; i < NACC; i++) {
            int e = tid + i * NT;
            if (e < HB * S_L) {
                int hh = e / S_L, l = e - hh * S_L;
                const float *pr = sS + hh * BN;
                float a = acc[i] * sAlpha[hh];
                for (int j = 0; j < BN; j++)
                    a += pr[j] * KV_F(sKV[j * W + l]);
                acc[i] = a;
            }
        }
        __syncthreads();
    }

    /* part[m][h][split][0:L] = o * kscale, then max and sum. */
    for (int i = 0; i < NACC; i++) {
        int e = tid + i * NT;
        if (e < HB * S_L) {
            int hh = e / S_L, l = e - hh * S_L;
            part[(((long)m * S_H + h0 + hh) * NSPLIT + split) * (S_L + 2) + l] = acc[i] * ks;
        }
    }
    if (tid < HB) {
        float *pr = part + (((long)m * S_H + h0 + tid) * NSPLIT + split) * (S_L + 2);
        pr[S_L] = sMax[tid];
        pr[S_L + 1] = sSum[tid];
    }
}

MT_KERNEL __launch_bounds__(NT) void mla_decode_reduce(const float *part, float *out)
{
    const int h = blockIdx.x, m = blockIdx.y;
    const float *p = part + ((long)m * S_H + h) * NSPLIT * (S_L + 2);
    float mx = NEG_BIG, den = 0.0f;
    for (int s = 0; s < NSPLIT; s++)
        if (p[s * (S_L + 2) + S_L + 1] > 0.0f)
            mx = mt_fmaxf(mx, p[s * (S_L + 2) + S_L]);
    for (int s = 0; s < NSPLIT; s++) {
        float sum = p[s * (S_L + 2) + S_L + 1];
        if (sum > 0.0f)
            den += mt_expf(p[s * (S_L + 2) + S_L] - mx) * sum;
    }
    float inv = den > 0.0f ? 1.0f / den : 0.0f;
    for (int l = threadIdx.x; l < S_L; l += NT) {
        float num = 0.0f;
        for (int s = 0; s < NSPLIT; s++)
            if (p[s * (S_L + 2) + S_L + 1] > 0.0f)
                num += mt_expf(p[s * (S_L + 2) + S_L] - mx) * p[s * (S_L + 2) + l];
        out[((long)m * S_H + h) * S_L + l] = num * inv;
    }
}
