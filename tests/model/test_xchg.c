/* test_xchg.c: the runtime's exchanges between ranks on device buffers
 * (model/rt_xchg.c, model/ep_moe.c, model/rt_tp.c). Under mpirun on emu
 * devices (tests/mpi/xchg_check.c), expert-parallel at 2, 3 and 4 ranks and
 * tensor-parallel at 2 and 4 (test_ep runs 3): the greedy tokens and every
 * logit bitwise one device's (batch-invariant kernels) on prompts past the DSA indexer's top-k, and
 * no host copy beyond the step's announcement and the MoE layers' count
 * reads, per step on rank 0 and over the run on the others. Speculative
 * decoding (tests/mpi/spec_check.c) at 2 and 4 ranks, expert- and
 * tensor-parallel (and at 4 in tensor-parallel groups of 2): every logit row it reads (verify and MTP draft rows)
 * bitwise one device's, the same tokens, greedy and sampled, and the same
 * drafts accepted. In process:
 * a communicator that cannot reach the device's memory is refused, naming
 * both (a GPU communicator on emu, through the stand-in NCCL). */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "comm/comm.h"
#include "model/runtime.h"
#include "test_forward_util.h"
#include "test_mpirun.h"

Test(xchg, gpu_communicator_on_host_memory_is_refused_by_kind, .timeout = 300)
{
    setenv("MOETUNE_NCCL_LIBRARY", MT_FAKE_NCCL, 1);
    setenv("MOETUNE_CUDA_DRIVER_LIBRARY", MT_FAKE_NCCL, 1);
    mt_comm *c = NULL;
    mt_err err = MT_ERR_INIT;
    mt_comm_gpu_opts go = {.size = 1};
    cr_assert_eq(mt_comm_open_gpu("nccl", &go, &c, &err), MT_OK, "%s", err.msg);
    char *dir = fw_tiny_dir();
    model_runtime_opts o = {.model_dir = dir, .device = "emu", .kv_pages = 16,
                            .max_batch_tokens = 16, .comm = c};
    model_runtime *rt = NULL;
    cr_assert_eq(model_runtime_open(&o, &rt, &err), MT_E_UNSUPPORTED);
    cr_assert(strstr(err.msg, "'nccl'") && strstr(err.msg, "host memory") &&
              strstr(err.msg, "'mpi'"), "%s", err.msg);
    mt_comm_close(c);
    fw_rm_dir(dir);
}

#ifdef MOETUNE_HAVE_MPI
/* mpirun -np np of a check program (name, its binary) with arguments
 * first and args; every rank must say "<name> rank R/np ok". */
static void run_check(int np, const char *name, const char *bin, const char *first,
                      const char *args)
{
    char cmd[2048];
    static char out[1 << 16];
    snprintf(cmd, sizeof cmd,
             MPIRUN_ENV
             "%s --oversubscribe -np %d %s %s %s 2>&1", MPIEXEC, np, bin, first, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    cr_assert_eq(rc, 0, "mpirun -np %d %s %s: exit %d\n%s", np, name, args, rc, out);
    for (int r = 0; r < np; r++) {
        char want[64];
        snprintf(want, sizeof want, "%s rank %d/%d ok", name, r, np);
        cr_assert(strstr(out, want), "no '%s' in:\n%s", want, out);
    }
    printf("-np %d %s %s:\n%s", np, name, args, out);
}

static void xchg_check(int np, const char *mode)
{
    char *dir = fw_tiny_dir();
    char args[128];
    snprintf(args, sizeof args, "%llu %s", (unsigned long long)mt_seed_fresh(), mode);
    run_check(np, "xchg_check", MT_XCHG_CHECK, dir, args);
    fw_rm_dir(dir);
}

/* Speculative decoding across ranks (tests/mpi/spec_check.c) on two tiny
 * checkpoints: one whose MTP layer predicts the main model's next token
 * (drafts accepted), one with a random MTP layer (greedy drafts rejected,
 * sampled ones partly accepted). */
static void spec_check(int np, const char *mode)
{
    char *map = tmp_dir_dup("mt_xchg_spec"), *dir = fw_tiny_dir();
    uint64_t seed = mt_seed_fresh();
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_tiny_write_mtp_map(map, seed, &err), MT_OK, "%s", err.msg);
    char seed_s[32], args[1024];
    snprintf(seed_s, sizeof seed_s, "%" PRIu64, seed);
    snprintf(args, sizeof args, "%s 3 %s %s", mode, map, dir);
    run_check(np, "spec_check", MT_SPEC_CHECK, seed_s, args);
    fw_rm_dir(map);
    fw_rm_dir(dir);
}

Test(xchg_mpi, expert_parallel_two_ranks_bitwise_no_staging, .timeout = 600) { xchg_check(2, "ep"); }
Test(xchg_mpi, expert_parallel_three_ranks_bitwise_no_staging, .timeout = 600)
{
    MPI_RELEASE_ONLY();
    xchg_check(3, "ep");
}
Test(xchg_mpi, expert_parallel_four_ranks_bitwise_no_staging, .timeout = 600)
{
    MPI_RELEASE_ONLY();
    xchg_check(4, "ep");
}
Test(xchg_mpi, tensor_parallel_two_ranks_bitwise_no_staging, .timeout = 600) { xchg_check(2, "tp"); }
Test(xchg_mpi, tensor_parallel_four_ranks_bitwise_no_staging, .timeout = 600)
{
    MPI_RELEASE_ONLY();
    xchg_check(4, "tp");
}
Test(xchg_mpi, data_parallel_three_ranks_bitwise_no_staging, .timeout = 600) { xchg_check(3, "dp"); }
/* Under the sanitizers the two-rank exchanges and the data-parallel one
 * run (each path once), and two of the speculative configurations, one per
 * path (the expert-parallel announcement, the tensor-parallel replay in
 * groups); the Release pass runs them all. */
Test(xchg_mpi, speculative_expert_parallel_two_ranks_bitwise, .timeout = 600) { spec_check(2, "ep"); }
/* Data-parallel attention: each prompt drafts on the rank holding it, or
 * on the tensor-parallel group holding it. */
Test(xchg_mpi, speculative_data_parallel_three_ranks_bitwise, .timeout = 600)
{
    MPI_RELEASE_ONLY();
    spec_check(3, "dp");
}

Test(xchg_mpi, speculative_data_parallel_groups_of_two_bitwise, .timeout = 600)
{
    MPI_RELEASE_ONLY();
    spec_check(4, "dp2");
}
Test(xchg_mpi, speculative_expert_parallel_four_ranks_bitwise, .timeout = 600)
{
    MPI_RELEASE_ONLY();
    spec_check(4, "ep");
}
Test(xchg_mpi, speculative_tensor_parallel_two_ranks_bitwise, .timeout = 600)
{
    MPI_RELEASE_ONLY();
    spec_check(2, "tp");
}
Test(xchg_mpi, speculative_tensor_parallel_four_ranks_bitwise, .timeout = 600)
{
    MPI_RELEASE_ONLY();
    spec_check(4, "tp");
}
Test(xchg_mpi, speculative_tensor_parallel_groups_of_two_bitwise, .timeout = 600) { spec_check(4, "tp2"); }
#else
Test(xchg_mpi, needs_mpi)
{
    cr_skip_test("this build has no MPI (install libopenmpi-dev and openmpi-bin, then "
                 "reconfigure): the multi-rank exchange checks did not run");
}
#endif
