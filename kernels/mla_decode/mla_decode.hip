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
 * MMA=1 or 2 runs the split kernel on the prelude's matrix fragments
 * (MT_MMA_SHAPE 16 or 32), see "MMA path" below; MMA=3, with an fp8
 * cache, on fp8 ones after the mla_q8 pre-pass ("fp8 path"); MMA=0 is the
 * scalar path.
 *
 * Params: HB, BN, WAVES, MMA, NSPLIT; NT threads, NACC accumulators per
 * thread and KV_FP8 come from the family. Shape: S_H, S_L, S_R, S_topk,
 * S_ps, S_sparse. */

#ifndef MMA
#define MMA 0
#endif

#if KV_FP8
typedef unsigned char kv_t;
#define KV_F(x) mt_fp8e4m3_to_f32(x)
#else
typedef mt_bf16 kv_t;
#define KV_F(x) mt_bf16_to_f32(x)
#endif

#define W (S_L + S_R)
#define NEG_BIG (-1.0e30f)

#if !MMA
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

#endif /* !MMA */

#if MMA == 1 || MMA == 2
/* ---- MMA path ------------------------------------------------------------
 * Per KV tile of BN tokens:
 *  1. the tile's cache rows are decoded to bf16 (fp8 e4m3 is exact in
 *     bf16; kscale stays a scalar) into sKV [BN][A_LDK], rows padded by
 *     A_PAD so no row stride is a power of two;
 *  2. S = Q K^T: HB x BN fragments over K = L + R; A (the absorbed query)
 *     straight from global memory (64 heads x 576 bf16 do not fit LDS
 *     next to the tile; the rows stay in L1/L2 across tiles), B from sKV
 *     rows (load_bt); stored f32 to sS;
 *  3. online softmax: a group of A_G lanes of one wave per head row, max
 *     and sum by shuffles; P to sP as two bf16 parts, hi = bf16(p) and
 *     lo = bf16(p - hi) (p to about 2^-17: one bf16 P is off by up to
 *     2^-9 per weight, which the family's tolerance, 2e-4 + 2e-3 |o|,
 *     rejects by 5-7x), the running max and sum and this tile's rescale
 *     alpha per row;
 *  4. O = O * alpha + P_hi V + P_lo V: the waves own fixed fragments of
 *     the HB x L output (L split across waves first, then heads), A from
 *     sP, B the latent part of sKV read as a K x N tile (load_b).
 * The split-K over the context, the slot addressing (dense, sparse, paged)
 * and the (o, max, sum) output are the scalar path's. */
#if !MT_MMA_HAVE
#error "MMA needs matrix instructions, which this target does not have"
#endif
#if MMA == 2
#if !MT_MMA_HAVE_32
#error "MMA=2 needs the 32x32x8 matrix instruction (AMD wave64)"
#endif
#undef MT_MMA_SHAPE
#define MT_MMA_SHAPE 32
#endif
#if NT != WAVES * MT_MMA_WAVE
#error "MMA: the block's waves must be the matrix instruction's"
#endif

#define A_PAD (MT_MMA_WAVE == 64 ? 4 : 8)
#define A_LDK (W + A_PAD)            /* sKV row pitch (bf16) */
#define A_LDP (BN + A_PAD)           /* sP row pitch (bf16) */
#define A_LDS (BN + 1)               /* sS row pitch (f32) */
/* S = Q K^T: QI x QJ fragments; QSJ waves share a fragment row (splitting
 * its columns), QWR waves walk the rows. */
#define A_QI (HB / MT_MMA_M)
#define A_QJ (BN / MT_MMA_N)
#define A_QSJ0 (WAVES / A_QI < 1 ? 1 : WAVES / A_QI)
#define A_QSJ (A_QSJ0 < A_QJ ? A_QSJ0 : A_QJ)
#define A_QNJ (A_QJ / A_QSJ)
#define A_QWR (WAVES / A_QSJ)
/* O: waves across L first (A_WN), then heads (A_WM); each owns A_TM x A_TN
 * fragments. */
