/* attention_bound.c: the pass `cosine_sim`, the bounded-scores variant of fused attention.
 *
 * Requires: a graph after the attention fusion (fused `attention` nodes whose q and k are still
 * the primitive ops that make them).
 * Produces: every attention with no bias and a constant scale s > 0 whose q and k rows provably
 * have L2 norms with a product of at most b (row_norm below) gets the attribute bound=b when
 * b s <= IR_ATTENTION_BOUND_MAX (ir.h); its attention_grad follows it. Every score then lies in
 * [-b s, b s], and the kernels take b s as each row's softmax maximum: exp(score - b s) needs no
 * running maximum and the accumulated output no rescaling (ops.def). The values are unchanged
 * (softmax does not depend on the number subtracted), only the rounding of compiled kernels.
 *
 * Norm bounds, found structurally through what 1.x/2.x lowering builds for attn_qk_norm:
 *  - F.normalize: x / max(sqrt(sum(x * x, -1)), eps)                  -> 1
 *  - rotary: x cos(F) + rotate(x) sin(F), rotate the halves (-x2, x1) with F = cat(t, t), or the
 *    pairs (-x_2i+1, x_2i) with F = t repeated pairwise, cos and sin of the same F through the
 *    same views: a rotation of each pair                               -> the norm of x
 *    (partial rotary: the rotated head's first columns, concatenated with the rest of the same row)
 *  - views that keep rows whole (reshape, permute, expand, keeping the last axis), a concat of
 *    rows (a non-last axis: the larger bound), a slice of a row (no larger)
 *  - a reshape joining m rows into one (qk_norm_groups)                -> sqrt(m) times
 *  - a KV cache: the f32 input whose output of the same name (the pair the runtime carries back,
 *    xtc_session_carry) is that input with rows appended (a concat on a non-last axis, the input
 *    first) holds only rows appended by earlier calls                 -> those rows' bound
 *    The claim is recorded on the graph (ir_row_norm): the module lists it and the runtime refuses
 *    a cache bound by the caller whose rows exceed it, so a foreign cache cannot break it. Rows
 *    rounded to the cache's storage (bf16, int8 with a scale) may have norms a hair above it: a
 *    score then exceeds b s by as much and its exp stays near 1, never overflowing.
 * Anything else (memory key/values, a learned scale) is unknown: no bound. A wrong bound would
 * only cost range, never values, and the interpreter checks it. */
#include "passes.h"

#include <math.h>
#include <string.h>

#include "rewrite.h"

#define DEPTH_MAX 48
#define CACHES_MAX 8

/* the graph walked and the cache inputs a bound relies on */
typedef struct {
    const IrGraph *g;
    int ncaches;
    const IrNode *cache[CACHES_MAX];
    double norm[CACHES_MAX];
} Walk;

static int last_axis(const IrNode *x, int64_t axis) { return axis == x->rank - 1; }

static int same_shape(const IrNode *a, const IrNode *b)
{
    if (a->rank != b->rank)
        return 0;
    for (int d = 0; d < a->rank; d++)
        if (!ir_dim_eq(a->shape[d], b->shape[d]))
            return 0;
    return 1;
}

static int64_t width(const IrNode *x) { return ir_dim_is_const(x->shape[x->rank - 1]) ? x->shape[x->rank - 1].c : -1; }

/* x / max(sqrt(sum(x * x, last)), eps > 0) */
static int is_l2norm(const IrNode *n)
{
    if (n->op != IR_DIV || n->in[1]->op != IR_MAX)
        return 0;
    const IrNode *x = n->in[0], *mx = n->in[1], *rt = NULL;
    double eps = 0;
    for (int side = 0; side < 2 && !rt; side++)
        if (mx->in[side]->op == IR_SQRT && pass_const_value(mx->in[1 - side], &eps) && eps > 0)
            rt = mx->in[side];
    if (!rt)
        return 0;
    const IrNode *sum = rt->in[0];
    if (sum->op != IR_SUM || !last_axis(sum->in[0], sum->ia[IR_IA_AXIS]))
        return 0;
    const IrNode *sq = sum->in[0];
    return sq->op == IR_MUL && sq->in[0] == x && sq->in[1] == x;
}

/* c and s are cos and sin of one node F through the same slices of its rows (rotary's tables cut
 * to the last positions), F's rows kept whole; *f gets F */
