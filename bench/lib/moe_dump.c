/* moe_dump.c: the MoE layer as raw files for a peer implementation (see
 * moe_dump.h). */
#define _GNU_SOURCE
#include "moe_dump.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/files.h"
#include "common/numeric.h"
#include "kernels/moe/moe_common.h"

enum { MAX_MS = 32, ROUTER_CHECK = 64 };

typedef struct dumped_m {
    int64_t m;
    int checked, agree; /* tokens the host router checked, and agreed on */
} dumped_m;

struct moe_dump {
    char dir[1024];
    char shape[128], device[64];
    moe_dims d;
    bool *used; /* [E]: experts some dumped M routed to */
    dumped_m ms[MAX_MS];
    int n_ms;
};

/* Writes n bytes of data to dir/name (created or truncated). */
static mt_status write_file(const moe_dump *dp, const char *name, const void *data, size_t n,
                            mt_err *err)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dp->dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return mt_fail(err, MT_E_IO, "dump: %s: %s", path, strerror(errno));
    bool ok = n == 0 || fwrite(data, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    return ok ? MT_OK : mt_fail(err, MT_E_IO, "dump: %s: write failed", path);
}

mt_status moe_dump_open(const char *dir, const moe_dims *d, const char *shape,
                        const char *device, moe_dump **out, mt_err *err)
{
    *out = NULL;
    moe_dump *dp = calloc(1, sizeof *dp);
    bool *used = calloc((size_t)(d->n_experts > 0 ? d->n_experts : 1), sizeof *used);
    if (!dp || !used) {
        free(dp);
        free(used);
        return mt_fail(err, MT_E_NOMEM, "dump: out of memory");
    }
    if (strlen(dir) >= sizeof dp->dir) {
        free(dp);
        free(used);
        return mt_fail(err, MT_E_INVALID, "dump: directory name too long: %s", dir);
    }
    snprintf(dp->dir, sizeof dp->dir, "%s", dir);
    snprintf(dp->shape, sizeof dp->shape, "%s", shape ? shape : "");
    snprintf(dp->device, sizeof dp->device, "%s", device ? device : "");
    dp->d = *d;
    dp->used = used;
    mt_status st = mt_mkdirs(dir, err);
    if (st != MT_OK) {
        moe_dump_close(dp);
        return st;
    }
    *out = dp;
    return MT_OK;
}

void moe_dump_close(moe_dump *dp)
{
    if (!dp)
        return;
    free(dp->used);
    free(dp);
}

/* The weight of expert e for token x: its sigmoid score as the reference
 * router computes it (moe_route_ref_token: the logit in double, rounded to
 * float). */
static double expert_score(const moe_dims *d, const uint16_t *x, const uint16_t *gate, int e)
{
    double acc = 0.0;
    const uint16_t *g = gate + (int64_t)e * d->hidden;
    for (int64_t k = 0; k < d->hidden; k++)
        acc += (double)mt_bf16_to_f32(x[k]) * (double)mt_bf16_to_f32(g[k]);
    return 1.0 / (1.0 + exp(-(double)(float)acc));
}

