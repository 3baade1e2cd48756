/* cg_llvm.c: the LLVM CPU backend.
 *
 * render:  CgPlan -> LLVM modules (one, or parts for large plans: CgUnit): per kernel signature
 *          an impl/body/kernel triple (cg_llvm.h), the `run` function stepping through a table
 *          of the schedule's kernel calls, and the exported `xtc_module_v1` object holding the
 *          metadata text and the source (rt_abi.h).
 * compile: per part, in parallel threads, the new pass manager ("default<On>") and an object
 *          file for the host CPU (or --cpu); then `cc -shared` links them (the only external
 *          program, for the link step only).
 *
 * All of it goes through the LLVM C API; each compile has its own LLVMContext, so several
 * compiles may run in several threads. */
#include "cg_llvm.h"
#include "rt_abi.h"
#include "rt_fileio.h"

#include <llvm-c/Analysis.h>
#include <llvm-c/BitWriter.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


/* Below this many elements of work a kernel runs on the calling thread alone. */
#define PARALLEL_MIN_COST 16384

/* The thread pool's context: out, the IR_MAXIN operands, syms, the status word, the threads. */
enum { CTX_OUT, CTX_IN0, CTX_SYMS = CTX_IN0 + IR_MAXIN, CTX_STATUS, CTX_THREADS, CTX_SLOTS };
/* Parameters: impl(out, in[IR_MAXIN], syms, lo, hi, threads), kernel(out, in[IR_MAXIN], syms, rt).
 * threads: the session's thread count, which the kernel's work function saw too (a kernel may
 * cut its work into more items when there are more threads; impl must cut it the same way). */
enum { P_OUT, P_IN0, P_SYMS = P_IN0 + IR_MAXIN, P_LO, P_HI, P_THREADS, P_IMPL_N, P_RT = P_LO, P_KERNEL_N = P_RT + 1 };

_Static_assert(IR_MAXIN <= XTC_ABI_MAXIN, "the metadata's step records carry at most XTC_ABI_MAXIN operands");

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static pthread_once_t llvm_once = PTHREAD_ONCE_INIT;
static int llvm_init_failed;

static void llvm_init(void)
{
    llvm_init_failed = LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter();
}

/* ---- attributes ---- */

void cg_attr(Cg *cg, LLVMValueRef fn, unsigned idx, const char *name)
{
    unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
    LLVMAddAttributeAtIndex(fn, idx, LLVMCreateEnumAttribute(cg->ctx, kind, 0));
}

static void add_str_attr(Cg *cg, LLVMValueRef fn, const char *key, const char *value)
{
    LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
                            LLVMCreateStringAttribute(cg->ctx, key, (unsigned)strlen(key), value, (unsigned)strlen(value)));
}

LLVMValueRef cg_function(Cg *cg, const char *name, LLVMTypeRef type, int internal)
{
    LLVMValueRef fn = LLVMAddFunction(cg->mod, name, type);
    if (internal)
        LLVMSetLinkage(fn, LLVMInternalLinkage);
    cg_attr(cg, fn, LLVMAttributeFunctionIndex, "nounwind");
    add_str_attr(cg, fn, "target-cpu", cg->cpu);
    if (cg->features && cg->features[0])
        add_str_attr(cg, fn, "target-features", cg->features);
    /* divisions marked reciprocal (arcp) may use the vector estimate and one Newton step */
    add_str_attr(cg, fn, "reciprocal-estimates", "vec-divf:1");
    if (cg->vec == 16) {
        add_str_attr(cg, fn, "prefer-vector-width", "512");
        add_str_attr(cg, fn, "min-legal-vector-width", "512");
    }
    return fn;
}

/* ---- one kernel: impl, body, kernel ---- */

