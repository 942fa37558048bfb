/* isa_mix.h: the instruction mix of an AMD GPU code object, for evidence
 * about kernels that cannot run here: per kernel function, instructions
 * counted by class (matrix, vector ALU, scalar ALU, global and LDS memory,
 * scratch, waits, barriers) over the whole function and over each loop
 * (a backward branch and its target), with the "hot" loop picked out: the
 * innermost loop with the most matrix instructions; without any, the
 * innermost loop holding at least half of the most global loads a loop
 * holds (a memory stream); without loads, the largest loop.
 *
 * The disassembly comes from llvm-objdump (llvm-objdump-19 first, then
 * llvm-objdump on PATH); dev_isa_parse works on its text, so the counting
 * is testable without the tool. NVIDIA code objects (cubins) have no
 * disassembler here: dev_isa_mix refuses them with MT_E_UNSUPPORTED.
 *
 * Ownership: a dev_isa_report is plain data the caller owns; nothing in it
 * points elsewhere. */
#ifndef MT_DEVICE_ISA_MIX_H
#define MT_DEVICE_ISA_MIX_H

#include <stddef.h>

#include "device/device.h"

typedef enum dev_isa_class {
    DEV_ISA_MFMA = 0,    /* v_mfma*, v_smfmac*, v_wmma* */
    DEV_ISA_VALU,        /* other v_* */
    DEV_ISA_SALU,        /* s_* but the classes below */
    DEV_ISA_SMEM,        /* s_load*, s_buffer_load* */
    DEV_ISA_GLOBAL_LOAD, /* global_load*, buffer_load*, flat_load* */
    DEV_ISA_GLOBAL_STORE,/* global_store*, buffer_store*, flat_store* */
    DEV_ISA_ATOMIC,      /* global_atomic*, buffer_atomic*, flat_atomic* */
    DEV_ISA_LDS_READ,    /* ds_read*, ds_load* */
    DEV_ISA_LDS_WRITE,   /* ds_write*, ds_store* */
    DEV_ISA_LDS_OTHER,   /* other ds_* (swizzles, permutes, LDS atomics) */
    DEV_ISA_SCRATCH,     /* scratch_* */
    DEV_ISA_WAIT,        /* s_waitcnt* */
    DEV_ISA_BARRIER,     /* s_barrier */
    DEV_ISA_BRANCH,      /* s_branch, s_cbranch_*, s_setpc, s_swappc */
    DEV_ISA_OTHER,
    DEV_ISA_N_CLASSES
} dev_isa_class;

/* Short names ("mfma", "valu", ...), for tables and JSON keys. */
const char *dev_isa_class_name(dev_isa_class c);
/* The class of one mnemonic ("v_mfma_f32_16x16x16bf16_1k"). */
dev_isa_class dev_isa_classify(const char *mnemonic);

typedef struct dev_isa_counts {
    int n[DEV_ISA_N_CLASSES];
    int total;
} dev_isa_counts;

#define DEV_ISA_MAX_LOOPS 128
#define DEV_ISA_MAX_FUNCS 16
#define DEV_ISA_MAX_MMA_KINDS 4

typedef struct dev_isa_loop {
    int first, last;   /* instruction indices in the function, inclusive */
    int depth;         /* 1 outermost; loops nested inside others are deeper */
    dev_isa_counts c;
    /* s_waitcnt vmcnt(0) (a wait for every global access in flight) between
     * the loop's head and its first matrix instruction: nonzero means this
     * step's matrix work waits on memory issued for it (0 without MFMA) */
    int vm0_before_mma;
} dev_isa_loop;

typedef struct dev_isa_func {
    char name[96];
    dev_isa_counts all;
    int n_loops;       /* loops past DEV_ISA_MAX_LOOPS are not kept */
    dev_isa_loop loops[DEV_ISA_MAX_LOOPS];
    int hot;           /* index into loops, -1 without loops */
    /* The distinct matrix mnemonics, in order of first use, with counts
     * (kinds past DEV_ISA_MAX_MMA_KINDS are counted in all.n only). */
    int n_mma_kinds;
    char mma_kind[DEV_ISA_MAX_MMA_KINDS][64];
    int mma_kind_n[DEV_ISA_MAX_MMA_KINDS];
} dev_isa_func;

typedef struct dev_isa_report {
    int n_funcs;
    dev_isa_func funcs[DEV_MAX_KERNELS_PER_CODE];
} dev_isa_report;

/* Counts llvm-objdump -d text: functions start at "<addr> <name>:" lines,
 * instructions are the following lines whose first word is a mnemonic,
 * branch targets are read from "<name+0xoff>" annotations or a "label"
 * operand in the text. Never fails; text without functions gives 0. */
void dev_isa_parse(const char *text, dev_isa_report *out);

/* Disassembles code (an AMD code object; arch names the processor,
 * "gfx942") with llvm-objdump and counts it. MT_E_UNSUPPORTED for a code
 * object that is not AMD ELF or when no llvm-objdump is installed (the
 * message says which was tried); MT_E_IO when it cannot be run. */
mt_status dev_isa_mix(const void *code, size_t len, const char *arch, dev_isa_report *out,
                      mt_err *err);

/* The function named name (exact, then prefix), or NULL. */
const dev_isa_func *dev_isa_find(const dev_isa_report *r, const char *name);

#endif
