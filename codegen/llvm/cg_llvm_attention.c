/* cg_llvm_attention.c: the CPU kernels of the fused attention ops (ops.def: attention,
 * attention_grad), FlashAttention-2 style: the n x n scores exist only a tile at a time, on the
 * stack, so the memory beyond the operands and the result is a few hundred KiB per thread
 * whatever the sequence length. The tile products go through the matmul's packing functions and
 * micro-kernel (cg_llvm_matmul.c); the softmax parts are plain loops the vectoriser takes.
 *
 * Forward, one work item = (batch index, group_rt() tiles of BR query rows: up to group_of(), fewer
 * when that leaves a thread of the session fewer than ITEMS_PER_THREAD items); items of one batch
 * index are ordered short, long, short, long ... so that causal work is even across the pool's chunks:
 *   m = -inf, l = 0, O = 0                                          (per row of the group)
 *   for each tile of BC keys (under causal, only up to the group's last allowed key):
 *     pack K^T and V of the tile once, for all the group's query tiles; then for each query tile
 *     that sees any of these keys, over the bc' <= BC of them that its last row sees (under
 *     causal, the keys past that are masked for the whole query tile):
 *     S = Q' K^T                                [BR, bc'] by micro-kernel on the packed K panels
 *     s = S + bias log2(e); -FLT_MAX where masked (mask false, or causal j > i + J - I)
 *     m' = max(m, max s);  P = 2^(s - m');  l = l 2^(m - m') + sum P;  O = O 2^(m - m')
 *     O += P V                                  [BR, E]
 *   out = O / l, and the logsumexp m ln 2 + log l with stats.
 * Q' = Q scale log2(e), computed once per work item, so scores are in units of log2 and the
 * softmax takes 2^x: no multiply per score. Without a bias or a mask (the common case), the
 * score pass is only each row's maximum over the keys it sees, the probability pass writes
 * zeros past them, and each MR rows of a query tile multiply only up to the keys their last row
 * sees, so that the causal diagonal wastes an MR-row triangle, not a BR-row one.
 * A work item of at most FEW_ROWS query rows without a bias or a mask (decoding with a KV cache:
 * one query against the whole cache) computes the two tile products as dot products and sums of
 * v rows read in place: packing K and V for micro-kernel tiles with one real row cost 4 times more.
 * A row with every key masked attends uniformly to all J keys (the -FLT_MAX fill does that in the
 * unfused graph): its m stays -FLT_MAX, and it gets the mean of v instead (keys skipped under
 * causal would otherwise be missing from that mean); its logsumexp is -FLT_MAX.
 * Bounded (cosine-sim attention, the attribute bound = b > 0: |q_i . k_j| <= b, a constant
 * scale s, b s <= IR_ATTENTION_BOUND_MAX): m = b s log2(e) for every row from the start, so the
 * score pass finds no maximum and nothing is rescaled (no alpha, l += sum P, O += P V); each
 * 2^(s - m) >= 2^(-2 b s log2 e) >= 2^-116 stays a normal float, so l = 0 exactly for a row that
 * sees no key, which is how such a row is recognised then. Without a mask, as no row waits for
 * a maximum over the whole tile, each MR rows go from S = Q' K^T to P (2^x without a clamp) to
 * O += P V at once, while their scores are in L1.
 * The backward (attention_grad) is cg_llvm_attention_grad.c; what the two share, cg_llvm_attention.h. */
#include "cg_llvm_attention.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define BR 48   /* forward: query rows per tile */
#define GROUP_MAX 8 /* forward: query tiles per work item, sharing each packed key tile (group_of) */
#define ITEMS_PER_THREAD 4 /* forward: fewer tiles per item until there are this many items a thread */
#define BC 256  /* forward: keys per tile */
#define MAX_HEAD CG_LLVM_ATTENTION_MAX_HEAD /* D and E: constants up to this (the stack tiles are sized by them) */
#define FEW_ROWS 4  /* forward: a work item of at most this many query rows (decoding) and no
                     * bias or mask reads K and V in place instead of packing them */

/* max(a, b) for the vectoriser: maxnum with no-NaN flags (NaN inputs give unspecified rows) */
static LLVMValueRef fmaxv(K *k, LLVMValueRef a, LLVMValueRef b)
{
    LLVMValueRef args[2] = {a, b};
    return cg_fmf(cg_intrinsic(k->cg, "llvm.maxnum", k->cg->t_f32, args, 2), LLVMFastMathNoNaNs | LLVMFastMathNoSignedZeros);
}

/* base[0..n) = v */
void cg_att_fill(K *k, LLVMValueRef base, LLVMValueRef n, double v)
{
    CgLoop l;
    cg_for(k->f, &l, ci(k, 0), n, "z");
    st(k, base, l.iv, fc(k, v));
    cg_for_end(k->f, &l);
}

void cg_att_k_init(K *k, CgFn *f)
{
    cg_att_k_base(k, f);
    k->nr = cg_gemm_nr(f->cg);
    k->mr = cg_gemm_mr(f->cg);
    k->pack_n = cg_gemm_pack(f->cg, 0);
    k->pack_t = cg_gemm_pack(f->cg, 1);
    k->micro = cg_gemm_micro(f->cg);
    k->pack_ty = LLVMGlobalGetValueType(k->pack_n);
    k->micro_ty = LLVMGlobalGetValueType(k->micro);
}

/* C rows r0 .. r0 + mr of C[rows, 0..nc) (+)= A[rows, kc] x panel bp: one micro-kernel call */
static void micro_tile(K *k, LLVMValueRef a, LLVMValueRef lda, LLVMValueRef r0, LLVMValueRef rows, LLVMValueRef mr,
                       LLVMValueRef kc, LLVMValueRef bp, LLVMValueRef c, LLVMValueRef ldc, LLVMValueRef nc, int accumulate)
{
    LLVMValueRef args[11] = {a, lda, r0, isub(k, rows, ci(k, 1)), kc, bp, c, ldc, mr, nc,
                             LLVMConstInt(k->cg->t_i1, (unsigned long long)accumulate, 0)};
    LLVMBuildCall2(k->b, k->micro_ty, k->micro, args, 11, "");
}

/* ---- k and v stored in bf16 (KV caches under CG_STORE_KV_CACHES, CgFn.in_bf16[1] and [2]) ----
 * The forward reads them widened (16 at a time where the loop vectorises: zero-extend, shift,
 * f32 FMA): in place on the few-rows path, packed into the same f32 panels otherwise. Stored as
 * int8 rows (CgFn.in_i8, CG_STORE_INT8_ROWS) they are addressed in bytes (operand_rows) and read
 * sign-extended: the few-rows scores times each key's scale, the output's p times each value
 * row's, the panels dequantized. */

/* the address of element idx of an operand holding f32, or bf16 when b16 */
static LLVMValueRef kv_addr(K *k, int b16, LLVMValueRef base, LLVMValueRef idx)
{
    return b16 ? cg_addr_bf16(k->f, base, idx) : ptr(k, base, idx);
}

/* element idx of such an operand, as f32 */
static LLVMValueRef kv_ld(K *k, int b16, LLVMValueRef base, LLVMValueRef idx)
{
    return b16 ? cg_load_bf16(k->f, base, idx) : ld(k, base, idx);
}

/* pack() from such an operand (st: 0 f32, 1 bf16), or from int8 rows of `width` values and their
 * scales (st CG_STORE_INT8_ROWS, ldb in bytes: the values times their row's scale) */
static void kv_pack(K *k, int kst, int transposed, LLVMValueRef bp, LLVMValueRef src, LLVMValueRef ldb,
                    LLVMValueRef pc, LLVMValueRef kc, LLVMValueRef j0, LLVMValueRef nc, int64_t width)
{
    if (kst == CG_STORE_INT8_ROWS) { /* bp[p nr + j] = x[pc + p, j0 + j], or x[j0 + j, pc + p] transposed */
        CgLoop lr, le;
        cg_for(k->f, &lr, ci(k, 0), transposed ? nc : kc, "prow");
        LLVMValueRef rowp = cg_addr(k->f, IR_I8, src, imul(k, iadd(k, transposed ? j0 : pc, lr.iv), ldb));
        LLVMValueRef sc = cg_i8row_scale(k->f, rowp, width);
        cg_for(k->f, &le, ci(k, 0), transposed ? kc : nc, "pcol");
        LLVMValueRef x = f_mul(k, cg_i8row_q(k->f, rowp, iadd(k, transposed ? pc : j0, le.iv)), sc);
        st(k, bp, transposed ? iadd(k, imul(k, le.iv, ci(k, k->nr)), lr.iv) : iadd(k, imul(k, lr.iv, ci(k, k->nr)), le.iv), x);
        cg_for_end(k->f, &le);
        cg_for_end(k->f, &lr);
        cg_gemm_pack_zero_tail(k->f, bp, kc, nc);
        return;
    }
    if (!kst) {
        pack(k, transposed, bp, src, ldb, pc, kc, j0, nc);
        return;
    }
    LLVMValueRef args[7] = {bp, src, ldb, pc, kc, j0, nc};
    LLVMBuildCall2(k->b, k->pack_ty, cg_gemm_pack_b16(k->cg, transposed), args, 7, "");
}

