/* cg_llvm_util.c: small builders over the LLVM C API that every lowering uses: constants,
 * symbolic dims, variables, loops and branches, element access by IR dtype, conversions,
 * intrinsics, and vectorisable exp/erf written as plain arithmetic (a libm call in a loop
 * would keep the loop vectoriser away). */
#include "cg_llvm.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int cg_error(Cg *cg, const char *fmt, ...)
{
    if (cg->err[0])
        return -1; /* keep the first */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cg->err, sizeof cg->err, fmt, ap);
    va_end(ap);
    return -1;
}

LLVMValueRef cg_i64(Cg *cg, int64_t v) { return LLVMConstInt(cg->t_i64, (unsigned long long)v, 1); }
LLVMValueRef cg_i32(Cg *cg, int32_t v) { return LLVMConstInt(cg->t_i32, (unsigned long long)(int64_t)v, 1); }
LLVMValueRef cg_f32(Cg *cg, double v) { return LLVMConstReal(cg->t_f32, v); }

LLVMTypeRef cg_mem_type(Cg *cg, IrDType t)
{
    switch (t) {
    case IR_F32: return cg->t_f32;
    case IR_I32: return cg->t_i32;
    case IR_I64: return cg->t_i64;
    default: return cg->t_i8;
    }
}

LLVMTypeRef cg_val_type(Cg *cg, IrDType t) { return t == IR_BOOL ? cg->t_i1 : cg_mem_type(cg, t); }

LLVMValueRef cg_dim(CgFn *f, IrDim d)
{
    Cg *cg = f->cg;
    LLVMValueRef v = cg_i64(cg, d.c);
    for (int s = 0; s < IR_MAXSYM; s++) {
        if (!d.k[s])
            continue;
        LLVMValueRef idx = cg_i64(cg, s);
        LLVMValueRef p = LLVMBuildGEP2(cg->b, cg->t_i64, f->syms, &idx, 1, "");
        LLVMValueRef sym = LLVMBuildLoad2(cg->b, cg->t_i64, p, cg->g->sym_name[s]);
        LLVMSetAlignment(sym, 8);
        LLVMValueRef term = d.k[s] == 1 ? sym : LLVMBuildMul(cg->b, sym, cg_i64(cg, d.k[s]), "");
        v = LLVMBuildAdd(cg->b, v, term, "");
    }
    return v;
}

LLVMValueRef cg_dims_prod(CgFn *f, const IrDim *dims, int from, int to)
{
    LLVMValueRef v = cg_i64(f->cg, 1);
    for (int i = from; i < to; i++)
        if (!ir_dim_is_one(dims[i]))
            v = LLVMBuildMul(f->cg->b, v, cg_dim(f, dims[i]), "");
    return v;
}

LLVMValueRef cg_var(CgFn *f, LLVMTypeRef t, LLVMValueRef init, const char *name)
{
    Cg *cg = f->cg;
    LLVMBasicBlockRef here = LLVMGetInsertBlock(cg->b);
    LLVMValueRef first = LLVMGetFirstInstruction(f->entry);
    if (first)
        LLVMPositionBuilderBefore(cg->b, first);
    else
        LLVMPositionBuilderAtEnd(cg->b, f->entry);
    LLVMValueRef var = LLVMBuildAlloca(cg->b, t, name);
    LLVMPositionBuilderAtEnd(cg->b, here);
    if (init)
        LLVMBuildStore(cg->b, init, var);
    return var;
}

LLVMValueRef cg_get(CgFn *f, LLVMTypeRef t, LLVMValueRef var) { return LLVMBuildLoad2(f->cg->b, t, var, ""); }

