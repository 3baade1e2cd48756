/* cg_llvm.h: internals of the LLVM CPU backend, shared by its files:
 *   cg_llvm.c         the backend: kernel template, schedule, module object, optimise, emit, link
 *   cg_llvm_util.c    builder helpers: constants, loops, dims, element loads/stores, math
 *   cg_llvm_ops.c     the per-op lowering table and every op but matmul
 *   cg_llvm_matmul.c  the blocked, vectorised, threaded matrix multiplication
 *   cg_llvm_q8.c      the int8-weight matmul (matmul_q8): how the matmul kernel reads its B
 *   cg_llvm_sort.c    the ops that order each row: kth_largest, entmax15
 *
 * Every kernel is three functions (one set per signature, shared by all steps that have it):
 *   impl(out, in0..in7, syms, lo, hi) -> i32        work items [lo, hi); noalias pointers
 *   body(ctx, lo, hi)                              what the thread pool calls: unpacks ctx
 *   kernel(out, in0..in7, syms, rt) -> i32          counts the work items, then calls impl
 *                                                  directly or through rt->parallel_for
 * An op's lowering supplies the work count and the impl's contents (CgLower). */
#ifndef XTC_CG_LLVM_H
#define XTC_CG_LLVM_H

#include "cg_plan.h"

#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>

typedef struct Cg {
    LLVMContextRef ctx;
    LLVMModuleRef mod;
    LLVMBuilderRef b;
    LLVMTargetMachineRef tm;
    LLVMTargetDataRef td;
    const CgPlan *plan;
    const IrGraph *g;
    char cpu[64];
    char *features;          /* LLVM-owned string */
    char requires[2048];     /* CPU features the code may use, "avx2,fma,..." (cpu_requires) */
    int vec;                 /* f32 lanes of the widest vector: 16 (AVX-512), 8 (AVX2), 4 */
    int has_fma;
    int storage;             /* CgOptions.dtype: 0 f32, 1 bf16 (the matmul weights, CgPlan.storage) */
    int bf16;                /* matmul operands (CgOptions.mma = CG_MMA_BF16): CG_BF16_* */
    int split;               /* the module is one part of several (llvm_render): kernel entries are
                              * hidden external symbols, called from part 0's schedule */
    LLVMTypeRef t_void, t_i1, t_i8, t_i32, t_i64, t_f32, t_f64, t_ptr;
    LLVMTypeRef t_impl, t_body, t_kernel, t_run, t_rtapi;
    char err[1024];
} Cg;

/* Cg.bf16: how a matmul treats its f32 operands. With bf16, both are rounded to bf16 (to nearest,
 * ties to even, as rt_half.h and the interpreter's reference round) and the products summed in f32:
 * by vdpbf16ps (AVX512_BF16) on packed bf16 pairs, or, on CPUs without it, by the same rounding in
 * software and f32 fused multiply-adds of the rounded values (exact products either way, so the
 * two differ only in the order of the f32 sums). Attention kernels stay in f32. */
enum { CG_BF16_OFF, CG_BF16_SOFT, CG_BF16_DPBF16 };

/* The function being emitted and what it can see. */
typedef struct CgFn {
    Cg *cg;
    const IrNode *node;
    LLVMValueRef fn;
    LLVMBasicBlockRef entry;  /* allocas go here */
    LLVMValueRef out, in[IR_MAXIN], syms;
    LLVMValueRef lo, hi;      /* impl: the work items to do */
    LLVMValueRef threads;     /* impl and work: the session's thread count (i64) */
    LLVMValueRef status;      /* impl: i32 variable returned at the end (0 = fine) */
    unsigned views;           /* the kernel's CG_VIEW_* (cg_plan.h) */
    int mm_parts;             /* a matmul under a two-part epilogue (CgMmPart): 2, else 0 */
    uint8_t in_bf16[IR_MAXIN]; /* operand i's buffer holds bf16 (CgPlan.storage: a matmul's B, a
                                * weight under --dtype bf16; a KV cache read by attention or concat,
                                * CG_STORE_KV_CACHES); every other buffer holds its dtype */
    uint8_t out_bf16;          /* the result's buffer holds bf16 (a KV cache written by its concat) */
    uint8_t in_i8[IR_MAXIN];   /* operand i's buffer holds int8 rows with their scales (a KV cache under
                                * --kv-dtype int8, CG_STORE_INT8_ROWS: read by attention or concat) */
    uint8_t out_i8;            /* the result's buffer holds int8 rows (a KV cache written by its concat) */
} CgFn;

