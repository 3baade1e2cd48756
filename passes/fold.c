/* fold.c: constant folding.
 *
 * Requires: a graph that verifies.
 * Produces: every elementwise node (IR_ELEM in ops.def: unary, binary, where, not, cast) whose
 * operands are all constant (a CONST, or a view of one that only repeats its value: expand,
 * reshape, permute, slice) replaced by a scalar CONST, expanded to the node's shape when the
 * node is not a scalar. Folding cascades in one walk, since operands are folded before their
 * users.
 * Exact: the value is computed by the reference interpreter itself (ir_interp_f64 on a one-op
 * graph), so it is the double the interpreter would hold at that node, then taken to the node's
 * dtype as the interpreter holds it (integers truncated, bool 0/1, f32 kept as that double): the
 * folded graph gives the interpreter's outputs bit for bit. Backends round an f32 CONST to float
 * when they emit it, as they do for every constant. A fold the interpreter refuses (integer
 * division by zero, an integer out of its exact range) is left alone, so the error still happens
 * when the graph runs. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

#include "rewrite.h"

static int bind_none(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    (void)ctx, (void)leaf, (void)out;
    return -1;
}

/* The interpreter's value of op(consts) for the scalar operands v[], or -1 if it refuses. */
static int eval_scalar(const IrNode *p, const double *v, double *out)
{
    IrGraph *s = ir_graph_new("fold");
    if (!s)
        return -1;
    IrNode q = *p;
    q.label = NULL;
    for (int k = 0; k < p->nin; k++)
        q.in[k] = ir_const(s, v[k], p->in[k]->dtype);
    q.rank = 0; /* cast carries its shape: make it a scalar like its operand */
    memset(q.shape, 0, sizeof q.shape);
    IrNode *y = ir_node(s, &q);
    int rc = -1;
    IrHostTensor t;
    memset(&t, 0, sizeof t);
    if (y && ir_output(s, "y", y) == 0 && ir_interp_f64(s, bind_none, NULL, &t, NULL, 0) == 0) {
        switch (y->dtype) {
        case IR_F32: *out = *(const double *)t.data; break;
        case IR_I32: *out = *(const int32_t *)t.data; break;
        case IR_I64: *out = (double)*(const int64_t *)t.data; break;
        default: *out = *(const uint8_t *)t.data != 0; break;
        }
        rc = 0;
    }
    ir_host_free(&t);
    ir_graph_free(s);
    return rc;
}

static IrNode *fold(PassRewriter *rw, const IrNode *old, IrNode *p)
{
    if (!(ir_ops[p->op].flags & IR_ELEM))
        return pass_build(rw, p);
    double v[IR_MAXIN], r;
    for (int k = 0; k < p->nin; k++)
        if (!pass_const_value(p->in[k], &v[k]))
            return pass_build(rw, p);
    if (eval_scalar(p, v, &r) < 0)
        return pass_build(rw, p);
    return pass_broadcast_to(rw->g, ir_const(rw->g, r, old->dtype), old);
}

IrGraph *pass_fold(IrGraph *g, const PassTarget *t, char *err, size_t n)
{
    (void)t; /* no capability decides here */
    return pass_rewrite(g, fold, NULL, NULL, err, n);
}
