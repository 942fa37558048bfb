/* api_weights.h: a layer's weights as its kernels read them, from the
 * caller's checkpoint-layout buffers (moetune_moe_weights): the caller's
 * own buffers where the device's kernels read Quark rows (hip, cuda, emu),
 * a copy regrouped by 16 rows once (moe_w4_group16) where they read that
 * (cpu); plus the small buffers a layer adds (zero router bias, the
 * identity router weight of logits routing). Not thread-safe; one device
 * thread. */
#ifndef MT_API_WEIGHTS_H
#define MT_API_WEIGHTS_H

#include "kernels/moe/moe.h"
#include "moetune/moetune.h"

typedef struct api_weights {
    moe_weights w;   /* what the kernels read */
    const void *eye; /* bf16 [E, E] identity (ROUTE_LOGITS), else NULL */
    void *own[12];   /* device buffers allocated here */
    int n_own;
} api_weights;

/* Checks in (non-NULL where d and routing r need a buffer, 16-byte
 * aligned) and fills out. MT_E_INVALID names the field at fault; on any
 * failure out holds nothing. */
mt_status api_weights_setup(dev_device *dev, const moe_dims *d, moetune_routing r,
                            const moetune_moe_weights *in, api_weights *out, mt_err *err);
void api_weights_free(dev_device *dev, api_weights *w);

#endif
