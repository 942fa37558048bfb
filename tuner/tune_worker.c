/* tune_worker.c: the measurement worker and the spawner that forks it.
 *
 * The tuner forks a spawner first, while it is still single-threaded and
 * has no device open. The spawner forks one worker per request (fork, no
 * exec: families compiled into the binary, test-only ones included, are
 * valid in the worker at the same addresses). A worker opens the device
 * itself, so a GPU runtime never crosses a fork, and serves requests over a
 * socket pair: prepare a problem, measure a compiled candidate. When a
 * candidate kills the worker (a signal) or hangs past its timeout, the tuner
 * sees EOF or its deadline pass, kills the worker, asks the spawner to reap
 * it (which yields the signal), and starts another.
 *
 * Sockets rather than pipes: send() with MSG_NOSIGNAL reports a dead peer
 * as EPIPE instead of raising SIGPIPE in the tuner. */
#define _GNU_SOURCE /* SCHED_IDLE */
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/sha256.h"
#include "tune_impl.h"

/* ---- framing --------------------------------------------------------------- */

enum { MSG_HELLO = 1, MSG_PREPARE = 2, MSG_MEASURE = 3, MSG_REPLY = 4, MSG_PAIRED = 5 };

typedef struct msg_head {
    uint32_t kind;
    uint32_t pad;
    uint64_t len;
} msg_head;

static bool send_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static bool send_msg(int fd, uint32_t kind, const void *a, size_t na, const void *b, size_t nb)
{
    msg_head h = {kind, 0, (uint64_t)(na + nb)};
    return send_all(fd, &h, sizeof h) && send_all(fd, a, na) && (!nb || send_all(fd, b, nb));
}

/* Blocking read of exactly n bytes (worker side): false on EOF or error. */
static bool recv_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

/* Tuner side: reads exactly n bytes before deadline_ms (<= 0: none),
 * polling in 100 ms slices so a stop request is seen. */
static mt_status recv_deadline(int fd, void *buf, size_t n, double deadline_ms,
                               volatile sig_atomic_t *stop)
{
    char *p = buf;
    while (n) {
        if (tune_stopped(stop))
            return MT_E_INTERRUPTED;
        double now = mt_now_ms();
        if (deadline_ms > 0 && now >= deadline_ms)
            return MT_E_TIMEOUT;
        int slice = 100;
        if (deadline_ms > 0 && deadline_ms - now < slice)
            slice = (int)(deadline_ms - now) + 1;
        struct pollfd pf = {fd, POLLIN, 0};
        int r = poll(&pf, 1, slice);
        if (r < 0 && errno != EINTR)
            return MT_E_CRASH;
        if (r <= 0)
            continue;
        ssize_t got = read(fd, p, n);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got <= 0)
            return MT_E_CRASH; /* EOF: the worker died */
        p += got;
        n -= (size_t)got;
    }
    return MT_OK;
}

/* ---- the worker process ---------------------------------------------------- */

typedef struct hello_msg {
    int32_t status;
    char msg[1024];
    dev_props props;
} hello_msg;

typedef struct prepare_msg {
    uintptr_t fam;   /* same binary, no exec: the address is valid here */
    kern_shape shape;
    int64_t m;
    uint64_t seed;
} prepare_msg;

typedef struct reply_msg {
    int32_t status;
    char msg[1536];
} reply_msg;

typedef struct measure_msg {
    kern_config cfg;
    uint32_t flags;
    uint32_t timeout_ms;
    kern_time_opts topts;
} measure_msg;

typedef struct paired_msg {
    int32_t n;
    int32_t rounds;
    kern_config cfg[TUNE_PAIRED_MAX_CONFIGS];
    uint64_t len[TUNE_PAIRED_MAX_CONFIGS]; /* code bytes follow, config 0's first */
    uint32_t timeout_ms;
    uint32_t pad;
    kern_time_opts topts;
} paired_msg;

typedef struct worker_state {
    dev_device *dev;
    kern_problem *prob;  /* at the tuned M: timing, determinism */
    kern_problem *vprob; /* with the reference, at kern_verify_m: verification;
                          * the same object as prob when that is M itself */
} worker_state;

