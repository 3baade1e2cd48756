/* quantize.c: int8 weights for inference (xtc compile --weights-dtype int8).
 *
 * Requires: an inference graph that verifies (no backward part: the driver refuses --train).
 * Produces: every matmul weight -- a parameter [n, k] of constant shape whose every use is the
 * B operand of a matmul with transpose_b (x-transformers' Linear: attention's q, k, v and output
 * projections, the feed-forward's, the logits head) and that has no second name (a tied weight)
 * -- replaced by two buffers of the same name: "<name>" i8 [n, k] and "<name>.scale" f32
 * [n, ceil(k / group)], and each of its matmuls by matmul_q8 (ops.def). Embeddings (read by
 * gather, even when the logits head shares them), norms, biases and every other parameter stay
 * f32. The parameter's initialisation rule moves to the i8 buffer (the runtime quantizes the
 * values it draws).
 * Not exact: the weights the module reads are the int8 values times their scales
 * (runtime/rt_quant.c rounds them); the interpreter evaluates the same graph on the same int8
 * values exactly, which is the reference the tests hold compiled modules to.
 *
 * Not in the pipeline list: it changes the module's interface (the weights' types and names),
 * so the compile driver runs it on request, after lowering and before the passes. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

#include "rewrite.h"

typedef struct {
    int64_t group;       /* 0: one scale per output column (group = k) */
    const char *quant;   /* [old nnodes]: the parameter is quantized */
    IrNode **scale;      /* [old nnodes]: its scale buffer in the new graph */
} Quant;

static int is_matmul_weight_use(const IrNode *user, const IrNode *p)
{
    return user->op == IR_MATMUL && user->ia[IR_IA_TRANSPOSE_B] == 1 && user->in[1] == p && user->in[0] != p;
}

/* quant[i] = 1 for the parameters to quantize (see the header) */
static void choose(const IrGraph *g, char *quant)
{
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *p = g->nodes[i];
        quant[i] = p->op == IR_PARAM && p->rank == 2 && ir_dim_is_const(p->shape[0]) && ir_dim_is_const(p->shape[1]) &&
                   p->shape[1].c > 0;
    }
    for (int a = 0; a < g->naliases; a++)
        quant[g->aliases[a].target->id] = 0;
    for (int o = 0; o < g->noutputs; o++)
        quant[g->outputs[o].node->id] = 0;
    int *used = calloc((size_t)g->nnodes + 1, sizeof *used);
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *x = g->nodes[i];
        for (int k = 0; k < x->nin; k++) {
            const IrNode *p = x->in[k];
            if (!quant[p->id])
                continue;
            if (is_matmul_weight_use(x, p)) {
                if (used)
                    used[p->id] = 1;
            } else {
                quant[p->id] = 0;
            }
        }
    }
    for (int i = 0; i < g->nnodes; i++) /* an unused parameter stays as it is */
        if (quant[i] && used && !used[i])
            quant[i] = 0;
    if (!used)
        memset(quant, 0, (size_t)g->nnodes);
    free(used);
}

static IrNode *quantize_node(PassRewriter *rw, const IrNode *old, IrNode *proto)
{
    Quant *q = rw->ctx;
    if (q->quant[old->id]) { /* the weight: an i8 buffer of its name, and its scales */
        int64_t k = old->shape[1].c, group = q->group > 0 && q->group < k ? q->group : k;
        char name[512];
        snprintf(name, sizeof name, "%s.scale", old->s);
        if (ir_find_leaf(rw->old, IR_PARAM, name) || ir_find_leaf(rw->old, IR_BUFFER, name) ||
            ir_find_leaf(rw->old, IR_INPUT, name))
            return pass_fail(rw, "cannot quantize '%s': the model already has a tensor named '%s'", old->s, name);
        IrDim sshape[2] = {old->shape[0], ir_dim((k + group - 1) / group)};
        q->scale[old->id] = ir_buffer(rw->g, ir_strdup(rw->g, name), 2, sshape);
        return ir_buffer_i8(rw->g, old->s, 2, old->shape);
    }
    if (old->op == IR_MATMUL && q->quant[old->in[1]->id]) {
        int64_t k = old->in[1]->shape[1].c, group = q->group > 0 && q->group < k ? q->group : k;
        return ir_matmul_q8(rw->g, proto->in[0], proto->in[1], q->scale[old->in[1]->id], group);
    }
    return pass_build(rw, proto);
}

IrGraph *pass_quantize_weights(IrGraph *g, int64_t group, int *count, char *err, size_t n)
{
    char *quant = calloc((size_t)g->nnodes + 1, 1);
    IrNode **scale = calloc((size_t)g->nnodes + 1, sizeof *scale);
    if (!quant || !scale) {
        free(quant);
        free(scale);
        snprintf(err, n, "out of memory");
        return NULL;
    }
    choose(g, quant);
    int nq = 0;
    for (int i = 0; i < g->nnodes; i++)
        nq += quant[i];
    Quant q = {group, quant, scale};
    IrGraph *out = pass_rewrite_leaves(g, quantize_node, &q, NULL, 1, err, n);
    free(quant);
    free(scale);
    if (count)
        *count = nq;
    return out;
}
