/* moe_common.c: routing generators, the aligned pair layout, random MXFP4
 * weights and the plain C references of the MoE stages (see moe_common.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_common.h"

#include "common/numeric.h"
#include "common/mxfp4.h"

int64_t moe_cap_rows(int64_t npairs, int64_t n_experts, int64_t bm)
{
    int64_t nz = npairs < n_experts ? npairs : n_experts;
    int64_t rows = npairs + nz * (bm - 1);
    return (rows + bm - 1) / bm * bm;
}

void moe_gen_ids(mt_rng *r, int64_t m, int topk, int n_experts, int skew, int32_t *ids)
{
    int pool = n_experts;
    if (skew == MOE_SKEW_FEW && 2 * topk < n_experts)
        pool = 2 * topk;
    for (int64_t t = 0; t < m; t++) {
        int32_t *row = ids + t * topk;
        for (int j = 0; j < topk; j++) {
            int32_t e;
            bool dup;
            do {
                e = (skew == MOE_SKEW_HOT && j == 0) ? n_experts - 1
                                                     : (int32_t)mt_rng_below(r, (uint64_t)pool);
                dup = false;
                for (int q = 0; q < j; q++)
                    dup |= row[q] == e;
            } while (dup);
            row[j] = e;
        }
    }
}

void moe_align_ref(const int32_t *ids, int64_t npairs, int n_experts, int bm,
                   int32_t *sorted, int32_t *tile_expert, int32_t *total)
{
    int64_t cap = moe_cap_rows(npairs, n_experts, bm);
    int64_t *cnt = calloc((size_t)n_experts + 1, sizeof *cnt);
    for (int64_t p = 0; p < npairs; p++)
        cnt[ids[p]]++;
    for (int64_t i = 0; i < cap; i++)
        sorted[i] = (int32_t)npairs;
    for (int64_t t = 0; t < cap / bm; t++)
        tile_expert[t] = -1;
    int64_t off = 0;
    for (int e = 0; e < n_experts; e++) {
        int64_t seg = (cnt[e] + bm - 1) / bm * bm;
        for (int64_t t = off / bm; t < (off + seg) / bm; t++)
            tile_expert[t] = e;
        int64_t pos = off;
        for (int64_t p = 0; p < npairs && cnt[e]; p++)
            if (ids[p] == e)
                sorted[pos++] = (int32_t)p;
        off += seg;
    }
    *total = (int32_t)off;
    free(cnt);
}

void moe_gen_bf16(mt_rng *r, uint16_t *x, int64_t n, float stddev)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = mt_f32_to_bf16(mt_rng_normal(r) * stddev);
}

int moe_gen_scale_base(int64_t k)
{
    /* rms of a uniformly random E2M1 value is about 2.93 */
    return 127 - (int)lround(log2(sqrt((double)k) * 2.93));
}

void moe_gen_mxfp4(mt_rng *r, uint8_t *packed, uint8_t *scales, int64_t rows, int64_t k)
{
    int64_t nb = rows * k / 2, i = 0;
    for (; i + 8 <= nb; i += 8) {
        uint64_t v = mt_rng_u64(r);
        memcpy(packed + i, &v, 8);
    }
    for (; i < nb; i++)
        packed[i] = (uint8_t)mt_rng_u64(r);
    int base = moe_gen_scale_base(k);
    for (int64_t j = 0; j < rows * k / 32; j++)
        scales[j] = (uint8_t)(base - 1 + (int)mt_rng_below(r, 3));
}

void moe_act_row(const uint16_t *x, int64_t k, bool a4, float *out)
{
    for (int64_t i = 0; i < k; i++)
        out[i] = mt_bf16_to_f32(x[i]);
    if (a4)
        mxfp4_roundtrip_row(out, k, out);
}

void moe_act_row_i8(const uint16_t *x, int64_t k, float *out)
{
    for (int64_t b = 0; b < k; b += 32) {
        int64_t n = k - b < 32 ? k - b : 32;
        float amax = 0.0f;
        bool finite = true;
        for (int64_t i = 0; i < n; i++) {
            float v = mt_bf16_to_f32(x[b + i]);
            finite &= isfinite(v);
            amax = fmaxf(amax, fabsf(v));
        }
        float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int64_t i = 0; i < n; i++) {
            float q = rintf(mt_bf16_to_f32(x[b + i]) * inv);
            q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
            out[b + i] = finite ? q * s : NAN;
        }
    }
}

static void act_row(const moe_gemm_dims *d, const uint16_t *x, int64_t k, float *out)
{
    if (d->a8)
        moe_act_row_i8(x, k, out);
    else
        moe_act_row(x, k, d->a4, out);
}

/* ---- routing ----------------------------------------------------------- */

/* Index of the best value among n (not yet taken), ties to the lower index. */
static int argmax_free(const double *v, const bool *taken, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best]))
            best = i;
    return best;
}

void moe_route_ref_token(const moe_route_dims *d, const uint16_t *x, const uint16_t *gate,
                         const float *bias, int32_t *ids, float *w, double *choice_out,
                         double *score_out)
{
    int E = (int)d->e;
    double *score = malloc(sizeof(double) * (size_t)E * 2);
    double *choice = score + E;
    bool *taken = calloc((size_t)E, 1);
    for (int e = 0; e < E; e++) {
        double acc = 0.0;
        for (int64_t k = 0; k < d->h; k++)
            acc += (double)mt_bf16_to_f32(x[k]) * (double)mt_bf16_to_f32(gate[e * d->h + k]);
        float logit = (float)acc;
        score[e] = 1.0 / (1.0 + exp(-(double)logit));
        choice[e] = score[e] + (double)bias[e];
    }
    if (d->ngroup > 1) {
        int gs = E / d->ngroup;
        double gscore[256];
        bool gtaken[256] = {0};
        for (int g = 0; g < d->ngroup; g++) {
            double a = -INFINITY, b = -INFINITY;
            for (int e = g * gs; e < (g + 1) * gs; e++) {
                if (choice[e] > a) {
                    b = a;
                    a = choice[e];
                } else if (choice[e] > b) {
                    b = choice[e];
                }
            }
            gscore[g] = a + b;
        }
        for (int j = 0; j < d->topkg; j++)
            gtaken[argmax_free(gscore, gtaken, d->ngroup)] = true;
        for (int e = 0; e < E; e++)
            if (!gtaken[e / gs])
                choice[e] = -INFINITY;
    }
    double sum = 0.0;
    for (int j = 0; j < d->topk; j++) {
        int e = argmax_free(choice, taken, E);
        taken[e] = true;
        ids[j] = e;
        sum += score[e];
    }
    for (int j = 0; j < d->topk; j++) {
        double v = score[ids[j]];
        if (d->norm)
            v /= sum + 1e-20;
        w[j] = (float)(v * d->scale);
    }
    if (choice_out)
        memcpy(choice_out, choice, sizeof(double) * (size_t)E);
    if (score_out)
        memcpy(score_out, score, sizeof(double) * (size_t)E);
    free(score);
    free(taken);
}

