/* op_cases.h: the one table of op cases for the backend suites (as ggml's test-backend-ops).
 *
 * Each case is a graph builder over two symbolic sizes (b, n) holding several ops; the suites
 * loop over the rows for their backend and check every output against the reference interpreter
 * (ir/interp.c) on random inputs: test_codegen (OC_CPU: LLVM, 1 and 2 threads, at two sizes and
 * the edge sizes 1 and 0), test_cuda (OC_CUDA: the CUDA emulator at six ragged sizes, as built and
 * after the pass pipeline, then with bf16 and fp16 storage, and on a GPU where there is one) and
 * test_cuda_mma (OC_MMA: the tensor-core matmuls, interpreter on rounded operands; OC_MMA16: those
 * of operands stored in 16 bits, with --dtype bf16 and fp16 only). Inputs are
 * drawn by harness_bind.h (bind_random: f32 uniform in [-1, 1) or the suite's storage format,
 * integers by name, int_range_by_name); ops that need a domain get it inside the graph
 * (positive() for log, sqrt, rsqrt, recip, div). Tolerances: f32 within OC_ATOL + rtol max|ref|
 * (the row's rtol; integers and bools exact); the 16-bit formats by their own units in the suite.
 *
 * Adding an op (or a fused op made by a pass):
 *   1. ir/ops.def: its row (name, arity, flags, attributes, shape rule); ir/shape.c: the rule,
 *      which the builder and ir/verify.c both run; a builder function in ir/ir.h if it has
 *      attributes.
 *   2. ir/interp.c: its semantics (the reference every backend is checked against).
 *   3. ir/autodiff.c: its gradient rule (test_autodiff checks it by central differences), or a
 *      refusal naming it.
 *   4. The backends: the LLVM lowering (codegen/, cg_llvm_backend.supports) and a CUDA kernel
 *      row in codegen/cuda/cg_cuda_ops.c (cg_cuda_backend.supports); test_every_op_has_a_lowering
 *      and test_every_op_has_a_kernel fail until both exist.
 *   5. Here: use it in a case (extend the builder of its kind, or add a row to OP_CASES with
 *      the backends that run it); op_cases_missing() makes test_every_op_has_a_case fail in
 *      each backend suite, naming the op, until a case for that backend uses it. An op no
 *      backend lowers (a front-end-only or pseudo op) gets a line in op_case_exempt() instead,
 *      with its reason. A fused op need not be built by hand for CUDA: its cases run the pass
 *      pipeline too, and the op counts as used when the pipeline makes it from a case.
 *   6. Passes that make it (passes/), with their golden files (test_passes, test_fuse).
 *
 * Include after harness_bind.h (BuildFn, harness_new_graph). */
#ifndef XTC_TESTS_OP_CASES_H
#define XTC_TESTS_OP_CASES_H

#include "ir.h"
#include "harness_drive.h"
#include "passes.h"

#include <check.h>
#include <float.h>
#include <string.h>

/* the backends a case runs on */
enum { OC_CPU = 1, OC_CUDA = 2, OC_MMA = 4, OC_MMA16 = 8 };
/* OC_EMPTY: also run at sizes with b or n = 0 (n - 1, slices and maxima over an empty axis have no
 * value at 0 in the others); OC_ONCE: fixed sizes, run at one size only; OC_FUSE: (tensor cores)
 * checked after the pass pipeline, which must fuse its matmul epilogues */
enum { OC_EMPTY = 1, OC_ONCE = 2, OC_FUSE = 4 };

#define OC_ATOL 1e-5

typedef struct {
    const char *name;
    BuildFn build;
    unsigned backends; /* OC_CPU | OC_CUDA | OC_MMA | OC_MMA16 */
    unsigned flags;    /* OC_EMPTY | OC_ONCE | OC_FUSE */
    double rtol;       /* f32: |got - ref| <= OC_ATOL + rtol max|ref| */
    const char *why;   /* why some backend does not run it */
} OpCase;

static inline IrNode *input(IrGraph *g, const char *name, IrDType t, int rank, const IrDim *shape)
{
    return ir_input(g, name, t, rank, shape);
}

static inline void out(IrGraph *g, const char *name, IrNode *n) { ir_output(g, name, n); }

static inline IrNode *positive(IrGraph *g, IrNode *x)
{
    return ir_binary(g, IR_ADD, ir_unary(g, IR_ABS, x), ir_const(g, 0.5, IR_F32));
}

/* ---- the builders ---- */

static void build_unary(IrGraph *g, IrDim b, IrDim n)
{
    IrDim s[] = {b, n, ir_dim(17)};
    IrNode *x = input(g, "x", IR_F32, 3, s);
    static const IrOp any[] = {IR_NEG, IR_EXP, IR_TANH, IR_SIGMOID, IR_GELU, IR_ERF, IR_RELU, IR_SIN, IR_COS, IR_ABS};
    for (size_t i = 0; i < sizeof any / sizeof any[0]; i++)
        out(g, ir_ops[any[i]].name, ir_unary(g, any[i], x));
    static const IrOp pos[] = {IR_LOG, IR_SQRT, IR_RSQRT, IR_RECIP};
    IrNode *p = positive(g, x);
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        out(g, ir_ops[pos[i]].name, ir_unary(g, pos[i], p));
    /* a long contiguous row, and exp over a wide range (overflow to inf, underflow to 0) */
    IrDim s2[] = {ir_dim(130)};
    IrNode *v = input(g, "v", IR_F32, 1, s2);
    out(g, "exp_wide", ir_unary(g, IR_EXP, ir_binary(g, IR_MUL, v, ir_const(g, 60.0, IR_F32))));
    out(g, "gelu_wide", ir_unary(g, IR_GELU, ir_binary(g, IR_MUL, v, ir_const(g, 3.0, IR_F32))));
    /* erf past its clamp (|x| >= 10 is 1 in float) and at +-inf (the f32 product overflows) */
    out(g, "erf_wide", ir_unary(g, IR_ERF, ir_binary(g, IR_MUL, v, ir_const(g, 20.0, IR_F32))));
    IrNode *huge = ir_binary(g, IR_MUL, ir_binary(g, IR_MUL, v, ir_const(g, 1e30, IR_F32)), ir_const(g, 1e30, IR_F32));
    out(g, "erf_inf", ir_unary(g, IR_ERF, huge));
    out(g, "sigmoid_wide", ir_unary(g, IR_SIGMOID, ir_binary(g, IR_MUL, v, ir_const(g, 50.0, IR_F32))));
    out(g, "log_zero", ir_unary(g, IR_LOG, ir_unary(g, IR_RELU, v))); /* -inf where v <= 0 */
}

static void build_binary(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(33)}, sy[] = {n, ir_dim(33)}, sz[] = {b, ir_dim(1), ir_dim(1)};
    IrNode *x = input(g, "x", IR_F32, 3, sx), *y = input(g, "y", IR_F32, 2, sy), *z = input(g, "z", IR_F32, 3, sz);
    IrNode *w = input(g, "w", IR_F32, 0, NULL);
    IrDim sc[] = {b, ir_dim(1), ir_dim(33)};
    IrNode *c = input(g, "c", IR_F32, 3, sc);
    out(g, "add", ir_binary(g, IR_ADD, x, y));
    out(g, "add_mid", ir_binary(g, IR_ADD, x, c)); /* broadcast in the middle */
    out(g, "sub", ir_binary(g, IR_SUB, z, x));
    out(g, "mul", ir_binary(g, IR_MUL, x, w));
    out(g, "div", ir_binary(g, IR_DIV, x, positive(g, y)));
    IrNode *mx = ir_binary(g, IR_MAX, x, y);
    out(g, "max", mx);
    out(g, "min", ir_binary(g, IR_MIN, z, x));
    IrNode *p = ir_binary(g, IR_LT, x, y), *q = ir_binary(g, IR_LE, z, x);
    out(g, "lt", p);
    out(g, "le", q);
    out(g, "eq", ir_binary(g, IR_EQ, x, mx));
    out(g, "and", ir_binary(g, IR_AND, p, q));
    out(g, "or", ir_binary(g, IR_OR, p, q));
    out(g, "not", ir_unary(g, IR_NOT, p));
    out(g, "where", ir_where(g, p, x, y));
    out(g, "where_bcast", ir_where(g, ir_binary(g, IR_LT, y, ir_const(g, 0, IR_F32)), z, w));
    /* integers, with broadcasting */
    IrDim si[] = {b, n}, sj[] = {n};
    IrNode *i = input(g, "i", IR_I32, 2, si), *j = input(g, "j", IR_I32, 1, sj);
    IrNode *den = input(g, "den", IR_I32, 1, sj), *k = input(g, "k", IR_I64, 2, si);
    out(g, "iadd", ir_binary(g, IR_ADD, i, j));
    out(g, "isub", ir_binary(g, IR_SUB, i, j));
    out(g, "imul", ir_binary(g, IR_MUL, i, j));
    out(g, "idiv", ir_binary(g, IR_DIV, i, den));
    out(g, "imax", ir_binary(g, IR_MAX, i, j));
    out(g, "imin", ir_binary(g, IR_MIN, i, j));
    out(g, "ilt", ir_binary(g, IR_LT, i, j));
    out(g, "ieq", ir_binary(g, IR_EQ, i, j));
    out(g, "iwhere", ir_where(g, ir_binary(g, IR_LE, i, j), i, j));
    out(g, "ldiv", ir_binary(g, IR_DIV, ir_binary(g, IR_ADD, k, k), ir_cast(g, den, IR_I64)));
    /* casts between every kind */
    IrNode *x3 = ir_binary(g, IR_MUL, x, ir_const(g, 3.0, IR_F32));
    out(g, "f2i", ir_cast(g, x3, IR_I32));
    out(g, "f2l", ir_cast(g, x3, IR_I64));
    out(g, "f2b", ir_cast(g, ir_cast(g, ir_cast(g, x3, IR_I32), IR_F32), IR_BOOL));
    out(g, "i2f", ir_cast(g, i, IR_F32));
    out(g, "i2l", ir_cast(g, i, IR_I64));
    out(g, "l2i", ir_cast(g, k, IR_I32));
    out(g, "l2f", ir_cast(g, k, IR_F32));
    out(g, "i2b", ir_cast(g, i, IR_BOOL));
    out(g, "b2f", ir_cast(g, p, IR_F32));
    out(g, "b2l", ir_cast(g, q, IR_I64));
    out(g, "b2i", ir_cast(g, q, IR_I32));
}

static void build_reduce(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(17)}, ss[] = {b, n, ir_dim(130)}, sv[] = {ir_dim(65)}, s4[] = {b, n, ir_dim(5), ir_dim(1)};
    IrNode *x = input(g, "x", IR_F32, 3, sx);
    char name[32];
    for (int axis = 0; axis < 3; axis++) {
        snprintf(name, sizeof name, "sum%d", axis);
        out(g, name, ir_reduce(g, IR_SUM, x, axis));
        snprintf(name, sizeof name, "max%d", axis);
        out(g, name, ir_reduce(g, IR_RMAX, x, axis));
    }
    IrNode *x4 = input(g, "x4", IR_F32, 4, s4);
    out(g, "sum_trailing_one", ir_reduce(g, IR_SUM, x4, 2)); /* contiguous: the trailing dim is 1 */
    out(g, "max_trailing_one", ir_reduce(g, IR_RMAX, x4, 2));
    IrNode *big = input(g, "s", IR_F32, 3, ss);
    out(g, "softmax", ir_softmax(g, big));
    out(g, "sum_long", ir_reduce(g, IR_SUM, big, 2));
    out(g, "max_long", ir_reduce(g, IR_RMAX, big, 2));
    IrNode *v = input(g, "v", IR_F32, 1, sv);
    out(g, "softmax1", ir_softmax(g, v));
    out(g, "sum_v", ir_reduce(g, IR_SUM, v, 0));
    out(g, "softmax_x", ir_softmax(g, x));
    /* even inner sizes: neighbouring outputs in pairs (axis 0, outer 1), the axis in row chunks
     * (axis 1 where n >= 16; several chunks at n = 130) */
    out(g, "sum_even0", ir_reduce(g, IR_SUM, big, 0));
    out(g, "max_even0", ir_reduce(g, IR_RMAX, big, 0));
    out(g, "sum_even1", ir_reduce(g, IR_SUM, big, 1));
    /* the ops defined by sorting each row; ties and masked entries (-FLT_MAX) included */
    IrNode *ties = ir_binary(g, IR_MUL, ir_unary(g, IR_RELU, x), ir_const(g, 0.0, IR_F32));
    IrNode *some = ir_where(g, ir_binary(g, IR_LT, x, ir_const(g, -1.0, IR_F32)), ir_const(g, -3.4028234663852886e+38, IR_F32), x);
    out(g, "entmax15", ir_entmax15(g, x));
    out(g, "entmax15_masked", ir_entmax15(g, some));
    out(g, "entmax15_long", ir_entmax15(g, big));
    out(g, "entmax15_ties", ir_entmax15(g, ties));
    out(g, "kth1", ir_kth_largest(g, x, 1));
    out(g, "kth5", ir_kth_largest(g, x, 5));
    out(g, "kth_ties", ir_kth_largest(g, ties, 3));
    out(g, "kth_short", ir_kth_largest(g, x, 18)); /* beyond the row: -inf */
    out(g, "kth_long", ir_kth_largest(g, big, 64));
    /* a masked softmax as attention has it: large negative values */
    out(g, "softmax_masked", ir_softmax(g, ir_where(g, ir_binary(g, IR_LT, x, ir_const(g, 0, IR_F32)),
                                                      ir_const(g, -3.4e38, IR_F32), x)));
}

