/* interp.c: the reference interpreter, the oracle every backend and pass is tested against.
 *
 * It runs a verified graph node by node in double precision: f32 inputs are widened, integer
 * and bool values are held exactly as doubles (bool as 0/1), and each graph output is converted
 * to its node's dtype at the end. Correctness and clarity come first; the loops are plain, with
 * only the loop order of matmul chosen so that the inner loop is contiguous.
 *
 * Running a graph:
 *   1. ir_verify, then mark the nodes the outputs need and each one's last use.
 *   2. Bind every leaf (input, parameter, buffer) through the callback. Symbols take their values
 *      from the first dimension that is exactly one symbol, derived symbols (q = min(n+p, 512))
 *      from the symbols they name; then every leaf dimension is evaluated and checked, and every
 *      symbol against its bound.
 *   3. Evaluate the needed nodes in order through op_impl[] (one row per op, with its semantics),
 *      freeing each value after its last use.
 *   4. Convert the outputs to their storage dtypes.
 *
 * Integer values stay exact: an i32 result outside the i32 range, or an i64 result beyond 2^53
 * (where doubles stop being exact), is reported as an error rather than wrapped. */
#include "interp_internal.h"
#include "interp_fused.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>


typedef int (*EvalFn)(Interp *it, const IrNode *n, Val *out, const Val *const *in);
typedef double (*Scalar1)(double x);
typedef double (*Scalar2)(double a, double b);

typedef struct {
    EvalFn eval;
    Scalar1 f1; /* for eval_map1 */
    Scalar2 f2; /* for eval_map2 */
} OpImpl;

/* ---- errors ---- */

int ii_fail(Interp *it, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->err, it->nerr, fmt, ap);
    va_end(ap);
    return -1;
}

/* "gather %tok_emb: " + message */
static int node_fail(Interp *it, const IrNode *n, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n->label)
        return ii_fail(it, "%s %%%s: %s", ir_ops[n->op].name, n->label, msg);
    return ii_fail(it, "%s (node %d): %s", ir_ops[n->op].name, n->id, msg);
}

const char *ii_leaf_kind(IrOp op)
{
    return op == IR_INPUT ? "input" : op == IR_PARAM ? "parameter" : "buffer";
}

/* ---- shapes ---- */

static int64_t numel_of(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= shape[i];
    return n;
}

/* Product of the dims, or -1 if it overflows int64. Dims are >= 0. */
int64_t ii_numel_checked(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] != 0 && n > INT64_MAX / shape[i])
            return -1;
        n *= shape[i];
    }
    return n;
}

static void strides_of(int rank, const int64_t *shape, int64_t *st)
{
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        st[i] = s;
        s *= shape[i];
    }
}

/* First symbol of d that is not bound yet, or -1. */
int ii_unbound_sym(const Interp *it, IrDim d)
{
    for (int s = 0; s < IR_MAXSYM; s++)
        if (d.k[s] && (s >= it->g->nsyms || !it->sym_from[s]))
            return s;
    return -1;
}

const char *ii_sym_name(const Interp *it, int s)
{
    return s < it->g->nsyms ? it->g->sym_name[s] : "?";
}

/* Evaluates d with the bound symbols; -1 with the error set (naming n) if a symbol is unbound or
 * the constant is absurd. The value itself may be negative; callers decide. */
int ii_dim_value(Interp *it, const IrNode *n, IrDim d, int64_t *out)
{
    int s = ii_unbound_sym(it, d);
    if (s >= 0)
        return node_fail(it, n, "symbol '%s' is not bound by any input", ii_sym_name(it, s));
    if (d.c > MAX_DIM_CONST || d.c < -MAX_DIM_CONST)
        return node_fail(it, n, "dimension constant %lld too large", (long long)d.c);
    *out = ir_dim_eval(d, it->sym);
    return 0;
}

/* Allocates v for the node's own (evaluated) shape. */
static int alloc_val(Interp *it, const IrNode *n, Val *v)
{
    v->rank = n->rank;
    for (int i = 0; i < n->rank; i++) {
        if (ii_dim_value(it, n, n->shape[i], &v->shape[i]) < 0)
            return -1;
        if (v->shape[i] < 0) {
            char buf[64];
            ir_dim_str(it->g, n->shape[i], buf, sizeof buf);
            return node_fail(it, n, "dimension %d (%s) evaluates to %lld", i, buf,
                             (long long)v->shape[i]);
        }
    }
    v->numel = ii_numel_checked(v->rank, v->shape);
    if (v->numel < 0 || (uint64_t)v->numel > SIZE_MAX / sizeof(double))
        return node_fail(it, n, "tensor too large");
    size_t bytes = (size_t)(v->numel ? v->numel : 1) * sizeof(double);
    v->data = malloc(bytes);
    if (!v->data)
        return node_fail(it, n, "out of memory allocating %zu bytes", bytes);
    return 0;
}

static void free_val(Val *v)
{
    free(v->data);
    v->data = NULL;
}

/* ---- broadcasting iteration ---- */

/* Walks an output shape in row-major order, keeping the element offsets of up to three operands
 * (stride 0 on a broadcast dimension). */
typedef struct {
    int rank, nops;
    int64_t shape[IR_MAXRANK];
    int64_t idx[IR_MAXRANK];
    int64_t stride[IR_MAXIN][IR_MAXRANK];
    int64_t off[IR_MAXIN];
} Iter;

static void iter_init(Iter *t, int rank, const int64_t *shape, int nops)
{
    memset(t, 0, sizeof *t);
    t->rank = rank;
    t->nops = nops;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
}

