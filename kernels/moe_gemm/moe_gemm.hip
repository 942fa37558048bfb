/* moe_gemm.hip: GPU kernels of moe_gemm_up and moe_gemm_down (both
 * families compile this file and launch their own kernels).
 *
 * A block computes a BM x BN tile of one expert: BM rows of the aligned
 * pair layout (kernels/moe_common.h; BM divides the layout's bm, so a tile
 * never straddles two experts and a tile that starts in padding is all
 * padding) against BN weight rows (x2 in stage 1: gate and up). The K loop
 * walks BK-wide slices, staged through shared memory in STAGES buffers:
 * activation rows are gathered by pair id (bf16, or for a4w4 the packed
 * E2M1 codes and E8M0 scales that moe_act_quant wrote once per launch,
 * decoded like the weights), weights are loaded VEC bytes at a time and
 * their nibbles decoded with the E8M0 block scales. Each thread owns an RM x RN register
 * tile. SPLITK > 1 splits K across blockIdx.y (stage 1 writes partial sums
 * to scratch and moe_up_finish applies the activation; stage 2 adds its
 * partial into y with atomics). GROUP_M swizzles the tile order so
 * GROUP_M row tiles that share weights run together.
 *
 * MMA=1 or 2 swaps the f32 register tile for the prelude's matrix
 * fragments (MT_MMA_SHAPE 16 or 32): the slices are staged as bf16 (the
 * decoded MXFP4 weights, and the decoded a4w4 activations, are E2M1 x 2^e
 * values, exact in bf16) in shared rows padded by Q_PAD, the
 * waves split BN first and then BM, each wave multiplies Q_TM x Q_TN
 * fragments (x2 in stage 1), and the epilogues are the scalar path's.
 * The weight bytes (and a4w4 activation bytes) are decoded by a 256-entry
 * table of bf16 pairs in shared memory and one integer exponent add per
 * pair (q_decode).
 *
 * a4w4 (S_a 3): the family first runs moe_act_quant, which quantizes every
 * activation row once to MXFP4 (packed [rows, K/2], E8M0 scales [rows,
 * K/32], the reference's "even" rule) into its scratch; the GEMM kernels
 * take those as aq/asc and never quantize, so no N tile repeats the work.
 * The decoded values are the MXFP4 round trip the reference computes, so
 * every path's result is bit for bit the a16w4 kernel's on the round-trip
 * activations (tests/test_moe_act_quant.c).
 *
 * GEMV > 0 is the decode path (few pairs per expert), described at its
 * section below: no tiles, no shared memory, no padding rows.
 *
 * Params: BM, BN, BK, WAVES, STAGES, SPLITK, GROUP_M, VEC (bytes per
 * weight load: 1, 4, 8), UNROLL (k steps per inner iteration), MMA, GEMV.
 * Defines from the family: MT_WS (wave size the config was built for),
 * MOE_UP (1: stage 1, 0: stage 2). Dims: S_H, S_I, S_topk, S_a (3 = a4w4),
 * S_comb (stage 2). */

#ifndef S_comb
#define S_comb 0
#endif
#ifndef MMA
#define MMA 0
#endif
#ifndef GEMV
#define GEMV 0
#endif

#define G_T (WAVES * MT_WS)
#define G_OPT (BM * BN / G_T)
#define G_RN (G_OPT < 4 ? G_OPT : 4)
#define G_RM (G_OPT / G_RN)
#define G_TX (BN / G_RN)
#define G_TY (G_T / G_TX)
#define G_WR (MOE_UP ? 2 : 1)
#define G_K (MOE_UP ? S_H : S_I)
#define G_N (MOE_UP ? S_I : S_H)
#define G_LD (BK + 1)

/* The E2M1 code of v (already divided by its block scale): bit for bit
 * mt_f32_to_e2m1, the reference's rule (ties to even, saturating, a
 * magnitude that rounds to zero and NaN give +0), as a count of passed
 * thresholds instead of the encoder's branches, which diverge per lane. */
MT_DEVICE unsigned g_e2m1_code(float v)
{
    float a = v < 0.0f ? -v : v;
    unsigned c = (unsigned)(a > 0.25f) + (unsigned)(a >= 0.75f) + (unsigned)(a > 1.25f) +
                 (unsigned)(a >= 1.75f) + (unsigned)(a > 2.5f) + (unsigned)(a >= 3.5f) +
                 (unsigned)(a > 5.0f);
    return c | (c && v < 0.0f ? 8u : 0u);
}

/* a4w4's pre-pass: quantizes activation rows [rows, G_K] (bf16) to MXFP4
 * once per launch of the family, into q (packed [rows, G_K/2], element 2i
 * in the low nibble) and s (E8M0 codes [rows, G_K/32]) by the "even" rule
 * (kernels/mxfp4.h; 255 for a block with a NaN). One lane per 32-block:
 * four 16-byte loads, one 16-byte row of codes. Grid: x = blocks / 256. */
MT_KERNEL void moe_act_quant(const mt_bf16 *x, unsigned char *q, unsigned char *s, int rows)
{
    const long long blk = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (blk >= (long long)rows * (G_K / 32))
        return;
    float f[32];
    MT_UNROLL
    for (int i = 0; i < 4; i++) {
        mt_u32x4 v = mt_load16(x + blk * 32 + 8 * i);
        unsigned w[4] = {v.x, v.y, v.z, v.w};
        MT_UNROLL
        for (int j = 0; j < 4; j++) {
            f[8 * i + 2 * j] = mt_uint_as_float(w[j] << 16);
            f[8 * i + 2 * j + 1] = mt_uint_as_float(w[j] & 0xffff0000u);
        }
    }
    float amax = 0.0f;
    int nan = 0;
    MT_UNROLL
    for (int i = 0; i < 32; i++) {
        float a = f[i] < 0.0f ? -f[i] : f[i];
        nan |= f[i] != f[i];
        amax = a > amax ? a : amax;
    }
    unsigned r = (mt_float_as_uint(amax) + 0x200000u) & 0xff800000u;
    int e = (int)(r >> 23) - 129;
    int code = e < -127 ? 0 : e > 127 ? 254 : e + 127;
    int ex = 127 - code; /* multiply by 2^ex */
    float inv = ex == -127 ? mt_uint_as_float(0x00400000u)
                           : mt_uint_as_float((unsigned)(ex + 127) << 23);
    unsigned *dq = (unsigned *)(q + blk * 16);
    MT_UNROLL
    for (int i = 0; i < 4; i++) {
        unsigned w = 0;
        MT_UNROLL
        for (int j = 0; j < 8; j++)
            w |= g_e2m1_code(f[8 * i + j] * inv) << (4 * j);
        dq[i] = w;
    }
    s[blk] = (unsigned char)(nan ? 255 : code);
}

/* Loads 32 bf16 activations of one row into dst as floats (a16w4). */
MT_DEVICE void g_load_act(const mt_bf16 *src, float *dst)
{
    for (int i = 0; i < 32; i++)
        dst[i] = mt_bf16_to_f32(src[i]);
}

/* The bf16 pair (lo, hi) of two values exact in bf16 (decoded MXFP4, and
 * bf16 activations or their MXFP4 round trip): the top halves. */
MT_DEVICE unsigned g_pair(float lo, float hi)
{
    return (mt_float_as_uint(lo) >> 16) | (mt_float_as_uint(hi) & 0xffff0000u);
}

/* Tile coordinates of this block with the GROUP_M swizzle; false when the
 * tile holds no pair. */
MT_DEVICE int g_tile(const int *sorted, const int *total, int npairs, int ntm, int *pid_m,
                     int *pid_n)
{
    const int ntn = G_N / BN;
    int pid = blockIdx.x;
    int gsize = GROUP_M * ntn, group = pid / gsize, first = group * GROUP_M;
    int gm = ntm - first < GROUP_M ? ntm - first : GROUP_M;
    *pid_m = first + (pid % gsize) % gm;
    *pid_n = (pid % gsize) / gm;
    int row0 = *pid_m * BM;
    return row0 < total[0] && sorted[row0] < npairs;
}

/* Stages K slice kt of the tile into buffer b. wrow(r) for r < G_WR*BN is
 * wb[r / BN] + (n0 + r % BN) * K/2, scales likewise. Activations: act
 * (bf16) or, for a4w4, aq/asc (moe_act_quant's codes and scales). */
