/* test_db_merge.c: merge conflict rule and provenance, export -> import
 * round trip, import of bad files, gc of stale source hashes. */
#include "test_db_util.h"

#include <cjson/cJSON.h>

static char dir[64], pa[128], pb[128], pc[128];

static void setup(void)
{
    tmp_dir(dir, sizeof dir);
    snprintf(pa, sizeof pa, "%s/a.db", dir);
    snprintf(pb, sizeof pb, "%s/b.db", dir);
    snprintf(pc, sizeof pc, "%s/c.db", dir);
}
static void teardown(void) { rm_tree(dir); }

TestSuite(db_merge, .init = setup, .fini = teardown);
TestSuite(db_export, .init = setup, .fini = teardown);
TestSuite(db_gc, .init = setup, .fini = teardown);

/* ---- merge --------------------------------------------------------------- */

enum { NKEYS = 60 };

typedef struct side {
    bool present;
    db_trial_status status;
    double median;
} side;

typedef struct got {
    db_trial_status status[NKEYS];
    double median[NKEYS];
    bool from_b[NKEYS], seen[NKEYS];
} got;

static int collect(void *ctx, const db_trial_row *r)
{
    got *g = ctx;
    int i = atoi(r->t.config_key + 2);
    g->seen[i] = true;
    g->status[i] = r->t.status;
    g->median[i] = r->t.time_median_ms;
    g->from_b[i] = r->origin && strstr(r->origin, "b.db");
    return 0;
}

static void fill(const char *p, const side *s, char keys[][16], int64_t miss_times)
{
    db_t *db = open_ok(p, DB_OPEN_DEFAULT);
    db_device d = dev_mi210();
    int64_t dv = device_id(db, &d), k = kernel_id(db, "moe_gemm", 1, HASH_A);
    for (int i = 0; i < NKEYS; i++) {
        if (!s[i].present)
            continue;
        db_trial t = ok_trial(dv, k, SHAPE_A, 16, keys[i], "{}", s[i].median);
        t.status = s[i].status;
        if (t.status != DB_TRIAL_OK)
            t.error = "failed";
        insert_ok(db, &t);
    }
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_winners_recompute(db, 0, 0, NULL, 0, NULL, &e), MT_OK, "%s", e.msg);
    for (int64_t i = 0; i < miss_times; i++)
        cr_assert_eq(db_miss_record(db, &d, "moe_gemm", SHAPE_A, 4096, &e), MT_OK);
    db_close(db);
}

