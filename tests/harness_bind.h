/* harness_bind.h: what the suites that check compiled modules against the reference interpreter
 * share (test_codegen, test_cuda, test_cuda_mma; test_fuse for bind_inputs): a small graph built
 * and verified, random values bound to its leaves (the same values for ir_interp and for an
 * XtcSession), the interpreter's outputs, and a module's output compared with one of them.
 *
 * The values come from the suite's own stream (harness.h's rnd and uniform; a suite that seeds it
 * includes harness.h first), drawn leaf by leaf in node order, element by element. A suite whose
 * graphs have more than 64 leaves defines HARNESS_MAXLEAF before including this. */
#ifndef XTC_TEST_HARNESS_BIND_H
#define XTC_TEST_HARNESS_BIND_H

#include "harness.h"
#include "ir.h"
#include "rt_half.h"
#include "safetensors.h"
#include "xtc.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef HARNESS_MAXLEAF
#define HARNESS_MAXLEAF 64
#endif

/* ---- graphs ---- */

typedef void (*BuildFn)(IrGraph *g, IrDim b, IrDim n);

/* A graph of symbols b and n (n at most n_max) built by build, checked by the verifier. */
static inline IrGraph *harness_new_graph(const char *name, BuildFn build, int64_t n_max)
{
    IrGraph *g = ir_graph_new(name);
    int sb = ir_graph_add_sym(g, "b", 0), sn = ir_graph_add_sym(g, "n", n_max);
    build(g, ir_dim_sym(sb), ir_dim_sym(sn));
    ck_assert_msg(ir_graph_error(g) == NULL, "building %s: %s", name, ir_graph_error(g));
    char err[512];
    ck_assert_msg(ir_verify(g, err, sizeof err) == 0, "%s: %s", name, err);
    return g;
}

/* The carry tests' recurrence (test_codegen, test_cuda): next = concat(state[n, 3], x[1, 3]) and
 * twice = next + next, state the input that next is carried into. */
static inline IrGraph *harness_carry_graph(IrNode **next)
{
    IrGraph *g = ir_graph_new("carry");
    IrDim n = ir_dim_sym(ir_graph_add_sym(g, "n", 16));
    IrDim ss[] = {n, ir_dim(3)}, sx[] = {ir_dim(1), ir_dim(3)};
    *next = ir_concat(g, ir_input(g, "state", IR_F32, 2, ss), ir_input(g, "x", IR_F32, 2, sx), 0);
    ir_output(g, "next", *next);
    ir_output(g, "twice", ir_binary(g, IR_ADD, *next, *next));
    return g;
}

/* ---- random values for a graph's leaves ---- */

/* The leaves of a graph (inputs, parameters, buffers, in node order) and their values. */
typedef struct {
    int n;
    const IrNode *leaf[HARNESS_MAXLEAF];
    IrHostTensor t[HARNESS_MAXLEAF];
} Binding;

/* Integer inputs draw from a range chosen by name, [lo, hi): token ids fit the suites' tables,
 * denominators are positive, targets include the ignored -1. */
static inline void int_range_by_name(const char *name, int64_t *lo, int64_t *hi)
{
    *lo = -4;
    *hi = 5;
    if (strncmp(name, "tok", 3) == 0) {
        *lo = 0;
        *hi = 11;
    } else if (strncmp(name, "den", 3) == 0) {
        *lo = 1;
        *hi = 6;
    } else if (strncmp(name, "tgt", 3) == 0) {
        *lo = -1;
        *hi = 13;
    }
}

/* How bind_random draws: f32 values uniform in [-2, 2), those of parameters in [-2 s, 2 s) for
 * s = param_scale, each rounded to storage as drawn (rt_round_to_storage; 0: kept in f32);
 * integers uniform in int_range's [lo, hi) for the leaf's name; bools 0 or 1. */
typedef struct {
    double param_scale;
    void (*int_range)(const char *name, int64_t *lo, int64_t *hi);
    int storage;
} BindDraw;

