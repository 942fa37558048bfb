/* rt_driver.c: who steps and who follows. model_step runs a step on this
 * runtime alone (rt_step, rt_forward.c) or, with a communicator, in
 * lockstep with the other ranks; model_runtime_follow is the loop the
 * ranks other than 0 of a comm_lead runtime sit in.
 *
 * Lockstep: every MoE layer of every forward exchanges pairs with every
 * rank, so all ranks run the same number of forwards. Three ways:
 *   - each rank drives its own runtime (data-parallel attention) and calls
 *     model_step the same number of times, with zero items when it has
 *     nothing to run: it then runs only the MoE layers' exchanges
 *     (empty_forward), serving its experts to the others;
 *   - comm_lead: rank 0 drives; before each forward it broadcasts the
 *     step's token count (rt_ep_step_begin), or RT_EP_MTP before an MTP
 *     draft step (rt_ep_mtp_begin), and the other ranks run an empty step
 *     (of the model's MoE layers, or of the MTP layer's) per announcement
 *     until rank 0 closes its runtime (which broadcasts the end);
 *   - tensor parallelism (o.tp) with comm_lead: rank 0 announces its
 *     sequence journal and the step's items (rt_tp_announce, and
 *     rt_tp_announce_mtp for a draft step), and the other ranks replay
 *     both and run the same step (tp_follow).
 * model_mtp_step keeps the same lockstep as model_step: without a leader
 * every rank calls it as often as the others, with zero items to only
 * serve its share of the MTP layer's experts.
 * Above the forward pass and the per-layer hooks of rt_ep.c and rt_tp.c;
 * nothing below calls into this file. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "rt_impl.h"

/* Replays the leader's sequence operations; the slots must come out the
 * same (they are picked the same way from the same state). */
static mt_status replay_ops(model_runtime *rt, const int32_t *ops, int n_ops, mt_err *err)
{
    for (int i = 0; i < n_ops; i++) {
        const int32_t *e = ops + 4 * i;
        int got = e[1];
        mt_status st = MT_OK;
        switch (e[0]) {
        case RT_TP_OP_CREATE: st = model_seq_create(rt, &got, err); break;
        case RT_TP_OP_FORK: st = model_seq_fork(rt, e[2], e[3], &got, err); break;
        case RT_TP_OP_FREE: model_seq_free(rt, e[1]); break;
        case RT_TP_OP_TRUNCATE: st = model_seq_truncate(rt, e[1], e[2], err); break;
        case RT_TP_OP_MTP_TRUNCATE: st = model_mtp_truncate(rt, e[1], e[2], err); break;
        default: return mt_fail(err, MT_E_FORMAT, "tensor parallelism: operation %d", e[0]);
        }
        if (st != MT_OK)
            return mt_err_prefix(err, "replaying rank 0's sequence operation %d", i);
        if (got != e[1])
            return mt_fail(err, MT_E_DEVICE, "replaying rank 0's sequence operations: sequence "
                           "%d here is %d on rank 0", got, e[1]);
    }
    return MT_OK;
}

/* A step (rt_step or rt_mtp_step) as a follower runs it: one that failed
 * before its forward failed the same way on rank 0 (the same sequences),
 * so the ranks are still in step. */
static mt_status follower_ran(model_runtime *rt, mt_status st)
{
    st = rt_xchg_step_failed(rt, st);
    return st != MT_OK && !rt->ep_joined ? MT_OK : st;
}

/* An announced MTP step on a follower: n items from m[off]; the draft
 * logits go to scratch. */
