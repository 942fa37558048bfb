/* compile_args.c: what the cpu, hip and cuda backends hand their compiler
 * for one dev_compile_req: the translation unit (prelude, then the source,
 * each under its own #line so messages point into the right file) and the
 * option list (the backend's fixed options, one -DNAME[=VALUE] per define,
 * then the request's own options). */
#define _GNU_SOURCE
#include "device_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mt_status dev_compile_args_build(const dev_compile_req *req, const char *name,
                                 const char *prelude_file, const char *prelude,
                                 const char *const *fixed, int n_fixed, int max_extra,
                                 dev_compile_args *args, mt_err *err)
{
    memset(args, 0, sizeof *args);
    if (req->n_defines < 0 || req->n_options < 0 ||
        req->n_defines + req->n_options > max_extra)
        return mt_fail(err, MT_E_INVALID, "compile of %s: %d defines and %d options "
                       "(at most %d together)", name, req->n_defines, req->n_options,
                       max_extra);

    args->defs = calloc((size_t)req->n_defines + 1, sizeof *args->defs);
    args->opts = calloc((size_t)(n_fixed + req->n_defines + req->n_options) + 1,
                        sizeof *args->opts);
    if (!args->defs || !args->opts ||
        asprintf(&args->text, "#line 1 \"%s\"\n%s\n#line 1 \"%s\"\n%s\n", prelude_file,
                 prelude, name, req->source) < 0) {
        args->text = NULL;
        goto nomem;
    }
    for (int i = 0; i < n_fixed; i++)
        args->opts[args->n_opts++] = fixed[i];
    for (int i = 0; i < req->n_defines; i++) {
        const dev_define *d = &req->defines[i];
        const char *fmt = d->value ? "-D%s=%s" : "-D%s";
        if (asprintf(&args->defs[i], fmt, d->name, d->value) < 0) {
            args->defs[i] = NULL;
            goto nomem;
        }
        args->n_defs++;
        args->opts[args->n_opts++] = args->defs[i];
    }
    for (int i = 0; i < req->n_options; i++)
        args->opts[args->n_opts++] = req->options[i];
    return MT_OK;
nomem:
    dev_compile_args_release(args);
    return mt_fail(err, MT_E_NOMEM, "compile of %s", name);
}

void dev_compile_args_release(dev_compile_args *args)
{
    if (args->defs)
        for (int i = 0; i < args->n_defs; i++)
            free(args->defs[i]);
    free(args->defs);
    free(args->opts);
    free(args->text);
    memset(args, 0, sizeof *args);
}