/* The ops that order a row (cg_llvm_sort.c): k-th largest with k = 1 (the maximum), inside the
 * row, equal to its length (the minimum) and beyond it (-inf); many ties (relu's zeros); masked
 * entries (-FLT_MAX) with fully masked rows; sparse top-k attention's threshold; entmax15 on
 * such rows, on long rows and on a vector. */
static void build_order(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(17)}, sm[] = {b, n, ir_dim(1)}, ss[] = {b, n, ir_dim(130)}, sv[] = {ir_dim(65)};
    IrNode *x = input(g, "x", IR_F32, 3, sx), *fill = ir_const(g, -FLT_MAX, IR_F32);
    IrNode *keep = ir_binary(g, IR_AND, input(g, "mk", IR_BOOL, 3, sx), input(g, "mr", IR_BOOL, 3, sm));
    IrNode *masked = ir_where(g, keep, x, fill);
    out(g, "kth1", ir_kth_largest(g, x, 1));
    out(g, "kth5_masked", ir_kth_largest(g, masked, 5));
    out(g, "kth17", ir_kth_largest(g, x, 17));
    out(g, "kth20", ir_kth_largest(g, x, 20));
    out(g, "kth_ties", ir_kth_largest(g, ir_unary(g, IR_RELU, x), 12));
    IrNode *kth = ir_kth_largest(g, masked, 3);
    out(g, "topk", ir_where(g, ir_binary(g, IR_LT, masked, kth), fill, masked));
    out(g, "entmax", ir_entmax15(g, x));
    out(g, "entmax_masked", ir_entmax15(g, masked));
    IrNode *s = input(g, "s", IR_F32, 3, ss);
    out(g, "kth_long", ir_kth_largest(g, s, 7));
    out(g, "entmax_long", ir_entmax15(g, ir_binary(g, IR_MUL, s, ir_const(g, 4, IR_F32))));
    out(g, "entmax_v", ir_entmax15(g, input(g, "v", IR_F32, 1, sv)));
}

/* The paths of the CUDA copy kernels (codegen/cuda/cg_cuda_ops.c, emit_copy): 16-byte vectors
 * where the last axis is kept and every offset is a multiple of 16 bytes (statically: the heads
 * split and merge with rows of 16, a last-axis slice window at 8 of 24; at run time: rows of
 * 4n, n even in bf16, and a window at 2n), the element loop where not (rows of 6, a window at
 * 1 of 7), and the tiled transpose of the last two axes (f32, i64, bool; sizes not multiples
 * of 32; batch dims of the output and the input). */
static void build_copies(IrGraph *g, IrDim b, IrDim n)
{
    IrDim n2 = ir_dim_add(n, n), n4 = ir_dim_add(n2, n2);
    static const int heads[4] = {0, 2, 1, 3}, swap3[3] = {1, 0, 2}, t3[3] = {0, 2, 1}, t4[4] = {0, 1, 3, 2};
    IrDim sh[] = {b, n, ir_dim(4), ir_dim(16)}, sr[] = {b, n, ir_dim(3), ir_dim(6)}, s4[] = {b, ir_dim(3), n4};
    IrNode *split = ir_permute(g, input(g, "x", IR_F32, 4, sh), heads);
    out(g, "split", split);
    out(g, "merge", ir_permute(g, ir_unary(g, IR_NEG, split), heads));
    out(g, "split_ragged", ir_permute(g, input(g, "xr", IR_F32, 4, sr), heads));
    out(g, "swap_4n", ir_permute(g, input(g, "x4", IR_F32, 3, s4), swap3));
    IrDim sw[] = {b, n, ir_dim(24)}, sw2[] = {b, ir_dim(3), ir_dim_addc(n2, 8)}, sw3[] = {b, n, ir_dim(7)};
    out(g, "window", ir_slice(g, input(g, "w", IR_F32, 3, sw), 2, ir_dim(8), ir_dim(16)));
    out(g, "window_2n", ir_slice(g, input(g, "w2", IR_F32, 3, sw2), 2, n2, ir_dim(8)));
    out(g, "window_odd", ir_slice(g, input(g, "w3", IR_F32, 3, sw3), 2, ir_dim(1), ir_dim(4)));
    IrDim sq[] = {b, ir_dim(2), n, ir_dim(16)}, se[] = {b, ir_dim(1), ir_dim(16)}, te[] = {b, n, ir_dim(16)};
    out(g, "rows_of_q", ir_slice(g, input(g, "q", IR_F32, 4, sq), 1, ir_dim(1), ir_dim(1)));
    out(g, "expand_rows", ir_expand(g, input(g, "e", IR_F32, 3, se), 3, te));
    IrDim st1[] = {b, n, ir_dim(45)}, st2[] = {b, ir_dim(3), ir_dim(40), n}, sti[] = {n, ir_dim(33)}, stb[] = {b, n, ir_dim(5)};
    out(g, "transpose_tiles", ir_permute(g, input(g, "t1", IR_F32, 3, st1), t3));
    out(g, "transpose_batch", ir_permute(g, input(g, "t2", IR_F32, 4, st2), t4));
    static const int t2[2] = {1, 0};
    out(g, "transpose_i64", ir_permute(g, input(g, "ti", IR_I64, 2, sti), t2));
    out(g, "transpose_bool", ir_permute(g, input(g, "tb", IR_BOOL, 3, stb), t3));
}

static void build_move(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(5), ir_dim(3)};
    IrNode *x = input(g, "x", IR_F32, 4, sx);
    static const int perms[3][4] = {{0, 2, 1, 3}, {3, 2, 1, 0}, {1, 0, 3, 2}};
    char name[32];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "permute%d", i);
        out(g, name, ir_permute(g, x, perms[i]));
    }
    /* transposes (the input's last dim to the output's second-to-last, in f32): blocks of VW x VW
     * (16 with AVX-512, 8 with AVX2) through registers, the rest element by element: 37 rows
     * (two strips of 16 and one of 5) by n columns (two blocks and 1 at n = 33); 18 rows by 20
     * with two dims outside, one of them read from the input's third; and 40 by 3 */
    IrDim st1[] = {b, n, ir_dim(37)}, st2[] = {b, ir_dim(20), n, ir_dim(18)}, st3[] = {b, ir_dim(3), n, ir_dim(40)};
    static const int tp1[3] = {0, 2, 1}, tp2[4] = {0, 2, 3, 1}, tp3[4] = {2, 0, 3, 1};
    out(g, "transpose", ir_permute(g, input(g, "xt1", IR_F32, 3, st1), tp1));
    out(g, "transpose_outer", ir_permute(g, input(g, "xt2", IR_F32, 4, st2), tp2));
    out(g, "transpose_narrow", ir_permute(g, input(g, "xt3", IR_F32, 4, st3), tp3));
    out(g, "slice_n", ir_slice(g, x, 1, ir_dim(1), ir_dim_addc(n, -1)));
    out(g, "slice_last", ir_slice(g, x, 3, ir_dim(1), ir_dim(2)));
    IrDim sa[] = {b, n, ir_dim(4)}, sc[] = {b, ir_dim(3), ir_dim(4)}, sa2[] = {b, n, ir_dim(7)};
    IrNode *a = input(g, "a", IR_F32, 3, sa), *c = input(g, "c", IR_F32, 3, sc);
    IrNode *cat = ir_concat(g, a, c, 1);
    out(g, "concat1", cat);
    out(g, "slice_sym", ir_slice(g, cat, 1, n, ir_dim(3)));
    out(g, "concat2", ir_concat(g, a, input(g, "a2", IR_F32, 3, sa2), 2));
    out(g, "concat0", ir_concat(g, a, a, 0));
    IrDim si[] = {b, n};
    out(g, "concat_int", ir_concat(g, input(g, "ci", IR_I64, 2, si), input(g, "cj", IR_I64, 2, si), 1));
    IrDim se[] = {ir_dim(1), n, ir_dim(1)}, te[] = {b, n, ir_dim(65)};
    out(g, "expand", ir_expand(g, input(g, "e", IR_F32, 3, se), 3, te));
    IrDim sv[] = {ir_dim(7)}, tv[] = {b, ir_dim(3), ir_dim(7)};
    out(g, "expand_rank", ir_expand(g, input(g, "ev", IR_F32, 1, sv), 3, tv));
    IrDim sbool[] = {n, ir_dim(1)}, tbool[] = {n, n};
    out(g, "expand_bool", ir_expand(g, input(g, "eb", IR_BOOL, 2, sbool), 2, tbool));
    IrDim sr[] = {b, n, ir_dim(15)};
    IrNode *r = ir_reshape(g, x, 3, sr);
    out(g, "reshape", r);
    out(g, "reshape_sum", ir_reduce(g, IR_SUM, r, 2));
    /* gather from a parameter table, with i64 and i32 ids */
    IrDim st[] = {ir_dim(11), ir_dim(17)};
    IrNode *table = ir_param(g, "emb", 2, st);
    out(g, "gather", ir_gather(g, table, input(g, "tok", IR_I64, 2, si)));
    out(g, "gather32", ir_gather(g, table, input(g, "tok32", IR_I32, 2, si)));
    IrDim sg[] = {b, n, ir_dim(70)};
    out(g, "gather_grad",
        ir_gather_grad(g, input(g, "gsrc", IR_F32, 3, sg), input(g, "tokg", IR_I64, 2, si), ir_dim(11)));
    /* leaves computed by kernels */
    out(g, "arange", ir_arange(g, n, ir_dim_addc(n, 2), IR_F32));
    out(g, "arange_i", ir_arange(g, ir_dim(0), n, IR_I64));
    out(g, "arange_i32", ir_arange(g, ir_dim(-3), ir_dim(7), IR_I32));
    out(g, "relpos_causal", ir_relpos(g, n, n, 32, 128, 1));
    out(g, "relpos_bidir", ir_relpos(g, n, ir_dim_addc(n, 2), 16, 20, 0));
    out(g, "relpos_small", ir_relpos(g, n, n, 8, 5, 1));
    IrNode *seed = input(g, "seed", IR_I64, 0, NULL);
    out(g, "rand", ir_rand(g, seed, x, 3));
    out(g, "rand_other_stream", ir_rand(g, seed, a, 4));
    out(g, "const_i", ir_const(g, 7.9, IR_I32));
    out(g, "const_l", ir_const(g, -3.5, IR_I64));
    out(g, "const_b", ir_const(g, 2.0, IR_BOOL));
    out(g, "const_f", ir_const(g, -1.25, IR_F32));
    IrDim sb[] = {ir_dim(5)};
    IrNode *inv = ir_buffer(g, "inv_freq", 1, sb);
    out(g, "buffer_use", ir_binary(g, IR_MUL, inv, ir_arange(g, ir_dim(1), ir_dim(5), IR_F32)));
}

/* the forms every matmul backend has: B as stored and transposed, batch dims broadcast, K below
 * one step, M, N and K ragged, a symbolic K, 1 x 1; returns a, the [b, n, 17] operand */
static IrNode *matmul_forms(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sa[] = {b, n, ir_dim(17)}, sw[] = {ir_dim(17), ir_dim(33)}, swt[] = {ir_dim(33), ir_dim(17)};
    IrNode *a = input(g, "a", IR_F32, 3, sa);
    out(g, "linear", ir_matmul(g, a, ir_param(g, "w", 2, sw), 0));
    out(g, "linear_t", ir_matmul(g, a, ir_param(g, "wt", 2, swt), 1));
    IrDim sq[] = {b, ir_dim(4), n, ir_dim(7)}, sk[] = {b, ir_dim(4), ir_dim(7), n};
    IrNode *q = input(g, "q", IR_F32, 4, sq);
    out(g, "scores", ir_matmul(g, q, input(g, "k", IR_F32, 4, sk), 0)); /* K = 7 < 16 */
    out(g, "scores_t", ir_matmul(g, q, input(g, "k2", IR_F32, 4, sq), 1));
    IrDim su[] = {b, ir_dim(1), n, ir_dim(9)}, sv[] = {ir_dim(3), ir_dim(9), ir_dim(5)};
    out(g, "bcast", ir_matmul(g, input(g, "u", IR_F32, 4, su), input(g, "v", IR_F32, 3, sv), 0));
    IrDim s1[] = {ir_dim(65), ir_dim(130)}, s2[] = {ir_dim(130), ir_dim(7)}, s3[] = {ir_dim(70), ir_dim(130)};
    IrNode *big = input(g, "big", IR_F32, 2, s1);
    out(g, "ragged", ir_matmul(g, big, input(g, "big2", IR_F32, 2, s2), 0));
    out(g, "ragged_t", ir_matmul(g, big, input(g, "big3", IR_F32, 2, s3), 1));
    IrDim sl[] = {ir_dim(130), n}, sr[] = {n, ir_dim(129)};
    out(g, "symbolic_k", ir_matmul(g, input(g, "l", IR_F32, 2, sl), input(g, "r", IR_F32, 2, sr), 0));
    IrDim one[] = {ir_dim(1), ir_dim(1)};
    out(g, "tiny", ir_matmul(g, input(g, "t1", IR_F32, 2, one), input(g, "t2", IR_F32, 2, one), 0));
    return a;
}

