/* emu_exec.c: how the emu backend runs a launch. Blocks are handed out to a
 * pool of OS threads (the calling thread is one of them); a block's threads
 * are fibers on the OS thread that runs it, scheduled cooperatively:
 *
 *   - a fiber runs until it reaches __syncthreads(), a warp operation, or
 *     its end; then the next ready fiber runs (a direct fiber-to-fiber
 *     switch, no trip through a scheduler stack);
 *   - between barriers, fibers start in one of four seeded random orders
 *     (chosen per block and phase), so a kernel that reads another thread's
 *     shared-memory write without a barrier reads stale data or the 0xFF
 *     poison the runtime fills shared memory with, and fails on emu;
 *   - a barrier releases when every thread of the block waits at it; a warp
 *     operation completes when every live lane of the warp has arrived;
 *   - when no fiber can run and the block has not finished, the block is
 *     deadlocked and the launch fails with MT_E_DEADLOCK describing who
 *     waits where; a thread that exits while the others need it at a
 *     barrier is reported the same way.
 *
 * Faults and the watchdog's timeout land in emu_signal.c, which jumps back
 * to run_block() on the worker's own stack. */
#define _GNU_SOURCE
#include "emu_impl.h"

#include <dlfcn.h>
#include <errno.h>
#include <ffi.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rng.h"

#ifdef MOETUNE_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

enum { T_READY, T_RUN, T_BARRIER, T_WARP, T_DONE };
enum { OUT_OK, OUT_DEADLOCK, OUT_EXITED, OUT_DIVERGED, OUT_TRAP };

#define RQ_CAP EMU_MAX_BLOCK_THREADS /* a power of two */
#define N_PERMS 4
#define POISON64 0x7fbadbad7fbadbadull

typedef struct thr {
    struct mt_emu_thread pub; /* what the kernel sees; first */
    emu_ctx ctx;
    emu_stack stack;
    int state;
    int lin;                  /* linear index in the block */
    int op, arg, width;       /* pending warp operation */
    uint64_t val, res;
} thr;

typedef struct warp {
    int size, live, arrived;
} warp;

typedef struct worker {
    emu_exec *x;
    int index;
    pthread_t tid;
    emu_sig_target sig;
    emu_ctx main;
    const void *main_lo;      /* ASan: the worker's own stack */
    size_t main_size;
    bool from_main;
    thr *t;                   /* EMU_MAX_BLOCK_THREADS records */
    int n_stacks;             /* how many of them have stacks */
    int rq[RQ_CAP];
    int rq_head, rq_n;
    warp warps[EMU_MAX_BLOCK_THREADS / 32];
    int n, n_live, n_barrier, ws;
    uint64_t block_id, phase;
    struct mt_emu_block blk;
    thr *cur;
    int outcome;
    const char *trap_what, *trap_file;
    int trap_line, trap_thread;
    int div_warp;
    char *dyn_map, *dyn_hi;   /* dynamic shared memory, guard page above */
    size_t dyn_map_len;
    void *tls_block;          /* the module's thread-local block (__shared__) */
    char *alt;                /* sigaltstack memory */
    size_t alt_size;
} worker;

struct emu_exec {
    int n_workers;
    worker *w;
    pthread_t *threads;
    int n_threads_started;
    int warp_size;
    size_t stack_bytes;
    uint64_t seed;
    emu_mem *mem;

    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    uint64_t gen;
    int n_pool;     /* pool threads taking part in the current launch */
    int n_fin;
    bool quit;

    /* the current launch */
    const emu_kernel_call *k;
    dev_dim3 grid, block;
    size_t dyn;
    uint64_t n_blocks;
    int perm[N_PERMS][EMU_MAX_BLOCK_THREADS];
    atomic_uint_fast64_t next;
    atomic_int stop;
    atomic_int timed_out;
    int launch_id;
    pthread_mutex_t err_mu;
    mt_status st;
    char msg[MT_ERR_MSG_MAX];

    /* the watchdog */
    unsigned timeout_ms;
    pthread_t wd;
    bool wd_started;
    pthread_mutex_t wd_mu;
    pthread_cond_t wd_cv;
    bool wd_armed, wd_quit;
    uint64_t wd_deadline;
};

static __thread worker *tls_w;

/* ---- errors ---------------------------------------------------------- */

__attribute__((format(printf, 3, 4)))
static void fail(emu_exec *x, mt_status st, const char *fmt, ...)
{
    pthread_mutex_lock(&x->err_mu);
    if (x->st == MT_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->msg, sizeof x->msg, fmt, ap);
        va_end(ap);
        x->st = st;
    }
    pthread_mutex_unlock(&x->err_mu);
    atomic_store(&x->stop, 1);
}

