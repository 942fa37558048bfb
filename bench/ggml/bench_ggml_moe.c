/* bench_ggml_moe.c: moetune's MoE expert GEMM stages against ggml's CPU
 * mul_mat_id (the op under llama.cpp's MoE layers) on the same MXFP4 expert
 * weights, timed interleaved in one run with the same routing per round
 * (moe_bench.h's peer), with a numeric check that both compute the same
 * product. Built only when cmake gets -DMOETUNE_GGML_DIR=<ggml install
 * prefix or build directory>; ggml stays outside this repository
 * (docs/BENCHMARKS.md, "moetune against ggml").
 *
 *   bench_ggml_moe [--shape glm5.2] [--m 1,16,256] [--device cpu]
 *                  [--max-ms 1500] [--plain] [--poll|--cold] [--no-thp] [--sweep]
 *                  [--flush] [--json] [--no-limits] [--seed S]
 *
 * ggml's side: expert weights of type GGML_TYPE_MXFP4 ([K, N, E], one
 * 17-byte block per 32 weights: the E8M0 code, then 16 bytes with element j
 * in the low nibble and j + 16 in the high one), converted from moetune's
 * (Quark) layout, in the cpu backend's CPU_REPACK buffer type (--plain: the
 * plain CPU buffer); activations f32, which mul_mat_id quantizes to q8_0
 * inside the op; a graph of one mul_mat_id computed by the cpu backend on a
 * ggml threadpool of as many threads as moetune's cpu device. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>

#include "bench/lib/moe_bench.h"
#include "common/clock.h"
#include "common/numeric.h"
#include "common/rng.h"
#include "device/device.h"
#include "kernels/moe/moe_common.h"
#include "common/mxfp4.h"

enum { GGML_MXFP4_BLOCK_BYTES = 17, CHECK_M = 3, CHECK_NSTEP = 5 };

/* ggml's state: the backend, its threadpool, the two weight tensors and
 * the graph of the (stage, M) being timed. */
typedef struct ggml_side {
    int threads;
    bool plain;
    bool poll; /* leave the pool polling between calls (else paused) */
    bool cold; /* paused pool: no warm-up before the timed compute */
    bool no_thp; /* leave ggml's weights on the pages malloc gives */
    uint64_t seed;
    FILE *log;
    ggml_backend_t be;
    struct ggml_threadpool *tp;
    struct ggml_context *wctx;
    ggml_backend_buffer_t wbuf;
    struct ggml_tensor *w_up, *w_down; /* [H, 2I, E] and [I, H, E] */
    int64_t H, I, E, topk, maxm;
    float *x, *h; /* the stages' inputs as f32: [maxm, H], [maxm * topk, I] */
    /* the graph of one (stage, M) */
    struct ggml_context *gctx;
    ggml_backend_buffer_t gbuf;
    struct ggml_cgraph *graph;
    struct ggml_tensor *act, *ids, *out;
    bool g_up;
    int64_t g_m;
} ggml_side;

/* ---- weights --------------------------------------------------------------- */

/* One row of k MXFP4 weights from the Quark layout (packed[k/2], element 2i
 * low; scales[k/32]) into ggml blocks (out[k/32 * 17]). */
static void row_to_ggml(const uint8_t *packed, const uint8_t *scales, int64_t k, uint8_t *out)
{
    for (int64_t b = 0; b < k / 32; b++) {
        const uint8_t *p = packed + b * 16;
        uint8_t *o = out + b * GGML_MXFP4_BLOCK_BYTES, code[32];
        for (int j = 0; j < 16; j++) {
            code[2 * j] = p[j] & 15;
            code[2 * j + 1] = p[j] >> 4;
        }
        o[0] = scales[b];
        for (int j = 0; j < 16; j++)
            o[1 + j] = (uint8_t)(code[j] | code[j + 16] << 4);
    }
}

/* Expert e's n x k weights, in layout in->wl on the device, as Quark rows
 * into pk [n, k/2] and scl [n, k/32]. */
