/* test_serve_tune.c: the server's background tuner and live swaps. On a
 * kernel set of test-only families served by the test's own thread (every
 * call's output checked), candidates planted to compute a wrong answer, to
 * crash and to hang never reach the serving set, while the correct faster
 * configs are swapped in between steps; a config the tuner confirms but
 * that runs slower in the serving process is swapped back and marked stale
 * in the database; every kernel gets its first pass before any is searched
 * to the whole budget; a paused tuner measures nothing until resumed; a
 * batch-invariant set refuses swaps; and a real server on
 * loopback, started on an empty database with the tiny model, tunes the
 * kernels its load calls while every request succeeds. */
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>

#include "kernels/core/kern_db.h"
#include "model/kset_swap.h"
#include "serve/serve_tune.h"
#include "serve/test_serve_util.h"
#include "tuner/test_tune_families.h"
#include "tuner/test_tune_util.h"

/* tslow: V=2 does half the default's work, but in the serving process
 * (g_serving, set after the tuner's spawner was forked, so its workers never
 * see it) its run launches the kernel 8 times: the tuner confirms it, the
 * serving set finds it 4x slower. */
static volatile int g_serving;

static mt_status tslow_run(const kern_ctx *c, mt_err *err)
{
    int reps = g_serving && c->cfg->v[0] == 2 ? 8 : 1;
    for (int i = 0; i < reps; i++) {
        mt_status st = tfam_run(c, err);
        if (st != MT_OK)
            return st;
    }
    return MT_OK;
}

static const kern_impl tslow_impl = {
    .source = "tslow.cpu",
    .source_text = "#define FAULT 0\n#define WORK (V == 2 ? 25000 : 50000)\n" TFAM_BODY,
    .params = tlucky_params,
    .n_params = 3,
    .default_config = tfam_default,
    .run = tslow_run,
};
static const kern_family tslow = {
    .name = "tslow", .version = 1, .summary = "slower in the serving process",
    .dims = tfam_dims, .n_dims = 1, .presets = tfam_presets, .n_presets = 1,
    .cpu = &tslow_impl, .buffers = tfam_buffers, .fill = tfam_fill,
    .reference = tfam_reference, .cost = tfam_cost,
};

/* A set of test families at N=512, M=1, served by the test thread. */
typedef struct tset {
    dev_device *dev;
    model_kset *ks;
    float *x, *y;
    int64_t calls, wrong;
    FILE *quiet;
} tset;

