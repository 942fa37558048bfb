/* ep_check.c: run under `mpirun -np N` by test_ep. Every rank opens the
 * checkpoint twice: once expert-parallel over the "mpi" communicator (its
 * 1/N of the routed experts, each rank driving its own steps: data-parallel
 * attention) and once alone with every expert (the reference). Over a few
 * lockstep steps each rank runs its own sequences (prefills of different
 * lengths, two items in a step, decodes) or nothing at all, and one rank
 * sends a bad item once (refused, but it still joins the step's
 * exchanges). After each step every rank runs an MTP draft step over its
 * step's items (none: it only serves its share of the MTP layer's
 * experts; the bad one refused, joining all the same). Every logit row,
 * draft logits included, must be bitwise the reference's (batch-invariant
 * kernels). The embedding and lm_head are vocabulary-parallel over the
 * ranks with no leader's message: every rank must have shared its steps
 * and taken part in the embedding's exchange. Prints "ep_check rank R/N
 * ok" and exits 0, or
 * names the first difference and exits 1.
 * Usage: mt_ep_check MODEL_DIR SEED [die]  ("die": rank 1 exits with status
 * 3 before step 2; the others block in that step's exchanges: mpirun must
 * end the job, not hang). */
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

static model_runtime *open_rt(const char *dir, mt_comm *c, FILE *quiet)
{
    model_runtime_opts o = {.model_dir = dir, .device = "cpu", .kv_pages = 64,
                            .max_batch_tokens = 64, .batch_invariant = true, .log = quiet,
                            .comm = c, .speculative_steps = 2};
    return check_open(&o, "open (expert-parallel)", "open (reference)");
}

#define MAXSEQ 2
#define STEPS 5

/* The MTP layer over the n items of the step just run (each item's rows,
 * fresh tokens), on both runtimes; its draft logits compared bitwise. A
 * rank with no items still joins the MTP layer's exchanges. */
static void mtp_step(model_runtime *ep, model_runtime *ref, const model_step_item *it_ep,
                     const model_step_item *it_ref, int n, mt_rng *r, int32_t V, int s)
{
    model_mtp_item m_ep[MAXSEQ], m_ref[MAXSEQ];
    int32_t tok[64];
    float *lg = malloc(sizeof(float) * (size_t)V * 2 * MAXSEQ);
    if (!lg)
        die("memory", "draft logits");
    int row = 0;
    for (int q = 0; q < n; q++) {
        for (int t = 0; t < it_ep[q].n_tokens; t++)
            tok[row + t] = (int32_t)mt_rng_below(r, (uint64_t)V);
        m_ep[q] = (model_mtp_item){.seq = it_ep[q].seq, .tokens = tok + row,
                                   .n_tokens = it_ep[q].n_tokens, .hidden_row = row,
                                   .logits = lg + (size_t)q * V};
        m_ref[q] = m_ep[q];
        m_ref[q].seq = it_ref[q].seq;
        m_ref[q].logits = lg + (size_t)(MAXSEQ + q) * V;
        row += it_ep[q].n_tokens;
    }
    mt_err err = MT_ERR_INIT;
    if (model_mtp_step(ep, m_ep, n, &err) != MT_OK)
        die("expert-parallel MTP step", err.msg);
    if (n && ref && model_mtp_step(ref, m_ref, n, &err) != MT_OK)
        die("reference MTP step", err.msg);
    for (size_t i = 0; ref && i < (size_t)n * (size_t)V; i++)
        if (memcmp(&lg[i], &lg[(size_t)MAXSEQ * V + i], sizeof(float))) {
            char msg[160];
            snprintf(msg, sizeof msg, "MTP step %d: logit %zu of item %zu is %.9g, alone %.9g", s,
                     i % (size_t)V, i / (size_t)V, lg[i], lg[(size_t)MAXSEQ * V + i]);
            die("draft logits differ", msg);
        }
    free(lg);
}