static mt_status expert_quark(const moe_bench_peer_inputs *in, const void *w, const void *sc,
                              int64_t e, int64_t n, int64_t k, uint8_t *pk, uint8_t *scl,
                              mt_err *err)
{
    if (!in->wl) {
        mt_status st = dev_copy_from(in->d, pk, (const uint8_t *)w + e * n * k / 2,
                                     (size_t)(n * k / 2), err);
        return st == MT_OK ? dev_copy_from(in->d, scl, (const uint8_t *)sc + e * n * k / 32,
                                           (size_t)(n * k / 32), err)
                           : st;
    }
    size_t gb = (size_t)moe_w4_bytes(1, n, k);
    uint8_t *g = malloc(gb);
    if (!g)
        return mt_fail(err, MT_E_NOMEM, "bench_ggml_moe: out of memory ungrouping the weights");
    mt_status st = dev_copy_from(in->d, g, (const uint8_t *)w + (size_t)e * gb, gb, err);
    if (st == MT_OK)
        moe_w4_ungroup16(g, n, k, pk, scl);
    free(g);
    return st;
}

/* The weights of one stage ([E, n, k] on moetune's device) into the ggml
 * tensor t: converted into a host staging copy, then set (the repack
 * buffer converts again, to its interleaved layout, as it is set). Checks
 * the first rows of expert 0 against ggml's own MXFP4 decode. */
static mt_status load_weights(ggml_side *s, const moe_bench_peer_inputs *in, const void *w,
                              const void *sc, int64_t n, int64_t k, struct ggml_tensor *t,
                              mt_err *err)
{
    size_t row_g = (size_t)(k / 32) * GGML_MXFP4_BLOCK_BYTES, nbytes = ggml_nbytes(t);
    if (nbytes != (size_t)(s->E * n) * row_g)
        return mt_fail(err, MT_E_UNSUPPORTED,
                       "bench_ggml_moe: ggml's MXFP4 tensor [%lld, %lld, %lld] holds %zu bytes, "
                       "not 17 per 32 weights (has its block layout changed?)",
                       (long long)k, (long long)n, (long long)s->E, nbytes);
    uint8_t *stage = malloc(nbytes), *pk = malloc((size_t)(n * k / 2)),
            *scl = malloc((size_t)(n * k / 32));
    float *dec = malloc((size_t)k * sizeof(float));
    mt_status st = MT_OK;
    if (!stage || !pk || !scl || !dec)
        st = mt_fail(err, MT_E_NOMEM, "bench_ggml_moe: out of memory staging %zu bytes", nbytes);
    for (int64_t e = 0; e < s->E && st == MT_OK; e++) {
        if ((st = expert_quark(in, w, sc, e, n, k, pk, scl, err)) != MT_OK)
            break;
        for (int64_t r = 0; r < n; r++)
            row_to_ggml(pk + r * k / 2, scl + r * k / 32, k, stage + (size_t)(e * n + r) * row_g);
        if (e > 0)
            continue;
        /* The conversion against ggml's decode of the same rows. */
        const struct ggml_type_traits *tt = ggml_get_type_traits(GGML_TYPE_MXFP4);
        for (int64_t r = 0; r < 4 && st == MT_OK; r++) {
            tt->to_float(stage + (size_t)r * row_g, dec, k);
            for (int64_t i = 0; i < k; i++) {
                unsigned code = (pk[r * k / 2 + i / 2] >> (4 * (i & 1))) & 15;
                float want = mxfp4_e2m1_decode(code) * mxfp4_e8m0_decode(scl[r * k / 32 + i / 32]);
                if (dec[i] != want) {
                    st = mt_fail(err, MT_E_WRONG_RESULT,
                                 "bench_ggml_moe: ggml decodes weight row %lld element %lld "
                                 "as %g, moetune as %g: the MXFP4 block conversion is wrong",
                                 (long long)r, (long long)i, dec[i], want);
                    break;
                }
            }
        }
    }
    if (st == MT_OK)
        ggml_backend_tensor_set(t, stage, 0, nbytes);
    free(stage);
    free(pk);
    free(scl);
    free(dec);
    return st;
}

