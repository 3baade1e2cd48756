/* test_codegen.c: the LLVM CPU backend and the module runtime, checked against the reference
 * interpreter (ir_interp).
 *
 * Each case builds a small graph holding several ops, compiles it once to a module in a temp
 * directory, and runs it at bindings of the symbols (b, n) (SIZES: ragged, size 1, and empty
 * for the cases that allow it) with 1 and 2 threads, on random
 * inputs, comparing every output with the interpreter's: f32 within 1e-5 + 1e-4 * max|ref|,
 * integers and bools exactly. Sizes are ragged on purpose (1, 7, 17, 33, 65, 130: not multiples
 * of the vector width or the matmul blocks).
 *
 * The op cases come from the one table, tests/op_cases.h (its rows for OC_CPU); adding an op:
 * the recipe at its top (test_every_op_has_a_case fails until a case uses it). */
#include "codegen.h"
#include "ir.h"
#include "rt_alloc.h"
#include "rt_internal.h"
#include "safetensors.h"
#include "xtc.h"
#include "xtf.h"

#include <check.h>
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "harness_drive.h"
#include "harness_bind.h"
#include "op_cases.h"
#include "parity_run.h"

static void make_tmpdir(void) { harness_make_tmpdir("codegen"); }

/* ---- the harness ---- */

static IrGraph *new_graph(const char *name, BuildFn build) { return harness_new_graph(name, build, 64); }

static XtcModule *compile_with(const IrGraph *g, const char *name, CgStats *stats, int opt_level, const char *cpu)
{
    make_tmpdir();
    char path[512], err[1024];
    snprintf(path, sizeof path, "%s/%s.so", tmpdir, name);
    CgOptions opt = {.output = path, .opt_level = opt_level, .cpu = cpu, .source = "# test source\n",
                     .source_name = "test.xtf"};
    ck_assert_msg(harness_cg(g, &opt, stats, err, sizeof err) == 0, "compiling %s: %s", name, err);
    XtcModule *m = NULL;
    int st = xtc_module_load(path, &m);
    ck_assert_msg(st == XTC_OK, "loading %s: %s", name, xtc_module_error(m));
    return m;
}

static XtcModule *compile_load(const IrGraph *g, const char *name, CgStats *stats)
{
    return compile_with(g, name, stats, 2, NULL);
}

/* Runs module m on g's outputs at symbol values syms with each of the nt thread counts. */
static void check_threads(const IrGraph *g, XtcModule *m, const int64_t *syms, const char *name, const int *nthreads,
                          int nt, double rtol)
{
    Binding bd;
    bind_random(&bd, g, syms, NULL);
    IrHostTensor *ref = interp_outputs(g, bind_cb, &bd, NULL, name);
    for (int ti = 0; ti < nt; ti++) {
        int threads = nthreads[ti];
        XtcSessionOptions so = {.threads = threads};
        XtcSession *s = NULL;
        ck_assert_msg(xtc_session_new(m, &so, &s) == XTC_OK, "%s", xtc_session_error(s));
        bind_session(s, &bd, NULL);
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s: run: %s", name, xtc_session_error(s));
        for (int o = 0; o < g->noutputs; o++) {
            XtcTensor t;
            ck_assert_msg(xtc_session_get_output(s, g->outputs[o].name, &t) == XTC_OK, "%s", xtc_session_error(s));
            char what[256];
            snprintf(what, sizeof what, "%s output '%s' (b=%lld n=%lld, %d thread%s)", name, g->outputs[o].name,
                     (long long)syms[0], (long long)syms[1], threads, threads > 1 ? "s" : "");
            compare_within(what, &ref[o], &t, OC_ATOL, rtol);
        }
        ck_assert_int_ge(xtc_session_peak_bytes(s), 0);
        xtc_session_free(s);
    }
    free_outputs(g, ref);
    bind_free(&bd);
}

/* ... with 1 and 2 threads */
static void check_against_interp(const IrGraph *g, XtcModule *m, const int64_t *syms, const char *name)
{
    static const int one_two[] = {1, 2};
    check_threads(g, m, syms, name, one_two, 2, 1e-4);
}

/* The sizes every case runs at, on one module: two ragged ones, symbolic dims that come out as 1
 * (not broadcast: a size-1 value of a symbol), and (the cases with OC_EMPTY) as 0. */
static const int64_t SIZES[][2] = {{1, 7}, {3, 33}, {1, 1}, {2, 1}, {2, 0}, {0, 3}};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))

/* ---- the op cases (op_cases.h) for the CPU ---- */

START_TEST(test_case)
{
    static const int one_two[] = {1, 2};
    const OpCase *c = op_case_for(OC_CPU, _i);
    IrGraph *g = new_graph(c->name, c->build);
    CgStats stats;
    XtcModule *m = compile_load(g, c->name, &stats);
    for (int k = 0; k < NSIZES; k++)
        if ((SIZES[k][0] && SIZES[k][1]) || (c->flags & OC_EMPTY))
            check_threads(g, m, SIZES[k], c->name, one_two, 2, c->rtol);
    xtc_module_free(m);
    ir_graph_free(g);
}
END_TEST

START_TEST(test_every_op_has_a_case)
{
    int op = op_cases_missing(OP_CASES, OP_NCASES, OC_CPU, NULL);
    ck_assert_msg(op < 0, "op '%s' has no case for the CPU in tests/op_cases.h", op < 0 ? "" : ir_ops[op].name);
}
END_TEST

/* ... and the check catches an op without a case: the table without its cross-entropy case */
START_TEST(test_an_op_without_a_case_fails)
{
    OpCase some[OP_NCASES];
    int n = 0;
    for (int c = 0; c < OP_NCASES; c++)
        if (strcmp(OP_CASES[c].name, "xent") != 0)
            some[n++] = OP_CASES[c];
    ck_assert_int_eq(n, OP_NCASES - 1);
    ck_assert_int_eq(op_cases_missing(some, n, OC_CPU, NULL), IR_XENT);
}
END_TEST

START_TEST(test_every_op_has_a_lowering)
{
    for (int op = 0; op < IR_NUM_OPS; op++)
        ck_assert_msg(cg_llvm_backend.supports((IrOp)op), "the LLVM backend has no lowering for '%s'",
                      ir_ops[op].name);
}
END_TEST

/* ---- other optimisation levels and CPUs: the matmul for 4 and 8 float lanes, O0 and O3 ---- */

