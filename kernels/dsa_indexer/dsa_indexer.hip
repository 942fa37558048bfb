/* dsa_indexer.hip: DSA lightning-indexer scores and per-query top-k
 * (family dsa_indexer, see kernels/fam_dsa_indexer.c for the rule).
 *
 * dsa_scores: block (token tile of BT, query tile of QB). The tile's keys
 * are decoded once into shared memory and reused by consecutive queries of
 * the tile that share a page-table row; one thread per token sums
 * w_h * relu(q_h . k) over the heads. Scores go to scratch [M][cstride].
 * dsa_topk: block per query. Radix select, 8 bits per pass from the top,
 * on keys that order like the floats (histograms with shared atomics, a
 * run of equal digits counted in a register first), finds the threshold
 * key and how many of its ties to keep; an index-ordered compaction over
 * each thread's contiguous chunk (one block prefix sum for the offsets)
 * then writes the kept indices ascending, ties lowest index first.
 *
 * MMA=1 or 2 computes dsa_scores on the prelude's matrix fragments
 * (MT_MMA_SHAPE 16 or 32), see "MMA path" below; MMA=3, with an fp8 key
 * cache, on fp8 ones ("fp8 path"); MMA=0 is the scalar path. dsa_topk is
 * the same for all.
 *
 * Params: BT, QB, WAVES, TK_WAVES, MMA; NT, TK_NT, KV_FP8 from the family.
 * Shape: S_IH, S_ID, S_topk, S_ps. */

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

#if !MMA
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

#endif /* !MMA */

#if MMA == 1 || MMA == 2
/* ---- MMA path ------------------------------------------------------------
 * Per key tile of BT tokens:
 *  1. the tile's keys are decoded to bf16 (fp8 e4m3 is exact in bf16; the
 *     cache scale multiplies the dot products instead, as a scalar) into
 *     sK [BT][X_LD], rows padded by X_PAD (no power-of-two pitch), dims
 *     past ID zero; the query's heads go to sQ [X_IHP][X_LD] the same way
 *     (heads past IH zero), and from there into registers once per query;
 *  2. S = Q K^T, X_IHP x BT over K = ID: each wave takes whole fragment
 *     columns of the tile (every head of a key in one wave);
 *  3. on the accumulator: v = kscale * s, relu, times the head's weight
 *     (kept in registers per query), summed over the lane's rows, then
 *     across the lanes that hold the same column (xor shuffles);
 *  4. one lane per key writes IH^-0.5 ID^-0.5 * sum to scores.
 * The key tile, the page-table reuse across the block's queries, the
 * masking (keys past the query's ctx_len are not written) and the scores
 * layout are the scalar path's. */
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
#if BT % MT_MMA_N
#error "MMA: BT must be whole fragment columns"
#endif

#define X_PAD (MT_MMA_WAVE == 64 ? 4 : 8)
#define X_IHP ((S_IH + MT_MMA_M - 1) / MT_MMA_M * MT_MMA_M) /* heads, padded */
#define X_IDP ((S_ID + MT_MMA_K - 1) / MT_MMA_K * MT_MMA_K) /* dims, padded */
#define X_LD (X_IDP + X_PAD)                                 /* sK, sQ row pitch */
#define X_FI (X_IHP / MT_MMA_M)                              /* fragment rows */
#define X_FK (X_IDP / MT_MMA_K)                              /* k steps */
#define X_FJ (BT / MT_MMA_N)                                 /* fragment columns */
/* The accumulator layouts (prelude): AMD keeps one column per lane (lane %
 * N) and spreads the rows over lane / N; NVIDIA's 16x8 keeps two columns
 * per lane (register i & 1) and spreads the rows over lane / 4. X_CPL
 * columns per lane; lanes X_LSTEP apart hold the same columns. */
#if MT_MMA_WAVE == 64
#define X_CPL 1
#define X_LSTEP MT_MMA_N
#else
#define X_CPL 2
#define X_LSTEP 4
#endif

/* Four values of a row of n (< 4 at the end of an odd-width row) as four
 * bf16 in one 64-bit word; zero past n. */
