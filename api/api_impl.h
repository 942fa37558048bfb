/* api_impl.h: the bodies of the public handles (include/moetune/) and what
 * the files of api/ share. Private to api/: nothing here is exported.
 *
 * A moetune_device owns the dev_device, the read-only database layers, the
 * error record of its last call, and two caches shared by its layers:
 * kernel bundles (a layer description's kernels, picked and compiled once)
 * and workspaces (the intermediate buffers of a run, grown to the largest
 * layer that uses them). Layers hold a reference on the device, their
 * bundle and their workspace; each is freed with its last holder. One
 * thread at a time per device (moetune/device.h). */
#ifndef MT_API_IMPL_H
#define MT_API_IMPL_H

#include <stdbool.h>
#include <stdio.h>

#include "common/status.h"
#include "db/db.h"
#include "device/device.h"
#include "kernels/moe/moe.h"
#include "model/kset.h"
#include "model/moe_layer.h"
#include "moetune/moetune.h"

#define API_MAX_DBS 8

typedef struct api_kernels api_kernels;
typedef struct api_ws api_ws;

struct moetune_device {
    dev_device *dev;          /* NULL when the open failed */
    const dev_props *props;
    db_t *dbs[API_MAX_DBS];   /* searched in this order */
    int n_dbs;
    int refs;                 /* the caller's hold (until close) + one per layer */
    api_kernels *kernels;     /* bundles in use */
    api_ws *ws;               /* workspaces in use */
    moetune_status status;    /* of the last call */
    char msg[MT_ERR_MSG_MAX];
};

/* ---- errors (api_core.c) --------------------------------------------------- */

/* Records the outcome of a call on dev (its status and err's message, or a
 * clean slate on MT_OK) and returns it as a moetune_status. */
moetune_status api_done(moetune_device *dev, mt_status st, const mt_err *err);
/* Records a failure with a message of its own. */
moetune_status api_fail(moetune_device *dev, moetune_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Drops one hold on dev; frees it with the last. */
void api_device_release(moetune_device *dev);

/* ---- kernel bundles (api_kernels.c) ----------------------------------------- */

/* The kernels of one layer description on one device, in the runtime's
 * kernel sets: layer.* for model_moe_run (route NULL unless routing GATE)
 * and route_logits for ROUTE_LOGITS (moe_route on the logits, see
 * api_routed.h). */
struct api_kernels {
    char key[512];            /* the description the bundle was picked for */
    int refs;
    model_moe_kernels layer;
    model_kern *route_logits;
    model_kset *sets[API_MAX_DBS + 1]; /* one per database that gave kernels, + none */
    int n_sets;
    FILE *log;                /* the sets' own log lines (kept, not shown) */
    char *log_buf;
    size_t log_len;
    moetune_selection *sel;   /* launch order, buckets ascending */
    char (*sel_config)[256];  /* the config keys sel[i].config points to */
    int n_sel;
    char *report;
    api_kernels *next;
};

/* The bundle for dims d (with routing r, up to max_m tokens) on dev: an
 * existing one with one more reference, or a new one, picked from the
 * device's databases by the runtime's rules and compiled. */
mt_status api_kernels_get(moetune_device *dev, const moe_dims *d, moetune_routing r,
                          int64_t max_m, api_kernels **out, mt_err *err);
void api_kernels_release(moetune_device *dev, api_kernels *k);

/* ---- workspaces (api_ws.c) ------------------------------------------------- */

typedef enum api_ws_kind {
    API_WS_LAYER = 0,  /* model_moe_ws: model_moe_run's own (ROUTE_GATE) */
    API_WS_ROUTED = 1, /* model_moe_ws for runs from given routing or logits */
} api_ws_kind;

struct api_ws {
    api_ws_kind kind;
    moe_dims cap;             /* hidden, E, topk, bm, comb as created; inter and
                                 shared_inter the largest of its layers */
    int64_t max_m;
    model_moe_ws *layer;
    model_moe_ws *routed;
    int refs;
    api_ws *next;
};

/* A workspace of kind for layers of dims d and up to max_m tokens: shared
 * with the layers of the same hidden size, experts, top-k and tile, grown
 * (the device synchronized first) when d needs more. */
mt_status api_ws_get(moetune_device *dev, api_ws_kind kind, const moe_dims *d, int64_t max_m,
                     api_ws **out, mt_err *err);
void api_ws_release(moetune_device *dev, api_ws *ws);

#endif
