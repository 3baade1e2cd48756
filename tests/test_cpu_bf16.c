/* test_cpu_bf16.c: bf16 matmuls on the CPU (CgOptions.mma = CG_MMA_BF16, xtc compile --target cpu
 * --mma=bf16): operands rounded to bf16, products summed in f32.
 *
 *   matmuls   every matmul form of the op table (tests/op_cases.h: the OC_MMA rows, and the CPU's
 *             "matmul" row: B packed past one k block of 256 with an odd k, row blocks past 192,
 *             the matrix-vector path, two-part GLU epilogues; A read through a permute) compiled for this CPU (vdpbf16ps
 *             where it has AVX512_BF16), for x86-64-v4 (AVX-512 without it: the rounding in
 *             software) and for x86-64-v3 (AVX2), run with 2 threads on random inputs against
 *             the interpreter fed the matmul operands rounded to bf16 by rt_half.h: the kernels
 *             must round as it does, so only the order of the f32 sums differs, held to
 *             OC_ATOL + rtol max|ref| (the row's rtol). A variant this CPU cannot run is named
 *             on stderr; this CPU's own always runs.
 *   ops       every op case of the CPU (op_cases.h) compiled with --dtype bf16 against the
 *             interpreter with every value the module stores in bf16 (its "storage" records, the
 *             plan's choice: the matmul weights today) rounded as stored, at the case's own
 *             tolerance; with --mma=off too where the module stores something (CK_RUN_CASE=ops).
 *   paths     the code for cooperlake (AVX512_BF16) calls vdpbf16ps, that for x86-64-v4 does not;
 *             --mma=fp16 is refused on the cpu target.
 *             (Modules here are compiled at -O0: the same kernels, compiled several times faster.)
 *   parity    the x-transformers parity cases (tests/parity_run.h) through --mma=bf16 modules
 *             against the library's f32 outputs: within 1e-4 + 2e-2 max|e| per output (the bound
 *             test_cuda_mma puts on tensor-core logits; bf16 has 8 significant bits), and not
 *             all equal to the f32 module's (the bf16 path is the one that ran). attn_sparse_topk is not
 *             run: its top-k choice of scores is discontinuous in them (the reason is printed). */
#include "codegen.h"
#include "ir.h"
#include "passes.h"
#include "rt_half.h"
#include "xtc.h"
#include "xtf.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_bind.h"
#include "op_cases.h"
#include "parity_run.h"
#include "ref_binding.h"
#include "harness_drive.h"

static void make_tmpdir(void) { harness_make_tmpdir("cpu_bf16"); }

/* ---- matmuls against the interpreter on rounded operands ---- */

static float round_bf16(float v) { return rt_bf16_to_f32(rt_f32_to_bf16(v)); }

/* the interpreter's leaves: the module's, with the matmul operands rounded to bf16 */
static void bind_rounded(RefBinding *rb, const IrGraph *g, const int64_t *syms, const Names *round)
{
    bind_random(&rb->b, g, syms, NULL);
    ref_binding_copy(rb);
    for (int i = 0; i < rb->b.n; i++)
        if (rb->b.leaf[i]->dtype == IR_F32 && is_named(round, rb->b.leaf[i]->s))
            ref_binding_round(&rb->ref[i], round_bf16);
}

/* Compiles g for cpu (NULL: this one) with --mma=bf16, or with --dtype dtype (bf16 weights and
 * matmuls; --mma=off as well when mma_off), into tmpdir/name.so; emit (or NULL) gets the LLVM IR. Returns the loaded module, or
 * NULL with the loader's reason in why (a CPU this one is not). */