static int trig_pair(const IrNode *c, const IrNode *s, const IrNode **f)
{
    for (int depth = 0; depth < DEPTH_MAX; depth++) {
        if (c->op == IR_COS && s->op == IR_SIN && c->in[0] == s->in[0]) {
            *f = c->in[0];
            return 1;
        }
        if (c->op != IR_SLICE || s->op != IR_SLICE || !same_shape(c, s) || c->ia[IR_IA_AXIS] != s->ia[IR_IA_AXIS] ||
            last_axis(c, c->ia[IR_IA_AXIS]) || !ir_dim_eq(c->d, s->d))
            return 0;
        c = c->in[0];
        s = s->in[0];
    }
    return 0;
}

/* slice(x, last, start) of width w, also as the one slice simplify makes of a slice of x's source */
static int is_last_slice(const IrNode *n, const IrNode *x, int64_t start, int64_t w)
{
    if (n->op != IR_SLICE || !last_axis(n, n->ia[IR_IA_AXIS]) || !ir_dim_is_const(n->d) || width(n) != w)
        return 0;
    for (int depth = 0; depth < DEPTH_MAX; depth++) {
        if (n->in[0] == x)
            return n->d.c == start;
        if (x->op != IR_SLICE || !last_axis(x, x->ia[IR_IA_AXIS]) || !ir_dim_is_const(x->d))
            return 0;
        start += x->d.c;
        x = x->in[0];
    }
    return 0;
}

/* the node whose elements, in order, x holds (reshapes only reorder nothing) */
static const IrNode *flat_root(const IrNode *x)
{
    while (x->op == IR_RESHAPE)
        x = x->in[0];
    return x;
}

/* rot = concat(-x2, x1) of x's last axis: its halves (pairs = 0), or of x's pairs [.., h, 2] (pairs = 1);
 * f = the frequencies that go with that layout, each value twice: cat(t, t) or t repeated pairwise */
static int is_rotate(const IrNode *rot, const IrNode *x, const IrNode *f, int pairs)
{
    int64_t w = width(x);
    if (w < 2 || w % 2 || width(f) != w)
        return 0;
    if (pairs) {
        if (rot->op != IR_RESHAPE || f->op != IR_RESHAPE)
            return 0;
        rot = rot->in[0];
        f = f->in[0];
        if (rot->op != IR_CONCAT || f->op != IR_CONCAT || f->in[0] != f->in[1] || width(f->in[0]) != 1 ||
            !last_axis(f, f->ia[IR_IA_AXIS]))
            return 0;
        const IrNode *neg = rot->in[0];
        if (neg->op != IR_NEG || neg->in[0]->op != IR_SLICE || !last_axis(rot, rot->ia[IR_IA_AXIS]))
            return 0;
        const IrNode *pr = neg->in[0]->in[0]; /* x's elements as pairs [.., w/2, 2] */
        return pr->op == IR_RESHAPE && flat_root(pr) == flat_root(x) && width(pr) == 2 &&
               is_last_slice(neg->in[0], pr, 1, 1) && is_last_slice(rot->in[1], pr, 0, 1);
    }
    if (rot->op != IR_CONCAT || !last_axis(rot, rot->ia[IR_IA_AXIS]) || rot->in[0]->op != IR_NEG)
        return 0;
    if (f->op != IR_CONCAT || f->in[0] != f->in[1] || !last_axis(f, f->ia[IR_IA_AXIS]))
        return 0;
    return is_last_slice(rot->in[0]->in[0], x, w / 2, w / 2) && is_last_slice(rot->in[1], x, 0, w / 2);
}

/* n = x cos(F) + rotate(x) sin(F): a rotation of each pair of x's rows; returns x or NULL */
static const IrNode *rotation_of(const IrNode *n)
{
    if (n->op != IR_ADD || n->in[0]->op != IR_MUL || n->in[1]->op != IR_MUL)
        return NULL;
    for (int order = 0; order < 2; order++) {
        const IrNode *a = n->in[order], *b = n->in[1 - order]; /* x cos, rot sin */
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
                const IrNode *x = a->in[i], *c = a->in[1 - i], *rot = b->in[j], *s = b->in[1 - j], *f;
                if (!same_shape(x, n) || !same_shape(rot, n) || width(c) != width(n) || !trig_pair(c, s, &f))
                    continue;
                if (is_rotate(rot, x, f, 0) || is_rotate(rot, x, f, 1))
                    return x;
            }
    }
    return NULL;
}

static double row_norm(Walk *w, const IrNode *x, int depth);

/* x an f32 input carried back from the output of its name, that output x with rows appended: the
 * appended rows' bound (recorded in w), 0 if not so */