#define A_WN (WAVES < S_L / MT_MMA_N ? WAVES : S_L / MT_MMA_N)
#define A_WM (WAVES / A_WN)
#define A_TM (HB / (A_WM * MT_MMA_M))
#define A_TN (S_L / (A_WN * MT_MMA_N))
/* Softmax: A_G lanes per head row (a power of two within one wave). */
#define A_G0 (NT / HB < 1 ? 1 : NT / HB)
#define A_G1 (A_G0 < BN ? A_G0 : BN)
#define A_G (A_G1 < MT_MMA_WAVE ? A_G1 : MT_MMA_WAVE)

/* Four bf16 of one cache row, decoded, as one 64-bit word. */
MT_DEVICE unsigned long long a_load4(const kv_t *src)
{
#if KV_FP8
    unsigned v = *(const unsigned *)src;
    unsigned long long r = 0;
    for (int e = 0; e < 4; e++) {
        unsigned b = mt_float_as_uint(mt_fp8e4m3_to_f32((unsigned char)(v >> (8 * e)))) >> 16;
        r |= (unsigned long long)b << (16 * e);
    }
    return r;
#else
    return *(const unsigned long long *)src;
#endif
}

MT_KERNEL __launch_bounds__(NT) void mla_decode_split(
    const mt_bf16 *__restrict__ q, const kv_t *__restrict__ pool, const float *kscale,
    const int *table, int max_pages, const int *qseq, const int *ctx_len, const int *sel,
    float *part, float scale)
{
    __shared__ __attribute__((aligned(16))) mt_bf16 sKV[BN * A_LDK];
    __shared__ __attribute__((aligned(16))) mt_bf16 sP[2][HB * A_LDP]; /* hi, lo */
    __shared__ float sS[HB * A_LDS];
    __shared__ float sAlpha[HB], sMax[HB], sSum[HB];
    __shared__ int sSlot[BN];

    const int tid = threadIdx.x, wave = tid / MT_MMA_WAVE;
    const int split = blockIdx.x, h0 = blockIdx.y * HB, m = blockIdx.z;
    const int len = ctx_len[m];
    const int n_items = S_sparse ? S_topk : len;
    const int chunk = (n_items + NSPLIT - 1) / NSPLIT;
    const int b0 = split * chunk;
    const int b1 = b0 + chunk < n_items ? b0 + chunk : n_items;
    const int *tbl = table + (long)qseq[m] * max_pages;
    const float ks = kscale[0];
    const float sscale = ks * scale;
    const mt_bf16 *qm = q + ((long)m * S_H + h0) * W;

    if (tid < HB) {
        sMax[tid] = NEG_BIG;
        sSum[tid] = 0.0f;
    }
    const int wm = wave / A_WN, wn = wave % A_WN;
    mt_mma_acc acc[A_TM][A_TN];
    MT_UNROLL
    for (int i = 0; i < A_TM; i++)
        MT_UNROLL
        for (int j = 0; j < A_TN; j++)
            acc[i][j] = mt_mma_acc_zero();

    for (int t0 = b0; t0 < b1; t0 += BN) {
        if (tid < BN) {
            int it = t0 + tid, pos = -1;
            if (it < b1)
                pos = S_sparse ? sel[(long)m * S_topk + it] : it;
            sSlot[tid] = (pos >= 0 && pos < len) ? tbl[pos / S_ps] * S_ps + pos % S_ps : -1;
        }
        __syncthreads();
        /* 1: the tile, 4 values per item (W % 4 == 0: aligned loads) */
        for (int e = tid; e < BN * (W / 4); e += NT) {
            int j = e / (W / 4), c = e - j * (W / 4);
            int slot = sSlot[j];
            *(unsigned long long *)(sKV + j * A_LDK + 4 * c) =
                slot >= 0 ? a_load4(pool + (long)slot * W + 4 * c) : 0ull;
        }
        __syncthreads();
        /* 2: S = Q K^T */
        for (int i = wave / A_QSJ; i < A_QI; i += A_QWR) {
            const int j0 = (wave % A_QSJ) * A_QNJ;
            mt_mma_acc s[A_QNJ];
            for (int j = 0; j < A_QNJ; j++)
                s[j] = mt_mma_acc_zero();
            const mt_bf16 *qa = qm + (long)i * MT_MMA_M * W;
            for (int kk = 0; kk < W; kk += MT_MMA_K) {
                mt_mma_a fa = mt_mma_load_a(qa + kk, W);
                for (int j = 0; j < A_QNJ; j++) {
                    mt_mma_b fb = mt_mma_load_bt(sKV + (j0 + j) * MT_MMA_N * A_LDK + kk, A_LDK);
                    s[j] = mt_mma_bf16(fa, fb, s[j]);
                }
            }
            for (int j = 0; j < A_QNJ; j++)
                mt_mma_store_acc(sS + i * MT_MMA_M * A_LDS + (j0 + j) * MT_MMA_N, A_LDS, s[j]);
        }
        __syncthreads();
        /* 3: online softmax, A_G lanes per row; every lane takes part in
         * the shuffles (rows past HB only when NT / A_G > HB) */
        for (int r0 = 0; r0 < HB; r0 += NT / A_G) {
            const int r = r0 + tid / A_G, g = tid % A_G;
            const int live = r < HB;
            float mx = NEG_BIG;
            for (int j = g; j < BN; j += A_G)
                if (live && sSlot[j] >= 0)
                    mx = mt_fmaxf(mx, sS[r * A_LDS + j] * sscale);
            for (int o = A_G / 2; o > 0; o /= 2)
                mx = mt_fmaxf(mx, mt_shfl_xor_f32(mx, o));
            const float old = live ? sMax[r] : NEG_BIG;
            const float mnew = mt_fmaxf(old, mx);
            float sum = 0.0f;
            for (int j = g; j < BN; j += A_G) {
                float pj = 0.0f;
                if (live && sSlot[j] >= 0)
                    pj = mt_expf(sS[r * A_LDS + j] * sscale - mnew);
                mt_bf16 hi = mt_f32_to_bf16(pj);
                sum += pj;
                if (live) {
                    sP[0][r * A_LDP + j] = hi;
                    sP[1][r * A_LDP + j] = mt_f32_to_bf16(pj - mt_bf16_to_f32(hi));
                }
            }
            for (int o = A_G / 2; o > 0; o /= 2)
                sum += mt_shfl_xor_f32(sum, o);
            if (live && g == 0) {
                float alpha = mt_expf(old - mnew);
                sAlpha[r] = alpha;
                sSum[r] = sSum[r] * alpha + sum;
                sMax[r] = mnew;
            }
        }
        __syncthreads();
        /* 4: O = O * alpha + P V (every loop over acc unrolled: NVRTC
         * keeps acc in local memory otherwise, 512 B per lane at HB=64) */
        MT_UNROLL
        for (int i = 0; i < A_TM; i++) {
            float al[MT_MMA_ACC_REGS];
            MT_UNROLL
            for (int rg = 0; rg < MT_MMA_ACC_REGS; rg++)
                al[rg] = sAlpha[(wm * A_TM + i) * MT_MMA_M + mt_mma_acc_row(rg)];
            MT_UNROLL
            for (int j = 0; j < A_TN; j++)
                MT_UNROLL
                for (int rg = 0; rg < MT_MMA_ACC_REGS; rg++)
                    acc[i][j].x[rg] *= al[rg];
        }
        for (int kk = 0; kk < BN; kk += MT_MMA_K) {
            mt_mma_a fa[2][A_TM];
            MT_UNROLL
            for (int i = 0; i < A_TM; i++) {
                int o = (wm * A_TM + i) * MT_MMA_M * A_LDP + kk;
                fa[0][i] = mt_mma_load_a(sP[0] + o, A_LDP);
                fa[1][i] = mt_mma_load_a(sP[1] + o, A_LDP);
            }
            MT_UNROLL
            for (int j = 0; j < A_TN; j++) {
                mt_mma_b fb = mt_mma_load_b(sKV + kk * A_LDK + (wn * A_TN + j) * MT_MMA_N, A_LDK);
                MT_UNROLL
                for (int i = 0; i < A_TM; i++) {
                    acc[i][j] = mt_mma_bf16(fa[0][i], fb, acc[i][j]);
                    acc[i][j] = mt_mma_bf16(fa[1][i], fb, acc[i][j]);
                }
            }
        }
        __syncthreads();
    }

    /* part[m][h][split][0:L] = o * kscale, then max and sum. One fragment
     * at a time (short loops stay unrolled: NVRTC puts acc in local memory
     * when a loop over registers is not). */
    float *pb = part + (((long)m * S_H + h0) * NSPLIT + split) * (S_L + 2);
    MT_UNROLL
    for (int i = 0; i < A_TM; i++)
        MT_UNROLL
        for (int j = 0; j < A_TN; j++) {
            mt_mma_acc o = acc[i][j];
            for (int rg = 0; rg < MT_MMA_ACC_REGS; rg++)
                o.x[rg] *= ks;
            mt_mma_store_acc(pb + (long)(wm * A_TM + i) * MT_MMA_M * NSPLIT * (S_L + 2) +
                                 (wn * A_TN + j) * MT_MMA_N,
                             NSPLIT * (S_L + 2), o);
        }
    if (tid < HB) {
        float *pr = part + (((long)m * S_H + h0 + tid) * NSPLIT + split) * (S_L + 2);
        pr[S_L] = sMax[tid];
        pr[S_L + 1] = sSum[tid];
    }
}
#endif /* MMA == 1 || MMA == 2 */

