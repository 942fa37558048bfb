/* fam_ops_kv_store.c: the `ops_kv_store` family: writes new tokens into a
 * paged KV pool (model/kvcache.h): pool row rows[m] receives a[m] (W1 bf16
 * values) followed by b[m] (W2 bf16 values; W2 may be 0), each divided by
 * the cache scale and encoded as the cache's element type (bf16, or fp8
 * e4m3 rounded to nearest even and saturated at +-448, exactly as
 * attn_kv_store). Other rows are left as they were. The runtime stores the
 * normalized latent + rotated rope key, and the indexer key, with it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/attn/attn_common.h"
#include "kernels/core/family.h"
#include "kernels/core/rows.h"

enum { D_W1, D_W2, D_KV, D_P, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_W1] = {"W1", KERN_DIM_INT, false, 1, 8192, "values from a per token"},
    [D_W2] = {"W2", KERN_DIM_INT, false, 0, 8192, "values from b per token (0: none)"},
    [D_KV] = {"kv", KERN_DIM_DTYPE, false, 0, 0, "cache element type: bf16 or fp8"},
    [D_P] = {"P", KERN_DIM_INT, true, 1, 1 << 26, "rows in the pool"},
};

static const kern_preset presets[] = {
    {"glm5.2", "W1=512,W2=64,kv=bf16,P=4096"},
    {"tiny", "W1=32,W2=16,kv=bf16,P=64"},
    {"glm5.2-fp8", "W1=512,W2=64,kv=fp8,P=4096"},
    {"tiny-index", "W1=32,W2=0,kv=fp8,P=64"},
};

enum { B_A, B_B, B_ROWS, B_POOL, B_SCALE, B_COUNT };

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    if (!attn_kv_dtype_ok((kern_dtype)s->v[D_KV])) {
        snprintf(why, cap, "kv=%s: the cache holds bf16 or fp8",
                 kern_dtype_name((kern_dtype)s->v[D_KV]));
        return false;
    }
    if (m > s->v[D_P]) {
        snprintf(why, cap, "%lld tokens do not fit a pool of %lld rows", (long long)m,
                 (long long)s->v[D_P]);
        return false;
    }
    return true;
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return -1;
    size_t um = (size_t)m, w = (size_t)(s->v[D_W1] + s->v[D_W2]);
    kern_dtype kv = (kern_dtype)s->v[D_KV];
    out[B_A] = (kern_buf_desc){"a", KERN_BUF_IN, KERN_DT_BF16, um * (size_t)s->v[D_W1] * 2, 0, 0, 0};
    out[B_B] = (kern_buf_desc){"b", KERN_BUF_IN, KERN_DT_BF16,
                               s->v[D_W2] ? um * (size_t)s->v[D_W2] * 2 : 2, 0, 0, 0};
    out[B_ROWS] = (kern_buf_desc){"rows", KERN_BUF_IN, KERN_DT_I32, um * 4, 0, 0, 0};
    /* Encoding is exact: compared byte for byte. */
    out[B_POOL] = (kern_buf_desc){"pool", KERN_BUF_INOUT, kv == KERN_DT_FP8E4M3 ? KERN_DT_U8 : kv,
                                  (size_t)s->v[D_P] * w * attn_kv_esize(kv), (int64_t)w, 0, 0};
    out[B_SCALE] = (kern_buf_desc){"scale", KERN_BUF_IN, KERN_DT_F32, 4, 0, 0, 0};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    kern_dtype kv = (kern_dtype)s->v[D_KV];
    float scale = kv == KERN_DT_FP8E4M3 ? 0.5f : 1.0f;
    uint16_t *a = host[B_A], *b = host[B_B];
    /* Wide range: fp8 subnormals, normals and saturation all occur. */
    for (int64_t i = 0; i < m * s->v[D_W1]; i++)
        a[i] = mt_f32_to_bf16(mt_rng_normal(&r) * (i % 7 == 0 ? 300.0f : i % 5 == 0 ? 0.01f : 2.0f));
    for (int64_t i = 0; i < (s->v[D_W2] ? m * s->v[D_W2] : 1); i++)
        b[i] = mt_f32_to_bf16(mt_rng_normal(&r) * 2.0f);
    /* Distinct random rows. */
    int64_t P = s->v[D_P];
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)P);
    for (int64_t i = 0; i < P; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = 0; i < m; i++) {
        int64_t j = i + (int64_t)mt_rng_below(&r, (uint64_t)(P - i));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(host[B_ROWS], perm, sizeof(int32_t) * (size_t)m);
    free(perm);
    attn_fill_pool(&r, host[B_POOL], kv, (size_t)P * (size_t)(s->v[D_W1] + s->v[D_W2]), 1.0f,
                   scale);
    *(float *)host[B_SCALE] = scale;
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    int64_t w1 = s->v[D_W1], w2 = s->v[D_W2], w = w1 + w2;
    kern_dtype kv = (kern_dtype)s->v[D_KV];
    const uint16_t *a = host[B_A], *b = host[B_B];
    const int32_t *rows = host[B_ROWS];
    float scale = *(const float *)host[B_SCALE];
    for (int64_t i = 0; i < m; i++) {
        size_t base = (size_t)rows[i] * (size_t)w;
        for (int64_t j = 0; j < w1; j++)
            attn_kv_store(kv, host[B_POOL], base + (size_t)j, mt_bf16_to_f32(a[i * w1 + j]), scale);
        for (int64_t j = 0; j < w2; j++)
            attn_kv_store(kv, host[B_POOL], base + (size_t)(w1 + j),
                          mt_bf16_to_f32(b[i * w2 + j]), scale);
    }
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    double w = (double)(s->v[D_W1] + s->v[D_W2]);
    *flops = (double)m * w;
    *bytes = (double)m * (w * (2.0 + (double)attn_kv_esize((kern_dtype)s->v[D_KV])) + 4.0);
}

