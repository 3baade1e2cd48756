/* fused_rows_check.h: part of test_cuda_nvrtc.c (included after ptxas_check and count_in): the
 * fused row kernels of GPT's bf16 training step at its sizes (per-row reductions: LayerNorm
 * forward and backward, the cross-entropy gradient over 20000 classes) and its cross-entropy
 * loss (cg_cuda_reduce.c), as the GPU gets them: each has the path of 8 columns a thread, whose
 * 16-byte loads (and stores, where the row written is longer than 1) are v4 in the PTX; NVRTC
 * compiles them and ptxas -v assembles them for sm_80 and sm_90 with no local memory.
 * CK_RUN_CASE="fused rows" runs it alone. */

START_TEST(test_fused_row_kernels)
{
    if (!toolkit_present())
        return;
    make_tmpdir();
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *xf = xtf_parse_file(XTC_SOURCE_DIR "/models/gpt.xtf", &d);
    ck_assert_msg(xf && !d.nerrors && xtf_check(xf, &d) == 0, "gpt.xtf: %s", d.text ? d.text : "");
    xtf_diag_free(&d);
    XtLowerOpts lo = {.train = 1};
    char err[4096];
    IrGraph *g = harness_build(xf, NULL, &lo, 1, harness_target("cuda"), HARNESS_EVERY_PASS, NULL, err, sizeof err);
    ck_assert_msg(g != NULL, "%s", err);
    CgPlan plan;
    ck_assert_msg(cg_plan_build(g, &plan, err, sizeof err) == 0, "%s", err);
    CgOptions opt = {.output = "-", .dtype = "bf16"};
    CuUnit u;
    char *src = NULL;
    size_t len = 0;
    FILE *f = render_with_prelude(&plan, &opt, g, 1, &u, &src, &len);
    int rows = 0, stores = 0, xent = 0, ln_grad = 0, loss = 0;
    for (int k = 0; k < u.nkernels; k++) {
        const char *t = u.kernel_text[k];
        IrOp op = plan.kernels[k].node->op;
        if (op == IR_XENT) { /* the loss (cg_cuda_reduce.c) */
            ck_assert_msg(strstr(t, "if (vec) {") && strstr(t, "xtc_ld8(v, x, j)"), "%s", t);
            fprintf(f, "\n%s", t);
            rows++;
            loss++;
            continue;
        }
        if (op != IR_FUSED || !strstr(t, "float red"))
            continue; /* a fused program without reductions, or with a matmul */
        ck_assert_msg(strstr(t, "if (vec) {") && strstr(t, "xtc_ld8("), "%s", t);
        fprintf(f, "\n%s", t);
        rows++;
        stores += strstr(t, "xtc_st8(out") != NULL;
        xent += strstr(t, "softmax over 20000 columns") != NULL;
        ln_grad += strstr(t, "xtc_st8(out") && strstr(t, "in4") && count_in(t, NULL, "sum over 512") >= 2;
    }
    fclose(f);
    ck_assert_int_ge(rows, 3);
    ck_assert_int_eq(xent, 1); /* the cross-entropy gradient */
    ck_assert_int_eq(loss, 1);
    ck_assert_int_ge(ln_grad, 1); /* LayerNorm backward: two sums over 512 columns of five operands */
    char *ptx = NULL;
    ck_assert_msg(cg_nvrtc_compile(src, "fused_rows.cu", "sm_80", &ptx, err, sizeof err) == 0, "%s", err);
    free(src);
    int v4 = 0, st4 = 0;
    for (const char *e = strstr(ptx, ".entry "); e; e = strstr(e + 1, ".entry ")) {
        const char *end = strstr(e + 1, ".entry ");
        v4 += count_in(e, end, "ld.global.nc.v4.") + count_in(e, end, "ld.global.v4.") > 0;
        st4 += count_in(e, end, "st.global.v4.") > 0;
    }
    ck_assert_int_eq(v4, rows);
    ck_assert_int_eq(st4, stores); /* those writing rows longer than 1 */
    ptxas_check(ptx, "fused_rows", rows, "fused row kernels (8 columns a thread: 16-byte loads and stores)");
    cg_cuda_unit_free(&u);
    cg_plan_free(&plan);
    ir_graph_free(g);
    xtf_free(xf);
}
END_TEST
