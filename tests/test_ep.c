/* test_ep.c: the runtime across ranks with expert parallelism (model/ep_moe.h,
 * model/rt_ep.c). In process: expert ranges tile the experts; the
 * expert-parallel path over the one-rank "self" communicator (dispatch,
 * local expert kernels, combine) gives bitwise the plain runtime's logits;
 * speculative decoding, which does not run across ranks, is refused by name. Under mpirun (when the
 * build has MPI): `moetune generate --comm mpi --batch-invariant` at 2 and 4
 * ranks gives bitwise the single-device logits and the same greedy tokens
 * (generate_matches also has a within-tolerance mode for runs without
 * batch-invariant kernels: their per-bucket configs compile too long for CI);
 * mt_ep_check at 3 ranks (16 experts split 6/5/5) has every rank run its
 * own sequences or none, one bad item included, bitwise against a
 * one-device runtime in the same process; and a rank that dies mid-run
 * ends the job instead of leaving the others waiting. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "comm/comm.h"
#include "model/ep_moe.h"
#include "test_forward_util.h"

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
    model_step_item it = {.seq = seq, .tokens = tok, .n_tokens = n, .all_logits = lg};
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

Test(ep, speculative_decoding_across_ranks_is_refused_by_name, .timeout = 300)
{
    char *dir = fw_tiny_dir();
    mt_comm *c = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(mt_comm_open("self", &c, &err), MT_OK, "%s", err.msg);
    cr_assert_null(open_comm(dir, c, 2, &err));
    cr_assert(strstr(err.msg, "speculative"), "%s", err.msg);
    mt_comm_close(c);
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
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
             "ASAN_OPTIONS=detect_leaks=0:intercept_tls_get_addr=0 %s 2>&1", cmd);
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

/* generate on one device and under mpirun -np np (--comm mpi): the same
 * ids, and logits bitwise (batch-invariant) or within 1e-2 relative L2 per
 * prompt position. */
static void generate_matches(int np, bool invariant)
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
    snprintf(cmd, sizeof cmd, "%s --oversubscribe -np %d %s %s --comm mpi --logits %s/many.bin",
             MPIEXEC, np, MOETUNE_BIN, args, dir);
    rc = run(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "mpirun -np %d: exit %d\n%s", np, rc, out);
    cr_assert(strstr(out, "holds routed experts 0-"), "rank 0 did not report its experts:\n%s",
              out);
    ids_of(out, many, sizeof many);
    cr_assert_str_eq(many, one, "seed %" PRIu64 ": -np %d greedy tokens differ", seed, np);
    char p1[600], p2[600];
    snprintf(p1, sizeof p1, "%s/one.bin", dir);
    snprintf(p2, sizeof p2, "%s/many.bin", dir);
    size_t n1, n2;
    float *a = read_logits(p1, &n1), *b = read_logits(p2, &n2);
    cr_assert_eq(n1, (size_t)n * 512);
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
    free(a), free(b), free(tok);
    fw_rm_dir(dir);
}

Test(ep_mpi, two_ranks_generate_the_single_device_logits, .timeout = 600)
{
    generate_matches(2, true);
}

Test(ep_mpi, four_ranks_generate_the_single_device_logits, .timeout = 600)
{
    generate_matches(4, true);
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

Test(ep_mpi, a_rank_that_dies_ends_the_job, .timeout = 300)
{
    static char out[1 << 16];
    int rc;
    ep_check(2, "die", out, sizeof out, &rc);
    cr_assert_neq(rc, 0, "the job survived a dead rank:\n%s", out);
    cr_assert_not(strstr(out, "ep_check rank 0/2 ok"), "rank 0 finished without rank 1:\n%s",
                  out);
}
#else
Test(ep_mpi, needs_mpi)
{
    cr_skip_test("this build has no MPI (install libopenmpi-dev and openmpi-bin, then "
                 "reconfigure): the multi-rank expert-parallel checks did not run");
}
#endif