static void tset_open(tset *t, const kern_family *const *fams, int n, bool invariant)
{
    memset(t, 0, sizeof *t);
    mt_err err = MT_ERR_INIT;
    dev_open_opts oo = {0};
    cr_assert_eq(dev_open("cpu", &oo, &t->dev, &err), MT_OK, "%s", err.msg);
    t->quiet = fopen("/dev/null", "w");
    cr_assert_eq(model_kset_create(t->dev, NULL, t->quiet, &t->ks, &err), MT_OK, "%s", err.msg);
    model_kset_set_batch_invariant(t->ks, invariant);
    for (int i = 0; i < n; i++) {
        kern_shape s;
        cr_assert_eq(kern_shape_parse(fams[i], "N=512", &s, NULL, &err), MT_OK, "%s", err.msg);
        cr_assert_eq(model_kset_add(t->ks, fams[i], &s, fams[i]->name, 1, NULL, &err), MT_OK,
                     "%s", err.msg);
    }
    cr_assert_eq(model_kset_select(t->ks, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_kset_live_enable(t->ks, getenv("MT_TUNE_TEST_LOG") ? stderr : NULL,
                                        &err), MT_OK, "%s", err.msg);
    cr_assert_eq(dev_alloc(t->dev, 512 * 4, (void **)&t->x, &err), MT_OK);
    cr_assert_eq(dev_alloc(t->dev, 512 * 4, (void **)&t->y, &err), MT_OK);
    mt_rng r;
    mt_rng_seed(&r, mt_seed_fresh());
    for (int i = 0; i < 512; i++)
        t->x[i] = mt_rng_uniform(&r, -1, 1);
}

/* One step: every kernel once (output poisoned first, then checked), then
 * the swaps at the step boundary. */
static void tset_step(tset *t)
{
    void *bufs[2] = {t->x, t->y};
    for (int i = 0; i < model_kset_n_kernels(t->ks); i++) {
        memset(t->y, 0xff, 512 * 4);
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(model_kern_run(model_kset_kernel(t->ks, i), 1, NULL, bufs, &err), MT_OK,
                     "%s", err.msg);
        t->calls++;
        for (int j = 0; j < 512; j++)
            if (!(t->y[j] == 2.0f * t->x[j])) {
                t->wrong++;
                break;
            }
    }
    model_kset_swap_apply(t->ks);
}

static void tset_close(tset *t)
{
    dev_free(t->dev, t->x);
    dev_free(t->dev, t->y);
    model_kset_destroy(t->ks);
    dev_close(t->dev);
    fclose(t->quiet);
}

static serve_tune_opts quick_opts(const char *db)
{
    serve_tune_opts o = {0};
    o.db_path = db;
    o.budget.trials = 12; /* every config of these small spaces */
    o.timeout_s = 4;      /* the planted hang; SCHED_IDLE workers wait on a busy machine */
    o.confirm_rounds = 6;
    o.warmup_s = 0.3;
    o.first_trials = -1; /* one pass: each item's search to the whole budget */
    o.log = getenv("MT_TUNE_TEST_LOG") ? stderr : NULL;
    return o;
}

/* Serves steps until pred holds (or fails the test after limit_s). */
static void serve_until(tset *t, serve_tune *tu, bool (*pred)(tset *, const serve_tune_stats *),
                        double limit_s, const char *what)
{
    double end = mt_now_ms() + limit_s * 1000;
    serve_tune_stats st;
    for (;;) {
        tset_step(t);
        serve_tune_stats_get(tu, &st);
        if (pred(t, &st))
            return;
        cr_assert_lt(mt_now_ms(), end, "%s: not within %.0f s (tuned %lld, posted %lld, "
                     "failed %lld, pending %lld)", what, limit_s, (long long)st.tuned,
                     (long long)st.posted, (long long)st.failed, (long long)st.pending);
        usleep(500);
    }
}

static bool four_swapped(tset *t, const serve_tune_stats *st)
{
    model_selection_counts c;
    model_kset_counts(t->ks, &c);
    return st->tuned >= 4 && st->pending == 0 && c.swaps >= 4;
}

Test(serve_tune, wrong_crashing_and_hanging_candidates_never_reach_the_serving_set)
{
    char db[600];
    tt_db_path(db, sizeof db, "live.db");
    serve_tune_opts o = quick_opts(db);
    serve_tune *tu = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_tune_create(&o, &tu, &err), MT_OK, "%s", err.msg);
    const kern_family *fams[] = {&tfault_wrong, &tfault_segv, &tfault_hang, &tspin};
    tset t;
    tset_open(&t, fams, 4, false);
    cr_assert_eq(serve_tune_start(tu, t.ks, NULL, &err), MT_OK, "%s", err.msg);
    serve_until(&t, tu, four_swapped, 240, "four swaps");
    for (int i = 0; i < 2 * MODEL_SWAP_SAMPLES; i++) /* each swap's judgement */
        tset_step(&t);
    serve_tune_stats st;
    serve_tune_stats_get(tu, &st);
    serve_tune_destroy(tu);
    /* The serving thread never computed a wrong answer and never died. */
    cr_expect_eq(t.wrong, 0, "%lld of %lld served calls were wrong", (long long)t.wrong,
                 (long long)t.calls);
    cr_expect_eq(st.failed, 0);
    for (int i = 0; i < 4; i++) {
        const model_kern *k = model_kset_kernel(t.ks, i);
        char key[256];
        kern_config_key(k->impl, &k->ch[0].cfg, key, sizeof key);
        cr_expect_neq(k->ch[0].cfg.v[0], 2, "%s serves the planted V=2: %s", k->fam->name, key);
        /* the faster correct configs (a quarter of the default's work) went in and stayed */
        cr_expect(k->ch[0].swapped, "%s: no swap (serving %s)", k->fam->name, key);
        cr_expect_eq(k->ch[0].cfg.v[1], 1, "%s serves %s", k->fam->name, key);
    }
    model_selection_counts c;
    model_kset_counts(t.ks, &c);
    cr_expect_eq(c.swaps, 4);
    cr_expect_eq(c.swapped_back, 0);
    /* The planted candidates were measured in the workers and recorded. */
    tt_trials tr;
    tt_read_trials(db, NULL, &tr);
    struct { const char *fam; db_trial_status st; } planted[] = {
        {"tfault_wrong", DB_TRIAL_WRONG_RESULT},
        {"tfault_segv", DB_TRIAL_CRASH},
        {"tfault_hang", DB_TRIAL_TIMEOUT},
    };
    for (int p = 0; p < 3; p++) {
        const tt_trial *tv = tt_find(&tr, planted[p].fam, 1, "V=2,SPIN=1,PAD=1");
        cr_assert_not_null(tv, "%s: V=2 was never measured", planted[p].fam);
        cr_expect_eq(tv->status, planted[p].st, "%s V=2: %s", planted[p].fam,
                     db_trial_status_str(tv->status));
    }
    tset_close(&t);
}

