/* test_api_select.c: what a layer of the public API picks from layered
 * databases, and what layers share:
 *   - a kernel takes its configs from the first database that has an entry
 *     for it by the runtime's rules (tuned at that M or the nearest M, then
 *     another device of the same arch), else runs its default, reported
 *     stale or missed; the order of the databases decides; the databases
 *     are read only (no miss is written); the picked configs run and the
 *     layer still matches the reference;
 *   - layers of one description share their kernels; a larger layer grows
 *     the shared workspace under the smaller one, which keeps working;
 *   - a device closed before its layers lives until the last is destroyed. */
#include "api_test_util.h"

#include "db/db.h"
#include "db/db_testing.h"
#include "device/device.h"
#include "kernels/core/kern_db.h"
#include "test_tmp.h"

enum { MAXM = 64, NBUCKETS = 9 }; /* buckets 1 .. 64 */
static const int64_t buckets[NBUCKETS] = {1, 2, 4, 8, 16, 24, 32, 48, 64};

/* The canonical tuning key of a kernel of the layer, as the library has
 * it: the runtime's dims for the description on cpu (moe_layer_keys). */
static void key_of(const api_layer *l, const char *family, const char *raw, char *out)
{
    const kern_family *f = kern_family_find(family);
    kern_shape s;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_shape_parse(f, raw, &s, NULL, &err), MT_OK, "%s", err.msg);
    kern_shape_key(f, &s, false, out, KERN_KEY_MAX);
    (void)l;
}

/* The n-th config of family's cpu space (n >= 1 skips the default) valid
 * at every bucket, as key and JSON. */
static void valid_config(const char *family, const char *key, const dev_props *p, int n,
                         char *ck, char *cj)
{
    const kern_family *f = kern_family_find(family);
    const kern_impl *im = kern_family_impl(f, DEV_BACKEND_CPU);
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, key, &s, NULL, NULL), MT_OK);
    kern_config dflt, c;
    im->default_config(&s, 1, p, &dflt);
    char dk[256];
    kern_config_key(im, &dflt, dk, sizeof dk);
    uint64_t size = kern_space_size(im);
    for (uint64_t i = 0; i < size; i++) {
        kern_space_point(im, i, &c);
        kern_config_key(im, &c, ck, 256);
        bool ok = strcmp(ck, dk) != 0;
        char why[160];
        for (int b = 0; b < NBUCKETS && ok; b++)
            ok = kern_config_valid(f, im, &s, buckets[b], &c, p, why, sizeof why);
        if (ok && --n == 0) {
            kern_config_json(im, &c, cj, 1024);
            return;
        }
    }
    cr_assert_fail("%s %s: not enough valid configs", family, key);
}

static void put(db_t *db, const db_device *dev, const char *family, const char *hash,
                const char *key, int64_t m, const char *ck, const char *cj)
{
    mt_err err = MT_ERR_INIT;
    int64_t did, kid;
    const kern_family *f = kern_family_find(family);
    cr_assert_eq(db_device_upsert(db, dev, &did, &err), MT_OK, "%s", err.msg);
    db_kernel k = {.family = family, .version = f->version, .source_hash = hash};
    cr_assert_eq(db_kernel_upsert(db, &k, &kid, &err), MT_OK, "%s", err.msg);
    db_winner w = {.device_id = did, .kernel_id = kid, .shape_key = key, .m = m,
                   .config_key = ck, .config_json = cj, .time_ms = 0.01};
    cr_assert_eq(db_winner_set(db, &w, &err), MT_OK, "%s", err.msg);
}

static int count_miss(void *ctx, const db_miss_row *row)
{
    (void)row;
    (*(int *)ctx)++;
    return 0;
}

