/* test_fuse.c: the fusion passes end to end (passes/fuse_*.c through the CPU backend).
 *
 *   - parity: every x-transformers case of ../shared/parity that xtc supports, lowered with its
 *     loss and differentiated, through the pipeline with the fusions on and with --no-fuse,
 *     compiled (-O2 fused, -O0 unfused) and run with 1 and 2 threads: outputs, the loss and every parameter gradient
 *     against the numbers PyTorch wrote (compare.py's tolerance: 1e-5 + 1e-3 max|expected|).
 *   - kernel counts: a small decoder, for inference and for training, has one attention kernel
 *     step per layer (and one attention_grad), no softmax of attention, and no f32 buffer of
 *     n x n elements; unfused, it has them.
 *   - memory: the fused arena grows linearly with the sequence, the unfused one quadratically.
 *
 * The interpreter equivalence of fused and unfused graphs of every model is in
 * test_pass_models.c (the pipeline holds the fusions); IR text in/out in test_passes.c
 * (tests/passes/attention/); each fused op against the interpreter in test_codegen.c. */
#include "cg_plan.h"
#include "codegen.h"
#include "ir.h"
#include "passes.h"
#include "safetensors.h"
#include "xtc.h"
#include "xtf.h"

#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "harness_drive.h"
#include "harness_bind.h"
#include "parity_run.h"

static void make_tmpdir(void) { harness_make_tmpdir("fuse"); }

/* Lowers a checked .xtf (path or text) and differentiates it when it has a loss. */
static IrGraph *lower_xtf(const char *path, const char *text, const XtLowerOpts *lo, int grads)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = text ? xtf_parse("test.xtf", text, strlen(text), &d) : xtf_parse_file(path, &d);
    if (f && !d.nerrors)
        xtf_check(f, &d);
    char err[512];
    IrGraph *g = f && !d.nerrors ? harness_build(f, NULL, lo, grads, harness_target("cpu"), NULL, &d, err, sizeof err) : NULL;
    xtf_diag_free(&d);
    xtf_free(f);
    return g;
}

static IrGraph *optimize(IrGraph *g, int no_fuse)
{
    char err[1024];
    PassOptions po = {.no_fuse = no_fuse, .verify_each = 1};
    IrGraph *h = harness_passes(g, "cpu", &po, err, sizeof err);
    ck_assert_msg(h != NULL, "%s", err);
    return h;
}

static int count_op(const IrGraph *g, IrOp op)
{
    int k = 0;
    for (int i = 0; i < g->nnodes; i++)
        k += g->nodes[i]->op == op;
    return k;
}

/* ---- parity with x-transformers through compiled modules ---- */

typedef struct {
    int no_fuse, attention, attention_grad;
} ParityStats;

/* One parity case, fused or not (ps->no_fuse), run on 1 and 2 threads: 0 passed, 1 refused by
 * the language, -1 failed (parity_each's protocol) */
