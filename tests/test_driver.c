/* test_driver.c: the compile driver (driver/driver.h).
 *
 *  - targets: drv_target resolves the backend, storage, loss scale and the passes' capabilities
 *    once, and refuses what a backend cannot do with one line;
 *  - capabilities: a model with heads of 512 keeps attention unfused for the CPU (its kernel
 *    takes heads up to 256) and fuses it, forward and gradient, for CUDA (up to 1024); the
 *    cuda-emu module of that training graph matches the interpreter on the unfused graph;
 *  - stages: a job stops after any stage and starts from a graph at any stage, and what each
 *    hands back is what that stage makes.
 */
#include "driver.h"
#include "ir.h"
#include "xtc.h"
#include "xtf.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_bind.h"
#include "harness_drive.h"

static void make_tmpdir(void) { harness_make_tmpdir("driver"); }

/* One decoder layer with heads of 512 (x-transformers' attn_dim_head) and few tokens. */
static const char wide_heads_src[] =
    "wide = TransformerWrapper(num_tokens = 11, max_seq_len = 8,\n"
    "    attn_layers = Decoder(dim = 16, depth = 1, heads = 1, attn_dim_head = 512))\n";

static XtfFile *parse(const char *src)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("wide.xtf", src, strlen(src), &d);
    ck_assert_msg(f && !d.nerrors && xtf_check(f, &d) == 0, "%s", d.text ? d.text : "parse");
    xtf_diag_free(&d);
    return f;
}

static int count_op(const IrGraph *g, IrOp op)
{
    int k = 0;
    for (int i = 0; i < g->nnodes; i++)
        k += g->nodes[i]->op == op;
    return k;
}