/* ---- operands ---- */

int cg_att_dims_of(K *k, const IrNode *n, Dims *d)
{
    const IrNode *q = n->in[0], *v = n->in[2], *kk = n->in[1];
    int r = q->rank;
    IrDim D = q->shape[r - 1], E = v->shape[r - 1];
    if (!ir_dim_is_const(D) || !ir_dim_is_const(E) || D.c < 1 || E.c < 1 || D.c > MAX_HEAD || E.c > MAX_HEAD)
        return cg_error(k->cg, "%s %%%s: the CPU kernel needs head sizes that are constants from 1 to %d",
                        ir_ops[n->op].name, n->label ? n->label : "?", MAX_HEAD);
    d->D = (int)D.c;
    d->E = (int)E.c;
    d->nb = cg_dims_prod(k->f, q->shape, 0, r - 2);
    d->I = cg_dim(k->f, q->shape[r - 2]);
    d->J = cg_dim(k->f, kk->shape[r - 2]);
    return 0;
}

static LLVMValueRef x_stride(K *k, const IrNode *x, int d) { return cg_dims_prod(k->f, x->shape, d + 1, x->rank); }

void cg_att_score_op(K *k, const IrNode *q, const IrNode *x, LLVMValueRef base, int is_mask, ScoreOp *s)
{
    memset(s, 0, sizeof *s);
    s->x = x;
    s->t = x->dtype;
    s->base = base;
    s->present = !(x->op == IR_CONST && (is_mask ? x->f != 0 : x->f == 0));
    int r = q->rank, lead = r - x->rank;
    int ki = r - 2 - lead, kj = r - 1 - lead;
    s->si = ki >= 0 && !ir_dim_is_one(x->shape[ki]) ? x_stride(k, x, ki) : ci(k, 0);
    s->sj = kj >= 0 && !ir_dim_is_one(x->shape[kj]);
}

/* offset of batch index bi (flat over q's batch dims) in x */
LLVMValueRef cg_att_score_batch_offset(K *k, const IrNode *q, const ScoreOp *s, LLVMValueRef bi)
{
    int r = q->rank, lead = r - s->x->rank;
    LLVMValueRef off = ci(k, 0), rest = bi;
    for (int d = r - 3; d >= 0; d--) {
        LLVMValueRef size = cg_dim(k->f, q->shape[d]);
        LLVMValueRef idx = d == 0 ? rest : irem(k, rest, size);
        if (d > 0)
            rest = idiv(k, rest, size);
        int kd = d - lead;
        if (kd < 0 || ir_dim_is_one(s->x->shape[kd]))
            continue;
        off = iadd(k, off, imul(k, idx, x_stride(k, s->x, kd)));
    }
    return off;
}

/* address of row i's element j0 (+ c sj) */
LLVMValueRef cg_att_score_row(K *k, const ScoreOp *s, LLVMValueRef boff, LLVMValueRef i, LLVMValueRef j0)
{
    LLVMValueRef off = iadd(k, boff, imul(k, i, s->si));
    if (s->sj)
        off = iadd(k, off, j0);
    return off;
}

/* the score x at column c of a row: x (+ bias), and whether it is kept (mask, causal limit lim,
 * and with a window its lower limit lo: NULL without one) */
LLVMValueRef cg_att_score_at(K *k, const ScoreOp *bias, const ScoreOp *mask, LLVMValueRef brow, LLVMValueRef mrow,
                             LLVMValueRef c, LLVMValueRef lo, LLVMValueRef lim, LLVMValueRef x, LLVMValueRef *keep)
{
    if (bias->present)
        x = f_add(k, x, ld(k, bias->base, bias->sj ? iadd(k, brow, c) : brow));
    *keep = ilt(k, c, lim);
    if (lo)
        *keep = LLVMBuildAnd(k->b, *keep, LLVMBuildICmp(k->b, LLVMIntSGE, c, lo, ""), "");
    if (mask->present) {
        LLVMValueRef mv = cg_load(k->f, IR_BOOL, mask->base, mask->sj ? iadd(k, mrow, c) : mrow);
        *keep = LLVMBuildAnd(k->b, *keep, mv, "");
    }
    return x;
}

/* The scale of batch index bi: a constant, or one value per batch and head (cosine similarity's
 * learned temperature). */
LLVMValueRef cg_att_scale_of(K *k, const IrNode *q, const IrNode *x, LLVMValueRef base, LLVMValueRef bi)
{
    if (x->op == IR_CONST)
        return fc(k, x->f);
    ScoreOp s;
    cg_att_score_op(k, q, x, base, 0, &s);
    return ld(k, base, cg_att_score_batch_offset(k, q, &s, bi));
}

/* Where the matrix of batch index bi (flat over x's batch dims) of an attention operand or result
 * x starts (b16: stored in bf16), with its row stride in *stride: a contiguous [.., rows, width];
 * or, through a head-split view (cg_plan.h, CG_VIEW_*), [b, rows, h, width] read or written in
 * place for x's [b, h, rows, width]: the rows of head h are width floats every h width. */
static LLVMValueRef operand_rows(K *k, const IrNode *x, unsigned view, LLVMValueRef base, int st, LLVMValueRef bi,
                                 LLVMValueRef rows, int64_t width, LLVMValueRef *stride)
{
    int i8 = st == CG_STORE_INT8_ROWS; /* int8 rows: the start and the stride in bytes, width + 4 a row */
    LLVMValueRef w = ci(k, i8 ? width + 4 : width), r0;
    if (!view) {
        *stride = w;
        r0 = imul(k, bi, rows);
    } else {
        LLVMValueRef h = cg_dim(k->f, x->shape[1]); /* views exist for rank 4 only */
        LLVMValueRef b = idiv(k, bi, h), head = irem(k, bi, h);
        *stride = imul(k, h, w);
        r0 = iadd(k, imul(k, imul(k, b, rows), h), head);
    }
    return i8 ? cg_addr(k->f, IR_I8, base, imul(k, r0, w)) : kv_addr(k, st, base, imul(k, r0, w));
}

/* The key/value batch index of query batch index bi: with grouped key/values (k, v with G heads
 * where q has H: ops.def), query head i reads key/value head i mod G. */
static LLVMValueRef kv_batch(K *k, const IrNode *n, LLVMValueRef bi)
{
    int64_t group = ir_attention_kv_group(n);
    if (group == 1)
        return bi;
    int r = n->in[0]->rank;
    int64_t H = n->in[0]->shape[r - 3].c, G = n->in[1]->shape[r - 3].c;
    return iadd(k, imul(k, idiv(k, bi, ci(k, H)), ci(k, G)), irem(k, irem(k, bi, ci(k, H)), ci(k, G)));
}

/* ---- forward ---- */

/* The keys [cb, ce) of the tile that row r of a query tile sees, of bcq computed: under causal
 * up to first_lim + r (first_lim: the keys the tile's first row sees), with a window from
 * first_lo + r. Only without a bias or a mask, where unseen keys need no score. */
static void row_keys(K *k, LLVMValueRef r, LLVMValueRef bcq, LLVMValueRef first_lim, LLVMValueRef first_lo, int causal,
                     LLVMValueRef *cb, LLVMValueRef *ce)
{
    *ce = causal ? imax(k, ci(k, 0), imin(k, bcq, iadd(k, first_lim, r))) : bcq;
    *cb = first_lo ? imin(k, *ce, imax(k, ci(k, 0), iadd(k, first_lo, r))) : ci(k, 0);
}

