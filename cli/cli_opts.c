/* cli_opts.c: reads argv against a command's option table and prints the
 * command's --help from the same table (cli_opts.h): the defaults, the
 * conversions and range checks of every option type, the error text naming
 * the option and the value, and the help layout. */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OPTS 64   /* entries of one table */
#define HELP_COL 26   /* where an option's help starts */
#define HELP_WIDTH 80 /* help lines wrap before this column */

static const char list_flag[] = "--list-options";

static int count_opts(const cli_opt *t)
{
    int n = 0;
    while (t[n].name)
        n++;
    return n;
}

static bool takes_value(const cli_opt *o)
{
    return o->type != CLI_OPT_FLAG && o->type != CLI_OPT_FLAG_OFF;
}

/* ---- values ---------------------------------------------------------------- */

static bool ranged(const cli_opt *o) { return o->min != 0 || o->max != 0; }

static bool in_range(const cli_opt *o, double x)
{
    if (!ranged(o))
        return true;
    bool lo = (o->flags & CLI_OPT_MIN_OPEN) ? x > o->min : x >= o->min;
    bool hi = (o->flags & CLI_OPT_MAX_OPEN) ? x < o->max : x <= o->max;
    return lo && hi;
}

/* A bound as people write it: 16777216, 0.95, 1e+06. */
static void bound_text(double x, char *out, size_t cap)
{
    if (x == (double)(long long)x && x > -1e15 && x < 1e15)
        snprintf(out, cap, "%lld", (long long)x);
    else
        snprintf(out, cap, "%g", x);
}

/* "an integer in [1, 256]", "a number in (0, 1]", "an integer >= 1" */
static void range_text(const cli_opt *o, bool integer, char *out, size_t cap)
{
    char lo[32], hi[32];
    const char *what = integer ? "an integer" : "a number";
    bound_text(o->min, lo, sizeof lo);
    bound_text(o->max, hi, sizeof hi);
    if (isinf(o->max))
        snprintf(out, cap, "%s %s %s", what, (o->flags & CLI_OPT_MIN_OPEN) ? ">" : ">=", lo);
    else
        snprintf(out, cap, "%s in %c%s, %s%c", what, (o->flags & CLI_OPT_MIN_OPEN) ? '(' : '[',
                 lo, hi, (o->flags & CLI_OPT_MAX_OPEN) ? ')' : ']');
}

static bool parse_ll(const char *v, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno == ERANGE)
        return false;
    *out = x;
    return true;
}

/* INT and INT64: an integer within the range, or within int for INT. */
static bool set_integer(const cli_opt *o, const char *v, char *err, size_t cap)
{
    long long x;
    if (!parse_ll(v, &x)) {
        snprintf(err, cap, "%s '%s' is not an integer", o->name, v);
        return false;
    }
    bool fits = o->type == CLI_OPT_INT64 || (x >= INT_MIN && x <= INT_MAX);
    if (!in_range(o, (double)x) || !fits) {
        char r[96];
        if (ranged(o) && (fits || !isinf(o->max)))
            range_text(o, true, r, sizeof r);
        else
            snprintf(r, sizeof r, "an integer in [%d, %d]", INT_MIN, INT_MAX);
        snprintf(err, cap, "%s '%s' must be %s", o->name, v, r);
        return false;
    }
    if (o->type == CLI_OPT_INT)
        *(int *)o->dst = (int)x;
    else
        *(int64_t *)o->dst = x;
    return true;
}

static bool set_uint64(const cli_opt *o, const char *v, char *err, size_t cap)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (end == v || *end || errno == ERANGE || strchr(v, '-')) {
        snprintf(err, cap, "%s '%s' is not a non-negative integer", o->name, v);
        return false;
    }
    *(uint64_t *)o->dst = x;
    return true;
}

static bool set_double(const cli_opt *o, const char *v, char *err, size_t cap)
{
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || x != x) {
        snprintf(err, cap, "%s '%s' is not a number", o->name, v);
        return false;
    }
    if (!in_range(o, x)) {
        char r[96];
        range_text(o, false, r, sizeof r);
        snprintf(err, cap, "%s '%s' must be %s", o->name, v, r);
        return false;
    }
    *(double *)o->dst = x;
    return true;
}