static void thread_name(const worker *w, int lin, char *out, size_t cap)
{
    const struct mt_emu_block *b = &w->blk;
    if (lin < 0) {
        snprintf(out, cap, "(none)");
        return;
    }
    snprintf(out, cap, "(%u,%u,%u)", (unsigned)lin % b->dim.x,
             (unsigned)lin / b->dim.x % b->dim.y, (unsigned)lin / (b->dim.x * b->dim.y));
}

static int block_prefix(const worker *w, char *out, size_t cap)
{
    const struct mt_emu_block *b = &w->blk;
    return snprintf(out, cap, "kernel '%s' block (%u,%u,%u) of grid (%u,%u,%u), blockDim (%u,%u,%u)",
                    w->x->k->name, b->idx.x, b->idx.y, b->idx.z, b->grid.x, b->grid.y,
                    b->grid.z, b->dim.x, b->dim.y, b->dim.z);
}

static const char *op_name(int op)
{
    static const char *const names[] = {
        [MT_EMU_SHFL_IDX] = "shfl_idx",  [MT_EMU_SHFL_UP] = "shfl_up",
        [MT_EMU_SHFL_DOWN] = "shfl_down", [MT_EMU_SHFL_XOR] = "shfl_xor",
        [MT_EMU_VOTE_BALLOT] = "ballot", [MT_EMU_VOTE_ANY] = "any",
        [MT_EMU_VOTE_ALL] = "all", [MT_EMU_MMA] = "mma",
    };
    return op >= 0 && op <= MT_EMU_MMA ? names[op] : "?";
}

/* Who waits where, for deadlock reports. */
static void describe_states(const worker *w, char *out, size_t cap)
{
    int cnt[T_DONE + 1] = {0}, first[T_DONE + 1];
    for (int s = 0; s <= T_DONE; s++)
        first[s] = -1;
    for (int i = 0; i < w->n; i++) {
        int s = w->t[i].state;
        if (first[s] < 0)
            first[s] = i;
        cnt[s]++;
    }
    size_t len = 0;
    char name[48];
    static const char *const what[T_DONE + 1] = {
        [T_READY] = "are ready", [T_RUN] = "are running",
        [T_BARRIER] = "wait at __syncthreads()", [T_WARP] = "wait at a warp operation",
        [T_DONE] = "have exited",
    };
    for (int s = 0; s <= T_DONE; s++) {
        if (!cnt[s] || len >= cap)
            continue;
        thread_name(w, first[s], name, sizeof name);
        int k = snprintf(out + len, cap - len, "%s%d of %d threads %s (first %s",
                         len ? "; " : "", cnt[s], w->n, what[s], name);
        if (k < 0)
            return;
        len += (size_t)k;
        if (s == T_WARP && len < cap) {
            const thr *t = &w->t[first[s]];
            const warp *wp = &w->warps[t->lin / w->ws];
            k = snprintf(out + len, cap - len, ", at %s; its warp %d has %d of %d live lanes there",
                         op_name(t->op), t->lin / w->ws, wp->arrived, wp->live);
            if (k < 0)
                return;
            len += (size_t)k;
        }
        if (len < cap) {
            k = snprintf(out + len, cap - len, ")");
            if (k > 0)
                len += (size_t)k;
        }
    }
}

static void report_outcome(worker *w)
{
    char pre[256], states[1024], name[48];
    block_prefix(w, pre, sizeof pre);
    switch (w->outcome) {
    case OUT_DEADLOCK:
        describe_states(w, states, sizeof states);
        fail(w->x, MT_E_DEADLOCK, "%s: deadlock: no thread can continue: %s", pre, states);
        break;
    case OUT_EXITED:
        describe_states(w, states, sizeof states);
        fail(w->x, MT_E_DEADLOCK,
             "%s: deadlock: __syncthreads() can never complete because threads of the "
             "block exited before reaching it (every thread must reach every barrier): %s",
             pre, states);
        break;
    case OUT_DIVERGED: {
        int base = w->div_warp * w->ws, a = -1, b = -1;
        for (int i = base; i < base + w->warps[w->div_warp].size; i++) {
            if (w->t[i].state != T_WARP)
                continue;
            if (a < 0)
                a = i;
            else if (w->t[i].op != w->t[a].op || w->t[i].width != w->t[a].width) {
                b = i;
                break;
            }
        }
        char wa[24] = "", wb[24] = "";
        if (a >= 0 && w->t[a].op < MT_EMU_VOTE_BALLOT)
            snprintf(wa, sizeof wa, " (width %d)", w->t[a].width);
        if (b >= 0 && w->t[b].op < MT_EMU_VOTE_BALLOT)
            snprintf(wb, sizeof wb, " (width %d)", w->t[b].width);
        fail(w->x, MT_E_DEADLOCK,
             "%s: warp %d diverged: lane %d is at %s%s while lane %d is at %s%s; every "
             "live lane of a warp must take part in the same warp operation",
             pre, w->div_warp, a - base, a >= 0 ? op_name(w->t[a].op) : "?", wa, b - base,
             b >= 0 ? op_name(w->t[b].op) : "?", wb);
        break;
    }
    case OUT_TRAP:
        thread_name(w, w->trap_thread, name, sizeof name);
        fail(w->x, MT_E_FAULT, "%s thread %s: %s at %s:%d", pre, name, w->trap_what,
             w->trap_file, w->trap_line);
        break;
    default:
        break;
    }
}

