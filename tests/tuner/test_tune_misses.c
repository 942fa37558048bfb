/* test_tune_misses.c: `moetune tune --misses` (tune_misses_run) on a real
 * SQLite database with the real tuner on the cpu. Misses are recorded the
 * way the runtime records them (db_lookup, then db_lookup_record_miss):
 * gemm tiny at M = 1 once and at M = 16 five times, a family this build
 * does not have, and a miss of a GPU device. The cpu's two gemm misses are
 * tuned, the costlier first (five lookups of a slower default), and
 * become exact hits; the unknown family is left out and the GPU's miss is
 * not this backend's; a second run finds nothing left. A default-only
 * pass writes a trial and no winner. */
#include "test_tune_util.h"
#include "device/device.h"
#include "kernels/core/kern_db.h"
#include "tuner/tune_misses.h"

static const char *const tiny_gemm = "N=64,K=96";

/* The cpu's database record, as the runtime's kernel set builds it. */
static void cpu_device(db_device *dd)
{
    dev_device *dev = NULL;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu", &(dev_open_opts){0}, &dev, &e), MT_OK, "%s", e.msg);
    kern_db_device(dev_get_props(dev), dd);
    /* the strings point into the props: copy them before closing */
    static char arch[64], name[128], rt[64], drv[64], fp[128];
    snprintf(arch, sizeof arch, "%s", dd->arch ? dd->arch : "");
    snprintf(name, sizeof name, "%s", dd->name ? dd->name : "");
    snprintf(rt, sizeof rt, "%s", dd->runtime_version ? dd->runtime_version : "");
    snprintf(drv, sizeof drv, "%s", dd->driver_version ? dd->driver_version : "");
    snprintf(fp, sizeof fp, "%s", dd->fingerprint ? dd->fingerprint : "");
    dd->arch = arch;
    dd->name = name;
    dd->runtime_version = rt;
    dd->driver_version = drv;
    dd->fingerprint = fp;
    dev_close(dev);
}

/* One lookup that misses, recorded as the kernel set records it (with
 * the shape it ran, run; NULL: none); returns its provenance. */
static db_provenance look_up_run(db_t *db, const db_device *dd, const char *family, int version,
                                 const char *hash, const char *shape, const char *run, int64_t m,
                                 bool record)
{
    db_lookup_result r;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_lookup(db, dd, family, version, hash, shape, m, &r, &e), MT_OK, "%s",
                 e.msg);
    if (record)
        cr_assert_eq(db_lookup_record_miss(db, dd, family, shape, run, m, &r, &e), MT_OK, "%s",
                     e.msg);
    return r.provenance;
}

static db_provenance look_up(db_t *db, const db_device *dd, const char *family, int version,
                             const char *hash, const char *shape, int64_t m, bool record)
{
    return look_up_run(db, dd, family, version, hash, shape, NULL, m, record);
}

static void quick_opts(tune_opts *o, const char *db)
{
    tt_opts(o, "cpu", db);
    o->timing.flush_cache = false;
    o->budget.trials = 3;
}

