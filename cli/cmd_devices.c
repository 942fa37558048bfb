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

int cmd_devices(int argc, char **argv)
{
    bool json = false, bad = false;
    const char *spec = NULL, *arch = NULL, *v;
    for (int i = 1; i < argc; i++) {
        if (cli_flag(argv[i], "--json"))
            json = true;
        else if ((v = cli_opt(argc, argv, &i, "--device", &bad)))
            spec = v;
        else if ((v = cli_opt(argc, argv, &i, "--arch", &bad)))
            arch = v;
        else if (cli_flag(argv[i], "--help")) {
            printf("usage: moetune devices [--device D [--arch A]] [--json]\n"
                   "Lists the devices this build can open on this machine.\n"
                   "With --device (and --arch for a compile-only GPU target), shows one.\n");
            return CLI_OK;
        } else {
            cli_error("devices", "unknown option '%s'", argv[i]);
            return CLI_USAGE;
        }
        if (bad)
            return CLI_USAGE;
    }
    char specs[16][32];
    int n;
    if (spec) {
        snprintf(specs[0], sizeof specs[0], "%s", spec);
        n = 1;
    } else {
        n = dev_list(specs, 16);
        if (n > 16)
            n = 16;
    }
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    int rc = CLI_OK;
    for (int i = 0; i < n; i++) {
        dev_device *d = NULL;
        mt_err err = MT_ERR_INIT;
        dev_open_opts o = {.arch = arch};
        mt_status st = dev_open(specs[i], &o, &d, &err);
        if (st != MT_OK) {
            cli_error("devices", "%s", err.msg);
            rc = st == MT_E_INVALID ? CLI_USAGE : CLI_FAIL;
            continue;
        }
        if (json)
            cJSON_AddItemToArray(arr, props_json(dev_get_props(d)));
        else
            print_props(dev_get_props(d));
        dev_close(d);
    }
    if (!json && (!spec || !strncmp(spec, "hip", 3)))
        printf("\nAMD targets without a GPU (--device hip --arch A, compile-only):\n"
               "  hipRTC (ROCm 5.2): gfx900 gfx906 gfx908 gfx90a gfx1010 gfx1011 gfx1012 "
               "gfx1030\n"
               "  clang-19:          gfx940 gfx941 gfx942\n"
               "  gfx950 needs LLVM 20 or later (MOETUNE_HIP_CLANG names one); without it "
               "gfx950\n"
               "  kernels are verified on emu and compiled on the device where one is "
               "present.\n");
    if (json) {
        char *s = cJSON_Print(arr);
        puts(s);
        free(s);
        cJSON_Delete(arr);
    }
    return rc;
}
