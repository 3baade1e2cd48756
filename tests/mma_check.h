/* mma_check.h: the harness of test_cuda_mma.c's checks against the interpreter: the leaves that
 * are matmul (or attention) operands, bindings whose reference copy has them rounded to 16 bits
 * as the kernels round them (and every input rounded as the runtime uploads it under 16-bit
 * storage), compiling a graph for cuda-emu with --mma, running it, and comparing each output
 * with the reference; for the attention graphs (flash_cases.h) the same per output, each with
 * its tolerance (check_flash_sizes). Included by test_cuda_mma.c once its emulated library (Lib)
 * and the storage under test (`storage`) are defined. */
#ifndef XTC_TEST_MMA_CHECK_H
#define XTC_TEST_MMA_CHECK_H

#include "ref_binding.h"

/* every integer input from 0 to 10, whatever its name (tiny_gpt's tokens and targets) */
static void int_range_tokens(const char *name, int64_t *lo, int64_t *hi)
{
    (void)name;
    *lo = 0;
    *hi = 11;
}

/* Random inputs (weights scaled by wscale); the leaves of round (matmul operands) given to the
 * interpreter are rounded as the kernels round them, by l's conversions. */
static void bind_rounded(RefBinding *rb, const IrGraph *g, const int64_t *syms, double wscale, const Lib *round_with,
                         const Names *round, int f16)
{
    BindDraw draw = {.param_scale = wscale, .int_range = int_range_tokens, .storage = 0};
    bind_random(&rb->b, g, syms, &draw);
    ref_binding_copy(rb);
    for (int i = 0; i < rb->b.n; i++) {
        const IrNode *n = rb->b.leaf[i];
        IrHostTensor *r = &rb->ref[i];
        int64_t numel = ir_host_numel(r);
        if (storage && n->dtype == IR_F32)
            for (int64_t k = 0; k < numel; k++) {
                float *v = &((float *)r->data)[k];
                *v = rt_round_to_storage(storage, *v);
            }
        if (round_with && n->dtype == IR_F32 && is_named(round, n->s))
            for (int64_t k = 0; k < numel; k++) {
                float *v = &((float *)r->data)[k];
                *v = f16 ? round_with->f16_float(round_with->f16_bits(*v))
                         : round_with->bf16_float(round_with->bf16_bits(*v));
            }
    }
}

static XtcModule *compile_mma(const IrGraph *g, const char *name, int mma)
{
    make_tmpdir();
    char path[512], err[2048];
    snprintf(path, sizeof path, "%s/%s.%s.%s.so", tmpdir, name, cg_mma_name(mma), STORAGE_NAME[storage]);
    CgOptions opt = {.output = path, .target = "cuda-emu", .opt_level = 2, .source = "# test\n",
                     .source_name = "t.xtf", .mma = mma, .dtype = STORAGE_NAME[storage]};
    ck_assert_msg(harness_cg(g, &opt, NULL, err, sizeof err) == 0, "compiling %s: %s", name, err);
    XtcModule *m = NULL;
    ck_assert_msg(xtc_module_load(path, &m) == XTC_OK, "loading %s: %s", name, xtc_module_error(m));
    return m;
}

/* Runs m on the binding; output o's values into *out (malloc'ed, numel floats). */
static XtcSession *run_module(XtcModule *m, const Binding *bd, const char *what, const char *order)
{
    setenv("XTC_CUDA_EMU_ORDER", order, 1);
    XtcSession *s = NULL;
    ck_assert_msg(xtc_session_new(m, NULL, &s) == XTC_OK, "%s: session: %s", what, xtc_session_error(s));
    bind_session(s, bd, what);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s: run: %s", what, xtc_session_error(s));
    unsetenv("XTC_CUDA_EMU_ORDER");
    return s;
}

/* max |got - ref| / max |ref| over every output, after asserting shapes and finiteness */
static double compare_outputs(const IrGraph *g, XtcSession *s, const IrHostTensor *ref, const char *what, double atol,
                              double rtol)
{
    double worst = 0;
    for (int o = 0; o < g->noutputs; o++) {
        XtcTensor t;
        ck_assert_msg(xtc_session_get_output(s, g->outputs[o].name, &t) == XTC_OK, "%s", xtc_session_error(s));
        ck_assert_int_eq(t.dtype, XTC_F32);
        ck_assert_int_eq(t.rank, ref[o].rank);
        int64_t numel = 1;
        for (int d = 0; d < t.rank; d++) {
            ck_assert_int_eq(t.shape[d], ref[o].shape[d]);
            numel *= t.shape[d];
        }
        const float *a = t.data, *e = ref[o].data;
        double maxabs = 0, maxerr = 0;
        for (int64_t i = 0; i < numel; i++)
            if (isfinite(e[i]))
                maxabs = fmax(maxabs, fabs(e[i]));
        double tol = atol + rtol * maxabs;
        for (int64_t i = 0; i < numel; i++) {
            if (a[i] == e[i]) /* also -inf where the reference has it: a row without keys' logsumexp */
                continue;
            ck_assert_msg(isfinite(a[i]), "%s output '%s': element %lld is %g", what, g->outputs[o].name,
                          (long long)i, (double)a[i]);
            double err = fabs((double)a[i] - e[i]);
            maxerr = fmax(maxerr, err);
            ck_assert_msg(err <= tol, "%s output '%s': element %lld is %.9g, expected %.9g (tolerance %.3g)", what,
                          g->outputs[o].name, (long long)i, (double)a[i], (double)e[i], tol);
        }
        if (maxabs > 0)
            worst = fmax(worst, maxerr / maxabs);
    }
    return worst;
}

