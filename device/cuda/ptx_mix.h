/* ptx_mix.h: the instruction mix of NVIDIA PTX text, the NVIDIA side of
 * isa_mix.h: per .entry function, static counts of matrix instructions
 * (mma.sync, wgmma), FMAs (fma.*), other arithmetic and moves, global,
 * shared and local memory, barriers and branches, and the distinct matrix
 * mnemonics. PTX is virtual ISA (ptxas still schedules, allocates
 * registers and may spill: those figures come from its log), but which
 * instructions the kernel asks for, and how many, it tells exactly.
 * cuobjdump is not installed here, so the cuda backend keeps NVRTC's PTX
 * (dev_code_get_text) for this.
 *
 * Ownership: a dev_ptx_report is plain data the caller owns. */
#ifndef MT_DEVICE_PTX_MIX_H
#define MT_DEVICE_PTX_MIX_H

#include "device/device.h"

#define DEV_PTX_MAX_MMA_KINDS 4

typedef struct dev_ptx_func {
    char name[96];
    int total;        /* instructions, inline assembly included */
    int mma;          /* mma.sync*, wgmma.mma_async* */
    int fma;          /* fma.* (floating point; integer mad is in alu) */
    int alu;          /* other arithmetic, logic, compares, moves, conversions */
    int ld_global, st_global, atomic; /* ld.global/ldu/cp.async; st.global; atom/red */
    int ld_shared, st_shared;         /* ld.shared/ldmatrix; st.shared */
    int local;        /* ld.local/st.local: spills or stack arrays */
    int barrier;      /* bar.*, barrier.* */
    int branch;       /* bra, call, ret, exit */
    int ldmatrix;     /* ldmatrix* (also in ld_shared) */
    int cp_async;     /* cp.async copies, not their waits (also in ld_global) */
    int n_mma_kinds;
    char mma_kind[DEV_PTX_MAX_MMA_KINDS][64];
    int mma_kind_n[DEV_PTX_MAX_MMA_KINDS];
} dev_ptx_func;

typedef struct dev_ptx_report {
    int n_funcs;
    dev_ptx_func funcs[DEV_MAX_KERNELS_PER_CODE];
} dev_ptx_report;

/* Counts PTX text: functions start at ".entry name" (".func" bodies are
 * counted too, under their own names), instructions are the statements of
 * a body (an optional "@%p" guard, then the opcode), labels, directives
 * and comments are not. Functions past DEV_MAX_KERNELS_PER_CODE are not
 * kept. Never fails; text without functions gives 0. */
void dev_ptx_parse(const char *ptx, dev_ptx_report *out);

/* The function named name (exact, then prefix), or NULL. */
const dev_ptx_func *dev_ptx_find(const dev_ptx_report *r, const char *name);

#endif
