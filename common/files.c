/* files.c: whole-file read, atomic write, mkdir -p (see files.h). */
#define _GNU_SOURCE
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

mt_status mt_file_read(const char *path, char **data, size_t *len, mt_err *err)
{
    *data = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return mt_fail(err, MT_E_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return mt_fail(err, MT_E_IO, "%s: cannot seek: %s", path, strerror(errno));
    }
    long n = ftell(f);
    rewind(f);
    if (n < 0) {
        fclose(f);
        return mt_fail(err, MT_E_IO, "%s: cannot size file", path);
    }
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return mt_fail(err, MT_E_NOMEM, "%s: %ld bytes", path, n);
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || got != (size_t)n) {
        free(buf);
        return mt_fail(err, MT_E_IO, "%s: short read (%zu of %ld bytes)", path, got, n);
    }
    buf[n] = 0;
    *data = buf;
    if (len)
        *len = (size_t)n;
    return MT_OK;
}

mt_status mt_file_write_atomic(const char *path, const void *data, size_t len,
                               mt_err *err)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d.XXXXXX", path, (int)getpid()) >=
        (int)sizeof tmp)
        return mt_fail(err, MT_E_INVALID, "%s: path too long", path);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return mt_fail(err, MT_E_IO, "%s: cannot create temporary file: %s", path,
                       strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return mt_fail(err, MT_E_IO, "%s: write failed: %s", path, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        unlink(tmp);
        return mt_fail(err, MT_E_IO, "%s: sync failed: %s", path, strerror(errno));
    }
    chmod(tmp, 0644);
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return mt_fail(err, MT_E_IO, "%s: rename failed: %s", path, strerror(e));
    }
    return MT_OK;
}

mt_status mt_mkdirs(const char *path, mt_err *err)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return mt_fail(err, MT_E_INVALID, "bad folder path '%s'", path);
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return mt_fail(err, MT_E_IO, "%s: cannot create: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return mt_fail(err, MT_E_IO, "%s: cannot create: %s", buf, strerror(errno));
    return MT_OK;
}

void mt_cache_dir(char *out, size_t cap)
{
    const char *v = getenv("MOETUNE_CACHE");
    if (v && *v) {
        snprintf(out, cap, "%s", v);
        return;
    }
    v = getenv("XDG_CACHE_HOME");
    if (v && *v) {
        snprintf(out, cap, "%s/moetune", v);
        return;
    }
    v = getenv("HOME");
    if (v && *v) {
        snprintf(out, cap, "%s/.cache/moetune", v);
        return;
    }
    snprintf(out, cap, "/tmp/moetune-cache");
}

bool mt_tmp_path(char *out, size_t cap, const char *name)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return n > 0 && (size_t)n < cap;
}
