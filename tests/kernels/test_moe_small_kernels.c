/* test_moe_small_kernels.c: the parameters of the small MoE kernels on
 * emu wave64 and wave32 against their C references at odd sizes (fresh
 * seeds, printed on failure): moe_route's K slices (KS) of the multi-block
 * logits GEMV, with E not a multiple of EPB, M not of TPB, H not a
 * multiple of VEC (the element path) and expert groups; moe_align's chunks
 * (CHUNK) with empty experts and fewer pairs than a chunk. Also the
 * validity rules of KS and the default split at M = 1 on a many-CU GPU. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/rng.h"
#include "device/device.h"
#include "kernels/core/family.h"
#include "kernels/core/runner.h"

typedef struct split_case {
    const char *family, *shape;
    int64_t m;
    const char *config;
} split_case;

/* Few shapes (each config and shape is one compile), several M each. */
static const split_case cases[] = {
    {"moe_route", "H=1000,E=12,topk=2,ngroup=1,topkg=1,rsf=1000,norm=1", 1,
     "WAVES=2,VEC=2,TPB=4,EPB=8,KS=4"},
    {"moe_route", "H=1000,E=12,topk=2,ngroup=1,topkg=1,rsf=1000,norm=1", 17,
     "WAVES=2,VEC=2,TPB=4,EPB=8,KS=4"},
    {"moe_route", "H=1000,E=12,topk=2,ngroup=1,topkg=1,rsf=1000,norm=1", 333,
     "WAVES=2,VEC=2,TPB=4,EPB=8,KS=4"},
    {"moe_route", "H=1002,E=32,topk=4,ngroup=4,topkg=2,rsf=2500,norm=1", 3,
     "WAVES=4,VEC=4,TPB=4,EPB=16,KS=2"},
    {"moe_align", "E=20,topk=3,bm=16,skew=2", 333, "BLOCK=64,CHUNK=256"},
    {"moe_align", "E=20,topk=3,bm=16,skew=2", 17, "BLOCK=64,CHUNK=256"},
};

static void check_all(const char *spec)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open(spec, NULL, &d, &err), MT_OK, "%s: %s", spec, err.msg);
    uint64_t seed = mt_seed_fresh();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const split_case *sc = &cases[i];
        const kern_family *f = kern_family_find(sc->family);
        cr_assert_not_null(f);
        kern_config c;
        cr_assert_eq(kern_config_parse(f->gpu, sc->config, &c, &err), MT_OK, "%s", err.msg);
        mt_status st = kern_check_one(d, f, sc->shape, sc->m, &c, seed + i, &err);
        cr_expect_eq(st, MT_OK, "%s on %s, %s M=%lld, %s, seed %llu: %s", sc->family, spec,
                     sc->shape, (long long)sc->m, sc->config, (unsigned long long)(seed + i),
                     err.msg);
    }
    dev_close(d);
}

Test(moe_small_kernels, splits_match_reference_on_emu_wave64, .timeout = 120)
{
    check_all("emu:wave64");
}

Test(moe_small_kernels, splits_match_reference_on_emu_wave32, .timeout = 120)
{
    check_all("emu:wave32");
}

static bool route_valid(const char *shape, int64_t m, const char *cfg, const dev_props *p,
                        char *why, size_t cap)
{
    const kern_family *f = kern_family_find("moe_route");
    kern_shape s;
    kern_config c;
    cr_assert_eq(kern_shape_parse(f, shape, &s, NULL, NULL), MT_OK, "%s", shape);
    cr_assert_eq(kern_config_parse(f->gpu, cfg, &c, NULL), MT_OK, "%s", cfg);
    why[0] = 0;
    return kern_config_valid(f, f->gpu, &s, m, &c, p, why, cap);
}

/* KS needs the multi-block path and slices that all hold part of H. */
Test(moe_small_kernels, route_ks_validity_names_the_reason)
{
    dev_props p = {.backend = DEV_BACKEND_HIP, .warp_size = 64, .max_threads_per_block = 1024,
                   .shared_mem_per_block = 65536, .static_shared_per_block = 65536,
                   .compute_units = 304};
    char why[256];
    const char *tiny = "H=256,E=16,topk=4,ngroup=1,topkg=1,rsf=2500,norm=1";
    cr_expect_not(route_valid(tiny, 1, "WAVES=4,VEC=4,TPB=0,EPB=4,KS=2", &p, why, sizeof why));
    cr_expect(strstr(why, "KS=2") && strstr(why, "TPB > 0"), "reason: %s", why);
    /* H=256 in runs of 64 x 4: one slice only */
    cr_expect_not(route_valid(tiny, 1, "WAVES=4,VEC=4,TPB=1,EPB=4,KS=2", &p, why, sizeof why));
    cr_expect(strstr(why, "KS=2") && strstr(why, "empty"), "reason: %s", why);
    cr_expect(route_valid(tiny, 1, "WAVES=4,VEC=2,TPB=1,EPB=4,KS=2", &p, why, sizeof why),
              "%s", why);
    cr_expect(route_valid("glm5.2", 1, "WAVES=4,VEC=4,TPB=1,EPB=8,KS=8", &p, why, sizeof why),
              "%s", why);
}

/* GLM-5.2 at M = 1 on a 304-CU GPU: the default grid covers the CUs with K
 * slices; on one CU it has none; past 32 tokens one block per token. */
Test(moe_small_kernels, route_default_split_covers_the_cus)
{
    const kern_family *f = kern_family_find("moe_route");
    kern_shape s;
    cr_assert_eq(kern_shape_parse(f, "glm5.2", &s, NULL, NULL), MT_OK);
    dev_props p = {.backend = DEV_BACKEND_HIP, .warp_size = 64, .max_threads_per_block = 1024,
                   .shared_mem_per_block = 65536, .static_shared_per_block = 65536,
                   .compute_units = 304};
    int ks = -1, tpb = -1, epb = -1;
    for (int i = 0; i < f->gpu->n_params; i++) {
        const char *n = f->gpu->params[i].name;
        ks = strcmp(n, "KS") ? ks : i;
        tpb = strcmp(n, "TPB") ? tpb : i;
        epb = strcmp(n, "EPB") ? epb : i;
    }
    cr_assert(ks >= 0 && tpb >= 0 && epb >= 0);
    kern_config c;
    char why[256] = "", key[256];
    f->gpu->default_config(&s, 1, &p, &c);
    kern_config_key(f->gpu, &c, key, sizeof key);
    cr_assert(kern_config_valid(f, f->gpu, &s, 1, &c, &p, why, sizeof why), "%s: %s", key, why);
    cr_expect_gt(c.v[tpb], 0, "%s", key);
    cr_expect_geq(kern_cdiv(256, c.v[epb]) * c.v[ks], 256, "%s: too few blocks", key);
    p.compute_units = 1;
    f->gpu->default_config(&s, 1, &p, &c);
    cr_expect_eq(c.v[ks], 1);
    p.compute_units = 304;
    f->gpu->default_config(&s, 333, &p, &c);
    kern_config_key(f->gpu, &c, key, sizeof key);
    cr_expect(c.v[tpb] == 0 && c.v[ks] == 1, "%s", key);
    cr_expect(kern_config_valid(f, f->gpu, &s, 333, &c, &p, why, sizeof why), "%s: %s", key, why);
}
