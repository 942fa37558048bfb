/* test_db_util.h: small helpers shared by the db/ tests: temporary folders,
 * whole-file bytes, a few devices and trials, loading SQL fixtures with
 * plain SQLite. Header-only; every function is static. */
#ifndef MT_TEST_DB_UTIL_H
#define MT_TEST_DB_UTIL_H

#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/files.h"
#include "common/rng.h"
#include "db/db.h"
#include "db/db_testing.h"
#include "test_tmp.h"

#ifndef MOETUNE_SOURCE_DIR
#define MOETUNE_SOURCE_DIR "."
#endif
#define DB_V1_FIXTURE MOETUNE_SOURCE_DIR "/tests/fixtures/db_v1.sql"
#define DB_V2_FIXTURE MOETUNE_SOURCE_DIR "/tests/fixtures/db_v2.sql"
#define DB_V3_FIXTURE MOETUNE_SOURCE_DIR "/tests/fixtures/db_v3.sql"
#define DB_V5_FIXTURE MOETUNE_SOURCE_DIR "/tests/fixtures/db_v5.sql"

#define SHAPE_A "H=256,I=128,E=16,topk=4,a=bf16"
#define HASH_A "5f1c0b6e9d2a4e7f8a3b1c2d4e5f60718293a4b5c6d7e8f9012345678abcdef0"
#define HASH_B "aa11bb22cc33dd44ee55ff6600112233445566778899aabbccddeeff00112233"

/* A fresh folder (removed when the test process ends, or by rm_tree). */
static inline void tmp_dir(char *out, size_t cap) { tmp_dir_make(out, cap, "mt-dbtest"); }

static inline void rm_tree(const char *dir) { tmp_rm_tree(dir); }

/* Whole file, or NULL when it cannot be read; *n its size. */
static inline char *slurp(const char *path, size_t *n)
{
    char *data = NULL;
    if (mt_file_read(path, &data, n, NULL) != MT_OK)
        return NULL;
    return data;
}

static inline void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* Builds a database file from SQL text with SQLite alone. */
static inline void load_sql(const char *sql_path, const char *db_path)
{
    char *sql = slurp(sql_path, NULL);
    cr_assert_not_null(sql, "cannot read %s", sql_path);
    sqlite3 *s;
    cr_assert_eq(sqlite3_open(db_path, &s), SQLITE_OK);
    char *msg = NULL;
    int rc = sqlite3_exec(s, sql, NULL, NULL, &msg);
    cr_assert_eq(rc, SQLITE_OK, "%s: %s", sql_path, msg ? msg : "");
    sqlite3_close(s);
    free(sql);
}

/* One integer from SQL run with plain SQLite on path. */
static inline long long sql_int(const char *db_path, const char *sql)
{
    sqlite3 *s;
    cr_assert_eq(sqlite3_open_v2(db_path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(s, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql,
                 sqlite3_errmsg(s));
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s", sql);
    long long v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(s);
    return v;
}

static inline db_device dev_mi210(void)
{
    return (db_device){.backend = DB_BACKEND_HIP,
                       .arch = "gfx90a",
                       .name = "AMD Instinct MI210",
                       .runtime_version = "hip 5.2.21153",
                       .driver_version = "6.2.4",
                       .fingerprint = "fp-mi210-a",
                       .compute_units = 104};
}

static inline db_device dev_mi250(void)
{
    return (db_device){.backend = DB_BACKEND_HIP,
                       .arch = "gfx90a",
                       .name = "AMD Instinct MI250X",
                       .runtime_version = "hip 5.2.21153",
                       .fingerprint = "fp-mi250x",
                       .compute_units = 110};
}

static inline db_t *open_ok(const char *path, db_open_flags flags)
{
    db_t *db = NULL;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_open(path, flags, &db, &e), MT_OK, "db_open %s: %s", path, e.msg);
    return db;
}

static inline int64_t device_id(db_t *db, const db_device *d)
{
    int64_t id = 0;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_device_upsert(db, d, &id, &e), MT_OK, "%s", e.msg);
    cr_assert_gt(id, 0);
    return id;
}

static inline int64_t kernel_id(db_t *db, const char *family, int version, const char *hash)
{
    db_kernel k = {family, version, hash};
    int64_t id = 0;
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_kernel_upsert(db, &k, &id, &e), MT_OK, "%s", e.msg);
    cr_assert_gt(id, 0);
    return id;
}

/* An ok trial; strings are not copied (the caller keeps them alive). */
static inline db_trial ok_trial(int64_t dev, int64_t ker, const char *shape, int64_t m,
                                const char *key, const char *json, double median)
{
    return (db_trial){.device_id = dev,
                      .kernel_id = ker,
                      .shape_key = shape,
                      .m = m,
                      .config_key = key,
                      .config_json = json,
                      .status = DB_TRIAL_OK,
                      .time_min_ms = median * 0.97,
                      .time_median_ms = median,
                      .time_p10_ms = median * 0.98,
                      .time_p90_ms = median * 1.05,
                      .repetitions = 100,
                      .gflops = 1000.0 / median,
                      .gbps = 250.0 / median,
                      .resources_json = NULL,
                      .error = NULL,
                      .compile_ms = 90.5,
                      .created_ms = 0};
}

static inline void insert_ok(db_t *db, const db_trial *t)
{
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_trial_insert(db, t, &e), MT_OK, "%s", e.msg);
}

static inline void set_winner(db_t *db, int64_t dev, int64_t ker, const char *shape, int64_t m,
                              const char *key, const char *json, double t)
{
    db_winner w = {.device_id = dev, .kernel_id = ker, .shape_key = shape, .m = m,
                   .config_key = key, .config_json = json, .time_ms = t};
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_winner_set(db, &w, &e), MT_OK, "%s", e.msg);
}

static inline char *export_text(db_t *db)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    cr_assert_not_null(f);
    mt_err e = MT_ERR_INIT;
    cr_assert_eq(db_export(db, f, &e), MT_OK, "%s", e.msg);
    fclose(f);
    return buf;
}

#endif
