/* bench_model.c: the model runtime on the tiny GLM-5 checkpoint, on cpu.
 *
 *  1. Accuracy: relative L2 error and top-1 agreement of the logits of the
 *     a16w4, a8w4 and a4w4 kernel paths against the float32 reference over
 *     dequantized weights (model/reference.h without bf16 rounding or
 *     activation quantization), and of the float reference with MXFP4 or
 *     int8 activations (the quantization error alone, no kernels
 *     involved). --accuracy-only stops after it.
 *  2. Speed: prefill and decode tokens per second with every kernel at its
 *     default config, then with a database tuned in this run by the tuner's
 *     C API (tuner/tuner.h; a small budget per shape) for the kernels that
 *     carry the work (GEMMs, MoE stages, attention, norms), compared with
 *     the defaults in paired, interleaved rounds (lib/model_ab.h: the
 *     speedup with its bootstrap interval, so noise is not read as a win
 *     or a regression); then batch-invariant mode (one config per kernel at
 *     every M) against the same selection without it, the same way.
 *
 * usage: bench_model [--accuracy-only] [--budget TRIALS] [--prompt N] [--decode N]
 *                    [--rounds R] */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rng.h"
#include "model/ref/reference.h"
#include "model/runtime.h"
#include "model/format/tiny.h"
#include "bench/lib/model_ab.h"
#include "tuner/tuner.h"

static FILE *quiet(void)
{
    static FILE *f;
    if (!f)
        f = fopen("/dev/null", "w");
    return f;
}

static model_runtime *open_inv(const char *dir, const char *db, model_act_quant act, int T,
                               bool invariant)
{
    model_runtime_opts o = {.model_dir = dir, .device = "cpu", .db_path = db, .act_quant = act,
                            .act_quant_set = true, .kv_pages = 128, .max_batch_tokens = T,
                            .batch_invariant = invariant, .log = quiet()};
    model_runtime *rt = NULL;
    mt_err err = MT_ERR_INIT;
    if (model_runtime_open(&o, &rt, &err) != MT_OK) {
        fprintf(stderr, "bench_model: %s\n", err.msg);
        exit(1);
    }
    return rt;
}

static model_runtime *open_rt(const char *dir, const char *db, model_act_quant act, int T)
{
    return open_inv(dir, db, act, T, false);
}

static void step_or_die(model_runtime *rt, model_step_item *it)
{
    mt_err err = MT_ERR_INIT;
    if (model_step(rt, it, 1, &err) != MT_OK) {
        fprintf(stderr, "bench_model: %s\n", err.msg);
        exit(1);
    }
}

static float *prefill_logits(model_runtime *rt, const int32_t *tok, int n)
{
    int32_t V = model_runtime_vocab(rt);
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)n);
    int seq;
    model_seq_create(rt, &seq, NULL);
    model_step_item it = {.seq = seq, .tokens = tok, .n_tokens = n, .all_logits = lg,
                          .n_prompt = n};
    step_or_die(rt, &it);
    model_seq_free(rt, seq);
    return lg;
}

/* Positions whose largest logit is the same token in got and want. */
static int top1_agree(const float *got, const float *want, int n, int32_t V)
{
    int same = 0;
    for (int t = 0; t < n; t++) {
        const float *g = got + (size_t)t * V, *w = want + (size_t)t * V;
        int32_t bg = 0, bw = 0;
        for (int32_t v = 1; v < V; v++) {
            bg = g[v] > g[bg] ? v : bg;
            bw = w[v] > w[bw] ? v : bw;
        }
        same += bg == bw;
    }
    return same;
}

static void rel_err(const float *got, const float *want, int n, int32_t V, double *mean,
                    double *worst)
{
    *mean = *worst = 0;
    for (int t = 0; t < n; t++) {
        double e = 0, w = 0;
        for (int32_t v = 0; v < V; v++) {
            double d = (double)got[(size_t)t * V + v] - want[(size_t)t * V + v];
            e += d * d;
            w += (double)want[(size_t)t * V + v] * want[(size_t)t * V + v];
        }
        double r = sqrt(e / w);
        *mean += r / n;
        *worst = r > *worst ? r : *worst;
    }
}

/* Best of 3: prefill of n tokens in one step, and decode of d tokens one
 * per step after it. */
static void ab_or_die(model_runtime *a, model_runtime *b, const int32_t *tok, int n, int d,
                      const model_ab_opts *o, model_ab_result *r)
{
    mt_err err = MT_ERR_INIT;
    if (model_ab_compare(a, b, tok, n, d, o, r, &err) != MT_OK) {
        fprintf(stderr, "bench_model: %s\n", err.msg);
        exit(1);
    }
}