static int emit_kernel(Cg *cg, const CgKernel *k)
{
    const IrNode *n = k->node;
    const CgLower *L = cg_llvm_lowering(n->op);
    if (!L || !L->impl)
        return cg_error(cg, "the LLVM backend has no lowering for op '%s' (node %%%s)", ir_ops[n->op].name,
                        n->label ? n->label : "?");
    LLVMBuilderRef b = cg->b;
    char name[96];

    /* impl(out, in0 .. in[IR_MAXIN-1], syms, lo, hi, threads) -> status */
    snprintf(name, sizeof name, "%s_impl", k->fn);
    LLVMValueRef impl = cg_function(cg, name, cg->t_impl, 1);
    for (unsigned i = 1 + P_OUT; i <= P_IN0 + IR_MAXIN; i++)
        cg_attr(cg, impl, i, "noalias");
    CgFn f = {.cg = cg, .node = n, .fn = impl, .views = k->views};
    f.entry = LLVMAppendBasicBlockInContext(cg->ctx, impl, "entry");
    LLVMPositionBuilderAtEnd(b, f.entry);
    f.out = LLVMGetParam(impl, P_OUT);
    for (int i = 0; i < IR_MAXIN; i++)
        f.in[i] = LLVMGetParam(impl, P_IN0 + (unsigned)i);
    for (int i = 0; i < n->nin; i++) { /* the storage is in the kernel's signature (cg_plan.c) */
        int ib = cg->plan->buf_of[n->in[i]->id];
        f.in_bf16[i] = ib >= 0 && cg->plan->storage && cg->plan->storage[ib] == 1;
        f.in_i8[i] = ib >= 0 && cg->plan->storage && cg->plan->storage[ib] == CG_STORE_INT8_ROWS;
    }
    int ob = cg->plan->buf_of[n->id];
    f.out_bf16 = ob >= 0 && cg->plan->storage && cg->plan->storage[ob] == 1;
    f.out_i8 = ob >= 0 && cg->plan->storage && cg->plan->storage[ob] == CG_STORE_INT8_ROWS;
    f.syms = LLVMGetParam(impl, P_SYMS);
    f.lo = LLVMGetParam(impl, P_LO);
    f.hi = LLVMGetParam(impl, P_HI);
    f.threads = LLVMGetParam(impl, P_THREADS);
    f.status = cg_var(&f, cg->t_i32, cg_i32(cg, 0), "status");
    if (L->impl(&f) < 0)
        return -1;
    LLVMBuildRet(b, LLVMBuildLoad2(b, cg->t_i32, f.status, ""));

    /* body(ctx, lo, hi): what the thread pool runs */
    snprintf(name, sizeof name, "%s_body", k->fn);
    LLVMValueRef body = cg_function(cg, name, cg->t_body, 1);
    LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(cg->ctx, body, "entry"));
    LLVMValueRef ctx = LLVMGetParam(body, 0);
    LLVMValueRef args[P_IMPL_N];
    for (int i = 0; i <= P_SYMS; i++) { /* ctx slots and impl parameters agree up to syms */
        LLVMValueRef idx = cg_i64(cg, i);
        args[i] = LLVMBuildLoad2(b, cg->t_ptr, LLVMBuildGEP2(b, cg->t_i64, ctx, &idx, 1, ""), "");
    }
    args[P_LO] = LLVMGetParam(body, 1);
    args[P_HI] = LLVMGetParam(body, 2);
    LLVMValueRef tidx = cg_i64(cg, CTX_THREADS);
    args[P_THREADS] = LLVMBuildLoad2(b, cg->t_i64, LLVMBuildGEP2(b, cg->t_i64, ctx, &tidx, 1, ""), "threads");
    LLVMValueRef st = LLVMBuildCall2(b, cg->t_impl, impl, args, P_IMPL_N, "");
    LLVMBasicBlockRef bad = LLVMAppendBasicBlockInContext(cg->ctx, body, "failed");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(cg->ctx, body, "done");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntNE, st, cg_i32(cg, 0), ""), bad, done);
    LLVMPositionBuilderAtEnd(b, bad);
    LLVMValueRef sidx = cg_i64(cg, CTX_STATUS);
    LLVMValueRef store = LLVMBuildStore(b, st, LLVMBuildGEP2(b, cg->t_i64, ctx, &sidx, 1, ""));
    LLVMSetOrdering(store, LLVMAtomicOrderingMonotonic);
    LLVMSetAlignment(store, 4);
    LLVMBuildBr(b, done);
    LLVMPositionBuilderAtEnd(b, done);
    LLVMBuildRetVoid(b);

    /* kernel(out, in0 .. in[IR_MAXIN-1], syms, rt) -> status */
    LLVMValueRef kfn = cg_function(cg, k->fn, cg->t_kernel, !cg->split);
    if (cg->split) /* called from part 0's schedule, in another object of the same library */
        LLVMSetVisibility(kfn, LLVMHiddenVisibility);
    CgFn kf = {.cg = cg, .node = n, .fn = kfn, .views = k->views};
    kf.entry = LLVMAppendBasicBlockInContext(cg->ctx, kfn, "entry");
    LLVMPositionBuilderAtEnd(b, kf.entry);
    kf.out = LLVMGetParam(kfn, P_OUT);
    for (int i = 0; i < IR_MAXIN; i++)
        kf.in[i] = LLVMGetParam(kfn, P_IN0 + (unsigned)i);
    kf.syms = LLVMGetParam(kfn, P_SYMS);
    LLVMValueRef rt = LLVMGetParam(kfn, P_RT);
    LLVMValueRef nthreads = LLVMBuildLoad2(b, cg->t_i64, LLVMBuildStructGEP2(b, cg->t_rtapi, rt, 2, ""), "nthreads");
    kf.threads = nthreads;
    LLVMValueRef items = cg_i64(cg, 1), cost = cg_i64(cg, 1);
    if (L->work)
        L->work(&kf, &items, &cost);
    LLVMValueRef par = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSGT, nthreads, cg_i64(cg, 1), ""),
                                    LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSGT, items, cg_i64(cg, 1), ""),
                                                 LLVMBuildICmp(b, LLVMIntSGE, cost, cg_i64(cg, PARALLEL_MIN_COST), ""), ""),
                                    "");
    LLVMBasicBlockRef threaded = LLVMAppendBasicBlockInContext(cg->ctx, kfn, "threaded");
    LLVMBasicBlockRef direct = LLVMAppendBasicBlockInContext(cg->ctx, kfn, "direct");
    LLVMValueRef slots = cg_var(&kf, LLVMArrayType(cg->t_i64, CTX_SLOTS), NULL, "ctx");
    LLVMBuildCondBr(b, par, threaded, direct);

    LLVMPositionBuilderAtEnd(b, threaded);
    LLVMValueRef vals[CTX_SYMS + 1];
    vals[CTX_OUT] = kf.out;
    for (int i = 0; i < IR_MAXIN; i++)
        vals[CTX_IN0 + i] = kf.in[i];
    vals[CTX_SYMS] = kf.syms;
    for (int i = 0; i <= CTX_SYMS; i++) {
        LLVMValueRef idx = cg_i64(cg, i);
        LLVMBuildStore(b, vals[i], LLVMBuildGEP2(b, cg->t_i64, slots, &idx, 1, ""));
    }
    LLVMValueRef sptr = LLVMBuildGEP2(b, cg->t_i64, slots, &sidx, 1, "");
    LLVMBuildStore(b, cg_i64(cg, 0), sptr);
    LLVMValueRef thr_idx = cg_i64(cg, CTX_THREADS);
    LLVMBuildStore(b, nthreads, LLVMBuildGEP2(b, cg->t_i64, slots, &thr_idx, 1, ""));
    LLVMValueRef pool = LLVMBuildLoad2(b, cg->t_ptr, LLVMBuildStructGEP2(b, cg->t_rtapi, rt, 0, ""), "pool");
    LLVMValueRef pfor = LLVMBuildLoad2(b, cg->t_ptr, LLVMBuildStructGEP2(b, cg->t_rtapi, rt, 1, ""), "parallel_for");
    LLVMTypeRef pfor_params[4] = {cg->t_ptr, cg->t_ptr, cg->t_ptr, cg->t_i64};
    LLVMTypeRef pfor_type = LLVMFunctionType(cg->t_void, pfor_params, 4, 0);
    LLVMValueRef pargs[4] = {pool, body, slots, items};
    LLVMBuildCall2(b, pfor_type, pfor, pargs, 4, "");
    LLVMValueRef pst = LLVMBuildLoad2(b, cg->t_i32, sptr, "");
    LLVMSetOrdering(pst, LLVMAtomicOrderingMonotonic);
    LLVMSetAlignment(pst, 4);
    LLVMBuildRet(b, pst);

    LLVMPositionBuilderAtEnd(b, direct);
    LLVMValueRef dargs[P_IMPL_N];
    dargs[P_OUT] = kf.out;
    for (int i = 0; i < IR_MAXIN; i++)
        dargs[P_IN0 + i] = kf.in[i];
    dargs[P_SYMS] = kf.syms;
    dargs[P_LO] = cg_i64(cg, 0);
    dargs[P_HI] = items;
    dargs[P_THREADS] = nthreads;
    LLVMBuildRet(b, LLVMBuildCall2(b, cg->t_impl, impl, dargs, P_IMPL_N, ""));
    return 0;
}

/* run(bufs, syms, rt): the schedule, as a loop over a constant table of steps (kernel, out and
 * input buffer ids, -1 for none); after each step, rt->step_done(rt->hook_ctx, step) if set.
 * A loop, not one call per step written out: the kernels' entry points are then not inlined at
 * every step, which made this function most of a training module's IR and of its compile time. */