static void iter_next(Iter *t)
{
    for (int d = t->rank - 1; d >= 0; d--) {
        t->idx[d]++;
        for (int k = 0; k < t->nops; k++)
            t->off[k] += t->stride[k][d];
        if (t->idx[d] < t->shape[d])
            return;
        for (int k = 0; k < t->nops; k++)
            t->off[k] -= t->stride[k][d] * t->shape[d];
        t->idx[d] = 0;
    }
}

/* Strides of x seen in an output of shape out[rank] under numpy rules (x right-aligned, a
 * dimension of 1 repeats). */
static int bcast_strides(Interp *it, const IrNode *n, const Val *x, int rank, const int64_t *out,
                         int64_t *st)
{
    int64_t xst[IR_MAXRANK];
    strides_of(x->rank, x->shape, xst);
    if (x->rank > rank)
        return node_fail(it, n, "operand of rank %d does not broadcast to rank %d", x->rank, rank);
    for (int d = 0; d < rank; d++) {
        int k = d - (rank - x->rank);
        if (k < 0 || x->shape[k] == 1)
            st[d] = 0;
        else if (x->shape[k] == out[d])
            st[d] = xst[k];
        else
            return node_fail(it, n, "dimension %d: %lld does not broadcast to %lld", d,
                             (long long)x->shape[k], (long long)out[d]);
    }
    return 0;
}

/* ---- leaves ---- */

static int eval_bound(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    (void)in;
    const IrHostTensor *t = &it->host[n->id];
    for (int64_t i = 0; i < out->numel; i++) {
        double v;
        switch (t->dtype) {
        case IR_F32: v = it->f64 ? ((const double *)t->data)[i] : ((const float *)t->data)[i]; break;
        case IR_I32: v = ((const int32_t *)t->data)[i]; break;
        case IR_I64: {
            int64_t x = ((const int64_t *)t->data)[i];
            if (x > (int64_t)EXACT_INT_MAX || x < -(int64_t)EXACT_INT_MAX)
                return ii_fail(it, "%s '%s': value %lld beyond 2^53 cannot be held exactly",
                            ii_leaf_kind(n->op), n->s, (long long)x);
            v = (double)x;
            break;
        }
        case IR_I8: v = ((const int8_t *)t->data)[i]; break;
        default: v = ((const uint8_t *)t->data)[i] != 0; break;
        }
        out->data[i] = v;
    }
    return 0;
}

/* The value of a number as dtype t holds it: ints truncate toward zero, bool is x != 0. */
static double as_dtype(IrDType t, double x)
{
    if (t == IR_BOOL)
        return x != 0;
    if (ir_dtype_is_int(t))
        return trunc(x);
    return x;
}

static int eval_const(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    (void)it, (void)in;
    double v = as_dtype(n->dtype, n->f);
    for (int64_t i = 0; i < out->numel; i++)
        out->data[i] = v;
    return 0;
}

static int eval_arange(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    (void)in;
    int64_t start;
    if (ii_dim_value(it, n, n->d, &start) < 0)
        return -1;
    for (int64_t i = 0; i < out->numel; i++)
        out->data[i] = (double)(start + i);
    return 0;
}

/* T5 bucket of the key position j relative to the query position i (XT-SEMANTICS.md 7.3), in
 * the float32 arithmetic of x-transformers 0.23.0 under torch:
 *   max_exact + (log(n.float() / max_exact) / math.log(max_distance / max_exact)
 *                * (num_buckets - max_exact)).long()
 * The numerator's log is float32 (logf); the denominator is a Python double rounded to float32
 * when it meets the tensor; .long() truncates toward zero. (logf of the float ratio gives the same
 * buckets for |n| <= 20000 in every setting tried, but this is the form torch evaluates.) */
static int relpos_bucket(Interp *it, const IrNode *n, int64_t i, int64_t j, int64_t *bucket)
{
    int64_t nb = n->ia[IR_IA_BUCKETS], max_distance = n->ia[IR_IA_MAX_DISTANCE];
    int causal = n->ia[IR_IA_REL_CAUSAL] != 0;
    int64_t ret = 0, d = i - j;
    if (causal) {
        if (d < 0)
            d = 0;
    } else {
        nb /= 2;
        if (d < 0) {
            ret = nb; /* keys after the query */
            d = -d;
        }
    }
    int64_t max_exact = nb / 2;
    if (d < max_exact) {
        *bucket = ret + d;
        return 0;
    }
    float den = (float)log((double)max_distance / (double)max_exact);
    float r = logf((float)d / (float)max_exact) / den * (float)(nb - max_exact);
    if (isnan(r))
        return node_fail(it, n, "bucket of distance %lld is undefined (buckets %lld, max_distance %lld)",
                         (long long)d, (long long)n->ia[IR_IA_BUCKETS], (long long)max_distance);
    if (r > 1e18f) /* +inf included: the min below clamps it anyway */
        r = 1e18f;
    if (r < -1e18f)
        r = -1e18f;
    int64_t large = max_exact + (int64_t)r;
    *bucket = ret + (large < nb - 1 ? large : nb - 1);
    return 0;
}

static int eval_relpos(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    (void)in;
    int64_t ni = out->shape[0], nj = out->shape[1];
    for (int64_t i = 0; i < ni; i++)
        for (int64_t j = 0; j < nj; j++) {
            int64_t b = 0;
            if (relpos_bucket(it, n, i, j, &b) < 0)
                return -1;
            out->data[i * nj + j] = (double)b;
        }
    return 0;
}

/* ---- elementwise ---- */

