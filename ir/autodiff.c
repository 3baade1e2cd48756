/* autodiff.c: reverse-mode automatic differentiation over the tensor IR.
 *
 * Requires: a graph that verifies, and either a scalar f32 output to differentiate (the loss)
 * or the request to seed every f32 output O with a caller-supplied gradient input "grad.O".
 * Produces: the same graph with the backward nodes appended and one output "grad.<name>" per
 * parameter, in node order (zeros for a parameter the loss does not depend on).
 *
 * How (tinygrad's gradient rule table is the model):
 *   1. needs[n]: n carries a gradient: it is a parameter, or an f32 value computed from one by an
 *      op that passes gradients. Only f32 values carry gradients, so integer and bool operands
 *      (gather's indices, cross_entropy's targets, where's condition, the operand of a cast from
 *      an int) get none because of their dtype, and comparisons and logic, whose results are
 *      bool, stop the gradient by the table (NOGRAD).
 *   2. Seed the loss with 1 (or each output O with the input grad.O, as PyTorch's
 *      y.backward(g)), times the scalar input loss_scale when one is asked for, then walk the forward nodes in reverse topological order. When the walk
 *      reaches a node its gradient is complete: it is labelled grad.<label> and handed to the
 *      op's rule, which builds a contribution for each operand that needs one.
 *   3. accum() is the one place where a contribution is reduced back from its broadcast shape
 *      (unbroadcast) and added to what the operand already has.
 *   4. Each parameter's gradient becomes an output.
 *
 * Every gradient node is built through the builder API (ir_binary, ir_matmul, ...), so
 * hash-consing shares subexpressions with the forward graph and among the gradients. Errors from
 * the builders stop at the graph's first error (ir_graph_error), checked once at the end. */
#include "ir.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define SQRT1_2 0.70710678118654752440         /* 1 / sqrt 2 */
#define INV_SQRT_2PI 0.39894228040143267794    /* 1 / sqrt(2 pi) */
#define TWO_OVER_SQRTPI 1.12837916709551257390 /* 2 / sqrt pi */

typedef struct {
    IrGraph *g;
    int nfwd;        /* nodes of the forward graph: ids [0, nfwd) */
    char *needs;     /* [nfwd] */
    IrNode **grad;   /* [nfwd] accumulated d loss / d node, NULL while none arrived */
} Ad;

/* ---- small builders ---- */

static IrNode *cst(Ad *A, double v) { return ir_const(A->g, v, IR_F32); }
static IrNode *add(Ad *A, IrNode *a, IrNode *b) { return ir_binary(A->g, IR_ADD, a, b); }
static IrNode *sub(Ad *A, IrNode *a, IrNode *b) { return ir_binary(A->g, IR_SUB, a, b); }
static IrNode *mul(Ad *A, IrNode *a, IrNode *b) { return ir_binary(A->g, IR_MUL, a, b); }
static IrNode *dvd(Ad *A, IrNode *a, IrNode *b) { return ir_binary(A->g, IR_DIV, a, b); }
static IrNode *neg(Ad *A, IrNode *x) { return ir_unary(A->g, IR_NEG, x); }
static IrNode *un(Ad *A, IrOp op, IrNode *x) { return ir_unary(A->g, op, x); }
static IrNode *f32_of(Ad *A, IrNode *x) { return ir_cast(A->g, x, IR_F32); }

/* zeros of a shape, as a scalar constant broadcast by expand */
static IrNode *zeros(Ad *A, int rank, const IrDim *shape)
{
    IrNode *z = cst(A, 0);
    return rank ? ir_expand(A->g, z, rank, shape) : z;
}

/* [..., m, k] -> [..., k, m] */
static IrNode *transpose_last2(Ad *A, IrNode *x)
{
    int perm[IR_MAXRANK];
    for (int i = 0; i < x->rank; i++)
        perm[i] = i;
    perm[x->rank - 2] = x->rank - 1;
    perm[x->rank - 1] = x->rank - 2;
    return ir_permute(A->g, x, perm);
}

/* ---- broadcasting and accumulation: the one place for each ---- */

