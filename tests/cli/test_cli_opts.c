/* test_cli_opts.c: the option tables of the CLI (cli/cli_opts.h). The
 * parser itself on a small table of every type (both value forms, short
 * names, defaults, ranges, lists, choices, setters, positional arguments,
 * the error text); then every command of the real binary: its --help lists
 * every option its table holds and nothing else, every "--option" its
 * source names appears in that help (an option parsed outside the table
 * fails here), and an unknown option fails naming it. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cli/cli.h"
#include "cli/cli_opts.h"
#include "test_run_cli.h"

/* ---- the parser on a small table ------------------------------------------ */

typedef struct vals {
    bool flag, on, even_given;
    const char *str, *req;
    int i, even;
    int64_t i64;
    uint64_t u64;
    double d;
    int64_t lv[4];
    cli_int_list list;
    int pick;
    const char *pos[3];
    int n_pos;
} vals;

static const cli_choice picks[] = {{"a", 10}, {"b", 20}, {"c", 30}, {NULL, 0}};

static bool set_even(void *dst, const char *text, char *err, size_t cap)
{
    char *end;
    long x = strtol(text, &end, 10);
    if (*end || x % 2) {
        snprintf(err, cap, "an even number");
        return false;
    }
    *(int *)dst = (int)x;
    return true;
}

#define MAX_ARGS 32

/* Splits args at blanks into argv[1..] (argv[0] is the command). */
static int split(const char *args, char *buf, size_t cap, char **argv)
{
    snprintf(buf, cap, "%s", args);
    int argc = 0;
    argv[argc++] = "test";
    for (char *t = strtok(buf, " "); t && argc < MAX_ARGS; t = strtok(NULL, " "))
        argv[argc++] = t;
    return argc;
}

/* Scans args against the test table; positional arguments only when pos. */
static int scan(vals *v, const char *args, bool pos, bool required, char *err, size_t cap)
{
    memset(v, 0, sizeof *v);
    v->list = (cli_int_list){v->lv, 4, 0};
    const cli_opt opts[] = {
        {.name = "--flag", .type = CLI_OPT_FLAG, .dst = &v->flag, .help = "a flag"},
        {.name = "--off", .type = CLI_OPT_FLAG_OFF, .dst = &v->on, .help = "clears on"},
        {.name = "--str", .type = CLI_OPT_STRING, .dst = &v->str, .arg = "S", .def = "dflt",
         .help = "a string"},
        {.name = "--int", .short_name = 'i', .type = CLI_OPT_INT, .dst = &v->i, .arg = "N",
         .def = "7", .min = 0, .max = 10, .help = "an int"},
        {.name = "--i64", .type = CLI_OPT_INT64, .dst = &v->i64, .arg = "N", .help = "wide"},
        {.name = "--u64", .type = CLI_OPT_UINT64, .dst = &v->u64, .arg = "N", .help = "seed"},
        {.name = "--dbl", .type = CLI_OPT_DOUBLE, .dst = &v->d, .arg = "X", .def = "0.5",
         .min = 0, .max = 10, .flags = CLI_OPT_MIN_OPEN, .help = "a double"},
        {.name = "--list", .type = CLI_OPT_INT_LIST, .dst = &v->list, .arg = "LIST",
         .def = "1,2", .min = 1, .max = HUGE_VAL, .help = "a list"},
        {.name = "--pick", .type = CLI_OPT_CHOICE, .dst = &v->pick, .choices = picks,
         .def = "b", .help = "a choice"},
        {.name = "--even", .type = CLI_OPT_CUSTOM, .dst = &v->even, .set = set_even,
         .given = &v->even_given, .arg = "N", .def_text = "none", .help = "a setter"},
        {.name = "--req", .type = CLI_OPT_STRING, .dst = &v->req, .arg = "R",
         .flags = required ? CLI_OPT_REQUIRED : 0, .help = "maybe required"},
        {0},
    };
    const cli_cmd cmd = {.name = "test", .opts = opts, .pos_arg = pos ? "FILE..." : NULL,
                         .pos = v->pos, .pos_cap = 3, .n_pos = &v->n_pos};
    static char buf[1024]; /* the values point into it until the next scan */
    char *argv[MAX_ARGS];
    int argc = split(args, buf, sizeof buf, argv);
    return cli_opts_scan(&cmd, argc, argv, 1, err, cap);
}