static LLVMValueRef emit_run(Cg *cg, LLVMValueRef *kernels)
{
    const CgPlan *p = cg->plan;
    LLVMBuilderRef b = cg->b;
    LLVMValueRef run = cg_function(cg, "xtc_run", cg->t_run, 1);
    LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(cg->ctx, run, "entry"));
    if (p->nsteps == 0) {
        LLVMBuildRet(b, cg_i32(cg, 0));
        return run;
    }
    enum { NIDS = 1 + IR_MAXIN };
    LLVMTypeRef ids_t = LLVMArrayType(cg->t_i32, NIDS);
    LLVMTypeRef fields[2] = {cg->t_ptr, ids_t};
    LLVMTypeRef step_t = LLVMStructTypeInContext(cg->ctx, fields, 2, 0);
    LLVMValueRef *rows = calloc((size_t)p->nsteps, sizeof *rows);
    if (!rows) {
        cg_error(cg, "out of memory");
        return NULL;
    }
    for (int s = 0; s < p->nsteps; s++) {
        const CgStep *st = &p->steps[s];
        LLVMValueRef ids[NIDS];
        ids[P_OUT] = cg_i32(cg, st->out);
        for (int i = 0; i < IR_MAXIN; i++)
            ids[P_IN0 + i] = cg_i32(cg, st->in[i] < 0 ? -1 : st->in[i]);
        LLVMValueRef row[2] = {kernels[st->kernel], LLVMConstArray2(cg->t_i32, ids, NIDS)};
        rows[s] = LLVMConstNamedStruct(step_t, row, 2);
    }
    LLVMValueRef table = LLVMAddGlobal(cg->mod, LLVMArrayType2(step_t, (uint64_t)p->nsteps), "xtc_steps");
    LLVMSetInitializer(table, LLVMConstArray2(step_t, rows, (uint64_t)p->nsteps));
    LLVMSetGlobalConstant(table, 1);
    LLVMSetLinkage(table, LLVMPrivateLinkage);
    free(rows);

    LLVMValueRef bufs = LLVMGetParam(run, 0), syms = LLVMGetParam(run, 1), rt = LLVMGetParam(run, 2);
    LLVMValueRef hook = LLVMBuildLoad2(b, cg->t_ptr, LLVMBuildStructGEP2(b, cg->t_rtapi, rt, 3, ""), "step_done");
    LLVMValueRef hook_ctx = LLVMBuildLoad2(b, cg->t_ptr, LLVMBuildStructGEP2(b, cg->t_rtapi, rt, 4, ""), "hook_ctx");
    LLVMValueRef has_hook = LLVMBuildICmp(b, LLVMIntNE, hook, LLVMConstPointerNull(cg->t_ptr), "");
    LLVMTypeRef hook_params[2] = {cg->t_ptr, cg->t_i32};
    LLVMTypeRef hook_type = LLVMFunctionType(cg->t_void, hook_params, 2, 0);
    LLVMBasicBlockRef entry = LLVMGetInsertBlock(b);
    LLVMBasicBlockRef loop = LLVMAppendBasicBlockInContext(cg->ctx, run, "step");
    LLVMBasicBlockRef fail = LLVMAppendBasicBlockInContext(cg->ctx, run, "fail");
    LLVMBasicBlockRef next = LLVMAppendBasicBlockInContext(cg->ctx, run, "next");
    LLVMBasicBlockRef call_hook = LLVMAppendBasicBlockInContext(cg->ctx, run, "hook");
    LLVMBasicBlockRef after = LLVMAppendBasicBlockInContext(cg->ctx, run, "after");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(cg->ctx, run, "done");
    LLVMBuildBr(b, loop);

    LLVMPositionBuilderAtEnd(b, loop);
    LLVMValueRef s = LLVMBuildPhi(b, cg->t_i32, "s");
    LLVMValueRef zero = cg_i32(cg, 0);
    LLVMAddIncoming(s, &zero, &entry, 1);
    LLVMValueRef s64 = LLVMBuildZExt(b, s, cg->t_i64, "");
    LLVMValueRef at[2] = {cg_i64(cg, 0), s64};
    LLVMValueRef row = LLVMBuildInBoundsGEP2(b, LLVMArrayType2(step_t, (uint64_t)p->nsteps), table, at, 2, "");
    LLVMValueRef fn = LLVMBuildLoad2(b, cg->t_ptr, LLVMBuildStructGEP2(b, step_t, row, 0, ""), "kernel");
    LLVMValueRef ids = LLVMBuildStructGEP2(b, step_t, row, 1, "");
    LLVMValueRef args[P_KERNEL_N];
    for (int i = 0; i < NIDS; i++) {
        /* a missing operand (-1) passes NULL; bufs[0] is read in its place, then dropped */
        LLVMValueRef ii[2] = {cg_i64(cg, 0), cg_i64(cg, i)};
        LLVMValueRef id = LLVMBuildLoad2(b, cg->t_i32, LLVMBuildInBoundsGEP2(b, ids_t, ids, ii, 2, ""), "");
        LLVMValueRef none = LLVMBuildICmp(b, LLVMIntSLT, id, zero, "");
        LLVMValueRef idx = LLVMBuildZExt(b, LLVMBuildSelect(b, none, zero, id, ""), cg->t_i64, "");
        LLVMValueRef buf = LLVMBuildLoad2(b, cg->t_ptr, LLVMBuildGEP2(b, cg->t_ptr, bufs, &idx, 1, ""), "");
        args[i] = LLVMBuildSelect(b, none, LLVMConstPointerNull(cg->t_ptr), buf, "");
    }
    args[P_SYMS] = syms;
    args[P_RT] = rt;
    LLVMValueRef r = LLVMBuildCall2(b, cg->t_kernel, fn, args, P_KERNEL_N, "");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntNE, r, zero, ""), fail, next);

    LLVMPositionBuilderAtEnd(b, fail);
    LLVMBuildRet(b, LLVMBuildAdd(b, s, cg_i32(cg, 1), "code"));

    LLVMPositionBuilderAtEnd(b, next);
    LLVMBuildCondBr(b, has_hook, call_hook, after);
    LLVMPositionBuilderAtEnd(b, call_hook);
    LLVMValueRef hargs[2] = {hook_ctx, s};
    LLVMBuildCall2(b, hook_type, hook, hargs, 2, "");
    LLVMBuildBr(b, after);

    LLVMPositionBuilderAtEnd(b, after);
    LLVMValueRef s1 = LLVMBuildAdd(b, s, cg_i32(cg, 1), "");
    LLVMAddIncoming(s, &s1, &after, 1);
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, s1, cg_i32(cg, p->nsteps), ""), loop, done);
    LLVMPositionBuilderAtEnd(b, done);
    LLVMBuildRet(b, zero);
    return run;
}

static LLVMValueRef const_string(Cg *cg, const char *s, const char *name)
{
    size_t len = strlen(s);
    LLVMValueRef init = LLVMConstStringInContext(cg->ctx, s, (unsigned)len, 0);
    LLVMValueRef g = LLVMAddGlobal(cg->mod, LLVMTypeOf(init), name);
    LLVMSetInitializer(g, init);
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMPrivateLinkage);
    LLVMSetUnnamedAddress(g, LLVMGlobalUnnamedAddr);
    return g;
}

