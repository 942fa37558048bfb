/* test_moe_pipeline.c: the served MoE layer (model/moe_layer.h, what the
 * runtime's forward pass runs: route -> align -> up -> down (+ combine) +
 * shared expert, each a kernel of a kernel set with the configs it selects)
 * against moe_reference on the tiny dims
 * (H=256, I=128, E=16, top-4, shared expert 128 wide) on cpu and on the
 * emulator, with both combine paths, a4w4 and a16w4, M in {1, 3, 17, 64};
 * on cpu also a4w4 and a8w4 on weights grouped by 16 rows (wl=1, what the
 * runtime loads there), against the reference on the Quark rows.
 * Near-tied routing can legitimately pick another expert (float vs double
 * logits): a token's row may differ from the reference only when two of
 * its biased scores lie within 1e-5 around its top-k. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "common/numeric.h"
#include "device/device.h"
#include "kernels/moe/moe_common.h"
#include "model/moe_layer.h"
#include "moe_glm_util.h"

static void *upload(dev_device *d, const void *src, size_t n)
{
    void *p = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_alloc(d, n, &p, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(dev_copy_to(d, p, src, n, &err), MT_OK, "%s", err.msg);
    return p;
}

/* rows x k MXFP4 weights uploaded in layout wl (1: grouped by 16 rows). */
static void *upload_w4(dev_device *d, const uint8_t *w, const uint8_t *s, int64_t rows, int64_t k,
                       int wl, void **scales)
{
    size_t pb = (size_t)(rows * k / 2), sb = (size_t)(rows * k / 32);
    if (!wl) {
        *scales = upload(d, s, sb);
        return upload(d, w, pb);
    }
    /* The scales ride in the weights' buffer; the scale buffer is empty. */
    size_t gb = (size_t)moe_w4_bytes(1, rows, k);
    uint8_t *g = malloc(gb);
    cr_assert(g);
    moe_w4_group16(w, s, rows, k, g);
    void *p = upload(d, g, gb);
    *scales = upload(d, s, 0);
    free(g);
    return p;
}

