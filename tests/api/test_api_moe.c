/* test_api_moe.c: the MoE layer of the public API (moetune_moe_*, through
 * libmoetune.so) against the plain C reference of the layer
 * (moe_reference) on small dims, on the cpu backend and on the emulator,
 * with the caller's host buffers:
 *   - routed by the layer's router weight (the runtime's path,
 *     model_moe_run), a16w4 and a4w4, with and without group routing;
 *   - routed by the caller's top-k (moe_reference's own routing), which
 *     must match moe_reference exactly as routed;
 *   - routed by bf16 router logits, against the top-k run on the routing
 *     the plain C router computes from those logits;
 *   - a8w4 on cpu; the emulator refuses it.
 * Tokens whose routing is a near tie may differ (float vs double). */
#include "api_test_util.h"

#include "common/numeric.h"
#include "common/rng.h"

enum { MAXM = 33 };

static moetune_device *open_dev(const char *spec)
{
    moetune_device *dev = NULL;
    cr_assert_eq(moetune_device_open(spec, &dev), MOETUNE_OK, "%s", moetune_errmsg(dev));
    return dev;
}

static moetune_moe *make(moetune_device *dev, const api_layer *l, moetune_act act,
                         moetune_routing r)
{
    moetune_moe_desc d;
    api_layer_desc(l, act, r, MAXM, &d);
    moetune_moe *moe = NULL;
    cr_assert_eq(moetune_moe_create(dev, &d, &l->mw, &moe), MOETUNE_OK, "%s",
                 moetune_errmsg(dev));
    return moe;
}

/* Routed by the layer's router weight, at M = 1, 5 and 33. */
static void gate_matches_reference(const char *spec, moetune_act act, int groups)
{
    uint64_t seed = mt_seed_fresh();
    api_layer l;
    api_layer_make(&l, act, groups, seed);
    moetune_device *dev = open_dev(spec);
    moetune_moe *moe = make(dev, &l, act, MOETUNE_ROUTE_GATE);
    const int64_t ms[] = {1, 5, MAXM}, H = l.d.hidden;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        int64_t M = ms[i];
        uint16_t *x = api_input(M, H, seed + i + 1);
        float *want = malloc((size_t)(M * H) * 4), *got = api_alloc((size_t)(M * H) * 4);
        bool skip[MAXM];
        moe_host_weights hw = layer_host_weights(&l.w);
        moe_reference(&l.d, &hw, x, M, want, NULL, NULL);
        memset(got, 0xff, (size_t)(M * H) * 4);
        cr_assert_eq(moetune_moe_run(moe, x, M, got, NULL), MOETUNE_OK, "%s",
                     moetune_errmsg(dev));
        for (int64_t t = 0; t < M; t++)
            skip[t] = api_near_tie(&l, x + t * H);
        int64_t off = api_first_off(got, want, M, H, skip);
        cr_expect_eq(off, -1, "%s act=%d groups=%d M=%lld: token %lld off (seed %llu)", spec,
                     (int)act, groups, (long long)M, (long long)off, (unsigned long long)seed);
        free(x);
        free(want);
        free(got);
    }
    moetune_moe_destroy(moe);
    moetune_device_close(dev);
    api_layer_free(&l);
}

Test(api_moe, cpu_gate_a16w4_matches_reference) { gate_matches_reference("cpu", MOETUNE_ACT_A16W4, 1); }
Test(api_moe, cpu_gate_a4w4_matches_reference) { gate_matches_reference("cpu", MOETUNE_ACT_A4W4, 1); }
Test(api_moe, cpu_gate_groups_matches_reference) { gate_matches_reference("cpu", MOETUNE_ACT_A16W4, 4); }
Test(api_moe, cpu_gate_a8w4_matches_reference) { gate_matches_reference("cpu", MOETUNE_ACT_A8W4, 1); }
Test(api_moe, emu_gate_a16w4_matches_reference) { gate_matches_reference("emu", MOETUNE_ACT_A16W4, 1); }
Test(api_moe, emu_gate_a4w4_groups_matches_reference) { gate_matches_reference("emu:wave32", MOETUNE_ACT_A4W4, 4); }

/* The caller's routing (moe_reference's own ids and weights), and router
 * logits against that path on the plain C router's choice. */
