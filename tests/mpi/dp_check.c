/* dp_check.c: run under `mpirun -np N` by test_ep. Data-parallel
 * attention under one leader: every rank opens the checkpoint with
 * comm_lead and dp over the "mpi" communicator (its own sequences' KV, its
 * share of the routed experts); ranks other than 0 follow. Rank 0 also
 * opens it alone (the reference) and runs a script on both: a first step
 * on rank 0 alone, sequences placed by the runtime (most free pages) and
 * on named ranks, prefills of
 * several ranks' sequences in one step, decodes, steps where only rank 0
 * or only the other ranks have work, a fork and a truncation of another
 * rank's sequence, a refused step (a token past the vocabulary), a step
 * refused because one rank's KV cache is full (the DP runtime has fewer
 * pages than the reference), frees and slot reuse. Every logit row must be
 * bitwise the reference's (batch-invariant kernels), and every rank must
 * have held sequences. The embedding and lm_head are vocabulary-parallel
 * over every rank of the job (plain ranks or groups): one step runs more
 * tokens and logits rows over all ranks than one rank's batch (its
 * exchanges run in windows), and every rank must have uploaded the
 * exchange's id lists.
 *
 * Usage: mt_dp_check MODEL_DIR SEED [GROUP]
 *   GROUP: tensor-parallel groups of GROUP ranks, each group holding and
 *   running its own sequences (every rank of it following rank 0's
 *   journal for the group).
 * Prints "dp_check rank R/N ok" and exits 0, or names the first difference
 * and exits 1. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/rng.h"
#include "model/runtime.h"
#include "mpi_check.h"

enum { PAGES = 24, MAX_T = 96 };

static int group = 1; /* ranks per tensor-parallel group (1: none) */
static int units;     /* where sequences are placed: ranks, or groups */

static model_runtime *open_rt(const char *dir, mt_comm *c, FILE *quiet)
{
    model_runtime_opts o = {.model_dir = dir, .device = "emu", .kv_pages = c ? PAGES : 256,
                            .kv_page_size = 16, .max_batch_tokens = MAX_T,
                            .batch_invariant = true, .log = quiet, .comm = c,
                            .comm_lead = c != NULL, .dp = c != NULL,
                            .tp = c && group > 1, .tp_size = c && group > 1 ? group : 0};
    return check_open(&o, "open (data-parallel)", "open (reference)");
}

typedef struct seqp {
    int dp, ref;
} seqp;

typedef struct pair {
    model_runtime *dp, *ref;
    int32_t V;
    float *lg_dp, *lg_ref;
    mt_rng r;
    int steps;
    bool seen[64]; /* ranks that held a sequence */
} pair;

static seqp create_on(pair *p, int rank)
{
    seqp s;
    mt_err err = MT_ERR_INIT;
    mt_status st = rank < 0 ? model_seq_create(p->dp, &s.dp, &err)
                            : model_seq_create_on(p->dp, rank, &s.dp, &err);
    if (st != MT_OK || model_seq_create(p->ref, &s.ref, &err) != MT_OK)
        die("create", err.msg);
    int r = model_seq_rank(p->dp, s.dp);
    if (r < 0 || r >= units || (rank >= 0 && r != rank))
        die("create", "the sequence is not on the rank asked for");
    p->seen[r] = true;
    return s;
}

/* One step of n items (sequence, token count) with fresh random tokens;
 * every row's logits (all_logits) or only the last (decode) compared
 * bitwise. */
