/* test_tiny_model.c: make-tiny-model writes a complete Quark MXFP4
 * checkpoint that the loader accepts with the right format for every
 * linear; corrupted copies (truncated shard, header length past EOF,
 * overlapping offsets, wrong dtype or shape, missing tensor, missing shard,
 * the MTP shared-expert exclude mismatch) give clear errors or warnings. */
#define _GNU_SOURCE /* memmem */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/files.h"
#include "common/numeric.h"
#include "common/rng.h"
#include "common/mxfp4.h"
#include "model/format/tiny.h"
#include "model/format/weights.h"
#include "test_tmp.h"

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

static char *tiny(uint64_t seed)
{
    char *dir = tmp_dir_dup("mt_tiny");
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tiny_write(dir, seed, &err), MT_OK, "%s", err.msg);
    return dir;
}

static void rm_dir(char *dir)
{
    tmp_rm_tree(dir);
    free(dir);
}

static char *path_in(const char *dir, const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static model_weights *open_ok(const char *dir)
{
    model_weights *w = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_weights_open(dir, &w, &err), MT_OK, "%s", err.msg);
    return w;
}

static const char *open_fails(const char *dir, mt_status want)
{
    static mt_err err;
    mt_err_clear(&err);
    model_weights *w = NULL;
    mt_status st = model_weights_open(dir, &w, &err);
    cr_assert_eq(st, want, "%s: %s", mt_status_str(st), err.msg);
    cr_assert_null(w);
    return err.msg;
}

static const model_linear *lin(const model_weights *w, const char *name)
{
    const model_linear *l = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_weights_linear(w, name, &l, &err), MT_OK, "%s", err.msg);
    return l;
}

/* Replaces the first occurrence of `from` in a file by `to` (same length). */
static void patch(const char *path, const char *from, const char *to)
{
    cr_assert_eq(strlen(from), strlen(to));
    char *text = NULL;
    size_t len = 0;
    cr_assert_eq(mt_file_read(path, &text, &len, NULL), MT_OK);
    char *at = memmem(text, len, from, strlen(from));
    cr_assert_not_null(at, "'%s' not in %s", from, path);
    memcpy(at, to, strlen(to));
    cr_assert_eq(mt_file_write_atomic(path, text, len, NULL), MT_OK);
    free(text);
}

/* Rewrites config.json with one substring replaced (any length). */
static void edit_config(const char *dir, const char *from, const char *to)
{
    char *text = NULL;
    size_t len = 0;
    cr_assert_eq(mt_file_read(path_in(dir, "config.json"), &text, &len, NULL), MT_OK);
    char *at = strstr(text, from);
    cr_assert_not_null(at, "'%s' not in config.json", from);
    size_t out_len = len - strlen(from) + strlen(to);
    char *out = malloc(out_len + 1);
    size_t pre = (size_t)(at - text);
    memcpy(out, text, pre);
    memcpy(out + pre, to, strlen(to));
    strcpy(out + pre + strlen(to), at + strlen(from));
    cr_assert_eq(mt_file_write_atomic(path_in(dir, "config.json"), out, out_len, NULL), MT_OK);
    free(out);
    free(text);
}

/* Rewrites one shard without the tensors whose names start with drop (NULL:
 * none), plus an extra tensor add (NULL: none), and fixes the index. */
static void rewrite_shard(const char *dir, const char *shard, const char *drop, const char *add)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, shard);
    model_st_file *f = NULL;
    cr_assert_eq(model_st_open(path, &f, NULL), MT_OK);
    model_st_writer *wr;
    cr_assert_eq(model_st_writer_create(&wr, NULL), MT_OK);
    char *itext = NULL;
    size_t ilen = 0;
    cr_assert_eq(mt_file_read(path_in(dir, "model.safetensors.index.json"), &itext, &ilen, NULL),
                 MT_OK);
    cJSON *index = cJSON_Parse(itext);
    free(itext);
    cJSON *map = cJSON_GetObjectItem(index, "weight_map");
    int dropped = 0;
    for (size_t i = 0; i < model_st_count(f); i++) {
        const model_tensor_info *t = model_st_at(f, i);
        if (drop && !strncmp(t->name, drop, strlen(drop))) {
            cJSON_DeleteItemFromObjectCaseSensitive(map, t->name);
            dropped++;
            continue;
        }
        cr_assert_eq(model_st_writer_add(wr, t->name, t->dtype, t->ndim, t->shape, t->data,
                                         t->nbytes, NULL), MT_OK);
    }
    cr_assert(!drop || dropped, "nothing named %s* in %s", drop, shard);
    if (add) {
        int64_t shape = 32;
        uint16_t v[32] = {0};
        cr_assert_eq(model_st_writer_add(wr, add, MODEL_DTYPE_BF16, 1, &shape, v, sizeof v, NULL),
                     MT_OK);
        cJSON_AddStringToObject(map, add, shard);
    }
    model_st_close(f);
    cr_assert_eq(model_st_writer_write(wr, path, NULL), MT_OK);
    model_st_writer_destroy(wr);
    char *text = cJSON_Print(index);
    cr_assert_eq(mt_file_write_atomic(path_in(dir, "model.safetensors.index.json"), text,
                                      strlen(text), NULL), MT_OK);
    free(text);
    cJSON_Delete(index);
}

