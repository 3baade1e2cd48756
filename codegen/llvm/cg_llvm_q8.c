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
