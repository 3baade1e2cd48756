/* test_autodiff.c: reverse-mode autodiff (ir/autodiff.c).
 *
 *   1. Every gradient rule against central differences in double precision. Each case builds
 *      y = op(...) on small operands (broadcasting, transposed and batched matmul, symbolic dims
 *      b = 2 and n = 3), takes f = sum(y * R) with a random input R, differentiates it with
 *      ir_autodiff and runs the result with ir_interp_f64; the reference is
 *      (f(x + h) - f(x - h)) / 2h per element with h = 1e-6 max(1, |x|), and the two must agree
 *      within 1e-6 max(1, |fd|). A loop over the rule table asserts that every op with a rule has
 *      a case here, and that every op has either a rule or an explicit "no gradient".
 *   2. Tie rules at kinks, the seeded-outputs mode and the errors, checked exactly.
 *   3. Every differentiated graph verifies and round-trips through the text form.
 * Whole models (the parity cases' gradients through the interpreter) are test_autodiff_models'.
 *
 * Kinks: relu, abs, max, min, reduce_max and where (through its condition) are not
 * differentiable everywhere, and a central difference across a kink measures the jump, not the
 * gradient. Their operands are drawn away from the kinks: |x| >= 0.2 for relu and abs; max and
 * min operands on two grids offset by 0.1 (so |a - b| >= 0.1); distinct values 0.1 apart for
 * reduce_max; a where condition computed from such grids. With h ~ 1e-6 no draw crosses a kink.
 * What happens exactly at a kink (the tie rules) is checked in test_tie_rules.
 *
 * Adding an op with a gradient rule: add a case to `cases` (test_rules_covered fails until then).
 */
#include "ir.h"
#include "safetensors.h"
#include "xtf.h"

#include "ir_check_roundtrip.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define D(v) ir_dim(v)
#define SHAPE(...) (int)(sizeof((IrDim[]){__VA_ARGS__}) / sizeof(IrDim)), ((IrDim[]){__VA_ARGS__})

enum { SYM_B = 2, SYM_N = 3 }; /* the symbols' values in the gradient checks */
#define MAXLEAVES 16

/* ---- leaves and their values ---- */

typedef enum {
    V_SMOOTH,   /* uniform in [-1.5, 1.5] */
    V_POS,      /* uniform in [0.5, 2]: log, sqrt, rsqrt, recip, divisors */
    V_AWAY0,    /* +-[0.2, 1.5]: relu, abs */
    V_GRID_A,   /* 0.1 + 0.3k: max, min, comparisons (never within 0.1 of V_GRID_B) */
    V_GRID_B,   /* 0.2 + 0.3k */
    V_DISTINCT, /* distinct multiples of 0.1, shuffled: reduce_max */
    V_INDEX,    /* integers in [0, hi) */
    V_TARGET,   /* integers in [0, hi), about a quarter -100 (ignored) */
    V_BOOL      /* 0 or 1 */
} Values;

typedef struct {
    char name[32];
    Values kind;
    int hi;
    IrDType dtype;
    int rank;
    int64_t shape[IR_MAXRANK];
    int64_t numel;
    void *data; /* double for f32 (ir_interp_f64), int64_t for ints, uint8_t for bool */
} Leaf;

typedef struct GradCase GradCase;

typedef struct {
    IrGraph *g;
    IrDim B, N;
    const GradCase *cs;
    Leaf leaf[MAXLEAVES];
    int nleaves;
    uint64_t rng;
} Ctx;

struct GradCase {
    const char *name;
    IrOp op;                      /* the op whose rule this checks: build() returns such a node */
    IrNode *(*build)(Ctx *c);
    Values a, b;                  /* operand values for the generic builders */
};

static Leaf *find_leaf(Ctx *c, const char *name)
{
    for (int i = 0; i < c->nleaves; i++)
        if (strcmp(c->leaf[i].name, name) == 0)
            return &c->leaf[i];
    return NULL;
}

static IrNode *leaf(Ctx *c, IrOp op, const char *name, IrDType t, Values v, int hi, int rank, const IrDim *shape)
{
    if (!find_leaf(c, name)) {
        ck_assert_int_lt(c->nleaves, MAXLEAVES);
        Leaf *l = &c->leaf[c->nleaves++];
        memset(l, 0, sizeof *l);
        snprintf(l->name, sizeof l->name, "%s", name);
        l->kind = v;
        l->hi = hi;
        l->dtype = t;
    }
    return op == IR_PARAM ? ir_param(c->g, name, rank, shape) : ir_input(c->g, name, t, rank, shape);
}

static IrNode *par(Ctx *c, const char *name, Values v, int rank, const IrDim *shape)
{
    return leaf(c, IR_PARAM, name, IR_F32, v, 0, rank, shape);
}

static IrNode *inp(Ctx *c, const char *name, IrDType t, Values v, int hi, int rank, const IrDim *shape)
{
    return leaf(c, IR_INPUT, name, t, v, hi, rank, shape);
}

static uint64_t rnd(Ctx *c)
{
    c->rng ^= c->rng << 13;
    c->rng ^= c->rng >> 7;
    c->rng ^= c->rng << 17;
    return c->rng;
}

static double uniform(Ctx *c, double lo, double hi)
{
    return lo + (hi - lo) * (double)(rnd(c) >> 11) / 9007199254740992.0;
}

static int randint(Ctx *c, int lo, int hi) { return lo + (int)(rnd(c) % (uint64_t)(hi - lo + 1)); }

static void fill(Ctx *c, Leaf *l)
{
    int64_t n = l->numel;
    if (l->dtype == IR_F32) {
        double *d = l->data;
        for (int64_t i = 0; i < n; i++) {
            switch (l->kind) {
            case V_POS: d[i] = uniform(c, 0.5, 2); break;
            case V_AWAY0: d[i] = (rnd(c) & 1 ? 1 : -1) * uniform(c, 0.2, 1.5); break;
            case V_GRID_A: d[i] = 0.1 + 0.3 * randint(c, -4, 4); break;
            case V_GRID_B: d[i] = 0.2 + 0.3 * randint(c, -4, 4); break;
            case V_DISTINCT: d[i] = 0.1 * ((double)i - (double)n / 2); break;
            default: d[i] = uniform(c, -1.5, 1.5); break;
            }
        }
        if (l->kind == V_DISTINCT) /* shuffle */
            for (int64_t i = n - 1; i > 0; i--) {
                int64_t j = (int64_t)(rnd(c) % (uint64_t)(i + 1));
                double t = d[i];
                d[i] = d[j];
                d[j] = t;
            }
    } else if (l->dtype == IR_BOOL) {
        uint8_t *d = l->data;
        for (int64_t i = 0; i < n; i++)
            d[i] = rnd(c) & 1;
    } else {
        int64_t *d = l->data;
        for (int64_t i = 0; i < n; i++)
            d[i] = l->kind == V_TARGET && randint(c, 0, 3) == 0 ? -100 : randint(c, 0, l->hi - 1);
        if (l->kind == V_TARGET && n > 0)
            d[0] = l->hi - 1; /* at least one target counts */
    }
}

