/* cg_llvm_q8.c: the int8-weight matmul, matmul_q8 (ops.def): C[.., m, n] = A[.., m, k] W'^T with
 * W'[j, p] = W[j, p] * S[j, p / G], W int8 [n, k] (stored as a Linear's weight), S f32 [n, ng],
 * ng = ceil(k / G). It is the matmul kernel of cg_llvm_matmul.c (the same work items, paths and
 * epilogue hooks) with B read through the three functions here:
 *
 *  - the matrix-vector path (a few rows: decoding with a KV cache), which is bound by the bytes
 *    of weights it reads: each weight is loaded as one byte and widened to f32 in registers;
 *    a group's products are summed in f32 and the sum multiplied by the group's scale once
 *    (sum_p a[p] W[j, p] S[j, g] = S[j, g] sum_p a[p] W[j, p] exactly, up to f32 rounding), so
 *    the inner loop is a load, a conversion and a fused multiply-add per weight and row;
 *  - the blocked path (many rows): B's panels are packed dequantized (W[j, p] S[j, p / G] as f32),
 *    so the micro-kernel and everything after it is the f32 one; the packing is amortised over
 *    the rows, as the f32 packing is;
 *  - the plain path (a constant n below 8): one dequantized element at a time.
 *
 * The group G and ng are constants of the node (its weight's shape is constant). */
#include "cg_llvm.h"

#include <math.h>

static int64_t q8_group(const IrNode *n) { return n->ia[IR_IA_GROUP]; }
static int64_t q8_ngroups(const IrNode *n) { return n->in[2]->shape[1].c; }

int cg_q8(const IrNode *n) { return n->op == IR_MATMUL_Q8; }

LLVMValueRef cg_q8_weight(CgFn *f, LLVMValueRef j, LLVMValueRef p)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    LLVMValueRef k = cg_i64(cg, n->in[1]->shape[1].c);
    LLVMValueRef w = cg_load(f, IR_I8, f->in[1], LLVMBuildAdd(b, LLVMBuildMul(b, j, k, ""), p, ""));
    LLVMValueRef g = LLVMBuildSDiv(b, p, cg_i64(cg, q8_group(n)), "");
    LLVMValueRef s = cg_load(f, IR_F32, f->in[2], LLVMBuildAdd(b, LLVMBuildMul(b, j, cg_i64(cg, q8_ngroups(n)), ""), g, ""));
    return LLVMBuildFMul(b, LLVMBuildSIToFP(b, w, cg->t_f32, ""), s, "");
}

