/* test_plan.c: the kernel plan (model/plan.h). The plan that config.json
 * alone gives is exactly the set of kernels model_runtime_open registers on
 * that checkpoint (read back from the runtime's selection report: family,
 * tuning key, purpose, order, and the last M bucket its largest M needs),
 * for the checkpoint's own activation quantization and for overrides of
 * act quant, KV dtype and max_batch_tokens; the options change the keys
 * and largest Ms as the runtime's layouts say (checked against values
 * computed here from the config); bad input is refused naming what. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/files.h"
#include "common/rng.h"
#include "model/format/config.h"
#include "model/plan/plan.h"
#include "model/runtime.h"
#include "model/format/tiny.h"
#include "tuner/tuner.h"
#include "test_tmp.h"

static char *tiny_dir(void)
{
    char *dir = tmp_dir_dup("mt_plan");
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tiny_write(dir, 3, &err), MT_OK, "%s", err.msg);
    return dir;
}

static void rm_dir(char *dir)
{
    tmp_rm_tree(dir);
    free(dir);
}

static model_config *load_config(const char *dir)
{
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    model_config *c = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_config_load(path, &c, &err), MT_OK, "%s", err.msg);
    return c;
}

static model_plan_entry *plan_of(const char *path, const model_plan_opts *o, int *n)
{
    model_plan_entry *e = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_kernel_plan(path, o, &e, n, &err), MT_OK, "%s", err.msg);
    cr_assert(*n > 0);
    return e;
}

static const model_plan_entry *find(const model_plan_entry *e, int n, const char *fam,
                                    const char *key)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(e[i].fam->name, fam) && !strcmp(e[i].key, key))
            return &e[i];
    return NULL;
}

/* The runtime's last M bucket for a kernel whose largest M is m. */
static int64_t last_bucket(int64_t m)
{
    for (int i = 0; i < tune_default_n_ms; i++)
        if (tune_default_ms[i] >= m)
            return tune_default_ms[i];
    return tune_default_ms[tune_default_n_ms - 1];
}

/* Opens the runtime on cpu with the plan's options and checks that its
 * selection report lists exactly the plan: same kernels in the same order,
 * each with its purpose and buckets up to the one its largest M needs. */
static void check_runtime_registers_plan(const char *dir, const model_plan_opts *po)
{
    int n = 0;
    model_plan_entry *plan = plan_of(dir, po, &n);
    FILE *quiet = fopen("/dev/null", "w");
    model_runtime_opts ro = {.model_dir = dir, .device = "cpu", .threads = 2,
                             .act_quant = po->act_quant, .act_quant_set = po->act_quant_set,
                             .kv_dtype = po->kv_dtype, .kv_pages = po->kv_pages,
                             .max_batch_tokens = po->max_batch_tokens, .log = quiet,
                             .speculative_steps = po->mtp ? 2 : 0};
    model_runtime *rt = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_runtime_open(&ro, &rt, &err), MT_OK, "%s", err.msg);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    model_runtime_report(rt, f);
    fclose(f);
    model_runtime_close(rt);
    fclose(quiet);

    int64_t *last = calloc((size_t)n, sizeof *last);
    int next = 0, kernels = -1;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (sscanf(line, "summary: %*d tuned, %*d nearest bucket, %*d other device, %*d stale, "
                         "%*d default (%d kernels", &kernels) == 1)
            continue;
        char fam[64], key[KERN_KEY_MAX];
        int used = 0;
        if (sscanf(line, "%63s %511s %n", fam, key, &used) != 2 || !kern_family_find(fam))
            continue; /* header lines */
        const model_plan_entry *e = find(plan, n, fam, key);
        cr_assert_not_null(e, "the runtime registered %s %s, which is not in the plan", fam,
                           key);
        int i = (int)(e - plan);
        if (!last[i]) {
            cr_assert_eq(i, next, "kernel %s %s registered as #%d, planned as #%d", fam, key,
                         next, i);
            next++;
        }
        const char *rest = line + used;
        cr_assert(!strncmp(rest, e->purpose, strlen(e->purpose)),
                  "%s %s: the runtime says '%s', the plan '%s'", fam, key, rest, e->purpose);
        char *end;
        int64_t m = strtoll(rest + strlen(e->purpose), &end, 10);
        cr_assert(end != rest + strlen(e->purpose) && m > last[i], "%s %s: bad M in '%s'", fam,
                  key, line);
        last[i] = m;
    }
    cr_assert_eq(next, n, "the runtime registered %d of the plan's %d kernels", next, n);
    cr_assert_eq(kernels, n, "the report counts %d kernels, the plan %d", kernels, n);
    for (int i = 0; i < n; i++)
        cr_assert_eq(last[i], last_bucket(plan[i].m_max),
                     "%s %s: largest M %" PRId64 " needs buckets up to %" PRId64 ", the runtime "
                     "has up to %" PRId64, plan[i].fam->name, plan[i].key, plan[i].m_max,
                     last_bucket(plan[i].m_max), last[i]);
    free(last);
    free(text);
    free(plan);
}

