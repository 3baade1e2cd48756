/* shape.c: shape and dtype inference, one function per row kind of ops.def.
 *
 * Each infer_* fills (or, where the node carries its own shape, checks) n->dtype, n->rank and
 * n->shape from the operands and attributes, and returns NULL, or a message into buf. The
 * builder runs it on every new node and the verifier runs it again on every node, so a stored
 * shape is always the inferred one. */
#include "ir.h"
#include "fused_expr.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef const char *(*InferFn)(IrNode *n, char *buf, size_t nb);

static const char *fail(char *buf, size_t nb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, nb, fmt, ap);
    va_end(ap);
    return buf;
}

static void shape_str(const IrNode *n, char *out, size_t nb)
{
    size_t len = 0;
    len += snprintf(out + len, nb - len, "[");
    for (int i = 0; i < n->rank && len < nb; i++) {
        char d[48];
        ir_dim_str(NULL, n->shape[i], d, sizeof d);
        len += snprintf(out + len, nb - len, "%s%s", i ? ", " : "", d);
    }
    if (len < nb)
        snprintf(out + len, nb - len, "]");
}

static int dims_nonneg(const IrNode *n)
{
    for (int i = 0; i < n->rank; i++)
        if (ir_dim_is_const(n->shape[i]) && n->shape[i].c < 0)
            return 0;
    return 1;
}

static const char *infer_leaf(IrNode *n, char *buf, size_t nb)
{
    if (n->rank < 0 || n->rank > IR_MAXRANK)
        return fail(buf, nb, "rank %d out of range", n->rank);
    if (n->dtype >= IR_NUM_DTYPES)
        return fail(buf, nb, "bad dtype");
    if (!dims_nonneg(n))
        return fail(buf, nb, "negative dimension");
    if ((n->op == IR_INPUT || n->op == IR_PARAM || n->op == IR_BUFFER) && (!n->s || !n->s[0]))
        return fail(buf, nb, "%s needs a name", ir_ops[n->op].name);
    if (n->op == IR_PARAM && n->dtype != IR_F32)
        return fail(buf, nb, "parameters are f32");
    if (n->op == IR_BUFFER && n->dtype != IR_F32 && n->dtype != IR_I8)
        return fail(buf, nb, "buffers are f32 (or i8: a quantized weight)");
    if (n->op != IR_BUFFER && n->dtype == IR_I8)
        return fail(buf, nb, "i8 is the type of quantized weights, buffers only");
    return NULL;
}

static const char *infer_arange(IrNode *n, char *buf, size_t nb)
{
    if (n->rank != 1)
        return fail(buf, nb, "arange has rank 1");
    if (n->dtype == IR_BOOL)
        return fail(buf, nb, "arange of bool");
    return infer_leaf(n, buf, nb);
}

static const char *infer_relpos(IrNode *n, char *buf, size_t nb)
{
    if (n->rank != 2 || n->dtype != IR_I64)
        return fail(buf, nb, "relpos_bucket is i64[I, J]");
    if (n->ia[IR_IA_BUCKETS] < 2 || n->ia[IR_IA_MAX_DISTANCE] < 1)
        return fail(buf, nb, "relpos_bucket needs buckets >= 2 and max_distance >= 1");
    return NULL;
}

static const char *infer_unary(IrNode *n, char *buf, size_t nb)
{
    IrNode *x = n->in[0];
    if (x->dtype != IR_F32)
        return fail(buf, nb, "expects f32, got %s", ir_dtype_name(x->dtype));
    if ((n->op == IR_SOFTMAX || n->op == IR_ENTMAX15) && x->rank < 1)
        return fail(buf, nb, "%s of a scalar", ir_ops[n->op].name);
    n->dtype = x->dtype;
    n->rank = x->rank;
    memcpy(n->shape, x->shape, sizeof n->shape);
    return NULL;
}

static const char *infer_not(IrNode *n, char *buf, size_t nb)
{
    IrNode *x = n->in[0];
    if (x->dtype != IR_BOOL)
        return fail(buf, nb, "expects bool, got %s", ir_dtype_name(x->dtype));
    n->dtype = IR_BOOL;
    n->rank = x->rank;
    memcpy(n->shape, x->shape, sizeof n->shape);
    return NULL;
}

