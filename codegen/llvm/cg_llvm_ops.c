/* cg_llvm_ops.c: how each op of ops.def becomes LLVM IR on the CPU: the lowering table (one
 * designated-initializer row per op, its length checked against the op table) and every
 * lowering but matmul's (cg_llvm_matmul.c).
 *
 * Work items, the unit the thread pool splits: rows of the output (and chunks of long rows)
 * for elementwise ops and copies, rows of the reduced tensor for reductions and softmax,
 * index elements for gather. Inner loops run over contiguous memory with operand strides known
 * to be 0 or 1 at compile time, which is what lets LLVM's loop vectoriser handle them. */
#include "cg_llvm.h"

#include <math.h>
#include <string.h>

#define CHUNK 8192 /* elements of one row per work item, so long rows still split over threads */

/* ---- iteration over an output shape, rows x chunks of the last (collapsed) dimension ---- */

/* Element stride of operand x over output group g: the product of x's dims after the group. */
static LLVMValueRef operand_stride(CgFn *f, const IrNode *x, const CgSpace *sp, int g)
{
    int k = sp->to[g] - 1 - (f->node->rank - x->rank);
    return cg_dims_prod(f, x->shape, k + 1, x->rank);
}

static LLVMValueRef group_size(CgFn *f, const CgSpace *sp, int g)
{
    return cg_dims_prod(f, f->node->shape, sp->from[g], sp->to[g]);
}

/* rows = product of all groups but the last; inner = the last group (1 if none) */
static void rows_inner(CgFn *f, const CgSpace *sp, LLVMValueRef *rows, LLVMValueRef *inner)
{
    Cg *cg = f->cg;
    *rows = cg_i64(cg, 1);
    *inner = cg_i64(cg, 1);
    for (int g = 0; g < sp->ngroups; g++) {
        LLVMValueRef s = group_size(f, sp, g);
        if (g + 1 < sp->ngroups)
            *rows = LLVMBuildMul(cg->b, *rows, s, "");
        else
            *inner = s;
    }
}

static LLVMValueRef nchunks(Cg *cg, LLVMValueRef inner)
{
    LLVMValueRef n = LLVMBuildSDiv(cg->b, LLVMBuildAdd(cg->b, inner, cg_i64(cg, CHUNK - 1), ""), cg_i64(cg, CHUNK), "");
    return LLVMBuildSelect(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, n, cg_i64(cg, 1), ""), cg_i64(cg, 1), n, "");
}

static void work_rows_of(CgFn *f, LLVMValueRef rows, LLVMValueRef inner, LLVMValueRef *items, LLVMValueRef *cost)
{
    Cg *cg = f->cg;
    *items = LLVMBuildMul(cg->b, rows, nchunks(cg, inner), "items");
    *cost = LLVMBuildMul(cg->b, rows, inner, "cost");
}

/* The item loop shared by elementwise ops and copies: for each item, the row, its index in each
 * group, and the chunk [j0, j1) of the row. body() emits the inner work. */
typedef struct {
    LLVMValueRef row, j0, j1, inner;
    LLVMValueRef idx[IR_MAXRANK]; /* per group but the last */
} RowItem;

static void for_row_items(CgFn *f, const CgSpace *sp, void (*body)(CgFn *f, const CgSpace *sp, RowItem *it, void *ctx),
                          void *ctx)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    LLVMValueRef rows, inner;
    rows_inner(f, sp, &rows, &inner);
    (void)rows;
    LLVMValueRef nch = nchunks(cg, inner);
    LLVMValueRef sizes[IR_MAXRANK];
    for (int g = 0; g + 1 < sp->ngroups; g++)
        sizes[g] = group_size(f, sp, g);
    CgLoop l;
    cg_for(f, &l, f->lo, f->hi, "item");
    RowItem it;
    memset(&it, 0, sizeof it);
    it.inner = inner;
    it.row = LLVMBuildSDiv(b, l.iv, nch, "row");
    LLVMValueRef ch = LLVMBuildSRem(b, l.iv, nch, "");
    it.j0 = LLVMBuildMul(b, ch, cg_i64(cg, CHUNK), "");
    it.j1 = cg_min_i64(f, inner, LLVMBuildAdd(b, it.j0, cg_i64(cg, CHUNK), ""));
    LLVMValueRef r = it.row;
    for (int g = sp->ngroups - 2; g >= 0; g--) {
        if (g == 0) {
            it.idx[g] = r;
            break;
        }
        it.idx[g] = LLVMBuildSRem(b, r, sizes[g], "");
        r = LLVMBuildSDiv(b, r, sizes[g], "");
    }
    body(f, sp, &it, ctx);
    cg_for_end(f, &l);
}

/* ---- elementwise ---- */

static void work_elem(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    CgSpace sp;
    cg_space_of(f->node, &sp);
    LLVMValueRef rows, inner;
    rows_inner(f, &sp, &rows, &inner);
    work_rows_of(f, rows, inner, items, cost);
}

static void elem_body(CgFn *f, const CgSpace *sp, RowItem *it, void *ctx)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    const CgLower *L = ctx;
    int last = sp->ngroups - 1;
    LLVMValueRef base[IR_MAXIN];
    for (int k = 0; k < n->nin; k++) {
        base[k] = cg_i64(cg, 0);
        for (int g = 0; g < last; g++)
            if (!sp->bcast[k][g])
                base[k] = LLVMBuildAdd(b, base[k], LLVMBuildMul(b, it->idx[g], operand_stride(f, n->in[k], sp, g), ""), "");
    }
    LLVMValueRef obase = LLVMBuildMul(b, it->row, it->inner, "");
    CgLoop l;
    cg_for(f, &l, it->j0, it->j1, "j");
    LLVMValueRef args[IR_MAXIN];
    for (int k = 0; k < n->nin; k++) {
        LLVMValueRef idx = last >= 0 && !sp->bcast[k][last] ? LLVMBuildAdd(b, base[k], l.iv, "") : base[k];
        args[k] = cg_load(f, n->in[k]->dtype, f->in[k], idx);
    }
    cg_store(f, n->dtype, f->out, LLVMBuildAdd(b, obase, l.iv, ""), L->scalar(f, args));
    cg_for_end(f, &l);
}

static int impl_elem(CgFn *f)
{
    CgSpace sp;
    cg_space_of(f->node, &sp);
    for_row_items(f, &sp, elem_body, (void *)cg_llvm_lowering(f->node->op));
    return 0;
}

/* scalar semantics, matching ir/interp.c */

static int is_float(CgFn *f) { return f->node->in[0]->dtype == IR_F32; }

