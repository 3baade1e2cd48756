/* cli_opts.c: the option parser of every subcommand (cli_opts.h): one table per command, both
 * "--name=value" and "--name value", numbers checked with one message, "did you mean" by edit
 * distance, --help printed from the table. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cli_opts.h"
#include "ir.h"          /* ir_edit_distance */
#include "rt_internal.h" /* rt_cpus_available */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int cli_is_elf_file(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) /* never read a FIFO or a device to look */
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    unsigned char b[4];
    ssize_t k = read(fd, b, sizeof b);
    close(fd);
    return k == 4 && !memcmp(b, "\177ELF", 4);
}

const char *cli_nearest(const char *given, const char *const *names, int n)
{
    given += strspn(given, "-"); /* the dashes of options are no evidence */
    size_t len = strlen(given);
    const char *best = NULL;
    int bd = 99, prefixes = 0;
    for (int k = 0; len >= 2 && k < n; k++) /* an abbreviation of exactly one name */
        if (!strncmp(names[k] + strspn(names[k], "-"), given, len))
            prefixes++, best = names[k];
    if (prefixes == 1)
        return best;
    best = NULL;
    for (int k = 0; k < n; k++) {
        int d = ir_edit_distance(given, len, names[k] + strspn(names[k], "-"));
        if (d < bd)
            bd = d, best = names[k];
    }
    return best && (bd <= 2 || (size_t)bd * 3 <= len) && (size_t)bd < len ? best : NULL;
}

static const CliOpt *find(const CliCmd *c, const char *name, size_t n)
{
    for (int k = 0; k < c->nopts; k++)
        if (strlen(c->opts[k].name) == n && !strncmp(c->opts[k].name, name, n))
            return &c->opts[k];
    return NULL;
}

static int takes_value(const CliOpt *o)
{
    return o->kind != CLI_FLAG && o->kind != CLI_LEVEL && o->kind != CLI_NOT_HERE &&
           !(o->kind == CLI_FN && !o->arg);
}

/* "a positive integer", "an integer from 0 to 1024", "a number >= 0" */
static void range_text(const CliOpt *o, int integral, double lo, double hi, char *buf, size_t n)
{
    const char *what = integral ? "integer" : "number";
    if (o->kind == CLI_THREADS)
        snprintf(buf, n, "a positive integer (at most %.15g)", hi);
    else if (hi > lo)
        snprintf(buf, n, "%s %s from %.15g to %.15g", integral ? "an" : "a", what, lo, hi);
    else if (integral && lo == 1)
        snprintf(buf, n, "a positive integer");
    else if (integral && lo == 0)
        snprintf(buf, n, "a non-negative integer");
    else
        snprintf(buf, n, "%s %s >= %.15g", integral ? "an" : "a", what, lo);
}

/* Stores the value of a number option; 0, or -1 after printing. */
static int number(const CliCmd *c, const CliOpt *o, const char *v)
{
    int integral = o->kind != CLI_DOUBLE;
    double lo = o->lo, hi = o->hi, tmax;
    switch (o->kind) {
    case CLI_INT: tmax = 2147483647.0; break;
    case CLI_LONG:
    case CLI_I64: tmax = 9223372036854775807.0; break; /* strtoll's ERANGE catches the rest */
    case CLI_U64: tmax = 18446744073709549568.0; break;
    case CLI_THREADS: lo = 1, hi = 1024, tmax = 1024; break;
    default: tmax = INFINITY; break;
    }
    if (hi <= lo)
        hi = tmax;
    char *end;
    errno = 0;
    int ok = 0;
    double x = 0;
    unsigned long long u = 0;
    long long s = 0;
    if (integral && o->kind == CLI_U64) {
        ok = *v >= '0' && *v <= '9' && ((u = strtoull(v, &end, 10)), !*end) && !errno;
        x = (double)u;
    } else if (integral) {
        ok = *v && ((s = strtoll(v, &end, 10)), !*end) && !errno;
        x = (double)s;
    } else {
        ok = *v && ((x = strtod(v, &end)), !*end) && !errno && isfinite(x);
    }
    ok = ok && x >= lo && x <= hi;
    if (!ok) {
        char want[96];
        range_text(o, integral, lo, hi == tmax && o->kind != CLI_THREADS ? lo : hi, want, sizeof want);
        fprintf(stderr, "xtc %s: %s: expected %s, got '%s'\n", c->name, o->name, want, v);
        return -1;
    }
    switch (o->kind) {
    case CLI_INT:
    case CLI_THREADS: *(int *)o->ptr = (int)s; break;
    case CLI_LONG: *(long *)o->ptr = (long)s; break;
    case CLI_I64: *(int64_t *)o->ptr = (int64_t)s; break;
    case CLI_U64: *(uint64_t *)o->ptr = (uint64_t)u; break;
    default: *(double *)o->ptr = x; break;
    }
    if (o->kind == CLI_THREADS && !c->quiet) {
        int cpus = rt_cpus_available();
        if (s > cpus)
            fprintf(stderr, "xtc %s: warning: %s %lld is more than the %d CPU%s this process may use (a run is "
                    "slower than with %s %d)\n", c->name, o->name, s, cpus, cpus == 1 ? "" : "s", o->name, cpus);
    }
    return 0;
}