MT_DEVICE unsigned long long x_key4(const kv_t *src, int n)
{
    unsigned long long r = 0;
#if S_ID % 4 == 0 && KV_FP8
    (void)n;
    unsigned v = *(const unsigned *)src;
    for (int e = 0; e < 4; e++) {
        unsigned b = mt_float_as_uint(mt_fp8e4m3_to_f32((unsigned char)(v >> (8 * e)))) >> 16;
        r |= (unsigned long long)b << (16 * e);
    }
#elif S_ID % 4 == 0
    (void)n;
    r = *(const unsigned long long *)src;
#else
    for (int e = 0; e < 4 && e < n; e++) {
#if KV_FP8
        unsigned b = mt_float_as_uint(mt_fp8e4m3_to_f32(src[e])) >> 16;
#else
        unsigned b = src[e];
#endif
        r |= (unsigned long long)b << (16 * e);
    }
#endif
    return r;
}

MT_DEVICE unsigned long long x_q4(const mt_bf16 *src, int n)
{
#if S_ID % 4 == 0
    (void)n;
    return *(const unsigned long long *)src;
#else
    unsigned long long r = 0;
    for (int e = 0; e < 4 && e < n; e++)
        r |= (unsigned long long)src[e] << (16 * e);
    return r;
#endif
}

MT_KERNEL __launch_bounds__(NT) void dsa_scores(
    const mt_bf16 *__restrict__ q, const float *__restrict__ w, const kv_t *__restrict__ pool,
    const float *kscale, const int *table, int max_pages, const int *qseq, const int *ctx_len,
    float *scores, int cstride, int m, float wscale)
{
    __shared__ __attribute__((aligned(16))) mt_bf16 sK[BT * X_LD];
    __shared__ __attribute__((aligned(16))) mt_bf16 sQ[X_IHP * X_LD];
    const int tid = threadIdx.x, wave = tid / MT_MMA_WAVE, lane = mt_lane_id();
    const int t0 = blockIdx.x * BT, q0 = blockIdx.y * QB;
    const float ks = kscale[0];
    int loaded = -1;

    for (int qq = 0; qq < QB && q0 + qq < m; qq++) {
        const int mi = q0 + qq, len = ctx_len[mi], sq = qseq[mi];
        if (t0 >= len)
            continue;
        __syncthreads(); /* the previous query is done with sK, sQ */
        if (sq != loaded) {
            /* Load as far as the longest following query of this row needs. */
            int limit = len;
            for (int k = qq + 1; k < QB && q0 + k < m && qseq[q0 + k] == sq; k++)
                limit = ctx_len[q0 + k] > limit ? ctx_len[q0 + k] : limit;
            const int *tbl = table + (long)sq * max_pages;
            for (int e = tid; e < BT * (X_IDP / 4); e += NT) {
                int j = e / (X_IDP / 4), d = 4 * (e - j * (X_IDP / 4)), t = t0 + j;
                unsigned long long v = 0ull;
                if (t < limit && d < S_ID)
                    v = x_key4(pool + ((long)tbl[t / S_ps] * S_ps + t % S_ps) * S_ID + d,
                               S_ID - d);
                *(unsigned long long *)(sK + j * X_LD + d) = v;
            }
            loaded = sq;
        }
        for (int e = tid; e < X_IHP * (X_IDP / 4); e += NT) {
            int h = e / (X_IDP / 4), d = 4 * (e - h * (X_IDP / 4));
            unsigned long long v = 0ull;
            if (h < S_IH && d < S_ID)
                v = x_q4(q + ((long)mi * S_IH + h) * S_ID + d, S_ID - d);
            *(unsigned long long *)(sQ + h * X_LD + d) = v;
        }
        __syncthreads();
        /* The query's fragments and the lane's head weights, for all of
         * this wave's key columns. */
        mt_mma_a fa[X_FI][X_FK];
        float wr[X_FI][MT_MMA_ACC_REGS];
        for (int i = 0; i < X_FI; i++) {
            for (int k = 0; k < X_FK; k++)
                fa[i][k] = mt_mma_load_a(sQ + i * MT_MMA_M * X_LD + k * MT_MMA_K, X_LD);
            for (int r = 0; r < MT_MMA_ACC_REGS; r++) {
                int h = i * MT_MMA_M + mt_mma_acc_row(r);
                wr[i][r] = h < S_IH ? w[(long)mi * S_IH + h] : 0.0f;
            }
        }
        for (int jf = wave; jf < X_FJ && t0 + jf * MT_MMA_N < len; jf += WAVES) {
            const mt_bf16 *kb = sK + jf * MT_MMA_N * X_LD;
            mt_mma_acc s[X_FI];
            for (int i = 0; i < X_FI; i++)
                s[i] = mt_mma_acc_zero();
            for (int k = 0; k < X_FK; k++) {
                mt_mma_b fb = mt_mma_load_bt(kb + k * MT_MMA_K, X_LD);
                for (int i = 0; i < X_FI; i++)
                    s[i] = mt_mma_bf16(fa[i][k], fb, s[i]);
            }
            float part[X_CPL];
            for (int c = 0; c < X_CPL; c++)
                part[c] = 0.0f;
            for (int i = 0; i < X_FI; i++)
                for (int r = 0; r < MT_MMA_ACC_REGS; r++) {
                    float v = s[i].x[r] * ks;
                    if (v > 0.0f)
                        part[r % X_CPL] += wr[i][r] * v;
                }
            for (int o = X_LSTEP; o < MT_MMA_WAVE; o *= 2)
                for (int c = 0; c < X_CPL; c++)
                    part[c] += mt_shfl_xor_f32(part[c], o);
            if (lane < X_LSTEP)
                for (int c = 0; c < X_CPL; c++) {
                    int t = t0 + jf * MT_MMA_N + mt_mma_acc_col(c);
                    if (t < len)
                        scores[(long)mi * cstride + t] = part[c] * wscale;
                }
        }
    }
}
#endif /* MMA == 1 || MMA == 2 */