/* a software prefetch of row `row` of the few-rows path's k or v rows (xst: 0 f32, 1 bf16,
 * CG_STORE_INT8_ROWS; row stride xs in elements, or bytes for int8 rows): each 64-byte line of
 * its width values (and an int8 row's scale), FEW_PREFETCH rows ahead of the one read, so that
 * the stream of rows from L3 or memory overlaps the arithmetic on the rows before. A prefetch
 * never faults: rows past the cache's end are harmless. */
#define FEW_PREFETCH 16
static void few_prefetch(K *k, LLVMValueRef xb, int xst, LLVMValueRef xs, LLVMValueRef row, int width)
{
    Cg *cg = k->cg;
    int x8 = xst == CG_STORE_INT8_ROWS;
    int64_t bytes = x8 ? width + 4 : (int64_t)width * (xst == 1 ? 2 : 4), esz = x8 ? 1 : xst == 1 ? 2 : 4;
    LLVMValueRef off = imul(k, imul(k, row, xs), ci(k, esz));
    for (int64_t o = 0; o < bytes + 63; o += 64) {
        LLVMValueRef at = iadd(k, off, ci(k, o < bytes ? o : bytes - 1));
        LLVMValueRef pa = LLVMBuildGEP2(k->b, cg->t_i8, xb, &at, 1, "pf");
        LLVMValueRef args[4] = {pa, cg_i32(cg, 0), cg_i32(cg, 3), cg_i32(cg, 1)};
        cg_intrinsic(cg, "llvm.prefetch", cg->t_ptr, args, 4);
        if (o >= bytes - 1)
            break;
    }
}

/* ---- the few-rows scores in AVX-512 vectors ----
 * A row's scores S[r, c] = Y_r . x_(j0 + c) for the keys c in [cb, ce), 4 keys at a time: each
 * key's products summed in one 16-lane vector, the four vectors then summed lane-wise together
 * (a shuffle tree: 3.5 operations a key instead of a horizontal sum each). bf16 keys are read 32
 * at a time as 16 pairs and widened by a shift (the even elements) and a mask (the odd ones),
 * against Y's row split into its even and odd elements once per row: the products are the same
 * exact f32 products as the scalar loop's; only the order of the f32 sums differs. */

static LLVMValueRef shuf(K *k, LLVMValueRef a, LLVMValueRef b, const int *idx, int n)
{
    LLVMValueRef m[32];
    for (int i = 0; i < n; i++)
        m[i] = LLVMConstInt(LLVMInt32TypeInContext(k->cg->ctx), (unsigned long long)idx[i], 0);
    return LLVMBuildShuffleVector(k->b, a, b, LLVMConstVector(m, (unsigned)n), "");
}

/* whether few_scores_vec takes a row of width elements (xst: 0 f32, 1 bf16, CG_STORE_INT8_ROWS) */
static int few_scores_vec_fits(const K *k, int xst, int width)
{
    return k->cg->vec == 16 && width > 0 && width <= MAX_HEAD && width % (xst == 1 ? 32 : 16) == 0;
}

/* sum of a 16-lane vector's products for key t of `nk` (1 or 4) into S[si + t] */
static void few_scores_store(K *k, LLVMValueRef *acc, int nk, LLVMValueRef S, LLVMValueRef si)
{
    LLVMTypeRef vt = LLVMVectorType(k->cg->t_f32, 16);
    if (nk == 1) {
        LLVMValueRef args[2] = {fc(k, -0.0), acc[0]};
        st(k, S, si, cg_fmf(cg_intrinsic(k->cg, "llvm.vector.reduce.fadd", vt, args, 2), LLVMFastMathAllowReassoc));
        return;
    }
    int lo[16], hi[16], q0[16], q1[16];
    for (int i = 0; i < 16; i++) { /* halves of a and b side by side: 8 lanes of each */
        lo[i] = i < 8 ? i : 16 + i - 8;
        hi[i] = i < 8 ? 8 + i : 24 + i - 8;
    }
    LLVMValueRef t01 = f_add(k, shuf(k, acc[0], acc[1], lo, 16), shuf(k, acc[0], acc[1], hi, 16));
    LLVMValueRef t23 = f_add(k, shuf(k, acc[2], acc[3], lo, 16), shuf(k, acc[2], acc[3], hi, 16));
    for (int i = 0; i < 16; i++) { /* 4 lanes of each key: key i / 4 */
        int key = i / 4, lane = i % 4; /* keys 0, 1 in t01's halves, 2, 3 in t23's */
        int base = (key % 2) * 8 + (key / 2) * 16;
        q0[i] = base + lane;
        q1[i] = base + 4 + lane;
    }
    LLVMValueRef y = f_add(k, shuf(k, t01, t23, q0, 16), shuf(k, t01, t23, q1, 16));
    int s2[16], s1[16], pick[4] = {0, 4, 8, 12};
    for (int i = 0; i < 16; i++) {
        s2[i] = (i & ~3) | ((i + 2) & 3);
        s1[i] = i ^ 1;
    }
    LLVMValueRef w = f_add(k, y, shuf(k, y, y, s2, 16));
    w = f_add(k, w, shuf(k, w, w, s1, 16));
    LLVMValueRef four = shuf(k, w, w, pick, 4);
    LLVMValueRef stv = LLVMBuildStore(k->b, four, ptr(k, S, si));
    LLVMSetAlignment(stv, 4);
}

/* whether few_scores_vec takes int8 keys of `width` values as int16 products (AVX512-BW's
 * vpmaddwd, which VNNI fuses with the sum into vpdpwssd): the row of q split once into two int16
 * parts, q = qs (q16 + qlo / FEW_I16_LO) with qs = max|q| / 32767, q16 = rint(q / qs) and qlo the
 * remainder rounded (|qlo| <= FEW_I16_LO / 2 < 2^15), so that q is kept to about 2^-31 of its
 * largest value, as close as f32 keeps it; then a key's 64 values in 2 sign-extensions to int16
 * and 4 multiply-adds (the two sums, exact in int32: |q16 k| <= 32767 128, two products a lane,
 * width / 32 of them) and one conversion of each, instead of 4 widenings to int32, 4 conversions
 * and 4 FMAs (the sign-extensions share the shuffle port with the sum tree) */
#define FEW_I16_LO 65534.0
static LLVMValueRef few_splat(K *k, LLVMValueRef x)
{
    LLVMTypeRef vt = LLVMVectorType(k->cg->t_f32, 16);
    LLVMValueRef v = LLVMBuildInsertElement(k->b, LLVMGetPoison(vt), x, cg_i32(k->cg, 0), "");
    return LLVMBuildShuffleVector(k->b, v, LLVMGetPoison(vt), LLVMConstNull(LLVMVectorType(k->cg->t_i32, 16)), "");
}
static int few_scores_i16(const K *k, int width)
{
    return width % 32 == 0 && cg_has_feature(k->cg, "avx512bw");
}

