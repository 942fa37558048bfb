/* cmd_check.c: `moetune check`: runs each family's default config and a
 * sample of other configs on small shapes against the C reference, and
 * prints a table. On a compile-only device (a GPU arch with no GPU) it
 * compiles each sampled config and prints its resources instead; with
 * --json on hip and cuda, also each kernel's instruction mix (matrix
 * instructions against FMA/VALU, memory, scratch; AMD from the disassembly,
 * NVIDIA from the PTX). */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/rng.h"
#include "device/device.h"
#include "device/hip/isa_mix.h"
#include "device/cuda/ptx_mix.h"
#include "kernels/core/runner.h"
#include "cli.h"

typedef struct check_opts {
    const char *device, *family, *arch, *shape;
    int64_t m;
    int samples;
    uint64_t seed;
    bool json;
} check_opts;

typedef struct check_tally {
    int passed, failed, refused, compiled, cache_hits;
} check_tally;

static int parse(int argc, char **argv, check_opts *o)
{
    o->seed = mt_seed_fresh();
    const cli_opt opts[] = {
        {.name = "--device", .type = CLI_OPT_STRING, .dst = &o->device, .arg = "D",
         .def = "auto", .help = "cpu, emu, emu:wave32, hip, hip:N, cuda or auto"},
        {.name = "--family", .type = CLI_OPT_STRING, .dst = &o->family, .arg = "F",
         .help = "this kernel family only (moetune kernels lists them)"},
        {.name = "--arch", .type = CLI_OPT_STRING, .dst = &o->arch, .arg = "A",
         .help = "GPU arch (compile-only without such a GPU), or on cpu an x86-64 level"},
        {.name = "--shape", .type = CLI_OPT_STRING, .dst = &o->shape, .arg = "KEY",
         .help = "with --family: this shape (a key or preset) instead of the family's "
                 "check cases"},
        {.name = "--m", .type = CLI_OPT_INT64, .dst = &o->m, .arg = "M",
         .help = "with --shape: rows (default: the shape's own M, else 1)"},
        {.name = "--samples", .type = CLI_OPT_INT, .dst = &o->samples, .arg = "N",
         .def = "3", .min = 0, .max = 64, .help = "sampled configs besides the code paths "
                                                  "(every M bucket's default, every MMA and "
                                                  "GEMV mode the space has)"},
        {.name = "--seed", .type = CLI_OPT_UINT64, .dst = &o->seed, .arg = "S",
         .def_text = "fresh, printed", .help = "sampling and input seed"},
        {.name = "--json", .type = CLI_OPT_FLAG, .dst = &o->json,
         .help = "machine-readable output; on hip and cuda with each kernel's "
                 "instruction mix"},
        {0},
    };
    const cli_cmd cmd = {
        .name = "check", .opts = opts,
        .usage = "check [--device D] [--family F] [--arch A] [--shape KEY --m M]\n"
                 "      [--samples N] [--seed S] [--json]",
        .about = "Runs every family's configs on its small check cases against the plain C "
                 "reference: the default, the default of every M bucket the runtime selects "
                 "for, a config of every matrix and decode mode (MMA, GEMV) valid there, and "
                 "N more at random. A case the device cannot run (the default config is not "
                 "valid there) is refused with the reason. With a GPU --arch and no GPU "
                 "(e.g. --device hip --arch gfx90a) it compiles the sample and prints "
                 "registers, LDS and spills; --json adds, on hip and cuda, each kernel's "
                 "instruction mix (\"mix\": matrix instructions vs FMA/VALU, memory, "
                 "scratch; from llvm-objdump on AMD, from the PTX on NVIDIA). Exit 0 only "
                 "when everything passed; 2 for usage errors."};
    return cli_opts_parse(&cmd, argc, argv, 1);
}

