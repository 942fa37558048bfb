/* fam_ops_copy.c: the `ops_copy` family: copies a block of N columns of
 * every row, src[m][SO .. SO+N) -> dst[m][DO .. DO+N), converting between
 * f32 and bf16 (round to nearest even). Rows are SW (src) and DW (dst)
 * elements wide; the rest of dst is left as it was. The runtime uses it to
 * split fused GEMM outputs into the pieces the next kernels read and to
 * convert f32 results to bf16 GEMM inputs. Exact: compared bit for bit. */
#include <stdio.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/core/rows.h"

enum { D_SW, D_SO, D_N, D_DW, D_DO, D_S, D_D, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_SW] = {"SW", KERN_DIM_INT, false, 1, 1 << 22, "source row width"},
    [D_SO] = {"SO", KERN_DIM_INT, false, 0, 1 << 22, "first source column"},
    [D_N] = {"N", KERN_DIM_INT, false, 1, 1 << 22, "columns copied"},
    [D_DW] = {"DW", KERN_DIM_INT, false, 1, 1 << 22, "destination row width"},
    [D_DO] = {"DO", KERN_DIM_INT, false, 0, 1 << 22, "first destination column"},
    [D_S] = {"s", KERN_DIM_DTYPE, false, 0, 0, "source type: f32 or bf16"},
    [D_D] = {"d", KERN_DIM_DTYPE, false, 0, 0, "destination type: f32 or bf16"},
};

static const kern_preset presets[] = {
    {"tiny", "SW=120,SO=64,N=48,DW=48,DO=0,s=f32,d=bf16"},
    {"glm5.2-q", "SW=16384,SO=0,N=16384,DW=16384,DO=0,s=f32,d=bf16"},
};

enum { B_SRC, B_DST, B_COUNT };

static bool type_ok(int64_t t) { return t == KERN_DT_F32 || t == KERN_DT_BF16; }
static size_t esz(int64_t t) { return t == KERN_DT_F32 ? 4 : 2; }

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    (void)m;
    if (!type_ok(s->v[D_S]) || !type_ok(s->v[D_D])) {
        snprintf(why, cap, "s and d must be f32 or bf16");
        return false;
    }
    if (s->v[D_SO] + s->v[D_N] > s->v[D_SW] || s->v[D_DO] + s->v[D_N] > s->v[D_DW]) {
        snprintf(why, cap, "columns SO+N=%lld / DO+N=%lld past the row widths %lld / %lld",
                 (long long)(s->v[D_SO] + s->v[D_N]), (long long)(s->v[D_DO] + s->v[D_N]),
                 (long long)s->v[D_SW], (long long)s->v[D_DW]);
        return false;
    }
    return true;
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return -1;
    size_t um = (size_t)m;
    out[B_SRC] = (kern_buf_desc){"src", KERN_BUF_IN, (kern_dtype)s->v[D_S],
                                 um * (size_t)s->v[D_SW] * esz(s->v[D_S]), 0, 0, 0};
    out[B_DST] = (kern_buf_desc){"dst", KERN_BUF_INOUT, (kern_dtype)s->v[D_D],
                                 um * (size_t)s->v[D_DW] * esz(s->v[D_D]), s->v[D_DW], 0, 0};
    return B_COUNT;
}

static void put(int64_t t, void *p, size_t i, float v)
{
    if (t == KERN_DT_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = mt_f32_to_bf16(v);
}

static float get(int64_t t, const void *p, size_t i)
{
    return t == KERN_DT_F32 ? ((const float *)p)[i] : mt_bf16_to_f32(((const uint16_t *)p)[i]);
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    for (size_t i = 0; i < (size_t)(m * s->v[D_SW]); i++)
        put(s->v[D_S], host[B_SRC], i, mt_rng_normal(&r) * 3.0f);
    for (size_t i = 0; i < (size_t)(m * s->v[D_DW]); i++)
        put(s->v[D_D], host[B_DST], i, mt_rng_normal(&r));
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < s->v[D_N]; j++)
            put(s->v[D_D], host[B_DST], (size_t)(i * s->v[D_DW] + s->v[D_DO] + j),
                get(s->v[D_S], host[B_SRC], (size_t)(i * s->v[D_SW] + s->v[D_SO] + j)));
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    *flops = 0;
    *bytes = (double)m * (double)s->v[D_N] * (double)(esz(s->v[D_S]) + esz(s->v[D_D]));
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    (void)m;
    kern_rows_gpu_config(s->v[D_N], p, c);
}

static const kern_impl gpu_impl = {
    .source = "ops_copy.hip",
    .params = kern_rows_gpu_params,
    .n_params = KERN_ROWS_GPU_N_PARAMS,
    .valid = kern_rows_gpu_valid,
    .default_config = gpu_default,
    .run = kern_rows_run,
};

static const int cpu_rows_v[] = {1, 4, 16, 64};
static const kern_param_desc cpu_params[] = {
    {"ROWS", cpu_rows_v, 4, "rows per work item"},
};

static void cpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    c->n = 1;
    c->v[0] = m * s->v[D_N] >= 4096 * (int64_t)p->compute_units ? 16 : 1;
}

static const kern_impl cpu_impl = {
    .source = "ops_copy.cpu",
    .params = cpu_params,
    .n_params = 1,
    .default_config = cpu_default,
    .run = kern_rows_run,
};

static const kern_case cases[] = {
    {"tiny", 1}, {"tiny", 5}, {"SW=40,SO=0,N=40,DW=40,DO=0,s=bf16,d=f32", 3},
    {"SW=7,SO=2,N=5,DW=19,DO=11,s=bf16,d=bf16", 4},
    {"SW=300,SO=100,N=200,DW=260,DO=60,s=f32,d=f32", 2},
};

const kern_family fam_ops_copy = {
    .name = "ops_copy",
    .version = 1,
    .summary = "strided column-block copy with f32/bf16 conversion (splits fused outputs)",
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
