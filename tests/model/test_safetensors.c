/* test_safetensors.c: header validation on hand-made and corrupted files
 * (truncation, header length past EOF, overlapping / out-of-range offsets,
 * dtype x shape mismatch, unknown dtype), writer round trips, and sharded
 * checkpoint folders (missing shard, inconsistent index). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/files.h"
#include "common/rng.h"
#include "model/format/safetensors.h"
#include "test_tmp.h"

/* A file image from header text and n data bytes (byte i = i & 0xff). */
static uint8_t *raw(const char *header, size_t ndata, size_t *len)
{
    size_t h = strlen(header);
    *len = 8 + h + ndata;
    uint8_t *b = malloc(*len + 1);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < ndata; i++)
        b[8 + h + i] = (uint8_t)i;
    return b;
}

/* Opens an image expecting failure; returns the message. */
static const char *fails(const uint8_t *buf, size_t len, mt_status want)
{
    static mt_err err;
    mt_err_clear(&err);
    model_st_file *f = NULL;
    mt_status st = model_st_open_memory("shard.safetensors", buf, len, &f, &err);
    cr_assert_eq(st, want, "status %s, message: %s", mt_status_str(st), err.msg);
    cr_assert_null(f);
    cr_assert_not_null(strstr(err.msg, "shard.safetensors"), "file not named: %s", err.msg);
    return err.msg;
}

Test(safetensors, hand_made_file_parses_with_absolute_offsets)
{
    size_t len;
    uint8_t *b = raw("{\"__metadata__\":{\"format\":\"pt\"},"
                     "\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[4,16]},"
                     "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}   ",
                     16, &len);
    model_st_file *f = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_st_open_memory("mem", b, len, &f, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_st_count(f), 2);
    const model_tensor_info *w = model_st_find(f, "w"), *s = model_st_find(f, "s");
    cr_assert_not_null(w);
    cr_assert_not_null(s);
    cr_assert_eq(w->dtype, MODEL_DTYPE_BF16);
    cr_assert_eq(w->ndim, 2);
    cr_assert_eq(w->shape[0], 2);
    cr_assert_eq(w->shape[1], 3);
    size_t data_start = len - 16;
    cr_assert_eq(w->offset, data_start + 4);
    cr_assert_eq(w->nbytes, 12);
    cr_assert_eq(((const uint8_t *)w->data)[0], 4);
    cr_assert_eq(s->ndim, 0);
    cr_assert_eq(model_tensor_numel(s), 1);
    cr_assert_str_eq(model_st_metadata(f, "format"), "pt");
    cr_assert_null(model_st_find(f, "missing"));
    cr_assert_str_eq(model_st_at(f, 0)->name, "s"); /* sorted by name */
    model_st_close(f);
    free(b);
}

Test(safetensors, every_truncation_is_an_error_never_a_crash)
{
    size_t len;
    uint8_t *b = raw("{\"a\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[0,5]},"
                     "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[5,13]}}",
                     13, &len);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *c = malloc(cut + 1);
        memcpy(c, b, cut);
        const char *msg = fails(c, cut, MT_E_FORMAT);
        if (cut >= len - 8) /* the header is whole: 'b' is the tensor cut short */
            cr_assert(strstr(msg, "'b'") && strstr(msg, "byte") && strstr(msg, "truncated"),
                      "cut %zu: %s", cut, msg);
        free(c);
    }
    free(b);
}

Test(safetensors, header_length_past_eof_names_the_offsets)
{
    size_t len;
    uint8_t *b = raw("{}", 0, &len);
    b[0] = 0xff;
    b[7] = 0x7f;
    const char *msg = fails(b, len, MT_E_FORMAT);
    cr_assert(strstr(msg, "header length") && strstr(msg, "byte 0"), "%s", msg);
    b[0] = 3;
    b[7] = 0;
    msg = fails(b, len, MT_E_FORMAT);
    cr_assert(strstr(msg, "header length 3"), "%s", msg);
    free(b);
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    msg = fails(tiny, sizeof tiny, MT_E_FORMAT);
    cr_assert(strstr(msg, "5 bytes"), "%s", msg);
}

