/* rt_ep.c: the runtime across the ranks of a communicator (runtime.h,
 * model_runtime_opts.comm): expert parallelism for the MoE layers
 * (ep_moe.h), everything else replicated, and the lockstep the layers'
 * collectives need.
 *
 * Lockstep: every MoE layer of every forward exchanges pairs with every
 * rank, so all ranks run the same number of forwards. Two ways:
 *   - each rank drives its own runtime (data-parallel attention) and calls
 *     model_step the same number of times, with zero items when it has
 *     nothing to run: it then runs only the MoE layers' exchanges, serving
 *     its experts to the others;
 *   - comm_lead: rank 0 drives; before each forward it broadcasts the
 *     step's token count, and the other ranks sit in model_runtime_follow,
 *     running an empty step per announcement, until rank 0 closes its
 *     runtime (which broadcasts the end). */
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
    if (mt_comm_device_buffers(c))
        return mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s': the runtime exchanges host "
                       "buffers between ranks; the GPU communicators (nccl, rccl) are not wired "
                       "into it yet: use 'mpi'", mt_comm_backend(c));
    if (rt->plan->mtp)
        return mt_fail(err, MT_E_UNSUPPORTED, "speculative decoding (the MTP layer) does not run "
                       "across ranks yet: run without speculative_steps under --comm");
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
    if (rt->o.comm && leads(rt) && !rt->ep_ended) {
        int32_t end = -1;
        mt_err e = MT_ERR_INIT;
        if (mt_comm_broadcast(rt->o.comm, &end, 1, MT_COMM_I32, 0, &e) != MT_OK)
            fprintf(rt->log, "expert parallelism: telling the other ranks to stop: %s\n", e.msg);
        rt->ep_ended = true;
    }
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

/* A forward with no local tokens: only the MoE layers' exchanges (none
 * without expert parallelism). */
static mt_status empty_forward(model_runtime *rt, mt_err *err)
{
    for (int64_t l = 0; rt->ep && l < rt->n_layers; l++) {
        if (!rt->layers[l].moe)
            continue;
        mt_status st = rt_ep_moe(rt, &rt->layers[l], NULL, 0, NULL, err);
        if (st != MT_OK)
            return mt_err_prefix(err, "layer %" PRId64 " (no local tokens)", l);
    }
    return MT_OK;
}

mt_status rt_ep_step_begin(model_runtime *rt, int64_t M, mt_err *err)
{
    rt->ep_joined = true;
    if (!leads(rt) || rt->tp.on) /* tensor parallelism announced the whole step */
        return MT_OK;
    int32_t m = (int32_t)M;
    return mt_comm_broadcast(rt->o.comm, &m, 1, MT_COMM_I32, 0, err);
}

mt_status rt_ep_step(model_runtime *rt, model_step_item *items, int n, mt_err *err)
{
    if (rt->o.comm_lead && mt_comm_rank(rt->o.comm) != 0)
        return mt_fail(err, MT_E_INVALID, "rank %d follows rank 0's steps "
                       "(model_runtime_follow): it runs no steps of its own",
                       mt_comm_rank(rt->o.comm));
    if (rt->tp.on) {
        /* Every rank runs every step: nothing to join without one. */
        if (n == 0)
            return MT_OK;
        if (rt->tp.lead)
            MT_CHECK(rt_tp_announce(rt, items, n, err));
        return rt_step(rt, items, n, err);
    }
    if (n == 0)
        return rt->o.comm_lead ? MT_OK : empty_forward(rt, err);
    rt->ep_joined = false;
    mt_status st = rt_step(rt, items, n, err);
    if (st != MT_OK && !rt->ep_joined && !rt->o.comm_lead) {
        /* Failed before its forward (bad items, KV cache full): still join
         * this step's exchanges so the other ranks are not left waiting. */
        mt_err e2 = MT_ERR_INIT;
        if (empty_forward(rt, &e2) != MT_OK)
            fprintf(rt->log, "expert parallelism: %s\n", e2.msg);
    }
    return st;
}

mt_status model_runtime_follow(model_runtime *rt, int64_t *steps, mt_err *err)
{
    if (steps)
        *steps = 0;
    if (!rt->o.comm || !rt->o.comm_lead || mt_comm_rank(rt->o.comm) == 0)
        return mt_fail(err, MT_E_INVALID, "model_runtime_follow: only ranks other than 0 of a "
                       "runtime opened with comm_lead follow");
    if (rt->tp.on)
        return rt_tp_follow(rt, steps, err);
    for (;;) {
        int32_t m = 0;
        MT_CHECK(mt_comm_broadcast(rt->o.comm, &m, 1, MT_COMM_I32, 0, err));
        if (m < 0)
            return MT_OK;
        MT_CHECK(empty_forward(rt, err));
        if (steps)
            ++*steps;
    }
}

int model_runtime_rank(const model_runtime *rt)
{
    return rt->o.comm ? mt_comm_rank(rt->o.comm) : 0;
}
