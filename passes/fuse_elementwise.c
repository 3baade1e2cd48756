/* fuse_elementwise.c: elementwise and row fusion (chains of elementwise ops
 * generally, bias + activation, residual norms, softmax + cross-entropy, GLU).
 *
 * Requires: a graph that verifies; after the attention fusion, so that attention is taken whole
 * before its pieces could be taken here.
 * Produces: groups of nodes replaced by one `fused` node each, whose program (ir/fused_expr.h)
 * computes the group's value from the values flowing into it. A group grows from a root (the
 * last node, by id, that can be fused and is not yet in a group) through its operands: an
 * operand joins when every live reader of it is already in the group, so nothing is computed
 * twice and no intermediate of the group is read from outside. What can join:
 *   - elementwise ops of any dtype (ops.def IR_ELEM), constants inline;
 *   - sum and reduce_max over the last axis, and softmax: they make the group a row program
 *     (LayerNorm, RMSNorm, l2norm, softmax with what follows it, cross-entropy's gradient,
 *     with rotary: l2norm(rotary(q)) is one pass);
 *   - expand to the root's own shape (broadcasting is what the program does anyway);
 *   - slices and concats of the last axis by constants (GLU's halves of one projection,
 *     rotary's rotation): the program reads values at other columns;
 *   - a permute that keeps the last axis, of a value from outside (the heads split off a
 *     projection): the program reads it with the permuted strides;
 *   - one matmul of the root's shape, into a group with no reduction: the group becomes its
 *     epilogue (bias and activation, a residual add, a gradient's elementwise tail), applied
 *     by the matmul kernel to each block of the product while it is in cache; or one matmul
 *     twice the root's width, read only through slices of its two halves (GLU: value times
 *     gelu(gate), bias added first): the kernel computes the two halves' blocks side by side
 *     and the product never leaves the cache (ir_epilogue_parts says which reads qualify).
 * A group holds at most IR_MAXIN values from outside and IR_FUSED_MAXSTEPS steps; a group of one
 * node is left alone. Exact: the program is the group's subgraph, op for op (the interpreter
 * runs it as such, bit for bit). */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

#include "fused_expr.h"
#include "rewrite.h"

#define PROGRAM_MAX 1000 /* program text: the IR text form reads strings up to 1023 bytes */

typedef struct {
    const IrGraph *g;
    const char *live;
    const int *uses;
    int *start, *list;   /* live readers of each node (CSR) */
    int *group;          /* per node: its group + 1, 0 = none */
    int *is_root;        /* per node: 1 if it is a group's root */
    char **program;      /* per root: the program */
    int **ext;           /* per root: the old ids of its operands */
    int *next;           /* per root: number of operands */
} Ctx;

static int readers_build(Ctx *c)
{
    const IrGraph *g = c->g;
    size_t nn = (size_t)g->nnodes + 1;
    c->start = calloc(nn + 1, sizeof *c->start);
    int total = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (c->live[i])
            total += g->nodes[i]->nin;
    c->list = malloc(((size_t)total + 1) * sizeof *c->list);
    int *fillp = calloc(nn, sizeof *fillp);
    if (!c->start || !c->list || !fillp) {
        free(fillp);
        return -1;
    }
    for (int i = 0; i < g->nnodes; i++)
        if (c->live[i])
            for (int k = 0; k < g->nodes[i]->nin; k++)
                c->start[g->nodes[i]->in[k]->id + 1]++;
    for (int i = 0; i < g->nnodes; i++)
        c->start[i + 1] += c->start[i];
    for (int i = 0; i < g->nnodes; i++)
        if (c->live[i])
            for (int k = 0; k < g->nodes[i]->nin; k++) {
                int x = g->nodes[i]->in[k]->id;
                c->list[c->start[x] + fillp[x]++] = i;
            }
    free(fillp);
    return 0;
}

static int is_const_like(const IrNode *x)
{
    double v;
    return pass_const_value(x, &v);
}

static int is_row_op(const IrNode *x)
{
    return ((x->op == IR_SUM || x->op == IR_RMAX) && x->in[0]->rank >= 1 && x->ia[IR_IA_AXIS] == x->in[0]->rank - 1) ||
           x->op == IR_SOFTMAX;
}

static int is_last_slice(const IrNode *x)
{
    return x->op == IR_SLICE && x->ia[IR_IA_AXIS] == x->rank - 1 && ir_dim_is_const(x->d) && ir_dim_is_const(x->shape[x->rank - 1]);
}

