/* test_tune_families.h: test-only kernel families for the tuner tests,
 * compiled into each test binary (never registered). They run on the cpu
 * backend from their own kernel text (kern_impl.source_text):
 *
 *   tfault_compile / _wrong / _segv / _hang: y = 2x; config V=2 fails in
 *     the family's way (#error; one wrong element; a write to address 16;
 *     an endless loop), every other config is correct;
 *   tspin: y = 2x plus busy work proportional to SPIN*PAD, so the fastest
 *     config is unique (SPIN=1,PAD=1) and the next one does 3x the work;
 *   tlucky: y = 2x; the default V=1 and V=2 do equal work, V=3 3x;
 *   tpodium: y = 2x; the default V=1 does 8 units of work, V=2 2 units,
 *     V=3 3 units: V=2 is the fastest, V=3 the runner-up.
 *
 * Shape: N (elements per row); M rows. */
#ifndef TEST_TUNE_FAMILIES_H
#define TEST_TUNE_FAMILIES_H

#include <stdio.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/core/family.h"

#define TFAM_BODY                                                                    \
    "MT_CPU_KERNEL void tscale(float *y, const float *x, int n)\n"                   \
    "{\n"                                                                            \
    "#if FAULT == 1 && V == 2\n"                                                     \
    "#error injected compile failure\n"                                              \
    "#endif\n"                                                                       \
    "    for (int i = 0; i < n; i++) {\n"                                            \
    "        float v = 2.0f * x[i];\n"                                               \
    "#if FAULT == 2 && V == 2\n"                                                     \
    "        if (i == n / 2) v += 1.0f;\n"                                           \
    "#endif\n"                                                                       \
    "        y[i] = v;\n"                                                            \
    "    }\n"                                                                        \
    "    for (long r = 0; r < (long)SPIN * PAD * WORK; r++) __asm__ volatile(\"\");\n" \
    "#if FAULT == 3 && V == 2\n"                                                     \
    "    *(volatile int *)(uintptr_t)16 = 1;\n"                                      \
    "#endif\n"                                                                       \
    "#if FAULT == 4 && V == 2\n"                                                     \
    "    for (;;) __asm__ volatile(\"\");\n"                                         \
    "#endif\n"                                                                       \
    "}\n"

static const kern_dim_desc tfam_dims[] = {
    {"N", KERN_DIM_INT, false, 1, 1 << 20, "elements per row"},
};
static const kern_preset tfam_presets[] = {{"small", "N=512"}};

static const int tfam_v[] = {1, 2, 3};
static const int tfam_spin[] = {1, 4};
static const int tfam_one[] = {1};
static const kern_param_desc tfault_params[] = {
    {"V", tfam_v, 3, "variant; V=2 carries the injected fault"},
    {"SPIN", tfam_spin, 2, "busy work multiplier"},
    {"PAD", tfam_one, 1, "unused"},
};

static const int tspin_spin[] = {1, 4, 16, 64};
static const int tspin_pad[] = {1, 3, 9};
static const kern_param_desc tspin_params[] = {
    {"V", tfam_one, 1, "single variant"},
    {"SPIN", tspin_spin, 4, "busy work multiplier"},
    {"PAD", tspin_pad, 3, "busy work multiplier"},
};

static void tfam_default(const kern_shape *s, int64_t m, const dev_props *p, kern_config *c)
{
    (void)s;
    (void)m;
    (void)p;
    c->n = 3;
    c->v[0] = 1;
    c->v[1] = 4; /* not the fastest: the tuner must beat the default */
    c->v[2] = 1;
}

static mt_status tfam_run(const kern_ctx *c, mt_err *err)
{
    dev_kernel *k;
    mt_status st = kern_get(c, "tscale", "ppi", &k, err);
    if (st != MT_OK)
        return st;
    int n = (int)(c->shape->v[0] * c->m);
    void *args[] = {(void *)&c->bufs[1], (void *)&c->bufs[0], &n};
    dev_dim3 one = {1, 1, 1};
    return dev_launch(c->dev, k, one, one, 0, args, err);
}