/* act: KERN_DT_BF16 (a16w4), KERN_DT_MXFP4 (a4w4) or KERN_DT_I8 (a8w4). */
static void run_layer(const char *spec, kern_dtype act, int comb, int wl)
{
    moe_dims dm = {.hidden = 256, .inter = 128, .n_experts = 16, .topk = 4, .ngroup = 1,
                   .topkg = 1, .scale = 2.5f, .norm = true, .a4 = act == KERN_DT_MXFP4, .a8 = act == KERN_DT_I8,
                   .shared_inter = 128, .comb = comb, .wl = wl};
    uint64_t seed = mt_seed_fresh();
    layer_host l;
    layer_host_make(&dm, seed, &l);
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open(spec, NULL, &d, &err), MT_OK, "%s", err.msg);
    int64_t H = dm.hidden, I = dm.inter, E = dm.n_experts, S = dm.shared_inter;
    moe_weights w = {.gate = upload(d, l.gate, (size_t)(E * H) * 2),
                     .bias = upload(d, l.bias, (size_t)E * 4)};
    void *s13, *s2, *sh_s13, *sh_s2;
    w.w13 = upload_w4(d, l.w13, l.s13, E * 2 * I, H, wl, &s13);
    w.w2 = upload_w4(d, l.w2, l.s2, E * H, I, wl, &s2);
    w.sh_w13 = upload_w4(d, l.sh_w13, l.sh_s13, 2 * S, H, wl, &sh_s13);
    w.sh_w2 = upload_w4(d, l.sh_w2, l.sh_s2, H, S, wl, &sh_s2);
    w.s13 = s13, w.s2 = s2, w.sh_s13 = sh_s13, w.sh_s2 = sh_s2;
    model_kset *ks = NULL;
    model_moe_kernels mk;
    model_moe_ws *ws = NULL;
    cr_assert_eq(model_kset_create(d, NULL, NULL, &ks, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_moe_add_kernels(ks, &dm, 64, &mk, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_kset_select(ks, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_moe_ws_create(d, &dm, 64, &ws, &err), MT_OK, "%s", err.msg);
    const int64_t ms[] = {1, 3, 17, 64};
    mt_rng r;
    mt_rng_seed(&r, seed + 1);
    for (size_t mi = 0; mi < 4; mi++) {
        int64_t M = ms[mi];
        uint16_t *x = malloc((size_t)(M * H) * 2);
        moe_gen_bf16(&r, x, M * H, 1.0f);
        float *want = malloc((size_t)(M * H) * 4), *got = malloc((size_t)(M * H) * 4);
        int32_t *ids = malloc((size_t)(M * dm.topk) * 4);
        moe_host_weights hw = layer_host_weights(&l);
        moe_reference(&dm, &hw, x, M, want, ids, NULL);
        void *dx = upload(d, x, (size_t)(M * H) * 2), *dy = NULL;
        cr_assert_eq(dev_alloc(d, (size_t)(M * H) * 4, &dy, &err), MT_OK);
        dev_memset(d, dy, 0xff, (size_t)(M * H) * 4, &err); /* NaN poison */
        cr_assert_eq(model_moe_run(&mk, ws, &dm, &w, dx, M, dy, &err), MT_OK, "%s", err.msg);
        cr_assert_eq(dev_synchronize(d, &err), MT_OK);
        dev_copy_from(d, got, dy, (size_t)(M * H) * 4, &err);
        moe_route_dims rd = {.h = H, .e = E, .topk = dm.topk, .ngroup = 1, .topkg = 1,
                             .scale = 2.5f, .norm = true};
        for (int64_t t = 0; t < M; t++) {
            double scale = 0;
            for (int64_t n = 0; n < H; n++)
                scale = fmax(scale, fabs(want[t * H + n]));
            int bad = -1;
            for (int64_t n = 0; n < H && bad < 0; n++) {
                float g = got[t * H + n], v = want[t * H + n];
                if (!(fabsf(g - v) <= 1e-2 * scale + 1e-2 * fabsf(v)))
                    bad = (int)n;
            }
            if (bad < 0)
                continue;
            /* Only a token whose routing is a near tie may differ. */
            double choice[16];
            int32_t tid[4];
            float tw[4];
            moe_route_ref_token(&rd, x + t * H, l.gate, l.bias, tid, tw, choice, NULL);
            bool tie = false;
            for (int e = 0; e < E; e++)
                for (int j = 0; j < dm.topk; j++)
                    tie |= e != tid[j] && fabs(choice[e] - choice[tid[j]]) < 1e-5;
            cr_expect(tie, "%s a=%s comb=%d wl=%d M=%lld token %lld col %d: got %g want %g "
                      "(seed %llu)", spec, kern_dtype_name(act), comb, wl, (long long)M, (long long)t, bad, got[t * H + bad],
                      want[t * H + bad], (unsigned long long)seed);
        }
        dev_free(d, dx);
        dev_free(d, dy);
        free(x);
        free(want);
        free(got);
        free(ids);
    }
    model_moe_ws_destroy(ws);
    model_kset_destroy(ks);
    const void *ptrs[] = {w.gate, w.bias, w.w13, w.s13, w.w2, w.s2, w.sh_w13, w.sh_s13, w.sh_w2, w.sh_s2};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        dev_free(d, (void *)(uintptr_t)ptrs[i]);
    dev_close(d);
    layer_host_free(&l);
}

Test(moe_pipeline, cpu_a4w4_atomic_combine) { run_layer("cpu", KERN_DT_MXFP4, 0, 0); }
Test(moe_pipeline, cpu_a4w4_rows_and_combine) { run_layer("cpu", KERN_DT_MXFP4, 1, 0); }
Test(moe_pipeline, cpu_a16w4_atomic_combine) { run_layer("cpu", KERN_DT_BF16, 0, 0); }
Test(moe_pipeline, cpu_a4w4_grouped_rows_and_combine) { run_layer("cpu", KERN_DT_MXFP4, 1, 1); }
Test(moe_pipeline, cpu_a8w4_grouped_rows_and_combine) { run_layer("cpu", KERN_DT_I8, 1, 1); }
Test(moe_pipeline, emu_a4w4_atomic_combine) { run_layer("emu", KERN_DT_MXFP4, 0, 0); }
Test(moe_pipeline, emu_a16w4_rows_and_combine) { run_layer("emu:wave32", KERN_DT_BF16, 1, 0); }
