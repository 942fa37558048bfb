/* test_ep.c: the runtime across ranks with expert parallelism (model/ep_moe.h,
 * model/rt_ep.c). In process: expert ranges tile the experts; the
 * expert-parallel path over the one-rank "self" communicator (dispatch,
 * local expert kernels, combine) gives bitwise the plain runtime's logits,
 * and speculative decoding over it (the MTP layer expert-parallel too) the
 * plain runtime's tokens and acceptance.
 * Under mpirun (when the build has MPI): `moetune generate --comm mpi
 * --batch-invariant` at 2 and 4 ranks gives bitwise the single-device
 * logits and the same greedy tokens (generate_matches also has a
 * within-tolerance mode for runs without batch-invariant kernels: their
 * per-bucket configs take too long to compile for CI); mt_ep_check at 3
 * ranks (16 experts split 6/5/5) has every rank run its own sequences or
 * none, one bad item included, bitwise against a one-device runtime in the
 * same process; `serve --ranks 2` answers a completion, then goes down,
 * server included, when rank 1 is killed; `serve --device emu
 * --speculative-steps 3` at 2 ranks and at 4 with --tp answers with one
 * device's greedy tokens and as many drafts accepted. (mt_ep_check's "die" mode, a rank
 * dying while the others wait inside an exchange, is left to manual runs:
 * test_comm covers a rank dying under a waiting collective, and CI time is
 * tight.) */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "comm/comm.h"
#include "model/ep_moe.h"
#include "model/plan/plan.h"
#include "model/spec.h"
#include "serve/serve_client.h"
#include "test_forward_util.h"
#include "test_mpi_procs.h"
#include "test_mpirun.h"

Test(ep, expert_ranges_tile_the_experts)
{
    const int64_t experts[] = {1, 7, 16, 256, 257};
    for (size_t i = 0; i < sizeof experts / sizeof experts[0]; i++)
        for (int n = 1; n <= 9 && n <= experts[i]; n++) {
            int64_t next = 0, lo = experts[i], hi = 0;
            for (int r = 0; r < n; r++) {
                int64_t first, count;
                model_ep_range(experts[i], n, r, &first, &count);
                cr_assert_eq(first, next, "E=%" PRId64 " n=%d rank %d starts at %" PRId64,
                             experts[i], n, r, first);
                next += count;
                lo = count < lo ? count : lo;
                hi = count > hi ? count : hi;
            }
            cr_assert_eq(next, experts[i], "E=%" PRId64 " n=%d covers %" PRId64, experts[i], n,
                         next);
            cr_assert(lo >= 1 && hi - lo <= 1, "E=%" PRId64 " n=%d: sizes %" PRId64 "..%" PRId64,
                      experts[i], n, lo, hi);
        }
}

static model_runtime *open_comm(const char *dir, mt_comm *c, int spec, mt_err *err)
{
    static FILE *quiet;
    if (!quiet)
        quiet = fopen("/dev/null", "w");
    model_runtime_opts o = {.model_dir = dir, .device = "cpu", .kv_pages = 64,
                            .max_batch_tokens = 64, .batch_invariant = true, .log = quiet,
                            .comm = c, .speculative_steps = spec};
    model_runtime *rt = NULL;
    return model_runtime_open(&o, &rt, err) == MT_OK ? rt : NULL;
}

/* Prefill n tokens, then 3 greedy decode steps: every row's logits. */
static float *run_seq(model_runtime *rt, const int32_t *tok, int n)
{
    int32_t V = model_runtime_vocab(rt);
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)(n + 3));
    int seq;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_seq_create(rt, &seq, &err), MT_OK, "%s", err.msg);
    model_step_item it = {.seq = seq, .tokens = tok, .n_tokens = n, .all_logits = lg, .n_prompt = n};
    cr_assert_eq(model_step(rt, &it, 1, &err), MT_OK, "%s", err.msg);
    for (int s = 0; s < 3; s++) {
        const float *l = lg + (size_t)(n + s - 1) * V;
        int32_t next = 0;
        for (int32_t v = 1; v < V; v++)
            next = l[v] > l[next] ? v : next;
        model_step_item d = {.seq = seq, .tokens = &next, .n_tokens = 1,
                             .all_logits = lg + (size_t)(n + s) * V};
        cr_assert_eq(model_step(rt, &d, 1, &err), MT_OK, "%s", err.msg);
    }
    model_seq_free(rt, seq);
    return lg;
}