static mt_status follow_mtp(model_runtime *rt, const int32_t *m, int64_t len, int64_t off,
                            int n, mt_err *err)
{
    if (!rt->mtp.on)
        return mt_fail(err, MT_E_INVALID, "rank 0 runs MTP draft steps, but this rank opened "
                       "its runtime without speculative_steps: every rank needs the same options");
    model_mtp_item *items = calloc((size_t)n, sizeof *items);
    float *logits = malloc(sizeof(float) * (size_t)n * (size_t)rt->V);
    mt_status st = MT_OK;
    if (!items || !logits)
        st = mt_fail(err, MT_E_NOMEM, "tensor parallelism: MTP step");
    for (int i = 0; i < n && st == MT_OK; i++) {
        if (off + 4 > len || m[off + 1] < 0 || off + 4 + m[off + 1] > len) {
            st = mt_fail(err, MT_E_FORMAT, "tensor parallelism: item %d of an MTP step message",
                         i);
            break;
        }
        items[i] = (model_mtp_item){.seq = m[off], .tokens = m + off + 4, .n_tokens = m[off + 1],
                                    .hidden_row = m[off + 2],
                                    .logits = (m[off + 3] & 1) ? logits + (size_t)i * (size_t)rt->V
                                                               : NULL};
        off += 4 + m[off + 1];
    }
    if (st == MT_OK) {
        rt->ep_joined = false;
        st = follower_ran(rt, rt_mtp_step(rt, items, n, err));
    }
    free(items);
    free(logits);
    return st;
}

/* One announced step on a follower: message m of len entries. */
static mt_status follow_step(model_runtime *rt, const int32_t *m, int64_t len, mt_err *err)
{
    if (len < 2 || m[0] < 0 || m[1] < -RT_MAX_SEQS || 2 + 4 * (int64_t)m[0] > len)
        return mt_fail(err, MT_E_FORMAT, "tensor parallelism: a step message of %" PRId64
                       " entries", len);
    MT_CHECK(replay_ops(rt, m + 2, m[0], err));
    if (m[1] < 0)
        return follow_mtp(rt, m, len, 2 + 4 * (int64_t)m[0], -m[1], err);
    int n = m[1];
    if (n == 0)
        return MT_OK;
    model_step_item *items = calloc((size_t)n, sizeof *items);
    float *logits = NULL;
    if (!items)
        return mt_fail(err, MT_E_NOMEM, "tensor parallelism: step");
    int64_t off = 2 + 4 * (int64_t)m[0], rows = 0;
    mt_status st = MT_OK;
    for (int i = 0; i < n && st == MT_OK; i++) {
        if (off + 4 > len || m[off + 1] < 0 || off + 4 + m[off + 1] > len) {
            st = mt_fail(err, MT_E_FORMAT, "tensor parallelism: item %d of a step message", i);
            break;
        }
        items[i] = (model_step_item){.seq = m[off], .n_tokens = m[off + 1],
                                     .n_prompt = m[off + 2], .tokens = m + off + 4};
        rows += (m[off + 3] & 2) ? m[off + 1] : (m[off + 3] & 1);
        off += 4 + m[off + 1];
    }
    /* Logits land on every rank (lm_head is gathered); the follower's go
     * to scratch. */
    if (st == MT_OK && rows && !(logits = malloc(sizeof(float) * (size_t)((rows + n) * rt->V))))
        st = mt_fail(err, MT_E_NOMEM, "tensor parallelism: logits");
    float *at = logits;
    off = 2 + 4 * (int64_t)m[0];
    for (int i = 0; i < n && st == MT_OK; i++) {
        int flags = m[off + 3];
        if (flags & 2) {
            items[i].all_logits = at;
            at += (size_t)items[i].n_tokens * (size_t)rt->V;
        }
        if (flags & 1) {
            items[i].logits = at;
            at += rt->V;
        }
        off += 4 + m[off + 1];
    }
    if (st == MT_OK) {
        rt->ep_joined = false;
        st = follower_ran(rt, rt_step(rt, items, n, err));
    }
    free(items);
    free(logits);
    return st;
}

