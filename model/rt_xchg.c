/* rt_xchg.c: the memory the runtime's exchanges between ranks use. Every
 * collective of a forward (the MoE layers' dispatch and combine, the
 * tensor-parallel gathers and the embedding's sum) takes device buffers,
 * so the communicator must reach the device's memory: NCCL on cuda, RCCL
 * on hip, and self or Open MPI on cpu and emu, whose device memory is host
 * memory. The leader's step messages are host data (the scheduler's
 * tokens); they go through a device buffer here, the same way on every
 * backend. Counts of those copies (and of the MoE layers' count reads) are
 * kept for model_runtime_copy_counts. And a rank that fails inside a
 * forward: exchanges there wait at most the runtime's timeout, and a step
 * that fails past its first exchange leaves the runtime out of step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_impl.h"

mt_status rt_xchg_open(model_runtime *rt, mt_err *err)
{
    mt_comm *c = rt->o.comm;
    if (!c)
        return MT_OK;
    dev_backend b = rt->props->backend;
    bool host_mem = b == DEV_BACKEND_CPU || b == DEV_BACKEND_EMU;
    const char *name = mt_comm_backend(c);
    if (mt_comm_device_buffers(c) && host_mem)
        return mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s' exchanges GPU memory; device "
                       "%s keeps its buffers in host memory: use 'mpi'", name, rt->props->spec);
    if (!mt_comm_device_buffers(c) && !host_mem)
        return mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s' exchanges host memory; device "
                       "%s keeps its buffers in GPU memory: use '%s'", name, rt->props->spec,
                       b == DEV_BACKEND_HIP ? "rccl" : "nccl");
    if (mt_comm_device_buffers(c) && strcmp(name, b == DEV_BACKEND_HIP ? "rccl" : "nccl"))
        return mt_fail(err, MT_E_UNSUPPORTED, "communicator '%s' does not run on device %s: "
                       "use '%s'", name, rt->props->spec, b == DEV_BACKEND_HIP ? "rccl" : "nccl");
    rt->xc.timeout_ms = rt->o.xchg_timeout_ms ? rt->o.xchg_timeout_ms : 30000;
    mt_comm_set_timeout(c, rt->xc.timeout_ms);
    return MT_OK;
}

mt_status rt_xchg_step_failed(model_runtime *rt, mt_status st)
{
    if (st == MT_OK || !rt->o.comm || !rt->ep_joined || rt->xc.out_of_step)
        return st;
    rt->xc.out_of_step = true;
    bool lead = rt->o.comm_lead && mt_comm_rank(rt->o.comm) == 0;
    fprintf(rt->log, "rank %d of %d: a step failed inside its forward: the ranks are out of "
            "step%s\n", mt_comm_rank(rt->o.comm), mt_comm_size(rt->o.comm),
            lead ? "; the job ends in 1 s" : "");
    if (lead)
        mt_comm_end_job(rt->o.comm, 1, 1000);
    return st;
}

bool model_runtime_out_of_step(const model_runtime *rt) { return rt->xc.out_of_step; }

void rt_xchg_close(model_runtime *rt)
{
    if (rt->dev)
        dev_free(rt->dev, rt->xc.msg_dev);
    rt->xc.msg_dev = NULL;
    rt->xc.msg_cap = 0;
}

mt_status rt_xchg_bcast(model_runtime *rt, int32_t *host, size_t n, mt_err *err)
{
    rt_xchg *x = &rt->xc;
    size_t bytes = n * sizeof *host;
    if (bytes > x->msg_cap) {
        size_t cap = x->msg_cap ? x->msg_cap : 1024;
        while (cap < bytes)
            cap *= 2;
        dev_free(rt->dev, x->msg_dev);
        x->msg_dev = NULL;
        x->msg_cap = 0;
        MT_CHECK(dev_alloc(rt->dev, cap, &x->msg_dev, err));
        x->msg_cap = cap;
    }
    bool root = mt_comm_rank(rt->o.comm) == 0;
    x->announce_calls++;
    x->announce_bytes += bytes;
    if (root)
        MT_CHECK(dev_copy_to(rt->dev, x->msg_dev, host, bytes, err));
    /* A follower waits for the next step as long as the leader has none. */
    mt_comm_set_timeout(rt->o.comm, 0);
    mt_status st = mt_comm_broadcast(rt->o.comm, x->msg_dev, n, MT_COMM_I32, 0, err);
    mt_comm_set_timeout(rt->o.comm, x->timeout_ms);
    if (st != MT_OK)
        return st;
    return root ? MT_OK : dev_copy_from(rt->dev, host, x->msg_dev, bytes, err);
}

void model_runtime_copy_counts(const model_runtime *rt, model_copy_counts *out)
{
    memset(out, 0, sizeof *out);
    dev_copy_counts d;
    dev_get_copy_counts(rt->dev, &d);
    out->to_calls = d.to_calls;
    out->to_bytes = d.to_bytes;
    out->from_calls = d.from_calls;
    out->from_bytes = d.from_bytes;
    out->announce_calls = rt->xc.announce_calls;
    out->announce_bytes = rt->xc.announce_bytes;
    out->index_calls = rt->vp.index_calls;
    out->index_bytes = rt->vp.index_bytes;
    out->share_to_calls = rt->vp.share_to_calls;
    out->share_to_bytes = rt->vp.share_to_bytes;
    out->share_from_calls = rt->vp.share_from_calls;
    out->share_from_bytes = rt->vp.share_from_bytes;
    if (rt->ep)
        model_ep_count_reads(rt->ep, &out->count_calls, &out->count_bytes);
}
