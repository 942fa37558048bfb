/* family.c: shapes, configs, defines and default comparison shared by every
 * kernel family (see family.h). */
#include "family.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/sha256.h"

static const char *const dtype_names[KERN_DT_COUNT] = {
    [KERN_DT_F32] = "f32",     [KERN_DT_BF16] = "bf16",
    [KERN_DT_F16] = "f16",     [KERN_DT_MXFP4] = "mxfp4",
    [KERN_DT_FP8E4M3] = "fp8", [KERN_DT_I32] = "i32",
    [KERN_DT_U8] = "u8",       [KERN_DT_I8] = "i8",
};
_Static_assert(sizeof dtype_names / sizeof dtype_names[0] == KERN_DT_COUNT,
               "one name per dtype");

const char *kern_dtype_name(kern_dtype t)
{
    return (unsigned)t < KERN_DT_COUNT ? dtype_names[t] : "?";
}

bool kern_dtype_parse(const char *s, kern_dtype *out)
{
    for (int i = 0; i < KERN_DT_COUNT; i++)
        if (!strcmp(s, dtype_names[i])) {
            *out = (kern_dtype)i;
            return true;
        }
    if (!strcmp(s, "fp8e4m3") || !strcmp(s, "e4m3")) {
        *out = KERN_DT_FP8E4M3;
        return true;
    }
    if (!strcmp(s, "int8")) {
        *out = KERN_DT_I8;
        return true;
    }
    return false;
}

/* ---- shapes -------------------------------------------------------------- */

static int dim_index(const kern_family *f, const char *name, size_t n)
{
    for (int i = 0; i < f->n_dims; i++)
        if (strlen(f->dims[i].name) == n && !strncmp(f->dims[i].name, name, n))
            return i;
    return -1;
}

static mt_status parse_key(const kern_family *f, const char *text, kern_shape *s,
                           int64_t *m, bool *seen, mt_err *err)
{
    const char *p = text;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        const char *eq = strchr(p, '=');
        const char *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        if (!eq || eq > end)
            return mt_fail(err, MT_E_INVALID,
                           "%s shape '%s': entry '%.*s' is not NAME=VALUE", f->name,
                           text, (int)(end - p), p);
        char val[64];
        size_t vn = (size_t)(end - eq - 1);
        if (vn == 0 || vn >= sizeof val)
            return mt_fail(err, MT_E_INVALID, "%s shape '%s': bad value for '%.*s'",
                           f->name, text, (int)(eq - p), p);
        memcpy(val, eq + 1, vn);
        val[vn] = 0;
        if (eq - p == 1 && *p == 'M' && dim_index(f, "M", 1) < 0) {
            char *e;
            errno = 0;
            long long v = strtoll(val, &e, 10);
            if (*e || errno || v < 1)
                return mt_fail(err, MT_E_INVALID, "%s shape '%s': M=%s is not a "
                               "positive integer", f->name, text, val);
            if (m)
                *m = v;
            p = end;
            continue;
        }
        int di = dim_index(f, p, (size_t)(eq - p));
        if (di < 0) {
            char names[256] = "";
            for (int i = 0; i < f->n_dims; i++) {
                strncat(names, f->dims[i].name, sizeof names - strlen(names) - 2);
                if (i + 1 < f->n_dims)
                    strncat(names, ",", sizeof names - strlen(names) - 1);
            }
            return mt_fail(err, MT_E_INVALID,
                           "%s shape '%s': unknown dim '%.*s' (dims: %s)", f->name,
                           text, (int)(eq - p), p, names);
        }
        const kern_dim_desc *d = &f->dims[di];
        if (d->kind == KERN_DIM_DTYPE) {
            kern_dtype t;
            if (!kern_dtype_parse(val, &t))
                return mt_fail(err, MT_E_INVALID, "%s shape '%s': %s=%s is not a "
                               "data type", f->name, text, d->name, val);
            s->v[di] = t;
        } else {
            char *e;
            errno = 0;
            long long v = strtoll(val, &e, 10);
            if (*e || errno)
                return mt_fail(err, MT_E_INVALID, "%s shape '%s': %s=%s is not an "
                               "integer", f->name, text, d->name, val);
            if (v < d->min || v > d->max)
                return mt_fail(err, MT_E_INVALID,
                               "%s shape '%s': %s=%lld outside [%" PRId64 ", %" PRId64 "]",
                               f->name, text, d->name, v, d->min, d->max);
            s->v[di] = v;
        }
        seen[di] = true;
        p = end;
    }
    return MT_OK;
}

