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
 * Requires: a graph after the attention fusion (fuse_attention.c makes the attention nodes).
 * Produces: every attention node whose k and v are both such repeats of the same G heads, with
 * the key/value heads themselves as its operands; dce then drops the repeats. Left as it is:
 * an attention whose gradient kernel reads it (attention_grad takes k and v with q's heads: in
 * training the repeat stays, and its gradient, the sum over each group), and every attention on
 * a target whose kernel does not read grouped key/values (PassTarget.attention_kv_groups; the
 * interpreter, a NULL target, reads them).
 * Exact: the attention reads the same values (ir/interp_fused.c maps query head i to key/value
 * head i mod G), in the interpreter bit for bit. */
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

static IrNode *group_node(PassRewriter *rw, const IrNode *old, IrNode *p)
{
    const char *graded = rw->ctx;
    if (old->op == IR_ATTENTION && !graded[old->id]) {
        const IrNode *k = repeated_heads(old->in[1]), *v = repeated_heads(old->in[2]);
        if (k && v && ir_dim_eq(k->shape[1], v->shape[1])) {
            p->in[1] = rw->map[k->id];
            p->in[2] = rw->map[v->id];
        }
    }
    return pass_build(rw, p);
}

IrGraph *pass_kv_groups(IrGraph *g, const PassTarget *t, char *err, size_t n)
{
    char *graded = calloc((size_t)g->nnodes + 1, 1); /* attention nodes an attention_grad reads */
    if (!graded) {
        snprintf(err, n, "out of memory");
        return NULL;
    }
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->op == IR_ATTENTION_GRAD)
            graded[g->nodes[i]->in[3]->id] = 1;
    if (t && !t->attention_kv_groups) /* the copy stays: no attention node qualifies */
        for (int i = 0; i < g->nnodes; i++)
            graded[i] = 1;
    IrGraph *out = pass_rewrite(g, group_node, graded, NULL, err, n);
    free(graded);
    return out;
}
