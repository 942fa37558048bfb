/* test_db_lookup.c: the runtime lookup rule (exact, nearest M bucket,
 * another device of the same arch, stale source hash, miss), miss
 * recording, coverage, winners recomputed from trials, resume checks, and
 * the listing filter by kernel version and source hash. */
#include "test_db_util.h"

#include <cjson/cJSON.h>

static char dir[64], path[128];
static db_t *db;
static int64_t dev, ker;
static db_device mi210;

static void setup(void)
{
    tmp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/t.db", dir);
    db = open_ok(path, DB_OPEN_DEFAULT);
    mi210 = dev_mi210();
    dev = device_id(db, &mi210);
    ker = kernel_id(db, "moe_gemm", 1, HASH_A);
}

static void teardown(void)
{
    db_close(db);
    rm_tree(dir);
}

TestSuite(db_lookup, .init = setup, .fini = teardown);

/* A lookup and its miss record, as the runtime's kernel set does them. */
static db_lookup_result look(const db_device *d, const char *hash, int64_t m)
{
    db_lookup_result r;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_lookup(db, d, "moe_gemm", 1, hash, SHAPE_A, m, &r, &e), MT_OK, "%s", e.msg);
    cr_assert_eq(db_lookup_record_miss(db, d, "moe_gemm", SHAPE_A, NULL, m, &r, &e), MT_OK, "%s",
                 e.msg);
    return r;
}

struct miss_acc {
    int64_t m, count;
    db_provenance reason;
};

static int miss_fn(void *ctx, const db_miss_row *r)
{
    struct miss_acc *x = ctx;
    if (r->m == x->m) {
        x->count = r->count;
        x->reason = r->last_reason;
    }
    return 0;
}

static int64_t miss_count(const char *device_fp, int64_t m, db_provenance *reason)
{
    struct miss_acc a = {m, 0, DB_MISS};
    db_filter f = {.family = "moe_gemm", .device = device_fp};
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_misses_each(db, &f, miss_fn, &a, &e), MT_OK, "%s", e.msg);
    if (reason)
        *reason = a.reason;
    return a.count;
}

Test(db_lookup, exact_hit_returns_the_winner_config)
{
    set_winner(db, dev, ker, SHAPE_A, 64, "BM=64,BN=64", "{\"BM\":64,\"BN\":64}", 0.0733);
    set_winner(db, dev, ker, SHAPE_A, 16, "BM=32,BN=64", "{\"BM\":32,\"BN\":64}", 0.0397);
    db_lookup_result r = look(&mi210, HASH_A, 64);
    cr_expect_eq(r.provenance, DB_HIT_EXACT);
    cr_expect(r.has_config);
    cr_expect_str_eq(r.config_json, "{\"BM\":64,\"BN\":64}");
    cr_expect_str_eq(r.config_key, "BM=64,BN=64");
    cr_expect_eq(r.tuned_m, 64);
    cr_expect_float_eq(r.time_ms, 0.0733, 1e-12);
    cr_expect_str_eq(r.message, "");
    cr_expect_not(r.miss_recorded);
    cr_expect_eq(miss_count(NULL, 64, NULL), 0);
}

Test(db_lookup, same_model_under_another_runtime_is_exact_with_a_note)
{
    set_winner(db, dev, ker, SHAPE_A, 16, "BM=32", "{\"BM\":32}", 0.04);
    db_device upgraded = mi210;
    upgraded.runtime_version = "hip 6.3.0";
    upgraded.fingerprint = "fp-mi210-after-upgrade";
    db_lookup_result r = look(&upgraded, HASH_A, 16);
    cr_expect_eq(r.provenance, DB_HIT_EXACT);
    cr_expect_str_eq(r.config_json, "{\"BM\":32}");
    cr_expect(strstr(r.message, "fp-mi210-a") != NULL, "%s", r.message);
}