mt_status kern_shape_parse(const kern_family *f, const char *text, kern_shape *s,
                           int64_t *m, mt_err *err)
{
    memset(s, 0, sizeof *s);
    bool seen[KERN_MAX_DIMS] = {0};
    const char *key = text;
    for (int i = 0; i < f->n_presets; i++)
        if (!strcmp(text, f->presets[i].name))
            key = f->presets[i].key;
    if (key == text && f->n_presets > 0) {
        /* Start from the first preset so a key may name only what differs. */
        bool base_seen[KERN_MAX_DIMS] = {0};
        mt_status st = parse_key(f, f->presets[0].key, s, NULL, base_seen, err);
        if (st != MT_OK)
            return mt_err_prefix(err, "preset %s", f->presets[0].name);
        memcpy(seen, base_seen, sizeof seen);
    }
    mt_status st = parse_key(f, key, s, m, seen, err);
    if (st != MT_OK)
        return st;
    for (int i = 0; i < f->n_dims; i++)
        if (!seen[i] && f->dims[i].kind == KERN_DIM_INT_OPT)
            s->v[i] = f->dims[i].min;
        else if (!seen[i])
            return mt_fail(err, MT_E_INVALID, "%s shape '%s': dim %s missing",
                           f->name, text, f->dims[i].name);
    if (f->shape_ok) {
        char why[256] = "";
        if (!f->shape_ok(s, m && *m > 0 ? *m : 1, why, sizeof why))
            return mt_fail(err, MT_E_INVALID, "%s shape '%s': %s", f->name, text, why);
    }
    return MT_OK;
}

void kern_shape_key(const kern_family *f, const kern_shape *s, bool with_runtime,
                    char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < f->n_dims && n < cap; i++) {
        const kern_dim_desc *d = &f->dims[i];
        if ((d->runtime && !with_runtime) || (d->kind == KERN_DIM_INT_OPT && s->v[i] == d->min))
            continue;
        int w;
        if (d->kind == KERN_DIM_DTYPE)
            w = snprintf(out + n, cap - n, "%s%s=%s", n ? "," : "", d->name,
                         kern_dtype_name((kern_dtype)s->v[i]));
        else
            w = snprintf(out + n, cap - n, "%s%s=%" PRId64, n ? "," : "", d->name,
                         s->v[i]);
        if (w < 0)
            break;
        n += (size_t)w;
    }
}

int64_t kern_shape_get(const kern_family *f, const kern_shape *s, const char *name)
{
    int i = dim_index(f, name, strlen(name));
    return i < 0 ? -1 : s->v[i];
}

/* ---- configs -------------------------------------------------------------- */

void kern_config_key(const kern_impl *im, const kern_config *c, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < im->n_params && n < cap; i++) {
        int w = snprintf(out + n, cap - n, "%s%s=%d", i ? "," : "", im->params[i].name,
                         c->v[i]);
        if (w < 0)
            break;
        n += (size_t)w;
    }
}

void kern_config_json(const kern_impl *im, const kern_config *c, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "{");
    for (int i = 0; i < im->n_params && n < cap; i++) {
        int w = snprintf(out + n, cap - n, "%s\"%s\":%d", i ? "," : "",
                         im->params[i].name, c->v[i]);
        if (w < 0)
            break;
        n += (size_t)w;
    }
    if (n < cap)
        snprintf(out + n, cap - n, "}");
}

static int param_index(const kern_impl *im, const char *name, size_t n)
{
    for (int i = 0; i < im->n_params; i++)
        if (strlen(im->params[i].name) == n && !strncmp(im->params[i].name, name, n))
            return i;
    return -1;
}

static bool value_allowed(const kern_param_desc *p, int v)
{
    for (int i = 0; i < p->n_values; i++)
        if (p->values[i] == v)
            return true;
    return false;
}

mt_status kern_config_parse(const kern_impl *im, const char *text, kern_config *c,
                            mt_err *err)
{
    memset(c, 0, sizeof *c);
    c->n = im->n_params;
    bool seen[KERN_MAX_PARAMS] = {0};
    const char *p = text;
    while (*p) {
        while (*p && (isspace((unsigned char)*p) || strchr("{},\"", *p)))
            p++;
        if (!*p)
            break;
        const char *name = p;
        while (*p && (isalnum((unsigned char)*p) || *p == '_'))
            p++;
        size_t nn = (size_t)(p - name);
        while (*p == '"' || isspace((unsigned char)*p))
            p++;
        if (nn == 0 || (*p != '=' && *p != ':'))
            return mt_fail(err, MT_E_INVALID, "config '%s': expected NAME=VALUE near "
                           "'%.16s'", text, name);
        p++;
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p)
            return mt_fail(err, MT_E_INVALID, "config '%s': '%.*s' has no integer value",
                           text, (int)nn, name);
        p = e;
        int pi = param_index(im, name, nn);
        if (pi < 0)
            return mt_fail(err, MT_E_INVALID, "config '%s': unknown parameter '%.*s'",
                           text, (int)nn, name);
        if (!value_allowed(&im->params[pi], (int)v))
            return mt_fail(err, MT_E_INVALID, "config '%s': %s=%ld is not an allowed "
                           "value", text, im->params[pi].name, v);
        c->v[pi] = (int)v;
        seen[pi] = true;
    }
    for (int i = 0; i < im->n_params; i++)
        if (!seen[i])
            return mt_fail(err, MT_E_INVALID, "config '%s': parameter %s missing", text,
                           im->params[i].name);
    return MT_OK;
}

