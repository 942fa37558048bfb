/* cpu_arch_util.h: opening the cpu device capped at an x86-64 level (--arch),
 * for tests that run every SIMD path of the cpu kernels this CPU can run. */
#ifndef MT_TEST_CPU_ARCH_UTIL_H
#define MT_TEST_CPU_ARCH_UTIL_H

#include <criterion/criterion.h>
#include <criterion/logging.h>

#include "device/device.h"

/* The cpu device at arch (NULL: native), or NULL, logged as skipped, where
 * this CPU lacks what the level assumes. The caller closes it. */
static inline dev_device *open_cpu_arch(const char *arch)
{
    dev_device *dv = NULL;
    mt_err err = MT_ERR_INIT;
    dev_open_opts oo = {.arch = arch};
    mt_status st = dev_open("cpu", arch ? &oo : NULL, &dv, &err);
    if (st == MT_E_UNSUPPORTED) {
        cr_log_info("cpu --arch %s: %s (skipped)", arch, err.msg);
        return NULL;
    }
    cr_assert_eq(st, MT_OK, "open cpu --arch %s: %s", arch ? arch : "native", err.msg);
    return dv;
}

#endif