MT_DEVICE void g_stage(float *xs, float *ws, const mt_bf16 *act, const unsigned char *aq,
                       const unsigned char *asc, const int *sorted, int row0,
                       int npairs, int rowdiv, const unsigned char *w0,
                       const unsigned char *s0, const unsigned char *w1,
                       const unsigned char *s1, int n0, int k0)
{
    const int tid = threadIdx.x;
    for (int idx = tid; idx < BM * (BK / 32); idx += G_T) {
        int r = idx / (BK / 32), kb = idx % (BK / 32);
        int p = sorted[row0 + r];
        float *d = xs + r * G_LD + kb * 32;
        if (p < npairs && S_a == 3) {
            long long row = p / rowdiv, k = k0 + kb * 32;
            const unsigned char *qa = aq + row * (G_K / 2) + k / 2;
            float sc = mt_e8m0_to_f32(asc[row * (G_K / 32) + k / 32]);
            for (int i = 0; i < 16; i++) {
                d[2 * i] = mt_e2m1_to_f32(qa[i] & 15u) * sc;
                d[2 * i + 1] = mt_e2m1_to_f32(qa[i] >> 4) * sc;
            }
        } else if (p < npairs) {
            float tmp[32];
            g_load_act(act + (long long)(p / rowdiv) * G_K + k0 + kb * 32, tmp);
            for (int i = 0; i < 32; i++)
                d[i] = tmp[i];
        } else {
            for (int i = 0; i < 32; i++)
                d[i] = 0.0f;
        }
    }
    const int per_row = BK / 2 / VEC; /* loads per weight row */
    for (int idx = tid; idx < G_WR * BN * per_row; idx += G_T) {
        int r = idx / per_row, c = idx % per_row;
        int n = n0 + r % BN;
        const unsigned char *wr = (r < BN ? w0 : w1) + (long long)n * (G_K / 2) + k0 / 2 + c * VEC;
        const unsigned char *sr = (r < BN ? s0 : s1) + (long long)n * (G_K / 32);
        unsigned char bytes[VEC];
        if (VEC == 8) {
            unsigned long long v = *(const unsigned long long *)wr;
            for (int j = 0; j < 8; j++)
                bytes[j] = (unsigned char)(v >> (8 * j));
        } else if (VEC == 4) {
            unsigned v = *(const unsigned *)wr;
            for (int j = 0; j < 4; j++)
                bytes[j] = (unsigned char)(v >> (8 * j));
        } else {
            for (int j = 0; j < VEC; j++)
                bytes[j] = wr[j];
        }
        for (int j = 0; j < VEC; j++) {
            int kk = c * VEC * 2 + 2 * j; /* within the slice */
            float sc = mt_e8m0_to_f32(sr[(k0 + kk) / 32]);
            ws[r * G_LD + kk] = mt_e2m1_to_f32(bytes[j] & 15u) * sc;
            ws[r * G_LD + kk + 1] = mt_e2m1_to_f32(bytes[j] >> 4) * sc;
        }
    }
}

/* The K loop shared by both stages: acc[0] (and acc[1] for stage 1). */
#define G_MAINLOOP(ACT, AQ, ASC, ROWDIV, W0, S0, W1, S1)                                \
    __shared__ float xs[STAGES][BM * G_LD];                                             \
    __shared__ float ws[STAGES][G_WR * BN * G_LD];                                      \
    const int tx = threadIdx.x % G_TX, ty = threadIdx.x / G_TX;                         \
    float acc[G_WR][G_RM][G_RN];                                                        \
    for (int q = 0; q < G_WR; q++)                                                      \
        for (int i = 0; i < G_RM; i++)                                                  \
            for (int j = 0; j < G_RN; j++)                                              \
                acc[q][i][j] = 0.0f;                                                    \
    const int kper = G_K / SPLITK, kbeg = blockIdx.y * kper, nk = kper / BK;            \
    if (STAGES > 1)                                                                     \
        g_stage(xs[0], ws[0], ACT, AQ, ASC, sorted, row0, npairs, ROWDIV, W0, S0, W1,   \
                S1, n0, kbeg);                                                          \
    for (int kt = 0; kt < nk; kt++) {                                                   \
        int b = STAGES > 1 ? kt % STAGES : 0;                                           \
        if (STAGES == 1) {                                                              \
            g_stage(xs[0], ws[0], ACT, AQ, ASC, sorted, row0, npairs, ROWDIV, W0, S0,   \
                    W1, S1, n0, kbeg + kt * BK);                                        \
            __syncthreads();                                                            \
        } else if (kt + 1 < nk) {                                                       \
            g_stage(xs[(kt + 1) % STAGES], ws[(kt + 1) % STAGES], ACT, AQ, ASC, sorted, \
                    row0, npairs, ROWDIV, W0, S0, W1, S1, n0, kbeg + (kt + 1) * BK);    \
        }                                                                               \
        if (STAGES > 1 && kt == 0)                                                      \
            __syncthreads();                                                            \
        const float *xb = xs[b], *wb = ws[b];                                           \
        for (int k0 = 0; k0 < BK; k0 += UNROLL)                                         \
            for (int u = 0; u < UNROLL; u++) {                                          \
                float a[G_RM];                                                          \
                for (int i = 0; i < G_RM; i++)                                          \
                    a[i] = xb[(ty * G_RM + i) * G_LD + k0 + u];                         \
                for (int q = 0; q < G_WR; q++)                                          \
                    for (int j = 0; j < G_RN; j++) {                                    \
                        float wv = wb[(q * BN + tx * G_RN + j) * G_LD + k0 + u];        \
                        for (int i = 0; i < G_RM; i++)                                  \
                            acc[q][i][j] += a[i] * wv;                                  \
                    }                                                                   \
            }                                                                           \
        __syncthreads();                                                                \
    }

/* The epilogues, one output element each (both paths). */
#if MOE_UP
MT_DEVICE void g_up_out(mt_bf16 *h, float *partial, int npairs, int p, int n, float g, float u)
{
    if (SPLITK > 1) {
        long long o = ((long long)blockIdx.y * npairs + p) * (2 * S_I);
        partial[o + n] = g;
        partial[o + S_I + n] = u;
    } else {
        h[(long long)p * S_I + n] = mt_f32_to_bf16(g / (1.0f + mt_expf(-g)) * u);
    }
}
#else
MT_DEVICE void g_down_out(float *out, int p, int n, float wk, float acc)
{
    float v = wk * acc;
    if (S_comb)
        out[(long long)p * S_H + n] = v;
    else
        atomicAdd(&out[(long long)(p / S_topk) * S_H + n], v);
}
#endif

#if MMA == 1 || MMA == 2
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
#if MT_WS != MT_MMA_WAVE
#error "MMA: the block's waves must be the matrix instruction's"
#endif
/* Waves across BN (as many as it has fragment columns), the rest down BM;
 * each wave owns Q_TM x Q_TN fragments. Rows of the shared tiles are BK
 * bf16 plus Q_PAD: AMD's 8-byte fragment rows and NVIDIA's 4-byte pairs
 * then fall on distinct banks (kernels/moe_common.c sizes them alike). */
#define Q_WN (WAVES < BN / MT_MMA_N ? WAVES : BN / MT_MMA_N)
#define Q_WM (WAVES / Q_WN)
#define Q_TM (BM / (Q_WM * MT_MMA_M))
#define Q_TN (BN / (Q_WN * MT_MMA_N))
#define Q_PAD (MT_MMA_WAVE == 64 ? 4 : 8)
#define Q_LDK (BK + Q_PAD)
#define Q_LDW (Q_LDK / 2) /* the row pitch in 32-bit words (bf16 pairs) */

/* The bf16 pair (lo, hi) of two decoded MXFP4 values: exact, so the top
 * halves of the floats are the bf16 values. */
MT_DEVICE unsigned q_pair(float lo, float hi) { return g_pair(lo, hi); }

/* The weight decode. q_tab[b] is the bf16 pair of byte b's two E2M1
 * nibbles (low nibble in the low half) times 2^(Q_TAB_C - 127): every
 * nonzero half then has exponent field 4..7 (0.5 -> 4, 6 -> 7), so bit 9
 * of a half is set exactly when its value is nonzero, and a zero half is
 * +0 or -0 (0x0000, 0x8000). Scaling to E8M0 code c is one add of
 * (c - Q_TAB_C) << 7 to the exponent of each nonzero half: exact, since
 * the result's exponent field (c - 1 .. c + 2) stays normal for c in
 * [Q_TAB_C, 252]. Other codes (2^-127..2^-123, where results reach bf16
 * subnormals; 253 and 254, where they overflow to inf; 255, NaN) take the
 * per-element path, as the reference computes them. */
#define Q_TAB_C 5u
#define Q_TAB_CMAX 252u

MT_DEVICE unsigned q_tab_entry(unsigned b)
{
    float s = mt_e8m0_to_f32(Q_TAB_C);
    return q_pair(mt_e2m1_to_f32(b & 15u) * s, mt_e2m1_to_f32(b >> 4) * s);
}

/* Fills q_tab (256 words); the caller synchronizes before use. */
MT_DEVICE void q_tab_fill(unsigned *tab)
{
    for (int i = threadIdx.x; i < 256; i += G_T)
        tab[i] = q_tab_entry((unsigned)i);
}

/* Decodes the nb (<= 8) bytes of v, scale code c, into nb bf16 pairs. */
MT_DEVICE void q_decode(const unsigned *tab, unsigned long long v, unsigned c, unsigned *d,
                        int nb)
{
    if (c - Q_TAB_C <= Q_TAB_CMAX - Q_TAB_C) {
        const unsigned dx = (c - Q_TAB_C) << 7;
        for (int j = 0; j < nb; j++) {
            unsigned t = tab[(unsigned)(v >> (8 * j)) & 0xffu];
            d[j] = t + ((t >> 9) & 0x00010001u) * dx;
        }
    } else {
        /* rare: a loop that ends at a sentinel bit, which compilers do not
         * count and unroll, so the fast path's loop keeps its size */
        const float sc = mt_e8m0_to_f32(c);
        for (int h = 0; h < nb; h += 4) {
            int n = nb - h < 4 ? nb - h : 4;
            unsigned long long w = (v >> (8 * h)) & ((1ull << (8 * n)) - 1u);
            for (w |= 1ull << (8 * n); w > 1u; w >>= 8) {
                unsigned byte = (unsigned)w & 0xffu;
                *d++ = q_pair(mt_e2m1_to_f32(byte & 15u) * sc, mt_e2m1_to_f32(byte >> 4) * sc);
            }
        }
    }
}

