/* cg_llvm_matmul.c: matrix multiplication, C[.., m, n] = A[.., m, k] x B[.., k, n] (or B given
 * as [.., n, k] with transpose_b), batch dimensions broadcast. Generated, not a BLAS call.
 *
 * The blocked path (every n but tiny constant ones), for VW float lanes (16 with AVX-512):
 *
 *   work item = (batch, block of rows, block of NC columns): the thread pool splits these.
 *   Every row block packs the same B panels again, so rows are split only when there are fewer
 *   (batch, column block) pairs to share out than MIN_ITEMS or the session's threads
 *   (rows_per_block() below).
 *   for each k block of KC:
 *     for each panel of NR = 2 VW columns in the item:
 *       pack B[k block, panel] into bp[panel][KC][NR], contiguous and zero-padded past n (the
 *       item's NC / NR panels, 256 KiB with AVX-512, stay in L2); a transposed B (weights stored
 *       [n, k]) is packed VW x VW blocks at a time through an in-register transpose, not element
 *       by element (which vectorises to scatters)
 *     for each block of MC rows of the item (its MC x KC slice of A stays in L2 across the panels):
 *       for each panel:
 *         for each MR rows of the block:
 *           micro-kernel: MR x NR accumulators in vector registers (MR x 2 vectors), one k step
 *           is 2 vector loads of bp, MR broadcasts of A, 2 MR fused multiply-adds; then
 *           C tile (+)= accumulators, with masked loads/stores on the last, partial panel (the
 *           tile's lines prefetched before the call, so that they arrive during its k loop)
 *
 * Without the MC blocks, every panel streamed the item's whole m x KC slice of A: 1 MiB at
 * m = 1024, as large as this CPU's L2, so it came from the shared L3 once per panel, and the
 * kernel slowed down whenever other processes loaded the L3 (the "cliff" at m = 1024).
 * The rows past m in the last row block are computed from a repeated last row and not stored, so
 * the micro-kernel has no row remainder code. A is read in place; only B is packed. The pack and
 * micro-kernel functions are generated once per module and shared by every matmul kernel.
 *
 * Tiny outputs (a constant n below VW) use the plain path: one item per output row, inner loop
 * over contiguous memory, left to LLVM's vectoriser. A few rows against a transposed B (batch x
 * m <= GEMV_ROWS: decoding one token with a KV cache) take the matrix-vector path, chosen at run
 * time: dot products over contiguous rows of B, which read each weight once, for all the rows
 * of A at once (gemv_case, gemv_items). */
#include "cg_llvm.h"

#include <string.h>

#define KC 256       /* k block: a packed panel is KC x NR floats (32 KiB with AVX-512) */
#define MIN_ITEMS 4  /* work items wanted before rows are split too (or one per thread, if more) */
#define MC 192       /* rows of A per L2 block: MC x KC floats (192 KiB), a multiple of MR (12 or 6) */
#define PREFETCH_C (256 * 1024) /* an item's C block past this many floats (1 MiB): its tiles prefetched */
#define GEMV_ROWS 4  /* batch x m up to this, with B transposed: the matrix-vector path */
#define GEMV_COLS 16 /* output columns (rows of the stored B) per work item of that path */
#define GEMV_UNROLL 4 /* ... computed this many at a time */
#define GEMV_PREROUND_K 8192 /* bf16 operands: A's rows rounded once per item up to this k (128 KiB) */

typedef struct {
    LLVMValueRef m, n, k, batch;
    LLVMValueRef w; /* the output's columns: n, or n / 2 under a two-part epilogue */
    int split;      /* that epilogue: the item's columns j and j + w of the product, side by side */
    int at;         /* A read through the transposed view (CG_VIEW_A_T): wider items (item_cols) */
} MmDims;

static void mm_dims(CgFn *f, MmDims *d)
{
    const IrNode *out = f->node, *a = f->node->in[0];
    int r = out->rank;
    d->m = cg_dim(f, out->shape[r - 2]);
    d->n = cg_dim(f, out->shape[r - 1]);
    d->k = cg_dim(f, a->shape[a->rank - 1]);
    d->batch = cg_dims_prod(f, out->shape, 0, r - 2);
    if (f->views & CG_VIEW_SUM_B) { /* the batch summed: one product over the batches' k rows (cg_plan.h) */
        d->k = LLVMBuildMul(f->cg->b, d->k, d->batch, "k");
        d->batch = cg_i64(f->cg, 1);
    }
    d->split = f->mm_parts == 2;
    d->at = (f->views & CG_VIEW_A_T) != 0;
    d->w = d->split ? LLVMBuildSDiv(f->cg->b, d->n, cg_i64(f->cg, 2), "w") : d->n;
}

static int lanes(Cg *cg) { return cg->vec >= 16 ? 16 : cg->vec >= 8 ? 8 : 4; }
static int tile_rows(Cg *cg) { return lanes(cg) == 16 ? 12 : 6; }  /* MR: 2 MR accumulators + 3 live */
static int col_block(Cg *cg) { return 2 * lanes(cg) * 8; }          /* NC: 8 panels */
/* an item's output columns: NC, or NC / 2 of each half of a split product (the same panels); with
 * A read through the transposed view (the weights' gradients), 2 NC: each item packs A^T's tiles
 * again on every k block, so half the items pack them half as often (B's panels, 512 KiB, and
 * the A^T tiles, 192 KiB, still fit a 1 MiB L2; 1-thread CPU time in % of OpenBLAS on GPT-M's
 * four weight-gradient shapes went from 84-88 to 89-94 on an AMD EPYC, bench/RESULTS.md) */
static int item_cols(Cg *cg, const MmDims *d) { return d->split ? col_block(cg) / 2 : d->at ? 2 * col_block(cg) : col_block(cg); }

static int plain_path(const IrNode *n)
{
    IrDim cols = n->shape[n->rank - 1];
    return ir_dim_is_const(cols) && cols.c < 8;
}

static LLVMValueRef ceil_div(Cg *cg, LLVMValueRef a, int64_t b)
{
    return LLVMBuildSDiv(cg->b, LLVMBuildAdd(cg->b, a, cg_i64(cg, b - 1), ""), cg_i64(cg, b), "");
}

/* Rows per row block: all of m, unless batch x column blocks gives fewer items than wanted,
 * MIN_ITEMS or one per thread if there are more threads; then m is split into up to wanted /
 * items blocks of at least 4 tiles, a multiple of MR. Each row block packs its B panels again,
 * so rows are split no more than the threads need: with 16 threads, a 512-wide product of 1024
 * rows is 16 items of 128 rows (4 items of 512 rows left 12 threads idle). */
static LLVMValueRef rows_per_block(CgFn *f, const MmDims *d, LLVMValueRef ngrp)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    int mr = tile_rows(cg);
    LLVMValueRef pairs = LLVMBuildMul(b, d->batch, ngrp, "");
    LLVMValueRef items = f->threads ? cg_max_i64(f, cg_i64(cg, MIN_ITEMS), f->threads) : cg_i64(cg, MIN_ITEMS);
    LLVMValueRef want = LLVMBuildSDiv(b, LLVMBuildAdd(b, LLVMBuildSub(b, items, cg_i64(cg, 1), ""), pairs, ""),
                                      cg_max_i64(f, pairs, cg_i64(cg, 1)), "");
    want = cg_min_i64(f, want, cg_max_i64(f, ceil_div(cg, d->m, 4 * mr), cg_i64(cg, 1)));
    LLVMValueRef rows = LLVMBuildSDiv(b, LLVMBuildAdd(b, d->m, LLVMBuildSub(b, want, cg_i64(cg, 1), ""), ""), want, "");
    rows = LLVMBuildMul(b, ceil_div(cg, rows, mr), cg_i64(cg, mr), "");
    rows = cg_max_i64(f, rows, cg_i64(cg, mr));
    /* a split product's item is computed into a scratch block of MC rows (matmul_impl) */
    return d->split ? cg_min_i64(f, rows, cg_i64(cg, MC)) : rows;
}

/* The matrix-vector path: batch x m <= GEMV_ROWS (one token per sequence, as in KV-cache
 * decoding) with B stored [n, k] (every weight). Packing B for a 12-row micro-kernel that
 * would compute one real row made such a step cost several times the time it takes to read the
 * weights once; here each output is a dot product of an A row with a contiguous B row, so the
 * weights stream from memory once, at the bandwidth the cores get. */
static LLVMValueRef gemv_case(CgFn *f, const MmDims *d)
{
    LLVMBuilderRef b = f->cg->b;
    return LLVMBuildICmp(b, LLVMIntSLE, LLVMBuildMul(b, d->batch, d->m, ""), cg_i64(f->cg, GEMV_ROWS), "gemv");
}

static LLVMValueRef gemv_item_count(CgFn *f, const MmDims *d);

void cg_matmul_work(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    MmDims d;
    mm_dims(f, &d);
    *cost = LLVMBuildMul(b, LLVMBuildMul(b, d.batch, d.m, ""), LLVMBuildMul(b, d.n, d.k, ""), "");
    if (plain_path(f->node)) {
        *items = LLVMBuildMul(b, d.batch, d.m, "");
        return;
    }
    LLVMValueRef ngrp = ceil_div(cg, d.w, item_cols(cg, &d));
    LLVMValueRef rows = rows_per_block(f, &d, ngrp);
    LLVMValueRef nmb = LLVMBuildSDiv(b, LLVMBuildAdd(b, d.m, LLVMBuildSub(b, rows, cg_i64(cg, 1), ""), ""), rows, "");
    *items = LLVMBuildMul(b, d.batch, LLVMBuildMul(b, nmb, ngrp, ""), "items");
    if (f->node->ia[IR_IA_TRANSPOSE_B]) /* B transposed: a few rows go the matrix-vector path */
        *items = LLVMBuildSelect(b, gemv_case(f, &d), gemv_item_count(f, &d), *items, "");
}

/* Element offset of batch index bi (a flat index over the output's batch dims) in operand x,
 * whose matrices have mat elements each; broadcast dims do not move. */
