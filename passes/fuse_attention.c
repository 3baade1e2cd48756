/* fuse_attention.c: the attention fusion (STYLE.md, practice 4).
 *
 * Requires: a graph that verifies, after cse (the recognizer of match.h matches the lowering's
 * subgraphs in cse's operand order); for the backward half, a graph differentiated by
 * ir_autodiff before the pipeline.
 * Produces:
 *  - every attention subgraph (scaled QK^T, an additive bias, a padding mask, the causal mask,
 *    softmax, times V) whose interior nothing else reads, replaced by one `attention` node;
 *  - in a differentiated graph, where the softmax's other readers are exactly its gradient
 *    (dP = dO V^T, dV = P^T dO, the softmax rule, the masks' wheres, the scale, dQ = dS K,
 *    dK = dS^T Q, and nothing else reading any of them), the forward replaced by `attention`
 *    with its row statistics (stats=1; the output is the slice of its first E columns) and dQ,
 *    dK, dV by slices of one `attention_grad` node that recomputes the scores tile by tile:
 *    neither direction stores the n x n matrix any more.
 * Not fused (left as they are): talking heads (the recognizer does not match a mix of heads
 * around the softmax), a bias or scale that takes a gradient (T5 relative position bias and the
 * learned cosine-similarity temperature in training, residual attention's previous scores), a
 * scale tensor that is not per batch and head, head sizes that are not constants within the
 * target's bounds (PassTarget: the backend's fused attention kernel, and in training its gradient
 * kernel too), and in training q, k, v of different head sizes.
 * Exact: the fused ops compute the replaced subgraph (ir/interp_fused.c), in the interpreter bit
 * for bit; compiled kernels round differently (online softmax, tiled sums). */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

#include "match.h"
#include "rewrite.h"

enum { ROLE_NONE, ROLE_OUT, ROLE_DQ, ROLE_DK, ROLE_DV };

typedef struct {
    PassAttention m;
    const IrNode *bias, *mask;  /* the operands as the fused op reads them (expands stripped) */
    int64_t window;             /* max_attend_past's window taken out of the mask, 0 = none */
    int train;                  /* the backward is fused too */
    const IrNode *gout;         /* dO */
    IrNode *fwd, *bwd;          /* images, built when first needed */
} Fusion;

typedef struct {
    Fusion *fus;
    int nfus;
    int *role;   /* per old node */
    int *which;  /* per old node: the fusion */
    int max_head, max_grad_head; /* the target's bounds on head sizes; 0: none */
} Ctx;

/* ---- consumers of live nodes (CSR) ---- */

typedef struct {
    int *start, *list;
} Users;

static int users_build(const IrGraph *g, const char *live, Users *u)
{
    size_t nn = (size_t)g->nnodes + 1;
    u->start = calloc(nn + 1, sizeof *u->start);
    int total = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (live[i])
            total += g->nodes[i]->nin;
    u->list = malloc(((size_t)total + 1) * sizeof *u->list);
    if (!u->start || !u->list)
        return -1;
    for (int i = 0; i < g->nnodes; i++)
        if (live[i])
            for (int k = 0; k < g->nodes[i]->nin; k++)
                u->start[g->nodes[i]->in[k]->id + 1]++;
    for (int i = 0; i < g->nnodes; i++)
        u->start[i + 1] += u->start[i];
    int *fillp = calloc(nn, sizeof *fillp);
    if (!fillp)
        return -1;
    for (int i = 0; i < g->nnodes; i++)
        if (live[i])
            for (int k = 0; k < g->nodes[i]->nin; k++) {
                int x = g->nodes[i]->in[k]->id;
                u->list[u->start[x] + fillp[x]++] = i;
            }
    free(fillp);
    return 0;
}

static void users_free(Users *u)
{
    free(u->start);
    free(u->list);
}

/* the only consumer of x, if it has exactly one use (operand slot or output) */
static const IrNode *sole_user(const IrGraph *g, const Users *u, const int *uses, const IrNode *x)
{
    if (uses[x->id] != 1 || u->start[x->id + 1] - u->start[x->id] != 1)
        return NULL;
    return g->nodes[u->list[u->start[x->id]]];
}

/* ---- shapes ---- */

