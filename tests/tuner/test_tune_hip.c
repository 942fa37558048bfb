/* test_tune_hip.c: `moetune tune --device hip --arch gfx90a --compile-only`
 * with no GPU: the valid space compiles through hipRTC on the pool and
 * every config is stored with its resources (registers, LDS, spills) and
 * no times. Skipped when this build has no HIP. A second run compiles
 * nothing new. */
#include "test_tune_util.h"

Test(tune_hip, compile_only_stores_resources_without_times, .timeout = 180)
{
    dev_device *d = NULL;
    if (dev_open("hip", &(dev_open_opts){.arch = "gfx90a"}, &d, NULL) != MT_OK)
        cr_skip_test("no HIP (hipRTC) in this build");
    cr_assert(dev_get_props(d)->compile_only || dev_get_props(d)->backend == DEV_BACKEND_HIP);
    dev_close(d);

    char db[256];
    tt_db_path(db, sizeof db, "hip.db");
    const kern_family *f = kern_family_find("rmsnorm");
    tune_job job;
    static const int64_t ms[] = {4};
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(tune_job_make(f, "tiny", ms, 1, &job, &err), MT_OK, "%s", err.msg);
    tune_opts o;
    tt_opts(&o, "hip", db);
    o.arch = "gfx90a";
    o.compile_only = true;
    tune_report *rep = NULL;
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    cr_assert(rep->compile_only);
    const tune_m_report *mr = &rep->jobs[0].m[0];
    cr_assert_eq(mr->measured, mr->space, "%d of %d configs compiled", mr->measured, mr->space);
    cr_assert(mr->space >= 10);
    const int space = mr->space;
    tune_report_free(rep);

    tt_trials *ts = calloc(1, sizeof *ts);
    tt_read_trials(db, "rmsnorm", ts);
    cr_assert_eq(ts->n, space);
    for (int i = 0; i < ts->n; i++) {
        const tt_trial *t = &ts->t[i];
        cr_assert_eq(t->status, DB_TRIAL_COMPILED, "%s: %s (%s)", t->config_key,
                     db_trial_status_str(t->status), t->error);
        cr_assert(isnan(t->median_ms), "%s has a time", t->config_key);
        cr_assert(strstr(t->resources, "\"vgprs\""), "%s: resources %s", t->config_key,
                  t->resources);
        cr_assert(strstr(t->resources, "\"lds_bytes\""), "%s: resources %s", t->config_key,
                  t->resources);
    }
    free(ts);
    cr_assert_eq(tune_run(&job, 1, &o, &rep, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(tt_report_measured(rep), 0);
    tune_report_free(rep);
}
