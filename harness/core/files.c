/* files.c: see files.h. */
#include "harness/core/files.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "reference/kvb.h"

#define READ_LIMIT ((size_t)1 << 30) /* 1 GiB: far beyond any case or result file */

int kvb_read_file(const char *path, char **text, size_t *len)
{
    *text = NULL, *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvb_fail(KVB_EIO, "%s: cannot read: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kvb_fail(KVB_EIO, "%s: cannot read: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return kvb_fail(KVB_EINVAL, "%s: is a directory, not a file", path);
    }
    /* in chunks until the end: regular files, pipes and terminals alike (a size from stat or ftell is
     * not known for a pipe) */
    /* a regular file: its size, plus room for the NUL and for the read that finds the end */
    size_t cap = S_ISREG(st.st_mode) && st.st_size > 0 && (size_t)st.st_size < READ_LIMIT ? (size_t)st.st_size + 2 : 65536;
    size_t n = 0;
    char *buf = malloc(cap);
    int rc = buf ? KVB_OK : kvb_fail(KVB_ENOMEM, "%s: out of memory reading it", path);
    while (rc == KVB_OK) {
        if (n + 1 >= cap) {
            if (cap > READ_LIMIT) {
                rc = kvb_fail(KVB_EINVAL, "%s: larger than %zu MiB: not a case or result file", path, READ_LIMIT >> 20);
                break;
            }
            char *grown = realloc(buf, 2 * cap);
            if (!grown) {
                rc = kvb_fail(KVB_ENOMEM, "%s: out of memory reading it (%zu bytes)", path, 2 * cap);
                break;
            }
            buf = grown, cap *= 2;
        }
        ssize_t got = read(fd, buf + n, cap - n - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) rc = kvb_fail(KVB_EIO, "%s: cannot read: %s", path, strerror(errno));
        if (got <= 0) break;
        n += (size_t)got;
    }
    close(fd);
    if (rc != KVB_OK) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *text = buf, *len = n;
    return KVB_OK;
}

int kvb_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (!a || !b || stat(a, &sa) != 0 || stat(b, &sb) != 0) return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

size_t kvb_utf8_invalid_at(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
        else return i;
        if (i + (size_t)len > n) return i;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i; /* overlong, too large, surrogate */
        i += (size_t)len;
    }
    return n;
}

/* ---- result files ---- */

FILE *kvb_outfile_open(kvb_outfile *o, const char *path)
{
    memset(o, 0, sizeof *o);
    char resolved[PATH_MAX];
    const char *target = path;
    struct stat st;
    /* a symbolic link: write its target (renaming over the link would replace the link) */
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode) && realpath(path, resolved)) target = resolved;
    if ((size_t)snprintf(o->path, sizeof o->path, "%s", target) >= sizeof o->path) {
        kvb_fail(KVB_EINVAL, "%s: path longer than %zu characters", path, sizeof o->path - 1);
        return NULL;
    }
    mode_t mode;
    if (stat(o->path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            kvb_fail(KVB_EINVAL, "%s: is a directory, not a file", path);
            return NULL;
        }
        if (!S_ISREG(st.st_mode)) { /* /dev/stdout, a pipe: nothing to rename over, written in place */
            if (!(o->f = fopen(o->path, "w"))) kvb_fail(KVB_EIO, "%s: cannot write: %s", path, strerror(errno));
            return o->f;
        }
        mode = st.st_mode & 07777; /* a file replaced keeps its permissions */
    } else {
        mode_t mask = umask(0);
        umask(mask);
        mode = 0666 & ~mask;
    }
    const char *slash = strrchr(o->path, '/');
    const int dir_len = slash ? (int)(slash - o->path) : 0;
    const char *base = slash ? slash + 1 : o->path;
    int n = slash ? snprintf(o->tmp, sizeof o->tmp, "%.*s/.%s.tmp.XXXXXX", dir_len ? dir_len : 1, dir_len ? o->path : "/", base)
                  : snprintf(o->tmp, sizeof o->tmp, ".%s.tmp.XXXXXX", base);
    if (n < 0 || (size_t)n >= sizeof o->tmp) {
        kvb_fail(KVB_EINVAL, "%s: path longer than %zu characters", path, sizeof o->tmp - 1);
        return NULL;
    }
    int fd = mkstemp(o->tmp);
    if (fd < 0) {
        kvb_fail(KVB_EIO, "%s: cannot write: cannot create a file in its directory (%s)", path, strerror(errno));
        o->tmp[0] = '\0';
        return NULL;
    }
    (void)fchmod(fd, mode);
    if (!(o->f = fdopen(fd, "w"))) {
        kvb_fail(KVB_EIO, "%s: cannot write: %s", path, strerror(errno));
        close(fd);
        unlink(o->tmp);
        o->tmp[0] = '\0';
    }
    return o->f;
}

static void sync_dir_of(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (slash == path ? 1 : (int)(slash - path)) : 1, slash ? path : ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

int kvb_outfile_commit(kvb_outfile *o)
{
    int rc = KVB_OK;
    if (o->f) {
        const int bad = fflush(o->f) != 0 || ferror(o->f);
        const int e = errno;
        if (bad) rc = kvb_fail(KVB_EIO, "%s: cannot write: %s", o->path, strerror(e));
        else if (o->tmp[0] && fsync(fileno(o->f)) != 0)
            rc = kvb_fail(KVB_EIO, "%s: cannot sync to disk: %s", o->path, strerror(errno));
        if (fclose(o->f) != 0 && rc == KVB_OK) rc = kvb_fail(KVB_EIO, "%s: cannot write: %s", o->path, strerror(errno));
        o->f = NULL;
    } else if (o->tmp[0]) { /* written by name (Google Benchmark's file output) */
        int fd = open(o->tmp, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fsync(fd) != 0) rc = kvb_fail(KVB_EIO, "%s: cannot sync to disk: %s", o->path, strerror(errno));
        if (fd >= 0) close(fd);
    }
    if (!o->tmp[0]) return rc; /* written in place */
    if (rc == KVB_OK && rename(o->tmp, o->path) != 0)
        rc = kvb_fail(KVB_EIO, "%s: cannot replace it: %s", o->path, strerror(errno));
    if (rc != KVB_OK) unlink(o->tmp);
    else sync_dir_of(o->path);
    o->tmp[0] = '\0';
    return rc;
}

void kvb_outfile_discard(kvb_outfile *o)
{
    if (o->f) fclose(o->f);
    o->f = NULL;
    if (o->tmp[0]) unlink(o->tmp);
    o->tmp[0] = '\0';
}