static const char *infer_cast(IrNode *n, char *buf, size_t nb)
{
    IrNode *x = n->in[0];
    if (n->dtype >= IR_NUM_DTYPES)
        return fail(buf, nb, "bad dtype");
    n->rank = x->rank;
    memcpy(n->shape, x->shape, sizeof n->shape);
    return NULL;
}

/* numpy broadcasting of the operands into n's shape */
static const char *broadcast(IrNode *n, int first, char *buf, size_t nb)
{
    int rank = 0;
    for (int i = first; i < n->nin; i++)
        if (n->in[i]->rank > rank)
            rank = n->in[i]->rank;
    n->rank = rank;
    for (int d = 0; d < rank; d++) {
        IrDim out = ir_dim(1);
        for (int i = first; i < n->nin; i++) {
            IrNode *x = n->in[i];
            int k = d - (rank - x->rank);
            if (k < 0)
                continue;
            IrDim v = x->shape[k];
            if (ir_dim_is_one(v))
                continue;
            if (ir_dim_is_one(out))
                out = v;
            else if (!ir_dim_eq(out, v)) {
                char a[128], b[128];
                shape_str(n->in[first], a, sizeof a);
                shape_str(x, b, sizeof b);
                return fail(buf, nb, "shapes %s and %s do not broadcast", a, b);
            }
        }
        n->shape[d] = out;
    }
    return NULL;
}

static const char *infer_arith(IrNode *n, char *buf, size_t nb)
{
    IrDType t = n->in[0]->dtype;
    if (t == IR_BOOL || n->in[1]->dtype != t)
        return fail(buf, nb, "operands are %s and %s (need equal numeric types)",
                    ir_dtype_name(t), ir_dtype_name(n->in[1]->dtype));
    n->dtype = t;
    return broadcast(n, 0, buf, nb);
}

static const char *infer_compare(IrNode *n, char *buf, size_t nb)
{
    IrDType t = n->in[0]->dtype;
    if (t == IR_BOOL || n->in[1]->dtype != t)
        return fail(buf, nb, "operands are %s and %s (need equal numeric types)",
                    ir_dtype_name(t), ir_dtype_name(n->in[1]->dtype));
    n->dtype = IR_BOOL;
    return broadcast(n, 0, buf, nb);
}

static const char *infer_logic(IrNode *n, char *buf, size_t nb)
{
    if (n->in[0]->dtype != IR_BOOL || n->in[1]->dtype != IR_BOOL)
        return fail(buf, nb, "expects bool operands");
    n->dtype = IR_BOOL;
    return broadcast(n, 0, buf, nb);
}

static const char *infer_where(IrNode *n, char *buf, size_t nb)
{
    if (n->in[0]->dtype != IR_BOOL)
        return fail(buf, nb, "condition must be bool, got %s", ir_dtype_name(n->in[0]->dtype));
    if (n->in[1]->dtype != n->in[2]->dtype)
        return fail(buf, nb, "branches are %s and %s", ir_dtype_name(n->in[1]->dtype),
                    ir_dtype_name(n->in[2]->dtype));
    n->dtype = n->in[1]->dtype;
    return broadcast(n, 0, buf, nb);
}

static const char *infer_reduce(IrNode *n, char *buf, size_t nb)
{
    IrNode *x = n->in[0];
    int axis = (int)n->ia[IR_IA_AXIS];
    if (axis < 0 || axis >= x->rank)
        return fail(buf, nb, "axis %d out of range for rank %d", axis, x->rank);
    if (x->dtype != IR_F32)
        return fail(buf, nb, "expects f32, got %s", ir_dtype_name(x->dtype));
    n->dtype = x->dtype;
    n->rank = x->rank;
    memcpy(n->shape, x->shape, sizeof n->shape);
    n->shape[axis] = ir_dim(1);
    return NULL;
}

/* [.., J] -> [.., 1]: a row statistic over the last axis, kept with size 1 */
static const char *infer_kth(IrNode *n, char *buf, size_t nb)
{
    IrNode *x = n->in[0];
    if (x->dtype != IR_F32)
        return fail(buf, nb, "expects f32, got %s", ir_dtype_name(x->dtype));
    if (x->rank < 1)
        return fail(buf, nb, "kth_largest of a scalar");
    if (n->ia[IR_IA_K] < 1)
        return fail(buf, nb, "k must be at least 1, got %lld", (long long)n->ia[IR_IA_K]);
    n->dtype = IR_F32;
    n->rank = x->rank;
    memcpy(n->shape, x->shape, sizeof n->shape);
    n->shape[x->rank - 1] = ir_dim(1);
    return NULL;
}