static LLVMValueRef s_neg(CgFn *f, LLVMValueRef *a) { return LLVMBuildFNeg(f->cg->b, a[0], ""); }
static LLVMValueRef s_exp(CgFn *f, LLVMValueRef *a) { return cg_exp(f->cg, a[0]); }
static LLVMValueRef s_log(CgFn *f, LLVMValueRef *a) { return cg_intrinsic(f->cg, "llvm.log", f->cg->t_f32, a, 1); }
static LLVMValueRef s_sqrt(CgFn *f, LLVMValueRef *a) { return cg_intrinsic(f->cg, "llvm.sqrt", f->cg->t_f32, a, 1); }
static LLVMValueRef s_rsqrt(CgFn *f, LLVMValueRef *a)
{
    return LLVMBuildFDiv(f->cg->b, cg_f32(f->cg, 1.0), s_sqrt(f, a), "");
}
static LLVMValueRef s_recip(CgFn *f, LLVMValueRef *a) { return LLVMBuildFDiv(f->cg->b, cg_f32(f->cg, 1.0), a[0], ""); }
static LLVMValueRef s_tanh(CgFn *f, LLVMValueRef *a) { return cg_libm(f->cg, "tanhf", a[0]); }
static LLVMValueRef s_sigmoid(CgFn *f, LLVMValueRef *a)
{
    Cg *cg = f->cg;
    LLVMValueRef e = cg_exp(cg, LLVMBuildFNeg(cg->b, a[0], ""));
    return LLVMBuildFDiv(cg->b, cg_f32(cg, 1.0), LLVMBuildFAdd(cg->b, cg_f32(cg, 1.0), e, ""), "");
}
static LLVMValueRef s_gelu(CgFn *f, LLVMValueRef *a)
{
    Cg *cg = f->cg;
    LLVMValueRef e = cg_erf(cg, LLVMBuildFMul(cg->b, a[0], cg_f32(cg, 0.70710678118654752440), ""));
    LLVMValueRef h = LLVMBuildFMul(cg->b, a[0], cg_f32(cg, 0.5), "");
    return LLVMBuildFMul(cg->b, h, LLVMBuildFAdd(cg->b, cg_f32(cg, 1.0), e, ""), "");
}
static LLVMValueRef s_erf(CgFn *f, LLVMValueRef *a) { return cg_erf(f->cg, a[0]); }
static LLVMValueRef s_relu(CgFn *f, LLVMValueRef *a)
{
    Cg *cg = f->cg; /* x > 0 ? x : 0 * x, which keeps NaN */
    LLVMValueRef pos = LLVMBuildFCmp(cg->b, LLVMRealOGT, a[0], cg_f32(cg, 0), "");
    return LLVMBuildSelect(cg->b, pos, a[0], LLVMBuildFMul(cg->b, a[0], cg_f32(cg, 0), ""), "");
}
static LLVMValueRef s_sin(CgFn *f, LLVMValueRef *a) { return cg_intrinsic(f->cg, "llvm.sin", f->cg->t_f32, a, 1); }
static LLVMValueRef s_cos(CgFn *f, LLVMValueRef *a) { return cg_intrinsic(f->cg, "llvm.cos", f->cg->t_f32, a, 1); }
static LLVMValueRef s_abs(CgFn *f, LLVMValueRef *a) { return cg_intrinsic(f->cg, "llvm.fabs", f->cg->t_f32, a, 1); }
static LLVMValueRef s_not(CgFn *f, LLVMValueRef *a) { return LLVMBuildNot(f->cg->b, a[0], ""); }
static LLVMValueRef s_cast(CgFn *f, LLVMValueRef *a)
{
    return cg_convert(f, a[0], f->node->in[0]->dtype, f->node->dtype);
}

static LLVMValueRef s_add(CgFn *f, LLVMValueRef *a)
{
    return is_float(f) ? LLVMBuildFAdd(f->cg->b, a[0], a[1], "") : LLVMBuildAdd(f->cg->b, a[0], a[1], "");
}
static LLVMValueRef s_sub(CgFn *f, LLVMValueRef *a)
{
    return is_float(f) ? LLVMBuildFSub(f->cg->b, a[0], a[1], "") : LLVMBuildSub(f->cg->b, a[0], a[1], "");
}
static LLVMValueRef s_mul(CgFn *f, LLVMValueRef *a)
{
    return is_float(f) ? LLVMBuildFMul(f->cg->b, a[0], a[1], "") : LLVMBuildMul(f->cg->b, a[0], a[1], "");
}
static LLVMValueRef s_div(CgFn *f, LLVMValueRef *a)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    if (is_float(f))
        return LLVMBuildFDiv(b, a[0], a[1], "");
    /* truncating; a zero divisor is an error (the status), and neither it nor MIN / -1 may trap */
    LLVMTypeRef t = LLVMTypeOf(a[0]);
    LLVMValueRef zero = LLVMBuildICmp(b, LLVMIntEQ, a[1], LLVMConstInt(t, 0, 0), "");
    cg_flag_error(f, zero);
    LLVMValueRef minus1 = LLVMBuildICmp(b, LLVMIntEQ, a[1], LLVMConstAllOnes(t), "");
    LLVMValueRef safe = LLVMBuildSelect(b, LLVMBuildOr(b, zero, minus1, ""), LLVMConstInt(t, 1, 0), a[1], "");
    LLVMValueRef q = LLVMBuildSDiv(b, a[0], safe, "");
    return LLVMBuildSelect(b, minus1, LLVMBuildNeg(b, a[0], ""), q, "");
}
static LLVMValueRef s_max(CgFn *f, LLVMValueRef *a)
{
    if (is_float(f))
        return cg_fmax(f->cg, a[0], a[1]);
    return LLVMBuildSelect(f->cg->b, LLVMBuildICmp(f->cg->b, LLVMIntSGT, a[0], a[1], ""), a[0], a[1], "");
}
static LLVMValueRef s_min(CgFn *f, LLVMValueRef *a)
{
    if (is_float(f))
        return cg_fmin(f->cg, a[0], a[1]);
    return LLVMBuildSelect(f->cg->b, LLVMBuildICmp(f->cg->b, LLVMIntSLT, a[0], a[1], ""), a[0], a[1], "");
}
static LLVMValueRef compare(CgFn *f, LLVMValueRef *a, LLVMRealPredicate fp, LLVMIntPredicate ip)
{
    return is_float(f) ? LLVMBuildFCmp(f->cg->b, fp, a[0], a[1], "") : LLVMBuildICmp(f->cg->b, ip, a[0], a[1], "");
}
static LLVMValueRef s_lt(CgFn *f, LLVMValueRef *a) { return compare(f, a, LLVMRealOLT, LLVMIntSLT); }
static LLVMValueRef s_le(CgFn *f, LLVMValueRef *a) { return compare(f, a, LLVMRealOLE, LLVMIntSLE); }
static LLVMValueRef s_eq(CgFn *f, LLVMValueRef *a) { return compare(f, a, LLVMRealOEQ, LLVMIntEQ); }
static LLVMValueRef s_and(CgFn *f, LLVMValueRef *a) { return LLVMBuildAnd(f->cg->b, a[0], a[1], ""); }
static LLVMValueRef s_or(CgFn *f, LLVMValueRef *a) { return LLVMBuildOr(f->cg->b, a[0], a[1], ""); }
static LLVMValueRef s_where(CgFn *f, LLVMValueRef *a) { return LLVMBuildSelect(f->cg->b, a[0], a[1], a[2], ""); }

/* ---- leaves computed by kernels ---- */

static void work_numel(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    *items = cg_dims_prod(f, f->node->shape, 0, f->node->rank);
    *cost = *items;
}

static int impl_const(CgFn *f)
{
    Cg *cg = f->cg;
    const IrNode *n = f->node;
    LLVMValueRef v;
    switch (n->dtype) {
    case IR_F32: v = cg_f32(cg, n->f); break;
    case IR_BOOL: v = LLVMConstInt(cg->t_i1, n->f != 0, 0); break;
    default: v = LLVMConstInt(cg_mem_type(cg, n->dtype), (unsigned long long)(int64_t)trunc(n->f), 1); break;
    }
    CgLoop l;
    cg_for(f, &l, f->lo, f->hi, "i");
    cg_store(f, n->dtype, f->out, l.iv, v);
    cg_for_end(f, &l);
    return 0;
}

