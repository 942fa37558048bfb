/* test_api_errors.c: the public API's contracts on bad input and misuse:
 * every failure returns its status, leaves a message on the device that
 * names the field, buffer or call at fault (moetune_errmsg), creates
 * nothing, and a success clears the message; NULL handles are no-ops or
 * MOETUNE_E_MISUSE; names of statuses and sources; the version. */
#include "api_test_util.h"

#include <unistd.h>

#include "test_tmp.h"

static moetune_device *open_cpu(void)
{
    moetune_device *dev = NULL;
    cr_assert_eq(moetune_device_open("cpu", &dev), MOETUNE_OK, "%s", moetune_errmsg(dev));
    return dev;
}

static void expect_msg(moetune_device *dev, moetune_status got, moetune_status want,
                       const char *needle)
{
    cr_expect_eq(got, want, "status %s, want %s: %s", moetune_status_str(got),
                 moetune_status_str(want), moetune_errmsg(dev));
    cr_expect_eq(moetune_errcode(dev), want);
    cr_expect(strstr(moetune_errmsg(dev), needle), "message '%s' does not name '%s'",
              moetune_errmsg(dev), needle);
}

Test(api_errors, version_and_names)
{
    cr_assert_eq(moetune_version(), MOETUNE_API_VERSION);
    cr_assert(strstr(moetune_version_string(), "api 1"), "%s", moetune_version_string());
    cr_assert_str_eq(moetune_status_str(MOETUNE_OK), "ok");
    cr_assert_str_eq(moetune_status_str(MOETUNE_E_COMPILE), "compile_error");
    cr_assert_str_eq(moetune_status_str(MOETUNE_E_MISUSE), "misuse");
    cr_assert_str_eq(moetune_status_str((moetune_status)999), "unknown");
    cr_assert_str_eq(moetune_source_str(MOETUNE_SOURCE_NEAREST), "nearest");
    cr_assert_str_eq(moetune_source_str(MOETUNE_SOURCE_MISS), "default (miss)");
    cr_assert_str_eq(moetune_source_str(MOETUNE_SOURCE_COUNT), "unknown");
}

Test(api_errors, device_open_failures_keep_a_handle_with_the_reason)
{
    moetune_device *dev = NULL;
    expect_msg(dev, moetune_device_open("tpu:3", &dev), MOETUNE_E_INVALID, "tpu:3");
    cr_assert_not_null(dev);
    moetune_device_info info;
    cr_assert_eq(moetune_device_get_info(dev, &info), MOETUNE_E_MISUSE);
    cr_assert_eq(moetune_device_add_db(dev, "x.db"), MOETUNE_E_MISUSE);
    moetune_moe *moe = NULL;
    moetune_moe_desc d;
    moetune_moe_desc_init(&d);
    moetune_moe_weights w = {0};
    cr_assert_eq(moetune_moe_create(dev, &d, &w, &moe), MOETUNE_E_MISUSE);
    moetune_device_close(dev);
    dev = NULL;
    cr_assert_eq(moetune_device_open(NULL, &dev), MOETUNE_E_INVALID);
    moetune_device_close(dev);
    /* NULL handles */
    moetune_device_close(NULL);
    moetune_moe_destroy(NULL);
    moetune_moe_desc_init(NULL);
    cr_assert_eq(moetune_device_open("cpu", NULL), MOETUNE_E_MISUSE);
    cr_assert_str_eq(moetune_errmsg(NULL), "out of memory");
    cr_assert_eq(moetune_moe_run(NULL, NULL, 0, NULL, NULL), MOETUNE_E_MISUSE);
    cr_assert_eq(moetune_moe_selection_count(NULL), 0);
    cr_assert_eq(moetune_device_db_count(NULL), 0);
}

