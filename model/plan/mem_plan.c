/* mem_plan.c: per-rank weight, KV and workspace memory of a deployment,
 * from config.json alone (see mem_plan.h for the layout and the formulas). */
#include "mem_plan.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/format/quark.h"

static const char *const part_names[MEM_PART_COUNT] = {
    [MEM_EMBED_HEAD] = "embed_head",
    [MEM_ATTENTION] = "attention",
    [MEM_INDEXER] = "indexer",
    [MEM_DENSE_MLP] = "dense_mlp",
    [MEM_ROUTER] = "router",
    [MEM_ROUTED_EXPERTS] = "routed_experts",
    [MEM_SHARED_EXPERTS] = "shared_experts",
    [MEM_MTP_EXTRA] = "mtp_extra",
};

const char *mem_part_name(mem_part p)
{
    return p >= 0 && p < MEM_PART_COUNT ? part_names[p] : "?";
}

/* Nominal memory: the vendors' figures (HARDWARE.md). The runtime sizes its
 * cache from what the device reports free at load; these are for planning. */
static const struct {
    const char *name;
    double gb;
} devices[] = {{"MI300X", 192}, {"MI355X", 288}, {"H200", 141}};

int mem_plan_device_count(void) { return (int)(sizeof devices / sizeof devices[0]); }
const char *mem_plan_device_name(int i) { return devices[i].name; }
double mem_plan_device_hbm(int i) { return devices[i].gb * 1e9; }

/* Bytes of an out x in linear as the loader stores it under the Quark
 * config (bf16 when the config does not quantize it). */
static double linear_bytes(const model_config *c, const char *module, double out, double in)
{
    model_quark_match m;
    model_quark_lookup(c->quark, module, &m);
    switch (m.weight.kind) {
    case MODEL_QKIND_MXFP4:
        return out * in / 2 + out * in / 32;
    case MODEL_QKIND_FP8_E4M3:
        return out * in + out * 4;
    default:
        return out * in * 2;
    }
}

typedef struct ctx {
    const model_config *c;
    mem_plan *p;
    char name[256];
} ctx;

static void add_lin(ctx *x, mem_part part, double divisor, const char *prefix, const char *mod,
                    int64_t out, int64_t in)
{
    snprintf(x->name, sizeof x->name, "%s%s", prefix, mod);
    x->p->part[part] += linear_bytes(x->c, x->name, (double)out, (double)in) / divisor;
}

/* gate_proj, up_proj [I, H] and down_proj [H, I] under prefix. */
static void add_mlp(ctx *x, mem_part part, double divisor, const char *prefix, int64_t inter)
{
    int64_t H = x->c->hidden_size;
    add_lin(x, part, divisor, prefix, "gate_proj", inter, H);
    add_lin(x, part, divisor, prefix, "up_proj", inter, H);
    add_lin(x, part, divisor, prefix, "down_proj", H, inter);
}

static bool indexer_full(const model_config *c, int64_t i)
{
    if (model_config_layer_is_mtp(c, i) && c->index_share_for_mtp_iteration)
        return false;
    return c->layer_indexer_full[i];
}

