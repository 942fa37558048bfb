/* kvcache.c: paged latent and indexer-key cache (see kvcache.h). */
#include "kvcache.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/attn/attn_common.h"

struct kvc_seq {
    int64_t len;
    int32_t *pages;
    int64_t n_pages, cap;
    kvc_seq *next, *prev; /* the cache's list of open sequences */
};

struct kvc_cache {
    dev_device *dev;
    kvc_opts o;
    size_t row_bytes, index_row_bytes;   /* per token */
    void *pool, *index_pool, *scale, *index_scale;
    int32_t *refs;                        /* per page; 0 = free */
    int32_t *free_list;
    int n_free;
    kvc_seq *seqs;
};

static size_t page_bytes(const kvc_cache *c) { return c->row_bytes * (size_t)c->o.page_size; }
static size_t index_page_bytes(const kvc_cache *c)
{
    return c->index_row_bytes * (size_t)c->o.page_size;
}

mt_status kvc_create(dev_device *d, const kvc_opts *o, kvc_cache **out, mt_err *err)
{
    *out = NULL;
    if (o->page_size < 1 || o->n_pages < 1 || o->latent < 1 || o->rope < 0 || o->index_dim < 0)
        return mt_fail(err, MT_E_INVALID, "kvcache: page_size %d, n_pages %d, latent %d, "
                       "rope %d, index_dim %d: sizes must be positive", o->page_size,
                       o->n_pages, o->latent, o->rope, o->index_dim);
    if (!attn_kv_dtype_ok(o->dtype))
        return mt_fail(err, MT_E_INVALID, "kvcache: dtype %s: the cache holds bf16 or fp8",
                       kern_dtype_name(o->dtype));
    if (o->scale < 0 || o->index_scale < 0)
        return mt_fail(err, MT_E_INVALID, "kvcache: negative scale");
    kvc_cache *c = calloc(1, sizeof *c);
    if (!c)
        return mt_fail(err, MT_E_NOMEM, "kvcache");
    c->dev = d;
    c->o = *o;
    if (c->o.scale == 0)
        c->o.scale = 1.0f;
    if (c->o.index_scale == 0)
        c->o.index_scale = 1.0f;
    size_t es = attn_kv_esize(o->dtype);
    c->row_bytes = (size_t)(o->latent + o->rope) * es;
    c->index_row_bytes = (size_t)o->index_dim * es;
    c->refs = calloc((size_t)o->n_pages, sizeof(int32_t));
    c->free_list = malloc(sizeof(int32_t) * (size_t)o->n_pages);
    mt_status st = MT_OK;
    if (!c->refs || !c->free_list)
        st = mt_fail(err, MT_E_NOMEM, "kvcache: page bookkeeping for %d pages", o->n_pages);
    /* Lowest page ids are handed out first. */
    for (int i = 0; st == MT_OK && i < o->n_pages; i++)
        c->free_list[i] = o->n_pages - 1 - i;
    c->n_free = o->n_pages;
    if (!d) { /* bookkeeping only */
        if (st != MT_OK) {
            kvc_destroy(c);
            return st;
        }
        *out = c;
        return MT_OK;
    }
    if (st == MT_OK)
        st = dev_alloc(d, page_bytes(c) * (size_t)o->n_pages, &c->pool, err);
    if (st == MT_OK && o->index_dim > 0)
        st = dev_alloc(d, index_page_bytes(c) * (size_t)o->n_pages, &c->index_pool, err);
    if (st == MT_OK)
        st = dev_alloc(d, sizeof(float), &c->scale, err);
    if (st == MT_OK)
        st = dev_alloc(d, sizeof(float), &c->index_scale, err);
    if (st == MT_OK)
        st = dev_copy_to(d, c->scale, &c->o.scale, sizeof(float), err);
    if (st == MT_OK)
        st = dev_copy_to(d, c->index_scale, &c->o.index_scale, sizeof(float), err);
    if (st != MT_OK) {
        mt_err_prefix(err, "kvcache");
        kvc_destroy(c);
        return st;
    }
    *out = c;
    return MT_OK;
}

static void seq_free(kvc_cache *c, kvc_seq *s)
{
    for (int64_t i = 0; i < s->n_pages; i++)
        if (--c->refs[s->pages[i]] == 0)
            c->free_list[c->n_free++] = s->pages[i];
    free(s->pages);
    free(s);
}