static LLVMValueRef batch_offset(CgFn *f, const IrNode *x, LLVMValueRef bi, LLVMValueRef mat)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *out = f->node;
    int r = out->rank, lead = r - x->rank;
    LLVMValueRef off = cg_i64(cg, 0), stride = mat, rest = bi;
    for (int d = r - 3; d >= 0; d--) {
        LLVMValueRef size = cg_dim(f, out->shape[d]);
        LLVMValueRef idx = d == 0 ? rest : LLVMBuildSRem(b, rest, size, "");
        if (d > 0)
            rest = LLVMBuildSDiv(b, rest, size, "");
        int k = d - lead;
        if (k < 0 || ir_dim_is_one(x->shape[k]))
            continue;
        off = LLVMBuildAdd(b, off, LLVMBuildMul(b, idx, stride, ""), "");
        stride = LLVMBuildMul(b, stride, cg_dim(f, x->shape[k]), "");
    }
    return off;
}

/* Element idx of B, f32 or stored as bf16 (a weight under --dtype bf16: CgFn.in_bf16). */
static LLVMValueRef load_b(CgFn *f, LLVMValueRef idx)
{
    return f->in_bf16[1] ? cg_load_bf16(f, f->in[1], idx) : cg_load(f, IR_F32, f->in[1], idx);
}

/* ---- the plain path ---- */

static int plain_impl(CgFn *f, const CgMatmulEpilogue *epi)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    int tb = n->ia[IR_IA_TRANSPOSE_B] != 0, at = (f->views & CG_VIEW_A_T) != 0;
    MmDims d;
    mm_dims(f, &d);
    LLVMValueRef mk = LLVMBuildMul(b, d.m, d.k, ""), kn = LLVMBuildMul(b, d.k, d.n, "");
    unsigned fm = LLVMFastMathAllowContract | LLVMFastMathAllowReassoc;
    CgLoop l, lj, lp;
    cg_for(f, &l, f->lo, f->hi, "row");
    LLVMValueRef bi = LLVMBuildSDiv(b, l.iv, d.m, "");
    LLVMValueRef i = LLVMBuildSRem(b, l.iv, d.m, "");
    /* A(i, p) at i k + p, or through the transposed view (CG_VIEW_A_T) at p m + i */
    LLVMValueRef abase = LLVMBuildAdd(b, batch_offset(f, n->in[0], bi, mk), at ? i : LLVMBuildMul(b, i, d.k, ""), "");
    LLVMValueRef bbase = batch_offset(f, n->in[1], bi, kn);
    /* a split product's row (n < 8 here) goes to a row of scratch, C's row is the epilogue's */
    LLVMValueRef dst = d.split ? cg_var(f, LLVMArrayType(cg->t_f32, 8), NULL, "prow") : f->out;
    LLVMValueRef cbase = d.split ? cg_i64(cg, 0) : LLVMBuildMul(b, l.iv, d.n, "");
    cg_for(f, &lj, cg_i64(cg, 0), d.n, "j");
    LLVMValueRef acc = cg_var(f, cg->t_f32, cg_f32(cg, 0), "acc");
    cg_for(f, &lp, cg_i64(cg, 0), d.k, "p");
    LLVMValueRef bidx = tb ? LLVMBuildAdd(b, LLVMBuildMul(b, lj.iv, d.k, ""), lp.iv, "")
                           : LLVMBuildAdd(b, LLVMBuildMul(b, lp.iv, d.n, ""), lj.iv, "");
    LLVMValueRef av = cg_load(f, IR_F32, f->in[0], LLVMBuildAdd(b, abase, at ? LLVMBuildMul(b, lp.iv, d.m, "") : lp.iv, ""));
    LLVMValueRef bv = cg_q8(n) ? cg_q8_weight(f, lj.iv, lp.iv) : load_b(f, LLVMBuildAdd(b, bbase, bidx, ""));
    if (cg->bf16) { /* bf16 operands, rounded as they are read */
        av = cg_bf16_round(cg, av);
        bv = cg_bf16_round(cg, bv);
    }
    LLVMValueRef prod = cg_fmf(LLVMBuildFMul(b, av, bv, ""), fm);
    LLVMBuildStore(b, cg_fmf(LLVMBuildFAdd(b, cg_get(f, cg->t_f32, acc), prod, ""), fm), acc);
    cg_for_end(f, &lp);
    cg_store(f, IR_F32, dst, LLVMBuildAdd(b, cbase, lj.iv, ""), cg_get(f, cg->t_f32, acc));
    cg_for_end(f, &lj);
    if (epi) { /* the row is final */
        CgMmPart parts[2] = {{f->out, d.n, LLVMBuildNeg(b, LLVMBuildMul(b, bi, d.m, ""), ""), cg_i64(cg, 0)}};
        if (d.split)
            for (int p = 0; p < 2; p++)
                parts[p] = (CgMmPart){dst, cg_i64(cg, 0), i, LLVMBuildMul(b, cg_i64(cg, -p), d.w, "")};
        epi->fn(f, epi->ctx, bi, i, LLVMBuildAdd(b, i, cg_i64(cg, 1), ""), cg_i64(cg, 0), d.w, parts);
    }
    cg_for_end(f, &l);
    return 0;
}

/* ---- the matrix-vector path (gemv_case) ---- */

/* Whether B is one matrix for every batch index (a weight): the matrix-vector path then computes
 * all batch x m rows of A against each block of B rows in one work item. */
static int b_broadcast(const IrNode *n)
{
    const IrNode *x = n->in[1];
    for (int d = 0; d < x->rank - 2; d++)
        if (!ir_dim_is_one(x->shape[d]))
            return 0;
    return 1;
}

/* C[row r, j .. j + nj) for the nr rows of A at arow[r] (C rows at dst + crow[r]) and nj = GEMV_UNROLL
 * or 1 consecutive B rows from brow0: nr x nj dot products in one loop over k, so that each
 * element of B is loaded once for all the rows and the vectoriser keeps nr x nj independent
 * accumulators (one alone is a chain of dependent fused multiply-adds, latency-bound). */
static void gemv_dots(CgFn *f, LLVMValueRef dst, LLVMValueRef a, int a_rounded, const LLVMValueRef *arow,
                      const LLVMValueRef *crow, int nr, LLVMValueRef brow0, LLVMValueRef k, LLVMValueRef j, int nj)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    unsigned fm = LLVMFastMathAllowContract | LLVMFastMathAllowReassoc;
    LLVMValueRef acc[GEMV_ROWS][GEMV_UNROLL];
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nj; t++)
            acc[r][t] = cg_var(f, cg->t_f32, cg_f32(cg, 0), "acc");
    CgLoop lp;
    cg_for(f, &lp, cg_i64(cg, 0), k, "p");
    LLVMValueRef bv[GEMV_UNROLL], av[GEMV_ROWS];
    for (int t = 0; t < nj; t++) {
        LLVMValueRef bidx = LLVMBuildAdd(b, LLVMBuildAdd(b, brow0, LLVMBuildMul(b, cg_i64(cg, t), k, ""), ""), lp.iv, "");
        bv[t] = load_b(f, bidx);
        if (cg->bf16)
            bv[t] = cg_bf16_round(cg, bv[t]);
    }
    for (int r = 0; r < nr; r++) {
        av[r] = cg_load(f, IR_F32, a, LLVMBuildAdd(b, arow[r], lp.iv, ""));
        if (cg->bf16 && !a_rounded)
            av[r] = cg_bf16_round(cg, av[r]);
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nj; t++) {
            LLVMValueRef prod = cg_fmf(LLVMBuildFMul(b, av[r], bv[t], ""), fm);
            LLVMBuildStore(b, cg_fmf(LLVMBuildFAdd(b, cg_get(f, cg->t_f32, acc[r][t]), prod, ""), fm), acc[r][t]);
        }
    cg_for_end(f, &lp);
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nj; t++)
            cg_store(f, IR_F32, dst, LLVMBuildAdd(b, crow[r], LLVMBuildAdd(b, j, cg_i64(cg, t), ""), ""),
                     cg_get(f, cg->t_f32, acc[r][t]));
}

/* Work items of the matrix-vector path: one per block of GEMV_COLS B rows (times the batch when
 * B differs per batch index). */
static LLVMValueRef gemv_item_count(CgFn *f, const MmDims *d)
{
    LLVMBuilderRef b = f->cg->b;
    LLVMValueRef blocks = ceil_div(f->cg, d->w, GEMV_COLS);
    return b_broadcast(f->node) ? blocks : LLVMBuildMul(b, d->batch, blocks, "");
}

/* Items [lo, hi): C[bi, i, j] = A[bi, i, :] . B[bi, j, :] for the item's block of B rows j and
 * its rows of A: every (bi, i) when B is a weight (batch x m <= GEMV_ROWS rows, each B element
 * loaded once for all of them), else the m rows of one batch index (items column block major, so
 * that neighbouring items share their B rows). GEMV_UNROLL columns at a time; the code is
 * generated for each row count up to GEMV_ROWS and chosen at run time. A split product's item
 * computes its block of both halves (B rows j and j + w) into a scratch block for the epilogue. */
