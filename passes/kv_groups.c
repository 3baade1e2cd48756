/* kv_groups.c: grouped key/values read in place by the fused attention (STYLE.md, practice 4).
 *
 * Grouped-query and multi-query attention (1.x/2.x `attn_kv_heads`, `attn_one_kv_head`) have G
 * key/value heads for H query heads; frontend/lower_blocks.c repeats k and v to the H heads
 * before the scores, query head i reading key/value head i mod G ('b kvh n d -> b (r kvh) n d'):
 *   reshape(expand(reshape(x [B, G, J, D] -> [B, 1, G, J, D]) -> [B, R, G, J, D]) -> [B, R G, J, D]
 * The attention op takes such k and v with their G heads as they are (ops.def: grouped
 * key/values, implied by the shapes), so the repeat, a copy of k and v per layer (at H 8, G 2,
 * D 64 and n 2048: 6 MiB a layer and sequence), need not exist.
 *
 * In training the attention's gradient, attention_grad, reads the same repeats, and autodiff
 * made the repeat's gradient: the sum over each group of the query heads' dk (and dv),
 *   sum(reshape(slice(attention_grad, dk rows) [B, H, J, D] -> [B, R, G, J, D]), axis 1) [B, 1, G, J, D]
 * attention_grad takes grouped key/values too and does that sum itself (its dk, dv rows of head
 * g hold key/value head g's: ops.def), so each such sum becomes the slice of those rows, heads
 * [0, G), and neither the repeat nor the [B, H, J, D] gradients exist.
 *
 * Requires: a graph after the attention fusion (fuse_attention.c makes the attention nodes).
 * Produces: every attention node whose k and v are both such repeats of the same G heads, with
 * the key/value heads themselves as its operands; the attention_grad nodes that read it likewise,
 * and the group sums of their dk, dv as slices of them; dce then drops the repeats and the sums.
 * Left as it is: an attention whose attention_grad is read otherwise than through its dq rows and
 * such group sums (its [B, H, J, D] dk or dv itself), or on a target whose gradient kernel does
 * not read grouped key/values (PassTarget.attention_grad_kv_groups); every attention on a target
 * whose forward kernel does not (PassTarget.attention_kv_groups). The interpreter, a NULL target,
 * reads them all.
 * Exact: the attention reads the same values (ir/interp_fused.c maps query head i to key/value
 * head i mod G), and attention_grad sums each group's dk, dv in the order of the sum it replaces
 * (heads ascending), in the interpreter bit for bit. */
#include "passes.h"

#include <stdlib.h>

#include "rewrite.h"

/* x when kv is the lowering's repeat of x's key/value heads, else NULL */
static const IrNode *repeated_heads(const IrNode *kv)
{
    if (kv->op != IR_RESHAPE || kv->rank != 4 || kv->in[0]->op != IR_EXPAND || kv->in[0]->rank != 5)
        return NULL;
    const IrNode *e = kv->in[0], *s = e->in[0];
    if (s->op != IR_RESHAPE || s->rank != 5 || s->in[0]->rank != 4 || !ir_dim_is_one(s->shape[1]))
        return NULL;
    const IrNode *x = s->in[0];
    IrDim R = e->shape[1], G = x->shape[1];
    if (!ir_dim_is_const(R) || !ir_dim_is_const(G) || !ir_dim_is_const(kv->shape[1]) || kv->shape[1].c != R.c * G.c)
        return NULL;
    for (int d = 0; d < 5; d++) /* [B, 1, G, J, D] -> [B, R, G, J, D] of x [B, G, J, D] */
        if (d != 1 && (!ir_dim_eq(s->shape[d], e->shape[d]) || !ir_dim_eq(s->shape[d], x->shape[d ? d - 1 : 0])))
            return NULL;
    for (int d = 0; d < 4; d++) /* -> [B, R G, J, D] */
        if (d != 1 && !ir_dim_eq(kv->shape[d], x->shape[d]))
            return NULL;
    return x;
}

/* The pass's state: the attention nodes that keep their repeats, and each group sum to replace. */
typedef struct {
    char *kept;              /* [nnodes]: attention nodes left as they are */
    const IrNode **sum_grad; /* [nnodes]: for a group sum replaced, the attention_grad it sums */
    IrDim *sum_row;          /* [nnodes]: ... and the first of its rows (I: dk, I + J: dv) */
} Groups;

/* The attention_grad a reads k and v through the repeats of G heads: *kx, *vx (NULL: not). */
static void grouped_operands(const IrNode *a, const IrNode **kx, const IrNode **vx)
{
    *kx = repeated_heads(a->in[1]), *vx = repeated_heads(a->in[2]);
    if (!*kx || !*vx || !ir_dim_eq((*kx)->shape[1], (*vx)->shape[1]))
        *kx = *vx = NULL;
}

/* the only user of node x in g (NULL: none, or more than its live uses allow) */
static const IrNode *only_user(const IrGraph *g, const int *uses, const IrNode *x)
{
    if (uses[x->id] != 1)
        return NULL;
    for (int i = x->id + 1; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i]->nin; k++)
            if (g->nodes[i]->in[k] == x)
                return g->nodes[i];
    return NULL; /* an output */
}