void cg_for(CgFn *f, CgLoop *l, LLVMValueRef lo, LLVMValueRef hi, const char *name)
{
    Cg *cg = f->cg;
    l->var = cg_var(f, cg->t_i64, lo, name);
    l->cond = LLVMAppendBasicBlockInContext(cg->ctx, f->fn, "for.cond");
    l->body = LLVMAppendBasicBlockInContext(cg->ctx, f->fn, "for.body");
    l->exit = LLVMAppendBasicBlockInContext(cg->ctx, f->fn, "for.end");
    LLVMBuildBr(cg->b, l->cond);
    LLVMPositionBuilderAtEnd(cg->b, l->cond);
    l->iv = LLVMBuildLoad2(cg->b, cg->t_i64, l->var, name);
    LLVMBuildCondBr(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, l->iv, hi, ""), l->body, l->exit);
    LLVMPositionBuilderAtEnd(cg->b, l->body);
}

void cg_for_end(CgFn *f, CgLoop *l)
{
    Cg *cg = f->cg;
    LLVMValueRef next = LLVMBuildNSWAdd(cg->b, l->iv, cg_i64(cg, 1), "");
    LLVMBuildStore(cg->b, next, l->var);
    LLVMBuildBr(cg->b, l->cond);
    LLVMPositionBuilderAtEnd(cg->b, l->exit);
}

void cg_if(CgFn *f, CgIf *c, LLVMValueRef cond)
{
    Cg *cg = f->cg;
    c->then = LLVMAppendBasicBlockInContext(cg->ctx, f->fn, "if.then");
    c->done = LLVMAppendBasicBlockInContext(cg->ctx, f->fn, "if.end");
    LLVMBuildCondBr(cg->b, cond, c->then, c->done);
    LLVMPositionBuilderAtEnd(cg->b, c->then);
}

void cg_if_end(CgFn *f, CgIf *c)
{
    LLVMBuildBr(f->cg->b, c->done);
    LLVMPositionBuilderAtEnd(f->cg->b, c->done);
}

LLVMValueRef cg_addr(CgFn *f, IrDType t, LLVMValueRef base, LLVMValueRef idx)
{
    return LLVMBuildInBoundsGEP2(f->cg->b, cg_mem_type(f->cg, t), base, &idx, 1, "");
}

LLVMValueRef cg_load(CgFn *f, IrDType t, LLVMValueRef base, LLVMValueRef idx)
{
    Cg *cg = f->cg;
    LLVMValueRef v = LLVMBuildLoad2(cg->b, cg_mem_type(cg, t), cg_addr(f, t, base, idx), "");
    if (t == IR_BOOL)
        v = LLVMBuildICmp(cg->b, LLVMIntNE, v, LLVMConstInt(cg->t_i8, 0, 0), "");
    return v;
}

LLVMValueRef cg_addr_bf16(CgFn *f, LLVMValueRef base, LLVMValueRef idx)
{
    return LLVMBuildInBoundsGEP2(f->cg->b, LLVMInt16TypeInContext(f->cg->ctx), base, &idx, 1, "");
}

LLVMValueRef cg_widen_bf16(Cg *cg, LLVMValueRef v16, int n)
{
    LLVMTypeRef ti = n > 1 ? LLVMVectorType(cg->t_i32, (unsigned)n) : cg->t_i32;
    LLVMTypeRef tf = n > 1 ? LLVMVectorType(cg->t_f32, (unsigned)n) : cg->t_f32;
    LLVMValueRef sh = cg_i32(cg, 16);
    if (n > 1) {
        LLVMValueRef e[64];
        for (int i = 0; i < n; i++)
            e[i] = sh;
        sh = LLVMConstVector(e, (unsigned)n);
    }
    return LLVMBuildBitCast(cg->b, LLVMBuildShl(cg->b, LLVMBuildZExt(cg->b, v16, ti, ""), sh, ""), tf, "");
}

LLVMValueRef cg_load_bf16(CgFn *f, LLVMValueRef base, LLVMValueRef idx)
{
    Cg *cg = f->cg;
    LLVMValueRef v = LLVMBuildLoad2(cg->b, LLVMInt16TypeInContext(cg->ctx), cg_addr_bf16(f, base, idx), "");
    return cg_widen_bf16(cg, v, 1);
}