static int impl_arange(CgFn *f)
{
    Cg *cg = f->cg;
    LLVMValueRef start = cg_dim(f, f->node->d);
    CgLoop l;
    cg_for(f, &l, f->lo, f->hi, "i");
    LLVMValueRef v = cg_convert(f, LLVMBuildAdd(cg->b, start, l.iv, ""), IR_I64, f->node->dtype);
    cg_store(f, f->node->dtype, f->out, l.iv, v);
    cg_for_end(f, &l);
    return 0;
}

static void work_relpos(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    *items = cg_dim(f, f->node->shape[0]);
    *cost = LLVMBuildMul(f->cg->b, *items, LLVMBuildMul(f->cg->b, cg_dim(f, f->node->shape[1]), cg_i64(f->cg, 16), ""), "");
}

/* T5 bucket of key j for query i, as XT-SEMANTICS.md 7.3 and ir/interp.c compute it: the log in
 * float32 (libm's logf, like the interpreter), truncated toward zero. */
static int impl_relpos(CgFn *f)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    int64_t nb = n->ia[IR_IA_BUCKETS], max_distance = n->ia[IR_IA_MAX_DISTANCE];
    int causal = n->ia[IR_IA_REL_CAUSAL] != 0;
    if (!causal)
        nb /= 2;
    int64_t max_exact = nb / 2;
    LLVMValueRef nj = cg_dim(f, n->shape[1]);
    if (max_exact == 0) { /* log(d / 0): the interpreter reports it; so do we */
        cg_flag_error(f, LLVMBuildICmp(b, LLVMIntSLT, f->lo, f->hi, ""));
        return 0;
    }
    float denom = logf((float)max_distance / (float)max_exact);
    CgLoop li, lj;
    cg_for(f, &li, f->lo, f->hi, "i");
    cg_for(f, &lj, cg_i64(cg, 0), nj, "j");
    LLVMValueRef d = LLVMBuildSub(b, li.iv, lj.iv, "");
    LLVMValueRef ret = cg_i64(cg, 0);
    if (causal) {
        d = cg_max_i64(f, d, cg_i64(cg, 0));
    } else {
        LLVMValueRef neg = LLVMBuildICmp(b, LLVMIntSLT, d, cg_i64(cg, 0), "");
        ret = LLVMBuildSelect(b, neg, cg_i64(cg, nb), cg_i64(cg, 0), "");
        d = LLVMBuildSelect(b, neg, LLVMBuildNeg(b, d, ""), d, "");
    }
    LLVMValueRef small = LLVMBuildICmp(b, LLVMIntSLT, d, cg_i64(cg, max_exact), "");
    /* only evaluated for d >= max_exact >= 1, so the log is finite */
    LLVMValueRef dd = LLVMBuildSelect(b, small, cg_i64(cg, max_exact), d, "");
    LLVMValueRef q = LLVMBuildFDiv(b, LLVMBuildSIToFP(b, dd, cg->t_f32, ""), cg_f32(cg, (float)max_exact), "");
    LLVMValueRef r = LLVMBuildFDiv(b, cg_libm(cg, "logf", q), cg_f32(cg, denom), "");
    r = LLVMBuildFMul(b, r, cg_f32(cg, (float)(nb - max_exact)), "");
    LLVMValueRef large = LLVMBuildAdd(b, cg_i64(cg, max_exact), cg_convert(f, r, IR_F32, IR_I64), "");
    large = cg_min_i64(f, large, cg_i64(cg, nb - 1));
    LLVMValueRef bucket = LLVMBuildAdd(b, ret, LLVMBuildSelect(b, small, d, large, ""), "");
    cg_store(f, IR_I64, f->out, LLVMBuildAdd(b, LLVMBuildMul(b, li.iv, nj, ""), lj.iv, ""), bucket);
    cg_for_end(f, &lj);
    cg_for_end(f, &li);
    return 0;
}

/* ---- reductions ---- */

/* x viewed as [outer, len, inner] around the axis */
static void reduce_dims(CgFn *f, int axis, LLVMValueRef *outer, LLVMValueRef *len, LLVMValueRef *inner)
{
    const IrNode *x = f->node->in[0];
    *outer = cg_dims_prod(f, x->shape, 0, axis);
    *len = cg_dim(f, x->shape[axis]);
    *inner = cg_dims_prod(f, x->shape, axis + 1, x->rank);
}

static int reduces_last(const IrNode *n)
{
    const IrNode *x = n->in[0];
    return cg_dims_are_one(x->shape, (int)n->ia[IR_IA_AXIS] + 1, x->rank);
}

static void work_reduce(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    LLVMValueRef outer, len, inner;
    reduce_dims(f, (int)f->node->ia[IR_IA_AXIS], &outer, &len, &inner);
    *items = reduces_last(f->node) ? outer : LLVMBuildMul(f->cg->b, outer, nchunks(f->cg, inner), "");
    *cost = LLVMBuildMul(f->cg->b, outer, LLVMBuildMul(f->cg->b, len, inner, ""), "");
}

/* acc op= x for the whole row x[0, len): returns the result. Sums reassociate (so they
 * vectorise); the maximum tracks NaN apart from maxnum so that it propagates like the
 * interpreter's. */
static LLVMValueRef reduce_row(CgFn *f, IrOp op, LLVMValueRef x, LLVMValueRef base, LLVMValueRef len)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    int is_max = op == IR_RMAX;
    LLVMValueRef acc = cg_var(f, cg->t_f32, cg_f32(cg, is_max ? -INFINITY : 0.0), "acc");
    LLVMValueRef nan = cg_var(f, cg->t_i1, LLVMConstInt(cg->t_i1, 0, 0), "nan");
    CgLoop l;
    cg_for(f, &l, cg_i64(cg, 0), len, "r");
    LLVMValueRef v = cg_load(f, IR_F32, x, LLVMBuildAdd(b, base, l.iv, ""));
    LLVMValueRef a = cg_get(f, cg->t_f32, acc);
    if (is_max) {
        /* nnan lets the vectoriser treat this as a max reduction; a NaN makes acc poison, but
         * then the nan flag selects NaN instead of it */
        LLVMValueRef args[2] = {a, v};
        LLVMValueRef mx = cg_intrinsic(cg, "llvm.maxnum", cg->t_f32, args, 2);
        LLVMBuildStore(b, cg_fmf(mx, LLVMFastMathNoNaNs | LLVMFastMathNoSignedZeros), acc);
        LLVMValueRef isnan = LLVMBuildFCmp(b, LLVMRealUNO, v, v, "");
        LLVMBuildStore(b, LLVMBuildOr(b, cg_get(f, cg->t_i1, nan), isnan, ""), nan);
    } else {
        LLVMBuildStore(b, cg_fmf(LLVMBuildFAdd(b, a, v, ""), LLVMFastMathAllowReassoc | LLVMFastMathAllowContract), acc);
    }
    cg_for_end(f, &l);
    LLVMValueRef r = cg_get(f, cg->t_f32, acc);
    if (is_max)
        r = LLVMBuildSelect(b, cg_get(f, cg->t_i1, nan), cg_f32(cg, NAN), r, "");
    return r;
}

