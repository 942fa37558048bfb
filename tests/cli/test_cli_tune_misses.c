/* test_cli_tune_misses.c: `moetune tune --misses --db X` end to end with the
 * real binary on the cpu: a miss recorded the way the runtime records it
 * (db_lookup, db_lookup_record_miss, on this cpu's device record) is
 * tuned into X, the plan names its cost, and the lookup is an exact hit
 * afterwards; --misses refuses --family and the other job options. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "db/db.h"
#include "device/device.h"
#include "kernels/core/family.h"
#include "kernels/core/kern_db.h"
#include "test_tmp.h"
#include "test_run_cli.h"

static int run(const char *args, char **out)
{
    return test_run_cli("", args, out);
}

/* One lookup of gemm tiny at M on this cpu: its provenance; recorded as a
 * miss when asked. */
static db_provenance look_up(const char *path, int64_t m, bool record)
{
    dev_device *dev = NULL;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu", &(dev_open_opts){0}, &dev, &e), MT_OK, "%s", e.msg);
    db_device dd;
    kern_db_device(dev_get_props(dev), &dd);
    const kern_family *gemm = kern_family_find("gemm");
    char hash[65];
    kern_source_hash(gemm, DEV_BACKEND_CPU, hash);
    db_t *db = NULL;
    cr_assert_eq(db_open(path, record ? DB_OPEN_DEFAULT : DB_OPEN_READONLY, &db, &e), MT_OK,
                 "%s", e.msg);
    db_lookup_result r;
    cr_assert_eq(db_lookup(db, &dd, "gemm", gemm->version, hash, "N=64,K=96", m, &r, &e), MT_OK,
                 "%s", e.msg);
    if (record)
        cr_assert_eq(db_lookup_record_miss(db, &dd, "gemm", "N=64,K=96", NULL, m, &r, &e), MT_OK,
                     "%s", e.msg);
    db_close(db);
    dev_close(dev);
    return r.provenance;
}

Test(cli_tune_misses, tunes_a_recorded_miss_into_the_database, .timeout = 300)
{
    char dir[512], path[600], args[1024], *out;
    tmp_dir_make(dir, sizeof dir, "mt_cli_misses");
    snprintf(path, sizeof path, "%s/fleet.db", dir);
    cr_assert_eq(look_up(path, 4, true), DB_MISS);
    snprintf(args, sizeof args, "tune --misses --db %s --device cpu --budget 3 --max-reps 20",
             path);
    int rc = run(args, &out);
    cr_assert_eq(rc, 0, "exit %d\n%s", rc, out);
    cr_expect(strstr(out, "1 misses to tune, costliest first"), "%s", out);
    cr_expect(strstr(out, "gemm N=64,K=96 M=4: 1 x "), "%s", out);
    cr_expect(strstr(out, "misses: 1 recorded for this backend, 0 left out, 1 tuned"), "%s",
              out);
    free(out);
    cr_expect_eq(look_up(path, 4, false), DB_HIT_EXACT);
    /* A second run has nothing left to do. */
    rc = run(args, &out);
    cr_assert_eq(rc, 0, "exit %d\n%s", rc, out);
    cr_expect(strstr(out, "tuned for this device since"), "%s", out);
    cr_expect(strstr(out, "1 left out, 0 tuned"), "%s", out);
    free(out);
}

Test(cli_tune_misses, refuses_job_options)
{
    static const char *const bad[] = {
        "tune --misses --db x.db --family gemm",
        "tune --misses --db x.db --shape tiny",
        "tune --misses --db x.db --m 1,2",
        "tune --misses --db x.db --model dir",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out;
        int rc = run(bad[i], &out);
        cr_expect_eq(rc, 2, "%s: exit %d\n%s", bad[i], rc, out);
        cr_expect(strstr(out, "--misses takes its kernels"), "%s:\n%s", bad[i], out);
        free(out);
    }
}
