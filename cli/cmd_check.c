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
    long long m;
    int samples;
    uint64_t seed;
    bool json;
} check_opts;

typedef struct check_tally {
    int passed, failed, compiled, cache_hits;
} check_tally;

static void usage(void)
{
    printf("usage: moetune check [--device D] [--family F] [--arch A] [--shape KEY --m M]\n"
           "                     [--samples N] [--seed S] [--json]\n"
           "Runs every family's default config and N sampled configs (default 3) on its\n"
           "small check cases against the plain C reference. With a GPU --arch and no GPU\n"
           "(e.g. --device hip --arch gfx90a) it compiles the sample and prints registers,\n"
           "LDS and spills; --json adds, on hip and cuda, each kernel's instruction mix\n"
           "(\"mix\": matrix instructions vs FMA/VALU, memory, scratch; from llvm-objdump on\n"
           "AMD, from the PTX on NVIDIA). Exit 0 only when everything passed; 2 for usage\n"
           "errors.\n");
}

static int parse(int argc, char **argv, check_opts *o)
{
    bool bad = false;
    const char *v;
    o->device = "auto";
    o->samples = 3;
    o->seed = mt_seed_fresh();
    for (int i = 1; i < argc; i++) {
        if (cli_flag(argv[i], "--json"))
            o->json = true;
        else if ((v = cli_opt(argc, argv, &i, "--device", &bad)))
            o->device = v;
        else if ((v = cli_opt(argc, argv, &i, "--family", &bad)))
            o->family = v;
        else if ((v = cli_opt(argc, argv, &i, "--arch", &bad)))
            o->arch = v;
        else if ((v = cli_opt(argc, argv, &i, "--shape", &bad)))
            o->shape = v;
        else if ((v = cli_opt(argc, argv, &i, "--m", &bad)))
            o->m = atoll(v);
        else if ((v = cli_opt(argc, argv, &i, "--samples", &bad)))
            o->samples = atoi(v);
        else if ((v = cli_opt(argc, argv, &i, "--seed", &bad)))
            o->seed = strtoull(v, NULL, 0);
        else if (cli_flag(argv[i], "--help")) {
            usage();
            return -1;
        } else {
            cli_error("check", "unknown option '%s'", argv[i]);
            return CLI_USAGE;
        }
        if (bad)
            return CLI_USAGE;
    }
    if (o->samples < 0 || o->samples > 64) {
        cli_error("check", "--samples must be between 0 and 64");
        return CLI_USAGE;
    }
    return 0;
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

/* The instruction mix of every kernel of code, for a GPU backend: AMD
 * from llvm-objdump's disassembly (device/isa_mix.h), NVIDIA from the PTX
 * NVRTC kept (device/ptx_mix.h). NULL where there is none (cpu, emu, no
 * llvm-objdump, a cache entry without PTX); *why then says why, or stays
 * empty on a backend that has no mix (cpu, emu). */
static cJSON *mix_json(const dev_props *pr, const dev_code *code, char *why, size_t cap)
{
    const dev_code_info *info = dev_code_get_info(code);
    cJSON *arr = NULL;
    if (pr->backend == DEV_BACKEND_CUDA) {
        const char *ptx = dev_code_get_text(code);
        if (!ptx) {
            snprintf(why, cap, "no PTX kept for this code object");
            return NULL;
        }
        dev_ptx_report *rep = malloc(sizeof *rep);
        if (!rep)
            return NULL;
        dev_ptx_parse(ptx, rep);
        arr = cJSON_CreateArray();
        for (int i = 0; i < info->n_kernels; i++) {
            const dev_ptx_func *f = dev_ptx_find(rep, info->kernels[i].name);
            if (!f)
                continue;
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
            cJSON_AddItemToArray(arr, o);
        }
        free(rep);
        return arr;
    }
    if (pr->backend != DEV_BACKEND_HIP)
        return NULL;
    size_t len = 0;
    const void *bytes = dev_code_get_bytes(code, &len);
    dev_isa_report *rep = malloc(sizeof *rep);
    mt_err err = MT_ERR_INIT;
    if (!rep || dev_isa_mix(bytes, len, pr->arch, rep, &err) != MT_OK) {
        snprintf(why, cap, "%.400s", rep ? err.msg : "out of memory");
        free(rep);
        return NULL;
    }
    arr = cJSON_CreateArray();
    for (int i = 0; i < info->n_kernels; i++) {
        const dev_isa_func *f = dev_isa_find(rep, info->kernels[i].name);
        if (!f)
            continue;
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
        cJSON_AddItemToArray(arr, o);
    }
    free(rep);
    return arr;
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

/* Checks one (family, case, config); prints a row or adds a JSON object. */
static void check_config(dev_device *d, const kern_family *f, const kern_impl *im,
                         const kern_shape *s, const char *shape_key, int64_t m,
                         const kern_config *c, bool is_default, const check_opts *o,
                         cJSON *rows, check_tally *t)
{
    const dev_props *pr = dev_get_props(d);
    char ckey[256], res[512] = "";
    kern_config_key(im, c, ckey, sizeof ckey);
    mt_err err = MT_ERR_INIT;
    dev_code *code = NULL;
    kern_exec *e = NULL;
    kern_problem *p = NULL;
    double t0 = mt_now_ms();
    mt_status st = kern_compile(d, f, im, s, c, &code, &err);
    const dev_code_info *info = code ? dev_code_get_info(code) : NULL;
    if (info) {
        t->compiled++;
        t->cache_hits += info->cache_hit;
        resources_text(info, res, sizeof res);
    }
    if (st == MT_OK && !pr->compile_only) {
        st = kern_exec_open_code(d, f, s, c, code, &e, &err); /* takes the code */
        code = NULL;
        info = e ? dev_code_get_info(kern_exec_code(e)) : NULL;
        if (st == MT_OK)
            st = kern_problem_create(d, f, s, m, o->seed ^ (uint64_t)m, &p, &err);
        if (st == MT_OK)
            st = kern_problem_run(p, e, &err);
        if (st == MT_OK)
            st = kern_problem_verify(p, &err);
    }
    double ms = mt_now_ms() - t0;
    if (st == MT_OK)
        t->passed++;
    else
        t->failed++;
    const char *what = pr->compile_only ? "compiled" : "passed";
    if (rows) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "family", f->name);
        cJSON_AddStringToObject(r, "shape", shape_key);
        cJSON_AddNumberToObject(r, "m", (double)m);
        cJSON_AddStringToObject(r, "config", ckey);
        cJSON_AddBoolToObject(r, "default", is_default);
        cJSON_AddStringToObject(r, "status", st == MT_OK ? what : mt_status_str(st));
        if (st != MT_OK)
            cJSON_AddStringToObject(r, "error", err.msg);
        if (info) {
            cJSON_AddBoolToObject(r, "cache_hit", info->cache_hit);
            cJSON_AddNumberToObject(r, "compile_ms", info->compile_ms);
            cJSON_AddItemToObject(r, "resources", resources_json(info));
        }
        const dev_code *mc = code ? code : e ? kern_exec_code(e) : NULL;
        if (o->json && mc) {
            char why[512] = "";
            cJSON *mix = mix_json(pr, mc, why, sizeof why);
            if (mix)
                cJSON_AddItemToObject(r, "mix", mix);
            else if (why[0])
                cJSON_AddStringToObject(r, "mix_missing", why);
        }
        cJSON_AddNumberToObject(r, "ms", ms);
        cJSON_AddItemToArray(rows, r);
    } else {
        printf("%-14s %-44s %5" PRId64 " %-40s %-8s %s %7.1f ms%s%s\n", f->name, shape_key, m,
               ckey, st == MT_OK ? what : mt_status_str(st),
               info && info->cache_hit ? "cached " : "       ", ms, res[0] ? "  " : "", res);
        if (st != MT_OK)
            printf("    %s\n", err.msg);
    }
    kern_problem_destroy(p);
    kern_exec_close(e);
    dev_code_free(code);
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
        kern_config cfgs[65];
        int n = kern_space_sample(f, im, &s, m, pr, o->seed + (uint64_t)ci * 7919u, true,
                                  cfgs, o->samples + 1);
        for (int k = 0; k < n; k++)
            check_config(d, f, im, &s, skey, m, &cfgs[k], k == 0, o, rows, t);
    }
    return CLI_OK;
}

int cmd_check(int argc, char **argv)
{
    check_opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc < 0 ? CLI_OK : rc;
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
    if (o.json) {
        cJSON *top = cJSON_CreateObject();
        cJSON_AddStringToObject(top, "device", pr->spec);
        cJSON_AddStringToObject(top, "arch", pr->arch);
        cJSON_AddNumberToObject(top, "seed", (double)o.seed);
        cJSON_AddNumberToObject(top, "passed", t.passed);
        cJSON_AddNumberToObject(top, "failed", t.failed);
        cJSON_AddNumberToObject(top, "cache_hits", t.cache_hits);
        cJSON_AddItemToObject(top, "results", rows);
        char *s = cJSON_Print(top);
        puts(s);
        free(s);
        cJSON_Delete(top);
    } else {
        printf("%d passed, %d failed\n", t.passed, t.failed);
        printf("compile cache: %d of %d compiles were cache hits\n", t.cache_hits, t.compiled);
    }
    dev_close(d);
    if (rc != CLI_OK)
        return rc;
    return t.failed ? CLI_FAIL : CLI_OK;
}