static int is_const_like(const IrNode *x);

/* a concat of the last axis, of two computed parts of constant, non-zero length (rotary's
 * halves; not a slice's gradient, which pads with a constant: constants inline as scalars) */
static int is_last_concat(const IrNode *x)
{
    if (x->op != IR_CONCAT || x->ia[IR_IA_AXIS] != x->rank - 1 || is_const_like(x->in[0]) || is_const_like(x->in[1]))
        return 0;
    IrDim a = x->in[0]->shape[x->rank - 1], b = x->in[1]->shape[x->rank - 1];
    return ir_dim_is_const(a) && ir_dim_is_const(b) && a.c > 0 && b.c > 0;
}

/* a permute that keeps the last axis, of a value from outside: the program reads it strided */
static int is_row_permute(const IrNode *x)
{
    return x->op == IR_PERMUTE && x->rank >= 1 && x->perm[x->rank - 1] == x->rank - 1 && !is_const_like(x->in[0]);
}

/* Whether x may be a step of a program at all (expand and matmul are checked against the group). */
static int fusible(const IrNode *x)
{
    if (ir_ops[x->op].flags & IR_ELEM)
        return 1;
    return is_row_op(x) || x->op == IR_EXPAND || is_last_slice(x) || is_last_concat(x) || x->op == IR_MATMUL ||
           is_row_permute(x);
}

/* The group being grown. Shapes need no checks of their own: every member is read by members,
 * so numpy broadcasting already makes its leading dims fit the root's, and its last axis is
 * mapped by the program (broadcast, slice, concat, reduction). */
typedef struct {
    const IrNode *root;
    int *in;       /* per node: 1 member */
    int *pinned;   /* per node: read by the matmul or through a permute, so it stays outside */
    int *mem;      /* member ids */
    int nmem;
    int has_mm;    /* a matmul joined: the group is its epilogue */
    int has_row;   /* a reduction or softmax joined */
    int has_remap; /* a slice or concat joined: values are read at other columns */
} Grow;

static int cmp_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

/* Whether matmul x can join as the product the group's slices take two halves of (GLU):
 * ir_epilogue_parts over the members and x, every reader before what it reads. */
static int split_product(const Grow *gr, const IrGraph *g, const IrNode *x)
{
    if (gr->nmem + 1 > IR_FUSED_MAXSTEPS)
        return 0;
    int ids[IR_FUSED_MAXSTEPS + 1];
    const IrNode *nodes[IR_FUSED_MAXSTEPS + 1];
    memcpy(ids, gr->mem, sizeof *ids * (size_t)gr->nmem);
    ids[gr->nmem] = x->id;
    qsort(ids, (size_t)gr->nmem + 1, sizeof *ids, cmp_desc);
    for (int i = 0; i <= gr->nmem; i++)
        nodes[i] = g->nodes[ids[i]];
    return ir_epilogue_parts(nodes, gr->nmem + 1, x) == 2;
}

/* What the group allows next: a matmul epilogue reads the product at the root's own columns
 * only, within each block of it, so it takes no reduction, slice or concat; or, through slices
 * of its two halves, the product at the root's column and that plus the root's width, which the
 * kernel computes side by side (split_product). */
static int allowed(const Grow *gr, const IrGraph *g, const IrNode *x)
{
    if (x->op == IR_MATMUL && (gr->has_mm || gr->has_row))
        return 0;
    if (x->op == IR_MATMUL && gr->has_remap)
        return split_product(gr, g, x);
    if (x->op == IR_MATMUL)
        return pass_same_shape(x, gr->root);
    if (is_row_op(x))
        return !gr->has_mm;
    if (x->op == IR_SLICE || x->op == IR_CONCAT)
        return !gr->has_mm;
    if (x->op == IR_EXPAND)
        return pass_same_shape(x, gr->root);
    return 1;
}

static int count_externals(const Ctx *c, const Grow *gr, int extra, int *ext, int max)
{
    int n = 0;
    for (int i = 0; i <= gr->nmem; i++) {
        int id = i < gr->nmem ? gr->mem[i] : extra;
        if (id < 0)
            continue;
        const IrNode *m = c->g->nodes[id];
        for (int k = 0; k < m->nin; k++) {
            const IrNode *x = m->in[k];
            if (gr->in[x->id] || x->id == extra || is_const_like(x))
                continue;
            int seen = 0;
            for (int e = 0; e < n && !seen; e++)
                seen = ext[e] == x->id;
            if (!seen) {
                if (n == max)
                    return max + 1;
                ext[n++] = x->id;
            }
        }
    }
    return n;
}