/* The CPU_REPACK buffer type of the cpu backend, or NULL without one. */
static ggml_backend_buffer_type_t repack_buft(void)
{
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev)
        return NULL;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get =
        (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
            reg, "ggml_backend_dev_get_extra_bufts");
    if (!get)
        return NULL;
    for (ggml_backend_buffer_type_t *b = get(dev); b && *b; b++)
        if (!strcmp(ggml_backend_buft_name(*b), "CPU_REPACK"))
            return *b;
    return NULL;
}

/* ---- one graph: out = mul_mat_id(w, act, ids) ------------------------------------ */

static void graph_free(ggml_side *s)
{
    if (s->gbuf)
        ggml_backend_buffer_free(s->gbuf);
    if (s->gctx)
        ggml_free(s->gctx);
    s->gbuf = NULL;
    s->gctx = NULL;
    s->graph = NULL;
}

/* Builds the graph of stage up/down at M tokens with the first M tokens'
 * inputs, and runs it once untimed (the backend sizes its work buffer). */
static mt_status graph_build(ggml_side *s, bool up, int64_t M, mt_err *err)
{
    if (s->graph && s->g_up == up && s->g_m == M)
        return MT_OK;
    graph_free(s);
    struct ggml_init_params ip = {.mem_size = 8 * ggml_tensor_overhead() + ggml_graph_overhead(),
                                  .mem_buffer = NULL, .no_alloc = true};
    if (!(s->gctx = ggml_init(ip)))
        return mt_fail(err, MT_E_NOMEM, "bench_ggml_moe: ggml_init failed");
    int64_t K = up ? s->H : s->I;
    /* Stage 1: one activation row per token, broadcast over its experts (as
     * llama.cpp's gate/up); stage 2: one row per (token, expert) pair. */
    s->act = ggml_new_tensor_3d(s->gctx, GGML_TYPE_F32, K, up ? 1 : s->topk, M);
    s->ids = ggml_new_tensor_2d(s->gctx, GGML_TYPE_I32, s->topk, M);
    s->out = ggml_mul_mat_id(s->gctx, up ? s->w_up : s->w_down, s->act, s->ids);
    s->graph = ggml_new_graph(s->gctx);
    ggml_build_forward_expand(s->graph, s->out);
    if (!(s->gbuf = ggml_backend_alloc_ctx_tensors_from_buft(s->gctx,
                                                             ggml_backend_cpu_buffer_type())))
        return mt_fail(err, MT_E_NOMEM, "bench_ggml_moe: allocating the graph's tensors failed");
    ggml_backend_tensor_set(s->act, up ? s->x : s->h, 0, ggml_nbytes(s->act));
    int32_t *ids = malloc((size_t)(M * s->topk) * sizeof(int32_t));
    if (!ids)
        return mt_fail(err, MT_E_NOMEM, "bench_ggml_moe: out of memory");
    for (int64_t q = 0; q < M * s->topk; q++)
        ids[q] = (int32_t)(q % s->topk);
    ggml_backend_tensor_set(s->ids, ids, 0, ggml_nbytes(s->ids));
    free(ids);
    s->g_up = up;
    s->g_m = M;
    if (ggml_backend_graph_compute(s->be, s->graph) != GGML_STATUS_SUCCESS)
        return mt_fail(err, MT_E_DEVICE, "bench_ggml_moe: ggml_backend_graph_compute failed");
    if (!s->poll)
        ggml_threadpool_pause(s->tp);
    return MT_OK;
}

/* Sets the routing and computes; *ms (if not NULL) gets the compute's wall
 * time. The pool is paused afterwards, outside the time, so its threads
 * sleep instead of polling while moetune runs, and resumed WARM_MS before
 * the timed compute, so its workers are polling when the call starts, as
 * between the graphs of llama.cpp's steady state (ggml's first step splits
 * the activations' quantization by thread and waits at a barrier, so a
 * worker still waking up stalls the call; moetune's pool hands out work
 * items dynamically and is timed from sleep). --cold leaves the pool paused
 * until the compute itself resumes it; --poll never pauses it, and its
 * polling then takes a core from moetune's calls. */
