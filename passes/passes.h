/* passes.h: the pass pipeline of xtc (STYLE.md, practice 3; QBE's main.c is the model).
 *
 * A pass is a named function from a graph to a new graph. The IR is immutable and hash-consed,
 * so a pass never edits nodes: it rebuilds the graph through pass_rewrite() (passes/rewrite.h),
 * substituting where it has something to say. The input graph is left untouched; the caller
 * owns both.
 *
 * pass_pipeline[] is the one list of passes, in the order they run. Every pass there is exact:
 * see each file's header for what it requires, what it produces and how exact it is. Training
 * graphs are differentiated (ir_autodiff) before the pipeline runs, so fusions see forward and
 * backward together (practice 4).
 *
 * The compile driver (driver/driver.h) runs it between lowering (and autodiff) and codegen,
 * with the target's PassTarget; tests of the passes call pass_run_pipeline on IR text.
 */
#ifndef XTC_PASSES_H
#define XTC_PASSES_H

#include <stddef.h>
#include <stdio.h>

#include "ir.h"

/* What the backend can take, as the passes see it: plain data, resolved once from the target by
 * the compile driver (driver/driver.h, drv_target). A pass that makes an op the backend cannot
 * lower, or a fused kernel past its limits, leaves the pattern unfused for that backend. */
typedef struct {
    /* Whether the backend has a lowering for op (CgBackend.supports): fusions whose op it cannot
     * lower are skipped. NULL: every op (the interpreter runs them all). */
    int (*supports)(IrOp op);
    /* The largest constant head size (of q and k, and of v) the backend's fused attention kernel
     * takes, and that of its gradient kernel (attention_grad); 0: no bound (the interpreter). */
    int attention_max_head;
    int attention_grad_max_head;
    /* Whether the fused attention kernel reads grouped key/values (k, v with fewer heads than
     * q: ops.def) in place; where it does not, kv_groups keeps the lowering's repeat of k and v
     * (a copy) in front of it. 0 in a zeroed PassTarget: the copy stays. */
    int attention_kv_groups;
    /* Whether its gradient kernel (attention_grad) reads them too: dk, dv summed over each group
     * in the kernel (ops.def). Where it does not, an attention an attention_grad reads keeps the
     * repeat, and the repeat's gradient (a sum over each group) stays. 0 in a zeroed PassTarget. */
    int attention_grad_kv_groups;
} PassTarget;

typedef struct {
    const char *name;    /* for --disable-pass=NAME and xtc ir --after=NAME */
    const char *summary; /* one line, for listings */
    /* Returns a new graph (g is not freed), or NULL with a message in err. t: the target's
     * capabilities (NULL: no bounds, every op). */
    IrGraph *(*run)(IrGraph *g, const PassTarget *t, char *err, size_t n);
    int is_fusion;       /* turned off as a group by --no-fuse */
    /* A fusion: the op it creates. When PassOptions.supports says the backend cannot lower it,
     * the pass is skipped and the pattern stays unfused for that backend. IR_NUM_OPS: none. */
    IrOp produces;
    /* A second op it may create (attention's gradient), checked the same way; 0 (a leaf, which
     * no pass creates) or IR_NUM_OPS: none. */
    IrOp produces_also;
} Pass;

/* The pipeline, in order, ended by an entry whose name is NULL. */
extern const Pass pass_pipeline[];
int pass_count(void);
const Pass *pass_find(const char *name);   /* NULL if no pass has that name */

/* 0 if name is a pass, else -1 with "unknown pass 'x' (passes: cse, fold, ...)" in err. */
int pass_check_name(const char *name, char *err, size_t n);

/* One line per pass: "  name       summary", fusions marked "(fusion)". */
void pass_list(FILE *out);

typedef struct {
    const char *const *disable; /* pass names not to run (--disable-pass=NAME, repeatable) */
    int ndisable;
    int no_fuse;                /* --no-fuse: skip every pass with is_fusion */
    const char *stop_after;     /* xtc ir --after=NAME: return the graph as that pass left it
                                   (a disabled pass still marks the point); NULL = run all */
    int verify_each;            /* ir_verify after every pass that runs; a failure names the
                                   pass and the node */
    /* Debug dumps: after each pass named in dump_after (comma separated, or "all"), print
     * "# after NAME" and the graph to dump. NULL dump or dump_after: no dumps. */
    FILE *dump;
    const char *dump_after;
    FILE *log;                  /* when set: one line per pass with the node counts */
    /* The backend's capabilities (see PassTarget); NULL: every op, no bounds (the interpreter).
     * The compile driver sets it from the target. */
    const PassTarget *target;
} PassOptions;

/* Runs the pipeline on g (not freed) and returns a new graph owned by the caller, or NULL with a
 * message in err ("pass 'fold': ..." when a pass fails; unknown names in o are errors too).
 * o may be NULL (every pass, no checks). */
IrGraph *pass_run_pipeline(IrGraph *g, const PassOptions *o, char *err, size_t n);
/* The same over another list of passes (ended by a NULL name): for tests. */
IrGraph *pass_run_list(const Pass *list, IrGraph *g, const PassOptions *o, char *err, size_t n);

/* The passes themselves, one per file. */
IrGraph *pass_dce(IrGraph *g, const PassTarget *t, char *err, size_t n);
IrGraph *pass_cse(IrGraph *g, const PassTarget *t, char *err, size_t n);
IrGraph *pass_fold(IrGraph *g, const PassTarget *t, char *err, size_t n);
IrGraph *pass_simplify(IrGraph *g, const PassTarget *t, char *err, size_t n);
IrGraph *pass_fuse_attention(IrGraph *g, const PassTarget *t, char *err, size_t n);
IrGraph *pass_attention_bound(IrGraph *g, const PassTarget *t, char *err, size_t n);
IrGraph *pass_kv_groups(IrGraph *g, const PassTarget *t, char *err, size_t n);
IrGraph *pass_fuse_elementwise(IrGraph *g, const PassTarget *t, char *err, size_t n);

/* int8 weights (quantize.c; not in the pipeline: it changes the module's interface, and the
 * compile driver runs it before the pipeline when asked): every matmul weight (a Linear's, used
 * only as a matmul's transposed B) becomes the buffers "<name>" i8 [n, k] and "<name>.scale" f32
 * [n, ceil(k / group)] read by matmul_q8; group 0 = k (one scale per output column). *count (may
 * be NULL) gets the number of weights quantized. NULL with a message on error. */
IrGraph *pass_quantize_weights(IrGraph *g, int64_t group, int *count, char *err, size_t n);

#endif