/* Sums g over the axes along which x was broadcast (numpy rules: x right-aligned, a dimension
 * of 1 repeats, missing leading dimensions repeat), then reshapes the kept size-1 axes away, so
 * the result has x's shape. */
static IrNode *unbroadcast(Ad *A, IrNode *g, const IrNode *x)
{
    if (!g)
        return NULL;
    int lead = g->rank - x->rank;
    if (lead < 0) {
        ir_graph_set_error(A->g, "autodiff: gradient of rank %d for a value of rank %d", g->rank, x->rank);
        return NULL;
    }
    for (int d = 0; d < g->rank; d++) {
        int k = d - lead;
        int broadcast = k < 0 || ir_dim_is_one(x->shape[k]);
        if (broadcast && !ir_dim_is_one(g->shape[d]))
            g = ir_reduce(A->g, IR_SUM, g, d);
    }
    return ir_reshape(A->g, g, x->rank, x->shape);
}

/* Adds contribution c (in x's shape, or any shape x broadcasts to) to x's gradient. */
static void accum(Ad *A, const IrNode *x, IrNode *c)
{
    if (!A->needs[x->id])
        return;
    c = unbroadcast(A, c, x);
    IrNode **slot = &A->grad[x->id];
    *slot = *slot ? add(A, *slot, c) : c;
}

/* Whether operand k of n takes a gradient: rules build nothing for the others. */
static int want(const Ad *A, const IrNode *n, int k) { return A->needs[n->in[k]->id]; }

/* ---- the rules: n is the forward node, g its complete gradient (n's shape) ---- */

typedef void (*GradRule)(Ad *A, IrNode *n, IrNode *g);

/* elementwise unary: d/dx op(x), y = n */
static void grad_neg(Ad *A, IrNode *n, IrNode *g) { accum(A, n->in[0], neg(A, g)); }

static void grad_exp(Ad *A, IrNode *n, IrNode *g) { accum(A, n->in[0], mul(A, g, n)); }

static void grad_log(Ad *A, IrNode *n, IrNode *g) { accum(A, n->in[0], dvd(A, g, n->in[0])); }

/* y = sqrt x: g / (2y) */
static void grad_sqrt(Ad *A, IrNode *n, IrNode *g)
{
    accum(A, n->in[0], dvd(A, mul(A, g, cst(A, 0.5)), n));
}

/* y = x^-1/2: -g y^3 / 2 */
static void grad_rsqrt(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *y = n;
    accum(A, n->in[0], mul(A, mul(A, g, cst(A, -0.5)), mul(A, y, mul(A, y, y))));
}

/* y = 1/x: -g y^2 */
static void grad_recip(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *y = n;
    accum(A, n->in[0], mul(A, neg(A, g), mul(A, y, y)));
}

/* g (1 - y^2) */
static void grad_tanh(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *y = n;
    accum(A, n->in[0], mul(A, g, sub(A, cst(A, 1), mul(A, y, y))));
}

/* g y (1 - y) */
static void grad_sigmoid(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *y = n;
    accum(A, n->in[0], mul(A, g, mul(A, y, sub(A, cst(A, 1), y))));
}

/* exact gelu x Phi(x): Phi(x) + x phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2,
 * phi(x) = exp(-x^2 / 2) / sqrt(2 pi) */
static void grad_gelu(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *x = n->in[0];
    IrNode *cdf = mul(A, cst(A, 0.5), add(A, cst(A, 1), un(A, IR_ERF, mul(A, x, cst(A, SQRT1_2)))));
    IrNode *pdf = mul(A, cst(A, INV_SQRT_2PI), un(A, IR_EXP, mul(A, cst(A, -0.5), mul(A, x, x))));
    accum(A, x, mul(A, g, add(A, cdf, mul(A, x, pdf))));
}

/* erf'(x) = 2 / sqrt(pi) exp(-x^2) */
static void grad_erf(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *x = n->in[0];
    accum(A, x, mul(A, g, mul(A, cst(A, TWO_OVER_SQRTPI), un(A, IR_EXP, neg(A, mul(A, x, x))))));
}