static void gemv_items(CgFn *f, const CgMatmulEpilogue *epi, const MmDims *d)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    int shared = b_broadcast(n);
    LLVMValueRef mk = LLVMBuildMul(b, d->m, d->k, ""), kn = LLVMBuildMul(b, d->k, d->n, ""), mn = LLVMBuildMul(b, d->m, d->n, "");
    LLVMValueRef nbi = shared ? d->batch : cg_i64(cg, 1); /* batch indices in an item */
    LLVMValueRef rows = LLVMBuildMul(b, nbi, d->m, "rows");
    /* int8 weights (always one weight for every row: shared): the rows of A split into int16
     * parts once per call, before the items, for the int16 dot products (cg_llvm_q8.c) */
    const IrNode *an = n->in[0];
    IrDim kd = an->shape[an->rank - 1];
    int q8 = cg_q8(n); /* int8 weights: cg_llvm_q8.c (never with bf16 operands) */
    int q16 = q8 && shared && ir_dim_is_const(kd) && cg_q8_gemv16_fits(f, kd.c);
    LLVMValueRef a16 = NULL, qs16 = NULL;
    if (q16) {
        a16 = cg_var(f, LLVMArrayType(LLVMInt16TypeInContext(cg->ctx), (unsigned)(GEMV_ROWS * 2 * kd.c)), NULL, "a16");
        LLVMSetAlignment(a16, 64);
        qs16 = cg_var(f, LLVMArrayType(cg->t_f32, GEMV_ROWS), NULL, "a16scale");
        CgLoop lq;
        cg_for(f, &lq, cg_i64(cg, 0), rows, "a16row");
        LLVMValueRef src = LLVMBuildAdd(b, batch_offset(f, an, LLVMBuildSDiv(b, lq.iv, d->m, ""), mk),
                                        LLVMBuildMul(b, LLVMBuildSRem(b, lq.iv, d->m, ""), d->k, ""), "");
        cg_q8_pack_a16(f, a16, qs16, f->in[0], src, lq.iv, kd.c);
        cg_for_end(f, &lq);
    }
    CgLoop li, lj;
    cg_for(f, &li, f->lo, f->hi, "item");
    LLVMValueRef bi0 = shared ? cg_i64(cg, 0) : LLVMBuildSRem(b, li.iv, d->batch, "");
    LLVMValueRef blk = shared ? li.iv : LLVMBuildSDiv(b, li.iv, d->batch, "");
    LLVMValueRef j0 = LLVMBuildMul(b, blk, cg_i64(cg, GEMV_COLS), "");
    LLVMValueRef j1 = cg_min_i64(f, d->w, LLVMBuildAdd(b, j0, cg_i64(cg, GEMV_COLS), ""));
    int nparts = d->split ? 2 : 1, sld = 2 * GEMV_COLS; /* the scratch: [GEMV_ROWS][2 GEMV_COLS] */
    LLVMValueRef scratch = d->split ? cg_var(f, LLVMArrayType(cg->t_f32, GEMV_ROWS * sld), NULL, "gscratch") : NULL;
    LLVMValueRef jfull = LLVMBuildAdd(b, j0, LLVMBuildMul(b, LLVMBuildSDiv(b, LLVMBuildSub(b, j1, j0, ""), cg_i64(cg, GEMV_UNROLL), ""),
                                                       cg_i64(cg, GEMV_UNROLL), ""), "");
    LLVMValueRef bbase = batch_offset(f, n->in[1], bi0, kn);
    /* bf16 operands with a constant k (every weight): the item's rows of A rounded once, into
     * [GEMV_ROWS][k] floats, rather than in the loop of every block of columns */
    int pre = !q8 && cg->bf16 && ir_dim_is_const(kd) && kd.c > 0 && kd.c <= GEMV_PREROUND_K;
    /* ... as bf16 pairs, for the dot products that read a bf16 weight as stored (cg_llvm_gemv16.c) */
    int pairs = pre && f->in_bf16[1] && cg_gemv_bf16_fits(cg, kd.c);
    LLVMValueRef ar = pre ? cg_var(f, LLVMArrayType(pairs ? cg->t_i32 : cg->t_f32, (unsigned)(GEMV_ROWS * kd.c / (pairs ? 2 : 1))),
                                   NULL, "arounded") : NULL;
    if (pairs)
        LLVMSetAlignment(ar, 64);
    for (int nr = 1; nr <= GEMV_ROWS; nr++) {
        CgIf is;
        cg_if(f, &is, LLVMBuildICmp(b, LLVMIntEQ, rows, cg_i64(cg, nr), ""));
        if (pre)
            for (int r = 0; r < nr; r++) {
                LLVMValueRef bi = LLVMBuildAdd(b, bi0, LLVMBuildSDiv(b, cg_i64(cg, r), d->m, ""), "");
                LLVMValueRef i = LLVMBuildSRem(b, cg_i64(cg, r), d->m, "");
                LLVMValueRef src = LLVMBuildAdd(b, batch_offset(f, an, bi, mk), LLVMBuildMul(b, i, d->k, ""), "");
                if (pairs) {
                    cg_gemv_pack_a(f, ar, f->in[0], src, r, kd.c);
                    continue;
                }
                CgLoop lq;
                cg_for(f, &lq, cg_i64(cg, 0), d->k, "pa");
                LLVMValueRef v = cg_bf16_round(cg, cg_load(f, IR_F32, f->in[0], LLVMBuildAdd(b, src, lq.iv, "")));
                cg_store(f, IR_F32, ar, LLVMBuildAdd(b, cg_i64(cg, r * kd.c), lq.iv, ""), v);
                cg_for_end(f, &lq);
            }
        for (int p = 0; p < nparts; p++) {
            LLVMValueRef arow[GEMV_ROWS], crow[GEMV_ROWS];
            LLVMValueRef dst = d->split ? scratch : f->out;
            LLVMValueRef bpart = LLVMBuildAdd(b, bbase, LLVMBuildMul(b, cg_i64(cg, p), LLVMBuildMul(b, d->w, d->k, ""), ""), "");
            for (int r = 0; r < nr; r++) { /* row r of the item: batch index bi0 + r / m, row r % m */
                LLVMValueRef bi = LLVMBuildAdd(b, bi0, LLVMBuildSDiv(b, cg_i64(cg, r), d->m, ""), "");
                LLVMValueRef i = LLVMBuildSRem(b, cg_i64(cg, r), d->m, "");
                arow[r] = pre ? cg_i64(cg, r * kd.c)
                              : LLVMBuildAdd(b, batch_offset(f, n->in[0], bi, mk), LLVMBuildMul(b, i, d->k, ""), "");
                crow[r] = d->split ? LLVMBuildSub(b, cg_i64(cg, r * sld + p * GEMV_COLS), j0, "")
                                   : LLVMBuildAdd(b, LLVMBuildMul(b, bi, mn, ""), LLVMBuildMul(b, i, d->n, ""), "");
            }
            cg_for(f, &lj, cg_i64(cg, 0), LLVMBuildSDiv(b, LLVMBuildSub(b, jfull, j0, ""), cg_i64(cg, GEMV_UNROLL), ""), "jg");
            LLVMValueRef j = LLVMBuildAdd(b, j0, LLVMBuildMul(b, lj.iv, cg_i64(cg, GEMV_UNROLL), ""), "");
            LLVMValueRef a = pre ? ar : f->in[0], brow = LLVMBuildAdd(b, bpart, LLVMBuildMul(b, j, d->k, ""), "");
            if (q16)
                cg_q8_gemv_dots16(f, dst, a16, qs16, crow, nr, brow, kd.c, j, GEMV_UNROLL);
            else if (q8)
                cg_q8_gemv_dots(f, dst, arow, crow, nr, brow, d->k, j, GEMV_UNROLL);
            else if (pairs)
                cg_gemv_dots_bf16(f, dst, ar, crow, nr, brow, kd.c, j, GEMV_UNROLL);
            else
                gemv_dots(f, dst, a, pre, arow, crow, nr, brow, d->k, j, GEMV_UNROLL);
            cg_for_end(f, &lj);
            cg_for(f, &lj, jfull, j1, "j");
            brow = LLVMBuildAdd(b, bpart, LLVMBuildMul(b, lj.iv, d->k, ""), "");
            if (q16)
                cg_q8_gemv_dots16(f, dst, a16, qs16, crow, nr, brow, kd.c, lj.iv, 1);
            else if (q8)
                cg_q8_gemv_dots(f, dst, arow, crow, nr, brow, d->k, lj.iv, 1);
            else if (pairs)
                cg_gemv_dots_bf16(f, dst, ar, crow, nr, brow, kd.c, lj.iv, 1);
            else
                gemv_dots(f, dst, a, pre, arow, crow, nr, brow, d->k, lj.iv, 1);
            cg_for_end(f, &lj);
        }
        cg_if_end(f, &is);
    }
    if (epi) { /* the block's columns of every row are final */
        CgLoop lb;
        cg_for(f, &lb, cg_i64(cg, 0), nbi, "ebi");
        LLVMValueRef bi = LLVMBuildAdd(b, bi0, lb.iv, "");
        CgMmPart parts[2] = {{f->out, d->n, LLVMBuildNeg(b, LLVMBuildMul(b, bi, d->m, ""), ""), cg_i64(cg, 0)}};
        for (int p = 0; p < nparts && d->split; p++) /* row lb m + i of the scratch, column p GEMV_COLS + j - j0 */
            parts[p] = (CgMmPart){scratch, cg_i64(cg, sld), LLVMBuildNeg(b, LLVMBuildMul(b, lb.iv, d->m, ""), ""),
                                  LLVMBuildSub(b, j0, cg_i64(cg, p * GEMV_COLS), "")};
        epi->fn(f, epi->ctx, bi, cg_i64(cg, 0), d->m, j0, j1, parts);
        cg_for_end(f, &lb);
    }
    cg_for_end(f, &li);
}

/* ---- helpers generated once per module ---- */

/* A function of its own: saves and restores the builder's position around its emission. */
typedef struct {
    CgFn f;
    LLVMBasicBlockRef saved;
} Helper;

static LLVMValueRef helper_begin(Cg *cg, Helper *h, const char *name, LLVMTypeRef ret, LLVMTypeRef *params, int n)
{
    h->saved = LLVMGetInsertBlock(cg->b);
    LLVMValueRef fn = cg_function(cg, name, LLVMFunctionType(ret, params, (unsigned)n, 0), 1);
    memset(&h->f, 0, sizeof h->f);
    h->f.cg = cg;
    h->f.fn = fn;
    h->f.entry = LLVMAppendBasicBlockInContext(cg->ctx, fn, "entry");
    LLVMPositionBuilderAtEnd(cg->b, h->f.entry);
    return fn;
}

static void helper_end(Cg *cg, Helper *h)
{
    LLVMBuildRetVoid(cg->b);
    LLVMPositionBuilderAtEnd(cg->b, h->saved);
}

/* A packing helper's start: void name(ptr dst, ptr src, i64 ...), n parameters in all, dst and
 * src noalias; its parameters in param[0 .. n). */