static int fuse_parity_case(const char *name, void *ctx, char *err, size_t n)
{
    ParityStats *ps = ctx;
    int no_fuse = ps->no_fuse;
    char xtf[512], dir[512], path[700];
    snprintf(xtf, sizeof xtf, "%s/tests/parity/%s.xtf", XTC_SOURCE_DIR, name);
    snprintf(dir, sizeof dir, "%s/parity/%s", XTC_SHARED_DIR, name);
    RtStFile *in = NULL, *exp = NULL;
    snprintf(path, sizeof path, "%s/inputs.safetensors", dir);
    if (rt_st_open(path, &in, err, n))
        return -1;
    XtLowerOpts lo = {
        .train = rt_st_find(in, "targets") != NULL,
        .mask = rt_st_find(in, "mask") != NULL,
        .src_mask = rt_st_find(in, "src_mask") != NULL,
        .context_mask = rt_st_find(in, "context_mask") != NULL,
        .tgt_mask = rt_st_find(in, "tgt_mask") != NULL,
    };
    IrGraph *g = lower_xtf(xtf, NULL, &lo, lo.train);
    if (!g) {
        rt_st_close(in);
        return 1;
    }
    IrGraph *h = optimize(g, no_fuse);
    ps->attention += count_op(h, IR_ATTENTION);
    ps->attention_grad += count_op(h, IR_ATTENTION_GRAD);
    int rc = -1;
    XtcModule *m = NULL;
    snprintf(path, sizeof path, "%s/parity_%s_%d.so", tmpdir, name, no_fuse);
    /* unfused, each module in three parts (compiled in parallel threads), whatever the machine
     * has: the split is then taken by every model, not only where there are processors for it;
     * and at -O0: the same kernels, several times faster to compile (the unfused modules are the
     * fused ones' reference here; each op's kernel at -O2 is test_codegen's) */
    CgOptions opt = {.output = path, .opt_level = no_fuse ? 0 : 2, .parts = no_fuse ? 3 : 0};
    if (harness_cg(h, &opt, NULL, err, n))
        goto done;
    if (xtc_module_load(path, &m)) {
        snprintf(err, n, "%s", xtc_module_error(m));
        goto done;
    }
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    if (rt_st_open(path, &exp, err, n))
        goto done;
    for (int threads = 1; threads <= 2; threads++) {
        XtcSession *s = NULL;
        char what[300], wpath[700];
        snprintf(what, sizeof what, "%s (%s, %d thread%s)", name, no_fuse ? "unfused" : "fused", threads,
                 threads > 1 ? "s" : "");
        snprintf(wpath, sizeof wpath, "%s/weights.safetensors", dir);
        int ok = xtc_session_new(m, &(XtcSessionOptions){.threads = threads}, &s) == XTC_OK &&
                 xtc_session_load_weights(s, wpath) == XTC_OK;
        if (!ok)
            snprintf(err, n, "%s: %s", what, xtc_session_error(s));
        if (ok && bind_inputs(s, m, in, err, n))
            ok = 0;
        if (ok && xtc_session_run(s)) {
            snprintf(err, n, "%s: %s", what, xtc_session_error(s));
            ok = 0;
        }
        int compared = ok ? parity_compare(s, m, exp, what, 1e-5, 1e-3, NULL, err, n) : -1;
        xtc_session_free(s);
        if (compared < 0)
            goto done;
        if (compared == 0) {
            snprintf(err, n, "%s: no output to compare", what);
            goto done;
        }
    }
    rc = 0;
done:
    rt_st_close(exp);
    rt_st_close(in);
    xtc_module_free(m);
    ir_graph_free(h);
    ir_graph_free(g);
    return rc;
}

static void parity_all(int no_fuse)
{
    make_tmpdir();
    ParityStats ps = {.no_fuse = no_fuse};
    ParityCount pc;
    parity_each(fuse_parity_case, &ps, NULL, "test_fuse", &pc);
    printf("parity %s: %d passed (outputs, loss, gradients; 1 and 2 threads), %d refused by the language, %d failed; "
           "%d attention and %d attention_grad nodes\n",
           no_fuse ? "unfused" : "fused", pc.passed, pc.refused, pc.failed, ps.attention, ps.attention_grad);
    ck_assert_msg(pc.failed == 0, "parity failures:%s", pc.failures);
    ck_assert_int_gt(pc.passed, 20);
    if (no_fuse)
        ck_assert_int_eq(ps.attention + ps.attention_grad, 0);
    else
        ck_assert_int_gt(ps.attention_grad, 10);
}

START_TEST(test_parity_fused) { parity_all(0); }
END_TEST

START_TEST(test_parity_unfused) { parity_all(1); }
END_TEST

/* ---- kernel counts ---- */

static const char *decoder_src = "m = TransformerWrapper(num_tokens = 32, max_seq_len = 4096,\n"
                                 "    attn_layers = Decoder(dim = 32, depth = 3, heads = 2, attn_dim_head = 16))\n";

