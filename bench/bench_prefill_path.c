/* bench_prefill_path.c: the runtime's two attention paths for prefill
 * chunks on the tiny GLM-5 checkpoint, on cpu: the same prompt through a
 * runtime that runs its rows on mla_prefill (dense, kv_b-expanded: the
 * default for rows whose context is at most index_topk) and through one
 * that keeps every row on the absorbed sparse mla_decode
 * (model_runtime_opts.absorbed_prefill), in paired, interleaved rounds
 * (lib/model_ab.h: prefill tokens per second of each and the speedup with
 * its bootstrap interval, so noise is not read as a win). Every kernel at
 * its default config. Decode steps are timed too (the same path on both:
 * a control that should read 1.0x).
 *
 * --glm P M: instead, the two paths' kernels for one chunk of M tokens
 * after P cached at GLM-5.2 dims (64 heads, latent 512, index_topk 2048,
 * P + M <= 2048: the rows mla_prefill takes), each kernel at its default
 * config on random inputs of the family's fill: absorbed = q absorb
 * (ops_head_gemm) + q rope copy + sparse mla_decode over the whole context
 * + output copy + W_UV (ops_head_gemm); prefill = mla_prefill (expansion
 * + flash attention). Paired rounds, alternating which goes first: the
 * median time of each and the median of the per-round ratios with their
 * range. The cost model's GFLOP of each path is printed beside.
 *
 * usage: bench_prefill_path [--prompt N] [--decode N] [--rounds R] [--glm P M] */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rng.h"
#include "kernels/core/exec.h"
#include "model/runtime.h"
#include "model/format/tiny.h"
#include "bench/lib/model_ab.h"

static model_runtime *open_rt(const char *dir, bool absorbed, int T)
{
    static FILE *quiet;
    if (!quiet)
        quiet = fopen("/dev/null", "w");
    model_runtime_opts o = {.model_dir = dir, .device = "cpu", .kv_pages = 256,
                            .max_batch_tokens = T, .absorbed_prefill = absorbed, .log = quiet};
    model_runtime *rt = NULL;
    mt_err err = MT_ERR_INIT;
    if (model_runtime_open(&o, &rt, &err) != MT_OK) {
        fprintf(stderr, "bench_prefill_path: open %s: %s\n", dir, err.msg);
        exit(1);
    }
    return rt;
}

/* One kernel at one shape with its own buffers, filled by its family. */
typedef struct kcall {
    const char *fam, *shape;
    int64_t m;
    const kern_family *f;
    kern_shape s;
    kern_exec *e;
    void *dbuf[KERN_MAX_BUFS];
    int n;
} kcall;

static void die(const char *what, const mt_err *err)
{
    fprintf(stderr, "bench_prefill_path: %s: %s\n", what, err->msg);
    exit(1);
}

static void kcall_open(dev_device *d, kcall *k)
{
    mt_err err = MT_ERR_INIT;
    k->f = kern_family_find(k->fam);
    if (!k->f || kern_shape_parse(k->f, k->shape, &k->s, NULL, &err) != MT_OK)
        die(k->shape, &err);
    kern_buf_desc bufs[KERN_MAX_BUFS];
    k->n = k->f->buffers(&k->s, k->m, bufs, KERN_MAX_BUFS);
    void *host[KERN_MAX_BUFS];
    for (int i = 0; i < k->n; i++) {
        size_t b = bufs[i].bytes ? bufs[i].bytes : 1;
        host[i] = calloc(1, b);
        if (!host[i] || dev_alloc(d, b, &k->dbuf[i], &err) != MT_OK)
            die("buffers", &err);
    }
    k->f->fill(&k->s, k->m, 42, host);
    for (int i = 0; i < k->n; i++) {
        if (dev_copy_to(d, k->dbuf[i], host[i], bufs[i].bytes, &err) != MT_OK)
            die("upload", &err);
        free(host[i]);
    }
    if (kern_exec_open(d, k->f, &k->s, k->m, NULL, &k->e, &err) != MT_OK)
        die(k->shape, &err);
}