static mt_status tp_follow(model_runtime *rt, int64_t *steps, mt_err *err)
{
    int32_t *m = NULL;
    int64_t cap = 0;
    mt_status st = MT_OK;
    for (;;) {
        int32_t len = 0;
        if ((st = rt_xchg_bcast(rt, &len, 1, err)) != MT_OK)
            break;
        if (len < 0)
            break;
        if (len > cap) {
            int32_t *nm = realloc(m, sizeof(int32_t) * (size_t)len);
            if (!nm) {
                st = mt_fail(err, MT_E_NOMEM, "tensor parallelism: a step message of %" PRId32
                             " entries", len);
                break;
            }
            m = nm;
            cap = len;
        }
        if ((st = rt_xchg_bcast(rt, m, (size_t)len, err)) != MT_OK)
            break;
        if ((st = follow_step(rt, m, len, err)) != MT_OK)
            break;
        if (steps)
            ++*steps;
    }
    free(m);
    return st;
}

/* Without local tokens: only the MTP layer's MoE exchanges (and, with a
 * vocabulary-parallel embedding and head, theirs: this rank holds
 * vocabulary the others read). */
mt_status rt_empty_mtp(model_runtime *rt, mt_err *err)
{
    if (!rt->mtp.on)
        return mt_fail(err, MT_E_INVALID, "rank 0 runs MTP draft steps, but this rank opened "
                       "its runtime without speculative_steps: every rank needs the same options");
    MT_CHECK(rt_vp_share(rt, 0, 0, err));
    if (rt->vp.on)
        MT_CHECK(rt_vp_embed(rt, err));
    rt_layer *ly = &rt->layers[rt->n_layers];
    if (rt->ep && ly->moe) {
        mt_status st = rt_ep_moe(rt, ly, NULL, 0, NULL, err);
        if (st != MT_OK)
            return mt_err_prefix(err, "MTP layer (no local tokens)");
    }
    return rt->vp.on ? rt_vp_head(rt, err) : MT_OK;
}

/* Without expert parallelism (or a vocabulary-parallel embedding and
 * head) there are none. */
mt_status rt_empty_forward(model_runtime *rt, mt_err *err)
{
    MT_CHECK(rt_vp_share(rt, 0, 0, err));
    if (rt->vp.on)
        MT_CHECK(rt_vp_embed(rt, err));
    for (int64_t l = 0; rt->ep && l < rt->n_layers; l++) {
        if (!rt->layers[l].moe)
            continue;
        mt_status st = rt_ep_moe(rt, &rt->layers[l], NULL, 0, NULL, err);
        if (st != MT_OK)
            return mt_err_prefix(err, "layer %" PRId64 " (no local tokens)", l);
    }
    return rt->vp.on ? rt_vp_head(rt, err) : MT_OK;
}

static mt_status ep_step(model_runtime *rt, model_step_item *items, int n, mt_err *err)
{
    if (rt->o.comm_lead && mt_comm_rank(rt->o.comm) != 0)
        return mt_fail(err, MT_E_INVALID, "rank %d follows rank 0's steps "
                       "(model_runtime_follow): it runs no steps of its own",
                       mt_comm_rank(rt->o.comm));
    if (rt->dp.lead)
        return rt_dp_step(rt, items, n, err);
    if (rt->tp.on) {
        /* Every rank runs every step: nothing to join without one. */
        if (n == 0)
            return MT_OK;
        if (rt->tp.lead)
            MT_CHECK(rt_tp_announce(rt, items, n, err));
        rt->ep_joined = false;
        return rt_xchg_step_failed(rt, rt_step(rt, items, n, err));
    }
    if (n == 0) {
        rt->ep_joined = true;
        return rt->o.comm_lead ? MT_OK : rt_xchg_step_failed(rt, rt_empty_forward(rt, err));
    }
    rt->ep_joined = false;
    mt_status st = rt_xchg_step_failed(rt, rt_step(rt, items, n, err));
    if (st != MT_OK && !rt->ep_joined && !rt->o.comm_lead) {
        /* Failed before its forward (bad items, KV cache full): still join
         * this step's exchanges so the other ranks are not left waiting. */
        mt_err e2 = MT_ERR_INIT;
        if (rt_empty_forward(rt, &e2) != MT_OK)
            fprintf(rt->log, "expert parallelism: %s\n", e2.msg);
    }
    return st;
}

/* model_mtp_step with a communicator: as ep_step, the MTP layer standing
 * for the model's layers. */