static XtcModule *compile_dtype(const IrGraph *g, const char *name, const char *cpu, const char *emit, const char *dtype,
                                int mma_off, char *why, size_t n)
{
    make_tmpdir();
    char path[512], err[1024];
    snprintf(path, sizeof path, "%s/%s.%s.%s%s.so", tmpdir, name, cpu ? cpu : "native", dtype ? dtype : "mma",
             mma_off ? ".mma_off" : "");
    CgOptions opt = {.output = path, .opt_level = 0, .cpu = cpu, .mma = !dtype ? CG_MMA_BF16 : mma_off ? CG_MMA_OFF : CG_MMA_AUTO,
                     .dtype = dtype, .emit_llvm = emit, .source = "# test\n", .source_name = "t.xtf"};
    ck_assert_msg(harness_cg(g, &opt, NULL, err, sizeof err) == 0, "compiling %s for %s: %s", name, cpu ? cpu : "this CPU",
                  err);
    XtcModule *m = NULL;
    if (xtc_module_load(path, &m) != XTC_OK) {
        snprintf(why, n, "%s", xtc_module_error(m));
        xtc_module_free(m);
        return NULL;
    }
    return m;
}

static XtcModule *compile_bf16(const IrGraph *g, const char *name, const char *cpu, const char *emit, char *why,
                               size_t n)
{
    return compile_dtype(g, name, cpu, emit, NULL, 0, why, n);
}

/* max |got - ref| / max |ref| over the outputs, each held to atol + rtol max|ref| */
static double compare_outputs(const IrGraph *g, XtcSession *s, const IrHostTensor *ref, const char *what, double rtol)
{
    double worst = 0;
    for (int o = 0; o < g->noutputs; o++) {
        XtcTensor t;
        ck_assert_msg(xtc_session_get_output(s, g->outputs[o].name, &t) == XTC_OK, "%s", xtc_session_error(s));
        double maxabs;
        int64_t numel = compare_layout(what, &ref[o], &t, &maxabs);
        const float *a = t.data, *e = ref[o].data;
        double tol = OC_ATOL + rtol * maxabs, maxerr = 0;
        for (int64_t i = 0; i < numel; i++) {
            double err = fabs((double)a[i] - e[i]);
            ck_assert_msg(err <= tol, "%s output '%s': element %lld is %.9g, expected %.9g (tolerance %.3g)", what,
                          g->outputs[o].name, (long long)i, (double)a[i], (double)e[i], tol);
            maxerr = fmax(maxerr, err);
        }
        if (maxabs > 0)
            worst = fmax(worst, maxerr / maxabs);
    }
    return worst;
}

/* The matrix-vector path against weights (params: stored in bf16 by --dtype bf16, read as stored
 * by cg_llvm_gemv16.c where k is a multiple of 32): 1 or 3 rows ([b, 1, k]), 76 columns (four
 * blocks of 16 and a part), a plain product, bias and GELU as an epilogue, a residual add, and
 * GLU's two halves of one product; k = 96 (pairs path) and k = 70 (widened as read). */
