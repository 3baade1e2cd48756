/* build.h: the command line's side of the compile driver (driver/driver.h): running a job with
 * the errors printed CLI style, building a temporary module for train/generate, and the small
 * helpers around loading modules and the .xtf text they carry. */
#ifndef XTC_CLI_BUILD_H
#define XTC_CLI_BUILD_H

#include "driver.h"
#include "xtf.h"
#include "xtc.h"

/* drv_run, printing why it failed: lowering's diagnostics and "xtc: cannot lower PATH", or
 * "PREFIX: <why>" ("xtc compile"). job->diag is the helper's own. Returns drv_run's status. */
int cli_drive(const char *prefix, const DrvJob *job, const DrvTarget *t, IrGraph **out, CgStats *stats);

/* For train/generate: compiles model of f with job (its file and -O2 set here) for the cpu
 * target into a temporary module and loads it. NULL after printing why. */
XtcModule *cli_build_load(const XtfFile *f, const DrvJob *job);

/* Loads a module file, printing the error; NULL on failure. */
XtcModule *cli_load_module(const char *path);

/* 1 if path names a compiled module by its extension (.so), 0 for anything else (.xtf). */
int cli_is_module_path(const char *path);

/* Parses the .xtf text embedded in a module (xtc_module_source); NULL after printing why. */
XtfFile *cli_module_xtf(const XtcModule *m, const char *path);

/* xtc bench --decode (bench_decode.c): what cmd_bench.c parsed */
typedef struct {
    const char *path, *model, *dtype, *dir;
    const char *against; /* --against PASS: every pass but PASS against every pass (f32 both) */
    int mma, threads, repeat, opt_level;
    int64_t context;
    const DrvTarget *t; /* --dtype and --mma resolved */
} BenchDecode;
int cli_bench_decode(const BenchDecode *d);

#endif