static void add_layer(ctx *x, int64_t i)
{
    const model_config *c = x->c;
    mem_plan *p = x->p;
    double tp = p->o.tp;
    int64_t H = c->hidden_size, heads = c->num_attention_heads;
    int64_t qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    char pre[64], a[96];
    snprintf(pre, sizeof pre, "model.layers.%" PRId64 ".", i);
    snprintf(a, sizeof a, "%sself_attn.", pre);

    p->part[MEM_ATTENTION] += 2.0 * H * 2; /* input and post-attention norms */
    if (c->q_lora_rank) {
        add_lin(x, MEM_ATTENTION, 1, a, "q_a_proj", c->q_lora_rank, H);
        p->part[MEM_ATTENTION] += 2.0 * c->q_lora_rank;
        add_lin(x, MEM_ATTENTION, tp, a, "q_b_proj", heads * qk, c->q_lora_rank);
    } else {
        add_lin(x, MEM_ATTENTION, tp, a, "q_proj", heads * qk, H);
    }
    add_lin(x, MEM_ATTENTION, 1, a, "kv_a_proj_with_mqa", c->kv_lora_rank + c->qk_rope_head_dim,
            H);
    p->part[MEM_ATTENTION] += 2.0 * c->kv_lora_rank;
    /* kv_b twice, in bf16 whatever the checkpoint stores (rt_load.c
     * upload_kv_b): split per head (W_UK^T | W_UV) for the absorbed decode
     * path, and whole for mla_prefill's expansion. */
    p->part[MEM_ATTENTION] +=
        2.0 * heads * (c->qk_nope_head_dim + c->v_head_dim) * c->kv_lora_rank * 2 / tp;
    add_lin(x, MEM_ATTENTION, tp, a, "o_proj", H, heads * c->v_head_dim);

    if (indexer_full(c, i)) {
        char q[128];
        snprintf(q, sizeof q, "%sindexer.", a);
        int64_t ih = c->index_n_heads, id = c->index_head_dim;
        add_lin(x, MEM_INDEXER, 1, q, "wq_b", ih * id, c->q_lora_rank ? c->q_lora_rank : H);
        add_lin(x, MEM_INDEXER, 1, q, "wk", id, H);
        add_lin(x, MEM_INDEXER, 1, q, "weights_proj", ih, H);
        p->part[MEM_INDEXER] += 2.0 * id * 2; /* k_norm weight and bias */
    }

    char m[96];
    snprintf(m, sizeof m, "%smlp.", pre);
    if (!c->layer_moe[i]) {
        add_mlp(x, MEM_DENSE_MLP, tp, m, c->intermediate_size);
    } else {
        int64_t E = c->n_routed_experts;
        p->part[MEM_ROUTER] += (double)E * H * 2 + (double)E * 4;
        /* The rank with the most expert bytes sets the plan (formats may
         * differ per expert under exclude patterns). */
        double worst = 0;
        for (int r = 0; r < p->o.ep; r++) {
            double save = p->part[MEM_ROUTED_EXPERTS];
            p->part[MEM_ROUTED_EXPERTS] = 0;
            for (int64_t e = r * p->experts_per_rank; e < (r + 1) * p->experts_per_rank; e++) {
                char ep[160];
                snprintf(ep, sizeof ep, "%sexperts.%" PRId64 ".", m, e);
                add_mlp(x, MEM_ROUTED_EXPERTS, 1, ep, c->moe_intermediate_size);
            }
            if (p->part[MEM_ROUTED_EXPERTS] > worst)
                worst = p->part[MEM_ROUTED_EXPERTS];
            p->part[MEM_ROUTED_EXPERTS] = save;
        }
        p->part[MEM_ROUTED_EXPERTS] += worst;
        if (c->n_shared_experts) {
            char sp[128];
            snprintf(sp, sizeof sp, "%sshared_experts.", m);
            add_mlp(x, MEM_SHARED_EXPERTS, 1, sp, c->moe_intermediate_size * c->n_shared_experts);
        }
    }
    if (model_config_layer_is_mtp(c, i)) {
        add_lin(x, MEM_MTP_EXTRA, 1, pre, "eh_proj", H, 2 * H);
        p->part[MEM_MTP_EXTRA] += 3.0 * H * 2; /* enorm, hnorm, shared_head.norm */
    }
}

mt_status mem_plan_compute(const model_config *c, const mem_plan_opts *o, mem_plan *plan,
                           mt_err *err)
{
    memset(plan, 0, sizeof *plan);
    mem_plan_opts a = *o;
    if (a.ranks < 1 || a.ranks > 4096)
        return mt_fail(err, MT_E_INVALID, "--ranks %d: must be 1..4096", a.ranks);
    if (a.ep == 0)
        a.ep = a.ranks;
    if (a.tp == 0)
        a.tp = 1;
    if (a.max_batch_tokens == 0)
        a.max_batch_tokens = 512;
    if (a.mem_util == 0)
        a.mem_util = 0.90;
    if (a.ep < 1 || a.ranks % a.ep)
        return mt_fail(err, MT_E_INVALID, "--ep %d: must divide --ranks %d", a.ep, a.ranks);
    if (c->n_routed_experts % a.ep)
        return mt_fail(err, MT_E_INVALID,
                       "--ep %d: n_routed_experts %" PRId64 " is not divisible by it", a.ep,
                       c->n_routed_experts);
    if (a.tp < 1 || a.ranks % a.tp)
        return mt_fail(err, MT_E_INVALID, "--tp %d: must divide --ranks %d", a.tp, a.ranks);
    if (c->num_attention_heads % a.tp)
        return mt_fail(err, MT_E_INVALID,
                       "--tp %d: num_attention_heads %" PRId64 " is not divisible by it", a.tp,
                       c->num_attention_heads);
    if (a.tp > 1 && c->intermediate_size % a.tp)
        return mt_fail(err, MT_E_INVALID,
                       "--tp %d: intermediate_size %" PRId64 " is not divisible by it", a.tp,
                       c->intermediate_size);
    if (a.max_batch_tokens < 1)
        return mt_fail(err, MT_E_INVALID, "--max-batch-tokens %" PRId64 ": must be >= 1",
                       a.max_batch_tokens);
    if (!(a.mem_util > 0 && a.mem_util <= 1))
        return mt_fail(err, MT_E_INVALID, "--mem-util %g: must be in (0, 1]", a.mem_util);
    plan->o = a;
    plan->experts_per_rank = c->n_routed_experts / a.ep;

    ctx x = {.c = c, .p = plan};
    int64_t H = c->hidden_size;
    double vocab_rows = (double)((c->vocab_size + a.ranks - 1) / a.ranks);
    plan->part[MEM_EMBED_HEAD] += vocab_rows * H * 2 + H * 2.0; /* embedding, final norm */
    if (!c->tie_word_embeddings)
        plan->part[MEM_EMBED_HEAD] +=
            linear_bytes(c, "lm_head", (double)c->vocab_size, (double)H) * vocab_rows /
            (double)c->vocab_size;
    for (int64_t i = 0; i < c->layer_count; i++)
        add_layer(&x, i);
    for (int p = 0; p < MEM_PART_COUNT; p++)
        plan->weights += plan->part[p];

    double b = a.fp8_kv ? 1 : 2;
    for (int64_t i = 0; i < c->layer_count; i++)
        plan->kv_per_token += (double)(c->kv_lora_rank + c->qk_rope_head_dim) * b +
                              (indexer_full(c, i) ? (double)c->index_head_dim * b : 0);
    int64_t I2 = 2 * c->moe_intermediate_size;
    double per_tok = 8.0 * H + 2.0 * (double)c->num_experts_per_tok * (double)I2 +
                     (double)c->num_attention_heads *
                         (double)(c->qk_nope_head_dim + c->qk_rope_head_dim + c->v_head_dim) +
                     vocab_rows;
    plan->workspace = (double)a.max_batch_tokens * 4 * per_tok;
    return MT_OK;
}