/* relu: g where x > 0; at the kink x = 0 the gradient is 0 (as torch) */
static void grad_relu(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *x = n->in[0];
    accum(A, x, ir_where(A->g, ir_binary(A->g, IR_LT, cst(A, 0), x), g, cst(A, 0)));
}

static void grad_sin(Ad *A, IrNode *n, IrNode *g)
{
    accum(A, n->in[0], mul(A, g, un(A, IR_COS, n->in[0])));
}

static void grad_cos(Ad *A, IrNode *n, IrNode *g)
{
    accum(A, n->in[0], neg(A, mul(A, g, un(A, IR_SIN, n->in[0]))));
}

/* abs: g sign(x), sign(0) = 0 (as torch) */
static void grad_abs(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *x = n->in[0], *zero = cst(A, 0);
    IrNode *sign = sub(A, f32_of(A, ir_binary(A->g, IR_LT, zero, x)), f32_of(A, ir_binary(A->g, IR_LT, x, zero)));
    accum(A, x, mul(A, g, sign));
}

/* f32 -> f32 passes g through. Casts from ints or bool have no f32 operand to differentiate
 * (needs[] is 0 for it); casts to ints or bool give no f32 result, so no gradient arrives. */
static void grad_cast(Ad *A, IrNode *n, IrNode *g)
{
    if (n->in[0]->dtype == IR_F32)
        accum(A, n->in[0], g);
}

/* elementwise binary: contributions in the broadcast shape; accum() reduces them */
static void grad_add(Ad *A, IrNode *n, IrNode *g)
{
    accum(A, n->in[0], g);
    accum(A, n->in[1], g);
}

static void grad_sub(Ad *A, IrNode *n, IrNode *g)
{
    accum(A, n->in[0], g);
    if (want(A, n, 1))
        accum(A, n->in[1], neg(A, g));
}

static void grad_mul(Ad *A, IrNode *n, IrNode *g)
{
    if (want(A, n, 0))
        accum(A, n->in[0], mul(A, g, n->in[1]));
    if (want(A, n, 1))
        accum(A, n->in[1], mul(A, g, n->in[0]));
}

/* y = a / b: g / b, and -g y / b */
static void grad_div(Ad *A, IrNode *n, IrNode *g)
{
    if (want(A, n, 0))
        accum(A, n->in[0], dvd(A, g, n->in[1]));
    if (want(A, n, 1))
        accum(A, n->in[1], neg(A, dvd(A, mul(A, g, n), n->in[1])));
}

/* Routes g to the first operand where first_wins holds, else to the second. */
static void route2(Ad *A, IrNode *n, IrNode *g, IrNode *first_wins)
{
    IrNode *zero = cst(A, 0);
    if (want(A, n, 0))
        accum(A, n->in[0], ir_where(A->g, first_wins, g, zero));
    if (want(A, n, 1))
        accum(A, n->in[1], ir_where(A->g, first_wins, zero, g));
}

/* max(a, b): g goes to the larger operand; on a tie to the FIRST one (a >= b). The lowering
 * writes clamp(x, min = eps) as max(x, eps), and torch.clamp passes the gradient to x when
 * x >= eps, so x sitting exactly at eps still gets it. */
static void grad_max(Ad *A, IrNode *n, IrNode *g)
{
    route2(A, n, g, ir_binary(A->g, IR_LE, n->in[1], n->in[0]));
}

/* min(a, b): the same, ties to the first operand (a <= b), as torch.clamp(x, max = c) */
static void grad_min(Ad *A, IrNode *n, IrNode *g)
{
    route2(A, n, g, ir_binary(A->g, IR_LE, n->in[0], n->in[1]));
}

/* where(c, a, b): g to the chosen branch; the bool condition takes none */
static void grad_where(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *zero = cst(A, 0);
    if (want(A, n, 1))
        accum(A, n->in[1], ir_where(A->g, n->in[0], g, zero));
    if (want(A, n, 2))
        accum(A, n->in[2], ir_where(A->g, n->in[0], zero, g));
}

