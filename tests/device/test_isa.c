/* test_isa.c: the instruction mix of AMD code objects (device/isa_mix.h)
 * and `moetune isa`: classification of mnemonics, counting, loops and the
 * hot loop on hand-written disassembly whose answers are known, then real
 * code objects from hipRTC (gfx90a) with and without matrix instructions,
 * refusal of non-AMD code, and the command's text, JSON and errors. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "device/hip/isa_mix.h"
#include "kernels/core/exec.h"
#include "kernels/core/family.h"
#include "test_run_cli.h"

Test(isa_mix, mnemonics_fall_in_their_classes)
{
    static const struct {
        const char *m;
        dev_isa_class c;
    } cases[] = {
        {"v_mfma_f32_16x16x16bf16_1k", DEV_ISA_MFMA}, {"v_mfma_f32_32x32x8bf16_1k", DEV_ISA_MFMA},
        {"v_smfmac_f32_16x16x32_bf16", DEV_ISA_MFMA}, {"v_fma_f32", DEV_ISA_VALU},
        {"v_cvt_f32_u32_e32", DEV_ISA_VALU},          {"s_add_i32", DEV_ISA_SALU},
        {"s_load_dwordx4", DEV_ISA_SMEM},             {"s_buffer_load_dword", DEV_ISA_SMEM},
        {"global_load_dwordx4", DEV_ISA_GLOBAL_LOAD}, {"buffer_load_ubyte", DEV_ISA_GLOBAL_LOAD},
        {"flat_load_dword", DEV_ISA_GLOBAL_LOAD},     {"global_store_dword", DEV_ISA_GLOBAL_STORE},
        {"global_atomic_add_f32", DEV_ISA_ATOMIC},    {"ds_read_b128", DEV_ISA_LDS_READ},
        {"ds_load_b64", DEV_ISA_LDS_READ},            {"ds_write_b32", DEV_ISA_LDS_WRITE},
        {"ds_swizzle_b32", DEV_ISA_LDS_OTHER},        {"scratch_store_dword", DEV_ISA_SCRATCH},
        {"s_waitcnt", DEV_ISA_WAIT},                  {"s_barrier", DEV_ISA_BARRIER},
        {"s_cbranch_scc1", DEV_ISA_BRANCH},           {"s_branch", DEV_ISA_BRANCH},
        {"s_swappc_b64", DEV_ISA_BRANCH},             {"s_endpgm", DEV_ISA_SALU},
        {"image_sample", DEV_ISA_OTHER},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_eq(dev_isa_classify(cases[i].m), cases[i].c, "%s: %s", cases[i].m,
                     dev_isa_class_name(dev_isa_classify(cases[i].m)));
}

/* Two functions: k1 with an outer loop (0x10..0x3c) around an inner one
 * (0x18..0x30) holding the matrix instructions, and a forward branch that
 * is no loop; k2 with one loop and no matrix instruction. */