#if MMA == 3
/* ---- fp8 path --------------------------------------------------------------
 * The indexer as an fp8 GEMM: S = Q K^T over the cache's own e4m3 bytes.
 *  0. dsa_q8 (once per launch, before the scores): each head's row of q
 *     (bf16) is scaled by a power of two 2^e_h that puts its largest
 *     element in [128, 256) and split into two e4m3 parts, hi = fp8(q 2^e)
 *     and lo = fp8(q 2^e - hi): a bf16 value is hi + lo exactly (hi keeps 4
 *     significant bits; the rest, a multiple of q's last bit no larger than
 *     hi's half step, has at most 4), down to elements 2^-10 of the row's
 *     largest, below which lo loses bits (less than 2^-17 of the largest
 *     term: far inside the tolerance). The parts go to scratch in the
 *     instructions' fragment order (one 16-byte or 8-byte load a lane),
 *     the exponents after them;
 *  1. the key tile [BT][ID] goes to shared memory as it is in the cache
 *     (mt_async16: cp.async on NVIDIA), rows past the context zeroed;
 *  2. per query its fragments are copied to shared memory (from L2, beside
 *     the key tile's copies), then two fp8 MMAs per K step (hi, lo) into
 *     one f32 accumulator: the products are exact, so S is the bf16
 *     path's up to the order of the sums; the epilogue scales row h by
 *     kscale 2^-e_h, then relu, the head weight, and the sum over heads as
 *     the MMA path does.
 * ID must be whole K steps of 32 and a multiple of 16 bytes (validity). */
#if !MT_MMA8_HAVE
#error "MMA=3 needs fp8 matrix instructions (gfx940+, sm_89+)"
#endif
#if !KV_FP8
#error "MMA=3 multiplies the fp8 cache as it is (kv=fp8)"
#endif
#if NT != WAVES * MT_MMA8_WAVE
#error "MMA=3: the block's waves must be the matrix instruction's"
#endif
#if BT % MT_MMA8_N || S_ID % 32
#error "MMA=3: BT must be whole fragment columns and ID whole K steps"
#endif

#define Y_IHP ((S_IH + 15) / 16 * 16) /* heads, whole fragment rows */
#define Y_LD (S_ID + 16)              /* row pitch (bytes) of the key tile */
#define Y_FI (Y_IHP / 16)
#define Y_FK (S_ID / 32)
#define Y_FJ (BT / MT_MMA8_N)
#define Y_CH (S_ID / 16)              /* 16-byte copies per key row */
#define Y_QTILE 512                   /* bytes of a 16 x 32 fragment tile */
#define Y_QB (Y_FI * Y_FK * 2 * Y_QTILE) /* a query's two parts */
#define Y_QCP ((Y_QB / 16 + NT - 1) / NT)
#define Y_KCP ((BT * Y_CH + NT - 1) / NT)
/* columns per lane and the lane stride between holders of the same ones, as
 * the MMA path (the 8-bit accumulator has the 16-row shape's layout) */
