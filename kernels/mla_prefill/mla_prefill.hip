/* mla_prefill.hip: causal MLA prefill of a chunk against the paged latent
 * cache (family mla_prefill, see kernels/fam_mla_prefill.c).
 *
 * mla_prefill_expand: block (token tile of ET, row tile of EN) multiplies
 * the context's latent rows by kv_b through shared-memory tiles (EK deep)
 * into bf16 k_nope [T][H][D] and v [T][H][V]; scalar FP32, or on matrix
 * fragments with MMA (below).
 * mla_prefill_attn: block (query tile of BM, head) runs flash attention
 * over key tiles of BN: S = q k^T in shared memory, an online softmax per
 * row, o += p v in registers. Key/value tiles are loaded STAGES - 1 tiles
 * ahead into a ring of shared-memory buffers, so loads overlap the math of
 * the current tile with one barrier per tile.
 *
 * MMA=1 or 2 runs the expansion and the attention on the prelude's matrix fragments
 * (MT_MMA_SHAPE 16 or 32), see "MMA path" below; MMA=0 is the scalar path.
 *
 * Params: BM, BN, WAVES, STAGES, MMA; NT, NACC, KV_FP8, ET, EN, EK from the
 * family. Shape: S_H, S_L, S_R, S_D, S_V, S_ps. */

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
#define DQ (S_D + S_R)
#define HR (S_D + S_V)
#define NEG_BIG (-1.0e30f)
#define EACC ((ET * EN + NT - 1) / NT)

#if !MMA
MT_KERNEL __launch_bounds__(NT) void mla_prefill_expand(
    const kv_t *__restrict__ pool, const float *kscale, const int *table,
    const mt_bf16 *__restrict__ wkv, mt_bf16 *kn, mt_bf16 *vv, int n_tok)
{
    MT_DYN_SHARED(float, smem);
    float *sC = smem;            /* [ET][EK] latent, decoded and scaled */
    float *sW = sC + ET * EK;    /* [EN][EK] kv_b rows */
    const int tid = threadIdx.x;
    const int t0 = blockIdx.x * ET, r0 = blockIdx.y * EN;
    const float ks = kscale[0];
    float acc[EACC];
    for (int i = 0; i < EACC; i++)
        acc[i] = 0.0f;

    for (int k0 = 0; k0 < S_L; k0 += EK) {
        for (int e = tid; e < ET * EK; e += NT) {
            int j = e / EK, k = k0 + e - j * EK, t = t0 + j;
            float v = 0.0f;
            if (t < n_tok && k < S_L) {
                long row = (long)table[t / S_ps] * S_ps + t % S_ps;
                v = KV_F(pool[row * W + k]) * ks;
            }
            sC[e] = v;
        }
        for (int e = tid; e < EN * EK; e += NT) {
            int j = e / EK, k = k0 + e - j * EK, r = r0 + j;
            sW[e] = (r < S_H * HR && k < S_L) ? mt_bf16_to_f32(wkv[(long)r * S_L + k]) : 0.0f;
        }
        __syncthreads();
        for (int i = 0; i < EACC; i++) {
            int e = tid + i * NT;
            if (e < ET * EN) {
                int j = e / EN, r = e - j * EN;
                const float *c = sC + j * EK, *w = sW + r * EK;
                float a = acc[i];
                for (int k = 0; k < EK; k++)
                    a += c[k] * w[k];
                acc[i] = a;
            }
        }
        __syncthreads();
    }
    for (int i = 0; i < EACC; i++) {
        int e = tid + i * NT;
        if (e < ET * EN) {
            int j = e / EN, t = t0 + j, r = r0 + e - j * EN;
            if (t < n_tok && r < S_H * HR) {
                int h = r / HR, rr = r - h * HR;
                if (rr < S_D)
                    kn[((long)t * S_H + h) * S_D + rr] = mt_f32_to_bf16(acc[i]);
                else
                    vv[((long)t * S_H + h) * S_V + rr - S_D] = mt_f32_to_bf16(acc[i]);
            }
        }
    }
}

