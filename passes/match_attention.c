/* match_attention.c: the recognizer of match.h for attention, the groundwork of the attention
 * fusion. It reads the graph only. */
#include "match.h"

#include <float.h>
#include <string.h>

#include "rewrite.h"

/* the -FLT_MAX fill of lower.c step 12 (not -inf: fully masked rows attend uniformly) */
static int is_fill(const IrNode *x)
{
    double v;
    return pass_const_value(x, &v) && v == -(double)FLT_MAX;
}

/* reshape(arange(start, len), shape) with the arange's start and length and the reshape's shape */
static int is_position(const IrNode *x, IrDim start, IrDim len, IrDim d0, IrDim d1)
{
    if (x->op != IR_RESHAPE || x->rank != 2 || x->in[0]->op != IR_ARANGE)
        return 0;
    const IrNode *a = x->in[0];
    return ir_dim_eq(a->d, start) && ir_dim_eq(a->shape[0], len) && ir_dim_eq(x->shape[0], d0) &&
           ir_dim_eq(x->shape[1], d1);
}

/* lt(arange(J - I, I)[I, 1], arange(0, J)[1, J]): key j is after query i + (J - I) */
static int is_causal_cond(const IrNode *c, IrDim I, IrDim J)
{
    if (c->op != IR_LT || c->dtype != IR_BOOL)
        return 0;
    return is_position(c->in[0], ir_dim_sub(J, I), I, I, ir_dim(1)) &&
           is_position(c->in[1], ir_dim(0), J, ir_dim(1), J);
}

int pass_match_window(const IrNode *c, IrDim I, IrDim J, int64_t *w)
{
    if (c->op != IR_LT || c->dtype != IR_BOOL || c->rank != 2 || !is_position(c->in[0], ir_dim_sub(J, I), I, I, ir_dim(1)))
        return 0;
    const IrNode *kw = c->in[1];
    if (kw->op != IR_RESHAPE || kw->in[0]->op != IR_ARANGE || !ir_dim_is_const(kw->in[0]->d) || kw->in[0]->d.c < 2)
        return 0;
    if (!is_position(kw, kw->in[0]->d, J, ir_dim(1), J))
        return 0;
    *w = kw->in[0]->d.c - 1;
    return 1;
}

/* matmul(q, k, transpose_b=1) * scale, the scale a scalar constant or a tensor */
static int match_scores(const IrNode *s, PassAttention *m)
{
    if (s->op != IR_MUL)
        return 0;
    for (int side = 0; side < 2; side++) {
        const IrNode *qk = s->in[side], *scale = s->in[1 - side];
        if (qk->op != IR_MATMUL || qk->ia[IR_IA_TRANSPOSE_B] != 1 || !pass_same_shape(qk, s))
            continue;
        m->qk = qk;
        m->q = qk->in[0];
        m->k = qk->in[1];
        m->scores = s;
        m->scale = scale;
        m->scale_is_const = scale->rank == 0 && pass_const_value(scale, &m->scale_value);
        return 1;
    }
    return 0;
}

int pass_match_attention(const IrNode *out, PassAttention *m)
{
    memset(m, 0, sizeof *m);
    if (out->op != IR_MATMUL || out->ia[IR_IA_TRANSPOSE_B] != 0 || out->in[0]->op != IR_SOFTMAX)
        return 0;
    m->out = out;
    m->softmax = out->in[0];
    m->v = out->in[1];
    const IrNode *x = m->softmax->in[0];
    if (x->rank < 2)
        return 0;
    IrDim I = x->shape[x->rank - 2], J = x->shape[x->rank - 1];
    if (x->op == IR_WHERE && is_fill(x->in[1]) && is_causal_cond(x->in[0], I, J)) {
        m->causal = x;
        x = x->in[2];
    }
    if (x->op == IR_WHERE && is_fill(x->in[2]) && x->in[0]->dtype == IR_BOOL) {
        m->masked = x;
        m->mask = x->in[0];
        x = x->in[1];
    }
    if (!match_scores(x, m)) {
        if (x->op != IR_ADD)
            return 0;
        /* scores + bias, in either order; under residual attention both terms can be scores
         * (this layer's and the previous layer's): this layer's were built last */
        PassAttention a = *m, b = *m;
        int ok0 = match_scores(x->in[0], &a), ok1 = match_scores(x->in[1], &b);
        if (!ok0 && !ok1)
            return 0;
        int take1 = ok1 && (!ok0 || b.scores->id > a.scores->id);
        *m = take1 ? b : a;
        m->add = x;
        m->bias = x->in[take1 ? 0 : 1];
    }
    /* q[.., I, D] k[.., J, D] v[.., J, E] */
    const IrNode *q = m->q, *k = m->k, *v = m->v;
    if (v->rank < 2 || !ir_dim_eq(q->shape[q->rank - 2], I) ||
        !ir_dim_eq(k->shape[k->rank - 2], J) || !ir_dim_eq(v->shape[v->rank - 2], J))
        return 0;
    return 1;
}

int pass_attention_private(const PassAttention *m, const int *uses)
{
    const IrNode *inner[] = {m->qk, m->scores, m->add, m->masked, m->causal, m->softmax};
    for (size_t i = 0; i < sizeof inner / sizeof inner[0]; i++)
        if (inner[i] && uses[inner[i]->id] != 1)
            return 0;
    return 1;
}
