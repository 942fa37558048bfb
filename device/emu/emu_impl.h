/* emu_impl.h: private pieces of the emu backend (device/emu*.c), the CPU
 * emulator that runs HIP kernel sources. See docs/EMU.md.
 *
 *   emu.c         the backend table: open, props, compile, modules, memory
 *   emu_mem.c     buffers with guard pages, and naming an address
 *   emu_fiber.c   fiber stacks and the context switch
 *   emu_exec.c    the worker pool, the block scheduler, barriers, warp ops
 *   emu_signal.c  fault and timeout signals turned into launch errors
 *   emu_mma.c     matrix instructions (MMA) with the vendors' layouts
 *
 * Thread safety: an emu_exec is driven by one caller at a time (the device
 * API's rule); its workers run blocks in parallel. */
#ifndef MT_EMU_IMPL_H
#define MT_EMU_IMPL_H

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/device_impl.h"

#define MT_EMU_ABI_ONLY
#include "prelude_emu.h"
#undef MT_EMU_ABI_ONLY

#define EMU_MAX_BLOCK_THREADS 1024
#define EMU_SHARED_BYTES 65536

/* ---- buffers (emu_mem.c) ------------------------------------------------- */

typedef struct emu_buf {
    uintptr_t user;   /* what dev_alloc returned: 16-byte aligned */
    size_t size;      /* as requested */
    char *map;        /* the mapping: guard page, data pages, guard page */
    size_t map_len;
} emu_buf;

typedef struct emu_mem {
    pthread_mutex_t mu;
    emu_buf *v;
    int n, cap;
    size_t page;
} emu_mem;

void emu_mem_init(emu_mem *m);
void emu_mem_destroy(emu_mem *m); /* frees every buffer still allocated */
/* The end of the data (rounded up to 16 bytes) touches the trailing guard
 * page; the leading guard page sits below the data page. */
mt_status emu_mem_alloc(emu_mem *m, size_t bytes, void **ptr, mt_err *err);
void emu_mem_free(emu_mem *m, void *ptr); /* unknown pointers are ignored */
/* MT_OK when [p, p+n) lies inside one buffer, else MT_E_INVALID naming it. */
mt_status emu_mem_check(emu_mem *m, const void *p, size_t n, const char *what,
                        mt_err *err);
/* Describes addr relative to the nearest buffer ("12 bytes past the end of
 * buffer 0x7f.. (4096 bytes)"). Needs no lock: called during a launch, when
 * the API guarantees no alloc or free runs. */
void emu_mem_describe(const emu_mem *m, uintptr_t addr, char *out, size_t cap);

/* ---- fibers (emu_fiber.c) ------------------------------------------------ */

typedef struct emu_stack {
    char *map;     /* guard page + stack */
    size_t map_len;
    char *lo;      /* lowest usable byte (just above the guard page) */
    size_t size;   /* usable bytes */
} emu_stack;

mt_status emu_stack_alloc(emu_stack *s, size_t size, mt_err *err);
void emu_stack_free(emu_stack *s);

typedef struct emu_ctx {
    void *sp;  /* saved stack pointer (assembly switch) */
    void *uc;  /* ucontext_t * (fallback switch) */
} emu_ctx;

/* Prepares c to run fn(arg) on stack s when first switched to; fn never
 * returns. */
void emu_ctx_make(emu_ctx *c, emu_stack *s, void (*fn)(void *), void *arg);
/* Saves the running context into from and resumes to. */
void emu_ctx_swap(emu_ctx *from, emu_ctx *to);
void emu_ctx_release(emu_ctx *c);
/* "x86-64 asm" or "ucontext". */
const char *emu_ctx_kind(void);

/* ---- the executor (emu_exec.c) ------------------------------------------- */

typedef struct emu_exec emu_exec;

typedef struct emu_exec_opts {
    int threads;        /* OS threads running blocks (the caller is one) */
    int warp_size;      /* 32 or 64 */
    size_t stack_bytes; /* per fiber */
    uint64_t seed;      /* thread orders between barriers */
    emu_mem *mem;       /* for naming faulting addresses */
} emu_exec_opts;

