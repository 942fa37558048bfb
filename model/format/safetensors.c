/* safetensors.c: header validation and memory mapping of safetensors files,
 * sharded checkpoint folders, and the writer used by make-tiny-model. */
#include "safetensors.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/files.h"

/* The reference implementation refuses headers over 100 MB. */
#define HEADER_MAX (100u * 1000u * 1000u)
/* JSON integers are doubles: exact up to 2^53. */
#define JSON_INT_MAX 9007199254740992.0

static const struct {
    const char *name;
    size_t size;
} dtypes[MODEL_DTYPE_COUNT] = {
    [MODEL_DTYPE_BF16] = {"BF16", 2},   [MODEL_DTYPE_F16] = {"F16", 2},
    [MODEL_DTYPE_F32] = {"F32", 4},     [MODEL_DTYPE_U8] = {"U8", 1},
    [MODEL_DTYPE_I32] = {"I32", 4},     [MODEL_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
};
_Static_assert(sizeof dtypes / sizeof dtypes[0] == MODEL_DTYPE_COUNT, "dtype table");

const char *model_dtype_name(model_dtype dt)
{
    return (unsigned)dt < MODEL_DTYPE_COUNT ? dtypes[dt].name : "?";
}

size_t model_dtype_size(model_dtype dt)
{
    return (unsigned)dt < MODEL_DTYPE_COUNT ? dtypes[dt].size : 0;
}

bool model_dtype_parse(const char *s, model_dtype *out)
{
    for (int i = 0; i < MODEL_DTYPE_COUNT; i++)
        if (!strcmp(s, dtypes[i].name)) {
            *out = (model_dtype)i;
            return true;
        }
    return false;
}

char *model_tensor_describe(const model_tensor_info *t, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "%s[", model_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? ", " : "", t->shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
    return buf;
}

int64_t model_tensor_numel(const model_tensor_info *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* ---- one file ------------------------------------------------------------ */

typedef struct meta_kv {
    char *key, *value;
} meta_kv;

struct model_st_file {
    char *path;
    const uint8_t *base;
    size_t size;
    bool mapped;
    uint64_t header_len;
    model_tensor_info *tensors; /* sorted by name */
    size_t count;
    meta_kv *meta;
    size_t meta_count;
};

static int by_name(const void *a, const void *b)
{
    return strcmp(((const model_tensor_info *)a)->name, ((const model_tensor_info *)b)->name);
}

static int by_offset(const void *a, const void *b)
{
    const model_tensor_info *x = *(const model_tensor_info *const *)a;
    const model_tensor_info *y = *(const model_tensor_info *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    /* Zero-byte tensors sort before a tensor at the same offset. */
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* A JSON number that is a non-negative integer no larger than 2^53. */
static bool json_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= JSON_INT_MAX) || d != (double)(uint64_t)d)
        return false;
    *out = (uint64_t)d;
    return true;
}

static uint64_t read_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Parses one tensor entry into t (name already set). data_start is the
 * absolute offset of the data section. */
static mt_status parse_entry(model_st_file *f, const cJSON *e, model_tensor_info *t,
                             uint64_t data_start, mt_err *err)
{
    const char *p = f->path, *n = t->name;
    uint64_t data_len = f->size - data_start;
    if (!cJSON_IsObject(e))
        return mt_fail(err, MT_E_FORMAT, "%s: tensor '%s': header entry is not an object "
                       "(header at bytes 8..%" PRIu64 ")", p, n, data_start);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return mt_fail(err, MT_E_FORMAT, "%s: tensor '%s': missing or non-string \"dtype\"", p, n);
    if (!model_dtype_parse(dt->valuestring, &t->dtype))
        return mt_fail(err, MT_E_UNSUPPORTED, "%s: tensor '%s': unknown dtype \"%s\" (this loader "
                       "reads BF16, F16, F32, U8, I32, F8_E4M3)", p, n, dt->valuestring);
    if (!cJSON_IsArray(sh))
        return mt_fail(err, MT_E_FORMAT, "%s: tensor '%s': missing or non-array \"shape\"", p, n);
    int nd = cJSON_GetArraySize(sh);
    if (nd > MODEL_MAX_DIMS)
        return mt_fail(err, MT_E_UNSUPPORTED, "%s: tensor '%s': %d dimensions (at most %d)", p, n,
                       nd, MODEL_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    bool overflow = false;
    for (int i = 0; i < nd; i++) {
        uint64_t d;
        if (!json_uint(cJSON_GetArrayItem(sh, i), &d))
            return mt_fail(err, MT_E_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative "
                           "integer", p, n, i);
        t->shape[i] = (int64_t)d;
        if (d && numel > UINT64_MAX / d)
            overflow = true;
        numel *= d;
    }
    uint64_t begin, end;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
        !json_uint(cJSON_GetArrayItem(off, 0), &begin) ||
        !json_uint(cJSON_GetArrayItem(off, 1), &end))
        return mt_fail(err, MT_E_FORMAT, "%s: tensor '%s': \"data_offsets\" must be two "
                       "non-negative integers", p, n);
    if (end < begin)
        return mt_fail(err, MT_E_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] end before they begin (byte %" PRIu64 ")", p, n, begin, end,
                       data_start + begin);
    if (end > data_len)
        return mt_fail(err, MT_E_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] end at byte %" PRIu64 ", past the end of the file (%zu bytes): the "
                       "file is truncated or the offsets are out of range", p, n, begin, end,
                       data_start + end, f->size);
    size_t es = model_dtype_size(t->dtype);
    if (overflow || numel > UINT64_MAX / es || numel * es != end - begin) {
        char d[128];
        t->nbytes = end - begin;
        return mt_fail(err, MT_E_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] hold %" PRIu64 " bytes at byte %" PRIu64 ", but %s needs %s%" PRIu64,
                       p, n, begin, end, end - begin, data_start + begin,
                       model_tensor_describe(t, d, sizeof d), overflow ? "more than " : "",
                       overflow ? UINT64_MAX : numel * es);
    }
    t->offset = data_start + begin;
    t->nbytes = end - begin;
    t->data = f->base + t->offset;
    t->file = f->path;
    return MT_OK;
}