/* scan must fail with an error naming every one of the words. */
static void fails_with(const char *args, const char *w1, const char *w2)
{
    vals v;
    char err[512];
    cr_assert_eq(scan(&v, args, false, false, err, sizeof err), CLI_USAGE, "'%s' parsed",
                 args);
    cr_assert(strstr(err, w1), "'%s': %s", args, err);
    cr_assert(!w2 || strstr(err, w2), "'%s': %s", args, err);
}

Test(cli_opts, defaults_apply_when_absent)
{
    vals v;
    char err[512];
    cr_assert_eq(scan(&v, "", false, false, err, sizeof err), CLI_OK, "%s", err);
    cr_assert(!v.flag && v.on && !v.even_given);
    cr_assert_str_eq(v.str, "dflt");
    cr_assert_eq(v.i, 7);
    cr_assert_eq(v.d, 0.5);
    cr_assert_eq(v.list.n, 2);
    cr_assert(v.lv[0] == 1 && v.lv[1] == 2);
    cr_assert_eq(v.pick, 20);
    cr_assert_eq(v.even, 0, "a default shown only is not applied");
    cr_assert_null(v.req);
}

Test(cli_opts, every_type_in_both_forms)
{
    vals v;
    char err[512];
    cr_assert_eq(scan(&v, "--flag --off --str s --int 5 --i64 -9000000000 --u64 0x10 --dbl 2.5 "
                          "--list 4,8,16 --pick c --even 6", false, false, err, sizeof err),
                 CLI_OK, "%s", err);
    cr_assert(v.flag && !v.on && v.even_given);
    cr_assert_str_eq(v.str, "s");
    cr_assert(v.i == 5 && v.i64 == -9000000000LL && v.u64 == 16 && v.d == 2.5);
    cr_assert(v.list.n == 3 && v.lv[0] == 4 && v.lv[1] == 8 && v.lv[2] == 16);
    cr_assert(v.pick == 30 && v.even == 6);
    cr_assert_eq(scan(&v, "--str=t --int=3 --i64=12 --u64=9 --dbl=10 --list=7 --pick=a "
                          "--even=-2", false, false, err, sizeof err),
                 CLI_OK, "%s", err);
    cr_assert_str_eq(v.str, "t");
    cr_assert(v.i == 3 && v.i64 == 12 && v.u64 == 9 && v.d == 10);
    cr_assert(v.list.n == 1 && v.lv[0] == 7 && v.pick == 10 && v.even == -2);
    /* a short name, both forms; the last of a repeated option wins */
    cr_assert_eq(scan(&v, "-i 2", false, false, err, sizeof err), CLI_OK, "%s", err);
    cr_assert_eq(v.i, 2);
    cr_assert_eq(scan(&v, "-i=4 --int 1 --int 9", false, false, err, sizeof err), CLI_OK);
    cr_assert_eq(v.i, 9);
    /* a value may start with a dash */
    cr_assert_eq(scan(&v, "--str -x", false, false, err, sizeof err), CLI_OK, "%s", err);
    cr_assert_str_eq(v.str, "-x");
}

Test(cli_opts, missing_value_names_the_option)
{
    fails_with("--int", "--int", "needs a value");
    fails_with("--pick a --str", "--str", "needs a value");
}

Test(cli_opts, bad_numbers_name_the_option_and_the_value)
{
    fails_with("--int x", "--int 'x'", "not an integer");
    fails_with("--int 5x", "'5x'", "not an integer");
    fails_with("--int 11", "--int '11'", "an integer in [0, 10]");
    fails_with("--int -1", "'-1'", "[0, 10]");
    fails_with("--i64 99999999999999999999", "--i64", "not an integer");
    fails_with("--u64 -3", "--u64 '-3'", "non-negative");
    fails_with("--dbl abc", "--dbl 'abc'", "not a number");
    fails_with("--dbl 0", "--dbl '0'", "a number in (0, 10]");
    fails_with("--dbl nan", "--dbl", "not a number");
}

Test(cli_opts, lists)
{
    vals v;
    char err[512];
    cr_assert_eq(scan(&v, "--list 1,2,3,4", false, false, err, sizeof err), CLI_OK, "%s", err);
    cr_assert_eq(v.list.n, 4);
    cr_assert_eq(v.lv[3], 4);
    fails_with("--list 1,2,3,4,5", "--list '1,2,3,4,5'", "up to 4 integers");
    fails_with("--list 1,,2", "--list '1,,2'", "comma-separated");
    fails_with("--list 1,", "--list '1,'", "comma-separated");
    fails_with("--list 2,x", "'2,x'", "comma-separated");
    fails_with("--list 3,0", "--list '3,0'", "0 is not an integer >= 1");
}