static void unknown(const CliCmd *c, const char *a)
{
    size_t n = strcspn(a, "=");
    if (a[1] == 'O' && find(c, "-O0", 3)) {
        fprintf(stderr, "xtc %s: unknown option '%.*s' (the optimisation levels are -O0 .. -O3)\n", c->name, (int)n, a);
        return;
    }
    char given[128];
    snprintf(given, sizeof given, "%.*s", (int)n, a);
    const char *names[256];
    int k = 0;
    names[k++] = "--help";
    for (int i = 0; i < c->nopts && k < 256; i++)
        if (c->opts[i].kind != CLI_NOT_HERE)
            names[k++] = c->opts[i].name;
    const char *near = cli_nearest(given, names, k);
    if (near)
        fprintf(stderr, "xtc %s: unknown option '%s' (did you mean '%s'?)\n", c->name, given, near);
    else
        fprintf(stderr, "xtc %s: unknown option '%s' (xtc %s --help lists them)\n", c->name, given, c->name);
}

int cli_parse(const CliCmd *c, int argc, char **argv)
{
    int npos = 0, options = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!options || a[0] != '-' || !a[1]) { /* a positional argument ("-" is one: stdin) */
            if (npos == c->maxpos) {
                if (c->maxpos)
                    fprintf(stderr, "xtc %s: more than one %s ('%s' and '%s')\n", c->name, c->pos_name,
                            c->pos[c->maxpos - 1], a);
                else
                    fprintf(stderr, "xtc %s: unexpected argument '%s'\n", c->name, a);
                return 2;
            }
            c->pos[npos++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            options = 0;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cli_help(c);
            return 1;
        }
        size_t n = strcspn(a, "=");
        const CliOpt *o = find(c, a, n);
        if (!o) {
            unknown(c, a);
            return 2;
        }
        if (o->kind == CLI_NOT_HERE) {
            fprintf(stderr, "xtc %s: %s %s\n", c->name, o->name, o->help);
            return 2;
        }
        const char *v = NULL;
        if (!takes_value(o)) {
            if (a[n] == '=') {
                fprintf(stderr, "xtc %s: %s takes no value (got '%s')\n", c->name, o->name, a);
                return 2;
            }
        } else if (a[n] == '=') {
            v = a + n + 1;
        } else {
            const char *next = i + 1 < argc ? argv[i + 1] : NULL;
            if (!next || (next[0] == '-' && next[1] == '-' && find(c, next, strcspn(next, "=")))) {
                fprintf(stderr, "xtc %s: %s needs a value\n", c->name, o->name);
                return 2;
            }
            v = argv[++i];
        }
        char err[512] = "";
        switch (o->kind) {
        case CLI_FLAG: *(int *)o->ptr = o->set ? o->set : 1; break;
        case CLI_LEVEL: *(int *)o->ptr = o->set; break;
        case CLI_STR:
            if (!*v) {
                fprintf(stderr, "xtc %s: %s needs a value (got an empty one)\n", c->name, o->name);
                return 2;
            }
            /* fall through */
        case CLI_ANY_STR: *(const char **)o->ptr = v; break;
        case CLI_FN:
            if (o->fn(v, o->ptr, err, sizeof err) != 0) {
                fprintf(stderr, "xtc %s: %s: %s\n", c->name, o->name, err);
                return 2;
            }
            break;
        case CLI_NOT_HERE: break;
        default:
            if (number(c, o, v) != 0)
                return 2;
        }
    }
    return 0;
}

int cli_usage_error(const CliCmd *c, const char *what)
{
    fprintf(stderr, "xtc %s: %s (usage: xtc %s %s; xtc %s --help)\n", c->name, what, c->name, c->usage, c->name);
    return 2;
}

void cli_help(const CliCmd *c)
{
    printf("usage: xtc %s %s\n", c->name, c->usage);
    if (c->about)
        printf("\n%s", c->about);
    int any = 0;
    for (int k = 0; k < c->nopts; k++) {
        const CliOpt *o = &c->opts[k];
        if (!o->help || o->kind == CLI_NOT_HERE)
            continue;
        if (!any++)
            printf("\n");
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        const char *h = o->help;
        size_t line = strcspn(h, "\n");
        if (strlen(left) > 20)
            printf("  %s\n  %-20s %.*s\n", left, "", (int)line, h);
        else
            printf("  %-20s %.*s\n", left, (int)line, h);
        for (h += line; *h == '\n'; h += line) {
            h++;
            line = strcspn(h, "\n");
            printf("  %-20s %.*s\n", "", (int)line, h);
        }
    }
    printf("%s  %-20s %s\n", any ? "" : "\n", "-h, --help", "this help");
    if (c->after)
        printf("\n%s", c->after);
}
