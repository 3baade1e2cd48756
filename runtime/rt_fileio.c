/* rt_fileio.c: opening files to read without blocking on FIFOs, and replacing files atomically
 * (see rt_fileio.h for the rules). */
#include "rt_fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int fail(char *err, size_t n, const char *fmt, ...)
{
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int rt_file_open_read(const char *path, int regular_only, struct stat *st, char *err, size_t n)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return fail(err, n, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        return fail(err, n, "%s: cannot stat: %s", path, strerror(e));
    }
    if (S_ISDIR(st->st_mode) || (regular_only && !S_ISREG(st->st_mode))) {
        close(fd);
        errno = EINVAL;
        return fail(err, n, "%s: not a regular file", path);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

int rt_file_read_all(const char *path, size_t cap, const char *what, char **out, size_t *len, char *err,
                     size_t n)
{
    *out = NULL;
    *len = 0;
    struct stat st;
    int fd = rt_file_open_read(path, 0, &st, err, n);
    if (fd < 0)
        return -1;
    size_t size = 0, have = S_ISREG(st.st_mode) && (uint64_t)st.st_size < cap ? (size_t)st.st_size + 1 : 65536;
    char *buf = NULL;
    int rc = 0;
    for (;;) {
        if (size + 1 >= have || !buf) {
            size_t nh = buf ? have * 2 : have;
            if (nh > cap + 2)
                nh = cap + 2;
            char *nb = realloc(buf, nh);
            if (!nb) {
                rc = fail(err, n, "%s: out of memory", path);
                break;
            }
            buf = nb;
            have = nh;
        }
        size_t want = have - 1 - size;
        if (want > cap + 1 - size)
            want = cap + 1 - size;
        ssize_t k = read(fd, buf + size, want);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            rc = fail(err, n, "%s: read error: %s", path, strerror(errno));
            break;
        }
        if (k == 0)
            break;
        size += (size_t)k;
        if (size > cap) {
            rc = fail(err, n, "%s: larger than the %zu-byte limit for %s", path, cap, what);
            break;
        }
    }
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[size] = 0;
    *out = buf;
    *len = size;
    return 0;
}

int rt_file_same(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && S_ISREG(sa.st_mode) && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* ---- atomic writes ---- */

/* The path that a write to path replaces: the end of its chain of symlinks (a dangling link
 * gives the file it would create). malloc'd, or NULL with a message. */
static char *resolve_target(const char *path, char *err, size_t n)
{
    char *cur = strdup(path);
    for (int hops = 0; cur; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode))
            return cur;
        if (hops == 40) {
            free(cur);
            fail(err, n, "%s: too many levels of symbolic links", path);
            return NULL;
        }
        char link[PATH_MAX];
        ssize_t k = readlink(cur, link, sizeof link - 1);
        if (k < 0) {
            fail(err, n, "%s: cannot read the symbolic link: %s", path, strerror(errno));
            free(cur);
            return NULL;
        }
        link[k] = 0;
        const char *slash = strrchr(cur, '/');
        size_t dlen = link[0] == '/' || !slash ? 0 : (size_t)(slash - cur) + 1;
        char *next = malloc(dlen + (size_t)k + 1);
        if (next) {
            memcpy(next, cur, dlen);
            memcpy(next + dlen, link, (size_t)k + 1);
        }
        free(cur);
        cur = next;
    }
    fail(err, n, "out of memory");
    return NULL;
}

/* dir (of target) into buf: "." when target has no slash */
static void dir_of(const char *target, char *buf, size_t n)
{
    const char *slash = strrchr(target, '/');
    size_t len = slash ? (slash == target ? 1 : (size_t)(slash - target)) : 0;
    if (!len)
        snprintf(buf, n, ".");
    else
        snprintf(buf, n, "%.*s", (int)len, target);
}

static const char *base_of(const char *target)
{
    const char *slash = strrchr(target, '/');
    return slash ? slash + 1 : target;
}

/* Removes ".BASE.xtc-tmp.PID.*" beside target whose PID is no longer running: what a killed
 * write of the same target left. Best effort. */
static void remove_stale(const char *target)
{
    char dir[PATH_MAX], prefix[NAME_MAX + 16];
    dir_of(target, dir, sizeof dir);
    int plen = snprintf(prefix, sizeof prefix, ".%s.xtc-tmp.", base_of(target));
    if (plen <= 0 || (size_t)plen >= sizeof prefix)
        return;
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, (size_t)plen) != 0)
            continue;
        char *end;
        long pid = strtol(e->d_name + plen, &end, 10);
        if (pid <= 0 || *end != '.' || pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char full[PATH_MAX + NAME_MAX + 2];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        unlink(full);
    }
    closedir(d);
}