/* ---- writing the program ---- */

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static int write_program(const Ctx *c, Grow *gr, const int *ext, int next, char *buf, size_t n)
{
    IrFusedProgram *p = calloc(1, sizeof *p);
    if (!p || gr->nmem > IR_FUSED_MAXSTEPS) {
        free(p);
        return -1;
    }
    qsort(gr->mem, (size_t)gr->nmem, sizeof *gr->mem, cmp_int);
    int *step_of = calloc((size_t)c->g->nnodes + 1, sizeof *step_of);
    if (!step_of) {
        free(p);
        return -1;
    }
    for (int i = 0; i < gr->nmem; i++)
        step_of[gr->mem[i]] = i;
    for (int i = 0; i < gr->nmem; i++) {
        const IrNode *m = c->g->nodes[gr->mem[i]];
        IrFusedStep *st = &p->step[i];
        st->op = m->op;
        st->nargs = m->op == IR_EXPAND || m->op == IR_SLICE || m->op == IR_SUM || m->op == IR_RMAX ? 1 : m->nin;
        if (m->op == IR_CONCAT)
            st->nargs = 2;
        if (m->op == IR_CAST)
            st->cast_to = m->dtype;
        if (m->op == IR_MATMUL)
            st->start = m->ia[IR_IA_TRANSPOSE_B];
        if (m->op == IR_PERMUTE) {
            st->nperm = m->rank;
            memcpy(st->perm, m->perm, sizeof st->perm);
        }
        if (m->op == IR_SLICE) {
            st->start = m->d.c;
            st->len = m->shape[m->rank - 1].c;
        }
        for (int k = 0; k < st->nargs; k++) {
            const IrNode *x = m->in[k];
            IrFusedRef *a = &st->arg[k];
            double v;
            if (gr->in[x->id]) {
                a->kind = '%';
                a->idx = step_of[x->id];
            } else if (pass_const_value(x, &v)) {
                a->kind = 'c';
                a->value = v;
                a->dtype = x->dtype;
            } else {
                a->kind = '$';
                for (int e = 0; e < next; e++)
                    if (ext[e] == x->id)
                        a->idx = e;
            }
        }
    }
    p->nsteps = gr->nmem;
    int rc = ir_fused_write(p, buf, n);
    free(step_of);
    free(p);
    return rc;
}

/* ---- growing groups ---- */

static void grow_group(Ctx *c, Grow *gr, int root_id)
{
    const IrGraph *g = c->g;
    const IrNode *root = g->nodes[root_id];
    gr->root = root;
    gr->nmem = 0;
    gr->has_mm = 0;
    gr->has_row = is_row_op(root);
    gr->has_remap = root->op == IR_CONCAT || root->op == IR_SLICE;
    gr->mem[gr->nmem++] = root_id;
    gr->in[root_id] = 1;
    /* candidates: operands of members, taken from the highest id down, so that a node is only
     * considered once all of its readers that could join have had their chance */
    for (int cand = root_id - 1; cand >= 0; cand--) {
        const IrNode *x = g->nodes[cand];
        if (!c->live[cand] || c->group[cand] || gr->in[cand] || gr->pinned[cand] || !fusible(x) ||
            is_const_like(x))
            continue;
        int readers = c->start[cand + 1] - c->start[cand], all_in = readers > 0 && c->uses[cand] == readers;
        for (int r = 0; all_in && r < readers; r++)
            all_in = gr->in[c->list[c->start[cand] + r]];
        if (!all_in || !allowed(gr, g, x))
            continue;
        int ext[IR_MAXIN + 1];
        if (gr->nmem + 1 > IR_FUSED_MAXSTEPS || count_externals(c, gr, cand, ext, IR_MAXIN) > IR_MAXIN)
            continue;
        gr->in[cand] = 1;
        gr->mem[gr->nmem++] = cand;
        gr->has_row |= is_row_op(x);
        gr->has_remap |= x->op == IR_SLICE || x->op == IR_CONCAT;
        if (x->op == IR_MATMUL) {
            gr->pinned[x->in[0]->id] = gr->pinned[x->in[1]->id] = 1;
            gr->has_mm = 1;
        }
        if (x->op == IR_PERMUTE)
            gr->pinned[x->in[0]->id] = 1;
    }
}