static void build_matmul(IrGraph *g, IrDim b, IrDim n)
{
    IrNode *a = matmul_forms(g, b, n);
    /* GLU, value * act(gate) over the halves of one product: the pipeline makes each a matmul
     * with a two-part epilogue (ir_epilogue_parts), B transposed (with a bias) and as stored */
    IrDim sgl[] = {ir_dim(74), ir_dim(17)}, sglb[] = {ir_dim(74)}, sgln[] = {ir_dim(17), ir_dim(80)};
    IrNode *proj = ir_binary(g, IR_ADD, ir_matmul(g, a, ir_param(g, "wglu", 2, sgl), 1), ir_param(g, "bglu", 1, sglb));
    out(g, "glu_t", ir_binary(g, IR_MUL, ir_slice(g, proj, -1, ir_dim(0), ir_dim(37)),
                              ir_unary(g, IR_GELU, ir_slice(g, proj, -1, ir_dim(37), ir_dim(37)))));
    IrNode *proj2 = ir_matmul(g, a, ir_param(g, "wglu2", 2, sgln), 0);
    out(g, "glu", ir_binary(g, IR_MUL, ir_unary(g, IR_SIGMOID, ir_slice(g, proj2, -1, ir_dim(0), ir_dim(40))),
                            ir_slice(g, proj2, -1, ir_dim(40), ir_dim(40))));
    /* transposed, past one k block (KC = 256): the packed blocks start inside the rows */
    IrDim sd[] = {ir_dim(13), ir_dim(300)}, sd2[] = {ir_dim(40), ir_dim(300)};
    out(g, "deep_t", ir_matmul(g, input(g, "deep", IR_F32, 2, sd), input(g, "deep2", IR_F32, 2, sd2), 1));
    /* items past two row blocks of MC = 192 rows (the last one 17 rows, a partial micro tile),
     * k past KC: 4 batch items of 401 rows each, so that rows are not split across items */
    IrDim st[] = {ir_dim(4), ir_dim(401), ir_dim(260)}, st2[] = {ir_dim(260), ir_dim(40)}, st3[] = {ir_dim(40), ir_dim(260)};
    IrNode *tall = input(g, "tall", IR_F32, 3, st);
    out(g, "tall", ir_matmul(g, tall, input(g, "tall2", IR_F32, 2, st2), 0));
    out(g, "tall_t", ir_matmul(g, tall, input(g, "tall3", IR_F32, 2, st3), 1));
    /* the matrix-vector path (batch x m <= 4, B transposed): a weight shared by 2 one-row
     * items, k past KC and not a multiple of the vector width, 37 columns (2 blocks and a part);
     * and one B per batch index (3 one-row items, as attention scores of one query) */
    IrDim sg[] = {ir_dim(2), ir_dim(1), ir_dim(300)}, sgw[] = {ir_dim(37), ir_dim(300)};
    out(g, "gemv_t", ir_matmul(g, input(g, "gv", IR_F32, 3, sg), input(g, "gvw", IR_F32, 2, sgw), 1));
    IrDim sgq[] = {ir_dim(3), ir_dim(1), ir_dim(40)}, sgk[] = {ir_dim(3), ir_dim(21), ir_dim(40)};
    out(g, "gemv_batched_t", ir_matmul(g, input(g, "gq", IR_F32, 3, sgq), input(g, "gk", IR_F32, 3, sgk), 1));
    /* 4 rows (2 batch indices of 2) against one weight, each weight element loaded once for all
     * of them; 3 rows of one batch index; 2 rows per batch index against its own B */
    IrDim sg4[] = {ir_dim(2), ir_dim(2), ir_dim(70)}, sg4w[] = {ir_dim(37), ir_dim(70)};
    out(g, "gemv4_t", ir_matmul(g, input(g, "gv4", IR_F32, 3, sg4), input(g, "gv4w", IR_F32, 2, sg4w), 1));
    IrDim sg3[] = {ir_dim(1), ir_dim(3), ir_dim(300)};
    out(g, "gemv3_t", ir_matmul(g, input(g, "gv3", IR_F32, 3, sg3), input(g, "gvw", IR_F32, 2, sgw), 1));
    IrDim sgq2[] = {ir_dim(2), ir_dim(2), ir_dim(40)}, sgk2[] = {ir_dim(2), ir_dim(21), ir_dim(40)};
    out(g, "gemv_batched2_t", ir_matmul(g, input(g, "gq2", IR_F32, 3, sgq2), input(g, "gk2", IR_F32, 3, sgk2), 1));
}

/* rand_like (dropout masks): the interpreter's bits in every backend, two streams, and the
 * dropout pattern the lowering builds from it */
static void build_rand(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(37)};
    IrNode *x = input(g, "x", IR_F32, 3, sx), *seed = input(g, "seed", IR_I64, 0, NULL);
    IrNode *u = ir_rand(g, seed, x, 0);
    out(g, "u", u);
    out(g, "u7", ir_rand(g, seed, x, 7));
    IrNode *drop = ir_binary(g, IR_LT, u, ir_const(g, 0.25, IR_F32));
    out(g, "dropped", ir_where(g, drop, ir_const(g, 0, IR_F32), ir_binary(g, IR_MUL, x, ir_const(g, 4.0 / 3, IR_F32))));
}

static void build_xent(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sz[] = {b, n, ir_dim(13)}, st[] = {b, n}, sz2[] = {b, n, ir_dim(100)};
    IrNode *z = input(g, "z", IR_F32, 3, sz);
    out(g, "loss", ir_xent(g, z, input(g, "tgt", IR_I64, 2, st)));
    out(g, "loss32", ir_xent(g, z, input(g, "tgt32", IR_I32, 2, st)));
    out(g, "loss_wide", ir_xent(g, input(g, "z2", IR_F32, 3, sz2), input(g, "tgt2", IR_I64, 2, st)));
}

/* the fused attention ops, as passes/ makes them, with every form of bias, mask and scale */
static void build_attention(IrGraph *g, IrDim b, IrDim n)
{
    IrDim J = ir_dim_addc(n, 3), J0 = ir_dim_addc(n, -1);
    IrDim sq[] = {b, ir_dim(2), n, ir_dim(8)}, sk[] = {b, ir_dim(2), J, ir_dim(8)}, sk0[] = {b, ir_dim(2), J0, ir_dim(8)};
    IrDim sv[] = {b, ir_dim(2), J, ir_dim(12)}, sbias[] = {ir_dim(2), n, J}, smask[] = {b, ir_dim(1), ir_dim(1), J};
    IrDim sscale[] = {b, ir_dim(2), ir_dim(1), ir_dim(1)};
    IrNode *q = input(g, "q", IR_F32, 4, sq), *k = input(g, "k", IR_F32, 4, sk), *v = input(g, "v", IR_F32, 4, sv);
    IrNode *bias = input(g, "bias", IR_F32, 3, sbias), *mask = input(g, "mask", IR_BOOL, 4, smask);
    IrNode *scale = input(g, "scale", IR_F32, 4, sscale), *c = ir_const(g, 0.35, IR_F32);
    out(g, "plain", ir_attention(g, q, k, v, NULL, NULL, c, 0, 0));
    out(g, "causal", ir_attention(g, q, k, v, NULL, NULL, c, 1, 0));
    out(g, "all", ir_attention(g, q, k, v, bias, mask, scale, 1, 1));
    /* queries without keys (J = n - 1 is 0 when n = 1): zeros, and -inf for the logsumexp */
    IrNode *k0 = input(g, "k0", IR_F32, 4, sk0);
    IrDim sv0[] = {b, ir_dim(2), J0, ir_dim(8)};
    IrNode *v0 = input(g, "v0", IR_F32, 4, sv0);
    out(g, "few_keys", ir_attention(g, q, k0, v0, NULL, NULL, c, 0, 1));
    /* causal with one key fewer than queries: row 0 sees no key, every score masked; so do the
     * padded queries of a per-query mask */
    IrNode *o0 = ir_attention(g, q, k0, v0, NULL, NULL, c, 1, 1);
    out(g, "masked_row", o0);
    out(g, "masked_row_grad", ir_attention_grad(g, o0, input(g, "d0", IR_F32, 4, sq)));
    IrDim sqm[] = {b, ir_dim(1), n, ir_dim(1)}, skm[] = {b, ir_dim(1), ir_dim(1), J};
    IrNode *pad = ir_binary(g, IR_AND, input(g, "qmask", IR_BOOL, 4, sqm), input(g, "kmask", IR_BOOL, 4, skm));
    IrNode *vq = input(g, "vq", IR_F32, 4, sk);
    IrNode *op = ir_attention(g, q, k, vq, NULL, pad, c, 0, 1);
    out(g, "padded", op);
    out(g, "padded_grad", ir_attention_grad(g, op, input(g, "dp", IR_F32, 4, sq)));
    /* sliding windows (max_attend_past): causal, and not causal with everything else; with one
     * key fewer than queries, row 0 sees none */
    out(g, "window", ir_attention_window(g, q, k, v, NULL, NULL, c, 1, 0, 2));
    IrNode *owa = ir_attention_window(g, q, k, vq, bias, pad, scale, 0, 1, 3);
    out(g, "window_all", owa);
    out(g, "window_grad", ir_attention_grad(g, owa, input(g, "dw", IR_F32, 4, sq)));
    IrNode *ow0 = ir_attention_window(g, q, k0, v0, NULL, NULL, c, 1, 1, 1);
    out(g, "window_row0", ow0);
    out(g, "window_row0_grad", ir_attention_grad(g, ow0, input(g, "dw0", IR_F32, 4, sq)));
    /* heads wider than a block: several output columns per thread */
    IrDim sw[] = {b, ir_dim(1), n, ir_dim(130)}, swk[] = {b, ir_dim(1), J, ir_dim(130)};
    IrNode *qw = input(g, "qw", IR_F32, 4, sw), *kw = input(g, "kw", IR_F32, 4, swk), *vw = input(g, "vw", IR_F32, 4, swk);
    IrNode *ow = ir_attention(g, qw, kw, vw, NULL, NULL, ir_const(g, 0.1, IR_F32), 1, 1);
    out(g, "wide", ow);
    IrDim sdw[] = {b, ir_dim(1), n, ir_dim(131)};
    out(g, "wide_grad", ir_attention_grad(g, ow, input(g, "dwide", IR_F32, 4, sdw)));
    /* head size 40: tiled, with five of each thread's accumulators per row (the tiles above hold one) */
    IrDim s40[] = {b, ir_dim(1), n, ir_dim(40)}, s40k[] = {b, ir_dim(1), J, ir_dim(40)}, s40d[] = {b, ir_dim(1), n, ir_dim(41)};
    IrNode *q40 = input(g, "q40", IR_F32, 4, s40), *k40 = input(g, "k40", IR_F32, 4, s40k);
    IrNode *o40 = ir_attention(g, q40, k40, input(g, "v40", IR_F32, 4, s40k), NULL, NULL, ir_const(g, 0.15, IR_F32), 1, 1);
    out(g, "head40", o40);
    out(g, "head40_grad", ir_attention_grad(g, o40, input(g, "d40", IR_F32, 4, s40d)));
    /* head size 100: the 32 x 16 tile (two rows and two score columns a thread, read one float
     * at a time), 16 accumulators a row; 220 by 16: the 16 x 16 tile, one row a thread */
    IrDim s100[] = {b, ir_dim(1), n, ir_dim(100)}, s100k[] = {b, ir_dim(1), J, ir_dim(100)};
    IrDim s100d[] = {b, ir_dim(1), n, ir_dim(101)};
    IrNode *q100 = input(g, "q100", IR_F32, 4, s100), *k100 = input(g, "k100", IR_F32, 4, s100k);
    IrNode *o100 = ir_attention(g, q100, k100, input(g, "v100", IR_F32, 4, s100k), NULL, NULL, ir_const(g, 0.1, IR_F32), 1, 1);
    out(g, "head100", o100);
    out(g, "head100_grad", ir_attention_grad(g, o100, input(g, "d100", IR_F32, 4, s100d)));
    IrDim s220[] = {b, ir_dim(1), n, ir_dim(220)}, s220k[] = {b, ir_dim(1), J, ir_dim(220)}, s16v[] = {b, ir_dim(1), J, ir_dim(16)};
    IrNode *q220 = input(g, "q220", IR_F32, 4, s220), *k220 = input(g, "k220", IR_F32, 4, s220k);
    out(g, "head220", ir_attention(g, q220, k220, input(g, "v16", IR_F32, 4, s16v), NULL, NULL, ir_const(g, 0.05, IR_F32), 0, 0));
    /* gradients: dout with and without the logsumexp column */
    IrDim svd[] = {b, ir_dim(2), J, ir_dim(8)}, sd[] = {b, ir_dim(2), n, ir_dim(8)}, sd1[] = {b, ir_dim(2), n, ir_dim(9)};
    IrNode *vd = input(g, "vd", IR_F32, 4, svd);
    IrNode *o = ir_attention(g, q, k, vd, bias, mask, scale, 1, 1);
    out(g, "grad", ir_attention_grad(g, o, input(g, "dout", IR_F32, 4, sd)));
    out(g, "grad_lse", ir_attention_grad(g, o, input(g, "dout1", IR_F32, 4, sd1)));
    IrNode *o2 = ir_attention(g, q, k, vd, NULL, NULL, c, 0, 1);
    out(g, "grad_plain", ir_attention_grad(g, o2, input(g, "dout2", IR_F32, 4, sd)));
}

/* heads split and merged around attention (x-transformers' rearranges), which the backend reads
 * and writes in place (cg_plan.h, CG_VIEW_*): q, k, v as [b, n, h, d] and the result merged back
 * (every view); a k that is also an output (no view of it) and a merge of a result with the
 * statistics column (no view of it); a v split from entmax15's rows, which stay f32 under 16-bit
 * storage (cg_keeps_f32: no view of it either) */