Test(cli_opts, choices_and_setters)
{
    fails_with("--pick d", "--pick 'd'", "one of a, b, c");
    fails_with("--even 3", "--even '3'", "an even number");
}

Test(cli_opts, unknown_options_flags_with_values_and_positionals)
{
    fails_with("--nope", "unknown option '--nope'", NULL);
    fails_with("--flag --nope=1", "'--nope=1'", NULL);
    fails_with("-z", "unknown option '-z'", NULL);
    fails_with("-iz", "unknown option '-iz'", NULL);
    fails_with("--flag=1", "--flag takes no value", NULL);
    fails_with("extra", "unexpected argument 'extra'", NULL);
    vals v;
    char err[512];
    cr_assert_eq(scan(&v, "a --flag b - ", true, false, err, sizeof err), CLI_OK, "%s", err);
    cr_assert(v.flag && v.n_pos == 3);
    cr_assert_str_eq(v.pos[0], "a");
    cr_assert_str_eq(v.pos[1], "b");
    cr_assert_str_eq(v.pos[2], "-");
    cr_assert_eq(scan(&v, "a b c d", true, false, err, sizeof err), CLI_USAGE);
    cr_assert(strstr(err, "too many arguments at 'd'"), "%s", err);
}

Test(cli_opts, required_and_help)
{
    vals v;
    char err[512];
    cr_assert_eq(scan(&v, "--flag", false, true, err, sizeof err), CLI_USAGE);
    cr_assert_str_eq(err, "--req R is required");
    cr_assert_eq(scan(&v, "--req=r", false, true, err, sizeof err), CLI_OK, "%s", err);
    cr_assert_eq(scan(&v, "--flag --help --nope", false, true, err, sizeof err), CLI_HELP);
    cr_assert_eq(scan(&v, "-h", false, true, err, sizeof err), CLI_HELP);
    cr_assert_str_eq(err, "-h", "which argument asked");
    cr_assert_eq(scan(&v, "--str --help --list-options", false, true, err, sizeof err),
                 CLI_HELP);
    cr_assert_str_eq(err, "--list-options", "--help was --str's value");
}

Test(cli_opts, help_lists_every_entry_with_placeholder_and_default)
{
    const cli_opt opts[] = {
        {.name = "--alpha", .type = CLI_OPT_INT, .dst = &(int){0}, .arg = "N", .def = "3",
         .help = "the first"},
        {.name = "--beta", .short_name = 'b', .type = CLI_OPT_FLAG, .dst = &(bool){false},
         .help = "the second, with a help text long enough to wrap past the eightieth "
                 "column of the terminal at least once"},
        {.name = "--gamma", .type = CLI_OPT_CHOICE, .dst = &(int){0}, .choices = picks,
         .flags = CLI_OPT_REQUIRED, .help = "the third"},
        {.name = "--delta", .type = CLI_OPT_STRING, .dst = &(const char *){NULL},
         .arg = "FILE", .def_text = "$SOMEWHERE", .help = "the fourth"},
        {0},
    };
    const cli_cmd cmd = {.name = "demo", .opts = opts, .about = "Does a demo."};
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    cr_assert_not_null(f);
    cli_opts_help(&cmd, f);
    fclose(f);
    cr_assert(strstr(text, "usage: moetune demo --gamma [options]\n"), "%s", text);
    cr_assert(strstr(text, "\nDoes a demo.\n"), "%s", text);
    cr_assert(strstr(text, "  --alpha N "), "%s", text);
    cr_assert(strstr(text, "the first (default: 3)"), "%s", text);
    cr_assert(strstr(text, "  -b, --beta "), "%s", text);
    cr_assert(strstr(text, "  --gamma a|b|c "), "%s", text);
    cr_assert(strstr(text, "the third (required)"), "%s", text);
    cr_assert(strstr(text, "(default: $SOMEWHERE)"), "%s", text);
    cr_assert(strstr(text, "  -h, --help "), "%s", text);
    for (char *line = text; *line; line = strchr(line, '\n') + 1)
        cr_assert_leq(strcspn(line, "\n"), 80, "a line past column 80 in:\n%s", text);
    free(text);
}