/* Copies key tile kt (keys kt*BN .. +BN-1 below kend) into ring slot b. */
MT_DEVICE void load_tile(int kt, int b, int kend, int h, const mt_bf16 *kn,
                         const mt_bf16 *vv, const kv_t *pool, const int *table, float ks,
                         mt_bf16 *sK, mt_bf16 *sV, float *sKr)
{
    const int tid = threadIdx.x;
    mt_bf16 *k = sK + b * BN * S_D, *v = sV + b * BN * S_V;
    float *kr = sKr + b * BN * S_R;
    for (int e = tid; e < BN * S_D; e += NT) {
        int j = e / S_D, t = kt * BN + j;
        k[e] = t < kend ? kn[((long)t * S_H + h) * S_D + e - j * S_D] : (mt_bf16)0;
    }
    for (int e = tid; e < BN * S_V; e += NT) {
        int j = e / S_V, t = kt * BN + j;
        v[e] = t < kend ? vv[((long)t * S_H + h) * S_V + e - j * S_V] : (mt_bf16)0;
    }
    for (int e = tid; e < BN * S_R; e += NT) {
        int j = e / S_R, t = kt * BN + j;
        float x = 0.0f;
        if (t < kend) {
            long row = (long)table[t / S_ps] * S_ps + t % S_ps;
            x = KV_F(pool[row * W + S_L + e - j * S_R]) * ks;
        }
        kr[e] = x;
    }
}

