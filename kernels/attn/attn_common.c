/* attn_common.c: cache encoding, RoPE table and double-precision references
 * shared by the attention families (see attn_common.h). */
#include "attn_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"

/* ---- cache elements ------------------------------------------------------- */

float attn_softmax_scale(int64_t sm_bits, int64_t d, int64_t r)
{
    if (sm_bits) {
        uint32_t bits = (uint32_t)sm_bits;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    return (float)(1.0 / sqrt((double)(d + r)));
}

size_t attn_kv_esize(kern_dtype t) { return t == KERN_DT_FP8E4M3 ? 1 : 2; }

bool attn_kv_dtype_ok(kern_dtype t) { return t == KERN_DT_BF16 || t == KERN_DT_FP8E4M3; }

float attn_kv_load(kern_dtype t, const void *base, size_t i, float scale)
{
    if (t == KERN_DT_FP8E4M3)
        return mt_fp8e4m3_to_f32(((const uint8_t *)base)[i]) * scale;
    return mt_bf16_to_f32(((const uint16_t *)base)[i]) * scale;
}

void attn_kv_store(kern_dtype t, void *base, size_t i, float v, float scale)
{
    if (t == KERN_DT_FP8E4M3)
        ((uint8_t *)base)[i] = mt_f32_to_fp8e4m3(v / scale);
    else
        ((uint16_t *)base)[i] = mt_f32_to_bf16(v / scale);
}

/* ---- RoPE ---------------------------------------------------------------- */

void attn_rope_table(double theta, int r, int64_t npos, float *cos_sin)
{
    int half = r / 2;
    for (int64_t p = 0; p < npos; p++)
        for (int i = 0; i < half; i++) {
            double f = pow(theta, -2.0 * i / (double)r);
            double a = (double)p * f;
            cos_sin[p * r + i] = (float)cos(a);
            cos_sin[p * r + half + i] = (float)sin(a);
        }
}

void attn_rope_rotate(double *x, int r, const float *cs_row)
{
    int half = r / 2;
    for (int i = 0; i < half; i++) {
        double c = cs_row[i], s = cs_row[half + i];
        double a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = b * c + a * s;
    }
}

/* ---- references -------------------------------------------------------------- */

void attn_ref_decode(const attn_decode_args *a)
{
    int64_t w = a->l + a->r;
    double *q = malloc(sizeof(double) * (size_t)w);
    double *kv = malloc(sizeof(double) * (size_t)w);
    double *acc = malloc(sizeof(double) * (size_t)a->l);
    for (int64_t m = 0; m < a->m; m++) {
        int64_t len = a->ctx_len[m];
        int64_t n_items_max = a->sel ? a->topk : len;
        const int32_t *tbl = a->table + (size_t)a->qseq[m] * (size_t)a->max_pages;
        for (int64_t h = 0; h < a->h; h++) {
            const uint16_t *qr = a->q + ((size_t)m * (size_t)a->h + (size_t)h) * (size_t)w;
            for (int64_t i = 0; i < w; i++)
                q[i] = mt_bf16_to_f32(qr[i]);
            /* Two passes: the maximum, then the weighted sum. */
            double mx = -INFINITY;
            for (int pass = 0; pass < 2; pass++) {
                double sum = 0;
                memset(acc, 0, sizeof(double) * (size_t)a->l);
                for (int64_t it = 0; it < n_items_max; it++) {
                    int64_t t = a->sel ? a->sel[m * a->topk + it] : it;
                    if (t < 0 || t >= len)
                        continue;
                    size_t e0 = attn_page_elem(tbl, a->ps, w, t);
                    double s = 0;
                    for (int64_t i = 0; i < w; i++) {
                        kv[i] = attn_kv_load(a->kv, a->pool, e0 + (size_t)i, a->kscale);
                        s += q[i] * kv[i];
                    }
                    s *= a->scale;
                    if (pass == 0) {
                        if (s > mx)
                            mx = s;
                        continue;
                    }
                    double p = exp(s - mx);
                    sum += p;
                    for (int64_t i = 0; i < a->l; i++)
                        acc[i] += p * kv[i];
                }
                if (pass == 1) {
                    float *o = a->out + ((size_t)m * (size_t)a->h + (size_t)h) * (size_t)a->l;
                    for (int64_t i = 0; i < a->l; i++)
                        o[i] = sum > 0 ? (float)(acc[i] / sum) : 0.0f;
                }
            }
        }
    }
    free(q);
    free(kv);
    free(acc);
}

void attn_ref_prefill(const attn_prefill_args *a)
{
    int64_t t_all = a->p + a->m, w = a->l + a->r, dq = a->d + a->r, hr = a->d + a->v;
    /* Expanded keys and values of every context token, rounded to bf16. */
    size_t nk = (size_t)t_all * (size_t)a->h;
    double *kn = malloc(sizeof(double) * nk * (size_t)a->d);
    double *vv = malloc(sizeof(double) * nk * (size_t)a->v);
    double *kr = malloc(sizeof(double) * (size_t)t_all * (size_t)a->r);
    double *c = malloc(sizeof(double) * (size_t)a->l);
    for (int64_t t = 0; t < t_all; t++) {
        size_t e0 = attn_page_elem(a->table, a->ps, w, t);
        for (int64_t i = 0; i < a->l; i++)
            c[i] = attn_kv_load(a->kv, a->pool, e0 + (size_t)i, a->kscale);
        for (int64_t i = 0; i < a->r; i++)
            kr[t * a->r + i] = attn_kv_load(a->kv, a->pool, e0 + (size_t)(a->l + i), a->kscale);
        for (int64_t h = 0; h < a->h; h++)
            for (int64_t row = 0; row < hr; row++) {
                const uint16_t *wr = a->wkv + ((size_t)h * (size_t)hr + (size_t)row) * (size_t)a->l;
                double s = 0;
                for (int64_t i = 0; i < a->l; i++)
                    s += (double)mt_bf16_to_f32(wr[i]) * c[i];
                double r = mt_bf16_round((float)s);
                size_t kvi = (size_t)t * (size_t)a->h + (size_t)h;
                if (row < a->d)
                    kn[kvi * (size_t)a->d + (size_t)row] = r;
                else
                    vv[kvi * (size_t)a->v + (size_t)(row - a->d)] = r;
            }
    }
    double scale = a->scale ? a->scale : 1.0 / sqrt((double)dq);
    double *s = malloc(sizeof(double) * (size_t)t_all);
    double *o = malloc(sizeof(double) * (size_t)a->v);
    for (int64_t i = 0; i < a->m; i++)
        for (int64_t h = 0; h < a->h; h++) {
            const uint16_t *qr = a->q + ((size_t)i * (size_t)a->h + (size_t)h) * (size_t)dq;
            int64_t n = a->p + i + 1;
            double mx = -INFINITY;
            for (int64_t t = 0; t < n; t++) {
                size_t kvi = (size_t)t * (size_t)a->h + (size_t)h;
                double acc = 0;
                for (int64_t j = 0; j < a->d; j++)
                    acc += (double)mt_bf16_to_f32(qr[j]) * kn[kvi * (size_t)a->d + (size_t)j];
                for (int64_t j = 0; j < a->r; j++)
                    acc += (double)mt_bf16_to_f32(qr[a->d + j]) * kr[t * a->r + j];
                s[t] = acc * scale;
                if (s[t] > mx)
                    mx = s[t];
            }
            double sum = 0;
            memset(o, 0, sizeof(double) * (size_t)a->v);
            for (int64_t t = 0; t < n; t++) {
                double p = exp(s[t] - mx);
                sum += p;
                const double *vr = vv + ((size_t)t * (size_t)a->h + (size_t)h) * (size_t)a->v;
                for (int64_t j = 0; j < a->v; j++)
                    o[j] += p * vr[j];
            }
            uint16_t *out = a->out + ((size_t)i * (size_t)a->h + (size_t)h) * (size_t)a->v;
            for (int64_t j = 0; j < a->v; j++)
                out[j] = mt_f32_to_bf16((float)(o[j] / sum));
        }
    free(kn);
    free(vv);
    free(kr);
    free(c);
    free(s);
    free(o);
}

void attn_ref_index_scores(const attn_index_args *a, int64_t qi, double *out)
{
    int64_t len = a->ctx_len[qi];
    const int32_t *tbl = a->table + (size_t)a->qseq[qi] * (size_t)a->max_pages;
    double *k = malloc(sizeof(double) * (size_t)a->id);
    double sq = 1.0 / sqrt((double)a->id), sh = 1.0 / sqrt((double)a->ih);
    for (int64_t t = 0; t < len; t++) {
        size_t e0 = attn_page_elem(tbl, a->ps, a->id, t);
        for (int64_t i = 0; i < a->id; i++)
            k[i] = attn_kv_load(a->kv, a->pool, e0 + (size_t)i, a->kscale);
        double score = 0;
        for (int64_t h = 0; h < a->ih; h++) {
            const uint16_t *qr = a->q + ((size_t)qi * (size_t)a->ih + (size_t)h) * (size_t)a->id;
            double dot = 0;
            for (int64_t i = 0; i < a->id; i++)
                dot += (double)mt_bf16_to_f32(qr[i]) * k[i];
            dot *= sq;
            if (dot > 0)
                score += (double)a->w[qi * a->ih + h] * dot;
        }
        out[t] = score * sh;
    }
    free(k);
}

/* Descending order for attn_ref_topk. */
static int cmp_desc(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a > b ? -1 : a < b ? 1 : 0;
}

int64_t attn_ref_topk(const double *score, int64_t n, int64_t k, int32_t *idx)
{
    int64_t keep = n < k ? n : k;
    for (int64_t i = 0; i < k; i++)
        idx[i] = -1;
    if (keep <= 0)
        return 0;
    /* The keep-th largest value, then everything above it plus the lowest
     * indices among those equal to it. */
    double *sorted = malloc(sizeof(double) * (size_t)n);
    memcpy(sorted, score, sizeof(double) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(double), cmp_desc);
    double thr = sorted[keep - 1];
    int64_t above = 0;
    for (int64_t i = 0; i < n; i++)
        above += score[i] > thr;
    int64_t ties = keep - above, out = 0;
    for (int64_t i = 0; i < n; i++) {
        bool take = score[i] > thr || (score[i] == thr && ties > 0);
        if (score[i] == thr && take)
            ties--;
        if (take)
            idx[out++] = (int32_t)i;
    }
    free(sorted);
    return out;
}

/* ---- problem pieces ---------------------------------------------------------- */

void attn_fill_table(mt_rng *r, int32_t *table, int64_t n_rows, int64_t max_pages,
                     int64_t n_pages)
{
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_pages);
    for (int64_t row = 0; row < n_rows; row++) {
        for (int64_t i = 0; i < n_pages; i++)
            perm[i] = (int32_t)i;
        for (int64_t i = 0; i < max_pages; i++) {
            int64_t j = i + (int64_t)mt_rng_below(r, (uint64_t)(n_pages - i));
            int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
            table[row * max_pages + i] = perm[i];
        }
    }
    free(perm);
}