#if MT_MMA8_N == 16
#define Y_CPL 1
#define Y_LSTEP 16
#else
#define Y_CPL 2
#define Y_LSTEP 4
#endif

/* The exponent e that puts a row's largest magnitude a (> 0) in [128, 256). */
MT_DEVICE int y_exp(float a)
{
    return a > 0.0f ? 7 - ((int)((mt_float_as_uint(a) >> 23) & 0xffu) - 127) : 0;
}

/* Grid (IHP / 16, M), NT threads: the query of 16 heads of one token as
 * [Y_FK][hi, lo][512] fragment-order bytes at q8 + ((m FI + hg) FK) 1024,
 * then the exponents, int32 [M][IHP], after all M tokens' parts. Heads past
 * IH are zeros. */
MT_KERNEL __launch_bounds__(NT) void dsa_q8(const mt_bf16 *__restrict__ q,
                                            unsigned char *__restrict__ q8)
{
    __shared__ int sE[16];
    const int hg = blockIdx.x, m = blockIdx.y, tid = threadIdx.x;
    const mt_bf16 *qm = q + ((long)m * S_IH + hg * 16) * S_ID;
    for (int r = tid / MT_MMA8_WAVE; r < 16; r += WAVES) {
        float a = 0.0f;
        if (hg * 16 + r < S_IH)
            for (int d = mt_lane_id(); d < S_ID; d += MT_MMA8_WAVE) {
                const float v = mt_bf16_to_f32(qm[(long)r * S_ID + d]);
                a = mt_fmaxf(a, v < 0.0f ? -v : v);
            }
        for (int o = MT_MMA8_WAVE / 2; o > 0; o /= 2)
            a = mt_fmaxf(a, mt_shfl_xor_f32(a, o));
        if (mt_lane_id() == 0)
            sE[r] = y_exp(a);
    }
    __syncthreads();
    unsigned char *dst = q8 + ((long)m * Y_FI + hg) * Y_FK * 2 * Y_QTILE;
    for (int i = tid; i < Y_FK * Y_QTILE; i += NT) {
        const int kk = i / Y_QTILE, pos = i % Y_QTILE;
        int r, k;
        mt_mma8_a_cell(pos / MT_MMA8_A_BYTES, pos % MT_MMA8_A_BYTES, &r, &k);
        unsigned hi = 0, lo = 0;
        if (hg * 16 + r < S_IH) {
            const float v = mt_ldexpf(mt_bf16_to_f32(qm[(long)r * S_ID + kk * 32 + k]), sE[r]);
            hi = mt_f32_to_fp8e4m3(v);
            lo = mt_f32_to_fp8e4m3(v - mt_fp8e4m3_to_f32(hi));
        }
        dst[(kk * 2) * Y_QTILE + pos] = (unsigned char)hi;
        dst[(kk * 2 + 1) * Y_QTILE + pos] = (unsigned char)lo;
    }
    if (tid < 16) {
        int *ex = (int *)(q8 + (long)gridDim.y * Y_IHP * S_ID * 2);
        ex[(long)m * Y_IHP + hg * 16 + tid] = sE[tid];
    }
}