Test(tiny_model, loads_with_the_format_of_every_linear_and_no_warnings)
{
    char *dir = tiny(1);
    model_weights *w = open_ok(dir);
    for (size_t i = 0; i < model_weights_warning_count(w); i++)
        cr_log_error("warning: %s", model_weights_warning(w, i));
    cr_assert_eq(model_weights_warning_count(w), 0);
    const model_config *c = model_weights_config(w);
    cr_assert_eq(c->hidden_size, 256);
    cr_assert_eq(c->num_hidden_layers, 4);
    cr_assert_eq(c->layer_count, 5);
    cr_assert_eq(c->vocab_size, 512);
    cr_assert_eq(model_st_set_shard_count(model_weights_files(w)), 2);
    size_t count[MODEL_WFMT_COUNT] = {0};
    for (size_t i = 0; i < model_weights_linear_count(w); i++) {
        const model_linear *l = model_weights_linear_at(w, i);
        count[l->fmt]++;
        bool expert = strstr(l->name, "experts.") != NULL;
        bool mtp = !strncmp(l->name, "model.layers.4.", 15);
        bool want_mx = expert && !mtp;
        cr_assert_eq(l->fmt, want_mx ? MODEL_WFMT_MXFP4 : MODEL_WFMT_BF16, "%s is %s", l->name,
                     model_wfmt_name(l->fmt));
        cr_assert_eq(l->act_mxfp4, want_mx, "%s", l->name);
        cr_assert_eq(l->scale != NULL, want_mx, "%s", l->name);
    }
    /* 3 MoE layers x (16 routed + 1 shared) x 3 projections. */
    cr_assert_eq(count[MODEL_WFMT_MXFP4], 153);
    const model_linear *l = lin(w, "model.layers.2.mlp.experts.15.down_proj");
    cr_assert_eq(l->out, 256);
    cr_assert_eq(l->in, 128);
    cr_assert_eq(l->weight->shape[1], 64);
    cr_assert_eq(l->scale->shape[1], 4);
    l = lin(w, "model.layers.4.eh_proj");
    cr_assert_eq(l->in, 512);
    cr_assert_eq(lin(w, "model.layers.4.mlp.shared_experts.up_proj")->fmt, MODEL_WFMT_BF16);
    cr_assert_eq(lin(w, "lm_head")->out, 512);
    /* Indexer: layers 0-2 full, 3 shared (no tensors), MTP full. */
    bool full[5] = {true, true, true, false, true};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(model_weights_layer_indexer_full(w, i), full[i], "layer %d", i);
    cr_assert_null(model_weights_find(w, "model.layers.3.self_attn.indexer.wk.weight"));
    const model_linear *none = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_weights_linear(w, "model.layers.3.self_attn.indexer.wk", &none, &err),
                 MT_E_NOT_FOUND);
    cr_assert_not_null(strstr(err.msg, "indexer.wk"), "%s", err.msg);
    model_weights_close(w);
    rm_dir(dir);
}

Test(tiny_model, tensor_lookup_checks_dtype_and_shape_by_name)
{
    char *dir = tiny(1);
    model_weights *w = open_ok(dir);
    const model_tensor_info *t = NULL;
    int64_t shape[2] = {512, 256};
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_weights_tensor(w, "model.embed_tokens.weight",
                                      MODEL_DTYPE_BIT(MODEL_DTYPE_BF16), 2, shape, &t, &err), MT_OK);
    int64_t wrong[2] = {512, -1};
    cr_assert_eq(model_weights_tensor(w, "model.embed_tokens.weight",
                                      MODEL_DTYPE_BIT(MODEL_DTYPE_F32), 2, wrong, &t, &err),
                 MT_E_FORMAT);
    cr_assert(strstr(err.msg, "model.embed_tokens.weight") && strstr(err.msg, SHARD1) &&
              strstr(err.msg, "byte") && strstr(err.msg, "expected F32 [512, *]"), "%s", err.msg);
    cr_assert_eq(model_weights_tensor(w, "nope", 0, 0, NULL, &t, &err), MT_E_NOT_FOUND);
    cr_assert_not_null(strstr(err.msg, "'nope'"));
    model_weights_close(w);
    rm_dir(dir);
}

