/* fuzz_replay.c: a main() for the fuzz targets without libFuzzer. Each argument is a file or a
 * directory of files (dot files skipped, missing directories noted); every file is fed once to
 * LLVMFuzzerTestOneInput. A crash, a sanitizer report or an abort() of the target fails the run,
 * so the seed corpora and every regression input of tests/fuzz/regress stay tests in the normal
 * build (ctest: fuzz_<target>_replay). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        perror(path);
        return -1;
    }
    size_t cap = 4096, len = 0, k;
    uint8_t *buf = malloc(cap);
    while (buf && (k = fread(buf + len, 1, cap - len, fp)) > 0) {
        len += k;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb)
                free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    fclose(fp);
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", path);
        return -1;
    }
    /* an exact-size copy, so that ASan sees a read one past the input */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs every file of a directory in name order; returns the count or -1. */
static int run_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        printf("replay: %s: no such directory (nothing to replay)\n", dir);
        return 0;
    }
    char **names = NULL;
    int n = 0, cap = 0, bad = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, (size_t)cap * sizeof *names);
            if (!nn) {
                bad = 1;
                break;
            }
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) {
            bad = 1;
            break;
        }
        n++;
    }
    closedir(d);
    if (n > 0)
        qsort(names, (size_t)n, sizeof *names, by_name);
    int done = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (!bad && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(path) != 0)
                bad = 1;
            else
                done++;
        }
        free(names[i]);
    }
    free(names);
    return bad ? -1 : done;
}

int main(int argc, char **argv)
{
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        int k;
        if (stat(argv[i], &st) == 0 && S_ISREG(st.st_mode))
            k = run_file(argv[i]) == 0 ? 1 : -1;
        else
            k = run_dir(argv[i]);
        if (k < 0)
            return 1;
        printf("replay: %s: %d input%s\n", argv[i], k, k == 1 ? "" : "s");
        total += k;
    }
    printf("replay: %d inputs, no crash\n", total);
    return 0;
}
