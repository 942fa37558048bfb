/* cli_opts.h: the option tables of the `moetune` subcommands. A command
 * describes each option once, in a table of cli_opt entries (name, type,
 * destination, default, help); cli_opts_parse walks argv against that table
 * and cli_opts_help prints --help from the same table, so what a command
 * parses and what its help lists cannot drift apart.
 *
 * Accepted forms: "--name value", "--name=value", "-x value", "-x=value"
 * (x a short name), flags alone ("--json"); anything else not starting with
 * '-' (or "-" alone) is a positional argument where the command takes them.
 * Every command also answers "-h"/"--help" (the help, exit 0) and
 * "--list-options" (the long names, one a line, for shell completion and
 * the tests). Nothing here keeps state between calls: thread-safe as long
 * as the destinations are the caller's own. */
#ifndef MT_CLI_OPTS_H
#define MT_CLI_OPTS_H

#include <math.h> /* HUGE_VAL, for ranges without an upper bound */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* cli_opts_parse's result besides CLI_OK and CLI_USAGE (cli.h): help or
 * the option list was printed; the command exits 0. */
#define CLI_HELP (-1)

typedef enum cli_opt_type {
    CLI_OPT_FLAG = 0,     /* no value: *(bool *)dst = true; false before parsing */
    CLI_OPT_FLAG_OFF = 1, /* no value: *(bool *)dst = false; true before parsing */
    CLI_OPT_STRING = 2,   /* *(const char **)dst = the argv text (not copied) */
    CLI_OPT_INT = 3,      /* decimal into *(int *)dst */
    CLI_OPT_INT64 = 4,    /* decimal into *(int64_t *)dst */
    CLI_OPT_UINT64 = 5,   /* decimal or 0x hex into *(uint64_t *)dst (seeds) */
    CLI_OPT_DOUBLE = 6,   /* *(double *)dst */
    CLI_OPT_INT_LIST = 7, /* "1,16,256" into *(cli_int_list *)dst */
    CLI_OPT_CHOICE = 8,   /* one of choices[].name: *(int *)dst = its value */
    CLI_OPT_CUSTOM = 9,   /* set(dst, text, ...) converts and stores */
    CLI_OPT_TYPE_COUNT
} cli_opt_type;

/* cli_opt.flags */
#define CLI_OPT_REQUIRED 1u /* parsing fails without it */
#define CLI_OPT_MIN_OPEN 2u /* the range excludes min: (min, max] */
#define CLI_OPT_MAX_OPEN 4u /* the range excludes max: [min, max) */

/* The destination of CLI_OPT_INT_LIST: the caller's array v of cap
 * entries; the parser sets n (0 when the option is absent and has no
 * default). A repeated option replaces the list. */
typedef struct cli_int_list {
    int64_t *v;
    int cap;
    int n;
} cli_int_list;

/* One allowed value of CLI_OPT_CHOICE; a list ends with name NULL. */
typedef struct cli_choice {
    const char *name;
    int value;
} cli_choice;

/* Converts text and stores it through dst; false when the text is not
 * valid, with why (without the option's name: "none, mxfp4 or int8") in
 * err, or err left empty. */
typedef bool (*cli_opt_set_fn)(void *dst, const char *text, char *err, size_t cap);

/* One option. A table is an array of these ending with an entry whose name
 * is NULL. */
typedef struct cli_opt {
    const char *name;      /* long name with its dashes: "--jobs" */
    char short_name;       /* 'j' for "-j", or 0; 'h' is taken by help */
    cli_opt_type type;
    void *dst;             /* where the value goes; see cli_opt_type */
    cli_opt_set_fn set;    /* CLI_OPT_CUSTOM only */
    const cli_choice *choices; /* CLI_OPT_CHOICE only */
    const char *arg;       /* value placeholder in help ("N", "FILE"); choices
                              show as "a|b" without one */
    const char *def;       /* default: stored before argv is read, as if given
                              (through set for CLI_OPT_CUSTOM); shown in help */
    const char *def_text;  /* a default that is not a literal value ("$MOETUNE_DB
                              or ./moetune.db"): shown in help only, the caller
                              sets the destination */
    const char *help;      /* '\n' forces a line break */
    double min, max;       /* range of numbers and list entries; both 0: none
                              beyond the type's own; max HUGE_VAL: no upper bound */
    unsigned flags;        /* CLI_OPT_REQUIRED, CLI_OPT_MIN_OPEN, CLI_OPT_MAX_OPEN */
    bool *given;           /* optional: set to true when argv holds the option
                              (never reset; several entries may share one) */
} cli_opt;

/* A command: its table, help text and positional arguments. */
typedef struct cli_cmd {
    const char *name;      /* "tune", "db verify": messages and the usage line */
    const char *usage;     /* usage lines without "moetune ", '\n' between (a line
                              starting with a blank continues the one above); NULL:
                              the name, the required options and "[options]" */
    const char *about;     /* one paragraph; '\n' forces a line break */
    const cli_opt *opts;
    const char *pos_arg;   /* placeholder of the positional arguments ("SRC.db..."),
                              NULL when the command takes none */
    const char **pos;      /* where they go (the argv strings, not copied) */
    int pos_cap;
    int *n_pos;
    void (*more)(FILE *f); /* prints more help between the paragraph and the
                              options (a subcommand list), or NULL */
} cli_cmd;

/* Stores the defaults, then reads argv[first..argc-1] against cmd's table.
 * Returns CLI_OK; CLI_HELP when argv asks for the help or the option list
 * (nothing printed; err holds the argument that asked: "-h", "--help" or
 * "--list-options"); or CLI_USAGE with why in err (naming the option and
 * the value at fault). Destinations of options read before a failure keep
 * their new values. */
int cli_opts_scan(const cli_cmd *cmd, int argc, char **argv, int first, char *err,
                  size_t cap);

/* cli_opts_scan, then prints: the help or the option list to stdout
 * (returns CLI_HELP), or "moetune <cmd>: <why>" and the usage to stderr
 * (returns CLI_USAGE). */
int cli_opts_parse(const cli_cmd *cmd, int argc, char **argv, int first);

/* The whole --help: usage, the paragraph, cmd->more, then one line per
 * option (placeholder, help, default). */
void cli_opts_help(const cli_cmd *cmd, FILE *f);

/* The usage lines alone. */
void cli_opts_usage(const cli_cmd *cmd, FILE *f);

/* For cmd->more: one row laid out as the options are ("  left" then help
 * wrapped in the help column), and a paragraph wrapped from column 0. */
void cli_opts_help_row(FILE *f, const char *left, const char *help);
void cli_opts_help_text(FILE *f, const char *text);

#endif