static void ab_row(const char *what, const model_ab_result *r)
{
    char pre[96], dec[96];
    model_ab_phase_text(&r->prefill, r->level, pre, sizeof pre);
    model_ab_phase_text(&r->decode, r->level, dec, sizeof dec);
    printf("  %-44s %6.0f/%6.1f %6.0f/%6.1f  %-40s %s\n", what, r->prefill.a_tps,
           r->decode.a_tps, r->prefill.b_tps, r->decode.b_tps, pre, dec);
}

/* The (family, shape) pairs the runtime selects for, from its report. */
static int runtime_jobs(model_runtime *rt, const int64_t *ms, int n_m, tune_job *jobs, int cap)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    model_runtime_report(rt, f);
    fclose(f);
    static const char *const wanted[] = {"gemm", "moe_route", "moe_align", "moe_gemm_up",
                                         "moe_gemm_down", "mla_decode", "dsa_indexer",
                                         "rmsnorm", "ops_head_gemm"};
    int n = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char fam[64], shape[KERN_KEY_MAX];
        if (sscanf(line, "%63s %511s", fam, shape) != 2)
            continue;
        bool want = false;
        for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++)
            want = want || !strcmp(fam, wanted[i]);
        const kern_family *kf = kern_family_find(fam);
        if (!want || !kf)
            continue;
        bool dup = false;
        for (int j = 0; j < n && !dup; j++) {
            char k[KERN_KEY_MAX];
            kern_shape_key(jobs[j].fam, &jobs[j].shape, false, k, sizeof k);
            dup = jobs[j].fam == kf && !strcmp(k, shape);
        }
        mt_err err = MT_ERR_INIT;
        if (dup || n == cap || tune_job_make(kf, shape, ms, n_m, &jobs[n], &err) != MT_OK)
            continue;
        n++;
    }
    free(buf);
    return n;
}