mt_status moe_dump_tokens(moe_dump *dp, int64_t M, const uint16_t *x, const int32_t *ids,
                          const float *y, const uint16_t *gate, const float *bias, mt_err *err)
{
    const moe_dims *d = &dp->d;
    const int64_t H = d->hidden, E = d->n_experts;
    const int K = d->topk;
    if (dp->n_ms >= MAX_MS)
        return mt_fail(err, MT_E_INVALID, "dump: at most %d token counts", MAX_MS);
    for (int64_t q = 0; q < M * K; q++)
        if (ids[q] < 0 || ids[q] >= E)
            return mt_fail(err, MT_E_INVALID, "dump: M=%lld pair %lld routed to expert %d of %lld",
                           (long long)M, (long long)q, ids[q], (long long)E);
    float *tw = malloc(sizeof(float) * (size_t)(M * K));
    if (!tw)
        return mt_fail(err, MT_E_NOMEM, "dump: out of memory");
    for (int64_t t = 0; t < M; t++) {
        double s[64], sum = 0.0;
        for (int j = 0; j < K && j < 64; j++) {
            s[j] = expert_score(d, x + t * H, gate, ids[t * K + j]);
            sum += s[j];
        }
        for (int j = 0; j < K && j < 64; j++)
            tw[t * K + j] = (float)((d->norm ? s[j] / (sum + 1e-20) : s[j]) * d->scale);
    }
    /* The host router on the first tokens: the device should agree but for
     * near ties. */
    dumped_m *dm = &dp->ms[dp->n_ms];
    *dm = (dumped_m){.m = M};
    moe_route_dims rd = {.h = H, .e = E, .topk = K, .ngroup = d->ngroup, .topkg = d->topkg,
                         .scale = d->scale, .norm = d->norm};
    int32_t rid[64];
    float rw[64];
    for (int64_t t = 0; t < M && t < ROUTER_CHECK && K <= 64; t++) {
        moe_route_ref_token(&rd, x + t * H, gate, bias, rid, rw, NULL, NULL);
        bool same = true;
        for (int j = 0; j < K; j++) {
            bool found = false;
            for (int i = 0; i < K; i++)
                found |= rid[i] == ids[t * K + j];
            same &= found;
        }
        dm->checked++;
        dm->agree += same;
    }
    char name[64];
    mt_status st = MT_OK;
    snprintf(name, sizeof name, "x_%lld.bf16", (long long)M);
    st = write_file(dp, name, x, (size_t)(M * H) * 2, err);
    snprintf(name, sizeof name, "ids_%lld.i32", (long long)M);
    if (st == MT_OK)
        st = write_file(dp, name, ids, (size_t)(M * K) * 4, err);
    snprintf(name, sizeof name, "tw_%lld.f32", (long long)M);
    if (st == MT_OK)
        st = write_file(dp, name, tw, (size_t)(M * K) * 4, err);
    snprintf(name, sizeof name, "y_%lld.f32", (long long)M);
    if (st == MT_OK)
        st = write_file(dp, name, y, (size_t)(M * H) * 4, err);
    free(tw);
    if (st != MT_OK)
        return st;
    for (int64_t q = 0; q < M * K; q++)
        dp->used[ids[q]] = true;
    dp->n_ms++;
    return MT_OK;
}

/* Appends the Quark rows of matrices e of w/s ([rows, k] each, in layout
 * wl; wl 1 carries the scales inside w) to the open files fw and fs. */
static mt_status dump_w4(dev_device *dev, const void *w, const void *s, int wl, int64_t e,
                         int64_t rows, int64_t k, FILE *fw, FILE *fs, uint8_t *buf,
                         uint8_t *grouped, const char *what, mt_err *err)
{
    const size_t pb = (size_t)(rows * k / 2), sb = (size_t)(rows * k / 32);
    mt_status st;
    if (wl == 1) {
        const size_t gb = (size_t)moe_w4_bytes(1, rows, k);
        st = dev_copy_from(dev, grouped, (const uint8_t *)w + (size_t)moe_w4_bytes(1, e * rows, k),
                           gb, err);
        if (st == MT_OK)
            moe_w4_ungroup16(grouped, rows, k, buf, buf + pb);
    } else {
        st = dev_copy_from(dev, buf, (const uint8_t *)w + (size_t)e * pb, pb, err);
        if (st == MT_OK)
            st = dev_copy_from(dev, buf + pb, (const uint8_t *)s + (size_t)e * sb, sb, err);
    }
    if (st != MT_OK)
        return mt_err_prefix(err, "dump: %s of expert %lld", what, (long long)e);
    if (fwrite(buf, 1, pb, fw) != pb || fwrite(buf + pb, 1, sb, fs) != sb)
        return mt_fail(err, MT_E_IO, "dump: writing %s: %s", what, strerror(errno));
    return MT_OK;
}

/* One weight pair (packed, scales) of matrices [rows, k] for each expert of
 * list[0:n] into dir/<wname> and dir/<sname>. */
