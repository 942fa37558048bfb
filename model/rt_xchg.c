/* rt_xchg.c: the memory the runtime's exchanges between ranks use. Every
 * collective of a forward (the MoE layers' dispatch and combine, the
 * tensor-parallel gathers and the embedding's sum) takes device buffers,
 * so the communicator must reach the device's memory: NCCL on cuda, RCCL
 * on hip, and self or Open MPI on cpu and emu, whose device memory is host
 * memory. The leader's step messages are host data (the scheduler's
 * tokens); they go through a device buffer here, the same way on every
 * backend. Counts of those copies (and of the MoE layers' count reads) are
 * kept for model_runtime_copy_counts. */
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
    return MT_OK;
}

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
    MT_CHECK(mt_comm_broadcast(rt->o.comm, x->msg_dev, n, MT_COMM_I32, 0, err));
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
    if (rt->ep)
        model_ep_count_reads(rt->ep, &out->count_calls, &out->count_bytes);
}