/* ---- expert GEMMs ------------------------------------------------------ */

static double dot_d(const float *a, const float *b, int64_t k)
{
    double acc = 0.0;
    for (int64_t i = 0; i < k; i++)
        acc += (double)a[i] * (double)b[i];
    return acc;
}

void moe_up_ref(const moe_gemm_dims *d, const uint16_t *x, const int32_t *ids,
                const uint8_t *wg, const uint8_t *sg, const uint8_t *wu, const uint8_t *su,
                int64_t wstride, int64_t sstride, int64_t p0, int64_t p1, int64_t nstep,
                uint16_t *h)
{
    int64_t K = d->h, N = d->i, np = p1 - p0;
    float *act = malloc(sizeof(float) * (size_t)(np * K));
    float *rg = malloc(sizeof(float) * (size_t)K * 2), *ru = rg + K;
    for (int64_t p = p0; p < p1; p++)
        act_row(d, x + (p / d->topk) * K, K, act + (p - p0) * K);
    for (int64_t e = 0; e < d->e; e++) {
        bool used = false;
        for (int64_t p = p0; p < p1 && !used; p++)
            used = ids[p] == e;
        if (!used)
            continue;
        for (int64_t n = 0; n < N; n += nstep) {
            mxfp4_dequantize_row(wg + e * wstride + n * (K / 2), sg + e * sstride + n * (K / 32), K, rg);
            mxfp4_dequantize_row(wu + e * wstride + n * (K / 2), su + e * sstride + n * (K / 32), K, ru);
            for (int64_t p = p0; p < p1; p++) {
                if (ids[p] != e)
                    continue;
                float g = (float)dot_d(act + (p - p0) * K, rg, K);
                float u = (float)dot_d(act + (p - p0) * K, ru, K);
                h[p * N + n] = mt_f32_to_bf16(moe_silu(g) * u);
            }
        }
    }
    free(act);
    free(rg);
}

void moe_down_ref(const moe_gemm_dims *d, const uint16_t *hact, const int32_t *ids,
                  const float *topk_w, const uint8_t *wd, const uint8_t *sd, int64_t p0,
                  int64_t p1, int64_t nstep, float *rows, float *y)
{
    int64_t K = d->i, N = d->h, np = p1 - p0;
    float *act = malloc(sizeof(float) * (size_t)(np * K));
    float *rw = malloc(sizeof(float) * (size_t)K);
    float *val = malloc(sizeof(float) * (size_t)(np * N));
    for (int64_t p = p0; p < p1; p++)
        act_row(d, hact + p * K, K, act + (p - p0) * K);
    for (int64_t e = 0; e < d->e; e++) {
        bool used = false;
        for (int64_t p = p0; p < p1 && !used; p++)
            used = ids[p] == e;
        if (!used)
            continue;
        for (int64_t n = 0; n < N; n += nstep) {
            mxfp4_dequantize_row(wd + (e * N + n) * (K / 2), sd + (e * N + n) * (K / 32), K, rw);
            for (int64_t p = p0; p < p1; p++)
                if (ids[p] == e)
                    val[(p - p0) * N + n] = topk_w[p] * (float)dot_d(act + (p - p0) * K, rw, K);
        }
    }
    for (int64_t p = p0; p < p1; p++)
        for (int64_t n = 0; n < N; n += nstep) {
            float v = val[(p - p0) * N + n];
            if (rows)
                rows[p * N + n] = v;
            if (y)
                y[(p / d->topk) * N + n] += v;
        }
    free(act);
    free(rw);
    free(val);
}

/* ---- pieces shared by the GEMM families --------------------------------- */

void moe_layout_bufs(int64_t npairs, int64_t cap_rows, int64_t bm, kern_buf_desc *out,
                     int *n)
{
    (void)npairs;
    out[(*n)++] = (kern_buf_desc){"sorted_pairs", KERN_BUF_IN, KERN_DT_I32,
                                  (size_t)cap_rows * 4, 0, 0, 0};
    out[(*n)++] = (kern_buf_desc){"tile_expert", KERN_BUF_IN, KERN_DT_I32,
                                  (size_t)(cap_rows / bm) * 4, 0, 0, 0};
    out[(*n)++] = (kern_buf_desc){"total", KERN_BUF_IN, KERN_DT_I32, 4, 0, 0, 0};
}

double moe_expected_experts(int64_t n_experts, int64_t topk, int64_t m)
{
    double e = (double)n_experts;
    return e * (1.0 - pow(1.0 - (double)topk / e, (double)m));
}

/* Offsets in the grouped layout (see moe_common.h): group g's bytes start
 * at g * 16 * (k/2 + k/32); its block b's weights at MOE_G16_W(b) from
 * there and its 16 scale codes at MOE_G16_S(b). The kernels, compiled
 * apart, spell the same offsets as MOE_R16_W / MOE_R16_S
 * (kernels/src/moe_gemm.cpu); test_moe_group16 and the families' checks
 * hold the two together. */
#define MOE_G16_W(b) (((b) >> 2) * MOE_G16_SUPER + ((b) & 3) * 256)
#define MOE_G16_S(b) (((b) >> 2) * MOE_G16_SUPER + 1024 + ((b) & 3) * 16)

/* Row r of group g, block b: its 16 Quark bytes q[j] hold elements 2 j
 * (low nibble) and 2 j + 1; grouped byte 64 v + 4 r + i holds elements
 * 4 v + i (low) and 16 + 4 v + i. */