static bool one_undone(tset *t, const serve_tune_stats *st)
{
    (void)t;
    return st->marked_stale >= 1;
}

Test(serve_tune, a_swap_slower_while_serving_is_undone_and_marked_stale)
{
    char db[600];
    tt_db_path(db, sizeof db, "slow.db");
    serve_tune_opts o = quick_opts(db);
    serve_tune *tu = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_tune_create(&o, &tu, &err), MT_OK, "%s", err.msg);
    g_serving = 1; /* after the fork of the workers' spawner */
    const kern_family *fams[] = {&tslow};
    tset t;
    tset_open(&t, fams, 1, false);
    cr_assert_eq(serve_tune_start(tu, t.ks, NULL, &err), MT_OK, "%s", err.msg);
    serve_until(&t, tu, one_undone, 180, "the slow swap undone and marked stale");
    serve_tune_destroy(tu);
    const model_kern *k = model_kset_kernel(t.ks, 0);
    cr_expect_eq(k->ch[0].cfg.v[0], 1, "the default is back");
    cr_expect(!k->ch[0].swapped);
    model_selection_counts c;
    model_kset_counts(t.ks, &c);
    cr_expect_eq(c.swaps, 1);
    cr_expect_eq(c.swapped_back, 1);
    cr_expect_eq(t.wrong, 0);
    /* The winner stays in the database, marked stale. */
    db_t *d = NULL;
    cr_assert_eq(db_open(db, DB_OPEN_READONLY, &d, &err), MT_OK, "%s", err.msg);
    db_device dd;
    kern_db_device(dev_get_props(t.dev), &dd);
    char hash[65];
    kern_source_hash(&tslow, DEV_BACKEND_CPU, hash);
    db_lookup_result r;
    cr_assert_eq(db_lookup(d, &dd, "tslow", 1, hash, "N=512", 1, &r, &err), MT_OK, "%s",
                 err.msg);
    cr_expect_eq(r.provenance, DB_HIT_EXACT);
    cr_expect_str_eq(r.config_key, "V=2,SPIN=4,PAD=1");
    cr_expect(r.stale, "the undone winner is not marked stale");
    db_close(d);
    tset_close(&t);
}

static bool deepened_all(tset *t, const serve_tune_stats *st)
{
    (void)t;
    return st->deepened >= 3 && st->pending == 0;
}

