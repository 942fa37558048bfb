/* test_kvcache.c: the paged latent / indexer-key cache on the cpu device:
 * round trips in bf16 and fp8 (against the host encoders), page
 * accounting across page boundaries, a full pool refusing cleanly, forks
 * that share whole pages and copy on write, truncation, page tables, and a
 * bookkeeping-only cache (no pools) handing out the real one's pages. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdlib.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "model/kvcache.h"

static dev_device *cpu(void)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu", NULL, &d, &err), MT_OK, "%s", err.msg);
    return d;
}

static kvc_cache *make(dev_device *d, kern_dtype t, int ps, int n_pages)
{
    kvc_opts o = {.page_size = ps, .n_pages = n_pages, .latent = 12, .rope = 4,
                  .index_dim = 8, .dtype = t, .scale = t == KERN_DT_FP8E4M3 ? 0.5f : 0,
                  .index_scale = t == KERN_DT_FP8E4M3 ? 0.25f : 0};
    kvc_cache *c = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kvc_create(d, &o, &c, &err), MT_OK, "%s", err.msg);
    return c;
}

static float *rows_of(mt_rng *r, int64_t n, int w)
{
    float *x = malloc(sizeof(float) * (size_t)(n * w));
    for (int64_t i = 0; i < n * w; i++)
        x[i] = mt_rng_normal(r) * 3.0f;
    return x;
}

/* What the cache must give back for v: the type's rounding of v / scale. */
static float expect(kern_dtype t, float v, float scale)
{
    if (t == KERN_DT_FP8E4M3)
        return mt_fp8e4m3_to_f32(mt_f32_to_fp8e4m3(v / scale)) * scale;
    return mt_bf16_to_f32(mt_f32_to_bf16(v / scale)) * scale;
}

static void check_tokens(kvc_cache *c, kvc_seq *s, const float *rows, const float *idx,
                         int64_t from, int64_t n, uint64_t seed)
{
    const kvc_opts *o = kvc_get_opts(c);
    int w = o->latent + o->rope;
    float got[16], gi[8];
    for (int64_t i = 0; i < n; i++) {
        mt_err err = MT_ERR_INIT;
        cr_assert_eq(kvc_seq_read(c, s, from + i, got, gi, &err), MT_OK, "%s", err.msg);
        for (int k = 0; k < w; k++)
            cr_assert_eq(got[k], expect(o->dtype, rows[i * w + k], o->scale),
                         "token %" PRId64 " [%d] seed %" PRIu64, from + i, k, seed);
        for (int k = 0; k < o->index_dim; k++)
            cr_assert_eq(gi[k], expect(o->dtype, idx[i * o->index_dim + k], o->index_scale),
                         "index token %" PRId64 " [%d] seed %" PRIu64, from + i, k, seed);
    }
}