Test(db_lookup, nearest_bucket_prefers_larger_on_tie)
{
    set_winner(db, dev, ker, SHAPE_A, 16, "BM=16", "{\"BM\":16}", 0.04);
    set_winner(db, dev, ker, SHAPE_A, 64, "BM=64", "{\"BM\":64}", 0.07);
    /* 32 is exactly between 16 and 64 in log2: the larger wins. */
    db_lookup_result r = look(&mi210, HASH_A, 32);
    cr_expect_eq(r.provenance, DB_HIT_NEAREST);
    cr_expect_eq(r.tuned_m, 64);
    cr_expect_str_eq(r.config_json, "{\"BM\":64}");
    cr_expect(strstr(r.message, "M=64") != NULL, "%s", r.message);
    cr_expect_not(r.miss_recorded);
    /* 31 is closer to 16 in log2 (31/16 < 64/31), though not in absolute terms. */
    cr_expect_eq(look(&mi210, HASH_A, 31).tuned_m, 16);
    cr_expect_eq(look(&mi210, HASH_A, 33).tuned_m, 64);
    cr_expect_eq(look(&mi210, HASH_A, 1).tuned_m, 16);
    cr_expect_eq(look(&mi210, HASH_A, 100000).tuned_m, 64);
}

/* Reference for the nearest rule in floating point: smallest
 * |log2 m - log2 t|, ties (within 1e-12) to the larger t. */
static int64_t nearest_ref(const int64_t *tuned, int n, int64_t m)
{
    int64_t best = tuned[0];
    double bd = fabs(log2((double)m) - log2((double)best));
    for (int i = 1; i < n; i++) {
        double d = fabs(log2((double)m) - log2((double)tuned[i]));
        if (d < bd - 1e-12 || (fabs(d - bd) <= 1e-12 && tuned[i] > best)) {
            best = tuned[i];
            bd = d;
        }
    }
    return best;
}

Test(db_lookup, nearest_bucket_matches_log2_reference_on_random_sets)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    for (int round = 0; round < 20; round++) {
        char shape[64];
        snprintf(shape, sizeof shape, "H=%d,I=128,E=16,topk=4,a=bf16", 100 + round);
        int64_t tuned[12];
        int n = 1 + (int)mt_rng_below(&rng, 12);
        for (int i = 0; i < n; i++) {
            bool dup;
            do { /* distinct Ms, some of them powers of two to make ties */
                tuned[i] = mt_rng_below(&rng, 2) ? (int64_t)1 << mt_rng_below(&rng, 12)
                                                 : 1 + (int64_t)mt_rng_below(&rng, 4096);
                dup = false;
                for (int j = 0; j < i; j++)
                    dup |= tuned[j] == tuned[i];
            } while (dup);
            char key[32], json[48];
            snprintf(key, sizeof key, "M%lld", (long long)tuned[i]);
            snprintf(json, sizeof json, "{\"for\":%lld}", (long long)tuned[i]);
            set_winner(db, dev, ker, shape, tuned[i], key, json, 1.0);
        }
        for (int q = 0; q < 50; q++) {
            int64_t m = 1 + (int64_t)mt_rng_below(&rng, 5000);
            db_lookup_result r;
            mt_err e = MT_ERR_INIT;
            cr_assert_eq(db_lookup(db, &mi210, "moe_gemm", 1, HASH_A, shape, m, &r, &e), MT_OK);
            int64_t want = nearest_ref(tuned, n, m);
            cr_assert_eq(r.tuned_m, want, "seed %llu: M=%lld got %lld want %lld",
                         (unsigned long long)seed, (long long)m, (long long)r.tuned_m,
                         (long long)want);
            cr_assert_eq(r.provenance, want == m ? DB_HIT_EXACT : DB_HIT_NEAREST);
            char json[48];
            snprintf(json, sizeof json, "{\"for\":%lld}", (long long)want);
            cr_assert_str_eq(r.config_json, json);
        }
    }
}