/* symbolic part of a shape must match as a multiset, constant parts as a product */
static const char *infer_reshape(IrNode *n, char *buf, size_t nb)
{
    IrNode *x = n->in[0];
    if (n->rank < 0 || n->rank > IR_MAXRANK || !dims_nonneg(n))
        return fail(buf, nb, "bad target shape");
    n->dtype = x->dtype;
    int64_t pa = 1, pb = 1;
    IrDim sa[IR_MAXRANK], sb[IR_MAXRANK];
    int na = 0, nbs = 0;
    for (int i = 0; i < x->rank; i++) {
        if (ir_dim_is_const(x->shape[i]))
            pa *= x->shape[i].c;
        else
            sa[na++] = x->shape[i];
    }
    for (int i = 0; i < n->rank; i++) {
        if (ir_dim_is_const(n->shape[i]))
            pb *= n->shape[i].c;
        else
            sb[nbs++] = n->shape[i];
    }
    int ok = pa == pb && na == nbs;
    for (int i = 0; ok && i < na; i++) {
        int found = 0;
        for (int j = 0; j < nbs; j++)
            if (ir_dim_eq(sa[i], sb[j])) {
                sb[j] = ir_dim(-1);
                found = 1;
                break;
            }
        ok = found;
    }
    if (!ok) {
        char a[128], b[128];
        shape_str(x, a, sizeof a);
        shape_str(n, b, sizeof b);
        return fail(buf, nb, "cannot reshape %s to %s", a, b);
    }
    return NULL;
}

static const char *infer_permute(IrNode *n, char *buf, size_t nb)
{
    IrNode *x = n->in[0];
    int seen = 0;
    for (int i = 0; i < x->rank; i++) {
        int p = n->perm[i];
        if (p < 0 || p >= x->rank || (seen & (1 << p)))
            return fail(buf, nb, "perm is not a permutation of 0..%d", x->rank - 1);
        seen |= 1 << p;
    }
    for (int i = x->rank; i < IR_MAXRANK; i++)
        if (n->perm[i])
            return fail(buf, nb, "perm longer than the rank");
    n->dtype = x->dtype;
    n->rank = x->rank;
    for (int i = 0; i < x->rank; i++)
        n->shape[i] = x->shape[n->perm[i]];
    return NULL;
}

static const char *infer_slice(IrNode *n, char *buf, size_t nb)
{
    IrNode *x = n->in[0];
    int axis = (int)n->ia[IR_IA_AXIS];
    if (axis < 0 || axis >= x->rank)
        return fail(buf, nb, "axis %d out of range for rank %d", axis, x->rank);
    if (n->rank != x->rank)
        return fail(buf, nb, "slice keeps the rank");
    for (int i = 0; i < x->rank; i++)
        if (i != axis && !ir_dim_eq(n->shape[i], x->shape[i]))
            return fail(buf, nb, "slice changes dimension %d, not only axis %d", i, axis);
    IrDim len = n->shape[axis];
    IrDim rest = ir_dim_sub(ir_dim_sub(x->shape[axis], n->d), len); /* must be >= 0 */
    if ((ir_dim_is_const(n->d) && n->d.c < 0) || (ir_dim_is_const(len) && len.c < 0) ||
        (ir_dim_is_const(rest) && rest.c < 0))
        return fail(buf, nb, "slice out of bounds");
    n->dtype = x->dtype;
    return NULL;
}

static const char *infer_concat(IrNode *n, char *buf, size_t nb)
{
    IrNode *a = n->in[0], *b = n->in[1];
    int axis = (int)n->ia[IR_IA_AXIS];
    if (a->rank != b->rank || a->dtype != b->dtype)
        return fail(buf, nb, "operands differ in rank or dtype");
    if (axis < 0 || axis >= a->rank)
        return fail(buf, nb, "axis %d out of range for rank %d", axis, a->rank);
    for (int i = 0; i < a->rank; i++)
        if (i != axis && !ir_dim_eq(a->shape[i], b->shape[i]))
            return fail(buf, nb, "operands differ in dimension %d", i);
    n->dtype = a->dtype;
    n->rank = a->rank;
    memcpy(n->shape, a->shape, sizeof n->shape);
    n->shape[axis] = ir_dim_add(a->shape[axis], b->shape[axis]);
    return NULL;
}