/* One number from a query on the database. */
static double query_double(const char *db, const char *sql)
{
    sqlite3 *s = NULL;
    cr_assert_eq(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    cr_assert_eq(sqlite3_prepare_v2(s, sql, -1, &q, NULL), SQLITE_OK, "%s: %s", sql,
                 sqlite3_errmsg(s));
    cr_assert_eq(sqlite3_step(q), SQLITE_ROW, "%s", sql);
    double v = sqlite3_column_double(q, 0);
    sqlite3_finalize(q);
    sqlite3_close(s);
    return v;
}

static int64_t query_int(const char *db, const char *sql)
{
    return (int64_t)query_double(db, sql);
}

Test(serve_tune, every_kernel_gets_its_first_pass_before_any_gets_the_whole_budget)
{
    char db[600];
    tt_db_path(db, sizeof db, "passes.db");
    serve_tune_opts o = quick_opts(db);
    o.first_trials = 2;
    o.budget.trials = 12;
    serve_tune *tu = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_tune_create(&o, &tu, &err), MT_OK, "%s", err.msg);
    const kern_family *fams[] = {&tspin, &tlucky, &tpodium};
    tset t;
    tset_open(&t, fams, 3, false);
    cr_assert_eq(serve_tune_start(tu, t.ks, NULL, &err), MT_OK, "%s", err.msg);
    serve_until(&t, tu, deepened_all, 240, "three kernels searched to the whole budget");
    serve_tune_stats st;
    serve_tune_stats_get(tu, &st);
    serve_tune_destroy(tu);
    cr_expect_eq(t.wrong, 0, "%lld of %lld served calls were wrong", (long long)t.wrong,
                 (long long)t.calls);
    cr_expect_eq(st.tuned, 3);
    cr_expect_eq(st.deepened, 3);
    cr_expect_eq(st.failed, 0);
    cr_expect(st.covered);
    cr_expect_gt(st.covered_s, 0);
    /* Every tune is recorded under the server's one session, ended when
     * the tuner stopped. */
    cr_expect_eq(query_int(db, "SELECT count(*) FROM sessions"), 1);
    cr_expect_eq(query_int(db, "SELECT count(*) FROM sessions WHERE status = 1 AND "
                               "budget = '12 trials per M' AND ended_ms IS NOT NULL"), 1);
    cr_expect_eq(query_int(db, "SELECT count(*) FROM trials WHERE session_id IS NULL OR "
                               "session_id != (SELECT id FROM sessions)"), 0);
    /* Three first passes of 2 trials, then three runs to the whole budget:
     * each kernel's first two trials come before any kernel's third. */
    static const char order[] =
        "WITH r AS (SELECT id, row_number() OVER (PARTITION BY kernel_id ORDER BY id) AS k "
        "FROM trials) SELECT (SELECT max(id) FROM r WHERE k <= 2) < "
        "(SELECT min(id) FROM r WHERE k > 2)";
    cr_expect_eq(query_int(db, "SELECT count(DISTINCT kernel_id) FROM trials"), 3);
    cr_expect_eq(query_int(db, order), 1, "a kernel went past its first pass before every "
                 "kernel had one");
    /* The second pass went on with each search: more trials than the first. */
    for (int f = 0; f < 3; f++) {
        tt_trials tr;
        tt_read_trials(db, fams[f]->name, &tr);
        cr_expect_gt(tr.n, 2, "%s: %d trials", fams[f]->name, tr.n);
    }
    tset_close(&t);
}

static bool one_tuned(tset *t, const serve_tune_stats *st)
{
    (void)t;
    return st->tuned >= 1 && st->pending == 0;
}

/* Paused from before it starts: the load calls an untuned kernel for 3 s
 * and nothing is measured (no trial in the database) or tuned; resumed,
 * the kernel is tuned, and the stats count one pause of about 3 s. */