static void worker_drop_problems(worker_state *w)
{
    if (w->vprob != w->prob)
        kern_problem_destroy(w->vprob);
    kern_problem_destroy(w->prob);
    w->prob = w->vprob = NULL;
}

/* Verification runs at the largest M whose plain C reference stays cheap
 * (kern_verify_m); timing always runs at the tuned M. */
static void worker_prepare(worker_state *w, const prepare_msg *rq, reply_msg *rp)
{
    mt_err err = MT_ERR_INIT;
    worker_drop_problems(w);
    const kern_family *f = (const kern_family *)rq->fam;
    int64_t vm = kern_verify_m(f, &rq->shape, rq->m, KERN_VERIFY_MAX_FLOPS);
    rp->status = kern_problem_create(w->dev, f, &rq->shape, vm, rq->seed, &w->vprob, &err);
    if (rp->status == MT_OK && vm == rq->m)
        w->prob = w->vprob;
    else if (rp->status == MT_OK)
        rp->status = kern_problem_create_ex(w->dev, f, &rq->shape, rq->m, rq->seed ^ 0x5eed,
                                            KERN_PROBLEM_NO_REFERENCE, &w->prob, &err);
    snprintf(rp->msg, sizeof rp->msg, "%.1500s", err.msg);
}

/* Hash of every output buffer after one run. */
static mt_status output_digest(kern_problem *p, kern_exec *e, uint8_t out[32], mt_err *err)
{
    mt_status st = kern_problem_run(p, e, err);
    if (st != MT_OK)
        return st;
    mt_sha256 h;
    mt_sha256_init(&h);
    for (int i = 0; i < kern_problem_n_bufs(p); i++) {
        const kern_buf_desc *b = kern_problem_buf(p, i);
        if (b->role == KERN_BUF_IN)
            continue;
        void *host = malloc(b->bytes ? b->bytes : 1);
        if (!host)
            return mt_fail(err, MT_E_NOMEM, "output %s", b->name);
        st = kern_problem_download(p, i, host, err);
        if (st == MT_OK)
            mt_sha256_update(&h, host, b->bytes);
        free(host);
        if (st != MT_OK)
            return st;
    }
    mt_sha256_final(&h, out);
    return MT_OK;
}

static void worker_measure(worker_state *w, const measure_msg *rq, const void *bytes,
                           size_t len, tune_measure *rp)
{
    mt_err err = MT_ERR_INIT;
    memset(rp, 0, sizeof *rp);
    rp->deterministic = -1;
    dev_code *code = NULL;
    kern_exec *e = NULL;
    mt_status st = MT_OK;
    snprintf(rp->step, sizeof rp->step, "load");
    if (!w->prob)
        st = mt_fail(&err, MT_E_INVALID, "measure before prepare");
    if (st == MT_OK)
        st = dev_code_from_bytes(w->dev, bytes, len, &code, &err);
    if (st == MT_OK)
        st = kern_exec_open_code(w->dev, kern_problem_family(w->prob),
                                 kern_problem_shape(w->prob), &rq->cfg, code, &e, &err);
    dev_set_launch_timeout(w->dev, rq->timeout_ms);
    if (st == MT_OK && (rq->flags & TUNE_W_VERIFY)) {
        snprintf(rp->step, sizeof rp->step, "run");
        st = kern_problem_run(w->vprob, e, &err);
        if (st == MT_OK) {
            snprintf(rp->step, sizeof rp->step, "verify");
            st = kern_problem_verify(w->vprob, &err);
        }
    }
    if (st == MT_OK && (rq->flags & TUNE_W_TIME)) {
        snprintf(rp->step, sizeof rp->step, "time");
        st = kern_problem_time(w->prob, e, &rq->topts, &rp->timing, &err);
    }
    if (st == MT_OK && (rq->flags & TUNE_W_DETERMINISM)) {
        snprintf(rp->step, sizeof rp->step, "determinism");
        uint8_t a[32], b[32];
        st = output_digest(w->prob, e, a, &err);
        if (st == MT_OK)
            st = output_digest(w->prob, e, b, &err);
        if (st == MT_OK)
            rp->deterministic = memcmp(a, b, 32) == 0;
    }
    rp->status = st;
    snprintf(rp->msg, sizeof rp->msg, "%.1500s", err.msg);
    kern_exec_close(e); /* frees the code too */
}