mem_fit mem_plan_fit(const mem_plan *plan, const char *device, double hbm)
{
    mem_fit f = {.device = device, .hbm = hbm};
    f.usable = hbm * plan->o.mem_util;
    f.kv_bytes = f.usable - plan->weights - plan->workspace;
    if (f.kv_bytes > 0 && plan->kv_per_token > 0) {
        f.kv_tokens = (int64_t)floor(f.kv_bytes / plan->kv_per_token);
        f.kv_tokens_total = f.kv_tokens * (plan->o.ranks / plan->o.tp);
    }
    return f;
}

static double gb(double b) { return b / 1e9; }

void mem_plan_print(const mem_plan *plan, const model_config *c, FILE *f)
{
    const mem_plan_opts *o = &plan->o;
    fprintf(f,
            "plan: %d ranks; routed experts expert-parallel over %d (%" PRId64
            " per rank); attention %s; embedding and head vocabulary-parallel\n",
            o->ranks, o->ep, plan->experts_per_rank,
            o->tp > 1 ? "tensor-parallel" : "data-parallel (weights replicated)");
    if (o->tp > 1)
        fprintf(f, "      attention tensor-parallel over %d ranks (%" PRId64 " heads each)\n",
                o->tp, c->num_attention_heads / o->tp);
    fprintf(f, "weights per rank (GB, 1e9 bytes):\n");
    for (int p = 0; p < MEM_PART_COUNT; p++)
        fprintf(f, "  %-16s %9.3f\n", mem_part_name((mem_part)p), gb(plan->part[p]));
    fprintf(f, "  %-16s %9.3f\n", "total", gb(plan->weights));
    fprintf(f, "KV cache: %.0f bytes per token (%" PRId64 " layers, %s)\n", plan->kv_per_token,
            c->layer_count, o->fp8_kv ? "fp8" : "bf16");
    fprintf(f, "workspace: %.3f GB for a %" PRId64 "-token step (estimate)\n", gb(plan->workspace),
            o->max_batch_tokens);
    fprintf(f, "%-8s %8s %9s %9s %9s %14s %16s\n", "device", "HBM GB", "usable", "weights",
            "KV GB", "KV tokens/rank", "context total");
    for (int i = 0; i < mem_plan_device_count(); i++) {
        mem_fit m = mem_plan_fit(plan, mem_plan_device_name(i), mem_plan_device_hbm(i));
        if (m.kv_bytes <= 0) {
            fprintf(f, "%-8s %8.0f %9.1f %9.1f %9s %14s %16s  does not fit: %.1f GB short\n",
                    m.device, gb(m.hbm), gb(m.usable), gb(plan->weights), "-", "-", "-",
                    gb(-m.kv_bytes));
            continue;
        }
        fprintf(f, "%-8s %8.0f %9.1f %9.1f %9.1f %14" PRId64 " %16" PRId64 "\n", m.device,
                gb(m.hbm), gb(m.usable), gb(plan->weights), gb(m.kv_bytes), m.kv_tokens,
                m.kv_tokens_total);
    }
}
