/* registry.c: the table of built-in kernel families. A new family is one
 * extern declaration and one line in the table. */
#include <string.h>

#include "family.h"

extern const kern_family fam_rmsnorm;
extern const kern_family fam_gemm;
extern const kern_family fam_moe_gemm_up;
extern const kern_family fam_moe_gemm_down;
extern const kern_family fam_moe_route;
extern const kern_family fam_moe_align;
extern const kern_family fam_moe_combine;
extern const kern_family fam_mxfp4_quant;
extern const kern_family fam_mla_prefill;
extern const kern_family fam_mla_decode;
extern const kern_family fam_dsa_indexer;
extern const kern_family fam_rope;
extern const kern_family fam_ops_embed;
extern const kern_family fam_ops_copy;
extern const kern_family fam_ops_residual;
extern const kern_family fam_ops_silu_mul;
extern const kern_family fam_ops_head_gemm;
extern const kern_family fam_ops_kv_store;
extern const kern_family fam_ep_dispatch;
extern const kern_family fam_ep_return;
extern const kern_family fam_tp_cols;

static const kern_family *const families[] = {
    &fam_rmsnorm,
    &fam_gemm,
    &fam_moe_gemm_up,
    &fam_moe_gemm_down,
    &fam_moe_route,
    &fam_moe_align,
    &fam_moe_combine,
    &fam_mxfp4_quant,
    &fam_mla_prefill,
    &fam_mla_decode,
    &fam_dsa_indexer,
    &fam_rope,
    &fam_ops_embed,
    &fam_ops_copy,
    &fam_ops_residual,
    &fam_ops_silu_mul,
    &fam_ops_head_gemm,
    &fam_ops_kv_store,
    &fam_ep_dispatch,
    &fam_ep_return,
    &fam_tp_cols,
    NULL,
};

const kern_family *const *kern_families(void) { return families; }

const kern_family *kern_family_find(const char *name)
{
    for (int i = 0; families[i]; i++)
        if (strcmp(families[i]->name, name) == 0)
            return families[i];
    return NULL;
}

const kern_impl *kern_family_impl(const kern_family *f, dev_backend b)
{
    return dev_backend_runs_hip_source(b) ? f->gpu : f->cpu;
}