static LLVMValueRef pack_helper_begin(Cg *cg, Helper *h, const char *name, int n, LLVMValueRef *param)
{
    LLVMTypeRef params[8] = {cg->t_ptr, cg->t_ptr};
    for (int i = 2; i < n; i++)
        params[i] = cg->t_i64;
    LLVMValueRef fn = helper_begin(cg, h, name, cg->t_void, params, n);
    cg_attr(cg, fn, 1, "noalias");
    cg_attr(cg, fn, 2, "noalias");
    for (int i = 0; i < n; i++)
        param[i] = LLVMGetParam(fn, (unsigned)i);
    return fn;
}

/* Transposes VW x VW floats held as VW row vectors, in place: swapping the off-diagonal h x h
 * blocks of every 2h x 2h block, for h = VW/2 .. 1 (two-source shuffles, no memory). */
void cg_transpose_vectors(Cg *cg, LLVMValueRef *rows, int vw)
{
    for (int h = vw / 2; h >= 1; h /= 2) {
        LLVMValueRef lo[64], hi[64];
        for (int c = 0; c < vw; c++) {
            lo[c] = cg_i32(cg, (c & h) ? vw + c - h : c);
            hi[c] = cg_i32(cg, (c & h) ? vw + c : c + h);
        }
        LLVMValueRef mlo = LLVMConstVector(lo, (unsigned)vw), mhi = LLVMConstVector(hi, (unsigned)vw);
        for (int i = 0; i < vw; i++) {
            if (i & h)
                continue;
            LLVMValueRef a = rows[i], b = rows[i + h];
            rows[i] = LLVMBuildShuffleVector(cg->b, a, b, mlo, "");
            rows[i + h] = LLVMBuildShuffleVector(cg->b, a, b, mhi, "");
        }
    }
}

/* The transposed pack's fast part: bp[p][j] = b[(j0 + j) ldb + pc + p] for p < pfull (a
 * multiple of VW) and every j < NR, VW x VW blocks at a time: VW contiguous loads of source rows,
 * an in-register transpose, VW contiguous stores (a plain loop would scatter). */
static void pack_t_blocks(CgFn *f, LLVMValueRef bp, LLVMValueRef src, LLVMValueRef ldb, LLVMValueRef pc,
                          LLVMValueRef pfull, LLVMValueRef j0, int src16)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    int vw = lanes(cg), nr = 2 * vw;
    LLVMTypeRef vt = LLVMVectorType(cg->t_f32, (unsigned)vw);
    CgLoop lp;
    cg_for(f, &lp, cg_i64(cg, 0), LLVMBuildSDiv(b, pfull, cg_i64(cg, vw), ""), "pblock");
    LLVMValueRef p0 = LLVMBuildMul(b, lp.iv, cg_i64(cg, vw), "");
    for (int jb = 0; jb < nr; jb += vw) {
        LLVMValueRef rows[64];
        for (int t = 0; t < vw; t++) {
            LLVMValueRef col = LLVMBuildAdd(b, j0, cg_i64(cg, jb + t), "");
            LLVMValueRef at = LLVMBuildAdd(b, LLVMBuildAdd(b, LLVMBuildMul(b, col, ldb, ""), pc, ""), p0, "");
            if (src16) { /* bf16 weights: VW of them widened */
                LLVMTypeRef v16 = LLVMVectorType(LLVMInt16TypeInContext(cg->ctx), (unsigned)vw);
                rows[t] = LLVMBuildLoad2(b, v16, cg_addr_bf16(f, src, at), "");
                LLVMSetAlignment(rows[t], 2);
                rows[t] = cg_widen_bf16(cg, rows[t], vw);
            } else {
                rows[t] = LLVMBuildLoad2(b, vt, cg_addr(f, IR_F32, src, at), "");
                LLVMSetAlignment(rows[t], 4);
            }
        }
        cg_transpose_vectors(cg, rows, vw);
        for (int q = 0; q < vw; q++) {
            LLVMValueRef prow = LLVMBuildAdd(b, p0, cg_i64(cg, q), "");
            LLVMValueRef at = LLVMBuildAdd(b, LLVMBuildMul(b, prow, cg_i64(cg, nr), ""), cg_i64(cg, jb), "");
            LLVMSetAlignment(LLVMBuildStore(b, rows[q], cg_addr(f, IR_F32, bp, at)), 4);
        }
    }
    cg_for_end(f, &lp);
}

/* The columns of a packed panel past B's last: bp[p][j] = 0 for p < kc, nc <= j < NR (the
 * micro-kernel always reads NR columns; every pack ends with this, cg_q8_pack too). */
void cg_gemm_pack_zero_tail(CgFn *f, LLVMValueRef bp, LLVMValueRef kc, LLVMValueRef nc)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    int nr = cg_gemm_nr(cg);
    CgLoop lp, lj;
    cg_for(f, &lp, cg_i64(cg, 0), kc, "p");
    LLVMValueRef drow = LLVMBuildMul(b, lp.iv, cg_i64(cg, nr), "");
    cg_for(f, &lj, nc, cg_i64(cg, nr), "j");
    cg_store(f, IR_F32, bp, LLVMBuildAdd(b, drow, lj.iv, ""), cg_f32(cg, 0));
    cg_for_end(f, &lj);
    cg_for_end(f, &lp);
}

/* pack(bp, b, ldb, pc, kc, j0, nc): bp[p][j] = B(pc + p, j0 + j) for j < nc, 0 for nc <= j < NR.
 * B(p, j) is b[p * ldb + j], or b[j * ldb + p] when transposed; src16: b holds bf16 (widened as
 * read, so that the panels are the same f32 panels). */
static LLVMValueRef pack_function(Cg *cg, int transposed, int src16)
{
    static const char *const names[2][2] = {{"xtc_gemm_pack_n", "xtc_gemm_pack_t"}, {"xtc_gemm_pack_n_b16", "xtc_gemm_pack_t_b16"}};
    const char *name = names[src16 != 0][transposed != 0];
    LLVMValueRef fn = LLVMGetNamedFunction(cg->mod, name);
    if (fn)
        return fn;
    int nr = 2 * lanes(cg);
    Helper h;
    LLVMValueRef pm[7];
    fn = pack_helper_begin(cg, &h, name, 7, pm);
    CgFn *f = &h.f;
    LLVMBuilderRef b = cg->b;
    LLVMValueRef bp = pm[0], src = pm[1], ldb = pm[2], pc = pm[3], kc = pm[4], j0 = pm[5], nc = pm[6];
    CgLoop lp, lj;
    if (!transposed) {
        cg_for(f, &lp, cg_i64(cg, 0), kc, "p");
        LLVMValueRef srow = LLVMBuildAdd(b, LLVMBuildMul(b, LLVMBuildAdd(b, pc, lp.iv, ""), ldb, ""), j0, "");
        LLVMValueRef drow = LLVMBuildMul(b, lp.iv, cg_i64(cg, nr), "");
        cg_for(f, &lj, cg_i64(cg, 0), nc, "j");
        LLVMValueRef at = LLVMBuildAdd(b, srow, lj.iv, "");
        cg_store(f, IR_F32, bp, LLVMBuildAdd(b, drow, lj.iv, ""), src16 ? cg_load_bf16(f, src, at) : cg_load(f, IR_F32, src, at));
        cg_for_end(f, &lj);
        cg_for_end(f, &lp);
    } else {
        /* a full panel: whole VW x VW blocks first, the last kc % VW rows element by element */
        int vw = lanes(cg);
        LLVMValueRef full = LLVMBuildICmp(b, LLVMIntEQ, nc, cg_i64(cg, nr), "");
        LLVMValueRef pblocks = LLVMBuildMul(b, LLVMBuildSDiv(b, kc, cg_i64(cg, vw), ""), cg_i64(cg, vw), "");
        LLVMValueRef pfull = LLVMBuildSelect(b, full, pblocks, cg_i64(cg, 0), "pfull");
        pack_t_blocks(f, bp, src, ldb, pc, pfull, j0, src16);
        cg_for(f, &lj, cg_i64(cg, 0), nc, "j");
        LLVMValueRef scol = LLVMBuildAdd(b, LLVMBuildMul(b, LLVMBuildAdd(b, j0, lj.iv, ""), ldb, ""), pc, "");
        cg_for(f, &lp, pfull, kc, "p");
        LLVMValueRef at = LLVMBuildAdd(b, scol, lp.iv, "");
        LLVMValueRef v = src16 ? cg_load_bf16(f, src, at) : cg_load(f, IR_F32, src, at);
        cg_store(f, IR_F32, bp, LLVMBuildAdd(b, LLVMBuildMul(b, lp.iv, cg_i64(cg, nr), ""), lj.iv, ""), v);
        cg_for_end(f, &lp);
        cg_for_end(f, &lj);
    }
    cg_gemm_pack_zero_tail(f, bp, kc, nc);
    helper_end(cg, &h);
    return fn;
}

/* The mask of lanes [0, valid) of a vector of n lanes. */
static LLVMValueRef lane_mask(Cg *cg, LLVMValueRef valid, int n)
{
    LLVMValueRef idx[64];
    for (int i = 0; i < n; i++)
        idx[i] = cg_i64(cg, i);
    LLVMTypeRef vt = LLVMVectorType(cg->t_i64, (unsigned)n);
    LLVMValueRef v = LLVMBuildInsertElement(cg->b, LLVMGetPoison(vt), valid, cg_i32(cg, 0), "");
    v = LLVMBuildShuffleVector(cg->b, v, LLVMGetPoison(vt), LLVMConstNull(LLVMVectorType(cg->t_i32, (unsigned)n)), "");
    return LLVMBuildICmp(cg->b, LLVMIntSLT, LLVMConstVector(idx, (unsigned)n), v, "");
}