static const char *infer_expand(IrNode *n, char *buf, size_t nb)
{
    IrNode *x = n->in[0];
    if (n->rank < x->rank || n->rank > IR_MAXRANK)
        return fail(buf, nb, "expand to a lower rank");
    n->dtype = x->dtype;
    for (int i = 0; i < x->rank; i++) {
        IrDim a = x->shape[i], b = n->shape[i + n->rank - x->rank];
        if (!ir_dim_is_one(a) && !ir_dim_eq(a, b))
            return fail(buf, nb, "cannot expand dimension %d", i);
    }
    return NULL;
}

static const char *infer_gather(IrNode *n, char *buf, size_t nb)
{
    IrNode *t = n->in[0], *idx = n->in[1];
    if (t->rank != 2)
        return fail(buf, nb, "table must be rank 2");
    if (!ir_dtype_is_int(idx->dtype))
        return fail(buf, nb, "indices must be integers");
    if (idx->rank + 1 > IR_MAXRANK)
        return fail(buf, nb, "rank too high");
    n->dtype = t->dtype;
    n->rank = idx->rank + 1;
    memcpy(n->shape, idx->shape, sizeof n->shape);
    n->shape[idx->rank] = t->shape[1];
    return NULL;
}

/* the transpose of gather: src[..., D] rows added into [rows, D] at idx[...] */
static const char *infer_gather_grad(IrNode *n, char *buf, size_t nb)
{
    IrNode *src = n->in[0], *idx = n->in[1];
    if (src->dtype != IR_F32)
        return fail(buf, nb, "expects f32 rows, got %s", ir_dtype_name(src->dtype));
    if (!ir_dtype_is_int(idx->dtype))
        return fail(buf, nb, "indices must be integers");
    if (src->rank != idx->rank + 1)
        return fail(buf, nb, "rows must have one more dimension than the indices");
    for (int i = 0; i < idx->rank; i++)
        if (!ir_dim_eq(src->shape[i], idx->shape[i]))
            return fail(buf, nb, "rows and indices differ in dimension %d", i);
    if (ir_dim_is_const(n->d) && n->d.c < 0)
        return fail(buf, nb, "negative row count");
    n->dtype = IR_F32;
    n->rank = 2;
    n->shape[0] = n->d;
    n->shape[1] = src->shape[src->rank - 1];
    return NULL;
}

static const char *infer_matmul(IrNode *n, char *buf, size_t nb)
{
    IrNode *a = n->in[0], *b = n->in[1];
    if (a->dtype != IR_F32 || b->dtype != IR_F32)
        return fail(buf, nb, "expects f32 operands");
    if (a->rank < 2 || b->rank < 2)
        return fail(buf, nb, "operands must have rank >= 2");
    int tb = n->ia[IR_IA_TRANSPOSE_B] != 0;
    IrDim m = a->shape[a->rank - 2], k = a->shape[a->rank - 1];
    IrDim kb = b->shape[b->rank - (tb ? 1 : 2)], nn = b->shape[b->rank - (tb ? 2 : 1)];
    if (!ir_dim_eq(k, kb)) {
        char x[64], y[64];
        return fail(buf, nb, "inner dimensions differ: %s vs %s", ir_dim_str(NULL, k, x, sizeof x),
                    ir_dim_str(NULL, kb, y, sizeof y));
    }
    /* batch dims broadcast */
    int rank = a->rank > b->rank ? a->rank : b->rank;
    n->rank = rank;
    for (int d = 0; d < rank - 2; d++) {
        int ka = d - (rank - a->rank), kbb = d - (rank - b->rank);
        IrDim da = ka >= 0 ? a->shape[ka] : ir_dim(1);
        IrDim db = kbb >= 0 ? b->shape[kbb] : ir_dim(1);
        if (ir_dim_is_one(da))
            n->shape[d] = db;
        else if (ir_dim_is_one(db) || ir_dim_eq(da, db))
            n->shape[d] = da;
        else
            return fail(buf, nb, "batch dimension %d does not broadcast", d);
    }
    n->shape[rank - 2] = m;
    n->shape[rank - 1] = nn;
    n->dtype = IR_F32;
    return NULL;
}