static void build_gemv_weights(IrGraph *g, IrDim b, IrDim n)
{
    (void)n;
    for (int v = 0; v < 2; v++) {
        int64_t k = v ? 70 : 96;
        char w[16], o[16];
        IrDim sa[] = {b, ir_dim(1), ir_dim(k)}, sw[] = {ir_dim(76), ir_dim(k)}, sb[] = {ir_dim(76)};
        IrDim sg[] = {ir_dim(80), ir_dim(k)}, sgb[] = {ir_dim(80)}, sr[] = {b, ir_dim(1), ir_dim(76)};
        snprintf(w, sizeof w, "a%d", v);
        IrNode *a = input(g, w, IR_F32, 3, sa);
        snprintf(w, sizeof w, "w%d", v);
        snprintf(o, sizeof o, "y%d", v);
        IrNode *wt = ir_param(g, w, 2, sw);
        out(g, o, ir_matmul(g, a, wt, 1));
        snprintf(w, sizeof w, "wb%d", v);
        IrNode *p = ir_matmul(g, a, ir_param(g, w, 2, sw), 1);
        snprintf(w, sizeof w, "bias%d", v);
        snprintf(o, sizeof o, "gelu%d", v);
        out(g, o, ir_unary(g, IR_GELU, ir_binary(g, IR_ADD, p, ir_param(g, w, 1, sb))));
        snprintf(w, sizeof w, "wr%d", v);
        IrNode *q = ir_matmul(g, a, ir_param(g, w, 2, sw), 1);
        snprintf(w, sizeof w, "res%d", v);
        snprintf(o, sizeof o, "resid%d", v);
        out(g, o, ir_binary(g, IR_ADD, q, input(g, w, IR_F32, 3, sr)));
        snprintf(w, sizeof w, "wg%d", v);
        IrNode *gp = ir_matmul(g, a, ir_param(g, w, 2, sg), 1);
        snprintf(w, sizeof w, "bg%d", v);
        gp = ir_binary(g, IR_ADD, gp, ir_param(g, w, 1, sgb));
        snprintf(o, sizeof o, "glu%d", v);
        out(g, o, ir_binary(g, IR_MUL, ir_slice(g, gp, -1, ir_dim(0), ir_dim(40)),
                            ir_unary(g, IR_GELU, ir_slice(g, gp, -1, ir_dim(40), ir_dim(40)))));
        /* 2 and 4 rows per batch index (b = 1: 2 and 4 rows on the matrix-vector path) */
        for (int r = 2; r <= 4; r += 2) {
            IrDim sm[] = {b, ir_dim(r), ir_dim(k)};
            snprintf(w, sizeof w, "a%d_%d", v, r);
            snprintf(o, sizeof o, "rows%d_%d", v, r);
            out(g, o, ir_matmul(g, input(g, w, IR_F32, 3, sm), wt, 1));
        }
    }
}

static const OpCase GEMV_WEIGHTS = {"gemv_weights", build_gemv_weights, OC_CPU, OC_FUSE, 1e-5, ""};
/* A read through a permute (CG_VIEW_A_T, packed into bf16 rows by pack_a_bf16_at), summed over the batch too */
static void build_matmul_at_forms(IrGraph *g, IrDim b, IrDim n) { matmul_at_forms(g, b, n); }
static const OpCase MATMUL_AT = {"matmul_at", build_matmul_at_forms, OC_CPU, 0, 1e-4, ""};

/* the cases: the tensor-core rows, the CPU's matmul row, the matrix-vector path on weights, and A
 * read transposed */
static const OpCase *bf16_case(int k)
{
    int nmma = op_case_count(OC_MMA);
    if (k < nmma)
        return op_case_for(OC_MMA, k);
    if (k == nmma + 1)
        return &GEMV_WEIGHTS;
    if (k == nmma + 2)
        return &MATMUL_AT;
    for (int i = 0; i < OP_NCASES && k == nmma; i++)
        if (!strcmp(OP_CASES[i].name, "matmul"))
            return &OP_CASES[i];
    return NULL;
}

static const int64_t SIZES[][2] = {{1, 7}, {3, 33}, {2, 0}};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))

