/* cg_llvm_sort.c: the CPU lowering of the two ops that order each row of the last axis:
 *
 *   kth_largest  the k-th largest value of each row, ties counted (attn_sparse_topk's
 *                threshold): a radix select over the float's bits, four passes of 8 bits with a
 *                256-bin histogram on the stack, so no scratch memory and O(4 len) per row for
 *                any k; -inf when the row is shorter than k (nothing lies below it).
 *   entmax15     the exact sort-based 1.5-entmax of entmax 1.3 (XT-SEMANTICS.md 10): the row's
 *                (x - max) / 2 are heap-sorted into the output row itself (descending, in place,
 *                O(len log len)), the support and the threshold tau come from running sums
 *                over the sorted prefix, then the output is rewritten from the input as
 *                max((x - max) / 2 - tau, 0)^2. Masked logits (-FLT_MAX) take no part and get
 *                0; a row whose every entry is masked takes them all.
 *
 * Both follow ir/interp.c exactly (the same orders of summation), in float32. The generated code
 * is self-contained: the heap's sift-down is an internal function of the module. */
#include "cg_llvm.h"

#include <float.h>
#include <math.h>

/* rows of the last axis: items = rows, cost ~ rows * len * per_elem */
static void row_work(CgFn *f, int per_elem, LLVMValueRef *items, LLVMValueRef *cost)
{
    const IrNode *x = f->node->in[0];
    LLVMBuilderRef b = f->cg->b;
    *items = cg_dims_prod(f, x->shape, 0, x->rank - 1);
    LLVMValueRef len = cg_dim(f, x->shape[x->rank - 1]);
    *cost = LLVMBuildMul(b, *items, LLVMBuildMul(b, len, cg_i64(f->cg, per_elem), ""), "");
}

void cg_kth_largest_work(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost) { row_work(f, 4, items, cost); }

void cg_entmax15_work(CgFn *f, LLVMValueRef *items, LLVMValueRef *cost) { row_work(f, 16, items, cost); }

/* ---- kth_largest ---- */

/* float bits -> a key whose unsigned order is the float order (-0 below +0, NaN above +inf) */
static LLVMValueRef sort_key(Cg *cg, LLVMValueRef v)
{
    LLVMBuilderRef b = cg->b;
    LLVMValueRef bits = LLVMBuildBitCast(b, v, cg->t_i32, "");
    LLVMValueRef neg = LLVMBuildICmp(b, LLVMIntSLT, bits, cg_i32(cg, 0), "");
    return LLVMBuildSelect(b, neg, LLVMBuildNot(b, bits, ""), LLVMBuildXor(b, bits, cg_i32(cg, INT32_MIN), ""), "");
}

static LLVMValueRef from_key(Cg *cg, LLVMValueRef key)
{
    LLVMBuilderRef b = cg->b;
    LLVMValueRef pos = LLVMBuildICmp(b, LLVMIntSLT, key, cg_i32(cg, 0), ""); /* top bit set */
    LLVMValueRef bits = LLVMBuildSelect(b, pos, LLVMBuildXor(b, key, cg_i32(cg, INT32_MIN), ""), LLVMBuildNot(b, key, ""), "");
    return LLVMBuildBitCast(b, bits, cg->t_f32, "");
}

static LLVMValueRef hist_at(CgFn *f, LLVMValueRef hist, LLVMValueRef bin)
{
    return LLVMBuildInBoundsGEP2(f->cg->b, f->cg->t_i32, hist, &bin, 1, "");
}

/* Radix select, most significant byte first: pass p counts, among the keys whose higher bytes
 * equal the prefix chosen so far, each value of byte p; the bin holding the want-th largest
 * becomes byte p of the prefix, and want drops by the keys in the bins above it. */