Test(serve_tune, a_paused_tuner_tunes_nothing_until_resumed)
{
    char db[600];
    tt_db_path(db, sizeof db, "paused.db");
    serve_tune_opts o = quick_opts(db);
    serve_tune *tu = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_tune_create(&o, &tu, &err), MT_OK, "%s", err.msg);
    const kern_family *fams[] = {&tspin};
    tset t;
    tset_open(&t, fams, 1, false);
    serve_tune_pause(tu, true);
    serve_tune_pause(tu, true); /* one pause */
    cr_assert_eq(serve_tune_start(tu, t.ks, NULL, &err), MT_OK, "%s", err.msg);
    double end = mt_now_ms() + 3000;
    while (mt_now_ms() < end) {
        tset_step(&t);
        usleep(1000);
    }
    serve_tune_stats st;
    serve_tune_stats_get(tu, &st);
    cr_expect(st.paused);
    cr_expect_eq(st.pauses, 1);
    cr_expect_eq(st.tuned, 0);
    cr_expect_geq(st.paused_s, 2.9, "paused %.2f s", st.paused_s);
    cr_expect_eq(query_int(db, "SELECT count(*) FROM trials"), 0, "a paused tuner measured");
    serve_tune_pause(tu, false);
    serve_until(&t, tu, one_tuned, 120, "the kernel tuned once resumed");
    serve_tune_stats_get(tu, &st);
    serve_tune_destroy(tu);
    cr_expect(!st.paused);
    cr_expect_eq(st.pauses, 1);
    cr_expect_geq(st.paused_s, 2.9);
    cr_expect_lt(st.paused_s, 3.0 + (mt_now_ms() - end) / 1000);
    cr_expect_gt(query_int(db, "SELECT count(*) FROM trials"), 0);
    cr_expect_eq(t.wrong, 0);
    tset_close(&t);
}

Test(serve_tune, a_batch_invariant_set_refuses_swaps)
{
    const kern_family *fams[] = {&tspin};
    tset t;
    tset_open(&t, fams, 1, true);
    kern_config cfg = {.n = 3, .v = {1, 1, 1}};
    mt_err err = MT_ERR_INIT;
    cr_expect_eq(model_kset_swap_post(t.ks, &tspin, "N=512", 1, &cfg, &err), MT_E_UNSUPPORTED);
    cr_expect(strstr(err.msg, "batch-invariant"), "%s", err.msg);
    tset_step(&t);
    model_selection_counts c;
    model_kset_counts(t.ks, &c);
    cr_expect_eq(c.swaps, 0);
    tset_close(&t);
}

/* ---- a real server ---------------------------------------------------------------- */

typedef struct load {
    tsrv *srv;
    volatile int stop;
    int ok, failed;
    pthread_mutex_t mu;
} load;

static void *load_main(void *arg)
{
    load *l = arg;
    mt_rng r;
    mt_rng_seed(&r, mt_seed_fresh());
    while (!l->stop) {
        char body[512];
        int n = snprintf(body, sizeof body, "{\"prompt\":[");
        int len = 4 + (int)(mt_rng_below(&r, 40));
        for (int i = 0; i < len; i++)
            n += snprintf(body + n, sizeof body - (size_t)n, "%s%d", i ? "," : "",
                          16 + (int)(mt_rng_below(&r, 200)));
        snprintf(body + n, sizeof body - (size_t)n,
                 "],\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}");
        int st = http(l->srv, "POST", "/v1/completions", body, NULL, NULL);
        pthread_mutex_lock(&l->mu);
        if (st == 200)
            l->ok++;
        else
            l->failed++;
        pthread_mutex_unlock(&l->mu);
        /* A pause: the server idles part of the time, as below its knee;
         * the tuner's compilers run in those gaps. */
        usleep(1000 * (useconds_t)(5 + mt_rng_below(&r, 20)));
    }
    return NULL;
}

