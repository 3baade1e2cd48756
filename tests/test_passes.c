/* test_passes.c: the pass pipeline (passes/), IR text in, IR text out.
 *
 *   - golden files: tests/passes/<PASS>/<case>.ir runs through the passes its "# passes: a b"
 *     comment names (default: the directory's pass) and must print as <case>.expected; every
 *     case is also run by the interpreter before and after, on random inputs, with equal
 *     outputs (pass_equiv.h). XTC_UPDATE_GOLDEN=1 rewrites the .expected files (review the
 *     diff!).
 *   - the options: --disable-pass, --no-fuse, a backend's capabilities, stop_after (xtc ir
 *     --after), dumps, the verifier between passes, unknown names.
 *   - the attention recognizer (match.h) on hand-written subgraphs, matching and not.
 *
 * Whole models are in test_pass_models.c. */
#include "match.h"
#include "passes.h"
#include "rewrite.h"

#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "pass_equiv.h"

/* ---- golden files ---- */

/* "# passes: fold simplify dce" anywhere in the text, else the default */
static int passes_of(const char *src, const char *dflt, char names[][32], int max)
{
    const char *p = strstr(src, "# passes:");
    int k = 0;
    if (!p) {
        snprintf(names[k++], 32, "%s", dflt);
        return k;
    }
    p += strlen("# passes:");
    while (*p && *p != '\n' && k < max) {
        while (*p == ' ' || *p == ',')
            p++;
        int len = 0;
        while (p[len] && p[len] != ' ' && p[len] != ',' && p[len] != '\n')
            len++;
        if (len)
            snprintf(names[k++], 32, "%.*s", len, p);
        p += len;
    }
    return k;
}

static int golden_dir(const char *pass_dir, Compared *c)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/passes/%s", XTC_SOURCE_DIR, pass_dir);
    DIR *dp = opendir(dir);
    ck_assert_msg(dp != NULL, "cannot open %s", dir);
    int count = 0, update = getenv("XTC_UPDATE_GOLDEN") != NULL;
    struct dirent *de;
    while ((de = readdir(dp))) {
        size_t len = strlen(de->d_name);
        if (len < 4 || strcmp(de->d_name + len - 3, ".ir") != 0)
            continue;
        char in[1100], exp[1100], act[1100], err[1024], names[8][32];
        snprintf(in, sizeof in, "%s/%s", dir, de->d_name);
        snprintf(exp, sizeof exp, "%s/%.*s.expected", dir, (int)(len - 3), de->d_name);
        snprintf(act, sizeof act, "%s/%s.%.*s.actual", XTC_BINARY_DIR, pass_dir, (int)(len - 3),
                 de->d_name);
        char *src = harness_read_file(in, NULL);
        ck_assert_msg(src != NULL, "cannot read %s", in);
        IrGraph *g = ir_parse(src, in, err, sizeof err);
        ck_assert_msg(g != NULL, "%s", err);
        int np = passes_of(src, pass_dir, names, 8);
        IrGraph *cur = g;
        for (int i = 0; i < np; i++) {
            IrGraph *next;
            if (strcmp(names[i], "pipeline") == 0) { /* the whole pipeline */
                PassOptions o = {.verify_each = 1};
                next = pass_run_pipeline(cur, &o, err, sizeof err);
            } else {
                const Pass *p = pass_find(names[i]);
                ck_assert_msg(p != NULL, "%s: no pass '%s'", in, names[i]);
                next = p->run(cur, NULL, err, sizeof err);
            }
            ck_assert_msg(next != NULL, "%s: %s: %s", in, names[i], err);
            ck_assert_msg(ir_verify(next, err, sizeof err) == 0, "%s: after %s: %s", in, names[i], err);
            if (cur != g)
                ir_graph_free(cur);
            cur = next;
        }
        char *got = ir_print_str(cur);
        if (update)
            write_file(exp, got);
        char *want = harness_read_file(exp, NULL);
        ck_assert_msg(want != NULL, "%s is missing (XTC_UPDATE_GOLDEN=1 writes it)", exp);
        if (strcmp(got, want) != 0)
            write_file(act, got);
        ck_assert_msg(strcmp(got, want) == 0, "%s does not give %s; the text it gives is in %s", in,
                      exp, act);
        IrGraph *again = ir_parse(want, exp, err, sizeof err); /* the expected text reads back */
        ck_assert_msg(again != NULL, "%s", err);
        ir_graph_free(again);

        Env e;
        env_init(&e, g);
        same_outputs(in, g, cur, &e, c);
        env_free(&e);
        free(got);
        free(want);
        free(src);
        ir_graph_free(cur);
        ir_graph_free(g);
        count++;
    }
    closedir(dp);
    return count;
}