static IrNode *fuse(PassRewriter *rw, const IrNode *old, IrNode *p)
{
    Ctx *c = rw->ctx;
    if (!c->is_root[old->id])
        return pass_simplify_node(rw, old, p);
    IrNode proto;
    memset(&proto, 0, sizeof proto);
    proto.op = IR_FUSED;
    proto.nin = c->next[old->id];
    for (int k = 0; k < proto.nin; k++)
        proto.in[k] = rw->map[c->ext[old->id][k]];
    proto.s = c->program[old->id];
    proto.dtype = old->dtype;
    proto.rank = old->rank;
    memcpy(proto.shape, old->shape, sizeof proto.shape);
    return pass_build(rw, &proto);
}

IrGraph *pass_fuse_elementwise(IrGraph *g, const PassTarget *t, char *err, size_t n)
{
    (void)t; /* no capability decides here */
    size_t nn = (size_t)g->nnodes + 1;
    Ctx c;
    memset(&c, 0, sizeof c);
    c.g = g;
    int *uses = calloc(nn, sizeof *uses);
    c.uses = uses;
    char *live = uses ? pass_liveness(g, uses) : NULL;
    c.live = live;
    c.group = calloc(nn, sizeof *c.group);
    c.is_root = calloc(nn, sizeof *c.is_root);
    c.program = calloc(nn, sizeof *c.program);
    c.ext = calloc(nn, sizeof *c.ext);
    c.next = calloc(nn, sizeof *c.next);
    Grow gr = {0};
    gr.in = calloc(nn, sizeof *gr.in);
    gr.pinned = calloc(nn, sizeof *gr.pinned);
    gr.mem = calloc(nn, sizeof *gr.mem);
    IrGraph *out = NULL;
    char *text = malloc(PROGRAM_MAX + 1);
    if (!live || !c.group || !c.is_root || !c.program || !c.ext || !c.next || !gr.in || !gr.pinned || !gr.mem || !text ||
        readers_build(&c) < 0) {
        snprintf(err, n, "out of memory");
        goto done;
    }
    int ngroups = 0;
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const IrNode *x = g->nodes[i];
        if (!live[i] || c.group[i] || !fusible(x) || is_const_like(x) || x->rank < 1 || x->op == IR_EXPAND ||
            x->op == IR_MATMUL || x->op == IR_PERMUTE)
            continue;
        grow_group(&c, &gr, i);
        int ext[IR_MAXIN + 1];
        int next = count_externals(&c, &gr, -1, ext, IR_MAXIN);
        int ok = gr.nmem > 1 && next <= IR_MAXIN && next >= 1;
        if (ok && write_program(&c, &gr, ext, next, text, PROGRAM_MAX + 1) < 0)
            ok = 0;
        if (ok) {
            ngroups++;
            for (int m = 0; m < gr.nmem; m++)
                c.group[gr.mem[m]] = ngroups;
            c.is_root[i] = 1;
            c.program[i] = strdup(text);
            c.ext[i] = malloc(sizeof(int) * (size_t)next);
            if (!c.program[i] || !c.ext[i]) {
                snprintf(err, n, "out of memory");
                goto done;
            }
            memcpy(c.ext[i], ext, sizeof(int) * (size_t)next);
            c.next[i] = next;
        }
        for (int m = 0; m < gr.nmem; m++) {
            const IrNode *x = g->nodes[gr.mem[m]];
            gr.in[gr.mem[m]] = 0;
            if (x->op == IR_MATMUL)
                gr.pinned[x->in[0]->id] = gr.pinned[x->in[1]->id] = 0;
            if (x->op == IR_PERMUTE)
                gr.pinned[x->in[0]->id] = 0;
        }
    }
    out = pass_rewrite(g, fuse, &c, NULL, err, n);
done:
    if (c.program)
        for (int i = 0; i < g->nnodes; i++)
            free(c.program[i]);
    if (c.ext)
        for (int i = 0; i < g->nnodes; i++)
            free(c.ext[i]);
    free(c.program);
    free(c.ext);
    free(c.next);
    free(c.group);
    free(c.is_root);
    free(c.start);
    free(c.list);
    free(uses);
    free(live);
    free(gr.in);
    free(gr.pinned);
    free(gr.mem);
    free(text);
    return out;
}
