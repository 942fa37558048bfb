/* test_mem_plan.c: `moetune plan` on GLM-5.2's config.json
 * (tests/fixtures/glm5.2-mxfp4-config.json) against a hand computation, for
 * 8 ranks with data-parallel and with tensor-parallel attention, and its
 * refusals of layouts that do not divide the model.
 *
 * The hand computation (H = 6144, 78 main layers + 1 MTP layer; MXFP4 is
 * 17/32 byte per weight: half a byte plus one E8M0 byte per 32):
 *   routed experts per rank: 256 / 8 = 32 experts x 3 x 2048 x 6144 weights
 *     = 1,207,959,552 weights per layer; 75 MoE layers in MXFP4
 *     (641,728,512 bytes each) + the MTP layer in bf16 (2,415,919,104)
 *     = 50,545,557,504 bytes;
 *   shared expert: 75 x 3 x 12,582,912 x 17/32 + 3 x 12,582,912 x 2
 *     = 1,504,051,200 + 75,497,472 = 1,579,548,672;
 *   router: 76 MoE layers x (256 x 6144 x 2 + 256 x 4) = 239,153,152;
 *   attention, bf16, per layer: norms 24,576, q_a 25,165,824, q_a norm
 *     4,096, q_b 67,108,864, kv_a 7,077,888, kv_a norm 1,024, kv_b
 *     29,360,128 twice (split per head for the absorbed path, whole for
 *     mla_prefill), o_proj 201,326,592 = 359,429,120; x 79 =
 *     28,394,900,480;
 *   indexer: full layers 0, 1, 2, 6, 10, ..., 74 (21) + MTP = 22, each
 *     wq_b 16,777,216 + wk 1,572,864 + weights_proj 393,216 + k_norm 512
 *     = 18,743,808; x 22 = 412,363,776;
 *   dense MLP, layers 0-2 in bf16: 3 x 3 x 12288 x 6144 x 2 = 1,358,954,496;
 *   embedding and lm_head, 154880 / 8 = 19360 rows each in bf16, plus the
 *     final norm: 2 x 237,895,680 + 12,288 = 475,803,648;
 *   MTP extra: eh_proj 6144 x 12288 x 2 + 3 norms = 151,031,808;
 *   total 83,157,313,536.
 * KV per token: 79 x 576 x 2 + 22 x 128 x 2 = 96,640 bytes.
 * Workspace, 512 tokens: 512 x 4 x (8 H + 2 x 8 x 4096 + 64 x 512 + 19360)
 *   = 341,639,168.
 * H200: 141e9 x 0.9 - weights - workspace = 43,401,047,296 bytes of KV,
 *   449,100 tokens per rank, 3,592,800 across 8 data-parallel ranks.
 * Tensor-parallel attention over 8: q_b, both kv_b, o_proj / 8 = 40,894,464
 *   plus the replicated 32,273,408 = 73,167,872 per layer, x 79 =
 *   5,780,261,888;
 *   dense MLP / 8 = 169,869,312. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/files.h"
#include "model/format/config.h"
#include "model/plan/mem_plan.h"
#include "test_tmp.h"

#define FIXTURE MOETUNE_SOURCE_DIR "/tests/fixtures/glm5.2-mxfp4-config.json"

static model_config *load(void)
{
    model_config *c = NULL;
    mt_err err = {0};
    cr_assert_eq(model_config_load(FIXTURE, &c, &err), MT_OK, "%s", err.msg);
    return c;
}

static double part(const mem_plan *p, mem_part k) { return p->part[k]; }

Test(mem_plan, glm52_on_8_ranks_matches_the_hand_computation)
{
    model_config *c = load();
    mem_plan p;
    mt_err err = {0};
    mem_plan_opts o = {.ranks = 8};
    cr_assert_eq(mem_plan_compute(c, &o, &p, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(p.experts_per_rank, 32);
    cr_assert_eq(part(&p, MEM_ROUTED_EXPERTS), 50545557504.0, "%.0f",
                 part(&p, MEM_ROUTED_EXPERTS));
    cr_assert_eq(part(&p, MEM_SHARED_EXPERTS), 1579548672.0, "%.0f",
                 part(&p, MEM_SHARED_EXPERTS));
    cr_assert_eq(part(&p, MEM_ROUTER), 239153152.0, "%.0f", part(&p, MEM_ROUTER));
    cr_assert_eq(part(&p, MEM_ATTENTION), 28394900480.0, "%.0f", part(&p, MEM_ATTENTION));
    cr_assert_eq(part(&p, MEM_INDEXER), 412363776.0, "%.0f", part(&p, MEM_INDEXER));
    cr_assert_eq(part(&p, MEM_DENSE_MLP), 1358954496.0, "%.0f", part(&p, MEM_DENSE_MLP));
    cr_assert_eq(part(&p, MEM_EMBED_HEAD), 475803648.0, "%.0f", part(&p, MEM_EMBED_HEAD));
    cr_assert_eq(part(&p, MEM_MTP_EXTRA), 151031808.0, "%.0f", part(&p, MEM_MTP_EXTRA));
    cr_assert_eq(p.weights, 83157313536.0, "%.0f", p.weights);
    cr_assert_eq(p.kv_per_token, 96640.0, "%.0f", p.kv_per_token);
    cr_assert_eq(p.workspace, 341639168.0, "%.0f", p.workspace);
    mem_fit h200 = mem_plan_fit(&p, "H200", 141e9);
    cr_assert_eq(h200.kv_tokens, 449100);
    cr_assert_eq(h200.kv_tokens_total, 3592800);
    model_config_destroy(c);
}

Test(mem_plan, tensor_parallel_attention_splits_heads_and_shares_the_cache)
{
    model_config *c = load();
    mem_plan p;
    mt_err err = {0};
    mem_plan_opts o = {.ranks = 8, .tp = 8};
    cr_assert_eq(mem_plan_compute(c, &o, &p, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(part(&p, MEM_ATTENTION), 5780261888.0, "%.0f", part(&p, MEM_ATTENTION));
    cr_assert_eq(part(&p, MEM_DENSE_MLP), 169869312.0, "%.0f", part(&p, MEM_DENSE_MLP));
    cr_assert_eq(part(&p, MEM_ROUTED_EXPERTS), 50545557504.0);
    mem_fit f = mem_plan_fit(&p, "H200", 141e9);
    cr_assert_eq(f.kv_tokens_total, f.kv_tokens, "one tensor-parallel group holds one cache");
    model_config_destroy(c);
}

Test(mem_plan, fp8_cache_halves_the_bytes_per_token)
{
    model_config *c = load();
    mem_plan p;
    mt_err err = {0};
    mem_plan_opts o = {.ranks = 8, .fp8_kv = true};
    cr_assert_eq(mem_plan_compute(c, &o, &p, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(p.kv_per_token, 48320.0, "%.0f", p.kv_per_token);
    model_config_destroy(c);
}

Test(mem_plan, one_rank_does_not_fit_an_h200)
{
    model_config *c = load();
    mem_plan p;
    mt_err err = {0};
    mem_plan_opts o = {.ranks = 1};
    cr_assert_eq(mem_plan_compute(c, &o, &p, &err), MT_OK, "%s", err.msg);
    cr_assert_gt(p.weights, 400e9, "all 256 experts on one device: %.0f", p.weights);
    mem_fit f = mem_plan_fit(&p, "H200", 141e9);
    cr_assert_lt(f.kv_bytes, 0);
    cr_assert_eq(f.kv_tokens, 0);
    model_config_destroy(c);
}

Test(mem_plan, layouts_that_do_not_divide_the_model_are_refused_by_name)
{
    model_config *c = load();
    mem_plan p;
    mt_err err = {0};
    mem_plan_opts o = {.ranks = 3};
    cr_assert_eq(mem_plan_compute(c, &o, &p, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "n_routed_experts"), "%s", err.msg);
    o = (mem_plan_opts){.ranks = 8, .ep = 3};
    cr_assert_eq(mem_plan_compute(c, &o, &p, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "--ep 3"), "%s", err.msg);
    o = (mem_plan_opts){.ranks = 8, .tp = 16};
    cr_assert_eq(mem_plan_compute(c, &o, &p, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "--tp 16"), "%s", err.msg);
    o = (mem_plan_opts){.ranks = 0};
    cr_assert_eq(mem_plan_compute(c, &o, &p, &err), MT_E_INVALID);
    model_config_destroy(c);
}

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

Test(mem_plan, cli_prints_the_same_plan_as_json)
{
    char dir[512];
    tmp_dir_make(dir, sizeof dir, "mem_plan");
    char path[4096], cmd[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t n = 0;
    char *text = NULL;
    mt_err err = {0};
    cr_assert_eq(mt_file_read(FIXTURE, &text, &n, &err), MT_OK, "%s", err.msg);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(text, 1, n, f), n);
    fclose(f);
    free(text);
    static char out[1 << 16];
    snprintf(cmd, sizeof cmd, "plan --model %s --ranks 8 --json", dir);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "%s", out);
    cJSON *w = cJSON_GetObjectItem(j, "weights_bytes");
    cr_assert_eq(cJSON_GetObjectItem(w, "total")->valuedouble, 83157313536.0);
    cJSON *devs = cJSON_GetObjectItem(j, "devices");
    bool saw = false;
    for (int i = 0; i < cJSON_GetArraySize(devs); i++) {
        cJSON *d = cJSON_GetArrayItem(devs, i);
        if (strcmp(cJSON_GetObjectItem(d, "device")->valuestring, "H200"))
            continue;
        saw = true;
        cr_assert_eq(cJSON_GetObjectItem(d, "kv_tokens_per_rank")->valuedouble, 449100.0);
    }
    cr_assert(saw, "no H200 row: %s", out);
    cJSON_Delete(j);
    snprintf(cmd, sizeof cmd, "plan --model %s --ranks 8 --ep 3", dir);
    cr_assert_eq(run(cmd, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "--ep 3"), "%s", out);
    cr_assert_eq(run("plan --ranks 8", out, sizeof out), 2, "%s", out);
}
