/* rt_fileio.h: how xtc opens the files it reads and replaces the files it writes, used by the
 * runtime (safetensors, modules), the compiler (module output, module cache) and the command line.
 * Readers never block on a FIFO nobody writes; writers replace a regular target atomically
 * (a temporary file beside it, fsync, rename) through symlinks and keeping its mode, write
 * character devices and FIFOs (/dev/null, /dev/stdout) in place, and remove the temporary files
 * that a killed writer of the same target left behind. */
#ifndef XTC_RT_FILEIO_H
#define XTC_RT_FILEIO_H

#include <stddef.h>
#include <sys/stat.h>

/* Opens path read-only without blocking (a FIFO without a writer opens at once), then makes
 * the descriptor blocking again. regular_only: anything but a regular file is refused ("PATH:
 * not a regular file", errno EINVAL; a directory always). st receives fstat's result. The
 * descriptor, or -1 with a message and errno. */
int rt_file_open_read(const char *path, int regular_only, struct stat *st, char *err, size_t n);

/* Reads a whole file (a regular file, a pipe or a character device) into a malloc'd buffer with
 * a NUL after the bytes; more than cap bytes is refused ("PATH: larger than the N-byte limit
 * for WHAT"), reading at most cap + 1. 0, or -1 with a message. */
int rt_file_read_all(const char *path, size_t cap, const char *what, char **out, size_t *len, char *err,
                     size_t n);

/* Nonzero when a and b name the same existing regular file (device and inode, symlinks
 * followed). */
int rt_file_same(const char *a, const char *b);

/* An atomic replacement of one target. */
typedef struct {
    int fd;        /* write here (the temporary file, or the device itself when direct) */
    int direct;    /* the target is a character device or a FIFO: written in place */
    int keep_mode; /* the target existed: the temporary file gets its mode */
    mode_t mode;
    char *target;  /* the path written: symlinks resolved */
    char *tmp;     /* the temporary file's name ("" when direct and nothing to copy) */
} RtWFile;

/* Starts writing path: resolves symlinks, removes stale temporary files of the same target
 * whose writer is gone, creates ".NAME.xtc-tmp.PID.RAND" in the target's directory (or opens a
 * character device or FIFO in place; a directory or other kind of file is refused). 0, or -1
 * with a message. */
int rt_wfile_open(RtWFile *w, const char *path, char *err, size_t n);
/* Like rt_wfile_open for a temporary file that another program writes by name (a linker): the
 * caller writes w->tmp, which for a direct target lies in $TMPDIR and is copied at commit. */
int rt_wfile_open_named(RtWFile *w, const char *path, char *err, size_t n);
/* Writes all of p (to w->fd). 0, or -1 with errno set. */
int rt_wfile_write(RtWFile *w, const void *p, size_t len);
/* Finishes: fsync, the mode, rename over the target (or the copy into a direct target). Frees
 * w. 0, or -1 with a message naming the target; the temporary file is removed on failure. */
int rt_wfile_commit(RtWFile *w, char *err, size_t n);
/* Gives up: removes the temporary file, frees w. */
void rt_wfile_abort(RtWFile *w);

#endif