Test(ep, one_rank_expert_parallel_path_is_bitwise_the_plain_runtime, .timeout = 300)
{
    char *dir = fw_tiny_dir();
    mt_comm *c = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(mt_comm_open("self", &c, &err), MT_OK, "%s", err.msg);
    model_runtime *ep = open_comm(dir, c, 0, &err);
    cr_assert_not_null(ep, "%s", err.msg);
    model_runtime *plain = open_comm(dir, NULL, 0, &err);
    cr_assert_not_null(plain, "%s", err.msg);
    uint64_t seed = mt_seed_fresh();
    int32_t V = model_runtime_vocab(ep);
    int n = 13 + (int)(seed % 20);
    int32_t *tok = fw_tokens(seed, n, V);
    float *a = run_seq(ep, tok, n), *b = run_seq(plain, tok, n);
    for (size_t i = 0; i < (size_t)(n + 3) * (size_t)V; i++)
        cr_assert(!memcmp(&a[i], &b[i], sizeof *a), "seed %" PRIu64 ": row %zu logit %zu: %.9g "
                  "expert-parallel, %.9g plain", seed, i / (size_t)V, i % (size_t)V, a[i], b[i]);
    /* An empty step joins the (one-rank) exchanges and appends nothing; a
     * runtime that drives its own steps does not follow. */
    cr_assert_eq(model_step(ep, NULL, 0, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(model_runtime_follow(ep, NULL, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "comm_lead"), "%s", err.msg);
    cr_assert_eq(model_runtime_rank(ep), 0);
    free(a), free(b), free(tok);
    model_runtime_close(ep);
    model_runtime_close(plain);
    mt_comm_close(c);
    fw_rm_dir(dir);
}

/* `tune --model --ep N` tunes what the ranks look up: the expert-parallel
 * kernels the one-rank runtime registers (its report's "this rank's
 * experts" lines) are exactly the plan's EP entries for one rank; at 3
 * ranks the plan has the 6- and 5-expert shapes (16 experts), one pair per
 * row, M up to every pair of a step. */
Test(ep, plan_lists_the_expert_parallel_kernels_the_ranks_look_up, .timeout = 300)
{
    char *dir = fw_tiny_dir();
    mt_comm *c = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(mt_comm_open("self", &c, &err), MT_OK, "%s", err.msg);
    model_runtime *rt = open_comm(dir, c, 0, &err);
    cr_assert_not_null(rt, "%s", err.msg);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    model_runtime_report(rt, f);
    fclose(f);
    char *text_copy = strdup(text); /* strtok_r cuts text up below */
    const model_config *cfg = model_runtime_config(rt);
    int64_t topk = cfg->num_experts_per_tok, experts = cfg->n_routed_experts;
    model_runtime_close(rt);
    mt_comm_close(c);

    model_plan_opts po = {.kv_pages = 64, .max_batch_tokens = 64, .ep_ranks = 1};
    model_plan_entry *plan = NULL;
    int n = 0;
    cr_assert_eq(model_kernel_plan(dir, &po, &plan, &n, &err), MT_OK, "%s", err.msg);
    int in_report = 0, in_plan = 0;
    bool *seen = calloc((size_t)n, sizeof *seen);
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char fam[64], key[KERN_KEY_MAX];
        if (!strstr(line, "this rank's experts") || sscanf(line, "%63s %511s", fam, key) != 2)
            continue;
        int found = -1;
        for (int i = 0; i < n && found < 0; i++)
            if (!strcmp(plan[i].fam->name, fam) && !strcmp(plan[i].key, key) &&
                strstr(plan[i].purpose, "EP rank"))
                found = i;
        cr_assert(found >= 0, "the runtime looks up %s %s; the plan with --ep 1 does not list "
                  "it", fam, key);
        in_report += !seen[found]; /* a line per M bucket */
        seen[found] = true;
    }
    free(seen);
    /* Neither the runtime nor the plan has the whole-layer expert GEMMs
     * (every expert, top-k choices per row): no rank runs them. */
    char whole[64];
    snprintf(whole, sizeof whole, "E=%" PRId64 ",topk=%" PRId64 ",", experts, topk);
    for (const char *l = text_copy; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        size_t len = strcspn(l, "\n");
        bool expert_kernel = !strncmp(l, "moe_gemm", 8) || !strncmp(l, "moe_align", 9);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(len < 511 ? len : 511), l);
        cr_assert(!expert_kernel || !strstr(line, whole), "the expert-parallel runtime registers "
                  "a whole-layer expert kernel: %s", line);
    }
    for (int i = 0; i < n; i++) {
        in_plan += strstr(plan[i].purpose, "EP rank") != NULL;
        cr_assert(!strstr(plan[i].fam->name, "moe_gemm") || !strstr(plan[i].key, whole),
                  "the --ep plan lists %s %s", plan[i].fam->name, plan[i].key);
    }
    cr_assert_eq(in_report, 3, "the report's expert-parallel kernels (align, up, down): %d",
                 in_report);
    cr_assert_eq(in_plan, in_report, "the plan lists %d EP kernels, the runtime %d", in_plan,
                 in_report);
    free(plan);

    po.ep_ranks = 3;
    cr_assert_eq(model_kernel_plan(dir, &po, &plan, &n, &err), MT_OK, "%s", err.msg);
    int ups = 0;
    for (int i = 0; i < n; i++) {
        if (!strstr(plan[i].purpose, "EP rank") || strcmp(plan[i].fam->name, "moe_gemm_up"))
            continue;
        int64_t local = experts / 3 + (ups == 0);
        kern_shape s;
        cr_assert_eq(kern_shape_parse(plan[i].fam, plan[i].key, &s, NULL, &err), MT_OK, "%s",
                     err.msg);
        cr_assert_eq(kern_shape_get(plan[i].fam, &s, "E"), local, "%s", plan[i].key);
        cr_assert_eq(kern_shape_get(plan[i].fam, &s, "topk"), 1, "%s", plan[i].key);
        cr_assert_eq(plan[i].m_max, 64 * topk, "%s: largest M %" PRId64, plan[i].key,
                     plan[i].m_max);
        ups++;
    }
    cr_assert_eq(ups, 2, "16 experts over 3 ranks: a 6- and a 5-expert up GEMM, %d listed", ups);
    free(plan);
    po.ep_ranks = (int)experts + 1;
    cr_assert_eq(model_kernel_plan(dir, &po, &plan, &n, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "routed experts"), "%s", err.msg);
    /* The command line: --ep takes a rank count and goes with --model. */
    const char *bad[][2] = {{"--ep 0 --model", "a number of ranks"},
                            {"--ep 3x --model", "a number of ranks"},
                            {"--ep 2 --family moe_gemm_up --shape", "go with --model"},
                            {"--tp 0 --model", "a number of ranks"},
                            {"--tp 2 --family moe_gemm_up --shape", "go with --model"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[2048], out[4096] = "";
        snprintf(cmd, sizeof cmd, "%s tune %s %s 2>&1", MOETUNE_BIN, bad[i][0], dir);
        FILE *p = popen(cmd, "r");
        cr_assert_not_null(p);
        size_t got = fread(out, 1, sizeof out - 1, p);
        out[got] = 0;
        int rc = pclose(p);
        cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "%s: exit %d: %s", cmd, rc, out);
        cr_assert(strstr(out, bad[i][1]), "%s: %s", cmd, out);
    }
    free(text);
    free(text_copy);
    fw_rm_dir(dir);
}

/* Speculative decoding through the expert-parallel path (the MTP layer's
 * experts too) over the one-rank "self" communicator: the same tokens and
 * the same acceptance as the plain runtime; an MTP step of no items joins
 * the MTP layer's (one-rank) exchanges. */
Test(ep, one_rank_speculative_decoding_is_the_plain_runtimes, .timeout = 300)
{
    char *dir = fw_tiny_dir();
    mt_comm *c = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(mt_comm_open("self", &c, &err), MT_OK, "%s", err.msg);
    model_runtime *rts[2] = {open_comm(dir, c, 3, &err), NULL};
    cr_assert_not_null(rts[0], "%s", err.msg);
    rts[1] = open_comm(dir, NULL, 3, &err);
    cr_assert_not_null(rts[1], "%s", err.msg);
    uint64_t seed = mt_seed_fresh();
    int n = 18 + (int)(seed % 12);
    int32_t *tok = fw_tokens(seed, n, model_runtime_vocab(rts[0]));
    int32_t out[2][16];
    int produced[2];
    model_spec_seq st[2];
    for (int k = 0; k < 2; k++) {
        int seq;
        mt_rng rng;
        mt_rng_seed(&rng, seed);
        cr_assert_eq(model_seq_create(rts[k], &seq, &err), MT_OK, "%s", err.msg);
        model_spec_gen_opts go = {.k = 3, .max_tokens = 16, .rng = &rng};
        cr_assert_eq(model_spec_generate(rts[k], seq, tok, n, &go, out[k], &produced[k], &st[k],
                                         &err), MT_OK, "%s", err.msg);
    }
    cr_assert_eq(produced[0], produced[1]);
    cr_assert_arr_eq(out[0], out[1], sizeof(int32_t) * (size_t)produced[0], "seed %" PRIu64, seed);
    cr_assert_eq(st[0].drafted, st[1].drafted, "seed %" PRIu64, seed);
    cr_assert_eq(st[0].accepted, st[1].accepted, "seed %" PRIu64, seed);
    cr_assert_gt(st[0].drafted, 0);
    cr_assert_eq(model_mtp_step(rts[0], NULL, 0, &err), MT_OK, "%s", err.msg);
    free(tok);
    model_runtime_close(rts[0]);
    model_runtime_close(rts[1]);
    mt_comm_close(c);
    fw_rm_dir(dir);
}

