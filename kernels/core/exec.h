/* exec.h: the one executor of a kernel family. Every caller that runs a
 * family (the tuner's measurement worker, `moetune check`, the benchmarks,
 * the model runtime and its layers) goes through it:
 *
 *   open   (device, family, shape, config) -> compiled and loaded module
 *   run    on the caller's device buffers, for m rows and this call's
 *          runtime dims; sizes the scratch, fills the kernel context and
 *          issues the family's launches (asynchronous: no synchronize)
 *   close  frees the module and its own scratch
 *
 * Scratch: an exec grows a scratch buffer to what its config needs for the
 * call. By default each exec has its own; execs that run one after another
 * on the same stream (a model's kernels) can share one kern_scratch. A
 * scratch that grows synchronizes the device before freeing the smaller
 * buffer, since a launch still in flight may read it.
 *
 * Ownership: kern_exec_open_code takes the code object in every case (freed
 * on failure); an exec keeps it until closed. A shared kern_scratch must
 * outlive every exec that uses it; the device must outlive both.
 * destroy/close(NULL) is a no-op. Thread safety: one exec (and one scratch)
 * per thread at a time; distinct execs compile in parallel safely. */
#ifndef MT_KERN_EXEC_H
#define MT_KERN_EXEC_H

#include "family.h"

typedef struct kern_exec kern_exec;
typedef struct kern_scratch kern_scratch;

/* Compiles cfg for shape s on d; the code is the caller's (dev_code_free).
 * Thread-safe for distinct codes. */
mt_status kern_compile(dev_device *d, const kern_family *f, const kern_impl *im,
                       const kern_shape *s, const kern_config *cfg, dev_code **code,
                       mt_err *err);

/* Compiles and loads cfg (the implementation's default for s and m when
 * NULL) for the tuning dims of s. An invalid config is MT_E_INVALID with
 * the reason; a family without an implementation for the device's backend
 * MT_E_UNSUPPORTED. s is copied (its runtime dims are the defaults of run). */
mt_status kern_exec_open(dev_device *d, const kern_family *f, const kern_shape *s, int64_t m,
                         const kern_config *cfg, kern_exec **out, mt_err *err);

/* Loads an already compiled code object of cfg for s (the tuner compiles on
 * a pool of threads, the runtime shares one module among kernels). Takes
 * ownership of code. The config is not re-validated: it was when compiled. */
mt_status kern_exec_open_code(dev_device *d, const kern_family *f, const kern_shape *s,
                              const kern_config *cfg, dev_code *code, kern_exec **out,
                              mt_err *err);

void kern_exec_close(kern_exec *e);

/* Issues one call for m rows on bufs (device pointers in the family's
 * buffer order). s carries this call's runtime dims (NULL: the shape the
 * exec was opened with); its tuning dims must equal the exec's, else
 * MT_E_INVALID. m <= 0 does nothing. Errors name the family and M. Does
 * not synchronize. */
mt_status kern_exec_run(kern_exec *e, const kern_shape *s, int64_t m, void *const *bufs,
                        mt_err *err);

/* Makes e grow and use sc instead of its own scratch (NULL: its own again). */
void kern_exec_share_scratch(kern_exec *e, kern_scratch *sc);

dev_device *kern_exec_device(const kern_exec *e);
const kern_family *kern_exec_family(const kern_exec *e);
const kern_impl *kern_exec_impl(const kern_exec *e);
const kern_config *kern_exec_config(const kern_exec *e);
const kern_shape *kern_exec_shape(const kern_exec *e);
const dev_code *kern_exec_code(const kern_exec *e);

/* A device scratch buffer that grows on demand, shareable among execs. */
mt_status kern_scratch_create(dev_device *d, kern_scratch **out, mt_err *err);
void kern_scratch_destroy(kern_scratch *sc);
/* Bytes currently allocated. */
size_t kern_scratch_bytes(const kern_scratch *sc);

#endif