/* Fills bd with every leaf of g at symbol values syms, drawn as draw says (NULL: the default). */
static inline void bind_random(Binding *bd, const IrGraph *g, const int64_t *syms, const BindDraw *draw)
{
    static const BindDraw by_default = {.param_scale = 1.0, .int_range = int_range_by_name, .storage = 0};
    if (!draw)
        draw = &by_default;
    memset(bd, 0, sizeof *bd);
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *n = g->nodes[i];
        if (n->op != IR_INPUT && n->op != IR_PARAM && n->op != IR_BUFFER)
            continue;
        ck_assert_int_lt(bd->n, HARNESS_MAXLEAF);
        IrHostTensor *t = &bd->t[bd->n];
        bd->leaf[bd->n++] = n;
        t->dtype = n->dtype;
        t->rank = n->rank;
        int64_t numel = 1;
        for (int d = 0; d < n->rank; d++) {
            t->shape[d] = ir_dim_eval(n->shape[d], syms);
            numel *= t->shape[d];
        }
        t->data = malloc((size_t)(numel ? numel : 1) * ir_dtype_size(n->dtype));
        double scale = n->op == IR_PARAM ? draw->param_scale : 1.0;
        int64_t lo, hi;
        draw->int_range(n->s, &lo, &hi);
        for (int64_t k = 0; k < numel; k++) {
            switch (n->dtype) {
            case IR_F32:
                ((float *)t->data)[k] = rt_round_to_storage(draw->storage, (float)uniform(-2 * scale, 2 * scale));
                break;
            case IR_I32: ((int32_t *)t->data)[k] = (int32_t)(lo + (int64_t)(rnd() % (uint64_t)(hi - lo))); break;
            case IR_I64: ((int64_t *)t->data)[k] = lo + (int64_t)(rnd() % (uint64_t)(hi - lo)); break;
            case IR_I8: ((int8_t *)t->data)[k] = (int8_t)((int)(rnd() % 255) - 127); break; /* int8 weights */
            default: ((uint8_t *)t->data)[k] = rnd() & 1; break;
            }
        }
    }
}

static inline void bind_free(Binding *bd)
{
    for (int i = 0; i < bd->n; i++)
        free(bd->t[i].data);
}

/* The index of leaf in bd, or -1. */
static inline int bind_index(const Binding *bd, const IrNode *leaf)
{
    for (int i = 0; i < bd->n; i++)
        if (bd->leaf[i] == leaf)
            return i;
    return -1;
}

/* ir_interp's callback: ctx is a Binding. */
static inline int bind_cb(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    Binding *bd = ctx;
    int i = bind_index(bd, leaf);
    if (i < 0)
        return -1;
    *out = bd->t[i];
    return 0;
}

static inline XtcDType xdt(IrDType t)
{
    static const XtcDType map[] = {[IR_F32] = XTC_F32, [IR_I32] = XTC_I32, [IR_I64] = XTC_I64, [IR_BOOL] = XTC_BOOL,
                                   [IR_I8] = XTC_I8};
    return map[t];
}

/* Hands leaf i of bd to the session: an input with its dtype, a parameter or buffer as a weight.
 * Returns the session's status (no assertion: usable off the main thread). */
static inline int bind_leaf(XtcSession *s, const Binding *bd, int i)
{
    const IrNode *n = bd->leaf[i];
    const IrHostTensor *t = &bd->t[i];
    if (n->op == IR_INPUT)
        return xtc_session_set_input(s, n->s, xdt(t->dtype), t->rank, t->shape, t->data);
    return t->dtype == IR_I8 ? xtc_session_set_weight_i8(s, n->s, t->rank, t->shape, t->data)
                             : xtc_session_set_weight(s, n->s, t->rank, t->shape, t->data);
}

/* Hands every leaf of the binding to the session; what (or NULL) heads a failure's message. */
static inline void bind_session(XtcSession *s, const Binding *bd, const char *what)
{
    for (int i = 0; i < bd->n; i++)
        ck_assert_msg(bind_leaf(s, bd, i) == XTC_OK, "%s%sbinding '%s': %s", what ? what : "", what ? ": " : "",
                      bd->leaf[i]->s, xtc_session_error(s));
}

/* Binds every module input from a parity case's inputs file (converting integer and bool
 * types). Returns 0, or -1 with a message in err. */
static inline int bind_inputs(XtcSession *s, const XtcModule *m, RtStFile *in, char *err, size_t n)
{
    for (int i = 0; i < xtc_module_count(m, XTC_INPUT); i++) {
        XtcTensorInfo info;
        xtc_module_tensor(m, XTC_INPUT, i, &info);
        const RtStTensor *t = rt_st_find(in, info.name);
        if (!t) {
            snprintf(err, n, "inputs file lacks '%s'", info.name);
            return -1;
        }
        int64_t numel = rt_st_numel(t);
        void *data = malloc((size_t)(numel ? numel : 1) * 8);
        XtcDType dt = info.dtype;
        int rc = info.dtype == XTC_F32 ? rt_st_to_f32(t, data, err, n) : rt_st_to_i64(t, data, err, n);
        if (!rc && info.dtype == XTC_BOOL)
            for (int64_t k = 0; k < numel; k++)
                ((uint8_t *)data)[k] = ((int64_t *)data)[k] != 0;
        else if (info.dtype != XTC_F32)
            dt = XTC_I64;
        if (!rc && xtc_session_set_input(s, info.name, dt, t->rank, t->shape, data) != XTC_OK) {
            snprintf(err, n, "%s", xtc_session_error(s));
            rc = -1;
        }
        free(data);
        if (rc)
            return -1;
    }
    return 0;
}

