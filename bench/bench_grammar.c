/* bench_grammar.c: the cost of structured outputs' token mask per generated
 * token (serve/serve_logits.h: the grammar's mask through its cache, then
 * applied to a row of logits), against the time of a decode step.
 *
 * Two vocabularies: the tiny model's (512 tokens), whose decode step is
 * measured in the same run on this machine's cpu (one token after a
 * 32-token prompt, the median of 64 steps); and a synthetic byte-level
 * vocabulary the size of GLM-5.2's logits row (154,880 tokens: ASCII words
 * with and without a leading space, digit groups, punctuation and JSON
 * pieces, whitespace runs, CJK characters whole and split, GLM's tags),
 * against GLM-5.2's decode step on GPU, which no machine here can run: its
 * lower bound from memory bandwidth, the bytes a batch-1 step reads on one
 * rank of 8 (model/plan/mem_plan.h on the checkpoint's config: attention,
 * indexer, dense MLP, router, shared expert, half of embedding+lm_head, and
 * the routed experts' share a token touches, topk / E) at an H200's 4.8
 * TB/s. Real steps are slower than the bound, so the fraction printed is
 * an upper bound on the mask's share.
 *
 * Workloads: a json_schema with nested objects, arrays, enums and strings
 * with and without maxLength, and tool_choice required over two tools;
 * each generates --outputs answers token by token, picking among the
 * allowed tokens by random logits (as a random model would). The first
 * answer of each grammar starts with an empty mask cache (cold); the rest
 * reuse it, as the requests of one schema do in a server (warm).
 *
 * usage: bench_grammar [--config FILE] [--outputs N] [--seed S]
 * (FILE: GLM-5.2's config.json; default tests/fixtures/glm5.2-mxfp4-config.json
 * from the source tree or a build folder in it) */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rng.h"
#include "model/format/tiny.h"
#include "model/plan/mem_plan.h"
#include "model/runtime.h"
#include "serve/serve_logits.h"

#define GLM_LOGITS 154880
#define H200_BYTES_PER_S 4.8e12

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_grammar: %s: %s\n", what, msg);
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- the synthetic vocabulary --------------------------------------------------- */

typedef struct vocab_bytes {
    int32_t n;
    char **b;
    uint32_t *len;
    bool *text;
} vocab_bytes;

static void vb_add(vocab_bytes *v, const char *p, uint32_t n, bool text)
{
    v->b[v->n] = malloc(n + 1);
    memcpy(v->b[v->n], p, n);
    v->len[v->n] = n;
    v->text[v->n] = text;
    v->n++;
}

/* A byte-level vocabulary of n tokens, shaped like a BPE one: the 256
 * bytes, then words and pieces drawn at random (duplicates are kept: a real
 * vocabulary has none, but they cost the mask the same). */
static void synthetic(vocab_bytes *v, int32_t n, uint64_t seed)
{
    v->b = calloc((size_t)n, sizeof *v->b);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->text = calloc((size_t)n, sizeof *v->text);
    mt_rng r;
    mt_rng_seed(&r, seed);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        vb_add(v, &c, 1, true);
    }
    static const char *const tags[] = {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                                       "<arg_value>", "</arg_value>", "<think>", "</think>"};
    for (int i = 0; i < 8; i++)
        vb_add(v, tags[i], (uint32_t)strlen(tags[i]), true);
    static const char *const punct[] = {
        "\":", "\",", "{\"", "\"}", "\"]", "[\"", "},", "}]", "\":\"", "\",\"", "\":[", "\":{",
        "\n", "\n\n", "  ", "    ", "\t", ".", ",", ";", ":", "!", "?", "()", "();", "->", "==",
        "//", "/*", "*/", "\\n", "\\\"", "''", "--", "...", " (", " \"", " [", " {", ")", "])"};
    const int np = (int)(sizeof punct / sizeof punct[0]);
    char buf[64];
    while (v->n < n - 16) {
        int kind = (int)mt_rng_below(&r, 100);
        uint32_t len = 0;
        if (kind < 62) { /* a word, mostly with a leading space */
            if (mt_rng_below(&r, 4))
                buf[len++] = ' ';
            int wl = 2 + (int)mt_rng_below(&r, 9);
            bool cap = mt_rng_below(&r, 5) == 0;
            for (int k = 0; k < wl; k++)
                buf[len++] = (char)((k == 0 && cap ? 'A' : 'a') + (int)mt_rng_below(&r, 26));
        } else if (kind < 68) { /* digits */
            int dl = 1 + (int)mt_rng_below(&r, 3);
            for (int k = 0; k < dl; k++)
                buf[len++] = (char)('0' + (int)mt_rng_below(&r, 10));
        } else if (kind < 80) { /* punctuation, JSON pieces */
            const char *p = punct[mt_rng_below(&r, (uint64_t)np)];
            len = (uint32_t)strlen(p);
            memcpy(buf, p, len);
            if (mt_rng_below(&r, 2))
                buf[len++] = (char)('a' + (int)mt_rng_below(&r, 26));
        } else if (kind < 94) { /* CJK: 1-3 whole characters */
            int cl = 1 + (int)mt_rng_below(&r, 3);
            for (int k = 0; k < cl; k++) {
                unsigned cp = 0x4E00 + (unsigned)mt_rng_below(&r, 0x5000);
                buf[len++] = (char)(0xE0 | cp >> 12);
                buf[len++] = (char)(0x80 | (cp >> 6 & 0x3F));
                buf[len++] = (char)(0x80 | (cp & 0x3F));
            }
        } else { /* a split character: a lead and a continuation, or two continuations */
            buf[len++] = (char)(mt_rng_below(&r, 2) ? 0xE4 + mt_rng_below(&r, 8)
                                                    : 0x80 + mt_rng_below(&r, 64));
            buf[len++] = (char)(0x80 + mt_rng_below(&r, 64));
        }
        vb_add(v, buf, len, true);
    }
    while (v->n < n) { /* special tokens, as a checkpoint's added ones */
        snprintf(buf, sizeof buf, "<|special_%d|>", v->n);
        vb_add(v, buf, (uint32_t)strlen(buf), false);
    }
}

