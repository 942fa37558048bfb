/* bench_db.c: lookups per second from a database holding 100,000 trials
 * (50 shapes x 20 M buckets x 100 configs, winners recomputed), warm. Prints
 * the rate of exact and nearest-M lookups against the target (100,000/s)
 * and against the rate of one bare indexed SQLite point query on the same
 * file, measured in the same run (the floor a lookup is built on).
 *
 * usage: bench_db [DIR]   (DIR: where the temporary database goes; /tmp) */
#define _GNU_SOURCE
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rng.h"
#include "db/db.h"

enum { SHAPES = 50, MS = 20, CONFIGS = 100, LOOKUPS = 100000 };
static const double target_per_s = 100000.0;

static int check(mt_status st, const mt_err *e, const char *what)
{
    if (st != MT_OK) {
        fprintf(stderr, "bench_db: %s: %s\n", what, e->msg);
        exit(1);
    }
    return 0;
}

/* Thread CPU time: on a shared machine the wall-clock rate depends on the
 * load; the CPU-time rate does not (much). Both are printed. */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The token counts vLLM's MoE tuning sweeps, plus two. */
static const int64_t buckets[MS] = {1,   2,   4,    8,    16,   24,   32,   48,   64,   96,
                                    128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192};
static int64_t bucket(int i) { return buckets[i]; }