void cg_q8_gemv_dots(CgFn *f, LLVMValueRef dst, const LLVMValueRef *arow, const LLVMValueRef *crow, int nr,
                     LLVMValueRef brow0, LLVMValueRef k, LLVMValueRef j, int nj)
{
    enum { MAXR = 4, MAXJ = 4 };
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    unsigned fm = LLVMFastMathAllowContract | LLVMFastMathAllowReassoc;
    int64_t group = q8_group(n), ng = q8_ngroups(n);
    LLVMValueRef acc[MAXR][MAXJ], part[MAXR][MAXJ];
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nj; t++) {
            acc[r][t] = cg_var(f, cg->t_f32, cg_f32(cg, 0), "acc");
            part[r][t] = cg_var(f, cg->t_f32, NULL, "part");
        }
    CgLoop lg, lp;
    cg_for(f, &lg, cg_i64(cg, 0), cg_i64(cg, ng), "g");
    LLVMValueRef p0 = LLVMBuildMul(b, lg.iv, cg_i64(cg, group), "");
    LLVMValueRef p1 = cg_min_i64(f, k, LLVMBuildAdd(b, p0, cg_i64(cg, group), ""));
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nj; t++)
            LLVMBuildStore(b, cg_f32(cg, 0), part[r][t]);
    cg_for(f, &lp, p0, p1, "p");
    LLVMValueRef wv[MAXJ], av[MAXR];
    for (int t = 0; t < nj; t++) {
        LLVMValueRef at = LLVMBuildAdd(b, LLVMBuildAdd(b, brow0, LLVMBuildMul(b, cg_i64(cg, t), k, ""), ""), lp.iv, "");
        wv[t] = LLVMBuildSIToFP(b, cg_load(f, IR_I8, f->in[1], at), cg->t_f32, "");
    }
    for (int r = 0; r < nr; r++)
        av[r] = cg_load(f, IR_F32, f->in[0], LLVMBuildAdd(b, arow[r], lp.iv, ""));
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nj; t++) {
            LLVMValueRef prod = cg_fmf(LLVMBuildFMul(b, av[r], wv[t], ""), fm);
            LLVMBuildStore(b, cg_fmf(LLVMBuildFAdd(b, cg_get(f, cg->t_f32, part[r][t]), prod, ""), fm), part[r][t]);
        }
    cg_for_end(f, &lp);
    for (int t = 0; t < nj; t++) { /* the group's sums times its scales */
        LLVMValueRef row = LLVMBuildAdd(b, j, cg_i64(cg, t), "");
        LLVMValueRef s = cg_load(f, IR_F32, f->in[2], LLVMBuildAdd(b, LLVMBuildMul(b, row, cg_i64(cg, ng), ""), lg.iv, ""));
        for (int r = 0; r < nr; r++) {
            LLVMValueRef x = cg_get(f, cg->t_f32, part[r][t]), y = cg_get(f, cg->t_f32, acc[r][t]);
            LLVMBuildStore(b, cg_intrinsic(cg, "llvm.fmuladd", cg->t_f32, (LLVMValueRef[]){x, s, y}, 3), acc[r][t]);
        }
    }
    cg_for_end(f, &lg);
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nj; t++)
            cg_store(f, IR_F32, dst, LLVMBuildAdd(b, crow[r], LLVMBuildAdd(b, j, cg_i64(cg, t), ""), ""),
                     cg_get(f, cg->t_f32, acc[r][t]));
}

void cg_q8_pack(CgFn *f, LLVMValueRef bp, LLVMValueRef pc, LLVMValueRef kc, LLVMValueRef j0, LLVMValueRef nc)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    int nr = cg_gemm_nr(cg);
    int64_t group = q8_group(n), ng = q8_ngroups(n);
    LLVMValueRef k = cg_i64(cg, n->in[1]->shape[1].c), pend = LLVMBuildAdd(b, pc, kc, "");
    CgLoop lj, lg, lp;
    /* the panel's nc columns: rows j0 + j of W, in runs of one group (one scale) */
    cg_for(f, &lj, cg_i64(cg, 0), nc, "j");
    LLVMValueRef wrow = LLVMBuildMul(b, LLVMBuildAdd(b, j0, lj.iv, ""), k, "");
    LLVMValueRef srow = LLVMBuildMul(b, LLVMBuildAdd(b, j0, lj.iv, ""), cg_i64(cg, ng), "");
    LLVMValueRef g0 = LLVMBuildSDiv(b, pc, cg_i64(cg, group), "");
    LLVMValueRef g1 = LLVMBuildSDiv(b, LLVMBuildAdd(b, pend, cg_i64(cg, group - 1), ""), cg_i64(cg, group), "");
    cg_for(f, &lg, g0, g1, "g");
    LLVMValueRef s = cg_load(f, IR_F32, f->in[2], LLVMBuildAdd(b, srow, lg.iv, ""));
    LLVMValueRef lo = cg_max_i64(f, pc, LLVMBuildMul(b, lg.iv, cg_i64(cg, group), ""));
    LLVMValueRef hi = cg_min_i64(f, pend, LLVMBuildMul(b, LLVMBuildAdd(b, lg.iv, cg_i64(cg, 1), ""), cg_i64(cg, group), ""));
    cg_for(f, &lp, lo, hi, "p");
    LLVMValueRef w = cg_load(f, IR_I8, f->in[1], LLVMBuildAdd(b, wrow, lp.iv, ""));
    LLVMValueRef at = LLVMBuildAdd(b, LLVMBuildMul(b, LLVMBuildSub(b, lp.iv, pc, ""), cg_i64(cg, nr), ""), lj.iv, "");
    cg_store(f, IR_F32, bp, at, LLVMBuildFMul(b, LLVMBuildSIToFP(b, w, cg->t_f32, ""), s, ""));
    cg_for_end(f, &lp);
    cg_for_end(f, &lg);
    cg_for_end(f, &lj);
    cg_gemm_pack_zero_tail(f, bp, kc, nc);
}