void cg_store_bf16(CgFn *f, LLVMValueRef base, LLVMValueRef idx, LLVMValueRef v)
{
    Cg *cg = f->cg;
    LLVMValueRef u = LLVMBuildBitCast(cg->b, cg_bf16_round(cg, v), cg->t_i32, "");
    LLVMValueRef h = LLVMBuildTrunc(cg->b, LLVMBuildLShr(cg->b, u, cg_i32(cg, 16), ""), LLVMInt16TypeInContext(cg->ctx), "");
    LLVMBuildStore(cg->b, h, cg_addr_bf16(f, base, idx));
}

LLVMValueRef cg_i8row_addr(CgFn *f, LLVMValueRef base, LLVMValueRef row, int64_t D)
{
    LLVMValueRef off = LLVMBuildMul(f->cg->b, row, cg_i64(f->cg, D + 4), "");
    return LLVMBuildInBoundsGEP2(f->cg->b, f->cg->t_i8, base, &off, 1, "");
}

LLVMValueRef cg_i8row_scale(CgFn *f, LLVMValueRef rowp, int64_t D)
{
    LLVMValueRef l = LLVMBuildLoad2(f->cg->b, f->cg->t_f32, cg_addr(f, IR_I8, rowp, cg_i64(f->cg, D)), "scale");
    LLVMSetAlignment(l, 1);
    return l;
}

LLVMValueRef cg_i8row_q(CgFn *f, LLVMValueRef rowp, LLVMValueRef e)
{
    return LLVMBuildSIToFP(f->cg->b, cg_load(f, IR_I8, rowp, e), f->cg->t_f32, "");
}

void cg_i8row_quantize(CgFn *f, LLVMValueRef rowp, LLVMValueRef src, LLVMValueRef soff, int64_t D)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    LLVMValueRef m = cg_var(f, cg->t_f32, cg_f32(cg, 0), "amax");
    CgLoop l;
    cg_for(f, &l, cg_i64(cg, 0), cg_i64(cg, D), "qmax");
    LLVMValueRef x = cg_load(f, IR_F32, src, LLVMBuildAdd(b, soff, l.iv, ""));
    LLVMValueRef ax = cg_intrinsic(cg, "llvm.fabs", cg->t_f32, &x, 1), cur = cg_get(f, cg->t_f32, m);
    LLVMBuildStore(b, LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, ax, cur, ""), ax, cur, ""), m);
    cg_for_end(f, &l);
    LLVMValueRef amax = cg_get(f, cg->t_f32, m);
    LLVMValueRef zero = LLVMBuildFCmp(b, LLVMRealOEQ, amax, cg_f32(cg, 0), "");
    /* inv = 127 / amax (0 for a row of zeros), scale = amax / 127 */
    LLVMValueRef inv = LLVMBuildSelect(b, zero, cg_f32(cg, 0), LLVMBuildFDiv(b, cg_f32(cg, 127), amax, ""), "inv");
    LLVMValueRef st = LLVMBuildStore(b, LLVMBuildFDiv(b, amax, cg_f32(cg, 127), ""), cg_addr(f, IR_I8, rowp, cg_i64(cg, D)));
    LLVMSetAlignment(st, 1);
    cg_for(f, &l, cg_i64(cg, 0), cg_i64(cg, D), "qrow");
    LLVMValueRef y = LLVMBuildFMul(b, cg_load(f, IR_F32, src, LLVMBuildAdd(b, soff, l.iv, "")), inv, "");
    y = cg_intrinsic(cg, "llvm.rint", cg->t_f32, &y, 1); /* the default rounding: to nearest even */
    y = cg_intrinsic(cg, "llvm.minnum", cg->t_f32, (LLVMValueRef[]){y, cg_f32(cg, 127)}, 2);
    y = cg_intrinsic(cg, "llvm.maxnum", cg->t_f32, (LLVMValueRef[]){y, cg_f32(cg, -127)}, 2);
    LLVMBuildStore(b, LLVMBuildFPToSI(b, y, cg->t_i8, ""), cg_addr(f, IR_I8, rowp, l.iv));
    cg_for_end(f, &l);
}