/* One vector of a C tile: c[0, lanes) (+)= acc, only the first `valid` lanes when valid < VW. */
static void store_tile_vector(CgFn *f, LLVMValueRef cptr, LLVMValueRef acc, LLVMValueRef valid, LLVMValueRef accumulate)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    int vw = lanes(cg);
    LLVMTypeRef vt = LLVMVectorType(cg->t_f32, (unsigned)vw);
    LLVMBasicBlockRef full = LLVMAppendBasicBlockInContext(cg->ctx, f->fn, "c.full");
    LLVMBasicBlockRef part = LLVMAppendBasicBlockInContext(cg->ctx, f->fn, "c.part");
    LLVMBasicBlockRef masked = LLVMAppendBasicBlockInContext(cg->ctx, f->fn, "c.masked");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(cg->ctx, f->fn, "c.done");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSGE, valid, cg_i64(cg, vw), ""), full, part);

    LLVMPositionBuilderAtEnd(b, full);
    LLVMValueRef old = LLVMBuildLoad2(b, vt, cptr, "");
    LLVMSetAlignment(old, 4);
    LLVMValueRef v = LLVMBuildSelect(b, accumulate, LLVMBuildFAdd(b, acc, old, ""), acc, "");
    LLVMSetAlignment(LLVMBuildStore(b, v, cptr), 4);
    LLVMBuildBr(b, done);

    LLVMPositionBuilderAtEnd(b, part);
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSGT, valid, cg_i64(cg, 0), ""), masked, done);
    LLVMPositionBuilderAtEnd(b, masked);
    LLVMValueRef mask = lane_mask(cg, valid, vw);
    LLVMTypeRef tys[2] = {vt, cg->t_ptr};
    LLVMValueRef largs[4] = {cptr, cg_i32(cg, 4), mask, LLVMConstNull(vt)};
    old = cg_intrinsic_n(cg, "llvm.masked.load", tys, 2, largs, 4);
    v = LLVMBuildSelect(b, accumulate, LLVMBuildFAdd(b, acc, old, ""), acc, "");
    LLVMValueRef sargs[4] = {v, cptr, cg_i32(cg, 4), mask};
    cg_intrinsic_n(cg, "llvm.masked.store", tys, 2, sargs, 4);
    LLVMBuildBr(b, done);
    LLVMPositionBuilderAtEnd(b, done);
}

/* micro(a, lda, i0, mlast, kc, bp, c, ldc, mr, nc, accumulate):
 *   rows r < MR of A start at a + min(i0 + r, mlast) * lda; C rows at c + (i0 + r) * ldc;
 *   C[r, 0..nc) (+)= sum_p A[r, p] * bp[p, ..] for r < mr.
 * With at (the micro_at function, for A read through the transposed view CG_VIEW_A_T and packed
 * by pack_a_at): A[r, p] at a + ai0 + r + p * lda for every r < MR (the tile holds zeros past
 * its rows; mlast unused), the MR values of a k step contiguous, with the twelfth argument ai0
 * as below.
 * With bf16 operands (Cg.bf16, the micro_bf16 function): a and bp hold bf16 pairs, one i32 per
 * pair of k steps (the lower k in the low half), kc counts pairs and lda is in pairs; bp[p2][j]
 * is the pair (B(2 p2, j), B(2 p2 + 1, j)) (pack_bf16 below); a is the packed block of A, whose
 * rows are numbered apart from C's: a twelfth argument ai0 gives A's row of C's row i0. */
static LLVMValueRef micro_build(Cg *cg, int bf16, int at)
{
    at = at && !bf16; /* bf16 operands: A is packed in rows (pack_a_bf16) */
    const char *name = bf16 ? "xtc_gemm_micro_bf16" : at ? "xtc_gemm_micro_at" : "xtc_gemm_micro";
    LLVMValueRef fn = LLVMGetNamedFunction(cg->mod, name);
    if (fn)
        return fn;
    int vw = lanes(cg), mr_max = tile_rows(cg);
    LLVMTypeRef p = cg->t_ptr, i64 = cg->t_i64;
    LLVMTypeRef params[12] = {p, i64, i64, i64, i64, p, p, i64, i64, i64, cg->t_i1, i64};
    Helper h;
    fn = helper_begin(cg, &h, name, cg->t_void, params, bf16 || at ? 12 : 11);
    cg_attr(cg, fn, 1, "noalias");
    cg_attr(cg, fn, 6, "noalias");
    cg_attr(cg, fn, 7, "noalias");
    CgFn *f = &h.f;
    LLVMBuilderRef b = cg->b;
    LLVMValueRef a = LLVMGetParam(fn, 0), lda = LLVMGetParam(fn, 1), i0 = LLVMGetParam(fn, 2);
    LLVMValueRef mlast = LLVMGetParam(fn, 3), kc = LLVMGetParam(fn, 4), bp = LLVMGetParam(fn, 5);
    LLVMValueRef c = LLVMGetParam(fn, 6), ldc = LLVMGetParam(fn, 7), mr = LLVMGetParam(fn, 8);
    LLVMValueRef nc = LLVMGetParam(fn, 9), accumulate = LLVMGetParam(fn, 10);
    LLVMValueRef ai0 = bf16 || at ? LLVMGetParam(fn, 11) : i0;
    LLVMTypeRef vt = LLVMVectorType(cg->t_f32, (unsigned)vw), vi = LLVMVectorType(cg->t_i32, (unsigned)vw);
    LLVMTypeRef et = bf16 ? cg->t_i32 : cg->t_f32, evt = bf16 ? vi : vt;
    IrDType edt = bf16 ? IR_I32 : IR_F32;

    LLVMValueRef arow[16], acc[16][2];
    for (int r = 0; r < mr_max; r++) {
        /* a packed A^T tile holds all MR rows (zeros past mr): one base, constant offsets */
        LLVMValueRef row = at ? LLVMBuildAdd(b, ai0, cg_i64(cg, r), "")
                              : cg_min_i64(f, LLVMBuildAdd(b, ai0, cg_i64(cg, r), ""), mlast);
        arow[r] = LLVMBuildInBoundsGEP2(b, et, a, (LLVMValueRef[]){at ? row : LLVMBuildMul(b, row, lda, "")}, 1, "");
        for (int h2 = 0; h2 < 2; h2++)
            acc[r][h2] = cg_var(f, vt, LLVMConstNull(vt), "acc");
    }
    /* vdpbf16ps: its operand types are those of the LLVM in use (<32 x bfloat>, or <16 x i32>) */
    LLVMValueRef dp = NULL;
    LLVMTypeRef dpty = NULL, dparg[3];
    if (bf16 == CG_BF16_DPBF16) {
        const char *iname = "llvm.x86.avx512bf16.dpbf16ps.512";
        unsigned id = LLVMLookupIntrinsicID(iname, strlen(iname));
        dp = LLVMGetIntrinsicDeclaration(cg->mod, id, NULL, 0);
        dpty = LLVMIntrinsicGetType(cg->ctx, id, NULL, 0);
        LLVMGetParamTypes(dpty, dparg);
    }
    CgLoop lp;
    cg_for(f, &lp, cg_i64(cg, 0), kc, "p");
    LLVMValueRef brow = LLVMBuildMul(b, lp.iv, cg_i64(cg, 2 * vw), "");
    LLVMValueRef astep = at ? LLVMBuildMul(b, lp.iv, lda, "") : lp.iv; /* A[r, p] from row r's start */
    LLVMValueRef bv[2], bhi[2];
    for (int h2 = 0; h2 < 2; h2++) {
        LLVMValueRef ptr = cg_addr(f, edt, bp, LLVMBuildAdd(b, brow, cg_i64(cg, h2 * vw), ""));
        bv[h2] = LLVMBuildLoad2(b, evt, ptr, "");
        LLVMSetAlignment(bv[h2], (unsigned)(vw * 4));
    }
    LLVMValueRef lo16 = NULL, hi16 = NULL;
    if (bf16 == CG_BF16_SOFT) { /* the pairs widened: the low k step's values, then the high one's */
        LLVMValueRef e16[16], emask[16];
        for (int l = 0; l < vw; l++) {
            e16[l] = cg_i32(cg, 16);
            emask[l] = LLVMConstInt(cg->t_i32, 0xffff0000u, 0);
        }
        lo16 = LLVMConstVector(e16, (unsigned)vw);
        hi16 = LLVMConstVector(emask, (unsigned)vw);
        for (int h2 = 0; h2 < 2; h2++) {
            bhi[h2] = LLVMBuildBitCast(b, LLVMBuildAnd(b, bv[h2], hi16, ""), vt, "");
            bv[h2] = LLVMBuildBitCast(b, LLVMBuildShl(b, bv[h2], lo16, ""), vt, "");
        }
    }
    for (int r = 0; r < mr_max; r++) {
        LLVMValueRef av = LLVMBuildLoad2(b, et, cg_addr(f, edt, arow[r], astep), "");
        av = LLVMBuildShuffleVector(b, LLVMBuildInsertElement(b, LLVMGetPoison(evt), av, cg_i32(cg, 0), ""),
                                    LLVMGetPoison(evt), LLVMConstNull(vi), "");
        for (int h2 = 0; h2 < 2; h2++) {
            LLVMValueRef sum = cg_get(f, vt, acc[r][h2]);
            if (bf16 == CG_BF16_DPBF16) {
                LLVMValueRef args[3] = {sum, LLVMBuildBitCast(b, av, dparg[1], ""), LLVMBuildBitCast(b, bv[h2], dparg[2], "")};
                sum = LLVMBuildCall2(b, dpty, dp, args, 3, "");
            } else if (bf16 == CG_BF16_SOFT) {
                LLVMValueRef alo = LLVMBuildBitCast(b, LLVMBuildShl(b, av, lo16, ""), vt, "");
                LLVMValueRef ahi = LLVMBuildBitCast(b, LLVMBuildAnd(b, av, hi16, ""), vt, "");
                sum = cg_intrinsic(cg, "llvm.fmuladd", vt, (LLVMValueRef[]){alo, bv[h2], sum}, 3);
                sum = cg_intrinsic(cg, "llvm.fmuladd", vt, (LLVMValueRef[]){ahi, bhi[h2], sum}, 3);
            } else {
                sum = cg_intrinsic(cg, "llvm.fmuladd", vt, (LLVMValueRef[]){av, bv[h2], sum}, 3);
            }
            LLVMBuildStore(b, sum, acc[r][h2]);
        }
    }
    cg_for_end(f, &lp);
    for (int r = 0; r < mr_max; r++) {
        CgIf in;
        cg_if(f, &in, LLVMBuildICmp(b, LLVMIntSLT, cg_i64(cg, r), mr, ""));
        LLVMValueRef crow = LLVMBuildMul(b, LLVMBuildAdd(b, i0, cg_i64(cg, r), ""), ldc, "");
        for (int h2 = 0; h2 < 2; h2++) {
            LLVMValueRef cptr = cg_addr(f, IR_F32, c, LLVMBuildAdd(b, crow, cg_i64(cg, h2 * vw), ""));
            LLVMValueRef valid = LLVMBuildSub(b, nc, cg_i64(cg, h2 * vw), "");
            store_tile_vector(f, cptr, cg_get(f, vt, acc[r][h2]), valid, accumulate);
        }
        cg_if_end(f, &in);
    }
    helper_end(cg, &h);
    return fn;
}