static int impl_reduce(CgFn *f)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    int is_max = n->op == IR_RMAX;
    LLVMValueRef outer, len, inner;
    reduce_dims(f, (int)n->ia[IR_IA_AXIS], &outer, &len, &inner);
    if (is_max) /* the maximum of nothing is an error, as in the interpreter */
        cg_flag_error(f, LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntEQ, len, cg_i64(cg, 0), ""),
                                      LLVMBuildICmp(b, LLVMIntSLT, f->lo, f->hi, ""), ""));
    if (reduces_last(n)) {
        CgLoop l;
        cg_for(f, &l, f->lo, f->hi, "row");
        LLVMValueRef r = reduce_row(f, n->op, f->in[0], LLVMBuildMul(b, l.iv, len, ""), len);
        cg_store(f, IR_F32, f->out, l.iv, r);
        cg_for_end(f, &l);
        return 0;
    }
    /* out[o, i] over chunks of i: initialise with the first slice, then fold the others in */
    LLVMValueRef nch = nchunks(cg, inner);
    CgLoop l;
    cg_for(f, &l, f->lo, f->hi, "item");
    LLVMValueRef o = LLVMBuildSDiv(b, l.iv, nch, "");
    LLVMValueRef i0 = LLVMBuildMul(b, LLVMBuildSRem(b, l.iv, nch, ""), cg_i64(cg, CHUNK), "");
    LLVMValueRef i1 = cg_min_i64(f, inner, LLVMBuildAdd(b, i0, cg_i64(cg, CHUNK), ""));
    LLVMValueRef obase = LLVMBuildMul(b, o, inner, "");
    LLVMValueRef xbase = LLVMBuildMul(b, obase, len, "");
    CgLoop li;
    cg_for(f, &li, i0, i1, "i");
    LLVMValueRef first = is_max ? cg_load(f, IR_F32, f->in[0], LLVMBuildAdd(b, xbase, li.iv, "")) : cg_f32(cg, 0);
    cg_store(f, IR_F32, f->out, LLVMBuildAdd(b, obase, li.iv, ""), first);
    cg_for_end(f, &li);
    CgLoop lr;
    cg_for(f, &lr, cg_i64(cg, is_max ? 1 : 0), len, "r");
    LLVMValueRef xrow = LLVMBuildAdd(b, xbase, LLVMBuildMul(b, lr.iv, inner, ""), "");
    cg_for(f, &li, i0, i1, "i");
    LLVMValueRef oi = LLVMBuildAdd(b, obase, li.iv, "");
    LLVMValueRef a = cg_load(f, IR_F32, f->out, oi);
    LLVMValueRef v = cg_load(f, IR_F32, f->in[0], LLVMBuildAdd(b, xrow, li.iv, ""));
    cg_store(f, IR_F32, f->out, oi, is_max ? cg_fmax(cg, a, v) : LLVMBuildFAdd(b, a, v, ""));
    cg_for_end(f, &li);
    cg_for_end(f, &lr);
    cg_for_end(f, &l);
    return 0;
}

/* ---- softmax over the last axis ---- */

static void work_softmax(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    const IrNode *n = f->node;
    *items = cg_dims_prod(f, n->shape, 0, n->rank - 1);
    LLVMValueRef len = cg_dim(f, n->shape[n->rank - 1]);
    *cost = LLVMBuildMul(f->cg->b, *items, LLVMBuildMul(f->cg->b, len, cg_i64(f->cg, 8), ""), "");
}

static int impl_softmax(CgFn *f)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    LLVMValueRef len = cg_dim(f, n->shape[n->rank - 1]);
    CgLoop l;
    cg_for(f, &l, f->lo, f->hi, "row");
    LLVMValueRef base = LLVMBuildMul(b, l.iv, len, "");
    LLVMValueRef m = reduce_row(f, IR_RMAX, f->in[0], base, len);
    LLVMValueRef sum = cg_var(f, cg->t_f32, cg_f32(cg, 0), "sum");
    CgLoop lj;
    cg_for(f, &lj, cg_i64(cg, 0), len, "j");
    LLVMValueRef idx = LLVMBuildAdd(b, base, lj.iv, "");
    LLVMValueRef e = cg_exp(cg, LLVMBuildFSub(b, cg_load(f, IR_F32, f->in[0], idx), m, ""));
    cg_store(f, IR_F32, f->out, idx, e);
    LLVMBuildStore(b, cg_fmf(LLVMBuildFAdd(b, cg_get(f, cg->t_f32, sum), e, ""), LLVMFastMathAllowReassoc), sum);
    cg_for_end(f, &lj);
    LLVMValueRef inv = LLVMBuildFDiv(b, cg_f32(cg, 1.0), cg_get(f, cg->t_f32, sum), "");
    cg_for(f, &lj, cg_i64(cg, 0), len, "j");
    idx = LLVMBuildAdd(b, base, lj.iv, "");
    cg_store(f, IR_F32, f->out, idx, LLVMBuildFMul(b, cg_load(f, IR_F32, f->out, idx), inv, ""));
    cg_for_end(f, &lj);
    cg_for_end(f, &l);
    return 0;
}

/* ---- copies: permute, slice, expand ---- */

/* Row-major strides of x's dims, as values. */
static void strides_of(CgFn *f, const IrNode *x, LLVMValueRef *st)
{
    LLVMValueRef s = cg_i64(f->cg, 1);
    for (int d = x->rank - 1; d >= 0; d--) {
        st[d] = s;
        if (d > 0)
            s = LLVMBuildMul(f->cg->b, s, cg_dim(f, x->shape[d]), "");
    }
}

/* out[i0..ir] = in[base + sum i_d * stride_d]; the stride of the last dim given as a constant
 * (0 or 1) where it is known, so the inner loop vectorises. */
typedef struct {
    LLVMValueRef base;
    LLVMValueRef stride[IR_MAXRANK];
    int last_const; /* -1: use stride[rank-1] */
} CopySpec;

static void copy_spec(CgFn *f, CopySpec *cs)
{
    Cg *cg = f->cg;
    const IrNode *n = f->node, *x = n->in[0];
    LLVMValueRef xst[IR_MAXRANK];
    strides_of(f, x, xst);
    cs->base = cg_i64(cg, 0);
    cs->last_const = -1;
    int r = n->rank;
    switch (n->op) {
    case IR_PERMUTE:
        for (int d = 0; d < r; d++)
            cs->stride[d] = xst[n->perm[d]];
        if (r > 0 && n->perm[r - 1] == r - 1)
            cs->last_const = 1;
        break;
    case IR_SLICE:
        for (int d = 0; d < r; d++)
            cs->stride[d] = xst[d];
        cs->base = LLVMBuildMul(cg->b, cg_dim(f, n->d), xst[n->ia[IR_IA_AXIS]], "");
        cs->last_const = 1;
        break;
    default: /* EXPAND */
        for (int d = 0; d < r; d++) {
            int bc = cg_operand_bcast(n, x, d);
            cs->stride[d] = bc ? cg_i64(cg, 0) : xst[d - (r - x->rank)];
            if (d == r - 1)
                cs->last_const = bc ? 0 : 1;
        }
        break;
    }
}