static const int threads_v[] = {32, 64, 128, 256};
static const kern_param_desc gpu_params[] = {
    {"THREADS", threads_v, 4, "threads per token"},
};

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    (void)m;
    c->n = 1;
    c->v[0] = kern_rows_default_threads(s->v[D_W1] + s->v[D_W2] >= 256, p);
}

/* run: kern_rows_run; no ROWS parameter: one token per block (per work
 * item on the cpu). */
static const kern_impl gpu_impl = {
    .source = "ops_kv_store.hip",
    .params = gpu_params,
    .n_params = 1,
    .valid = kern_rows_gpu_valid,
    .default_config = gpu_default,
    .run = kern_rows_run,
};

static const int cpu_one_v[] = {1};
static const kern_param_desc cpu_params[] = {
    {"TOK", cpu_one_v, 1, "tokens per work item"},
};

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    (void)s;
    (void)m;
    (void)p;
    c->n = 1;
    c->v[0] = 1;
}

static const kern_impl cpu_impl = {
    .source = "ops_kv_store.cpu",
    .params = cpu_params,
    .n_params = 1,
    .default_config = cpu_default,
    .run = kern_rows_run,
};

static const kern_case cases[] = {
    {"tiny", 1}, {"tiny", 9}, {"glm5.2-fp8", 3}, {"tiny-index", 5}, {"W1=20,W2=6,kv=fp8,P=13", 13},
};

const kern_family fam_ops_kv_store = {
    .name = "ops_kv_store",
    .version = 1,
    .summary = "writes new tokens' rows (bf16 or fp8 e4m3 with a scale) into a paged KV pool",
    .dims = dims,
    .n_dims = D_COUNT,
    .presets = presets,
    .n_presets = sizeof presets / sizeof presets[0],
    .gpu = &gpu_impl,
    .cpu = &cpu_impl,
    .shape_ok = shape_ok,
    .buffers = buffers,
    .fill = fill,
    .reference = reference,
    .cost = cost,
    .cases = cases,
    .n_cases = sizeof cases / sizeof cases[0],
};