static void round_trip(kern_dtype t)
{
    dev_device *d = cpu();
    kvc_cache *c = make(d, t, 5, 10);
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    kvc_seq *s;
    cr_assert_eq(kvc_seq_create(c, &s, NULL), MT_OK);
    float *a = rows_of(&r, 7, 16), *ai = rows_of(&r, 7, 8);
    float *b = rows_of(&r, 9, 16), *bi = rows_of(&r, 9, 8);
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kvc_seq_append(c, s, 7, a, ai, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(kvc_seq_append(c, s, 9, b, bi, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(kvc_seq_len(s), 16);
    cr_assert_eq(kvc_free_pages(c), 10 - 4, "16 tokens of 5 per page take 4 pages");
    check_tokens(c, s, a, ai, 0, 7, seed);
    check_tokens(c, s, b, bi, 7, 9, seed);
    kvc_seq_destroy(c, s);
    cr_assert_eq(kvc_free_pages(c), 10);
    free(a);
    free(ai);
    free(b);
    free(bi);
    kvc_destroy(c);
    dev_close(d);
}

Test(kvcache, bf16_rows_round_trip_across_pages) { round_trip(KERN_DT_BF16); }
Test(kvcache, fp8_rows_round_trip_with_scale) { round_trip(KERN_DT_FP8E4M3); }

Test(kvcache, full_pool_refuses_and_changes_nothing)
{
    dev_device *d = cpu();
    kvc_cache *c = make(d, KERN_DT_BF16, 4, 3);
    mt_rng r;
    mt_rng_seed(&r, mt_seed_fresh());
    float *x = rows_of(&r, 13, 16);
    kvc_seq *s;
    cr_assert_eq(kvc_seq_create(c, &s, NULL), MT_OK);
    cr_assert_eq(kvc_seq_append(c, s, 10, x, NULL, NULL), MT_OK);
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kvc_seq_append(c, s, 3, x, NULL, &err), MT_E_NOMEM);
    cr_assert(strstr(err.msg, "kvcache full"), "%s", err.msg);
    cr_assert_eq(kvc_seq_len(s), 10);
    cr_assert_eq(kvc_free_pages(c), 0);
    cr_assert_eq(kvc_seq_append(c, s, 2, x, NULL, NULL), MT_OK, "the last page still has room");
    free(x);
    kvc_destroy(c); /* frees the open sequence too */
    dev_close(d);
}

Test(kvcache, fork_shares_pages_and_copies_on_write)
{
    dev_device *d = cpu();
    kvc_cache *c = make(d, KERN_DT_BF16, 4, 16);
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    float *x = rows_of(&r, 10, 16), *xi = rows_of(&r, 10, 8);
    float *y = rows_of(&r, 6, 16), *yi = rows_of(&r, 6, 8);
    kvc_seq *a, *b, *e;
    cr_assert_eq(kvc_seq_create(c, &a, NULL), MT_OK);
    cr_assert_eq(kvc_seq_append(c, a, 10, x, xi, NULL), MT_OK);
    cr_assert_eq(kvc_free_pages(c), 13);
    /* 8 tokens: two whole pages, shared. */
    cr_assert_eq(kvc_seq_fork(c, a, 8, &b, NULL), MT_OK);
    cr_assert_eq(kvc_free_pages(c), 13);
    int32_t pa[8], pb[8];
    cr_assert_eq(kvc_seq_pages(a, pa, 8), 3);
    cr_assert_eq(kvc_seq_pages(b, pb, 8), 2);
    cr_assert_eq(pa[0], pb[0]);
    cr_assert_eq(pa[1], pb[1]);
    /* 6 tokens: one shared page and a copied partial one. */
    cr_assert_eq(kvc_seq_fork(c, a, 6, &e, NULL), MT_OK);
    cr_assert_eq(kvc_free_pages(c), 12);
    check_tokens(c, e, x, xi, 0, 6, seed);
    /* a rewrites tokens 6.. (inside the shared second page): b must not see it. */
    cr_assert_eq(kvc_seq_truncate(c, a, 6, NULL), MT_OK);
    cr_assert_eq(kvc_free_pages(c), 13, "a's third page is free again");
    cr_assert_eq(kvc_seq_append(c, a, 6, y, yi, NULL), MT_OK);
    check_tokens(c, b, x, xi, 0, 8, seed);
    check_tokens(c, a, x, xi, 0, 6, seed);
    check_tokens(c, a, y, yi, 6, 6, seed);
    kvc_seq_pages(a, pa, 8);
    cr_assert_neq(pa[1], pb[1], "the shared page was copied before the write");
    kvc_seq_destroy(c, a);
    kvc_seq_destroy(c, b);
    kvc_seq_destroy(c, e);
    cr_assert_eq(kvc_free_pages(c), 16);
    free(x);
    free(xi);
    free(y);
    free(yi);
    kvc_destroy(c);
    dev_close(d);
}

Test(kvcache, page_table_rows_match_sequences)
{
    dev_device *d = cpu();
    kvc_cache *c = make(d, KERN_DT_FP8E4M3, 3, 20);
    mt_rng r;
    mt_rng_seed(&r, mt_seed_fresh());
    float *x = rows_of(&r, 11, 16);
    kvc_seq *s[2];
    cr_assert_eq(kvc_seq_create(c, &s[0], NULL), MT_OK);
    cr_assert_eq(kvc_seq_create(c, &s[1], NULL), MT_OK);
    /* Interleaved appends, so pages of the two are mixed in the pool. */
    for (int i = 0; i < 11; i++)
        cr_assert_eq(kvc_seq_append(c, s[i % 2], 1, x + i * 16, NULL, NULL), MT_OK);
    void *dt;
    cr_assert_eq(dev_alloc(d, 2 * 5 * 4, &dt, NULL), MT_OK);
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kvc_table_upload(c, s, 2, 5, dt, &err), MT_OK, "%s", err.msg);
    int32_t t[10], p[5];
    cr_assert_eq(dev_copy_from(d, t, dt, sizeof t, NULL), MT_OK);
    for (int i = 0; i < 2; i++) {
        int64_t n = kvc_seq_pages(s[i], p, 5);
        cr_assert_eq(n, 2, "6 and 5 tokens of 3 per page");
        for (int64_t j = 0; j < 5; j++)
            cr_assert_eq(t[i * 5 + j], j < n ? p[j] : 0);
    }
    cr_assert_eq(kvc_table_upload(c, s, 2, 1, dt, &err), MT_E_INVALID);
    dev_free(d, dt);
    free(x);
    kvc_destroy(c);
    dev_close(d);
}

Test(kvcache, bad_options_are_rejected)
{
    dev_device *d = cpu();
    kvc_opts o = {.page_size = 0, .n_pages = 4, .latent = 8, .rope = 0, .dtype = KERN_DT_BF16};
    kvc_cache *c;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kvc_create(d, &o, &c, &err), MT_E_INVALID);
    o.page_size = 4;
    o.dtype = KERN_DT_F32;
    cr_assert_eq(kvc_create(d, &o, &c, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "f32"), "%s", err.msg);
    dev_close(d);
}