/* ---- the interpreter's outputs ---- */

/* g's outputs from the interpreter on the leaves bind supplies, every f32 value rounded by round
 * (NULL: none; see ir_interp_rounded). Calloc'ed; free with free_outputs. */
static inline IrHostTensor *interp_outputs(const IrGraph *g, IrBindFn bind, void *ctx, IrRoundFn round,
                                           const char *name)
{
    IrHostTensor *ref = calloc((size_t)g->noutputs + 1, sizeof *ref);
    char err[512];
    ck_assert_msg(ir_interp_rounded(g, bind, ctx, round, NULL, ref, err, sizeof err) == 0, "interp%s%s: %s",
                  name ? " " : "", name ? name : "", err);
    return ref;
}

static inline void free_outputs(const IrGraph *g, IrHostTensor *ref)
{
    for (int o = 0; o < g->noutputs; o++)
        ir_host_free(&ref[o]);
    free(ref);
}

/* ---- comparison ---- */

static inline double value_at(const void *data, XtcDType t, int64_t i)
{
    switch (t) {
    case XTC_F32: return ((const float *)data)[i];
    case XTC_I32: return ((const int32_t *)data)[i];
    case XTC_I64: return (double)((const int64_t *)data)[i];
    case XTC_I8: return ((const int8_t *)data)[i];
    default: return ((const uint8_t *)data)[i];
    }
}

/* Asserts that got has ref's dtype, rank and shape. Returns its element count, and in *maxabs
 * the largest finite |ref| (what a relative tolerance scales with). */
static inline int64_t compare_layout(const char *what, const IrHostTensor *ref, const XtcTensor *got, double *maxabs)
{
    expect_msg(xdt(ref->dtype) == got->dtype, "%s: dtype %s, expected %s", what, xtc_dtype_name(got->dtype),
               ir_dtype_name(ref->dtype));
    expect_msg(ref->rank == got->rank, "%s: rank %d, expected %d", what, got->rank, ref->rank);
    int64_t numel = 1;
    for (int d = 0; d < ref->rank; d++) {
        expect_msg(ref->shape[d] == got->shape[d], "%s: dim %d is %lld, expected %lld", what, d,
                   (long long)got->shape[d], (long long)ref->shape[d]);
        numel *= ref->shape[d];
    }
    *maxabs = 0;
    for (int64_t i = 0; i < numel; i++) {
        double e = value_at(ref->data, got->dtype, i);
        if (isfinite(e) && fabs(e) > *maxabs)
            *maxabs = fabs(e);
    }
    return numel;
}

/* Asserts every one of the numel elements of got within tol of ref's. A NaN matches a NaN and an
 * infinity itself; where overflow > 0, a computed infinity also matches a reference at least that
 * large (past a 16-bit format's range). note follows what in a failure's message. Returns the
 * first element with the largest difference among those checked (-1: none). */
static inline int64_t compare_values(const char *what, const char *note, const IrHostTensor *ref,
                                     const XtcTensor *got, int64_t numel, double tol, double overflow)
{
    int64_t worst = -1;
    double worst_diff = -1;
    for (int64_t i = 0; i < numel; i++) {
        double e = value_at(ref->data, got->dtype, i), a = value_at(got->data, got->dtype, i);
        if (isnan(e) && isnan(a))
            continue;
        if (isinf(e) && a == e)
            continue;
        if (overflow > 0 && isinf(a) && fabs(e) >= overflow)
            continue;
        if (fabs(a - e) > worst_diff) {
            worst_diff = fabs(a - e);
            worst = i;
        }
        expect_msg(fabs(a - e) <= tol, "%s%s: element %lld is %.9g, expected %.9g (tolerance %.3g)", what, note,
                   (long long)i, a, e, tol);
    }
    return worst;
}

/* compare_layout and compare_values: f32 within atol + rtol max|ref|, other types exactly. */
static inline void compare_within(const char *what, const IrHostTensor *ref, const XtcTensor *got, double atol,
                                  double rtol)
{
    double maxabs;
    int64_t numel = compare_layout(what, ref, got, &maxabs);
    compare_values(what, "", ref, got, numel, got->dtype == XTC_F32 ? atol + rtol * maxabs : 0, 0);
}

#endif
