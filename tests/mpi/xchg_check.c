/* xchg_check.c: run under `mpirun -np N` by test_xchg. The runtime across
 * ranks on emu devices, whose exchanges take device buffers: rank 0 leads
 * (comm_lead) a runtime over the "mpi" communicator, expert-parallel, or
 * tensor-parallel too with "tp", and runs the same steps on a one-device
 * runtime (batch-invariant kernels): two prompts longer than the DSA
 * indexer's top-k (so decode attends sparsely), prefilled in one step, then
 * greedy decodes of both. Every logit row must be bitwise the one device's.
 * Host copies: per step on rank 0, the multi-rank runtime's copies (calls
 * and bytes, each way) must be the one device's plus exactly the step's
 * announcement and the MoE layers' count reads; on the other ranks, over
 * the run, their forwards' own copies (none without "tp", the one device's
 * with it) plus the same. With "dp" (data-parallel attention: the two
 * sequences on ranks 0 and 1) rank 0 runs its own item's forward (as many
 * copies in as one device's step, fewer bytes), and reads back as many
 * logits bytes as one device in one more copy (its rows, then the other
 * ranks' rows); the other ranks read back only announcements and count
 * reads: their logits rows never pass through the host. Without "tp" the
 * embedding is vocabulary-parallel: its id lists go in too (under "dp" two
 * per window of max_batch_tokens of the step's tokens at most, at least
 * one), and under "ep", with no dp leader's message, every forward shares
 * its row counts (in) and every rank's counts and ids (out) first. Prints
 * "xchg_check rank R/N ok" and exits 0, or names the first difference and
 * exits 1.
 * Usage: mt_xchg_check MODEL_DIR SEED ep|tp|dp */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/rng.h"
#include "model/runtime.h"
#include "mpi_check.h"

enum { MAX_T = 96 };

static bool dp; /* data-parallel attention */

static model_runtime *open_rt(const char *dir, mt_comm *c, bool tp, FILE *quiet)
{
    model_runtime_opts o = {.model_dir = dir, .device = "emu", .kv_pages = 64,
                            .max_batch_tokens = MAX_T, .batch_invariant = true, .log = quiet,
                            .comm = c, .comm_lead = c != NULL, .tp = tp && c, .dp = dp && c};
    return check_open(&o, "open (across ranks)", "open (one device)");
}

/* Copies between two snapshots: [to calls, to bytes, from calls, from
 * bytes, announce calls, announce bytes, count calls, count bytes, index
 * calls, index bytes, share-to calls, bytes, share-from calls, bytes]. */
enum { ND = 14 };
static void delta(const model_copy_counts *a, const model_copy_counts *b, uint64_t d[ND])
{
    d[10] = b->share_to_calls - a->share_to_calls;
    d[11] = b->share_to_bytes - a->share_to_bytes;
    d[12] = b->share_from_calls - a->share_from_calls;
    d[13] = b->share_from_bytes - a->share_from_bytes;
    d[8] = b->index_calls - a->index_calls, d[9] = b->index_bytes - a->index_bytes;
    d[0] = b->to_calls - a->to_calls, d[1] = b->to_bytes - a->to_bytes;
    d[2] = b->from_calls - a->from_calls, d[3] = b->from_bytes - a->from_bytes;
    d[4] = b->announce_calls - a->announce_calls, d[5] = b->announce_bytes - a->announce_bytes;
    d[6] = b->count_calls - a->count_calls, d[7] = b->count_bytes - a->count_bytes;
}

/* own[4]: the forward's own copies; d: the runtime's; leader: the
 * announcements went in (to) rather than out (from); vocab: the
 * vocabulary-parallel embedding and head without a dp leader (expert
 * parallelism alone): each forward shares its step (counts in, counts and
 * ids out, share_*) and uploads id lists (index), at least once each;
 * without it (tp) neither happens. */