/* S[srow + c] = Y[yrow ..] . x_(j0 + c) for c in [cb, ce): few_rows' scores (few_scores_vec_fits) */
static void few_scores_vec(K *k, LLVMValueRef Y, LLVMValueRef yrow, LLVMValueRef xb, int xst, LLVMValueRef xs,
                           LLVMValueRef j0, LLVMValueRef cb, LLVMValueRef ce, int width, LLVMValueRef S, LLVMValueRef srow)
{
    int x16 = xst == 1, x8 = xst == CG_STORE_INT8_ROWS; /* int8 rows: 16 a load, sign-extended, times the scale */
    CgFn *f = k->f;
    Cg *cg = k->cg;
    LLVMBuilderRef b = k->b;
    LLVMTypeRef vt = LLVMVectorType(cg->t_f32, 16), vi = LLVMVectorType(cg->t_i32, 16);
    int nv = width / 16; /* Y's vectors: f32 keys, one a vector; bf16, an even and an odd one per 32 */
    LLVMValueRef yv[MAX_HEAD / 16];
    for (int v = 0; v < nv; v++) {
        LLVMValueRef l = LLVMBuildLoad2(b, vt, ptr(k, Y, iadd(k, yrow, ci(k, 16 * v))), "");
        LLVMSetAlignment(l, 4);
        yv[v] = l;
    }
    LLVMValueRef sh = NULL, mask = NULL;
    if (x16) {
        int ev[16], od[16];
        for (int i = 0; i < 16; i++)
            ev[i] = 2 * i, od[i] = 2 * i + 1;
        for (int v = 0; v < nv; v += 2) {
            LLVMValueRef a = yv[v], c = yv[v + 1];
            yv[v] = shuf(k, a, c, ev, 16);
            yv[v + 1] = shuf(k, a, c, od, 16);
        }
        LLVMValueRef e16[16], em[16];
        for (int l = 0; l < 16; l++) {
            e16[l] = cg_i32(cg, 16);
            em[l] = LLVMConstInt(cg->t_i32, 0xffff0000u, 0);
        }
        sh = LLVMConstVector(e16, 16), mask = LLVMConstVector(em, 16);
    }
    /* int8 keys against q rounded to int16 (few_scores_i16): q = qs q16, qs = max|q| / 32767 */
    int w16 = x8 && few_scores_i16(k, width);
    LLVMValueRef y16[MAX_HEAD / 32], ylo[MAX_HEAD / 32], qs = NULL;
    LLVMTypeRef vi16 = LLVMVectorType(LLVMInt16TypeInContext(cg->ctx), 32);
    if (w16) {
        LLVMValueRef m = NULL;
        for (int v = 0; v < nv; v++) {
            LLVMValueRef a = cg_intrinsic(cg, "llvm.fabs", vt, &yv[v], 1);
            m = m ? cg_intrinsic(cg, "llvm.maxnum", vt, (LLVMValueRef[]){m, a}, 2) : a;
        }
        m = cg_intrinsic(cg, "llvm.vector.reduce.fmax", vt, &m, 1);
        LLVMValueRef pos = LLVMBuildFCmp(b, LLVMRealOGT, m, fc(k, 0), "");
        qs = f_mul(k, m, fc(k, 1.0 / 32767));
        LLVMValueRef inv = LLVMBuildSelect(b, pos, LLVMBuildFDiv(b, fc(k, 32767), m, ""), fc(k, 0), "");
        LLVMValueRef invv = few_splat(k, inv);
        int cat[32];
        for (int i = 0; i < 32; i++)
            cat[i] = i;
        LLVMValueRef h[2], hl[2], lov = few_splat(k, fc(k, FEW_I16_LO));
        LLVMTypeRef v16 = LLVMVectorType(LLVMInt16TypeInContext(cg->ctx), 16);
        for (int v = 0; v < nv; v++) {
            LLVMValueRef x = f_mul(k, yv[v], invv);
            LLVMValueRef r = cg_intrinsic(cg, "llvm.rint", vt, &x, 1);
            /* the remainder x - r in [-1/2, 1/2], in units of 1 / FEW_I16_LO */
            LLVMValueRef lo = cg_intrinsic(cg, "llvm.rint", vt, (LLVMValueRef[]){f_mul(k, LLVMBuildFSub(b, x, r, ""), lov)}, 1);
            h[v % 2] = LLVMBuildTrunc(b, LLVMBuildFPToSI(b, r, vi, ""), v16, "");
            hl[v % 2] = LLVMBuildTrunc(b, LLVMBuildFPToSI(b, lo, vi, ""), v16, "");
            if (v % 2) {
                y16[v / 2] = shuf(k, h[0], h[1], cat, 32);
                ylo[v / 2] = shuf(k, hl[0], hl[1], cat, 32);
            }
        }
    }
    for (int pass = 0; pass < 2; pass++) { /* 4 keys at a time, then one */
        int nk = pass ? 1 : 4;
        LLVMValueRef n4 = idiv(k, isub(k, ce, cb), ci(k, 4));
        LLVMValueRef from = pass ? iadd(k, cb, imul(k, n4, ci(k, 4))) : ci(k, 0), to = pass ? ce : n4;
        CgLoop lc;
        cg_for(f, &lc, from, to, pass ? "fkey1" : "fkey4");
        LLVMValueRef c = pass ? lc.iv : iadd(k, cb, imul(k, lc.iv, ci(k, 4)));
        LLVMValueRef acc[4];
        for (int t = 0; t < nk; t++) {
            LLVMValueRef xrow = imul(k, iadd(k, j0, iadd(k, c, ci(k, t))), xs);
            few_prefetch(k, xb, xst, xs, iadd(k, j0, iadd(k, c, ci(k, t + FEW_PREFETCH))), width);
            acc[t] = NULL;
            if (w16) { /* 32 keys' values a load, sign-extended to int16; products summed in pairs */
                LLVMValueRef iacc[2] = {NULL, NULL};
                for (int v = 0; v < nv; v += 2) {
                    LLVMValueRef l = LLVMBuildLoad2(b, LLVMVectorType(cg->t_i8, 32), cg_addr(f, IR_I8, xb, iadd(k, xrow, ci(k, 16 * v))), "");
                    LLVMSetAlignment(l, 1);
                    LLVMValueRef k16 = LLVMBuildSExt(b, l, vi16, "");
                    for (int part = 0; part < 2; part++) { /* q16, then the remainder */
                        LLVMValueRef pr = cg_intrinsic_n(cg, "llvm.x86.avx512.pmaddw.d.512", NULL, 0,
                                                         (LLVMValueRef[]){k16, part ? ylo[v / 2] : y16[v / 2]}, 2);
                        iacc[part] = iacc[part] ? LLVMBuildAdd(b, iacc[part], pr, "") : pr;
                    }
                }
                acc[t] = cg_intrinsic(cg, "llvm.fmuladd", vt,
                                      (LLVMValueRef[]){LLVMBuildSIToFP(b, iacc[1], vt, ""), few_splat(k, fc(k, 1.0 / FEW_I16_LO)),
                                                       LLVMBuildSIToFP(b, iacc[0], vt, "")}, 3);
            }
            for (int v = 0; v < nv && !w16; v += x16 ? 2 : 1) {
                LLVMValueRef xv[2];
                if (x8) {
                    LLVMValueRef l = LLVMBuildLoad2(b, LLVMVectorType(cg->t_i8, 16), cg_addr(f, IR_I8, xb, iadd(k, xrow, ci(k, 16 * v))), "");
                    LLVMSetAlignment(l, 1);
                    xv[0] = LLVMBuildSIToFP(b, l, vt, "");
                } else if (x16) {
                    LLVMValueRef l = LLVMBuildLoad2(b, vi, cg_addr_bf16(f, xb, iadd(k, xrow, ci(k, 16 * v))), "");
                    LLVMSetAlignment(l, 2);
                    xv[0] = LLVMBuildBitCast(b, LLVMBuildShl(b, l, sh, ""), vt, "");
                    xv[1] = LLVMBuildBitCast(b, LLVMBuildAnd(b, l, mask, ""), vt, "");
                } else {
                    LLVMValueRef l = LLVMBuildLoad2(b, vt, ptr(k, xb, iadd(k, xrow, ci(k, 16 * v))), "");
                    LLVMSetAlignment(l, 4);
                    xv[0] = l;
                }
                for (int h = 0; h < (x16 ? 2 : 1); h++)
                    acc[t] = acc[t] ? cg_intrinsic(cg, "llvm.fmuladd", vt, (LLVMValueRef[]){yv[v + h], xv[h], acc[t]}, 3)
                                    : f_mul(k, yv[v + h], xv[h]);
            }
            if (x8) { /* (sum q_e y_e) scale */
                LLVMValueRef sc = cg_i8row_scale(f, cg_addr(f, IR_I8, xb, xrow), width);
                if (w16)
                    sc = f_mul(k, sc, qs);
                LLVMValueRef v = LLVMBuildInsertElement(b, LLVMGetPoison(vt), sc, cg_i32(cg, 0), "");
                v = LLVMBuildShuffleVector(b, v, LLVMGetPoison(vt), LLVMConstNull(vi), "");
                acc[t] = f_mul(k, acc[t], v);
            }
        }
        few_scores_store(k, acc, nk, S, iadd(k, srow, c));
        cg_for_end(f, &lc);
    }
}

/* The tile products of a few rows (FEW_ROWS) over the keys each row r sees, the key or value
 * rows x_(j0 + c) read in place (row stride xs; xst: f32, bf16 or int8 rows); Y holds rows of `width` floats:
 *   scores (output 0): S[r, c] = Y_r . x_(j0 + c), Y = the scaled q rows;
 *   output (1):        Y_r += P[r, c] x_(j0 + c), Y = the rows of O. */
