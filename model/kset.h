/* kset.h: a kernel set: the kernels an application runs and the config each
 * runs at each token count. The model runtime holds one for its kernel plan
 * (plan.h); `moetune bench` holds one for the MoE layer it times, so both
 * run what the database gives, through the same executors.
 *
 * A kernel (model_kern) is one family at one shape (tuning dims plus
 * representative runtime dims) with the largest M it will be called with.
 * model_kset_select asks the database, for every M bucket up to the first
 * bucket >= that M, for a config (db_lookup: exact, nearest tuned M, other
 * device of the same arch, stale, miss) and falls back to the family's
 * default for that bucket, saying why; a database config that is not valid
 * for the shape and device is rejected (the default runs, the report says
 * why). Each distinct (family, tuning key, config) is compiled once, on a
 * few threads, into one kern_exec shared by every kernel and bucket that
 * asks for it; all execs of a set share one scratch buffer. A call with M
 * rows runs the config of the smallest bucket >= M (the last past the end).
 *
 * Ownership: the set owns its kernels, executors and scratch; the device,
 * the database (may be NULL) and the log stream are the caller's and must
 * outlive the set. Kernels are read-only to callers. destroy(NULL) is a
 * no-op. Not thread-safe: one thread runs a set's kernels (they launch on
 * the device's stream and share scratch). A serving set can have its
 * choices replaced while it runs (kset_swap.h: other threads post
 * compiled configs, the running thread applies them between steps). */
#ifndef MT_MODEL_KSET_H
#define MT_MODEL_KSET_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "db/db.h"
#include "device/device.h"
#include "kernels/core/exec.h"
#include "kernels/core/family.h"

/* The M buckets (the tuner's default list). */
#define MODEL_N_BUCKETS 16
extern const int64_t model_buckets[MODEL_N_BUCKETS];

/* Where a bucket's config came from. */
typedef enum model_prov {
    MODEL_PROV_TUNED = 0,        /* exact hit */
    MODEL_PROV_NEAREST = 1,      /* tuned at another M of this shape */
    MODEL_PROV_OTHER_DEVICE = 2, /* tuned on another device of the same arch (used) */
    MODEL_PROV_STALE = 3,        /* entries only for another source hash: default runs */
    MODEL_PROV_MISS = 4,         /* nothing in the database: default runs, miss recorded */
    MODEL_PROV_NO_DB = 5,        /* no database given: default */
    MODEL_PROV_REJECTED = 6,     /* the database's config is not valid here: default runs */
    MODEL_PROV_COUNT
} model_prov;
const char *model_prov_name(model_prov p);

typedef struct model_choice {
    int64_t m;           /* bucket */
    kern_config cfg;
    model_prov prov;
    int64_t tuned_m;     /* M the config was tuned at (tuned/nearest/other device) */
    bool miss_recorded;
    char note[192];      /* other device's name, stale hash, rejection reason */
    int64_t pinned_m;    /* batch-invariant: the bucket whose choice runs every M; 0 */
    int module;          /* index of the set's executor */
    bool swapped;        /* replaced while serving (model_kset_replace) */
} model_choice;

typedef struct model_kern {
    const kern_family *fam;
    const kern_impl *impl;
    kern_shape shape;            /* tuning dims + representative runtime dims */
    char key[KERN_KEY_MAX];      /* tuning key */
    char use[64];                /* what it is for ("experts up") */
    int64_t m_max;               /* largest M it is called with */
    int n;                       /* buckets in use (after select) */
    model_choice ch[MODEL_N_BUCKETS];
    struct model_kset *set;
    int index;                   /* in the set (model_kset_kernel) */
} model_kern;

typedef struct model_kset model_kset;

typedef struct model_selection_counts {
    int tuned, nearest, other_device, stale, defaults;
    int swapped;          /* of those, selections replaced while serving (counted in tuned) */
    int64_t swaps, swapped_back; /* live swaps applied, and of them the ones undone
                                    (kset_swap.h) */
} model_selection_counts;

/* An empty set on d; db may be NULL (every bucket runs the default); log
 * receives the selection summary (NULL: stderr). */
mt_status model_kset_create(dev_device *d, db_t *db, FILE *log, model_kset **out, mt_err *err);
void model_kset_destroy(model_kset *ks);

/* Batch-invariant selection (call before select): every kernel runs one
 * config at every M, and no config whose sums follow thread timing (split-K
 * with atomics; kern_impl.order_varies). The config is the one chosen for
 * M=1 (decode, where serving spends its steps) when it runs every M, else
 * the largest bucket's, else the default at those buckets; select fails
 * naming the kernel when none does.
 * A kernel whose rows are computed independently then gives each row the
 * same bits whatever else is in the batch. A kernel whose sum order no
 * config changes (kern_impl.order_fixed) keeps its choice per M. */
void model_kset_set_batch_invariant(model_kset *ks, bool on);
bool model_kset_batch_invariant(const model_kset *ks);

/* Adds a kernel for family f at shape s; use names it in reports. Fails
 * with MT_E_UNSUPPORTED naming the family when it has no implementation
 * for the device's backend. *out (may be NULL) is owned by the set. */
mt_status model_kset_add(model_kset *ks, const kern_family *f, const kern_shape *s,
                         const char *use, int64_t m_max, model_kern **out, mt_err *err);
/* Adds a kernel from a shape text (preset or key, runtime dims included). */
mt_status model_kset_add_text(model_kset *ks, const char *family, const char *shape_text,
                              const char *use, int64_t m_max, model_kern **out, mt_err *err);

/* Chooses a config for every kernel and bucket, compiles and loads every
 * distinct one, and logs a one-line summary (and, with a database, a line
 * per kernel). Call once, after the last add. */
mt_status model_kset_select(model_kset *ks, mt_err *err);

/* Runs k for m rows on bufs (device pointers in the family's buffer order);
 * shape (NULL: k's) carries this call's runtime dims. m <= 0 does nothing.
 * Asynchronous; errors name the family, use, key and M. */
mt_status model_kern_run(model_kern *k, int64_t m, const kern_shape *shape, void *const *bufs,
                         mt_err *err);
/* The choice a call with m rows runs. */
const model_choice *model_kern_choice(const model_kern *k, int64_t m);
/* Sets runtime dim `name` of s (a copy of k's shape). */
void model_kern_shape_set(const model_kern *k, kern_shape *s, const char *name, int64_t v);

/* Replaces k's choice of bucket index b (into k->ch) with cfg: the
 * executor of (family, key, cfg) when the set has one, else one opened
 * from code. Takes code in every case (NULL: the executor must exist).
 * *old (may be NULL) receives the choice it replaced. Call on the thread
 * that runs the set, between calls (kset_swap.h does). MT_E_UNSUPPORTED on
 * a batch-invariant set (one config per kernel at every M is its promise);
 * MT_E_INVALID for a bucket out of range or no code for a new config. */
mt_status model_kset_replace(model_kset *ks, model_kern *k, int b, const kern_config *cfg,
                             dev_code *code, model_choice *old, mt_err *err);
/* The device the set runs on. */
dev_device *model_kset_device(const model_kset *ks);

int model_kset_n_kernels(const model_kset *ks);
model_kern *model_kset_kernel(const model_kset *ks, int i);
int model_kset_n_modules(const model_kset *ks);
void model_kset_counts(const model_kset *ks, model_selection_counts *out);
/* The full table: one row per kernel and bucket, then a summary. */
void model_kset_report(const model_kset *ks, FILE *f);

#endif