enum { WARM_US = 1000 };

static mt_status graph_run(ggml_side *s, const int32_t *ids, double *ms, mt_err *err)
{
    ggml_backend_tensor_set(s->ids, ids, 0, ggml_nbytes(s->ids));
    if (!s->poll && !s->cold) {
        ggml_threadpool_resume(s->tp);
        for (double w0 = mt_now_ms(); mt_now_ms() - w0 < WARM_US * 1e-3;)
            ;
    }
    double t0 = mt_now_ms();
    enum ggml_status gs = ggml_backend_graph_compute(s->be, s->graph);
    double t1 = mt_now_ms();
    if (!s->poll)
        ggml_threadpool_pause(s->tp);
    if (gs != GGML_STATUS_SUCCESS)
        return mt_fail(err, MT_E_DEVICE, "bench_ggml_moe: ggml_backend_graph_compute failed (%d)",
                       (int)gs);
    if (ms)
        *ms = t1 - t0;
    return MT_OK;
}

/* ---- the numeric check ------------------------------------------------------------ */

static double silu(double v) { return v / (1.0 + exp(-v)); }

/* Normalized error |a - b| / |b| over n values. */
static double rel_err(const float *a, const float *b, int64_t n)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* The weights of the experts ids uses ([E, n, k] on the device) copied
 * into packed[nu, n, k/2] / scales[nu, n, k/32] (caller frees), and
 * local[q] the index of ids[q]'s expert among them. */
static mt_status copy_used(const moe_bench_peer_inputs *in, const void *w, const void *sc,
                           int64_t n, int64_t k, const int32_t *ids, int64_t P, int32_t *local,
                           uint8_t **packed, uint8_t **scales, mt_err *err)
{
    int32_t used[CHECK_M * 32]; /* topk <= 32 */
    int nu = 0;
    for (int64_t q = 0; q < P; q++) {
        int u = 0;
        while (u < nu && used[u] != ids[q])
            u++;
        if (u == nu)
            used[nu++] = ids[q];
        local[q] = u;
    }
    *packed = malloc((size_t)(nu * n * k / 2));
    *scales = malloc((size_t)(nu * n * k / 32));
    if (!*packed || !*scales)
        return mt_fail(err, MT_E_NOMEM, "bench_ggml_moe: out of memory for the check");
    mt_status st = MT_OK;
    /* The references read Quark rows. */
    for (int u = 0; u < nu && st == MT_OK; u++)
        st = expert_quark(in, w, sc, used[u], n, k, *packed + u * n * k / 2,
                          *scales + u * n * k / 32, err);
    return st;
}

/* ggml's output of both stages on one small routing against moetune's
 * plain C references (kernels/moe_common.h) with unquantized bf16
 * activations, every CHECK_NSTEP-th output column; moetune's a4w4
 * reference (what its a4w4 kernels compute) against the same, for scale.
 * Fails when ggml's normalized error exceeds 0.03: its q8_0 activations
 * are off by about 0.4% per element, a wrong layout or a missing expert by
 * about 100%. */