void cg_store(CgFn *f, IrDType t, LLVMValueRef base, LLVMValueRef idx, LLVMValueRef v)
{
    Cg *cg = f->cg;
    if (t == IR_BOOL)
        v = LLVMBuildZExt(cg->b, v, cg->t_i8, "");
    LLVMBuildStore(cg->b, v, cg_addr(f, t, base, idx));
}

LLVMValueRef cg_intrinsic(Cg *cg, const char *name, LLVMTypeRef ty, LLVMValueRef *args, int nargs)
{
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef fn = LLVMGetIntrinsicDeclaration(cg->mod, id, &ty, 1);
    LLVMTypeRef fty = LLVMIntrinsicGetType(cg->ctx, id, &ty, 1);
    return LLVMBuildCall2(cg->b, fty, fn, args, (unsigned)nargs, "");
}

LLVMValueRef cg_intrinsic_n(Cg *cg, const char *name, LLVMTypeRef *types, int ntypes, LLVMValueRef *args, int nargs)
{
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef fn = LLVMGetIntrinsicDeclaration(cg->mod, id, types, (size_t)ntypes);
    LLVMTypeRef fty = LLVMIntrinsicGetType(cg->ctx, id, types, (size_t)ntypes);
    return LLVMBuildCall2(cg->b, fty, fn, args, (unsigned)nargs, "");
}

static LLVMValueRef intrinsic2(Cg *cg, const char *name, LLVMTypeRef t0, LLVMTypeRef t1, LLVMValueRef arg)
{
    LLVMTypeRef tys[2] = {t0, t1};
    return cg_intrinsic_n(cg, name, tys, 2, &arg, 1);
}

LLVMValueRef cg_libm(Cg *cg, const char *name, LLVMValueRef x)
{
    LLVMTypeRef fty = LLVMFunctionType(cg->t_f32, &cg->t_f32, 1, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(cg->mod, name);
    if (!fn)
        fn = LLVMAddFunction(cg->mod, name, fty);
    return LLVMBuildCall2(cg->b, fty, fn, &x, 1, "");
}

LLVMValueRef cg_fmf(LLVMValueRef inst, unsigned flags)
{
    if (LLVMCanValueUseFastMathFlags(inst))
        LLVMSetFastMathFlags(inst, flags);
    return inst;
}

LLVMValueRef cg_convert(CgFn *f, LLVMValueRef v, IrDType from, IrDType to)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    if (from == to)
        return v;
    if (to == IR_BOOL) {
        if (from == IR_F32)
            return LLVMBuildFCmp(b, LLVMRealUNE, v, cg_f32(cg, 0), ""); /* NaN counts as true */
        return LLVMBuildICmp(b, LLVMIntNE, v, LLVMConstInt(LLVMTypeOf(v), 0, 0), "");
    }
    LLVMTypeRef tt = cg_val_type(cg, to);
    if (from == IR_BOOL)
        return to == IR_F32 ? LLVMBuildUIToFP(b, v, tt, "") : LLVMBuildZExt(b, v, tt, "");
    if (from == IR_F32) /* saturating: NaN gives 0, never undefined behaviour */
        return intrinsic2(cg, "llvm.fptosi.sat", tt, cg->t_f32, v);
    if (to == IR_F32)
        return LLVMBuildSIToFP(b, v, tt, "");
    return LLVMBuildIntCast2(b, v, tt, 1, "");
}

void cg_flag_error(CgFn *f, LLVMValueRef cond)
{
    Cg *cg = f->cg;
    LLVMValueRef st = LLVMBuildLoad2(cg->b, cg->t_i32, f->status, "");
    st = LLVMBuildOr(cg->b, st, LLVMBuildZExt(cg->b, cond, cg->t_i32, ""), "");
    LLVMBuildStore(cg->b, st, f->status);
}

