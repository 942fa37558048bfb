/* rows.c: parameters, validity, defaults and the launch shared by the
 * row-wise families (see rows.h). */
#include "rows.h"

#include <assert.h>
#include <stdio.h>

static const int threads_v[] = {64, 128, 256};
static const int rows_v[] = {1, 4};
const kern_param_desc kern_rows_gpu_params[KERN_ROWS_GPU_N_PARAMS] = {
    {"THREADS", threads_v, 3, "threads per block"},
    {"ROWS", rows_v, 2, "rows per block"},
};

static const int cpu_rows_v[] = {1, 4, 16};
const kern_param_desc kern_rows_cpu_params[KERN_ROWS_CPU_N_PARAMS] = {
    {"ROWS", cpu_rows_v, 3, "rows per work item"},
};

bool kern_rows_threads_ok(int threads, const dev_props *p, char *why, size_t cap)
{
    if (threads > p->max_threads_per_block || threads % p->warp_size) {
        snprintf(why, cap, "THREADS=%d: more than %d or not a multiple of the warp (%d)",
                 threads, p->max_threads_per_block, p->warp_size);
        return false;
    }
    return true;
}

bool kern_rows_gpu_valid(const kern_shape *s, int64_t m, const kern_config *c,
                         const dev_props *p, char *why, size_t cap)
{
    (void)s;
    (void)m;
    return kern_rows_threads_ok(c->v[0], p, why, cap);
}

int kern_rows_default_threads(bool wide, const dev_props *p)
{
    int t = wide && p->max_threads_per_block >= 256 ? 256 : 64;
    if (t % p->warp_size || t > p->max_threads_per_block)
        t = p->warp_size;
    return t;
}

void kern_rows_gpu_config(int64_t n, const dev_props *p, kern_config *c)
{
    c->n = 2;
    c->v[0] = kern_rows_default_threads(n >= 1024, p);
    c->v[1] = 1;
}

void kern_rows_gpu_default(const kern_shape *s, int64_t m, const dev_props *p,
                           kern_config *c)
{
    (void)m;
    kern_rows_gpu_config(s->v[0], p, c);
}

void kern_rows_cpu_default(const kern_shape *s, int64_t m, const dev_props *p,
                           kern_config *c)
{
    (void)s;
    c->n = 1;
    c->v[0] = m >= 16 * (int64_t)p->compute_units ? 16 : 1;
}

mt_status kern_rows_launch(const kern_ctx *c, const char *name, const char *sig, void **args,
                           mt_err *err)
{
    dev_kernel *k;
    mt_status st = kern_get(c, name, sig, &k, err);
    if (st != MT_OK)
        return st;
    bool gpu = dev_backend_runs_hip_source(c->props->backend);
    int rows = kern_config_get(c->impl, c->cfg, "ROWS", 1);
    dev_dim3 grid = {kern_cdiv(c->m, rows), 1, 1};
    dev_dim3 block = {gpu ? (unsigned)kern_config_get(c->impl, c->cfg, "THREADS", 64) : 1, 1, 1};
    return dev_launch(c->dev, k, grid, block, 0, args, err);
}

mt_status kern_rows_run_ints(const kern_ctx *c, const int *ints, int n_ints, mt_err *err)
{
    kern_buf_desc b[KERN_MAX_BUFS];
    int nb = c->fam->buffers(c->shape, c->m, b, KERN_MAX_BUFS);
    assert(nb > 0 && nb <= KERN_MAX_BUFS && n_ints >= 0 && n_ints <= KERN_ROWS_MAX_INTS);
    int v[1 + KERN_ROWS_MAX_INTS] = {(int)c->m};
    void *args[KERN_MAX_BUFS + 1 + KERN_ROWS_MAX_INTS];
    char sig[KERN_MAX_BUFS + 1 + KERN_ROWS_MAX_INTS + 1];
    int n = 0;
    for (int i = 0; i < nb; i++, n++) {
        args[n] = (void *)&c->bufs[i];
        sig[n] = 'p';
    }
    for (int i = 0; i <= n_ints; i++, n++) {
        if (i > 0)
            v[i] = ints[i - 1];
        args[n] = &v[i];
        sig[n] = 'i';
    }
    sig[n] = 0;
    return kern_rows_launch(c, c->fam->name, sig, args, err);
}

mt_status kern_rows_run(const kern_ctx *c, mt_err *err)
{
    return kern_rows_run_ints(c, NULL, 0, err);
}