static const char *infer_matmul_q8(IrNode *n, char *buf, size_t nb)
{
    IrNode *a = n->in[0], *w = n->in[1], *s = n->in[2];
    if (a->dtype != IR_F32 || w->dtype != IR_I8 || s->dtype != IR_F32)
        return fail(buf, nb, "expects an f32 operand, an i8 weight and f32 scales");
    if (a->rank < 2 || w->rank != 2 || s->rank != 2)
        return fail(buf, nb, "expects an operand of rank >= 2, a weight [n, k] and scales [n, groups]");
    if (n->ia[IR_IA_TRANSPOSE_B] != 1)
        return fail(buf, nb, "takes its weight as stored, [n, k] (transpose_b=1)");
    if (!ir_dim_is_const(w->shape[0]) || !ir_dim_is_const(w->shape[1]))
        return fail(buf, nb, "the weight's shape must be constant");
    int64_t nn = w->shape[0].c, k = w->shape[1].c, group = n->ia[IR_IA_GROUP];
    if (!ir_dim_eq(a->shape[a->rank - 1], w->shape[1]))
        return fail(buf, nb, "inner dimensions differ");
    if (group < 1 || (k > 0 && group > k))
        return fail(buf, nb, "group %lld outside [1, %lld]", (long long)group, (long long)k);
    int64_t groups = k > 0 ? (k + group - 1) / group : 1;
    if (!ir_dim_eq(s->shape[0], ir_dim(nn)) || !ir_dim_eq(s->shape[1], ir_dim(groups)))
        return fail(buf, nb, "scales must be [%lld, %lld] (a weight [%lld, %lld] in groups of %lld)", (long long)nn,
                    (long long)groups, (long long)nn, (long long)k, (long long)group);
    n->rank = a->rank;
    for (int d = 0; d < a->rank - 1; d++)
        n->shape[d] = a->shape[d];
    n->shape[a->rank - 1] = w->shape[0];
    n->dtype = IR_F32;
    return NULL;
}

static const char *infer_xent(IrNode *n, char *buf, size_t nb)
{
    IrNode *z = n->in[0], *t = n->in[1];
    if (z->dtype != IR_F32 || !ir_dtype_is_int(t->dtype))
        return fail(buf, nb, "expects f32 logits and integer targets");
    if (z->rank != t->rank + 1)
        return fail(buf, nb, "logits must have one more dimension than targets");
    for (int i = 0; i < t->rank; i++)
        if (!ir_dim_eq(z->shape[i], t->shape[i]))
            return fail(buf, nb, "logits and targets differ in dimension %d", i);
    n->dtype = IR_F32;
    n->rank = 0;
    return NULL;
}

/* rand_like(seed i64[], x) -> f32 of x's shape */
static const char *infer_rand(IrNode *n, char *buf, size_t nb)
{
    IrNode *seed = n->in[0], *x = n->in[1];
    if (!ir_dtype_is_int(seed->dtype) || seed->rank != 0)
        return fail(buf, nb, "rand_like's seed is an integer scalar");
    if (n->ia[IR_IA_STREAM] < 0)
        return fail(buf, nb, "rand_like's stream is not negative");
    n->dtype = IR_F32;
    n->rank = x->rank;
    memcpy(n->shape, x->shape, sizeof n->shape);
    return NULL;
}

/* ---- fused ops ---- */

/* x (f32 bias or bool mask) broadcasts to [batch of q, I, J] */
static const char *check_scores_operand(const IrNode *x, const IrNode *q, IrDim J, const char *what, char *buf, size_t nb)
{
    int r = q->rank;
    if (x->rank > r)
        return fail(buf, nb, "the %s has rank %d, more than the scores' %d", what, x->rank, r);
    for (int d = 0; d < x->rank; d++) {
        int t = d + r - x->rank;
        IrDim want = t == r - 1 ? J : q->shape[t];
        if (!ir_dim_is_one(x->shape[d]) && !ir_dim_eq(x->shape[d], want))
            return fail(buf, nb, "the %s does not broadcast to the scores in dimension %d", what, t);
    }
    return NULL;
}