/* Shapes from the graph's leaves (symbols b, n at their test values), then values. */
static void make_data(Ctx *c, const IrGraph *g)
{
    int64_t sym[IR_MAXSYM] = {SYM_B, SYM_N};
    for (int i = 0; i < c->nleaves; i++) {
        Leaf *l = &c->leaf[i];
        const IrNode *n = ir_find_leaf(g, IR_PARAM, l->name);
        if (!n)
            n = ir_find_leaf(g, IR_INPUT, l->name);
        ck_assert_msg(n != NULL, "leaf %s is not in the graph", l->name);
        l->rank = n->rank;
        l->numel = 1;
        for (int d = 0; d < n->rank; d++) {
            l->shape[d] = ir_dim_eval(n->shape[d], sym);
            l->numel *= l->shape[d];
        }
        size_t es = l->dtype == IR_F32 ? sizeof(double) : l->dtype == IR_BOOL ? 1 : sizeof(int64_t);
        l->data = calloc((size_t)(l->numel ? l->numel : 1), es);
        ck_assert_ptr_nonnull(l->data);
        fill(c, l);
    }
}

static void free_data(Ctx *c)
{
    for (int i = 0; i < c->nleaves; i++)
        free(c->leaf[i].data);
    c->nleaves = 0;
}

static int bind_f64(void *ctx, const IrNode *n, IrHostTensor *out)
{
    Leaf *l = find_leaf(ctx, n->s);
    if (!l)
        return -1;
    memset(out, 0, sizeof *out);
    out->dtype = l->dtype == IR_F32 || l->dtype == IR_BOOL ? l->dtype : IR_I64;
    out->rank = l->rank;
    memcpy(out->shape, l->shape, sizeof out->shape);
    out->data = l->data;
    return 0;
}

/* ---- graphs ---- */

static IrGraph *new_graph(Ctx *c, const char *name)
{
    c->g = ir_graph_new(name);
    c->B = ir_dim_sym(ir_graph_add_sym(c->g, "b", 0));
    c->N = ir_dim_sym(ir_graph_add_sym(c->g, "n", 0));
    return c->g;
}

/* f = sum(y * R) over every element, a scalar */
static IrNode *objective(Ctx *c, IrNode *y)
{
    IrGraph *g = c->g;
    IrNode *f = ir_binary(g, IR_MUL, y, leaf(c, IR_INPUT, "R", IR_F32, V_SMOOTH, 0, y->rank, y->shape));
    int rank = f ? f->rank : 0;
    for (int d = 0; d < rank; d++)
        f = ir_reduce(g, IR_SUM, f, d);
    return ir_reshape(g, f, 0, NULL);
}

static IrGraph *build_case(Ctx *c, const GradCase *cs)
{
    IrGraph *g = new_graph(c, cs->name);
    c->cs = cs;
    IrNode *y = cs->build(c);
    ck_assert_msg(y && !ir_graph_error(g), "%s: %s", cs->name, ir_graph_error(g) ? ir_graph_error(g) : "no node");
    ck_assert_msg(y->op == cs->op, "%s builds %s, not %s", cs->name, ir_ops[y->op].name, ir_ops[cs->op].name);
    ir_output(g, "f", objective(c, y));
    ck_assert_msg(!ir_graph_error(g), "%s: %s", cs->name, ir_graph_error(g));
    return g;
}

static double eval_f(Ctx *c, const IrGraph *gf)
{
    IrHostTensor out[1];
    char err[512];
    ck_assert_msg(ir_interp_f64(gf, bind_f64, c, out, err, sizeof err) == 0, "%s", err);
    double f = *(double *)out[0].data;
    ir_host_free(&out[0]);
    return f;
}

/* gd's grad.<param> outputs against central differences of gf's output 0. Returns the number
 * of elements compared; *worst gets the largest error / tolerance. */
static int check_grads(Ctx *c, const IrGraph *gf, const IrGraph *gd, double *worst)
{
    char err[512];
    IrHostTensor *outs = calloc((size_t)gd->noutputs, sizeof *outs);
    ck_assert_ptr_nonnull(outs);
    ck_assert_msg(ir_interp_f64(gd, bind_f64, c, outs, err, sizeof err) == 0, "%s: %s", gd->name, err);
    int compared = 0, ngrads = 0;
    *worst = 0;
    for (int o = 0; o < gd->noutputs; o++) {
        const char *name = gd->outputs[o].name;
        if (strncmp(name, "grad.", 5) != 0)
            continue;
        Leaf *l = find_leaf(c, name + 5);
        ck_assert_msg(l && l->dtype == IR_F32, "%s: output %s names no parameter", gd->name, name);
        ck_assert_int_eq(outs[o].rank, l->rank);
        ngrads++;
        const double *ad = outs[o].data;
        double *x = l->data;
        for (int64_t i = 0; i < l->numel; i++) {
            double x0 = x[i], h = 1e-6 * fmax(1, fabs(x0));
            x[i] = x0 + h;
            double fp = eval_f(c, gf);
            x[i] = x0 - h;
            double fm = eval_f(c, gf);
            x[i] = x0;
            double fd = (fp - fm) / (2 * h), tol = 1e-6 * fmax(1, fabs(fd));
            double r = fabs(ad[i] - fd) / tol;
            ck_assert_msg(r <= 1, "%s: %s[%lld]: autodiff %.12g, central difference %.12g", gd->name, name,
                          (long long)i, ad[i], fd);
            if (r > *worst)
                *worst = r;
            compared++;
        }
    }
    int nparams = 0;
    for (int i = 0; i < c->nleaves; i++)
        nparams += ir_find_leaf(gf, IR_PARAM, c->leaf[i].name) != NULL;
    ck_assert_msg(ngrads == nparams, "%s: %d gradients for %d parameters", gd->name, ngrads, nparams);
    for (int o = 0; o < gd->noutputs; o++)
        ir_host_free(&outs[o]);
    free(outs);
    return compared;
}