void moe_w4_group16(const uint8_t *packed, const uint8_t *scales, int64_t rows, int64_t k,
                    uint8_t *out)
{
    const int64_t rb = k / 2, nb = k / 32, gbytes = 16 * (rb + nb);
    for (int64_t g = 0; g < rows / 16; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *gw = out + g * gbytes + MOE_G16_W(b), *gs = out + g * gbytes + MOE_G16_S(b);
            for (int r = 0; r < 16; r++) {
                const uint8_t *q = packed + (16 * g + r) * rb + b * 16;
                uint8_t e[32]; /* the block's nibbles in K order */
                for (int j = 0; j < 16; j++) {
                    e[2 * j] = q[j] & 15;
                    e[2 * j + 1] = q[j] >> 4;
                }
                for (int v = 0; v < 4; v++)
                    for (int i = 0; i < 4; i++)
                        gw[64 * v + 4 * r + i] = (uint8_t)(e[4 * v + i] | e[16 + 4 * v + i] << 4);
                gs[r] = scales[(16 * g + r) * nb + b];
            }
        }
}

void moe_w4_ungroup16(const uint8_t *grouped, int64_t rows, int64_t k, uint8_t *out_packed,
                      uint8_t *out_scales)
{
    const int64_t rb = k / 2, nb = k / 32, gbytes = 16 * (rb + nb);
    for (int64_t g = 0; g < rows / 16; g++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *gw = grouped + g * gbytes + MOE_G16_W(b);
            const uint8_t *gs = grouped + g * gbytes + MOE_G16_S(b);
            for (int r = 0; r < 16; r++) {
                uint8_t *q = out_packed + (16 * g + r) * rb + b * 16;
                uint8_t e[32];
                for (int v = 0; v < 4; v++)
                    for (int i = 0; i < 4; i++) {
                        uint8_t byte = gw[64 * v + 4 * r + i];
                        e[4 * v + i] = byte & 15;
                        e[16 + 4 * v + i] = byte >> 4;
                    }
                for (int j = 0; j < 16; j++)
                    q[j] = (uint8_t)(e[2 * j] | e[2 * j + 1] << 4);
                out_scales[(16 * g + r) * nb + b] = gs[r];
            }
        }
}

int64_t moe_w4_bytes(int wl, int64_t rows, int64_t k)
{
    return wl == 1 ? rows * (k / 2 + k / 32) : rows * k / 2;
}

int64_t moe_w4_scale_bytes(int wl, int64_t rows, int64_t k)
{
    return wl == 1 ? 0 : rows * k / 32;
}

static uint8_t *alloc_or_abort(size_t bytes, const char *what)
{
    uint8_t *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "moetune: out of memory (%zu bytes) %s\n", bytes, what);
        abort();
    }
    return p;
}

void moe_gen_w4(mt_rng *r, int wl, int64_t rows, int64_t k, uint8_t *w, uint8_t *s)
{
    if (wl != 1) {
        moe_gen_mxfp4(r, w, s, rows, k);
        return;
    }
    uint8_t *q = alloc_or_abort((size_t)(rows * k / 2 + rows * k / 32), "grouping weights");
    moe_gen_mxfp4(r, q, q + rows * k / 2, rows, k);
    moe_w4_group16(q, q + rows * k / 2, rows, k, w);
    free(q);
}

moe_w4_view moe_w4_quark_view(int wl, int64_t rows, int64_t k, uint8_t *w, uint8_t *s)
{
    if (wl != 1)
        return (moe_w4_view){w, s, NULL};
    uint8_t *q = alloc_or_abort((size_t)(rows * k / 2 + rows * k / 32), "ungrouping weights");
    moe_w4_ungroup16(w, rows, k, q, q + rows * k / 2);
    return (moe_w4_view){q, q + rows * k / 2, q};
}

void moe_w4_view_free(moe_w4_view *v)
{
    free(v->own);
    *v = (moe_w4_view){0};
}

static const int nr_vals[] = {1, 2, 4};
static const int mr_vals[] = {1, 2, 4, 8, 16};
static const int kb_vals[] = {256, 512, 1024, 2048, 65536};
static const int nt_vals[] = {8, 16, 32, 64, 128, 256, 512, 1024};
static const int pf_vals[] = {0, 256, 512, 1024, 2048, 4096};

const kern_param_desc moe_cpu_params[MOE_CPU_NPARAMS] = {
    [MOE_CPU_NR] = {"NR", nr_vals, 3, "weight rows per register tile (x2 in stage 1: gate and up)"},
    [MOE_CPU_MR] = {"MR", mr_vals, 5, "tokens per register tile (16: wl=1 only)"},
    [MOE_CPU_KB] = {"KB", kb_vals, 5, "K elements per block (weights stay in L1 across tokens)"},
    [MOE_CPU_NT] = {"NT", nt_vals, 8, "output rows per work item (thread partition of N)"},
    [MOE_CPU_PF] = {"PF", pf_vals, 6,
                    "software prefetch distance in bytes (0: none); where the device's page "
                    "touch is on (AMD), each 4 KiB page is also touched 8 x PF ahead"},
};

bool moe_cpu_valid(int64_t k, int64_t n, int wl, const kern_config *cfg, char *why, size_t cap)
{
    int nr = cfg->v[MOE_CPU_NR], kb = cfg->v[MOE_CPU_KB], nt = cfg->v[MOE_CPU_NT];
    if (wl == 1 && ((nt / nr) % 16 || nr * cfg->v[MOE_CPU_MR] > 16)) {
        snprintf(why, cap, "wl=1: NR groups of 16 rows per tile, so NT/NR (%d/%d) a multiple of 16, "
                 "and NR x MR (%d x %d) at most 16 accumulators", nt, nr, nr, cfg->v[MOE_CPU_MR]);
        return false;
    }
    if (wl != 1 && cfg->v[MOE_CPU_MR] > 8) {
        snprintf(why, cap, "MR=%d: at most 8 tokens per register tile of Quark rows (16 with wl=1)",
                 cfg->v[MOE_CPU_MR]);
        return false;
    }
    if (n % nt) {
        snprintf(why, cap, "NT=%d does not divide N=%lld", nt, (long long)n);
        return false;
    }
    if (nt % nr) {
        snprintf(why, cap, "NR=%d does not divide NT=%d", nr, nt);
        return false;
    }
    int64_t b = kb < k ? kb : k;
    if (k % b) {
        snprintf(why, cap, "KB=%d does not divide K=%lld", kb, (long long)k);
        return false;
    }
    return true;
}