Test(db_lookup, miss_is_recorded_and_counted)
{
    db_lookup_result r = look(&mi210, HASH_A, 48);
    cr_expect_eq(r.provenance, DB_MISS);
    cr_expect_not(r.has_config);
    cr_expect_str_eq(r.config_json, "");
    cr_expect(r.miss_recorded);
    cr_expect(strstr(r.message, "default") && strstr(r.message, "moe_gemm"), "%s", r.message);
    cr_expect_null(strchr(r.message, '\n'), "warning spans lines");
    look(&mi210, HASH_A, 48);
    db_provenance why;
    cr_expect_eq(miss_count("fp-mi210-a", 48, &why), 2);
    cr_expect_eq(why, DB_MISS);
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_miss_record(db, &mi210, "moe_gemm", SHAPE_A, 48, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(miss_count("fp-mi210-a", 48, NULL), 3);
}

Test(db_lookup, stale_hash_is_refused_and_reported)
{
    set_winner(db, dev, ker, SHAPE_A, 16, "BM=16", "{\"BM\":16}", 0.04);
    db_lookup_result r = look(&mi210, HASH_B, 16);
    cr_expect_eq(r.provenance, DB_STALE);
    cr_expect_not(r.has_config, "stale config was handed out");
    cr_expect_str_eq(r.config_json, "");
    cr_expect_str_eq(r.stale_hash, HASH_A);
    cr_expect(strstr(r.message, "stale") != NULL, "%s", r.message);
    cr_expect(r.miss_recorded);
    db_provenance why;
    cr_expect_eq(miss_count("fp-mi210-a", 16, &why), 1);
    cr_expect_eq(why, DB_STALE);
    /* A different family version is stale too, even with the same hash. */
    db_lookup_result r2;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_lookup(db, &mi210, "moe_gemm", 2, HASH_A, SHAPE_A, 16, &r2, &e), MT_OK);
    cr_expect_eq(r2.provenance, DB_STALE);
}

Test(db_lookup, other_device_of_same_arch_is_reported_and_used)
{
    set_winner(db, dev, ker, SHAPE_A, 16, "BM=16", "{\"BM\":16}", 0.04);
    db_device other = dev_mi250();
    db_lookup_result r = look(&other, HASH_A, 16);
    cr_expect_eq(r.provenance, DB_OTHER_DEVICE);
    cr_expect(r.has_config);
    cr_expect_str_eq(r.config_json, "{\"BM\":16}");
    cr_expect_str_eq(r.device_name, "AMD Instinct MI210");
    cr_expect_eq(r.device_compute_units, 104);
    cr_expect(strstr(r.message, "MI210") && strstr(r.message, "104"), "%s", r.message);
    cr_expect(r.miss_recorded, "other-device use must still be visible in misses");
    db_provenance why;
    cr_expect_eq(miss_count("fp-mi250x", 16, &why), 1);
    cr_expect_eq(why, DB_OTHER_DEVICE);

    /* Same name, different CU count (a partitioned GPU): also other device. */
    db_device part = mi210;
    part.compute_units = 52;
    part.fingerprint = "fp-mi210-half";
    cr_expect_eq(look(&part, HASH_A, 16).provenance, DB_OTHER_DEVICE);

    /* Among several other devices, the nearest compute-unit count wins. */
    db_device mi250 = dev_mi250();
    set_winner(db, device_id(db, &mi250), ker, SHAPE_A, 16, "BM=250", "{\"BM\":250}", 0.01);
    db_device mi210_64 = mi210;
    mi210_64.name = "AMD Instinct MI210 (64 CUs)";
    mi210_64.compute_units = 64;
    mi210_64.fingerprint = "fp-64";
    set_winner(db, device_id(db, &mi210_64), ker, SHAPE_A, 16, "BM=64", "{\"BM\":64}", 0.5);
    db_device probe = mi210;
    probe.name = "a new board";
    probe.fingerprint = "fp-probe";
    probe.compute_units = 70; /* nearest: the 64-CU one, though slower */
    db_lookup_result near = look(&probe, HASH_A, 16);
    cr_expect_eq(near.provenance, DB_OTHER_DEVICE);
    cr_expect_eq(near.device_compute_units, 64, "%s", near.message);
    probe.compute_units = 108; /* nearest: the 110-CU one, though 104 is close too */
    near = look(&probe, HASH_A, 16);
    cr_expect_eq(near.device_compute_units, 110, "%s", near.message);

    /* Another arch is a plain miss. */
    db_device mi300 = mi210;
    mi300.arch = "gfx942";
    mi300.fingerprint = "fp-mi300";
    cr_expect_eq(look(&mi300, HASH_A, 16).provenance, DB_MISS);
}

