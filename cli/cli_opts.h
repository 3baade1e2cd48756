/* cli_opts.h: the one option parser of every subcommand. A command describes its options in a
 * table (name, kind, where the value goes, help text); cli_parse reads "--name=value" and
 * "--name value", checks numbers, reports an unknown option with the nearest known spelling, and
 * cli_help prints --help from the same table, so the two cannot drift apart. */
#ifndef XTC_CLI_OPTS_H
#define XTC_CLI_OPTS_H

#include <stddef.h>

typedef enum {
    CLI_FLAG,     /* no value: *(int *)ptr = set (1 when set is 0; -O0 uses CLI_LEVEL) */
    CLI_LEVEL,    /* no value: *(int *)ptr = set, 0 allowed (the -O0 .. -O3 family) */
    CLI_STR,      /* *(const char **)ptr = the value (an empty value is refused) */
    CLI_ANY_STR,  /* the same, an empty value allowed (a prompt) */
    CLI_INT,      /* int in [lo, hi] */
    CLI_I64,      /* int64_t in [lo, hi] */
    CLI_U64,      /* uint64_t in [lo, hi] */
    CLI_LONG,     /* long in [lo, hi] */
    CLI_DOUBLE,   /* a finite double in [lo, hi] */
    CLI_THREADS,  /* int in [1, 1024]; a warning when above the CPUs this process may use */
    CLI_FN,       /* fn(value, ptr, err, n) checks and stores (value NULL when arg is NULL) */
    CLI_NOT_HERE, /* refused: `help` says why (an option of another form of the command) */
} CliKind;

/* hi <= lo means no upper bound (the largest value of the type). */
typedef struct {
    const char *name; /* "--threads", "-o" */
    CliKind kind;
    void *ptr;
    const char *arg;  /* the value's name in --help ("T"); NULL: a flag (for CLI_FN too) */
    const char *help; /* listed by --help ('\n' starts an indented line); NULL: not listed */
    double lo, hi;
    int set;          /* CLI_FLAG, CLI_LEVEL: the value stored */
    int (*fn)(const char *value, void *ptr, char *err, size_t n); /* 0, or -1 with err set */
} CliOpt;

typedef struct {
    const char *name;     /* "compile": messages start "xtc compile: " */
    const char *usage;    /* after "usage: xtc compile ": "model.xtf -o model.so [options]" */
    const char *about;    /* --help: the paragraph before the options (may be NULL) */
    const char *after;    /* --help: text after the options (may be NULL) */
    const CliOpt *opts;
    int nopts;
    const char **pos;     /* the positional arguments, in order */
    int maxpos;           /* how many the command takes */
    const char *pos_name; /* "model": "more than one model ('a' and 'b')" */
    int quiet;            /* no warnings (argv parsed a second time, as xtc run does for a .so) */
} CliCmd;

#define CLI_NOPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Parses argv[1..argc-1]. Returns 0; 1 after printing --help (the command exits 0); 2 after
 * printing one line on stderr saying what is wrong (the command exits 2). "--" ends the options. */
int cli_parse(const CliCmd *c, int argc, char **argv);
/* Prints the --help text of c on stdout. */
void cli_help(const CliCmd *c);
/* Prints "xtc <cmd>: <what> (usage: xtc <cmd> <usage>)" on stderr; returns 2. */
int cli_usage_error(const CliCmd *c, const char *what);
/* The name of names[0..n-1] nearest to given (edit distance) when it is near enough to be the one
 * meant, else NULL. */
const char *cli_nearest(const char *given, const char *const *names, int n);
/* Whether path is a regular file that starts like a shared library (ELF). */
int cli_is_elf_file(const char *path);

#endif
