/* moe_route.hip: the moe_route family on GPUs.
 *   logits[e] = x . gate[e] (bf16 inputs, f32 accumulation), one wave per
 *   expert at a time, lanes striding H by VEC elements, shuffle reduction;
 *   score = sigmoid(logit); choice = score + bias[e] (selection only);
 *   group-limited selection when S_ngroup > 1 (sum of each group's top two
 *   choices, keep S_topkg groups); S_topk rounds of a block argmax over
 *   the choices, ties to the lower expert id; weights are the unbiased
 *   scores, renormalized (S_norm) and multiplied by rsf.
 * Two paths (TPB):
 *   TPB = 0  moe_route: one block per token computes its logits and selects.
 *            Every block streams the whole gate (from L2 after the first).
 *   TPB > 0  moe_route_logits: a grid of (E / EPB) x (M / TPB) x KS
 *            blocks; each wave reads a gate row's K slice once and dots it
 *            with TPB tokens (with KS = 1 the same per-lane order as the
 *            one-block path), so at decode the gate streams through many
 *            CUs instead of one; then moe_route_select, one block per
 *            token, adds the KS partial logits in slice order and selects
 *            (scratch, f32 [KS][M][E]).
 * Params: WAVES, VEC, TPB, EPB, KS. Dims: S_H, S_E, S_topk, S_ngroup, S_topkg,
 * S_norm. Dynamic shared: moe_route (S_H + 2*S_E + 2*S_ngroup + 64)
 * floats, moe_route_select (2*S_E + 2*S_ngroup + 64), moe_route_logits
 * none. */

#define R_NEG (-3.0e38f)                     /* a masked group's experts */
#define R_TAKEN mt_uint_as_float(0xff800000u) /* -inf: already selected */

/* Better of two (value, id) candidates: larger value, then lower id. */
MT_DEVICE int r_better(float v, int i, float ov, int oi)
{
    return ov > v || (ov == v && oi < i);
}

/* Selection of token t from score/choice (shared, S_E each), by the whole
 * block (WAVES waves); writes ids and weights of token t. */
