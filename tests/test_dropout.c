/* test_dropout.c: dropout in training mode (XtLowerOpts.dropout) and the op behind it, rand_like.
 *
 *  - rand_like: uniform on its 2^-24 grid (mean, quartiles), different streams and seeds give
 *    different numbers, the same ones the same; the compiled module draws exactly the
 *    interpreter's numbers.
 *  - Lowering: evaluation never drops (the graph of a model with dropout rates is the graph of
 *    the same model without them); training adds the dropout_seed input and one mask per site:
 *    emb_dropout once, attn_dropout and ff_dropout once per layer.
 *  - Semantics: with ff_dropout = 0.5 the hidden units of the feed-forward are zero for about
 *    half of them and doubled otherwise (nn.Dropout); a seed gives one mask, another seed
 *    another; rates of 0 with dropout on compute exactly what evaluation computes.
 *  - Training: the gradients of a dropout model through a compiled training module (after the
 *    pass pipeline, fusions included) equal the interpreter's for the same seed. */
#include "codegen.h"
#include "harness.h"
#include "harness_drive.h"
#include "init.h"
#include "ir.h"
#include "passes.h"
#include "xtc.h"
#include "xtf.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static IrGraph *lower(const char *src, int train, int dropout)
{
    XtfDiag d;
    xtf_diag_init(&d);
    XtfFile *f = xtf_parse("t.xtf", src, strlen(src), &d);
    ck_assert_ptr_nonnull(f);
    xtf_check(f, &d);
    XtLowerOpts o = {.train = train, .dropout = dropout};
    char err[512];
    IrGraph *g = d.nerrors ? NULL : harness_build(f, NULL, &o, 0, harness_target("cpu"), NULL, &d, err, sizeof err);
    if (!g)
        ck_abort_msg("%s", d.text ? d.text : err);
    xtf_diag_free(&d);
    xtf_free(f);
    return g;
}

static int count_op(const IrGraph *g, IrOp op)
{
    int n = 0;
    for (int i = 0; i < g->nnodes; i++)
        n += g->nodes[i]->op == op;
    return n;
}

/* ---- binding: seeded weights for every parameter, tokens, targets, the seed ---- */

#define B 2
#define N 9

typedef struct {
    const IrGraph *g;
    float *w[256];
    const char *names[256];
    int nw;
    int64_t tokens[B * N], targets[B * N], seed;
} Bind;

static void bind_init(Bind *b, const IrGraph *g, int64_t seed)
{
    memset(b, 0, sizeof *b);
    b->g = g;
    b->seed = seed;
    RtRng r;
    rt_rng_seed(&r, 3);
    for (int i = 0; i < g->nnodes; i++) {
        const IrNode *n = g->nodes[i];
        if (n->op != IR_PARAM && n->op != IR_BUFFER)
            continue;
        int64_t shape[IR_MAXRANK], numel = 1;
        for (int d = 0; d < n->rank; d++)
            numel *= shape[d] = n->shape[d].c;
        ck_assert_int_lt(b->nw, 256);
        b->names[b->nw] = n->s;
        b->w[b->nw] = malloc((size_t)numel * sizeof(float));
        const IrInit *rule = ir_find_init(g, n);
        ck_assert_msg(rule, "%s has no init rule", n->s);
        rt_init_by_name(ir_init_name(rule->kind), rule->value, n->rank, shape, b->w[b->nw], &r);
        for (int64_t k = 0; k < numel; k++) /* away from special values */
            b->w[b->nw][k] += (float)(0.05 * rt_rng_normal(&r));
        b->nw++;
    }
    for (int i = 0; i < B * N; i++) {
        b->tokens[i] = (int64_t)(rt_rng_next(&r) % 64);
        b->targets[i] = (int64_t)(rt_rng_next(&r) % 64);
    }
}

static void bind_free(Bind *b)
{
    for (int i = 0; i < b->nw; i++)
        free(b->w[i]);
}

static int bind_cb(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    Bind *b = ctx;
    memset(out, 0, sizeof *out);
    if (leaf->op == IR_INPUT) {
        out->dtype = IR_I64;
        if (!strcmp(leaf->s, "dropout_seed")) {
            out->rank = 0;
            out->data = &b->seed;
            return 0;
        }
        out->rank = 2;
        out->shape[0] = B;
        out->shape[1] = N;
        out->data = !strcmp(leaf->s, "tokens") ? b->tokens : !strcmp(leaf->s, "targets") ? b->targets : NULL;
        return out->data ? 0 : -1;
    }
    for (int i = 0; i < b->nw; i++)
        if (!strcmp(b->names[i], leaf->s)) {
            out->dtype = IR_F32;
            out->rank = leaf->rank;
            for (int d = 0; d < leaf->rank; d++)
                out->shape[d] = leaf->shape[d].c;
            out->data = b->w[i];
            return 0;
        }
    return -1;
}