static void resources_text(const dev_code_info *info, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < info->n_kernels && n < cap; i++) {
        const dev_kernel_res *r = &info->kernels[i];
        int w = snprintf(out + n, cap - n, "%s%s: vgpr=%d sgpr=%d lds=%" PRId64
                         " spill=%d/%d scratch=%" PRId64, i ? "; " : "", r->name, r->vgprs,
                         r->sgprs, r->lds_bytes, r->spill_vgprs, r->spill_sgprs,
                         r->private_bytes);
        if (w < 0)
            break;
        n += (size_t)w;
    }
}

static cJSON *ptx_func_json(const dev_ptx_func *f)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kernel", f->name);
    cJSON_AddStringToObject(o, "source", "ptx");
    cJSON_AddNumberToObject(o, "instructions", f->total);
    cJSON_AddNumberToObject(o, "mma", f->mma);
    cJSON_AddNumberToObject(o, "fma", f->fma);
    cJSON_AddNumberToObject(o, "alu", f->alu);
    cJSON_AddNumberToObject(o, "global_load", f->ld_global);
    cJSON_AddNumberToObject(o, "global_store", f->st_global);
    cJSON_AddNumberToObject(o, "atomic", f->atomic);
    cJSON_AddNumberToObject(o, "shared_load", f->ld_shared);
    cJSON_AddNumberToObject(o, "shared_store", f->st_shared);
    cJSON_AddNumberToObject(o, "local", f->local);
    cJSON_AddNumberToObject(o, "barrier", f->barrier);
    cJSON *kinds = cJSON_AddArrayToObject(o, "mma_kinds");
    for (int k = 0; k < f->n_mma_kinds; k++)
        cJSON_AddItemToArray(kinds, cJSON_CreateString(f->mma_kind[k]));
    return o;
}

/* NVIDIA: the mix from the PTX NVRTC kept (device/ptx_mix.h). */
static cJSON *ptx_mix_json(const dev_code *code, char *why, size_t cap)
{
    const dev_code_info *info = dev_code_get_info(code);
    const char *ptx = dev_code_get_text(code);
    if (!ptx) {
        snprintf(why, cap, "no PTX kept for this code object");
        return NULL;
    }
    dev_ptx_report *rep = malloc(sizeof *rep);
    if (!rep)
        return NULL;
    dev_ptx_parse(ptx, rep);
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < info->n_kernels; i++) {
        const dev_ptx_func *f = dev_ptx_find(rep, info->kernels[i].name);
        if (f)
            cJSON_AddItemToArray(arr, ptx_func_json(f));
    }
    free(rep);
    return arr;
}

static cJSON *isa_func_json(const dev_isa_func *f)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kernel", f->name);
    cJSON_AddStringToObject(o, "source", "disassembly");
    cJSON_AddNumberToObject(o, "instructions", f->all.total);
    cJSON_AddNumberToObject(o, "mma", f->all.n[DEV_ISA_MFMA]);
    cJSON_AddNumberToObject(o, "valu", f->all.n[DEV_ISA_VALU]);
    for (int c = DEV_ISA_SALU; c < DEV_ISA_N_CLASSES; c++)
        cJSON_AddNumberToObject(o, dev_isa_class_name((dev_isa_class)c), f->all.n[c]);
    cJSON *kinds = cJSON_AddArrayToObject(o, "mma_kinds");
    for (int k = 0; k < f->n_mma_kinds; k++)
        cJSON_AddItemToArray(kinds, cJSON_CreateString(f->mma_kind[k]));
    if (f->hot >= 0) {
        const dev_isa_loop *l = &f->loops[f->hot];
        cJSON *h = cJSON_AddObjectToObject(o, "hot_loop");
        cJSON_AddNumberToObject(h, "instructions", l->c.total);
        cJSON_AddNumberToObject(h, "depth", l->depth);
        for (int c = 0; c < DEV_ISA_N_CLASSES; c++)
            cJSON_AddNumberToObject(h, c == DEV_ISA_MFMA ? "mma"
                                                         : dev_isa_class_name((dev_isa_class)c),
                                    l->c.n[c]);
    }
    return o;
}

