/* cli.h: the `moetune` subcommands and the small helpers they share. Each
 * subcommand lives in its own cli/cmd_*.c, parses its own options, calls the
 * library and prints. Exit codes: 0 success, 1 failure, 2 usage error. */
#ifndef MT_CLI_H
#define MT_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "common/status.h"

#define CLI_OK 0
#define CLI_FAIL 1
#define CLI_USAGE 2

typedef int (*cli_cmd_fn)(int argc, char **argv); /* argv[0] is the command */

int cmd_devices(int argc, char **argv);
int cmd_kernels(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_db(int argc, char **argv);
int cmd_db_verify(int argc, char **argv); /* `moetune db verify` */
int cmd_make_tiny_model(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_isa(int argc, char **argv);
int cmd_plan(int argc, char **argv);

/* Option parsing: "--name value" or "--name=value". Returns the value and
 * advances *i, or NULL when argv[*i] is not that option. A missing value
 * prints a usage error and sets *bad. */
const char *cli_opt(int argc, char **argv, int *i, const char *name, bool *bad);
/* True (and advances nothing) when argv[i] is the flag. */
bool cli_flag(const char *arg, const char *name);

/* Prints "moetune <cmd>: <message>" to stderr. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses "1,2,4,8" into out (cap entries); returns the count or -1. */
int cli_parse_int_list(const char *s, long long *out, int cap);

/* True when stdout is a terminal (progress bars) . */
bool cli_is_tty(void);

#endif