static mt_status ep_mtp_step(model_runtime *rt, model_mtp_item *items, int n, mt_err *err)
{
    if (rt->o.comm_lead && mt_comm_rank(rt->o.comm) != 0)
        return mt_fail(err, MT_E_INVALID, "rank %d follows rank 0's steps "
                       "(model_runtime_follow): it runs no MTP steps of its own",
                       mt_comm_rank(rt->o.comm));
    if (rt->dp.lead)
        return rt_dp_mtp_step(rt, items, n, err);
    if (rt->tp.on) {
        if (n == 0)
            return MT_OK;
        if (rt->tp.lead)
            MT_CHECK(rt_tp_announce_mtp(rt, items, n, err));
        rt->ep_joined = false;
        return rt_xchg_step_failed(rt, rt_mtp_step(rt, items, n, err));
    }
    if (n == 0) {
        rt->ep_joined = true;
        return rt->o.comm_lead ? MT_OK : rt_xchg_step_failed(rt, rt_empty_mtp(rt, err));
    }
    rt->ep_joined = false;
    mt_status st = rt_xchg_step_failed(rt, rt_mtp_step(rt, items, n, err));
    if (st != MT_OK && !rt->ep_joined && !rt->o.comm_lead) {
        mt_err e2 = MT_ERR_INIT;
        if (rt_empty_mtp(rt, &e2) != MT_OK)
            fprintf(rt->log, "expert parallelism: %s\n", e2.msg);
    }
    return st;
}

mt_status model_mtp_step(model_runtime *rt, model_mtp_item *items, int n, mt_err *err)
{
    if (!rt->mtp.on)
        return mt_fail(err, MT_E_UNSUPPORTED, "model_mtp_step: the runtime was opened without "
                       "speculative_steps (no MTP layer loaded)");
    if (n < 0 || n > RT_MAX_SEQS)
        return mt_fail(err, MT_E_INVALID, "model_mtp_step: %d items", n);
    if (rt->xc.out_of_step)
        return mt_fail(err, MT_E_DEVICE, "rank %d is out of step with the other ranks since a "
                       "forward failed inside its exchanges: the job must end",
                       mt_comm_rank(rt->o.comm));
    return rt->o.comm ? ep_mtp_step(rt, items, n, err) : rt_mtp_step(rt, items, n, err);
}

mt_status model_step(model_runtime *rt, model_step_item *items, int n, mt_err *err)
{
    if (rt->xc.out_of_step)
        return mt_fail(err, MT_E_DEVICE, "rank %d is out of step with the other ranks since a "
                       "forward failed inside its exchanges: the job must end",
                       mt_comm_rank(rt->o.comm));
    return rt->o.comm ? ep_step(rt, items, n, err) : rt_step(rt, items, n, err);
}

mt_status model_runtime_follow(model_runtime *rt, int64_t *steps, mt_err *err)
{
    if (steps)
        *steps = 0;
    if (!rt->o.comm || !rt->o.comm_lead || mt_comm_rank(rt->o.comm) == 0)
        return mt_fail(err, MT_E_INVALID, "model_runtime_follow: only ranks other than 0 of a "
                       "runtime opened with comm_lead follow");
    if (rt->dp.on) /* before tp: groups with their own sequences */
        return rt_dp_follow(rt, steps, err);
    if (rt->tp.on)
        return tp_follow(rt, steps, err);
    for (;;) {
        int32_t m = 0;
        MT_CHECK(rt_xchg_bcast(rt, &m, 1, err));
        if (m == RT_EP_END)
            return MT_OK;
        if (m < 0 && m != RT_EP_MTP)
            return mt_fail(err, MT_E_FORMAT, "expert parallelism: step message %" PRId32, m);
        rt->ep_joined = true;
        MT_CHECK(rt_xchg_step_failed(rt, m == RT_EP_MTP ? rt_empty_mtp(rt, err)
                                                          : rt_empty_forward(rt, err)));
        if (steps)
            ++*steps;
    }
}
