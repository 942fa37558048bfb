/* test_gpu_check.c: bench/gpu-check.sh, the one prepared GPU check, end to
 * end without a GPU: in compile-only mode (NVRTC for sm_90) and --quick it
 * runs every step, reports each one's status, and its JSON and table hold
 * every M of the MoE table with empty timing columns, the check section and
 * the attention rows; and the MoE dump it hands the PyTorch peer
 * (`moetune bench --dump`, bench/lib/moe_dump.h) matches its meta.json, the
 * peer's reader accepts it, and where torch is importable the peer's fp32
 * a4w4 reference reproduces moetune's output on cpu; and the bandwidth
 * probe kernels the GPU figures are set against compile for sm_90 and read
 * and copy every word on the emulator. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "bench/lib/limits.h"
#include "bench/lib/moe_bench.h"
#include "common/files.h"
#include "device/device.h"
#include "test_tmp.h"

static bool have_nvrtc(void)
{
    dev_device *d = NULL;
    dev_open_opts o = {.arch = "sm_90"};
    if (dev_open("cuda", &o, &d, NULL) != MT_OK)
        return false;
    dev_close(d);
    return true;
}

/* Runs cmd through the shell; its output (stdout and stderr) into out. */
static int run_cmd(const char *cmd, char *out, size_t cap)
{
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    while (fread(full, 1, sizeof full, p) > 0) /* drain what did not fit */
        ;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static cJSON *load_json(const char *path)
{
    char *text = NULL;
    size_t len = 0;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(mt_file_read(path, &text, &len, &err), MT_OK, "%s", err.msg);
    cJSON *j = cJSON_Parse(text);
    cr_assert_not_null(j, "%s: not JSON", path);
    free(text);
    return j;
}

static const char *str_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const cJSON *step_named(const cJSON *steps, const char *name)
{
    const cJSON *s;
    cJSON_ArrayForEach(s, steps)
    {
        const char *n = str_of(s, "name");
        if (n && !strcmp(n, name))
            return s;
    }
    return NULL;
}

/* The table's MoE row for M: the line whose first word is M inside the MoE
 * section; every later column must read "-" (nothing timed). */
static void expect_empty_moe_row(const char *txt, int m)
{
    const char *sec = strstr(txt, "\nMoE layer");
    cr_assert_not_null(sec, "no MoE section:\n%s", txt);
    const char *end = strstr(sec, "stage default configs");
    cr_assert_not_null(end, "%s", txt);
    for (const char *line = strchr(sec + 1, '\n'); line && line < end;
         line = strchr(line + 1, '\n')) {
        char buf[512];
        size_t n = strcspn(line + 1, "\n");
        snprintf(buf, sizeof buf, "%.*s", (int)(n < sizeof buf ? n : sizeof buf - 1), line + 1);
        char *save = NULL, *tok = strtok_r(buf, " ", &save);
        if (!tok || atoi(tok) != m || strspn(tok, "0123456789") != strlen(tok))
            continue;
        int cols = 0;
        while ((tok = strtok_r(NULL, " ", &save))) {
            cr_assert_str_eq(tok, "-", "M=%d: a timing column reads %s in:\n%s", m, tok, txt);
            cols++;
        }
        cr_assert_eq(cols, 11, "M=%d: %d columns after M", m, cols);
        return;
    }
    cr_assert_fail("no MoE row for M=%d in:\n%s", m, txt);
}

Test(gpu_check, compile_only_quick_run_reports_every_step_and_m, .timeout = 900)
{
    if (!have_nvrtc())
        cr_skip_test("NVRTC not found: the cuda backend cannot compile here");
    tmp_cache_make_writable();
    char out[512], bin[1024], cmd[3072];
    tmp_dir_make(out, sizeof out, "mt_gpu_check");
    snprintf(bin, sizeof bin, "%s", MOETUNE_BIN);
    /* The script builds its targets in the tree the tests were built in
     * (configured already: built, not reconfigured). */
    snprintf(cmd, sizeof cmd, "OUT='%s' MOETUNE_GPU_CHECK_BUILD='%s' bash '%s/bench/gpu-check.sh' "
             "--quick", out, dirname(bin), MOETUNE_SOURCE_DIR);
    static char log[1 << 20];
    int rc = run_cmd(cmd, log, sizeof log);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, log);

    char path[1024];
    snprintf(path, sizeof path, "%s/gpu-check.json", out);
    cJSON *j = load_json(path);
    cr_assert_str_eq(str_of(j, "mode"), "compile-only");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(j, "steps");
    cr_assert(cJSON_IsArray(steps));
    const char *ok[] = {"deps", "build", "devices", "moe-bench", "attn-check", "check",
                        "tune-up", "tune-down", "tune-route", "tune-align"};
    const char *skipped[] = {"peak", "moe-peer", "attention", "nccl", "moe-tuned"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        const cJSON *s = step_named(steps, ok[i]);
        cr_assert_not_null(s, "step %s missing:\n%s", ok[i], log);
        cr_assert_str_eq(str_of(s, "status"), "ok", "step %s: %s", ok[i], str_of(s, "note"));
    }
    for (size_t i = 0; i < sizeof skipped / sizeof skipped[0]; i++) {
        const cJSON *s = step_named(steps, skipped[i]);
        cr_assert_not_null(s, "step %s missing:\n%s", skipped[i], log);
        cr_assert_str_eq(str_of(s, "status"), "skipped", "step %s", skipped[i]);
        cr_assert(str_of(s, "note") && *str_of(s, "note"), "step %s: no reason", skipped[i]);
    }

    /* Every M of the MoE table, nothing timed, the stages' kernels compiled. */
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(j, "moe"), "rows");
    const int ms[] = {1, 16, 256, 4096};
    cr_assert_eq(cJSON_GetArraySize(rows), 4);
    for (int i = 0; i < 4; i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        cr_assert_eq(cJSON_GetObjectItemCaseSensitive(r, "m")->valueint, ms[i]);
        const char *timing[] = {"layer_default_ms", "layer_tuned_ms", "up_ms", "down_ms",
                                "pytorch_ms", "moetune_over_pytorch", "of_bw"};
        for (size_t k = 0; k < sizeof timing / sizeof timing[0]; k++)
            cr_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(r, timing[k])),
                      "M=%d: %s is not empty", ms[i], timing[k]);
        cr_assert(str_of(r, "up_config") && strstr(str_of(r, "up_config"), "MMA="),
                  "M=%d: no compiled stage-1 default", ms[i]);
        cr_assert(str_of(r, "down_config"), "M=%d: no compiled stage-2 default", ms[i]);
    }

    /* The check section: the quick run's three families, none failed. */
    const cJSON *chk = cJSON_GetObjectItemCaseSensitive(j, "check");
    cr_assert_str_eq(str_of(chk, "status"), "ok");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(chk, "failed")->valueint, 0);
    cr_assert_gt(cJSON_GetObjectItemCaseSensitive(chk, "passed")->valueint, 0);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(chk, "families")), 3);

    /* Attention: the decode-path rows, the checked ones compiled. */
    const cJSON *arows = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(j, "attention"), "rows");
    cr_assert_geq(cJSON_GetArraySize(arows), 6);
    const cJSON *a0 = cJSON_GetArrayItem(arows, 0);
    cr_assert_str_eq(str_of(a0, "family"), "mla_decode");
    cr_assert_str_eq(str_of(a0, "check"), "compiled");
    cr_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(a0, "ms")));
    cJSON_Delete(j);

    /* The table: every step, every M row empty, the check section. */
    snprintf(path, sizeof path, "%s/gpu-check.txt", out);
    char *txt = NULL;
    size_t len = 0;
    cr_assert_eq(mt_file_read(path, &txt, &len, NULL), MT_OK);
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "\n  %-12s %-8s", ok[i], "ok");
        cr_assert(strstr(txt, needle), "no '%s' row in:\n%s", ok[i], txt);
    }
    for (int i = 0; i < 4; i++)
        expect_empty_moe_row(txt, ms[i]);
    cr_assert(strstr(txt, "\ncheck (moetune check --device cuda --arch sm_90)"), "%s", txt);
    cr_assert(strstr(txt, "\nattention at GLM-5.2 dims"), "%s", txt);
    cr_assert(strstr(txt, "\nNCCL"), "%s", txt);
    free(txt);
}