#if MMA == 3
/* ---- fp8 path --------------------------------------------------------------
 * With an fp8 cache the matrix instructions take the cache's own e4m3 bytes:
 *  0. mla_q8 (before the split kernel, once per launch) scales each head's
 *     absorbed query row by the power of two 2^e_h that puts its largest
 *     element in [128, 256) and splits it exactly into two e4m3 parts
 *     (hi = fp8(q 2^e), lo = fp8(q 2^e - hi): a bf16 value is hi + lo, see
 *     dsa_indexer.hip), stored in the instructions' fragment order (each
 *     lane's bytes of a 16 x 32 tile together: one coalesced load a lane);
 *  1. the tile's BN cache rows land in shared memory as they are
 *     (mt_async16: cp.async on NVIDIA); the copies of the next tile are
 *     issued as soon as this one's scores are done and complete after its
 *     P V, so they overlap the softmax and the P V of this one;
 *  2. S = Q K^T: two fp8 MMAs (hi, lo) per 32 dims into one accumulator,
 *     B the tile rows as they are; row h scaled by 2^-e_h kscale scale;
 *  3. the online softmax of the MMA path, P (in [0, 1], times 2^8) split
 *     into three e4m3 parts (about 12 significant bits; one bf16 P, 8 bits,
 *     is what the family's tolerance rejects);
 *  4. O = O alpha + P V: three fp8 MMAs per 32 tokens, B the latent part of
 *     the tile transposed to [L][BN] (a 4 x 4 byte transpose a thread).
 * BN is one K step (32 tokens). The split-K over the context, the slot
 * addressing (dense, sparse, paged) and the (o, max, sum) output are the
 * scalar path's. */