/* The layouts built here must be the C layouts of rt_abi.h: checked, not assumed. */
static int check_layouts(Cg *cg, LLVMTypeRef modty)
{
    struct {
        LLVMTypeRef t;
        unsigned field;
        size_t c_offset;
    } checks[] = {
        {cg->t_rtapi, 0, offsetof(XtcRtApi, pool)},
        {cg->t_rtapi, 1, offsetof(XtcRtApi, parallel_for)},
        {cg->t_rtapi, 2, offsetof(XtcRtApi, nthreads)},
        {cg->t_rtapi, 3, offsetof(XtcRtApi, step_done)},
        {cg->t_rtapi, 4, offsetof(XtcRtApi, hook_ctx)},
        {modty, 0, offsetof(XtcModuleV1, magic)},
        {modty, 1, offsetof(XtcModuleV1, version)},
        {modty, 2, offsetof(XtcModuleV1, meta)},
        {modty, 3, offsetof(XtcModuleV1, source)},
        {modty, 4, offsetof(XtcModuleV1, run)},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
        if (LLVMOffsetOfElement(cg->td, checks[i].t, checks[i].field) != checks[i].c_offset)
            return cg_error(cg, "internal error: the target's struct layout differs from rt_abi.h (field %u)",
                            checks[i].field);
    if (LLVMABISizeOfType(cg->td, modty) != sizeof(XtcModuleV1))
        return cg_error(cg, "internal error: XtcModuleV1 size differs for this target");
    return 0;
}

/* ---- target ---- */

static int has_feature(const char *features, const char *f)
{
    size_t n = strlen(f);
    for (const char *p = features; p && (p = strstr(p, f)); p += n)
        if ((p == features || p[-1] == ',') && (p[n] == ',' || p[n] == 0))
            return 1;
    return 0;
}

int cg_has_feature(const Cg *cg, const char *f) { return has_feature(cg->requires, f); }

/* x86-64 CPUs by LLVM name and the instruction-set features LLVM gives each (the vector and
 * arithmetic ones, which generated code may use, checked against clang's expansion of -march):
 * a CPU has its base's features and its own. For a CPU named with --cpu, the module records these
 * as the features it requires (option "requires", checked by the runtime when it loads the module);
 * they also give the vector width when no feature string is given. A CPU not listed records no
 * requirement (the loader cannot check it; "generic" and "x86-64" need nothing). */
typedef struct {
    const char *name, *base, *features;
} CpuModel;

static const CpuModel cpu_models[] = {
    {"x86-64-v2", NULL, "sse3,ssse3,sse4.1,sse4.2,popcnt"},
    {"x86-64-v3", "x86-64-v2", "movbe,avx,f16c,fma,bmi,bmi2,lzcnt,avx2"},
    {"x86-64-v4", "x86-64-v3", "avx512f,avx512dq,avx512cd,avx512bw,avx512vl"},
    {"nehalem", "x86-64-v2", ""},
    {"westmere", "x86-64-v2", "pclmul"},
    {"sandybridge", "westmere", "avx"},
    {"ivybridge", "sandybridge", "f16c"},
    {"haswell", "x86-64-v3", "pclmul"},
    {"broadwell", "haswell", "adx"},
    {"skylake", "broadwell", "aes"},
    {"skylake-avx512", "x86-64-v4", "pclmul,aes,adx"},
    {"cascadelake", "skylake-avx512", "avx512vnni"},
    {"cooperlake", "cascadelake", "avx512bf16"},
    {"cannonlake", "skylake-avx512", "sha,avx512ifma,avx512vbmi"},
    {"icelake-client", "cannonlake", "gfni,vaes,vpclmulqdq,avx512vbmi2,avx512vnni,avx512bitalg,avx512vpopcntdq"},
    {"icelake-server", "icelake-client", ""},
    {"tigerlake", "icelake-client", ""},
    {"rocketlake", "icelake-client", ""},
    {"alderlake", "skylake", "sha,gfni,vaes,vpclmulqdq,avxvnni"},
    {"raptorlake", "alderlake", ""},
    {"meteorlake", "alderlake", ""},
    {"sapphirerapids", "icelake-client", "avx512bf16,avx512fp16,avxvnni,amx-tile,amx-int8,amx-bf16"},
    {"emeraldrapids", "sapphirerapids", ""},
    {"graniterapids", "sapphirerapids", "amx-fp16"},
    {"znver1", "skylake", "sha,sse4a"},
    {"znver2", "znver1", ""},
    {"znver3", "znver1", "vaes,vpclmulqdq"},
    {"znver4", "icelake-client", "avx512bf16,sse4a"},
    {"znver5", "znver4", "avxvnni"},
};

/* The x86-64 CPU names LLVM 19 accepts (`llc -march=x86-64 -mcpu=help`, less the 32-bit ones,
 * which abort LLVM: "64-bit code requested on a subtarget that doesn't support it"). A name LLVM
 * does not know aborts it too, so --cpu is checked against this list before any target machine
 * exists (cg_cpu_check). */
static const char *const x86_64_cpus[] = {
    "alderlake", "amdfam10", "arrowlake", "arrowlake-s", "arrowlake_s", "athlon-fx", "athlon64",
    "athlon64-sse3", "atom", "atom_sse4_2", "atom_sse4_2_movbe", "barcelona", "bdver1", "bdver2", "bdver3",
    "bdver4", "bonnell", "broadwell", "btver1", "btver2", "cannonlake", "cascadelake", "clearwaterforest",
    "cooperlake", "core-avx-i", "core-avx2", "core2", "core_2_duo_sse4_1", "core_2_duo_ssse3",
    "core_2nd_gen_avx", "core_3rd_gen_avx", "core_4th_gen_avx", "core_4th_gen_avx_tsx", "core_5th_gen_avx",
    "core_5th_gen_avx_tsx", "core_aes_pclmulqdq", "core_i7_sse4_2", "corei7", "corei7-avx", "emeraldrapids",
    "generic", "goldmont", "goldmont-plus", "goldmont_plus", "gracemont", "grandridge", "graniterapids",
    "graniterapids-d", "graniterapids_d", "haswell", "icelake-client", "icelake-server", "icelake_client",
    "icelake_server", "ivybridge", "k8", "k8-sse3", "knl", "knm", "lunarlake", "meteorlake", "mic_avx512",
    "nehalem", "nocona", "opteron", "opteron-sse3", "pantherlake", "penryn", "raptorlake", "rocketlake",
    "sandybridge", "sapphirerapids", "sierraforest", "silvermont", "skx", "skylake", "skylake-avx512",
    "skylake_avx512", "slm", "tigerlake", "tremont", "westmere", "x86-64", "x86-64-v2", "x86-64-v3",
    "x86-64-v4", "znver1", "znver2", "znver3", "znver4", "znver5",
};
static const char *const x86_32_cpus[] = {
    "athlon", "athlon-4", "athlon-mp", "athlon-tbird", "athlon-xp", "c3", "c3-2", "geode", "i386", "i486",
    "i586", "i686", "k6", "k6-2", "k6-3", "lakemont", "pentium", "pentium-m", "pentium-mmx", "pentium2",
    "pentium3", "pentium3m", "pentium4", "pentium4m", "pentium_4", "pentium_4_sse3", "pentium_ii",
    "pentium_iii", "pentium_iii_no_xmm_regs", "pentium_m", "pentium_mmx", "pentium_pro", "pentiumpro",
    "prescott", "winchip-c6", "winchip2", "yonah",
};

const char *const *cg_cpu_names(int *n)
{
    *n = (int)(sizeof x86_64_cpus / sizeof x86_64_cpus[0]);
    return x86_64_cpus;
}

int cg_cpu_check(const char *cpu, const char *features, char *err, size_t n)
{
#if defined(__x86_64__)
    if (cpu && cpu[0] && strcmp(cpu, "native") != 0) {
        int ncpus = (int)(sizeof x86_64_cpus / sizeof x86_64_cpus[0]), best = -1, dist = 1000;
        for (int i = 0; i < ncpus; i++) {
            if (strcmp(x86_64_cpus[i], cpu) == 0) {
                best = i;
                dist = 0;
                break;
            }
            int d = ir_edit_distance(cpu, strlen(cpu), x86_64_cpus[i]);
            if (d < dist) {
                dist = d;
                best = i;
            }
        }
        if (dist > 0) {
            for (size_t i = 0; i < sizeof x86_32_cpus / sizeof x86_32_cpus[0]; i++)
                if (strcmp(x86_32_cpus[i], cpu) == 0) {
                    snprintf(err, n, "CPU '%s' is a 32-bit x86 CPU; xtc compiles for x86-64 (`xtc compile "
                             "--cpu=help` lists the CPUs)", cpu);
                    return -1;
                }
            int close = dist <= 2 || (size_t)dist * 3 <= strlen(cpu);
            snprintf(err, n, "unknown CPU '%.64s' (%s%s%s`xtc compile --cpu=help` lists them)", cpu,
                     close ? "did you mean '" : "", close ? x86_64_cpus[best] : "", close ? "'? " : "");
            return -1;
        }
    }
#else
    (void)cpu;
#endif
    /* LLVM's feature string: "+name" or "-name", comma-separated */
    for (const char *p = features; p && *p;) {
        size_t k = strcspn(p, ",");
        int ok = k > 1 && (p[0] == '+' || p[0] == '-');
        for (size_t i = 1; ok && i < k; i++)
            ok = (p[i] >= 'a' && p[i] <= 'z') || (p[i] >= '0' && p[i] <= '9') || strchr(".-_", p[i]);
        if (!ok) {
            snprintf(err, n, "bad CPU feature '%.*s' in '%.200s': expected +name or -name, comma-separated",
                     (int)(k < 64 ? k : 64), p, features);
            return -1;
        }
        p += k + (p[k] == ',');
    }
    return 0;
}

/* Appends "name" to the comma-separated list req (capacity n) unless it is there already. */
static void add_required(char *req, size_t n, const char *name, size_t len)
{
    char item[64];
    if (!len || len >= sizeof item)
        return;
    memcpy(item, name, len);
    item[len] = 0;
    if (has_feature(req, item))
        return;
    size_t used = strlen(req);
    if (used + len + 2 <= n)
        snprintf(req + used, n - used, "%s%s", used ? "," : "", item);
}

/* Removes "name" from the comma-separated list req. */
static void remove_required(char *req, const char *name, size_t len)
{
    for (char *p = req; *p;) {
        char *comma = strchr(p, ',');
        size_t k = comma ? (size_t)(comma - p) : strlen(p);
        if (k == len && strncmp(p, name, len) == 0) {
            if (comma)
                memmove(p, comma + 1, strlen(comma + 1) + 1);
            else
                *(p > req ? p - 1 : p) = 0;
            return;
        }
        p += k + (comma != NULL);
    }
}

/* The features code for cpu with the LLVM feature string features ("+a,-b") may use: the CPU's
 * listed ones, plus those enabled, less those disabled. */
static void cpu_requires(const char *cpu, const char *features, char *req, size_t n)
{
    req[0] = 0;
    for (int depth = 0; cpu && depth < 16; depth++) {
        const CpuModel *model = NULL;
        for (size_t i = 0; i < sizeof cpu_models / sizeof cpu_models[0]; i++)
            if (strcmp(cpu_models[i].name, cpu) == 0)
                model = &cpu_models[i];
        if (!model)
            break;
        for (const char *p = model->features; *p;) {
            size_t k = strcspn(p, ",");
            add_required(req, n, p, k);
            p += k + (p[k] == ',');
        }
        cpu = model->base;
    }
    for (int pass = 0; pass < 2; pass++) /* every "+" first, so that a "-" wins */
        for (const char *p = features; p && *p;) {
            size_t k = strcspn(p, ",");
            if (k > 1 && p[0] == (pass ? '-' : '+')) {
                if (pass)
                    remove_required(req, p + 1, k - 1);
                else
                    add_required(req, n, p + 1, k - 1);
            }
            p += k + (p[k] == ',');
        }
}

static int setup_target(Cg *cg, const CgOptions *opt)
{
    pthread_once(&llvm_once, llvm_init);
    if (llvm_init_failed)
        return cg_error(cg, "LLVM: the native target could not be initialised");
    char *triple = LLVMGetDefaultTargetTriple();
    LLVMTargetRef target;
    char *msg = NULL;
    if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
        cg_error(cg, "LLVM: target %s: %s", triple, msg ? msg : "unknown");
        LLVMDisposeMessage(msg);
        LLVMDisposeMessage(triple);
        return -1;
    }
    char bad[300];
    if (cg_cpu_check(opt->cpu, opt->features, bad, sizeof bad) != 0) {
        LLVMDisposeMessage(triple);
        return cg_error(cg, "%s", bad);
    }
    int host = !opt->cpu || !opt->cpu[0] || strcmp(opt->cpu, "native") == 0;
    if (host) {
        char *name = LLVMGetHostCPUName();
        snprintf(cg->cpu, sizeof cg->cpu, "%s", name);
        LLVMDisposeMessage(name);
        cg->features = opt->features ? LLVMCreateMessage(opt->features) : LLVMGetHostCPUFeatures();
    } else {
        snprintf(cg->cpu, sizeof cg->cpu, "%s", opt->cpu);
        cg->features = LLVMCreateMessage(opt->features ? opt->features : "");
    }
    cpu_requires(cg->cpu, cg->features, cg->requires, sizeof cg->requires);
    cg->vec = has_feature(cg->requires, "avx512f") ? 16 : has_feature(cg->requires, "avx2") ? 8 : 4;
    if (opt->mma == CG_MMA_FP16) {
        LLVMDisposeMessage(triple);
        return cg_error(cg, "the cpu backend's --mma is bf16 or off (fp16 operands are for the cuda targets)");
    }
    char why[160];
    int storage = cg_dtype_parse(opt->dtype, why, sizeof why);
    if (storage != 0 && storage != 1) {
        LLVMDisposeMessage(triple);
        return cg_error(cg, "%s", storage < 0 ? why : "the cpu backend stores in f32 or bf16");
    }
    cg->storage = storage;
    /* bf16 weights (--dtype bf16) take bf16 matmuls unless --mma=off */
    if (opt->mma == CG_MMA_BF16 || (opt->mma == CG_MMA_AUTO && storage == 1))
        cg->bf16 = cg->vec == 16 && has_feature(cg->requires, "avx512bf16") ? CG_BF16_DPBF16 : CG_BF16_SOFT;
    LLVMCodeGenOptLevel level = opt->opt_level <= 0 ? LLVMCodeGenLevelNone
                                : opt->opt_level == 1 ? LLVMCodeGenLevelLess
                                : opt->opt_level == 2 ? LLVMCodeGenLevelDefault
                                                      : LLVMCodeGenLevelAggressive;
    cg->tm = LLVMCreateTargetMachine(target, triple, cg->cpu, cg->features, level, LLVMRelocPIC, LLVMCodeModelDefault);
    if (!cg->tm) {
        cg_error(cg, "LLVM: cannot create a target machine for %s (cpu %s)", triple, cg->cpu);
        LLVMDisposeMessage(triple);
        return -1;
    }
    cg->td = LLVMCreateTargetDataLayout(cg->tm);
    LLVMSetTarget(cg->mod, triple);
    LLVMSetModuleDataLayout(cg->mod, cg->td);
    LLVMDisposeMessage(triple);
    return 0;
}