uint64_t kern_space_size(const kern_impl *im)
{
    uint64_t n = 1;
    for (int i = 0; i < im->n_params; i++)
        n *= (uint64_t)im->params[i].n_values;
    return n;
}

void kern_space_point(const kern_impl *im, uint64_t idx, kern_config *c)
{
    memset(c, 0, sizeof *c);
    c->n = im->n_params;
    for (int i = 0; i < im->n_params; i++) {
        uint64_t r = (uint64_t)im->params[i].n_values;
        c->v[i] = im->params[i].values[idx % r];
        idx /= r;
    }
}

int kern_config_get(const kern_impl *im, const kern_config *c, const char *name,
                    int dflt)
{
    int i = param_index(im, name, strlen(name));
    return i < 0 ? dflt : c->v[i];
}

bool kern_config_valid(const kern_family *f, const kern_impl *im, const kern_shape *s,
                       int64_t m, const kern_config *c, const dev_props *p, char *why,
                       size_t cap)
{
    (void)f;
    if (c->n != im->n_params) {
        snprintf(why, cap, "config has %d values, implementation %d parameters", c->n,
                 im->n_params);
        return false;
    }
    for (int i = 0; i < im->n_params; i++)
        if (!value_allowed(&im->params[i], c->v[i])) {
            snprintf(why, cap, "%s=%d is not an allowed value", im->params[i].name,
                     c->v[i]);
            return false;
        }
    return !im->valid || im->valid(s, m, c, p, why, cap);
}

mt_status kern_compile_req(const kern_family *f, const kern_impl *im,
                           const kern_shape *s, const kern_config *c,
                           const dev_props *p, kern_defines *defs,
                           dev_compile_req *req, mt_err *err)
{
    memset(req, 0, sizeof *req);
    req->name = im->source;
    req->source = im->source_text ? im->source_text : kern_source_get(im->source);
    if (!req->source)
        return mt_fail(err, MT_E_NOT_FOUND, "family %s: kernel source '%s' is not "
                       "embedded in this build", f->name, im->source);
    int n = 0;
    const int cap = (int)(sizeof defs->d / sizeof defs->d[0]);
    for (int i = 0; i < im->n_params && n < cap; i++, n++) {
        snprintf(defs->buf[n], sizeof defs->buf[n], "%d", c->v[i]);
        defs->d[n].name = im->params[i].name;
        defs->d[n].value = defs->buf[n];
    }
    /* Non-runtime dims become S_<name>; names live in the static dim table,
     * so only the value needs storage. Dim names are prefixed in a second
     * buffer slot. */
    static const char prefix[] = "S_";
    for (int i = 0; i < f->n_dims && n + 1 < cap; i++) {
        if (f->dims[i].runtime)
            continue;
        snprintf(defs->buf[n], sizeof defs->buf[n], "%s%s", prefix, f->dims[i].name);
        snprintf(defs->buf[n + 1], sizeof defs->buf[n + 1], "%" PRId64, s->v[i]);
        defs->d[n].name = defs->buf[n];
        defs->d[n].value = defs->buf[n + 1];
        /* Slot n+1's dev_define stays unused; keep the pairing simple. */
        defs->d[n + 1].name = NULL;
        n += 2;
    }
    if (im->defines)
        n += im->defines(s, c, p, defs->d + n, defs->buf + n, cap - n);
    /* Compact: drop the unused slots left by the S_ pairs. */
    int w = 0;
    for (int i = 0; i < n; i++)
        if (defs->d[i].name)
            defs->d[w++] = defs->d[i];
    defs->n = w;
    req->defines = defs->d;
    req->n_defines = w;
    return MT_OK;
}

void kern_source_hash(const kern_family *f, dev_backend b, char hex[65])
{
    const kern_impl *im = kern_family_impl(f, b);
    mt_sha256 c;
    mt_sha256_init(&c);
    mt_sha256_update_str(&c, f->name);
    char v[16];
    snprintf(v, sizeof v, "%d", f->version);
    mt_sha256_update_str(&c, v);
    if (im) {
        mt_sha256_update_str(&c, im->source);
        mt_sha256_update_str(&c, im->source_text ? im->source_text
                                                  : kern_source_get(im->source));
    }
    mt_sha256_hex(&c, hex);
}

/* ---- comparison -------------------------------------------------------------- */