static void few_rows(K *k, int output, LLVMValueRef rows, LLVMValueRef xb, int xst, LLVMValueRef xs, LLVMValueRef j0,
                     LLVMValueRef bcq, LLVMValueRef first_lim, LLVMValueRef first_lo, int causal, int width,
                     LLVMValueRef S, LLVMValueRef Y)
{
    CgFn *f = k->f;
    CgLoop lr, lc, le;
    cg_for(f, &lr, ci(k, 0), rows, "frow");
    LLVMValueRef cb, ce;
    row_keys(k, lr.iv, bcq, first_lim, first_lo, causal, &cb, &ce);
    LLVMValueRef yrow = imul(k, lr.iv, ci(k, width)), srow = imul(k, lr.iv, ci(k, BC));
    if (!output && few_scores_vec_fits(k, xst, width)) {
        few_scores_vec(k, Y, yrow, xb, xst, xs, j0, cb, ce, width, S, srow);
        cg_for_end(f, &lr);
        return;
    }
    cg_for(f, &lc, cb, ce, "fkey");
    LLVMValueRef xrow = imul(k, iadd(k, j0, lc.iv), xs), si = iadd(k, srow, lc.iv);
    few_prefetch(k, xb, xst, xs, iadd(k, j0, iadd(k, lc.iv, ci(k, FEW_PREFETCH))), width);
    LLVMValueRef acc = output ? NULL : cg_var(f, k->cg->t_f32, fc(k, 0), "dot"), p = output ? ld(k, S, si) : NULL;
    /* int8 rows (xrow in bytes): S = (Y_r . q) scale, Y_r += (P scale) q */
    int x8 = xst == CG_STORE_INT8_ROWS;
    LLVMValueRef xp = x8 ? cg_addr(f, IR_I8, xb, xrow) : NULL, sc = x8 ? cg_i8row_scale(f, xp, width) : NULL;
    if (x8 && output)
        p = f_mul(k, p, sc);
    cg_for(f, &le, ci(k, 0), ci(k, width), "fe");
    LLVMValueRef yi = iadd(k, yrow, le.iv), x = x8 ? cg_i8row_q(f, xp, le.iv) : kv_ld(k, xst, xb, iadd(k, xrow, le.iv));
    if (output)
        st(k, Y, yi, cg_intrinsic(k->cg, "llvm.fmuladd", k->cg->t_f32, (LLVMValueRef[]){p, x, ld(k, Y, yi)}, 3));
    else
        fsum_into(k, acc, f_mul(k, ld(k, Y, yi), x));
    cg_for_end(f, &le);
    if (!output)
        st(k, S, si, x8 ? f_mul(k, fget(k, acc), sc) : fget(k, acc));
    cg_for_end(f, &lc);
    cg_for_end(f, &lr);
}

/* Query tiles per forward work item: 8 (each packed key tile serves 384 query rows) with heads up
 * to 128, 4 with larger ones, which keeps the item's stack tiles (q scaled and the output rows,
 * GROUP BR D floats each) under about 1 MiB at the largest head, MAX_HEAD. */
static int group_of(const IrNode *n)
{
    const IrNode *q = n->in[0], *v = n->in[2];
    IrDim D = q->shape[q->rank - 1], E = v->shape[v->rank - 1];
    return ir_dim_is_const(D) && ir_dim_is_const(E) && D.c <= 128 && E.c <= 128 ? GROUP_MAX : GROUP_MAX / 2;
}

/* Query tiles per forward work item at run time: group_of(), unless that gives fewer than
 * ITEMS_PER_THREAD items per thread of the session; then as many as give that many items, at
 * least one. Causal items differ in cost, so a thread wants several: GPT's 8 heads of 1024 rows
 * are 24 items of 8 tiles, enough for 2 threads, and 88 items of 2 tiles on 16 (each packed key
 * tile then serves 2 query tiles instead of 8: packing is ~1% of a tile's products either way). */
static LLVMValueRef group_rt(K *k, const IrNode *n, LLVMValueRef nb, LLVMValueRef I)
{
    LLVMValueRef G = ci(k, group_of(n));
    if (!k->f->threads)
        return G;
    LLVMValueRef tiles = imul(k, nb, ceil_div(k, I, BR)), want = imul(k, k->f->threads, ci(k, ITEMS_PER_THREAD));
    LLVMValueRef few = LLVMBuildICmp(k->b, LLVMIntSLT, imul(k, nb, ceil_div(k, I, BR * group_of(n))), want, "");
    LLVMValueRef g = imax(k, ci(k, 1), imin(k, G, LLVMBuildSDiv(k->b, tiles, imax(k, want, ci(k, 1)), "")));
    return LLVMBuildSelect(k->b, few, g, G, "group");
}

/* O[r0 .. r0 + mr, E] += P[.., kstart .. kend] V[kstart .. kend, E]: MR rows of a query tile
 * (P: rows of BC floats; V packed in panels of nr columns, BC keys each; O: rows of E floats) */
static void pv_rows(K *k, LLVMValueRef S, LLVMValueRef VP, LLVMValueRef O, LLVMValueRef r0, LLVMValueRef rows,
                    LLVMValueRef mr, LLVMValueRef kstart, LLVMValueRef kend, int E)
{
    int nr = k->nr;
    for (int e0 = 0; e0 < E; e0 += nr)
        micro_tile(k, ptr(k, S, kstart), ci(k, BC), r0, rows, mr, isub(k, kend, kstart),
                   ptr(k, VP, iadd(k, ci(k, (int64_t)(e0 / nr) * BC * nr), imul(k, kstart, ci(k, nr)))),
                   ptr(k, O, ci(k, e0)), ci(k, E), ci(k, E - e0 < nr ? E - e0 : nr), 1);
}

/* The probabilities of query rows [rbeg, rend) of a tile: P = 2^(S - m) in place of the scores
 * S[r, 0..bcq) (rows of BC floats), zeros past the causal limit and before the window (without
 * a bias or a mask; with one, the score pass put -FLT_MAX there), and each row's sum in SM[r].
 * m is the row's maximum so far (M[sbase + r]), or the bound's constant. */
typedef struct {
    LLVMValueRef S, SM, M, sbase, bcq, i0, off, j0, cBC;
    int plain, causal, bounded;
    int64_t window;
    double mfixed;
} Probs;

static void probs_rows(K *k, const Probs *p, LLVMValueRef rbeg, LLVMValueRef rend)
{
    CgFn *f = k->f;
    CgLoop lr, lc;
    cg_for(f, &lr, rbeg, rend, "row");
    LLVMValueRef srow = imul(k, lr.iv, p->cBC);
    LLVMValueRef m = p->bounded ? fc(k, p->mfixed) : ld(k, p->M, iadd(k, p->sbase, lr.iv));
    LLVMValueRef sum = cg_var(f, k->cg->t_f32, fc(k, 0), "sum");
    LLVMValueRef pend = p->bcq;
    if (p->plain && p->causal) { /* p = 0 past the row's causal limit */
        LLVMValueRef lim_r = isub(k, iadd(k, iadd(k, iadd(k, p->i0, lr.iv), p->off), ci(k, 1)), p->j0);
        pend = imax(k, ci(k, 0), imin(k, lim_r, p->bcq));
        cg_for(f, &lc, pend, p->bcq, "c0");
        st(k, p->S, iadd(k, srow, lc.iv), fc(k, 0));
        cg_for_end(f, &lc);
    }
    LLVMValueRef pbeg = ci(k, 0);
    if (p->plain && p->window) { /* p = 0 before the row's window */
        LLVMValueRef lo_r = isub(k, isub(k, iadd(k, iadd(k, p->i0, lr.iv), p->off), ci(k, p->window)), p->j0);
        pbeg = imin(k, pend, imax(k, ci(k, 0), lo_r));
        cg_for(f, &lc, ci(k, 0), pbeg, "cw");
        st(k, p->S, iadd(k, srow, lc.iv), fc(k, 0));
        cg_for_end(f, &lc);
    }
    cg_for(f, &lc, pbeg, pend, "c");
    LLVMValueRef si = iadd(k, srow, lc.iv);
    LLVMValueRef x = f_sub(k, ld(k, p->S, si), m);
    /* bounded without a mask: every score here is a real one, x >= -116 (ops.def), so 2^x needs
     * no clamp */
    LLVMValueRef pv = p->plain && p->bounded ? cg_exp2_normal(k->cg, x) : cg_exp2_finite(k->cg, x);
    st(k, p->S, si, pv);
    fsum_into(k, sum, pv);
    cg_for_end(f, &lc);
    st(k, p->SM, lr.iv, fget(k, sum));
    cg_for_end(f, &lr);
}

