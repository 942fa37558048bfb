/* test_family.c: shape keys, config keys and parsing, space enumeration and
 * sampling, defines, and the default comparison rule. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/core/family.h"

static const kern_family *gemm(void)
{
    const kern_family *f = kern_family_find("gemm");
    cr_assert_not_null(f);
    return f;
}

Test(kern_shape, preset_and_key_round_trip)
{
    kern_shape s, s2;
    int64_t m = 0;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_shape_parse(gemm(), "tiny", &s, &m, &err), MT_OK, "%s", err.msg);
    char key[256];
    kern_shape_key(gemm(), &s, true, key, sizeof key);
    cr_assert_str_eq(key, "N=64,K=96");
    cr_assert_eq(kern_shape_parse(gemm(), key, &s2, NULL, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(memcmp(&s, &s2, sizeof s), 0);
}

Test(kern_shape, partial_key_takes_first_preset_and_m)
{
    kern_shape s;
    int64_t m = 0;
    cr_assert_eq(kern_shape_parse(gemm(), "K=200,M=7", &s, &m, NULL), MT_OK);
    cr_assert_eq(kern_shape_get(gemm(), &s, "K"), 200);
    cr_assert_eq(kern_shape_get(gemm(), &s, "N"), 64);
    cr_assert_eq(m, 7);
    cr_assert_eq(kern_shape_get(gemm(), &s, "nope"), -1);
}

Test(kern_shape, bad_keys_name_the_problem)
{
    kern_shape s;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_shape_parse(gemm(), "Q=3", &s, NULL, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "unknown dim 'Q'"), "%s", err.msg);
    cr_assert_eq(kern_shape_parse(gemm(), "N=abc", &s, NULL, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "N=abc"), "%s", err.msg);
    cr_assert_eq(kern_shape_parse(gemm(), "N=0", &s, NULL, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "outside"), "%s", err.msg);
    cr_assert_eq(kern_shape_parse(gemm(), "N", &s, NULL, &err), MT_E_INVALID);
}

Test(kern_shape, runtime_dims_stay_out_of_the_tuning_key)
{
    const kern_family *f = kern_family_find("rmsnorm");
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, "N=100,eps_e=6", &s, NULL, NULL), MT_OK);
    char a[128], b[128];
    kern_shape_key(f, &s, false, a, sizeof a);
    kern_shape_key(f, &s, true, b, sizeof b);
    cr_assert_str_eq(a, "N=100");
    cr_assert_str_eq(b, "N=100,eps_e=6");
}

Test(kern_config, key_json_parse_round_trip_over_whole_space)
{
    const kern_impl *im = gemm()->gpu;
    uint64_t n = kern_space_size(im);
    cr_assert_eq(n, 4ull * 4 * 3 * 4 * 4 * 4 * 3);
    for (uint64_t i = 0; i < n; i += 37) {
        kern_config c, c2, c3;
        kern_space_point(im, i, &c);
        char key[256], json[256];
        kern_config_key(im, &c, key, sizeof key);
        kern_config_json(im, &c, json, sizeof json);
        cr_assert_eq(kern_config_parse(im, key, &c2, NULL), MT_OK, "%s", key);
        cr_assert_eq(kern_config_parse(im, json, &c3, NULL), MT_OK, "%s", json);
        cr_assert_eq(memcmp(c.v, c2.v, sizeof(int) * (size_t)c.n), 0);
        cr_assert_eq(memcmp(c.v, c3.v, sizeof(int) * (size_t)c.n), 0);
    }
}

Test(kern_config, parse_rejects_unknown_missing_and_disallowed)
{
    const kern_impl *im = gemm()->gpu;
    kern_config c;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_config_parse(im, "BM=16,BN=16,BK=8,TM=1,TN=1", &c, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "SPLITK missing"), "%s", err.msg);
    cr_assert_eq(kern_config_parse(im, "BM=17,BN=16,BK=8,TM=1,TN=1,SPLITK=1", &c, &err),
                 MT_E_INVALID);
    cr_assert(strstr(err.msg, "BM=17"), "%s", err.msg);
    cr_assert_eq(kern_config_parse(im, "XX=1", &c, &err), MT_E_INVALID);
}

Test(kern_space, sample_is_valid_distinct_and_deterministic)
{
    const kern_family *f = gemm();
    dev_props p = {.backend = DEV_BACKEND_EMU, .warp_size = 64,
                   .max_threads_per_block = 1024, .shared_mem_per_block = 65536};
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, "tiny", &s, NULL, NULL), MT_OK);
    kern_config a[20], b[20];
    int na = kern_space_sample(f, f->gpu, &s, 5, &p, 42, true, a, 20);
    int nb = kern_space_sample(f, f->gpu, &s, 5, &p, 42, true, b, 20);
    cr_assert_eq(na, 20);
    cr_assert_eq(na, nb);
    cr_assert_eq(memcmp(a, b, sizeof(kern_config) * (size_t)na), 0);
    char why[256];
    for (int i = 0; i < na; i++) {
        cr_assert(kern_config_valid(f, f->gpu, &s, 5, &a[i], &p, why, sizeof why), "%s", why);
        for (int j = 0; j < i; j++)
            cr_assert_neq(memcmp(a[i].v, a[j].v, sizeof(int) * (size_t)a[i].n), 0);
    }
}

static int param_index(const kern_impl *im, const char *name)
{
    for (int i = 0; i < im->n_params; i++)
        if (!strcmp(im->params[i].name, name))
            return i;
    return -1;
}

/* check's sample: every M bucket's default valid at the case's M, every
 * MMA and GEMV value the space has a valid config of, then the random
 * ones; a shape the device cannot run is refused with the reason. */