int main(int argc, char **argv)
{
    char path[512];
    snprintf(path, sizeof path, "%s/bench_db_%d.db", argc > 1 ? argv[1] : "/tmp", (int)getpid());
    mt_err e = MT_ERR_INIT;
    db_t *db;
    check(db_open(path, DB_OPEN_DEFAULT, &db, &e), &e, "open");
    db_device dev = {DB_BACKEND_HIP, "gfx90a", "AMD Instinct MI210", "hip 5.2", "", "bench-fp", 104};
    db_kernel ker = {"moe_gemm", 1, "0123456789abcdef0123456789abcdef"};
    int64_t dev_id, ker_id;
    check(db_device_upsert(db, &dev, &dev_id, &e), &e, "device");
    check(db_kernel_upsert(db, &ker, &ker_id, &e), &e, "kernel");

    static char shapes[SHAPES][64], keys[CONFIGS][32], json[CONFIGS][64];
    for (int s = 0; s < SHAPES; s++)
        snprintf(shapes[s], sizeof shapes[s], "H=%d,I=2048,E=256,topk=8,a=bf16,w=mxfp4", 256 * (s + 1));
    for (int c = 0; c < CONFIGS; c++) {
        snprintf(keys[c], sizeof keys[c], "BM=%d,BN=%d,BK=%d", 16 << (c % 4), 32 << (c % 3), c);
        snprintf(json[c], sizeof json[c], "{\"BM\":%d,\"BN\":%d,\"BK\":%d}", 16 << (c % 4),
                 32 << (c % 3), c);
    }
    mt_rng rng;
    mt_rng_seed(&rng, 42);
    uint64_t t0 = mt_now_ns();
    db_trial *batch = calloc(CONFIGS * MS, sizeof *batch);
    for (int s = 0; s < SHAPES; s++) {
        int n = 0;
        for (int mi = 0; mi < MS; mi++)
            for (int c = 0; c < CONFIGS; c++) {
                double t = 0.01 + mt_rng_uniform(&rng, 0.0f, 1.0f);
                batch[n++] = (db_trial){.device_id = dev_id, .kernel_id = ker_id,
                                        .shape_key = shapes[s], .m = bucket(mi),
                                        .config_key = keys[c], .config_json = json[c],
                                        .status = DB_TRIAL_OK, .time_min_ms = t * 0.98,
                                        .time_median_ms = t, .time_p10_ms = t * 0.99,
                                        .time_p90_ms = t * 1.03, .repetitions = 100,
                                        .gflops = 1.0 / t, .gbps = 0.5 / t, .compile_ms = 80};
            }
        check(db_trials_insert(db, batch, n, &e), &e, "insert");
    }
    free(batch);
    double insert_s = (double)(mt_now_ns() - t0) * 1e-9;
    t0 = mt_now_ns();
    int64_t changed;
    check(db_winners_recompute(db, 0, 0, NULL, 0, &changed, &e), &e, "recompute");
    double recompute_s = (double)(mt_now_ns() - t0) * 1e-9;
    db_stats st;
    check(db_stats_get(db, &st, &e), &e, "stats");
    printf("bench_db: %lld trials (inserted in %.2f s, %.0f/s), %lld winners (recomputed in %.2f s)\n",
           (long long)st.trials, insert_s, (double)st.trials / insert_s, (long long)st.winners,
           recompute_s);

    /* Floor: one bare indexed point query per iteration, same file. */
    sqlite3 *raw;
    sqlite3_open_v2(path, &raw, SQLITE_OPEN_READONLY, NULL);
    sqlite3_stmt *q;
    sqlite3_prepare_v3(raw,
                       "SELECT config_json FROM winners WHERE device_id = ?1 AND kernel_id = ?2 "
                       "AND shape = ?3 AND m = ?4",
                       -1, SQLITE_PREPARE_PERSISTENT, &q, NULL);
    long found = 0;
    uint64_t c0 = 0;
    for (int pass = 0; pass < 2; pass++) { /* pass 0 warms up */
        t0 = mt_now_ns();
        c0 = cpu_ns();
        for (int i = 0; i < LOOKUPS; i++) {
            sqlite3_bind_int64(q, 1, dev_id);
            sqlite3_bind_int64(q, 2, ker_id);
            sqlite3_bind_text(q, 3, shapes[i % SHAPES], -1, SQLITE_STATIC);
            sqlite3_bind_int64(q, 4, bucket((i / SHAPES) % MS));
            found += sqlite3_step(q) == SQLITE_ROW;
            sqlite3_reset(q);
        }
    }
    double floor_rate = LOOKUPS / ((double)(mt_now_ns() - t0) * 1e-9);
    double floor_cpu = LOOKUPS / ((double)(cpu_ns() - c0) * 1e-9);
    sqlite3_finalize(q);
    sqlite3_close(raw);

    /* db_lookup, exact hits and nearest-M hits, warm. */
    double rate[2], crate[2];
    long hits[2] = {0, 0};
    for (int kind = 0; kind < 2; kind++)
        for (int pass = 0; pass < 2; pass++) {
            t0 = mt_now_ns();
            c0 = cpu_ns();
            for (int i = 0; i < LOOKUPS; i++) {
                int64_t m = bucket((i / SHAPES) % MS);
                if (kind == 1)
                    m = m * 3 / 2 + 1; /* between buckets */
                db_lookup_result r;
                check(db_lookup(db, &dev, ker.family, ker.version, ker.source_hash,
                                shapes[i % SHAPES], m, &r, &e),
                      &e, "lookup");
                hits[kind] += r.provenance == (kind ? DB_HIT_NEAREST : DB_HIT_EXACT) ||
                              (kind && r.provenance == DB_HIT_EXACT);
            }
            rate[kind] = LOOKUPS / ((double)(mt_now_ns() - t0) * 1e-9);
            crate[kind] = LOOKUPS / ((double)(cpu_ns() - c0) * 1e-9);
        }
    printf("bench_db: per wall second (this machine's load included) and per CPU second:\n");
    printf("bench_db: bare indexed query   %10.0f /s  %10.0f /cpu-s  (%ld/%d found)\n", floor_rate,
           floor_cpu, found / 2, LOOKUPS);
    static const char *const names[2] = {"exact    ", "nearest M"};
    for (int k = 0; k < 2; k++)
        printf("bench_db: db_lookup %s  %10.0f /s  %10.0f /cpu-s  = %.2fx target (100000/s) "
               "per cpu-s, %.2fx bare query (%ld/%d hits)\n",
               names[k], rate[k], crate[k], crate[k] / target_per_s, crate[k] / floor_cpu,
               hits[k] / 2, LOOKUPS);
    db_close(db);
    char side[560];
    unlink(path);
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);
    return 0;
}