/* Whether plan p lists e's kernel (family and key). */
static bool plan_has(const model_plan_entry *p, int n, const model_plan_entry *e)
{
    for (int i = 0; i < n; i++)
        if (p[i].fam == e->fam && !strcmp(p[i].key, e->key))
            return true;
    return false;
}

/* Tensor parallelism over 3 ranks of the tiny model (4 heads, hidden 256,
 * vocabulary 512): each rank's share tiles the model; a rank's plan has its
 * local shapes; the tune plan (tp_rank -1) lists every rank's kernels. */
Test(ep, tensor_parallel_shares_and_plans, .timeout = 300)
{
    char *dir = fw_tiny_dir();
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    model_config *cfg = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_config_load(path, &cfg, &err), MT_OK, "%s", err.msg);
    int64_t NH = cfg->num_attention_heads, H = cfg->hidden_size, V = cfg->vocab_size;
    int64_t VD = cfg->v_head_dim;
    for (int ranks = 1; ranks <= NH; ranks++) {
        int64_t nh = 0, no = 0, nv = 0;
        for (int r = 0; r < ranks; r++) {
            model_tp_dims d;
            cr_assert_eq(model_tp_local(cfg, ranks, r, &d, &err), MT_OK, "%s", err.msg);
            cr_assert_eq(d.head0, nh, "%d ranks, rank %d", ranks, r);
            cr_assert_eq(d.o_row0, no);
            cr_assert_eq(d.vocab0, nv);
            cr_assert(d.heads >= NH / ranks && d.heads <= NH / ranks + 1);
            nh += d.heads, no += d.o_rows, nv += d.vocab;
        }
        cr_assert(nh == NH && no == H && nv == V, "%d ranks: %" PRId64 " heads, %" PRId64
                  " rows, %" PRId64 " tokens", ranks, nh, no, nv);
    }
    model_tp_dims d;
    cr_assert_eq(model_tp_local(cfg, (int)NH + 1, 0, &d, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "num_attention_heads"), "%s", err.msg);

    model_plan_opts po = {.kv_pages = 64, .max_batch_tokens = 64, .tp_ranks = 3};
    model_plan_entry *all = NULL, *one = NULL;
    int n_all = 0, n_one = 0;
    po.tp_rank = -1;
    cr_assert_eq(model_kernel_plan(dir, &po, &all, &n_all, &err), MT_OK, "%s", err.msg);
    int decode_heads = 0;
    for (int r = 0; r < 3; r++) {
        model_tp_dims me;
        cr_assert_eq(model_tp_local(cfg, 3, r, &me, &err), MT_OK);
        po.tp_rank = r;
        cr_assert_eq(model_kernel_plan(dir, &po, &one, &n_one, &err), MT_OK, "%s", err.msg);
        bool decode = false, o = false, head = false, embed = false, gu = false, down = false;
        for (int i = 0; i < n_one; i++) {
            const model_plan_entry *e = &one[i];
            cr_assert(plan_has(all, n_all, e), "rank %d looks up %s %s; the tune plan does not "
                      "list it", r, e->fam->name, e->key);
            kern_shape s;
            cr_assert_eq(kern_shape_parse(e->fam, e->key, &s, NULL, &err), MT_OK, "%s", err.msg);
            if (!strcmp(e->fam->name, "mla_decode")) {
                cr_assert_eq(kern_shape_get(e->fam, &s, "H"), me.heads, "%s", e->key);
                decode = true;
            } else if (!strcmp(e->purpose, "o_proj")) {
                cr_assert_eq(kern_shape_get(e->fam, &s, "N"), me.o_rows, "%s", e->key);
                cr_assert_eq(kern_shape_get(e->fam, &s, "K"), NH * VD, "%s", e->key);
                o = true;
            } else if (!strcmp(e->purpose, "lm_head")) {
                cr_assert_eq(kern_shape_get(e->fam, &s, "N"), me.vocab, "%s", e->key);
                head = true;
            } else if (!strcmp(e->purpose, "embedding")) {
                embed = true;
            } else if (!strcmp(e->purpose, "mlp gate/up")) {
                int64_t i0, ni;
                model_ep_range(cfg->intermediate_size, 3, r, &i0, &ni);
                cr_assert_eq(kern_shape_get(e->fam, &s, "N"), 2 * ni, "%s", e->key);
                gu = true;
            } else if (!strcmp(e->purpose, "mlp down")) {
                cr_assert_eq(kern_shape_get(e->fam, &s, "N"), me.o_rows, "%s", e->key);
                cr_assert_eq(kern_shape_get(e->fam, &s, "K"), cfg->intermediate_size, "%s",
                             e->key);
                down = true;
            }
        }
        cr_assert(decode && o && head && embed && gu && down, "rank %d: a slot is missing", r);
        free(one);
    }
    for (int i = 0; i < n_all; i++)
        decode_heads += !strcmp(all[i].fam->name, "mla_decode");
    cr_assert_eq(decode_heads, 2, "4 heads over 3 ranks: a 2- and a 1-head mla_decode, %d "
                 "listed", decode_heads);
    free(all);
    po.tp_rank = 3;
    cr_assert_eq(model_kernel_plan(dir, &po, &all, &n_all, &err), MT_E_INVALID);
    model_config_destroy(cfg);
    fw_rm_dir(dir);
}

/* Each rank's plan of a vocabulary split over `ranks` ranks (in
 * tensor-parallel groups of tp, or plain with tp 0) of the tiny model
 * (vocabulary 512): lm_head over the rank's share of the whole job (not
 * its group's), the embedding, the job's gather of the ranks' logits
 * columns and no group gather of logits; every entry is in the tune plan
 * (`tune --model --ep ranks [--tp tp]`: vocab_rank -1, tp_rank -1), whose
 * lm_head slot is the whole vocabulary (or rank 0's tp share). */