/* Reads a whole raw file of the dump. */
static void *read_raw(const char *dir, const char *name, size_t *len)
{
    char path[1024], *data = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(mt_file_read(path, &data, len, &err), MT_OK, "%s", err.msg);
    return data;
}

static size_t entry_bytes(const cJSON *e)
{
    const char *dt = str_of(e, "dtype");
    size_t n = !strcmp(dt, "u8") ? 1 : !strcmp(dt, "bf16") ? 2 : 4;
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(e, "shape")) n *= (size_t)d->valueint;
    return n;
}

/* A python3 (or /usr/bin/python3) that imports torch, into out; false if
 * none. */
static bool python_with_torch(char *out, size_t cap)
{
    const char *cands[] = {"python3", "/usr/bin/python3"};
    for (size_t i = 0; i < 2; i++) {
        char cmd[256], buf[256];
        snprintf(cmd, sizeof cmd, "%s -c 'import torch, numpy' >/dev/null", cands[i]);
        if (run_cmd(cmd, buf, sizeof buf) == 0) {
            snprintf(out, cap, "%s", cands[i]);
            return true;
        }
    }
    return false;
}

Test(gpu_check, moe_dump_matches_its_meta_and_the_peer_reads_it, .timeout = 300)
{
    tmp_cache_make_writable();
    char dir[512];
    tmp_dir_make(dir, sizeof dir, "mt_moe_dump");
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu", NULL, &d, &err), MT_OK, "%s", err.msg);
    const int64_t ms[] = {1, 5};
    FILE *sink = fopen("/dev/null", "w");
    cr_assert_not_null(sink);
    moe_bench_opts o = {.shape = "tiny", .family = "moe_layer", .ms = ms, .n_ms = 2,
                        .json = true, .max_ms = 1e-6, .max_reps = 3, .seed = 7,
                        .no_limits = true, .dump_dir = dir, .log = sink};
    cr_assert_eq(moe_bench_run(d, &o, sink, &err), MT_OK, "%s", err.msg);
    /* A dump needs the layer. */
    moe_bench_opts g = o;
    g.family = "moe_gemm";
    cr_assert_eq(moe_bench_run(d, &g, sink, &err), MT_E_INVALID);
    fclose(sink);
    dev_close(d);

    char path[1024];
    snprintf(path, sizeof path, "%s/meta.json", dir);
    cJSON *meta = load_json(path);
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(meta, "format")->valueint, 1);
    cr_assert_str_eq(str_of(meta, "layout"), "quark");
    const int E = cJSON_GetObjectItemCaseSensitive(meta, "n_experts")->valueint;
    const int K = cJSON_GetObjectItemCaseSensitive(meta, "topk")->valueint;
    const int H = cJSON_GetObjectItemCaseSensitive(meta, "hidden")->valueint;
    const double scale = cJSON_GetObjectItemCaseSensitive(meta, "scale")->valuedouble;
    /* Every file has the bytes its shape says. */
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(meta, "files"))
    {
        size_t len = 0;
        free(read_raw(dir, str_of(f, "file"), &len));
        cr_assert_eq(len, entry_bytes(f), "%s", str_of(f, "file"));
    }
    size_t nl = 0;
    int32_t *list = read_raw(dir, "experts.i32", &nl);
    const cJSON *t;
    int ti = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(meta, "tokens"))
    {
        const int M = cJSON_GetObjectItemCaseSensitive(t, "m")->valueint;
        cr_assert_eq(M, ms[ti++]);
        const char *parts[] = {"x", "ids", "weights", "y"};
        void *data[4];
        for (int i = 0; i < 4; i++) {
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(t, parts[i]);
            size_t len = 0;
            data[i] = read_raw(dir, str_of(e, "file"), &len);
            cr_assert_eq(len, entry_bytes(e), "M=%d %s", M, parts[i]);
        }
        const int32_t *ids = data[1];
        const float *tw = data[2], *y = data[3];
        for (int tok = 0; tok < M; tok++) {
            double sum = 0;
            for (int k = 0; k < K; k++) {
                int e = ids[tok * K + k];
                cr_assert(e >= 0 && e < E);
                bool dumped = false;
                for (size_t i = 0; i < nl / 4; i++)
                    dumped |= list[i] == e;
                cr_assert(dumped, "M=%d: expert %d routed to but not dumped", M, e);
                cr_assert_gt(tw[tok * K + k], 0.0f);
                sum += tw[tok * K + k];
            }
            /* norm: the weights of a token sum to the scale */
            cr_assert_float_eq(sum, scale, 1e-4, "M=%d token %d", M, tok);
        }
        for (int i = 0; i < M * H; i++)
            cr_assert(isfinite(y[i]), "M=%d y[%d]", M, i);
        cr_assert_eq(cJSON_GetObjectItemCaseSensitive(t, "router_checked")->valueint, M);
        for (int i = 0; i < 4; i++)
            free(data[i]);
    }
    for (size_t i = 1; i < nl / 4; i++)
        cr_assert_lt(list[i - 1], list[i], "experts ascending");
    free(list);
    cJSON_Delete(meta);

    /* The peer's reader, with the standard library alone; then, where
     * torch is importable, the peer itself on cpu: its fp32 a4w4 reference
     * must reproduce moetune's output (weights, layout, routing weights,
     * shared expert and the activation rule all as moetune has them). */
    char out[1 << 15], cmd[2048], py[64];
    snprintf(cmd, sizeof cmd, "python3 '%s/bench/gpu/moe_peer.py' --dump '%s' --validate-only",
             MOETUNE_SOURCE_DIR, dir);
    int rc = run_cmd(cmd, out, sizeof out);
    if (rc == 127) {
        cr_log_info("no python3: the peer's reader not run");
        return;
    }
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "\"status\": \"ok\""), "%s", out);
    if (!python_with_torch(py, sizeof py)) {
        cr_log_info("no torch: the peer's check not run");
        return;
    }
    snprintf(cmd, sizeof cmd, "%s '%s/bench/gpu/moe_peer.py' --dump '%s' --device cpu --reps 3",
             py, MOETUNE_SOURCE_DIR, dir);
    rc = run_cmd(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "\"status\": \"pass\""), "%s", out);
    cr_assert_null(strstr(out, "\"status\": \"fail\""), "%s", out);
}