static mt_status parse_metadata(model_st_file *f, const cJSON *m, mt_err *err)
{
    if (cJSON_IsNull(m))
        return MT_OK;
    if (!cJSON_IsObject(m))
        return mt_fail(err, MT_E_FORMAT, "%s: \"__metadata__\" is not an object", f->path);
    int n = cJSON_GetArraySize(m);
    f->meta = calloc((size_t)n + 1, sizeof *f->meta);
    if (!f->meta)
        return mt_fail(err, MT_E_NOMEM, "%s: out of memory for metadata", f->path);
    for (const cJSON *kv = m->child; kv; kv = kv->next) {
        if (!cJSON_IsString(kv))
            return mt_fail(err, MT_E_FORMAT, "%s: \"__metadata__\" value of '%s' is not a string",
                           f->path, kv->string);
        meta_kv *e = &f->meta[f->meta_count++];
        e->key = strdup(kv->string);
        e->value = strdup(kv->valuestring);
        if (!e->key || !e->value)
            return mt_fail(err, MT_E_NOMEM, "%s: out of memory for metadata", f->path);
    }
    return MT_OK;
}

/* Checks that the tensors tile the data section exactly. */
static mt_status check_layout(model_st_file *f, uint64_t data_start, mt_err *err)
{
    if (f->count == 0) {
        if (f->size != data_start)
            return mt_fail(err, MT_E_FORMAT, "%s: no tensors, but %" PRIu64 " bytes follow the "
                           "header at byte %" PRIu64, f->path, f->size - data_start, data_start);
        return MT_OK;
    }
    const model_tensor_info **o = malloc(f->count * sizeof *o);
    if (!o)
        return mt_fail(err, MT_E_NOMEM, "%s: out of memory", f->path);
    for (size_t i = 0; i < f->count; i++)
        o[i] = &f->tensors[i];
    qsort(o, f->count, sizeof *o, by_offset);
    mt_status st = MT_OK;
    uint64_t at = data_start;
    const model_tensor_info *prev = NULL;
    for (size_t i = 0; i < f->count && st == MT_OK; i++) {
        const model_tensor_info *t = o[i];
        if (t->offset < at)
            st = mt_fail(err, MT_E_FORMAT, "%s: tensor '%s' (bytes %" PRIu64 "..%" PRIu64
                         ") overlaps tensor '%s' (bytes %" PRIu64 "..%" PRIu64 ")", f->path,
                         t->name, t->offset, t->offset + t->nbytes, prev->name, prev->offset,
                         prev->offset + prev->nbytes);
        else if (t->offset > at)
            st = mt_fail(err, MT_E_FORMAT, "%s: tensor '%s' starts at byte %" PRIu64 ", leaving "
                         "a gap of %" PRIu64 " bytes after %s (the data section must be packed)",
                         f->path, t->name, t->offset, t->offset - at,
                         prev ? prev->name : "the header");
        at = t->offset + t->nbytes;
        prev = t;
    }
    if (st == MT_OK && at != f->size)
        st = mt_fail(err, MT_E_FORMAT, "%s: %" PRIu64 " bytes after the last tensor '%s' (ends at "
                     "byte %" PRIu64 ", file has %zu)", f->path, f->size - at, prev->name, at,
                     f->size);
    free(o);
    return st;
}