LLVMValueRef cg_min_i64(CgFn *f, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildSelect(f->cg->b, LLVMBuildICmp(f->cg->b, LLVMIntSLT, a, b, ""), a, b, "");
}

LLVMValueRef cg_max_i64(CgFn *f, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildSelect(f->cg->b, LLVMBuildICmp(f->cg->b, LLVMIntSGT, a, b, ""), a, b, "");
}

/* ---- float math on scalars or vectors ---- */

/* A float constant shaped like x (scalar or splat vector). */
static LLVMValueRef fconst(Cg *cg, LLVMValueRef like, double v)
{
    (void)cg;
    LLVMTypeRef t = LLVMTypeOf(like);
    if (LLVMGetTypeKind(t) != LLVMVectorTypeKind)
        return LLVMConstReal(t, v);
    unsigned n = LLVMGetVectorSize(t);
    LLVMValueRef e[64];
    for (unsigned i = 0; i < n && i < 64; i++)
        e[i] = LLVMConstReal(LLVMGetElementType(t), v);
    return LLVMConstVector(e, n);
}

/* The i32 type with x's shape. */
static LLVMTypeRef int_like(Cg *cg, LLVMValueRef like)
{
    LLVMTypeRef t = LLVMTypeOf(like);
    if (LLVMGetTypeKind(t) != LLVMVectorTypeKind)
        return cg->t_i32;
    return LLVMVectorType(cg->t_i32, LLVMGetVectorSize(t));
}

static LLVMValueRef iconst(Cg *cg, LLVMValueRef like, int64_t v)
{
    LLVMTypeRef t = int_like(cg, like);
    if (LLVMGetTypeKind(t) != LLVMVectorTypeKind)
        return LLVMConstInt(t, (unsigned long long)v, 1);
    unsigned n = LLVMGetVectorSize(t);
    LLVMValueRef e[64];
    for (unsigned i = 0; i < n && i < 64; i++)
        e[i] = LLVMConstInt(cg->t_i32, (unsigned long long)v, 1);
    return LLVMConstVector(e, n);
}

static LLVMValueRef fmul(Cg *cg, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFMul(cg->b, a, b, ""); }
static LLVMValueRef fadd(Cg *cg, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFAdd(cg->b, a, b, ""); }

/* c[0] + x*(c[1] + x*(...)) */
static LLVMValueRef poly(Cg *cg, LLVMValueRef x, const double *c, int n)
{
    LLVMValueRef acc = fconst(cg, x, c[n - 1]);
    for (int i = n - 2; i >= 0; i--)
        acc = fadd(cg, fmul(cg, acc, x), fconst(cg, x, c[i]));
    return acc;
}

static LLVMValueRef select_lt(Cg *cg, LLVMValueRef x, double v, LLVMValueRef then)
{
    return LLVMBuildSelect(cg->b, LLVMBuildFCmp(cg->b, LLVMRealOLT, x, fconst(cg, x, v), ""), then, x, "");
}

static LLVMValueRef select_gt(Cg *cg, LLVMValueRef x, double v, LLVMValueRef then)
{
    return LLVMBuildSelect(cg->b, LLVMBuildFCmp(cg->b, LLVMRealOGT, x, fconst(cg, x, v), ""), then, x, "");
}