/* ---- transposes: a permute that moves the input's last dim to the output's second-to-last ----
 *
 * out[o.., q, j] = in[o.. (permuted), j (some dim), q (the last)], f32: the weight gradients'
 * [b, n, d] -> [b, d, n] (and the logits' gradient [b, n, vocab] -> [b, vocab, n]). The copy
 * below reads the input a float per row, each from another cache line: 3.2 ms for a
 * [1, 1024, 2048] one here (2.6 GB/s). Instead, one work item is a strip of VW output rows
 * (VW input columns, one cache line of each input row), done VW x VW floats at a time: VW
 * vector loads along the input's rows, an in-register transpose, VW vector stores along the
 * output's; the last j % VW columns and a last strip of fewer than VW rows element by element. */

static int transpose_case(const IrNode *n)
{
    int r = n->rank;
    return n->op == IR_PERMUTE && n->dtype == IR_F32 && r >= 2 && n->perm[r - 2] == r - 1;
}

static int vec_lanes(Cg *cg) { return cg_gemm_nr(cg) / 2; }

static void work_transpose(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    Cg *cg = f->cg;
    const IrNode *n = f->node;
    int r = n->rank, vw = vec_lanes(cg);
    LLVMValueRef outer = cg_dims_prod(f, n->shape, 0, r - 2), Q = cg_dim(f, n->shape[r - 2]);
    LLVMValueRef strips = LLVMBuildSDiv(cg->b, LLVMBuildAdd(cg->b, Q, cg_i64(cg, vw - 1), ""), cg_i64(cg, vw), "");
    *items = LLVMBuildMul(cg->b, outer, strips, "items");
    *cost = cg_dims_prod(f, n->shape, 0, r);
}

/* out[ob + u J + j] = in[ib + j sj + u] for u in [u0, u1), j in [j0, j1): element by element */
static void transpose_elems(CgFn *f, LLVMValueRef ib, LLVMValueRef sj, LLVMValueRef ob, LLVMValueRef J, LLVMValueRef u0,
                            LLVMValueRef u1, LLVMValueRef j0, LLVMValueRef j1)
{
    LLVMBuilderRef b = f->cg->b;
    CgLoop lu, lj;
    cg_for(f, &lu, u0, u1, "u");
    cg_for(f, &lj, j0, j1, "j");
    LLVMValueRef v = cg_load(f, IR_F32, f->in[0], LLVMBuildAdd(b, ib, LLVMBuildAdd(b, LLVMBuildMul(b, lj.iv, sj, ""), lu.iv, ""), ""));
    cg_store(f, IR_F32, f->out, LLVMBuildAdd(b, ob, LLVMBuildAdd(b, LLVMBuildMul(b, lu.iv, J, ""), lj.iv, ""), ""), v);
    cg_for_end(f, &lj);
    cg_for_end(f, &lu);
}

static int impl_transpose(CgFn *f)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    int r = n->rank, vw = vec_lanes(cg);
    LLVMTypeRef vt = LLVMVectorType(cg->t_f32, (unsigned)vw);
    LLVMValueRef xst[IR_MAXRANK];
    strides_of(f, n->in[0], xst);
    LLVMValueRef Q = cg_dim(f, n->shape[r - 2]), J = cg_dim(f, n->shape[r - 1]), sj = xst[n->perm[r - 1]];
    LLVMValueRef cvw = cg_i64(cg, vw);
    LLVMValueRef strips = LLVMBuildSDiv(b, LLVMBuildAdd(b, Q, cg_i64(cg, vw - 1), ""), cvw, "");
    LLVMValueRef jfull = LLVMBuildMul(b, LLVMBuildSDiv(b, J, cvw, ""), cvw, "jfull");
    CgLoop li, lj;
    cg_for(f, &li, f->lo, f->hi, "item");
    LLVMValueRef o = LLVMBuildSDiv(b, li.iv, strips, ""), q0 = LLVMBuildMul(b, LLVMBuildSRem(b, li.iv, strips, ""), cvw, "q0");
    /* the strip's first input column: the outer index o split over the output's dims 0 .. r-3 */
    LLVMValueRef ib = q0, rest = o;
    for (int d = r - 3; d >= 0; d--) {
        LLVMValueRef size = cg_dim(f, n->shape[d]);
        LLVMValueRef idx = d == 0 ? rest : LLVMBuildSRem(b, rest, size, "");
        if (d > 0)
            rest = LLVMBuildSDiv(b, rest, size, "");
        ib = LLVMBuildAdd(b, ib, LLVMBuildMul(b, idx, xst[n->perm[d]], ""), "");
    }
    LLVMValueRef ob = LLVMBuildMul(b, LLVMBuildAdd(b, LLVMBuildMul(b, o, Q, ""), q0, ""), J, "ob"); /* row q0 */
    LLVMValueRef rows = cg_min_i64(f, cvw, LLVMBuildSub(b, Q, q0, ""));
    CgIf full;
    cg_if(f, &full, LLVMBuildICmp(b, LLVMIntEQ, rows, cvw, ""));
    cg_for(f, &lj, cg_i64(cg, 0), LLVMBuildSDiv(b, jfull, cvw, ""), "jblock");
    LLVMValueRef j0 = LLVMBuildMul(b, lj.iv, cvw, "");
    LLVMValueRef v[64];
    for (int t = 0; t < vw; t++) {
        LLVMValueRef at = LLVMBuildAdd(b, ib, LLVMBuildMul(b, LLVMBuildAdd(b, j0, cg_i64(cg, t), ""), sj, ""), "");
        v[t] = LLVMBuildLoad2(b, vt, cg_addr(f, IR_F32, f->in[0], at), "");
        LLVMSetAlignment(v[t], 4);
    }
    cg_transpose_vectors(cg, v, vw);
    for (int u = 0; u < vw; u++) {
        LLVMValueRef at = LLVMBuildAdd(b, ob, LLVMBuildAdd(b, LLVMBuildMul(b, cg_i64(cg, u), J, ""), j0, ""), "");
        LLVMSetAlignment(LLVMBuildStore(b, v[u], cg_addr(f, IR_F32, f->out, at)), 4);
    }
    cg_for_end(f, &lj);
    transpose_elems(f, ib, sj, ob, J, cg_i64(cg, 0), cvw, jfull, J);
    cg_if_end(f, &full);
    cg_if(f, &full, LLVMBuildICmp(b, LLVMIntSLT, rows, cvw, ""));
    transpose_elems(f, ib, sj, ob, J, cg_i64(cg, 0), rows, cg_i64(cg, 0), J);
    cg_if_end(f, &full);
    cg_for_end(f, &li);
    return 0;
}

static void work_copy(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    const IrNode *n = f->node;
    if (transpose_case(n)) {
        work_transpose(f, items, cost);
        return;
    }
    if (n->rank == 0) {
        *items = *cost = cg_i64(f->cg, 1);
        return;
    }
    work_rows_of(f, cg_dims_prod(f, n->shape, 0, n->rank - 1), cg_dim(f, n->shape[n->rank - 1]), items, cost);
}