typedef struct {
    /* Emits the number of work items and their total cost in elements (which decides whether
     * to use threads). NULL: one item, never threaded. */
    void (*work)(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost);
    /* Emits the work of items [f->lo, f->hi) into f. Returns 0 or -1 with cg->err set. */
    int (*impl)(CgFn *f);
    /* Elementwise ops: one element of the result from its operands' values (compute types:
     * float, i32, i64, and i1 for bool). */
    LLVMValueRef (*scalar)(CgFn *f, LLVMValueRef *args);
} CgLower;

/* cg_llvm.c: a function with the target's attributes (internal linkage if asked), and an enum
 * attribute ("noalias") on it: idx 0 = return value, 1.. = parameters, ~0u = the function. */
LLVMValueRef cg_function(Cg *cg, const char *name, LLVMTypeRef type, int internal);
void cg_attr(Cg *cg, LLVMValueRef fn, unsigned idx, const char *name);

/* cg_llvm_ops.c: the lowering of op, or NULL when the table has no entry for it. */
const CgLower *cg_llvm_lowering(IrOp op);
/* cg_llvm_matmul.c */
void cg_matmul_work(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost);
int cg_matmul_impl(CgFn *f);
/* The same with an epilogue: once a work item's block of the product (rows [i0, i1), columns
 * [j0, j1) of the output, batch index bi) is final, fn emits code that computes the output there
 * from it (a fused program's tail). Where the product is: part p's element at (row i, output
 * column j) is ptr[(i - i0) ld + j - j0] (i64 index arithmetic, so i0 and j0 may lie outside).
 * One part: C itself, rewritten in place. Two (CgFn.mm_parts = 2, the product twice the output's
 * width, GLU): the product's columns j and j + width, computed side by side into a scratch block
 * of the work item (the product is never stored whole). */
typedef struct {
    LLVMValueRef ptr, ld, i0, j0;
} CgMmPart;
typedef struct {
    void (*fn)(CgFn *f, void *ctx, LLVMValueRef bi, LLVMValueRef i0, LLVMValueRef i1, LLVMValueRef j0,
               LLVMValueRef j1, const CgMmPart *parts);
    void *ctx;
} CgMatmulEpilogue;
int cg_matmul_impl_epilogue(CgFn *f, const CgMatmulEpilogue *epi);
/* ... and its building blocks, shared with the fused attention kernels (cg_llvm_attention.c and _grad.c):
 *   pack(bp, b, ldb, pc, kc, j0, nc)   bp[p][j] = B(pc + p, j0 + j), j < nc; zeros up to NR;
 *                                      B(p, j) = b[p ldb + j], or b[j ldb + p] when transposed
 *   micro(a, lda, i0, mlast, kc, bp, c, ldc, mr, nc, accumulate)
 *                                      C[r, 0..nc) (+)= sum_p A[r, p] bp[p, ..] for r < mr, with
 *                                      A rows at a + min(i0 + r, mlast) lda, C rows at c + (i0 + r) ldc
 * NR (packed panel width) and MR (rows of a micro tile) depend on the vector width; kc <= KC. */
#define CG_GEMM_KC 256

/* The attention kernels' bound on the head sizes D and E (their stack tiles are sized by them);
 * cg_llvm_backend advertises it to the passes (CgBackend.attention_max_head). */