int cg_kth_largest_impl(CgFn *f)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node, *x = n->in[0];
    LLVMValueRef len = cg_dim(f, x->shape[x->rank - 1]);
    LLVMValueRef k = cg_i64(cg, n->ia[IR_IA_K]);
    LLVMValueRef hist = cg_var(f, LLVMArrayType(cg->t_i32, 256), NULL, "hist");
    LLVMValueRef prefix = cg_var(f, cg->t_i32, NULL, "prefix");
    LLVMValueRef want = cg_var(f, cg->t_i64, NULL, "want");
    LLVMValueRef above = cg_var(f, cg->t_i64, NULL, "above");
    LLVMValueRef sel = cg_var(f, cg->t_i32, NULL, "sel");
    LLVMValueRef found = cg_var(f, cg->t_i1, NULL, "found");
    CgLoop lr;
    cg_for(f, &lr, f->lo, f->hi, "row");
    cg_store(f, IR_F32, f->out, lr.iv, cg_f32(cg, -INFINITY));
    CgIf fits;
    cg_if(f, &fits, LLVMBuildICmp(b, LLVMIntSLE, k, len, ""));
    LLVMValueRef base = LLVMBuildMul(b, lr.iv, len, "");
    LLVMBuildStore(b, cg_i32(cg, 0), prefix);
    LLVMBuildStore(b, k, want);
    for (int pass = 0; pass < 4; pass++) {
        int shift = 24 - 8 * pass;
        CgLoop lh, lj;
        cg_for(f, &lh, cg_i64(cg, 0), cg_i64(cg, 256), "bin");
        LLVMBuildStore(b, cg_i32(cg, 0), hist_at(f, hist, lh.iv));
        cg_for_end(f, &lh);
        cg_for(f, &lj, cg_i64(cg, 0), len, "j");
        LLVMValueRef key = sort_key(cg, cg_load(f, IR_F32, f->in[0], LLVMBuildAdd(b, base, lj.iv, "")));
        LLVMValueRef match = LLVMConstInt(cg->t_i1, 1, 0);
        if (pass > 0)
            match = LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildLShr(b, key, cg_i32(cg, shift + 8), ""),
                                  cg_get(f, cg->t_i32, prefix), "");
        LLVMValueRef bin = LLVMBuildAnd(b, LLVMBuildLShr(b, key, cg_i32(cg, shift), ""), cg_i32(cg, 255), "");
        LLVMValueRef slot = hist_at(f, hist, LLVMBuildZExt(b, bin, cg->t_i64, ""));
        LLVMValueRef count = LLVMBuildLoad2(b, cg->t_i32, slot, "");
        LLVMBuildStore(b, LLVMBuildAdd(b, count, LLVMBuildZExt(b, match, cg->t_i32, ""), ""), slot);
        cg_for_end(f, &lj);
        /* from bin 255 down: the first bin that takes the running count to want */
        LLVMBuildStore(b, cg_i64(cg, 0), above);
        LLVMBuildStore(b, cg_i32(cg, 0), sel);
        LLVMBuildStore(b, LLVMConstInt(cg->t_i1, 0, 0), found);
        cg_for(f, &lh, cg_i64(cg, 0), cg_i64(cg, 256), "t");
        LLVMValueRef bin64 = LLVMBuildSub(b, cg_i64(cg, 255), lh.iv, "");
        LLVMValueRef h = LLVMBuildZExt(b, LLVMBuildLoad2(b, cg->t_i32, hist_at(f, hist, bin64), ""), cg->t_i64, "");
        LLVMValueRef a = cg_get(f, cg->t_i64, above), fd = cg_get(f, cg->t_i1, found);
        LLVMValueRef ah = LLVMBuildAdd(b, a, h, "");
        LLVMValueRef take = LLVMBuildAnd(b, LLVMBuildNot(b, fd, ""),
                                         LLVMBuildICmp(b, LLVMIntSGE, ah, cg_get(f, cg->t_i64, want), ""), "");
        LLVMValueRef done = LLVMBuildOr(b, fd, take, "");
        LLVMBuildStore(b, LLVMBuildSelect(b, take, LLVMBuildTrunc(b, bin64, cg->t_i32, ""), cg_get(f, cg->t_i32, sel), ""), sel);
        LLVMBuildStore(b, LLVMBuildSelect(b, done, a, ah, ""), above);
        LLVMBuildStore(b, done, found);
        cg_for_end(f, &lh);
        LLVMBuildStore(b, LLVMBuildSub(b, cg_get(f, cg->t_i64, want), cg_get(f, cg->t_i64, above), ""), want);
        LLVMValueRef p = LLVMBuildShl(b, cg_get(f, cg->t_i32, prefix), cg_i32(cg, 8), "");
        LLVMBuildStore(b, LLVMBuildOr(b, pass ? p : cg_i32(cg, 0), cg_get(f, cg->t_i32, sel), ""), prefix);
    }
    cg_store(f, IR_F32, f->out, lr.iv, from_key(cg, cg_get(f, cg->t_i32, prefix)));
    cg_if_end(f, &fits);
    cg_for_end(f, &lr);
    return 0;
}

