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

typedef struct plan_cli {
    const char *dir;
    mem_plan_opts o;
    int kv_fp8;
    bool json;
} plan_cli;

static int parse(int argc, char **argv, plan_cli *c)
{
    static const cli_choice kv[] = {{"bf16", 0}, {"fp8", 1}, {NULL, 0}};
    const cli_opt opts[] = {
        {.name = "--model", .type = CLI_OPT_STRING, .dst = &c->dir, .arg = "DIR",
         .flags = CLI_OPT_REQUIRED, .help = "the checkpoint; only DIR/config.json is read"},
        {.name = "--ranks", .type = CLI_OPT_INT, .dst = &c->o.ranks, .arg = "N", .def = "1",
         .min = 1, .max = 4096, .help = "devices of the deployment"},
        {.name = "--ep", .type = CLI_OPT_INT, .dst = &c->o.ep, .arg = "N", .min = 1,
         .max = 4096, .def_text = "N of --ranks",
         .help = "ranks the routed experts are split over"},
        {.name = "--tp", .type = CLI_OPT_INT, .dst = &c->o.tp, .arg = "N", .min = 1,
         .max = 4096, .def_text = "attention data-parallel",
         .help = "ranks attention is tensor-parallel over"},
        {.name = "--kv-dtype", .type = CLI_OPT_CHOICE, .dst = &c->kv_fp8, .choices = kv,
         .def = "bf16", .help = "KV cache dtype"},
        {.name = "--max-batch-tokens", .type = CLI_OPT_INT64, .dst = &c->o.max_batch_tokens,
         .arg = "T", .min = 1, .max = 1 << 24, .def_text = "512",
         .help = "tokens of the largest step (its workspace)"},
        {.name = "--mem-util", .type = CLI_OPT_DOUBLE, .dst = &c->o.mem_util, .arg = "F",
         .min = 0, .max = 1, .flags = CLI_OPT_MIN_OPEN, .def_text = "0.90",
         .help = "the fraction of each device's nominal memory usable"},
        {.name = "--json", .type = CLI_OPT_FLAG, .dst = &c->json,
         .help = "machine-readable output"},
        {0},
    };
    const cli_cmd cmd = {
        .name = "plan", .opts = opts,
        .usage = "plan --model DIR [--ranks N] [--ep N] [--tp N]\n"
                 "     [--kv-dtype bf16|fp8] [--max-batch-tokens T] [--mem-util F] [--json]",
        .about = "Reads DIR/config.json (no weights) and prints the memory per rank of a "
                 "deployment over N devices: routed experts expert-parallel over --ep "
                 "ranks, attention data-parallel, or tensor-parallel over --tp ranks, "
                 "embedding and head vocabulary-parallel; the KV cache bytes per token; the "
                 "workspace of a T-token step; and, for MI300X, MI355X and H200 at their "
                 "nominal memory times F, the KV tokens that fit per rank and across the "
                 "deployment."};
    int rc = cli_opts_parse(&cmd, argc, argv, 1);
    c->o.fp8_kv = c->kv_fp8 == 1;
    return rc;
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
    plan_cli c = {0};
    int rc = parse(argc, argv, &c);
    if (rc)
        return rc == CLI_HELP ? CLI_OK : rc;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", c.dir);
    model_config *mc = NULL;
    mt_err err = {0};
    mem_plan p;
    if (model_config_load(path, &mc, &err) != MT_OK ||
        mem_plan_compute(mc, &c.o, &p, &err) != MT_OK) {
        cli_error("plan", "%s", err.msg);
        model_config_destroy(mc);
        return CLI_FAIL;
    }
    if (c.json)
        print_json(&p);
    else
        mem_plan_print(&p, mc, stdout);
    model_config_destroy(mc);
    return CLI_OK;
}