/* AMD: the mix from llvm-objdump's disassembly (device/isa_mix.h). */
static cJSON *isa_mix_json(const dev_props *pr, const dev_code *code, char *why, size_t cap)
{
    const dev_code_info *info = dev_code_get_info(code);
    size_t len = 0;
    const void *bytes = dev_code_get_bytes(code, &len);
    dev_isa_report *rep = malloc(sizeof *rep);
    mt_err err = MT_ERR_INIT;
    if (!rep || dev_isa_mix(bytes, len, pr->arch, rep, &err) != MT_OK) {
        snprintf(why, cap, "%.400s", rep ? err.msg : "out of memory");
        free(rep);
        return NULL;
    }
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < info->n_kernels; i++) {
        const dev_isa_func *f = dev_isa_find(rep, info->kernels[i].name);
        if (f)
            cJSON_AddItemToArray(arr, isa_func_json(f));
    }
    free(rep);
    return arr;
}

/* The instruction mix of every kernel of code, for a GPU backend. NULL
 * where there is none (cpu, emu, no llvm-objdump, a cache entry without
 * PTX); *why then says why, or stays empty on a backend that has no mix
 * (cpu, emu). */
static cJSON *mix_json(const dev_props *pr, const dev_code *code, char *why, size_t cap)
{
    if (pr->backend == DEV_BACKEND_CUDA)
        return ptx_mix_json(code, why, cap);
    if (pr->backend == DEV_BACKEND_HIP)
        return isa_mix_json(pr, code, why, cap);
    return NULL;
}

static cJSON *resources_json(const dev_code_info *info)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < info->n_kernels; i++) {
        const dev_kernel_res *r = &info->kernels[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "kernel", r->name);
        cJSON_AddNumberToObject(o, "vgprs", r->vgprs);
        cJSON_AddNumberToObject(o, "sgprs", r->sgprs);
        cJSON_AddNumberToObject(o, "agprs", r->agprs);
        cJSON_AddNumberToObject(o, "spill_vgprs", r->spill_vgprs);
        cJSON_AddNumberToObject(o, "spill_sgprs", r->spill_sgprs);
        cJSON_AddNumberToObject(o, "lds_bytes", (double)r->lds_bytes);
        cJSON_AddNumberToObject(o, "private_bytes", (double)r->private_bytes);
        cJSON_AddNumberToObject(o, "max_threads", r->max_threads);
        cJSON_AddNumberToObject(o, "waves_per_simd", r->waves_per_simd);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

/* One config's outcome. */
typedef struct check_result {
    mt_status st;
    mt_err err;
    dev_code *code;            /* compile-only: the code object */
    kern_exec *e;              /* otherwise: the kernel, which holds its code */
    kern_problem *p;
    const dev_code_info *info; /* the code's, NULL where it did not compile */
    double ms;
} check_result;

/* What a row names: the family, shape, M and config checked. */
typedef struct check_row {
    const char *family, *shape, *config;
    int64_t m;
    bool is_default;
} check_row;

/* Runs compiled code on its problem and verifies it against the reference;
 * r->code passes to r->e. */
static void run_config(dev_device *d, const kern_family *f, const kern_shape *s, int64_t m,
                       const kern_config *c, uint64_t seed, check_result *r)
{
    r->st = kern_exec_open_code(d, f, s, c, r->code, &r->e, &r->err); /* takes the code */
    r->code = NULL;
    r->info = r->e ? dev_code_get_info(kern_exec_code(r->e)) : NULL;
    if (r->st == MT_OK)
        r->st = kern_problem_create(d, f, s, m, seed ^ (uint64_t)m, &r->p, &r->err);
    if (r->st == MT_OK)
        r->st = kern_problem_run(r->p, r->e, &r->err);
    if (r->st == MT_OK)
        r->st = kern_problem_verify(r->p, &r->err);
}

static cJSON *row_json(const dev_props *pr, const check_row *w, const check_result *r,
                       bool mix)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "family", w->family);
    cJSON_AddStringToObject(o, "shape", w->shape);
    cJSON_AddNumberToObject(o, "m", (double)w->m);
    cJSON_AddStringToObject(o, "config", w->config);
    cJSON_AddBoolToObject(o, "default", w->is_default);
    const char *what = pr->compile_only ? "compiled" : "passed";
    cJSON_AddStringToObject(o, "status", r->st == MT_OK ? what : mt_status_str(r->st));
    if (r->st != MT_OK)
        cJSON_AddStringToObject(o, "error", r->err.msg);
    if (r->info) {
        cJSON_AddBoolToObject(o, "cache_hit", r->info->cache_hit);
        cJSON_AddNumberToObject(o, "compile_ms", r->info->compile_ms);
        cJSON_AddItemToObject(o, "resources", resources_json(r->info));
    }
    const dev_code *mc = r->code ? r->code : r->e ? kern_exec_code(r->e) : NULL;
    if (mix && mc) {
        char why[512] = "";
        cJSON *m = mix_json(pr, mc, why, sizeof why);
        if (m)
            cJSON_AddItemToObject(o, "mix", m);
        else if (why[0])
            cJSON_AddStringToObject(o, "mix_missing", why);
    }
    cJSON_AddNumberToObject(o, "ms", r->ms);
    return o;
}