static double f_neg(double x) { return -x; }
static double f_exp(double x) { return exp(x); }
static double f_log(double x) { return log(x); }
static double f_sqrt(double x) { return sqrt(x); }
static double f_rsqrt(double x) { return 1.0 / sqrt(x); }
static double f_recip(double x) { return 1.0 / x; }
static double f_tanh(double x) { return tanh(x); }
static double f_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double f_gelu(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)); }
static double f_erf(double x) { return erf(x); }
static double f_relu(double x) { return x > 0 ? x : 0.0 * x; } /* keeps NaN; relu(-0) = 0 */
static double f_sin(double x) { return sin(x); }
static double f_cos(double x) { return cos(x); }
static double f_abs(double x) { return fabs(x); }
static double f_not(double x) { return x == 0; }

static double f_add(double a, double b) { return a + b; }
static double f_sub(double a, double b) { return a - b; }
static double f_mul(double a, double b) { return a * b; }
static double f_div(double a, double b) { return a / b; }
static double f_idiv(double a, double b) { return (double)((int64_t)a / (int64_t)b); }
/* max and min propagate NaN, like torch.maximum / torch.minimum */
static double f_max(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }
static double f_min(double a, double b) { return isnan(a) || isnan(b) ? NAN : a < b ? a : b; }
static double f_lt(double a, double b) { return a < b; }
static double f_le(double a, double b) { return a <= b; }
static double f_eq(double a, double b) { return a == b; }
static double f_and(double a, double b) { return a != 0 && b != 0; }
static double f_or(double a, double b) { return a != 0 || b != 0; }

static const OpImpl *impl_of(IrOp op); /* the table is below, after every eval function */

static int eval_map1(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    (void)it;
    Scalar1 f = impl_of(n->op)->f1;
    for (int64_t i = 0; i < out->numel; i++)
        out->data[i] = f(in[0]->data[i]);
    return 0;
}

static int map2(Interp *it, const IrNode *n, Val *out, const Val *const *in, Scalar2 f)
{
    Iter t;
    iter_init(&t, out->rank, out->shape, 2);
    if (bcast_strides(it, n, in[0], out->rank, out->shape, t.stride[0]) < 0 ||
        bcast_strides(it, n, in[1], out->rank, out->shape, t.stride[1]) < 0)
        return -1;
    const double *a = in[0]->data, *b = in[1]->data;
    for (int64_t i = 0; i < out->numel; i++, iter_next(&t))
        out->data[i] = f(a[t.off[0]], b[t.off[1]]);
    return 0;
}

static int eval_map2(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    return map2(it, n, out, in, impl_of(n->op)->f2);
}

/* f32: a / b. Integers: truncation toward zero (C semantics); a zero divisor is an error. */
static int eval_div(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    if (!ir_dtype_is_int(n->dtype))
        return map2(it, n, out, in, f_div);
    for (int64_t i = 0; i < in[1]->numel; i++)
        if (in[1]->data[i] == 0)
            return node_fail(it, n, "integer division by zero");
    return map2(it, n, out, in, f_idiv);
}

static int eval_where(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    Iter t;
    iter_init(&t, out->rank, out->shape, 3);
    for (int k = 0; k < 3; k++)
        if (bcast_strides(it, n, in[k], out->rank, out->shape, t.stride[k]) < 0)
            return -1;
    for (int64_t i = 0; i < out->numel; i++, iter_next(&t))
        out->data[i] = in[0]->data[t.off[0]] != 0 ? in[1]->data[t.off[1]] : in[2]->data[t.off[2]];
    return 0;
}

/* float -> int truncates toward zero; bool -> number is 0/1; number -> bool is x != 0. */
static int eval_cast(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    (void)it;
    for (int64_t i = 0; i < out->numel; i++)
        out->data[i] = as_dtype(n->dtype, in[0]->data[i]);
    return 0;
}

/* ---- reductions ---- */

/* Splits x's shape around axis: outer * len * inner. */
static void split_axis(const Val *x, int axis, int64_t *outer, int64_t *len, int64_t *inner)
{
    *outer = numel_of(axis, x->shape);
    *len = x->shape[axis];
    *inner = numel_of(x->rank - axis - 1, x->shape + axis + 1);
}

static int eval_sum(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    (void)it;
    int64_t outer, len, inner;
    split_axis(in[0], (int)n->ia[IR_IA_AXIS], &outer, &len, &inner);
    memset(out->data, 0, sizeof(double) * (size_t)out->numel);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t k = 0; k < len; k++) {
            const double *x = in[0]->data + (o * len + k) * inner;
            double *y = out->data + o * inner;
            for (int64_t j = 0; j < inner; j++)
                y[j] += x[j];
        }
    return 0;
}

static int eval_rmax(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    int64_t outer, len, inner;
    split_axis(in[0], (int)n->ia[IR_IA_AXIS], &outer, &len, &inner);
    if (len == 0 && out->numel > 0)
        return node_fail(it, n, "maximum over an empty axis");
    for (int64_t o = 0; o < outer; o++) {
        double *y = out->data + o * inner;
        memcpy(y, in[0]->data + o * len * inner, sizeof(double) * (size_t)inner);
        for (int64_t k = 1; k < len; k++) {
            const double *x = in[0]->data + (o * len + k) * inner;
            for (int64_t j = 0; j < inner; j++)
                y[j] = f_max(y[j], x[j]);
        }
    }
    return 0;
}

/* exp(x - max) / sum over the last axis */
static int eval_softmax(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    (void)it, (void)n;
    int64_t len = out->shape[out->rank - 1];
    int64_t rows = len ? out->numel / len : 0;
    for (int64_t r = 0; r < rows; r++) {
        const double *x = in[0]->data + r * len;
        double *y = out->data + r * len;
        double m = x[0];
        for (int64_t j = 1; j < len; j++)
            m = f_max(m, x[j]);
        double s = 0;
        for (int64_t j = 0; j < len; j++) {
            y[j] = exp(x[j] - m);
            s += y[j];
        }
        for (int64_t j = 0; j < len; j++)
            y[j] /= s;
    }
    return 0;
}