/* q[.., I, D], k[.., J, D], v[.., J, E] with equal batch dims, bias and mask broadcasting to
 * the scores [.., I, J], the scale to [.., 1, 1]. Grouped key/values: with rank >= 3, k and v
 * may have G heads (dimension r - 3) where q has H, G dividing H; query head i reads key/value
 * head i mod G (ir_attention_kv_heads). */
static const char *check_attention_operands(const IrNode *n, const IrNode *const *x, char *buf, size_t nb)
{
    const IrNode *q = x[0], *k = x[1], *v = x[2], *bias = x[3], *mask = x[4], *scale = x[5];
    if (q->dtype != IR_F32 || k->dtype != IR_F32 || v->dtype != IR_F32 || bias->dtype != IR_F32 ||
        scale->dtype != IR_F32)
        return fail(buf, nb, "q, k, v, the bias and the scale must be f32");
    if (mask->dtype != IR_BOOL)
        return fail(buf, nb, "the mask must be bool, got %s", ir_dtype_name(mask->dtype));
    int r = q->rank;
    if (r < 2 || k->rank != r || v->rank != r)
        return fail(buf, nb, "q, k and v must have one rank >= 2");
    for (int d = 0; d < r - 2; d++) {
        if (!ir_dim_eq(k->shape[d], v->shape[d]))
            return fail(buf, nb, "k and v differ in batch dimension %d", d);
        if (ir_dim_eq(k->shape[d], q->shape[d]))
            continue;
        if (d != r - 3)
            return fail(buf, nb, "q, k and v differ in batch dimension %d", d);
        IrDim H = q->shape[d], G = k->shape[d];
        if (!ir_dim_is_const(H) || !ir_dim_is_const(G) || G.c < 1 || H.c % G.c)
            return fail(buf, nb, "k's and v's heads (dimension %d) must be a constant dividing q's (grouped key/values)", d);
    }
    if (!ir_dim_eq(q->shape[r - 1], k->shape[r - 1]))
        return fail(buf, nb, "q and k differ in their last dimension");
    if (!ir_dim_eq(k->shape[r - 2], v->shape[r - 2]))
        return fail(buf, nb, "k and v differ in their number of keys");
    if (n->ia[IR_IA_CAUSAL] != 0 && n->ia[IR_IA_CAUSAL] != 1)
        return fail(buf, nb, "causal is 0 or 1");
    const char *e = check_scores_operand(bias, q, k->shape[r - 2], "bias", buf, nb);
    if (!e)
        e = check_scores_operand(mask, q, k->shape[r - 2], "mask", buf, nb);
    if (!e)
        e = check_scores_operand(scale, q, k->shape[r - 2], "scale", buf, nb);
    for (int d = scale->rank - 2; !e && d < scale->rank; d++)
        if (d >= 0 && !ir_dim_is_one(scale->shape[d]))
            e = fail(buf, nb, "the scale must be one value per batch and head ([.., 1, 1])");
    return e;
}

static const char *infer_attention(IrNode *n, char *buf, size_t nb)
{
    const char *e = check_attention_operands(n, (const IrNode *const *)n->in, buf, nb);
    if (e)
        return e;
    if (n->ia[IR_IA_STATS] != 0 && n->ia[IR_IA_STATS] != 1)
        return fail(buf, nb, "stats is 0 or 1");
    if (n->ia[IR_IA_WINDOW] < 0)
        return fail(buf, nb, "window is 0 (none) or a positive number of keys");
    if (n->ia[IR_IA_BOUND] < 0)
        return fail(buf, nb, "bound is 0 (none) or a positive bound on |q_i| |k_j|");
    if (n->ia[IR_IA_BOUND] > 0) {
        const IrNode *bias = n->in[3], *scale = n->in[5];
        if (!(bias->op == IR_CONST && bias->f == 0))
            return fail(buf, nb, "a bounded attention takes no bias (a bias has no known bound)");
        if (scale->op != IR_CONST || !(scale->f > 0) ||
            !((double)n->ia[IR_IA_BOUND] * scale->f <= IR_ATTENTION_BOUND_MAX))
            return fail(buf, nb, "a bounded attention needs a constant scale s > 0 with bound x s <= %g",
                        IR_ATTENTION_BOUND_MAX);
    }
    const IrNode *q = n->in[0], *v = n->in[2];
    n->dtype = IR_F32;
    n->rank = q->rank;
    memcpy(n->shape, q->shape, sizeof n->shape);
    n->shape[q->rank - 1] = ir_dim_addc(v->shape[v->rank - 1], n->ia[IR_IA_STATS]);
    return NULL;
}