static void report_signal(worker *w, int lin)
{
    emu_exec *x = w->x;
    char pre[256], name[48], where[256];
    block_prefix(w, pre, sizeof pre);
    thread_name(w, lin, name, sizeof name);
    const emu_sig_rec *r = &w->sig.rec;
    if (r->sig == emu_sig_timeout_signal()) {
        fail(x, MT_E_TIMEOUT,
             "kernel '%s' did not finish within the %u ms launch timeout; thread %s of "
             "block (%u,%u,%u) was running (an endless loop, or a wait for a flag no "
             "thread will set)",
             x->k->name, x->timeout_ms, name, w->blk.idx.x, w->blk.idx.y, w->blk.idx.z);
        return;
    }
    if (r->sig == SIGFPE) {
        fail(x, MT_E_FAULT, "%s thread %s: arithmetic trap (%s) at pc %p", pre, name,
             r->code == FPE_INTDIV   ? "integer division by zero"
             : r->code == FPE_INTOVF ? "integer overflow (INT_MIN / -1)"
                                     : "SIGFPE",
             (void *)r->addr);
        return;
    }
    if (r->sig == SIGILL) {
        fail(x, MT_E_FAULT, "%s thread %s: illegal instruction at %p", pre, name,
             (void *)r->addr);
        return;
    }
    uintptr_t a = r->addr;
    where[0] = 0;
    for (int i = 0; i < w->n_stacks; i++) {
        const emu_stack *s = &w->t[i].stack;
        if (a >= (uintptr_t)s->map && a < (uintptr_t)s->lo) {
            snprintf(where, sizeof where,
                     "fiber stack overflow (each emulated thread has %zu KiB of stack; "
                     "set MOETUNE_EMU_STACK_KIB for more)",
                     s->size / 1024);
            break;
        }
    }
    if (!where[0] && a >= (uintptr_t)w->dyn_hi &&
        a < (uintptr_t)w->dyn_map + w->dyn_map_len)
        snprintf(where, sizeof where, "%" PRIuPTR " bytes past the end of dynamic shared "
                 "memory (%zu bytes)", a - (uintptr_t)w->dyn_hi, x->dyn);
    if (!where[0])
        emu_mem_describe(x->mem, a, where, sizeof where);
    fail(x, MT_E_FAULT, "%s thread %s: invalid memory access at %p: %s (%s)", pre, name,
         (void *)a, where, r->sig == SIGBUS ? "SIGBUS" : "SIGSEGV");
}

/* ---- switching ------------------------------------------------------- */

static void swap_to(worker *w, emu_ctx *from, emu_ctx *to, const void *lo, size_t size,
                    bool dying)
{
#ifdef MOETUNE_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(dying ? NULL : &fake, lo, size);
    emu_ctx_swap(from, to);
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#else
    (void)lo;
    (void)size;
    (void)dying;
    emu_ctx_swap(from, to);
#endif
    (void)w;
}

/* Leaves fiber `from` for `to`, or for the worker's own stack when to is
 * NULL (block finished or stuck). Returns when someone resumes `from`. */
static void go(worker *w, thr *from, thr *to, bool dying)
{
    w->cur = to;
    if (to) {
        to->state = T_RUN;
        swap_to(w, &from->ctx, &to->ctx, to->stack.lo, to->stack.size, dying);
    } else {
        swap_to(w, &from->ctx, &w->main, w->main_lo, w->main_size, dying);
    }
}

static void rq_push(worker *w, int i)
{
    w->rq[(w->rq_head + w->rq_n++) & (RQ_CAP - 1)] = i;
}

static int rq_pop(worker *w)
{
    if (!w->rq_n)
        return -1;
    int i = w->rq[w->rq_head];
    w->rq_head = (w->rq_head + 1) & (RQ_CAP - 1);
    w->rq_n--;
    return i;
}

static void push_phase(worker *w)
{
    const int *p = w->x->perm[(w->block_id + w->phase) % N_PERMS];
    for (int k = 0; k < w->n; k++) {
        w->t[p[k]].state = T_READY;
        rq_push(w, p[k]);
    }
}