Test(tiny_model, same_seed_same_bytes)
{
    char *a = tiny(7), *b = tiny(7), *c = tiny(8);
    const char *files[] = {SHARD1, SHARD2, "config.json", "model.safetensors.index.json",
                           "tokenizer.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char *x, *y, *z;
        size_t lx, ly, lz;
        char pa[512], pb[512], pc[512];
        snprintf(pa, sizeof pa, "%s/%s", a, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[i]);
        snprintf(pc, sizeof pc, "%s/%s", c, files[i]);
        cr_assert_eq(mt_file_read(pa, &x, &lx, NULL), MT_OK);
        cr_assert_eq(mt_file_read(pb, &y, &ly, NULL), MT_OK);
        cr_assert_eq(mt_file_read(pc, &z, &lz, NULL), MT_OK);
        cr_assert(lx == ly && !memcmp(x, y, lx), "%s differs for the same seed", files[i]);
        if (!strncmp(files[i], "model-", 6))
            cr_assert(lx == lz && memcmp(x, z, lx), "%s is the same for another seed", files[i]);
        free(x);
        free(y);
        free(z);
    }
    rm_dir(a);
    rm_dir(b);
    rm_dir(c);
}

/* Dequantized row r of a linear into out[in]. */
static void row(const model_linear *l, int64_t r, float *out)
{
    const uint8_t *w = l->weight->data;
    if (l->fmt == MODEL_WFMT_MXFP4) {
        mxfp4_dequantize_row(w + r * l->in / 2, (const uint8_t *)l->scale->data + r * l->in / 32,
                             l->in, out);
        return;
    }
    cr_assert_eq(l->fmt, MODEL_WFMT_BF16);
    for (int64_t k = 0; k < l->in; k++) {
        uint16_t h;
        memcpy(&h, w + 2 * (r * l->in + k), 2);
        out[k] = mt_bf16_to_f32(h);
    }
}

Test(tiny_model, every_linear_keeps_activations_order_one)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    char *dir = tiny(3);
    model_weights *w = open_ok(dir);
    float *x = malloc(4096 * sizeof *x), *wr = malloc(4096 * sizeof *wr);
    for (size_t i = 0; i < model_weights_linear_count(w); i++) {
        const model_linear *l = model_weights_linear_at(w, i);
        /* Enough random inputs for ~512 output samples (weights_proj has 2 rows). */
        int trials = l->out >= 512 ? 1 : (int)(512 / l->out);
        double xx = 0, yy = 0;
        for (int t = 0; t < trials; t++) {
            for (int64_t k = 0; k < l->in; k++) {
                x[k] = mt_rng_normal(&r);
                xx += x[k] * x[k];
            }
            for (int64_t o = 0; o < l->out; o++) {
                row(l, o, wr);
                double y = 0;
                for (int64_t k = 0; k < l->in; k++)
                    y += wr[k] * x[k];
                yy += y * y;
            }
        }
        /* RMS gain: 1 for inputs to a block, 0.5 for residual writers. */
        double gain = sqrt((yy / (double)(l->out * trials)) / (xx / (double)(l->in * trials)));
        bool residual = strstr(l->name, "o_proj") || strstr(l->name, "down_proj");
        double want = residual ? 0.5 : 1.0;
        cr_assert(gain > 0.6 * want && gain < 1.6 * want, "%s: gain %.3f (seed %llu)", l->name,
                  gain, (unsigned long long)seed);
    }
    /* Embedding rows have unit RMS. */
    const model_tensor_info *e = model_weights_find(w, "model.embed_tokens.weight");
    double ss = 0;
    for (int64_t k = 0; k < e->shape[0] * e->shape[1]; k++) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)e->data + 2 * k, 2);
        ss += mt_bf16_to_f32(h) * mt_bf16_to_f32(h);
    }
    double rms = sqrt(ss / (double)(e->shape[0] * e->shape[1]));
    cr_assert(rms > 0.9 && rms < 1.1, "embedding rms %.3f", rms);
    free(x);
    free(wr);
    model_weights_close(w);
    rm_dir(dir);
}