/* Whether every live use of attention_grad a (rank 4: [B, H, I + 2J, D]) is its dq rows or the
 * group sum of its dk or dv rows (the repeat's gradient); the sums go into s when record. */
static int grads_fold(const IrGraph *g, const int *uses, const char *live, const IrNode *a, Groups *s, int record)
{
    const IrNode *q = a->in[0], *kr = a->in[1], *kx, *vx;
    grouped_operands(a, &kx, &vx);
    IrDim I = q->shape[2], J = kr->shape[2], G = kx->shape[1], R = ir_dim(q->shape[1].c / G.c);
    int seen = 0;
    for (int i = a->id + 1; i < g->nnodes; i++) {
        const IrNode *x = g->nodes[i];
        if (!live[i])
            continue;
        for (int k = 0; k < x->nin; k++) {
            if (x->in[k] != a)
                continue;
            seen++;
            if (x->op != IR_SLICE || x->ia[IR_IA_AXIS] != 2)
                return 0;
            if (ir_dim_eq(x->d, ir_dim(0)) && ir_dim_eq(x->shape[2], I))
                continue; /* dq: the query heads' own */
            if (!ir_dim_eq(x->shape[2], J) || !(ir_dim_eq(x->d, I) || ir_dim_eq(x->d, ir_dim_add(I, J))))
                return 0;
            const IrNode *rs = only_user(g, uses, x), *sum = rs ? only_user(g, uses, rs) : NULL;
            IrDim want[5] = {q->shape[0], R, G, J, q->shape[3]};
            if (!sum || rs->op != IR_RESHAPE || rs->rank != 5 || sum->op != IR_SUM || sum->ia[IR_IA_AXIS] != 1)
                return 0;
            for (int d = 0; d < 5; d++)
                if (!ir_dim_eq(rs->shape[d], want[d]))
                    return 0;
            if (record) {
                s->sum_grad[sum->id] = a;
                s->sum_row[sum->id] = x->d;
            }
        }
    }
    return seen == uses[a->id]; /* none an output */
}

static IrNode *group_node(PassRewriter *rw, const IrNode *old, IrNode *p)
{
    Groups *s = rw->ctx;
    const IrNode *kx, *vx;
    if (s->sum_grad[old->id]) { /* the group sum: the rows attention_grad summed, heads [0, G) */
        const IrNode *a = s->sum_grad[old->id];
        IrNode *x = ir_slice(rw->g, rw->map[a->id], 2, s->sum_row[old->id], a->in[1]->shape[2]);
        x = ir_slice(rw->g, x, 1, ir_dim(0), old->shape[2]);
        return ir_reshape(rw->g, x, old->rank, old->shape);
    }
    const IrNode *att = old->op == IR_ATTENTION ? old : old->op == IR_ATTENTION_GRAD ? old->in[3] : NULL;
    if (att && !s->kept[att->id]) {
        grouped_operands(att, &kx, &vx);
        if (kx) {
            p->in[1] = rw->map[kx->id];
            p->in[2] = rw->map[vx->id];
        }
    }
    return pass_simplify_node(rw, old, p); /* the reshapes after a group sum's slices merge */
}

IrGraph *pass_kv_groups(IrGraph *g, const PassTarget *t, char *err, size_t n)
{
    size_t nn = (size_t)g->nnodes + 1;
    Groups s = {calloc(nn, 1), calloc(nn, sizeof *s.sum_grad), calloc(nn, sizeof *s.sum_row)};
    int *uses = malloc(nn * sizeof *uses);
    char *live = uses ? pass_liveness(g, uses) : NULL;
    IrGraph *out = NULL;
    if (!s.kept || !s.sum_grad || !s.sum_row || !live) {
        snprintf(err, n, "out of memory");
        goto done;
    }
    int grads = !t || t->attention_grad_kv_groups;
    const IrNode *kx, *vx;
    for (int i = 0; i < g->nnodes; i++) { /* an attention keeps its repeats if a gradient cannot fold */
        const IrNode *a = g->nodes[i];
        if (a->op != IR_ATTENTION_GRAD || !live[i])
            continue;
        grouped_operands(a, &kx, &vx);
        if (kx && !(grads && a->rank == 4 && grads_fold(g, uses, live, a, &s, 0)))
            s.kept[a->in[3]->id] = 1;
    }
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *a = g->nodes[i];
        if (t && !t->attention_kv_groups) /* the copy stays: no attention node qualifies */
            s.kept[i] = 1;
        else if (a->op == IR_ATTENTION_GRAD && live[i] && !s.kept[a->in[3]->id]) {
            grouped_operands(a, &kx, &vx);
            if (kx)
                grads_fold(g, uses, live, a, &s, 1);
        }
    }
    out = pass_rewrite(g, group_node, &s, NULL, err, n);
done:
    free(s.kept), free(s.sum_grad), free(s.sum_row), free(uses), free(live);
    return out;
}