/* Stages K slice k0 as bf16 pairs: xs [BM][Q_LDW] activations (zero rows
 * for padding), ws [G_WR*BN][Q_LDW] weights, as g_stage; tab is q_tab. */
MT_DEVICE void q_stage(unsigned *xs, unsigned *ws, const unsigned *tab, const mt_bf16 *act,
                       const unsigned char *aq, const unsigned char *asc, const int *sorted,
                       int row0, int npairs, int rowdiv, const unsigned char *w0,
                       const unsigned char *s0, const unsigned char *w1,
                       const unsigned char *s1, int n0, int k0)
{
    const int tid = threadIdx.x;
    if (S_a == 3) {
        /* 16 activations per item: one 8-byte load of codes, decoded as
         * the weights are */
        for (int idx = tid; idx < BM * (BK / 16); idx += G_T) {
            int r = idx / (BK / 16), c = idx % (BK / 16);
            int p = sorted[row0 + r];
            unsigned *d = xs + r * Q_LDW + c * 8;
            if (p < npairs) {
                long long row = p / rowdiv, k = k0 + c * 16;
                unsigned long long v = *(const unsigned long long *)(aq + row * (G_K / 2) + k / 2);
                q_decode(tab, v, asc[row * (G_K / 32) + k / 32], d, 8);
            } else {
                for (int i = 0; i < 8; i++)
                    d[i] = 0u;
            }
        }
    } else {
        /* 8 bf16 per item: two 8-byte loads, four words */
        for (int idx = tid; idx < BM * (BK / 8); idx += G_T) {
            int r = idx / (BK / 8), c = idx % (BK / 8);
            int p = sorted[row0 + r];
            unsigned *d = xs + r * Q_LDW + c * 4;
            unsigned long long v0 = 0, v1 = 0;
            if (p < npairs) {
                const unsigned long long *src =
                    (const unsigned long long *)(act + (long long)(p / rowdiv) * G_K + k0 + c * 8);
                v0 = src[0];
                v1 = src[1];
            }
            d[0] = (unsigned)v0;
            d[1] = (unsigned)(v0 >> 32);
            d[2] = (unsigned)v1;
            d[3] = (unsigned)(v1 >> 32);
        }
    }
    const int per_row = BK / 2 / VEC; /* loads per weight row; VEC | 16: one scale each */
    for (int idx = tid; idx < G_WR * BN * per_row; idx += G_T) {
        int r = idx / per_row, c = idx % per_row;
        int n = n0 + r % BN;
        const unsigned char *wr = (r < BN ? w0 : w1) + (long long)n * (G_K / 2) + k0 / 2 + c * VEC;
        const unsigned char *sr = (r < BN ? s0 : s1) + (long long)n * (G_K / 32);
        /* one scalar, not a byte array: a loop the compiler keeps rolled
         * would index the array at run time, in scratch */
        unsigned long long v = VEC == 8   ? *(const unsigned long long *)wr
                               : VEC == 4 ? *(const unsigned *)wr
                                          : wr[0];
        q_decode(tab, v, sr[(k0 + c * VEC * 2) / 32], ws + r * Q_LDW + c * VEC, VEC);
    }
}

/* The K loop of the MMA path: acc[0] (and acc[1] for stage 1), with the
 * wave's fragment origin (wm, wn) for the epilogue. Step t stages slice t
 * and multiplies slice t - (STAGES - 1): one q_stage call site, which the
 * compiler inlines (a call spills across the ABI boundary into scratch). */
#define Q_MAINLOOP(ACT, AQ, ASC, ROWDIV, W0, S0, W1, S1)                                \
    __shared__ __attribute__((aligned(16))) unsigned xs[STAGES][BM * Q_LDW];            \
    __shared__ __attribute__((aligned(16))) unsigned ws[STAGES][G_WR * BN * Q_LDW];     \
    __shared__ unsigned q_tab[256];                                                     \
    q_tab_fill(q_tab);                                                                  \
    __syncthreads();                                                                    \
    const int wave = threadIdx.x / MT_MMA_WAVE;                                         \
    const int wm = wave / Q_WN, wn = wave % Q_WN;                                       \
    mt_mma_acc acc[G_WR][Q_TM][Q_TN];                                                   \
    for (int q = 0; q < G_WR; q++)                                                      \
        for (int i = 0; i < Q_TM; i++)                                                  \
            for (int j = 0; j < Q_TN; j++)                                              \
                acc[q][i][j] = mt_mma_acc_zero();                                       \
    const int kper = G_K / SPLITK, kbeg = blockIdx.y * kper, nk = kper / BK;            \
    for (int t = 0; t < nk + STAGES - 1; t++) {                                         \
        if (t < nk)                                                                     \
            q_stage(xs[t % STAGES], ws[t % STAGES], q_tab, ACT, AQ, ASC, sorted, row0,  \
                    npairs, ROWDIV, W0, S0, W1, S1, n0, kbeg + t * BK);                 \
        if (STAGES == 1)                                                                \
            __syncthreads();                                                            \
        const int kt = t - (STAGES - 1);                                                \
        if (kt >= 0) {                                                                  \
            const int b = kt % STAGES;                                                  \
            const mt_bf16 *xa = (const mt_bf16 *)xs[b] + wm * Q_TM * MT_MMA_M * Q_LDK; \
            const mt_bf16 *wa = (const mt_bf16 *)ws[b] + wn * Q_TN * MT_MMA_N * Q_LDK; \
            for (int kk = 0; kk < BK; kk += MT_MMA_K) {                                 \
                mt_mma_a fa[Q_TM];                                                      \
                for (int i = 0; i < Q_TM; i++)                                          \
                    fa[i] = mt_mma_load_a(xa + i * MT_MMA_M * Q_LDK + kk, Q_LDK);       \
                for (int q = 0; q < G_WR; q++)                                          \
                    for (int j = 0; j < Q_TN; j++) {                                    \
                        mt_mma_b fb = mt_mma_load_bt(                                   \
                            wa + (q * BN + j * MT_MMA_N) * Q_LDK + kk, Q_LDK);          \
                        for (int i = 0; i < Q_TM; i++)                                  \
                            acc[q][i][j] = mt_mma_bf16(fa[i], fb, acc[q][i][j]);        \
                    }                                                                   \
            }                                                                           \
        }                                                                               \
        __syncthreads();                                                                \
    }

/* Row (in the tile) and column (in the block's BN) of register r of
 * fragment (i, j) for this lane. */
#define Q_ROW(i, r) (wm * Q_TM * MT_MMA_M + (i) * MT_MMA_M + mt_mma_acc_row(r))
#define Q_COL(j, r) (wn * Q_TN * MT_MMA_N + (j) * MT_MMA_N + mt_mma_acc_col(r))
#endif

#if GEMV
/* ---- the decode path (GEMV = R > 0) ---------------------------------------
 * For few pairs per expert a tile of BM rows is mostly padding and the
 * weights should stream at memory speed instead. A block takes one expert
 * segment of the aligned layout (blockIdx.x / (N / BN): the segment's index
 * among the experts that have pairs, so the grid holds min(npairs, E) of
 * them) and BN weight rows (x2 in stage 1), the K slice blockIdx.y of
 * SPLITK, and walks the segment's real pairs R at a time (padding rows are
 * never read). Lanes split K: V_LK lanes share a weight row (the largest
 * power of two that divides the slice's 32-blocks, at most a wave), each
 * lane takes every V_LK-th block of 32 weights (16 bytes: one load of
 * mt_load16_nt, one E8M0 scale), so a wave covers V_LR = MT_WS / V_LK rows
 * at once and the block V_NS row slots; UNROLL rows per slot are loaded
 * before any is used (loads in flight). A lane keeps its blocks' activations
 * of the R pairs in registers as bf16 pairs (a4w4: decoded there once per
 * pass from moe_act_quant's codes), decodes the nibbles in registers (twice the E2M1 value, an
 * integer, from an 8-byte table by a byte permute; the sign from bit 3) and
 * sums in f32; the V_LK lanes of a row then add up with xor shuffles (a
 * fixed order). No atomics: stage 1 writes h (SPLITK 1) or per-split
 * partials for moe_up_finish; stage 2 writes the weighted rows (comb=1,
 * SPLITK 1) or per-split partials that moe_down_finish sums in split order
 * and, for comb=0, adds into y in ascending pair order. */
#define V_R GEMV
/* Waves per SIMD the registers must allow (a memory stream needs many),
 * from the words a lane holds: activations and the loads in flight. */
#define V_WORDS (V_R * V_KPL * 16 + UNROLL * G_WR * V_KPL * 5)
#define V_OCC (V_WORDS <= 64 ? 4 : V_WORDS <= 96 ? 3 : 2)
#define V_NKB (G_K / 32 / SPLITK)
#define V_LOW (V_NKB & -V_NKB)
#define V_LK (V_LOW < MT_WS ? V_LOW : MT_WS)
#define V_KPL (V_NKB / V_LK)
#define V_LR (MT_WS / V_LK)
#define V_NS (WAVES * V_LR)
/* 2 x |E2M1| of magnitude codes 0..7 (0, 0.5, 1, 1.5, 2, 3, 4, 6), a byte
 * each: the table of mt_nib_lut4 */
#define V_LUT_LO 0x03020100u
#define V_LUT_HI 0x0c080604u

/* Segment idx of the aligned layout (the idx-th expert that has pairs):
 * its expert, first row and padded length; false past the last one. */