static void init_types(Cg *cg)
{
    LLVMContextRef c = cg->ctx;
    cg->t_void = LLVMVoidTypeInContext(c);
    cg->t_i1 = LLVMInt1TypeInContext(c);
    cg->t_i8 = LLVMInt8TypeInContext(c);
    cg->t_i32 = LLVMInt32TypeInContext(c);
    cg->t_i64 = LLVMInt64TypeInContext(c);
    cg->t_f32 = LLVMFloatTypeInContext(c);
    cg->t_f64 = LLVMDoubleTypeInContext(c);
    cg->t_ptr = LLVMPointerTypeInContext(c, 0);
    LLVMTypeRef p = cg->t_ptr, i64 = cg->t_i64;
    LLVMTypeRef impl[P_IMPL_N], kernel[P_KERNEL_N];
    for (int i = 0; i <= P_SYMS; i++)
        impl[i] = kernel[i] = p;
    impl[P_LO] = impl[P_HI] = impl[P_THREADS] = i64;
    kernel[P_RT] = p;
    cg->t_impl = LLVMFunctionType(cg->t_i32, impl, P_IMPL_N, 0);
    LLVMTypeRef body[3] = {p, i64, i64};
    cg->t_body = LLVMFunctionType(cg->t_void, body, 3, 0);
    cg->t_kernel = LLVMFunctionType(cg->t_i32, kernel, P_KERNEL_N, 0);
    LLVMTypeRef run[3] = {p, p, p};
    cg->t_run = LLVMFunctionType(cg->t_i32, run, 3, 0);
    LLVMTypeRef rtapi[5] = {p, p, i64, p, p};
    cg->t_rtapi = LLVMStructTypeInContext(c, rtapi, 5, 0);
}

