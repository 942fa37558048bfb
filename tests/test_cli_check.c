/* test_cli_check.c: `moetune check` end to end through the CLI: every
 * family's default config compiles with NVRTC for sm_90 without a GPU (the
 * NVIDIA path of the same kernel sources), the second run is served from
 * the compile cache, and usage errors exit 2. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "device/device.h"
#include "kernels/family.h"
#include "test_tmp.h"

static int run(const char *args, char *out, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", MOETUNE_BIN, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool have_nvrtc(void)
{
    dev_device *d = NULL;
    dev_open_opts o = {.arch = "sm_90"};
    if (dev_open("cuda", &o, &d, NULL) != MT_OK)
        return false;
    dev_close(d);
    return true;
}

Test(cli_check, cuda_sm90_compiles_every_family_then_hits_the_cache, .timeout = 600)
{
    if (!have_nvrtc())
        cr_skip_test("NVRTC not found: the cuda backend cannot compile here");
    tmp_cache_make_writable();
    static char out[1 << 20];
    int rc = run("check --device cuda --arch sm_90 --samples 0", out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, " 0 failed"), "%s", out);
    /* Every registered family appears with a register count. */
    const kern_family *const *all = kern_families();
    for (int i = 0; all[i]; i++) {
        if (!all[i]->gpu)
            continue;
        char needle[64];
        snprintf(needle, sizeof needle, "\n%s ", all[i]->name);
        cr_assert(strstr(out, needle), "family %s missing from:\n%s", all[i]->name, out);
    }
    cr_assert(strstr(out, "vgpr="), "no resources printed:\n%s", out);
    rc = run("check --device cuda --arch sm_90 --samples 0", out, sizeof out);
    cr_assert_eq(rc, 0);
    char *line = strstr(out, "compile cache: ");
    cr_assert_not_null(line, "%s", out);
    int hits = -1, total = -2;
    cr_assert_eq(sscanf(line, "compile cache: %d of %d", &hits, &total), 2);
    cr_assert_eq(hits, total, "second run compiled again: %s", line);
}

Test(cli_check, usage_errors_exit_2)
{
    char out[4096];
    cr_assert_eq(run("check --device nosuch", out, sizeof out), 2, "%s", out);
    cr_assert_eq(run("check --family nosuch --device cpu", out, sizeof out), 2, "%s", out);
    cr_assert_eq(run("check --bogus", out, sizeof out), 2, "%s", out);
}