/* descending, NaN first: torch.sort and torch.topk order NaN as the largest value */
static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    if (isnan(x) || isnan(y))
        return isnan(y) - isnan(x);
    return x > y ? -1 : x < y;
}

/* 1.5-entmax over the last axis by the exact sort-based algorithm of entmax 1.3
 * (XT-SEMANTICS.md 10): X = (x - max) / 2 sorted descending; over its prefixes rho = 1..J,
 * tau = mean - sqrt(max((1 - rho (mean_sq - mean^2)) / rho, 0)); the support k is the number of
 * prefixes with tau <= X_rho; y = max(X - tau_k, 0)^2. Masked logits (-FLT_MAX, or below) take no
 * part and get 0: in float32 torch their squares overflow and drop them from the support. A row
 * whose every entry is masked takes them all (equal, so uniform). */
static int eval_entmax15(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    int64_t len = out->shape[out->rank - 1];
    int64_t rows = len ? out->numel / len : 0;
    double *xs = malloc(sizeof(double) * (size_t)(2 * len + 1)), *tau = xs + len;
    if (!xs)
        return node_fail(it, n, "out of memory");
    for (int64_t r = 0; r < rows; r++) {
        const double *x = in[0]->data + r * len;
        double *y = out->data + r * len;
        int64_t na = 0;
        for (int64_t j = 0; j < len; j++)
            na += x[j] > -FLT_MAX;
        int all = na == 0;
        double m = -INFINITY;
        for (int64_t j = 0; j < len; j++)
            if (all || x[j] > -FLT_MAX)
                m = f_max(m, x[j]);
        na = 0;
        for (int64_t j = 0; j < len; j++)
            if (all || x[j] > -FLT_MAX)
                xs[na++] = (x[j] - m) / 2;
        qsort(xs, (size_t)na, sizeof *xs, cmp_desc);
        double sum = 0, sum_sq = 0;
        int64_t support = 0;
        for (int64_t k = 0; k < na; k++) {
            double rho = (double)(k + 1);
            sum += xs[k];
            sum_sq += xs[k] * xs[k];
            double mean = sum / rho, mean_sq = sum_sq / rho;
            double delta = (1 - rho * (mean_sq - mean * mean)) / rho;
            tau[k] = mean - sqrt(delta > 0 ? delta : 0);
            support += tau[k] <= xs[k];
        }
        double t = support > 0 ? tau[support - 1] : 0;
        for (int64_t j = 0; j < len; j++) {
            double d = (x[j] - m) / 2 - t;
            y[j] = (all || x[j] > -FLT_MAX) && d > 0 ? d * d : 0;
        }
    }
    free(xs);
    return 0;
}

/* each row's k-th largest value, ties counted (torch.topk(x, k).values[..., -1]); -inf when the
 * row is shorter than k, so that no entry lies below it */
static int eval_kth_largest(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    const Val *x = in[0];
    int64_t len = x->shape[x->rank - 1], k = n->ia[IR_IA_K];
    double *tmp = malloc(sizeof(double) * (size_t)(len ? len : 1));
    if (!tmp)
        return node_fail(it, n, "out of memory");
    for (int64_t r = 0; r < out->numel; r++) {
        if (k > len) {
            out->data[r] = -INFINITY;
            continue;
        }
        memcpy(tmp, x->data + r * len, sizeof(double) * (size_t)len);
        qsort(tmp, (size_t)len, sizeof *tmp, cmp_desc);
        out->data[r] = tmp[k - 1];
    }
    free(tmp);
    return 0;
}

/* ---- data movement ---- */

static int eval_reshape(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    if (in[0]->numel != out->numel)
        return node_fail(it, n, "%lld elements cannot be reshaped to %lld", (long long)in[0]->numel,
                         (long long)out->numel);
    memcpy(out->data, in[0]->data, sizeof(double) * (size_t)out->numel);
    return 0;
}

static int eval_permute(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    (void)it;
    int64_t xst[IR_MAXRANK];
    strides_of(in[0]->rank, in[0]->shape, xst);
    Iter t;
    iter_init(&t, out->rank, out->shape, 1);
    for (int d = 0; d < out->rank; d++)
        t.stride[0][d] = xst[n->perm[d]];
    for (int64_t i = 0; i < out->numel; i++, iter_next(&t))
        out->data[i] = in[0]->data[t.off[0]];
    return 0;
}

static int eval_slice(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    int axis = (int)n->ia[IR_IA_AXIS];
    int64_t start, outer, len, inner, xlen = in[0]->shape[axis];
    if (ii_dim_value(it, n, n->d, &start) < 0)
        return -1;
    split_axis(out, axis, &outer, &len, &inner);
    if (start < 0 || start > xlen || len > xlen - start)
        return node_fail(it, n, "[%lld, %lld) is out of bounds of dimension %d of size %lld",
                         (long long)start, (long long)(start + len), axis, (long long)xlen);
    for (int64_t o = 0; o < outer; o++)
        memcpy(out->data + o * len * inner, in[0]->data + (o * xlen + start) * inner,
               sizeof(double) * (size_t)(len * inner));
    return 0;
}