START_TEST(test_matmul_forms)
{
    const OpCase *c = bf16_case(_i);
    ck_assert_ptr_nonnull(c);
    IrGraph *built = harness_new_graph(c->name, c->build, 256), *g = built;
    Names ops;
    matmul_operands(built, &ops);
    if (c->flags & OC_FUSE) {
        PassOptions po = {.verify_each = 1};
        char err[1024];
        g = harness_passes(built, "cpu", &po, err, sizeof err);
        ck_assert_msg(g != NULL, "%s: passes: %s", c->name, err);
        int fused = 0;
        for (int i = 0; i < g->nnodes; i++)
            fused += g->nodes[i]->op == IR_FUSED;
        ck_assert_msg(fused >= 3, "%s: the pipeline fused %d matmul epilogues", c->name, fused);
    }
    /* --mma=bf16 for three CPUs; --dtype bf16 (the weights among the operands stored in bf16) for
     * this one and for AVX-512 without AVX512_BF16 */
    static const char *const cpus[] = {NULL, "x86-64-v4", "x86-64-v3", NULL, "x86-64-v4"};
    static const char *const dtypes[] = {NULL, NULL, NULL, "bf16", "bf16"};
    int ran = 0, stored = 0;
    for (size_t v = 0; v < sizeof cpus / sizeof cpus[0]; v++) {
        const char *cpu = cpus[v] ? cpus[v] : "this CPU";
        char why[512];
        XtcModule *m = compile_dtype(g, c->name, cpus[v], NULL, dtypes[v], 0, why, sizeof why);
        if (m && dtypes[v])
            stored += strstr(xtc_module_metadata(m), "\nstorage ") != NULL;
        if (!m) {
            ck_assert_ptr_nonnull(cpus[v]); /* this CPU runs its own code */
            fprintf(stderr, "test_cpu_bf16: %s for %s not run here: %s\n", c->name, cpu, why);
            continue;
        }
        double worst = 0;
        for (int k = 0; k < NSIZES; k++) {
            if ((SIZES[k][0] == 0 || SIZES[k][1] == 0) && !(c->flags & OC_EMPTY))
                continue;
            RefBinding rb;
            bind_rounded(&rb, g, SIZES[k], &ops);
            IrHostTensor *ref = interp_outputs(g, ref_cb, &rb, NULL, c->name);
            char what[256];
            snprintf(what, sizeof what, "%s %s --cpu=%s (b=%lld n=%lld)", c->name, dtypes[v] ? "--dtype bf16" : "--mma=bf16",
                     cpu, (long long)SIZES[k][0], (long long)SIZES[k][1]);
            XtcSession *s = NULL;
            ck_assert_msg(xtc_session_new(m, &(XtcSessionOptions){.threads = 2}, &s) == XTC_OK, "%s",
                          xtc_session_error(s));
            bind_session(s, &rb.b, what);
            ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s: %s", what, xtc_session_error(s));
            worst = fmax(worst, compare_outputs(g, s, ref, what, c->rtol));
            xtc_session_free(s);
            free_outputs(g, ref);
            bind_rounded_free(&rb);
        }
        fprintf(stderr, "test_cpu_bf16: %s %s for %s: largest error %.2g of max|ref| (interpreter on rounded "
                "operands)\n", c->name, dtypes[v] ? "--dtype bf16" : "--mma=bf16", cpu, worst);
        xtc_module_free(m);
        ran++;
    }
    ck_assert_int_ge(ran, 1);
    /* a weight read only as a matmul's B (in the graph as built): stored in bf16 by --dtype bf16 */
    int has_weight = 0;
    for (int i = 0; i < built->nnodes; i++) {
        const IrNode *w = built->nodes[i];
        int as_b = 0, other = 0;
        for (int j = 0; w->op == IR_PARAM && w->dtype == IR_F32 && j < built->nnodes; j++)
            for (int k = 0; k < built->nodes[j]->nin; k++)
                if (built->nodes[j]->in[k] == w) {
                    if (built->nodes[j]->op == IR_MATMUL && k == 1)
                        as_b = 1;
                    else
                        other = 1;
                }
        has_weight |= as_b && !other;
    }
    if (has_weight)
        ck_assert_msg(stored >= 1, "%s: --dtype bf16 stored no weight in bf16", c->name);
    if (g != built)
        ir_graph_free(g);
    ir_graph_free(built);
}
END_TEST

/* ---- every op case under --dtype bf16 ---- */

/* Per node id of g (the graph m was compiled from, as built): whether m stores its value in bf16,
 * from m's own "buffer" and "storage" records (include/abi/rt_abi.h): a leaf's buffer by its name,
 * a temp's by its node's label (t<id> without one). So the reference rounds what the plan chose
 * to store (CgPlan.storage), whatever that is: weights today, other buffers when the CPU stores
 * more. Returns how many buffers m stores in 16 bits; each must name a node of g. */