static void vocab_plans(const char *dir, int ranks, int tp)
{
    mt_err err = MT_ERR_INIT;
    const int64_t V = 512, H = 256;
    model_plan_opts po = {.kv_pages = 64, .max_batch_tokens = 64, .ep_ranks = ranks,
                          .ep_runtime = true, .vocab_ranks = ranks, .vocab_rank = -1,
                          .tp_ranks = tp, .tp_rank = tp ? -1 : 0};
    model_plan_entry *all = NULL, *one = NULL;
    int n_all = 0, n_one = 0;
    cr_assert_eq(model_kernel_plan(dir, &po, &all, &n_all, &err), MT_OK, "%s", err.msg);
    char want[64];
    snprintf(want, sizeof want, "N=%" PRId64 ",K=%" PRId64, tp ? (V + tp - 1) / tp : V, H);
    bool whole = false;
    for (int i = 0; i < n_all; i++)
        whole |= !strcmp(all[i].purpose, "lm_head") && !strcmp(all[i].key, want);
    cr_assert(whole, "%d ranks, tp %d: the tune plan's lm_head slot is not %s", ranks, tp,
              want);
    int64_t covered = 0;
    for (int r = 0; r < ranks; r++) {
        po.vocab_rank = r;
        po.tp_rank = tp ? r % tp : 0;
        cr_assert_eq(model_kernel_plan(dir, &po, &one, &n_one, &err), MT_OK, "%s", err.msg);
        int64_t v0, nv;
        model_ep_range(V, ranks, r, &v0, &nv);
        cr_assert_eq(v0, covered, "rank %d starts at %" PRId64, r, v0);
        covered += nv;
        bool head = false, embed = false, cols = false;
        for (int i = 0; i < n_one; i++) {
            const model_plan_entry *e = &one[i];
            cr_assert(plan_has(all, n_all, e), "rank %d (tp %d) looks up %s %s; the tune plan "
                      "does not list it", r, tp, e->fam->name, e->key);
            kern_shape sh;
            cr_assert_eq(kern_shape_parse(e->fam, e->key, &sh, NULL, &err), MT_OK, "%s", err.msg);
            if (!strcmp(e->purpose, "lm_head")) {
                cr_assert_eq(kern_shape_get(e->fam, &sh, "N"), nv, "rank %d: %s", r, e->key);
                head = true;
            } else if (!strcmp(e->purpose, "embedding")) { /* its key names no rows */
                embed = true;
            } else if (!strcmp(e->fam->name, "tp_cols") && strstr(e->purpose, "logits")) {
                cr_assert(!strcmp(e->purpose, "gather logits (vocabulary-parallel)"),
                          "rank %d (tp %d): %s", r, tp, e->purpose);
                cr_assert_eq(kern_shape_get(e->fam, &sh, "U"), V, "%s", e->key);
                cr_assert_eq(kern_shape_get(e->fam, &sh, "ranks"), ranks, "%s", e->key);
                cr_assert_eq(kern_shape_get(e->fam, &sh, "per"), 1, "%s", e->key);
                cols = true;
            }
        }
        cr_assert(head && embed && cols, "rank %d (tp %d): a slot is missing", r, tp);
        free(one);
    }
    cr_assert_eq(covered, V);
    free(all);
}

/* Data-parallel ranks' vocabulary over 3 plain ranks (171, 171, 170 rows)
 * and over 4 ranks in tensor-parallel groups of 2 (128 each, not the
 * groups' 256); splits that cannot be are refused by name. */
Test(ep, vocabulary_parallel_shares_and_plans, .timeout = 300)
{
    char *dir = fw_tiny_dir();
    mt_err err = MT_ERR_INIT;
    vocab_plans(dir, 3, 0);
    vocab_plans(dir, 4, 2);
    model_plan_opts po = {.kv_pages = 64, .max_batch_tokens = 64, .ep_ranks = 3,
                          .ep_runtime = true, .vocab_ranks = 3, .vocab_rank = 3};
    model_plan_entry *all = NULL;
    int n_all = 0;
    /* A rank past the job; one group (its tensor parallelism splits the
     * vocabulary); groups that do not divide the job. */
    cr_assert_eq(model_kernel_plan(dir, &po, &all, &n_all, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "vocabulary parallelism"), "%s", err.msg);
    po.vocab_rank = 0;
    po.tp_ranks = 3;
    cr_assert_eq(model_kernel_plan(dir, &po, &all, &n_all, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "one group splits"), "%s", err.msg);
    po.ep_ranks = po.vocab_ranks = 4;
    cr_assert_eq(model_kernel_plan(dir, &po, &all, &n_all, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "several whole groups"), "%s", err.msg);
    po.vocab_ranks = po.tp_ranks = 4; /* a tune plan with --tp over the job: TP splits it */
    po.vocab_rank = po.tp_rank = -1;
    cr_assert_eq(model_kernel_plan(dir, &po, &all, &n_all, &err), MT_OK, "%s", err.msg);
    free(all);
    fw_rm_dir(dir);
}

#ifdef MOETUNE_HAVE_MPI
/* Runs cmd (with Open MPI's consent to run as root and without
 * LeakSanitizer in the children: Open MPI keeps its allocations to exit),
 * output into out; returns the exit status. */
