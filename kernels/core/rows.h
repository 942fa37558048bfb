/* rows.h: what the row-wise families share (ops_copy, ops_embed,
 * ops_residual, ops_silu_mul, ops_kv_store, ops_head_gemm, rmsnorm, rope). On
 * GPUs one block of THREADS threads (a warp multiple) takes ROWS rows; on
 * the cpu a work item takes ROWS rows. A plain row-wise family (its kernel
 * named as the family, taking every buffer in order and then M) is mostly
 * a table: its dims, presets, cases and problem (buffers, fill, reference,
 * cost), and KERN_ROWS_FAMILY with the impls below. The parameter tables
 * are static data and the functions are pure apart from the launches they
 * issue: all thread-safe. */
#ifndef MT_KERN_ROWS_H
#define MT_KERN_ROWS_H

#include "family.h"

/* GPU parameters of the plain row-wise families: THREADS {64, 128, 256},
 * then ROWS {1, 4}. */
#define KERN_ROWS_GPU_N_PARAMS 2
extern const kern_param_desc kern_rows_gpu_params[KERN_ROWS_GPU_N_PARAMS];
/* cpu parameter: ROWS {1, 4, 16}. */
#define KERN_ROWS_CPU_N_PARAMS 1
extern const kern_param_desc kern_rows_cpu_params[KERN_ROWS_CPU_N_PARAMS];

/* False, with the reason in why, when a block of `threads` is more than the
 * device allows or not a multiple of its warp. */
bool kern_rows_threads_ok(int threads, const dev_props *p, char *why, size_t cap);
/* valid() of an impl whose first parameter is THREADS and that has no
 * other limit. */
bool kern_rows_gpu_valid(const kern_shape *s, int64_t m, const kern_config *c,
                         const dev_props *p, char *why, size_t cap);
/* Default THREADS: 256 for wide rows where the device allows it, else 64;
 * the warp size when that is not a multiple of it or too many. */
int kern_rows_default_threads(bool wide, const dev_props *p);
/* default_config() of kern_rows_gpu_params for rows of n values:
 * THREADS kern_rows_default_threads (wide from 1024 values), ROWS 1. */
void kern_rows_gpu_config(int64_t n, const dev_props *p, kern_config *c);
/* default_config() of kern_rows_gpu_params for a family whose first dim
 * is its row length: kern_rows_gpu_config of that. */
void kern_rows_gpu_default(const kern_shape *s, int64_t m, const dev_props *p,
                           kern_config *c);
/* default_config() of kern_rows_cpu_params, or of any cpu impl whose one
 * parameter is rows (tokens) per work item: 16 once there are 16 rows per
 * compute unit, else 1. */
void kern_rows_cpu_default(const kern_shape *s, int64_t m, const dev_props *p,
                           kern_config *c);

/* Finds kernel `name` with signature sig and launches it over
 * ceil(M / ROWS) blocks (ROWS is 1 when the config has none) of THREADS
 * threads (1 on the cpu). args as dev_launch takes them. */
mt_status kern_rows_launch(const kern_ctx *c, const char *name, const char *sig, void **args,
                           mt_err *err);

/* Most ints kern_rows_run_ints passes after M. */
#define KERN_ROWS_MAX_INTS 4

/* run() of a plain row-wise family: kern_rows_launch of the kernel named
 * as the family (c->fam->name) with every buffer of the problem in the
 * family's order, then M (int), then the n_ints values of ints (n_ints <=
 * KERN_ROWS_MAX_INTS; copied, so they may live on the caller's stack). */
mt_status kern_rows_run_ints(const kern_ctx *c, const int *ints, int n_ints, mt_err *err);
/* kern_rows_run_ints with no ints after M. */
mt_status kern_rows_run(const kern_ctx *c, mt_err *err);

/* A row-wise family's impls on the shared parameters, as kern_family.gpu
 * and .cpu take them: pointers to compound literals (static storage at
 * file scope). On GPUs kern_rows_gpu_params, valid: kern_rows_gpu_valid;
 * on the cpu kern_rows_cpu_params, default: kern_rows_cpu_default. */
#define KERN_ROWS_GPU_IMPL(source_, default_config_, run_)                                   \
    (&(const kern_impl){.source = source_, .params = kern_rows_gpu_params,                   \
                        .n_params = KERN_ROWS_GPU_N_PARAMS, .valid = kern_rows_gpu_valid,    \
                        .default_config = default_config_, .run = run_})
#define KERN_ROWS_CPU_IMPL(source_, run_)                                                    \
    (&(const kern_impl){.source = source_, .params = kern_rows_cpu_params,                   \
                        .n_params = KERN_ROWS_CPU_N_PARAMS,                                  \
                        .default_config = kern_rows_cpu_default, .run = run_})

/* The kern_family initializer of a row-wise family whose every shape in
 * its dims' ranges is valid (no shape_ok), from the statics its file
 * defines under these names: the arrays dims, presets and cases, and the
 * functions buffers, fill, reference and cost. gpu_ and cpu_ are its
 * impls (KERN_ROWS_GPU_IMPL, KERN_ROWS_CPU_IMPL or its own). */
#define KERN_ROWS_FAMILY(name_, version_, summary_, gpu_, cpu_)                              \
    {                                                                                        \
        .name = name_, .version = version_, .summary = summary_, .dims = dims,               \
        .n_dims = sizeof dims / sizeof dims[0], .presets = presets,                          \
        .n_presets = sizeof presets / sizeof presets[0], .gpu = gpu_, .cpu = cpu_,           \
        .buffers = buffers, .fill = fill, .reference = reference, .cost = cost,              \
        .cases = cases, .n_cases = sizeof cases / sizeof cases[0],                           \
    }

#endif
