/* rows.h: what the row-wise families share (ops_copy, ops_embed,
 * ops_residual, ops_silu_mul, ops_kv_store, ops_head_gemm). On GPUs one
 * block of THREADS threads (a warp multiple) takes ROWS rows; on the cpu a
 * work item takes ROWS rows. The parameter tables are static data and the
 * functions are pure: all thread-safe. */
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
/* default_config() of kern_rows_cpu_params: 16 rows per work item once
 * there are 16 rows per compute unit, else 1. */
void kern_rows_cpu_default(const kern_shape *s, int64_t m, const dev_props *p,
                           kern_config *c);

/* Finds kernel `name` with signature sig and launches it over
 * ceil(M / ROWS) blocks (ROWS is 1 when the config has none) of THREADS
 * threads (1 on the cpu). args as dev_launch takes them. */
mt_status kern_rows_launch(const kern_ctx *c, const char *name, const char *sig, void **args,
                           mt_err *err);

#endif
