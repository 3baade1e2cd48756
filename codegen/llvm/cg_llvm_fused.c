/* cg_llvm_fused.c: the CPU kernel of the `fused` op (ops.def): a program of elementwise ops,
 * last-axis reductions, softmaxes, slices and concats over the operands (ir/fused_expr.h), in one
 * pass over memory per reduction instead of one kernel and one intermediate tensor per op.
 *
 * The program is built as a small graph (ir_fused_graph_of), and its nodes are emitted with the
 * scalar lowerings of cg_llvm_ops.c, so every op means here what it means in its own kernel.
 * A row is one index of the node's leading dims; every program value is a function of the row
 * and of a column of its own last axis, which is where the ops differ:
 *   elementwise, bcast  an operand of last dim 1 is read at column 0, others at the same column
 *   slice               the argument at column + start
 *   concat              the first part below its length, the second above (both read at clamped
 *                       columns and selected, so loops stay straight and vectorise)
 *   permute             of an operand, keeping its last axis: read with the permuted strides
 *   sum, reduce_max     a per-row value, computed before the row's other loops
 *   softmax             exp(x - max) / sum, max and sum per-row values
 * Operands are read at (row, column) with the strides of their broadcast: leading dims by the
 * row's index, the last axis contiguous or (length 1) not at all.
 *
 * Per row (a work item; with no reduction, a chunk of a row):
 *   for each reduction in program order: one loop over its argument's columns (a softmax takes
 *     two: its maximum, then its sum of exponentials)
 *   one loop over the node's columns computing the value and storing it.
 * Values are recomputed in every loop that needs them rather than stored: memory is what this
 * kernel saves.
 *
 * A program with a matmul step (bias and activation, a residual add, a gradient's product after
 * a matmul) is the matmul's kernel (cg_llvm_matmul.c) with the rest as its epilogue: each block
 * of MC rows of a work item's C is rewritten in place once final, while it is still in L2. */
#include "cg_llvm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fused_expr.h"

#define CHUNK 8192 /* columns of a row per work item when there is no reduction */

typedef struct {
    CgFn *f;
    Cg *cg;
    const IrNode *node;   /* the fused node */
    IrGraph *pg;          /* its program's graph */
    IrFusedProgram prog;
    IrNode *steps[IR_FUSED_MAXSTEPS];
    int has_reduce;
    const IrNode *mm;     /* the matmul step, or NULL */
    int mm_parts;         /* ir_epilogue_parts: 1, or 2 for a product read in two halves */
    const CgMmPart *parts;          /* in the epilogue: where the product is */
    LLVMValueRef prow[2];           /* ... the current row's index in each part, less j0 */
    int64_t coff;                   /* columns added by the slices around the value being built */
    /* per row */
    LLVMValueRef base[IR_MAXIN];    /* element offset of the row in each operand */
    LLVMValueRef *pbase;            /* ... and in each operand read through a permute step */
    /* per reduction node (by program graph id): its value for the row (allocas) */
    LLVMValueRef *slot, *slot2;     /* softmax: max in slot, 1 / sum in slot2 */
    LLVMValueRef *memo;             /* values at the loop's own column, by program graph id */
    LLVMValueRef col;               /* that column (the loop variable) */
} Fz;

static const char *who(const IrNode *n) { return n->label ? n->label : "?"; }

/* Builds the program's graph and checks what this kernel handles. */
static int fz_init(Fz *z, CgFn *f)
{
    memset(z, 0, sizeof *z);
    z->f = f;
    z->cg = f->cg;
    z->node = f->node;
    const IrNode *n = f->node;
    char err[300];
    z->pg = ir_fused_graph_of(n, &z->prog, z->steps, err, sizeof err);
    if (!z->pg)
        return cg_error(f->cg, "fused %%%s: %s", who(n), err);
    if (n->rank < 1)
        return cg_error(f->cg, "fused %%%s: the CPU kernel needs rank >= 1", who(n));
    if (ir_fused_kernel_check(n, z->pg, &z->prog, z->steps, &z->has_reduce, &z->mm, &z->mm_parts, err, sizeof err))
        return cg_error(f->cg, "fused %%%s: %s", who(n), err);
    for (int i = 0; i < z->pg->nnodes; i++) {
        const IrNode *x = z->pg->nodes[i];
        if (x->op != IR_CONCAT)
            continue;
        IrDim first = x->in[0]->shape[x->rank - 1];
        if (!ir_dim_is_const(first) || first.c < 1)
            return cg_error(f->cg, "fused %%%s: a concat's first part must have a constant length", who(n));
    }
    size_t nn = (size_t)z->pg->nnodes + 1;
    z->slot = calloc(nn, sizeof *z->slot);
    z->slot2 = calloc(nn, sizeof *z->slot2);
    z->memo = calloc(nn, sizeof *z->memo);
    z->pbase = calloc(nn, sizeof *z->pbase);
    if (!z->slot || !z->slot2 || !z->memo || !z->pbase)
        return cg_error(f->cg, "out of memory");
    return 0;
}