static int run(const char *cmd, char *out, size_t cap)
{
    char full[4096];
    snprintf(full, sizeof full,
             MPIRUN_ENV "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static float *read_logits(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "no logits file %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *x = malloc((size_t)len + 1);
    cr_assert_eq(fread(x, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len / sizeof(float);
    return x;
}

/* The ids line of generate's output. */
static void ids_of(const char *out, char *ids, size_t cap)
{
    const char *p = strstr(out, "ids:");
    cr_assert_not_null(p, "no ids in:\n%s", out);
    size_t n = strcspn(p, "\n");
    snprintf(ids, cap, "%.*s", (int)n, p);
}

/* generate on one device, then under mpirun -np N (--comm mpi) for each N
 * of nps: the same ids, and logits bitwise (batch-invariant) or within 1e-2
 * relative L2 per prompt position. */
static void generate_matches(const int *nps, int n_nps, bool invariant, const char *extra)
{
    char *dir = fw_tiny_dir();
    uint64_t seed = mt_seed_fresh();
    int n = 9 + (int)(seed % 24);
    int32_t *tok = fw_tokens(seed, n, 512);
    char toks[512] = "", args[2048], cmd[4096], one[600], many[600];
    for (int i = 0; i < n; i++)
        snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%" PRId32, i ? "," : "",
                 tok[i]);
    snprintf(args, sizeof args, "generate --model %s --device cpu --tokens %s --max-tokens 6%s",
             dir, toks, invariant ? " --batch-invariant" : "");
    static char out[1 << 16];
    snprintf(cmd, sizeof cmd, "%s %s --logits %s/one.bin", MOETUNE_BIN, args, dir);
    int rc = run(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "one device: exit %d\n%s", rc, out);
    ids_of(out, one, sizeof one);
    char p1[600], p2[600];
    snprintf(p1, sizeof p1, "%s/one.bin", dir);
    snprintf(p2, sizeof p2, "%s/many.bin", dir);
    size_t n1, n2;
    float *a = read_logits(p1, &n1);
    cr_assert_eq(n1, (size_t)n * 512);
    for (int k = 0; k < n_nps; k++) {
        int np = nps[k];
        remove(p2);
        snprintf(cmd, sizeof cmd, "%s --oversubscribe -np %d %s %s --comm mpi %s --logits %s",
                 MPIEXEC, np, MOETUNE_BIN, args, extra, p2);
        rc = run(cmd, out, sizeof out);
        cr_assert_eq(rc, 0, "mpirun -np %d: exit %d\n%s", np, rc, out);
        cr_assert(strstr(out, "holds routed experts 0-"), "rank 0 did not report its experts:\n%s",
                  out);
        if (strstr(extra, "--tp"))
            cr_assert(strstr(out, "tensor parallelism: rank 0 of"), "rank 0 did not report its "
                      "tensor-parallel share:\n%s", out);
        if (strstr(extra, "--tp-size"))
            cr_assert(strstr(out, "tensor parallelism: group 0 of"), "rank 0 did not report its "
                      "tensor-parallel group:\n%s", out);
        ids_of(out, many, sizeof many);
        cr_assert_str_eq(many, one, "seed %" PRIu64 ": -np %d greedy tokens differ", seed, np);
        float *b = read_logits(p2, &n2);
        cr_assert_eq(n2, n1);
        for (int t = 0; t < n; t++) {
            const float *x = b + (size_t)t * 512, *y = a + (size_t)t * 512;
            if (invariant)
                cr_assert(!memcmp(x, y, 512 * sizeof *x), "seed %" PRIu64 ": -np %d position %d "
                          "differs from one device", seed, np, t);
            else
                cr_assert_leq(fw_rel_l2(x, y, 512), 1e-2, "seed %" PRIu64 ": -np %d position %d",
                              seed, np, t);
        }
        free(b);
    }
    free(a), free(tok);
    fw_rm_dir(dir);
}

Test(ep_mpi, two_and_four_ranks_generate_the_single_device_logits, .timeout = 600)
{
    const int nps[] = {2, 4};
    generate_matches(nps, 2, true, "");
}

/* Tensor parallelism: heads, o_proj rows and vocabulary split too. Every
 * collective is a copy or a sum with one non-zero term and each rank's
 * kernels compute whole dot products, so even here the logits are bitwise
 * one device's. */
Test(ep_mpi, tensor_parallel_ranks_generate_the_single_device_logits, .timeout = 600)
{
    const int nps[] = {2, 4};
    generate_matches(nps, 2, true, "--tp");
}

/* Two tensor-parallel groups of 2 ranks, experts over all 4. */
Test(ep_mpi, tensor_parallel_groups_generate_the_single_device_logits, .timeout = 600)
{
    /* The sanitizer pass runs tensor_parallel_groups_smaller_than_the_job_match_one_device
     * instead. */
    MPI_RELEASE_ONLY();
    const int nps[] = {4};
    generate_matches(nps, 1, true, "--tp --tp-size 2");
}

/* Without the batch-invariant mode (each rank's MoE share picks configs
 * for its own row count), on 3 ranks: 4 heads split 2, 1, 1. */
Test(ep_mpi, tensor_parallel_uneven_split_within_tolerance, .timeout = 600)
{
    /* The sanitizer pass runs tensor_parallel_ranks_generate_the_single_device_logits instead. */
    MPI_RELEASE_ONLY();
    const int nps[] = {3};
    generate_matches(nps, 1, false, "--tp");
}

static void tp_check_groups(int np, const char *mode, int group)
{
    char *dir = fw_tiny_dir();
    char cmd[2048];
    static char out[1 << 16];
    unsigned long long seed = (unsigned long long)mt_seed_fresh();
    snprintf(cmd, sizeof cmd, "%s --oversubscribe -np %d %s %s %llu %s %d", MPIEXEC, np,
             MT_TP_CHECK, dir, seed, mode, group);
    int rc = run(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "mpirun -np %d mt_tp_check %s %d (seed %llu): exit %d\n%s", np, mode,
                 group, seed, rc, out);
    for (int r = 0; r < np; r++) {
        char want[64];
        snprintf(want, sizeof want, "tp_check rank %d/%d ok", r, np);
        cr_assert(strstr(out, want), "no '%s' in:\n%s", want, out);
    }
    fw_rm_dir(dir);
}

static void tp_check(int np, const char *mode) { tp_check_groups(np, mode, 0); }

/* Tensor-parallel groups of 2 in a job of 4 (experts over all 4): the
 * second group mirrors the first, led or not, bitwise one device's. */
Test(ep_mpi, tensor_parallel_groups_smaller_than_the_job_match_one_device, .timeout = 600)
{
    tp_check_groups(4, "lead", 2);
    tp_check_groups(4, "spmd", 2);
}

/* Every rank runs the same script (creates, two prefills in a step, a
 * fork, a truncation, a refused step, a free) with no leader. */
Test(ep_mpi, tensor_parallel_ranks_without_a_leader_match_one_device_bitwise, .timeout = 600)
{
    tp_check(2, "spmd");
}

/* Rank 0 runs the script; the others replay its sequence operations and
 * steps from its announcements. */
Test(ep_mpi, tensor_parallel_followers_mirror_the_leaders_sequences, .timeout = 600)
{
    /* The sanitizer pass runs the groups test (led) instead. */
    MPI_RELEASE_ONLY();
    tp_check(3, "lead");
}

/* Data-parallel attention under one leader on emu devices: rank 0 places
 * sequences on every rank (or tensor-parallel group) and drives them; the
 * logits are bitwise one device's at 2, 3 and 4 ranks and at 4 ranks in
 * two groups of 2. */
Test(ep_mpi, data_parallel_attention_under_one_leader_matches_one_device, .timeout = 600)
{
    /* The sanitizer pass runs data_parallel_serve_answers_what_one_device_generates, test_xchg
     * dp instead. */
    MPI_RELEASE_ONLY();
    char *dir = fw_tiny_dir();
    static char out[1 << 16];
    for (int np = 2; np <= 5; np++) { /* 5: 4 ranks in two tensor-parallel groups of 2 */
        char cmd[2048];
        unsigned long long seed = (unsigned long long)mt_seed_fresh();
        snprintf(cmd, sizeof cmd, "%s --oversubscribe -np %d %s %s %llu %d", MPIEXEC,
                 np < 5 ? np : 4, MT_DP_CHECK, dir, seed, np < 5 ? 1 : 2);
        int rc = run(cmd, out, sizeof out);
        cr_assert_eq(rc, 0, "%s (seed %llu): exit %d\n%s", cmd, seed, rc, out);
        for (int r = 0; r < (np < 5 ? np : 4); r++) {
            char want[64];
            snprintf(want, sizeof want, "dp_check rank %d/%d ok", r, np < 5 ? np : 4);
            cr_assert(strstr(out, want), "no '%s' in:\n%s", want, out);
        }
    }
    fw_rm_dir(dir);
}

static void ep_check(int np, const char *mode, char *out, size_t cap, int *rc)
{
    char *dir = fw_tiny_dir();
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s --oversubscribe -np %d %s %s %llu %s", MPIEXEC, np,
             MT_EP_CHECK, dir, (unsigned long long)mt_seed_fresh(), mode);
    *rc = run(cmd, out, cap);
    fw_rm_dir(dir);
}

Test(ep_mpi, three_ranks_run_their_own_sequences_bitwise, .timeout = 600)
{
    static char out[1 << 16];
    int rc;
    ep_check(3, "", out, sizeof out, &rc);
    cr_assert_eq(rc, 0, "mpirun -np 3 mt_ep_check: exit %d\n%s", rc, out);
    for (int r = 0; r < 3; r++) {
        char want[64];
        snprintf(want, sizeof want, "ep_check rank %d/3 ok", r);
        cr_assert(strstr(out, want), "no '%s' in:\n%s", want, out);
    }
}

/* serve --ranks 2 under mpirun answers a completion (the numbers are the
 * generate tests' business: the server steps the same runtime); then rank
 * 1 is killed and the whole job, server included, goes down instead of
 * hanging. */
/* Starts `mpirun -np np moetune serve ... --device device --ranks np flags`
 * on dir's tiny model in the background; returns its port once ready, *mp
 * the mpirun pid. */
static int start_serve_on(const char *dir, int np, const char *device, const char *flags,
                          int *mp)
{
    char log[600], pidf[600], cmd[4096];
    snprintf(log, sizeof log, "%s/serve.log", dir);
    snprintf(pidf, sizeof pidf, "%s/mpirun.pid", dir);
    snprintf(cmd, sizeof cmd,
             MPIRUN_ENV "%s --oversubscribe -np %d %s "
             "serve --model %s --device %s --port 0 --ranks %d --batch-invariant %s > %s 2>&1 & "
             "echo $! > %s", MPIEXEC, np, MOETUNE_BIN, dir, device, np, flags, log, pidf);
    cr_assert_eq(system(cmd), 0);
    FILE *f = fopen(pidf, "r");
    cr_assert(f && fscanf(f, "%d", mp) == 1, "no mpirun pid");
    fclose(f);
    return mpi_server_port(log, *mp, SIGTERM);
}

static int start_serve(const char *dir, const char *flags, int *mp)
{
    return start_serve_on(dir, 2, "cpu", flags, mp);
}

Test(ep_mpi, serve_across_two_ranks_answers_and_goes_down_with_a_dead_rank, .timeout = 600)
{
    char *dir = fw_tiny_dir();
    int mp = 0, port = start_serve(dir, "", &mp);
    /* One request through both ranks. */
    uint64_t seed = mt_seed_fresh();
    int32_t *tok = fw_tokens(seed, 7, 512);
    char body[512], toks[256] = "";
    for (int i = 0; i < 7; i++)
        snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%" PRId32, i ? "," : "",
                 tok[i]);
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":5,\"temperature\":0,"
             "\"ignore_eos\":true,\"logprobs\":0}", toks);
    serve_url url = {0};
    mt_err err = MT_ERR_INIT;
    char base[64];
    snprintf(base, sizeof base, "http://127.0.0.1:%d", port);
    cr_assert_eq(serve_url_parse(base, &url, &err), MT_OK, "%s", err.msg);
    serve_client_resp resp = SERVE_CLIENT_RESP_INIT;
    mt_status st = serve_client_request(&url, "POST", "/v1/completions", body, strlen(body),
                                        120, NULL, NULL, &resp, &err);
    bool answered = st == MT_OK && resp.status == 200 &&
                    strstr(resp.body.data, "\"completion_tokens\":5");
    if (!answered)
        kill(mp, SIGTERM);
    cr_assert(answered, "%s %d %.*s", err.msg, resp.status, (int)resp.body.len,
              resp.body.data ? resp.body.data : "");
    serve_client_resp_release(&resp);
    int r1 = rank_pid(mp, 1);
    if (r1 <= 0)
        kill(mp, SIGTERM);
    cr_assert_gt(r1, 0, "no rank 1 under mpirun %d", mp);
    kill(r1, SIGKILL);
    bool gone = false;
    for (int i = 0; i < 600 && !gone; i++) {
        usleep(100000);
        gone = !alive(mp);
    }
    if (!gone)
        kill(mp, SIGKILL);
    cr_assert(gone, "mpirun still runs 60 s after rank 1 died");
    serve_client_resp r2 = SERVE_CLIENT_RESP_INIT;
    cr_assert_neq(serve_client_request(&url, "GET", "/health", NULL, 0, 5, NULL, NULL, &r2, &err),
                  MT_OK, "the server still answers after the job ended");
    serve_client_resp_release(&r2);
    free(tok);
    fw_rm_dir(dir);
}
/* The token ids of every choice in a completion response, each as "a,b,c". */
/* SIGTERM to mpirun; the job must end within 60 s. */
static void stop_job(int mp)
{
    kill(mp, SIGTERM);
    bool gone = false;
    int status = 0;
    for (int i = 0; i < 600 && !gone; i++) {
        usleep(100000);
        gone = waitpid(mp, &status, WNOHANG) == mp || !alive(mp);
    }
    if (!gone)
        kill(mp, SIGKILL);
    cr_assert(gone, "mpirun still runs 60 s after SIGTERM");
}