static const IrHostTensor *output(const IrGraph *g, IrHostTensor *outs, const char *name)
{
    for (int i = 0; i < g->noutputs; i++)
        if (!strcmp(g->outputs[i].name, name))
            return &outs[i];
    ck_abort_msg("no output %s", name);
    return NULL;
}

static void interp(const IrGraph *g, Bind *b, IrHostTensor *outs)
{
    char err[512];
    ck_assert_msg(ir_interp(g, bind_cb, b, outs, err, sizeof err) == 0, "%s", err);
}

static void free_outs(const IrGraph *g, IrHostTensor *outs)
{
    for (int i = 0; i < g->noutputs; i++)
        ir_host_free(&outs[i]);
}

/* ---- rand_like ---- */

static IrGraph *rand_graph(void)
{
    IrGraph *g = ir_graph_new("r");
    IrDim s[2] = {ir_dim(300), ir_dim(337)};
    IrNode *x = ir_input(g, "x", IR_F32, 2, s), *seed = ir_input(g, "seed", IR_I64, 0, NULL);
    ir_output(g, "a", ir_rand(g, seed, x, 0));
    ir_output(g, "b", ir_rand(g, seed, x, 1));
    ck_assert_ptr_null(ir_graph_error(g));
    return g;
}

typedef struct {
    int64_t seed;
    float *x;
} RandBind;

static int rand_cb(void *ctx, const IrNode *leaf, IrHostTensor *out)
{
    RandBind *r = ctx;
    memset(out, 0, sizeof *out);
    if (!strcmp(leaf->s, "seed")) {
        out->dtype = IR_I64;
        out->data = &r->seed;
        return 0;
    }
    out->dtype = IR_F32;
    out->rank = 2;
    out->shape[0] = 300;
    out->shape[1] = 337;
    out->data = r->x;
    return 0;
}

START_TEST(test_rand_like)
{
    IrGraph *g = rand_graph();
    static float x[300 * 337];
    RandBind rb = {.seed = 12345, .x = x};
    IrHostTensor o1[2], o2[2];
    char err[512];
    ck_assert_msg(ir_interp(g, rand_cb, &rb, o1, err, sizeof err) == 0, "%s", err);
    const float *a = o1[0].data, *b = o1[1].data;
    int64_t n = 300 * 337, below = 0, same = 0;
    double mean = 0;
    for (int64_t i = 0; i < n; i++) {
        expect(a[i] >= 0 && a[i] < 1);
        expect(a[i] * 16777216.0f == floorf(a[i] * 16777216.0f)); /* on the 2^-24 grid */
        mean += a[i];
        below += a[i] < 0.25f;
        same += a[i] == b[i];
    }
    mean /= (double)n;
    ck_assert_msg(fabs(mean - 0.5) < 0.005, "mean %g", mean);
    ck_assert_msg(fabs((double)below / (double)n - 0.25) < 0.005, "P(u < 0.25) = %g", (double)below / (double)n);
    ck_assert_int_lt(same, 10); /* the streams are independent */
    rb.seed = 12346;
    ck_assert(ir_interp(g, rand_cb, &rb, o2, err, sizeof err) == 0);
    same = 0;
    for (int64_t i = 0; i < n; i++)
        same += ((const float *)o2[0].data)[i] == a[i];
    ck_assert_int_lt(same, 10);
    ir_host_free(&o2[0]);
    ir_host_free(&o2[1]);

    /* the compiled module draws the same numbers */
    char dir[] = "/tmp/xtc-test-dropout-XXXXXX", path[300];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/r.so", dir);
    CgOptions co = {.output = path, .opt_level = 2};
    ck_assert_msg(harness_cg(g, &co, NULL, err, sizeof err) == 0, "%s", err);
    XtcModule *m;
    XtcSession *s;
    ck_assert_int_eq(xtc_module_load(path, &m), XTC_OK);
    XtcSessionOptions so = {.threads = 2};
    ck_assert_int_eq(xtc_session_new(m, &so, &s), XTC_OK);
    int64_t shape[2] = {300, 337}, seed = 12345;
    ck_assert_int_eq(xtc_session_set_input(s, "x", XTC_F32, 2, shape, x), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "seed", XTC_I64, 0, shape, &seed), XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    XtcTensor t;
    ck_assert_int_eq(xtc_session_get_output(s, "b", &t), XTC_OK);
    ck_assert(memcmp(t.data, b, (size_t)n * sizeof(float)) == 0);
    ck_assert_int_eq(xtc_session_get_output(s, "a", &t), XTC_OK);
    ck_assert(memcmp(t.data, a, (size_t)n * sizeof(float)) == 0);
    xtc_session_free(s);
    xtc_module_free(m);
    unlink(path);
    rmdir(dir);
    ir_host_free(&o1[0]);
    ir_host_free(&o1[1]);
    ir_graph_free(g);
}
END_TEST

