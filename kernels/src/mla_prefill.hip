/* mla_prefill.hip: causal MLA prefill of a chunk against the paged latent
 * cache (family mla_prefill, see kernels/fam_mla_prefill.c).
 *
 * mla_prefill_expand: block (token tile of ET, row tile of EN) multiplies
 * the context's latent rows by kv_b through shared-memory tiles (EK deep)
 * into bf16 k_nope [T][H][D] and v [T][H][V].
 * mla_prefill_attn: block (query tile of BM, head) runs flash attention
 * over key tiles of BN: S = q k^T in shared memory, an online softmax per
 * row, o += p v in registers. Key/value tiles are loaded STAGES - 1 tiles
 * ahead into a ring of shared-memory buffers, so loads overlap the math of
 * the current tile with one barrier per tile.
 *
 * Params: BM, BN, WAVES, STAGES; NT, NACC, KV_FP8, ET, EN, EK from the
 * family. Shape: S_H, S_L, S_R, S_D, S_V, S_ps. */

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