/* ---- the matrix-vector path in int16 products (AVX512-BW vpmaddwd, fused by VNNI into vpdpwssd) ----
 * Each row of A is split once per call into two int16 parts, a = qs (a16 + alo / Q16_LO) with
 * qs = max|a| / 32767, a16 = rint(a / qs) and alo the remainder rounded (|alo| <= Q16_LO / 2),
 * so that a is kept to about 2^-31 of its largest value, finer than the rounding of the f32 sums
 * the f32 path makes (the attention's few-rows scores split q the same way). A weight row's 32
 * int8 values are then sign-extended to int16 once and multiplied against both parts by two
 * vpdpwssd (two products summed per lane, exact in int32), where widening them to f32 took two
 * sign-extensions, two conversions and two FMAs: half the instructions per weight. The int32 sums
 * of a group are exact while a group has at most Q16_KMAX values (255 steps of 2 products of at
 * most 32767 x 128 a lane), then converted, combined (a16 + alo / Q16_LO) and multiplied by the
 * group's scale in f32; the 16 lanes are summed at the end, times qs. A row holding a NaN or an
 * infinity gets qs = NaN, so its outputs are NaN as the f32 path's would be (or an infinity). */
#define Q16_LO 65534.0
#define Q16_KMAX 8160

int cg_q8_gemv16_fits(const CgFn *f, int64_t k)
{
    int64_t group = q8_group(f->node);
    return f->cg->vec == 16 && cg_has_feature(f->cg, "avx512bw") && k > 0 && k % 32 == 0 && k <= Q16_KMAX &&
           group % 32 == 0;
}

static LLVMValueRef q16_splat(Cg *cg, LLVMValueRef x, unsigned n)
{
    LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(x), n);
    LLVMValueRef v = LLVMBuildInsertElement(cg->b, LLVMGetPoison(vt), x, cg_i32(cg, 0), "");
    return LLVMBuildShuffleVector(cg->b, v, LLVMGetPoison(vt), LLVMConstNull(LLVMVectorType(cg->t_i32, n)), "");
}

