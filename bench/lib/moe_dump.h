/* moe_dump.h: the served MoE layer's inputs, weights and output as raw
 * files, so that another implementation (bench/gpu/moe_peer.py: PyTorch)
 * runs the same layer on the same weights and routing, times it and
 * compares its output with moetune's. `moetune bench --family moe --dump
 * DIR` writes one.
 *
 * DIR/meta.json (format 1) names every file and its shape; all files are
 * raw little-endian arrays without headers:
 *   gate.bf16 [E, H], bias.f32 [E]            the router
 *   experts.i32 [n]                           the experts whose weights follow,
 *                                             ascending (every expert some
 *                                             dumped M routed a token to)
 *   w13.u8 [n, 2I, H/2], s13.u8 [n, 2I, H/32] gate rows then up rows
 *   w2.u8 [n, H, I/2], s2.u8 [n, H, I/32]     down
 *   sh_w13.u8 [2S, H/2], sh_s13.u8 [2S, H/32], sh_w2.u8 [H, S/2],
 *   sh_s2.u8 [H, S/32]                        the shared expert (S wide)
 * MXFP4 in Quark's layout whatever layout the run used (common/mxfp4.h:
 * E2M1 codes, element 2i in the low nibble of byte i; one E8M0 scale per
 * 32 elements, value 2^(s - 127)). Per token count M (tokens[] in meta):
 *   x_M.bf16 [M, H]      the layer's input
 *   ids_M.i32 [M, topk]  the experts the device's router picked
 *   tw_M.f32 [M, topk]   their weights: the sigmoid scores of those experts
 *                        (logits in double from the bf16 x and gate),
 *                        renormalized when norm, times scale
 *   y_M.f32 [M, H]       moetune's output: shared(x) + sum_k tw_k expert_k(x)
 * meta.json also records, per M, for how many of the first tokens the host
 * reference router picked the same experts as the device (a near tie may
 * legitimately differ), and the tolerance the layer tests hold moetune to
 * against a reference that quantizes as it does.
 *
 * Ownership: open/close; close(NULL) is a no-op and removes nothing. Not
 * thread-safe. Failures return MT_E_IO (naming the file) or MT_E_NOMEM. */
#ifndef MT_BENCH_MOE_DUMP_H
#define MT_BENCH_MOE_DUMP_H

#include <stdint.h>

#include "common/status.h"
#include "device/device.h"
#include "kernels/moe/moe.h"

typedef struct moe_dump moe_dump;

/* Creates dir (and its parents) and starts a dump of a layer of dims d
 * (copied); shape and device are recorded in meta.json. */
mt_status moe_dump_open(const char *dir, const moe_dims *d, const char *shape,
                        const char *device, moe_dump **out, mt_err *err);
void moe_dump_close(moe_dump *dp);

/* Writes one M: host x [M, H] (bf16), ids [M, topk] (the device's routing),
 * y [M, H] (the layer's output), with the routing weights computed here
 * from x, gate (host bf16 [E, H]) and bias (host f32 [E]). Nothing is kept
 * but the set of experts ids names. O(M topk H) plus the router check
 * (O(E H) for each of up to 64 tokens). */
mt_status moe_dump_tokens(moe_dump *dp, int64_t M, const uint16_t *x, const int32_t *ids,
                          const float *y, const uint16_t *gate, const float *bias, mt_err *err);

/* Writes the router (from host gate and bias), the weights of every expert
 * the dumped Ms routed to and the shared expert's, read from the device
 * buffers of w in layout wl (moe_dims.wl), then meta.json. Call once, after
 * the last moe_dump_tokens. */
mt_status moe_dump_finish(moe_dump *dp, dev_device *dev, const moe_weights *w, int wl,
                          const uint16_t *gate, const float *bias, mt_err *err);

#endif
