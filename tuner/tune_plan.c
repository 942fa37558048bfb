/* tune_plan.c: from a model's config.json to the (family, shape, M) jobs
 * the model needs (`moetune tune --model DIR`). Only config.json is read:
 * no weights, no tokenizer. The MoE layer of the GLM-5 family needs the
 * router, the token-to-expert alignment and the two expert GEMMs at
 * (H, I, E, topk); every layer needs RMSNorm at the hidden size, and the
 * attention's low-rank projections need it at q_lora_rank and kv_lora_rank.
 * Dims the config does not set (data types, layout switches) keep the
 * family's "glm5.2" preset values, else its first preset's. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/files.h"
#include "tuner.h"

typedef struct dim_map {
    const char *dim;     /* family dim name */
    const char *key;     /* config.json key */
} dim_map;

static const dim_map moe_dims[] = {
    {"H", "hidden_size"},
    {"I", "moe_intermediate_size"},
    {"E", "n_routed_experts"},
    {"topk", "num_experts_per_tok"},
    {NULL, NULL},
};

typedef struct plan_entry {
    const char *family;
    const dim_map *dims;
    const char *norm_key; /* rmsnorm: the config key giving N */
} plan_entry;

static const plan_entry plan[] = {
    {"moe_route", moe_dims, NULL},
    {"moe_align", moe_dims, NULL},
    {"moe_gemm_up", moe_dims, NULL},
    {"moe_gemm_down", moe_dims, NULL},
    {"rmsnorm", NULL, "hidden_size"},
    {"rmsnorm", NULL, "q_lora_rank"},
    {"rmsnorm", NULL, "kv_lora_rank"},
};

static int dim_index(const kern_family *f, const char *name)
{
    for (int i = 0; i < f->n_dims; i++)
        if (!strcmp(f->dims[i].name, name))
            return i;
    return -1;
}

static mt_status get_int(const cJSON *root, const char *path, const char *key, bool required,
                         int64_t *out, mt_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v) {
        if (required)
            return mt_fail(err, MT_E_FORMAT, "%s: key \"%s\" is missing", path, key);
        return MT_E_NOT_FOUND;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1)
        return mt_fail(err, MT_E_FORMAT, "%s: \"%s\" must be a positive integer", path, key);
    *out = (int64_t)v->valuedouble;
    return MT_OK;
}

static void append(char *list, size_t cap, const char *name)
{
    if (!list || !cap || strstr(list, name))
        return;
    size_t l = strlen(list);
    snprintf(list + l, cap - l, "%s%s", l ? "," : "", name);
}

/* The family's base shape: its "glm5.2" preset, else its first. */
static mt_status base_shape(const kern_family *f, kern_shape *s, mt_err *err)
{
    const char *name = f->n_presets ? f->presets[0].name : "";
    for (int i = 0; i < f->n_presets; i++)
        if (!strcmp(f->presets[i].name, "glm5.2"))
            name = "glm5.2";
    return kern_shape_parse(f, name, s, NULL, err);
}

/* Re-parses the key so the family's range checks apply to config values. */
static mt_status finish(const kern_family *f, const kern_shape *s, const char *path,
                        const int64_t *ms, int n_m, tune_job *job, mt_err *err)
{
    char key[KERN_KEY_MAX];
    kern_shape_key(f, s, true, key, sizeof key);
    mt_status st = tune_job_make(f, key, ms, n_m, job, err);
    if (st != MT_OK)
        mt_err_prefix(err, "%s: %s shape from the config", path, f->name);
    return st;
}

mt_status tune_plan_from_config(const char *path, const int64_t *ms, int n_m, tune_job *jobs,
                                int cap, int *n_jobs, char *missing, size_t missing_cap,
                                mt_err *err)
{
    *n_jobs = 0;
    if (missing && missing_cap)
        missing[0] = 0;
    char *text = NULL;
    size_t len = 0;
    mt_status st = mt_file_read(path, &text, &len, err);
    if (st != MT_OK)
        return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return mt_fail(err, MT_E_FORMAT, "%s: not a JSON object", path);
    }
    double eps = NAN;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "rms_norm_eps");
    if (cJSON_IsNumber(e) && e->valuedouble > 0)
        eps = e->valuedouble;
    for (size_t pi = 0; pi < sizeof plan / sizeof plan[0] && st == MT_OK; pi++) {
        const plan_entry *pe = &plan[pi];
        const kern_family *f = kern_family_find(pe->family);
        if (!f) {
            append(missing, missing_cap, pe->family);
            continue;
        }
        kern_shape s;
        st = base_shape(f, &s, err);
        if (st != MT_OK)
            break;
        if (pe->dims) {
            for (const dim_map *d = pe->dims; d->dim && st == MT_OK; d++) {
                int di = dim_index(f, d->dim);
                int64_t v = 0;
                st = get_int(root, path, d->key, true, &v, err);
                if (st == MT_OK && di >= 0)
                    s.v[di] = v;
            }
        } else {
            int64_t n = 0;
            st = get_int(root, path, pe->norm_key, !strcmp(pe->norm_key, "hidden_size"), &n, err);
            if (st == MT_E_NOT_FOUND) {
                st = MT_OK; /* optional (lora ranks) */
                continue;
            }
            int di = dim_index(f, "N");
            if (st == MT_OK && di >= 0)
                s.v[di] = n;
            int ei = dim_index(f, "eps_e");
            if (st == MT_OK && ei >= 0 && isfinite(eps)) {
                long ee = lround(-log10(eps));
                if (ee >= f->dims[ei].min && ee <= f->dims[ei].max)
                    s.v[ei] = ee;
            }
        }
        if (st != MT_OK)
            break;
        bool dup = false;
        char key[KERN_KEY_MAX], other[KERN_KEY_MAX];
        kern_shape_key(f, &s, false, key, sizeof key);
        for (int j = 0; j < *n_jobs && !dup; j++) {
            kern_shape_key(jobs[j].fam, &jobs[j].shape, false, other, sizeof other);
            dup = jobs[j].fam == f && !strcmp(key, other);
        }
        if (dup)
            continue;
        if (*n_jobs >= cap) {
            st = mt_fail(err, MT_E_INVALID, "%s: more than %d jobs", path, cap);
            break;
        }
        st = finish(f, &s, path, ms, n_m, &jobs[*n_jobs], err);
        if (st == MT_OK)
            (*n_jobs)++;
    }
    cJSON_Delete(root);
    return st;
}