static double load_elem(kern_dtype t, const void *p, size_t i)
{
    switch (t) {
    case KERN_DT_F32:
        return ((const float *)p)[i];
    case KERN_DT_BF16:
        return mt_bf16_to_f32(((const uint16_t *)p)[i]);
    case KERN_DT_F16:
        return mt_f16_to_f32(((const uint16_t *)p)[i]);
    case KERN_DT_FP8E4M3:
        return mt_fp8e4m3_to_f32(((const uint8_t *)p)[i]);
    default:
        return 0;
    }
}

static size_t elem_size(kern_dtype t)
{
    switch (t) {
    case KERN_DT_F32:
    case KERN_DT_I32:
        return 4;
    case KERN_DT_BF16:
    case KERN_DT_F16:
        return 2;
    default:
        return 1;
    }
}

bool kern_compare_default(const kern_buf_desc *b, const void *got, const void *want,
                          char *why, size_t cap)
{
    kern_dtype t = b->dtype;
    if (t == KERN_DT_I32 || t == KERN_DT_U8 || t == KERN_DT_MXFP4) {
        size_t es = elem_size(t), n = b->bytes / es;
        for (size_t i = 0; i < n; i++) {
            if (memcmp((const char *)got + i * es, (const char *)want + i * es, es)) {
                long long g = t == KERN_DT_I32 ? ((const int32_t *)got)[i]
                                               : ((const uint8_t *)got)[i];
                long long w = t == KERN_DT_I32 ? ((const int32_t *)want)[i]
                                               : ((const uint8_t *)want)[i];
                snprintf(why, cap, "%s[%zu] = %lld, expected %lld", b->name, i, g, w);
                return false;
            }
        }
        return true;
    }
    size_t n = b->bytes / elem_size(t);
    size_t row = b->row > 0 ? (size_t)b->row : n;
    double worst = 0;
    size_t worst_i = 0;
    for (size_t r0 = 0; r0 < n; r0 += row) {
        size_t r1 = r0 + row < n ? r0 + row : n;
        for (size_t i = r0; i < r1; i++) {
            double g = load_elem(t, got, i), w = load_elem(t, want, i);
            if (isnan(w) && isnan(g))
                continue;
            if (isnan(g) || isnan(w) || isinf(g) != isinf(w)) {
                snprintf(why, cap, "%s row %zu [%zu]: got %g, expected %g", b->name,
                         r0 / row, i - r0, g, w);
                return false;
            }
            double e = fabs(g - w) / (b->atol + b->rtol * fabs(w));
            if (e > worst) {
                worst = e;
                worst_i = i;
            }
        }
    }
    if (worst > 1.0) {
        double g = load_elem(t, got, worst_i), w = load_elem(t, want, worst_i);
        snprintf(why, cap,
                 "%s row %zu [%zu]: got %.7g, expected %.7g (error %.3g of tolerance "
                 "atol %.2g + rtol %.2g)", b->name, worst_i / row, worst_i % row, g, w,
                 worst, b->atol, b->rtol);
        return false;
    }
    return true;
}

mt_status kern_get(const kern_ctx *c, const char *name, const char *sig,
                   dev_kernel **k, mt_err *err)
{
    return dev_module_get_kernel(c->mod, name, sig, k, err);
}

/* The matrix fragment tiles of prelude_gpu.h, by backend (family.h). */
bool kern_mma_tile(const dev_props *p, int mma, int *tm, int *tn, int *tk)
{
    bool wave64, have;
    if (p->backend == DEV_BACKEND_EMU)
        wave64 = p->warp_size == 64;
    else
        wave64 = p->backend == DEV_BACKEND_HIP;
    if (p->backend == DEV_BACKEND_HIP)
        have = !strcmp(p->arch, "gfx90a") || !strncmp(p->arch, "gfx94", 5) ||
               !strcmp(p->arch, "gfx950");
    else if (p->backend == DEV_BACKEND_CUDA)
        have = !strncmp(p->arch, "sm_", 3) && atoi(p->arch + 3) >= 80;
    else
        have = p->backend == DEV_BACKEND_EMU;
    if (mma == 3) { /* fp8 e4m3 operands: CDNA3 on, Ada/Hopper on */
        if (p->backend == DEV_BACKEND_HIP)
            have = !strncmp(p->arch, "gfx94", 5) || !strcmp(p->arch, "gfx950");
        else if (p->backend == DEV_BACKEND_CUDA)
            have = have && atoi(p->arch + 3) >= 89;
    }
    if (!have || (mma == 2 && !wave64) || mma < 1 || mma > 3)
        return false;
    *tm = mma == 2 ? 32 : 16;
    *tn = mma == 2 ? 32 : wave64 ? 16 : 8;
    *tk = mma == 2 ? 8 : mma == 3 ? 32 : 16;
    return true;
}