/* steps per op in the plan; f32 temps with two dims that grow with n */
typedef struct {
    int steps, attention, attention_grad, softmax, nn_buffers, norms, permutes, sums;
} Plan;

/* views: 1 the head-split views, 2 the transposed-A view of matmuls (cg_plan.h) */
static void plan_of(const IrGraph *g, Plan *pl, int views)
{
    memset(pl, 0, sizeof *pl);
    CgPlan p;
    char err[512];
    CgPlanOpts o = {.head_views = views & 1, .matmul_views = (views & 2) != 0};
    ck_assert_msg(cg_plan_build_opts(g, &p, &o, err, sizeof err) == 0, "%s", err);
    int n = ir_graph_find_sym(g, "n");
    ck_assert_int_ge(n, 0);
    pl->steps = p.nsteps;
    for (int s = 0; s < p.nsteps; s++) {
        IrOp op = p.steps[s].node->op;
        pl->norms += op == IR_FUSED && strstr(p.steps[s].node->s, "rsqrt") != NULL;
        pl->attention += op == IR_ATTENTION;
        pl->permutes += op == IR_PERMUTE;
        pl->sums += op == IR_SUM;
        pl->attention_grad += op == IR_ATTENTION_GRAD;
        pl->softmax += op == IR_SOFTMAX && p.steps[s].node->label && strstr(p.steps[s].node->label, "attn");
    }
    for (int b = 0; b < p.nbufs; b++) {
        const IrNode *x = p.bufs[b].node;
        int dims_n = 0;
        for (int d = 0; d < x->rank; d++)
            dims_n += x->shape[d].k[n] != 0;
        pl->nn_buffers += p.bufs[b].kind == CG_BUF_TEMP && x->dtype == IR_F32 && dims_n >= 2;
    }
    cg_plan_free(&p);
}

/* The CPU backend compiles a large module as several LLVM modules in parallel threads
 * (CgOptions.parts; by default one per processor, one per 12 kernels at most): the same kernels
 * in other objects, so the same numbers, bit for bit, however it is split. */
START_TEST(test_module_parts)
{
    make_tmpdir();
    XtLowerOpts lo = {.train = 1};
    IrGraph *g = lower_xtf(NULL, decoder_src, &lo, 1);
    ck_assert_ptr_nonnull(g);
    IrGraph *h = optimize(g, 0);
    int64_t syms[8] = {0};
    for (int i = 0; i < h->nsyms; i++)
        syms[i] = strcmp(h->sym_name[i], "b") == 0 ? 2 : 37;
    Binding bd;
    bind_random(&bd, h, syms, NULL);
    const int parts[] = {1, 2, 3, 8};
    void *first[64] = {0};
    size_t bytes[64] = {0};
    ck_assert_int_le(h->noutputs, 64);
    int nkernels = 0;
    for (size_t pi = 0; pi < sizeof parts / sizeof parts[0]; pi++) {
        char path[700], err[1024];
        snprintf(path, sizeof path, "%s/parts_%d.so", tmpdir, parts[pi]);
        CgOptions opt = {.output = path, .opt_level = 2, .parts = parts[pi]};
        CgStats st = {0};
        ck_assert_msg(harness_cg(h, &opt, &st, err, sizeof err) == 0, "%d parts: %s", parts[pi], err);
        nkernels = st.nkernels;
        ck_assert_int_eq(st.parts, parts[pi] < st.nkernels ? parts[pi] : st.nkernels);
        XtcModule *m = NULL;
        ck_assert_msg(xtc_module_load(path, &m) == XTC_OK, "%s", xtc_module_error(m));
        XtcSession *s = NULL;
        ck_assert_int_eq(xtc_session_new(m, &(XtcSessionOptions){.threads = 2}, &s), XTC_OK);
        bind_session(s, &bd, "parts");
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%d parts: %s", parts[pi], xtc_session_error(s));
        for (int o = 0; o < h->noutputs; o++) {
            XtcTensor t;
            ck_assert_int_eq(xtc_session_get_output(s, h->outputs[o].name, &t), XTC_OK);
            size_t n = xtc_dtype_size(t.dtype);
            for (int d = 0; d < t.rank; d++)
                n *= (size_t)t.shape[d];
            if (pi == 0) {
                first[o] = malloc(n ? n : 1);
                memcpy(first[o], t.data, n);
                bytes[o] = n;
            } else {
                ck_assert_msg(n == bytes[o] && memcmp(first[o], t.data, n) == 0,
                              "output '%s' in %d parts differs from the one-part module's", h->outputs[o].name,
                              parts[pi]);
            }
        }
        xtc_session_free(s);
        xtc_module_free(m);
    }
    ck_assert_int_gt(nkernels, 8); /* enough for eight parts to be eight */
    for (int o = 0; o < h->noutputs; o++)
        free(first[o]);
    bind_free(&bd);
    ir_graph_free(h);
    ir_graph_free(g);
}
END_TEST