Test(kern_space, check_sample_covers_every_mode_and_bucket_default)
{
    const kern_family *f = kern_family_find("moe_gemm_up");
    cr_assert_not_null(f);
    static const int64_t buckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024,
                                      2048, 4096};
    for (int ws = 32; ws <= 64; ws *= 2) {
        dev_props p = {.backend = DEV_BACKEND_EMU, .warp_size = ws, .max_threads_per_block = 1024,
                       .shared_mem_per_block = 65536, .static_shared_per_block = 65536};
        snprintf(p.arch, sizeof p.arch, "emu");
        kern_shape s;
        cr_assert_eq(kern_shape_parse(f, "tiny", &s, NULL, NULL), MT_OK);
        kern_config c[64], d[64];
        char why[256];
        int n = kern_space_sample_paths(f, f->gpu, &s, 17, &p, 7, 5, c, 64, why, sizeof why);
        cr_assert_gt(n, 5, "%s", why);
        cr_assert_eq(kern_space_sample_paths(f, f->gpu, &s, 17, &p, 7, 5, d, 64, NULL, 0), n);
        cr_assert_eq(memcmp(c, d, sizeof(kern_config) * (size_t)n), 0, "not deterministic");
        int mma = param_index(f->gpu, "MMA"), gemv = param_index(f->gpu, "GEMV");
        cr_assert(mma >= 0 && gemv >= 0);
        bool seen_mma[4] = {0}, seen_gemv[5] = {0};
        for (int i = 0; i < n; i++) {
            cr_assert(kern_config_valid(f, f->gpu, &s, 17, &c[i], &p, why, sizeof why), "%s",
                      why);
            seen_mma[c[i].v[mma]] = true;
            seen_gemv[c[i].v[gemv]] = true;
        }
        for (int v = 0; v < 4; v++)
            cr_assert(seen_mma[v] || (v == 2 && ws == 32), "wave%d: no MMA=%d config", ws, v);
        for (int v = 0; v < 5; v++)
            cr_assert(seen_gemv[v] || v == 3, "wave%d: no GEMV=%d config", ws, v);
        /* the default of every bucket that is valid at M=17 is among them */
        for (size_t b = 0; b < sizeof buckets / sizeof buckets[0]; b++) {
            kern_config dc;
            f->gpu->default_config(&s, buckets[b], &p, &dc);
            if (!kern_config_valid(f, f->gpu, &s, 17, &dc, &p, why, sizeof why))
                continue;
            bool in = false;
            for (int i = 0; i < n && !in; i++)
                in = !memcmp(c[i].v, dc.v, sizeof(int) * (size_t)dc.n);
            cr_assert(in, "wave%d: the default at M=%lld is not checked", ws,
                      (long long)buckets[b]);
        }
        /* the cpu kernels' weight layout: refused, with the reason */
        cr_assert_eq(kern_shape_parse(f, "H=256,I=128,E=16,topk=4,a=mxfp4,cat=1,wl=1,bm=128,"
                                         "skew=0", &s, NULL, NULL), MT_OK);
        cr_assert_eq(kern_space_sample_paths(f, f->gpu, &s, 1, &p, 7, 5, c, 64, why,
                                             sizeof why), 0);
        cr_assert(strstr(why, "wl=1"), "%s", why);
    }
}