static void golden(const char *pass, int min_cases)
{
    Compared c = {0};
    int k = golden_dir(pass, &c);
    ck_assert_msg(k >= min_cases, "only %d golden cases for %s", k, pass);
    printf("passes: %-9s %d golden cases, %lld output elements compared\n", pass, k, (long long)c.elems);
}

START_TEST(test_golden_fold) { golden("fold", 4); }
END_TEST
START_TEST(test_golden_simplify) { golden("simplify", 6); }
END_TEST
START_TEST(test_golden_cse) { golden("cse", 3); }
END_TEST
START_TEST(test_golden_dce) { golden("dce", 3); }
END_TEST
START_TEST(test_golden_pipeline) { golden("pipeline", 1); }
END_TEST
START_TEST(test_golden_attention) { golden("attention", 13); } /* passes/fuse_attention.c */
END_TEST
START_TEST(test_golden_elementwise) { golden("elementwise", 5); } /* passes/fuse_elementwise.c */
END_TEST

/* ---- the options ---- */

static const char *small_src =
    "graph t(b, n <= 16) {\n"
    "  %x = input \"x\" : f32[b, n]\n"
    "  %w = param \"w\" : f32[n]\n"
    "  %unused = param \"unused\" : f32[4]\n"
    "  %two = const 2 : f32[]\n"
    "  %one = const 1 : f32[]\n"
    "  %k = sub %two, %one : f32[]\n"
    "  %y = mul %x, %k : f32[b, n]\n"
    "  %z = add %y, %w : f32[b, n]\n"
    "  %z2 = add %w, %y : f32[b, n]\n"
    "  %s = mul %z, %z2 : f32[b, n]\n"
    "  %dead = exp %s : f32[b, n]\n"
    "  output s = %s\n"
    "}\n";

static IrGraph *small_graph(void)
{
    char err[512];
    IrGraph *g = ir_parse(small_src, "small.ir", err, sizeof err);
    ck_assert_msg(g != NULL, "%s", err);
    return g;
}

static char *run_to_text(IrGraph *g, const PassOptions *o)
{
    char err[512];
    IrGraph *h = pass_run_pipeline(g, o, err, sizeof err);
    ck_assert_msg(h != NULL, "%s", err);
    char *s = ir_print_str(h);
    ir_graph_free(h);
    return s;
}

START_TEST(test_table)
{
    ck_assert_int_ge(pass_count(), 4);
    for (int i = 0; i < pass_count(); i++) {
        const Pass *p = &pass_pipeline[i];
        ck_assert_ptr_nonnull(p->summary);
        ck_assert_ptr_nonnull(p->run);
        ck_assert_ptr_eq(pass_find(p->name), p);
        for (int j = 0; j < i; j++)
            ck_assert_str_ne(pass_pipeline[j].name, p->name);
    }
    ck_assert_str_eq(pass_pipeline[pass_count() - 1].name, "dce"); /* sweeps last */
    ck_assert_ptr_null(pass_find("nope"));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    pass_list(f);
    fclose(f);
    for (int i = 0; i < pass_count(); i++)
        ck_assert_msg(strstr(buf, pass_pipeline[i].name), "pass_list misses %s", pass_pipeline[i].name);
    free(buf);
}
END_TEST