static mt_status load_exec(worker_state *w, const kern_config *cfg, const void *bytes,
                           size_t len, kern_exec **e, mt_err *err)
{
    dev_code *code = NULL;
    mt_status st = dev_code_from_bytes(w->dev, bytes, len, &code, err);
    if (st == MT_OK)
        st = kern_exec_open_code(w->dev, kern_problem_family(w->prob),
                                 kern_problem_shape(w->prob), cfg, code, e, err);
    return st;
}

int tune_paired_order(int n, int round, int pos)
{
    int start = (round / 2) % n;
    return round % 2 == 0 ? (start + pos) % n : (start + n - 1 - pos) % n;
}

static void worker_paired(worker_state *w, const paired_msg *rq, const void *bytes,
                          tune_paired *rp)
{
    mt_err err = MT_ERR_INIT;
    memset(rp, 0, sizeof *rp);
    rp->failed = -1;
    rp->n = rq->n;
    kern_exec *e[TUNE_PAIRED_MAX_CONFIGS] = {0};
    mt_status st = MT_OK;
    snprintf(rp->step, sizeof rp->step, "load");
    if (!w->prob)
        st = mt_fail(&err, MT_E_INVALID, "paired timing before prepare");
    const char *code = bytes;
    for (int i = 0; i < rq->n && st == MT_OK; i++) {
        st = load_exec(w, &rq->cfg[i], code, (size_t)rq->len[i], &e[i], &err);
        code += rq->len[i];
        if (st != MT_OK)
            rp->failed = i;
    }
    dev_set_launch_timeout(w->dev, rq->timeout_ms);
    int rounds = rq->rounds < TUNE_CONFIRM_MAX_ROUNDS ? rq->rounds : TUNE_CONFIRM_MAX_ROUNDS;
    snprintf(rp->step, sizeof rp->step, "time");
    for (int r = 0; r < rounds && st == MT_OK; r++) {
        for (int k = 0; k < rq->n && st == MT_OK; k++) {
            int i = tune_paired_order(rq->n, r, k);
            kern_timing t;
            st = kern_problem_time(w->prob, e[i], &rq->topts, &t, &err);
            if (st == MT_OK) {
                rp->ms[i][r] = t.median_ms;
                rp->reps = t.reps;
            } else {
                rp->failed = i;
            }
        }
        if (st == MT_OK)
            rp->rounds = r + 1;
    }
    rp->status = st;
    snprintf(rp->msg, sizeof rp->msg, "%.1000s", err.msg);
    for (int i = 0; i < rq->n; i++)
        kern_exec_close(e[i]);
}