static void given_routing_matches_reference(const char *spec, moetune_act act, int groups)
{
    uint64_t seed = mt_seed_fresh();
    api_layer l;
    api_layer_make(&l, act, groups, seed);
    moetune_device *dev = open_dev(spec);
    moetune_moe *moe = make(dev, &l, act, MOETUNE_ROUTE_LOGITS);
    const int64_t M = 17, H = l.d.hidden, E = l.d.n_experts, K = l.d.topk;
    uint16_t *x = api_input(M, H, seed + 1);
    float *want = malloc((size_t)(M * H) * 4), *got = api_alloc((size_t)(M * H) * 4);
    int32_t *ids = api_alloc(64 * 4 * (size_t)K);
    float *tw = api_alloc(64 * 4 * (size_t)K);
    moe_host_weights hw = layer_host_weights(&l.w);
    moe_reference(&l.d, &hw, x, M, want, ids, tw);
    cr_assert_eq(moetune_moe_run_topk(moe, x, ids, tw, M, got, NULL), MOETUNE_OK, "%s",
                 moetune_errmsg(dev));
    int64_t off = api_first_off(got, want, M, H, NULL);
    cr_expect_eq(off, -1, "%s top-k: token %lld off (seed %llu)", spec, (long long)off,
                 (unsigned long long)seed);

    /* bf16 logits; the plain C router on them (the logits as rows against
     * an identity weight: exact) gives the routing to compare with. */
    uint16_t *logits = api_alloc((size_t)(M * E) * 2 + 64);
    uint16_t *eye = calloc((size_t)(E * E), 2);
    for (int64_t e = 0; e < E; e++)
        eye[e * E + e] = 0x3f80;
    for (int64_t t = 0; t < M; t++)
        for (int64_t e = 0; e < E; e++) {
            double acc = 0;
            for (int64_t h = 0; h < H; h++)
                acc += (double)mt_bf16_to_f32(x[t * H + h]) * mt_bf16_to_f32(l.w.gate[e * H + h]);
            logits[t * E + e] = mt_f32_to_bf16((float)acc);
        }
    moe_route_dims rd = {.h = E, .e = E, .topk = (int)K, .ngroup = l.d.ngroup,
                         .topkg = l.d.topkg, .scale = l.d.scale, .norm = l.d.norm};
    bool skip[64];
    for (int64_t t = 0; t < M; t++) {
        double choice[64];
        moe_route_ref_token(&rd, logits + t * E, eye, l.w.bias, ids + t * K, tw + t * K, choice,
                            NULL);
        skip[t] = false;
        for (int64_t e = 0; e < E; e++)
            for (int64_t j = 0; j < K; j++)
                skip[t] |= e != ids[t * K + j] && isfinite(choice[e]) &&
                           fabs(choice[e] - choice[ids[t * K + j]]) < 1e-5;
    }
    cr_assert_eq(moetune_moe_run_topk(moe, x, ids, tw, M, want, NULL), MOETUNE_OK, "%s",
                 moetune_errmsg(dev));
    memset(got, 0xff, (size_t)(M * H) * 4);
    cr_assert_eq(moetune_moe_run_logits(moe, x, logits, M, got, NULL), MOETUNE_OK, "%s",
                 moetune_errmsg(dev));
    off = api_first_off(got, want, M, H, skip);
    cr_expect_eq(off, -1, "%s logits: token %lld off (seed %llu)", spec, (long long)off,
                 (unsigned long long)seed);
    void *mem[] = {x, want, got, ids, tw, logits, eye};
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++)
        free(mem[i]);
    moetune_moe_destroy(moe);
    moetune_device_close(dev);
    api_layer_free(&l);
}

Test(api_moe, cpu_topk_and_logits_match_reference) { given_routing_matches_reference("cpu", MOETUNE_ACT_A16W4, 1); }
Test(api_moe, cpu_topk_and_logits_groups_a4w4) { given_routing_matches_reference("cpu", MOETUNE_ACT_A4W4, 4); }
Test(api_moe, emu_topk_and_logits_match_reference) { given_routing_matches_reference("emu", MOETUNE_ACT_A16W4, 4); }

Test(api_moe, emu_refuses_a8w4)
{
    api_layer l;
    api_layer_make(&l, MOETUNE_ACT_A8W4, 1, 1);
    moetune_device *dev = open_dev("emu");
    moetune_moe_desc d;
    api_layer_desc(&l, MOETUNE_ACT_A8W4, MOETUNE_ROUTE_GATE, 4, &d);
    moetune_moe *moe = (moetune_moe *)&d; /* set to NULL on failure */
    cr_assert_eq(moetune_moe_create(dev, &d, &l.mw, &moe), MOETUNE_E_UNSUPPORTED);
    cr_assert_null(moe);
    cr_assert(strstr(moetune_errmsg(dev), "A8W4"), "%s", moetune_errmsg(dev));
    moetune_device_close(dev);
    api_layer_free(&l);
}

/* M = 0 does nothing; outputs beyond M are not touched. */
Test(api_moe, zero_tokens_and_rows_past_m_untouched)
{
    api_layer l;
    api_layer_make(&l, MOETUNE_ACT_A16W4, 1, 7);
    moetune_device *dev = open_dev("cpu");
    moetune_moe *moe = make(dev, &l, MOETUNE_ACT_A16W4, MOETUNE_ROUTE_GATE);
    const int64_t H = l.d.hidden;
    uint16_t *x = api_input(3, H, 9);
    float *y = api_alloc((size_t)(3 * H) * 4);
    for (int64_t i = 0; i < 3 * H; i++)
        y[i] = 42.0f;
    cr_assert_eq(moetune_moe_run(moe, x, 0, y, NULL), MOETUNE_OK);
    cr_assert_eq(moetune_moe_run(moe, x, 2, y, NULL), MOETUNE_OK, "%s", moetune_errmsg(dev));
    for (int64_t i = 2 * H; i < 3 * H; i++)
        cr_assert_eq(y[i], 42.0f, "row 2 written at %lld", (long long)i);
    free(x);
    free(y);
    moetune_moe_destroy(moe);
    moetune_device_close(dev);
    api_layer_free(&l);
}
