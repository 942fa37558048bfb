/* db_testing.h: the part of the db API that only the tests call: explicit
 * transactions, misses counted by hand, coverage queries, code objects and
 * the re-timing mark. Everything else (contracts on ownership, failure and
 * concurrency) is as db.h says; a module that starts to need one of these
 * moves its declaration back to db.h. */
#ifndef MT_DB_TESTING_H
#define MT_DB_TESTING_H

#include "db.h"

/* Explicit transaction: everything between db_begin and db_commit is one
 * atomic write (the write lock is taken at db_begin, waiting and retrying
 * while another writer holds it). Calls nest: an inner begin/commit is a
 * savepoint. db_rollback undoes back to the matching db_begin. Every write
 * call also works outside an explicit transaction (it runs its own). */
mt_status db_begin(db_t *db, mt_err *err);
mt_status db_commit(db_t *db, mt_err *err);
void db_rollback(db_t *db);

/* Records that a winner was re-timed now at time_ms and still wins:
 * db_winner_verify with stale false. MT_E_NOT_FOUND when there is no such
 * winner. */
mt_status db_winner_mark_verified(db_t *db, int64_t device_id, int64_t kernel_id,
                                  const char *shape_key, int64_t m, double time_ms, mt_err *err);

/* Coverage of a model: the lookup of each query, recording no misses. */
typedef struct db_coverage_query {
    const char *family;
    int version;
    const char *source_hash;
    const char *shape_key;
    int64_t m;
} db_coverage_query;
mt_status db_coverage(db_t *db, const db_device *dev, const db_coverage_query *queries, int n,
                      db_lookup_result *out, mt_err *err);

/* Counts one miss of (device, family, shape, m): count + 1, first_seen kept,
 * last_seen now, last_reason DB_MISS. Upserts the device. */
mt_status db_miss_record(db_t *db, const db_device *dev, const char *family,
                         const char *shape_key, int64_t m, mt_err *err);

/* Stores a compiled code object under (target, cache_key), replacing an
 * earlier one. target is the device arch (or fingerprint) it runs on;
 * cache_key the compile-cache key. */
mt_status db_code_put(db_t *db, const char *target, const char *cache_key, const void *blob,
                      size_t size, mt_err *err);
/* Fetches a code object into a malloc'd buffer the caller frees.
 * MT_E_NOT_FOUND (and *blob NULL) when absent. */
mt_status db_code_get(db_t *db, const char *target, const char *cache_key, void **blob,
                      size_t *size, mt_err *err);

/* Sets the winner of (device, kernel, shape, m), replacing any earlier one.
 * Links it to the trial with the same config key when there is one. (The
 * tuner's winners come from its trials; tests plant winners directly.) */
mt_status db_winner_set(db_t *db, const db_winner *w, mt_err *err);

#endif