static mt_status check(ggml_side *s, const moe_bench_peer_inputs *in, mt_err *err)
{
    int64_t M = CHECK_M < s->maxm ? CHECK_M : s->maxm, P = M * s->topk, H = s->H, I = s->I,
            E = s->E;
    int64_t nu = (2 * I + CHECK_NSTEP - 1) / CHECK_NSTEP, nd = (H + CHECK_NSTEP - 1) / CHECK_NSTEP;
    mt_rng r;
    mt_rng_seed(&r, s->seed);
    int32_t *ids = malloc((size_t)P * sizeof(int32_t)), *local = malloc((size_t)P * sizeof(int32_t));
    float *tw = malloc((size_t)P * sizeof(float)), *got = malloc((size_t)(P * H) * sizeof(float)),
          *ref = malloc((size_t)(P * H) * sizeof(float)),
          *ref4 = malloc((size_t)(P * H) * sizeof(float)),
          *g = malloc((size_t)(P * (nu > nd ? nu : nd)) * sizeof(float));
    uint16_t *x = malloc((size_t)(M * H) * 2), *h = malloc((size_t)(P * I) * 2),
             *href = malloc((size_t)(P * I) * 2), *href4 = malloc((size_t)(P * I) * 2);
    uint8_t *w13 = NULL, *s13 = NULL, *w2 = NULL, *s2 = NULL;
    mt_status st = MT_OK;
    if (!ids || !local || !tw || !got || !ref || !ref4 || !g || !x || !h || !href || !href4) {
        st = mt_fail(err, MT_E_NOMEM, "bench_ggml_moe: out of memory for the check");
        goto out;
    }
    moe_gen_ids(&r, M, (int)s->topk, (int)E, MOE_SKEW_UNIFORM, ids);
    for (int64_t q = 0; q < P; q++)
        tw[q] = 1.0f;
    for (int64_t i = 0; i < M * H; i++)
        x[i] = mt_f32_to_bf16(s->x[i]);
    for (int64_t i = 0; i < P * I; i++)
        h[i] = mt_f32_to_bf16(s->h[i]);
    if ((st = copy_used(in, in->w13, in->s13, 2 * I, H, ids, P, local, &w13, &s13, err)) !=
            MT_OK ||
        (st = copy_used(in, in->w2, in->s2, H, I, ids, P, local, &w2, &s2, err)) != MT_OK)
        goto out;
    moe_gemm_dims d = {.h = H, .i = I, .e = E, .topk = (int)s->topk};
    moe_gemm_dims d4 = d;
    d4.a4 = true;

    /* Stage 1: h = silu(gate) * up from ggml's [2I] rows per pair. */
    int64_t ws = 2 * I * H / 2, ss = 2 * I * H / 32;
    moe_up_ref(&d, x, local, w13, s13, w13 + I * H / 2, s13 + I * H / 32, ws, ss, 0, P,
               CHECK_NSTEP, href);
    moe_up_ref(&d4, x, local, w13, s13, w13 + I * H / 2, s13 + I * H / 32, ws, ss, 0, P,
               CHECK_NSTEP, href4);
    if ((st = graph_build(s, true, M, err)) != MT_OK || (st = graph_run(s, ids, NULL, err)) != MT_OK)
        goto out;
    ggml_backend_tensor_get(s->out, got, 0, (size_t)(P * 2 * I) * sizeof(float));
    int64_t n = 0;
    for (int64_t p = 0; p < P; p++)
        for (int64_t c = 0; c < I; c += CHECK_NSTEP, n++) {
            g[n] = mt_bf16_round((float)(silu(got[p * 2 * I + c]) * got[p * 2 * I + I + c]));
            ref[n] = mt_bf16_to_f32(href[p * I + c]);
            ref4[n] = mt_bf16_to_f32(href4[p * I + c]);
        }
    double e_up = rel_err(g, ref, n), e_up4 = rel_err(ref4, ref, n);

    /* Stage 2: rows [P, H] with weight 1. */
    moe_down_ref(&d, h, local, tw, w2, s2, 0, P, CHECK_NSTEP, ref, NULL);
    moe_down_ref(&d4, h, local, tw, w2, s2, 0, P, CHECK_NSTEP, ref4, NULL);
    if ((st = graph_build(s, false, M, err)) != MT_OK ||
        (st = graph_run(s, ids, NULL, err)) != MT_OK)
        goto out;
    ggml_backend_tensor_get(s->out, got, 0, (size_t)(P * H) * sizeof(float));
    n = 0;
    for (int64_t p = 0; p < P; p++)
        for (int64_t c = 0; c < H; c += CHECK_NSTEP, n++) {
            g[n] = got[p * H + c];
            ref[n] = ref[p * H + c];
            ref4[n] = ref4[p * H + c];
        }
    double e_dn = rel_err(g, ref, n), e_dn4 = rel_err(ref4, ref, n);
    fprintf(s->log,
            "bench_ggml_moe: check on %lld tokens (seed %llu), normalized error against "
            "moetune's bf16-activation reference: ggml (q8_0 activations) up %.4f, down %.4f; "
            "moetune's a4w4 reference up %.4f, down %.4f\n",
            (long long)M, (unsigned long long)s->seed, e_up, e_dn, e_up4, e_dn4);
    if (!(e_up < 0.03) || !(e_dn < 0.03))
        st = mt_fail(err, MT_E_WRONG_RESULT,
                     "bench_ggml_moe: ggml's mul_mat_id differs from moetune's reference "
                     "(normalized error up %.4f, down %.4f; limit 0.03): not the same product",
                     e_up, e_dn);
out:
    free(ids);
    free(tw);
    free(got);
    free(ref);
    free(ref4);
    free(g);
    free(x);
    free(h);
    free(href);
    free(href4);
    free(w13);
    free(s13);
    free(w2);
    free(s2);
    free(local);
    return st;
}

