/* serve_error.c: OpenAI-shaped HTTP errors (see serve_error.h). */
#include "serve_error.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *serve_error_type(int http)
{
    switch (http) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return http >= 400 && http < 500 ? "invalid_request_error" : "server_error";
    }
}

mt_status serve_reject(serve_error *e, int http, const char *param, const char *code,
                       const char *fmt, ...)
{
    mt_status st = http >= 400 && http < 500 && http != 429 ? MT_E_INVALID
                   : http == 503 || http == 429           ? MT_E_BUSY
                                                          : MT_E_IO;
    if (!e)
        return st;
    e->http = http;
    e->type = serve_error_type(http);
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    e->err.status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err.msg, sizeof e->err.msg, fmt, ap);
    va_end(ap);
    return st;
}

char *serve_error_json(const serve_error *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    char *s = NULL;
    if (o && cJSON_AddStringToObject(o, "message", e->err.msg) &&
        cJSON_AddStringToObject(o, "type", e->type ? e->type : serve_error_type(e->http)) &&
        (e->param[0] ? cJSON_AddStringToObject(o, "param", e->param)
                     : cJSON_AddNullToObject(o, "param")) &&
        (e->code ? cJSON_AddStringToObject(o, "code", e->code)
                 : cJSON_AddNullToObject(o, "code")))
        s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}
