/* cli.h: the `moetune` subcommands and the small helpers they share. Each
 * subcommand lives in its own cli/cmd_*.c: one option table (cli_opts.h)
 * that both parses its argv and prints its --help, then calls the library
 * and prints. Exit codes: 0 success, 1 failure, 2 usage error. */
#ifndef MT_CLI_H
#define MT_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "common/status.h"
#include "cli_opts.h"

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

/* Prints "moetune <cmd>: <message>" to stderr. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The database a command opens without --db: $MOETUNE_DB when set and not
 * empty, else "moetune.db"; and how help shows that default. */
const char *cli_db_default(void);
#define CLI_DB_DEFAULT_TEXT "$MOETUNE_DB or ./moetune.db"

/* --act-quant's setter (cli_opt_set_fn): dst is a model_act_quant; "none",
 * "mxfp4" or "int8" (model_act_quant_parse). */
bool cli_set_act_quant(void *dst, const char *text, char *err, size_t cap);

/* A tuning budget's setter (tune --budget, serve --tune-budget): dst is a
 * tune_budget; "50", "15%", "30s" or a combination (tune_budget_parse). */
bool cli_set_budget(void *dst, const char *text, char *err, size_t cap);
#define CLI_ACT_QUANT_ARG "none|mxfp4|int8"

/* --kv-dtype's values: bf16 and fp8 as kern_dtype values. */
extern const cli_choice cli_kv_dtypes[];

#endif
