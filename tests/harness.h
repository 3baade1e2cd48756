/* harness.h: what the Check suites share: a suite's main (harness_run), a scratch directory for
 * the modules and files a suite writes (removed when it ends), and a deterministic xorshift random
 * source. Each suite includes it once and keeps its own directory and its own stream, so a suite's
 * random draws do not depend on which other suites exist. harness_bind.h builds on it for the
 * suites that check compiled modules against the interpreter. */
#ifndef XTC_TEST_HARNESS_H
#define XTC_TEST_HARNESS_H

#include <check.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Checks for loops over elements. Check records every passing ck_assert (a write(2) each, to
 * its pipe or log): 600,000 of them took a tenth of test_cuda's time. These call Check only when
 * the condition fails, with the same message and location. */
#define expect_msg(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond))                                                                               \
            ck_abort_msg(__VA_ARGS__);                                                             \
    } while (0)
#define expect(cond) expect_msg(cond, "Assertion '%s' failed", #cond)

static char tmpdir[256];

/* Creates /tmp/xtc-test-NAME-XXXXXX once (falls back to /tmp, which is never removed). */
static inline void harness_make_tmpdir(const char *name)
{
    if (tmpdir[0])
        return;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/xtc-test-%s-XXXXXX", name);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        snprintf(tmpdir, sizeof tmpdir, "/tmp");
    }
}

/* Writes text to the file NAME in the suite's directory (a Check failure if it cannot). */
static inline void harness_write_text(const char *name, const char *text)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* Removes the files in dir, then dir (a directory of files only). */
static inline void harness_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[1200];
        while ((e = readdir(d)))
            if (e->d_name[0] != '.') {
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                unlink(path);
            }
        closedir(d);
    }
    rmdir(dir);
}

/* Removes the files the suite left in its directory, then the directory. */
static inline void remove_tmpdir(void)
{
    if (!tmpdir[0] || strcmp(tmpdir, "/tmp") == 0)
        return;
    harness_remove_dir(tmpdir);
}

/* The whole file at path, NUL-terminated, its size in *len (when len is not NULL); NULL when it
 * cannot be read. Free it. */
static inline char *harness_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) {
        s[n] = 0;
        if (len)
            *len = (size_t)n;
    }
    fclose(f);
    return s;
}

/* A suite's main: runs s and returns main's exit status (nonzero when a test failed). With
 * tmpname, the scratch directory is made first, so that the forked test processes share it, and
 * removed at the end; with NULL the suite manages its own files. */
static inline int harness_run(Suite *s, const char *tmpname)
{
    if (tmpname)
        harness_make_tmpdir(tmpname);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (tmpname)
        remove_tmpdir();
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* xorshift64; a suite seeds it by defining HARNESS_SEED before including this header */
#ifndef HARNESS_SEED
#define HARNESS_SEED 0x9E3779B97F4A7C15ull
#endif
static uint64_t rng_state = HARNESS_SEED;

static inline uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* uniform in [lo, hi), 53 random bits */
static inline double uniform(double lo, double hi)
{
    return lo + (hi - lo) * (double)(rnd() >> 11) / 9007199254740992.0;
}

#endif
