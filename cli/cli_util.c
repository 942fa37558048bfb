/* cli_util.c: option parsing and printing helpers for the subcommands. */
#include "cli.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *cli_opt(int argc, char **argv, int *i, const char *name, bool *bad)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] != 0)
        return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "moetune: option %s needs a value\n", name);
        *bad = true;
        return NULL;
    }
    (*i)++;
    return argv[*i];
}

bool cli_flag(const char *arg, const char *name) { return strcmp(arg, name) == 0; }

void cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "moetune %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int cli_parse_int_list(const char *s, long long *out, int cap)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || n >= cap)
            return -1;
        out[n++] = v;
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        p = end;
    }
    return n;
}

bool cli_is_tty(void) { return isatty(1); }
