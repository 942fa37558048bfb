/* cmd_devices.c: `moetune devices`: the devices this build can open here,
 * with their properties. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "cli.h"

static cJSON *props_json(const dev_props *p)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "spec", p->spec);
    cJSON_AddStringToObject(o, "backend", dev_backend_name(p->backend));
    cJSON_AddStringToObject(o, "arch", p->arch);
    cJSON_AddStringToObject(o, "name", p->name);
    cJSON_AddStringToObject(o, "runtime", p->runtime_version);
    cJSON_AddNumberToObject(o, "compute_units", p->compute_units);
    cJSON_AddNumberToObject(o, "warp_size", p->warp_size);
    cJSON_AddNumberToObject(o, "max_threads_per_block", p->max_threads_per_block);
    cJSON_AddNumberToObject(o, "shared_mem_per_block", (double)p->shared_mem_per_block);
    cJSON_AddNumberToObject(o, "llc_bytes", (double)p->llc_bytes);
    cJSON_AddNumberToObject(o, "mem_bytes", (double)p->mem_bytes);
    cJSON_AddBoolToObject(o, "compile_only", p->compile_only);
    if (p->backend == DEV_BACKEND_CPU) {
        cJSON_AddBoolToObject(o, "amx", p->cpu_amx);
        cJSON_AddBoolToObject(o, "page_touch", p->cpu_page_touch);
    }
    cJSON_AddStringToObject(o, "fingerprint", p->fingerprint);
    return o;
}

static void print_props(const dev_props *p)
{
    printf("%-12s %-4s arch=%s  %s\n", p->spec, dev_backend_name(p->backend), p->arch,
           p->name);
    printf("             units=%d warp=%d threads/block=%d shared/block=%zu KiB "
           "llc=%zu KiB mem=%.1f GiB%s%s%s\n",
           p->compute_units, p->warp_size, p->max_threads_per_block,
           p->shared_mem_per_block / 1024, p->llc_bytes / 1024,
           (double)p->mem_bytes / (1024.0 * 1024 * 1024),
           p->compile_only ? " (compile-only)" : "", p->cpu_amx ? " amx" : "",
           p->cpu_page_touch ? " page-touch" : "");
    printf("             runtime: %s\n", p->runtime_version);
}

typedef struct devices_opts {
    const char *spec, *arch;
    bool json;
} devices_opts;

static int parse(int argc, char **argv, devices_opts *o)
{
    const cli_opt opts[] = {
        {.name = "--device", .type = CLI_OPT_STRING, .dst = &o->spec, .arg = "D",
         .help = "show this device only (cpu, emu, emu:wave32, hip, hip:N, cuda)"},
        {.name = "--arch", .type = CLI_OPT_STRING, .dst = &o->arch, .arg = "A",
         .help = "with --device: the GPU arch; compile-only where no such GPU is present"},
        {.name = "--json", .type = CLI_OPT_FLAG, .dst = &o->json,
         .help = "machine-readable output"},
        {0},
    };
    const cli_cmd cmd = {
        .name = "devices", .usage = "devices [--device D [--arch A]] [--json]", .opts = opts,
        .about = "Lists the devices this build can open on this machine, with their "
                 "properties. With --device (and --arch for a compile-only GPU target), "
                 "shows one."};
    return cli_opts_parse(&cmd, argc, argv, 1);
}

/* The GPU targets that compile without a GPU, after the text listing. */
static void print_compile_only_targets(void)
{
    printf("\nAMD targets without a GPU (--device hip --arch A, compile-only):\n"
           "  hipRTC (ROCm 5.2): gfx900 gfx906 gfx908 gfx90a gfx1010 gfx1011 gfx1012 "
           "gfx1030\n"
           "  clang-19:          gfx940 gfx941 gfx942\n"
           "  gfx950 needs LLVM 20 or later (MOETUNE_HIP_CLANG names one); without it "
           "gfx950\n"
           "  kernels are verified on emu and compiled on the device where one is "
           "present.\n");
}

/* Opens each device and prints it (or adds it to arr); the exit code. */
static int show_devices(char (*specs)[32], int n, const devices_opts *o, cJSON *arr)
{
    int rc = CLI_OK;
    for (int i = 0; i < n; i++) {
        dev_device *d = NULL;
        mt_err err = MT_ERR_INIT;
        dev_open_opts oo = {.arch = o->arch};
        mt_status st = dev_open(specs[i], &oo, &d, &err);
        if (st != MT_OK) {
            cli_error("devices", "%s", err.msg);
            rc = st == MT_E_INVALID ? CLI_USAGE : CLI_FAIL;
            continue;
        }
        if (arr)
            cJSON_AddItemToArray(arr, props_json(dev_get_props(d)));
        else
            print_props(dev_get_props(d));
        dev_close(d);
    }
    return rc;
}

int cmd_devices(int argc, char **argv)
{
    devices_opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == CLI_HELP ? CLI_OK : rc;
    char specs[16][32];
    int n;
    if (o.spec) {
        snprintf(specs[0], sizeof specs[0], "%s", o.spec);
        n = 1;
    } else {
        n = dev_list(specs, 16);
        if (n > 16)
            n = 16;
    }
    cJSON *arr = o.json ? cJSON_CreateArray() : NULL;
    rc = show_devices(specs, n, &o, arr);
    if (!o.json && (!o.spec || !strncmp(o.spec, "hip", 3)))
        print_compile_only_targets();
    if (o.json) {
        char *s = cJSON_Print(arr);
        puts(s);
        free(s);
        cJSON_Delete(arr);
    }
    return rc;
}