static int choice_ids(const char *body, char ids[][256], int cap)
{
    cJSON *j = cJSON_Parse(body);
    cr_assert_not_null(j, "not JSON: %s", body);
    cJSON *ch = cJSON_GetObjectItem(j, "choices"), *c;
    int n = 0;
    cJSON_ArrayForEach(c, ch)
    {
        cr_assert_lt(n, cap);
        cJSON *t, *ti = cJSON_GetObjectItem(c, "token_ids");
        cr_assert(cJSON_IsArray(ti), "no token_ids in %s", body);
        ids[n][0] = 0;
        cJSON_ArrayForEach(t, ti)
        {
            size_t l = strlen(ids[n]);
            snprintf(ids[n] + l, 256 - l, "%s%d", l ? "," : "", t->valueint);
        }
        n++;
    }
    cJSON_Delete(j);
    return n;
}

/* serve --ranks 2 --tp: followers mirror the leader's sequences (forks for
 * n > 1 and the prefix cache, frees), and every choice is what one device
 * generates greedily; SIGTERM to mpirun stops the job cleanly. */
Test(ep_mpi, tensor_parallel_serve_answers_what_one_device_generates, .timeout = 600)
{
    char *dir = fw_tiny_dir();
    uint64_t seed = mt_seed_fresh();
    int n = 4 + (int)(seed % 12);
    int32_t *tok = fw_tokens(seed, n, 512);
    char toks[256] = "", cmd[4096], body[512];
    for (int i = 0; i < n; i++)
        snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%" PRId32, i ? "," : "",
                 tok[i]);
    static char out[1 << 16];
    snprintf(cmd, sizeof cmd, "%s generate --model %s --device cpu --tokens %s --max-tokens 6 "
             "--batch-invariant", MOETUNE_BIN, dir, toks);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    char one[600];
    ids_of(out, one, sizeof one); /* "ids: a,b,..." */
    const char *want = one + strlen("ids: ");
    int mp = 0, port = start_serve(dir, "--tp", &mp);
    serve_url url = {0};
    mt_err err = MT_ERR_INIT;
    char base[64];
    snprintf(base, sizeof base, "http://127.0.0.1:%d", port);
    cr_assert_eq(serve_url_parse(base, &url, &err), MT_OK, "%s", err.msg);
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":6,\"temperature\":0,"
             "\"ignore_eos\":true,\"n\":3,\"return_token_ids\":true}", toks);
    /* Twice: the second prompt is read from the prefix cache (a fork). */
    for (int round = 0; round < 2; round++) {
        serve_client_resp resp = SERVE_CLIENT_RESP_INIT;
        mt_status st = serve_client_request(&url, "POST", "/v1/completions", body, strlen(body),
                                            120, NULL, NULL, &resp, &err);
        if (st != MT_OK || resp.status != 200)
            kill(mp, SIGTERM);
        cr_assert(st == MT_OK && resp.status == 200, "%s %d %.*s", err.msg, resp.status,
                  (int)resp.body.len, resp.body.data ? resp.body.data : "");
        char ids[3][256];
        int got = choice_ids(resp.body.data, ids, 3);
        serve_client_resp_release(&resp);
        if (got != 3)
            kill(mp, SIGTERM);
        cr_assert_eq(got, 3);
        for (int c = 0; c < 3; c++) {
            /* generate stops at an end-of-sequence token; the server ignores it. */
            if (strncmp(ids[c], want, strlen(want)))
                kill(mp, SIGTERM);
            cr_assert(!strncmp(ids[c], want, strlen(want)), "seed %" PRIu64 ", round %d, "
                      "choice %d: %s, one device %s", seed, round, c, ids[c], want);
        }
    }
    stop_job(mp);
    free(tok);
    fw_rm_dir(dir);
}

