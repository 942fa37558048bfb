/* status.c: status names and error-record helpers (see status.h). */
#include "status.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const status_names[MT_STATUS_COUNT] = {
    [MT_OK] = "ok",
    [MT_E_INVALID] = "invalid",
    [MT_E_NOMEM] = "out_of_memory",
    [MT_E_IO] = "io_error",
    [MT_E_FORMAT] = "format_error",
    [MT_E_UNSUPPORTED] = "unsupported",
    [MT_E_COMPILE] = "compile_error",
    [MT_E_LAUNCH] = "launch_error",
    [MT_E_DEVICE] = "device_error",
    [MT_E_FAULT] = "memory_fault",
    [MT_E_DEADLOCK] = "deadlock",
    [MT_E_TIMEOUT] = "timeout",
    [MT_E_DB] = "db_error",
    [MT_E_NOT_FOUND] = "not_found",
    [MT_E_WRONG_RESULT] = "wrong_result",
    [MT_E_BUSY] = "busy",
    [MT_E_INTERRUPTED] = "interrupted",
    [MT_E_CRASH] = "crash",
};
_Static_assert(sizeof status_names / sizeof status_names[0] == MT_STATUS_COUNT,
               "one name per status");

const char *mt_status_str(mt_status s)
{
    if ((unsigned)s >= MT_STATUS_COUNT || !status_names[s])
        return "unknown";
    return status_names[s];
}

mt_status mt_fail(mt_err *err, mt_status s, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = s;
    }
    return s;
}

mt_status mt_fail_at(mt_err *err, mt_status s, const char *file, int line,
                     const char *expr, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < sizeof err->msg)
            snprintf(err->msg + n, sizeof err->msg - (size_t)n,
                     " [%s at %s:%d]", expr, file, line);
        err->status = s;
    }
    return s;
}

mt_status mt_err_prefix(mt_err *err, const char *fmt, ...)
{
    if (!err)
        return MT_OK;
    char pre[512], old[MT_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t np = strlen(pre), room = sizeof err->msg - 1;
    if (np + 2 > room)
        np = room - 2;
    memcpy(err->msg, pre, np);
    memcpy(err->msg + np, ": ", 2);
    size_t no = strnlen(old, sizeof old - 1);
    if (no > room - np - 2)
        no = room - np - 2;
    memcpy(err->msg + np + 2, old, no);
    err->msg[np + 2 + no] = 0;
    return err->status;
}

void mt_err_clear(mt_err *err)
{
    if (err) {
        err->status = MT_OK;
        err->msg[0] = 0;
    }
}
