/* kset_swap.h: live swaps in a serving kernel set. While one thread runs a
 * set's kernels (the serving thread), another (a background tuner) may
 * hand it a better config for one (family, tuning key, M bucket); the
 * serving thread puts it in at a step boundary, watches how the new config
 * runs in its own per-call timings, and puts the old one back when the new
 * one runs slower.
 *
 *   any thread                         serving thread
 *   ----------                         --------------
 *   model_kset_swap_post: check the    model_kern_run: per call, its host
 *   config, compile it (here, off the    time into the (kernel, bucket)'s
 *   serving path), queue it              counters and recent samples
 *                                      model_kset_swap_apply, between steps:
 *                                        load queued configs into their
 *                                        buckets; judge watched swaps; undo
 *                                        slower ones
 *   model_kset_swap_reverted: the undone swaps (to mark stale)
 *
 * Timing: the host clock around each launch (two clock reads per call). On
 * cpu and emu launches are synchronous, so that is the kernel's time; on
 * GPUs (asynchronous launches) it is the launch's, so swaps are never
 * judged there (model_kset_live_enable says so).
 *
 * The judgement: the samples of the old config (up to MODEL_SWAP_SAMPLES
 * most recent calls of each kernel of the group at that bucket) against
 * the new config's, compared per exact row count M (a bucket covers several
 * M; time grows with M): per M with at least 3 samples on both sides the
 * ratio of the medians new / old, then their geometric mean weighted by
 * the smaller count. It is taken once MODEL_SWAP_SAMPLES new samples are
 * in (and the weights reach 16); a ratio above 1 + MODEL_SWAP_MARGIN undoes
 * the swap. A bucket that gets too few calls stays swapped, unjudged.
 *
 * Ownership: the live state belongs to the set (destroyed with it); the
 * posted code belongs to the queue until applied. Thread safety: post,
 * reverted, usage, choice_get and counts may be called from any thread;
 * enable and apply only from the serving thread. */
#ifndef MT_MODEL_KSET_SWAP_H
#define MT_MODEL_KSET_SWAP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kset.h"

#define MODEL_SWAP_SAMPLES 64
#define MODEL_SWAP_MARGIN 0.10

typedef struct model_kset_live model_kset_live;

/* Turns per-call timing and live swaps on (idempotent). Call on the
 * serving thread before it runs the set, after model_kset_select. log
 * (may be NULL) gets a line per swap applied or undone. MT_E_NOMEM. */
mt_status model_kset_live_enable(model_kset *ks, FILE *log, mt_err *err);
bool model_kset_live_on(const model_kset *ks);

/* Serving use of kernel i at bucket index b since enable: calls and the
 * sum of their times (ms). Any thread. */
typedef struct model_kern_usage {
    int64_t calls;
    double ms;
} model_kern_usage;
void model_kset_usage(const model_kset *ks, int i, int b, model_kern_usage *out);

/* A copy of kernel i's choice at bucket index b, consistent against swaps.
 * Any thread. */
void model_kset_choice_get(const model_kset *ks, int i, int b, model_choice *out);

/* Queues cfg for every kernel of family f with tuning key `key` at bucket
 * m (one of model_buckets): checks it is valid there for each, compiles
 * it on the calling thread and queues the code for the next apply. A
 * second post for the same bucket before an apply replaces the first.
 * MT_E_UNSUPPORTED on a batch-invariant set (its output would change) or
 * one without live swaps; MT_E_NOT_FOUND when no kernel has that key and
 * bucket; MT_E_INVALID for a config not valid there; compile errors. */
mt_status model_kset_swap_post(model_kset *ks, const kern_family *f, const char *key, int64_t m,
                               const kern_config *cfg, mt_err *err);

/* Serving thread, between steps: applies queued swaps and judges watched
 * ones (above). Returns how many selections changed (0 almost always: one
 * mutex and a look at the queue). A swap that cannot be loaded is dropped
 * and logged. */
int model_kset_swap_apply(model_kset *ks);

/* A swap undone because the new config ran slower in the set's own
 * timings. */
typedef struct model_swap_revert {
    const kern_family *fam;
    char key[KERN_KEY_MAX];
    int64_t m;
    char cfg_key[256];      /* the config taken out */
    double ratio;           /* new / old, the judgement above */
    double new_ms;          /* the new config's median per call at its most common M */
} model_swap_revert;

/* Moves up to cap undone swaps (oldest first) into out; returns how many.
 * Any thread. */
int model_kset_swap_reverted(model_kset *ks, model_swap_revert *out, int cap);

/* ---- for kset.c --------------------------------------------------------- */
void model_kset_live_note(model_kset_live *lv, const model_kern *k, int b, int64_t m,
                          uint64_t ns);
void model_kset_live_totals(model_kset_live *lv, int64_t *swaps, int64_t *reverted);
void model_kset_live_free(model_kset_live *lv);
model_kset_live *model_kset_live_get(const model_kset *ks);
void model_kset_live_set(model_kset *ks, model_kset_live *lv);

#endif
