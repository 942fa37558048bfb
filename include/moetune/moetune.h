/* moetune.h: the one header a program includes to call moetune as a
 * library (libmoetune.so or libmoetune.a; `pkg-config --cflags --libs
 * moetune`, or find_package(moetune) and the target moetune::moetune).
 *
 * What it offers: open a device ("cpu", "emu", "hip:N", "cuda:N") with the
 * tuned databases to read, describe a MoE layer by its shapes, register its
 * MXFP4 weights, and run it on buffers the caller owns. The layer runs the
 * kernels the database picked for each token-count bucket, through the
 * same kernel sets, compile cache and lookup rules as the moetune runtime,
 * and says what it picked and what it missed (moetune_moe_selection).
 *
 *   moetune_device *dev;
 *   moetune_device_open("cpu", &dev);           // check the status; see device.h
 *   moetune_device_add_db(dev, "my-tuned.db");  // optional, searched first
 *   moetune_moe_desc d;
 *   moetune_moe_desc_init(&d);                  // then set hidden, inter, experts ...
 *   moetune_moe *layer;
 *   moetune_moe_create(dev, &d, &weights, &layer);
 *   moetune_moe_run(layer, x, m, y, NULL);
 *   moetune_moe_destroy(layer);
 *   moetune_device_close(dev);
 *
 * Conventions of every call:
 *   - Every call that can fail returns a moetune_status; MOETUNE_OK is 0.
 *     The message of the last failure on a device (or on a layer created
 *     on it) is moetune_errmsg(device), SQLite-style.
 *   - Handles are opaque; each has a create/open and a destroy/close, and
 *     destroying NULL is a no-op.
 *   - Nothing is global: state lives in the handles.
 *   - docs/LIBRARY.md has the whole story and two examples.
 *
 * Versions: MOETUNE_API_VERSION is the API this header describes. It grows
 * by one with every change to the API; changes only add (new calls, new
 * enum values at the end, new fields at the end of structs that carry
 * struct_size), so a program built against version N runs with any library
 * whose moetune_version() is >= N. A change that would break that would
 * also change the shared library's soname (libmoetune.so.1). */
#ifndef MOETUNE_H
#define MOETUNE_H

#define MOETUNE_API_VERSION 1

#include "status.h"
#include "device.h"
#include "moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The API version the library implements (compare with
 * MOETUNE_API_VERSION). Thread-safe; never fails. */
int moetune_version(void);

/* The library's release, e.g. "0.1.0 (api 1)". Static storage; thread-safe. */
const char *moetune_version_string(void);

#ifdef __cplusplus
}
#endif

#endif
