/* test_forward_util.h: helpers of the runtime tests (test_forward*.c,
 * test_generate.c): a tiny checkpoint in a temporary folder, opening the
 * runtime on a device, running prompts, and comparing logits. */
#ifndef MT_TEST_FORWARD_UTIL_H
#define MT_TEST_FORWARD_UTIL_H

#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/family.h"
#include "model/reference.h"
#include "model/runtime.h"
#include "model/tiny.h"
#include "test_tmp.h"

static inline char *fw_tiny_dir(void)
{
    char *dir = tmp_dir_dup("mt_fwd");
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tiny_write(dir, 1, &err), MT_OK, "%s", err.msg);
    return dir;
}

static inline void fw_rm_dir(char *dir)
{
    tmp_rm_tree(dir);
    free(dir);
}

typedef struct fw_open_args {
    const char *device;
    model_act_quant act;
    int kv_dtype;
    const char *db;
    int max_batch_tokens;
    bool batch_invariant;
} fw_open_args;

static inline model_runtime *fw_open(const char *dir, fw_open_args a)
{
    static FILE *quiet;
    if (!quiet)
        quiet = fopen("/dev/null", "w");
    model_runtime_opts o = {.model_dir = dir, .device = a.device ? a.device : "cpu",
                            .act_quant = a.act, .act_quant_set = true, .kv_dtype = a.kv_dtype,
                            .db_path = a.db, .kv_pages = 64,
                            .max_batch_tokens = a.max_batch_tokens ? a.max_batch_tokens : 64,
                            .batch_invariant = a.batch_invariant, .log = quiet};
    model_runtime *rt = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_runtime_open(&o, &rt, &err), MT_OK, "open %s on %s: %s", dir, o.device,
                 err.msg);
    return rt;
}

/* n random token ids in [0, vocab). */
static inline int32_t *fw_tokens(uint64_t seed, int n, int32_t vocab)
{
    mt_rng r;
    mt_rng_seed(&r, seed);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)mt_rng_below(&r, (uint64_t)vocab);
    return t;
}

/* The mimic reference's logits of a prompt, [n][V]; *least_margin (may be
 * NULL): its least router margin over the positions (model_ref_router_margin). */
static inline float *fw_ref_logits(const char *dir, const int32_t *tok, int n, int32_t V,
                                   double *least_margin)
{
    model_ref_opts ro = {.mimic = true};
    model_ref *ref = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_ref_open(dir, &ro, &ref, &err), MT_OK, "%s", err.msg);
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)n);
    cr_assert_eq(model_ref_forward(ref, tok, n, lg, &err), MT_OK, "%s", err.msg);
    cr_assert(isinf(model_ref_router_margin(ref, n)), "no margin past the last position");
    for (int t = 0; least_margin && t < n; t++) {
        double m = model_ref_router_margin(ref, t);
        cr_assert(m >= 0 && isfinite(m), "position %d: router margin %g (the tiny model has "
                  "MoE layers)", t, m);
        *least_margin = t == 0 || m < *least_margin ? m : *least_margin;
    }
    model_ref_close(ref);
    return lg;
}

/* For fw_tokens_clear where two runtime paths are compared: flips were
 * seen at least margins of 2e-4 to 4e-4 (21 positions), and once at 1.8e-3
 * (the paths' router inputs drift through the layers more than the
 * reference's rounding). At 1e-3 a prompt takes 0-8 draws of ~0.15 s; at
 * 3e-3 long prompts (test_forward's) may find none in 200. */
#define FW_CROSS_PATH_MARGIN 1e-3
/* Short prompts (5 or 6 tokens, test_forward_emu) can afford a wider margin: a flip was seen at
 * 1.47e-3 on emu against the reference (seed 13423370070553061739: one
 * position at 0.478). */
#define FW_SHORT_PROMPT_MARGIN 3e-3
/* fw_tokens for seed, seed + 1, ... until the checkpoint in dir routes
 * every position with a margin of at least min_margin: where two kernel
 * paths' roundings are compared (not against the reference), a near-tie
 * can send a position to another expert in one of them (a whole row moves
 * by ~0.2, later rows read its cache), which a few rows' statistics cannot
 * absorb. Logs the margin. */
static inline int32_t *fw_tokens_clear(const char *dir, uint64_t seed, int n, int32_t V,
                                       double min_margin)
{
    for (int draw = 0; draw < 200; draw++) {
        int32_t *tok = fw_tokens(seed + (uint64_t)draw, n, V);
        double m = INFINITY;
        free(fw_ref_logits(dir, tok, n, V, &m));
        if (m >= min_margin) {
            cr_log_info("seed %" PRIu64 ", draw %d: least router margin %.3g", seed, draw, m);
            return tok;
        }
        free(tok);
    }
    cr_assert_fail("seed %" PRIu64 ": no prompt of 200 routes with margins of at least %g",
                   seed, min_margin);
    return NULL;
}

/* Prefills tokens (a prompt: n_prompt = n) into a new sequence in one step;
 * returns all positions' logits. */
static inline float *fw_prefill(model_runtime *rt, const int32_t *tok, int n, int *seq_out)
{
    int seq;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_seq_create(rt, &seq, &err), MT_OK, "%s", err.msg);
    int32_t V = model_runtime_vocab(rt);
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)n);
    model_step_item it = {.seq = seq, .tokens = tok, .n_tokens = n, .all_logits = lg, .n_prompt = n};
    cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
    if (seq_out)
        *seq_out = seq;
    else
        model_seq_free(rt, seq);
    return lg;
}

/* Relative L2 error of one row of logits against a reference row. */
static inline double fw_rel_l2(const float *got, const float *want, int32_t n)
{
    double e = 0, w = 0;
    for (int32_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        e += d * d;
        w += (double)want[i] * want[i];
    }
    return sqrt(e / (w > 0 ? w : 1));
}

/* Rows of logits from the runtime's two attention paths (mla_prefill and
 * the absorbed mla_decode: bf16 roundings in different places, which
 * later layers, MoE routing and the DSA top-k carry along): every row <=
 * worst, the mean <= mean_max, half of the rows within 1e-2. A wrong
 * layout, rotation or mask gives errors near 1 in most rows. Logs the
 * statistics. */
static inline void fw_cross_path_rows(const float *got, const float *want, int n, int32_t V,
                                      double worst_max, double mean_max, const char *what,
                                      uint64_t seed)
{
    int close = 0;
    double worst = 0, mean = 0;
    for (int t = 0; t < n; t++) {
        double e = fw_rel_l2(got + (size_t)t * V, want + (size_t)t * V, V);
        cr_assert(!isnan(e), "%s, seed %" PRIu64 ": NaN at row %d", what, seed, t);
        worst = e > worst ? e : worst;
        mean += e / n;
        close += e <= 1e-2;
    }
    cr_log_info("%s, seed %" PRIu64 ": worst row %.3g, mean %.3g, %d of %d within 1e-2", what,
                seed, worst, mean, close, n);
    cr_assert_leq(worst, worst_max, "%s, seed %" PRIu64 ": worst row %.3g", what, seed, worst);
    cr_assert_leq(mean, mean_max, "%s, seed %" PRIu64 ": mean error %.3g", what, seed, mean);
    cr_assert_geq(2 * close, n, "%s, seed %" PRIu64 ": only %d of %d rows within 1e-2 "
                  "(mean %.3g)", what, seed, close, n, mean);
}

#endif