/* ---- the cases ---- */

static IrNode *b_unary(Ctx *c) { return ir_unary(c->g, c->cs->op, par(c, "x", c->cs->a, SHAPE(D(2), c->N, D(3)))); }

/* a cast from f32 to f32 (ir_cast elides it, so through the constructor) */
static IrNode *b_cast(Ctx *c)
{
    IrNode p;
    memset(&p, 0, sizeof p);
    p.op = IR_CAST;
    p.nin = 1;
    p.in[0] = par(c, "x", V_SMOOTH, SHAPE(c->N, D(4)));
    p.dtype = IR_F32;
    return ir_node(c->g, &p);
}

/* [2, 1, 4] with [3, 1]: both operands broadcast */
static IrNode *b_binary(Ctx *c)
{
    return ir_binary(c->g, c->cs->op, par(c, "a", c->cs->a, SHAPE(D(2), D(1), D(4))),
                     par(c, "b", c->cs->b, SHAPE(D(3), D(1))));
}

/* [b, n, 3] with [3]: the second sums over symbolic dims */
static IrNode *b_binary_sym(Ctx *c)
{
    return ir_binary(c->g, c->cs->op, par(c, "a", c->cs->a, SHAPE(c->B, c->N, D(3))),
                     par(c, "b", c->cs->b, SHAPE(D(3))));
}

/* the same parameter twice: contributions accumulate */
static IrNode *b_binary_self(Ctx *c)
{
    IrNode *x = par(c, "x", c->cs->a, SHAPE(D(3), D(2)));
    return ir_binary(c->g, c->cs->op, ir_unary(c->g, IR_TANH, x), x);
}

/* the condition from parameters on offset grids: lt passes nothing, and never flips */
static IrNode *b_where(Ctx *c)
{
    IrNode *p = par(c, "p", V_GRID_A, SHAPE(D(3), D(1))), *q = par(c, "q", V_GRID_B, SHAPE(D(4)));
    IrNode *cond = ir_binary(c->g, IR_LT, p, q);
    return ir_where(c->g, cond, par(c, "a", V_SMOOTH, SHAPE(D(2), D(3), D(4))), par(c, "b", V_SMOOTH, SHAPE(D(4))));
}

/* an input mask against a constant branch, as attention masking does (with -3 rather than
 * -FLT_MAX, which would swamp f's central differences) */
static IrNode *b_where_mask(Ctx *c)
{
    IrNode *m = inp(c, "m", IR_BOOL, V_BOOL, 0, SHAPE(c->B, c->N, D(1)));
    return ir_where(c->g, m, par(c, "a", V_SMOOTH, SHAPE(c->B, c->N, D(4))), ir_const(c->g, -3, IR_F32));
}

static IrNode *b_sum_mid(Ctx *c)
{
    return ir_reduce(c->g, IR_SUM, par(c, "x", V_SMOOTH, SHAPE(c->B, c->N, D(4))), 1);
}

static IrNode *b_sum_first(Ctx *c) { return ir_reduce(c->g, IR_SUM, par(c, "x", V_SMOOTH, SHAPE(D(2), D(3))), 0); }

static IrNode *b_rmax_mid(Ctx *c)
{
    return ir_reduce(c->g, IR_RMAX, par(c, "x", V_DISTINCT, SHAPE(D(2), D(5), D(3))), 1);
}

static IrNode *b_rmax_last(Ctx *c)
{
    return ir_reduce(c->g, IR_RMAX, par(c, "x", V_DISTINCT, SHAPE(c->N, D(4))), -1);
}

static IrNode *b_softmax(Ctx *c) { return ir_softmax(c->g, par(c, "x", V_SMOOTH, SHAPE(D(2), c->N, D(5)))); }

/* rows of distinct values 0.2 apart (never tied), wide enough that some entries fall outside
 * the support; the support's edge is smooth (y = (x/2 - tau)^2 has slope 0 there) */
static IrNode *b_entmax15(Ctx *c)
{
    IrNode *x = par(c, "x", V_DISTINCT, SHAPE(D(2), c->N, D(5)));
    return ir_entmax15(c->g, ir_binary(c->g, IR_MUL, x, ir_const(c->g, 2, IR_F32)));
}

/* masked logits, as attention fills them: -FLT_MAX entries take no part and get 0 (a row that is
 * all masked is uniform and passes nothing to x) */
static IrNode *b_entmax15_masked(Ctx *c)
{
    IrNode *m = inp(c, "m", IR_BOOL, V_BOOL, 0, SHAPE(c->B, c->N, D(6)));
    IrNode *x = par(c, "x", V_DISTINCT, SHAPE(c->B, c->N, D(6)));
    IrNode *dots = ir_where(c->g, m, ir_binary(c->g, IR_MUL, x, ir_const(c->g, 2, IR_F32)), ir_const(c->g, -FLT_MAX, IR_F32));
    return ir_entmax15(c->g, dots);
}

static IrNode *b_reshape(Ctx *c)
{
    IrDim to[2] = {D(6), D(4)};
    return ir_reshape(c->g, par(c, "x", V_SMOOTH, SHAPE(D(2), D(3), D(4))), 2, to);
}

static IrNode *b_reshape_sym(Ctx *c)
{
    IrDim to[4] = {c->B, c->N, D(2), D(2)};
    return ir_reshape(c->g, par(c, "x", V_SMOOTH, SHAPE(c->B, c->N, D(4))), 4, to);
}

static IrNode *b_permute(Ctx *c)
{
    static const int perm[3] = {2, 0, 1};
    return ir_permute(c->g, par(c, "x", V_SMOOTH, SHAPE(D(2), c->N, D(4))), perm);
}

static IrNode *b_slice_mid(Ctx *c)
{
    return ir_slice(c->g, par(c, "x", V_SMOOTH, SHAPE(D(2), D(5), D(3))), 1, D(1), D(3));
}

static IrNode *b_slice_tail(Ctx *c)
{
    return ir_slice(c->g, par(c, "x", V_SMOOTH, SHAPE(c->B, c->N, D(3))), 1, D(1), ir_dim_addc(c->N, -1));
}

