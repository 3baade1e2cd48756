/* build.h: the compile pipeline behind `xtc compile`, `xtc train` and `xtc generate`:
 *
 *   .xtf --xt_lower--> IrGraph --ir_autodiff (training)--> --pass_run_pipeline--> --cg_compile--> model.so
 *
 * A training module (.grads) computes "loss" and one "grad.<name>" per parameter: the gradient of
 * the built-in loss when the lowering made one (XtLowerOpts.train), else of sum(O * grad.O) over
 * the f32 outputs O with caller-supplied inputs grad.O (PyTorch's y.backward(g); ViT features,
 * continuous outputs). Errors are printed on stderr, CLI style. */
#ifndef XTC_CLI_BUILD_H
#define XTC_CLI_BUILD_H

#include "codegen.h"
#include "passes.h"
#include "xtf.h"
#include "xtc.h"

typedef struct {
    const char *model;          /* statement name; NULL = the file's last */
    XtLowerOpts lower;          /* .train adds targets/loss, .kv_cache the decoding graph */
    int grads;                  /* append the backward graph (see above) */
    const PassOptions *passes;  /* NULL = every pass (fusions the target can lower), verified */
    CgOptions cg;               /* .output is required; .source defaults to the .xtf text */
} CliBuild;

/* Lowers (and differentiates) and runs the pass pipeline; NULL after printing why. */
IrGraph *cli_build_graph(const XtfFile *f, const CliBuild *b);

/* The whole pipeline into b->cg.output; 0, or -1 after printing why. stats may be NULL. */
int cli_build_module(const XtfFile *f, const CliBuild *b, CgStats *stats);

/* For train/generate: compiles f with b into a fresh temporary file, loads it and removes the
 * file (the loaded module keeps its mapping). NULL after printing why. */
XtcModule *cli_build_load(const XtfFile *f, CliBuild *b, CgStats *stats);

/* Loads a module file, printing the error; NULL on failure. */
XtcModule *cli_load_module(const char *path);

/* 1 if path names a compiled module by its extension (.so), 0 for anything else (.xtf). */
int cli_is_module_path(const char *path);

/* Parses the .xtf text embedded in a module (xtc_module_source); NULL after printing why. */
XtfFile *cli_module_xtf(const XtcModule *m, const char *path);

#endif
