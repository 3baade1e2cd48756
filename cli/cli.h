/* cli.h: subcommands of the xtc command line and their shared helpers. */
#ifndef XTC_CLI_H
#define XTC_CLI_H

#include "ir.h"
#include "xtf.h"

int cli_ir(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_check(int argc, char **argv);
int cli_demo(int argc, char **argv);

/* Parses and checks a .xtf file, printing diagnostics to stderr; NULL on error. */
XtfFile *cli_load_xtf(const char *path);
/* Lowers a checked file; prints diagnostics; NULL on error. */
IrGraph *cli_lower(XtfFile *f, const char *model, const XtLowerOpts *opt);

/* Flag parsing: "--name=value" or "--name value". Returns the value or NULL. */
const char *cli_flag_value(int argc, char **argv, int *i, const char *name);

#endif