static int eval_concat(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    int axis = (int)n->ia[IR_IA_AXIS];
    int64_t outer, len, inner, la = in[0]->shape[axis], lb = in[1]->shape[axis];
    split_axis(out, axis, &outer, &len, &inner);
    if (la + lb != len)
        return node_fail(it, n, "operand lengths %lld + %lld differ from %lld", (long long)la,
                         (long long)lb, (long long)len);
    for (int64_t o = 0; o < outer; o++) {
        double *y = out->data + o * len * inner;
        memcpy(y, in[0]->data + o * la * inner, sizeof(double) * (size_t)(la * inner));
        memcpy(y + la * inner, in[1]->data + o * lb * inner, sizeof(double) * (size_t)(lb * inner));
    }
    return 0;
}

static int eval_expand(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    Iter t;
    iter_init(&t, out->rank, out->shape, 1);
    if (bcast_strides(it, n, in[0], out->rank, out->shape, t.stride[0]) < 0)
        return -1;
    for (int64_t i = 0; i < out->numel; i++, iter_next(&t))
        out->data[i] = in[0]->data[t.off[0]];
    return 0;
}

/* table[V, D] rows by integer index: out[..., :] = table[idx[...], :] */
static int eval_gather(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    const Val *table = in[0], *idx = in[1];
    int64_t v = table->shape[0], d = table->shape[1];
    for (int64_t i = 0; i < idx->numel; i++) {
        double x = idx->data[i];
        if (!(x >= 0 && x < (double)v))
            return node_fail(it, n, "index %lld out of range [0, %lld)", (long long)x, (long long)v);
        memcpy(out->data + i * d, table->data + (int64_t)x * d, sizeof(double) * (size_t)d);
    }
    return 0;
}

/* gather's transpose: out[rows, D] = 0, then out[idx[...], :] += src[..., :] */
static int eval_gather_grad(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    const Val *src = in[0], *idx = in[1];
    int64_t rows = out->shape[0], d = out->shape[1];
    memset(out->data, 0, sizeof(double) * (size_t)out->numel);
    for (int64_t i = 0; i < idx->numel; i++) {
        double x = idx->data[i];
        if (!(x >= 0 && x < (double)rows))
            return node_fail(it, n, "index %lld out of range [0, %lld)", (long long)x, (long long)rows);
        double *y = out->data + (int64_t)x * d;
        const double *s = src->data + i * d;
        for (int64_t j = 0; j < d; j++)
            y[j] += s[j];
    }
    return 0;
}

/* ---- contractions ---- */

/* a[..., m, k] x b[..., k, n] -> [..., m, n]; with transpose_b, b is [..., n, k]. The batch
 * dimensions broadcast. Loop orders keep the innermost loop contiguous. */
static int eval_matmul(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    const Val *a = in[0], *b = in[1];
    int tb = n->ia[IR_IA_TRANSPOSE_B] != 0, r = out->rank;
    int64_t m = out->shape[r - 2], nn = out->shape[r - 1], k = a->shape[a->rank - 1];
    int64_t bk = b->shape[b->rank - (tb ? 1 : 2)], bn = b->shape[b->rank - (tb ? 2 : 1)];
    if (a->shape[a->rank - 2] != m || bk != k || bn != nn)
        return node_fail(it, n, "operand shapes do not match at run time");

    /* walk the batch dims with strides counted in matrices */
    Val abatch = {a->rank - 2, {0}, 0, NULL}, bbatch = {b->rank - 2, {0}, 0, NULL};
    memcpy(abatch.shape, a->shape, sizeof(int64_t) * (size_t)abatch.rank);
    memcpy(bbatch.shape, b->shape, sizeof(int64_t) * (size_t)bbatch.rank);
    Iter t;
    iter_init(&t, r - 2, out->shape, 2);
    if (bcast_strides(it, n, &abatch, r - 2, out->shape, t.stride[0]) < 0 ||
        bcast_strides(it, n, &bbatch, r - 2, out->shape, t.stride[1]) < 0)
        return -1;
    int64_t nbatch = numel_of(r - 2, out->shape);
    for (int64_t bi = 0; bi < nbatch; bi++, iter_next(&t)) {
        const double *A = a->data + t.off[0] * m * k;  /* (m, k) */
        const double *B = b->data + t.off[1] * k * nn; /* (k, n), or (n, k) with tb */
        double *C = out->data + bi * m * nn;           /* (m, n) */
        for (int64_t i = 0; i < m; i++) {
            const double *ai = A + i * k;
            double *ci = C + i * nn;
            if (tb) {
                for (int64_t j = 0; j < nn; j++) {
                    const double *bj = B + j * k;
                    double s = 0;
                    for (int64_t p = 0; p < k; p++)
                        s += ai[p] * bj[p];
                    ci[j] = s;
                }
            } else {
                for (int64_t j = 0; j < nn; j++)
                    ci[j] = 0;
                for (int64_t p = 0; p < k; p++) {
                    double aip = ai[p];
                    const double *bp = B + p * nn;
                    for (int64_t j = 0; j < nn; j++)
                        ci[j] += aip * bp[j];
                }
            }
        }
    }
    return 0;
}

/* a[.., m, k] x w'[n, k]^T with w'[j, p] = w[j, p] * scale[j, p / group]: each weight
 * dequantized exactly (an int8 times an f32 is exact in double), then the matmul above */
static int eval_matmul_q8(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    const Val *a = in[0], *w = in[1], *sc = in[2];
    int64_t nn = w->shape[0], k = w->shape[1], ng = sc->shape[1], group = n->ia[IR_IA_GROUP];
    if (a->shape[a->rank - 1] != k || sc->shape[0] != nn || ng != (k > 0 ? (k + group - 1) / group : 1))
        return node_fail(it, n, "operand shapes do not match at run time");
    double *deq = malloc((size_t)(nn * k > 0 ? nn * k : 1) * sizeof *deq);
    if (!deq)
        return node_fail(it, n, "out of memory");
    for (int64_t j = 0; j < nn; j++)
        for (int64_t p = 0; p < k; p++)
            deq[j * k + p] = w->data[j * k + p] * sc->data[j * ng + p / group];
    Val wd = {2, {nn, k}, nn * k, deq};
    const Val *args[2] = {a, &wd};
    int rc = eval_matmul(it, n, out, args);
    free(deq);
    return rc;
}