START_TEST(test_kernel_counts)
{
    for (int train = 0; train <= 1; train++) {
        XtLowerOpts lo = {.train = train, .mask = train};
        IrGraph *g = lower_xtf(NULL, decoder_src, &lo, train);
        ck_assert_ptr_nonnull(g);
        IrGraph *fused = optimize(g, 0), *unfused = optimize(g, 1);
        Plan pf, pu, pv, pa;
        plan_of(fused, &pf, 0);
        plan_of(unfused, &pu, 0);
        plan_of(fused, &pv, 1);
        plan_of(fused, &pa, 3);
        printf("kernels (%s): fused %d steps, %d attention, %d attention_grad, %d softmax, %d LayerNorm kernels, "
               "%d f32 n x n buffers; unfused %d steps, %d softmax, %d f32 n x n buffers\n",
               train ? "training" : "inference", pf.steps, pf.attention, pf.attention_grad, pf.softmax, pf.norms,
               pf.nn_buffers, pu.steps, pu.softmax, pu.nn_buffers);
        ck_assert_int_eq(pf.attention, 3);
        ck_assert_int_eq(pf.attention_grad, train ? 3 : 0);
        ck_assert_int_eq(pf.softmax, 0);
        ck_assert_int_eq(pf.nn_buffers, 0);
        ck_assert_int_ge(pf.norms, 2 * 3 + 1); /* each LayerNorm one kernel (forward) */
        ck_assert_int_lt(2 * pf.steps, pu.steps);
        ck_assert_int_eq(pu.attention + pu.attention_grad, 0);
        ck_assert_int_eq(pu.softmax, 3);
        /* head-split views (CG_CAP_HEAD_VIEWS backends): in inference no permute is left (q, k,
         * v split and the merge, per layer); in training the backward reads the split q, k, v
         * and the forward result too, so they stay */
        printf("head-split views (%s): %d permute steps without, %d with\n", train ? "training" : "inference",
               pf.permutes, pv.permutes);
        if (!train)
            ck_assert_int_eq(pf.permutes, 4 * 3);
        ck_assert_int_eq(pv.permutes, train ? pf.permutes : 0);
        ck_assert_int_eq(pv.steps, pf.steps - (pf.permutes - pv.permutes));
        /* the transposed-A view (CG_CAP_MATMUL_VIEWS): in training the gradient's transpose of
         * every Linear weight's gradient is read in place (4 attention and 2 feed-forward
         * projections a layer, and the logits); in inference there is none to read */
        printf("transposed-A views (%s): %d permute steps with head-split views, %d with both\n",
               train ? "training" : "inference", pv.permutes, pa.permutes);
        ck_assert_int_eq(pa.permutes, pv.permutes - (train ? 6 * 3 + 1 : 0));
        /* ... and each such product summed over the batch by the matmul itself (CG_VIEW_SUM_B):
         * the sum makes no step either */
        ck_assert_int_eq(pa.sums, pv.sums - (train ? 6 * 3 + 1 : 0));
        ck_assert_int_eq(pa.steps, pv.steps - (pv.permutes - pa.permutes) - (pv.sums - pa.sums));
        ck_assert_int_ge(pu.nn_buffers, 3 * (train ? 4 : 2));
        ir_graph_free(fused);
        ir_graph_free(unfused);
        ir_graph_free(g);
    }
}
END_TEST

