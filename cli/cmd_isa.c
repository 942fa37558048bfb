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
    int64_t m;
    bool json;
} isa_opts;

static int parse(int argc, char **argv, isa_opts *o)
{
    const cli_opt opts[] = {
        {.name = "--family", .type = CLI_OPT_STRING, .dst = &o->family, .arg = "F",
         .flags = CLI_OPT_REQUIRED, .help = "kernel family (moetune kernels lists them)"},
        {.name = "--shape", .type = CLI_OPT_STRING, .dst = &o->shape, .arg = "KEY",
         .def_text = "the family's first preset", .help = "a preset or shape key"},
        {.name = "--m", .type = CLI_OPT_INT64, .dst = &o->m, .arg = "M", .def = "1", .min = 1,
         .max = 1 << 24, .help = "rows"},
        {.name = "--config", .type = CLI_OPT_STRING, .dst = &o->config, .arg = "CFG",
         .def_text = "the family's default for that M on the device",
         .help = "\"BM=64,BN=64,...\" or JSON"},
        {.name = "--device", .type = CLI_OPT_STRING, .dst = &o->device, .arg = "D",
         .def = "hip", .help = "hip, hip:N or cuda"},
        {.name = "--arch", .type = CLI_OPT_STRING, .dst = &o->arch, .arg = "A",
         .help = "GPU arch; without such a GPU the device is compile-only (gfx90a/gfx908/"
                 "gfx1030 through hipRTC, gfx940-942 through clang-19; sm_XX with --device "
                 "cuda, resources only)"},
        {.name = "--json", .type = CLI_OPT_FLAG, .dst = &o->json,
         .help = "machine-readable output"},
        {0},
    };
    const cli_cmd cmd = {
        .name = "isa", .opts = opts,
        .usage = "isa --family F [--shape KEY] [--m M] [--config CFG]\n"
                 "    [--device hip] [--arch gfx942] [--json]",
        .about = "Compiles family F at shape KEY for M rows with config CFG and prints, per "
                 "kernel function, VGPRs/AGPRs/SGPRs, LDS, scratch, spills and occupancy, "
                 "and on AMD the instruction mix (matrix, VALU, SALU, global and LDS loads "
                 "and stores, waits, barriers) of the whole function and of its hot loop "
                 "(the innermost loop with the most matrix instructions, else the largest)."};
    return cli_opts_parse(&cmd, argc, argv, 1);
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

/* What cmd_isa compiled and what it found in the code object. */
typedef struct isa_run {
    const kern_family *f;
    const dev_props *p;
    char ckey[256], skey[KERN_KEY_MAX];
    dev_code *code;
    dev_isa_report rep;
    bool have_mix;
    mt_err merr; /* why there is no mix, on hip */
} isa_run;

/* Parses the shape and config (or takes the default), checks the config
 * and compiles it into r->code; false after saying why. */
static bool isa_compile(dev_device *d, const isa_opts *o, isa_run *r)
{
    const kern_impl *im = kern_family_impl(r->f, r->p->backend);
    kern_shape s;
    kern_config c;
    mt_err err = MT_ERR_INIT;
    char why[256] = "";
    if (!im) {
        cli_error("isa", "family %s has no implementation for %s", r->f->name, r->p->spec);
        return false;
    }
    const char *shape = o->shape ? o->shape : r->f->presets[0].name;
    if (kern_shape_parse(r->f, shape, &s, NULL, &err) != MT_OK ||
        (o->config && kern_config_parse(im, o->config, &c, &err) != MT_OK)) {
        cli_error("isa", "%s", err.msg);
        return false;
    }
    if (!o->config)
        im->default_config(&s, o->m, r->p, &c);
    if (!kern_config_valid(r->f, im, &s, o->m, &c, r->p, why, sizeof why)) {
        cli_error("isa", "config not valid for %s at M=%lld on %s: %s", r->f->name,
                  (long long)o->m, r->p->spec, why);
        return false;
    }
    kern_config_key(im, &c, r->ckey, sizeof r->ckey);
    kern_shape_key(r->f, &s, true, r->skey, sizeof r->skey);
    if (kern_compile(d, r->f, im, &s, &c, &r->code, &err) != MT_OK) {
        cli_error("isa", "%s", err.msg);
        return false;
    }
    return true;
}

static cJSON *kernel_json(const isa_run *r, const dev_kernel_res *k)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", k->name);
    cJSON_AddNumberToObject(o, "vgprs", k->vgprs);
    cJSON_AddNumberToObject(o, "agprs", k->agprs);
    cJSON_AddNumberToObject(o, "sgprs", k->sgprs);
    cJSON_AddNumberToObject(o, "spill_vgprs", k->spill_vgprs);
    cJSON_AddNumberToObject(o, "spill_sgprs", k->spill_sgprs);
    cJSON_AddNumberToObject(o, "lds_bytes", (double)k->lds_bytes);
    cJSON_AddNumberToObject(o, "scratch_bytes", (double)k->private_bytes);
    cJSON_AddNumberToObject(o, "waves_per_simd", k->waves_per_simd);
    cJSON_AddNumberToObject(o, "lds_blocks_per_cu", (double)lds_blocks(k));
    const dev_isa_func *fn = r->have_mix ? dev_isa_find(&r->rep, k->name) : NULL;
    if (fn) {
        cJSON_AddItemToObject(o, "all", counts_json(&fn->all));
        cJSON_AddNumberToObject(o, "loops", fn->n_loops);
        if (fn->hot >= 0) {
            cJSON *h = counts_json(&fn->loops[fn->hot].c);
            cJSON_AddNumberToObject(h, "depth", fn->loops[fn->hot].depth);
            cJSON_AddNumberToObject(h, "vmcnt0_before_mfma", fn->loops[fn->hot].vm0_before_mma);
            cJSON_AddItemToObject(o, "hot_loop", h);
        }
    }
    return o;
}