static int is_transpose_last2(const IrNode *t, const IrNode *x)
{
    if (t->op != IR_PERMUTE || t->in[0] != x || x->rank < 2)
        return 0;
    for (int i = 0; i < x->rank - 2; i++)
        if (t->perm[i] != i)
            return 0;
    return t->perm[x->rank - 2] == x->rank - 1 && t->perm[x->rank - 1] == x->rank - 2;
}

/* a constant head size within max (0: any) */
static int head_ok(IrDim d, int max) { return ir_dim_is_const(d) && d.c >= 1 && (max <= 0 || d.c <= max); }

/* x broadcasts to the scores [batch of q, I, J] */
static int scores_operand_ok(const IrNode *x, const IrNode *q, IrDim J)
{
    int r = q->rank;
    if (x->rank > r)
        return 0;
    for (int d = 0; d < x->rank; d++) {
        int t = d + r - x->rank;
        IrDim want = t == r - 1 ? J : q->shape[t];
        if (!ir_dim_is_one(x->shape[d]) && !ir_dim_eq(x->shape[d], want))
            return 0;
    }
    return 1;
}

/* the operand an expand broadcasts (the fused op broadcasts by itself) */
static const IrNode *strip_expand(const IrNode *x)
{
    while (x->op == IR_EXPAND)
        x = x->in[0];
    return x;
}

/* The forward parts the fused op needs: operand shapes, scale, bias and mask. */
static int forward_ok(Fusion *fu, int max_head)
{
    const PassAttention *m = &fu->m;
    const IrNode *q = m->q, *k = m->k, *v = m->v;
    int r = q->rank;
    if (r < 2 || k->rank != r || v->rank != r)
        return 0;
    for (int d = 0; d < r - 2; d++)
        if (!ir_dim_eq(k->shape[d], q->shape[d]) || !ir_dim_eq(v->shape[d], q->shape[d]))
            return 0;
    if (!head_ok(q->shape[r - 1], max_head) || !head_ok(v->shape[r - 1], max_head))
        return 0;
    IrDim J = k->shape[r - 2];
    /* a scalar, or a tensor [.., 1, 1]: one value per batch and head */
    const IrNode *s = m->scale;
    if (s->dtype != IR_F32 || !scores_operand_ok(s, q, J))
        return 0;
    for (int d = s->rank - 2; d < s->rank; d++)
        if (d >= 0 && !ir_dim_is_one(s->shape[d]))
            return 0;
    fu->bias = m->bias ? strip_expand(m->bias) : NULL;
    fu->mask = m->mask ? strip_expand(m->mask) : NULL;
    /* a sliding window in the mask (alone, or and-ed with the padding) becomes the op's window,
     * which the kernels use to skip the keys outside it */
    IrDim I = q->shape[r - 2];
    fu->window = 0;
    if (fu->mask && pass_match_window(fu->mask, I, J, &fu->window))
        fu->mask = NULL;
    else if (fu->mask && fu->mask->op == IR_AND)
        for (int side = 0; side < 2; side++)
            if (pass_match_window(strip_expand(fu->mask->in[side]), I, J, &fu->window)) {
                fu->mask = strip_expand(fu->mask->in[1 - side]);
                break;
            }
    if (fu->bias && (fu->bias->dtype != IR_F32 || !scores_operand_ok(fu->bias, q, J)))
        return 0;
    if (fu->mask && !scores_operand_ok(fu->mask, q, J))
        return 0;
    return 1;
}

/* ---- the backward pattern of ir/autodiff.c's rules ---- */

/* a * b with {a, b} = {x, y} */
static int is_mul_of(const IrNode *n, const IrNode *x, const IrNode *y)
{
    return n->op == IR_MUL && ((n->in[0] == x && n->in[1] == y) || (n->in[0] == y && n->in[1] == x));
}

static int is_const_zero(const IrNode *x)
{
    double v;
    return pass_const_value(x, &v) && v == 0;
}

/* Fills fu->gout and the roles of dQ, dK, dV when the softmax's readers besides the forward are
 * exactly the attention's gradient. */