int main(int argc, char **argv)
{
    int budget = 6, n_prompt = 128, n_dec = 32, rounds = 10;
    bool accuracy_only = false;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--accuracy-only")) {
            accuracy_only = true;
            for (int j = i; j + 1 < argc; j++)
                argv[j] = argv[j + 1];
            argc--;
            break;
        }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--budget"))
            budget = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt"))
            n_prompt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--decode"))
            n_dec = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
    }
    char dir[] = "/tmp/mt_bench_model_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    mt_err err = MT_ERR_INIT;
    if (model_tiny_write(dir, 1, &err) != MT_OK) {
        fprintf(stderr, "bench_model: %s\n", err.msg);
        return 1;
    }
    printf("bench_model: tiny GLM-5 checkpoint (hidden 256, 4 layers, 16 experts top-4, "
           "MXFP4 experts) on cpu\n\n");

    /* ---- accuracy ---- */
    const int n_acc = 32;
    mt_rng r;
    mt_rng_seed(&r, 1);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(n_prompt > n_acc ? n_prompt : n_acc));
    for (int i = 0; i < (n_prompt > n_acc ? n_prompt : n_acc); i++)
        tok[i] = (int32_t)mt_rng_below(&r, 512);
    model_ref *ref = NULL, *ref4 = NULL, *ref8 = NULL;
    model_ref_opts fo = {0}, f4 = {.act_mxfp4 = true}, f8 = {.act_int8 = true};
    if (model_ref_open(dir, &fo, &ref, &err) != MT_OK ||
        model_ref_open(dir, &f4, &ref4, &err) != MT_OK ||
        model_ref_open(dir, &f8, &ref8, &err) != MT_OK) {
        fprintf(stderr, "bench_model: %s\n", err.msg);
        return 1;
    }
    int32_t V = (int32_t)model_ref_vocab(ref);
    float *want = malloc(sizeof(float) * (size_t)V * n_acc);
    float *want4 = malloc(sizeof(float) * (size_t)V * n_acc);
    float *want8 = malloc(sizeof(float) * (size_t)V * n_acc);
    model_ref_forward(ref, tok, n_acc, want, NULL);
    model_ref_forward(ref4, tok, n_acc, want4, NULL);
    model_ref_forward(ref8, tok, n_acc, want8, NULL);
    printf("logits vs the float32 reference over dequantized weights (%d positions, context "
           "past index_topk):\n", n_acc);
    printf("  %-44s %12s %12s\n", "path", "mean rel L2", "worst");
    double mean, worst;
    rel_err(want4, want, n_acc, V, &mean, &worst);
    printf("  %-44s %12.3g %12.3g\n", "float reference, MXFP4 activations", mean, worst);
    rel_err(want8, want, n_acc, V, &mean, &worst);
    printf("  %-44s %12.3g %12.3g\n", "float reference, int8 activations", mean, worst);
    static const struct {
        model_act_quant act;
        const char *what;
    } paths[] = {{MODEL_ACT_NONE, "kernels a16w4 (bf16 storage)"},
                 {MODEL_ACT_INT8, "kernels a8w4 (bf16 storage, int8 activations)"},
                 {MODEL_ACT_MXFP4, "kernels a4w4 (bf16 storage, MXFP4 activations)"}};
    for (int a = 0; a < 3; a++) {
        model_runtime *rt = open_rt(dir, NULL, paths[a].act, 64);
        float *got = prefill_logits(rt, tok, n_acc);
        rel_err(got, want, n_acc, V, &mean, &worst);
        printf("  %-44s %12.3g %12.3g   top-1 agreement %d/%d\n", paths[a].what, mean, worst,
               top1_agree(got, want, n_acc, V), n_acc);
        free(got);
        model_runtime_close(rt);
    }
    model_ref_close(ref);
    model_ref_close(ref4);
    model_ref_close(ref8);
    free(want);
    free(want4);
    free(want8);
    if (accuracy_only) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_model: could not remove %s\n", dir);
        free(tok);
        return 0;
    }

    /* ---- the runtime without a database: the kernels to tune ---- */
    int T = n_prompt > 64 ? n_prompt : 64;
    model_runtime *rt = open_rt(dir, NULL, MODEL_ACT_MXFP4, T);

    /* ---- tune a database with the tuner's C API ---- */
    char db[300];
    snprintf(db, sizeof db, "%s/tune.db", dir);
    const int64_t ms[2] = {1, n_prompt};
    tune_job jobs[TUNE_MAX_JOBS];
    int n_jobs = runtime_jobs(rt, ms, 2, jobs, TUNE_MAX_JOBS);
    model_runtime_close(rt);
    tune_opts to;
    tune_opts_default(&to);
    to.device = "cpu";
    to.db_path = db;
    to.budget.trials = budget; /* the default strategy */
    to.jobs = 2;
    to.seed = 1;
    to.timing.max_ms = 200;
    to.timing.max_reps = 20;
    printf("\ntuning %d (family, shape) pairs at M = 1 and %d, %d trials each (%s), "
           "into %s ...\n", n_jobs, n_prompt, budget, tune_strategy_name(to.strategy), db);
    double tt = mt_now_ms();
    tune_report *rep = NULL;
    mt_status st = tune_run(jobs, n_jobs, &to, &rep, &err);
    tune_report_free(rep);
    if (st != MT_OK) {
        fprintf(stderr, "bench_model: tuning: %s\n", err.msg);
        return 1;
    }
    printf("tuned in %.0f s\n", (mt_now_ms() - tt) / 1000.0);

    /* ---- speed with it: paired rounds against the defaults ---- */
    model_runtime *rd = open_rt(dir, NULL, MODEL_ACT_MXFP4, T);
    rt = open_rt(dir, db, MODEL_ACT_MXFP4, T);
    model_selection_counts c;
    model_runtime_selection(rt, &c);
    model_ab_opts ab = {.rounds = rounds, .level = 0.95, .seed = 1};
    model_ab_result tuned;
    ab_or_die(rd, rt, tok, n_prompt, n_dec, &ab, &tuned);
    /* ---- batch-invariant mode (one config per kernel at every M) against
     * the same selection without it ---- */
    model_ab_result inv[2];
    for (int t = 0; t < 2; t++) {
        model_runtime *ri = open_inv(dir, t ? db : NULL, MODEL_ACT_MXFP4, T, true);
        ab_or_die(t ? rt : rd, ri, tok, n_prompt, n_dec, &ab, &inv[t]);
        model_runtime_close(ri);
    }
    model_runtime_close(rt);
    model_runtime_close(rd);
    printf("\ncpu, a4w4; prompt %d tokens in one step, then %d decode steps; %d paired rounds "
           "(A then B, B then A, ...), tok/s medians, B/A speedup with its 95%% bootstrap "
           "interval\n", n_prompt, n_dec, rounds);
    printf("  %-44s %13s %13s  %-40s %s\n", "B against A", "A tok/s", "B tok/s", "prefill B/A",
           "decode B/A");
    ab_row("tuned database vs defaults", &tuned);
    ab_row("batch-invariant vs not (defaults)", &inv[0]);
    ab_row("batch-invariant vs not (tuned database)", &inv[1]);
    printf("  selection with the database: %d tuned, %d nearest bucket, %d default (untuned "
           "glue kernels and shapes)\n", c.tuned, c.nearest, c.defaults + c.stale);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_model: could not remove %s\n", dir);
    free(tok);
    return 0;
}