Test(kern_defines, params_and_tuning_dims_become_macros)
{
    const kern_family *f = gemm();
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, "N=100,K=72", &s, NULL, NULL), MT_OK);
    kern_config c;
    kern_space_point(f->gpu, 0, &c);
    kern_defines defs;
    dev_compile_req req;
    dev_props p = {0};
    cr_assert_eq(kern_compile_req(f, f->gpu, &s, &c, &p, &defs, &req, NULL), MT_OK);
    cr_assert_not_null(req.source);
    bool n_ok = false, k_ok = false, bm_ok = false;
    for (int i = 0; i < req.n_defines; i++) {
        if (!strcmp(req.defines[i].name, "S_N"))
            n_ok = !strcmp(req.defines[i].value, "100");
        if (!strcmp(req.defines[i].name, "S_K"))
            k_ok = !strcmp(req.defines[i].value, "72");
        if (!strcmp(req.defines[i].name, "BM"))
            bm_ok = !strcmp(req.defines[i].value, "16");
    }
    cr_assert(n_ok && k_ok && bm_ok);
}

Test(kern_compare, float_tolerance_per_row_and_nan)
{
    float want[6] = {1, 2, 3, 100, 200, 300}, got[6];
    memcpy(got, want, sizeof got);
    kern_buf_desc b = {"y", KERN_BUF_OUT, KERN_DT_F32, sizeof got, 3, 1e-3, 1e-3};
    char why[256];
    cr_assert(kern_compare_default(&b, got, want, why, sizeof why));
    got[4] = 200.1f; /* within 1e-3 + 1e-3*200 */
    cr_assert(kern_compare_default(&b, got, want, why, sizeof why));
    got[1] = 2.01f; /* outside 1e-3 + 2e-3 */
    cr_assert_not(kern_compare_default(&b, got, want, why, sizeof why));
    cr_assert(strstr(why, "row 0 [1]"), "%s", why);
    got[1] = 2;
    got[5] = NAN;
    cr_assert_not(kern_compare_default(&b, got, want, why, sizeof why));
    cr_assert(strstr(why, "row 1 [2]"), "%s", why);
}

Test(kern_compare, integers_exact)
{
    int32_t want[4] = {1, -2, 3, 4}, got[4] = {1, -2, 3, 5};
    kern_buf_desc b = {"ids", KERN_BUF_OUT, KERN_DT_I32, sizeof got, 0, 0, 0};
    char why[256];
    cr_assert_not(kern_compare_default(&b, got, want, why, sizeof why));
    cr_assert(strstr(why, "ids[3] = 5, expected 4"), "%s", why);
}

Test(kern_registry, every_family_is_complete)
{
    const kern_family *const *all = kern_families();
    cr_assert_not_null(all[0]);
    for (int i = 0; all[i]; i++) {
        const kern_family *f = all[i];
        cr_assert(f->buffers && f->fill && f->reference && f->cost, "%s", f->name);
        cr_assert(f->gpu || f->cpu, "%s", f->name);
        cr_assert(f->n_cases > 0, "%s has no check cases", f->name);
        const kern_impl *ims[2] = {f->gpu, f->cpu};
        for (int j = 0; j < 2; j++) {
            if (!ims[j])
                continue;
            cr_assert_not_null(kern_source_get(ims[j]->source), "%s: %s not embedded",
                               f->name, ims[j]->source);
            cr_assert(ims[j]->run && ims[j]->default_config, "%s", f->name);
        }
        for (int c = 0; c < f->n_cases; c++) {
            kern_shape s;
            mt_err err = MT_ERR_INIT;
            cr_assert_eq(kern_shape_parse(f, f->cases[c].key, &s, NULL, &err), MT_OK,
                         "%s: %s", f->name, err.msg);
        }
    }
}

/* NVIDIA limits static __shared__ arrays to 48 KB per block (ptxas refuses
 * more) even where a block may opt in to 227 KB of dynamic shared memory:
 * a moe_gemm tile of 49,920 bytes (its tiles are static arrays) must be
 * invalid there and valid on a 64 KB AMD CU. */