/* Defaults by the pairs each used expert gets (per_expert):
 * - decode (< 2): one token per tile; the weights stream once, so the
 *   point is few instructions per weight byte and long sequential streams:
 *   NT 512 rows per work item (shorter items pay the prefetchers' ramp-up
 *   at every start: NT 128 was 1.4x slower in stage 2), software prefetch
 *   2 KiB ahead (across the 4 KiB page boundaries where hardware
 *   prefetchers stop), stage 1 two gate and two up rows (NR 2), stage 2
 *   four (NR 4: the activation loads are shared by more rows);
 * - 2 to 4: MR 2, whole K;
 * - prefill (>= 4): compute-bound. a16w4: a register tile of 4 tokens
 *   against 2 (stage 1: 2 gate + 2 up) or 4 weight rows, 16 accumulators,
 *   K in blocks of 1024 (with bf16 dots each block is decoded once into a
 *   panel that stays in L1 across the tiles); a4w4 / a8w4: 2 tokens, all
 *   of K, 256 rows per item with prefetch (at M = 256 on Zen 5: stage 1
 *   246 ms against 281 for the a16w4-style tile, stage 2 156 against 185).
 * Weights grouped by 16 rows (wl=1): below 4 pairs per expert the
 * software prefetch runs 4 KiB ahead, not 2 (the 2 KiB of each stream in
 * flight did not cover the VM's memory latency once the dots sit between
 * the loads: in a harness that runs the kernel and a plain read of the same
 * experts in random order, 400 rounds, stage 2 went from 0.81 to 0.92 of
 * the plain read, stage 1 from 0.83 to 0.92; 6-8 KiB the same as 4, 12
 * KiB worse). Stage 1 one gate and one up group (NR 1: two weight
 * streams); stage 2 one group (NR 1) with the integer tiles: since their
 * dots take the activation as an embedded broadcast (MOE_DOT4), one
 * group ran 8-10 % faster than two at M = 1 and 16 (0.78-0.86 against
 * 0.86-0.93 ms, 11.3 against 12.3 ms), where before two groups had been
 * faster (1.16-1.21 ms against 1.37-1.44); a16w4 below 4 pairs an expert
 * keeps two groups in stage 2. That is on AMD (one_stream); on an Intel
 * Xeon (AMX, 2 cores, 32 GB/s) one group ran 16 % slower than two at M = 1
 * (2.20 against 1.90-1.93 ms; four groups the same as two), so elsewhere
 * stage 2 keeps two. Four streams read slower in either stage on Zen 5;
 * prefill one group (NR 1). One token (decode), 2 (2 to 4 per expert)
 * or 8 (prefill: 16 accumulators in stage 1), all of K. a16w4 grouped
 * (bf16 or float dots) at prefill: two groups share each broadcast
 * activation pair and tokens go in balanced groups of at most 4 (the
 * tile's passes hold 8 / groups tokens; 9 tokens as 3 + 3 + 3, not 8 + 1):
 * single thread in L2, stage 1 at 4 to 16 tokens ran at 330-350 GFLOP/s,
 * about 0.8 of the bf16 dot peak. In the full run the weight streams
 * decide: NR 2 (four streams in stage 1), 256 rows per item, prefetch 2
 * KiB ahead, all of K: at glm5.2 M = 256 stage 1 182 ms against 234 for
 * NR 1, NT 64, KB 1024 without prefetch, stage 2 95 against 127.
 * Measured on a 2-core Zen 5 (docs/BENCHMARKS.md). */
bool moe_cpu_one_stream_fills(const dev_props *p)
{
    return p && p->backend == DEV_BACKEND_CPU && strstr(p->name, "AMD") != NULL;
}

void moe_cpu_default(int64_t k, int64_t n, int64_t npairs, int64_t n_experts, bool up,
                     bool int_dot, int wl, const dev_props *p, kern_config *cfg)
{
    const bool one_stream = moe_cpu_one_stream_fills(p);
    double used = moe_expected_experts(n_experts, 1, npairs);
    double per_expert = (double)npairs / (used > 1.0 ? used : 1.0);
    cfg->n = MOE_CPU_NPARAMS;
    if (per_expert >= 4 && int_dot) {
        cfg->v[MOE_CPU_NR] = up ? 2 : 4;
        cfg->v[MOE_CPU_MR] = 2;
        cfg->v[MOE_CPU_KB] = 65536;
        cfg->v[MOE_CPU_NT] = 256;
        cfg->v[MOE_CPU_PF] = 2048;
    } else if (per_expert >= 4) {
        cfg->v[MOE_CPU_NR] = up ? 2 : 4;
        cfg->v[MOE_CPU_MR] = 4;
        cfg->v[MOE_CPU_KB] = 1024;
        cfg->v[MOE_CPU_NT] = 64;
        cfg->v[MOE_CPU_PF] = 0;
    } else {
        cfg->v[MOE_CPU_NR] = up ? 2 : 4;
        cfg->v[MOE_CPU_MR] = per_expert >= 2 ? 2 : 1;
        cfg->v[MOE_CPU_KB] = 65536;
        cfg->v[MOE_CPU_NT] = 512;
        cfg->v[MOE_CPU_PF] = 2048;
    }
    while (cfg->v[MOE_CPU_NT] > 8 && n % cfg->v[MOE_CPU_NT])
        cfg->v[MOE_CPU_NT] /= 2;
    while (cfg->v[MOE_CPU_NR] > 1 && cfg->v[MOE_CPU_NT] % cfg->v[MOE_CPU_NR])
        cfg->v[MOE_CPU_NR] /= 2;
    while (cfg->v[MOE_CPU_KB] > 256 && cfg->v[MOE_CPU_KB] < k && k % cfg->v[MOE_CPU_KB])
        cfg->v[MOE_CPU_KB] /= 2;
    if (cfg->v[MOE_CPU_KB] < k && k % cfg->v[MOE_CPU_KB])
        cfg->v[MOE_CPU_KB] = 65536;
    if (wl == 1 && !int_dot && per_expert >= 4) {
        /* With AMX one tile of up to 16 tokens per group (gate and up
         * paired in stage 1: NR 1); else paired groups of MR 4. */
        const bool amx = p && p->cpu_amx;
        cfg->v[MOE_CPU_NR] = amx ? 1 : 2;
        cfg->v[MOE_CPU_MR] = amx ? 16 : 4;
        cfg->v[MOE_CPU_KB] = 65536;
        cfg->v[MOE_CPU_NT] = 256;
        cfg->v[MOE_CPU_PF] = 2048;
        while (cfg->v[MOE_CPU_NT] > 16 && n % cfg->v[MOE_CPU_NT])
            cfg->v[MOE_CPU_NT] /= 2;
        if (cfg->v[MOE_CPU_NT] % 32)
            cfg->v[MOE_CPU_NR] = 1;
    } else if (wl == 1) {
        cfg->v[MOE_CPU_NR] =
            !up && (!int_dot || !one_stream) && per_expert < 4 && cfg->v[MOE_CPU_NT] % 32 == 0
                ? 2
                : 1;
        cfg->v[MOE_CPU_MR] = per_expert >= 4 ? 8 : per_expert >= 2 ? 2 : 1;
        if (per_expert < 4)
            cfg->v[MOE_CPU_PF] = 4096;
        if (cfg->v[MOE_CPU_NT] < 16)
            cfg->v[MOE_CPU_NT] = 16;
    }
}