/* max_attend_past: lower.c puts the window in the padding mask; the fusion takes it out again as
 * the op's window (which the kernels skip keys with), forward and backward, with or without
 * padding (then the mask operand is the padding alone) */
START_TEST(test_window_fuses)
{
    static const char *src = "m = TransformerWrapper(num_tokens = 32, max_seq_len = 256,\n"
                             "    attn_layers = Decoder(dim = 32, depth = 2, heads = 2, attn_dim_head = 16,\n"
                             "                          attn_max_attend_past = 8))\n";
    for (int train = 0; train <= 1; train++)
        for (int mask = 0; mask <= 1; mask++) {
            XtLowerOpts lo = {.train = train, .mask = mask};
            IrGraph *g = lower_xtf(NULL, src, &lo, train);
            ck_assert_ptr_nonnull(g);
            IrGraph *fused = optimize(g, 0);
            Plan pf;
            plan_of(fused, &pf, 0);
            ck_assert_int_eq(pf.attention, 2);
            ck_assert_int_eq(pf.attention_grad, train ? 2 : 0);
            ck_assert_int_eq(pf.softmax, 0);
            ck_assert_int_eq(pf.nn_buffers, 0);
            int windowed = 0, masked = 0, grads = 0;
            for (int i = 0; i < fused->nnodes; i++) {
                const IrNode *x = fused->nodes[i];
                if (x->op == IR_ATTENTION) {
                    windowed += x->ia[IR_IA_WINDOW] == 8;
                    masked += x->in[4]->op != IR_CONST;
                }
                grads += x->op == IR_ATTENTION_GRAD && x->ia[IR_IA_GRAD_WINDOW] == 8;
            }
            ck_assert_int_eq(windowed, 2);
            ck_assert_int_eq(masked, mask ? 2 : 0);
            ck_assert_int_eq(grads, train ? 2 : 0);
            ir_graph_free(fused);
            ir_graph_free(g);
        }
}
END_TEST

/* Grouped key/values (attn_kv_heads = 2 of 8 heads; kv_groups): each attention reads the 2
 * key/value heads themselves and the repeat of k and v is gone (no 5-d expand, four fewer plan
 * steps a layer than on a target whose kernel does not read them, where the copy stays); in
 * training its attention_grad too, which sums each group's dk and dv itself, so the repeat's
 * gradient (a 5-d sum over the group) is gone as well. On a target whose forward
 * reads them but whose gradient kernel does not (attention_grad_kv_groups 0), training keeps the
 * repeats and the sums; CUDA's, with CUDA cores or tensor cores, reads them in both. */
static void count_groups(const IrGraph *g, int *grouped, int *grads, int *repeats, int *sums)
{
    *grouped = *grads = *repeats = *sums = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *x = g->nodes[i];
        int two = x->in[1] && x->in[2] && x->in[1]->shape[1].c == 2 && x->in[2]->shape[1].c == 2;
        *grouped += x->op == IR_ATTENTION && two;
        *grads += x->op == IR_ATTENTION_GRAD && two;
        *repeats += x->op == IR_EXPAND && x->rank == 5;
        *sums += x->op == IR_SUM && x->rank == 5;
    }
}