void attn_fill_pool(mt_rng *r, void *pool, kern_dtype t, size_t n, float sd, float scale)
{
    for (size_t i = 0; i < n; i++)
        attn_kv_store(t, pool, i, mt_rng_normal(r) * sd, scale);
}

void attn_fill_bf16(mt_rng *r, uint16_t *x, size_t n, float sd)
{
    for (size_t i = 0; i < n; i++)
        x[i] = mt_f32_to_bf16(mt_rng_normal(r) * sd);
}

attn_paged attn_paged_of(int64_t m, int64_t c, int64_t ps)
{
    attn_paged g = {.n_seq = (m + 1) / 2, .max_pages = (c + ps - 1) / ps};
    g.n_pages = g.n_seq * g.max_pages + 3;
    return g;
}

int64_t attn_ctx_of(int64_t c, int64_t m, int64_t i)
{
    int64_t n = c - (m - 1 - i);
    return n < 1 ? 1 : n;
}

bool attn_last_of_row(int64_t m, int64_t i)
{
    int64_t n_seq = (m + 1) / 2;
    return i + 1 == m || (i + 1) * n_seq / m != i * n_seq / m;
}

void attn_fill_queries(int32_t *qseq, int32_t *ctx_len, int64_t m, int64_t c)
{
    int64_t n_seq = (m + 1) / 2;
    for (int64_t i = 0; i < m; i++) {
        qseq[i] = (int32_t)(i * n_seq / m);
        ctx_len[i] = (int32_t)attn_ctx_of(c, m, i);
    }
}

