/* fused_expr.h: the program of a `fused` node (ops.def): a chain of elementwise ops, last-axis
 * reductions and softmaxes over its operands, written as text in the node's string attribute.
 *
 *   program := step { ';' step }                 the last step is the node's value
 *   step    := NAME '(' arg { ',' arg } ')'      an op of ops.def by name: an elementwise op,
 *                                                sum / reduce_max (over the argument's last axis,
 *                                                kept with size 1), softmax (last axis)
 *            | 'cast:' DTYPE '(' arg ')'
 *            | 'bcast(' arg ')'                  the argument expanded to the node's shape
 *            | 'slice(' arg ',' START ',' LEN ')'  [START, START + LEN) of the last axis
 *            | 'concat(' arg ',' arg ')'         the two joined along the last axis
 *            | 'permute(' arg {',' AXIS} ')'     an operand's axes permuted, the last one kept
 *            | 'matmul(' arg ',' arg ',' TB ')'  the matmul op (TB: transpose_b), at most once: the
 *                                                program is then the matmul's epilogue
 *   arg     := '$' K                             operand K
 *            | '%' I                             the value of step I (earlier)
 *            | NUMBER ':' DTYPE                  a scalar constant: 0.5:f32, 1:bool, -3:i64
 *
 * e.g. LayerNorm over 512 columns:
 *   sum($0);mul(%0,0.001953125:f32);sub($0,%1);mul(%2,%2);sum(%3);mul(%4,0.001953125:f32);
 *   add(%5,1.0000000000000001e-05:f32);rsqrt(%6);mul(%2,%7);mul(%8,$1);add(%9,$2)
 *
 * Each step is exactly the IR op of that name with numpy broadcasting, so the program is a small
 * graph: ir_fused_graph() builds it, and the node's value is the last step's broadcast to the
 * node's shape (which the node carries). Shape inference, the interpreter and the backends all
 * read the program through this file. */
#ifndef XTC_FUSED_EXPR_H
#define XTC_FUSED_EXPR_H

#include "ir.h"

#define IR_FUSED_MAXSTEPS 96

typedef struct {
    char kind;      /* '$' operand, '%' step, 'c' constant */
    int idx;        /* operand or step */
    double value;   /* constant */
    IrDType dtype;  /* constant */
} IrFusedRef;

typedef struct {
    IrOp op;            /* IR_EXPAND for bcast */
    IrDType cast_to;    /* IR_CAST */
    int64_t start, len; /* IR_SLICE; IR_MATMUL: start = transpose_b */
    int nperm;          /* IR_PERMUTE */
    int8_t perm[IR_MAXRANK];
    int nargs;
    IrFusedRef arg[3];
} IrFusedStep;

typedef struct {
    int nsteps;
    IrFusedStep step[IR_FUSED_MAXSTEPS];
} IrFusedProgram;

/* Parses a program; -1 with a message. Checks the form only (ops and argument counts, step
 * references to earlier steps); shapes and types are checked by building the graph. */
int ir_fused_parse(const char *text, IrFusedProgram *p, char *err, size_t n);

/* Writes p as text; -1 when it does not fit in n bytes. */
int ir_fused_write(const IrFusedProgram *p, char *buf, size_t n);

/* The program as a graph of its own: inputs x0, x1, ... of the given types and shapes (IrDims
 * over the caller's symbol indices; the graph declares IR_MAXSYM placeholder symbols), one node
 * per step, and the output "y", the last step broadcast to out_shape. Returns the graph and the
 * node of each step in steps[] (may be NULL), or NULL with a message. */
IrGraph *ir_fused_graph(const IrFusedProgram *p, int nin, const IrDType *dtypes, const int *ranks,
                        IrDim (*shapes)[IR_MAXRANK], int out_rank, const IrDim *out_shape, IrNode **steps,
                        char *err, size_t n);

/* The same for a fused node's program and operands. */
IrGraph *ir_fused_graph_of(const IrNode *node, IrFusedProgram *p, IrNode **steps, char *err, size_t n);
/* How a matmul epilogue reads its product. nodes[0 .. n) are the epilogue's nodes in decreasing
 * id order (every reader of a node before it), nodes[0] its root, mm one of them. Column offsets
 * are followed from the root (offset 0) to mm: a last-axis slice adds its start, a concat or a
 * reduction reads other columns. Returns 1 when mm has the root's shape and is read only at the
 * root's own column (bias and activation after the product); 2 when mm is twice the root's
 * constant width and read only at the root's column and at that plus the width, through slices
 * of the two halves (GLU: value * gelu(gate) from one projection); 0 for anything else, which a
 * matmul's kernel cannot apply to the blocks of the product it holds. */
int ir_epilogue_parts(const IrNode *const *nodes, int n, const IrNode *mm);
/* The same for a fused node's program (steps[] from ir_fused_graph_of) and its matmul step, as
 * both backends read it: a product of the node's shape in a program without slices or concats
 * is rewritten in place (1); otherwise the program's value must have the node's shape and
 * ir_epilogue_parts decides (2 for GLU's halves, 0: no matmul kernel can run it). */
int ir_fused_epilogue_parts(const IrNode *node, const IrFusedProgram *p, IrNode *const *steps, const IrNode *mm);

/* 1 for the steps that reduce the last axis (sum, reduce_max, softmax): a kernel with one
 * computes them per row before the elementwise steps that read them. */
int ir_fused_is_reduce(IrOp op);

/* What a fused node's program graph pg (from ir_fused_graph_of, its steps in steps[]) must be for
 * a backend's kernel, the same on the CPU and the GPU: no computed value of a rank above the
 * node's; a permute only of an operand, keeping its last axis; at most one matmul, of two
 * operands, at the node's rank, with no reduction beside it and read as ir_fused_epilogue_parts
 * allows. Sets *has_reduce (a sum, reduce_max or softmax among the steps), *mm (the matmul
 * step or NULL) and *mm_parts (its ir_fused_epilogue_parts, 0 without one). Returns 0, or -1
 * with a message naming what does not fit. */
int ir_fused_kernel_check(const IrNode *node, const IrGraph *pg, const IrFusedProgram *p, IrNode *const *steps,
                          int *has_reduce, const IrNode **mm, int *mm_parts, char *err, size_t n);

#endif
