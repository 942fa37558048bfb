/* emu_fiber.c: fiber stacks and context switching for the emu backend.
 * x86-64 gets a small assembly switch (the callee-saved registers: about a
 * dozen instructions); other machines fall back
 * to ucontext, which is correct but makes a system call per switch.
 * Stacks are mmap'd with a PROT_NONE guard page below them, so an overflow
 * faults (and is reported) instead of writing over a neighbour. */
#define _GNU_SOURCE
#include "emu_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef MOETUNE_ASAN
#include <sanitizer/asan_interface.h>
#endif

mt_status emu_stack_alloc(emu_stack *s, size_t size, mt_err *err)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size = (size + page - 1) / page * page;
    size_t len = size + page;
    char *map = mmap(NULL, len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (map == MAP_FAILED)
        return mt_fail(err, MT_E_NOMEM, "emu: cannot map a %zu-byte fiber stack: %s",
                       size, strerror(errno));
    if (mprotect(map, page, PROT_NONE) != 0) {
        int e = errno;
        munmap(map, len);
        return mt_fail(err, MT_E_NOMEM, "emu: cannot protect a fiber stack guard: %s",
                       strerror(e));
    }
    s->map = map;
    s->map_len = len;
    s->lo = map + page;
    s->size = size;
    return MT_OK;
}

void emu_stack_free(emu_stack *s)
{
#ifdef MOETUNE_ASAN
    /* Frames abandoned on this stack leave redzones in the shadow, and
     * munmap does not clear them: a later mapping at this address (a
     * device buffer) would inherit them and a memcpy into it reads as a
     * stack-buffer-underflow. */
    if (s->map)
        ASAN_UNPOISON_MEMORY_REGION(s->map, s->map_len);
#endif
    if (s->map)
        munmap(s->map, s->map_len);
    memset(s, 0, sizeof *s);
}

#if defined(__x86_64__) && !defined(MOETUNE_EMU_UCONTEXT)

/* emu_asm_swap(void **save_sp, void *load_sp): pushes the callee-saved
 * registers, stores rsp, loads the other stack and pops its registers.
 * MXCSR and the x87 control word are not switched: all fibers of a worker
 * share them with the worker (saving them cost 80% of a switch).
 * emu_asm_boot: where a new fiber's first swap returns to; calls r12(r13). */
__asm__(".text\n"
        ".p2align 4\n"
        ".globl emu_asm_swap\n"
        ".hidden emu_asm_swap\n"
        ".type emu_asm_swap,@function\n"
        "emu_asm_swap:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size emu_asm_swap,.-emu_asm_swap\n"
        ".p2align 4\n"
        ".globl emu_asm_boot\n"
        ".hidden emu_asm_boot\n"
        ".type emu_asm_boot,@function\n"
        "emu_asm_boot:\n"
        "    movq %r13, %rdi\n"
        "    callq *%r12\n"
        "    ud2\n"
        ".size emu_asm_boot,.-emu_asm_boot\n");

void emu_asm_swap(void **save_sp, void *load_sp);
void emu_asm_boot(void);

void emu_ctx_make(emu_ctx *c, emu_stack *s, void (*fn)(void *), void *arg)
{
    uintptr_t top = ((uintptr_t)(s->lo + s->size)) & ~(uintptr_t)15;
    /* After the swap pops 7 words, rsp = top - 16: 16-byte aligned before
     * emu_asm_boot's call, as the ABI wants. */
    uint64_t *sp = (uint64_t *)(top - 16 - 7 * 8);
    sp[0] = 0;                        /* r15 */
    sp[1] = 0;                        /* r14 */
    sp[2] = (uint64_t)(uintptr_t)arg; /* r13 */
    sp[3] = (uint64_t)(uintptr_t)fn;  /* r12 */
    sp[4] = 0;                        /* rbx */
    sp[5] = 0;                        /* rbp */
    sp[6] = (uint64_t)(uintptr_t)emu_asm_boot;
    c->sp = sp;
}

void emu_ctx_swap(emu_ctx *from, emu_ctx *to) { emu_asm_swap(&from->sp, to->sp); }

void emu_ctx_release(emu_ctx *c) { c->sp = NULL; }

const char *emu_ctx_kind(void) { return "x86-64 asm"; }

#else

#include <ucontext.h>

/* makecontext passes int arguments only: the pointers travel in two halves. */
static void uc_boot(unsigned hi, unsigned lo, unsigned fhi, unsigned flo)
{
    void *arg = (void *)(((uintptr_t)hi << 32) | lo);
    void (*fn)(void *) = (void (*)(void *))(((uintptr_t)fhi << 32) | flo);
    fn(arg);
    abort(); /* fibers never return: the scheduler abandons them */
}

void emu_ctx_make(emu_ctx *c, emu_stack *s, void (*fn)(void *), void *arg)
{
    if (!c->uc)
        c->uc = calloc(1, sizeof(ucontext_t));
    if (!c->uc)
        abort(); /* a few hundred bytes; no way to report from here */
    ucontext_t *uc = c->uc;
    getcontext(uc);
    uc->uc_stack.ss_sp = s->lo;
    uc->uc_stack.ss_size = s->size;
    uc->uc_link = NULL;
    uintptr_t a = (uintptr_t)arg, f = (uintptr_t)fn;
    makecontext(uc, (void (*)(void))uc_boot, 4, (unsigned)(a >> 32), (unsigned)a,
                (unsigned)(f >> 32), (unsigned)f);
}

void emu_ctx_swap(emu_ctx *from, emu_ctx *to)
{
    if (!from->uc)
        from->uc = calloc(1, sizeof(ucontext_t));
    if (!from->uc)
        abort();
    swapcontext(from->uc, to->uc);
}

void emu_ctx_release(emu_ctx *c)
{
    free(c->uc);
    c->uc = NULL;
}

const char *emu_ctx_kind(void) { return "ucontext"; }

#endif