size_t moe_cpu_act_bytes(int64_t rows, int64_t k)
{
    return (size_t)(rows * k * 4);
}

/* ---- GPU GEMM parameters ------------------------------------------------ */

static const int g_bm[] = {16, 32, 64, 128};
static const int g_bn[] = {16, 32, 64, 128};
static const int g_bk[] = {32, 64, 128, 256};
static const int g_waves[] = {1, 2, 4, 8};
static const int g_stages[] = {1, 2};
static const int g_splitk[] = {1, 2, 4, 8};
static const int g_groupm[] = {1, 4, 8};
static const int g_vec[] = {1, 4, 8};
static const int g_unroll[] = {1, 2, 4};
static const int g_mma[] = {0, 1, 2, 3};
static const int g_gemv[] = {0, 1, 2, 4};

const kern_param_desc moe_gpu_params[MOE_GPU_NPARAMS] = {
    [MOE_GPU_BM] = {"BM", g_bm, 4, "tile rows (pairs); divides the layout's bm"},
    [MOE_GPU_BN] = {"BN", g_bn, 4, "tile columns (weight rows)"},
    [MOE_GPU_BK] = {"BK", g_bk, 4, "K slice per shared-memory stage (multiple of 32)"},
    [MOE_GPU_WAVES] = {"WAVES", g_waves, 4, "waves per block"},
    [MOE_GPU_STAGES] = {"STAGES", g_stages, 2, "shared-memory pipeline depth"},
    [MOE_GPU_SPLITK] = {"SPLITK", g_splitk, 4, "K split across blocks (small M)"},
    [MOE_GPU_GROUPM] = {"GROUP_M", g_groupm, 3, "row tiles grouped in the launch order"},
    [MOE_GPU_VEC] = {"VEC", g_vec, 3, "bytes per weight load"},
    [MOE_GPU_UNROLL] = {"UNROLL", g_unroll, 3, "k steps unrolled in the inner loop (MMA: 1)"},
    [MOE_GPU_MMA] = {"MMA", g_mma, 4, "0 scalar FMAs; 1, 2 bf16 matrix instructions, the "
                     "platform's small (16-row) or large (32x32x8, AMD) tile; 3 fp8 e4m3 ones "
                     "(a4w4: MXFP4 folded into fp8 by row, K 32 a block; tiles and GEMV=1)"},
    [MOE_GPU_GEMV] = {"GEMV", g_gemv, 4, "0 tiles; R > 0 the decode path: no padding rows, "
                      "R pairs of an expert per pass (MMA=3: GEMV=1, 16 a pass), 16-byte "
                      "weight loads, split K over lanes and blocks"},
};

/* Row pitch padding (bf16 elements) of the MMA path's shared tiles, as
 * moe_gemm.hip's Q_LDK: 8-byte fragment rows on AMD, 4-byte pairs on NVIDIA
 * land on distinct banks. */
static int mma_pad(int ws) { return ws == 64 ? 4 : 8; }

size_t moe_gpu_shared(const kern_config *cfg, int wr, int ws)
{
    const int *v = cfg->v;
    size_t wrows = (size_t)(wr * v[MOE_GPU_BN]);
    if (v[MOE_GPU_MMA] == 3) { /* fp8 tables and the weight rows' references */
        size_t fixed = 32 * 4 + wrows * 4;
        if (v[MOE_GPU_GEMV])
            return fixed;
        size_t bk = (size_t)v[MOE_GPU_BK];
        return fixed + 2 * ((size_t)v[MOE_GPU_BM] * (bk + 16) + wrows * (bk / 2 + 16) +
                            wrows * (bk / 32));
    }
    if (v[MOE_GPU_GEMV]) /* registers and shuffles only */
        return 0;
    size_t rows = (size_t)(v[MOE_GPU_BM] + wr * v[MOE_GPU_BN]);
    if (v[MOE_GPU_MMA]) /* bf16 tiles, and moe_gemm.hip's 256-word decode table q_tab */
        return (size_t)v[MOE_GPU_STAGES] * rows * (size_t)(v[MOE_GPU_BK] + mma_pad(ws)) * 2 +
               256 * 4;
    return (size_t)v[MOE_GPU_STAGES] * rows * (size_t)(v[MOE_GPU_BK] + 1) * 4;
}

/* The MMA path's own rules (the scalar register layout does not apply):
 * the waves split BN first (as many as BN has fragment columns), then BM. */
static bool mma_valid(const int *v, const dev_props *p, int wr, char *why, size_t cap)
{
    int tm, tn, tk, mma = v[MOE_GPU_MMA];
    int BM = v[MOE_GPU_BM], BN = v[MOE_GPU_BN], W = v[MOE_GPU_WAVES];
    if (!kern_mma_tile(p, mma, &tm, &tn, &tk)) {
        snprintf(why, cap, "MMA=%d: %s has no such matrix instruction", mma, p->arch);
        return false;
    }
    if (v[MOE_GPU_UNROLL] != 1) {
        snprintf(why, cap, "MMA=%d: UNROLL=%d (the fragment loop takes UNROLL=1)", mma,
                 v[MOE_GPU_UNROLL]);
        return false;
    }
    if (mma == 3 && (v[MOE_GPU_BK] < 128 || v[MOE_GPU_STAGES] != 2)) {
        snprintf(why, cap, "MMA=3: BK=%d, STAGES=%d (the fp8 tiles take BK 128 or 256, four "
                 "blocks of 32 a weight load, and two shared buffers)", v[MOE_GPU_BK],
                 v[MOE_GPU_STAGES]);
        return false;
    }
    int wn = BN / tn < W ? BN / tn : W, wm = wn ? W / wn : 0;
    if (BN % tn || W % wn || BM % (wm * tm) || v[MOE_GPU_BK] % tk) {
        snprintf(why, cap, "MMA=%d: WAVES=%d waves of %dx%dx%d fragments do not tile the "
                 "%dx%d block and BK=%d", mma, W, tm, tn, tk, BM, BN, v[MOE_GPU_BK]);
        return false;
    }
    int frags = (BM / (wm * tm)) * (BN / (wn * tn));
    int regs = wr * frags * (tm * tn / (p->warp_size == 32 ? 32 : 64));
    if (regs > 64) {
        snprintf(why, cap, "MMA=%d: %d accumulator registers per lane (at most 64)", mma,
                 regs);
        return false;
    }
    return true;
}