/* What a launch runs: the kernel and how to call it. */
typedef struct emu_kernel_call {
    const char *name;
    void (*fn)(void);
    void *cif;           /* ffi_cif * */
    void **args;
    void *(*tls_anchor)(void); /* the module's thread-local block (shared) */
    void *dl;            /* the module's dlopen handle */
    size_t tls_bytes;    /* size of that block */
} emu_kernel_call;

mt_status emu_exec_create(const emu_exec_opts *o, emu_exec **out, mt_err *err);
void emu_exec_destroy(emu_exec *x);
void emu_exec_set_timeout(emu_exec *x, unsigned ms);
mt_status emu_exec_launch(emu_exec *x, const emu_kernel_call *k, dev_dim3 grid,
                          dev_dim3 block, size_t dyn_shared, mt_err *err);
/* The table handed to every kernel object. */
const struct mt_emu_rt *emu_exec_rt(void);

/* ---- matrix instructions (emu_mma.c) -------------------------------------
 * Shapes are the MT_EMU_MMA_* numbers of prelude_emu.h. Stateless and
 * thread-safe. */

typedef struct emu_mma_info {
    const char *name;      /* the vendor's instruction */
    int m, n, k;           /* D (m x n) += A (m x k) x B (k x n) */
    int wave;              /* lanes taking part: 64 (AMD) or 32 (NVIDIA) */
    int a_elems, b_elems;  /* elements of A and B per lane */
    int c_regs;            /* 32-bit registers of C and D per lane */
    int elem_bytes;        /* 2 (bf16) or 1 (fp8 e4m3, int8) */
    bool int_acc;          /* C and D are int32 (int8 operands), else f32 */
} emu_mma_info;

typedef enum emu_mma_operand { EMU_MMA_A = 0, EMU_MMA_B = 1, EMU_MMA_C = 2 } emu_mma_operand;

/* False when shape is not one the emulator has. */
bool emu_mma_shape(int shape, emu_mma_info *out);
/* Where element elem of lane's operand op sits in its matrix (A: m x k,
 * B: k x n, C and D: m x n); elem counts A and B elements in register
 * order, low half first, and C registers. False when out of range. */
bool emu_mma_layout(int shape, emu_mma_operand op, int lane, int elem, int *row, int *col);
/* One MMA over a wave of ws lanes: lanes[l] is what lane l handed in, NULL
 * for a lane that exited or does not exist. On MT_EMU_MMA_OK every lane's
 * d holds its part of C + A x B; otherwise (a missing lane, lanes that
 * disagree on the shape, a shape of another wave size) nothing is written. */
int emu_mma_run(int ws, const struct mt_emu_mma_lane *const *lanes);
/* For tests only: from now on, in this process, elements (lane0, e0) and
 * (lane1, e1) of operand op of shape trade places in the layout every MMA
 * of that shape uses (emu_mma_layout reports the swapped table too); shape
 * 0 turns it off. Shows that a one-cell layout mistake fails the checks. */
void emu_mma_debug_swap(int shape, emu_mma_operand op, int lane0, int e0, int lane1, int e1);

/* ---- signals (emu_signal.c) ----------------------------------------------
 * A worker thread announces itself with emu_sig_set_worker; while it runs a
 * block (*in_kernel != 0) a SIGSEGV/SIGBUS/SIGFPE/SIGILL or the timeout
 * signal records the facts in *rec and siglongjmps to *jb. Elsewhere the
 * signal goes to the handler that was installed before ours. */

typedef struct emu_sig_rec {
    int sig;
    int code;
    uintptr_t addr;
} emu_sig_rec;

typedef struct emu_sig_target {
    sigjmp_buf jb;
    volatile sig_atomic_t in_kernel;
    volatile int launch_id; /* a timeout signal for another launch is ignored */
    emu_sig_rec rec;
    void (*before_jump)(void *arg); /* ASan fiber bookkeeping; may be NULL */
    void *arg;
} emu_sig_target;

/* Installs the process-wide handlers once (the only process-wide state of
 * the backend: the handlers and the previous ones they chain to). */
void emu_sig_install(void);
void emu_sig_set_target(emu_sig_target *t); /* for the calling thread; NULL clears */
int emu_sig_timeout_signal(void);

#endif