static int misses(const char *path)
{
    db_t *db = NULL;
    mt_err err = MT_ERR_INIT;
    int n = 0;
    cr_assert_eq(db_open(path, DB_OPEN_READONLY, &db, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(db_misses_each(db, NULL, count_miss, &n, &err), MT_OK, "%s", err.msg);
    db_close(db);
    return n;
}

/* The layer's selection of kernel `use` at bucket m. */
static moetune_selection sel_of(const moetune_moe *moe, const char *use, int64_t m)
{
    moetune_selection s;
    for (int i = 0; i < moetune_moe_selection_count(moe); i++) {
        cr_assert_eq(moetune_moe_selection(moe, i, &s), MOETUNE_OK);
        if (!strcmp(s.use, use) && s.m == m)
            return s;
    }
    cr_assert_fail("no selection of %s at M=%lld", use, (long long)m);
    return s;
}

static moetune_moe *layer_on(const api_layer *l, const char *db1, const char *db2,
                             moetune_device **dev)
{
    cr_assert_eq(moetune_device_open("cpu", dev), MOETUNE_OK, "%s", moetune_errmsg(*dev));
    cr_assert_eq(moetune_device_add_db(*dev, db1), MOETUNE_OK, "%s", moetune_errmsg(*dev));
    cr_assert_eq(moetune_device_add_db(*dev, db2), MOETUNE_OK, "%s", moetune_errmsg(*dev));
    cr_assert_eq(moetune_device_db_count(*dev), 2);
    moetune_moe_desc d;
    api_layer_desc(l, MOETUNE_ACT_A16W4, MOETUNE_ROUTE_GATE, MAXM, &d);
    moetune_moe *moe = NULL;
    cr_assert_eq(moetune_moe_create(*dev, &d, &l->mw, &moe), MOETUNE_OK, "%s",
                 moetune_errmsg(*dev));
    return moe;
}

static void expect_matches_reference(const api_layer *l, moetune_moe *moe, moetune_device *dev)
{
    const int64_t M = 24, H = l->d.hidden;
    uint16_t *x = api_input(M, H, 77);
    float *want = malloc((size_t)(M * H) * 4), *got = api_alloc((size_t)(M * H) * 4);
    moe_host_weights hw = layer_host_weights(&l->w);
    moe_reference(&l->d, &hw, x, M, want, NULL, NULL);
    cr_assert_eq(moetune_moe_run(moe, x, M, got, NULL), MOETUNE_OK, "%s", moetune_errmsg(dev));
    bool skip[M];
    for (int64_t t = 0; t < M; t++)
        skip[t] = api_near_tie(l, x + t * H);
    cr_expect_eq(api_first_off(got, want, M, H, skip), -1);
    free(x);
    free(want);
    free(got);
}

Test(api_select, layered_databases_first_entry_wins, .timeout = 600)
{
    api_layer l;
    api_layer_make(&l, MOETUNE_ACT_A16W4, 1, 11);
    moe_dims dm = l.d;
    dm.bm = 128;
    dm.wl = 1; /* the cpu layout the library gives the runtime */
    moe_keys raw;
    moe_layer_keys(&dm, &raw);
    char up[KERN_KEY_MAX], down[KERN_KEY_MAX], comb[KERN_KEY_MAX];
    key_of(&l, "moe_gemm_up", raw.up, up);
    key_of(&l, "moe_gemm_down", raw.down, down);
    key_of(&l, "moe_combine", raw.combine, comb);

    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu", NULL, &d, &err), MT_OK, "%s", err.msg);
    const dev_props *p = dev_get_props(d);
    db_device me, other;
    kern_db_device(p, &me);
    other = me;
    other.name = "another cpu model";
    other.fingerprint = NULL;
    char hup[65], hdown[65], cka[256], cja[1024], ckb[256], cjb[1024], ckc[256], cjc[1024];
    kern_source_hash(kern_family_find("moe_gemm_up"), DEV_BACKEND_CPU, hup);
    kern_source_hash(kern_family_find("moe_gemm_down"), DEV_BACKEND_CPU, hdown);
    valid_config("moe_gemm_up", up, p, 1, cka, cja);
    valid_config("moe_gemm_up", up, p, 2, ckb, cjb);
    valid_config("moe_gemm_down", down, p, 1, ckc, cjc);

    char dir[512], user[600], shipped[600];
    tmp_dir_make(dir, sizeof dir, "api_select");
    snprintf(user, sizeof user, "%s/user.db", dir);
    snprintf(shipped, sizeof shipped, "%s/shipped.db", dir);
    db_t *db = NULL;
    /* The user's: up tuned at M=1 (config A); combine only for an old source. */
    cr_assert_eq(db_open(user, DB_OPEN_DEFAULT, &db, &err), MT_OK, "%s", err.msg);
    put(db, &me, "moe_gemm_up", hup, up, 1, cka, cja);
    put(db, &me, "moe_combine", "00000000000000000000000000000000000000000000000000000000deadbeef",
        comb, 1, "CH=1024", "{\"CH\":1024}");
    db_close(db);
    /* The shipped one: up tuned at M=4 (config B); down on another cpu model. */
    cr_assert_eq(db_open(shipped, DB_OPEN_DEFAULT, &db, &err), MT_OK, "%s", err.msg);
    put(db, &me, "moe_gemm_up", hup, up, 4, ckb, cjb);
    put(db, &other, "moe_gemm_down", hdown, down, 8, ckc, cjc);
    db_close(db);
    dev_close(d);

    moetune_device *dev = NULL;
    moetune_moe *moe = layer_on(&l, user, shipped, &dev);
    cr_assert_eq(moetune_moe_selection_count(moe), 8 * NBUCKETS);
    moetune_selection s = sel_of(moe, "experts up", 1);
    cr_expect_eq(s.source, MOETUNE_SOURCE_TUNED);
    cr_expect_str_eq(s.config, cka);
    cr_expect_str_eq(s.db, user);
    s = sel_of(moe, "experts up", 64);
    cr_expect_eq(s.source, MOETUNE_SOURCE_NEAREST);
    cr_expect_eq(s.tuned_m, 1);
    cr_expect_str_eq(s.config, cka);
    s = sel_of(moe, "experts down", 2);
    cr_expect_eq(s.source, MOETUNE_SOURCE_OTHER_DEVICE);
    cr_expect_eq(s.tuned_m, 8);
    cr_expect_str_eq(s.config, ckc);
    cr_expect_str_eq(s.db, shipped);
    cr_expect(strstr(s.note, "another cpu model"), "%s", s.note);
    s = sel_of(moe, "combine", 16);
    cr_expect_eq(s.source, MOETUNE_SOURCE_STALE);
    cr_expect(s.is_default && !s.db && strstr(s.note, "00000000"), "%s", s.note);
    s = sel_of(moe, "router", 1);
    cr_expect_eq(s.source, MOETUNE_SOURCE_MISS);
    cr_expect(s.is_default && s.tuned_m == 0 && !s.db);
    const char *rep = moetune_moe_report(moe);
    cr_expect(strstr(rep, "summary: 72 selections: 1 tuned, 8 nearest, 9 other device, 9 stale, "
                          "54 default (45 missed, 0 rejected)"), "%s", rep);
    cr_expect(strstr(rep, user) && strstr(rep, shipped), "%s", rep);
    expect_matches_reference(&l, moe, dev);
    moetune_moe_destroy(moe);
    moetune_device_close(dev);

    /* The other order: the shipped database's up wins. */
    moe = layer_on(&l, shipped, user, &dev);
    s = sel_of(moe, "experts up", 4);
    cr_expect_eq(s.source, MOETUNE_SOURCE_TUNED);
    cr_expect_str_eq(s.config, ckb);
    cr_expect_str_eq(s.db, shipped);
    s = sel_of(moe, "experts up", 1);
    cr_expect_eq(s.source, MOETUNE_SOURCE_NEAREST);
    cr_expect_eq(s.tuned_m, 4);
    expect_matches_reference(&l, moe, dev);
    moetune_moe_destroy(moe);
    moetune_device_close(dev);

    cr_expect_eq(misses(user), 0, "a read-only database got misses written");
    cr_expect_eq(misses(shipped), 0, "a read-only database got misses written");
    api_layer_free(&l);
}

Test(api_select, layers_share_kernels_and_a_growing_workspace)
{
    api_layer l;
    api_layer_make(&l, MOETUNE_ACT_A16W4, 1, 12);
    moetune_device *dev = NULL;
    cr_assert_eq(moetune_device_open("cpu", &dev), MOETUNE_OK, "%s", moetune_errmsg(dev));
    moetune_moe_desc d;
    api_layer_desc(&l, MOETUNE_ACT_A16W4, MOETUNE_ROUTE_GATE, 8, &d);
    moetune_moe *a = NULL, *b = NULL, *c = NULL;
    cr_assert_eq(moetune_moe_create(dev, &d, &l.mw, &a), MOETUNE_OK, "%s", moetune_errmsg(dev));
    cr_assert_eq(moetune_moe_create(dev, &d, &l.mw, &b), MOETUNE_OK, "%s", moetune_errmsg(dev));
    cr_assert_eq(moetune_moe_report(a), moetune_moe_report(b), "one description, one bundle");
    d.max_tokens = MAXM;
    cr_assert_eq(moetune_moe_create(dev, &d, &l.mw, &c), MOETUNE_OK, "%s", moetune_errmsg(dev));
    cr_assert_neq(moetune_moe_report(a), moetune_moe_report(c));
    cr_assert_eq(moetune_moe_selection_count(c), 8 * NBUCKETS);
    cr_assert_eq(moetune_moe_selection_count(a), 8 * 4); /* buckets 1, 2, 4, 8 */
    /* The device goes first; the layers keep it. */
    moetune_device_close(dev);
    const int64_t H = l.d.hidden, M = 8;
    uint16_t *x = api_input(M, H, 5);
    float *want = malloc((size_t)(MAXM * H) * 4), *got = api_alloc((size_t)(MAXM * H) * 4);
    moe_host_weights hw = layer_host_weights(&l.w);
    moe_reference(&l.d, &hw, x, M, want, NULL, NULL);
    bool skip[8];
    for (int64_t t = 0; t < M; t++)
        skip[t] = api_near_tie(&l, x + t * H);
    moetune_moe *all[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        memset(got, 0xff, (size_t)(M * H) * 4);
        cr_assert_eq(moetune_moe_run(all[i], x, M, got, NULL), MOETUNE_OK);
        cr_expect_eq(api_first_off(got, want, M, H, skip), -1, "layer %d", i);
    }
    moetune_moe_destroy(b);
    moetune_moe_destroy(c);
    cr_assert_eq(moetune_moe_run(a, x, M, got, NULL), MOETUNE_OK);
    cr_expect_eq(api_first_off(got, want, M, H, skip), -1);
    moetune_moe_destroy(a); /* frees the device */
    free(x);
    free(want);
    free(got);
    api_layer_free(&l);
}
