/* cmd_isa.c: `moetune isa`: compiles one kernel config for a GPU (a real
 * one or compile-only, e.g. --device hip --arch gfx942 with no GPU) and
 * prints what the code object says about its speed: registers, LDS,
 * scratch and occupancy from the compiler, and for AMD the instruction mix
 * of every kernel function and of its hot loop (device/isa_mix.h). */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/hip/isa_mix.h"
#include "kernels/core/exec.h"
#include "kernels/core/family.h"
#include "cli.h"

typedef struct isa_opts {
    const char *device, *arch, *family, *shape, *config;
    long long m;
    bool json;
} isa_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moetune isa --family F [--shape KEY] [--m M] [--config CFG]\n"
            "                   [--device hip] [--arch gfx942] [--json]\n"
            "Compiles family F at shape KEY (a preset or key; default: its first preset)\n"
            "for M rows (default 1) with config CFG (\"BM=64,BN=64,...\" or JSON; default:\n"
            "the family's default for that M on the device) and prints, per kernel\n"
            "function, VGPRs/AGPRs/SGPRs, LDS, scratch, spills and occupancy, and on AMD\n"
            "the instruction mix (matrix, VALU, SALU, global and LDS loads and stores,\n"
            "waits, barriers) of the whole function and of its hot loop (the innermost\n"
            "loop with the most matrix instructions, else the largest). Without a GPU\n"
            "--arch makes the device compile-only (gfx90a/gfx908/gfx1030 through hipRTC,\n"
            "gfx940-942 through clang-19; sm_XX with --device cuda, resources only).\n");
}

static int parse(int argc, char **argv, isa_opts *o)
{
    bool bad = false;
    const char *v;
    o->device = "hip";
    o->m = 1;
    for (int i = 1; i < argc && !bad; i++) {
        if (cli_flag(argv[i], "--help") || cli_flag(argv[i], "-h")) {
            usage(stdout);
            return -1;
        } else if (cli_flag(argv[i], "--json")) {
            o->json = true;
        } else if ((v = cli_opt(argc, argv, &i, "--device", &bad))) {
            o->device = v;
        } else if ((v = cli_opt(argc, argv, &i, "--arch", &bad))) {
            o->arch = v;
        } else if ((v = cli_opt(argc, argv, &i, "--family", &bad))) {
            o->family = v;
        } else if ((v = cli_opt(argc, argv, &i, "--shape", &bad))) {
            o->shape = v;
        } else if ((v = cli_opt(argc, argv, &i, "--config", &bad))) {
            o->config = v;
        } else if ((v = cli_opt(argc, argv, &i, "--m", &bad))) {
            char *end;
            o->m = strtoll(v, &end, 10);
            if (*end || o->m < 1 || o->m > (1LL << 24)) {
                cli_error("isa", "--m '%s' must be an integer in [1, 16777216]", v);
                bad = true;
            }
        } else if (!bad) {
            cli_error("isa", "unknown option '%s'", argv[i]);
            bad = true;
        }
    }
    if (!bad && !o->family) {
        cli_error("isa", "--family F is required");
        bad = true;
    }
    if (bad) {
        usage(stderr);
        return CLI_USAGE;
    }
    return 0;
}

static cJSON *counts_json(const dev_isa_counts *c)
{
    cJSON *o = cJSON_CreateObject();
    for (int k = 0; k < DEV_ISA_N_CLASSES; k++)
        cJSON_AddNumberToObject(o, dev_isa_class_name((dev_isa_class)k), c->n[k]);
    cJSON_AddNumberToObject(o, "total", c->total);
    return o;
}

static void counts_row(const char *label, const dev_isa_counts *c)
{
    printf("  %-22s %5d", label, c->total);
    for (int k = 0; k < DEV_ISA_N_CLASSES; k++)
        printf(" %6d", c->n[k]);
    printf("\n");
}

static void counts_header(void)
{
    printf("  %-22s %5s", "", "total");
    static const char *const shortn[DEV_ISA_N_CLASSES] = {
        "mfma", "valu", "salu", "smem", "g.ld", "g.st", "atom", "lds.r", "lds.w",
        "lds.o", "scr", "wait", "bar", "br", "other"};
    for (int k = 0; k < DEV_ISA_N_CLASSES; k++)
        printf(" %6s", shortn[k]);
    printf("\n");
}

/* Blocks per CU the static LDS allows (64 KiB per CU on CDNA2/3), -1 when
 * the kernel uses none. */
static long lds_blocks(const dev_kernel_res *r)
{
    return r->lds_bytes > 0 ? (long)(65536 / r->lds_bytes) : -1;
}