MT_DEVICE int v_segment(const int *tile_expert, int bm, int ntiles, int idx, int *e, int *row0,
                        int *len)
{
    int seen = 0;
    for (int t = 0; t < ntiles; t++) {
        int te = tile_expert[t];
        if (te < 0)
            return 0;
        if ((t > 0 && tile_expert[t - 1] == te) || seen++ < idx)
            continue;
        int end = t + 1;
        while (end < ntiles && tile_expert[end] == te)
            end++;
        *e = te;
        *row0 = t * bm;
        *len = (end - t) * bm;
        return 1;
    }
    return 0;
}

/* Twice the E2M1 value of nibble t (0..7) of w given its magnitude byte
 * m (from mt_nib_lut4): 0, 1, 2, 3, 4, 6, 8 or 12, the sign from the
 * nibble's bit 3. */
MT_DEVICE float v_nib2(unsigned w, int t, unsigned m)
{
    return mt_uint_as_float(mt_float_as_uint((float)m) | ((w << (28 - 4 * t)) & 0x80000000u));
}

/* The 32 activations at src (one block, 64-byte aligned) as 16 bf16 pairs. */
MT_DEVICE void v_load_act(const mt_bf16 *src, unsigned *d)
{
    MT_UNROLL
    for (int i = 0; i < 4; i++) {
        mt_u32x4 v = mt_load16(src + 8 * i);
        d[4 * i] = v.x;
        d[4 * i + 1] = v.y;
        d[4 * i + 2] = v.z;
        d[4 * i + 3] = v.w;
    }
}

/* Word j (0..3) of a 16-byte load. */
#define V_WORD(v, j) ((j) == 0 ? (v).x : (j) == 1 ? (v).y : (j) == 2 ? (v).z : (v).w)

/* a4w4: the 16 code bytes at q (one block from moe_act_quant, 16-byte
 * aligned) with E8M0 scale code c as 16 bf16 pairs: the MXFP4 round trip
 * of the block, exact in bf16. The words pass through mt_opaque_u32, so
 * that the compiler decodes each block where it is written instead of
 * interleaving all of them (which spilled on gfx942). A byte-permute
 * decode like the weights' (mt_nib_lut4) cut stage 1's static VALU on
 * gfx942 by about 650, but spilled on sm_90 (168 registers). */
MT_DEVICE void v_load_act_q(const unsigned char *q, unsigned c, unsigned *d)
{
    const float sc = mt_e8m0_to_f32(c);
    const mt_u32x4 v = mt_load16(q);
    MT_UNROLL
    for (int j = 0; j < 4; j++) {
        const unsigned w = mt_opaque_u32(V_WORD(v, j));
        MT_UNROLL
        for (int b = 0; b < 4; b++)
            d[4 * j + b] = mt_opaque_u32(g_pair(mt_e2m1_to_f32((w >> (8 * b)) & 15u) * sc,
                                                mt_e2m1_to_f32((w >> (8 * b + 4)) & 15u) * sc));
    }
}

/* The decode path's loop over the segment (expert segment row0, padded
 * length seglen, weights W0/S0 and, stage 1, W1/S1 at row n0 of the
 * expert). EMIT(p, n, a0, a1) receives each finished dot product (a1: the
 * up row's, stage 1) in the row's lane 0. */
#define V_MAINLOOP(ACT, AQ, ASC, ROWDIV, W0, S0, W1, S1, EMIT)                           \
    const int lane = threadIdx.x % MT_WS, lk = lane % V_LK;                              \
    const int slot = threadIdx.x / MT_WS * V_LR + lane / V_LK;                           \
    const int kb0 = blockIdx.y * V_NKB + lk; /* the lane's first 32-block */             \
    for (int r0 = 0; r0 < seglen; r0 += V_R) {                                           \
        int p[V_R];                                                                      \
        MT_UNROLL                                                                        \
        for (int r = 0; r < V_R; r++)                                                    \
            p[r] = r0 + r < seglen ? sorted[row0 + r0 + r] : npairs;                     \
        if (p[0] >= npairs) /* the segment's padding: no pairs follow */                 \
            break;                                                                       \
        unsigned a[V_R][V_KPL][16];                                                      \
        MT_UNROLL                                                                        \
        for (int r = 0; r < V_R; r++)                                                    \
            MT_UNROLL                                                                    \
            for (int i = 0; i < V_KPL; i++) {                                            \
                const long long row = p[r] / (ROWDIV), kb = kb0 + i * V_LK;              \
                if (p[r] < npairs && S_a == 3) {                                         \
                    v_load_act_q((AQ) + row * (G_K / 2) + kb * 16,                       \
                                 (ASC)[row * (G_K / 32) + kb], a[r][i]);                 \
                } else if (p[r] < npairs) {                                              \
                    v_load_act((ACT) + row * G_K + kb * 32, a[r][i]);                    \
                } else {                                                                 \
                    MT_UNROLL                                                            \
                    for (int j = 0; j < 16; j++)                                         \
                        a[r][i][j] = 0u;                                                 \
                }                                                                        \
            }                                                                            \
        for (int rb = 0; rb < BN; rb += V_NS * UNROLL) {                                 \
            /* the bf16 pairs, converted where used: hoisted out of this */             \
            /* loop as floats they would take twice the registers */                    \
            unsigned ao[V_R][V_KPL][16];                                                 \
            MT_UNROLL                                                                    \
            for (int r = 0; r < V_R; r++)                                                \
                MT_UNROLL                                                                \
                for (int i = 0; i < V_KPL; i++)                                          \
                    MT_UNROLL                                                            \
                    for (int j = 0; j < 16; j++)                                         \
                        ao[r][i][j] = mt_opaque_u32(a[r][i][j]);                         \
            mt_u32x4 wv[UNROLL][G_WR][V_KPL];                                            \
            unsigned sc[UNROLL][G_WR][V_KPL];                                            \
            MT_UNROLL                                                                    \
            for (int u = 0; u < UNROLL; u++) {                                           \
                const int row = rb + u * V_NS + slot;                                    \
                /* past BN: load a valid row, emit nothing */                            \
                const long long n = n0 + (row < BN ? row : BN - 1);                      \
                MT_UNROLL                                                                \
                for (int q = 0; q < G_WR; q++)                                           \
                    MT_UNROLL                                                            \
                    for (int i = 0; i < V_KPL; i++) {                                    \
                        const long long kb = kb0 + i * V_LK;                             \
                        wv[u][q][i] = mt_load16_nt((q ? (W1) : (W0)) + n * (G_K / 2) + kb * 16); \
                        sc[u][q][i] = (q ? (S1) : (S0))[n * (G_K / 32) + kb];            \
                    }                                                                    \
            }                                                                            \
            MT_UNROLL                                                                    \
            for (int u = 0; u < UNROLL; u++) {                                           \
                float acc[G_WR][V_R];                                                    \
                MT_UNROLL                                                                \
                for (int q = 0; q < G_WR; q++) {                                         \
                    MT_UNROLL                                                            \
                    for (int r = 0; r < V_R; r++)                                        \
                        acc[q][r] = 0.0f;                                                \
                    MT_UNROLL                                                            \
                    for (int i = 0; i < V_KPL; i++) {                                    \
                        float s[V_R];                                                    \
                        MT_UNROLL                                                        \
                        for (int r = 0; r < V_R; r++)                                    \
                            s[r] = 0.0f;                                                 \
                        MT_UNROLL                                                        \
                        for (int j = 0; j < 4; j++) {                                    \
                            const unsigned w = V_WORD(wv[u][q][i], j);                   \
                            MT_UNROLL                                                    \
                            for (int h = 0; h < 2; h++) {                                \
                                const unsigned mb = mt_nib_lut4(V_LUT_LO, V_LUT_HI, w, h); \
                                MT_UNROLL                                                \
                                for (int k = 0; k < 4; k++) {                            \
                                    const int t = MT_NIB_OF(h, k); /* element 8j + t */  \
                                    const float wk = v_nib2(w, t, (mb >> (8 * k)) & 0xffu); \
                                    MT_UNROLL                                            \
                                    for (int r = 0; r < V_R; r++) {                      \
                                        const unsigned av = ao[r][i][4 * j + t / 2];     \
                                        const unsigned ab = t & 1 ? av & 0xffff0000u : av << 16; \
                                        s[r] += wk * mt_uint_as_float(ab);               \
                                    }                                                    \
                                }                                                        \
                            }                                                            \
                        }                                                                \
                        const float scale = mt_e8m0_to_f32(sc[u][q][i]);                 \
                        MT_UNROLL                                                        \
                        for (int r = 0; r < V_R; r++)                                    \
                            acc[q][r] += s[r] * scale;                                   \
                    }                                                                    \
                    MT_UNROLL                                                            \
                    for (int r = 0; r < V_R; r++)                                        \
                        MT_UNROLL                                                        \
                        for (int off = V_LK / 2; off > 0; off /= 2)                      \
                            acc[q][r] += mt_shfl_xor_f32(acc[q][r], off);                \
                }                                                                        \
                const int row = rb + u * V_NS + slot;                                    \
                if (lk == 0 && row < BN)                                                 \
                    MT_UNROLL                                                            \
                    for (int r = 0; r < V_R; r++)                                        \
                        if (p[r] < npairs)                                               \
                            EMIT(p[r], n0 + row, 0.5f * acc[0][r], 0.5f * acc[G_WR - 1][r]); \
            }                                                                            \
        }                                                                                \
    }

#if !MOE_UP
/* Stage 2's per-pair result: the weighted row (comb=1 without split) or
 * the split's unweighted partial for moe_down_finish. */
