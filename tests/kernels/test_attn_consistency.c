/* test_attn_consistency.c: decoding token by token gives the outputs of
 * prefilling the same tokens. One sequence lives in the paged KV cache
 * (kvcache.h): P cached tokens plus N new ones. mla_prefill computes the N
 * outputs in one call (keys and values expanded through kv_b); mla_decode
 * computes them from absorbed queries (W_UK^T q_nope, on the host here as
 * the runtime's batched GEMM would) one token at a time with growing
 * context, then all N in one batched call, then sparse with the selection
 * the dsa_indexer kernel returns (topk >= context: everything visible), and
 * W_UV maps the latent outputs back. All must agree with the prefill
 * outputs up to bf16 rounding of the two paths. Runs on cpu and emu. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/attn/attn_common.h"
#include "kernels/core/exec.h"
#include "model/kvcache.h"

extern const kern_family fam_mla_prefill, fam_mla_decode, fam_dsa_indexer;

enum { H = 4, L = 32, R = 16, D = 32, V = 32, PS = 5, P = 7, N = 6, T = P + N,
       IH = 2, ID = 32, TOPK = 16, MAXP = (T + PS - 1) / PS, W = L + R };

typedef struct fixture {
    dev_device *dev;
    kvc_cache *kv;
    kvc_seq *seq;
    kern_dtype dt;
    uint64_t seed;
    uint16_t q[N * H * (D + R)], wkv[H * (D + V) * L], qa[N * H * W];
    void *d_table;
} fixture;

static void *upload(fixture *f, const void *src, size_t bytes)
{
    void *p = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_alloc(f->dev, bytes, &p, &err), MT_OK, "%s", err.msg);
    if (src)
        cr_assert_eq(dev_copy_to(f->dev, p, src, bytes, &err), MT_OK, "%s", err.msg);
    return p;
}

static void setup(fixture *f, const char *spec, kern_dtype dt)
{
    mt_err err = MT_ERR_INIT;
    dev_open_opts o = {.threads = 2};
    cr_assert_eq(dev_open(spec, &o, &f->dev, &err), MT_OK, "%s: %s", spec, err.msg);
    f->dt = dt;
    f->seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, f->seed);
    kvc_opts ko = {.page_size = PS, .n_pages = 2 * MAXP + 1, .latent = L, .rope = R,
                   .index_dim = ID, .dtype = dt, .scale = dt == KERN_DT_FP8E4M3 ? 0.375f : 0};
    cr_assert_eq(kvc_create(f->dev, &ko, &f->kv, &err), MT_OK, "%s", err.msg);
    /* A first sequence takes the low pages, so ours is not laid out 0, 1, 2. */
    kvc_seq *other;
    cr_assert_eq(kvc_seq_create(f->kv, &other, NULL), MT_OK);
    float rows[T * W], idx[T * ID];
    for (int i = 0; i < T * W; i++)
        rows[i] = mt_rng_normal(&r);
    for (int i = 0; i < T * ID; i++)
        idx[i] = mt_rng_normal(&r);
    cr_assert_eq(kvc_seq_append(f->kv, other, 2, rows, idx, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(kvc_seq_create(f->kv, &f->seq, NULL), MT_OK);
    /* Prefix first, then the chunk, as a runtime appends them. */
    cr_assert_eq(kvc_seq_append(f->kv, f->seq, P, rows, idx, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(kvc_seq_append(f->kv, f->seq, N, rows + P * W, idx + P * ID, &err), MT_OK,
                 "%s", err.msg);
    kvc_seq_destroy(f->kv, other);
    f->d_table = upload(f, NULL, MAXP * 4);
    cr_assert_eq(kvc_table_upload(f->kv, &f->seq, 1, MAXP, f->d_table, &err), MT_OK, "%s",
                 err.msg);
    attn_fill_bf16(&r, f->q, sizeof f->q / 2, 1.5f);
    attn_fill_bf16(&r, f->wkv, sizeof f->wkv / 2, (float)(1.0 / sqrt(L)));
    /* Absorbed queries: [W_UK[h]^T q_nope | q_rope], rounded to bf16. */
    for (int i = 0; i < N; i++)
        for (int h = 0; h < H; h++) {
            const uint16_t *qr = f->q + (i * H + h) * (D + R);
            uint16_t *out = f->qa + (i * H + h) * W;
            for (int l = 0; l < L; l++) {
                double s = 0;
                for (int d = 0; d < D; d++)
                    s += (double)mt_bf16_to_f32(qr[d]) *
                         mt_bf16_to_f32(f->wkv[((size_t)h * (D + V) + d) * L + l]);
                out[l] = mt_f32_to_bf16((float)s);
            }
            for (int j = 0; j < R; j++)
                out[L + j] = qr[D + j];
        }
}

/* One call through the executor, waited for. */
static mt_status run_sync(kern_exec *e, const kern_shape *s, int64_t m, void *const *bufs,
                          mt_err *err)
{
    mt_status st = kern_exec_run(e, s, m, bufs, err);
    return st == MT_OK ? dev_synchronize(kern_exec_device(e), err) : st;
}

static void teardown(fixture *f)
{
    dev_free(f->dev, f->d_table);
    kvc_destroy(f->kv);
    dev_close(f->dev);
}

static kern_exec *open_exec(fixture *f, const kern_family *fam, const char *key, int64_t m,
                            kern_shape *s)
{
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_shape_parse(fam, key, s, NULL, &err), MT_OK, "%s", err.msg);
    kern_exec *e = NULL;
    cr_assert_eq(kern_exec_open(f->dev, fam, s, m, NULL, &e, &err), MT_OK, "%s", err.msg);
    return e;
}

static const char *kvname(const fixture *f) { return kern_dtype_name(f->dt); }

static void prefill(fixture *f, float *out)
{
    char key[256];
    snprintf(key, sizeof key, "H=%d,L=%d,R=%d,D=%d,V=%d,ps=%d,kv=%s,P=%d", H, L, R, D, V, PS,
             kvname(f), P);
    kern_shape s;
    kern_exec *e = open_exec(f, &fam_mla_prefill, key, N, &s);
    void *dq = upload(f, f->q, sizeof f->q), *dw = upload(f, f->wkv, sizeof f->wkv);
    void *dout = upload(f, NULL, N * H * V * 2);
    void *bufs[] = {dq, kvc_latent_pool(f->kv), kvc_latent_scale(f->kv), f->d_table, dw, dout};
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(run_sync(e, &s, N, bufs, &err), MT_OK, "%s", err.msg);
    uint16_t o[N * H * V];
    cr_assert_eq(dev_copy_from(f->dev, o, dout, sizeof o, NULL), MT_OK);
    for (int i = 0; i < N * H * V; i++)
        out[i] = mt_bf16_to_f32(o[i]);
    dev_free(f->dev, dq);
    dev_free(f->dev, dw);
    dev_free(f->dev, dout);
    kern_exec_close(e);
}

/* Decodes queries [first, first + m) with ctx_len P+i+1 each, all on the
 * sequence's row; sel (device, [m][TOPK]) makes it sparse. Latent outputs
 * are mapped through W_UV into out[first..]. */
static void decode(fixture *f, kern_exec *e, kern_shape *s, int first, int m, void *sel,
                   float *out)
{
    int32_t qseq[N] = {0}, ctx[N];
    for (int i = 0; i < m; i++)
        ctx[i] = P + first + i + 1;
    void *dq = upload(f, f->qa + first * H * W, (size_t)m * H * W * 2);
    void *dqs = upload(f, qseq, (size_t)m * 4), *dctx = upload(f, ctx, (size_t)m * 4);
    void *dsel = sel ? sel : upload(f, qseq, 4);
    void *dout = upload(f, NULL, (size_t)m * H * L * 4);
    void *bufs[] = {dq, kvc_latent_pool(f->kv), kvc_latent_scale(f->kv), f->d_table,
                    dqs, dctx, dsel, dout};
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(run_sync(e, s, m, bufs, &err), MT_OK, "%s", err.msg);
    float o[N * H * L];
    cr_assert_eq(dev_copy_from(f->dev, o, dout, (size_t)m * H * L * 4, NULL), MT_OK);
    for (int i = 0; i < m; i++)
        for (int h = 0; h < H; h++)
            for (int v = 0; v < V; v++) {
                double acc = 0;
                for (int l = 0; l < L; l++)
                    acc += (double)mt_bf16_to_f32(f->wkv[((size_t)h * (D + V) + D + v) * L + l]) *
                           o[(i * H + h) * L + l];
                out[((first + i) * H + h) * V + v] = (float)acc;
            }
    dev_free(f->dev, dq);
    dev_free(f->dev, dqs);
    dev_free(f->dev, dctx);
    if (!sel)
        dev_free(f->dev, dsel);
    dev_free(f->dev, dout);
}

/* The indexer's selection for the N new tokens (device [N][TOPK]). */
static void *index_select(fixture *f)
{
    char key[256];
    snprintf(key, sizeof key, "IH=%d,ID=%d,topk=%d,ps=%d,kv=%s,C=%d", IH, ID, TOPK, PS,
             kvname(f), T);
    kern_shape s;
    kern_exec *e = open_exec(f, &fam_dsa_indexer, key, N, &s);
    mt_rng r;
    mt_rng_seed(&r, f->seed + 1);
    uint16_t q[N * IH * ID];
    float w[N * IH];
    attn_fill_bf16(&r, q, N * IH * ID, 1.0f);
    for (int i = 0; i < N * IH; i++)
        w[i] = mt_rng_normal(&r);
    int32_t qseq[N] = {0}, ctx[N];
    for (int i = 0; i < N; i++)
        ctx[i] = P + i + 1;
    void *dq = upload(f, q, sizeof q), *dw = upload(f, w, sizeof w);
    void *dqs = upload(f, qseq, sizeof qseq), *dctx = upload(f, ctx, sizeof ctx);
    void *didx = upload(f, NULL, N * TOPK * 4), *dval = upload(f, NULL, N * TOPK * 4);
    void *bufs[] = {dq, dw, kvc_index_pool(f->kv), kvc_index_scale(f->kv), f->d_table,
                    dqs, dctx, didx, dval};
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(run_sync(e, &s, N, bufs, &err), MT_OK, "%s", err.msg);
    int32_t idx[N * TOPK];
    cr_assert_eq(dev_copy_from(f->dev, idx, didx, sizeof idx, NULL), MT_OK);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < TOPK; j++)
            cr_assert_eq(idx[i * TOPK + j], j < ctx[i] ? j : -1,
                         "context <= topk keeps every visible token, in order");
    dev_free(f->dev, dq);
    dev_free(f->dev, dw);
    dev_free(f->dev, dqs);
    dev_free(f->dev, dctx);
    dev_free(f->dev, dval);
    kern_exec_close(e);
    return didx;
}

/* Both paths round to bf16 in different places (expanded k/v and the
 * output vs the absorbed query); a token too many or too few moves an
 * output by a share of its value (1/13 or more here), far above this. */
static void expect_close(const fixture *f, const char *what, const float *want,
                         const float *got)
{
    double worst = 0, ss = 0, se = 0, amax = 0;
    for (int i = 0; i < N * H * V; i++)
        amax = fmax(amax, fabs(want[i]));
    for (int i = 0; i < N * H * V; i++) {
        double e = fabs((double)got[i] - want[i]);
        worst = fmax(worst, e);
        ss += (double)want[i] * want[i];
        se += e * e;
    }
    double rel = sqrt(se / ss);
    cr_expect(worst <= 0.03 * amax && rel <= 0.01,
              "%s (%s cache, seed %" PRIu64 "): max error %.4g of max |out| %.4g, relative "
              "L2 error %.4g", what, kern_dtype_name(f->dt), f->seed, worst, amax, rel);
}

static void consistency(const char *spec, kern_dtype dt)
{
    fixture f = {0};
    setup(&f, spec, dt);
    float want[N * H * V], got[N * H * V];
    prefill(&f, want);

    char key[256];
    snprintf(key, sizeof key, "H=%d,L=%d,R=%d,D=%d,topk=%d,ps=%d,kv=%s,sparse=0,C=%d", H, L,
             R, D, TOPK, PS, kvname(&f), T);
    kern_shape s;
    kern_exec *e = open_exec(&f, &fam_mla_decode, key, 1, &s);
    for (int i = 0; i < N; i++) {
        kern_shape si = s;
        si.v[fam_mla_decode.n_dims - 1] = P + i + 1; /* C: this token's context */
        decode(&f, e, &si, i, 1, NULL, got);
    }
    expect_close(&f, "token-by-token decode", want, got);
    decode(&f, e, &s, 0, N, NULL, got);
    expect_close(&f, "batched decode", want, got);
    kern_exec_close(e);

    snprintf(key, sizeof key, "H=%d,L=%d,R=%d,D=%d,topk=%d,ps=%d,kv=%s,sparse=1,C=%d", H, L,
             R, D, TOPK, PS, kvname(&f), T);
    e = open_exec(&f, &fam_mla_decode, key, N, &s);
    void *sel = index_select(&f);
    decode(&f, e, &s, 0, N, sel, got);
    expect_close(&f, "sparse decode on the indexer's selection", want, got);
    dev_free(f.dev, sel);
    kern_exec_close(e);
    teardown(&f);
}

Test(attn_consistency, decode_matches_prefill_cpu_bf16) { consistency("cpu", KERN_DT_BF16); }
Test(attn_consistency, decode_matches_prefill_cpu_fp8) { consistency("cpu", KERN_DT_FP8E4M3); }
Test(attn_consistency, decode_matches_prefill_emu_bf16) { consistency("emu", KERN_DT_BF16); }
Test(attn_consistency, decode_matches_prefill_emu32_fp8)
{
    consistency("emu:wave32", KERN_DT_FP8E4M3);
}