START_TEST(test_levels_and_cpus)
{
    static const struct {
        int level;
        const char *cpu;
    } variants[] = {{0, NULL}, {1, NULL}, {3, NULL}, {2, "x86-64"}, {2, "haswell"}};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        /* the attention kernels' tiles (and the backward's register transposes) for 4 and 8 lanes */
        static const BuildFn builds[] = {build_matmul, build_reduce, build_move, build_attention_tiles};
        static const char *const names[] = {"matmul", "reduce", "move", "attention"};
        for (size_t k = 0; k < (variants[v].cpu ? 4u : 3u); k++) {
            IrGraph *g = new_graph(names[k], builds[k]);
            char name[64];
            snprintf(name, sizeof name, "variant%zu_%zu", v, k);
            CgStats stats;
            XtcModule *m = compile_with(g, name, &stats, variants[v].level, variants[v].cpu);
            for (int i = 0; i < 2; i++)
                check_against_interp(g, m, SIZES[i], name);
            xtc_module_free(m);
            ir_graph_free(g);
        }
    }
}
END_TEST

/* An unknown CPU name or a malformed feature string is an error naming it, before LLVM sees it
 * (LLVM aborts the process on a CPU it does not know). */
START_TEST(test_bad_cpu_refused)
{
    static const struct {
        const char *cpu, *features, *want;
    } bad[] = {{"skylake-avx51", NULL, "did you mean 'skylake-avx512'"},
               {"i686", NULL, "32-bit"},
               {"nosuchcpu", NULL, "unknown CPU 'nosuchcpu'"},
               {"x86-64", "avx2", "bad CPU feature 'avx2'"},
               {"x86-64", "+avx2,+", "bad CPU feature '+'"}};
    make_tmpdir();
    IrGraph *g = new_graph("badcpu", build_move);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[512], err[1024];
        snprintf(path, sizeof path, "%s/badcpu%zu.so", tmpdir, i);
        CgOptions opt = {.output = path, .opt_level = 0, .cpu = bad[i].cpu, .features = bad[i].features,
                         .source = "# test source\n", .source_name = "test.xtf"};
        ck_assert_int_ne(cg_compile(g, &opt, NULL, err, sizeof err), 0);
        ck_assert_msg(strstr(err, bad[i].want) != NULL, "cpu %s: '%s' lacks '%s'", bad[i].cpu, err, bad[i].want);
    }
    static const char *const good[] = {"generic", "native", "x86-64-v3", "skylake-avx512", "znver4"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char err[1024];
        ck_assert_msg(cg_cpu_check(good[i], "+avx2,-avx512f", err, sizeof err) == 0, "%s: %s", good[i], err);
    }
    ir_graph_free(g);
}
END_TEST

/* More threads than MIN_ITEMS (cg_llvm_matmul.c): a matmul with fewer (batch, column block)
 * pairs than threads splits its rows into more blocks, the work function and the kernel both
 * from the session's thread count ("tall": 4 pairs of 401 rows, 3 row blocks each at 9
 * threads, 2 at 5, 1 at 2); the fused case's matmul epilogues too; and the forward attention's
 * query tiles per item, fewer when there are more threads (group_rt, cg_llvm_attention.c: at
 * n = 33, 9 heads of 13 tiles are 18 items of 8 tiles at 1 and 2 threads, 27 of 5 at 5, 45 of 3
 * at 9; at n = 7, 3 heads of 4 tiles are 3 items at 1 thread, 12 of 1 at 2). */
START_TEST(test_matmul_many_threads)
{
    static const BuildFn builds[] = {build_matmul, build_fused, build_attention_tiles};
    static const char *const names[] = {"matmul_threads", "fused_threads", "attention_threads"};
    static const int many[] = {5, 9};
    for (int k = 0; k < 3; k++) {
        IrGraph *g = new_graph(names[k], builds[k]);
        CgStats stats;
        XtcModule *m = compile_load(g, names[k], &stats);
        for (int i = 0; i < 2; i++)
            check_threads(g, m, SIZES[i], names[k], many, 2, 1e-4);
        xtc_module_free(m);
        ir_graph_free(g);
    }
}
END_TEST

/* A matmul epilogue's loop over columns is vectorised: the program below is the gradient of
 * GPT's FF product times gelu'(x) (erf and exp per element, an operand read beside the product).
 * The product is rewritten in place; once its load had another address expression than the
 * store, the vectoriser versioned the loop on an overlap check that always fails (the same
 * memory) and the scalar copy ran: 196 instead of 90 ms in GPT's training step. The optimised IR
 * of the kernel (skylake-avx512, so the IR is the same on every host) must have no scalar float
 * multiply. */
static void build_epilogue_grad(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(64)}, sw[] = {ir_dim(64), ir_dim(256)}, so[] = {b, n, ir_dim(256)};
    IrNode *in[3] = {input(g, "pre", IR_F32, 3, so), input(g, "dy", IR_F32, 3, sx), input(g, "w", IR_F32, 2, sw)};
    out(g, "dx", ir_fused(g, "matmul($1,$2,0);mul($0,0.7071067811865476:f32);erf(%1);add(%2,1:f32);mul(%3,0.5:f32);"
                             "mul($0,$0);mul(%5,-0.5:f32);exp(%6);mul(%7,0.3989422804014327:f32);mul($0,%8);"
                             "add(%4,%9);mul(%0,%10)", 3, in, 3, so));
}

START_TEST(test_epilogue_vectorized)
{
    IrGraph *g = new_graph("epilogue_grad", build_epilogue_grad);
    make_tmpdir();
    char path[512], llpath[512], err[1024];
    snprintf(path, sizeof path, "%s/epilogue_grad.so", tmpdir);
    snprintf(llpath, sizeof llpath, "%s/epilogue_grad.ll", tmpdir);
    CgOptions opt = {.output = path, .opt_level = 2, .cpu = "skylake-avx512", .emit_llvm = llpath,
                     .source = "# test source\n", .source_name = "test.xtf"};
    CgStats stats;
    ck_assert_msg(harness_cg(g, &opt, &stats, err, sizeof err) == 0, "compiling: %s", err);
    FILE *f = fopen(llpath, "r");
    ck_assert_msg(f != NULL, "%s: not written", llpath);
    static char text[1 << 22];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    char *fn = strstr(text, "_fused_impl(");
    ck_assert_msg(fn != NULL, "no fused kernel in %s", llpath);
    char *end = strstr(fn, "\ndefine ");
    if (end)
        *end = 0;
    int scalar = 0, vector = 0;
    for (char *p = strstr(fn, " = fmul "); p; p = strstr(p + 1, " = fmul ")) {
        char *ty = p + 8; /* past the fast-math flags to the type */
        while (strncmp(ty, "float ", 6) != 0 && strncmp(ty, "<", 1) != 0 && *ty && *ty != '\n')
            ty = strchr(ty, ' ') ? strchr(ty, ' ') + 1 : ty + strlen(ty);
        scalar += strncmp(ty, "float ", 6) == 0;
        vector += strncmp(ty, "<16 x float>", 12) == 0;
    }
    ck_assert_msg(vector > 0, "the fused matmul kernel has no 16-lane multiply at all (%s)", llpath);
    ck_assert_msg(scalar == 0, "the epilogue has %d scalar float multiplies: not vectorised (%s)", scalar, llpath);
    ir_graph_free(g);
}
END_TEST