/* q is dsa_q8's output here. */
MT_KERNEL __launch_bounds__(NT) void dsa_scores(
    const mt_bf16 *__restrict__ q, const float *__restrict__ w, const kv_t *__restrict__ pool,
    const float *kscale, const int *table, int max_pages, const int *qseq, const int *ctx_len,
    float *scores, int cstride, int m, float wscale)
{
    __shared__ __attribute__((aligned(16))) unsigned char sK[BT * Y_LD];
    __shared__ __attribute__((aligned(16))) unsigned char sQ[Y_QB];
    const unsigned char *q8 = (const unsigned char *)q;
    const int *qexp = (const int *)(q8 + (long)m * Y_IHP * S_ID * 2);
    const int tid = threadIdx.x, wave = tid / MT_MMA8_WAVE, lane = mt_lane_id();
    const int t0 = blockIdx.x * BT, q0 = blockIdx.y * QB;
    const float ks = kscale[0];
    int loaded = -1;

    MT_NOUNROLL /* one query at a time keeps the registers of one */
    for (int qq = 0; qq < QB && q0 + qq < m; qq++) {
        const int mi = q0 + qq, len = ctx_len[mi], sq = qseq[mi];
        if (t0 >= len)
            continue;
        __syncthreads(); /* the previous query is done with sK and sQ */
        /* the query's fragments (from L2: dsa_q8 wrote them) */
        const unsigned char *qa = q8 + (long)mi * Y_QB;
        mt_u32x4 qhold[Y_QCP];
        MT_UNROLL
        for (int c = 0; c < Y_QCP; c++) {
            const int e = tid + c * NT;
            if (e < Y_QB / 16)
                mt_async16_begin(sQ + 16 * e, qa + 16 * e, &qhold[c]);
        }
        const int reload = sq != loaded;
        mt_u32x4 hold[Y_KCP];
        if (reload) {
            /* Load as far as the longest following query of this row needs. */
            int limit = len;
            for (int k = qq + 1; k < QB && q0 + k < m && qseq[q0 + k] == sq; k++)
                limit = ctx_len[q0 + k] > limit ? ctx_len[q0 + k] : limit;
            const int *tbl = table + (long)sq * max_pages;
            MT_UNROLL
            for (int c = 0; c < Y_KCP; c++) {
                const int e = tid + c * NT, j = e / Y_CH, t = t0 + j;
                if (e < BT * Y_CH && t < limit)
                    mt_async16_begin(sK + j * Y_LD + 16 * (e % Y_CH),
                                     pool + ((long)tbl[t / S_ps] * S_ps + t % S_ps) * S_ID +
                                         16 * (e % Y_CH),
                                     &hold[c]);
            }
            mt_async_wait();
            MT_UNROLL
            for (int c = 0; c < Y_KCP; c++) {
                const int e = tid + c * NT, j = e / Y_CH, t = t0 + j;
                if (e >= BT * Y_CH)
                    continue;
                if (t < limit)
                    mt_async16_end(sK + j * Y_LD + 16 * (e % Y_CH), hold[c]);
                else {
                    const mt_u32x4 z = {0u, 0u, 0u, 0u};
                    *(mt_u32x4 *)(sK + j * Y_LD + 16 * (e % Y_CH)) = z;
                }
            }
            loaded = sq;
        } else {
            mt_async_wait();
        }
        MT_UNROLL
        for (int c = 0; c < Y_QCP; c++) {
            const int e = tid + c * NT;
            if (e < Y_QB / 16)
                mt_async16_end(sQ + 16 * e, qhold[c]);
        }
        __syncthreads();
        /* The lane's rows' scales and head weights. */
        float wr[Y_FI][4], sr[Y_FI][4];
        MT_UNROLL
        for (int i = 0; i < Y_FI; i++) {
            MT_UNROLL
            for (int r = 0; r < 4; r++) {
                int h = i * 16 + mt_mma8_acc_row(r);
                wr[i][r] = h < S_IH ? w[(long)mi * S_IH + h] : 0.0f;
                sr[i][r] = mt_ldexpf(ks, -qexp[(long)mi * Y_IHP + h]);
            }
        }
        for (int jf = wave; jf < Y_FJ && t0 + jf * MT_MMA8_N < len; jf += WAVES) {
            const unsigned char *kb = sK + jf * MT_MMA8_N * Y_LD;
            mt_mma8_acc s[Y_FI];
            MT_UNROLL
            for (int i = 0; i < Y_FI; i++)
                s[i] = mt_mma8_acc_zero();
            MT_UNROLL
            for (int k = 0; k < Y_FK; k++) {
                mt_mma8_b fb = mt_mma8_load_bt_tile(kb + 32 * k, Y_LD);
                MT_UNROLL
                for (int i = 0; i < Y_FI; i++) {
                    const unsigned char *qt = sQ + (i * Y_FK + k) * 2 * Y_QTILE;
                    s[i] = mt_mma8_fp8(mt_mma8_load_a_frag(qt), fb, s[i]);
                    s[i] = mt_mma8_fp8(mt_mma8_load_a_frag(qt + Y_QTILE), fb, s[i]);
                }
            }
            float part[Y_CPL];
            MT_UNROLL
            for (int c = 0; c < Y_CPL; c++)
                part[c] = 0.0f;
            MT_UNROLL
            for (int i = 0; i < Y_FI; i++)
                MT_UNROLL
                for (int r = 0; r < 4; r++) {
                    float v = s[i].x[r] * sr[i][r];
                    if (v > 0.0f)
                        part[r % Y_CPL] += wr[i][r] * v;
                }
            for (int o = Y_LSTEP; o < MT_MMA8_WAVE; o *= 2)
                MT_UNROLL
                for (int c = 0; c < Y_CPL; c++)
                    part[c] += mt_shfl_xor_f32(part[c], o);
            if (lane < Y_LSTEP)
                MT_UNROLL
                for (int c = 0; c < Y_CPL; c++) {
                    int t = t0 + jf * MT_MMA8_N + mt_mma8_acc_col(c);
                    if (t < len)
                        scores[(long)mi * cstride + t] = part[c] * wscale;
                }
        }
    }
}
#endif /* MMA == 3 */

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