static LLVMValueRef micro_function(Cg *cg) { return micro_build(cg, CG_BF16_OFF, 0); }

/* pack_bf16(bp, kc): a panel packed in f32 (pack_function) turned into bf16 pairs in place:
 * bp32[p2][j] = bf16(bp[2 p2][j]) | bf16(bp[2 p2 + 1][j]) << 16 (0 for 2 p2 + 1 = kc), for
 * p2 < ceil(kc / 2). Row p2 of the pairs overwrites f32 row p2 once rows 2 p2 and 2 p2 + 1,
 * at or after it, are read. */
static LLVMValueRef pack_bf16_function(Cg *cg)
{
    LLVMValueRef fn = LLVMGetNamedFunction(cg->mod, "xtc_gemm_pack_bf16");
    if (fn)
        return fn;
    int vw = lanes(cg), nr = 2 * vw;
    LLVMTypeRef params[2] = {cg->t_ptr, cg->t_i64};
    Helper h;
    fn = helper_begin(cg, &h, "xtc_gemm_pack_bf16", cg->t_void, params, 2);
    CgFn *f = &h.f;
    LLVMBuilderRef b = cg->b;
    LLVMValueRef bp = LLVMGetParam(fn, 0), kc = LLVMGetParam(fn, 1);
    LLVMTypeRef vt = LLVMVectorType(cg->t_f32, (unsigned)vw), vi = LLVMVectorType(cg->t_i32, (unsigned)vw);
    LLVMValueRef sh[16];
    for (int l = 0; l < vw; l++)
        sh[l] = cg_i32(cg, 16);
    CgLoop lp;
    cg_for(f, &lp, cg_i64(cg, 0), ceil_div(cg, kc, 2), "p2");
    LLVMValueRef p0 = LLVMBuildMul(b, lp.iv, cg_i64(cg, 2), "");
    LLVMValueRef has_hi = LLVMBuildICmp(b, LLVMIntSLT, LLVMBuildAdd(b, p0, cg_i64(cg, 1), ""), kc, "");
    for (int h2 = 0; h2 < nr; h2 += vw) {
        LLVMValueRef x[2];
        for (int q = 0; q < 2; q++) {
            LLVMValueRef at = LLVMBuildAdd(b, LLVMBuildMul(b, LLVMBuildAdd(b, p0, cg_i64(cg, q), ""), cg_i64(cg, nr), ""),
                                           cg_i64(cg, h2), "");
            x[q] = LLVMBuildLoad2(b, vt, cg_addr(f, IR_F32, bp, at), "");
            LLVMSetAlignment(x[q], 4);
            x[q] = LLVMBuildBitCast(b, cg_bf16_round(cg, x[q]), vi, "");
        }
        x[1] = LLVMBuildSelect(b, has_hi, x[1], LLVMConstNull(vi), "");
        LLVMValueRef pair = LLVMBuildOr(b, LLVMBuildLShr(b, x[0], LLVMConstVector(sh, (unsigned)vw), ""), x[1], "");
        LLVMValueRef at = LLVMBuildAdd(b, LLVMBuildMul(b, lp.iv, cg_i64(cg, nr), ""), cg_i64(cg, h2), "");
        LLVMSetAlignment(LLVMBuildStore(b, pair, cg_addr(f, IR_I32, bp, at)), 4);
    }
    cg_for_end(f, &lp);
    helper_end(cg, &h);
    return fn;
}

/* pack_a_bf16(ap, a, lda, rows, kc): ap16[r][p] = bf16(a[r lda + p]) for r < rows, p < kc, and
 * ap16[r][kc] = 0 when kc is odd: rows of KC bf16 values (KC / 2 pairs), for micro_bf16.
 * at (A through the transposed view, pack_a_bf16_at): ap16[r][p] = bf16(a[p lda + r]). */
static LLVMValueRef pack_a_bf16_function(Cg *cg, int at)
{
    const char *name = at ? "xtc_gemm_pack_a_bf16_at" : "xtc_gemm_pack_a_bf16";
    LLVMValueRef fn = LLVMGetNamedFunction(cg->mod, name);
    if (fn)
        return fn;
    Helper h;
    LLVMValueRef pm[5];
    fn = pack_helper_begin(cg, &h, name, 5, pm);
    CgFn *f = &h.f;
    LLVMBuilderRef b = cg->b;
    LLVMValueRef ap = pm[0], a = pm[1], lda = pm[2], rows = pm[3], kc = pm[4];
    LLVMTypeRef i16 = LLVMInt16TypeInContext(cg->ctx);
    int vw = lanes(cg);
    LLVMTypeRef vt = LLVMVectorType(cg->t_f32, (unsigned)vw), vi = LLVMVectorType(cg->t_i32, (unsigned)vw);
    LLVMValueRef sh[16];
    for (int l = 0; l < vw; l++)
        sh[l] = cg_i32(cg, 16);
    LLVMValueRef vfull = LLVMBuildMul(b, LLVMBuildSDiv(b, kc, cg_i64(cg, vw), ""), cg_i64(cg, vw), "");
    CgLoop lr, lp;
    if (at) { /* k rows of A^T outermost, so that the reads are contiguous; then the odd kc's zero */
        cg_for(f, &lp, cg_i64(cg, 0), kc, "p");
        cg_for(f, &lr, cg_i64(cg, 0), rows, "r");
        LLVMValueRef x = cg_load(f, IR_F32, a, LLVMBuildAdd(b, LLVMBuildMul(b, lp.iv, lda, ""), lr.iv, ""));
        x = LLVMBuildTrunc(b, LLVMBuildLShr(b, LLVMBuildBitCast(b, cg_bf16_round(cg, x), cg->t_i32, ""), cg_i32(cg, 16), ""),
                           i16, "");
        LLVMValueRef at2 = LLVMBuildAdd(b, LLVMBuildMul(b, lr.iv, cg_i64(cg, KC), ""), lp.iv, "");
        LLVMBuildStore(b, x, LLVMBuildInBoundsGEP2(b, i16, ap, &at2, 1, ""));
        cg_for_end(f, &lr);
        cg_for_end(f, &lp);
        CgIf odd;
        cg_if(f, &odd, LLVMBuildICmp(b, LLVMIntNE, LLVMBuildSRem(b, kc, cg_i64(cg, 2), ""), cg_i64(cg, 0), ""));
        cg_for(f, &lr, cg_i64(cg, 0), rows, "r");
        LLVMValueRef at3 = LLVMBuildAdd(b, LLVMBuildMul(b, lr.iv, cg_i64(cg, KC), ""), kc, "");
        LLVMBuildStore(b, LLVMConstNull(i16), LLVMBuildInBoundsGEP2(b, i16, ap, &at3, 1, ""));
        cg_for_end(f, &lr);
        cg_if_end(f, &odd);
        helper_end(cg, &h);
        return fn;
    }
    cg_for(f, &lr, cg_i64(cg, 0), rows, "r");
    LLVMValueRef src = LLVMBuildMul(b, lr.iv, lda, ""), dst = LLVMBuildMul(b, lr.iv, cg_i64(cg, KC), "");
    /* VW values at a time (rounded as vectors), then the rest one by one */
    cg_for(f, &lp, cg_i64(cg, 0), LLVMBuildSDiv(b, kc, cg_i64(cg, vw), ""), "pv");
    LLVMValueRef p0 = LLVMBuildMul(b, lp.iv, cg_i64(cg, vw), "");
    LLVMValueRef x = LLVMBuildLoad2(b, vt, cg_addr(f, IR_F32, a, LLVMBuildAdd(b, src, p0, "")), "");
    LLVMSetAlignment(x, 4);
    x = LLVMBuildLShr(b, LLVMBuildBitCast(b, cg_bf16_round(cg, x), vi, ""), LLVMConstVector(sh, (unsigned)vw), "");
    LLVMValueRef vat = LLVMBuildAdd(b, dst, p0, "");
    LLVMSetAlignment(LLVMBuildStore(b, LLVMBuildTrunc(b, x, LLVMVectorType(i16, (unsigned)vw), ""),
                                    LLVMBuildInBoundsGEP2(b, i16, ap, &vat, 1, "")), 2);
    cg_for_end(f, &lp);
    cg_for(f, &lp, vfull, kc, "p");
    LLVMValueRef v = LLVMBuildBitCast(b, cg_bf16_round(cg, cg_load(f, IR_F32, a, LLVMBuildAdd(b, src, lp.iv, ""))), cg->t_i32, "");
    v = LLVMBuildTrunc(b, LLVMBuildLShr(b, v, cg_i32(cg, 16), ""), i16, "");
    LLVMValueRef at1 = LLVMBuildAdd(b, dst, lp.iv, "");
    LLVMBuildStore(b, v, LLVMBuildInBoundsGEP2(b, i16, ap, &at1, 1, ""));
    cg_for_end(f, &lp);
    CgIf odd;
    cg_if(f, &odd, LLVMBuildICmp(b, LLVMIntNE, LLVMBuildSRem(b, kc, cg_i64(cg, 2), ""), cg_i64(cg, 0), ""));
    LLVMValueRef at2 = LLVMBuildAdd(b, dst, kc, "");
    LLVMBuildStore(b, LLVMConstNull(i16), LLVMBuildInBoundsGEP2(b, i16, ap, &at2, 1, ""));
    cg_if_end(f, &odd);
    cg_for_end(f, &lr);
    helper_end(cg, &h);
    return fn;
}