static void cg_free(Cg *cg)
{
    if (!cg)
        return;
    if (cg->b)
        LLVMDisposeBuilder(cg->b);
    if (cg->mod)
        LLVMDisposeModule(cg->mod);
    if (cg->td)
        LLVMDisposeTargetData(cg->td);
    if (cg->tm)
        LLVMDisposeTargetMachine(cg->tm);
    if (cg->ctx)
        LLVMContextDispose(cg->ctx);
    if (cg->features)
        LLVMDisposeMessage(cg->features);
    free(cg);
}

static int llvm_supports(IrOp op) { return cg_llvm_lowering(op) != NULL; }

/* A rendered unit: the module in parts, each with its own context, module and target machine,
 * so that compile optimises and emits them in parallel threads (LLVM allows one thread per
 * context). Part 0 holds the schedule and the module object; the kernels are spread over the
 * parts, each to the one with the fewest instructions so far. Kernels call no other kernel; the
 * helpers they share (the matmul micro-kernel, ...) are emitted in every part that uses them,
 * which costs each further part a few per cent more work in all. So there are as many parts as
 * processors, at most one per KERNELS_PER_PART kernels (GPT's training module, 62 kernels, on
 * 2 processors: 1.6 s in one part, 0.9 s in two, 1.0 s in four). */
#define CG_PARTS_MAX 8
#define KERNELS_PER_PART 12
typedef struct {
    int nparts;
    Cg *part[CG_PARTS_MAX];
} CgUnit;

static int unit_parts(const CgPlan *plan, const CgOptions *opt)
{
    if (opt->emit_llvm) /* one module, one file of IR */
        return 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long n = opt->parts > 0 ? opt->parts : plan->nkernels / KERNELS_PER_PART;
    if (opt->parts <= 0 && n > cpus)
        n = cpus;
    if (n > plan->nkernels)
        n = plan->nkernels;
    return n < 1 ? 1 : n > CG_PARTS_MAX ? CG_PARTS_MAX : (int)n;
}

static Cg *part_new(const CgPlan *plan, const CgOptions *opt, int index, int split)
{
    Cg *cg = calloc(1, sizeof *cg);
    if (!cg)
        return NULL;
    cg->plan = plan;
    cg->g = plan->g;
    cg->split = split;
    char name[300];
    snprintf(name, sizeof name, "%s.%d", plan->g->name ? plan->g->name : "xtc", index);
    cg->ctx = LLVMContextCreate();
    cg->mod = LLVMModuleCreateWithNameInContext(split ? name : plan->g->name ? plan->g->name : "xtc", cg->ctx);
    cg->b = LLVMCreateBuilderInContext(cg->ctx);
    init_types(cg);
    setup_target(cg, opt);
    return cg;
}

/* Instructions in fn (0 for NULL). */
static int64_t fn_size(LLVMValueRef fn)
{
    int64_t n = 0;
    for (LLVMBasicBlockRef bb = fn ? LLVMGetFirstBasicBlock(fn) : NULL; bb; bb = LLVMGetNextBasicBlock(bb))
        for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i; i = LLVMGetNextInstruction(i))
            n++;
    return n;
}

static int64_t kernel_size(Cg *cg, const CgKernel *k)
{
    char name[96];
    int64_t n = fn_size(LLVMGetNamedFunction(cg->mod, k->fn));
    snprintf(name, sizeof name, "%s_impl", k->fn);
    n += fn_size(LLVMGetNamedFunction(cg->mod, name));
    snprintf(name, sizeof name, "%s_body", k->fn);
    return n + fn_size(LLVMGetNamedFunction(cg->mod, name));
}

static void unit_free(CgUnit *u)
{
    if (!u)
        return;
    for (int i = 0; i < u->nparts; i++)
        cg_free(u->part[i]);
    free(u);
}