/* The top S_topk of sc[0:len) into oi/ov (S_topk entries): the kept
 * positions ascending, ties lowest position first, each written as
 * map[i] (or off + i without a map), -1 and -inf past the kept. Every
 * thread of the block calls it.
 * The threshold by 4 radix passes over the scores (each thread counts a
 * run of equal digits in a register and adds it to the shared histogram
 * once the digit changes: scores of one magnitude share their top digits,
 * and one atomic per element would serialize on that bin); the digit by a
 * block scan over the bins from the top; then the kept positions in order
 * from each thread's contiguous chunk: count, one scan for the offsets,
 * write. Three scans in all, whatever the length. */
MT_DEVICE void topk_select(const float *sc, const int *map, int off, int len, int *oi,
                           float *ov, int *hist, int *scan, int *pick)
{
    const int tid = threadIdx.x;
    const float neg_inf = mt_uint_as_float(0xff800000u);

    if (len <= S_topk) {
        for (int i = tid; i < S_topk; i += TK_NT) {
            oi[i] = i < len ? (map ? map[i] : off + i) : -1;
            ov[i] = i < len ? sc[i] : neg_inf;
        }
        return;
    }

    /* the bins a thread sums for the pick, from the top: 255 - (tid BPT + j) */
#define TK_BPT ((256 + TK_NT - 1) / TK_NT)
    unsigned prefix = 0u, mask = 0u;
    int need = S_topk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += TK_NT)
            hist[i] = 0;
        __syncthreads();
        unsigned run_digit = 0u;
        int run = 0;
        for (int i = tid; i < len; i += TK_NT) {
            unsigned u = order_key(sc[i]);
            if ((u & mask) == prefix) {
                unsigned digit = (u >> shift) & 255u;
                if (run && digit != run_digit) {
                    atomicAdd(&hist[run_digit], run);
                    run = 0;
                }
                run_digit = digit;
                run++;
            }
        }
        if (run)
            atomicAdd(&hist[run_digit], run);
        __syncthreads();
        /* The digit d where the count from the top first reaches need. */
        int mine = 0;
        for (int j = 0; j < TK_BPT; j++) {
            int r = tid * TK_BPT + j;
            mine += r < 256 ? hist[255 - r] : 0;
        }
        int total;
        int above = block_scan(mine, scan, &total);
        for (int j = 0; j < TK_BPT; j++) {
            int r = tid * TK_BPT + j;
            if (r >= 256)
                break;
            int h = hist[255 - r];
            if (above < need && above + h >= need) {
                pick[0] = 255 - r;
                pick[1] = need - above;
            }
            above += h;
        }
        __syncthreads();
        prefix |= (unsigned)pick[0] << shift;
        mask |= 255u << shift;
        need = pick[1];
        __syncthreads();
    }