static mt_status dump_pair(const moe_dump *dp, dev_device *dev, const void *w, const void *s,
                           int wl, const int32_t *list, int64_t n, int64_t rows, int64_t k,
                           const char *wname, const char *sname, mt_err *err)
{
    char pw[1200], ps[1200];
    snprintf(pw, sizeof pw, "%s/%s", dp->dir, wname);
    snprintf(ps, sizeof ps, "%s/%s", dp->dir, sname);
    FILE *fw = fopen(pw, "wb"), *fs = fopen(ps, "wb");
    uint8_t *buf = malloc((size_t)(rows * k / 2 + rows * k / 32));
    uint8_t *grouped = wl == 1 ? malloc((size_t)moe_w4_bytes(1, rows, k)) : NULL;
    mt_status st = MT_OK;
    if (!fw || !fs)
        st = mt_fail(err, MT_E_IO, "dump: %s: %s", !fw ? pw : ps, strerror(errno));
    else if (!buf || (wl == 1 && !grouped))
        st = mt_fail(err, MT_E_NOMEM, "dump: out of memory");
    for (int64_t i = 0; i < n && st == MT_OK; i++)
        st = dump_w4(dev, w, s, wl, list[i], rows, k, fw, fs, buf, grouped, wname, err);
    bool closed = true;
    if (fw && fclose(fw) != 0)
        closed = false;
    if (fs && fclose(fs) != 0)
        closed = false;
    if (st == MT_OK && !closed)
        st = mt_fail(err, MT_E_IO, "dump: %s: write failed", wname);
    free(buf);
    free(grouped);
    return st;
}

static const char *act_name(const moe_dims *d)
{
    return d->a4 ? "mxfp4" : d->a8 ? "i8" : "bf16";
}

static cJSON *file_entry(const char *name, const char *dtype, const int64_t *shape, int rank)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "file", name);
    cJSON_AddStringToObject(o, "dtype", dtype);
    cJSON *sh = cJSON_AddArrayToObject(o, "shape");
    for (int i = 0; i < rank; i++)
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shape[i]));
    return o;
}

static mt_status write_meta(const moe_dump *dp, int64_t n, mt_err *err)
{
    const moe_dims *d = &dp->d;
    const int64_t H = d->hidden, I = d->inter, E = d->n_experts, S = d->shared_inter;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddNumberToObject(m, "format", 1);
    cJSON_AddStringToObject(m, "shape", dp->shape);
    cJSON_AddStringToObject(m, "device", dp->device);
    cJSON_AddNumberToObject(m, "hidden", (double)H);
    cJSON_AddNumberToObject(m, "inter", (double)I);
    cJSON_AddNumberToObject(m, "n_experts", (double)E);
    cJSON_AddNumberToObject(m, "topk", d->topk);
    cJSON_AddNumberToObject(m, "ngroup", d->ngroup);
    cJSON_AddNumberToObject(m, "topkg", d->topkg);
    cJSON_AddNumberToObject(m, "scale", d->scale);
    cJSON_AddBoolToObject(m, "norm", d->norm);
    cJSON_AddNumberToObject(m, "shared_inter", (double)S);
    cJSON_AddStringToObject(m, "act", act_name(d));
    cJSON_AddStringToObject(m, "layout", "quark");
    cJSON_AddNumberToObject(m, "experts_dumped", (double)n);
    cJSON *f = cJSON_AddObjectToObject(m, "files");
    struct {
        const char *key, *name, *dtype;
        int64_t shape[3];
        int rank;
    } files[] = {
        {"gate", "gate.bf16", "bf16", {E, H}, 2},
        {"bias", "bias.f32", "f32", {E}, 1},
        {"experts", "experts.i32", "i32", {n}, 1},
        {"w13", "w13.u8", "u8", {n, 2 * I, H / 2}, 3},
        {"s13", "s13.u8", "u8", {n, 2 * I, H / 32}, 3},
        {"w2", "w2.u8", "u8", {n, H, I / 2}, 3},
        {"s2", "s2.u8", "u8", {n, H, I / 32}, 3},
        {"sh_w13", "sh_w13.u8", "u8", {2 * S, H / 2}, 2},
        {"sh_s13", "sh_s13.u8", "u8", {2 * S, H / 32}, 2},
        {"sh_w2", "sh_w2.u8", "u8", {H, S / 2}, 2},
        {"sh_s2", "sh_s2.u8", "u8", {H, S / 32}, 2},
    };
    const int nf = S > 0 ? (int)(sizeof files / sizeof files[0]) : 7;
    for (int i = 0; i < nf; i++)
        cJSON_AddItemToObject(f, files[i].key, file_entry(files[i].name, files[i].dtype,
                                                          files[i].shape, files[i].rank));
    cJSON *toks = cJSON_AddArrayToObject(m, "tokens");
    for (int i = 0; i < dp->n_ms; i++) {
        const dumped_m *dm = &dp->ms[i];
        long long M = (long long)dm->m;
        char nx[64], ni[64], nw[64], ny[64];
        snprintf(nx, sizeof nx, "x_%lld.bf16", M);
        snprintf(ni, sizeof ni, "ids_%lld.i32", M);
        snprintf(nw, sizeof nw, "tw_%lld.f32", M);
        snprintf(ny, sizeof ny, "y_%lld.f32", M);
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "m", (double)M);
        cJSON_AddItemToObject(t, "x", file_entry(nx, "bf16", (int64_t[]){M, H}, 2));
        cJSON_AddItemToObject(t, "ids", file_entry(ni, "i32", (int64_t[]){M, d->topk}, 2));
        cJSON_AddItemToObject(t, "weights", file_entry(nw, "f32", (int64_t[]){M, d->topk}, 2));
        cJSON_AddItemToObject(t, "y", file_entry(ny, "f32", (int64_t[]){M, H}, 2));
        cJSON_AddNumberToObject(t, "router_checked", dm->checked);
        cJSON_AddNumberToObject(t, "router_agree", dm->agree);
        cJSON_AddItemToArray(toks, t);
    }
    /* test_moe_pipeline's rule against a reference that quantizes as the
     * layer does: |got - want| <= abs_of_row_max * max|want of the row| +
     * rel * |want|, per element. */
    cJSON *tol = cJSON_AddObjectToObject(m, "tolerance");
    cJSON_AddNumberToObject(tol, "abs_of_row_max", 1e-2);
    cJSON_AddNumberToObject(tol, "rel", 1e-2);
    char *text = cJSON_Print(m);
    cJSON_Delete(m);
    if (!text)
        return mt_fail(err, MT_E_NOMEM, "dump: out of memory");
    mt_status st = write_file(dp, "meta.json", text, strlen(text), err);
    free(text);
    return st;
}