static void build_heads(IrGraph *g, IrDim b, IrDim n)
{
    static const int split[4] = {0, 2, 1, 3};
    IrDim J = ir_dim_addc(n, 3), h = ir_dim(2);
    IrDim sxq[] = {b, n, h, ir_dim(8)}, sxk[] = {b, J, h, ir_dim(8)}, sxv[] = {b, J, h, ir_dim(12)};
    IrDim smask[] = {b, ir_dim(1), ir_dim(1), J};
    IrNode *hq = ir_permute(g, input(g, "xq", IR_F32, 4, sxq), split);
    IrNode *hk = ir_permute(g, input(g, "xk", IR_F32, 4, sxk), split);
    IrNode *hv = ir_permute(g, input(g, "xv", IR_F32, 4, sxv), split);
    IrNode *c = ir_const(g, 0.35, IR_F32), *mask = input(g, "mask", IR_BOOL, 4, smask);
    out(g, "heads", ir_permute(g, ir_attention(g, hq, hk, hv, NULL, NULL, c, 1, 0), split));
    IrNode *hk2 = ir_permute(g, input(g, "xk2", IR_F32, 4, sxk), split);
    out(g, "heads_k2", hk2);
    out(g, "heads_stats", ir_permute(g, ir_attention(g, hq, hk2, hv, NULL, mask, c, 0, 1), split));
    IrNode *hve = ir_permute(g, ir_entmax15(g, input(g, "xve", IR_F32, 4, sxv)), split);
    out(g, "heads_f32", ir_attention(g, hq, hk, hve, NULL, NULL, c, 0, 0));
}

/* rows of x scaled to unit L2 norm, as F.normalize (1.x/2.x's qk-norm) */
static IrNode *unit_rows(IrGraph *g, IrNode *x)
{
    IrNode *nrm = ir_unary(g, IR_SQRT, ir_reduce(g, IR_SUM, ir_binary(g, IR_MUL, x, x), -1));
    return ir_binary(g, IR_DIV, x, ir_binary(g, IR_MAX, nrm, ir_const(g, 1e-12, IR_F32)));
}

/* The bounded variant (cosine-sim attention, passes/attention_bound.c): l2-normalised q and k,
 * a constant scale, the bound as each row's softmax maximum: causal with keys offset from the
 * queries over several key tiles, a padding mask with fully masked rows, a window, the statistics
 * and the gradient, grouped key/values (one key/value head expanded to three), groups of the head
 * (bound 2), the largest scale the verifier takes (bound x scale = 40: probabilities down to
 * 2^-115), decoding rows over two key tiles, and n queries and keys (none at the empty sizes). */
static void build_attention_bounded(IrGraph *g, IrDim b, IrDim n)
{
    IrDim n2 = ir_dim_add(n, n), n4 = ir_dim_add(n2, n2), n8 = ir_dim_add(n4, n4);
    IrDim I = ir_dim_addc(n8, 60), J = ir_dim_addc(I, 5), h = ir_dim(2), hd = ir_dim(16); /* J = 329: 2 key tiles */
    IrDim sq[] = {b, h, I, hd}, sk[] = {b, h, J, hd}, sqm[] = {b, ir_dim(1), I, ir_dim(1)};
    IrDim skm[] = {b, ir_dim(1), ir_dim(1), J}, sg[] = {b, h, I, ir_dim(17)};
    IrNode *q = unit_rows(g, input(g, "q", IR_F32, 4, sq)), *k = unit_rows(g, input(g, "k", IR_F32, 4, sk));
    IrNode *v = input(g, "v", IR_F32, 4, sk);
    IrNode *mask = ir_binary(g, IR_AND, input(g, "qm", IR_BOOL, 4, sqm), input(g, "km", IR_BOOL, 4, skm));
    IrNode *c = ir_const(g, 10.0, IR_F32);
    out(g, "causal", ir_attention_bounded(g, q, k, v, NULL, c, 1, 0, 0, 1));
    IrNode *f = ir_attention_bounded(g, q, k, v, mask, c, 1, 1, 0, 1);
    out(g, "masked_stats", f);
    out(g, "grad", ir_attention_grad(g, f, input(g, "dout", IR_F32, 4, sq)));
    out(g, "grad_lse", ir_attention_grad(g, f, input(g, "dout_lse", IR_F32, 4, sg)));
    out(g, "masked", ir_attention_bounded(g, q, k, v, mask, c, 0, 1, 0, 1));
    out(g, "window", ir_attention_bounded(g, q, k, v, NULL, c, 1, 0, 37, 1));
    /* one key/value head read by both query heads (attn_one_kv_head) */
    IrDim sk1[] = {b, ir_dim(1), J, hd};
    IrNode *k1 = ir_expand(g, unit_rows(g, input(g, "k1", IR_F32, 4, sk1)), 4, sk);
    IrNode *v1 = ir_expand(g, input(g, "v1", IR_F32, 4, sk1), 4, sk);
    IrNode *fg = ir_attention_bounded(g, q, k1, v1, mask, c, 1, 1, 0, 1);
    out(g, "grouped", fg);
    out(g, "grouped_grad", ir_attention_grad(g, fg, input(g, "doutg", IR_F32, 4, sq)));
    /* qk_norm_groups = 2: each half of a row normalised, so |q| = |k| = sqrt 2 */
    IrDim sq5[] = {b, h, I, ir_dim(2), ir_dim(8)}, sk5[] = {b, h, J, ir_dim(2), ir_dim(8)};
    IrNode *q2 = ir_reshape(g, unit_rows(g, ir_reshape(g, input(g, "q2", IR_F32, 4, sq), 5, sq5)), 4, sq);
    IrNode *k2 = ir_reshape(g, unit_rows(g, ir_reshape(g, input(g, "k2", IR_F32, 4, sk), 5, sk5)), 4, sk);
    out(g, "groups", ir_attention_bounded(g, q2, k2, v, mask, c, 1, 1, 0, 2));
    out(g, "scale40", ir_attention_bounded(g, q, k, v, NULL, ir_const(g, 40.0, IR_F32), 1, 1, 0, 1));
    IrDim se[] = {b, h, n, hd}; /* n queries and keys: 0 at the empty sizes */
    out(g, "self_n", ir_attention_bounded(g, unit_rows(g, input(g, "qe", IR_F32, 4, se)), unit_rows(g, input(g, "ke", IR_F32, 4, se)),
                                          input(g, "ve", IR_F32, 4, se), NULL, c, 1, 1, 0, 1));
    IrDim Jd = ir_dim_addc(n8, 200), one = ir_dim(1);
    IrDim sd1[] = {b, h, one, hd}, sdk[] = {b, h, Jd, hd};
    out(g, "decode", ir_attention_bounded(g, unit_rows(g, input(g, "dq1", IR_F32, 4, sd1)),
                                          unit_rows(g, input(g, "dk", IR_F32, 4, sdk)), input(g, "dv", IR_F32, 4, sdk),
                                          NULL, c, 1, 1, 0, 1));
}

/* grouped key/values (build_attention_grouped), over the helpers above */
#include "op_cases_grouped.h"

/* The bounded variant through the CUDA kernels, at fixed sizes past the few-row path (the tiled
 * forward takes the bound as each row's maximum when there is no mask operand and, under causal,
 * J >= I; the others and the backward take it as the general attention): causal with keys offset
 * from the queries (40 queries, 45 keys: two key tiles of 32), without causal, a window, the
 * statistics and their gradient, bound x scale = 40 (the largest), fewer keys than queries under causal (rows
 * that see no key: the general path) and a padding mask (the general path); and rows for the few-row
 * (decode) path, which takes the bound likewise: one query row against 200 keys (two blocks of key warps)
 * with the statistics, three causal rows, two rows without causal, five causal rows against three keys
 * (the general path) and one masked row (the general path). */
static void build_attention_bounded_cuda(IrGraph *g, IrDim b, IrDim n)
{
    (void)b;
    (void)n;
    IrDim one = ir_dim(1), h = ir_dim(2), hd = ir_dim(16);
    IrDim sq[] = {one, h, ir_dim(40), hd}, sk[] = {one, h, ir_dim(45), hd}, sk2[] = {one, h, ir_dim(37), hd};
    IrDim skm[] = {one, one, one, ir_dim(45)};
    IrNode *q = unit_rows(g, input(g, "q", IR_F32, 4, sq)), *k = unit_rows(g, input(g, "k", IR_F32, 4, sk));
    IrNode *v = input(g, "v", IR_F32, 4, sk), *c = ir_const(g, 10.0, IR_F32);
    out(g, "causal", ir_attention_bounded(g, q, k, v, NULL, c, 1, 0, 0, 1));
    out(g, "full", ir_attention_bounded(g, q, k, v, NULL, c, 0, 0, 0, 1));
    out(g, "window", ir_attention_bounded(g, q, k, v, NULL, c, 1, 0, 6, 1));
    IrNode *f = ir_attention_bounded(g, q, k, v, NULL, c, 1, 1, 0, 1);
    out(g, "stats", f);
    out(g, "grad", ir_attention_grad(g, f, input(g, "dout", IR_F32, 4, sq)));
    out(g, "scale40", ir_attention_bounded(g, q, k, v, NULL, ir_const(g, 40.0, IR_F32), 1, 1, 0, 1));
    out(g, "few_keys", ir_attention_bounded(g, q, unit_rows(g, input(g, "k2", IR_F32, 4, sk2)),
                                            input(g, "v2", IR_F32, 4, sk2), NULL, c, 1, 1, 0, 1));
    out(g, "masked", ir_attention_bounded(g, q, k, v, input(g, "km", IR_BOOL, 4, skm), c, 1, 1, 0, 1));
    IrDim sd1[] = {one, h, one, hd}, sd2[] = {one, h, ir_dim(2), hd}, sd3[] = {one, h, ir_dim(3), hd};
    IrDim sd5[] = {one, h, ir_dim(5), hd};
    IrDim sdk[] = {one, h, ir_dim(200), hd}, sdk3[] = {one, h, ir_dim(3), hd};
    IrNode *d1 = unit_rows(g, input(g, "dq1", IR_F32, 4, sd1)), *d3 = unit_rows(g, input(g, "dq3", IR_F32, 4, sd3));
    out(g, "decode", ir_attention_bounded(g, d1, unit_rows(g, input(g, "dk", IR_F32, 4, sdk)),
                                          input(g, "dv", IR_F32, 4, sdk), NULL, c, 1, 1, 0, 1));
    out(g, "decode_rows", ir_attention_bounded(g, d3, k, v, NULL, c, 1, 0, 0, 1));
    out(g, "decode_full", ir_attention_bounded(g, unit_rows(g, input(g, "dq2", IR_F32, 4, sd2)), k, v,
                                               NULL, c, 0, 0, 0, 1));
    out(g, "decode_few_keys", ir_attention_bounded(g, unit_rows(g, input(g, "dq5", IR_F32, 4, sd5)),
                                                   unit_rows(g, input(g, "dk3", IR_F32, 4, sdk3)),
                                                   input(g, "dv3", IR_F32, 4, sdk3), NULL, c, 1, 1, 0, 1));
    out(g, "decode_masked", ir_attention_bounded(g, d1, k, v, input(g, "km", IR_BOOL, 4, skm), c, 1, 1, 0, 1));
}

/* The fused attention ops (passes/fuse_attention.c makes them): causal with keys offset from the
 * queries (J = I + 5, as with memories), more queries and keys than one tile (I = 588 and
 * J = 593 at n = 33: three key tiles, two query groups), without a score operand, a padding mask
 * with fully masked rows (they attend uniformly), a bias broadcast over the batch, the
 * statistics column, the gradient with and without the logsumexp's; cross attention with
 * E != D over several key tiles; and J = n, which is 0 in the empty sizes. */