static void print_row(const dev_props *pr, const check_row *w, const check_result *r,
                      const char *res)
{
    const char *what = pr->compile_only ? "compiled" : "passed";
    printf("%-14s %-44s %5" PRId64 " %-40s %-8s %s %7.1f ms%s%s\n", w->family, w->shape, w->m,
           w->config, r->st == MT_OK ? what : mt_status_str(r->st),
           r->info && r->info->cache_hit ? "cached " : "       ", r->ms, res[0] ? "  " : "",
           res);
    if (r->st != MT_OK)
        printf("    %s\n", r->err.msg);
}

/* Checks one (family, case, config); prints a row or adds a JSON object. */
static void check_config(dev_device *d, const kern_family *f, const kern_impl *im,
                         const kern_shape *s, const char *shape_key, int64_t m,
                         const kern_config *c, bool is_default, const check_opts *o,
                         cJSON *rows, check_tally *t)
{
    const dev_props *pr = dev_get_props(d);
    char ckey[256], res[512] = "";
    kern_config_key(im, c, ckey, sizeof ckey);
    check_result r = {.err = MT_ERR_INIT};
    double t0 = mt_now_ms();
    r.st = kern_compile(d, f, im, s, c, &r.code, &r.err);
    r.info = r.code ? dev_code_get_info(r.code) : NULL;
    if (r.info) {
        t->compiled++;
        t->cache_hits += r.info->cache_hit;
        resources_text(r.info, res, sizeof res);
    }
    if (r.st == MT_OK && !pr->compile_only)
        run_config(d, f, s, m, c, o->seed, &r);
    r.ms = mt_now_ms() - t0;
    if (r.st == MT_OK)
        t->passed++;
    else
        t->failed++;
    check_row w = {f->name, shape_key, ckey, m, is_default};
    if (rows)
        cJSON_AddItemToArray(rows, row_json(pr, &w, &r, o->json));
    else
        print_row(pr, &w, &r, res);
    kern_problem_destroy(r.p);
    kern_exec_close(r.e);
    dev_code_free(r.code);
}

/* A case this device cannot run: one row, neither passed nor failed. */
static void refuse_case(const kern_family *f, const char *skey, int64_t m, const char *why,
                        cJSON *rows, check_tally *t)
{
    t->refused++;
    if (rows) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "family", f->name);
        cJSON_AddStringToObject(o, "shape", skey);
        cJSON_AddNumberToObject(o, "m", (double)m);
        cJSON_AddStringToObject(o, "status", "refused");
        cJSON_AddStringToObject(o, "error", why);
        cJSON_AddItemToArray(rows, o);
        return;
    }
    printf("%-14s %-44s %5" PRId64 " refused: %s\n", f->name, skey, m, why);
}