START_TEST(test_grouped_kv)
{
    static const char *src = "xtransformers = \"2.26.4\"\n"
                             "m = TransformerWrapper(num_tokens = 32, max_seq_len = 256,\n"
                             "    attn_layers = Decoder(dim = 64, depth = 2, heads = 8, attn_kv_heads = 2, attn_dim_head = 8))\n";
    for (int train = 0; train <= 1; train++) {
        XtLowerOpts lo = {.train = train};
        IrGraph *g = lower_xtf(NULL, src, &lo, train);
        ck_assert_ptr_nonnull(g);
        IrGraph *fused = optimize(g, 0);
        PassTarget off = harness_target("cpu")->passes; /* a kernel without grouped key/values */
        off.attention_kv_groups = 0;
        PassTarget fwd = harness_target("cpu")->passes; /* ... with them in the forward kernel only */
        fwd.attention_grad_kv_groups = 0;
        char err[1024];
        IrGraph *copied = pass_run_pipeline(g, &(PassOptions){.verify_each = 1, .target = &off}, err, sizeof err);
        ck_assert_msg(copied != NULL, "%s", err);
        IrGraph *fwd_only = pass_run_pipeline(g, &(PassOptions){.verify_each = 1, .target = &fwd}, err, sizeof err);
        ck_assert_msg(fwd_only != NULL, "%s", err);
        int grouped, grads, repeats, sums, grouped_off, grads_off, repeats_off, sums_off, grouped_fwd, grads_fwd,
            repeats_fwd, sums_fwd;
        count_groups(fused, &grouped, &grads, &repeats, &sums);
        count_groups(copied, &grouped_off, &grads_off, &repeats_off, &sums_off);
        count_groups(fwd_only, &grouped_fwd, &grads_fwd, &repeats_fwd, &sums_fwd);
        Plan pf, po;
        plan_of(fused, &pf, 1);
        plan_of(copied, &po, 1);
        printf("grouped key/values (%s): %d of 2 attentions and %d attention_grads read 2 heads, %d repeats "
               "and %d group sums (%d and %d without kv_groups), %d plan steps (%d)\n",
               train ? "training" : "inference", grouped, grads, repeats, sums, repeats_off, sums_off, pf.steps, po.steps);
        ck_assert_int_eq(pf.attention, 2);
        ck_assert_int_eq(pf.attention_grad, train ? 2 : 0);
        ck_assert_int_eq(grouped, 2);
        ck_assert_int_eq(grads, train ? 2 : 0);
        ck_assert_int_eq(repeats + sums, 0);
        ck_assert_int_eq(grouped_off + grads_off, 0);
        ck_assert_int_eq(repeats_off, 2 * 2);
        ck_assert_int_eq(sums_off, train ? 2 * 2 : 0);
        ck_assert_int_eq(grouped_fwd, train ? 0 : 2);
        ck_assert_int_eq(grads_fwd, 0);
        ck_assert_int_eq(repeats_fwd, train ? 2 * 2 : 0);
        ck_assert_int_eq(sums_fwd, train ? 2 * 2 : 0);
        /* the cuda targets as the driver resolves them: with CUDA cores (f32) and with tensor
         * cores (--dtype bf16: kernels/flash_bwd.cuh) the backward sums each group too, as the
         * CPU's: no repeat, no sum in the compiled schedule */
        DrvTarget c16;
        ck_assert_msg(drv_target(&c16, &(CgOptions){.target = "cuda", .dtype = "bf16"}, err, sizeof err) == 0, "%s", err);
        for (int half = 0; half <= 1; half++) {
            PassTarget *ct = half ? &c16.passes : &(PassTarget){0};
            if (!half)
                *ct = harness_target("cuda")->passes;
            IrGraph *cg = pass_run_pipeline(g, &(PassOptions){.verify_each = 1, .target = ct}, err, sizeof err);
            ck_assert_msg(cg != NULL, "%s", err);
            int cgr, cgd, crep, csum;
            count_groups(cg, &cgr, &cgd, &crep, &csum);
            ck_assert_int_eq(cgr, grouped);
            ck_assert_int_eq(cgd, grads);
            ck_assert_int_eq(crep, repeats);
            ck_assert_int_eq(csum, sums);
            ir_graph_free(cg);
        }
        /* inference: each repeat was two copies, the expand and the reshape of its result;
         * training: the 2 expands a layer go, and each group sum gives way to a copy of the
         * slice of heads [0, G) of attention_grad's dk or dv rows (not contiguous) */
        if (train)
            ck_assert_int_le(pf.steps, po.steps - 2 * 2);
        else
            ck_assert_int_eq(pf.steps, po.steps - 2 * 2 * 2);
        ir_graph_free(fwd_only);
        ir_graph_free(copied);
        ir_graph_free(fused);
        ir_graph_free(g);
    }
}
END_TEST

