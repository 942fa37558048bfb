/* serve_error.h: an HTTP error in OpenAI's shape,
 *   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}},
 * carried from the request parser, the engine and the router to the reply.
 *
 * serve_error wraps the project's mt_err (status and message) and adds the
 * HTTP status, OpenAI's error type, the request field at fault (param) and
 * an optional machine-readable code. Plain storage owned by the caller;
 * nothing in it needs freeing. */
#ifndef MT_SERVE_ERROR_H
#define MT_SERVE_ERROR_H

#include "common/status.h"

typedef struct serve_error {
    int http;          /* 400, 404, 405, 413, 500, 503, ... */
    const char *type;  /* static string, from the HTTP status */
    const char *code;  /* static string or NULL (JSON null) */
    char param[128];   /* request field at fault; "" is JSON null */
    mt_err err;        /* status (from the HTTP status) and message */
} serve_error;

#define SERVE_ERROR_INIT {0, NULL, NULL, {0}, MT_ERR_INIT}

/* Fills e (ignored when NULL) and returns its mt_status: MT_E_INVALID for
 * 4xx, MT_E_BUSY for 503 and 429, MT_E_IO otherwise. param and code may be
 * NULL; code must be a string literal (it is not copied). */
mt_status serve_reject(serve_error *e, int http, const char *param, const char *code,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* OpenAI's type for an HTTP status ("invalid_request_error", ...). */
const char *serve_error_type(int http);

/* The JSON body for e (malloc'd, caller frees; NULL when out of memory). */
char *serve_error_json(const serve_error *e);

#endif