Test(db_merge, faster_verified_result_wins_and_provenance_is_kept)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    side a[NKEYS], b[NKEYS];
    char keys[NKEYS][16];
    for (int i = 0; i < NKEYS; i++) {
        snprintf(keys[i], sizeof keys[i], "K=%d", i);
        side *s[2] = {&a[i], &b[i]};
        for (int j = 0; j < 2; j++) {
            s[j]->present = mt_rng_below(&rng, 4) != 0;
            s[j]->status = mt_rng_below(&rng, 3) ? DB_TRIAL_OK
                                                 : (db_trial_status)(1 + mt_rng_below(&rng, 6));
            s[j]->median = 0.01 + mt_rng_uniform(&rng, 0.0f, 1.0f);
        }
        if (i % 10 == 0) /* exact ties keep the destination */
            b[i] = a[i];
    }
    fill(pa, a, keys, 2);
    fill(pb, b, keys, 3);
    size_t nb0, nb1;
    char *b_before = slurp(pb, &nb0);

    /* Reference rule, written independently of the implementation. */
    db_merge_stats want = {0};
    side expect[NKEYS];
    bool expect_b[NKEYS];
    for (int i = 0; i < NKEYS; i++) {
        expect[i] = a[i];
        expect_b[i] = false;
        if (!b[i].present) {
            continue;
        } else if (!a[i].present) {
            want.trials_added++;
        } else if (b[i].status == DB_TRIAL_OK &&
                   (a[i].status != DB_TRIAL_OK || b[i].median < a[i].median)) {
            want.trials_replaced++;
        } else {
            want.trials_kept++;
            continue;
        }
        expect[i] = b[i];
        expect_b[i] = true;
    }

    db_t *db = open_ok(pa, DB_OPEN_DEFAULT);
    db_merge_stats ms;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_merge(db, pb, &ms, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(ms.trials_added, want.trials_added, "seed %llu", (unsigned long long)seed);
    cr_expect_eq(ms.trials_replaced, want.trials_replaced, "seed %llu", (unsigned long long)seed);
    cr_expect_eq(ms.trials_kept, want.trials_kept, "seed %llu", (unsigned long long)seed);
    got g = {0};
    cr_assert_eq(db_trials_each(db, NULL, collect, &g, &e), MT_OK);
    for (int i = 0; i < NKEYS; i++) {
        cr_assert_eq(g.seen[i], expect[i].present, "seed %llu key %d", (unsigned long long)seed, i);
        if (!expect[i].present)
            continue;
        cr_expect_eq(g.status[i], expect[i].status, "seed %llu key %d", (unsigned long long)seed, i);
        cr_expect_float_eq(g.median[i], (double)expect[i].median, 1e-12, "key %d", i);
        cr_expect_eq(g.from_b[i], expect_b[i], "seed %llu key %d origin",
                     (unsigned long long)seed, i);
    }

    /* The winner is the fastest ok trial of the merged set. */
    double best = INFINITY;
    int best_i = -1;
    for (int i = 0; i < NKEYS; i++)
        if (expect[i].present && expect[i].status == DB_TRIAL_OK && expect[i].median < best) {
            best = expect[i].median;
            best_i = i;
        }
    if (best_i >= 0) {
        db_device d = dev_mi210();
        db_lookup_result r;
        cr_assert_eq(db_lookup(db, &d, "moe_gemm", 1, HASH_A, SHAPE_A, 16, &r, &e), MT_OK);
        cr_expect_str_eq(r.config_key, keys[best_i], "seed %llu", (unsigned long long)seed);
    }
    /* Miss counts add up. */
    cr_expect_eq(sql_int(pa, "SELECT count FROM misses WHERE m = 4096"), 5);
    db_close(db);

    char *b_after = slurp(pb, &nb1);
    cr_expect(nb0 == nb1 && !memcmp(b_before, b_after, nb0), "merge source was modified");
    free(b_before);
    free(b_after);
    cr_expect(strstr(db_merge_rule(), "faster") && strstr(db_merge_rule(), "ok"));
}

/* A miss recorded as the runtime records it, with the shape it ran
 * (runtime dims included; NULL: none). */
static void run_miss(db_t *db, const db_device *d, int64_t m, const char *shape_run)
{
    db_lookup_result r;
    memset(&r, 0, sizeof r);
    r.provenance = DB_MISS;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_lookup_record_miss(db, d, "moe_gemm", SHAPE_A, shape_run, m, &r, &e), MT_OK,
                 "%s", e.msg);
    cr_assert(r.miss_recorded);
}

/* The runtime shape of a miss: a record without one keeps the row's, a
 * later one replaces it, an earlier one does not, one where the row has
 * none fills it; counts add up as before. */