static void step(pair *p, const seqp *s, const int *nt, int n, bool all)
{
    model_step_item it_dp[8], it_ref[8];
    int32_t tok[MAX_T * 4];
    int used = 0;
    for (int i = 0; i < n; i++) {
        for (int t = 0; t < nt[i]; t++)
            tok[used + t] = (int32_t)mt_rng_below(&p->r, (uint64_t)p->V);
        size_t at = (size_t)(all ? used : i) * (size_t)p->V;
        it_dp[i] = (model_step_item){.seq = s[i].dp, .tokens = tok + used, .n_tokens = nt[i],
                                     .n_prompt = nt[i] > 1 ? nt[i] : 0};
        it_ref[i] = it_dp[i];
        it_ref[i].seq = s[i].ref;
        if (all) {
            it_dp[i].all_logits = p->lg_dp + at;
            it_ref[i].all_logits = p->lg_ref + at;
        } else {
            it_dp[i].logits = p->lg_dp + at;
            it_ref[i].logits = p->lg_ref + at;
        }
        used += nt[i];
    }
    size_t rows = all ? (size_t)used : (size_t)n;
    for (size_t i = 0; i < rows * (size_t)p->V; i++)
        p->lg_dp[i] = -12345.0f; /* poisoned: every row must be written */
    mt_err err = MT_ERR_INIT;
    if (model_step(p->dp, it_dp, n, &err) != MT_OK)
        die("data-parallel step", err.msg);
    /* More tokens than the reference's batch: an item at a time (a row's
     * logits do not depend on its batch). */
    for (int i = 0; i < n; i += used > MAX_T ? 1 : n)
        if (model_step(p->ref, it_ref + i, used > MAX_T ? 1 : n, &err) != MT_OK)
            die("reference step", err.msg);
    for (size_t i = 0; i < rows * (size_t)p->V; i++)
        if (memcmp(&p->lg_dp[i], &p->lg_ref[i], sizeof(float))) {
            char msg[200];
            snprintf(msg, sizeof msg, "step %d: logit %zu of row %zu is %.9g, alone %.9g",
                     p->steps, i % (size_t)p->V, i / (size_t)p->V, p->lg_dp[i], p->lg_ref[i]);
            die("logits differ", msg);
        }
    p->steps++;
}

static void same_len(pair *p, seqp s)
{
    if (model_seq_len(p->dp, s.dp) != model_seq_len(p->ref, s.ref))
        die("length", "a sequence's length differs from the reference's");
}

static void script(pair *p)
{
    mt_err err = MT_ERR_INIT;
    int last = units - 1;
    /* A first step with rank 0's sequence alone: nothing journaled yet. */
    seqp z = create_on(p, 0);
    step(p, &z, (int[]){3}, 1, true);
    /* Placed by the runtime: the most free pages, so not where z is. */
    seqp a = create_on(p, -1), b = create_on(p, -1), c = create_on(p, last);
    if (model_seq_rank(p->dp, a.dp) == 0 || model_seq_rank(p->dp, b.dp) == 0)
        die("placement", "a sequence went to the rank with the fewest free pages");
    int la = 2 + (int)mt_rng_below(&p->r, 30), lb = 1 + (int)mt_rng_below(&p->r, 20),
        lc = 3 + (int)mt_rng_below(&p->r, 30);
    step(p, (seqp[]){a, b, c}, (int[]){la, lb, lc}, 3, true);
    step(p, (seqp[]){c, a, b}, (int[]){1, 1, 1}, 3, false);
    step(p, (seqp[]){a}, (int[]){1}, 1, false);        /* only rank 0 */
    step(p, (seqp[]){b, c}, (int[]){2, 1}, 2, true);   /* only the others */
    /* More tokens and logits rows over the ranks than one rank's batch:
     * the vocabulary-parallel exchanges run in windows and chunks. */
    seqp wide[4] = {z};
    int wn[4] = {70};
    for (int r = 1; r < units && r < 4; r++) {
        wide[r] = create_on(p, r);
        wn[r] = 60;
    }
    step(p, wide, wn, units < 4 ? units : 4, true);
    /* A fork of another rank's sequence, mid-page: it stays on that rank. */
    int64_t at = model_seq_len(p->dp, c.dp) - 1;
    seqp f;
    if (model_seq_fork(p->dp, c.dp, at, &f.dp, &err) != MT_OK ||
        model_seq_fork(p->ref, c.ref, at, &f.ref, &err) != MT_OK)
        die("fork", err.msg);
    if (model_seq_rank(p->dp, f.dp) != last)
        die("fork", "a fork left its source's rank");
    step(p, (seqp[]){f, c, a}, (int[]){3, 1, 2}, 3, true);
    /* b loses its last two tokens, then runs one. */
    int64_t lb_now = model_seq_len(p->dp, b.dp);
    if (model_seq_truncate(p->dp, b.dp, lb_now - 2, &err) != MT_OK ||
        model_seq_truncate(p->ref, b.ref, lb_now - 2, &err) != MT_OK)
        die("truncate", err.msg);
    step(p, (seqp[]){b}, (int[]){1}, 1, false);
    /* Refused before anything is announced: nothing changes. */
    int32_t bad = p->V + 5;
    model_step_item it = {.seq = c.dp, .tokens = &bad, .n_tokens = 1};
    if (model_step(p->dp, &it, 1, &err) != MT_E_INVALID)
        die("bad item", "a token id past the vocabulary was not refused");
    /* A rank's KV cache full: the step is refused, naming the rank. */
    int32_t tok[64] = {0};
    int64_t free0 = model_kv_free_pages_on(p->dp, last);
    int fill[PAGES + 1], n_fill = 0;
    for (;;) {
        if (n_fill > PAGES)
            die("KV full", "a rank's cache never filled");
        if (model_seq_create_on(p->dp, last, &fill[n_fill], &err) != MT_OK)
            die("create", err.msg);
        model_step_item bi = {.seq = fill[n_fill++], .tokens = tok, .n_tokens = 64,
                              .n_prompt = 64};
        mt_status st = model_step(p->dp, &bi, 1, &err);
        if (st == MT_E_NOMEM) {
            char want[32];
            snprintf(want, sizeof want, "rank %d", last);
            if (!strstr(err.msg, want))
                die("KV full", err.msg);
            if (model_seq_len(p->dp, bi.seq) != 0)
                die("KV full", "a refused step changed its sequence");
            break;
        }
        if (st != MT_OK)
            die("filling a rank's KV cache", err.msg);
    }
    while (n_fill)
        model_seq_free(p->dp, fill[--n_fill]);
    if (model_kv_free_pages_on(p->dp, last) != free0)
        die("free", "freeing sequences did not return their pages");
    same_len(p, c);
    step(p, (seqp[]){c, f}, (int[]){1, 1}, 2, false);
    /* A freed slot reused; every rank busy in one step. */
    model_seq_free(p->dp, a.dp);
    model_seq_free(p->ref, a.ref);
    seqp s[8];
    int nt[8], n = 0;
    for (int r = 0; r < units && n < 7; r++) {
        s[n] = create_on(p, r);
        nt[n++] = 1 + (int)mt_rng_below(&p->r, 12);
    }
    s[n] = b;
    nt[n++] = 1;
    step(p, s, nt, n, true);
    for (int i = 0; i < n; i++)
        nt[i] = 1;
    step(p, s, nt, n, false);
    for (int r = 0; r < units; r++) {
        if (!p->seen[r])
            die("placement", "a rank never held a sequence");
        if (model_rank_tokens(p->dp, r) <= 0)
            die("per-rank load", "a rank's attention ran no tokens");
    }
}