void kvc_destroy(kvc_cache *c)
{
    if (!c)
        return;
    while (c->seqs) {
        kvc_seq *s = c->seqs;
        c->seqs = s->next;
        seq_free(c, s);
    }
    if (c->dev) {
        dev_free(c->dev, c->pool);
        dev_free(c->dev, c->index_pool);
        dev_free(c->dev, c->scale);
        dev_free(c->dev, c->index_scale);
    }
    free(c->refs);
    free(c->free_list);
    free(c);
}

const kvc_opts *kvc_get_opts(const kvc_cache *c) { return &c->o; }
int kvc_free_pages(const kvc_cache *c) { return c->n_free; }
void *kvc_latent_pool(const kvc_cache *c) { return c->pool; }
void *kvc_index_pool(const kvc_cache *c) { return c->index_pool; }
void *kvc_latent_scale(const kvc_cache *c) { return c->scale; }
void *kvc_index_scale(const kvc_cache *c) { return c->index_scale; }
int64_t kvc_seq_len(const kvc_seq *s) { return s->len; }

static kvc_seq *seq_new(kvc_cache *c)
{
    kvc_seq *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->next = c->seqs;
    if (c->seqs)
        c->seqs->prev = s;
    c->seqs = s;
    return s;
}

mt_status kvc_seq_create(kvc_cache *c, kvc_seq **out, mt_err *err)
{
    *out = seq_new(c);
    return *out ? MT_OK : mt_fail(err, MT_E_NOMEM, "kvcache: sequence");
}

void kvc_seq_destroy(kvc_cache *c, kvc_seq *s)
{
    if (!s)
        return;
    if (s->prev)
        s->prev->next = s->next;
    else
        c->seqs = s->next;
    if (s->next)
        s->next->prev = s->prev;
    seq_free(c, s);
}

static bool grow(kvc_seq *s, int64_t n_pages)
{
    if (n_pages <= s->cap)
        return true;
    int64_t cap = s->cap ? s->cap : 8;
    while (cap < n_pages)
        cap *= 2;
    int32_t *p = realloc(s->pages, sizeof(int32_t) * (size_t)cap);
    if (!p)
        return false;
    s->pages = p;
    s->cap = cap;
    return true;
}

/* Copies page src's contents (both pools) to page dst. */
static mt_status copy_page(kvc_cache *c, int32_t dst, int32_t src, mt_err *err)
{
    if (!c->dev)
        return MT_OK; /* bookkeeping only: no contents */
    size_t pb = page_bytes(c), ib = index_page_bytes(c);
    mt_status st = dev_copy_dev(c->dev, (char *)c->pool + (size_t)dst * pb,
                                (char *)c->pool + (size_t)src * pb, pb, err);
    if (st == MT_OK && c->index_pool)
        st = dev_copy_dev(c->dev, (char *)c->index_pool + (size_t)dst * ib,
                          (char *)c->index_pool + (size_t)src * ib, ib, err);
    return st;
}

mt_status kvc_seq_reserve(kvc_cache *c, kvc_seq *s, int64_t n, int64_t *rows, mt_err *err)
{
    if (n < 0)
        return mt_fail(err, MT_E_INVALID, "kvcache: reserve %lld tokens", (long long)n);
    int64_t ps = c->o.page_size;
    int64_t need_pages = (s->len + n + ps - 1) / ps;
    int64_t new_pages = need_pages - s->n_pages;
    /* The partial last page is written into: it must not be shared. */
    bool cow = n > 0 && s->len % ps && c->refs[s->pages[s->n_pages - 1]] > 1;
    if (new_pages + cow > c->n_free)
        return mt_fail(err, MT_E_NOMEM, "kvcache full: %lld tokens need %lld new pages, "
                       "%d free", (long long)n, (long long)(new_pages + cow), c->n_free);
    if (!grow(s, need_pages))
        return mt_fail(err, MT_E_NOMEM, "kvcache: page list of %lld", (long long)need_pages);
    if (cow) {
        int32_t old = s->pages[s->n_pages - 1], fresh = c->free_list[c->n_free - 1];
        mt_status st = copy_page(c, fresh, old, err);
        if (st != MT_OK)
            return mt_err_prefix(err, "kvcache: copy of shared page %d", old);
        c->n_free--;
        c->refs[fresh] = 1;
        c->refs[old]--;
        s->pages[s->n_pages - 1] = fresh;
    }
    while (s->n_pages < need_pages) {
        int32_t p = c->free_list[--c->n_free];
        c->refs[p] = 1;
        s->pages[s->n_pages++] = p;
    }
    for (int64_t i = 0; rows && i < n; i++) {
        int64_t pos = s->len + i;
        rows[i] = (int64_t)s->pages[pos / ps] * ps + pos % ps;
    }
    s->len += n;
    return MT_OK;
}