static double cache_norm(Walk *w, const IrNode *x, int depth)
{
    const IrNode *o = NULL;
    for (int i = 0; i < w->g->noutputs && !o; i++)
        if (!strcmp(w->g->outputs[i].name, x->s))
            o = w->g->outputs[i].node;
    if (x->dtype != IR_F32 || !o || o->op != IR_CONCAT || o->in[0] != x || last_axis(o, o->ia[IR_IA_AXIS]) ||
        w->ncaches == CACHES_MAX)
        return 0;
    double b = row_norm(w, o->in[1], depth + 1);
    if (b > 0) {
        w->cache[w->ncaches] = x;
        w->norm[w->ncaches++] = b;
    }
    return b;
}

/* an upper bound on the L2 norm of every row (last axis) of x; 0: unknown */
static double row_norm(Walk *w, const IrNode *x, int depth)
{
    if (depth > DEPTH_MAX)
        return 0;
    if (is_l2norm(x))
        return 1;
    const IrNode *in = x->nin > 0 ? x->in[0] : NULL;
    switch (x->op) {
    case IR_INPUT:
        return cache_norm(w, x, depth);
    case IR_ADD: {
        const IrNode *r = rotation_of(x);
        return r ? row_norm(w, r, depth + 1) : 0;
    }
    case IR_RESHAPE: { /* rows whole, or m of them joined */
        int64_t wo = width(x), wi = width(in);
        if (wo < 1 || wi < 1 || wo % wi)
            return 0;
        return sqrt((double)(wo / wi)) * row_norm(w, in, depth + 1);
    }
    case IR_PERMUTE:
        return x->perm[x->rank - 1] == x->rank - 1 ? row_norm(w, in, depth + 1) : 0;
    case IR_EXPAND:
        return in->rank >= 1 && ir_dim_eq(in->shape[in->rank - 1], x->shape[x->rank - 1]) ? row_norm(w, in, depth + 1) : 0;
    case IR_SLICE: /* of rows, or a part of each row */
        return row_norm(w, in, depth + 1);
    case IR_CONCAT: {
        if (!last_axis(x, x->ia[IR_IA_AXIS])) {
            double a = row_norm(w, x->in[0], depth + 1), b = row_norm(w, x->in[1], depth + 1);
            return a > 0 && b > 0 ? fmax(a, b) : 0;
        }
        /* partial rotary: rotary(t[.., :r]) then t[.., r:] of the same t */
        const IrNode *rot = rotation_of(x->in[0]), *rest = x->in[1];
        if (rot && rot->op == IR_SLICE && rest->op == IR_SLICE && rot->in[0] == rest->in[0] &&
            is_last_slice(rot, rot->in[0], 0, width(rot)) &&
            is_last_slice(rest, rest->in[0], width(rot), width(rot->in[0]) - width(rot)))
            return row_norm(w, rot->in[0], depth + 1);
        double a = row_norm(w, x->in[0], depth + 1), b = row_norm(w, x->in[1], depth + 1);
        return a > 0 && b > 0 ? sqrt(a * a + b * b) : 0;
    }
    default:
        return 0;
    }
}

static int64_t bound_of(Walk *w, const IrNode *q, const IrNode *k, const IrNode *bias, const IrNode *scale)
{
    double s;
    if (!(bias->op == IR_CONST && bias->f == 0) || scale->op != IR_CONST || !(scale->f > 0))
        return 0;
    s = scale->f;
    double nq = row_norm(w, q, 0), nk = nq > 0 ? row_norm(w, k, 0) : 0;
    if (!(nq > 0 && nk > 0))
        return 0;
    int64_t b = (int64_t)ceil(nq * nk * (1 - 1e-12));
    return b >= 1 && (double)b * s <= IR_ATTENTION_BOUND_MAX ? b : 0;
}

static IrNode *bound_node(PassRewriter *rw, const IrNode *old, IrNode *p)
{
    if (old->op == IR_ATTENTION && old->ia[IR_IA_BOUND] == 0) {
        Walk w = {.g = rw->old};
        p->ia[IR_IA_BOUND] = bound_of(&w, old->in[0], old->in[1], old->in[3], old->in[5]);
        /* the bound holds only while the caches hold what the module wrote: the runtime checks */
        for (int i = 0; p->ia[IR_IA_BOUND] && i < w.ncaches; i++)
            if (ir_row_norm(rw->g, rw->map[w.cache[i]->id], w.norm[i]) < 0)
                return NULL;
    }
    return pass_build(rw, p);
}

IrGraph *pass_attention_bound(IrGraph *g, const PassTarget *t, char *err, size_t n)
{
    (void)t;
    return pass_rewrite(g, bound_node, NULL, NULL, err, n);
}
