/* interp_fused.h: the reference semantics of the fused ops (ops.def, "fused ops"), for the
 * interpreter (ir/interp.c hands each fused node's operand values here). Each function computes
 * in double precision exactly what the subgraph the fusion replaced computes, written out
 * directly, so that the interpreter stays the oracle for fused graphs too. */
#ifndef XTC_INTERP_FUSED_H
#define XTC_INTERP_FUSED_H

#include "ir.h"

/* A value as the interpreter holds it: row-major doubles (bool as 0/1). */
typedef struct {
    int rank;
    const int64_t *shape;
    const double *data;
} IrFusedArg;

/* out has the node's shape (out_shape[n->rank]); in[k] is operand k. Returns 0, or -1 with a
 * message in err. */
int ir_fused_attention(const IrNode *n, const IrFusedArg *in, const int64_t *out_shape, double *out, char *err,
                       size_t nerr);
int ir_fused_attention_grad(const IrNode *n, const IrFusedArg *in, const int64_t *out_shape, double *out,
                            char *err, size_t nerr);
/* fused (a program, fused_expr.h): the program's graph run by the interpreter itself, at these
 * sizes, so its value is the replaced subgraph's bit for bit. */
int ir_fused_program(const IrNode *n, const IrFusedArg *in, const int64_t *out_shape, double *out, char *err,
                     size_t nerr);

#endif
