/* hip_comgr.h: reads kernel resource usage (registers, LDS, scratch, spills)
 * from an AMD GPU code object with amd_comgr (private to device/, built
 * only with MOETUNE_HAVE_HIP). */
#ifndef MT_HIP_COMGR_H
#define MT_HIP_COMGR_H

#include "device/device.h"

/* Fills info->kernels and info->n_kernels from the code object's
 * amdhsa.kernels metadata (an ELF shared object as hipRTC returns it, or a
 * relocatable). At most DEV_MAX_KERNELS_PER_CODE kernels are listed.
 * Writes the code object's target ("gfx90a", feature suffixes dropped) to
 * target when non-NULL. MT_E_FORMAT names what could not be read.
 * Thread-safe: holds the LLVM lock (below) while it calls comgr. */
mt_status hip_comgr_inspect(const void *bytes, size_t len, dev_code_info *info,
                            char *target, size_t target_cap, mt_err *err);

/* Counts the explicit arguments of kernel `name` (hidden_* arguments the
 * compiler adds are not counted) into *n. MT_E_NOT_FOUND when the code
 * object has no such kernel. Thread-safe, as hip_comgr_inspect. */
mt_status hip_comgr_count_args(const void *bytes, size_t len, const char *name, int *n,
                               mt_err *err);

/* ROCm 5.2's hipRTC and comgr share one copy of LLVM whose global state
 * (its command-line option registry among it) is set up and reset by each
 * compile; two threads in it at once can abort the process ("CommandLine
 * Error: Option 'h' registered more than once", seen in CI on a second
 * compile that overlapped a first, not only on the first use). Every call
 * into hipRTC or comgr holds this one process-wide lock; the lock is not
 * recursive. Compiles through the offline clang run in child processes
 * and stay parallel. */
void hip_llvm_lock(void);
void hip_llvm_unlock(void);

/* Waves per SIMD that the register use of one kernel allows on a gfx9 arch
 * (gfx900, gfx906, gfx908, gfx90a, gfx940-942, gfx950); -1 for archs it does
 * not model. */
int hip_waves_per_simd(const char *arch, int vgprs, int agprs);

#endif
