/* replay.h: replay tables (the .csv files in bench/data/): every config of a kernel
 * family's space at one shape and a few M, timed exhaustively on one
 * machine, and the replay of a search strategy against such a table: the
 * strategy proposes, the table answers with the time measured for that
 * config, and the best time found within a budget is compared with the
 * table's optimum. bench_replay writes and replays the tables; the tuner
 * tests replay a committed one.
 *
 * File format (text, one table per file), version 3:
 *   # moetune replay table 3
 *   # family: gemm                        (then version, source_hash)
 *   # shape: N=256,K=512,...              (the canonical shape key)
 *   # shard: 1/6                          (optional: only that shard's configs)
 *   # device: cpu                         (backend; then cpu, isa, cores,
 *   # ...                                  date, load: free text)
 *   m,status,time_ms,min_ms,max_ms,passes,config
 *   32,ok,0.0122,0.0120,0.0131,3,NR=1,MR=2,...
 * Each config was timed in several passes over the space (bench_replay
 * sweep): time_ms is the median of the passes' minimum times, min_ms and
 * max_ms the lowest and highest, passes how many gave a time. The median
 * over passes, not the lowest: on a VM whose memory speed moves by the
 * minute, the lowest of a few passes crowns whichever config was timed in
 * the fastest minute (docs/BENCHMARKS.md). Version 2 has the columns
 * m,status,time_ms,max_ms,passes,config with the lowest as its time;
 * version 1 (one pass) m,status,median_ms,min_ms,p10_ms,p90_ms,reps,config
 * with the median as its time. The config key is the last field and contains
 * commas; status is a trial status name (docs/TUNING.md), ok when any pass
 * was. Skipped rows carry their partial median (abandoned at over 2x the
 * best so far). */
#ifndef MT_BENCH_REPLAY_H
#define MT_BENCH_REPLAY_H

#include <stdint.h>

#include "common/status.h"
#include "db/db.h"
#include "kernels/core/family.h"
#include "tuner/tuner.h"

typedef struct replay_row {
    int64_t m;
    db_trial_status status;
    double median_ms;  /* the table's time (version 2: min over passes); NAN: none */
    char config[DB_CONFIG_KEY_MAX + 1];
} replay_row;

typedef struct replay_table {
    char family[64];
    char shape[KERN_KEY_MAX];
    char device[32];  /* backend name: cpu, emu, hip */
    int shard_index, shard_count; /* "# shard: I/N": the table is that shard
                                     of the space (tune_shard_of); 0: all */
    int cores;         /* "# cores: N" (0: not given) */
    char machine[512]; /* the other header lines, joined by "; " */
    int n;
    replay_row *rows; /* malloc'd */
} replay_table;

/* Reads a table; errors name the path and line. The caller frees with
 * replay_table_free (also after a failure). */
mt_status replay_table_read(const char *path, replay_table *t, mt_err *err);
void replay_table_free(replay_table *t);

/* The device properties a replay of t must use: the table's backend, and
 * on cpu as many worker threads as the machine that swept it had cores, so
 * that defaults and validity that depend on the core count (split sizes,
 * items per thread) are the sweep's and not this machine's. */
mt_status replay_table_props(const replay_table *t, dev_props *out, mt_err *err);

/* The distinct M of a table, ascending (up to cap); returns the count. */
int replay_table_ms(const replay_table *t, int64_t *ms, int cap);

/* The table's time for config at m as a search sees it: the median of an
 * ok or skipped row, INFINITY for a failed or absent one. */
double replay_table_time(const replay_table *t, int64_t m, const char *config);
/* The lowest ok median at m (INFINITY when none) and the number of rows. */
double replay_table_optimum(const replay_table *t, int64_t m, int *rows);

/* Replays one search: strategy st from seed with `budget` proposals on the
 * family's implementation im for shape s at m, the table answering. Returns
 * the best time found (INFINITY when nothing ran). *space receives the
 * search's valid space (may be NULL). */
double replay_search(const kern_family *f, const kern_impl *im, const kern_shape *s, int64_t m,
                     const dev_props *p, tune_strategy st, uint64_t seed, int budget,
                     const replay_table *t, int *space);

/* replay_search with the tuner's transfer: seeds (n_seeds configs, may be
 * NULL; the first REPLAY_TRANSFER_SEEDS) are proposed first after the
 * default, as the tuner's transfer seeds are; top (room for *n_top, at most
 * 16; may be NULL) receives the fastest configs found, fastest first, and
 * *n_top their count. */
double replay_search_ex(const kern_family *f, const kern_impl *im, const kern_shape *s, int64_t m,
                        const dev_props *p, tune_strategy st, uint64_t seed, int budget,
                        const replay_table *t, int *space, const kern_config *seeds, int n_seeds,
                        kern_config *top, int *n_top);

/* The tuner seeds an M with the winner and 4 runner-ups of the nearest
 * M tuned before it (docs/TUNING.md, "transfer"). */
#define REPLAY_TRANSFER_SEEDS 5

/* Over `seeds` seeds from seed0: the fraction of the optimum reached
 * (optimum / best found) per seed, summarised. */
typedef struct replay_score {
    int budget, seeds;
    double median, mean, p10; /* of optimum / best; p10: the worst tenth */
    double hit;               /* share of seeds that found the optimum itself */
} replay_score;
void replay_score_strategy(const kern_family *f, const kern_impl *im, const kern_shape *s,
                           int64_t m, const dev_props *p, tune_strategy st, uint64_t seed0,
                           int seeds, int budget, const replay_table *t, replay_score *out);
/* The same with the tuner's transfer: for each seed, the strategy first
 * searches from_m with the same budget, and its fastest
 * REPLAY_TRANSFER_SEEDS configs seed the search at m (from_m <= 0: none,
 * as replay_score_strategy). */
void replay_score_transfer(const kern_family *f, const kern_impl *im, const kern_shape *s,
                           int64_t m, int64_t from_m, const dev_props *p, tune_strategy st,
                           uint64_t seed0, int seeds, int budget, const replay_table *t,
                           replay_score *out);

#endif
