/* cli.h: subcommands of the xtc command line and their shared helpers. */
#ifndef XTC_CLI_H
#define XTC_CLI_H

#include "cli_opts.h"
#include "ir.h"
#include "safetensors.h"
#include "xtc.h"
#include "xtf.h"

int cli_ir(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_check(int argc, char **argv);
int cli_demo(int argc, char **argv);
int cli_compile(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_init(int argc, char **argv);
int cli_options(int argc, char **argv);
int cli_convert(int argc, char **argv); /* cmd_convert.c */
int cli_train(int argc, char **argv);    /* cmd_train.c */
int cli_generate(int argc, char **argv); /* cmd_generate.c */
int cli_demo_train(int argc, char **argv); /* demo_train.c: what `xtc demo` runs */
int cli_bench(int argc, char **argv); /* cmd_bench.c */
int cli_quantize(int argc, char **argv); /* cmd_quantize.c */
int cli_version(int argc, char **argv); /* cmd_version.c: also xtc --version, -V */
/* xtc run on a compiled module (cli_run hands over when the model is not a .xtf file) */
int cli_run_module(int argc, char **argv);

/* Parses and checks a .xtf file, printing diagnostics to stderr; NULL on error. */
XtfFile *cli_load_xtf(const char *path);
/* 1 after printing "xtc CMD: OUT_NAME OUT is the same file as IN_NAME IN; ..." when out and in are
 * the same existing file (device and inode, symlinks followed): writing it would destroy it. */
int cli_output_is_input(const char *cmd, const char *out_name, const char *out, const char *in_name, const char *in);

/* Checks of `xtc run` on its files (run_checks.c); each prints one line naming the file and the
 * tensor, and returns -1, on a problem. Ids of inputs that index an embedding or a loss against
 * its size; with --check-finite, NaN/inf in the weights, the inputs the model reads (inputs = 1),
 * and the outputs. */
int cli_check_ids(const IrGraph *g, const RtStFile *inputs, const char *path);
int cli_check_finite_file(const IrGraph *g, const RtStFile *f, const char *path, int inputs);
int cli_check_finite_outputs(const IrGraph *g, const IrHostTensor *outs);
/* The same for a compiled module m, on the file at path: what = "weight" (every tensor), "input"
 * (the tensors that are inputs of m) or "output" (every tensor: the outputs and gradients the
 * run wrote). */
int cli_check_finite_module_file(const XtcModule *m, const char *path, const char *what);

/* Callbacks (CLI_FN) of options several commands share. --disable-pass=NAME: ptr is a
 * PassOptions whose disable array holds CLI_MAX_DISABLE names; --mask: ptr is an XtLowerOpts
 * (every padding-mask input); --dtype: ptr is a const char * (f32, bf16 or fp16); --mma: ptr is
 * an int (CgOptions.mma: auto, off, bf16, fp16). */
#define CLI_MAX_DISABLE 64
int cli_opt_disable_pass(const char *v, void *ptr, char *err, size_t n);
int cli_opt_mask(const char *v, void *ptr, char *err, size_t n);
int cli_opt_dtype(const char *v, void *ptr, char *err, size_t n);
int cli_opt_mma(const char *v, void *ptr, char *err, size_t n);

#endif