#if !MT_MMA8_HAVE
#error "MMA=3 needs fp8 matrix instructions (gfx940+, sm_89+)"
#endif
#if !KV_FP8
#error "MMA=3 multiplies the fp8 cache as it is (kv=fp8)"
#endif
#if NT != WAVES * MT_MMA8_WAVE
#error "MMA=3: the block's waves must be the matrix instruction's"
#endif
#if BN != 32 || W % 32 || S_L % 32 || HB % 16
#error "MMA=3: BN is 32, L + R and L whole K steps, HB whole fragment rows"
#endif

#define F_LDK (W + 16)                 /* sK row pitch (bytes) */
#define F_VPAD (MT_MMA8_WAVE == 64 ? 16 : 0)
#define F_LDV (BN + F_VPAD)            /* sVt row pitch (bytes) */
#define F_LDP (BN + 16)                /* sP row pitch (bytes) */
#define F_LDS (BN + 1)                 /* sS row pitch (f32) */
#define F_CH (W / 16)                  /* 16-byte copies of a cache row */
#define F_NCP ((BN * F_CH + NT - 1) / NT)
#define F_QF (W / 32)                  /* K steps of the scores */
/* S: (HB/16) x (BN/N) fragment tiles over the waves */
#define F_SI (HB / 16)
#define F_SJ (BN / MT_MMA8_N)
/* O: waves across L first, then heads */
#define F_WN (WAVES < S_L / MT_MMA8_N ? WAVES : S_L / MT_MMA8_N)
#define F_WM (WAVES / F_WN)
#define F_TM (HB / (F_WM * 16))
#define F_TN (S_L / (F_WN * MT_MMA8_N))
#define F_G0 (NT / HB < 1 ? 1 : NT / HB)
#define F_G1 (F_G0 < BN ? F_G0 : BN)
#define F_G (F_G1 < MT_MMA8_WAVE ? F_G1 : MT_MMA8_WAVE)
/* the fragment-order query of mla_q8: [M][S_H/16][F_QF][2][512] bytes, then
 * the exponents int32 [M][S_H] */