void cg_attention_work(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    K k;
    cg_att_k_base(&k, f);
    const IrNode *n = f->node, *q = n->in[0];
    int r = q->rank;
    LLVMValueRef nb = cg_dims_prod(f, q->shape, 0, r - 2), I = cg_dim(f, q->shape[r - 2]);
    LLVMValueRef J = cg_dim(f, n->in[1]->shape[r - 2]);
    *items = imul(&k, nb, ceil_div_v(&k, I, imul(&k, ci(&k, BR), group_rt(&k, n, nb, I))));
    *cost = imul(&k, imul(&k, nb, I), imul(&k, J, cg_dims_prod(f, q->shape, r - 1, r)));
}

int cg_attention_impl(CgFn *f)
{
    K k;
    cg_att_k_init(&k, f);
    const IrNode *n = f->node, *q = n->in[0];
    Dims d;
    if (cg_att_dims_of(&k, n, &d) < 0)
        return -1;
    int causal = n->ia[IR_IA_CAUSAL] != 0, stats = n->ia[IR_IA_STATS] != 0;
    int64_t window = n->ia[IR_IA_WINDOW];
    /* bounded (cosine-sim attention, ops.def): every score is at most bound x scale, a constant
     * (the verifier checks that the scale is one), taken as each row's maximum from the start */
    int bounded = n->ia[IR_IA_BOUND] > 0;
    double mfixed = bounded ? (double)n->ia[IR_IA_BOUND] * n->in[5]->f * M_LOG2E : 0;
    int D = d.D, E = d.E, nr = k.nr;
    int64_t Eo = E + stats;
    int kpanels = (BC + nr - 1) / nr, epanels = (E + nr - 1) / nr;
    ScoreOp bias, mask;
    cg_att_score_op(&k, q, n->in[3], f->in[3], 0, &bias);
    cg_att_score_op(&k, q, n->in[4], f->in[4], 1, &mask);
    const int GROUP = group_of(n);
    LLVMValueRef S = stack_floats(&k, BR * BC, "S"), O = stack_floats(&k, (int64_t)GROUP * BR * E, "O");
    LLVMValueRef QS = stack_floats(&k, (int64_t)GROUP * BR * D, "qscaled");
    LLVMValueRef M = stack_floats(&k, GROUP * BR, "m"), L = stack_floats(&k, GROUP * BR, "l");
    LLVMValueRef KP = stack_floats(&k, (int64_t)kpanels * D * nr, "kpanels");
    LLVMValueRef VP = stack_floats(&k, (int64_t)epanels * BC * nr, "vpanels");
    LLVMValueRef VMEAN = stack_floats(&k, E, "vmean");
    LLVMValueRef MT = stack_floats(&k, BR, "mtile"), AL = stack_floats(&k, BR, "alpha"), SM = stack_floats(&k, BR, "psum");
    LLVMValueRef neg_max = fc(&k, -FLT_MAX);
    LLVMValueRef nb = cg_dims_prod(f, q->shape, 0, q->rank - 2);
    LLVMValueRef grp_rows = imul(&k, ci(&k, BR), group_rt(&k, n, nb, d.I)); /* <= BR GROUP */
    LLVMValueRef ngroups = ceil_div_v(&k, d.I, grp_rows), off = isub(&k, d.J, d.I);
    LLVMValueRef cD = ci(&k, D), cE = ci(&k, E), cBC = ci(&k, BC);

    CgLoop li;
    cg_for(f, &li, f->lo, f->hi, "item");
    LLVMValueRef bi = idiv(&k, li.iv, ngroups), tz = irem(&k, li.iv, ngroups);
    /* zigzag: 0, T-1, 1, T-2, ... so neighbouring items have complementary causal work */
    LLVMValueRef half = idiv(&k, tz, ci(&k, 2));
    LLVMValueRef odd = LLVMBuildICmp(k.b, LLVMIntNE, irem(&k, tz, ci(&k, 2)), ci(&k, 0), "");
    LLVMValueRef t = LLVMBuildSelect(k.b, odd, isub(&k, isub(&k, ngroups, ci(&k, 1)), half), half, "group");
    LLVMValueRef g0 = imul(&k, t, grp_rows);
    LLVMValueRef grows = imin(&k, grp_rows, isub(&k, d.I, g0));
    LLVMValueRef ntq = ceil_div(&k, grows, BR);
    LLVMValueRef qs, ks, vs, os; /* row strides */
    /* k, v stored in bf16 or as int8 rows (KV caches): 0 f32, 1 bf16, CG_STORE_INT8_ROWS */
    const int kst = f->in_i8[1] ? CG_STORE_INT8_ROWS : f->in_bf16[1], vst = f->in_i8[2] ? CG_STORE_INT8_ROWS : f->in_bf16[2];
    LLVMValueRef kvbi = kv_batch(&k, n, bi);
    LLVMValueRef qb = operand_rows(&k, q, f->views & CG_VIEW_Q, f->in[0], 0, bi, d.I, D, &qs);
    LLVMValueRef kb = operand_rows(&k, n->in[1], f->views & CG_VIEW_K, f->in[1], kst, kvbi, d.J, D, &ks);
    LLVMValueRef vb = operand_rows(&k, n->in[2], f->views & CG_VIEW_V, f->in[2], vst, kvbi, d.J, E, &vs);
    LLVMValueRef ob = operand_rows(&k, q, f->views & CG_VIEW_OUT, f->out, 0, bi, d.I, Eo, &os);
    LLVMValueRef boff = bias.present ? cg_att_score_batch_offset(&k, q, &bias, bi) : ci(&k, 0);
    LLVMValueRef moff = mask.present ? cg_att_score_batch_offset(&k, q, &mask, bi) : ci(&k, 0);
    /* scores in units of log2: Q scale log2(e) K^T (+ bias log2(e)), so that the softmax takes
     * 2^x, and the scale is applied once per query row instead of once per score */
    LLVMValueRef qscale = f_mul(&k, cg_att_scale_of(&k, q, n->in[5], f->in[5], bi), fc(&k, M_LOG2E));
    CgLoop lsq, lsc;
    cg_for(f, &lsq, ci(&k, 0), grows, "qs");
    LLVMValueRef qsrc = imul(&k, iadd(&k, g0, lsq.iv), qs), qdst = imul(&k, lsq.iv, cD);
    cg_for(f, &lsc, ci(&k, 0), cD, "qc");
    st(&k, QS, iadd(&k, qdst, lsc.iv), f_mul(&k, ld(&k, qb, iadd(&k, qsrc, lsc.iv)), qscale));
    cg_for_end(f, &lsc);
    cg_for_end(f, &lsq);
    int plain = !bias.present && !mask.present; /* the common case: no score operand to read */
    LLVMValueRef jend = d.J, jbeg = ci(&k, 0);
    if (causal) /* the group's last row sees keys j <= g0 + grows - 1 + off */
        jend = imax(&k, ci(&k, 0), imin(&k, d.J, iadd(&k, iadd(&k, g0, grows), off)));
    if (window) /* ... and its first row none below g0 + off - window */
        jbeg = imax(&k, ci(&k, 0), isub(&k, iadd(&k, g0, off), ci(&k, window)));
    /* the item's rows only: a one-token call (decoding) would otherwise clear GROUP BR rows of O
     * (up to 100 KB) per head for its one row */
    cg_att_fill(&k, M, grows, bounded ? mfixed : -INFINITY);
    cg_att_fill(&k, L, grows, 0);
    cg_att_fill(&k, O, imul(&k, grows, cE), 0);

    /* a few rows (one token per call with a KV cache): the tile products read K and V in place,
     * each row's scores dot products and its output a sum of v rows, instead of packing every
     * key tile for micro-kernel tiles of which one row is real (few_rows) */
    LLVMValueRef few = plain ? LLVMBuildICmp(k.b, LLVMIntSLE, grows, ci(&k, FEW_ROWS), "few") : LLVMConstInt(k.cg->t_i1, 0, 0);
    CgIf cfew;

    CgLoop lj;
    cg_for(f, &lj, idiv(&k, jbeg, cBC), ceil_div(&k, jend, BC), "ktile");
    LLVMValueRef j0 = imul(&k, lj.iv, cBC);
    LLVMValueRef bc = imin(&k, cBC, isub(&k, jend, j0));
    /* the key tile's K (transposed, nr keys a panel) and V (nr columns a panel), packed once for
     * every query tile of the group */
    cg_if(f, &cfew, LLVMBuildNot(k.b, few, ""));
    CgLoop lp;
    cg_for(f, &lp, ci(&k, 0), ceil_div(&k, bc, nr), "kpanel");
    LLVMValueRef p0 = imul(&k, lp.iv, ci(&k, nr));
    kv_pack(&k, kst, 1, ptr(&k, KP, imul(&k, lp.iv, ci(&k, (int64_t)D * nr))), kb, ks, ci(&k, 0), cD, iadd(&k, j0, p0),
            imin(&k, ci(&k, nr), isub(&k, bc, p0)), D);
    cg_for_end(f, &lp);
    for (int e0 = 0; e0 < E; e0 += nr)
        kv_pack(&k, vst, 0, ptr(&k, VP, ci(&k, (int64_t)(e0 / nr) * BC * nr)), vb, vs, j0, bc, ci(&k, e0),
                ci(&k, E - e0 < nr ? E - e0 : nr), E);
    cg_if_end(f, &cfew);
    CgLoop lq;
    cg_for(f, &lq, ci(&k, 0), ntq, "qtile");
    LLVMValueRef i0 = iadd(&k, g0, imul(&k, lq.iv, ci(&k, BR)));
    LLVMValueRef rows = imin(&k, ci(&k, BR), isub(&k, d.I, i0));
    LLVMValueRef sbase = imul(&k, lq.iv, ci(&k, BR)); /* the tile's rows in M, L, O */
    /* under causal, a query tile whose last row sees none of these keys skips them */
    CgIf sees;
    LLVMValueRef seen = causal ? ilt(&k, j0, iadd(&k, iadd(&k, i0, rows), off)) : LLVMConstInt(k.cg->t_i1, 1, 0);
    if (window) /* ... nor one whose first row's window ends before them */
        seen = LLVMBuildAnd(k.b, seen, ilt(&k, isub(&k, iadd(&k, i0, off), ci(&k, window)), iadd(&k, j0, bc)), "");
    cg_if(f, &sees, seen);
    /* ... and computes only the keys its last row can see: those past it are masked for every
     * row of the tile, and would only add zeros */
    LLVMValueRef bcq = causal ? imin(&k, bc, isub(&k, iadd(&k, iadd(&k, i0, rows), off), j0)) : bc;
    LLVMValueRef qt = ptr(&k, QS, imul(&k, sbase, cD));
    /* S[rows, bcq] = Q K^T, MR rows and a panel of nr keys at a time. Without a bias or a mask,
     * each MR rows compute only the keys their last row sees (tile_keys): under causal the
     * diagonal tile's triangle is then wasted MR rows at a time instead of BR. */
    LLVMValueRef first_lim = isub(&k, iadd(&k, iadd(&k, i0, off), ci(&k, 1)), j0); /* keys row i0 sees */
    /* with a window, the first key row i0 sees (in the tile; the rows below see from later keys) */
    LLVMValueRef first_lo = window ? isub(&k, isub(&k, iadd(&k, i0, off), ci(&k, window)), j0) : NULL;
    if (plain) {
        cg_if(f, &cfew, few);
        few_rows(&k, 0, rows, kb, kst, ks, j0, bcq, first_lim, first_lo, causal, D, S, qt);
        cg_if_end(f, &cfew);
        cg_if(f, &cfew, LLVMBuildNot(k.b, few, ""));
    }
    CgLoop lt;
    cg_for(f, &lt, ci(&k, 0), ceil_div(&k, rows, k.mr), "mtile");
    LLVMValueRef r0 = imul(&k, lt.iv, ci(&k, k.mr)), mr_t = imin(&k, ci(&k, k.mr), isub(&k, rows, r0));
    LLVMValueRef tile_keys = plain && causal
        ? imax(&k, ci(&k, 0), imin(&k, bcq, iadd(&k, first_lim, isub(&k, iadd(&k, r0, mr_t), ci(&k, 1))))) : bcq;
    /* ... and, without a bias or a mask, from the panel of the first key its first row sees */
    LLVMValueRef pstart = plain && window
        ? idiv(&k, imin(&k, tile_keys, imax(&k, ci(&k, 0), iadd(&k, first_lo, r0))), ci(&k, nr)) : ci(&k, 0);
    cg_for(f, &lp, pstart, ceil_div(&k, tile_keys, nr), "kpanel");
    p0 = imul(&k, lp.iv, ci(&k, nr));
    micro_tile(&k, qt, cD, r0, rows, mr_t, cD, ptr(&k, KP, imul(&k, lp.iv, ci(&k, (int64_t)D * nr))), ptr(&k, S, p0),
               cBC, imin(&k, ci(&k, nr), isub(&k, tile_keys, p0)), 0);
    cg_for_end(f, &lp);
    /* bounded, without a bias or a mask: the maximum is known, so these MR rows become
     * probabilities at once, while their scores are in L1 (the general kernel needs every
     * row's maximum over the whole tile first) */
    Probs pr = {.S = S, .SM = SM, .M = M, .sbase = sbase, .bcq = bcq, .i0 = i0, .off = off, .j0 = j0, .cBC = cBC,
                .plain = plain, .causal = causal, .bounded = bounded, .window = window, .mfixed = mfixed};
    if (plain && bounded) { /* ... and are multiplied into O at once too */
        probs_rows(&k, &pr, r0, iadd(&k, r0, mr_t));
        pv_rows(&k, S, VP, ptr(&k, O, imul(&k, sbase, cE)), r0, rows, mr_t, imul(&k, pstart, ci(&k, nr)), tile_keys, E);
    }
    cg_for_end(f, &lt);
    if (plain)
        cg_if_end(f, &cfew);
    /* the online softmax: each row's maximum in the tile (and, with a bias or a mask, the
     * scores: S + bias log2(e), -FLT_MAX where masked), ... */
    CgLoop lr, lc;
    cg_for(f, &lr, ci(&k, 0), rows, "row");
    LLVMValueRef i = iadd(&k, i0, lr.iv);
    LLVMValueRef srow = imul(&k, lr.iv, cBC);
    LLVMValueRef lim = causal ? isub(&k, iadd(&k, iadd(&k, i, off), ci(&k, 1)), j0) : bcq;
    LLVMValueRef lo = window ? isub(&k, isub(&k, iadd(&k, i, off), ci(&k, window)), j0) : NULL;
    LLVMValueRef mt = cg_var(f, k.cg->t_f32, fc(&k, -INFINITY), "mt");
    if (plain && bounded) {
        /* no maximum to find: the bound is the row's */
    } else if (plain) {
        /* the keys past the causal limit (and before the window) are left out here and given
         * p = 0 below */
        LLVMValueRef mend = imax(&k, ci(&k, 0), imin(&k, lim, bcq));
        cg_for(f, &lc, lo ? imin(&k, mend, imax(&k, ci(&k, 0), lo)) : ci(&k, 0), mend, "c");
        LLVMBuildStore(k.b, fmaxv(&k, fget(&k, mt), ld(&k, S, iadd(&k, srow, lc.iv))), mt);
        cg_for_end(f, &lc);
    } else {
        LLVMValueRef brow = bias.present ? cg_att_score_row(&k, &bias, boff, i, j0) : NULL;
        LLVMValueRef mrow = mask.present ? cg_att_score_row(&k, &mask, moff, i, j0) : NULL;
        ScoreOp bias2 = bias; /* the bias read in log2 units */
        cg_for(f, &lc, ci(&k, 0), bcq, "c");
        LLVMValueRef si = iadd(&k, srow, lc.iv), keep;
        LLVMValueRef x = ld(&k, S, si);
        bias2.present = 0;
        x = cg_att_score_at(&k, &bias2, &mask, brow, mrow, lc.iv, lo, lim, x, &keep);
        if (bias.present) {
            LLVMValueRef bv = ld(&k, bias.base, bias.sj ? iadd(&k, brow, lc.iv) : brow);
            x = cg_intrinsic(k.cg, "llvm.fmuladd", k.cg->t_f32, (LLVMValueRef[]){bv, fc(&k, M_LOG2E), x}, 3);
        }
        x = LLVMBuildSelect(k.b, keep, x, neg_max, "");
        st(&k, S, si, x);
        if (!bounded)
            LLVMBuildStore(k.b, fmaxv(&k, fget(&k, mt), x), mt);
        cg_for_end(f, &lc);
    }
    /* a row with keys of the tile masked has -FLT_MAX among its scores: its maximum is at least
     * that (which is how a row with every key masked is recognised at the end) */
    if (!bounded)
        st(&k, MT, lr.iv, fmaxv(&k, fget(&k, mt), neg_max));
    cg_for_end(f, &lr);
    /* ... the new maxima and the rescale factors, a vector of rows at a time, ... */
    LLVMValueRef sr;
    if (!bounded) {
        cg_for(f, &lr, ci(&k, 0), rows, "row");
        sr = iadd(&k, sbase, lr.iv);
        LLVMValueRef mold = ld(&k, M, sr), mnew = fmaxv(&k, mold, ld(&k, MT, lr.iv));
        st(&k, AL, lr.iv, cg_exp2_finite(k.cg, f_sub(&k, mold, mnew)));
        st(&k, M, sr, mnew);
        cg_for_end(f, &lr);
    }
    /* ... the probabilities, row by row (plain and bounded: done above, a micro-tile's rows at a
     * time, but for the few-rows path), ... */
    if (plain && bounded) {
        cg_if(f, &cfew, few);
        probs_rows(&k, &pr, ci(&k, 0), rows);
        cg_if_end(f, &cfew);
    } else {
        probs_rows(&k, &pr, ci(&k, 0), rows);
    }
    /* ... and the sums and outputs so far rescaled (bounded: the maximum never moves, nothing to
     * rescale) */
    cg_for(f, &lr, ci(&k, 0), rows, "row");
    sr = iadd(&k, sbase, lr.iv);
    LLVMValueRef lold = ld(&k, L, sr);
    st(&k, L, sr, f_add(&k, bounded ? lold : f_mul(&k, lold, ld(&k, AL, lr.iv)), ld(&k, SM, lr.iv)));
    cg_for_end(f, &lr);
    if (!bounded) {
        cg_for(f, &lr, ci(&k, 0), rows, "row");
        LLVMValueRef orow = imul(&k, iadd(&k, sbase, lr.iv), cE), alpha = ld(&k, AL, lr.iv);
        cg_for(f, &lc, ci(&k, 0), cE, "e");
        st(&k, O, iadd(&k, orow, lc.iv), f_mul(&k, ld(&k, O, iadd(&k, orow, lc.iv)), alpha));
        cg_for_end(f, &lc);
        cg_for_end(f, &lr);
    }
    /* O[rows, E] += P[rows, bcq] V[j0 .. j0 + bcq, E], MR rows at a time over the keys they see */
    if (plain) {
        cg_if(f, &cfew, few);
        few_rows(&k, 1, rows, vb, vst, vs, j0, bcq, first_lim, first_lo, causal, E, S, ptr(&k, O, imul(&k, sbase, cE)));
        cg_if_end(f, &cfew);
        cg_if(f, &cfew, LLVMBuildNot(k.b, few, ""));
    }
    if (!(plain && bounded)) { /* (plain and bounded: done above, with the probabilities) */
        cg_for(f, &lt, ci(&k, 0), ceil_div(&k, rows, k.mr), "mtile");
        r0 = imul(&k, lt.iv, ci(&k, k.mr)), mr_t = imin(&k, ci(&k, k.mr), isub(&k, rows, r0));
        tile_keys = plain && causal
            ? imax(&k, ci(&k, 0), imin(&k, bcq, iadd(&k, first_lim, isub(&k, iadd(&k, r0, mr_t), ci(&k, 1))))) : bcq;
        LLVMValueRef kstart = plain && window /* the keys from the first panel of QK^T above */
            ? imul(&k, idiv(&k, imin(&k, tile_keys, imax(&k, ci(&k, 0), iadd(&k, first_lo, r0))), ci(&k, nr)), ci(&k, nr)) : ci(&k, 0);
        pv_rows(&k, S, VP, ptr(&k, O, imul(&k, sbase, cE)), r0, rows, mr_t, kstart, tile_keys, E);
        cg_for_end(f, &lt);
    }
    if (plain)
        cg_if_end(f, &cfew);
    cg_if_end(f, &sees);
    cg_for_end(f, &lq);
    cg_for_end(f, &lj);

    /* out = O / l; fully masked rows: the mean of every v row */
    LLVMValueRef have_mean = cg_var(f, k.cg->t_i1, LLVMConstInt(k.cg->t_i1, 0, 0), "have_mean");
    cg_for(f, &lr, ci(&k, 0), grows, "row");
    LLVMValueRef orow_out = imul(&k, iadd(&k, g0, lr.iv), os);
    LLVMValueRef mrow_v = ld(&k, M, lr.iv), lrow = ld(&k, L, lr.iv);
    /* bounded: every key the row sees adds at least 2^-116 to l (the verifier's bound), so
     * l = 0 exactly when it sees none */
    LLVMValueRef full = bounded ? LLVMBuildFCmp(k.b, LLVMRealOLE, lrow, fc(&k, 0), "")
                                : LLVMBuildFCmp(k.b, LLVMRealOLE, mrow_v, neg_max, "");
    LLVMValueRef jpos = LLVMBuildICmp(k.b, LLVMIntSGT, d.J, ci(&k, 0), "");
    CgIf cf, cn, cm;
    cg_if(f, &cf, LLVMBuildAnd(k.b, full, jpos, ""));
    cg_if(f, &cm, LLVMBuildNot(k.b, LLVMBuildLoad2(k.b, k.cg->t_i1, have_mean, ""), ""));
    cg_att_fill(&k, VMEAN, cE, 0);
    CgLoop lk;
    cg_for(f, &lk, ci(&k, 0), d.J, "j");
    LLVMValueRef vrow = imul(&k, lk.iv, vs);
    LLVMValueRef vp8 = vst == CG_STORE_INT8_ROWS ? cg_addr(f, IR_I8, vb, vrow) : NULL;
    LLVMValueRef vsc = vp8 ? cg_i8row_scale(f, vp8, E) : NULL;
    cg_for(f, &lc, ci(&k, 0), cE, "e");
    LLVMValueRef vx = vp8 ? f_mul(&k, cg_i8row_q(f, vp8, lc.iv), vsc) : kv_ld(&k, vst, vb, iadd(&k, vrow, lc.iv));
    st(&k, VMEAN, lc.iv, f_add(&k, ld(&k, VMEAN, lc.iv), vx));
    cg_for_end(f, &lc);
    cg_for_end(f, &lk);
    LLVMValueRef invj = LLVMBuildFDiv(k.b, fc(&k, 1), LLVMBuildSIToFP(k.b, d.J, k.cg->t_f32, ""), "");
    cg_for(f, &lc, ci(&k, 0), cE, "e");
    st(&k, VMEAN, lc.iv, f_mul(&k, ld(&k, VMEAN, lc.iv), invj));
    cg_for_end(f, &lc);
    LLVMBuildStore(k.b, LLVMConstInt(k.cg->t_i1, 1, 0), have_mean);
    cg_if_end(f, &cm);
    cg_for(f, &lc, ci(&k, 0), cE, "e");
    st(&k, ob, iadd(&k, orow_out, lc.iv), ld(&k, VMEAN, lc.iv));
    cg_for_end(f, &lc);
    if (stats)
        st(&k, ob, iadd(&k, orow_out, cE), neg_max);
    cg_if_end(f, &cf);
    cg_if(f, &cn, LLVMBuildNot(k.b, LLVMBuildAnd(k.b, full, jpos, ""), ""));
    /* J = 0: l = 0 gives 0 * inf: write zeros and a logsumexp of -inf instead */
    LLVMValueRef inv = LLVMBuildSelect(k.b, jpos, LLVMBuildFDiv(k.b, fc(&k, 1), lrow, ""), fc(&k, 0), "");
    LLVMValueRef ot = imul(&k, lr.iv, cE);
    cg_for(f, &lc, ci(&k, 0), cE, "e");
    st(&k, ob, iadd(&k, orow_out, lc.iv), f_mul(&k, ld(&k, O, iadd(&k, ot, lc.iv)), inv));
    cg_for_end(f, &lc);
    if (stats) {
        LLVMValueRef lse = cg_intrinsic(k.cg, "llvm.fmuladd", k.cg->t_f32,
                                        (LLVMValueRef[]){mrow_v, fc(&k, M_LN2), cg_intrinsic(k.cg, "llvm.log", k.cg->t_f32, &lrow, 1)}, 3);
        st(&k, ob, iadd(&k, orow_out, cE), LLVMBuildSelect(k.b, jpos, lse, fc(&k, -INFINITY), ""));
    }
    cg_if_end(f, &cn);
    cg_for_end(f, &lr);
    cg_for_end(f, &li);
    return 0;
}