/* A module with no kernel at all: its output is a reshaped input. */
static void build_identity(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(6)}, sy[] = {b, n, ir_dim(2), ir_dim(3)};
    out(g, "y", ir_reshape(g, input(g, "x", IR_F32, 3, sx), 4, sy));
}

START_TEST(test_no_kernels)
{
    IrGraph *g = new_graph("identity", build_identity);
    CgStats stats;
    XtcModule *m = compile_load(g, "identity", &stats);
    ck_assert_int_eq(stats.nsteps, 0);
    check_against_interp(g, m, SIZES[1], "identity");
    xtc_module_free(m);
    ir_graph_free(g);
}
END_TEST

/* ---- graphs from the IR text files ---- */

START_TEST(test_ir_files)
{
    const char *files[] = {"attention", "basic", "memory"};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char path[512], err[1024];
        snprintf(path, sizeof path, "%s/tests/ir/%s.ir", XTC_SOURCE_DIR, files[f]);
        FILE *fp = fopen(path, "r");
        if (!fp)
            continue;
        static char text[1 << 16];
        size_t len = fread(text, 1, sizeof text - 1, fp);
        text[len] = 0;
        fclose(fp);
        IrGraph *g = ir_parse(text, path, err, sizeof err);
        ck_assert_msg(g != NULL, "%s", err);
        CgStats stats;
        XtcModule *m = compile_load(g, files[f], &stats);
        for (int k = 0; k < 2; k++) {
            int64_t syms[IR_MAXSYM];
            for (int s = 0; s < g->nsyms; s++) {
                int64_t v = strcmp(g->sym_name[s], "b") == 0 ? (k ? 3 : 1) : (k ? 17 : 5);
                syms[s] = g->sym_max[s] && v > g->sym_max[s] ? g->sym_max[s] : v;
            }
            check_against_interp(g, m, syms, files[f]);
        }
        xtc_module_free(m);
        ir_graph_free(g);
    }
}
END_TEST

/* ---- kernels are shared between identical layers ---- */

static void build_layers(IrGraph *g, IrDim b, IrDim n)
{
    IrDim sx[] = {b, n, ir_dim(16)}, sw[] = {ir_dim(16), ir_dim(16)};
    IrNode *x = input(g, "x", IR_F32, 3, sx);
    for (int l = 0; l < 12; l++) {
        char name[32];
        snprintf(name, sizeof name, "layers.%d.w", l);
        IrNode *h = ir_matmul(g, x, ir_param(g, name, 2, sw), 1);
        x = ir_binary(g, IR_ADD, x, ir_unary(g, IR_GELU, h));
    }
    out(g, "y", x);
}

/* Derived symbols (Transformer-XL's q = min(n+p, 6) memory rows): the runtime evaluates them once
 * the inputs bind n and p, buffers and outputs follow, and an input whose shape names q is checked
 * against it. Sizes: a first segment shorter than the cap, one cut to it, an empty one. */