Test(safetensors, overlapping_offsets_name_both_tensors)
{
    size_t len;
    uint8_t *b = raw("{\"first\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                     "\"second\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}",
                     12, &len);
    const char *msg = fails(b, len, MT_E_FORMAT);
    cr_assert(strstr(msg, "'second'") && strstr(msg, "'first'") && strstr(msg, "overlaps"), "%s",
              msg);
    free(b);
}

Test(safetensors, out_of_range_offsets_name_tensor_and_byte)
{
    size_t len;
    uint8_t *b = raw("{\"w\":{\"dtype\":\"U8\",\"shape\":[100],\"data_offsets\":[0,100]}}", 10,
                     &len);
    const char *msg = fails(b, len, MT_E_FORMAT);
    char byte[64];
    snprintf(byte, sizeof byte, "byte %zu", len - 10 + 100);
    cr_assert(strstr(msg, "'w'") && strstr(msg, byte) && strstr(msg, "past the end"), "%s", msg);
    free(b);
    b = raw("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[5,4]}}", 10, &len);
    msg = fails(b, len, MT_E_FORMAT);
    cr_assert(strstr(msg, "'w'") && strstr(msg, "end before"), "%s", msg);
    free(b);
    b = raw("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", 1, &len);
    fails(b, len, MT_E_FORMAT);
    free(b);
}

Test(safetensors, dtype_times_shape_must_match_the_byte_count)
{
    size_t len;
    uint8_t *b = raw("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,10]}}", 10,
                     &len);
    const char *msg = fails(b, len, MT_E_FORMAT);
    cr_assert(strstr(msg, "'w'") && strstr(msg, "BF16[2, 3]") && strstr(msg, "needs 12"), "%s",
              msg);
    free(b);
    /* A shape whose element count overflows 64 bits. */
    b = raw("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
            "\"data_offsets\":[0,0]}}",
            0, &len);
    msg = fails(b, len, MT_E_FORMAT);
    cr_assert(strstr(msg, "more than"), "%s", msg);
    free(b);
}

Test(safetensors, unknown_dtype_is_named)
{
    size_t len;
    uint8_t *b = raw("{\"q\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, &len);
    const char *msg = fails(b, len, MT_E_UNSUPPORTED);
    cr_assert(strstr(msg, "'q'") && strstr(msg, "\"F64\""), "%s", msg);
    free(b);
}

Test(safetensors, gaps_trailing_bytes_duplicates_and_bad_json_are_rejected)
{
    struct {
        const char *header;
        size_t ndata;
        const char *needle;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 4, "gap"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 5, "after the last"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "twice"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}", 1, "malformed"},
        {"[1,2]", 0, "not a JSON object"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, "shape[0]"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, "shape[0]"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, "data_offsets"},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "dtype"},
        {"{\"a\":7}", 0, "not an object"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "metadata"},
        {"{} x", 0, "after the header"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t len;
        uint8_t *b = raw(cases[i].header, cases[i].ndata, &len);
        const char *msg = fails(b, len, MT_E_FORMAT);
        cr_assert_not_null(strstr(msg, cases[i].needle), "case %zu: %s", i, msg);
        free(b);
    }
}