MT_DEVICE void r_select(float *score, float *choice, float *gsc, float *redv, int *redi,
                        int *gkeep, int *ids, float *wout, float rsf, long long t)
{
    const int T = WAVES * MT_WARP_SIZE;
    int tid = threadIdx.x, lane = tid % MT_WARP_SIZE, wave = tid / MT_WARP_SIZE;
    if (S_ngroup > 1) {
        const int gs = S_E / S_ngroup;
        for (int g = tid; g < S_ngroup; g += T) {
            float a = R_NEG, b = R_NEG;
            for (int e = g * gs; e < (g + 1) * gs; e++) {
                float c = choice[e];
                if (c > a) {
                    b = a;
                    a = c;
                } else if (c > b) {
                    b = c;
                }
            }
            gsc[g] = a + b;
        }
        __syncthreads();
        if (tid == 0) {
            /* keep the S_topkg best groups (ties to the lower group id) */
            for (int g = 0; g < S_ngroup; g++)
                gkeep[g] = 0;
            for (int j = 0; j < S_topkg; j++) {
                int best = -1;
                for (int g = 0; g < S_ngroup; g++)
                    if (!gkeep[g] && (best < 0 || gsc[g] > gsc[best]))
                        best = g;
                gkeep[best] = 1;
            }
        }
        __syncthreads();
        for (int e = tid; e < S_E; e += T)
            if (!gkeep[e / gs])
                choice[e] = R_NEG;
        __syncthreads();
    }
    float wsum = 0.0f;
    for (int j = 0; j < S_topk; j++) {
        float bv = R_TAKEN;
        int bi = S_E;
        for (int e = tid; e < S_E; e += T)
            if (r_better(bv, bi, choice[e], e)) {
                bv = choice[e];
                bi = e;
            }
        for (int o = MT_WARP_SIZE / 2; o > 0; o /= 2) {
            float ov = mt_shfl_xor_f32(bv, o);
            int oi = mt_shfl_xor_i32(bi, o);
            if (r_better(bv, bi, ov, oi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            redv[wave] = bv;
            redi[wave] = bi;
        }
        __syncthreads();
        if (tid == 0) {
            for (int q = 1; q < WAVES; q++)
                if (r_better(bv, bi, redv[q], redi[q])) {
                    bv = redv[q];
                    bi = redi[q];
                }
            ids[t * S_topk + j] = bi;
            wout[t * S_topk + j] = score[bi];
            wsum += score[bi];
            choice[bi] = R_TAKEN;
        }
        __syncthreads();
    }
    if (tid == 0)
        for (int j = 0; j < S_topk; j++) {
            float v = wout[t * S_topk + j];
            if (S_norm)
                v = v / (wsum + 1e-20f);
            wout[t * S_topk + j] = v * rsf;
        }
}

MT_KERNEL void moe_route(const mt_bf16 *x, const mt_bf16 *gate, const float *bias,
                         int *ids, float *wout, float rsf)
{
    MT_DYN_SHARED(float, sh);
    float *xs = sh, *score = sh + S_H, *choice = sh + S_H + S_E;
    float *gsc = choice + S_E, *redv = gsc + S_ngroup;
    int *redi = (int *)(redv + 32), *gkeep = redi + 32;
    const int T = WAVES * MT_WARP_SIZE;
    int tid = threadIdx.x, lane = tid % MT_WARP_SIZE, wave = tid / MT_WARP_SIZE;
    long long t = blockIdx.x;
    for (int k = tid; k < S_H; k += T)
        xs[k] = mt_bf16_to_f32(x[t * S_H + k]);
    __syncthreads();
    for (int e = wave; e < S_E; e += WAVES) {
        const mt_bf16 *g = gate + (long long)e * S_H;
        float acc = 0.0f;
        for (int k = lane * VEC; k < S_H; k += MT_WARP_SIZE * VEC)
            for (int v = 0; v < VEC; v++)
                if (k + v < S_H)
                    acc += xs[k + v] * mt_bf16_to_f32(g[k + v]);
        for (int o = MT_WARP_SIZE / 2; o > 0; o /= 2)
            acc += mt_shfl_xor_f32(acc, o);
        if (lane == 0) {
            float s = 1.0f / (1.0f + mt_expf(-acc));
            score[e] = s;
            choice[e] = s + bias[e];
        }
    }
    __syncthreads();
    r_select(score, choice, gsc, redv, redi, gkeep, ids, wout, rsf, t);
}

#ifndef TPB
#define TPB 0
#endif
#if TPB > 0
#define R_TPB TPB
#else
#define R_TPB 1
#endif
#ifndef KS
#define KS 1
#endif
/* H elements per K slice: a whole number of 64 * VEC runs, so each lane
 * visits the same elements in the same order as over the whole row (on
 * wave64 and wave32); with KS = 1 one slice covers the row. */
#define R_KC ((((S_H + KS - 1) / KS) + 64 * VEC - 1) / (64 * VEC) * (64 * VEC))
/* Whole VEC runs load as 32-bit words (two bf16 each) when rows keep them
 * aligned; R_U runs per lane, gate and token words, are loaded before any
 * is used, so a wave keeps R_U gate loads in flight (fewer runs when many
 * tokens would hold too many registers). */
#define R_WORDS (VEC >= 2 && S_H % VEC == 0)
#define R_NW (VEC >= 2 ? VEC / 2 : 1)
#define R_U (R_TPB * R_NW >= 16 ? 1 : R_TPB * R_NW >= 8 ? 2 : 4)

/* Adds the token rows x[t0 .. t0+nt) times the gate row g over this lane's
 * runs k, k + W*VEC, ... below k1 (W the wave size) to acc[0 .. nt), in
 * run order and element order within a run. */
MT_DEVICE void r_dot_slice(const mt_bf16 *g, const mt_bf16 *x, int t0, int nt, int k, int k1,
                           float *acc)
{
    const int step = MT_WARP_SIZE * VEC;
    if (R_WORDS) {
        for (; k < k1; k += R_U * step) {
            unsigned gw[R_U][R_NW], xw[R_U][R_TPB][R_NW];
            for (int u = 0; u < R_U; u++)
                if (k + u * step < k1) {
                    for (int v = 0; v < R_NW; v++)
                        gw[u][v] = ((const unsigned *)(g + k + u * step))[v];
                    for (int j = 0; j < R_TPB; j++)
                        if (j < nt) {
                            const mt_bf16 *xr = x + (long long)(t0 + j) * S_H + k + u * step;
                            for (int v = 0; v < R_NW; v++)
                                xw[u][j][v] = ((const unsigned *)xr)[v];
                        }
                }
            for (int u = 0; u < R_U; u++)
                if (k + u * step < k1)
                    for (int v = 0; v < R_NW; v++) {
                        float g0 = mt_uint_as_float(gw[u][v] << 16);
                        float g1 = mt_uint_as_float(gw[u][v] & 0xffff0000u);
                        for (int j = 0; j < R_TPB; j++)
                            if (j < nt) {
                                acc[j] += mt_uint_as_float(xw[u][j][v] << 16) * g0;
                                acc[j] += mt_uint_as_float(xw[u][j][v] & 0xffff0000u) * g1;
                            }
                    }
        }
        return;
    }
    for (; k < k1; k += step)
        for (int v = 0; v < VEC; v++)
            if (k + v < k1) {
                float gv = mt_bf16_to_f32(g[k + v]);
                for (int j = 0; j < R_TPB; j++)
                    if (j < nt)
                        acc[j] += mt_bf16_to_f32(x[(long long)(t0 + j) * S_H + k + v]) * gv;
            }
}

/* Grid (ceil(E / EPB), ceil(m / TPB), KS): block (bx, by, z) dots the gate
 * rows of experts [bx*EPB, ...) over K slice z with tokens [by*TPB, ...)
 * and writes partial logits to logits[z][t][e] (f32 [KS][m][S_E]); the
 * select kernel adds the KS partials in slice order (deterministic). */
MT_KERNEL void moe_route_logits(const mt_bf16 *x, const mt_bf16 *gate, float *logits, int m)
{
    int lane = threadIdx.x % MT_WARP_SIZE, wave = threadIdx.x / MT_WARP_SIZE;
    int t0 = blockIdx.y * R_TPB, nt = m - t0 < R_TPB ? m - t0 : R_TPB;
    int e1 = (blockIdx.x + 1) * EPB < S_E ? (blockIdx.x + 1) * EPB : S_E;
    int k0 = blockIdx.z * R_KC, k1 = k0 + R_KC < S_H ? k0 + R_KC : S_H;
    float *part = logits + (long long)blockIdx.z * m * S_E;
    for (int e = blockIdx.x * EPB + wave; e < e1; e += WAVES) {
        const mt_bf16 *g = gate + (long long)e * S_H;
        float acc[R_TPB];
        for (int j = 0; j < R_TPB; j++)
            acc[j] = 0.0f;
        r_dot_slice(g, x, t0, nt, k0 + lane * VEC, k1, acc);
        for (int j = 0; j < R_TPB; j++) {
            float a = acc[j];
            for (int o = MT_WARP_SIZE / 2; o > 0; o /= 2)
                a += mt_shfl_xor_f32(a, o);
            if (lane == 0 && j < nt)
                part[(long long)(t0 + j) * S_E + e] = a;
        }
    }
}

MT_KERNEL void moe_route_select(const float *logits, const float *bias, int *ids, float *wout,
                                float rsf, int m)
{
    MT_DYN_SHARED(float, sh);
    float *score = sh, *choice = sh + S_E;
    float *gsc = choice + S_E, *redv = gsc + S_ngroup;
    int *redi = (int *)(redv + 32), *gkeep = redi + 32;
    const int T = WAVES * MT_WARP_SIZE;
    long long t = blockIdx.x;
    for (int e = threadIdx.x; e < S_E; e += T) {
        float l = logits[t * S_E + e];
        for (int z = 1; z < KS; z++)
            l += logits[((long long)z * m + t) * S_E + e];
        float s = 1.0f / (1.0f + mt_expf(-l));
        score[e] = s;
        choice[e] = s + bias[e];
    }
    __syncthreads();
    r_select(score, choice, gsc, redv, redi, gkeep, ids, wout, rsf, t);
}