static void worker_main(int fd, const char *spec, const char *arch)
{
    signal(SIGINT, SIG_IGN); /* Ctrl-C is the tuner's to handle */
    worker_state w = {0};
    hello_msg *hello = calloc(1, sizeof *hello);
    if (!hello)
        _exit(3);
    mt_err err = MT_ERR_INIT;
    dev_open_opts oo = {.arch = arch && *arch ? arch : NULL, .threads = 0};
    hello->status = dev_open(spec, &oo, &w.dev, &err);
    snprintf(hello->msg, sizeof hello->msg, "%.1000s", err.msg);
    if (w.dev)
        hello->props = *dev_get_props(w.dev);
    bool ok = send_msg(fd, MSG_HELLO, hello, sizeof *hello, NULL, 0);
    free(hello);
    if (!ok || !w.dev)
        _exit(2);
    for (;;) {
        msg_head h;
        if (!recv_all(fd, &h, sizeof h))
            break;
        if (h.kind == MSG_PREPARE && h.len == sizeof(prepare_msg)) {
            prepare_msg rq;
            reply_msg rp = {0};
            if (!recv_all(fd, &rq, sizeof rq))
                break;
            worker_prepare(&w, &rq, &rp);
            if (!send_msg(fd, MSG_REPLY, &rp, sizeof rp, NULL, 0))
                break;
        } else if (h.kind == MSG_MEASURE && h.len >= sizeof(measure_msg)) {
            measure_msg rq;
            size_t len = (size_t)h.len - sizeof rq;
            void *bytes = malloc(len ? len : 1);
            tune_measure *rp = calloc(1, sizeof *rp);
            if (!bytes || !rp || !recv_all(fd, &rq, sizeof rq) || !recv_all(fd, bytes, len))
                break;
            worker_measure(&w, &rq, bytes, len, rp);
            ok = send_msg(fd, MSG_REPLY, rp, sizeof *rp, NULL, 0);
            free(bytes);
            free(rp);
            if (!ok)
                break;
        } else if (h.kind == MSG_PAIRED && h.len >= sizeof(paired_msg)) {
            paired_msg rq;
            size_t len = (size_t)h.len - sizeof rq;
            void *bytes = malloc(len ? len : 1);
            tune_paired *rp = calloc(1, sizeof *rp);
            if (!bytes || !rp || !recv_all(fd, &rq, sizeof rq) || !recv_all(fd, bytes, len) ||
                rq.n < 2 || rq.n > TUNE_PAIRED_MAX_CONFIGS)
                break;
            uint64_t sum = 0;
            for (int i = 0; i < rq.n; i++)
                sum += rq.len[i];
            if (sum != len)
                break;
            worker_paired(&w, &rq, bytes, rp);
            ok = send_msg(fd, MSG_REPLY, rp, sizeof *rp, NULL, 0);
            free(bytes);
            free(rp);
            if (!ok)
                break;
        } else {
            break; /* protocol error: the tuner sees EOF */
        }
    }
    worker_drop_problems(&w);
    dev_close(w.dev);
    _exit(0);
}

/* ---- the spawner process ---------------------------------------------------- */

enum { SP_SPAWN = 1, SP_REAP = 2 };

typedef struct sp_req {
    int32_t op;
    int32_t pid;
    char spec[64];
    char arch[64];
} sp_req;

typedef struct sp_reply {
    int32_t pid;      /* SP_SPAWN: the worker, -1 on failure */
    int32_t wstatus;  /* SP_REAP: waitpid status */
    int32_t ok;
} sp_reply;

struct tune_spawner {
    int fd;
    pid_t pid;
};

struct tune_worker {
    tune_spawner *sp;
    int fd;
    pid_t pid;
    bool dead;
};

#define SP_MAX_KIDS 64

static void spawner_main(int ch, int nice_incr)
{
    signal(SIGINT, SIG_IGN);
    if (nice_incr > 0 && nice(nice_incr) == -1) {
        /* still at the caller's priority: measurements run, only less politely */
    }
    /* The lowest: run only where nothing else wants the core, so a
     * serving thread that wakes up takes the core at once. */
    struct sched_param no_prio = {0};
    if (nice_incr >= 19)
        sched_setscheduler(0, SCHED_IDLE, &no_prio);
    pid_t kids[SP_MAX_KIDS];
    int n_kids = 0;
    for (;;) {
        sp_req rq;
        char cbuf[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {&rq, sizeof rq};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                            .msg_controllen = sizeof cbuf};
        ssize_t r = recvmsg(ch, &mh, MSG_WAITALL);
        if (r < 0 && errno == EINTR)
            continue;
        if (r != (ssize_t)sizeof rq)
            break; /* the tuner is gone */
        sp_reply rp = {-1, 0, 0};
        if (rq.op == SP_SPAWN) {
            int wfd = -1;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            if (cm && cm->cmsg_type == SCM_RIGHTS)
                memcpy(&wfd, CMSG_DATA(cm), sizeof wfd);
            rq.spec[sizeof rq.spec - 1] = 0;
            rq.arch[sizeof rq.arch - 1] = 0;
            pid_t pid = wfd >= 0 && n_kids < SP_MAX_KIDS ? fork() : -1;
            if (pid == 0) {
                close(ch);
                worker_main(wfd, rq.spec, rq.arch);
            }
            if (wfd >= 0)
                close(wfd);
            if (pid > 0)
                kids[n_kids++] = pid;
            rp.pid = pid;
            rp.ok = pid > 0;
        } else if (rq.op == SP_REAP) {
            int ws = 0;
            pid_t got;
            do
                got = waitpid(rq.pid, &ws, 0);
            while (got < 0 && errno == EINTR);
            rp.ok = got == rq.pid;
            rp.wstatus = ws;
            rp.pid = rq.pid;
            for (int i = 0; i < n_kids; i++)
                if (kids[i] == rq.pid) {
                    kids[i] = kids[--n_kids];
                    break;
                }
        }
        if (!send_all(ch, &rp, sizeof rp))
            break;
    }
    for (int i = 0; i < n_kids; i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
    }
    _exit(0);
}