static int llvm_render(const CgPlan *plan, const CgOptions *opt, void **unit, char *err, size_t n)
{
    CgUnit *u = calloc(1, sizeof *u);
    *unit = u;
    if (!u) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    int nparts = unit_parts(plan, opt);
    for (int i = 0; i < nparts; i++) {
        u->part[i] = part_new(plan, opt, i, nparts > 1);
        if (!u->part[i]) {
            snprintf(err, n, "out of memory");
            return -1;
        }
        u->nparts = i + 1;
        if (u->part[i]->err[0]) {
            snprintf(err, n, "%s", u->part[i]->err);
            return -1;
        }
    }
    Cg *cg = u->part[0];
    LLVMValueRef *kernels = NULL;
    char *meta = NULL;
    kernels = calloc((size_t)plan->nkernels + 1, sizeof *kernels);
    if (!kernels) {
        cg_error(cg, "out of memory");
        goto fail;
    }
    int64_t size[CG_PARTS_MAX] = {0};
    for (int k = 0; k < plan->nkernels; k++) {
        int at = 0;
        for (int i = 1; i < nparts; i++)
            if (size[i] < size[at])
                at = i;
        Cg *part = u->part[at];
        if (emit_kernel(part, &plan->kernels[k]) < 0) {
            snprintf(cg->err, sizeof cg->err, "%s", part->err);
            goto fail;
        }
        size[at] += kernel_size(part, &plan->kernels[k]);
        if (at == 0) {
            kernels[k] = LLVMGetNamedFunction(cg->mod, plan->kernels[k].fn);
        } else {
            kernels[k] = LLVMAddFunction(cg->mod, plan->kernels[k].fn, cg->t_kernel);
            LLVMSetVisibility(kernels[k], LLVMHiddenVisibility);
        }
    }
    LLVMValueRef run = emit_run(cg, kernels);
    if (!run)
        goto fail;

    char level[8], compiler[48];
    snprintf(level, sizeof level, "%d", opt->opt_level);
    unsigned major, minor, patch;
    LLVMGetVersion(&major, &minor, &patch);
    snprintf(compiler, sizeof compiler, "xtc-llvm-%u.%u.%u", major, minor, patch);
    char lanes[8], group[24];
    snprintf(lanes, sizeof lanes, "%d", cg->vec);
    snprintf(group, sizeof group, "%d", opt->quant_group);
    int kvst = 0; /* KV caches stored in bf16 or int8 (CG_STORE_KV_CACHES: the only such inputs) */
    for (int b = 0; b < plan->nbufs; b++)
        if (plan->bufs[b].kind == CG_BUF_INPUT && plan->storage && plan->storage[b])
            kvst = plan->storage[b];
    const char *options[] = {
        "compiler", compiler,
        "target", "cpu",
        "opt", level,
        "cpu", cg->cpu,
        "vector_lanes", lanes,
        "mma", cg->bf16 == CG_BF16_DPBF16 ? "bf16" : cg->bf16 ? "bf16-soft" : NULL,
        "dtype", cg->storage == 1 ? "bf16" : NULL,
        "kv_dtype", kvst == 1 ? "bf16" : kvst == CG_STORE_INT8_ROWS ? "int8" : NULL,
        "features", cg->features[0] ? cg->features : NULL,
        "requires", cg->requires[0] ? cg->requires : NULL,
        "source", opt->source_name,
        /* int8 weights: how the runtime quantizes f32 values it is given (runtime/rt_quant.c) */
        "weights", opt->weights_dtype && !strcmp(opt->weights_dtype, "int8") ? "int8" : NULL,
        "quant_group", opt->weights_dtype && !strcmp(opt->weights_dtype, "int8") ? group : NULL,
    };
    meta = cg_plan_meta(plan, options, (int)(sizeof options / sizeof options[0] / 2));
    if (!meta) {
        cg_error(cg, "out of memory writing the metadata");
        goto fail;
    }
    LLVMTypeRef fields[5] = {cg->t_i32, cg->t_i32, cg->t_ptr, cg->t_ptr, cg->t_ptr};
    LLVMTypeRef modty = LLVMStructTypeInContext(cg->ctx, fields, 5, 0);
    if (check_layouts(cg, modty) < 0)
        goto fail;
    LLVMValueRef init[5] = {
        LLVMConstInt(cg->t_i32, XTC_ABI_MAGIC, 0),
        LLVMConstInt(cg->t_i32, XTC_ABI_VERSION, 0),
        const_string(cg, meta, "xtc_meta"),
        const_string(cg, opt->source ? opt->source : "", "xtc_source"),
        run,
    };
    LLVMValueRef obj = LLVMAddGlobal(cg->mod, modty, XTC_ABI_SYMBOL);
    LLVMSetInitializer(obj, LLVMConstNamedStruct(modty, init, 5));
    LLVMSetGlobalConstant(obj, 1);
    LLVMSetVisibility(obj, LLVMDefaultVisibility);

    for (int i = 0; i < nparts; i++) {
        char *msg = NULL;
        if (LLVMVerifyModule(u->part[i]->mod, LLVMReturnStatusAction, &msg)) {
            cg_error(cg, "internal error: generated LLVM IR does not verify: %.600s", msg ? msg : "");
            LLVMDisposeMessage(msg);
            goto fail;
        }
        LLVMDisposeMessage(msg);
    }
    free(kernels);
    free(meta);
    return 0;
fail:
    snprintf(err, n, "%s", cg->err);
    free(kernels);
    free(meta);
    return -1;
}

/* ---- compile: optimise, emit, link ---- */

static void read_text(const char *path, char *buf, size_t n)
{
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t len = fread(buf, 1, n - 1, f);
    buf[len] = 0;
    fclose(f);
    for (char *p = buf; *p; p++)
        if (*p == '\n')
            *p = ' ';
}

/* How a module's object files are linked: argv (room for nobj + 6) gets the command. */
static void link_argv(char **argv, const char *out, char *const *objs, int nobj)
{
    int a = 0;
    argv[a++] = "cc";
    argv[a++] = "-shared";
    argv[a++] = "-o";
    argv[a++] = (char *)out;
    for (int i = 0; i < nobj; i++)
        argv[a++] = objs[i];
    argv[a++] = "-lm";
    argv[a] = NULL;
}

/* The module cache's key (cg_cache.c): the parts before optimisation (their bitcode holds the
 * triple and data layout), the target machine's CPU and features, the optimisation level and
 * pipeline, LLVM's version, and the link command with the cc that runs it. */
static int cache_key(const CgUnit *u, const CgOptions *opt, const char *passes, CgHash *h)
{
    const Cg *cg = u->part[0];
    cg_hash_init(h, "xtc cpu module 2");
    unsigned v[5] = {0, 0, 0, (unsigned)opt->opt_level, (unsigned)u->nparts};
    LLVMGetVersion(&v[0], &v[1], &v[2]);
    cg_hash_add(h, v, sizeof v);
    cg_hash_str(h, passes);
    cg_hash_str(h, cg->cpu);
    cg_hash_str(h, cg->features);
    char names[CG_PARTS_MAX][16], *objs[CG_PARTS_MAX];
    for (int i = 0; i < u->nparts; i++) {
        LLVMMemoryBufferRef mb = LLVMWriteBitcodeToMemoryBuffer(u->part[i]->mod);
        if (!mb)
            return -1;
        cg_hash_add(h, LLVMGetBufferStart(mb), LLVMGetBufferSize(mb));
        LLVMDisposeMemoryBuffer(mb);
        snprintf(names[i], sizeof names[i], "module%d.o", i);
        objs[i] = names[i];
    }
    char *link[CG_PARTS_MAX + 6];
    link_argv(link, "OUT", objs, u->nparts);
    for (int i = 0; link[i]; i++)
        cg_hash_str(h, link[i]);
    cg_hash_program(h, link[0]);
    return 0;
}

/* One part's optimisation and object file, in whichever thread takes it (parts_run). */
typedef struct {
    Cg *cg;
    const char *passes;
    int opt_level;
    const char *obj;
    double optimize_s, emit_s;
    int rc;
    char err[700];
} PartJob;

static void part_optimise(PartJob *j)
{
    double t0 = now_s();
    LLVMPassBuilderOptionsRef pbo = LLVMCreatePassBuilderOptions();
    LLVMPassBuilderOptionsSetLoopVectorization(pbo, j->opt_level >= 2);
    LLVMPassBuilderOptionsSetSLPVectorization(pbo, j->opt_level >= 2);
    LLVMErrorRef e = LLVMRunPasses(j->cg->mod, j->passes, j->cg->tm, pbo);
    LLVMDisposePassBuilderOptions(pbo);
    j->optimize_s = now_s() - t0;
    if (e) {
        char *m = LLVMGetErrorMessage(e);
        snprintf(j->err, sizeof j->err, "LLVM optimisation (%s) failed: %s", j->passes, m);
        LLVMDisposeErrorMessage(m);
        j->rc = -1;
    }
}

static void part_emit(PartJob *j)
{
    double t0 = now_s();
    char *msg = NULL;
    if (LLVMTargetMachineEmitToFile(j->cg->tm, j->cg->mod, (char *)j->obj, LLVMObjectFile, &msg)) {
        snprintf(j->err, sizeof j->err, "LLVM could not emit the object file: %s", msg ? msg : "");
        j->rc = -1;
    }
    LLVMDisposeMessage(msg);
    j->emit_s = now_s() - t0;
}