static void fz_free(Fz *z)
{
    ir_graph_free(z->pg);
    free(z->slot);
    free(z->slot2);
    free(z->memo);
    free(z->pbase);
}

static LLVMValueRef fz_rows(CgFn *f, const IrNode *n) { return cg_dims_prod(f, n->shape, 0, n->rank - 1); }

/* The operands' offsets for the node's row index `row` (its leading dims, broadcast). */
static void fz_row_bases(Fz *z, LLVMValueRef row)
{
    CgFn *f = z->f;
    LLVMBuilderRef b = z->cg->b;
    const IrNode *n = z->node;
    int r = n->rank;
    LLVMValueRef idx[IR_MAXRANK];
    LLVMValueRef rest = row;
    for (int d = r - 2; d >= 0; d--) {
        if (d == 0) {
            idx[d] = rest;
            break;
        }
        LLVMValueRef size = cg_dim(f, n->shape[d]);
        idx[d] = LLVMBuildSRem(b, rest, size, "");
        rest = LLVMBuildSDiv(b, rest, size, "");
    }
    for (int k = 0; k < n->nin; k++) {
        const IrNode *x = n->in[k];
        int lead = r - x->rank;
        LLVMValueRef off = cg_i64(z->cg, 0);
        for (int d = 0; d < r - 1; d++) {
            int kd = d - lead;
            if (kd < 0 || ir_dim_is_one(x->shape[kd]))
                continue;
            off = LLVMBuildAdd(b, off, LLVMBuildMul(b, idx[d], cg_dims_prod(f, x->shape, kd + 1, x->rank), ""), "");
        }
        z->base[k] = off;
    }
    /* an operand read through a permute: the permuted value's dim kd is the operand's perm[kd] */
    for (int i = 0; i < z->pg->nnodes; i++) {
        const IrNode *pv = z->pg->nodes[i], *x;
        if (pv->op != IR_PERMUTE)
            continue;
        x = pv->in[0];
        int lead = r - pv->rank;
        LLVMValueRef off = cg_i64(z->cg, 0);
        for (int d = 0; d < r - 1; d++) {
            int kd = d - lead;
            if (kd < 0 || ir_dim_is_one(pv->shape[kd]))
                continue;
            LLVMValueRef stride = cg_dims_prod(f, x->shape, pv->perm[kd] + 1, x->rank);
            off = LLVMBuildAdd(b, off, LLVMBuildMul(b, idx[d], stride, ""), "");
        }
        z->pbase[i] = off;
    }
}

static int operand_of(const IrNode *x) { return x->s && x->s[0] == 'x' ? atoi(x->s + 1) : 0; }

static int last_is_one(const IrNode *x) { return x->rank == 0 || ir_dim_is_one(x->shape[x->rank - 1]); }

/* The column at which an operand of last dim 1 is read: 0 */
static LLVMValueRef col_of(Fz *z, const IrNode *x, LLVMValueRef col)
{
    return last_is_one(x) ? cg_i64(z->cg, 0) : col;
}

static LLVMValueRef fz_value(Fz *z, const IrNode *x, LLVMValueRef col);