/* ---- pieces of the families' code ----------------------------------------- */

bool attn_kv_shape_ok(int64_t kv, char *why, size_t cap)
{
    if (attn_kv_dtype_ok((kern_dtype)kv))
        return true;
    snprintf(why, cap, "kv=%s: the cache holds bf16 or fp8", kern_dtype_name((kern_dtype)kv));
    return false;
}

void attn_cache_bufs(kern_buf_desc *out, const char *name, kern_dtype kv, size_t elems,
                     size_t table_entries)
{
    out[0] = (kern_buf_desc){name, KERN_BUF_IN, kv, elems * attn_kv_esize(kv), 0, 0, 0};
    out[1] = (kern_buf_desc){"kscale", KERN_BUF_IN, KERN_DT_F32, 4, 0, 0, 0};
    out[2] = (kern_buf_desc){"table", KERN_BUF_IN, KERN_DT_I32, table_entries * 4, 0, 0, 0};
}

void attn_query_bufs(kern_buf_desc *out, int64_t m)
{
    out[0] = (kern_buf_desc){"qseq", KERN_BUF_IN, KERN_DT_I32, (size_t)m * 4, 0, 0, 0};
    out[1] = (kern_buf_desc){"ctx_len", KERN_BUF_IN, KERN_DT_I32, (size_t)m * 4, 0, 0, 0};
}

int attn_define(dev_define *out, char (*buf)[64], int n, const char *name, long long v)
{
    snprintf(buf[n], 64, "%lld", v);
    out[n] = (dev_define){name, buf[n]};
    return n + 1;
}

int attn_mla_defines(dev_define *out, char (*buf)[64], kern_dtype kv, int nt, int64_t acc)
{
    int n = attn_define(out, buf, 0, "KV_FP8", kv == KERN_DT_FP8E4M3);
    n = attn_define(out, buf, n, "NT", nt);
    return attn_define(out, buf, n, "NACC", (acc + nt - 1) / nt);
}

mt_status attn_get_kernels(const kern_ctx *c, const char *name0, const char *sig0,
                           dev_kernel **k0, const char *name1, const char *sig1,
                           dev_kernel **k1, mt_err *err)
{
    mt_status st = kern_get(c, name0, sig0, k0, err);
    if (st == MT_OK)
        st = kern_get(c, name1, sig1, k1, err);
    return st;
}
