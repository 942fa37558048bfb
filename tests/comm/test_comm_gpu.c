/* test_comm_gpu.c: the GPU communicator backends "nccl" and "rccl"
 * (comm/comm_gpu.c). Where a library is absent (RCCL on this machine),
 * every way of opening it fails naming the library that could not be
 * loaded, and a library path given in the environment is named instead;
 * where it is installed (CUDA 13's NCCL here) every call binds and, with
 * no driver, opening names libcuda.so.1.
 * Bad options are refused before any library is touched. With a stand-in
 * library (tests/fake/fake_nccl.c: NCCL's and the GPU runtime's calls for
 * one rank on host memory) loaded in their place, both backends run every
 * collective: the data types and ops reach the library as NCCL's enum
 * values, all-to-all-v moves exactly its blocks between the right
 * displacements, every call waits for the stream, closing frees what
 * opening took, and library and device errors come back named. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/numeric.h"
#include "common/rng.h"

static const struct {
    const char *backend, *lib, *env, *rt_env;
} gpus[] = {
    {"nccl", "libnccl.so.2", "MOETUNE_NCCL_LIBRARY", "MOETUNE_CUDA_DRIVER_LIBRARY"},
    {"rccl", "librccl.so.1", "MOETUNE_RCCL_LIBRARY", "MOETUNE_HIP_LIBRARY"},
};

/* Loaded for good (NODELETE), as comm_gpu.c loads it: CUDA's libnccl
 * does not survive being unloaded and loaded again in one process. */
static bool installed(const char *lib)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (h)
        dlclose(h);
    return h != NULL;
}

Test(comm_gpu, absent_library_is_named)
{
    for (int b = 0; b < 2; b++) {
        unsetenv(gpus[b].env);
        mt_comm *c = NULL;
        mt_err err = MT_ERR_INIT;
        if (installed(gpus[b].lib)) {
            /* The real library binds every call; a host open says what to use. */
            printf("%s is installed here: its absence is not checked\n", gpus[b].lib);
            cr_assert_eq(mt_comm_open(gpus[b].backend, &c, &err), MT_E_UNSUPPORTED);
            cr_assert(strstr(err.msg, "mt_comm_open_gpu"), "%s", err.msg);
            cr_assert(mt_comm_backend_available(gpus[b].backend));
            if (!b && !installed("libcuda.so.1")) { /* CUDA's NCCL without a driver */
                mt_comm_gpu_opts o = {.size = 1};
                err = (mt_err)MT_ERR_INIT;
                cr_assert_eq(mt_comm_open_gpu("nccl", &o, &c, &err), MT_E_UNSUPPORTED);
                cr_assert(strstr(err.msg, "libcuda.so.1"), "%s", err.msg);
            }
            continue;
        }
        cr_assert_eq(mt_comm_open(gpus[b].backend, &c, &err), MT_E_UNSUPPORTED);
        cr_assert_null(c);
        cr_assert(strstr(err.msg, gpus[b].lib), "%s", err.msg);
        mt_comm_gpu_opts o = {.size = 1};
        err = (mt_err)MT_ERR_INIT;
        cr_assert_eq(mt_comm_open_gpu(gpus[b].backend, &o, &c, &err), MT_E_UNSUPPORTED);
        cr_assert(strstr(err.msg, gpus[b].lib), "%s", err.msg);
        mt_comm_unique_id id;
        err = (mt_err)MT_ERR_INIT;
        cr_assert_eq(mt_comm_unique_id_make(gpus[b].backend, &id, &err), MT_E_UNSUPPORTED);
        cr_assert(strstr(err.msg, gpus[b].lib), "%s", err.msg);
        cr_assert_not(mt_comm_backend_available(gpus[b].backend));
        /* A path in the environment is tried instead, and named. */
        setenv(gpus[b].env, "/nonexistent/libmt-no-such-nccl.so", 1);
        err = (mt_err)MT_ERR_INIT;
        cr_assert_eq(mt_comm_open_gpu(gpus[b].backend, &o, &c, &err), MT_E_UNSUPPORTED);
        cr_assert(strstr(err.msg, "/nonexistent/libmt-no-such-nccl.so") &&
                      strstr(err.msg, gpus[b].env),
                  "%s", err.msg);
        unsetenv(gpus[b].env);
    }
}

