/* cg_llvm_gemv16.c: the matrix-vector path (cg_llvm_matmul.c, a few rows of A against a weight
 * stored [n, k], as in decoding one token) for a weight stored in bf16 (--dtype bf16): the dot
 * products read B's bf16 values as they are stored, 32 per vector load, and multiply them by A's
 * rows rounded to bf16 once per work item and packed as pairs (one i32 per two k steps, the lower
 * k in the low half: the layout vdpbf16ps reads). With AVX512_BF16 one vdpbf16ps does 32 products
 * into 16 f32 sums; without it (CG_BF16_SOFT) the pairs are widened by a shift and a mask into two
 * f32 vectors and multiplied by fused multiply-adds (the same exact products). The 16 lanes are
 * summed at the end, so the order of the f32 sums differs from the path that widens B (LLVM's
 * vectorised loop): results agree to the rounding of f32 sums, not bit for bit.
 *
 * Taken where the code has AVX-512 vectors and k is a constant multiple of 32 (every model's
 * width): no remainder, and every load is a whole vector. Weights are read once per token here,
 * so this path moves half the bytes of the f32 one; decoding is bound by those bytes. */
#include "cg_llvm.h"

#include <string.h>

int cg_gemv_bf16_fits(Cg *cg, int64_t k) { return cg->bf16 && cg->vec == 16 && k > 0 && k % 32 == 0; }

void cg_gemv_pack_a(CgFn *f, LLVMValueRef ap, LLVMValueRef a, LLVMValueRef src, int r, int64_t k)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    CgLoop lq;
    cg_for(f, &lq, cg_i64(cg, 0), cg_i64(cg, k / 2), "pq");
    LLVMValueRef p0 = LLVMBuildAdd(b, src, LLVMBuildMul(b, lq.iv, cg_i64(cg, 2), ""), "");
    LLVMValueRef lo = LLVMBuildBitCast(b, cg_bf16_round(cg, cg_load(f, IR_F32, a, p0)), cg->t_i32, "");
    LLVMValueRef hi = LLVMBuildBitCast(b, cg_bf16_round(cg, cg_load(f, IR_F32, a, LLVMBuildAdd(b, p0, cg_i64(cg, 1), ""))),
                                       cg->t_i32, "");
    LLVMValueRef pair = LLVMBuildOr(b, LLVMBuildLShr(b, lo, cg_i32(cg, 16), ""), hi, "");
    cg_store(f, IR_I32, ap, LLVMBuildAdd(b, cg_i64(cg, r * (k / 2)), lq.iv, ""), pair);
    cg_for_end(f, &lq);
}

void cg_gemv_dots_bf16(CgFn *f, LLVMValueRef dst, LLVMValueRef ap, const LLVMValueRef *crow, int nr, LLVMValueRef brow0,
                       int64_t k, LLVMValueRef j, int nj)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    LLVMTypeRef vt = LLVMVectorType(cg->t_f32, 16), vi = LLVMVectorType(cg->t_i32, 16);
    LLVMValueRef acc[4][4];
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nj; t++)
            acc[r][t] = cg_var(f, vt, LLVMConstNull(vt), "acc16");
    LLVMValueRef dp = NULL;
    LLVMTypeRef dpty = NULL, dparg[3];
    if (cg->bf16 == CG_BF16_DPBF16) {
        const char *iname = "llvm.x86.avx512bf16.dpbf16ps.512";
        unsigned id = LLVMLookupIntrinsicID(iname, strlen(iname));
        dp = LLVMGetIntrinsicDeclaration(cg->mod, id, NULL, 0);
        dpty = LLVMIntrinsicGetType(cg->ctx, id, NULL, 0);
        LLVMGetParamTypes(dpty, dparg);
    }
    LLVMValueRef e16[16], emask[16];
    for (int l = 0; l < 16; l++) {
        e16[l] = cg_i32(cg, 16);
        emask[l] = LLVMConstInt(cg->t_i32, 0xffff0000u, 0);
    }
    LLVMValueRef sh = LLVMConstVector(e16, 16), mask = LLVMConstVector(emask, 16);
    CgLoop lq;
    cg_for(f, &lq, cg_i64(cg, 0), cg_i64(cg, k / 32), "q");
    LLVMValueRef bv[4], av[4];
    for (int t = 0; t < nj; t++) { /* 32 bf16 of B row j + t from k step 32 q */
        LLVMValueRef at = LLVMBuildAdd(b, LLVMBuildAdd(b, brow0, cg_i64(cg, t * k), ""),
                                       LLVMBuildMul(b, lq.iv, cg_i64(cg, 32), ""), "");
        bv[t] = LLVMBuildLoad2(b, vi, cg_addr_bf16(f, f->in[1], at), "");
        LLVMSetAlignment(bv[t], 2);
    }
    for (int r = 0; r < nr; r++) {
        LLVMValueRef at = LLVMBuildAdd(b, cg_i64(cg, r * (k / 2)), LLVMBuildMul(b, lq.iv, cg_i64(cg, 16), ""), "");
        av[r] = LLVMBuildLoad2(b, vi, cg_addr(f, IR_I32, ap, at), "");
        LLVMSetAlignment(av[r], 4);
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nj; t++) {
            LLVMValueRef sum = cg_get(f, vt, acc[r][t]);
            if (dp) {
                LLVMValueRef args[3] = {sum, LLVMBuildBitCast(b, av[r], dparg[1], ""), LLVMBuildBitCast(b, bv[t], dparg[2], "")};
                sum = LLVMBuildCall2(b, dpty, dp, args, 3, "");
            } else {
                LLVMValueRef alo = LLVMBuildBitCast(b, LLVMBuildShl(b, av[r], sh, ""), vt, "");
                LLVMValueRef ahi = LLVMBuildBitCast(b, LLVMBuildAnd(b, av[r], mask, ""), vt, "");
                LLVMValueRef blo = LLVMBuildBitCast(b, LLVMBuildShl(b, bv[t], sh, ""), vt, "");
                LLVMValueRef bhi = LLVMBuildBitCast(b, LLVMBuildAnd(b, bv[t], mask, ""), vt, "");
                sum = cg_intrinsic(cg, "llvm.fmuladd", vt, (LLVMValueRef[]){alo, blo, sum}, 3);
                sum = cg_intrinsic(cg, "llvm.fmuladd", vt, (LLVMValueRef[]){ahi, bhi, sum}, 3);
            }
            LLVMBuildStore(b, sum, acc[r][t]);
        }
    cg_for_end(f, &lq);
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nj; t++) {
            LLVMValueRef args[2] = {cg_f32(cg, -0.0), cg_get(f, vt, acc[r][t])};
            LLVMValueRef s = cg_fmf(cg_intrinsic(cg, "llvm.vector.reduce.fadd", vt, args, 2), LLVMFastMathAllowReassoc);
            cg_store(f, IR_F32, dst, LLVMBuildAdd(b, crow[r], LLVMBuildAdd(b, j, cg_i64(cg, t), ""), ""), s);
        }
}