Test(db_lookup, readonly_handle_reports_but_does_not_record)
{
    db_close(db);
    db = open_ok(path, DB_OPEN_READONLY);
    db_lookup_result r = look(&mi210, HASH_A, 8);
    cr_expect_eq(r.provenance, DB_MISS);
    cr_expect_not(r.miss_recorded);
    cr_expect(strstr(r.message, "read-only") != NULL, "%s", r.message);
    cr_expect_eq(miss_count(NULL, 8, NULL), 0);
}

Test(db_lookup, coverage_reports_each_entry_without_recording)
{
    set_winner(db, dev, ker, SHAPE_A, 16, "BM=16", "{\"BM\":16}", 0.04);
    db_coverage_query q[] = {
        {"moe_gemm", 1, HASH_A, SHAPE_A, 16},
        {"moe_gemm", 1, HASH_A, SHAPE_A, 20},
        {"moe_gemm", 1, HASH_B, SHAPE_A, 16},
        {"rmsnorm", 1, HASH_A, "N=4096,a=bf16", 1},
    };
    db_lookup_result out[4];
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_coverage(db, &mi210, q, 4, out, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(out[0].provenance, DB_HIT_EXACT);
    cr_expect_eq(out[1].provenance, DB_HIT_NEAREST);
    cr_expect_eq(out[2].provenance, DB_STALE);
    cr_expect_eq(out[3].provenance, DB_MISS);
    db_stats st;
    cr_assert_eq(db_stats_get(db, &st, &e), MT_OK);
    cr_expect_eq(st.misses, 0);
}

Test(db_lookup, bad_arguments_are_rejected)
{
    db_lookup_result r;
    mt_err e = MT_ERR_INIT;
    cr_expect_eq(db_lookup(db, &mi210, "moe_gemm", 1, HASH_A, SHAPE_A, 0, &r, &e), MT_E_INVALID);
    cr_expect_eq(db_lookup(db, &mi210, NULL, 1, HASH_A, SHAPE_A, 4, &r, &e), MT_E_INVALID);
    db_device bad = mi210;
    bad.backend = 9;
    cr_expect_eq(db_lookup(db, &bad, "moe_gemm", 1, HASH_A, SHAPE_A, 4, &r, &e), MT_E_INVALID);
}

/* ---- winners from trials, resume --------------------------------------- */

TestSuite(db_winners, .init = setup, .fini = teardown);

static int runner_ups_fn(void *ctx, const db_winner_row *w)
{
    snprintf(ctx, 1024, "%s", w->runner_ups_json);
    return 0;
}

Test(db_winners, recompute_picks_fastest_ok_trial_with_runner_ups)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    enum { N = 40 };
    char keys[N][24], json[N][32];
    double best = INFINITY;
    int best_i = -1;
    db_trial ts[N];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "BM=%d", i);
        snprintf(json[i], sizeof json[i], "{\"BM\":%d}", i);
        double t = 0.01 + mt_rng_uniform(&rng, 0.0f, 1.0f);
        ts[i] = ok_trial(dev, ker, SHAPE_A, 128, keys[i], json[i], t);
        if (i % 5 == 0) { /* failed candidates, with times that would have won */
            ts[i].status = (db_trial_status)(1 + i % 6);
            ts[i].time_median_ms = 0.001;
        } else if (t < best) {
            best = t;
            best_i = i;
        }
    }
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_trials_insert(db, ts, N, &e), MT_OK, "%s", e.msg);
    int64_t changed = -1;
    cr_assert_eq(db_winners_recompute(db, 0, 0, NULL, 0, &changed, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(changed, 1);
    db_lookup_result r = look(&mi210, HASH_A, 128);
    cr_assert_eq(r.provenance, DB_HIT_EXACT);
    cr_expect_str_eq(r.config_key, keys[best_i], "seed %llu", (unsigned long long)seed);
    cr_expect_float_eq(r.time_ms, best, 1e-12);

    char ru[1024] = "";
    cr_assert_eq(db_winners_each(db, NULL, runner_ups_fn, ru, &e), MT_OK);
    /* Runner-ups: the next DB_RUNNER_UPS ok trials by median, in order. */
    bool used[N] = {false};
    used[best_i] = true;
    cJSON *arr = cJSON_Parse(ru);
    cr_assert(cJSON_IsArray(arr), "%s", ru);
    cr_expect_eq(cJSON_GetArraySize(arr), DB_RUNNER_UPS, "%s", ru);
    for (int r = 0; r < cJSON_GetArraySize(arr); r++) {
        int next = -1;
        for (int i = 0; i < N; i++)
            if (!used[i] && ts[i].status == DB_TRIAL_OK &&
                (next < 0 || ts[i].time_median_ms < ts[next].time_median_ms))
                next = i;
        used[next] = true;
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(arr, r), "config_key");
        cr_expect(cJSON_IsString(k) && !strcmp(k->valuestring, keys[next]),
                  "seed %llu: runner-up %d is %s, want %s", (unsigned long long)seed, r,
                  cJSON_IsString(k) ? k->valuestring : "?", keys[next]);
    }
    cJSON_Delete(arr);

    /* A second recompute with nothing new changes nothing. */
    cr_assert_eq(db_winners_recompute(db, dev, ker, SHAPE_A, 128, &changed, &e), MT_OK);
    cr_expect_eq(changed, 0);
}

