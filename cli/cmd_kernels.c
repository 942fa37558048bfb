/* cmd_kernels.c: `moetune kernels`: the kernel families, their shapes,
 * presets, parameters and the size of each search space. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/family.h"
#include "cli.h"

static cJSON *impl_json(const kern_impl *im)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "source", im->source);
    cJSON_AddNumberToObject(o, "space_size", (double)kern_space_size(im));
    cJSON *ps = cJSON_AddArrayToObject(o, "params");
    for (int i = 0; i < im->n_params; i++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "name", im->params[i].name);
        cJSON_AddItemToObject(p, "values",
                              cJSON_CreateIntArray(im->params[i].values,
                                                   im->params[i].n_values));
        cJSON_AddStringToObject(p, "help", im->params[i].help ? im->params[i].help : "");
        cJSON_AddItemToArray(ps, p);
    }
    return o;
}

static cJSON *family_json(const kern_family *f)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", f->name);
    cJSON_AddNumberToObject(o, "version", f->version);
    cJSON_AddStringToObject(o, "summary", f->summary);
    cJSON *dims = cJSON_AddArrayToObject(o, "dims");
    for (int i = 0; i < f->n_dims; i++) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "name", f->dims[i].name);
        cJSON_AddStringToObject(d, "kind", f->dims[i].kind == KERN_DIM_DTYPE ? "dtype" : "int");
        cJSON_AddBoolToObject(d, "runtime", f->dims[i].runtime);
        cJSON_AddBoolToObject(d, "optional", f->dims[i].kind == KERN_DIM_INT_OPT);
        cJSON_AddItemToArray(dims, d);
    }
    cJSON *pr = cJSON_AddObjectToObject(o, "presets");
    for (int i = 0; i < f->n_presets; i++)
        cJSON_AddStringToObject(pr, f->presets[i].name, f->presets[i].key);
    if (f->gpu)
        cJSON_AddItemToObject(o, "gpu", impl_json(f->gpu));
    if (f->cpu)
        cJSON_AddItemToObject(o, "cpu", impl_json(f->cpu));
    return o;
}

static void print_impl(const char *what, const kern_impl *im)
{
    printf("  %s (%s): %" PRIu64 " configs\n", what, im->source, kern_space_size(im));
    for (int i = 0; i < im->n_params; i++) {
        printf("    %-10s {", im->params[i].name);
        for (int j = 0; j < im->params[i].n_values; j++)
            printf("%s%d", j ? "," : "", im->params[i].values[j]);
        printf("}  %s\n", im->params[i].help ? im->params[i].help : "");
    }
}

static void print_family(const kern_family *f, bool verbose)
{
    printf("%-16s v%d  %s\n", f->name, f->version, f->summary);
    if (!verbose) {
        printf("  space: gpu %" PRIu64 ", cpu %" PRIu64 "; presets:",
               f->gpu ? kern_space_size(f->gpu) : 0, f->cpu ? kern_space_size(f->cpu) : 0);
        for (int i = 0; i < f->n_presets; i++)
            printf(" %s", f->presets[i].name);
        printf("\n");
        return;
    }
    printf("  dims:");
    for (int i = 0; i < f->n_dims; i++)
        printf(" %s%s%s%s", f->dims[i].name, f->dims[i].kind == KERN_DIM_DTYPE ? "(dtype)" : "",
               f->dims[i].kind == KERN_DIM_INT_OPT ? "(optional)" : "",
               f->dims[i].runtime ? "(runtime)" : "");
    printf("\n  presets:\n");
    for (int i = 0; i < f->n_presets; i++)
        printf("    %-14s %s\n", f->presets[i].name, f->presets[i].key);
    if (f->gpu)
        print_impl("gpu", f->gpu);
    if (f->cpu)
        print_impl("cpu", f->cpu);
}

int cmd_kernels(int argc, char **argv)
{
    bool json = false;
    const char *family = NULL;
    const cli_opt opts[] = {
        {.name = "--family", .type = CLI_OPT_STRING, .dst = &family, .arg = "F",
         .help = "this family only, with its dims, presets and every parameter"},
        {.name = "--json", .type = CLI_OPT_FLAG, .dst = &json, .help = "machine-readable output"},
        {0},
    };
    const cli_cmd cmd = {
        .name = "kernels", .usage = "kernels [--family F] [--json]", .opts = opts,
        .about = "Lists kernel families with their parameters and space sizes."};
    int rc = cli_opts_parse(&cmd, argc, argv, 1);
    if (rc)
        return rc == CLI_HELP ? CLI_OK : rc;
    const kern_family *const *all = kern_families();
    if (family && !kern_family_find(family)) {
        cli_error("kernels", "unknown family '%s'", family);
        return CLI_USAGE;
    }
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    for (int i = 0; all[i]; i++) {
        if (family && strcmp(all[i]->name, family))
            continue;
        if (json)
            cJSON_AddItemToArray(arr, family_json(all[i]));
        else
            print_family(all[i], family != NULL);
    }
    if (json) {
        char *s = cJSON_Print(arr);
        puts(s);
        free(s);
        cJSON_Delete(arr);
    }
    return CLI_OK;
}
