/* tp_check.c: run under `mpirun -np N` by test_ep. Every rank opens the
 * checkpoint tensor-parallel over the "mpi" communicator (its share of the
 * attention heads, o_proj rows and vocabulary, and of the routed experts),
 * and the driving rank(s) also open it alone (the reference). A script of
 * sequence operations and steps runs on both: two prefills in one step,
 * decodes, MTP draft steps (over the prompts, on their own output, after
 * a truncation of an MTP cache), a fork mid-sequence, a truncation, a
 * refused step (a token past the vocabulary), a free and a new sequence.
 * Every logit row, draft logits included, must be bitwise the reference's
 * (batch-invariant kernels).
 *
 * Usage: mt_tp_check MODEL_DIR SEED spmd|lead [GROUP]
 *   GROUP: ranks per tensor-parallel group (tp_size; default every rank);
 *         the other groups mirror the first's steps;
 *   spmd: no leader; every rank runs the same script and checks it;
 *   lead: rank 0 runs the script (comm_lead: its sequence operations and
 *         steps are replayed by the others, which sit in
 *         model_runtime_follow until rank 0 closes its runtime).
 * Prints "tp_check rank R/N ok" and exits 0, or names the first difference
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

static int group_size; /* tp_size: 0, every rank */

static model_runtime *open_rt(const char *dir, mt_comm *c, bool lead, FILE *quiet)
{
    model_runtime_opts o = {.model_dir = dir, .device = "cpu", .kv_pages = 64,
                            .max_batch_tokens = 96, .batch_invariant = true, .log = quiet,
                            .comm = c, .comm_lead = lead, .tp = c != NULL,
                            .speculative_steps = 2, .tp_size = c ? group_size : 0};
    return check_open(&o, "open (tensor-parallel)", "open (reference)");
}

/* The script on both runtimes; sequence ids are each runtime's own. */
typedef struct pair {
    model_runtime *tp, *ref;
    int32_t V;
    float *lg_tp, *lg_ref;
    mt_rng r;
    int steps, mtp_steps;
} pair;

static int create(pair *p)
{
    int a = -1, b = -1;
    mt_err err = MT_ERR_INIT;
    if (model_seq_create(p->tp, &a, &err) != MT_OK || model_seq_create(p->ref, &b, &err) != MT_OK)
        die("create", err.msg);
    if (a != b)
        die("create", "the two runtimes picked different slots");
    return a;
}

/* One step of n items (sequence, token count) with fresh random tokens;
 * every row's logits compared bitwise. */
static void step(pair *p, const int *seq, const int *nt, int n)
{
    model_step_item it_tp[4], it_ref[4];
    int32_t tok[96];
    int used = 0;
    for (int i = 0; i < n; i++) {
        for (int t = 0; t < nt[i]; t++)
            tok[used + t] = (int32_t)mt_rng_below(&p->r, (uint64_t)p->V);
        it_tp[i] = (model_step_item){.seq = seq[i], .tokens = tok + used, .n_tokens = nt[i],
                                     .n_prompt = nt[i] > 1 ? nt[i] : 0,
                                     .all_logits = p->lg_tp + (size_t)used * (size_t)p->V};
        it_ref[i] = it_tp[i];
        it_ref[i].all_logits = p->lg_ref + (size_t)used * (size_t)p->V;
        used += nt[i];
    }
    mt_err err = MT_ERR_INIT;
    if (model_step(p->tp, it_tp, n, &err) != MT_OK)
        die("tensor-parallel step", err.msg);
    if (model_step(p->ref, it_ref, n, &err) != MT_OK)
        die("reference step", err.msg);
    for (size_t i = 0; i < (size_t)used * (size_t)p->V; i++)
        if (memcmp(&p->lg_tp[i], &p->lg_ref[i], sizeof(float))) {
            char msg[160];
            snprintf(msg, sizeof msg, "step %d: logit %zu of row %zu is %.9g, alone %.9g",
                     p->steps, i % (size_t)p->V, i / (size_t)p->V, p->lg_tp[i], p->lg_ref[i]);
            die("logits differ", msg);
        }
    p->steps++;
}

/* One MTP draft step of n items (sequence, token count, hidden row of the
 * step before) with fresh random tokens; every item's draft logits
 * compared bitwise. */
static void mtp_step(pair *p, const int *seq, const int *nt, const int *row, int n)
{
    model_mtp_item it_tp[4], it_ref[4];
    int32_t tok[96];
    int used = 0;
    for (int i = 0; i < n; i++) {
        for (int t = 0; t < nt[i]; t++)
            tok[used + t] = (int32_t)mt_rng_below(&p->r, (uint64_t)p->V);
        it_tp[i] = (model_mtp_item){.seq = seq[i], .tokens = tok + used, .n_tokens = nt[i],
                                    .hidden_row = row[i],
                                    .logits = p->lg_tp + (size_t)i * (size_t)p->V};
        it_ref[i] = it_tp[i];
        it_ref[i].logits = p->lg_ref + (size_t)i * (size_t)p->V;
        used += nt[i];
    }
    mt_err err = MT_ERR_INIT;
    if (model_mtp_step(p->tp, it_tp, n, &err) != MT_OK)
        die("tensor-parallel MTP step", err.msg);
    if (model_mtp_step(p->ref, it_ref, n, &err) != MT_OK)
        die("reference MTP step", err.msg);
    for (size_t i = 0; i < (size_t)n * (size_t)p->V; i++)
        if (memcmp(&p->lg_tp[i], &p->lg_ref[i], sizeof(float))) {
            char msg[160];
            snprintf(msg, sizeof msg, "MTP step after step %d: logit %zu of item %zu is %.9g, "
                     "alone %.9g", p->steps, i % (size_t)p->V, i / (size_t)p->V, p->lg_tp[i],
                     p->lg_ref[i]);
            die("draft logits differ", msg);
        }
    p->mtp_steps++;
}

