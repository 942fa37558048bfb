/* api_core.c: versions, status and source names, and the error record a
 * device keeps of its last call (see include/moetune/moetune.h). The
 * public enums share their values with the internal ones; the asserts
 * below keep them equal. */
#include <stdarg.h>
#include <stdio.h>

#include "api_impl.h"

_Static_assert((int)MOETUNE_E_CRASH == (int)MT_E_CRASH &&
                   (int)MOETUNE_E_INVALID == (int)MT_E_INVALID &&
                   (int)MOETUNE_E_DB == (int)MT_E_DB &&
                   (int)MOETUNE_E_MISUSE == (int)MT_STATUS_COUNT,
               "moetune_status follows mt_status, then adds MISUSE");
_Static_assert((int)MOETUNE_BACKEND_CPU == (int)DEV_BACKEND_CPU &&
                   (int)MOETUNE_BACKEND_EMU == (int)DEV_BACKEND_EMU &&
                   (int)MOETUNE_BACKEND_HIP == (int)DEV_BACKEND_HIP &&
                   (int)MOETUNE_BACKEND_CUDA == (int)DEV_BACKEND_CUDA &&
                   (int)MOETUNE_BACKEND_COUNT == (int)DEV_BACKEND_COUNT,
               "moetune_backend is dev_backend");
_Static_assert((int)MOETUNE_SOURCE_TUNED == (int)MODEL_PROV_TUNED &&
                   (int)MOETUNE_SOURCE_NEAREST == (int)MODEL_PROV_NEAREST &&
                   (int)MOETUNE_SOURCE_OTHER_DEVICE == (int)MODEL_PROV_OTHER_DEVICE &&
                   (int)MOETUNE_SOURCE_STALE == (int)MODEL_PROV_STALE &&
                   (int)MOETUNE_SOURCE_MISS == (int)MODEL_PROV_MISS &&
                   (int)MOETUNE_SOURCE_NO_DB == (int)MODEL_PROV_NO_DB &&
                   (int)MOETUNE_SOURCE_REJECTED == (int)MODEL_PROV_REJECTED &&
                   (int)MOETUNE_SOURCE_COUNT == (int)MODEL_PROV_COUNT,
               "moetune_source is model_prov");

int moetune_version(void) { return MOETUNE_API_VERSION; }

const char *moetune_version_string(void)
{
#define API_STR2(x) #x
#define API_STR(x) API_STR2(x)
    return MOETUNE_VERSION " (api " API_STR(MOETUNE_API_VERSION) ")";
#undef API_STR
#undef API_STR2
}

const char *moetune_status_str(moetune_status s)
{
    if (s == MOETUNE_E_MISUSE)
        return "misuse";
    if ((unsigned)s < (unsigned)MT_STATUS_COUNT)
        return mt_status_str((mt_status)s);
    return "unknown";
}

const char *moetune_source_str(moetune_source s)
{
    return (unsigned)s < (unsigned)MOETUNE_SOURCE_COUNT ? model_prov_name((model_prov)s)
                                                         : "unknown";
}

moetune_status api_done(moetune_device *dev, mt_status st, const mt_err *err)
{
    dev->status = (moetune_status)st;
    snprintf(dev->msg, sizeof dev->msg, "%s", st == MT_OK || !err ? "" : err->msg);
    if (st != MT_OK && !dev->msg[0])
        snprintf(dev->msg, sizeof dev->msg, "%s", mt_status_str(st));
    return dev->status;
}

moetune_status api_fail(moetune_device *dev, moetune_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dev->msg, sizeof dev->msg, fmt, ap);
    va_end(ap);
    dev->status = st;
    return st;
}

const char *moetune_errmsg(const moetune_device *dev)
{
    return dev ? dev->msg : "out of memory";
}

moetune_status moetune_errcode(const moetune_device *dev)
{
    return dev ? dev->status : MOETUNE_E_NOMEM;
}