int cmd_isa(int argc, char **argv)
{
    isa_opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc < 0 ? CLI_OK : rc;
    const kern_family *f = kern_family_find(o.family);
    if (!f) {
        cli_error("isa", "unknown family '%s' (moetune kernels lists them)", o.family);
        return CLI_USAGE;
    }
    mt_err err = MT_ERR_INIT;
    dev_open_opts oo = {.arch = o.arch};
    dev_device *d = NULL;
    if (dev_open(o.device, &oo, &d, &err) != MT_OK) {
        cli_error("isa", "%s", err.msg);
        return CLI_FAIL;
    }
    const dev_props *p = dev_get_props(d);
    const kern_impl *im = kern_family_impl(f, p->backend);
    kern_shape s;
    int64_t m = o.m;
    kern_config c;
    dev_code *code = NULL;
    dev_isa_report rep;
    bool have_mix = false;
    char why[256] = "", ckey[256] = "", skey[KERN_KEY_MAX] = "";
    rc = CLI_FAIL;
    if (!im) {
        cli_error("isa", "family %s has no implementation for %s", f->name, p->spec);
        goto out;
    }
    if (kern_shape_parse(f, o.shape ? o.shape : f->presets[0].name, &s, NULL, &err) != MT_OK) {
        cli_error("isa", "%s", err.msg);
        goto out;
    }
    if (o.config) {
        if (kern_config_parse(im, o.config, &c, &err) != MT_OK) {
            cli_error("isa", "%s", err.msg);
            goto out;
        }
    } else {
        im->default_config(&s, m, p, &c);
    }
    if (!kern_config_valid(f, im, &s, m, &c, p, why, sizeof why)) {
        cli_error("isa", "config not valid for %s at M=%lld on %s: %s", f->name, o.m, p->spec,
                  why);
        goto out;
    }
    kern_config_key(im, &c, ckey, sizeof ckey);
    kern_shape_key(f, &s, true, skey, sizeof skey);
    if (kern_compile(d, f, im, &s, &c, &code, &err) != MT_OK) {
        cli_error("isa", "%s", err.msg);
        goto out;
    }
    const dev_code_info *info = dev_code_get_info(code);
    size_t len = 0;
    const void *bytes = dev_code_get_bytes(code, &len);
    mt_err merr = MT_ERR_INIT;
    have_mix = p->backend == DEV_BACKEND_HIP &&
               dev_isa_mix(bytes, len, p->arch, &rep, &merr) == MT_OK;
    if (p->backend == DEV_BACKEND_HIP && !have_mix && !o.json)
        fprintf(stderr, "moetune isa: %s\n", merr.msg);
    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "family", f->name);
        cJSON_AddStringToObject(j, "shape", skey);
        cJSON_AddNumberToObject(j, "m", (double)m);
        cJSON_AddStringToObject(j, "config", ckey);
        cJSON_AddStringToObject(j, "device", p->spec);
        cJSON_AddStringToObject(j, "arch", p->arch);
        if (!have_mix)
            cJSON_AddStringToObject(j, "mix_unavailable",
                                    p->backend == DEV_BACKEND_HIP ? merr.msg
                                                                  : "not an AMD code object");
        cJSON *ks = cJSON_AddArrayToObject(j, "kernels");
        for (int i = 0; i < info->n_kernels; i++) {
            const dev_kernel_res *r = &info->kernels[i];
            cJSON *k = cJSON_CreateObject();
            cJSON_AddStringToObject(k, "name", r->name);
            cJSON_AddNumberToObject(k, "vgprs", r->vgprs);
            cJSON_AddNumberToObject(k, "agprs", r->agprs);
            cJSON_AddNumberToObject(k, "sgprs", r->sgprs);
            cJSON_AddNumberToObject(k, "spill_vgprs", r->spill_vgprs);
            cJSON_AddNumberToObject(k, "spill_sgprs", r->spill_sgprs);
            cJSON_AddNumberToObject(k, "lds_bytes", (double)r->lds_bytes);
            cJSON_AddNumberToObject(k, "scratch_bytes", (double)r->private_bytes);
            cJSON_AddNumberToObject(k, "waves_per_simd", r->waves_per_simd);
            cJSON_AddNumberToObject(k, "lds_blocks_per_cu", (double)lds_blocks(r));
            const dev_isa_func *fn = have_mix ? dev_isa_find(&rep, r->name) : NULL;
            if (fn) {
                cJSON_AddItemToObject(k, "all", counts_json(&fn->all));
                cJSON_AddNumberToObject(k, "loops", fn->n_loops);
                if (fn->hot >= 0) {
                    cJSON *h = counts_json(&fn->loops[fn->hot].c);
                    cJSON_AddNumberToObject(h, "depth", fn->loops[fn->hot].depth);
                    cJSON_AddItemToObject(k, "hot_loop", h);
                }
            }
            cJSON_AddItemToArray(ks, k);
        }
        char *t = cJSON_Print(j);
        printf("%s\n", t);
        free(t);
        cJSON_Delete(j);
    } else {
        printf("%s %s M=%lld on %s (%s)\nconfig %s\n", f->name, skey, o.m, p->spec, p->arch,
               ckey);
        for (int i = 0; i < info->n_kernels; i++) {
            const dev_kernel_res *r = &info->kernels[i];
            printf("\n%s: vgpr %d, agpr %d, sgpr %d, spills %d/%d, LDS %" PRId64
                   " B, scratch %" PRId64 " B/lane, waves/SIMD by registers %d",
                   r->name, r->vgprs, r->agprs, r->sgprs, r->spill_vgprs, r->spill_sgprs,
                   r->lds_bytes, r->private_bytes, r->waves_per_simd);
            if (lds_blocks(r) >= 0)
                printf(", blocks/CU by LDS %ld", lds_blocks(r));
            printf("\n");
            const dev_isa_func *fn = have_mix ? dev_isa_find(&rep, r->name) : NULL;
            if (!fn)
                continue;
            counts_header();
            counts_row("whole function", &fn->all);
            if (fn->hot >= 0) {
                char label[48];
                snprintf(label, sizeof label, "hot loop (depth %d)", fn->loops[fn->hot].depth);
                counts_row(label, &fn->loops[fn->hot].c);
            }
            printf("  %d loop%s\n", fn->n_loops, fn->n_loops == 1 ? "" : "s");
        }
    }
    rc = CLI_OK;
out:
    dev_code_free(code);
    dev_close(d);
    return rc;
}