/* Every rank took part in the vocabulary-parallel embedding, over plain
 * ranks and in groups (the vocabulary is split over the whole job): its
 * id lists went to its device. */
static void vocab_exchanged(const model_runtime *rt)
{
    model_copy_counts cc;
    model_runtime_copy_counts(rt, &cc);
    if (cc.index_calls == 0)
        die("vocabulary parallelism", "this rank uploaded no id lists");
}

int main(int argc, char **argv)
{
    check_name = "dp_check";
    if (argc < 3) {
        fprintf(stderr, "usage: mt_dp_check MODEL_DIR SEED [GROUP]\n");
        return 2;
    }
    group = argc > 3 ? atoi(argv[3]) : 1;
    seed = strtoull(argv[2], NULL, 10);
    mt_comm *c = check_comm();
    mt_err err = MT_ERR_INIT;
    FILE *quiet = fopen("/dev/null", "w");
    pair p = {.dp = open_rt(argv[1], c, quiet)};
    if (rank != 0) {
        int64_t steps = 0;
        if (model_runtime_follow(p.dp, &steps, &err) != MT_OK)
            die("follow", err.msg);
        vocab_exchanged(p.dp);
        printf("dp_check rank %d/%d ok: followed %" PRId64 " steps\n", rank, size, steps);
    } else {
        p.ref = open_rt(argv[1], NULL, quiet);
        p.V = model_runtime_vocab(p.dp);
        units = model_runtime_dp_ranks(p.dp);
        if (units != size / group)
            die("open", "the runtime places sequences on the wrong number of units");
        p.lg_dp = malloc(sizeof(float) * (size_t)p.V * MAX_T * 4);
        p.lg_ref = malloc(sizeof(float) * (size_t)p.V * MAX_T * 4);
        mt_rng_seed(&p.r, seed);
        script(&p);
        vocab_exchanged(p.dp);
        printf("dp_check rank %d/%d ok: %d steps bitwise; token rows per %s:", rank, size,
               p.steps, group > 1 ? "group" : "rank");
        for (int r = 0; r < units; r++)
            printf(" %" PRId64, model_rank_tokens(p.dp, r));
        printf("\n");
    }
    model_runtime_close(p.dp); /* the leader's tells the followers to stop */
    model_runtime_close(p.ref);
    free(p.lg_dp);
    free(p.lg_ref);
    fclose(quiet);
    mt_comm_close(c);
    return 0;
}