/* ---- the peer -------------------------------------------------------------------- */

static mt_status side_setup(void *ctx, const moe_bench_peer_inputs *in, mt_err *err)
{
    ggml_side *s = ctx;
    s->H = in->H;
    s->I = in->I;
    s->E = in->E;
    s->topk = in->topk;
    s->maxm = in->maxm;
    int64_t nx = in->maxm * in->H, nh = in->maxm * in->topk * in->I;
    uint16_t *tmp = malloc((size_t)(nx > nh ? nx : nh) * 2);
    s->x = malloc((size_t)nx * sizeof(float));
    s->h = malloc((size_t)nh * sizeof(float));
    if (!tmp || !s->x || !s->h) {
        free(tmp);
        return mt_fail(err, MT_E_NOMEM, "bench_ggml_moe: out of memory");
    }
    mt_status st = dev_copy_from(in->d, tmp, in->x, (size_t)nx * 2, err);
    for (int64_t i = 0; st == MT_OK && i < nx; i++)
        s->x[i] = mt_bf16_to_f32(tmp[i]);
    if (st == MT_OK)
        st = dev_copy_from(in->d, tmp, in->h, (size_t)nh * 2, err);
    for (int64_t i = 0; st == MT_OK && i < nh; i++)
        s->h[i] = mt_bf16_to_f32(tmp[i]);
    free(tmp);
    if (st != MT_OK)
        return st;

    if (!(s->be = ggml_backend_cpu_init()))
        return mt_fail(err, MT_E_DEVICE, "bench_ggml_moe: ggml_backend_cpu_init failed");
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(s->threads);
    if (!(s->tp = ggml_threadpool_new(&tpp)))
        return mt_fail(err, MT_E_DEVICE, "bench_ggml_moe: ggml_threadpool_new failed");
    ggml_backend_cpu_set_n_threads(s->be, s->threads);
    ggml_backend_cpu_set_threadpool(s->be, s->tp);

    ggml_backend_buffer_type_t buft = s->plain ? NULL : repack_buft();
    if (!s->plain && !buft)
        fprintf(s->log, "bench_ggml_moe: this ggml has no CPU_REPACK buffer type; "
                        "using the plain CPU buffer\n");
    if (!buft)
        buft = ggml_backend_cpu_buffer_type();
    struct ggml_init_params ip = {.mem_size = 4 * ggml_tensor_overhead(), .mem_buffer = NULL,
                                  .no_alloc = true};
    if (!(s->wctx = ggml_init(ip)))
        return mt_fail(err, MT_E_NOMEM, "bench_ggml_moe: ggml_init failed");
    s->w_up = ggml_new_tensor_3d(s->wctx, GGML_TYPE_MXFP4, s->H, 2 * s->I, s->E);
    s->w_down = ggml_new_tensor_3d(s->wctx, GGML_TYPE_MXFP4, s->I, s->H, s->E);
    if (!(s->wbuf = ggml_backend_alloc_ctx_tensors_from_buft(s->wctx, buft)))
        return mt_fail(err, MT_E_NOMEM, "bench_ggml_moe: allocating %s weights failed",
                       ggml_backend_buft_name(buft));
    /* Transparent huge pages for the weights, as moetune's cpu device asks
     * for its large allocations (ggml allocates with posix_memalign, which
     * Debian's THP "madvise" mode leaves on 4 KiB pages: a TLB miss per 4 KiB
     * of an expert's stream). Before the first touch, so the pages are huge
     * from the start. */
    if (!s->no_thp) {
        uintptr_t base = (uintptr_t)ggml_backend_buffer_get_base(s->wbuf), pg = 4096;
        uintptr_t lo = (base + pg - 1) & ~(pg - 1),
                  hi = (base + ggml_backend_buffer_get_size(s->wbuf)) & ~(pg - 1);
        if (hi > lo && madvise((void *)lo, hi - lo, MADV_HUGEPAGE) != 0)
            fprintf(s->log, "bench_ggml_moe: madvise(MADV_HUGEPAGE) on ggml's weights failed; "
                            "they stay on small pages\n");
    }
    if ((st = load_weights(s, in, in->w13, in->s13, 2 * s->I, s->H, s->w_up, err)) != MT_OK ||
        (st = load_weights(s, in, in->w2, in->s2, s->H, s->I, s->w_down, err)) != MT_OK)
        return st;
    /* The op must run on the buffer's own path: the cpu device says whether
     * one of its (extra) buffer types takes mul_mat_id on these weights. */
    ggml_backend_dev_t dev = ggml_backend_get_device(s->be);
    st = graph_build(s, true, 1, err);
    bool ok = st == MT_OK && ggml_backend_dev_supports_op(dev, s->out);
    fprintf(s->log,
            "bench_ggml_moe: ggml %s, weights in %s (%s), %d threads; cpu: AVX2 %d, AVX-512 %d, "
            "AVX-512 VNNI %d, AVX-VNNI %d; mul_mat_id on them supported: %s\n",
            ggml_version(), ggml_backend_buffer_name(s->wbuf),
            buft == ggml_backend_cpu_buffer_type() ? "plain path"
                                                   : "repack path: MXFP4 8x8 interleaved, q8_0",
            s->threads, ggml_cpu_has_avx2(), ggml_cpu_has_avx512(), ggml_cpu_has_avx512_vnni(),
            ggml_cpu_has_avx_vnni(), ok ? "yes" : "NO");
    if (st == MT_OK && !ok)
        st = mt_fail(err, MT_E_UNSUPPORTED,
                     "bench_ggml_moe: ggml's cpu device does not take mul_mat_id on %s weights",
                     ggml_backend_buffer_name(s->wbuf));
    if (st == MT_OK)
        st = check(s, in, err);
    return st;
}