Test(serve_tune, a_server_on_an_empty_database_tunes_what_its_load_calls)
{
    char db[600];
    tt_db_path(db, sizeof db, "served.db"); /* not created: the tuner creates it */
    serve_tune_opts to = quick_opts(db);
    to.budget.trials = 3;
    to.confirm_rounds = 4;
    to.max_items = 4;
    to.warmup_s = 1;
    serve_tune *tu = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(serve_tune_create(&to, &tu, &err), MT_OK, "%s", err.msg);
    serve_server_opts so;
    memset(&so, 0, sizeof so);
    so.engine.rt.db_path = db;
    so.engine.live_swaps = true;
    tsrv srv;
    tsrv_start(&srv, &so);
    model_kset *ks = serve_engine_kernels(serve_server_engine(srv.s));
    cr_assert_not_null(ks);
    cr_assert_eq(serve_tune_start(tu, ks, serve_server_metrics(srv.s), &err), MT_OK, "%s",
                 err.msg);
    load l = {.srv = &srv};
    pthread_mutex_init(&l.mu, NULL);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, load_main, &l), 0);
    double end = mt_now_ms() + 300e3;
    serve_tune_stats st;
    do {
        usleep(100000);
        serve_tune_stats_get(tu, &st);
    } while ((st.tuned + st.failed < 4 || !st.idle) && mt_now_ms() < end);
    /* a few more requests after the last swap */
    usleep(500000);
    l.stop = 1;
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    serve_tune_stats_get(tu, &st);
    serve_tune_destroy(tu);
    /* The compilers were held while requests ran: wherever a candidate
     * was compiled, not found in the compile cache, for long enough to
     * meet a request (the load leaves gaps of at most 25 ms). */
    double compiled_ms = query_double(db, "SELECT coalesce(max(compile_ms), 0) FROM trials");
    if (compiled_ms > 100)
        cr_expect_gt(st.held_s, 0, "a compile of %.0f ms never held", compiled_ms);
    cr_log_info("compilers held %.1f s (longest compile %.0f ms)", st.held_s, compiled_ms);
    cr_expect_eq(st.tuned, 4, "tuned %lld (failed %lld) of the 4 asked for", (long long)st.tuned,
                 (long long)st.failed);
    cr_expect_eq(l.failed, 0, "%d requests failed (%d ok)", l.failed, l.ok);
    cr_expect_gt(l.ok, 0);
    double swaps = metric(&srv, "moetune_kernel_swaps_total");
    double undone = metric(&srv, "moetune_kernel_swaps_undone_total");
    cr_expect_leq(swaps, (double)st.posted);
    cr_expect_leq(undone, swaps);
    cr_log_info("live tuning on the tiny model: %lld tuned, %lld confirmed, %lld posted, %.0f "
                "swapped in, %.0f undone; %d requests ok", (long long)st.tuned,
                (long long)st.confirmed, (long long)st.posted, swaps, undone, l.ok);
    tsrv_stop(&srv);
    /* the winners are the server's device's, in its database */
    tt_winners w;
    tt_read_winners(db, NULL, &w);
    cr_expect_geq(w.n, 4, "%d winners in the database", w.n);
    pthread_mutex_destroy(&l.mu);
}

/* The live tuner measures a kernel at the shape its kernel set runs, runtime
 * dims included: from the tuning key alone they would come from the
 * family's first preset (GLM-5.2's 154880-row vocabulary for a tiny
 * model's 512-row embedding). Every family, at its last preset's shape. */
Test(serve_tune, a_tune_job_has_the_kernels_own_runtime_dims)
{
    int differs = 0;
    for (const kern_family *const *f = kern_families(); *f; f++) {
        const kern_family *fam = *f;
        if (fam->n_presets < 2)
            continue;
        model_kern k = {.fam = fam};
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(kern_shape_parse(fam, fam->presets[fam->n_presets - 1].key, &k.shape, NULL,
                                      &err), MT_OK, "%s: %s", fam->name, err.msg);
        kern_shape_key(fam, &k.shape, false, k.key, sizeof k.key);
        tune_job job, from_key;
        cr_assert_eq(serve_tune_job(&k, 16, &job, &err), MT_OK, "%s: %s", fam->name, err.msg);
        cr_assert_eq(job.fam, fam);
        cr_assert(job.n_m == 1 && job.m[0] == 16, "%s: M", fam->name);
        for (int d = 0; d < fam->n_dims; d++)
            cr_assert_eq(job.shape.v[d], k.shape.v[d], "%s: dim %s is %lld, the kernel's %lld",
                         fam->name, fam->dims[d].name, (long long)job.shape.v[d],
                         (long long)k.shape.v[d]);
        cr_assert_eq(tune_job_make(fam, k.key, NULL, 0, &from_key, &err), MT_OK, "%s: %s",
                     fam->name, err.msg);
        differs += memcmp(&from_key.shape, &k.shape, sizeof k.shape) != 0;
    }
    /* the case this guards: some family's runtime dims differ between presets */
    cr_assert_gt(differs, 0, "no family whose key alone loses its runtime dims");
}