Test(db_merge, a_miss_keeps_the_latest_runtime_shape)
{
    db_device d = dev_mi210();
    db_t *b = open_ok(pb, DB_OPEN_DEFAULT);
    run_miss(b, &d, 1, SHAPE_A ",C=100");  /* b first: earlier */
    run_miss(b, &d, 2, SHAPE_A ",C=200");
    run_miss(b, &d, 3, NULL);
    db_close(b);
    usleep(3000);
    db_t *a = open_ok(pa, DB_OPEN_DEFAULT);
    run_miss(a, &d, 1, NULL);              /* none: b's fills it */
    run_miss(a, &d, 2, SHAPE_A ",C=222");  /* later than b's: kept */
    run_miss(a, &d, 3, SHAPE_A ",C=333");  /* b has none: kept */
    run_miss(a, &d, 3, NULL);              /* a record without one keeps it */
    cr_expect_eq(sql_int(pa, "SELECT count(*) FROM misses WHERE m = 3 AND shape_run = '"
                             SHAPE_A ",C=333'"), 1);
    db_merge_stats ms;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_merge(a, pb, &ms, &e), MT_OK, "%s", e.msg);
    db_close(a);
    cr_expect_eq(sql_int(pa, "SELECT count(*) FROM misses WHERE m = 1 AND count = 2 AND "
                             "shape_run = '" SHAPE_A ",C=100'"), 1);
    cr_expect_eq(sql_int(pa, "SELECT count(*) FROM misses WHERE m = 2 AND count = 2 AND "
                             "shape_run = '" SHAPE_A ",C=222'"), 1);
    cr_expect_eq(sql_int(pa, "SELECT count(*) FROM misses WHERE m = 3 AND count = 3 AND "
                             "shape_run = '" SHAPE_A ",C=333'"), 1);
    /* and b, merged the other way, takes a's later ones */
    b = open_ok(pb, DB_OPEN_DEFAULT);
    cr_assert_eq(db_merge(b, pa, &ms, &e), MT_OK, "%s", e.msg);
    db_close(b);
    cr_expect_eq(sql_int(pb, "SELECT count(*) FROM misses WHERE m = 2 AND "
                             "shape_run = '" SHAPE_A ",C=222'"), 1);
    cr_expect_eq(sql_int(pb, "SELECT count(*) FROM misses WHERE m = 3 AND "
                             "shape_run = '" SHAPE_A ",C=333'"), 1);
}