static IrNode *b_slice_head(Ctx *c)
{
    return ir_slice(c->g, par(c, "x", V_SMOOTH, SHAPE(c->B, ir_dim_addc(c->N, 2), D(3))), 1, D(0), c->N);
}

/* symbolic start: zeros of n rows before */
static IrNode *b_slice_symstart(Ctx *c)
{
    IrNode *x = par(c, "x", V_SMOOTH, SHAPE(ir_dim_addc(c->N, 2), D(3)));
    inp(c, "anchor", IR_I64, V_INDEX, 1, SHAPE(c->N)); /* binds n */
    return ir_slice(c->g, x, 0, c->N, D(2));
}

static IrNode *b_concat(Ctx *c)
{
    return ir_concat(c->g, par(c, "a", V_SMOOTH, SHAPE(D(2), D(3))), par(c, "b", V_SMOOTH, SHAPE(D(2), D(2))), 1);
}

static IrNode *b_concat_sym(Ctx *c)
{
    return ir_concat(c->g, par(c, "a", V_SMOOTH, SHAPE(c->B, c->N, D(3))),
                     par(c, "b", V_SMOOTH, SHAPE(c->B, D(2), D(3))), 1);
}

static IrNode *b_expand(Ctx *c)
{
    IrDim to[3] = {D(2), D(3), D(4)};
    return ir_expand(c->g, par(c, "x", V_SMOOTH, SHAPE(D(3), D(1))), 3, to);
}

static IrNode *b_expand_sym(Ctx *c)
{
    IrDim to[3] = {c->B, c->N, D(4)};
    return ir_expand(c->g, par(c, "x", V_SMOOTH, SHAPE(D(4))), 3, to);
}

/* 2 x 3 draws from 5 rows: repeated rows add up */
static IrNode *b_gather(Ctx *c)
{
    return ir_gather(c->g, par(c, "table", V_SMOOTH, SHAPE(D(5), D(3))),
                     inp(c, "idx", IR_I64, V_INDEX, 5, SHAPE(D(2), c->N)));
}

static IrNode *b_gather_grad(Ctx *c)
{
    return ir_gather_grad(c->g, par(c, "src", V_SMOOTH, SHAPE(D(2), c->N, D(3))),
                          inp(c, "idx", IR_I32, V_INDEX, 4, SHAPE(D(2), c->N)), D(4));
}

static IrNode *b_mm(Ctx *c)
{
    return ir_matmul(c->g, par(c, "a", V_SMOOTH, SHAPE(D(2), D(3), D(4))),
                     par(c, "b", V_SMOOTH, SHAPE(D(4), D(5))), 0);
}

/* a Linear: x[b, n, 4] W[5, 4]^T, so dW sums over b */
static IrNode *b_mm_linear(Ctx *c)
{
    return ir_matmul(c->g, par(c, "x", V_SMOOTH, SHAPE(c->B, c->N, D(4))),
                     par(c, "w", V_SMOOTH, SHAPE(D(5), D(4))), 1);
}

static IrNode *b_mm_bcast(Ctx *c)
{
    return ir_matmul(c->g, par(c, "a", V_SMOOTH, SHAPE(D(2), D(1), D(3), D(4))),
                     par(c, "b", V_SMOOTH, SHAPE(D(1), D(2), D(4), D(5))), 0);
}

/* attention's q k^T */
static IrNode *b_mm_batched_t(Ctx *c)
{
    return ir_matmul(c->g, par(c, "q", V_SMOOTH, SHAPE(c->B, D(2), c->N, D(4))),
                     par(c, "k", V_SMOOTH, SHAPE(c->B, D(2), D(5), D(4))), 1);
}

/* fused attention (its hand-written backward, attention_grad): causal with J = I + 2 keys, a
 * padding mask with fully masked query rows, a bias that takes no gradient; with the logsumexp
 * column (its gradient flows too); and a scale per head */
static IrNode *b_attention(Ctx *c)
{
    IrDim J = ir_dim_addc(c->N, 2);
    IrNode *q = par(c, "q", V_SMOOTH, SHAPE(c->B, D(2), c->N, D(4)));
    IrNode *k = par(c, "k", V_SMOOTH, SHAPE(c->B, D(2), J, D(4))), *v = par(c, "v", V_SMOOTH, SHAPE(c->B, D(2), J, D(4)));
    IrNode *qm = inp(c, "qm", IR_BOOL, V_SMOOTH, 0, SHAPE(c->B, D(1), c->N, D(1)));
    IrNode *km = inp(c, "km", IR_BOOL, V_SMOOTH, 0, SHAPE(c->B, D(1), D(1), J));
    IrNode *bias = inp(c, "bias", IR_F32, V_SMOOTH, 0, SHAPE(D(2), c->N, J));
    return ir_attention(c->g, q, k, v, bias, ir_binary(c->g, IR_AND, qm, km), ir_const(c->g, 0.7, IR_F32), 1, 0);
}

static IrNode *b_attention_stats(Ctx *c)
{
    IrNode *q = par(c, "q", V_SMOOTH, SHAPE(c->B, D(2), c->N, D(3)));
    IrNode *k = par(c, "k", V_SMOOTH, SHAPE(c->B, D(2), c->N, D(3))), *v = par(c, "v", V_SMOOTH, SHAPE(c->B, D(2), c->N, D(3)));
    IrNode *scale = inp(c, "scale", IR_F32, V_POS, 0, SHAPE(D(1), D(2), D(1), D(1)));
    return ir_attention(c->g, q, k, v, NULL, NULL, scale, 0, 1);
}

/* a sliding window of 2 (max_attend_past), causal over J = I + 2 keys, with the logsumexp */
static IrNode *b_attention_window(Ctx *c)
{
    IrDim J = ir_dim_addc(c->N, 2);
    IrNode *q = par(c, "q", V_SMOOTH, SHAPE(c->B, D(2), c->N, D(3)));
    IrNode *k = par(c, "k", V_SMOOTH, SHAPE(c->B, D(2), J, D(3))), *v = par(c, "v", V_SMOOTH, SHAPE(c->B, D(2), J, D(3)));
    return ir_attention_window(c->g, q, k, v, NULL, NULL, ir_const(c->g, 0.6, IR_F32), 1, 1, 2);
}

/* grouped key/values (attention_grad sums each group's dk, dv): 4 query heads over 2 key/value
 * heads, causal over J = I + 2 keys with a padding mask and the logsumexp; over 1 (multi-query)
 * with a scale per head */