static void vb_free(vocab_bytes *v)
{
    for (int32_t i = 0; i < v->n; i++)
        free(v->b[i]);
    free(v->b);
    free(v->len);
    free(v->text);
}

/* ---- workloads --------------------------------------------------------------------- */

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":24},"
    "\"summary\":{\"type\":\"string\",\"maxLength\":200},"
    "\"age\":{\"type\":\"integer\"},"
    "\"species\":{\"enum\":[\"cat\",\"dog\",\"owl\",\"ferret\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":4},"
    "\"home\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":20},"
    "\"zip\":{\"type\":[\"string\",\"null\"],\"maxLength\":8},\"floors\":{\"type\":\"array\","
    "\"items\":{\"type\":\"number\"},\"minItems\":1,\"maxItems\":3}},\"required\":[\"city\"],"
    "\"additionalProperties\":false},\"vaccinated\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"summary\",\"species\",\"home\"],\"additionalProperties\":false}";

static const char *TOOL_PARAMS[2] = {
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":30},"
    "\"days\":{\"type\":\"integer\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\",\"days\"]}",
    "{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\",\"maxLength\":120},"
    "\"filters\":{\"type\":\"object\",\"properties\":{\"limit\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":10},"
    "\"maxItems\":3}},\"required\":[\"limit\"],\"additionalProperties\":false}},"
    "\"required\":[\"query\",\"filters\"]}"};

/* This thread's cpu time: on a shared machine a call's wall time includes
 * the moments another process ran; its cpu time does not. */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct result {
    double cold_mean_us, warm_mean_us, warm_p99_us, warm_wall_us;
    int64_t tokens;
    double tokens_per_answer;
    uint64_t computed, cached;
} result;

/* Generates `outputs` answers under the grammar, token by token, timing
 * serve_logits_apply (mask through the cache, applied to a logits row). */