static const char *const DISASM =
    "\n"
    "x.co:\tfile format elf64-amdgpu\n"
    "\n"
    "Disassembly of section .text:\n"
    "\n"
    "0000000000001000 <k1>:\n"
    "\ts_load_dwordx4 s[0:3], s[4:5], 0x0      // 000000001000: C00A0002 00000000\n"
    "\ts_waitcnt lgkmcnt(0)                    // 000000001008: BF8CC07F\n"
    "\ts_cbranch_scc1 9                        // 00000000100C: BF850009 <k1+0x34>\n"
    "\tv_mov_b32_e32 v0, 0                     // 000000001010: 7E000280\n"
    "\tglobal_load_dwordx4 v[0:3], v[4:5], off // 000000001014: DC5C8000 007F0004\n"
    "\tds_read_b128 v[8:11], v1                // 000000001018: D9FE0000 08000001\n"
    "\tv_mfma_f32_16x16x16bf16_1k a[0:3], v[8:9], v[10:11], a[0:3] // 000000001020: D3E10000 04021508\n"
    "\tv_mfma_f32_16x16x16bf16_1k a[0:3], v[8:9], v[10:11], a[0:3] // 000000001028: D3E10000 04021508\n"
    "\ts_cbranch_vccnz 65529                   // 000000001030: BF87FFF9 <k1+0x18>\n"
    "\ts_barrier                               // 000000001034: BF8A0000\n"
    "\ts_cbranch_scc0 65525                    // 000000001038: BF84FFF5 <k1+0x10>\n"
    "\tglobal_store_dwordx4 v[4:5], v[0:3], off // 00000000103C: DC7C8000 00000004\n"
    "\ts_endpgm                                // 000000001044: BF810000\n"
    "\n"
    "0000000000002000 <k2>:\n"
    "\tv_add_f32_e32 v0, v1, v2                // 000000002000: 02000501\n"
    "\tv_add_f32_e32 v0, v1, v2                // 000000002004: 02000501\n"
    "\ts_cbranch_scc1 65534                    // 000000002008: BF85FFFE <k2+0x4>\n"
    "\ts_endpgm                                // 00000000200C: BF810000\n"
    "\n"
    "0000000000004000 <k4>:\n"
    "\tglobal_load_dwordx4 v[0:3], v[4:5], off // 000000004000: DC5C8000 007F0004\n"
    "\ts_waitcnt vmcnt(0) lgkmcnt(0)           // 000000004008: BF8C0070\n"
    "\tv_mfma_f32_16x16x16bf16_1k a[0:3], v[8:9], v[10:11], a[0:3] // 00000000400C: D3E10000 04021508\n"
    "\ts_waitcnt vmcnt(0)                      // 000000004014: BF8C0F70\n"
    "\ts_cbranch_scc0 65531                    // 000000004018: BF84FFFB <k4>\n"
    "\ts_endpgm                                // 00000000401C: BF810000\n"
    "\n"
    "0000000000003000 <k3>:\n"
    "\tglobal_load_dwordx4 v[0:3], v[4:5], off // 000000003000: DC5C8000 007F0004\n"
    "\tv_add_f32_e32 v0, v1, v2                // 000000003008: 02000501\n"
    "\tv_add_f32_e32 v0, v1, v2                // 00000000300C: 02000501\n"
    "\tv_add_f32_e32 v0, v1, v2                // 000000003010: 02000501\n"
    "\tv_add_f32_e32 v0, v1, v2                // 000000003014: 02000501\n"
    "\tglobal_load_dwordx4 v[0:3], v[4:5], off // 000000003018: DC5C8000 007F0004\n"
    "\tglobal_load_dword v6, v[4:5], off       // 000000003020: DC508000 067F0004\n"
    "\tv_fma_f32 v0, v1, v2, v3                // 000000003028: D1CB0000 040E0501\n"
    "\ts_cbranch_vccnz 65531                   // 000000003030: BF87FFFB <k3+0x18>\n"
    "\ts_cbranch_scc0 65522                    // 000000003034: BF84FFF2 <k3>\n"
    "\ts_endpgm                                // 000000003038: BF810000\n";

