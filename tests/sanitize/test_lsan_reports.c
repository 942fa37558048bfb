/* test_lsan_reports.c: LeakSanitizer is on in the sanitizer pass and
 * reports. Runs tests/sanitize/leaker.c (built alongside, sanitizer builds
 * only) with this test's own environment, so ASAN_OPTIONS as scripts/test.sh
 * sets them: a leak must come back as a LeakSanitizer report naming the
 * leaking function and a failed exit; the same program freeing its block
 * must exit cleanly. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#ifndef MT_LEAKER
#error "MT_LEAKER: path of the leaker program, set by CMakeLists.txt"
#endif

/* Runs the leaker in mode, stdout and stderr into out; returns the wait
 * status. */
static int run_leaker(const char *mode, char *out, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", MT_LEAKER, mode);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "popen %s", cmd);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    return pclose(p);
}

static bool failed(int status)
{
    return status == -1 || WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status));
}

Test(lsan, a_deliberate_leak_is_reported)
{
    static char out[1 << 16];
    int status = run_leaker("leak", out, sizeof out);
    cr_assert(strstr(out, "ERROR: LeakSanitizer: detected memory leaks"),
              "no LeakSanitizer report (ASAN_OPTIONS=%s):\n%s",
              getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "", out);
    cr_assert(strstr(out, "4242 byte(s) in 1 object(s)"), "%s", out);
    cr_assert(strstr(out, "leak_on_purpose"), "the report does not name the leak:\n%s", out);
    cr_assert(failed(status), "a leaking program exited 0:\n%s", out);
}

Test(lsan, no_report_when_nothing_leaks)
{
    static char out[1 << 16];
    int status = run_leaker("free", out, sizeof out);
    cr_assert_not(strstr(out, "LeakSanitizer"), "%s", out);
    cr_assert_not(failed(status), "status %d:\n%s", status, out);
}