void cg_q8_pack_a16(CgFn *f, LLVMValueRef ap, LLVMValueRef qs, LLVMValueRef a, LLVMValueRef src, LLVMValueRef r, int64_t k)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    LLVMTypeRef vt = LLVMVectorType(cg->t_f32, 16), vi = LLVMVectorType(cg->t_i32, 16);
    LLVMTypeRef i16 = LLVMInt16TypeInContext(cg->ctx), v16 = LLVMVectorType(i16, 16), vb = LLVMVectorType(cg->t_i1, 16);
    LLVMValueRef mv = cg_var(f, vt, LLVMConstNull(vt), "amax");
    CgLoop lv;
    cg_for(f, &lv, cg_i64(cg, 0), cg_i64(cg, k / 16), "amax");
    LLVMValueRef x = LLVMBuildLoad2(b, vt, cg_addr(f, IR_F32, a, LLVMBuildAdd(b, src, LLVMBuildMul(b, lv.iv, cg_i64(cg, 16), ""), "")), "");
    LLVMSetAlignment(x, 4);
    x = cg_intrinsic(cg, "llvm.fabs", vt, &x, 1);
    LLVMBuildStore(b, cg_intrinsic(cg, "llvm.maxnum", vt, (LLVMValueRef[]){cg_get(f, vt, mv), x}, 2), mv);
    cg_for_end(f, &lv);
    LLVMValueRef m = cg_get(f, vt, mv);
    m = cg_intrinsic(cg, "llvm.vector.reduce.fmax", vt, &m, 1);
    LLVMValueRef finite = LLVMBuildAnd(b, LLVMBuildFCmp(b, LLVMRealOGT, m, cg_f32(cg, 0), ""),
                                       LLVMBuildFCmp(b, LLVMRealOLT, m, cg_f32(cg, INFINITY), ""), "");
    LLVMValueRef inv = q16_splat(cg, LLVMBuildSelect(b, finite, LLVMBuildFDiv(b, cg_f32(cg, 32767), m, ""), cg_f32(cg, 0), ""), 16);
    LLVMValueRef lov = q16_splat(cg, cg_f32(cg, Q16_LO), 16);
    LLVMValueRef bad = cg_var(f, vb, LLVMConstNull(vb), "abad"); /* lanes that met a NaN (or inf x 0) */
    LLVMValueRef row = LLVMBuildMul(b, r, cg_i64(cg, 2 * k), "");
    cg_for(f, &lv, cg_i64(cg, 0), cg_i64(cg, k / 16), "a16");
    LLVMValueRef at = LLVMBuildMul(b, lv.iv, cg_i64(cg, 16), "");
    x = LLVMBuildLoad2(b, vt, cg_addr(f, IR_F32, a, LLVMBuildAdd(b, src, at, "")), "");
    LLVMSetAlignment(x, 4);
    x = LLVMBuildFMul(b, x, inv, "");
    LLVMValueRef nan = LLVMBuildFCmp(b, LLVMRealUNO, x, x, "");
    LLVMBuildStore(b, LLVMBuildOr(b, cg_get(f, vb, bad), nan, ""), bad);
    x = LLVMBuildSelect(b, nan, LLVMConstNull(vt), x, "");
    LLVMValueRef hi = cg_intrinsic(cg, "llvm.rint", vt, &x, 1);
    LLVMValueRef lo = LLVMBuildFMul(b, LLVMBuildFSub(b, x, hi, ""), lov, "");
    lo = cg_intrinsic(cg, "llvm.rint", vt, &lo, 1);
    LLVMValueRef parts[2] = {hi, lo};
    for (int h = 0; h < 2; h++) {
        LLVMValueRef q = LLVMBuildTrunc(b, LLVMBuildFPToSI(b, parts[h], vi, ""), v16, "");
        LLVMValueRef dst = LLVMBuildAdd(b, row, LLVMBuildAdd(b, at, cg_i64(cg, h * k), ""), "");
        LLVMValueRef s = LLVMBuildStore(b, q, LLVMBuildInBoundsGEP2(b, i16, ap, &dst, 1, ""));
        LLVMSetAlignment(s, 32);
    }
    cg_for_end(f, &lv);
    LLVMValueRef anybad = cg_intrinsic(cg, "llvm.vector.reduce.or", vb, (LLVMValueRef[]){cg_get(f, vb, bad)}, 1);
    LLVMValueRef scale = LLVMBuildSelect(b, anybad, cg_f32(cg, NAN), LLVMBuildFMul(b, m, cg_f32(cg, 1.0 / 32767), ""), "");
    cg_store(f, IR_F32, qs, r, scale);
}