/* ---- random numbers ---- */

/* Element i of rand_like(seed, x, stream): splitmix64 (Steele et al.) started at a state made of
 * the seed and the stream, its i+1-th output's top 24 bits as a float in [0, 1). Every backend
 * computes exactly these bits (codegen/llvm/cg_llvm_ops.c, the CUDA lowering). */
static double rand_at(int64_t seed, int64_t stream, int64_t i)
{
    uint64_t z = (uint64_t)seed * 0xd1b54a32d192ed03ull + (uint64_t)stream * 0xabc98388fb8fac03ull +
                 ((uint64_t)i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 40) * 0x1p-24;
}

static int eval_rand(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    (void)it;
    int64_t seed = (int64_t)in[0]->data[0];
    for (int64_t i = 0; i < out->numel; i++)
        out->data[i] = rand_at(seed, n->ia[IR_IA_STREAM], i);
    return 0;
}

/* ---- losses ---- */

/* mean over positions with target >= 0 of logsumexp(z) - z[target]; 0 when none counts */
static int eval_xent(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    const Val *z = in[0], *tg = in[1];
    int64_t v = z->shape[z->rank - 1];
    double total = 0;
    int64_t count = 0;
    for (int64_t p = 0; p < tg->numel; p++) {
        double t = tg->data[p];
        if (t < 0)
            continue;
        if (t >= (double)v)
            return node_fail(it, n, "target %lld out of range [0, %lld)", (long long)t, (long long)v);
        const double *row = z->data + p * v;
        double m = row[0], s = 0;
        for (int64_t j = 1; j < v; j++)
            m = f_max(m, row[j]);
        for (int64_t j = 0; j < v; j++)
            s += exp(row[j] - m);
        total += m + log(s) - row[(int64_t)t];
        count++;
    }
    out->data[0] = count ? total / (double)count : 0.0;
    return 0;
}

/* ---- fused ops: their semantics are in interp_fused.c ---- */

static int eval_fused(Interp *it, const IrNode *n, Val *out, const Val *const *in)
{
    IrFusedArg args[IR_MAXIN];
    for (int k = 0; k < n->nin; k++)
        args[k] = (IrFusedArg){in[k]->rank, in[k]->shape, in[k]->data};
    char msg[256] = "";
    int rc = n->op == IR_ATTENTION        ? ir_fused_attention(n, args, out->shape, out->data, msg, sizeof msg)
             : n->op == IR_ATTENTION_GRAD ? ir_fused_attention_grad(n, args, out->shape, out->data, msg, sizeof msg)
                                          : ir_fused_program(n, args, out->shape, out->data, msg, sizeof msg);
    return rc < 0 ? node_fail(it, n, "%s", msg) : 0;
}

/* ---- the op table: one row per op of ops.def, with its semantics ---- */