static int match_backward(const IrGraph *g, const Users *u, const int *uses, Fusion *fu, const IrNode **dq,
                          const IrNode **dk, const IrNode **dv)
{
    const PassAttention *m = &fu->m;
    const IrNode *P = m->softmax;
    int r = P->rank;
    if (uses[P->id] != 4 || u->start[P->id + 1] - u->start[P->id] != 4)
        return 0;
    const IrNode *tP = NULL, *m1 = NULL, *m2 = NULL, *out = m->out;
    const IrNode *cons[4];
    for (int i = 0; i < 4; i++)
        cons[i] = g->nodes[u->list[u->start[P->id] + i]];
    int seen_out = 0;
    for (int i = 0; i < 4; i++) {
        const IrNode *c = cons[i];
        if (c == out)
            seen_out = 1;
        else if (is_transpose_last2(c, P))
            tP = c;
        else if (c->op == IR_MUL && !m1)
            m1 = c;
        else if (c->op == IR_MUL)
            m2 = c;
    }
    if (!seen_out || !tP || !m1 || !m2)
        return 0;
    /* dV = matmul(P^T, dO) */
    const IrNode *dvn = sole_user(g, u, uses, tP);
    if (!dvn || dvn->op != IR_MATMUL || dvn->ia[IR_IA_TRANSPOSE_B] != 0 || dvn->in[0] != tP)
        return 0;
    const IrNode *gout = dvn->in[1];
    /* m1 = P dP, summed over the last axis; m2 = P (dP - sum) */
    for (int swap = 0; swap < 2; swap++) {
        const IrNode *a = swap ? m2 : m1, *b = swap ? m1 : m2;
        const IrNode *dP = a->in[0] == P ? a->in[1] : a->in[0];
        if (!is_mul_of(a, P, dP) || dP->op != IR_MATMUL || dP->ia[IR_IA_TRANSPOSE_B] != 1 || dP->in[0] != gout || dP->in[1] != m->v)
            continue;
        const IrNode *dot = sole_user(g, u, uses, a);
        if (!dot || dot->op != IR_SUM || dot->ia[IR_IA_AXIS] != r - 1)
            continue;
        const IrNode *sb = sole_user(g, u, uses, dot);
        if (!sb || sb->op != IR_SUB || sb->in[0] != dP || sb->in[1] != dot || !is_mul_of(b, P, sb))
            continue;
        if (uses[dP->id] != 2 || uses[sb->id] != 1)
            continue;
        m1 = a;
        m2 = b;
        goto chain;
    }
    return 0;
chain:;
    /* the gradient of the scores, back through the wheres and the add */
    const IrNode *gs = m2;
    if (m->causal) {
        const IrNode *w = sole_user(g, u, uses, gs);
        if (!w || w->op != IR_WHERE || w->in[0] != m->causal->in[0] || !is_const_zero(w->in[1]) || w->in[2] != gs)
            return 0;
        gs = w;
    }
    if (m->masked) {
        const IrNode *w = sole_user(g, u, uses, gs);
        if (!w || w->op != IR_WHERE || w->in[0] != m->mask || w->in[1] != gs || !is_const_zero(w->in[2]))
            return 0;
        gs = w;
    }
    /* (the add passes gs on unchanged; a bias taking a gradient would be a second reader) */
    const IrNode *dqk = sole_user(g, u, uses, gs);
    if (!dqk || !is_mul_of(dqk, gs, m->scale))
        return 0;
    if (uses[dqk->id] != 2 || u->start[dqk->id + 1] - u->start[dqk->id] != 2)
        return 0;
    const IrNode *a = g->nodes[u->list[u->start[dqk->id]]], *b = g->nodes[u->list[u->start[dqk->id] + 1]];
    if (a->op == IR_PERMUTE) {
        const IrNode *t = a;
        a = b;
        b = t;
    }
    /* dQ = matmul(dS, k); dK = matmul(dS^T, q) */
    if (a->op != IR_MATMUL || a->ia[IR_IA_TRANSPOSE_B] != 0 || a->in[0] != dqk || a->in[1] != m->k || !is_transpose_last2(b, dqk))
        return 0;
    const IrNode *dkn = sole_user(g, u, uses, b);
    if (!dkn || dkn->op != IR_MATMUL || dkn->ia[IR_IA_TRANSPOSE_B] != 0 || dkn->in[0] != b || dkn->in[1] != m->q)
        return 0;
    /* the forward interior has no reader but the forward */
    const IrNode *inner[] = {m->qk, m->scores, m->add, m->masked, m->causal};
    for (size_t i = 0; i < sizeof inner / sizeof inner[0]; i++)
        if (inner[i] && uses[inner[i]->id] != 1)
            return 0;
    /* one attention_grad for all three: equal head sizes, and the same dO shape as the output */
    const IrNode *q = m->q, *v = m->v;
    if (!ir_dim_eq(q->shape[r - 1], v->shape[r - 1]) || !pass_same_shape(gout, out))
        return 0;
    fu->gout = gout;
    *dq = a;
    *dk = dkn;
    *dv = dvn;
    return 1;
}

