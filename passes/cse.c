/* cse.c: common-subexpression elimination.
 *
 * Requires: a graph that verifies.
 * Produces: the same graph with identical nodes merged and the operands of commutative ops
 * (add, mul, max, min, eq, and, or: IR_COMMUT in ops.def) in a canonical order, so that add(a, b)
 * and add(b, a) become one node. The order is LLVM's: computed values first, then inputs,
 * parameters and buffers, constants last (x * 0.125, y + bias, as the lowering writes them);
 * within a class, the operand built first (lower id) first.
 * Exact: these ops are commutative bit for bit in IEEE arithmetic (max and min propagate NaN from
 * either side, see ir/interp.c), and their shape rule (broadcasting) is symmetric.
 *
 * Merging identical nodes needs no code: every node is rebuilt through ir_node(), which
 * hash-conses. Any pass does that much; this one adds the canonical order. */
#include "passes.h"

#include "rewrite.h"

/* 0: computed, 1: named leaf, 2: constant (const, arange, relpos_bucket) */
static int rank_class(const IrNode *x)
{
    if (!(ir_ops[x->op].flags & IR_LEAF))
        return 0;
    return x->op == IR_INPUT || x->op == IR_PARAM || x->op == IR_BUFFER ? 1 : 2;
}

static int goes_after(const IrNode *a, const IrNode *b)
{
    int ca = rank_class(a), cb = rank_class(b);
    return ca != cb ? ca > cb : a->id > b->id;
}

static IrNode *canonical(PassRewriter *rw, const IrNode *old, IrNode *p)
{
    (void)old;
    if ((ir_ops[p->op].flags & IR_COMMUT) && p->nin == 2 && goes_after(p->in[0], p->in[1])) {
        IrNode *t = p->in[0];
        p->in[0] = p->in[1];
        p->in[1] = t;
    }
    return pass_build(rw, p);
}

IrGraph *pass_cse(IrGraph *g, const PassTarget *t, char *err, size_t n)
{
    (void)t; /* no capability decides here */
    return pass_rewrite(g, canonical, NULL, NULL, err, n);
}