static IrNode *b_attention_grouped(Ctx *c)
{
    IrDim J = ir_dim_addc(c->N, 2);
    IrNode *q = par(c, "q", V_SMOOTH, SHAPE(c->B, D(4), c->N, D(3)));
    IrNode *k = par(c, "k", V_SMOOTH, SHAPE(c->B, D(2), J, D(3))), *v = par(c, "v", V_SMOOTH, SHAPE(c->B, D(2), J, D(3)));
    IrNode *km = inp(c, "km", IR_BOOL, V_SMOOTH, 0, SHAPE(c->B, D(1), D(1), J));
    return ir_attention(c->g, q, k, v, NULL, km, ir_const(c->g, 0.6, IR_F32), 1, 1);
}

static IrNode *b_attention_mqa(Ctx *c)
{
    IrNode *q = par(c, "q", V_SMOOTH, SHAPE(c->B, D(3), c->N, D(3)));
    IrNode *k = par(c, "k", V_SMOOTH, SHAPE(c->B, D(1), c->N, D(3))), *v = par(c, "v", V_SMOOTH, SHAPE(c->B, D(1), c->N, D(3)));
    IrNode *scale = inp(c, "scale", IR_F32, V_POS, 0, SHAPE(D(1), D(3), D(1), D(1)));
    return ir_attention(c->g, q, k, v, NULL, NULL, scale, 0, 0);
}

static IrNode *b_mm_left2(Ctx *c)
{
    return ir_matmul(c->g, par(c, "a", V_SMOOTH, SHAPE(D(3), D(4))),
                     par(c, "b", V_SMOOTH, SHAPE(D(2), D(4), D(5))), 0);
}

static IrNode *b_xent(Ctx *c)
{
    return ir_xent(c->g, par(c, "z", V_SMOOTH, SHAPE(D(2), c->N, D(6))),
                   inp(c, "t", IR_I64, V_TARGET, 6, SHAPE(D(2), c->N)));
}

static IrNode *b_xent_i32(Ctx *c)
{
    return ir_xent(c->g, par(c, "z", V_SMOOTH, SHAPE(c->N, D(4))), inp(c, "t", IR_I32, V_INDEX, 4, SHAPE(c->N)));
}