/* ---- entmax15 ---- */

/* xtc_sift_down_min(a, root, end): restores the min-heap a[0, end) below root. Emitted once
 * per module (internal). */
static LLVMValueRef sift_down_fn(Cg *cg, LLVMTypeRef *type)
{
    static const char name[] = "xtc_sift_down_min";
    LLVMTypeRef params[3] = {cg->t_ptr, cg->t_i64, cg->t_i64};
    *type = LLVMFunctionType(cg->t_void, params, 3, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(cg->mod, name);
    if (fn)
        return fn;
    LLVMBuilderRef b = cg->b;
    LLVMBasicBlockRef saved = LLVMGetInsertBlock(b);
    fn = cg_function(cg, name, *type, 1);
    LLVMValueRef a = LLVMGetParam(fn, 0), root0 = LLVMGetParam(fn, 1), end = LLVMGetParam(fn, 2);
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(cg->ctx, fn, "entry");
    LLVMBasicBlockRef loop = LLVMAppendBasicBlockInContext(cg->ctx, fn, "loop");
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(cg->ctx, fn, "body");
    LLVMBasicBlockRef swap = LLVMAppendBasicBlockInContext(cg->ctx, fn, "swap");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(cg->ctx, fn, "done");
    LLVMPositionBuilderAtEnd(b, entry);
    LLVMBuildBr(b, loop);

    LLVMPositionBuilderAtEnd(b, loop);
    LLVMValueRef root = LLVMBuildPhi(b, cg->t_i64, "root");
    LLVMValueRef child = LLVMBuildNSWAdd(b, LLVMBuildNSWMul(b, root, cg_i64(cg, 2), ""), cg_i64(cg, 1), "child");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, child, end, ""), body, done);

    LLVMPositionBuilderAtEnd(b, body);
    LLVMValueRef right = LLVMBuildNSWAdd(b, child, cg_i64(cg, 1), "");
    LLVMValueRef has_right = LLVMBuildICmp(b, LLVMIntSLT, right, end, "");
    LLVMValueRef r = LLVMBuildSelect(b, has_right, right, child, "");
    LLVMValueRef vc = LLVMBuildLoad2(b, cg->t_f32, LLVMBuildInBoundsGEP2(b, cg->t_f32, a, &child, 1, ""), "");
    LLVMValueRef vr = LLVMBuildLoad2(b, cg->t_f32, LLVMBuildInBoundsGEP2(b, cg->t_f32, a, &r, 1, ""), "");
    LLVMValueRef pick = LLVMBuildAnd(b, has_right, LLVMBuildFCmp(b, LLVMRealOLT, vr, vc, ""), "");
    LLVMValueRef small = LLVMBuildSelect(b, pick, right, child, "small");
    LLVMValueRef vs = LLVMBuildSelect(b, pick, vr, vc, "");
    LLVMValueRef proot = LLVMBuildInBoundsGEP2(b, cg->t_f32, a, &root, 1, "");
    LLVMValueRef vroot = LLVMBuildLoad2(b, cg->t_f32, proot, "");
    LLVMBuildCondBr(b, LLVMBuildFCmp(b, LLVMRealOLT, vs, vroot, ""), swap, done);

    LLVMPositionBuilderAtEnd(b, swap);
    LLVMBuildStore(b, vs, proot);
    LLVMBuildStore(b, vroot, LLVMBuildInBoundsGEP2(b, cg->t_f32, a, &small, 1, ""));
    LLVMBuildBr(b, loop);
    LLVMValueRef in_vals[2] = {root0, small};
    LLVMBasicBlockRef in_blocks[2] = {entry, swap};
    LLVMAddIncoming(root, in_vals, in_blocks, 2);

    LLVMPositionBuilderAtEnd(b, done);
    LLVMBuildRetVoid(b);
    LLVMPositionBuilderAtEnd(b, saved);
    return fn;
}

