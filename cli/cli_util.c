/* cli_util.c: helpers several subcommands share: the error line, the
 * default database, and the option values more than one table takes
 * (--act-quant, --kv-dtype, a tuning budget). */
#include "cli.h"

#include <stdarg.h>
#include <stdlib.h>

#include "kernels/core/family.h"
#include "model/plan/plan.h"
#include "tuner/tuner.h"

void cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "moetune %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

const char *cli_db_default(void)
{
    const char *env = getenv("MOETUNE_DB");
    return env && *env ? env : "moetune.db";
}

bool cli_set_act_quant(void *dst, const char *text, char *err, size_t cap)
{
    if (model_act_quant_parse(text, dst))
        return true;
    snprintf(err, cap, "none, mxfp4 or int8");
    return false;
}

bool cli_set_budget(void *dst, const char *text, char *err, size_t cap)
{
    mt_err e = MT_ERR_INIT;
    if (tune_budget_parse(text, dst, &e) == MT_OK)
        return true;
    snprintf(err, cap, "%s", e.msg);
    return false;
}

const cli_choice cli_kv_dtypes[] = {
    {"bf16", KERN_DT_BF16},
    {"fp8", KERN_DT_FP8E4M3},
    {NULL, 0},
};