/* The bandwidth probe's kernels (bench/lib/limits.h), which the GPU
 * benchmarks divide by: they compile for sm_90 with NVRTC where it is
 * installed, and on the emulator (wave32, the NVIDIA shape) the read keeps
 * every load (it stores only when what it read folds to its marker) and
 * the copy copies every word, tails included. */
Test(gpu_check, bandwidth_probe_kernels_compile_and_read_every_word)
{
    dev_compile_req req = {.name = "bench_limits.hip", .source = bench_limits_gpu_source(),
                           .no_cache = true};
    mt_err err = MT_ERR_INIT;
    dev_code *code = NULL;
    if (have_nvrtc()) {
        dev_device *nv = NULL;
        cr_assert_eq(dev_open("cuda", &(dev_open_opts){.arch = "sm_90"}, &nv, &err), MT_OK);
        cr_assert_eq(dev_compile(nv, &req, &code, &err), MT_OK, "%s", err.msg);
        const dev_code_info *info = dev_code_get_info(code);
        cr_assert_eq(info->n_kernels, 2);
        for (int i = 0; i < info->n_kernels; i++)
            cr_assert_eq(info->kernels[i].private_bytes, 0, "%s: local memory",
                         info->kernels[i].name);
        dev_code_free(code);
        dev_close(nv);
    }
    dev_device *d = NULL;
    cr_assert_eq(dev_open("emu:wave32", NULL, &d, &err), MT_OK, "%s", err.msg);
    dev_module *mod = NULL;
    dev_kernel *rd = NULL, *cp = NULL;
    cr_assert_eq(dev_compile(d, &req, &code, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(dev_module_load(d, code, &mod, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(dev_module_get_kernel(mod, "bench_read", "plp", &rd, &err), MT_OK, "%s",
                 err.msg);
    cr_assert_eq(dev_module_get_kernel(mod, "bench_copy", "ppl", &cp, &err), MT_OK, "%s",
                 err.msg);
    enum { WORDS = 4 * 3 * 256 + 77 }; /* 16-byte words: whole steps of 3 blocks and a tail */
    uint32_t *host = calloc(WORDS * 4, 4), *back = malloc(WORDS * 16);
    void *src = NULL, *dst = NULL, *out = NULL;
    cr_assert_eq(dev_alloc(d, WORDS * 16, &src, &err), MT_OK);
    cr_assert_eq(dev_alloc(d, WORDS * 16, &dst, &err), MT_OK);
    cr_assert_eq(dev_alloc(d, 16, &out, &err), MT_OK);
    long n16 = WORDS;
    for (int pass = 0; pass < 2; pass++) {
        /* Pass 0: words that fold to 0; pass 1: one word of the tail
         * carries the marker, so only a read of every word stores it. */
        memset(host, 0, WORDS * 16);
        if (pass)
            host[(WORDS - 3) * 4 + 1] = 0x9e3779b9u;
        uint32_t zero[4] = {0};
        cr_assert_eq(dev_copy_to(d, src, host, WORDS * 16, &err), MT_OK);
        cr_assert_eq(dev_copy_to(d, out, zero, 16, &err), MT_OK);
        void *args[] = {&src, &n16, &out};
        cr_assert_eq(dev_launch(d, rd, (dev_dim3){3, 1, 1}, (dev_dim3){256, 1, 1}, 0, args, &err),
                     MT_OK, "%s", err.msg);
        uint32_t got[4];
        cr_assert_eq(dev_copy_from(d, got, out, 16, &err), MT_OK);
        cr_assert_eq(got[0], pass ? 0x9e3779b9u : 0u, "pass %d: out %#x", pass, got[0]);
    }
    for (int i = 0; i < WORDS * 4; i++)
        host[i] = 0x01000193u * (uint32_t)(i + 1);
    cr_assert_eq(dev_copy_to(d, src, host, WORDS * 16, &err), MT_OK);
    cr_assert_eq(dev_memset(d, dst, 0, WORDS * 16, &err), MT_OK);
    void *cargs[] = {&src, &dst, &n16};
    cr_assert_eq(dev_launch(d, cp, (dev_dim3){3, 1, 1}, (dev_dim3){256, 1, 1}, 0, cargs, &err),
                 MT_OK, "%s", err.msg);
    cr_assert_eq(dev_copy_from(d, back, dst, WORDS * 16, &err), MT_OK);
    cr_assert_eq(memcmp(back, host, WORDS * 16), 0, "the copy differs");
    free(host);
    free(back);
    dev_free(d, src);
    dev_free(d, dst);
    dev_free(d, out);
    dev_module_unload(mod);
    dev_code_free(code);
    dev_close(d);
}