Test(db_winners, verified_mark_survives_recompute_of_same_config)
{
    db_trial t = ok_trial(dev, ker, SHAPE_A, 8, "BM=8", "{\"BM\":8}", 0.5);
    insert_ok(db, &t);
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_winners_recompute(db, 0, 0, NULL, 0, NULL, &e), MT_OK, "%s", e.msg);
    cr_assert_eq(db_winner_mark_verified(db, dev, ker, SHAPE_A, 8, 0.51, &e), MT_OK, "%s", e.msg);
    db_trial t2 = ok_trial(dev, ker, SHAPE_A, 8, "BM=16", "{\"BM\":16}", 0.9);
    insert_ok(db, &t2);
    cr_assert_eq(db_winners_recompute(db, 0, 0, NULL, 0, NULL, &e), MT_OK);
    db_stats st;
    cr_assert_eq(db_stats_get(db, &st, &e), MT_OK);
    cr_expect_eq(st.winners_verified, 1);
    /* A faster config replaces the winner and drops the mark. */
    db_trial t3 = ok_trial(dev, ker, SHAPE_A, 8, "BM=4", "{\"BM\":4}", 0.1);
    insert_ok(db, &t3);
    cr_assert_eq(db_winners_recompute(db, 0, 0, NULL, 0, NULL, &e), MT_OK);
    cr_assert_eq(db_stats_get(db, &st, &e), MT_OK);
    cr_expect_eq(st.winners_verified, 0);
    cr_expect_eq(db_winner_mark_verified(db, dev, ker, SHAPE_A, 9, 1.0, &e), MT_E_NOT_FOUND);
}

