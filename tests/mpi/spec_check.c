/* spec_check.c: run under `mpirun -np N` by test_xchg. Speculative
 * decoding with the checkpoint's MTP layer across ranks on emu devices:
 * rank 0 leads (comm_lead) a runtime over the "mpi" communicator,
 * expert-parallel ("dp": with data-parallel attention, the two prompts'
 * sequences on ranks 0 and 1, drafting where they live; "dpG": the same
 * over tensor-parallel groups of G ranks), or
 * tensor-parallel too with "tp" ("tpG": in groups of G
 * ranks, the other groups mirroring the first), with K draft steps,
 * and runs the same generations on a one-device runtime (batch-invariant
 * kernels), on each checkpoint named: two prompts longer than the DSA
 * indexer's top-k (so the main and MTP layers' decode attends sparsely),
 * one decoded greedily, one sampled (temperature 1: speculative sampling,
 * where a draft model unlike the main one has drafts partly rejected and
 * its MTP cache cut back) in prefill chunks of 7, both kept alive. Every logit row
 * the decoding reads (the prompt's last, every verify row, every draft row)
 * must be bitwise the one device's, the tokens the same, and the rounds,
 * drafts and accepted drafts equal. The other ranks follow; they must have
 * followed at least one MTP step per draft round. Prints "spec_check rank
 * R/N ok" and exits 0, or names the first difference and exits 1.
 * Usage: mt_spec_check SEED ep|tp|tpG K MODEL_DIR... */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/rng.h"
#include "model/runtime.h"
#include "model/spec.h"
#include "mpi_check.h"

static int group_size; /* tp_size: 0, every rank */
static bool dp;        /* data-parallel attention: the prompts' sequences on ranks 0 and 1 */

static model_runtime *open_rt(const char *dir, mt_comm *c, bool tp, int k, FILE *quiet)
{
    model_runtime_opts o = {.model_dir = dir, .device = "emu", .kv_pages = 64,
                            .max_batch_tokens = 96, .batch_invariant = true, .log = quiet,
                            .comm = c, .comm_lead = c != NULL, .tp = tp && c,
                            .tp_size = tp && c ? group_size : 0, .speculative_steps = k,
                            .dp = dp && c};
    if (dp && group_size > 1 && c) { /* "dpG": groups of G with their own sequences */
        o.tp = true;
        o.tp_size = group_size;
    }
    return check_open(&o, "open (across ranks)", "open (one device)");
}

/* Every row the decoding reads, in order (a logits processor that changes
 * nothing). */
typedef struct rows {
    float *v;
    size_t n, cap;
    int32_t V;
} rows;

static mt_status record(void *ctx, const int32_t *gen, int64_t n_gen, const int32_t *extra,
                        int n_extra, float *logits, mt_err *err)
{
    (void)gen, (void)n_gen, (void)extra, (void)n_extra, (void)err;
    rows *r = ctx;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        if (!(r->v = realloc(r->v, sizeof(float) * r->cap * (size_t)r->V)))
            die("memory", "recorded rows");
    }
    memcpy(r->v + r->n++ * (size_t)r->V, logits, sizeof(float) * (size_t)r->V);
    return MT_OK;
}

#define GEN 20