/* A bookkeeping-only cache (no device: what a leader keeps of another
 * rank's cache) driven by the same random creates, reserves, forks,
 * truncations and destroys as a real one hands out the same pages and
 * the same free counts, refuses the same reserve when full, and refuses
 * what needs pools. */
Test(kvcache, bookkeeping_only_cache_hands_out_the_same_pages)
{
    dev_device *d = cpu();
    kvc_cache *real = make(d, KERN_DT_BF16, 4, 24), *book = make(NULL, KERN_DT_BF16, 4, 24);
    uint64_t seed = mt_seed_fresh();
    mt_rng r;
    mt_rng_seed(&r, seed);
    enum { N = 8 };
    kvc_seq *a[N] = {0}, *b[N] = {0};
    mt_err err = MT_ERR_INIT;
    for (int step = 0; step < 400; step++) {
        int i = (int)mt_rng_below(&r, N), op = (int)mt_rng_below(&r, 5);
        if (!a[i]) {
            int src = (int)mt_rng_below(&r, N);
            if (op < 2 && a[src] && src != i) {
                int64_t n = (int64_t)mt_rng_below(&r, (uint64_t)kvc_seq_len(a[src]) + 1);
                mt_status s1 = kvc_seq_fork(real, a[src], n, &a[i], &err);
                mt_status s2 = kvc_seq_fork(book, b[src], n, &b[i], &err);
                cr_assert_eq(s1, s2, "seed %" PRIu64 " step %d: fork", seed, step);
            } else {
                cr_assert_eq(kvc_seq_create(real, &a[i], &err), MT_OK);
                cr_assert_eq(kvc_seq_create(book, &b[i], &err), MT_OK);
            }
            continue;
        }
        if (op < 3) {
            int64_t n = (int64_t)mt_rng_below(&r, 9);
            mt_status s1 = kvc_seq_reserve(real, a[i], n, NULL, &err);
            mt_status s2 = kvc_seq_reserve(book, b[i], n, NULL, &err);
            cr_assert_eq(s1, s2, "seed %" PRIu64 " step %d: reserve %" PRId64, seed, step, n);
        } else if (op == 3) {
            int64_t len = (int64_t)mt_rng_below(&r, (uint64_t)kvc_seq_len(a[i]) + 1);
            cr_assert_eq(kvc_seq_truncate(real, a[i], len, &err), MT_OK);
            cr_assert_eq(kvc_seq_truncate(book, b[i], len, &err), MT_OK);
        } else {
            kvc_seq_destroy(real, a[i]);
            kvc_seq_destroy(book, b[i]);
            a[i] = b[i] = NULL;
        }
        cr_assert_eq(kvc_free_pages(real), kvc_free_pages(book), "seed %" PRIu64 " step %d",
                     seed, step);
        for (int k = 0; k < N; k++) {
            if (!a[k])
                continue;
            int32_t pa[64], pb[64];
            int64_t na = kvc_seq_pages(a[k], pa, 64), nb = kvc_seq_pages(b[k], pb, 64);
            cr_assert_eq(na, nb);
            cr_assert_eq(kvc_seq_len(a[k]), kvc_seq_len(b[k]));
            for (int64_t p = 0; p < na && p < 64; p++)
                cr_assert_eq(pa[p], pb[p], "seed %" PRIu64 " step %d: sequence %d page %" PRId64,
                             seed, step, k, p);
        }
    }
    kvc_seq *s = NULL;
    cr_assert_eq(kvc_seq_create(book, &s, &err), MT_OK);
    float row[16] = {0};
    cr_assert_eq(kvc_seq_append(book, s, 1, row, NULL, &err), MT_E_INVALID);
    cr_assert_eq(kvc_seq_len(s), 0);
    cr_assert_null(kvc_latent_pool(book));
    kvc_destroy(real);
    kvc_destroy(book);
    dev_close(d);
}