MT_KERNEL __launch_bounds__(NT) void mla_prefill_attn(
    const mt_bf16 *__restrict__ q, const mt_bf16 *__restrict__ kn,
    const mt_bf16 *__restrict__ vv, const kv_t *__restrict__ pool, const float *kscale,
    const int *table, mt_bf16 *out, int p, int m, float scale)
{
    MT_DYN_SHARED(float, smem);
    float *sS = smem;                          /* [BM][BN] */
    float *sAlpha = sS + BM * BN;              /* [BM] */
    float *sMax = sAlpha + BM;                 /* [BM] */
    float *sSum = sMax + BM;                   /* [BM] */
    float *sKr = sSum + BM;                    /* [STAGES][BN][R] */
    mt_bf16 *sQ = (mt_bf16 *)(sKr + STAGES * BN * S_R); /* [BM][DQ] */
    mt_bf16 *sK = sQ + BM * DQ;                /* [STAGES][BN][D] */
    mt_bf16 *sV = sK + STAGES * BN * S_D;      /* [STAGES][BN][V] */

    const int tid = threadIdx.x;
    const int i0 = blockIdx.x * BM, h = blockIdx.y;
    const float ks = kscale[0];
    const int last = i0 + BM < m ? i0 + BM : m;     /* queries i0 .. last-1 */
    const int kend = p + last;                      /* keys 0 .. kend-1 */
    const int ntiles = (kend + BN - 1) / BN;

    for (int e = tid; e < BM * DQ; e += NT) {
        int i = e / DQ;
        sQ[e] = i0 + i < m ? q[((long)(i0 + i) * S_H + h) * DQ + e - i * DQ] : (mt_bf16)0;
    }
    if (tid < BM) {
        sMax[tid] = NEG_BIG;
        sSum[tid] = 0.0f;
    }
    float acc[NACC];
    for (int i = 0; i < NACC; i++)
        acc[i] = 0.0f;

    for (int kt = 0; kt < STAGES - 1 && kt < ntiles; kt++)
        load_tile(kt, kt, kend, h, kn, vv, pool, table, ks, sK, sV, sKr);
    __syncthreads();

    for (int kt = 0; kt < ntiles; kt++) {
        const int b = kt % STAGES;
        if (STAGES == 1) {
            load_tile(kt, 0, kend, h, kn, vv, pool, table, ks, sK, sV, sKr);
            __syncthreads();
        } else if (kt + STAGES - 1 < ntiles) {
            load_tile(kt + STAGES - 1, (kt + STAGES - 1) % STAGES, kend, h, kn, vv, pool,
                      table, ks, sK, sV, sKr);
        }
        const mt_bf16 *k = sK + b * BN * S_D, *v = sV + b * BN * S_V;
        const float *kr = sKr + b * BN * S_R;
        for (int e = tid; e < BM * BN; e += NT) {
            int i = e / BN, j = e - i * BN;
            const mt_bf16 *qr = sQ + i * DQ, *kj = k + j * S_D;
            const float *krj = kr + j * S_R;
            float s = 0.0f;
            for (int d = 0; d < S_D; d++)
                s += mt_bf16_to_f32(qr[d]) * mt_bf16_to_f32(kj[d]);
            for (int d = 0; d < S_R; d++)
                s += mt_bf16_to_f32(qr[S_D + d]) * krj[d];
            sS[e] = s * scale;
        }
        __syncthreads();
        if (tid < BM) {
            float *row = sS + tid * BN;
            int qi = i0 + tid, t0 = kt * BN;
            /* Key t is visible to query qi when t <= p + qi. */
            int nvis = qi < m ? p + qi + 1 - t0 : 0;
            if (nvis > BN)
                nvis = BN;
            float mx = sMax[tid];
            for (int j = 0; j < nvis; j++)
                mx = mt_fmaxf(mx, row[j]);
            float alpha = mt_expf(sMax[tid] - mx);
            float sum = sSum[tid] * alpha;
            for (int j = 0; j < BN; j++) {
                float pj = j < nvis ? mt_expf(row[j] - mx) : 0.0f;
                row[j] = pj;
                sum += pj;
            }
            sMax[tid] = mx;
            sSum[tid] = sum;
            sAlpha[tid] = alpha;
        }
        __syncthreads();
        for (int a = 0; a < NACC; a++) {
            int e = tid + a * NT;
            if (e < BM * S_V) {
                int i = e / S_V, c = e - i * S_V;
                const float *pr = sS + i * BN;
                float x = acc[a] * sAlpha[i];
                for (int j = 0; j < BN; j++)
                    x += pr[j] * mt_bf16_to_f32(v[j * S_V + c]);
                acc[a] = x;
            }
        }
        __syncthreads();
    }

    for (int a = 0; a < NACC; a++) {
        int e = tid + a * NT;
        if (e < BM * S_V) {
            int i = e / S_V, c = e - i * S_V;
            if (i0 + i < m)
                out[((long)(i0 + i) * S_H + h) * S_V + c] = mt_f32_to_bf16(acc[a] / sSum[i]);
        }
    }
}
#endif /* !MMA */

#if MMA
/* ---- MMA path ------------------------------------------------------------
 * Block (query tile of BM, head), one key tile of BN at a time (STAGES is
 * 1 here):
 *  1. q rows (bf16, rows past the chunk zero) once into sQ; per tile the
 *     keys into sK [BN][DQ + pad]: k_nope from the expansion, then the
 *     rope key as stored (fp8 e4m3 decodes to bf16 exactly; the cache
 *     scale stays a scalar), and v into sV [BN][V + pad]; pitches padded
 *     so that no row stride is a power of two;
 *  2. S = Q K^T on fragments: the rope dims first, that partial sum times
 *     the cache scale, then the nope dims on top; f32 to sS;
 *  3. online softmax with the causal mask, P_G lanes of one wave per row
 *     (max and sum by shuffles); P as bf16 to sP, and the row sum adds the
 *     rounded weights, so o / sum normalizes exactly what P V summed;
 *  4. O = O * alpha + P V: the waves own fixed fragments of the BM x V
 *     output in registers (V split across waves first, then rows), A from
 *     sP, B from sV rows (load_b).
 * The output row i is o / sum in bf16. */
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