static void script(pair *p)
{
    mt_err err = MT_ERR_INIT;
    int a = create(p), b = create(p);
    int la = 2 + (int)mt_rng_below(&p->r, 40), lb = 1 + (int)mt_rng_below(&p->r, 20);
    step(p, (int[]){a, b}, (int[]){la, lb}, 2);
    /* The MTP layer over both prompts, then a draft step on its own rows. */
    mtp_step(p, (int[]){a, b}, (int[]){la, lb}, (int[]){0, la}, 2);
    mtp_step(p, (int[]){b, a}, (int[]){1, 1}, (int[]){la + lb - 1, la - 1}, 2);
    step(p, (int[]){a, b}, (int[]){1, 1}, 2);
    /* a's drafts rejected: its MTP cache cut back, then caught up. */
    int64_t ma = model_mtp_len(p->tp, a) - 1;
    if (model_mtp_truncate(p->tp, a, ma, &err) != MT_OK ||
        model_mtp_truncate(p->ref, a, ma, &err) != MT_OK)
        die("MTP truncate", err.msg);
    mtp_step(p, (int[]){a}, (int[]){1}, (int[]){0}, 1);
    /* A fork sharing all but the last pages of a, then two tokens on it. */
    int c, c2;
    int64_t at = model_seq_len(p->tp, a) - 1;
    if (model_seq_fork(p->tp, a, at, &c, &err) != MT_OK ||
        model_seq_fork(p->ref, a, at, &c2, &err) != MT_OK || c != c2)
        die("fork", err.msg[0] ? err.msg : "different slots");
    step(p, (int[]){c, a}, (int[]){2, 1}, 2);
    /* b loses its last token, then runs one. */
    int64_t lb_now = model_seq_len(p->tp, b);
    if (model_seq_truncate(p->tp, b, lb_now - 1, &err) != MT_OK ||
        model_seq_truncate(p->ref, b, lb_now - 1, &err) != MT_OK)
        die("truncate", err.msg);
    step(p, (int[]){b}, (int[]){1}, 1);
    /* A refused step: nothing changes. */
    int32_t bad = p->V + 5;
    model_step_item it = {.seq = b, .tokens = &bad, .n_tokens = 1};
    if (model_step(p->tp, &it, 1, &err) != MT_E_INVALID)
        die("bad item", "a token id past the vocabulary was not refused");
    model_seq_free(p->tp, a);
    model_seq_free(p->ref, a);
    int d = create(p);
    step(p, (int[]){d, c, b}, (int[]){5, 1, 1}, 3);
}

int main(int argc, char **argv)
{
    check_name = "tp_check";
    if (argc < 4 || (strcmp(argv[3], "spmd") && strcmp(argv[3], "lead"))) {
        fprintf(stderr, "usage: mt_tp_check MODEL_DIR SEED spmd|lead [GROUP]\n");
        return 2;
    }
    group_size = argc > 4 ? atoi(argv[4]) : 0;
    seed = strtoull(argv[2], NULL, 10);
    bool lead = !strcmp(argv[3], "lead");
    mt_comm *c = check_comm();
    mt_err err = MT_ERR_INIT;
    FILE *quiet = fopen("/dev/null", "w");
    pair p = {.tp = open_rt(argv[1], c, lead, quiet)};
    if (lead && rank != 0) {
        int64_t steps = 0;
        if (model_runtime_follow(p.tp, &steps, &err) != MT_OK)
            die("follow", err.msg);
        printf("tp_check rank %d/%d ok: followed %" PRId64 " steps\n", rank, size, steps);
    } else {
        p.ref = open_rt(argv[1], NULL, false, quiet);
        p.V = model_runtime_vocab(p.tp);
        p.lg_tp = malloc(sizeof(float) * (size_t)p.V * 96);
        p.lg_ref = malloc(sizeof(float) * (size_t)p.V * 96);
        mt_rng_seed(&p.r, seed); /* the same script on every rank */
        script(&p);
        printf("tp_check rank %d/%d ok: %d steps and %d MTP steps bitwise\n", rank, size,
               p.steps, p.mtp_steps);
    }
    model_runtime_close(p.tp); /* the leader's tells the followers to stop */
    model_runtime_close(p.ref);
    free(p.lg_tp);
    free(p.lg_ref);
    fclose(quiet);
    mt_comm_close(c);
    return 0;
}