static LLVMValueRef value_at(Fz *z, const IrNode *x, LLVMValueRef col)
{
    Cg *cg = z->cg;
    CgFn *f = z->f;
    LLVMBuilderRef b = cg->b;
    switch (x->op) {
    case IR_INPUT: {
        int k = operand_of(x);
        LLVMValueRef idx = last_is_one(x) ? z->base[k] : LLVMBuildAdd(b, z->base[k], col, "");
        return cg_load(f, x->dtype, f->in[k], idx);
    }
    case IR_CONST:
        switch (x->dtype) {
        case IR_F32: return cg_f32(cg, x->f);
        case IR_BOOL: return LLVMConstInt(cg->t_i1, x->f != 0, 0);
        default: return LLVMConstInt(cg_mem_type(cg, x->dtype), (unsigned long long)(int64_t)trunc(x->f), 1);
        }
    case IR_PERMUTE: { /* an operand with permuted strides; its last axis stays contiguous */
        int k = operand_of(x->in[0]);
        LLVMValueRef idx = last_is_one(x) ? z->pbase[x->id] : LLVMBuildAdd(b, z->pbase[x->id], col, "");
        return cg_load(f, x->dtype, f->in[k], idx);
    }
    case IR_SLICE: { /* of the last axis */
        int64_t s = ir_dim_is_const(x->d) ? x->d.c : 0;
        z->coff += s; /* followed for a matmul epilogue's product (constant starts there) */
        LLVMValueRef v = fz_value(z, x->in[0], LLVMBuildAdd(b, col, cg_dim(f, x->d), ""));
        z->coff -= s;
        return v;
    }
    case IR_CONCAT: { /* of the last axis: both parts at clamped columns, then the one that applies */
        LLVMValueRef la = cg_dim(f, x->in[0]->shape[x->rank - 1]);
        LLVMValueRef first = LLVMBuildICmp(b, LLVMIntSLT, col, la, "");
        LLVMValueRef ca = cg_min_i64(f, col, LLVMBuildSub(b, la, cg_i64(cg, 1), ""));
        LLVMValueRef cb = cg_max_i64(f, LLVMBuildSub(b, col, la, ""), cg_i64(cg, 0));
        LLVMValueRef va = fz_value(z, x->in[0], col_of(z, x->in[0], ca));
        LLVMValueRef vb = fz_value(z, x->in[1], col_of(z, x->in[1], cb));
        return LLVMBuildSelect(b, first, va, vb, "");
    }
    case IR_EXPAND: /* broadcast to the node's shape */
        return fz_value(z, x->in[0], col_of(z, x->in[0], col));
    case IR_SUM:
    case IR_RMAX:
        return LLVMBuildLoad2(b, cg->t_f32, z->slot[x->id], "");
    case IR_SOFTMAX: {
        LLVMValueRef m = LLVMBuildLoad2(b, cg->t_f32, z->slot[x->id], "");
        LLVMValueRef inv = LLVMBuildLoad2(b, cg->t_f32, z->slot2[x->id], "");
        return LLVMBuildFMul(b, cg_exp(cg, LLVMBuildFSub(b, fz_value(z, x->in[0], col), m, "")), inv, "");
    }
    case IR_MATMUL: { /* in the epilogue: the product's part at coff (0 or the width), ir_epilogue_parts */
        if (!z->parts)
            return cg_f32(cg, NAN);
        int p = z->coff ? 1 : 0;
        LLVMValueRef j = LLVMBuildSub(b, col, cg_i64(cg, z->coff), "");
        return cg_load(f, IR_F32, z->parts[p].ptr, LLVMBuildAdd(b, z->prow[p], j, ""));
    }
    default: {
        LLVMValueRef args[IR_MAXIN];
        for (int k = 0; k < x->nin; k++)
            args[k] = fz_value(z, x->in[k], col_of(z, x->in[k], col));
        const CgLower *L = cg_llvm_lowering(x->op);
        const IrNode *saved = f->node;
        f->node = x; /* the scalar lowerings read the op's types from the node */
        LLVMValueRef v = L->scalar(f, args);
        f->node = saved;
        return v;
    }
    }
}

/* The value of program node x at column col of the current row; remembered for the loop's own
 * column (values at other columns, under slices and concats, are recomputed). */
static LLVMValueRef fz_value(Fz *z, const IrNode *x, LLVMValueRef col)
{
    int own = col == z->col;
    if (own && z->memo[x->id])
        return z->memo[x->id];
    LLVMValueRef v = value_at(z, x, col);
    if (own)
        z->memo[x->id] = v;
    return v;
}

/* a new loop over columns: forget what the last one computed */
static void fz_loop(Fz *z, LLVMValueRef col)
{
    memset(z->memo, 0, sizeof *z->memo * (size_t)z->pg->nnodes);
    z->col = col;
}

/* the reduction of e over its columns: sum (reassociable), or maximum (NaN propagates); with
 * sub_max, the sum of exp(e - sub_max) (a softmax's denominator) */