/* The next fiber to run, or NULL with w->outcome saying why none can. */
static thr *next_thread(worker *w)
{
    int i = rq_pop(w);
    if (i >= 0)
        return &w->t[i];
    if (w->n_live == 0)
        return NULL;
    if (w->n_barrier == w->n_live) {
        if (w->n_live < w->n) {
            w->outcome = OUT_EXITED;
            return NULL;
        }
        w->n_barrier = 0;
        w->phase++;
        push_phase(w);
        return &w->t[rq_pop(w)];
    }
    w->outcome = OUT_DEADLOCK;
    return NULL;
}

/* The current fiber t has just blocked (state set); run someone else. */
static void block_on(worker *w, thr *t)
{
    thr *n = next_thread(w);
    if (n == t) {
        t->state = T_RUN;
        return;
    }
    go(w, t, n, false);
}

/* Completes the pending operation of warp wi (all its live lanes are in
 * T_WARP). Returns false when the lanes disagree on the operation. */
static bool warp_complete(worker *w, int wi, thr *self)
{
    warp *wp = &w->warps[wi];
    int base = wi * w->ws, end = base + wp->size;
    thr *t = w->t;
    int op = -1, width = 0;
    uint64_t mask = 0, live = 0;
    for (int i = base; i < end; i++) {
        if (t[i].state != T_WARP)
            continue;
        if (op < 0) {
            op = t[i].op;
            width = t[i].width;
        } else if (t[i].op != op || t[i].width != width) {
            w->div_warp = wi;
            return false;
        }
        live |= 1ull << (i - base);
        if (t[i].val)
            mask |= 1ull << (i - base);
    }
    int ws = w->ws;
    if (op == MT_EMU_MMA) {
        /* val carries the lane's struct mt_emu_mma_lane (on its fiber's stack) */
        const struct mt_emu_mma_lane *lanes[64] = {0};
        for (int i = base; i < end; i++)
            if (t[i].state == T_WARP)
                lanes[i - base] = (const struct mt_emu_mma_lane *)(uintptr_t)t[i].val;
        uint64_t r = (uint64_t)emu_mma_run(ws, lanes);
        for (int i = base; i < end; i++)
            if (t[i].state == T_WARP)
                t[i].res = r;
    } else if (op >= MT_EMU_VOTE_BALLOT) {
        uint64_t r = op == MT_EMU_VOTE_BALLOT ? mask
                   : op == MT_EMU_VOTE_ANY    ? (mask != 0)
                                              : (mask == live);
        for (int i = base; i < end; i++)
            if (t[i].state == T_WARP)
                t[i].res = r;
    } else {
        if (width <= 0 || width > ws || (width & (width - 1)))
            width = ws;
        for (int i = base; i < end; i++) {
            if (t[i].state != T_WARP)
                continue;
            long self_l = i - base, a = t[i].arg, src;
            long seg = self_l & ~(long)(width - 1);
            switch (op) {
            case MT_EMU_SHFL_IDX:
                src = (a & (width - 1)) + seg;
                break;
            case MT_EMU_SHFL_UP:
                src = self_l - (long)(unsigned)a;
                if (src < seg)
                    src = self_l;
                break;
            case MT_EMU_SHFL_DOWN:
                src = (self_l & (width - 1)) + (long)(unsigned)a >= width
                          ? self_l
                          : self_l + (long)(unsigned)a;
                break;
            default: /* xor */
                src = self_l ^ a;
                if (src >= seg + width || src < 0)
                    src = self_l;
                break;
            }
            /* A lane that does not exist or has exited has nothing to give. */
            t[i].res = src < wp->size && t[base + src].state == T_WARP ? t[base + src].val
                                                                      : POISON64;
        }
    }
    bool up = (w->phase & 1) == 0;
    for (int k = 0; k < wp->size; k++) {
        int i = up ? base + k : end - 1 - k;
        if (t[i].state != T_WARP)
            continue;
        if (&t[i] == self) {
            t[i].state = T_RUN;
        } else {
            t[i].state = T_READY;
            rq_push(w, i);
        }
    }
    wp->arrived = 0;
    return true;
}

/* ---- the runtime table the kernel object calls ------------------------ */

static const struct mt_emu_thread *rt_self(void) { return &tls_w->cur->pub; }

static void rt_sync(void)
{
    worker *w = tls_w;
    thr *t = w->cur;
    t->state = T_BARRIER;
    w->n_barrier++;
    block_on(w, t);
}

static uint64_t rt_shfl(int op, uint64_t v, int arg, int width)
{
    worker *w = tls_w;
    thr *t = w->cur;
    int wi = t->lin / w->ws;
    warp *wp = &w->warps[wi];
    t->op = op;
    t->val = v;
    t->arg = arg;
    t->width = op >= MT_EMU_VOTE_BALLOT ? 0 : width;
    t->state = T_WARP;
    if (++wp->arrived == wp->live) {
        if (!warp_complete(w, wi, t)) {
            w->outcome = OUT_DIVERGED;
            go(w, t, NULL, true);
        }
        return t->res;
    }
    block_on(w, t);
    return t->res;
}