Test(api_errors, device_info_and_databases)
{
    moetune_device *dev = open_cpu();
    moetune_device_info info;
    cr_assert_eq(moetune_device_get_info(dev, &info), MOETUNE_OK);
    cr_assert_eq(info.backend, MOETUNE_BACKEND_CPU);
    cr_assert_str_eq(info.spec, "cpu");
    cr_assert_eq(info.host_memory, 1);
    cr_assert_gt(info.compute_units, 0);
    expect_msg(dev, moetune_device_add_db(dev, "/nonexistent/tuned.db"), MOETUNE_E_NOT_FOUND,
               "/nonexistent/tuned.db");
    cr_assert_eq(moetune_device_db_count(dev), 0);
    /* A file that is not a database is refused and left alone. */
    char path[512];
    int fd = tmp_file_make(path, sizeof path, "api_notdb");
    cr_assert_eq(write(fd, "hello, not sqlite", 17), 17);
    close(fd);
    expect_msg(dev, moetune_device_add_db(dev, path), MOETUNE_E_FORMAT, path);
    cr_assert_eq(moetune_device_db_count(dev), 0);
    cr_assert_eq(moetune_device_synchronize(dev), MOETUNE_OK);
    cr_assert_str_eq(moetune_errmsg(dev), "", "a success clears the message");
    moetune_device_close(dev);
}

/* Case i of a bad description: mutates d and returns the field the
 * message must name, NULL past the last. */
static const char *bad_desc(int i, moetune_moe_desc *d)
{
    switch (i) {
    case 0: d->hidden = 100; return "desc.hidden";
    case 1: d->inter = 0; return "desc.inter";
    case 2: d->experts = 1; return "desc.experts";
    case 3: d->topk = 40; return "desc.topk";
    case 4: d->n_group = 3; return "desc.n_group";
    case 5: d->n_group = 4, d->topk_group = 5; return "desc.topk_group";
    case 6: d->routed_scale = -1.0f; return "desc.routed_scale";
    case 7: d->act = (moetune_act)7; return "desc.act";
    case 8: d->routing = MOETUNE_ROUTE_COUNT; return "desc.routing";
    case 9: d->max_tokens = 0; return "desc.max_tokens";
    case 10: d->shared_inter = 100; return "desc.shared_inter";
    case 11: d->weight_type = (moetune_weight_type)3; return "desc.weight_type";
    case 12: d->norm_topk = 2; return "desc.norm_topk";
    default: return NULL;
    }
}

Test(api_errors, bad_descriptions_are_named)
{
    api_layer l;
    api_layer_make(&l, MOETUNE_ACT_A16W4, 1, 3);
    moetune_device *dev = open_cpu();
    moetune_moe *moe = NULL;
    moetune_moe_desc d;
    memset(&d, 0, sizeof d);
    expect_msg(dev, moetune_moe_create(dev, &d, &l.mw, &moe), MOETUNE_E_MISUSE,
               "moetune_moe_desc_init");
    const char *field;
    for (int i = 0; api_layer_desc(&l, MOETUNE_ACT_A16W4, MOETUNE_ROUTE_GATE, 8, &d),
                    (field = bad_desc(i, &d)) != NULL;
         i++) {
        expect_msg(dev, moetune_moe_create(dev, &d, &l.mw, &moe), MOETUNE_E_INVALID, field);
        cr_assert_null(moe);
    }
    cr_assert_eq(moetune_moe_create(dev, NULL, &l.mw, &moe), MOETUNE_E_MISUSE);
    moetune_device_close(dev);
    api_layer_free(&l);
}