START_TEST(test_full_pipeline)
{
    IrGraph *g = small_graph();
    char *before = ir_print_str(g);
    PassOptions o = {.verify_each = 1};
    char *s = run_to_text(g, &o);
    /* k folds to 1, x * 1 goes, add(w, y) merges with add(y, x), exp is dead; params stay */
    ck_assert_msg(!strstr(s, "sub") && !strstr(s, "exp") && !strstr(s, "const"), "%s", s);
    ck_assert_msg(strstr(s, "\"unused\""), "%s", s);
    char *after = ir_print_str(g);
    ck_assert_str_eq(before, after); /* the input graph is untouched */
    free(before);
    free(after);
    free(s);
    ir_graph_free(g);
}
END_TEST

START_TEST(test_disable_and_no_fuse)
{
    IrGraph *g = small_graph();
    const char *no_fold[] = {"fold"};
    /* (fusions off: they would take the sub and the adds into a fused program) */
    PassOptions o = {.disable = no_fold, .ndisable = 1, .verify_each = 1, .no_fuse = 1};
    char *s = run_to_text(g, &o);
    ck_assert_msg(strstr(s, "sub %two, %one"), "with fold disabled the sub stays:\n%s", s);
    free(s);
    const char *no_dce[] = {"dce", "cse"};
    o = (PassOptions){.disable = no_dce, .ndisable = 2, .verify_each = 1, .no_fuse = 1};
    s = run_to_text(g, &o);
    ck_assert_msg(strstr(s, "exp") && strstr(s, "%z2 = add %w, %x"), "without dce and cse:\n%s", s);
    free(s);

    /* --no-fuse is the same as disabling every fusion by name */
    const char *fusions[64];
    int nf = 0;
    for (int i = 0; i < pass_count(); i++)
        if (pass_pipeline[i].is_fusion)
            fusions[nf++] = pass_pipeline[i].name;
    o = (PassOptions){.no_fuse = 1, .verify_each = 1};
    char *a = run_to_text(g, &o);
    o = (PassOptions){.disable = fusions, .ndisable = nf, .verify_each = 1};
    char *b = run_to_text(g, &o);
    ck_assert_str_eq(a, b);
    free(a);
    free(b);

    /* everything disabled: a copy */
    const char *all[64];
    for (int i = 0; i < pass_count(); i++)
        all[i] = pass_pipeline[i].name;
    o = (PassOptions){.disable = all, .ndisable = pass_count()};
    s = run_to_text(g, &o);
    char *orig = ir_print_str(g);
    ck_assert_str_eq(s, orig);
    free(orig);
    free(s);
    ir_graph_free(g);
}
END_TEST

START_TEST(test_stop_after)
{
    IrGraph *g = small_graph();
    char err[512];
    for (int i = 0; i < pass_count(); i++) {
        /* stopping after pass i = running passes 0..i by hand */
        IrGraph *cur = g;
        for (int j = 0; j <= i; j++) {
            IrGraph *next = pass_pipeline[j].run(cur, NULL, err, sizeof err);
            ck_assert_msg(next != NULL, "%s", err);
            if (cur != g)
                ir_graph_free(cur);
            cur = next;
        }
        char *want = ir_print_str(cur);
        ir_graph_free(cur);
        PassOptions o = {.stop_after = pass_pipeline[i].name, .verify_each = 1};
        char *got = run_to_text(g, &o);
        ck_assert_msg(strcmp(want, got) == 0, "stop_after=%s:\n%s\nwant:\n%s", pass_pipeline[i].name,
                      got, want);
        free(want);
        free(got);
    }
    /* stopping after a disabled pass stops at its place */
    const char *no_simplify[] = {"simplify"};
    PassOptions o = {.stop_after = "simplify", .disable = no_simplify, .ndisable = 1};
    char *got = run_to_text(g, &o);
    IrGraph *f1 = pass_fold(g, NULL, err, sizeof err);
    char *want = ir_print_str(f1);
    ck_assert_str_eq(got, want);
    free(got);
    free(want);
    ir_graph_free(f1);
    ir_graph_free(g);
}
END_TEST