static int stored_nodes(const IrGraph *g, const XtcModule *m, uint8_t *stored)
{
    memset(stored, 0, (size_t)g->nnodes);
    const char *meta = xtc_module_metadata(m);
    int nstored = 0;
    for (const char *line = meta; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        int buf;
        char fmt[16];
        if (sscanf(line, "storage %d %15s", &buf, fmt) != 2)
            continue;
        ck_assert_str_eq(fmt, "bf16");
        char key[32], kind[16], name[256];
        snprintf(key, sizeof key, "\nbuffer %d ", buf);
        const char *rec = strstr(meta, key);
        ck_assert_msg(rec && sscanf(rec + strlen(key), "%15s %255s", kind, name) == 2, "storage %d: no buffer record", buf);
        int found = 0;
        for (int i = 0; i < g->nnodes; i++) {
            const IrNode *n = g->nodes[i];
            char label[32];
            int leaf = n->op == IR_INPUT || n->op == IR_PARAM || n->op == IR_BUFFER;
            snprintf(label, sizeof label, "t%d", n->id);
            int named = leaf ? n->s && !strcmp(n->s, name) : (n->label && !strcmp(n->label, name)) || !strcmp(label, name);
            if (named && leaf == (strcmp(kind, "temp") != 0)) {
                stored[n->id] = 1;
                found = 1;
            }
        }
        ck_assert_msg(found, "the module stores buffer %d (%s %s) in bf16, which names no node", buf, kind, name);
        nstored++;
    }
    return nstored;
}

static void round_stored(void *ctx, const IrNode *n, double *v, int64_t count)
{
    const uint8_t *stored = ctx;
    if (stored[n->id])
        for (int64_t i = 0; i < count; i++)
            v[i] = round_bf16((float)v[i]);
}

/* Runs case c's graph g compiled with --dtype bf16 (and --mma=off when mma_off) with 2 threads at
 * test_codegen's sizes against the interpreter on the same inputs, with every value the module
 * stores in bf16 rounded as stored (stored_nodes) and the leaves of round rounded as the bf16
 * matmuls round them, within the case's own tolerance. Returns how many buffers it stores. */
static int check_dtype_case(const OpCase *c, const IrGraph *g, const Names *round, int mma_off, const char *note)
{
    char why[512];
    XtcModule *m = compile_dtype(g, c->name, NULL, NULL, "bf16", mma_off, why, sizeof why);
    ck_assert_msg(m != NULL, "%s --dtype bf16: %s", c->name, why);
    uint8_t *stored = malloc((size_t)g->nnodes);
    int nstored = stored_nodes(g, m, stored);
    static const int64_t sizes[][2] = {{1, 7}, {3, 33}};
    for (int k = 0; k < 2; k++) {
        RefBinding rb;
        bind_rounded(&rb, g, sizes[k], round);
        IrHostTensor *ref = calloc((size_t)g->noutputs + 1, sizeof *ref);
        char err[512], what[256];
        ck_assert_msg(ir_interp_rounded(g, ref_cb, &rb, round_stored, stored, ref, err, sizeof err) == 0, "%s: %s",
                      c->name, err);
        snprintf(what, sizeof what, "%s --dtype bf16%s (b=%lld n=%lld)", c->name, mma_off ? " --mma=off" : "",
                 (long long)sizes[k][0], (long long)sizes[k][1]);
        XtcSession *s = NULL;
        ck_assert_msg(xtc_session_new(m, &(XtcSessionOptions){.threads = 2}, &s) == XTC_OK, "%s", xtc_session_error(s));
        bind_session(s, &rb.b, what);
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s: %s", what, xtc_session_error(s));
        for (int o = 0; o < g->noutputs; o++) {
            XtcTensor t;
            ck_assert_msg(xtc_session_get_output(s, g->outputs[o].name, &t) == XTC_OK, "%s", xtc_session_error(s));
            char at[320];
            snprintf(at, sizeof at, "%s output '%s'", what, g->outputs[o].name);
            compare_within(at, &ref[o], &t, OC_ATOL, c->rtol);
        }
        xtc_session_free(s);
        free_outputs(g, ref);
        bind_rounded_free(&rb);
    }
    fprintf(stderr, "test_cpu_bf16: %s --dtype bf16%s: %d buffers stored in bf16; within the case's tolerance%s\n",
            c->name, mma_off ? " --mma=off" : "", nstored, note);
    free(stored);
    xtc_module_free(m);
    return nstored;
}