#define UNARY(op, dom) {#op, IR_##op, b_unary, dom, V_SMOOTH}
#define BINARY(op, da, db)                                                                   \
    {#op " broadcast", IR_##op, b_binary, da, db}, {#op " symbolic", IR_##op, b_binary_sym, da, db}

static const GradCase cases[] = {
    UNARY(NEG, V_SMOOTH),
    UNARY(EXP, V_SMOOTH),
    UNARY(LOG, V_POS),
    UNARY(SQRT, V_POS),
    UNARY(RSQRT, V_POS),
    UNARY(RECIP, V_POS),
    UNARY(TANH, V_SMOOTH),
    UNARY(SIGMOID, V_SMOOTH),
    UNARY(GELU, V_SMOOTH),
    UNARY(ERF, V_SMOOTH),
    UNARY(RELU, V_AWAY0),
    UNARY(SIN, V_SMOOTH),
    UNARY(COS, V_SMOOTH),
    UNARY(ABS, V_AWAY0),
    {"CAST f32", IR_CAST, b_cast, V_SMOOTH, V_SMOOTH},
    BINARY(ADD, V_SMOOTH, V_SMOOTH),
    BINARY(SUB, V_SMOOTH, V_SMOOTH),
    BINARY(MUL, V_SMOOTH, V_SMOOTH),
    BINARY(DIV, V_SMOOTH, V_POS),
    BINARY(MAX, V_GRID_A, V_GRID_B),
    BINARY(MIN, V_GRID_A, V_GRID_B),
    {"MUL self", IR_MUL, b_binary_self, V_SMOOTH, V_SMOOTH},
    {"DIV self", IR_DIV, b_binary_self, V_POS, V_SMOOTH},
    {"WHERE grids", IR_WHERE, b_where, V_SMOOTH, V_SMOOTH},
    {"WHERE mask", IR_WHERE, b_where_mask, V_SMOOTH, V_SMOOTH},
    {"SUM mid", IR_SUM, b_sum_mid, V_SMOOTH, V_SMOOTH},
    {"SUM first", IR_SUM, b_sum_first, V_SMOOTH, V_SMOOTH},
    {"RMAX mid", IR_RMAX, b_rmax_mid, V_SMOOTH, V_SMOOTH},
    {"RMAX last", IR_RMAX, b_rmax_last, V_SMOOTH, V_SMOOTH},
    {"SOFTMAX", IR_SOFTMAX, b_softmax, V_SMOOTH, V_SMOOTH},
    {"ENTMAX15", IR_ENTMAX15, b_entmax15, V_SMOOTH, V_SMOOTH},
    {"ENTMAX15 masked", IR_ENTMAX15, b_entmax15_masked, V_SMOOTH, V_SMOOTH},
    {"RESHAPE", IR_RESHAPE, b_reshape, V_SMOOTH, V_SMOOTH},
    {"RESHAPE symbolic", IR_RESHAPE, b_reshape_sym, V_SMOOTH, V_SMOOTH},
    {"PERMUTE", IR_PERMUTE, b_permute, V_SMOOTH, V_SMOOTH},
    {"SLICE mid", IR_SLICE, b_slice_mid, V_SMOOTH, V_SMOOTH},
    {"SLICE tail", IR_SLICE, b_slice_tail, V_SMOOTH, V_SMOOTH},
    {"SLICE head", IR_SLICE, b_slice_head, V_SMOOTH, V_SMOOTH},
    {"SLICE symbolic start", IR_SLICE, b_slice_symstart, V_SMOOTH, V_SMOOTH},
    {"CONCAT", IR_CONCAT, b_concat, V_SMOOTH, V_SMOOTH},
    {"CONCAT symbolic", IR_CONCAT, b_concat_sym, V_SMOOTH, V_SMOOTH},
    {"EXPAND", IR_EXPAND, b_expand, V_SMOOTH, V_SMOOTH},
    {"EXPAND symbolic", IR_EXPAND, b_expand_sym, V_SMOOTH, V_SMOOTH},
    {"GATHER", IR_GATHER, b_gather, V_SMOOTH, V_SMOOTH},
    {"GATHER_GRAD", IR_GATHER_GRAD, b_gather_grad, V_SMOOTH, V_SMOOTH},
    {"MATMUL", IR_MATMUL, b_mm, V_SMOOTH, V_SMOOTH},
    {"MATMUL linear", IR_MATMUL, b_mm_linear, V_SMOOTH, V_SMOOTH},
    {"MATMUL broadcast batch", IR_MATMUL, b_mm_bcast, V_SMOOTH, V_SMOOTH},
    {"MATMUL batched transposed", IR_MATMUL, b_mm_batched_t, V_SMOOTH, V_SMOOTH},
    {"MATMUL rank-2 left", IR_MATMUL, b_mm_left2, V_SMOOTH, V_SMOOTH},
    {"XENT", IR_XENT, b_xent, V_SMOOTH, V_SMOOTH},
    {"ATTENTION causal mask bias", IR_ATTENTION, b_attention, V_SMOOTH, V_SMOOTH},
    {"ATTENTION stats, scale per head", IR_ATTENTION, b_attention_stats, V_SMOOTH, V_SMOOTH},
    {"ATTENTION window", IR_ATTENTION, b_attention_window, V_SMOOTH, V_SMOOTH},
    {"ATTENTION grouped key/values", IR_ATTENTION, b_attention_grouped, V_SMOOTH, V_SMOOTH},
    {"ATTENTION one key/value head", IR_ATTENTION, b_attention_mqa, V_SMOOTH, V_SMOOTH},
    {"XENT i32", IR_XENT, b_xent_i32, V_SMOOTH, V_SMOOTH},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

START_TEST(test_gradcheck)
{
    const GradCase *cs = &cases[_i];
    Ctx c;
    memset(&c, 0, sizeof c);
    c.rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)(_i + 1) * 0x2545f4914f6cdd1dull;
    IrGraph *gf = build_case(&c, cs);
    make_data(&c, gf);
    IrGraph *gd = build_case(&c, cs);
    char err[512];
    IrGradOpts opts = {.loss = "f"};
    ck_assert_msg(ir_autodiff(gd, &opts, err, sizeof err) == 0, "%s: %s", cs->name, err);
    check_roundtrip(gd);
    double worst;
    int n = check_grads(&c, gf, gd, &worst);
    ck_assert_int_gt(n, 0);
    printf("gradcheck %-28s %3d elements, worst error/tolerance %.2e\n", cs->name, n, worst);
    ir_graph_free(gf);
    ir_graph_free(gd);
    free_data(&c);
}
END_TEST

/* Every op has a rule or says why it has none; every rule has a case above. */
START_TEST(test_rules_covered)
{
    for (int op = 0; op < IR_NUM_OPS; op++) {
        int rule = ir_autodiff_has_rule((IrOp)op);
        const char *none = ir_autodiff_nograd((IrOp)op);
        ck_assert_msg(rule != (none != NULL), "op '%s': the autodiff table needs exactly one of a rule or a reason",
                      ir_ops[op].name);
        if (!rule)
            continue;
        int covered = 0;
        for (int i = 0; i < NCASES; i++)
            covered |= cases[i].op == (IrOp)op;
        ck_assert_msg(covered, "op '%s' has a gradient rule but no gradient check: add a case", ir_ops[op].name);
    }
    for (int op = 0; op < IR_NUM_OPS; op++)
        if (ir_ops[op].flags & IR_LEAF)
            ck_assert(!ir_autodiff_has_rule((IrOp)op));
    ck_assert(!ir_autodiff_has_rule(IR_NUM_OPS));
}
END_TEST

/* ---- exact checks ---- */

/* Differentiates f = sum(y) (y built by the caller from parameters whose values are set), runs
 * it, and returns the output grad.<name>'s data (double, malloc'ed). */
static double *grad_of(Ctx *c, IrNode *y, const char *name)
{
    IrGraph *g = c->g;
    IrNode *f = y;
    for (int d = 0; d < y->rank; d++)
        f = ir_reduce(g, IR_SUM, f, d);
    ir_output(g, "f", ir_reshape(g, f, 0, NULL));
    char err[512];
    ck_assert_msg(ir_autodiff(g, NULL, err, sizeof err) != 0, "no output 'loss' should fail");
    IrGradOpts o = {.loss = "f"};
    ck_assert_msg(ir_autodiff(g, &o, err, sizeof err) == 0, "%s", err);
    check_roundtrip(g);
    IrHostTensor *outs = calloc((size_t)g->noutputs, sizeof *outs);
    ck_assert_msg(ir_interp_f64(g, bind_f64, c, outs, err, sizeof err) == 0, "%s", err);
    double *r = NULL;
    char want[64];
    snprintf(want, sizeof want, "grad.%s", name);
    for (int i = 0; i < g->noutputs; i++) {
        if (strcmp(g->outputs[i].name, want) == 0) {
            r = outs[i].data;
            outs[i].data = NULL;
        }
        ir_host_free(&outs[i]);
    }
    free(outs);
    ck_assert_msg(r != NULL, "no output %s", want);
    return r;
}

static void set_values(Ctx *c, const char *name, const double *v)
{
    Leaf *l = find_leaf(c, name);
    ck_assert_ptr_nonnull(l);
    memcpy(l->data, v, sizeof(double) * (size_t)l->numel);
}

static void expect(const double *got, const double *want, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        ck_assert_msg(fabs(got[i] - want[i]) < 1e-12, "%s[%d] = %g, want %g", what, i, got[i], want[i]);
}

/* At a kink: max and min give a tie to their first operand (torch.clamp passes the gradient to
 * x at x == bound); reduce_max splits it evenly among the tied maxima (torch.amax); relu and abs
 * give 0 at 0 (torch). */
START_TEST(test_tie_rules)
{
    static const double a[3] = {1, 2, 3}, b[3] = {1, 0, 5}, r[4] = {2, 5, 5, 1}, k[3] = {-1, 0, 2};
    struct {
        IrOp op;
        const char *param;
        int n;
        const double *want;
    } t[] = {
        {IR_MAX, "a", 3, (const double[]){1, 1, 0}}, {IR_MAX, "b", 3, (const double[]){0, 0, 1}},
        {IR_MIN, "a", 3, (const double[]){1, 0, 1}}, {IR_MIN, "b", 3, (const double[]){0, 1, 0}},
        {IR_RMAX, "r", 4, (const double[]){0, 0.5, 0.5, 0}}, {IR_RELU, "k", 3, (const double[]){0, 0, 1}},
        {IR_ABS, "k", 3, (const double[]){-1, 0, 1}},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        Ctx c;
        memset(&c, 0, sizeof c);
        c.rng = 1;
        IrGraph *g = new_graph(&c, "ties");
        IrNode *y;
        if (t[i].op == IR_RMAX)
            y = ir_reduce(g, IR_RMAX, par(&c, "r", V_SMOOTH, SHAPE(D(4))), 0);
        else if (t[i].op == IR_RELU || t[i].op == IR_ABS)
            y = ir_unary(g, t[i].op, par(&c, "k", V_SMOOTH, SHAPE(D(3))));
        else
            y = ir_binary(g, t[i].op, par(&c, "a", V_SMOOTH, SHAPE(D(3))), par(&c, "b", V_SMOOTH, SHAPE(D(3))));
        make_data(&c, g);
        if (find_leaf(&c, "a")) {
            set_values(&c, "a", a);
            set_values(&c, "b", b);
        }
        if (find_leaf(&c, "r"))
            set_values(&c, "r", r);
        if (find_leaf(&c, "k"))
            set_values(&c, "k", k);
        double *got = grad_of(&c, y, t[i].param);
        char what[64];
        snprintf(what, sizeof what, "%s: grad.%s", ir_ops[t[i].op].name, t[i].param);
        expect(got, t[i].want, t[i].n, what);
        free(got);
        ir_graph_free(g);
        free_data(&c);
    }
}
END_TEST

/* seed_outputs: every f32 output O gets an input grad.O, and the gradients are those of
 * sum(O * grad.O) summed over the outputs; integer outputs are left alone. */
START_TEST(test_seed_outputs)
{
    Ctx c;
    memset(&c, 0, sizeof c);
    c.rng = 7;
    IrGraph *gf = NULL, *gd = NULL;
    for (int pass = 0; pass < 2; pass++) {
        IrGraph *g = new_graph(&c, pass ? "seeded" : "reference");
        IrNode *x = inp(&c, "x", IR_F32, V_SMOOTH, 0, SHAPE(c.B, c.N, D(3)));
        IrNode *w = par(&c, "w", V_SMOOTH, SHAPE(D(4), D(3)));
        IrNode *bias = par(&c, "bias", V_SMOOTH, SHAPE(D(4)));
        IrNode *unused = par(&c, "unused", V_SMOOTH, SHAPE(D(2), D(2)));
        ir_buffer(g, "buf", SHAPE(D(2)));
        IrNode *y = ir_binary(g, IR_ADD, ir_matmul(g, x, w, 1), bias);
        IrNode *z = ir_unary(g, IR_TANH, y);
        (void)unused;
        if (pass == 0) {
            IrNode *gy = inp(&c, "grad.y", IR_F32, V_SMOOTH, 0, y->rank, y->shape);
            IrNode *gz = inp(&c, "grad.z", IR_F32, V_SMOOTH, 0, z->rank, z->shape);
            IrNode *f = ir_binary(g, IR_ADD, ir_binary(g, IR_MUL, y, gy), ir_binary(g, IR_MUL, z, gz));
            for (int d = 0; d < 3; d++)
                f = ir_reduce(g, IR_SUM, f, d);
            ir_output(g, "f", ir_reshape(g, f, 0, NULL));
            gf = g;
        } else {
            ir_output(g, "y", y);
            ir_output(g, "positions", ir_arange(g, D(0), c.N, IR_I64));
            ir_output(g, "z", z);
            gd = g;
        }
    }
    make_data(&c, gf);
    char err[512];
    IrGradOpts o = {.seed_outputs = 1};
    ck_assert_msg(ir_autodiff(gd, &o, err, sizeof err) == 0, "%s", err);
    check_roundtrip(gd);
    ck_assert_ptr_nonnull(ir_find_leaf(gd, IR_INPUT, "grad.y"));
    ck_assert_ptr_nonnull(ir_find_leaf(gd, IR_INPUT, "grad.z"));
    ck_assert_ptr_null(ir_find_leaf(gd, IR_INPUT, "grad.positions"));
    /* outputs: y, positions, z, then one gradient per parameter in node order; none for buf */
    ck_assert_int_eq(gd->noutputs, 6);
    ck_assert_str_eq(gd->outputs[3].name, "grad.w");
    ck_assert_str_eq(gd->outputs[4].name, "grad.bias");
    ck_assert_str_eq(gd->outputs[5].name, "grad.unused");
    double worst;
    ck_assert_int_eq(check_grads(&c, gf, gd, &worst), 12 + 4 + 4);
    ir_graph_free(gf);
    ir_graph_free(gd);
    free_data(&c);
}
END_TEST

/* IrGradOpts.loss_scale: loss = sum(w * x) seeded with the input S gives grad.w = S x; each
 * caller-supplied grad.y is multiplied by S (grad.w = S grad.y x); a forward graph that already
 * has an input of that name is refused. */
static int scale_bind(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    static float w[3] = {1, 2, 3}, x[3] = {0.5f, -1, 4}, gy[3] = {1, 10, 100}, scale = 8;
    (void)ctx;
    memset(out, 0, sizeof *out);
    out->dtype = IR_F32;
    out->rank = leaf->rank;
    if (leaf->rank)
        out->shape[0] = 3;
    out->data = !strcmp(leaf->s, "w") ? (void *)w : !strcmp(leaf->s, "x") ? (void *)x
              : !strcmp(leaf->s, "grad.y") ? (void *)gy : !strcmp(leaf->s, "loss_scale") ? (void *)&scale : NULL;
    return out->data ? 0 : -1;
}

START_TEST(test_loss_scale)
{
    static const float x[3] = {0.5f, -1, 4}, gy[3] = {1, 10, 100};
    char err[512];
    for (int seeded = 0; seeded < 2; seeded++) {
        IrGraph *g = ir_graph_new("scaled");
        IrNode *w = ir_param(g, "w", SHAPE(D(3)));
        IrNode *y = ir_binary(g, IR_MUL, w, ir_input(g, "x", IR_F32, SHAPE(D(3))));
        if (seeded)
            ir_output(g, "y", y);
        else
            ir_output(g, "loss", ir_reshape(g, ir_reduce(g, IR_SUM, y, 0), 0, NULL));
        IrGradOpts o = {.loss = seeded ? NULL : "loss", .seed_outputs = seeded, .loss_scale = IR_LOSS_SCALE_INPUT};
        ck_assert_msg(ir_autodiff(g, &o, err, sizeof err) == 0, "%s", err);
        const IrNode *s = ir_find_leaf(g, IR_INPUT, IR_LOSS_SCALE_INPUT);
        ck_assert_ptr_nonnull(s);
        ck_assert_int_eq(s->rank, 0);
        ck_assert_int_eq(s->dtype, IR_F32);
        check_roundtrip(g);
        IrHostTensor outs[2];
        ck_assert_msg(ir_interp(g, scale_bind, NULL, outs, err, sizeof err) == 0, "%s", err);
        ck_assert_str_eq(g->outputs[1].name, "grad.w");
        for (int i = 0; i < 3; i++)
            ck_assert_float_eq(((float *)outs[1].data)[i], 8 * x[i] * (seeded ? gy[i] : 1));
        for (int i = 0; i < 2; i++)
            ir_host_free(&outs[i]);
        ir_graph_free(g);
    }
    IrGraph *g = ir_graph_new("taken");
    IrNode *w = ir_param(g, "w", 0, NULL);
    ir_output(g, "loss", ir_binary(g, IR_MUL, w, ir_input(g, IR_LOSS_SCALE_INPUT, IR_F32, 0, NULL)));
    IrGradOpts o = {.loss = "loss", .loss_scale = IR_LOSS_SCALE_INPUT};
    ck_assert_int_eq(ir_autodiff(g, &o, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "already has an input named 'loss_scale'"), "%s", err);
    ir_graph_free(g);
}
END_TEST

/* Readable names: the gradient of %h is %grad.h, of parameter w the output and value grad.w. */
START_TEST(test_labels)
{
    IrGraph *g = ir_graph_new("labels");
    IrNode *x = ir_input(g, "x", IR_F32, SHAPE(D(2), D(3)));
    IrNode *w = ir_param(g, "layer0.w", SHAPE(D(4), D(3)));
    IrNode *h = ir_label(g, ir_unary(g, IR_TANH, ir_matmul(g, x, w, 1)), "layer0.h");
    IrNode *f = ir_reduce(g, IR_SUM, ir_reduce(g, IR_SUM, ir_binary(g, IR_MUL, h, h), 0), 1);
    ir_output(g, "loss", ir_reshape(g, f, 0, NULL));
    char err[512];
    ck_assert_msg(ir_autodiff(g, NULL, err, sizeof err) == 0, "%s", err);
    int found_h = 0, found_w = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const char *l = g->nodes[i]->label;
        found_h |= l && strcmp(l, "grad.layer0.h") == 0;
        found_w |= l && strcmp(l, "grad.layer0.w") == 0;
    }
    ck_assert(found_h && found_w);
    ck_assert_str_eq(g->outputs[g->noutputs - 1].name, "grad.layer0.w");
    ck_assert_str_eq(g->outputs[g->noutputs - 1].node->label, "grad.layer0.w");
    check_roundtrip(g);
    ir_graph_free(g);
}
END_TEST