static void build_attention_tiles(IrGraph *g, IrDim b, IrDim n)
{
    IrDim n2 = ir_dim_add(n, n), n4 = ir_dim_add(n2, n2), n8 = ir_dim_add(n4, n4), n16 = ir_dim_add(n8, n8);
    IrDim I = ir_dim_addc(n16, 60), J = ir_dim_addc(I, 5), h = ir_dim(3), hd = ir_dim(40);
    IrDim sq[] = {b, h, I, hd}, sk[] = {b, h, J, hd}, sqm[] = {b, ir_dim(1), I, ir_dim(1)};
    IrDim skm[] = {b, ir_dim(1), ir_dim(1), J}, sb[] = {h, I, J}, sg[] = {b, h, I, ir_dim(41)};
    IrNode *q = input(g, "q", IR_F32, 4, sq), *k = input(g, "k", IR_F32, 4, sk), *v = input(g, "v", IR_F32, 4, sk);
    IrNode *mask = ir_binary(g, IR_AND, input(g, "qm", IR_BOOL, 4, sqm), input(g, "km", IR_BOOL, 4, skm));
    IrNode *bias = input(g, "bias", IR_F32, 3, sb), *c = ir_const(g, 0.158, IR_F32);
    out(g, "causal", ir_attention(g, q, k, v, NULL, NULL, c, 1, 0));
    out(g, "plain_stats", ir_attention(g, q, k, v, NULL, NULL, c, 0, 1));
    IrNode *f = ir_attention(g, q, k, v, bias, mask, c, 1, 1);
    out(g, "masked_stats", f);
    out(g, "grad", ir_attention_grad(g, f, input(g, "dout", IR_F32, 4, sq)));
    out(g, "grad_lse", ir_attention_grad(g, f, input(g, "dout_lse", IR_F32, 4, sg)));
    IrDim ss[] = {ir_dim(1), h, ir_dim(1), ir_dim(1)}; /* cosine similarity: a scale per head */
    IrNode *fm = ir_attention(g, q, k, v, NULL, mask, input(g, "scale", IR_F32, 4, ss), 0, 1);
    out(g, "grad_plain", ir_attention_grad(g, fm, input(g, "dout2", IR_F32, 4, sq)));
    /* a sliding window (max_attend_past): key tiles and panels before it skipped, the rest
     * masked per row; plain and causal, not causal with the statistics, a window wider than a
     * key tile with a bias and a mask, and the gradients (their query tiles after the window
     * skipped too) */
    out(g, "window_causal", ir_attention_window(g, q, k, v, NULL, NULL, c, 1, 0, 100));
    out(g, "window_stats", ir_attention_window(g, q, k, v, NULL, NULL, c, 0, 1, 37));
    IrNode *fw = ir_attention_window(g, q, k, v, bias, mask, c, 1, 1, 300);
    out(g, "window_masked", fw);
    out(g, "window_grad", ir_attention_grad(g, fw, input(g, "doutw", IR_F32, 4, sq)));
    IrNode *fw2 = ir_attention_window(g, q, k, v, NULL, NULL, c, 0, 1, 70);
    out(g, "window_grad_plain", ir_attention_grad(g, fw2, input(g, "doutw2", IR_F32, 4, sg)));
    IrDim Jc = ir_dim_addc(ir_dim_add(n, n8), 100), h2 = ir_dim(2);
    IrDim sqc[] = {b, h2, n, ir_dim(16)}, skc[] = {b, h2, Jc, ir_dim(16)}, svc[] = {b, h2, Jc, ir_dim(24)};
    IrDim sbc[] = {ir_dim(1), ir_dim(1), Jc}, smc[] = {b, ir_dim(1), ir_dim(1), Jc};
    IrNode *qc = input(g, "qc", IR_F32, 4, sqc), *kc = input(g, "kc", IR_F32, 4, skc);
    out(g, "cross", ir_attention(g, qc, kc, input(g, "vc", IR_F32, 4, svc), input(g, "biasc", IR_F32, 3, sbc),
                                 input(g, "kmc", IR_BOOL, 4, smc), ir_const(g, 0.25, IR_F32), 0, 1));
    /* heads split and merged around attention (x-transformers' rearranges), which the CPU
     * backend reads and writes in place (cg_plan.h, CG_VIEW_*): q, k, v as [b, n, h, d]; a k that
     * is also an output is copied (no view); the result merged back, and a merge of a result with
     * the statistics column (no view) */
    static const int split[4] = {0, 2, 1, 3};
    IrDim sxq[] = {b, I, h, hd}, sxk[] = {b, J, h, hd}, sxv[] = {b, J, h, ir_dim(24)};
    IrNode *hq = ir_permute(g, input(g, "xq", IR_F32, 4, sxq), split);
    IrNode *hk = ir_permute(g, input(g, "xk", IR_F32, 4, sxk), split);
    IrNode *hv = ir_permute(g, input(g, "xv", IR_F32, 4, sxv), split);
    out(g, "heads", ir_permute(g, ir_attention(g, hq, hk, hv, NULL, NULL, c, 1, 0), split));
    IrNode *hk2 = ir_permute(g, input(g, "xk2", IR_F32, 4, sxk), split);
    out(g, "heads_k2", hk2);
    out(g, "heads_stats", ir_permute(g, ir_attention(g, hq, hk2, hv, NULL, mask, c, 0, 1), split));
    IrDim se[] = {b, h2, n, ir_dim(8)};
    IrNode *qe = input(g, "qe", IR_F32, 4, se), *ke = input(g, "ke", IR_F32, 4, se);
    IrNode *fe = ir_attention(g, qe, ke, input(g, "ve", IR_F32, 4, se), NULL, NULL, ir_const(g, 0.3, IR_F32), 1, 1);
    out(g, "self_n", fe);
    out(g, "self_n_grad", ir_attention_grad(g, fe, input(g, "doute", IR_F32, 4, se)));
    /* decoding (at most 4 query rows, no bias or mask: K and V read in place, not packed), over
     * more keys than a key tile (BC = 256): one row seeing every key; 3 rows under causal with a
     * window reaching back across a tile boundary, with the statistics; 2 rows through head-split
     * views, not causal */
    IrDim Jd = ir_dim_addc(n16, 300), one = ir_dim(1), three = ir_dim(3);
    IrDim sd1[] = {b, h, one, hd}, sd3[] = {b, h, three, hd}, sdk[] = {b, h, Jd, hd};
    IrNode *dk = input(g, "dk", IR_F32, 4, sdk), *dv = input(g, "dv", IR_F32, 4, sdk);
    out(g, "decode", ir_attention(g, input(g, "dq1", IR_F32, 4, sd1), dk, dv, NULL, NULL, c, 1, 0));
    out(g, "decode_window", ir_attention_window(g, input(g, "dq3", IR_F32, 4, sd3), dk, dv, NULL, NULL, c, 1, 1, 270));
    IrDim sxq2[] = {b, ir_dim(2), h, hd}, sxkd[] = {b, Jd, h, hd};
    IrNode *dq2 = ir_permute(g, input(g, "dxq", IR_F32, 4, sxq2), split);
    IrNode *dk2 = ir_permute(g, input(g, "dxk", IR_F32, 4, sxkd), split), *dv2 = ir_permute(g, input(g, "dxv", IR_F32, 4, sxkd), split);
    out(g, "decode_heads", ir_permute(g, ir_attention(g, dq2, dk2, dv2, NULL, NULL, c, 0, 0), split));
}

/* The fused op (passes/fuse_elementwise.c makes it): row programs (a LayerNorm, a softmax with
 * cross-entropy's gradient after it, a norm that ends in its reduction, a maximum with bool and
 * int steps), GLU's two halves read through slices, and elementwise chains over long rows with
 * broadcasts, a bcast step and an integer result. */
static void build_fused(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(33)}, sw[] = {ir_dim(33)}, sz[] = {b, n, ir_dim(13)}, s1[] = {b, n, ir_dim(1)};
    IrDim sp[] = {b, n, ir_dim(34)}, sh[] = {b, n, ir_dim(17)}, sl[] = {b, n, ir_dim(130)}, sb[] = {ir_dim(130)};
    IrNode *x = input(g, "x", IR_F32, 3, sx), *w = input(g, "w", IR_F32, 1, sw), *bias = input(g, "bias", IR_F32, 1, sw);
    IrNode *ln[3] = {x, w, bias};
    out(g, "layernorm", ir_fused(g, "sum($0);mul(%0,0.030303030303030304:f32);sub($0,%1);mul(%2,%2);sum(%3);"
                                    "mul(%4,0.030303030303030304:f32);add(%5,1e-05:f32);rsqrt(%6);mul(%2,%7);mul(%8,$1);add(%9,$2)",
                                 3, ln, 3, sx));
    IrNode *xg[3] = {input(g, "z", IR_F32, 3, sz), input(g, "onehot", IR_F32, 3, sz), input(g, "wt", IR_F32, 3, s1)};
    out(g, "softmax_xent_grad", ir_fused(g, "softmax($0);sub(%0,$1);mul(%1,$2)", 3, xg, 3, sz));
    out(g, "l2", ir_fused(g, "mul($0,$0);sum(%0);sqrt(%1)", 1, &x, 3, s1));
    out(g, "rowmax", ir_fused(g, "reduce_max($0);lt($0,%0);cast:f32(%1);where(%1,$0,%2)", 1, &x, 3, sx));
    IrNode *proj = input(g, "proj", IR_F32, 3, sp);
    out(g, "glu", ir_fused(g, "slice($0,0,17);slice($0,17,17);gelu(%1);mul(%0,%2)", 1, &proj, 3, sh));
    IrNode *lb[2] = {input(g, "long", IR_F32, 3, sl), input(g, "lbias", IR_F32, 1, sb)};
    out(g, "bias_gelu", ir_fused(g, "add($0,$1);gelu(%0)", 2, lb, 3, sl));
    IrNode *bc[2] = {input(g, "col", IR_F32, 3, s1), w};
    out(g, "bcast", ir_fused(g, "bcast($0);mul(%0,$1);exp(%1)", 2, bc, 3, sx));
    out(g, "to_int", ir_fused(g, "mul($0,3:f32);cast:i32(%0)", 1, &x, 3, sx));
    /* matmul epilogues: blocked (130 columns), plain (5), batched with a broadcast operand */
    IrDim swm[] = {ir_dim(130), ir_dim(33)}, sw5[] = {ir_dim(5), ir_dim(33)}, s5[] = {b, n, ir_dim(5)};
    IrNode *mm[3] = {x, input(g, "wmm", IR_F32, 2, swm), lb[1]};
    out(g, "matmul_bias_gelu", ir_fused(g, "matmul($0,$1,1);add(%0,$2);gelu(%1)", 3, mm, 3, sl));
    IrNode *mm5[3] = {x, input(g, "w5", IR_F32, 2, sw5), input(g, "res5", IR_F32, 3, s5)};
    out(g, "matmul_residual", ir_fused(g, "add($2,3:f32);matmul($0,$1,1);add(%1,%0)", 3, mm5, 3, s5));
    /* an epilogue over items of two row blocks (MC = 192 rows): 4 batch items of 200 rows */
    IrDim stall[] = {ir_dim(4), ir_dim(200), ir_dim(33)}, stw[] = {ir_dim(40), ir_dim(33)}, stb[] = {ir_dim(40)};
    IrDim sto[] = {ir_dim(4), ir_dim(200), ir_dim(40)};
    IrNode *tl[3] = {input(g, "tallx", IR_F32, 3, stall), input(g, "tallw", IR_F32, 2, stw), input(g, "tallb", IR_F32, 1, stb)};
    out(g, "tall_bias_gelu", ir_fused(g, "matmul($0,$1,1);add(%0,$2);gelu(%1)", 3, tl, 3, sto));
    /* an epilogue on the matrix-vector path: 2 rows, 130 columns (9 blocks of 16, the last 2) */
    IrDim sgx[] = {ir_dim(1), ir_dim(2), ir_dim(33)}, sgo[] = {ir_dim(1), ir_dim(2), ir_dim(130)};
    IrNode *gv[3] = {input(g, "gemvx", IR_F32, 3, sgx), mm[1], lb[1]};
    out(g, "gemv_bias_gelu", ir_fused(g, "matmul($0,$1,1);add(%0,$2);gelu(%1)", 3, gv, 3, sgo));
    /* ... and over 3 batch indices of one row each, in one work item */
    IrDim sgx3[] = {ir_dim(3), ir_dim(1), ir_dim(33)}, sgo3[] = {ir_dim(3), ir_dim(1), ir_dim(130)};
    IrNode *gv3[3] = {input(g, "gemvx3", IR_F32, 3, sgx3), mm[1], lb[1]};
    out(g, "gemv_batch_bias_gelu", ir_fused(g, "matmul($0,$1,1);add(%0,$2);gelu(%1)", 3, gv3, 3, sgo3));
    IrDim sq[] = {b, ir_dim(2), n, ir_dim(7)}, sk[] = {b, ir_dim(2), ir_dim(9), ir_dim(7)}, so[] = {b, ir_dim(2), n, ir_dim(9)};
    IrDim sbq[] = {ir_dim(2), n, ir_dim(1)};
    IrNode *bm[3] = {input(g, "mq", IR_F32, 4, sq), input(g, "mk", IR_F32, 4, sk), input(g, "mb", IR_F32, 3, sbq)};
    out(g, "batched_epilogue", ir_fused(g, "matmul($0,$1,1);mul(%0,$2);tanh(%1)", 3, bm, 4, so));
    /* two-part epilogues (GLU: the product's columns j and j + width, ir_epilogue_parts): the
     * blocked path with 2 column groups of 128 and partial panels (width 150, with the bias),
     * items of MC rows and a B not transposed (4 x 200 rows, width 40), the matrix-vector path
     * (2 rows, 10 blocks of 16, the last 6 wide), the plain path (a product 6 wide), and a B per
     * batch index (4-d, width 9) */
    IrDim sgw[] = {ir_dim(300), ir_dim(33)}, sgb[] = {ir_dim(300)}, sgo150[] = {b, n, ir_dim(150)};
    IrNode *gl[3] = {x, input(g, "gluw", IR_F32, 2, sgw), input(g, "glub", IR_F32, 1, sgb)};
    static const char glu_bias[] = "matmul($0,$1,1);add(%0,$2);slice(%1,0,150);slice(%1,150,150);gelu(%3);mul(%2,%4)";
    out(g, "matmul_glu", ir_fused(g, glu_bias, 3, gl, 3, sgo150));
    IrDim stw2[] = {ir_dim(33), ir_dim(80)};
    IrNode *tg[2] = {tl[0], input(g, "tallw2", IR_F32, 2, stw2)};
    out(g, "tall_glu", ir_fused(g, "matmul($0,$1,0);slice(%0,0,40);slice(%0,40,40);sigmoid(%2);mul(%1,%3)", 2, tg, 3, sto));
    IrDim sgo2[] = {ir_dim(1), ir_dim(2), ir_dim(150)};
    IrNode *gg[3] = {gv[0], gl[1], gl[2]};
    out(g, "gemv_glu", ir_fused(g, glu_bias, 3, gg, 3, sgo2));
    IrDim sw6[] = {ir_dim(6), ir_dim(33)}, s3[] = {b, n, ir_dim(3)};
    IrNode *pg[2] = {x, input(g, "w6", IR_F32, 2, sw6)};
    out(g, "plain_glu", ir_fused(g, "matmul($0,$1,1);slice(%0,3,3);slice(%0,0,3);gelu(%1);mul(%3,%2)", 2, pg, 3, s3));
    IrDim sk18[] = {b, ir_dim(2), ir_dim(18), ir_dim(7)}, so9[] = {b, ir_dim(2), n, ir_dim(9)};
    IrNode *bg[2] = {bm[0], input(g, "mk18", IR_F32, 4, sk18)};
    out(g, "batched_glu", ir_fused(g, "matmul($0,$1,1);slice(%0,0,9);slice(%0,9,9);tanh(%2);mul(%1,%3)", 2, bg, 4, so9));
    /* l2norm(rotary(split heads)) in one pass: permute, slices and concats of computed values */
    IrDim sr[] = {b, n, ir_dim(2), ir_dim(8)}, st[] = {b, ir_dim(2), n, ir_dim(8)}, sc[] = {n, ir_dim(6)};
    IrNode *rt[3] = {input(g, "heads", IR_F32, 4, sr), input(g, "cos", IR_F32, 2, sc), input(g, "sin", IR_F32, 2, sc)};
    out(g, "rotary_l2norm", ir_fused(g, "permute($0,0,2,1,3);slice(%0,0,3);slice(%0,3,3);neg(%2);concat(%3,%1);"
                                        "slice(%0,0,6);mul(%5,$1);mul(%4,$2);add(%6,%7);slice(%0,6,2);concat(%8,%9);"
                                        "mul(%10,%10);sum(%11);sqrt(%12);max(%13,1e-12:f32);div(%10,%14)", 3, rt, 4, st));
}

