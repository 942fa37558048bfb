/* kern_db.h: how the kernel library names a device for the tuning database.
 * The one place where a dev_props becomes a db_device record (the tuner
 * stores trials under it, the runtime and the benchmarks look configs up
 * with it); the database's persisted backend numbers are checked against
 * the device's enum at compile time. Pure; thread-safe. */
#ifndef MT_KERN_DB_H
#define MT_KERN_DB_H

#include "db/db.h"
#include "device/device.h"

/* Fills *out from p; the strings point into p, which must outlive *out. */
void kern_db_device(const dev_props *p, db_device *out);

#endif