static IrGraph *new_graph(const char *name, BuildFn build) { return harness_new_graph(name, build, 256); }

/* The leaves of q, k and v of g's attention nodes (through views): what the kernel rounds. */
static void attention_operands(const IrGraph *g, Names *ops)
{
    ops->n = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *x = g->nodes[i];
        if (x->op != IR_ATTENTION)
            continue;
        for (int j = 0; j < 3; j++) {
            const IrNode *l = x->in[j];
            while (l->op == IR_PERMUTE || l->op == IR_RESHAPE)
                l = l->in[0];
            ck_assert_msg(l->op == IR_INPUT, "attention operands must be leaves or their views here");
            if (!is_named(ops, l->s)) {
                ck_assert_int_lt(ops->n, HARNESS_MAXLEAF);
                ops->name[ops->n++] = l->s;
            }
        }
    }
}

/* build_flash compiled with mma (and the storage set), against the
 * interpreter fed q, k, v rounded as the kernel rounds them. What is left is the probabilities'
 * rounding to 16 bits before P V (relative u = 2^-8 bf16, 2^-11 fp16 each; |v| < 1, so at most
 * u of an output), with 16-bit storage one rounding of each output (a unit of max|ref|), and
 * f32 sums. The gradient reads o (D_i = dout_i . o_i sums E errors of u) and the statistics:
 * 16 u of its max|ref|. */
static const int64_t flash_sizes[][2] = {{1, 1}, {1, 7}, {2, 17}, {1, 70}};

static void check_flash_graph(const Lib *l, int mma, const IrGraph *g, const int64_t (*sizes)[2], size_t nsizes)
{
    Names ops;
    attention_operands(g, &ops);
    XtcModule *m = compile_mma(g, g->name, mma);
    int f16 = mma == CG_MMA_FP16;
    double u = f16 ? 1.0 / 2048 : 1.0 / 256, unit = storage ? 2 * u : 0, worst = 0;
    for (size_t z = 0; z < nsizes; z++) {
        RefBinding rb;
        bind_rounded(&rb, g, sizes[z], 1.0, l, &ops, f16);
        IrHostTensor *ref = interp_outputs(g, ref_cb, &rb, NULL, "flash");
        char what[128];
        snprintf(what, sizeof what, "%s --mma=%s --dtype %s (%s=%lld %s=%lld)", g->name, cg_mma_name(mma),
                 STORAGE_NAME[storage], g->sym_name[0], (long long)sizes[z][0], g->sym_name[1], (long long)sizes[z][1]);
        XtcSession *s = run_module(m, &rb.b, what, ORDERS[z % 3]);
        for (int o = 0; o < g->noutputs; o++) { /* one output at a time: its own tolerance */
            IrGraph one = *g;
            one.outputs = &g->outputs[o];
            one.noutputs = 1;
            int grad = strstr(g->outputs[o].name, "grad") != NULL;
            worst = fmax(worst, compare_outputs(&one, s, &ref[o], what, OC_ATOL + u, (grad ? 16 * u : 1e-5) + unit));
        }
        xtc_session_free(s);
        free_outputs(g, ref);
        bind_rounded_free(&rb);
    }
    fprintf(stderr, "test_cuda_mma: flash attention --mma=%s --dtype %s: largest error %.2g of max|ref|\n",
            cg_mma_name(mma), STORAGE_NAME[storage], worst);
    xtc_module_free(m);
}

/* check_flash_graph on build's graph over the sizes b and n */
static void check_flash_sizes(const Lib *l, int mma, BuildFn build, const int64_t (*sizes)[2], size_t nsizes)
{
    IrGraph *g = new_graph("flash", build);
    check_flash_graph(l, mma, g, sizes, nsizes);
    ir_graph_free(g);
}

static void check_flash(const Lib *l, int mma, BuildFn build)
{
    check_flash_sizes(l, mma, build, flash_sizes, sizeof flash_sizes / sizeof flash_sizes[0]);
}

#endif