mt_status tune_spawner_start(tune_spawner **out, mt_err *err)
{
    return tune_spawner_open(0, out, err);
}

void tune_spawner_close(tune_spawner *s) { tune_spawner_stop(s); }

mt_status tune_spawner_open(int nice_incr, tune_spawner **out, mt_err *err)
{
    *out = NULL;
    if (nice_incr < 0 || nice_incr > 19)
        return mt_fail(err, MT_E_INVALID, "tuner: niceness increment %d (0..19)", nice_incr);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return mt_fail(err, MT_E_IO, "tuner: socketpair for the worker spawner: %s",
                       strerror(errno));
    tune_spawner *s = calloc(1, sizeof *s);
    if (!s) {
        close(sv[0]);
        close(sv[1]);
        return mt_fail(err, MT_E_NOMEM, "worker spawner");
    }
    fflush(NULL); /* nothing buffered may be written twice */
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        free(s);
        return mt_fail(err, MT_E_IO, "tuner: fork of the worker spawner: %s",
                       strerror(errno));
    }
    if (pid == 0) {
        close(sv[0]);
        spawner_main(sv[1], nice_incr);
    }
    close(sv[1]);
    s->fd = sv[0];
    s->pid = pid;
    *out = s;
    return MT_OK;
}

void tune_spawner_stop(tune_spawner *s)
{
    if (!s)
        return;
    close(s->fd); /* the spawner kills its workers and exits */
    while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    free(s);
}

static mt_status spawner_call(tune_spawner *s, const sp_req *rq, int pass_fd, sp_reply *rp,
                              mt_err *err)
{
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {(void *)rq, sizeof *rq};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (pass_fd >= 0) {
        mh.msg_control = cbuf;
        mh.msg_controllen = sizeof cbuf;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof pass_fd);
    }
    ssize_t w;
    do
        w = sendmsg(s->fd, &mh, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w != (ssize_t)sizeof *rq || !recv_all(s->fd, rp, sizeof *rp))
        return mt_fail(err, MT_E_CRASH, "tuner: the worker spawner (pid %d) is gone",
                       (int)s->pid);
    return MT_OK;
}

/* Reaps a worker that is dead or killed; describes how it ended. */
static void reap(tune_worker *w, char *how, size_t cap)
{
    sp_req rq = {.op = SP_REAP, .pid = w->pid};
    sp_reply rp;
    if (how)
        snprintf(how, cap, "worker ended");
    if (spawner_call(w->sp, &rq, -1, &rp, NULL) != MT_OK || !rp.ok)
        return;
    if (!how)
        return;
    if (WIFSIGNALED(rp.wstatus))
        snprintf(how, cap, "worker killed by signal %d (%s)", WTERMSIG(rp.wstatus),
                 strsignal(WTERMSIG(rp.wstatus)));
    else if (WIFEXITED(rp.wstatus))
        snprintf(how, cap, "worker exited with status %d", WEXITSTATUS(rp.wstatus));
}

void tune_worker_stop(tune_worker *w)
{
    if (!w)
        return;
    close(w->fd); /* a live worker exits on EOF; kill it anyway */
    if (w->pid > 0) {
        kill(w->pid, SIGKILL);
        reap(w, NULL, 0);
    }
    free(w);
}

