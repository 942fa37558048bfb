/* host_cc.c: runs the host C compiler for the cpu and emu backends, and
 * loads the shared objects it makes. The compiler is $MOETUNE_CC, else cc. */
#define _GNU_SOURCE
#include "device_impl.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/files.h"

static const char *cc_path(void)
{
    const char *cc = getenv("MOETUNE_CC");
    return cc && *cc ? cc : "cc";
}

static pthread_once_t id_once = PTHREAD_ONCE_INIT;
static char id_text[256];

static void read_id(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --version 2>/dev/null", cc_path());
    FILE *p = popen(cmd, "r");
    if (!p || !fgets(id_text, sizeof id_text, p))
        snprintf(id_text, sizeof id_text, "%s (unknown version)", cc_path());
    if (p)
        pclose(p);
    id_text[strcspn(id_text, "\n")] = 0;
}

const char *dev_host_cc_id(void)
{
    pthread_once(&id_once, read_id);
    return id_text;
}

static char *slurp_or_null(const char *path)
{
    char *d = NULL;
    if (mt_file_read(path, &d, NULL, NULL) != MT_OK)
        return NULL;
    return d;
}

mt_status dev_host_cc(const char *text, const char *const *flags, int n_flags,
                      void **bytes, size_t *len, char **log, mt_err *err)
{
    *bytes = NULL;
    *len = 0;
    if (log)
        *log = NULL;
    char dir[] = "/tmp/moetune-cc-XXXXXX";
    if (!mkdtemp(dir))
        return mt_fail(err, MT_E_IO, "cannot create a temporary folder: %s",
                       strerror(errno));
    char src[64], so[64], lg[64];
    snprintf(src, sizeof src, "%s/k.c", dir);
    snprintf(so, sizeof so, "%s/k.so", dir);
    snprintf(lg, sizeof lg, "%s/log", dir);

    mt_status st = mt_file_write_atomic(src, text, strlen(text), err);
    if (st != MT_OK)
        goto out;

    const char *argv[96];
    int n = 0;
    argv[n++] = cc_path();
    for (int i = 0; i < n_flags && n < 88; i++)
        argv[n++] = flags[i];
    argv[n++] = "-fPIC";
    argv[n++] = "-shared";
    argv[n++] = "-o";
    argv[n++] = so;
    argv[n++] = src;
    argv[n++] = "-lm";
    argv[n] = NULL;

    pid_t pid = fork();
    if (pid < 0) {
        st = mt_fail(err, MT_E_IO, "fork failed: %s", strerror(errno));
        goto out;
    }
    if (pid == 0) {
        FILE *f = freopen(lg, "w", stderr);
        if (f)
            dup2(2, 1);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
        ;
    char *logtext = slurp_or_null(lg);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        st = mt_fail(err, MT_E_COMPILE, "%s failed (exit %d):\n%s", argv[0],
                     WIFEXITED(ws) ? WEXITSTATUS(ws) : -1,
                     logtext ? logtext : "(no output)");
        free(logtext);
        goto out;
    }
    if (log)
        *log = logtext;
    else
        free(logtext);
    char *data = NULL;
    st = mt_file_read(so, &data, len, err);
    if (st == MT_OK)
        *bytes = data;
out:
    unlink(src);
    unlink(so);
    unlink(lg);
    rmdir(dir);
    return st;
}

mt_status dev_host_dlopen(const void *bytes, size_t len, void **handle, mt_err *err)
{
    *handle = NULL;
    char path[] = "/tmp/moetune-so-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return mt_fail(err, MT_E_IO, "cannot create a temporary file: %s",
                       strerror(errno));
    const char *p = bytes;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            close(fd);
            unlink(path);
            return mt_fail(err, MT_E_IO, "%s: write failed", path);
        }
        p += w;
        left -= (size_t)w;
    }
    close(fd);
    /* RTLD_LOCAL: each module keeps its own symbols (two configs of one
     * kernel define the same names). */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    unlink(path); /* the mapping stays valid */
    if (!h)
        return mt_fail(err, MT_E_DEVICE, "dlopen of compiled kernel failed: %s",
                       dlerror());
    *handle = h;
    return MT_OK;
}