mt_status kvc_seq_append(kvc_cache *c, kvc_seq *s, int64_t n, const float *rows,
                         const float *index_rows, mt_err *err)
{
    if (!c->dev)
        return mt_fail(err, MT_E_INVALID, "kvc_seq_append: a bookkeeping-only cache has no pools");
    int64_t start = s->len, ps = c->o.page_size;
    mt_status st = kvc_seq_reserve(c, s, n, NULL, err);
    if (st != MT_OK)
        return st;
    int w = c->o.latent + c->o.rope, iw = c->o.index_dim;
    /* One copy per run of tokens within a page. */
    size_t stage_bytes = page_bytes(c) > index_page_bytes(c) ? page_bytes(c) : index_page_bytes(c);
    uint8_t *stage = malloc(stage_bytes ? stage_bytes : 1);
    if (!stage) {
        kvc_seq_truncate(c, s, start, NULL);
        return mt_fail(err, MT_E_NOMEM, "kvcache: staging buffer");
    }
    for (int64_t i = 0; i < n && st == MT_OK;) {
        int64_t pos = start + i, off = pos % ps;
        int64_t run = ps - off < n - i ? ps - off : n - i;
        size_t row0 = (size_t)s->pages[pos / ps] * (size_t)ps + (size_t)off;
        for (int64_t j = 0; j < run; j++)
            for (int k = 0; k < w; k++)
                attn_kv_store(c->o.dtype, stage, (size_t)(j * w + k), rows[(i + j) * w + k],
                              c->o.scale);
        st = dev_copy_to(c->dev, (char *)c->pool + row0 * c->row_bytes, stage,
                         (size_t)run * c->row_bytes, err);
        if (st == MT_OK && c->index_pool) {
            for (int64_t j = 0; j < run; j++)
                for (int k = 0; k < iw; k++)
                    attn_kv_store(c->o.dtype, stage, (size_t)(j * iw + k),
                                  index_rows ? index_rows[(i + j) * iw + k] : 0.0f,
                                  c->o.index_scale);
            st = dev_copy_to(c->dev, (char *)c->index_pool + row0 * c->index_row_bytes, stage,
                             (size_t)run * c->index_row_bytes, err);
        }
        i += run;
    }
    free(stage);
    if (st != MT_OK) {
        kvc_seq_truncate(c, s, start, NULL);
        return mt_err_prefix(err, "kvcache: append");
    }
    return MT_OK;
}

mt_status kvc_seq_truncate(kvc_cache *c, kvc_seq *s, int64_t len, mt_err *err)
{
    if (len < 0 || len > s->len)
        return mt_fail(err, MT_E_INVALID, "kvcache: truncate to %lld of a %lld-token sequence",
                       (long long)len, (long long)s->len);
    int64_t keep = (len + c->o.page_size - 1) / c->o.page_size;
    while (s->n_pages > keep) {
        int32_t p = s->pages[--s->n_pages];
        if (--c->refs[p] == 0)
            c->free_list[c->n_free++] = p;
    }
    s->len = len;
    return MT_OK;
}

