/* fam_tp_cols.c: the `tp_cols` family: the layout step of a
 * tensor-parallel all-gather, on the device. U units of per elements (heads
 * of v_head_dim values, o_proj rows, vocabulary entries) are split over
 * the ranks as the runtime splits them (contiguous, sizes differing by one
 * at most); rank q computes w(q) = its units x per columns of every row.
 * The exchange delivers rank q's M x w(q) block after rank q-1's; this
 * writes rows of all U x per columns, rank q's at its first column. f32 or
 * bf16; exact, compared bit for bit. */
#include <stdio.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/core/family.h"
#include "kernels/core/rows.h"

enum { D_RANKS, D_U, D_PER, D_T, D_COUNT };

static const kern_dim_desc dims[D_COUNT] = {
    [D_RANKS] = {"ranks", KERN_DIM_INT, false, 1, 4096, "ranks of the gather"},
    [D_U] = {"U", KERN_DIM_INT, false, 1, 1 << 22, "units split over the ranks"},
    [D_PER] = {"per", KERN_DIM_INT, false, 1, 1 << 16, "elements a unit"},
    [D_T] = {"t", KERN_DIM_DTYPE, false, 0, 0, "element type: f32 or bf16"},
};

static const kern_preset presets[] = {
    {"glm5.2", "ranks=8,U=64,per=128,t=bf16"},
    {"tiny", "ranks=3,U=4,per=64,t=bf16"},
};

enum { B_SRC, B_DST, B_COUNT };

static size_t esz(const kern_shape *s) { return s->v[D_T] == KERN_DT_F32 ? 4 : 2; }

static bool shape_ok(const kern_shape *s, int64_t m, char *why, size_t cap)
{
    (void)m;
    if (s->v[D_T] != KERN_DT_F32 && s->v[D_T] != KERN_DT_BF16) {
        snprintf(why, cap, "t must be f32 or bf16");
        return false;
    }
    if (s->v[D_RANKS] > s->v[D_U]) {
        snprintf(why, cap, "ranks=%lld exceeds U=%lld", (long long)s->v[D_RANKS],
                 (long long)s->v[D_U]);
        return false;
    }
    return true;
}

static int buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < B_COUNT)
        return -1;
    size_t W = (size_t)(s->v[D_U] * s->v[D_PER]), n = (size_t)m * W * esz(s);
    kern_dtype t = (kern_dtype)s->v[D_T];
    out[B_SRC] = (kern_buf_desc){"blocks", KERN_BUF_IN, t, n, 0, 0, 0};
    out[B_DST] = (kern_buf_desc){"rows", KERN_BUF_OUT, t, n, (int64_t)W, 0, 0};
    return B_COUNT;
}

static void fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    size_t n = (size_t)(m * s->v[D_U] * s->v[D_PER]);
    for (size_t i = 0; i < n; i++) {
        float v = mt_rng_normal(&r);
        if (s->v[D_T] == KERN_DT_F32)
            ((float *)host[B_SRC])[i] = v;
        else
            ((uint16_t *)host[B_SRC])[i] = mt_f32_to_bf16(v);
    }
}

static void reference(const kern_shape *s, int64_t m, void *const *host)
{
    int64_t n = s->v[D_RANKS], U = s->v[D_U], per = s->v[D_PER], W = U * per;
    size_t es = esz(s);
    const char *src = host[B_SRC];
    char *dst = host[B_DST];
    for (int64_t q = 0, c0 = 0; q < n; q++) {
        int64_t w = (U / n + (q < U % n)) * per;
        for (int64_t row = 0; row < m; row++)
            memcpy(dst + (size_t)(row * W + c0) * es, src + (size_t)(m * c0 + row * w) * es,
                   (size_t)w * es);
        c0 += w;
    }
}

static void cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    *flops = 0;
    *bytes = 2.0 * (double)m * (double)(s->v[D_U] * s->v[D_PER]) * (double)esz(s);
}

static void gpu_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    (void)m;
    kern_rows_gpu_config(s->v[D_U] * s->v[D_PER] / s->v[D_RANKS], p, c);
}

static const kern_case cases[] = {
    {"tiny", 1}, {"tiny", 7}, {"ranks=4,U=512,per=1,t=f32", 3},
    {"ranks=3,U=256,per=1,t=f32", 5}, {"ranks=2,U=37,per=3,t=bf16", 4},
};

const kern_family fam_tp_cols = {
    .name = "tp_cols",
    .version = 1,
    .summary = "tensor-parallel all-gather layout: the ranks' column blocks side by side",
    .dims = dims,
    .n_dims = D_COUNT,
    .presets = presets,
    .n_presets = sizeof presets / sizeof presets[0],
    .gpu = KERN_ROWS_GPU_IMPL("tp_cols.hip", gpu_default, kern_rows_run),
    .cpu = KERN_ROWS_CPU_IMPL("tp_cols.cpu", kern_rows_run),
    .shape_ok = shape_ok,
    .buffers = buffers,
    .fill = fill,
    .reference = reference,
    .cost = cost,
    .cases = cases,
    .n_cases = sizeof cases / sizeof cases[0],
};
