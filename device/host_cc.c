/* host_cc.c: runs the host C compiler for the cpu and emu backends, and
 * loads the shared objects it makes. The compiler is $MOETUNE_CC, else cc.
 * With GCC every module also carries a table of its kernels' parameter
 * letters (from -aux-info), so a launch asked for with the wrong argument
 * list fails at dev_module_get_kernel instead of calling the C function
 * with garbage. */
#define _GNU_SOURCE
#include "device_impl.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/files.h"

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

/* GCC writes every function's prototype with -aux-info; clang has no such
 * option, so modules it compiles carry no signature table. */
static bool cc_writes_prototypes(void)
{
    return !strstr(dev_host_cc_id(), "clang");
}

/* The hold on background compilers (device.h, dev_set_tool_hold). */
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static bool (*hold_fn)(void *);
static void *hold_ctx;
static double held_ms;
static int64_t holds;

void dev_set_tool_hold(bool (*hold)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&hold_mu);
    hold_fn = hold;
    hold_ctx = ctx;
    pthread_mutex_unlock(&hold_mu);
}

void dev_tool_hold_stats(double *held_s, int64_t *n)
{
    pthread_mutex_lock(&hold_mu);
    *held_s = held_ms / 1000;
    *n = holds;
    pthread_mutex_unlock(&hold_mu);
}

/* A tool this thread starts may be held: a hold is set and the thread is
 * a background one (SCHED_IDLE). */
static bool tool_holdable(void)
{
    pthread_mutex_lock(&hold_mu);
    bool set = hold_fn != NULL;
    pthread_mutex_unlock(&hold_mu);
    return set && sched_getscheduler(0) == SCHED_IDLE;
}

static bool tool_held(void)
{
    pthread_mutex_lock(&hold_mu);
    bool h = hold_fn && hold_fn(hold_ctx);
    pthread_mutex_unlock(&hold_mu);
    return h;
}

static void hold_count(double ms, bool stopped_now)
{
    pthread_mutex_lock(&hold_mu);
    held_ms += ms;
    holds += stopped_now;
    pthread_mutex_unlock(&hold_mu);
}

/* Waits for a holdable tool (its own process group, pid): polls every
 * millisecond, stopping the group while the hold says so. */