/* A sample's value in a /metrics text (-1: none). */
static double metric_of(const char *text, const char *sample)
{
    size_t n = strlen(sample);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, sample, n) && p[n] == ' ')
            return atof(p + n + 1);
    return -1;
}

/* serve --device emu --ranks 3 (data-parallel attention): three prompts,
 * one after another, land on three ranks (each placed where the most KV
 * pages are free, then where attention has run the fewest rows), n = 2
 * forks on the
 * rank of its first choice, the first prompt again is a prefix-cache hit
 * on the rank holding it, then a chat; every choice is what one device
 * generates greedily, and /metrics shows every rank's attention at work. */
Test(ep_mpi, data_parallel_serve_answers_what_one_device_generates, .timeout = 600)
{
    char *dir = fw_tiny_dir();
    uint64_t seed = mt_seed_fresh();
    enum { NP = 3 };
    char toks[NP][256], want[NP][600];
    static char out[1 << 16];
    for (int p = 0; p < NP; p++) {
        int n = 4 + (int)((seed >> (8 * p)) % 20);
        int32_t *tok = fw_tokens(seed + (uint64_t)p, n, 512);
        toks[p][0] = 0;
        for (int i = 0; i < n; i++)
            snprintf(toks[p] + strlen(toks[p]), sizeof toks[p] - strlen(toks[p]), "%s%" PRId32,
                     i ? "," : "", tok[i]);
        free(tok);
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s generate --model %s --device emu --tokens %s "
                 "--max-tokens 5 --batch-invariant", MOETUNE_BIN, dir, toks[p]);
        cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
        char one[600];
        ids_of(out, one, sizeof one);
        snprintf(want[p], sizeof want[p], "%s", one + strlen("ids: "));
    }
    int mp = 0, port = start_serve_on(dir, NP, "emu", "", &mp);
    serve_url url = {0};
    mt_err err = MT_ERR_INIT;
    char base[64];
    snprintf(base, sizeof base, "http://127.0.0.1:%d", port);
    cr_assert_eq(serve_url_parse(base, &url, &err), MT_OK, "%s", err.msg);
    for (int k = 0; k <= NP; k++) {
        int p = k % NP;
        char body[600];
        snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":5,\"temperature\":0,"
                 "\"ignore_eos\":true,\"n\":2,\"return_token_ids\":true}", toks[p]);
        serve_client_resp resp = SERVE_CLIENT_RESP_INIT;
        mt_status st = serve_client_request(&url, "POST", "/v1/completions", body, strlen(body),
                                            300, NULL, NULL, &resp, &err);
        if (st != MT_OK || resp.status != 200)
            kill(mp, SIGTERM);
        cr_assert(st == MT_OK && resp.status == 200, "%s %d %.*s", err.msg, resp.status,
                  (int)resp.body.len, resp.body.data ? resp.body.data : "");
        char ids[2][256];
        int got = choice_ids(resp.body.data, ids, 2);
        serve_client_resp_release(&resp);
        if (got != 2)
            kill(mp, SIGTERM);
        cr_assert_eq(got, 2);
        for (int c = 0; c < 2; c++) {
            if (strncmp(ids[c], want[p], strlen(want[p])))
                kill(mp, SIGTERM);
            cr_assert(!strncmp(ids[c], want[p], strlen(want[p])), "seed %" PRIu64 ", request "
                      "%d, choice %d: %s, one device %s", seed, k, c, ids[c], want[p]);
        }
    }
    /* A chat: its prompt as the server tokenizes it, generated on one device. */
    const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"Where is the data?\"}]";
    char body[600], ids[2][256];
    snprintf(body, sizeof body, "{%s}", msgs);
    serve_client_resp tk = SERVE_CLIENT_RESP_INIT;
    mt_status st = serve_client_request(&url, "POST", "/tokenize", body, strlen(body), 30, NULL,
                                        NULL, &tk, &err);
    cJSON *tj = st == MT_OK && tk.status == 200 ? cJSON_Parse(tk.body.data) : NULL;
    cJSON *tt = tj ? cJSON_GetObjectItem(tj, "tokens") : NULL, *t;
    char chat_toks[512] = "";
    cJSON_ArrayForEach(t, tt)
    {
        size_t l = strlen(chat_toks);
        snprintf(chat_toks + l, sizeof chat_toks - l, "%s%d", l ? "," : "", t->valueint);
    }
    cJSON_Delete(tj);
    serve_client_resp_release(&tk);
    if (!chat_toks[0])
        kill(mp, SIGTERM);
    cr_assert(chat_toks[0], "/tokenize of a chat failed: %s", err.msg);
    char cmd[4096], one[600];
    snprintf(cmd, sizeof cmd, "%s generate --model %s --device emu --tokens %s --max-tokens 5 "
             "--batch-invariant", MOETUNE_BIN, dir, chat_toks);
    int grc = run(cmd, out, sizeof out);
    if (grc)
        kill(mp, SIGTERM);
    cr_assert_eq(grc, 0, "%s", out);
    ids_of(out, one, sizeof one);
    snprintf(body, sizeof body, "{%s,\"max_tokens\":5,\"temperature\":0,\"ignore_eos\":true,"
             "\"return_token_ids\":true}", msgs);
    serve_client_resp cr = SERVE_CLIENT_RESP_INIT;
    st = serve_client_request(&url, "POST", "/v1/chat/completions", body, strlen(body), 300, NULL,
                              NULL, &cr, &err);
    bool chat_ok = st == MT_OK && cr.status == 200 && choice_ids(cr.body.data, ids, 2) == 1 &&
                   !strncmp(ids[0], one + strlen("ids: "), strlen(one + strlen("ids: ")));
    if (!chat_ok)
        kill(mp, SIGTERM);
    cr_assert(chat_ok, "seed %" PRIu64 ", chat: %s %d %.*s; one device %s", seed, err.msg,
              cr.status, (int)cr.body.len, cr.body.data ? cr.body.data : "", one);
    serve_client_resp_release(&cr);
    serve_client_resp m = SERVE_CLIENT_RESP_INIT;
    st = serve_client_request(&url, "GET", "/metrics", NULL, 0, 30, NULL, NULL, &m, &err);
    if (st != MT_OK || m.status != 200)
        kill(mp, SIGTERM);
    cr_assert(st == MT_OK && m.status == 200, "%s", err.msg);
    for (int r = 0; r < NP; r++) {
        char name[80];
        snprintf(name, sizeof name, "moetune_rank_tokens_total{rank=\"%d\"}", r);
        double v = metric_of(m.body.data, name);
        if (v <= 0)
            kill(mp, SIGTERM);
        cr_assert_gt(v, 0, "rank %d ran no attention rows:\n%s", r, m.body.data);
    }
    serve_client_resp_release(&m);
    stop_job(mp);
    fw_rm_dir(dir);
}