Test(model_plan, runtime_registers_exactly_the_plan_of_the_checkpoints_own_settings)
{
    char *dir = tiny_dir();
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    model_plan_opts po = {.kv_pages = 64,
                          .max_batch_tokens = 1 + (int)mt_rng_below(&r, 96)};
    cr_log_info("seed %llu, max_batch_tokens %d", (unsigned long long)seed,
                po.max_batch_tokens);
    check_runtime_registers_plan(dir, &po);
    rm_dir(dir);
}

Test(model_plan, runtime_registers_exactly_the_plan_with_overrides)
{
    char *dir = tiny_dir();
    model_plan_opts po = {.act_quant = MODEL_ACT_NONE, .act_quant_set = true,
                          .kv_dtype = KERN_DT_FP8E4M3, .kv_pages = 40, .max_batch_tokens = 24};
    check_runtime_registers_plan(dir, &po);
    rm_dir(dir);
}

/* Speculative decoding runs the MTP layer: `tune --model --mtp` lists its
 * kernels, so the runtime with --speculative-steps finds them tuned. */
Test(model_plan, runtime_with_speculation_registers_exactly_the_plan_with_mtp)
{
    char *dir = tiny_dir();
    model_plan_opts po = {.kv_pages = 64, .max_batch_tokens = 32, .mtp = true};
    int n_mtp = 0, n_plain = 0;
    free(plan_of(dir, &po, &n_mtp));
    po.mtp = false;
    free(plan_of(dir, &po, &n_plain));
    cr_assert_gt(n_mtp, n_plain, "the MTP layer adds kernels (eh_proj, its concat): %d vs %d",
                 n_mtp, n_plain);
    po.mtp = true;
    check_runtime_registers_plan(dir, &po);
    rm_dir(dir);
}

/* Values computed here from the config, as docs/ARCHITECTURE and rt_load.c
 * describe the layouts: the MoE GEMMs at the expert dims, the dense MLP's
 * fused gate/up, lm_head, the norms at hidden and the two latent ranks. */
Test(model_plan, keys_follow_the_config_and_the_options)
{
    char *dir = tiny_dir();
    model_config *c = load_config(dir);
    int n = 0;
    model_plan_entry *e = plan_of(dir, NULL, &n);
    char key[KERN_KEY_MAX];
    /* The tiny checkpoint's Quark config asks w4a4 for the routed experts;
     * the plan's default device is the cpu, whose integer tiles read the
     * experts grouped by 16 rows (wl=1), unlike a GPU's. */
    snprintf(key, sizeof key, "H=%" PRId64 ",I=%" PRId64 ",E=%" PRId64 ",topk=%" PRId64
             ",a=mxfp4,cat=1,wl=1", c->hidden_size, c->moe_intermediate_size,
             c->n_routed_experts, c->num_experts_per_tok);
    cr_assert_not_null(find(e, n, "moe_gemm_up", key), "no moe_gemm_up %s", key);
    {
        model_plan_opts hip = {.backend = DEV_BACKEND_HIP};
        int ng = 0;
        model_plan_entry *eg = plan_of(dir, &hip, &ng);
        key[strlen(key) - strlen(",wl=1")] = 0;
        cr_assert_not_null(find(eg, ng, "moe_gemm_up", key), "no moe_gemm_up %s on hip", key);
        free(eg);
    }
    snprintf(key, sizeof key, "N=%" PRId64 ",K=%" PRId64, 2 * c->intermediate_size,
             c->hidden_size);
    cr_assert_not_null(find(e, n, "gemm", key), "no dense gate/up gemm %s", key);
    snprintf(key, sizeof key, "N=%" PRId64 ",K=%" PRId64, c->vocab_size, c->hidden_size);
    const model_plan_entry *lm = find(e, n, "gemm", key);
    cr_assert_not_null(lm, "no lm_head gemm %s", key);
    cr_assert_str_eq(lm->purpose, "lm_head");
    int norms = 0;
    for (int i = 0; i < n; i++) {
        cr_assert_eq(e[i].m_max, strcmp(e[i].purpose, "q rope copy") ? 512
                                                                     : 512 * c->num_attention_heads,
                     "%s %s (%s): largest M %" PRId64, e[i].fam->name, e[i].key, e[i].purpose,
                     e[i].m_max);
        if (!strcmp(e[i].fam->name, "rmsnorm")) {
            int64_t nn = kern_shape_get(e[i].fam, &e[i].shape, "N");
            cr_assert(nn == c->hidden_size || nn == c->q_lora_rank || nn == c->kv_lora_rank,
                      "rmsnorm N=%" PRId64, nn);
            norms++;
        }
        for (int j = 0; j < i; j++)
            cr_assert(e[j].fam != e[i].fam || strcmp(e[j].key, e[i].key), "%s %s listed twice",
                      e[i].fam->name, e[i].key);
        /* The text with runtime dims parses back to the same shape. */
        kern_shape s;
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(kern_shape_parse(e[i].fam, e[i].shape_text, &s, NULL, &err), MT_OK, "%s",
                     err.msg);
        cr_assert(!memcmp(s.v, e[i].shape.v, sizeof s.v), "%s", e[i].shape_text);
    }
    cr_assert_eq(norms, 3);
    free(e);

    /* a16w4 and an fp8 cache: no key keeps mxfp4 activations or a bf16 cache. */
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    int T = 1 + (int)mt_rng_below(&r, 5000);
    model_plan_opts po = {.act_quant = MODEL_ACT_NONE, .act_quant_set = true,
                          .kv_dtype = KERN_DT_FP8E4M3, .max_batch_tokens = T};
    e = plan_of(dir, &po, &n);
    int fp8 = 0;
    for (int i = 0; i < n; i++) {
        cr_assert(!strstr(e[i].key, "a=mxfp4") && !strstr(e[i].key, "kv=bf16"),
                  "seed %llu: %s %s", (unsigned long long)seed, e[i].fam->name, e[i].key);
        fp8 += strstr(e[i].key, "kv=fp8") != NULL;
        int64_t want = strcmp(e[i].purpose, "q rope copy") ? T : (int64_t)T * c->num_attention_heads;
        cr_assert_eq(e[i].m_max, want, "seed %llu: %s %s: largest M %" PRId64 ", want %" PRId64,
                     (unsigned long long)seed, e[i].fam->name, e[i].key, e[i].m_max, want);
    }
    cr_assert(fp8 >= 3, "kv store, indexer and decode keys name the fp8 cache (%d)", fp8);
    snprintf(key, sizeof key, "H=%" PRId64 ",I=%" PRId64 ",E=%" PRId64 ",topk=%" PRId64
             ",a=bf16,comb=1,wl=1", c->hidden_size, c->moe_intermediate_size, c->n_routed_experts,
             c->num_experts_per_tok);
    cr_assert_not_null(find(e, n, "moe_gemm_down", key), "no moe_gemm_down %s", key);
    free(e);
    model_config_destroy(c);
    rm_dir(dir);
}