/* 2^n for integral float n in [-150, 128], as two normal factors so neither overflows */
static LLVMValueRef pow2_times(Cg *cg, LLVMValueRef y, LLVMValueRef n)
{
    LLVMBuilderRef b = cg->b;
    LLVMTypeRef it = int_like(cg, n);
    LLVMValueRef ni = LLVMBuildFPToSI(b, n, it, "");
    LLVMValueRef n1 = LLVMBuildAShr(b, ni, iconst(cg, n, 1), "");
    LLVMValueRef n2 = LLVMBuildSub(b, ni, n1, "");
    LLVMTypeRef ft = LLVMTypeOf(y);
    LLVMValueRef s1 = LLVMBuildBitCast(b, LLVMBuildShl(b, LLVMBuildAdd(b, n1, iconst(cg, n, 127), ""), iconst(cg, n, 23), ""), ft, "");
    LLVMValueRef s2 = LLVMBuildBitCast(b, LLVMBuildShl(b, LLVMBuildAdd(b, n2, iconst(cg, n, 127), ""), iconst(cg, n, 23), ""), ft, "");
    return fmul(cg, fmul(cg, y, s1), s2);
}

/* exp(r) for r in [-ln2/2, ln2/2]: Cephes expf's polynomial, c[0] + r (c[1] + r (...)) */
static const double exp_poly[] = {1.0, 1.0, 5.0000001201E-1, 1.6666665459E-1, 4.1665795894E-2,
                                  8.3334519073E-3, 1.3981999507E-3, 1.9875691500E-4};

LLVMValueRef cg_exp(Cg *cg, LLVMValueRef x)
{
    /* exp(x) = 2^k * exp(r), k = rint(x / ln 2), r = x - k ln 2 in [-ln2/2, ln2/2] (Cephes expf) */
    LLVMBuilderRef b = cg->b;
    LLVMValueRef isnan = LLVMBuildFCmp(b, LLVMRealUNO, x, x, "");
    LLVMValueRef xc = LLVMBuildSelect(b, isnan, fconst(cg, x, 0), x, "");
    xc = select_lt(cg, xc, -104.0, fconst(cg, x, -104.0)); /* exp underflows to 0 below */
    xc = select_gt(cg, xc, 89.0, fconst(cg, x, 89.0));     /* and overflows to inf above */
    LLVMValueRef k = cg_intrinsic(cg, "llvm.rint", LLVMTypeOf(x), (LLVMValueRef[]){fmul(cg, xc, fconst(cg, x, 1.44269504088896341))}, 1);
    LLVMValueRef r = LLVMBuildFSub(b, xc, fmul(cg, k, fconst(cg, x, 0.693359375)), "");
    r = LLVMBuildFSub(b, r, fmul(cg, k, fconst(cg, x, -2.12194440e-4)), "");
    LLVMValueRef y = poly(cg, r, exp_poly, 8);
    LLVMValueRef res = pow2_times(cg, y, k);
    return LLVMBuildSelect(b, isnan, x, res, "");
}

/* c[0] + r (c[1] + r (... c[n-1])) in fused multiply-adds */
static LLVMValueRef poly_fma(Cg *cg, LLVMValueRef r, const double *c, int n)
{
    LLVMTypeRef t = LLVMTypeOf(r);
    LLVMValueRef y = fconst(cg, r, c[n - 1]);
    for (int i = n - 2; i >= 0; i--)
        y = cg_intrinsic(cg, "llvm.fmuladd", t, (LLVMValueRef[]){y, r, fconst(cg, r, c[i])}, 3);
    return y;
}

/* y 2^k for an integral float k in [-126, 127] (2^k a normal float, built from its exponent
 * bits), or 0 where tiny */
static LLVMValueRef times_pow2_or_zero(Cg *cg, LLVMValueRef y, LLVMValueRef k, LLVMValueRef tiny)
{
    LLVMBuilderRef b = cg->b;
    LLVMValueRef biased = LLVMBuildAdd(b, LLVMBuildFPToSI(b, k, int_like(cg, k), ""), iconst(cg, k, 127), "");
    LLVMValueRef e = LLVMBuildShl(b, biased, iconst(cg, k, 23), "");
    LLVMValueRef res = fmul(cg, y, LLVMBuildBitCast(b, e, LLVMTypeOf(y), ""));
    return LLVMBuildSelect(b, tiny, fconst(cg, y, 0.0), res, "");
}