/* Every op case of the CPU (op_cases.h, as test_codegen runs them) with --dtype bf16 for this CPU
 * (check_dtype_case). With the default --mma=bf16 the matmuls round their operands as they read
 * them, which the reference does by rounding the leaves read only by matmuls; a case where one
 * has another reader, or with fused programs (whose matmul steps round too), runs with --mma=off
 * (bf16 storage, f32 matmuls) instead, and a case that stores buffers runs with --mma=off as well,
 * where the rounding of what the module stores is the only difference from f32. */
START_TEST(test_op_cases_dtype)
{
    const OpCase *c = op_case_for(OC_CPU, _i);
    if (!strcmp(c->name, "matmul_q8")) { /* int8 weights compute in f32: the driver refuses them with --dtype */
        fprintf(stderr, "test_cpu_bf16: matmul_q8 not run with --dtype bf16 (int8 weights compute in f32: xtc compile "
                "refuses the two together)\n");
        return;
    }
    IrGraph *g = harness_new_graph(c->name, c->build, 256);
    Names ops;
    matmul_operands(g, &ops);
    char note[160] = "";
    for (int i = 0; i < g->nnodes && !note[0]; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++) {
            const IrNode *x = g->nodes[i], *in = x->in[j];
            if (x->op == IR_FUSED)
                snprintf(note, sizeof note, " (not --mma=bf16: fused programs round their matmuls' operands)");
            else if (x->op != IR_MATMUL && in->s && is_named(&ops, in->s))
                snprintf(note, sizeof note, " (not --mma=bf16: matmul operand '%s' has other readers)", in->s);
        }
    Names none = {0};
    if (note[0] || check_dtype_case(c, g, &ops, 0, "") > 0)
        check_dtype_case(c, g, &none, 1, note);
    ir_graph_free(g);
}
END_TEST

/* ---- which instructions, and what is refused ---- */

static void build_one(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sa[] = {b, n, ir_dim(64)}, sw[] = {ir_dim(64), ir_dim(48)};
    out(g, "y", ir_matmul(g, input(g, "a", IR_F32, 3, sa), ir_param(g, "w", 2, sw), 0));
}

static int ir_text_has(const char *path, const char *what)
{
    size_t len;
    char *text = harness_read_file(path, &len);
    ck_assert_msg(text != NULL, "no %s", path);
    int has = strstr(text, what) != NULL;
    free(text);
    return has;
}