MT_DEVICE void v_down_out(float *out, float *partial, const float *topk_w, int npairs, int p,
                          int n, float acc)
{
    if (S_comb && SPLITK == 1)
        out[(long long)p * S_H + n] = topk_w[p] * acc;
    else
        partial[((long long)blockIdx.y * npairs + p) * S_H + n] = acc;
}
#endif
#endif

#if MMA == 3
/* ---- MXFP4 on fp8 matrix instructions (MMA = 3, a4w4) ----------------------
 * An E2M1 value times a power of two is exact in fp8 e4m3 while the result
 * stays within e4m3's range. Each row of activations (moe_act_q8, once per
 * launch) and each weight row (the tile's or wave's prologue, over the K
 * range it multiplies) takes as its reference c the largest E8M0 code of its
 * blocks; a block of code s is stored as E2M1 x 2^(s - c + Q8_F). Q8_F = 6
 * keeps the largest value (6 x 64 = 384) below e4m3's 448, and every block
 * down to 14 binades below its row's largest is exact (2^-9, e4m3's least
 * subnormal, is half of E2M1's 0.5 at s - c = -14); blocks further down
 * are flushed to zero: less than 2^-14 of the row's largest block, well
 * inside the family's tolerance. So one fp32 accumulator runs across all
 * of K with no per-block work, and the epilogue scales each result once by
 * 2^((c_row - 127 - Q8_F) + (c_n - 127 - Q8_F)). A row with a NaN block
 * (code 255) has c = 255 and gives NaN, as the reference does.
 *
 * The table of tables: q8 table i (i = 1..15) holds the e4m3 codes of the
 * eight E2M1 magnitudes times 2^(i - 9); table 0 is all zeros (flushed).
 * A block of code s in a row of reference c uses table s - c + 15, clamped
 * to 0. Its bytes feed mt_mma8_expand as the magnitude table. */
#if !MT_MMA8_HAVE
#error "MMA=3 needs fp8 matrix instructions (gfx940+, sm_89+)"
#endif
#if S_a != 3
#error "MMA=3 is the a4w4 path (a=mxfp4)"
#endif
#define Q8_F 6
#define Q8_NKB (G_K / 32 / SPLITK) /* 32-blocks of a split's K range */

/* Table i as its two words (magnitudes 0..3, 4..7). */
MT_DEVICE unsigned q8_table_word(int i, int hi)
{
    unsigned w = 0;
    for (int m = 0; m < 4; m++) {
        float v = i ? mt_ldexpf(mt_e2m1_to_f32((unsigned)(4 * hi + m)), i - 9) : 0.0f;
        w |= mt_f32_to_fp8e4m3(v) << (8 * m);
    }
    return w;
}

/* Fills the 16 tables (32 words); the caller synchronizes before use. */
MT_DEVICE void q8_tables_fill(unsigned *tab)
{
    for (int i = threadIdx.x; i < 32; i += G_T)
        tab[i] = q8_table_word(i / 2, i % 2);
}

/* Table index of block code s in a row of reference code c. */
MT_DEVICE int q8_index(unsigned s, int c)
{
    int i = (int)s - c + 15;
    return i < 0 ? 0 : i;
}

/* The scale 2^e of a row pair's result, or NaN for a row with a NaN block. */
MT_DEVICE float q8_out(float acc, int cm, int cn)
{
    if (cm == 255 || cn == 255)
        return mt_uint_as_float(0x7fc00000u);
    return mt_ldexpf(acc, cm + cn - 2 * (127 + Q8_F));
}

/* The largest E8M0 code of n scale bytes at s (255 when one is 255). */
MT_DEVICE int q8_row_max(const unsigned char *s, int n)
{
    int c = 0;
    if (n % 4 == 0) {
        const unsigned *w = (const unsigned *)s;
        for (int i = 0; i < n / 4; i++) {
            unsigned v = w[i];
            for (int b = 0; b < 4; b++) {
                int x = (int)((v >> (8 * b)) & 0xffu);
                c = x > c ? x : c;
            }
        }
    } else {
        for (int i = 0; i < n; i++)
            c = s[i] > c ? s[i] : c;
    }
    return c;
}

/* a4w4's pre-pass of the 8-bit paths: quantizes activation rows [rows,
 * G_K] (bf16) to MXFP4 by the "even" rule, exactly as moe_act_quant, and
 * stores them as e4m3 codes folded by the row's reference scale (q, [rows,
 * G_K] bytes, every 8-element group in MT_MMA8_SLOT order) with the
 * reference codes (cm, [rows]). One wave a row: Q8_BPL blocks a lane, the
 * row's largest code by shuffles. Grid: x = rows / WAVES. */
#define Q8_BPL ((G_K / 32 + MT_WS - 1) / MT_WS)
MT_KERNEL void moe_act_q8(const mt_bf16 *x, unsigned char *q, int *cm, int rows)
{
    __shared__ unsigned tab[32];
    q8_tables_fill(tab);
    __syncthreads();
    const int lane = threadIdx.x % MT_WS;
    const long long row = (long long)blockIdx.x * WAVES + threadIdx.x / MT_WS;
    if (row >= rows)
        return;
    const mt_bf16 *src = x + row * G_K;
    unsigned code[Q8_BPL];
    int c = 0;
    MT_UNROLL
    for (int i = 0; i < Q8_BPL; i++) {
        const int kb = lane + i * MT_WS;
        code[i] = 0;
        if (kb < G_K / 32) {
            float amax = 0.0f;
            int nan = 0;
            for (int j = 0; j < 32; j++) {
                float f = mt_bf16_to_f32(src[kb * 32 + j]), a = f < 0.0f ? -f : f;
                nan |= f != f;
                amax = a > amax ? a : amax;
            }
            unsigned r = (mt_float_as_uint(amax) + 0x200000u) & 0xff800000u;
            int e = (int)(r >> 23) - 129;
            code[i] = nan ? 255u : (unsigned)(e < -127 ? 0 : e > 127 ? 254 : e + 127);
            c = (int)code[i] > c ? (int)code[i] : c;
        }
    }
    for (int off = MT_WS / 2; off > 0; off /= 2) {
        int o = mt_shfl_xor_i32(c, off);
        c = o > c ? o : c;
    }
    if (lane == 0)
        cm[row] = c;
    MT_UNROLL
    for (int i = 0; i < Q8_BPL; i++) {
        const int kb = lane + i * MT_WS;
        if (kb >= G_K / 32)
            continue;
        const int ex = 127 - (int)(code[i] == 255u ? 127u : code[i]);
        const float inv = ex == -127 ? mt_uint_as_float(0x00400000u)
                                     : mt_uint_as_float((unsigned)(ex + 127) << 23);
        const int t = q8_index(code[i], c);
        const unsigned lo = tab[2 * t], hi = tab[2 * t + 1];
        unsigned *dst = (unsigned *)(q + row * G_K + kb * 32);
        for (int g = 0; g < 4; g++) {
            unsigned char b[8];
            for (int e = 0; e < 8; e++) {
                unsigned n = g_e2m1_code(mt_bf16_to_f32(src[kb * 32 + 8 * g + e]) * inv);
                unsigned mag = ((n & 4u ? hi : lo) >> (8 * (n & 3u))) & 0xffu;
                b[MT_MMA8_SLOT(e)] = (unsigned char)(mag | (n & 8u) << 4);
            }
            dst[2 * g] = (unsigned)b[0] | (unsigned)b[1] << 8 | (unsigned)b[2] << 16 |
                         (unsigned)b[3] << 24;
            dst[2 * g + 1] = (unsigned)b[4] | (unsigned)b[5] << 8 | (unsigned)b[6] << 16 |
                             (unsigned)b[7] << 24;
        }
    }
}

/* The reference codes of the weight rows a block multiplies: row r <
 * G_WR*BN is row n0 + r % BN of W0/S0 (r < BN) or W1/S1, over the split's
 * K range; into cn[r]. The caller synchronizes. */
MT_DEVICE void q8_weight_refs(int *cn, const unsigned char *s0, const unsigned char *s1, int n0)
{
    const int kb0 = blockIdx.y * Q8_NKB;
    for (int r = threadIdx.x; r < G_WR * BN; r += G_T) {
        const unsigned char *s = (r < BN ? s0 : s1) + (long long)(n0 + r % BN) * (G_K / 32);
        cn[r] = q8_row_max(s + kb0, Q8_NKB);
    }
}

#if !GEMV
/* ---- the tile path ---------------------------------------------------------
 * Waves across BN (as many as it has fragment columns), the rest down BM;
 * a wave owns Q8_TM x Q8_TN fragments (x2 in stage 1). A K step is BK =
 * 32 x Q8_BLK: the block's copies of the next step (activation codes,
 * packed weights: mt_async16, 16 bytes each; their scales: plain loads)
 * are issued before the matrix instructions of this one, and land in the
 * other of two shared buffers. Shared rows are padded by 16 bytes (the
 * copies' alignment; spreads the fragment reads over the banks). */