#define F_QTILE 512

/* One wave a head row: its exponent (into e) and, later, its two parts. */
MT_DEVICE int f_exp(const mt_bf16 *row)
{
    float a = 0.0f;
    for (int d = mt_lane_id(); d < W; d += MT_MMA8_WAVE) {
        float v = mt_bf16_to_f32(row[d]);
        a = mt_fmaxf(a, v < 0.0f ? -v : v);
    }
    for (int o = MT_MMA8_WAVE / 2; o > 0; o /= 2)
        a = mt_fmaxf(a, mt_shfl_xor_f32(a, o));
    return a > 0.0f ? 7 - ((int)((mt_float_as_uint(a) >> 23) & 0xffu) - 127) : 0;
}

/* Grid: (S_H / 16, M), NT threads: the query of 16 heads of one token in
 * fragment order, then their exponents. */
MT_KERNEL __launch_bounds__(NT) void mla_q8(const mt_bf16 *__restrict__ q,
                                            unsigned char *__restrict__ q8)
{
    __shared__ int sE[16];
    const int hg = blockIdx.x, m = blockIdx.y, tid = threadIdx.x;
    const mt_bf16 *qm = q + ((long)m * S_H + hg * 16) * W;
    for (int r = tid / MT_MMA8_WAVE; r < 16; r += WAVES) {
        int e = f_exp(qm + (long)r * W);
        if (mt_lane_id() == 0)
            sE[r] = e;
    }
    __syncthreads();
    unsigned char *dst = q8 + ((long)m * (S_H / 16) + hg) * F_QF * 2 * F_QTILE;
    for (int i = tid; i < F_QF * F_QTILE; i += NT) {
        const int kk = i / F_QTILE, pos = i % F_QTILE;
        int r, k;
        mt_mma8_a_cell(pos / MT_MMA8_A_BYTES, pos % MT_MMA8_A_BYTES, &r, &k);
        const float v = mt_ldexpf(mt_bf16_to_f32(qm[(long)r * W + kk * 32 + k]), sE[r]);
        const unsigned hi = mt_f32_to_fp8e4m3(v);
        dst[(kk * 2) * F_QTILE + pos] = (unsigned char)hi;
        dst[(kk * 2 + 1) * F_QTILE + pos] =
            (unsigned char)mt_f32_to_fp8e4m3(v - mt_fp8e4m3_to_f32(hi));
    }
    if (tid < 16) {
        int *ex = (int *)(q8 + (long)gridDim.y * S_H * W * 2);
        ex[(long)m * S_H + hg * 16 + tid] = sE[tid];
    }
}