/* The decode path's rules (moe_gemm.hip's V_ macros): the tile-only
 * parameters at their first values (the tuner times each kernel once),
 * and the registers a lane holds: R pairs' activations of its KPL blocks
 * of 32 (bf16 pairs: 16 words a block) and UNROLL rows of 16-byte weight
 * loads and scales (x2 in stage 1). */
static bool gemv_valid(int64_t k, const int *v, const dev_props *p, int wr, char *why,
                       size_t cap)
{
    const int ws = p->warp_size;
    static const int fixed[] = {MOE_GPU_BM, MOE_GPU_BK, MOE_GPU_STAGES, MOE_GPU_GROUPM,
                                MOE_GPU_VEC, MOE_GPU_MMA};
    if (v[MOE_GPU_MMA] == 3) { /* the decode path on fp8 instructions */
        int tm, tn, tk;
        if (!kern_mma_tile(p, 3, &tm, &tn, &tk)) {
            snprintf(why, cap, "MMA=3: %s has no fp8 matrix instructions", p->arch);
            return false;
        }
        if (v[MOE_GPU_GEMV] != 1 || v[MOE_GPU_BN] != v[MOE_GPU_WAVES] * tn ||
            (k / v[MOE_GPU_SPLITK]) % (128 * v[MOE_GPU_UNROLL])) {
            snprintf(why, cap, "GEMV=%d with MMA=3: takes GEMV=1 (16 pairs a pass), BN = WAVES "
                     "x %d (a wave's columns) and K/SPLITK a multiple of 128 x UNROLL (steps "
                     "of 4 blocks, UNROLL loaded at once)", v[MOE_GPU_GEMV], tn);
            return false;
        }
        for (size_t i = 0; i + 1 < sizeof fixed / sizeof fixed[0]; i++) {
            const kern_param_desc *d = &moe_gpu_params[fixed[i]];
            if (v[fixed[i]] != d->values[0]) {
                snprintf(why, cap, "GEMV=1, MMA=3: %s=%d, the decode path takes %s=%d", d->name,
                         v[fixed[i]], d->name, d->values[0]);
                return false;
            }
        }
        return true;
    }
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        const kern_param_desc *d = &moe_gpu_params[fixed[i]];
        if (v[fixed[i]] != d->values[0]) {
            snprintf(why, cap, "GEMV=%d: %s=%d, the decode path takes %s=%d (it has no tiles)",
                     v[MOE_GPU_GEMV], d->name, v[fixed[i]], d->name, d->values[0]);
            return false;
        }
    }
    int64_t nkb = k / 32 / v[MOE_GPU_SPLITK], low = nkb & -nkb, lk = low < ws ? low : ws;
    int64_t kpl = nkb / lk;
    int64_t regs = (v[MOE_GPU_GEMV] * 16 + (int64_t)v[MOE_GPU_UNROLL] * wr * 5) * kpl;
    if (regs > 96) { /* more spills on gfx90a/gfx942 (moe_gemm.hip's V_OCC) */
        snprintf(why, cap, "GEMV=%d, UNROLL=%d, SPLITK=%d: %lld registers per lane hold "
                 "activations and loads of %lld blocks of 32 (limit 96)", v[MOE_GPU_GEMV],
                 v[MOE_GPU_UNROLL], v[MOE_GPU_SPLITK], (long long)regs, (long long)kpl);
        return false;
    }
    return true;
}

int64_t moe_gemv_blocks(int64_t npairs, int64_t n_experts, int64_t n, const kern_config *cfg)
{
    int64_t segs = npairs < n_experts ? npairs : n_experts;
    return segs * (n / cfg->v[MOE_GPU_BN]);
}

bool moe_gpu_valid(int64_t k, int64_t n, int64_t bm, bool up, int comb, bool a4,
                   const kern_config *cfg, const dev_props *p, char *why, size_t cap)
{
    const int *v = cfg->v;
    if (v[MOE_GPU_MMA] == 3 && !a4) {
        snprintf(why, cap, "MMA=3 is the a4w4 path (a=mxfp4): other activations are not folded "
                 "into fp8");
        return false;
    }
    int BM = v[MOE_GPU_BM], BN = v[MOE_GPU_BN], BK = v[MOE_GPU_BK];
    int T = v[MOE_GPU_WAVES] * p->warp_size, wr = up ? 2 : 1, sk = v[MOE_GPU_SPLITK];
    if (bm % BM) {
        snprintf(why, cap, "BM=%d does not divide the layout's bm=%lld", BM, (long long)bm);
        return false;
    }
    if (n % BN || k % ((int64_t)BK * sk)) {
        snprintf(why, cap, "BN=%d must divide N=%lld and BK*SPLITK=%d divide K=%lld", BN,
                 (long long)n, BK * sk, (long long)k);
        return false;
    }
    if (T > p->max_threads_per_block) {
        snprintf(why, cap, "WAVES=%d: %d threads, the device allows %d", v[MOE_GPU_WAVES], T,
                 p->max_threads_per_block);
        return false;
    }
    if (v[MOE_GPU_GEMV]) {
        if (!gemv_valid(k, v, p, wr, why, cap))
            return false;
    } else if (v[MOE_GPU_MMA]) {
        if (!mma_valid(v, p, wr, why, cap))
            return false;
    } else {
        if ((BM * BN) % T || BM * BN < T) {
            snprintf(why, cap, "a %dx%d tile does not split over %d threads", BM, BN, T);
            return false;
        }
        int opt = BM * BN / T, rn = opt < 4 ? opt : 4, rm = opt / rn, tx = BN / rn;
        if (BN % rn || tx > T || T % tx || (T / tx) * rm != BM) {
            snprintf(why, cap, "a %dx%d tile has no %d-thread register layout", BM, BN, T);
            return false;
        }
        if (wr * opt > 64) {
            snprintf(why, cap, "%d accumulators per thread (limit 64: registers)", wr * opt);
            return false;
        }
    }
    size_t sh = moe_gpu_shared(cfg, wr, p->warp_size);
    if (sh > p->static_shared_per_block) { /* the tiles are static __shared__ arrays */
        snprintf(why, cap, "%sneeds %zu bytes of static shared memory, the device allows %zu",
                 v[MOE_GPU_MMA] ? "MMA: " : "", sh, p->static_shared_per_block);
        return false;
    }
    if (!up && comb && sk > 1 && !v[MOE_GPU_GEMV]) {
        snprintf(why, cap, "SPLITK=%d: the per-pair rows path (comb=1) is not split", sk);
        return false;
    }
    return true;
}

