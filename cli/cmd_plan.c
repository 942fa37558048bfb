/* cmd_plan.c: `moetune plan`: the memory each rank of a multi-device
 * deployment needs for a checkpoint, from its config.json alone: weights per
 * part, KV cache bytes per token, a step's workspace, and for MI300X, MI355X
 * and H200 how many tokens of context fit (model/mem_plan.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/format/config.h"
#include "model/plan/mem_plan.h"
#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moetune plan --model DIR [--ranks N] [--ep N] [--tp N]\n"
            "                    [--kv-dtype bf16|fp8] [--max-batch-tokens T]\n"
            "                    [--mem-util F] [--json]\n"
            "Reads DIR/config.json (no weights) and prints the memory per rank of a\n"
            "deployment over N devices (default 1): routed experts expert-parallel over\n"
            "--ep ranks (default N), attention data-parallel, or tensor-parallel over\n"
            "--tp ranks, embedding and head vocabulary-parallel; the KV cache bytes per\n"
            "token; the workspace of a T-token step (default 512); and, for MI300X,\n"
            "MI355X and H200 at their nominal memory times F (default 0.90), the KV\n"
            "tokens that fit per rank and across the deployment.\n");
}

static bool parse_int(const char *opt, const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    long long x = strtoll(v, &end, 10);
    if (*v == '\0' || *end || x < lo || x > hi) {
        cli_error("plan", "%s '%s': must be an integer in [%lld, %lld]", opt, v, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

static void print_json(const mem_plan *p)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "ranks", p->o.ranks);
    cJSON_AddNumberToObject(o, "ep", p->o.ep);
    cJSON_AddNumberToObject(o, "tp", p->o.tp);
    cJSON_AddNumberToObject(o, "experts_per_rank", (double)p->experts_per_rank);
    cJSON *w = cJSON_AddObjectToObject(o, "weights_bytes");
    for (int i = 0; i < MEM_PART_COUNT; i++)
        cJSON_AddNumberToObject(w, mem_part_name((mem_part)i), p->part[i]);
    cJSON_AddNumberToObject(w, "total", p->weights);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", p->kv_per_token);
    cJSON_AddNumberToObject(o, "workspace_bytes", p->workspace);
    cJSON *devs = cJSON_AddArrayToObject(o, "devices");
    for (int i = 0; i < mem_plan_device_count(); i++) {
        mem_fit f = mem_plan_fit(p, mem_plan_device_name(i), mem_plan_device_hbm(i));
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "device", f.device);
        cJSON_AddNumberToObject(d, "hbm_bytes", f.hbm);
        cJSON_AddNumberToObject(d, "usable_bytes", f.usable);
        cJSON_AddNumberToObject(d, "kv_bytes", f.kv_bytes);
        cJSON_AddBoolToObject(d, "fits", f.kv_bytes > 0);
        cJSON_AddNumberToObject(d, "kv_tokens_per_rank", (double)f.kv_tokens);
        cJSON_AddNumberToObject(d, "kv_tokens_total", (double)f.kv_tokens_total);
        cJSON_AddItemToArray(devs, d);
    }
    char *s = cJSON_Print(o);
    if (s)
        printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
}

int cmd_plan(int argc, char **argv)
{
    const char *dir = NULL;
    mem_plan_opts o = {.ranks = 1};
    bool json = false, bad = false;
    long long x = 0;
    const char *v;
    for (int i = 1; i < argc && !bad; i++) {
        if (cli_flag(argv[i], "--help") || cli_flag(argv[i], "-h")) {
            usage(stdout);
            return CLI_OK;
        } else if (cli_flag(argv[i], "--json")) {
            json = true;
        } else if ((v = cli_opt(argc, argv, &i, "--model", &bad))) {
            dir = v;
        } else if ((v = cli_opt(argc, argv, &i, "--ranks", &bad))) {
            bad = !parse_int("--ranks", v, 1, 4096, &x);
            o.ranks = (int)x;
        } else if ((v = cli_opt(argc, argv, &i, "--ep", &bad))) {
            bad = !parse_int("--ep", v, 1, 4096, &x);
            o.ep = (int)x;
        } else if ((v = cli_opt(argc, argv, &i, "--tp", &bad))) {
            bad = !parse_int("--tp", v, 1, 4096, &x);
            o.tp = (int)x;
        } else if ((v = cli_opt(argc, argv, &i, "--max-batch-tokens", &bad))) {
            bad = !parse_int("--max-batch-tokens", v, 1, 1LL << 24, &x);
            o.max_batch_tokens = x;
        } else if ((v = cli_opt(argc, argv, &i, "--mem-util", &bad))) {
            char *end;
            o.mem_util = strtod(v, &end);
            if (*v == '\0' || *end || !(o.mem_util > 0 && o.mem_util <= 1)) {
                cli_error("plan", "--mem-util '%s': must be a number in (0, 1]", v);
                bad = true;
            }
        } else if ((v = cli_opt(argc, argv, &i, "--kv-dtype", &bad))) {
            if (!strcmp(v, "fp8"))
                o.fp8_kv = true;
            else if (strcmp(v, "bf16")) {
                cli_error("plan", "--kv-dtype '%s': bf16 or fp8", v);
                bad = true;
            }
        } else if (!bad) {
            cli_error("plan", "unknown option '%s'", argv[i]);
            bad = true;
        }
    }
    if (!bad && !dir) {
        cli_error("plan", "--model DIR is required");
        bad = true;
    }
    if (bad) {
        usage(stderr);
        return CLI_USAGE;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    model_config *c = NULL;
    mt_err err = {0};
    mem_plan p;
    if (model_config_load(path, &c, &err) != MT_OK ||
        mem_plan_compute(c, &o, &p, &err) != MT_OK) {
        cli_error("plan", "%s", err.msg);
        model_config_destroy(c);
        return CLI_FAIL;
    }
    if (json)
        print_json(&p);
    else
        mem_plan_print(&p, c, stdout);
    model_config_destroy(c);
    return CLI_OK;
}