Test(safetensors, writer_round_trips_random_tensors_through_a_mapped_file)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    model_st_writer *w;
    cr_assert_eq(model_st_writer_create(&w, NULL), MT_OK);
    int n = 1 + (int)mt_rng_below(&r, 20);
    uint8_t *blobs[20];
    for (int i = 0; i < n; i++) {
        model_dtype dt = (model_dtype)mt_rng_below(&r, MODEL_DTYPE_COUNT);
        int nd = (int)mt_rng_below(&r, 4);
        int64_t shape[4];
        size_t bytes = model_dtype_size(dt);
        for (int d = 0; d < nd; d++)
            bytes *= (size_t)(shape[d] = (int64_t)mt_rng_below(&r, 7));
        blobs[i] = malloc(bytes + 1);
        for (size_t k = 0; k < bytes; k++)
            blobs[i][k] = (uint8_t)mt_rng_u64(&r);
        char name[32];
        snprintf(name, sizeof name, "t.%d \"q\"", i);
        cr_assert_eq(model_st_writer_add(w, name, dt, nd, shape, blobs[i], bytes, NULL), MT_OK);
    }
    cr_assert_eq(model_st_writer_add(w, "t.0 \"q\"", MODEL_DTYPE_U8, 0, NULL, "x", 1, NULL),
                 MT_E_INVALID, "duplicate names are refused");
    cr_assert_eq(model_st_writer_set_metadata(w, "format", "pt", NULL), MT_OK);
    char path[512];
    close(tmp_file_make(path, sizeof path, "mt_st"));
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_st_writer_write(w, path, &err), MT_OK, "%s", err.msg);
    model_st_file *f = NULL;
    cr_assert_eq(model_st_open(path, &f, &err), MT_OK, "seed %llu: %s", (unsigned long long)seed,
                 err.msg);
    cr_assert_eq((int)model_st_count(f), n);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "t.%d \"q\"", i);
        const model_tensor_info *t = model_st_find(f, name);
        cr_assert_not_null(t, "seed %llu: %s", (unsigned long long)seed, name);
        if (i == 0) /* the header is padded so the data section starts 8-aligned */
            cr_assert_eq(t->offset % 8, 0, "offset %llu", (unsigned long long)t->offset);
        cr_assert_eq(memcmp(t->data, blobs[i], t->nbytes), 0, "seed %llu: %s",
                     (unsigned long long)seed, name);
        cr_assert_str_eq(t->file, path);
        free(blobs[i]);
    }
    cr_assert_str_eq(model_st_metadata(f, "format"), "pt");
    model_st_close(f);
    model_st_writer_destroy(w);
    remove(path);
}

Test(safetensors, random_header_damage_never_crashes)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    size_t len;
    uint8_t *b = raw("{\"__metadata__\":{\"a\":\"b\"},"
                     "\"x\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
                     "\"y\":{\"dtype\":\"F8_E4M3\",\"shape\":[3],\"data_offsets\":[8,11]}}",
                     11, &len);
    for (int it = 0; it < 3000; it++) {
        uint8_t *c = malloc(len);
        memcpy(c, b, len);
        int flips = 1 + (int)mt_rng_below(&r, 4);
        for (int k = 0; k < flips; k++)
            c[mt_rng_below(&r, len)] = (uint8_t)mt_rng_u64(&r);
        model_st_file *f = NULL;
        mt_err err = MT_ERR_INIT;
        if (model_st_open_memory("dmg", c, len, &f, &err) == MT_OK) {
            for (size_t i = 0; i < model_st_count(f); i++) {
                const model_tensor_info *t = model_st_at(f, i);
                cr_assert_leq(t->offset + t->nbytes, len, "seed %llu", (unsigned long long)seed);
            }
            model_st_close(f);
        } else {
            cr_assert_not_null(strstr(err.msg, "dmg"), "seed %llu: %s", (unsigned long long)seed,
                               err.msg);
        }
        free(c);
    }
    free(b);
}

/* ---- checkpoint folders -------------------------------------------------- */

static void write_shard(const char *dir, const char *file, const char *const *names, int n)
{
    model_st_writer *w;
    cr_assert_eq(model_st_writer_create(&w, NULL), MT_OK);
    for (int i = 0; i < n; i++) {
        int64_t shape = 4;
        float v[4] = {(float)i, 1, 2, 3};
        cr_assert_eq(model_st_writer_add(w, names[i], MODEL_DTYPE_F32, 1, &shape, v, sizeof v,
                                         NULL), MT_OK);
    }
    char path[640];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    cr_assert_eq(model_st_writer_write(w, path, NULL), MT_OK);
    model_st_writer_destroy(w);
}

static void write_file(const char *dir, const char *file, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    cr_assert_eq(mt_file_write_atomic(path, text, strlen(text), NULL), MT_OK);
}

static char *two_shards(void)
{
    static char dir[512];
    tmp_dir_make(dir, sizeof dir, "mt_set");
    const char *a[] = {"a.weight", "b.weight"}, *b[] = {"c.weight"};
    write_shard(dir, "s1.safetensors", a, 2);
    write_shard(dir, "s2.safetensors", b, 1);
    return dir;
}

static void rm_dir(const char *dir)
{
    tmp_rm_tree(dir);
}