/* operands q, k, v, o, dout, bias, mask, scale; o must be the attention of the same operands
 * with stats, whose values the backends read instead of recomputing the row statistics. Grouped
 * key/values (k, v with G heads where q has H) as for attention: the result keeps q's shape
 * [.., H, I + 2J, D], key/value head g's dk, dv in the rows of head g (ops.def) */
static const char *infer_attention_grad(IrNode *n, char *buf, size_t nb)
{
    const IrNode *x[6] = {n->in[0], n->in[1], n->in[2], n->in[5], n->in[6], n->in[7]};
    const char *e = check_attention_operands(n, x, buf, nb);
    if (e)
        return e;
    const IrNode *q = n->in[0], *k = n->in[1], *v = n->in[2], *o = n->in[3], *dout = n->in[4];
    int r = q->rank;
    if (o->op != IR_ATTENTION || o->ia[IR_IA_STATS] != 1 || o->ia[IR_IA_CAUSAL] != n->ia[IR_IA_GRAD_CAUSAL] || o->ia[IR_IA_WINDOW] != n->ia[IR_IA_GRAD_WINDOW])
        return fail(buf, nb, "operand 4 must be the attention (with stats) whose gradient this is");
    for (int i = 0; i < 6; i++)
        if (o->in[i] != x[i])
            return fail(buf, nb, "operand 4 is the attention of other operands");
    IrDim E = v->shape[r - 1];
    if (!ir_dim_eq(E, q->shape[r - 1]))
        return fail(buf, nb, "needs the same size for the values as for the queries and keys");
    if (dout->dtype != IR_F32 || dout->rank != r)
        return fail(buf, nb, "the output gradient must be f32 of the output's rank");
    for (int d = 0; d < r - 1; d++)
        if (!ir_dim_eq(dout->shape[d], o->shape[d]))
            return fail(buf, nb, "the output gradient differs from the output in dimension %d", d);
    if (!ir_dim_eq(dout->shape[r - 1], E) && !ir_dim_eq(dout->shape[r - 1], ir_dim_addc(E, 1)))
        return fail(buf, nb, "the output gradient's last dimension must be E or E+1");
    n->dtype = IR_F32;
    n->rank = r;
    memcpy(n->shape, q->shape, sizeof n->shape);
    n->shape[r - 2] = ir_dim_add(q->shape[r - 2], ir_dim_add(k->shape[r - 2], k->shape[r - 2]));
    return NULL;
}

/* the program builds as a graph whose value broadcasts to the node's own shape */
static const char *infer_fused(IrNode *n, char *buf, size_t nb)
{
    if (n->rank < 0 || n->rank > IR_MAXRANK || !dims_nonneg(n))
        return fail(buf, nb, "bad shape");
    IrFusedProgram *p = malloc(sizeof *p);
    if (!p)
        return fail(buf, nb, "out of memory");
    char err[256];
    IrNode *steps[IR_FUSED_MAXSTEPS];
    IrGraph *g = ir_fused_graph_of(n, p, steps, err, sizeof err);
    if (g)
        n->dtype = steps[p->nsteps - 1]->dtype;
    free(p);
    ir_graph_free(g);
    return g ? NULL : fail(buf, nb, "%s", err);
}

static const InferFn infer_table[IR_NUM_OPS] = {
#define X(e, name, arity, flags, attrs, infer) [IR_##e] = infer,
#include "ops.def"
#undef X
};

