/* rt_ep.c: the runtime's hooks for expert parallelism across the ranks of
 * a communicator (runtime.h, model_runtime_opts.comm): the MoE layers run
 * expert-parallel (ep_moe.h), everything else is replicated. Here: the
 * rank's expert range, its kernels and workspace, the MoE MLP the forward
 * pass calls, and the leader's per-step announcement (a main step's token
 * count, or RT_EP_MTP before an MTP draft step, whose MTP layer is
 * expert-parallel like the others: its experts, quantized at load, are
 * split by the same ranges). Who steps and who follows (the lockstep) is
 * rt_driver.c's. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "rt_impl.h"

/* The dims the MoE layers run with (the largest MXFP4 shared expert of the
 * plan's MoE layers), before rt_bufs_alloc computes rt->moe the same way. */
static void plan_moe_dims(const model_runtime *rt, moe_dims *out)
{
    int64_t sh_max = 0;
    for (int64_t i = 0; i < rt->n_layers; i++) {
        const model_plan_layer *pl = &rt->plan->layers[i];
        if (pl->moe && pl->sh_mxfp4 && pl->sh_inter > sh_max)
            sh_max = pl->sh_inter;
    }
    model_moe_dims(rt->cfg, rt->act, rt->plan->p.moe_wl, sh_max, out);
}

mt_status rt_ep_open(model_runtime *rt, mt_err *err)
{
    mt_comm *c = rt->o.comm;
    if (!c)
        return MT_OK;
    MT_CHECK(rt_xchg_open(rt, err));
    bool any_moe = false;
    for (int64_t i = 0; i < rt->n_layers; i++)
        any_moe |= rt->plan->layers[i].moe;
    if (!any_moe)
        return MT_OK; /* nothing to split: every rank runs the whole model */
    moe_dims d;
    plan_moe_dims(rt, &d);
    MT_CHECK(model_ep_create(c, &d, &rt->ep, err));
    int64_t first, count;
    model_ep_own(rt->ep, &first, &count);
    fprintf(rt->log, "expert parallelism: rank %d of %d (%s) holds routed experts %" PRId64
            "-%" PRId64 " of %" PRId64 "%s\n", mt_comm_rank(c), mt_comm_size(c),
            mt_comm_backend(c), first, first + count - 1, rt->E,
            rt->o.comm_lead ? "; rank 0 leads the steps" : "");
    return MT_OK;
}

void rt_ep_experts(const model_runtime *rt, int64_t *first, int64_t *count)
{
    if (rt->ep) {
        model_ep_own(rt->ep, first, count);
    } else {
        *first = 0;
        *count = rt->E;
    }
}

mt_status rt_ep_add_kernels(model_runtime *rt, mt_err *err)
{
    return rt->ep ? model_ep_add_kernels(rt->ep, rt->ks, rt->T, err) : MT_OK;
}

mt_status rt_ep_ws_alloc(model_runtime *rt, mt_err *err)
{
    return rt->ep ? model_ep_ws_alloc(rt->ep, rt->dev, rt->T, err) : MT_OK;
}

static bool leads(const model_runtime *rt)
{
    return rt->o.comm_lead && mt_comm_rank(rt->o.comm) == 0;
}

void rt_ep_close(model_runtime *rt)
{
    if (rt->o.comm && leads(rt) && !rt->ep_ended && !rt->xc.out_of_step &&
        !mt_comm_aborted(rt->o.comm)) {
        int32_t end = RT_EP_END;
        mt_err e = MT_ERR_INIT;
        if (rt_xchg_bcast(rt, &end, 1, &e) != MT_OK)
            fprintf(rt->log, "expert parallelism: telling the other ranks to stop: %s\n", e.msg);
        rt->ep_ended = true;
    }
    rt_xchg_close(rt);
    model_ep_destroy(rt->ep);
    rt->ep = NULL;
}

mt_status rt_ep_moe(model_runtime *rt, rt_layer *ly, const void *x, int64_t M, float *y,
                    mt_err *err)
{
    moe_dims d = rt->moe;
    d.shared_inter = ly->sh_inter && ly->sh_mxfp4 ? ly->sh_inter : 0;
    moe_weights w = {.gate = ly->gate, .bias = ly->bias, .w13 = ly->w13, .s13 = ly->s13,
                     .w2 = ly->w2, .s2 = ly->s2, .sh_w13 = ly->sh_w13, .sh_s13 = ly->sh_s13,
                     .sh_w2 = ly->sh_w2, .sh_s2 = ly->sh_s2};
    return model_ep_moe_run(rt->ep, &ly->k.moe, &d, &w, x, M, y, err);
}

mt_status rt_ep_step_begin(model_runtime *rt, int64_t M, mt_err *err)
{
    rt->ep_joined = true;
    if (!leads(rt) || rt->tp.on || rt->dp.on) /* tp and dp announced the whole step */
        return MT_OK;
    int32_t m = (int32_t)M;
    return rt_xchg_bcast(rt, &m, 1, err);
}

mt_status rt_ep_mtp_begin(model_runtime *rt, mt_err *err)
{
    rt->ep_joined = true;
    if (!leads(rt) || rt->tp.on || rt->dp.on) /* tp and dp announced the MTP step's items */
        return MT_OK;
    int32_t m = RT_EP_MTP;
    return rt_xchg_bcast(rt, &m, 1, err);
}

int model_runtime_rank(const model_runtime *rt)
{
    return rt->o.comm ? mt_comm_rank(rt->o.comm) : 0;
}