/* reductions: the axis is kept with size 1, so g broadcasts back over it */
static void grad_sum(Ad *A, IrNode *n, IrNode *g)
{
    const IrNode *x = n->in[0];
    accum(A, x, ir_expand(A->g, g, x->rank, x->shape));
}

/* reduce_max: g goes to the positions equal to the maximum; ties split it evenly (as
 * torch.amax), so the total passed down is always g. */
static void grad_rmax(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *x = n->in[0];
    IrNode *hit = f32_of(A, ir_binary(A->g, IR_EQ, x, n));  /* x's shape */
    IrNode *count = ir_reduce(A->g, IR_SUM, hit, (int)n->ia[IR_IA_AXIS]);      /* n's shape, >= 1 */
    accum(A, x, mul(A, hit, dvd(A, g, count)));
}

/* y = softmax(x) over the last axis: y (g - sum(g y)) */
static void grad_softmax(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *y = n;
    IrNode *dot = ir_reduce(A->g, IR_SUM, mul(A, g, y), -1);
    accum(A, n->in[0], mul(A, y, sub(A, g, dot)));
}

/* y = entmax15(x) over the last axis (entmax 1.3's Entmax15Function.backward, the exact
 * gradient): with s = sqrt(y), dx = g s - s sum(g s) / sum(s). Entries outside the support (and
 * the masked ones) have s = 0, so they take none; sum(s) > 0 on every row. */
static void grad_entmax15(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *s = un(A, IR_SQRT, n);
    IrNode *gs = mul(A, g, s);
    IrNode *q = dvd(A, ir_reduce(A->g, IR_SUM, gs, -1), ir_reduce(A->g, IR_SUM, s, -1));
    accum(A, n->in[0], sub(A, gs, mul(A, s, q)));
}

/* data movement */
static void grad_reshape(Ad *A, IrNode *n, IrNode *g)
{
    const IrNode *x = n->in[0];
    accum(A, x, ir_reshape(A->g, g, x->rank, x->shape));
}

static void grad_permute(Ad *A, IrNode *n, IrNode *g)
{
    int inv[IR_MAXRANK];
    for (int i = 0; i < n->rank; i++)
        inv[n->perm[i]] = i;
    accum(A, n->in[0], ir_permute(A->g, g, inv));
}

/* slice [start, start + len) of axis: g with zeros before and after it */
static void grad_slice(Ad *A, IrNode *n, IrNode *g)
{
    const IrNode *x = n->in[0];
    int axis = (int)n->ia[IR_IA_AXIS];
    IrDim before = n->d;
    IrDim after = ir_dim_sub(ir_dim_sub(x->shape[axis], n->d), n->shape[axis]);
    IrDim shape[IR_MAXRANK];
    memcpy(shape, n->shape, sizeof shape);
    if (!(ir_dim_is_const(before) && before.c == 0)) {
        shape[axis] = before;
        g = ir_concat(A->g, zeros(A, n->rank, shape), g, axis);
    }
    if (!(ir_dim_is_const(after) && after.c == 0)) {
        shape[axis] = after;
        g = ir_concat(A->g, g, zeros(A, n->rank, shape), axis);
    }
    accum(A, x, g);
}

/* concat(a, b): the two slices of g */
static void grad_concat(Ad *A, IrNode *n, IrNode *g)
{
    const IrNode *a = n->in[0], *b = n->in[1];
    int axis = (int)n->ia[IR_IA_AXIS];
    if (want(A, n, 0))
        accum(A, a, ir_slice(A->g, g, axis, ir_dim(0), a->shape[axis]));
    if (want(A, n, 1))
        accum(A, b, ir_slice(A->g, g, axis, a->shape[axis], b->shape[axis]));
}

/* expand is broadcasting: accum() sums g back to the operand's shape */
static void grad_expand(Ad *A, IrNode *n, IrNode *g) { accum(A, n->in[0], g); }