int main(int argc, char **argv)
{
    check_name = "ep_check";
    if (argc < 3) {
        fprintf(stderr, "usage: mt_ep_check MODEL_DIR SEED\n");
        return 2;
    }
    seed = strtoull(argv[2], NULL, 10);
    bool die_mode = argc > 3 && !strcmp(argv[3], "die");
    mt_comm *c = check_comm();
    mt_err err = MT_ERR_INIT;
    FILE *quiet = fopen("/dev/null", "w");
    model_runtime *ep = open_rt(argv[1], c, quiet);
    model_runtime *ref = die_mode ? NULL : open_rt(argv[1], NULL, quiet);
    int32_t V = model_runtime_vocab(ep);
    mt_rng r;
    mt_rng_seed(&r, seed * 7919u + (uint64_t)rank);
    int sq_ep[MAXSEQ], sq_ref[MAXSEQ], n_seq = 0;
    int32_t last[MAXSEQ];
    float *lg_ep = malloc(sizeof(float) * (size_t)V * 64);
    float *lg_ref = malloc(sizeof(float) * (size_t)V * 64);
    int32_t tok[64];
    for (int s = 0; s < STEPS; s++) {
        /* Rank r idles at step s when (r + s) % 3 == 2; otherwise it opens a
         * sequence (prefill of 1..24 tokens) while it has fewer than
         * MAXSEQ, and decodes the ones it has. */
        model_step_item it_ep[MAXSEQ], it_ref[MAXSEQ];
        int n = 0, used = 0;
        if (die_mode && s == 2 && rank == 1) {
            fflush(NULL);
            _exit(3);
        }
        if (s == 1 && rank == size - 1) {
            /* A bad step: refused, yet the other ranks' step completes. */
            int32_t bad = V + 5;
            model_step_item b = {.seq = n_seq ? sq_ep[0] : -1, .tokens = &bad, .n_tokens = 1};
            if (model_step(ep, &b, 1, &err) != MT_E_INVALID)
                die("bad item", "a token id past the vocabulary was not refused");
            /* And a bad draft step (no tokens): refused, yet it joins. */
            model_mtp_item bm = {.seq = b.seq, .tokens = &bad, .n_tokens = 0};
            if (model_mtp_step(ep, &bm, 1, &err) != MT_E_INVALID)
                die("bad MTP item", "an MTP item of no tokens was not refused");
            continue;
        }
        if ((rank + s) % 3 != 2) {
            for (int q = 0; q < n_seq; q++, n++) {
                tok[used] = last[q];
                it_ep[n] = (model_step_item){.seq = sq_ep[q], .tokens = tok + used,
                                             .n_tokens = 1, .all_logits = lg_ep + (size_t)used * V};
                it_ref[n] = it_ep[n];
                it_ref[n].seq = sq_ref[q];
                it_ref[n].all_logits = lg_ref + (size_t)used * V;
                used++;
            }
            if (n_seq < MAXSEQ) {
                int len = 1 + (int)mt_rng_below(&r, 24);
                for (int t = 0; t < len; t++)
                    tok[used + t] = (int32_t)mt_rng_below(&r, (uint64_t)V);
                if (model_seq_create(ep, &sq_ep[n_seq], &err) != MT_OK ||
                    (ref && model_seq_create(ref, &sq_ref[n_seq], &err) != MT_OK))
                    die("sequence", err.msg);
                it_ep[n] = (model_step_item){.seq = sq_ep[n_seq], .tokens = tok + used,
                                             .n_tokens = len, .n_prompt = len,
                                             .all_logits = lg_ep + (size_t)used * V};
                it_ref[n] = it_ep[n];
                it_ref[n].seq = sq_ref[n_seq];
                it_ref[n].all_logits = lg_ref + (size_t)used * V;
                used += len, n++, n_seq++;
            }
        }
        if (model_step(ep, it_ep, n, &err) != MT_OK)
            die("expert-parallel step", err.msg);
        if (n && ref) {
            if (model_step(ref, it_ref, n, &err) != MT_OK)
                die("reference step", err.msg);
            for (size_t i = 0; i < (size_t)used * (size_t)V; i++)
                if (memcmp(&lg_ep[i], &lg_ref[i], sizeof(float))) {
                    char msg[160];
                    snprintf(msg, sizeof msg, "step %d: logit %zu of row %zu is %.9g, alone %.9g",
                             s, i % (size_t)V, i / (size_t)V, lg_ep[i], lg_ref[i]);
                    die("logits differ", msg);
                }
        }
        mtp_step(ep, ref, it_ep, it_ref, n, &r, V, s);
        /* Greedy continuation of every sequence. */
        int row = 0;
        for (int q = 0; q < n; q++) {
            row += it_ep[q].n_tokens;
            const float *l = lg_ep + (size_t)(row - 1) * V;
            int32_t best = 0;
            for (int32_t v = 1; v < V; v++)
                best = l[v] > l[best] ? v : best;
            for (int k = 0; k < n_seq; k++)
                if (sq_ep[k] == it_ep[q].seq)
                    last[k] = best;
        }
    }
    /* The vocabulary is split over the ranks: every forward shared its
     * rows with the others (counts in; counts and ids out), and this rank
     * took part in the embedding's exchange (its id lists went in). */
    model_copy_counts cc;
    model_runtime_copy_counts(ep, &cc);
    if (cc.share_to_calls == 0 || cc.share_from_calls < cc.share_to_calls || cc.index_calls == 0)
        die("vocabulary parallelism", "this rank shared no step or uploaded no id lists");
    printf("ep_check rank %d/%d ok: %d sequences, %" PRId64 " tokens in its cache, %" PRIu64
           " steps shared\n", rank, size, n_seq, n_seq ? model_seq_len(ep, sq_ep[0]) : 0,
           cc.share_to_calls);
    model_runtime_close(ep);
    model_runtime_close(ref);
    free(lg_ep);
    free(lg_ref);
    fclose(quiet);
    mt_comm_close(c);
    return 0;
}