static int tfam_buffers(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap)
{
    if (cap < 2)
        return -1;
    size_t n = (size_t)s->v[0] * (size_t)m;
    out[0] = (kern_buf_desc){"x", KERN_BUF_IN, KERN_DT_F32, n * 4, 0, 0, 0};
    out[1] = (kern_buf_desc){"y", KERN_BUF_OUT, KERN_DT_F32, n * 4, s->v[0], 1e-6, 1e-6};
    return 2;
}

static void tfam_fill(const kern_shape *s, int64_t m, uint64_t seed, void *const *host)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    float *x = host[0];
    for (int64_t i = 0; i < s->v[0] * m; i++)
        x[i] = mt_rng_uniform(&r, -1, 1);
}

static void tfam_reference(const kern_shape *s, int64_t m, void *const *host)
{
    const float *x = host[0];
    float *y = host[1];
    for (int64_t i = 0; i < s->v[0] * m; i++)
        y[i] = 2.0f * x[i];
}

static void tfam_cost(const kern_shape *s, int64_t m, double *flops, double *bytes)
{
    *flops = (double)s->v[0] * (double)m;
    *bytes = 8.0 * (double)s->v[0] * (double)m;
}

#define TFAM_IMPL(ident, fault, work, param_table, param_count)                                  \
    static const kern_impl ident##_impl = {                                         \
        .source = #ident ".cpu",                                                    \
        .source_text = "#define FAULT " #fault "\n#define WORK " #work "\n" TFAM_BODY,   \
        .params = param_table,                                                      \
        .n_params = param_count,                                                    \
        .default_config = tfam_default,                                             \
        .run = tfam_run,                                                            \
    };                                                                              \
    __attribute__((unused)) static const kern_family ident = {                      \
        .name = #ident, .version = 1, .summary = "tuner test family",               \
        .dims = tfam_dims, .n_dims = 1, .presets = tfam_presets, .n_presets = 1,    \
        .cpu = &ident##_impl, .buffers = tfam_buffers, .fill = tfam_fill,           \
        .reference = tfam_reference, .cost = tfam_cost,                             \
    };

TFAM_IMPL(tfault_compile, 1, 20000, tfault_params, 3)
TFAM_IMPL(tfault_wrong, 2, 20000, tfault_params, 3)
TFAM_IMPL(tfault_segv, 3, 20000, tfault_params, 3)
TFAM_IMPL(tfault_hang, 4, 20000, tfault_params, 3)
/* About 70 us of busy work per unit: far above launch overhead, so the
 * least-work config is the fastest by a clear 3x. */
TFAM_IMPL(tspin, 0, 200000, tspin_params, 3)

/* tlucky: V=1 (the default) and V=2 do the same work, V=3 does 3x: a
 * config that only a lucky median (planted by the test) makes the search's
 * best, and that a paired confirmation must reject. A default of about
 * 0.6 ms: on a loaded 2-core machine the scheduler adds tens of us to every
 * run, which must not squeeze the ratios these tests pin. */
static const int tlucky_spin[] = {4};
static const kern_param_desc tlucky_params[] = {
    {"V", tfam_v, 3, "variant; V=3 does 3x the work"},
    {"SPIN", tlucky_spin, 1, "busy work multiplier"},
    {"PAD", tfam_one, 1, "unused"},
};
TFAM_IMPL(tlucky, 0, (V == 3 ? 1500000 : 500000), tlucky_params, 3)

/* tpodium: two configs beat the default (V=1), V=2 by 4x and V=3 by 2.67x;
 * a lucky median (planted by the test) makes V=3 the search's best. */
TFAM_IMPL(tpodium, 0, (V == 2 ? 250000 : V == 3 ? 375000 : 1000000), tlucky_params, 3)

#endif