/* ---- lowering ---- */

static const char *with_rates = "m = TransformerWrapper(num_tokens = 64, max_seq_len = 16, emb_dropout = 0.1,\n"
                                "  attn_layers = Decoder(dim = 16, depth = 2, heads = 2, attn_dropout = 0.2, ff_dropout = 0.3))\n";
static const char *without = "m = TransformerWrapper(num_tokens = 64, max_seq_len = 16,\n"
                             "  attn_layers = Decoder(dim = 16, depth = 2, heads = 2))\n";

START_TEST(test_lowering)
{
    IrGraph *eval = lower(with_rates, 1, 0), *plain = lower(without, 1, 0), *train = lower(with_rates, 1, 1);
    char *a = ir_print_str(eval), *b = ir_print_str(plain);
    ck_assert_str_eq(a, b); /* evaluation never drops */
    ck_assert_int_eq(count_op(eval, IR_RAND), 0);
    ck_assert_int_eq(count_op(train, IR_RAND), 1 + 2 + 2);
    ck_assert_ptr_nonnull(ir_find_leaf(train, IR_INPUT, "dropout_seed"));
    ck_assert_ptr_null(ir_find_leaf(eval, IR_INPUT, "dropout_seed"));
    char err[512];
    ck_assert_msg(ir_verify(train, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(harness_autodiff(train, "cpu", err, sizeof err) == 0, "%s", err);
    /* rates of 0 in training: nothing to drop, no seed */
    IrGraph *zero = lower(without, 1, 1);
    char *c = ir_print_str(zero);
    ck_assert_str_eq(c, b);
    free(a);
    free(b);
    free(c);
    ir_graph_free(eval);
    ir_graph_free(plain);
    ir_graph_free(train);
    ir_graph_free(zero);
}
END_TEST

/* ff_dropout = 0.5 on the hidden units: the difference from evaluation is in the ff output, so
 * look at the hidden units themselves through a graph that outputs them */
START_TEST(test_semantics)
{
    const char *src = "m = TransformerWrapper(num_tokens = 64, max_seq_len = 16,\n"
                      "  attn_layers = Decoder(dim = 16, depth = 1, heads = 2, ff_dropout = 0.5))\n";
    IrGraph *g = lower(src, 0, 1);
    /* the node the dropout produced: where(rand_like < 0.5, 0, act * 2) */
    IrNode *w = NULL, *act = NULL;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->op == IR_WHERE && g->nodes[i]->in[0]->op == IR_LT &&
            g->nodes[i]->in[0]->in[0]->op == IR_RAND) {
            w = g->nodes[i];
            act = w->in[2]->in[0]->op == IR_CONST ? w->in[2]->in[1] : w->in[2]->in[0];
        }
    ck_assert_ptr_nonnull(w);
    ir_output(g, "dropped", w);
    ir_output(g, "act", act);
    Bind b;
    bind_init(&b, g, 77);
    IrHostTensor o[4];
    interp(g, &b, o);
    const IrHostTensor *d = output(g, o, "dropped"), *h = output(g, o, "act");
    int64_t n = ir_host_numel(d), zeros = 0;
    for (int64_t i = 0; i < n; i++) {
        float x = ((const float *)h->data)[i], y = ((const float *)d->data)[i];
        if (y == 0 && x != 0)
            zeros++;
        else
            ck_assert_msg(fabsf(y - 2 * x) <= 1e-6f * fabsf(x) + 1e-30f, "kept %g as %g", x, y);
    }
    ck_assert_msg(zeros > n * 0.4 && zeros < n * 0.6, "%lld of %lld dropped", (long long)zeros, (long long)n);
    /* the same seed, the same logits; another seed, other logits */
    const IrHostTensor *l1 = output(g, o, "logits");
    IrHostTensor o2[4];
    interp(g, &b, o2);
    ck_assert(memcmp(l1->data, output(g, o2, "logits")->data, (size_t)ir_host_numel(l1) * sizeof(float)) == 0);
    free_outs(g, o2);
    b.seed = 78;
    interp(g, &b, o2);
    ck_assert(memcmp(l1->data, output(g, o2, "logits")->data, (size_t)ir_host_numel(l1) * sizeof(float)) != 0);
    free_outs(g, o2);
    free_outs(g, o);
    bind_free(&b);
    ir_graph_free(g);
}
END_TEST

/* gradients of a dropout model: compiled training module vs the interpreter, same seed */
START_TEST(test_compiled_gradients)
{
    IrGraph *g = lower(with_rates, 1, 1);
    char err[512];
    ck_assert_msg(harness_autodiff(g, "cpu", err, sizeof err) == 0, "%s", err);
    Bind b;
    bind_init(&b, g, 4242);
    IrHostTensor *ref = calloc((size_t)g->noutputs, sizeof *ref);
    interp(g, &b, ref);
    char dir[] = "/tmp/xtc-test-dropout-XXXXXX", path[300];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.so", dir);
    PassOptions po = {.verify_each = 1};
    IrGraph *opt = harness_passes(g, "cpu", &po, err, sizeof err);
    ck_assert_msg(opt != NULL, "%s", err);
    CgOptions co = {.output = path, .opt_level = 1};
    ck_assert_msg(harness_cg(opt, &co, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(opt->noutputs, g->noutputs);
    ir_graph_free(opt);
    XtcModule *m;
    XtcSession *s;
    ck_assert_int_eq(xtc_module_load(path, &m), XTC_OK);
    XtcSessionOptions so = {.threads = 2};
    ck_assert_int_eq(xtc_session_new(m, &so, &s), XTC_OK);
    for (int i = 0; i < b.nw; i++) {
        const IrNode *leaf = ir_find_leaf(g, IR_PARAM, b.names[i]);
        if (!leaf)
            leaf = ir_find_leaf(g, IR_BUFFER, b.names[i]);
        int64_t shape[IR_MAXRANK];
        for (int d = 0; d < leaf->rank; d++)
            shape[d] = leaf->shape[d].c;
        ck_assert_int_eq(xtc_session_set_weight(s, b.names[i], leaf->rank, shape, b.w[i]), XTC_OK);
    }
    int64_t shape[2] = {B, N};
    ck_assert_int_eq(xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, b.tokens), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "targets", XTC_I64, 2, shape, b.targets), XTC_OK);
    ck_assert_int_eq(xtc_session_set_input(s, "dropout_seed", XTC_I64, 0, shape, &b.seed), XTC_OK);
    ck_assert_msg(xtc_session_run(s) == XTC_OK, "%s", xtc_session_error(s));
    int compared = 0;
    for (int i = 0; i < g->noutputs; i++) {
        XtcTensor t;
        ck_assert_int_eq(xtc_session_get_output(s, g->outputs[i].name, &t), XTC_OK);
        int64_t n = ir_host_numel(&ref[i]);
        double maxe = 0, maxd = 0;
        for (int64_t k = 0; k < n; k++) {
            double e = ((const float *)ref[i].data)[k];
            maxe = fmax(maxe, fabs(e));
            maxd = fmax(maxd, fabs(((const float *)t.data)[k] - e));
        }
        ck_assert_msg(maxd <= 1e-5 + 1e-3 * maxe, "%s: compiled differs from the interpreter by %g (max %g)",
                      g->outputs[i].name, maxd, maxe);
        compared++;
    }
    ck_assert_int_gt(compared, 20);
    xtc_session_free(s);
    xtc_module_free(m);
    unlink(path);
    rmdir(dir);
    free_outs(g, ref);
    free(ref);
    bind_free(&b);
    ir_graph_free(g);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("dropout");
    TCase *tc = tcase_create("dropout");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_rand_like);
    tcase_add_test(tc, test_lowering);
    tcase_add_test(tc, test_semantics);
    tcase_add_test(tc, test_compiled_gradients);
    suite_add_tcase(su, tc);
    return harness_run(su, NULL);
}