static mt_status side_run(void *ctx, bool up, int64_t M, const int32_t *ids, double *ms,
                          mt_err *err)
{
    ggml_side *s = ctx;
    mt_status st = graph_build(s, up, M, err);
    return st == MT_OK ? graph_run(s, ids, ms, err) : st;
}

static void side_release(ggml_side *s)
{
    graph_free(s);
    if (s->wbuf)
        ggml_backend_buffer_free(s->wbuf);
    if (s->wctx)
        ggml_free(s->wctx);
    if (s->be)
        ggml_backend_free(s->be);
    if (s->tp)
        ggml_threadpool_free(s->tp);
    free(s->x);
    free(s->h);
}

/* ---- main ------------------------------------------------------------------------ */

static int usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [--shape glm5.2] [--m 1,16,256] [--device cpu] [--max-ms MS]\n"
            "          [--plain] [--poll|--cold] [--no-thp] [--sweep] [--flush] [--json]\n"
            "          [--no-limits] [--seed S]\n"
            "Times moetune's served expert GEMM stages (default configs; --sweep adds the\n"
            "cpu sweep) and ggml's mul_mat_id on the same MXFP4 weights, interleaved with\n"
            "the same fresh routing per round; --plain keeps ggml's weights in its plain\n"
            "CPU buffer instead of CPU_REPACK. ggml's pool is paused after each of its calls\n"
            "and resumed 1 ms before the next (outside the time); --cold: not resumed before\n"
            "(its workers wake inside the timed call); --poll: never paused. ggml's weights\n"
            "get transparent huge pages as moetune's do; --no-thp leaves them on the pages\n"
            "posix_memalign gives. --no-limits skips the bandwidth samples between rounds\n"
            "and the compute peaks (the fractions print 0; the ratios stay).\n",
            prog);
    return 2;
}