START_TEST(test_errors)
{
    char err[512];
    IrGraph *g = ir_graph_new("errors");
    IrNode *w = ir_param(g, "w", SHAPE(D(3)));
    ir_output(g, "vec", ir_unary(g, IR_EXP, w));
    ir_output(g, "count", ir_arange(g, D(0), D(3), IR_I64));
    IrGradOpts missing = {.loss = "loss"}, vec = {.loss = "vec"}, ints_ = {.loss = "count"}, none = {.loss = NULL};
    ck_assert_int_eq(ir_autodiff(g, &missing, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no output named 'loss'"), "%s", err);
    ck_assert_int_eq(ir_autodiff(g, &vec, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "not a scalar f32"), "%s", err);
    ck_assert_int_eq(ir_autodiff(g, &ints_, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "not a scalar f32"), "%s", err);
    ck_assert_int_eq(ir_autodiff(g, &none, err, sizeof err), -1);
    ck_assert_int_eq(ir_autodiff(g, &missing, NULL, 0), -1); /* no message wanted */
    ir_graph_free(g);

    /* a loss that depends on no parameter: every gradient is zeros of its parameter's shape */
    g = ir_graph_new("constant_loss");
    w = ir_param(g, "w", SHAPE(D(2), D(3)));
    IrNode *s = ir_param(g, "s", 0, NULL);
    IrNode *x = ir_input(g, "x", IR_F32, 0, NULL);
    ir_output(g, "loss", ir_unary(g, IR_EXP, x));
    ck_assert_msg(ir_autodiff(g, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(g->noutputs, 3);
    const IrNode *gw = g->outputs[1].node, *gs = g->outputs[2].node;
    ck_assert_int_eq(gw->rank, 2);
    ck_assert(ir_dim_eq(gw->shape[0], w->shape[0]) && ir_dim_eq(gw->shape[1], w->shape[1]));
    ck_assert_int_eq(gs->op, IR_CONST);
    ck_assert(gs->f == 0 && s->rank == 0);
    check_roundtrip(g);
    ir_graph_free(g);

    /* gather_grad's operand checks (its values are checked as gather's gradient above) */
    static const char *const bad[] = {"indices must be integers", "one more dimension", "differ in dimension 0",
                                      "negative row count"};
    for (int k = 0; k < 4; k++) {
        g = ir_graph_new("gather_grad");
        IrNode *src = ir_input(g, "src", IR_F32, SHAPE(D(2), D(3)));
        IrNode *idx = ir_input(g, "idx", k == 0 ? IR_F32 : IR_I64, k == 1 ? 2 : 1, (IrDim[]){D(k == 2 ? 5 : 2), D(1)});
        ck_assert_ptr_null(ir_gather_grad(g, src, idx, D(k == 3 ? -1 : 4)));
        ck_assert_msg(strstr(ir_graph_error(g), bad[k]), "%s", ir_graph_error(g));
        ir_graph_free(g);
    }
}
END_TEST

static Suite *autodiff_suite(void)
{
    Suite *s = suite_create("autodiff");
    TCase *tc = tcase_create("rules");
    tcase_add_test(tc, test_rules_covered);
    tcase_add_loop_test(tc, test_gradcheck, 0, NCASES);
    tcase_add_test(tc, test_tie_rules);
    tcase_add_test(tc, test_seed_outputs);
    tcase_add_test(tc, test_loss_scale);
    tcase_add_test(tc, test_labels);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(autodiff_suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