/* gather(table[V, D], idx) -> [..., D]: scatter-add of g's rows into a [V, D] table */
static void grad_gather(Ad *A, IrNode *n, IrNode *g)
{
    const IrNode *table = n->in[0];
    accum(A, table, ir_gather_grad(A->g, g, n->in[1], table->shape[0]));
}

/* gather_grad(src[..., D], idx) -> [rows, D] is linear in src: its gradient gathers */
static void grad_gather_grad(Ad *A, IrNode *n, IrNode *g)
{
    accum(A, n->in[0], ir_gather(A->g, g, n->in[1]));
}

/* C = A B (C[.., m, n], A[.., m, k], B[.., k, n]):  dA = g B^T, dB = A^T g.
 * transpose_b (B[.., n, k], C = A B^T):            dA = g B,   dB = g^T A.
 * Batch dimensions broadcast; accum() sums each product back over the batch dimensions its
 * operand was broadcast along (a weight W[out, in] used by x[b, n, in] gets dW summed over b). */
static void grad_matmul(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *a = n->in[0], *b = n->in[1];
    int tb = n->ia[IR_IA_TRANSPOSE_B] != 0;
    if (want(A, n, 0))
        accum(A, a, ir_matmul(A->g, g, b, !tb));
    if (want(A, n, 1))
        accum(A, b, tb ? ir_matmul(A->g, transpose_last2(A, g), a, 0) : ir_matmul(A->g, transpose_last2(A, a), g, 0));
}

/* loss = mean over targets t >= 0 of logsumexp(z) - z[t]; g is the scalar upstream gradient.
 * dz = (softmax(z) - onehot(t)) * valid * g / max(count, 1), with valid = (t >= 0) and count
 * its sum: built from primitives (softmax, arange, eq, cast, sum) rather than an op of its own. */
static void grad_xent(Ad *A, IrNode *n, IrNode *g)
{
    IrGraph *G = A->g;
    IrNode *z = n->in[0], *t = n->in[1];
    int r = t->rank;
    IrDim col[IR_MAXRANK];                   /* t's shape and a trailing 1 */
    memcpy(col, t->shape, sizeof col);
    col[r] = ir_dim(1);
    IrNode *classes = ir_arange(G, ir_dim(0), z->shape[r], t->dtype);                     /* [V] */
    IrNode *onehot = f32_of(A, ir_binary(G, IR_EQ, ir_reshape(G, t, r + 1, col), classes)); /* [..., V] */
    IrNode *valid = f32_of(A, ir_binary(G, IR_LE, ir_const(G, 0, t->dtype), t));           /* [...] */
    IrNode *count = valid;
    for (int d = 0; d < r; d++)
        count = ir_reduce(G, IR_SUM, count, d);
    count = ir_reshape(G, count, 0, NULL);                                                  /* [] */
    IrNode *scale = dvd(A, g, ir_binary(G, IR_MAX, count, cst(A, 1)));
    IrNode *w = mul(A, ir_reshape(G, valid, r + 1, col), scale);                            /* [..., 1] */
    accum(A, z, mul(A, sub(A, ir_softmax(G, z), onehot), w));
}

/* Fused attention: the one hand-written backward (STYLE.md, practice 4), because recomputing
 * the scores instead of storing them is its point. attention_grad needs the forward with its
 * statistics (the same node when it has them, else a twin that hash-consing keeps unique) and
 * returns dq, dk, dv stacked. The bias and the scale take no gradient here: the fusion leaves
 * attention with a trained bias or scale unfused, so a graph never reaches this with one. */