/* "1,16,256": every entry an integer within the range, at most cap. */
static bool set_list(const cli_opt *o, const char *v, char *err, size_t cap)
{
    cli_int_list *l = o->dst;
    int n = 0;
    for (const char *p = v;; p++) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || (*end && *end != ',') || errno == ERANGE || n == l->cap) {
            snprintf(err, cap, "%s '%s' must be a comma-separated list of up to %d integers",
                     o->name, v, l->cap);
            return false;
        }
        if (!in_range(o, (double)x)) {
            char r[96];
            range_text(o, true, r, sizeof r);
            snprintf(err, cap, "%s '%s': %lld is not %s", o->name, v, x, r);
            return false;
        }
        l->v[n++] = x;
        p = end;
        if (!*p)
            break;
    }
    l->n = n;
    return true;
}

static bool set_choice(const cli_opt *o, const char *v, char *err, size_t cap)
{
    for (const cli_choice *c = o->choices; c->name; c++)
        if (!strcmp(c->name, v)) {
            *(int *)o->dst = c->value;
            return true;
        }
    size_t n = (size_t)snprintf(err, cap, "%s '%s' must be one of", o->name, v);
    for (const cli_choice *c = o->choices; c->name && n < cap; c++)
        n += (size_t)snprintf(err + n, cap - n, "%s %s", c == o->choices ? "" : ",", c->name);
    return false;
}

static bool set_custom(const cli_opt *o, const char *v, char *err, size_t cap)
{
    char why[256] = "";
    if (o->set(o->dst, v, why, sizeof why))
        return true;
    if (why[0])
        snprintf(err, cap, "%s '%s': %s", o->name, v, why);
    else
        snprintf(err, cap, "%s '%s' is not valid", o->name, v);
    return false;
}

/* Converts v and stores it; false with err filled. */
static bool set_value(const cli_opt *o, const char *v, char *err, size_t cap)
{
    switch (o->type) {
    case CLI_OPT_STRING:
        *(const char **)o->dst = v;
        return true;
    case CLI_OPT_INT:
    case CLI_OPT_INT64:
        return set_integer(o, v, err, cap);
    case CLI_OPT_UINT64:
        return set_uint64(o, v, err, cap);
    case CLI_OPT_DOUBLE:
        return set_double(o, v, err, cap);
    case CLI_OPT_INT_LIST:
        return set_list(o, v, err, cap);
    case CLI_OPT_CHOICE:
        return set_choice(o, v, err, cap);
    case CLI_OPT_CUSTOM:
        return set_custom(o, v, err, cap);
    default:
        *(bool *)o->dst = o->type == CLI_OPT_FLAG;
        return true;
    }
}

/* Flags start cleared (set for FLAG_OFF); values with a default start at
 * it. A default that does not convert is a bug in the table. */
static bool apply_defaults(const cli_opt *t, char *err, size_t cap)
{
    for (const cli_opt *o = t; o->name; o++) {
        if (!takes_value(o))
            *(bool *)o->dst = o->type == CLI_OPT_FLAG_OFF;
        else if (o->def && !set_value(o, o->def, err, cap))
            return false;
    }
    return true;
}

/* ---- argv ------------------------------------------------------------------ */

/* The entry a "--name[=v]" or "-x[=v]" names, or NULL. */
static const cli_opt *find_opt(const cli_opt *t, const char *a)
{
    if (a[1] != '-') {
        bool alone = a[2] == 0 || a[2] == '=';
        for (const cli_opt *o = t; o->name && alone; o++)
            if (o->short_name && o->short_name == a[1])
                return o;
        return NULL;
    }
    size_t len = strcspn(a, "=");
    for (const cli_opt *o = t; o->name; o++)
        if (strlen(o->name) == len && !strncmp(o->name, a, len))
            return o;
    return NULL;
}