/* ---- every command of the binary ----------------------------------------- */

static int run(const char *args, char **out)
{
    return test_run_cli("", args, out);
}

#define MAX_CMDS 32

/* The commands `moetune --help` lists, and `db verify`, which reads its own
 * options. */
static int list_commands(char names[][32])
{
    char *out;
    cr_assert_eq(run("--help", &out), 0, "%s", out);
    char *p = strstr(out, "commands:\n");
    cr_assert_not_null(p, "%s", out);
    int n = 0;
    for (p = strchr(p, '\n') + 1; *p == ' ' && n < MAX_CMDS - 1; p = strchr(p, '\n') + 1)
        if (sscanf(p, " %31s", names[n]) == 1)
            n++;
    free(out);
    cr_assert_geq(n, 10, "only %d commands found", n);
    snprintf(names[n++], 32, "db verify");
    return n;
}

/* The source file of a command; a new command needs its line here. */
static const char *source_of(const char *cmd)
{
    static const char *const map[][2] = {
        {"devices", "cmd_devices.c"},   {"kernels", "cmd_kernels.c"},
        {"check", "cmd_check.c"},       {"db", "cmd_db.c"},
        {"db verify", "cmd_db_verify.c"}, {"tune", "cmd_tune.c"},
        {"make-tiny-model", "cmd_make_tiny.c"}, {"isa", "cmd_isa.c"},
        {"plan", "cmd_plan.c"},         {"bench", "cmd_bench.c"},
        {"serve", "cmd_serve.c"},       {"bench-serve", "cmd_bench_serve.c"},
        {"generate", "cmd_generate.c"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i][0], cmd))
            return map[i][1];
    cr_assert_fail("no source file known for command '%s': add it to source_of", cmd);
    return NULL;
}

static bool opt_char(char c)
{
    return islower((unsigned char)c) || isdigit((unsigned char)c) || c == '-';
}

/* Whether text holds opt as a whole word ("--m" is not in "--model"). */
static bool has_word(const char *text, const char *opt)
{
    size_t n = strlen(opt);
    for (const char *p = strstr(text, opt); p; p = strstr(p + 1, opt))
        if ((p == text || !opt_char(p[-1])) && !opt_char(p[n]))
            return true;
    return false;
}

/* Every "--option" inside a string literal of the file (comments and
 * character constants skipped), into opts. */
static int literal_options(const char *path, char opts[][48], int cap)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    static char src[1 << 20];
    size_t len = fread(src, 1, sizeof src - 1, f);
    fclose(f);
    src[len] = 0;
    int n = 0;
    for (const char *p = src; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            const char *e = strstr(p + 2, "*/");
            p = e ? e + 1 : p + strlen(p) - 1;
        } else if (p[0] == '/' && p[1] == '/') {
            p += strcspn(p, "\n");
        } else if (*p == '\'') {
            p += p[1] == '\\' ? 3 : 2;
        } else if (*p == '"') {
            for (p++; *p && *p != '"'; p++) {
                if (*p == '\\') {
                    p++;
                    continue;
                }
                if (p[0] == '-' && p[1] == '-' && islower((unsigned char)p[2]) &&
                    (p == src || !opt_char(p[-1])) && n < cap) {
                    size_t k = 2;
                    while (opt_char(p[k]) && k < 47)
                        k++;
                    snprintf(opts[n++], 48, "%.*s", (int)k, p);
                    p += k - 1;
                }
            }
        }
    }
    return n;
}

/* The long names the command's table holds (`--list-options`). */
static int table_options(const char *cmd, char opts[][48], int cap)
{
    char args[128], *out;
    snprintf(args, sizeof args, "%.31s --list-options", cmd);
    cr_assert_eq(run(args, &out), 0, "%s: %s", args, out);
    int n = 0;
    for (char *t = strtok(out, "\n"); t && n < cap; t = strtok(NULL, "\n")) {
        cr_assert(!strncmp(t, "--", 2), "%s: '%s' is not an option name", args, t);
        snprintf(opts[n++], 48, "%s", t);
    }
    free(out);
    return n;
}