mt_status tune_worker_start(tune_spawner *s, const char *spec, const char *arch,
                            double timeout_s, volatile sig_atomic_t *stop, tune_worker **out,
                            dev_props *props, mt_err *err)
{
    *out = NULL;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return mt_fail(err, MT_E_IO, "tuner: socketpair for a worker: %s", strerror(errno));
    sp_req rq = {.op = SP_SPAWN};
    snprintf(rq.spec, sizeof rq.spec, "%s", spec ? spec : "auto");
    snprintf(rq.arch, sizeof rq.arch, "%s", arch ? arch : "");
    sp_reply rp;
    mt_status st = spawner_call(s, &rq, sv[1], &rp, err);
    close(sv[1]);
    if (st == MT_OK && !rp.ok)
        st = mt_fail(err, MT_E_IO, "tuner: the spawner could not fork a worker");
    if (st != MT_OK) {
        close(sv[0]);
        return st;
    }
    tune_worker *w = calloc(1, sizeof *w);
    if (!w) {
        close(sv[0]);
        return mt_fail(err, MT_E_NOMEM, "worker");
    }
    w->sp = s;
    w->fd = sv[0];
    w->pid = rp.pid;
    msg_head h;
    hello_msg *hello = calloc(1, sizeof *hello);
    double deadline = timeout_s > 0 ? mt_now_ms() + timeout_s * 1000 : 0;
    st = hello ? recv_deadline(w->fd, &h, sizeof h, deadline, stop) : MT_E_NOMEM;
    if (st == MT_OK && (h.kind != MSG_HELLO || h.len != sizeof *hello))
        st = MT_E_CRASH;
    if (st == MT_OK)
        st = recv_deadline(w->fd, hello, sizeof *hello, deadline, stop);
    if (st == MT_OK && hello->status != MT_OK)
        st = mt_fail(err, (mt_status)hello->status, "worker: %s", hello->msg);
    else if (st != MT_OK) {
        char how[128];
        kill(w->pid, SIGKILL);
        reap(w, how, sizeof how);
        w->pid = 0;
        st = mt_fail(err, st, "worker opening device %s: %s", rq.spec,
                     st == MT_E_TIMEOUT ? "timed out" : how);
    }
    if (st == MT_OK && props)
        *props = hello->props;
    free(hello);
    if (st != MT_OK) {
        tune_worker_stop(w);
        return st;
    }
    *out = w;
    return MT_OK;
}

/* The worker died, hung or must stop: kill and reap it, describe the end. */
static mt_status worker_lost(tune_worker *w, mt_status st, double timeout_s, mt_err *err)
{
    char how[128];
    if (w->pid > 0) {
        kill(w->pid, SIGKILL);
        reap(w, how, sizeof how);
    } else {
        snprintf(how, sizeof how, "worker gone");
    }
    w->pid = 0;
    w->dead = true;
    if (st == MT_E_TIMEOUT)
        return mt_fail(err, st, "no answer within %.1f s: worker killed", timeout_s);
    if (st == MT_E_INTERRUPTED)
        return mt_fail(err, st, "interrupted: worker killed");
    return mt_fail(err, MT_E_CRASH, "%s", how);
}

/* Reads a reply of exactly n bytes before deadline (<= 0: none). */
static mt_status read_reply(tune_worker *w, void *buf, size_t n, double deadline,
                            volatile sig_atomic_t *stop, double timeout_s, mt_err *err)
{
    msg_head h;
    mt_status st = recv_deadline(w->fd, &h, sizeof h, deadline, stop);
    if (st == MT_OK && (h.kind != MSG_REPLY || h.len != n))
        st = MT_E_CRASH;
    if (st == MT_OK)
        st = recv_deadline(w->fd, buf, n, deadline, stop);
    return st == MT_OK ? MT_OK : worker_lost(w, st, timeout_s, err);
}

