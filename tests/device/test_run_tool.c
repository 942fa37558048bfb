/* test_run_tool.c: dev_run_tool, how the cpu, emu and hip backends run
 * their compilers. Pinned: the exit status, stdout and stderr both in the
 * log, a program that cannot be started (127, the reason in the log), and
 * that running a tool leaves the caller's memory alone: a server compiles
 * live swaps and tuning candidates while it serves, and a fork() there
 * left every page of the server copy-on-write, so each page it wrote next
 * took a fault (measured here as minor faults over 64 MiB written again).
 * And the hold a serving process sets on its background compilers
 * (dev_set_tool_hold): a tool started from a SCHED_IDLE thread stops, with
 * every process it started, while the hold says so, and goes on after; one
 * started from another thread is never held. */
#define _GNU_SOURCE /* SCHED_IDLE */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "common/clock.h"
#include "common/files.h"
#include "device/device_impl.h"
#include "test_tmp.h"

/* A fresh folder and the path of the tool's log in it. */
static void tool_log(char dir[512], char log[600])
{
    tmp_dir_make(dir, 512, "mt_run_tool");
    snprintf(log, 600, "%s/tool.log", dir);
}

static char *read_log(const char *path)
{
    char *text = NULL;
    cr_assert_eq(mt_file_read(path, &text, NULL, NULL), MT_OK, "%s", path);
    return text;
}

Test(run_tool, exit_status_and_both_streams_in_the_log)
{
    char dir[512], log[600];
    tool_log(dir, log);
    const char *argv[] = {"sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3", NULL};
    cr_expect_eq(dev_run_tool(argv, log), 3);
    char *text = read_log(log);
    cr_expect(strstr(text, "to-stdout\n"), "%s", text);
    cr_expect(strstr(text, "to-stderr\n"), "%s", text);
    free(text);
    const char *ok[] = {"sh", "-c", "exit 0", NULL};
    cr_expect_eq(dev_run_tool(ok, log), 0);
    text = read_log(log);
    cr_expect_str_eq(text, "", "the log is written anew each run");
    free(text);
    const char *killed[] = {"sh", "-c", "kill -9 $$", NULL};
    cr_expect_eq(dev_run_tool(killed, log), -1, "a tool killed by a signal");
}

Test(run_tool, a_program_that_cannot_start_is_127_with_the_reason)
{
    char dir[512], log[600];
    tool_log(dir, log);
    const char *argv[] = {"moetune-no-such-compiler", "-c", "x.c", NULL};
    cr_expect_eq(dev_run_tool(argv, log), 127);
    char *text = read_log(log);
    cr_expect(strstr(text, "cannot run moetune-no-such-compiler"), "%s", text);
    free(text);
}

static long minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

Test(run_tool, the_callers_pages_are_not_left_copy_on_write)
{
    enum { BYTES = 64 << 20, PAGES = BYTES / 4096 };
    char *buf = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(buf, MAP_FAILED);
    madvise(buf, BYTES, MADV_NOHUGEPAGE); /* 4 KiB pages: one fault per page to count */
    memset(buf, 1, BYTES);
    char dir[512], log[600];
    tool_log(dir, log);
    const char *argv[] = {"sh", "-c", "exit 0", NULL};
    cr_assert_eq(dev_run_tool(argv, log), 0);
    long before = minor_faults();
    memset(buf, 2, BYTES);
    long faults = minor_faults() - before;
    /* A fork() makes this one fault per page (16384); the spawn none. */
    cr_expect_lt(faults, PAGES / 16, "%ld minor faults writing %d pages after running a tool",
                 faults, PAGES);
    cr_expect_eq(buf[BYTES - 1], 2);
    munmap(buf, BYTES);
}

/* ---- the hold on background tools ------------------------------------- */

/* The hold: off until the tool and the shell it started have written their
 * pids, then on until both have been seen stopped (field 3 of
 * /proc/PID/stat: 'T') for 100 ms, or for 5 s at most: a process in
 * uninterruptible sleep ('D', on a loaded disk) stops only when it leaves
 * it. */
typedef struct hold_probe {
    char dir[512];
    double on_at, both_at; /* the hold went on; both were first seen stopped */
    double on_ms;          /* how long it was on */
    char state[2];         /* last state seen while on: driver, grandchild */
    bool stopped[2];       /* 'T' seen while on */
} hold_probe;

static int read_pid(const char *dir, const char *name)
{
    char path[600], *text = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (mt_file_read(path, &text, NULL, NULL) != MT_OK)
        return 0;
    int pid = atoi(text);
    free(text);
    return pid;
}