const char *ir_infer(IrNode *n, char *buf, size_t nb)
{
    if (n->op >= IR_NUM_OPS)
        return fail(buf, nb, "unknown op");
    if (!ir_arity_ok(ir_ops[n->op].arity, n->nin))
        return fail(buf, nb, "takes %d operands, got %d", ir_ops[n->op].arity < 0 ? IR_MAXIN : ir_ops[n->op].arity,
                    n->nin);
    for (int i = n->nin; i < IR_MAXIN; i++)
        n->in[i] = NULL;
    int flags = ir_ops[n->op].flags;
    if (!(flags & IR_LEAF) && n->op != IR_RESHAPE && n->op != IR_EXPAND && n->op != IR_SLICE &&
        n->op != IR_CAST && n->op != IR_FUSED) {
        n->rank = 0;
        memset(n->shape, 0, sizeof n->shape);
    }
    for (int i = n->rank; i < IR_MAXRANK; i++)
        n->shape[i] = ir_dim(0);
    if (n->op != IR_PERMUTE)
        memset(n->perm, 0, sizeof n->perm);
    return infer_table[n->op](n, buf, nb);
}

/* ---- verifier ---- */

int ir_verify(const IrGraph *g, char *err, size_t nb)
{
    char msg[256];
    for (int s = 0; s < g->nsyms; s++) {
        if (!g->sym_derived[s])
            continue;
        for (int k = s; k < IR_MAXSYM; k++)
            if (g->sym_def[s].k[k]) {
                snprintf(err, nb, "derived symbol '%s' uses '%s', which is not declared before it", g->sym_name[s],
                         k < g->nsyms ? g->sym_name[k] : "?");
                return -1;
            }
        if (g->sym_max[s] < 0) {
            snprintf(err, nb, "derived symbol '%s' has a negative cap", g->sym_name[s]);
            return -1;
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *n = g->nodes[i];
        const char *lab = n->label ? n->label : "?";
        if (n->id != i) {
            snprintf(err, nb, "node %%%s: id %d at position %d", lab, n->id, i);
            return -1;
        }
        for (int k = 0; k < n->nin; k++)
            if (!n->in[k] || n->in[k]->id >= i || g->nodes[n->in[k]->id] != n->in[k]) {
                snprintf(err, nb, "node %%%s: operand %d is not defined before it", lab, k);
                return -1;
            }
        IrNode tmp = *n;
        const char *e = ir_infer(&tmp, msg, sizeof msg);
        if (e) {
            snprintf(err, nb, "node %%%s (%s): %s", lab, ir_ops[n->op].name, e);
            return -1;
        }
        int same = tmp.dtype == n->dtype && tmp.rank == n->rank;
        for (int d = 0; same && d < n->rank; d++)
            same = ir_dim_eq(tmp.shape[d], n->shape[d]);
        if (!same) {
            char a[128], b[128];
            shape_str(n, a, sizeof a);
            shape_str(&tmp, b, sizeof b);
            snprintf(err, nb, "node %%%s (%s): stored type %s%s, inferred %s%s", lab,
                     ir_ops[n->op].name, ir_dtype_name(n->dtype), a, ir_dtype_name(tmp.dtype), b);
            return -1;
        }
        for (int k = 0; k < IR_MAXSYM; k++)
            for (int d = 0; d < n->rank; d++)
                if (n->shape[d].k[k] && k >= g->nsyms) {
                    snprintf(err, nb, "node %%%s: undeclared symbol in its shape", lab);
                    return -1;
                }
        if (n->label)
            for (int j = 0; j < i; j++)
                if (g->nodes[j]->label && strcmp(g->nodes[j]->label, n->label) == 0) {
                    snprintf(err, nb, "node %%%s: label used twice", lab);
                    return -1;
                }
    }
    for (int i = 0; i < g->naliases; i++) {
        const IrAlias *a = &g->aliases[i];
        const IrNode *t = a->target;
        if (!t || t->id < 0 || t->id >= g->nnodes || g->nodes[t->id] != t ||
            (t->op != IR_PARAM && t->op != IR_BUFFER)) {
            snprintf(err, nb, "alias '%s' does not name a param or buffer of the graph", a->name);
            return -1;
        }
    }
    for (int i = 0; i < g->noutputs; i++) {
        const IrOutput *o = &g->outputs[i];
        if (!o->node || o->node->id < 0 || o->node->id >= g->nnodes || g->nodes[o->node->id] != o->node) {
            snprintf(err, nb, "output '%s' is not a node of the graph", o->name);
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(g->outputs[j].name, o->name) == 0) {
                snprintf(err, nb, "output '%s' defined twice", o->name);
                return -1;
            }
    }
    return 0;
}