mt_status kvc_seq_fork(kvc_cache *c, const kvc_seq *src, int64_t len, kvc_seq **out,
                       mt_err *err)
{
    *out = NULL;
    if (len < 0 || len > src->len)
        return mt_fail(err, MT_E_INVALID, "kvcache: fork of %lld tokens from a %lld-token "
                       "sequence", (long long)len, (long long)src->len);
    int64_t ps = c->o.page_size, full = len / ps;
    bool partial = len % ps != 0;
    if (partial && c->n_free < 1)
        return mt_fail(err, MT_E_NOMEM, "kvcache full: fork needs a page, none free");
    kvc_seq *s = seq_new(c);
    if (!s || !grow(s, full + partial)) {
        kvc_seq_destroy(c, s);
        return mt_fail(err, MT_E_NOMEM, "kvcache: sequence");
    }
    if (partial) {
        int32_t fresh = c->free_list[c->n_free - 1];
        mt_status st = copy_page(c, fresh, src->pages[full], err);
        if (st != MT_OK) {
            kvc_seq_destroy(c, s);
            return mt_err_prefix(err, "kvcache: fork");
        }
        c->n_free--;
        c->refs[fresh] = 1;
        s->pages[full] = fresh;
    }
    for (int64_t i = 0; i < full; i++) {
        s->pages[i] = src->pages[i];
        c->refs[src->pages[i]]++;
    }
    s->n_pages = full + partial;
    s->len = len;
    *out = s;
    return MT_OK;
}

mt_status kvc_seq_read(kvc_cache *c, const kvc_seq *s, int64_t pos, float *row,
                       float *index_row, mt_err *err)
{
    if (!c->dev)
        return mt_fail(err, MT_E_INVALID, "kvc_seq_read: a bookkeeping-only cache has no pools");
    if (pos < 0 || pos >= s->len)
        return mt_fail(err, MT_E_INVALID, "kvcache: read of token %lld of %lld",
                       (long long)pos, (long long)s->len);
    int64_t ps = c->o.page_size;
    size_t r = (size_t)s->pages[pos / ps] * (size_t)ps + (size_t)(pos % ps);
    uint8_t buf[8192];
    size_t need = c->row_bytes > c->index_row_bytes ? c->row_bytes : c->index_row_bytes;
    uint8_t *tmp = need <= sizeof buf ? buf : malloc(need);
    if (!tmp)
        return mt_fail(err, MT_E_NOMEM, "kvcache: read buffer");
    mt_status st = dev_copy_from(c->dev, tmp, (char *)c->pool + r * c->row_bytes,
                                 c->row_bytes, err);
    for (int k = 0; st == MT_OK && k < c->o.latent + c->o.rope; k++)
        row[k] = attn_kv_load(c->o.dtype, tmp, (size_t)k, c->o.scale);
    if (st == MT_OK && index_row && c->index_pool) {
        st = dev_copy_from(c->dev, tmp, (char *)c->index_pool + r * c->index_row_bytes,
                           c->index_row_bytes, err);
        for (int k = 0; st == MT_OK && k < c->o.index_dim; k++)
            index_row[k] = attn_kv_load(c->o.dtype, tmp, (size_t)k, c->o.index_scale);
    }
    if (tmp != buf)
        free(tmp);
    return st;
}

int64_t kvc_seq_pages(const kvc_seq *s, int32_t *out, int64_t cap)
{
    for (int64_t i = 0; i < s->n_pages && i < cap; i++)
        out[i] = s->pages[i];
    return s->n_pages;
}

mt_status kvc_table_upload(kvc_cache *c, kvc_seq *const *seqs, int n, int64_t max_pages,
                           void *dev_table, mt_err *err)
{
    if (!c->dev)
        return mt_fail(err, MT_E_INVALID,
                       "kvc_table_upload: a bookkeeping-only cache has no pools");
    int32_t *t = calloc((size_t)n * (size_t)max_pages + 1, sizeof(int32_t));
    if (!t)
        return mt_fail(err, MT_E_NOMEM, "kvcache: page table of %d x %lld", n,
                       (long long)max_pages);
    for (int i = 0; i < n; i++) {
        if (seqs[i]->n_pages > max_pages) {
            free(t);
            return mt_fail(err, MT_E_INVALID, "kvcache: sequence %d has %lld pages, the table "
                           "row holds %lld", i, (long long)seqs[i]->n_pages,
                           (long long)max_pages);
        }
        memcpy(t + (size_t)i * (size_t)max_pages, seqs[i]->pages,
               sizeof(int32_t) * (size_t)seqs[i]->n_pages);
    }
    mt_status st = dev_copy_to(c->dev, dev_table, t,
                               sizeof(int32_t) * (size_t)n * (size_t)max_pages, err);
    free(t);
    return st;
}