static int check_family(dev_device *d, const kern_family *f, const check_opts *o,
                        cJSON *rows, check_tally *t)
{
    const dev_props *pr = dev_get_props(d);
    const kern_impl *im = kern_family_impl(f, pr->backend);
    if (!im)
        return CLI_OK; /* nothing for this backend: not a failure */
    kern_case one = {o->shape, o->m > 0 ? o->m : 1};
    const kern_case *cases = o->shape ? &one : f->cases;
    int n_cases = o->shape ? 1 : f->n_cases;
    for (int ci = 0; ci < n_cases; ci++) {
        kern_shape s;
        int64_t km = 0;
        mt_err err = MT_ERR_INIT;
        if (kern_shape_parse(f, cases[ci].key, &s, &km, &err) != MT_OK) {
            cli_error("check", "%s", err.msg);
            return CLI_USAGE;
        }
        int64_t m = o->shape ? (o->m > 0 ? o->m : (km > 0 ? km : 1)) : cases[ci].m;
        char skey[KERN_KEY_MAX];
        kern_shape_key(f, &s, true, skey, sizeof skey);
        kern_config cfgs[128]; /* the code paths (a few dozen at most) and the samples */
        char refused[256];
        int n = kern_space_sample_paths(f, im, &s, m, pr, o->seed + (uint64_t)ci * 7919u,
                                        o->samples, cfgs, 128, refused, sizeof refused);
        if (n == 0)
            refuse_case(f, skey, m, refused, rows, t);
        for (int k = 0; k < n; k++)
            check_config(d, f, im, &s, skey, m, &cfgs[k], k == 0, o, rows, t);
    }
    return CLI_OK;
}

/* The end of the run: the JSON document (rows inside; freed) or the totals. */
static void print_summary(const dev_props *pr, const check_opts *o, const check_tally *t,
                          cJSON *rows)
{
    if (!o->json) {
        printf("%d passed, %d failed, %d cases refused\n", t->passed, t->failed, t->refused);
        printf("compile cache: %d of %d compiles were cache hits\n", t->cache_hits,
               t->compiled);
        return;
    }
    cJSON *top = cJSON_CreateObject();
    cJSON_AddStringToObject(top, "device", pr->spec);
    cJSON_AddStringToObject(top, "arch", pr->arch);
    cJSON_AddNumberToObject(top, "seed", (double)o->seed);
    cJSON_AddNumberToObject(top, "passed", t->passed);
    cJSON_AddNumberToObject(top, "failed", t->failed);
    cJSON_AddNumberToObject(top, "refused", t->refused);
    cJSON_AddNumberToObject(top, "cache_hits", t->cache_hits);
    cJSON_AddItemToObject(top, "results", rows);
    char *s = cJSON_Print(top);
    puts(s);
    free(s);
    cJSON_Delete(top);
}

int cmd_check(int argc, char **argv)
{
    check_opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == CLI_HELP ? CLI_OK : rc;
    if (o.family && !kern_family_find(o.family)) {
        cli_error("check", "unknown family '%s'", o.family);
        return CLI_USAGE;
    }
    if (o.shape && !o.family) {
        cli_error("check", "--shape needs --family");
        return CLI_USAGE;
    }
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    dev_open_opts dopts = {.arch = o.arch};
    mt_status st = dev_open(o.device, &dopts, &d, &err);
    if (st != MT_OK) {
        cli_error("check", "%s", err.msg);
        return st == MT_E_INVALID ? CLI_USAGE : CLI_FAIL;
    }
    dev_set_launch_timeout(d, 60000);
    const dev_props *pr = dev_get_props(d);
    cJSON *rows = o.json ? cJSON_CreateArray() : NULL;
    if (!o.json)
        printf("device %s (%s, %s), seed %" PRIu64 "\n", pr->spec, pr->arch, pr->name, o.seed);
    check_tally t = {0};
    const kern_family *const *all = kern_families();
    for (int i = 0; all[i] && rc == CLI_OK; i++)
        if (!o.family || !strcmp(o.family, all[i]->name))
            rc = check_family(d, all[i], &o, rows, &t);
    print_summary(pr, &o, &t, rows);
    dev_close(d);
    if (rc != CLI_OK)
        return rc;
    return t.failed ? CLI_FAIL : CLI_OK;
}
