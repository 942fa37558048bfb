/* kern_db.c: device records for the tuning database (see kern_db.h). */
#include "kern_db.h"

_Static_assert(DB_BACKEND_CPU == (int)DEV_BACKEND_CPU && DB_BACKEND_EMU == (int)DEV_BACKEND_EMU &&
                   DB_BACKEND_HIP == (int)DEV_BACKEND_HIP &&
                   DB_BACKEND_CUDA == (int)DEV_BACKEND_CUDA &&
                   DB_BACKEND_COUNT == (int)DEV_BACKEND_COUNT,
               "the database's persisted backend numbers must equal dev_backend");

void kern_db_device(const dev_props *p, db_device *out)
{
    *out = (db_device){.backend = (int)p->backend, .arch = p->arch, .name = p->name,
                       .runtime_version = p->runtime_version,
                       .driver_version = p->driver_version, .fingerprint = p->fingerprint,
                       .compute_units = p->compute_units};
}