static uint64_t rt_vote(int op, int pred) { return rt_shfl(op, pred != 0, 0, 0); }

static int rt_mma(const struct mt_emu_mma_lane *lane)
{
    return (int)rt_shfl(MT_EMU_MMA, (uint64_t)(uintptr_t)lane, 0, 0);
}

static void rt_trap(const char *what, const char *file, int line)
{
    worker *w = tls_w;
    w->trap_what = what;
    w->trap_file = file;
    w->trap_line = line;
    w->trap_thread = w->cur->lin;
    w->outcome = OUT_TRAP;
    go(w, w->cur, NULL, true);
    abort(); /* never resumed */
}

static const struct mt_emu_rt rt_table = {
    .abi = MT_EMU_ABI,
    .self = rt_self,
    .sync = rt_sync,
    .shfl = rt_shfl,
    .vote = rt_vote,
    .trap = rt_trap,
    .mma = rt_mma,
};

const struct mt_emu_rt *emu_exec_rt(void) { return &rt_table; }

static void thread_exit(worker *w, thr *t)
{
    t->state = T_DONE;
    w->n_live--;
    int wi = t->lin / w->ws;
    warp *wp = &w->warps[wi];
    wp->live--;
    if (wp->live > 0 && wp->arrived == wp->live && !warp_complete(w, wi, NULL)) {
        w->outcome = OUT_DIVERGED;
        go(w, t, NULL, true);
    }
    go(w, t, next_thread(w), true);
    abort(); /* an exited fiber is never resumed */
}

static void fiber_boot(void *arg)
{
    thr *t = arg;
    worker *w = tls_w;
#ifdef MOETUNE_ASAN
    const void *lo = NULL;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(NULL, &lo, &size);
    if (w->from_main) {
        w->main_lo = lo;
        w->main_size = size;
    }
#endif
    w->from_main = false;
    const emu_kernel_call *k = w->x->k;
    uint64_t rv[2];
    ffi_call(k->cif, k->fn, rv, k->args);
    thread_exit(w, t);
}

/* ---- blocks ----------------------------------------------------------- */

#ifdef MOETUNE_ASAN
static void asan_before_jump(void *arg)
{
    worker *w = arg;
    __sanitizer_start_switch_fiber(NULL, w->main_lo, w->main_size);
}
#endif

static void run_block(worker *w, uint64_t b)
{
    emu_exec *x = w->x;
    dev_dim3 g = x->grid, bd = x->block;
    w->blk.idx.x = (unsigned)(b % g.x);
    w->blk.idx.y = (unsigned)(b / g.x % g.y);
    w->blk.idx.z = (unsigned)(b / ((uint64_t)g.x * g.y));
    int n = w->n;
    for (int i = 0; i < n; i++) {
        thr *t = &w->t[i];
        t->pub.idx.x = (unsigned)i % bd.x;
        t->pub.idx.y = (unsigned)i / bd.x % bd.y;
        t->pub.idx.z = (unsigned)i / (bd.x * bd.y);
        t->pub.block = &w->blk;
        t->lin = i;
#ifdef MOETUNE_ASAN
        /* frames abandoned by the last block leave their redzones behind */
        ASAN_UNPOISON_MEMORY_REGION(t->stack.lo, t->stack.size);
#endif
        emu_ctx_make(&t->ctx, &t->stack, fiber_boot, t);
    }
    for (int wi = 0; wi * w->ws < n; wi++) {
        warp *wp = &w->warps[wi];
        wp->size = n - wi * w->ws < w->ws ? n - wi * w->ws : w->ws;
        wp->live = wp->size;
        wp->arrived = 0;
    }
    w->n_live = n;
    w->n_barrier = 0;
    w->outcome = OUT_OK;
    w->rq_head = w->rq_n = 0;
    w->block_id = b;
    w->phase = 0;
    push_phase(w);
    /* Shared memory starts as NaN / -1 bytes, as it never starts as zeros
     * a kernel could rely on. */
    if (w->tls_block)
        memset(w->tls_block, 0xff, x->k->tls_bytes);
    if (x->dyn)
        memset(w->blk.dyn_shared, 0xff, x->dyn);
    w->from_main = true;
    w->cur = NULL;
    if (sigsetjmp(w->sig.jb, 0)) {
#ifdef MOETUNE_ASAN
        __sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
        thr *c = w->cur;
        w->cur = NULL;
        report_signal(w, c ? c->lin : -1);
        return;
    }
    thr *first = &w->t[rq_pop(w)];
    w->cur = first;
    first->state = T_RUN;
    w->sig.in_kernel = 1;
    swap_to(w, &w->main, &first->ctx, first->stack.lo, first->stack.size, false);
    w->sig.in_kernel = 0;
    w->cur = NULL;
    if (w->outcome != OUT_OK)
        report_outcome(w);
}

