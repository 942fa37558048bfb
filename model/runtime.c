/* runtime.c: opening and closing the model runtime (runtime.h) and its
 * accessors. Sequences are in rt_seq.c, the forward pass in rt_forward.c,
 * the step driver in rt_driver.c, kernel selection by the kernel set
 * (kset.c), weight upload in rt_load.c.
 *
 * KV cache: one kvcache per layer (latent, plus indexer keys on layers that
 * run their own indexer). Every sequence has one kvc_seq per layer, and
 * every operation is applied to all layers in the same order, so the
 * caches hand out the same page ids: one page table serves every layer
 * (rt_forward.c checks this after each reservation). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rt_impl.h"

static int eps_exponent(model_runtime *rt, double eps, const char *what)
{
    bool exact;
    int e = model_plan_eps_exponent(eps, &exact);
    if (!exact)
        fprintf(rt->log, "warning: %s eps %g is not a power of ten; the rmsnorm kernels run "
                "eps 1e-%d\n", what, eps, e);
    return e;
}

void model_runtime_plan_opts(const model_runtime_opts *ro, model_plan_opts *out)
{
    *out = (model_plan_opts){.act_quant = ro->act_quant, .act_quant_set = ro->act_quant_set,
                             .kv_dtype = ro->kv_dtype, .kv_page_size = ro->kv_page_size,
                             .kv_pages = ro->kv_pages, .max_batch_tokens = ro->max_batch_tokens,
                             .mtp = ro->speculative_steps > 0, .ep_runtime = ro->comm != NULL};
    int size = ro->comm ? mt_comm_size(ro->comm) : 0;
    int group = ro->tp && ro->comm ? (ro->tp_size > 0 ? ro->tp_size : size) : 0;
    if (group > 1) { /* the plan of this rank's place in its group */
        out->tp_ranks = group;
        out->tp_rank = mt_comm_rank(ro->comm) % group;
    }
    bool groups = group <= 1 || (group < size && size % group == 0);
    if (size > 1 && ((ro->dp && ro->comm_lead && groups) || (!ro->dp && group <= 1))) {
        /* data-parallel ranks or groups, or expert-parallel ranks alone,
         * split the vocabulary over the whole job (rt_vp.c) */
        out->vocab_ranks = size;
        out->vocab_rank = mt_comm_rank(ro->comm);
    }
}

static const char *act_desc(kern_dtype act)
{
    return act == KERN_DT_I8      ? "a8w4 (int8 activations)"
           : act == KERN_DT_MXFP4 ? "a4w4 (MXFP4 activations)"
                                  : "a16w4 (bf16 activations)";
}

/* The --act-quant spelling of an expert GEMM activation dtype. */
static const char *act_option(kern_dtype act)
{
    for (int q = 0; q < MODEL_ACT_COUNT; q++)
        if (model_act_quant_dtype((model_act_quant)q) == act)
            return model_act_quant_name((model_act_quant)q);
    return "?";
}

/* The expert GEMMs' activation dtype must have kernels on this device (a8w4
 * has cpu kernels only): a refused default config fails the load here,
 * naming the device and the option, instead of running another dtype. */
static mt_status check_expert_act(model_runtime *rt, mt_err *err)
{
    const model_plan *p = rt->plan;
    for (int i = 0; i < p->n_entries; i++) {
        const model_plan_entry *e = &p->entries[i];
        if (strcmp(e->fam->name, "moe_gemm_up") && strcmp(e->fam->name, "moe_gemm_down"))
            continue;
        const kern_impl *im = kern_family_impl(e->fam, rt->props->backend);
        char why[160] = "no implementation for this backend";
        kern_config cfg;
        if (im) {
            im->default_config(&e->shape, 1, rt->props, &cfg);
            if (kern_config_valid(e->fam, im, &e->shape, 1, &cfg, rt->props, why, sizeof why))
                continue;
        }
        return mt_fail(err, MT_E_UNSUPPORTED, "device %s (%s): experts %s (--act-quant %s) "
                       "cannot run here: %s %s: %s", rt->props->spec, rt->props->name,
                       act_desc(p->p.act), act_option(p->p.act), e->fam->name, e->key, why);
    }
    return MT_OK;
}