/* GPT's training step planned as the cuda target compiles it with --dtype bf16 (bench/gpu_compare.sh's
 * gpt_train_bf16: codegen.c's plan options from the backend's caps, 16-bit storage of every
 * activation): every weight gradient's matmul reads its operand's transpose in place and sums its
 * product over the batch itself (CG_CAP_MATMUL_VIEWS, cg_plan.h): no step permutes the last two dims
 * into a matmul's A, no step sums such a matmul's product over the batch. Counts the steps with
 * the views and without. */
static int swaps_last_two(const IrNode *x)
{
    return x->op == IR_PERMUTE && x->rank >= 2 && x->perm[x->rank - 1] == x->rank - 2 && x->perm[x->rank - 2] == x->rank - 1;
}

static void cuda_plan(const IrGraph *g, int matmul_views, int *steps, int *kernels, int *permuted_a, int *summed,
                      int *viewed)
{
    unsigned caps = cg_cuda_backend.caps;
    CgPlanOpts o = {.head_views = (caps & CG_CAP_HEAD_VIEWS) != 0, .matmul_views = matmul_views, .storage = 1,
                    .scope = CG_STORE_ALL};
    CgPlan p;
    char err[512];
    ck_assert_msg(cg_plan_build_opts(g, &p, &o, err, sizeof err) == 0, "%s", err);
    char *stepped = calloc((size_t)g->nnodes + 1, 1);
    ck_assert_ptr_nonnull(stepped);
    for (int s = 0; s < p.nsteps; s++)
        stepped[p.steps[s].node->id] = 1;
    *steps = p.nsteps, *kernels = p.nkernels, *permuted_a = *summed = *viewed = 0;
    for (int s = 0; s < p.nsteps; s++) {
        const IrNode *x = p.steps[s].node, *a = x->in[0];
        if (x->op == IR_MATMUL && swaps_last_two(a) && stepped[a->id])
            (*permuted_a)++;
        *summed += x->op == IR_SUM && x->ia[IR_IA_AXIS] == 0 && a->op == IR_MATMUL && swaps_last_two(a->in[0]);
        *viewed += x->op == IR_MATMUL && (p.kernels[p.steps[s].kernel].views & CG_VIEW_A_T) != 0;
    }
    free(stepped);
    cg_plan_free(&p);
}