static int wait_held(pid_t pid, int *ws)
{
    bool stopped = false;
    double since = 0;
    for (;;) {
        pid_t r = waitpid(pid, ws, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR) {
            if (stopped)
                kill(-pid, SIGCONT);
            return -1;
        }
        bool h = tool_held();
        if (h != stopped && kill(-pid, h ? SIGSTOP : SIGCONT) == 0) {
            double now = mt_now_ms();
            if (stopped)
                hold_count(now - since, false);
            else
                hold_count(0, true);
            since = now;
            stopped = h;
        }
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    if (stopped)
        hold_count(mt_now_ms() - since, false);
    return 0;
}

/* posix_spawn, not fork: a fork of a serving process (a server compiling a
 * live swap or a tuner's candidate) copies its page tables under the
 * address-space lock and leaves every page copy-on-write, so the serving
 * threads stall and then fault on each page they write. The child keeps
 * the calling thread's scheduling class (a tuner's SCHED_IDLE); a holdable
 * one gets a process group of its own (the compiler driver and what it
 * starts stop together). */
int dev_run_tool(const char *const *argv, const char *log_path)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    if (posix_spawn_file_actions_init(&fa) != 0)
        return -1;
    if (posix_spawnattr_init(&at) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        return -1;
    }
    bool holdable = tool_holdable();
    int rc = posix_spawn_file_actions_addopen(&fa, 2, log_path, O_WRONLY | O_CREAT | O_TRUNC,
                                              0644);
    if (rc == 0)
        rc = posix_spawn_file_actions_adddup2(&fa, 2, 1);
    if (rc == 0 && holdable)
        rc = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
    if (rc == 0 && holdable)
        rc = posix_spawnattr_setpgroup(&at, 0);
    pid_t pid = -1;
    if (rc == 0)
        rc = posix_spawnp(&pid, argv[0], &fa, &at, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (rc != 0) {
        FILE *f = fopen(log_path, "w");
        if (f) {
            fprintf(f, "cannot run %s: %s\n", argv[0], strerror(rc));
            fclose(f);
        }
        return 127;
    }
    int ws = 0;
    if (holdable) {
        if (wait_held(pid, &ws) != 0)
            return -1;
    } else {
        while (waitpid(pid, &ws, 0) < 0)
            if (errno != EINTR)
                return -1;
    }
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

/* Runs argv (NULL-terminated) with stdout and stderr into the file lg;
 * appends what it wrote to *log. MT_E_COMPILE with that text on failure
 * (exit -1: it could not run, or died of a signal). */
static mt_status run_cc(const char *const *argv, const char *lg, char **log, mt_err *err)
{
    int rc = dev_run_tool(argv, lg);
    char *text = slurp_or_null(lg);
    if (rc != 0) {
        mt_status st = mt_fail(err, MT_E_COMPILE, "%s failed (exit %d):\n%s", argv[0], rc,
                               text && *text ? text : "(no output)");
        free(text);
        return st;
    }
    if (text && *text && *log) {
        size_t a = strlen(*log), b = strlen(text);
        char *both = realloc(*log, a + b + 1);
        if (both) {
            memcpy(both + a, text, b + 1);
            *log = both;
        }
        free(text);
    } else if (text && *text) {
        *log = text;
    } else {
        free(text);
    }
    return MT_OK;
}

/* The signature letter of one parameter as -aux-info prints it ("const
 * float *x", "int32_t m", "unsigned int"): 'p' for pointers, arrays and
 * functions, the letter of a 32- or 64-bit integer, float or double, and
 * '?' for a type it cannot name (a typedef of the kernel's own, a struct,
 * char or short); 0 for "..." (no table for that function). */
static char param_letter(const char *p, size_t n)
{
    if (memchr(p, '*', n) || memchr(p, '[', n) || memchr(p, '(', n))
        return 'p';
    char words[8][24];
    int nw = 0;
    for (size_t i = 0; i < n;) {
        while (i < n && (p[i] == ' ' || p[i] == '\t'))
            i++;
        size_t b = i;
        while (i < n && p[i] != ' ' && p[i] != '\t')
            i++;
        if (i == b)
            break;
        if (i - b >= sizeof words[0] || nw == 8)
            return '?';
        memcpy(words[nw], p + b, i - b);
        words[nw][i - b] = 0;
        if (!strcmp(words[nw], "..."))
            return 0;
        if (strcmp(words[nw], "const") && strcmp(words[nw], "volatile") &&
            strcmp(words[nw], "restrict") && strcmp(words[nw], "register"))
            nw++;
    }
    static const char *const type_words[] = {"int", "unsigned", "signed", "long", "short",
                                             "char", "float", "double", NULL};
    bool last_is_type = false;
    for (int i = 0; nw && type_words[i]; i++)
        last_is_type |= !strcmp(words[nw - 1], type_words[i]);
    if (nw > 1 && !last_is_type)
        nw--; /* the parameter's name */
    char t[96] = "";
    for (int i = 0; i < nw; i++) {
        if (i)
            strcat(t, " ");
        strcat(t, words[i]);
    }
    static const struct { const char *type; char letter; } known[] = {
        {"int", 'i'}, {"signed int", 'i'}, {"signed", 'i'}, {"int32_t", 'i'},
        {"unsigned int", 'u'}, {"unsigned", 'u'}, {"uint32_t", 'u'},
        /* one letter for 64-bit integers: the ABI passes both alike */
        {"long int", 'l'}, {"long long int", 'l'}, {"long", 'l'}, {"long long", 'l'},
        {"int64_t", 'l'}, {"long unsigned int", 'l'}, {"long long unsigned int", 'l'},
        {"unsigned long", 'l'}, {"unsigned long long", 'l'}, {"uint64_t", 'l'},
        {"float", 'f'}, {"double", 'd'},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(t, known[i].type))
            return known[i].letter;
    return '?';
}

/* One line of -aux-info output: "/" "* file:line:NF *" "/ extern void f (int a,
 * float *b); ...". Appends "const char mt__sig_f[] = \"ip\";" to *out for
 * an extern definition from the kernel's own text (not a system header,
 * not the runtime's mt__ functions). */
static void sig_line(const char *line, char **out, size_t *len, size_t *cap)
{
    const char *tag = strstr(line, "*/ extern ");
    const char *file = line + 3;
    if (strncmp(line, "/* ", 3) || !tag || *file == '/' || tag < file + 2 || tag[-2] != 'F')
        return;
    const char *open = strchr(tag, '(');
    if (!open)
        return;
    const char *ne = open;
    while (ne > tag && ne[-1] == ' ')
        ne--;
    const char *nb = ne;
    while (nb > tag && (isalnum((unsigned char)nb[-1]) || nb[-1] == '_'))
        nb--;
    if (nb == ne || ne - nb > 200 || !strncmp(nb, "mt__", 4))
        return;
    char letters[64];
    int nl = 0, depth = 0;
    const char *p = open + 1, *pb = p;
    for (; *p; p++) {
        if (*p == '(')
            depth++;
        else if ((*p == ',' || *p == ')') && depth == 0) {
            size_t n = (size_t)(p - pb);
            bool is_void = n == 4 && !strncmp(pb, "void", 4) && *p == ')' && nl == 0;
            if (!is_void) {
                char c = param_letter(pb, n);
                if (!c || nl == (int)sizeof letters - 1)
                    return;
                letters[nl++] = c;
            }
            if (*p == ')')
                break;
            pb = p + 1;
        } else if (*p == ')')
            depth--;
    }
    if (*p != ')')
        return;
    letters[nl] = 0;
    char buf[400];
    int n = snprintf(buf, sizeof buf, "__attribute__((visibility(\"default\"))) const char "
                     "mt__sig_%.*s[] = \"%s\";\n", (int)(ne - nb), nb, letters);
    if (n <= 0 || (size_t)n >= sizeof buf)
        return;
    if (*len + (size_t)n + 1 > *cap) {
        size_t nc = (*cap + (size_t)n + 1) * 2;
        char *g = realloc(*out, nc);
        if (!g)
            return;
        *out = g;
        *cap = nc;
    }
    memcpy(*out + *len, buf, (size_t)n + 1);
    *len += (size_t)n;
}

/* The C text of the signature table from an -aux-info file (never NULL
 * unless out of memory; empty when the file lists no kernel). */
static char *sig_table(const char *aux_path)
{
    char *aux = slurp_or_null(aux_path);
    size_t len = 0, cap = 256;
    char *out = malloc(cap);
    if (out)
        strcpy(out, "/* signature table: kernel parameters as dev_launch letters */\n");
    len = out ? strlen(out) : 0;
    for (char *line = aux, *next; out && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        sig_line(line, &out, &len, &cap);
    }
    free(aux);
    return out;
}

mt_status dev_host_cc(const char *text, const char *const *flags, int n_flags,
                      void **bytes, size_t *len, char **log, mt_err *err)
{
    *bytes = NULL;
    *len = 0;
    if (log)
        *log = NULL;
    char dir[512];
    if (!mt_tmp_path(dir, sizeof dir, "moetune-cc-XXXXXX"))
        return mt_fail(err, MT_E_IO, "%s: $TMPDIR is too long", dir);
    if (!mkdtemp(dir))
        return mt_fail(err, MT_E_IO, "cannot create a temporary folder %s: %s", dir,
                       strerror(errno));
    char src[600], obj[600], aux[600], sig[600], so[600], lg[600];
    snprintf(src, sizeof src, "%s/k.c", dir);
    snprintf(obj, sizeof obj, "%s/k.o", dir);
    snprintf(aux, sizeof aux, "%s/k.aux", dir);
    snprintf(sig, sizeof sig, "%s/sig.c", dir);
    snprintf(so, sizeof so, "%s/k.so", dir);
    snprintf(lg, sizeof lg, "%s/log", dir);
    char *logtext = NULL, *table = NULL;

    mt_status st = mt_file_write_atomic(src, text, strlen(text), err);
    if (st != MT_OK)
        goto out;

    /* With GCC: compile with -aux-info, then link the object with a table
     * of its kernels' parameter letters (mt__sig_<name>), which
     * dev_host_check_sig compares with what a launch is asked for. */
    bool with_sigs = cc_writes_prototypes();
    const char *argv[96];
    int n = 0;
    argv[n++] = cc_path();
    for (int i = 0; i < n_flags && n < 86; i++)
        argv[n++] = flags[i];
    argv[n++] = "-fPIC";
    int common = n;
    if (with_sigs) {
        argv[n++] = "-c";
        argv[n++] = "-aux-info";
        argv[n++] = aux;
        argv[n++] = "-o";
        argv[n++] = obj;
        argv[n++] = src;
        argv[n] = NULL;
        if ((st = run_cc(argv, lg, &logtext, err)) != MT_OK)
            goto out;
        table = sig_table(aux);
        if (!table) {
            st = mt_fail(err, MT_E_NOMEM, "signature table");
            goto out;
        }
        if ((st = mt_file_write_atomic(sig, table, strlen(table), err)) != MT_OK)
            goto out;
        n = common;
    }
    argv[n++] = "-shared";
    argv[n++] = "-o";
    argv[n++] = so;
    argv[n++] = with_sigs ? obj : src;
    if (with_sigs)
        argv[n++] = sig;
    argv[n++] = "-lm";
    argv[n] = NULL;
    if ((st = run_cc(argv, lg, &logtext, err)) != MT_OK)
        goto out;
    char *data = NULL;
    st = mt_file_read(so, &data, len, err);
    if (st == MT_OK)
        *bytes = data;
out:
    if (log && st == MT_OK)
        *log = logtext;
    else
        free(logtext);
    free(table);
    unlink(src);
    unlink(obj);
    unlink(aux);
    unlink(sig);
    unlink(so);
    unlink(lg);
    rmdir(dir);
    return st;
}

mt_status dev_host_check_sig(void *dl, const char *name, const char *sig, mt_err *err)
{
    char sym[256];
    if (snprintf(sym, sizeof sym, "mt__sig_%s", name) >= (int)sizeof sym)
        return MT_OK;
    dlerror();
    const char *want = dlsym(dl, sym);
    if (!want)
        return MT_OK; /* compiled without a table (clang, or an older build) */
    bool same = strlen(want) == strlen(sig);
    for (size_t i = 0; same && sig[i]; i++)
        same = want[i] == '?' || want[i] == sig[i];
    if (!same)
        return mt_fail(err, MT_E_INVALID, "kernel %s: launched with signature '%s', but its "
                       "C parameters are '%s' (%zu; p pointer, i int32, u uint32, l int64, "
                       "f float, d double, ? any)", name, sig, want, strlen(want));
    return MT_OK;
}

static bool write_all(int fd, const void *bytes, size_t len)
{
    const char *p = bytes;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        len -= (size_t)w;
    }
    return true;
}

/* Objects are loaded from anonymous memory files (memfd_create): nothing
 * on disk that a process killed while loading could leave behind (killed
 * tuner workers and ranks left $TMPDIR/moetune-so-* files). The memory
 * file stays open while its object is loaded: glibc's dlopen returns an
 * already loaded object of the same path, and /proc/self/fd/N must not
 * name a second object while the first is loaded. memfds: handle -> fd. */
typedef struct memfd_entry {
    struct memfd_entry *next;
    void *handle;
    int fd;
} memfd_entry;
static pthread_mutex_t memfd_lock = PTHREAD_MUTEX_INITIALIZER;
static memfd_entry *memfds;

/* The handle, or NULL: *tried says whether a memory file was written (the
 * object itself then failed to load: dlerror() says why); when not, memfd
 * is not available and the caller uses a file. */
static void *dlopen_memfd(const void *bytes, size_t len, bool *tried)
{
    memfd_entry *e = malloc(sizeof *e);
    int fd = e ? memfd_create("moetune-kernel", MFD_CLOEXEC) : -1;
    void *h = NULL;
    *tried = false;
    if (fd >= 0 && write_all(fd, bytes, len)) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        *tried = true;
        /* RTLD_LOCAL: each module keeps its own symbols (two configs of
         * one kernel define the same names). */
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
        if (fd >= 0)
            close(fd);
        free(e);
        return NULL;
    }
    e->handle = h;
    e->fd = fd;
    pthread_mutex_lock(&memfd_lock);
    e->next = memfds;
    memfds = e;
    pthread_mutex_unlock(&memfd_lock);
    return h;
}

