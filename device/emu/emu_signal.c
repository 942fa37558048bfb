/* emu_signal.c: turns a kernel's memory fault, arithmetic trap or a
 * watchdog's timeout signal into a launch error. The handlers run on the
 * worker's alternate signal stack (a fiber may have overflowed its own),
 * record the facts and siglongjmp back to the worker's block loop; the
 * fiber stacks are simply abandoned. A signal that arrives while the thread
 * is not running a kernel goes to whatever handler was installed before
 * (ASan's, or the default action), so real crashes elsewhere stay crashes.
 *
 * Process-wide state, kept here only: the installed-once flag and the
 * previous handlers (signal dispositions are process-wide by nature). The
 * per-thread target is thread-local. */
#define _GNU_SOURCE
#include "emu_impl.h"

#include <string.h>

static const int fault_sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
#define N_FAULT_SIGS ((int)(sizeof fault_sigs / sizeof fault_sigs[0]))

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct sigaction prev_fault[N_FAULT_SIGS];
static struct sigaction prev_timeout;
static __thread emu_sig_target *tls_target;

int emu_sig_timeout_signal(void) { return SIGRTMIN + 5; }

void emu_sig_set_target(emu_sig_target *t) { tls_target = t; }

static void chain(const struct sigaction *prev, int sig, siginfo_t *si, void *uc)
{
    if (prev->sa_flags & SA_SIGINFO) {
        if (prev->sa_sigaction) {
            prev->sa_sigaction(sig, si, uc);
            return;
        }
    } else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
        prev->sa_handler(sig);
        return;
    }
    /* Default action: restore it and return; a synchronous fault then
     * happens again and ends the process as it would have without us. */
    if (sig != emu_sig_timeout_signal()) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(sig, &dfl, NULL);
    }
}

static void on_signal(int sig, siginfo_t *si, void *uc)
{
    emu_sig_target *t = tls_target;
    if (t && sig == emu_sig_timeout_signal() && si && si->si_code == SI_QUEUE &&
        si->si_value.sival_int != t->launch_id)
        return; /* late: meant for a launch that has ended */
    if (t && t->in_kernel) {
        t->in_kernel = 0;
        t->rec.sig = sig;
        t->rec.code = si ? si->si_code : 0;
        t->rec.addr = si ? (uintptr_t)si->si_addr : 0;
        if (t->before_jump)
            t->before_jump(t->arg);
        siglongjmp(t->jb, 1);
    }
    if (sig == emu_sig_timeout_signal()) {
        chain(&prev_timeout, sig, si, uc);
        return;
    }
    for (int i = 0; i < N_FAULT_SIGS; i++)
        if (fault_sigs[i] == sig)
            chain(&prev_fault[i], sig, si, uc);
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    /* SA_NODEFER: the jump leaves the handler without sigreturn, so the
     * signal must not stay blocked for the next launch. */
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_FAULT_SIGS; i++)
        sigaction(fault_sigs[i], &sa, &prev_fault[i]);
    sigaction(emu_sig_timeout_signal(), &sa, &prev_timeout);
}

void emu_sig_install(void) { pthread_once(&once, install); }