Test(isa_mix, functions_loops_and_the_hot_loop_are_found)
{
    dev_isa_report r;
    dev_isa_parse(DISASM, &r);
    cr_assert_eq(r.n_funcs, 4);
    const dev_isa_func *k1 = dev_isa_find(&r, "k1"), *k2 = dev_isa_find(&r, "k2");
    cr_assert(k1 && k2);
    cr_assert_eq(k1->all.total, 13);
    cr_assert_eq(k1->all.n[DEV_ISA_MFMA], 2);
    cr_assert_eq(k1->all.n[DEV_ISA_BRANCH], 3);
    cr_assert_eq(k1->all.n[DEV_ISA_SMEM], 1);
    cr_assert_eq(k1->all.n[DEV_ISA_GLOBAL_STORE], 1);
    cr_assert_eq(k1->n_mma_kinds, 1);
    cr_assert_str_eq(k1->mma_kind[0], "v_mfma_f32_16x16x16bf16_1k");
    cr_assert_eq(k1->mma_kind_n[0], 2);
    cr_assert_eq(k1->n_loops, 2, "the forward branch is no loop");
    cr_assert_geq(k1->hot, 0);
    const dev_isa_loop *hot = &k1->loops[k1->hot];
    /* The inner loop: ds_read, two mfma, the branch back. */
    cr_assert_eq(hot->c.total, 4);
    cr_assert_eq(hot->c.n[DEV_ISA_MFMA], 2);
    cr_assert_eq(hot->c.n[DEV_ISA_LDS_READ], 1);
    cr_assert_eq(hot->depth, 2);
    cr_assert_eq(hot->vm0_before_mma, 0);
    const dev_isa_loop *outer = &k1->loops[1 - k1->hot];
    cr_assert_eq(outer->depth, 1);
    cr_assert_eq(outer->c.total, 8);
    cr_assert_eq(k2->all.total, 4);
    cr_assert_eq(k2->n_loops, 1);
    cr_assert_eq(k2->hot, 0, "without matrix instructions the largest loop is hot");
    cr_assert_eq(k2->loops[0].c.n[DEV_ISA_VALU], 1);
    /* k3: an outer pass (activation loads and their decode) around the
     * weight stream: the stream is hot, though the pass is larger. */
    const dev_isa_func *k3 = dev_isa_find(&r, "k3");
    cr_assert_not_null(k3);
    cr_assert_eq(k3->n_loops, 2);
    cr_assert_geq(k3->hot, 0);
    cr_assert_eq(k3->loops[k3->hot].depth, 2, "the inner loop streams");
    cr_assert_eq(k3->loops[k3->hot].c.n[DEV_ISA_GLOBAL_LOAD], 2);
    /* k4: the loop waits for its own load before its matrix instruction
     * (the wait after it does not count) */
    const dev_isa_func *k4 = dev_isa_find(&r, "k4");
    cr_assert_not_null(k4);
    cr_assert_eq(k4->n_loops, 1);
    cr_assert_eq(k4->loops[0].vm0_before_mma, 1);
    /* Nothing to count. */
    dev_isa_parse("", &r);
    cr_assert_eq(r.n_funcs, 0);
    dev_isa_parse("garbage\n\tv_mov_b32 v0, 0\n0000 <x>\n", &r);
    cr_assert_eq(r.n_funcs, 0);
}

Test(isa_mix, non_amd_code_is_refused)
{
    dev_isa_report r;
    mt_err err = MT_ERR_INIT;
    static const unsigned char cubin_like[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0x33, 0, 0,
                                                 0,    0,   0,   0,   0, 0, 2, 0,    190, 0};
    cr_assert_eq(dev_isa_mix(cubin_like, sizeof cubin_like, "gfx90a", &r, &err), MT_E_UNSUPPORTED);
    cr_assert(strstr(err.msg, "not AMD"), "%s", err.msg);
    cr_assert_eq(dev_isa_mix("text", 4, "gfx90a", &r, &err), MT_E_UNSUPPORTED);
}

static dev_device *hip_or_skip(const char *arch)
{
    dev_open_opts o = {.arch = arch};
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = dev_open("hip", &o, &d, &err);
    if (st == MT_E_UNSUPPORTED || st == MT_E_NOT_FOUND)
        cr_skip_test("hip %s: %s", arch, err.msg);
    cr_assert_eq(st, MT_OK, "%s", err.msg);
    return d;
}

/* gemm on gfx90a through hipRTC: MMA=1's K loop holds its MFMAs, MMA=0
 * has none; no scratch either way. */
Test(isa_mix, hiprtc_gemm_code_objects_are_counted, .timeout = 300)
{
    dev_device *d = hip_or_skip("gfx90a");
    const kern_family *f = kern_family_find("gemm");
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, "tiny", &s, NULL, NULL), MT_OK);
    static const char *const cfgs[2] = {"BM=64,BN=64,BK=32,TM=2,TN=2,SPLITK=1,MMA=0",
                                        "BM=64,BN=64,BK=32,TM=2,TN=2,SPLITK=1,MMA=1"};
    for (int mma = 0; mma < 2; mma++) {
        kern_config c;
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(kern_config_parse(f->gpu, cfgs[mma], &c, &err), MT_OK, "%s", err.msg);
        dev_code *code = NULL;
        cr_assert_eq(kern_compile(d, f, f->gpu, &s, &c, &code, &err), MT_OK, "%s", err.msg);
        size_t len = 0;
        const void *bytes = dev_code_get_bytes(code, &len);
        dev_isa_report r;
        mt_status st = dev_isa_mix(bytes, len, "gfx90a", &r, &err);
        if (st == MT_E_UNSUPPORTED) {
            dev_code_free(code);
            dev_close(d);
            cr_skip_test("%s", err.msg);
        }
        cr_assert_eq(st, MT_OK, "%s", err.msg);
        const dev_isa_func *fn = dev_isa_find(&r, "gemm_bf16");
        cr_assert_not_null(fn, "no gemm_bf16 among %d functions", r.n_funcs);
        cr_assert_eq(fn->all.n[DEV_ISA_SCRATCH], 0);
        cr_assert_gt(fn->all.n[DEV_ISA_GLOBAL_LOAD], 0);
        cr_assert_gt(fn->n_loops, 0);
        cr_assert_geq(fn->hot, 0);
        if (mma) {
            cr_assert_gt(fn->loops[fn->hot].c.n[DEV_ISA_MFMA], 0, "%s", cfgs[mma]);
            cr_assert_eq(fn->loops[fn->hot].c.n[DEV_ISA_MFMA], fn->all.n[DEV_ISA_MFMA],
                         "every MFMA is in the K loop");
        } else {
            cr_assert_eq(fn->all.n[DEV_ISA_MFMA], 0, "%s", cfgs[mma]);
        }
        dev_code_free(code);
    }
    dev_close(d);
}