mt_status tune_worker_prepare(tune_worker *w, const kern_family *fam, const kern_shape *s,
                              int64_t m, uint64_t data_seed, volatile sig_atomic_t *stop,
                              mt_err *err)
{
    prepare_msg rq = {(uintptr_t)fam, *s, m, data_seed};
    reply_msg rp;
    mt_status st = MT_OK;
    if (w->dead || !send_msg(w->fd, MSG_PREPARE, &rq, sizeof rq, NULL, 0))
        st = worker_lost(w, MT_E_CRASH, 0, err);
    else
        st = read_reply(w, &rp, sizeof rp, 0, stop, 0, err);
    if (st != MT_OK)
        return mt_err_prefix(err, "preparing %s M=%lld in the worker", fam->name,
                             (long long)m);
    if (rp.status != MT_OK)
        return mt_fail(err, (mt_status)rp.status, "preparing %s M=%lld: %s", fam->name,
                       (long long)m, rp.msg);
    return MT_OK;
}

mt_status tune_worker_measure(tune_worker *w, const kern_config *cfg, const void *code,
                              size_t code_len, unsigned flags, const kern_time_opts *topts,
                              double timeout_s, volatile sig_atomic_t *stop,
                              tune_measure *out, mt_err *err)
{
    measure_msg rq;
    memset(&rq, 0, sizeof rq);
    rq.cfg = *cfg;
    rq.flags = flags;
    rq.timeout_ms = timeout_s > 0 ? (uint32_t)(timeout_s * 1000) : 0;
    if (topts)
        rq.topts = *topts;
    else
        kern_time_opts_default(&rq.topts);
    double deadline = timeout_s > 0 ? mt_now_ms() + timeout_s * 1000 : 0;
    if (w->dead || !send_msg(w->fd, MSG_MEASURE, &rq, sizeof rq, code, code_len))
        return worker_lost(w, MT_E_CRASH, timeout_s, err);
    return read_reply(w, out, sizeof *out, deadline, stop, timeout_s, err);
}

mt_status tune_worker_paired(tune_worker *w, int n, const kern_config *cfgs,
                             const void *const *codes, const size_t *lens, int rounds,
                             const kern_time_opts *topts, double timeout_s,
                             volatile sig_atomic_t *stop, tune_paired *out, mt_err *err)
{
    if (n < 2 || n > TUNE_PAIRED_MAX_CONFIGS)
        return mt_fail(err, MT_E_INVALID, "paired timing of %d configs (2 to %d)", n,
                       TUNE_PAIRED_MAX_CONFIGS);
    paired_msg rq;
    memset(&rq, 0, sizeof rq);
    rq.n = n;
    uint64_t total = sizeof rq;
    for (int i = 0; i < n; i++) {
        rq.cfg[i] = cfgs[i];
        rq.len[i] = lens[i];
        total += lens[i];
    }
    rq.rounds = rounds;
    rq.timeout_ms = timeout_s > 0 ? (uint32_t)(timeout_s * 1000) : 0;
    if (topts)
        rq.topts = *topts;
    else
        kern_time_opts_default(&rq.topts);
    double deadline = timeout_s > 0 ? mt_now_ms() + timeout_s * 1000 : 0;
    msg_head h = {MSG_PAIRED, 0, total};
    bool sent = !w->dead && send_all(w->fd, &h, sizeof h) && send_all(w->fd, &rq, sizeof rq);
    for (int i = 0; sent && i < n; i++)
        sent = send_all(w->fd, codes[i], lens[i]);
    if (!sent)
        return worker_lost(w, MT_E_CRASH, timeout_s, err);
    return read_reply(w, out, sizeof *out, deadline, stop, timeout_s, err);
}

int tune_worker_pid(const tune_worker *w) { return w ? (int)w->pid : 0; }

double tune_worker_cpu_ms(const tune_worker *w)
{
    if (!w || w->dead || w->pid <= 0)
        return -1;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)w->pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    double ns = 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[320];
        snprintf(p, sizeof p, "%s/%.64s/schedstat", path, e->d_name);
        FILE *f = fopen(p, "r");
        unsigned long long run = 0;
        if (f && fscanf(f, "%llu", &run) == 1) {
            ns += (double)run;
            n++;
        }
        if (f)
            fclose(f);
    }
    closedir(d);
    return n ? ns * 1e-6 : -1;
}