static mt_status parse_file(model_st_file *f, mt_err *err)
{
    const char *p = f->path;
    if (f->size < 8)
        return mt_fail(err, MT_E_FORMAT, "%s: %zu bytes, too short for the 8-byte header length "
                       "at byte 0", p, f->size);
    uint64_t n = read_le64(f->base);
    if (n > f->size - 8)
        return mt_fail(err, MT_E_FORMAT, "%s: header length %" PRIu64 " (at byte 0) runs past the "
                       "end of the file: the header would end at byte %" PRIu64 ", the file has "
                       "%zu bytes", p, n, n + 8 < n ? UINT64_MAX : n + 8, f->size);
    if (n > HEADER_MAX)
        return mt_fail(err, MT_E_FORMAT, "%s: header length %" PRIu64 " (at byte 0) is over the "
                       "%u-byte limit", p, n, HEADER_MAX);
    f->header_len = n;
    const char *json = (const char *)f->base + 8;
    if (n < 2 || json[0] != '{')
        return mt_fail(err, MT_E_FORMAT, "%s: the header at byte 8 is not a JSON object", p);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)n, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - json) : 0;
        return mt_fail(err, MT_E_FORMAT, "%s: header JSON is malformed near byte %zu", p, 8 + at);
    }
    mt_status st = MT_OK;
    for (const char *q = end; q < json + n && st == MT_OK; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r')
            st = mt_fail(err, MT_E_FORMAT, "%s: unexpected byte 0x%02x after the header JSON "
                         "at byte %zu", p, (unsigned char)*q, 8 + (size_t)(q - json));
    if (st == MT_OK && !cJSON_IsObject(root))
        st = mt_fail(err, MT_E_FORMAT, "%s: the header at byte 8 is not a JSON object", p);
    uint64_t data_start = 8 + n;
    if (st == MT_OK) {
        size_t cap = (size_t)cJSON_GetArraySize(root);
        f->tensors = calloc(cap + 1, sizeof *f->tensors);
        if (!f->tensors)
            st = mt_fail(err, MT_E_NOMEM, "%s: out of memory for %zu tensors", p, cap);
    }
    for (const cJSON *e = st == MT_OK ? root->child : NULL; e && st == MT_OK; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            st = parse_metadata(f, e, err);
            continue;
        }
        model_tensor_info *t = &f->tensors[f->count];
        t->name = strdup(e->string);
        if (!t->name) {
            st = mt_fail(err, MT_E_NOMEM, "%s: out of memory", p);
            break;
        }
        f->count++;
        st = parse_entry(f, e, t, data_start, err);
    }
    cJSON_Delete(root);
    if (st != MT_OK)
        return st;
    qsort(f->tensors, f->count, sizeof *f->tensors, by_name);
    for (size_t i = 1; i < f->count; i++)
        if (!strcmp(f->tensors[i].name, f->tensors[i - 1].name))
            return mt_fail(err, MT_E_FORMAT, "%s: tensor '%s' appears twice in the header", p,
                           f->tensors[i].name);
    return check_layout(f, data_start, err);
}