START_TEST(test_paths)
{
    IrGraph *g = harness_new_graph("one", build_one, 64);
    make_tmpdir();
    static const struct {
        const char *cpu;
        int dpbf16;
    } cases[] = {{"cooperlake", 1}, {"x86-64-v4", 0}, {"x86-64-v3", 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char ll[600], why[512];
        snprintf(ll, sizeof ll, "%s/one.%s.ll", tmpdir, cases[i].cpu);
        XtcModule *m = compile_bf16(g, "one", cases[i].cpu, ll, why, sizeof why);
        xtc_module_free(m);
        ck_assert_msg(ir_text_has(ll, "llvm.x86.avx512bf16.dpbf16ps.512") == cases[i].dpbf16, "%s: vdpbf16ps %s",
                      cases[i].cpu, cases[i].dpbf16 ? "missing" : "used without AVX512_BF16");
    }
    char path[600], err[1024];
    snprintf(path, sizeof path, "%s/fp16.so", tmpdir);
    CgOptions opt = {.output = path, .opt_level = 1, .mma = CG_MMA_FP16};
    ck_assert_int_eq(harness_cg(g, &opt, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "bf16 or off"), "%s", err);
    ir_graph_free(g);
}
END_TEST

/* ---- the parity cases ---- */

START_TEST(test_parity_bf16)
{
    make_tmpdir();
    double worst = 0;
    static const char *const unfit[] = {
        "attn_sparse_topk: keeps the k largest scores of each row, a choice that rounding q and k to bf16 changes "
        "where scores are close (a discontinuity, not an error bound)",
        NULL};
    ParityRun run = {CG_MMA_BF16, 0, 1e-4, 2e-2, &worst, unfit, NULL};
    parity_run_all(&run, "parity through --mma=bf16 modules");
    fprintf(stderr, "test_cpu_bf16: parity cases with bf16 matmuls: largest error %.2g of max|expected|\n", worst);
    ck_assert_msg(worst > 1e-6, "bf16 modules gave the f32 outputs (largest error %g): were the matmuls rounded?", worst);
    /* bf16 weights (--dtype bf16), training cases included: their gradients from f32 master weights */
    double worst16 = 0;
    ParityRun stored = {CG_MMA_AUTO, 0, 1e-4, 2e-2, &worst16, unfit, "bf16"};
    parity_run_all(&stored, "parity through --dtype bf16 modules");
    fprintf(stderr, "test_cpu_bf16: parity cases with bf16 weights: largest error %.2g of max|expected|\n", worst16);
    ck_assert_msg(worst16 > 1e-6, "--dtype bf16 modules gave the f32 outputs (largest error %g)", worst16);
}
END_TEST

/* ---- training with bf16 weights: f32 master weights ---- */

/* every output of a and b (loss, logits, grad.<name>) bit for bit the same */
static void same_outputs(XtcSession *a, XtcSession *b, const XtcModule *m, const char *what)
{
    for (int o = 0; o < xtc_module_count(m, XTC_OUTPUT); o++) {
        XtcTensorInfo ti;
        xtc_module_tensor(m, XTC_OUTPUT, o, &ti);
        XtcTensor x, y;
        ck_assert_msg(xtc_session_get_output(a, ti.name, &x) == XTC_OK, "%s", xtc_session_error(a));
        ck_assert_msg(xtc_session_get_output(b, ti.name, &y) == XTC_OK, "%s", xtc_session_error(b));
        int64_t numel = 1;
        for (int d = 0; d < x.rank; d++)
            numel *= x.shape[d];
        ck_assert_msg(memcmp(x.data, y.data, (size_t)numel * xtc_dtype_size(x.dtype)) == 0,
                      "%s: output '%s' differs between --dtype bf16 and --mma=bf16", what, ti.name);
    }
}

/* A training module with --dtype bf16 keeps the weights in f32 (what the optimizer updates and
 * xtc_session_get_weight reads) and runs on bf16 copies made again after each step: its loss and
 * gradients, before and after two AdamW steps, are those of the --mma=bf16 module (f32 weights
 * rounded by the matmuls as they read them) bit for bit, and its weights after the steps are
 * that module's f32 weights, not rounded to bf16. */
START_TEST(test_train_masters)
{
    static const char src[] = "m = TransformerWrapper(num_tokens = 64, max_seq_len = 16,\n"
                              "    attn_layers = Decoder(dim = 32, depth = 2, heads = 2, ff_glu = true))\n";
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("train.xtf", src, sizeof src - 1, &d);
    ck_assert_msg(f && !d.nerrors && xtf_check(f, &d) == 0, "%s", d.text ? d.text : "parse");
    char err[1024];
    XtLowerOpts lo = {.train = 1};
    IrGraph *g = harness_build(f, NULL, &lo, 1, harness_target("cpu"), NULL, &d, err, sizeof err);
    ck_assert_msg(g != NULL, "%s", err);
    char why[512];
    XtcModule *m16 = compile_dtype(g, "train", NULL, NULL, NULL, 0, why, sizeof why);
    XtcModule *mw = compile_dtype(g, "train", NULL, NULL, "bf16", 0, why, sizeof why);
    ck_assert_ptr_nonnull(m16);
    ck_assert_ptr_nonnull(mw);
    ck_assert_msg(strstr(xtc_module_metadata(mw), "\nstorage ") != NULL, "the training module stores no weight in bf16");
    XtcSession *s[2] = {NULL, NULL};
    const XtcModule *ms[2] = {m16, mw};
    int64_t tok[2 * 6], tgt[2 * 6];
    for (int i = 0; i < 12; i++) {
        tok[i] = (i * 11 + 3) % 64;
        tgt[i] = (i * 5 + 1) % 64;
    }
    for (int v = 0; v < 2; v++) {
        ck_assert_msg(xtc_session_new(ms[v], &(XtcSessionOptions){.threads = 2}, &s[v]) == XTC_OK, "%s",
                      xtc_session_error(s[v]));
        ck_assert_int_eq(xtc_session_init_weights(s[v], 5), XTC_OK);
        ck_assert_int_eq(xtc_session_set_input(s[v], "tokens", XTC_I64, 2, (int64_t[]){2, 6}, tok), XTC_OK);
        ck_assert_int_eq(xtc_session_set_input(s[v], "targets", XTC_I64, 2, (int64_t[]){2, 6}, tgt), XTC_OK);
    }
    XtcAdamW opt = xtc_adamw_defaults();
    opt.lr = 1e-2f;
    float loss0 = 0;
    for (int step = 0; step < 3; step++) {
        for (int v = 0; v < 2; v++)
            ck_assert_msg(xtc_session_run(s[v]) == XTC_OK, "%s", xtc_session_error(s[v]));
        char what[64];
        snprintf(what, sizeof what, "after %d steps", step);
        same_outputs(s[0], s[1], mw, what);
        XtcTensor l;
        ck_assert_int_eq(xtc_session_get_output(s[1], "loss", &l), XTC_OK);
        if (step == 0)
            loss0 = *(const float *)l.data;
        else /* the step reached the bf16 copies the kernels read */
            ck_assert_msg(*(const float *)l.data != loss0, "the loss did not move after %d steps", step);
        if (step < 2)
            for (int v = 0; v < 2; v++)
                ck_assert_msg(xtc_session_step(s[v], &opt) == XTC_OK, "%s", xtc_session_error(s[v]));
    }
    int unrounded = 0;
    for (int i = 0; i < xtc_module_count(mw, XTC_PARAM); i++) {
        XtcTensorInfo ti;
        xtc_module_tensor(mw, XTC_PARAM, i, &ti);
        XtcTensor a, b;
        ck_assert_int_eq(xtc_session_get_weight(s[0], ti.name, &a), XTC_OK);
        ck_assert_int_eq(xtc_session_get_weight(s[1], ti.name, &b), XTC_OK);
        int64_t numel = 1;
        for (int k = 0; k < a.rank; k++)
            numel *= a.shape[k];
        ck_assert_msg(memcmp(a.data, b.data, (size_t)numel * 4) == 0, "weight '%s' differs", ti.name);
        for (int64_t k = 0; k < numel; k++) {
            float x = ((const float *)b.data)[k];
            unrounded += rt_bf16_to_f32(rt_f32_to_bf16(x)) != x;
        }
    }
    ck_assert_msg(unrounded > 0, "the weights after the steps are all bf16 values: not f32 masters");
    for (int v = 0; v < 2; v++)
        xtc_session_free(s[v]);
    xtc_module_free(m16);
    xtc_module_free(mw);
    ir_graph_free(g);
    xtf_free(f);
    xtf_diag_free(&d);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cpu_bf16");
    TCase *tc = tcase_create("bf16");
    tcase_set_timeout(tc, 600);
    int ncases = 0;
    while (bf16_case(ncases) && ncases < op_case_count(OC_MMA) + 3)
        ncases++;
    tcase_add_loop_test(tc, test_matmul_forms, 0, ncases);
    tcase_add_test(tc, test_paths);
    tcase_add_test(tc, test_train_masters);
    tcase_add_test(tc, test_parity_bf16);
    suite_add_tcase(s, tc);
    TCase *ops = tcase_create("ops"); /* CK_RUN_CASE=ops runs these alone */
    tcase_set_timeout(ops, 600);
    tcase_add_loop_test(ops, test_op_cases_dtype, 0, op_case_count(OC_CPU));
    suite_add_tcase(s, ops);
    return s;
}

int main(void) { return harness_run(suite(), "cpu_bf16"); }