START_TEST(test_derived_symbols)
{
    IrGraph *g = ir_graph_new("derived");
    IrDim b = ir_dim_sym(ir_graph_add_sym(g, "b", 0)), n = ir_dim_sym(ir_graph_add_sym(g, "n", 8));
    IrDim p = ir_dim_sym(ir_graph_add_sym(g, "p", 6)), np = ir_dim_add(n, p);
    IrDim q = ir_dim_sym(ir_graph_add_derived_sym(g, "q", np, 6));
    IrDim sm[] = {b, p, ir_dim(5)}, sx[] = {b, n, ir_dim(5)}, sw[] = {q}, sw3[] = {ir_dim(1), q, ir_dim(1)};
    IrNode *all = ir_concat(g, input(g, "mem", IR_F32, 3, sm), input(g, "x", IR_F32, 3, sx), 1);
    IrNode *kept = ir_slice(g, all, 1, ir_dim_sub(np, q), q);
    out(g, "kept", kept);
    out(g, "weighted", ir_binary(g, IR_MUL, kept, ir_reshape(g, input(g, "w", IR_F32, 1, sw), 3, sw3)));
    out(g, "sums", ir_reduce(g, IR_SUM, all, 1));
    XtcModule *m = compile_load(g, "derived", NULL);
    static const int64_t sizes[][3] = {{1, 3, 0}, {2, 5, 3}, {2, 2, 6}, {1, 8, 6}, {3, 0, 0}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int64_t syms[IR_MAXSYM] = {sizes[i][0], sizes[i][1], sizes[i][2]};
        ir_graph_derive_syms(g, syms);
        check_against_interp(g, m, syms, "derived");
    }
    /* w of the wrong length for q = min(3 + 0, 6) = 3 */
    int64_t syms[IR_MAXSYM] = {1, 3, 0, 4};
    Binding bd;
    bind_random(&bd, g, syms, NULL);
    XtcSession *s = NULL;
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    bind_session(s, &bd, NULL);
    ck_assert_int_eq(xtc_session_run(s), XTC_ERR_SHAPE);
    ck_assert_msg(strstr(xtc_session_error(s), "input 'w': dimension 0 is 4 but q = 3"), "%s", xtc_session_error(s));
    int64_t right[1] = {3};
    ck_assert_int_eq(xtc_session_set_input(s, "w", XTC_F32, 1, right, bd.t[2].data), XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    ck_assert_int_eq(xtc_session_symbol(s, 3), 3);
    xtc_session_free(s);
    bind_free(&bd);
    xtc_module_free(m);
    ir_graph_free(g);
}
END_TEST

/* xtc_session_carry: a state that grows by a row per call (as a KV cache does) handed from an
 * output to an input, the first time by a copy and then as the output's own memory; the other
 * outputs stay readable after a carry; and the refusals. */
/* The output "next" of test_carry: rows_out rows, the first `rows` of them state's. */
static void expect_next(XtcSession *s, int64_t rows_out, const float *state, int64_t rows, const char *when)
{
    XtcTensor nx;
    ck_assert_msg(xtc_session_get_output(s, "next", &nx) == XTC_OK, "%s: %s", when, xtc_session_error(s));
    ck_assert_int_eq(nx.shape[0], rows_out);
    for (int64_t i = 0; i < rows * 3; i++)
        ck_assert_msg(((const float *)nx.data)[i] == state[i], "%s: next[%lld]", when, (long long)i);
}

START_TEST(test_carry)
{
    IrNode *next;
    IrGraph *g = harness_carry_graph(&next);
    out(g, "negative", ir_binary(g, IR_LT, next, ir_const(g, 0, IR_F32)));
    XtcModule *m = compile_load(g, "carry", NULL);
    XtcSession *s = NULL;
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    float state[17 * 3] = {1, 2, 3};
    int64_t rows = 1, sh[2] = {1, 3}, xs[2] = {1, 3};
    ck_assert_int_eq(xtc_session_set_input(s, "state", XTC_F32, 2, sh, state), XTC_OK);
    ck_assert_int_eq(xtc_session_carry(s, "next", "state"), XTC_ERR_STATE); /* no run yet */
    for (int t = 0; t < 6; t++) {
        float x[3] = {(float)t, t + 0.5f, -(float)t};
        ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 2, xs, x), XTC_OK);
        if (t == 1) /* the first run writing the output outside the arena: its allocation fails */
            rt_fault_fail_after(0);
        int st = xtc_session_run(s);
        rt_fault_fail_after(-1);
        if (t == 1) {
            ck_assert_int_eq(st, XTC_ERR_MEMORY);
            ck_assert_msg(strstr(xtc_session_error(s), "out of memory for output 'next'"), "%s", xtc_session_error(s));
            st = xtc_session_run(s);
        }
        ck_assert_msg(st == XTC_OK, "%s", xtc_session_error(s));
        memcpy(state + rows * 3, x, sizeof x);
        rows++;
        ck_assert_int_eq(xtc_session_carry(s, "next", "state"), XTC_OK);
        XtcTensor tw, nx;
        ck_assert_int_eq(xtc_session_get_output(s, "twice", &tw), XTC_OK);
        ck_assert_int_eq(xtc_session_get_output(s, "next", &nx), XTC_OK);
        ck_assert_int_eq(tw.shape[0], rows);
        for (int64_t i = 0; i < rows * 3; i++) {
            ck_assert_msg(((const float *)nx.data)[i] == state[i], "call %d: next[%lld]", t, (long long)i);
            ck_assert_msg(((const float *)tw.data)[i] == 2 * state[i], "call %d: twice[%lld]", t, (long long)i);
        }
    }
    /* the carried state is the input: one more call sees all 7 rows */
    ck_assert_int_eq(xtc_session_run(s), XTC_OK);
    expect_next(s, rows + 1, state, rows, "last call");
    /* the same output carried twice without a run between: it is in the input's memory (in
     * place, or handed over by the first carry), so the second changes nothing */
    ck_assert_int_eq(xtc_session_carry(s, "next", "state"), XTC_OK);
    ck_assert_int_eq(xtc_session_carry(s, "next", "state"), XTC_OK);
    expect_next(s, rows + 1, state, rows, "carried twice");
    ck_assert_int_eq(xtc_session_run(s), XTC_OK);
    expect_next(s, rows + 2, state, rows, "after two carries");
    ck_assert_int_eq(xtc_session_carry(s, "nope", "state"), XTC_ERR_NAME);
    ck_assert_int_eq(xtc_session_carry(s, "next", "nope"), XTC_ERR_NAME);
    ck_assert_int_eq(xtc_session_carry(s, "next", "x"), XTC_ERR_SHAPE); /* 8 rows for [1, 3] */
    ck_assert_msg(strstr(xtc_session_error(s), "input 'x'"), "%s", xtc_session_error(s));
    ck_assert_int_eq(xtc_session_carry(s, "negative", "state"), XTC_ERR_SHAPE); /* bool into f32 */
    ck_assert_msg(strstr(xtc_session_error(s), "bool"), "%s", xtc_session_error(s));
    xtc_session_free(s);
    xtc_module_free(m);
    ir_graph_free(g);
}
END_TEST

/* Carrying an output that appends to its input: with only dimensions of size 1 before the concat
 * axis the run writes it in place over the input (its memory stays the same from call to call
 * while it has room), else it is written apart; the values are those of the concatenation. */
static void carry_append(int lead, int axis)
{
    IrGraph *g = ir_graph_new("append");
    IrDim n = ir_dim_sym(ir_graph_add_sym(g, "n", 64));
    IrDim ss[3] = {ir_dim(lead), n, ir_dim(3)}, sx[3] = {ir_dim(lead), ir_dim(1), ir_dim(3)};
    if (axis == 2) /* [lead, 3, n] */
        ss[1] = ir_dim(3), ss[2] = n, sx[1] = ir_dim(3), sx[2] = ir_dim(1);
    out(g, "next", ir_concat(g, input(g, "state", IR_F32, 3, ss), input(g, "x", IR_F32, 3, sx), axis));
    XtcModule *m = compile_load(g, "append", NULL);
    XtcSession *s = NULL;
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), XTC_OK);
    enum { CALLS = 40 };
    int64_t sh[3] = {lead, axis == 1 ? 0 : 3, axis == 1 ? 3 : 0}, xs[3] = {lead, axis == 1 ? 1 : 3, axis == 1 ? 3 : 1};
    float dummy = 0;
    ck_assert_int_eq(xtc_session_set_input(s, "state", XTC_F32, 3, sh, &dummy), XTC_OK);
    const void *last = NULL;
    int same = 0;
    for (int t = 0; t < CALLS; t++) {
        float x[6];
        for (int i = 0; i < 3 * lead; i++)
            x[i] = (float)(100 * t + i);
        ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 3, xs, x), XTC_OK);
        ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
        XtcTensor nx;
        ck_assert_int_eq(xtc_session_get_output(s, "next", &nx), XTC_OK);
        same += nx.data == last;
        last = nx.data;
        /* element [b, r, c] (axis 1) or [b, c, r] (axis 2) of call r is 100 r + 3 b + c */
        const float *v = nx.data;
        for (int b = 0; b < lead; b++)
            for (int r = 0; r <= t; r++)
                for (int c = 0; c < 3; c++) {
                    int64_t at = axis == 1 ? ((int64_t)b * (t + 1) + r) * 3 + c : ((int64_t)b * 3 + c) * (t + 1) + r;
                    ck_assert_msg(v[at] == (float)(100 * r + 3 * b + c), "lead %d axis %d call %d: [%d, %d, %d] = %g",
                                  lead, axis, t, b, r, c, (double)v[at]);
                }
        ck_assert_int_eq(xtc_session_carry(s, "next", "state"), XTC_OK);
    }
    if (lead == 1 && axis == 1) /* in place but for the calls that outgrow the memory */
        ck_assert_msg(same >= CALLS - 12, "the output stayed in place %d times of %d", same, CALLS);
    else /* written apart: a spare and the input's memory take turns */
        ck_assert_msg(same == 0, "the output stayed in place %d times", same);
    xtc_session_free(s);
    xtc_module_free(m);
    ir_graph_free(g);
}