static model_st_file *file_new(const char *path)
{
    model_st_file *f = calloc(1, sizeof *f);
    if (f && !(f->path = strdup(path))) {
        free(f);
        f = NULL;
    }
    return f;
}

void model_st_close(model_st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->count; i++)
        free((char *)f->tensors[i].name);
    free(f->tensors);
    for (size_t i = 0; i < f->meta_count; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->meta);
    if (f->mapped)
        munmap((void *)f->base, f->size);
    free(f->path);
    free(f);
}

mt_status model_st_open_memory(const char *label, const void *buf, size_t len,
                               model_st_file **out, mt_err *err)
{
    *out = NULL;
    model_st_file *f = file_new(label);
    if (!f)
        return mt_fail(err, MT_E_NOMEM, "%s: out of memory", label);
    f->base = buf;
    f->size = len;
    mt_status st = parse_file(f, err);
    if (st != MT_OK) {
        model_st_close(f);
        return st;
    }
    *out = f;
    return MT_OK;
}

mt_status model_st_open(const char *path, model_st_file **out, mt_err *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mt_fail(err, MT_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return mt_fail(err, MT_E_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return mt_fail(err, MT_E_IO, "%s: not a regular file", path);
    }
    model_st_file *f = file_new(path);
    if (!f) {
        close(fd);
        return mt_fail(err, MT_E_NOMEM, "%s: out of memory", path);
    }
    f->size = (size_t)sb.st_size;
    if (f->size > 0) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            model_st_close(f);
            return mt_fail(err, MT_E_IO, "%s: mmap of %zu bytes failed: %s", path,
                           (size_t)sb.st_size, strerror(e));
        }
        f->base = m;
        f->mapped = true;
    } else {
        f->base = (const uint8_t *)"";
    }
    close(fd);
    mt_status st = parse_file(f, err);
    if (st != MT_OK) {
        model_st_close(f);
        return st;
    }
    *out = f;
    return MT_OK;
}

const char *model_st_path(const model_st_file *f) { return f->path; }
size_t model_st_count(const model_st_file *f) { return f->count; }

const model_tensor_info *model_st_at(const model_st_file *f, size_t i)
{
    return i < f->count ? &f->tensors[i] : NULL;
}

const model_tensor_info *model_st_find(const model_st_file *f, const char *name)
{
    model_tensor_info key = {.name = name};
    return bsearch(&key, f->tensors, f->count, sizeof key, by_name);
}

const char *model_st_metadata(const model_st_file *f, const char *key)
{
    for (size_t i = 0; i < f->meta_count; i++)
        if (!strcmp(f->meta[i].key, key))
            return f->meta[i].value;
    return NULL;
}

/* ---- a checkpoint folder ------------------------------------------------- */

struct model_st_set {
    model_st_file **shards;
    size_t shard_count;
    const model_tensor_info **all; /* sorted by name */
    size_t count;
    uint64_t total_bytes;
};

static int ptr_by_name(const void *a, const void *b)
{
    return strcmp((*(const model_tensor_info *const *)a)->name,
                  (*(const model_tensor_info *const *)b)->name);
}

void model_st_set_close(model_st_set *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->shard_count; i++)
        model_st_close(s->shards[i]);
    free(s->shards);
    free(s->all);
    free(s);
}

