/* test_tune_shard.c: `--shard I/N`. Three shard runs into three databases,
 * merged with the db merge API, hold the same configs as one unsharded
 * exhaustive run and the same winner per M; the shards overlap only in the
 * default config (which every shard times as its baseline). */
#include "test_tune_families.h"
#include "test_tune_util.h"

static const int64_t ms[] = {1, 2};

static void run_shard(const char *db, int index, int count)
{
    tune_job job;
    cr_assert_eq(tune_job_make(&tspin, "N=256", ms, 2, &job, NULL), MT_OK);
    tune_opts o;
    tt_opts(&o, "cpu", db);
    o.timing.flush_cache = false;
    o.timing.min_reps = 7; /* medians of 7+ runs: the winner is 3x ahead */
    o.timing.max_reps = 15;
    o.shard_index = index;
    o.shard_count = count;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_run(&job, 1, &o, NULL, &err), MT_OK, "shard %d/%d: %s", index, count,
                 err.msg);
}

static bool has_key(const tt_trials *ts, int64_t m, const char *key)
{
    return tt_find(ts, NULL, m, key) != NULL;
}

Test(tune_shard, merged_shards_equal_the_unsharded_run, .timeout = 180)
{
    char full[256], merged[256], part[3][256];
    tt_db_path(full, sizeof full, "full.db");
    tt_db_path(merged, sizeof merged, "merged.db");
    run_shard(full, 0, 0);
    for (int i = 0; i < 3; i++) {
        tt_db_path(part[i], sizeof part[i], "shard.db");
        run_shard(part[i], i + 1, 3);
    }
    /* The parts are disjoint but for the default config. */
    tt_trials *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    char dflt[256];
    kern_config dc;
    kern_shape s;
    cr_assert_eq(kern_shape_parse(&tspin, "N=256", &s, NULL, NULL), MT_OK);
    tspin.cpu->default_config(&s, 1, NULL, &dc);
    kern_config_key(tspin.cpu, &dc, dflt, sizeof dflt);
    int total = 0;
    for (int i = 0; i < 3; i++) {
        tt_read_trials(part[i], "tspin", a);
        total += a->n;
        for (int j = i + 1; j < 3; j++) {
            tt_read_trials(part[j], "tspin", b);
            for (int t = 0; t < a->n; t++)
                if (strcmp(a->t[t].config_key, dflt))
                    cr_assert(!has_key(b, a->t[t].m, a->t[t].config_key),
                              "%s M=%lld in shards %d and %d", a->t[t].config_key,
                              (long long)a->t[t].m, i + 1, j + 1);
        }
    }

    db_t *db = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(db_open(merged, DB_OPEN_DEFAULT, &db, &err), MT_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(db_merge(db, part[i], NULL, &err), MT_OK, "%s", err.msg);
    db_close(db);

    tt_read_trials(full, "tspin", a);
    tt_read_trials(merged, "tspin", b);
    cr_assert_eq(a->n, 2 * (int)kern_space_size(tspin.cpu), "unsharded run: %d trials", a->n);
    cr_assert_eq(b->n, a->n, "merged shards: %d trials, unsharded %d", b->n, a->n);
    cr_assert_eq(total, a->n + 2 * 2, "each shard adds the default per M");
    for (int t = 0; t < a->n; t++)
        cr_assert(has_key(b, a->t[t].m, a->t[t].config_key), "%s M=%lld missing after merge",
                  a->t[t].config_key, (long long)a->t[t].m);

    tt_winners wa, wb;
    tt_read_winners(full, "tspin", &wa);
    tt_read_winners(merged, "tspin", &wb);
    cr_assert_eq(wa.n, 2);
    cr_assert_eq(wb.n, 2);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(wa.w[i].m, wb.w[i].m);
        cr_assert_str_eq(wa.w[i].config_key, wb.w[i].config_key, "M=%lld: %s vs %s",
                         (long long)wa.w[i].m, wa.w[i].config_key, wb.w[i].config_key);
        cr_assert_str_eq(wa.w[i].config_key, "V=1,SPIN=1,PAD=1");
    }
    free(a);
    free(b);
}