/* A packed by pack_a_at: a tile's k step takes APAD floats (MR of them used), a whole number of vectors */
static int a_pad(Cg *cg) { return tile_rows(cg) <= lanes(cg) ? lanes(cg) : 2 * lanes(cg); }

/* pack_a_at(ap, a, lda, rows, kc): A read through the transposed view (A[r, p] at a[p lda + r])
 * packed in tiles of MR rows: ap[t][p][l] = A[t MR + l, p] for l < MR and t MR + l < rows, 0 for
 * the other l < APAD, p < kc, with tile t at ap + t KC APAD. Each k step of A^T is a contiguous
 * row of the stored operand, read with masked vector loads; the micro-kernel then reads its A
 * values from one contiguous stream (read in place, every k step was another page of the
 * operand, m floats apart). */
static LLVMValueRef pack_a_at_function(Cg *cg)
{
    LLVMValueRef fn = LLVMGetNamedFunction(cg->mod, "xtc_gemm_pack_a_at");
    if (fn)
        return fn;
    Helper h;
    LLVMValueRef pm[5];
    fn = pack_helper_begin(cg, &h, "xtc_gemm_pack_a_at", 5, pm);
    CgFn *f = &h.f;
    LLVMBuilderRef b = cg->b;
    LLVMValueRef ap = pm[0], a = pm[1], lda = pm[2], rows = pm[3], kc = pm[4];
    int vw = lanes(cg), mr = tile_rows(cg), pad = a_pad(cg);
    LLVMTypeRef vt = LLVMVectorType(cg->t_f32, (unsigned)vw), tys[2] = {vt, cg->t_ptr};
    CgLoop lp, lt;
    cg_for(f, &lp, cg_i64(cg, 0), kc, "p");
    LLVMValueRef src = LLVMBuildMul(b, lp.iv, lda, "");
    cg_for(f, &lt, cg_i64(cg, 0), ceil_div(cg, rows, mr), "t");
    LLVMValueRef r0 = LLVMBuildMul(b, lt.iv, cg_i64(cg, mr), "");
    LLVMValueRef valid = cg_min_i64(f, cg_i64(cg, mr), LLVMBuildSub(b, rows, r0, ""));
    LLVMValueRef dst = LLVMBuildAdd(b, LLVMBuildMul(b, lt.iv, cg_i64(cg, KC * pad), ""),
                                    LLVMBuildMul(b, lp.iv, cg_i64(cg, pad), ""), "");
    for (int l = 0; l < pad; l += vw) {
        LLVMValueRef n = cg_max_i64(f, cg_i64(cg, 0), LLVMBuildSub(b, valid, cg_i64(cg, l), ""));
        LLVMValueRef largs[4] = {cg_addr(f, IR_F32, a, LLVMBuildAdd(b, src, LLVMBuildAdd(b, r0, cg_i64(cg, l), ""), "")),
                                 cg_i32(cg, 4), lane_mask(cg, n, vw), LLVMConstNull(vt)};
        LLVMValueRef v = cg_intrinsic_n(cg, "llvm.masked.load", tys, 2, largs, 4);
        LLVMValueRef st = LLVMBuildStore(b, v, cg_addr(f, IR_F32, ap, LLVMBuildAdd(b, dst, cg_i64(cg, l), "")));
        LLVMSetAlignment(st, (unsigned)(vw * 4));
    }
    cg_for_end(f, &lt);
    cg_for_end(f, &lp);
    helper_end(cg, &h);
    return fn;
}

/* ---- the blocked path ---- */

/* Prefetches (into L2, for writing) the C tile a micro-kernel call is about to update, rows
 * i0 + r for r < mr of c (ldc floats apart), columns [0, nc): the call reads and writes it only
 * after its k loop, so the lines arrive meanwhile (a product's output larger than L2 came from
 * L3 on every k block, the micro-kernel waiting on its loads of C). */
static void prefetch_tile(CgFn *f, LLVMValueRef c, LLVMValueRef i0, LLVMValueRef ldc, LLVMValueRef mr, LLVMValueRef nc)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    LLVMValueRef last = LLVMBuildSub(b, nc, cg_i64(cg, 1), "");
    LLVMValueRef cols[3] = {cg_i64(cg, 0), cg_min_i64(f, cg_i64(cg, 16), last), last};
    for (int r = 0; r < tile_rows(cg); r++) {
        LLVMValueRef row = LLVMBuildAdd(b, i0, cg_min_i64(f, cg_i64(cg, r), LLVMBuildSub(b, mr, cg_i64(cg, 1), "")), "");
        LLVMValueRef at = LLVMBuildMul(b, row, ldc, "");
        for (int j = 0; j < 3; j++) {
            LLVMValueRef args[4] = {cg_addr(f, IR_F32, c, LLVMBuildAdd(b, at, cols[j], "")), cg_i32(cg, 1), cg_i32(cg, 2),
                                    cg_i32(cg, 1)};
            cg_intrinsic(cg, "llvm.prefetch", cg->t_ptr, args, 4);
        }
    }
}