START_TEST(test_carry_append)
{
    carry_append(1, 1);
    carry_append(2, 1);
    carry_append(1, 2);
}
END_TEST

START_TEST(test_kernel_dedup)
{
    IrGraph *g = new_graph("layers", build_layers);
    CgStats stats;
    XtcModule *m = compile_load(g, "layers", &stats);
    ck_assert_int_eq(stats.nsteps, 36);
    ck_assert_int_eq(stats.nkernels, 3); /* matmul, gelu, add: once each */
    ck_assert_int_gt(stats.module_bytes, 0);
    int64_t syms[2] = {2, 9};
    check_against_interp(g, m, syms, "layers");
    /* profiling: totals per kernel */
    XtcSession *ps;
    ck_assert_int_eq(xtc_session_new(m, NULL, &ps), 0);
    Binding bd;
    bind_random(&bd, g, syms, NULL);
    bind_session(ps, &bd, NULL);
    ck_assert_int_eq(xtc_session_set_profiling(ps, 1), 0);
    ck_assert_int_eq(xtc_session_run(ps), 0);
    ck_assert_int_eq(xtc_session_run(ps), 0);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    ck_assert_int_eq(xtc_session_print_profile(ps, mem), 0);
    fclose(mem);
    ck_assert_msg(strstr(text, "profile of 2 runs") && strstr(text, "matmul") && strstr(text, "gelu"), "%s", text);
    free(text);
    bind_free(&bd);
    xtc_session_free(ps);
    /* the arena reuses memory: far less than 36 separate activations */
    XtcSession *s;
    ck_assert_int_eq(xtc_session_new(m, &(XtcSessionOptions){.threads = 1, .max_batch = 2, .max_seq = 64}, &s), 0);
    int64_t one = 2 * 64 * 16 * 4;
    ck_assert_int_ge(xtc_session_peak_bytes(s), 2 * one);
    ck_assert_int_le(xtc_session_peak_bytes(s), 4 * one);
    xtc_session_free(s);
    xtc_module_free(m);
    ir_graph_free(g);
}
END_TEST

/* ---- the module cache (XTC_MODULE_CACHE, codegen/cg_cache.c) ---- */

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* compiles g into tmpdir/<name>.so for target (NULL: cpu) at opt_level; returns stats.cached */
static int cache_compile(const IrGraph *g, const char *name, const char *target, int opt_level)
{
    char path[512], err[1024];
    snprintf(path, sizeof path, "%s/%s.so", tmpdir, name);
    CgOptions opt = {.output = path, .target = target, .opt_level = opt_level, .source = "# test source\n",
                     .source_name = "test.xtf"};
    CgStats st;
    ck_assert_msg(harness_cg(g, &opt, &st, err, sizeof err) == 0, "compiling %s: %s", name, err);
    ck_assert_int_gt(st.module_bytes, 0);
    return st.cached;
}

/* A module comes from the cache only when everything it is made from is the same: the graph,
 * the target, the optimisation level. The copy is the module, byte for byte, and it runs. A
 * cache that cannot be written is no cache, not an error. */