START_TEST(test_unknown_names)
{
    IrGraph *g = small_graph();
    char err[512];
    const char *bad[] = {"fold", "fuse_everything"};
    PassOptions o = {.disable = bad, .ndisable = 2};
    ck_assert_ptr_null(pass_run_pipeline(g, &o, err, sizeof err));
    ck_assert_msg(strstr(err, "unknown pass 'fuse_everything'"), "%s", err);
    for (int i = 0; i < pass_count(); i++)
        ck_assert_msg(strstr(err, pass_pipeline[i].name), "the message lists the passes: %s", err);
    o = (PassOptions){.stop_after = "dec"};
    ck_assert_ptr_null(pass_run_pipeline(g, &o, err, sizeof err));
    ck_assert_msg(strstr(err, "unknown pass 'dec' (passes: "), "%s", err);
    o = (PassOptions){.dump = stderr, .dump_after = "fold,nope"};
    ck_assert_ptr_null(pass_run_pipeline(g, &o, err, sizeof err));
    ck_assert_msg(strstr(err, "unknown pass 'nope'"), "%s", err);
    ck_assert_int_eq(pass_check_name("cse", err, sizeof err), 0);
    ck_assert_int_eq(pass_check_name("", err, sizeof err), -1);
    ir_graph_free(g);
}
END_TEST

START_TEST(test_dump_and_log)
{
    IrGraph *g = small_graph();
    char *buf = NULL, *lbuf = NULL;
    size_t len = 0, llen = 0;
    FILE *f = open_memstream(&buf, &len), *l = open_memstream(&lbuf, &llen);
    const char *no_cse[] = {"cse"};
    PassOptions o = {.dump = f, .dump_after = "fold,dce", .log = l, .disable = no_cse, .ndisable = 1};
    char *s = run_to_text(g, &o);
    fclose(f);
    fclose(l);
    ck_assert_msg(strstr(buf, "# after fold\ngraph t(") && strstr(buf, "# after dce\ngraph t("), "%s", buf);
    ck_assert_msg(!strstr(buf, "# after simplify"), "%s", buf);
    ck_assert_msg(strstr(buf, s), "the dump after dce is the result"); /* dce is last */
    ck_assert_msg(strstr(lbuf, "pass fold") && strstr(lbuf, "pass cse          (skipped: disabled)"),
                  "%s", lbuf);
    free(buf);
    free(lbuf);
    free(s);
    f = open_memstream(&buf, &len);
    o = (PassOptions){.dump = f, .dump_after = "all"};
    s = run_to_text(g, &o);
    fclose(f);
    for (int i = 0; i < pass_count(); i++) {
        char want[64];
        snprintf(want, sizeof want, "# after %s\n", pass_pipeline[i].name);
        ck_assert_msg(strstr(buf, want), "%s", buf);
    }
    free(buf);
    free(s);
    ir_graph_free(g);
}
END_TEST

START_TEST(test_verify_each)
{
    IrGraph *g = small_graph();
    char err[512];
    /* break an invariant by hand: two nodes with one label */
    g->nodes[1]->label = g->nodes[0]->label;
    PassOptions o = {.verify_each = 1};
    ck_assert_ptr_null(pass_run_pipeline(g, &o, err, sizeof err));
    ck_assert_msg(strstr(err, "does not verify") && strstr(err, "label used twice"), "%s", err);
    ir_graph_free(g);
}
END_TEST

/* A fusion is skipped for a backend that cannot lower its op: a stand-in list whose "fusion"
 * is simplify, said to produce softmax. */
static int no_softmax(IrOp op) { return op != IR_SOFTMAX; }