/* ---- the rewrite ---- */

static IrNode *fused_forward(PassRewriter *rw, Fusion *fu)
{
    if (fu->fwd)
        return fu->fwd;
    IrGraph *g = rw->g;
    const PassAttention *m = &fu->m;
    IrNode *bias = fu->bias ? rw->map[fu->bias->id] : NULL;
    IrNode *mask = fu->mask ? rw->map[fu->mask->id] : NULL;
    fu->fwd = ir_attention_window(g, rw->map[m->q->id], rw->map[m->k->id], rw->map[m->v->id], bias, mask,
                                  rw->map[m->scale->id], m->causal != NULL, fu->train, fu->window);
    return fu->fwd;
}

static IrNode *fuse(PassRewriter *rw, const IrNode *old, IrNode *p)
{
    Ctx *c = rw->ctx;
    int role = c->role[old->id];
    if (role == ROLE_NONE)
        return pass_simplify_node(rw, old, p);
    Fusion *fu = &c->fus[c->which[old->id]];
    IrGraph *g = rw->g;
    IrNode *f = fused_forward(rw, fu);
    int r = old->rank;
    if (role == ROLE_OUT)
        return fu->train ? ir_slice(g, f, r - 1, ir_dim(0), old->shape[r - 1]) : f;
    if (!fu->bwd)
        fu->bwd = ir_attention_grad(g, f, rw->map[fu->gout->id]);
    IrDim I = fu->m.q->shape[r - 2], J = fu->m.k->shape[r - 2];
    if (role == ROLE_DQ)
        return ir_slice(g, fu->bwd, r - 2, ir_dim(0), I);
    if (role == ROLE_DK)
        return ir_slice(g, fu->bwd, r - 2, I, J);
    return ir_slice(g, fu->bwd, r - 2, ir_dim_add(I, J), J);
}

IrGraph *pass_fuse_attention(IrGraph *g, const PassTarget *t, char *err, size_t n)
{
    size_t nn = (size_t)g->nnodes + 1;
    int *uses = calloc(nn, sizeof *uses);
    char *live = uses ? pass_liveness(g, uses) : NULL;
    Ctx c = {0};
    c.fus = calloc(nn, sizeof *c.fus);
    c.role = calloc(nn, sizeof *c.role);
    c.which = calloc(nn, sizeof *c.which);
    c.max_head = t ? t->attention_max_head : 0;
    c.max_grad_head = t ? t->attention_grad_max_head : 0;
    Users u = {0};
    IrGraph *out = NULL;
    if (!live || !c.fus || !c.role || !c.which || users_build(g, live, &u) < 0) {
        snprintf(err, n, "out of memory");
        goto done;
    }
    for (int i = 0; i < g->nnodes; i++) {
        Fusion *fu = &c.fus[c.nfus];
        memset(fu, 0, sizeof *fu);
        if (!live[i] || !pass_match_attention(g->nodes[i], &fu->m) || !forward_ok(fu, c.max_head))
            continue;
        const IrNode *dq = NULL, *dk = NULL, *dv = NULL;
        if (!pass_attention_private(&fu->m, uses)) {
            /* trained: both kernels or neither (the forward keeps the statistics its gradient reads) */
            int r = fu->m.q->rank;
            if (!head_ok(fu->m.q->shape[r - 1], c.max_grad_head) || !head_ok(fu->m.v->shape[r - 1], c.max_grad_head) ||
                !match_backward(g, &u, uses, fu, &dq, &dk, &dv))
                continue;
            fu->train = 1;
            c.role[dq->id] = ROLE_DQ;
            c.role[dk->id] = ROLE_DK;
            c.role[dv->id] = ROLE_DV;
            c.which[dq->id] = c.which[dk->id] = c.which[dv->id] = c.nfus;
        }
        c.role[i] = ROLE_OUT;
        c.which[i] = c.nfus++;
    }
    out = pass_rewrite(g, fuse, &c, NULL, err, n);
done:
    users_free(&u);
    free(uses);
    free(live);
    free(c.fus);
    free(c.role);
    free(c.which);
    return out;
}
