/* test_indexer_fp8_decode.c: the cpu indexer's fp8 e4m3 key decode
 * (decode_row in kernels/src/dsa_indexer.cpu), compiled by the cpu backend
 * at every x86-64 level this CPU runs, against the host's
 * mt_fp8e4m3_to_f32 for all 256 codes in every lane position: rows of
 * S_ID codes starting at each code, at a row width that is whole 32-code
 * vectors and at one that leaves a scalar tail. The bf16 path (AVX-512
 * BF16) must give the value exactly as bf16, the f32 paths exactly. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "cpu_arch_util.h"
#include "kernels/core/family.h"
#include "test_dev_util.h"

/* Decodes n rows of S_ID codes to floats through the kernel's decode_row. */
static const char wrapper[] =
    "\nMT_CPU_KERNEL void decode_rows(const unsigned char *codes, float *out, int n)\n"
    "{\n"
    "    kb_t row[IDP];\n"
    "    for (int r = 0; r < n; r++) {\n"
    "        decode_row(codes + (long)r * S_ID, row, 1.0f);\n"
    "        for (int d = 0; d < S_ID; d++)\n"
    "            out[(long)r * S_ID + d] = KB_BF16 ? mt_bf16_to_f32((mt_bf16)row[d]) : (float)row[d];\n"
    "    }\n"
    "}\n";

static void check_width(const char *arch, int id)
{
    dev_device *d = open_cpu_arch(arch);
    if (!d)
        return;
    const char *kernel = kern_source_get("dsa_indexer.cpu");
    cr_assert_not_null(kernel);
    size_t len = strlen(kernel) + sizeof wrapper;
    char *src = malloc(len);
    cr_assert_not_null(src);
    snprintf(src, len, "%s%s", kernel, wrapper);
    char ids[16];
    snprintf(ids, sizeof ids, "%d", id);
    dev_define defs[] = {{"KV_FP8", "1"}, {"BT", "64"},     {"QB", "1"},       {"NT", "1"},
                         {"TK_NT", "1"},  {"S_IH", "32"},   {"S_ID", ids},     {"S_topk", "64"},
                         {"S_ps", "64"}};
    dev_module *m = td_build(d, "dsa_indexer_fp8_decode.c", src, defs,
                             (int)(sizeof defs / sizeof defs[0]), true);
    dev_kernel *k = td_kernel(m, "decode_rows", "ppi");
    int n = 256;
    size_t nc = (size_t)n * (size_t)id;
    unsigned char *codes = malloc(nc);
    float *got = malloc(nc * sizeof(float));
    cr_assert(codes && got);
    for (int r = 0; r < n; r++) /* row r starts at code r: every code in every lane */
        for (int i = 0; i < id; i++)
            codes[(size_t)r * (size_t)id + (size_t)i] = (unsigned char)(r + i);
    void *dc = td_alloc(d, nc), *dout = td_alloc(d, nc * sizeof(float));
    td_copy_to(d, dc, codes, nc);
    td_fill(d, dout, 0x5a, nc * sizeof(float)); /* poison */
    void *args[] = {&dc, &dout, &n};
    td_launch(d, k, (dev_dim3){1, 1, 1}, (dev_dim3){1, 1, 1}, 0, args);
    td_download(d, got, dout, nc * sizeof(float));
    for (size_t i = 0; i < nc; i++) {
        float want = mt_fp8e4m3_to_f32(codes[i]);
        if (isnan(want))
            cr_assert(isnan(got[i]), "--arch %s S_ID %d: code 0x%02x at lane %zu gave %g, want NaN",
                      arch ? arch : "native", id, codes[i], i % (size_t)id, got[i]);
        else
            cr_assert(memcmp(&got[i], &want, sizeof want) == 0,
                      "--arch %s S_ID %d: code 0x%02x at lane %zu gave %a, want %a",
                      arch ? arch : "native", id, codes[i], i % (size_t)id, got[i], want);
    }
    dev_free(d, dc);
    dev_free(d, dout);
    free(codes);
    free(got);
    free(src);
    dev_module_unload(m);
    dev_close(d);
}

static void check_arch(const char *arch)
{
    check_width(arch, 128); /* GLM-5.2's indexer head: whole vectors */
    check_width(arch, 72);  /* two vectors and a scalar tail */
}

Test(indexer_fp8_decode, native) { check_arch(NULL); }
Test(indexer_fp8_decode, x86_64_v4) { check_arch("x86-64-v4"); }
Test(indexer_fp8_decode, x86_64_v3) { check_arch("x86-64-v3"); }
Test(indexer_fp8_decode, x86_64_v2) { check_arch("x86-64-v2"); }
Test(indexer_fp8_decode, x86_64) { check_arch("x86-64"); }