static const char *set_fails(const char *dir, mt_status want)
{
    static mt_err err;
    mt_err_clear(&err);
    model_st_set *s = NULL;
    mt_status st = model_st_set_open(dir, &s, &err);
    cr_assert_eq(st, want, "%s: %s", mt_status_str(st), err.msg);
    cr_assert_null(s);
    return err.msg;
}

Test(safetensors_set, index_joins_shards_by_name)
{
    char *dir = two_shards();
    write_file(dir, "model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":48},\"weight_map\":{\"a.weight\":\"s1.safetensors\","
               "\"b.weight\":\"s1.safetensors\",\"c.weight\":\"s2.safetensors\"}}");
    model_st_set *s = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_st_set_open(dir, &s, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_st_set_count(s), 3);
    cr_assert_eq(model_st_set_shard_count(s), 2);
    cr_assert_eq(model_st_set_total_bytes(s), 48);
    const model_tensor_info *c = model_st_set_find(s, "c.weight");
    cr_assert_not_null(c);
    cr_assert_not_null(strstr(c->file, "s2.safetensors"));
    float v;
    memcpy(&v, (const char *)c->data + 4, 4);
    cr_assert_eq(v, 1.0f);
    model_st_set_close(s);
    rm_dir(dir);
}

Test(safetensors_set, missing_shard_names_index_shard_and_tensor)
{
    char *dir = two_shards();
    write_file(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"a.weight\":\"s1.safetensors\",\"b.weight\":\"s1.safetensors\","
               "\"c.weight\":\"s3.safetensors\"}}");
    const char *msg = set_fails(dir, MT_E_IO);
    cr_assert(strstr(msg, "s3.safetensors") && strstr(msg, "c.weight") &&
              strstr(msg, "index.json"), "%s", msg);
    rm_dir(dir);
}

Test(safetensors_set, inconsistent_index_is_an_error)
{
    struct {
        const char *index, *needle;
    } cases[] = {
        {"{\"weight_map\":{\"a.weight\":\"s1.safetensors\",\"b.weight\":\"s2.safetensors\","
         "\"c.weight\":\"s2.safetensors\"}}", "'b.weight' is listed in shard"},
        {"{\"weight_map\":{\"a.weight\":\"s1.safetensors\",\"c.weight\":\"s2.safetensors\"}}",
         "'b.weight'"},
        {"{\"weight_map\":{\"a.weight\":\"../s1.safetensors\"}}", "file name inside"},
        {"{\"weight_map\":{\"a.weight\":\"s1.safetensors\",\"b.weight\":\"s1.safetensors\","
         "\"c.weight\":\"s2.safetensors\",\"d.weight\":\"s2.safetensors\"}}", "'d.weight'"},
        {"{\"metadata\":{}}", "weight_map"},
        {"{\"weight_map\":", "malformed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *dir = two_shards();
        write_file(dir, "model.safetensors.index.json", cases[i].index);
        const char *msg = set_fails(dir, MT_E_FORMAT);
        cr_assert_not_null(strstr(msg, cases[i].needle), "case %zu: %s", i, msg);
        rm_dir(dir);
    }
}

Test(safetensors_set, tensor_in_two_shards_is_an_error)
{
    char *dir = two_shards();
    const char *dup[] = {"a.weight"};
    write_shard(dir, "s2.safetensors", dup, 1);
    write_file(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"a.weight\":\"s1.safetensors\",\"b.weight\":\"s1.safetensors\","
               "\"c.weight\":\"s2.safetensors\"}}");
    const char *msg = set_fails(dir, MT_E_FORMAT);
    cr_assert(strstr(msg, "'a.weight'") && strstr(msg, "two shards"), "%s", msg);
    rm_dir(dir);
}

Test(safetensors_set, single_file_without_index_and_empty_folder)
{
    char *dir = two_shards();
    set_fails(dir, MT_E_NOT_FOUND);
    const char *a[] = {"x"};
    write_shard(dir, "model.safetensors", a, 1);
    model_st_set *s = NULL;
    cr_assert_eq(model_st_set_open(dir, &s, NULL), MT_OK);
    cr_assert_not_null(model_st_set_find(s, "x"));
    model_st_set_close(s);
    rm_dir(dir);
}