Test(model_plan, a_folder_and_its_config_path_give_the_same_plan)
{
    char *dir = tiny_dir();
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int n1 = 0, n2 = 0;
    model_plan_entry *a = plan_of(dir, NULL, &n1), *b = plan_of(path, NULL, &n2);
    cr_assert_eq(n1, n2);
    for (int i = 0; i < n1; i++) {
        cr_assert_eq(a[i].fam, b[i].fam);
        cr_assert_str_eq(a[i].shape_text, b[i].shape_text);
        cr_assert_eq(a[i].m_max, b[i].m_max);
    }
    free(a);
    free(b);
    rm_dir(dir);
}

/* Rewrites one key of dir/config.json (NULL value: removes it). */
static void set_key(const char *dir, const char *key, cJSON *value)
{
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = NULL;
    size_t len = 0;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(mt_file_read(path, &text, &len, &err), MT_OK, "%s", err.msg);
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    cr_assert_not_null(root);
    if (value)
        cJSON_ReplaceItemInObjectCaseSensitive(root, key, value);
    else
        cJSON_DeleteItemFromObjectCaseSensitive(root, key);
    char *out = cJSON_Print(root);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(out, f);
    fclose(f);
    free(out);
    cJSON_Delete(root);
}

Test(model_plan, bad_input_is_refused_naming_what)
{
    char *dir = tiny_dir();
    model_plan_entry *e = (model_plan_entry *)&e;
    int n = -1;
    mt_err err = MT_ERR_INIT;
    model_plan_opts po = {.kv_dtype = KERN_DT_F16};
    cr_assert_eq(model_kernel_plan(dir, &po, &e, &n, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "kv_dtype"), "%s", err.msg);
    cr_assert_null(e);
    cr_assert_eq(n, 0);
    po = (model_plan_opts){.max_batch_tokens = -3};
    cr_assert_eq(model_kernel_plan(dir, &po, &e, &n, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "max_batch_tokens"), "%s", err.msg);

    set_key(dir, "scoring_func", cJSON_CreateString("softmax"));
    cr_assert_eq(model_kernel_plan(dir, NULL, &e, &n, &err), MT_E_UNSUPPORTED);
    cr_assert(strstr(err.msg, "scoring_func") && strstr(err.msg, "config.json"), "%s", err.msg);
    set_key(dir, "scoring_func", cJSON_CreateString("sigmoid"));
    set_key(dir, "hidden_size", NULL);
    cr_assert_neq(model_kernel_plan(dir, NULL, &e, &n, &err), MT_OK);
    cr_assert(strstr(err.msg, "hidden_size"), "%s", err.msg);
    char missing[300];
    snprintf(missing, sizeof missing, "%s/nothing-here", dir);
    cr_assert_neq(model_kernel_plan(missing, NULL, &e, &n, &err), MT_OK);
    cr_assert(strstr(err.msg, "nothing-here"), "%s", err.msg);
    rm_dir(dir);
}
