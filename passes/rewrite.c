/* rewrite.c: the graph-rewriting helper of rewrite.h: old graph in, new graph out, with a
 * per-pass callback choosing each node's image. */
#include "rewrite.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *pass_liveness(const IrGraph *g, int *uses)
{
    char *live = calloc(g->nnodes > 0 ? (size_t)g->nnodes : 1, 1);
    if (!live)
        return NULL;
    if (uses)
        memset(uses, 0, sizeof *uses * (size_t)g->nnodes);
    for (int o = 0; o < g->noutputs; o++) {
        live[g->outputs[o].node->id] = 1;
        if (uses)
            uses[g->outputs[o].node->id]++;
    }
    for (int i = g->nnodes - 1; i >= 0; i--) {
        if (!live[i])
            continue;
        const IrNode *x = g->nodes[i];
        for (int k = 0; k < x->nin; k++) {
            live[x->in[k]->id] = 1;
            if (uses)
                uses[x->in[k]->id]++;
        }
    }
    return live;
}

IrNode *pass_build(PassRewriter *rw, const IrNode *proto) { return ir_node(rw->g, proto); }

IrNode *pass_fail(PassRewriter *rw, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ir_graph_set_error(rw->g, "%s", msg);
    return NULL;
}

static void node_name(const IrNode *x, char *buf, size_t n)
{
    if (x->label)
        snprintf(buf, n, "%%%s (%s)", x->label, ir_ops[x->op].name);
    else
        snprintf(buf, n, "%%%d (%s)", x->id, ir_ops[x->op].name);
}

IrGraph *pass_rewrite(const IrGraph *g, PassRewriteFn fn, void *ctx, const char *keep, char *err,
                      size_t n)
{
    return pass_rewrite_leaves(g, fn, ctx, keep, 0, err, n);
}

IrGraph *pass_rewrite_leaves(const IrGraph *g, PassRewriteFn fn, void *ctx, const char *keep, int retype_leaves,
                             char *err, size_t n)
{
    size_t nn = g->nnodes > 0 ? (size_t)g->nnodes : 1;
    IrGraph *ng = ir_graph_new(g->name);
    IrNode **map = calloc(nn, sizeof *map);
    int *uses = calloc(nn, sizeof *uses);
    char *live = pass_liveness(g, uses);
    if (!ng || !map || !uses || !live) {
        snprintf(err, n, "out of memory");
        goto fail;
    }
    ir_graph_copy_syms(ng, g); /* derived ones with their definitions */
    ng->label_seq = g->label_seq;

    PassRewriter rw = {g, ng, map, uses, live, ctx};
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *old = g->nodes[i];
        if (keep && !keep[i])
            continue;
        IrNode proto = *old;
        proto.label = NULL;
        for (int k = 0; k < old->nin; k++) {
            proto.in[k] = map[old->in[k]->id];
            if (!proto.in[k]) {
                char who[300];
                node_name(old, who, sizeof who);
                snprintf(err, n, "node %s: operand %d was dropped by the keep mask", who, k);
                goto fail;
            }
        }
        IrNode *img = fn ? fn(&rw, old, &proto) : ir_node(ng, &proto);
        if (!img) {
            char who[300];
            node_name(old, who, sizeof who);
            const char *e = ir_graph_error(ng);
            snprintf(err, n, "node %s: %s", who, e ? e : "the rewrite gave no node");
            goto fail;
        }
        /* an exact rewrite keeps every value's type: a pass that changes one is broken */
        int same = (img->dtype == old->dtype || (retype_leaves && old->op == IR_PARAM)) && img->rank == old->rank;
        for (int d = 0; same && d < old->rank; d++)
            same = ir_dim_eq(img->shape[d], old->shape[d]);
        if (!same) {
            char who[300];
            node_name(old, who, sizeof who);
            snprintf(err, n, "node %s: the rewrite changed its type (to %s rank %d)", who,
                     ir_dtype_name(img->dtype), img->rank);
            goto fail;
        }
        /* Old labels are unique and each is handed out at most once, so the new ones are too.
         * (Assigned directly: ir_label's uniqueness scan is quadratic in the graph size.) */
        if (!img->label && old->label)
            img->label = ir_strdup(ng, old->label);
        map[i] = img;
    }
    for (int o = 0; o < g->noutputs; o++) {
        IrNode *img = map[g->outputs[o].node->id];
        if (!img) {
            snprintf(err, n, "output '%s' was dropped by the keep mask", g->outputs[o].name);
            goto fail;
        }
        if (ir_output(ng, g->outputs[o].name, img) < 0) {
            snprintf(err, n, "output '%s': %s", g->outputs[o].name,
                     ir_graph_error(ng) ? ir_graph_error(ng) : "out of memory");
            goto fail;
        }
    }
    for (int k = 0; k < g->ninits; k++) { /* a leaf's initialisation rule, if it is still used */
        IrNode *img = map[g->inits[k].target->id];
        if (img && ir_init(ng, img, g->inits[k].kind, g->inits[k].value) < 0) {
            snprintf(err, n, "init of '%s': %s", g->inits[k].target->s,
                     ir_graph_error(ng) ? ir_graph_error(ng) : "out of memory");
            goto fail;
        }
    }
    for (int k = 0; k < g->nrownorms; k++) { /* an input's row norm claim, if it is still read */
        IrNode *img = map[g->rownorms[k].input->id];
        if (img && ir_row_norm(ng, img, g->rownorms[k].norm) < 0) {
            snprintf(err, n, "row norm of '%s': %s", g->rownorms[k].input->s,
                     ir_graph_error(ng) ? ir_graph_error(ng) : "out of memory");
            goto fail;
        }
    }
    for (int k = 0; k < g->naliases; k++) { /* tied parameters keep their second names */
        IrNode *img = map[g->aliases[k].target->id];
        if (!img || ir_alias(ng, g->aliases[k].name, img) < 0) {
            snprintf(err, n, "alias '%s' lost its parameter", g->aliases[k].name);
            goto fail;
        }
    }
    if (ir_graph_error(ng)) {
        snprintf(err, n, "%s", ir_graph_error(ng));
        goto fail;
    }
    free(map);
    free(uses);
    free(live);
    return ng;
fail:
    ir_graph_free(ng);
    free(map);
    free(uses);
    free(live);
    return NULL;
}

/* ---- small queries ---- */

static double as_dtype(IrDType t, double x)
{
    if (t == IR_BOOL)
        return x != 0;
    if (ir_dtype_is_int(t))
        return trunc(x);
    return x;
}

int pass_const_value(const IrNode *x, double *v)
{
    while (x->op == IR_EXPAND || x->op == IR_RESHAPE || x->op == IR_PERMUTE || x->op == IR_SLICE)
        x = x->in[0];
    if (x->op != IR_CONST)
        return 0;
    *v = as_dtype(x->dtype, x->f);
    return 1;
}

int pass_same_shape(const IrNode *a, const IrNode *b)
{
    if (a->rank != b->rank)
        return 0;
    for (int i = 0; i < a->rank; i++)
        if (!ir_dim_eq(a->shape[i], b->shape[i]))
            return 0;
    return 1;
}

IrNode *pass_broadcast_to(IrGraph *g, IrNode *x, const IrNode *like)
{
    if (!x || pass_same_shape(x, like))
        return x;
    return ir_expand(g, x, like->rank, like->shape);
}
