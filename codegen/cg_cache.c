/* cg_cache.c: the module cache. When the environment names a directory in XTC_MODULE_CACHE, a
 * backend's compile step looks up the module it is about to build by a 128-bit key of everything
 * the module file is made from (the LLVM module before optimisation with the target machine's
 * settings and LLVM's version, or the CUDA backend's sources; the compiler options; the identity
 * of the `cc` that links or compiles) and, when it is there, copies it to the output instead of
 * optimising, emitting and linking again; after a build it stores the result. Lookups and stores
 * are best effort: a cache that cannot be read or written is a miss, never an error. Entries are
 * written under a temporary name and renamed (rt_fileio.c), so processes sharing the directory see
 * whole files, and carry their size and a hash of their bytes: a damaged entry is a miss, and the
 * build that follows replaces it. An entry is stored from the file the backend linked, before it
 * is renamed to the output, so another compile writing the same output cannot change it.
 *
 * The key is not a cryptographic hash: it guards against accidents (a changed generator, model,
 * option or toolchain), not against someone writing into the directory. */
#include "codegen.h"
#include "rt_fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* splitmix64's finaliser */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static void add_word(CgHash *h, uint64_t w)
{
    h->a = mix(h->a ^ w);
    h->b = mix(h->b + (w << 32 | w >> 32) + 0x9e3779b97f4a7c15ULL);
}

void cg_hash_init(CgHash *h, const char *what)
{
    h->a = 0x6a09e667f3bcc908ULL;
    h->b = 0xbb67ae8584caa73bULL;
    cg_hash_str(h, what);
}

void cg_hash_add(CgHash *h, const void *p, size_t n)
{
    const unsigned char *s = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        add_word(h, w);
    }
    uint64_t w = 0;
    for (size_t k = 0; i < n; i++, k++)
        w |= (uint64_t)s[i] << (8 * k);
    add_word(h, w);
    add_word(h, (uint64_t)n); /* the length ends each piece: "ab","c" differs from "a","bc" */
}

void cg_hash_str(CgHash *h, const char *s)
{
    cg_hash_add(h, s ? s : "", s ? strlen(s) : 0);
    add_word(h, s ? 1 : 0);
}

/* The first executable `name` on PATH: its path, device, inode, size and modification time. */
void cg_hash_program(CgHash *h, const char *name)
{
    const char *path = getenv("PATH");
    if (!path || !path[0])
        path = "/usr/local/bin:/usr/bin:/bin";
    char full[4200];
    for (const char *p = path; *p;) {
        const char *e = strchr(p, ':');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        snprintf(full, sizeof full, "%.*s/%s", (int)len, len ? p : ".", name);
        struct stat sb;
        if (stat(full, &sb) == 0 && S_ISREG(sb.st_mode) && access(full, X_OK) == 0) {
            uint64_t id[5] = {(uint64_t)sb.st_dev, (uint64_t)sb.st_ino, (uint64_t)sb.st_size,
                              (uint64_t)sb.st_mtim.tv_sec, (uint64_t)sb.st_mtim.tv_nsec};
            cg_hash_str(h, full);
            cg_hash_add(h, id, sizeof id);
            return;
        }
        p += len;
        if (*p == ':')
            p++;
    }
    cg_hash_str(h, "(not found)");
}

/* The entry's path for key h; 0 when no cache is configured. */
static int entry_path(const CgHash *h, char *buf, size_t n)
{
    const char *dir = getenv("XTC_MODULE_CACHE");
    if (!dir || !dir[0])
        return 0;
    int len = snprintf(buf, n, "%s/%016llx%016llx.so", dir, (unsigned long long)h->a, (unsigned long long)h->b);
    return len > 0 && (size_t)len < n;
}

int cg_cache_enabled(void)
{
    const char *dir = getenv("XTC_MODULE_CACHE");
    return dir && dir[0];
}

/* An entry is the module's bytes followed by this trailer: their size and their hash, checked on
 * every fetch, so that a truncated or damaged entry is a miss (and rebuilt), never served. */
#define ENTRY_MAGIC "XTCCACH1"
enum { TRAILER = 32, ENTRY_MAX = 1 << 30 };

static void content_hash(const void *p, size_t len, uint64_t out[2])
{
    CgHash h;
    cg_hash_init(&h, "module cache entry");
    cg_hash_add(&h, p, len);
    out[0] = h.a;
    out[1] = h.b;
}

int cg_cache_fetch(const CgHash *h, const char *output)
{
    char path[4200], err[600];
    struct stat sb;
    if (!entry_path(h, path, sizeof path) || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return 0;
    char *buf;
    size_t len;
    if (rt_file_read_all(path, ENTRY_MAX, "a module cache entry", &buf, &len, err, sizeof err) != 0)
        return 0;
    uint64_t t[3], sum[2];
    int good = len >= TRAILER && !memcmp(buf + len - TRAILER, ENTRY_MAGIC, 8);
    if (good) {
        memcpy(t, buf + len - TRAILER + 8, sizeof t);
        content_hash(buf, len - TRAILER, sum);
        good = t[0] == len - TRAILER && t[1] == sum[0] && t[2] == sum[1];
    }
    RtWFile w;
    if (good && rt_wfile_open(&w, output, err, sizeof err) == 0) {
        if (rt_wfile_write(&w, buf, len - TRAILER) != 0) {
            rt_wfile_abort(&w);
            good = 0;
        } else {
            good = rt_wfile_commit(&w, err, sizeof err) == 0;
        }
    } else {
        good = 0;
    }
    free(buf);
    return good;
}

void cg_cache_store(const CgHash *h, const char *module)
{
    char path[4200], err[600];
    if (!entry_path(h, path, sizeof path))
        return;
    const char *dir = getenv("XTC_MODULE_CACHE");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return;
    char *buf;
    size_t len;
    if (rt_file_read_all(module, ENTRY_MAX, "a module cache entry", &buf, &len, err, sizeof err) != 0)
        return;
    uint64_t sum[2];
    content_hash(buf, len, sum);
    unsigned char trailer[TRAILER];
    uint64_t t[3] = {len, sum[0], sum[1]};
    memcpy(trailer, ENTRY_MAGIC, 8);
    memcpy(trailer + 8, t, sizeof t);
    RtWFile w;
    if (rt_wfile_open(&w, path, err, sizeof err) == 0) {
        if (rt_wfile_write(&w, buf, len) != 0 || rt_wfile_write(&w, trailer, sizeof trailer) != 0)
            rt_wfile_abort(&w);
        else
            rt_wfile_commit(&w, err, sizeof err);
    }
    free(buf);
}