Test(db_winners, trial_exists_answers_resume_per_source_hash)
{
    db_trial t = ok_trial(dev, ker, SHAPE_A, 32, "BM=32", "{\"BM\":32}", 0.2);
    t.status = DB_TRIAL_TIMEOUT;
    insert_ok(db, &t);
    bool ex = false;
    db_trial_status s = DB_TRIAL_OK;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_trial_exists(db, dev, ker, SHAPE_A, 32, "BM=32", &ex, &s, &e), MT_OK);
    cr_expect(ex);
    cr_expect_eq(s, DB_TRIAL_TIMEOUT);
    int64_t ker_b = kernel_id(db, "moe_gemm", 1, HASH_B);
    cr_assert_eq(db_trial_exists(db, dev, ker_b, SHAPE_A, 32, "BM=32", &ex, &s, &e), MT_OK);
    cr_expect_not(ex, "a trial of another source hash counted as done");
    cr_assert_eq(db_trial_exists(db, dev, ker, SHAPE_A, 64, "BM=32", &ex, NULL, &e), MT_OK);
    cr_expect_not(ex);
    /* Inserting the same key again replaces the row. */
    t.status = DB_TRIAL_OK;
    insert_ok(db, &t);
    cr_assert_eq(db_trial_exists(db, dev, ker, SHAPE_A, 32, "BM=32", &ex, &s, &e), MT_OK);
    cr_expect_eq(s, DB_TRIAL_OK);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM trials"), 1);
}

