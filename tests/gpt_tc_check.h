/* gpt_tc_check.h: part of test_cuda_nvrtc.c (included after ptxas_check and its helpers): GPT's
 * bf16 training module's tensor-core kernels as the GPU gets them. */

/* GPT's bf16 training module's kernels on tensor cores (matmuls with GPT's epilogues, flash
 * attention forward and backward) after the bf16 prelude: NVRTC, then ptxas -v for sm_80 and sm_90
 * with no local memory, and the backward within 168 registers on sm_80 (3 blocks an SM). */
START_TEST(test_gpt_tensor_core_kernels)
{
    if (!toolkit_present())
        return;
    make_tmpdir();
    XtfFile *xf = parse_gpt();
    static const XtLowerOpts train = {.train = 1};
    char err[4096];
    PassOptions po = {.verify_each = 1};
    IrGraph *g0 = lower(xf, NULL, &train), *g = NULL;
    ck_assert_msg(g0 && harness_autodiff(g0, "cuda", err, sizeof err) == 0, "autodiff: %s", err);
    ck_assert_msg((g = harness_passes(g0, "cuda", &po, err, sizeof err)) != NULL, "passes: %s", err);
    CgPlan plan;
    ck_assert_msg(cg_plan_build_views(g, &plan, (cg_cuda_backend.caps & CG_CAP_HEAD_VIEWS) != 0, err, sizeof err) == 0,
                  "%s", err);
    CgOptions opt = {.output = "-", .mma = CG_MMA_BF16, .dtype = "bf16"};
    CuUnit u;
    char *src = NULL, *ptx = NULL;
    size_t len = 0;
    FILE *f = render_with_prelude(&plan, &opt, g, 1, &u, &src, &len);
    int kernels = 0, grads = 0, regs[2] = {0, 0};
    const char *grad = NULL;
    for (int k = 0; k < u.nkernels; k++) {
        if (!strstr(u.kernel_text[k], "xtc_mma_m16n8k16_bf16"))
            continue;
        if (plan.kernels[k].node->op == IR_ATTENTION_GRAD)
            grad = plan.kernels[k].fn, grads++;
        fprintf(f, "\n%s", u.kernel_text[k]);
        kernels++;
    }
    fclose(f);
    ck_assert(grads == 1 && kernels >= 10);
    ck_assert_msg(cg_nvrtc_compile(src, "gpt_tc.cu", "sm_80", &ptx, err, sizeof err) == 0, "%s", err);
    free(src);
    ptxas_check_entry(ptx, "gpt_tc", kernels, "GPT bf16 training, tensor-core matmuls and attention", grad, regs);
    ck_assert_msg(regs[0] <= 168, "%s takes %d registers on sm_80 (3 blocks an SM: 168)", grad, regs[0]);
    cg_cuda_unit_free(&u);
    cg_plan_free(&plan);
    ir_graph_free(g), ir_graph_free(g0), xtf_free(xf);
}
END_TEST