void dev_host_dlclose(void *handle)
{
    if (!handle)
        return;
    dlclose(handle);
    pthread_mutex_lock(&memfd_lock);
    memfd_entry *found = NULL;
    for (memfd_entry **p = &memfds; *p; p = &(*p)->next)
        if ((*p)->handle == handle) {
            found = *p;
            *p = found->next;
            break;
        }
    pthread_mutex_unlock(&memfd_lock);
    if (found) {
        close(found->fd);
        free(found);
    }
}

mt_status dev_host_dlopen(const void *bytes, size_t len, void **handle, mt_err *err)
{
    *handle = NULL;
    bool tried;
    void *h = dlopen_memfd(bytes, len, &tried);
    if (h) {
        *handle = h;
        return MT_OK;
    }
    if (tried) /* a bad object: loading it from a file would fail again */
        return mt_fail(err, MT_E_DEVICE, "dlopen of compiled kernel failed: %s", dlerror());
    char path[512];
    if (!mt_tmp_path(path, sizeof path, "moetune-so-XXXXXX"))
        return mt_fail(err, MT_E_IO, "%s: $TMPDIR is too long", path);
    int fd = mkstemp(path);
    if (fd < 0)
        return mt_fail(err, MT_E_IO, "cannot create a temporary file %s: %s", path,
                       strerror(errno));
    bool ok = write_all(fd, bytes, len);
    close(fd);
    if (!ok) {
        unlink(path);
        return mt_fail(err, MT_E_IO, "%s: write failed", path);
    }
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    unlink(path); /* the mapping stays valid */
    if (!h)
        return mt_fail(err, MT_E_DEVICE, "dlopen of compiled kernel failed: %s",
                       dlerror());
    *handle = h;
    return MT_OK;
}