START_TEST(test_module_cache)
{
    make_tmpdir();
    const char *was = getenv("XTC_MODULE_CACHE");
    char *saved = was ? strdup(was) : NULL, cache[600], blocker[600];
    snprintf(cache, sizeof cache, "%s/module-cache", tmpdir);
    setenv("XTC_MODULE_CACHE", cache, 1);
    unsetenv("XTC_EMU_OPT"); /* the emulated modules below start at the default level */
    IrGraph *g = new_graph("matmul", build_matmul), *h = new_graph("reduce", build_reduce);
    ck_assert_int_eq(cache_compile(g, "cache_a", NULL, 1), 0);
    ck_assert_int_eq(count_entries(cache), 1);
    ck_assert_int_eq(cache_compile(g, "cache_b", NULL, 1), 1);
    char path[1200];
    size_t na = 0, nb = 0;
    snprintf(path, sizeof path, "%s/cache_a.so", tmpdir);
    char *a = harness_read_file(path, &na);
    snprintf(path, sizeof path, "%s/cache_b.so", tmpdir);
    char *b = harness_read_file(path, &nb);
    ck_assert_msg(a && b && na == nb && memcmp(a, b, na) == 0, "the cached module differs from the one built");
    free(b);
    XtcModule *m = NULL;
    ck_assert_msg(xtc_module_load(path, &m) == XTC_OK, "%s", xtc_module_error(m));
    check_against_interp(g, m, SIZES[1], "matmul (from the cache)");
    xtc_module_free(m);
    /* a damaged entry (cut short, one byte flipped) is a miss: rebuilt, the entry replaced */
    char entry[1200] = "";
    DIR *d = opendir(cache);
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.')
            snprintf(entry, sizeof entry, "%s/%s", cache, e->d_name);
    if (d)
        closedir(d);
    struct stat sb;
    ck_assert_msg(entry[0] && stat(entry, &sb) == 0, "no cache entry");
    ck_assert_int_eq(truncate(entry, sb.st_size / 2), 0);
    ck_assert_int_eq(cache_compile(g, "cache_t", NULL, 1), 0);
    ck_assert_int_eq(cache_compile(g, "cache_t", NULL, 1), 1);
    FILE *fp = fopen(entry, "r+b");
    ck_assert_ptr_nonnull(fp);
    fseek(fp, sb.st_size / 3, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, sb.st_size / 3, SEEK_SET);
    fputc(c ^ 0x10, fp);
    fclose(fp);
    ck_assert_int_eq(cache_compile(g, "cache_t", NULL, 1), 0);
    snprintf(path, sizeof path, "%s/cache_t.so", tmpdir);
    char *t = harness_read_file(path, &nb);
    ck_assert_msg(t && na == nb && memcmp(t, a, na) == 0, "the rebuilt module differs from the one built");
    free(t);
    ck_assert_int_eq(cache_compile(g, "cache_t", NULL, 1), 1);
    ck_assert_int_eq(count_entries(cache), 1);
    free(a);
    /* another level, another graph, another target: built, then found */
    ck_assert_int_eq(cache_compile(g, "cache_c", NULL, 0), 0);
    ck_assert_int_eq(cache_compile(h, "cache_d", NULL, 1), 0);
    ck_assert_int_eq(cache_compile(g, "cache_e", "cuda-emu", 1), 0);
    ck_assert_int_eq(cache_compile(g, "cache_f", "cuda-emu", 1), 1);
    ck_assert_int_eq(cache_compile(h, "cache_g", NULL, 1), 1);
    ck_assert_int_eq(count_entries(cache), 4);
    /* the emulated module's cc level ($XTC_EMU_OPT) is part of the key: -O0 and -O1 never mix */
    setenv("XTC_EMU_OPT", "0", 1);
    ck_assert_int_eq(cache_compile(g, "cache_i", "cuda-emu", 1), 0);
    ck_assert_int_eq(cache_compile(g, "cache_j", "cuda-emu", 1), 1);
    ck_assert_int_eq(count_entries(cache), 5);
    setenv("XTC_EMU_OPT", "1", 1); /* the default, spelt out: the -O1 entry */
    ck_assert_int_eq(cache_compile(g, "cache_k", "cuda-emu", 1), 1);
    setenv("XTC_EMU_OPT", "fast", 1);
    {
        char err[1024];
        snprintf(path, sizeof path, "%s/cache_l.so", tmpdir);
        CgOptions bad = {.output = path, .target = "cuda-emu", .opt_level = 1, .source_name = "test.xtf"};
        ck_assert_int_ne(harness_cg(g, &bad, NULL, err, sizeof err), 0);
        ck_assert_msg(strstr(err, "XTC_EMU_OPT must be 0, 1, 2 or 3") && strstr(err, "'fast'"), "%s", err);
    }
    unsetenv("XTC_EMU_OPT");
    ck_assert_int_eq(count_entries(cache), 5);
    /* a directory that cannot be made: every compile builds */
    snprintf(blocker, sizeof blocker, "%s/cache_a.so/cache", tmpdir);
    setenv("XTC_MODULE_CACHE", blocker, 1);
    ck_assert_int_eq(cache_compile(g, "cache_h", NULL, 1), 0);
    ck_assert_int_eq(cache_compile(g, "cache_h", NULL, 1), 0);
    if (saved)
        setenv("XTC_MODULE_CACHE", saved, 1);
    else
        unsetenv("XTC_MODULE_CACHE");
    free(saved);
    harness_remove_dir(cache);
    ir_graph_free(g);
    ir_graph_free(h);
}
END_TEST

/* ---- the runtime's checks ---- */

static void build_embed(IrGraph *g, IrDim b, IrDim n)
{
    IrDim st[] = {ir_dim(11), ir_dim(8)}, si[] = {b, n};
    IrNode *tok = input(g, "tokens", IR_I64, 2, si);
    IrNode *table = ir_param(g, "token_emb.weight", 2, st);
    IrNode *e = ir_gather(g, table, tok);
    out(g, "emb", e);
    /* ids computed in the graph can only be checked while running */
    IrNode *shifted = ir_binary(g, IR_ADD, input(g, "offs", IR_I64, 2, si), ir_const(g, 5, IR_I64));
    out(g, "shifted", ir_gather(g, table, shifted));
    IrDim sb[] = {ir_dim(4)};
    out(g, "freq", ir_binary(g, IR_MUL, ir_buffer(g, "rotary.inv_freq", 1, sb), ir_const(g, 2, IR_F32)));
}