/* One option at argv[*i]; advances *i past a separate value. */
static bool read_opt(const cli_opt *o, int argc, char **argv, int *i, char *err, size_t cap)
{
    const char *eq = strchr(argv[*i], '=');
    if (!takes_value(o)) {
        if (eq) {
            snprintf(err, cap, "%s takes no value, got '%s'", o->name, eq + 1);
            return false;
        }
        return set_value(o, NULL, err, cap);
    }
    if (eq)
        return set_value(o, eq + 1, err, cap);
    if (*i + 1 >= argc) {
        snprintf(err, cap, "%s needs a value%s%s", o->name, o->arg ? " " : "",
                 o->arg ? o->arg : "");
        return false;
    }
    (*i)++;
    return set_value(o, argv[*i], err, cap);
}

static bool add_positional(const cli_cmd *cmd, const char *a, char *err, size_t cap)
{
    if (!cmd->pos_arg || !cmd->pos) {
        snprintf(err, cap, "unexpected argument '%s'", a);
        return false;
    }
    if (*cmd->n_pos >= cmd->pos_cap) {
        snprintf(err, cap, "too many arguments at '%s' (at most %d)", a, cmd->pos_cap);
        return false;
    }
    cmd->pos[(*cmd->n_pos)++] = a;
    return true;
}

static bool check_required(const cli_opt *t, const bool *seen, char *err, size_t cap)
{
    for (int k = 0; t[k].name; k++)
        if ((t[k].flags & CLI_OPT_REQUIRED) && !seen[k]) {
            snprintf(err, cap, "%s%s%s is required", t[k].name, t[k].arg ? " " : "",
                     t[k].arg ? t[k].arg : "");
            return false;
        }
    return true;
}

static bool is_help(const char *a)
{
    return !strcmp(a, "-h") || !strcmp(a, "--help") || !strcmp(a, list_flag);
}

int cli_opts_scan(const cli_cmd *cmd, int argc, char **argv, int first, char *err,
                  size_t cap)
{
    bool seen[MAX_OPTS] = {false};
    if (count_opts(cmd->opts) > MAX_OPTS) {
        snprintf(err, cap, "more than %d options in the table", MAX_OPTS);
        return CLI_USAGE;
    }
    err[0] = 0;
    if (!apply_defaults(cmd->opts, err, cap))
        return CLI_USAGE;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (is_help(a)) {
            snprintf(err, cap, "%s", a);
            return CLI_HELP;
        }
        if (a[0] != '-' || !a[1]) {
            if (!add_positional(cmd, a, err, cap))
                return CLI_USAGE;
            continue;
        }
        const cli_opt *o = find_opt(cmd->opts, a);
        if (!o) {
            snprintf(err, cap, "unknown option '%s'", a);
            return CLI_USAGE;
        }
        if (!read_opt(o, argc, argv, &i, err, cap))
            return CLI_USAGE;
        seen[o - cmd->opts] = true;
        if (o->given)
            *o->given = true;
    }
    return check_required(cmd->opts, seen, err, cap) ? CLI_OK : CLI_USAGE;
}

int cli_opts_parse(const cli_cmd *cmd, int argc, char **argv, int first)
{
    char err[1024];
    int rc = cli_opts_scan(cmd, argc, argv, first, err, sizeof err);
    if (rc == CLI_HELP) {
        if (!strcmp(err, list_flag))
            for (const cli_opt *o = cmd->opts; o->name; o++)
                printf("%s\n", o->name);
        else
            cli_opts_help(cmd, stdout);
    } else if (rc != CLI_OK) {
        fprintf(stderr, "moetune %s: %s\n", cmd->name, err);
        cli_opts_usage(cmd, stderr);
        fprintf(stderr, "`moetune %s --help` describes every option.\n", cmd->name);
    }
    return rc;
}

/* ---- help ------------------------------------------------------------------ */

/* Prints text from column col (already reached), wrapping before
 * HELP_WIDTH to column indent; '\n' breaks the line. Returns the column
 * reached. */