/* The first valid point of the space with MMA=mma, smallest tiles first
 * (BM varies fastest; parameters after MMA at their first value); false
 * when there is none. */
static bool gpu_first_valid(int64_t k, int64_t n, int64_t bm, bool up, int comb, bool a4,
                            int mma, const dev_props *p, kern_config *cfg)
{
    char why[256];
    uint64_t total = 1;
    for (int i = 0; i < MOE_GPU_MMA; i++)
        total *= (uint64_t)moe_gpu_params[i].n_values;
    for (uint64_t idx = 0; idx < total; idx++) {
        uint64_t r = idx;
        for (int i = 0; i < MOE_GPU_MMA; i++) {
            cfg->v[i] = moe_gpu_params[i].values[r % (uint64_t)moe_gpu_params[i].n_values];
            r /= (uint64_t)moe_gpu_params[i].n_values;
        }
        cfg->v[MOE_GPU_MMA] = mma;
        for (int i = MOE_GPU_MMA + 1; i < MOE_GPU_NPARAMS; i++) /* the tile paths' values */
            cfg->v[i] = moe_gpu_params[i].values[0];
        if (moe_gpu_valid(k, n, bm, up, comb, a4, cfg, p, why, sizeof why))
            return true;
    }
    return false;
}

/* The decode path when an expert gets about 2 pairs or fewer (expected
 * experts hit by npairs uniform draws; a 16-row tile would then be 7/8
 * padding or more): R 1 (2 above 1.5 pairs), BN 16 rows over 4 waves,
 * stage 1 UNROLL 1 (gate and up of a row: at GLM-5.2 6 loads of 16 bytes
 * in flight per lane), stage 2 UNROLL 4, and the smallest SPLITK whose
 * registers fit (NVIDIA's 32 lanes hold twice the blocks of AMD's 64). */
static bool gemv_default(int64_t k, int64_t n, int64_t bm, bool up, int comb, bool a4,
                         int64_t npairs, int64_t n_experts, const dev_props *p, kern_config *cfg)
{
    double e = (double)n_experts, np = (double)npairs;
    double per = np / (e * (1.0 - pow(1.0 - 1.0 / e, np)));
    if (!(per <= 2.0))
        return false;
    int tm, tn, tk;
    if (a4 && kern_mma_tile(p, 3, &tm, &tn, &tk)) {
        /* fp8 instructions: a wave a column group of the instruction's
         * width, 4 waves; loads in flight per lane: stage 1 two steps
         * (gate and up: 4 loads of 16 bytes), stage 2 four; K split until
         * the grid has 1024 blocks (4096 waves to stream from), as far as
         * the split keeps whole steps of 128 */
        int64_t segs = npairs < n_experts ? npairs : n_experts;
        const int bn = 4 * tn, unrolls[] = {up ? 2 : 4, 2, 1};
        bool found = false;
        kern_config best;
        for (int sk = 1; sk <= 8; sk *= 2)
            for (int ui = 0; ui < 3; ui++) {
                /* BM, BN, BK, WAVES, STAGES, SPLITK, GROUP_M, VEC, UNROLL, MMA, GEMV */
                int v[MOE_GPU_NPARAMS] = {16, bn, 32, 4, 1, sk, 1, 1, unrolls[ui], 3, 1};
                memcpy(cfg->v, v, sizeof v);
                char why[256];
                if (!moe_gpu_valid(k, n, bm, up, comb, a4, cfg, p, why, sizeof why))
                    continue;
                if (segs * (n / bn) * sk >= 1024)
                    return true;
                if (!found)
                    best = *cfg;
                found = true;
                break;
            }
        if (found) { /* the grid stays small: the smallest valid split */
            *cfg = best;
            return true;
        }
    }
    static const int sks[] = {1, 2, 4, 8};
    const int rs[] = {per > 1.5 ? 2 : 1, 1}, us[] = {up ? 1 : 4, 1};
    char why[256];
    for (int ri = 0; ri < 2; ri++)
        for (int ui = 0; ui < 2; ui++)
            for (int si = 0; si < 4; si++) {
                /* BM, BN, BK, WAVES, STAGES, SPLITK, GROUP_M, VEC, UNROLL, MMA, GEMV */
                int v[MOE_GPU_NPARAMS] = {16, 16, 32, 4, 1, sks[si], 1, 1, us[ui], 0, rs[ri]};
                memcpy(cfg->v, v, sizeof v);
                if (moe_gpu_valid(k, n, bm, up, comb, a4, cfg, p, why, sizeof why))
                    return true;
            }
    return false;
}

/* Matrix instructions wherever the device has them (kern_mma_tile):
 * - decode (16 or 32 rows per expert tile): 16-row fragments, BK 64 (half
 *   the barriers of BK 32 per weight byte), BN 32 x 2 waves for stage 1
 *   (gate and up: 2 fragments per wave) and BN 64 x 4 waves for stage 2,
 *   so an M=1 call at GLM-5.2 still has 512 and 768 blocks;
 * - prefill (64 or 128 rows): the 32x32x8 fragment where it exists (AMD
 *   wave64) with 4 waves of 2 or 4 fragments (64 accumulator registers),
 *   else the 16-row one with 8 waves, which keeps the accumulators of a
 *   128-row tile at 64 registers; BK 32 keeps the bf16 tiles of both
 *   stages in 42 KB of static shared memory (NVIDIA's 48 KB cap).
 * STAGES 2, VEC 8 (16-byte weight rows of 16 values, one scale each),
 * GROUP_M 8, SPLITK 1. A candidate that validity refuses falls through to
 * the first valid MMA config, and only then to the scalar default. */