int main(int argc, char **argv)
{
    const char *shape = "glm5.2", *spec = "cpu", *mlist = "1,16,256";
    bool json = false, sweep = false, plain = false, flush = false, poll = false, cold = false;
    bool no_thp = false, no_limits = false;
    double max_ms = 0;
    uint64_t seed = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc)
            shape = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            spec = argv[++i];
        else if (!strcmp(argv[i], "--m") && i + 1 < argc)
            mlist = argv[++i];
        else if (!strcmp(argv[i], "--max-ms") && i + 1 < argc)
            max_ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--sweep"))
            sweep = true;
        else if (!strcmp(argv[i], "--plain"))
            plain = true;
        else if (!strcmp(argv[i], "--flush"))
            flush = true;
        else if (!strcmp(argv[i], "--poll"))
            poll = true;
        else if (!strcmp(argv[i], "--cold"))
            cold = true;
        else if (!strcmp(argv[i], "--no-thp"))
            no_thp = true;
        else if (!strcmp(argv[i], "--no-limits"))
            no_limits = true;
        else
            return usage(argv[0]);
    }
    int64_t ms[32];
    int n = 0;
    for (const char *p = mlist; *p;) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 1 || n == 32 || (*end && *end != ',')) {
            fprintf(stderr, "bench_ggml_moe: --m %s: expected up to 32 token counts >= 1, "
                            "comma-separated\n", mlist);
            return 2;
        }
        ms[n++] = v;
        p = *end ? end + 1 : end;
    }
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    if (dev_open(spec, NULL, &d, &err) != MT_OK) {
        fprintf(stderr, "bench_ggml_moe: %s\n", err.msg);
        return 1;
    }
    const dev_props *props = dev_get_props(d);
    if (props->backend != DEV_BACKEND_CPU) {
        fprintf(stderr, "bench_ggml_moe: --device %s: ggml's side runs on this CPU, so "
                        "moetune's must too (a cpu device)\n", spec);
        dev_close(d);
        return 2;
    }
    if (!seed)
        seed = mt_seed_fresh();
    fprintf(stderr, "bench_ggml_moe: seed %llu\n", (unsigned long long)seed);
    ggml_side side = {.threads = props->compute_units > 0 ? props->compute_units : 1,
                      .plain = plain, .poll = poll, .cold = cold, .no_thp = no_thp, .seed = seed, .log = stderr};
    moe_bench_peer peer = {.name = "ggml", .ctx = &side, .setup = side_setup, .run = side_run};
    moe_bench_opts o = {.shape = shape, .family = "moe_gemm", .ms = ms, .n_ms = n,
                        .sweep = sweep, .json = json, .flush = flush, .max_ms = max_ms,
                        .seed = seed, .peer = &peer, .no_limits = no_limits};
    mt_status st = moe_bench_run(d, &o, stdout, &err);
    if (st != MT_OK)
        fprintf(stderr, "bench_ggml_moe: %s\n", err.msg);
    side_release(&side);
    dev_close(d);
    return st == MT_OK ? 0 : 1;
}
