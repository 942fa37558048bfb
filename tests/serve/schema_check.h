/* schema_check.h: a JSON schema validator for the structured-output tests,
 * written separately from the grammar (serve/serve_grammar.c) so that it can
 * judge it: type (a name or a list; integer is a number without fraction),
 * enum, const, properties, required, additionalProperties (false or a
 * schema), items, minLength/maxLength (in code points), minItems/maxItems,
 * anyOf. Annotations are ignored. Header-only (static functions). */
#ifndef MT_TEST_SCHEMA_CHECK_H
#define MT_TEST_SCHEMA_CHECK_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static size_t sc_codepoints(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static bool sc_type_is(const cJSON *v, const char *t)
{
    if (!strcmp(t, "string"))
        return cJSON_IsString(v);
    if (!strcmp(t, "number"))
        return cJSON_IsNumber(v);
    if (!strcmp(t, "integer"))
        return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean"))
        return cJSON_IsBool(v);
    if (!strcmp(t, "null"))
        return cJSON_IsNull(v);
    if (!strcmp(t, "object"))
        return cJSON_IsObject(v);
    if (!strcmp(t, "array"))
        return cJSON_IsArray(v);
    return false;
}

/* Whether v satisfies schema; why (cap bytes) says where it does not. */
static bool sc_valid(const cJSON *v, const cJSON *schema, char *why, size_t cap)
{
    if (!schema || cJSON_IsTrue(schema))
        return true;
    if (cJSON_IsFalse(schema)) {
        snprintf(why, cap, "schema false");
        return false;
    }
    const cJSON *k;
    if ((k = cJSON_GetObjectItemCaseSensitive(schema, "const")) && !cJSON_Compare(v, k, true)) {
        snprintf(why, cap, "not the const");
        return false;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(schema, "enum"))) {
        bool found = false;
        const cJSON *e;
        cJSON_ArrayForEach(e, k) found = found || cJSON_Compare(v, e, true);
        if (!found) {
            snprintf(why, cap, "not in the enum");
            return false;
        }
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(schema, "type"))) {
        bool ok = false;
        if (cJSON_IsString(k))
            ok = sc_type_is(v, k->valuestring);
        const cJSON *t;
        if (cJSON_IsArray(k))
            cJSON_ArrayForEach(t, k) ok = ok || sc_type_is(v, t->valuestring);
        if (!ok) {
            snprintf(why, cap, "wrong type");
            return false;
        }
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(schema, "anyOf"))) {
        bool ok = false;
        const cJSON *m;
        char sub[128];
        cJSON_ArrayForEach(m, k) ok = ok || sc_valid(v, m, sub, sizeof sub);
        if (!ok) {
            snprintf(why, cap, "no anyOf member");
            return false;
        }
    }
    if (cJSON_IsString(v)) {
        size_t n = sc_codepoints(v->valuestring);
        if ((k = cJSON_GetObjectItemCaseSensitive(schema, "maxLength")) && n > (size_t)k->valuedouble) {
            snprintf(why, cap, "string of %zu characters past maxLength", n);
            return false;
        }
        if ((k = cJSON_GetObjectItemCaseSensitive(schema, "minLength")) && n < (size_t)k->valuedouble) {
            snprintf(why, cap, "string of %zu characters under minLength", n);
            return false;
        }
    }
    if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v);
        if ((k = cJSON_GetObjectItemCaseSensitive(schema, "maxItems")) && n > k->valuedouble) {
            snprintf(why, cap, "%d items past maxItems", n);
            return false;
        }
        if ((k = cJSON_GetObjectItemCaseSensitive(schema, "minItems")) && n < k->valuedouble) {
            snprintf(why, cap, "%d items under minItems", n);
            return false;
        }
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(schema, "items"), *e;
        int i = 0;
        cJSON_ArrayForEach(e, v)
        {
            char sub[200];
            if (items && !sc_valid(e, items, sub, sizeof sub)) {
                snprintf(why, cap, "[%d]: %s", i, sub);
                return false;
            }
            i++;
        }
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(schema, "properties");
        const cJSON *addl = cJSON_GetObjectItemCaseSensitive(schema, "additionalProperties");
        const cJSON *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(schema, "required"))
        {
            if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) {
                snprintf(why, cap, "required '%s' missing", r->valuestring);
                return false;
            }
        }
        const cJSON *m;
        cJSON_ArrayForEach(m, v)
        {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            char sub[200];
            if (!ps && cJSON_IsFalse(addl)) {
                snprintf(why, cap, "'%s' is not a property", m->string);
                return false;
            }
            if (!ps && cJSON_IsObject(addl))
                ps = addl;
            if (ps && !sc_valid(m, ps, sub, sizeof sub)) {
                snprintf(why, cap, ".%s: %s", m->string, sub);
                return false;
            }
        }
    }
    return true;
}

#endif