static int run_cli(const char *args, char **out)
{
    return test_run_cli("isa", args, out);
}

Test(isa_cli, json_names_the_hot_loop_and_bad_input_is_a_usage_error, .timeout = 300)
{
    char *out = NULL;
    int rc = run_cli("--family gemm --shape tiny --m 64 --arch gfx90a --json "
                     "--config BM=64,BN=64,BK=32,TM=2,TN=2,SPLITK=1,MMA=1", &out);
    if (rc != 0 && strstr(out, "hip"))
        cr_log_info("moetune isa on gfx90a: %s", out);
    if (rc == 0) {
        cJSON *j = cJSON_Parse(out);
        cr_assert_not_null(j, "%s", out);
        cJSON *k = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "kernels"), 0);
        cr_assert_not_null(k, "%s", out);
        cJSON *hot = cJSON_GetObjectItem(k, "hot_loop");
        if (hot) /* absent only without llvm-objdump */
            cr_assert_gt(cJSON_GetObjectItem(hot, "mfma")->valueint, 0, "%s", out);
        else
            cr_assert_not_null(cJSON_GetObjectItem(j, "mix_unavailable"), "%s", out);
        cr_assert_eq(cJSON_GetObjectItem(k, "scratch_bytes")->valueint, 0);
        cJSON_Delete(j);
    }
    free(out);
    static const char *const bad[] = {
        "--family no_such_family --arch gfx90a", "--family gemm --m 0 --arch gfx90a",
        "--family gemm --arch gfx90a --config BM=3", "--shape tiny", "--family gemm --bogus"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = run_cli(bad[i], &out);
        cr_assert(rc == 1 || rc == 2, "%s: exit %d\n%s", bad[i], rc, out);
        cr_assert(strstr(out, "isa"), "%s: %s", bad[i], out);
        free(out);
    }
}

/* A kernel with many loops keeps them all (the cap once hid the K loop of
 * moe_gemm_down, the 17th backward branch): 40 one-instruction loops, the
 * last with the only MFMA, which must be the hot one. */
Test(isa_mix, many_loops_are_all_kept)
{
    size_t cap = 1 << 16, n = 0;
    char *t = malloc(cap);
    n += (size_t)snprintf(t + n, cap - n, "0000000000001000 <big>:\n");
    uint64_t a = 0x1000;
    for (int l = 0; l < 40; l++) {
        uint64_t top = a;
        n += (size_t)snprintf(t + n, cap - n, "\t%s v0, v1 // %012llX: 00000000\n",
                              l == 39 ? "v_mfma_f32_16x16x16bf16_1k" : "v_add_f32_e32",
                              (unsigned long long)a);
        a += 4;
        n += (size_t)snprintf(t + n, cap - n, "\ts_cbranch_scc1 65535 // %012llX: BF85FFFF "
                              "<big+0x%llx>\n", (unsigned long long)a,
                              (unsigned long long)(top - 0x1000));
        a += 4;
    }
    dev_isa_report r;
    dev_isa_parse(t, &r);
    free(t);
    cr_assert_eq(r.n_funcs, 1);
    cr_assert_eq(r.funcs[0].n_loops, 40);
    cr_assert_eq(r.funcs[0].hot, 39);
    cr_assert_eq(r.funcs[0].loops[39].c.n[DEV_ISA_MFMA], 1);
}