/* ---- corrupted checkpoints --------------------------------------------------- */

Test(tiny_corrupt, truncated_shard_names_file_tensor_and_byte)
{
    char *dir = tiny(1);
    struct stat sb;
    cr_assert_eq(stat(path_in(dir, SHARD2), &sb), 0);
    cr_assert_eq(truncate(path_in(dir, SHARD2), sb.st_size - 100), 0);
    const char *msg = open_fails(dir, MT_E_FORMAT);
    cr_assert(strstr(msg, SHARD2) && strstr(msg, "tensor '") && strstr(msg, "byte") &&
              strstr(msg, "truncated"), "%s", msg);
    rm_dir(dir);
}

Test(tiny_corrupt, header_length_past_eof)
{
    char *dir = tiny(1);
    FILE *f = fopen(path_in(dir, SHARD1), "r+b");
    cr_assert_not_null(f);
    unsigned char big[8] = {0, 0, 0, 0, 1, 0, 0, 0};
    cr_assert_eq(fwrite(big, 1, 8, f), 8);
    fclose(f);
    const char *msg = open_fails(dir, MT_E_FORMAT);
    cr_assert(strstr(msg, SHARD1) && strstr(msg, "header length 4294967296") &&
              strstr(msg, "past the end"), "%s", msg);
    rm_dir(dir);
}

/* The "[begin,end]" text of a tensor's data_offsets in a shard header. */
static void offsets_text(const char *dir, const char *shard, const char *name, char *out,
                         size_t cap)
{
    model_st_file *f = NULL;
    cr_assert_eq(model_st_open(path_in(dir, shard), &f, NULL), MT_OK);
    const model_tensor_info *t = model_st_find(f, name);
    cr_assert_not_null(t, "%s", name);
    /* Absolute offset back to relative: data starts after the header. */
    uint64_t start = model_st_at(f, 0)->offset;
    for (size_t i = 0; i < model_st_count(f); i++)
        if (model_st_at(f, i)->offset < start)
            start = model_st_at(f, i)->offset;
    snprintf(out, cap, "[%llu,%llu]", (unsigned long long)(t->offset - start),
             (unsigned long long)(t->offset - start + t->nbytes));
    model_st_close(f);
}

Test(tiny_corrupt, overlapping_offsets_name_both_tensors)
{
    char *dir = tiny(1);
    const char *a = "model.layers.1.mlp.experts.0.up_proj.weight";
    const char *b = "model.layers.1.mlp.experts.1.up_proj.weight";
    char ta[64], tb[64];
    offsets_text(dir, SHARD1, a, ta, sizeof ta);
    offsets_text(dir, SHARD1, b, tb, sizeof tb);
    /* Point b at a's bytes, padding with JSON whitespace to keep the length. */
    char padded[64];
    snprintf(padded, sizeof padded, "%-*s", (int)strlen(tb), ta);
    padded[strlen(ta) - 1] = ' ';
    padded[strlen(tb) - 1] = ']';
    patch(path_in(dir, SHARD1), tb, padded);
    const char *msg = open_fails(dir, MT_E_FORMAT);
    cr_assert(strstr(msg, SHARD1) && strstr(msg, "overlaps") && strstr(msg, "experts.0.up_proj") &&
              strstr(msg, "experts.1.up_proj"), "%s", msg);
    rm_dir(dir);
}

Test(tiny_corrupt, wrong_dtype_or_shape_for_a_named_tensor)
{
    char *dir = tiny(1);
    /* Same byte count, wrong dtype: the router bias must be F32 (or BF16). */
    patch(path_in(dir, SHARD1), "\"dtype\":\"F32\"", "\"dtype\":\"I32\"");
    const char *msg = open_fails(dir, MT_E_FORMAT);
    cr_assert(strstr(msg, "e_score_correction_bias") && strstr(msg, "I32[16]") &&
              strstr(msg, SHARD1) && strstr(msg, "byte"), "%s", msg);
    rm_dir(dir);
    dir = tiny(1);
    /* Same byte count, wrong shape: the router gate [16, 256] as [32, 128]. */
    patch(path_in(dir, SHARD1), "\"shape\":[16,256]", "\"shape\":[32,128]");
    msg = open_fails(dir, MT_E_FORMAT);
    cr_assert(strstr(msg, "mlp.gate.weight") && strstr(msg, "BF16[32, 128]") &&
              strstr(msg, "[16, 256]"), "%s", msg);
    rm_dir(dir);
    dir = tiny(1);
    /* A config that does not fit the tensors names the first misfit. */
    edit_config(dir, "\"kv_lora_rank\":\t32", "\"kv_lora_rank\":\t24");
    msg = open_fails(dir, MT_E_FORMAT);
    cr_assert(strstr(msg, "kv_a_proj_with_mqa") && strstr(msg, "layer 0"), "%s", msg);
    rm_dir(dir);
}