/* int8 weights (matmul_q8): an i8 weight [n, k] with f32 scales [n, ceil(k / group)], per output
 * row (group = k) and in groups whose last one is partial, on each path of the CPU kernel: the
 * matrix-vector path (b n <= 4 rows: at the sizes 1), the blocked path with panels past n and k
 * blocks (KC = 256) that cut a group, and the plain path (n = 5 < 8); k = 96 for the int16
 * products of the matrix-vector path. */
static IrNode *q8(IrGraph *g, IrNode *a, const char *name, int64_t n, int64_t k, int64_t group)
{
    char sname[64];
    snprintf(sname, sizeof sname, "%s.scale", name);
    IrDim sw[] = {ir_dim(n), ir_dim(k)}, ss[] = {ir_dim(n), ir_dim((k + group - 1) / group)};
    return ir_matmul_q8(g, a, ir_buffer_i8(g, name, 2, sw), ir_buffer(g, sname, 2, ss), group);
}

static void build_matmul_q8(IrGraph *g, IrDim b, IrDim n)
{
    IrDim s40[] = {b, n, ir_dim(40)}, s300[] = {b, n, ir_dim(300)}, s2[] = {n, ir_dim(40)}, s96[] = {b, n, ir_dim(96)};
    IrNode *a = input(g, "a", IR_F32, 3, s40), *a300 = input(g, "a300", IR_F32, 3, s300);
    IrNode *a96 = input(g, "a96", IR_F32, 3, s96);
    out(g, "per_row", q8(g, a, "w", 70, 40, 40));
    out(g, "groups", q8(g, a, "wg", 70, 40, 16));             /* 3 groups, the last of 8 */
    out(g, "k_blocks", q8(g, a300, "wk", 37, 300, 32));       /* 10 groups; KC = 256 cuts the 9th */
    out(g, "plain", q8(g, a, "wp", 5, 40, 32));
    out(g, "rank2", q8(g, input(g, "a2", IR_F32, 2, s2), "w2", 19, 40, 40));
    out(g, "group1", q8(g, a, "w1", 9, 40, 1));               /* a scale per weight */
    /* k a multiple of 32: the matrix-vector path's int16 products (AVX512-BW, cg_llvm_q8.c) */
    out(g, "i16_rows", q8(g, a96, "wi", 37, 96, 96));
    out(g, "i16_groups", q8(g, a96, "wj", 21, 96, 32));
}

/* Products large enough for the f32 kernel's 128 x 128 tiles (cg_cuda_matmul.c: from LARGE_MIN =
 * 256 of them; here 9 x 31 = 279), ragged in every dimension (k = 19: two full stages of 8 and a
 * partial one), with B as stored and transposed, and a bias + GELU epilogue and a GLU (a
 * two-part epilogue) in the fused form. Fixed sizes: run once (run_case_sizes), not at every b and n. */
static void build_matmul_large(IrGraph *g, IrDim b, IrDim n)
{
    (void)b;
    (void)n;
    IrDim sa[] = {ir_dim(1030), ir_dim(19)}, sw[] = {ir_dim(19), ir_dim(3850)}, swt[] = {ir_dim(3850), ir_dim(19)};
    IrDim sb[] = {ir_dim(3850)};
    IrNode *a = input(g, "a", IR_F32, 2, sa);
    out(g, "large", ir_matmul(g, a, ir_param(g, "w", 2, sw), 0));
    IrNode *y = ir_binary(g, IR_ADD, ir_matmul(g, a, ir_param(g, "wt", 2, swt), 1), ir_param(g, "bias", 1, sb));
    out(g, "large_t_gelu", ir_unary(g, IR_GELU, y));
    /* GLU over the halves of a product of as many large tiles (1925 output columns) */
    IrNode *p = ir_binary(g, IR_ADD, ir_matmul(g, a, ir_param(g, "wg", 2, swt), 1), ir_param(g, "bg", 1, sb));
    out(g, "large_glu", ir_binary(g, IR_MUL, ir_slice(g, p, -1, ir_dim(0), ir_dim(1925)),
                                  ir_unary(g, IR_GELU, ir_slice(g, p, -1, ir_dim(1925), ir_dim(1925)))));
}

/* The tiled attention forward with many query tiles: 512 heads of 70 rows are 1024 tiles of 64,
 * at least ATT_MANY (cg_cuda_attention.c), so the kernel takes its 64-row tiles (the attention
 * case's sizes take the 32-row ones), ragged (70 rows, 73 keys), with every form of bias, mask
 * and scale, a window, and the logsumexp column. Fixed sizes: run once. */
static void build_attention_many(IrGraph *g, IrDim b, IrDim n)
{
    (void)b;
    (void)n;
    IrDim sq[] = {ir_dim(4), ir_dim(128), ir_dim(70), ir_dim(8)}, sk[] = {ir_dim(4), ir_dim(128), ir_dim(73), ir_dim(8)};
    IrDim sv[] = {ir_dim(4), ir_dim(128), ir_dim(73), ir_dim(12)}, sbias[] = {ir_dim(128), ir_dim(70), ir_dim(73)};
    IrDim smask[] = {ir_dim(4), ir_dim(1), ir_dim(1), ir_dim(73)}, sscale[] = {ir_dim(4), ir_dim(128), ir_dim(1), ir_dim(1)};
    IrNode *q = input(g, "q", IR_F32, 4, sq), *k = input(g, "k", IR_F32, 4, sk), *v = input(g, "v", IR_F32, 4, sv);
    IrNode *bias = input(g, "bias", IR_F32, 3, sbias), *mask = input(g, "mask", IR_BOOL, 4, smask);
    IrNode *scale = input(g, "scale", IR_F32, 4, sscale), *c = ir_const(g, 0.35, IR_F32);
    out(g, "causal", ir_attention(g, q, k, v, NULL, NULL, c, 1, 1));
    out(g, "all", ir_attention(g, q, k, v, bias, mask, scale, 1, 1));
    out(g, "window", ir_attention_window(g, q, k, v, NULL, NULL, c, 1, 0, 5));
}

/* Reductions past the op cases' sizes: a cross-entropy over more rows than it has blocks
 * (XENT_PARTS = 1024 in cg_cuda_reduce.c; 2100 rows, ignored targets among them), and sums and
 * maxima over a long outer axis with few outputs, whose blocks split the axis among their warps
 * and the axis into row chunks (45 columns: a partial group of 32; outer 3). Fixed sizes: run
 * once. */
static void build_reduce_long(IrGraph *g, IrDim b, IrDim n)
{
    (void)b;
    (void)n;
    IrDim sz[] = {ir_dim(3), ir_dim(700), ir_dim(50)}, st[] = {ir_dim(3), ir_dim(700)};
    IrDim sx[] = {ir_dim(3), ir_dim(300), ir_dim(45)}, sy[] = {ir_dim(1), ir_dim(2000), ir_dim(20)};
    out(g, "loss", ir_xent(g, input(g, "z", IR_F32, 3, sz), input(g, "tgt", IR_I64, 2, st)));
    IrNode *x = input(g, "x", IR_F32, 3, sx), *y = input(g, "y", IR_F32, 3, sy);
    out(g, "sum_long", ir_reduce(g, IR_SUM, x, 1));
    out(g, "max_long", ir_reduce(g, IR_RMAX, x, 1));
    out(g, "sum_rows", ir_reduce(g, IR_SUM, y, 1));
    /* a thread per pair of outputs past outer 1 (inner even, len < 16), a thread per output
     * (inner odd), and many row chunks a column group (outer 2, ragged columns and last chunk) */
    IrDim sp[] = {ir_dim(4), ir_dim(8), ir_dim(2050)}, so[] = {ir_dim(3), ir_dim(5), ir_dim(45)};
    IrDim sc[] = {ir_dim(2), ir_dim(3001), ir_dim(40)};
    IrNode *p = input(g, "p", IR_F32, 3, sp), *q = input(g, "q", IR_F32, 3, so), *c = input(g, "c", IR_F32, 3, sc);
    out(g, "sum_pairs", ir_reduce(g, IR_SUM, p, 1));
    out(g, "max_pairs", ir_reduce(g, IR_RMAX, p, 1));
    out(g, "sum_odd", ir_reduce(g, IR_SUM, q, 1));
    out(g, "sum_chunks", ir_reduce(g, IR_SUM, c, 1));
    out(g, "max_chunks", ir_reduce(g, IR_RMAX, c, 1));
}

/* layer norm over the last axis, as the front end lowers it */
static IrNode *layer_norm(IrGraph *g, IrNode *x, int dim, const char *name)
{
    char p[64];
    IrNode *inv = ir_const(g, 1.0 / dim, IR_F32);
    IrNode *mean = ir_binary(g, IR_MUL, ir_reduce(g, IR_SUM, x, -1), inv);
    IrNode *c = ir_binary(g, IR_SUB, x, mean);
    IrNode *var = ir_binary(g, IR_MUL, ir_reduce(g, IR_SUM, ir_binary(g, IR_MUL, c, c), -1), inv);
    IrNode *y = ir_binary(g, IR_MUL, c, ir_unary(g, IR_RSQRT, ir_binary(g, IR_ADD, var, ir_const(g, 1e-5, IR_F32))));
    IrDim sw[] = {ir_dim(dim)};
    snprintf(p, sizeof p, "%s.weight", name);
    y = ir_binary(g, IR_MUL, y, ir_param(g, p, 1, sw));
    snprintf(p, sizeof p, "%s.bias", name);
    return ir_binary(g, IR_ADD, y, ir_param(g, p, 1, sw));
}

/* a one-head causal attention block with a GELU feed-forward and cross-entropy, differentiated */
static void build_train_block(IrGraph *g, IrDim b, IrDim n)
{
    enum { D = 24, V = 13 };
    IrDim st[] = {b, n}, se[] = {ir_dim(V), ir_dim(D)}, sw[] = {ir_dim(D), ir_dim(D)}, sf[] = {ir_dim(40), ir_dim(D)};
    IrNode *tok = input(g, "tok", IR_I64, 2, st);
    IrNode *x = ir_gather(g, ir_param(g, "emb", 2, se), tok);
    IrNode *h = layer_norm(g, x, D, "ln1");
    IrNode *q = ir_matmul(g, h, ir_param(g, "wq", 2, sw), 1), *k = ir_matmul(g, h, ir_param(g, "wk", 2, sw), 1);
    IrNode *v = ir_matmul(g, h, ir_param(g, "wv", 2, sw), 1);
    IrNode *dots = ir_binary(g, IR_MUL, ir_matmul(g, q, k, 1), ir_const(g, 0.2, IR_F32));
    IrNode *pos = ir_arange(g, ir_dim(0), n, IR_I64);
    IrDim s1[] = {n, ir_dim(1)}, s2[] = {ir_dim(1), n};
    IrNode *mask = ir_binary(g, IR_LT, ir_reshape(g, pos, 2, s1), ir_reshape(g, pos, 2, s2));
    IrNode *attn = ir_softmax(g, ir_where(g, mask, ir_const(g, -1e30, IR_F32), dots));
    x = ir_binary(g, IR_ADD, x, ir_matmul(g, attn, v, 0));
    IrNode *f = ir_unary(g, IR_GELU, ir_matmul(g, layer_norm(g, x, D, "ln2"), ir_param(g, "w1", 2, sf), 1));
    x = ir_binary(g, IR_ADD, x, ir_matmul(g, f, ir_param(g, "w2", 2, (IrDim[]){ir_dim(D), ir_dim(40)}), 1));
    IrNode *logits = ir_matmul(g, x, ir_param(g, "emb", 2, se), 1);
    out(g, "logits", logits);
    out(g, "loss", ir_xent(g, logits, input(g, "tgt", IR_I64, 2, st)));
    char err[512];
    ck_assert_msg(ir_autodiff(g, NULL, err, sizeof err) == 0, "autodiff: %s", err);
}

/* Fused row programs sized for CUDA's 8-columns-a-thread path (cg_cuda_fused.c): LayerNorm over 1040, softmax and
 * cross-entropy's gradient over 24 classes, rows of n + 1 (a multiple of 8 only at n = 7: the run-time test; else a
 * column at a time); the cross-entropy loss over 2064 classes (cg_cuda_reduce.c: more than one 8-class step) */