/* Optimises, then (given an object path) emits. */
static void part_compile(PartJob *j)
{
    part_optimise(j);
    if (j->rc == 0 && j->obj)
        part_emit(j);
}

typedef struct {
    PartJob *jobs;
    int njobs, next;
    pthread_mutex_t lock;
} PartQueue;

static void *part_worker(void *arg)
{
    PartQueue *q = arg;
    for (;;) {
        pthread_mutex_lock(&q->lock);
        int i = q->next < q->njobs ? q->next++ : -1;
        pthread_mutex_unlock(&q->lock);
        if (i < 0)
            return NULL;
        part_compile(&q->jobs[i]);
    }
}

/* Runs the jobs on up to one thread per processor (this one included); a thread that cannot be
 * started leaves its share to the others. */
static void parts_run(PartJob *jobs, int n)
{
    PartQueue q = {.jobs = jobs, .njobs = n};
    pthread_mutex_init(&q.lock, NULL);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = cpus < 1 ? 1 : cpus < n ? (int)cpus : n;
    pthread_t tid[CG_PARTS_MAX];
    int started = 0;
    for (int i = 1; i < nthreads; i++)
        if (pthread_create(&tid[started], NULL, part_worker, &q) == 0)
            started++;
    part_worker(&q);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&q.lock);
}

static int llvm_compile(void *unit, const CgOptions *opt, CgStats *stats, char *err, size_t n)
{
    CgUnit *u = unit;
    double t0 = now_s();
    char passes[32];
    snprintf(passes, sizeof passes, "default<O%d>", opt->opt_level < 0 ? 0 : opt->opt_level > 3 ? 3 : opt->opt_level);
    /* the optimised IR (--emit-llvm) is not cached: such a compile builds */
    CgHash key;
    int cache = cg_cache_enabled() && !opt->emit_llvm && cache_key(u, opt, passes, &key) == 0;
    if (cache) {
        if (cg_cache_fetch(&key, opt->output)) {
            if (stats) {
                struct stat sb;
                stats->parts = u->nparts;
                stats->optimize_s = stats->emit_s = 0;
                stats->link_s = now_s() - t0;
                stats->module_bytes = stat(opt->output, &sb) == 0 ? (int64_t)sb.st_size : 0;
                stats->cached = 1;
            }
            return 0;
        }
    }
    char dir[] = "/tmp/xtc-cg-XXXXXX";
    const char *tmpdir = getenv("TMPDIR");
    char dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s/xtc-cg-XXXXXX", tmpdir && tmpdir[0] ? tmpdir : "/tmp");
    char *d = mkdtemp(dirbuf);
    if (!d)
        d = mkdtemp(dir);
    if (!d) {
        snprintf(err, n, "cannot create a temporary directory: %s", strerror(errno));
        return -1;
    }
    char objs[CG_PARTS_MAX][4200], *objv[CG_PARTS_MAX], log[4200];
    PartJob jobs[CG_PARTS_MAX];
    for (int i = 0; i < u->nparts; i++) {
        snprintf(objs[i], sizeof objs[i], "%s/module%d.o", d, i);
        objv[i] = objs[i];
        /* with --emit-llvm (one part), the IR is written between optimising and emitting */
        jobs[i] = (PartJob){.cg = u->part[i], .passes = passes, .opt_level = opt->opt_level,
                            .obj = opt->emit_llvm ? NULL : objs[i]};
    }
    snprintf(log, sizeof log, "%s/link.log", d);
    parts_run(jobs, u->nparts);
    int rc = 0;
    RtWFile out; /* the output is replaced atomically, through symlinks, keeping its mode */
    int have_out = 0;
    for (int i = 0; i < u->nparts && rc == 0; i++)
        if (jobs[i].rc) {
            snprintf(err, n, "%s", jobs[i].err);
            rc = -1;
        }
    if (rc == 0 && opt->emit_llvm) {
        char *m = NULL;
        if (LLVMPrintModuleToFile(u->part[0]->mod, opt->emit_llvm, &m)) {
            snprintf(err, n, "cannot write %s: %s", opt->emit_llvm, m ? m : "");
            rc = -1;
        }
        LLVMDisposeMessage(m);
        if (rc == 0) {
            jobs[0].obj = objs[0];
            part_emit(&jobs[0]);
            if (jobs[0].rc) {
                snprintf(err, n, "%s", jobs[0].err);
                rc = -1;
            }
        }
    }
    double t2 = now_s();
    if (rc == 0 && rt_wfile_open_named(&out, opt->output, err, n) != 0)
        rc = -1;
    else if (rc == 0)
        have_out = 1;
    if (rc == 0) {
        char *argv[CG_PARTS_MAX + 6];
        link_argv(argv, out.tmp, objv, u->nparts);
        if (cg_run_program(argv, log) < 0) {
            char text[600];
            read_text(log, text, sizeof text);
            snprintf(err, n, "linking %s with cc failed: %s", opt->output, text[0] ? text : "cannot run cc");
            rc = -1;
        }
    }
    if (rc == 0 && cache)
        cg_cache_store(&key, out.tmp); /* the bytes linked here, not what -o holds later */
    if (have_out && rc != 0)
        rt_wfile_abort(&out);
    else if (have_out && rt_wfile_commit(&out, err, n) != 0)
        rc = -1;
    double t3 = now_s();
    for (int i = 0; i < u->nparts; i++)
        unlink(objs[i]);
    unlink(log);
    rmdir(d);
    if (stats) {
        /* the parts' optimisation and emission overlap: their wall time is shared between the
         * two phases in proportion to the threads' time in each */
        double o = 0, e = 0;
        for (int i = 0; i < u->nparts; i++) {
            o += jobs[i].optimize_s;
            e += jobs[i].emit_s;
        }
        double wall = t2 - t0;
        stats->parts = u->nparts;
        stats->optimize_s = o + e > 0 ? wall * o / (o + e) : 0;
        stats->emit_s = wall - stats->optimize_s;
        stats->link_s = t3 - t2;
        struct stat sb;
        stats->module_bytes = rc == 0 && stat(opt->output, &sb) == 0 ? (int64_t)sb.st_size : 0;
    }
    return rc;
}

static void llvm_release(void *unit) { unit_free(unit); }

const CgBackend cg_llvm_backend = {
    .name = "cpu",
    .description = "LLVM CPU backend: native code in a shared library",
    .caps = CG_CAP_SYMBOLIC | CG_CAP_THREADS | CG_CAP_HOST_RUN | CG_CAP_HEAD_VIEWS | CG_CAP_MMA | CG_CAP_HALF_WEIGHTS | CG_CAP_INT8 |
            CG_CAP_MATMUL_VIEWS,
    .supports = llvm_supports,
    .render = llvm_render,
    .compile = llvm_compile,
    .release = llvm_release,
    .attention_max_head = CG_LLVM_ATTENTION_MAX_HEAD,
    .attention_grad_max_head = CG_LLVM_ATTENTION_MAX_HEAD,
    .attention_kv_groups = 1,
    .attention_grad_kv_groups = 1, /* one work item per (batch, key/value head): cg_llvm_attention_grad.c */
};
