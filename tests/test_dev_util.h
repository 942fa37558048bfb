/* test_dev_util.h: helpers shared by the device-level tests (backends, the
 * emulator, kernels written inline in a test): open a device, compile and
 * load a source, find a kernel, launch, move and fill buffers. Each one
 * asserts success and prints the device's message when it fails.
 * Header-only; every function is static inline. */
#ifndef MT_TEST_DEV_UTIL_H
#define MT_TEST_DEV_UTIL_H

#include <criterion/criterion.h>
#include <string.h>

#include "device/device.h"

static inline dev_device *td_open(const char *spec, const dev_open_opts *o)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_open(spec, o, &d, &err);
    cr_assert_eq(st, MT_OK, "dev_open(%s%s%s): %s", spec, o && o->arch ? ", arch " : "",
                 o && o->arch ? o->arch : "", err.msg);
    return d;
}

static inline dev_code *td_compile(dev_device *d, const char *name, const char *src,
                                   const dev_define *defs, int n_defs, bool no_cache)
{
    dev_compile_req req = {.name = name, .source = src, .defines = defs,
                           .n_defines = n_defs, .no_cache = no_cache};
    dev_code *code = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_compile(d, &req, &code, &err);
    cr_assert_eq(st, MT_OK, "compile %s: %s", name, err.msg);
    return code;
}

/* Compiles and loads; the status of the first step that failed. */
static inline mt_status td_try_build(dev_device *d, const char *name, const char *src,
                                     const dev_define *defs, int n_defs, bool no_cache,
                                     dev_module **out, mt_err *err)
{
    dev_compile_req req = {.name = name, .source = src, .defines = defs,
                           .n_defines = n_defs, .no_cache = no_cache};
    dev_code *code = NULL;
    *out = NULL;
    mt_status st = dev_compile(d, &req, &code, err);
    if (st != MT_OK)
        return st;
    st = dev_module_load(d, code, out, err);
    dev_code_free(code);
    return st;
}

static inline dev_module *td_build(dev_device *d, const char *name, const char *src,
                                   const dev_define *defs, int n_defs, bool no_cache)
{
    dev_module *m = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = td_try_build(d, name, src, defs, n_defs, no_cache, &m, &err);
    cr_assert_eq(st, MT_OK, "build %s: %s", name, err.msg);
    return m;
}

static inline dev_kernel *td_kernel(dev_module *m, const char *name, const char *sig)
{
    dev_kernel *k = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_module_get_kernel(m, name, sig, &k, &err), MT_OK, "%s: %s", name,
                 err.msg);
    return k;
}

static inline void td_launch(dev_device *d, dev_kernel *k, dev_dim3 grid, dev_dim3 block,
                             size_t dyn_shared, void **args)
{
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_launch(d, k, grid, block, dyn_shared, args, &err);
    cr_assert_eq(st, MT_OK, "launch: %s: %s", mt_status_str(st), err.msg);
}

static inline void *td_alloc(dev_device *d, size_t bytes)
{
    void *p = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_alloc(d, bytes, &p, &err), MT_OK, "alloc %zu: %s", bytes, err.msg);
    return p;
}

static inline void td_copy_to(dev_device *d, void *dev, const void *host, size_t bytes)
{
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_copy_to(d, dev, host, bytes, &err), MT_OK, "%s", err.msg);
}

/* A new device buffer holding a copy of host[bytes]. */
static inline void *td_upload(dev_device *d, const void *host, size_t bytes)
{
    void *p = td_alloc(d, bytes);
    td_copy_to(d, p, host, bytes);
    return p;
}

static inline void td_download(dev_device *d, void *host, const void *dev, size_t bytes)
{
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_copy_from(d, host, dev, bytes, &err), MT_OK, "%s", err.msg);
}

static inline void td_fill(dev_device *d, void *dev, int byte, size_t bytes)
{
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_memset(d, dev, byte, bytes, &err), MT_OK, "%s", err.msg);
}

/* The resource record of kernel name in a compiled code object. */
static inline const dev_kernel_res *td_find_res(const dev_code *c, const char *name)
{
    const dev_code_info *info = dev_code_get_info(c);
    for (int i = 0; i < info->n_kernels; i++)
        if (!strcmp(info->kernels[i].name, name))
            return &info->kernels[i];
    cr_assert_fail("kernel %s not in the resource list (%d kernels)", name, info->n_kernels);
    return NULL;
}

#endif