Test(comm_gpu, bad_options_are_refused)
{
    mt_comm *c = NULL;
    mt_err err = MT_ERR_INIT;
    mt_comm_gpu_opts two = {.size = 2, .rank = 0};
    cr_assert_eq(mt_comm_open_gpu("nccl", &two, &c, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "unique id"), "%s", err.msg);
    mt_comm_gpu_opts bad[] = {{.size = 0}, {.size = 2, .rank = 2}, {.size = 1, .rank = -1},
                              {.size = 1, .device = -1}};
    for (int i = 0; i < 4; i++) {
        err = (mt_err)MT_ERR_INIT;
        cr_assert_eq(mt_comm_open_gpu("rccl", &bad[i], &c, &err), MT_E_INVALID, "case %d: %s",
                     i, err.msg);
    }
    cr_assert_eq(mt_comm_open_gpu("rccl", NULL, &c, &err), MT_E_INVALID);
    cr_assert_eq(mt_comm_open_gpu("mpi", &two, &c, &err), MT_E_UNSUPPORTED);
    cr_assert(strstr(err.msg, "nccl and rccl"), "%s", err.msg);
    mt_comm_unique_id id;
    cr_assert_eq(mt_comm_unique_id_make("self", &id, &err), MT_E_UNSUPPORTED);
    cr_assert_null(c);
    /* The host backends keep their rank-ordered sums. */
    cr_assert_eq(mt_comm_open("self", &c, &err), MT_OK, "%s", err.msg);
    cr_assert(mt_comm_sums_rank_ordered(c));
    cr_assert_not(mt_comm_device_buffers(c));
    mt_comm_close(c);
    mt_comm_close(NULL);
}

/* ---- with the stand-in library ------------------------------------------ */

static void *fake;

static int fake_int(const char *name)
{
    int *p = dlsym(fake, name);
    cr_assert_not_null(p, "%s", name);
    return *p;
}