Test(cli_opts_bin, every_command_helps_from_its_one_table, .timeout = 120)
{
    char cmds[MAX_CMDS][32];
    int n_cmds = list_commands(cmds);
    for (int c = 0; c < n_cmds; c++) {
        char args[128], *help, *h2;
        snprintf(args, sizeof args, "%.31s --help", cmds[c]);
        cr_assert_eq(run(args, &help), 0, "%s: %s", args, help);
        char usage[64];
        snprintf(usage, sizeof usage, "usage: moetune %.31s", cmds[c]);
        cr_assert(!strncmp(help, usage, strlen(usage)), "%s:\n%s", args, help);
        snprintf(args, sizeof args, "%.31s -h", cmds[c]);
        cr_assert_eq(run(args, &h2), 0, "%s: %s", args, h2);
        cr_assert_str_eq(help, h2, "%s: -h and --help differ", cmds[c]);
        free(h2);
        /* what the table holds is in the help ... */
        static char opts[128][48];
        int n = table_options(cmds[c], opts, 128);
        cr_assert_gt(n, 0, "%s: an empty table", cmds[c]);
        for (int i = 0; i < n; i++)
            cr_assert(has_word(help, opts[i]), "%s: %s is parsed but not in its help:\n%s",
                      cmds[c], opts[i], help);
        /* ... and every option line of the help is in the table */
        for (char *l = strstr(help, "\noptions:\n"); l && (l = strstr(l + 1, "\n  -"));) {
            char name[48] = "";
            const char *lng = l[4] == '-' ? l + 3 : l + 7; /* after "-x, " */
            sscanf(lng, "%47[a-z0-9-]", name);
            if (!strcmp(name, "--help"))
                continue;
            bool found = false;
            for (int i = 0; i < n && !found; i++)
                found = !strcmp(opts[i], name);
            cr_assert(found, "%s: help lists %s, which its table does not parse", cmds[c],
                      name);
        }
        /* every option the source names is in the help: an option parsed
         * outside the table shows here */
        char path[1024];
        snprintf(path, sizeof path, "%s/cli/%s", MOETUNE_SOURCE_DIR, source_of(cmds[c]));
        int m = literal_options(path, opts, 128);
        cr_assert_gt(m, 0, "%s: no option names found", path);
        for (int i = 0; i < m; i++)
            cr_assert(has_word(help, opts[i]), "%s names %s, which `moetune %s --help` does "
                      "not show:\n%s", path, opts[i], cmds[c], help);
        free(help);
    }
}

Test(cli_opts_bin, every_command_refuses_an_unknown_option_naming_it, .timeout = 120)
{
    char cmds[MAX_CMDS][32];
    int n_cmds = list_commands(cmds);
    for (int c = 0; c < n_cmds; c++) {
        char args[128], *out;
        /* db's options come after its command */
        snprintf(args, sizeof args, "%.31s%s --no-such-option-zz 1", cmds[c],
                 strcmp(cmds[c], "db") ? "" : " show");
        int rc = run(args, &out);
        cr_assert_eq(rc, 2, "%s: exit %d\n%s", args, rc, out);
        cr_assert(strstr(out, "--no-such-option-zz"), "%s: the option is not named:\n%s",
                  args, out);
        cr_assert(strstr(out, "unknown option"), "%s:\n%s", args, out);
        free(out);
    }
}

Test(cli_opts_bin, values_are_checked_before_any_work)
{
    static const char *const bad[][3] = {
        {"tune --family gemm --shape tiny --jobs 0", "--jobs '0'", "[1, 256]"},
        {"tune --family gemm --shape tiny --m 1,x", "--m '1,x'", "comma-separated"},
        {"check --samples 65", "--samples '65'", "[0, 64]"},
        {"serve --model x --port 65536", "--port '65536'", "[0, 65535]"},
        {"plan --model x --kv-dtype fp16", "--kv-dtype 'fp16'", "bf16, fp8"},
        {"bench --family moe --wl 2", "--wl '2'", "0, 1"},
        {"generate --model x --tokens 1 --top-p 2", "--top-p '2'", "[0, 1]"},
        {"db best --m 0", "--m '0'", ">= 1"},
        {"db verify --confidence 1", "--confidence '1'", "(0.5, 1)"},
        {"make-tiny-model --out x --seed", "--seed", "needs a value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out;
        int rc = run(bad[i][0], &out);
        cr_assert_eq(rc, 2, "%s: exit %d\n%s", bad[i][0], rc, out);
        cr_assert(strstr(out, bad[i][1]) && strstr(out, bad[i][2]), "%s:\n%s", bad[i][0], out);
        free(out);
    }
}
