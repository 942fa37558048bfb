/* test_kernel_sigs.c: the signature letters a kernel is launched with must
 * match its C parameters. The cpu and emu backends call kernels through the
 * letters (libffi or registers), so a wrong list would pass garbage or an
 * argument too many without a word; with GCC every module they compile
 * carries a table of its kernels' parameters (device/host_cc.c) and
 * dev_module_get_kernel refuses a list that disagrees. Pinned here: the
 * check on a kernel written for it (one letter more, one fewer, a wrong
 * type, a type without a letter), and every registered family's default
 * config on its first check case on cpu and emu, which fails if any
 * family asks for a list its source does not have. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "device/device.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"
#include "test_dev_util.h"

static bool cc_is_clang(void)
{
    const char *cc = getenv("MOETUNE_CC");
    return cc && strstr(cc, "clang");
}

static dev_device *open_dev(const char *spec)
{
    return td_open(spec, &(dev_open_opts){.threads = 2});
}

/* `handle` has a typedef of its own (no letter: '?', any letter goes);
 * `none` has no parameters. */
static const char cpu_src[] =
    "typedef int handle;\n"
    "MT_CPU_KERNEL void k(float *y, const float *x, int32_t n, float s, unsigned u,\n"
    "                     long long l, double d, handle h)\n"
    "{ if (itemIdx.x == 0 && n > 0) y[0] = x[0] * s + (float)(u + l + d + h); }\n"
    "MT_CPU_KERNEL void none(void) {}\n";

static const char gpu_src[] =
    "typedef int handle;\n"
    "MT_KERNEL void k(float *y, const float *x, int n, float s, unsigned u,\n"
    "                 long long l, double d, handle h)\n"
    "{ if (threadIdx.x == 0 && n > 0) y[0] = x[0] * s + (float)(u + l + d + h); }\n"
    "MT_KERNEL void none(void) {}\n";

static void check_letters(const char *spec, const char *src)
{
    if (cc_is_clang())
        cr_skip_test("MOETUNE_CC is clang: no -aux-info, modules carry no signature table");
    dev_device *d = open_dev(spec);
    mt_err err = MT_ERR_INIT;
    dev_code *code = td_compile(d, "sigs", src, NULL, 0, true);

    const struct { const char *name, *sig; bool ok; } t[] = {
        {"k", "ppifuldi", true},
        {"k", "ppifuldu", true},   /* 'handle' has no letter: any */
        {"k", "ppifuldii", false}, /* one too many */
        {"k", "ppifuld", false},   /* one too few */
        {"k", "ppiiuldi", false},  /* float passed as int */
        {"k", "ppifdldi", false},  /* unsigned passed as double */
        {"k", "pifuldii", false},  /* a pointer passed as int */
        {"none", "", true},
        {"none", "p", false},
    };
    /* A module remembers the first signature a kernel was asked for and
     * refuses any other, so every case gets a module of its own. */
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        dev_module *m = NULL;
        cr_assert_eq(dev_module_load(d, code, &m, &err), MT_OK, "%s: %s", spec, err.msg);
        dev_kernel *k = NULL;
        mt_err e = MT_ERR_INIT;
        mt_status st = dev_module_get_kernel(m, t[i].name, t[i].sig, &k, &e);
        if (t[i].ok) {
            cr_expect_eq(st, MT_OK, "%s: %s('%s'): %s", spec, t[i].name, t[i].sig, e.msg);
        } else {
            cr_expect_eq(st, MT_E_INVALID, "%s: %s('%s') was accepted", spec, t[i].name,
                         t[i].sig);
            cr_expect(strstr(e.msg, t[i].name) && strstr(e.msg, t[i].sig),
                      "%s: the error names the kernel and the signature: %s", spec, e.msg);
        }
        dev_module_unload(m);
    }
    dev_code_free(code);
    dev_close(d);
}

Test(kernel_sigs, cpu_rejects_a_signature_unlike_the_parameters)
{
    check_letters("cpu", cpu_src);
}

Test(kernel_sigs, emu_rejects_a_signature_unlike_the_parameters)
{
    check_letters("emu", gpu_src);
}

/* Every family with an implementation for the backend: its default config
 * on its first check case, verified against the reference. */
static void check_families(const char *spec)
{
    uint64_t seed = mt_seed_fresh();
    dev_device *d = open_dev(spec);
    dev_set_launch_timeout(d, 60000);
    int ran = 0;
    for (const kern_family *const *f = kern_families(); *f; f++) {
        if (!kern_family_impl(*f, dev_get_props(d)->backend) || (*f)->n_cases == 0)
            continue;
        const kern_case *c = &(*f)->cases[0];
        mt_err err = MT_ERR_INIT;
        mt_status st = kern_check_one(d, *f, c->key, c->m, NULL, seed, &err);
        cr_expect_eq(st, MT_OK, "%s: family %s, case %s M=%lld (seed %llu): %s", spec,
                     (*f)->name, c->key, (long long)c->m, (unsigned long long)seed, err.msg);
        ran++;
    }
    cr_expect_gt(ran, 10, "%s: only %d families ran", spec, ran);
    dev_close(d);
}

Test(kernel_sigs, every_family_default_config_runs_on_cpu, .timeout = 300)
{
    check_families("cpu");
}

Test(kernel_sigs, every_family_default_config_runs_on_emu, .timeout = 300)
{
    check_families("emu");
}