static void check_copies(const char *when, const uint64_t own[4], const uint64_t d[ND],
                         bool leader, bool vocab)
{
    uint64_t want[4] = {own[0] + d[8] + d[10], own[1] + d[9] + d[11], own[2] + d[6] + d[12],
                        own[3] + d[7] + d[13]};
    want[leader ? 0 : 2] += d[4];
    want[leader ? 1 : 3] += d[5];
    bool shared = d[10] >= 1 && d[12] >= d[10] && d[8] >= 1;
    bool none = !d[8] && !d[10] && !d[12];
    if (memcmp(want, d, sizeof want) || (vocab ? !shared : !none)) {
        char msg[480];
        snprintf(msg, sizeof msg, "%s: %" PRIu64 " copies in (%" PRIu64 " bytes) and %" PRIu64
                 " out (%" PRIu64 " bytes); the forward's own %" PRIu64 " in (%" PRIu64
                 ") and %" PRIu64 " out (%" PRIu64 "), %" PRIu64 " announcements (%" PRIu64
                 " bytes), %" PRIu64 " count reads (%" PRIu64 " bytes), %" PRIu64 " id lists, %"
                 PRIu64 " + %" PRIu64 " step shares: something else went through the host",
                 when, d[0], d[1], d[2], d[3], own[0], own[1], own[2], own[3], d[4], d[5], d[6],
                 d[7], d[8], d[10], d[12]);
        die("host copies", msg);
    }
}

/* Data-parallel attention, rank 0's step: d against the one device's
 * step one (see the top). */
static void check_dp_copies(const char *when, const uint64_t one[ND], const uint64_t d[ND],
                            int tokens)
{
    uint64_t windows = (uint64_t)(tokens + MAX_T - 1) / MAX_T;
    bool ok = d[0] == one[0] + d[4] + d[8] && d[1] <= one[1] + d[5] + d[9] &&
              d[2] == one[2] + 1 + d[6] && d[3] == one[3] + d[7] && d[8] >= 1 &&
              d[8] <= 2 * windows && !d[10] && !d[12]; /* the message says the step */
    if (!ok) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s: %" PRIu64 " copies in (%" PRIu64 " bytes) and %" PRIu64
                 " out (%" PRIu64 " bytes); one device %" PRIu64 " in (%" PRIu64 ") and %" PRIu64
                 " out (%" PRIu64 "), %" PRIu64 " announcements (%" PRIu64 " bytes), %" PRIu64
                 " count reads (%" PRIu64 " bytes), %" PRIu64 " id lists (%" PRIu64 " bytes)",
                 when, d[0], d[1], d[2], d[3], one[0], one[1], one[2], one[3], d[4], d[5], d[6],
                 d[7], d[8], d[9]);
        die("host copies (data-parallel)", msg);
    }
}

static int32_t argmax(const float *l, int32_t V)
{
    int32_t best = 0;
    for (int32_t v = 1; v < V; v++)
        best = l[v] > l[best] ? v : best;
    return best;
}

#define DECODES 3