/* Warnings only: what the runtime cannot run fails model_plan_build. */
static void check_config(model_runtime *rt)
{
    const model_config *c = rt->cfg;
    if (!c->rope_interleave || !c->indexer_rope_interleave)
        fprintf(rt->log, "warning: config asks for half-split RoPE; the kernels rotate "
                "interleaved pairs\n");
}

static mt_status open_db(model_runtime *rt, mt_err *err)
{
    struct stat sb;
    if (stat(rt->o.db_path, &sb) != 0)
        return mt_fail(err, MT_E_IO, "tuning database %s does not exist", rt->o.db_path);
    mt_err e2 = MT_ERR_INIT;
    if (db_open(rt->o.db_path, DB_OPEN_NOCREATE, &rt->db, &e2) == MT_OK)
        return MT_OK;
    /* A database we may not write still serves lookups (misses are not recorded). */
    mt_status st = db_open(rt->o.db_path, DB_OPEN_READONLY, &rt->db, err);
    if (st == MT_OK)
        fprintf(rt->log, "warning: %s opened read-only (%s): misses are not recorded\n",
                rt->o.db_path, e2.msg);
    return st;
}

static mt_status load_tokenizer(model_runtime *rt, mt_err *err)
{
    size_t n = strlen(rt->o.model_dir) + 32;
    char *path = malloc(n);
    if (!path)
        return mt_fail(err, MT_E_NOMEM, "tokenizer path");
    snprintf(path, n, "%s/tokenizer.json", rt->o.model_dir);
    struct stat sb;
    mt_status st = MT_OK;
    if (stat(path, &sb) == 0)
        st = model_tokenizer_load(path, &rt->tok, err);
    free(path);
    return st;
}

static mt_status setup(model_runtime *rt, mt_err *err)
{
    const model_runtime_opts *o = &rt->o;
    if (!o->model_dir)
        return mt_fail(err, MT_E_INVALID, "runtime: no model directory");
    dev_open_opts dopt = {.threads = o->threads};
    mt_status st = dev_open(o->device ? o->device : "auto", &dopt, &rt->dev, err);
    if (st != MT_OK)
        return st;
    rt->props = dev_get_props(rt->dev);
    if (rt->props->compile_only)
        return mt_fail(err, MT_E_UNSUPPORTED, "device %s is compile-only (no GPU present)",
                       rt->props->spec);
    if ((st = model_weights_open(o->model_dir, &rt->w, err)) != MT_OK)
        return st;
    rt->cfg = model_weights_config(rt->w);
    if ((st = load_tokenizer(rt, err)) != MT_OK)
        return st;
    check_config(rt);
    const model_config *c = rt->cfg;
    /* The kernel plan decides the settings and the kernels (plan.h). */
    model_plan_opts po;
    model_runtime_plan_opts(o, &po);
    po.weights = rt->w;
    po.backend = rt->props->backend;
    if ((st = model_plan_build(c, &po, &rt->plan, err)) != MT_OK)
        return st;
    const model_plan_params *pp = &rt->plan->p;
    rt->H = c->hidden_size;
    rt->V = c->vocab_size;
    rt->NH = c->num_attention_heads;
    rt->QL = c->q_lora_rank;
    rt->L = c->kv_lora_rank;
    rt->R = c->qk_rope_head_dim;
    rt->D = c->qk_nope_head_dim;
    rt->VD = c->v_head_dim;
    rt->IH = c->index_n_heads;
    rt->ID = c->index_head_dim;
    rt->TOPK = c->index_topk;
    rt->E = c->n_routed_experts;
    rt->TOPKE = c->num_experts_per_tok;
    rt->IE = c->moe_intermediate_size;
    rt->n_layers = c->num_hidden_layers; /* the MTP layer, when loaded, is layers[n_layers] */
    rt->eps_e = eps_exponent(rt, c->rms_norm_eps, "rms_norm_eps");
    rt->eps6_e = pp->eps6_e;
    rt->act = pp->act;
    rt->kv_dtype = (kern_dtype)pp->kv_dtype;
    rt->ps = pp->ps;
    rt->n_pages = pp->n_pages;
    rt->max_ctx = pp->max_ctx;
    rt->T = pp->T;
    if (o->db_path && (st = open_db(rt, err)) != MT_OK)
        return st;
    fprintf(rt->log, "model %s: %" PRId64 " layers, hidden %" PRId64 ", %" PRId64
            " experts top-%" PRId64 ", vocab %" PRId64 "; device %s (%s); experts %s; kv cache "
            "%s, %" PRId64 " pages of %d tokens; max context %" PRId64 "\n",
            o->model_dir, rt->n_layers, rt->H, rt->E, rt->TOPKE, rt->V, rt->props->spec,
            rt->props->name, act_desc(rt->act),
            kern_dtype_name(rt->kv_dtype), rt->n_pages, rt->ps, rt->max_ctx);
    if (o->speculative_steps < 0 || o->speculative_steps > MODEL_SPEC_MAX_STEPS)
        return mt_fail(err, MT_E_INVALID, "speculative_steps %d: 0 (off) to %d",
                       o->speculative_steps, MODEL_SPEC_MAX_STEPS);
    if ((st = check_expert_act(rt, err)) != MT_OK)
        return st;
    if ((st = rt_load(rt, err)) != MT_OK || (st = model_kset_select(rt->ks, err)) != MT_OK ||
        (st = rt_bufs_alloc(rt, err)) != MT_OK || (st = rt_tp_bufs_alloc(rt, err)) != MT_OK ||
        (st = rt_mtp_load(rt, err)) != MT_OK || (st = rt_dp_open(rt, err)) != MT_OK ||
        (st = rt_vp_open(rt, err)) != MT_OK)
        return st;
    size_t stage = (size_t)rt->T * (size_t)(rt->TOPK > 8 ? rt->TOPK : 8) +
                   (size_t)(rt->b.table_entries);
    rt->h_i32 = malloc(sizeof(int32_t) * stage);
    if (!rt->h_i32)
        return mt_fail(err, MT_E_NOMEM, "runtime staging");
    return MT_OK;
}