Test(kern_valid, static_shared_memory_limit_is_the_static_one)
{
    const kern_family *f = kern_family_find("moe_gemm_up");
    cr_assert_not_null(f);
    kern_shape s;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(kern_shape_parse(f, "glm5.2", &s, NULL, &err), MT_OK, "%s", err.msg);
    kern_config c;
    cr_assert_eq(kern_config_parse(f->gpu, "BM=64,BN=64,BK=64,WAVES=4,STAGES=1,SPLITK=1,"
                                   "GROUP_M=1,VEC=4,UNROLL=1,MMA=0,GEMV=0", &c, &err),
                 MT_OK, "%s", err.msg);
    dev_props h200 = {.backend = DEV_BACKEND_CUDA, .warp_size = 32, .max_threads_per_block = 1024,
                      .shared_mem_per_block = 232448, .static_shared_per_block = 49152};
    dev_props mi300 = {.backend = DEV_BACKEND_HIP, .warp_size = 64, .max_threads_per_block = 1024,
                       .shared_mem_per_block = 65536, .static_shared_per_block = 65536};
    char why[256] = "";
    cr_expect(kern_config_valid(f, f->gpu, &s, 64, &c, &mi300, why, sizeof why), "%s", why);
    cr_expect_not(kern_config_valid(f, f->gpu, &s, 64, &c, &h200, why, sizeof why));
    cr_expect(strstr(why, "static shared") != NULL, "reason: %s", why);
}

/* kern_impl.order_varies flags the configs whose sums follow thread timing
 * (the batch-invariant runtime refuses them): gemm's split-K on GPUs and
 * moe_gemm_down's atomic combine when an element gets several adds,
 * nothing else. */
Test(kern_impl, order_varies_flags_atomic_accumulation_only)
{
    char why[160];
    kern_shape s;
    kern_config c;
    const kern_family *g = kern_family_find("gemm");
    cr_assert_eq(kern_shape_parse(g, "tiny", &s, NULL, NULL), MT_OK);
    kern_space_point(g->gpu, 0, &c);
    const int sk = 5; /* gemm's gpu params: BM BN BK TM TN SPLITK MMA */
    cr_assert_str_eq(g->gpu->params[sk].name, "SPLITK");
    c.v[sk] = 1;
    cr_assert_not(g->gpu->order_varies(&s, &c, why, sizeof why));
    c.v[sk] = 2;
    cr_assert(g->gpu->order_varies(&s, &c, why, sizeof why));
    cr_assert(strstr(why, "SPLITK=2"), "%s", why);
    cr_assert_null(g->cpu->order_varies);
    const kern_family *d = kern_family_find("moe_gemm_down");
    int dsk = -1;
    for (int i = 0; i < d->gpu->n_params; i++)
        dsk = strcmp(d->gpu->params[i].name, "SPLITK") ? dsk : i;
    cr_assert_geq(dsk, 0);
    for (int comb = 0; comb < 2; comb++)
        for (int topk = 1; topk <= 4; topk += 3)
            for (int split = 1; split <= 2; split++) {
                char key[200];
                snprintf(key, sizeof key, "H=256,I=128,E=16,topk=%d,a=bf16,comb=%d", topk,
                         comb);
                cr_assert_eq(kern_shape_parse(d, key, &s, NULL, NULL), MT_OK, "%s", key);
                /* cpu: no split K; one expert per token adds once per element */
                kern_space_point(d->cpu, 0, &c);
                cr_assert_eq(d->cpu->order_varies(&s, &c, why, sizeof why),
                             comb == 0 && topk > 1, "cpu %s", key);
                kern_space_point(d->gpu, 0, &c);
                c.v[dsk] = split;
                cr_assert_eq(d->gpu->order_varies(&s, &c, why, sizeof why),
                             comb == 0 && (topk > 1 || split > 1), "gpu %s SPLITK=%d", key,
                             split);
            }
    /* The other families sum in a fixed order. */
    for (const kern_family *const *f = kern_families(); *f; f++) {
        if (!strcmp((*f)->name, "gemm") || !strcmp((*f)->name, "moe_gemm_down"))
            continue;
        cr_assert(!((*f)->gpu && (*f)->gpu->order_varies), "%s", (*f)->name);
        cr_assert(!((*f)->cpu && (*f)->cpu->order_varies), "%s", (*f)->name);
    }
}