void cg_q8_gemv_dots16(CgFn *f, LLVMValueRef dst, LLVMValueRef ap, LLVMValueRef qs, const LLVMValueRef *crow, int nr,
                       LLVMValueRef brow0, int64_t k, LLVMValueRef j, int nj)
{
    enum { MAXR = 4, MAXJ = 4 };
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    int64_t group = q8_group(n), ng = q8_ngroups(n);
    LLVMTypeRef vt = LLVMVectorType(cg->t_f32, 16), vi = LLVMVectorType(cg->t_i32, 16);
    LLVMTypeRef i16 = LLVMInt16TypeInContext(cg->ctx), w16t = LLVMVectorType(i16, 32), w8t = LLVMVectorType(cg->t_i8, 32);
    int chunk = nr == 1 ? 4 : nr == 2 ? 2 : 1; /* columns a pass: at most 4 rows x columns of accumulators */
    LLVMValueRef inv_lo = q16_splat(cg, cg_f32(cg, 1.0 / Q16_LO), 16);
    for (int t0 = 0; t0 < nj; t0 += chunk) {
        int tn = nj - t0 < chunk ? nj - t0 : chunk;
        LLVMValueRef facc[MAXR][MAXJ], iacc[MAXR][MAXJ][2];
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < tn; t++) {
                facc[r][t] = cg_var(f, vt, LLVMConstNull(vt), "facc");
                for (int h = 0; h < 2; h++)
                    iacc[r][t][h] = cg_var(f, vi, NULL, "iacc");
            }
        CgLoop lg, lq;
        cg_for(f, &lg, cg_i64(cg, 0), cg_i64(cg, ng), "g16");
        LLVMValueRef q0 = LLVMBuildMul(b, lg.iv, cg_i64(cg, group / 32), "");
        LLVMValueRef q1 = cg_min_i64(f, cg_i64(cg, k / 32), LLVMBuildAdd(b, q0, cg_i64(cg, group / 32), ""));
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < tn; t++)
                for (int h = 0; h < 2; h++)
                    LLVMBuildStore(b, LLVMConstNull(vi), iacc[r][t][h]);
        cg_for(f, &lq, q0, q1, "q16");
        LLVMValueRef off = LLVMBuildMul(b, lq.iv, cg_i64(cg, 32), "");
        LLVMValueRef wv[MAXJ], av[MAXR][2];
        for (int t = 0; t < tn; t++) { /* 32 int8 weights of row j + t0 + t, sign-extended to int16 */
            LLVMValueRef at = LLVMBuildAdd(b, LLVMBuildAdd(b, brow0, cg_i64(cg, (t0 + t) * k), ""), off, "");
            LLVMValueRef l = LLVMBuildLoad2(b, w8t, cg_addr(f, IR_I8, f->in[1], at), "");
            LLVMSetAlignment(l, 1);
            wv[t] = LLVMBuildSExt(b, l, w16t, "");
        }
        for (int r = 0; r < nr; r++)
            for (int h = 0; h < 2; h++) {
                LLVMValueRef at = LLVMBuildAdd(b, cg_i64(cg, r * 2 * k + h * k), off, "");
                av[r][h] = LLVMBuildLoad2(b, w16t, LLVMBuildInBoundsGEP2(b, i16, ap, &at, 1, ""), "");
                LLVMSetAlignment(av[r][h], 32);
            }
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < tn; t++)
                for (int h = 0; h < 2; h++) {
                    LLVMValueRef pr = cg_intrinsic_n(cg, "llvm.x86.avx512.pmaddw.d.512", NULL, 0,
                                                     (LLVMValueRef[]){wv[t], av[r][h]}, 2);
                    LLVMBuildStore(b, LLVMBuildAdd(b, cg_get(f, vi, iacc[r][t][h]), pr, ""), iacc[r][t][h]);
                }
        cg_for_end(f, &lq);
        for (int t = 0; t < tn; t++) { /* the group's exact sums, combined and times its scale */
            LLVMValueRef row = LLVMBuildAdd(b, j, cg_i64(cg, t0 + t), "");
            LLVMValueRef s = cg_load(f, IR_F32, f->in[2], LLVMBuildAdd(b, LLVMBuildMul(b, row, cg_i64(cg, ng), ""), lg.iv, ""));
            s = q16_splat(cg, s, 16);
            for (int r = 0; r < nr; r++) {
                LLVMValueRef hi = LLVMBuildSIToFP(b, cg_get(f, vi, iacc[r][t][0]), vt, "");
                LLVMValueRef lo = LLVMBuildSIToFP(b, cg_get(f, vi, iacc[r][t][1]), vt, "");
                LLVMValueRef part = cg_intrinsic(cg, "llvm.fmuladd", vt, (LLVMValueRef[]){lo, inv_lo, hi}, 3);
                LLVMBuildStore(b, cg_intrinsic(cg, "llvm.fmuladd", vt, (LLVMValueRef[]){part, s, cg_get(f, vt, facc[r][t])}, 3),
                               facc[r][t]);
            }
        }
        cg_for_end(f, &lg);
        for (int r = 0; r < nr; r++) {
            LLVMValueRef q = cg_load(f, IR_F32, qs, cg_i64(cg, r));
            for (int t = 0; t < tn; t++) {
                LLVMValueRef args[2] = {cg_f32(cg, -0.0), cg_get(f, vt, facc[r][t])};
                LLVMValueRef sum = cg_fmf(cg_intrinsic(cg, "llvm.vector.reduce.fadd", vt, args, 2), LLVMFastMathAllowReassoc);
                cg_store(f, IR_F32, dst, LLVMBuildAdd(b, crow[r], LLVMBuildAdd(b, j, cg_i64(cg, t0 + t), ""), ""),
                         LLVMBuildFMul(b, sum, q, ""));
            }
        }
    }
}