static const OpImpl op_impl[] = {
    /* leaves */
    [IR_INPUT]   = {eval_bound, 0, 0},    /* caller's tensor (bind callback), widened to double */
    [IR_PARAM]   = {eval_bound, 0, 0},    /* same, f32 */
    [IR_BUFFER]  = {eval_bound, 0, 0},    /* same, f32 */
    [IR_CONST]   = {eval_const, 0, 0},    /* every element = f (truncated for ints, f != 0 for bool) */
    [IR_ARANGE]  = {eval_arange, 0, 0},   /* [i] = eval(d) + i */
    [IR_RELPOS]  = {eval_relpos, 0, 0},   /* [i, j] = T5 bucket of n = i - j, fp32 log, trunc */

    /* elementwise unary, f32 */
    [IR_NEG]     = {eval_map1, f_neg, 0},     /* -x */
    [IR_EXP]     = {eval_map1, f_exp, 0},     /* e^x */
    [IR_LOG]     = {eval_map1, f_log, 0},     /* natural log; NaN below 0, -inf at 0 */
    [IR_SQRT]    = {eval_map1, f_sqrt, 0},    /* sqrt x */
    [IR_RSQRT]   = {eval_map1, f_rsqrt, 0},   /* 1 / sqrt x */
    [IR_RECIP]   = {eval_map1, f_recip, 0},   /* 1 / x */
    [IR_TANH]    = {eval_map1, f_tanh, 0},    /* tanh x */
    [IR_SIGMOID] = {eval_map1, f_sigmoid, 0}, /* 1 / (1 + e^-x) */
    [IR_GELU]    = {eval_map1, f_gelu, 0},    /* exact: 0.5 x (1 + erf(x / sqrt 2)) */
    [IR_ERF]     = {eval_map1, f_erf, 0},     /* erf x */
    [IR_RELU]    = {eval_map1, f_relu, 0},    /* max(x, 0) */
    [IR_SIN]     = {eval_map1, f_sin, 0},     /* sin x */
    [IR_COS]     = {eval_map1, f_cos, 0},     /* cos x */
    [IR_ABS]     = {eval_map1, f_abs, 0},     /* |x| */
    [IR_NOT]     = {eval_map1, f_not, 0},     /* bool: x == 0 */
    [IR_CAST]    = {eval_cast, 0, 0},         /* f->int truncates; ->bool is x != 0; bool->number 0/1 */

    /* elementwise binary, numpy broadcasting (right-aligned, 1 repeats) */
    [IR_ADD]     = {eval_map2, 0, f_add},     /* a + b */
    [IR_SUB]     = {eval_map2, 0, f_sub},     /* a - b */
    [IR_MUL]     = {eval_map2, 0, f_mul},     /* a * b */
    [IR_DIV]     = {eval_div, 0, 0},          /* a / b; ints truncate toward zero, b = 0 is an error */
    [IR_MAX]     = {eval_map2, 0, f_max},     /* max(a, b), NaN propagates */
    [IR_MIN]     = {eval_map2, 0, f_min},     /* min(a, b), NaN propagates */
    [IR_LT]      = {eval_map2, 0, f_lt},      /* bool a < b */
    [IR_LE]      = {eval_map2, 0, f_le},      /* bool a <= b */
    [IR_EQ]      = {eval_map2, 0, f_eq},      /* bool a == b */
    [IR_AND]     = {eval_map2, 0, f_and},     /* bool a && b */
    [IR_OR]      = {eval_map2, 0, f_or},      /* bool a || b */
    [IR_WHERE]   = {eval_where, 0, 0},        /* cond ? a : b, three-way broadcast */

    /* reductions over the axis attribute, the axis kept with size 1 */
    [IR_SUM]     = {eval_sum, 0, 0},          /* sum; 0 over an empty axis */
    [IR_RMAX]    = {eval_rmax, 0, 0},         /* max, NaN propagates; empty axis is an error */
    [IR_SOFTMAX] = {eval_softmax, 0, 0},      /* last axis: e^(x - max) / sum */
    [IR_ENTMAX15] = {eval_entmax15, 0, 0},    /* last axis: sort-based 1.5-entmax; -FLT_MAX entries 0 */
    [IR_KTH_LARGEST] = {eval_kth_largest, 0, 0}, /* last axis kept as 1: k-th largest, -inf if k > len */

    /* data movement */
    [IR_RESHAPE] = {eval_reshape, 0, 0},      /* row-major reinterpretation */
    [IR_PERMUTE] = {eval_permute, 0, 0},      /* out.shape[i] = in.shape[perm[i]] */
    [IR_SLICE]   = {eval_slice, 0, 0},        /* axis, [eval(d), eval(d) + len) */
    [IR_CONCAT]  = {eval_concat, 0, 0},       /* a then b along axis */
    [IR_EXPAND]  = {eval_expand, 0, 0},       /* broadcast to the node's shape */
    [IR_GATHER]  = {eval_gather, 0, 0},       /* table[V, D] rows; index outside [0, V) is an error */
    [IR_GATHER_GRAD] = {eval_gather_grad, 0, 0}, /* zeros[rows, D], then row idx[i] += src[i]; index
                                                    outside [0, rows) is an error */

    /* contractions */
    [IR_MATMUL]  = {eval_matmul, 0, 0},       /* batched, broadcast batch dims; transpose_b: b is [.., n, k] */
    [IR_MATMUL_Q8] = {eval_matmul_q8, 0, 0},  /* the weight dequantized exactly, then matmul */

    /* losses */
    [IR_XENT]    = {eval_xent, 0, 0},         /* mean over targets >= 0 of lse(z) - z[t]; target >= V
                                                 is an error; 0 if none counts */

    /* random numbers */
    [IR_RAND]    = {eval_rand, 0, 0},         /* [i] = rand_at(seed, stream, i), x only gives the shape */

    /* fused ops (interp_fused.c): what the subgraphs they replace compute */
    [IR_ATTENTION]      = {eval_fused, 0, 0},  /* softmax(scale q k^T + bias, masked) v (+ logsumexp) */
    [IR_ATTENTION_GRAD] = {eval_fused, 0, 0},  /* dq, dk, dv of attention, stacked */
    [IR_FUSED]          = {eval_fused, 0, 0},  /* its program's graph, run by this interpreter */
};
_Static_assert(sizeof op_impl / sizeof op_impl[0] == IR_NUM_OPS,
               "ir/interp.c: op_impl needs a row for every op of ops.def");

static const OpImpl *impl_of(IrOp op) { return &op_impl[op]; }

int ir_interp_has_op(IrOp op) { return (unsigned)op < IR_NUM_OPS && op_impl[op].eval != NULL; }

/* ---- the driver ---- */

/* Integer results must be exact: i32 within its range, i64 within +-2^53. */
static int check_int(Interp *it, const IrNode *n, const Val *v)
{
    if (!ir_dtype_is_int(n->dtype))
        return 0;
    double lo = n->dtype == IR_I32 ? -2147483648.0 : -EXACT_INT_MAX;
    double hi = n->dtype == IR_I32 ? 2147483647.0 : EXACT_INT_MAX;
    for (int64_t i = 0; i < v->numel; i++)
        if (!(v->data[i] >= lo && v->data[i] <= hi))
            return node_fail(it, n, "value %g out of the exact %s range", v->data[i],
                             ir_dtype_name(n->dtype));
    return 0;
}

static int to_host(Interp *it, const IrOutput *o, const Val *v, IrHostTensor *h)
{
    IrDType t = o->node->dtype;
    int wide = it->f64 && t == IR_F32; /* ir_interp_f64: double data */
    size_t es = wide ? sizeof(double) : ir_dtype_size(t);
    if ((uint64_t)v->numel > SIZE_MAX / es)
        return ii_fail(it, "output '%s': tensor too large", o->name);
    size_t bytes = (size_t)(v->numel ? v->numel : 1) * es;
    void *data = malloc(bytes);
    if (!data)
        return ii_fail(it, "output '%s': out of memory allocating %zu bytes", o->name, bytes);
    for (int64_t i = 0; i < v->numel; i++) {
        double x = v->data[i];
        switch (t) {
        case IR_F32:
            if (wide)
                ((double *)data)[i] = x;
            else
                ((float *)data)[i] = (float)x;
            break;
        case IR_I32: ((int32_t *)data)[i] = (int32_t)x; break; /* range checked by check_int */
        case IR_I64: ((int64_t *)data)[i] = (int64_t)x; break;
        default: ((uint8_t *)data)[i] = x != 0; break;
        }
    }
    h->dtype = t;
    h->rank = v->rank;
    memset(h->shape, 0, sizeof h->shape);
    memcpy(h->shape, v->shape, sizeof(int64_t) * (size_t)v->rank);
    h->data = data;
    return 0;
}