/* Runs the calls one after the other; returns the milliseconds. */
static double run_path(dev_device *d, kcall *ks, int n)
{
    mt_err err = MT_ERR_INIT;
    double t0 = mt_now_ms();
    for (int i = 0; i < n; i++)
        if (kern_exec_run(ks[i].e, &ks[i].s, ks[i].m, ks[i].dbuf, &err) != MT_OK)
            die(ks[i].shape, &err);
    if (dev_synchronize(d, &err) != MT_OK)
        die("sync", &err);
    return mt_now_ms() - t0;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int glm(int64_t P, int64_t M, int rounds)
{
    if (P < 0 || M < 1 || P + M > 2048 || rounds < 2) {
        fprintf(stderr, "bench_prefill_path: --glm P M: P >= 0, M >= 1, P + M <= 2048\n");
        return 2;
    }
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    if (dev_open("cpu", NULL, &d, &err) != MT_OK)
        die("cpu", &err);
    char dec[160], pre[160];
    snprintf(dec, sizeof dec, "H=64,L=512,R=64,D=192,topk=2048,ps=16,kv=bf16,sparse=1,sm=0,"
             "C=%" PRId64, P + M);
    snprintf(pre, sizeof pre, "H=64,L=512,R=64,D=192,V=256,ps=16,kv=bf16,P=%" PRId64 ",sm=0", P);
    kcall absorbed[] = {
        {.fam = "ops_head_gemm", .shape = "H=64,K=192,KA=256,N=512,NO=576", .m = M},
        {.fam = "ops_copy", .shape = "SW=256,SO=192,N=64,DW=576,DO=512,s=bf16,d=bf16",
         .m = M * 64},
        {.fam = "mla_decode", .shape = dec, .m = M},
        {.fam = "ops_copy", .shape = "SW=32768,SO=0,N=32768,DW=32768,DO=0,s=f32,d=bf16", .m = M},
        {.fam = "ops_head_gemm", .shape = "H=64,K=512,KA=512,N=256,NO=256", .m = M},
    };
    kcall prefill[] = {{.fam = "mla_prefill", .shape = pre, .m = M}};
    enum { NA = sizeof absorbed / sizeof absorbed[0] };
    double fa = 0, fp = 0;
    for (int i = 0; i < NA; i++) {
        kcall_open(d, &absorbed[i]);
        double fl, by;
        absorbed[i].f->cost(&absorbed[i].s, absorbed[i].m, &fl, &by);
        fa += fl;
    }
    kcall_open(d, &prefill[0]);
    double by;
    prefill[0].f->cost(&prefill[0].s, M, &fp, &by);
    /* Warm-up, one kernel at a time: the absorbed path's breakdown. */
    double wt[NA];
    for (int i = 0; i < NA; i++)
        wt[i] = run_path(d, &absorbed[i], 1);
    run_path(d, prefill, 1);
    double *ta = malloc(sizeof(double) * (size_t)rounds * 3), *tp = ta + rounds, *ratio = tp + rounds;
    double load0[3] = {0}, load1[3] = {0};
    getloadavg(load0, 3);
    for (int r = 0; r < rounds; r++) {
        if (r % 2) {
            tp[r] = run_path(d, prefill, 1);
            ta[r] = run_path(d, absorbed, NA);
        } else {
            ta[r] = run_path(d, absorbed, NA);
            tp[r] = run_path(d, prefill, 1);
        }
        ratio[r] = ta[r] / tp[r];
    }
    getloadavg(load1, 3);
    qsort(ta, (size_t)rounds, sizeof(double), by_value);
    qsort(tp, (size_t)rounds, sizeof(double), by_value);
    qsort(ratio, (size_t)rounds, sizeof(double), by_value);
    printf("GLM-5.2 attention, cpu (%d threads), a chunk of %" PRId64 " tokens after %" PRId64
           " cached, %d paired rounds, load %.1f -> %.1f\n", dev_get_props(d)->compute_units, M,
           P, rounds, load0[0], load1[0]);
    printf("  absorbed (q absorb, rope copy, sparse mla_decode, copy, W_UV): median %.1f ms, "
           "%.1f GFLOP\n", ta[rounds / 2], fa / 1e9);
    printf("  mla_prefill (expansion + flash attention):                    median %.1f ms, "
           "%.1f GFLOP\n", tp[rounds / 2], fp / 1e9);
    printf("  speedup (absorbed / mla_prefill time, per round): median %.2fx, range %.2f-%.2f\n",
           ratio[rounds / 2], ratio[0], ratio[rounds - 1]);
    printf("  absorbed path, warm-up run per kernel:");
    for (int i = 0; i < NA; i++)
        printf(" %s %.1f ms%s", absorbed[i].fam, wt[i], i + 1 < NA ? "," : "\n");
    free(ta);
    for (int i = 0; i < NA; i++)
        kern_exec_close(absorbed[i].e);
    kern_exec_close(prefill[0].e);
    dev_close(d);
    return 0;
}

int main(int argc, char **argv)
{
    int prompt = 16, decode = 8, rounds = 10;
    int64_t gp = 0, gm = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--prompt") && i + 1 < argc)
            prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            decode = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--glm") && i + 2 < argc) {
            gp = atoll(argv[i + 1]);
            gm = atoll(argv[i + 2]);
            i += 2;
        } else {
            fprintf(stderr, "usage: bench_prefill_path [--prompt N] [--decode N] [--rounds R] "
                    "[--glm P M]\n");
            return 2;
        }
    }
    if (gm)
        return glm(gp, gm, rounds);
    if (prompt < 2 || decode < 1 || rounds < 2) {
        fprintf(stderr, "bench_prefill_path: --prompt >= 2, --decode >= 1, --rounds >= 2\n");
        return 2;
    }
    char dir[] = "/tmp/mt_bench_prefill_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("bench_prefill_path: mkdtemp");
        return 1;
    }
    mt_err err = MT_ERR_INIT;
    if (model_tiny_write(dir, 1, &err) != MT_OK) {
        fprintf(stderr, "bench_prefill_path: tiny model: %s\n", err.msg);
        return 1;
    }
    model_runtime *a = open_rt(dir, true, prompt), *b = open_rt(dir, false, prompt);
    int topk = (int)model_runtime_config(b)->index_topk;
    int32_t V = model_runtime_vocab(b);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(prompt + decode));
    mt_rng r;
    mt_rng_seed(&r, 7);
    for (int i = 0; i < prompt + decode; i++)
        tok[i] = (int32_t)mt_rng_below(&r, (uint64_t)V);
    model_ab_opts ab = {.rounds = rounds, .level = 0.95, .seed = 1};
    model_ab_result res;
    if (model_ab_compare(a, b, tok, prompt, decode, &ab, &res, &err) != MT_OK) {
        fprintf(stderr, "bench_prefill_path: %s\n", err.msg);
        return 1;
    }
    int64_t pre_rows, abs_rows;
    model_runtime_attention_rows(b, &pre_rows, &abs_rows);
    char pre[128], dec[128];
    model_ab_phase_text(&res.prefill, res.level, pre, sizeof pre);
    model_ab_phase_text(&res.decode, res.level, dec, sizeof dec);
    printf("tiny model, cpu, prompt %d (index_topk %d: %d rows per prompt on mla_prefill), "
           "%d decode steps, %d paired rounds\n", prompt, topk, prompt < topk ? prompt : topk,
           decode, res.rounds);
    printf("  prefill: absorbed %.0f tok/s, mla_prefill %.0f tok/s: %s\n", res.prefill.a_tps,
           res.prefill.b_tps, pre);
    printf("  decode (same path, control): %.0f / %.0f tok/s: %s\n", res.decode.a_tps,
           res.decode.b_tps, dec);
    printf("  rows the mla_prefill runtime attended: %" PRId64 " on mla_prefill, %" PRId64
           " absorbed\n", pre_rows, abs_rows);
    model_runtime_close(a);
    model_runtime_close(b);
    free(tok);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : 1;
}