static char proc_state(int pid)
{
    char path[64], text[512] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r"); /* /proc files have no size: read, not stat */
    if (!f)
        return '?';
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    const char *p = strrchr(text, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

static bool probe_hold(void *ctx)
{
    hold_probe *h = ctx;
    int pids[2] = {read_pid(h->dir, "driver.pid"), read_pid(h->dir, "inner.pid")};
    if (!pids[0] || !pids[1])
        return false;
    double now = mt_now_ms();
    if (h->on_at == 0)
        h->on_at = now;
    if (h->on_ms > 0 || (h->both_at > 0 && now - h->both_at >= 100) || now - h->on_at >= 5000) {
        if (h->on_ms == 0) {
            h->on_ms = now - h->on_at;
            char path[600];
            snprintf(path, sizeof path, "%s/released", h->dir);
            FILE *f = fopen(path, "w");
            if (f)
                fclose(f);
        }
        return false;
    }
    for (int i = 0; i < 2; i++) {
        h->state[i] = proc_state(pids[i]);
        h->stopped[i] |= h->state[i] == 'T';
    }
    if (h->stopped[0] && h->stopped[1] && h->both_at == 0)
        h->both_at = now;
    return true;
}

typedef struct tool_call {
    bool idle;       /* run from a SCHED_IDLE thread */
    const char *log;
    const char *const *argv;
    int rc;
    double ms;
} tool_call;

static void *call_tool(void *arg)
{
    tool_call *c = arg;
    struct sched_param none = {0};
    if (c->idle)
        cr_assert_eq(sched_setscheduler(0, SCHED_IDLE, &none), 0, "SCHED_IDLE");
    double t0 = mt_now_ms();
    c->rc = dev_run_tool(c->argv, c->log);
    c->ms = mt_now_ms() - t0;
    return NULL;
}

static void run_on_thread(tool_call *c)
{
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, call_tool, c), 0);
    pthread_join(th, NULL);
}

Test(run_tool, a_background_tool_and_its_children_stop_while_held)
{
    hold_probe h = {0};
    char log[600], script[2048];
    tool_log(h.dir, log);
    /* A driver that starts a child, as cc starts cc1 and as. The child
     * starts nothing itself (a loop of shell builtins): a shell that
     * vforks waits in uninterruptible sleep ('D', not 'T') while its
     * vforked child is stopped before its exec. It runs until the probe
     * has released the hold (a file), so a fast or a starved machine
     * cannot finish it before the hold is seen, or until a bound of
     * seconds if the hold never comes. */
    snprintf(script, sizeof script,
             "echo $$ > '%s/driver.pid'; sh -c 'echo $$ > \"$1\"/inner.pid; i=0; "
             "while [ ! -e \"$1\"/released ] && [ $i -lt 3000000 ]; do i=$((i + 1)); done; "
             "exit 6' inner '%s'; exit $?",
             h.dir, h.dir);
    const char *argv[] = {"sh", "-c", script, NULL};
    double held0;
    int64_t holds0;
    dev_tool_hold_stats(&held0, &holds0);
    dev_set_tool_hold(probe_hold, &h);
    tool_call c = {.idle = true, .log = log, .argv = argv};
    run_on_thread(&c);
    dev_set_tool_hold(NULL, NULL);
    cr_expect_eq(c.rc, 6, "the tool's own exit status after the hold");
    cr_expect(h.stopped[0], "the driver was not stopped (state %c)", h.state[0]);
    cr_expect(h.stopped[1], "its child was not stopped (state %c)", h.state[1]);
    cr_expect_geq(h.on_ms, 100);
    cr_expect_geq(c.ms, h.on_ms, "ran %.0f ms through a %.0f ms hold", c.ms, h.on_ms);
    double held;
    int64_t holds;
    dev_tool_hold_stats(&held, &holds);
    cr_expect_eq(holds - holds0, 1);
    /* The stop and the continue each follow the hold's answer at once (the
     * same poll): the time held is the time the hold was on, up to a
     * preemption of the polling thread in between (it runs in SCHED_IDLE). */
    double held_ms = (held - held0) * 1000;
    cr_expect(held_ms > h.on_ms - 20 && held_ms < h.on_ms + 1000,
              "held %.0f ms, the hold on %.0f ms", held_ms, h.on_ms);
}

static bool always(void *ctx)
{
    ++*(int *)ctx;
    return true;
}

Test(run_tool, a_tool_from_a_serving_thread_is_never_held)
{
    char dir[512], log[600];
    tool_log(dir, log);
    const char *argv[] = {"sh", "-c", "sleep 0.05; exit 4", NULL};
    int calls = 0;
    dev_set_tool_hold(always, &calls);
    tool_call c = {.idle = false, .log = log, .argv = argv};
    run_on_thread(&c);
    cr_expect_eq(c.rc, 4);
    cr_expect_eq(calls, 0, "the hold was asked %d times", calls);
    cr_expect_lt(c.ms, 5000);
    /* Cleared: a background thread's tool is not held either. */
    dev_set_tool_hold(NULL, NULL);
    c = (tool_call){.idle = true, .log = log, .argv = argv};
    run_on_thread(&c);
    cr_expect_eq(c.rc, 4);
    cr_expect_eq(calls, 0);
}