START_TEST(test_backend_capability)
{
    static const Pass list[] = {
        {"fold", "", pass_fold, 0, IR_NUM_OPS, IR_NUM_OPS},
        {"fake_fusion", "", pass_simplify, 1, IR_SOFTMAX, IR_NUM_OPS},
        {"dce", "", pass_dce, 0, IR_NUM_OPS, IR_NUM_OPS},
        {NULL, NULL, NULL, 0, IR_NUM_OPS, IR_NUM_OPS},
    };
    IrGraph *g = small_graph();
    char err[512], *lbuf = NULL;
    size_t llen = 0;
    PassOptions o = {.verify_each = 1};
    IrGraph *h = pass_run_list(list, g, &o, err, sizeof err);
    ck_assert_msg(h != NULL, "%s", err);
    char *fused = ir_print_str(h);
    ir_graph_free(h);
    ck_assert_msg(!strstr(fused, "mul %x"), "%s", fused); /* x * 1 went */

    FILE *l = open_memstream(&lbuf, &llen);
    o = (PassOptions){.verify_each = 1, .target = &(PassTarget){.supports = no_softmax}, .log = l};
    h = pass_run_list(list, g, &o, err, sizeof err);
    fclose(l);
    ck_assert_msg(h != NULL, "%s", err);
    char *unfused = ir_print_str(h);
    ir_graph_free(h);
    ck_assert_msg(strstr(unfused, "mul %x"), "%s", unfused);
    ck_assert_msg(strstr(lbuf, "fake_fusion  (skipped: the backend cannot lower its op)"), "%s", lbuf);

    o = (PassOptions){.no_fuse = 1};
    h = pass_run_list(list, g, &o, err, sizeof err);
    char *nofuse = ir_print_str(h);
    ck_assert_str_eq(nofuse, unfused);
    ir_graph_free(h);
    o = (PassOptions){.stop_after = "simplify"}; /* names come from the list run */
    ck_assert_ptr_null(pass_run_list(list, g, &o, err, sizeof err));
    ck_assert_msg(strstr(err, "(passes: fold, fake_fusion, dce)"), "%s", err);
    free(fused);
    free(unfused);
    free(nofuse);
    free(lbuf);
    ir_graph_free(g);
}
END_TEST

/* ---- the attention recognizer on hand-written subgraphs ---- */

/* q, k, v with memories (J = n + p, so the causal offset J - I is p), a mask, a bias */
#define ATT_HEAD                                                                                   \
    "graph att(b, n <= 16, p <= 8) {\n"                                                            \
    "  %q = input \"q\" : f32[b, 2, n, 4]\n"                                                       \
    "  %k = input \"k\" : f32[b, 2, n+p, 4]\n"                                                     \
    "  %v = input \"v\" : f32[b, 2, n+p, 3]\n"                                                     \
    "  %mask = input \"mask\" : bool[b, 1, n, n+p]\n"                                              \
    "  %bias = input \"bias\" : f32[2, n, n+p]\n"                                                  \
    "  %qk = matmul %q, %k [transpose_b=1] : f32[b, 2, n, n+p]\n"                                  \
    "  %scale = const 0.5 : f32[]\n"                                                               \
    "  %fill = const -3.4028234663852886e+38 : f32[]\n"                                            \
    "  %qi = arange [start=p] : i64[n]\n"                                                          \
    "  %qc = reshape %qi : i64[n, 1]\n"                                                            \
    "  %kj = arange [start=0] : i64[n+p]\n"                                                        \
    "  %kr = reshape %kj : i64[1, n+p]\n"                                                          \
    "  %after = lt %qc, %kr : bool[n, n+p]\n"
#define ATT_TAIL                                                                                   \
    "  %w = softmax %x : f32[b, 2, n, n+p]\n"                                                      \
    "  %out = matmul %w, %v [transpose_b=0] : f32[b, 2, n, 3]\n"                                   \
    "  output out = %out\n"                                                                        \
    "}\n"

typedef struct {
    const char *body;
    int match, causal, mask, bias, scale_const;
} AttCase;