/* sorts a[0, cnt) descending: heapify as a min-heap, then move each minimum to the end */
static void heap_sort_desc(CgFn *f, LLVMValueRef a, LLVMValueRef cnt)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    LLVMTypeRef type;
    LLVMValueRef sift = sift_down_fn(cg, &type);
    LLVMValueRef half = LLVMBuildSDiv(b, cnt, cg_i64(cg, 2), "");
    CgLoop l;
    cg_for(f, &l, cg_i64(cg, 0), half, "heapify");
    LLVMValueRef args[3] = {a, LLVMBuildSub(b, LLVMBuildSub(b, half, cg_i64(cg, 1), ""), l.iv, ""), cnt};
    LLVMBuildCall2(b, type, sift, args, 3, "");
    cg_for_end(f, &l);
    cg_for(f, &l, cg_i64(cg, 1), cnt, "extract");
    LLVMValueRef end = LLVMBuildSub(b, cnt, l.iv, ""); /* cnt-1 .. 1 */
    LLVMValueRef p0 = LLVMBuildInBoundsGEP2(b, cg->t_f32, a, (LLVMValueRef[]){cg_i64(cg, 0)}, 1, "");
    LLVMValueRef pe = LLVMBuildInBoundsGEP2(b, cg->t_f32, a, &end, 1, "");
    LLVMValueRef v0 = LLVMBuildLoad2(b, cg->t_f32, p0, ""), ve = LLVMBuildLoad2(b, cg->t_f32, pe, "");
    LLVMBuildStore(b, ve, p0);
    LLVMBuildStore(b, v0, pe);
    LLVMValueRef args2[3] = {a, cg_i64(cg, 0), end};
    LLVMBuildCall2(b, type, sift, args2, 3, "");
    cg_for_end(f, &l);
}

/* Running sums over the sorted prefix xs[0, upto): the support count (the prefixes rho with
 * tau_rho <= xs[rho-1]) into *support when it is non-NULL, and the last prefix's tau. */
static LLVMValueRef tau_scan(CgFn *f, LLVMValueRef xs, LLVMValueRef upto, LLVMValueRef support)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    LLVMValueRef sum = cg_var(f, cg->t_f32, cg_f32(cg, 0), "sum");
    LLVMValueRef sum_sq = cg_var(f, cg->t_f32, cg_f32(cg, 0), "sum_sq");
    LLVMValueRef tau = cg_var(f, cg->t_f32, cg_f32(cg, 0), "tau");
    if (support)
        LLVMBuildStore(b, cg_i64(cg, 0), support);
    CgLoop l;
    cg_for(f, &l, cg_i64(cg, 0), upto, "rho");
    LLVMValueRef v = cg_load(f, IR_F32, xs, l.iv);
    LLVMValueRef rho = LLVMBuildSIToFP(b, LLVMBuildAdd(b, l.iv, cg_i64(cg, 1), ""), cg->t_f32, "");
    LLVMValueRef s = LLVMBuildFAdd(b, cg_get(f, cg->t_f32, sum), v, "");
    LLVMValueRef s2 = LLVMBuildFAdd(b, cg_get(f, cg->t_f32, sum_sq), LLVMBuildFMul(b, v, v, ""), "");
    LLVMBuildStore(b, s, sum);
    LLVMBuildStore(b, s2, sum_sq);
    LLVMValueRef mean = LLVMBuildFDiv(b, s, rho, ""), mean_sq = LLVMBuildFDiv(b, s2, rho, "");
    LLVMValueRef ss = LLVMBuildFMul(b, rho, LLVMBuildFSub(b, mean_sq, LLVMBuildFMul(b, mean, mean, ""), ""), "");
    LLVMValueRef delta = LLVMBuildFDiv(b, LLVMBuildFSub(b, cg_f32(cg, 1), ss, ""), rho, "");
    delta = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, delta, cg_f32(cg, 0), ""), delta, cg_f32(cg, 0), "");
    LLVMValueRef t = LLVMBuildFSub(b, mean, cg_intrinsic(cg, "llvm.sqrt", cg->t_f32, &delta, 1), "");
    LLVMBuildStore(b, t, tau);
    if (support) {
        LLVMValueRef in = LLVMBuildZExt(b, LLVMBuildFCmp(b, LLVMRealOLE, t, v, ""), cg->t_i64, "");
        LLVMBuildStore(b, LLVMBuildAdd(b, cg_get(f, cg->t_i64, support), in, ""), support);
    }
    cg_for_end(f, &l);
    return cg_get(f, cg->t_f32, tau);
}