#define Q8_WN (WAVES < BN / MT_MMA8_N ? WAVES : BN / MT_MMA8_N)
#define Q8_WM (WAVES / Q8_WN)
#define Q8_TM (BM / (Q8_WM * MT_MMA8_M))
#define Q8_TN (BN / (Q8_WN * MT_MMA8_N))
#define Q8_BLK (BK / 32)
#define Q8_LDA (BK + 16)      /* bytes per activation row */
#define Q8_LDW (BK / 2 + 16)  /* bytes per packed weight row */
#define Q8_ACH (BM * BK / 16) /* 16-byte copies of a step's activations */
#define Q8_WCH (G_WR * BN * Q8_BLK) /* ... and of its weights */
#define Q8_ACP ((Q8_ACH + G_T - 1) / G_T) /* a thread's */
#define Q8_WCP ((Q8_WCH + G_T - 1) / G_T)
#define Q8_SCP ((G_WR * BN + G_T - 1) / G_T) /* a thread's weight rows of scales */

/* The scale bytes of one weight row for one step (Q8_BLK of them, <= 8). */
MT_DEVICE unsigned long long q8_scales(const unsigned char *s)
{
    unsigned long long v = 0;
    for (int i = 0; i < Q8_BLK; i++)
        v |= (unsigned long long)s[i] << (8 * i);
    return v;
}

