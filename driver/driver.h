/* driver.h: the one compile driver of xtc. Every command that makes or shows a graph, and every
 * test that compiles a model, goes through drv_run:
 *
 *   .xtf --xt_lower--> IrGraph --ir_autodiff (grads)--> --pass_run_pipeline--> --cg_compile--> model.so
 *        DRV_LOWER             DRV_AUTODIFF                DRV_PASSES             DRV_CODEGEN
 *
 * The target is resolved once (drv_target) into a DrvTarget: plain data that autodiff (the loss
 * scale of fp16 storage), the passes (PassTarget: the ops the backend lowers, the limits of its
 * fused kernels) and code generation (backend, storage, mma, CPU) all read. A job may start from
 * a graph instead of a file (at any stage), and stop after any stage, handing back the graph as
 * that stage left it (xtc ir prints it; tests run the interpreter on it).
 *
 * A training graph (grads) gets "loss" and one "grad.<name>" per parameter: the gradient of the
 * built-in loss when the graph has an output "loss" (XtLowerOpts.train), else of sum(O * grad.O)
 * over the f32 outputs O with caller-supplied inputs grad.O (PyTorch's y.backward(g); ViT
 * features, continuous outputs). The driver prints nothing: errors are one line in err. */
#ifndef XTC_DRIVER_H
#define XTC_DRIVER_H

#include "codegen.h"
#include "passes.h"
#include "xtc.h"
#include "xtf.h"

/* The target, resolved once. */
typedef struct {
    const char *name;          /* "cpu", "cuda", "cuda-emu", or "interp": no backend (the
                                * reference interpreter runs the graph; nothing is compiled) */
    const CgBackend *backend;  /* NULL for "interp" */
    unsigned caps;             /* CG_CAP_* of the backend (0 for "interp") */
    const char *dtype;         /* storage of floating-point tensors as asked (NULL = f32) */
    int storage;               /* the same as a number: 0 f32, 1 bf16, 2 fp16 (cg_dtype_parse) */
    int mma;                   /* CG_MMA_* as asked; code generation resolves AUTO by storage and arch */
    const char *cuda_arch;     /* cuda targets: the PTX architecture (NULL = sm_80) */
    int arch;                  /* cuda targets: its number (80); 0 elsewhere */
    const char *cpu, *features;/* cpu: the LLVM CPU and features (NULL = this machine's) */
    int int8;                  /* --weights-dtype int8: the matmul weights quantized (passes/quantize.c) */
    int quant_group;           /* their scales' group along k (0: one scale per output column) */
    const char *kv_dtype;      /* cpu: the KV caches' storage as asked (NULL: that of dtype) */
    int kv_storage;            /* ... as resolved (cg_kv_storage): 0 f32, 1 bf16, 3 int8 rows */
    const char *loss_scale;    /* autodiff: the loss-scale input fp16 storage needs, else NULL */
    PassTarget passes;         /* the passes: what the backend lowers and its kernels' limits */
} DrvTarget;

/* Resolves the target that ask names: ask->target (NULL = "cpu"; "interp" for the interpreter),
 * ->dtype, ->mma, ->cuda_arch, ->emit_cuda, ->cpu, ->features, ->weights_dtype, ->quant_group and ->kv_dtype
 * (the other fields are ignored).
 * Returns 0, or -1 with one line in err: an unknown target, a 16-bit dtype for a backend that
 * stores f32 only, CUDA options for a CPU target, an unknown CPU ("--cpu: ..."), int8 weights for a
 * backend without them, with 16-bit storage or operands, a group outside [1, 1 << 20], or a
 * --kv-dtype other than f32, bf16 or int8, or for a target other than the cpu. */
int drv_target(DrvTarget *t, const CgOptions *ask, char *err, size_t n);

/* With t->int8 the autodiff stage quantizes the matmul weights instead (pass_quantize_weights:
 * int8 weights are for inference); a job with grads is refused (training keeps f32 weights). */
typedef enum { DRV_LOWER = 1, DRV_AUTODIFF, DRV_PASSES, DRV_CODEGEN } DrvStage;

/* "lower", "autodiff", "passes", "codegen" */
const char *drv_stage_name(DrvStage s);

typedef struct {
    /* The input: a checked .xtf file and a model of it, or a graph. */
    const XtfFile *file;
    const char *model;          /* statement name; NULL = the file's last */
    XtLowerOpts lower;          /* .train adds targets/loss, .kv_cache the decoding graph, ... */
    XtfDiag *diag;              /* when set, lowering's diagnostics (file:line:col, caret) go here;
                                 * else their first line goes to err */
    IrGraph *graph;             /* instead of file: this graph enters at stage start; never freed,
                                 * differentiated in place when autodiff runs on it */
    DrvStage start;             /* with graph: the first stage run (0 = DRV_AUTODIFF) */
    DrvStage stop_after;        /* the last stage run (0 = DRV_CODEGEN: the module is written) */
    int grads;                  /* DRV_AUTODIFF: append the backward graph (see above) */
    /* DRV_PASSES: disable, no_fuse, stop_after, dumps, log; .target is the DrvTarget's whatever
     * it says. NULL: every pass, verified after each. */
    const PassOptions *passes;
    /* DRV_CODEGEN: .output (required), .opt_level (as given: 0 is -O0), .source (NULL = the
     * file's text), .source_name, .emit_llvm, .emit_cuda, .parts; the target fields (target,
     * dtype, mma, cuda_arch, cpu, features) come from the DrvTarget. */
    CgOptions cg;
} DrvJob;

/* Runs job for t up to job->stop_after. Returns 0, or -1 with one line in err. When out is set,
 * *out gets the graph as the last stage left it (DRV_CODEGEN: the graph compiled), the caller's
 * to free; NULL when that is job->graph itself (no stage made a new graph). stats (may be NULL)
 * gets cg_compile's statistics. */
int drv_run(const DrvJob *job, const DrvTarget *t, IrGraph **out, CgStats *stats, char *err, size_t n);

/* Compiles job (to DRV_CODEGEN) into a fresh temporary file, loads it and removes the file (the
 * loaded module keeps its mapping). NULL with one line in err. */
XtcModule *drv_build_load(const DrvJob *job, const DrvTarget *t, CgStats *stats, char *err, size_t n);

#endif