#define CG_LLVM_ATTENTION_MAX_HEAD 256
LLVMValueRef cg_gemm_pack(Cg *cg, int transposed);
LLVMValueRef cg_gemm_pack_b16(Cg *cg, int transposed); /* the same from bf16 (widened as packed) */
LLVMValueRef cg_gemm_micro(Cg *cg);
int cg_gemm_nr(Cg *cg);
/* bp[p][j] = 0 for p < kc and nc <= j < NR: a packed panel's columns past B's last */
void cg_gemm_pack_zero_tail(CgFn *f, LLVMValueRef bp, LLVMValueRef kc, LLVMValueRef nc);
/* Transposes vw x vw floats held as vw row vectors of vw lanes, in place, in registers. */
void cg_transpose_vectors(Cg *cg, LLVMValueRef *rows, int vw);
int cg_gemm_mr(Cg *cg);
/* cg_llvm_gemv16.c: the matrix-vector path's dot products against a weight stored in bf16.
 * fits: whether it applies (bf16 operands, AVX-512, k a multiple of 32). pack_a: row r of the
 * scratch ap ([rows][k / 2] i32 pairs) from a[src .. src + k), rounded to bf16. dots: for the nr
 * rows of ap and the nj (<= 4) B rows from element brow0 (stride k), C[crow[r] + j + t]. */
int cg_gemv_bf16_fits(Cg *cg, int64_t k);
void cg_gemv_pack_a(CgFn *f, LLVMValueRef ap, LLVMValueRef a, LLVMValueRef src, int r, int64_t k);
void cg_gemv_dots_bf16(CgFn *f, LLVMValueRef dst, LLVMValueRef ap, const LLVMValueRef *crow, int nr, LLVMValueRef brow0,
                       int64_t k, LLVMValueRef j, int nj);
/* cg_llvm_q8.c: B of a matmul_q8 kernel (f->node), int8 W [n, k] at f->in[1] with scales S at
 * f->in[2], for the paths of cg_llvm_matmul.c: cg_q8 says whether the node is one; cg_q8_weight
 * is B(p, j) = W[j, p] S[j, p / G] as f32; cg_q8_gemv_dots the matrix-vector path's dot products
 * (gemv_dots' contract: nr <= 4 rows of A at arow[r], nj <= 4 weight rows from element brow0,
 * output columns j.., C rows at dst + crow[r]); cg_q8_pack the blocked path's packing
 * (pack's contract: bp[p][jj] = B(pc + p, j0 + jj) for jj < nc, zeros up to NR), emitted in place. */
int cg_q8(const IrNode *n);
LLVMValueRef cg_q8_weight(CgFn *f, LLVMValueRef j, LLVMValueRef p);
void cg_q8_gemv_dots(CgFn *f, LLVMValueRef dst, const LLVMValueRef *arow, const LLVMValueRef *crow, int nr,
                     LLVMValueRef brow0, LLVMValueRef k, LLVMValueRef j, int nj);
void cg_q8_pack(CgFn *f, LLVMValueRef bp, LLVMValueRef pc, LLVMValueRef kc, LLVMValueRef j0, LLVMValueRef nc);
/* ... and the matrix-vector path in int16 products where cg_q8_gemv16_fits (AVX512-BW, k a constant
 * multiple of 32 up to 8160, groups of a multiple of 32): pack_a16 splits row r of A (a[src ..
 * src + k)) into two int16 parts in ap ([rows][2][k] i16, 64-byte aligned) and its scale in qs[r];
 * dots16 has cg_q8_gemv_dots' contract with A read from ap and qs. */
int cg_q8_gemv16_fits(const CgFn *f, int64_t k);
void cg_q8_pack_a16(CgFn *f, LLVMValueRef ap, LLVMValueRef qs, LLVMValueRef a, LLVMValueRef src, LLVMValueRef r, int64_t k);
void cg_q8_gemv_dots16(CgFn *f, LLVMValueRef dst, LLVMValueRef ap, LLVMValueRef qs, const LLVMValueRef *crow, int nr,
                       LLVMValueRef brow0, int64_t k, LLVMValueRef j, int nj);