mt_status model_runtime_open(const model_runtime_opts *o, model_runtime **out, mt_err *err)
{
    *out = NULL;
    model_runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return mt_fail(err, MT_E_NOMEM, "runtime");
    rt->o = *o;
    rt->log = o->log ? o->log : stderr;
    mt_status st = setup(rt, err);
    if (st != MT_OK) {
        model_runtime_close(rt);
        return st;
    }
    *out = rt;
    return MT_OK;
}

void model_runtime_close(model_runtime *rt)
{
    if (!rt)
        return;
    for (int i = 0; i < RT_MAX_SEQS; i++)
        model_seq_free(rt, i);
    rt_vp_close(rt);
    rt_dp_close(rt);
    rt_tp_close(rt);
    rt_bufs_free(rt);
    rt_mtp_unload(rt);
    rt_unload(rt);
    model_kset_destroy(rt->ks);
    model_plan_free(rt->plan);
    free(rt->h_i32);
    db_close(rt->db);
    model_tokenizer_destroy(rt->tok);
    model_weights_close(rt->w);
    dev_close(rt->dev);
    free(rt);
}

const model_config *model_runtime_config(const model_runtime *rt) { return rt->cfg; }

void model_runtime_selection(const model_runtime *rt, model_selection_counts *out)
{
    model_kset_counts(rt->ks, out);
}

void model_runtime_report(const model_runtime *rt, FILE *f) { model_kset_report(rt->ks, f); }
model_kset *model_runtime_kernels(model_runtime *rt) { return rt->ks; }
const model_tokenizer *model_runtime_tokenizer(const model_runtime *rt) { return rt->tok; }
int32_t model_runtime_vocab(const model_runtime *rt) { return (int32_t)rt->V; }
int64_t model_runtime_max_context(const model_runtime *rt) { return rt->max_ctx; }

int model_runtime_eos(const model_runtime *rt, int32_t *out, int cap)
{
    int n = 0;
    for (int i = 0; i < rt->cfg->eos_count && n < cap; i++)
        out[n++] = (int32_t)rt->cfg->eos_token_id[i];
    if (rt->tok) {
        int32_t id = model_tokenizer_token_id(rt->tok, "<|endoftext|>");
        bool have = id < 0;
        for (int i = 0; i < n && !have; i++)
            have = out[i] == id;
        if (!have && n < cap)
            out[n++] = id;
    }
    return n;
}

/* ---- sequences ------------------------------------------------------------- */