static void use_fake(int b)
{
    setenv(gpus[b].env, MT_FAKE_NCCL, 1);
    setenv(gpus[b].rt_env, MT_FAKE_NCCL, 1);
    fake = dlopen(MT_FAKE_NCCL, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(fake, "%s", dlerror());
}

static void run_collectives(int b)
{
    use_fake(b);
    const char *be = gpus[b].backend;
    mt_comm *c = NULL;
    mt_err err = MT_ERR_INIT;
    mt_comm_gpu_opts o = {.size = 1};
    cr_assert_eq(mt_comm_open_gpu(be, &o, &c, &err), MT_OK, "%s: %s", be, err.msg);
    cr_assert_str_eq(mt_comm_backend(c), be);
    cr_assert_eq(mt_comm_size(c), 1);
    cr_assert(mt_comm_device_buffers(c));
    cr_assert_not(mt_comm_sums_rank_ordered(c));
    cr_assert_eq(fake_int("fake_live_comms"), 1);

    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    enum { N = 53 };
    float x[N], y[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)mt_rng_below(&r, 2000) - 1000.0f;
    static const struct {
        mt_comm_dtype t;
        mt_comm_op op;
        int nccl_t, nccl_op;
    } red[] = {{MT_COMM_F32, MT_COMM_SUM, 7, 0}, {MT_COMM_BF16, MT_COMM_MAX, 9, 2},
               {MT_COMM_I32, MT_COMM_SUM, 2, 0}, {MT_COMM_U8, MT_COMM_MAX, 1, 2}};
    for (int k = 0; k < 4; k++) {
        int syncs = fake_int("fake_syncs");
        memset(y, 0xff, sizeof y);
        size_t n = N * 4 / mt_comm_dtype_size(red[k].t) - 3; /* odd counts */
        cr_assert_eq(mt_comm_all_reduce(c, x, y, n, red[k].t, red[k].op, &err), MT_OK, "%s",
                     err.msg);
        cr_assert_eq(memcmp(x, y, n * mt_comm_dtype_size(red[k].t)), 0, "seed %llu",
                     (unsigned long long)seed);
        cr_assert_eq(fake_int("fake_last_dtype"), red[k].nccl_t, "dtype %d", (int)red[k].t);
        cr_assert_eq(fake_int("fake_last_op"), red[k].nccl_op, "op %d", (int)red[k].op);
        cr_assert_eq(fake_int("fake_syncs"), syncs + 1, "the call waits for its stream");
        memset(y, 0, sizeof y);
        cr_assert_eq(mt_comm_reduce_scatter(c, x, y, 7, red[k].t, red[k].op, &err), MT_OK);
        cr_assert_eq(memcmp(x, y, 7 * mt_comm_dtype_size(red[k].t)), 0);
        cr_assert_eq(fake_int("fake_last_op"), red[k].nccl_op);
    }
    memset(y, 0, sizeof y);
    cr_assert_eq(mt_comm_all_gather(c, x, y, 11, MT_COMM_I32, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(memcmp(x, y, 44), 0);
    cr_assert_eq(mt_comm_all_reduce(c, x, y, 4, MT_COMM_F32, (mt_comm_op)7, &err),
                 MT_E_INVALID);

    /* all-to-all-v: 5 floats from element 3 of send to element 7 of recv,
     * everything else of recv untouched. */
    float poison;
    memset(&poison, 0xa5, sizeof poison);
    for (int i = 0; i < N; i++)
        y[i] = poison;
    size_t sc = 5, sd = 3, rc = 5, rd = 7;
    cr_assert_eq(mt_comm_all_to_all_v(c, x, &sc, &sd, y, &rc, &rd, MT_COMM_F32, &err), MT_OK,
                 "%s", err.msg);
    for (int i = 0; i < N; i++) {
        if (i >= 7 && i < 12)
            cr_assert_eq(y[i], x[i - 4], "element %d", i);
        else
            cr_assert_eq(memcmp(&y[i], &poison, 4), 0, "element %d written", i);
    }
    sc = 0, rc = 0;
    cr_assert_eq(mt_comm_all_to_all_v(c, x, &sc, &sd, y, &rc, &rd, MT_COMM_F32, &err), MT_OK,
                 "an empty exchange: %s", err.msg);
    float z[N];
    memcpy(z, x, sizeof z);
    cr_assert_eq(mt_comm_broadcast(c, z, N, MT_COMM_F32, 0, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(memcmp(z, x, sizeof z), 0);
    cr_assert_eq(mt_comm_broadcast(c, z, N, MT_COMM_F32, 1, &err), MT_E_INVALID);
    cr_assert_eq(mt_comm_barrier(c, &err), MT_OK, "%s", err.msg);

    /* A split: a communicator of its own (ncclCommSplit), its own scratch,
     * collectives on it, the parent's abort reaching it. */
    mt_comm *g = NULL;
    cr_assert_eq(mt_comm_split(c, 0, 0, &g, &err), MT_OK, "%s: %s", be, err.msg);
    cr_assert_eq(fake_int("fake_live_comms"), 2);
    cr_assert_eq(mt_comm_size(g), 1);
    cr_assert_eq(mt_comm_rank(g), 0);
    cr_assert(mt_comm_device_buffers(g));
    memset(y, 0, sizeof y);
    cr_assert_eq(mt_comm_all_reduce(g, x, y, 9, MT_COMM_F32, MT_COMM_SUM, &err), MT_OK, "%s",
                 err.msg);
    cr_assert_eq(memcmp(x, y, 9 * 4), 0);
    mt_comm_abort(c);
    cr_assert_eq(mt_comm_barrier(g, &err), MT_E_INTERRUPTED);
    mt_comm_close(g);
    cr_assert_eq(fake_int("fake_live_comms"), 1, "the split's communicator destroyed");

    mt_comm_close(c);
    cr_assert_eq(fake_int("fake_live_comms"), 0, "communicator destroyed");
    cr_assert_eq(fake_int("fake_live_allocs"), 0, "scratch freed");

    /* Errors from the device runtime and from the library, named. */
    o.device = 1;
    err = (mt_err)MT_ERR_INIT;
    cr_assert_eq(mt_comm_open_gpu(be, &o, &c, &err), MT_E_DEVICE);
    cr_assert(strstr(err.msg, b ? "hipSetDevice" : "cuDeviceGet") && strstr(err.msg, "device 1"),
              "%s", err.msg);
    mt_comm_unique_id id;
    cr_assert_eq(mt_comm_unique_id_make(be, &id, &err), MT_OK, "%s", err.msg);
    id.bytes[0] ^= 1; /* the stand-in refuses an id it did not make */
    mt_comm_gpu_opts one = {.size = 1, .id = &id};
    err = (mt_err)MT_ERR_INIT;
    cr_assert_eq(mt_comm_open_gpu(be, &one, &c, &err), MT_E_DEVICE);
    cr_assert(strstr(err.msg, "ncclCommInitRank") && strstr(err.msg, "fake: invalid argument"),
              "%s", err.msg);
    cr_assert_eq(fake_int("fake_live_allocs"), 0, "a failed open frees its scratch");
    dlclose(fake);
}

Test(comm_gpu, nccl_collectives_on_the_stand_in) { run_collectives(0); }
Test(comm_gpu, rccl_collectives_on_the_stand_in) { run_collectives(1); }