static void copy_body(CgFn *f, const CgSpace *sp, RowItem *it, void *ctx)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    const CopySpec *cs = ctx;
    int r = n->rank;
    LLVMValueRef off = cs->base;
    for (int d = 0; d + 1 < r; d++)
        off = LLVMBuildAdd(b, off, LLVMBuildMul(b, it->idx[d], cs->stride[d], ""), "");
    (void)sp;
    LLVMValueRef obase = LLVMBuildMul(b, it->row, it->inner, "");
    CgLoop l;
    cg_for(f, &l, it->j0, it->j1, "j");
    LLVMValueRef xi = off;
    if (r > 0) {
        LLVMValueRef step = cs->last_const == 1 ? l.iv
                            : cs->last_const == 0 ? cg_i64(cg, 0)
                                                  : LLVMBuildMul(b, l.iv, cs->stride[r - 1], "");
        xi = LLVMBuildAdd(b, off, step, "");
    }
    cg_store(f, n->dtype, f->out, LLVMBuildAdd(b, obase, l.iv, ""), cg_load(f, n->dtype, f->in[0], xi));
    cg_for_end(f, &l);
}

static int impl_copy(CgFn *f)
{
    const IrNode *n = f->node;
    if (transpose_case(n))
        return impl_transpose(f);
    CopySpec cs;
    copy_spec(f, &cs);
    /* one group per output dim: the item loop then yields every dim's index */
    CgSpace sp;
    memset(&sp, 0, sizeof sp);
    sp.ngroups = n->rank;
    for (int d = 0; d < n->rank; d++) {
        sp.from[d] = d;
        sp.to[d] = d + 1;
    }
    for_row_items(f, &sp, copy_body, &cs);
    return 0;
}

/* ---- concat ---- */

static void concat_dims(CgFn *f, LLVMValueRef *outer, LLVMValueRef *la, LLVMValueRef *lb)
{
    const IrNode *n = f->node;
    int axis = (int)n->ia[IR_IA_AXIS];
    LLVMValueRef inner = cg_dims_prod(f, n->shape, axis + 1, n->rank);
    *outer = cg_dims_prod(f, n->shape, 0, axis);
    *la = LLVMBuildMul(f->cg->b, cg_dim(f, n->in[0]->shape[axis]), inner, "");
    *lb = LLVMBuildMul(f->cg->b, cg_dim(f, n->in[1]->shape[axis]), inner, "");
}

static void work_concat(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    LLVMValueRef la, lb;
    concat_dims(f, items, &la, &lb);
    *cost = LLVMBuildMul(f->cg->b, *items, LLVMBuildAdd(f->cg->b, la, lb, ""), "");
}

/* dst[doff + j] = src[soff + j] for j < len; src16 / dst16: the buffer holds bf16 (a KV cache
 * under CG_STORE_KV_CACHES: bf16 copied as it is, f32 rows rounded into it) */
static void copy_run(CgFn *f, LLVMValueRef dst, LLVMValueRef doff, int dst16, LLVMValueRef src, LLVMValueRef soff,
                     int src16, LLVMValueRef len)
{
    LLVMBuilderRef b = f->cg->b;
    IrDType t = f->node->dtype;
    LLVMTypeRef i16 = LLVMInt16TypeInContext(f->cg->ctx);
    CgLoop l;
    cg_for(f, &l, cg_i64(f->cg, 0), len, "j");
    LLVMValueRef si = LLVMBuildAdd(b, soff, l.iv, ""), di = LLVMBuildAdd(b, doff, l.iv, "");
    if (src16 && dst16)
        LLVMBuildStore(b, LLVMBuildLoad2(b, i16, cg_addr_bf16(f, src, si), ""), cg_addr_bf16(f, dst, di));
    else if (dst16)
        cg_store_bf16(f, dst, di, cg_load(f, t, src, si));
    else
        cg_store(f, t, dst, di, src16 ? cg_load_bf16(f, src, si) : cg_load(f, t, src, si));
    cg_for_end(f, &l);
}

/* The concat of a KV cache stored as int8 rows (CgFn.out_i8: rows of the last dimension D with
 * their scales, CG_STORE_INT8_ROWS): runs of whole rows, elements doff and soff and len being
 * multiples of D: the stored rows of an int8 operand copied as they are, an f32 operand's
 * quantized row by row. */
static void copy_rows_i8(CgFn *f, LLVMValueRef doff, LLVMValueRef src, LLVMValueRef soff, int src8, LLVMValueRef len)
{
    LLVMBuilderRef b = f->cg->b;
    int64_t D = f->node->shape[f->node->rank - 1].c;
    LLVMValueRef cD = cg_i64(f->cg, D);
    LLVMValueRef drow = LLVMBuildSDiv(b, doff, cD, ""), srow = LLVMBuildSDiv(b, soff, cD, "");
    LLVMValueRef rows = LLVMBuildSDiv(b, len, cD, "");
    CgLoop l;
    if (src8) {
        LLVMValueRef dst = cg_i8row_addr(f, f->out, drow, D), from = cg_i8row_addr(f, src, srow, D);
        cg_for(f, &l, cg_i64(f->cg, 0), LLVMBuildMul(b, rows, cg_i64(f->cg, D + 4), ""), "byte");
        cg_store(f, IR_I8, dst, l.iv, cg_load(f, IR_I8, from, l.iv));
        cg_for_end(f, &l);
        return;
    }
    cg_for(f, &l, cg_i64(f->cg, 0), rows, "qrows");
    cg_i8row_quantize(f, cg_i8row_addr(f, f->out, LLVMBuildAdd(b, drow, l.iv, ""), D), src,
                      LLVMBuildAdd(b, soff, LLVMBuildMul(b, l.iv, cD, ""), ""), D);
    cg_for_end(f, &l);
}

static int impl_concat(CgFn *f)
{
    LLVMBuilderRef b = f->cg->b;
    LLVMValueRef outer, la, lb;
    concat_dims(f, &outer, &la, &lb);
    LLVMValueRef row = LLVMBuildAdd(b, la, lb, "");
    CgLoop l;
    cg_for(f, &l, f->lo, f->hi, "o");
    LLVMValueRef obase = LLVMBuildMul(b, l.iv, row, "");
    /* the result in place over the first operand (a KV cache that grows at its end: the session
     * places it so, rt_session.c appends_to): its first part is already there */
    LLVMValueRef same = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntEQ, f->out, f->in[0], ""),
                                     LLVMBuildICmp(b, LLVMIntEQ, l.iv, cg_i64(f->cg, 0), ""), "inplace");
    CgIf copy;
    cg_if(f, &copy, LLVMBuildNot(b, same, ""));
    if (f->out_i8)
        copy_rows_i8(f, obase, f->in[0], LLVMBuildMul(b, l.iv, la, ""), f->in_i8[0], la);
    else
        copy_run(f, f->out, obase, f->out_bf16, f->in[0], LLVMBuildMul(b, l.iv, la, ""), f->in_bf16[0], la);
    cg_if_end(f, &copy);
    if (f->out_i8)
        copy_rows_i8(f, LLVMBuildAdd(b, obase, la, ""), f->in[1], LLVMBuildMul(b, l.iv, lb, ""), f->in_i8[1], lb);
    else
        copy_run(f, f->out, LLVMBuildAdd(b, obase, la, ""), f->out_bf16, f->in[1], LLVMBuildMul(b, l.iv, lb, ""),
                 f->in_bf16[1], lb);
    cg_for_end(f, &l);
    return 0;
}

/* ---- gather: rows of table[V, D] by integer index; an index outside [0, V) is an error ---- */

static void work_gather(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    const IrNode *idx = f->node->in[1];
    *items = cg_dims_prod(f, idx->shape, 0, idx->rank);
    *cost = LLVMBuildMul(f->cg->b, *items, cg_dim(f, f->node->in[0]->shape[1]), "");
}