#define P_PAD (MT_MMA_WAVE == 64 ? 4 : 8)
#define P_LDQ (DQ + P_PAD)          /* sQ, sK row pitch (bf16) */
#define P_LDV (S_V + P_PAD)         /* sV row pitch (bf16) */
#define P_LDP (BN + P_PAD)          /* sP row pitch (bf16) */
#define P_LDS (BN + 1)              /* sS row pitch (f32) */
/* S = Q K^T: QI x QJ fragments; QSJ waves share a fragment row (splitting
 * its columns), QWR waves walk the rows. */
#define P_QI (BM / MT_MMA_M)
#define P_QJ (BN / MT_MMA_N)
#define P_QSJ0 (WAVES / P_QI < 1 ? 1 : WAVES / P_QI)
#define P_QSJ (P_QSJ0 < P_QJ ? P_QSJ0 : P_QJ)
#define P_QNJ (P_QJ / P_QSJ)
#define P_QWR (WAVES / P_QSJ)
/* O: waves across V first (P_WN), then rows (P_WM); each owns P_TM x P_TN
 * fragments. */
#define P_WN (WAVES < S_V / MT_MMA_N ? WAVES : S_V / MT_MMA_N)
#define P_WM (WAVES / P_WN)
#define P_TM (BM / (P_WM * MT_MMA_M))
#define P_TN (S_V / (P_WN * MT_MMA_N))
/* Softmax: P_G lanes per row (a power of two within one wave). */
#define P_G0 (NT / BM < 1 ? 1 : NT / BM)
#define P_G1 (P_G0 < BN ? P_G0 : BN)
#define P_G (P_G1 < MT_MMA_WAVE ? P_G1 : MT_MMA_WAVE)

/* A cache value as bf16 bits (fp8 e4m3 is exact in bf16), unscaled. */
MT_DEVICE mt_bf16 p_kv_bf16(kv_t x)
{
#if KV_FP8
    return (mt_bf16)(mt_float_as_uint(mt_fp8e4m3_to_f32(x)) >> 16);
#else
    return x;
#endif
}

/* ---- the expansion on fragments --------------------------------------------
 * Block (ET tokens, EN kv_b rows): A = the tokens' latent rows as stored
 * (bf16; fp8 decodes to bf16 exactly), B^T = kv_b's rows, both through
 * padded bf16 tiles EK deep. The waves split the ET x EN output as the
 * attention's O: across the rows of kv_b first (X_WN waves), then the
 * tokens (X_WM); each owns X_TM x X_TN fragments and, per K step, loads
 * X_TM A and X_TN B fragments for X_TM * X_TN products. The cache scale
 * multiplies the f32 sums, which go out as bf16. */
#define X_LD (EK + P_PAD)
#define X_FI (ET / MT_MMA_M)
#define X_FJ (EN / MT_MMA_N)
#define X_WN (WAVES < X_FJ ? WAVES : X_FJ)
#define X_WM (WAVES / X_WN)
#define X_TM (X_FI / X_WM)
#define X_TN (X_FJ / X_WN)
#if ET % MT_MMA_M || EN % MT_MMA_N || EK % MT_MMA_K || EK % 4 || X_FJ % X_WN || X_FI % X_WM || \
    X_TM < 1
#error "MMA expansion: the ET x EN x EK tile must split into whole fragments per wave"
#endif
/* 4 bf16 of a row from k (all four inside the row), 8 bytes at once where
 * rows are a multiple of 4 long (their starts then stay aligned). */
#if S_L % 4 == 0 && W % 4 == 0 && !KV_FP8
#define X_LAT4(src) (*(const unsigned long long *)(src))
#else
#define X_LAT4(src)                                                                        \
    ((unsigned long long)p_kv_bf16((src)[0]) | (unsigned long long)p_kv_bf16((src)[1]) << 16 | \
     (unsigned long long)p_kv_bf16((src)[2]) << 32 |                                       \
     (unsigned long long)p_kv_bf16((src)[3]) << 48)
