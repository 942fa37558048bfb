/* test_mpi_procs.h: the processes of an mpirun job as /proc shows them,
 * for the tests that serve across ranks and kill one (test_ep,
 * test_rank_failure): the pid of a rank, whether a pid still runs, and the
 * port a job's server listens on once it is ready. */
#ifndef MT_TEST_MPI_PROCS_H
#define MT_TEST_MPI_PROCS_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

/* The pid of mpirun's child with OMPI_COMM_WORLD_RANK=rank (-1: none). */
static inline int rank_pid(int mpirun_pid, int rank)
{
    DIR *d = opendir("/proc");
    cr_assert_not_null(d);
    struct dirent *de;
    int found = -1;
    char want[64];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    while (found < 0 && (de = readdir(d))) {
        int pid = atoi(de->d_name), ppid = 0;
        char path[300], buf[4096];
        if (pid <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *rp = strrchr(buf, ')'); /* "pid (comm) state ppid ..." */
        if (!rp || sscanf(rp + 1, " %*c %d", &ppid) != 1 || ppid != mpirun_pid)
            continue;
        snprintf(path, sizeof path, "/proc/%d/environ", pid);
        if (!(f = fopen(path, "r")))
            continue;
        static char env[1 << 16];
        n = fread(env, 1, sizeof env - 1, f);
        fclose(f);
        for (size_t i = 0; i < n; i += strlen(env + i) + 1)
            if (!strcmp(env + i, want))
                found = pid;
    }
    closedir(d);
    return found;
}

/* Whether pid runs (a zombie nobody reaped has ended). */
static inline bool alive(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

/* The port of `moetune serve --port 0` once its log (at log) says
 * "ready:" (within 240 s); otherwise sends sig to mpirun_pid and fails the
 * test with the log. */
static inline int mpi_server_port(const char *log, int mpirun_pid, int sig)
{
    static char out[1 << 21]; /* the server logs its whole kernel selection */
    int port = 0;
    out[0] = 0;
    for (int i = 0; i < 2400 && !strstr(out, "ready:"); i++) {
        usleep(100000);
        out[0] = 0;
        FILE *f = fopen(log, "r");
        if (f) {
            out[fread(out, 1, sizeof out - 1, f)] = 0;
            fclose(f);
        }
        const char *u = strstr(out, "http://127.0.0.1:");
        if (u)
            port = atoi(u + strlen("http://127.0.0.1:"));
    }
    if (!strstr(out, "ready:") || port <= 0)
        kill(mpirun_pid, sig);
    cr_assert(strstr(out, "ready:") && port > 0, "server not ready:\n%s", out);
    return port;
}

#endif