static int impl_gather(CgFn *f)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    LLVMValueRef v = cg_dim(f, n->in[0]->shape[0]), d = cg_dim(f, n->in[0]->shape[1]);
    CgLoop l;
    cg_for(f, &l, f->lo, f->hi, "i");
    LLVMValueRef t = cg_convert(f, cg_load(f, n->in[1]->dtype, f->in[1], l.iv), n->in[1]->dtype, IR_I64);
    LLVMValueRef bad = LLVMBuildOr(b, LLVMBuildICmp(b, LLVMIntSLT, t, cg_i64(cg, 0), ""),
                                   LLVMBuildICmp(b, LLVMIntSGE, t, v, ""), "");
    cg_flag_error(f, bad);
    CgIf ok;
    cg_if(f, &ok, LLVMBuildNot(b, bad, ""));
    copy_run(f, f->out, LLVMBuildMul(b, l.iv, d, ""), 0, f->in[0], LLVMBuildMul(b, t, d, ""), 0, d);
    cg_if_end(f, &ok);
    cg_for_end(f, &l);
    return 0;
}

/* ---- gather_grad: src[..., D] rows added into a zero [rows, D] table at idx[...] ----
 * A work item is a block of GG_COLS columns of the table, so threads never add into the same
 * element and the inner loops stay contiguous. */

#define GG_COLS 64

static void work_gather_grad(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    const IrNode *n = f->node, *idx = n->in[1];
    LLVMBuilderRef b = f->cg->b;
    LLVMValueRef d = cg_dim(f, n->shape[1]);
    *items = LLVMBuildSDiv(b, LLVMBuildAdd(b, d, cg_i64(f->cg, GG_COLS - 1), ""), cg_i64(f->cg, GG_COLS), "");
    LLVMValueRef rows = LLVMBuildAdd(b, cg_dims_prod(f, idx->shape, 0, idx->rank), cg_dim(f, n->shape[0]), "");
    *cost = LLVMBuildMul(b, d, rows, "");
}

static int impl_gather_grad(CgFn *f)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node, *idx = n->in[1];
    LLVMValueRef v = cg_dim(f, n->shape[0]), d = cg_dim(f, n->shape[1]);
    LLVMValueRef m = cg_dims_prod(f, idx->shape, 0, idx->rank);
    CgLoop lb;
    cg_for(f, &lb, f->lo, f->hi, "block");
    LLVMValueRef c0 = LLVMBuildMul(b, lb.iv, cg_i64(cg, GG_COLS), "");
    LLVMValueRef c1 = cg_min_i64(f, d, LLVMBuildAdd(b, c0, cg_i64(cg, GG_COLS), ""));
    CgLoop lr, lc;
    cg_for(f, &lr, cg_i64(cg, 0), v, "r");
    LLVMValueRef zrow = LLVMBuildMul(b, lr.iv, d, "");
    cg_for(f, &lc, c0, c1, "c");
    cg_store(f, IR_F32, f->out, LLVMBuildAdd(b, zrow, lc.iv, ""), cg_f32(cg, 0));
    cg_for_end(f, &lc);
    cg_for_end(f, &lr);
    CgLoop li;
    cg_for(f, &li, cg_i64(cg, 0), m, "i");
    LLVMValueRef t = cg_convert(f, cg_load(f, idx->dtype, f->in[1], li.iv), idx->dtype, IR_I64);
    LLVMValueRef bad = LLVMBuildOr(b, LLVMBuildICmp(b, LLVMIntSLT, t, cg_i64(cg, 0), ""),
                                   LLVMBuildICmp(b, LLVMIntSGE, t, v, ""), "");
    cg_flag_error(f, bad);
    CgIf ok;
    cg_if(f, &ok, LLVMBuildNot(b, bad, ""));
    LLVMValueRef orow = LLVMBuildMul(b, t, d, ""), srow = LLVMBuildMul(b, li.iv, d, "");
    cg_for(f, &lc, c0, c1, "c");
    LLVMValueRef o = LLVMBuildAdd(b, orow, lc.iv, "");
    LLVMValueRef x = cg_load(f, IR_F32, f->in[0], LLVMBuildAdd(b, srow, lc.iv, ""));
    cg_store(f, IR_F32, f->out, o, LLVMBuildFAdd(b, cg_load(f, IR_F32, f->out, o), x, ""));
    cg_for_end(f, &lc);
    cg_if_end(f, &ok);
    cg_for_end(f, &li);
    cg_for_end(f, &lb);
    return 0;
}

/* ---- random numbers: rand_like, the bits of ir/interp.c's rand_at ---- */

static LLVMValueRef u64(Cg *cg, uint64_t v) { return LLVMConstInt(cg->t_i64, v, 0); }

static LLVMValueRef xorshift_mul(LLVMBuilderRef b, Cg *cg, LLVMValueRef z, int shift, uint64_t k)
{
    z = LLVMBuildXor(b, z, LLVMBuildLShr(b, z, cg_i64(cg, shift), ""), "");
    return LLVMBuildMul(b, z, u64(cg, k), "");
}

static int impl_rand(CgFn *f)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    LLVMValueRef seed = cg_convert(f, cg_load(f, n->in[0]->dtype, f->in[0], cg_i64(cg, 0)), n->in[0]->dtype, IR_I64);
    LLVMValueRef base = LLVMBuildAdd(b, LLVMBuildMul(b, seed, u64(cg, 0xd1b54a32d192ed03ull), ""),
                                     u64(cg, (uint64_t)n->ia[IR_IA_STREAM] * 0xabc98388fb8fac03ull), "");
    CgLoop l;
    cg_for(f, &l, f->lo, f->hi, "i");
    LLVMValueRef z = LLVMBuildAdd(b, base, LLVMBuildMul(b, LLVMBuildAdd(b, l.iv, cg_i64(cg, 1), ""),
                                                        u64(cg, 0x9e3779b97f4a7c15ull), ""), "");
    z = xorshift_mul(b, cg, z, 30, 0xbf58476d1ce4e5b9ull);
    z = xorshift_mul(b, cg, z, 27, 0x94d049bb133111ebull);
    z = LLVMBuildXor(b, z, LLVMBuildLShr(b, z, cg_i64(cg, 31), ""), "");
    LLVMValueRef top = LLVMBuildUIToFP(b, LLVMBuildLShr(b, z, cg_i64(cg, 40), ""), cg->t_f32, "");
    cg_store(f, IR_F32, f->out, l.iv, LLVMBuildFMul(b, top, cg_f32(cg, 0x1p-24), ""));
    cg_for_end(f, &l);
    return 0;
}

/* ---- cross entropy: mean over targets >= 0 of logsumexp(z) - z[t]; 0 when none counts ---- */