/* Gets w ready for the current launch: fiber stacks, shared memory. */
static bool prepare(worker *w)
{
    emu_exec *x = w->x;
    const dev_dim3 bd = x->block;
    w->n = (int)(bd.x * bd.y * bd.z);
    w->ws = x->warp_size;
    while (w->n_stacks < w->n) {
        mt_err e = MT_ERR_INIT;
        if (emu_stack_alloc(&w->t[w->n_stacks].stack, x->stack_bytes, &e) != MT_OK) {
            fail(x, e.status, "%s", e.msg);
            return false;
        }
        w->n_stacks++;
    }
    w->blk.dim.x = bd.x;
    w->blk.dim.y = bd.y;
    w->blk.dim.z = bd.z;
    w->blk.grid.x = x->grid.x;
    w->blk.grid.y = x->grid.y;
    w->blk.grid.z = x->grid.z;
    w->blk.warp_size = x->warp_size;
    w->blk.dyn_shared = w->dyn_hi - ((x->dyn + 15) & ~(size_t)15);
    w->tls_block = NULL;
    if (x->k->tls_bytes) {
        x->k->tls_anchor(); /* makes this thread's copy of the block exist */
        void *blk = NULL;
        if (dlinfo(x->k->dl, RTLD_DI_TLS_DATA, &blk) == 0)
            w->tls_block = blk;
    }
    return true;
}

static void work(worker *w)
{
    emu_exec *x = w->x;
    if (!prepare(w))
        return;
    w->sig.in_kernel = 0;
    w->sig.launch_id = x->launch_id;
    emu_sig_set_target(&w->sig);
    for (;;) {
        if (atomic_load_explicit(&x->stop, memory_order_relaxed))
            break;
        uint64_t b = atomic_fetch_add(&x->next, 1);
        if (b >= x->n_blocks)
            break;
        run_block(w, b);
    }
}

static void restore_altstack(const stack_t *old)
{
    if (old->ss_flags & SS_DISABLE) {
        stack_t off = {.ss_flags = SS_DISABLE};
        sigaltstack(&off, NULL);
    } else {
        sigaltstack(old, NULL);
    }
}

static void *pool_main(void *arg)
{
    worker *w = arg;
    emu_exec *x = w->x;
    tls_w = w;
    stack_t ss = {.ss_sp = w->alt, .ss_size = w->alt_size, .ss_flags = 0}, old_ss;
    bool alt_set = sigaltstack(&ss, &old_ss) == 0;
    uint64_t seen = 0;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        while (!x->quit && x->gen == seen)
            pthread_cond_wait(&x->cv_go, &x->mu);
        if (x->quit)
            break;
        seen = x->gen;
        bool part = w->index <= x->n_pool;
        pthread_mutex_unlock(&x->mu);
        if (part)
            work(w);
        pthread_mutex_lock(&x->mu);
        if (part && ++x->n_fin == x->n_pool)
            pthread_cond_signal(&x->cv_done);
    }
    pthread_mutex_unlock(&x->mu);
    emu_sig_set_target(NULL);
    /* Hand back whatever stack was there: ASan unmaps its own at exit. */
    if (alt_set)
        restore_altstack(&old_ss);
    return NULL;
}

/* ---- the watchdog ----------------------------------------------------- */

static void abs_ms_from_now(struct timespec *ts, uint64_t ns)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ns += (uint64_t)ts->tv_nsec;
    ts->tv_sec += (time_t)(ns / 1000000000u);
    ts->tv_nsec = (long)(ns % 1000000000u);
}

static void *watchdog_main(void *arg)
{
    emu_exec *x = arg;
    pthread_mutex_lock(&x->wd_mu);
    while (!x->wd_quit) {
        if (!x->wd_armed) {
            pthread_cond_wait(&x->wd_cv, &x->wd_mu);
            continue;
        }
        uint64_t now = mt_now_ns();
        struct timespec ts;
        if (now < x->wd_deadline) {
            abs_ms_from_now(&ts, x->wd_deadline - now);
            pthread_cond_timedwait(&x->wd_cv, &x->wd_mu, &ts);
            continue;
        }
        /* Expired: stop handing out blocks and interrupt running ones; keep
         * at it until the launch returns (a signal can miss a worker that
         * was between blocks). */
        atomic_store(&x->timed_out, 1);
        atomic_store(&x->stop, 1);
        for (int i = 0; i < x->n_workers; i++) {
            worker *w = &x->w[i];
            if (w->sig.in_kernel) {
                union sigval v = {.sival_int = x->launch_id};
                pthread_sigqueue(w->tid, emu_sig_timeout_signal(), v);
            }
        }
        abs_ms_from_now(&ts, 20u * 1000000u);
        pthread_cond_timedwait(&x->wd_cv, &x->wd_mu, &ts);
    }
    pthread_mutex_unlock(&x->wd_mu);
    return NULL;
}