#endif
#if S_L % 4 == 0
#define X_W4(src) (*(const unsigned long long *)(src))
#else
#define X_W4(src)                                                                          \
    ((unsigned long long)(src)[0] | (unsigned long long)(src)[1] << 16 |                    \
     (unsigned long long)(src)[2] << 32 | (unsigned long long)(src)[3] << 48)
#endif

MT_KERNEL __launch_bounds__(NT) void mla_prefill_expand(
    const kv_t *__restrict__ pool, const float *kscale, const int *table,
    const mt_bf16 *__restrict__ wkv, mt_bf16 *kn, mt_bf16 *vv, int n_tok)
{
    MT_DYN_SHARED(float, smem);
    mt_bf16 *sA = (mt_bf16 *)smem;  /* [ET][X_LD] latent rows */
    mt_bf16 *sB = sA + ET * X_LD;   /* [EN][X_LD] kv_b rows */
    const int tid = threadIdx.x, wave = tid / MT_MMA_WAVE;
    const int wm = wave / X_WN, wn = wave % X_WN;
    const int t0 = blockIdx.x * ET, r0 = blockIdx.y * EN;
    const float ks = kscale[0];
    mt_mma_acc acc[X_TM][X_TN];
    MT_UNROLL
    for (int i = 0; i < X_TM; i++)
        MT_UNROLL
        for (int j = 0; j < X_TN; j++)
            acc[i][j] = mt_mma_acc_zero();
    for (int k0 = 0; k0 < S_L; k0 += EK) {
        for (int e = tid; e < ET * (EK / 4); e += NT) {
            int j = e / (EK / 4), k = k0 + 4 * (e - j * (EK / 4)), t = t0 + j;
            unsigned long long v = 0ull;
            if (t < n_tok && k < S_L) {
                const kv_t *src = pool + ((long)table[t / S_ps] * S_ps + t % S_ps) * W + k;
                if (k + 3 < S_L)
                    v = X_LAT4(src);
                else /* the last, partial four of a row */
                    for (int i = 0; k + i < S_L; i++)
                        v |= (unsigned long long)p_kv_bf16(src[i]) << (16 * i);
            }
            *(unsigned long long *)(sA + j * X_LD + (k - k0)) = v;
        }
        for (int e = tid; e < EN * (EK / 4); e += NT) {
            int j = e / (EK / 4), k = k0 + 4 * (e - j * (EK / 4)), r = r0 + j;
            unsigned long long v = 0ull;
            if (r < S_H * HR && k < S_L) {
                const mt_bf16 *src = wkv + (long)r * S_L + k;
                if (k + 3 < S_L)
                    v = X_W4(src);
                else
                    for (int i = 0; k + i < S_L; i++)
                        v |= (unsigned long long)src[i] << (16 * i);
            }
            *(unsigned long long *)(sB + j * X_LD + (k - k0)) = v;
        }
        __syncthreads();
        MT_UNROLL
        for (int kk = 0; kk < EK; kk += MT_MMA_K) {
            mt_mma_a fa[X_TM];
            MT_UNROLL
            for (int i = 0; i < X_TM; i++)
                fa[i] = mt_mma_load_a(sA + ((wm * X_TM + i) * MT_MMA_M) * X_LD + kk, X_LD);
            MT_UNROLL
            for (int j = 0; j < X_TN; j++) {
                mt_mma_b fb = mt_mma_load_bt(sB + ((wn * X_TN + j) * MT_MMA_N) * X_LD + kk, X_LD);
                MT_UNROLL
                for (int i = 0; i < X_TM; i++)
                    acc[i][j] = mt_mma_bf16(fa[i], fb, acc[i][j]);
            }
        }
        __syncthreads();
    }
    MT_UNROLL
    for (int i = 0; i < X_TM; i++)
        MT_UNROLL
        for (int j = 0; j < X_TN; j++)
            for (int rg = 0; rg < MT_MMA_ACC_REGS; rg++) {
                int t = t0 + (wm * X_TM + i) * MT_MMA_M + mt_mma_acc_row(rg);
                int r = r0 + (wn * X_TN + j) * MT_MMA_N + mt_mma_acc_col(rg);
                if (t < n_tok && r < S_H * HR) {
                    int h = r / HR, rr = r - h * HR;
                    mt_bf16 o = mt_f32_to_bf16(acc[i][j].x[rg] * ks);
                    if (rr < S_D)
                        kn[((long)t * S_H + h) * S_D + rr] = o;
                    else
                        vv[((long)t * S_H + h) * S_V + rr - S_D] = o;
                }
            }
}