int main(int argc, char **argv)
{
    check_name = "xchg_check";
    if (argc < 4 || (strcmp(argv[3], "ep") && strcmp(argv[3], "tp") && strcmp(argv[3], "dp"))) {
        fprintf(stderr, "usage: mt_xchg_check MODEL_DIR SEED ep|tp|dp\n");
        return 2;
    }
    seed = strtoull(argv[2], NULL, 10);
    bool tp = !strcmp(argv[3], "tp");
    dp = !strcmp(argv[3], "dp");
    mt_comm *c = check_comm();
    mt_err err = MT_ERR_INIT;
    FILE *quiet = fopen("/dev/null", "w");
    model_runtime *many = open_rt(argv[1], c, tp, quiet);
    model_copy_counts c0, c1;
    uint64_t d[ND], own_total[4] = {0, 0, 0, 0};
    model_runtime_copy_counts(many, &c0);
    if (rank != 0) {
        int64_t steps = 0;
        if (model_runtime_follow(many, &steps, &err) != MT_OK)
            die("follow", err.msg);
        model_runtime_copy_counts(many, &c1);
        delta(&c0, &c1, d);
        model_runtime_close(many);
        /* The one device's copies over the run, from rank 0. */
        if (mt_comm_broadcast(c, own_total, 4 * 2, MT_COMM_I32, 0, &err) != MT_OK)
            die("broadcast", err.msg);
        uint64_t none[4] = {0, 0, 0, 0};
        if (dp) { /* its forwards' copies in; nothing out but announcements and counts */
            if (d[2] != d[4] + d[6] || d[3] != d[5] + d[7])
                die("host copies (data-parallel)", "a rank's logits went through the host");
        } else {
            check_copies("the run", tp ? own_total : none, d, false, !tp);
        }
        printf("xchg_check rank %d/%d ok: %" PRId64 " steps followed, %" PRIu64
               " announcements and %" PRIu64 " count reads (%" PRIu64 " bytes) through the "
               "host\n", rank, size, steps, d[4], d[6], d[7]);
    } else {
        model_runtime *one = open_rt(argv[1], NULL, false, quiet);
        int32_t V = model_runtime_vocab(one);
        mt_rng r;
        mt_rng_seed(&r, seed);
        /* index_topk is 16 on the tiny model: these prompts go past it. */
        int len[2] = {20 + (int)mt_rng_below(&r, 12), 17 + (int)mt_rng_below(&r, 8)};
        int32_t tok[64], next[2];
        int sq[2][2];
        float *lg[2];
        for (int k = 0; k < 2; k++)
            if (!(lg[k] = malloc(sizeof(float) * (size_t)V * 64)))
                die("memory", "logits");
        for (int t = 0; t < len[0] + len[1]; t++)
            tok[t] = (int32_t)mt_rng_below(&r, (uint64_t)V);
        model_runtime *rts[2] = {many, one};
        for (int k = 0; k < 2; k++)
            for (int s = 0; s < 2; s++)
                if (model_seq_create(rts[k], &sq[k][s], &err) != MT_OK)
                    die("sequence", err.msg);
        if (dp && (model_seq_rank(many, sq[0][0]) != 0 || model_seq_rank(many, sq[0][1]) != 1))
            die("placement", "the two sequences are not on ranks 0 and 1");
        for (int step = 0; step <= DECODES; step++) {
            uint64_t dd[2][ND];
            int rows = 0;
            for (int k = 0; k < 2; k++) {
                model_step_item it[2];
                if (step == 0) {
                    it[0] = (model_step_item){.seq = sq[k][0], .tokens = tok, .n_tokens = len[0],
                                              .n_prompt = len[0], .all_logits = lg[k]};
                    it[1] = (model_step_item){.seq = sq[k][1], .tokens = tok + len[0],
                                              .n_tokens = len[1], .n_prompt = len[1],
                                              .all_logits = lg[k] + (size_t)len[0] * V};
                    rows = len[0] + len[1];
                } else {
                    for (int s = 0; s < 2; s++)
                        it[s] = (model_step_item){.seq = sq[k][s], .tokens = &next[s],
                                                  .n_tokens = 1, .logits = lg[k] + (size_t)s * V};
                    rows = 2;
                }
                model_copy_counts a, b;
                model_runtime_copy_counts(rts[k], &a);
                if (model_step(rts[k], it, 2, &err) != MT_OK)
                    die(k ? "step (one device)" : "step (across ranks)", err.msg);
                model_runtime_copy_counts(rts[k], &b);
                delta(&a, &b, dd[k]);
            }
            for (size_t i = 0; i < (size_t)rows * (size_t)V; i++)
                if (memcmp(&lg[0][i], &lg[1][i], sizeof(float))) {
                    char msg[160];
                    snprintf(msg, sizeof msg, "step %d: logit %zu of row %zu is %.9g, one device "
                             "%.9g", step, i % (size_t)V, i / (size_t)V, lg[0][i], lg[1][i]);
                    die("logits differ", msg);
                }
            char when[32];
            snprintf(when, sizeof when, "step %d", step);
            if (dp)
                check_dp_copies(when, dd[1], dd[0], step == 0 ? len[0] + len[1] : 2);
            else
                check_copies(when, dd[1], dd[0], true, !tp);
            for (int k = 0; k < 4; k++)
                own_total[k] += dd[1][k];
            printf("xchg_check step %d: %d rows; host copies %" PRIu64 " in + %" PRIu64
                   " out (one device: %" PRIu64 " + %" PRIu64 "): %" PRIu64 " announcement(s) of %"
                   PRIu64 " bytes, %" PRIu64 " count reads of %" PRIu64 " bytes, %" PRIu64
                   " id lists of %" PRIu64 " bytes, 0 staging\n",
                   step, rows, dd[0][0], dd[0][2], dd[1][0], dd[1][2], dd[0][4], dd[0][5],
                   dd[0][6], dd[0][7], dd[0][8], dd[0][9]);
            int last0 = step == 0 ? len[0] - 1 : 0, last1 = step == 0 ? len[0] + len[1] - 1 : 1;
            next[0] = argmax(lg[0] + (size_t)last0 * V, V);
            next[1] = argmax(lg[0] + (size_t)last1 * V, V);
        }
        model_runtime_close(many);
        model_runtime_close(one);
        if (mt_comm_broadcast(c, own_total, 4 * 2, MT_COMM_I32, 0, &err) != MT_OK)
            die("broadcast", err.msg);
        printf("xchg_check rank 0/%d ok: %d + %d prompt tokens, %d greedy steps bitwise one "
               "device's\n", size, len[0], len[1], DECODES);
        free(lg[0]);
        free(lg[1]);
    }
    fclose(quiet);
    mt_comm_close(c);
    return 0;
}