static int wfile_open(RtWFile *w, const char *path, int named, char *err, size_t n)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    if (!path || !path[0])
        return fail(err, n, "no output file named");
    if (!(w->target = resolve_target(path, err, n)))
        return -1;
    struct stat st;
    if (stat(w->target, &st) == 0) {
        if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
            /* a FIFO without a reader is refused (ENXIO) rather than waited for */
            w->fd = open(w->target, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
            if (w->fd < 0) {
                int e = errno;
                fail(err, n, "%s: cannot write: %s", path, e == ENXIO ? "a FIFO that nobody reads" : strerror(e));
                rt_wfile_abort(w);
                return -1;
            }
            int fl = fcntl(w->fd, F_GETFL);
            if (fl >= 0)
                fcntl(w->fd, F_SETFL, fl & ~O_NONBLOCK);
            w->direct = 1;
            if (!named)
                return 0;
        } else if (!S_ISREG(st.st_mode)) {
            fail(err, n, "%s: not a regular file, a character device or a FIFO; not replaced", path);
            rt_wfile_abort(w);
            return -1;
        } else {
            w->keep_mode = 1;
            w->mode = st.st_mode & 07777;
        }
    }
    static atomic_uint seq;
    size_t cap = strlen(w->target) + 96;
    if (w->direct) {
        const char *td = getenv("TMPDIR");
        cap += td ? strlen(td) : 4;
    }
    if (!(w->tmp = malloc(cap))) {
        rt_wfile_abort(w);
        return fail(err, n, "out of memory");
    }
    if (w->direct) { /* named: the bytes go through a temporary file elsewhere */
        const char *td = getenv("TMPDIR");
        snprintf(w->tmp, cap, "%s/.xtc-out.xtc-tmp.%ld.XXXXXX", td && td[0] ? td : "/tmp", (long)getpid());
        int tfd = mkstemp(w->tmp);
        if (tfd < 0) {
            fail(err, n, "%s: cannot create a temporary file: %s", path, strerror(errno));
            w->tmp[0] = 0;
            rt_wfile_abort(w);
            return -1;
        }
        close(tfd);
        return 0;
    }
    remove_stale(w->target);
    char dir[PATH_MAX];
    dir_of(w->target, dir, sizeof dir);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        unsigned r = (unsigned)(ts.tv_nsec ^ (ts.tv_sec << 20)) * 2654435761u + atomic_fetch_add(&seq, 1) * 40503u;
        snprintf(w->tmp, cap, "%s/.%s.xtc-tmp.%ld.%08x", dir, base_of(w->target), (long)getpid(), r + attempt);
        fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        fail(err, n, "%s: cannot create a temporary file: %s", path, strerror(errno));
        w->tmp[0] = 0;
        rt_wfile_abort(w);
        return -1;
    }
    if (named)
        close(fd);
    else
        w->fd = fd;
    return 0;
}

int rt_wfile_open(RtWFile *w, const char *path, char *err, size_t n)
{
    return wfile_open(w, path, 0, err, n);
}

int rt_wfile_open_named(RtWFile *w, const char *path, char *err, size_t n)
{
    return wfile_open(w, path, 1, err, n);
}

int rt_wfile_write(RtWFile *w, const void *p, size_t len)
{
    const char *s = p;
    while (len) {
        ssize_t k = write(w->fd, s, len > ((size_t)1 << 30) ? (size_t)1 << 30 : len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k == 0)
            errno = EIO;
        if (k <= 0)
            return -1;
        s += k;
        len -= (size_t)k;
    }
    return 0;
}

static void wfile_free(RtWFile *w)
{
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
    free(w->target);
    free(w->tmp);
    w->target = w->tmp = NULL;
}

void rt_wfile_abort(RtWFile *w)
{
    if (w->tmp && w->tmp[0])
        unlink(w->tmp);
    wfile_free(w);
}

int rt_wfile_commit(RtWFile *w, char *err, size_t n)
{
    const char *step = "write";
    int e = 0;
    if (w->direct && w->tmp && w->tmp[0]) { /* named: copy what was written into the device */
        int in = open(w->tmp, O_RDONLY | O_CLOEXEC);
        char buf[1 << 16];
        ssize_t k = in < 0 ? -1 : 0;
        while (in >= 0 && ((k = read(in, buf, sizeof buf)) > 0 || (k < 0 && errno == EINTR)))
            if (k > 0 && rt_wfile_write(w, buf, (size_t)k) != 0)
                break;
        if (k != 0)
            e = errno ? errno : EIO;
        if (in >= 0)
            close(in);
    } else if (!w->direct) {
        int fd = w->fd >= 0 ? w->fd : open(w->tmp, O_RDONLY | O_CLOEXEC);
        w->fd = fd;
        if (fd < 0)
            e = errno, step = "open";
        else if (w->keep_mode && fchmod(fd, w->mode) != 0)
            e = errno, step = "chmod";
        else if (fsync(fd) != 0)
            e = errno, step = "fsync";
    }
    if (w->fd >= 0 && close(w->fd) != 0 && !e)
        e = errno, step = "close";
    w->fd = -1;
    if (!e && !w->direct) {
        if (rename(w->tmp, w->target) != 0)
            e = errno, step = "rename";
        else {
            w->tmp[0] = 0;
            char dir[PATH_MAX];
            dir_of(w->target, dir, sizeof dir);
            int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd >= 0) {
                fsync(dfd); /* best effort: some file systems refuse it */
                close(dfd);
            }
        }
    }
    if (e) {
        fail(err, n, "%s: %s failed: %s", w->target, step, strerror(e));
        rt_wfile_abort(w);
        return -1;
    }
    rt_wfile_abort(w); /* the temporary file is gone or was renamed: frees */
    return 0;
}