static void grad_attention(Ad *A, IrNode *n, IrNode *g)
{
    IrNode *q = n->in[0], *k = n->in[1], *v = n->in[2];
    if (want(A, n, 3) || want(A, n, 5)) {
        ir_graph_set_error(A->g, "the gradient of an attention bias or scale is not supported (node %%%s)",
                           n->label ? n->label : "?");
        return;
    }
    IrNode *o = n;
    if (!n->ia[IR_IA_STATS]) { /* the same attention with its row statistics */
        IrNode p = *n;
        p.ia[IR_IA_STATS] = 1;
        o = ir_node(A->g, &p);
    }
    IrNode *b = ir_attention_grad(A->g, o, g);
    int r = q->rank;
    IrDim I = q->shape[r - 2], J = k->shape[r - 2];
    if (want(A, n, 0))
        accum(A, q, ir_slice(A->g, b, r - 2, ir_dim(0), I));
    /* grouped key/values: dk, dv of key/value head g are in the rows of head g (ops.def) */
    int grouped = ir_attention_kv_group(n) != 1;
    IrDim G = grouped ? k->shape[r - 3] : ir_dim(0);
    if (want(A, n, 1)) {
        IrNode *dk = ir_slice(A->g, b, r - 2, I, J);
        accum(A, k, grouped ? ir_slice(A->g, dk, r - 3, ir_dim(0), G) : dk);
    }
    if (want(A, n, 2)) {
        IrNode *dv = ir_slice(A->g, b, r - 2, ir_dim_add(I, J), J);
        accum(A, v, grouped ? ir_slice(A->g, dv, r - 3, ir_dim(0), G) : dv);
    }
}

/* ---- the table: one entry per op of ops.def ---- */

typedef struct {
    GradRule rule;       /* builds each operand's contribution from the node's gradient */
    const char *nograd;  /* or: why the op passes no gradient at all */
} GradEntry;

#define RULE(fn) {fn, NULL}
#define NOGRAD(why) {NULL, why}

static const GradEntry grad_table[] = {
    [IR_INPUT]   = NOGRAD("leaf: data, not trained"),
    [IR_PARAM]   = NOGRAD("leaf: its gradient becomes the output grad.<name>"),
    [IR_BUFFER]  = NOGRAD("leaf: a persistent buffer, not trained"),
    [IR_CONST]   = NOGRAD("leaf: a constant"),
    [IR_ARANGE]  = NOGRAD("leaf: integer positions"),
    [IR_RELPOS]  = NOGRAD("leaf: integer buckets"),

    [IR_NEG]     = RULE(grad_neg),
    [IR_EXP]     = RULE(grad_exp),
    [IR_LOG]     = RULE(grad_log),
    [IR_SQRT]    = RULE(grad_sqrt),
    [IR_RSQRT]   = RULE(grad_rsqrt),
    [IR_RECIP]   = RULE(grad_recip),
    [IR_TANH]    = RULE(grad_tanh),
    [IR_SIGMOID] = RULE(grad_sigmoid),
    [IR_GELU]    = RULE(grad_gelu),
    [IR_ERF]     = RULE(grad_erf),
    [IR_RELU]    = RULE(grad_relu),
    [IR_SIN]     = RULE(grad_sin),
    [IR_COS]     = RULE(grad_cos),
    [IR_ABS]     = RULE(grad_abs),
    [IR_NOT]     = NOGRAD("logic: bool result"),
    [IR_CAST]    = RULE(grad_cast),  /* f32 -> f32 only; from ints/bool: no f32 operand */

    [IR_ADD]     = RULE(grad_add),
    [IR_SUB]     = RULE(grad_sub),
    [IR_MUL]     = RULE(grad_mul),
    [IR_DIV]     = RULE(grad_div),
    [IR_MAX]     = RULE(grad_max),
    [IR_MIN]     = RULE(grad_min),
    [IR_LT]      = NOGRAD("comparison: bool result, piecewise constant"),
    [IR_LE]      = NOGRAD("comparison: bool result, piecewise constant"),
    [IR_EQ]      = NOGRAD("comparison: bool result, piecewise constant"),
    [IR_AND]     = NOGRAD("logic: bool result"),
    [IR_OR]      = NOGRAD("logic: bool result"),
    [IR_WHERE]   = RULE(grad_where), /* the bool condition takes none */

    [IR_SUM]     = RULE(grad_sum),
    [IR_RMAX]    = RULE(grad_rmax),
    [IR_SOFTMAX] = RULE(grad_softmax),
    [IR_ENTMAX15] = RULE(grad_entmax15),
    [IR_KTH_LARGEST] = NOGRAD("a threshold: x-transformers' sparse_topk only compares the logits with it "
                              "(dots < vk), so no gradient flows through the k-th largest value"),

    [IR_RESHAPE] = RULE(grad_reshape),
    [IR_PERMUTE] = RULE(grad_permute),
    [IR_SLICE]   = RULE(grad_slice),
    [IR_CONCAT]  = RULE(grad_concat),
    [IR_EXPAND]  = RULE(grad_expand),
    [IR_GATHER]  = RULE(grad_gather),  /* the integer indices take none */
    [IR_GATHER_GRAD] = RULE(grad_gather_grad),

    [IR_MATMUL]  = RULE(grad_matmul),
    [IR_MATMUL_Q8] = NOGRAD("int8 weights are for inference: the compile driver refuses them with a gradient "
                            "(train with f32 weights, then quantize)"),

    [IR_XENT]    = RULE(grad_xent),    /* the integer targets take none */
    [IR_RAND]    = NOGRAD("random numbers: x gives only the shape"),

    [IR_ATTENTION] = RULE(grad_attention), /* the bool mask takes none; a bias or scale none either */
    [IR_ATTENTION_GRAD] = NOGRAD("the backward of attention: no second derivatives"),
    [IR_FUSED]   = NOGRAD("made by the fusion passes, after autodiff"),
};
_Static_assert(sizeof grad_table / sizeof grad_table[0] == IR_NUM_OPS,
               "ir/autodiff.c: grad_table needs an entry (a rule or NOGRAD) for every op of ops.def");