static void build_fused_rows(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(1040)}, sz[] = {b, n, ir_dim(24)}, s1[] = {b, n, ir_dim(1)};
    IrDim sr[] = {b, ir_dim(3), ir_dim_addc(n, 1)};
    out(g, "ln", layer_norm(g, input(g, "x", IR_F32, 3, sx), 1040, "ln"));
    IrNode *z = input(g, "z", IR_F32, 3, sz);
    IrNode *d = ir_binary(g, IR_SUB, ir_softmax(g, z), input(g, "onehot", IR_F32, 3, sz));
    out(g, "xent_grad", ir_binary(g, IR_MUL, d, input(g, "wt", IR_F32, 3, s1)));
    IrNode *r = input(g, "r", IR_F32, 3, sr);
    out(g, "centred", ir_binary(g, IR_SUB, r, ir_binary(g, IR_MUL, ir_reduce(g, IR_SUM, r, -1), ir_const(g, 0.25, IR_F32))));
    IrDim sc[] = {b, n, ir_dim(2064)}, st[] = {b, n};
    out(g, "loss_rows", ir_xent(g, input(g, "zc", IR_F32, 3, sc), input(g, "tgt", IR_I64, 2, st)));
}

/* elementwise and data movement ops under autodiff, seeded by the caller's output gradient */
static void build_train_ops(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(6)}, sp[] = {ir_dim(6)};
    IrNode *x = input(g, "x", IR_F32, 3, sx);
    IrNode *w = ir_param(g, "w", 1, sp);
    IrNode *y = ir_binary(g, IR_MUL, x, w);
    y = ir_binary(g, IR_ADD, ir_unary(g, IR_TANH, y), ir_unary(g, IR_SIGMOID, ir_binary(g, IR_DIV, y, positive(g, w))));
    y = ir_binary(g, IR_ADD, y, ir_unary(g, IR_SIN, ir_binary(g, IR_MAX, y, w)));
    y = ir_binary(g, IR_MUL, y, ir_unary(g, IR_EXP, ir_binary(g, IR_MIN, w, ir_const(g, 0.3, IR_F32))));
    y = ir_binary(g, IR_ADD, y, ir_unary(g, IR_SQRT, positive(g, ir_binary(g, IR_SUB, y, w))));
    IrNode *cat = ir_concat(g, y, ir_unary(g, IR_COS, y), 2);
    IrNode *sl = ir_slice(g, cat, 2, ir_dim(3), ir_dim(6));
    int perm[3] = {1, 0, 2};
    IrNode *pm = ir_permute(g, sl, perm);
    IrNode *red = ir_reduce(g, IR_RMAX, pm, 1);
    IrDim te[] = {n, b, ir_dim(6)};
    IrNode *z = ir_binary(g, IR_ADD, pm, ir_expand(g, red, 3, te));
    out(g, "z", ir_unary(g, IR_RELU, ir_binary(g, IR_SUB, z, ir_unary(g, IR_LOG, positive(g, z)))));
    out(g, "s", ir_reduce(g, IR_SUM, ir_unary(g, IR_ABS, ir_unary(g, IR_NEG, y)), 0));
    IrGradOpts go = {.loss = NULL, .seed_outputs = 1};
    char err[512];
    ck_assert_msg(ir_autodiff(g, &go, err, sizeof err) == 0, "autodiff: %s", err);
}

/* every form of matmul the generator has, at sizes around the 64 x 64 tile and the 32-wide
 * k-step */
static void build_mma_forms(IrGraph *g, IrDim b, IrDim n)
{
    matmul_forms(g, b, n);
    IrDim s64a[] = {ir_dim(64), ir_dim(32)}, s64b[] = {ir_dim(32), ir_dim(64)};
    out(g, "one_tile", ir_matmul(g, input(g, "e1", IR_F32, 2, s64a), input(g, "e2", IR_F32, 2, s64b), 0));
}

/* Incremental decoding's shapes: few rows against long operands, the CUDA kernels' run-time
 * paths for them (cg_cuda_gemv.c: M <= 16; cg_cuda_attention_decode.c: I <= 8). M and I grow
 * with b (1 to 3), the keys with n: J = 3 n (3 to 390 keys, one warp to four blocks of them).
 * Products: B transposed with K a multiple of 8 (16-byte loads) and not (37), B as stored, 6 b
 * rows (two runs of 8 rows at b = 2, past 16 at b = 3: the tiles), a bias with GELU and GLU halves
 * both ways (epilogues the pipeline fuses), a B per batch index. Attention: plain, causal, every
 * operand (bias, mask, scale) with the logsumexp, a padding mask, windows, more queries than
 * keys (J = 2 b - 2: no key at b = 1; under causal, rows without keys), heads 64 and 40 wide,
 * heads split in place. */
static void build_decode(IrGraph *g, IrDim b, IrDim n)
{
    static const int split[4] = {0, 2, 1, 3};
    IrDim J = ir_dim_add(ir_dim_add(n, n), n), J0 = ir_dim_addc(ir_dim_add(b, b), -2), h = ir_dim(2), one = ir_dim(1);
    IrDim sx[] = {ir_dim(2), b, ir_dim(72)}, sw[] = {ir_dim(37), ir_dim(72)}, sx37[] = {b, ir_dim(37)};
    IrDim sw37[] = {ir_dim(45), ir_dim(37)}, swn[] = {ir_dim(72), ir_dim(45)}, sbias[] = {ir_dim(45)};
    IrDim sn[] = {n};
    out(g, "n_bound", ir_unary(g, IR_NEG, input(g, "nb", IR_F32, 1, sn))); /* n from an input: J = 3 n follows */
    IrNode *x = input(g, "x", IR_F32, 3, sx);
    out(g, "gemv_t", ir_matmul(g, x, ir_param(g, "w", 2, sw), 1));
    out(g, "gemv_t37", ir_matmul(g, input(g, "x37", IR_F32, 2, sx37), ir_param(g, "w37", 2, sw37), 1));
    IrNode *hn = ir_binary(g, IR_ADD, ir_matmul(g, x, ir_param(g, "wn", 2, swn), 0), ir_param(g, "bn", 1, sbias));
    out(g, "gemv_bias_gelu", ir_unary(g, IR_GELU, hn));
    IrDim s6[] = {ir_dim_add(ir_dim_add(ir_dim_add(b, b), ir_dim_add(b, b)), ir_dim_add(b, b)), ir_dim(72)};
    out(g, "gemv_rows", ir_matmul(g, input(g, "x6", IR_F32, 2, s6), ir_param(g, "w", 2, sw), 1));
    IrDim sgl[] = {ir_dim(74), ir_dim(72)}, sgln[] = {ir_dim(72), ir_dim(80)}, sglb[] = {ir_dim(74)};
    IrNode *proj = ir_binary(g, IR_ADD, ir_matmul(g, x, ir_param(g, "wglu", 2, sgl), 1), ir_param(g, "bglu", 1, sglb));
    out(g, "gemv_glu_t", ir_binary(g, IR_MUL, ir_slice(g, proj, -1, ir_dim(0), ir_dim(37)),
                                   ir_unary(g, IR_GELU, ir_slice(g, proj, -1, ir_dim(37), ir_dim(37)))));
    IrNode *proj2 = ir_matmul(g, x, ir_param(g, "wglu2", 2, sgln), 0);
    out(g, "gemv_glu", ir_binary(g, IR_MUL, ir_unary(g, IR_SIGMOID, ir_slice(g, proj2, -1, ir_dim(0), ir_dim(40))),
                                 ir_slice(g, proj2, -1, ir_dim(40), ir_dim(40))));
    IrDim sgq[] = {ir_dim(3), b, ir_dim(40)}, sgk[] = {ir_dim(3), J, ir_dim(40)};
    out(g, "gemv_batched_t", ir_matmul(g, input(g, "gq", IR_F32, 3, sgq), input(g, "gk", IR_F32, 3, sgk), 1));
    IrDim sq[] = {ir_dim(2), h, b, ir_dim(8)}, sk[] = {ir_dim(2), h, J, ir_dim(8)}, sv[] = {ir_dim(2), h, J, ir_dim(12)};
    IrDim sk0[] = {ir_dim(2), h, J0, ir_dim(8)}, sab[] = {h, b, J}, smask[] = {ir_dim(2), one, one, J};
    IrDim sscale[] = {ir_dim(2), h, one, one}, sqm[] = {ir_dim(2), one, b, one};
    IrNode *q = input(g, "q", IR_F32, 4, sq), *k = input(g, "k", IR_F32, 4, sk), *v = input(g, "v", IR_F32, 4, sv);
    IrNode *k0 = input(g, "k0", IR_F32, 4, sk0), *v0 = input(g, "v0", IR_F32, 4, sk0);
    IrNode *bias = input(g, "bias", IR_F32, 3, sab), *mask = input(g, "mask", IR_BOOL, 4, smask);
    IrNode *scale = input(g, "scale", IR_F32, 4, sscale), *c = ir_const(g, 0.35, IR_F32);
    IrNode *pad = ir_binary(g, IR_AND, input(g, "qmask", IR_BOOL, 4, sqm), input(g, "kmask", IR_BOOL, 4, smask));
    out(g, "att_plain", ir_attention(g, q, k, v, NULL, NULL, c, 0, 0));
    out(g, "att_causal", ir_attention(g, q, k, v, NULL, NULL, c, 1, 1));
    out(g, "att_all", ir_attention(g, q, k, v, bias, mask, scale, 1, 1));
    out(g, "att_padded", ir_attention(g, q, k, v, NULL, pad, c, 0, 1));
    out(g, "att_window", ir_attention_window(g, q, k, v, NULL, NULL, c, 1, 1, 40));
    out(g, "att_window_all", ir_attention_window(g, q, k, v, bias, pad, scale, 0, 1, 3));
    out(g, "att_few_keys", ir_attention(g, q, k0, v0, NULL, NULL, c, 1, 1));
    IrDim s64[] = {ir_dim(2), one, b, ir_dim(64)}, s64k[] = {ir_dim(2), one, J, ir_dim(64)}, s40[] = {ir_dim(2), one, J, ir_dim(40)};
    out(g, "att_head64", ir_attention(g, input(g, "q64", IR_F32, 4, s64), input(g, "k64", IR_F32, 4, s64k),
                                      input(g, "v40", IR_F32, 4, s40), NULL, NULL, ir_const(g, 0.125, IR_F32), 1, 1));
    IrDim sxq[] = {ir_dim(2), b, h, ir_dim(16)}, sxk[] = {ir_dim(2), J, h, ir_dim(16)};
    IrNode *hq = ir_permute(g, input(g, "xq", IR_F32, 4, sxq), split);
    IrNode *hk = ir_permute(g, input(g, "xk", IR_F32, 4, sxk), split);
    IrNode *hv = ir_permute(g, input(g, "xv", IR_F32, 4, sxk), split);
    out(g, "att_heads", ir_permute(g, ir_attention(g, hq, hk, hv, NULL, NULL, c, 1, 0), split));
}

/* matmuls with epilogues for the fusion pass: bias, activation, residual, GLU */
static void build_mma_epilogues(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(40)}, sw[] = {ir_dim(40), ir_dim(72)}, sbias[] = {ir_dim(72)}, sy[] = {b, n, ir_dim(72)};
    IrNode *x = input(g, "x", IR_F32, 3, sx), *w = ir_param(g, "w", 2, sw), *bias = ir_param(g, "bias", 1, sbias);
    IrNode *h = ir_binary(g, IR_ADD, ir_matmul(g, x, w, 0), bias);
    out(g, "gelu", ir_unary(g, IR_GELU, h));
    IrDim swt[] = {ir_dim(72), ir_dim(40)};
    IrNode *y = ir_binary(g, IR_ADD, ir_matmul(g, x, ir_param(g, "wt", 2, swt), 1), input(g, "res", IR_F32, 3, sy));
    out(g, "residual", ir_binary(g, IR_MUL, y, ir_const(g, 0.5, IR_F32)));
    /* GLU: the halves of one product (a two-part epilogue, ir_epilogue_parts) */
    IrDim sg[] = {ir_dim(144), ir_dim(40)};
    IrNode *p = ir_matmul(g, x, ir_param(g, "wg", 2, sg), 1);
    out(g, "glu", ir_binary(g, IR_MUL, ir_slice(g, p, -1, ir_dim(0), ir_dim(72)),
                                  ir_unary(g, IR_GELU, ir_slice(g, p, -1, ir_dim(72), ir_dim(72)))));
}

/* The paths of the kernel for operands stored in the mma's format (cg_cuda_matmul_mma.c, --dtype
 * bf16 and fp16): K = 136 (a 5-stage run through the 3 buffers) with B as [K, N] and [N, K];
 * symbolic K = n + 7, which allows the 16-byte copies at n = 1, 17, 33, 65 and not at 7, 130, 0
 * (the kernel's run-time branch both ways); broadcast batches; and 44 b batches of n x 24 by
 * 24 x 16 and 24 x 24 transposed, and their Gram matrices 24 x n by n x 24 (A read transposed in
 * place, CG_VIEW_A_T): at b = 3 these are 132 tiles, the 128 x 128 tiles' side of the choice
 * (ragged in M, N and K), the others the 64 x 64 tiles. */
