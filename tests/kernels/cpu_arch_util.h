/* cpu_arch_util.h: opening the cpu device capped at an x86-64 level (--arch),
 * for tests that run every SIMD path of the cpu kernels this CPU can run,
 * and checking explicit configs of a family there. */
#ifndef MT_TEST_CPU_ARCH_UTIL_H
#define MT_TEST_CPU_ARCH_UTIL_H

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <string.h>

#include "device/device.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"

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

/* Index of problem p's buffer called name (the test fails without it). */
static inline int problem_buf(const kern_problem *p, const char *name)
{
    for (int i = 0; i < kern_problem_n_bufs(p); i++)
        if (!strcmp(kern_problem_buf(p, i)->name, name))
            return i;
    cr_assert_fail("no buffer %s", name);
    return -1;
}

/* One explicit check: family f at shape and m with config cfg (a key). */
typedef struct cpu_arch_case {
    const char *shape;
    int64_t m;
    const char *cfg;
} cpu_arch_case;

/* Checks each case against the family's reference on d (fresh seeds from
 * seed, printed on failure with the level). */
static inline void check_cases_at(dev_device *d, const char *arch, const kern_family *f,
                                  const cpu_arch_case *cases, int n, uint64_t seed)
{
    const kern_impl *im = kern_family_impl(f, DEV_BACKEND_CPU);
    for (int i = 0; i < n; i++) {
        kern_config cfg;
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(kern_config_parse(im, cases[i].cfg, &cfg, &err), MT_OK, "%s", err.msg);
        mt_status st = kern_check_one(d, f, cases[i].shape, cases[i].m, &cfg, seed + (uint64_t)i,
                                      &err);
        cr_expect_eq(st, MT_OK, "%s at %s, %s M=%lld, %s, seed %llu: %s", f->name,
                     arch ? arch : "native", cases[i].shape, (long long)cases[i].m, cases[i].cfg,
                     (unsigned long long)(seed + (uint64_t)i), err.msg);
    }
}

#endif