static LLVMValueRef fz_reduce(Fz *z, const IrNode *e, int is_max, LLVMValueRef sub_max)
{
    Cg *cg = z->cg;
    CgFn *f = z->f;
    LLVMBuilderRef b = cg->b;
    LLVMValueRef acc = cg_var(f, cg->t_f32, cg_f32(cg, is_max ? -INFINITY : 0.0), "acc");
    LLVMValueRef nan = cg_var(f, cg->t_i1, LLVMConstInt(cg->t_i1, 0, 0), "nan");
    CgLoop l;
    cg_for(f, &l, cg_i64(cg, 0), cg_dim(f, e->shape[e->rank - 1]), "j");
    fz_loop(z, l.iv);
    LLVMValueRef v = fz_value(z, e, l.iv);
    if (sub_max)
        v = cg_exp(cg, LLVMBuildFSub(b, v, sub_max, ""));
    LLVMValueRef a = LLVMBuildLoad2(b, cg->t_f32, acc, "");
    if (is_max) {
        LLVMValueRef args[2] = {a, v};
        LLVMValueRef mx = cg_intrinsic(cg, "llvm.maxnum", cg->t_f32, args, 2);
        LLVMBuildStore(b, cg_fmf(mx, LLVMFastMathNoNaNs | LLVMFastMathNoSignedZeros), acc);
        LLVMValueRef isnan = LLVMBuildFCmp(b, LLVMRealUNO, v, v, "");
        LLVMBuildStore(b, LLVMBuildOr(b, LLVMBuildLoad2(b, cg->t_i1, nan, ""), isnan, ""), nan);
    } else {
        LLVMBuildStore(b, cg_fmf(LLVMBuildFAdd(b, a, v, ""), LLVMFastMathAllowReassoc | LLVMFastMathAllowContract), acc);
    }
    cg_for_end(f, &l);
    fz_loop(z, NULL);
    LLVMValueRef res = LLVMBuildLoad2(b, cg->t_f32, acc, "");
    if (is_max)
        res = LLVMBuildSelect(b, LLVMBuildLoad2(b, cg->t_i1, nan, ""), cg_f32(cg, NAN), res, "");
    return res;
}

/* The matmul step's own view of the kernel: its node and operands. */
static CgFn matmul_view(const Fz *z, const CgFn *f)
{
    CgFn fm = *f;
    fm.node = z->mm;
    for (int k = 0; k < IR_MAXIN; k++)
        fm.in[k] = NULL;
    for (int k = 0; k < IR_MAXIN; k++)
        fm.in_bf16[k] = 0;
    fm.in[0] = f->in[operand_of(z->mm->in[0])];
    fm.in[1] = f->in[operand_of(z->mm->in[1])];
    fm.in_bf16[1] = f->in_bf16[operand_of(z->mm->in[1])]; /* a weight read only as B (cg_plan.c) */
    fm.mm_parts = z->mm_parts == 2 ? 2 : 0;
    return fm;
}

/* rows [i0, i1), columns [j0, j1) of batch bi: C = program(product, ...) */
static void epilogue(CgFn *fm, void *ctx, LLVMValueRef bi, LLVMValueRef i0, LLVMValueRef i1, LLVMValueRef j0,
                     LLVMValueRef j1, const CgMmPart *parts)
{
    Fz *z = ctx;
    LLVMBuilderRef b = z->cg->b;
    const IrNode *n = z->node, *root = z->steps[z->prog.nsteps - 1];
    LLVMValueRef m = cg_dim(fm, n->shape[n->rank - 2]), cols = cg_dim(fm, n->shape[n->rank - 1]);
    CgLoop li, lj;
    cg_for(fm, &li, i0, i1, "ei");
    LLVMValueRef row = LLVMBuildAdd(b, LLVMBuildMul(b, bi, m, ""), li.iv, "");
    fz_row_bases(z, row);
    z->parts = parts;
    for (int p = 0; p < z->mm_parts; p++)
        z->prow[p] = LLVMBuildSub(b, LLVMBuildMul(b, LLVMBuildSub(b, li.iv, parts[p].i0, ""), parts[p].ld, ""), parts[p].j0, "");
    LLVMValueRef obase = LLVMBuildMul(b, row, cols, "");
    cg_for(fm, &lj, j0, j1, "ej");
    fz_loop(z, lj.iv);
    LLVMValueRef at = LLVMBuildAdd(b, obase, lj.iv, "");
    /* C in place: the product is read where the value is stored, through the same address, or
     * the vectoriser cannot tell the two apart and versions the loop on a run-time check that
     * fails (they are the same memory), leaving it scalar */
    if (z->mm_parts == 1)
        z->memo[z->mm->id] = cg_load(fm, IR_F32, fm->out, at);
    cg_store(fm, n->dtype, fm->out, at, fz_value(z, root, lj.iv));
    cg_for_end(fm, &lj);
    cg_for_end(fm, &li);
    fz_loop(z, NULL);
    z->parts = NULL;
}

