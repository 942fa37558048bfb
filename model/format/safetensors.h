/* safetensors.h: read-only, memory-mapped safetensors files and sharded
 * checkpoints (model.safetensors.index.json), plus a small writer.
 *
 * File layout: 8 bytes little-endian u64 N, N bytes of JSON header, data.
 * The header maps each tensor name to {"dtype", "shape", "data_offsets":
 * [begin, end]} (offsets relative to the data section) and may hold a
 * "__metadata__" object of strings. Opening validates the header against
 * the file itself, as the reference implementation does: the header length
 * must fit in the file, every dtype must be known, every shape must hold
 * exactly end - begin bytes, and the tensors must tile the data section with
 * no overlap, no gap and nothing after the last one. Every error names the
 * file, the tensor and the absolute byte offset at fault.
 *
 * Data pointers point into the mapping: they stay valid until the file (or
 * set) is closed, are read-only, and are NOT aligned beyond 1 byte (a header
 * length that is not a multiple of 8 is legal), so read elements with memcpy
 * or check alignment first.
 *
 * Thread safety: opening and closing are not thread-safe per handle; after
 * open, every query is a pure read and may run from any number of threads. */
#ifndef MT_MODEL_SAFETENSORS_H
#define MT_MODEL_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Element types this runtime reads. Values are stable (append only). */
typedef enum model_dtype {
    MODEL_DTYPE_BF16 = 0,
    MODEL_DTYPE_F16 = 1,
    MODEL_DTYPE_F32 = 2,
    MODEL_DTYPE_U8 = 3,
    MODEL_DTYPE_I32 = 4,
    MODEL_DTYPE_F8_E4M3 = 5,
    MODEL_DTYPE_COUNT
} model_dtype;

/* The safetensors spelling ("BF16", "F8_E4M3", ...); "?" when out of range. */
const char *model_dtype_name(model_dtype dt);
/* Bytes per element; 0 when out of range. */
size_t model_dtype_size(model_dtype dt);
/* Parses a safetensors dtype string; false when unknown. */
bool model_dtype_parse(const char *s, model_dtype *out);

#define MODEL_MAX_DIMS 8

/* One tensor of an open file. Every pointer is owned by the file. */
typedef struct model_tensor_info {
    const char *name;
    const char *file;          /* path of the file it lives in */
    model_dtype dtype;
    int ndim;                  /* 0 for a scalar */
    int64_t shape[MODEL_MAX_DIMS];
    uint64_t offset;           /* absolute byte offset of the data in the file */
    uint64_t nbytes;
    const void *data;          /* into the mapping; unaligned, read-only */
} model_tensor_info;

/* Writes "BF16[128, 256]" into buf (always NUL-terminated); returns buf. */
char *model_tensor_describe(const model_tensor_info *t, char *buf, size_t cap);
/* Product of the shape (1 for a scalar). */
int64_t model_tensor_numel(const model_tensor_info *t);

/* ---- one file ------------------------------------------------------------ */

typedef struct model_st_file model_st_file;

/* Maps path read-only and validates its header. On failure *out is NULL and
 * err names the file, the tensor and the byte offset. */
mt_status model_st_open(const char *path, model_st_file **out, mt_err *err);
/* Validates an in-memory image (label names it in messages). The buffer is
 * borrowed: it must outlive the handle. */
mt_status model_st_open_memory(const char *label, const void *buf, size_t len,
                               model_st_file **out, mt_err *err);
/* Unmaps and frees; NULL is a no-op. Invalidates every pointer it handed out. */
void model_st_close(model_st_file *f);

const char *model_st_path(const model_st_file *f);
/* Tensors sorted by name; i < count. */
size_t model_st_count(const model_st_file *f);
const model_tensor_info *model_st_at(const model_st_file *f, size_t i);
/* O(log n); NULL when absent. */
const model_tensor_info *model_st_find(const model_st_file *f, const char *name);
/* A "__metadata__" value, or NULL. */
const char *model_st_metadata(const model_st_file *f, const char *key);

/* ---- a checkpoint folder ------------------------------------------------- */

typedef struct model_st_set model_st_set;

/* Opens dir/model.safetensors.index.json and every shard it names, or, when
 * there is no index, dir/model.safetensors. Checks that every tensor of the
 * index is in its shard, that every shard tensor is in the index and that no
 * name appears twice. Shard names must be plain file names inside dir. */
mt_status model_st_set_open(const char *dir, model_st_set **out, mt_err *err);
void model_st_set_close(model_st_set *s);

/* All tensors of all shards, sorted by name. */
size_t model_st_set_count(const model_st_set *s);
const model_tensor_info *model_st_set_at(const model_st_set *s, size_t i);
const model_tensor_info *model_st_set_find(const model_st_set *s, const char *name);
size_t model_st_set_shard_count(const model_st_set *s);
const model_st_file *model_st_set_shard(const model_st_set *s, size_t i);
/* Sum of all tensors' bytes. */
uint64_t model_st_set_total_bytes(const model_st_set *s);

/* ---- writer -------------------------------------------------------------- */

typedef struct model_st_writer model_st_writer;

mt_status model_st_writer_create(model_st_writer **out, mt_err *err);
void model_st_writer_destroy(model_st_writer *w);
/* Copies the tensor; nbytes must equal numel x dtype size. Names must be
 * unique. Tensors are stored in the order added. */
mt_status model_st_writer_add(model_st_writer *w, const char *name, model_dtype dt,
                              int ndim, const int64_t *shape, const void *data,
                              size_t nbytes, mt_err *err);
mt_status model_st_writer_set_metadata(model_st_writer *w, const char *key,
                                       const char *value, mt_err *err);
/* Serializes to a malloc'd buffer the caller frees (header padded with
 * spaces to a multiple of 8 bytes, as the reference writer does). */
mt_status model_st_writer_serialize(const model_st_writer *w, uint8_t **buf,
                                    size_t *len, mt_err *err);
/* Serializes and writes path atomically. */
mt_status model_st_writer_write(const model_st_writer *w, const char *path, mt_err *err);
size_t model_st_writer_count(const model_st_writer *w);
const char *model_st_writer_name(const model_st_writer *w, size_t i);
uint64_t model_st_writer_data_bytes(const model_st_writer *w);

#endif
