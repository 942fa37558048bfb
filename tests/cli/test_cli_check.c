/* test_cli_check.c: `moetune check` end to end through the CLI: every
 * family's default config compiles with NVRTC for sm_90 without a GPU (the
 * NVIDIA path of the same kernel sources), the second run is served from
 * the compile cache, --json reports each kernel's instruction mix on hip
 * and cuda, and usage errors exit 2. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "device/device.h"
#include "kernels/core/family.h"
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

static bool can_open(const char *spec, const char *arch)
{
    dev_device *d = NULL;
    dev_open_opts o = {.arch = arch};
    if (dev_open(spec, &o, &d, NULL) != MT_OK)
        return false;
    dev_close(d);
    return true;
}

/* Runs `check --json` for gemm's default at M=4096 (GLM-5.2 q_a) on a
 * compile-only device and returns the mix entry of kernel gemm_bf16. */
static cJSON *check_mix(const char *device, const char *arch, cJSON **top)
{
    static char out[1 << 20];
    char args[256];
    snprintf(args, sizeof args, "check --device %s --arch %s --family gemm --shape glm5.2-q_a "
             "--m 4096 --samples 0 --json", device, arch);
    int rc = run(args, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    const char *json = strchr(out, '{'); /* past any warning lines */
    cr_assert_not_null(json, "%s", out);
    *top = cJSON_Parse(json);
    cr_assert_not_null(*top, "not JSON:\n%s", out);
    cJSON *res = cJSON_GetArrayItem(cJSON_GetObjectItem(*top, "results"), 0);
    cr_assert_not_null(res, "%s", out);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(res, "default")));
    cJSON *mix = cJSON_GetObjectItem(res, "mix"), *k;
    cr_assert(cJSON_IsArray(mix), "no mix (%s):\n%s",
              cJSON_GetStringValue(cJSON_GetObjectItem(res, "mix_missing")), out);
    cJSON_ArrayForEach(k, mix)
        if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(k, "kernel")), "gemm_bf16"))
            return k;
    cr_assert_fail("no gemm_bf16 in the mix:\n%s", out);
    return NULL;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(o, key);
    cr_assert(cJSON_IsNumber(v), "no number '%s'", key);
    return v->valuedouble;
}

Test(cli_check, json_reports_the_mfma_mix_of_the_gfx90a_default, .timeout = 120)
{
    if (!can_open("hip", "gfx90a"))
        cr_skip_test("hipRTC not found: the hip backend cannot compile for gfx90a here");
    if (system("command -v llvm-objdump-19 >/dev/null 2>&1 || "
               "command -v llvm-objdump >/dev/null 2>&1"))
        cr_skip_test("no llvm-objdump: no AMD instruction mix here");
    tmp_cache_make_writable();
    cJSON *top;
    cJSON *k = check_mix("hip", "gfx90a", &top);
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(k, "source")), "disassembly");
    /* the 64x64 wave tile: 2 x 2 fragments of 32x32x8, 4 k steps of BK 32 */
    cr_assert_geq(num(k, "mma"), 16);
    cr_assert_gt(num(k, "valu"), 0);
    cr_assert_eq(num(k, "scratch"), 0);
    cJSON *kinds = cJSON_GetObjectItem(k, "mma_kinds");
    cr_assert_eq(cJSON_GetArraySize(kinds), 1);
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetArrayItem(kinds, 0)),
                     "v_mfma_f32_32x32x8bf16_1k");
    cJSON *hot = cJSON_GetObjectItem(k, "hot_loop");
    cr_assert_not_null(hot);
    cr_assert_eq(num(hot, "mma"), 16);
    cJSON *res = cJSON_GetArrayItem(cJSON_GetObjectItem(top, "results"), 0), *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(res, "resources"))
        if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(r, "kernel")), "gemm_bf16")) {
            cr_assert_eq(num(r, "agprs"), 64, "64 accumulators per lane in AGPRs");
            cr_assert_eq(num(r, "spill_vgprs"), 0);
            cr_assert_geq(num(r, "waves_per_simd"), 1);
        }
    cJSON_Delete(top);
}

Test(cli_check, json_reports_the_mma_sync_mix_of_the_sm90_default_from_the_ptx, .timeout = 120)
{
    if (!have_nvrtc())
        cr_skip_test("NVRTC not found: the cuda backend cannot compile here");
    /* a fresh cache: an entry cached before the PTX was kept has none */
    char dir[512];
    tmp_dir_make(dir, sizeof dir, "mt_ptx_cache");
    cr_assert_eq(setenv("MOETUNE_CACHE", dir, 1), 0);
    cJSON *top;
    cJSON *k = check_mix("cuda", "sm_90", &top);
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(k, "source")), "ptx");
    cr_assert_gt(num(k, "mma"), 0);
    cr_assert_eq(num(k, "fma"), 0, "the MMA path multiplies on the tensor cores only");
    cr_assert_eq(num(k, "local"), 0);
    cJSON *kinds = cJSON_GetObjectItem(k, "mma_kinds");
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetArrayItem(kinds, 0)),
                     "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32");
    cJSON_Delete(top);
}

Test(cli_check, usage_errors_exit_2)
{
    char out[4096];
    cr_assert_eq(run("check --device nosuch", out, sizeof out), 2, "%s", out);
    cr_assert_eq(run("check --family nosuch --device cpu", out, sizeof out), 2, "%s", out);
    cr_assert_eq(run("check --bogus", out, sizeof out), 2, "%s", out);
}
