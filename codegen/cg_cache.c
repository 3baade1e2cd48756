/* cg_cache.c: the module cache. When the environment names a directory in XTC_MODULE_CACHE, a
 * backend's compile step looks up the module it is about to build by a 128-bit key of everything
 * the module file is made from (the LLVM module before optimisation with the target machine's
 * settings and LLVM's version, or the CUDA backend's sources; the compiler options; the identity
 * of the `cc` that links or compiles) and, when it is there, copies it to the output instead of
 * optimising, emitting and linking again; after a build it stores the result. Lookups and stores
 * are best effort: a cache that cannot be read or written is a miss, never an error. Entries are
 * written under a temporary name and renamed, so processes sharing the directory see whole files.
 *
 * The key is not a cryptographic hash: it guards against accidents (a changed generator, model,
 * option or toolchain), not against someone writing into the directory. */
#include "codegen.h"

#include <errno.h>
#include <stdatomic.h>
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

/* Copies from to a temporary name beside to, then renames it to to. 0 or -1. */
static int copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb");
    if (!in)
        return -1;
    static atomic_uint seq;
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld.%u", to, (long)getpid(), atomic_fetch_add(&seq, 1));
    FILE *out = fopen(tmp, "wb");
    int rc = out ? 0 : -1;
    char buf[1 << 16];
    size_t got;
    while (rc == 0 && (got = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, got, out) != got)
            rc = -1;
    if (ferror(in))
        rc = -1;
    fclose(in);
    if (out && fclose(out) != 0)
        rc = -1;
    if (rc == 0 && rename(tmp, to) != 0)
        rc = -1;
    if (rc != 0 && out)
        unlink(tmp);
    return rc;
}

int cg_cache_fetch(const CgHash *h, const char *output)
{
    char path[4200];
    if (!entry_path(h, path, sizeof path) || access(path, R_OK) != 0)
        return 0;
    return copy_file(path, output) == 0;
}

void cg_cache_store(const CgHash *h, const char *output)
{
    char path[4200];
    if (!entry_path(h, path, sizeof path))
        return;
    const char *dir = getenv("XTC_MODULE_CACHE");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return;
    copy_file(output, path);
}
