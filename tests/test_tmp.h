/* test_tmp.h: temporary directories and files for tests. They go under
 * $TMPDIR (else /tmp), so scripts/test.sh can run the suite in an empty
 * directory and check it stays empty, and each is removed, with everything
 * in it, when the test process that made it exits (pass or fail; a test
 * killed by a timeout or a signal leaves its directory behind). Removing one
 * earlier with tmp_rm_tree is fine. Not thread safe: make them from the
 * test's own thread. */
#ifndef TEST_TMP_H
#define TEST_TMP_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/files.h"

#define TMP_MAX_PATHS 64

/* Paths to remove at exit, and the process that registered them: a forked
 * child that calls exit() must not delete its parent's files. */
static struct {
    pid_t owner;
    int n;
    char path[TMP_MAX_PATHS][512];
} tmp_reg;

/* Removes path and, for a directory, everything under it (symlinks are
 * removed, not followed). A missing path is not an error. */
static inline void tmp_rm_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d))) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                    continue;
                char sub[4096];
                if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) < (int)sizeof sub)
                    tmp_rm_tree(sub);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

static void tmp_cleanup(void)
{
    if (tmp_reg.owner != getpid())
        return;
    for (int i = 0; i < tmp_reg.n; i++)
        tmp_rm_tree(tmp_reg.path[i]);
    tmp_reg.n = 0;
}

static inline void tmp_register(const char *path)
{
    if (tmp_reg.owner != getpid()) {
        tmp_reg.owner = getpid();
        tmp_reg.n = 0;
        atexit(tmp_cleanup);
    }
    cr_assert_lt(tmp_reg.n, TMP_MAX_PATHS, "test_tmp.h: too many temporary paths");
    snprintf(tmp_reg.path[tmp_reg.n++], sizeof tmp_reg.path[0], "%s", path);
}

static inline void tmp_template(char *out, size_t cap, const char *prefix)
{
    const char *root = getenv("TMPDIR");
    if (!root || !*root)
        root = "/tmp";
    int n = snprintf(out, cap, "%s/%s_XXXXXX", root, prefix);
    cr_assert(n > 0 && (size_t)n < cap, "test_tmp.h: path too long under %s", root);
}

/* A fresh directory $TMPDIR/<prefix>_XXXXXX into out (cap bytes). */
static inline void tmp_dir_make(char *out, size_t cap, const char *prefix)
{
    tmp_template(out, cap, prefix);
    cr_assert_not_null(mkdtemp(out), "mkdtemp %s", out);
    tmp_register(out);
}

/* The same, heap-allocated (the caller frees it). */
static inline char *tmp_dir_dup(const char *prefix)
{
    char buf[512];
    tmp_dir_make(buf, sizeof buf, prefix);
    char *s = strdup(buf);
    cr_assert_not_null(s);
    return s;
}

/* A fresh empty file $TMPDIR/<prefix>_XXXXXX; returns its open descriptor. */
static inline int tmp_file_make(char *out, size_t cap, const char *prefix)
{
    tmp_template(out, cap, prefix);
    int fd = mkstemp(out);
    cr_assert_geq(fd, 0, "mkstemp %s", out);
    tmp_register(out);
    return fd;
}

/* For tests that pin the compile cache's behaviour (a second compile is a
 * hit): when the cache folder (mt_cache_dir, e.g. a read-only
 * $MOETUNE_CACHE) cannot be written, points MOETUNE_CACHE at a fresh
 * temporary folder for the rest of this test process and its children. */
static inline void tmp_cache_make_writable(void)
{
    char dir[2048];
    mt_cache_dir(dir, sizeof dir);
    if (mt_mkdirs(dir, NULL) == MT_OK && access(dir, W_OK) == 0)
        return;
    char fresh[512];
    tmp_dir_make(fresh, sizeof fresh, "mt_cache");
    cr_assert_eq(setenv("MOETUNE_CACHE", fresh, 1), 0);
}

#endif