START_TEST(test_targets)
{
    DrvTarget t;
    char err[512];
    ck_assert_int_eq(drv_target(&t, NULL, err, sizeof err), 0);
    ck_assert_str_eq(t.name, "cpu");
    ck_assert_ptr_nonnull(t.backend);
    ck_assert_ptr_null(t.loss_scale);
    ck_assert_int_eq(t.passes.attention_max_head, 256);
    ck_assert_int_eq(t.passes.attention_grad_max_head, 256);
    ck_assert_int_eq(t.passes.attention_kv_groups, 1);
    ck_assert_int_eq(t.passes.attention_grad_kv_groups, 1); /* the CPU backward sums each group */
    ck_assert_ptr_nonnull(t.passes.supports);

    ck_assert_int_eq(drv_target(&t, &(CgOptions){.target = "cuda", .dtype = "fp16"}, err, sizeof err), 0);
    ck_assert_str_eq(t.name, "cuda");
    ck_assert_int_eq(t.storage, 2);
    ck_assert_int_eq(t.arch, 80);
    ck_assert_str_eq(t.loss_scale, XTC_LOSS_SCALE_INPUT); /* fp16: the session scales the loss */
    ck_assert_int_eq(t.passes.attention_max_head, 1024);
    ck_assert_int_eq(t.passes.attention_grad_max_head, 1024);
    ck_assert_int_eq(t.passes.attention_kv_groups, 1);
    /* every backward kernel sums each group, the tensor-core ones of 16-bit storage too */
    ck_assert_int_eq(t.passes.attention_grad_kv_groups, 1);
    ck_assert_int_eq(drv_target(&t, &(CgOptions){.target = "cuda-emu", .dtype = "bf16", .cuda_arch = "sm_90"},
                                err, sizeof err), 0);
    ck_assert_ptr_null(t.loss_scale); /* bf16 has f32's range */
    ck_assert_int_eq(t.arch, 90);
    ck_assert_int_eq(t.passes.attention_grad_kv_groups, 1);
    /* with CUDA cores (f32, or --mma=off) likewise: cuda and cuda-emu alike */
    static const CgOptions cores[] = {{.target = "cuda"}, {.target = "cuda-emu"},
                                      {.target = "cuda", .dtype = "bf16", .mma = CG_MMA_OFF},
                                      {.target = "cuda-emu", .dtype = "fp16", .mma = CG_MMA_OFF}};
    for (size_t i = 0; i < sizeof cores / sizeof cores[0]; i++) {
        ck_assert_int_eq(drv_target(&t, &cores[i], err, sizeof err), 0);
        ck_assert_int_eq(t.passes.attention_grad_kv_groups, 1);
    }
    ck_assert_int_eq(drv_target(&t, &(CgOptions){.target = "cuda", .mma = CG_MMA_BF16}, err, sizeof err), 0);
    ck_assert_int_eq(t.passes.attention_grad_kv_groups, 1); /* f32 storage, tensor cores asked for */

    ck_assert_int_eq(drv_target(&t, &(CgOptions){.target = "interp"}, err, sizeof err), 0);
    ck_assert_ptr_null(t.backend);
    ck_assert_ptr_null(t.passes.supports);
    ck_assert_int_eq(t.passes.attention_max_head, 0); /* no bound */

    static const struct {
        CgOptions ask;
        const char *want;
    } bad[] = {
        {{.target = "tpu"}, "unknown target 'tpu'"},
        {{.dtype = "fp16"}, "the cpu backend stores in f32 or bf16"},
        {{.dtype = "f8"}, "unknown dtype 'f8'"},
        {{.cuda_arch = "sm_80"}, "apply to --target cuda and cuda-emu, not cpu"},
        {{.mma = CG_MMA_FP16}, "the cpu backend's --mma is bf16 or off"},
        {{.target = "cuda", .cuda_arch = "sm_8x"}, "sm_8x"},
        {{.cpu = "nosuch"}, "--cpu: unknown CPU 'nosuch'"},
        {{.target = "interp", .dtype = "fp16"}, "the interpreter computes in double precision"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(drv_target(&t, &bad[i].ask, err, sizeof err), -1);
        ck_assert_msg(strstr(err, bad[i].want) && !strchr(err, '\n'), "case %zu: '%s' lacks '%s'", i, err, bad[i].want);
    }
}
END_TEST

/* The fused attention ops in the graph the driver makes for target (train: forward and backward). */
static void fused_for(const char *target, int train, int *attention, int *attention_grad)
{
    XtfFile *f = parse(wide_heads_src);
    char err[1024];
    XtLowerOpts lo = {.train = train};
    IrGraph *h = harness_build(f, NULL, &lo, train, harness_target(target), HARNESS_EVERY_PASS, NULL, err, sizeof err);
    ck_assert_msg(h != NULL, "%s: %s", target, err);
    *attention = count_op(h, IR_ATTENTION);
    *attention_grad = count_op(h, IR_ATTENTION_GRAD);
    ir_graph_free(h);
    xtf_free(f);
}

START_TEST(test_head_limit_by_target)
{
    int a, ag;
    fused_for("cpu", 0, &a, &ag);
    ck_assert_int_eq(a, 0); /* 512 > the CPU kernel's 256: the softmax stays */
    fused_for("cpu", 1, &a, &ag);
    ck_assert_int_eq(a + ag, 0);
    fused_for("cuda", 0, &a, &ag);
    ck_assert_int_eq(a, 1);
    fused_for("cuda", 1, &a, &ag);
    ck_assert_int_eq(a, 1);
    ck_assert_int_eq(ag, 1);
    fused_for("interp", 1, &a, &ag); /* the interpreter takes any head size */
    ck_assert_int_eq(a + ag, 2);

    /* a limit is plain data: one below the head size keeps the pattern, one at it fuses */
    DrvTarget t = *harness_target("cuda");
    XtfFile *f = parse(wide_heads_src);
    char err[1024];
    XtLowerOpts lo = {.train = 1};
    t.passes.attention_grad_max_head = 511; /* trained: both kernels or neither */
    IrGraph *h = harness_build(f, NULL, &lo, 1, &t, HARNESS_EVERY_PASS, NULL, err, sizeof err);
    ck_assert_msg(h != NULL, "%s", err);
    ck_assert_int_eq(count_op(h, IR_ATTENTION) + count_op(h, IR_ATTENTION_GRAD), 0);
    ir_graph_free(h);
    t.passes.attention_grad_max_head = t.passes.attention_max_head = 512;
    h = harness_build(f, NULL, &lo, 1, &t, HARNESS_EVERY_PASS, NULL, err, sizeof err);
    ck_assert_msg(h != NULL, "%s", err);
    ck_assert_int_eq(count_op(h, IR_ATTENTION) + count_op(h, IR_ATTENTION_GRAD), 2);
    ir_graph_free(h);
    xtf_free(f);
}
END_TEST

/* The CUDA kernels take those heads: the cuda-emu training module (attention and attention_grad
 * at D = E = 512) against the interpreter on the lowered, unfused graph. */
START_TEST(test_head512_cuda_emu_runs)
{
    make_tmpdir();
    XtfFile *f = parse(wide_heads_src);
    char err[2048], path[600];
    XtLowerOpts lo = {.train = 1};
    IrGraph *ref_g = harness_build(f, NULL, &lo, 1, harness_target("interp"), NULL, NULL, err, sizeof err);
    ck_assert_msg(ref_g != NULL, "%s", err);
    snprintf(path, sizeof path, "%s/wide.so", tmpdir);
    DrvJob job = {.file = f, .lower = lo, .grads = 1, .cg = {.output = path, .opt_level = 1}};
    IrGraph *h = NULL;
    ck_assert_msg(drv_run(&job, harness_target("cuda-emu"), &h, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(count_op(h, IR_ATTENTION), 1);
    ck_assert_int_eq(count_op(h, IR_ATTENTION_GRAD), 1);
    XtcModule *m = NULL;
    ck_assert_msg(xtc_module_load(path, &m) == XTC_OK, "%s", xtc_module_error(m));
    XtcSession *s = NULL;
    ck_assert_msg(xtc_session_new(m, NULL, &s) == XTC_OK, "%s", xtc_session_error(s));
    int64_t syms[IR_MAXSYM];
    for (int k = 0; k < ref_g->nsyms; k++)
        syms[k] = strcmp(ref_g->sym_name[k], "b") == 0 ? 2 : 7;
    Binding bd;
    BindDraw draw = {.param_scale = 0.5, .int_range = int_range_by_name};
    bind_random(&bd, ref_g, syms, &draw);
    bind_session(s, &bd, "wide");
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    IrHostTensor *ref = interp_outputs(ref_g, bind_cb, &bd, NULL, "wide");
    for (int o = 0; o < ref_g->noutputs; o++) {
        XtcTensor got;
        ck_assert_msg(xtc_session_get_output(s, ref_g->outputs[o].name, &got) == XTC_OK, "%s", xtc_session_error(s));
        compare_within(ref_g->outputs[o].name, &ref[o], &got, 1e-5, 1e-3);
    }
    free_outputs(ref_g, ref);
    bind_free(&bd);
    xtc_session_free(s);
    xtc_module_free(m);
    ir_graph_free(h);
    ir_graph_free(ref_g);
    xtf_free(f);
}
END_TEST

START_TEST(test_stages)
{
    make_tmpdir();
    XtfFile *f = parse(wide_heads_src);
    const DrvTarget *cpu = harness_target("cpu");
    char err[1024];
    /* after lowering: the forward graph; after autodiff: one grad.<param> output per parameter */
    IrGraph *lowered = NULL, *diffed = NULL;
    DrvJob job = {.file = f, .lower = {.train = 1}, .grads = 1, .stop_after = DRV_LOWER};
    ck_assert_msg(drv_run(&job, cpu, &lowered, NULL, err, sizeof err) == 0, "%s", err);
    job.stop_after = DRV_AUTODIFF;
    ck_assert_msg(drv_run(&job, cpu, &diffed, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(lowered->noutputs, 2); /* logits, loss */
    int params = 0;
    for (int i = 0; i < lowered->nnodes; i++)
        params += lowered->nodes[i]->op == IR_PARAM;
    ck_assert_int_eq(diffed->noutputs, 2 + params);
    ck_assert_ptr_null(ir_find_leaf(diffed, IR_INPUT, XTC_LOSS_SCALE_INPUT));

    /* from a graph: autodiff in place, with the fp16 target's loss scale; then the passes only */
    DrvTarget fp16;
    ck_assert_int_eq(drv_target(&fp16, &(CgOptions){.target = "cuda-emu", .dtype = "fp16"}, err, sizeof err), 0);
    IrGraph *none = lowered;
    DrvJob grad = {.graph = lowered, .grads = 1, .stop_after = DRV_AUTODIFF};
    ck_assert_msg(drv_run(&grad, &fp16, &none, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_ptr_null(none); /* no new graph: lowered itself was differentiated */
    ck_assert_int_eq(lowered->noutputs, 2 + params);
    ck_assert_ptr_nonnull(ir_find_leaf(lowered, IR_INPUT, XTC_LOSS_SCALE_INPUT));
    PassOptions stop = {.stop_after = "cse"};
    DrvJob passes = {.graph = diffed, .start = DRV_PASSES, .stop_after = DRV_PASSES, .passes = &stop};
    IrGraph *cleaned = NULL;
    ck_assert_msg(drv_run(&passes, cpu, &cleaned, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(count_op(cleaned, IR_FUSED), 0); /* stopped before the fusions */
    ck_assert_int_le(cleaned->nnodes, diffed->nnodes);

    /* codegen only, from the optimised graph; its statistics come back */
    char path[600];
    snprintf(path, sizeof path, "%s/stages.so", tmpdir);
    DrvJob cg = {.graph = cleaned, .start = DRV_CODEGEN, .cg = {.output = path, .opt_level = 0}};
    CgStats st = {0};
    ck_assert_msg(drv_run(&cg, cpu, NULL, &st, err, sizeof err) == 0, "%s", err);
    ck_assert_int_gt(st.nkernels, 0);

    /* refusals: one line each */
    DrvJob interp_cg = {.graph = cleaned, .start = DRV_CODEGEN, .cg = {.output = path}};
    ck_assert_int_eq(drv_run(&interp_cg, harness_target("interp"), NULL, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "interp target has no code generation"), "%s", err);
    DrvJob backwards = {.graph = cleaned, .start = DRV_CODEGEN, .stop_after = DRV_PASSES};
    ck_assert_int_eq(drv_run(&backwards, cpu, NULL, NULL, err, sizeof err), -1);
    DrvJob none_given = {.stop_after = DRV_LOWER};
    ck_assert_int_eq(drv_run(&none_given, cpu, NULL, NULL, err, sizeof err), -1);
    DrvJob missing = {.file = f, .model = "nosuch", .stop_after = DRV_LOWER};
    ck_assert_int_eq(drv_run(&missing, cpu, NULL, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "nosuch") && !strchr(err, '\n'), "%s", err);
    XtfDiag d; /* with a diagnostics sink, they go there (file:line:col and a caret) */
    xtf_diag_init(&d);
    missing.diag = &d;
    ck_assert_int_eq(drv_run(&missing, cpu, NULL, NULL, err, sizeof err), -1);
    ck_assert_int_gt(d.nerrors, 0);
    ck_assert_msg(strstr(err, "cannot lower wide.xtf"), "%s", err);
    xtf_diag_free(&d);

    ir_graph_free(cleaned);
    ir_graph_free(diffed);
    ir_graph_free(lowered);
    xtf_free(f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("driver");
    TCase *t = tcase_create("driver");
    tcase_add_test(t, test_targets);
    tcase_add_test(t, test_head_limit_by_target);
    tcase_add_test(t, test_head512_cuda_emu_runs);
    tcase_add_test(t, test_stages);
    suite_add_tcase(s, t);
    return harness_run(s, "driver");
}
