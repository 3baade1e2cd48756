/* cg_llvm_attention.h: what the two files of the CPU fused attention kernels share (private to them):
 *   cg_llvm_attention.c       the forward (attention), and the shared helpers below that are functions
 *   cg_llvm_attention_grad.c  the backward (attention_grad)
 * The builder state K with its small builders, the sizes of an attention node (Dims) and its bias
 * and mask operands (ScoreOp). */
#ifndef XTC_CG_LLVM_ATTENTION_H
#define XTC_CG_LLVM_ATTENTION_H

#include <string.h>

#include "cg_llvm.h"

/* ---- small builders ---- */

typedef struct {
    CgFn *f;
    Cg *cg;
    LLVMBuilderRef b;
    int nr, mr;
    LLVMValueRef pack_n, pack_t, micro;
    LLVMTypeRef pack_ty, micro_ty;
} K;

static inline LLVMValueRef ci(K *k, int64_t v) { return cg_i64(k->cg, v); }
static inline LLVMValueRef iadd(K *k, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildAdd(k->b, a, b, ""); }
static inline LLVMValueRef isub(K *k, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildSub(k->b, a, b, ""); }
static inline LLVMValueRef imul(K *k, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildMul(k->b, a, b, ""); }
static inline LLVMValueRef idiv(K *k, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildSDiv(k->b, a, b, ""); }
static inline LLVMValueRef irem(K *k, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildSRem(k->b, a, b, ""); }
static inline LLVMValueRef imin(K *k, LLVMValueRef a, LLVMValueRef b) { return cg_min_i64(k->f, a, b); }
static inline LLVMValueRef imax(K *k, LLVMValueRef a, LLVMValueRef b) { return cg_max_i64(k->f, a, b); }
static inline LLVMValueRef ilt(K *k, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildICmp(k->b, LLVMIntSLT, a, b, ""); }
static inline LLVMValueRef fc(K *k, double v) { return cg_f32(k->cg, v); }
static inline LLVMValueRef f_add(K *k, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFAdd(k->b, a, b, ""); }
static inline LLVMValueRef f_sub(K *k, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFSub(k->b, a, b, ""); }
static inline LLVMValueRef f_mul(K *k, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFMul(k->b, a, b, ""); }
static inline LLVMValueRef ptr(K *k, LLVMValueRef base, LLVMValueRef idx) { return cg_addr(k->f, IR_F32, base, idx); }
static inline LLVMValueRef ld(K *k, LLVMValueRef base, LLVMValueRef idx) { return cg_load(k->f, IR_F32, base, idx); }
static inline void st(K *k, LLVMValueRef base, LLVMValueRef idx, LLVMValueRef v) { cg_store(k->f, IR_F32, base, idx, v); }
static inline LLVMValueRef fget(K *k, LLVMValueRef var) { return cg_get(k->f, k->cg->t_f32, var); }
static inline LLVMValueRef ceil_div(K *k, LLVMValueRef a, int64_t d) { return idiv(k, iadd(k, a, ci(k, d - 1)), ci(k, d)); }
static inline LLVMValueRef ceil_div_v(K *k, LLVMValueRef a, LLVMValueRef d) { return idiv(k, isub(k, iadd(k, a, d), ci(k, 1)), d); }

/* a float array of n elements on the stack, 64-byte aligned */
static inline LLVMValueRef stack_floats(K *k, int64_t n, const char *name)
{
    LLVMValueRef a = cg_var(k->f, LLVMArrayType(k->cg->t_f32, (unsigned)n), NULL, name);
    LLVMSetAlignment(a, 64);
    return a;
}

/* acc += x, reassociable so that the loop vectorises */
static inline void fsum_into(K *k, LLVMValueRef acc, LLVMValueRef x)
{
    LLVMBuildStore(k->b, cg_fmf(LLVMBuildFAdd(k->b, fget(k, acc), x, ""), LLVMFastMathAllowReassoc | LLVMFastMathAllowContract), acc);
}

/* bp = panel of B(pc + p, j0 + j): B(p, j) = src[p ldb + j], or src[j ldb + p] transposed */
static inline void pack(K *k, int transposed, LLVMValueRef bp, LLVMValueRef src, LLVMValueRef ldb, LLVMValueRef pc,
                        LLVMValueRef kc, LLVMValueRef j0, LLVMValueRef nc)
{
    LLVMValueRef args[7] = {bp, src, ldb, pc, kc, j0, nc};
    LLVMBuildCall2(k->b, k->pack_ty, transposed ? k->pack_t : k->pack_n, args, 7, "");
}

/* the builder's fields alone (no GEMM helpers declared): what the work-size functions need */
static inline void cg_att_k_base(K *k, CgFn *f)
{
    memset(k, 0, sizeof *k);
    k->f = f, k->cg = f->cg, k->b = f->cg->b;
}
/* k: the builders of kernel f (the matmul packing functions and micro-kernel included) */
void cg_att_k_init(K *k, CgFn *f);
/* base[0..n) = v */
void cg_att_fill(K *k, LLVMValueRef base, LLVMValueRef n, double v);

/* ---- operands ---- */

/* Sizes of an attention node (or of the forward node behind an attention_grad). */
typedef struct {
    LLVMValueRef nb, I, J;   /* batch (product of the batch dims), queries, keys */
    int D, E;                /* head sizes: constants */
} Dims;

/* d: the sizes of n; -1 (with the error set) unless the head sizes are constants from 1 to
 * CG_LLVM_ATTENTION_MAX_HEAD */
int cg_att_dims_of(K *k, const IrNode *n, Dims *d);

/* A bias or mask operand x, broadcast to the scores [batch.., I, J]: element (bi, i, j) is at
 * base + boff(bi) + i si + j sj, sj being 0 or 1 (known here, so the loops over j vectorise). */
typedef struct {
    int present;        /* 0: the constant "none" (bias 0, mask true) */
    IrDType t;
    const IrNode *x;
    LLVMValueRef base, si;
    int sj;
} ScoreOp;

/* s: operand x (at base) of attention q as a ScoreOp; is_mask: a mask (else a bias) */
void cg_att_score_op(K *k, const IrNode *q, const IrNode *x, LLVMValueRef base, int is_mask, ScoreOp *s);
/* offset of batch index bi (flat over q's batch dims) in s's operand */
LLVMValueRef cg_att_score_batch_offset(K *k, const IrNode *q, const ScoreOp *s, LLVMValueRef bi);
/* address of row i's element j0 (+ c sj) */
LLVMValueRef cg_att_score_row(K *k, const ScoreOp *s, LLVMValueRef boff, LLVMValueRef i, LLVMValueRef j0);
/* the score x at column c of a row: x (+ bias), and in *keep whether it is kept (mask, causal
 * limit lim, and with a window its lower limit lo: NULL without one) */
LLVMValueRef cg_att_score_at(K *k, const ScoreOp *bias, const ScoreOp *mask, LLVMValueRef brow, LLVMValueRef mrow,
                             LLVMValueRef c, LLVMValueRef lo, LLVMValueRef lim, LLVMValueRef x, LLVMValueRef *keep);
/* the scale of batch index bi: operand x at base, a constant or one value per batch and head */
LLVMValueRef cg_att_scale_of(K *k, const IrNode *q, const IrNode *x, LLVMValueRef base, LLVMValueRef bi);

#endif