void emu_exec_set_timeout(emu_exec *x, unsigned ms) { x->timeout_ms = ms; }

static bool watchdog_arm(emu_exec *x)
{
    if (!x->timeout_ms)
        return false;
    pthread_mutex_lock(&x->wd_mu);
    if (!x->wd_started) {
        if (pthread_create(&x->wd, NULL, watchdog_main, x) != 0) {
            pthread_mutex_unlock(&x->wd_mu);
            return false;
        }
        x->wd_started = true;
    }
    x->wd_deadline = mt_now_ns() + (uint64_t)x->timeout_ms * 1000000u;
    x->wd_armed = true;
    pthread_cond_signal(&x->wd_cv);
    pthread_mutex_unlock(&x->wd_mu);
    return true;
}

static void watchdog_disarm(emu_exec *x)
{
    pthread_mutex_lock(&x->wd_mu);
    x->wd_armed = false;
    pthread_mutex_unlock(&x->wd_mu);
}

/* ---- the executor ------------------------------------------------------ */

static mt_status worker_init(emu_exec *x, worker *w, int index, mt_err *err)
{
    w->x = x;
    w->index = index;
    w->t = calloc(EMU_MAX_BLOCK_THREADS, sizeof *w->t);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    w->dyn_map_len = EMU_SHARED_BYTES + page;
    w->dyn_map = mmap(NULL, w->dyn_map_len, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    w->alt_size = 64 * 1024 + (size_t)SIGSTKSZ;
    w->alt = malloc(w->alt_size);
    if (!w->t || w->dyn_map == MAP_FAILED || !w->alt) {
        if (w->dyn_map == MAP_FAILED)
            w->dyn_map = NULL;
        return mt_fail(err, MT_E_NOMEM, "emu: out of memory for worker %d", index);
    }
    w->dyn_hi = w->dyn_map + EMU_SHARED_BYTES;
    if (mprotect(w->dyn_hi, page, PROT_NONE) != 0)
        return mt_fail(err, MT_E_NOMEM, "emu: cannot protect the shared-memory guard: %s",
                       strerror(errno));
    w->sig.arg = w;
#ifdef MOETUNE_ASAN
    w->sig.before_jump = asan_before_jump;
#endif
    return MT_OK;
}

static void worker_free(worker *w)
{
    if (w->t) {
        for (int i = 0; i < w->n_stacks; i++) {
            emu_stack_free(&w->t[i].stack);
            emu_ctx_release(&w->t[i].ctx);
        }
        free(w->t);
    }
    emu_ctx_release(&w->main);
    if (w->dyn_map)
        munmap(w->dyn_map, w->dyn_map_len);
    free(w->alt);
}

mt_status emu_exec_create(const emu_exec_opts *o, emu_exec **out, mt_err *err)
{
    *out = NULL;
    emu_exec *x = calloc(1, sizeof *x);
    if (!x)
        return mt_fail(err, MT_E_NOMEM, "emu: out of memory");
    x->n_workers = o->threads > 0 ? o->threads : 1;
    x->warp_size = o->warp_size;
    x->stack_bytes = o->stack_bytes;
    x->seed = o->seed;
    x->mem = o->mem;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv_go, NULL);
    pthread_cond_init(&x->cv_done, NULL);
    pthread_mutex_init(&x->err_mu, NULL);
    pthread_mutex_init(&x->wd_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&x->wd_cv, &ca);
    pthread_condattr_destroy(&ca);
    emu_sig_install();

    mt_status st = MT_OK;
    x->w = calloc((size_t)x->n_workers, sizeof *x->w);
    x->threads = calloc((size_t)x->n_workers, sizeof *x->threads);
    if (!x->w || !x->threads) {
        st = mt_fail(err, MT_E_NOMEM, "emu: out of memory");
        goto fail;
    }
    for (int i = 0; i < x->n_workers; i++)
        if ((st = worker_init(x, &x->w[i], i, err)) != MT_OK)
            goto fail;
    for (int i = 1; i < x->n_workers; i++) {
        if (pthread_create(&x->threads[i], NULL, pool_main, &x->w[i]) != 0) {
            st = mt_fail(err, MT_E_DEVICE, "emu: cannot start worker thread %d", i);
            goto fail;
        }
        x->w[i].tid = x->threads[i];
        x->n_threads_started = i;
    }
    *out = x;
    return MT_OK;
fail:
    emu_exec_destroy(x);
    return st;
}