START_TEST(test_attention_matcher)
{
    static const AttCase cases[] = {
        /* everything: scale, bias, mask, causal with the memory offset */
        {"  %s = mul %qk, %scale : f32[b, 2, n, n+p]\n"
         "  %a = add %bias, %s : f32[b, 2, n, n+p]\n"
         "  %m = where %mask, %a, %fill : f32[b, 2, n, n+p]\n"
         "  %x = where %after, %fill, %m : f32[b, 2, n, n+p]\n", 1, 1, 1, 1, 1},
        /* plain, the scale first */
        {"  %x = mul %scale, %qk : f32[b, 2, n, n+p]\n", 1, 0, 0, 0, 1},
        /* a tensor scale (cosine-similarity attention) */
        {"  %t = input \"t\" : f32[1, 2, 1, 1]\n"
         "  %x = mul %qk, %t : f32[b, 2, n, n+p]\n", 1, 0, 0, 0, 0},
        /* causal without the offset: j > i is not this attention's mask (J != I) */
        {"  %s = mul %qk, %scale : f32[b, 2, n, n+p]\n"
         "  %q0 = arange [start=0] : i64[n]\n"
         "  %q0r = reshape %q0 : i64[n, 1]\n"
         "  %bad = lt %q0r, %kr : bool[n, n+p]\n"
         "  %x = where %bad, %fill, %s : f32[b, 2, n, n+p]\n", 0, 0, 0, 0, 0},
        /* filled with -inf, not -FLT_MAX: other semantics for fully masked rows */
        {"  %s = mul %qk, %scale : f32[b, 2, n, n+p]\n"
         "  %inf = const -inf : f32[]\n"
         "  %x = where %mask, %s, %inf : f32[b, 2, n, n+p]\n", 0, 0, 0, 0, 0},
        /* the mask's branches swapped (true = drop) */
        {"  %s = mul %qk, %scale : f32[b, 2, n, n+p]\n"
         "  %x = where %mask, %fill, %s : f32[b, 2, n, n+p]\n", 0, 0, 0, 0, 0},
        /* no scale */
        {"  %x = add %qk, %bias : f32[b, 2, n, n+p]\n", 0, 0, 0, 0, 0},
        /* k not transposed: q kᵀ is not what is computed */
        {"  %kt = permute %k [perm=(0, 1, 3, 2)] : f32[b, 2, 4, n+p]\n"
         "  %qk2 = matmul %q, %kt [transpose_b=0] : f32[b, 2, n, n+p]\n"
         "  %x = mul %qk2, %scale : f32[b, 2, n, n+p]\n", 0, 0, 0, 0, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char text[4096], err[512];
        snprintf(text, sizeof text, "%s%s%s", ATT_HEAD, cases[c].body, ATT_TAIL);
        IrGraph *g = ir_parse(text, "att.ir", err, sizeof err);
        ck_assert_msg(g != NULL, "case %zu: %s", c, err);
        const IrNode *out = g->outputs[0].node;
        PassAttention m;
        int ok = pass_match_attention(out, &m);
        ck_assert_msg(ok == cases[c].match, "case %zu: match %d", c, ok);
        if (ok) {
            ck_assert_int_eq(m.causal != NULL, cases[c].causal);
            ck_assert_int_eq(m.mask != NULL, cases[c].mask);
            ck_assert_int_eq(m.bias != NULL, cases[c].bias);
            ck_assert_int_eq(m.scale_is_const, cases[c].scale_const);
            ck_assert_str_eq(m.q->s, "q");
            ck_assert_str_eq(m.k->s, "k");
            ck_assert_str_eq(m.v->s, "v");
            if (m.bias)
                ck_assert_str_eq(m.bias->s, "bias");
            if (m.scale_is_const)
                ck_assert(m.scale_value == 0.5);
            int *uses = calloc((size_t)g->nnodes, sizeof *uses);
            free(pass_liveness(g, uses));
            ck_assert(pass_attention_private(&m, uses));
            free(uses);
        }
        ir_graph_free(g);
    }
}
END_TEST

static Suite *passes_suite(void)
{
    Suite *s = suite_create("passes");
    TCase *t = tcase_create("pipeline");
    tcase_add_test(t, test_table);
    tcase_add_test(t, test_full_pipeline);
    tcase_add_test(t, test_disable_and_no_fuse);
    tcase_add_test(t, test_stop_after);
    tcase_add_test(t, test_unknown_names);
    tcase_add_test(t, test_dump_and_log);
    tcase_add_test(t, test_verify_each);
    tcase_add_test(t, test_backend_capability);
    suite_add_tcase(s, t);

    TCase *gd = tcase_create("golden");
    tcase_add_test(gd, test_golden_fold);
    tcase_add_test(gd, test_golden_simplify);
    tcase_add_test(gd, test_golden_cse);
    tcase_add_test(gd, test_golden_dce);
    tcase_add_test(gd, test_golden_pipeline);
    tcase_add_test(gd, test_golden_attention);
    tcase_add_test(gd, test_golden_elementwise);
    tcase_add_test(gd, test_attention_matcher);
    suite_add_tcase(s, gd);
    return s;
}

int main(void)
{
    return harness_run(passes_suite(), NULL);
}