LLVMValueRef cg_exp_finite(Cg *cg, LLVMValueRef x)
{
    /* cg_exp's reduction and polynomial in fused multiply-adds, without its NaN and overflow
     * handling, and one 2^k factor: k >= -126 after the clamp, so 2^k is a normal float */
    LLVMBuilderRef b = cg->b;
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMValueRef tiny = LLVMBuildFCmp(b, LLVMRealOLT, x, fconst(cg, x, -87.0), "");
    LLVMValueRef xc = LLVMBuildSelect(b, tiny, fconst(cg, x, -87.0), x, "");
    LLVMValueRef xl = fmul(cg, xc, fconst(cg, x, 1.44269504088896341));
    LLVMValueRef k = cg_intrinsic(cg, "llvm.rint", t, &xl, 1);
    LLVMValueRef r = cg_intrinsic(cg, "llvm.fmuladd", t, (LLVMValueRef[]){k, fconst(cg, x, -0.693359375), xc}, 3);
    r = cg_intrinsic(cg, "llvm.fmuladd", t, (LLVMValueRef[]){k, fconst(cg, x, 2.12194440e-4), r}, 3);
    return times_pow2_or_zero(cg, poly_fma(cg, r, exp_poly, 8), k, tiny);
}

/* 2^r for r in [-1/2, 1/2]: a degree-6 least-squares fit on Chebyshev nodes (1.3 ulp in float
 * arithmetic with fused multiply-adds, measured over 200,001 points) */
static const double exp2_poly[] = {0.99999999995952848, 0.69314720672180996, 0.24022651213788396,
                                   0.055503271903387406, 0.0096180255771654913, 0.0013400441713466067,
                                   0.00015469740232381546};

LLVMValueRef cg_exp2_normal(Cg *cg, LLVMValueRef x)
{
    LLVMBuilderRef b = cg->b;
    LLVMValueRef k = cg_intrinsic(cg, "llvm.rint", LLVMTypeOf(x), &x, 1);
    LLVMValueRef r = LLVMBuildFSub(b, x, k, "");
    LLVMValueRef biased = LLVMBuildAdd(b, LLVMBuildFPToSI(b, k, int_like(cg, k), ""), iconst(cg, k, 127), "");
    LLVMValueRef e = LLVMBuildShl(b, biased, iconst(cg, k, 23), "");
    return fmul(cg, poly_fma(cg, r, exp2_poly, 7), LLVMBuildBitCast(b, e, LLVMTypeOf(x), ""));
}

LLVMValueRef cg_exp2_finite(Cg *cg, LLVMValueRef x)
{
    /* 2^x = 2^k 2^r, k = rint(x), r = x - k (exact); 0 below -126, where 2^k stops being normal */
    LLVMBuilderRef b = cg->b;
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMValueRef tiny = LLVMBuildFCmp(b, LLVMRealOLT, x, fconst(cg, x, -126.0), "");
    LLVMValueRef xc = LLVMBuildSelect(b, tiny, fconst(cg, x, -126.0), x, "");
    LLVMValueRef k = cg_intrinsic(cg, "llvm.rint", t, &xc, 1);
    LLVMValueRef r = LLVMBuildFSub(b, xc, k, "");
    return times_pow2_or_zero(cg, poly_fma(cg, r, exp2_poly, 7), k, tiny);
}