static void build_mma16_forms(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(136)}, sw[] = {ir_dim(136), ir_dim(72)}, swt[] = {ir_dim(80), ir_dim(136)};
    IrNode *x = input(g, "x", IR_F32, 3, sx);
    out(g, "deep", ir_matmul(g, x, ir_param(g, "w", 2, sw), 0));
    out(g, "deep_t", ir_matmul(g, x, ir_param(g, "wt", 2, swt), 1));
    IrDim k7 = ir_dim_addc(n, 7), sl[] = {ir_dim(24), k7}, sr[] = {k7, ir_dim(40)}, srt[] = {ir_dim(40), k7};
    IrNode *l = input(g, "l", IR_F32, 2, sl);
    out(g, "symbolic_k", ir_matmul(g, l, input(g, "r", IR_F32, 2, sr), 0));
    out(g, "symbolic_k_t", ir_matmul(g, l, input(g, "rt", IR_F32, 2, srt), 1));
    IrDim sq[] = {b, ir_dim(4), n, ir_dim(16)}, sk[] = {ir_dim(1), ir_dim(4), ir_dim(16), ir_dim(24)};
    out(g, "bcast", ir_matmul(g, input(g, "q", IR_F32, 4, sq), input(g, "k", IR_F32, 4, sk), 0));
    IrDim sm[] = {b, ir_dim(44), n, ir_dim(24)}, smw[] = {ir_dim(24), ir_dim(16)}, smt[] = {ir_dim(24), ir_dim(24)};
    IrNode *many = input(g, "many", IR_F32, 4, sm);
    out(g, "many", ir_matmul(g, many, ir_param(g, "mw", 2, smw), 0));
    out(g, "many_t", ir_matmul(g, many, ir_param(g, "mwt", 2, smt), 1));
    static const int swap_last[] = {0, 1, 3, 2};
    out(g, "many_at", ir_matmul(g, ir_permute(g, many, swap_last), many, 0));
}

/* ... with the fused epilogues: bias and GELU, a residual, the GLU split with B as [K, N] (its
 * halves 80 wide: 16-byte copies) and as [N, K] */
static void build_mma16_epilogues(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(136)}, sw[] = {ir_dim(136), ir_dim(72)}, sbias[] = {ir_dim(72)};
    IrNode *x = input(g, "x", IR_F32, 3, sx);
    IrNode *h = ir_binary(g, IR_ADD, ir_matmul(g, x, ir_param(g, "w", 2, sw), 0), ir_param(g, "bias", 1, sbias));
    out(g, "gelu", ir_unary(g, IR_GELU, h));
    IrDim swt[] = {ir_dim(72), ir_dim(136)}, sy[] = {b, n, ir_dim(72)};
    IrNode *y = ir_binary(g, IR_ADD, ir_matmul(g, x, ir_param(g, "wt", 2, swt), 1), input(g, "res", IR_F32, 3, sy));
    out(g, "residual", ir_binary(g, IR_MUL, y, ir_const(g, 0.5, IR_F32)));
    IrDim sg[] = {ir_dim(136), ir_dim(160)}, sgt[] = {ir_dim(144), ir_dim(136)};
    IrNode *p = ir_matmul(g, x, ir_param(g, "wg", 2, sg), 0);
    out(g, "glu", ir_binary(g, IR_MUL, ir_unary(g, IR_SIGMOID, ir_slice(g, p, -1, ir_dim(0), ir_dim(80))),
                            ir_slice(g, p, -1, ir_dim(80), ir_dim(80))));
    IrNode *pt = ir_matmul(g, x, ir_param(g, "wgt", 2, sgt), 1);
    out(g, "glu_t", ir_binary(g, IR_MUL, ir_slice(g, pt, -1, ir_dim(0), ir_dim(72)),
                              ir_unary(g, IR_GELU, ir_slice(g, pt, -1, ir_dim(72), ir_dim(72)))));
}

/* A read through a permute of its last two dims (dW = g^T x): the CPU and CUDA read it in place (CG_VIEW_A_T), batched
 * (k = n), k past KC with a partial tile, m past two MC blocks, n past a column block (301) and the CPU A^T path's double
 * one (530), the plain path (5 columns), summed over the batch (CG_VIEW_SUM_B); m, n multiples of 8 (CUDA's 16-byte
 * copies, at_vec), summed too; build_matmul_at adds a permute another op reads (no view; test_cpu_bf16 runs the forms) */
static const int swap3[] = {0, 2, 1}, swap2[] = {1, 0};
static IrNode *matmul_at_forms(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(37)}, sy[] = {b, n, ir_dim(45)}, sd[] = {ir_dim(300), ir_dim(29)};
    IrDim sd2[] = {ir_dim(300), ir_dim(40)}, sd3[] = {ir_dim(300), ir_dim(5)}, st[] = {ir_dim(2), ir_dim(300), ir_dim(401)};
    IrNode *x = input(g, "x", IR_F32, 3, sx), *deep = ir_permute(g, input(g, "deep", IR_F32, 2, sd), swap2);
    out(g, "at_batch", ir_matmul(g, ir_permute(g, x, swap3), input(g, "y", IR_F32, 3, sy), 0));
    out(g, "at_deep", ir_matmul(g, deep, input(g, "deep2", IR_F32, 2, sd2), 0));
    out(g, "at_plain", ir_matmul(g, deep, input(g, "deep3", IR_F32, 2, sd3), 0));
    out(g, "at_wide", ir_matmul(g, deep, input(g, "wide", IR_F32, 2, (IrDim[]){ir_dim(300), ir_dim(301)}), 0));
    out(g, "at_wider", ir_matmul(g, deep, input(g, "wider", IR_F32, 2, (IrDim[]){ir_dim(300), ir_dim(530)}), 0));
    out(g, "at_tall", ir_matmul(g, ir_permute(g, input(g, "tall", IR_F32, 3, st), swap3), input(g, "tall2", IR_F32, 2, sd2), 0));
    out(g, "at_sum", ir_reduce(g, IR_SUM, ir_matmul(g, ir_permute(g, x, swap3), input(g, "y3", IR_F32, 3, sy), 0), 0));
    IrDim sv[] = {b, n, ir_dim(64)}, sw[] = {b, n, ir_dim(40)};
    IrNode *v = input(g, "xv", IR_F32, 3, sv);
    out(g, "at_vec", ir_matmul(g, ir_permute(g, v, swap3), input(g, "yv", IR_F32, 3, sw), 0));
    out(g, "at_vec_sum", ir_reduce(g, IR_SUM, ir_matmul(g, ir_permute(g, v, swap3), input(g, "yv2", IR_F32, 3, sw), 0), 0));
    return x;
}
static void build_matmul_at(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sy[] = {b, n, ir_dim(45)};
    IrNode *both = ir_permute(g, matmul_at_forms(g, b, n), swap3);
    out(g, "at_shared", ir_matmul(g, both, input(g, "y2", IR_F32, 3, sy), 0));
    out(g, "at_shared_exp", ir_unary(g, IR_EXP, both));
}

/* ---- the table ---- */

static const OpCase OP_CASES[] = {
    {"unary", build_unary, OC_CPU | OC_CUDA, OC_EMPTY, 1e-4, NULL},
    {"binary", build_binary, OC_CPU | OC_CUDA, OC_EMPTY, 1e-4, NULL},
    {"reduce", build_reduce, OC_CPU | OC_CUDA, 0, 1e-4, NULL},
    {"order", build_order, OC_CPU | OC_CUDA, OC_EMPTY, 1e-4, NULL},
    {"move", build_move, OC_CPU | OC_CUDA, 0, 1e-4, NULL},
    {"copies", build_copies, OC_CPU | OC_CUDA, 0, 1e-4, NULL},
    {"matmul", build_matmul, OC_CPU | OC_CUDA, OC_EMPTY, 1e-4, NULL},
    {"matmul_at", build_matmul_at, OC_CPU | OC_CUDA | OC_MMA16, OC_EMPTY, 1e-4, NULL},
    {"matmul_q8", build_matmul_q8, OC_CPU, OC_EMPTY, 1e-4, "int8 weights are for the cpu target (op_case_backend_exempt)"},
    {"xent", build_xent, OC_CPU | OC_CUDA, OC_EMPTY, 1e-4, NULL},
    {"rand", build_rand, OC_CPU | OC_CUDA, OC_EMPTY, 1e-4, NULL},
    {"attention", build_attention, OC_CPU | OC_CUDA, 0, 1e-4, NULL},
    {"heads", build_heads, OC_CPU | OC_CUDA, 0, 1e-4, NULL},
    {"attention_grouped", build_attention_grouped, OC_CPU | OC_CUDA, 0, 1e-4, NULL},
    {"attention_grouped_grad", build_attention_grouped_grad, OC_CPU | OC_CUDA, 0, 1e-4, NULL},
    {"attention_grouped_tiles", build_attention_grouped_tiles, OC_CPU, 0, 1e-4,
     "CPU tiles: 2n + 60 keys at the CUDA sizes' n = 130, slow in the emulator (attention_grouped_grad has CUDA's)"},
    {"attention_tiles", build_attention_tiles, OC_CPU, OC_EMPTY, 1e-4,
     "CPU tiles: 16 n + 60 queries are 2140 at the CUDA sizes' n = 130, too slow for the emulator"},
    {"attention_bounded", build_attention_bounded, OC_CPU, OC_EMPTY, 1e-4,
     "CPU tiles, too slow for the emulator: attention_bounded_cuda is sized for the CUDA kernels"},
    {"attention_bounded_cuda", build_attention_bounded_cuda, OC_CUDA, OC_ONCE, 1e-4,
     "sized for the CUDA kernels' tiles; the CPU's bounded paths: attention_bounded"},
    {"fused", build_fused, OC_CPU, OC_EMPTY, 1e-4,
     "hand-written programs for the CPU epilogue paths; CUDA gets its fused ops from the pipeline over every case"},
    {"train_block", build_train_block, OC_CUDA, 0, 1e-4, "CPU training graphs: test_train, test_parity_train"},
    {"train_ops", build_train_ops, OC_CUDA, 0, 1e-4, "CPU training graphs: test_train, test_parity_train"},
    {"fused_rows", build_fused_rows, OC_CUDA, 0, 1e-4, "sized for the CUDA row kernels' 8-column path; the CPU's: fused"},
    {"matmul_large", build_matmul_large, OC_CUDA, OC_ONCE, 1e-4, "sized for the CUDA kernels' 128 x 128 tiles"},
    {"attention_many", build_attention_many, OC_CUDA, OC_ONCE, 1e-4, "sized for the CUDA kernel's 64-row tiles"},
    {"reduce_long", build_reduce_long, OC_CUDA, OC_ONCE, 1e-4, "sized for the CUDA reductions' block splits"},
    {"decode", build_decode, OC_CPU | OC_CUDA, 0, 1e-4, NULL},
    {"mma_forms", build_mma_forms, OC_MMA, OC_EMPTY, 1e-5, "tensor cores only"},
    {"mma_epilogues", build_mma_epilogues, OC_MMA, OC_EMPTY | OC_FUSE, 1e-5, "tensor cores only"},
    {"mma16_forms", build_mma16_forms, OC_MMA16, OC_EMPTY, 1e-5, "tensor cores on 16-bit storage only"},
    {"mma16_epilogues", build_mma16_epilogues, OC_MMA16, OC_EMPTY | OC_FUSE, 1e-5, "tensor cores on 16-bit storage only"},
};
#define OP_NCASES ((int)(sizeof OP_CASES / sizeof OP_CASES[0]))

/* The ops that need no case, with the reason; none today: every op of ops.def is lowered by both
 * backends (test_every_op_has_a_lowering, test_every_op_has_a_kernel), and the leaves (INPUT,
 * PARAM, BUFFER: bound, not computed) are read by every case anyway. A front-end-only or pseudo
 * op that no backend lowers would get a line:  case IR_X: return "why"; */
static inline const char *op_case_exempt(IrOp op)
{
    switch (op) {
    default:
        return NULL;
    }
}

/* Why backend has no kernel for op and no case runs it there (NULL: it must have both). */
static inline const char *op_case_backend_exempt(IrOp op, unsigned backend)
{
    if (op == IR_MATMUL_Q8 && (backend & (OC_CUDA | OC_MMA | OC_MMA16)))
        return "int8 weights run on the cpu target; the cuda targets refuse --weights-dtype int8";
    return NULL;
}

/* The k-th case (0, 1, ...) of the table for backend, or NULL past the last. */
static inline const OpCase *op_case_for(unsigned backend, int k)
{
    for (int i = 0; i < OP_NCASES; i++)
        if ((OP_CASES[i].backends & backend) && k-- == 0)
            return &OP_CASES[i];
    return NULL;
}

static inline int op_case_count(unsigned backend)
{
    int n = 0;
    while (op_case_for(backend, n))
        n++;
    return n;
}

/* The first op of ops.def that no case of cases[0..n) run on backend uses, -1 when every op but the
 * exempt ones has one. With target (the backend's, through the compile driver), an op also counts
 * as used where the pass pipeline makes it from a case, as the suites that run the pipeline over
 * their cases do. */
static inline int op_cases_missing(const OpCase *cases, int n, unsigned backend, const char *target)
{
    int seen[IR_NUM_OPS] = {0};
    for (int c = 0; c < n; c++) {
        if (!(cases[c].backends & backend))
            continue;
        IrGraph *g = harness_new_graph(cases[c].name, cases[c].build, 256);
        for (int i = 0; i < g->nnodes; i++)
            seen[g->nodes[i]->op] = 1;
        if (target) {
            PassOptions po = {0};
            char err[512];
            IrGraph *h = harness_passes(g, target, &po, err, sizeof err);
            ck_assert_msg(h != NULL, "%s: passes: %s", cases[c].name, err);
            for (int i = 0; i < h->nnodes; i++)
                seen[h->nodes[i]->op] = 1;
            ir_graph_free(h);
        }
        ir_graph_free(g);
    }
    for (int op = 0; op < IR_NUM_OPS; op++)
        if (!seen[op] && !op_case_exempt((IrOp)op) && !op_case_backend_exempt((IrOp)op, backend))
            return op;
    return -1;
}

#endif