START_TEST(test_runtime_errors)
{
    IrGraph *g = new_graph("embed", build_embed);
    CgStats stats;
    XtcModule *m = compile_load(g, "embed", &stats);
    ck_assert_int_eq(xtc_module_count(m, XTC_INPUT), 2);
    ck_assert_int_eq(xtc_module_count(m, XTC_PARAM), 1);
    ck_assert_int_eq(xtc_module_count(m, XTC_STATE), 1);
    ck_assert_int_eq(xtc_module_count(m, XTC_OUTPUT), 3);
    ck_assert_int_eq(xtc_module_param_count(m), 88);
    ck_assert_str_eq(xtc_module_source(m), "# test source\n");
    XtcTensorInfo info;
    ck_assert_int_eq(xtc_module_tensor(m, XTC_INPUT, xtc_module_find(m, XTC_INPUT, "tokens"), &info), 0);
    ck_assert_int_eq(info.rank, 2);
    ck_assert_int_eq(info.shape[0], -1);
    ck_assert_str_eq(info.dims[1], "n");

    XtcSession *s;
    ck_assert_int_eq(xtc_session_new(m, &(XtcSessionOptions){.threads = 2, .max_batch = 2}, &s), 0);
    int64_t shape[2] = {2, 3};
    int64_t tok[6] = {0, 1, 2, 3, 4, 10}, bad[6] = {0, 1, 2, 3, 4, 11}, offs[6] = {0, 1, 2, 3, 4, 5};
    /* run before anything is bound */
    ck_assert_int_eq(xtc_session_run(s), XTC_ERR_STATE);
    ck_assert_ptr_nonnull(strstr(xtc_session_error(s), "not set"));
    /* names, dtypes, shapes, ranges */
    ck_assert_int_eq(xtc_session_set_input(s, "tokenz", XTC_I64, 2, shape, tok), XTC_ERR_NAME);
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_F32, 2, shape, tok), XTC_ERR_SHAPE);
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 1, shape, tok), XTC_ERR_SHAPE);
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, bad), XTC_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(xtc_session_error(s), "tokens"));
    int64_t too_long[2] = {1, 65};
    int64_t *zeros = calloc(65, sizeof *zeros);
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, too_long, zeros), XTC_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(xtc_session_error(s), "max_seq_len"));
    int64_t too_wide[2] = {3, 2};
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, too_wide, zeros), XTC_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(xtc_session_error(s), "max_batch"));
    free(zeros);
    /* i32 accepted for an i64 input */
    int32_t tok32[6] = {0, 1, 2, 3, 4, 10};
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I32, 2, shape, tok32), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "offs", XTC_I64, 2, shape, offs), XTC_OK);
    ck_assert_int_eq(xtc_session_run(s), XTC_ERR_STATE); /* weights not loaded */
    ck_assert_ptr_nonnull(strstr(xtc_session_error(s), "token_emb.weight"));
    float w[88], f4[4] = {1, 2, 3, 4};
    for (int i = 0; i < 88; i++)
        w[i] = (float)i;
    int64_t wshape[2] = {11, 8}, wbad[2] = {8, 11}, fshape[1] = {4};
    ck_assert_int_eq(xtc_session_set_weight(s, "token_emb.weight", 2, wbad, w), XTC_ERR_SHAPE);
    ck_assert_int_eq(xtc_session_set_weight(s, "token_emb.weight", 2, wshape, w), XTC_OK);
    ck_assert_int_eq(xtc_session_set_weight(s, "rotary.inv_freq", 1, fshape, f4), XTC_OK);
    /* offs + 5 reaches 10 < 11: fine */
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    XtcTensor t;
    ck_assert_int_eq(xtc_session_get_output(s, "emb", &t), XTC_OK);
    ck_assert_int_eq(t.rank, 3);
    ck_assert_int_eq(t.shape[2], 8);
    ck_assert(((const float *)t.data)[5 * 8 + 3] == 83.0f);
    ck_assert_int_eq(xtc_session_get_output(s, "nope", &t), XTC_ERR_NAME);
    /* an id computed in the graph goes out of range: the run fails, naming the gather */
    offs[4] = 6;
    ck_assert_int_eq(xtc_session_set_input(s, "offs", XTC_I64, 2, shape, offs), XTC_OK);
    ck_assert_int_eq(xtc_session_run(s), XTC_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(xtc_session_error(s), "gather"));
    ck_assert_int_eq(xtc_session_get_output(s, "emb", &t), XTC_ERR_STATE);
    /* inputs whose shapes disagree on a symbol */
    int64_t other[2] = {2, 2};
    ck_assert_int_eq(xtc_session_set_input(s, "offs", XTC_I64, 2, other, offs), XTC_OK);
    ck_assert_int_eq(xtc_session_run(s), XTC_ERR_SHAPE);
    xtc_session_free(s);
    xtc_module_free(m);
    ir_graph_free(g);

    /* not a module */
    char path[512];
    snprintf(path, sizeof path, "%s/none.so", tmpdir);
    ck_assert_int_eq(xtc_module_load(path, &m), XTC_ERR_IO);
    ck_assert_ptr_nonnull(strstr(xtc_module_error(m), "none.so"));
    xtc_module_free(m);
}
END_TEST

/* ---- weights and inputs from safetensors files ---- */

static void write_st(const char *path, const char **names, const int64_t (*shapes)[2], const int *ranks, int n)
{
    RtStWriter *w = rt_st_writer_new();
    float data[256];
    for (int i = 0; i < 256; i++)
        data[i] = (float)i * 0.5f;
    for (int i = 0; i < n; i++)
        rt_st_writer_add(w, names[i], RT_F32, ranks[i], shapes[i], data);
    char err[256];
    ck_assert_msg(rt_st_writer_save(w, path, err, sizeof err) == 0, "%s", err);
    rt_st_writer_free(w);
}

START_TEST(test_weights_and_files)
{
    IrGraph *g = new_graph("embed2", build_embed);
    CgStats stats;
    XtcModule *m = compile_load(g, "embed2", &stats);
    char wpath[512], ipath[512], opath[512], mpath[512], err[1024];
    snprintf(wpath, sizeof wpath, "%s/w.safetensors", tmpdir);
    snprintf(ipath, sizeof ipath, "%s/in.safetensors", tmpdir);
    snprintf(opath, sizeof opath, "%s/out.safetensors", tmpdir);
    snprintf(mpath, sizeof mpath, "%s/embed2.so", tmpdir);
    XtcSession *s;
    ck_assert_int_eq(xtc_session_new(m, NULL, &s), 0);

    /* missing, extra and mis-shaped tensors, all named */
    const char *names1[] = {"token_emb.weight", "extra.bias"};
    const int64_t shapes1[][2] = {{8, 11}, {3, 0}};
    const int ranks1[] = {2, 1};
    write_st(wpath, names1, shapes1, ranks1, 2);
    ck_assert_int_eq(xtc_session_load_weights(s, wpath), XTC_ERR_NAME);
    const char *e = xtc_session_error(s);
    ck_assert_msg(strstr(e, "rotary.inv_freq") && strstr(e, "extra.bias") && strstr(e, "token_emb.weight"), "%s", e);

    const char *names2[] = {"token_emb.weight", "rotary.inv_freq"};
    const int64_t shapes2[][2] = {{11, 8}, {4, 0}};
    const int ranks2[] = {2, 1};
    write_st(wpath, names2, shapes2, ranks2, 2);
    ck_assert_msg(xtc_session_load_weights(s, wpath) == XTC_OK, "%s", xtc_session_error(s));
    xtc_session_free(s);

    /* xtc_run_files: inputs from a file, outputs to a file */
    RtStWriter *w = rt_st_writer_new();
    int32_t tok[4] = {1, 2, 3, 10};
    int64_t offs[4] = {0, 1, 2, 3}, shape[2] = {2, 2};
    rt_st_writer_add(w, "tokens", RT_I32, 2, shape, tok);
    rt_st_writer_add(w, "offs", RT_I64, 2, shape, offs);
    ck_assert_int_eq(rt_st_writer_save(w, ipath, err, sizeof err), 0);
    rt_st_writer_free(w);
    XtcRunOptions ro = {.threads = 2};
    ck_assert_msg(xtc_run_files(mpath, wpath, ipath, opath, &ro, err, sizeof err) == XTC_OK, "%s", err);
    RtStFile *f;
    ck_assert_int_eq(rt_st_open(opath, &f, err, sizeof err), 0);
    const RtStTensor *t = rt_st_find(f, "emb");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->rank, 3);
    float v;
    memcpy(&v, (const char *)t->data + (3 * 8 + 1) * 4, 4);
    ck_assert(v == (10 * 8 + 1) * 0.5f);
    ck_assert_ptr_nonnull(rt_st_find(f, "freq"));
    rt_st_close(f);
    /* an input file that lacks an input */
    w = rt_st_writer_new();
    rt_st_writer_add(w, "tokens", RT_I32, 2, shape, tok);
    rt_st_writer_save(w, ipath, err, sizeof err);
    rt_st_writer_free(w);
    ck_assert_int_eq(xtc_run_files(mpath, wpath, ipath, opath, &ro, err, sizeof err), XTC_ERR_NAME);
    ck_assert_ptr_nonnull(strstr(err, "offs"));
    xtc_module_free(m);
    ir_graph_free(g);
}
END_TEST

