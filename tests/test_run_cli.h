/* test_run_cli.h: runs the real moetune binary (MOETUNE_BIN, which the
 * build defines for every test) with a command line and captures what it
 * prints, for the tests of the CLI's commands. */
#ifndef MT_TEST_RUN_CLI_H
#define MT_TEST_RUN_CLI_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

/* Runs `moetune cmd args` (cmd may be ""), stdout and stderr together;
 * returns the exit code (-1 when it did not exit) and the output in *out
 * (malloc'd, NUL-terminated; the caller frees it). */
static inline int test_run_cli(const char *cmd, const char *args, char **out)
{
    char line[4096];
    snprintf(line, sizeof line, "%s %s %s 2>&1", MOETUNE_BIN, cmd, args);
    FILE *p = popen(line, "r");
    cr_assert_not_null(p, "popen %s", line);
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    cr_assert_not_null(buf);
    while ((r = fread(buf + n, 1, cap - 1 - n, p)) > 0) {
        n += r;
        if (n + 1 >= cap) {
            buf = realloc(buf, cap *= 2);
            cr_assert_not_null(buf);
        }
    }
    buf[n] = 0;
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