void moe_gpu_default(int64_t k, int64_t n, int64_t bm, bool up, int comb, bool a4,
                     int64_t npairs, int64_t n_experts, const dev_props *p, kern_config *cfg)
{
    double per_expert = (double)npairs / (double)(n_experts < npairs ? n_experts : npairs);
    char why[256];
    cfg->n = MOE_GPU_NPARAMS;
    if (gemv_default(k, n, bm, up, comb, a4, npairs, n_experts, p, cfg))
        return;
    int tm, tn, tk;
    if (a4 && kern_mma_tile(p, 3, &tm, &tn, &tk)) {
        /* fp8 tiles: BN 64 (x2 in stage 1) of 4 column groups on AMD, BK
         * 128 (four blocks a weight load), BM by the rows an expert gets;
         * 8 waves where the 128-row tile's 58 KB of shared memory leave room
         * for one block a CU (2 waves a SIMD), else 4 */
        int want = per_expert >= 128 ? 128 : per_expert >= 64 ? 64 : per_expert >= 32 ? 32 : 16;
        while (want > 16 && bm % want)
            want /= 2;
        for (; want >= 16; want /= 2) {
            const int waves[] = {want >= 64 && tn == 16 ? 8 : 4, 4, 2};
            for (int wi = 0; wi < 3; wi++) {
                int v[MOE_GPU_NPARAMS] = {want, 64, 128, waves[wi], 2, 1, 8, 8, 1, 3, 0};
                memcpy(cfg->v, v, sizeof v);
                if (moe_gpu_valid(k, n, bm, up, comb, a4, cfg, p, why, sizeof why))
                    return;
            }
        }
    }
    int mma = kern_mma_tile(p, 1, &tm, &tn, &tk) ? 1 : 0;
    if (mma) {
        int big = kern_mma_tile(p, 2, &tm, &tn, &tk);
        int want = per_expert >= 128 ? 128 : per_expert >= 64 ? 64 : per_expert >= 32 ? 32 : 16;
        while (want > 16 && bm % want)
            want /= 2;
        int prefill = want >= 64;
        /* BM, BN, BK, WAVES, STAGES, SPLITK, GROUP_M, VEC, UNROLL, MMA */
        int v1[MOE_GPU_NPARAMS] = {want, up ? 32 : 64, 64, up ? 2 : 4, 2, 1, 8, 8, 1, 1};
        if (prefill) {
            int v2[MOE_GPU_NPARAMS] = {want, up ? 64 : 128, 32, big ? 4 : 8, 2, 1, 8, 8, 1,
                                       big ? 2 : 1};
            memcpy(v1, v2, sizeof v2);
        }
        memcpy(cfg->v, v1, sizeof v1);
        if (moe_gpu_valid(k, n, bm, up, comb, a4, cfg, p, why, sizeof why))
            return;
        if (prefill && big && gpu_first_valid(k, n, bm, up, comb, a4, 2, p, cfg))
            return;
        if (gpu_first_valid(k, n, bm, up, comb, a4, 1, p, cfg))
            return;
    }
    int want_bm = per_expert >= 64 ? 64 : per_expert >= 32 ? 32 : 16;
    while (want_bm > 16 && bm % want_bm)
        want_bm /= 2;
    int v0[MOE_GPU_NPARAMS] = {want_bm, 64, 32, 2, 2, 1, 8, 4, 4, 0};
    memcpy(cfg->v, v0, sizeof v0);
    if (moe_gpu_valid(k, n, bm, up, comb, a4, cfg, p, why, sizeof why) ||
        gpu_first_valid(k, n, bm, up, comb, a4, 0, p, cfg))
        return;
    memcpy(cfg->v, v0, sizeof v0); /* nothing fits this device: validity says why */
}

size_t moe_gpu_act_offset(size_t before) { return (before + 255) / 256 * 256; }

size_t moe_gpu_act_bytes(int64_t rows, int64_t k, const kern_config *cfg)
{
    if (cfg->v[MOE_GPU_MMA] == 3) /* e4m3 codes [rows, k], references int32 [rows] */
        return (size_t)rows * (size_t)(k + 4);
    return (size_t)rows * (size_t)(k / 2 + k / 32);
}

mt_status moe_gpu_act_quant(const kern_ctx *c, const void *src, int64_t rows, int64_t k,
                            size_t before, void **q, void **s, mt_err *err)
{
    unsigned char *base = (unsigned char *)c->scratch + moe_gpu_act_offset(before);
    void *x = (void *)(uintptr_t)src;
    int32_t n = (int32_t)rows;
    dev_kernel *kq;
    if (c->cfg->v[MOE_GPU_MMA] == 3) {
        *q = base;
        *s = base + (size_t)rows * (size_t)k;
        mt_status st = kern_get(c, "moe_act_q8", "pppi", &kq, err);
        if (st != MT_OK)
            return st;
        int waves = c->cfg->v[MOE_GPU_WAVES];
        void *args[] = {&x, q, s, &n};
        return dev_launch(c->dev, kq, (dev_dim3){kern_cdiv(rows, waves), 1, 1},
                          (dev_dim3){(unsigned)(waves * c->props->warp_size), 1, 1}, 0, args,
                          err);
    }
    *q = base;
    *s = base + (size_t)rows * (size_t)(k / 2);
    mt_status st = kern_get(c, "moe_act_quant", "pppi", &kq, err);
    if (st != MT_OK)
        return st;
    void *args[] = {&x, q, s, &n};
    return dev_launch(c->dev, kq, (dev_dim3){kern_cdiv(rows * (k / 32), 256), 1, 1},
                      (dev_dim3){256, 1, 1}, 0, args, err);
}

int moe_gpu_defines(bool up, const dev_props *p, dev_define *out, char (*buf)[64], int cap)
{
    if (cap < 2)
        return 0;
    snprintf(buf[0], 64, "%d", p->warp_size);
    out[0] = (dev_define){"MT_WS", buf[0]};
    out[1] = (dev_define){"MOE_UP", up ? "1" : "0"};
    return 2;
}