static int wrap(FILE *f, const char *text, int indent, int col)
{
    const char *p = text;
    while (*p) {
        if (*p == '\n') {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
            p++;
            continue;
        }
        if (*p == ' ') {
            p++;
            continue;
        }
        int len = (int)strcspn(p, " \n");
        bool first = col == indent;
        if (!first && col + 1 + len > HELP_WIDTH) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
            first = true;
        }
        fprintf(f, "%s%.*s", first ? "" : " ", len, p);
        col += len + (first ? 0 : 1);
        p += len;
    }
    return col;
}

/* "  -j, --jobs N"; choices as "a|b" where there is no placeholder. */
static int opt_left(const cli_opt *o, char *out, size_t cap)
{
    int n;
    if (o->short_name)
        n = snprintf(out, cap, "  -%c, %s", o->short_name, o->name);
    else
        n = snprintf(out, cap, "  %s", o->name);
    if (o->arg)
        return n + snprintf(out + n, cap - (size_t)n, " %s", o->arg);
    if (o->type != CLI_OPT_CHOICE)
        return n;
    for (const cli_choice *c = o->choices; c->name && (size_t)n < cap; c++)
        n += snprintf(out + n, cap - (size_t)n, "%c%s", c == o->choices ? ' ' : '|', c->name);
    return n;
}

/* left, then text from the help column (on the next line when left
 * reaches it); returns the column reached. */
static int help_row(FILE *f, const char *left, const char *text)
{
    int col = (int)strlen(left);
    fputs(left, f);
    if (col > HELP_COL - 2)
        fprintf(f, "\n%*s", HELP_COL, "");
    else
        fprintf(f, "%*s", HELP_COL - col, "");
    return wrap(f, text ? text : "", HELP_COL, HELP_COL);
}

static void opt_help(const cli_opt *o, FILE *f)
{
    char left[256];
    opt_left(o, left, sizeof left);
    int col = help_row(f, left, o->help);
    const char *def = o->def_text ? o->def_text : o->def;
    char extra[512] = "";
    if (o->flags & CLI_OPT_REQUIRED)
        snprintf(extra, sizeof extra, "(required)");
    else if (def)
        snprintf(extra, sizeof extra, "(default: %s)", def);
    wrap(f, extra, HELP_COL, col);
    fputc('\n', f);
}

void cli_opts_help_row(FILE *f, const char *left, const char *help)
{
    char l[256];
    snprintf(l, sizeof l, "  %s", left);
    help_row(f, l, help);
    fputc('\n', f);
}

void cli_opts_help_text(FILE *f, const char *text)
{
    wrap(f, text, 0, 0);
    fputc('\n', f);
}

void cli_opts_usage(const cli_cmd *cmd, FILE *f)
{
    if (cmd->usage) {
        const char *p = cmd->usage;
        for (bool first = true; *p; first = false) {
            int len = (int)strcspn(p, "\n");
            /* a line starting with a blank continues the one above */
            const char *lead = first ? "usage: moetune " : *p == ' ' ? "               "
                                                                   : "       moetune ";
            fprintf(f, "%s%.*s\n", lead, len, p);
            p += len + (p[len] == '\n');
        }
        return;
    }
    fprintf(f, "usage: moetune %s", cmd->name);
    for (const cli_opt *o = cmd->opts; o->name; o++)
        if (o->flags & CLI_OPT_REQUIRED)
            fprintf(f, " %s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    fprintf(f, " [options]%s%s\n", cmd->pos_arg ? " " : "", cmd->pos_arg ? cmd->pos_arg : "");
}

void cli_opts_help(const cli_cmd *cmd, FILE *f)
{
    cli_opts_usage(cmd, f);
    if (cmd->about) {
        fputc('\n', f);
        cli_opts_help_text(f, cmd->about);
    }
    if (cmd->more) {
        fputc('\n', f);
        cmd->more(f);
    }
    fprintf(f, "\noptions:\n");
    for (const cli_opt *o = cmd->opts; o->name; o++)
        opt_help(o, f);
    const cli_opt help = {.name = "--help", .short_name = 'h', .type = CLI_OPT_FLAG,
                          .help = "this help; --list-options: the option names alone"};
    opt_help(&help, f);
}