LLVMValueRef cg_erf(Cg *cg, LLVMValueRef x)
{
    /* Abramowitz & Stegun 7.1.26: |error| < 1.5e-7. erf(x) = sign(x) (1 - t P(t) e^{-x^2}),
     * t = 1 / (1 + p |x|), in fused multiply-adds: the chain of dependent operations is what a
     * GELU epilogue waits on. e^{-x^2} is cg_exp_finite's (its argument is <= 0); a NaN x is
     * passed through by the last select (cg_exp_finite does not define one). */
    static const double a[] = {0.0, 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429};
    LLVMBuilderRef b = cg->b;
    LLVMTypeRef ty = LLVMTypeOf(x);
    LLVMValueRef ax = cg_intrinsic(cg, "llvm.fabs", ty, &x, 1);
    /* erf(x) = 1 in float for |x| >= 4: the clamp keeps the reciprocal finite (NaN: last select) */
    ax = cg_intrinsic(cg, "llvm.minnum", ty, (LLVMValueRef[]){ax, fconst(cg, x, 10.0)}, 2);
    LLVMValueRef den = cg_intrinsic(cg, "llvm.fmuladd", ty, (LLVMValueRef[]){ax, fconst(cg, x, 0.3275911), fconst(cg, x, 1.0)}, 3);
    /* a reciprocal: the vector estimate and a Newton step ("reciprocal-estimates" in
     * cg_function) are within 2 ulp, far inside the approximation's own error */
    LLVMValueRef t = cg_fmf(LLVMBuildFDiv(b, fconst(cg, x, 1.0), den, ""), LLVMFastMathAllowReciprocal | LLVMFastMathNoInfs);
    LLVMValueRef p = poly_fma(cg, t, a, 6);
    LLVMValueRef e = cg_exp_finite(cg, LLVMBuildFNeg(b, fmul(cg, ax, ax), ""));
    LLVMValueRef y = cg_intrinsic(cg, "llvm.fmuladd", ty, (LLVMValueRef[]){LLVMBuildFNeg(b, p, ""), e, fconst(cg, x, 1.0)}, 3);
    y = cg_intrinsic(cg, "llvm.copysign", ty, (LLVMValueRef[]){y, x}, 2);
    return LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealUNO, x, x, ""), x, y, "");
}

LLVMValueRef cg_fmax(Cg *cg, LLVMValueRef a, LLVMValueRef b)
{
    LLVMBuilderRef bl = cg->b;
    LLVMValueRef m = LLVMBuildSelect(bl, LLVMBuildFCmp(bl, LLVMRealOGT, a, b, ""), a, b, "");
    return LLVMBuildSelect(bl, LLVMBuildFCmp(bl, LLVMRealUNO, a, b, ""), fadd(cg, a, b), m, "");
}

LLVMValueRef cg_fmin(Cg *cg, LLVMValueRef a, LLVMValueRef b)
{
    LLVMBuilderRef bl = cg->b;
    LLVMValueRef m = LLVMBuildSelect(bl, LLVMBuildFCmp(bl, LLVMRealOLT, a, b, ""), a, b, "");
    return LLVMBuildSelect(bl, LLVMBuildFCmp(bl, LLVMRealUNO, a, b, ""), fadd(cg, a, b), m, "");
}

LLVMValueRef cg_bf16_round(Cg *cg, LLVMValueRef x)
{
    LLVMBuilderRef b = cg->b;
    LLVMTypeRef ft = LLVMTypeOf(x);
    LLVMValueRef u = LLVMBuildBitCast(b, x, int_like(cg, x), "");
    /* u + 0x7fff + (bit 16 of u), upper half kept: to nearest, ties to the even upper half */
    LLVMValueRef lsb = LLVMBuildAnd(b, LLVMBuildLShr(b, u, iconst(cg, x, 16), ""), iconst(cg, x, 1), "");
    LLVMValueRef r = LLVMBuildAdd(b, LLVMBuildAdd(b, u, iconst(cg, x, 0x7fff), ""), lsb, "");
    LLVMValueRef nan = LLVMBuildICmp(b, LLVMIntUGT, LLVMBuildAnd(b, u, iconst(cg, x, 0x7fffffff), ""), iconst(cg, x, 0x7f800000), "");
    r = LLVMBuildSelect(b, nan, LLVMBuildOr(b, u, iconst(cg, x, 0x400000), ""), r, "");
    return LLVMBuildBitCast(b, LLVMBuildAnd(b, r, iconst(cg, x, (int64_t)0xffff0000u), ""), ft, "");
}
