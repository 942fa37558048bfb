/* files.h: small filesystem helpers shared by the compile cache, the
 * database tools and the model loader. All return an mt_status and name the
 * path at fault in err. */
#ifndef MT_FILES_H
#define MT_FILES_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

/* Reads a whole file into a malloc'd, NUL-terminated buffer the caller frees.
 * *len (if non-NULL) receives the size without the NUL. */
mt_status mt_file_read(const char *path, char **data, size_t *len, mt_err *err);

/* Writes data to path atomically: a temporary file in the same folder, fsync,
 * then rename, so concurrent readers see the old or the new file whole. */
mt_status mt_file_write_atomic(const char *path, const void *data, size_t len,
                               mt_err *err);

/* mkdir -p. */
mt_status mt_mkdirs(const char *path, mt_err *err);

/* The cache folder: $MOETUNE_CACHE, else $XDG_CACHE_HOME/moetune, else
 * $HOME/.cache/moetune, else /tmp/moetune-cache. Written into out. */
void mt_cache_dir(char *out, size_t cap);

/* A path for a temporary file or folder: $TMPDIR/name, else /tmp/name,
 * written into out (cap bytes; false when it does not fit). Callers make it
 * unique (mkdtemp, mkstemp) and remove it. */
bool mt_tmp_path(char *out, size_t cap, const char *name);

#endif
