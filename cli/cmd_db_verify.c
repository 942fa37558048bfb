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

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moetune db verify [--db FILE] [--device D] [--family F] [--shape KEY]\n"
            "                         [--m M] [--of FINGERPRINT|NAME] [--rounds R]\n"
            "                         [--confidence P] [--json]\n"
            "\n"
            "Re-times each stored winner of this device's backend (tuned on this machine\n"
            "or another) on device D (default auto) against its first runner-up and the\n"
            "family's default config, R paired interleaved rounds each (default 10), and\n"
            "marks it stale in the database when either is faster with confidence P\n"
            "(default 0.95); otherwise it is marked verified. --of keeps the winners of\n"
            "one tuned device. Winners of another backend or kernel source are skipped.\n"
            "Exit status 0 when nothing is stale, 3 when some winner is stale, 1 on error.\n");
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

int cmd_db_verify(int argc, char **argv)
{
    tune_verify_opts o;
    tune_verify_opts_default(&o);
    const char *env = getenv("MOETUNE_DB");
    o.db_path = env && *env ? env : "moetune.db";
    bool json = false, bad = false;
    for (int i = 2; i < argc && !bad; i++) {
        const char *v;
        char *end;
        if ((v = cli_opt(argc, argv, &i, "--db", &bad)))
            o.db_path = v;
        else if ((v = cli_opt(argc, argv, &i, "--device", &bad)))
            o.device = v;
        else if ((v = cli_opt(argc, argv, &i, "--family", &bad)))
            o.filter.family = v;
        else if ((v = cli_opt(argc, argv, &i, "--shape", &bad)))
            o.filter.shape_key = v;
        else if ((v = cli_opt(argc, argv, &i, "--of", &bad)))
            o.filter.device = v;
        else if ((v = cli_opt(argc, argv, &i, "--m", &bad))) {
            o.filter.m = strtoll(v, &end, 10);
            if (*end || o.filter.m < 1) {
                cli_error("db verify", "--m needs a positive integer, got '%s'", v);
                return CLI_USAGE;
            }
        } else if ((v = cli_opt(argc, argv, &i, "--rounds", &bad))) {
            o.rounds = (int)strtol(v, &end, 10);
            if (*end || o.rounds < 2 || o.rounds > TUNE_CONFIRM_MAX_ROUNDS) {
                cli_error("db verify", "--rounds needs 2 to %d, got '%s'",
                          TUNE_CONFIRM_MAX_ROUNDS, v);
                return CLI_USAGE;
            }
        } else if ((v = cli_opt(argc, argv, &i, "--confidence", &bad))) {
            o.confidence = strtod(v, &end);
            if (*end || !(o.confidence > 0.5 && o.confidence < 1)) {
                cli_error("db verify", "--confidence needs a value in (0.5, 1), got '%s'", v);
                return CLI_USAGE;
            }
        } else if (cli_flag(argv[i], "--json"))
            json = true;
        else if (cli_flag(argv[i], "--help") || cli_flag(argv[i], "-h")) {
            usage(stdout);
            return CLI_OK;
        } else {
            cli_error("db verify", "unknown argument '%s'", argv[i]);
            usage(stderr);
            return CLI_USAGE;
        }
    }
    if (bad)
        return CLI_USAGE;
    o.stop = &stop_flag;
    o.log = json ? NULL : stderr;
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    tune_verify_report *rep = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = tune_verify(&o, &rep, &err);
    signal(SIGINT, SIG_DFL);
    if (json && rep) {
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
    } else if (rep) {
        printf("verified on %s (%s): %d still win, %d stale, %d skipped\n", rep->device_spec,
               rep->device_name, rep->verified, rep->stale, rep->skipped);
    }
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
