/* ep_moe.h: the MoE layer under expert parallelism: the routed
 * experts are split into contiguous ranges over the ranks of a
 * communicator; each rank holds only its range's weights.
 *
 * Per layer, every rank, whatever its token count (0 included):
 *   1. on its own tokens: the shared expert (replicated) into per-token
 *      rows, and the router (replicated) -> (expert, weight) per pair; the
 *      pairs sorted by expert, which groups them by the rank owning it
 *      (moe_align with bm 1), and in that order their activation rows,
 *      local expert ids and weights and the pairs per rank (ep_dispatch):
 *      all on the device;
 *   2. dispatch: the counts go to every rank (all-to-all), the host reads
 *      the counts it sends and receives (2 x ranks ints: the libraries'
 *      all-to-all-v takes host counts, so this is the layer's one wait),
 *      then the rows, ids and weights go to the ranks owning the experts
 *      (mt_comm_all_to_all_v, device buffers to device buffers);
 *   3. the received pairs run through this rank's experts as a one-choice
 *      MoE over its local experts (align, gate/up, down with the pair's
 *      weight: kernels of shape E=local count, topk=1, looked up in the
 *      database under that key), in chunks of at most the single-device
 *      layer's pair count;
 *   4. combine: the weighted down rows go back to their token's rank
 *      (all-to-all-v), land in the per-pair row layout [M, topk, H] of the
 *      single-device deterministic combine (ep_return), and moe_combine
 *      adds them, in top-k order, to the shared expert's row.
 * Each pair's row is computed by the same kernels on the same inputs as on
 * one device, and the final sum has the same order, so with one config per
 * kernel at every M (batch-invariant mode) y is bitwise the one-device y.
 *
 * Collectives: five per layer (counts, rows, ids, weights, results), in
 * the same order on every rank, all on device buffers: the communicator
 * must reach the device's memory (nccl on cuda, rccl on hip, mpi or self
 * on cpu and emu, whose device memory is host memory). A rank that fails
 * between them leaves the others waiting in the next one (the runtime's
 * exchange watchdog, rt_xchg.c, ends the job).
 *
 * Ownership: create/destroy; destroy(NULL) is a no-op. The communicator,
 * device and kernel set are the caller's and must outlive the layer. Not
 * thread-safe (one stream). */
#ifndef MT_MODEL_EP_MOE_H
#define MT_MODEL_EP_MOE_H

#include <stdint.h>

#include "comm/comm.h"
#include "moe_layer.h"

typedef struct model_ep model_ep;

/* The expert range of rank of n_ranks for n_experts experts: [*first,
 * *first + *count), contiguous, sizes differing by at most one. */
void model_ep_range(int64_t n_experts, int n_ranks, int rank, int64_t *first, int64_t *count);

/* The dims of the local expert kernels of a rank owning count experts of a
 * layer with global dims d: E = count, topk 1, no shared expert, the
 * deterministic combine's rows (comb 1); everything else as d. */
void model_ep_local_dims(const moe_dims *d, int64_t count, moe_dims *out);

/* A layer over comm for global dims d (routed experts split by
 * model_ep_range). MT_E_INVALID when there are fewer experts than ranks. */
mt_status model_ep_create(mt_comm *comm, const moe_dims *d, model_ep **out, mt_err *err);
void model_ep_destroy(model_ep *ep);

/* This rank's expert range. */
void model_ep_own(const model_ep *ep, int64_t *first, int64_t *count);
mt_comm *model_ep_comm(const model_ep *ep);

/* Adds the layer's own kernels to ks: the pairs' sort by expert (moe_align
 * at the global E and topk, bm 1; max_m rows), ep_dispatch and ep_return
 * (max_m * topk pairs), and the local expert kernels (align, up, down at E
 * = local count, topk 1), each called with at most max_m * topk rows
 * (pairs). Call before model_kset_select. */
mt_status model_ep_add_kernels(model_ep *ep, model_kset *ks, int64_t max_m, mt_err *err);

/* Device buffers for up to max_m local tokens per call (the value given
 * to model_ep_add_kernels). The buffers of received pairs start at one
 * step's own pairs and grow when a step brings in more. */
mt_status model_ep_ws_alloc(model_ep *ep, dev_device *dev, int64_t max_m, mt_err *err);

/* y (device f32 [M, H], overwritten) = the layer on x (device bf16 [M,
 * H]) with k the layer's global kernels (route, combine and the shared
 * expert's; its align/up/down are unused) and w the router, the shared
 * expert and this rank's experts only (expert e of the range is local
 * expert e - first). M may be 0: the rank still serves the experts it owns
 * to the other ranks. Every rank must call it for the same layers in the
 * same order. d must have the dims the layer was created with (shared_inter
 * at most theirs). Returns once the exchanges are done; the last kernels
 * (return, combine) may still run on the device's stream. */
mt_status model_ep_moe_run(model_ep *ep, const model_moe_kernels *k, const moe_dims *d,
                           const moe_weights *w, const void *x, int64_t M, float *y, mt_err *err);

/* How many times, and how many bytes, the host has read the pair counts
 * back from the device (one read of 2 x ranks ints per layer call): the
 * only device-to-host copies the layer makes. */
void model_ep_count_reads(const model_ep *ep, uint64_t *calls, uint64_t *bytes);

#endif