static result run_workload(serve_vocab *sv, int32_t logits_n, const serve_grammar_opts *go,
                           const char *key, int outputs, uint64_t seed)
{
    serve_constraints *c;
    mt_err err = MT_ERR_INIT;
    if (serve_constraints_create(&c, &err))
        die("constraints", err.msg);
    int32_t stop = logits_n - 1; /* an end-of-text id (a special token) */
    serve_logits_opts lo = {.grammar = go, .key = key, .vocab = sv, .stops = &stop, .n_stops = 1,
                            .after = -1, .then_forbid = -1};
    float *logits = malloc((size_t)logits_n * sizeof *logits);
    int32_t *gen = malloc(sizeof(int32_t) * 8192);
    size_t cap = 1 << 20;
    double *warm = malloc(cap * sizeof *warm);
    size_t n_warm = 0;
    double cold_sum = 0, warm_sum = 0, wall_sum = 0;
    int64_t cold_n = 0, tokens = 0;
    result res = {0};
    mt_rng r;
    mt_rng_seed(&r, seed);
    for (int o = 0; o < outputs; o++) {
        serve_logits *l;
        serve_error se = SERVE_ERROR_INIT;
        if (serve_logits_create(c, &lo, &l, &se))
            die("grammar", se.err.msg);
        int64_t n = 0;
        for (;;) {
            for (int32_t i = 0; i < logits_n; i++) /* a random model's row */
                logits[i] = (float)(mt_rng_u64(&r) >> 40) * (1.0f / 16777216.0f) * 8.0f;
            uint64_t w0 = mt_now_ns(), t0 = cpu_ns();
            if (serve_logits_apply(l, gen, n, NULL, 0, logits, logits_n, &err))
                die("apply", err.msg);
            double us = (double)(cpu_ns() - t0) * 1e-3;
            if (o > 0)
                wall_sum += (double)(mt_now_ns() - w0) * 1e-3;
            if (o == 0) {
                cold_sum += us;
                cold_n++;
            } else {
                warm_sum += us;
                if (n_warm < cap)
                    warm[n_warm++] = us;
            }
            int32_t best = 0;
            for (int32_t i = 1; i < logits_n; i++)
                if (logits[i] > logits[best])
                    best = i;
            if (best == stop || n == 8191)
                break;
            gen[n++] = best;
        }
        tokens += n;
        uint64_t comp, cached;
        serve_logits_stats(l, &comp, &cached);
        res.computed += comp;
        res.cached += cached;
        serve_logits_destroy(l);
    }
    qsort(warm, n_warm, sizeof *warm, cmp_double);
    res.cold_mean_us = cold_n ? cold_sum / (double)cold_n : 0;
    res.warm_mean_us = n_warm ? warm_sum / (double)n_warm : 0;
    res.warm_p99_us = n_warm ? warm[(size_t)((double)n_warm * 0.99)] : 0;
    res.warm_wall_us = n_warm ? wall_sum / (double)n_warm : 0;
    res.tokens = tokens;
    res.tokens_per_answer = (double)tokens / outputs;
    free(warm);
    free(gen);
    free(logits);
    serve_constraints_destroy(c);
    return res;
}

static void run_vocab(const char *label, serve_vocab *sv, int32_t logits_n, double step_ms,
                      const char *step_what, int outputs, uint64_t seed)
{
    cJSON *schema = cJSON_Parse(SCHEMA), *p0 = cJSON_Parse(TOOL_PARAMS[0]),
          *p1 = cJSON_Parse(TOOL_PARAMS[1]);
    serve_grammar_opts json = {.schema = schema, .param = "schema"};
    serve_grammar_tool tools[2] = {{"get_weather", p0}, {"search", p1}};
    serve_grammar_opts calls = {.tools = tools, .n_tools = 2, .parallel = false};
    struct {
        const char *name;
        const serve_grammar_opts *go;
    } w[2] = {{"json_schema", &json}, {"tool_call", &calls}};
    for (int k = 0; k < 2; k++) {
        result r = run_workload(sv, logits_n, w[k].go, w[k].name, outputs, seed + (uint64_t)k);
        uint64_t looked = r.cached + r.computed ? r.cached + r.computed : 1;
        printf("%-8s %-11s %5.1f tok/answer | mask+apply per token, cpu: cold %6.1f us, warm "
               "%6.1f us (p99 %6.1f; wall %6.1f) | %4.1f%% from cache | step %7.3f ms (%s) | "
               "warm %.2f%%, p99 %.2f%% of a step\n",
               label, w[k].name, r.tokens_per_answer, r.cold_mean_us, r.warm_mean_us,
               r.warm_p99_us, r.warm_wall_us, 100.0 * (double)r.cached / (double)looked, step_ms,
               step_what, 100.0 * r.warm_mean_us * 1e-3 / step_ms,
               100.0 * r.warm_p99_us * 1e-3 / step_ms);
    }
    cJSON_Delete(schema);
    cJSON_Delete(p0);
    cJSON_Delete(p1);
}

/* ---- step times ---------------------------------------------------------------------- */

/* The tiny model's decode step on this cpu: the median of 64 one-token steps
 * after a 32-token prompt. Also returns its tokenizer's vocabulary index. */