/* ---- x-transformers parity cases through compiled modules (tests/parity_run.h) ---- */

START_TEST(test_parity_compiled) { parity_run_all(&PARITY_F32, "parity through compiled modules"); }
END_TEST

/* ---- the thread pool: every index exactly once, job after job, oversubscribed ---- */

typedef struct {
    atomic_int hits[128];
    int64_t job;
} PoolJob;

static void count_range(void *ctx, int64_t lo, int64_t hi)
{
    PoolJob *j = ctx;
    for (int64_t i = lo; i < hi; i++)
        atomic_fetch_add(&j->hits[i], 1);
}

START_TEST(test_pool_stress)
{
    for (int threads = 2; threads <= 5; threads += 3) {
        RtPool *pool = rt_pool_new(threads);
        ck_assert_ptr_nonnull(pool);
        PoolJob job;
        for (int rep = 0; rep < 20000; rep++) {
            int64_t n = 1 + rep % 128;
            for (int i = 0; i < 128; i++)
                atomic_init(&job.hits[i], 0);
            rt_pool_parallel_for(pool, count_range, &job, n);
            for (int64_t i = 0; i < 128; i++)
                ck_assert_msg(atomic_load(&job.hits[i]) == (i < n), "job %d: index %lld ran %d times", rep,
                              (long long)i, atomic_load(&job.hits[i]));
        }
        rt_pool_free(pool);
    }
}
END_TEST

/* ---- two modules, two sessions, two threads ---- */

typedef struct {
    const IrGraph *g;
    XtcModule *m;
    int64_t syms[2];
    int failures;
    char msg[512];
} ThreadJob;

static void *thread_main(void *arg)
{
    ThreadJob *j = arg;
    for (int rep = 0; rep < 5; rep++) {
        Binding bd;
        bind_random(&bd, j->g, j->syms, NULL);
        IrHostTensor ref[32];
        char err[512];
        if (ir_interp(j->g, bind_cb, &bd, ref, err, sizeof err) != 0) {
            j->failures++;
            snprintf(j->msg, sizeof j->msg, "interp: %.400s", err);
            bind_free(&bd);
            continue;
        }
        XtcSession *s;
        xtc_session_new(j->m, &(XtcSessionOptions){.threads = 2}, &s);
        for (int i = 0; i < bd.n; i++) /* no assertion off the main thread: a failure shows in the run */
            bind_leaf(s, &bd, i);
        if (xtc_session_run(s) != XTC_OK) {
            j->failures++;
            snprintf(j->msg, sizeof j->msg, "run: %s", xtc_session_error(s));
        } else {
            for (int o = 0; o < j->g->noutputs; o++) {
                XtcTensor t;
                xtc_session_get_output(s, j->g->outputs[o].name, &t);
                int64_t numel = ir_host_numel(&ref[o]);
                for (int64_t i = 0; i < numel; i++) {
                    double e = value_at(ref[o].data, t.dtype, i), a = value_at(t.data, t.dtype, i);
                    if (fabs(a - e) > 1e-3 * (1 + fabs(e))) {
                        j->failures++;
                        snprintf(j->msg, sizeof j->msg, "output %s[%lld]: %g vs %g", j->g->outputs[o].name,
                                 (long long)i, a, e);
                        break;
                    }
                }
            }
        }
        xtc_session_free(s);
        for (int o = 0; o < j->g->noutputs; o++)
            ir_host_free(&ref[o]);
        bind_free(&bd);
    }
    return NULL;
}

START_TEST(test_two_modules_two_threads)
{
    IrGraph *g1 = new_graph("mt_matmul", build_matmul), *g2 = new_graph("mt_reduce", build_reduce);
    CgStats stats;
    XtcModule *m1 = compile_load(g1, "mt_matmul", &stats), *m2 = compile_load(g2, "mt_reduce", &stats);
    ThreadJob jobs[2] = {{.g = g1, .m = m1, .syms = {2, 13}}, {.g = g2, .m = m2, .syms = {3, 9}}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, thread_main, &jobs[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(jobs[i].failures == 0, "thread %d: %s", i, jobs[i].msg);
    xtc_module_free(m1);
    xtc_module_free(m2);
    ir_graph_free(g1);
    ir_graph_free(g2);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("codegen");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_every_op_has_a_case);
    tcase_add_test(tc, test_an_op_without_a_case_fails);
    tcase_add_test(tc, test_every_op_has_a_lowering);
    tcase_add_loop_test(tc, test_case, 0, op_case_count(OC_CPU));
    tcase_add_test(tc, test_ir_files);
    tcase_add_test(tc, test_levels_and_cpus);
    tcase_add_test(tc, test_bad_cpu_refused);
    tcase_add_test(tc, test_matmul_many_threads);
    tcase_add_test(tc, test_epilogue_vectorized);
    tcase_add_test(tc, test_no_kernels);
    tcase_add_test(tc, test_kernel_dedup);
    tcase_add_test(tc, test_module_cache);
    tcase_add_test(tc, test_derived_symbols);
    tcase_add_test(tc, test_carry);
    tcase_add_test(tc, test_carry_append);
    tcase_add_test(tc, test_runtime_errors);
    tcase_add_test(tc, test_weights_and_files);
    tcase_add_test(tc, test_pool_stress);
    tcase_add_test(tc, test_two_modules_two_threads);
    tcase_add_test(tc, test_parity_compiled);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return harness_run(suite(), "codegen");
}