int cg_entmax15_impl(CgFn *f)
{
    Cg *cg = f->cg;
    LLVMBuilderRef b = cg->b;
    const IrNode *n = f->node;
    LLVMValueRef len = cg_dim(f, n->shape[n->rank - 1]);
    LLVMValueRef fill = cg_f32(cg, -FLT_MAX);
    LLVMValueRef na = cg_var(f, cg->t_i64, NULL, "active");
    LLVMValueRef mx = cg_var(f, cg->t_f32, NULL, "max");
    LLVMValueRef cnt = cg_var(f, cg->t_i64, NULL, "count");
    LLVMValueRef support = cg_var(f, cg->t_i64, NULL, "support");
    CgLoop lr, lj;
    cg_for(f, &lr, f->lo, f->hi, "row");
    LLVMValueRef base = LLVMBuildMul(b, lr.iv, len, "");
    LLVMValueRef x = LLVMBuildInBoundsGEP2(b, cg->t_f32, f->in[0], &base, 1, "x");
    LLVMValueRef y = LLVMBuildInBoundsGEP2(b, cg->t_f32, f->out, &base, 1, "y");
    /* the entries that take part: those above -FLT_MAX, or all when there are none */
    LLVMBuildStore(b, cg_i64(cg, 0), na);
    LLVMBuildStore(b, cg_f32(cg, -INFINITY), mx);
    cg_for(f, &lj, cg_i64(cg, 0), len, "j");
    LLVMValueRef v = cg_load(f, IR_F32, x, lj.iv);
    LLVMValueRef act = LLVMBuildFCmp(b, LLVMRealOGT, v, fill, "");
    LLVMBuildStore(b, LLVMBuildAdd(b, cg_get(f, cg->t_i64, na), LLVMBuildZExt(b, act, cg->t_i64, ""), ""), na);
    LLVMValueRef m = cg_get(f, cg->t_f32, mx);
    LLVMBuildStore(b, LLVMBuildSelect(b, act, cg_fmax(cg, m, v), m, ""), mx);
    cg_for_end(f, &lj);
    LLVMValueRef all = LLVMBuildICmp(b, LLVMIntEQ, cg_get(f, cg->t_i64, na), cg_i64(cg, 0), "all");
    CgIf every;
    cg_if(f, &every, all);
    LLVMBuildStore(b, cg_f32(cg, -INFINITY), mx);
    cg_for(f, &lj, cg_i64(cg, 0), len, "j");
    LLVMBuildStore(b, cg_fmax(cg, cg_get(f, cg->t_f32, mx), cg_load(f, IR_F32, x, lj.iv)), mx);
    cg_for_end(f, &lj);
    cg_if_end(f, &every);
    m = cg_get(f, cg->t_f32, mx);
    /* (x - max) / 2 of those, into the output row, sorted descending */
    LLVMBuildStore(b, cg_i64(cg, 0), cnt);
    cg_for(f, &lj, cg_i64(cg, 0), len, "j");
    v = cg_load(f, IR_F32, x, lj.iv);
    CgIf take;
    cg_if(f, &take, LLVMBuildOr(b, all, LLVMBuildFCmp(b, LLVMRealOGT, v, fill, ""), ""));
    LLVMValueRef c = cg_get(f, cg->t_i64, cnt);
    cg_store(f, IR_F32, y, c, LLVMBuildFMul(b, LLVMBuildFSub(b, v, m, ""), cg_f32(cg, 0.5), ""));
    LLVMBuildStore(b, LLVMBuildAdd(b, c, cg_i64(cg, 1), ""), cnt);
    cg_if_end(f, &take);
    cg_for_end(f, &lj);
    LLVMValueRef count = cg_get(f, cg->t_i64, cnt);
    heap_sort_desc(f, y, count);
    /* the support, then tau at it (the same sums again, so the same float value) */
    tau_scan(f, y, count, support);
    LLVMValueRef tau = tau_scan(f, y, cg_get(f, cg->t_i64, support), NULL);
    cg_for(f, &lj, cg_i64(cg, 0), len, "j");
    v = cg_load(f, IR_F32, x, lj.iv);
    LLVMValueRef d = LLVMBuildFSub(b, LLVMBuildFMul(b, LLVMBuildFSub(b, v, m, ""), cg_f32(cg, 0.5), ""), tau, "");
    LLVMValueRef keep = LLVMBuildAnd(b, LLVMBuildOr(b, all, LLVMBuildFCmp(b, LLVMRealOGT, v, fill, ""), ""),
                                     LLVMBuildFCmp(b, LLVMRealOGT, d, cg_f32(cg, 0), ""), "");
    cg_store(f, IR_F32, y, lj.iv, LLVMBuildSelect(b, keep, LLVMBuildFMul(b, d, d, ""), cg_f32(cg, 0), ""));
    cg_for_end(f, &lj);
    cg_for_end(f, &lr);
    return 0;
}