Test(api_errors, bad_weights_are_named)
{
    api_layer l;
    api_layer_make(&l, MOETUNE_ACT_A16W4, 1, 4);
    moetune_device *dev = open_cpu();
    moetune_moe *moe = NULL;
    moetune_moe_desc d;
    api_layer_desc(&l, MOETUNE_ACT_A16W4, MOETUNE_ROUTE_GATE, 8, &d);
    moetune_moe_weights w = l.mw;
    w.w2 = NULL;
    expect_msg(dev, moetune_moe_create(dev, &d, &w, &moe), MOETUNE_E_INVALID, "w2 is NULL");
    w = l.mw;
    w.gate = NULL;
    expect_msg(dev, moetune_moe_create(dev, &d, &w, &moe), MOETUNE_E_INVALID, "gate is NULL");
    w = l.mw;
    w.s13 = (const uint8_t *)l.mw.s13 + 1;
    expect_msg(dev, moetune_moe_create(dev, &d, &w, &moe), MOETUNE_E_INVALID,
               "s13 (");
    /* A shared expert's weights without a shared expert. */
    d.shared_inter = 0;
    expect_msg(dev, moetune_moe_create(dev, &d, &l.mw, &moe), MOETUNE_E_INVALID, "shared_w13");
    cr_assert_null(moe);
    /* Top-k routing ignores the router's weight and bias. */
    api_layer_desc(&l, MOETUNE_ACT_A16W4, MOETUNE_ROUTE_TOPK, 8, &d);
    cr_assert_eq(moetune_moe_create(dev, &d, &l.mw, &moe), MOETUNE_OK, "%s", moetune_errmsg(dev));
    cr_assert_str_eq(moetune_errmsg(dev), "");
    moetune_moe_destroy(moe);
    moetune_device_close(dev);
    api_layer_free(&l);
}

Test(api_errors, bad_runs_are_named)
{
    api_layer l;
    api_layer_make(&l, MOETUNE_ACT_A16W4, 1, 5);
    moetune_device *dev = open_cpu();
    moetune_moe *moe = NULL;
    moetune_moe_desc d;
    api_layer_desc(&l, MOETUNE_ACT_A16W4, MOETUNE_ROUTE_LOGITS, 4, &d);
    cr_assert_eq(moetune_moe_create(dev, &d, &l.mw, &moe), MOETUNE_OK, "%s", moetune_errmsg(dev));
    const int64_t H = l.d.hidden, K = l.d.topk;
    uint16_t *x = api_input(4, H, 1);
    float *y = api_alloc((size_t)(4 * H) * 4 + 64);
    int32_t ids[16] __attribute__((aligned(16))) = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    float tw[16] __attribute__((aligned(16)));
    for (int i = 0; i < 16; i++)
        tw[i] = 0.25f;
    expect_msg(dev, moetune_moe_run(moe, x, 1, y, NULL), MOETUNE_E_MISUSE, "ROUTE_LOGITS");
    expect_msg(dev, moetune_moe_run_logits(moe, x, NULL, 1, y, NULL), MOETUNE_E_INVALID,
               "logits");
    expect_msg(dev, moetune_moe_run_topk(moe, x, ids, tw, 5, y, NULL), MOETUNE_E_INVALID,
               "max_tokens");
    expect_msg(dev, moetune_moe_run_topk(moe, x, ids, tw, -1, y, NULL), MOETUNE_E_INVALID,
               "m = -1");
    expect_msg(dev, moetune_moe_run_topk(moe, x, ids, tw, 1, y, (void *)16), MOETUNE_E_UNSUPPORTED,
               "stream");
    expect_msg(dev, moetune_moe_run_topk(moe, x, ids, tw, 1, y + 1, NULL), MOETUNE_E_INVALID,
               "y (");
    expect_msg(dev, moetune_moe_run_topk(moe, NULL, ids, tw, 1, y, NULL), MOETUNE_E_INVALID,
               "x is NULL");
    ids[K + 2] = 16; /* token 1, slot 2: not an expert */
    expect_msg(dev, moetune_moe_run_topk(moe, x, ids, tw, 4, y, NULL), MOETUNE_E_INVALID,
               "topk_ids[1][2] = 16");
    ids[K + 2] = 6;
    cr_assert_eq(moetune_moe_run_topk(moe, x, ids, tw, 4, y, NULL), MOETUNE_OK, "%s",
                 moetune_errmsg(dev));
    cr_assert_str_eq(moetune_errmsg(dev), "");
    moetune_selection s;
    expect_msg(dev, moetune_moe_selection(moe, 9999, &s), MOETUNE_E_INVALID, "9999");
    free(x);
    free(y);
    moetune_moe_destroy(moe);
    moetune_device_close(dev);
    api_layer_free(&l);
}