/* An integer field of the response's usage.speculative (-1: none). */
static int64_t spec_usage(const char *body, const char *field)
{
    cJSON *j = cJSON_Parse(body);
    cJSON *u = j ? cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "speculative") : NULL;
    cJSON *f = u ? cJSON_GetObjectItem(u, field) : NULL;
    int64_t v = cJSON_IsNumber(f) ? (int64_t)f->valuedouble : -1;
    cJSON_Delete(j);
    return v;
}

/* serve --device emu --ranks N --speculative-steps 3, expert-parallel at 2
 * ranks and tensor-parallel at 4, on a tiny checkpoint whose MTP layer
 * predicts the main model's next token, a prompt past the DSA indexer's
 * top-k: the greedy tokens one device generates with the same drafts, and
 * as many drafts drafted and accepted. */
Test(ep_mpi, speculative_serve_across_ranks_answers_what_one_device_generates, .timeout = 600)
{
    /* The sanitizer pass runs test_xchg speculative ep and tp2 instead. */
    MPI_RELEASE_ONLY();
    char *dir = tmp_dir_dup("mt_ep_spec");
    uint64_t seed = mt_seed_fresh();
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tiny_write_mtp_map(dir, seed, &err), MT_OK, "%s", err.msg);
    int n = 18 + (int)(seed % 12), max_tokens = 10;
    int32_t *tok = fw_tokens(seed, n, 512);
    char toks[512] = "", cmd[4096], body[1024];
    for (int i = 0; i < n; i++)
        snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%" PRId32, i ? "," : "",
                 tok[i]);
    static char out[1 << 16];
    snprintf(cmd, sizeof cmd, "%s generate --model %s --device emu --tokens %s --max-tokens %d "
             "--batch-invariant --speculative-steps 3", MOETUNE_BIN, dir, toks, max_tokens);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    char one[600];
    ids_of(out, one, sizeof one);
    const char *want = one + strlen("ids: ");
    long long acc = -1, drafted = -1;
    const char *a = strstr(out, "acceptance rate");
    cr_assert(a && strchr(a, '(') && sscanf(strchr(a, '('), "(%lld of %lld", &acc, &drafted) == 2,
              "no acceptance in:\n%s", out);
    cr_assert_gt(drafted, 0);
    int commas = 0;
    for (const char *c = want; *c; c++)
        commas += *c == ',';
    bool whole = commas + 1 == max_tokens; /* generate stopped at no end of sequence */
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true,\"return_token_ids\":true}", toks, max_tokens);
    const struct {
        int np;
        const char *flags;
    } runs[] = {{2, "--speculative-steps 3"}, {4, "--tp --speculative-steps 3"},
                {4, "--tp --tp-size 2 --speculative-steps 3"}};
    for (int r = 0; r < 3; r++) {
        int mp = 0, port = start_serve_on(dir, runs[r].np, "emu", runs[r].flags, &mp);
        serve_url url = {0};
        char base[64];
        snprintf(base, sizeof base, "http://127.0.0.1:%d", port);
        cr_assert_eq(serve_url_parse(base, &url, &err), MT_OK, "%s", err.msg);
        serve_client_resp resp = SERVE_CLIENT_RESP_INIT;
        mt_status st = serve_client_request(&url, "POST", "/v1/completions", body, strlen(body),
                                            120, NULL, NULL, &resp, &err);
        bool ok = st == MT_OK && resp.status == 200;
        char ids[1][256] = {""};
        if (ok)
            ok = choice_ids(resp.body.data, ids, 1) == 1 && !strncmp(ids[0], want, strlen(want));
        int64_t sd = ok ? spec_usage(resp.body.data, "draft_tokens") : -1;
        int64_t sa = ok ? spec_usage(resp.body.data, "accepted_tokens") : -1;
        if (!ok || (whole && (sd != drafted || sa != acc)))
            kill(mp, SIGTERM);
        cr_assert(ok, "seed %" PRIu64 ", -np %d %s: %s %d %.*s; one device %s", seed, runs[r].np,
                  runs[r].flags, err.msg, resp.status, (int)resp.body.len,
                  resp.body.data ? resp.body.data : "", want);
        if (whole)
            cr_assert(sd == drafted && sa == acc, "seed %" PRIu64 ", -np %d %s: %" PRId64 " of %"
                      PRId64 " drafts accepted, one device %lld of %lld", seed, runs[r].np,
                      runs[r].flags, sa, sd, acc, drafted);
        printf("speculative serve -np %d %s: %s; %" PRId64 " of %" PRId64 " drafts accepted "
               "(one device %lld of %lld)\n", runs[r].np, runs[r].flags, ids[0], sa, sd, acc,
               drafted);
        serve_client_resp_release(&resp);
        stop_job(mp);
    }
    free(tok);
    fw_rm_dir(dir);
}
#else
Test(ep_mpi, needs_mpi)
{
    cr_skip_test("this build has no MPI (install libopenmpi-dev and openmpi-bin, then "
                 "reconfigure): the multi-rank expert-parallel checks did not run");
}
#endif
