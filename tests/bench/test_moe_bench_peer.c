/* test_moe_bench_peer.c: moe_bench's peer (moe_bench_opts.peer, what
 * bench_ggml_moe times ggml's mul_mat_id through) on the tiny shape: the
 * peer gets the run's dims and readable buffers once, runs once per round
 * of each stage and M with a valid routing that changes every round, and
 * its printed figures are its own times against the default config's.
 * Speed itself is not asserted. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/lib/moe_bench.h"
#include "common/numeric.h"
#include "common/rng.h"
#include "kernels/moe/moe_common.h"

enum { N_M = 2, MAX_CALLS = 256 };

static const int64_t test_ms[N_M] = {1, 5};

/* What the fake peer saw. */
typedef struct fake_peer {
    int setups;
    moe_bench_peer_inputs in;
    bool inputs_readable;
    int calls[2][N_M];          /* [down, up][M index] */
    int bad_ids, same_as_last;
    int32_t last[5 * 32];
    int64_t last_n;
} fake_peer;

/* A fixed time per (stage, M), so the printed spread must equal it. */
static double fake_ms(bool up, int mi) { return up ? 3.0 + mi : 7.0 + 2 * mi; }

static int m_index(int64_t M)
{
    for (int i = 0; i < N_M; i++)
        if (test_ms[i] == M)
            return i;
    return -1;
}

static mt_status fake_setup(void *ctx, const moe_bench_peer_inputs *in, mt_err *err)
{
    (void)err;
    fake_peer *f = ctx;
    f->setups++;
    f->in = *in;
    /* The buffers are on the device and hold data: bf16 x is finite and not
     * all zero; the last scale code of the last expert is readable (at
     * wl=1 the last byte of w2, the scales riding in the weights). */
    uint16_t x[256];
    uint8_t sc = 0;
    int64_t n = in->H < 256 ? in->H : 256, rows = in->E * in->H;
    const uint8_t *last = in->wl ? (const uint8_t *)in->w2 + moe_w4_bytes(1, rows, in->I) - 1
                                 : (const uint8_t *)in->s2 + rows * in->I / 32 - 1;
    bool ok = dev_copy_from(in->d, x, in->x, (size_t)n * 2, NULL) == MT_OK &&
              dev_copy_from(in->d, &sc, last, 1, NULL) == MT_OK;
    bool nonzero = false;
    for (int64_t i = 0; ok && i < n; i++) {
        float v = mt_bf16_to_f32(x[i]);
        ok = isfinite(v);
        nonzero |= v != 0;
    }
    f->inputs_readable = ok && nonzero;
    return MT_OK;
}

static mt_status fake_run(void *ctx, bool up, int64_t M, const int32_t *ids, double *ms,
                          mt_err *err)
{
    fake_peer *f = ctx;
    int mi = m_index(M);
    if (mi < 0)
        return mt_fail(err, MT_E_INVALID, "fake peer: unexpected M %lld", (long long)M);
    f->calls[up][mi]++;
    int64_t topk = f->in.topk, n = M * topk;
    for (int64_t t = 0; t < M; t++)
        for (int64_t k = 0; k < topk; k++) {
            int32_t e = ids[t * topk + k];
            if (e < 0 || e >= f->in.E)
                f->bad_ids++;
            for (int64_t j = 0; j < k; j++)
                if (ids[t * topk + j] == e)
                    f->bad_ids++;
        }
    if (n == f->last_n && !memcmp(ids, f->last, (size_t)n * sizeof(int32_t)))
        f->same_as_last++;
    memcpy(f->last, ids, (size_t)n * sizeof(int32_t));
    f->last_n = n;
    *ms = fake_ms(up, mi);
    return MT_OK;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert(cJSON_IsNumber(v), "no number \"%s\"", key);
    return v->valuedouble;
}