Test(tune_misses, the_costliest_miss_is_tuned_first_and_becomes_a_hit, .timeout = 300)
{
    char path[256];
    tt_db_path(path, sizeof path, "fleet.db");
    const kern_family *gemm = kern_family_find("gemm");
    cr_assert_not_null(gemm);
    char hash[65];
    kern_source_hash(gemm, DEV_BACKEND_CPU, hash);
    db_device cpu;
    cpu_device(&cpu);
    db_device gpu = {DB_BACKEND_HIP, "gfx90a", "AMD Instinct MI210", "5.2", "", "fake-mi210",
                     104};
    db_t *db = NULL;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_open(path, DB_OPEN_DEFAULT, &db, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(look_up(db, &cpu, "gemm", gemm->version, hash, tiny_gemm, 1, true), DB_MISS);
    for (int i = 0; i < 5; i++)
        look_up(db, &cpu, "gemm", gemm->version, hash, tiny_gemm, 16, true);
    look_up(db, &cpu, "no_such_family", 1, "0", "N=1", 1, true);
    look_up(db, &gpu, "gemm", gemm->version, "gpuhash", tiny_gemm, 4, true);
    db_close(db);

    tune_opts o;
    quick_opts(&o, path);
    tune_misses_result res;
    cr_assert_eq(tune_misses_run(&o, NULL, &res, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(res.recorded, 3, "recorded %d (the GPU's miss is not the cpu's)", res.recorded);
    cr_expect_eq(res.skipped, 1, "skipped %d", res.skipped);
    cr_assert_eq(res.n, 2);
    /* Five lookups of M = 16 against one of M = 1, whose default is faster. */
    cr_expect_eq(res.order[0].m, 16);
    cr_expect_eq(res.order[0].lookups, 5);
    cr_expect_eq(res.order[1].m, 1);
    cr_expect_eq(res.order[1].lookups, 1);
    for (int i = 0; i < 2; i++) {
        const tune_miss *t = &res.order[i];
        cr_expect_str_eq(t->fam->name, "gemm");
        cr_expect_str_eq(t->shape_key, tiny_gemm);
        cr_expect(t->default_ms > 0, "M=%lld default %g", (long long)t->m, t->default_ms);
        cr_expect(fabs(t->cost_ms - (double)t->lookups * t->default_ms) <= 1e-12 * t->cost_ms);
    }
    cr_expect_gt(res.order[0].cost_ms, res.order[1].cost_ms);
    tune_misses_result_free(&res);

    /* Winners for both M, tuned within the budget (the default's trial of
     * the first pass counts), and the lookups are exact hits now. */
    tt_winners ws;
    tt_read_winners(path, "gemm", &ws);
    cr_expect_eq(ws.n, 2, "%d winners", ws.n);
    tt_trials ts;
    tt_read_trials(path, "gemm", &ts);
    int per_m[2] = {0, 0};
    for (int i = 0; i < ts.n; i++)
        per_m[ts.t[i].m == 16]++;
    cr_expect(per_m[0] == 3 && per_m[1] == 3, "trials M=1: %d, M=16: %d", per_m[0], per_m[1]);
    cr_assert_eq(db_open(path, DB_OPEN_READONLY, &db, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(look_up(db, &cpu, "gemm", gemm->version, hash, tiny_gemm, 1, false),
                 DB_HIT_EXACT);
    cr_expect_eq(look_up(db, &cpu, "gemm", gemm->version, hash, tiny_gemm, 16, false),
                 DB_HIT_EXACT);
    db_close(db);

    /* Nothing left: both tuned since, the unknown family still left out. */
    cr_assert_eq(tune_misses_run(&o, NULL, &res, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(res.n, 0);
    cr_expect_eq(res.skipped, 3, "skipped %d", res.skipped);
    tune_misses_result_free(&res);
}

Test(tune_misses, a_default_only_pass_records_the_default_and_no_winner, .timeout = 120)
{
    char path[256];
    tt_db_path(path, sizeof path, "defaults.db");
    static const int64_t ms[] = {1, 16};
    tune_job job;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(tune_job_make(kern_family_find("gemm"), "tiny", ms, 2, &job, &e), MT_OK, "%s",
                 e.msg);
    tune_opts o;
    quick_opts(&o, path);
    o.default_only = true;
    tune_report *rep = NULL;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &e), MT_OK, "%s", e.msg);
    char dflt[2][256];
    for (int i = 0; i < 2; i++) {
        cr_expect(rep->jobs[0].m[i].has_default && rep->jobs[0].m[i].default_ms > 0);
        cr_expect_eq(rep->jobs[0].m[i].measured, 1);
        cr_expect(!rep->jobs[0].m[i].has_winner);
        snprintf(dflt[i], sizeof dflt[i], "%s", rep->jobs[0].m[i].default_key);
    }
    tune_report_free(rep);
    tt_trials ts;
    tt_read_trials(path, "gemm", &ts);
    cr_expect_eq(ts.n, 2);
    for (int i = 0; i < ts.n; i++)
        cr_expect_str_eq(ts.t[i].config_key, dflt[ts.t[i].m == 16], "M=%lld",
                         (long long)ts.t[i].m);
    tt_winners ws;
    tt_read_winners(path, "gemm", &ws);
    cr_expect_eq(ws.n, 0, "%d winners", ws.n);
    /* Again: the default is known, nothing is measured. */
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &e), MT_OK, "%s", e.msg);
    cr_expect_eq(tt_report_measured(rep), 0);
    tune_report_free(rep);
}

/* Each miss is tuned at the shape the runtime ran: the runtime dims it
 * recorded (the embedding's 512-row table, not the first preset's 154880
 * rows); a miss without one, or with one that is not its shape, takes the
 * first preset's. */
Test(tune_misses, a_miss_is_tuned_at_the_runtime_dims_it_was_recorded_with, .timeout = 300)
{
    char path[256];
    tt_db_path(path, sizeof path, "runtime_dims.db");
    const kern_family *embed = kern_family_find("ops_embed");
    cr_assert_not_null(embed);
    char hash[65];
    kern_source_hash(embed, DEV_BACKEND_CPU, hash);
    db_device cpu;
    cpu_device(&cpu);
    db_t *db = NULL;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_open(path, DB_OPEN_DEFAULT, &db, &e), MT_OK, "%s", e.msg);
    for (int i = 0; i < 3; i++) /* the costliest: tuned first */
        look_up_run(db, &cpu, "ops_embed", embed->version, hash, "N=256", "N=256,V=512", 4, true);
    look_up_run(db, &cpu, "ops_embed", embed->version, hash, "N=128", "N=256,V=512", 4, true);
    look_up_run(db, &cpu, "ops_embed", embed->version, hash, "N=64", NULL, 4, true);
    db_close(db);

    tune_opts o;
    quick_opts(&o, path);
    o.budget.trials = 1;
    tune_misses_result res;
    cr_assert_eq(tune_misses_run(&o, NULL, &res, &e), MT_OK, "%s", e.msg);
    cr_assert_eq(res.n, 3);
    int seen = 0;
    for (int i = 0; i < res.n; i++) {
        const tune_miss *t = &res.order[i];
        tune_job job;
        cr_assert_eq(tune_miss_job(t, &job, &e), MT_OK, "%s", e.msg);
        cr_expect_eq(job.n_m, 1);
        cr_expect_eq(job.m[0], 4);
        char key[KERN_KEY_MAX];
        kern_shape_key(embed, &job.shape, false, key, sizeof key);
        cr_expect_str_eq(key, t->shape_key, "the job is the miss's shape");
        int64_t v = job.shape.v[1]; /* V: the table's rows, a runtime dim */
        if (!strcmp(t->shape_key, "N=256")) {
            seen |= 1;
            cr_expect_str_eq(t->shape_run, "N=256,V=512");
            cr_expect_eq(v, 512, "N=256 tuned with a %lld-row table", (long long)v);
        } else {
            seen |= !strcmp(t->shape_key, "N=128") ? 2 : 4;
            cr_expect_str_eq(t->shape_run, "", "%s keeps %s", t->shape_key, t->shape_run);
            cr_expect_eq(v, 154880, "%s: the first preset's rows", t->shape_key);
        }
    }
    cr_expect_eq(seen, 7);
    tune_misses_result_free(&res);
}