/* cg_llvm_sort.c: the ops that order a row: kth_largest (radix select), entmax15 (heap sort) */
void cg_kth_largest_work(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost);
int cg_kth_largest_impl(CgFn *f);
void cg_entmax15_work(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost);
int cg_entmax15_impl(CgFn *f);
/* cg_llvm_attention.c, cg_llvm_attention_grad.c: the fused attention ops (forward, backward) */
void cg_attention_work(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost);
int cg_attention_impl(CgFn *f);
void cg_attention_grad_work(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost);
int cg_attention_grad_impl(CgFn *f);
/* cg_llvm_fused.c: the fused op (a program of elementwise ops and row reductions) */
void cg_fused_work(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost);
int cg_fused_impl(CgFn *f);

/* ---- cg_llvm_util.c ---- */

int cg_error(Cg *cg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

LLVMValueRef cg_i64(Cg *cg, int64_t v);
int cg_has_feature(const Cg *cg, const char *f); /* whether the code may use CPU feature f ("avx512bw") */
LLVMValueRef cg_i32(Cg *cg, int32_t v);
LLVMValueRef cg_f32(Cg *cg, double v);
LLVMTypeRef cg_mem_type(Cg *cg, IrDType t);   /* storage: float, i32, i64, i8 */
LLVMTypeRef cg_val_type(Cg *cg, IrDType t);   /* computation: bool is i1 */

/* Value of a symbolic dimension, and products of a shape's dims [from, to). */
LLVMValueRef cg_dim(CgFn *f, IrDim d);
LLVMValueRef cg_dims_prod(CgFn *f, const IrDim *dims, int from, int to);

/* A mutable variable (alloca in the entry block, promoted to a register by the optimiser). */
LLVMValueRef cg_var(CgFn *f, LLVMTypeRef t, LLVMValueRef init, const char *name);
LLVMValueRef cg_get(CgFn *f, LLVMTypeRef t, LLVMValueRef var);

/* for (iv = lo; iv < hi; iv++) { ... }: cg_for opens the body, cg_for_end closes it. */
typedef struct {
    LLVMBasicBlockRef cond, body, exit;
    LLVMValueRef var; /* i64 alloca */
    LLVMValueRef iv;  /* the index, valid inside the body */
} CgLoop;
void cg_for(CgFn *f, CgLoop *l, LLVMValueRef lo, LLVMValueRef hi, const char *name);
void cg_for_end(CgFn *f, CgLoop *l);

/* if (cond) { ... }: cg_if opens, cg_if_end closes. */
typedef struct {
    LLVMBasicBlockRef then, done;
} CgIf;
void cg_if(CgFn *f, CgIf *c, LLVMValueRef cond);
void cg_if_end(CgFn *f, CgIf *c);

/* Elements of a buffer of dtype t: address, load (to compute type), store (from compute type). */
LLVMValueRef cg_addr(CgFn *f, IrDType t, LLVMValueRef base, LLVMValueRef idx);
LLVMValueRef cg_load(CgFn *f, IrDType t, LLVMValueRef base, LLVMValueRef idx);
void cg_store(CgFn *f, IrDType t, LLVMValueRef base, LLVMValueRef idx, LLVMValueRef v);
/* The same for f32 values stored as bf16 (CgFn.in_bf16): the element's address (2 bytes each),
 * and its value widened to f32 (exact: the 16 bits become the upper half). */
LLVMValueRef cg_addr_bf16(CgFn *f, LLVMValueRef base, LLVMValueRef idx);
LLVMValueRef cg_load_bf16(CgFn *f, LLVMValueRef base, LLVMValueRef idx);
/* Stores f32 value v at element idx of a bf16 buffer, rounded to nearest even (cg_bf16_round). */
void cg_store_bf16(CgFn *f, LLVMValueRef base, LLVMValueRef idx, LLVMValueRef v);
/* Int8 rows with their scales (CG_STORE_INT8_ROWS, CgFn.in_i8: rows of D int8 values, then
 * their f32 scale, D + 4 bytes a row): the address of row `row`; the scale of the row at rowp;
 * its value e as f32 without the scale (q); and the quantization of the D f32 values
 * src[soff ..] into the row at rowp (rt_half.h rt_i8_row_quantize: the same f32 operations). */
LLVMValueRef cg_i8row_addr(CgFn *f, LLVMValueRef base, LLVMValueRef row, int64_t D);
LLVMValueRef cg_i8row_scale(CgFn *f, LLVMValueRef rowp, int64_t D);
LLVMValueRef cg_i8row_q(CgFn *f, LLVMValueRef rowp, LLVMValueRef e);
void cg_i8row_quantize(CgFn *f, LLVMValueRef rowp, LLVMValueRef src, LLVMValueRef soff, int64_t D);
/* A vector of n bf16 values (<n x i16>, loaded as such) widened to <n x float>. */
LLVMValueRef cg_widen_bf16(Cg *cg, LLVMValueRef v16, int n);
/* Converts a compute value of dtype from to dtype to (the CAST rules: truncation toward zero,
 * != 0 for bool). */
LLVMValueRef cg_convert(CgFn *f, LLVMValueRef v, IrDType from, IrDType to);
/* status |= 1 when cond holds */
void cg_flag_error(CgFn *f, LLVMValueRef cond);

LLVMValueRef cg_min_i64(CgFn *f, LLVMValueRef a, LLVMValueRef b);
LLVMValueRef cg_max_i64(CgFn *f, LLVMValueRef a, LLVMValueRef b);

/* Calls an overloaded intrinsic ("llvm.fma") on the overload type ty. */
LLVMValueRef cg_intrinsic(Cg *cg, const char *name, LLVMTypeRef ty, LLVMValueRef *args, int nargs);
/* The same with several overload types (llvm.masked.store: the vector and the pointer type). */
LLVMValueRef cg_intrinsic_n(Cg *cg, const char *name, LLVMTypeRef *types, int ntypes, LLVMValueRef *args, int nargs);
/* Calls a libm function of type float(float) ("tanhf"). */
LLVMValueRef cg_libm(Cg *cg, const char *name, LLVMValueRef x);
/* Sets fast-math flags on an instruction (reassociation for reductions, contraction for FMA). */
LLVMValueRef cg_fmf(LLVMValueRef inst, unsigned flags);

/* Vectorisable float math (scalar or vector operands): exp and erf by range reduction and
 * polynomials, accurate to a few ulp (exp) and 2e-7 absolute (erf). NaN propagates. */
LLVMValueRef cg_exp(Cg *cg, LLVMValueRef x);
/* exp(x) for x <= 88 that is not NaN (a NaN gives an unspecified value), 0 below -87 (where exp
 * is below the smallest normal float): about half of cg_exp's instructions, for the online
 * softmax of the attention kernels, whose arguments are scores minus a maximum */
LLVMValueRef cg_exp_finite(Cg *cg, LLVMValueRef x);
/* 2^x under the same terms (x <= 127, not NaN; 0 below -126), a few instructions fewer: the
 * forward attention kernel keeps its scores in units of log2 */
LLVMValueRef cg_exp2_finite(Cg *cg, LLVMValueRef x);
/* 2^x for x in [-126, 127] only (no clamp: below, the result is garbage): the bounded attention's
 * probabilities, whose arguments the bound keeps within [-116, 0] */
LLVMValueRef cg_exp2_normal(Cg *cg, LLVMValueRef x);
LLVMValueRef cg_erf(Cg *cg, LLVMValueRef x);
/* x (float or a vector of floats) rounded to bf16 and widened back: the bits of rt_f32_to_bf16
 * (to nearest, ties to even; a NaN stays a quiet NaN) in the upper half, zeros below */
LLVMValueRef cg_bf16_round(Cg *cg, LLVMValueRef x);
/* maximum with NaN propagation, like torch.maximum */
LLVMValueRef cg_fmax(Cg *cg, LLVMValueRef a, LLVMValueRef b);
LLVMValueRef cg_fmin(Cg *cg, LLVMValueRef a, LLVMValueRef b);

#endif