Test(tiny_corrupt, missing_tensor_and_missing_scale)
{
    char *dir = tiny(1);
    rewrite_shard(dir, SHARD2, "model.layers.2.self_attn.o_proj.weight", NULL);
    const char *msg = open_fails(dir, MT_E_NOT_FOUND);
    cr_assert(strstr(msg, "'model.layers.2.self_attn.o_proj.weight' is missing") &&
              strstr(msg, "layer 2"), "%s", msg);
    rm_dir(dir);
    dir = tiny(1);
    rewrite_shard(dir, SHARD2, "model.layers.3.mlp.experts.5.gate_proj.weight_scale", NULL);
    msg = open_fails(dir, MT_E_FORMAT);
    cr_assert(strstr(msg, "experts.5.gate_proj.weight") && strstr(msg, "weight_scale") &&
              strstr(msg, SHARD2), "%s", msg);
    rm_dir(dir);
}

Test(tiny_corrupt, missing_shard_names_index_shard_and_tensor)
{
    char *dir = tiny(1);
    cr_assert_eq(remove(path_in(dir, SHARD2)), 0);
    const char *msg = open_fails(dir, MT_E_IO);
    cr_assert(strstr(msg, SHARD2) && strstr(msg, "model.safetensors.index.json") &&
              strstr(msg, "for tensor '"), "%s", msg);
    rm_dir(dir);
}

Test(tiny_corrupt, unused_tensor_is_a_warning)
{
    char *dir = tiny(1);
    rewrite_shard(dir, SHARD2, NULL, "model.layers.3.self_attn.indexer.k_norm.weight");
    model_weights *w = open_ok(dir);
    cr_assert_eq(model_weights_warning_count(w), 1);
    const char *msg = model_weights_warning(w, 0);
    cr_assert(strstr(msg, "layers.3.self_attn.indexer.k_norm.weight") && strstr(msg, "not used"),
              "%s", msg);
    model_weights_close(w);
    rm_dir(dir);
}

Test(tiny_mtp, shared_expert_excluded_under_another_prefix_loads_as_stored)
{
    /* The published failure: the exclude entry names the MTP shared expert
     * under the engine's prefix, not the checkpoint's. */
    char *dir = tiny(1);
    edit_config(dir, "\"*layers.4.*\"", "\"model.decoder.mlp.shared_experts.*\"");
    model_weights *w = open_ok(dir);
    const model_linear *l = lin(w, "model.layers.4.mlp.shared_experts.gate_proj");
    cr_assert_eq(l->fmt, MODEL_WFMT_BF16);
    cr_assert_eq(l->in, 256);
    cr_assert(!l->act_mxfp4);
    /* Every MTP linear outside attention now disagrees: 16 x 3 routed,
     * 3 shared, eh_proj. */
    cr_assert_eq(model_weights_warning_count(w), 52);
    bool named = false;
    for (size_t i = 0; i < model_weights_warning_count(w); i++) {
        const char *m = model_weights_warning(w, i);
        if (strstr(m, "layers.4.mlp.shared_experts.gate_proj:"))
            named = strstr(m, "'model.decoder.mlp.shared_experts.*'") &&
                    strstr(m, "another prefix") && strstr(m, "loading it as stored (bf16)");
    }
    cr_assert(named, "no warning names the mismatched pattern");
    model_weights_close(w);
    rm_dir(dir);
}

Test(tiny_mtp, mtp_indexer_may_be_shared_only_when_config_says_so)
{
    char *dir = tiny(1);
    rewrite_shard(dir, SHARD2, "model.layers.4.self_attn.indexer.", NULL);
    const char *msg = open_fails(dir, MT_E_NOT_FOUND);
    cr_assert(strstr(msg, "layer 4 (MTP)") && strstr(msg, "indexer"), "%s", msg);
    edit_config(dir, "\"index_share_for_mtp_iteration\":\tfalse",
                "\"index_share_for_mtp_iteration\":\ttrue");
    model_weights *w = open_ok(dir);
    cr_assert(!model_weights_layer_indexer_full(w, 4));
    cr_assert_eq(model_weights_warning_count(w), 0);
    model_weights_close(w);
    rm_dir(dir);
}