static int run(Interp *it, IrBindFn bind, void *ctx, IrHostTensor *outs, char *needed, int *last_use)
{
    const IrGraph *g = it->g;
    char msg[400];
    if (ir_verify(g, msg, sizeof msg) < 0)
        return ii_fail(it, "graph does not verify: %s", msg);

    /* what the outputs need, and where each value is used last (outputs: never) */
    for (int o = 0; o < g->noutputs; o++)
        needed[g->outputs[o].node->id] = 1;
    for (int i = g->nnodes - 1; i >= 0; i--)
        if (needed[i])
            for (int k = 0; k < g->nodes[i]->nin; k++)
                needed[g->nodes[i]->in[k]->id] = 1;
    for (int i = 0; i < g->nnodes; i++) {
        last_use[i] = -1;
        if (needed[i])
            for (int k = 0; k < g->nodes[i]->nin; k++)
                last_use[g->nodes[i]->in[k]->id] = i;
    }
    for (int o = 0; o < g->noutputs; o++)
        last_use[g->outputs[o].node->id] = g->nnodes;

    if (ii_bind_leaves(it, bind, ctx, needed) < 0)
        return -1;

    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *n = g->nodes[i];
        if (!needed[i])
            continue;
        const OpImpl *impl = impl_of(n->op);
        if (!impl->eval)
            return node_fail(it, n, "the interpreter has no entry for op '%s'", ir_ops[n->op].name);
        const Val *in[IR_MAXIN] = {NULL};
        for (int k = 0; k < n->nin; k++)
            in[k] = &it->val[n->in[k]->id];
        if (alloc_val(it, n, &it->val[i]) < 0 || impl->eval(it, n, &it->val[i], in) < 0 ||
            check_int(it, n, &it->val[i]) < 0)
            return -1;
        if (it->round && n->dtype == IR_F32)
            it->round(it->round_ctx, n, it->val[i].data, it->val[i].numel);
        for (int k = 0; k < n->nin; k++)
            if (last_use[n->in[k]->id] == i)
                free_val(&it->val[n->in[k]->id]); /* a repeated operand is freed once */
    }

    for (int o = 0; o < g->noutputs; o++)
        if (to_host(it, &g->outputs[o], &it->val[g->outputs[o].node->id], &outs[o]) < 0)
            return -1;
    return 0;
}

static int interp(const IrGraph *g, IrBindFn bind, void *ctx, IrHostTensor *outs, char *err, size_t n,
                  int f64, IrRoundFn round, void *round_ctx)
{
    char sink[8]; /* for a caller that wants no message */
    Interp it;
    memset(&it, 0, sizeof it);
    it.g = g;
    it.f64 = f64;
    it.round = round;
    it.round_ctx = round_ctx;
    it.err = err && n ? err : sink;
    it.nerr = err && n ? n : sizeof sink;
    it.err[0] = 0;
    if (!bind || (!outs && g->noutputs > 0))
        return ii_fail(&it, "ir_interp needs a bind callback and room for %d outputs", g->noutputs);
    for (int o = 0; o < g->noutputs; o++)
        memset(&outs[o], 0, sizeof outs[o]);

    size_t nn = g->nnodes > 0 ? (size_t)g->nnodes : 1;
    it.host = calloc(nn, sizeof *it.host);
    it.have_host = calloc(nn, 1);
    it.val = calloc(nn, sizeof *it.val);
    char *needed = calloc(nn, 1);
    int *last_use = calloc(nn, sizeof *last_use);
    int rc;
    if (!it.host || !it.have_host || !it.val || !needed || !last_use)
        rc = ii_fail(&it, "out of memory");
    else
        rc = run(&it, bind, ctx, outs, needed, last_use);

    if (it.val)
        for (int i = 0; i < g->nnodes; i++)
            free_val(&it.val[i]);
    if (rc < 0)
        for (int o = 0; o < g->noutputs; o++)
            ir_host_free(&outs[o]);
    free(it.host);
    free(it.have_host);
    free(it.val);
    free(needed);
    free(last_use);
    return rc;
}

int ir_interp(const IrGraph *g, IrBindFn bind, void *ctx, IrHostTensor *outs, char *err, size_t n)
{
    return interp(g, bind, ctx, outs, err, n, 0, NULL, NULL);
}

int ir_interp_rounded(const IrGraph *g, IrBindFn bind, void *ctx, IrRoundFn round, void *round_ctx,
                      IrHostTensor *outs, char *err, size_t n)
{
    return interp(g, bind, ctx, outs, err, n, 0, round, round_ctx);
}

int ir_interp_f64(const IrGraph *g, IrBindFn bind, void *ctx, IrHostTensor *outs, char *err, size_t n)
{
    return interp(g, bind, ctx, outs, err, n, 1, NULL, NULL);
}

void ir_host_free(IrHostTensor *t)
{
    if (!t)
        return;
    free(t->data);
    t->data = NULL;
}

int64_t ir_host_numel(const IrHostTensor *t) { return numel_of(t->rank, t->shape); }