mt_status moe_dump_finish(moe_dump *dp, dev_device *dev, const moe_weights *w, int wl,
                          const uint16_t *gate, const float *bias, mt_err *err)
{
    const moe_dims *d = &dp->d;
    const int64_t H = d->hidden, I = d->inter, E = d->n_experts, S = d->shared_inter;
    int32_t *list = malloc(sizeof(int32_t) * (size_t)(E > 0 ? E : 1));
    if (!list)
        return mt_fail(err, MT_E_NOMEM, "dump: out of memory");
    int64_t n = 0;
    for (int64_t e = 0; e < E; e++)
        if (dp->used[e])
            list[n++] = (int32_t)e;
    const int32_t zero = 0;
    mt_status st = write_file(dp, "gate.bf16", gate, (size_t)(E * H) * 2, err);
    if (st == MT_OK)
        st = write_file(dp, "bias.f32", bias, (size_t)E * 4, err);
    if (st == MT_OK)
        st = write_file(dp, "experts.i32", list, (size_t)n * 4, err);
    if (st == MT_OK)
        st = dump_pair(dp, dev, w->w13, w->s13, wl, list, n, 2 * I, H, "w13.u8", "s13.u8", err);
    if (st == MT_OK)
        st = dump_pair(dp, dev, w->w2, w->s2, wl, list, n, H, I, "w2.u8", "s2.u8", err);
    if (st == MT_OK && S > 0)
        st = dump_pair(dp, dev, w->sh_w13, w->sh_s13, wl, &zero, 1, 2 * S, H, "sh_w13.u8",
                       "sh_s13.u8", err);
    if (st == MT_OK && S > 0)
        st = dump_pair(dp, dev, w->sh_w2, w->sh_s2, wl, &zero, 1, H, S, "sh_w2.u8", "sh_s2.u8",
                       err);
    if (st == MT_OK)
        st = write_meta(dp, n, err);
    free(list);
    return st;
}