static double tiny_step_ms(serve_vocab **sv, int32_t *vocab)
{
    char dir[] = "/tmp/mt_bench_grammar_XXXXXX";
    if (!mkdtemp(dir))
        die("mkdtemp", "failed");
    mt_err err = MT_ERR_INIT;
    if (model_tiny_write(dir, 1, &err))
        die("tiny model", err.msg);
    FILE *quiet = fopen("/dev/null", "w");
    model_runtime_opts o = {.model_dir = dir, .device = "cpu", .log = quiet};
    model_runtime *rt;
    if (model_runtime_open(&o, &rt, &err))
        die("runtime", err.msg);
    *vocab = model_runtime_vocab(rt);
    if (serve_vocab_from_tokenizer(model_runtime_tokenizer(rt), *vocab, sv, &err))
        die("vocabulary index", err.msg);
    float *lg = malloc(sizeof(float) * (size_t)*vocab);
    int32_t prompt[32];
    for (int i = 0; i < 32; i++)
        prompt[i] = 20 + i * 7;
    int seq;
    if (model_seq_create(rt, &seq, &err))
        die("sequence", err.msg);
    model_step_item it = {seq, prompt, 32, lg, NULL, 32};
    if (model_step(rt, &it, 1, &err))
        die("prefill", err.msg);
    double t[64];
    int32_t tok = 40;
    for (int i = 0; i < 64; i++) {
        it = (model_step_item){seq, &tok, 1, lg, NULL, 0};
        uint64_t t0 = mt_now_ns();
        if (model_step(rt, &it, 1, &err))
            die("decode", err.msg);
        t[i] = (double)(mt_now_ns() - t0) * 1e-6;
    }
    qsort(t, 64, sizeof *t, cmp_double);
    free(lg);
    model_runtime_close(rt);
    fclose(quiet);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_grammar: could not remove %s\n", dir);
    return t[32];
}

/* GLM-5.2's batch-1 decode step on one rank of 8 (tensor-parallel attention
 * and expert-parallel experts), bounded below by its bytes at an H200's
 * bandwidth; *gb gets the bytes. */
static double glm_step_bound_ms(const char *config, double *gb)
{
    model_config *c;
    mt_err err = MT_ERR_INIT;
    if (model_config_load(config, &c, &err))
        die(config, err.msg);
    mem_plan_opts o = {.ranks = 8, .tp = 8};
    mem_plan p;
    if (mem_plan_compute(c, &o, &p, &err))
        die("mem_plan", err.msg);
    double bytes = p.part[MEM_ATTENTION] + p.part[MEM_INDEXER] + p.part[MEM_DENSE_MLP] +
                   p.part[MEM_ROUTER] + p.part[MEM_SHARED_EXPERTS] +
                   p.part[MEM_EMBED_HEAD] / 2 +
                   p.part[MEM_ROUTED_EXPERTS] * (double)c->num_experts_per_tok /
                       (double)c->n_routed_experts;
    model_config_destroy(c);
    *gb = bytes * 1e-9;
    return bytes / H200_BYTES_PER_S * 1e3;
}

int main(int argc, char **argv)
{
    /* Run from the source tree or a build folder inside it. */
    const char *config = access("tests/fixtures/glm5.2-mxfp4-config.json", R_OK) == 0
                             ? "tests/fixtures/glm5.2-mxfp4-config.json"
                             : "../tests/fixtures/glm5.2-mxfp4-config.json";
    int outputs = 20;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            config = argv[++i];
        else if (!strcmp(argv[i], "--outputs") && i + 1 < argc)
            outputs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_grammar [--config FILE] [--outputs N] [--seed S]\n");
            return 2;
        }
    }
    if (outputs < 2)
        outputs = 2;
    serve_vocab *tiny;
    int32_t tiny_n;
    double tiny_ms = tiny_step_ms(&tiny, &tiny_n);
    printf("bench_grammar: %d answers per workload; mask time per token = serve_logits_apply "
           "(mask through the cache + applied to the logits row)\n",
           outputs);
    run_vocab("tiny", tiny, tiny_n, tiny_ms, "tiny decode, this cpu, measured", outputs, seed);
    serve_vocab_destroy(tiny);

    vocab_bytes vb = {0};
    synthetic(&vb, GLM_LOGITS, seed);
    serve_vocab *big;
    mt_err err = MT_ERR_INIT;
    uint64_t t0 = mt_now_ns();
    if (serve_vocab_create(vb.n, (const char *const *)vb.b, vb.len, vb.text, &big, &err))
        die("vocabulary index", err.msg);
    double build_ms = (double)(mt_now_ns() - t0) * 1e-6;
    vb_free(&vb);
    double gb;
    double glm_ms = glm_step_bound_ms(config, &gb);
    printf("synthetic %d-token vocabulary indexed in %.0f ms (once per server); GLM-5.2 decode "
           "step >= %.2f ms (%.1f GB per rank of 8, tp 8, at 4.8 TB/s)\n",
           GLM_LOGITS, build_ms, glm_ms, gb);
    run_vocab("glm-size", big, GLM_LOGITS, glm_ms, "GLM-5.2 bound, H200", outputs, seed);
    serve_vocab_destroy(big);
    return 0;
}