int ir_autodiff_has_rule(IrOp op) { return (unsigned)op < IR_NUM_OPS && grad_table[op].rule != NULL; }

const char *ir_autodiff_nograd(IrOp op) { return (unsigned)op < IR_NUM_OPS ? grad_table[op].nograd : NULL; }

/* ---- the pass ---- */

static int fail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* needs[n]: a parameter, or an f32 result of an op that is not NOGRAD with an operand that
 * needs. An op with no entry at all counts as passing gradients, so that reaching it is the
 * error that names it. */
static void mark_needs(Ad *A)
{
    for (int i = 0; i < A->nfwd; i++) {
        const IrNode *n = A->g->nodes[i];
        if (n->op == IR_PARAM) {
            A->needs[i] = 1;
            continue;
        }
        if (n->dtype != IR_F32 || grad_table[n->op].nograd)
            continue;
        for (int k = 0; k < n->nin; k++)
            A->needs[i] |= A->needs[n->in[k]->id];
    }
}

static int seed(Ad *A, const IrGradOpts *o, char *err, size_t n)
{
    IrGraph *g = A->g;
    IrNode *scale = NULL; /* the loss scale S, a scalar input, or NULL for 1 */
    if (o->loss_scale) {
        for (int i = 0; i < A->nfwd; i++)
            if (g->nodes[i]->op == IR_INPUT && strcmp(g->nodes[i]->s, o->loss_scale) == 0)
                return fail(err, n, "autodiff: the model already has an input named '%s', the name of the loss scale",
                            o->loss_scale);
        scale = ir_input(g, o->loss_scale, IR_F32, 0, NULL);
    }
    if (o->loss) {
        for (int i = 0; i < g->noutputs; i++) {
            const IrOutput *out = &g->outputs[i];
            if (strcmp(out->name, o->loss) != 0)
                continue;
            if (out->node->dtype != IR_F32 || out->node->rank != 0)
                return fail(err, n, "autodiff: output '%s' is %s of rank %d, not a scalar f32", o->loss,
                            ir_dtype_name(out->node->dtype), out->node->rank);
            accum(A, out->node, scale ? scale : cst(A, 1));
            return 0;
        }
        return fail(err, n, "autodiff: the graph has no output named '%s'", o->loss);
    }
    if (!o->seed_outputs)
        return fail(err, n, "autodiff: give a loss output or ask to seed the outputs");
    int nout = g->noutputs; /* the gradients added later are not seeded */
    for (int i = 0; i < nout; i++) {
        const IrOutput *out = &g->outputs[i];
        if (out->node->dtype != IR_F32)
            continue;
        char name[300];
        snprintf(name, sizeof name, "grad.%s", out->name);
        IrNode *dout = ir_input(g, name, IR_F32, out->node->rank, out->node->shape);
        accum(A, out->node, scale ? mul(A, dout, scale) : dout);
    }
    return 0;
}