/* p[row * ld + col] = bf16(a) for the fragment's rows below `rows`. */
MT_DEVICE void p_store_bf16(mt_bf16 *p, long ld, int rows, mt_mma_acc a)
{
    for (int rg = 0; rg < MT_MMA_ACC_REGS; rg++)
        if (mt_mma_acc_row(rg) < rows)
            p[mt_mma_acc_row(rg) * ld + mt_mma_acc_col(rg)] = mt_f32_to_bf16(a.x[rg]);
}

MT_KERNEL __launch_bounds__(NT) void mla_prefill_attn(
    const mt_bf16 *__restrict__ q, const mt_bf16 *__restrict__ kn,
    const mt_bf16 *__restrict__ vv, const kv_t *__restrict__ pool, const float *kscale,
    const int *table, mt_bf16 *out, int p, int m, float scale)
{
    /* Dynamic, not static: the module's expansion kernel takes its own
     * dynamic tiles, and static arrays would count against its block too
     * (emu). Every piece is a multiple of 8 bytes (BM is even, the
     * pitches multiples of 4): fragment loads stay 8-byte aligned. */
    MT_DYN_SHARED(float, smem);
    float *sS = smem;                         /* [BM][P_LDS] */
    float *sAlpha = sS + BM * P_LDS;          /* [BM] this tile's rescale */
    float *sMax = sAlpha + BM, *sSum = sMax + BM;
    mt_bf16 *sQ = (mt_bf16 *)(sSum + BM);     /* [BM][P_LDQ] */
    mt_bf16 *sK = sQ + BM * P_LDQ;            /* [BN][P_LDQ] */
    mt_bf16 *sV = sK + BN * P_LDQ;            /* [BN][P_LDV] */
    mt_bf16 *sP = sV + BN * P_LDV;            /* [BM][P_LDP] */

    const int tid = threadIdx.x, wave = tid / MT_MMA_WAVE;
    const int i0 = blockIdx.x * BM, h = blockIdx.y;
    const float ks = kscale[0];
    const int last = i0 + BM < m ? i0 + BM : m;     /* queries i0 .. last-1 */
    const int kend = p + last;                      /* keys 0 .. kend-1 */

    /* 1: q, 4 values per item (DQ % 4 == 0: aligned loads) */
    for (int e = tid; e < BM * (DQ / 4); e += NT) {
        int i = e / (DQ / 4), c = e - i * (DQ / 4);
        *(unsigned long long *)(sQ + i * P_LDQ + 4 * c) =
            i0 + i < m ? *(const unsigned long long *)(q + ((long)(i0 + i) * S_H + h) * DQ + 4 * c)
                       : 0ull;
    }
    if (tid < BM) {
        sMax[tid] = NEG_BIG;
        sSum[tid] = 0.0f;
    }
    const int wm = wave / P_WN, wn = wave % P_WN;
    mt_mma_acc acc[P_TM][P_TN];
    MT_UNROLL
    for (int i = 0; i < P_TM; i++)
        MT_UNROLL
        for (int j = 0; j < P_TN; j++)
            acc[i][j] = mt_mma_acc_zero();

    for (int t0 = 0; t0 < kend; t0 += BN) {
        /* 1: the key and value tile; keys past kend zero */
        for (int e = tid; e < BN * (S_D / 4); e += NT) {
            int j = e / (S_D / 4), c = e - j * (S_D / 4), t = t0 + j;
            *(unsigned long long *)(sK + j * P_LDQ + 4 * c) =
                t < kend ? *(const unsigned long long *)(kn + ((long)t * S_H + h) * S_D + 4 * c)
                         : 0ull;
        }
        for (int e = tid; e < BN * S_R; e += NT) {
            int j = e / S_R, d = e - j * S_R, t = t0 + j;
            mt_bf16 x = 0;
            if (t < kend) {
                long row = (long)table[t / S_ps] * S_ps + t % S_ps;
                x = p_kv_bf16(pool[row * W + S_L + d]);
            }
            sK[j * P_LDQ + S_D + d] = x;
        }
        for (int e = tid; e < BN * (S_V / 4); e += NT) {
            int j = e / (S_V / 4), c = e - j * (S_V / 4), t = t0 + j;
            *(unsigned long long *)(sV + j * P_LDV + 4 * c) =
                t < kend ? *(const unsigned long long *)(vv + ((long)t * S_H + h) * S_V + 4 * c)
                         : 0ull;
        }
        __syncthreads();
        /* 2: S = Q K^T, rope dims (times the cache scale) then nope dims */
        for (int i = wave / P_QSJ; i < P_QI; i += P_QWR) {
            const int j0 = (wave % P_QSJ) * P_QNJ;
            const mt_bf16 *qa = sQ + i * MT_MMA_M * P_LDQ;
            mt_mma_acc s[P_QNJ];
            for (int j = 0; j < P_QNJ; j++)
                s[j] = mt_mma_acc_zero();
            for (int kk = S_D; kk < DQ; kk += MT_MMA_K) {
                mt_mma_a fa = mt_mma_load_a(qa + kk, P_LDQ);
                for (int j = 0; j < P_QNJ; j++) {
                    mt_mma_b fb = mt_mma_load_bt(sK + (j0 + j) * MT_MMA_N * P_LDQ + kk, P_LDQ);
                    s[j] = mt_mma_bf16(fa, fb, s[j]);
                }
            }
            for (int j = 0; j < P_QNJ; j++)
                for (int rg = 0; rg < MT_MMA_ACC_REGS; rg++)
                    s[j].x[rg] *= ks;
            for (int kk = 0; kk < S_D; kk += MT_MMA_K) {
                mt_mma_a fa = mt_mma_load_a(qa + kk, P_LDQ);
                for (int j = 0; j < P_QNJ; j++) {
                    mt_mma_b fb = mt_mma_load_bt(sK + (j0 + j) * MT_MMA_N * P_LDQ + kk, P_LDQ);
                    s[j] = mt_mma_bf16(fa, fb, s[j]);
                }
            }
            for (int j = 0; j < P_QNJ; j++)
                mt_mma_store_acc(sS + i * MT_MMA_M * P_LDS + (j0 + j) * MT_MMA_N, P_LDS, s[j]);
        }
        __syncthreads();
        /* 3: online softmax, P_G lanes per row; key t0 + j is visible to
         * query i0 + r when t0 + j <= p + i0 + r (every lane takes part in
         * the shuffles) */
        for (int r0 = 0; r0 < BM; r0 += NT / P_G) {
            const int r = r0 + tid / P_G, g = tid % P_G;
            const int live = r < BM;
            int nvis = live && i0 + r < m ? p + i0 + r + 1 - t0 : 0;
            if (nvis > BN)
                nvis = BN;
            float mx = NEG_BIG;
            for (int j = g; j < nvis; j += P_G)
                mx = mt_fmaxf(mx, sS[r * P_LDS + j] * scale);
            for (int o = P_G / 2; o > 0; o /= 2)
                mx = mt_fmaxf(mx, mt_shfl_xor_f32(mx, o));
            const float old = live ? sMax[r] : NEG_BIG;
            const float mnew = mt_fmaxf(old, mx);
            float sum = 0.0f;
            for (int j = g; j < BN; j += P_G) {
                mt_bf16 pb = 0;
                if (j < nvis)
                    pb = mt_f32_to_bf16(mt_expf(sS[r * P_LDS + j] * scale - mnew));
                sum += mt_bf16_to_f32(pb);
                if (live)
                    sP[r * P_LDP + j] = pb;
            }
            for (int o = P_G / 2; o > 0; o /= 2)
                sum += mt_shfl_xor_f32(sum, o);
            if (live && g == 0) {
                float alpha = mt_expf(old - mnew);
                sAlpha[r] = alpha;
                sSum[r] = sSum[r] * alpha + sum;
                sMax[r] = mnew;
            }
        }
        __syncthreads();
        /* 4: O = O * alpha + P V */
        MT_UNROLL
        for (int i = 0; i < P_TM; i++) {
            float al[MT_MMA_ACC_REGS];
            MT_UNROLL
            for (int rg = 0; rg < MT_MMA_ACC_REGS; rg++)
                al[rg] = sAlpha[(wm * P_TM + i) * MT_MMA_M + mt_mma_acc_row(rg)];
            MT_UNROLL
            for (int j = 0; j < P_TN; j++)
                MT_UNROLL
                for (int rg = 0; rg < MT_MMA_ACC_REGS; rg++)
                    acc[i][j].x[rg] *= al[rg];
        }
        for (int kk = 0; kk < BN; kk += MT_MMA_K) {
            mt_mma_a fa[P_TM];
            MT_UNROLL
            for (int i = 0; i < P_TM; i++)
                fa[i] = mt_mma_load_a(sP + (wm * P_TM + i) * MT_MMA_M * P_LDP + kk, P_LDP);
            MT_UNROLL
            for (int j = 0; j < P_TN; j++) {
                mt_mma_b fb = mt_mma_load_b(sV + kk * P_LDV + (wn * P_TN + j) * MT_MMA_N, P_LDV);
                MT_UNROLL
                for (int i = 0; i < P_TM; i++)
                    acc[i][j] = mt_mma_bf16(fa[i], fb, acc[i][j]);
            }
        }
        __syncthreads();
    }

    /* o / sum as bf16: the rows scaled in place (as by alpha), then one
     * fragment at a time (the loops stay short enough to unroll: a loop
     * the compiler keeps indexes acc, which then lives in scratch) */
    MT_UNROLL
    for (int i = 0; i < P_TM; i++) {
        float inv[MT_MMA_ACC_REGS];
        MT_UNROLL
        for (int rg = 0; rg < MT_MMA_ACC_REGS; rg++)
            inv[rg] = 1.0f / sSum[(wm * P_TM + i) * MT_MMA_M + mt_mma_acc_row(rg)];
        MT_UNROLL
        for (int j = 0; j < P_TN; j++)
            MT_UNROLL
            for (int rg = 0; rg < MT_MMA_ACC_REGS; rg++)
                acc[i][j].x[rg] *= inv[rg];
    }
    MT_UNROLL
    for (int i = 0; i < P_TM; i++)
        MT_UNROLL
        for (int j = 0; j < P_TN; j++)
            p_store_bf16(out + ((long)(i0 + (wm * P_TM + i) * MT_MMA_M) * S_H + h) * S_V +
                             (wn * P_TN + j) * MT_MMA_N,
                         S_H * S_V, m - i0 - (wm * P_TM + i) * MT_MMA_M, acc[i][j]);
}
#endif /* MMA */