/* Rank 0: the two prompts on both runtimes; returns the draft rounds. */
static int32_t lead(model_runtime *many, model_runtime *one, int k, const char *dir)
{
    mt_err err = MT_ERR_INIT;
    int32_t V = model_runtime_vocab(one), rounds = 0;
    mt_rng r;
    mt_rng_seed(&r, seed);
    /* index_topk is 16 on the tiny model: these prompts go past it. */
    int len[2] = {20 + (int)mt_rng_below(&r, 12), 17 + (int)mt_rng_below(&r, 8)};
    int32_t tok[2][32];
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < len[p]; t++)
            tok[p][t] = (int32_t)mt_rng_below(&r, (uint64_t)V);
    model_runtime *rts[2] = {many, one};
    rows rec[2] = {{.V = V}, {.V = V}};
    int64_t totals[2][3];
    for (int p = 0; p < 2; p++) {
        int32_t out[2][GEN];
        int produced[2];
        model_spec_seq st[2];
        for (int m = 0; m < 2; m++) {
            int seq;
            if (model_seq_create(rts[m], &seq, &err) != MT_OK)
                die("sequence", err.msg);
            if (dp && m == 0 && model_seq_rank(rts[m], seq) != p)
                die("placement", "the prompts' sequences are not on ranks 0 and 1");
            mt_rng draws;
            mt_rng_seed(&draws, seed + (uint64_t)p);
            model_spec_gen_opts go = {.k = k, .max_tokens = GEN, .rng = &draws,
                                      .sampler = {.temperature = p ? 1.0f : 0.0f, .top_p = 1.0f},
                                      .prefill_chunk = p ? 7 : 0, .proc = {record, &rec[m]}};
            if (model_spec_generate(rts[m], seq, tok[p], len[p], &go, out[m], &produced[m],
                                    &st[m], &err) != MT_OK)
                die(m ? "generate (one device)" : "generate (across ranks)", err.msg);
        }
        char msg[200];
        if (produced[0] != produced[1] ||
            memcmp(out[0], out[1], sizeof(int32_t) * (size_t)produced[0])) {
            snprintf(msg, sizeof msg, "prompt %d: %d tokens across ranks, %d on one device, or "
                     "different ids", p, produced[0], produced[1]);
            die("tokens differ", msg);
        }
        if (st[0].rounds != st[1].rounds || st[0].drafted != st[1].drafted ||
            st[0].accepted != st[1].accepted) {
            snprintf(msg, sizeof msg, "prompt %d: %" PRId64 "/%" PRId64 " drafts accepted in %"
                     PRId64 " rounds across ranks, %" PRId64 "/%" PRId64 " in %" PRId64 " on one "
                     "device", p, st[0].accepted, st[0].drafted, st[0].rounds, st[1].accepted,
                     st[1].drafted, st[1].rounds);
            die("acceptance differs", msg);
        }
        totals[p][0] = st[0].rounds, totals[p][1] = st[0].drafted, totals[p][2] = st[0].accepted;
        rounds += (int32_t)st[0].rounds;
    }
    if (rec[0].n != rec[1].n) {
        char msg[120];
        snprintf(msg, sizeof msg, "%zu rows read across ranks, %zu on one device", rec[0].n,
                 rec[1].n);
        die("rows differ", msg);
    }
    for (size_t i = 0; i < rec[0].n * (size_t)V; i++)
        if (memcmp(&rec[0].v[i], &rec[1].v[i], sizeof(float))) {
            char msg[160];
            snprintf(msg, sizeof msg, "logit %zu of row %zu read is %.9g, one device %.9g",
                     i % (size_t)V, i / (size_t)V, rec[0].v[i], rec[1].v[i]);
            die("logits differ", msg);
        }
    printf("spec_check %s: K=%d, prompts %d and %d tokens; greedy %" PRId64 "/%" PRId64
           " drafts accepted in %" PRId64 " rounds, sampled %" PRId64 "/%" PRId64 " in %" PRId64
           "; %zu logit rows bitwise one device's\n", dir, k, len[0], len[1], totals[0][2],
           totals[0][1], totals[0][0], totals[1][2], totals[1][1], totals[1][0], rec[0].n);
    free(rec[0].v);
    free(rec[1].v);
    return rounds;
}

int main(int argc, char **argv)
{
    check_name = "spec_check";
    if (argc < 5 || (strcmp(argv[2], "ep") && strncmp(argv[2], "dp", 2) &&
                     strncmp(argv[2], "tp", 2)) || atoi(argv[3]) < 1) {
        fprintf(stderr, "usage: mt_spec_check SEED ep|dp|dpG|tp|tpG K MODEL_DIR...\n");
        return 2;
    }
    seed = strtoull(argv[1], NULL, 10);
    bool tp = !strncmp(argv[2], "tp", 2);
    dp = !strncmp(argv[2], "dp", 2);
    group_size = tp || dp ? atoi(argv[2] + 2) : 0;
    int k = atoi(argv[3]);
    mt_comm *c = check_comm();
    mt_err err = MT_ERR_INIT;
    FILE *quiet = fopen("/dev/null", "w");
    int64_t steps = 0;
    int32_t rounds = 0;
    for (int d = 4; d < argc; d++) {
        model_runtime *many = open_rt(argv[d], c, tp, k, quiet);
        int32_t r = 0;
        if (rank != 0) {
            int64_t s = 0;
            if (model_runtime_follow(many, &s, &err) != MT_OK)
                die("follow", err.msg);
            steps += s;
            model_runtime_close(many);
        } else {
            model_runtime *one = open_rt(argv[d], NULL, false, k, quiet);
            r = lead(many, one, k, argv[d]);
            model_runtime_close(many); /* tells the followers to stop */
            model_runtime_close(one);
        }
        if (mt_comm_broadcast(c, &r, 1, MT_COMM_I32, 0, &err) != MT_OK)
            die("broadcast", err.msg);
        rounds += r;
    }
    /* A follower ran at least a verify step and an MTP step per round. */
    if (rank != 0 && steps < 2 * (int64_t)rounds) {
        char msg[120];
        snprintf(msg, sizeof msg, "%" PRId64 " steps followed for %" PRId32 " rounds", steps,
                 rounds);
        die("lockstep", msg);
    }
    if (rank)
        printf("spec_check rank %d/%d ok: %" PRId32 " draft rounds, %" PRId64 " steps followed "
               "(main and MTP)\n", rank, size, rounds, steps);
    else
        printf("spec_check rank 0/%d ok: %" PRId32 " draft rounds\n", size, rounds);
    fclose(quiet);
    mt_comm_close(c);
    return 0;
}
