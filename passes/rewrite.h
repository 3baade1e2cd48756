/* rewrite.h: the one graph-rewriting helper every pass is written with.
 *
 * pass_rewrite() walks the old graph in topological order and builds a new graph: for each kept
 * node it makes a prototype (the old node with its operands replaced by their new images) and
 * hands it to the pass's callback, which returns the node's image in the new graph: usually
 * pass_build(rw, proto), or a substitute (an operand, a constant, a fused op) built in rw->g.
 * Symbols (names and bounds), the graph name, labels and outputs are copied.
 *
 * Because nodes are built through ir_node(), identical nodes merge on the way (CSE for free),
 * and every new node is shape-checked. A node's image inherits the old node's label when it has
 * none, so labels stay unique and readable.
 *
 * Nodes are rebuilt eagerly, so the pieces of a replaced pattern stay behind until `dce` runs;
 * rw->uses counts only live uses (by nodes the outputs need, and by outputs), so those leftovers
 * never make a value look shared. */
#ifndef XTC_REWRITE_H
#define XTC_REWRITE_H

#include "ir.h"

typedef struct PassRewriter {
    const IrGraph *old;
    IrGraph *g;        /* the graph being built */
    IrNode **map;      /* [old->nnodes]: image of each old node built so far, else NULL */
    const int *uses;   /* [old->nnodes]: live uses of each old node (operand slots + outputs) */
    const char *live;  /* [old->nnodes]: 1 if an output needs the node */
    void *ctx;         /* the pass's own state */
} PassRewriter;

/* old: the node being rewritten; proto: a copy of it whose operands are already images in rw->g
 * (the callback may change it). Returns the image, or NULL after setting rw->g's error (the
 * builders do that) or calling pass_fail(). */
typedef IrNode *(*PassRewriteFn)(PassRewriter *rw, const IrNode *old, IrNode *proto);

/* Rewrites g. keep: NULL to visit every node, else a [g->nnodes] mask of the nodes to rebuild
 * (it must hold every operand of a kept node and every output). fn NULL rebuilds unchanged.
 * Returns the new graph, or NULL with "node %label (op): message" in err. */
IrGraph *pass_rewrite(const IrGraph *g, PassRewriteFn fn, void *ctx, const char *keep, char *err,
                      size_t n);

/* The same, where retype_leaves lets a parameter's image have another dtype (the weights'
 * quantization, passes/quantize.c, which is not exact and says so); every other node keeps its
 * type. */
IrGraph *pass_rewrite_leaves(const IrGraph *g, PassRewriteFn fn, void *ctx, const char *keep, int retype_leaves,
                             char *err, size_t n);

/* ir_node(rw->g, proto): the default image. */
IrNode *pass_build(PassRewriter *rw, const IrNode *proto);
/* The image simplify.c gives: fusions rebuild the nodes they do not replace through it, so that
 * what their new nodes make simpler (a slice of their slice) is simplified in the same walk and
 * the pipeline stays idempotent. */
IrNode *pass_simplify_node(PassRewriter *rw, const IrNode *old, IrNode *proto);

/* Records an error in the new graph; returns NULL for `return pass_fail(...)`. */
IrNode *pass_fail(PassRewriter *rw, const char *fmt, ...);

/* live[i] = 1 when an output of g needs node i: malloc'ed [g->nnodes], NULL when out of memory.
 * uses, when not NULL, receives the live use counts ([g->nnodes], caller allocated). */
char *pass_liveness(const IrGraph *g, int *uses);

/* ---- small queries shared by the passes ---- */

/* 1 if every element of x is the same constant, found through CONST and the views that only
 * repeat or rearrange elements (expand, reshape, permute, slice); *v gets the value as the
 * interpreter holds it (ints truncated, bool 0/1). */
int pass_const_value(const IrNode *x, double *v);
int pass_same_shape(const IrNode *a, const IrNode *b);   /* same rank and dims */
/* x broadcast to the shape of like (x must broadcast to it): x itself when the shapes agree,
 * else an expand. Used when an identity removes an operation whose result was broadcast. */
IrNode *pass_broadcast_to(IrGraph *g, IrNode *x, const IrNode *like);

#endif