Test(db_merge, sessions_keep_uid_and_gain_origin)
{
    db_t *b = open_ok(pb, DB_OPEN_DEFAULT);
    char *argv[] = {"moetune", "tune"};
    db_session_info info = {2, argv, "moetune " MOETUNE_VERSION, "shard-3", "random", "500 trials"};
    int64_t sid;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_session_begin(b, &info, &sid, &e), MT_OK);
    db_device d = dev_mi210();
    db_trial t = ok_trial(device_id(b, &d), kernel_id(b, "moe_gemm", 1, HASH_A), SHAPE_A, 2,
                          "BM=2", "{}", 0.2);
    t.session_id = sid;
    insert_ok(b, &t);
    db_close(b);
    db_t *a = open_ok(pa, DB_OPEN_DEFAULT);
    db_merge_stats ms;
    cr_assert_eq(db_merge(a, pb, &ms, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(ms.sessions_added, 1);
    cr_expect_eq(ms.devices_added, 1);
    db_close(a);
    cr_expect_eq(sql_int(pa, "SELECT count(*) FROM sessions WHERE host = 'shard-3' AND origin "
                             "LIKE '%b.db (db %'"),
                 1);
    cr_expect_eq(sql_int(pa, "SELECT count(*) FROM trials t JOIN sessions s ON s.id = "
                             "t.session_id WHERE s.host = 'shard-3'"),
                 1);
    /* Merging again adds nothing. */
    a = open_ok(pa, DB_OPEN_DEFAULT);
    cr_assert_eq(db_merge(a, pb, &ms, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(ms.sessions_added + ms.trials_added + ms.trials_replaced, 0);
    cr_expect_eq(ms.trials_kept, 1);
    cr_expect_eq(db_merge(a, pa, &ms, &e), MT_E_INVALID, "merged into itself");
    db_close(a);
}

/* ---- export / import ----------------------------------------------------- */

typedef struct first_winner {
    int n;
    int64_t dev[2], ker[2], m[2];
    char key[2][64], shape[2][64];
} first_winner;

static int first_winner_cb(void *ctx, const db_winner_row *w)
{
    first_winner *f = ctx;
    if (f->n >= 2)
        return 1;
    f->dev[f->n] = w->device_id;
    f->ker[f->n] = w->kernel_id;
    f->m[f->n] = w->m;
    snprintf(f->key[f->n], sizeof f->key[0], "%s", w->config_key);
    snprintf(f->shape[f->n], sizeof f->shape[0], "%s", w->shape_key);
    f->n++;
    return 0;
}

static void populate(const char *p, uint64_t seed)
{
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    db_t *db = open_ok(p, DB_OPEN_DEFAULT);
    db_device d1 = dev_mi210(), d2 = dev_mi250();
    int64_t dv[2] = {device_id(db, &d1), device_id(db, &d2)};
    int64_t kr[2] = {kernel_id(db, "moe_gemm", 1, HASH_A), kernel_id(db, "rms\"norm", 3, HASH_B)};
    char *argv[] = {"moetune", "tune", "--shape", "H=256 \"quoted\" \xc3\xa9\\"};
    db_session_info info = {4, argv, "moetune " MOETUNE_VERSION, "host\twith\ttabs", "exhaustive", ""};
    int64_t sid;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_session_begin(db, &info, &sid, &e), MT_OK);
    char keys[200][32], json[200][64];
    for (int i = 0; i < 200; i++) {
        snprintf(keys[i], sizeof keys[i], "BM=%d,BN=%d", 16 << (i % 3), i);
        snprintf(json[i], sizeof json[i], "{\"BM\":%d,\"BN\":%d,\"s\":\"a\\\"b\"}", 16 << (i % 3), i);
        double t = 0.001 + mt_rng_uniform(&rng, 0.0f, 3.0f) / 3.0;
        db_trial tr = ok_trial(dv[i % 2], kr[(i / 2) % 2], i % 3 ? SHAPE_A : "N=4096,a=bf16",
                               1 + (int64_t)mt_rng_below(&rng, 4096), keys[i], json[i], t);
        tr.session_id = i % 4 ? sid : 0;
        tr.time_p10_ms = NAN;
        tr.gflops = 1.0 / 3.0 * (double)i;
        tr.resources_json = i % 2 ? "{\"vgprs\":64,\"lds\":16384}" : NULL;
        tr.created_ms = 1760000000000 + (int64_t)mt_rng_below(&rng, 1000000);
        if (i % 7 == 0) {
            tr.status = (db_trial_status)(1 + i % 6);
            tr.error = "line one\nline \"two\"\t\xe2\x9c\x93";
            tr.time_median_ms = NAN;
            tr.repetitions = 0;
        }
        insert_ok(db, &tr);
    }
    cr_assert_eq(db_winners_recompute(db, 0, 0, NULL, 0, NULL, &e), MT_OK, "%s", e.msg);
    cr_assert_eq(db_winner_mark_verified(db, dv[0], kr[0], SHAPE_A,
                                         sql_int(p, "SELECT m FROM winners WHERE shape = '" SHAPE_A
                                                    "' AND device_id = 1 AND kernel_id = 1 LIMIT 1"),
                                         0.123456789, &e),
                 MT_OK, "%s", e.msg);
    cr_assert_eq(db_miss_record(db, &d2, "moe_gemm", SHAPE_A, 3, &e), MT_OK);
    run_miss(db, &d2, 5, SHAPE_A ",C=4096"); /* with its runtime shape */
    cr_assert_eq(db_code_put(db, "gfx90a", "k", "\x7f" "ELF", 4, &e), MT_OK);
    /* Decisions with and without an interval travel too. */
    first_winner fw = {0};
    cr_assert_eq(db_winners_each(db, NULL, first_winner_cb, &fw, &e), MT_OK, "%s", e.msg);
    cr_assert_gt(fw.n, 1);
    db_confirm c = {.decision = DB_DECIDED_CONFIRMED, .challenger_key = fw.key[0],
                    .ratio = 1.0 / 3.0, .ratio_lo = 0.3, .ratio_hi = 0.37, .confidence = 0.95,
                    .rounds = 10};
    cr_assert_eq(db_winner_decide(db, fw.dev[0], fw.ker[0], fw.shape[0], fw.m[0], fw.key[0], &c,
                                  &e), MT_OK, "%s", e.msg);
    db_confirm best = {.decision = DB_DECIDED_DEFAULT_BEST};
    cr_assert_eq(db_winner_decide(db, fw.dev[1], fw.ker[1], fw.shape[1], fw.m[1], fw.key[1],
                                  &best, &e), MT_OK, "%s", e.msg);
    db_close(db);
}

/* Every record line of an export has its keys in ascending order. */
static void expect_sorted_lines(const char *text, int *records)
{
    *records = 0;
    const char *line = text;
    while (*line) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        if (n > 1 && line[0] == '{' && line[1] == '"') {
            char *buf = strndup(line, n);
            if (buf[n - 1] == ',')
                buf[n - 1] = 0;
            cJSON *o = cJSON_Parse(buf);
            cr_assert(cJSON_IsObject(o), "record line is not one object: %s", buf);
            const char *prev = "";
            for (cJSON *c = o->child; c; c = c->next) {
                cr_expect_gt(strcmp(c->string, prev), 0, "keys out of order: %s", buf);
                prev = c->string;
            }
            cJSON_Delete(o);
            free(buf);
            (*records)++;
        }
        line += n + (nl ? 1 : 0);
    }
}

Test(db_export, round_trip_is_identical)
{
    uint64_t seed = mt_seed_fresh();
    populate(pa, seed);
    db_t *a = open_ok(pa, DB_OPEN_READONLY);
    char *t1 = export_text(a);
    db_stats sa;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_stats_get(a, &sa, &e), MT_OK);
    db_close(a);

    int records;
    expect_sorted_lines(t1, &records);
    cr_expect_eq(records, sa.devices + sa.kernels + sa.sessions + sa.trials + sa.winners + sa.misses);

    char jp[160];
    snprintf(jp, sizeof jp, "%s/a.json", dir);
    write_bytes(jp, t1, strlen(t1));
    db_t *c = open_ok(pc, DB_OPEN_DEFAULT);
    db_merge_stats ms;
    cr_assert_eq(db_import(c, jp, &ms, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(ms.trials_added, sa.trials);
    char *t2 = export_text(c);
    cr_expect_str_eq(t2, t1, "seed %llu: export -> import -> export differs",
                     (unsigned long long)seed);
    /* Importing the same file again keeps everything as it is. */
    cr_assert_eq(db_import(c, jp, &ms, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(ms.trials_added + ms.trials_replaced + ms.winners_added + ms.winners_replaced, 0);
    cr_expect_eq(ms.trials_kept, sa.trials);
    char *t3 = export_text(c);
    cr_expect_eq(strlen(t3), strlen(t2));
    db_close(c);
    /* Misses are counts: a second import added them once more; the
     * runtime shape travels (the one without stays without). */
    cr_expect_eq(sql_int(pc, "SELECT count(*) FROM misses WHERE count = 2"), 2);
    cr_expect_eq(sql_int(pc, "SELECT count(*) FROM misses WHERE m = 5 AND shape_run = '"
                             SHAPE_A ",C=4096'"), 1);
    cr_expect_eq(sql_int(pc, "SELECT count(*) FROM misses WHERE m = 3 AND shape_run IS NULL"),
                 1);
    cr_expect(strstr(t1, "\"shape_run\":\"" SHAPE_A ",C=4096\"") != NULL, "%s", t1);
    free(t1);
    free(t2);
    free(t3);
}

static void expect_import_fails(const char *json, mt_status want, const char *w1, const char *w2)
{
    char jp[160];
    snprintf(jp, sizeof jp, "%s/bad.json", dir);
    write_bytes(jp, json, strlen(json));
    db_t *c = open_ok(pc, DB_OPEN_DEFAULT);
    char *before = export_text(c);
    db_merge_stats ms;
    mt_err e = MT_ERR_INIT;
    cr_expect_eq(db_import(c, jp, &ms, &e), want, "%s", e.msg);
    cr_expect(strstr(e.msg, jp) != NULL, "message does not name the file: %s", e.msg);
    cr_expect(strstr(e.msg, w1) != NULL, "message lacks '%s': %s", w1, e.msg);
    cr_expect(strstr(e.msg, w2) != NULL, "message lacks '%s': %s", w2, e.msg);
    char *after = export_text(c);
    cr_expect_str_eq(after, before, "a failed import changed the database");
    db_close(c);
    free(before);
    free(after);
}

Test(db_export, bad_import_files_change_nothing)
{
    populate(pa, mt_seed_fresh());
    db_t *a = open_ok(pa, DB_OPEN_READONLY);
    char *t = export_text(a);
    db_close(a);
    /* Cut short: a syntax error with its line. */
    char *cut = strndup(t, strlen(t) * 2 / 3);
    expect_import_fails(cut, MT_E_FORMAT, "line", "invalid JSON");
    free(cut);
    /* The second trial loses its config key: everything before it is undone too. */
    char *p = strstr(t, "\"trials\"");
    cr_assert_not_null(p);
    p = strstr(p, "\n{");
    p = strstr(p + 1, "\n{");
    char *k = strstr(p, "\"config_key\"");
    memcpy(k, "\"config_kex\"", 12);
    expect_import_fails(t, MT_E_FORMAT, "trials[1]", "config_key");
    /* A newer format. */
    expect_import_fails("{\"format\":\"moetune-db\",\"format_version\":99}", MT_E_UNSUPPORTED,
                        "newer", "99");
    expect_import_fails("{\"devices\":[]}", MT_E_FORMAT, "not a moetune database export", "format");
    free(t);
}

/* ---- merge of winners with decisions --------------------------------------- */

typedef struct dec_row {
    char key[64], challenger[64];
    db_decision decision;
    double ratio, lo, hi, confidence;
    int rounds;
    bool merged;
} dec_row;

static int dec_cb(void *ctx, const db_winner_row *w)
{
    dec_row *d = ctx;
    snprintf(d->key, sizeof d->key, "%s", w->config_key);
    snprintf(d->challenger, sizeof d->challenger, "%s",
             w->confirm.challenger_key ? w->confirm.challenger_key : "");
    d->decision = w->confirm.decision;
    d->ratio = w->confirm.ratio;
    d->lo = w->confirm.ratio_lo;
    d->hi = w->confirm.ratio_hi;
    d->confidence = w->confirm.confidence;
    d->rounds = w->confirm.rounds;
    d->merged = w->origin != NULL;
    return 0;
}

static dec_row read_dec(const char *p)
{
    dec_row d = {0};
    db_t *db = open_ok(p, DB_OPEN_READONLY);
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_winners_each(db, NULL, dec_cb, &d, &e), MT_OK, "%s", e.msg);
    db_close(db);
    return d;
}

/* One key, configs DEF (default) and X: trials with the given medians, and
 * the winner decided as given (NULL: a plain recompute, decision median). */
static void decided_db(const char *p, double def_ms, double x_ms, const char *winner,
                       const db_confirm *c)
{
    db_t *db = open_ok(p, DB_OPEN_DEFAULT);
    db_device d = dev_mi210();
    int64_t dv = device_id(db, &d), k = kernel_id(db, "moe_gemm", 1, HASH_A);
    db_trial t = ok_trial(dv, k, SHAPE_A, 16, "DEF", "{}", def_ms);
    insert_ok(db, &t);
    t = ok_trial(dv, k, SHAPE_A, 16, "X", "{}", x_ms);
    insert_ok(db, &t);
    mt_err e = MT_ERR_INIT;
    if (c)
        cr_assert_eq(db_winner_decide(db, dv, k, SHAPE_A, 16, winner, c, &e), MT_OK, "%s", e.msg);
    else
        cr_assert_eq(db_winners_recompute(db, 0, 0, NULL, 0, NULL, &e), MT_OK, "%s", e.msg);
    db_close(db);
}

static void merge_into(const char *dst, const char *src)
{
    db_t *db = open_ok(dst, DB_OPEN_DEFAULT);
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_merge(db, src, NULL, &e), MT_OK, "%s", e.msg);
    db_close(db);
}

static const db_confirm kept_x = {.decision = DB_DECIDED_DEFAULT_KEPT, .challenger_key = "X",
                                  .ratio = 1.02, .ratio_lo = 0.96, .ratio_hi = 1.08,
                                  .confidence = 0.95, .rounds = 10};
static const db_confirm confirmed_x = {.decision = DB_DECIDED_CONFIRMED, .challenger_key = "X",
                                       .ratio = 0.8, .ratio_lo = 0.75, .ratio_hi = 0.85,
                                       .confidence = 0.95, .rounds = 12};

/* A confirmed challenger beats a kept default (its guaranteed ratio to the
 * default is below 1), in either merge direction, and its interval comes
 * along; a decided winner beats an undecided faster one; a plain recompute
 * after the merge changes nothing. */
Test(db_merge, decisions_merge_by_guaranteed_ratio_and_keep_their_interval)
{
    decided_db(pa, 1.0, 0.9, "DEF", &kept_x);     /* a: X rejected as noise */
    decided_db(pb, 1.0, 0.95, "X", &confirmed_x); /* b: X confirmed faster */
    merge_into(pa, pb);
    dec_row d = read_dec(pa);
    cr_expect_str_eq(d.key, "X");
    cr_expect_eq(d.decision, DB_DECIDED_CONFIRMED);
    cr_expect_str_eq(d.challenger, "X");
    cr_expect(d.ratio == 0.8 && d.lo == 0.75 && d.hi == 0.85 && d.confidence == 0.95,
              "interval %g [%g, %g] at %g", d.ratio, d.lo, d.hi, d.confidence);
    cr_expect_eq(d.rounds, 12);
    cr_expect(d.merged);

    /* The other direction keeps b's confirmed winner. */
    merge_into(pb, pa);
    d = read_dec(pb);
    cr_expect_str_eq(d.key, "X");
    cr_expect_eq(d.decision, DB_DECIDED_CONFIRMED);
    cr_expect_eq(d.rounds, 12);

    /* An undecided, faster-looking winner does not replace a decision. */
    decided_db(pc, 1.0, 0.5, NULL, NULL);
    cr_expect_eq(read_dec(pc).decision, DB_DECIDED_MEDIAN);
    cr_expect_str_eq(read_dec(pc).key, "X");
    char pd[160];
    snprintf(pd, sizeof pd, "%s/d.db", dir);
    decided_db(pd, 1.0, 1.2, "DEF", &kept_x);
    merge_into(pd, pc);
    d = read_dec(pd);
    cr_expect_str_eq(d.key, "DEF", "an unconfirmed 0.5 ms median replaced a kept default");
    cr_expect_eq(d.decision, DB_DECIDED_DEFAULT_KEPT);
    cr_expect_str_eq(d.challenger, "X");
    cr_expect(d.hi == 1.08);
    /* ... but a decided one replaces an undecided one. */
    merge_into(pc, pd);
    d = read_dec(pc);
    cr_expect_str_eq(d.key, "DEF");
    cr_expect_eq(d.decision, DB_DECIDED_DEFAULT_KEPT);
    cr_expect_eq(d.rounds, 10);

    /* The merged trials (X at 0.5 ms is the lowest median now) do not
     * overturn the decision through a recompute. */
    db_t *db = open_ok(pd, DB_OPEN_DEFAULT);
    mt_err e = MT_ERR_INIT;
    int64_t changed = -1;
    cr_assert_eq(db_winners_recompute(db, 0, 0, NULL, 0, &changed, &e), MT_OK, "%s", e.msg);
    db_close(db);
    cr_expect_eq(changed, 0);
    cr_expect_str_eq(read_dec(pd).key, "DEF");
}

/* Format 1 exports carry no decision: they import as median. */
Test(db_export, format_1_winners_import_as_median)
{
    char jp[160];
    snprintf(jp, sizeof jp, "%s/v1.json", dir);
    const char *json =
        "{\"format\":\"moetune-db\",\"format_version\":1,\"schema_version\":3,\n"
        "\"devices\":[{\"arch\":\"gfx90a\",\"backend\":\"hip\",\"compute_units\":104,"
        "\"driver_version\":\"\",\"fingerprint\":\"fp1\",\"name\":\"MI210\","
        "\"runtime_version\":\"6.0\"}],\n"
        "\"kernels\":[{\"family\":\"moe_gemm\",\"source_hash\":\"" HASH_A "\",\"version\":1}],\n"
        "\"winners\":[{\"config\":\"{}\",\"config_key\":\"X\",\"device\":\"fp1\","
        "\"family\":\"moe_gemm\",\"m\":16,\"origin\":null,\"runner_ups\":\"[]\","
        "\"shape\":\"" SHAPE_A "\",\"source_hash\":\"" HASH_A "\",\"time_ms\":0.5,"
        "\"updated_ms\":1,\"verified_ms\":null,\"verified_time_ms\":null,\"version\":1}]}\n";
    write_bytes(jp, json, strlen(json));
    db_t *db = open_ok(pa, DB_OPEN_DEFAULT);
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_import(db, jp, NULL, &e), MT_OK, "%s", e.msg);
    db_close(db);
    dec_row d = read_dec(pa);
    cr_expect_str_eq(d.key, "X");
    cr_expect_eq(d.decision, DB_DECIDED_MEDIAN);
    cr_expect_eq(d.rounds, 0);
    cr_expect(isnan(d.hi));
}

/* ---- gc ------------------------------------------------------------------ */

Test(db_gc, drops_only_stale_hashes_of_named_families)
{
    db_t *db = open_ok(pa, DB_OPEN_DEFAULT);
    db_device d = dev_mi210();
    int64_t dv = device_id(db, &d);
    int64_t cur = kernel_id(db, "moe_gemm", 1, HASH_A), old = kernel_id(db, "moe_gemm", 1, HASH_B);
    int64_t other = kernel_id(db, "rmsnorm", 1, HASH_B);
    int64_t ks[3] = {cur, old, other};
    int per[3] = {3, 5, 2};
    char keys[10][16];
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < per[j]; i++) {
            snprintf(keys[i], sizeof keys[i], "K=%d", i);
            db_trial t = ok_trial(dv, ks[j], SHAPE_A, 16, keys[i], "{}", 0.1 + i);
            insert_ok(db, &t);
        }
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_winners_recompute(db, 0, 0, NULL, 0, NULL, &e), MT_OK);
    db_keep_hash keep[] = {{"moe_gemm", HASH_A}, {"moe_gemm", "a-cpu-source-hash"}};
    db_gc_stats gs;
    char *before = export_text(db);
    cr_assert_eq(db_gc(db, keep, 2, true, &gs, &e), MT_OK, "%s", e.msg);
    char *after = export_text(db);
    cr_expect_str_eq(after, before, "dry run changed the database");
    cr_expect_eq(gs.kernels_removed, 1);
    cr_expect_eq(gs.trials_removed, 5);
    cr_expect_eq(gs.winners_removed, 1);
    cr_assert_eq(db_gc(db, keep, 2, false, &gs, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(gs.trials_removed, 5);
    db_close(db);
    cr_expect_eq(sql_int(pa, "SELECT count(*) FROM trials"), 5);
    cr_expect_eq(sql_int(pa, "SELECT count(*) FROM winners"), 2);
    cr_expect_eq(sql_int(pa, "SELECT count(*) FROM kernels WHERE source_hash = '" HASH_B "'"), 1);
    free(before);
    free(after);
}