/* Reverse topological walk over the forward nodes. */
static int backward(Ad *A, char *err, size_t n)
{
    for (int i = A->nfwd - 1; i >= 0; i--) {
        IrNode *g = A->grad[i];
        IrNode *x = A->g->nodes[i];
        if (!g)
            continue; /* the seeds do not depend on x, or x carries no gradient */
        if (x->label && g->id >= A->nfwd && !(ir_ops[g->op].flags & IR_LEAF))
            ir_label(A->g, g, "grad.%s", x->label);
        if (x->op == IR_PARAM)
            continue;
        const GradEntry *e = &grad_table[x->op];
        if (!e->rule) {
            char who[300] = "";
            if (x->label)
                snprintf(who, sizeof who, " (node %%%s)", x->label);
            return fail(err, n, "autodiff: op '%s' has no gradient rule%s", ir_ops[x->op].name, who);
        }
        e->rule(A, x, g);
        if (ir_graph_error(A->g))
            return fail(err, n, "autodiff: %s", ir_graph_error(A->g));
    }
    return 0;
}

/* One output grad.<name> per parameter, in node order. */
static int collect(Ad *A, char *err, size_t n)
{
    IrGraph *G = A->g;
    for (int i = 0; i < A->nfwd; i++) {
        IrNode *p = G->nodes[i];
        if (p->op != IR_PARAM)
            continue;
        IrNode *g = A->grad[i];
        if (!g) {
            g = zeros(A, p->rank, p->shape);
            if (g && p->rank)
                ir_label(G, g, "grad.%s", p->s);
        }
        char name[300];
        snprintf(name, sizeof name, "grad.%s", p->s);
        if (ir_output(G, name, g) < 0)
            return fail(err, n, "autodiff: %s", ir_graph_error(G) ? ir_graph_error(G) : "cannot add an output");
        /* a tied parameter's total gradient is stored under each of its names */
        for (int k = 0; k < G->naliases; k++)
            if (G->aliases[k].target == p) {
                snprintf(name, sizeof name, "grad.%s", G->aliases[k].name);
                if (ir_output(G, name, g) < 0)
                    return fail(err, n, "autodiff: %s", ir_graph_error(G) ? ir_graph_error(G) : "cannot add an output");
            }
    }
    return 0;
}

int ir_autodiff(IrGraph *g, const IrGradOpts *o, char *err, size_t n)
{
    char sink[8];
    if (!err || !n) {
        err = sink;
        n = sizeof sink;
    }
    err[0] = 0;
    static const IrGradOpts by_default = {.loss = "loss"};
    if (!o)
        o = &by_default;
    if (ir_graph_error(g))
        return fail(err, n, "autodiff: the graph has an error: %s", ir_graph_error(g));
    char msg[400];
    if (ir_verify(g, msg, sizeof msg) < 0)
        return fail(err, n, "autodiff: the graph does not verify: %s", msg);

    Ad A;
    memset(&A, 0, sizeof A);
    A.g = g;
    A.nfwd = g->nnodes;
    size_t nn = g->nnodes > 0 ? (size_t)g->nnodes : 1;
    A.needs = calloc(nn, 1);
    A.grad = calloc(nn, sizeof *A.grad);
    int rc;
    if (!A.needs || !A.grad)
        rc = fail(err, n, "autodiff: out of memory");
    else {
        mark_needs(&A);
        rc = seed(&A, o, err, n);
        if (rc == 0)
            rc = backward(&A, err, n);
        if (rc == 0)
            rc = collect(&A, err, n);
        if (rc == 0 && ir_graph_error(g))
            rc = fail(err, n, "autodiff: %s", ir_graph_error(g));
    }
    free(A.needs);
    free(A.grad);
    return rc;
}