static LLVMValueRef chunks(CgFn *f, LLVMValueRef len)
{
    LLVMBuilderRef b = f->cg->b;
    LLVMValueRef n = LLVMBuildSDiv(b, LLVMBuildAdd(b, len, cg_i64(f->cg, CHUNK - 1), ""), cg_i64(f->cg, CHUNK), "");
    return cg_max_i64(f, n, cg_i64(f->cg, 1));
}

void cg_fused_work(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    Fz z;
    if (fz_init(&z, f) < 0) {
        fz_free(&z);
        *items = *cost = cg_i64(f->cg, 1);
        return;
    }
    if (z.mm) {
        CgFn fm = matmul_view(&z, f);
        cg_matmul_work(&fm, items, cost);
        fz_free(&z);
        return;
    }
    LLVMBuilderRef b = f->cg->b;
    const IrNode *n = f->node;
    LLVMValueRef rows = fz_rows(f, n), len = cg_dim(f, n->shape[n->rank - 1]);
    /* a row's reductions run over their arguments' columns: count the widest operand's */
    LLVMValueRef width = len;
    for (int k = 0; k < n->nin; k++)
        if (n->in[k]->rank >= 1)
            width = cg_max_i64(f, width, cg_dim(f, n->in[k]->shape[n->in[k]->rank - 1]));
    *cost = LLVMBuildMul(b, LLVMBuildMul(b, rows, width, ""), cg_i64(f->cg, z.pg->nnodes), "");
    *items = z.has_reduce ? rows : LLVMBuildMul(b, rows, chunks(f, len), "");
    fz_free(&z);
}

int cg_fused_impl(CgFn *f)
{
    Fz z;
    if (fz_init(&z, f) < 0) {
        fz_free(&z);
        return -1;
    }
    if (z.mm) {
        if (z.node->dtype != IR_F32) {
            fz_free(&z);
            return cg_error(f->cg, "fused %%%s: a matmul epilogue ends in f32", who(f->node));
        }
        CgFn fm = matmul_view(&z, f);
        CgMatmulEpilogue epi = {epilogue, &z};
        int rc = cg_matmul_impl_epilogue(&fm, &epi);
        fz_free(&z);
        return rc;
    }
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    LLVMValueRef lout = cg_dim(f, n->shape[n->rank - 1]);
    LLVMValueRef nch = z.has_reduce ? cg_i64(cg, 1) : chunks(f, lout);
    for (int i = 0; i < z.pg->nnodes; i++)
        if (ir_fused_is_reduce(z.pg->nodes[i]->op)) {
            z.slot[i] = cg_var(f, cg->t_f32, NULL, "red");
            z.slot2[i] = cg_var(f, cg->t_f32, NULL, "red2");
        }
    CgLoop li;
    cg_for(f, &li, f->lo, f->hi, "item");
    LLVMValueRef row = LLVMBuildSDiv(b, li.iv, nch, "row");
    LLVMValueRef j0 = LLVMBuildMul(b, LLVMBuildSRem(b, li.iv, nch, ""), cg_i64(cg, CHUNK), "");
    LLVMValueRef j1 = cg_min_i64(f, lout, LLVMBuildAdd(b, j0, cg_i64(cg, CHUNK), ""));
    if (z.has_reduce) {
        j0 = cg_i64(cg, 0);
        j1 = lout;
    }
    fz_row_bases(&z, row);
    /* the reductions, in program order */
    for (int i = 0; i < z.pg->nnodes; i++) {
        const IrNode *x = z.pg->nodes[i];
        if (!ir_fused_is_reduce(x->op))
            continue;
        if (x->op == IR_SOFTMAX) {
            LLVMValueRef m = fz_reduce(&z, x->in[0], 1, NULL);
            LLVMBuildStore(b, m, z.slot[i]);
            LLVMValueRef s = fz_reduce(&z, x->in[0], 0, m);
            LLVMBuildStore(b, LLVMBuildFDiv(b, cg_f32(cg, 1.0), s, ""), z.slot2[i]);
        } else {
            LLVMBuildStore(b, fz_reduce(&z, x->in[0], x->op == IR_RMAX, NULL), z.slot[i]);
        }
    }
    /* the value */
    const IrNode *root = z.steps[z.prog.nsteps - 1];
    LLVMValueRef obase = LLVMBuildMul(b, row, lout, "");
    CgLoop lj;
    cg_for(f, &lj, j0, j1, "j");
    fz_loop(&z, lj.iv);
    LLVMValueRef v = fz_value(&z, root, col_of(&z, root, lj.iv));
    cg_store(f, n->dtype, f->out, LLVMBuildAdd(b, obase, lj.iv, ""), v);
    cg_for_end(f, &lj);
    cg_for_end(f, &li);
    fz_free(&z);
    return 0;
}