void emu_exec_destroy(emu_exec *x)
{
    if (!x)
        return;
    pthread_mutex_lock(&x->mu);
    x->quit = true;
    pthread_cond_broadcast(&x->cv_go);
    pthread_mutex_unlock(&x->mu);
    for (int i = 1; i <= x->n_threads_started; i++)
        pthread_join(x->threads[i], NULL);
    if (x->wd_started) {
        pthread_mutex_lock(&x->wd_mu);
        x->wd_quit = true;
        pthread_cond_signal(&x->wd_cv);
        pthread_mutex_unlock(&x->wd_mu);
        pthread_join(x->wd, NULL);
    }
    if (x->w)
        for (int i = 0; i < x->n_workers; i++)
            worker_free(&x->w[i]);
    free(x->w);
    free(x->threads);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv_go);
    pthread_cond_destroy(&x->cv_done);
    pthread_mutex_destroy(&x->err_mu);
    pthread_mutex_destroy(&x->wd_mu);
    pthread_cond_destroy(&x->wd_cv);
    free(x);
}

static void make_perms(emu_exec *x, int n, uint64_t seed)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    for (int p = 0; p < N_PERMS; p++) {
        int *v = x->perm[p];
        for (int i = 0; i < n; i++)
            v[i] = i;
        for (int i = n - 1; i > 0; i--) {
            int j = (int)mt_rng_below(&r, (uint64_t)i + 1);
            int t = v[i];
            v[i] = v[j];
            v[j] = t;
        }
    }
}

mt_status emu_exec_launch(emu_exec *x, const emu_kernel_call *k, dev_dim3 grid,
                          dev_dim3 block, size_t dyn_shared, mt_err *err)
{
    uint64_t nt = (uint64_t)block.x * block.y * block.z;
    if (!block.x || !block.y || !block.z || nt > EMU_MAX_BLOCK_THREADS)
        return mt_fail(err, MT_E_LAUNCH,
                       "kernel '%s': block (%u,%u,%u) has %" PRIu64 " threads; emu "
                       "allows 1 to %d",
                       k->name, block.x, block.y, block.z, nt, EMU_MAX_BLOCK_THREADS);
    if (!grid.x || !grid.y || !grid.z ||
        (uint64_t)grid.x * grid.y > (1ull << 40) / grid.z)
        return mt_fail(err, MT_E_LAUNCH, "kernel '%s': grid (%u,%u,%u) is empty or has "
                       "more than 2^40 blocks", k->name, grid.x, grid.y, grid.z);
    size_t static_shared = k->tls_bytes > 16 ? k->tls_bytes - 16 : 0;
    if (dyn_shared > EMU_SHARED_BYTES || static_shared + dyn_shared > EMU_SHARED_BYTES)
        return mt_fail(err, MT_E_LAUNCH,
                       "kernel '%s': %zu bytes of static and %zu of dynamic shared memory "
                       "exceed the %d bytes of a block",
                       k->name, static_shared, dyn_shared, EMU_SHARED_BYTES);
    x->k = k;
    x->grid = grid;
    x->block = block;
    x->dyn = dyn_shared;
    x->n_blocks = (uint64_t)grid.x * grid.y * grid.z;
    atomic_store(&x->next, 0);
    atomic_store(&x->stop, 0);
    atomic_store(&x->timed_out, 0);
    x->st = MT_OK;
    x->msg[0] = 0;
    x->launch_id++;
    make_perms(x, (int)nt, x->seed ^ ((uint64_t)x->launch_id * 0x9e3779b97f4a7c15ull));

    /* The caller is worker 0 for the length of the launch. */
    worker *w0 = &x->w[0];
    w0->tid = pthread_self();
    tls_w = w0;
    stack_t ss = {.ss_sp = w0->alt, .ss_size = w0->alt_size, .ss_flags = 0}, old_ss;
    bool alt_set = sigaltstack(&ss, &old_ss) == 0;

    int n_pool = x->n_workers - 1;
    if ((uint64_t)n_pool > x->n_blocks - 1)
        n_pool = (int)(x->n_blocks - 1);
    bool armed = watchdog_arm(x);
    pthread_mutex_lock(&x->mu);
    x->n_pool = n_pool;
    x->n_fin = 0;
    if (n_pool > 0) {
        x->gen++;
        pthread_cond_broadcast(&x->cv_go);
    }
    pthread_mutex_unlock(&x->mu);

    work(w0);

    pthread_mutex_lock(&x->mu);
    while (x->n_fin < n_pool)
        pthread_cond_wait(&x->cv_done, &x->mu);
    pthread_mutex_unlock(&x->mu);
    if (armed)
        watchdog_disarm(x);
    emu_sig_set_target(NULL);
    if (alt_set)
        restore_altstack(&old_ss);
    tls_w = NULL;

    if (x->st == MT_OK && atomic_load(&x->timed_out))
        fail(x, MT_E_TIMEOUT, "kernel '%s' did not finish within the %u ms launch timeout",
             k->name, x->timeout_ms);
    if (x->st != MT_OK)
        return mt_fail(err, x->st, "%s", x->msg);
    return MT_OK;
}