START_TEST(test_cuda_matmul_views)
{
    static const char *src = "gpt = TransformerWrapper(num_tokens = 20000, max_seq_len = 1024,\n"
                             "    attn_layers = Decoder(dim = 512, depth = 12, heads = 8))\n";
    XtLowerOpts lo = {.train = 1};
    IrGraph *g = lower_xtf(NULL, src, &lo, 1);
    ck_assert_ptr_nonnull(g);
    DrvTarget c16;
    char err[1024];
    ck_assert_msg(drv_target(&c16, &(CgOptions){.target = "cuda", .dtype = "bf16"}, err, sizeof err) == 0, "%s", err);
    IrGraph *h = pass_run_pipeline(g, &(PassOptions){.target = &c16.passes}, err, sizeof err);
    ck_assert_msg(h != NULL, "%s", err);
    int st[2], kn[2], pa[2], su[2], vw[2];
    for (int v = 0; v <= 1; v++)
        cuda_plan(h, v ? (cg_cuda_backend.caps & CG_CAP_MATMUL_VIEWS) != 0 : 0, &st[v], &kn[v], &pa[v], &su[v], &vw[v]);
    printf("GPT's cuda bf16 training step: without the transposed-A view %d steps, %d kernels, %d permutes into a "
           "matmul's A, %d batch sums of a product; with it %d steps, %d kernels, %d matmuls reading A in place\n",
           st[0], kn[0], pa[0], su[0], st[1], kn[1], vw[1]);
    ck_assert_int_eq(pa[1], 0);
    ck_assert_int_eq(su[1], 0);
    ck_assert_int_ge(vw[1], 6 * 12 + 1); /* 4 attention and 2 feed-forward projections a layer, the logits */
    ck_assert_int_ge(pa[0], 6 * 12 + 1);
    ck_assert_int_ge(su[0], 6 * 12 + 1);
    ck_assert_int_eq(st[1], st[0] - pa[0] - su[0]);
    ir_graph_free(h);
    ir_graph_free(g);
}
END_TEST

/* ---- memory: the arena at two sequence lengths ---- */

START_TEST(test_arena_linear)
{
    make_tmpdir();
    XtLowerOpts lo = {0};
    IrGraph *g = lower_xtf(NULL, decoder_src, &lo, 0);
    ck_assert_ptr_nonnull(g);
    double ratio[2];
    for (int no_fuse = 0; no_fuse <= 1; no_fuse++) {
        IrGraph *h = optimize(g, no_fuse);
        char path[600], err[1024];
        snprintf(path, sizeof path, "%s/arena_%d.so", tmpdir, no_fuse);
        CgOptions opt = {.output = path, .opt_level = 0};
        ck_assert_msg(harness_cg(h, &opt, NULL, err, sizeof err) == 0, "%s", err);
        XtcModule *m = NULL;
        ck_assert_int_eq(xtc_module_load(path, &m), XTC_OK);
        int64_t syms[8] = {0}, bytes[2];
        for (int k = 0; k < 2; k++) {
            for (int s = 0; s < xtc_module_num_symbols(m); s++) {
                const char *nm;
                xtc_module_symbol(m, s, &nm, NULL);
                syms[s] = strcmp(nm, "b") == 0 ? 1 : k ? 4096 : 2048;
            }
            bytes[k] = xtc_module_arena_bytes(m, syms);
            ck_assert_int_gt(bytes[k], 0);
        }
        ratio[no_fuse] = (double)bytes[1] / (double)bytes[0];
        printf("arena %s: %.1f MiB at n = 2048, %.1f MiB at n = 4096 (x%.2f)\n", no_fuse ? "unfused" : "fused",
               bytes[0] / 1048576.0, bytes[1] / 1048576.0, ratio[no_fuse]);
        xtc_module_free(m);
        ir_graph_free(h);
    }
    ck_assert_double_le(ratio[0], 2.05); /* linear in n */
    ck_assert_double_ge(ratio[1], 3.5);  /* n x n scores dominate */
    ir_graph_free(g);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fuse");
    TCase *tc = tcase_create("fuse");
    tcase_set_timeout(tc, 1200);
    tcase_add_unchecked_fixture(tc, make_tmpdir, remove_tmpdir);
    tcase_add_test(tc, test_kernel_counts);
    tcase_add_test(tc, test_window_fuses);
    tcase_add_test(tc, test_grouped_kv);
    tcase_add_test(tc, test_cuda_matmul_views);
    tcase_add_test(tc, test_arena_linear);
    tcase_add_test(tc, test_module_parts);
    tcase_add_test(tc, test_parity_fused);
    tcase_add_test(tc, test_parity_unfused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return harness_run(suite(), NULL); /* its fixture makes and removes the scratch directory */
}