static bool plain_file_name(const char *s)
{
    return *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static mt_status set_add_shard(model_st_set *s, const char *dir, const char *name,
                               const char *why, mt_err *err)
{
    char *path = join(dir, name);
    if (!path)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    model_st_file *f = NULL;
    mt_status st = model_st_open(path, &f, err);
    free(path);
    if (st != MT_OK)
        return why ? mt_err_prefix(err, "%s", why) : st;
    s->shards[s->shard_count++] = f;
    return MT_OK;
}

/* Indexes every tensor of every shard; a name in two shards is an error. */
static mt_status set_collect(model_st_set *s, mt_err *err)
{
    size_t n = 0;
    for (size_t i = 0; i < s->shard_count; i++)
        n += model_st_count(s->shards[i]);
    s->all = malloc((n + 1) * sizeof *s->all);
    if (!s->all)
        return mt_fail(err, MT_E_NOMEM, "out of memory for %zu tensors", n);
    for (size_t i = 0; i < s->shard_count; i++)
        for (size_t j = 0; j < model_st_count(s->shards[i]); j++) {
            s->all[s->count++] = model_st_at(s->shards[i], j);
            s->total_bytes += model_st_at(s->shards[i], j)->nbytes;
        }
    qsort(s->all, s->count, sizeof *s->all, ptr_by_name);
    for (size_t i = 1; i < s->count; i++)
        if (!strcmp(s->all[i]->name, s->all[i - 1]->name))
            return mt_fail(err, MT_E_FORMAT, "tensor '%s' is in two shards: %s (byte %" PRIu64
                           ") and %s (byte %" PRIu64 ")", s->all[i]->name, s->all[i - 1]->file,
                           s->all[i - 1]->offset, s->all[i]->file, s->all[i]->offset);
    return MT_OK;
}

static mt_status set_open_index(model_st_set *s, const char *dir, const char *index_path,
                                mt_err *err)
{
    char *text = NULL;
    size_t len = 0;
    mt_status st = mt_file_read(index_path, &text, &len, err);
    if (st != MT_OK)
        return st;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        st = mt_fail(err, MT_E_FORMAT, "%s: malformed JSON near byte %zu", index_path,
                     end ? (size_t)(end - text) : 0);
        free(text);
        return st;
    }
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return mt_fail(err, MT_E_FORMAT, "%s: missing \"weight_map\" object", index_path);
    }
    size_t entries = (size_t)cJSON_GetArraySize(map);
    s->shards = calloc(entries + 1, sizeof *s->shards);
    const char **names = calloc(entries + 1, sizeof *names);
    if (!s->shards || !names) {
        free(names);
        cJSON_Delete(root);
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    }
    /* Open each distinct shard once, in order of first mention. */
    size_t nn = 0;
    for (const cJSON *e = map->child; e && st == MT_OK; e = e->next) {
        if (!cJSON_IsString(e) || !plain_file_name(e->valuestring)) {
            st = mt_fail(err, MT_E_FORMAT, "%s: weight_map entry for tensor '%s' must be a file "
                         "name inside %s", index_path, e->string, dir);
            break;
        }
        size_t k = 0;
        while (k < nn && strcmp(names[k], e->valuestring))
            k++;
        if (k < nn)
            continue;
        names[nn++] = e->valuestring;
        char why[512];
        snprintf(why, sizeof why, "%s names shard '%s' for tensor '%s'", index_path,
                 e->valuestring, e->string);
        st = set_add_shard(s, dir, e->valuestring, why, err);
    }
    if (st == MT_OK)
        st = set_collect(s, err);
    /* Every index entry must be in the shard it names, once, and every shard
     * tensor must be in the index. */
    bool *seen = st == MT_OK ? calloc(s->count + 1, 1) : NULL;
    if (st == MT_OK && !seen)
        st = mt_fail(err, MT_E_NOMEM, "out of memory");
    for (const cJSON *e = map->child; e && st == MT_OK; e = e->next) {
        const model_tensor_info *t = model_st_set_find(s, e->string);
        size_t k = 0;
        while (k < nn && strcmp(names[k], e->valuestring))
            k++;
        if (!t || !model_st_find(s->shards[k], e->string)) {
            st = mt_fail(err, MT_E_FORMAT, "%s: tensor '%s' is listed in shard %s, which does "
                         "not contain it%s%s", index_path, e->string, model_st_path(s->shards[k]),
                         t ? "; it is in " : "", t ? t->file : "");
            break;
        }
        const model_tensor_info *tp = t;
        size_t at = (size_t)((const model_tensor_info **)bsearch(&tp, s->all, s->count,
                                                                 sizeof *s->all, ptr_by_name) -
                             s->all);
        if (seen[at])
            st = mt_fail(err, MT_E_FORMAT, "%s: tensor '%s' is listed twice in weight_map",
                         index_path, e->string);
        seen[at] = true;
    }
    for (size_t i = 0; i < s->count && st == MT_OK; i++)
        if (!seen[i])
            st = mt_fail(err, MT_E_FORMAT, "%s: tensor '%s' (in %s at byte %" PRIu64 ") is not in "
                         "the index's weight_map", index_path, s->all[i]->name, s->all[i]->file,
                         s->all[i]->offset);
    free(seen);
    free(names);
    cJSON_Delete(root);
    return st;
}