#undef TK_BPT

    /* Everything above the threshold key, and the first `need` equal to it,
     * in position order: thread t takes the chunk [t chunk, (t + 1) chunk). */
    const int chunk = (len + TK_NT - 1) / TK_NT;
    const int c0 = tid * chunk < len ? tid * chunk : len;
    const int c1 = c0 + chunk < len ? c0 + chunk : len;
    int gt = 0, eq = 0;
    for (int i = c0; i < c1; i++) {
        unsigned u = order_key(sc[i]);
        gt += u > prefix;
        eq += u == prefix;
    }
    int eq_total, take_total;
    const int eq_before = block_scan(eq, scan, &eq_total);
    int eq_take = need - eq_before;
    eq_take = eq_take < 0 ? 0 : eq_take > eq ? eq : eq_take;
    int pos = block_scan(gt + eq_take, scan, &take_total);
    for (int i = c0; i < c1; i++) {
        unsigned u = order_key(sc[i]);
        if (u > prefix || (u == prefix && eq_take > 0)) {
            eq_take -= u == prefix;
            oi[pos] = map ? map[i] : off + i;
            ov[pos] = sc[i];
            pos++;
        }
    }
}

/* Block per query: its top-k over all its scores. */
MT_KERNEL __launch_bounds__(TK_NT) void dsa_topk(const float *scores, int cstride,
                                                 const int *ctx_len, int *idx, float *val)
{
    __shared__ int hist[256];
    __shared__ int scan[TK_NT];
    __shared__ int pick[2];
    const int mi = blockIdx.x;
    topk_select(scores + (long)mi * cstride, 0, 0, ctx_len[mi], idx + (long)mi * S_topk,
                val + (long)mi * S_topk, hist, scan, pick);
}

/* Split top-k (TK_SPLIT > 1), where one block a query would leave most of
 * the device idle: block (g, m) keeps the top-k of part g of query m's
 * scores, [g chunk, (g + 1) chunk) with chunk = ceil(len / TK_SPLIT), as
 * candidates (token index, score; -1 and -inf past its kept) in
 * cand[m][g][S_topk]; dsa_topk_merge then takes the top-k of the
 * TK_SPLIT x S_topk candidates. Every token of the query's top-k is in its
 * part's (what beats it in its part beats it in the query), the
 * candidates lie in token order with each part's padding after its own,
 * and the padding (-inf) is never kept when the query has more than
 * S_topk tokens (the parts then hold at least S_topk real ones): so the
 * merge keeps what one block would, ties included. */
MT_KERNEL __launch_bounds__(TK_NT) void dsa_topk_part(const float *scores, int cstride,
                                                      const int *ctx_len, int *cidx, float *cval)
{
    __shared__ int hist[256];
    __shared__ int scan[TK_NT];
    __shared__ int pick[2];
    const int g = blockIdx.x, mi = blockIdx.y, len = ctx_len[mi];
    const int chunk = (len + TK_SPLIT - 1) / TK_SPLIT;
    const int b0 = g * chunk < len ? g * chunk : len;
    const int b1 = b0 + chunk < len ? b0 + chunk : len;
    const long o = ((long)mi * TK_SPLIT + g) * S_topk;
    topk_select(scores + (long)mi * cstride + b0, 0, b0, b1 - b0, cidx + o, cval + o, hist, scan,
                pick);
}

MT_KERNEL __launch_bounds__(TK_NT) void dsa_topk_merge(const int *cidx, const float *cval,
                                                       const int *ctx_len, int *idx, float *val)
{
    __shared__ int hist[256];
    __shared__ int scan[TK_NT];
    __shared__ int pick[2];
    const int mi = blockIdx.x, len = ctx_len[mi];
    int *oi = idx + (long)mi * S_topk;
    float *ov = val + (long)mi * S_topk;
    const long o = (long)mi * TK_SPLIT * S_topk;
    if (len <= S_topk) { /* every token kept: the parts' candidates, in order */
        const int chunk = (len + TK_SPLIT - 1) / TK_SPLIT;
        for (int i = threadIdx.x; i < S_topk; i += TK_NT) {
            const int g = chunk ? i / chunk : 0, j = chunk ? i % chunk : 0;
            oi[i] = i < len ? cidx[o + (long)g * S_topk + j] : -1;
            ov[i] = i < len ? cval[o + (long)g * S_topk + j] : mt_uint_as_float(0xff800000u);
        }
        return;
    }
    topk_select(cval + o, cidx + o, 0, TK_SPLIT * S_topk, oi, ov, hist, scan, pick);
}