static int impl_xent(CgFn *f)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node, *z = n->in[0], *tg = n->in[1];
    LLVMValueRef v = cg_dim(f, z->shape[z->rank - 1]);
    LLVMValueRef rows = cg_dims_prod(f, tg->shape, 0, tg->rank);
    LLVMValueRef total = cg_var(f, cg->t_f64, LLVMConstReal(cg->t_f64, 0), "total");
    LLVMValueRef count = cg_var(f, cg->t_i64, cg_i64(cg, 0), "count");
    CgLoop l;
    cg_for(f, &l, cg_i64(cg, 0), rows, "p");
    LLVMValueRef t = cg_convert(f, cg_load(f, tg->dtype, f->in[1], l.iv), tg->dtype, IR_I64);
    LLVMValueRef counted = LLVMBuildICmp(b, LLVMIntSGE, t, cg_i64(cg, 0), "");
    LLVMValueRef bad = LLVMBuildICmp(b, LLVMIntSGE, t, v, "");
    cg_flag_error(f, bad);
    CgIf use;
    cg_if(f, &use, LLVMBuildAnd(b, counted, LLVMBuildNot(b, bad, ""), ""));
    LLVMValueRef base = LLVMBuildMul(b, l.iv, v, "");
    LLVMValueRef m = reduce_row(f, IR_RMAX, f->in[0], base, v);
    LLVMValueRef s = cg_var(f, cg->t_f32, cg_f32(cg, 0), "s");
    CgLoop lj;
    cg_for(f, &lj, cg_i64(cg, 0), v, "j");
    LLVMValueRef e = cg_exp(cg, LLVMBuildFSub(b, cg_load(f, IR_F32, f->in[0], LLVMBuildAdd(b, base, lj.iv, "")), m, ""));
    LLVMBuildStore(b, cg_fmf(LLVMBuildFAdd(b, cg_get(f, cg->t_f32, s), e, ""), LLVMFastMathAllowReassoc), s);
    cg_for_end(f, &lj);
    LLVMValueRef sv = cg_get(f, cg->t_f32, s);
    LLVMValueRef lse = LLVMBuildFAdd(b, m, cg_intrinsic(cg, "llvm.log", cg->t_f32, &sv, 1), "");
    LLVMValueRef zt = cg_load(f, IR_F32, f->in[0], LLVMBuildAdd(b, base, t, ""));
    LLVMValueRef term = LLVMBuildFPExt(b, LLVMBuildFSub(b, lse, zt, ""), cg->t_f64, "");
    LLVMBuildStore(b, LLVMBuildFAdd(b, cg_get(f, cg->t_f64, total), term, ""), total);
    LLVMBuildStore(b, LLVMBuildAdd(b, cg_get(f, cg->t_i64, count), cg_i64(cg, 1), ""), count);
    cg_if_end(f, &use);
    cg_for_end(f, &l);
    LLVMValueRef c = cg_get(f, cg->t_i64, count);
    LLVMValueRef mean = LLVMBuildFDiv(b, cg_get(f, cg->t_f64, total), LLVMBuildSIToFP(b, c, cg->t_f64, ""), "");
    mean = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntEQ, c, cg_i64(cg, 0), ""), LLVMConstReal(cg->t_f64, 0), mean, "");
    cg_store(f, IR_F32, f->out, cg_i64(cg, 0), LLVMBuildFPTrunc(b, mean, cg->t_f32, ""));
    return 0;
}

/* ---- the table ---- */

#define ELEM(fn) {work_elem, impl_elem, fn}

static const CgLower lowering[] = {
    /* leaves: inputs, parameters and buffers are bound by the runtime, not computed */
    [IR_INPUT] = {0, 0, 0},
    [IR_PARAM] = {0, 0, 0},
    [IR_BUFFER] = {0, 0, 0},
    [IR_CONST] = {work_numel, impl_const, 0},
    [IR_ARANGE] = {work_numel, impl_arange, 0},
    [IR_RELPOS] = {work_relpos, impl_relpos, 0},

    [IR_NEG] = ELEM(s_neg),
    [IR_EXP] = ELEM(s_exp),
    [IR_LOG] = ELEM(s_log),
    [IR_SQRT] = ELEM(s_sqrt),
    [IR_RSQRT] = ELEM(s_rsqrt),
    [IR_RECIP] = ELEM(s_recip),
    [IR_TANH] = ELEM(s_tanh),
    [IR_SIGMOID] = ELEM(s_sigmoid),
    [IR_GELU] = ELEM(s_gelu),
    [IR_ERF] = ELEM(s_erf),
    [IR_RELU] = ELEM(s_relu),
    [IR_SIN] = ELEM(s_sin),
    [IR_COS] = ELEM(s_cos),
    [IR_ABS] = ELEM(s_abs),
    [IR_NOT] = ELEM(s_not),
    [IR_CAST] = ELEM(s_cast),

    [IR_ADD] = ELEM(s_add),
    [IR_SUB] = ELEM(s_sub),
    [IR_MUL] = ELEM(s_mul),
    [IR_DIV] = ELEM(s_div),
    [IR_MAX] = ELEM(s_max),
    [IR_MIN] = ELEM(s_min),
    [IR_LT] = ELEM(s_lt),
    [IR_LE] = ELEM(s_le),
    [IR_EQ] = ELEM(s_eq),
    [IR_AND] = ELEM(s_and),
    [IR_OR] = ELEM(s_or),
    [IR_WHERE] = ELEM(s_where),

    [IR_SUM] = {work_reduce, impl_reduce, 0},
    [IR_RMAX] = {work_reduce, impl_reduce, 0},
    [IR_SOFTMAX] = {work_softmax, impl_softmax, 0},
    [IR_ENTMAX15] = {cg_entmax15_work, cg_entmax15_impl, 0},         /* cg_llvm_sort.c */
    [IR_KTH_LARGEST] = {cg_kth_largest_work, cg_kth_largest_impl, 0}, /* cg_llvm_sort.c */

    /* RESHAPE aliases its operand's buffer (cg_plan.c) and never reaches the backend */
    [IR_RESHAPE] = {0, 0, 0},
    [IR_PERMUTE] = {work_copy, impl_copy, 0},
    [IR_SLICE] = {work_copy, impl_copy, 0},
    [IR_CONCAT] = {work_concat, impl_concat, 0},
    [IR_EXPAND] = {work_copy, impl_copy, 0},
    [IR_GATHER] = {work_gather, impl_gather, 0},
    [IR_GATHER_GRAD] = {work_gather_grad, impl_gather_grad, 0},

    [IR_MATMUL] = {cg_matmul_work, cg_matmul_impl, 0},
    [IR_MATMUL_Q8] = {cg_matmul_work, cg_matmul_impl, 0}, /* B read through cg_llvm_q8.c */

    [IR_XENT] = {0, impl_xent, 0},

    [IR_RAND] = {work_numel, impl_rand, 0},

    /* fused ops (cg_llvm_attention.c, cg_llvm_attention_grad.c) */
    [IR_ATTENTION] = {cg_attention_work, cg_attention_impl, 0},
    [IR_ATTENTION_GRAD] = {cg_attention_grad_work, cg_attention_grad_impl, 0},
    [IR_FUSED] = {cg_fused_work, cg_fused_impl, 0}, /* cg_llvm_fused.c */
};
_Static_assert(sizeof lowering / sizeof lowering[0] == IR_NUM_OPS,
               "codegen/llvm/cg_llvm_ops.c: the lowering table needs a row for every op of ops.def");

const CgLower *cg_llvm_lowering(IrOp op)
{
    if (op >= IR_NUM_OPS)
        return NULL;
    const CgLower *L = &lowering[op];
    int is_leaf_or_view = op == IR_INPUT || op == IR_PARAM || op == IR_BUFFER || op == IR_RESHAPE;
    if (!L->impl && !is_leaf_or_view)
        return NULL;
    if (L->impl == impl_elem && !L->scalar)
        return NULL;
    return L;
}