static void print_json(const isa_run *r, int64_t m)
{
    const dev_code_info *info = dev_code_get_info(r->code);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "family", r->f->name);
    cJSON_AddStringToObject(j, "shape", r->skey);
    cJSON_AddNumberToObject(j, "m", (double)m);
    cJSON_AddStringToObject(j, "config", r->ckey);
    cJSON_AddStringToObject(j, "device", r->p->spec);
    cJSON_AddStringToObject(j, "arch", r->p->arch);
    if (!r->have_mix)
        cJSON_AddStringToObject(j, "mix_unavailable", r->p->backend == DEV_BACKEND_HIP
                                                          ? r->merr.msg
                                                          : "not an AMD code object");
    cJSON *ks = cJSON_AddArrayToObject(j, "kernels");
    for (int i = 0; i < info->n_kernels; i++)
        cJSON_AddItemToArray(ks, kernel_json(r, &info->kernels[i]));
    char *t = cJSON_Print(j);
    printf("%s\n", t);
    free(t);
    cJSON_Delete(j);
}

static void print_kernel(const isa_run *r, const dev_kernel_res *k)
{
    printf("\n%s: vgpr %d, agpr %d, sgpr %d, spills %d/%d, LDS %" PRId64
           " B, scratch %" PRId64 " B/lane, waves/SIMD by registers %d",
           k->name, k->vgprs, k->agprs, k->sgprs, k->spill_vgprs, k->spill_sgprs,
           k->lds_bytes, k->private_bytes, k->waves_per_simd);
    if (lds_blocks(k) >= 0)
        printf(", blocks/CU by LDS %ld", lds_blocks(k));
    printf("\n");
    const dev_isa_func *fn = r->have_mix ? dev_isa_find(&r->rep, k->name) : NULL;
    if (!fn)
        return;
    counts_header();
    counts_row("whole function", &fn->all);
    if (fn->hot >= 0) {
        char label[48];
        snprintf(label, sizeof label, "hot loop (depth %d)", fn->loops[fn->hot].depth);
        counts_row(label, &fn->loops[fn->hot].c);
    }
    printf("  %d loop%s", fn->n_loops, fn->n_loops == 1 ? "" : "s");
    if (fn->hot >= 0 && fn->loops[fn->hot].c.n[DEV_ISA_MFMA])
        printf("; hot loop: %.2f VALU per matrix instruction, %d vmcnt(0) ahead of the first",
               (double)fn->loops[fn->hot].c.n[DEV_ISA_VALU] / fn->loops[fn->hot].c.n[DEV_ISA_MFMA],
               fn->loops[fn->hot].vm0_before_mma);
    printf("\n");
}

static void print_text(const isa_run *r, int64_t m)
{
    const dev_code_info *info = dev_code_get_info(r->code);
    printf("%s %s M=%lld on %s (%s)\nconfig %s\n", r->f->name, r->skey, (long long)m,
           r->p->spec, r->p->arch, r->ckey);
    for (int i = 0; i < info->n_kernels; i++)
        print_kernel(r, &info->kernels[i]);
}

/* The instruction mix of an AMD code object; on hip, why there is none
 * goes to stderr for the text output. */
static void find_mix(isa_run *r, bool json)
{
    size_t len = 0;
    const void *bytes = dev_code_get_bytes(r->code, &len);
    r->merr = (mt_err)MT_ERR_INIT;
    r->have_mix = r->p->backend == DEV_BACKEND_HIP &&
                  dev_isa_mix(bytes, len, r->p->arch, &r->rep, &r->merr) == MT_OK;
    if (r->p->backend == DEV_BACKEND_HIP && !r->have_mix && !json)
        fprintf(stderr, "moetune isa: %s\n", r->merr.msg);
}

int cmd_isa(int argc, char **argv)
{
    isa_opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == CLI_HELP ? CLI_OK : rc;
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
    isa_run *r = calloc(1, sizeof *r); /* the report is large for the stack */
    rc = CLI_FAIL;
    if (!r) {
        cli_error("isa", "out of memory");
    } else {
        r->f = f;
        r->p = dev_get_props(d);
        if (isa_compile(d, &o, r)) {
            find_mix(r, o.json);
            if (o.json)
                print_json(r, o.m);
            else
                print_text(r, o.m);
            rc = CLI_OK;
        }
        dev_code_free(r->code);
    }
    free(r);
    dev_close(d);
    return rc;
}
