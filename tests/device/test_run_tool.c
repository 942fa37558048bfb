/* test_run_tool.c: dev_run_tool, how the cpu, emu and hip backends run
 * their compilers. Pinned: the exit status, stdout and stderr both in the
 * log, a program that cannot be started (127, the reason in the log), and
 * that running a tool leaves the caller's memory alone: a server compiles
 * live swaps and tuning candidates while it serves, and a fork() there
 * left every page of the server copy-on-write, so each page it wrote next
 * took a fault (measured here as minor faults over 64 MiB written again). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "common/files.h"
#include "device/device_impl.h"
#include "test_tmp.h"

static char *read_log(const char *path)
{
    char *text = NULL;
    cr_assert_eq(mt_file_read(path, &text, NULL, NULL), MT_OK, "%s", path);
    return text;
}

Test(run_tool, exit_status_and_both_streams_in_the_log)
{
    char dir[512], log[600];
    tmp_dir_make(dir, sizeof dir, "mt_run_tool");
    snprintf(log, sizeof log, "%s/tool.log", dir);
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
    tmp_dir_make(dir, sizeof dir, "mt_run_tool");
    snprintf(log, sizeof log, "%s/tool.log", dir);
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
    tmp_dir_make(dir, sizeof dir, "mt_run_tool");
    snprintf(log, sizeof log, "%s/tool.log", dir);
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
