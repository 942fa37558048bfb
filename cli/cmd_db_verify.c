/* cmd_db_verify.c: `moetune db verify`: re-time the stored winners on this
 * device against their runner-up and the default (paired rounds) and mark
 * those that no longer win as stale (tuner/tune_verify.h). Thin: parses
 * options, calls tune_verify, prints a table or (--json) JSON. */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tuner/tune_verify.h"
#include "cli.h"

static volatile sig_atomic_t stop_flag;

static void on_sigint(int sig)
{
    (void)sig;
    stop_flag = 1;
    signal(SIGINT, SIG_DFL);
}

static int parse(int argc, char **argv, tune_verify_opts *o, bool *json)
{
    o->db_path = cli_db_default();
    const cli_opt opts[] = {
        {.name = "--db", .type = CLI_OPT_STRING, .dst = &o->db_path, .arg = "FILE",
         .def_text = CLI_DB_DEFAULT_TEXT, .help = "the database (its winners are marked)"},
        {.name = "--device", .type = CLI_OPT_STRING, .dst = &o->device, .arg = "D",
         .def = "auto", .help = "the device to re-time on"},
        {.name = "--family", .type = CLI_OPT_STRING, .dst = &o->filter.family, .arg = "F",
         .help = "winners of this kernel family only"},
        {.name = "--shape", .type = CLI_OPT_STRING, .dst = &o->filter.shape_key, .arg = "KEY",
         .help = "winners of this shape only"},
        {.name = "--m", .type = CLI_OPT_INT64, .dst = &o->filter.m, .arg = "M", .min = 1,
         .max = HUGE_VAL, .help = "winners of this M only"},
        {.name = "--of", .type = CLI_OPT_STRING, .dst = &o->filter.device,
         .arg = "FINGERPRINT|NAME", .help = "the winners of one tuned device only"},
        {.name = "--rounds", .type = CLI_OPT_INT, .dst = &o->rounds, .arg = "R", .def = "10",
         .min = 2, .max = TUNE_CONFIRM_MAX_ROUNDS, .help = "paired interleaved rounds per "
         "comparison"},
        {.name = "--confidence", .type = CLI_OPT_DOUBLE, .dst = &o->confidence, .arg = "P",
         .def = "0.95", .min = 0.5, .max = 1, .flags = CLI_OPT_MIN_OPEN | CLI_OPT_MAX_OPEN,
         .help = "confidence of a stale verdict"},
        {.name = "--margin", .type = CLI_OPT_DOUBLE, .dst = &o->margin, .arg = "F",
         .def = "0.01", .min = 0, .max = 1, .flags = CLI_OPT_MAX_OPEN,
         .help = "stale only when the other config is faster by more than this share "
                 "(0.01: 1%), with confidence; near-equal configs swing by a few tenths of a "
                 "percent from one process to the next"},
        {.name = "--json", .type = CLI_OPT_FLAG, .dst = json, .help = "machine-readable output"},
        {0},
    };
    const cli_cmd cmd = {
        .name = "db verify", .opts = opts,
        .usage = "db verify [--db FILE] [--device D] [--family F] [--shape KEY]\n"
                 "          [--m M] [--of FINGERPRINT|NAME] [--rounds R]\n"
                 "          [--confidence P] [--margin F] [--json]",
        .about = "Re-times each stored winner of this device's backend (tuned on this "
                 "machine or another) on device D against its first runner-up and the "
                 "family's default config, R paired interleaved rounds each, and marks it "
                 "stale in the database when either is faster by more than the margin with "
                 "confidence P; otherwise "
                 "it is marked verified. Winners of another backend or kernel source are "
                 "skipped. Exit status 0 when nothing is stale, 3 when some winner is stale, "
                 "1 on error."};
    return cli_opts_parse(&cmd, argc, argv, 2);
}

static cJSON *row_json(const tune_verify_row *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "tuned_on", r->device_name);
    cJSON_AddStringToObject(o, "family", r->family);
    cJSON_AddStringToObject(o, "shape", r->shape_key);
    cJSON_AddNumberToObject(o, "m", (double)r->m);
    cJSON_AddStringToObject(o, "winner", r->winner);
    cJSON_AddStringToObject(o, "outcome", r->skipped ? "skipped" : r->stale ? "stale" : "wins");
    if (!r->skipped)
        cJSON_AddNumberToObject(o, "winner_ms", r->winner_ms);
    static const char *const what[TUNE_VS_COUNT] = {"runner_up", "default"};
    for (int k = 0; k < TUNE_VS_COUNT; k++) {
        if (!r->vs[k][0] || r->iv[k].rounds == 0)
            continue;
        cJSON *c = cJSON_AddObjectToObject(o, what[k]);
        cJSON_AddStringToObject(c, "config", r->vs[k]);
        cJSON_AddNumberToObject(c, "ratio", r->iv[k].ratio);
        cJSON_AddNumberToObject(c, "ratio_lo", r->iv[k].lo);
        cJSON_AddNumberToObject(c, "ratio_hi", r->iv[k].hi);
        cJSON_AddNumberToObject(c, "rounds", r->iv[k].rounds);
    }
    if (r->note[0])
        cJSON_AddStringToObject(o, "note", r->note);
    return o;
}

static void print_json(const tune_verify_report *rep)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "device", rep->device_spec);
    cJSON_AddStringToObject(j, "device_name", rep->device_name);
    cJSON_AddNumberToObject(j, "verified", rep->verified);
    cJSON_AddNumberToObject(j, "stale", rep->stale);
    cJSON_AddNumberToObject(j, "skipped", rep->skipped);
    cJSON *a = cJSON_AddArrayToObject(j, "winners");
    for (int i = 0; i < rep->n; i++)
        cJSON_AddItemToArray(a, row_json(&rep->rows[i]));
    char *s = cJSON_Print(j);
    if (s)
        puts(s);
    free(s);
    cJSON_Delete(j);
}

int cmd_db_verify(int argc, char **argv)
{
    tune_verify_opts o;
    tune_verify_opts_default(&o);
    bool json = false;
    int rc = parse(argc, argv, &o, &json);
    if (rc)
        return rc == CLI_HELP ? CLI_OK : rc;
    o.stop = &stop_flag;
    o.log = json ? NULL : stderr;
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    tune_verify_report *rep = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = tune_verify(&o, &rep, &err);
    signal(SIGINT, SIG_DFL);
    if (json && rep)
        print_json(rep);
    else if (rep)
        printf("verified on %s (%s): %d still win, %d stale, %d skipped\n", rep->device_spec,
               rep->device_name, rep->verified, rep->stale, rep->skipped);
    int stale = rep ? rep->stale : 0;
    tune_verify_report_free(rep);
    if (st == MT_E_INTERRUPTED) {
        cli_error("db verify", "interrupted; the winners re-timed so far are recorded");
        return 130;
    }
    if (st != MT_OK) {
        cli_error("db verify", "%s", err.msg);
        return CLI_FAIL;
    }
    return stale ? 3 : CLI_OK;
}