/* The pool row of item it of the split (-1: none). */
MT_DEVICE int f_slot(int it, int b1, int len, const int *sel, const int *tbl, int m)
{
    int pos = -1;
    if (it < b1)
        pos = S_sparse ? sel[(long)m * S_topk + it] : it;
    return (pos >= 0 && pos < len) ? tbl[pos / S_ps] * S_ps + pos % S_ps : -1;
}

MT_KERNEL __launch_bounds__(NT) void mla_decode_split(
    const mt_bf16 *__restrict__ q, const kv_t *__restrict__ pool, const float *kscale,
    const int *table, int max_pages, const int *qseq, const int *ctx_len, const int *sel,
    float *part, float scale)
{
    __shared__ __attribute__((aligned(16))) unsigned char sK[BN * F_LDK];
    __shared__ __attribute__((aligned(16))) unsigned char sVt[S_L * F_LDV];
    __shared__ __attribute__((aligned(16))) unsigned char sP[3][HB * F_LDP];
    __shared__ float sS[HB * F_LDS];
    __shared__ float sAlpha[HB], sMax[HB], sSum[HB];
    __shared__ int sSlot[2][BN];

    /* q is mla_q8's output here: the fragment-order query, then exponents */
    const unsigned char *q8 = (const unsigned char *)q;
    const int *qexp = (const int *)(q8 + (long)gridDim.z * S_H * W * 2);
    const int tid = threadIdx.x, wave = tid / MT_MMA8_WAVE;
    const int split = blockIdx.x, h0 = blockIdx.y * HB, m = blockIdx.z;
    const int len = ctx_len[m];
    const int n_items = S_sparse ? S_topk : len;
    const int chunk = (n_items + NSPLIT - 1) / NSPLIT;
    const int b0 = split * chunk;
    const int b1 = b0 + chunk < n_items ? b0 + chunk : n_items;
    const int *tbl = table + (long)qseq[m] * max_pages;
    const float ks = kscale[0];
    const float sscale = ks * scale;

    if (tid < HB) {
        sMax[tid] = NEG_BIG;
        sSum[tid] = 0.0f;
    }
    const int wm = wave / F_WN, wn = wave % F_WN;
    mt_mma8_acc acc[F_TM][F_TN];
    MT_UNROLL
    for (int i = 0; i < F_TM; i++)
        MT_UNROLL
        for (int j = 0; j < F_TN; j++)
            acc[i][j] = mt_mma8_acc_zero();

    /* the first tile's rows */
    mt_u32x4 hold[F_NCP];
    if (tid < BN)
        sSlot[0][tid] = f_slot(b0 + tid, b1, len, sel, tbl, m);
    __syncthreads();
    MT_UNROLL
    for (int c = 0; c < F_NCP; c++) {
        const int e = tid + c * NT, j = e / F_CH, o = 16 * (e % F_CH);
        if (e < BN * F_CH && sSlot[0][j] >= 0)
            mt_async16_begin(sK + j * F_LDK + o, pool + (long)sSlot[0][j] * W + o, &hold[c]);
    }
    mt_async_wait();
    MT_UNROLL
    for (int c = 0; c < F_NCP; c++) {
        const int e = tid + c * NT, j = e / F_CH, o = 16 * (e % F_CH);
        if (e >= BN * F_CH)
            continue;
        if (sSlot[0][j] >= 0) {
            mt_async16_end(sK + j * F_LDK + o, hold[c]);
        } else {
            const mt_u32x4 z = {0u, 0u, 0u, 0u};
            *(mt_u32x4 *)(sK + j * F_LDK + o) = z;
        }
    }
    __syncthreads();

    for (int t0 = b0, cur = 0; t0 < b1; t0 += BN, cur ^= 1) {
        /* 1b: the latent part transposed, 4 tokens x 4 values a step */
        for (int e = tid; e < (BN / 4) * (S_L / 4); e += NT) {
            const int j = 4 * (e % (BN / 4)), l = 4 * (e / (BN / 4));
            unsigned r0 = *(const unsigned *)(sK + (j + 0) * F_LDK + l);
            unsigned r1 = *(const unsigned *)(sK + (j + 1) * F_LDK + l);
            unsigned r2 = *(const unsigned *)(sK + (j + 2) * F_LDK + l);
            unsigned r3 = *(const unsigned *)(sK + (j + 3) * F_LDK + l);
            MT_UNROLL
            for (int c = 0; c < 4; c++)
                *(unsigned *)(sVt + (l + c) * F_LDV + j) =
                    ((r0 >> (8 * c)) & 0xffu) | ((r1 >> (8 * c)) & 0xffu) << 8 |
                    ((r2 >> (8 * c)) & 0xffu) << 16 | ((r3 >> (8 * c)) & 0xffu) << 24;
        }
        /* 2: S = Q K^T, the waves over the fragment tiles */
        for (int f = wave; f < F_SI * F_SJ; f += WAVES) {
            const int fi = f / F_SJ, fj = f % F_SJ;
            const unsigned char *qa =
                q8 + ((long)m * (S_H / 16) + h0 / 16 + fi) * F_QF * 2 * F_QTILE;
            mt_mma8_acc s = mt_mma8_acc_zero();
            for (int kk = 0; kk < F_QF; kk++) {
                mt_mma8_b fb = mt_mma8_load_bt_tile(sK + fj * MT_MMA8_N * F_LDK + 32 * kk, F_LDK);
                s = mt_mma8_fp8(mt_mma8_load_a_frag(qa + (2 * kk) * F_QTILE), fb, s);
                s = mt_mma8_fp8(mt_mma8_load_a_frag(qa + (2 * kk + 1) * F_QTILE), fb, s);
            }
            MT_UNROLL
            for (int r = 0; r < 4; r++) {
                const int h = fi * 16 + mt_mma8_acc_row(r);
                sS[h * F_LDS + fj * MT_MMA8_N + mt_mma8_acc_col(r)] =
                    s.x[r] * mt_ldexpf(sscale, -qexp[(long)m * S_H + h0 + h]);
            }
        }
        __syncthreads();
        /* 1: the next tile's rows start now (sK is free) */
        const int next = t0 + BN < b1;
        if (next && tid < BN)
            sSlot[cur ^ 1][tid] = f_slot(t0 + BN + tid, b1, len, sel, tbl, m);
        __syncthreads();
        if (next) {
            MT_UNROLL
            for (int c = 0; c < F_NCP; c++) {
                const int e = tid + c * NT, j = e / F_CH, o = 16 * (e % F_CH);
                if (e < BN * F_CH && sSlot[cur ^ 1][j] >= 0)
                    mt_async16_begin(sK + j * F_LDK + o, pool + (long)sSlot[cur ^ 1][j] * W + o,
                                     &hold[c]);
            }
        }
        /* 3: online softmax, F_G lanes a row; P x 2^8 in three e4m3 parts */
        for (int r0 = 0; r0 < HB; r0 += NT / F_G) {
            const int r = r0 + tid / F_G, g = tid % F_G;
            const int live = r < HB;
            float mx = NEG_BIG;
            for (int j = g; j < BN; j += F_G)
                if (live && sSlot[cur][j] >= 0)
                    mx = mt_fmaxf(mx, sS[r * F_LDS + j]);
            for (int o = F_G / 2; o > 0; o /= 2)
                mx = mt_fmaxf(mx, mt_shfl_xor_f32(mx, o));
            const float old = live ? sMax[r] : NEG_BIG;
            const float mnew = mt_fmaxf(old, mx);
            float sum = 0.0f;
            for (int j = g; j < BN; j += F_G) {
                float pj = 0.0f;
                if (live && sSlot[cur][j] >= 0)
                    pj = mt_expf(sS[r * F_LDS + j] - mnew);
                sum += pj;
                if (live) {
                    const float v = pj * 256.0f;
                    const unsigned c0 = mt_f32_to_fp8e4m3(v);
                    const float r1 = v - mt_fp8e4m3_to_f32(c0);
                    const unsigned c1 = mt_f32_to_fp8e4m3(r1);
                    sP[0][r * F_LDP + j] = (unsigned char)c0;
                    sP[1][r * F_LDP + j] = (unsigned char)c1;
                    sP[2][r * F_LDP + j] =
                        (unsigned char)mt_f32_to_fp8e4m3(r1 - mt_fp8e4m3_to_f32(c1));
                }
            }
            for (int o = F_G / 2; o > 0; o /= 2)
                sum += mt_shfl_xor_f32(sum, o);
            if (live && g == 0) {
                float alpha = mt_expf(old - mnew);
                sAlpha[r] = alpha;
                sSum[r] = sSum[r] * alpha + sum;
                sMax[r] = mnew;
            }
        }
        __syncthreads();
        /* 4: O = O alpha + P V */
        MT_UNROLL
        for (int i = 0; i < F_TM; i++) {
            float al[4];
            MT_UNROLL
            for (int rg = 0; rg < 4; rg++)
                al[rg] = sAlpha[(wm * F_TM + i) * 16 + mt_mma8_acc_row(rg)];
            MT_UNROLL
            for (int j = 0; j < F_TN; j++)
                MT_UNROLL
                for (int rg = 0; rg < 4; rg++)
                    acc[i][j].x[rg] *= al[rg];
        }
        MT_UNROLL
        for (int pp = 0; pp < 3; pp++) {
            mt_mma8_a fa[F_TM];
            MT_UNROLL
            for (int i = 0; i < F_TM; i++)
                fa[i] = mt_mma8_load_a_tile(sP[pp] + (wm * F_TM + i) * 16 * F_LDP, F_LDP);
            MT_UNROLL
            for (int j = 0; j < F_TN; j++) {
                mt_mma8_b fb =
                    mt_mma8_load_bt_tile(sVt + (wn * F_TN + j) * MT_MMA8_N * F_LDV, F_LDV);
                MT_UNROLL
                for (int i = 0; i < F_TM; i++)
                    acc[i][j] = mt_mma8_fp8(fa[i], fb, acc[i][j]);
            }
        }
        /* 1: the next tile's rows complete */
        if (next) {
            mt_async_wait();
            MT_UNROLL
            for (int c = 0; c < F_NCP; c++) {
                const int e = tid + c * NT, j = e / F_CH, o = 16 * (e % F_CH);
                if (e >= BN * F_CH)
                    continue;
                if (sSlot[cur ^ 1][j] >= 0) {
                    mt_async16_end(sK + j * F_LDK + o, hold[c]);
                } else {
                    const mt_u32x4 z = {0u, 0u, 0u, 0u};
                    *(mt_u32x4 *)(sK + j * F_LDK + o) = z;
                }
            }
        }
        __syncthreads();
    }

    /* part[m][h][split][0:L] = o kscale 2^-8 (P was scaled by 2^8), then
     * max and sum */
    float *pb = part + (((long)m * S_H + h0) * NSPLIT + split) * (S_L + 2);
    MT_UNROLL
    for (int i = 0; i < F_TM; i++)
        MT_UNROLL
        for (int j = 0; j < F_TN; j++)
            MT_UNROLL
            for (int rg = 0; rg < 4; rg++) {
                const int h = (wm * F_TM + i) * 16 + mt_mma8_acc_row(rg);
                const int l = (wn * F_TN + j) * MT_MMA8_N + mt_mma8_acc_col(rg);
                pb[(long)h * NSPLIT * (S_L + 2) + l] = acc[i][j].x[rg] * ks * 0.00390625f;
            }
    if (tid < HB) {
        float *pr = part + (((long)m * S_H + h0 + tid) * NSPLIT + split) * (S_L + 2);
        pr[S_L] = sMax[tid];
        pr[S_L + 1] = sSum[tid];
    }
}
#endif /* MMA == 3 */

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
