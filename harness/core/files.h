/* files.h: reading input files whole, writing result files atomically, and the checks between them.
 *
 * Inputs (case files, bench JSON, peers) are read whole from any readable file: a regular file, a pipe,
 * /dev/stdin. A directory is refused by name.
 * Outputs (--json, --summary) are written to a temporary file beside the target and renamed over it
 * only when complete and synced: a reader never sees half a file, and an interrupted or failed run
 * leaves the previous file in place. A target that exists and is not a regular file (/dev/stdout, a
 * pipe) is written in place.
 */
#ifndef KVB_FILES_H
#define KVB_FILES_H

#include <stddef.h>
#include <stdio.h>

/* The whole of path into *text (NUL-terminated, *len bytes; free() it). KVB_OK, or KVB_EIO /
 * KVB_EINVAL / KVB_ENOMEM with kvb_last_error() naming the path: missing, unreadable, a directory, or
 * larger than 1 GiB. */
int kvb_read_file(const char *path, char **text, size_t *len);

/* 1 when both paths exist and name the same file (device and inode, after symbolic links). */
int kvb_same_file(const char *a, const char *b);

/* The offset of the first byte of s[0..n) that is not part of a valid UTF-8 sequence (overlong forms,
 * surrogates and code points past U+10FFFF are invalid), or n when all of it is valid. */
size_t kvb_utf8_invalid_at(const char *s, size_t n);

typedef struct kvb_outfile {
    char path[4096]; /* the file written (symbolic links resolved) */
    char tmp[4096];  /* the temporary beside it; "" when written in place */
    FILE *f;         /* open for writing; the caller may close it and write tmp by name (then f = NULL) */
} kvb_outfile;

/* Start writing path: a temporary file in its directory. NULL with kvb_last_error() naming the path
 * (a directory, a directory that cannot be written). */
FILE *kvb_outfile_open(kvb_outfile *o, const char *path);
/* Flush, fsync and close, then rename over the target (and sync its directory). KVB_OK, or KVB_EIO
 * with the temporary removed and the target untouched. */
int kvb_outfile_commit(kvb_outfile *o);
/* Close and remove the temporary; the target is untouched. */
void kvb_outfile_discard(kvb_outfile *o);

#endif
