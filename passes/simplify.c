/* simplify.c: exact algebraic simplifications.
 *
 * Requires: a graph that verifies.
 * Produces: the same graph with these rewrites applied (x broadcast to the node's shape where
 * the removed op broadcast it; "c" is a constant, see pass_const_value):
 *
 *   x * 1, 1 * x, x / 1           -> x
 *   x + 0, 0 + x, x - 0           -> x
 *   neg(neg(x)), not(not(x))      -> x
 *   max(x, x), min(x, x)          -> x
 *   and(x, true), or(x, false), and(x, x), or(x, x) -> x
 *   where(c, x, y)                -> x or y;   where(m, x, x) -> x
 *   cast of x to x's own dtype    -> x
 *   reshape(reshape(x))           -> one reshape (none if it gives x's shape back)
 *   permute(permute(x))           -> the composed permute; an identity permute -> x
 *   slice of the full range       -> x;  slice(slice(x)) on one axis -> one slice
 *   expand to x's own shape       -> x;  expand(expand(x)) -> one expand
 *
 * Exact: every rewrite gives the same value bit for bit, with one exception of sign: x + 0 and
 * x - (-0) give +0 where x is -0, and the rewrite keeps -0 (equal as numbers; only a division by
 * that zero could tell them apart). x * 0 is NOT folded (NaN and inf times 0 are NaN), and
 * nothing is reassociated. */
#include "passes.h"

#include <math.h>
#include <string.h>

#include "rewrite.h"

static int is_const(const IrNode *x, double want)
{
    double v;
    return pass_const_value(x, &v) && v == want;
}

/* x, the operand an identity leaves, broadcast to the node's shape */
static IrNode *keep(PassRewriter *rw, IrNode *x, const IrNode *old)
{
    return pass_broadcast_to(rw->g, x, old);
}

static IrNode *simplify_binary(PassRewriter *rw, const IrNode *old, IrNode *p)
{
    IrNode *a = p->in[0], *b = p->in[1];
    switch (p->op) {
    case IR_MUL:
        if (is_const(b, 1))
            return keep(rw, a, old);
        if (is_const(a, 1))
            return keep(rw, b, old);
        break;
    case IR_DIV:
        if (is_const(b, 1))
            return keep(rw, a, old);
        break;
    case IR_ADD:
        if (is_const(b, 0)) /* -0 == 0: either zero */
            return keep(rw, a, old);
        if (is_const(a, 0))
            return keep(rw, b, old);
        break;
    case IR_SUB:
        if (is_const(b, 0))
            return keep(rw, a, old);
        break;
    case IR_MAX:
    case IR_MIN:
        if (a == b)
            return a;
        break;
    case IR_AND:
        if (a == b || is_const(b, 1))
            return keep(rw, a, old);
        if (is_const(a, 1))
            return keep(rw, b, old);
        break;
    case IR_OR:
        if (a == b || is_const(b, 0))
            return keep(rw, a, old);
        if (is_const(a, 0))
            return keep(rw, b, old);
        break;
    default:
        break;
    }
    return pass_build(rw, p);
}

static int is_identity(const int8_t *perm, int rank)
{
    for (int i = 0; i < rank; i++)
        if (perm[i] != i)
            return 0;
    return 1;
}

static IrNode *simplify_view(PassRewriter *rw, IrNode *p)
{
    IrGraph *g = rw->g;
    IrNode *x = p->in[0];
    switch (p->op) {
    case IR_RESHAPE:
        if (x->op == IR_RESHAPE)
            x = x->in[0];
        return ir_reshape(g, x, p->rank, p->shape); /* x itself when the shape is x's */
    case IR_PERMUTE: {
        int perm[IR_MAXRANK];
        for (int i = 0; i < x->rank; i++)
            perm[i] = p->perm[i];
        if (x->op == IR_PERMUTE) { /* out[i] = mid[p2[i]], mid[j] = x[p1[j]] */
            for (int i = 0; i < x->rank; i++)
                perm[i] = x->perm[p->perm[i]];
            x = x->in[0];
        }
        int8_t p8[IR_MAXRANK] = {0};
        for (int i = 0; i < x->rank; i++)
            p8[i] = (int8_t)perm[i];
        if (is_identity(p8, x->rank))
            return x;
        return ir_permute(g, x, perm);
    }
    case IR_SLICE: {
        int axis = (int)p->ia[IR_IA_AXIS];
        IrDim start = p->d;
        if (x->op == IR_SLICE && x->ia[IR_IA_AXIS] == axis) {
            start = ir_dim_add(start, x->d);
            x = x->in[0];
        }
        return ir_slice(g, x, axis, start, p->shape[axis]); /* x itself for the full range */
    }
    case IR_EXPAND:
        if (x->op == IR_EXPAND)
            x = x->in[0];
        if (pass_same_shape(x, p))
            return x;
        return ir_expand(g, x, p->rank, p->shape);
    default:
        return pass_build(rw, p);
    }
}

static IrNode *simplify(PassRewriter *rw, const IrNode *old, IrNode *p)
{
    IrNode *x = p->nin ? p->in[0] : NULL;
    double c;
    switch (p->op) {
    case IR_NEG:
    case IR_NOT:
        if (x->op == p->op)
            return x->in[0];
        break;
    case IR_CAST:
        if (x->dtype == p->dtype)
            return x;
        break;
    case IR_WHERE:
        if (p->in[1] == p->in[2])
            return keep(rw, p->in[1], old);
        if (pass_const_value(x, &c))
            return keep(rw, p->in[c != 0 ? 1 : 2], old);
        break;
    case IR_RESHAPE:
    case IR_PERMUTE:
    case IR_SLICE:
    case IR_EXPAND:
        return simplify_view(rw, p);
    default:
        if (p->nin == 2 && (ir_ops[p->op].flags & IR_ELEM))
            return simplify_binary(rw, old, p);
        break;
    }
    return pass_build(rw, p);
}

IrGraph *pass_simplify(IrGraph *g, const PassTarget *t, char *err, size_t n)
{
    (void)t; /* no capability decides here */
    return pass_rewrite(g, simplify, NULL, NULL, err, n);
}

IrNode *pass_simplify_node(PassRewriter *rw, const IrNode *old, IrNode *proto)
{
    return simplify(rw, old, proto);
}