Test(db_winners, batch_insert_is_all_or_nothing)
{
    db_trial ts[3] = {
        ok_trial(dev, ker, SHAPE_A, 1, "A", "{}", 0.1),
        ok_trial(dev, ker, SHAPE_A, 1, "B", "{}", 0.2),
        ok_trial(dev, ker, SHAPE_A, 1, "C", "{}", NAN), /* ok without a time: invalid */
    };
    mt_err e = MT_ERR_INIT;
    cr_expect_eq(db_trials_insert(db, ts, 3, &e), MT_E_INVALID);
    cr_expect(strstr(e.msg, "median") != NULL, "%s", e.msg);
    ts[2].config_key = "";
    ts[2].time_median_ms = 0.3;
    cr_assert_eq(db_begin(db, &e), MT_OK);
    cr_expect_neq(db_trials_insert(db, ts, 3, &e), MT_OK);
    db_trial good = ok_trial(dev, ker, SHAPE_A, 2, "D", "{}", 0.1);
    cr_expect_eq(db_trial_insert(db, &good, &e), MT_OK, "%s", e.msg);
    cr_assert_eq(db_commit(db, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM trials"), 1);
}

Test(db_winners, sessions_and_code_objects_round_trip)
{
    char *argv[] = {"moetune", "tune", "--family", "moe_gemm"};
    db_session_info info = {4, argv, "moetune " MOETUNE_VERSION, "node7", "exhaustive", "600s"};
    int64_t sid = 0;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_session_begin(db, &info, &sid, &e), MT_OK, "%s", e.msg);
    db_trial t = ok_trial(dev, ker, SHAPE_A, 4, "BM=4", "{\"BM\":4}", 0.3);
    t.session_id = sid;
    insert_ok(db, &t);
    cr_assert_eq(db_session_end(db, sid, DB_SESSION_DONE, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(db_session_end(db, sid + 100, DB_SESSION_DONE, &e), MT_E_NOT_FOUND);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM sessions WHERE argv = "
                               "'[\"moetune\",\"tune\",\"--family\",\"moe_gemm\"]' AND status = 1 "
                               "AND ended_ms >= started_ms AND host = 'node7'"),
                 1);

    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    size_t n = 1 + mt_rng_below(&rng, 70000);
    unsigned char *blob = malloc(n);
    for (size_t i = 0; i < n; i++)
        blob[i] = (unsigned char)mt_rng_u64(&rng);
    cr_assert_eq(db_code_put(db, "gfx90a", "key-1", blob, n, &e), MT_OK, "%s", e.msg);
    void *got = NULL;
    size_t gn = 0;
    cr_assert_eq(db_code_get(db, "gfx90a", "key-1", &got, &gn, &e), MT_OK, "%s", e.msg);
    cr_expect(gn == n && !memcmp(got, blob, n), "seed %llu", (unsigned long long)seed);
    free(got);
    cr_expect_eq(db_code_get(db, "gfx942", "key-1", &got, &gn, &e), MT_E_NOT_FOUND);
    cr_expect_null(got);
    free(blob);
}

static int compiled_row_fn(void *ctx, const db_trial_row *r)
{
    db_trial *out = ctx;
    if (!strcmp(r->t.config_key, "BM=8")) {
        *out = r->t;
        out->resources_json = NULL; /* the row's strings die with the call */
        out->config_key = NULL;
        out->config_json = NULL;
        out->shape_key = NULL;
        out->error = r->t.error ? "(set)" : NULL;
        cr_expect(r->t.resources_json && strstr(r->t.resources_json, "\"vgprs\":24"),
                  "resources kept: %s", r->t.resources_json ? r->t.resources_json : "(null)");
    }
    return 0;
}

Test(db_winners, compiled_status_round_trips_and_never_wins)
{
    db_trial_status s;
    cr_expect_str_eq(db_trial_status_str(DB_TRIAL_COMPILED), "compiled");
    cr_assert(db_trial_status_parse("compiled", &s));
    cr_expect_eq(s, DB_TRIAL_COMPILED);
    cr_expect_eq((int)DB_TRIAL_COMPILED, 7, "persisted value: the next after skipped");

    /* A compiled trial: resources, no time. Next to it an ok one at another M. */
    db_trial c = ok_trial(dev, ker, SHAPE_A, 8, "BM=8", "{\"BM\":8}", NAN);
    c.status = DB_TRIAL_COMPILED;
    c.time_min_ms = c.time_p10_ms = c.time_p90_ms = c.gflops = c.gbps = NAN;
    c.repetitions = 0;
    c.resources_json = "{\"kernels\":[{\"name\":\"k\",\"vgprs\":24}]}";
    insert_ok(db, &c);
    db_trial with_time = c;
    with_time.config_key = "BM=9";
    with_time.time_median_ms = 0.5;
    mt_err e = MT_ERR_INIT;
    cr_expect_eq(db_trial_insert(db, &with_time, &e), MT_E_INVALID, "a compiled trial with a time");
    cr_expect(strstr(e.msg, "no time"), "%s", e.msg);

    bool ex = false;
    cr_assert_eq(db_trial_exists(db, dev, ker, SHAPE_A, 8, "BM=8", &ex, &s, &e), MT_OK, "%s", e.msg);
    cr_expect(ex);
    cr_expect_eq(s, DB_TRIAL_COMPILED, "read back as %s", db_trial_status_str(s));
    db_trial got = {.status = DB_TRIAL_STATUS_COUNT};
    cr_assert_eq(db_trials_each(db, NULL, compiled_row_fn, &got, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(got.status, DB_TRIAL_COMPILED);
    cr_expect(isnan(got.time_median_ms) && isnan(got.time_min_ms), "a compiled trial has no time");
    db_stats st;
    cr_assert_eq(db_stats_get(db, &st, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(st.trials_by_status[DB_TRIAL_COMPILED], 1);

    /* Never a winner: recompute finds no ok trial at M=8. */
    int64_t changed = -1;
    cr_assert_eq(db_winners_recompute(db, dev, ker, SHAPE_A, 8, &changed, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(changed, 0);
    cr_expect_eq(sql_int(path, "SELECT count(*) FROM winners"), 0);

    /* Export names it, import restores it. */
    char *text = export_text(db);
    cr_expect(strstr(text, "\"status\":\"compiled\""), "export: %s", text);
    char jp[160], other[160];
    snprintf(jp, sizeof jp, "%s/c.json", dir);
    snprintf(other, sizeof other, "%s/other.db", dir);
    write_bytes(jp, text, strlen(text));
    db_t *o = open_ok(other, DB_OPEN_DEFAULT);
    db_merge_stats ms;
    cr_assert_eq(db_import(o, jp, &ms, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(ms.trials_added, 1);
    db_close(o);
    cr_expect_eq(sql_int(other, "SELECT status FROM trials WHERE config_key='BM=8'"), 7);
    cr_expect_eq(sql_int(other, "SELECT count(*) FROM trials WHERE time_median_ms IS NULL"), 1);
    free(text);
}

static int count_trial_fn(void *ctx, const db_trial_row *r)
{
    (void)r;
    (*(int *)ctx)++;
    return 0;
}

static int count_winner_fn(void *ctx, const db_winner_row *r)
{
    (void)r;
    (*(int *)ctx)++;
    return 0;
}

Test(db_winners, filter_by_source_hash_keeps_one_kernel_version)
{
    int64_t ker_b = kernel_id(db, "moe_gemm", 1, HASH_B);
    int64_t ker_v2 = kernel_id(db, "moe_gemm", 2, HASH_A);
    int64_t kers[] = {ker, ker_b, ker_v2};
    for (int i = 0; i < 3; i++) {
        db_trial t = ok_trial(dev, kers[i], SHAPE_A, 16, "BM=16", "{\"BM\":16}", 0.1 + i);
        insert_ok(db, &t);
        set_winner(db, dev, kers[i], SHAPE_A, 16, "BM=16", "{\"BM\":16}", 0.1 + i);
    }
    mt_err e = MT_ERR_INIT;
    struct {
        db_filter f;
        int want;
    } cases[] = {
        {{.family = "moe_gemm"}, 3},
        {{.family = "moe_gemm", .version = 1, .source_hash = HASH_A}, 1},
        {{.family = "moe_gemm", .version = 1, .source_hash = HASH_B}, 1},
        {{.family = "moe_gemm", .version = 2, .source_hash = HASH_A}, 1},
        {{.family = "moe_gemm", .version = 2, .source_hash = HASH_B}, 0},
        {{.version = 2}, 3}, /* a version alone filters nothing */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int trials = 0, winners = 0;
        cr_assert_eq(db_trials_each(db, &cases[i].f, count_trial_fn, &trials, &e), MT_OK,
                     "%s", e.msg);
        cr_assert_eq(db_winners_each(db, &cases[i].f, count_winner_fn, &winners, &e), MT_OK,
                     "%s", e.msg);
        cr_expect_eq(trials, cases[i].want, "case %zu: %d trials", i, trials);
        cr_expect_eq(winners, cases[i].want, "case %zu: %d winners", i, winners);
    }
}

Test(db_lookup, a_lookup_alone_writes_nothing)
{
    db_device other = dev_mi250();
    const db_device *devs[] = {&mi210, &other, &mi210};
    const char *hashes[] = {HASH_A, HASH_A, HASH_B};
    const int64_t ms[] = {48, 16, 16};
    const db_provenance want[] = {DB_MISS, DB_OTHER_DEVICE, DB_STALE};
    for (int i = 0; i < 3; i++) {
        if (i == 1) /* after the plain miss: a winner elsewhere */
            set_winner(db, dev, ker, SHAPE_A, 16, "BM=16", "{\"BM\":16}", 0.04);
        db_lookup_result r;
        mt_err e = MT_ERR_INIT;
        cr_assert_eq(db_lookup(db, devs[i], "moe_gemm", 1, hashes[i], SHAPE_A, ms[i], &r, &e),
                     MT_OK, "%s", e.msg);
        cr_expect_eq(r.provenance, want[i], "case %d: %s", i, r.message);
        cr_expect(db_provenance_is_miss(r.provenance));
        cr_expect_not(r.miss_recorded);
    }
    cr_expect_eq(miss_count(NULL, 48, NULL), 0);
    cr_expect_eq(miss_count(NULL, 16, NULL), 0);
    /* Recording a hit is a no-op. */
    db_lookup_result r;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_lookup(db, &mi210, "moe_gemm", 1, HASH_A, SHAPE_A, 16, &r, &e), MT_OK);
    cr_expect_eq(r.provenance, DB_HIT_EXACT);
    cr_expect_not(db_provenance_is_miss(r.provenance));
    cr_assert_eq(db_lookup_record_miss(db, &mi210, "moe_gemm", SHAPE_A, NULL, 16, &r, &e), MT_OK);
    cr_expect_not(r.miss_recorded);
    cr_expect_eq(miss_count(NULL, 16, NULL), 0);
}