Test(moe_bench_peer, runs_each_round_on_a_fresh_routing_and_prints_its_figures, .timeout = 300)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu", NULL, &d, &err), MT_OK, "%s", err.msg);
    uint64_t seed = mt_seed_fresh();
    cr_log_info("seed %llu", (unsigned long long)seed);
    fake_peer f = {0};
    moe_bench_peer peer = {.name = "fake", .ctx = &f, .setup = fake_setup, .run = fake_run};
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    cr_assert(out);
    /* A budget far below one call: the minimum of 3 rounds per stage and M;
     * no limit probes (their 1-4 GiB buffer and samples cost seconds). */
    moe_bench_opts o = {.shape = "tiny", .family = "moe_gemm", .ms = test_ms, .n_ms = N_M,
                        .json = true, .max_ms = 1e-6, .seed = seed, .peer = &peer,
                        .no_limits = true};
    mt_status st = moe_bench_run(d, &o, out, &err);
    fclose(out);
    cr_assert_eq(st, MT_OK, "%s", err.msg);

    cr_assert_eq(f.setups, 1);
    cr_assert_eq(f.in.H, 256);
    cr_assert_eq(f.in.I, 128);
    cr_assert_eq(f.in.E, 16);
    cr_assert_eq(f.in.topk, 4);
    cr_assert_eq(f.in.maxm, 5);
    cr_assert(f.inputs_readable, "the peer could not read the run's x and weights");
    cr_assert_eq(f.bad_ids, 0, "routings with out-of-range or repeated experts");
    cr_assert_eq(f.same_as_last, 0, "a round reused the previous round's routing");

    /* Per stage and M: the stage line, then the peer's. */
    int seen[2][N_M] = {{0}};
    double stage_ms = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o2 = cJSON_Parse(line);
        cr_assert(o2, "not JSON: %s", line);
        const cJSON *vs = cJSON_GetObjectItemCaseSensitive(o2, "vs");
        const cJSON *stage = cJSON_GetObjectItemCaseSensitive(o2, "stage");
        cr_assert(cJSON_IsString(stage), "%s", line);
        bool up = !strcmp(stage->valuestring, "up");
        int mi = m_index((int64_t)num(o2, "M"));
        cr_assert(mi >= 0, "%s", line);
        if (!vs) {
            stage_ms = num(o2, "default_ms");
            /* The stage line names the probe's read pattern, and only
             * when there was a probe (this run has none). */
            const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o2, "probe_pattern");
            cr_assert(cJSON_IsString(pat), "no probe_pattern: %s", line);
            cr_assert_eq(num(o2, "mem_bw_GBps") > 0, pat->valuestring[0] != 0, "%s", line);
            cJSON_Delete(o2);
            continue;
        }
        cr_assert_str_eq(vs->valuestring, "fake");
        seen[up][mi]++;
        double want = fake_ms(up, mi), moe = num(o2, "moetune_ms");
        cr_assert_eq((int)num(o2, "reps"), f.calls[up][mi], "%s", line);
        cr_assert(f.calls[up][mi] >= 3, "%s", line);
        cr_assert_float_eq(num(o2, "peer_ms"), want, 1e-3, "%s", line);
        cr_assert_float_eq(num(o2, "peer_ms_p10"), want, 1e-3, "%s", line);
        cr_assert_float_eq(num(o2, "peer_ms_p90"), want, 1e-3, "%s", line);
        cr_assert_float_eq(moe, stage_ms, 1e-3, "the stage line's default: %s", line);
        cr_assert(moe > 0 && num(o2, "moetune_ms_p10") <= moe && moe <= num(o2, "moetune_ms_p90"),
                  "%s", line);
        cr_assert_float_eq(num(o2, "ratio_of_medians"), want / moe, 1e-3 * want / moe, "%s",
                           line);
        /* Per-round ratios want / t: between want / p90 and want / p10 of
         * moetune's times, in order. */
        double r10 = num(o2, "ratio_p10"), r50 = num(o2, "ratio_median"),
               r90 = num(o2, "ratio_p90");
        cr_assert(r10 <= r50 && r50 <= r90, "%s", line);
        cr_assert(r50 >= want / num(o2, "moetune_ms_p90") * 0.999 &&
                      r50 <= want / num(o2, "moetune_ms_p10") * 1.001,
                  "%s", line);
        cJSON_Delete(o2);
    }
    for (int up = 0; up < 2; up++)
        for (int mi = 0; mi < N_M; mi++)
            cr_assert_eq(seen[up][mi], 1, "peer lines for stage %d, M %lld", up,
                         (long long)test_ms[mi]);
    free(text);

    /* flush streams the probe buffer: refused without the limits. */
    o.flush = true;
    out = open_memstream(&text, &len);
    cr_assert(out);
    cr_assert_eq(moe_bench_run(d, &o, out, &err), MT_E_INVALID);
    fclose(out);
    free(text);
    cr_assert(strstr(err.msg, "flush") && strstr(err.msg, "no_limits"), "%s", err.msg);
    dev_close(d);
}

/* With the limits (cpu), every stage line names the probe's fastest read
 * pattern, which its plain read used, and has a bandwidth. */
Test(moe_bench_peer, stage_lines_name_the_probes_read_pattern, .timeout = 300)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu", NULL, &d, &err), MT_OK, "%s", err.msg);
    static const int64_t ms[] = {1};
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    cr_assert(out);
    moe_bench_opts o = {.shape = "tiny", .family = "moe_gemm_down", .ms = ms, .n_ms = 1,
                        .json = true, .max_ms = 1e-6, .seed = mt_seed_fresh()};
    mt_status st = moe_bench_run(d, &o, out, &err);
    fclose(out);
    cr_assert_eq(st, MT_OK, "%s", err.msg);
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        cJSON *o2 = cJSON_Parse(line);
        cr_assert(o2, "not JSON: %s", line);
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o2, "probe_pattern");
        cr_assert(cJSON_IsString(pat), "%s", line);
        cr_assert(!strncmp(pat->valuestring, "1 stream", 8) ||
                      !strncmp(pat->valuestring, "2 streams", 9) ||
                      !strncmp(pat->valuestring, "4 streams", 9),
                  "no read pattern: %s", line);
        cr_assert(num(o2, "mem_bw_GBps") > 0 && num(o2, "pattern_GBps") > 0, "%s", line);
        /* The plain read is a read of memory: the limit is never below it,
         * so no fraction against the limit is above 1 because of it. */
        cr_assert_geq(num(o2, "mem_bw_GBps"), num(o2, "pattern_GBps") * (1 - 1e-6), "%s", line);
        cr_assert_leq(num(o2, "pattern_fraction_of_bw_paired"), 1 + 1e-6, "%s", line);
        double over = num(o2, "pattern_above_probe_rounds");
        cr_assert(over >= 0 && over <= num(o2, "reps"), "%s", line);
        /* Nor below any call: every fraction of it is at most 1. */
        over = num(o2, "call_above_probe_rounds");
        cr_assert(over >= 0 && over <= num(o2, "reps"), "%s", line);
        cr_assert_leq(num(o2, "fraction_of_bw"), 1 + 1e-6, "%s", line);
        cr_assert_leq(num(o2, "fraction_of_bw_paired_p90"), 1 + 1e-6, "%s", line);
        cJSON_Delete(o2);
    }
    cr_assert_eq(lines, 1, "one stage line: %s", text);
    free(text);
    dev_close(d);
}
