/* test_moe_route.c: GLM-5 routing pinned to hand-computed outputs, on the
 * host reference and on the moe_route kernels (cpu, emu wave64, emu
 * wave32): sigmoid scores, the correction bias used for selection only,
 * renormalization, the 2.5 routed scaling factor, ties to the lower expert
 * id, and group-limited selection. Logits are exact (H = 2, x one-hot). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "common/numeric.h"
#include "device/device.h"
#include "kernels/core/exec.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_common.h"

typedef struct route_case {
    const char *key;
    int E, topk;
    float logit[8]; /* gate[e] = (logit, 0); x = (1, 0) */
    float bias[8];
    int want_ids[2];
    float want_w[2];
} route_case;

static const route_case cases[] = {
    /* scores .5, .8808, .2689, .7311; biased 1.0, .8808, .2689, .4311:
     * the bias picks expert 0 over 3, weights stay unbiased:
     * .5 / (.5 + .8808) * 2.5 = 0.905274, .8808 / 1.3808 * 2.5 = 1.594726 */
    {"H=2,E=4,topk=2,ngroup=1,topkg=1,rsf=2500,norm=1", 4, 2, {0, 2, -1, 1},
     {0.5f, 0, 0, -0.3f}, {0, 1}, {0.9052742f, 1.5947258f}},
    /* three equal scores (logit 1): ties go to the lower ids, 1.25 each */
    {"H=2,E=4,topk=2,ngroup=1,topkg=1,rsf=2500,norm=1", 4, 2, {1, 1, 0, 1},
     {0, 0, 0, 0}, {0, 1}, {1.25f, 1.25f}},
    /* groups of two: sums 1.0, 1.462, 1.245, 0.538 keep groups 1 and 2, so
     * expert 0 (best single score .9526) is out; experts 2, 3 tie */
    {"H=2,E=8,topk=2,ngroup=4,topkg=2,rsf=2500,norm=1", 8, 2, {3, -3, 1, 1, 0.5f, 0.5f, -1, -1},
     {0}, {2, 3}, {1.25f, 1.25f}},
    /* no renormalization, scale 1: the raw sigmoid of logits 2 and 1 */
    {"H=2,E=4,topk=2,ngroup=1,topkg=1,rsf=1000,norm=0", 4, 2, {0, 2, -1, 1},
     {0}, {1, 3}, {0.8807971f, 0.7310586f}},
};

static void check_on(const char *spec)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open(spec, NULL, &d, &err), MT_OK, "%s: %s", spec, err.msg);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const route_case *rc = &cases[c];
        uint16_t x[2] = {mt_f32_to_bf16(1.0f), 0}, gate[16];
        for (int e = 0; e < rc->E; e++) {
            gate[2 * e] = mt_f32_to_bf16(rc->logit[e]);
            gate[2 * e + 1] = mt_f32_to_bf16(-7.0f); /* multiplied by x[1] = 0 */
        }
        const kern_family *f = kern_family_find("moe_route");
        kern_shape s;
        cr_assert_eq(kern_shape_parse(f, rc->key, &s, NULL, &err), MT_OK, "%s", err.msg);
        kern_exec *st;
        cr_assert_eq(kern_exec_open(d, f, &s, 1, NULL, &st, &err), MT_OK, "%s", err.msg);
        void *b[5];
        size_t sz[5] = {4, (size_t)rc->E * 4, (size_t)rc->E * 4, 8, 8};
        for (int i = 0; i < 5; i++)
            cr_assert_eq(dev_alloc(d, sz[i], &b[i], &err), MT_OK);
        dev_copy_to(d, b[0], x, 4, &err);
        dev_copy_to(d, b[1], gate, (size_t)rc->E * 4, &err);
        dev_copy_to(d, b[2], rc->bias, (size_t)rc->E * 4, &err);
        cr_assert_eq(kern_exec_run(st, NULL, 1, b, &err), MT_OK, "%s", err.msg);
        cr_assert_eq(dev_synchronize(d, &err), MT_OK, "%s", err.msg);
        int32_t ids[2];
        float w[2];
        dev_copy_from(d, ids, b[3], 8, &err);
        dev_copy_from(d, w, b[4], 8, &err);
        for (int j = 0; j < rc->topk; j++) {
            cr_expect_eq(ids[j], rc->want_ids[j], "%s case %zu slot %d: expert %d, want %d",
                         spec, c, j, ids[j], rc->want_ids[j]);
            cr_expect(fabsf(w[j] - rc->want_w[j]) < 2e-6f, "%s case %zu slot %d: w %.7f, want %.7f",
                      spec, c, j, w[j], rc->want_w[j]);
        }
        for (int i = 0; i < 5; i++)
            dev_free(d, b[i]);
        kern_exec_close(st);
    }
    dev_close(d);
}

Test(moe_route, reference_matches_hand_computed)
{
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const route_case *rc = &cases[c];
        uint16_t x[2] = {mt_f32_to_bf16(1.0f), 0}, gate[16];
        for (int e = 0; e < rc->E; e++) {
            gate[2 * e] = mt_f32_to_bf16(rc->logit[e]);
            gate[2 * e + 1] = 0;
        }
        int ngroup = c == 2 ? 4 : 1;
        moe_route_dims d = {.h = 2, .e = rc->E, .topk = rc->topk, .ngroup = ngroup,
                            .topkg = c == 2 ? 2 : 1, .scale = c == 3 ? 1.0f : 2.5f,
                            .norm = c != 3};
        int32_t ids[2];
        float w[2];
        moe_route_ref_token(&d, x, gate, rc->bias, ids, w, NULL, NULL);
        for (int j = 0; j < rc->topk; j++) {
            cr_expect_eq(ids[j], rc->want_ids[j], "case %zu slot %d", c, j);
            cr_expect(fabsf(w[j] - rc->want_w[j]) < 1e-6f, "case %zu slot %d: %.7f", c, j, w[j]);
        }
    }
}

Test(moe_route, cpu_kernel_matches_hand_computed) { check_on("cpu"); }
Test(moe_route, emu_wave64_kernel_matches_hand_computed) { check_on("emu:wave64"); }
Test(moe_route, emu_wave32_kernel_matches_hand_computed) { check_on("emu:wave32"); }