#define Q8_MAINLOOP(AQ, ACM, ROWDIV, W0, S0, W1, S1)                                         \
    __shared__ __attribute__((aligned(16))) unsigned char xs[2][BM * Q8_LDA];                \
    __shared__ __attribute__((aligned(16))) unsigned char ws[2][G_WR * BN * Q8_LDW];         \
    __shared__ unsigned char ss[2][G_WR * BN * Q8_BLK];                                      \
    __shared__ unsigned q8_tab[32];                                                          \
    __shared__ int q8_cn[G_WR * BN];                                                         \
    q8_tables_fill(q8_tab);                                                                  \
    q8_weight_refs(q8_cn, S0, S1, n0);                                                       \
    const int wave = threadIdx.x / MT_WS;                                                    \
    const int wm = wave / Q8_WN, wn = wave % Q8_WN;                                          \
    mt_mma8_acc acc[G_WR][Q8_TM][Q8_TN];                                                     \
    MT_UNROLL                                                                                \
    for (int q = 0; q < G_WR; q++)                                                           \
        MT_UNROLL                                                                            \
        for (int i = 0; i < Q8_TM; i++)                                                      \
            MT_UNROLL                                                                        \
            for (int j = 0; j < Q8_TN; j++)                                                  \
                acc[q][i][j] = mt_mma8_acc_zero();                                           \
    /* this thread's copies: source rows fixed over K, offsets per step */                   \
    const unsigned char *asrc[Q8_ACP], *wsrc[Q8_WCP], *ssrc[Q8_SCP];                         \
    int adst[Q8_ACP], wdst[Q8_WCP], sdst[Q8_SCP];                                            \
    MT_UNROLL                                                                                \
    for (int c = 0; c < Q8_ACP; c++) {                                                       \
        const int ch = threadIdx.x + c * G_T, r = ch / (BK / 16), col = ch % (BK / 16);      \
        int p = ch < Q8_ACH ? sorted[row0 + r] : npairs;                                     \
        p = p < npairs ? p : 0; /* padding rows: any row; their results are dropped */       \
        asrc[c] = (AQ) + (long long)(p / (ROWDIV)) * G_K + blockIdx.y * (G_K / SPLITK) +     \
                  16 * col;                                                                  \
        adst[c] = ch < Q8_ACH ? r * Q8_LDA + 16 * col : -1;                                  \
    }                                                                                        \
    MT_UNROLL                                                                                \
    for (int c = 0; c < Q8_WCP; c++) {                                                       \
        const int ch = threadIdx.x + c * G_T, r = ch / Q8_BLK, col = ch % Q8_BLK;            \
        const int rr = ch < Q8_WCH ? r : 0;                                                  \
        wsrc[c] = (rr < BN ? (W0) : (W1)) + (long long)(n0 + rr % BN) * (G_K / 2) +          \
                  blockIdx.y * (G_K / 2 / SPLITK) + 16 * col;                                \
        wdst[c] = ch < Q8_WCH ? r * Q8_LDW + 16 * col : -1;                                  \
    }                                                                                        \
    MT_UNROLL                                                                                \
    for (int c = 0; c < Q8_SCP; c++) {                                                       \
        const int r = threadIdx.x + c * G_T, rr = r < G_WR * BN ? r : 0;                     \
        ssrc[c] = (rr < BN ? (S0) : (S1)) + (long long)(n0 + rr % BN) * (G_K / 32) +         \
                  blockIdx.y * Q8_NKB;                                                       \
        sdst[c] = r < G_WR * BN ? r * Q8_BLK : -1;                                           \
    }                                                                                        \
    const int nk = G_K / SPLITK / BK;                                                        \
    mt_u32x4 ahold[Q8_ACP], whold[Q8_WCP];                                                   \
    unsigned long long shold[Q8_SCP];                                                        \
    /* step 0's copies, then a step t's copies of step t + 1 */                              \
    MT_UNROLL                                                                                \
    for (int c = 0; c < Q8_ACP; c++)                                                         \
        if (Q8_ACH % G_T == 0 || adst[c] >= 0)                                               \
            mt_async16_begin(xs[0] + adst[c], asrc[c], &ahold[c]);                           \
    MT_UNROLL                                                                                \
    for (int c = 0; c < Q8_WCP; c++)                                                         \
        if (Q8_WCH % G_T == 0 || wdst[c] >= 0)                                               \
            mt_async16_begin(ws[0] + wdst[c], wsrc[c], &whold[c]);                           \
    MT_UNROLL                                                                                \
    for (int c = 0; c < Q8_SCP; c++)                                                         \
        shold[c] = q8_scales(ssrc[c]); /* a valid row for every thread */                    \
    mt_async_wait();                                                                         \
    MT_UNROLL                                                                                \
    for (int c = 0; c < Q8_ACP; c++)                                                         \
        if (Q8_ACH % G_T == 0 || adst[c] >= 0)                                               \
            mt_async16_end(xs[0] + adst[c], ahold[c]);                                       \
    MT_UNROLL                                                                                \
    for (int c = 0; c < Q8_WCP; c++)                                                         \
        if (Q8_WCH % G_T == 0 || wdst[c] >= 0)                                               \
            mt_async16_end(ws[0] + wdst[c], whold[c]);                                       \
    MT_UNROLL                                                                                \
    for (int c = 0; c < Q8_SCP; c++)                                                         \
        if (sdst[c] >= 0)                                                                    \
            MT_UNROLL                                                                        \
            for (int i = 0; i < Q8_BLK; i++)                                                 \
                ss[0][sdst[c] + i] = (unsigned char)(shold[c] >> (8 * i));                   \
    __syncthreads();                                                                         \
    /* a B pair's column is fixed: its reference, for the table index */                     \
    int bcn[G_WR][Q8_TN];                                                                    \
    MT_UNROLL                                                                                \
    for (int q = 0; q < G_WR; q++)                                                           \
        MT_UNROLL                                                                            \
        for (int j = 0; j < Q8_TN; j++)                                                      \
            bcn[q][j] = q8_cn[q * BN + (wn * Q8_TN + j) * MT_MMA8_N + mt_mma8_col_b()];      \
    for (int t = 0; t < nk; t++) {                                                           \
        const int b = t % 2, nb = 1 - b;                                                     \
        const int more = t + 1 < nk;                                                         \
        if (more) {                                                                          \
            MT_UNROLL                                                                        \
            for (int c = 0; c < Q8_ACP; c++)                                                 \
                if (Q8_ACH % G_T == 0 || adst[c] >= 0)                                       \
                    mt_async16_begin(xs[nb] + adst[c], asrc[c] + (t + 1) * BK, &ahold[c]);   \
            MT_UNROLL                                                                        \
            for (int c = 0; c < Q8_WCP; c++)                                                 \
                if (Q8_WCH % G_T == 0 || wdst[c] >= 0)                                       \
                    mt_async16_begin(ws[nb] + wdst[c], wsrc[c] + (t + 1) * (BK / 2),         \
                                     &whold[c]);                                             \
            MT_UNROLL                                                                        \
            for (int c = 0; c < Q8_SCP; c++)                                                 \
                shold[c] = q8_scales(ssrc[c] + (t + 1) * Q8_BLK);                            \
        }                                                                                    \
        const unsigned char *xb = xs[b] + wm * Q8_TM * MT_MMA8_M * Q8_LDA;                   \
        MT_UNROLL                                                                            \
        for (int q = 0; q < G_WR; q++)                                                       \
            MT_UNROLL                                                                        \
            for (int j = 0; j < Q8_TN; j++) {                                                \
                const int col = q * BN + (wn * Q8_TN + j) * MT_MMA8_N;                       \
                /* B: the column's packed words of the step's blocks, by 4 */                \
                MT_UNROLL                                                                    \
                for (int k4 = 0; k4 < Q8_BLK; k4 += 4) {                                     \
                    unsigned raw[4];                                                         \
                    mt_mma8_load_b_packed4(ws[b] + col * Q8_LDW + 16 * k4, Q8_LDW, 16, raw); \
                    MT_UNROLL                                                                \
                    for (int kb = k4; kb < k4 + 4; kb++) {                                   \
                        const unsigned sc = ss[b][(col + mt_mma8_col_b()) * Q8_BLK + kb];    \
                        const int ti = q8_index(sc, bcn[q][j]);                              \
                        unsigned w0, w1;                                                     \
                        mt_mma8_expand(raw[kb - k4], q8_tab[2 * ti], q8_tab[2 * ti + 1], &w0, \
                                       &w1);                                                 \
                        mt_mma8_b fb;                                                        \
                        mt_mma8_set_b(&fb, w0, w1);                                          \
                        MT_UNROLL                                                            \
                        for (int i = 0; i < Q8_TM; i++) {                                    \
                            mt_mma8_a fa =                                                   \
                                mt_mma8_load_a(xb + i * MT_MMA8_M * Q8_LDA + 32 * kb, Q8_LDA); \
                            acc[q][i][j] = mt_mma8_fp8(fa, fb, acc[q][i][j]);                \
                        }                                                                    \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
        if (more) {                                                                          \
            mt_async_wait();                                                                 \
            MT_UNROLL                                                                        \
            for (int c = 0; c < Q8_ACP; c++)                                                 \
                if (Q8_ACH % G_T == 0 || adst[c] >= 0)                                       \
                    mt_async16_end(xs[nb] + adst[c], ahold[c]);                              \
            MT_UNROLL                                                                        \
            for (int c = 0; c < Q8_WCP; c++)                                                 \
                if (Q8_WCH % G_T == 0 || wdst[c] >= 0)                                       \
                    mt_async16_end(ws[nb] + wdst[c], whold[c]);                              \
            MT_UNROLL                                                                        \
            for (int c = 0; c < Q8_SCP; c++)                                                 \
                if (sdst[c] >= 0)                                                            \
                    MT_UNROLL                                                                \
                    for (int i = 0; i < Q8_BLK; i++)                                         \
                        ss[nb][sdst[c] + i] = (unsigned char)(shold[c] >> (8 * i));          \
        }                                                                                    \
        __syncthreads();                                                                     \
    }                                                                                        \
    const int *cmr = (const int *)(ACM);

/* Row (in the tile) and column (in the block's BN) of register r of
 * fragment (i, j) for this lane. */
#define Q8_ROW(i, r) (wm * Q8_TM * MT_MMA8_M + (i) * MT_MMA8_M + mt_mma8_acc_row(r))
#define Q8_COL(j, r) (wn * Q8_TN * MT_MMA8_N + (j) * MT_MMA8_N + mt_mma8_acc_col(r))
#endif

#if GEMV
/* ---- the decode path on fp8 instructions (GEMV = 1, MMA = 3) ---------------
 * As GEMV's: a block takes one expert segment and BN weight rows (x2 in
 * stage 1), the split blockIdx.y of K, and walks the segment's real pairs,
 * here 16 at a time as the rows of A. A wave owns MT_MMA8_N of the BN rows;
 * a K step is 4 blocks of 32: a lane loads one 16-byte block of its column
 * (block kgroup of the step; mt_load16_nt, read once) and its scale, and
 * word d of that load, expanded through its block's folded table, is the B
 * pair of the step's matrix instruction d. The A pair of instruction d is
 * the same block's 8 elements 8d .. 8d+7 of its row, so instruction d
 * multiplies matching elements of four blocks (one per kgroup), all folded
 * to their rows' references. UNROLL steps are loaded before any is used. */
#define W8_NSTEP (Q8_NKB / 4)

/* This lane's A rows of a pass (pair rows rowbase .. + nrows - 1): the
 * folded activation codes of their K range, or NULL past the pass's rows. */
MT_DEVICE void w8_act_rows(const unsigned char *aq, const int *sorted, int rowbase, int nrows,
                           int npairs, int rowdiv, const unsigned char **rows)
{
    const int kb = blockIdx.y * Q8_NKB + mt_mma8_kgroup();
    MT_UNROLL
    for (int i = 0; i < MT_MMA8_A_PAIRS; i++) {
        const int r = mt_mma8_row_a(i);
        const int p = r < nrows ? sorted[rowbase + r] : npairs;
        rows[i] = p < npairs ? aq + (long long)(p / rowdiv) * G_K + kb * 32 : 0;
    }
}

/* The A pair words of step st's four instructions (zero for no row). */
MT_DEVICE void w8_act(const unsigned char *const *rows, int st, unsigned *w)
{
    MT_UNROLL
    for (int i = 0; i < MT_MMA8_A_PAIRS; i++) {
        mt_u32x4 v0 = {0u, 0u, 0u, 0u}, v1 = {0u, 0u, 0u, 0u};
        if (rows[i]) {
            v0 = mt_load16(rows[i] + st * 128);
            v1 = mt_load16(rows[i] + st * 128 + 16);
        }
        w[8 * i + 0] = v0.x, w[8 * i + 1] = v0.y, w[8 * i + 2] = v0.z, w[8 * i + 3] = v0.w;
        w[8 * i + 4] = v1.x, w[8 * i + 5] = v1.y, w[8 * i + 6] = v1.z, w[8 * i + 7] = v1.w;
    }
}

#define W8_MAINLOOP(AQ, ACM, ROWDIV, W0, S0, W1, S1, EMIT)                                   \
    __shared__ unsigned q8_tab[32];                                                          \
    __shared__ int q8_cn[G_WR * BN];                                                         \
    q8_tables_fill(q8_tab);                                                                  \
    q8_weight_refs(q8_cn, S0, S1, n0);                                                       \
    __syncthreads();                                                                         \
    const int wave = threadIdx.x / MT_WS;                                                    \
    const int wcol = wave * MT_MMA8_N + mt_mma8_col_b(); /* the lane's B column in BN */     \
    const int kb0 = blockIdx.y * Q8_NKB + mt_mma8_kgroup();                                  \
    const unsigned char *wp[G_WR], *sp[G_WR];                                                \
    int cn[G_WR];                                                                            \
    for (int q = 0; q < G_WR; q++) {                                                         \
        const long long n = n0 + wcol;                                                       \
        wp[q] = (q ? (W1) : (W0)) + n * (G_K / 2) + (long long)kb0 * 16;                     \
        sp[q] = (q ? (S1) : (S0)) + n * (G_K / 32) + kb0;                                    \
        cn[q] = q8_cn[q * BN + wcol];                                                        \
    }                                                                                        \
    const int *cmr = (const int *)(ACM);                                                     \
    for (int r0 = 0; r0 < seglen; r0 += MT_MMA8_M) {                                         \
        if (sorted[row0 + r0] >= npairs) /* the segment's padding: no pairs follow */        \
            break;                                                                           \
        const int nrows = seglen - r0 < MT_MMA8_M ? seglen - r0 : MT_MMA8_M;                 \
        const unsigned char *arows[MT_MMA8_A_PAIRS];                                         \
        w8_act_rows((AQ), sorted, row0 + r0, nrows, npairs, (ROWDIV), arows);                \
        mt_mma8_acc acc[G_WR];                                                               \
        for (int q = 0; q < G_WR; q++)                                                       \
            acc[q] = mt_mma8_acc_zero();                                                     \
        MT_NOUNROLL                                                                          \
        for (int s0 = 0; s0 < W8_NSTEP; s0 += UNROLL) {                                      \
            mt_u32x4 wv[UNROLL][G_WR];                                                       \
            unsigned sv[UNROLL][G_WR];                                                       \
            MT_UNROLL                                                                        \
            for (int u = 0; u < UNROLL; u++)                                                 \
                MT_UNROLL                                                                    \
                for (int q = 0; q < G_WR; q++) {                                             \
                    wv[u][q] = mt_load16_nt(wp[q] + (long long)(s0 + u) * 64);               \
                    sv[u][q] = sp[q][(s0 + u) * 4];                                          \
                }                                                                            \
            MT_UNROLL                                                                        \
            for (int u = 0; u < UNROLL; u++) {                                               \
                unsigned aw[8 * MT_MMA8_A_PAIRS];                                            \
                w8_act(arows, s0 + u, aw);                                                   \
                MT_UNROLL                                                                    \
                for (int q = 0; q < G_WR; q++) {                                             \
                    const int ti = q8_index(sv[u][q], cn[q]);                                \
                    const unsigned tlo = q8_tab[2 * ti], thi = q8_tab[2 * ti + 1];           \
                    MT_UNROLL                                                                \
                    for (int d = 0; d < 4; d++) {                                            \
                        unsigned w0, w1;                                                     \
                        mt_mma8_expand(V_WORD(wv[u][q], d), tlo, thi, &w0, &w1);             \
                        mt_mma8_b fb;                                                        \
                        mt_mma8_set_b(&fb, w0, w1);                                          \
                        mt_mma8_a fa;                                                        \
                        MT_UNROLL                                                            \
                        for (int i = 0; i < MT_MMA8_A_PAIRS; i++)                            \
                            mt_mma8_set_a(&fa, i, aw[8 * i + 2 * d], aw[8 * i + 2 * d + 1]); \
                        acc[q] = mt_mma8_fp8(fa, fb, acc[q]);                                \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        MT_UNROLL                                                                            \
        for (int rg = 0; rg < 4; rg++) {                                                     \
            const int r = mt_mma8_acc_row(rg);                                               \
            const int p = r < nrows ? sorted[row0 + r0 + r] : npairs;                        \
            if (p >= npairs)                                                                 \
                continue;                                                                    \
            const int cm = cmr[p / (ROWDIV)];                                                \
            const int c = wave * MT_MMA8_N + mt_mma8_acc_col(rg);                            \
            EMIT(p, n0 + c, q8_out(acc[0].x[rg], cm, q8_cn[c]),                              \
                 q8_out(acc[G_WR - 1].x[rg], cm, q8_cn[(G_WR - 1) * BN + c]));               \
        }                                                                                    \
    }
#endif
#endif

#if GEMV
#define G_BOUNDS MT_LAUNCH_OCC(G_T, V_OCC)
#else
#define G_BOUNDS __launch_bounds__(G_T)
#endif

#if MOE_UP
/* Grid: x = ntm * (S_I / BN) tiles, y = SPLITK. GEMV: x = min(npairs, E)
 * segments * (S_I / BN), and ntm is the layout's tile count (rows / bm).
 * a4w4 reads xq/xqs (moe_act_quant of x), a16w4 x. */
MT_KERNEL G_BOUNDS void moe_gemm_up(
    const mt_bf16 *x, const unsigned char *xq, const unsigned char *xqs, const int *sorted,
    const int *tile_expert, const int *total,
    const unsigned char *wg, const unsigned char *sg, const unsigned char *wu,
    const unsigned char *su, long long wstride, long long sstride, mt_bf16 *h,
    float *partial, int npairs, int bm, int ntm)
{
#if GEMV
    (void)total;
    int ex, row0, seglen;
    if (!v_segment(tile_expert, bm, ntm, blockIdx.x / (S_I / BN), &ex, &row0, &seglen))
        return;
    const int n0 = blockIdx.x % (S_I / BN) * BN;
    const long long e = ex;
    const unsigned char *w0 = wg + e * wstride, *w1 = wu + e * wstride;
    const unsigned char *s0 = sg + e * sstride, *s1 = su + e * sstride;
#if MMA == 3
#define W8_UP_EMIT(P, N, G, U) g_up_out(h, partial, npairs, (P), (N), (G), (U))
    W8_MAINLOOP(xq, xqs, S_topk, w0, s0, w1, s1, W8_UP_EMIT)
#else
#define V_UP_EMIT(P, N, G, U) g_up_out(h, partial, npairs, (P), (N), (G), (U))
    V_MAINLOOP(x, xq, xqs, S_topk, w0, s0, w1, s1, V_UP_EMIT)
#endif
#else
    int pid_m, pid_n;
    if (!g_tile(sorted, total, npairs, ntm, &pid_m, &pid_n))
        return;
    const int row0 = pid_m * BM, n0 = pid_n * BN;
    const long long e = tile_expert[row0 / bm];
    const unsigned char *w0 = wg + e * wstride, *w1 = wu + e * wstride;
    const unsigned char *s0 = sg + e * sstride, *s1 = su + e * sstride;
#endif
#if GEMV
#elif MMA == 3
    (void)x;
    Q8_MAINLOOP(xq, xqs, S_topk, w0, s0, w1, s1)
    MT_UNROLL
    for (int i = 0; i < Q8_TM; i++)
        MT_UNROLL
        for (int rg = 0; rg < 4; rg++) {
            int p = sorted[row0 + Q8_ROW(i, rg)];
            if (p >= npairs)
                continue;
            const int cm = cmr[p / S_topk];
            MT_UNROLL
            for (int j = 0; j < Q8_TN; j++) {
                const int c = Q8_COL(j, rg);
                g_up_out(h, partial, npairs, p, n0 + c, q8_out(acc[0][i][j].x[rg], cm, q8_cn[c]),
                         q8_out(acc[1][i][j].x[rg], cm, q8_cn[BN + c]));
            }
        }
#elif MMA
    Q_MAINLOOP(x, xq, xqs, S_topk, w0, s0, w1, s1)
    for (int i = 0; i < Q_TM; i++)
        for (int rg = 0; rg < MT_MMA_ACC_REGS; rg++) {
            int p = sorted[row0 + Q_ROW(i, rg)];
            if (p >= npairs)
                continue;
            for (int j = 0; j < Q_TN; j++)
                g_up_out(h, partial, npairs, p, n0 + Q_COL(j, rg), acc[0][i][j].x[rg],
                         acc[1][i][j].x[rg]);
        }
#else
    G_MAINLOOP(x, xq, xqs, S_topk, w0, s0, w1, s1)
    for (int i = 0; i < G_RM; i++) {
        int p = sorted[row0 + ty * G_RM + i];
        if (p >= npairs)
            continue;
        for (int j = 0; j < G_RN; j++)
            g_up_out(h, partial, npairs, p, n0 + tx * G_RN + j, acc[0][i][j], acc[1][i][j]);
    }
#endif
}

/* Split-K epilogue: sums the SPLITK partials in order, applies silu * up. */
MT_KERNEL void moe_up_finish(const float *partial, mt_bf16 *h, int npairs)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)npairs * S_I)
        return;
    long long p = i / S_I, n = i % S_I;
    float g = 0.0f, u = 0.0f;
    for (int s = 0; s < SPLITK; s++) {
        long long o = ((long long)s * npairs + p) * (2 * S_I);
        g += partial[o + n];
        u += partial[o + S_I + n];
    }
    h[i] = mt_f32_to_bf16(g / (1.0f + mt_expf(-g)) * u);
}

#else
/* Grid: x = ntm * (S_H / BN) tiles, y = SPLITK. out is y [M, S_H] (S_comb
 * 0, accumulated with atomics) or rows [npairs, S_H] (S_comb 1). GEMV: as
 * stage 1's, with per-split partials [SPLITK][npairs][S_H] for
 * moe_down_finish unless comb=1 is not split. a4w4 reads hq/hqs
 * (moe_act_quant of hin), a16w4 hin. */
MT_KERNEL G_BOUNDS void moe_gemm_down(
    const mt_bf16 *hin, const unsigned char *hq, const unsigned char *hqs, const int *sorted,
    const int *tile_expert, const int *total,
    const unsigned char *wd, const unsigned char *sd, long long wstride, long long sstride,
    const float *topk_w, float *out, float *partial, int npairs, int bm, int ntm)
{
#if GEMV
    (void)total;
    int ex, row0, seglen;
    if (!v_segment(tile_expert, bm, ntm, blockIdx.x / (S_H / BN), &ex, &row0, &seglen))
        return;
    const int n0 = blockIdx.x % (S_H / BN) * BN;
    const long long e = ex;
    const unsigned char *w0 = wd + e * wstride, *s0 = sd + e * sstride;
#define V_DOWN_EMIT(P, N, A, A1) v_down_out(out, partial, topk_w, npairs, (P), (N), (A))
#if MMA == 3
    W8_MAINLOOP(hq, hqs, 1, w0, s0, w0, s0, V_DOWN_EMIT)
#else
    V_MAINLOOP(hin, hq, hqs, 1, w0, s0, w0, s0, V_DOWN_EMIT)
#endif
#else
    (void)partial;
    int pid_m, pid_n;
    if (!g_tile(sorted, total, npairs, ntm, &pid_m, &pid_n))
        return;
    const int row0 = pid_m * BM, n0 = pid_n * BN;
    const long long e = tile_expert[row0 / bm];
    const unsigned char *w0 = wd + e * wstride, *s0 = sd + e * sstride;
#endif
#if GEMV
#elif MMA == 3
    (void)hin;
    Q8_MAINLOOP(hq, hqs, 1, w0, s0, w0, s0)
    MT_UNROLL
    for (int i = 0; i < Q8_TM; i++)
        MT_UNROLL
        for (int rg = 0; rg < 4; rg++) {
            int p = sorted[row0 + Q8_ROW(i, rg)];
            if (p >= npairs)
                continue;
            const int cm = cmr[p];
            const float wk = topk_w[p];
            MT_UNROLL
            for (int j = 0; j < Q8_TN; j++) {
                const int c = Q8_COL(j, rg);
                g_down_out(out, p, n0 + c, wk, q8_out(acc[0][i][j].x[rg], cm, q8_cn[c]));
            }
        }
#elif MMA
    Q_MAINLOOP(hin, hq, hqs, 1, w0, s0, w0, s0)
    for (int i = 0; i < Q_TM; i++)
        for (int rg = 0; rg < MT_MMA_ACC_REGS; rg++) {
            int p = sorted[row0 + Q_ROW(i, rg)];
            if (p >= npairs)
                continue;
            float wk = topk_w[p];
            for (int j = 0; j < Q_TN; j++)
                g_down_out(out, p, n0 + Q_COL(j, rg), wk, acc[0][i][j].x[rg]);
        }
#else
    G_MAINLOOP(hin, hq, hqs, 1, w0, s0, w0, s0)
    for (int i = 0; i < G_RM; i++) {
        int p = sorted[row0 + ty * G_RM + i];
        if (p >= npairs)
            continue;
        float wk = topk_w[p];
        for (int j = 0; j < G_RN; j++)
            g_down_out(out, p, n0 + tx * G_RN + j, wk, acc[0][i][j]);
    }
#endif
}

#if GEMV
/* The decode path's stage-2 epilogue: per element, the SPLITK partials
 * summed in split order and weighted; comb=1 writes the pair's row, comb=0
 * adds the token's pairs into y in ascending pair order (no atomics). One
 * thread per element of rows [npairs, S_H] or y [npairs / S_topk, S_H]. */
MT_KERNEL void moe_down_finish(const float *partial, const float *topk_w, float *out,
                               int npairs)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long rows = S_comb ? npairs : npairs / S_topk;
    if (i >= rows * S_H)
        return;
    long long r = i / S_H, n = i % S_H;
    float y = S_comb ? 0.0f : out[i];
    for (int j = 0; j < (S_comb ? 1 : S_topk); j++) {
        long long p = S_comb ? r : r * S_topk + j;
        float a = 0.0f;
        for (int s = 0; s < SPLITK; s++)
            a += partial[((long long)s * npairs + p) * S_H + n];
        float v = topk_w[p] * a;
        y = S_comb ? v : y + v;
    }
    out[i] = y;
}
#endif
#endif