static int matmul_impl(CgFn *f, const CgMatmulEpilogue *epi)
{
    if (plain_path(f->node))
        return plain_impl(f, epi);
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    int tb = n->ia[IR_IA_TRANSPOSE_B] != 0, vw = lanes(cg), nr = 2 * vw, mrows = tile_rows(cg);
    /* A(i, p) at i k + p, or through the transposed view at p m + i (the plan gives it only
     * without transpose_b, so the matrix-vector path never reads it) */
    int at = (f->views & CG_VIEW_A_T) != 0;
    LLVMValueRef pack = pack_function(cg, tb, f->in_bf16[1]), micro = micro_build(cg, cg->bf16, at);
    LLVMTypeRef pack_type = LLVMGlobalGetValueType(pack), micro_type = LLVMGlobalGetValueType(micro);
    /* bf16 operands: each packed B panel turned into pairs, each MC x KC block of A packed too */
    LLVMValueRef pack16 = cg->bf16 ? pack_bf16_function(cg) : NULL, packa = cg->bf16 ? pack_a_bf16_function(cg, at) : NULL;

    MmDims d;
    mm_dims(f, &d);
    CgIf small;
    if (tb) { /* the matrix-vector path, else (to the end) the blocked one */
        LLVMValueRef gemv = gemv_case(f, &d);
        cg_if(f, &small, gemv);
        gemv_items(f, epi, &d);
        cg_if_end(f, &small);
        cg_if(f, &small, LLVMBuildNot(b, gemv, ""));
    }
    LLVMValueRef mk = LLVMBuildMul(b, d.m, d.k, ""), kn = LLVMBuildMul(b, d.k, d.n, ""), mn = LLVMBuildMul(b, d.m, d.n, "");
    int icols = item_cols(cg, &d);
    LLVMValueRef ngrp = ceil_div(cg, d.w, icols);
    LLVMValueRef rows = rows_per_block(f, &d, ngrp);
    LLVMValueRef nmb = LLVMBuildSDiv(b, LLVMBuildAdd(b, d.m, LLVMBuildSub(b, rows, cg_i64(cg, 1), ""), ""), rows, "");
    LLVMValueRef nkb = cg_max_i64(f, ceil_div(cg, d.k, KC), cg_i64(cg, 1)); /* k = 0 still stores zeros */
    LLVMValueRef mlast = LLVMBuildSub(b, d.m, cg_i64(cg, 1), "");
    LLVMValueRef ldb = tb ? d.k : d.n, lda = at ? d.m : d.k;

    /* the item's packed panels: NC / NR panels of KC x NR floats, aligned for vector loads */
    int npanels_max = (d.at ? 2 : 1) * col_block(cg) / nr;
    LLVMValueRef bp = cg_var(f, LLVMArrayType(cg->t_f32, KC * (unsigned)(nr * npanels_max)), NULL, "bpanels");
    LLVMSetAlignment(bp, 64);
    /* a split product: the item's rows (at most MC) of both halves, side by side, [MC][2 icols] */
    LLVMValueRef scratch = NULL, sld = cg_i64(cg, 2 * icols), ap = NULL;
    if (cg->bf16) {
        ap = cg_var(f, LLVMArrayType(LLVMInt16TypeInContext(cg->ctx), MC * KC), NULL, "apacked");
        LLVMSetAlignment(ap, 64);
    }
    LLVMValueRef apt = NULL, pack_at = at && !cg->bf16 ? pack_a_at_function(cg) : NULL; /* A^T packed in tiles */
    if (pack_at) {
        apt = cg_var(f, LLVMArrayType(cg->t_f32, (unsigned)((MC / mrows) * KC * a_pad(cg))), NULL, "atiles");
        LLVMSetAlignment(apt, 64);
    }
    if (d.split) {
        scratch = cg_var(f, LLVMArrayType(cg->t_f32, MC * 2 * (unsigned)icols), NULL, "product");
        LLVMSetAlignment(scratch, 64);
    }

    CgLoop li, lk, lj, lr, lm;
    cg_for(f, &li, f->lo, f->hi, "item");
    LLVMValueRef grp = LLVMBuildSRem(b, li.iv, ngrp, "");
    LLVMValueRef t = LLVMBuildSDiv(b, li.iv, ngrp, "");
    LLVMValueRef mb = LLVMBuildSRem(b, t, nmb, "");
    LLVMValueRef bi = LLVMBuildSDiv(b, t, nmb, "");
    LLVMValueRef aptr0 = cg_addr(f, IR_F32, f->in[0], batch_offset(f, n->in[0], bi, mk));
    LLVMValueRef boff = batch_offset(f, n->in[1], bi, kn);
    LLVMValueRef bptr = f->in_bf16[1] ? cg_addr_bf16(f, f->in[1], boff) : cg_addr(f, IR_F32, f->in[1], boff);
    LLVMValueRef cptr0 = cg_addr(f, IR_F32, f->out, LLVMBuildMul(b, bi, mn, ""));
    LLVMValueRef i_start = LLVMBuildMul(b, mb, rows, "");
    LLVMValueRef i_end = cg_min_i64(f, d.m, LLVMBuildAdd(b, i_start, rows, ""));
    LLVMValueRef j_start = LLVMBuildMul(b, grp, cg_i64(cg, icols), "");
    LLVMValueRef j_end = cg_min_i64(f, d.w, LLVMBuildAdd(b, j_start, cg_i64(cg, icols), ""));
    LLVMValueRef npart = ceil_div(cg, LLVMBuildSub(b, j_end, j_start, ""), nr); /* panels of a part */
    LLVMValueRef npanels = d.split ? LLVMBuildMul(b, npart, cg_i64(cg, 2), "") : npart;
    LLVMValueRef nmc = ceil_div(cg, LLVMBuildSub(b, i_end, i_start, ""), MC);
    /* rows from i_start: A and the scratch are addressed relative to the item's first row */
    LLVMValueRef arow0 = d.split ? i_start : cg_i64(cg, 0);

    /* the item's C block past PREFETCH_C floats (half this CPU's L2): its tiles are prefetched (an item
     * whose C stays in L2, as GPT-M's logits' 1024 x 256, would only pay the instructions) */
    LLVMValueRef big_c = LLVMBuildICmp(b, LLVMIntSGT, LLVMBuildMul(b, LLVMBuildSub(b, i_end, i_start, ""),
                                                                   LLVMBuildSub(b, j_end, j_start, ""), ""),
                                       cg_i64(cg, PREFETCH_C), "bigc");
    cg_for(f, &lk, cg_i64(cg, 0), nkb, "kb");
    LLVMValueRef pc = LLVMBuildMul(b, lk.iv, cg_i64(cg, KC), "");
    LLVMValueRef kc = cg_min_i64(f, cg_i64(cg, KC), LLVMBuildSub(b, d.k, pc, ""));
    LLVMValueRef accumulate = LLVMBuildICmp(b, LLVMIntSGT, lk.iv, cg_i64(cg, 0), "");
    LLVMValueRef aptr = at ? cg_addr(f, IR_F32, aptr0, LLVMBuildAdd(b, LLVMBuildMul(b, pc, d.m, ""), arow0, ""))
                           : cg_addr(f, IR_F32, aptr0, LLVMBuildAdd(b, pc, LLVMBuildMul(b, arow0, d.k, ""), ""));

    /* every panel of the item's columns packed once per k block (stays in L2) ... */
    cg_for(f, &lj, cg_i64(cg, 0), npanels, "panel");
    LLVMValueRef part = LLVMBuildSDiv(b, lj.iv, npart, ""), pj = LLVMBuildSRem(b, lj.iv, npart, "");
    LLVMValueRef j0 = LLVMBuildAdd(b, j_start, LLVMBuildMul(b, pj, cg_i64(cg, nr), ""), "");
    LLVMValueRef nc = cg_min_i64(f, cg_i64(cg, nr), LLVMBuildSub(b, j_end, j0, ""));
    LLVMValueRef bpj = cg_addr(f, IR_F32, bp, LLVMBuildMul(b, lj.iv, cg_i64(cg, KC * nr), ""));
    LLVMValueRef bcol = LLVMBuildAdd(b, j0, LLVMBuildMul(b, part, d.w, ""), ""); /* the product's column */
    LLVMValueRef pargs[7] = {bpj, bptr, ldb, pc, kc, bcol, nc};
    if (cg_q8(n)) /* int8 weights, packed dequantized (cg_llvm_q8.c) */
        cg_q8_pack(f, bpj, pc, kc, bcol, nc);
    else
        LLVMBuildCall2(b, pack_type, pack, pargs, 7, "");
    if (pack16)
        LLVMBuildCall2(b, LLVMGlobalGetValueType(pack16), pack16, (LLVMValueRef[]){bpj, kc}, 2, "");
    cg_for_end(f, &lj);

    /* ... then MC rows at a time, so that their slice of A stays in L2 across the panels */
    cg_for(f, &lm, cg_i64(cg, 0), nmc, "mc");
    LLVMValueRef ii0 = LLVMBuildAdd(b, i_start, LLVMBuildMul(b, lm.iv, cg_i64(cg, MC), ""), "");
    LLVMValueRef ii1 = cg_min_i64(f, i_end, LLVMBuildAdd(b, ii0, cg_i64(cg, MC), ""));
    LLVMValueRef ntiles = ceil_div(cg, LLVMBuildSub(b, ii1, ii0, ""), mrows);
    if (packa) { /* rows [ii0, ii1) of A, from aptr's row ii0 - arow0 */
        LLVMValueRef arows = LLVMBuildSub(b, ii0, arow0, "");
        LLVMValueRef asrc = cg_addr(f, IR_F32, aptr, at ? arows : LLVMBuildMul(b, arows, d.k, ""));
        LLVMValueRef aargs[5] = {ap, asrc, lda, LLVMBuildSub(b, ii1, ii0, ""), kc};
        LLVMBuildCall2(b, LLVMGlobalGetValueType(packa), packa, aargs, 5, "");
    }
    if (pack_at) { /* rows [ii0, ii1) of A^T's columns, from aptr's column ii0 - arow0 */
        LLVMValueRef aargs[5] = {apt, cg_addr(f, IR_F32, aptr, LLVMBuildSub(b, ii0, arow0, "")), d.m,
                                 LLVMBuildSub(b, ii1, ii0, ""), kc};
        LLVMBuildCall2(b, LLVMGlobalGetValueType(pack_at), pack_at, aargs, 5, "");
    }
    cg_for(f, &lj, cg_i64(cg, 0), npanels, "panel");
    part = LLVMBuildSDiv(b, lj.iv, npart, "");
    pj = LLVMBuildSRem(b, lj.iv, npart, "");
    j0 = LLVMBuildAdd(b, j_start, LLVMBuildMul(b, pj, cg_i64(cg, nr), ""), "");
    nc = cg_min_i64(f, cg_i64(cg, nr), LLVMBuildSub(b, j_end, j0, ""));
    bpj = cg_addr(f, IR_F32, bp, LLVMBuildMul(b, lj.iv, cg_i64(cg, KC * nr), ""));
    LLVMValueRef cptr, ldc = d.n;
    if (d.split) { /* scratch row i - i_start, column part icols + j0 - j_start */
        LLVMValueRef sc = LLVMBuildAdd(b, LLVMBuildMul(b, part, cg_i64(cg, icols), ""), LLVMBuildSub(b, j0, j_start, ""), "");
        cptr = cg_addr(f, IR_F32, scratch, sc);
        ldc = sld;
    } else {
        cptr = cg_addr(f, IR_F32, cptr0, j0);
    }
    cg_for(f, &lr, cg_i64(cg, 0), ntiles, "tile");
    LLVMValueRef i0 = LLVMBuildAdd(b, ii0, LLVMBuildMul(b, lr.iv, cg_i64(cg, mrows), ""), "");
    LLVMValueRef mr = cg_min_i64(f, cg_i64(cg, mrows), LLVMBuildSub(b, ii1, i0, ""));
    LLVMValueRef margs[12] = {aptr, lda, LLVMBuildSub(b, i0, arow0, ""), LLVMBuildSub(b, mlast, arow0, ""), kc, bpj, cptr, ldc,
                              mr, nc, accumulate};
    if (cg->bf16) { /* the packed block: pairs, rows from ii0 */
        margs[0] = ap;
        margs[1] = cg_i64(cg, KC / 2);
        margs[3] = LLVMBuildSub(b, ii1, LLVMBuildAdd(b, ii0, cg_i64(cg, 1), ""), "");
        margs[4] = ceil_div(cg, kc, 2);
        margs[11] = LLVMBuildSub(b, i0, ii0, "");
    } else if (pack_at) { /* the tile's packed values: MR rows, APAD floats a k step */
        margs[0] = cg_addr(f, IR_F32, apt, LLVMBuildMul(b, lr.iv, cg_i64(cg, KC * a_pad(cg)), ""));
        margs[1] = cg_i64(cg, a_pad(cg));
        margs[3] = LLVMBuildSub(b, mr, cg_i64(cg, 1), "");
        margs[11] = cg_i64(cg, 0);
    }
    CgIf pf;
    cg_if(f, &pf, big_c);
    prefetch_tile(f, cptr, margs[2], ldc, mr, nc);
    cg_if_end(f, &pf);
    LLVMBuildCall2(b, micro_type, micro, margs, cg->bf16 || pack_at ? 12 : 11, "");
    cg_for_end(f, &lr);
    cg_for_end(f, &lj);
    if (epi) { /* after the last k block, these MC rows of the item's columns are final and in L2 */
        CgIf last;
        cg_if(f, &last, LLVMBuildICmp(b, LLVMIntEQ, lk.iv, LLVMBuildSub(b, nkb, cg_i64(cg, 1), ""), ""));
        CgMmPart parts[2] = {{cptr0, d.n, cg_i64(cg, 0), cg_i64(cg, 0)}};
        for (int p = 0; p < 2 && d.split; p++)
            parts[p] = (CgMmPart){scratch, sld, i_start, LLVMBuildSub(b, j_start, cg_i64(cg, p * icols), "")};
        epi->fn(f, epi->ctx, bi, ii0, ii1, j_start, j_end, parts);
        cg_if_end(f, &last);
    }
    cg_for_end(f, &lm);
    cg_for_end(f, &lk);
    cg_for_end(f, &li);
    if (tb)
        cg_if_end(f, &small);
    return 0;
}

int cg_matmul_impl(CgFn *f) { return matmul_impl(f, NULL); }

int cg_matmul_impl_epilogue(CgFn *f, const CgMatmulEpilogue *epi) { return matmul_impl(f, epi); }

/* ---- the building blocks, for other kernels (cg_llvm.h) ---- */

_Static_assert(KC == CG_GEMM_KC, "cg_llvm.h: CG_GEMM_KC is the k block of the packed panels");

LLVMValueRef cg_gemm_pack(Cg *cg, int transposed) { return pack_function(cg, transposed, 0); }
LLVMValueRef cg_gemm_pack_b16(Cg *cg, int transposed) { return pack_function(cg, transposed, 1); }
LLVMValueRef cg_gemm_micro(Cg *cg) { return micro_function(cg); }
int cg_gemm_nr(Cg *cg) { return 2 * lanes(cg); }
int cg_gemm_mr(Cg *cg) { return tile_rows(cg); }