mt_status model_st_set_open(const char *dir, model_st_set **out, mt_err *err)
{
    *out = NULL;
    model_st_set *s = calloc(1, sizeof *s);
    if (!s)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    char *index = join(dir, "model.safetensors.index.json");
    mt_status st;
    struct stat sb;
    if (!index) {
        st = mt_fail(err, MT_E_NOMEM, "out of memory");
    } else if (stat(index, &sb) == 0) {
        st = set_open_index(s, dir, index, err);
    } else {
        char *single = join(dir, "model.safetensors");
        if (!single || stat(single, &sb) != 0) {
            st = mt_fail(err, MT_E_NOT_FOUND, "%s: no model.safetensors.index.json and no "
                         "model.safetensors", dir);
        } else {
            s->shards = calloc(1, sizeof *s->shards);
            st = s->shards ? set_add_shard(s, dir, "model.safetensors", NULL, err)
                           : mt_fail(err, MT_E_NOMEM, "out of memory");
            if (st == MT_OK)
                st = set_collect(s, err);
        }
        free(single);
    }
    free(index);
    if (st != MT_OK) {
        model_st_set_close(s);
        return st;
    }
    *out = s;
    return MT_OK;
}

size_t model_st_set_count(const model_st_set *s) { return s->count; }

const model_tensor_info *model_st_set_at(const model_st_set *s, size_t i)
{
    return i < s->count ? s->all[i] : NULL;
}

const model_tensor_info *model_st_set_find(const model_st_set *s, const char *name)
{
    model_tensor_info key = {.name = name};
    const model_tensor_info *kp = &key;
    const model_tensor_info **hit = bsearch(&kp, s->all, s->count, sizeof *s->all, ptr_by_name);
    return hit ? *hit : NULL;
}

size_t model_st_set_shard_count(const model_st_set *s) { return s->shard_count; }

const model_st_file *model_st_set_shard(const model_st_set *s, size_t i)
{
    return i < s->shard_count ? s->shards[i] : NULL;
}

uint64_t model_st_set_total_bytes(const model_st_set *s) { return s->total_bytes; }

/* ---- writer -------------------------------------------------------------- */

typedef struct wtensor {
    char *name;
    model_dtype dtype;
    int ndim;
    int64_t shape[MODEL_MAX_DIMS];
    uint8_t *data;
    size_t nbytes;
} wtensor;

struct model_st_writer {
    wtensor *t;
    size_t count, cap;
    meta_kv *meta;
    size_t meta_count;
    uint64_t data_bytes;
};

mt_status model_st_writer_create(model_st_writer **out, mt_err *err)
{
    *out = calloc(1, sizeof **out);
    return *out ? MT_OK : mt_fail(err, MT_E_NOMEM, "out of memory");
}

void model_st_writer_destroy(model_st_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->count; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    for (size_t i = 0; i < w->meta_count; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->meta);
    free(w->t);
    free(w);
}

mt_status model_st_writer_add(model_st_writer *w, const char *name, model_dtype dt, int ndim,
                              const int64_t *shape, const void *data, size_t nbytes, mt_err *err)
{
    if ((unsigned)dt >= MODEL_DTYPE_COUNT || ndim < 0 || ndim > MODEL_MAX_DIMS)
        return mt_fail(err, MT_E_INVALID, "tensor '%s': bad dtype or rank", name);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return mt_fail(err, MT_E_INVALID, "tensor '%s': negative dimension", name);
        numel *= (uint64_t)shape[i];
    }
    if (numel * model_dtype_size(dt) != nbytes)
        return mt_fail(err, MT_E_INVALID, "tensor '%s': %zu bytes given, shape needs %" PRIu64,
                       name, nbytes, numel * model_dtype_size(dt));
    for (size_t i = 0; i < w->count; i++)
        if (!strcmp(w->t[i].name, name))
            return mt_fail(err, MT_E_INVALID, "tensor '%s' added twice", name);
    if (w->count == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t)
            return mt_fail(err, MT_E_NOMEM, "out of memory");
        w->t = t;
        w->cap = cap;
    }
    wtensor *t = &w->t[w->count];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->data = malloc(nbytes ? nbytes : 1);
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        return mt_fail(err, MT_E_NOMEM, "out of memory for tensor '%s'", name);
    }
    if (nbytes)
        memcpy(t->data, data, nbytes);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->nbytes = nbytes;
    w->count++;
    w->data_bytes += nbytes;
    return MT_OK;
}

