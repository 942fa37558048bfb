/* test_rank_failure.c: a rank that dies inside a stream. `mpirun -np 2
 * moetune serve --ranks 2` on the tiny model (cpu devices, a real server on
 * loopback); a streaming completion runs until a few tokens have arrived,
 * then rank 1 is killed with SIGKILL: the client must get an SSE error
 * event (not a silent cut) and the whole job must end within 10 s. What
 * makes it: mpirun's SIGTERM to rank 0, whose stop aborts the exchange the
 * step waits in (cli_ranks_watch, mt_comm_abort), so the step fails and
 * the engine sends its clients the error. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "serve/serve_client.h"
#include "test_forward_util.h"
#include "test_mpi_procs.h"
#include "test_mpirun.h"

#ifdef MOETUNE_HAVE_MPI
typedef struct stream {
    int mpirun, events;
    uint64_t killed_ns;
    char body[1 << 18];
    size_t len;
} stream;

/* Keeps the stream; kills rank 1 once 4 events have arrived. */
static bool on_body(void *ctx, const char *p, size_t n)
{
    stream *s = ctx;
    size_t room = sizeof s->body - 1 - s->len;
    n = n < room ? n : room;
    memcpy(s->body + s->len, p, n);
    s->len += n;
    s->body[s->len] = 0;
    s->events = 0;
    for (const char *d = s->body; (d = strstr(d, "data: ")); d += 6)
        s->events++;
    if (!s->killed_ns && s->events >= 4) {
        int r1 = rank_pid(s->mpirun, 1);
        if (r1 > 0 && kill(r1, SIGKILL) == 0)
            s->killed_ns = mt_now_ns();
    }
    return true;
}

Test(rank_failure, killed_follower_ends_the_job_and_the_stream_gets_an_error, .timeout = 300)
{
    char *dir = fw_tiny_dir();
    char log[600], pidf[600], cmd[4096];
    snprintf(log, sizeof log, "%s/serve.log", dir);
    snprintf(pidf, sizeof pidf, "%s/mpirun.pid", dir);
    snprintf(cmd, sizeof cmd,
             MPIRUN_ENV "%s --oversubscribe -np 2 %s "
             "serve --model %s --device cpu --port 0 --ranks 2 --batch-invariant > %s 2>&1 & "
             "echo $! > %s", MPIEXEC, MOETUNE_BIN, dir, log, pidf);
    cr_assert_eq(system(cmd), 0);
    static stream s;
    memset(&s, 0, sizeof s);
    FILE *f = fopen(pidf, "r");
    cr_assert(f && fscanf(f, "%d", &s.mpirun) == 1, "no mpirun pid");
    fclose(f);
    int port = mpi_server_port(log, s.mpirun, SIGKILL);

    serve_url url = {0};
    mt_err err = MT_ERR_INIT;
    char base[64];
    snprintf(base, sizeof base, "http://127.0.0.1:%d", port);
    cr_assert_eq(serve_url_parse(base, &url, &err), MT_OK, "%s", err.msg);
    uint64_t seed = mt_seed_fresh();
    int32_t *tok = fw_tokens(seed, 6, 512);
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\":[%d,%d,%d,%d,%d,%d],\"max_tokens\":4000,"
             "\"temperature\":0,\"ignore_eos\":true,\"stream\":true}", tok[0], tok[1], tok[2],
             tok[3], tok[4], tok[5]);
    serve_client_resp resp = SERVE_CLIENT_RESP_INIT;
    mt_status st = serve_client_request(&url, "POST", "/v1/completions", body, strlen(body), 60,
                                        on_body, &s, &resp, &err);
    uint64_t closed = mt_now_ns();
    bool gone = false;
    for (int i = 0; i < 100 && !gone; i++) {
        gone = !alive(s.mpirun);
        if (!gone)
            usleep(100000);
    }
    uint64_t ended = mt_now_ns();
    if (!gone)
        kill(s.mpirun, SIGKILL);
    cr_assert(s.killed_ns, "rank 1 was never killed (%d events): %s %s", s.events, err.msg,
              s.body);
    double to_close = (double)(closed - s.killed_ns) * 1e-9;
    double to_end = (double)(ended - s.killed_ns) * 1e-9;
    printf("rank 1 killed after %d events; the stream closed %.2f s later, the job ended "
           "%.2f s later (%s)\n", s.events, to_close, to_end, mt_status_str(st));
    cr_assert(gone, "mpirun still runs %.1f s after rank 1 died", to_end);
    cr_assert_lt(to_end, 10.0, "the job ended %.1f s after rank 1 died", to_end);
    const char *e = strstr(s.body, "data: {\"error\"");
    cr_assert_not_null(e, "no error event after rank 1 died; the stream's end:\n%s",
                       s.body + (s.len > 2000 ? s.len - 2000 : 0));
    cr_assert(strstr(s.body, "\"choices\"") < e, "no token came before the error");
    free(tok);
    serve_client_resp_release(&resp);
    fw_rm_dir(dir);
}
#else
Test(rank_failure, needs_mpi)
{
    cr_skip_test("this build has no MPI: the failing-rank check did not run");
}
#endif