mt_status model_st_writer_set_metadata(model_st_writer *w, const char *key, const char *value,
                                       mt_err *err)
{
    meta_kv *m = realloc(w->meta, (w->meta_count + 1) * sizeof *m);
    if (!m)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    w->meta = m;
    m[w->meta_count].key = strdup(key);
    m[w->meta_count].value = strdup(value);
    w->meta_count++;
    if (!m[w->meta_count - 1].key || !m[w->meta_count - 1].value)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    return MT_OK;
}

/* A growable text buffer for the header. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string literal. */
static void sb_json(sbuf *b, const char *s)
{
    sb_str(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            sb_put(b, e, 2);
        } else if (*c < 0x20) {
            sb_fmt(b, "\\u%04x", *c);
        } else {
            sb_put(b, (const char *)c, 1);
        }
    }
    sb_str(b, "\"");
}

mt_status model_st_writer_serialize(const model_st_writer *w, uint8_t **buf, size_t *len,
                                    mt_err *err)
{
    sbuf h = {0};
    sb_str(&h, "{");
    if (w->meta_count) {
        sb_str(&h, "\"__metadata__\":{");
        for (size_t i = 0; i < w->meta_count; i++) {
            if (i)
                sb_str(&h, ",");
            sb_json(&h, w->meta[i].key);
            sb_str(&h, ":");
            sb_json(&h, w->meta[i].value);
        }
        sb_str(&h, "}");
    }
    uint64_t at = 0;
    for (size_t i = 0; i < w->count; i++) {
        const wtensor *t = &w->t[i];
        if (i || w->meta_count)
            sb_str(&h, ",");
        sb_json(&h, t->name);
        sb_fmt(&h, ":{\"dtype\":\"%s\",\"shape\":[", model_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            sb_fmt(&h, "%s%" PRId64, d ? "," : "", t->shape[d]);
        sb_fmt(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", at, at + t->nbytes);
        at += t->nbytes;
    }
    sb_str(&h, "}");
    while (!h.oom && h.len % 8)
        sb_str(&h, " ");
    if (h.oom) {
        free(h.p);
        return mt_fail(err, MT_E_NOMEM, "out of memory for the safetensors header");
    }
    size_t total = 8 + h.len + (size_t)at;
    uint8_t *out = malloc(total);
    if (!out) {
        free(h.p);
        return mt_fail(err, MT_E_NOMEM, "out of memory for a %zu-byte safetensors file", total);
    }
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    memcpy(out + 8, h.p, h.len);
    size_t o = 8 + h.len;
    for (size_t i = 0; i < w->count; i++) {
        memcpy(out + o, w->t[i].data, w->t[i].nbytes);
        o += w->t[i].nbytes;
    }
    free(h.p);
    *buf = out;
    *len = total;
    return MT_OK;
}

mt_status model_st_writer_write(const model_st_writer *w, const char *path, mt_err *err)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    mt_status st = model_st_writer_serialize(w, &buf, &len, err);
    if (st == MT_OK)
        st = mt_file_write_atomic(path, buf, len, err);
    free(buf);
    return st;
}

size_t model_st_writer_count(const model_st_writer *w) { return w->count; }

const char *model_st_writer_name(const model_st_writer *w, size_t i)
{
    return i < w->count ? w->t[i].name : NULL;
}

uint64_t model_st_writer_data_bytes(const model_st_writer *w) { return w->data_bytes; }
